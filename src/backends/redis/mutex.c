/* mutex.c -- the Redis backend's lock recipe: a Redisson-compatible
 * reentrant, fenced mutex.
 *
 * Why it is shaped so. Most users already run Redis and trust Redisson's
 * RLock/RFencedLock, so the default layout is Redisson's own wire format
 * (docs/protocol-redis.md): a HASH named after the lock whose field
 * "<client-uuid>:<thread-id>" holds the hold count, a STRING
 * "redisson_lock_token:{name}" INCRed on every new acquisition (the fencing
 * token), and a release message "0" on "redisson_lock__channel:{name}".
 * A Redisson client and dlock on the same name therefore exclude each other
 * and wake each other's waiters. Shared holds are Redisson's RReadWriteLock
 * read locks (rwlock.c; an exclusive hold also writes the hash's "mode"
 * field, so that layout sees it). `?layout=simple` speaks the classic
 * "SET name value NX PX" recipe instead (redis-py, node-redlock, redsync).
 *
 * Every operation is one script (scripts.c), written so that sending one
 * twice does no harm: a retried acquire finds its own field and replaces it
 * (count 1, a new token: an own field found by an acquire is a leftover,
 * of a lost reply or of a release that never reached the server, and is
 * never adopted with its old token); a retried release recognises "already released by us" from
 * the token key. That is how a reply lost to a timeout or a reconnect never
 * double-counts, leaks or misreports a hold. A contended acquire sleeps on
 * the subscriber hub (hub.c) until a release message or the holder's lease.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis.h"

/* Keys per renewal script call: 10,000 holds = 10 calls, one pipeline. */
#define RENEW_BATCH 1000

/* ================================================================= locks */

void dlock__redis_owner_of(struct redis_state *s, struct dlock__hold *h)
{
    snprintf(h->owner, sizeof h->owner, "%s:%ld", s->uuid, h->tid);
}

/* ?sync=N: an acquisition of H that only ACKED replicas acknowledged is
 * undone (a failover to an unsynced replica could otherwise turn it into
 * a second owner) and fails. The undo is the cancel of the owner's
 * requests up to LAST (cancel.c: its field taken away, the lock's waiters
 * told): owed first, then sent within what is left of the call's budget
 * (DEADLINE); when that is gone or the send fails, the core's cleanup
 * queue still sends it (the keeper), and the owner's next acquire of the
 * name sends it first itself. */
static int undo_unsynced(struct redis_state *s, struct dlock__hold *h, int acked, int64_t deadline,
                         uint64_t last)
{
    char why[DLOCK__MSG_MAX] = "";
    int undo = dlock__redis_undo_acquire(s, h, last, deadline);
    if (undo)
        dlock__errmsg_save(why);
    return dlock__err(DLOCK_EUNAVAIL, "%s: lock '%s' was acquired on the master but only %d of %d "
                                      "replicas acknowledged it within %lld ms (sync=%d); %s%s%s",
                      s->where, h->name, acked, s->sync_replicas, (long long)s->sync_timeout_ms,
                      s->sync_replicas,
                      undo ? "the undo did not fit in the call's bound and is queued, the keeper "
                             "sends it ("
                           : "undone",
                      undo ? why : "", undo ? ")" : "");
}

/* An acquire script's answer for a name in its lock-delay: -DELAY_REPLY
 * - MS, MS the ms left (lib_acquire.lua's DELAY_REPLY, -2^50). */
#define DELAY_REPLY 1125899906842624LL

int dlock__redis_acquire_result(struct redis_state *s, const redisReply *r,
                                const struct lock_keys *k, uint64_t *token, int64_t *ttl_ms)
{
    long long value;
    int rc = dlock__redis_status_reply(s, r, k, &value);
    if (rc)
        return rc;
    if (value > 0) {
        *token = (uint64_t)value;
        return DLOCK_OK;
    }
    if (value == 0) /* tokens start at 1 (INCR) or the server's clock */
        return dlock__err(DLOCK_EPROTO, "%s: acquire '%s': the server answered a grant with "
                                        "token 0, a reply dlock's script never gives",
                          s->where, k->lock);
    if (value == -1) /* only a request canceled before it ran gets this */
        return dlock__err(DLOCK_EPROTO, "%s: acquire '%s': the server found the request canceled",
                          s->where, k->lock);
    if (value <= -DELAY_REPLY) {
        *ttl_ms = -DELAY_REPLY - value;
        return dlock__err(DLOCK_EBUSY, "%s: lock '%s' is free but in its lock-delay for %lld ms "
                                       "more (%s: its last hold ended without a clean release)",
                          s->where, k->lock, (long long)*ttl_ms, k->delay);
    }
    *ttl_ms = -3 - value; /* -1: a foreign lock without expiry */
    return dlock__err(DLOCK_EBUSY, "%s: lock '%s' is held by another owner (%lld ms of lease left)",
                      s->where, k->lock, (long long)*ttl_ms);
}

/* One acquire attempt within DEADLINE (the wait's): DLOCK_OK (h->token
 * set), DLOCK_EBUSY with *TTL_MS the holder's remaining lease, or a
 * failure. A request whose reply is lost is sent once more with the next
 * request number, which cancels the first one on the server; when the
 * second is lost too, cancel_acquire() cancels both. STAGE tells a writer's
 * script whether it waits ("0" try once, "1" first try of a wait, "2" a
 * later one): a waiting writer keeps new readers out. */
