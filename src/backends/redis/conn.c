/* conn.c -- the Redis backend's pool: a server's state, dialing with AUTH
 * and SELECT (net.c does the sockets), and the connections kept between
 * requests. A client is assembled from its URL above it (backend.c),
 * which hands the pool its routing (struct redis_routing): where the
 * master is, and whom to tell when it or the slots moved.
 *
 * A connection serves one request at a time, so the backend keeps a small
 * pool of connections, one per concurrently busy thread (callers and the
 * keeper). A connection that fails retires every idle one dialed before it
 * (the server may have restarted); callers' requests always dial at once,
 * the keeper's back off between failed dials.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis.h"

/* ================================================================ errors */

/* How to give the server a password, for the messages of a server that
 * wants one (NOAUTH) or refused the one given. */
#define PASSWORD_HOW                                                                              \
    "?password_file=FILE, DLOCK_REDIS_PASSWORD_FILE=FILE or DLOCK_REDIS_PASSWORD (a password "    \
    "in the URL shows in ps)"

/* Map a server error reply to a code, with the server's words. */
int dlock__redis_server_error(struct redis_state *s, const char *text, const char *what)
{
    const struct redis_routing *route = s->routing;
    int code = DLOCK_EBACKEND;
    if (strstr(text, "NOAUTH") || strstr(text, "WRONGPASS") || strstr(text, "NOPERM") ||
        strstr(text, "invalid password") || strstr(text, "invalid username-password"))
        code = DLOCK_EAUTH;
    else if (strstr(text, "WRONGTYPE"))
        code = DLOCK_EWRONGTYPE;
    else if (strstr(text, "MASTERDOWN") || strstr(text, "LOADING"))
        code = DLOCK_EUNAVAIL;
    else if (strstr(text, "CLUSTERDOWN") || !strncmp(text, "MOVED ", 6) ||
             !strncmp(text, "ASK ", 4) || !strncmp(text, "TRYAGAIN", 8)) {
        code = DLOCK_EUNAVAIL; /* a cluster between two states: ask for its map again */
        if (route && route->slots_moved)
            route->slots_moved(s);
    }
    else if (strncmp(text, "READONLY", 8) == 0) { /* a replica: a master demoted by a failover */
        code = DLOCK_EUNAVAIL;
        if (route && route->master_moved)
            route->master_moved(s);
    }
    else if (strstr(text, "not an integer"))
        code = DLOCK_EWRONGTYPE;
    if (strncmp(text, "NOAUTH", 6) == 0 && !s->password)
        return dlock__err(code, "%s: %s: %s (the server wants a password: give it with "
                                PASSWORD_HOW ")", s->where, what, text);
    return dlock__err(code, "%s: %s: %s", s->where, what, text);
}

static int deadline_passed(struct redis_state *s, const char *what)
{
    return dlock__err(DLOCK_ETIMEDOUT, "%s: %s: the deadline passed before it could be sent",
                      s->where, what);
}

/* ============================================================ connections */

int dlock__redis_command(struct rconn *k, int argc, const char **argv, const size_t *argl,
                         const char *what, redisReply **out, bool *written)
{
    *out = NULL;
    int rc = dlock__redis_conn_append(k, argc, argv, argl);
    if (rc)
        return rc;
    rc = dlock__redis_exchange(&k, 1, k->until, what);
    if (written && dlock__redis_conn_sent(k))
        *written = true;
    if (rc)
        return rc;
    *out = dlock__redis_conn_take(k);
    return DLOCK_OK;
}

/* Append to K the AUTH and SELECT (when SELECT_DB) a fresh connection of
 * S needs: how many (0, 1 or 2; -1 out of memory). */
static int setup_append(struct redis_state *s, struct rconn *k, bool select_db)
{
    char db[16];
    snprintf(db, sizeof db, "%d", s->db);
    const char *auth[] = {"AUTH", s->user ? s->user : s->password, s->password};
    const char *sel[] = {"SELECT", db};
    int n = 0;
    if (s->password) {
        if (dlock__redis_conn_append(k, s->user ? 3 : 2, auth, NULL))
            return -1;
        n++;
    }
    if (select_db && s->db != 0) {
        if (dlock__redis_conn_append(k, 2, sel, NULL))
            return -1;
        n++;
    }
    return n;
}

