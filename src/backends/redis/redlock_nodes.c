/* redlock_nodes.c -- how Redlock's requests reach its N nodes.
 *
 * Why it is a file of its own: every step of the lock recipe (redlock.c,
 * redlock_hold.c) and of elections (redlock_election.c) is one round
 * sent to all N nodes at once -- one connection per node, every call
 * appended, one poll loop over all of them (net.c's
 * dlock__redis_exchange_quorum) bounded by the node timeout cut to the
 * caller's deadline -- and its repairs (a pooled
 * connection the node closed, NOSCRIPT) are the same for each. The
 * recipe reads the replies and counts the quorum; this file only carries
 * them. The operator's calls (inspect, force release, list) are here
 * too: not a hot path, they ask the single-node backend of each node in
 * turn and merge what a majority says.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redlock.h"

static int append_call(struct rconn *k, const struct rl_call *cl, bool eval)
{
    size_t n = 3 + (size_t)cl->nargs;
    const char **argv = malloc(n * sizeof *argv);
    size_t *argl = malloc(n * sizeof *argl);
    if (!argv || !argl) {
        free(argv);
        free(argl);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    char nk[16];
    snprintf(nk, sizeof nk, "%d", cl->nkeys);
    argv[0] = eval ? "EVAL" : "EVALSHA";
    argv[1] = eval ? cl->src : cl->sha;
    argv[2] = nk;
    for (int i = 0; i < 3; i++)
        argl[i] = strlen(argv[i]);
    for (int i = 0; i < cl->nargs; i++) {
        argv[3 + i] = cl->args[i];
        argl[3 + i] = cl->lens[i];
    }
    int rc = dlock__redis_conn_append(k, (int)n, argv, argl);
    free(argv);
    free(argl);
    return rc;
}

/* Whether idle pooled connection K has something to read -- the server's
 * end of the connection (it restarted) or bytes nobody asked for: either
 * way it is not fit for a request. */
static bool idle_conn_closed(const struct rconn *k)
{
    struct pollfd p = {.fd = k->fd, .events = POLLIN};
    return k->fd < 0 || poll(&p, 1, 0) > 0;
}

void dlock__redlock_node_failed(struct rl_round *rd, size_t i, int rc)
{
    if (rd->rc[i])
        return;
    rd->rc[i] = rc;
    snprintf(rd->err[i], sizeof rd->err[i], "%s", dlock_errmsg());
}

/* Send CALLS[0..N) (any nodes, several per node) in one request: each
 * node's connection from its pool (BACKGROUND: the keeper's reconnect
 * backoff), every call appended, one poll over every connection ending at
 * the node timeout cut to DEADLINE, replies taken in order. Two repairs
 * follow in further exchanges, within the same bound: a node whose pooled
 * connection turned out dead before any reply (the node restarted, and
 * the old process cannot have run it) is sent the calls again once on a
 * fresh connection (the scripts are written so a repeat is harmless), and
 * calls a node answers NOSCRIPT go again as EVAL. A node that fails
 * leaves its calls' replies NULL, its code in RD->rc and its message in
 * RD->err. */
