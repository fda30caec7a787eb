/* keeper.c -- the one thread per client that acts without a caller.
 *
 * It renews every leased hold of the client at lease/3, handing the
 * backend all holds that are due in one renew() call so it can pipeline
 * them; declares a hold lost when the backend says it is gone or when its
 * validity deadline (send time of the last confirmed acquire or renewal +
 * lease - drift, on the monotonic clock) passes unconfirmed; and runs each
 * lost callback exactly once, on the callback thread (callbacks.c) so
 * that no callback can hold up a renewal; and does the cleanups backends owe after
 * ambiguous replies (cleanup.c) between renewals. It sleeps on a condition variable until the
 * next renewal or deadline is due, so an idle client costs nothing.
 * Started with the first leased hold or queued cleanup; stopped when the
 * client closes. It notes what a renewal failed with and clears it, with
 * the at-risk mark, when one is confirmed; the at-risk calls themselves
 * are timed by the callback thread (callbacks.c), since this one may sit
 * in a renewal that hangs just when a hold falls at risk.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

/* H confirmed, valid until VALID_UNTIL (mutex held): no renewal failing;
 * a hold told at risk is looked at again by the callback thread, which
 * stopped timing it then (callbacks.c: above its margin now, it is
 * timed again). */
static void confirm(dlock_client *c, struct dlock__hold *h, int64_t sent_ms, int64_t valid_until)
{
    h->valid_until = valid_until;
    h->valid_for = valid_until - sent_ms;
    if (h->at_risk)
        pthread_cond_broadcast(&c->cb.cv);
    free(h->renew_why);
    h->renew_why = NULL;
}

void dlock__hold_confirmed(struct dlock_client *c, struct dlock__hold *h, int64_t sent_ms)
{
    if (!h->lease_ms)
        return;
    pthread_mutex_lock(&c->mu);
    confirm(c, h, sent_ms, sent_ms + h->lease_ms - c->opts.drift_ms);
    h->renew_at = h->fixed_lease ? DLOCK__NEVER : sent_ms + h->lease_ms / 3;
    pthread_mutex_unlock(&c->mu);
}

int dlock__hold_granted(struct dlock_client *c, struct dlock__hold *h, int64_t sent_ms,
                        int (*reconfirm)(void *arg), void *arg)
{
    if (h->lease_ms > 0 && dlock__now_ms() - sent_ms > h->lease_ms / 3) {
        int64_t again = dlock__now_ms();
        int rc = reconfirm(arg);
        if (rc)
            return rc;
        sent_ms = again;
    }
    dlock__hold_confirmed(c, h, sent_ms);
    return DLOCK_OK;
}

void dlock__hold_confirmed_lease(struct dlock_client *c, struct dlock__hold *h, int64_t sent_ms,
                                 int64_t lease_ms)
{
    pthread_mutex_lock(&c->mu);
    if (h->lease_ms && lease_ms > 0)
        h->lease_ms = lease_ms;
    pthread_mutex_unlock(&c->mu);
    dlock__hold_confirmed(c, h, sent_ms);
}

void dlock__hold_confirmed_short(struct dlock_client *c, struct dlock__hold *h, int64_t sent_ms,
                                 int64_t granted_ms)
{
    if (!h->lease_ms || granted_ms >= h->lease_ms) {
        dlock__hold_confirmed(c, h, sent_ms);
        return;
    }
    pthread_mutex_lock(&c->mu);
    /* the drift margin in proportion to the shorter time */
    confirm(c, h, sent_ms, sent_ms + granted_ms - c->opts.drift_ms * granted_ms / h->lease_ms);
    /* renewed as a lease that short would be (a hold released sooner,
     * the usual case, costs no renewal), which extends it to the lease */
    h->renew_at = sent_ms + granted_ms / 3;
    pthread_mutex_unlock(&c->mu);
}