void dlock__redis_acquire_args(struct acquire_args *a, bool simple, const struct dlock__hold *h,
                               const struct lock_keys *k, int64_t lease_ms, uint64_t number,
                               uint64_t retries, const char *stage)
{
    const char *mode = h->mode == DLOCK_SHARED ? "read" : "write";
    int pl = snprintf(a->lease, sizeof a->lease, "%lld", (long long)lease_ms);
    int ol = snprintf(a->prefix, sizeof a->prefix, simple ? "%s:" : "%s", h->owner);
    int nl = snprintf(a->number, sizeof a->number, "%llu", (unsigned long long)number);
    int rl = snprintf(a->retries, sizeof a->retries, "%llu", (unsigned long long)retries);
    int ll = snprintf(a->life, sizeof a->life, "%lld",
                      (long long)dlock__redis_cancel_life_ms(lease_ms));
    const char *v[] = {k->lock,  k->token,  k->canceled, k->writers, k->tbase, a->lease,
                       a->prefix, a->number, a->retries, a->life,    mode,     stage};
    size_t len[] = {k->lock_len, k->token_len, k->canceled_len, k->writers_len,
                    k->tbase_len, (size_t)pl,  (size_t)ol,      (size_t)nl,
                    (size_t)rl,   (size_t)ll,  strlen(mode),    strlen(stage)};
    memcpy(a->v, v, sizeof v);
    memcpy(a->len, len, sizeof len);
}

/* An acquire script's call A on one server, with the lock-delay's marker
 * key after its five keys and H's delay after its arguments (the
 * client's lock_delay for an exclusive hold, '0' otherwise): Redlock
 * calls the script without either. */
struct delay_args {
    char delay[24];
    const char *v[14];
    size_t len[14];
};

static void with_delay(struct delay_args *d, const struct acquire_args *a,
                       const struct redis_state *s, const struct dlock__hold *h,
                       const struct lock_keys *k)
{
    int64_t ms = h->mode == DLOCK_EXCLUSIVE ? s->c->opts.lock_delay_ms : 0;
    int dl = snprintf(d->delay, sizeof d->delay, "%lld", (long long)ms);
    memcpy(d->v, a->v, 5 * sizeof *d->v);
    memcpy(d->len, a->len, 5 * sizeof *d->len);
    d->v[5] = k->delay;
    d->len[5] = k->delay_len;
    memcpy(d->v + 6, a->v + 5, 7 * sizeof *d->v);
    memcpy(d->len + 6, a->len + 5, 7 * sizeof *d->len);
    d->v[13] = d->delay;
    d->len[13] = (size_t)dl;
}

int dlock__redis_try_acquire(struct redis_state *s, struct dlock__hold *h, const struct lock_keys *k,
                             int64_t lease_ms, struct dlock__wait *w, const char *stage,
                             int64_t *ttl_ms)
{
    /* the cancel owed and the acquire share one budget */
    int64_t deadline = dlock__time_budget(dlock__wait_deadline(w), s->op_timeout_ms);
    int rc = dlock__redis_cancel_owed(s, h, deadline, w);
    if (rc)
        return rc;
    uint64_t n = __atomic_add_fetch(&s->requests, 2, __ATOMIC_RELAXED) - 1; /* n and n + 1 */
    struct acquire_args first, retry;
    dlock__redis_acquire_args(&first, s->simple, h, k, lease_ms, n, 0, stage);
    dlock__redis_acquire_args(&retry, s->simple, h, k, lease_ms, n + 1, n, stage);
    struct delay_args d1, d2;
    with_delay(&d1, &first, s, h, k);
    with_delay(&d2, &retry, s, h, k);
    struct redis_request rq = {.script = S_ACQUIRE, .nkeys = 6, .nargs = 14, .args = d1.v,
                               .lens = d1.len, .retry_args = d2.v, .retry_lens = d2.len,
                               .what = "acquire", .wait = w, .deadline = deadline};
    rc = dlock__redis_eval(s, &rq);
    if ((rc == DLOCK_ECONN || rc == DLOCK_ECANCELED) && rq.out.reached)
        dlock__redis_cancel_lost_acquire(s, h, n + 1, lease_ms);
    if (rc) {
        if (rc == DLOCK_EWRONGTYPE) {
            char why[DLOCK__MSG_MAX];
            dlock__errmsg_save(why);
            return dlock__err(rc, "%s: WRONGTYPE: key '%s' or its token key '%s' holds a value "
                                  "that is not a dlock lock; left untouched (%s)",
                              s->where, k->lock, k->token, why);
        }
        return rc;
    }
    return dlock__redis_acquire_reply(s, h, k, &rq, n + 1, ttl_ms);
}

int dlock__redis_acquire_reply(struct redis_state *s, struct dlock__hold *h,
                               const struct lock_keys *k, struct redis_request *rq, uint64_t last,
                               int64_t *ttl_ms)
{
    uint64_t token = 0;
    int acked = rq->out.acked;
    int rc = dlock__redis_acquire_result(s, rq->out.reply, k, &token, ttl_ms);
    if (rc == DLOCK_EBUSY && rq->out.reply->type == REDIS_REPLY_INTEGER &&
        rq->out.reply->integer <= -DELAY_REPLY) /* free, in its lock-delay */
        dlock__wait_in_delay(rq->wait, *ttl_ms);
    if (!rc && acked >= 0 && acked < s->sync_replicas) {
        h->token = token;
        rc = undo_unsynced(s, h, acked, rq->deadline, last);
    } else if (!rc) {
        h->token = token;
        dlock__hold_confirmed(s->c, h, rq->out.sent_ms);
        dlock__redis_sentinel_confirmed(s, h);
    }
    freeReplyObject(rq->out.reply);
    rq->out.reply = NULL;
    return rc;
}

/* RC of a try of wait W (on KEY) whose request the wait's own end cut
 * short (DLOCK_ECONN, no time left): a wait that ran out, not an outage
 * (a slow reply under load): DLOCK_ETIMEDOUT, the loss in the message.
 * Any other RC as it is. */
