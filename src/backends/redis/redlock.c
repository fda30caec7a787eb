/* redlock.c -- Redlock: one lock over N independent Redis masters
 * (redlock://h1,h2,h3), the algorithm of the Redis documentation, with a
 * fencing token that only grows.
 *
 * Why it is shaped so. Each node is a whole single-node state of this
 * backend (backend.c's open_node: its pool, its subscriber hub, its queue
 * of owed cancels) running the same Lua scripts in the same layouts, so a fleet
 * of node-redlock or redsync clients (layout=simple) or of Redisson
 * clients on the same nodes excludes dlock and the other way round. What
 * Redlock adds is the quorum, here: every request goes to all N nodes at
 * once in one round (redlock_nodes.c) bounded by the node timeout, far
 * below the lease, and a quorum decides. An acquisition counts when
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
 *
 * This file is the lock's acquire (the quorum, the token and its raise),
 * the client's open and close and the backend table; what is done with a
 * hold once granted (release, downgrade, renew) is in redlock_hold.c,
 * elections over the majority in redlock_election.c (redlock.h says what
 * they share).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redlock.h"

/* The random pause after an attempt that split the nodes with another
 * contender, before trying again. */
#define RL_SPLIT_MIN_MS 2
#define RL_SPLIT_MAX_MS 100


/* ============================================================== acquire */

static void owner_of(struct redlock *rl, struct dlock__hold *h)
{
    snprintf(h->owner, sizeof h->owner, "%s:%ld", rl->node[0]->uuid, h->tid);
}

/* The value a node holds for H in the simple layout ("<owner>:<token>"),
 * or the owner field in Redisson's. */
int dlock__redlock_node_value(struct redlock *rl, const struct dlock__hold *h, uint64_t token,
                              char *buf, size_t size)
{
    return rl->node[0]->simple ? snprintf(buf, size, "%s:%llu", h->owner, (unsigned long long)token)
                               : snprintf(buf, size, "%s", h->owner);
}

/* The acquire script call of attempt A on node I. */
static struct rl_call acquire_call(struct redlock *rl, size_t i, struct acquire_args *a)
{
    struct redis_state *s = rl->node[i];
    return (struct rl_call){.node = i, .src = s->src[S_ACQUIRE], .sha = s->sha[S_ACQUIRE],
                            .nkeys = 5, .nargs = 12, .args = a->v, .lens = a->len};
}

/* One attempt's nodes still owed a cancel, for ask_owing_nodes(): the
 * attempt A, the nodes in OWES, the calls made so far CALLS[0..*N) and
 * their round RD (both grown there), the attempt's DEADLINE; out: the
 * code and message of each node that sits out (0: asked). */
struct owing_nodes {
    struct acquire_args *a;
    const bool *owes;
    struct rl_call *calls;
    size_t *n;
    struct rl_round *rd;
    int64_t deadline;
    struct {
        int rc[RL_MAX_NODES];
        char msg[RL_MAX_NODES][300];
    } out;
};

/* The nodes in OW->owes, still owed the cancel of an earlier lost
 * acquire of H's owner, after the others answered attempt OW->a in
 * OW->rd (OW->calls[0..*OW->n)): when those already granted a majority,
 * or refused so many that none is possible, the owing nodes sit the
 * attempt out (the keeper sends their cancels) -- a stopped node no
 * longer holds every attempt for the wait on its cancel (250 ms each);
 * otherwise each gets its cancel first, within 250 ms (a node that
 * cannot take it, stopped, sits out), and the attempt, in a second
 * round, appended to the calls and merged into the round. A node that
 * sits out gets its code and message in OW->out. */
