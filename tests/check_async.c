/* check_async.c -- the asynchronous calls (src/async.c): acquires that
 * wait without a thread, completions through dlock_client_fd() and
 * dlock_dispatch(), exactly once each, the close and free rules; on the
 * file backend (parked waits woken by inotify: a release, a holder's
 * death in another process), on a real redis-server (parked waits woken
 * by release messages) and on a real etcd (parked waits woken by
 * watches, keeping their place in the queue). Each
 * test runs in its own process with a time limit; the only times
 * checked are lower bounds or generous ones.
 */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dlock.h"
#include "testutil.h"
#ifdef DLOCK_HAVE_REDIS
#include "fixture_redis.h"
#endif
#ifdef DLOCK_HAVE_ZK
#include "fixture_zk.h"
#include "relay.h"
#endif
#ifdef DLOCK_HAVE_ETCD
#include "fixture_etcd.h"
#include "relay.h"
#endif
#ifdef DLOCK_HAVE_LIBUV
#include "dlock/adapters/libuv.h"
#endif
#ifdef DLOCK_HAVE_LIBEVENT
#include "dlock/adapters/libevent.h"
#endif

/* ------------------------------------------------------------- helpers */

#define LOG_MAX 256

/* What completions came: their handles and codes, in order. */
struct done_log {
    int n;
    dlock_lock *l[LOG_MAX];
    int rc[LOG_MAX];
    char msg[LOG_MAX][128];
};

static void on_done(dlock_lock *l, int rc, void *arg)
{
    struct done_log *d = arg;
    ck_assert_int_lt(d->n, LOG_MAX);
    d->l[d->n] = l;
    d->rc[d->n] = rc;
    snprintf(d->msg[d->n], sizeof d->msg[0], "%s", dlock_errmsg());
    d->n++;
}

/* The loop: wait on C's descriptor and dispatch, until *COUNT reaches
 * WANT or MAX_MS passed. Returns whether it did. */
static bool pump_until(dlock_client *c, const int *count, int want, int max_ms)
{
    int fd = dlock_client_fd(c);
    ck_assert_int_ge(fd, 0);
    int64_t end = tu_mono_ms() + max_ms;
    while (*count < want) {
        int64_t left = end - tu_mono_ms();
        if (left <= 0)
            return false;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)(left < 100 ? left : 100)) > 0)
            ck_assert_int_ge(dlock_dispatch(c), 0);
    }
    return true;
}

static dlock_lock *owned(dlock_client *c, const char *name)
{
    dlock_lock *l;
    ck_assert_int_eq(dlock_lock_new(c, name, DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED, &l),
                     DLOCK_OK);
    return l;
}

static int threads_now(void)
{
    DIR *d = opendir("/proc/self/task");
    ck_assert_ptr_nonnull(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* The frame of a contended test: client C for the asynchronous side, and
 * on another client a RIVAL handle on NAME, holding it when HELD. */
struct contended {
    dlock_client *c, *other;
    dlock_lock *rival;
    char *url; /* the server's, when the frame made it (freed with it) */
};

static void contended_open(struct contended *x, const char *server, const char *name, bool held)
{
    x->url = NULL;
    ck_assert_int_eq(dlock_open(server, &x->c), DLOCK_OK);
    ck_assert_int_eq(dlock_open(server, &x->other), DLOCK_OK);
    ck_assert_int_eq(dlock_lock_new(x->other, name, DLOCK_EXCLUSIVE, 0, &x->rival), DLOCK_OK);
    if (held)
        ck_assert_int_eq(dlock_acquire(x->rival, DLOCK_TRY), DLOCK_OK);
}

/* Frees the rival (its hold ends) and closes both clients. */
static void contended_close(struct contended *x)
{
    dlock_lock_free(x->rival);
    dlock_client_close(x->c);
    dlock_client_close(x->other);
    free(x->url);
}

/* ------------------------------------------------------ the file backend */

static char *dir, *url;

static void setup(void)
{
    tu_file_fixture("async", &dir, &url);
}

static void teardown(void)
{
    tu_file_fixture_end(&dir, &url);
}

TU_TEST(file_try_takes_and_a_wait_parks, 30)
{
    struct contended x;
    contended_open(&x, url, "job", false);
    dlock_client *c = x.c;
    dlock_lock *l = owned(c, "job"), *rival = x.rival;
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(l, DLOCK_TRY, NULL, on_done, &d), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 1, 10000));
    ck_assert_int_eq(d.rc[0], DLOCK_OK);
    ck_assert_ptr_eq(d.l[0], l);
    uint64_t token;
    ck_assert_int_eq(dlock_token(l, &token), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(rival, DLOCK_TRY), DLOCK_EBUSY);

    /* a wait parks: held by L, it ends at its bound */
    dlock_lock *l2 = owned(c, "job");
    ck_assert_int_eq(dlock_acquire_async(l2, 200, NULL, on_done, &d), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 2, 20000));
    ck_assert_msg(d.rc[1] == DLOCK_ETIMEDOUT, "%d: %s", d.rc[1], d.msg[1]);

    /* a try of another handle is busy */
    ck_assert_int_eq(dlock_acquire_async(l2, DLOCK_TRY, NULL, on_done, &d), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 3, 10000));
    ck_assert_int_eq(d.rc[2], DLOCK_EBUSY);

    ck_assert_int_eq(dlock_release_async(l, on_done, &d), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 4, 10000));
    ck_assert_int_eq(d.rc[3], DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(rival, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_release(rival), DLOCK_OK);
    ck_assert_int_eq(dlock_release_async(l, on_done, &d), DLOCK_ENOTOWNER);
    dlock_lock_free(l);
    dlock_lock_free(l2);
    contended_close(&x);
    ck_assert_int_eq(d.n, 4);
}

/* "One asynchronous call per handle is in flight at a time"
 * (dlock_acquire_async(3)): a second release started while the first is
 * queued must be refused (DLOCK_EBUSY), not accepted and answered later. */
TU_TEST(second_release_while_one_queued_is_busy, 30)
{
    dlock_client *c;
    ck_assert_int_eq(dlock_open(url, &c), DLOCK_OK);
    dlock_lock *l = owned(c, "rel2");
    struct done_log d = {0};
    int accepted = 0;
    for (int round = 0; round < 200; round++) {
        ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
        d.n = 0;
        int want = 1;
        ck_assert_int_eq(dlock_release_async(l, on_done, &d), DLOCK_OK);
        if (dlock_release_async(l, on_done, &d) == DLOCK_OK) {
            accepted++;
            want++;
        }
        ck_assert(pump_until(c, &d.n, want, 10000));
        for (int i = 0; i < d.n; i++)
            ck_assert_msg(accepted || d.rc[i] == DLOCK_OK, "completion %d: %d (%s)", i, d.rc[i],
                          d.msg[i]);
    }
    ck_assert_msg(accepted == 0, "%d of 200 second releases were accepted", accepted);
    dlock_lock_free(l);
    dlock_client_close(c);
}

TU_TEST(start_refusals, 30)
{
    dlock_client *c;
    ck_assert_int_eq(dlock_open(url, &c), DLOCK_OK);
    dlock_lock *per_thread, *l = owned(c, "x");
    ck_assert_int_eq(dlock_lock_new(c, "x", DLOCK_EXCLUSIVE, 0, &per_thread), DLOCK_OK);
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(per_thread, 0, NULL, on_done, &d), DLOCK_EINVAL);
    ck_assert_ptr_nonnull(strstr(dlock_errmsg(), "DLOCK_LOCK_HANDLE_OWNED"));
    ck_assert_int_eq(dlock_acquire_async(l, 0, NULL, NULL, &d), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_acquire_async(l, -7, NULL, on_done, &d), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_release_async(l, on_done, &d), DLOCK_ENOTOWNER);
    dlock_cancel *k;
    ck_assert_int_eq(dlock_cancel_new(&k), DLOCK_OK);
    ck_assert_int_eq(dlock_cancel_fire(k), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire_async(l, 0, k, on_done, &d), DLOCK_ECANCELED);
    ck_assert_int_eq(dlock_dispatch(NULL), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_client_fd(NULL), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_dispatch(c), 0);
    ck_assert_int_eq(d.n, 0);
    dlock_lock_free(l);
    dlock_lock_free(per_thread);
    dlock_cancel_free(k);
    dlock_client_close(c);
}

/* Re-entry through the handle: queued at once, the count goes up. */
TU_TEST(reentry_counts, 30)
{
    dlock_client *c;
    ck_assert_int_eq(dlock_open(url, &c), DLOCK_OK);
    dlock_lock *l = owned(c, "r");
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(l, 0, NULL, on_done, &d), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 1, 10000));
    ck_assert_int_eq(dlock_acquire_async(l, 0, NULL, on_done, &d), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 2, 10000));
    ck_assert_int_eq(d.rc[1], DLOCK_OK);
    ck_assert_uint_eq(dlock_hold_count(l), 2);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    ck_assert_uint_eq(dlock_hold_count(l), 0);
    dlock_lock_free(l);
    dlock_client_close(c);
}

/* One asynchronous call per handle until its callback ran: a second
 * start is DLOCK_EBUSY, whatever the first one is. */
TU_TEST(one_call_per_handle, 30)
{
    dlock_client *c;
    ck_assert_int_eq(dlock_open(url, &c), DLOCK_OK);
    dlock_lock *l = owned(c, "one");
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(l, 0, NULL, on_done, &d), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire_async(l, 0, NULL, on_done, &d), DLOCK_EBUSY);
    ck_assert(pump_until(c, &d.n, 1, 10000));
    ck_assert_int_eq(d.rc[0], DLOCK_OK);
    ck_assert_int_eq(dlock_release_async(l, on_done, &d), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire_async(l, 0, NULL, on_done, &d), DLOCK_EBUSY);
    ck_assert_int_eq(dlock_release_async(l, on_done, &d), DLOCK_EBUSY);
    ck_assert(pump_until(c, &d.n, 2, 10000));
    ck_assert_int_eq(d.rc[1], DLOCK_OK);
    ck_assert_uint_eq(dlock_hold_count(l), 0);
    ck_assert_int_eq(d.n, 2);
    dlock_lock_free(l);
    dlock_client_close(c);
}

struct other_thread {
    dlock_client *c;
    int rc;
};

static void *dispatch_there(void *arg)
{
    struct other_thread *t = arg;
    t->rc = dlock_dispatch(t->c);
    return NULL;
}

static void dispatch_inside(dlock_lock *l, int rc, void *arg)
{
    (void)l;
    (void)rc;
    struct other_thread *t = arg;
    t->rc = dlock_dispatch(t->c);
}

/* The loop's thread alone dispatches, never from inside a callback. */
TU_TEST(dispatch_thread_rules, 30)
{
    dlock_client *c;
    ck_assert_int_eq(dlock_open(url, &c), DLOCK_OK);
    ck_assert_int_ge(dlock_client_fd(c), 0); /* binds this thread */
    struct other_thread t = {c, 1};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, dispatch_there, &t), 0);
    pthread_join(th, NULL);
    ck_assert_int_eq(t.rc, DLOCK_EMISUSE);
    dlock_lock *l = owned(c, "d");
    t.rc = 1;
    ck_assert_int_eq(dlock_acquire_async(l, 0, NULL, dispatch_inside, &t), DLOCK_OK);
    int fd = dlock_client_fd(c);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    ck_assert_int_eq(poll(&p, 1, 10000), 1);
    ck_assert_int_eq(dlock_dispatch(c), 1);
    ck_assert_int_eq(t.rc, DLOCK_EMISUSE);
    dlock_client_close(c);
    ck_assert_int_eq(dlock_dispatch(c), DLOCK_EMISUSE); /* its memory lives with L */
    dlock_lock_free(l);
}

/* A handle freed with its completion not dispatched: the completion
 * still comes, once, with no handle and DLOCK_ECANCELED. */
TU_TEST(handle_freed_before_dispatch, 30)
{
    struct contended x;
    contended_open(&x, url, "f", false);
    dlock_client *c = x.c;
    dlock_lock *l = owned(c, "f"), *rival = x.rival;
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(l, 0, NULL, on_done, &d), DLOCK_OK);
    int fd = dlock_client_fd(c);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    ck_assert_int_eq(poll(&p, 1, 10000), 1); /* ended, not dispatched */
    dlock_lock_free(l);
    ck_assert_int_eq(dlock_acquire(rival, DLOCK_TRY), DLOCK_OK); /* the hold ended */
    ck_assert_int_eq(dlock_dispatch(c), 1);
    ck_assert_int_eq(d.n, 1);
    ck_assert_ptr_null(d.l[0]);
    ck_assert_int_eq(d.rc[0], DLOCK_ECANCELED);
    ck_assert_int_eq(dlock_dispatch(c), 0);
    contended_close(&x);
}

/* -------------------------------------------------- on a server (any) */

#define PARKED 40 /* acquires parked at once in the close tests */

/* C has PARKED acquires parked, logged in D: at most MORE threads were
 * added since BEFORE threads ran; closing C completes each exactly once,
 * during the close, with DLOCK_ECANCELED. */
static void close_with_parked(dlock_client *c, struct done_log *d, int before, int more)
{
    int during = threads_now();
    ck_assert_msg(during - before <= more, "%d threads before, %d with %d waiters parked", before,
                  during, PARKED);
    dlock_client_close(c);
    ck_assert_int_eq(d->n, PARKED);
    for (int i = 0; i < PARKED; i++) {
        ck_assert_int_eq(d->rc[i], DLOCK_ECANCELED);
        for (int j = 0; j < i; j++)
            ck_assert_ptr_ne(d->l[i], d->l[j]);
    }
}

/* Whoever holds "x" (the exclusion tests) sets INSIDE while it does. */
static atomic_int inside;

struct blocking_turns {
    const char *url;
    int turns;
    int rc, bad;
};

static void *blocking_main(void *arg)
{
    struct blocking_turns *b = arg;
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    b->rc = dlock_open(b->url, &c);
    if (!b->rc)
        b->rc = dlock_lock_new(c, "x", DLOCK_EXCLUSIVE, 0, &l);
    for (int i = 0; !b->rc && i < b->turns; i++) {
        if ((b->rc = dlock_acquire(l, 20000)))
            break;
        b->bad += atomic_fetch_add(&inside, 1) != 0;
        usleep(2000);
        atomic_fetch_sub(&inside, 1);
        b->rc = dlock_release(l);
    }
    dlock_lock_free(l);
    dlock_client_close(c);
    return NULL;
}

struct async_turns {
    dlock_lock *l;
    int left, done, bad;
    char why[256]; /* the first failed acquire's message, "" none */
};

static void turn_released(dlock_lock *l, int rc, void *arg);

/* A failed acquire counts as bad and goes on to the next turn without
 * entering: counted as inside, a stalled waiter's timeout would show up
 * as two holders at once, the blocking side's (as it once did on zk). */
static void turn_acquired(dlock_lock *l, int rc, void *arg)
{
    struct async_turns *t = arg;
    if (rc != DLOCK_OK) {
        if (!t->bad)
            snprintf(t->why, sizeof t->why, "%s: %s", dlock_err_name(rc), dlock_errmsg());
        t->bad++;
        turn_released(l, DLOCK_OK, t);
        return;
    }
    t->bad += atomic_fetch_add(&inside, 1) != 0;
    usleep(1000);
    atomic_fetch_sub(&inside, 1);
    if (dlock_release_async(l, turn_released, t))
        t->bad++;
}

static void turn_released(dlock_lock *l, int rc, void *arg)
{
    struct async_turns *t = arg;
    t->bad += rc != DLOCK_OK;
    if (--t->left == 0)
        t->done = 1;
    else if (dlock_acquire_async(l, 20000, NULL, turn_acquired, t))
        t->bad++;
}

/* The bodies of the parked-wait tests every backend whose waits park
 * runs (its server's URL). */

/* A holder elsewhere: the asynchronous acquire waits (nothing comes)
 * until the release, then holds with a newer token; the blocking side
 * is kept out until its asynchronous release. */
static void waits_for_a_blocking_holder(const char *server)
{
    struct contended x;
    contended_open(&x, server, "w", true);
    dlock_client *c = x.c;
    dlock_lock *rival = x.rival, *l = owned(c, "w");
    uint64_t t1, t2;
    ck_assert_int_eq(dlock_token(rival, &t1), DLOCK_OK);
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(l, 30000, NULL, on_done, &d), DLOCK_OK);
    ck_assert(!pump_until(c, &d.n, 1, 500)); /* held elsewhere: waits */
    ck_assert_int_eq(dlock_release(rival), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 1, 20000));
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_int_eq(dlock_token(l, &t2), DLOCK_OK);
    ck_assert_uint_gt(t2, t1);
    ck_assert_int_eq(dlock_acquire(rival, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_int_eq(dlock_release_async(l, on_done, &d), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 2, 20000));
    ck_assert_int_eq(d.rc[1], DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(rival, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_release(rival), DLOCK_OK);
    dlock_lock_free(l);
    contended_close(&x);
}

/* The wait's bound: DLOCK_ETIMEDOUT, not before the bound. */
static void wait_bound(const char *server)
{
    struct contended x;
    contended_open(&x, server, "b", true);
    dlock_client *c = x.c;
    dlock_lock *l = owned(c, "b");
    struct done_log d = {0};
    int64_t t0 = tu_mono_ms();
    ck_assert_int_eq(dlock_acquire_async(l, 300, NULL, on_done, &d), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 1, 20000));
    ck_assert_int_ge(tu_mono_ms() - t0, 300);
    ck_assert_msg(d.rc[0] == DLOCK_ETIMEDOUT, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_ptr_nonnull(strstr(d.msg[0], "'b'"));
    ck_assert_uint_eq(dlock_hold_count(l), 0);
    dlock_lock_free(l);
    contended_close(&x);
}

/* A parked wait canceled by dlock_lock_cancel() and by a cancel object. */
static void cancel_while_parked(const char *server)
{
    struct contended x;
    contended_open(&x, server, "k", true);
    dlock_client *c = x.c;
    dlock_lock *rival = x.rival, *l = owned(c, "k"), *l2 = owned(c, "k");
    dlock_cancel *k;
    ck_assert_int_eq(dlock_cancel_new(&k), DLOCK_OK);
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(l, DLOCK_FOREVER, NULL, on_done, &d), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire_async(l2, DLOCK_FOREVER, k, on_done, &d), DLOCK_OK);
    ck_assert_msg(!pump_until(c, &d.n, 1, 300), "%d: %s", d.rc[0], d.msg[0]); /* both parked */
    ck_assert_int_eq(dlock_lock_cancel(l), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 1, 20000));
    ck_assert_ptr_eq(d.l[0], l);
    ck_assert_int_eq(d.rc[0], DLOCK_ECANCELED);
    ck_assert_int_eq(dlock_cancel_fire(k), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 2, 20000));
    ck_assert_ptr_eq(d.l[1], l2);
    ck_assert_int_eq(d.rc[1], DLOCK_ECANCELED);
    /* nothing left behind: the rival's release is the only holder's */
    ck_assert_int_eq(dlock_release(rival), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire_async(l, DLOCK_TRY, NULL, on_done, &d), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 3, 20000));
    ck_assert_int_eq(d.rc[2], DLOCK_OK);
    dlock_lock_free(l);
    dlock_lock_free(l2);
    dlock_cancel_free(k);
    contended_close(&x);
}

/* Shared holds: a reader elsewhere lets an asynchronous reader in at
 * once and keeps an asynchronous writer parked until it goes. */
