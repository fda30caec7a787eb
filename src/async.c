/* async.c -- asynchronous acquire and release for event loops: a
 * waiting acquire holds no thread, and completions reach the caller's
 * loop through a descriptor and dlock_dispatch().
 *
 * A blocking acquire is a loop in the backend: try, sleep on the wait
 * (a release message wakes it), try again. Here the core drives that
 * loop instead. Each call is an op: the wait it would have slept in,
 * with a hook (on_wake) that every wake and cancel of it calls. A small
 * pool of threads per client runs the attempts through the backend's
 * try_armed() (backend.h), which arms the wake-up on its first call (a
 * Redis subscription, a ZooKeeper watch, an inotify watch of a lock
 * file) and never sleeps. A busy attempt parks the op: no thread holds
 * it while it waits. A wake, a cancel, the backend's retry time (the
 * holder's lease end, a lock-delay's end) or the wait's deadline makes
 * it runnable again; a pool thread takes it, tries again, and so on. An
 * attempt that failed by an outage (dlock__wait_outage) is tried again
 * after a backoff until the wait's end, which then names the outage:
 * the one ride-out policy of every backend. When it ends, disarm()
 * undoes the wake-up and the op goes on the completion queue, whose
 * eventfd the loop watches; dlock_dispatch() runs the callbacks in the
 * loop's thread.
 *
 * Every op ends exactly once: the pool finishes it (DONE) and only a
 * dispatch -- or the client's close -- delivers and frees it. Close
 * cancels what runs or waits, waits for the pool to finish it all, and
 * delivers the rest itself, so no callback runs after close returns.
 *
 * The core composes its other asynchronous calls (multi-locks,
 * semaphores) from two pieces at the end of this file: a job, a call of
 * the core's run on the pool whose completion comes through the same
 * queue, and an acquire whose end runs a continuation on its pool thread
 * instead of queuing a completion (internal.h, "jobs").
 *
 * Locks: the client's mutex (c->mu) before the async state's (a->mu),
 * never the other way; a wait's own mutex is not held when its hook runs.
 * The parked ops' times are found by the timer thread's scan of the
 * ops: fine for hundreds of waiters, a heap for ten thousand.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* The pool starts with POOL_MIN threads. An attempt is a request
 * bounded by its op's deadline, so a slow or stopped server holds a
 * thread for up to the op timeout. The timer thread, which makes no
 * request, adds one thread whenever ops queue while every pool thread
 * has been inside an attempt for STALL_MS, up to POOL_MAX: so a short
 * wait is not held up by others' stalled requests. */
#define POOL_MIN 2
#define POOL_MAX 16
#define STALL_MS 100

/* An outage a backend's attempt reports (dlock__wait_outage) is ridden
 * out: the next attempt after a pause from OUTAGE_FIRST_MS doubling up
 * to OUTAGE_MAX_MS, until an attempt gets through or the wait ends. */
#define OUTAGE_FIRST_MS 100
#define OUTAGE_MAX_MS 2000

enum op_kind { OP_ACQUIRE, OP_RELEASE, OP_JOB };
enum op_state { OP_RUNNABLE, OP_RUNNING, OP_PARKED, OP_DONE };

struct op {
    struct dlock__wait w; /* first: the wake hook finds the op from it */
    struct dlock__async *a;
    dlock_lock *l; /* NULL once the handle was freed before delivery */
    dlock_done_fn done;
    dlock__then_fn then;    /* an acquire of a job: run at its end in place of DONE */
    struct dlock__job *job; /* OP_JOB: the core's call it runs */
    void *arg;
    enum op_kind kind;
    enum op_state state; /* under a->mu */
    int64_t wait_ms;
    int64_t until; /* PARKED: runnable by then (monotonic ms) */
    int64_t sent;  /* when the latest attempt's request began */
    dlock_cancel *cancel;
    struct dlock__waitref ref, cref; /* on l->waits, on the cancel object */
    struct dlock__hold *h;
    bool claimed; /* the local claim of a CLIENT_OWNER backend */
    bool armed;   /* try_armed() was called: disarm() is owed */
    void *park;   /* the backend's, between try_armed() and disarm() */
    int rc;
    char msg[DLOCK__MSG_MAX];
    struct dlock__backoff outage;    /* the pauses of an outage ridden out */
    bool outage_now;                 /* the latest attempt failed by an outage */
    char outage_msg[DLOCK__MSG_MAX]; /* the outage's words; "" none now */
    struct op *next;                 /* the run queue or the done queue */
    struct op *all_prev, *all_next;  /* every op not yet delivered */
    struct op *cancel_next;          /* end_ops()'s list (a->mu) */
};