static int cut_by_the_wait(struct redis_state *s, struct dlock__wait *w, const char *key, int rc)
{
    if (rc != DLOCK_ECONN || dlock__wait_try_once(w) ||
        dlock__time_left(dlock__wait_deadline(w), 1) != 0)
        return rc;
    char why[DLOCK__MSG_MAX];
    dlock__errmsg_save(why);
    return dlock__err(DLOCK_ETIMEDOUT, "%s: timed out waiting for lock '%s' (%s)", s->where, key,
                      why);
}

static int acquire_lock(struct redis_state *s, struct dlock__hold *h, struct dlock__wait *w)
{
    struct lock_keys k;
    if (dlock__redis_fair(s, h)) /* waiters in arrival order (fair.c) */
        return dlock__redis_fair_acquire(s, h, w);
    int rc = dlock__redis_rw_check_layout(s, h);
    if (rc || (rc = dlock__redis_keys_make(s, h->name, &k)))
        return rc;
    int64_t lease = h->lease_ms;
    int64_t ttl = 0;

    rc = dlock__redis_try_acquire(s, h, &k, lease, w, dlock__wait_try_once(w) ? "0" : "1", &ttl);
    rc = cut_by_the_wait(s, w, k.lock, rc);
    if ((rc == DLOCK_ETIMEDOUT || rc == DLOCK_ECANCELED) && !dlock__wait_try_once(w))
        goto unwait; /* a first try cut short may have recorded a waiting writer */
    if (rc != DLOCK_EBUSY || dlock__wait_try_once(w))
        goto out;
    dlock__redis_contend_announce(s, h, &k, w); /* to a holder that listens (contend.c) */

    /* Contended: subscribe (shared connection), then try, sleep until a
     * release message or the holder's remaining lease, try again. */
    rc = dlock__redis_rw_listen(s, h, &k, w); /* the channels of H's releases (rwlock.c) */
    if (rc)
        goto unwait;
    /* A connection lost while waiting (server restart, network blip) is
     * retried with backoff until the wait's deadline: the waiter already
     * reached the server once, so the outage is transient until proven
     * otherwise. The message of the last failure is kept for the end. */
    struct dlock__redis_outage outage = DLOCK__REDIS_OUTAGE_INIT;
    for (bool first = true;; first = false) {
        unsigned seq = dlock__wait_seq(w);
        /* Before the subscription is confirmed a release could be missed,
         * so the first sleep lasts until the confirmation wakes us. */
        if (!first || dlock__redis_rw_listening(s, h, &k)) {
            dlock__redis_rw_heard(s, h, &k, w);
            rc = dlock__redis_try_acquire(s, h, &k, lease, w, "2", &ttl);
            if (rc == DLOCK_EBUSY) /* still waiting: a new holder may listen */
                dlock__redis_contend_announce(s, h, &k, w);
            if (rc == DLOCK_ECONN && !outage.ms &&
                (rc = cut_by_the_wait(s, w, k.lock, rc)) == DLOCK_ETIMEDOUT)
                break;
            /* EUNAVAIL is transient too: a failover under way (READONLY,
             * a sentinel's stale answer), LOADING, too few replicas */
            if (!dlock__redis_outage_note(&outage, rc, true))
                break;
        }
        rc = dlock__redis_wait_sleep(w, seq, ttl, lease, &outage, DLOCK_ECONN, s->where, k.lock);
        if (rc != DLOCK_OK)
            break;
    }
    dlock__redis_rw_unlisten(s, h, &k, w, rc == DLOCK_OK);
unwait:
    if ((rc == DLOCK_ETIMEDOUT || rc == DLOCK_ECANCELED) && h->mode == DLOCK_EXCLUSIVE)
        /* our waiting writer's record goes: the readers behind us in */
        dlock__redis_rw_unwait(s, h, dlock__redis_give_up_deadline(w, rc));
out:
    dlock__redis_keys_free(&k);
    return rc;
}

int dlock__redis_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
{
    struct redis_state *s = state;
    dlock__redis_owner_of(s, h);
    int rc = acquire_lock(s, h, w);
    if (rc == DLOCK_OK) /* where the new holder runs, for inspect (record.c) */
        dlock__redis_record_touch(s, h->lease_ms, DLOCK__NEVER);
    return rc;
}

int dlock__redis_release_reply(struct redis_state *s, const redisReply *r, const char *name,
                               const struct lock_keys *k, uint64_t token, bool retried)
{
    long long status;
    const char *type_name;
    int rc = dlock__redis_script_reply(s, r, &status, &type_name);
    if (rc)
        return rc;
    if (type_name)
        return dlock__err(DLOCK_ELOST, "%s: lock '%s' was lost: key '%s' now holds a %s", s->where,
                          name, k->lock, type_name);
    if (status == 1 || (status == 2 && retried))
        return DLOCK_OK;
    return dlock__err(DLOCK_ELOST, "%s: lock '%s' was lost: key '%s' is %s (our token was %llu)",
                      s->where, name, k->lock,
                      status == 2 ? "free, its lease had expired"
                                  : "held by another owner or expired",
                      (unsigned long long)token);
}

/* Give H up on the server, an exclusive hold's script bounded by
 * DEADLINE (DLOCK__NEVER: the op timeout). */