static void shared_readers_and_a_parked_writer(const char *server)
{
    struct contended x = {0};
    ck_assert_int_eq(dlock_open(server, &x.c), DLOCK_OK);
    ck_assert_int_eq(dlock_open(server, &x.other), DLOCK_OK);
    ck_assert_int_eq(dlock_lock_new(x.other, "rw", DLOCK_SHARED, 0, &x.rival), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(x.rival, DLOCK_TRY), DLOCK_OK);
    dlock_lock *reader, *writer = owned(x.c, "rw");
    ck_assert_int_eq(dlock_lock_new(x.c, "rw", DLOCK_SHARED, DLOCK_LOCK_HANDLE_OWNED, &reader),
                     DLOCK_OK);
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(reader, 20000, NULL, on_done, &d), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 1, 20000));
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_int_eq(dlock_acquire_async(writer, 20000, NULL, on_done, &d), DLOCK_OK);
    ck_assert(!pump_until(x.c, &d.n, 2, 500)); /* two readers hold */
    ck_assert_int_eq(dlock_release(x.rival), DLOCK_OK);
    ck_assert(!pump_until(x.c, &d.n, 2, 300)); /* one reader still holds */
    ck_assert_int_eq(dlock_release(reader), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 2, 20000));
    ck_assert_ptr_eq(d.l[1], writer);
    ck_assert_msg(d.rc[1] == DLOCK_OK, "%d: %s", d.rc[1], d.msg[1]);
    ck_assert_int_eq(dlock_acquire(x.rival, DLOCK_TRY), DLOCK_EBUSY);
    dlock_lock_free(reader);
    dlock_lock_free(writer);
    contended_close(&x);
}

/* Close with acquires parked: each completes exactly once, during the
 * close, with DLOCK_ECANCELED; the waiters held no thread meanwhile. */
static void close_ends_each_once_and_waiters_hold_no_thread(const char *server)
{
    dlock_client *c, *other;
    ck_assert_int_eq(dlock_open(server, &c), DLOCK_OK);
    ck_assert_int_eq(dlock_open(server, &other), DLOCK_OK);
    dlock_lock *rival, *ls[PARKED];
    ck_assert_int_eq(dlock_lock_new(other, "c", DLOCK_EXCLUSIVE, 0, &rival), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(rival, DLOCK_TRY), DLOCK_OK);
    struct done_log d = {0};
    ls[0] = owned(c, "c");
    ck_assert_int_eq(dlock_acquire_async(ls[0], DLOCK_FOREVER, NULL, on_done, &d), DLOCK_OK);
    ck_assert(!pump_until(c, &d.n, 1, 300)); /* the pool and the wake-up's thread run now */
    int before = threads_now();
    for (int i = 1; i < PARKED; i++) {
        ls[i] = owned(c, "c");
        ck_assert_int_eq(dlock_acquire_async(ls[i], DLOCK_FOREVER, NULL, on_done, &d), DLOCK_OK);
    }
    ck_assert(!pump_until(c, &d.n, 1, 500));
    close_with_parked(c, &d, before, 2);
    for (int i = 0; i < PARKED; i++)
        dlock_lock_free(ls[i]);
    ck_assert_int_eq(d.n, PARKED);
    ck_assert_int_eq(dlock_release(rival), DLOCK_OK);
    dlock_lock_free(rival);
    dlock_client_close(other);
}

/* Two asynchronous waiters and a blocking one on one name: never two
 * holders at once (INSIDE, set by whoever holds), each served. */
static void exclusion_async_and_blocking(const char *server)
{
    dlock_client *c;
    ck_assert_int_eq(dlock_open(server, &c), DLOCK_OK);
    struct blocking_turns b = {server, 20, 0, 0};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, blocking_main, &b), 0);
    int done = 0;
    struct async_turns t[2] = {{.l = owned(c, "x"), .left = 20}, {.l = owned(c, "x"), .left = 20}};
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(dlock_acquire_async(t[i].l, 20000, NULL, turn_acquired, &t[i]), DLOCK_OK);
    int64_t end = tu_mono_ms() + 50000;
    while (!(t[0].done && t[1].done) && tu_mono_ms() < end)
        pump_until(c, &done, 1, 100);
    pthread_join(th, NULL);
    ck_assert_int_eq(b.rc, DLOCK_OK);
    ck_assert_int_eq(b.bad, 0);
    ck_assert(t[0].done && t[1].done);
    ck_assert_int_eq(t[0].bad + t[1].bad, 0);
    dlock_lock_free(t[0].l);
    dlock_lock_free(t[1].l);
    dlock_client_close(c);
}

/* Each of the tests above, for PARKED_TESTS(T): T(NAME) registers NAME
 * on a backend (a test calling NAME(its URL)). */
#define PARKED_TESTS(T)                                \
    T(waits_for_a_blocking_holder)                     \
    T(wait_bound)                                      \
    T(cancel_while_parked)                             \
    T(shared_readers_and_a_parked_writer)              \
    T(close_ends_each_once_and_waiters_hold_no_thread) \
    T(exclusion_async_and_blocking)

/* ---------------------------------------------- asynchronous elections */

/* What campaign and resign completions came: the elections, the codes,
 * and the token each won campaign's callback read (0: none). */
struct elect_log {
    int n;
    dlock_election *e[LOG_MAX];
    int rc[LOG_MAX];
    uint64_t token[LOG_MAX];
    char msg[LOG_MAX][256];
};

static void on_elect_done(dlock_election *e, int rc, void *arg)
{
    struct elect_log *d = arg;
    ck_assert_int_lt(d->n, LOG_MAX);
    d->e[d->n] = e;
    d->rc[d->n] = rc;
    snprintf(d->msg[d->n], sizeof d->msg[0], "%s", dlock_errmsg());
    uint64_t token = 0;
    if (rc == DLOCK_OK && e && dlock_election_token(e, &token) != DLOCK_OK)
        token = 0; /* a leader whose token cannot be read: the test sees 0 */
    d->token[d->n] = token;
    d->n++;
}

static dlock_election *election_on(dlock_client *c, const char *name)
{
    dlock_election *e;
    ck_assert_int_eq(dlock_election_new(c, name, 0, &e), DLOCK_OK);
    return e;
}

/* The frame of a campaign test: client C campaigns asynchronously, and
 * LEADER, on client OTHER, leads election NAME (when LEADS). */
struct contest {
    dlock_client *c, *other;
    dlock_election *leader;
};

static void contest_open(struct contest *x, const char *server, const char *name, bool leads)
{
    ck_assert_int_eq(dlock_open(server, &x->c), DLOCK_OK);
    ck_assert_int_eq(dlock_open(server, &x->other), DLOCK_OK);
    x->leader = election_on(x->other, name);
    if (leads)
        ck_assert_int_eq(dlock_election_campaign(x->leader, "old", DLOCK_TRY, NULL), DLOCK_OK);
}

static void contest_close(struct contest *x)
{
    dlock_election_free(x->leader);
    dlock_client_close(x->c);
    dlock_client_close(x->other);
}

/* Another leads: the asynchronous campaign waits (nothing comes) until
 * the leader resigns, then leads with a newer token, read in its
 * callback, and its value is the leader's; an asynchronous resign lets
 * the other side in again. */
static void campaign_wins_when_the_leader_resigns(const char *server)
{
    struct contest x;
    contest_open(&x, server, "el-win", true);
    uint64_t t1;
    ck_assert_int_eq(dlock_election_token(x.leader, &t1), DLOCK_OK);
    dlock_election *e = election_on(x.c, "el-win");
    struct elect_log d = {0};
    ck_assert_int_eq(dlock_election_campaign_async(e, "new", 30000, NULL, on_elect_done, &d),
                     DLOCK_OK);
    ck_assert_msg(!pump_until(x.c, &d.n, 1, 500), "%d: %s", d.rc[0], d.msg[0]); /* waits */
    ck_assert_int_eq(dlock_election_resign(x.leader), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 1, 20000));
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_ptr_eq(d.e[0], e);
    ck_assert_uint_gt(d.token[0], t1);
    dlock_leader *now;
    ck_assert_int_eq(dlock_election_leader(x.other, "el-win", &now), DLOCK_OK);
    ck_assert_int_eq(dlock_leader_held(now), 1);
    ck_assert_str_eq(dlock_leader_value(now), "new");
    ck_assert_uint_eq(dlock_leader_token(now), d.token[0]);
    dlock_leader_free(now);
    ck_assert_int_eq(dlock_election_campaign(x.leader, "old", DLOCK_TRY, NULL), DLOCK_EBUSY);
    ck_assert_int_eq(dlock_election_resign_async(e, on_elect_done, &d), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 2, 20000));
    ck_assert_msg(d.rc[1] == DLOCK_OK, "%d: %s", d.rc[1], d.msg[1]);
    ck_assert_int_eq(dlock_election_validity_ms(e), 0);
    ck_assert_int_eq(dlock_election_campaign(x.leader, "old", DLOCK_TRY, NULL), DLOCK_OK);
    ck_assert_int_eq(dlock_election_resign_async(e, on_elect_done, &d), DLOCK_ENOTOWNER);
    dlock_election_free(e);
    contest_close(&x);
}

/* The wait's bound: DLOCK_ETIMEDOUT, not before it, in the election's
 * words; E does not lead and left nothing behind (the next campaigner
 * leads at once when the leader resigns). */
static void campaign_wait_bound(const char *server)
{
    struct contest x;
    contest_open(&x, server, "el-bound", true);
    dlock_election *e = election_on(x.c, "el-bound");
    struct elect_log d = {0};
    int64_t t0 = tu_mono_ms();
    ck_assert_int_eq(dlock_election_campaign_async(e, "v", 300, NULL, on_elect_done, &d), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 1, 20000));
    ck_assert_int_ge(tu_mono_ms() - t0, 300);
    ck_assert_msg(d.rc[0] == DLOCK_ETIMEDOUT, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_msg(strstr(d.msg[0], "election 'el-bound'"), "%s", d.msg[0]);
    ck_assert_int_eq(dlock_election_validity_ms(e), 0);
    ck_assert_int_eq(dlock_election_resign(x.leader), DLOCK_OK);
    dlock_election *third = election_on(x.other, "el-bound");
    ck_assert_int_eq(dlock_election_campaign(third, "t", 10000, NULL), DLOCK_OK);
    dlock_election_free(third);
    dlock_election_free(e);
    contest_close(&x);
}

/* Parked campaigns canceled by dlock_election_cancel() and by a cancel
 * object: DLOCK_ECANCELED each, nothing left behind (a try once the
 * leader resigned wins). */
static void campaign_canceled_while_parked(const char *server)
{
    struct contest x;
    contest_open(&x, server, "el-k1", true);
    dlock_election *leader2 = election_on(x.other, "el-k2");
    ck_assert_int_eq(dlock_election_campaign(leader2, "old", DLOCK_TRY, NULL), DLOCK_OK);
    dlock_election *e1 = election_on(x.c, "el-k1"), *e2 = election_on(x.c, "el-k2");
    dlock_cancel *k;
    ck_assert_int_eq(dlock_cancel_new(&k), DLOCK_OK);
    struct elect_log d = {0};
    ck_assert_int_eq(dlock_election_campaign_async(e1, "a", DLOCK_FOREVER, NULL, on_elect_done, &d),
                     DLOCK_OK);
    ck_assert_int_eq(dlock_election_campaign_async(e2, "b", DLOCK_FOREVER, k, on_elect_done, &d),
                     DLOCK_OK);
    ck_assert_msg(!pump_until(x.c, &d.n, 1, 500), "%d: %s", d.rc[0], d.msg[0]); /* parked */
    ck_assert_int_eq(dlock_election_cancel(e1), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 1, 20000));
    ck_assert_ptr_eq(d.e[0], e1);
    ck_assert_msg(d.rc[0] == DLOCK_ECANCELED, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_int_eq(dlock_cancel_fire(k), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 2, 20000));
    ck_assert_ptr_eq(d.e[1], e2);
    ck_assert_msg(d.rc[1] == DLOCK_ECANCELED, "%d: %s", d.rc[1], d.msg[1]);
    ck_assert_int_eq(dlock_election_resign(x.leader), DLOCK_OK);
    ck_assert_int_eq(dlock_election_campaign_async(e1, "a", DLOCK_TRY, NULL, on_elect_done, &d),
                     DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 3, 20000));
    ck_assert_msg(d.rc[2] == DLOCK_OK, "%d: %s", d.rc[2], d.msg[2]);
    ck_assert_int_eq(dlock_election_resign(e1), DLOCK_OK);
    dlock_election_free(e1);
    dlock_election_free(e2);
    dlock_election_free(leader2);
    dlock_cancel_free(k);
    contest_close(&x);
}

#define CAMPAIGNS 8

/* Close with campaigns parked (each on an election led elsewhere): each
 * completes exactly once, during the close, with DLOCK_ECANCELED; the
 * elections are freed after it. */
static void campaign_close_ends_each_once(const char *server)
{
    dlock_client *c, *other;
    ck_assert_int_eq(dlock_open(server, &c), DLOCK_OK);
    ck_assert_int_eq(dlock_open(server, &other), DLOCK_OK);
    dlock_election *leaders[CAMPAIGNS], *es[CAMPAIGNS];
    struct elect_log d = {0};
    for (int i = 0; i < CAMPAIGNS; i++) {
        char name[16];
        snprintf(name, sizeof name, "el-c%d", i);
        leaders[i] = election_on(other, name);
        ck_assert_int_eq(dlock_election_campaign(leaders[i], "l", DLOCK_TRY, NULL), DLOCK_OK);
        es[i] = election_on(c, name);
        ck_assert_int_eq(dlock_election_campaign_async(es[i], "w", DLOCK_FOREVER, NULL,
                                                       on_elect_done, &d),
                         DLOCK_OK);
    }
    ck_assert_msg(!pump_until(c, &d.n, 1, 500), "%d: %s", d.rc[0], d.msg[0]);
    dlock_client_close(c);
    ck_assert_int_eq(d.n, CAMPAIGNS);
    for (int i = 0; i < CAMPAIGNS; i++) {
        ck_assert_msg(d.rc[i] == DLOCK_ECANCELED, "%d: %s", d.rc[i], d.msg[i]);
        for (int j = 0; j < i; j++)
            ck_assert_ptr_ne(d.e[i], d.e[j]);
    }
    for (int i = 0; i < CAMPAIGNS; i++) {
        dlock_election_free(es[i]);
        ck_assert_int_eq(dlock_election_resign(leaders[i]), DLOCK_OK);
        dlock_election_free(leaders[i]);
    }
    ck_assert_int_eq(d.n, CAMPAIGNS);
    dlock_client_close(other);
}

/* Callbacks that go on: each won campaign's callback resigns
 * asynchronously, and each resign's callback starts the next handle's
 * campaign: three rounds, every one won with a newer token. */
struct elect_chain {
    dlock_election *es[3];
    int step, done, bad;
    uint64_t last;
};

static void elect_chain_resigned(dlock_election *e, int rc, void *arg);

static void elect_chain_won(dlock_election *e, int rc, void *arg)
{
    struct elect_chain *ch = arg;
    uint64_t token = 0;
    ch->bad += rc != DLOCK_OK || dlock_election_token(e, &token) != DLOCK_OK || token <= ch->last;
    ch->last = token;
    ch->step++;
    ch->bad += dlock_election_resign_async(e, elect_chain_resigned, ch) != DLOCK_OK;
}

static void elect_chain_resigned(dlock_election *e, int rc, void *arg)
{
    (void)e;
    struct elect_chain *ch = arg;
    ch->bad += rc != DLOCK_OK;
    ch->step++;
    if (++ch->done < 3)
        ch->bad += dlock_election_campaign_async(ch->es[ch->done], "next", 10000, NULL,
                                                 elect_chain_won, ch) != DLOCK_OK;
}

static void campaign_callbacks_start_the_next(const char *server)
{
    dlock_client *c;
    ck_assert_int_eq(dlock_open(server, &c), DLOCK_OK);
    struct elect_chain ch = {0};
    for (int i = 0; i < 3; i++)
        ch.es[i] = election_on(c, "el-chain");
    ck_assert_int_eq(dlock_election_campaign_async(ch.es[0], "first", 10000, NULL, elect_chain_won,
                                                   &ch),
                     DLOCK_OK);
    ck_assert(pump_until(c, &ch.done, 3, 30000));
    ck_assert_int_eq(ch.step, 6);
    ck_assert_int_eq(ch.bad, 0);
    for (int i = 0; i < 3; i++)
        dlock_election_free(ch.es[i]);
    dlock_client_close(c);
}

/* Each of the campaign tests, for ELECTION_TESTS(T) as PARKED_TESTS. */
#define ELECTION_TESTS(T)                    \
    T(campaign_wins_when_the_leader_resigns) \
    T(campaign_wait_bound)                   \
    T(campaign_canceled_while_parked)        \
    T(campaign_close_ends_each_once)         \
    T(campaign_callbacks_start_the_next)

/* ---------------------------------------------- parked waits on file */

#define FILE_PARKED(name)    \
    TU_TEST(file_##name, 60) \
    {                        \
        name(url);           \
    }
PARKED_TESTS(FILE_PARKED)
ELECTION_TESTS(FILE_PARKED)

/* A holder in another process, which says so through MARKER and holds
 * until a byte comes on its pipe (then releases) or it is killed. */
struct other_process {
    pid_t pid;
    int go; /* the pipe's writing end */
};

static struct other_process other_process_holding(const char *server, const char *name,
                                                  const char *marker)
{
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    dlock_lock *l;
    pid_t pid = tu_fork_holding(server, name, DLOCK_EXCLUSIVE, DLOCK_TRY, &l);
    if (pid == 0) {
        close(p[1]);
        close(open(marker, O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
        char byte;
        _exit(read(p[0], &byte, 1) == 1 && dlock_release(l) == DLOCK_OK ? 0 : 11);
    }
    close(p[0]);
    ck_assert_msg(tu_wait_file(marker, 20000), "the other process did not take '%s'", name);
    return (struct other_process){pid, p[1]};
}

/* The other process's clean release; its exit status. */
static int other_process_release(struct other_process *o)
{
    ck_assert_int_eq(write(o->go, "x", 1), 1);
    close(o->go);
    return tu_wait_exit(o->pid);
}

/* A parked acquire waits for a holder in another process and takes the
 * lock when it releases, with a newer token. */
TU_TEST(file_waits_for_another_process, 60)
{
    char *marker = tu_fmt("%s/held", dir);
    struct other_process o = other_process_holding(url, "proc", marker);
    dlock_client *c;
    ck_assert_int_eq(dlock_open(url, &c), DLOCK_OK);
    dlock_info *before;
    ck_assert_int_eq(dlock_inspect(c, "proc", &before), DLOCK_OK);
    ck_assert_int_eq(dlock_info_held(before), 1);
    dlock_lock *l = owned(c, "proc");
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(l, 30000, NULL, on_done, &d), DLOCK_OK);
    ck_assert(!pump_until(c, &d.n, 1, 500)); /* held there: waits */
    ck_assert_int_eq(other_process_release(&o), 0);
    ck_assert(pump_until(c, &d.n, 1, 20000));
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    uint64_t token;
    ck_assert_int_eq(dlock_token(l, &token), DLOCK_OK);
    ck_assert_uint_gt(token, dlock_info_token(before));
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_info_free(before);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(marker);
}

/* A holder killed with SIGKILL: the kernel drops its lock, and the close
 * of its file wakes the parked waiter, which takes it. */
TU_TEST(file_holder_killed_wakes_parked_waiter, 60)
{
    char *marker = tu_fmt("%s/held", dir);
    struct other_process o = other_process_holding(url, "k9", marker);
    dlock_client *c;
    ck_assert_int_eq(dlock_open(url, &c), DLOCK_OK);
    dlock_lock *l = owned(c, "k9");
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(l, DLOCK_FOREVER, NULL, on_done, &d), DLOCK_OK);
    ck_assert(!pump_until(c, &d.n, 1, 300)); /* parked */
    ck_assert_int_eq(kill(o.pid, SIGKILL), 0);
    tu_wait_exit(o.pid);
    close(o.go);
    ck_assert(pump_until(c, &d.n, 1, 20000));
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(marker);
}

/* The release's IN_CLOSE_WRITE, not a retry time, runs the parked
 * attempt: with no lock-delay and inotify at hand the file backend sets
 * no retry time, so only a wake ends the park before its 60 s bound; the
 * acquire comes within 20 s of the release. */
TU_TEST(file_release_wakes_parked_waiter, 60)
{
    struct contended x;
    contended_open(&x, url, "wake", true);
    dlock_lock *l = owned(x.c, "wake");
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(l, 60000, NULL, on_done, &d), DLOCK_OK);
    ck_assert(!pump_until(x.c, &d.n, 1, 500)); /* parked */
    ck_assert_int_eq(dlock_release(x.rival), DLOCK_OK);
    ck_assert_msg(pump_until(x.c, &d.n, 1, 20000), "a release did not wake the parked wait");
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    contended_close(&x);
}