/* Read the replies to what setup_append() appended to K (N of them, the
 * exchange's outcome RC): DLOCK_OK or the failure, with AUTH refusals as
 * DLOCK_EAUTH. */
static int setup_check(struct redis_state *s, struct rconn *k, int n, int rc)
{
    if (rc)
        return dlock__err(rc, "%s: %s: %s", k->where, s->password ? "AUTH" : "SELECT", k->err);
    for (int i = 0; i < n; i++) {
        redisReply *r = dlock__redis_conn_take(k);
        if (!r)
            break;
        bool is_auth = s->password && i == 0;
        if (!rc && r->type == REDIS_REPLY_ERROR && is_auth)
            rc = dlock__err(DLOCK_EAUTH, "%s: AUTH%s%s refused: %s (check the password: the "
                                         "URL's, its password_file's, DLOCK_REDIS_PASSWORD_FILE's "
                                         "or DLOCK_REDIS_PASSWORD)",
                            s->where, s->user ? " as " : "", s->user ? s->user : "", r->str);
        else if (!rc && r->type == REDIS_REPLY_ERROR)
            rc = dlock__redis_server_error(s, r->str, is_auth ? "AUTH" : "SELECT");
        freeReplyObject(r);
    }
    return rc;
}

/* Close *K, dialed but not set up for lack of memory: *K NULL, *RC and
 * MSG say why. */
static void drop_out_of_memory(struct rconn **k, int *rc, char *msg)
{
    *rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    dlock__errmsg_save(msg);
    dlock__redis_conn_free(*k);
    *k = NULL;
}

/* What dial_setup_many() dials: A[i] for SS[i], i < N, NEED of them
 * for a quorum (see dlock__redis_conn_dial_many), SELECT_DB to send the
 * URL's SELECT, all within DEADLINE, W's cancel ending it (NULL: none);
 * out, for each i, the connection CONN[i], or NULL with RC[i] and
 * MSG[i]. */
struct dial_setup {
    struct redis_state **ss;
    const struct redis_addr *a;
    size_t n, need;
    bool select_db;
    int64_t deadline;
    struct dlock__wait *w;
    struct {
        struct rconn **conn;
        int *rc;
        char (*msg)[DLOCK__MSG_MAX];
    } out;
};

/* Dial every address of D at once (net.c), then their AUTH and SELECT
 * pipelined in one exchange over all of them (one round trip, the same
 * quorum), every step within what is left until the deadline (the
 * connect timeout of SS[0], then its op timeout: the nodes of one URL
 * share them). D->out gets each connection or why there is none. */