static int release_lock(struct redis_state *s, struct dlock__hold *h, int64_t deadline)
{
    if (h->mode == DLOCK_SHARED)
        return dlock__redis_rw_release(s, h);
    if (dlock__redis_fair(s, h))
        return dlock__redis_fair_release(s, h);
    struct lock_keys k;
    int rc = dlock__redis_keys_make(s, h->name, &k);
    if (rc)
        return rc;
    char token[24], value[160];
    int tl = snprintf(token, sizeof token, "%llu", (unsigned long long)h->token);
    int vl = s->simple ? snprintf(value, sizeof value, "%s:%llu", h->owner, (unsigned long long)h->token)
                       : snprintf(value, sizeof value, "%s", h->owner);
    /* the timeout base: a hold our downgrade may have made shared is ours
     * only while our timeout key holds our token; the lock-delay marker
     * only when our holds arm one (a client without lock_delay arms none,
     * so the script need not look) */
    bool marker = s->c->opts.lock_delay_ms > 0;
    const char *args[] = {k.lock, k.chan, k.token, k.rwchan, k.tbase, k.delay, value, token};
    size_t lens[] = {k.lock_len,  k.chan_len,  k.token_len, k.rwchan_len,
                     k.tbase_len, k.delay_len, (size_t)vl,  (size_t)tl};
    if (!marker) { /* the marker's place taken by the arguments */
        memmove(args + 5, args + 6, 2 * sizeof *args);
        memmove(lens + 5, lens + 6, 2 * sizeof *lens);
    }
    struct redis_request rq = {.script = S_RELEASE, .nkeys = marker ? 6 : 5, .nargs = marker ? 8 : 7,
                               .args = args, .lens = lens, .what = "release",
                               .deadline = deadline};
    rc = dlock__redis_eval(s, &rq);
    if (!rc) {
        rc = dlock__redis_release_reply(s, rq.out.reply, h->name, &k, h->token, rq.out.retried);
        freeReplyObject(rq.out.reply);
    }
    dlock__redis_keys_free(&k);
    return rc;
}

int dlock__redis_release_hold(void *state, struct dlock__hold *h)
{
    int rc = release_lock(state, h, DLOCK__NEVER);
    free(h->bdata); /* Sentinel: the master that confirmed it last */
    h->bdata = NULL;
    return rc;
}

/* The lock ops' release_within (backend.h): an exclusive hold of the
 * default or simple layout is released by its script within DEADLINE;
 * what is not answered by then -- and a fair or shared hold, whose
 * releases have no deadline, at once -- is owed as the cancel of every
 * request of H's owner on the name so far (cancel.c): once the server
 * answers, it takes the owner's field away (a fair lock's: leaves and
 * passes the lock on), and the owner's next acquire of the name sends it
 * first, so it never ends a later hold. */
int dlock__redis_release_within(void *state, struct dlock__hold *h, int64_t deadline)
{
    struct redis_state *s = state;
    int rc = DLOCK_ETIMEDOUT;
    if (h->mode == DLOCK_EXCLUSIVE && !dlock__redis_fair(s, h) &&
        dlock__time_left(deadline, s->op_timeout_ms) > 0)
        rc = release_lock(s, h, deadline);
    if (rc == DLOCK_ECONN || rc == DLOCK_ETIMEDOUT || rc == DLOCK_EUNAVAIL) {
        dlock__redis_cancel_lost_acquire(s, h, __atomic_load_n(&s->requests, __ATOMIC_RELAXED),
                                         h->lease_ms);
        rc = DLOCK_OK;
    }
    free(h->bdata);
    h->bdata = NULL;
    return rc;
}

int dlock__redis_renew_reply(struct redis_state *s, const redisReply *r, size_t m, bool *renewed)
{
    if (r->type == REDIS_REPLY_ERROR)
        return dlock__redis_server_error(s, r->str, "renew");
    if (r->type != REDIS_REPLY_ARRAY || r->elements != m)
        return dlock__err(DLOCK_EPROTO, "%s: renew: unexpected reply", s->where);
    for (size_t i = 0; i < m; i++)
        renewed[i] = r->element[i]->type == REDIS_REPLY_INTEGER && r->element[i]->integer == 1;
    return DLOCK_OK;
}

/* The holds of HOLDS[C0..N) that go in one renewal script call: at most
 * RENEW_BATCH, and on a cluster master only those of HOLDS[C0]'s slot
 * (the batch comes sorted by slot: cluster.c). */
static size_t renew_chunk(struct redis_state *s, struct dlock__hold **holds, size_t c0, size_t n)
{
    size_t m = n - c0 < RENEW_BATCH ? n - c0 : RENEW_BATCH;
    if (!s->cluster)
        return m;
    unsigned slot = dlock__redis_cluster_name_slot(s, holds[c0]->name);
    for (size_t i = 1; i < m; i++)
        if (dlock__redis_cluster_name_slot(s, holds[c0 + i]->name) != slot)
            return i;
    return m;
}

/* What the renewal of H that WHERE answered (RENEWED, with ACKED replica
 * acknowledgements, -1 when not asked; sent at SENT) means: DLOCK_OK
 * (its validity runs from SENT), DLOCK_EUNAVAIL (too few replicas: not
 * counted) or DLOCK_ELOST, each failure with its own message. */
static int renew_outcome(struct redis_state *s, struct dlock__hold *h, bool renewed, int acked,
                         int64_t sent, const char *where)
{
    if (renewed && acked >= 0 && acked < s->sync_replicas)
        return dlock__err(DLOCK_EUNAVAIL, "%s: renewal of lock '%s': only %d of %d replicas "
                                          "acknowledged it (sync=%d)",
                          s->where, h->name, acked, s->sync_replicas, s->sync_replicas);
    if (renewed) {
        dlock__hold_confirmed(s->c, h, sent);
        dlock__redis_sentinel_confirmed(s, h);
        return DLOCK_OK;
    }
    /* each hold keeps its own reason, naming the server that answered
     * (Sentinel: the master of the moment, and the failover when another
     * master confirmed the hold last) */
    char failover[DLOCK__MSG_MAX / 2];
    dlock__redis_sentinel_lost_note(s, h, failover, sizeof failover);
    return dlock__err(DLOCK_ELOST, "%s: renewal found lock '%s' held by another owner or gone "
                                   "(%s)",
                      where, h->name,
                      *failover ? failover
                                : "lease expired, force-released or the server lost its data");
}

