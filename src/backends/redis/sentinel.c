/* sentinel.c -- redis+sentinel://: finding the master through Redis
 * Sentinel, and finding it again after a failover.
 *
 * The URL names the sentinels and the master's name. The backend asks
 * every sentinel at once (SENTINEL get-master-addr-by-name, over net.c's
 * parallel dial, so a stopped or unreachable sentinel costs a grace, not
 * the call's budget), prefers the answer of the one that answered last,
 * as the Sentinel client guidelines say; it
 * believes an answer only once the address itself says ROLE master (a
 * sentinel that has not yet seen a failover points at what is now a
 * replica). The master's address then serves every connection of the
 * pool and the subscriber. It is asked again when the master goes stale:
 * a connection to it breaks (Sentinel closes every client connection of
 * the instances it reconfigures during a failover, so every user of the
 * old master notices), or a write is refused with READONLY (a demoted
 * master). Nothing is left for the user to do: requests dial the new
 * master, the keeper's renewals reach it (holds it does not know are
 * reported lost there), waiters re-subscribe there.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "redis.h"

void dlock__redis_sentinel_stale(struct redis_state *s)
{
    if (!s->sentinel)
        return;
    pthread_mutex_lock(&s->pool_mu);
    s->master_stale = true;
    pthread_mutex_unlock(&s->pool_mu);
}

/* TEXT, all digits, as a TCP port (1-65535) into *PORT. */
static bool parse_port(const char *text, int *port)
{
    size_t n = strspn(text, "0123456789");
    if (n == 0 || n > 5 || text[n])
        return false;
    *port = atoi(text);
    return *port >= 1 && *port <= 65535;
}

/* What sentinel K answered to SENTINEL get-master-addr-by-name (after
 * AUTH when AUTHED): DLOCK_OK with *HOST (caller frees) and *PORT, or
 * why not (the message names the sentinel). Takes K's replies. */
static int sentinel_answer(struct redis_state *s, struct rconn *k, bool authed, char **host,
                           int *port)
{
    int rc = DLOCK_OK;
    redisReply *ra = authed ? dlock__redis_conn_take(k) : NULL;
    redisReply *r = dlock__redis_conn_take(k);
    if ((authed && !ra) || !r)
        rc = dlock__err(DLOCK_EPROTO, "%s: SENTINEL get-master-addr-by-name: no reply", k->where);
    else if (ra && ra->type == REDIS_REPLY_ERROR)
        rc = dlock__err(DLOCK_EAUTH, "%s: sentinel_password refused: %s", k->where, ra->str);
    else if (r->type == REDIS_REPLY_ERROR)
        rc = dlock__err(
            strncmp(r->str, "NOAUTH", 6) == 0 ? DLOCK_EAUTH : DLOCK_EBACKEND,
            "%s: SENTINEL get-master-addr-by-name %s: %s%s", k->where, s->master_name, r->str,
            strncmp(r->str, "NOAUTH", 6) == 0
                ? " (the sentinels want a password: give it with "
                  "?sentinel_password_file=FILE, DLOCK_REDIS_SENTINEL_PASSWORD_FILE=FILE "
                  "or DLOCK_REDIS_SENTINEL_PASSWORD)"
                : "");
    else if (r->type == REDIS_REPLY_NIL)
        rc = dlock__err(DLOCK_ENOENT, "%s: this sentinel monitors no master named '%s'", k->where,
                        s->master_name);
    else if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
             r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING)
        rc = dlock__err(DLOCK_EPROTO, "%s: SENTINEL get-master-addr-by-name: unexpected reply",
                        k->where);
    else if (!parse_port(r->element[1]->str, port))
        rc = dlock__err(DLOCK_EPROTO,
                        "%s: SENTINEL get-master-addr-by-name %s: port '%.20s' is no port",
                        k->where, s->master_name, r->element[1]->str);
    else if (!(*host = dlock__strdup(r->element[0]->str)))
        rc = DLOCK_ENOMEM;
    freeReplyObject(ra);
    freeReplyObject(r);
    return rc;
}