/* A lock-delay is the retry time no event announces: a holder killed
 * with lock_delay=1s keeps the name 1 s after its death, and the parked
 * waiter, woken by the death and then parked until the delay's end, takes
 * it then -- not at its 30 s bound. */
TU_TEST(file_lock_delay_is_the_retry_time, 60)
{
    char *delayed = tu_fmt("%s?lock_delay=1s", url), *marker = tu_fmt("%s/held", dir);
    struct other_process o = other_process_holding(delayed, "ld", marker);
    dlock_client *c;
    ck_assert_int_eq(dlock_open(delayed, &c), DLOCK_OK);
    dlock_lock *l = owned(c, "ld");
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(l, 30000, NULL, on_done, &d), DLOCK_OK);
    ck_assert(!pump_until(c, &d.n, 1, 300)); /* parked */
    int64_t killed = tu_mono_ms();
    ck_assert_int_eq(kill(o.pid, SIGKILL), 0);
    tu_wait_exit(o.pid);
    close(o.go);
    ck_assert(pump_until(c, &d.n, 1, 20000));
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_int_ge(tu_mono_ms() - killed, 1000);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(delayed);
    free(marker);
}

/* ------------------------------------------------------------- on Redis */

#ifdef DLOCK_HAVE_REDIS
static struct fx_redis srv;

static void redis_setup(void)
{
    ck_assert_msg(fx_redis_start(&srv, NULL), "redis-server could not be started");
}

static void redis_teardown(void)
{
    fx_redis_stop(&srv);
}

TU_CASE(redis, redis_setup, redis_teardown, TU_AROUND_EACH)

#define REDIS_PARKED(name)      \
    TU_TEST_IN(redis, name, 60) \
    {                           \
        name(srv.url);          \
    }
PARKED_TESTS(REDIS_PARKED)
ELECTION_TESTS(REDIS_PARKED)

/* Wait until the server has a subscriber on some channel (a parked
 * waiter's), then pump C a little more: its confirmation read. */
static void redis_subscribed(dlock_client *c, const int *count)
{
    for (int i = 0; i < 400; i++) {
        redisReply *r = fx_redis_raw_at(srv.port, NULL, "PUBSUB CHANNELS");
        bool some = r && r->type == REDIS_REPLY_ARRAY && r->elements > 0;
        if (r)
            freeReplyObject(r);
        if (some)
            break;
        tu_sleep_ms(25);
    }
    ck_assert(!pump_until(c, count, *count + 1, 200));
}

static void contended_told(dlock_lock *l, const char *who, void *arg)
{
    (void)l;
    (void)who;
    atomic_fetch_add((atomic_int *)arg, 1);
}

/* Wait up to 30 s until *N is 1 or more. */
static bool told_within(atomic_int *n)
{
    for (int i = 0; i < 3000 && !atomic_load(n); i++)
        tu_sleep_ms(10);
    return atomic_load(n) > 0;
}

/* dlock_lock_on_contended() with the asynchronous calls: a parked
 * asynchronous waiter announces itself, so the blocking holder is told;
 * a hold taken asynchronously is watched, so it is told of a blocking
 * waiter. Before: a parked wait announced nothing, an asynchronous hold
 * was never watched. */
TU_TEST_IN(redis, contended_both_ways, 60)
{
    struct contended x;
    contended_open(&x, srv.url, "cw", false);
    atomic_int rival_told = 0, async_told = 0;
    dlock_lock *l = owned(x.c, "cw");
    ck_assert_int_eq(dlock_lock_on_contended(x.rival, contended_told, &rival_told), DLOCK_OK);
    ck_assert_int_eq(dlock_lock_on_contended(l, contended_told, &async_told), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(x.rival, DLOCK_TRY), DLOCK_OK);
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(l, 30000, NULL, on_done, &d), DLOCK_OK);
    ck_assert_msg(told_within(&rival_told), "the holder was not told of a parked waiter");
    ck_assert_int_eq(dlock_release(x.rival), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 1, 20000));
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    struct tu_waiter w;
    tu_waiter_start(&w, x.rival, DLOCK_FOREVER);
    ck_assert_msg(told_within(&async_told), "a hold taken asynchronously was not told");
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    ck_assert_int_eq(tu_waiter_join(&w), DLOCK_OK);
    ck_assert_int_eq(atomic_load(&rival_told), 1);
    dlock_lock_free(l);
    contended_close(&x);
}

/* a wait's bound holds while the pool's two threads are stuck in
 * other acquires' requests (a stalled server): a 300 ms acquire must end
 * near 300 ms, as the blocking acquire does, not once a pool thread's
 * request times out (timeout=10s here). */
TU_TEST_IN(redis, short_wait_not_held_up_by_stalled_attempts, 60)
{
    char *u = tu_fmt("%s?timeout=10s", srv.url);
    dlock_client *c;
    ck_assert_int_eq(dlock_open(u, &c), DLOCK_OK);
    dlock_lock *a = owned(c, "stall-a"), *b = owned(c, "stall-b"), *s = owned(c, "stall-c");
    struct done_log dab = {0}, ds = {0};
    ck_assert_int_ge(dlock_client_fd(c), 0);
    ck_assert_int_eq(kill(srv.pid, SIGSTOP), 0);
    ck_assert_int_eq(dlock_acquire_async(a, DLOCK_FOREVER, NULL, on_done, &dab), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire_async(b, DLOCK_FOREVER, NULL, on_done, &dab), DLOCK_OK);
    usleep(300 * 1000); /* both pool threads are in a request now */
    int64_t t0 = tu_mono_ms();
    ck_assert_int_eq(dlock_acquire_async(s, 300, NULL, on_done, &ds), DLOCK_OK);
    bool ended = pump_until(c, &ds.n, 1, 30000);
    int64_t took = tu_mono_ms() - t0;
    ck_assert_int_eq(kill(srv.pid, SIGCONT), 0);
    ck_assert(ended);
    /* Well before the 10 s a pool thread's stalled request takes. */
    ck_assert_msg(took < 6000 && ds.rc[0] == DLOCK_ETIMEDOUT,
                  "a 300 ms wait ended after %lld ms (rc %d: %s)", (long long)took, ds.rc[0],
                  ds.msg[0]);
    /* The server never answered: the outcome does not say it was held. */
    ck_assert_msg(!strstr(ds.msg[0], "held by another owner"), "%s", ds.msg[0]);
    dlock_lock_free(s);
    dlock_lock_free(a);
    dlock_lock_free(b);
    dlock_client_close(c);
    free(u);
}

/* An outage while a parked wait waits is ridden out until the wait's
 * end: the server killed under a parked waiter and brought back (empty:
 * the rival's hold went with it), the waiter takes the lock. */
TU_TEST_IN(redis, parked_wait_rides_out_a_restart, 60)
{
    struct contended x;
    contended_open(&x, srv.url, "r", true);
    dlock_lock *l = owned(x.c, "r");
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(l, 30000, NULL, on_done, &d), DLOCK_OK);
    redis_subscribed(x.c, &d.n); /* held elsewhere: parked, listening */
    fx_redis_kill(&srv);
    bool ended = pump_until(x.c, &d.n, 1, 1500);
    ck_assert(fx_redis_restart(&srv));
    ck_assert_msg(!ended, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert(pump_until(x.c, &d.n, 1, 20000));
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    contended_close(&x);
}

/* A parked wait whose server is down when its bound comes ends with
 * DLOCK_ETIMEDOUT naming the outage, not "held by another owner". */
TU_TEST_IN(redis, parked_wait_ending_in_an_outage_names_it, 60)
{
    struct contended x;
    contended_open(&x, srv.url, "r", true);
    dlock_lock *l = owned(x.c, "r");
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(l, 4000, NULL, on_done, &d), DLOCK_OK);
    redis_subscribed(x.c, &d.n); /* held elsewhere: parked, listening */
    fx_redis_kill(&srv);
    ck_assert(pump_until(x.c, &d.n, 1, 20000));
    ck_assert(fx_redis_restart(&srv));
    ck_assert_msg(d.rc[0] == DLOCK_ETIMEDOUT, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_msg(strstr(d.msg[0], "still failing") && strstr(d.msg[0], "127.0.0.1"), "%s",
                  d.msg[0]);
    dlock_lock_free(l);
    contended_close(&x);
}

/* Callbacks that go on: a taken lock is released from its callback,
 * whose callback frees the handle and starts the next handle's acquire. */
struct chain {
    dlock_client *c;
    dlock_lock *ls[3];
    int step, done;
    int rcs[8];
};

static void chain_released(dlock_lock *l, int rc, void *arg);

static void chain_acquired(dlock_lock *l, int rc, void *arg)
{
    struct chain *ch = arg;
    ch->rcs[ch->step++] = rc;
    ck_assert_int_eq(dlock_release_async(l, chain_released, ch), DLOCK_OK);
}

static void chain_released(dlock_lock *l, int rc, void *arg)
{
    struct chain *ch = arg;
    ch->rcs[ch->step++] = rc;
    dlock_lock_free(l);
    if (++ch->done < 3)
        ck_assert_int_eq(dlock_acquire_async(ch->ls[ch->done], 10000, NULL, chain_acquired, ch),
                         DLOCK_OK);
}

TU_TEST_IN(redis, callbacks_release_free_and_start, 60)
{
    struct chain ch = {0};
    ck_assert_int_eq(dlock_open(srv.url, &ch.c), DLOCK_OK);
    for (int i = 0; i < 3; i++)
        ch.ls[i] = owned(ch.c, "chain");
    ck_assert_int_eq(dlock_acquire_async(ch.ls[0], 10000, NULL, chain_acquired, &ch), DLOCK_OK);
    ck_assert(pump_until(ch.c, &ch.done, 3, 20000));
    ck_assert_int_eq(ch.step, 6);
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(ch.rcs[i], DLOCK_OK);
    dlock_client_close(ch.c);
}

/* A rival on another client holds NAME for HOLD_MS, then releases. */
struct rival {
    const char *url, *name;
    int hold_ms;
    pthread_t th;
    dlock_client *c;
    dlock_lock *l;
};

static void *rival_main(void *arg)
{
    struct rival *r = arg;
    usleep((useconds_t)r->hold_ms * 1000);
    ck_assert_int_eq(dlock_release(r->l), DLOCK_OK);
    return NULL;
}

static void rival_start(struct rival *r)
{
    ck_assert_int_eq(dlock_open(r->url, &r->c), DLOCK_OK);
    ck_assert_int_eq(dlock_lock_new(r->c, r->name, DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED, &r->l),
                     DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(r->l, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(pthread_create(&r->th, NULL, rival_main, r), 0);
}

static void rival_end(struct rival *r)
{
    pthread_join(r->th, NULL);
    dlock_lock_free(r->l);
    dlock_client_close(r->c);
}

/* What a loop test saw: the timer's ticks when the acquire came. */
struct loop_seen {
    int ticks, ticks_at_acquire, rc, done;
};

#define LOOP_TICK_MS 50
#define LOOP_HOLD_MS 1000
/* The rival holds ~20 ticks; at least a quarter of them must fire while
 * the acquire waits (a loop a waiting acquire blocked would see none). */
#define LOOP_MIN_TICKS (LOOP_HOLD_MS / LOOP_TICK_MS / 4)

static void loop_acquired(dlock_lock *l, int rc, void *arg)
{
    struct loop_seen *s = arg;
    s->rc = rc;
    s->ticks_at_acquire = s->ticks;
    if (!rc)
        ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    s->done = 1;
}
#endif

/* -------------------------------------------------------------- on etcd */

#ifdef DLOCK_HAVE_ETCD
/* One member for the case's tests, each on names of its own. A client
 * queues its own handles on one name itself (one key per client and
 * name), so the waiters that park side by side are on other clients or
 * other names. */
static struct etcdf ef;
static bool ef_ok;

static void etcd_setup(void)
{
    if (!(ef_ok = etcdf_start(&ef, 1)))
        fprintf(stderr, "fixture: %s\n", ef.error);
}

static void etcd_teardown(void)
{
    etcdf_stop(&ef);
}

TU_CASE(etcd, etcd_setup, etcd_teardown, TU_AROUND_CASE)

/* The case's URL (caller frees), with QUERY (NULL: none). */
static char *etcd_url(const char *query)
{
    ck_assert_msg(ef_ok, "etcd: %s", ef.error);
    return etcdf_url(&ef, NULL, query);
}

/* contended_open() on the case's member, the URL with QUERY (NULL: none),
 * NAME held by the rival. */
static void etcd_contended(struct contended *x, const char *query, const char *name)
{
    char *u = etcd_url(query);
    contended_open(x, u, name, true);
    x->url = u;
}

#define ETCD_ELECTION(name)           \
    TU_TEST_IN(etcd, etcd_##name, 60) \
    {                                 \
        char *u = etcd_url(NULL);     \
        name(u);                      \
        free(u);                      \
    }
ELECTION_TESTS(ETCD_ELECTION)

/* How many keys etcd holds under PREFIX. */
static int etcd_keys(const char *prefix)
{
    char *out = NULL;
    ck_assert_int_eq(etcdf_ctl(&ef, &out, NULL, "get", "--prefix", "--keys-only", prefix, NULL), 0);
    int n = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"))
        n += line[0] != 0;
    free(out);
    return n;
}

/* Wait up to 20 s until N keys are under PREFIX: the contenders queued. */
static bool etcd_keys_become(const char *prefix, int n)
{
    for (int i = 0; i < 800 && etcd_keys(prefix) != n; i++)
        tu_sleep_ms(25);
    return etcd_keys(prefix) == n;
}

/* A holder on another client: the asynchronous acquire waits until the
 * release, then holds with a greater token; the blocking side is kept
 * out until the asynchronous release. Before: DLOCK_ENOTSUP. */
TU_TEST_IN(etcd, etcd_waits_for_a_blocking_holder, 60)
{
    struct contended x;
    etcd_contended(&x, NULL, "w");
    dlock_lock *rival = x.rival, *l = owned(x.c, "w");
    uint64_t t1, t2;
    ck_assert_int_eq(dlock_token(rival, &t1), DLOCK_OK);
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(l, 30000, NULL, on_done, &d), DLOCK_OK);
    ck_assert_msg(etcd_keys_become("w/", 2), "the waiter's key was never queued");
    ck_assert(!pump_until(x.c, &d.n, 1, 300)); /* held elsewhere: waits */
    ck_assert_int_eq(dlock_release(rival), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 1, 20000));
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_int_eq(dlock_token(l, &t2), DLOCK_OK);
    ck_assert_uint_gt(t2, t1);
    ck_assert_int_eq(dlock_acquire(rival, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_int_eq(dlock_release_async(l, on_done, &d), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 2, 20000));
    ck_assert_int_eq(d.rc[1], DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(rival, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_release(rival), DLOCK_OK);
    dlock_lock_free(l);
    contended_close(&x);
}

/* An asynchronous waiter and a blocking one on "x", taking turns: never
 * two holders at once, each served every turn. */
TU_TEST_IN(etcd, etcd_exclusion_async_and_blocking, 90)
{
    char *u = etcd_url(NULL);
    dlock_client *c;
    ck_assert_int_eq(dlock_open(u, &c), DLOCK_OK);
    struct blocking_turns b = {u, 15, 0, 0};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, blocking_main, &b), 0);
    int done = 0;
    struct async_turns t = {.l = owned(c, "x"), .left = 15};
    ck_assert_int_eq(dlock_acquire_async(t.l, 20000, NULL, turn_acquired, &t), DLOCK_OK);
    int64_t end = tu_mono_ms() + 80000;
    while (!t.done && tu_mono_ms() < end)
        pump_until(c, &done, 1, 100);
    pthread_join(th, NULL);
    ck_assert_msg(b.rc == DLOCK_OK, "%d: %s", b.rc, dlock_strerror(b.rc));
    ck_assert_int_eq(b.bad, 0);
    ck_assert(t.done);
    ck_assert_int_eq(t.bad, 0);
    dlock_lock_free(t.l);
    dlock_client_close(c);
    free(u);
}

/* The wait's bound: DLOCK_ETIMEDOUT, not before it, naming the lock;
 * the waiter's key leaves the queue (the holder's successor is not
 * kept behind it). */
TU_TEST_IN(etcd, etcd_wait_bound, 60)
{
    struct contended x;
    etcd_contended(&x, NULL, "b");
    dlock_lock *l = owned(x.c, "b");
    struct done_log d = {0};
    int64_t t0 = tu_mono_ms();
    ck_assert_int_eq(dlock_acquire_async(l, 700, NULL, on_done, &d), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 1, 20000));
    ck_assert_int_ge(tu_mono_ms() - t0, 700);
    ck_assert_msg(d.rc[0] == DLOCK_ETIMEDOUT, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_ptr_nonnull(strstr(d.msg[0], "'b'"));
    ck_assert_uint_eq(dlock_hold_count(l), 0);
    ck_assert_msg(etcd_keys_become("b/", 1), "the timed-out waiter's key stayed queued");
    dlock_lock_free(l);
    contended_close(&x);
}

/* An outage before the waiter's key is queued (the member down when
 * the acquire starts), on a member of the test's own (the case's stays
 * up for the others): a wait that ends during it is DLOCK_ETIMEDOUT
 * naming it; one that outlasts it is ridden out and holds once the
 * member is back. */
TU_TEST_IN(etcd, etcd_outage_before_queueing_ridden_out, 120)
{
    struct etcdf own;
    ck_assert_msg(etcdf_start(&own, 1), "etcd: %s", own.error);
    char *u = etcdf_url(&own, NULL, NULL);
    dlock_client *c;
    ck_assert_int_eq(dlock_open(u, &c), DLOCK_OK);
    dlock_lock *l = owned(c, "o");
    struct done_log d = {0};
    etcdf_member_stop(&own, 0, SIGKILL);
    ck_assert_int_eq(dlock_acquire_async(l, 1500, NULL, on_done, &d), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 1, 20000));
    ck_assert_msg(d.rc[0] == DLOCK_ETIMEDOUT, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_msg(strstr(d.msg[0], "still failing") && strstr(d.msg[0], "127.0.0.1"), "%s",
                  d.msg[0]);
    ck_assert_int_eq(dlock_acquire_async(l, 60000, NULL, on_done, &d), DLOCK_OK);
    bool ended = pump_until(c, &d.n, 2, 1500);
    ck_assert(etcdf_member_start(&own, 0, 30000));
    ck_assert_msg(!ended, "%d: %s", d.rc[1], d.msg[1]);
    ck_assert(pump_until(c, &d.n, 2, 40000));
    ck_assert_msg(d.rc[1] == DLOCK_OK, "%d: %s", d.rc[1], d.msg[1]);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(u);
    etcdf_stop(&own);
}

/* A parked wait canceled by dlock_lock_cancel() and by a cancel object:
 * DLOCK_ECANCELED, and the keys leave the queue. */
TU_TEST_IN(etcd, etcd_cancel_while_parked, 60)
{
    struct contended x;
    etcd_contended(&x, NULL, "k1");
    dlock_lock *rival2;
    ck_assert_int_eq(dlock_lock_new(x.other, "k2", DLOCK_EXCLUSIVE, 0, &rival2), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(rival2, DLOCK_TRY), DLOCK_OK);
    dlock_lock *l1 = owned(x.c, "k1"), *l2 = owned(x.c, "k2");
    dlock_cancel *k;
    ck_assert_int_eq(dlock_cancel_new(&k), DLOCK_OK);
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(l1, DLOCK_FOREVER, NULL, on_done, &d), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire_async(l2, DLOCK_FOREVER, k, on_done, &d), DLOCK_OK);
    ck_assert(etcd_keys_become("k1/", 2) && etcd_keys_become("k2/", 2));
    ck_assert_msg(!pump_until(x.c, &d.n, 1, 300), "%d: %s", d.rc[0], d.msg[0]); /* parked */
    ck_assert_int_eq(dlock_lock_cancel(l1), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 1, 20000));
    ck_assert_ptr_eq(d.l[0], l1);
    ck_assert_int_eq(d.rc[0], DLOCK_ECANCELED);
    ck_assert_int_eq(dlock_cancel_fire(k), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 2, 20000));
    ck_assert_ptr_eq(d.l[1], l2);
    ck_assert_int_eq(d.rc[1], DLOCK_ECANCELED);
    ck_assert_msg(etcd_keys_become("k1/", 1) && etcd_keys_become("k2/", 1),
                  "a canceled waiter's key stayed queued");
    ck_assert_int_eq(dlock_release(x.rival), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire_async(l1, DLOCK_TRY, NULL, on_done, &d), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 3, 20000));
    ck_assert_int_eq(d.rc[2], DLOCK_OK);
    dlock_lock_free(rival2);
    dlock_lock_free(l1);
    dlock_lock_free(l2);
    dlock_cancel_free(k);
    contended_close(&x);
}