static void dial_setup_many(const struct dial_setup *d)
{
    struct redis_state **ss = d->ss;
    size_t n = d->n, need = d->need;
    int64_t deadline = d->deadline;
    struct dlock__wait *w = d->w;
    struct rconn **out = d->out.conn;
    int *rc = d->out.rc;
    char(*msg)[DLOCK__MSG_MAX] = d->out.msg;
    int64_t cto = dlock__time_left(deadline, ss[0]->connect_timeout_ms);
    if (cto == 0) {
        for (size_t i = 0; i < n; i++) {
            out[i] = NULL;
            rc[i] = deadline_passed(ss[i], "connect");
            dlock__errmsg_save(msg[i]);
        }
        return;
    }
    dlock__redis_conn_dial_many(d->a, n, dlock__now_ms() + cto, need, w, out, rc, msg);
    struct rconn *stack[8], **ks = n <= 8 ? stack : calloc(n, sizeof *ks);
    int nstack[8], *nsetup = n <= 8 ? nstack : calloc(n, sizeof *nsetup);
    if (!ks || !nsetup) { /* no room to set any up: every connection fails */
        for (size_t i = 0; i < n; i++)
            if (out[i])
                drop_out_of_memory(&out[i], &rc[i], msg[i]);
        free(ks != stack ? ks : NULL);
        free(nsetup != nstack ? nsetup : NULL);
        return;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (!out[i])
            continue;
        nsetup[i] = setup_append(ss[i], out[i], d->select_db);
        if (nsetup[i] < 0)
            drop_out_of_memory(&out[i], &rc[i], msg[i]);
        else if (nsetup[i] > 0) {
            out[i]->wait = w; /* its cancel ends the setup too (net.c) */
            ks[m++] = out[i];
        }
    }
    size_t ready = 0; /* connected, nothing to set up */
    for (size_t i = 0; i < n; i++)
        ready += out[i] && nsetup[i] == 0;
    int64_t left = m ? dlock__time_left(deadline, ss[0]->op_timeout_ms) : 0;
    if (m && left > 0)
        dlock__redis_exchange_quorum(ks, m, dlock__now_ms() + left, "AUTH",
                                     need > ready ? (need - ready < m ? need - ready : m) : 0);
    for (size_t i = 0; i < n; i++) {
        if (!out[i] || nsetup[i] == 0)
            continue;
        out[i]->wait = NULL;
        int broken = !out[i]->broken ? 0 : dlock__wait_canceled(w) ? DLOCK_ECANCELED : DLOCK_ECONN;
        rc[i] = left == 0 ? deadline_passed(ss[i], ss[i]->password ? "AUTH" : "SELECT")
                          : setup_check(ss[i], out[i], nsetup[i], broken);
        if (rc[i]) {
            dlock__errmsg_save(msg[i]);
            dlock__redis_conn_free(out[i]);
            out[i] = NULL;
        }
    }
    if (ks != stack)
        free(ks);
    if (nsetup != nstack)
        free(nsetup);
}

int dlock__redis_dial(struct redis_state *s, bool select_db, int64_t deadline,
                      struct dlock__wait *w, struct rconn **out)
{
    const struct redis_routing *route = s->routing;
    if (!route || !route->master) {
        struct redis_addr a = {.host = s->host, .port = s->port, .sock = s->sock, .tls = s->tls};
        return dlock__redis_dial_addr(s, &a, select_db, deadline, w, out);
    }
    /* Sentinel: the master as last resolved; when it cannot be reached,
     * ask the sentinels once more (a failover may have moved it). */
    for (int round = 0;; round++) {
        char host[256];
        int port;
        unsigned epoch;
        int rc = route->master(s, deadline, host, sizeof host, &port, &epoch);
        if (rc)
            return rc;
        struct redis_addr a = {.host = host, .port = port, .tls = s->tls};
        rc = dlock__redis_dial_addr(s, &a, select_db, deadline, w, out);
        if (rc != DLOCK_ECONN || round > 0)
            return rc;
        if (route->master_moved)
            route->master_moved(s);
    }
}

int dlock__redis_dial_addr(struct redis_state *s, const struct redis_addr *a, bool select_db,
                           int64_t deadline, struct dlock__wait *w, struct rconn **out)
{
    int rc;
    char msg[1][DLOCK__MSG_MAX];
    struct dial_setup d = {.ss = &s,
                           .a = a,
                           .n = 1,
                           .need = 1,
                           .select_db = select_db,
                           .deadline = deadline,
                           .w = w,
                           .out = {.conn = out, .rc = &rc, .msg = msg}};
    dial_setup_many(&d);
    return rc ? dlock__errmsg_restore(rc, msg[0]) : DLOCK_OK;
}

/* The first half of a pool_get: an idle connection of S's current
 * generation into *OUT, or *OUT NULL and *GEN the generation a dial is
 * for; a failure when DEADLINE has passed or a BACKGROUND caller must
 * wait for the reconnect backoff. */
