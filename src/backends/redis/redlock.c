/* redlock.c -- Redlock: one lock over N independent Redis masters
 * (redlock://h1,h2,h3), the algorithm of the Redis documentation, with a
 * fencing token that only grows.
 *
 * Why it is shaped so. Each node is a whole single-node state of this
 * backend (conn.c: its pool, its subscriber hub, its queue of owed
 * cancels) running the same Lua scripts in the same layouts, so a fleet
 * of node-redlock or redsync clients (layout=simple) or of Redisson
 * clients on the same nodes excludes dlock and the other way round. What
 * Redlock adds is here: every request goes to all N nodes at once -- one
 * connection per node, every command appended, one poll loop over all of
 * them (net.c's dlock__redis_exchange) bounded by the node timeout, far below
 * the lease -- and a quorum decides. An acquisition counts when
 * floor(N/2)+1 nodes granted it and the lease minus the time it took
 * minus the drift margin is still positive; otherwise what was granted is
 * given back at once and the attempt is retried after a random delay (so
 * that two contenders that split the nodes do not split them again). A
 * renewal must reach a majority within the validity, or the keeper
 * declares the hold lost. Waiters sleep on every node's hub: a release
 * message from any node wakes them.
 *
 * The token: every node INCRs its own counter when it grants; the
 * acquisition's token is the largest the granting majority returned, and
 * the granting nodes whose counter is lower are raised to it before the
 * token is handed out (a second round trip, needed only while counters
 * differ: once a majority agrees the raise is skipped). So a majority of
 * nodes holds a counter >= every token issued, any later majority
 * intersects it, and a later token is greater -- as long as no node loses
 * its counter (docs/protocol-redis.md, "Redlock").
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis.h"

/* Holds per renewal script call, as in mutex.c. */
#define RL_RENEW_BATCH 1000
#define RL_MAX_NODES DLOCK__MAX_HOSTS
/* The random pause after an attempt that split the nodes with another
 * contender, before trying again. */
#define RL_SPLIT_MIN_MS 2
#define RL_SPLIT_MAX_MS 100

/* Raise a node's token counter to the acquisition's token (KEYS: the
 * token key; ARGV: the token). Returns 1. Inline: Redis caches it. */
static const char RAISE_SRC[] =
    "local v = tonumber(redis.call('get', KEYS[1]) or '0') or 0\n"
    "if v < tonumber(ARGV[1]) then redis.call('set', KEYS[1], ARGV[1]) end\n"
    "return 1\n";

struct redlock {
    struct dlock_client *c;
    size_t n, quorum;
    struct redis_state *node[RL_MAX_NODES];
    int64_t node_timeout_ms;
    char where[64]; /* "redlock (3 nodes)" */
    char raise_sha[41];
    uint64_t requests; /* acquire request numbers (atomic) */
};

/* What a hold knows of each node. */
enum { NODE_NO, NODE_YES, NODE_UNKNOWN };
struct rl_hold {
    unsigned char state[RL_MAX_NODES];
    uint64_t token[RL_MAX_NODES];   /* what the node's INCR gave (its value's suffix) */
    uint64_t counter[RL_MAX_NODES]; /* its token key after our acquisition */
    uint64_t version; /* a campaign's: the number of its last value written */
};

/* ================================================== a request on N nodes */

/* One script call on one node within a parallel request. */
struct rl_call {
    size_t node;
    const char *src, *sha; /* the script */
    int nkeys, nargs;
    const char **args;
    const size_t *lens;
    redisReply *reply; /* its reply (an error reply too); NULL when the node failed */
};

/* One parallel request: a connection per node, and each node's failure. */
struct rl_round {
    struct rconn *k[RL_MAX_NODES];
    int rc[RL_MAX_NODES];
    bool written[RL_MAX_NODES]; /* every command was sent: it may have run */
    char err[RL_MAX_NODES][300];
};

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

