/* cancel.c -- the Redis backend's cancel of acquires whose replies were
 * lost, and the other work an owner owes the server on a name.
 *
 * An acquire that gives up after losing its replies may still have run on
 * the server, or may run there later (a request on its way through the
 * network or a proxy). Every acquire request carries a number (mutex.c);
 * here the backend owes the server a cancel of the owner's requests up to
 * the last number it used (scripts/cancel_*.lua): recorded in
 * dlock_canceled:{name} so that a late request does nothing, and the
 * owner's field removed if one did run. The caller does not wait for it:
 * it goes on the core's cleanup queue. A registry of the cancels not yet
 * sent lets the owner's next acquire of the name send its cancel first
 * (docs/protocol-redis.md, "Ambiguous replies").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "redis.h"

/* How long the record of a canceled acquire lives: an attempt that
 * reaches the server later than this after its cancellation can still
 * take the name for one lease (docs/protocol-redis.md). */
int64_t dlock__redis_cancel_life_ms(int64_t lease_ms)
{
    int64_t life = 600000;
    return lease_ms > life / 2 ? 2 * lease_ms : life;
}

/* Send the cancel of OWNER's acquires of NAME up to request number LAST
 * (scripts/cancel_*.lua), within DEADLINE and until the cancel of W (the
 * owner's wait that sends it first; NULL: the keeper): record on the
 * server that they are canceled, so that one arriving later does
 * nothing, and take the owner's field away if one did run. */
static int send_cancel(struct redis_state *s, const char *name, const char *owner_id, uint64_t last,
                       int64_t lease_ms, bool fair, int64_t deadline, struct dlock__wait *w)
{
    if (fair) /* a fair lock's: leave the queue too, passing on a lock handed over */
        return dlock__redis_fair_cancel(s, name, owner_id, last, lease_ms, deadline, w);
    struct lock_keys k;
    int rc = dlock__redis_keys_make(s, name, &k);
    if (rc)
        return rc;
    char owner[160], num[24], life[24];
    /* Redisson layout: our field. Simple layout: our value's prefix
     * "<uuid>:<tid>:" (the token after it was never learned). */
    int ol = snprintf(owner, sizeof owner, s->simple ? "%s:" : "%s", owner_id);
    int nl = snprintf(num, sizeof num, "%llu", (unsigned long long)last);
    int ll = snprintf(life, sizeof life, "%lld", (long long)dlock__redis_cancel_life_ms(lease_ms));
    const char *args[] = {k.lock, k.chan, k.canceled, owner, num, life};
    size_t lens[] = {k.lock_len, k.chan_len, k.canceled_len, (size_t)ol, (size_t)nl, (size_t)ll};
    struct redis_request rq = {.script = S_CANCEL, .nkeys = 3, .nargs = 6, .args = args,
                               .lens = lens, .what = "cancel a lost acquire", .wait = w,
                               .deadline = deadline};
    rc = dlock__redis_eval(s, &rq);
    if (!rc) {
        long long n;
        const char *type_name;
        rc = dlock__redis_script_reply(s, rq.out.reply, &n, &type_name);
        freeReplyObject(rq.out.reply); /* a key of another type: recorded, nothing else to undo */
    }
    dlock__redis_keys_free(&k);
    return rc;
}

/* Work owed for one owner (thread) and name: the cancel of an acquire
 * whose replies were lost, or a waiting writer's unwait. The caller does
 * not wait for it: it goes on the core's cleanup queue, which the keeper
 * drains (and close once more). The owner's next acquire of that name
 * sends it first itself: otherwise that acquire could find the lost
 * attempt's field, take it as its own hold, and then lose it to the
 * queued cancel; or record a new wait that the queued unwait would then
 * take away (readers would overtake that wait). */
struct run_waiter; /* below */

struct pending_cancel {
    struct redis_state *s;
    struct pending_cancel *next; /* s->cancels, under s->cancel_mu */
    struct dlock__timed_mutex run; /* held while it is being sent */
    struct run_waiter *waiters;  /* under s->cancel_mu: owners' waits for RUN */
    unsigned refs;               /* under s->cancel_mu: the queue's, and lookups */
    bool done;                   /* under s->cancel_mu */
    uint64_t last;               /* under s->cancel_mu: the highest number to cancel */
    int64_t lease_ms;
    bool fair;                   /* a fair lock's acquire (fair.c) */
    bool unwait;                 /* a writer's unwait (rwlock.c), not a cancel */
    char owner[96];
    char name[];
};

/* Drop a reference to E (cancel_mu held); frees it at the last. */
static void pending_unref_locked(struct pending_cancel *e)
{
    if (--e->refs > 0)
        return;
    dlock__timed_mutex_destroy(&e->run);
    free(e);
}