static void ask_owing_nodes(struct redlock *rl, struct dlock__hold *h, struct owing_nodes *ow)
{
    struct rl_call *calls = ow->calls;
    size_t *n = ow->n;
    struct rl_round *rd = ow->rd;
    int64_t deadline = ow->deadline;
    int *owed_rc = ow->out.rc;
    char(*owed)[300] = ow->out.msg;
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    size_t granted = 0, refused = 0, m = 0;
    for (size_t j = 0; j < *n; j++) {
        const redisReply *r = calls[j].reply;
        if (r && r->type == REDIS_REPLY_INTEGER)
            r->integer >= 0 ? granted++ : refused++;
    }
    bool settled = granted >= rl->quorum || refused > rl->n - rl->quorum;
    struct rl_call *more = calls + *n;
    for (size_t i = 0; i < rl->n; i++) {
        if (!ow->owes[i])
            continue;
        if (settled) {
            owed_rc[i] = dlock__err(DLOCK_ECONN, "%s: not asked: still owed the cancel of an "
                                                 "earlier lost acquire of '%s', and the others "
                                                 "answered without it",
                                    rl->node[i]->where, h->name);
        } else {
            int64_t owed_by =
                dlock__now_ms() + (rl->node_timeout_ms < 250 ? rl->node_timeout_ms : 250);
            owed_rc[i] = dlock__redis_cancel_owed(rl->node[i], h,
                                                  owed_by < deadline || !deadline ? owed_by
                                                                                  : deadline,
                                                  NULL);
        }
        if (owed_rc[i])
            snprintf(owed[i], sizeof owed[i], "%s", dlock_errmsg());
        else
            more[m++] = acquire_call(rl, i, ow->a);
    }
    dlock__errmsg_restore(DLOCK_OK, msg);
    if (!m)
        return;
    struct rl_round rb;
    dlock__redlock_round(rl, &rb, more, m, deadline, false, "acquire",
                         rl->quorum > granted ? rl->quorum - granted : 1);
    for (size_t x = 0; x < m; x++) {
        size_t i = more[x].node;
        rd->rc[i] = rb.rc[i];
        rd->written[i] = rb.written[i];
        memcpy(rd->err[i], rb.err[i], sizeof rd->err[i]);
    }
    *n += m;
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
    bool owes[RL_MAX_NODES] = {false};
    size_t n = 0, nowing = 0;
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    for (size_t i = 0; i < rl->n; i++) {
        /* A node still owed the cancel of this owner's earlier lost
         * acquire of the name (cancel.c) must get it before a new acquire
         * (or that cancel, arriving late, would end the new hold there):
         * asked after the others, below. A deadline of now sends nothing,
         * it only says whether one is owed. */
        if (dlock__redis_cancel_owed(rl->node[i], h, dlock__now_ms(), NULL)) {
            owes[i] = true;
            nowing++;
            continue;
        }
        calls[n++] = acquire_call(rl, i, &a);
    }
    dlock__errmsg_restore(DLOCK_OK, msg);
    int64_t start = dlock__now_ms();
    dlock__redlock_round(rl, &rd, calls, n, deadline, false, "acquire",
                         rl->quorum > nowing ? rl->quorum - nowing : 1);
    struct owing_nodes ow = {
        .a = &a, .owes = owes, .calls = calls, .n = &n, .rd = &rd, .deadline = deadline};
    if (nowing)
        ask_owing_nodes(rl, h, &ow);
    for (size_t i = 0; i < rl->n; i++)
        if (ow.out.rc[i]) {
            rd.rc[i] = ow.out.rc[i];
            memcpy(rd.err[i], ow.out.msg[i], sizeof rd.err[i]);
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
            dlock__redlock_node_failed(&rd, i, rc);
            if (!hard) {
                hard = rc;
                dlock__errmsg_save(hard_msg);
            }
            continue;
        }
        if (!rc) {
            bd->state[i] = NODE_YES;
            bd->token[i] = bd->counter[i] = v;
            if (h->mode == DLOCK_SHARED) /* the acquire wrote it in our timeout key */
                bd->read_token[i] = v;
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
    dlock__redlock_calls_free(calls, n);
    for (size_t i = 0; i < rl->n; i++)
        failed += rd.rc[i] != 0;

    /* Raise the granting nodes' counters that are below the token, so a
     * majority holds a counter >= it before it is handed out. */
    size_t at_top = 0;
    for (size_t i = 0; i < rl->n; i++)
        at_top += bd->state[i] == NODE_YES && bd->token[i] == top;
    if (granted >= rl->quorum && at_top < rl->quorum) {
        char stop[24], vals[RL_MAX_NODES][160], seen[RL_MAX_NODES][24];
        int tl = snprintf(stop, sizeof stop, "%llu", (unsigned long long)top);
        /* a reader's timeout key ("" for a writer) */
        size_t tsize = k->tbase_len + sizeof h->owner + 32;
        char *timeout = malloc(tsize);
        int xl = timeout ? dlock__redis_rw_timeout_key(k, h, timeout, tsize) : 0;
        if (!timeout && !hard) { /* no raise: what was granted is given back below */
            hard = dlock__err(DLOCK_ENOMEM, "out of memory");
            dlock__errmsg_save(hard_msg);
        }
        const char *rargs[RL_MAX_NODES][6];
        size_t rlens[RL_MAX_NODES][6];
        size_t m = 0;
        for (size_t i = 0; timeout && i < rl->n; i++)
            if (bd->state[i] == NODE_YES && bd->token[i] < top) {
                int vl = dlock__redlock_node_value(rl, h, bd->token[i], vals[i], sizeof vals[i]);
                int sl = snprintf(seen[i], sizeof seen[i], "%llu", (unsigned long long)bd->token[i]);
                const char *ra[] = {k->token, k->lock, timeout, stop, vals[i], seen[i]};
                size_t rl_len[] = {k->token_len, k->lock_len, (size_t)xl,
                                   (size_t)tl,   (size_t)vl,  (size_t)sl};
                memcpy(rargs[i], ra, sizeof ra);
                memcpy(rlens[i], rl_len, sizeof rl_len);
                bd->asked[i] = top;
                calls[m++] = (struct rl_call){.node = i, .src = dlock__redis_raise_script.src,
                                              .sha = dlock__redis_raise_script.sha,
                                              .nkeys = 3, .nargs = 6, .args = rargs[i],
                                              .lens = rlens[i]};
            }
        struct rl_round rr;
        if (m)
            dlock__redlock_round(rl, &rr, calls, m, deadline, false, "raise the token counter", m);
        for (size_t j = 0; j < m; j++)
            if (calls[j].reply && calls[j].reply->type == REDIS_REPLY_INTEGER &&
                calls[j].reply->integer == 1) {
                at_top++;
                bd->counter[calls[j].node] = top;
            }
        dlock__redlock_calls_free(calls, m);
        free(timeout);
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
                 rl->where, h->name, granted, rl->n, at_top, rl->quorum,
                 dlock__redlock_first_failure(&rd, rl->n));
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
                 rl->where, h->name, rl->n - failed, rl->n, rl->quorum,
                 dlock__redlock_first_failure(&rd, rl->n));
    }
    /* A split: nodes were granted to us, or those held by others cannot
     * make a majority (another contender's attempt in flight). Nobody's
     * release message may come, so the next try is after a random pause,
     * not at the holder's lease. */
    *split = granted > 0 || busy + failed < rl->quorum;
    if (granted > 0) {
        /* within what is left of the wait, as the attempt was: a granting
         * node that does not answer by then is owed a cancel of this
         * attempt (cancel.c; the keeper sends it, and our next attempt
         * sends it first) */
        struct rl_round rr;
        dlock__redlock_release_nodes(rl, h, bd, k, deadline, NULL, NULL, &rr);
        for (size_t i = 0; i < rl->n; i++)
            if (bd->state[i] == NODE_YES)
                dlock__redis_cancel_lost_acquire(rl->node[i], h, reqno, lease);
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

/* A writer that recorded itself as waiting gives up, its wait ending at
 * DEADLINE: its record goes from every node at once within what is left
 * of the wait (once a majority answered, the others get a grace only),
 * and a node that did not answer by then -- every node, when nothing is
 * left (a timeout, a cancel: dlock__redis_give_up_deadline) -- is owed it
 * by the keeper (rwlock.c; best effort: the record lapses anyway). So the
 * caller's wait_ms holds, and a cancel returns at once, when nodes stall.
 * Keeps the acquire's own message. */
static void unwait_nodes(struct redlock *rl, const struct dlock__hold *h, const struct lock_keys *k,
                         int64_t deadline)
{
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    const char *args[] = {k->writers, k->rwchan, h->owner};
    size_t lens[] = {k->writers_len, k->rwchan_len, strlen(h->owner)};
    struct rl_call calls[RL_MAX_NODES];
    size_t n = 0;
    if (dlock__time_left(deadline, rl->node_timeout_ms) > 0) {
        for (; n < rl->n; n++) {
            struct redis_state *s = rl->node[n];
            calls[n] = (struct rl_call){.node = n, .src = s->src[S_RW_UNWAIT],
                                        .sha = s->sha[S_RW_UNWAIT], .nkeys = 2, .nargs = 3,
                                        .args = args, .lens = lens};
        }
        struct rl_round rd;
        dlock__redlock_round(rl, &rd, calls, n, deadline, false, "give up waiting", rl->quorum);
    }
    /* a server's error reply would answer the same again: owed only
     * what got no reply */
    for (size_t i = 0; i < rl->n; i++)
        if (i >= n || !calls[i].reply)
            dlock__redis_rw_unwait_owe(rl->node[i], h);
    dlock__redlock_calls_free(calls, n);
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

int dlock__redlock_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
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
        /* let the readers behind us in */
        unwait_nodes(rl, h, &k, dlock__redis_give_up_deadline(w, rc));
out:
    if (rc == DLOCK_OK)
        h->bdata = bd;
    else
        free(bd);
    dlock__redis_keys_free(&k);
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

static int rl_open(struct dlock_client *c, void **state)
{
    const char *url = c->url.redacted;
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
            memcpy(ns->sha[id], dlock__redis_script(id, ns->simple)->sha, sizeof ns->sha[id]);
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

static const char *const redlock_schemes[] = {"redlock", "redlocks", NULL};

static const struct dlock__lock_ops redlock_lock_ops = {
    .acquire = dlock__redlock_acquire,
    .release = dlock__redlock_release,
    .release_within = dlock__redlock_release_within,
    .downgrade = dlock__redlock_downgrade,
};

static const struct dlock__elect_ops redlock_elect_ops = {
    .acquire = dlock__redlock_elect_acquire,
    .release = dlock__redlock_elect_release,
    .proclaim = dlock__redlock_elect_proclaim,
    .observe = dlock__redlock_elect_observe,
};

static const struct dlock__admin_ops redlock_admin_ops = {
    .inspect = dlock__redlock_inspect,
    .check = dlock__redlock_check,
    .force_release = dlock__redlock_force_release,
    .list = dlock__redlock_list,
};

const struct dlock__backend dlock__backend_redlock = {
    .name = "redlock",
    .schemes = redlock_schemes,
    .caps = DLOCK__CAP_SHARED | DLOCK__CAP_LEASES | DLOCK__CAP_FIXED_LEASE,
    .default_port = REDIS_DEFAULT_PORT,
    .open = rl_open,
    .close = rl_close,
    .renew = dlock__redlock_renew,
    .locks = &redlock_lock_ops,
    .elections = &redlock_elect_ops,
    .admin = &redlock_admin_ops,
    /* docs/protocol-redis.md, "Redlock": no semaphores */
    .no_semaphores_why = "permits counted per node over majorities do not bound the holders once "
                         "there are 2 or more (3 nodes, 2 permits: holders on {a,b}, {b,c} and "
                         "{a,c} each took a majority, every node counts 2, and 3 hold at once); "
                         "use etcd:// or zk:// for a semaphore across servers",
    /* docs/protocol-redis.md, "Lock values" */
    .no_values_why = "no one request can check a hold on a majority of nodes, and a value "
                     "written on some of them only would read differently from each; use "
                     "redis://, etcd:// or zk:// for a lock's value",
    /* docs/protocol-redis.md, "Guarded writes" */
    .no_guarded_why = "no one request can check a hold on a majority of nodes, so a key "
                      "could be written by a holder that lost the lock; use redis://, etcd:// "
                      "or zk:// for guarded writes",
    /* docs/backends.md, "contended callback" */
    .no_contend_why = "redlock: a hold over a majority of nodes has no one channel where its "
                      "waiters announce themselves; use redis://, etcd:// or zk://",
};
