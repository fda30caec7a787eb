/* callbacks.c -- the thread that runs lost, at-risk and contended
 * callbacks, one per client, started with the first callback or the
 * first handle given an at-risk or contended callback.
 *
 * The keeper only queues a callback when it declares a hold lost; this
 * thread runs them one after another. So a callback that blocks delays
 * other callbacks, never a renewal, and one that frees another handle of
 * the same batch finds that handle's call still queued and drops it
 * instead of waiting for a keeper that waits for it. dlock_lock_free()
 * waits for a running callback of its handle, unless it is called from
 * that very callback (see dlock_lock_on_lost() in dlock.h).
 *
 * The at-risk signal (dlock_lock_on_at_risk()) is timed here, not in the
 * keeper: the keeper sits in the backend's renew() while a renewal hangs
 * on a stalled server -- exactly when a hold falls at risk -- so this
 * thread sleeps until the first margin of a hold whose handle asked for
 * one, and queues the call behind any loss already queued. The queue and
 * the thread's state live under the client's mutex.
 *
 * The contended signal (dlock_lock_on_contended()) is the backend's to
 * see -- a watch it sets up as the acquire returns, reporting each waiter
 * from its own thread (dlock__hold_contended()) -- and this file's to
 * tell once per waiter and hold, behind the calls already queued.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

/* One queued call: a loss (HOLD NULL), or hold HOLD at risk or
 * contended (its identity only, never read: dlock__callback_forget_hold
 * drops the call before the hold goes). */
struct dlock__call {
    dlock_lock *l;
    const struct dlock__hold *hold;
    dlock_lost_fn lost_fn;
    dlock_at_risk_fn at_risk_fn;
    dlock_contended_fn contended_fn; /* WHY is the waiter */
    void *arg;
    int64_t validity_ms;
    char *why;
    struct dlock__call *next;
};

/* A new call on L with WHY, NULL when out of memory. */
static struct dlock__call *call_new(dlock_lock *l, const char *why)
{
    struct dlock__call *call = calloc(1, sizeof *call);
    if (call && !(call->why = strdup(why && *why ? why : "no reason given"))) {
        free(call);
        return NULL;
    }
    if (call)
        call->l = l;
    return call;
}

static void call_append(struct dlock__callbacks *cb, struct dlock__call *call)
{
    if (cb->tail)
        cb->tail->next = call;
    else
        cb->head = call;
    cb->tail = call;
    pthread_cond_broadcast(&cb->cv);
}

/* Hold H's margin: its handle's, at most half the validity it was last
 * granted (a renewal goes out a third of the way in). */
static int64_t margin_of(const struct dlock__hold *h)
{
    int64_t m = h->via->at_risk_margin_ms;
    return h->valid_for > 0 && m > h->valid_for / 2 ? h->valid_for / 2 : m;
}

/* Queue H's at-risk call, VALIDITY ms left; false when out of memory. */
static bool queue_at_risk(dlock_client *c, struct dlock__hold *h, int64_t validity)
{
    char why[DLOCK__WHY_MAX + 128];
    const char *what = h->sem ? "semaphore permit of" : "lock";
    if (h->fixed_lease)
        snprintf(why, sizeof why, "%s '%s' at risk: its fixed lease of %lld ms is not renewed",
                 what, h->name, (long long)h->lease_ms);
    else if (h->renew_why)
        snprintf(why, sizeof why, "%s '%s' at risk: renewal failing: %s", what, h->name,
                 h->renew_why);
    else if (h->renewing)
        snprintf(why, sizeof why, "%s '%s' at risk: its renewal is unanswered", what, h->name);
    else
        snprintf(why, sizeof why, "%s '%s' at risk: no renewal confirmed in time", what, h->name);
    struct dlock__call *call = call_new(h->via, why);
    if (!call)
        return false;
    call->hold = h;
    call->at_risk_fn = h->via->at_risk_fn;
    call->arg = h->via->at_risk_arg;
    call->validity_ms = validity;
    call_append(&c->cb, call);
    return true;
}

/* Queue the at-risk call of every hold whose validity fell to its
 * handle's margin (mutex held); when the next one is due. A hold told
 * stays told until a confirmed renewal lifts it above the margin again
 * (the keeper wakes this thread then). A hold past its validity is the
 * keeper's to declare lost: no call (a validity of 0 is no warning). */