void dlock__redlock_round(struct redlock *rl, struct rl_round *rd, struct rl_call *calls, size_t n,
                          int64_t deadline, bool background, const char *what, size_t need)
{
    memset(rd, 0, sizeof *rd);
    bool used[RL_MAX_NODES] = {false}, redial[RL_MAX_NODES] = {false};
    size_t before[RL_MAX_NODES] = {0}; /* replies a connection had before this request */
    for (size_t j = 0; j < n; j++) {
        calls[j].reply = NULL;
        used[calls[j].node] = true;
    }
    for (int pass = 0; pass < 3; pass++) {
        struct rconn *ks[RL_MAX_NODES];
        size_t nk = 0;
        /* each exchange has the node timeout, cut to DEADLINE */
        int64_t left = dlock__time_left(deadline, rl->node_timeout_ms);
        int64_t until = dlock__now_ms() + left;
        /* the connections: idle ones from the pools, the others dialed
         * all at once (a node that does not answer costs the others a
         * grace, not its connect timeout); an idle one the node closed
         * since (it restarted) is dialed again at once, with the rest */
        for (int round = 0; round < 2; round++) {
            struct redis_state *ss[RL_MAX_NODES];
            struct rconn *got[RL_MAX_NODES];
            size_t which[RL_MAX_NODES], m = 0;
            int rcs[RL_MAX_NODES];
            char msgs[RL_MAX_NODES][DLOCK__MSG_MAX];
            for (size_t i = 0; i < rl->n; i++) {
                if (!used[i] || rd->rc[i] || (pass && !redial[i]) || (round && rd->k[i]))
                    continue;
                if (redial[i]) { /* a dead pooled connection: once more on a fresh one */
                    dlock__redis_pool_put(rl->node[i], rd->k[i], true);
                    rd->k[i] = NULL;
                    rd->written[i] = false;
                }
                ss[m] = rl->node[i];
                which[m++] = i;
            }
            if (!m)
                break;
            dlock__redis_pool_get_many(ss, m, background, deadline, need, got, rcs, msgs);
            bool again = false;
            for (size_t x = 0; x < m; x++) {
                size_t i = which[x];
                rd->k[i] = got[x];
                if (rcs[x]) {
                    dlock__redlock_node_failed(rd, i, dlock__errmsg_restore(rcs[x], msgs[x]));
                    continue;
                }
                if (!round && !pass && got[x]->nreplies > 0 && idle_conn_closed(got[x])) {
                    dlock__redis_pool_put(rl->node[i], got[x], true);
                    rd->k[i] = NULL;
                    again = true;
                    continue;
                }
                before[i] = got[x]->nreplies;
            }
            if (!again)
                break;
        }
        bool sent = false;
        for (size_t j = 0; j < n; j++) {
            struct rl_call *cl = &calls[j];
            size_t i = cl->node;
            if (!rd->k[i] || rd->rc[i])
                continue;
            bool noscript = cl->reply && cl->reply->type == REDIS_REPLY_ERROR &&
                            strncmp(cl->reply->str, "NOSCRIPT", 8) == 0;
            if (pass && !redial[i] && !noscript)
                continue;
            freeReplyObject(cl->reply);
            cl->reply = NULL;
            int rc = append_call(rd->k[i], cl, noscript);
            if (rc)
                dlock__redlock_node_failed(rd, i, rc);
            sent = true;
        }
        memset(redial, 0, sizeof redial);
        if (!sent)
            break;
        if (left == 0) {
            for (size_t i = 0; i < rl->n; i++)
                if (rd->k[i] && !rd->rc[i] && rd->k[i]->want > 0)
                    dlock__redlock_node_failed(rd, i,
                                               dlock__err(DLOCK_ETIMEDOUT,
                                                          "%s: %s: the deadline passed before it "
                                                          "could be sent",
                                                          rd->k[i]->where, what));
            break;
        }
        for (size_t i = 0; i < rl->n; i++)
            if (rd->k[i] && !rd->rc[i] && (rd->k[i]->want > 0 || !dlock__redis_conn_sent(rd->k[i])))
                ks[nk++] = rd->k[i];
        /* once NEED nodes answered, the rest get only a grace: a stopped
         * node does not hold every request for the node timeout */
        /* nodes that answered in an earlier pass count towards NEED */
        size_t done = 0;
        for (size_t i = 0; i < rl->n; i++) {
            bool answered = used[i] && rd->k[i] && !rd->rc[i] && !redial[i];
            for (size_t j = 0; answered && j < n; j++)
                answered = calls[j].node != i ||
                           (calls[j].reply && !(calls[j].reply->type == REDIS_REPLY_ERROR &&
                                                strncmp(calls[j].reply->str, "NOSCRIPT", 8) == 0));
            done += answered;
        }
        size_t want = need > done ? need - done : 0;
        dlock__redis_exchange_quorum(ks, nk, until, what, want < nk ? want : nk);
        for (size_t x = 0; x < nk; x++) {
            struct rconn *k = ks[x];
            size_t i = 0;
            while (rd->k[i] != k)
                i++;
            if (dlock__redis_conn_sent(k))
                rd->written[i] = true;
            if (k->broken) {
                if (pass == 0 && before[i] > 0 && k->nreplies == before[i] &&
                    strncmp(k->err, "no reply", 8) != 0 &&
                    strncmp(k->err, "could not send", 14) != 0 &&
                    dlock__time_left(deadline, rl->node_timeout_ms) > 0) {
                    redial[i] = true;
                    continue;
                }
                dlock__err(DLOCK_ECONN, "%s: %s: %s", k->where, what, k->err);
                dlock__redlock_node_failed(rd, i, DLOCK_ECONN);
                continue;
            }
            for (size_t j = 0; j < n; j++)
                if (calls[j].node == i && !calls[j].reply)
                    calls[j].reply = dlock__redis_conn_take(k);
        }
    }
    for (size_t i = 0; i < rl->n; i++) {
        if (!rd->k[i])
            continue;
        if (rd->rc[i])
            for (size_t j = 0; j < n; j++)
                if (calls[j].node == i) {
                    freeReplyObject(calls[j].reply);
                    calls[j].reply = NULL;
                }
        dlock__redis_pool_put(rl->node[i], rd->k[i], rd->rc[i] != 0 || rd->k[i]->broken);
        rd->k[i] = NULL;
    }
}

