/* release.c -- how a hold ends: dlock_release() and the core's other
 * ways of giving holds back.
 *
 * Why it is a file of its own: ending a hold is more than the mirror of
 * taking it (lock.c). A release may drop one level of a re-entered hold,
 * turn a writer that still has read levels into a reader at the server
 * (hold_downgrade), or end the hold: take it out of the registry once the
 * keeper's renewal of it is done, give it up at the backend with the
 * client's mutex dropped, then report a loss noted before the release
 * (DLOCK_ELOST), hand the name to the next local waiter and wake the
 * threads of a handle-owned handle. A multi-lock ends its members in one
 * backend request (dlock__release_set) or within its wait's deadline
 * (dlock__release_within), leaving to the keeper what a stalled server
 * has not answered (dlock__hold_give_back); closing ends every hold
 * (dlock__release_all), freeing a handle its own (dlock__hold_end). All of
 * them end a hold in the same two halves, hold_end_begin() and
 * hold_end_finish(). lock.c keeps the handles, the registry and the
 * acquire; what of it is used here is declared in internal.h.
 */
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

/* Take H out of its entry: wait for a renew() in flight to finish first,
 * so the keeper never uses a freed hold (mutex held). */
static void hold_unlink(dlock_client *c, struct dlock__hold *h)
{
    while (h->renewing)
        pthread_cond_wait(&c->renew_cv, &c->mu);
    struct dlock__hold **p = &h->entry->holds;
    while (*p != h)
        p = &(*p)->next;
    *p = h->next;
    if (h->lease_ms)
        c->nholds--;
    dlock__callback_forget_hold(c, h); /* no at-risk call after the release */
}

/* DLOCK_ELOST, said: NAME's hold was lost (WHY, may be NULL) before the
 * release that is ending it. */
static int lost_before_release(const char *name, const char *why)
{
    return dlock__err(DLOCK_ELOST, "lock '%s' was lost before this release: %s", name,
                      why ? why : "no reason given");
}

/* What hold_end_begin() took out of a hold for hold_end_finish(). */
struct hold_ending {
    bool lost;
    char *why;
    dlock_lock *owner; /* the handle-owned handle whose hold this is */
};

/* The first half of ending H (mutex held): unlinked from its entry, its
 * loss noted in END, its handle-owned handle marked releasing. The
 * caller then drops the mutex and gives H up at the backend. */
static void hold_end_begin(dlock_client *c, struct dlock__hold *h, struct hold_ending *end)
{
    hold_unlink(c, h);
    h->entry->refs++;
    end->lost = h->state == DLOCK__LOST;
    end->why = h->lost_why;
    h->lost_why = NULL;
    end->owner = h->via && h->via->owner && h->tid == h->via->owner ? h->via : NULL;
    if (end->owner)
        end->owner->releasing = true;
}

/* The second half (mutex not held on entry, held on return): the result
 * RC of the backend's release, or DLOCK_ELOST for a hold lost before it;
 * H freed and its handle's waiting threads woken. */
static int hold_end_finish(dlock_client *c, struct dlock__hold *h, struct hold_ending *end, int rc)
{
    struct dlock__entry *e = h->entry;
    if (end->lost)
        rc = lost_before_release(e->name, end->why);
    free(end->why);
    pthread_mutex_lock(&c->mu);
    if (end->owner) {
        end->owner->releasing = false;
        dlock__waitset_wake_all(&end->owner->turn);
        pthread_cond_broadcast(&c->renew_cv); /* a dlock_lock_free() of it waits */
    }
    if ((c->be->caps & DLOCK__CAP_CLIENT_OWNER) && !h->sem)
        dlock__local_dequeue(e, h->mode == DLOCK_SHARED);
    dlock__hold_free(h);
    dlock__entry_put(c, e);
    return rc;
}

/* Give H up at the backend and free it (mutex held; dropped meanwhile). */
int dlock__hold_end(dlock_client *c, struct dlock__hold *h)
{
    struct hold_ending end;
    hold_end_begin(c, h, &end);
    pthread_mutex_unlock(&c->mu);
    return hold_end_finish(c, h, &end, dlock__backend_release(c, h));
}

