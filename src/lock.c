/* lock.c -- lock handles, the per-name registry, reentrancy, the local
 * queue and the acquire. How a hold ends (release, downgrade, the
 * keeper's give-back, closing) is release.c's.
 *
 * Holds are kept per (client, name, thread) in the client's registry, not
 * per handle: two handles on one name used by one thread re-enter rather
 * than deadlock against each other, and the keeper finds every hold in one
 * place. A handle is a view on a registry entry plus its own options (lease,
 * lost callback) and the list of acquires in progress through it, which is
 * what dlock_lock_cancel() reaches.
 *
 * For backends whose server sees one owner per client and name (an etcd
 * lease, a ZooKeeper session: DLOCK__CAP_CLIENT_OWNER), threads of the
 * client first queue here, so a second thread never believes it holds the
 * key the first one holds.
 *
 * The owner of a hold is a thread (its tid) or, for a handle made with
 * DLOCK_LOCK_HANDLE_OWNED, the handle: an owner id above every thread id,
 * given once per handle. The registry, reentrancy and the backends see
 * only the id (h->tid), so handle-owned holds need nothing of a backend.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

unsigned dlock__hash(const char *s)
{
    unsigned h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

/* Find or make the entry for NAME (client mutex held). */
static struct dlock__entry *entry_get(dlock_client *c, const char *name)
{
    struct dlock__entry **b = &c->buckets[dlock__hash(name) % DLOCK__BUCKETS];
    for (struct dlock__entry *e = *b; e; e = e->next)
        if (strcmp(e->name, name) == 0)
            return e;
    struct dlock__entry *e = calloc(1, sizeof *e);
    if (!e || !(e->name = strdup(name))) {
        free(e);
        return NULL;
    }
    dlock__waitset_init(&e->local);
    e->next = *b;
    *b = e;
    return e;
}

/* Drop a reference; free the entry once nothing uses it (mutex held). */
void dlock__entry_put(dlock_client *c, struct dlock__entry *e)
{
    if (--e->refs || e->holds || e->busy || e->readers)
        return;
    struct dlock__entry **p = &c->buckets[dlock__hash(e->name) % DLOCK__BUCKETS];
    while (*p != e)
        p = &(*p)->next;
    *p = e->next;
    dlock__entry_free(e);
}

void dlock__entry_free(struct dlock__entry *e)
{
    dlock__waitset_destroy(&e->local);
    free(e->name);
    free(e);
}

size_t dlock__local_waiters(dlock_lock *l, uint64_t *wakes)
{
    pthread_mutex_lock(&l->c->mu);
    size_t n = dlock__waitset_count(&l->e->local);
    if (wakes) {
        pthread_mutex_lock(&l->e->local.mu);
        *wakes = l->e->local.wakes;
        pthread_mutex_unlock(&l->e->local.mu);
    }
    pthread_mutex_unlock(&l->c->mu);
    return n;
}

/* The hold of owner TID on E; never one being given back by the keeper
 * (give_back): its owner gave it up. */
struct dlock__hold *dlock__hold_of(struct dlock__entry *e, long tid)
{
    for (struct dlock__hold *h = e->holds; h; h = h->next)
        if (h->tid == tid && !h->give_back)
            return h;
    return NULL;
}

/* Owner ids of handle-owned handles: above any Linux thread id (at most
 * 2^22), positive so a backend writes them as digits (Redis fields
 * <uuid>:<digits>), unique in the process. */
static atomic_long next_handle_owner = (long)1 << (sizeof(long) > 4 ? 40 : 30);

/* Who holds through L when the calling thread acts: the handle or the
 * thread. */
long dlock__owner_of(const dlock_lock *l)
{
    return l->owner ? l->owner : dlock__tid();
}

static const char *owner_word(const dlock_lock *l)
{
    return l->owner ? "handle" : "thread";
}

/* DLOCK_ENOTOWNER, said: L's owner holds nothing on its name. */
int dlock__not_held(const dlock_lock *l)
{
    return dlock__err(DLOCK_ENOTOWNER, "lock '%s' is not held by this %s", l->e->name,
                      owner_word(l));
}