static int pool_take(struct redis_state *s, bool background, int64_t deadline, struct rconn **out,
                     unsigned *gen)
{
    *out = NULL;
    if (s->cluster && !s->cluster_node) /* the master depends on the key: cluster.c */
        return dlock__err(DLOCK_ENOTSUP, "%s: this request has no key to find its master by",
                          s->where);
    int64_t left = dlock__time_left(deadline, s->op_timeout_ms);
    if (left == 0)
        return deadline_passed(s, "request");
    pthread_mutex_lock(&s->pool_mu);
    while (s->idle) {
        struct rconn *k = s->idle;
        s->idle = k->next;
        if (k->gen == s->gen) {
            pthread_mutex_unlock(&s->pool_mu);
            k->until = dlock__now_ms() + left;
            *out = k;
            return DLOCK_OK;
        }
        dlock__redis_conn_free(k); /* dialed before a failure: suspect */
    }
    int64_t now = dlock__now_ms();
    if (background && now < s->next_dial_ms) {
        int64_t wait = s->next_dial_ms - now;
        pthread_mutex_unlock(&s->pool_mu);
        return dlock__err(DLOCK_ECONN, "%s: reconnecting (next attempt in %lld ms)", s->where,
                          (long long)wait);
    }
    *gen = s->gen;
    pthread_mutex_unlock(&s->pool_mu);
    return DLOCK_OK;
}

/* "reconnected" (-v) and the reconnect count, the caller's message kept. */
static void say_reconnected(struct redis_state *s)
{
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    dlock__reconnected(s->c, "%s: reconnected", s->where);
    dlock__errmsg_restore(DLOCK_OK, msg);
}

/* The second half: the dial for generation GEN ended with RC and *K:
 * the reconnect backoff, "reconnected", and K's request bound. A
 * connect is not an answer (a stopped server's kernel accepts it): a
 * dial that exchanged nothing (no AUTH, no SELECT) leaves "reconnected"
 * to the first reply on K (dlock__redis_pool_put). */
static int pool_dialed(struct redis_state *s, unsigned gen, int rc, int64_t deadline,
                       struct rconn **k)
{
    pthread_mutex_lock(&s->pool_mu);
    if (rc == DLOCK_ECANCELED) {
        /* the caller gave up: says nothing of the server */
    } else if (rc) {
        s->next_dial_ms = dlock__now_ms() + dlock__backoff_next(&s->backoff);
    } else {
        dlock__backoff_reset(&s->backoff);
        s->next_dial_ms = 0;
    }
    bool again = !rc && s->dialed_gen && s->dialed_gen != gen + 1; /* a broken one before */
    if (!rc)
        s->dialed_gen = gen + 1;
    pthread_mutex_unlock(&s->pool_mu);
    if (rc)
        return rc;
    (*k)->unannounced = again && (*k)->nreplies == 0;
    if (again && !(*k)->unannounced)
        say_reconnected(s);
    (*k)->gen = gen;
    int64_t left = dlock__time_left(deadline, s->op_timeout_ms);
    if (left == 0) {
        dlock__redis_pool_put(s, *k, false);
        *k = NULL;
        return deadline_passed(s, "request");
    }
    (*k)->until = dlock__now_ms() + left;
    return DLOCK_OK;
}

/* dlock__redis_pool_get(), a dial ending at W's cancel too. */
static int pool_get(struct redis_state *s, bool background, int64_t deadline,
                    struct dlock__wait *w, struct rconn **out)
{
    unsigned gen;
    int rc = pool_take(s, background, deadline, out, &gen);
    if (rc || *out)
        return rc;
    rc = dlock__redis_dial(s, true, deadline, w, out);
    return pool_dialed(s, gen, rc, deadline, out);
}

int dlock__redis_pool_get(struct redis_state *s, bool background, int64_t deadline, struct rconn **out)
{
    return pool_get(s, background, deadline, NULL, out);
}

int dlock__redis_pool_get_for(struct redis_state *s, int64_t deadline, struct dlock__wait *w,
                              struct rconn **out)
{
    return pool_get(s, false, deadline, w, out);
}