/* H's arguments to the renewal script (its lock's keys K): its owner
 * value, lease and reader timeout key ("" for an exclusive hold), their
 * lengths in LENS[0..3). */
static void renew_args(struct redis_state *s, const struct dlock__hold *h,
                       const struct lock_keys *k, char val[160], char lease[24],
                       char timeout[DLOCK_NAME_MAX + 256], size_t lens[3])
{
    int vl = s->simple ? snprintf(val, 160, "%s:%llu", h->owner, (unsigned long long)h->token)
                       : snprintf(val, 160, "%s", h->owner);
    lens[0] = (size_t)vl;
    lens[1] = (size_t)snprintf(lease, 24, "%lld", (long long)h->lease_ms);
    lens[2] = (size_t)dlock__redis_rw_timeout_key(k, h, timeout, DLOCK_NAME_MAX + 256);
}

/* Renew the lock hold H alone, within DEADLINE, through the routed
 * script path (a cluster: redirects followed): DLOCK_OK (confirmed),
 * DLOCK_ELOST, or why it could not be renewed. */
static int renew_one(struct redis_state *s, struct dlock__hold *h, int64_t deadline)
{
    struct lock_keys k;
    int rc = dlock__redis_keys_make(s, h->name, &k);
    if (rc)
        return rc;
    char val[160], lease[24], timeout[DLOCK_NAME_MAX + 256];
    const char *args[] = {k.lock, val, lease, timeout};
    size_t lens[4] = {k.lock_len};
    renew_args(s, h, &k, val, lease, timeout, lens + 1);
    struct redis_request rq = {.script = S_RENEW, .nkeys = 1, .nargs = 4, .args = args,
                               .lens = lens, .what = "renew", .deadline = deadline};
    rc = dlock__redis_eval(s, &rq);
    if (!rc) {
        bool renewed = false;
        rc = dlock__redis_renew_reply(s, rq.out.reply, 1, &renewed);
        if (!rc)
            rc = renew_outcome(s, h, renewed, rq.out.acked, rq.out.sent_ms, s->where);
        freeReplyObject(rq.out.reply);
    }
    dlock__redis_keys_free(&k);
    return rc;
}

/* The keeper's batch: RENEW_BATCH holds per script call, every call of
 * the batch pipelined on one connection, so N holds cost one round trip
 * and ceil(N / RENEW_BATCH) commands (a cluster: per master, cluster.c). */
static int renew_holds(void *state, struct dlock__renew_batch *b)
{
    static const struct redis_renewer renewer = {.batch = renew_holds, .one = renew_one};
    struct redis_state *s = state;
    if (s->cluster && !s->cluster_node)
        return dlock__redis_cluster_renew(s, b, &renewer);
    if (dlock__redis_sem_renew_apart(s, b, renew_holds)) /* semaphore permits (semaphore.c) */
        return DLOCK_OK;
    struct dlock__hold **holds = b->holds;
    size_t n = b->n;
    if (n == 0)
        return DLOCK_OK;
    /* A renewal must not outlive the earliest validity deadline of the
     * batch: the keeper declares holds lost at their deadline, not at the
     * end of a connect or read timeout against a server that went silent. */
    struct rconn *k;
    int rc = dlock__redis_pool_get(s, true, b->deadline, &k);
    if (rc) {
        for (size_t i = 0; i < n; i++)
            dlock__renew_result(b, i, rc);
        return rc;
    }
    size_t nchunks = 0;
    for (size_t c0 = 0; c0 < n; nchunks++)
        c0 += renew_chunk(s, holds, c0, n);
    size_t maxargs = 3 + 4 * RENEW_BATCH;
    struct renew_bufs rb;
    rc = dlock__redis_renew_bufs_new(&rb, maxargs, RENEW_BATCH, RENEW_BATCH);
    char (*timeouts)[DLOCK_NAME_MAX + 256] = calloc(RENEW_BATCH, sizeof *timeouts);
    bool *renewed = calloc(RENEW_BATCH, sizeof *renewed);
    if (!rc && (!timeouts || !renewed))
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    if (rc)
        goto fail_all;
    int64_t sent = dlock__now_ms();
    bool noscript = false;
    /* Append every chunk, then read every reply: one round trip. */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t c0 = 0, m; c0 < n; c0 += m) {
            m = renew_chunk(s, holds, c0, n);
            char nk[16];
            snprintf(nk, sizeof nk, "%zu", m);
            size_t a = 0;
            rb.argv[a] = pass ? "EVAL" : "EVALSHA";
            rb.argl[a++] = pass ? 4 : 7;
            rb.argv[a] = pass ? s->src[S_RENEW] : s->sha[S_RENEW];
            rb.argl[a++] = strlen(rb.argv[1]);
            rb.argv[a] = nk;
            rb.argl[a++] = strlen(nk);
            for (size_t i = 0; i < m; i++) {
                if ((rc = dlock__redis_keys_make(s, holds[c0 + i]->name, &rb.keys[i])))
                    goto fail_all;
                rb.argv[a] = rb.keys[i].lock;
                rb.argl[a++] = rb.keys[i].lock_len;
            }
            for (size_t i = 0; i < m; i++) {
                renew_args(s, holds[c0 + i], &rb.keys[i], rb.vals[i], rb.leases[i], timeouts[i],
                           rb.argl + a);
                rb.argv[a++] = rb.vals[i];
                rb.argv[a++] = rb.leases[i];
                rb.argv[a++] = timeouts[i]; /* a reader's timeout key, or "" */
            }
            rc = dlock__redis_conn_append(k, (int)a, rb.argv, rb.argl);
            for (size_t i = 0; i < m; i++)
                dlock__redis_keys_free(&rb.keys[i]);
            if (rc)
                goto fail_all;
        }
        /* ?sync=N: a WAIT behind them; a renewal too few replicas
         * acknowledged does not count (the hold's validity is not
         * extended, so it is lost at its deadline unless a later one is
         * acknowledged). */
        bool sync = dlock__redis_sync_append(s, k);
        /* Send every chunk and read every reply: one round trip. */
        rc = dlock__redis_exchange(&k, 1, k->until, "renew");
        int acked = sync && !rc ? dlock__redis_sync_acked(k->got[k->ngot - 1]) : -1;
        noscript = false;
        for (size_t ci = 0, c0 = 0, m; ci < nchunks; ci++, c0 += m) {
            m = renew_chunk(s, holds, c0, n);
            redisReply *r = dlock__redis_conn_take(k);
            if (!r) {
                dlock__redis_pool_put(s, k, true);
                k = NULL;
                for (size_t i = c0; i < n; i++)
                    dlock__renew_result(b, i, rc);
                goto out;
            }
            int e;
            if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0) {
                noscript = true;
            } else if ((e = dlock__redis_renew_reply(s, r, m, renewed))) {
                for (size_t i = 0; i < m; i++)
                    dlock__renew_result(b, c0 + i, e);
            } else {
                for (size_t i = 0; i < m; i++)
                    dlock__renew_result(b, c0 + i, renew_outcome(s, holds[c0 + i], renewed[i],
                                                                 acked, sent, k->where));
            }
            freeReplyObject(r);
        }
        if (sync)
            freeReplyObject(dlock__redis_conn_take(k)); /* the WAIT's, read above */
        if (!noscript)
            break;
        /* The server forgot the script (restart, SCRIPT FLUSH): resend as
         * EVAL, which also reloads it. */
        sent = dlock__now_ms();
    }
    rc = DLOCK_OK;
    goto out;