/* Ask every sentinel at once where the master is: one parallel dial
 * (connect and TLS, net.c's, as Redlock dials its nodes), AUTH and
 * SENTINEL get-master-addr-by-name to each that connected, in one poll.
 * Once one sentinel has connected (answered), the others get only a
 * grace, so a sentinel that drops SYNs or is stopped costs the lookup a
 * fraction of its bound instead of a whole connect timeout before the
 * next is asked. HOST[i] (caller frees) and PORT[i], or RC[i] and
 * MSG[i]. */
static void ask_sentinels(struct redis_state *s, int64_t deadline, char **host, int *port, int *rc,
                          char (*msg)[DLOCK__MSG_MAX])
{
    size_t n = s->nsentinels;
    struct redis_addr *a = calloc(n, sizeof *a);
    struct rconn **k = calloc(n, sizeof *k), **live = calloc(n, sizeof *live);
    int64_t cto = dlock__time_left(deadline, s->connect_timeout_ms);
    for (size_t i = 0; i < n; i++) {
        host[i] = NULL;
        rc[i] = !a || !k || !live ? DLOCK_ENOMEM : DLOCK_ETIMEDOUT;
        snprintf(msg[i], DLOCK__MSG_MAX, "%s",
                 !a || !k || !live ? "out of memory" : "the deadline passed");
    }
    if (!a || !k || !live || cto == 0)
        goto out;
    for (size_t i = 0; i < n; i++)
        a[i] = (struct redis_addr){.host = s->sentinels[i].host,
                                   .port = s->sentinels[i].port,
                                   .tls = s->tls};
    dlock__redis_conn_dial_many(a, n, dlock__now_ms() + cto, 1, NULL, k, rc, msg);
    const char *auth[] = {"AUTH", s->sentinel_password};
    const char *ask[] = {"SENTINEL", "get-master-addr-by-name", s->master_name};
    size_t nlive = 0;
    for (size_t i = 0; i < n; i++) {
        if (!k[i])
            continue;
        if ((s->sentinel_password && dlock__redis_conn_append(k[i], 2, auth, NULL)) ||
            dlock__redis_conn_append(k[i], 3, ask, NULL)) {
            rc[i] = DLOCK_ENOMEM;
            snprintf(msg[i], DLOCK__MSG_MAX, "out of memory");
            continue;
        }
        live[nlive++] = k[i];
    }
    if (nlive)
        dlock__redis_exchange_quorum(live, nlive, dlock__time_budget(deadline, s->op_timeout_ms),
                                     "SENTINEL get-master-addr-by-name", 1);
    for (size_t i = 0; i < n; i++) {
        if (!k[i] || rc[i])
            continue;
        if (k[i]->broken)
            rc[i] = dlock__err(DLOCK_ECONN, "%s: SENTINEL get-master-addr-by-name: %s", k[i]->where,
                               k[i]->err);
        else
            rc[i] = sentinel_answer(s, k[i], s->sentinel_password != NULL, &host[i], &port[i]);
        if (rc[i])
            snprintf(msg[i], DLOCK__MSG_MAX, "%s", dlock_errmsg());
    }
out:
    for (size_t i = 0; k && i < n; i++)
        dlock__redis_conn_free(k[i]);
    free(a);
    free(k);
    free(live);
}