void dlock__redlock_calls_free(struct rl_call *calls, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        freeReplyObject(calls[j].reply);
        calls[j].reply = NULL;
    }
}

/* The first failure among the nodes, for a message: "<node>: why". */
const char *dlock__redlock_first_failure(const struct rl_round *rd, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (rd->rc[i])
            return rd->err[i];
    return "";
}

const char *dlock__redlock_shortfall(const struct redlock *rl, const struct rl_round *rd,
                                     size_t got, char buf[RL_SHORTFALL_MAX])
{
    snprintf(buf, RL_SHORTFALL_MAX, "%zu of %zu nodes, %zu needed (%s)", got, rl->n, rl->quorum,
             dlock__redlock_first_failure(rd, rl->n));
    return buf;
}

/* ============================================== inspect, force, list */

/* Whether *RC, a node's answer to an operator's call, says it could not
 * be reached: then it is the first such failure (*FIRST_RC and its
 * message in FIRST_MSG) unless one was, and *RC becomes DLOCK_OK -- the
 * call counts the nodes that answered. */
static bool unreached(int *rc, int *first_rc, char first_msg[DLOCK__MSG_MAX])
{
    if (*rc != DLOCK_ECONN && *rc != DLOCK_ETIMEDOUT && *rc != DLOCK_EUNAVAIL)
        return false;
    if (!*first_rc) {
        *first_rc = *rc;
        dlock__errmsg_save(first_msg);
    }
    *rc = DLOCK_OK;
    return true;
}

/* Ask each node in turn (operators' calls, not a hot path). The lock is
 * held when a majority of the nodes hold it; the token shown is the
 * largest counter among them (the holder's), the TTL the shortest. */
int dlock__redlock_inspect(void *state, const char *name, struct dlock_info *info)
{
    struct redlock *rl = state;
    size_t answered = 0, held = 0, shared = 0;
    int first_rc = DLOCK_OK;
    char first_msg[DLOCK__MSG_MAX] = "";
    for (size_t i = 0; i < rl->n; i++) {
        struct dlock_info *one = calloc(1, sizeof *one);
        if (!one)
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        one->nwaiters = -1;
        one->free_permits = -1;
        int rc = dlock__redis_inspect(rl->node[i], name, one);
        if (unreached(&rc, &first_rc, first_msg)) {
            /* not counted */
        } else if (!rc) {
            answered++;
            if (!info->key && one->key)
                rc = dlock__info_set_key(info, one->key);
            if (one->held) {
                held++;
                shared += one->mode == DLOCK_SHARED;
                if (one->token > info->token)
                    info->token = one->token;
                if (held == 1 || (one->ttl_ms >= 0 && one->ttl_ms < info->ttl_ms))
                    info->ttl_ms = one->ttl_ms;
                for (size_t x = 0; !rc && info->nholders == 0 && x < one->nholders; x++)
                    rc = dlock__info_add_holder(info, one->holders[x].id, one->holders[x].count);
            }
        }
        dlock_info_free(one);
        if (rc)
            return rc;
    }
    if (answered < rl->quorum)
        return dlock__err(first_rc ? first_rc : DLOCK_EUNAVAIL,
                          "%s: inspect '%s': only %zu of %zu nodes answered, %zu needed (%s)",
                          rl->where, name, answered, rl->n, rl->quorum, first_msg);
    /* readers on a majority: shared (a writer and readers never share one) */
    info->mode = shared >= rl->quorum ? DLOCK_SHARED : DLOCK_EXCLUSIVE;
    info->nwaiters = -1;
    info->held = held >= rl->quorum;
    if (!info->held) {
        info->ttl_ms = -1;
        info->token = 0;
        for (size_t x = 0; x < info->nholders; x++)
            free(info->holders[x].id);
        info->nholders = 0;
    }
    return DLOCK_OK;
}

/* dlock_check()'s look: each node's (one request each, in turn). NAME is
 * held with token T when a majority of the nodes hold it with T: the
 * granting nodes' counters agree once the acquire raised them (see
 * "Redlock" in docs/protocol-redis.md), and the other nodes never count
 * for another holder. A node that does not answer is not counted; with
 * fewer than a majority answering, nothing is known: DLOCK_EUNAVAIL or
 * the first node's failure. */