static int64_t at_risk_scan(dlock_client *c)
{
    int64_t now = dlock__now_ms(), next = DLOCK__NEVER;
    for (size_t b = 0; b < DLOCK__BUCKETS; b++)
        for (struct dlock__entry *e = c->buckets[b]; e; e = e->next)
            for (struct dlock__hold *h = e->holds; h; h = h->next) {
                if (h->state != DLOCK__HELD || !h->lease_ms || h->give_back || !h->via ||
                    !h->via->at_risk_fn || h->valid_until == DLOCK__NEVER)
                    continue;
                int64_t left = h->valid_until - now, margin = margin_of(h);
                if (left > margin) {
                    h->at_risk = false;
                    if (h->valid_until - margin < next)
                        next = h->valid_until - margin;
                } else if (h->at_risk || left <= 0) {
                    continue;
                } else if (queue_at_risk(c, h, left)) {
                    h->at_risk = true;
                } else if (now + 100 < next) {
                    next = now + 100; /* no memory: try again */
                }
            }
    return next;
}

static void *callbacks_main(void *arg)
{
    dlock_client *c = arg;
    struct dlock__callbacks *cb = &c->cb;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        int64_t next = cb->watchers && !cb->stop ? at_risk_scan(c) : DLOCK__NEVER;
        struct dlock__call *call = cb->head;
        if (!call) {
            if (cb->stop)
                break;
            if (next == DLOCK__NEVER) {
                pthread_cond_wait(&cb->cv, &c->mu);
            } else {
                struct timespec ts = {(time_t)(next / 1000), (long)(next % 1000) * 1000000L};
                pthread_cond_timedwait(&cb->cv, &c->mu, &ts);
            }
            continue;
        }
        cb->head = call->next;
        if (!cb->head)
            cb->tail = NULL;
        cb->current = call->l;
        pthread_mutex_unlock(&c->mu);
        if (call->at_risk_fn)
            call->at_risk_fn(call->l, call->validity_ms, call->why, call->arg);
        else if (call->contended_fn)
            call->contended_fn(call->l, call->why, call->arg);
        else
            call->lost_fn(call->l, call->why, call->arg);
        /* The handle may be gone now (the callback freed it): never
         * touch call->l again. */
        free(call->why);
        free(call);
        pthread_mutex_lock(&c->mu);
        cb->current = NULL;
        pthread_cond_broadcast(&cb->cv);
    }
    cb->running = false; /* our id may be reused once we are gone */
    pthread_mutex_unlock(&c->mu);
    dlock__client_unref(c); /* may be the last: a callback closed the client */
    return NULL;
}

/* Start C's callback thread if it is not running (mutex held). */
static int callbacks_start(dlock_client *c)
{
    struct dlock__callbacks *cb = &c->cb;
    if (cb->running)
        return DLOCK_OK;
    cb->stop = false;
    dlock__client_ref(c); /* the thread's, dropped as it ends */
    int err = pthread_create(&cb->thread, NULL, callbacks_main, c);
    if (err) {
        __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL); /* never the last */
        return dlock__errno(DLOCK_ENOMEM, err, "%s: cannot start the callback thread",
                            c->url.redacted);
    }
    cb->running = true;
    return DLOCK_OK;
}

int dlock__callback_queue(dlock_client *c, dlock_lock *l, const char *why)
{
    struct dlock__call *call = call_new(l, why);
    if (!call || callbacks_start(c)) {
        if (call)
            free(call->why);
        free(call);
        return DLOCK_ENOMEM;
    }
    call->lost_fn = l->lost_fn;
    call->arg = l->lost_arg;
    call_append(&c->cb, call);
    return DLOCK_OK;
}

/* Drop the queued calls of handle L (NULL: any) for hold H (NULL: any,
 * the losses included). */
static void drop_calls(struct dlock__callbacks *cb, const dlock_lock *l,
                       const struct dlock__hold *h)
{
    struct dlock__call **p = &cb->head, *call;
    cb->tail = NULL;
    while ((call = *p)) {
        if ((!l || call->l == l) && (!h || call->hold == h)) {
            *p = call->next;
            free(call->why);
            free(call);
        } else {
            cb->tail = call;
            p = &call->next;
        }
    }
}

bool dlock__callback_thread(const dlock_client *c)
{
    return c->cb.running && pthread_equal(pthread_self(), c->cb.thread);
}