/* Whether HOST:PORT says it is a master (ROLE), within DEADLINE. */
static int check_role(struct redis_state *s, const char *host, int port, int64_t deadline)
{
    struct redis_addr a = {.host = host, .port = port, .tls = s->tls};
    struct rconn *k;
    int rc = dlock__redis_dial_addr(s, &a, false, deadline, NULL, &k);
    if (rc)
        return rc;
    const char *role[] = {"ROLE"};
    redisReply *r;
    k->until = dlock__time_budget(deadline, s->op_timeout_ms);
    rc = dlock__redis_command(k, 1, role, NULL, "ROLE", &r, NULL);
    if (!rc) {
        if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
            r->element[0]->type != REDIS_REPLY_STRING)
            rc = dlock__err(DLOCK_EPROTO, "%s: ROLE: unexpected reply", k->where);
        else if (strcmp(r->element[0]->str, "master") != 0)
            rc = dlock__err(DLOCK_EUNAVAIL,
                            "%s: the sentinel's master for '%s' says ROLE %s "
                            "(a stale answer: a failover is under way)",
                            k->where, s->master_name, r->element[0]->str);
        freeReplyObject(r);
    }
    dlock__redis_conn_free(k);
    return rc;
}

int dlock__redis_sentinel_resolve(struct redis_state *s, unsigned epoch, int64_t deadline)
{
    /* another thread may be asking: wait for it within our own bound */
    int64_t left = dlock__time_left(deadline, s->connect_timeout_ms + s->op_timeout_ms);
    if (left == 0 || !dlock__timed_mutex_lock(&s->resolve_mu, dlock__now_ms() + left))
        return dlock__err(DLOCK_ECONN,
                          "%s: no master yet: another thread is still asking the sentinels",
                          s->where);
    pthread_mutex_lock(&s->pool_mu);
    bool done = s->master_epoch != epoch && !s->master_stale; /* another thread did it */
    pthread_mutex_unlock(&s->pool_mu);
    if (done) {
        dlock__timed_mutex_unlock(&s->resolve_mu);
        return DLOCK_OK;
    }
    size_t n = s->nsentinels;
    char **host = calloc(n, sizeof *host), (*msg)[DLOCK__MSG_MAX] = calloc(n, sizeof *msg);
    int *port = calloc(n, sizeof *port), *rcs = calloc(n, sizeof *rcs);
    if (!host || !msg || !port || !rcs) {
        free(host), free(msg), free(port), free(rcs);
        dlock__timed_mutex_unlock(&s->resolve_mu);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    ask_sentinels(s, deadline, host, port, rcs, msg);
    /* the answers, the sentinel that answered last time first; an
     * address is believed once it says ROLE master itself */
    char why[DLOCK__MSG_MAX] = "";
    size_t wl = 0;
    int rc = DLOCK_ECONN;
    bool auth = false, late = false;
    size_t first = __atomic_load_n(&s->sentinel_first, __ATOMIC_RELAXED), found = n;
    for (size_t m = 0; m < n && found == n; m++) {
        size_t i = (first + m) % n;
        rc = rcs[i];
        bool seen = false; /* the same address from a sentinel before: checked */
        for (size_t j = 0; !rc && j < m; j++) {
            size_t o = (first + j) % n;
            seen |= host[o] && strcmp(host[o], host[i]) == 0 && port[o] == port[i];
        }
        if (seen)
            continue;
        if (!rc && (rc = check_role(s, host[i], port[i], deadline)) == DLOCK_OK) {
            found = i;
            break;
        }
        if (!rc)
            continue;
        auth |= rc == DLOCK_EAUTH;
        late |= rc == DLOCK_ETIMEDOUT;
        if (rc == DLOCK_ENOMEM)
            break;
        if (wl < sizeof why)
            wl += (size_t)snprintf(why + wl, sizeof why - wl, "%s%s", wl ? "; " : "",
                                   rcs[i] ? msg[i] : dlock_errmsg());
    }
    if (found < n) {
        pthread_mutex_lock(&s->pool_mu);
        bool moved = !s->host || strcmp(s->host, host[found]) != 0 || s->port != port[found];
        if (moved) {
            free(s->host);
            s->host = host[found];
            s->port = port[found];
            s->gen++; /* idle connections to the old master retire */
            host[found] = NULL;
        }
        s->master_stale = false;
        s->master_epoch++;
        pthread_mutex_unlock(&s->pool_mu);
        /* the sentinel that answered is asked first next time */
        __atomic_store_n(&s->sentinel_first, found, __ATOMIC_RELAXED);
        rc = DLOCK_OK;
    }
    dlock__timed_mutex_unlock(&s->resolve_mu);
    for (size_t i = 0; i < n; i++)
        free(host[i]);
    free(host), free(msg), free(port), free(rcs);
    if (found < n || rc == DLOCK_ENOMEM)
        return rc;
    return dlock__err(late   ? DLOCK_ETIMEDOUT
                      : auth ? DLOCK_EAUTH
                             : DLOCK_ECONN,
                      "%s: no sentinel named a reachable master: %s", s->where, why);
}

int dlock__redis_sentinel_master(struct redis_state *s, int64_t deadline, char *host,
                                 size_t host_len, int *port, unsigned *epoch)
{
    for (int round = 0;; round++) {
        pthread_mutex_lock(&s->pool_mu);
        bool stale = s->master_stale || !s->host;
        *epoch = s->master_epoch;
        if (!stale) {
            snprintf(host, host_len, "%s", s->host);
            *port = s->port;
        }
        pthread_mutex_unlock(&s->pool_mu);
        if (!stale)
            return DLOCK_OK;
        if (round > 0)
            return dlock__err(DLOCK_ECONN, "%s: the master went stale again at once", s->where);
        int rc = dlock__redis_sentinel_resolve(s, *epoch, deadline);
        if (rc)
            return rc;
    }
}

/* The master of the moment as "host:port" into BUF ("" when unknown). */
static void master_now(struct redis_state *s, char *buf, size_t size)
{
    pthread_mutex_lock(&s->pool_mu);
    if (s->host)
        snprintf(buf, size, strchr(s->host, ':') ? "[%s]:%d" : "%s:%d", s->host, s->port);
    else
        *buf = 0;
    pthread_mutex_unlock(&s->pool_mu);
}

void dlock__redis_sentinel_confirmed(struct redis_state *s, struct dlock__hold *h)
{
    if (!s->sentinel)
        return;
    char now[300];
    master_now(s, now, sizeof now);
    if (h->bdata && strcmp(h->bdata, now) == 0)
        return;
    char *copy = strdup(now);
    if (!copy)
        return; /* out of memory: the loss is still reported, without the note */
    free(h->bdata);
    h->bdata = copy;
}

void dlock__redis_sentinel_lost_note(struct redis_state *s, const struct dlock__hold *h, char *buf,
                                     size_t size)
{
    *buf = 0;
    if (!s->sentinel || !h->bdata)
        return;
    char now[300];
    master_now(s, now, sizeof now);
    if (*now && strcmp(h->bdata, now) != 0)
        snprintf(buf, size,
                 "lost in a Sentinel failover: master %s confirmed it last, the master "
                 "now, %s, had not received it from there or gave it to another owner "
                 "since",
                 (const char *)h->bdata, now);
}

int dlock__redis_master(void *state, char *buf, size_t size)
{
    struct redis_state *s = state;
    if (!s->sentinel)
        return dlock__err(DLOCK_ENOTSUP, "%s: not a redis+sentinel:// URL: no master to show",
                          s->where);
    char host[256];
    int port;
    unsigned epoch;
    int rc = dlock__redis_sentinel_master(s, dlock__now_ms() + s->op_timeout_ms, host, sizeof host,
                                          &port, &epoch);
    if (rc)
        return rc;
    int n = snprintf(buf, size, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    if (n < 0 || (size_t)n >= size) {
        *buf = 0;
        return dlock__err(DLOCK_EINVAL, "dlock_client_master: %zu bytes are too few", size);
    }
    return DLOCK_OK;
}

int dlock__redis_sentinel_parse(struct redis_state *s, struct dlock_client *c)
{
    const char *url = c->url.redacted;
    const char *path = c->url.path;
    if (c->url.nhosts < 1 || !path || strlen(path) < 2)
        return dlock__err(DLOCK_EBADURL,
                          "bad URL '%s': %s://s1:26379,s2:26379/MASTERNAME[/db] "
                          "needs sentinels and the master's name",
                          url, c->url.scheme);
    s->sentinels = calloc(c->url.nhosts, sizeof *s->sentinels);
    if (!s->sentinels)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    for (size_t i = 0; i < c->url.nhosts; i++) {
        s->sentinels[i].host = c->url.hosts[i].host;
        s->sentinels[i].port = c->url.hosts[i].port ? c->url.hosts[i].port : 26379;
    }
    s->nsentinels = c->url.nhosts;
    const char *name = path + 1, *slash = strchr(name, '/');
    s->master_name = slash ? strndup(name, (size_t)(slash - name)) : strdup(name);
    if (!s->master_name)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    if (!*s->master_name)
        return dlock__err(DLOCK_EBADURL, "bad URL '%s': the master's name is empty", url);
    snprintf(s->where, sizeof s->where, "%s master '%s'", c->url.scheme, s->master_name);
    /* ?sentinel_password=, ?sentinel_password_file=, else the environment's */
    int rc = dlock__secret_option(&c->url, "sentinel_password", "DLOCK_REDIS_SENTINEL_PASSWORD",
                                  &s->sentinel_password);
    if (rc)
        return rc;
    s->sentinel = true;
    return DLOCK_OK;
}

/* ===================================================== +switch-master */

/* The hub thread (hub.c) keeps one connection to a sentinel subscribed
 * to +switch-master: a failover Sentinel announces ends the subscriber
 * connection to the old master at once (the old master, now a replica,
 * would otherwise keep it, and waiters would stay subscribed there). The
 * dial is short (at most a second) since the hub thread waits for it;
 * a sentinel that does not answer is skipped for the next one. */
struct rconn *dlock__redis_sentinel_watch(struct redis_state *s)
{
    size_t i =
        (__atomic_load_n(&s->sentinel_first, __ATOMIC_RELAXED) + s->watch_next++) % s->nsentinels;
    struct redis_addr a = {.host = s->sentinels[i].host,
                           .port = s->sentinels[i].port,
                           .tls = s->tls};
    int64_t cto = s->connect_timeout_ms < 1000 ? s->connect_timeout_ms : 1000;
    struct rconn *k;
    if (dlock__redis_conn_dial(&a, dlock__now_ms() + cto, &k))
        return NULL;
    const char *auth[] = {"AUTH", s->sentinel_password};
    const char *sub[] = {"SUBSCRIBE", "+switch-master"};
    if ((s->sentinel_password && dlock__redis_conn_append(k, 2, auth, NULL)) ||
        dlock__redis_conn_append(k, 2, sub, NULL)) {
        dlock__redis_conn_free(k);
        return NULL;
    }
    k->want = 0; /* pushed replies: nothing is owed */
    dlock__redis_conn_pump(k, 0);
    return k;
}

bool dlock__redis_sentinel_switched(struct redis_state *s, struct rconn *w)
{
    bool switched = false;
    size_t nl = strlen(s->master_name);
    redisReply *r;
    while ((r = dlock__redis_conn_take(w))) {
        /* "message" "+switch-master" "<name> <old ip> <old port> <new ip> <new port>" */
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
            r->element[2]->type == REDIS_REPLY_STRING && r->element[2]->len > nl &&
            memcmp(r->element[2]->str, s->master_name, nl) == 0 && r->element[2]->str[nl] == ' ')
            switched = true;
        freeReplyObject(r);
    }
    if (switched) { /* idle connections to the old master retire too */
        pthread_mutex_lock(&s->pool_mu);
        s->master_stale = true;
        s->gen++;
        pthread_mutex_unlock(&s->pool_mu);
        dlock__log(s->c, DLOCK_LOG_WARN, "%s: failover announced by Sentinel", s->where);
    }
    return switched;
}