/* Close with acquires parked (each on a name held elsewhere): each
 * completes exactly once, during the close, with DLOCK_ECANCELED, and
 * the waiters held no thread of their own meanwhile. */
TU_TEST_IN(etcd, etcd_close_ends_each_once_and_waiters_hold_no_thread, 90)
{
    char *u = etcd_url(NULL);
    dlock_client *c, *other;
    ck_assert_int_eq(dlock_open(u, &c), DLOCK_OK);
    ck_assert_int_eq(dlock_open(u, &other), DLOCK_OK);
    dlock_lock *rivals[PARKED], *ls[PARKED];
    for (int i = 0; i < PARKED; i++) {
        char name[16];
        snprintf(name, sizeof name, "c%d", i);
        ck_assert_int_eq(dlock_lock_new(other, name, DLOCK_EXCLUSIVE, 0, &rivals[i]), DLOCK_OK);
        ck_assert_int_eq(dlock_acquire(rivals[i], DLOCK_TRY), DLOCK_OK);
        ls[i] = owned(c, name);
    }
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(ls[0], DLOCK_FOREVER, NULL, on_done, &d), DLOCK_OK);
    ck_assert(etcd_keys_become("c0/", 2)); /* the pool and the watch thread run now */
    int before = threads_now();
    for (int i = 1; i < PARKED; i++)
        ck_assert_int_eq(dlock_acquire_async(ls[i], DLOCK_FOREVER, NULL, on_done, &d), DLOCK_OK);
    char last[16];
    snprintf(last, sizeof last, "c%d/", PARKED - 1);
    ck_assert(etcd_keys_become(last, 2));
    ck_assert(!pump_until(c, &d.n, 1, 300));
    /* the pool may grow on a slow server, up to its bound: never a
     * thread per waiter */
    close_with_parked(c, &d, before, 14);
    for (int i = 0; i < PARKED; i++) {
        dlock_lock_free(ls[i]);
        ck_assert_int_eq(dlock_release(rivals[i]), DLOCK_OK);
        dlock_lock_free(rivals[i]);
    }
    ck_assert_int_eq(d.n, PARKED);
    dlock_client_close(other);
    free(u);
}

/* Shared holds: a reader elsewhere lets an asynchronous reader in at
 * once and keeps an asynchronous writer (a third client) parked until
 * both readers are gone. */
TU_TEST_IN(etcd, etcd_shared_readers_and_a_parked_writer, 60)
{
    char *u = etcd_url(NULL);
    struct contended x = {0};
    ck_assert_int_eq(dlock_open(u, &x.c), DLOCK_OK);
    ck_assert_int_eq(dlock_open(u, &x.other), DLOCK_OK);
    ck_assert_int_eq(dlock_lock_new(x.other, "rw", DLOCK_SHARED, 0, &x.rival), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(x.rival, DLOCK_TRY), DLOCK_OK);
    dlock_client *wc;
    ck_assert_int_eq(dlock_open(u, &wc), DLOCK_OK);
    dlock_lock *reader, *writer = owned(wc, "rw");
    ck_assert_int_eq(dlock_lock_new(x.c, "rw", DLOCK_SHARED, DLOCK_LOCK_HANDLE_OWNED, &reader),
                     DLOCK_OK);
    struct done_log d = {0}, dw = {0};
    ck_assert_int_eq(dlock_acquire_async(reader, 20000, NULL, on_done, &d), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 1, 20000));
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_int_eq(dlock_acquire_async(writer, 30000, NULL, on_done, &dw), DLOCK_OK);
    ck_assert(etcd_keys_become("rw/", 3));
    ck_assert(!pump_until(wc, &dw.n, 1, 300)); /* two readers hold */
    ck_assert_int_eq(dlock_release(x.rival), DLOCK_OK);
    ck_assert(!pump_until(wc, &dw.n, 1, 300)); /* one reader still holds */
    ck_assert_int_eq(dlock_release(reader), DLOCK_OK);
    ck_assert(pump_until(wc, &dw.n, 1, 20000));
    ck_assert_msg(dw.rc[0] == DLOCK_OK, "%d: %s", dw.rc[0], dw.msg[0]);
    ck_assert_int_eq(dlock_acquire(x.rival, DLOCK_TRY), DLOCK_EBUSY);
    dlock_lock_free(writer);
    dlock_lock_free(reader);
    dlock_client_close(wc);
    contended_close(&x);
    free(u);
}

/* Two parked waiters on two clients keep their order in the queue: the
 * first to park is handed the lock first, the second after it. */
TU_TEST_IN(etcd, etcd_parked_waiters_keep_their_order, 60)
{
    struct contended x;
    etcd_contended(&x, NULL, "fifo");
    dlock_client *c2;
    ck_assert_int_eq(dlock_open(x.url, &c2), DLOCK_OK);
    dlock_lock *first = owned(x.c, "fifo"), *second = owned(c2, "fifo");
    struct done_log d1 = {0}, d2 = {0};
    ck_assert_int_eq(dlock_acquire_async(first, 30000, NULL, on_done, &d1), DLOCK_OK);
    ck_assert(etcd_keys_become("fifo/", 2));
    ck_assert_int_eq(dlock_acquire_async(second, 30000, NULL, on_done, &d2), DLOCK_OK);
    ck_assert(etcd_keys_become("fifo/", 3));
    ck_assert_int_eq(dlock_release(x.rival), DLOCK_OK);
    ck_assert(pump_until(x.c, &d1.n, 1, 20000));
    ck_assert_msg(d1.rc[0] == DLOCK_OK, "%d: %s", d1.rc[0], d1.msg[0]);
    ck_assert(!pump_until(c2, &d2.n, 1, 300)); /* still behind the first */
    ck_assert_int_eq(dlock_release(first), DLOCK_OK);
    ck_assert(pump_until(c2, &d2.n, 1, 20000));
    ck_assert_msg(d2.rc[0] == DLOCK_OK, "%d: %s", d2.rc[0], d2.msg[0]);
    ck_assert_int_eq(dlock_release(second), DLOCK_OK);
    dlock_lock_free(first);
    dlock_lock_free(second);
    dlock_client_close(c2);
    contended_close(&x);
}

/* Names STEM0..STEM(N-1) held by X's other client -- RIVALS[0] is X's
 * rival (on STEM0, held already) -- and LS[i], a handle of C on each. */
static void etcd_rivals_hold(struct contended *x, dlock_client *c, const char *stem, int n,
                             dlock_lock **rivals, dlock_lock **ls)
{
    for (int i = 0; i < n; i++) {
        char name[16];
        snprintf(name, sizeof name, "%s%d", stem, i);
        rivals[i] = x->rival;
        if (i) {
            ck_assert_int_eq(dlock_lock_new(x->other, name, DLOCK_EXCLUSIVE, 0, &rivals[i]),
                             DLOCK_OK);
            ck_assert_int_eq(dlock_acquire(rivals[i], DLOCK_TRY), DLOCK_OK);
        }
        ls[i] = owned(c, name);
    }
}

/* Parked waiters of one client share its leases' keepalives: 10 of them
 * (on 10 names) send about what one does -- a keepalive of the waiters'
 * lease per third of its 2 s -- not one each. Before: ~50 in 3 s. */
TU_TEST_IN(etcd, etcd_parked_waiters_share_their_keepalives, 60)
{
    struct contended x;
    etcd_contended(&x, "lease=30s", "ka0");
    dlock_lock *rivals[10], *ls[10];
    struct done_log d = {0};
    etcd_rivals_hold(&x, x.c, "ka", 10, rivals, ls);
    for (int i = 0; i < 10; i++)
        ck_assert_int_eq(dlock_acquire_async(ls[i], 60000, NULL, on_done, &d), DLOCK_OK);
    ck_assert(etcd_keys_become("ka9/", 2));
    ck_assert(!pump_until(x.c, &d.n, 1, 500));
    int port = ef.m[0].client_port;
    long long k0 = etcdf_handled(port, "LeaseKeepAlive");
    ck_assert(!pump_until(x.c, &d.n, 1, 3000));
    long long k1 = etcdf_handled(port, "LeaseKeepAlive");
    ck_assert_int_ge(k0, 0);
    ck_assert_msg(k1 - k0 <= 15, "%lld keepalives in 3 s for 10 parked waiters", k1 - k0);
    for (int i = 0; i < 10; i++)
        dlock_lock_free(ls[i]);
    for (int i = 1; i < 10; i++)
        dlock_lock_free(rivals[i]);
    contended_close(&x);
}

/* A parked waiter is handed the lock by the watch on the key before its
 * own, not by looking again at each keepalive: while it is parked the
 * member answers no transaction (a look is one), though its leases'
 * keepalives come every ~0.7 s (a third of the waiters' 2 s lease) and
 * the holder's lease (30 s) is far from over; the release then hands it
 * the lock. Before: a look at every keepalive, ~4 in the 3 s. */
TU_TEST_IN(etcd, etcd_parked_waiter_woken_by_the_watch_not_by_looks, 60)
{
    struct contended x;
    etcd_contended(&x, "lease=30s", "h");
    dlock_lock *l = owned(x.c, "h");
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(l, 60000, NULL, on_done, &d), DLOCK_OK);
    ck_assert(etcd_keys_become("h/", 2));
    ck_assert(!pump_until(x.c, &d.n, 1, 500)); /* its watch confirmed, the look after it made */
    int port = ef.m[0].client_port;
    long long txn0 = etcdf_handled(port, "Txn");
    ck_assert(!pump_until(x.c, &d.n, 1, 3000));
    long long txn1 = etcdf_handled(port, "Txn");
    ck_assert_int_ge(txn0, 0);
    ck_assert_msg(txn1 == txn0, "%lld transactions while one waiter was parked", txn1 - txn0);
    ck_assert_int_eq(dlock_release(x.rival), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 1, 20000));
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    contended_close(&x);
}

/* The member's count of the watch streams and watchers now open. */
static void etcd_watches_now(long long *streams, long long *watchers)
{
    int port = ef.m[0].client_port;
    *streams = etcdf_metric(port, "etcd_debugging_mvcc_watch_stream_total");
    *watchers = etcdf_metric(port, "etcd_debugging_mvcc_watcher_total");
    ck_assert(*streams >= 0 && *watchers >= 0);
}

#define ONE_STREAM_N 8 /* parked waiters, on names of their own */

/* Parked waiters of one client, each on a name of its own, share one
 * watch stream to etcd -- a registration each on the client's stream of
 * deletions -- not a stream (a connection, a curl handle) each: the
 * member counts the streams and watchers it serves. Each is still
 * handed its lock by its rival's release. Before: 8 streams, 8
 * watchers. */
TU_TEST_IN(etcd, etcd_parked_waiters_share_one_watch_stream, 60)
{
    struct contended x;
    etcd_contended(&x, NULL, "one0");
    dlock_lock *rivals[ONE_STREAM_N], *ls[ONE_STREAM_N];
    etcd_rivals_hold(&x, x.c, "one", ONE_STREAM_N, rivals, ls);
    long long s0, w0, s1, w1;
    etcd_watches_now(&s0, &w0);
    struct done_log d = {0};
    for (int i = 0; i < ONE_STREAM_N; i++)
        ck_assert_int_eq(dlock_acquire_async(ls[i], 60000, NULL, on_done, &d), DLOCK_OK);
    char last[16];
    snprintf(last, sizeof last, "one%d/", ONE_STREAM_N - 1);
    ck_assert(etcd_keys_become(last, 2));
    etcd_watches_now(&s1, &w1);
    for (int i = 0; i < 200 && w1 == w0; i++) { /* the stream is opened after the look */
        pump_until(x.c, &d.n, 1, 100);
        etcd_watches_now(&s1, &w1);
    }
    ck_assert(!pump_until(x.c, &d.n, 1, 500)); /* all parked, their watches made */
    etcd_watches_now(&s1, &w1);
    ck_assert_msg(s1 - s0 == 1 && w1 - w0 == 1,
                  "%lld watch streams and %lld watchers for %d parked waiters of one client",
                  s1 - s0, w1 - w0, ONE_STREAM_N);
    for (int i = 0; i < ONE_STREAM_N; i++) {
        ck_assert_int_eq(dlock_release(rivals[i]), DLOCK_OK);
        ck_assert(pump_until(x.c, &d.n, i + 1, 20000));
        ck_assert_msg(d.rc[i] == DLOCK_OK && d.l[i] == ls[i], "%d: %s", d.rc[i], d.msg[i]);
    }
    for (int i = 0; i < ONE_STREAM_N; i++) {
        ck_assert_int_eq(dlock_release(ls[i]), DLOCK_OK);
        dlock_lock_free(ls[i]);
    }
    for (int i = 1; i < ONE_STREAM_N; i++)
        dlock_lock_free(rivals[i]);
    contended_close(&x);
}

/* The relay's callback: armed, it marks the connection of the first look
 * of the waiter on "late" (a txn comparing the queue's create revisions,
 * GREATER, under "late/": "bGF0ZS8=" in base64) and freezes it, so that
 * look's answer waits on the way while the release it predates happens. */
static atomic_int freeze_late_look;

static enum tu_relay_action freeze_the_look(struct tu_relay *r, struct tu_relay_conn *c,
                                            const char *req, size_t len)
{
    if (atomic_load(&freeze_late_look) && memmem(req, len, "GREATER", 7) &&
        memmem(req, len, "bGF0ZS8=", 8)) {
        atomic_store(&freeze_late_look, 0);
        c->marked = true;
        atomic_store(&r->mode, TU_RELAY_FREEZE); /* (the relay's own thread: no wait) */
    }
    return TU_RELAY_FORWARD;
}

/* A waiter whose look the client's watch stream has already passed when
 * it registers -- the key it found before its own was deleted, and the
 * stream told so, while the look's answer was on the way -- looks again
 * at once and is handed the lock: a missed delete would leave it parked
 * until its safety look (10 s), past its 8 s bound. Another waiter of
 * the client ("early") keeps the stream open meanwhile. */
TU_TEST_IN(etcd, etcd_waiter_registered_after_the_stream_passed_it, 60)
{
    ck_assert_msg(ef_ok, "etcd: %s", ef.error);
    struct tu_relay rl;
    tu_relay_start_with(&rl, &(struct tu_relay_config){.target = ef.m[0].client_port,
                                                       .freeze_marked = true,
                                                       .on_request = freeze_the_look});
    char *via = tu_fmt("etcd://127.0.0.1:%d", rl.port);
    struct contended x;
    etcd_contended(&x, NULL, "early");
    dlock_client *c;
    ck_assert_int_eq(dlock_open(via, &c), DLOCK_OK);
    dlock_lock *late_rival, *early = owned(c, "early"), *late = owned(c, "late");
    ck_assert_int_eq(dlock_lock_new(x.other, "late", DLOCK_EXCLUSIVE, 0, &late_rival), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(late_rival, DLOCK_TRY), DLOCK_OK);
    struct done_log de = {0}, dl = {0};
    ck_assert_int_eq(dlock_acquire_async(early, 60000, NULL, on_done, &de), DLOCK_OK);
    ck_assert(etcd_keys_become("early/", 2));
    ck_assert(!pump_until(c, &de.n, 1, 500)); /* parked, the stream open */
    atomic_store(&freeze_late_look, 1);
    ck_assert_int_eq(dlock_acquire_async(late, 8000, NULL, on_done, &dl), DLOCK_OK);
    for (int i = 0; i < 2000 && atomic_load(&rl.frozen) < 1; i++)
        tu_sleep_ms(10);
    ck_assert_msg(atomic_load(&rl.frozen) >= 1, "the waiter's look never came");
    ck_assert_int_eq(dlock_release(late_rival), DLOCK_OK);
    ck_assert(!pump_until(c, &dl.n, 1, 1000)); /* the stream carries the delete meanwhile */
    tu_relay_set(&rl, TU_RELAY_PASS);
    ck_assert(pump_until(c, &dl.n, 1, 20000));
    ck_assert_msg(dl.rc[0] == DLOCK_OK, "%d: %s", dl.rc[0], dl.msg[0]);
    ck_assert_int_eq(dlock_release(late), DLOCK_OK);
    ck_assert_int_eq(dlock_release(x.rival), DLOCK_OK);
    ck_assert(pump_until(c, &de.n, 1, 20000));
    ck_assert_msg(de.rc[0] == DLOCK_OK, "%d: %s", de.rc[0], de.msg[0]);
    ck_assert_int_eq(dlock_release(early), DLOCK_OK);
    TU_FREE_LOCKS(early, late, late_rival);
    dlock_client_close(c);
    contended_close(&x);
    tu_relay_stop(&rl);
    free(via);
}

#define OUTAGE_N 3 /* parked waiters through an outage */

/* The client's watch stream cut (the member gone: the relay refuses and
 * cuts every connection) while waiters are parked on three names, their
 * rivals releasing meanwhile: once the member is back, each waiter looks
 * again and is handed its lock. */
