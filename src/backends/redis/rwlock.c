/* rwlock.c -- what shared holds add to the Redis backend: Redisson's
 * RReadWriteLock layout (docs/protocol-redis.md, "Read-write locks").
 *
 * Why it is shaped so. Java services take read-write locks with Redisson,
 * so a shared hold is written as Redisson's read lock: the lock's hash gets
 * "mode" = "read" and a field per reader, and each reader keeps a timeout
 * key "{name}:<owner>:rwlock_timeout:1" whose expiry is its own lease (the
 * hash lives as long as its longest reader). An exclusive hold is still
 * Redisson's RLock field, plus "mode" = "write" so Redisson's read-write
 * locks see it too. Acquire is the mutex's script (mutex.c passes the mode;
 * readers wait on RReadWriteLock's channel "redisson_rwlock:{name}"), and
 * so is renewal (a reader's timeout key renewed with the hash); this file
 * has the rest: a reader's release, the downgrade and the record of
 * waiting writers that keeps new readers out while a writer waits --
 * Redisson's own layout lets readers overtake a waiting writer forever.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis.h"

int dlock__redis_rw_check_layout(struct redis_state *s, const struct dlock__hold *h)
{
    if (h->mode != DLOCK_SHARED || !s->simple)
        return DLOCK_OK;
    return dlock__err(DLOCK_ENOTSUP,
                      "%s: lock '%s': layout=simple (SET NX PX, one owner per key) has no shared "
                      "mode; use the Redisson layout (the default) for read-write locks",
                      s->where, h->name);
}

int dlock__redis_rw_timeout_key(const struct lock_keys *k, const struct dlock__hold *h, char *buf,
                                size_t size)
{
    if (h->mode != DLOCK_SHARED) {
        buf[0] = 0;
        return 0;
    }
    int n = snprintf(buf, size, "%s:%s:rwlock_timeout:1", k->tbase, h->owner);
    return n < (int)size ? n : (int)size - 1;
}

/* Run RQ (a read-write script on lock K's keys): its integer reply in
 * *VALUE. */
static int rw_eval(struct redis_state *s, struct redis_request *rq, const struct lock_keys *k,
                   long long *value)
{
    int rc = dlock__redis_eval(s, rq);
    if (rc)
        return rc;
    rc = dlock__redis_status_reply(s, rq->out.reply, k, value);
    if (!rc && rq->out.retried && *value == 2)
        *value = 1; /* the first attempt ran: our field was gone by then */
    freeReplyObject(rq->out.reply);
    return rc;
}

int dlock__redis_rw_release(struct redis_state *s, struct dlock__hold *h)
{
    struct lock_keys k;
    int rc = dlock__redis_keys_make(s, h->name, &k);
    if (rc)
        return rc;
    char token[24];
    int tl = snprintf(token, sizeof token, "%llu", (unsigned long long)h->token);
    /* the keys, then the owner and token: a later hold of ours has another token */
    const char *args[] = {k.lock, k.chan, k.rwchan, k.tbase, h->owner, token};
    size_t lens[] = {k.lock_len,  k.chan_len,       k.rwchan_len,
                     k.tbase_len, strlen(h->owner), (size_t)tl};
    struct redis_request rq = {.script = S_RW_RELEASE_READ,
                               .nkeys = 4,
                               .nargs = 6,
                               .args = args,
                               .lens = lens,
                               .what = "release",
                               .deadline = DLOCK__NEVER};
    long long status = 0;
    rc = rw_eval(s, &rq, &k, &status);
    if (rc == DLOCK_EWRONGTYPE)
        rc = dlock__err(DLOCK_ELOST, "%s: shared lock '%s' was lost: %s", s->where, h->name,
                        dlock_errmsg());
    else if (!rc && status != 1)
        rc = dlock__err(DLOCK_ELOST,
                        "%s: shared lock '%s' was lost: key '%s' has no reader field '%s' (its "
                        "lease expired, it was force-released or the server lost its data)",
                        s->where, h->name, k.lock, h->owner);
    dlock__redis_keys_free(&k);
    return rc;
}

int dlock__redis_rw_downgrade(void *state, struct dlock__hold *h)
{
    struct redis_state *s = state;
    struct lock_keys k;
    int rc = dlock__redis_keys_make(s, h->name, &k);
    if (rc)
        return rc;
    char lease[24], token[24];
    int ll = snprintf(lease, sizeof lease, "%lld", (long long)h->lease_ms);
    int tl = snprintf(token, sizeof token, "%llu", (unsigned long long)h->token);
    /* the token key: a later hold of ours has the same field, another
     * token; the lock-delay marker, which goes when it is this hold's */
    const char *args[] = {k.lock, k.rwchan, k.tbase, k.token, k.delay, h->owner, lease, token};
    size_t lens[] = {k.lock_len,  k.rwchan_len,     k.tbase_len, k.token_len,
                     k.delay_len, strlen(h->owner), (size_t)ll,  (size_t)tl};
    struct redis_request rq = {.script = S_RW_DOWNGRADE,
                               .nkeys = 5,
                               .nargs = 8,
                               .args = args,
                               .lens = lens,
                               .what = "downgrade",
                               .deadline = DLOCK__NEVER};
    long long status = 0;
    int64_t sent = dlock__now_ms();
    rc = rw_eval(s, &rq, &k, &status);
    if (rc == DLOCK_EWRONGTYPE || (!rc && status != 1))
        rc = dlock__err(DLOCK_ELOST,
                        "%s: lock '%s' was lost before its downgrade to shared: key '%s' has no "
                        "exclusive field '%s' any more",
                        s->where, h->name, k.lock, h->owner);
    else if (rc)
        /* The script may have run (readers may be in already), so the
         * hold can no longer pass for exclusive: give it up (as etcd). */
        rc = dlock__err(DLOCK_ELOST, "%s: the hold can no longer be trusted exclusive",
                        dlock_errmsg());
    else
        dlock__hold_confirmed(s->c, h, sent); /* the timeout key's lease runs from now */
    dlock__redis_keys_free(&k);
    return rc;
}