fail_all:
    for (size_t i = 0; i < n; i++)
        dlock__renew_result(b, i, rc);
    dlock__redis_pool_put(s, k, true); /* commands may be half-appended */
    k = NULL;
out:
    if (k)
        dlock__redis_pool_put(s, k, false);
    dlock__redis_renew_bufs_free(&rb);
    free(timeouts);
    free(renewed);
    return rc;
}

/* The backend's renew: the holds, then, while some hold was renewed,
 * the client record that names where they are held (record.c). */
int dlock__redis_renew(void *state, struct dlock__renew_batch *b)
{
    struct redis_state *s = state;
    int rc = renew_holds(s, b);
    int64_t lease = 0;
    for (size_t i = 0; i < b->n; i++)
        if (b->result[i] == DLOCK_OK && b->holds[i]->lease_ms > lease)
            lease = b->holds[i]->lease_ms;
    dlock__redis_record_touch(s, lease, b->deadline);
    return rc;
}

/* ============================================================ inspecting */

/* "<uuid>:<digits>": the shape of a Redisson / dlock hash field. */
static bool owner_field_like(const char *f, size_t len)
{
    if (len < 38)
        return false;
    for (size_t i = 0; i < 36; i++) {
        char ch = f[i];
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (ch != '-')
                return false;
        } else if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F'))) {
            return false;
        }
    }
    if (f[36] != ':')
        return false;
    for (size_t i = 37; i < len; i++)
        if (f[i] < '0' || f[i] > '9')
            return false;
    return true;
}

/* A field a lock hash may hold: an owner, a Redisson read-write lock's
 * writer "<uuid>:<digits>:write", or its "mode". */
static bool lock_field_like(const char *f, size_t len)
{
    if (len == 4 && memcmp(f, "mode", 4) == 0)
        return true;
    if (len > 6 && memcmp(f + len - 6, ":write", 6) == 0)
        len -= 6;
    return owner_field_like(f, len);
}

/* "<uuid>:<digits>:<digits>": the shape of dlock's simple-layout value. */
static bool lock_value_like(const char *v, size_t len)
{
    const char *colon = len ? memrchr(v, ':', len) : NULL;
    if (!colon || colon == v + len - 1)
        return false;
    for (const char *p = colon + 1; p < v + len; p++)
        if (*p < '0' || *p > '9')
            return false;
    return owner_field_like(v, (size_t)(colon - v));
}

bool dlock__redis_parse_u64(const char *text, size_t len, uint64_t *out)
{
    if (len == 0 || len > 20 || strspn(text, "0123456789") != len)
        return false;
    errno = 0;
    unsigned long long v = strtoull(text, NULL, 10);
    if (errno == ERANGE)
        return false;
    *out = v;
    return true;
}

/* The holder inspect shows for a simple-layout value that is not dlock's:
 * a foreign client's lock (redis-py) or an application's string, whose
 * value is not ours to print. */
#define FOREIGN_VALUE "(a value that is not dlock's)"

