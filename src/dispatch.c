/* dispatch.c -- the one place that chooses a hold's backend ops by its
 * kind.
 *
 * A hold is a lock's, a semaphore permit's (h->sem) or an election
 * campaign's (h->elect); each kind has its own table of ops in the
 * backend (backend.h). The lock machinery (lock.c, release.c, multi.c)
 * takes and gives up holds of every kind without knowing which: it calls
 * down here, and this file calls the backend. The primitives (semaphore.c,
 * election.c) check, before making a handle, that their table is there,
 * so a hold of theirs never reaches a backend without the ops for it.
 */
#include "internal.h"

int dlock__backend_acquire(struct dlock_client *c, struct dlock__hold *h, struct dlock__wait *w)
{
    if (h->elect)
        return c->be->elections->acquire(c->bstate, h, w);
    if (h->sem)
        return c->be->semaphores->acquire(c->bstate, h, w);
    return c->be->locks->acquire(c->bstate, h, w);
}

/* The asynchronous acquire's ops (async.c): a lock's, a permit's or a
 * campaign's. */
bool dlock__backend_parks(const struct dlock_client *c, const struct dlock_lock *l)
{
    if (l->elect)
        return c->be->elections->try_armed != NULL;
    if (l->sem)
        return c->be->semaphores->try_armed != NULL;
    return c->be->locks->try_armed != NULL;
}

int dlock__backend_try_armed(struct dlock_client *c, struct dlock__hold *h, struct dlock__wait *w,
                             void **park)
{
    if (h->elect)
        return c->be->elections->try_armed(c->bstate, h, w, park);
    if (h->sem)
        return c->be->semaphores->try_armed(c->bstate, h, w, park);
    return c->be->locks->try_armed(c->bstate, h, w, park);
}

int dlock__backend_disarm(struct dlock_client *c, struct dlock__hold *h, struct dlock__wait *w,
                          void *park, int rc)
{
    if (h->elect)
        return c->be->elections->disarm(c->bstate, h, w, park, rc);
    if (h->sem)
        return c->be->semaphores->disarm(c->bstate, h, w, park, rc);
    return c->be->locks->disarm(c->bstate, h, w, park, rc);
}

int dlock__backend_release(struct dlock_client *c, struct dlock__hold *h)
{
    if (h->elect)
        return c->be->elections->release(c->bstate, h);
    if (h->sem)
        return c->be->semaphores->release(c->bstate, h);
    return c->be->locks->release(c->bstate, h);
}