struct dlock__async {
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* an op runnable, stop */
    pthread_cond_t timer_cv; /* a parked op, ops queued behind busy threads, stop (monotonic) */
    pthread_cond_t idle_cv;  /* an op ended (close and forget wait on it) */
    struct op *all;
    struct op *run_head, *run_tail;
    struct op *done_head, *done_tail;
    int efd; /* readable while done ops wait */
    pthread_t threads[POOL_MAX];
    unsigned nthreads;
    unsigned busy;      /* pool threads inside an attempt or a release now */
    int64_t last_start; /* when the latest of those began (monotonic ms) */
    pthread_t timer;    /* times parked ops, grows the pool */
    bool has_timer;
    bool stop;
    bool closing;
    long loop_tid;    /* the thread dispatching; 0: not bound yet */
    bool dispatching; /* a dispatch runs callbacks now */
};

/* ------------------------------------------------------------------ queues */

static void push(struct op **head, struct op **tail, struct op *op)
{
    op->next = NULL;
    if (*tail)
        (*tail)->next = op;
    else
        *head = op;
    *tail = op;
}

static struct op *pop(struct op **head, struct op **tail)
{
    struct op *op = *head;
    if (op && !(*head = op->next))
        *tail = NULL;
    return op;
}

static void all_unlink(struct dlock__async *a, struct op *op)
{
    if (op->all_prev)
        op->all_prev->all_next = op->all_next;
    else
        a->all = op->all_next;
    if (op->all_next)
        op->all_next->all_prev = op->all_prev;
}

static void *pool_main(void *arg);

/* One more pool thread for A (a->mu held, or A not shared yet); it
 * takes no signals (dlock__thread_start). */
static int pool_grow(struct dlock__async *a)
{
    int err = dlock__thread_start(&a->threads[a->nthreads], pool_main, a);
    if (!err)
        a->nthreads++;
    return err;
}

/* OP can run: queue it for the pool (a->mu held); if every pool thread
 * is busy, the timer thread watches how long. */
static void make_runnable(struct dlock__async *a, struct op *op)
{
    op->state = OP_RUNNABLE;
    push(&a->run_head, &a->run_tail, op);
    pthread_cond_signal(&a->cv);
    if (a->busy >= a->nthreads)
        pthread_cond_signal(&a->timer_cv);
}

/* Every wake and cancel of a parked op's wait: run it again. */
static void op_woken(struct dlock__wait *w)
{
    struct op *op = (struct op *)w;
    struct dlock__async *a = op->a;
    pthread_mutex_lock(&a->mu);
    if (op->state == OP_PARKED)
        make_runnable(a, op);
    pthread_mutex_unlock(&a->mu);
}

/* OP ended with RC and the calling thread's message: queue its
 * completion for dispatch (a->mu held). From here a dispatch may free it. */
static void op_finish_locked(struct op *op, int rc)
{
    struct dlock__async *a = op->a;
    op->rc = rc;
    dlock__errmsg_save(op->msg);
    op->state = OP_DONE;
    push(&a->done_head, &a->done_tail, op);
    uint64_t one = 1;
    ssize_t n = write(a->efd, &one, sizeof one);
    (void)n; /* an eventfd's counter does not fill up at these numbers */
    pthread_cond_broadcast(&a->idle_cv);
}

static void op_finish(struct op *op, int rc)
{
    struct dlock__async *a = op->a;
    pthread_mutex_lock(&a->mu);
    op_finish_locked(op, rc);
    pthread_mutex_unlock(&a->mu);
}

static void op_free(struct op *op)
{
    dlock__wait_destroy(&op->w);
    free(op);
}

/* Acquire OP of a job ended with RC: DONE and out of the ops at once, as
 * no dispatch delivers it (a->mu not held); then_run() frees it. */
static void op_retire(struct op *op, int rc)
{
    struct dlock__async *a = op->a;
    pthread_mutex_lock(&a->mu);
    op->rc = rc;
    op->state = OP_DONE;
    all_unlink(a, op);
    pthread_cond_broadcast(&a->idle_cv);
    pthread_mutex_unlock(&a->mu);
}

/* Run retired OP's continuation on this pool thread, with its outcome's
 * message (the thread's now), and free it first: the continuation may
 * start the next acquire of its handle. */
static void then_run(struct op *op)
{
    dlock__then_fn then = op->then;
    dlock_lock *l = op->l;
    void *arg = op->arg;
    int rc = op->rc;
    op_free(op);
    then(l, rc, arg);
}