static void node_failed(struct rl_round *rd, size_t i, int rc)
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
static void round_run(struct redlock *rl, struct rl_round *rd, struct rl_call *calls, size_t n,
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
                    node_failed(rd, i, dlock__errmsg_restore(rcs[x], msgs[x]));
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
                node_failed(rd, i, rc);
            sent = true;
        }
        memset(redial, 0, sizeof redial);
        if (!sent)
            break;
        if (left == 0) {
            for (size_t i = 0; i < rl->n; i++)
                if (rd->k[i] && !rd->rc[i] && rd->k[i]->want > 0)
                    node_failed(rd, i, dlock__err(DLOCK_ETIMEDOUT, "%s: %s: the deadline passed "
                                                  "before it could be sent", rd->k[i]->where, what));
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
                answered = calls[j].node != i || (calls[j].reply &&
                           !(calls[j].reply->type == REDIS_REPLY_ERROR &&
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
                node_failed(rd, i, DLOCK_ECONN);
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

static void calls_free(struct rl_call *calls, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        freeReplyObject(calls[j].reply);
        calls[j].reply = NULL;
    }
}

/* The first failure among the nodes, for a message: "<node>: why". */
static const char *first_failure(const struct rl_round *rd, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (rd->rc[i])
            return rd->err[i];
    return "";
}

/* ============================================================== acquire */

static void owner_of(struct redlock *rl, struct dlock__hold *h)
{
    snprintf(h->owner, sizeof h->owner, "%s:%ld", rl->node[0]->uuid, h->tid);
}

/* The value a node holds for H in the simple layout ("<owner>:<token>"),
 * or the owner field in Redisson's. */
static int node_value(struct redlock *rl, const struct dlock__hold *h, uint64_t token, char *buf,
                      size_t size)
{
    return rl->node[0]->simple ? snprintf(buf, size, "%s:%llu", h->owner, (unsigned long long)token)
                               : snprintf(buf, size, "%s", h->owner);
}

/* Give back what H holds on the nodes marked in BD (NODE_YES), every node
 * at once; a node whose outcome is unknown gets a cancel queued instead
 * (cancel.c). *RELEASED / *GONE (may be NULL) count the nodes that let it
 * go and those where it was no longer ours. Returns the round's first
 * failure code (0 when every node answered). */
static int release_nodes(struct redlock *rl, struct dlock__hold *h, struct rl_hold *bd,
                         const struct lock_keys *k, int64_t deadline, size_t *released,
                         size_t *gone, struct rl_round *rd)
{
    struct rl_call calls[RL_MAX_NODES];
    char vals[RL_MAX_NODES][160], toks[RL_MAX_NODES][24];
    const char *args[RL_MAX_NODES][6];
    size_t lens[RL_MAX_NODES][6];
    size_t n = 0;
    bool reader = h->mode == DLOCK_SHARED;
    for (size_t i = 0; i < rl->n; i++) {
        if (bd->state[i] != NODE_YES)
            continue;
        struct redis_state *s = rl->node[i];
        if (reader) { /* RReadWriteLock's read unlock (scripts/rw_release_read.lua) */
            const char *a[] = {k->lock, k->chan, k->rwchan, k->tbase, h->owner};
            size_t l[] = {k->lock_len, k->chan_len, k->rwchan_len, k->tbase_len, strlen(h->owner)};
            memcpy(args[i], a, sizeof a);
            memcpy(lens[i], l, sizeof l);
            calls[n++] = (struct rl_call){.node = i, .src = s->src[S_RW_RELEASE_READ],
                                          .sha = s->sha[S_RW_RELEASE_READ], .nkeys = 4, .nargs = 5,
                                          .args = args[i], .lens = lens[i]};
            continue;
        }
        int vl = node_value(rl, h, bd->token[i], vals[i], sizeof vals[i]);
        int tl = snprintf(toks[i], sizeof toks[i], "%llu", (unsigned long long)bd->counter[i]);
        const char *a[] = {k->lock, k->chan, k->token, k->rwchan, vals[i], toks[i]};
        size_t l[] = {k->lock_len, k->chan_len, k->token_len, k->rwchan_len, (size_t)vl, (size_t)tl};
        memcpy(args[i], a, sizeof a);
        memcpy(lens[i], l, sizeof l);
        calls[n++] = (struct rl_call){.node = i, .src = s->src[S_RELEASE], .sha = s->sha[S_RELEASE],
                                      .nkeys = 4, .nargs = 6, .args = args[i], .lens = lens[i]};
    }
    size_t ok = 0, lost = 0;
    round_run(rl, rd, calls, n, deadline, false, "release", rl->quorum);
    int rc = DLOCK_OK;
    for (size_t j = 0; j < n; j++) {
        const redisReply *r = calls[j].reply;
        size_t i = calls[j].node;
        if (!r) { /* that node's copy expires with the lease */
            if (!rc)
                rc = rd->rc[i];
            continue;
        }
        if (r->type == REDIS_REPLY_INTEGER && r->integer == 1)
            ok++;
        else
            lost++;
        bd->state[i] = NODE_NO;
    }
    calls_free(calls, n);
    for (size_t i = 0; i < rl->n; i++)
        if (bd->state[i] == NODE_UNKNOWN) {
            /* a reply lost at acquire: the cancel was queued then */
            bd->state[i] = NODE_NO;
        }
    if (released)
        *released = ok;
    if (gone)
        *gone = lost;
    return rc;
}

/* One attempt on every node within DEADLINE: DLOCK_OK (h->token, the
 * nodes in BD, the hold confirmed), DLOCK_EBUSY (*TTL_MS: when the
 * holder's lease ends on the nodes that refused; *SPLIT: nodes were
 * granted and given back, or no majority is held by anyone, so the next
 * try waits a random delay rather than a release message),
 * DLOCK_EUNAVAIL when too few nodes answered for a majority, or another
 * failure. Nothing stays held when it fails. */
static int acquire_once(struct redlock *rl, struct dlock__hold *h, struct rl_hold *bd,
                        const struct lock_keys *k, const char *stage, int64_t deadline,
                        int64_t *ttl_ms, bool *split)
{
    memset(bd, 0, sizeof *bd);
    *split = false;
    *ttl_ms = -2;
    int64_t lease = h->lease_ms;
    uint64_t reqno = __atomic_add_fetch(&rl->requests, 1, __ATOMIC_RELAXED);
    /* a reader is RReadWriteLock's read lock on each node; a waiting
     * writer (STAGE "1", "2") records itself on the nodes that refused, so
     * new readers queue behind it there (as on one node, mutex.c) */
    struct acquire_args a;
    dlock__redis_acquire_args(&a, rl->node[0]->simple, h, k, lease, reqno, 0, stage);
    struct rl_call calls[RL_MAX_NODES];
    struct rl_round rd;
    char owed[RL_MAX_NODES][300];
    int owed_rc[RL_MAX_NODES] = {0};
    size_t n = 0;
    for (size_t i = 0; i < rl->n; i++) {
        struct redis_state *s = rl->node[i];
        /* A cancel this owner still owes the node on the name (an earlier
         * reply lost there, cancel.c) goes first, within 250 ms:
         * a node that cannot take it now (stopped) sits this attempt out
         * rather than hold it for the node timeout; the keeper sends it. */
        int64_t owed_by = dlock__now_ms() + (rl->node_timeout_ms < 250 ? rl->node_timeout_ms : 250);
        if ((owed_rc[i] = dlock__redis_cancel_owed(s, h, owed_by < deadline || !deadline
                                                             ? owed_by : deadline))) {
            snprintf(owed[i], sizeof owed[i], "%s", dlock_errmsg());
            continue;
        }
        calls[n++] = (struct rl_call){.node = i, .src = s->src[S_ACQUIRE], .sha = s->sha[S_ACQUIRE],
                                      .nkeys = 5, .nargs = 12, .args = a.v, .lens = a.len};
    }
    int64_t start = dlock__now_ms();
    round_run(rl, &rd, calls, n, deadline, false, "acquire", rl->quorum);
    for (size_t i = 0; i < rl->n; i++)
        if (owed_rc[i]) {
            rd.rc[i] = owed_rc[i];
            memcpy(rd.err[i], owed[i], sizeof rd.err[i]);
        }
    size_t granted = 0, busy = 0, failed = 0;
    uint64_t top = 0;
    int hard = DLOCK_OK; /* a failure no retry mends (WRONGTYPE, a server error) */
    char hard_msg[DLOCK__MSG_MAX] = "";
    for (size_t j = 0; j < n; j++) {
        size_t i = calls[j].node;
        const redisReply *r = calls[j].reply;
        if (!r) {
            if (rd.written[i]) { /* it may have run: owe the node a cancel */
                bd->state[i] = NODE_UNKNOWN;
                dlock__redis_cancel_lost_acquire(rl->node[i], h, reqno, lease);
            }
            continue;
        }
        uint64_t v = 0;
        int64_t t = -1;
        int rc = r->type == REDIS_REPLY_ERROR
                     ? dlock__redis_server_error(rl->node[i], r->str, "acquire")
                     : dlock__redis_acquire_result(rl->node[i], r, k, &v, &t);
        if (rc && rc != DLOCK_EBUSY) {
            node_failed(&rd, i, rc);
            if (!hard) {
                hard = rc;
                dlock__errmsg_save(hard_msg);
            }
            continue;
        }
        if (!rc) {
            bd->state[i] = NODE_YES;
            bd->token[i] = bd->counter[i] = v;
            if (v > top)
                top = v;
            granted++;
        } else {
            busy++;
            if (t == -1)
                t = lease; /* a foreign lock without expiry */
            if (*ttl_ms < 0 || t < *ttl_ms)
                *ttl_ms = t;
        }
    }
    calls_free(calls, n);
    for (size_t i = 0; i < rl->n; i++)
        failed += rd.rc[i] != 0;

    /* Raise the granting nodes' counters that are below the token, so a
     * majority holds a counter >= it before it is handed out. */
    size_t at_top = 0;
    for (size_t i = 0; i < rl->n; i++)
        at_top += bd->state[i] == NODE_YES && bd->token[i] == top;
    if (granted >= rl->quorum && at_top < rl->quorum) {
        char stop[24];
        int tl = snprintf(stop, sizeof stop, "%llu", (unsigned long long)top);
        const char *rargs[] = {k->token, stop};
        size_t rlens[] = {k->token_len, (size_t)tl};
        size_t m = 0;
        for (size_t i = 0; i < rl->n; i++)
            if (bd->state[i] == NODE_YES && bd->token[i] < top)
                calls[m++] = (struct rl_call){.node = i, .src = RAISE_SRC, .sha = rl->raise_sha,
                                              .nkeys = 1, .nargs = 2, .args = rargs, .lens = rlens};
        struct rl_round rr;
        round_run(rl, &rr, calls, m, deadline, false, "raise the token counter", m);
        for (size_t j = 0; j < m; j++)
            if (calls[j].reply && calls[j].reply->type == REDIS_REPLY_INTEGER) {
                at_top++;
                bd->counter[calls[j].node] = top;
            }
        calls_free(calls, m);
    }

    int64_t elapsed = dlock__now_ms() - start;
    int64_t validity = lease - elapsed - rl->c->opts.drift_ms;
    if (granted >= rl->quorum && at_top >= rl->quorum && validity > 0) {
        h->token = top;
        dlock__hold_confirmed(rl->c, h, start);
        return DLOCK_OK;
    }

    /* Not acquired: give back what was granted, everywhere at once. */
    char why[DLOCK__MSG_MAX];
    if (hard) {
        memcpy(why, hard_msg, sizeof why);
    } else if (granted >= rl->quorum && at_top < rl->quorum) {
        snprintf(why, sizeof why, "%s: lock '%s' was granted by %zu of %zu nodes but the token "
                                  "counter reached only %zu (%zu needed); given back (%s)",
                 rl->where, h->name, granted, rl->n, at_top, rl->quorum, first_failure(&rd, rl->n));
    } else if (granted >= rl->quorum) {
        snprintf(why, sizeof why, "%s: lock '%s' was granted by %zu of %zu nodes after %lld ms, "
                                  "past its validity (lease %lld ms - drift %lld ms); given back",
                 rl->where, h->name, granted, rl->n, (long long)elapsed, (long long)lease,
                 (long long)rl->c->opts.drift_ms);
    } else if (busy > 0) {
        snprintf(why, sizeof why, "%s: lock '%s' is held by another owner on %zu of %zu nodes "
                                  "(%zu granted, %zu needed; %lld ms of lease left)",
                 rl->where, h->name, busy, rl->n, granted, rl->quorum, (long long)*ttl_ms);
    } else {
        snprintf(why, sizeof why, "%s: lock '%s': only %zu of %zu nodes answered, %zu needed (%s)",
                 rl->where, h->name, rl->n - failed, rl->n, rl->quorum, first_failure(&rd, rl->n));
    }
    /* A split: nodes were granted to us, or those held by others cannot
     * make a majority (another contender's attempt in flight). Nobody's
     * release message may come, so the next try is after a random pause,
     * not at the holder's lease. */
    *split = granted > 0 || busy + failed < rl->quorum;
    if (granted > 0) {
        struct rl_round rr;
        release_nodes(rl, h, bd, k, DLOCK__NEVER, NULL, NULL, &rr);
    }
    if (hard)
        return dlock__err(hard, "%s", why);
    if (busy > 0 && granted < rl->quorum)
        return dlock__err(DLOCK_EBUSY, "%s", why);
    if (granted >= rl->quorum) /* too slow or the raise failed: try again */
        return dlock__err(DLOCK_EBUSY, "%s", why);
    return dlock__err(DLOCK_EUNAVAIL, "%s", why);
}

/* Every node's channels of H's releases (rwlock.c: a reader's, or a
 * writer's, which hears a reader's release too), on the first JOINED. */
static void hubs_leave(struct redlock *rl, const struct dlock__hold *h, const struct lock_keys *k,
                       struct dlock__wait *w, size_t joined, bool acquired)
{
    for (size_t i = 0; i < joined; i++)
        dlock__redis_rw_unlisten(rl->node[i], h, k, w, acquired);
}

/* A writer that recorded itself as waiting gives up: its record goes
 * from every node at once (best effort: it lapses anyway). Keeps the
 * acquire's own message. */
static void unwait_nodes(struct redlock *rl, const struct dlock__hold *h, const struct lock_keys *k)
{
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    const char *args[] = {k->writers, k->rwchan, h->owner};
    size_t lens[] = {k->writers_len, k->rwchan_len, strlen(h->owner)};
    struct rl_call calls[RL_MAX_NODES];
    for (size_t i = 0; i < rl->n; i++) {
        struct redis_state *s = rl->node[i];
        calls[i] = (struct rl_call){.node = i, .src = s->src[S_RW_UNWAIT], .sha = s->sha[S_RW_UNWAIT],
                                    .nkeys = 2, .nargs = 3, .args = args, .lens = lens};
    }
    struct rl_round rd;
    round_run(rl, &rd, calls, rl->n, DLOCK__NEVER, false, "give up waiting", rl->n);
    calls_free(calls, rl->n);
    dlock__errmsg_restore(DLOCK_OK, msg);
}

/* Sleep until MS from now have passed, wakes aside (the random pause
 * after a split: a release message, our own among them, must not end
 * it), unless W is canceled or its deadline passes. */
static int pause_ms(struct dlock__wait *w, int64_t ms)
{
    int64_t until = dlock__now_ms() + ms;
    int rc = DLOCK_OK;
    while (!rc && dlock__now_ms() < until)
        rc = dlock__wait_sleep(w, dlock__wait_seq(w), until);
    return rc;
}

static int rl_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
{
    struct redlock *rl = state;
    struct lock_keys k;
    int rc = dlock__redis_rw_check_layout(rl->node[0], h);
    if (rc || (rc = dlock__redis_keys_make(rl->node[0], h->name, &k)))
        return rc;
    struct rl_hold *bd = calloc(1, sizeof *bd);
    if (!bd) {
        dlock__redis_keys_free(&k);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    owner_of(rl, h);
    int64_t ttl;
    bool split;
    size_t joined = 0;
    rc = acquire_once(rl, h, bd, &k, dlock__wait_try_once(w) ? "0" : "1", dlock__wait_deadline(w),
                      &ttl, &split);
    if (rc != DLOCK_EBUSY || dlock__wait_try_once(w))
        goto out;

    /* Contended: listen on every node's hub (a new subscription wakes us,
     * so a release between a try and the subscription is not missed),
     * then try each time a release message or the holder's lease says. */
    for (; joined < rl->n; joined++)
        if ((rc = dlock__redis_rw_listen(rl->node[joined], h, &k, w)))
            goto leave;
    struct dlock__redis_outage outage = DLOCK__REDIS_OUTAGE_INIT;
    struct dlock__backoff splits = {.min_ms = RL_SPLIT_MIN_MS, .max_ms = RL_SPLIT_MAX_MS};
    unsigned seed = (unsigned)(dlock__now_ms() ^ (int64_t)h->tid * 2654435761u);
    for (;;) {
        if (split) {
            /* full jitter: anywhere up to the doubling bound */
            rc = pause_ms(w, 1 + rand_r(&seed) % dlock__backoff_next(&splits));
            if (rc)
                break;
        }
        unsigned seq = dlock__wait_seq(w);
        for (size_t i = 0; i < joined; i++) /* the wakes received are being used now */
            dlock__redis_rw_heard(rl->node[i], h, &k, w);
        rc = acquire_once(rl, h, bd, &k, "2", dlock__wait_deadline(w), &ttl, &split);
        /* the nodes answered before: an outage is transient until the deadline */
        if (!dlock__redis_outage_note(&outage, rc, true))
            break;
        if (!split)
            dlock__backoff_reset(&splits);
        /* a split tries again after the pause, at once */
        rc = dlock__redis_wait_sleep(w, seq, split ? -2 : ttl, h->lease_ms, &outage, DLOCK_EUNAVAIL,
                                     rl->where, k.lock);
        if (rc != DLOCK_OK)
            break;
    }
leave:
    hubs_leave(rl, h, &k, w, joined, rc == DLOCK_OK);
    if ((rc == DLOCK_ETIMEDOUT || rc == DLOCK_ECANCELED) && h->mode == DLOCK_EXCLUSIVE &&
        !rl->node[0]->simple)
        unwait_nodes(rl, h, &k); /* let the readers behind us in */
out:
    if (rc == DLOCK_OK)
        h->bdata = bd;
    else
        free(bd);
    dlock__redis_keys_free(&k);
    return rc;
}

/* ============================================================== release */

static int rl_release(void *state, struct dlock__hold *h)
{
    struct redlock *rl = state;
    struct rl_hold *bd = h->bdata;
    h->bdata = NULL;
    if (!bd)
        return dlock__err(DLOCK_ELOST, "%s: lock '%s': no node record", rl->where, h->name);
    struct lock_keys k;
    int rc = dlock__redis_keys_make(rl->node[0], h->name, &k);
    if (rc) {
        free(bd);
        return rc;
    }
    size_t held = 0, released = 0, gone = 0;
    for (size_t i = 0; i < rl->n; i++)
        held += bd->state[i] == NODE_YES;
    struct rl_round rd;
    int frc = release_nodes(rl, h, bd, &k, DLOCK__NEVER, &released, &gone, &rd);
    if (released >= rl->quorum)
        rc = DLOCK_OK;
    else if (held < rl->quorum || gone > held - rl->quorum)
        rc = dlock__err(DLOCK_ELOST, "%s: lock '%s' was lost: released on %zu of %zu nodes, "
                                     "another owner or none on %zu (our token was %llu)",
                        rl->where, h->name, released, rl->n, gone, (unsigned long long)h->token);
    else
        rc = dlock__err(frc ? frc : DLOCK_ECONN, "%s: lock '%s': released on %zu of %zu nodes, "
                                                 "%zu needed (%s); the others expire with the lease",
                        rl->where, h->name, released, rl->n, rl->quorum, first_failure(&rd, rl->n));
    free(bd);
    dlock__redis_keys_free(&k);
    return rc;
}

/* The backend's downgrade: exclusive hold H becomes shared in place on
 * every node that holds it, all at once (scripts/rw_downgrade.lua: the
 * field stays, "mode" turns "read", the reader's timeout key is written,
 * waiting readers are woken). Done when a majority did it; the nodes
 * that did not keep nothing of H for the renewals (their copy expires).
 * Otherwise the hold can no longer pass for exclusive (readers may be in
 * on some nodes already): DLOCK_ELOST, as on one node. */
static int rl_downgrade(void *state, struct dlock__hold *h)
{
    struct redlock *rl = state;
    struct rl_hold *bd = h->bdata;
    if (!bd)
        return dlock__err(DLOCK_ELOST, "%s: lock '%s': no node record", rl->where, h->name);
    struct lock_keys k;
    int rc = dlock__redis_keys_make(rl->node[0], h->name, &k);
    if (rc)
        return rc;
    char lease[24], token[24];
    int ll = snprintf(lease, sizeof lease, "%lld", (long long)h->lease_ms);
    int tl = snprintf(token, sizeof token, "%llu", (unsigned long long)h->token);
    const char *args[] = {k.lock, k.rwchan, k.tbase, h->owner, lease, token};
    size_t lens[] = {k.lock_len, k.rwchan_len, k.tbase_len, strlen(h->owner), (size_t)ll, (size_t)tl};
    struct rl_call calls[RL_MAX_NODES];
    size_t n = 0, done = 0;
    for (size_t i = 0; i < rl->n; i++) {
        struct redis_state *s = rl->node[i];
        if (bd->state[i] == NODE_YES)
            calls[n++] = (struct rl_call){.node = i, .src = s->src[S_RW_DOWNGRADE],
                                          .sha = s->sha[S_RW_DOWNGRADE], .nkeys = 3, .nargs = 6,
                                          .args = args, .lens = lens};
    }
    int64_t sent = dlock__now_ms();
    struct rl_round rd;
    round_run(rl, &rd, calls, n, DLOCK__NEVER, false, "downgrade", rl->quorum);
    for (size_t j = 0; j < n; j++) {
        const redisReply *r = calls[j].reply;
        if (r && r->type == REDIS_REPLY_INTEGER && r->integer == 1)
            done++;
        else
            bd->state[calls[j].node] = r ? NODE_NO : NODE_UNKNOWN;
    }
    calls_free(calls, n);
    if (done >= rl->quorum)
        dlock__hold_confirmed(rl->c, h, sent); /* the timeout keys' leases run from now */
    else
        rc = dlock__err(DLOCK_ELOST, "%s: lock '%s': downgraded to shared on %zu of %zu nodes, %zu "
                                     "needed (%s); the hold can no longer be trusted exclusive",
                        rl->where, h->name, done, rl->n, rl->quorum, first_failure(&rd, rl->n));
    dlock__redis_keys_free(&k);
    return rc;
}

/* ================================================================ renew */

/* The keeper's batch: per node, the holds granted there in calls of
 * RL_RENEW_BATCH, every node at once in one round trip. A hold is renewed
 * when a majority renewed it and the validity of the renewal (its send
 * time + lease - drift) has not passed; lost when fewer than a majority
 * can still have it. */
static int rl_renew(void *state, struct dlock__renew_batch *b)
{
    struct redlock *rl = state;
    size_t n = b->n;
    if (n == 0)
        return DLOCK_OK;
    size_t chunks = (n + RL_RENEW_BATCH - 1) / RL_RENEW_BATCH;
    size_t ncalls = chunks * rl->n;
    struct rl_call *calls = calloc(ncalls, sizeof *calls);
    struct renew_bufs rb;
    int rc = dlock__redis_renew_bufs_new(&rb, ncalls * 4 * RL_RENEW_BATCH, n * rl->n, n);
    size_t *hold_of = calloc(ncalls * RL_RENEW_BATCH, sizeof *hold_of); /* call slot -> hold */
    unsigned char *renewed = calloc(n, 1);
    char **timeouts = calloc(n, sizeof *timeouts); /* a reader's timeout key; NULL: a writer */
    if (!rc && (!calls || !hold_of || !renewed || !timeouts))
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    if (rc)
        goto fail_all;
    for (size_t j = 0; j < n; j++) {
        struct dlock__hold *h = b->holds[j];
        if ((rc = dlock__redis_keys_make(rl->node[0], h->name, &rb.keys[j])))
            goto fail_all;
        snprintf(rb.leases[j], sizeof rb.leases[j], "%lld", (long long)h->lease_ms);
        if (h->mode != DLOCK_SHARED)
            continue;
        size_t size = rb.keys[j].tbase_len + strlen(h->owner) + 32;
        if (!(timeouts[j] = malloc(size))) {
            rc = dlock__err(DLOCK_ENOMEM, "out of memory");
            goto fail_all;
        }
        dlock__redis_rw_timeout_key(&rb.keys[j], h, timeouts[j], size);
    }
    /* Lay out each node's calls: keys first, then (value, lease, the
     * reader's timeout key or '') each. */
    size_t nc = 0;
    const char **ap = rb.argv;
    size_t *lp = rb.argl;
    for (size_t i = 0; i < rl->n; i++) {
        struct redis_state *s = rl->node[i];
        size_t j = 0;
        while (j < n) {
            size_t slots[RL_RENEW_BATCH], m = 0;
            for (; j < n && m < RL_RENEW_BATCH; j++) {
                struct rl_hold *bd = b->holds[j]->bdata;
                if (bd && bd->state[i] == NODE_YES)
                    slots[m++] = j;
            }
            if (m == 0)
                break;
            struct rl_call *cl = &calls[nc];
            *cl = (struct rl_call){.node = i, .src = s->src[S_RENEW], .sha = s->sha[S_RENEW],
                                   .nkeys = (int)m, .nargs = (int)(4 * m), .args = ap, .lens = lp};
            for (size_t x = 0; x < m; x++) {
                ap[x] = rb.keys[slots[x]].lock;
                lp[x] = rb.keys[slots[x]].lock_len;
                hold_of[nc * RL_RENEW_BATCH + x] = slots[x];
            }
            for (size_t x = 0; x < m; x++) {
                struct dlock__hold *h = b->holds[slots[x]];
                struct rl_hold *bd = h->bdata;
                char *v = rb.vals[slots[x] * rl->n + i];
                int vl = node_value(rl, h, bd->token[i], v, 160);
                ap[m + 3 * x] = v;
                lp[m + 3 * x] = (size_t)vl;
                ap[m + 3 * x + 1] = rb.leases[slots[x]];
                lp[m + 3 * x + 1] = strlen(rb.leases[slots[x]]);
                ap[m + 3 * x + 2] = timeouts[slots[x]] ? timeouts[slots[x]] : "";
                lp[m + 3 * x + 2] = strlen(ap[m + 3 * x + 2]);
            }
            ap += 4 * m;
            lp += 4 * m;
            nc++;
        }
    }
    int64_t sent = dlock__now_ms();
    struct rl_round rd;
    round_run(rl, &rd, calls, nc, b->deadline, true, "renew", rl->quorum);
    for (size_t c = 0; c < nc; c++) {
        const redisReply *r = calls[c].reply;
        size_t i = calls[c].node;
        size_t m = (size_t)calls[c].nkeys;
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != m)
            continue; /* the node failed: its holds may still be there */
        for (size_t x = 0; x < m; x++) {
            size_t j = hold_of[c * RL_RENEW_BATCH + x];
            struct rl_hold *bd = b->holds[j]->bdata;
            if (r->element[x]->type == REDIS_REPLY_INTEGER && r->element[x]->integer == 1)
                renewed[j]++;
            else
                bd->state[i] = NODE_NO; /* gone from that node */
        }
    }
    int64_t now = dlock__now_ms();
    for (size_t j = 0; j < n; j++) {
        struct dlock__hold *h = b->holds[j];
        struct rl_hold *bd = h->bdata;
        size_t still = 0;
        for (size_t i = 0; bd && i < rl->n; i++)
            still += bd->state[i] == NODE_YES;
        if (renewed[j] >= rl->quorum && now < sent + h->lease_ms - rl->c->opts.drift_ms) {
            dlock__renew_result(b, j, DLOCK_OK);
            dlock__hold_confirmed(rl->c, h, sent);
        } else if (still < rl->quorum) {
            char nodes[200] = "";
            size_t nl = 0;
            for (size_t i = 0; bd && i < rl->n && nl < sizeof nodes - 1; i++)
                if (bd->state[i] != NODE_YES)
                    nl += (size_t)snprintf(nodes + nl, sizeof nodes - nl, "%s%s:%d", nl ? ", " : "",
                                           rl->node[i]->host, rl->node[i]->port);
            dlock__err(DLOCK_ELOST, "%s: renewal found lock '%s' held by another owner or gone "
                                    "(lease expired, force-released or the node lost its data) on "
                                    "%zu of %zu nodes (%s); a majority needs %zu",
                       rl->where, h->name, rl->n - still, rl->n, nodes, rl->quorum);
            dlock__renew_result(b, j, DLOCK_ELOST);
        } else {
            dlock__err(DLOCK_EUNAVAIL, "%s: renewal of lock '%s' reached %zu of %zu nodes in time, "
                                       "%zu needed (%s)",
                       rl->where, h->name, (size_t)renewed[j], rl->n, rl->quorum,
                       first_failure(&rd, rl->n));
            dlock__renew_result(b, j, DLOCK_EUNAVAIL);
        }
    }
    calls_free(calls, nc);
    goto out;
fail_all:
    for (size_t j = 0; j < n; j++)
        dlock__renew_result(b, j, rc);
out:
    for (size_t j = 0; timeouts && j < n; j++)
        free(timeouts[j]);
    free(timeouts);
    dlock__redis_renew_bufs_free(&rb);
    free(calls);
    free(hold_of);
    free(renewed);
    return rc;
}

/* ============================================== inspect, force, list */

/* Ask each node in turn (operators' calls, not a hot path). The lock is
 * held when a majority of the nodes hold it; the token shown is the
 * largest counter among them (the holder's), the TTL the shortest. */
static int rl_inspect(void *state, const char *name, struct dlock_info *info)
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
        if (rc == DLOCK_ECONN || rc == DLOCK_ETIMEDOUT || rc == DLOCK_EUNAVAIL) {
            if (!first_rc) {
                first_rc = rc;
                dlock__errmsg_save(first_msg);
            }
            rc = DLOCK_OK;
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
        return dlock__err(first_rc ? first_rc : DLOCK_EUNAVAIL, "%s: inspect '%s': only %zu of %zu "
                                                                "nodes answered, %zu needed (%s)",
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

/* Every node; done when a majority did it (the others' copies expire). */
static int rl_force_release(void *state, const char *name)
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
static int rl_list(void *state, const char *pattern, dlock_list_fn fn, void *arg)
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
        rc = dlock__err(first_rc ? first_rc : DLOCK_EUNAVAIL, "%s: list: only %zu of %zu nodes "
                                                               "answered, %zu needed (%s)",
                        rl->where, answered, rl->n, rl->quorum, first_msg);
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

/* ======================================================== open / close */

static void rl_close(void *state)
{
    struct redlock *rl = state;
    if (!rl)
        return;
    for (size_t i = 0; i < rl->n; i++)
        dlock__redis_close(rl->node[i]);
    free(rl);
}

/* The SHA-1 of SRC in hex (EVALSHA's digest) into OUT. */
static void sha1_hex(const char *src, char out[41])
{
    dlock__redis_sha1_hex(src, strlen(src), out);
}

static int rl_open(struct dlock_client *c, void **state)
{
    const char *url = dlock_client_url(c);
    if (c->url.nhosts < 1 || (c->url.nhosts == 1 && !c->url.hosts[0].host[0]))
        return dlock__err(DLOCK_EBADURL, "bad URL '%s': %s:// needs its nodes, e.g. "
                                         "redlock://h1:6379,h2:6379,h3:6379",
                          url, c->url.scheme);
    if (c->url.path && strcmp(c->url.path, "/") != 0 && *c->url.path)
        return dlock__err(DLOCK_EBADURL, "bad URL '%s': a Redlock URL has no path (the db is "
                                         "?db=N)", url);
    struct redlock *rl = calloc(1, sizeof *rl);
    if (!rl)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    rl->c = c;
    rl->n = c->url.nhosts;
    rl->quorum = rl->n / 2 + 1;
    snprintf(rl->where, sizeof rl->where, "redlock (%zu nodes)", rl->n);
    /* Per-node timeout: far below the lease (a tenth, at least 250 ms),
     * at most the op timeout; ?node_timeout= sets it. */
    int64_t op = c->opts.op_timeout_ms > 0 ? c->opts.op_timeout_ms : 5000;
    int64_t nt = c->opts.lease_ms / 10;
    if (nt < 250)
        nt = 250;
    if (nt > op)
        nt = op;
    const char *param = dlock__url_param(&c->url, "node_timeout");
    if (param) {
        nt = dlock__parse_duration(param);
        if (nt < 1) {
            rl_close(rl);
            return dlock__err(DLOCK_EBADURL, "bad URL '%s': node_timeout=%s is not a duration "
                                             "(e.g. 50ms)", url, param);
        }
    }
    rl->node_timeout_ms = nt;
    sha1_hex(RAISE_SRC, rl->raise_sha);
    for (size_t i = 0; i < rl->n; i++) {
        void *s;
        int rc = dlock__redis_open_node(c, (int)i, &s);
        if (rc) {
            rl_close(rl);
            return rc;
        }
        rl->node[i] = s;
        struct redis_state *ns = s;
        if (ns->sync_replicas) {
            rl->n = i + 1;
            rl_close(rl);
            return dlock__err(DLOCK_EBADURL, "bad URL '%s': sync=N is for one master with its "
                                             "replicas, not Redlock's independent masters", url);
        }
        ns->connect_timeout_ms = ns->op_timeout_ms = nt;
        if (i > 0) /* one owner identity on every node */
            memcpy(ns->uuid, rl->node[0]->uuid, sizeof ns->uuid);
        for (int id = 0; id < S_COUNT; id++)
            sha1_hex(ns->src[id], ns->sha[id]);
    }
    /* Reach the nodes now (loading the scripts), so a URL nobody answers
     * fails here as a single node's does: a majority must answer. All at
     * once: dialed together, the SCRIPT LOADs in one exchange (a node
     * that does not answer gets a grace once a majority did). A node
     * down now is tried again by every request. */
    struct rconn *ks[RL_MAX_NODES], *sent[RL_MAX_NODES];
    int rcs[RL_MAX_NODES];
    char (*msgs)[DLOCK__MSG_MAX] = calloc(rl->n, sizeof *msgs);
    if (!msgs) {
        rl_close(rl);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    dlock__redis_pool_get_many(rl->node, rl->n, false, DLOCK__NEVER, rl->quorum, ks, rcs, msgs);
    size_t m = 0;
    for (size_t i = 0; i < rl->n; i++)
        if (!rcs[i] && !(rcs[i] = dlock__redis_scripts_append(rl->node[i], ks[i])))
            sent[m++] = ks[i];
        else if (ks[i]) {
            dlock__errmsg_save(msgs[i]);
            dlock__redis_pool_put(rl->node[i], ks[i], true);
            ks[i] = NULL;
        }
    if (m)
        dlock__redis_exchange_quorum(sent, m, sent[0]->until, "SCRIPT LOAD",
                                     rl->quorum < m ? rl->quorum : m);
    for (size_t i = 0; i < rl->n; i++) {
        if (!ks[i])
            continue;
        rcs[i] = ks[i]->broken ? dlock__err(DLOCK_ECONN, "%s: SCRIPT LOAD: %s", ks[i]->where,
                                            ks[i]->err)
                               : DLOCK_OK;
        rcs[i] = dlock__redis_scripts_take(rl->node[i], ks[i], rcs[i]);
        if (rcs[i])
            dlock__errmsg_save(msgs[i]);
    }
    size_t up = 0;
    int first_rc = DLOCK_OK;
    char first_msg[DLOCK__MSG_MAX] = "";
    for (size_t i = 0; i < rl->n; i++) {
        int rc = rcs[i] ? dlock__errmsg_restore(rcs[i], msgs[i]) : DLOCK_OK;
        if (!rc) {
            up++;
            continue;
        }
        if (rc != DLOCK_ECONN && rc != DLOCK_ETIMEDOUT && rc != DLOCK_EUNAVAIL) {
            free(msgs);
            rl_close(rl); /* a refusal (AUTH, a server error) is no outage */
            return rc;
        }
        if (!first_rc) {
            first_rc = rc;
            dlock__errmsg_save(first_msg);
        }
    }
    free(msgs);
    if (up < rl->quorum) {
        rl_close(rl);
        return dlock__err(DLOCK_ECONN, "%s: only %zu of %zu nodes answered, %zu needed (%s)",
                          url, up, c->url.nhosts, c->url.nhosts / 2 + 1, first_msg);
    }
    *state = rl;
    return DLOCK_OK;
}

/* ============================================================ elections */

/* Election NAME over Redlock is lock NAME taken on a majority (rl_acquire,
 * whose token is the leadership's) plus, on every node, the single-node
 * layout's leader hash dlock_leader:{NAME} (election.c): each node runs
 * the same write and read scripts. The leader writes its value on every
 * node at once; a node takes it only while the lock there is ours and the
 * node's token counter is the leadership's token (the acquisition raised
 * the granting majority's counters to it; a later acquisition there moves
 * it), so what a resigned or expired leader left behind is never read as
 * current. A write counts when a majority took it; fewer, and a proclaim
 * fails (DLOCK_ELOST when too few nodes can still be ours).
 *
 * An observer reads every node at once and believes a majority: the
 * leader is a holder (and token) that a majority of the nodes show with
 * its value written, and the value is the highest version among them;
 * nobody leads when a majority show the lock free. Any other picture (a
 * new leader writing its value, a split acquisition in flight, too few
 * nodes answering) is looked at again after a message on the leader
 * channel of any node or the lock's shortest remaining lease. Any
 * majority an observer reads meets the majority the leader wrote in at
 * least one node, so a value the leader's proclaim returned for is seen.
 * The soundness is Redlock's, no more: the leader's hold and token rely on
 * the nodes keeping their keys and counters (docs/protocol-redis.md,
 * "Redlock"). */

/* The per-node keys and script digests of election NAME's leader. */
struct rl_leader {
    struct leader_keys lk;
    char write_sha[41], read_sha[41];
};

static int rl_leader_make(struct redlock *rl, const char *name, struct rl_leader *ld)
{
    int rc = dlock__redis_leader_keys(rl->node[0], name, &ld->lk);
    if (!rc) {
        sha1_hex(dlock__redis_leader_write_src, ld->write_sha);
        sha1_hex(dlock__redis_leader_read_src, ld->read_sha);
    }
    return rc;
}

/* Write VALUE as leader H's on every node at once: DLOCK_OK when a
 * majority took it; DLOCK_ELOST when so many nodes refused (the lock is
 * no longer ours there) that no majority can; else DLOCK_EUNAVAIL naming
 * a node's failure. */
static int rl_write_value(void *state, struct dlock__hold *h, const char *value)
{
    struct redlock *rl = state;
    struct rl_leader ld;
    int rc = rl_leader_make(rl, h->name, &ld);
    if (rc)
        return rc;
    /* The leader numbers its writes, so the newest is the highest on any
     * node, whichever writes a node missed. */
    struct rl_hold *bd = h->bdata;
    char token[24], version[24];
    int tl = snprintf(token, sizeof token, "%llu", (unsigned long long)h->token);
    int vl = snprintf(version, sizeof version, "%llu", (unsigned long long)++bd->version);
    const struct lock_keys *k = &ld.lk.k;
    const char *args[] = {k->lock, ld.lk.value, ld.lk.chan, k->token, h->owner, token, value,
                          version};
    size_t lens[] = {k->lock_len, strlen(ld.lk.value), strlen(ld.lk.chan), k->token_len,
                     strlen(h->owner), (size_t)tl, strlen(value), (size_t)vl};
    struct rl_call calls[RL_MAX_NODES];
    for (size_t i = 0; i < rl->n; i++)
        calls[i] = (struct rl_call){.node = i, .src = dlock__redis_leader_write_src,
                                    .sha = ld.write_sha, .nkeys = 4, .nargs = 8, .args = args,
                                    .lens = lens};
    struct rl_round rd;
    round_run(rl, &rd, calls, rl->n, dlock__now_ms() + rl->node_timeout_ms, false,
              "write the leader's value", rl->n);
    size_t taken = 0, refused = 0;
    for (size_t i = 0; i < rl->n; i++) {
        const redisReply *r = calls[i].reply;
        if (r && r->type == REDIS_REPLY_INTEGER)
            r->integer == 1 ? taken++ : refused++;
        else if (r && r->type == REDIS_REPLY_ERROR)
            node_failed(&rd, i, dlock__redis_server_error(rl->node[i], r->str, "write"));
    }
    calls_free(calls, rl->n);
    if (taken >= rl->quorum)
        rc = DLOCK_OK;
    else if (refused > rl->n - rl->quorum)
        rc = dlock__err(DLOCK_ELOST, "%s: election '%s': the lock is no longer ours on %zu of %zu "
                                     "nodes (token %s)",
                        rl->where, h->name, refused, rl->n, token);
    else
        rc = dlock__err(DLOCK_EUNAVAIL, "%s: election '%s': the value was written on %zu of %zu "
                                        "nodes, %zu needed (%s)",
                        rl->where, h->name, taken, rl->n, rl->quorum, first_failure(&rd, rl->n));
    dlock__redis_leader_keys_free(&ld.lk);
    return rc;
}

static const struct dlock__redis_leader_ops rl_leader_ops = {rl_acquire, rl_release,
                                                             rl_write_value};

static int rl_elect_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
{
    return dlock__redis_campaign(state, h, w, &rl_leader_ops);
}

/* Publish on every node's leader channel of NAME (best effort: an
 * observer that misses it wakes at the lease's end). */
static void rl_leader_publish(struct redlock *rl, const char *name)
{
    static const char src[] = "redis.call('publish', KEYS[1], '1') return 1";
    struct rl_leader ld;
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    if (rl_leader_make(rl, name, &ld) == DLOCK_OK) {
        char sha[41];
        sha1_hex(src, sha);
        const char *args[] = {ld.lk.chan};
        size_t lens[] = {strlen(ld.lk.chan)};
        struct rl_call calls[RL_MAX_NODES];
        for (size_t i = 0; i < rl->n; i++)
            calls[i] = (struct rl_call){.node = i, .src = src, .sha = sha, .nkeys = 1,
                                        .nargs = 1, .args = args, .lens = lens};
        struct rl_round rd;
        round_run(rl, &rd, calls, rl->n, dlock__now_ms() + rl->node_timeout_ms, false,
                  "publish", rl->quorum);
        calls_free(calls, rl->n);
        dlock__redis_leader_keys_free(&ld.lk);
    }
    dlock__errmsg_restore(DLOCK_OK, msg);
}

static int rl_elect_release(void *state, struct dlock__hold *h)
{
    int rc = rl_release(state, h);
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    rl_leader_publish(state, h->name);
    return dlock__errmsg_restore(rc, msg);
}

static int rl_elect_proclaim(void *state, struct dlock__hold *h, const char *value)
{
    struct redlock *rl = state;
    return dlock__redis_proclaim(state, rl->c, h, value, &rl_leader_ops);
}

/* Whether two nodes show the same holder: the same id, but in the simple
 * layout without the value's last part, each node's own token. */
static bool same_holder(const struct redlock *rl, const char *a, const char *b)
{
    if (!rl->node[0]->simple)
        return strcmp(a, b) == 0;
    const char *ea = strrchr(a, ':'), *eb = strrchr(b, ':');
    size_t la = ea ? (size_t)(ea - a) : strlen(a), lb = eb ? (size_t)(eb - b) : strlen(b);
    return la == lb && memcmp(a, b, la) == 0;
}

/* One look at every node: OUT as a majority says it (*CONSISTENT false
 * when no majority says anything yet), *TTL the shortest remaining lease
 * of the lock among the nodes that hold it (-2: none). DLOCK_EUNAVAIL when
 * fewer than a majority answered. */
static int rl_look(struct redlock *rl, const char *name, struct rl_leader *ld, int64_t deadline,
                   struct dlock_leader *out, bool *consistent, int64_t *ttl)
{
    const struct lock_keys *k = &ld->lk.k;
    const char *args[] = {k->lock, ld->lk.value, k->token};
    size_t lens[] = {k->lock_len, strlen(ld->lk.value), k->token_len};
    struct rl_call calls[RL_MAX_NODES];
    for (size_t i = 0; i < rl->n; i++)
        calls[i] = (struct rl_call){.node = i, .src = dlock__redis_leader_read_src,
                                    .sha = ld->read_sha, .nkeys = 3, .nargs = 3, .args = args,
                                    .lens = lens};
    struct rl_round rd;
    char what[600];
    snprintf(what, sizeof what, "read the leader of election '%s'", name);
    int64_t until = dlock__time_left(deadline, rl->node_timeout_ms);
    round_run(rl, &rd, calls, rl->n, dlock__now_ms() + until, false, what, rl->n);
    struct dlock_leader seen[RL_MAX_NODES];
    bool ok[RL_MAX_NODES] = {false}, cons[RL_MAX_NODES] = {false};
    size_t answered = 0, free_nodes = 0;
    int rc = DLOCK_OK;
    *ttl = -2;
    for (size_t i = 0; i < rl->n; i++) {
        memset(&seen[i], 0, sizeof seen[i]);
        const redisReply *r = calls[i].reply;
        int64_t t = -2;
        int prc = !r                               ? rd.rc[i]
                  : r->type == REDIS_REPLY_ERROR ? dlock__redis_server_error(rl->node[i], r->str,
                                                                             what)
                       : dlock__redis_leader_parse(rl->node[i], r, what, &seen[i], &cons[i], &t);
        if (prc) {
            if (r)
                node_failed(&rd, i, prc);
            if (prc == DLOCK_ENOMEM)
                rc = prc;
            continue;
        }
        ok[i] = true;
        answered++;
        free_nodes += !seen[i].held && cons[i];
        if (t >= 0 && (*ttl < 0 || t < *ttl))
            *ttl = t;
    }
    calls_free(calls, rl->n);
    free(out->value);
    memset(out, 0, sizeof *out);
    *consistent = false;
    if (!rc && answered < rl->quorum)
        rc = dlock__err(DLOCK_EUNAVAIL, "%s: %s: %zu of %zu nodes answered, %zu needed (%s)",
                        rl->where, what, answered, rl->n, rl->quorum, first_failure(&rd, rl->n));
    if (!rc && free_nodes >= rl->quorum)
        *consistent = true; /* nobody leads */
    for (size_t i = 0; !rc && !*consistent && i < rl->n; i++) {
        if (!ok[i] || !seen[i].held)
            continue;
        size_t votes = 0, best = i;
        for (size_t j = 0; j < rl->n; j++)
            if (ok[j] && seen[j].held && seen[j].token == seen[i].token &&
                same_holder(rl, seen[j].id, seen[i].id)) {
                votes++;
                if (seen[j].version > seen[best].version)
                    best = j;
            }
        if (votes >= rl->quorum) {
            *out = seen[best];
            seen[best].value = NULL; /* out's now */
            *consistent = true;
        }
    }
    for (size_t i = 0; i < rl->n; i++)
        free(seen[i].value);
    return rc;
}

static int rl_elect_observe(void *state, const char *name, const struct dlock_leader *known,
                            struct dlock__wait *w, struct dlock_leader *out)
{
    struct redlock *rl = state;
    struct rl_leader ld;
    int rc = rl_leader_make(rl, name, &ld);
    if (rc)
        return rc;
    size_t chan_len = strlen(ld.lk.chan), joined = 0;
    for (;;) {
        unsigned seq = dlock__wait_seq(w);
        bool consistent = false;
        int64_t ttl = -2;
        rc = rl_look(rl, name, &ld, dlock__wait_deadline(w), out, &consistent, &ttl);
        if (rc)
            break;
        if (dlock__observe_done(known, out, consistent, w, &rc))
            break;
        /* Every node's leader channel; a subscription's confirmation
         * wakes us, and then we look again. */
        for (; joined < rl->n; joined++)
            if ((rc = dlock__redis_hub_join(rl->node[joined], ld.lk.chan, chan_len, w)))
                break;
        if (rc)
            break;
        /* Until a message, or the shortest remaining lease (an expiry
         * publishes nothing); none held: the node timeout. */
        int64_t bound = ttl >= 0 ? ttl : rl->node_timeout_ms;
        rc = dlock__redis_wait_sleep(w, seq, bound, rl->node_timeout_ms, NULL, DLOCK_EUNAVAIL,
                                     rl->where, ld.lk.k.lock);
        if (rc)
            break;
        for (size_t i = 0; i < joined; i++)
            dlock__redis_hub_ack(rl->node[i], ld.lk.chan, chan_len, w);
    }
    for (size_t i = 0; i < joined; i++)
        dlock__redis_hub_leave(rl->node[i], ld.lk.chan, chan_len, w, true);
    dlock__redis_leader_keys_free(&ld.lk);
    return rc;
}

static const char *const redlock_schemes[] = {"redlock", "redlocks", NULL};

const struct dlock__backend dlock__backend_redlock = {
    .version = DLOCK__BACKEND_VERSION,
    .name = "redlock",
    .schemes = redlock_schemes,
    .caps = DLOCK__CAP_FENCING | DLOCK__CAP_SHARED | DLOCK__CAP_LEASES | DLOCK__CAP_LIST |
            DLOCK__CAP_FORCE | DLOCK__CAP_FIXED_LEASE | DLOCK__CAP_ELECTION,
    .default_port = REDIS_DEFAULT_PORT,
    /* docs/protocol-redis.md, "Redlock": no semaphores */
    .no_semaphores_why = "permits counted per node over majorities do not bound the holders once "
                         "there are 2 or more (3 nodes, 2 permits: holders on {a,b}, {b,c} and "
                         "{a,c} each took a majority, every node counts 2, and 3 hold at once); "
                         "use etcd:// or zk:// for a semaphore across servers",
    .open = rl_open,
    .close = rl_close,
    .acquire = rl_acquire,
    .release = rl_release,
    .downgrade = rl_downgrade,
    .renew = rl_renew,
    .inspect = rl_inspect,
    .force_release = rl_force_release,
    .list = rl_list,
    .elect_acquire = rl_elect_acquire,
    .elect_release = rl_elect_release,
    .elect_proclaim = rl_elect_proclaim,
    .elect_observe = rl_elect_observe,
};