/* The cleanup queue is done with E (sent, or given up at close). */
static void pending_release(void *arg)
{
    struct pending_cancel *e = arg;
    struct redis_state *s = e->s;
    if (s->c->fork_gen != dlock__fork_gen()) {
        /* A child after fork() freeing its parent's client: no other
         * thread runs here, and the mutexes may have been held by one of
         * the parent's at the fork. */
        free(e);
        return;
    }
    pthread_mutex_lock(&s->cancel_mu);
    for (struct pending_cancel **p = &s->cancels; *p; p = &(*p)->next)
        if (*p == e) {
            __atomic_store_n(p, e->next, __ATOMIC_RELEASE); /* read unlocked by dlock__redis_cancel_owed */
            break;
        }
    pending_unref_locked(e);
    pthread_mutex_unlock(&s->cancel_mu);
}

/* An owner's wait asleep until E's run is let go (run_unlock wakes it),
 * so that its cancel ends the wait for the keeper's send too. */
struct run_waiter {
    struct dlock__wait *w;
    struct run_waiter *next;
};

/* Take E's run by UNTIL. A wait W (an owner's acquire; NULL: the keeper)
 * sleeps on itself meanwhile, so its cancel ends this too: DLOCK_OK,
 * DLOCK_ETIMEDOUT or DLOCK_ECANCELED. */
static int run_lock(struct redis_state *s, struct pending_cancel *e, int64_t until,
                    struct dlock__wait *w)
{
    if (!w || dlock__wait_try_once(w)) /* a try-once has no wait to sleep on */
        return dlock__timed_mutex_lock(&e->run, until) ? DLOCK_OK : DLOCK_ETIMEDOUT;
    struct run_waiter me = {.w = w};
    pthread_mutex_lock(&s->cancel_mu);
    me.next = e->waiters;
    e->waiters = &me;
    pthread_mutex_unlock(&s->cancel_mu);
    int rc;
    for (;;) {
        unsigned seq = dlock__wait_seq(w); /* before the try: a let-go after it wakes us */
        if (dlock__timed_mutex_lock(&e->run, 0)) {
            rc = DLOCK_OK;
            break;
        }
        if ((rc = dlock__wait_sleep(w, seq, until)))
            break;
        if (dlock__now_ms() >= until) {
            rc = DLOCK_ETIMEDOUT;
            break;
        }
    }
    pthread_mutex_lock(&s->cancel_mu);
    for (struct run_waiter **p = &e->waiters; *p; p = &(*p)->next)
        if (*p == &me) {
            *p = me.next;
            break;
        }
    pthread_mutex_unlock(&s->cancel_mu);
    return rc;
}

/* Let go of E's run, waking the owners' waits for it. */
static void run_unlock(struct redis_state *s, struct pending_cancel *e)
{
    dlock__timed_mutex_unlock(&e->run);
    pthread_mutex_lock(&s->cancel_mu);
    for (struct run_waiter *x = e->waiters; x; x = x->next)
        dlock__wait_wake(x->w);
    pthread_mutex_unlock(&s->cancel_mu);
}

/* Send E unless it was sent already, within DEADLINE and until W's cancel
 * (W: the owner's wait that sends it first; NULL: the keeper); DLOCK_OK
 * once sent. */
static int pending_run(struct redis_state *s, struct pending_cancel *e, int64_t deadline,
                       struct dlock__wait *w)
{
    int64_t left = dlock__time_left(deadline, s->op_timeout_ms);
    int rc = left == 0 ? DLOCK_ETIMEDOUT : run_lock(s, e, dlock__now_ms() + left, w);
    const char *what = e->unwait ? "unwait of an earlier wait" : "cancel of an earlier lost acquire";
    if (rc == DLOCK_ECANCELED)
        return dlock__err(rc, "%s: wait canceled while the %s of '%s' was being sent", s->where,
                          what, e->name);
    if (rc)
        return dlock__err(DLOCK_ETIMEDOUT, "%s: the %s of '%s' is still being sent", s->where,
                          what, e->name);
    for (;;) {
        pthread_mutex_lock(&s->cancel_mu);
        bool done = e->done;
        uint64_t last = e->last;
        pthread_mutex_unlock(&s->cancel_mu);
        if (done)
            break;
        rc = e->unwait ? dlock__redis_rw_send_unwait(s, e->name, e->owner, deadline, w)
                       : send_cancel(s, e->name, e->owner, last, e->lease_ms, e->fair, deadline, w);
        if (rc)
            break;
        pthread_mutex_lock(&s->cancel_mu);
        e->done = e->last == last; /* else one more lost acquire since: again */
        pthread_mutex_unlock(&s->cancel_mu);
    }
    run_unlock(s, e);
    return rc;
}