/* -------------------------------------------------------------- attempts */

/* The end of acquire OP with RC: the backend's wake-up undone, the hold
 * registered or dropped as the blocking acquire does. */
static void acquire_end(struct op *op, int rc)
{
    dlock_lock *l = op->l;
    dlock_client *c = l->c;
    if (op->armed)
        rc = dlock__backend_disarm(c, op->h, &op->w, op->park, rc);
    op->park = NULL;
    if (rc == DLOCK_ETIMEDOUT && op->outage_msg[0]) /* the one rule, every backend */
        dlock__err(rc, "still failing when the wait ended: %s", op->outage_msg);
    /* A backend that did not confirm: validity from before the request
     * that took the lock, never later than the truth (as lock.c). */
    if (!rc && op->h->lease_ms && op->h->valid_until == DLOCK__NEVER)
        dlock__hold_confirmed(c, op->h, op->sent);
    if (!rc) /* told of contenders, as a blocking acquire's hold is */
        dlock__contend_watch(c, l, op->h);
    if (op->cancel)
        dlock__cancel_detach(op->cancel, &op->cref);
    struct dlock__entry *e = l->e; /* the handle keeps it */
    pthread_mutex_lock(&c->mu);
    dlock__waitref_remove(&l->waits, &op->ref);
    rc = dlock__acquire_end(l, op->h, rc, op->claimed);
    op->h = NULL;
    if (rc == DLOCK_OK)
        DLOCK__COUNT(c, acquisitions, 1);
    rc = dlock__acquire_outcome(e, rc, op->wait_ms, op->w.delay_until);
    /* DONE before c->mu is dropped: end_ops(), which cancels the ops it
     * saw not DONE under c->mu, never touches one a dispatch may free. */
    bool then = op->then != NULL; /* a finished op may be freed by a dispatch */
    if (then) {
        l->async_call = false; /* the continuation may start the next call */
        op_retire(op, rc);
    } else {
        op_finish(op, rc);
    }
    pthread_mutex_unlock(&c->mu);
    if (then)
        then_run(op);
}

/* Park OP after a busy attempt begun at wake count SEQ: until a wake,
 * its retry time or its deadline. A wake since SEQ runs it at once. */
static void park(struct op *op, unsigned seq)
{
    struct dlock__async *a = op->a;
    int64_t until = op->w.retry_at < op->w.deadline ? op->w.retry_at : op->w.deadline;
    pthread_mutex_lock(&a->mu);
    op->w.slept = true;
    op->until = until;
    if (dlock__wait_seq(&op->w) != seq || dlock__wait_canceled(&op->w) ||
        until <= dlock__now_ms()) {
        make_runnable(a, op);
    } else {
        op->state = OP_PARKED;
        pthread_cond_signal(&a->timer_cv); /* the timer thread times it */
    }
    pthread_mutex_unlock(&a->mu);
}

/* One step of acquire OP on a pool thread: an attempt, then park or end. */
static void acquire_step(struct op *op)
{
    dlock_client *c = op->l->c;
    unsigned seq = dlock__wait_seq(&op->w);
    int rc;
    dlock__msg_clear();
    if (dlock__wait_canceled(&op->w)) {
        rc = DLOCK_ECANCELED;
    } else if (op->wait_ms == 0) {
        op->sent = dlock__now_ms();
        rc = dlock__wait_outcome(&op->w, dlock__backend_acquire(c, op->h, &op->w));
    } else if (op->armed && dlock__now_ms() >= op->w.deadline) {
        rc = DLOCK_ETIMEDOUT; /* acquire_outcome words it */
    } else {
        op->w.retry_at = DLOCK__NEVER;
        op->armed = true;
        op->sent = dlock__now_ms();
        op->outage_now = false;
        rc = dlock__backend_try_armed(c, op->h, &op->w, &op->park);
        if (rc == DLOCK_EBUSY && !op->outage_now) { /* got through: the outage is over */
            dlock__backoff_reset(&op->outage);
            op->outage_msg[0] = 0;
        }
        int armed = rc == DLOCK_EBUSY && op->cancel ? dlock__cancel_arm(op->cancel) : DLOCK_OK;
        if (armed) /* else a fire from now on reaches the parked wait */
            rc = armed;
        if (rc == DLOCK_EBUSY) {
            park(op, seq);
            return;
        }
        int got = rc;
        rc = dlock__wait_outcome(&op->w, rc);
        if (rc == DLOCK_ETIMEDOUT && got == DLOCK_ETIMEDOUT)
            dlock__msg_clear(); /* else the words of the failure (no reply) stay */
    }
    acquire_end(op, rc);
}