int dlock__redlock_check(void *state, const char *name, struct dlock__check_view *view)
{
    struct redlock *rl = state;
    uint64_t tokens[RL_MAX_NODES] = {0}; /* 0: not held there */
    bool shared = false;
    size_t answered = 0;
    int rc = DLOCK_OK, first_rc = DLOCK_OK;
    char first_msg[DLOCK__MSG_MAX] = "";
    for (size_t i = 0; i < rl->n && !rc; i++) {
        struct dlock__check_view one = {0};
        rc = dlock__redis_check(rl->node[i], name, &one);
        if (unreached(&rc, &first_rc, first_msg)) {
            /* not counted */
        } else if (!rc) {
            answered++;
            tokens[i] = one.held ? one.token : 0;
            shared |= one.reader_unknown;
        }
    }
    if (!rc && answered < rl->quorum)
        rc = dlock__err(first_rc ? first_rc : DLOCK_EUNAVAIL,
                        "%s: check '%s': only %zu of %zu nodes answered, %zu needed (%s)",
                        rl->where, name, answered, rl->n, rl->quorum, first_msg);
    for (size_t i = 0; !rc && !view->held && i < rl->n; i++) {
        size_t same = 0;
        for (size_t j = 0; tokens[i] && j < rl->n; j++)
            same += tokens[j] == tokens[i];
        if (same >= rl->quorum)
            *view = (struct dlock__check_view){.held = true,
                                               .token = tokens[i],
                                               .reader_unknown = shared};
    }
    return rc;
}

/* Every node; done when a majority did it (the others' copies expire). */
int dlock__redlock_force_release(void *state, const char *name)
{
    struct redlock *rl = state;
    size_t done = 0;
    int first_rc = DLOCK_OK;
    char first_msg[DLOCK__MSG_MAX] = "";
    for (size_t i = 0; i < rl->n; i++) {
        int rc = dlock__redis_force_release(rl->node[i], name);
        if (!rc)
            done++;
        else if (!first_rc) {
            first_rc = rc;
            dlock__errmsg_save(first_msg);
        }
    }
    if (done >= rl->quorum && (first_rc == DLOCK_OK || first_rc == DLOCK_ECONN ||
                               first_rc == DLOCK_ETIMEDOUT || first_rc == DLOCK_EUNAVAIL))
        return DLOCK_OK;
    return dlock__errmsg_restore(first_rc, first_msg);
}

struct name_set {
    char **v;
    size_t n, cap;
};

static int collect_name(const char *name, void *arg)
{
    struct name_set *ns = arg;
    if (ns->n == ns->cap) {
        size_t cap = ns->cap ? 2 * ns->cap : 64;
        char **v = realloc(ns->v, cap * sizeof *v);
        if (!v)
            return 1;
        ns->v = v;
        ns->cap = cap;
    }
    if (!(ns->v[ns->n] = dlock__strdup(name)))
        return 1;
    ns->n++;
    return 0;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names any node holds (a minority's leftovers included: they are
 * what an operator may want to force-release), each once, sorted. */
int dlock__redlock_list(void *state, const char *pattern, dlock_list_fn fn, void *arg)
{
    struct redlock *rl = state;
    struct name_set ns = {0};
    size_t answered = 0;
    int rc = DLOCK_OK, first_rc = DLOCK_OK;
    char first_msg[DLOCK__MSG_MAX] = "";
    for (size_t i = 0; i < rl->n; i++) {
        rc = dlock__redis_list(rl->node[i], pattern, collect_name, &ns);
        if (rc && !first_rc) {
            first_rc = rc;
            dlock__errmsg_save(first_msg);
        }
        if (!rc)
            answered++;
    }
    if (answered < rl->quorum) {
        rc = dlock__err(first_rc ? first_rc : DLOCK_EUNAVAIL,
                        "%s: list: only %zu of %zu nodes answered, %zu needed (%s)", rl->where,
                        answered, rl->n, rl->quorum, first_msg);
    } else {
        rc = DLOCK_OK;
        if (ns.n)
            qsort(ns.v, ns.n, sizeof *ns.v, cmp_names);
        for (size_t j = 0; j < ns.n; j++)
            if ((j == 0 || strcmp(ns.v[j], ns.v[j - 1]) != 0) && fn(ns.v[j], arg) != 0)
                break;
    }
    for (size_t j = 0; j < ns.n; j++)
        free(ns.v[j]);
    free(ns.v);
    return rc;
}