int dlock__release_set(dlock_lock *const *ls, size_t n, int *rcs)
{
    dlock_client *c = ls[0]->c;
    const struct dlock__backend *be = c->be;
    if (n < 2 || !DLOCK__OP(be, multi, release) || dlock__check_client(c))
        return DLOCK_ENOTSUP;
    struct dlock__hold **hs = calloc(n, sizeof *hs);
    struct hold_ending *ends = calloc(n, sizeof *ends);
    if (!hs || !ends) {
        free(hs);
        free(ends);
        return DLOCK_ENOTSUP; /* member by member needs no memory */
    }
    pthread_mutex_lock(&c->mu);
    size_t k = 0;
    for (; k < n; k++) {
        hs[k] = dlock__hold_of(ls[k]->e, dlock__owner_of(ls[k]));
        /* only holds this release ends: one level, a plain lock's */
        if (!hs[k] || hs[k]->count != 1 || hs[k]->sem || hs[k]->elect || hs[k]->shared_levels ||
            (hs[k]->state != DLOCK__HELD && hs[k]->state != DLOCK__LOST))
            break;
    }
    if (k < n) {
        pthread_mutex_unlock(&c->mu);
        free(hs);
        free(ends);
        return DLOCK_ENOTSUP;
    }
    for (k = 0; k < n; k++)
        hold_end_begin(c, hs[k], &ends[k]);
    pthread_mutex_unlock(&c->mu);
    /* The backend's message is its last failing member's, as is the
     * set's (release_members in multi.c goes in reverse order too). */
    char said[DLOCK__MSG_MAX] = "", msg[DLOCK__MSG_MAX] = "";
    dlock__err(DLOCK_OK, "%s", "");
    int rc = be->multi->release(c->bstate, hs, n, rcs);
    if (rc == DLOCK_ENOTSUP) { /* nothing sent: each as dlock_release() gives it up */
        for (k = 0; k < n; k++)
            if ((rcs[k] = dlock__backend_release(c, hs[k])))
                dlock__errmsg_save(said);
    } else {
        dlock__errmsg_save(said);
    }
    int first = DLOCK_OK;
    for (k = n; k-- > 0;) {
        rcs[k] = hold_end_finish(c, hs[k], &ends[k], rcs[k]);
        pthread_mutex_unlock(&c->mu);
        if (rcs[k] && !first) {
            first = rcs[k];
            if (ends[k].lost)
                dlock__errmsg_save(msg);
            else
                snprintf(msg, sizeof msg, "%s", said);
        }
    }
    free(hs);
    free(ends);
    return first ? dlock__errmsg_restore(first, msg) : DLOCK_OK;
}

/* Whether H is one the backend's release_within can end: a plain hold
 * of one level, held or lost (mutex held). */
static bool ends_within(const dlock_client *c, const struct dlock__hold *h)
{
    return c->be->locks->release_within && h->count == 1 && !h->sem && !h->elect &&
           !h->shared_levels && (h->state == DLOCK__HELD || h->state == DLOCK__LOST);
}