static void mark_lost(dlock_client *c, struct dlock__hold *h, const char *why)
{
    if (h->state == DLOCK__LOST)
        return;
    h->state = DLOCK__LOST;
    dlock__callback_forget_hold(c, h); /* no at-risk call after the loss */
    free(h->lost_why);
    h->lost_why = strdup(why && *why ? why : "no reason given");
    DLOCK__COUNT(c, losses, 1);
    dlock__log(c, DLOCK_LOG_ERROR, "%s '%s' lost: %s", h->sem ? "semaphore permit of" : "lock",
               h->name, why && *why ? why : "no reason given");
}

/* Called by a backend's own thread (a ZooKeeper watcher learning that the
 * session expired, say), so it must not trust H: it marks H only when H
 * is still in the registry -- a hold being acquired is not there yet (the
 * acquire itself must fail), a released one no longer -- and never reads
 * it otherwise. The keeper (started here if it is not running: the file
 * backend's holds have no lease to start it) queues the callbacks. */
void dlock__hold_lost(struct dlock_client *c, struct dlock__hold *h, const char *why)
{
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    pthread_mutex_lock(&c->mu);
    bool marked = false;
    for (size_t b = 0; b < DLOCK__BUCKETS; b++)
        for (struct dlock__entry *e = c->buckets[b]; e; e = e->next)
            for (struct dlock__hold *x = e->holds; x; x = x->next)
                if ((!h || x == h) && x->state == DLOCK__HELD) {
                    mark_lost(c, x, why);
                    marked = true;
                }
    if (marked && dlock__keeper_start(c) == DLOCK_OK)
        pthread_cond_signal(&c->keeper_cv);
    pthread_mutex_unlock(&c->mu);
    dlock__errmsg_restore(DLOCK_OK, msg);
}

void dlock__keeper_kick_for(struct dlock_client *c, const struct dlock__hold *h)
{
    int64_t due = h->renew_at < h->valid_until ? h->renew_at : h->valid_until;
    /* An awake keeper scans again before it sleeps. */
    if (c->keeper_asleep_until && due < c->keeper_asleep_until)
        pthread_cond_signal(&c->keeper_cv);
}

/* Count a renewal of H confirmed LATENCY ms after it was sent, LEFT ms
 * before the validity deadline it pushed back; one that came with less
 * than a sixth of the lease left is worth a warning (a slow or flapping
 * backend: the next one may not make it). */