TU_TEST_IN(etcd, etcd_parked_waiters_ride_out_a_cut_stream, 90)
{
    ck_assert_msg(ef_ok, "etcd: %s", ef.error);
    struct tu_relay rl;
    tu_relay_start(&rl, ef.m[0].client_port, TU_RELAY_PASS);
    char *via = tu_fmt("etcd://127.0.0.1:%d", rl.port);
    struct contended x;
    etcd_contended(&x, NULL, "cut0");
    dlock_client *c;
    ck_assert_int_eq(dlock_open(via, &c), DLOCK_OK);
    dlock_lock *rivals[OUTAGE_N], *ls[OUTAGE_N];
    struct done_log d = {0};
    etcd_rivals_hold(&x, c, "cut", OUTAGE_N, rivals, ls);
    for (int i = 0; i < OUTAGE_N; i++)
        ck_assert_int_eq(dlock_acquire_async(ls[i], 60000, NULL, on_done, &d), DLOCK_OK);
    char last[16];
    snprintf(last, sizeof last, "cut%d/", OUTAGE_N - 1);
    ck_assert(etcd_keys_become(last, 2));
    ck_assert(!pump_until(c, &d.n, 1, 500)); /* parked */
    tu_relay_set(&rl, TU_RELAY_REFUSE);
    for (int i = 0; i < OUTAGE_N; i++)
        ck_assert_int_eq(dlock_release(rivals[i]), DLOCK_OK);
    ck_assert(!pump_until(c, &d.n, 1, 1000)); /* nobody reaches the member */
    tu_relay_set(&rl, TU_RELAY_PASS);
    ck_assert(pump_until(c, &d.n, OUTAGE_N, 40000));
    for (int i = 0; i < OUTAGE_N; i++) {
        ck_assert_msg(d.rc[i] == DLOCK_OK, "%d: %s", d.rc[i], d.msg[i]);
        ck_assert_int_eq(dlock_release(d.l[i]), DLOCK_OK);
    }
    for (int i = 0; i < OUTAGE_N; i++)
        dlock_lock_free(ls[i]);
    for (int i = 1; i < OUTAGE_N; i++)
        dlock_lock_free(rivals[i]);
    dlock_client_close(c);
    contended_close(&x);
    tu_relay_stop(&rl);
    free(via);
}
#endif

/* -------------------------------------------- asynchronous multi-locks */

/* What multi-lock completions came: their multi-locks and codes. */
struct multi_log {
    int n;
    dlock_multi *m[LOG_MAX];
    int rc[LOG_MAX];
    char msg[LOG_MAX][256];
};

static void on_multi_done(dlock_multi *m, int rc, void *arg)
{
    struct multi_log *d = arg;
    ck_assert_int_lt(d->n, LOG_MAX);
    d->m[d->n] = m;
    d->rc[d->n] = rc;
    snprintf(d->msg[d->n], sizeof d->msg[0], "%s", dlock_errmsg());
    d->n++;
}

static dlock_multi *multi_of(dlock_client *c, const char *a, const char *b, const char *cc)
{
    const char *names[] = {a, b, cc};
    dlock_multi *m;
    ck_assert_int_eq(dlock_multi_new(c, names, 3, DLOCK_EXCLUSIVE, 0, &m), DLOCK_OK);
    return m;
}

/* Whether another client can take NAME now (and gives it back). */
static bool free_elsewhere(dlock_client *other, const char *name)
{
    dlock_lock *l;
    ck_assert_int_eq(dlock_lock_new(other, name, DLOCK_EXCLUSIVE, 0, &l), DLOCK_OK);
    int rc = dlock_acquire(l, DLOCK_TRY);
    if (!rc)
        ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    return rc == DLOCK_OK;
}

/* Whether NAME is free elsewhere within 10 s: after a cancel the members
 * go back through the keeper (dlock_multi_acquire(3)), a moment later. */
static bool freed_soon(dlock_client *other, const char *name)
{
    for (int i = 0; i < 1000; i++) {
        if (free_elsewhere(other, name))
            return true;
        tu_sleep_ms(10);
    }
    return false;
}

/* On file, where nothing parks: a try takes the whole set, and a set
 * with a member held elsewhere is DLOCK_EBUSY with nothing kept; the
 * refusals of the start call. */
TU_TEST(multi_try_on_file, 30)
{
    struct contended x;
    contended_open(&x, url, "mc", false);
    dlock_multi *m = multi_of(x.c, "mc", "ma", "mb");
    struct multi_log d = {0};
    ck_assert_int_eq(dlock_multi_acquire_async(m, DLOCK_TRY, NULL, on_multi_done, &d), DLOCK_OK);
    ck_assert_int_eq(dlock_multi_acquire_async(m, DLOCK_TRY, NULL, on_multi_done, &d), DLOCK_EBUSY);
    ck_assert_int_eq(dlock_multi_acquire(m, DLOCK_TRY, NULL), DLOCK_EBUSY);
    ck_assert(pump_until(x.c, &d.n, 1, 10000));
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_ptr_eq(d.m[0], m);
    ck_assert_int_eq(dlock_multi_held(m), 1);
    ck_assert(!free_elsewhere(x.other, "ma") && !free_elsewhere(x.other, "mc"));
    ck_assert_int_eq(dlock_multi_acquire_async(m, DLOCK_TRY, NULL, on_multi_done, &d),
                     DLOCK_EMISUSE);
    ck_assert_int_eq(dlock_multi_release_async(m, on_multi_done, &d), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 2, 10000));
    ck_assert_int_eq(d.rc[1], DLOCK_OK);
    ck_assert_int_eq(dlock_multi_held(m), 0);
    ck_assert_int_eq(dlock_multi_release_async(m, on_multi_done, &d), DLOCK_ENOTOWNER);

    /* "mc", the last member, held elsewhere: busy, "ma" and "mb" not kept */
    ck_assert_int_eq(dlock_acquire(x.rival, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_multi_acquire_async(m, DLOCK_TRY, NULL, on_multi_done, &d), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 3, 10000));
    ck_assert_msg(d.rc[2] == DLOCK_EBUSY, "%d: %s", d.rc[2], d.msg[2]);
    ck_assert_ptr_nonnull(strstr(d.msg[2], "'mc'"));
    ck_assert_int_eq(dlock_multi_held(m), 0);
    ck_assert(free_elsewhere(x.other, "ma") && free_elsewhere(x.other, "mb"));

    ck_assert_int_eq(dlock_multi_acquire_async(NULL, 0, NULL, on_multi_done, &d), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_multi_acquire_async(m, 0, NULL, NULL, &d), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_multi_acquire_async(m, -5, NULL, on_multi_done, &d), DLOCK_EINVAL);
    ck_assert_int_eq(d.n, 3);
    dlock_multi_free(m);
    contended_close(&x);
}

/* A multi-lock freed while its asynchronous acquire waits parked on a
 * member, and one freed with its completion not yet dispatched: as a
 * lock handle freed so, the call ends (canceled, nothing kept) and its
 * completion comes once, with a NULL multi-lock and DLOCK_ECANCELED. */
TU_TEST(multi_freed_with_a_call_in_flight, 30)
{
    struct contended x;
    contended_open(&x, url, "fc", true);
    dlock_multi *m = multi_of(x.c, "fc", "fa", "fb");
    struct multi_log d = {0};
    ck_assert_int_eq(dlock_multi_acquire_async(m, DLOCK_FOREVER, NULL, on_multi_done, &d),
                     DLOCK_OK);
    ck_assert(!pump_until(x.c, &d.n, 1, 300)); /* "fa", "fb" taken, parked on "fc" */
    dlock_multi_free(m);
    ck_assert(pump_until(x.c, &d.n, 1, 10000));
    ck_assert_ptr_null(d.m[0]);
    ck_assert_msg(d.rc[0] == DLOCK_ECANCELED, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert(freed_soon(x.other, "fa") && freed_soon(x.other, "fb"));

    ck_assert_int_eq(dlock_release(x.rival), DLOCK_OK);
    m = multi_of(x.c, "fc", "fa", "fb");
    ck_assert_int_eq(dlock_multi_acquire_async(m, DLOCK_TRY, NULL, on_multi_done, &d), DLOCK_OK);
    struct pollfd p = {.fd = dlock_client_fd(x.c), .events = POLLIN};
    ck_assert_int_eq(poll(&p, 1, 10000), 1); /* ended, not dispatched */
    dlock_multi_free(m);
    ck_assert(pump_until(x.c, &d.n, 2, 10000));
    ck_assert_ptr_null(d.m[1]);
    ck_assert_msg(d.rc[1] == DLOCK_ECANCELED, "%d: %s", d.rc[1], d.msg[1]);
    ck_assert(free_elsewhere(x.other, "fa") && free_elsewhere(x.other, "fc"));
    ck_assert(!pump_until(x.c, &d.n, 3, 200)); /* each once */
    contended_close(&x);
}

#ifdef DLOCK_HAVE_REDIS
/* A set with a member held elsewhere waits parked (the members before it
 * held), and is taken once that member is released; exclusion against
 * the blocking side and against an overlapping asynchronous set. */
TU_TEST_IN(redis, multi_waits_then_holds_all, 60)
{
    struct contended x;
    contended_open(&x, srv.url, "mb", true);
    dlock_multi *m = multi_of(x.c, "mc", "ma", "mb"), *m2 = multi_of(x.c, "mc", "md", "me");
    struct multi_log d = {0};
    ck_assert_int_eq(dlock_multi_acquire_async(m, 30000, NULL, on_multi_done, &d), DLOCK_OK);
    ck_assert(!pump_until(x.c, &d.n, 1, 500)); /* "mb" held elsewhere: waits */
    ck_assert_int_eq(dlock_multi_held(m), 0);
    ck_assert_int_eq(dlock_release(x.rival), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 1, 20000));
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_int_eq(dlock_multi_held(m), 1);
    ck_assert(!free_elsewhere(x.other, "ma") && !free_elsewhere(x.other, "mb") &&
              !free_elsewhere(x.other, "mc"));
    /* an overlapping set ("mc") waits for this one */
    ck_assert_int_eq(dlock_multi_acquire_async(m2, 30000, NULL, on_multi_done, &d), DLOCK_OK);
    ck_assert(!pump_until(x.c, &d.n, 2, 500));
    ck_assert_int_eq(dlock_multi_release_async(m, on_multi_done, &d), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 3, 20000));
    for (int i = 1; i < 3; i++)
        ck_assert_msg(d.rc[i] == DLOCK_OK, "%d: %s", d.rc[i], d.msg[i]);
    ck_assert_int_eq(dlock_multi_held(m), 0);
    ck_assert_int_eq(dlock_multi_held(m2), 1);
    ck_assert(free_elsewhere(x.other, "ma") && !free_elsewhere(x.other, "mc"));
    ck_assert_int_eq(dlock_multi_release(m2), DLOCK_OK);
    dlock_multi_free(m);
    dlock_multi_free(m2);
    contended_close(&x);
}

/* All or nothing: a member held elsewhere for the whole wait is the
 * set's DLOCK_ETIMEDOUT, naming it, and the members taken before it
 * ("ma", "mb") are not kept. */
TU_TEST_IN(redis, multi_timeout_keeps_nothing, 60)
{
    struct contended x;
    contended_open(&x, srv.url, "mc", true);
    dlock_multi *m = multi_of(x.c, "mc", "ma", "mb");
    struct multi_log d = {0};
    int64_t t0 = tu_mono_ms();
    ck_assert_int_eq(dlock_multi_acquire_async(m, 400, NULL, on_multi_done, &d), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 1, 20000));
    ck_assert_int_ge(tu_mono_ms() - t0, 400);
    ck_assert_msg(d.rc[0] == DLOCK_ETIMEDOUT, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_ptr_nonnull(strstr(d.msg[0], "'mc'"));
    ck_assert_int_eq(dlock_multi_held(m), 0);
    for (size_t k = 0; k < dlock_multi_count(m); k++)
        ck_assert_uint_eq(dlock_hold_count(dlock_multi_lock(m, k)), 0);
    ck_assert(freed_soon(x.other, "ma") && freed_soon(x.other, "mb"));
    dlock_multi_free(m);
    contended_close(&x);
}

/* A parked set canceled by its cancel object: DLOCK_ECANCELED, nothing
 * kept, and the same multi-lock is taken afterwards. */
TU_TEST_IN(redis, multi_cancel_while_parked, 60)
{
    struct contended x;
    contended_open(&x, srv.url, "mc", true);
    dlock_multi *m = multi_of(x.c, "mc", "ma", "mb");
    dlock_cancel *k;
    ck_assert_int_eq(dlock_cancel_new(&k), DLOCK_OK);
    struct multi_log d = {0};
    ck_assert_int_eq(dlock_multi_acquire_async(m, DLOCK_FOREVER, k, on_multi_done, &d), DLOCK_OK);
    ck_assert(!pump_until(x.c, &d.n, 1, 500));
    ck_assert_int_eq(dlock_cancel_fire(k), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 1, 20000));
    ck_assert_msg(d.rc[0] == DLOCK_ECANCELED, "%d: %s", d.rc[0], d.msg[0]);
    for (size_t i = 0; i < dlock_multi_count(m); i++)
        ck_assert_uint_eq(dlock_hold_count(dlock_multi_lock(m, i)), 0);
    ck_assert(freed_soon(x.other, "ma") && freed_soon(x.other, "mb"));
    ck_assert_int_eq(dlock_release(x.rival), DLOCK_OK);
    ck_assert_int_eq(dlock_multi_acquire_async(m, 20000, NULL, on_multi_done, &d), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 2, 20000));
    ck_assert_msg(d.rc[1] == DLOCK_OK, "%d: %s", d.rc[1], d.msg[1]);
    dlock_multi_free(m); /* releases the held set */
    ck_assert(free_elsewhere(x.other, "mc"));
    dlock_cancel_free(k);
    contended_close(&x);
}

/* Close with sets in flight (parked on a member, or queued behind it):
 * each completes exactly once, during the close, with DLOCK_ECANCELED;
 * nothing of them is kept. */
TU_TEST_IN(redis, multi_close_ends_each_once, 60)
{
    struct contended x;
    contended_open(&x, srv.url, "mc", true);
    dlock_multi *ms[4];
    struct multi_log d = {0};
    const char *own[] = {"own0", "own1", "own2", "own3"};
    for (int i = 0; i < 4; i++) {
        ms[i] = multi_of(x.c, "mc", i % 2 ? "ma" : "mz", own[i]);
        ck_assert_int_eq(dlock_multi_acquire_async(ms[i], DLOCK_FOREVER, NULL, on_multi_done, &d),
                         DLOCK_OK);
    }
    ck_assert(!pump_until(x.c, &d.n, 1, 500));
    dlock_client_close(x.c);
    ck_assert_int_eq(d.n, 4);
    for (int i = 0; i < 4; i++) {
        ck_assert_msg(d.rc[i] == DLOCK_ECANCELED, "%d: %s", d.rc[i], d.msg[i]);
        for (int j = 0; j < i; j++)
            ck_assert_ptr_ne(d.m[i], d.m[j]);
    }
    ck_assert(freed_soon(x.other, "ma") && freed_soon(x.other, "mz"));
    for (int i = 0; i < 4; i++)
        dlock_multi_free(ms[i]);
    ck_assert_int_eq(d.n, 4);
    dlock_lock_free(x.rival);
    dlock_client_close(x.other);
}

/* Callbacks that go on: each acquire's callback starts the release,
 * whose callback starts the next acquire, then frees the set. */
struct multi_chain {
    dlock_multi *m;
    int rounds, bad, done;
};

static void multi_chain_released(dlock_multi *m, int rc, void *arg);

static void multi_chain_acquired(dlock_multi *m, int rc, void *arg)
{
    struct multi_chain *ch = arg;
    ch->bad += rc != DLOCK_OK || !dlock_multi_held(m);
    ch->bad += dlock_multi_release_async(m, multi_chain_released, ch) != DLOCK_OK;
}

static void multi_chain_released(dlock_multi *m, int rc, void *arg)
{
    struct multi_chain *ch = arg;
    ch->bad += rc != DLOCK_OK;
    if (++ch->rounds < 5) {
        ch->bad += dlock_multi_acquire_async(m, 20000, NULL, multi_chain_acquired, ch) != DLOCK_OK;
        return;
    }
    dlock_multi_free(m);
    ch->done = 1;
}

TU_TEST_IN(redis, multi_callbacks_start_the_next, 60)
{
    dlock_client *c;
    ck_assert_int_eq(dlock_open(srv.url, &c), DLOCK_OK);
    struct multi_chain ch = {multi_of(c, "q1", "q2", "q3"), 0, 0, 0};
    ck_assert_int_eq(dlock_multi_acquire_async(ch.m, 20000, NULL, multi_chain_acquired, &ch),
                     DLOCK_OK);
    ck_assert(pump_until(c, &ch.done, 1, 30000));
    ck_assert_int_eq(ch.rounds, 5);
    ck_assert_int_eq(ch.bad, 0);
    dlock_client_close(c);
}
#endif

/* ------------------------------------------- asynchronous semaphores */

/* What permit completions came: permits and codes. */
struct permit_log {
    int n;
    dlock_semaphore *s[LOG_MAX];
    dlock_permit *p[LOG_MAX];
    int rc[LOG_MAX];
    char msg[LOG_MAX][256];
};

static void on_permit_done(dlock_semaphore *s, dlock_permit *p, int rc, void *arg)
{
    struct permit_log *d = arg;
    ck_assert_int_lt(d->n, LOG_MAX);
    d->s[d->n] = s;
    d->p[d->n] = p;
    d->rc[d->n] = rc;
    snprintf(d->msg[d->n], sizeof d->msg[0], "%s", dlock_errmsg());
    d->n++;
}

/* A semaphore freed with its asynchronous acquire's completion not yet
 * dispatched: the completion comes once, with a NULL semaphore and
 * permit and DLOCK_ECANCELED, and the permit taken went back. */
TU_TEST(semaphore_freed_with_a_call_in_flight, 30)
{
    dlock_client *c, *other;
    ck_assert_int_eq(dlock_open(url, &c), DLOCK_OK);
    ck_assert_int_eq(dlock_open(url, &other), DLOCK_OK);
    dlock_semaphore *s, *so;
    ck_assert_int_eq(dlock_semaphore_new(c, "pool", 1, 0, &s), DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_new(other, "pool", 1, 0, &so), DLOCK_OK);
    struct permit_log d = {0};
    ck_assert_int_eq(dlock_semaphore_acquire_async(s, 1, DLOCK_TRY, NULL, on_permit_done, &d),
                     DLOCK_OK);
    struct pollfd p = {.fd = dlock_client_fd(c), .events = POLLIN};
    ck_assert_int_eq(poll(&p, 1, 10000), 1); /* ended, not dispatched */
    dlock_semaphore_free(s);
    ck_assert(pump_until(c, &d.n, 1, 10000));
    ck_assert_ptr_null(d.s[0]);
    ck_assert_ptr_null(d.p[0]);
    ck_assert_msg(d.rc[0] == DLOCK_ECANCELED, "%d: %s", d.rc[0], d.msg[0]);
    dlock_permit *again;
    ck_assert_int_eq(dlock_semaphore_acquire(so, 1, DLOCK_TRY, NULL, &again), DLOCK_OK);
    ck_assert_int_eq(dlock_permit_release(again), DLOCK_OK);
    ck_assert(!pump_until(c, &d.n, 2, 200)); /* once */
    dlock_semaphore_free(so);
    dlock_client_close(c);
    dlock_client_close(other);
}

/* ------------------------------------------------ parked permit waits */

/* Both permits of "sp" held on another client: an asynchronous acquire
 * waits parked until one is released, then holds it with a newer token;
 * the permits never exceed the count. Only the release's push ends the
 * park: the wait's bound is 60 s and no backend sets a retry time here
 * (file: no lease; redis, etcd, zk: leases of 60 s), and the hand-off
 * comes within 20 s of the release. */