void dlock__hold_free(struct dlock__hold *h)
{
    if (h) {
        free(h->lost_why);
        free(h->renew_why);
        for (size_t i = 0; i < h->ncontenders; i++)
            free(h->contenders[i]);
        free(h->contenders);
        free(h);
    }
}

static int check_name(const char *name)
{
    if (!name || !*name)
        return dlock__err(DLOCK_EINVAL, "lock name is empty");
    size_t len = strnlen(name, DLOCK_NAME_MAX + 1);
    if (len > DLOCK_NAME_MAX)
        return dlock__err(DLOCK_EINVAL, "lock name '%.40s...' is longer than %d bytes", name,
                          DLOCK_NAME_MAX);
    return DLOCK_OK;
}

int dlock_lock_new(dlock_client *c, const char *name, dlock_mode mode, unsigned flags,
                   dlock_lock **out)
{
    dlock__msg_clear();
    if (!out)
        return dlock__err(DLOCK_EINVAL, "dlock_lock_new: out is NULL");
    *out = NULL;
    int rc = dlock__check_client(c);
    if (rc || (rc = check_name(name)))
        return rc;
    if (!c->connected)
        return dlock__err(DLOCK_EMISUSE, "%s: connect the client before making locks",
                          c->url.redacted);
    if (mode != DLOCK_EXCLUSIVE && mode != DLOCK_SHARED)
        return dlock__err(DLOCK_EINVAL, "lock '%s': unknown mode %d", name, (int)mode);
    if (flags & ~(DLOCK_LOCK_HANDLE_OWNED | DLOCK_LOCK_FAIR))
        return dlock__err(DLOCK_EINVAL, "lock '%s': unknown flags 0x%x (reserved, must be 0)",
                          name, flags & ~(DLOCK_LOCK_HANDLE_OWNED | DLOCK_LOCK_FAIR));
    /* What the backend cannot do is refused here, before it is called. */
    if (mode == DLOCK_SHARED && !(c->be->caps & DLOCK__CAP_SHARED))
        return dlock__err(DLOCK_ENOTSUP, "lock '%s': the %s backend has no shared mode yet", name,
                          c->be->name);
    if ((flags & DLOCK_LOCK_FAIR) && !(c->be->caps & DLOCK__CAP_FAIR))
        return dlock__err(DLOCK_ENOTSUP,
                          "lock '%s': the %s backend cannot serve waiters in arrival order "
                          "(DLOCK_LOCK_FAIR)",
                          name, c->be->name);
    dlock_lock *l = calloc(1, sizeof *l);
    if (!l)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    pthread_mutex_lock(&c->mu);
    struct dlock__entry *e = entry_get(c, name);
    if (e)
        e->refs++;
    pthread_mutex_unlock(&c->mu);
    if (!e) {
        free(l);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    l->c = c;
    l->e = e;
    l->mode = mode;
    dlock__client_ref(c); /* the client's memory outlives its handles */
    l->fair = flags & DLOCK_LOCK_FAIR;
    if (flags & DLOCK_LOCK_HANDLE_OWNED) {
        l->owner = atomic_fetch_add(&next_handle_owner, 1);
        dlock__waitset_init(&l->turn);
    }
    *out = l;
    return DLOCK_OK;
}

int dlock__handle_new(dlock_client *c, const char *name, unsigned lock_flags,
                      dlock__kind_check_fn check, unsigned count, unsigned flags, dlock_lock **out)
{
    int rc = dlock_lock_new(c, name, DLOCK_EXCLUSIVE, lock_flags, out);
    if (rc || !check || !(rc = check(c, name, count, flags)))
        return rc;
    dlock_lock_free(*out);
    *out = NULL;
    return rc;
}

void *dlock__handle_wrap(dlock_client *c, struct dlock__handle_request *rq)
{
    rq->out.base = NULL;
    rq->out.rc = dlock__handle_new(c, rq->name, rq->lock_flags, rq->check, rq->count, rq->flags,
                                   &rq->out.base);
    if (rq->out.rc)
        return NULL;
    void *wrapper = calloc(1, rq->size);
    if (!wrapper) {
        dlock_lock_free(rq->out.base);
        rq->out.base = NULL;
        rq->out.rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    return wrapper;
}

int dlock__handle_probe(dlock_client *c, const char *name, dlock__kind_check_fn check,
                        unsigned count, unsigned flags)
{
    dlock_lock *probe = NULL;
    int rc = dlock__handle_new(c, name, 0, check, count, flags, &probe);
    dlock_lock_free(probe);
    return rc;
}

int dlock_lock_set_lease(dlock_lock *l, int64_t lease_ms, unsigned flags)
{
    dlock__msg_clear();
    if (!l)
        return dlock__err(DLOCK_EINVAL, "lock is NULL");
    if (flags & ~DLOCK_LEASE_FIXED)
        return dlock__err(DLOCK_EINVAL, "lock '%s': unknown lease flags %#x", l->e->name, flags);
    if ((flags & DLOCK_LEASE_FIXED) && !(l->c->be->caps & DLOCK__CAP_FIXED_LEASE))
        return dlock__err(DLOCK_ENOTSUP,
                          "lock '%s': the %s backend has no fixed leases (a hold there lasts as "
                          "long as the client's session)",
                          l->e->name, l->c->be->name);
    if (lease_ms < 0 || lease_ms > 365LL * 86400000 ||
        (lease_ms > 0 && lease_ms <= l->c->opts.drift_ms))
        return dlock__err(DLOCK_EINVAL,
                          "lock '%s': lease %lld ms must be 0 (the client's) or longer than the "
                          "drift margin (%lld ms) and at most a year",
                          l->e->name, (long long)lease_ms, (long long)l->c->opts.drift_ms);
    int rc = dlock__check_fork(l->c);
    if (rc)
        return rc;
    pthread_mutex_lock(&l->c->mu);
    l->lease_ms = lease_ms;
    l->fixed_lease = flags & DLOCK_LEASE_FIXED;
    pthread_mutex_unlock(&l->c->mu);
    return DLOCK_OK;
}

/* The opening of a public call on L that reads or sets what its client
 * guards: clears the thread's message, refuses a NULL L or another NULL
 * argument (!ARGS_OK; FN, if given, is named) and a forked child's call,
 * then takes the client's mutex. Nonzero: the code, no mutex taken. */
static int lock_enter(dlock_lock *l, bool args_ok, const char *fn)
{
    dlock__msg_clear();
    if ((!l || !args_ok) && fn)
        return dlock__err(DLOCK_EINVAL, "%s: NULL argument", fn);
    if (!l)
        return dlock__err(DLOCK_EINVAL, "lock is NULL");
    int rc = dlock__check_fork(l->c);
    if (!rc)
        pthread_mutex_lock(&l->c->mu);
    return rc;
}

int dlock_lock_on_lost(dlock_lock *l, dlock_lost_fn fn, void *arg)
{
    int rc = lock_enter(l, true, NULL);
    if (rc)
        return rc;
    l->lost_fn = fn;
    l->lost_arg = arg;
    pthread_mutex_unlock(&l->c->mu);
    return DLOCK_OK;
}

const char *dlock_lock_name(const dlock_lock *l)
{
    return l ? l->e->name : NULL;
}

dlock_mode dlock_lock_mode(const dlock_lock *l)
{
    return l ? l->mode : DLOCK_EXCLUSIVE;
}

void dlock__waitref_remove(struct dlock__waitref **list, struct dlock__waitref *r)
{
    while (*list && *list != r)
        list = &(*list)->next;
    if (*list)
        *list = r->next;
}

void dlock__lock_cancel_waits(dlock_lock *l)
{
    for (struct dlock__waitref *r = l->waits; r; r = r->next)
        dlock__wait_cancel(r->w);
    if (l->job_ahead)
        l->job_canceled = true;
}

void dlock__lock_job_ahead(dlock_lock *l)
{
    l->job_ahead = true;
    l->job_canceled = false;
}

int dlock_lock_cancel(dlock_lock *l)
{
    int rc = lock_enter(l, true, NULL);
    if (rc)
        return rc;
    dlock__lock_cancel_waits(l);
    pthread_mutex_unlock(&l->c->mu);
    return DLOCK_OK;
}

/* CLIENT_OWNER: may a thread claim E's name in SHARED (or exclusive)
 * mode now? Readers of one client go to the server side by side, each
 * with its own key or node; a writer goes alone (mutex held). */
static bool local_free(const struct dlock__entry *e, bool shared)
{
    return !e->busy && (shared || !e->readers);
}

void dlock__local_claim(struct dlock__entry *e, bool shared)
{
    if (shared)
        e->readers++;
    else
        e->busy = true;
}

/* A thread of the name's local holders is done with it (held or gave up
 * acquiring): wake the longest waiting thread to see whether its turn
 * came (mutex held). */
void dlock__local_dequeue(struct dlock__entry *e, bool shared)
{
    if (shared)
        e->readers--;
    else
        e->busy = false;
    dlock__waitset_wake_one(&e->local);
}

/* CLIENT_OWNER backends: wait in arrival order until the name is free for
 * this thread's mode (no other thread of this client holds or is
 * acquiring it; for a reader, no writer), then claim it (mutex held on
 * entry and exit). Only the longest waiting thread claims, so nobody
 * overtakes: a reader behind a waiting writer waits too. A release wakes
 * the first waiter (dlock__local_dequeue); a reader that claims wakes the next,
 * which may be a reader too; one that leaves (timeout, cancel) wakes the
 * next if it was first or had been woken, so a turn is never lost. */
static int local_queue(dlock_client *c, struct dlock__entry *e, struct dlock__wait *w,
                       bool shared)
{
    if (local_free(e, shared) && !dlock__waitset_count(&e->local)) {
        dlock__local_claim(e, shared);
        return DLOCK_OK;
    }
    int rc = dlock__waitset_add(&e->local, w);
    while (!rc) {
        unsigned seq = dlock__wait_seq(w);
        dlock__waitset_consume(&e->local, w);
        if (local_free(e, shared) && dlock__waitset_first(&e->local) == w) {
            dlock__waitset_remove(&e->local, w);
            dlock__local_claim(e, shared);
            if (shared)
                dlock__waitset_wake_one(&e->local); /* another reader may join */
            return DLOCK_OK;
        }
        pthread_mutex_unlock(&c->mu);
        rc = dlock__wait_sleep(w, seq, DLOCK__NEVER);
        pthread_mutex_lock(&c->mu);
        if (rc) {
            bool first = dlock__waitset_first(&e->local) == w;
            if (dlock__waitset_remove(&e->local, w) || first)
                dlock__waitset_wake_one(&e->local); /* the next one's turn, maybe */
        }
    }
    return rc;
}

/* Handle-owned: while another thread acquires through L, wait for its
 * outcome, then re-enter or try; while another thread releases through
 * L, wait until the server has the release (an acquire sent meanwhile
 * carries the same owner id, so Redis would take the dying hold for a
 * re-entry: same token, then deleted by the release) (mutex held on entry and exit; W is on
 * L's list, so dlock_lock_cancel() reaches it, as does a cancel object). */
static int handle_turn(dlock_client *c, dlock_lock *l, struct dlock__wait *w)
{
    int rc = DLOCK_OK;
    while (!rc && ((l->acquiring && !dlock__hold_of(l->e, l->owner)) || l->releasing)) {
        unsigned seq = dlock__wait_seq(w);
        if ((rc = dlock__waitset_add(&l->turn, w)))
            break;
        pthread_mutex_unlock(&c->mu);
        rc = dlock__wait_sleep(w, seq, DLOCK__NEVER);
        pthread_mutex_lock(&c->mu);
        dlock__waitset_remove(&l->turn, w);
    }
    return rc;
}

/* The owner acquiring through L already holds H: re-enter (mutex held).
 * Exclusive then shared re-enters the exclusive hold (a writer may read);
 * shared then exclusive is an upgrade: refused (dlock.h). */
int dlock__reenter(const dlock_lock *l, struct dlock__hold *h)
{
    const char *name = l->e->name;
    if (h->state == DLOCK__LOST)
        return dlock__err(DLOCK_ELOST, "lock '%s': this %s's hold was lost (%s); release it "
                                       "before acquiring again",
                          name, owner_word(l), h->lost_why ? h->lost_why : "no reason given");
    if (h->mode == DLOCK_SHARED && l->mode == DLOCK_EXCLUSIVE)
        return dlock__err(DLOCK_EMISUSE, "lock '%s': this %s holds it shared; an upgrade to "
                                         "exclusive is refused (release the shared hold, then "
                                         "acquire exclusive)",
                          name, owner_word(l));
    if (h->count == UINT32_MAX)
        return dlock__err(DLOCK_EINVAL, "lock '%s': hold count overflow", name);
    h->count++;
    if (h->mode == DLOCK_EXCLUSIVE && l->mode == DLOCK_SHARED)
        h->shared_levels++; /* kept if the exclusive levels go first */
    return DLOCK_OK;
}

/* Exclusive hold H has just gained its first shared level: let the
 * backend prepare a downgrade (its share op, best effort), with the
 * keeper kept off H as for a renewal (mutex held; dropped meanwhile). */
static void hold_share(dlock_client *c, struct dlock__hold *h)
{
    if (!c->be->locks->share)
        return;
    while (h->renewing)
        pthread_cond_wait(&c->renew_cv, &c->mu);
    h->renewing = true;
    pthread_mutex_unlock(&c->mu);
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    c->be->locks->share(c->bstate, h);
    dlock__errmsg_restore(DLOCK_OK, msg);
    pthread_mutex_lock(&c->mu);
    h->renewing = false;
    pthread_cond_broadcast(&c->renew_cv);
}

/* The message of a contention outcome RC of an acquire of E's name that
 * waited WAIT_MS, the name's lock-delay ending at DELAY_UNTIL (monotonic
 * ms; 0: none seen); other codes pass through with their message. */
int dlock__acquire_outcome(struct dlock__entry *e, int rc, int64_t wait_ms, int64_t delay_until)
{
    int64_t delay_left = delay_until ? delay_until - dlock__now_ms() : 0;
    if ((rc == DLOCK_ETIMEDOUT || rc == DLOCK_EBUSY) && delay_left > 0)
        rc = dlock__err(wait_ms == 0 ? DLOCK_EBUSY : rc,
                        "lock '%s' is in its lock-delay for %lld ms more (its last hold ended "
                        "without a clean release)",
                        e->name, (long long)delay_left);
    else if (rc == DLOCK_ETIMEDOUT && wait_ms == 0 && *dlock_errmsg()) {
        /* A request not answered in time, in the backend's words (naming
         * the server): nobody was seen holding the lock. */
        char why[700];
        snprintf(why, sizeof why, "%s", dlock_errmsg());
        rc = dlock__err(DLOCK_ETIMEDOUT, "lock '%s': the try was not answered: %s", e->name, why);
    } else if (rc == DLOCK_ETIMEDOUT && wait_ms == 0)
        rc = dlock__err(DLOCK_EBUSY, "lock '%s' is held by another owner", e->name);
    else if (rc == DLOCK_ETIMEDOUT && *dlock_errmsg()) {
        /* The backend said why (disconnected, say): keep its words. */
        char why[700];
        snprintf(why, sizeof why, "%s", dlock_errmsg());
        rc = dlock__err(DLOCK_ETIMEDOUT, "lock '%s': not acquired within %lld ms: %s", e->name,
                        (long long)wait_ms, why);
    } else if (rc == DLOCK_ETIMEDOUT)
        rc = dlock__err(DLOCK_ETIMEDOUT, "lock '%s': still held by another owner after %lld ms",
                        e->name, (long long)wait_ms);
    else if (rc == DLOCK_ECANCELED)
        rc = dlock__err(DLOCK_ECANCELED, "lock '%s': wait canceled", e->name);
    else if (rc == DLOCK_EBUSY)
        rc = dlock__err(DLOCK_EBUSY, "lock '%s' is held by another owner", e->name);
    return rc;
}

/* Count an acquire that went to the backend (dlock_stats): a hold taken,
 * and whether it slept and for how long, whatever its outcome. */
static void note_acquire(dlock_client *c, const struct dlock__entry *e, const struct dlock__wait *w,
                         int rc, int64_t started)
{
    int64_t took = dlock__now_ms() - started;
    if (rc == DLOCK_OK)
        DLOCK__COUNT(c, acquisitions, 1);
    if (w->slept) {
        DLOCK__COUNT(c, waits, 1);
        DLOCK__COUNT(c, wait_ms, took > 0 ? (uint64_t)took : 0);
    }
    if (rc == DLOCK_OK)
        dlock__log(c, DLOCK_LOG_DEBUG, "lock '%s' acquired%s after %lld ms", e->name,
                   w->slept ? ", waited," : "", (long long)took);
}

int dlock_acquire(dlock_lock *l, int64_t wait_ms)
{
    return dlock_acquire_ex(l, wait_ms, NULL);
}

int dlock_acquire_ex(dlock_lock *l, int64_t wait_ms, dlock_cancel *cancel)
{
    dlock__msg_clear();
    if (!l)
        return dlock__err(DLOCK_EINVAL, "lock is NULL");
    dlock_client *c = l->c;
    struct dlock__entry *e = l->e;
    int rc = dlock__check_client(c);
    if (rc)
        return rc;
    if (wait_ms < 0 && wait_ms != DLOCK_FOREVER)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%s': wait of %lld ms: a wait is DLOCK_TRY (0), a number of ms, "
                          "or DLOCK_FOREVER (-1)",
                          e->name, (long long)wait_ms);
    if (dlock_cancel_fired(cancel))
        return dlock__err(DLOCK_ECANCELED, "lock '%s': canceled before the acquire began", e->name);
    long owner = dlock__owner_of(l);
    bool client_owner = c->be->caps & DLOCK__CAP_CLIENT_OWNER;
    struct dlock__wait w;
    int64_t started = dlock__now_ms();
    dlock__wait_init(&w, dlock__deadline(wait_ms));
    struct dlock__waitref ref = {&w, NULL}, cref = {&w, NULL};
    if (cancel && (rc = dlock__cancel_attach(cancel, &cref))) {
        dlock__wait_destroy(&w);
        return rc == DLOCK_ECANCELED ? dlock__err(DLOCK_ECANCELED, "lock '%s': canceled before "
                                                                   "the acquire began",
                                                  e->name)
                                     : rc;
    }
    w.cancel = cancel; /* armed on the canceler when the wait first sleeps */

    pthread_mutex_lock(&c->mu);
    ref.next = l->waits;
    l->waits = &ref;
    if (l->owner)
        rc = handle_turn(c, l, &w);
    struct dlock__hold *h = rc ? NULL : dlock__hold_of(e, owner);
    if (rc || h) {
        if (h)
            rc = dlock__reenter(l, h);
        if (!rc && h && h->mode == DLOCK_EXCLUSIVE && l->mode == DLOCK_SHARED &&
            h->shared_levels == 1)
            hold_share(c, h);
        dlock__waitref_remove(&l->waits, &ref);
        pthread_mutex_unlock(&c->mu);
        if (cancel)
            dlock__cancel_detach(cancel, &cref);
        dlock__wait_destroy(&w);
        return dlock__acquire_outcome(e, rc, wait_ms, 0);
    }
    e->refs++;
    if (l->owner)
        l->acquiring = true;
    bool claimed = false;
    if (client_owner && !l->sem) /* a semaphore's permits are many owners */
        claimed = (rc = local_queue(c, e, &w, l->mode == DLOCK_SHARED)) == DLOCK_OK;
    if (!rc && !(h = dlock__hold_make(l)))
        rc = DLOCK_ENOMEM;
    pthread_mutex_unlock(&c->mu);

    if (!rc) {
        int64_t sent = dlock__now_ms();
        dlock__err(DLOCK_OK, "%s", ""); /* so a backend's own words show */
        rc = dlock__wait_outcome(&w, dlock__backend_acquire(c, h, &w));
        /* A backend that did not confirm: count validity from before the
         * request, which is never later than the truth. */
        if (!rc && h->lease_ms && h->valid_until == DLOCK__NEVER)
            dlock__hold_confirmed(c, h, sent);
        if (!rc)
            dlock__contend_watch(c, l, h);
    }

    pthread_mutex_lock(&c->mu);
    dlock__waitref_remove(&l->waits, &ref);
    rc = dlock__acquire_end(l, h, rc, claimed);
    pthread_mutex_unlock(&c->mu);
    if (cancel)
        dlock__cancel_detach(cancel, &cref);
    note_acquire(c, e, &w, rc, started);
    dlock__wait_destroy(&w);
    return dlock__acquire_outcome(e, rc, wait_ms, w.delay_until);
}

struct dlock__hold *dlock__hold_make(dlock_lock *l)
{
    dlock_client *c = l->c;
    struct dlock__hold *h = calloc(1, sizeof *h);
    if (!h) {
        dlock__err(DLOCK_ENOMEM, "out of memory");
        return NULL;
    }
    h->entry = l->e;
    h->name = l->e->name;
    h->mode = l->mode;
    h->tid = dlock__owner_of(l);
    h->count = 1;
    h->via = l;
    h->sem = l->sem;
    h->elect = l->elect;
    h->fair = l->fair;
    bool leases = c->be->caps & DLOCK__CAP_LEASES;
    h->lease_ms = leases ? (l->lease_ms ? l->lease_ms : c->opts.lease_ms) : 0;
    h->fixed_lease = l->fixed_lease;
    h->valid_until = DLOCK__NEVER;
    h->renew_at = DLOCK__NEVER;
    h->state = DLOCK__HELD;
    return h;
}

int dlock__acquire_claim_now(dlock_lock *l)
{
    struct dlock__entry *e = l->e;
    if ((l->owner && (l->acquiring || l->releasing)) || dlock__hold_of(e, dlock__owner_of(l)))
        return dlock__err(DLOCK_EBUSY, "lock '%s': this handle is busy", e->name);
    bool shared = l->mode == DLOCK_SHARED;
    if ((l->c->be->caps & DLOCK__CAP_CLIENT_OWNER) && !l->sem) {
        if (!local_free(e, shared) || dlock__waitset_count(&e->local))
            return dlock__err(DLOCK_EBUSY, "lock '%s': another thread of this client has it",
                              e->name);
        dlock__local_claim(e, shared);
    }
    e->refs++;
    if (l->owner)
        l->acquiring = true;
    return DLOCK_OK;
}

int dlock__acquire_end(dlock_lock *l, struct dlock__hold *h, int rc, bool claimed)
{
    dlock_client *c = l->c;
    struct dlock__entry *e = l->e;
    if (h)
        dlock__contend_unpend(c, h, rc == DLOCK_OK);
    if (rc == DLOCK_OK) {
        h->next = e->holds;
        e->holds = h;
        if (h->lease_ms) {
            c->nholds++;
            rc = dlock__keeper_start(c);
            dlock__keeper_kick_for(c, h);
            dlock__callback_watch(c, h);
            if (rc) {
                /* No keeper, no renewals: say so rather than hold blindly. */
                char msg[512];
                snprintf(msg, sizeof msg, "%s", dlock_errmsg());
                e->holds = h->next;
                c->nholds--;
                pthread_mutex_unlock(&c->mu);
                dlock__backend_release(c, h);
                pthread_mutex_lock(&c->mu);
                dlock__callback_forget_hold(c, h);
                dlock__hold_free(h);
                h = NULL;
                rc = dlock__err(rc, "%s", msg);
            }
        }
    } else {
        dlock__hold_free(h);
        h = NULL;
    }
    if (rc && claimed)
        dlock__local_dequeue(e, l->mode == DLOCK_SHARED);
    if (l->owner) {
        l->acquiring = false;
        dlock__waitset_wake_all(&l->turn);
    }
    dlock__entry_put(c, e);
    return rc;
}


void dlock_lock_free(dlock_lock *l)
{
    if (!l)
        return;
    dlock_client *c = l->c;
    bool forked = dlock__forked(c); /* then only the handle's own memory goes */
    if (!forked)
        dlock__async_forget(l); /* its asynchronous calls end first */
    if (!forked) {
        pthread_mutex_lock(&c->mu);
        /* Its queued lost callbacks go; a running one ends first (unless
         * this is the callback thread: it may be that very callback). */
        dlock__callback_forget(c, l);
        /* The last handle on the name ends the holds still taken on it.
         * While other handles remain, holds stay reachable through them
         * (a thread that re-entered through another handle keeps its
         * count); only the callback link to this handle goes. */
        bool last = l->e->refs == 1;
        struct dlock__hold *h;
        while (!c->closed) { /* closing ended every hold already */
            /* ... and a handle's own holds (handle-owned) end with it. */
            for (h = l->e->holds;
                 h && (h->give_back || (!(last && (h->via == l || !h->via)) &&
                                        !(l->owner && h->tid == l->owner)));
                 h = h->next)
                ; /* (one being given back is the keeper's to end) */
            if (!h)
                break;
            dlock__hold_end(c, h);
        }
        bool given_back_later = false;
        for (h = l->e->holds; h; h = h->next)
            if (h->via == l) {
                given_back_later |= h->give_back;
                h->via = NULL;
            }
        /* A hold the keeper is giving back right now (already unlinked,
         * the mutex dropped around release_within) still ends through L:
         * hold_end_finish() clears L's releasing flag. Wait for it, or
         * it would write to L freed. One still listed no longer names L
         * (via cleared above), so nothing of it will touch L. */
        while (!given_back_later && l->owner && l->releasing && !c->closed)
            pthread_cond_wait(&c->renew_cv, &c->mu);
        dlock__entry_put(c, l->e);
        pthread_mutex_unlock(&c->mu);
    }
    if (l->owner && !forked)
        dlock__waitset_destroy(&l->turn);
    free(l->elect_req.value);
    free(l);
    dlock__client_unref(c); /* after close, the last handle frees the client */
}

bool dlock__lock_lost(dlock_lock *l)
{
    pthread_mutex_lock(&l->c->mu);
    struct dlock__hold *h = dlock__hold_of(l->e, dlock__owner_of(l));
    bool lost = h && (h->state == DLOCK__LOST ||
                      (h->lease_ms && h->valid_until != DLOCK__NEVER &&
                       h->valid_until <= dlock__now_ms()));
    pthread_mutex_unlock(&l->c->mu);
    return lost;
}

unsigned dlock_hold_count(dlock_lock *l)
{
    if (!l || dlock__forked(l->c))
        return 0;
    pthread_mutex_lock(&l->c->mu);
    struct dlock__hold *h = dlock__hold_of(l->e, dlock__owner_of(l));
    unsigned n = h ? h->count : 0;
    pthread_mutex_unlock(&l->c->mu);
    return n;
}

int dlock_lock_inherit_fd(dlock_lock *l, int *fd)
{
    dlock__msg_clear();
    if (!l || !fd)
        return dlock__err(DLOCK_EINVAL, "dlock_lock_inherit_fd: NULL argument");
    if (!l->c->be->locks->inherit_fd)
        return dlock__err(DLOCK_ENOTSUP,
                          "lock '%s': a %s hold is no kernel lock a child could inherit (only "
                          "the file backend's is)",
                          l->e->name, l->c->be->name);
    int rc = dlock__check_fork(l->c);
    if (rc)
        return rc;
    pthread_mutex_lock(&l->c->mu);
    struct dlock__hold *h = dlock__hold_of(l->e, dlock__owner_of(l));
    if (!h)
        rc = dlock__not_held(l);
    else if ((*fd = l->c->be->locks->inherit_fd(l->c->bstate, h)) < 0)
        rc = DLOCK_EIO;
    pthread_mutex_unlock(&l->c->mu);
    return rc;
}

int dlock_token(dlock_lock *l, uint64_t *token)
{
    int rc = lock_enter(l, token != NULL, "dlock_token");
    if (rc)
        return rc;
    struct dlock__hold *h = dlock__hold_of(l->e, dlock__owner_of(l));
    if (h)
        *token = h->token;
    else
        rc = dlock__not_held(l);
    pthread_mutex_unlock(&l->c->mu);
    return rc;
}

int64_t dlock_validity_ms(dlock_lock *l)
{
    int64_t v = lock_enter(l, true, NULL);
    if (v)
        return v;
    struct dlock__hold *h = dlock__hold_of(l->e, dlock__owner_of(l));
    if (!h)
        v = dlock__not_held(l);
    else if (h->state == DLOCK__LOST)
        v = 0;
    else if (h->valid_until == DLOCK__NEVER)
        v = DLOCK_VALID_FOREVER;
    else {
        v = h->valid_until - dlock__now_ms();
        if (v < 0)
            v = 0;
    }
    pthread_mutex_unlock(&l->c->mu);
    return v;
}
