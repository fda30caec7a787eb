/* multi.c -- multi-locks: several names taken all or nothing.
 *
 * Built entirely on public lock handles, with no backend code: a
 * multi-lock owns one DLOCK_LOCK_HANDLE_OWNED handle per name, kept in the
 * canonical order (names sorted with strcmp), and takes them one by one in
 * that order with dlock_acquire_ex(). The order is what rules out
 * deadlock between overlapping sets: every multi-lock that needs both "a"
 * and "b" asks "a" first, so none can hold "b" while waiting for "a".
 * Each member's acquire gets the time left of the one deadline of the
 * whole set, and the caller's cancel object. Any failure releases, in
 * reverse order, what was taken before it, so a failed acquire leaves
 * nothing held: after a timeout or a cancel within what is left of the
 * wait (release.c's dlock__release_within, the backend's release_within),
 * what the server did not answer owed to the keeper, so the wait's bound
 * holds even while a server stalls. Handle-owned holds let any thread release the set, and
 * the members' renewals, validity, tokens and lost callbacks are those of
 * ordinary holds (the lost callback goes through a trampoline that names
 * the multi-lock).
 *
 * Where the backend can take a whole set in one request (its
 * the multi ops' acquire: one Lua script on Redis, one transaction on etcd), the
 * first attempt is that request, with the members' holds made here as
 * dlock_acquire_ex() makes them (lock.c's pieces: claim, make, end), so
 * an uncontended set costs one round trip. A request is all or nothing,
 * so it never holds part of a set while waiting and cannot take part in
 * a deadlock. When it finds a member busy and the caller waits, or the
 * backend cannot take this set at once, the members are taken one by
 * one in the canonical order, each waiting the backend's own way
 * (pub/sub, watch) within the set's one deadline.
 *
 * The release is one request too where the backend allows it (its
 * the multi ops' release, through release.c's dlock__release_set: one script, one
 * transaction), each member checked as its own release checks it, so a
 * member lost meanwhile is DLOCK_ELOST and the others are still given
 * back; elsewhere, or for a member re-entered through its handle, the
 * members are released one by one in reverse order.
 *
 * The asynchronous acquire (dlock_multi_acquire_async, at the end) is the
 * same steps run on the client's pool as a job (async.c): the one
 * request first, then each member through its own asynchronous acquire,
 * whose continuation takes the next member -- so a set waits parked,
 * holding no thread, wherever a lock's wait parks. The rules (order,
 * all or nothing, the give-back, the one wait bound) are the pieces the
 * blocking acquire uses.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct dlock_multi {
    size_t n;
    dlock_lock **member;     /* canonical order */
    int held;                /* 1 from a successful acquire to the release (atomic) */
    int async_call;          /* 1 from an asynchronous call's start to its callback (atomic) */
    struct multi_call *call; /* that call (atomic), for dlock_multi_free() */
    dlock_multi_lost_fn lost_fn;
    void *lost_arg;
};

static int by_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A member's lost callback: handed on to the multi-lock's, if any. */
static void member_lost(dlock_lock *l, const char *why, void *arg)
{
    dlock_multi *m = arg;
    dlock_multi_lost_fn fn = __atomic_load_n(&m->lost_fn, __ATOMIC_ACQUIRE);
    if (fn)
        fn(m, l, why, m->lost_arg);
}

static void free_members(dlock_multi *m, size_t n)
{
    for (size_t k = n; k-- > 0;)
        dlock_lock_free(m->member[k]);
    free(m->member);
    free(m);
}