/* The node E was owed to (a Redlock client's bstate is not a node's). */
static int pending_cleanup(void *bstate, void *arg, int64_t deadline)
{
    (void)bstate;
    struct pending_cancel *e = arg;
    return pending_run(e->s, e, deadline, NULL);
}

/* Before H's owner acquires NAME: send what it still owes there (a
 * cancel, an unwait), one after the other. */
int dlock__redis_cancel_owed(struct redis_state *s, const struct dlock__hold *h, int64_t deadline,
                             struct dlock__wait *w)
{
    for (;;) {
        if (!__atomic_load_n(&s->cancels, __ATOMIC_ACQUIRE))
            return DLOCK_OK;
        pthread_mutex_lock(&s->cancel_mu);
        struct pending_cancel *e = s->cancels;
        while (e && (e->done || strcmp(e->owner, h->owner) != 0 || strcmp(e->name, h->name) != 0))
            e = e->next;
        if (e)
            e->refs++;
        pthread_mutex_unlock(&s->cancel_mu);
        if (!e)
            return DLOCK_OK;
        int rc = pending_run(s, e, deadline, w); /* DLOCK_OK: E is done, the next one */
        pthread_mutex_lock(&s->cancel_mu);
        pending_unref_locked(e);
        pthread_mutex_unlock(&s->cancel_mu);
        if (rc)
            return rc;
    }
}

/* Owe the server, for H's owner on H->name, the cancel of its requests
 * up to number LAST (UNWAIT false) or its unwait (UNWAIT true): one
 * entry of that kind not sent yet covers the new one too. Keeps the
 * caller's error message. */
static void owe(struct redis_state *s, const struct dlock__hold *h, bool unwait, uint64_t last,
                int64_t lease_ms)
{
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    pthread_mutex_lock(&s->cancel_mu);
    struct pending_cancel *e = s->cancels;
    while (e && (e->done || e->unwait != unwait || strcmp(e->owner, h->owner) != 0 ||
                 strcmp(e->name, h->name) != 0))
        e = e->next;
    if (e) { /* not sent yet: one covers both */
        if (e->last < last)
            e->last = last;
        pthread_mutex_unlock(&s->cancel_mu);
        dlock__errmsg_restore(DLOCK_OK, msg);
        return;
    }
    size_t nl = strlen(h->name);
    e = calloc(1, sizeof *e + nl + 1);
    if (e) {
        e->s = s;
        dlock__timed_mutex_init(&e->run);
        e->refs = 1;
        e->last = last;
        e->lease_ms = lease_ms;
        e->fair = !unwait && dlock__redis_fair(s, h);
        e->unwait = unwait;
        snprintf(e->owner, sizeof e->owner, "%s", h->owner);
        memcpy(e->name, h->name, nl + 1);
        e->next = s->cancels;
        __atomic_store_n(&s->cancels, e, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&s->cancel_mu);
    char what[160];
    snprintf(what, sizeof what, "%s '%.100s'", unwait ? "give up waiting for" : "cancel lost acquires of",
             h->name);
    if (!e || dlock__cleanup_add(s->c, what, pending_cleanup, e, pending_release) != DLOCK_OK) {
        /* out of memory: send it now, as best we can */
        if (unwait)
            dlock__redis_rw_send_unwait(s, h->name, h->owner, DLOCK__NEVER, NULL);
        else
            send_cancel(s, h->name, h->owner, last, lease_ms, dlock__redis_fair(s, h), DLOCK__NEVER,
                        NULL);
    }
    dlock__errmsg_restore(DLOCK_OK, msg);
}

/* An acquire whose replies were lost (timeout, connection reset) may have
 * run on the server, or may still run there later (a request on its way
 * through the network or a proxy): owe a cancel of every request of H's
 * owner on K up to number LAST. Keeps the caller's error message. */
void dlock__redis_cancel_lost_acquire(struct redis_state *s, const struct dlock__hold *h, uint64_t last,
                               int64_t lease_ms)
{
    owe(s, h, false, last, lease_ms);
}

void dlock__redis_rw_unwait_owe(struct redis_state *s, const struct dlock__hold *h)
{
    owe(s, h, true, 0, 0);
}

int dlock__redis_undo_acquire(struct redis_state *s, const struct dlock__hold *h, uint64_t last,
                              int64_t deadline)
{
    dlock__redis_cancel_lost_acquire(s, h, last, h->lease_ms);
    return dlock__redis_cancel_owed(s, h, deadline, NULL);
}