int dlock__release_within(dlock_lock *l, int64_t deadline)
{
    dlock_client *c = l->c;
    const struct dlock__backend *be = c->be;
    if (deadline == DLOCK__NEVER || !be->locks->release_within || dlock__check_client(c))
        return dlock_release(l);
    dlock__msg_clear();
    pthread_mutex_lock(&c->mu);
    struct dlock__hold *h = dlock__hold_of(l->e, dlock__owner_of(l));
    if (!h || !ends_within(c, h)) {
        pthread_mutex_unlock(&c->mu);
        return dlock_release(l);
    }
    if (h->renewing && h->via && h->via->owner && h->tid == h->via->owner) {
        /* The keeper is renewing it (one level, no shared one: no
         * caller's share or downgrade has it): waiting for that renewal
         * (until the hold's validity ends on a stalled server) would
         * overrun DEADLINE, so the keeper gives it back once renew()
         * returns.
         * Its handle stays busy (releasing) until then: an acquire
         * through it, which carries the same owner id, waits for the
         * give-back, never a Redis re-entry of the dying hold; and the
         * name stays claimed by this client (CLIENT_OWNER) until then.
         * A hold already lost says so now, as dlock_release() does (a
         * loss the renewal finds is the keeper's to drop). */
        h->give_back = true;
        h->via->releasing = true;
        int rc = h->state == DLOCK__LOST ? lost_before_release(h->name, h->lost_why) : DLOCK_OK;
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    struct hold_ending end;
    hold_end_begin(c, h, &end);
    pthread_mutex_unlock(&c->mu);
    int rc = hold_end_finish(c, h, &end, be->locks->release_within(c->bstate, h, deadline));
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void dlock__hold_give_back(dlock_client *c, struct dlock__hold *h)
{
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    struct hold_ending end;
    hold_end_begin(c, h, &end);
    pthread_mutex_unlock(&c->mu);
    hold_end_finish(c, h, &end, c->be->locks->release_within(c->bstate, h, dlock__now_ms()));
    dlock__errmsg_restore(DLOCK_OK, msg);
}

/* The owner's last exclusive level of H goes through L while shared
 * levels remain: turn H into a shared hold at the backend, with no
 * moment unlocked (mutex held; dropped meanwhile). The keeper leaves H
 * alone meanwhile (renewing), and so do acquires through a handle-owned
 * L (releasing). A backend without downgrade keeps H exclusive until
 * its last level goes. A lost hold is dropped (DLOCK_ELOST); any other
 * failure leaves H exclusive with every level, to release again. */
static int hold_downgrade(dlock_client *c, dlock_lock *l, struct dlock__hold *h)
{
    if (!c->be->locks->downgrade) {
        h->count--;
        h->shared_levels--; /* levels are just counted, as before */
        return DLOCK_OK;
    }
    while (h->renewing)
        pthread_cond_wait(&c->renew_cv, &c->mu);
    h->renewing = true;
    dlock_lock *owner = l->owner && h->tid == l->owner ? l : NULL;
    if (owner)
        owner->releasing = true;
    pthread_mutex_unlock(&c->mu);
    dlock__err(DLOCK_OK, "%s", "");
    int rc = c->be->locks->downgrade(c->bstate, h);
    pthread_mutex_lock(&c->mu);
    h->renewing = false;
    pthread_cond_broadcast(&c->renew_cv);
    if (owner) {
        owner->releasing = false;
        dlock__waitset_wake_all(&owner->turn);
    }
    if (rc == DLOCK_OK) {
        h->mode = DLOCK_SHARED;
        h->count = h->shared_levels;
        h->shared_levels = 0;
        if (c->be->caps & DLOCK__CAP_CLIENT_OWNER) {
            dlock__local_dequeue(h->entry, false); /* the client's readers may join */
            dlock__local_claim(h->entry, true);
        }
    } else if (rc == DLOCK_ELOST) {
        char msg[DLOCK__MSG_MAX];
        dlock__errmsg_save(msg);
        dlock__hold_end(c, h);
        rc = dlock__errmsg_restore(DLOCK_ELOST, msg);
    }
    return rc;
}

int dlock_release(dlock_lock *l)
{
    dlock__msg_clear();
    if (!l)
        return dlock__err(DLOCK_EINVAL, "lock is NULL");
    dlock_client *c = l->c;
    int rc = dlock__check_client(c);
    if (rc)
        return rc;
    pthread_mutex_lock(&c->mu);
    struct dlock__hold *h = dlock__hold_of(l->e, dlock__owner_of(l));
    if (!h)
        rc = dlock__not_held(l);
    else if (h->count > 1 && h->state == DLOCK__HELD && h->shared_levels &&
             l->mode == DLOCK_SHARED) {
        h->count--; /* a read level of a writer */
        h->shared_levels--;
    } else if (h->count > 1 && h->state == DLOCK__HELD && h->shared_levels &&
               h->count - h->shared_levels == 1)
        rc = hold_downgrade(c, l, h); /* the last write level, reads remain */
    else if (h->count > 1 && h->state == DLOCK__HELD)
        h->count--;
    else
        rc = dlock__hold_end(c, h);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int dlock_release_ex(dlock_lock *l, unsigned flags)
{
    dlock__msg_clear();
    if (!l)
        return dlock__err(DLOCK_EINVAL, "lock is NULL");
    if (flags & ~DLOCK_RELEASE_CLEAR_VALUE)
        return dlock__err(DLOCK_EINVAL, "lock '%s': unknown release flags 0x%x", l->e->name,
                          flags & ~DLOCK_RELEASE_CLEAR_VALUE);
    int clear = flags ? dlock__value_clear_last(l) : DLOCK_OK;
    if (clear == DLOCK_OK || clear == DLOCK_ELOST) /* a lost hold: the release says so */
        return dlock_release(l);
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    dlock_release(l); /* released all the same; the clear's failure is the news */
    return dlock__errmsg_restore(clear, msg);
}

void dlock__release_all(dlock_client *c, int64_t deadline)
{
    pthread_mutex_lock(&c->mu);
    for (size_t b = 0; b < DLOCK__BUCKETS; b++) {
        struct dlock__entry *e = c->buckets[b];
        while (e) {
            struct dlock__hold *h = e->holds;
            while (h && h->give_back) /* the keeper's to end */
                h = h->next;
            if (h && ends_within(c, h)) {
                struct hold_ending end;
                hold_end_begin(c, h, &end);
                pthread_mutex_unlock(&c->mu);
                hold_end_finish(c, h, &end, c->be->locks->release_within(c->bstate, h, deadline));
                e = c->buckets[b]; /* the chain may have changed */
                continue;
            }
            if (h) {
                dlock__hold_end(c, h);
                e = c->buckets[b]; /* the chain may have changed */
                continue;
            }
            e = e->next;
        }
    }
    pthread_mutex_unlock(&c->mu);
}