int dlock_multi_new(dlock_client *c, const char *const *names, size_t n, dlock_mode mode,
                    unsigned flags, dlock_multi **out)
{
    dlock__msg_clear();
    if (!out)
        return dlock__err(DLOCK_EINVAL, "dlock_multi_new: out is NULL");
    *out = NULL;
    if (!names || n == 0 || n > DLOCK_MULTI_MAX)
        return dlock__err(DLOCK_EINVAL, "dlock_multi_new: %zu names (1 to %d)", names ? n : 0,
                          DLOCK_MULTI_MAX);
    if (flags)
        return dlock__err(DLOCK_EINVAL, "dlock_multi_new: reserved flags 0x%x", flags);
    for (size_t k = 0; k < n; k++)
        if (!names[k])
            return dlock__err(DLOCK_EINVAL, "dlock_multi_new: name %zu is NULL", k);
    const char **sorted = malloc(n * sizeof *sorted);
    dlock_multi *m = calloc(1, sizeof *m);
    dlock_lock **member = calloc(n, sizeof *member);
    if (!sorted || !m || !member) {
        free(sorted);
        free(m);
        free(member);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    memcpy(sorted, names, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, by_name);
    m->member = member;
    int rc = DLOCK_OK;
    size_t made = 0;
    for (; made < n && !rc; made++) {
        if (made > 0 && strcmp(sorted[made - 1], sorted[made]) == 0) {
            rc = dlock__err(DLOCK_EINVAL, "dlock_multi_new: name '%s' given twice", sorted[made]);
            break;
        }
        rc = dlock_lock_new(c, sorted[made], mode, DLOCK_LOCK_HANDLE_OWNED, &member[made]);
        if (!rc)
            rc = dlock_lock_on_lost(member[made], member_lost, m);
        else
            break;
    }
    free(sorted);
    if (rc) {
        free_members(m, made);
        return rc;
    }
    m->n = n;
    *out = m;
    return DLOCK_OK;
}

static void call_forget(dlock_multi *m);

void dlock_multi_free(dlock_multi *m)
{
    if (!m)
        return;
    call_forget(m); /* a call in flight ends first, as a lock handle's does */
    /* A held set goes back in one request where the backend allows it
     * (nothing is done on a closed or forked client: ENOTSUP); then a
     * handle-owned handle releases what it still holds when freed. */
    if (__atomic_load_n(&m->held, __ATOMIC_ACQUIRE)) {
        int *rcs = calloc(m->n, sizeof *rcs);
        char msg[DLOCK__MSG_MAX];
        dlock__errmsg_save(msg);
        if (rcs)
            dlock__release_set(m->member, m->n, rcs);
        dlock__errmsg_restore(DLOCK_OK, msg);
        free(rcs);
    }
    free_members(m, m->n);
}

/* Release members [FROM, N) in reverse order, within DEADLINE (what the
 * server did not answer by then owed to the keeper: release.c's
 * dlock__release_within; DLOCK__NEVER: each with its own timeout); the
 * first failure, else DLOCK_OK. Keeps the calling thread's message of
 * that failure. */
static int release_members(dlock_multi *m, size_t from, size_t n, int64_t deadline)
{
    int first = DLOCK_OK;
    char msg[DLOCK__MSG_MAX] = "";
    for (size_t k = n; k-- > from;) {
        int rc = dlock__release_within(m->member[k], deadline);
        if (rc && !first) {
            first = rc;
            dlock__errmsg_save(msg);
        }
    }
    return first ? dlock__errmsg_restore(first, msg) : DLOCK_OK;
}

/* The backend's one attempt at every member (the multi ops' acquire), bounded by
 * DEADLINE and CANCEL: DLOCK_OK (all held), DLOCK_EBUSY (*BUSY: a member
 * held elsewhere; nothing held), DLOCK_ENOTSUP (not at once: a backend
 * without the op, a set it cannot cover, a member another thread of this
 * client has or waits for), or a failure (nothing held). */
static int acquire_at_once(dlock_multi *m, int64_t deadline, dlock_cancel *cancel, size_t *busy)
{
    dlock_client *c = m->member[0]->c;
    const struct dlock__backend *be = c->be;
    if (m->n < 2 || !DLOCK__OP(be, multi, acquire))
        return DLOCK_ENOTSUP;
    struct dlock__hold **hs = calloc(m->n, sizeof *hs);
    if (!hs)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    bool claimed = be->caps & DLOCK__CAP_CLIENT_OWNER;
    struct dlock__wait w;
    dlock__wait_init(&w, deadline);
    struct dlock__waitref cref = {&w, NULL};
    int rc = cancel ? dlock__cancel_attach(cancel, &cref) : DLOCK_OK;
    if (rc) {
        dlock__wait_destroy(&w);
        free(hs);
        return rc;
    }
    w.cancel = cancel;
    pthread_mutex_lock(&c->mu);
    size_t k = 0; /* members claimed */
    while (!rc && k < m->n) {
        if ((rc = dlock__acquire_claim_now(m->member[k])))
            break;
        hs[k] = dlock__hold_make(m->member[k]);
        if (!hs[k++])
            rc = DLOCK_ENOMEM;
    }
    pthread_mutex_unlock(&c->mu);
    if (!rc) {
        int64_t sent = dlock__now_ms();
        dlock__err(DLOCK_OK, "%s", ""); /* so a backend's own words show */
        rc = dlock__wait_outcome(&w, be->multi->acquire(c->bstate, hs, m->n, &w, busy));
        for (size_t j = 0; !rc && j < m->n; j++)
            if (hs[j]->lease_ms && hs[j]->valid_until == DLOCK__NEVER)
                dlock__hold_confirmed(c, hs[j], sent); /* as dlock_acquire_ex() */
    } else if (rc == DLOCK_EBUSY) {
        rc = DLOCK_ENOTSUP; /* busy here, not at the server: wait in line */
    }
    /* Every member claimed ends as the request did; one that cannot be
     * kept (no keeper) fails the set, and the others are given back. */
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    int kept = rc;
    pthread_mutex_lock(&c->mu);
    for (size_t j = 0; j < k; j++) {
        int end = dlock__acquire_end(m->member[j], hs[j], rc, claimed);
        if (end && !kept) {
            kept = end;
            dlock__errmsg_save(msg);
        }
        hs[j] = end ? NULL : hs[j];
    }
    pthread_mutex_unlock(&c->mu);
    if (!rc && kept)
        for (size_t j = 0; j < k; j++)
            if (hs[j])
                dlock_release(m->member[j]);
    if (cancel)
        dlock__cancel_detach(cancel, &cref);
    dlock__wait_destroy(&w);
    free(hs);
    if (!kept)
        DLOCK__COUNT(c, acquisitions, m->n);
    return dlock__errmsg_restore(kept, msg);
}

/* The first member whose hold is lost or past its validity (a set whose
 * members are all held: M->n). */
static size_t lost_member(dlock_multi *m)
{
    size_t k = 0;
    while (k < m->n && !dlock__lock_lost(m->member[k]))
        k++;
    return k;
}

/* The wait of the next member's acquire: the time left of the whole set
 * (WAIT_MS, DEADLINE); once it is gone, the remaining members are tried
 * once (*OUT_OF_TIME) and a busy one is the set's timeout. */
static int64_t member_wait(int64_t wait_ms, int64_t deadline, bool *out_of_time)
{
    *out_of_time = false;
    if (wait_ms <= 0)
        return wait_ms;
    int64_t wait = deadline - dlock__now_ms();
    if (wait > 0)
        return wait;
    *out_of_time = true;
    return DLOCK_TRY;
}

/* Member K's acquire failed with RC (the thread's message): give back the
 * members taken before it and return the set's failure, naming K. */
static int member_failed(dlock_multi *m, size_t k, int rc, int64_t wait_ms, int64_t deadline,
                         bool out_of_time)
{
    if (rc == DLOCK_EBUSY && out_of_time)
        rc = DLOCK_ETIMEDOUT;
    char why[DLOCK__MSG_MAX];
    dlock__errmsg_save(why);
    /* The members taken before it go back within what is left of a
     * bounded wait, nothing of a canceled one (the caller asked to
     * stop now): the wait ends at its end even while the server
     * stalls, and the keeper gives back what was not answered by
     * then. A try and a wait forever give them back as
     * dlock_release() does. */
    int64_t give_back = rc == DLOCK_ECANCELED ? dlock__now_ms()
                        : wait_ms > 0         ? deadline
                                              : DLOCK__NEVER;
    release_members(m, 0, k, give_back);
    return dlock__err(rc, "multi-lock member '%s' (%zu of %zu): %s%s",
                      dlock_lock_name(m->member[k]), k + 1, m->n, why[0] ? why : dlock_strerror(rc),
                      k ? "; the members taken before it were given back" : "");
}

/* Every member taken: the first one lost meanwhile, M->n when none is. A
 * member taken before may have been lost while the set waited for a
 * later one (its lease ran out unrenewed, a force release): the set is
 * not held. It and the members after it go back (no member is waited
 * for while a later one is held) and are taken again within what is
 * left of the wait. */
static size_t members_lost(dlock_multi *m, int64_t wait_ms, int64_t deadline)
{
    size_t k = lost_member(m);
    if (k < m->n)
        release_members(m, k, m->n, wait_ms > 0 ? deadline : DLOCK__NEVER);
    return k;
}

/* The one request's outcome RC (BUSY its busy member) for a set waiting
 * WAIT_MS: true when it ends the acquire with *RC (DLOCK_OK: M held;
 * else worded), false when the members are to be taken one by one. */
static bool at_once_ends(dlock_multi *m, int *rc, size_t busy, int64_t wait_ms)
{
    if (*rc == DLOCK_OK) {
        __atomic_store_n(&m->held, 1, __ATOMIC_RELEASE);
        return true;
    }
    if (*rc == DLOCK_EBUSY && busy < m->n && wait_ms == DLOCK_TRY) {
        *rc = dlock__err(DLOCK_EBUSY,
                         "multi-lock member '%s' (%zu of %zu): lock '%s' is held "
                         "by another owner",
                         dlock_lock_name(m->member[busy]), busy + 1, m->n,
                         dlock_lock_name(m->member[busy]));
        return true;
    }
    if (*rc != DLOCK_EBUSY && *rc != DLOCK_ENOTSUP) {
        char why[DLOCK__MSG_MAX];
        dlock__errmsg_save(why);
        *rc = dlock__err(*rc, "multi-lock of %zu names: %s", m->n,
                         why[0] ? why : dlock_strerror(*rc));
        return true;
    }
    return false;
}

/* The refusal of call FN while an asynchronous one through M is in flight. */
static int busy_refusal(const dlock_multi *m, const char *fn)
{
    return dlock__err(DLOCK_EBUSY,
                      "%s: an asynchronous call through the multi-lock of '%s' has not had its "
                      "callback yet",
                      fn, dlock_lock_name(m->member[0]));
}

static int async_busy(const dlock_multi *m, const char *fn)
{
    return __atomic_load_n(&m->async_call, __ATOMIC_ACQUIRE) ? busy_refusal(m, fn) : DLOCK_OK;
}

/* The checks of a start of acquire FN of M (not NULL, wait checked). */
static int acquire_enter(const dlock_multi *m, const char *fn)
{
    int rc = dlock__check_client(m->member[0]->c); /* not after fork or close */
    if (rc || (rc = async_busy(m, fn)))
        return rc;
    if (__atomic_load_n(&m->held, __ATOMIC_ACQUIRE))
        return dlock__err(DLOCK_EMISUSE, "%s: the multi-lock is held already (release first)", fn);
    return DLOCK_OK;
}

int dlock_multi_acquire(dlock_multi *m, int64_t wait_ms, dlock_cancel *cancel)
{
    dlock__msg_clear();
    if (!m)
        return dlock__err(DLOCK_EINVAL, "dlock_multi_acquire: m is NULL");
    if (wait_ms < 0 && wait_ms != DLOCK_FOREVER)
        return dlock__err(DLOCK_EINVAL, "dlock_multi_acquire: wait %lld ms", (long long)wait_ms);
    int rc = acquire_enter(m, "dlock_multi_acquire");
    if (rc)
        return rc;
    int64_t deadline = dlock__deadline(wait_ms);
    size_t busy = 0;
    rc = dlock_cancel_fired(cancel) ? DLOCK_ENOTSUP /* the loop says so */
                                    : acquire_at_once(m, deadline, cancel, &busy);
    if (at_once_ends(m, &rc, busy, wait_ms))
        return rc;
    /* Member by member, in the canonical order; then again from the
     * first member found lost, until none is. */
    size_t k = 0;
    while (k < m->n) {
        for (; k < m->n; k++) {
            bool out_of_time;
            int64_t wait = member_wait(wait_ms, deadline, &out_of_time);
            rc = dlock_acquire_ex(m->member[k], wait, cancel);
            if (rc != DLOCK_OK)
                return member_failed(m, k, rc, wait_ms, deadline, out_of_time);
        }
        k = members_lost(m, wait_ms, deadline);
    }
    __atomic_store_n(&m->held, 1, __ATOMIC_RELEASE);
    return DLOCK_OK;
}

/* The checks of a release FN of M (not NULL). */
static int release_enter(const dlock_multi *m, const char *fn)
{
    int rc = async_busy(m, fn);
    if (!rc && !__atomic_load_n(&m->held, __ATOMIC_ACQUIRE))
        rc = dlock__err(DLOCK_ENOTOWNER, "%s: the multi-lock is not held", fn);
    return rc;
}

/* Release every member of held M. */
static int release_all(dlock_multi *m)
{
    __atomic_store_n(&m->held, 0, __ATOMIC_RELEASE);
    int *rcs = calloc(m->n, sizeof *rcs);
    int rc = rcs ? dlock__release_set(m->member, m->n, rcs) : DLOCK_ENOTSUP;
    free(rcs);
    return rc == DLOCK_ENOTSUP ? release_members(m, 0, m->n, DLOCK__NEVER) : rc;
}

int dlock_multi_release(dlock_multi *m)
{
    dlock__msg_clear();
    if (!m)
        return dlock__err(DLOCK_EINVAL, "dlock_multi_release: m is NULL");
    int rc = release_enter(m, "dlock_multi_release");
    return rc ? rc : release_all(m);
}

int dlock_multi_held(const dlock_multi *m)
{
    return m ? __atomic_load_n(&m->held, __ATOMIC_ACQUIRE) : 0;
}

size_t dlock_multi_count(const dlock_multi *m)
{
    return m ? m->n : 0;
}

dlock_lock *dlock_multi_lock(dlock_multi *m, size_t k)
{
    return m && k < m->n ? m->member[k] : NULL;
}

int dlock_multi_on_lost(dlock_multi *m, dlock_multi_lost_fn fn, void *arg)
{
    dlock__msg_clear();
    if (!m)
        return dlock__err(DLOCK_EINVAL, "dlock_multi_on_lost: m is NULL");
    m->lost_arg = arg;
    __atomic_store_n(&m->lost_fn, fn, __ATOMIC_RELEASE);
    return DLOCK_OK;
}

/* ------------------------------------------------------ asynchronous calls */

/* One asynchronous call through a multi-lock: a job on the client's pool. */
struct multi_call {
    struct dlock__job job;
    dlock_multi *m;
    dlock_multi_done_fn done;
    void *arg;
    int64_t wait_ms, deadline;
    dlock_cancel *cancel;
    size_t k;         /* the member being taken */
    bool out_of_time; /* its wait was the set's last try */
};

/* Take members from mc->k on, each through its asynchronous acquire:
 * DLOCK__LATER when one was started (its continuation goes on), else the
 * set's outcome. On a pool thread. */
static int members_next(struct multi_call *mc);

/* A member's acquire ended (its continuation, on a pool thread). */
static void member_taken(dlock_lock *l, int rc, void *arg)
{
    (void)l;
    struct multi_call *mc = arg;
    if (rc == DLOCK_OK) {
        mc->k++;
        rc = members_next(mc);
    } else {
        rc = member_failed(mc->m, mc->k, rc, mc->wait_ms, mc->deadline, mc->out_of_time);
    }
    if (rc != DLOCK__LATER)
        dlock__job_end(&mc->job, rc);
}

static int members_next(struct multi_call *mc)
{
    dlock_multi *m = mc->m;
    if (mc->k == m->n && (mc->k = members_lost(m, mc->wait_ms, mc->deadline)) == m->n) {
        __atomic_store_n(&m->held, 1, __ATOMIC_RELEASE);
        return DLOCK_OK;
    }
    int64_t wait = member_wait(mc->wait_ms, mc->deadline, &mc->out_of_time);
    int rc = dlock__acquire_then(m->member[mc->k], wait, mc->cancel, member_taken, mc);
    return rc ? member_failed(m, mc->k, rc, mc->wait_ms, mc->deadline, mc->out_of_time)
              : DLOCK__LATER;
}

/* The acquire's run: the one request, then member by member. */
static int acquire_run(struct dlock__job *j)
{
    struct multi_call *mc = (struct multi_call *)j;
    size_t busy = 0;
    int rc = dlock_cancel_fired(mc->cancel)
                 ? DLOCK_ENOTSUP
                 : acquire_at_once(mc->m, mc->deadline, mc->cancel, &busy);
    if (at_once_ends(mc->m, &rc, busy, mc->wait_ms))
        return rc;
    mc->k = 0;
    return members_next(mc);
}

static int release_run(struct dlock__job *j)
{
    return release_all(((struct multi_call *)j)->m);
}

static void call_deliver(struct dlock__job *j, int rc)
{
    struct multi_call *mc = (struct multi_call *)j;
    dlock_multi *m = j->forgotten ? NULL : mc->m; /* NULL: freed (call_forget) */
    dlock_multi_done_fn done = mc->done;
    void *arg = mc->arg;
    free(mc); /* before the callback, which may free M or start the next call */
    if (m) {
        __atomic_store_n(&m->call, NULL, __ATOMIC_RELEASE);
        __atomic_store_n(&m->async_call, 0, __ATOMIC_RELEASE);
    }
    done(m, rc, arg);
}

/* How M's asynchronous calls name it, in WHAT (returned). */
static const char *multi_what(const dlock_multi *m, char what[DLOCK__MSG_MAX])
{
    snprintf(what, DLOCK__MSG_MAX, "multi-lock of %zu names ('%s' first)", m->n,
             dlock_lock_name(m->member[0]));
    return what;
}

/* M is being freed: its call in flight, if any, is canceled and ended,
 * and its completion comes with a NULL multi-lock (dlock__job_forget). */
static void call_forget(dlock_multi *m)
{
    struct multi_call *mc = __atomic_load_n(&m->call, __ATOMIC_ACQUIRE);
    dlock_client *c = m->member[0]->c;
    if (!mc || dlock__forked(c))
        return;
    char what[DLOCK__MSG_MAX];
    dlock__job_forget(c, &mc->job, multi_what(m, what));
}

/* Start MC (its run set) through M; frees MC when it does not start. */
static int call_start(dlock_multi *m, struct multi_call *mc, const char *fn)
{
    mc->m = m;
    mc->job.deliver = call_deliver;
    int idle = 0;
    if (!__atomic_compare_exchange_n(&m->async_call, &idle, 1, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        free(mc);
        return busy_refusal(m, fn);
    }
    __atomic_store_n(&m->call, mc, __ATOMIC_RELEASE);
    int rc = dlock__job_start(m->member[0]->c, &mc->job);
    if (rc) {
        __atomic_store_n(&m->call, NULL, __ATOMIC_RELEASE);
        __atomic_store_n(&m->async_call, 0, __ATOMIC_RELEASE);
        free(mc);
        char why[DLOCK__MSG_MAX];
        dlock__errmsg_save(why);
        return dlock__err(rc, "%s: %s", fn, why);
    }
    return DLOCK_OK;
}

/* A new call of M with DONE, ARG; NULL (with the error) out of memory. */
static struct multi_call *call_new(dlock_multi_done_fn done, void *arg)
{
    struct multi_call *mc = calloc(1, sizeof *mc);
    if (!mc) {
        dlock__err(DLOCK_ENOMEM, "out of memory");
        return NULL;
    }
    mc->done = done;
    mc->arg = arg;
    return mc;
}

int dlock_multi_acquire_async(dlock_multi *m, int64_t wait_ms, dlock_cancel *cancel,
                              dlock_multi_done_fn done, void *arg)
{
    const char *fn = "dlock_multi_acquire_async";
    dlock__msg_clear();
    if (!m || !done)
        return dlock__err(DLOCK_EINVAL, "%s: NULL argument", fn);
    char what[DLOCK__MSG_MAX];
    int rc = dlock__async_can_wait(m->member[0], wait_ms, multi_what(m, what));
    if (rc || (rc = acquire_enter(m, fn)))
        return rc;
    if (dlock_cancel_fired(cancel))
        return dlock__err(DLOCK_ECANCELED, "%s: canceled before the acquire began", what);
    struct multi_call *mc = call_new(done, arg);
    if (!mc)
        return DLOCK_ENOMEM;
    mc->job.run = acquire_run;
    mc->wait_ms = wait_ms;
    mc->deadline = dlock__deadline(wait_ms);
    mc->cancel = cancel;
    return call_start(m, mc, fn);
}

int dlock_multi_release_async(dlock_multi *m, dlock_multi_done_fn done, void *arg)
{
    const char *fn = "dlock_multi_release_async";
    dlock__msg_clear();
    if (!m || !done)
        return dlock__err(DLOCK_EINVAL, "%s: NULL argument", fn);
    int rc = dlock__check_client(m->member[0]->c);
    if (rc || (rc = release_enter(m, fn)))
        return rc;
    struct multi_call *mc = call_new(done, arg);
    if (!mc)
        return DLOCK_ENOMEM;
    mc->job.run = release_run;
    return call_start(m, mc, fn);
}