int dlock__wait_outage(struct dlock__wait *w)
{
    struct op *op = (struct op *)w; /* try_armed()'s W is an op's */
    dlock__errmsg_save(op->outage_msg);
    op->outage_now = true;
    dlock__wait_retry_at(w, dlock__now_ms() + dlock__backoff_next(&op->outage));
    return DLOCK_EBUSY;
}

static void release_step(struct op *op)
{
    dlock__msg_clear();
    op_finish(op, dlock_release(op->l));
}

/* A job's run: its end, or nothing more here when it goes on in the
 * acquires it started (their continuation ends it: OP may be freed
 * by then, so it is not touched again). */
static void job_step(struct op *op)
{
    dlock__msg_clear();
    int rc = op->job->run(op->job);
    if (rc != DLOCK__LATER)
        op_finish(op, rc);
}

/* A pool thread: runs runnable ops. */
static void *pool_main(void *arg)
{
    struct dlock__async *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        struct op *op = pop(&a->run_head, &a->run_tail);
        if (op) {
            op->state = OP_RUNNING;
            a->busy++;
            a->last_start = dlock__now_ms();
            pthread_mutex_unlock(&a->mu);
            if (op->kind == OP_ACQUIRE)
                acquire_step(op);
            else if (op->kind == OP_RELEASE)
                release_step(op);
            else
                job_step(op);
            pthread_mutex_lock(&a->mu);
            a->busy--;
            continue;
        }
        if (a->stop)
            break;
        pthread_cond_wait(&a->cv, &a->mu);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

/* The timer thread: makes the parked ops runnable at their times, and
 * adds a pool thread when ops queue behind threads all stuck in
 * attempts. It never makes a request, so a stalled server cannot hold
 * up the times it keeps. */
static void *timer_main(void *arg)
{
    struct dlock__async *a = arg;
    pthread_mutex_lock(&a->mu);
    while (!a->stop) {
        int64_t now = dlock__now_ms(), next = DLOCK__NEVER;
        for (struct op *p = a->all; p; p = p->all_next) {
            if (p->state != OP_PARKED)
                continue;
            if (p->until <= now)
                make_runnable(a, p);
            else if (p->until < next)
                next = p->until;
        }
        if (a->run_head && a->busy >= a->nthreads && a->nthreads < POOL_MAX) {
            int64_t stuck_at = a->last_start + STALL_MS;
            if (stuck_at <= now && !pool_grow(a))
                continue; /* the new thread takes the queue's head */
            if (stuck_at > now && stuck_at < next)
                next = stuck_at;
        }
        if (next == DLOCK__NEVER) {
            pthread_cond_wait(&a->timer_cv, &a->mu);
        } else {
            struct timespec ts = {(time_t)(next / 1000), (long)(next % 1000) * 1000000L};
            pthread_cond_timedwait(&a->timer_cv, &a->mu, &ts);
        }
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

/* ------------------------------------------------------------ the client */

/* Stop and join A's pool threads; no op may run or wait any more. */
static void pool_stop(struct dlock__async *a)
{
    pthread_mutex_lock(&a->mu);
    a->stop = true; /* no thread is added from now on */
    unsigned n = a->nthreads;
    pthread_cond_broadcast(&a->cv);
    pthread_cond_signal(&a->timer_cv);
    pthread_mutex_unlock(&a->mu);
    if (a->has_timer)
        pthread_join(a->timer, NULL);
    a->has_timer = false;
    for (unsigned i = 0; i < n; i++)
        pthread_join(a->threads[i], NULL);
    a->nthreads = 0;
}

/* C's async state, made (eventfd, pool) by the first call (c->mu held). */
static int async_get(dlock_client *c, struct dlock__async **out)
{
    struct dlock__async *a = c->async;
    if (a) {
        *out = a;
        return a->closing ? dlock__err(DLOCK_EMISUSE, "%s: the client is closing", c->url.redacted)
                          : DLOCK_OK;
    }
    a = calloc(1, sizeof *a);
    if (!a)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    a->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (a->efd < 0) {
        int rc = dlock__errno(DLOCK_EIO, errno, "%s: eventfd for completions", c->url.redacted);
        free(a);
        return rc;
    }
    pthread_mutex_init(&a->mu, NULL);
    dlock__cond_init_monotonic(&a->cv);
    dlock__cond_init_monotonic(&a->idle_cv);
    dlock__cond_init_monotonic(&a->timer_cv);
    int err = 0;
    while (!err && a->nthreads < POOL_MIN)
        err = pool_grow(a);
    if (!err)
        a->has_timer = !(err = dlock__thread_start(&a->timer, timer_main, a));
    if (err) {
        int rc =
            dlock__errno(DLOCK_EIO, err, "%s: a thread for asynchronous calls", c->url.redacted);
        pool_stop(a); /* no op was started */
        c->async = a;
        dlock__async_free(c);
        return rc;
    }
    c->async = a;
    *out = a;
    return DLOCK_OK;
}

/* The checks every start call makes of L and DONE; C's async state into
 * *A (c->mu held on success only). */
static int start_enter(dlock_lock *l, bool has_done, const char *fn, struct dlock__async **a)
{
    dlock__msg_clear();
    if (!l || !has_done)
        return dlock__err(DLOCK_EINVAL, "%s: NULL argument", fn);
    int rc = dlock__check_client(l->c);
    if (rc)
        return rc;
    if (!l->owner)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%s': %s needs a handle made with DLOCK_LOCK_HANDLE_OWNED (its "
                          "hold belongs to the handle, not to a thread)",
                          l->e->name, fn);
    pthread_mutex_lock(&l->c->mu);
    if ((rc = async_get(l->c, a)))
        pthread_mutex_unlock(&l->c->mu);
    else if (l->acquiring || l->releasing || l->async_call) {
        pthread_mutex_unlock(&l->c->mu);
        rc = dlock__err(DLOCK_EBUSY,
                        "lock '%s': this handle is busy (an asynchronous call through it has not "
                        "had its callback yet, or an acquire or release through it is in "
                        "progress)",
                        l->e->name);
    }
    return rc;
}

static struct op *op_new(dlock_lock *l, struct dlock__async *a, enum op_kind kind, int64_t deadline)
{
    struct op *op = calloc(1, sizeof *op);
    if (!op)
        return NULL;
    dlock__wait_init(&op->w, deadline);
    op->w.on_wake = op_woken;
    op->a = a;
    op->l = l;
    op->kind = kind;
    op->ref.w = op->cref.w = &op->w;
    op->outage = (struct dlock__backoff){.min_ms = OUTAGE_FIRST_MS, .max_ms = OUTAGE_MAX_MS};
    return op;
}

/* Hand OP to the pool (or, DONE, to the completion queue: in the same
 * a->mu section, so end_ops() never sees it not DONE). Called with c->mu
 * held, in the section that found the client not closing: once a close
 * has begun no op joins, so the ops end_ops() collects are all there are. */
static void op_start(struct dlock__async *a, struct op *op, bool done)
{
    pthread_mutex_lock(&a->mu);
    op->all_next = a->all;
    if (a->all)
        a->all->all_prev = op;
    a->all = op;
    if (done)
        op_finish_locked(op, DLOCK_OK);
    else
        make_runnable(a, op);
    pthread_mutex_unlock(&a->mu);
}

int dlock__async_can_wait(const dlock_lock *l, int64_t wait_ms, const char *what)
{
    if (wait_ms < 0 && wait_ms != DLOCK_FOREVER)
        return dlock__err(DLOCK_EINVAL,
                          "%s: wait of %lld ms: a wait is DLOCK_TRY (0), a number of ms, "
                          "or DLOCK_FOREVER (-1)",
                          what, (long long)wait_ms);
    if (wait_ms != 0 && !dlock__backend_parks(l->c, l))
        return dlock__err(DLOCK_ENOTSUP,
                          "%s: the %s backend cannot park a waiting %s yet (an "
                          "asynchronous one there is DLOCK_TRY only: use the blocking call in "
                          "a thread to wait)",
                          what, l->c->be->name,
                          l->elect ? "campaign"
                          : l->sem ? "semaphore acquire"
                                   : "acquire");
    return DLOCK_OK;
}

/* What an acquire op starts with: DONE or THEN (the other NULL), ARG. */
struct acquire_req {
    int64_t wait_ms;
    dlock_cancel *cancel;
    dlock_done_fn done;
    dlock__then_fn then;
    void *arg;
};

/* Start acquire R through L (checked by the caller: wait, cancel). */
static int acquire_start(dlock_lock *l, const struct acquire_req *r, const char *fn)
{
    struct dlock__async *a;
    int rc = start_enter(l, r->done || r->then, fn, &a);
    if (rc)
        return rc;
    dlock_client *c = l->c;
    bool canceled = r->then && l->job_canceled; /* before it began (lock.c) */
    if (r->then)
        l->job_ahead = l->job_canceled = false;
    if (canceled) {
        pthread_mutex_unlock(&c->mu);
        return dlock__err(DLOCK_ECANCELED, "lock '%s': canceled before the acquire began",
                          l->e->name);
    }
    struct op *op = op_new(l, a, OP_ACQUIRE, dlock__deadline(r->wait_ms));
    if (!op) {
        pthread_mutex_unlock(&c->mu);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    op->done = r->done;
    op->then = r->then;
    op->arg = r->arg;
    op->wait_ms = r->wait_ms;
    struct dlock__hold *held = dlock__hold_of(l->e, l->owner);
    if (held && r->then) /* a job's member is never held when it starts */
        rc = dlock__err(DLOCK_EMISUSE, "lock '%s': held already", l->e->name);
    else if (held) /* re-entry: no request, the completion is queued at once */
        rc = dlock__reenter(l, held);
    if (held) {
        l->async_call = !rc;
        if (!rc)
            op_start(a, op, true);
        pthread_mutex_unlock(&c->mu);
        if (rc)
            op_free(op);
        return rc;
    }
    if (r->then && ((const struct dlock__job *)r->arg)->stopping) { /* dlock__job_forget() */
        pthread_mutex_unlock(&c->mu);
        op_free(op);
        return dlock__err(DLOCK_ECANCELED, "lock '%s': its call's object was freed", l->e->name);
    }
    dlock_cancel *cancel = r->cancel;
    if (cancel && (rc = dlock__cancel_attach(cancel, &op->cref))) {
        pthread_mutex_unlock(&c->mu);
        op_free(op);
        return rc == DLOCK_ECANCELED ? dlock__err(DLOCK_ECANCELED,
                                                  "lock '%s': canceled before "
                                                  "the acquire began",
                                                  l->e->name)
                                     : rc;
    }
    op->cancel = cancel;
    op->w.cancel = cancel;
    rc = dlock__acquire_claim_now(l);
    if (!rc && !(op->h = dlock__hold_make(l)))
        rc =
            dlock__acquire_end(l, NULL, DLOCK_ENOMEM, (c->be->caps & DLOCK__CAP_CLIENT_OWNER) != 0);
    if (rc) {
        pthread_mutex_unlock(&c->mu);
        if (cancel)
            dlock__cancel_detach(cancel, &op->cref);
        op_free(op);
        return rc == DLOCK_ENOMEM ? dlock__err(rc, "out of memory") : rc;
    }
    op->claimed = (c->be->caps & DLOCK__CAP_CLIENT_OWNER) != 0;
    op->ref.next = l->waits;
    l->waits = &op->ref;
    l->async_call = true;
    op_start(a, op, false);
    pthread_mutex_unlock(&c->mu);
    return DLOCK_OK;
}

int dlock_acquire_async(dlock_lock *l, int64_t wait_ms, dlock_cancel *cancel, dlock_done_fn done,
                        void *arg)
{
    dlock__msg_clear();
    if (l) {
        char what[DLOCK__MSG_MAX];
        snprintf(what, sizeof what, "lock '%s'", l->e->name);
        int rc = dlock__async_can_wait(l, wait_ms, what);
        if (rc)
            return rc;
    }
    if (dlock_cancel_fired(cancel))
        return dlock__err(DLOCK_ECANCELED, "lock '%s': canceled before the acquire began",
                          l ? l->e->name : "?");
    struct acquire_req r = {wait_ms, cancel, done, NULL, arg};
    return acquire_start(l, &r, "dlock_acquire_async");
}

int dlock_release_async(dlock_lock *l, dlock_done_fn done, void *arg)
{
    struct dlock__async *a;
    int rc = start_enter(l, done != NULL, "dlock_release_async", &a);
    if (rc)
        return rc;
    dlock_client *c = l->c;
    struct op *op = NULL;
    if (!dlock__hold_of(l->e, l->owner)) {
        rc = dlock__not_held(l);
    } else if (!(op = op_new(l, a, OP_RELEASE, DLOCK__NEVER))) {
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    } else {
        l->async_call = true;
        op->done = done;
        op->arg = arg;
        op_start(a, op, false);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int dlock_client_fd(dlock_client *c)
{
    dlock__msg_clear();
    int rc = dlock__check_client(c);
    if (rc)
        return rc;
    if (!c->connected)
        return dlock__err(DLOCK_EMISUSE, "%s: connect the client first", c->url.redacted);
    struct dlock__async *a;
    pthread_mutex_lock(&c->mu);
    if (!(rc = async_get(c, &a))) {
        pthread_mutex_lock(&a->mu);
        if (!a->loop_tid)
            a->loop_tid = dlock__tid();
        rc = a->efd;
        pthread_mutex_unlock(&a->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Run OP's callback and free it (a->mu not held). */
static void deliver(struct op *op)
{
    if (op->kind == OP_JOB) {
        dlock__err(op->rc, "%s", op->msg);
        op->job->deliver(op->job, op->rc);
        op_free(op);
        return;
    }
    if (op->l) { /* the handle takes calls again, from its callback too */
        pthread_mutex_lock(&op->l->c->mu);
        op->l->async_call = false;
        pthread_mutex_unlock(&op->l->c->mu);
    }
    dlock__err(op->rc, "%s", op->msg);
    if (op->done)
        op->done(op->l, op->rc, op->arg);
    op_free(op);
}

/* The next done op to deliver, unlinked (a->mu held); NULL: none. */
static struct op *take_done(struct dlock__async *a)
{
    struct op *op = pop(&a->done_head, &a->done_tail);
    if (op)
        all_unlink(a, op);
    return op;
}

int dlock_dispatch(dlock_client *c)
{
    dlock__msg_clear();
    int rc = dlock__check_client(c);
    if (rc)
        return rc;
    struct dlock__async *a;
    pthread_mutex_lock(&c->mu);
    rc = async_get(c, &a);
    pthread_mutex_unlock(&c->mu);
    if (rc)
        return rc;
    long me = dlock__tid();
    pthread_mutex_lock(&a->mu);
    if (!a->loop_tid)
        a->loop_tid = me;
    if (a->loop_tid != me || a->dispatching) {
        bool nested = a->loop_tid == me;
        pthread_mutex_unlock(&a->mu);
        return nested ? dlock__err(DLOCK_EMISUSE, "%s: dlock_dispatch() from inside a callback",
                                   c->url.redacted)
                      : dlock__err(DLOCK_EMISUSE,
                                   "%s: dlock_dispatch() from thread %ld; the client's "
                                   "completions belong to thread %ld (dlock_client_fd())",
                                   c->url.redacted, me, a->loop_tid);
    }
    a->dispatching = true;
    uint64_t count;
    ssize_t got =
        read(a->efd, &count, sizeof count); /* before taking: a later one stays readable */
    (void)got;
    struct op *batch = NULL, *tail = NULL, *op;
    while ((op = pop(&a->done_head, &a->done_tail)))
        push(&batch, &tail, op);
    int n = 0;
    while (batch) {
        op = pop(&batch, &tail);
        all_unlink(a, op);
        pthread_mutex_unlock(&a->mu);
        deliver(op);
        n++;
        pthread_mutex_lock(&a->mu);
    }
    a->dispatching = false;
    pthread_mutex_unlock(&a->mu);
    dlock__msg_clear();
    return n;
}

/* --------------------------------------------------------- ending calls */

/* Cancel the waits of A's acquires not ended yet: all, or handle ONLY's,
 * or job JOB's members (c->mu held, a->mu not). */
static void cancel_acquires(struct dlock__async *a, const dlock_lock *only,
                            const struct dlock__job *job)
{
    pthread_mutex_lock(&a->mu);
    struct op *cancel = NULL;
    for (struct op *op = a->all; op; op = op->all_next)
        if (op->kind == OP_ACQUIRE && op->state != OP_DONE && (!only || op->l == only) &&
            (!job || (op->then && op->arg == job))) {
            op->cancel_next = cancel;
            cancel = op;
        }
    pthread_mutex_unlock(&a->mu);
    /* None of these is freed meanwhile: only a delivery frees an op, and
     * only once DONE; an acquire becomes DONE under c->mu (acquire_end),
     * which the caller holds from the collection above to the last cancel. */
    for (struct op *op = cancel; op; op = op->cancel_next)
        dlock__wait_cancel(&op->w);
}

/* Cancel the waits of the acquires not ended yet (all, or ONLY's), and
 * wait until no op (all, or ONLY's) runs or waits any more (no lock
 * held). A release is not canceled: it ends within the op timeout. */
static void end_ops(dlock_client *c, struct dlock__async *a, const dlock_lock *only)
{
    pthread_mutex_lock(&c->mu);
    cancel_acquires(a, only, NULL);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_lock(&a->mu);
    for (;;) {
        bool busy = false;
        for (struct op *op = a->all; op && !busy; op = op->all_next)
            busy = op->state != OP_DONE && (!only || op->l == only);
        if (!busy)
            break;
        pthread_cond_wait(&a->idle_cv, &a->mu);
    }
    pthread_mutex_unlock(&a->mu);
}

void dlock__async_forget(dlock_lock *l)
{
    dlock_client *c = l->c;
    pthread_mutex_lock(&c->mu);
    struct dlock__async *a = c->async;
    pthread_mutex_unlock(&c->mu);
    if (!a)
        return;
    end_ops(c, a, l);
    pthread_mutex_lock(&a->mu);
    for (struct op *op = a->all; op; op = op->all_next)
        if (op->l == l) {
            op->l = NULL;
            op->rc = DLOCK_ECANCELED;
            snprintf(op->msg, sizeof op->msg,
                     "lock '%s': the handle was freed before its completion was dispatched",
                     l->e->name);
        }
    pthread_mutex_unlock(&a->mu);
}

void dlock__async_close(dlock_client *c)
{
    pthread_mutex_lock(&c->mu);
    struct dlock__async *a = c->async;
    if (a) {
        pthread_mutex_lock(&a->mu);
        a->closing = true;
        pthread_mutex_unlock(&a->mu);
    }
    pthread_mutex_unlock(&c->mu);
    if (!a)
        return;
    end_ops(c, a, NULL);
    pool_stop(a);
    /* The completions still owed run here: none after close returns. */
    for (;;) {
        pthread_mutex_lock(&a->mu);
        struct op *op = take_done(a);
        pthread_mutex_unlock(&a->mu);
        if (!op)
            break;
        deliver(op);
    }
}

void dlock__async_free(dlock_client *c)
{
    struct dlock__async *a = c->async;
    if (!a)
        return;
    close(a->efd);
    pthread_cond_destroy(&a->cv);
    pthread_cond_destroy(&a->timer_cv);
    pthread_cond_destroy(&a->idle_cv);
    pthread_mutex_destroy(&a->mu);
    free(a);
    c->async = NULL;
}

/* ------------------------------------------------------------------ jobs */

/* J's op, started on C's pool in the section that finds C not closing. */
int dlock__job_start(dlock_client *c, struct dlock__job *j)
{
    struct dlock__async *a;
    pthread_mutex_lock(&c->mu);
    int rc = async_get(c, &a);
    struct op *op = rc ? NULL : op_new(NULL, a, OP_JOB, DLOCK__NEVER);
    if (!rc && !op)
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    if (op) {
        op->job = j;
        j->op = op;
        op_start(a, op, false);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void dlock__job_end(struct dlock__job *j, int rc)
{
    op_finish(j->op, rc);
}

int dlock__acquire_then(dlock_lock *l, int64_t wait_ms, dlock_cancel *cancel, dlock__then_fn then,
                        void *arg)
{
    struct acquire_req r = {wait_ms, cancel, NULL, then, arg};
    int rc = acquire_start(l, &r, "an asynchronous call's member");
    if (rc == DLOCK_EMISUSE && dlock__async_closing(l->c))
        rc = dlock__err(DLOCK_ECANCELED, "lock '%s': the client is closing", l->e->name);
    return rc;
}

bool dlock__async_closing(dlock_client *c)
{
    pthread_mutex_lock(&c->mu);
    struct dlock__async *a = c->async;
    bool closing = false;
    if (a) {
        pthread_mutex_lock(&a->mu);
        closing = a->closing;
        pthread_mutex_unlock(&a->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return closing;
}

/* Whether OP is still among A's ops (not taken by a dispatch; a->mu). */
static bool op_listed(const struct dlock__async *a, const struct op *op)
{
    for (const struct op *p = a->all; p; p = p->all_next)
        if (p == op)
            return true;
    return false;
}

void dlock__job_forget(dlock_client *c, struct dlock__job *j, const char *what)
{
    pthread_mutex_lock(&c->mu);
    j->stopping = true; /* acquire_start() refuses its members from now on */
    struct dlock__async *a = c->async;
    if (!a) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    cancel_acquires(a, NULL, j); /* its member acquire that waits */
    pthread_mutex_unlock(&c->mu);
    /* Its end: the continuation of that member, or its run, ends it. */
    struct op *jop = j->op;
    pthread_mutex_lock(&a->mu);
    bool listed;
    while ((listed = op_listed(a, jop)) && jop->state != OP_DONE)
        pthread_cond_wait(&a->idle_cv, &a->mu);
    if (listed) {
        jop->rc = DLOCK_ECANCELED;
        snprintf(jop->msg, sizeof jop->msg, "%s: freed before its completion was dispatched", what);
        j->forgotten = true;
    }
    pthread_mutex_unlock(&a->mu);
}