void dlock__redis_pool_get_many(struct redis_state **ss, size_t n, bool background,
                                int64_t deadline, size_t need, struct rconn **out, int *rc,
                                char (*msg)[DLOCK__MSG_MAX])
{
    struct redis_state *dial_s[DLOCK__MAX_HOSTS];
    struct redis_addr dial_a[DLOCK__MAX_HOSTS];
    size_t which[DLOCK__MAX_HOSTS], m = 0;
    unsigned gen[DLOCK__MAX_HOSTS];
    struct rconn *dialed[DLOCK__MAX_HOSTS];
    int dial_rc[DLOCK__MAX_HOSTS];
    for (size_t i = 0; i < n; i++) {
        rc[i] = pool_take(ss[i], background, deadline, &out[i], &gen[i]);
        if (rc[i]) {
            dlock__errmsg_save(msg[i]);
        } else if (!out[i] && m < DLOCK__MAX_HOSTS) {
            struct redis_state *s = ss[i];
            dial_s[m] = s;
            dial_a[m] = (struct redis_addr){.host = s->host, .port = s->port, .sock = s->sock,
                                            .tls = s->tls};
            which[m++] = i;
        }
    }
    if (!m)
        return;
    size_t idle = 0;
    for (size_t i = 0; i < n; i++)
        idle += out[i] != NULL;
    char (*dial_msg)[DLOCK__MSG_MAX] = calloc(m, sizeof *dial_msg);
    if (!dial_msg) {
        for (size_t j = 0; j < m; j++) {
            rc[which[j]] = dlock__err(DLOCK_ENOMEM, "out of memory");
            dlock__errmsg_save(msg[which[j]]);
        }
        return;
    }
    struct dial_setup d = {.ss = dial_s,
                           .a = dial_a,
                           .n = m,
                           .need = need > idle ? need - idle : 0,
                           .select_db = true,
                           .deadline = deadline,
                           .out = {.conn = dialed, .rc = dial_rc, .msg = dial_msg}};
    dial_setup_many(&d);
    for (size_t j = 0; j < m; j++) {
        size_t i = which[j];
        if (dial_rc[j])
            dlock__errmsg_restore(dial_rc[j], dial_msg[j]);
        out[i] = dialed[j];
        rc[i] = pool_dialed(ss[i], gen[i], dial_rc[j], deadline, &out[i]);
        if (rc[i])
            dlock__errmsg_save(msg[i]);
    }
    free(dial_msg);
}

/* Give K back; BROKEN (an I/O error) closes it and retires every idle
 * connection dialed before, since the server may have restarted. */
void dlock__redis_pool_put(struct redis_state *s, struct rconn *k, bool broken)
{
    if (!k)
        return;
    if (k->unannounced && k->nreplies > 0) { /* the server answered the reconnect */
        k->unannounced = false;
        say_reconnected(s);
    }
    pthread_mutex_lock(&s->pool_mu);
    if (broken || k->broken || k->want > 0 || k->out_off < k->out_len || k->ngot > 0) {
        if (k->gen == s->gen)
            s->gen++;
        bool latest = k->gen + 1 == s->gen; /* not one retired before */
        pthread_mutex_unlock(&s->pool_mu);
        if (latest && s->routing && s->routing->master_moved)
            s->routing->master_moved(s); /* Sentinel: a failover closes its connections */
        dlock__redis_conn_free(k);
        return;
    }
    k->next = s->idle;
    s->idle = k;
    pthread_mutex_unlock(&s->pool_mu);
}

/* ================================================================ states */

struct redis_state *dlock__redis_state_new(struct dlock_client *c)
{
    struct redis_state *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->c = c;
    s->hub.efd = -1;
    pthread_mutex_init(&s->pool_mu, NULL);
    dlock__timed_mutex_init(&s->resolve_mu);
    pthread_mutex_init(&s->cancel_mu, NULL);
    s->backoff.min_ms = REDIS_BACKOFF_MIN_MS;
    s->backoff.max_ms = REDIS_BACKOFF_MAX_MS;
    pthread_mutex_init(&s->hub.mu, NULL);
    return s;
}

void dlock__redis_state_free(struct redis_state *s)
{
    while (s->idle) {
        struct rconn *k = s->idle;
        s->idle = k->next;
        dlock__redis_conn_free(k);
    }
    pthread_mutex_destroy(&s->pool_mu);
    pthread_mutex_destroy(&s->hub.mu);
    pthread_mutex_destroy(&s->cancel_mu);
    dlock__redis_tls_context_free(s->tls);
    dlock__timed_mutex_destroy(&s->resolve_mu);
    free(s->sentinels);
    free(s->sentinel_password);
    free(s->env_password);
    free(s->master_name);
    free(s->host);
    free(s->sock);
    free(s);
}