static void semaphore_parked_waiter_handed_a_permit(const char *server)
{
    dlock_client *c, *other;
    ck_assert_int_eq(dlock_open(server, &c), DLOCK_OK);
    ck_assert_int_eq(dlock_open(server, &other), DLOCK_OK);
    dlock_semaphore *s, *so;
    ck_assert_int_eq(dlock_semaphore_new(c, "sp", 2, 0, &s), DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_new(other, "sp", 2, 0, &so), DLOCK_OK);
    dlock_permit *held[2], *extra;
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(dlock_semaphore_acquire(so, 1, DLOCK_TRY, NULL, &held[i]), DLOCK_OK);
    uint64_t t1, t2;
    ck_assert_int_eq(dlock_permit_token(held[1], &t1), DLOCK_OK);
    struct permit_log d = {0};
    ck_assert_int_eq(dlock_semaphore_acquire_async(s, 1, 60000, NULL, on_permit_done, &d),
                     DLOCK_OK);
    ck_assert_msg(!pump_until(c, &d.n, 1, 1000), "%d: %s", d.rc[0], d.msg[0]); /* parked */
    ck_assert_int_eq(dlock_permit_release(held[0]), DLOCK_OK);
    ck_assert_msg(pump_until(c, &d.n, 1, 20000), "a release did not wake the parked wait");
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_int_eq(dlock_permit_token(d.p[0], &t2), DLOCK_OK);
    ck_assert_uint_gt(t2, t1);
    ck_assert_int_eq(dlock_semaphore_acquire(so, 1, DLOCK_TRY, NULL, &extra), DLOCK_EBUSY);
    ck_assert_int_eq(dlock_permit_release_async(d.p[0], on_permit_done, &d), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 2, 20000));
    ck_assert_int_eq(d.rc[1], DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_acquire(so, 1, DLOCK_TRY, NULL, &extra), DLOCK_OK);
    ck_assert_int_eq(dlock_permit_release(extra), DLOCK_OK);
    ck_assert_int_eq(dlock_permit_release(held[1]), DLOCK_OK);
    dlock_semaphore_free(s);
    dlock_semaphore_free(so);
    dlock_client_close(c);
    dlock_client_close(other);
}

/* A parked permit wait's bound: DLOCK_ETIMEDOUT, not before it, in the
 * semaphore's words; nothing is left behind (the holder's permit, once
 * released, is free for another client at once). */
static void semaphore_parked_wait_bound(const char *server)
{
    dlock_client *c, *other;
    ck_assert_int_eq(dlock_open(server, &c), DLOCK_OK);
    ck_assert_int_eq(dlock_open(server, &other), DLOCK_OK);
    dlock_semaphore *s, *so;
    ck_assert_int_eq(dlock_semaphore_new(c, "sb", 1, 0, &s), DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_new(other, "sb", 1, 0, &so), DLOCK_OK);
    dlock_permit *held, *again;
    ck_assert_int_eq(dlock_semaphore_acquire(so, 1, DLOCK_TRY, NULL, &held), DLOCK_OK);
    struct permit_log d = {0};
    int64_t t0 = tu_mono_ms();
    ck_assert_int_eq(dlock_semaphore_acquire_async(s, 1, 300, NULL, on_permit_done, &d), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 1, 20000));
    ck_assert_int_ge(tu_mono_ms() - t0, 300);
    ck_assert_msg(d.rc[0] == DLOCK_ETIMEDOUT, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_msg(strstr(d.msg[0], "semaphore 'sb'"), "%s", d.msg[0]);
    ck_assert_ptr_null(d.p[0]);
    ck_assert_int_eq(dlock_permit_release(held), DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_acquire(so, 1, 10000, NULL, &again), DLOCK_OK);
    ck_assert_int_eq(dlock_permit_release(again), DLOCK_OK);
    dlock_semaphore_free(s);
    dlock_semaphore_free(so);
    dlock_client_close(c);
    dlock_client_close(other);
}

/* Parked permit waits end on dlock_semaphore_cancel() and on a cancel
 * object (DLOCK_ECANCELED, nothing taken); once the holder releases, a
 * try takes the permit. */
static void semaphore_parked_waits_canceled(const char *server)
{
    dlock_client *c, *other;
    ck_assert_int_eq(dlock_open(server, &c), DLOCK_OK);
    ck_assert_int_eq(dlock_open(server, &other), DLOCK_OK);
    dlock_semaphore *s, *so;
    ck_assert_int_eq(dlock_semaphore_new(c, "sk", 1, 0, &s), DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_new(other, "sk", 1, 0, &so), DLOCK_OK);
    dlock_permit *held;
    ck_assert_int_eq(dlock_semaphore_acquire(so, 1, DLOCK_TRY, NULL, &held), DLOCK_OK);
    dlock_cancel *k;
    ck_assert_int_eq(dlock_cancel_new(&k), DLOCK_OK);
    struct permit_log d = {0};
    ck_assert_int_eq(dlock_semaphore_acquire_async(s, 1, DLOCK_FOREVER, k, on_permit_done, &d),
                     DLOCK_OK);
    ck_assert_msg(!pump_until(c, &d.n, 1, 500), "%d: %s", d.rc[0], d.msg[0]); /* parked */
    ck_assert_int_eq(dlock_cancel_fire(k), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 1, 20000));
    ck_assert_msg(d.rc[0] == DLOCK_ECANCELED, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_int_eq(dlock_semaphore_acquire_async(s, 1, DLOCK_FOREVER, NULL, on_permit_done, &d),
                     DLOCK_OK);
    ck_assert_msg(!pump_until(c, &d.n, 2, 500), "%d: %s", d.rc[1], d.msg[1]); /* parked */
    ck_assert_int_eq(dlock_semaphore_cancel(s), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 2, 20000));
    ck_assert_msg(d.rc[1] == DLOCK_ECANCELED, "%d: %s", d.rc[1], d.msg[1]);
    ck_assert_ptr_null(d.p[0]);
    ck_assert_ptr_null(d.p[1]);
    ck_assert_int_eq(dlock_permit_release(held), DLOCK_OK);
    /* Nothing stays once what a cancel owes is given back (zk: the
     * keeper deletes a canceled wait's nodes, within seconds). */
    int rc = DLOCK_EBUSY;
    for (int i = 0; i < 100 && rc == DLOCK_EBUSY; i++) {
        rc = dlock_semaphore_acquire(so, 1, DLOCK_TRY, NULL, &held);
        if (rc == DLOCK_EBUSY)
            tu_sleep_ms(100);
    }
    ck_assert_msg(rc == DLOCK_OK, "%d: %s", rc, dlock_errmsg());
    ck_assert_int_eq(dlock_permit_release(held), DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_acquire_async(s, 1, DLOCK_TRY, NULL, on_permit_done, &d),
                     DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 3, 20000));
    ck_assert_msg(d.rc[2] == DLOCK_OK, "%d: %s", d.rc[2], d.msg[2]);
    ck_assert_int_eq(dlock_permit_release(d.p[2]), DLOCK_OK);
    dlock_cancel_free(k);
    dlock_semaphore_free(s);
    dlock_semaphore_free(so);
    dlock_client_close(c);
    dlock_client_close(other);
}

/* A permit of K = 2 given back frees two: both parked waiters of one
 * permit are handed one (a close wakes every parked permit waiter of the
 * file, not one: one release may free several permits). */
static void semaphore_one_release_hands_two_permits(const char *server)
{
    dlock_client *c, *other;
    ck_assert_int_eq(dlock_open(server, &c), DLOCK_OK);
    ck_assert_int_eq(dlock_open(server, &other), DLOCK_OK);
    dlock_semaphore *s, *so;
    ck_assert_int_eq(dlock_semaphore_new(c, "s2", 2, 0, &s), DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_new(other, "s2", 2, 0, &so), DLOCK_OK);
    dlock_permit *both;
    ck_assert_int_eq(dlock_semaphore_acquire(so, 2, DLOCK_TRY, NULL, &both), DLOCK_OK);
    struct permit_log d = {0};
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(dlock_semaphore_acquire_async(s, 1, 60000, NULL, on_permit_done, &d),
                         DLOCK_OK);
    ck_assert_msg(!pump_until(c, &d.n, 1, 1000), "%d: %s", d.rc[0], d.msg[0]); /* parked */
    ck_assert_int_eq(dlock_permit_release(both), DLOCK_OK);
    ck_assert_msg(pump_until(c, &d.n, 2, 20000), "%d of 2 parked waits were handed a permit", d.n);
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(d.rc[i] == DLOCK_OK, "%d: %s", d.rc[i], d.msg[i]);
        ck_assert_int_eq(dlock_permit_release(d.p[i]), DLOCK_OK);
    }
    dlock_semaphore_free(s);
    dlock_semaphore_free(so);
    dlock_client_close(c);
    dlock_client_close(other);
}

/* Each of the parked permit tests, for SEMAPHORE_TESTS(T) as
 * PARKED_TESTS. */
#define SEMAPHORE_TESTS(T)                     \
    T(semaphore_parked_waiter_handed_a_permit) \
    T(semaphore_parked_wait_bound)             \
    T(semaphore_parked_waits_canceled)         \
    T(semaphore_one_release_hands_two_permits)

#define FILE_SEMAPHORE(name) \
    TU_TEST(file_##name, 60) \
    {                        \
        name(url);           \
    }
SEMAPHORE_TESTS(FILE_SEMAPHORE)

/* On file: a try takes permits and refuses more than are free; the
 * release. */
TU_TEST(semaphore_try_on_file, 30)
{
    dlock_client *c;
    ck_assert_int_eq(dlock_open(url, &c), DLOCK_OK);
    dlock_semaphore *s;
    ck_assert_int_eq(dlock_semaphore_new(c, "pool", 3, 0, &s), DLOCK_OK);
    struct permit_log d = {0};
    ck_assert_int_eq(dlock_semaphore_acquire_async(s, 2, DLOCK_TRY, NULL, on_permit_done, &d),
                     DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 1, 10000));
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_ptr_nonnull(d.p[0]);
    ck_assert_uint_eq(dlock_permit_count(d.p[0]), 2);
    ck_assert_int_eq(dlock_semaphore_acquire_async(s, 2, DLOCK_TRY, NULL, on_permit_done, &d),
                     DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 2, 10000));
    ck_assert_msg(d.rc[1] == DLOCK_EBUSY, "%d: %s", d.rc[1], d.msg[1]);
    ck_assert_ptr_null(d.p[1]);
    ck_assert_int_eq(dlock_semaphore_acquire_async(s, 4, DLOCK_TRY, NULL, on_permit_done, &d),
                     DLOCK_EINVAL);
    ck_assert_int_eq(dlock_semaphore_acquire_async(s, 1, 0, NULL, NULL, &d), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_permit_release_async(d.p[0], on_permit_done, &d), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 3, 10000));
    ck_assert_int_eq(d.rc[2], DLOCK_OK);
    ck_assert_ptr_null(d.p[2]);
    ck_assert_int_eq(d.n, 3);
    dlock_semaphore_free(s);
    dlock_client_close(c);
}

/* dlock_election_cancel() right after the campaigns started, before
 * the pool may have run them: each ends DLOCK_ECANCELED anyway (a cancel
 * that found no wait yet used to be lost, and the campaign waited on
 * forever). On file, every election led by another client. */
#define EARLY_CANCELS 8
TU_TEST(campaign_canceled_before_it_runs, 30)
{
    dlock_client *c, *other;
    ck_assert_int_eq(dlock_open(url, &c), DLOCK_OK);
    ck_assert_int_eq(dlock_open(url, &other), DLOCK_OK);
    dlock_election *leaders[EARLY_CANCELS], *es[EARLY_CANCELS];
    struct elect_log d = {0};
    for (int i = 0; i < EARLY_CANCELS; i++) {
        char name[16];
        snprintf(name, sizeof name, "el-early%d", i);
        leaders[i] = election_on(other, name);
        ck_assert_int_eq(dlock_election_campaign(leaders[i], "l", DLOCK_TRY, NULL), DLOCK_OK);
        es[i] = election_on(c, name);
    }
    for (int i = 0; i < EARLY_CANCELS; i++) {
        ck_assert_int_eq(dlock_election_campaign_async(es[i], "w", DLOCK_FOREVER, NULL,
                                                       on_elect_done, &d),
                         DLOCK_OK);
        ck_assert_int_eq(dlock_election_cancel(es[i]), DLOCK_OK);
    }
    bool all = pump_until(c, &d.n, EARLY_CANCELS, 20000);
    int n = d.n;
    dlock_client_close(c); /* ends what the cancels missed */
    ck_assert_msg(all, "%d of %d canceled campaigns completed", n, EARLY_CANCELS);
    for (int i = 0; i < EARLY_CANCELS; i++)
        ck_assert_msg(d.rc[i] == DLOCK_ECANCELED, "%d: %s", d.rc[i], d.msg[i]);
    for (int i = 0; i < EARLY_CANCELS; i++) {
        dlock_election_free(es[i]);
        dlock_election_free(leaders[i]);
    }
    dlock_client_close(other);
}

/* What an asynchronous campaign refuses to start, on file: NULL
 * arguments, a bad wait, a fired cancel object, a handle that leads
 * already or has a call in flight; a resign of a handle that does not
 * lead. None of them has a callback. */
TU_TEST(campaign_async_refusals, 30)
{
    dlock_client *c;
    ck_assert_int_eq(dlock_open(url, &c), DLOCK_OK);
    dlock_election *e = election_on(c, "el-ref");
    struct elect_log d = {0};
    ck_assert_int_eq(dlock_election_campaign_async(NULL, "v", 0, NULL, on_elect_done, &d),
                     DLOCK_EINVAL);
    ck_assert_int_eq(dlock_election_campaign_async(e, NULL, 0, NULL, on_elect_done, &d),
                     DLOCK_EINVAL);
    ck_assert_int_eq(dlock_election_campaign_async(e, "v", 0, NULL, NULL, &d), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_election_campaign_async(e, "v", -7, NULL, on_elect_done, &d),
                     DLOCK_EINVAL);
    ck_assert_int_eq(dlock_election_resign_async(e, on_elect_done, &d), DLOCK_ENOTOWNER);
    ck_assert_int_eq(dlock_election_resign_async(e, NULL, &d), DLOCK_EINVAL);
    dlock_cancel *k;
    ck_assert_int_eq(dlock_cancel_new(&k), DLOCK_OK);
    ck_assert_int_eq(dlock_cancel_fire(k), DLOCK_OK);
    ck_assert_int_eq(dlock_election_campaign_async(e, "v", 0, k, on_elect_done, &d),
                     DLOCK_ECANCELED);
    ck_assert_int_eq(dlock_election_campaign_async(e, "v", 0, NULL, on_elect_done, &d), DLOCK_OK);
    ck_assert_int_eq(dlock_election_campaign_async(e, "v", 0, NULL, on_elect_done, &d),
                     DLOCK_EBUSY);
    ck_assert(pump_until(c, &d.n, 1, 10000));
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_uint_gt(d.token[0], 0);
    ck_assert_int_eq(dlock_election_campaign_async(e, "v", 0, NULL, on_elect_done, &d),
                     DLOCK_EMISUSE);
    ck_assert_int_eq(dlock_election_resign_async(e, on_elect_done, &d), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 2, 10000));
    ck_assert_int_eq(d.rc[1], DLOCK_OK);
    ck_assert_int_eq(dlock_dispatch(c), 0);
    ck_assert_int_eq(d.n, 2);
    dlock_cancel_free(k);
    dlock_election_free(e);
    dlock_client_close(c);
}

#ifdef DLOCK_HAVE_REDIS
#define REDIS_SEMAPHORE(name)   \
    TU_TEST_IN(redis, name, 60) \
    {                           \
        name(srv.url);          \
    }
SEMAPHORE_TESTS(REDIS_SEMAPHORE)

/* Both permits of "slots" held elsewhere: an asynchronous acquire waits
 * parked until one is released, then holds it with a newer token; the
 * permits never exceed the count meanwhile. */
TU_TEST_IN(redis, semaphore_waits_parked_then_takes, 60)
{
    dlock_client *c, *other;
    ck_assert_int_eq(dlock_open(srv.url, &c), DLOCK_OK);
    ck_assert_int_eq(dlock_open(srv.url, &other), DLOCK_OK);
    dlock_semaphore *s, *so;
    ck_assert_int_eq(dlock_semaphore_new(c, "slots", 2, 0, &s), DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_new(other, "slots", 2, 0, &so), DLOCK_OK);
    dlock_permit *held[2], *extra;
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(dlock_semaphore_acquire(so, 1, DLOCK_TRY, NULL, &held[i]), DLOCK_OK);
    uint64_t t1, t2;
    ck_assert_int_eq(dlock_permit_token(held[1], &t1), DLOCK_OK);
    struct permit_log d = {0};
    ck_assert_int_eq(dlock_semaphore_acquire_async(s, 1, 30000, NULL, on_permit_done, &d),
                     DLOCK_OK);
    ck_assert(!pump_until(c, &d.n, 1, 500)); /* none free: waits */
    ck_assert_int_eq(dlock_permit_release(held[0]), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 1, 20000));
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_int_eq(dlock_permit_token(d.p[0], &t2), DLOCK_OK);
    ck_assert_uint_gt(t2, t1);
    ck_assert_ptr_nonnull(dlock_permit_id(d.p[0]));
    ck_assert_int_eq(dlock_semaphore_acquire(so, 1, DLOCK_TRY, NULL, &extra), DLOCK_EBUSY);
    ck_assert_int_eq(dlock_permit_release_async(d.p[0], on_permit_done, &d), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 2, 20000));
    ck_assert_int_eq(d.rc[1], DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_acquire(so, 1, DLOCK_TRY, NULL, &extra), DLOCK_OK);
    ck_assert_int_eq(dlock_permit_release(extra), DLOCK_OK);
    ck_assert_int_eq(dlock_permit_release(held[1]), DLOCK_OK);
    dlock_semaphore_free(s);
    dlock_semaphore_free(so);
    dlock_client_close(c);
    dlock_client_close(other);
}

/* A parked permit wait whose server is down when its bound comes ends
 * with DLOCK_ETIMEDOUT naming the outage (the server's address). */