int dlock__redis_rw_send_unwait(struct redis_state *s, const char *name, const char *owner,
                                int64_t deadline, struct dlock__wait *w)
{
    struct lock_keys k;
    int rc = dlock__redis_keys_make(s, name, &k);
    if (rc)
        return rc;
    const char *args[] = {k.writers, k.rwchan, owner};
    size_t lens[] = {k.writers_len, k.rwchan_len, strlen(owner)};
    struct redis_request rq = {.script = S_RW_UNWAIT,
                               .nkeys = 2,
                               .nargs = 3,
                               .args = args,
                               .lens = lens,
                               .what = "give up waiting",
                               .wait = w,
                               .deadline = deadline};
    long long removed;
    rc = rw_eval(s, &rq, &k, &removed);
    dlock__redis_keys_free(&k);
    /* only a reply that did not come is worth another try: a server's
     * error would answer the same again */
    return rc == DLOCK_ECONN || rc == DLOCK_ETIMEDOUT || rc == DLOCK_EUNAVAIL ||
                   rc == DLOCK_ECANCELED
               ? rc
               : DLOCK_OK;
}

void dlock__redis_rw_unwait(struct redis_state *s, const struct dlock__hold *h, int64_t deadline)
{
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg); /* the acquire's own failure is the story */
    /* within what is left of the wait (nothing once it timed out or was
     * canceled): the
     * caller's wait_ms holds even when the server stalls; the keeper
     * sends what could not be sent by then (a record left behind only
     * keeps readers out until it lapses) */
    if (dlock__time_left(deadline, s->op_timeout_ms) == 0 ||
        dlock__redis_rw_send_unwait(s, h->name, h->owner, deadline, NULL) != DLOCK_OK)
        dlock__redis_rw_unwait_owe(s, h); /* cancel.c: before the owner's next request too */
    dlock__errmsg_restore(DLOCK_OK, msg);
}

/* ------------------------------------------------------ a waiter's ears */

/* Redisson's RReadWriteLock publishes its unlocks on redisson_rwlock:{N}
 * only ("0" for a read unlock, "1" for a write unlock), never on RLock's
 * channel: a dlock writer that listened there alone would sleep through
 * a Redisson reader's or writer's release until the TTL's safety net. So
 * a waiting writer on the Redisson layout listens on both channels; on
 * the read-write one as a head (hub.c): one writer per message, not
 * every writer for a "1", and none more when the first already holds the
 * wake a dlock release sent it on RLock's channel. */
static bool hears_rwchan(const struct redis_state *s, const struct dlock__hold *h)
{
    return h->mode == DLOCK_EXCLUSIVE && !s->simple;
}

/* The first channel a waiter of H listens on: readers RReadWriteLock's,
 * writers RLock's. */
static void first_chan(const struct dlock__hold *h, const struct lock_keys *k, const char **chan,
                       size_t *len)
{
    bool reader = h->mode == DLOCK_SHARED;
    *chan = reader ? k->rwchan : k->chan;
    *len = reader ? k->rwchan_len : k->chan_len;
}

int dlock__redis_rw_listen(struct redis_state *s, const struct dlock__hold *h,
                           const struct lock_keys *k, struct dlock__wait *w)
{
    const char *chan;
    size_t len;
    first_chan(h, k, &chan, &len);
    int rc = dlock__redis_hub_join(s, chan, len, w);
    if (!rc && hears_rwchan(s, h) &&
        (rc = dlock__redis_hub_join_head(s, k->rwchan, k->rwchan_len, w)))
        dlock__redis_hub_leave(s, chan, len, w, false);
    return rc;
}

bool dlock__redis_rw_listening(struct redis_state *s, const struct dlock__hold *h,
                               const struct lock_keys *k)
{
    const char *chan;
    size_t len;
    first_chan(h, k, &chan, &len);
    return dlock__redis_hub_subscribed(s, chan, len) &&
           (!hears_rwchan(s, h) || dlock__redis_hub_subscribed(s, k->rwchan, k->rwchan_len));
}

void dlock__redis_rw_heard(struct redis_state *s, const struct dlock__hold *h,
                           const struct lock_keys *k, struct dlock__wait *w)
{
    const char *chan;
    size_t len;
    first_chan(h, k, &chan, &len);
    dlock__redis_hub_ack(s, chan, len, w);
    if (hears_rwchan(s, h))
        dlock__redis_hub_ack(s, k->rwchan, k->rwchan_len, w);
}

void dlock__redis_rw_unlisten(struct redis_state *s, const struct dlock__hold *h,
                              const struct lock_keys *k, struct dlock__wait *w, bool acquired)
{
    const char *chan;
    size_t len;
    first_chan(h, k, &chan, &len);
    dlock__redis_hub_leave(s, chan, len, w, acquired);
    if (hears_rwchan(s, h))
        dlock__redis_hub_leave(s, k->rwchan, k->rwchan_len, w, acquired);
}