int dlock__redis_inspect_reply(struct redis_state *s, const redisReply *r, const struct lock_keys *k,
                               struct dlock_info *info)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 || r->element[0]->type != REDIS_REPLY_STRING ||
        r->element[1]->type != REDIS_REPLY_INTEGER)
        return dlock__err(DLOCK_EPROTO, "%s: inspect '%s': unexpected reply", s->where, k->lock);
    const char *type = r->element[0]->str;
    long long pttl = r->element[1]->integer;
    int rc = dlock__info_set_key(info, k->lock);
    if (rc)
        return rc;
    info->mode = DLOCK_EXCLUSIVE;
    info->nwaiters = -1;
    if (r->element[2]->type == REDIS_REPLY_STRING && r->element[2]->len && /* "": none */
        !dlock__redis_parse_u64(r->element[2]->str, r->element[2]->len, &info->token))
        return dlock__err(DLOCK_EPROTO, "%s: inspect '%s': the token counter %s holds '%.40s', "
                                        "not a number",
                          s->where, k->lock, k->token, r->element[2]->str);
    const char *want = s->simple ? "string" : "hash";
    if (strcmp(type, "none") == 0) {
        info->held = 0;
        info->ttl_ms = -1;
        if (r->elements >= 4 && r->element[3]->type == REDIS_REPLY_INTEGER) /* lock-delay */
            info->delay_ms = r->element[3]->integer;
    } else if (strcmp(type, want) != 0) {
        rc = dlock__redis_wrongtype(s, k, type);
    } else {
        info->held = 1;
        info->ttl_ms = pttl >= 0 ? pttl : (pttl == -1 ? DLOCK_VALID_FOREVER : -1);
        if (s->simple) {
            /* A foreign lock (redis-py) is held as far as acquire goes:
             * shown as held, its value not shown. */
            const redisReply *v = r->elements >= 4 ? r->element[3] : NULL;
            if (v && v->type == REDIS_REPLY_STRING)
                rc = dlock__info_add_holder(info, lock_value_like(v->str, v->len) ? v->str : FOREIGN_VALUE,
                                            1);
        } else {
            /* every field an owner, or it is an application's hash */
            for (size_t i = 3; i + 1 < r->elements; i += 2)
                if (r->element[i]->type != REDIS_REPLY_STRING ||
                    !lock_field_like(r->element[i]->str, r->element[i]->len))
                    return dlock__redis_wrongtype(s, k, "hash whose fields are not lock owners (<uuid>:<thread>)");
            for (size_t i = 3; i + 1 < r->elements && !rc; i += 2) {
                const redisReply *f = r->element[i], *v = r->element[i + 1];
                if (strcmp(f->str, "mode") == 0) { /* a read-write lock's */
                    if (v->type == REDIS_REPLY_STRING && strcmp(v->str, "read") == 0)
                        info->mode = DLOCK_SHARED;
                    continue;
                }
                unsigned count = v->type == REDIS_REPLY_STRING ? (unsigned)strtoul(v->str, NULL, 10) : 0;
                rc = dlock__info_add_holder(info, f->str, count);
            }
        }
    }
    return rc;
}

/* The inspect script's look at NAME into INFO; with QUEUE the holders'
 * client records and the fair queue's waiters too (more requests), which
 * a check does without. */
static int inspect_lock(struct redis_state *s, const char *name, struct dlock_info *info, bool queue)
{
    struct lock_keys k;
    int rc = dlock__redis_keys_make(s, name, &k);
    if (rc)
        return rc;
    const char *args[] = {k.lock, k.token, k.delay};
    size_t lens[] = {k.lock_len, k.token_len, k.delay_len};
    struct redis_request rq = {.script = S_INSPECT, .nkeys = 3, .nargs = 3, .args = args,
                               .lens = lens, .what = "inspect", .deadline = DLOCK__NEVER};
    rc = dlock__redis_eval(s, &rq);
    if (rc)
        goto out;
    redisReply *r = rq.out.reply;
    rc = dlock__redis_inspect_reply(s, r, &k, info);
    if (!rc && queue) /* where each holder runs, from its client record (record.c) */
        rc = dlock__redis_record_names(s, info);
    if (!rc && queue && !s->simple) /* the fair queue, in order, when there is one (fair.c) */
        rc = dlock__redis_fair_waiters(s, name, info);
    freeReplyObject(r);
out:
    dlock__redis_keys_free(&k);
    return rc;
}

int dlock__redis_inspect(void *state, const char *name, struct dlock_info *info)
{
    return inspect_lock(state, name, info, true);
}

int dlock__redis_check(void *state, const char *name, struct dlock__check_view *view)
{
    struct redis_state *s = state;
    struct dlock_info *info = calloc(1, sizeof *info);
    int rc = info ? DLOCK_OK : dlock__err(DLOCK_ENOMEM, "out of memory");
    if (!rc)
        rc = inspect_lock(s, name, info, false);
    if (!rc) {
        view->held = info->held;
        view->token = info->token;
        view->reader_unknown = info->held && info->mode == DLOCK_SHARED;
        if (s->simple && info->held) {
            /* the holder's own token, the end of "<uuid>:<tid>:<token>"
             * (a foreign value carries none) */
            const char *v = info->nholders ? info->holders[0].id : "";
            const char *colon = strrchr(v, ':');
            view->token = lock_value_like(v, strlen(v)) && colon ? strtoull(colon + 1, NULL, 10) : 0;
        }
    }
    dlock_info_free(info);
    return rc;
}

int dlock__redis_force_release(void *state, const char *name)
{
    struct redis_state *s = state;
    struct lock_keys k;
    int rc = dlock__redis_keys_make(s, name, &k);
    if (rc)
        return rc;
    const char *type = s->simple ? "string" : "hash";
    const char *args[] = {k.lock, k.chan, type};
    size_t lens[] = {k.lock_len, k.chan_len, strlen(type)};
    struct redis_request rq = {.script = S_FORCE, .nkeys = 2, .nargs = 3, .args = args,
                               .lens = lens, .what = "force release", .deadline = DLOCK__NEVER};
    rc = dlock__redis_eval(s, &rq);
    if (!rc) {
        long long status;
        rc = dlock__redis_status_reply(s, rq.out.reply, &k, &status);
        freeReplyObject(rq.out.reply);
    }
    dlock__redis_keys_free(&k);
    return rc;
}

