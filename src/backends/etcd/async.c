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
 * blocking acquire fails at once there) is the core's to ride out
 * (dlock__wait_outage); one while it waits is looked at again shortly,
 * as the blocking wait does. disarm() withdraws a key that did not become a
 * hold (owed to the keeper: nothing is sent at a timeout or a cancel)
 * and stops the watch.
 */
#include "etcd.h"

int dlock__etcd_try_armed(void *state, struct dlock__hold *h, struct dlock__wait *w, void **park)
{
    struct etcd_backend *s = state;
    struct etcd_acquire *a = *park;
    if (!a) {
        if (!(a = dlock__etcd_acquire_new(s, h, w)))
            return DLOCK_ENOMEM;
        *park = a;
    }
    int64_t until = DLOCK__NEVER;
    int rc = dlock__etcd_acquire_step(a, w, &until);
    if (dlock__etcd_transient(rc)) {
        /* An outage (the acquire gave up and owes what it left): the
         * core rides it out, the acquire enters the queue anew. */
        dlock__etcd_acquire_again(a);
        return dlock__wait_outage(w);
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
    struct etcd_acquire *a = park;
    if (!a)
        return rc;
    if (rc != DLOCK_OK)
        rc = dlock__etcd_acquire_give_up(a, w, rc);
    dlock__etcd_acquire_free(a);
    return rc;
}