TU_TEST_IN(redis, semaphore_wait_ending_in_an_outage_names_it, 60)
{
    dlock_client *c, *other;
    ck_assert_int_eq(dlock_open(srv.url, &c), DLOCK_OK);
    ck_assert_int_eq(dlock_open(srv.url, &other), DLOCK_OK);
    dlock_semaphore *s, *so;
    ck_assert_int_eq(dlock_semaphore_new(c, "down", 1, 0, &s), DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_new(other, "down", 1, 0, &so), DLOCK_OK);
    dlock_permit *held;
    ck_assert_int_eq(dlock_semaphore_acquire(so, 1, DLOCK_TRY, NULL, &held), DLOCK_OK);
    struct permit_log d = {0};
    ck_assert_int_eq(dlock_semaphore_acquire_async(s, 1, 4000, NULL, on_permit_done, &d), DLOCK_OK);
    redis_subscribed(c, &d.n); /* none free: parked, listening */
    fx_redis_kill(&srv);
    ck_assert(pump_until(c, &d.n, 1, 20000));
    ck_assert(fx_redis_restart(&srv));
    ck_assert_msg(d.rc[0] == DLOCK_ETIMEDOUT, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_msg(strstr(d.msg[0], "still failing") && strstr(d.msg[0], "127.0.0.1"), "%s",
                  d.msg[0]);
    ck_assert_ptr_null(d.p[0]);
    dlock_permit_release(held); /* the restart took it */
    dlock_semaphore_free(s);
    dlock_semaphore_free(so);
    dlock_client_close(c);
    dlock_client_close(other);
}

/* A semaphore freed while its asynchronous acquire waits parked: the
 * wait ends, nothing is taken, and the completion comes once with a
 * NULL semaphore and permit and DLOCK_ECANCELED. */
TU_TEST_IN(redis, semaphore_freed_while_parked, 60)
{
    dlock_client *c, *other;
    ck_assert_int_eq(dlock_open(srv.url, &c), DLOCK_OK);
    ck_assert_int_eq(dlock_open(srv.url, &other), DLOCK_OK);
    dlock_semaphore *s, *so;
    ck_assert_int_eq(dlock_semaphore_new(c, "gone", 1, 0, &s), DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_new(other, "gone", 1, 0, &so), DLOCK_OK);
    dlock_permit *held, *again;
    ck_assert_int_eq(dlock_semaphore_acquire(so, 1, DLOCK_TRY, NULL, &held), DLOCK_OK);
    struct permit_log d = {0};
    ck_assert_int_eq(dlock_semaphore_acquire_async(s, 1, DLOCK_FOREVER, NULL, on_permit_done, &d),
                     DLOCK_OK);
    ck_assert(!pump_until(c, &d.n, 1, 300)); /* none free: parked */
    dlock_semaphore_free(s);
    ck_assert(pump_until(c, &d.n, 1, 10000));
    ck_assert_ptr_null(d.s[0]);
    ck_assert_ptr_null(d.p[0]);
    ck_assert_msg(d.rc[0] == DLOCK_ECANCELED, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_int_eq(dlock_permit_release(held), DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_acquire(so, 1, DLOCK_TRY, NULL, &again), DLOCK_OK);
    ck_assert_int_eq(dlock_permit_release(again), DLOCK_OK);
    ck_assert(!pump_until(c, &d.n, 2, 200)); /* once */
    dlock_semaphore_free(so);
    dlock_client_close(c);
    dlock_client_close(other);
}

/* Parked permit waits end on dlock_semaphore_cancel() and on a cancel
 * object (DLOCK_ECANCELED, nothing taken), and a wait bound is
 * DLOCK_ETIMEDOUT in the semaphore's words. */
TU_TEST_IN(redis, semaphore_cancel_and_timeout_parked, 60)
{
    dlock_client *c, *other;
    ck_assert_int_eq(dlock_open(srv.url, &c), DLOCK_OK);
    ck_assert_int_eq(dlock_open(srv.url, &other), DLOCK_OK);
    dlock_semaphore *s, *so;
    ck_assert_int_eq(dlock_semaphore_new(c, "one", 1, 0, &s), DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_new(other, "one", 1, 0, &so), DLOCK_OK);
    dlock_permit *held, *again;
    ck_assert_int_eq(dlock_semaphore_acquire(so, 1, DLOCK_TRY, NULL, &held), DLOCK_OK);
    dlock_cancel *k;
    ck_assert_int_eq(dlock_cancel_new(&k), DLOCK_OK);
    struct permit_log d = {0};
    ck_assert_int_eq(dlock_semaphore_acquire_async(s, 1, DLOCK_FOREVER, NULL, on_permit_done, &d),
                     DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_acquire_async(s, 1, DLOCK_FOREVER, k, on_permit_done, &d),
                     DLOCK_OK);
    ck_assert(!pump_until(c, &d.n, 1, 500));
    ck_assert_int_eq(dlock_cancel_fire(k), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 1, 20000));
    ck_assert_msg(d.rc[0] == DLOCK_ECANCELED, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_int_eq(dlock_semaphore_cancel(s), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 2, 20000));
    ck_assert_msg(d.rc[1] == DLOCK_ECANCELED, "%d: %s", d.rc[1], d.msg[1]);
    ck_assert_int_eq(dlock_semaphore_acquire_async(s, 1, 300, NULL, on_permit_done, &d), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 3, 20000));
    ck_assert_msg(d.rc[2] == DLOCK_ETIMEDOUT, "%d: %s", d.rc[2], d.msg[2]);
    ck_assert_ptr_nonnull(strstr(d.msg[2], "semaphore 'one'"));
    for (int i = 0; i < 3; i++)
        ck_assert_ptr_null(d.p[i]);
    ck_assert_int_eq(dlock_permit_release(held), DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_acquire(so, 1, DLOCK_TRY, NULL, &again), DLOCK_OK);
    ck_assert_int_eq(dlock_permit_release(again), DLOCK_OK);
    dlock_cancel_free(k);
    dlock_semaphore_free(s);
    dlock_semaphore_free(so);
    dlock_client_close(c);
    dlock_client_close(other);
}

/* dlock_semaphore_cancel() right after the acquires started, before the
 * pool may have run them: each ends DLOCK_ECANCELED anyway (a cancel
 * that found no wait yet used to be lost: the acquire waited on). */
TU_TEST_IN(redis, semaphore_canceled_before_it_runs, 60)
{
    dlock_client *c, *other;
    ck_assert_int_eq(dlock_open(srv.url, &c), DLOCK_OK);
    ck_assert_int_eq(dlock_open(srv.url, &other), DLOCK_OK);
    dlock_semaphore *s, *so;
    ck_assert_int_eq(dlock_semaphore_new(c, "early", 1, 0, &s), DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_new(other, "early", 1, 0, &so), DLOCK_OK);
    dlock_permit *held;
    ck_assert_int_eq(dlock_semaphore_acquire(so, 1, DLOCK_TRY, NULL, &held), DLOCK_OK);
    struct permit_log d = {0};
    for (int i = 0; i < EARLY_CANCELS; i++) {
        ck_assert_int_eq(dlock_semaphore_acquire_async(s, 1, DLOCK_FOREVER, NULL, on_permit_done,
                                                       &d),
                         DLOCK_OK);
        ck_assert_int_eq(dlock_semaphore_cancel(s), DLOCK_OK);
    }
    bool all = pump_until(c, &d.n, EARLY_CANCELS, 20000);
    int n = d.n;
    dlock_client_close(c); /* ends what the cancels missed */
    ck_assert_msg(all, "%d of %d canceled acquires completed", n, EARLY_CANCELS);
    for (int i = 0; i < EARLY_CANCELS; i++) {
        ck_assert_msg(d.rc[i] == DLOCK_ECANCELED, "%d: %s", d.rc[i], d.msg[i]);
        ck_assert_ptr_null(d.p[i]);
    }
    ck_assert_int_eq(dlock_permit_release(held), DLOCK_OK);
    dlock_semaphore_free(s);
    dlock_semaphore_free(so);
    dlock_client_close(other);
}

/* Close with permit waits parked: each completes once, during the
 * close, with DLOCK_ECANCELED. */
TU_TEST_IN(redis, semaphore_close_ends_each_once, 60)
{
    dlock_client *c, *other;
    ck_assert_int_eq(dlock_open(srv.url, &c), DLOCK_OK);
    ck_assert_int_eq(dlock_open(srv.url, &other), DLOCK_OK);
    dlock_semaphore *s, *so;
    ck_assert_int_eq(dlock_semaphore_new(c, "full", 1, 0, &s), DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_new(other, "full", 1, 0, &so), DLOCK_OK);
    dlock_permit *held;
    ck_assert_int_eq(dlock_semaphore_acquire(so, 1, DLOCK_TRY, NULL, &held), DLOCK_OK);
    struct permit_log d = {0};
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(dlock_semaphore_acquire_async(s, 1, DLOCK_FOREVER, NULL, on_permit_done,
                                                       &d),
                         DLOCK_OK);
    ck_assert(!pump_until(c, &d.n, 1, 500));
    dlock_client_close(c);
    ck_assert_int_eq(d.n, 8);
    for (int i = 0; i < 8; i++)
        ck_assert_msg(d.rc[i] == DLOCK_ECANCELED && !d.p[i], "%d: %s", d.rc[i], d.msg[i]);
    dlock_semaphore_free(s);
    ck_assert_int_eq(d.n, 8);
    ck_assert_int_eq(dlock_permit_release(held), DLOCK_OK);
    dlock_semaphore_free(so);
    dlock_client_close(other);
}

/* Callbacks that go on: two chains on a semaphore of one permit, each
 * acquire's callback releasing, each release's starting the next
 * acquire: never two permits at once, every round served. */
struct permit_chain {
    dlock_semaphore *s;
    int left, bad, done;
};

static atomic_int permits_in;

static void permit_chain_acquired(dlock_semaphore *s, dlock_permit *p, int rc, void *arg);

static void permit_chain_released(dlock_semaphore *s, dlock_permit *p, int rc, void *arg)
{
    struct permit_chain *ch = arg;
    ch->bad += rc != DLOCK_OK || p != NULL;
    if (--ch->left == 0)
        ch->done = 1;
    else
        ch->bad +=
            dlock_semaphore_acquire_async(s, 1, 20000, NULL, permit_chain_acquired, ch) != DLOCK_OK;
}

static void permit_chain_acquired(dlock_semaphore *s, dlock_permit *p, int rc, void *arg)
{
    (void)s;
    struct permit_chain *ch = arg;
    if (rc != DLOCK_OK || !p) {
        ch->bad++;
        ch->done = 1;
        return;
    }
    ch->bad += atomic_fetch_add(&permits_in, 1) != 0;
    atomic_fetch_sub(&permits_in, 1);
    ch->bad += dlock_permit_release_async(p, permit_chain_released, ch) != DLOCK_OK;
}

TU_TEST_IN(redis, semaphore_callbacks_start_the_next, 60)
{
    dlock_client *c;
    ck_assert_int_eq(dlock_open(srv.url, &c), DLOCK_OK);
    dlock_semaphore *s;
    ck_assert_int_eq(dlock_semaphore_new(c, "turns", 1, 0, &s), DLOCK_OK);
    struct permit_chain ch[2] = {{s, 10, 0, 0}, {s, 10, 0, 0}};
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(dlock_semaphore_acquire_async(s, 1, 20000, NULL, permit_chain_acquired,
                                                       &ch[i]),
                         DLOCK_OK);
    int never = 0;
    int64_t end = tu_mono_ms() + 50000;
    while (!(ch[0].done && ch[1].done) && tu_mono_ms() < end)
        pump_until(c, &never, 1, 100);
    ck_assert(ch[0].done && ch[1].done);
    ck_assert_int_eq(ch[0].bad + ch[1].bad, 0);
    ck_assert_int_eq(ch[0].left + ch[1].left, 0);
    dlock_semaphore_free(s);
    dlock_client_close(c);
}

/* A permits handle (dlock_lock_new_permits) through dlock_acquire_async:
 * its parked wait takes a permit of the semaphore, not the lock of the
 * same name. Before, the wait went through the lock's attempt. */
TU_TEST_IN(redis, permits_handle_waits_for_a_permit, 60)
{
    dlock_client *c, *other;
    ck_assert_int_eq(dlock_open(srv.url, &c), DLOCK_OK);
    ck_assert_int_eq(dlock_open(srv.url, &other), DLOCK_OK);
    dlock_semaphore *so;
    ck_assert_int_eq(dlock_semaphore_new(other, "ph", 1, 0, &so), DLOCK_OK);
    dlock_permit *held;
    ck_assert_int_eq(dlock_semaphore_acquire(so, 1, DLOCK_TRY, NULL, &held), DLOCK_OK);
    dlock_lock *l;
    ck_assert_int_eq(dlock_lock_new_permits(c, "ph", 1, 0, &l), DLOCK_OK);
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(l, 30000, NULL, on_done, &d), DLOCK_OK);
    ck_assert_msg(!pump_until(c, &d.n, 1, 500), "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_int_eq(dlock_permit_release(held), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 1, 20000));
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    dlock_info *i;
    ck_assert_int_eq(dlock_semaphore_inspect(other, "ph", 1, &i), DLOCK_OK);
    ck_assert_int_eq(dlock_info_free_permits(i), 0);
    dlock_info_free(i);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    dlock_semaphore_free(so);
    dlock_client_close(c);
    dlock_client_close(other);
}
#endif

#if defined DLOCK_HAVE_REDIS && defined DLOCK_HAVE_LIBUV
struct uv_test {
    uv_timer_t tick;
    struct loop_seen seen;
    dlock_uv *watch;
};

static void uv_ticked(uv_timer_t *t)
{
    struct uv_test *u = t->data;
    u->seen.ticks++;
    if (u->seen.done || u->seen.ticks > 40 * LOOP_HOLD_MS / LOOP_TICK_MS) { /* done, or lost */
        uv_timer_stop(t);
        uv_close((uv_handle_t *)t, NULL);
        dlock_uv_detach(u->watch);
    }
}

/* A libuv loop's timer fires on while an acquire waits on it. */
TU_TEST_IN(redis, libuv_loop_runs_while_acquire_waits, 60)
{
    struct rival r = {.url = srv.url, .name = "uv", .hold_ms = LOOP_HOLD_MS};
    rival_start(&r);
    dlock_client *c;
    ck_assert_int_eq(dlock_open(srv.url, &c), DLOCK_OK);
    dlock_lock *l = owned(c, "uv");
    uv_loop_t loop;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    struct uv_test u = {0};
    ck_assert_int_eq(dlock_uv_attach(&loop, c, &u.watch), 0);
    uv_timer_init(&loop, &u.tick);
    u.tick.data = &u;
    uv_timer_start(&u.tick, uv_ticked, LOOP_TICK_MS, LOOP_TICK_MS);
    ck_assert_int_eq(dlock_acquire_async(l, 30000, NULL, loop_acquired, &u.seen), DLOCK_OK);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    ck_assert_int_eq(u.seen.done, 1);
    ck_assert_int_eq(u.seen.rc, DLOCK_OK);
    ck_assert_msg(u.seen.ticks_at_acquire >= LOOP_MIN_TICKS, "the timer fired %d times",
                  u.seen.ticks_at_acquire);
    rival_end(&r);
    dlock_lock_free(l);
    dlock_client_close(c);
}
#endif

#if defined DLOCK_HAVE_REDIS && defined DLOCK_HAVE_LIBEVENT
struct ev_test {
    struct event *tick;
    struct event_base *base;
    struct loop_seen seen;
    dlock_event *watch;
};

static void ev_ticked(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct ev_test *e = arg;
    e->seen.ticks++;
    if (e->seen.done || e->seen.ticks > 40 * LOOP_HOLD_MS / LOOP_TICK_MS) {
        event_del(e->tick);
        dlock_event_detach(e->watch);
        e->watch = NULL;
    }
}

/* A libevent loop's timer fires on while an acquire waits on it. */
TU_TEST_IN(redis, libevent_loop_runs_while_acquire_waits, 60)
{
    struct rival r = {.url = srv.url, .name = "ev", .hold_ms = LOOP_HOLD_MS};
    rival_start(&r);
    dlock_client *c;
    ck_assert_int_eq(dlock_open(srv.url, &c), DLOCK_OK);
    dlock_lock *l = owned(c, "ev");
    struct ev_test e = {0};
    e.base = event_base_new();
    ck_assert_ptr_nonnull(e.base);
    ck_assert_int_eq(dlock_event_attach(e.base, c, &e.watch), 0);
    e.tick = event_new(e.base, -1, EV_PERSIST, ev_ticked, &e);
    struct timeval every = {0, LOOP_TICK_MS * 1000};
    ck_assert_int_eq(event_add(e.tick, &every), 0);
    ck_assert_int_eq(dlock_acquire_async(l, 30000, NULL, loop_acquired, &e.seen), DLOCK_OK);
    ck_assert_int_eq(event_base_dispatch(e.base), 1); /* 1: no events left */
    event_free(e.tick);
    event_base_free(e.base);
    ck_assert_int_eq(e.seen.done, 1);
    ck_assert_int_eq(e.seen.rc, DLOCK_OK);
    ck_assert_msg(e.seen.ticks_at_acquire >= LOOP_MIN_TICKS, "the timer fired %d times",
                  e.seen.ticks_at_acquire);
    rival_end(&r);
    dlock_lock_free(l);
    dlock_client_close(c);
}
#endif

/* --------------------------------------------------------- on ZooKeeper */

#ifdef DLOCK_HAVE_ZK
/* One standalone server for the whole case (a JVM takes seconds to
 * start); each test uses names of its own. The session timeout (the
 * lease) is 60 s, and a parked waiter's only timed retry (the safety net
 * for a lost watch event) comes a session timeout after its watch was
 * set: a hand-off within the tests' 20 s bounds came through the watch.
 * On zk the server sees the client as the holder, so a client has one
 * acquire per name at a time: waiters of one name are on clients of
 * their own. */
static struct zkf zk_srv;
static bool zk_ok;

static void zk_setup(void)
{
    zk_ok = zkf_start(&zk_srv, 1);
    if (!zk_ok)
        fprintf(stderr, "fixture: %s\n", zk_srv.error);
}

static void zk_teardown(void)
{
    zkf_stop(&zk_srv);
}

TU_CASE(zk, zk_setup, zk_teardown, TU_AROUND_CASE)

/* The server's URL (sessions of 60 s), once the test saw it started. */
static char *zk_url(void)
{
    ck_assert_msg(zk_ok, "ZooKeeper did not start: %s", zk_srv.error);
    static char *zk_u;
    if (!zk_u)
        zk_u = zkf_url(&zk_srv, NULL, "lease=60s");
    return zk_u;
}

static dlock_client *zk_client(void)
{
    dlock_client *c;
    ck_assert_int_eq(dlock_open(zk_url(), &c), DLOCK_OK);
    return c;
}