/* Escape glob specials of the key prefix so SCAN MATCH takes it literally. */
static char *match_pattern(const char *prefix, const char *pattern)
{
    size_t pl = prefix ? strlen(prefix) : 0;
    size_t gl = pattern ? strlen(pattern) : 1;
    char *m = malloc(2 * pl + gl + 2), *p = m;
    if (!m)
        return NULL;
    for (size_t i = 0; i < pl; i++) {
        if (strchr("*?[]\\", prefix[i]))
            *p++ = '\\';
        *p++ = prefix[i];
    }
    strcpy(p, pattern ? pattern : "*");
    return m;
}

/* Whether KEY (a hash/string of the right type) looks like a lock. */
static bool key_is_lock(struct redis_state *s, struct rconn *k, const char *key, size_t len, int *err)
{
    const char *argv[2] = {s->simple ? "GET" : "HKEYS", key};
    size_t argl[2] = {strlen(argv[0]), len};
    if (dlock__redis_derived_key(key, len))
        return false; /* a token counter, a record of canceled acquires... */
    if (s->simple) {
        /* a string of dlock's shape: "<uuid>:<thread>:<token>" */
        redisReply *r;
        k->until = dlock__now_ms() + s->op_timeout_ms;
        if ((*err = dlock__redis_command(k, 2, argv, argl, "list", &r, NULL)))
            return false;
        bool yes = r->type == REDIS_REPLY_STRING && lock_value_like(r->str, r->len);
        freeReplyObject(r);
        return yes;
    }
    redisReply *r;
    k->until = dlock__now_ms() + s->op_timeout_ms;
    if ((*err = dlock__redis_command(k, 2, argv, argl, "list", &r, NULL)))
        return false;
    bool yes = r->type == REDIS_REPLY_ARRAY && r->elements > 0;
    for (size_t i = 0; yes && i < r->elements; i++)
        yes = r->element[i]->type == REDIS_REPLY_STRING &&
              lock_field_like(r->element[i]->str, r->element[i]->len);
    freeReplyObject(r);
    return yes;
}

int dlock__redis_scan(struct redis_state *s, const char *match, const char *type,
                      int (*each)(struct redis_state *s, struct rconn *k, const redisReply *key,
                                  void *arg, int *err),
                      void *arg)
{
    if (s->cluster && !s->cluster_node) /* every master's keys */
        return dlock__redis_cluster_scan(s, match, type, each, arg, dlock__redis_scan);
    struct rconn *k;
    int rc = dlock__redis_pool_get(s, false, DLOCK__NEVER, &k);
    if (rc)
        return rc;
    char cursor[32] = "0";
    bool stop = false, broken = false;
    do {
        const char *scan[] = {"SCAN", cursor, "MATCH", match, "COUNT", "1000", "TYPE", type};
        redisReply *r;
        k->until = dlock__now_ms() + s->op_timeout_ms; /* each page a request */
        if ((rc = dlock__redis_command(k, 8, scan, NULL, "SCAN", &r, NULL))) {
            broken = true;
            break;
        }
        if (r->type == REDIS_REPLY_ERROR) {
            rc = dlock__redis_server_error(s, r->str, "SCAN");
            freeReplyObject(r);
            break;
        }
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY) {
            rc = dlock__err(DLOCK_EPROTO, "%s: SCAN: unexpected reply", s->where);
            freeReplyObject(r);
            break;
        }
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        const redisReply *keys = r->element[1];
        for (size_t i = 0; i < keys->elements && !stop && !rc; i++) {
            const redisReply *key = keys->element[i];
            if (key->type != REDIS_REPLY_STRING || memchr(key->str, 0, key->len))
                continue;
            stop = each(s, k, key, arg, &rc) != 0;
            broken = broken || rc;
        }
        freeReplyObject(r);
    } while (!stop && !rc && strcmp(cursor, "0") != 0);
    dlock__redis_pool_put(s, k, broken);
    return rc;
}

/* dlock__redis_list's walk: FN for each key that is a lock; in the
 * ENCODED pass, only a cluster's encoded names' (scripts.c), decoded and
 * matched against PATTERN here (SCAN saw their encoded form), else only
 * the others. */
struct list_walk {
    dlock_list_fn fn;
    void *arg;
    const char *pattern;
    bool encoded;
};

static int list_each(struct redis_state *s, struct rconn *k, const redisReply *key, void *arg,
                     int *err)
{
    struct list_walk *lw = arg;
    if (dlock__redis_key_encoded(s, key->str, key->len) != lw->encoded ||
        !key_is_lock(s, k, key->str, key->len, err))
        return 0;
    char *name = dlock__redis_key_name(s, key->str, key->len);
    bool match = name && (!lw->encoded || dlock__glob(lw->pattern, name));
    int stop = match ? lw->fn(name, lw->arg) : 0;
    free(name);
    return stop;
}

int dlock__redis_list(void *state, const char *pattern, dlock_list_fn fn, void *arg)
{
    struct redis_state *s = state;
    const char *type = s->simple ? "string" : "hash";
    struct list_walk lw = {fn, arg, pattern, false};
    int rc = DLOCK_OK;
    /* then, on a cluster, the names kept encoded ("dlock_name:{...}") */
    for (int pass = 0; pass < (s->cluster ? 2 : 1) && !rc; pass++) {
        char *match = match_pattern(s->prefix, pass ? "dlock_name:{*" : pattern);
        if (!match)
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        lw.encoded = pass == 1;
        rc = dlock__redis_scan(s, match, type, list_each, &lw);
        free(match);
    }
    return rc;
}
