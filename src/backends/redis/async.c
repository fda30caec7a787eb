/* async.c -- the lock's wait cut into attempts for the core's
 * asynchronous acquire (src/async.c), which parks the wait between them
 * so no thread sleeps in it.
 *
 * It is mutex.c's wait loop (acquire_lock) turned inside out: the first
 * attempt is a wait's first try ("1": a waiting writer keeps new readers
 * out); a busy one subscribes to the lock's release channels through
 * the hub, whose thread wakes the parked wait on a release message or
 * on the subscription's confirmation; until that confirmation no try is
 * made (a release before it could be missed), after it each attempt
 * acknowledges the wake it used and tries ("2"). The holder's lease end
 * is the retry time no message announces. A connection lost while
 * waiting is an outage the core rides out until the wait's end
 * (dlock__wait_outage), as the blocking wait does. Fair locks (fair.c) keep their place in a queue
 * the blocking wait manages with a thread: not parked yet (DLOCK_ENOTSUP).
 */
#include <stdlib.h>

#include "redis.h"

struct redis_park {
    struct lock_keys k;
    bool listening; /* joined the release channels (rw_listen) */
    bool confirmed; /* the subscription was confirmed once: each attempt tries */
    int64_t ttl;    /* the holder's lease left as the last try saw it */
};

/* The attempt's answer: RC of a try (DLOCK_EBUSY while the wait goes on,
 * with W's retry time), a lost connection or a failover (DLOCK_ECONN,
 * DLOCK_EUNAVAIL) the core's outage to ride out. */
static int attempt_outcome(struct redis_park *p, const struct dlock__hold *h, struct dlock__wait *w,
                           int rc)
{
    if (rc == DLOCK_ECONN || rc == DLOCK_EUNAVAIL)
        return dlock__wait_outage(w);
    if (rc != DLOCK_EBUSY)
        return rc;
    dlock__wait_retry_at(w, dlock__redis_try_again_at(p->ttl, h->lease_ms, 0));
    return DLOCK_EBUSY;
}

int dlock__redis_try_armed(void *state, struct dlock__hold *h, struct dlock__wait *w, void **park)
{
    struct redis_state *s = state;
    struct redis_park *p = *park;
    if (!p) {
        if (dlock__redis_fair(s, h))
            return dlock__err(DLOCK_ENOTSUP,
                              "%s: lock '%s': a fair lock's waiter (DLOCK_LOCK_FAIR, "
                              "layout=fair) cannot be parked yet: acquire it with dlock_acquire() "
                              "in a thread",
                              s->where, h->name);
        dlock__redis_owner_of(s, h);
        int rc = dlock__redis_rw_check_layout(s, h);
        if (rc)
            return rc;
        if (!(p = calloc(1, sizeof *p)))
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        if ((rc = dlock__redis_keys_make(s, h->name, &p->k))) {
            free(p);
            return rc;
        }
        *park = p;
        rc = dlock__redis_try_acquire(s, h, &p->k, h->lease_ms, w, "1", &p->ttl);
        if (rc != DLOCK_EBUSY)
            return rc;
        dlock__redis_contend_announce(s, h, &p->k, w); /* to a holder that listens */
        /* Contended: subscribe; the confirmation wakes W. */
        if ((rc = dlock__redis_rw_listen(s, h, &p->k, w)))
            return rc;
        p->listening = true;
        return attempt_outcome(p, h, w, DLOCK_EBUSY);
    }
    /* Not confirmed yet: no try (a release before it could be missed).
     * Once it was, every attempt tries, as the blocking wait does: a
     * subscription lost in an outage must not keep the wait from
     * seeing the outage, or its end. */
    if (!p->confirmed && !(p->confirmed = dlock__redis_rw_listening(s, h, &p->k)))
        return attempt_outcome(p, h, w, DLOCK_EBUSY);
    dlock__redis_rw_heard(s, h, &p->k, w);
    int rc = dlock__redis_try_acquire(s, h, &p->k, h->lease_ms, w, "2", &p->ttl);
    if (rc == DLOCK_EBUSY) /* still waiting: a new holder may listen */
        dlock__redis_contend_announce(s, h, &p->k, w);
    return attempt_outcome(p, h, w, rc);
}

int dlock__redis_disarm(void *state, struct dlock__hold *h, struct dlock__wait *w, void *park,
                        int rc)
{
    struct redis_state *s = state;
    struct redis_park *p = park;
    if (!p)
        return rc;
    if (p->listening)
        dlock__redis_rw_unlisten(s, h, &p->k, w, rc == DLOCK_OK);
    if ((rc == DLOCK_ETIMEDOUT || rc == DLOCK_ECANCELED) &&
        h->mode == DLOCK_EXCLUSIVE) /* our writer's record goes: the readers behind us in */
        dlock__redis_rw_unwait(s, h, dlock__redis_give_up_deadline(w, rc));
    if (rc == DLOCK_OK) /* where the new holder runs, for inspect (record.c) */
        dlock__redis_record_touch(s, h->lease_ms, DLOCK__NEVER);
    dlock__redis_keys_free(&p->k);
    free(p);
    return rc;
}