void dlock__callback_forget(dlock_client *c, dlock_lock *l)
{
    struct dlock__callbacks *cb = &c->cb;
    if (l->at_risk_fn)
        cb->watchers--;
    l->at_risk_fn = NULL;
    drop_calls(cb, l, NULL);
    if (dlock__callback_thread(c))
        return; /* from a callback: it may be L's own, which cannot end first */
    while (cb->current == l)
        pthread_cond_wait(&cb->cv, &c->mu);
}

void dlock__callback_forget_hold(dlock_client *c, const struct dlock__hold *h)
{
    drop_calls(&c->cb, NULL, h);
}

void dlock__callback_watch(dlock_client *c, const struct dlock__hold *h)
{
    if (h->via && h->via->at_risk_fn && c->cb.running)
        pthread_cond_broadcast(&c->cb.cv);
}

int dlock_lock_on_at_risk(dlock_lock *l, int64_t margin_ms, dlock_at_risk_fn fn, void *arg)
{
    dlock__msg_clear();
    if (!l)
        return dlock__err(DLOCK_EINVAL, "dlock_lock_on_at_risk: the lock is NULL");
    dlock_client *c = l->c;
    int rc = dlock__check_client(c);
    if (rc)
        return rc;
    if (!(c->be->caps & DLOCK__CAP_LEASES))
        return dlock__err(DLOCK_ENOTSUP,
                          "lock '%s': the %s backend's holds have no lease to run out, so none "
                          "is ever at risk",
                          l->e->name, c->be->name);
    if (fn && (margin_ms < 1 || margin_ms > 365LL * 86400000))
        return dlock__err(DLOCK_EINVAL,
                          "lock '%s': an at-risk margin of %lld ms is not from 1 ms to a year",
                          l->e->name, (long long)margin_ms);
    pthread_mutex_lock(&c->mu);
    rc = fn ? callbacks_start(c) : DLOCK_OK;
    if (!rc) {
        c->cb.watchers += (fn != NULL) - (l->at_risk_fn != NULL);
        l->at_risk_fn = fn;
        l->at_risk_arg = arg;
        l->at_risk_margin_ms = margin_ms;
        pthread_cond_broadcast(&c->cb.cv); /* time its holds now */
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ------------------------------------------------------------ contended */

/* Most waiters remembered per hold: one that comes back after more have
 * come since is told again. */
#define CONTENDERS_MAX 64

/* Whether H's handle was told of WHO already; if not, note it (mutex
 * held). False when out of memory: told again, never left untold. */
static bool contender_known(struct dlock__hold *h, const char *who)
{
    for (size_t i = 0; i < h->ncontenders; i++)
        if (strcmp(h->contenders[i], who) == 0)
            return true;
    char *copy = strdup(who);
    if (!copy)
        return false;
    if (h->ncontenders == CONTENDERS_MAX) {
        free(h->contenders[0]);
        memmove(h->contenders, h->contenders + 1, --h->ncontenders * sizeof *h->contenders);
    }
    char **grown = realloc(h->contenders, (h->ncontenders + 1) * sizeof *grown);
    if (!grown) {
        free(copy);
        return false;
    }
    h->contenders = grown;
    h->contenders[h->ncontenders++] = copy;
    return false;
}

/* H's hold of TOKEN, held, registered or about to be (mutex held); NULL:
 * none. */
static struct dlock__hold *registered(dlock_client *c, const struct dlock__hold *h, uint64_t token)
{
    for (struct dlock__hold *x = c->contend_pending; x; x = x->pending_next)
        if (x == h)
            return x->token == token ? x : NULL;
    for (size_t b = 0; b < DLOCK__BUCKETS; b++)
        for (struct dlock__entry *e = c->buckets[b]; e; e = e->next)
            for (struct dlock__hold *x = e->holds; x; x = x->next)
                if (x == h)
                    return x->token == token && x->state == DLOCK__HELD && !x->give_back ? x : NULL;
    return NULL;
}

bool dlock__hold_contended(struct dlock_client *c, const struct dlock__hold *h, uint64_t token,
                           const char *who)
{
    pthread_mutex_lock(&c->mu);
    struct dlock__hold *x = registered(c, h, token);
    if (x && who && x->via && x->via->contended_fn && !c->closed && !contender_known(x, who)) {
        struct dlock__call *call = call_new(x->via, who);
        if (call && callbacks_start(c) == DLOCK_OK) {
            call->hold = x;
            call->contended_fn = x->via->contended_fn;
            call->arg = x->via->contended_arg;
            call_append(&c->cb, call);
            dlock__log(c, DLOCK_LOG_INFO, "lock '%s' contended: %s waits", x->name, who);
        } else if (call) {
            free(call->why);
            free(call);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return x != NULL;
}

void dlock__contend_watch(dlock_client *c, dlock_lock *l, struct dlock__hold *h)
{
    if (!DLOCK__OP(c->be, contend, watch) || h->sem || h->elect || h->mode != DLOCK_EXCLUSIVE)
        return;
    pthread_mutex_lock(&c->mu);
    bool wanted = l->contended_fn != NULL;
    if (wanted) {
        h->pending_next = c->contend_pending;
        c->contend_pending = h;
    }
    pthread_mutex_unlock(&c->mu);
    if (!wanted)
        return;
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    if (c->be->contend->watch(c->bstate, h))
        dlock__log(c, DLOCK_LOG_WARN, "lock '%s': its waiters are not watched: %s", h->name,
                   dlock_errmsg());
    dlock__errmsg_restore(DLOCK_OK, msg);
}

void dlock__contend_unpend(dlock_client *c, struct dlock__hold *h, bool registered_now)
{
    for (struct dlock__hold **p = &c->contend_pending; *p; p = &(*p)->pending_next)
        if (*p == h) {
            *p = h->pending_next;
            h->pending_next = NULL;
            if (!registered_now)
                drop_calls(&c->cb, NULL, h);
            return;
        }
}

int dlock_lock_on_contended(dlock_lock *l, dlock_contended_fn fn, void *arg)
{
    dlock__msg_clear();
    if (!l)
        return dlock__err(DLOCK_EINVAL, "dlock_lock_on_contended: the lock is NULL");
    dlock_client *c = l->c;
    int rc = dlock__check_client(c);
    if (rc)
        return rc;
    if (fn && !c->be->contend)
        return dlock__err(DLOCK_ENOTSUP, "lock '%s': %s", l->e->name,
                          c->be->no_contend_why ? c->be->no_contend_why
                                                : "this backend cannot see who waits");
    if (fn && (l->mode != DLOCK_EXCLUSIVE || l->sem || l->elect))
        return dlock__err(DLOCK_ENOTSUP,
                          "lock '%s': only exclusive plain locks are told who waits, not %s",
                          l->e->name,
                          l->sem     ? "a semaphore's permits"
                          : l->elect ? "a campaign"
                                     : "shared holds");
    if (fn && c->be->contend->able && c->bstate && (rc = c->be->contend->able(c->bstate, l->fair)))
        return rc;
    pthread_mutex_lock(&c->mu);
    rc = fn ? callbacks_start(c) : DLOCK_OK;
    if (!rc) {
        l->contended_fn = fn;
        l->contended_arg = arg;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void dlock__callbacks_stop(dlock_client *c)
{
    struct dlock__callbacks *cb = &c->cb;
    pthread_mutex_lock(&c->mu);
    bool running = cb->running, self = dlock__callback_thread(c);
    cb->stop = true;
    pthread_cond_broadcast(&cb->cv);
    pthread_mutex_unlock(&c->mu);
    if (running && self) {
        pthread_detach(cb->thread);
        return;
    }
    if (running)
        pthread_join(cb->thread, NULL);
    cb->running = false;
}

int dlock__user_lost_set(dlock_client *c, struct dlock__user_lost *u, const char *what,
                         void (*fn)(void), void *arg)
{
    dlock__msg_clear();
    if (!u)
        return dlock__err(DLOCK_EINVAL, "%s is NULL", what);
    int rc = dlock__check_fork(c);
    if (rc)
        return rc;
    pthread_mutex_lock(&c->mu);
    u->fn = fn;
    u->arg = arg;
    pthread_mutex_unlock(&c->mu);
    return DLOCK_OK;
}

struct dlock__user_lost dlock__user_lost_get(dlock_client *c, const struct dlock__user_lost *u)
{
    pthread_mutex_lock(&c->mu);
    struct dlock__user_lost copy = *u;
    pthread_mutex_unlock(&c->mu);
    return copy;
}