#define ZK_TEST(name)             \
    TU_TEST_IN(zk, zk_##name, 60) \
    {                             \
        name(zk_url());           \
    }
ELECTION_TESTS(ZK_TEST)
SEMAPHORE_TESTS(ZK_TEST)

/* Wait (up to 20 s) until NAME has WANT waiters queued, as C sees it. */
static void zk_queued(dlock_client *c, const char *name, long want)
{
    long n = -2;
    for (int i = 0; i < 2000 && (n = tu_waiters(c, name)) != want; i++)
        tu_sleep_ms(10);
    ck_assert_msg(n == want, "'%s': %ld waiters, not %ld", name, n, want);
}

/* The requests the server received so far ("srvr"). */
static long zk_received(void)
{
    char *srvr = zkf_4lw(zk_srv.s[0].port, "srvr");
    ck_assert_ptr_nonnull(srvr);
    const char *at = strstr(srvr, "Received: ");
    ck_assert_ptr_nonnull(at);
    long n = strtol(at + strlen("Received: "), NULL, 10);
    free(srvr);
    return n;
}

/* A holder on another client: the asynchronous acquire parks (its node
 * queued behind the holder's, sending nothing while it waits) until the
 * release, which the watch on the holder's node brings: it then holds
 * with a newer token and keeps the other side out. */
TU_TEST_IN(zk, parked_waiter_is_handed_the_lock_by_the_watch, 60)
{
    struct contended x;
    contended_open(&x, zk_url(), "w", true);
    dlock_client *c = x.c;
    dlock_lock *l = owned(c, "w");
    uint64_t t1, t2;
    ck_assert_int_eq(dlock_token(x.rival, &t1), DLOCK_OK);
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(l, DLOCK_FOREVER, NULL, on_done, &d), DLOCK_OK);
    zk_queued(x.other, "w", 1);
    long before = zk_received();
    ck_assert(!pump_until(c, &d.n, 1, 2000)); /* parked */
    long during = zk_received() - before;
    /* a poll of even 200 ms would be 20 requests; the sessions' pings
     * and renewals are one a 20 s at most each (3 sessions) */
    ck_assert_msg(during <= 6, "%ld requests while one waiter was parked for 2 s", during);
    ck_assert_int_eq(dlock_release(x.rival), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 1, 20000));
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_int_eq(dlock_token(l, &t2), DLOCK_OK);
    ck_assert_uint_gt(t2, t1);
    ck_assert_int_eq(dlock_acquire(x.rival, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_int_eq(dlock_release_async(l, on_done, &d), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 2, 20000));
    ck_assert_int_eq(d.rc[1], DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(x.rival, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_release(x.rival), DLOCK_OK);
    dlock_lock_free(l);
    contended_close(&x);
}

/* A parked waiter whose server stops answering for longer than its
 * session timeout (2 s; the holder's is 60 s) rides it out as a
 * blocking waiter does: its session may expire, taking its node, and a
 * new one queues it again behind the holder; the release still hands it
 * the lock. */
TU_TEST_IN(zk, parked_wait_rides_out_a_server_pause, 60)
{
    struct contended x;
    contended_open(&x, zk_url(), "p", true);
    dlock_client *c;
    char *short_url = zkf_url(&zk_srv, NULL, "lease=2s");
    ck_assert_int_eq(dlock_open(short_url, &c), DLOCK_OK);
    dlock_lock *l = owned(c, "p");
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(l, DLOCK_FOREVER, NULL, on_done, &d), DLOCK_OK);
    zk_queued(x.other, "p", 1);
    ck_assert_int_eq(kill(zk_srv.s[0].pid, SIGSTOP), 0);
    bool ended = pump_until(c, &d.n, 1, 5000);
    ck_assert_int_eq(kill(zk_srv.s[0].pid, SIGCONT), 0);
    ck_assert_msg(!ended, "%d: %s", d.rc[0], d.msg[0]);
    zk_queued(x.other, "p", 1); /* its node, or a new one in a new session */
    ck_assert(!pump_until(c, &d.n, 1, 300));
    ck_assert_int_eq(dlock_release(x.rival), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 1, 20000));
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_int_eq(dlock_acquire(x.rival, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(short_url);
    contended_close(&x);
}

/* The hand-off to a parked waiter costs it no request: its watches on
 * the nodes ahead counted them down (ahead.c), so the release's event
 * alone makes it the holder. The server counts 2 requests from before
 * the release to after the completion (the release's delete, and one
 * the count's reading itself shows when nothing else happens); before,
 * the woken waiter listed the children again (sync + getChildren): 4.
 * Sessions of 10 minutes here, so that no ping falls in between. */
TU_TEST_IN(zk, parked_handoff_costs_the_waiter_no_request, 60)
{
    (void)zk_url(); /* the server started */
    struct contended x;
    char *quiet_url = zkf_url(&zk_srv, NULL, "lease=600s");
    contended_open(&x, quiet_url, "h", true);
    dlock_lock *l = owned(x.c, "h");
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(l, DLOCK_FOREVER, NULL, on_done, &d), DLOCK_OK);
    zk_queued(x.other, "h", 1);
    ck_assert(!pump_until(x.c, &d.n, 1, 300)); /* parked, its requests answered */
    long before = zk_received();
    ck_assert_int_eq(dlock_release(x.rival), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 1, 20000));
    long after = zk_received();
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_msg(after - before <= 2, "%ld requests from the release to the hand-off",
                  after - before);
    ck_assert_int_eq(dlock_acquire(x.rival, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    contended_close(&x);
    free(quiet_url);
}

/* A parked waiter whose nodes ahead all went before its watches on them
 * reached the server holds at once: the watches' replies (no node), not
 * events, end its count, and nothing else would wake it before its
 * safety-net look a session timeout (60 s) later. The relay in front of
 * the waiter's client keeps its watches back (the first request naming
 * the holder's node) until the holder has released. */
TU_TEST_IN(zk, parked_count_ended_by_the_watch_replies_holds, 60)
{
    (void)zk_url(); /* the server started */
    struct tu_relay r;
    tu_relay_start(&r, zk_srv.s[0].port, TU_RELAY_PASS);
    char *relayed = tu_fmt("zk://127.0.0.1:%d?lease=60s", r.port);
    dlock_client *c, *other = zk_client();
    ck_assert_int_eq(dlock_open(relayed, &c), DLOCK_OK);
    dlock_lock *rival, *l = owned(c, "r");
    ck_assert_int_eq(dlock_lock_new(other, "r", DLOCK_EXCLUSIVE, 0, &rival), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(rival, DLOCK_TRY), DLOCK_OK);
    dlock_info *info;
    ck_assert_int_eq(dlock_inspect(other, "r", &info), DLOCK_OK);
    ck_assert_uint_eq(dlock_info_holder_count(info), 1);
    char *holder = tu_fmt("%s", dlock_info_holder(info, 0, NULL));
    holder[strcspn(holder, " ")] = 0; /* the node's name, without " (dlock pid@host)" */
    dlock_info_free(info);
    tu_relay_keep_at(&r, holder);
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(l, DLOCK_FOREVER, NULL, on_done, &d), DLOCK_OK);
    for (int i = 0; i < 2000 && atomic_load(&r.kept) == 0; i++)
        tu_sleep_ms(10);
    ck_assert_msg(atomic_load(&r.kept) == 1, "no watch on node %s within 20 s", holder);
    ck_assert_int_eq(dlock_release(rival), DLOCK_OK);
    tu_relay_let_kept(&r);
    ck_assert_msg(pump_until(c, &d.n, 1, 20000), "not handed the lock within 20 s");
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_int_eq(dlock_acquire(rival, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    dlock_lock_free(rival);
    dlock_client_close(c);
    dlock_client_close(other);
    tu_relay_stop(&r);
    free(relayed);
    free(holder);
}

/* Two parked waiters (on two clients) are served in the order they
 * queued, each woken by its own predecessor's deletion. */
TU_TEST_IN(zk, parked_waiters_served_in_order, 60)
{
    struct contended x;
    contended_open(&x, zk_url(), "q", true);
    dlock_client *c2 = zk_client();
    dlock_lock *first = owned(x.c, "q"), *second = owned(c2, "q");
    struct done_log d1 = {0}, d2 = {0};
    ck_assert_int_eq(dlock_acquire_async(first, DLOCK_FOREVER, NULL, on_done, &d1), DLOCK_OK);
    zk_queued(x.other, "q", 1);
    ck_assert_int_eq(dlock_acquire_async(second, DLOCK_FOREVER, NULL, on_done, &d2), DLOCK_OK);
    zk_queued(x.other, "q", 2);
    ck_assert_int_eq(dlock_release(x.rival), DLOCK_OK);
    ck_assert(pump_until(x.c, &d1.n, 1, 20000));
    ck_assert_msg(d1.rc[0] == DLOCK_OK, "%d: %s", d1.rc[0], d1.msg[0]);
    ck_assert(!pump_until(c2, &d2.n, 1, 300)); /* still behind the first */
    uint64_t t1, t2;
    ck_assert_int_eq(dlock_token(first, &t1), DLOCK_OK);
    ck_assert_int_eq(dlock_release(first), DLOCK_OK);
    ck_assert(pump_until(c2, &d2.n, 1, 20000));
    ck_assert_msg(d2.rc[0] == DLOCK_OK, "%d: %s", d2.rc[0], d2.msg[0]);
    ck_assert_int_eq(dlock_token(second, &t2), DLOCK_OK);
    ck_assert_uint_gt(t2, t1);
    ck_assert_int_eq(dlock_release(second), DLOCK_OK);
    dlock_lock_free(first);
    dlock_lock_free(second);
    dlock_client_close(c2);
    contended_close(&x);
}

/* The wait's bound: DLOCK_ETIMEDOUT, not before it, naming the lock; the
 * waiter's node is given back (the queue is empty again). */
TU_TEST_IN(zk, wait_bound_gives_the_place_back, 60)
{
    struct contended x;
    contended_open(&x, zk_url(), "b", true);
    dlock_lock *l = owned(x.c, "b");
    struct done_log d = {0};
    int64_t t0 = tu_mono_ms();
    ck_assert_int_eq(dlock_acquire_async(l, 300, NULL, on_done, &d), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 1, 20000));
    ck_assert_int_ge(tu_mono_ms() - t0, 300);
    ck_assert_msg(d.rc[0] == DLOCK_ETIMEDOUT, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_ptr_nonnull(strstr(d.msg[0], "'b'"));
    ck_assert_uint_eq(dlock_hold_count(l), 0);
    zk_queued(x.other, "b", 0);
    dlock_lock_free(l);
    contended_close(&x);
}

/* Parked waits canceled by dlock_lock_cancel() and by a cancel object:
 * DLOCK_ECANCELED each, their nodes given back. */
TU_TEST_IN(zk, parked_waits_canceled_give_their_place_back, 60)
{
    struct contended x;
    contended_open(&x, zk_url(), "k", true);
    dlock_lock *rival2;
    ck_assert_int_eq(dlock_lock_new(x.other, "k2", DLOCK_EXCLUSIVE, 0, &rival2), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(rival2, DLOCK_TRY), DLOCK_OK);
    dlock_lock *l = owned(x.c, "k"), *l2 = owned(x.c, "k2");
    dlock_cancel *k;
    ck_assert_int_eq(dlock_cancel_new(&k), DLOCK_OK);
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(l, DLOCK_FOREVER, NULL, on_done, &d), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire_async(l2, DLOCK_FOREVER, k, on_done, &d), DLOCK_OK);
    zk_queued(x.other, "k", 1);
    zk_queued(x.other, "k2", 1);
    ck_assert_int_eq(dlock_lock_cancel(l), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 1, 20000));
    ck_assert_ptr_eq(d.l[0], l);
    ck_assert_int_eq(d.rc[0], DLOCK_ECANCELED);
    ck_assert_int_eq(dlock_cancel_fire(k), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 2, 20000));
    ck_assert_ptr_eq(d.l[1], l2);
    ck_assert_int_eq(d.rc[1], DLOCK_ECANCELED);
    zk_queued(x.other, "k", 0);
    zk_queued(x.other, "k2", 0);
    ck_assert_int_eq(dlock_release(x.rival), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire_async(l, DLOCK_TRY, NULL, on_done, &d), DLOCK_OK);
    ck_assert(pump_until(x.c, &d.n, 3, 20000));
    ck_assert_int_eq(d.rc[2], DLOCK_OK);
    dlock_lock_free(l);
    dlock_lock_free(l2);
    dlock_lock_free(rival2);
    dlock_cancel_free(k);
    contended_close(&x);
}

/* Shared holds: a reader elsewhere lets an asynchronous reader in at
 * once; an asynchronous writer (its own client) parks until both went. */
TU_TEST_IN(zk, readers_share_while_a_writer_parks, 60)
{
    struct contended x;
    x.c = zk_client();
    x.other = zk_client();
    dlock_client *wc = zk_client();
    ck_assert_int_eq(dlock_lock_new(x.other, "rw", DLOCK_SHARED, 0, &x.rival), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(x.rival, DLOCK_TRY), DLOCK_OK);
    dlock_lock *reader, *writer = owned(wc, "rw");
    ck_assert_int_eq(dlock_lock_new(x.c, "rw", DLOCK_SHARED, DLOCK_LOCK_HANDLE_OWNED, &reader),
                     DLOCK_OK);
    struct done_log dr = {0}, dw = {0};
    ck_assert_int_eq(dlock_acquire_async(reader, 20000, NULL, on_done, &dr), DLOCK_OK);
    ck_assert(pump_until(x.c, &dr.n, 1, 20000));
    ck_assert_msg(dr.rc[0] == DLOCK_OK, "%d: %s", dr.rc[0], dr.msg[0]);
    ck_assert_int_eq(dlock_acquire_async(writer, 30000, NULL, on_done, &dw), DLOCK_OK);
    zk_queued(x.other, "rw", 1);
    ck_assert(!pump_until(wc, &dw.n, 1, 300)); /* two readers hold */
    ck_assert_int_eq(dlock_release(x.rival), DLOCK_OK);
    ck_assert(!pump_until(wc, &dw.n, 1, 300)); /* one reader still holds */
    ck_assert_int_eq(dlock_release(reader), DLOCK_OK);
    ck_assert(pump_until(wc, &dw.n, 1, 20000));
    ck_assert_msg(dw.rc[0] == DLOCK_OK, "%d: %s", dw.rc[0], dw.msg[0]);
    ck_assert_int_eq(dlock_acquire(x.rival, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_int_eq(dlock_release(writer), DLOCK_OK);
    dlock_lock_free(reader);
    dlock_lock_free(writer);
    dlock_client_close(wc);
    contended_close(&x);
}

/* Readers parked behind a writer (each its own client, each waiting for
 * the writer's node alone): its release hands the lock to both at once. */
TU_TEST_IN(zk, parked_readers_share_once_the_writer_goes, 60)
{
    struct contended x;
    contended_open(&x, zk_url(), "rd", true);
    dlock_client *c2 = zk_client();
    dlock_lock *r1, *r2;
    ck_assert_int_eq(dlock_lock_new(x.c, "rd", DLOCK_SHARED, DLOCK_LOCK_HANDLE_OWNED, &r1),
                     DLOCK_OK);
    ck_assert_int_eq(dlock_lock_new(c2, "rd", DLOCK_SHARED, DLOCK_LOCK_HANDLE_OWNED, &r2),
                     DLOCK_OK);
    struct done_log d1 = {0}, d2 = {0};
    ck_assert_int_eq(dlock_acquire_async(r1, DLOCK_FOREVER, NULL, on_done, &d1), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire_async(r2, DLOCK_FOREVER, NULL, on_done, &d2), DLOCK_OK);
    zk_queued(x.other, "rd", 2);
    ck_assert(!pump_until(x.c, &d1.n, 1, 300)); /* the writer holds */
    ck_assert_int_eq(dlock_release(x.rival), DLOCK_OK);
    ck_assert(pump_until(x.c, &d1.n, 1, 20000));
    ck_assert(pump_until(c2, &d2.n, 1, 20000));
    ck_assert_msg(d1.rc[0] == DLOCK_OK && d2.rc[0] == DLOCK_OK, "%d: %s; %d: %s", d1.rc[0],
                  d1.msg[0], d2.rc[0], d2.msg[0]);
    ck_assert_uint_eq(dlock_hold_count(r1), 1);
    ck_assert_uint_eq(dlock_hold_count(r2), 1);
    ck_assert_int_eq(dlock_acquire(x.rival, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_int_eq(dlock_release(r1), DLOCK_OK);
    ck_assert_int_eq(dlock_release(r2), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(x.rival, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_release(x.rival), DLOCK_OK);
    dlock_lock_free(r1);
    dlock_lock_free(r2);
    dlock_client_close(c2);
    contended_close(&x);
}

#define ZK_PARKED 40

/* Close with acquires parked (one client, ZK_PARKED names held by another
 * client): each completes exactly once, during the close, with
 * DLOCK_ECANCELED, and the waiters held no thread meanwhile. */
TU_TEST_IN(zk, close_ends_parked_waiters_once_few_threads, 60)
{
    dlock_client *c = zk_client(), *other = zk_client();
    dlock_lock *rivals[ZK_PARKED], *ls[ZK_PARKED];
    char names[ZK_PARKED][16];
    for (int i = 0; i < ZK_PARKED; i++) {
        snprintf(names[i], sizeof names[i], "c%d", i);
        ck_assert_int_eq(dlock_lock_new(other, names[i], DLOCK_EXCLUSIVE, 0, &rivals[i]), DLOCK_OK);
        ck_assert_int_eq(dlock_acquire(rivals[i], DLOCK_TRY), DLOCK_OK);
        ls[i] = owned(c, names[i]);
    }
    struct done_log d = {0};
    ck_assert_int_eq(dlock_acquire_async(ls[0], DLOCK_FOREVER, NULL, on_done, &d), DLOCK_OK);
    zk_queued(other, names[0], 1); /* the pool and the timer run now */
    int before = threads_now();
    for (int i = 1; i < ZK_PARKED; i++)
        ck_assert_int_eq(dlock_acquire_async(ls[i], DLOCK_FOREVER, NULL, on_done, &d), DLOCK_OK);
    for (int i = 1; i < ZK_PARKED; i++)
        zk_queued(other, names[i], 1);
    ck_assert(!pump_until(c, &d.n, 1, 300));
    int during = threads_now();
    /* the pool may grow while a loaded machine keeps its two threads in
     * requests, but never by a thread per waiter */
    ck_assert_msg(during - before <= 4, "%d threads before, %d with %d waiters parked", before,
                  during, ZK_PARKED);
    dlock_client_close(c);
    ck_assert_int_eq(d.n, ZK_PARKED);
    for (int i = 0; i < ZK_PARKED; i++) {
        ck_assert_msg(d.rc[i] == DLOCK_ECANCELED, "%d: %s", d.rc[i], d.msg[i]);
        for (int j = 0; j < i; j++)
            ck_assert_ptr_ne(d.l[i], d.l[j]);
    }
    for (int i = 0; i < ZK_PARKED; i++)
        dlock_lock_free(ls[i]);
    ck_assert_int_eq(d.n, ZK_PARKED);
    for (int i = 0; i < ZK_PARKED; i++) {
        ck_assert_int_eq(dlock_release(rivals[i]), DLOCK_OK);
        dlock_lock_free(rivals[i]);
    }
    dlock_client_close(other);
}

/* Two asynchronous waiters (two clients) and a blocking one on one name:
 * never two holders at once, each served every turn. */
TU_TEST_IN(zk, excludes_async_and_blocking_holders, 90)
{
    dlock_client *cs[2] = {zk_client(), zk_client()};
    struct blocking_turns b = {zk_url(), 10, 0, 0};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, blocking_main, &b), 0);
    int idle = 0;
    struct async_turns t[2] = {{.l = owned(cs[0], "x"), .left = 10},
                               {.l = owned(cs[1], "x"), .left = 10}};
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(dlock_acquire_async(t[i].l, 20000, NULL, turn_acquired, &t[i]), DLOCK_OK);
    int64_t end = tu_mono_ms() + 80000;
    while (!(t[0].done && t[1].done) && tu_mono_ms() < end)
        for (int i = 0; i < 2; i++)
            pump_until(cs[i], &idle, 1, 50);
    pthread_join(th, NULL);
    ck_assert_int_eq(b.rc, DLOCK_OK);
    ck_assert_int_eq(b.bad, 0);
    ck_assert(t[0].done && t[1].done);
    ck_assert_msg(t[0].bad + t[1].bad == 0, "%d, %d bad turns (%s%s)", t[0].bad, t[1].bad, t[0].why,
                  t[1].why);
    for (int i = 0; i < 2; i++) {
        dlock_lock_free(t[i].l);
        dlock_client_close(cs[i]);
    }
}
/* A parked permit waiter (both permits of "zp" held on another client:
 * it takes the Curator mutex, makes its lease and watches the leases)
 * sends nothing while it waits; the child watch brings the release,
 * which hands it the permit. Before: DLOCK_ENOTSUP at the start. */
TU_TEST_IN(zk, zk_parked_permit_waiter_woken_by_the_watch, 60)
{
    dlock_client *c = zk_client(), *other = zk_client();
    dlock_semaphore *s, *so;
    ck_assert_int_eq(dlock_semaphore_new(c, "zp", 2, 0, &s), DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_new(other, "zp", 2, 0, &so), DLOCK_OK);
    dlock_permit *held[2];
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(dlock_semaphore_acquire(so, 1, DLOCK_TRY, NULL, &held[i]), DLOCK_OK);
    struct permit_log d = {0};
    ck_assert_int_eq(dlock_semaphore_acquire_async(s, 1, DLOCK_FOREVER, NULL, on_permit_done, &d),
                     DLOCK_OK);
    ck_assert_msg(!pump_until(c, &d.n, 1, 1000), "%d: %s", d.rc[0], d.msg[0]); /* parked */
    long before = zk_received();
    ck_assert(!pump_until(c, &d.n, 1, 2000));
    long during = zk_received() - before;
    /* a poll of even 200 ms would be 10 requests; pings are one per
     * 20 s at most per session */
    ck_assert_msg(during <= 6, "%ld requests while one permit waiter was parked for 2 s", during);
    ck_assert_int_eq(dlock_permit_release(held[0]), DLOCK_OK);
    ck_assert(pump_until(c, &d.n, 1, 20000));
    ck_assert_msg(d.rc[0] == DLOCK_OK, "%d: %s", d.rc[0], d.msg[0]);
    ck_assert_int_eq(dlock_permit_release(d.p[0]), DLOCK_OK);
    ck_assert_int_eq(dlock_permit_release(held[1]), DLOCK_OK);
    dlock_semaphore_free(s);
    dlock_semaphore_free(so);
    dlock_client_close(c);
    dlock_client_close(other);
}
#endif

int main(void)
{
    return tu_main("async", setup, teardown);
}