static void note_renewal(dlock_client *c, const struct dlock__hold *h, int64_t latency,
                         int64_t left)
{
    uint64_t ms = latency > 0 ? (uint64_t)latency : 0;
    DLOCK__COUNT(c, renewals, 1);
    DLOCK__COUNT(c, renewal_ms, ms);
    uint64_t max = __atomic_load_n(&c->stats.renewal_max_ms, __ATOMIC_RELAXED);
    while (ms > max && !__atomic_compare_exchange_n(&c->stats.renewal_max_ms, &max, ms, false,
                                                    __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
    if (left < h->lease_ms / 6)
        dlock__log(c, DLOCK_LOG_WARN,
                   "lock '%s': renewal confirmed only %lld ms before its validity deadline "
                   "(lease %lld ms, renewal took %lld ms)",
                   h->name, (long long)left, (long long)h->lease_ms, (long long)latency);
    else
        dlock__log(c, DLOCK_LOG_DEBUG, "lock '%s': renewed in %lld ms", h->name,
                   (long long)latency);
}

/* One pass over the holds (mutex held): expire, collect due renewals,
 * queue lost callbacks for the callback thread, and return when the next
 * pass is due. */
static int64_t scan(dlock_client *c, struct dlock__hold ***due, size_t *ndue, size_t *cap)
{
    int64_t now = dlock__now_ms(), next = DLOCK__NEVER;
    bool really_due = false;
    for (size_t b = 0; b < DLOCK__BUCKETS; b++)
        for (struct dlock__entry *e = c->buckets[b]; e; e = e->next)
            for (struct dlock__hold *h = e->holds; h; h = h->next) {
                if (h->state == DLOCK__HELD && h->lease_ms && now >= h->valid_until) {
                    char why[200];
                    if (h->fixed_lease)
                        snprintf(why, sizeof why, "its fixed lease of %lld ms ended",
                                 (long long)h->lease_ms);
                    else
                        snprintf(why, sizeof why,
                                 "no renewal was confirmed by its validity deadline "
                                 "(lease %lld ms)",
                                 (long long)h->lease_ms);
                    mark_lost(c, h, why);
                }
                if (h->state == DLOCK__LOST) {
                    if (h->lost_reported)
                        continue;
                    if (h->via && h->via->lost_fn &&
                        dlock__callback_queue(c, h->via, h->lost_why)) {
                        if (now + 100 < next)
                            next = now + 100; /* no memory or thread: retry */
                        continue;
                    }
                    h->lost_reported = true;
                    continue;
                }
                if (!h->lease_ms || h->renewing)
                    continue;
                if (h->valid_until < next)
                    next = h->valid_until;
                /* Holds due within a sixth of their lease join the batch
                 * early (many holds, one round trip), but only when some
                 * hold is really due: see the end of this function. */
                if (h->renew_at <= now + h->lease_ms / 6) {
                    if (*ndue == *cap) {
                        size_t ncap = *cap ? *cap * 2 : 64;
                        struct dlock__hold **n = realloc(*due, ncap * sizeof *n);
                        if (!n)
                            continue; /* next pass */
                        *due = n;
                        *cap = ncap;
                    }
                    (*due)[(*ndue)++] = h;
                    h->renewing = true;
                    really_due |= h->renew_at <= now;
                } else if (h->renew_at < next) {
                    next = h->renew_at;
                }
            }
    if (*ndue && !really_due) {
        for (size_t i = 0; i < *ndue; i++) {
            (*due)[i]->renewing = false;
            if ((*due)[i]->renew_at < next)
                next = (*due)[i]->renew_at;
        }
        *ndue = 0;
    }
    return next;
}

static void *keeper_main(void *arg)
{
    dlock_client *c = arg;
    struct dlock__hold **due = NULL;
    int *results = NULL;
    int64_t *before = NULL; /* each hold's validity deadline before its renewal */
    char(*whys)[DLOCK__WHY_MAX] = NULL;
    size_t cap = 0, rcap = 0;
    pthread_mutex_lock(&c->mu);
    while (!c->keeper_stop) {
        size_t ndue = 0;
        int64_t next = scan(c, &due, &ndue, &cap);
        if (ndue) {
            if (rcap < ndue) {
                int *n = realloc(results, cap * sizeof *n);
                char(*w)[DLOCK__WHY_MAX] = n ? realloc(whys, cap * sizeof *w) : NULL;
                int64_t *v = w ? realloc(before, cap * sizeof *v) : NULL;
                if (n)
                    results = n;
                if (w)
                    whys = w;
                if (v)
                    before = v;
                if (!n || !w || !v) {
                    for (size_t i = 0; i < ndue; i++)
                        due[i]->renewing = false;
                    ndue = 0;
                } else {
                    rcap = cap;
                }
            }
            int64_t deadline = DLOCK__NEVER;
            for (size_t i = 0; i < ndue; i++) {
                results[i] = DLOCK_EIO;
                whys[i][0] = '\0';
                before[i] = due[i]->valid_until;
                if (due[i]->valid_until < deadline)
                    deadline = due[i]->valid_until;
            }
            struct dlock__renew_batch b = {due, ndue, deadline, results, whys};
            pthread_mutex_unlock(&c->mu);
            int64_t sent = dlock__now_ms();
            if (ndue && c->be->renew)
                c->be->renew(c->bstate, &b);
            pthread_mutex_lock(&c->mu);
            int64_t now = dlock__now_ms();
            for (size_t i = 0; i < ndue; i++) {
                struct dlock__hold *h = due[i];
                h->renewing = false;
                if (h->give_back) {
                    /* its owner gave it up meanwhile (release.c's
                     * dlock__release_within): no loss to report, no
                     * renewal to note; the holds after it stay ours
                     * (renewing) while the mutex is dropped */
                    dlock__hold_give_back(c, h);
                    continue;
                }
                if (results[i] == DLOCK_ELOST)
                    mark_lost(c, h, whys[i][0] ? whys[i] : "the backend reports the lock gone");
                else if (results[i] != DLOCK_OK) {
                    /* Transient: try again soon, until the deadline. */
                    int64_t retry = h->lease_ms / 10 < 1000 ? h->lease_ms / 10 : 1000;
                    h->renew_at = now + (retry > 10 ? retry : 10);
                    free(h->renew_why); /* what an at-risk call will say */
                    h->renew_why = strdup(whys[i][0] ? whys[i] : "no reason given");
                    DLOCK__COUNT(c, renewal_failures, 1);
                    dlock__log(c, DLOCK_LOG_WARN,
                               "lock '%s': renewal failed, %lld ms before its validity deadline, "
                               "retrying in %lld ms: %s",
                               h->name, (long long)(before[i] - now),
                               (long long)(h->renew_at - now), whys[i]);
                } else {
                    note_renewal(c, h, now - sent, before[i] - now);
                }
            }
            pthread_cond_broadcast(&c->renew_cv);
        }
        if (ndue)
            continue;
        /* Owed cleanups in a bounded slice: at most an op timeout, never
         * past the next renewal or validity deadline, nor past close's
         * deadline once the client is closing. */
        if (c->cleanup_head) {
            int64_t now = dlock__now_ms();
            int64_t slice = now + c->opts.op_timeout_ms;
            if (next < slice)
                slice = next;
            if (c->close_deadline && c->close_deadline < slice)
                slice = c->close_deadline;
            if (slice > now && dlock__cleanup_run(c, slice))
                continue;
            int64_t due_at = dlock__cleanup_next(c);
            if (due_at < next)
                next = due_at;
        }
        if (next == DLOCK__NEVER) {
            c->keeper_asleep_until = DLOCK__NEVER;
            pthread_cond_wait(&c->keeper_cv, &c->mu);
        } else {
            struct timespec ts = {(time_t)(next / 1000), (long)(next % 1000) * 1000000L};
            c->keeper_asleep_until = next;
            pthread_cond_timedwait(&c->keeper_cv, &c->mu, &ts);
        }
        c->keeper_asleep_until = 0;
    }
    pthread_mutex_unlock(&c->mu);
    free(due);
    free(results);
    free(before);
    free(whys);
    return NULL;
}

int dlock__renew_result(struct dlock__renew_batch *b, size_t k, int rc)
{
    b->result[k] = rc;
    if (rc != DLOCK_OK)
        snprintf(b->why[k], sizeof b->why[k], "%s", dlock_errmsg());
    return rc;
}

int dlock__keeper_start(struct dlock_client *c)
{
    if (c->keeper_running)
        return DLOCK_OK;
    if (c->closed) /* closing stopped it for good */
        return dlock__err(DLOCK_EMISUSE, "%s: the client is closing", c->url.redacted);
    c->keeper_stop = false;
    int err = pthread_create(&c->keeper, NULL, keeper_main, c);
    if (err)
        return dlock__errno(DLOCK_ENOMEM, err, "%s: cannot start the keeper thread",
                            c->url.redacted);
    c->keeper_running = true;
    return DLOCK_OK;
}

void dlock__keeper_stop(struct dlock_client *c)
{
    pthread_mutex_lock(&c->mu);
    bool running = c->keeper_running;
    c->keeper_stop = true;
    pthread_cond_signal(&c->keeper_cv);
    pthread_mutex_unlock(&c->mu);
    if (running)
        pthread_join(c->keeper, NULL);
    c->keeper_running = false;
}
