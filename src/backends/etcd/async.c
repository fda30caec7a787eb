/* async.c -- the etcd lock's wait cut into attempts for the core's
 * asynchronous acquire (src/async.c), which parks the wait between them
 * so no thread sleeps in it.
 *
 * The blocking acquire (mutex.c) is a row of steps with sleeps between:
 * enter the queue (lease, key, put), look whether our key is the oldest,
 * watch the key just before ours and sleep until it goes. Here each
 * attempt runs the steps up to where the blocking acquire would sleep,
 * and the op parks instead: the watch, run by the client's watch thread,
 * wakes the parked wait (dlock__wait_wake) when etcd confirms it and when
 * the key before ours goes; the leases' keepalives and a lock-delay's end
 * are its retry times. Our key stays queued meanwhile, so a parked waiter
 * keeps its place in line. An outage before the key is queued (the
 * blocking acquire fails at once there) is ridden out with backoff until
 * the wait's end; one while it waits is looked at again shortly, as the
 * blocking wait does. disarm() withdraws a key that did not become a
 * hold (owed to the keeper: nothing is sent at a timeout or a cancel)
 * and stops the watch.
 */
#include <stdlib.h>

#include "etcd.h"

#define OUTAGE_FIRST_MS 100 /* the first pause of an outage ridden out */
#define OUTAGE_MAX_MS 2000  /* doubling up to this */

struct etcd_park {
    struct etcd_acquire *a;
    int64_t backoff_ms; /* the last pause of an outage ridden out; 0: none now */
};

int dlock__etcd_try_armed(void *state, struct dlock__hold *h, struct dlock__wait *w, void **park)
{
    struct etcd_backend *s = state;
    struct etcd_park *p = *park;
    if (!p) {
        if (!(p = calloc(1, sizeof *p)))
            return dlock__etcd_nomem(s);
        if (!(p->a = dlock__etcd_acquire_new(s, h, w))) {
            free(p);
            return DLOCK_ENOMEM;
        }
        *park = p;
    }
    int64_t until = DLOCK__NEVER;
    int rc = dlock__etcd_acquire_step(p->a, w, &until);
    if (rc == ETCD_SLEEP) {
        p->backoff_ms = 0;
    } else if (dlock__etcd_transient(rc) && !dlock__wait_canceled(w) &&
               dlock__time_left(dlock__wait_deadline(w), 1) > 0) {
        /* An outage (the acquire gave up and owes what it left): again
         * after a pause, within the wait. */
        dlock__etcd_acquire_again(p->a);
        p->backoff_ms = p->backoff_ms ? p->backoff_ms * 2 : OUTAGE_FIRST_MS;
        if (p->backoff_ms > OUTAGE_MAX_MS)
            p->backoff_ms = OUTAGE_MAX_MS;
        until = dlock__now_ms() + p->backoff_ms;
        rc = ETCD_SLEEP;
    }
    if (rc != ETCD_SLEEP)
        return rc;
    dlock__wait_retry_at(w, until);
    return DLOCK_EBUSY;
}

int dlock__etcd_disarm(void *state, struct dlock__hold *h, struct dlock__wait *w, void *park,
                       int rc)
{
    (void)state;
    (void)h;
    struct etcd_park *p = park;
    if (!p)
        return rc;
    if (rc != DLOCK_OK)
        rc = dlock__etcd_acquire_give_up(p->a, w, rc);
    dlock__etcd_acquire_free(p->a);
    free(p);
    return rc;
}
