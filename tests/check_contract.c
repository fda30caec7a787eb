/* check_contract.c -- the lock contract of docs/architecture.md, written once and
 * run against every backend and URL form: file, redis (Redisson layout),
 * redis ?layout=simple, etcd and ZooKeeper.
 *
 * Each backend is one test case whose unchecked fixture starts its server
 * once, in the runner, before the tests fork (tests/lib/contract.h); every
 * test then runs in its own process with its own key prefix
 * (?prefix=t<pid>-), so tests never see each other's locks. Where a
 * backend documents a difference (no lease on file, no shared mode or
 * fixed lease on some network backends), the case asserts that
 * difference. Tests wait on conditions -- a waiter the backend can see, a
 * marker file a child writes, a callback -- never on a fixed sleep, and
 * never assert on time. The per-backend files keep what only that backend
 * has: wire interop with other clients and protocol faults.
 *
 * DLOCK_TEST=<substring or glob of "backend/test"> runs a subset, e.g.
 * DLOCK_TEST=cancel (every backend), DLOCK_TEST=zk/ (every zk test).
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "contract.h"
#include "dlock.h"
#include "testutil.h"

static bool has(unsigned cap)
{
    return (CT->caps & cap) != 0;
}

/* ------------------------------------------------------------- helpers */

static uint64_t token_of(dlock_lock *l)
{
    uint64_t t = 0;
    EXPECT_RC(dlock_token(l, &t), DLOCK_OK);
    return t;
}

/* Wait until the backend sees a waiter on NAME (asked through C): true,
 * or false when the backend cannot tell. Fails the test when a waiter
 * never shows up. */
static bool wait_for_waiter(dlock_client *c, const char *name)
{
    for (int i = 0; i < 2000; i++) {
        long n = CT->waiters(CT, c, ct_prefix, name);
        if (n < 0)
            return false;
        if (n > 0)
            return true;
        tu_sleep_ms(10);
    }
    ck_abort_msg("no waiter on '%s' ever showed up", name);
    return false;
}

/* Where the backend counts waiters exactly: wait until nothing is queued
 * on NAME any more (a wait that ended left no key, node or subscription). */
static void wait_no_waiter(dlock_client *c, const char *name)
{
    if (!has(CT_WAITERS_EXACT))
        return;
    long n = -1;
    for (int i = 0; i < 2000 && (n = CT->waiters(CT, c, ct_prefix, name)) != 0; i++)
        tu_sleep_ms(10);
    ck_assert_msg(n == 0, "%ld waiter(s) left behind on '%s'", n, name);
}

/* Two clients of this test (their EXTRA options) with a handle each on
 * NAME: the frame of most tests of one client against another
 * (tu_pair_close() ends it). */
static struct tu_pair pair_open(const char *a_extra, const char *b_extra, const char *name)
{
    dlock_client *a = ct_open_test(a_extra);
    return tu_pair_of(a, ct_open_test(b_extra), name);
}

/* ============================================== acquire, release, token */

TU_TEST(acquire_release_token, 60)
{
    dlock_client *c = ct_open_test("lease=5s");
    dlock_lock *l = tu_lock(c, "basic");
    uint64_t t;
    EXPECT_RC(dlock_token(l, &t), DLOCK_ENOTOWNER);
    EXPECT_RC(dlock_release(l), DLOCK_ENOTOWNER);
    ck_assert_uint_eq(dlock_hold_count(l), 0);
    ck_assert_int_lt(dlock_validity_ms(l), 0);

    TU_ACQUIRE_OK(l, DLOCK_TRY);
    ck_assert_uint_eq(dlock_hold_count(l), 1);
    uint64_t t1 = token_of(l);
    ck_assert_uint_gt(t1, 0);
    int64_t v = dlock_validity_ms(l);
    if (has(CT_LEASES))
        ck_assert_msg(v > 0 && v <= 5000, "validity %" PRId64 " ms of a 5 s lease", v);
    else
        ck_assert_msg(v == DLOCK_VALID_FOREVER, "validity %" PRId64 " without a lease", v);
    EXPECT_RC(dlock_release(l), DLOCK_OK);
    ck_assert_int_lt(dlock_validity_ms(l), 0);
    EXPECT_RC(dlock_release(l), DLOCK_ENOTOWNER);

    /* Every new acquisition, by this client or others, a greater token. */
    TU_ACQUIRE_OK(l, 1000);
    uint64_t last = token_of(l);
    ck_assert_uint_gt(last, t1);
    EXPECT_RC(dlock_release(l), DLOCK_OK);
    for (int i = 0; i < 3; i++) {
        dlock_client *c2 = ct_open_test(NULL);
        last = tu_next_token(c2, "basic", last);
        dlock_client_close(c2);
    }
    dlock_info *info = NULL;
    EXPECT_RC(dlock_inspect(c, "basic", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_held(info), 0);
    dlock_info_free(info);
    ck_assert_str_eq(dlock_lock_name(l), "basic");
    ck_assert_int_eq(dlock_lock_mode(l), DLOCK_EXCLUSIVE);
    dlock_lock_free(l);
    dlock_client_close(c);
}

TU_TEST(reentrancy, 30)
{
    dlock_client *c = ct_open_test(NULL), *c2 = ct_open_test(NULL);
    dlock_lock *l = tu_lock(c, "re"), *again = tu_lock(c, "re"), *other = tu_lock(c2, "re");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    uint64_t t1 = token_of(l);
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    TU_ACQUIRE_OK(again, DLOCK_TRY); /* same thread, another handle */
    ck_assert_uint_eq(dlock_hold_count(l), 3);
    ck_assert_uint_eq(token_of(again), t1); /* a re-entry keeps the token */
    EXPECT_RC(dlock_acquire(other, DLOCK_TRY), DLOCK_EBUSY);
    EXPECT_RC(dlock_release(l), DLOCK_OK);
    EXPECT_RC(dlock_release(again), DLOCK_OK);
    ck_assert_uint_eq(dlock_hold_count(l), 1);
    EXPECT_RC(dlock_acquire(other, DLOCK_TRY), DLOCK_EBUSY); /* as many releases */
    EXPECT_RC(dlock_release(l), DLOCK_OK);
    ck_assert_uint_eq(dlock_hold_count(l), 0);
    EXPECT_RC(dlock_release(l), DLOCK_ENOTOWNER);
    TU_ACQUIRE_OK(other, DLOCK_TRY);
    ck_assert_uint_gt(token_of(other), t1);
    EXPECT_RC(dlock_release(other), DLOCK_OK);
    TU_FREE_LOCKS(other, again, l);
    TU_CLOSE_CLIENTS(c2, c);
}

/* Shared mode where supported; DLOCK_ENOTSUP, with a message, elsewhere. */
TU_TEST(shared_mode, 30)
{
    dlock_client *c = ct_open_test(NULL), *c2 = ct_open_test(NULL);
    if (!has(CT_SHARED)) {
        dlock_lock *s = NULL;
        int rc = dlock_lock_new(c, "shared", DLOCK_SHARED, 0, &s);
        if (rc == DLOCK_OK)
            rc = dlock_acquire(s, DLOCK_TRY);
        ck_assert_msg(rc == DLOCK_ENOTSUP, "shared mode on %s: %s", CT->name, dlock_err_name(rc));
        ck_assert_msg(strstr(dlock_errmsg(), "shared"), "message: %s", dlock_errmsg());
        dlock_lock_free(s);
        TU_CLOSE_CLIENTS(c2, c);
        return;
    }
    dlock_lock *r1 = tu_lock_mode(c, "rw", DLOCK_SHARED, 0), *r2 = tu_lock_mode(c2, "rw", DLOCK_SHARED, 0);
    dlock_lock *w = tu_lock(c2, "rw"), *w_same_thread = tu_lock(c, "rw");
    TU_ACQUIRE_OK(r1, DLOCK_TRY);
    TU_ACQUIRE_OK(r2, DLOCK_TRY);
    ck_assert_int_eq(dlock_lock_mode(r1), DLOCK_SHARED);
    EXPECT_RC(dlock_acquire(w_same_thread, DLOCK_TRY), DLOCK_EMISUSE); /* other mode */
    struct tu_waiter rt;
    tu_waiter_start(&rt, r1, DLOCK_TRY); /* another thread: one more reader */
    tu_waiter_join(&rt);
    ck_assert_msg(rt.rc == DLOCK_OK, "second reader thread: %s", dlock_err_name(rt.rc));
    struct tu_waiter wr;
    tu_waiter_start(&wr, w, 100);
    tu_waiter_join(&wr);
    ck_assert_int_eq(wr.rc, DLOCK_ETIMEDOUT); /* no writer among readers */
    dlock_info *info = NULL;
    EXPECT_RC(dlock_inspect(c, "rw", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_held(info), 1);
    ck_assert_int_eq(dlock_info_mode(info), DLOCK_SHARED);
    dlock_info_free(info);
    EXPECT_RC(dlock_release(r1), DLOCK_OK);
    EXPECT_RC(dlock_release(r2), DLOCK_OK);
    TU_ACQUIRE_OK(w, DLOCK_TRY);
    EXPECT_RC(dlock_acquire(r1, DLOCK_TRY), DLOCK_EBUSY); /* no reader under a writer */
    EXPECT_RC(dlock_release(w), DLOCK_OK);
    /* Holding exclusive, a shared acquire re-enters the exclusive hold. */
    TU_ACQUIRE_OK(w_same_thread, DLOCK_TRY);
    TU_ACQUIRE_OK(r1, DLOCK_TRY);
    ck_assert_uint_eq(dlock_hold_count(w_same_thread), 2);
    EXPECT_RC(dlock_acquire(r2, DLOCK_TRY), DLOCK_EBUSY); /* still exclusive */
    EXPECT_RC(dlock_release(r1), DLOCK_OK);
    EXPECT_RC(dlock_release(w_same_thread), DLOCK_OK);
    /* a wait, not a try: the writer that timed out above may still be
     * recorded as waiting (Redis: its unwait is owed to the keeper) */
    tu_acquire_release(r2, 10000);
    TU_FREE_LOCKS(w_same_thread, w, r2, r1);
    TU_CLOSE_CLIENTS(c2, c);
}

/* Downgrade (dlock.h "Modes and owners"): holding exclusive, the owner
 * takes shared levels too; releasing its last exclusive level leaves a
 * shared hold with those levels, never a moment unlocked: a writer
 * waiting meanwhile stays out until the reader leaves, and other readers
 * come in. Holding shared again, exclusive is an upgrade: refused. */
TU_TEST(shared_downgrade, 30)
{
    if (!has(CT_SHARED))
        return; /* shared_mode asserts DLOCK_ENOTSUP */
    struct tu_pair p = pair_open(NULL, NULL, "down"); /* la: a's writer, lb: b's writer */
    dlock_lock *ra = tu_lock_mode(p.a, "down", DLOCK_SHARED, 0);
    dlock_lock *rb = tu_lock_mode(p.b, "down", DLOCK_SHARED, 0);
    TU_ACQUIRE_OK(p.la, DLOCK_TRY);
    uint64_t t = token_of(p.la);
    TU_ACQUIRE_OK(ra, DLOCK_TRY);
    TU_ACQUIRE_OK(ra, DLOCK_TRY);
    ck_assert_uint_eq(dlock_hold_count(ra), 3);
    struct tu_waiter wb;
    tu_waiter_start(&wb, p.lb, DLOCK_FOREVER); /* a writer waits through the downgrade */
    wait_for_waiter(p.a, "down");
    EXPECT_RC(dlock_release(p.la), DLOCK_OK); /* the last write level: 2 read levels stay */
    ck_assert_uint_eq(dlock_hold_count(ra), 2);
    ck_assert_uint_eq(token_of(ra), t); /* the same hold, not a new acquisition */
    dlock_info *info = NULL;
    EXPECT_RC(dlock_inspect(p.b, "down", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_held(info), 1);
    ck_assert_int_eq(dlock_info_mode(info), DLOCK_SHARED);
    dlock_info_free(info);
    ck_assert_msg(wb.rc == 1, "the waiting writer got in across the downgrade: %s",
                  dlock_err_name(wb.rc));
    EXPECT_RC(dlock_acquire(p.la, DLOCK_TRY), DLOCK_EMISUSE); /* now an upgrade */
    EXPECT_RC(dlock_release(ra), DLOCK_OK);
    EXPECT_RC(dlock_release(ra), DLOCK_OK); /* the read hold ends: the writer goes */
    tu_waiter_join(&wb);
    EXPECT_RC(wb.rc, DLOCK_OK);
    ck_assert_uint_gt(wb.token, t);
    /* Without a waiting writer, the downgraded reader lets readers in. */
    TU_ACQUIRE_OK(p.la, DLOCK_TRY);
    TU_ACQUIRE_OK(ra, DLOCK_TRY);
    EXPECT_RC(dlock_acquire(rb, DLOCK_TRY), DLOCK_EBUSY);
    EXPECT_RC(dlock_release(p.la), DLOCK_OK);
    TU_ACQUIRE_OK(rb, 10000); /* woken by the downgrade, or tried at once */
    tu_waiter_start(&wb, p.lb, DLOCK_TRY); /* b's thread holds rb: try from another */
    tu_waiter_join(&wb);
    EXPECT_RC(wb.rc, DLOCK_EBUSY);
    EXPECT_RC(dlock_release(rb), DLOCK_OK);
    EXPECT_RC(dlock_release(ra), DLOCK_OK);
    tu_acquire_release(p.lb, DLOCK_TRY);
    /* Read levels released first: no downgrade, the write level stays. */
    TU_ACQUIRE_OK(p.la, DLOCK_TRY);
    tu_acquire_release(ra, DLOCK_TRY);
    EXPECT_RC(dlock_acquire(rb, DLOCK_TRY), DLOCK_EBUSY);
    EXPECT_RC(dlock_release(p.la), DLOCK_OK);
    EXPECT_RC(dlock_release(p.la), DLOCK_ENOTOWNER);
    tu_acquire_release(p.lb, DLOCK_TRY);
    TU_FREE_LOCKS(rb, ra);
    tu_pair_close(&p);
}

/* Two readers, each its own client, hand the read lock to each other so
 * that it is never free: each releases only once the other holds it, or
 * once the other's try found it busy. A writer that starts waiting
 * meanwhile must get in: new readers queue behind it, the holder hands
 * over to nobody, and the writer takes the lock. A layout that lets
 * readers overtake a waiting writer hangs here (the test's time limit). */
struct relay {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    bool holds[2], blocked[2];
    long rounds;
    int rc; /* the first failure of a reader */
    dlock_lock *l[2];
    pthread_t th[2];
};

struct relay_arg {
    struct relay *r;
    int i;
};

static void *relay_main(void *p)
{
    struct relay_arg *a = p;
    struct relay *r = a->r;
    int i = a->i;
    pthread_mutex_lock(&r->mu);
    while (!r->stop && !r->rc) {
        pthread_mutex_unlock(&r->mu);
        int rc = dlock_acquire(r->l[i], DLOCK_TRY);
        if (rc == DLOCK_EBUSY) {
            pthread_mutex_lock(&r->mu);
            r->blocked[i] = true;
            pthread_cond_broadcast(&r->cv);
            pthread_mutex_unlock(&r->mu);
            rc = dlock_acquire(r->l[i], DLOCK_FOREVER);
        }
        pthread_mutex_lock(&r->mu);
        if (rc) {
            r->rc = rc;
            break;
        }
        r->holds[i] = true;
        r->blocked[i] = false;
        r->rounds++;
        pthread_cond_broadcast(&r->cv);
        while (!r->stop && !r->holds[!i] && !r->blocked[!i])
            pthread_cond_wait(&r->cv, &r->mu);
        r->holds[i] = false;
        pthread_mutex_unlock(&r->mu);
        rc = dlock_release(r->l[i]);
        pthread_mutex_lock(&r->mu);
        if (rc)
            r->rc = rc;
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

TU_TEST(shared_writer_not_starved, 60)
{
    if (!has(CT_SHARED))
        return;
    dlock_client *c[2] = {ct_open_test(NULL), ct_open_test(NULL)};
    struct tu_pair p = pair_open(NULL, NULL, "starve");
    struct relay r = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    struct relay_arg args[2];
    for (int i = 0; i < 2; i++) {
        r.l[i] = tu_lock_mode(c[i], "starve", DLOCK_SHARED, 0);
        args[i] = (struct relay_arg){&r, i};
        ck_assert_int_eq(pthread_create(&r.th[i], NULL, relay_main, &args[i]), 0);
    }
    pthread_mutex_lock(&r.mu);
    while (r.rounds < 6 && !r.rc)
        pthread_cond_wait(&r.cv, &r.mu); /* the relay runs: never free */
    pthread_mutex_unlock(&r.mu);
    TU_ACQUIRE_OK(p.la, DLOCK_FOREVER); /* the writer, among arriving readers */
    pthread_mutex_lock(&r.mu);
    bool reader_in = r.holds[0] || r.holds[1];
    long rounds = r.rounds;
    r.stop = true;
    pthread_cond_broadcast(&r.cv);
    pthread_mutex_unlock(&r.mu);
    ck_assert_msg(!reader_in, "a reader holds beside the writer");
    EXPECT_RC(dlock_acquire(p.lb, DLOCK_TRY), DLOCK_EBUSY);
    EXPECT_RC(dlock_release(p.la), DLOCK_OK);
    for (int i = 0; i < 2; i++)
        pthread_join(r.th[i], NULL);
    ck_assert_msg(r.rc == 0, "a reader failed: %s", dlock_err_name(r.rc));
    ck_assert_int_ge(rounds, 6);
    for (int i = 0; i < 2; i++) {
        dlock_lock_free(r.l[i]);
        dlock_client_close(c[i]);
    }
    tu_pair_close(&p);
}

/* A reader among a stream of writers: two writers take turns, each
 * releasing only once the other waits, so a writer always waits; then a
 * reader asks. etcd and ZooKeeper queue everyone in arrival order: the
 * reader gets in once the writers queued before it had their turn --
 * asserted (CT_READERS_BOUNDED): within READER_BOUND writer sections of
 * the backend seeing it wait. The file backend, redis and Redlock keep
 * new readers out while a writer waits (so that readers cannot starve
 * writers), and with one always waiting the reader may wait as long as
 * the stream lasts (dlock.h, docs/backends.md): measured and printed,
 * and the reader must get in once the writers stop. */
#define READER_BOUND 3
#define READER_PATIENCE 30 /* writer sections watched before giving up */

struct lone_reader {
    struct relay *r;
    dlock_lock *l;
    bool done;
    int rc;
    long in_at; /* the writers' rounds when it got in */
};

/* Wait on CV (MU held) for at most MS milliseconds. */
static void cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, long ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(cv, mu, &ts);
}

static void *lone_reader_main(void *arg)
{
    struct lone_reader *a = arg;
    int rc = dlock_acquire(a->l, DLOCK_FOREVER);
    pthread_mutex_lock(&a->r->mu);
    a->in_at = a->r->rounds;
    a->rc = rc;
    a->done = true;
    pthread_cond_broadcast(&a->r->cv);
    pthread_mutex_unlock(&a->r->mu);
    if (!rc)
        EXPECT_RC(dlock_release(a->l), DLOCK_OK);
    return NULL;
}

TU_TEST(shared_reader_among_writers, 120)
{
    if (!has(CT_SHARED))
        return;
    dlock_client *c[3] = {ct_open_test(NULL), ct_open_test(NULL), ct_open_test(NULL)};
    struct relay r = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    struct relay_arg args[2];
    for (int i = 0; i < 2; i++) {
        r.l[i] = tu_lock(c[i], "rstream");
        args[i] = (struct relay_arg){&r, i};
        ck_assert_int_eq(pthread_create(&r.th[i], NULL, relay_main, &args[i]), 0);
    }
    pthread_mutex_lock(&r.mu);
    while (r.rounds < 4 && !r.rc)
        pthread_cond_wait(&r.cv, &r.mu); /* the writers' stream runs */
    pthread_mutex_unlock(&r.mu);
    struct lone_reader rd = {&r, tu_lock_mode(c[2], "rstream", DLOCK_SHARED, 0), false, 0, 0};
    pthread_t rt;
    ck_assert_int_eq(pthread_create(&rt, NULL, lone_reader_main, &rd), 0);
    if (has(CT_WAITERS_EXACT)) /* queued: besides it, at most one writer waits */
        for (int k = 0; k < 3000 && CT->waiters(CT, c[2], ct_prefix, "rstream") < 2; k++) {
            pthread_mutex_lock(&r.mu);
            bool in = rd.done;
            pthread_mutex_unlock(&r.mu);
            if (in)
                break;
            tu_sleep_ms(10);
        }
    pthread_mutex_lock(&r.mu);
    long from = r.rounds;
    int64_t until = tu_mono_ms() + 60000;
    while (!rd.done && !r.rc && r.rounds - from <= READER_PATIENCE && tu_mono_ms() < until)
        cond_wait_ms(&r.cv, &r.mu, 100);
    bool in = rd.done;
    long sections = in ? (rd.in_at > from ? rd.in_at - from : 0) : r.rounds - from;
    r.stop = true;
    pthread_cond_broadcast(&r.cv);
    pthread_mutex_unlock(&r.mu);
    for (int i = 0; i < 2; i++)
        pthread_join(r.th[i], NULL);
    pthread_join(rt, NULL); /* (the writers stopped: it gets in now) */
    fprintf(stderr, "%s: a reader behind a stream of writers %s %ld writer section(s)\n", CT->name,
            in ? "got in after" : "still waited after", sections);
    ck_assert_msg(r.rc == 0, "a writer failed: %s", dlock_err_name(r.rc));
    ck_assert_msg(rd.rc == 0, "the reader failed: %s", dlock_err_name(rd.rc));
    if (has(CT_READERS_BOUNDED))
        ck_assert_msg(in && sections <= READER_BOUND,
                      "%s: the reader %s %ld writer sections after it queued (the bound: %d)",
                      CT->name, in ? "got in" : "still waited", sections, READER_BOUND);
    dlock_lock_free(rd.l);
    for (int i = 0; i < 2; i++)
        dlock_lock_free(r.l[i]);
    for (int i = 0; i < 3; i++)
        dlock_client_close(c[i]);
}

/* ============================================= threads of one client */

TU_TEST(threads_exclude, 60)
{
    dlock_client *c = ct_open_test(NULL);
    dlock_lock *l = tu_lock(c, "threads");
    tu_exclusion_run(&l, 1, 4, 25, DLOCK_FOREVER);
    dlock_lock_free(l);
    dlock_client_close(c);
}

/* ================================================================ waits */

/* Try once (EBUSY), bounded (ETIMEDOUT, the code and never the time), and
 * forever, woken by the release once the backend sees the waiter. */
TU_TEST(waits, 30)
{
    struct tu_pair p = pair_open(NULL, NULL, "waits");
    TU_ACQUIRE_OK(p.la, DLOCK_TRY);
    uint64_t ta = token_of(p.la);
    EXPECT_RC(dlock_acquire(p.lb, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_msg(strstr(dlock_errmsg(), "waits"), "EBUSY message: %s", dlock_errmsg());
    EXPECT_RC(dlock_acquire(p.lb, 100), DLOCK_ETIMEDOUT);
    ck_assert_msg(strstr(dlock_errmsg(), "waits"), "ETIMEDOUT message: %s", dlock_errmsg());
    ck_assert_uint_eq(dlock_hold_count(p.lb), 0);
    wait_no_waiter(p.a, "waits"); /* neither the try nor the timed wait stays queued */
    struct tu_waiter w;
    tu_waiter_start(&w, p.lb, DLOCK_FOREVER);
    wait_for_waiter(p.a, "waits");
    EXPECT_RC(dlock_release(p.la), DLOCK_OK);
    tu_waiter_join(&w);
    ck_assert_msg(w.rc == DLOCK_OK, "waiter: %s", dlock_err_name(w.rc));
    ck_assert_uint_gt(w.token, ta);
    tu_pair_close(&p);
}

/* A 100 ms acquire against a held lock returns DLOCK_ETIMEDOUT, for a
 * waiter of another client and for another thread of the holder's. */
TU_TEST(time_bound, 30)
{
    struct tu_pair p = pair_open(NULL, NULL, "bound");
    TU_ACQUIRE_OK(p.la, DLOCK_TRY);
    for (int i = 0; i < 3; i++)
        EXPECT_RC(dlock_acquire(p.lb, 100), DLOCK_ETIMEDOUT);
    struct tu_waiter w;
    tu_waiter_start(&w, p.la, DLOCK_TRY);
    tu_waiter_join(&w);
    ck_assert_msg(w.rc == DLOCK_EBUSY, "other thread, try: %s", dlock_err_name(w.rc));
    tu_waiter_start(&w, p.la, 100);
    tu_waiter_join(&w);
    ck_assert_msg(w.rc == DLOCK_ETIMEDOUT, "other thread: %s", dlock_err_name(w.rc));
    EXPECT_RC(dlock_release(p.la), DLOCK_OK);
    tu_acquire_release(p.lb, 100);
    tu_pair_close(&p);
}

/* Bounded waits of 1 to 20 ms against a held lock, on a fresh name each
 * time (so some end while their first request is still on its way) and
 * on the same one: every one ends DLOCK_ETIMEDOUT -- never a backend
 * error for a request its own deadline cut short -- for a plain handle
 * and, where the backend has them, a fair one. The code alone is
 * asserted, never the time. */
TU_TEST(tiny_waits_time_out, 120)
{
    dlock_client *a = ct_open_test(NULL), *b = ct_open_test(NULL);
    dlock_lock *same = tu_lock(a, "tiny");
    TU_ACQUIRE_OK(same, DLOCK_TRY);
    for (int fair = 0; fair <= has(CT_FAIR); fair++)
        for (int i = 0; i < 60; i++) {
            char name[32];
            snprintf(name, sizeof name, "tiny%d-%d", fair, i);
            bool fresh = i % 2;
            dlock_lock *holder = fresh ? tu_lock(a, name) : NULL;
            if (holder)
                TU_ACQUIRE_OK(holder, DLOCK_TRY);
            dlock_lock *l = tu_lock_mode(b, fresh ? name : "tiny", DLOCK_EXCLUSIVE,
                                         fair ? DLOCK_LOCK_FAIR : 0);
            int64_t wait = 1 + i % 20;
            int rc = dlock_acquire(l, wait);
            ck_assert_msg(rc == DLOCK_ETIMEDOUT, "%s wait %d of %" PRId64 " ms on '%s': %s (%s)",
                          fair ? "fair" : "plain", i, wait, dlock_lock_name(l), dlock_err_name(rc),
                          dlock_errmsg());
            TU_FREE_LOCKS(l, holder);
        }
    EXPECT_RC(dlock_release(same), DLOCK_OK);
    dlock_lock_free(same);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* A cancel from another thread ends a wait the backend sees (or, where it
 * cannot tell, a cancel repeated until the acquire returns, which only a
 * cancel that reached the wait can make it do). */
TU_TEST(cancel, 30)
{
    struct tu_pair p = pair_open(NULL, NULL, "cancel");
    TU_ACQUIRE_OK(p.la, DLOCK_TRY);
    struct tu_waiter w;
    tu_waiter_start(&w, p.lb, DLOCK_FOREVER);
    if (wait_for_waiter(p.a, "cancel")) {
        EXPECT_RC(dlock_lock_cancel(p.lb), DLOCK_OK);
        tu_waiter_join(&w);
    } else {
        tu_waiter_cancel_until_returned(&w);
    }
    ck_assert_msg(w.rc == DLOCK_ECANCELED, "waiter: %s", dlock_err_name(w.rc));
    ck_assert_uint_eq(dlock_hold_count(p.lb), 0);
    wait_no_waiter(p.a, "cancel");
    ck_assert_uint_eq(dlock_hold_count(p.la), 1); /* the holder's is untouched */
    EXPECT_RC(dlock_acquire(p.lb, DLOCK_TRY), DLOCK_EBUSY);
    EXPECT_RC(dlock_release(p.la), DLOCK_OK);
    tu_acquire_release(p.lb, DLOCK_TRY); /* a later wait is not canceled */
    tu_pair_close(&p);
}

/* Waits after a canceled one are not canceled by it: a bounded wait on
 * a held lock times out, before and after cancels, again and again (the
 * cancel eventfds of the waits that poll are pooled; a written one must
 * never be lent again). */
TU_TEST(cancel_not_carried_over, 30)
{
    struct tu_pair p = pair_open(NULL, NULL, "cancel-again");
    TU_ACQUIRE_OK(p.la, DLOCK_TRY);
    EXPECT_RC(dlock_acquire(p.lb, 100), DLOCK_ETIMEDOUT);
    for (int i = 0; i < 3; i++) {
        struct tu_waiter w;
        tu_waiter_start(&w, p.lb, DLOCK_FOREVER);
        tu_waiter_cancel_until_returned(&w);
        ck_assert_msg(w.rc == DLOCK_ECANCELED, "waiter %d: %s", i, dlock_err_name(w.rc));
        int rc = dlock_acquire(p.lb, 100);
        ck_assert_msg(rc == DLOCK_ETIMEDOUT, "the wait after cancel %d: %s (%s)", i,
                      dlock_err_name(rc), dlock_errmsg());
    }
    EXPECT_RC(dlock_release(p.la), DLOCK_OK);
    tu_acquire_release(p.lb, DLOCK_TRY);
    tu_pair_close(&p);
}

/* A child after fork() must not use its parent's client: DLOCK_EMISUSE,
 * and the parent's client goes on working. */
TU_TEST(fork_misuse, 30)
{
    dlock_client *c = ct_open_test(NULL);
    dlock_lock *l = tu_lock(c, "forked");
    pid_t pid = tu_fork();
    if (pid == 0) {
        int rc = dlock_acquire(l, DLOCK_TRY);
        _exit(rc == DLOCK_EMISUSE && strstr(dlock_errmsg(), "fork") ? 0 : 1);
    }
    ck_assert_msg(tu_wait_exit(pid) == 0, "the child could use its parent's client");
    tu_acquire_release(l, DLOCK_TRY);
    dlock_lock_free(l);
    dlock_client_close(c);
}

/* A handle and its client, for a forked child. */
struct client_handle {
    dlock_client *c;
    dlock_lock *l;
};

/* In a forked child (tu_fork_bounded): every call on the parent's handle
 * is DLOCK_EMISUSE and changes nothing, then the handle is freed and the
 * client closed. Returns 0, or a bit for each check that failed. */
static int child_frees_parents(void *arg)
{
    const struct client_handle *ch = arg;
    dlock_lock *l = ch->l;
    uint64_t t;
    int bad = 0;
    bad |= (dlock_acquire(l, DLOCK_TRY) != DLOCK_EMISUSE) << 0;
    bad |= (dlock_release(l) != DLOCK_EMISUSE) << 1;
    bad |= (dlock_token(l, &t) != DLOCK_EMISUSE) << 2;
    bad |= (dlock_validity_ms(l) != DLOCK_EMISUSE) << 3;
    bad |= (dlock_hold_count(l) != 0) << 4;
    bad |= (dlock_lock_cancel(l) != DLOCK_EMISUSE) << 5;
    bad |= (dlock_lock_on_lost(l, NULL, NULL) != DLOCK_EMISUSE) << 6;
    bad |= (dlock_lock_on_at_risk(l, 1000, NULL, NULL) != DLOCK_EMISUSE) << 7;
    bad |= (dlock_lock_on_contended(l, NULL, NULL) != DLOCK_EMISUSE) << 8;
    dlock_lock_free(l);
    dlock_client_close(ch->c);
    return bad;
}

/* A child after fork() that frees its handles and closes the client it
 * inherited (a pre-fork server, fork + cleanup + exec) ends at once, and
 * changes nothing: the client had held and released a lock, so its
 * keeper sleeps on a condition variable the child must not destroy. */
TU_TEST(fork_child_frees_and_closes, 90)
{
    dlock_client *c = ct_open_test(NULL);
    dlock_lock *l = tu_lock(c, "fc");
    tu_acquire_release(l, DLOCK_TRY);
    tu_fork_bounded(child_frees_parents, &(struct client_handle){c, l});
    tu_acquire_release(l, DLOCK_TRY); /* the parent's client still works */
    dlock_lock_free(l);
    dlock_client_close(c);
}

/* The same while the parent holds the lock, forked again and again while
 * the keeper renews a short lease (a fork may catch it mid-renewal, with
 * the client's mutex taken): the parent's hold stays, with its token,
 * seen held by another client, and is released by the parent alone. */
TU_TEST(fork_child_frees_a_held_lock, 90)
{
    dlock_client *c = ct_open_test("lease=2s"), *c2 = ct_open_test(NULL);
    dlock_lock *l = tu_lock(c, "fh"), *l2 = tu_lock(c2, "fh");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    uint64_t t = token_of(l);
    for (int i = 0; i < 20; i++) {
        tu_fork_bounded(child_frees_parents, &(struct client_handle){c, l});
        tu_sleep_ms(i * 7 % 50);
    }
    ck_assert_uint_eq(dlock_hold_count(l), 1);
    ck_assert_uint_eq(token_of(l), t);
    EXPECT_RC(dlock_acquire(l2, DLOCK_TRY), DLOCK_EBUSY);
    EXPECT_RC(dlock_release(l), DLOCK_OK);
    tu_acquire_release(l2, DLOCK_TRY);
    dlock_lock_free(l);
    dlock_lock_free(l2);
    dlock_client_close(c);
    dlock_client_close(c2);
}

/* Freeing a handle releases what it holds; the client makes new ones. */
TU_TEST(free_releases, 30)
{
    dlock_client *c = ct_open_test(NULL), *c2 = ct_open_test(NULL);
    dlock_lock *l = tu_lock(c, "freed"), *o = tu_lock(c2, "freed");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    dlock_lock_free(l);
    tu_acquire_release(o, DLOCK_FOREVER); /* the release may reach the backend after free returns */
    l = tu_lock(c, "freed");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    dlock_lock_free(l);
    dlock_lock_free(NULL); /* harmless */
    dlock_lock_free(o);
    TU_CLOSE_CLIENTS(c2, c);
}

/* The keeper renews a lease of a hold in MODE while the holder lives:
 * seen as the hold's validity going back up, three times (a whole lease
 * renewed), with no loss and the lock still busy for others (for a
 * reader: a writer). File: no lease to renew. */
static void lease_renewed_case(dlock_mode mode)
{
    struct tu_pair p = pair_open("lease=2s", NULL, "renewed");
    if (mode == DLOCK_SHARED) { /* a reader; lb, the writer, stays out */
        dlock_lock_free(p.la);
        p.la = tu_lock_mode(p.a, "renewed", DLOCK_SHARED, 0);
    }
    tu_pair_watch_lost(&p);
    TU_ACQUIRE_OK(p.la, DLOCK_TRY);
    if (!has(CT_LEASES)) {
        ck_assert_int_eq(dlock_validity_ms(p.la), DLOCK_VALID_FOREVER);
    } else {
        int renewals = 0;
        int64_t prev = dlock_validity_ms(p.la);
        for (int i = 0; i < 3000 && renewals < 3; i++) {
            tu_sleep_ms(10);
            int64_t v = dlock_validity_ms(p.la);
            ck_assert_msg(v > 0, "validity ran out: %" PRId64 " (%s)", v, p.lost.why);
            renewals += v > prev;
            prev = v;
        }
        ck_assert_msg(renewals >= 3, "only %d renewal(s) seen", renewals);
        ck_assert_int_eq(atomic_load(&p.lost.fired), 0);
    }
    EXPECT_RC(dlock_acquire(p.lb, DLOCK_TRY), DLOCK_EBUSY);
    EXPECT_RC(dlock_release(p.la), DLOCK_OK);
    tu_acquire_release(p.lb, DLOCK_TRY);
    tu_pair_close(&p);
}

TU_TEST(lease_renewed, 60)
{
    lease_renewed_case(DLOCK_EXCLUSIVE);
}

TU_TEST(shared_lease_renewed, 60)
{
    if (has(CT_SHARED))
        lease_renewed_case(DLOCK_SHARED);
}

/* A cancel reaches a thread waiting behind another thread of the same
 * client (the core's local queue on some backends, the backend's own wait
 * on others). Nothing shows where that wait sleeps, so the cancel is
 * repeated until the acquire returns: only a cancel that reached the wait
 * can end an unbounded one while the lock stays held. */
TU_TEST(cancel_same_client, 30)
{
    dlock_client *c = ct_open_test(NULL);
    dlock_lock *l = tu_lock(c, "cancel-local");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    struct tu_waiter w;
    tu_waiter_start(&w, l, DLOCK_FOREVER);
    tu_waiter_cancel_until_returned(&w);
    ck_assert_msg(w.rc == DLOCK_ECANCELED, "waiter: %s", dlock_err_name(w.rc));
    ck_assert_uint_eq(dlock_hold_count(l), 1); /* ours is untouched */
    EXPECT_RC(dlock_release(l), DLOCK_OK);
    tu_waiter_start(&w, l, DLOCK_TRY); /* and the next one gets it */
    tu_waiter_join(&w);
    ck_assert_msg(w.rc == DLOCK_OK, "next thread: %s", dlock_err_name(w.rc));
    dlock_lock_free(l);
    dlock_client_close(c);
}

/* A cancel object fired while an acquire waits ends it; fired before an
 * acquire starts, the acquire returns DLOCK_ECANCELED at once, even for a
 * free lock, and holds nothing. */
TU_TEST(cancel_object, 30)
{
    struct tu_pair p = pair_open(NULL, NULL, "cancel-obj");
    dlock_cancel *k = NULL;
    EXPECT_RC(dlock_cancel_new(&k), DLOCK_OK);
    ck_assert_int_eq(dlock_cancel_fired(k), 0);
    TU_ACQUIRE_OK(p.la, DLOCK_TRY);
    struct tu_waiter w;
    tu_waiter_start_ex(&w, p.lb, DLOCK_FOREVER, k, false);
    wait_for_waiter(p.a, "cancel-obj"); /* where it shows; a fire before the wait ends it too */
    EXPECT_RC(dlock_cancel_fire(k), DLOCK_OK);
    tu_waiter_join(&w);
    ck_assert_msg(w.rc == DLOCK_ECANCELED, "waiter: %s", dlock_err_name(w.rc));
    ck_assert_int_eq(dlock_cancel_fired(k), 1);
    ck_assert_uint_eq(dlock_hold_count(p.lb), 0);
    wait_no_waiter(p.a, "cancel-obj");
    EXPECT_RC(dlock_release(p.la), DLOCK_OK);
    EXPECT_RC(dlock_acquire_ex(p.lb, DLOCK_TRY, k), DLOCK_ECANCELED); /* stays fired */
    ck_assert_uint_eq(dlock_hold_count(p.lb), 0);
    EXPECT_RC(dlock_acquire_ex(p.lb, DLOCK_TRY, NULL), DLOCK_OK);
    EXPECT_RC(dlock_release(p.lb), DLOCK_OK);
    dlock_cancel_free(k);
    tu_pair_close(&p);
}

/* A handle-owned hold belongs to the handle: taken in one thread, it is
 * counted, read and released from another; another handle is another
 * owner, even in the same thread. */
TU_TEST(handle_owned, 30)
{
    dlock_client *c = ct_open_test(NULL), *c2 = ct_open_test(NULL);
    dlock_lock *h = NULL, *h2 = NULL;
    EXPECT_RC(dlock_lock_new(c, "owned", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED, &h), DLOCK_OK);
    EXPECT_RC(dlock_lock_new(c, "owned", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED, &h2), DLOCK_OK);
    dlock_lock *other = tu_lock(c2, "owned");
    struct tu_waiter w;
    tu_waiter_start_ex(&w, h, DLOCK_TRY, NULL, true); /* keeps its hold */
    tu_waiter_join(&w); /* the thread is gone, its hold is not */
    ck_assert_msg(w.rc == DLOCK_OK, "acquire in a thread: %s", dlock_err_name(w.rc));
    ck_assert_uint_eq(dlock_hold_count(h), 1);
    ck_assert_uint_eq(token_of(h), w.token);
    ck_assert_int_gt(dlock_validity_ms(h), 0);
    EXPECT_RC(dlock_acquire(other, DLOCK_TRY), DLOCK_EBUSY);
    EXPECT_RC(dlock_acquire(h2, DLOCK_TRY), DLOCK_EBUSY); /* another handle, another owner */
    TU_ACQUIRE_OK(h, DLOCK_TRY); /* the owner re-enters, from any thread */
    ck_assert_uint_eq(dlock_hold_count(h), 2);
    ck_assert_uint_eq(token_of(h), w.token);
    EXPECT_RC(dlock_release(h), DLOCK_OK);
    EXPECT_RC(dlock_release(h), DLOCK_OK);
    EXPECT_RC(dlock_release(h), DLOCK_ENOTOWNER);
    TU_ACQUIRE_OK(other, DLOCK_TRY);
    ck_assert_uint_gt(token_of(other), w.token);
    EXPECT_RC(dlock_release(other), DLOCK_OK);
    TU_ACQUIRE_OK(h2, DLOCK_TRY);
    dlock_lock_free(h2); /* freeing the handle releases its hold */
    tu_acquire_release(other, DLOCK_FOREVER);
    TU_FREE_LOCKS(other, h);
    TU_CLOSE_CLIENTS(c2, c);
}

/* DLOCK_LOCK_FAIR: waiters get the lock in the order they came, each seen
 * queued by the backend before the next one starts. DLOCK_ENOTSUP where
 * the backend cannot keep that order: from dlock_lock_new, or where only
 * the URL's layout rules it out (redis layout=simple) at the acquire. */
TU_TEST(fair_order, 30)
{
    enum { W = 3 };
    dlock_client *a = ct_open_test(NULL);
    dlock_lock *la = NULL;
    int rc = dlock_lock_new(a, "fair", DLOCK_EXCLUSIVE, DLOCK_LOCK_FAIR, &la);
    if (!has(CT_FAIR)) {
        if (rc == DLOCK_OK)
            rc = dlock_acquire(la, DLOCK_TRY);
        ck_assert_msg(rc == DLOCK_ENOTSUP, "DLOCK_LOCK_FAIR on %s: %s", CT->name,
                      dlock_err_name(rc));
        ck_assert_msg(strstr(dlock_errmsg(), "FAIR"), "message: %s", dlock_errmsg());
        dlock_lock_free(la);
        dlock_client_close(a);
        return;
    }
    ck_assert_msg(rc == DLOCK_OK, "DLOCK_LOCK_FAIR: %s: %s", dlock_err_name(rc), dlock_errmsg());
    TU_ACQUIRE_OK(la, DLOCK_TRY);
    uint64_t t0 = token_of(la);
    dlock_client *c[W];
    dlock_lock *l[W];
    struct tu_waiter w[W];
    for (int i = 0; i < W; i++) {
        c[i] = ct_open_test(NULL);
        EXPECT_RC(dlock_lock_new(c[i], "fair", DLOCK_EXCLUSIVE, DLOCK_LOCK_FAIR, &l[i]), DLOCK_OK);
        tu_waiter_start(&w[i], l[i], DLOCK_FOREVER);
        long n = -1;
        for (int k = 0; k < 2000 && (n = CT->waiters(CT, a, ct_prefix, "fair")) < i + 1; k++)
            tu_sleep_ms(10);
        ck_assert_msg(n == i + 1, "waiter %d never queued (%ld waiting)", i, n);
    }
    EXPECT_RC(dlock_release(la), DLOCK_OK);
    for (int i = 0; i < W; i++) {
        tu_waiter_join(&w[i]);
        ck_assert_msg(w[i].rc == DLOCK_OK, "waiter %d: %s", i, dlock_err_name(w[i].rc));
        ck_assert_msg(w[i].token > (i ? w[i - 1].token : t0), "waiter %d served out of order", i);
    }
    for (int i = 0; i < W; i++) {
        dlock_lock_free(l[i]);
        dlock_client_close(c[i]);
    }
    dlock_lock_free(la);
    dlock_client_close(a);
}

/* ========================================================== lost holds */

/* Another client force-releases a held lock: the callback fires once with
 * a reason, validity drops to 0, release says DLOCK_ELOST. File: a live
 * holder's lock cannot be taken (DLOCK_ENOTSUP, naming the holder). */
TU_TEST(lost_callback, 60)
{
    struct tu_pair p = pair_open("lease=1500ms", NULL, "taken");
    tu_pair_watch_lost(&p);
    TU_ACQUIRE_OK(p.la, DLOCK_TRY);
    if (!has(CT_FORCE_LIVE)) {
        EXPECT_RC(dlock_force_release(p.b, "taken"), DLOCK_ENOTSUP);
        char me[32];
        snprintf(me, sizeof me, "%d@", (int)getpid());
        ck_assert_msg(strstr(dlock_errmsg(), me), "message lacks the holder %s: %s", me,
                      dlock_errmsg());
        EXPECT_RC(dlock_acquire(p.lb, DLOCK_TRY), DLOCK_EBUSY);
        EXPECT_RC(dlock_release(p.la), DLOCK_OK);
    } else {
        EXPECT_RC(dlock_force_release(p.b, "taken"), DLOCK_OK);
        ck_assert_msg(tu_wait_lost(&p.lost, 1, 30000), "the lost callback never fired");
        ck_assert_msg(strstr(p.lost.why, "'taken'") && strstr(p.lost.why, "force-released") &&
                          strstr(p.lost.why, "127.0.0.1:"),
                      "the reason names neither the lock, the cause nor the server: %s",
                      p.lost.why);
        ck_assert_int_eq(dlock_validity_ms(p.la), 0);
        TU_ACQUIRE_OK(p.lb, DLOCK_TRY);
        EXPECT_RC(dlock_release(p.la), DLOCK_ELOST);
        ck_assert_uint_eq(dlock_hold_count(p.la), 0);
        EXPECT_RC(dlock_release(p.lb), DLOCK_OK);
        tu_acquire_release(p.la, DLOCK_TRY); /* the handle works again */
        ck_assert_int_eq(atomic_load(&p.lost.fired), 1);
    }
    tu_pair_close(&p);
}

/* A fixed lease is never renewed: it expires on the server, the hold is
 * reported lost, another client gets the lock. File: leases are ignored
 * (the hold lasts until released); zk: DLOCK_ENOTSUP (a node lives as
 * long as its session). */
TU_TEST(fixed_lease, 60)
{
    struct tu_pair p = pair_open(NULL, NULL, "fixed");
    tu_pair_watch_lost(&p);
    int rc = dlock_lock_set_lease(p.la, 1500, DLOCK_LEASE_FIXED); /* zk: refused here */
    if (rc == DLOCK_OK)
        rc = dlock_acquire(p.la, DLOCK_TRY);
    if (!has(CT_LEASES)) {
        ck_assert_int_eq(rc, DLOCK_OK);
        ck_assert_int_eq(dlock_validity_ms(p.la), DLOCK_VALID_FOREVER);
        EXPECT_RC(dlock_acquire(p.lb, DLOCK_TRY), DLOCK_EBUSY);
        EXPECT_RC(dlock_release(p.la), DLOCK_OK);
    } else if (!has(CT_FIXED_LEASE)) {
        ck_assert_msg(rc == DLOCK_ENOTSUP, "fixed lease on %s: %s", CT->name, dlock_err_name(rc));
        ck_assert_msg(strstr(dlock_errmsg(), "fixed"), "message: %s", dlock_errmsg());
        ck_assert_uint_eq(dlock_hold_count(p.la), 0);
    } else {
        ck_assert_msg(rc == DLOCK_OK, "acquire: %s: %s", dlock_err_name(rc), dlock_errmsg());
        int64_t v = dlock_validity_ms(p.la);
        ck_assert_msg(v >= 0 && v <= 1500, "validity %" PRId64 " of a 1.5 s fixed lease", v);
        TU_ACQUIRE_OK(p.lb, DLOCK_FOREVER); /* only the expiry frees it */
        ck_assert_msg(tu_wait_lost(&p.lost, 1, 30000), "the lost callback never fired");
        ck_assert_int_eq(dlock_validity_ms(p.la), 0);
        EXPECT_RC(dlock_release(p.la), DLOCK_ELOST);
        EXPECT_RC(dlock_release(p.lb), DLOCK_OK);
        ck_assert_int_eq(atomic_load(&p.lost.fired), 1);
    }
    tu_pair_close(&p);
}

/* ============================================================= at risk */

/* What one handle's at-risk and lost callbacks saw, in order. */
struct risk_watch {
    atomic_int at_risk, lost;
    atomic_int risk_at_loss;       /* at-risk calls made when the loss came */
    atomic_llong validity[4];      /* each at-risk call's VALIDITY_MS */
    char why[512];                 /* the last at-risk call's WHY */
};

static void risk_seen(dlock_lock *l, int64_t validity_ms, const char *why, void *arg)
{
    (void)l;
    struct risk_watch *w = arg;
    int k = atomic_load(&w->at_risk);
    if (k < 4)
        atomic_store(&w->validity[k], validity_ms);
    snprintf(w->why, sizeof w->why, "%s", why ? why : "(NULL)");
    atomic_fetch_add(&w->at_risk, 1);
}

static void risk_lost(dlock_lock *l, const char *why, void *arg)
{
    (void)l;
    (void)why;
    struct risk_watch *w = arg;
    atomic_store(&w->risk_at_loss, atomic_load(&w->at_risk));
    atomic_fetch_add(&w->lost, 1);
}

/* Wait up to TIMEOUT_MS until *N reaches WANT. */
static bool wait_count(atomic_int *n, int want, int timeout_ms)
{
    for (int waited = 0; waited < timeout_ms && atomic_load(n) < want; waited += 10)
        tu_sleep_ms(10);
    return atomic_load(n) >= want;
}

/* A handle on NAME whose at-risk (MARGIN_MS) and lost callbacks report to W. */
static dlock_lock *risk_lock(dlock_client *c, const char *name, int64_t margin_ms,
                             struct risk_watch *w)
{
    dlock_lock *l = tu_lock(c, name);
    EXPECT_RC(dlock_lock_on_at_risk(l, margin_ms, risk_seen, w), DLOCK_OK);
    EXPECT_RC(dlock_lock_on_lost(l, risk_lost, w), DLOCK_OK);
    return l;
}

/* At-risk call K of W was made with a validity in (0, MARGIN_MS]. */
static void risk_validity_within(struct risk_watch *w, int k, int64_t margin_ms)
{
    long long v = atomic_load(&w->validity[k]);
    ck_assert_msg(v > 0 && v <= margin_ms, "%s: at-risk call %d with a validity of %lld ms (margin %lld)",
                  CT->name, k + 1, v, (long long)margin_ms);
}

/* The at-risk signal is the core's (the callback thread's timer on each
 * hold's validity) and the same for every URL form of a backend: it runs
 * on one form of each. */
static bool at_risk_runs(void)
{
    const char *forms[] = {"file", "redis", "etcd", "zk"};
    for (size_t i = 0; i < TU_COUNT(forms); i++)
        if (strcmp(CT->name, forms[i]) == 0)
            return true;
    return false;
}

/* dlock_lock_on_at_risk(): every server stopped (CT->pause), a renewal
 * goes unanswered and the handle is told once, with a validity in (0,
 * margin], before anything is lost; the server back, a confirmed renewal
 * re-arms it, and the next stop tells it again, then the loss follows,
 * the at-risk call before it and none after. A hold released before the
 * stops is never reported. A fixed lease (nothing renews it), the
 * callback set once it is held, is reported before it ends. File:
 * DLOCK_ENOTSUP (no lease). Before: no such call. */
TU_TEST(at_risk, 90)
{
    if (!at_risk_runs())
        return;
    /* A 5 s lease: validity 4948 ms; a renewal due at 1.7 s; the margin,
     * 2.2 s, is reached 2.7 s after the last confirmed renewal was sent
     * and leaves the test 2.2 s to let the server go on. */
    const int64_t margin = 2200;
    dlock_client *c = ct_open_test("lease=5s");
    struct risk_watch w = {0}, released = {0}, fixed = {0};
    dlock_lock *l = tu_lock(c, "risk");
    EXPECT_RC(dlock_lock_on_at_risk(NULL, margin, risk_seen, &w), DLOCK_EINVAL);
    int rc = dlock_lock_on_at_risk(l, margin, risk_seen, &w);
    if (!has(CT_LEASES)) {
        ck_assert_msg(rc == DLOCK_ENOTSUP, "at-risk on %s: %s", CT->name, dlock_err_name(rc));
        ck_assert_msg(strstr(dlock_errmsg(), "lease"), "message: %s", dlock_errmsg());
        dlock_lock_free(l);
        dlock_client_close(c);
        return;
    }
    EXPECT_RC(rc, DLOCK_OK);
    EXPECT_RC(dlock_lock_on_at_risk(l, 0, risk_seen, &w), DLOCK_EINVAL);
    EXPECT_RC(dlock_lock_on_lost(l, risk_lost, &w), DLOCK_OK);
    ck_assert_msg(CT->pause, "fixture %s cannot stop its server", CT->name);
    dlock_lock *done = risk_lock(c, "risk-released", margin, &released);
    TU_ACQUIRE_OK(done, DLOCK_TRY);
    TU_RELEASE_OK(done);

    TU_ACQUIRE_OK(l, DLOCK_TRY);
    CT->pause(CT, true);
    bool told = wait_count(&w.at_risk, 1, 30000);
    int lost_then = atomic_load(&w.lost);
    CT->pause(CT, false);
    ck_assert_msg(told, "%s: never told at risk with the server stopped", CT->name);
    ck_assert_msg(lost_then == 0, "%s: lost before the server came back", CT->name);
    risk_validity_within(&w, 0, margin);
    ck_assert_msg(strstr(w.why, "'risk'"), "WHY does not name the lock: %s", w.why);
    /* A renewal confirmed: the validity is above the margin again. */
    int64_t v = 0;
    for (int i = 0; i < 3000 && (v = dlock_validity_ms(l)) <= margin; i++)
        tu_sleep_ms(10);
    ck_assert_msg(v > margin, "%s: no renewal confirmed once the server was back (validity %lld)",
                  CT->name, (long long)v);
    ck_assert_int_eq(atomic_load(&w.at_risk), 1);

    CT->pause(CT, true);
    told = wait_count(&w.lost, 1, 30000);
    CT->pause(CT, false);
    ck_assert_msg(told, "%s: the hold was never lost with the server stopped", CT->name);
    ck_assert_msg(atomic_load(&w.risk_at_loss) == 2,
                  "%s: %d at-risk call(s) before the loss, expected 2 (one after the renewal)",
                  CT->name, atomic_load(&w.risk_at_loss));
    risk_validity_within(&w, 1, margin);
    EXPECT_RC(dlock_release(l), DLOCK_ELOST);
    ck_assert_int_eq(atomic_load(&w.at_risk), 2);
    ck_assert_int_eq(atomic_load(&released.at_risk), 0);

    if (has(CT_FIXED_LEASE)) {
        dlock_lock *f = tu_lock(c, "risk-fixed");
        EXPECT_RC(dlock_lock_set_lease(f, 1500, DLOCK_LEASE_FIXED), DLOCK_OK);
        EXPECT_RC(dlock_lock_on_lost(f, risk_lost, &fixed), DLOCK_OK);
        TU_ACQUIRE_OK(f, DLOCK_TRY);
        EXPECT_RC(dlock_lock_on_at_risk(f, 1000, risk_seen, &fixed), DLOCK_OK);
        ck_assert_msg(wait_count(&fixed.lost, 1, 30000), "the fixed lease never ended");
        ck_assert_msg(atomic_load(&fixed.risk_at_loss) == 1,
                      "%s: %d at-risk call(s) before a fixed lease ended, expected 1", CT->name,
                      atomic_load(&fixed.risk_at_loss));
        risk_validity_within(&fixed, 0, 1000);
        EXPECT_RC(dlock_release(f), DLOCK_ELOST);
        dlock_lock_free(f);
    }
    TU_FREE_LOCKS(l, done);
    dlock_client_close(c);
}

/* =========================================================== contended */

/* What one handle's contended callback saw, in order. */
struct contend_watch {
    atomic_int calls;
    char who[8][256];
};

static void contended_seen(dlock_lock *l, const char *who, void *arg)
{
    (void)l;
    struct contend_watch *w = arg;
    int k = atomic_load(&w->calls);
    if (k < 8)
        snprintf(w->who[k], sizeof w->who[k], "%s", who ? who : "(NULL)");
    atomic_fetch_add(&w->calls, 1);
}

/* The backends that tell a holder who waits (the others: DLOCK_ENOTSUP). */
static bool contended_told(void)
{
    const char *forms[] = {"file",           "zk",           "etcd",           "redis",
                           "redis-simple",   "redis-fair",   "rediss",         "redis-sentinel",
                           "rediss-sentinel", "redis-cluster", "rediss-cluster"};
    for (size_t i = 0; i < TU_COUNT(forms); i++)
        if (strcmp(CT->name, forms[i]) == 0)
            return true;
    return false;
}

/* A hold taken by dlock_acquire_async() is a hold like any other: its
 * handle's contended callback is told when another client waits. Redis
 * has its own test in check_async; this one covers zk and etcd too. */
static void async_took(dlock_lock *l, int rc, void *arg)
{
    (void)l;
    *(int *)arg = rc == DLOCK_OK ? 1 : -1;
}

TU_TEST(contended_async_try, 90)
{
    if (!contended_told())
        return;
    dlock_client *a = ct_open_test(NULL), *b = ct_open_test(NULL);
    dlock_lock *la, *lb = tu_lock(b, "contend-async");
    EXPECT_RC(dlock_lock_new(a, "contend-async", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED, &la),
              DLOCK_OK);
    struct contend_watch w = {0};
    EXPECT_RC(dlock_lock_on_contended(la, contended_seen, &w), DLOCK_OK);
    int took = 0;
    EXPECT_RC(dlock_acquire_async(la, DLOCK_TRY, NULL, async_took, &took), DLOCK_OK);
    int fd = dlock_client_fd(a);
    ck_assert_int_ge(fd, 0);
    for (int i = 0; i < 3000 && !took; i++) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 10) > 0)
            ck_assert_int_ge(dlock_dispatch(a), 0);
    }
    ck_assert_int_eq(took, 1);
    struct tu_waiter wb;
    tu_waiter_start(&wb, lb, DLOCK_FOREVER);
    bool told = wait_count(&w.calls, 1, 15000);
    EXPECT_RC(dlock_release(la), DLOCK_OK);
    EXPECT_RC(tu_waiter_join(&wb), DLOCK_OK);
    ck_assert_msg(told, "%s: a hold taken by dlock_acquire_async was never told of a waiter",
                  CT->name);
    TU_FREE_LOCKS(la, lb);
    TU_CLOSE_CLIENTS(a, b);
}

/* dlock_lock_on_contended(): a holder is told once when another client
 * starts waiting for its lock, not when someone waits for another name;
 * a second waiter is told as another call naming another waiter; a
 * waiter that gave up and waits again is told again. A hold nobody waits
 * for is never told; nothing is told after the release. A shared handle
 * is DLOCK_ENOTSUP, and so is every backend that cannot see its waiters,
 * with a message. Before: no such call. */
TU_TEST(contended, 90)
{
    dlock_client *a = ct_open_test(NULL), *b = ct_open_test(NULL), *c = ct_open_test(NULL);
    dlock_lock *la = tu_lock(a, "contend"), *lb = tu_lock(b, "contend"),
               *lc = tu_lock(c, "contend"), *quiet = tu_lock(a, "quiet"),
               *other = tu_lock(a, "other"), *lbo = tu_lock(b, "other");
    struct contend_watch w = {0}, wq = {0};
    EXPECT_RC(dlock_lock_on_contended(NULL, contended_seen, &w), DLOCK_EINVAL);
    int rc = dlock_lock_on_contended(la, contended_seen, &w);
    if (!contended_told()) {
        ck_assert_msg(rc == DLOCK_ENOTSUP, "contended on %s: %s", CT->name, dlock_err_name(rc));
        ck_assert_msg(strstr(dlock_errmsg(), "not yet") || strstr(dlock_errmsg(), "announce"),
                      "DLOCK_ENOTSUP without its reason: %s", dlock_errmsg());
        TU_FREE_LOCKS(la, lb, lc, quiet, other, lbo);
        TU_CLOSE_CLIENTS(a, b, c);
        return;
    }
    EXPECT_RC(rc, DLOCK_OK);
    EXPECT_RC(dlock_lock_on_contended(quiet, contended_seen, &wq), DLOCK_OK);
    if (has(CT_SHARED)) {
        dlock_lock *rd;
        EXPECT_RC(dlock_lock_new(a, "contend-r", DLOCK_SHARED, 0, &rd), DLOCK_OK);
        EXPECT_RC(dlock_lock_on_contended(rd, contended_seen, &w), DLOCK_ENOTSUP);
        dlock_lock_free(rd);
    }
    TU_ACQUIRE_OK(quiet, DLOCK_TRY);
    TU_ACQUIRE_OK(la, DLOCK_TRY);
    TU_ACQUIRE_OK(other, DLOCK_TRY);
    /* someone waits for another name: nothing to tell */
    struct tu_waiter wo, wb, wc;
    tu_waiter_start(&wo, lbo, DLOCK_FOREVER);
    wait_for_waiter(a, "other");
    tu_waiter_start(&wb, lb, DLOCK_FOREVER);
    ck_assert_msg(wait_count(&w.calls, 1, 30000), "%s: never told of a waiter", CT->name);
    ck_assert_msg(*w.who[0], "%s: told of a waiter with no name", CT->name);
    /* a second waiter: told once more, of that one */
    tu_waiter_start(&wc, lc, DLOCK_FOREVER);
    ck_assert_msg(wait_count(&w.calls, 2, 30000), "%s: never told of a second waiter", CT->name);
    ck_assert_msg(strcmp(w.who[0], w.who[1]) != 0, "%s: told of %s twice", CT->name, w.who[0]);
    /* the second gives up and waits again: a new waiter, told again */
    tu_waiter_cancel_until_returned(&wc);
    ck_assert_int_eq(wc.rc, DLOCK_ECANCELED);
    tu_waiter_start(&wc, lc, DLOCK_FOREVER); /* a new thread: on redis a new owner */
    ck_assert_msg(wait_count(&w.calls, 3, 30000), "%s: a waiter back was not told", CT->name);
    /* released: the waiters get it in turn, and nothing more is told */
    TU_RELEASE_OK(la);
    ck_assert_int_eq(tu_waiter_join(&wb), DLOCK_OK);
    ck_assert_int_eq(tu_waiter_join(&wc), DLOCK_OK);
    TU_RELEASE_OK(other);
    ck_assert_int_eq(tu_waiter_join(&wo), DLOCK_OK);
    TU_RELEASE_OK(quiet);
    ck_assert_msg(atomic_load(&w.calls) == 3, "%s: %d contended call(s), want 3", CT->name,
                  atomic_load(&w.calls));
    ck_assert_int_eq(atomic_load(&wq.calls), 0);
    TU_FREE_LOCKS(la, lb, lc, quiet, other, lbo);
    TU_CLOSE_CLIENTS(a, b, c);
}

/* ================================================================ names */

/* NAME nests under PARENT: it is PARENT + "/" + more. */
static bool nests_under(const char *name, const char *parent)
{
    size_t n = strlen(parent);
    return strncmp(name, parent, n) == 0 && name[n] == '/';
}

static int by_length(const void *x, const void *y)
{
    size_t a = strlen(*(const char *const *)x), b = strlen(*(const char *const *)y);
    return (a > b) - (a < b);
}

/* Names are bytes: each of these is a lock of its own, usable, distinct
 * from every other, and listed back byte for byte. The documented
 * difference (CT_NAMES_NEST, etcd as Go's concurrency.Mutex): a lock sees
 * the holder of a name nested under it ("a" under "a/b") as a contender
 * -- never two holders, but busy while the nested name is held. */
TU_TEST(hostile_names, 60)
{
    static char longa[DLOCK_NAME_MAX + 1], longb[DLOCK_NAME_MAX + 1], toolong[DLOCK_NAME_MAX + 2];
    memset(longa, 'a', DLOCK_NAME_MAX);
    memcpy(longb, longa, sizeof longa);
    longb[DLOCK_NAME_MAX - 1] = 'b'; /* differs only in its last byte */
    memset(toolong, 'x', DLOCK_NAME_MAX + 1);
    const char *names[] = {"../escape", "/", "..", ".",           "a/b", "a",
                           "a%2Fb",     "%", "\xff\xfe\x01", "a b\n", longa, longb};
    enum { N = sizeof names / sizeof *names };
    dlock_client *a = ct_open_test(NULL), *b = ct_open_test(NULL);
    dlock_lock *la[N], *lb[N];
    for (size_t i = 0; i < N; i++) {
        la[i] = tu_lock(a, names[i]);
        lb[i] = tu_lock(b, names[i]);
    }
    /* All held at once by one thread (shortest first: with nesting names,
     * "a" before "a/b"); another client finds each busy. */
    const char *by_len[N];
    memcpy(by_len, names, sizeof names);
    qsort(by_len, N, sizeof *by_len, by_length);
    for (size_t i = 0; i < N; i++)
        for (size_t k = 0; k < N; k++)
            if (names[k] == by_len[i])
                ck_assert_msg(dlock_acquire(la[k], DLOCK_TRY) == DLOCK_OK, "name %zu: %s", k,
                              dlock_errmsg());
    for (size_t i = 0; i < N; i++)
        ck_assert_msg(dlock_acquire(lb[i], DLOCK_TRY) == DLOCK_EBUSY, "name %zu not busy: %s", i,
                      dlock_errmsg());
    char **v = tu_list_names(a, NULL);
    for (size_t i = 0; i < N; i++)
        ck_assert_msg(tu_listed(v, names[i]), "list lost name %zu", i);
    ck_assert_uint_eq(tu_count_names(v), N);
    tu_free_names(v);
    for (size_t i = 0; i < N; i++)
        EXPECT_RC(dlock_release(la[i]), DLOCK_OK);
    /* Distinct: holding one name leaves every other free (but the names it
     * nests under, where names nest). */
    for (size_t i = 0; i < N; i++) {
        TU_ACQUIRE_OK(la[i], DLOCK_TRY);
        for (size_t j = 0; j < N; j++) {
            int rc = dlock_acquire(lb[j], DLOCK_TRY);
            bool busy = i == j || (has(CT_NAMES_NEST) && nests_under(names[i], names[j]));
            ck_assert_msg(rc == (busy ? DLOCK_EBUSY : DLOCK_OK), "name %zu held, name %zu: %s",
                          i, j, dlock_err_name(rc));
            if (rc == DLOCK_OK)
                EXPECT_RC(dlock_release(lb[j]), DLOCK_OK);
        }
        EXPECT_RC(dlock_release(la[i]), DLOCK_OK);
    }
    dlock_lock *bad = (dlock_lock *)1;
    EXPECT_RC(dlock_lock_new(a, "", DLOCK_EXCLUSIVE, 0, &bad), DLOCK_EINVAL);
    ck_assert_ptr_null(bad);
    EXPECT_RC(dlock_lock_new(a, toolong, DLOCK_EXCLUSIVE, 0, &bad), DLOCK_EINVAL);
    EXPECT_RC(dlock_lock_new(a, NULL, DLOCK_EXCLUSIVE, 0, &bad), DLOCK_EINVAL);
    for (size_t i = 0; i < N; i++) {
        TU_FREE_LOCKS(la[i], lb[i]);
    }
    TU_CLOSE_CLIENTS(a, b);
}

/* dlock_lock_new with a reserved flag bit: DLOCK_EINVAL, no handle. */
TU_TEST(reserved_flags, 30)
{
    dlock_client *c = ct_open_test(NULL);
    const unsigned reserved[] = {1u << 31, 1u << 16, 0x80u};
    for (size_t i = 0; i < sizeof reserved / sizeof *reserved; i++) {
        dlock_lock *l = (dlock_lock *)1;
        int rc = dlock_lock_new(c, "flags", DLOCK_EXCLUSIVE, reserved[i], &l);
        ck_assert_msg(rc == DLOCK_EINVAL, "flags %#x: %s", reserved[i], dlock_err_name(rc));
        ck_assert_ptr_null(l);
        ck_assert_msg(dlock_errmsg()[0], "flags %#x: no message", reserved[i]);
    }
    dlock_client_close(c);
}

/* ============================================================== crashes */

/* A child process that holds NAME through URL and writes its token to
 * DIR/held. KILL_ONLY: then sleeps until killed. Otherwise it also holds
 * NAME-2 (two holds of one client), waits for DIR/go, then (on a backend
 * with leases) for a lost callback of each hold, releases both and writes
 * "<release code> <release code> <callbacks fired> <both validities 0>"
 * to DIR/done, takes
 * NAME again (waiting as long as it takes) and writes its new token to
 * DIR/again. Forked before the test opens a client, so no library thread
 * is forked. */
static pid_t fork_holder(const char *url, const char *name, dlock_mode mode, const char *dir,
                         bool kill_only)
{
    pid_t pid = tu_fork();
    if (pid > 0)
        return pid;
    dlock_client *c = NULL;
    dlock_lock *l = NULL, *l2 = NULL;
    static struct tu_lost lost;
    char *name2 = tu_fmt("%s-2", name);
    if (dlock_open(url, &c) || dlock_lock_new(c, name, mode, 0, &l) ||
        dlock_lock_new(c, name2, DLOCK_EXCLUSIVE, 0, &l2))
        _exit(10);
    dlock_lock_on_lost(l, tu_on_lost, &lost);
    dlock_lock_on_lost(l2, tu_on_lost, &lost);
    if (dlock_acquire(l, 30000) || (!kill_only && dlock_acquire(l2, 30000)))
        _exit(11);
    uint64_t t = 0;
    dlock_token(l, &t);
    char *again = tu_fmt("%s/again", dir);
    ct_holder_held(dir, t, kill_only);
    if (has(CT_LEASES))
        tu_wait_lost(&lost, 2, 30000);
    int zero = dlock_validity_ms(l) == 0 && dlock_validity_ms(l2) == 0;
    int rc = dlock_release(l), rc2 = dlock_release(l2);
    ct_holder_done(dir, rc, rc2, atomic_load(&lost.fired), zero);
    if (dlock_acquire(l, DLOCK_FOREVER))
        _exit(12);
    dlock_token(l, &t);
    char *t2 = tu_fmt("%" PRIu64 "\n", t);
    tu_write_marker(again, t2);
    dlock_release(l);
    _exit(0);
}

/* kill -9 of a holder in MODE of NAME: the lock is free once the kernel
 * (file), the lease or the session lets go, and a writer waiting with
 * DLOCK_FOREVER gets it. Meanwhile a shared holder shares with readers. */
static void kill9_case(const char *name, dlock_mode mode)
{
    struct ct_holder h = ct_holder_open("lease=1500ms", "contract-kill9");
    h.pid = fork_holder(h.url, name, mode, h.dir, true);
    uint64_t t1 = ct_holder_wait(&h);
    dlock_client *c = tu_open(h.url);
    dlock_lock *l = tu_lock(c, name);
    EXPECT_RC(dlock_acquire(l, DLOCK_TRY), DLOCK_EBUSY);
    if (mode == DLOCK_SHARED) {
        dlock_lock *r = tu_lock_mode(c, name, DLOCK_SHARED, 0);
        tu_acquire_release(r, DLOCK_TRY);
        dlock_lock_free(r);
    }
    ct_holder_kill(&h);
    TU_ACQUIRE_OK(l, DLOCK_FOREVER); /* the test's time limit fails a hang */
    ck_assert_uint_gt(token_of(l), t1);
    TU_RELEASE_FREE(l);
    dlock_client_close(c);
    ct_holder_close(&h);
}

TU_TEST(kill9_holder, 60)
{
    kill9_case("kill9", DLOCK_EXCLUSIVE);
}

TU_TEST(kill9_reader, 60)
{
    if (has(CT_SHARED))
        kill9_case("kill9r", DLOCK_SHARED);
}

/* ------------------------------------------------------ checking a token */

/* dlock_check(C, NAME, TOKEN) asserted to return WANT. */
#define EXPECT_CHECK(c, name, token, want) EXPECT_RC(dlock_check((c), (name), (token)), (want))

/* dlock_check(), Chubby's CheckSequencer, asked by the holder's client and
 * another: a fresh hold's token is current; tokens never issued (0, one
 * past the holder's, UINT64_MAX) are stale, never an error; after the
 * release the token is stale; after another owner took the name the old
 * token is stale and the new one current. */
TU_TEST(check_token, 60)
{
    dlock_client *a = ct_open_test(NULL), *b = ct_open_test(NULL);
    EXPECT_CHECK(b, "chk", 1, DLOCK_ELOST); /* never held */
    ck_assert_msg(strstr(dlock_errmsg(), "'chk'"), "%s", dlock_errmsg());
    dlock_lock *la = tu_lock(a, "chk"), *lb = tu_lock(b, "chk");
    TU_ACQUIRE_OK(la, DLOCK_TRY);
    uint64_t t1 = token_of(la);
    EXPECT_CHECK(a, "chk", t1, DLOCK_OK);
    EXPECT_CHECK(b, "chk", t1, DLOCK_OK);
    EXPECT_CHECK(b, "chk", 0, DLOCK_ELOST);
    EXPECT_CHECK(b, "chk", t1 + 1, DLOCK_ELOST);
    EXPECT_CHECK(b, "chk", UINT64_MAX, DLOCK_ELOST);
    EXPECT_CHECK(b, "chk-other", t1, DLOCK_ELOST);
    TU_RELEASE_OK(la);
    EXPECT_CHECK(b, "chk", t1, DLOCK_ELOST);
    TU_ACQUIRE_OK(lb, DLOCK_TRY);
    uint64_t t2 = token_of(lb);
    ck_assert_uint_gt(t2, t1);
    EXPECT_CHECK(a, "chk", t1, DLOCK_ELOST);
    EXPECT_CHECK(a, "chk", t2, DLOCK_OK);
    TU_RELEASE_OK(lb);
    EXPECT_CHECK(a, "chk", t2, DLOCK_ELOST);
    TU_FREE_LOCKS(la, lb);
    TU_CLOSE_CLIENTS(a, b);
}

/* Held shared: an earlier reader's token is stale (it is not the newest
 * hold) and the newest reader's current where the backend keeps a token
 * per reader (etcd, zk, postgres); file and the Redis forms keep one
 * counter, so for the newest reader's token they answer DLOCK_ENOTSUP,
 * never a guess. Once the newest reader left, its token is stale on
 * etcd, zk and postgres. */
TU_TEST(check_token_shared, 60)
{
    if (!has(CT_SHARED))
        return;
    bool per_reader =
        !strcmp(CT->scheme, "etcd") || !strcmp(CT->scheme, "zk") || !strcmp(CT->scheme, "postgres");
    int newest = per_reader ? DLOCK_OK : DLOCK_ENOTSUP;
    dlock_client *a = ct_open_test(NULL), *b = ct_open_test(NULL);
    dlock_lock *ra = tu_lock_mode(a, "chks", DLOCK_SHARED, 0);
    dlock_lock *rb = tu_lock_mode(b, "chks", DLOCK_SHARED, 0);
    TU_ACQUIRE_OK(ra, DLOCK_TRY);
    TU_ACQUIRE_OK(rb, DLOCK_TRY);
    uint64_t t1 = token_of(ra), t2 = token_of(rb);
    ck_assert_uint_gt(t2, t1);
    EXPECT_CHECK(a, "chks", t1, DLOCK_ELOST);
    EXPECT_CHECK(a, "chks", t2, newest);
    TU_RELEASE_OK(rb);
    EXPECT_CHECK(a, "chks", t2, per_reader ? DLOCK_ELOST : DLOCK_ENOTSUP);
    TU_RELEASE_OK(ra);
    EXPECT_CHECK(a, "chks", t1, DLOCK_ELOST);
    TU_FREE_LOCKS(ra, rb);
    TU_CLOSE_CLIENTS(a, b);
}

/* A holder killed with SIGKILL: its token is current while the backend
 * still counts the hold alive -- until the lease (redis, etcd) or the
 * session (zk) ends; on file not once after the kill (the kernel lets
 * go) -- and then stale, never an error in between. */
TU_TEST(check_token_of_killed_holder, 60)
{
    struct ct_holder h = ct_holder_open("lease=1s", "contract-check9");
    h.pid = fork_holder(h.url, "chk9", DLOCK_EXCLUSIVE, h.dir, true);
    uint64_t t = ct_holder_wait(&h);
    dlock_client *c = tu_open(h.url);
    EXPECT_CHECK(c, "chk9", t, DLOCK_OK);
    ct_holder_kill(&h);
    int rc, current = 0;
    while ((rc = dlock_check(c, "chk9", t)) == DLOCK_OK) { /* the test's time limit fails a hang */
        current++;
        usleep(50 * 1000);
    }
    ck_assert_msg(rc == DLOCK_ELOST, "check after the kill: %s: %s", dlock_err_name(rc),
                  dlock_errmsg());
    if (!has(CT_LEASES))
        ck_assert_int_eq(current, 0);
    dlock_client_close(c);
    ct_holder_close(&h);
}

/* ------------------------------------------------------ a lock's value */

/* NAME's value through C asserted to be WANT (a string, "" with TOKEN 0:
 * no value) written by the hold of TOKEN. */
static void expect_value(dlock_client *c, const char *name, const char *want, uint64_t token)
{
    char buf[DLOCK_VALUE_MAX];
    size_t len = sizeof buf;
    uint64_t t = 12345;
    EXPECT_RC(dlock_value_get(c, name, buf, &len, &t), DLOCK_OK);
    ck_assert_msg(len == strlen(want) && !memcmp(buf, want, len), "value of '%s': '%.*s', want '%s'",
                  name, (int)len, buf, want);
    ck_assert_uint_eq(t, token);
}

/* Key KEY of NAME's store through C asserted to be WANT (a string; "" with
 * TOKEN 0: no such key) written by the hold of TOKEN. */
static void expect_key(dlock_client *c, const char *name, const char *key, const char *want,
                       uint64_t token)
{
    char buf[256];
    dlock_guarded_read r = {.name = name, .key = key, .buf = buf, .size = sizeof buf,
                            .token = 12345};
    EXPECT_RC(dlock_guarded_get(c, &r), DLOCK_OK);
    ck_assert_msg(r.len == strlen(want) && !memcmp(buf, want, r.len),
                  "key '%s' of '%s': '%.*s', want '%s'", key, name, (int)r.len, buf, want);
    ck_assert_uint_eq(r.token, token);
}

/* A backend that declares no lock value (CT_NO_VALUE) answers
 * DLOCK_ENOTSUP naming itself, for the write and the read; true then. */
static bool value_unsupported(dlock_client *c, dlock_lock *held)
{
    if (!has(CT_NO_VALUE))
        return false;
    char buf[8];
    size_t len = sizeof buf;
    EXPECT_RC(dlock_value_set(held, "x", 1), DLOCK_ENOTSUP);
    EXPECT_RC(dlock_value_get(c, "val", buf, &len, NULL), DLOCK_ENOTSUP);
    ck_assert_msg(strstr(dlock_errmsg(), dlock_client_backend(c)), "%s", dlock_errmsg());
    return true;
}

/* Two clients of the backend and their handles on NAME, the first
 * holding it: the start of the value tests. */
struct value_pair {
    dlock_client *a, *b;
    dlock_lock *la, *lb;
};

static void value_pair_close(struct value_pair *p)
{
    TU_FREE_LOCKS(p->la, p->lb);
    TU_CLOSE_CLIENTS(p->a, p->b);
}

/* Open P on NAME; false, with P closed and the hold released, where the
 * backend keeps no values (value_unsupported() checked it says so). */
static bool value_pair_open(struct value_pair *p, const char *name)
{
    p->a = ct_open_test(NULL);
    p->b = ct_open_test(NULL);
    p->la = tu_lock(p->a, name);
    p->lb = tu_lock(p->b, name);
    TU_ACQUIRE_OK(p->la, DLOCK_TRY);
    if (!value_unsupported(p->a, p->la))
        return true;
    TU_RELEASE_OK(p->la);
    value_pair_close(p);
    return false;
}

/* The holder writes, another client reads it with the hold's token:
 * text, bytes with a NUL, the empty value (a value, token and all), the
 * largest; a buffer too small is DLOCK_EINVAL with the length needed;
 * nothing held, a shared hold and a value too long are refused. */
TU_TEST(value_set_get, 60)
{
    struct value_pair p;
    if (!value_pair_open(&p, "val"))
        return;
    dlock_client *a = p.a, *b = p.b;
    dlock_lock *la = p.la, *lb = p.lb;
    EXPECT_RC(dlock_value_set(lb, "x", 1), DLOCK_ENOTOWNER);
    uint64_t t = token_of(la);
    expect_value(b, "val", "", 0); /* never written */
    EXPECT_RC(dlock_value_set(la, "10.0.0.7:8080", 13), DLOCK_OK);
    expect_value(b, "val", "10.0.0.7:8080", t);
    expect_value(a, "val", "10.0.0.7:8080", t);
    char small[4];
    size_t len = sizeof small;
    EXPECT_RC(dlock_value_get(b, "val", small, &len, NULL), DLOCK_EINVAL);
    ck_assert_uint_eq(len, 13);
    const char bytes[] = {'a', 0, '\n', (char)0xff, 'z'};
    EXPECT_RC(dlock_value_set(la, bytes, sizeof bytes), DLOCK_OK);
    char buf[DLOCK_VALUE_MAX];
    len = sizeof buf;
    EXPECT_RC(dlock_value_get(b, "val", buf, &len, NULL), DLOCK_OK);
    ck_assert(len == sizeof bytes && !memcmp(buf, bytes, len));
    EXPECT_RC(dlock_value_set(la, NULL, 0), DLOCK_OK);
    expect_value(b, "val", "", t);
    char *big = malloc(DLOCK_VALUE_MAX + 1);
    memset(big, 'v', DLOCK_VALUE_MAX + 1);
    EXPECT_RC(dlock_value_set(la, big, DLOCK_VALUE_MAX + 1), DLOCK_EINVAL);
    EXPECT_RC(dlock_value_set(la, big, DLOCK_VALUE_MAX), DLOCK_OK);
    len = sizeof buf;
    EXPECT_RC(dlock_value_get(b, "val", buf, &len, NULL), DLOCK_OK);
    ck_assert(len == DLOCK_VALUE_MAX && !memcmp(buf, big, len));
    free(big);
    expect_value(b, "val-other", "", 0);
    if (has(CT_SHARED)) {
        dlock_lock *r = tu_lock_mode(b, "val-shared", DLOCK_SHARED, 0);
        TU_ACQUIRE_OK(r, DLOCK_TRY);
        EXPECT_RC(dlock_value_set(r, "x", 1), DLOCK_EMISUSE);
        TU_RELEASE_OK(r);
        TU_FREE_LOCKS(r);
    }
    TU_RELEASE_OK(la);
    value_pair_close(&p);
}

/* The value outlives the release; the next holder (another client) reads
 * what the last one left, with the last one's token, and writes its own;
 * DLOCK_RELEASE_CLEAR_VALUE on an inner level clears nothing, on the
 * last level clears it (no value, token 0). */
TU_TEST(value_handed_on, 60)
{
    struct value_pair p;
    if (!value_pair_open(&p, "handoff"))
        return;
    dlock_client *a = p.a, *b = p.b;
    dlock_lock *la = p.la, *lb = p.lb;
    uint64_t t1 = token_of(la);
    EXPECT_RC(dlock_value_set(la, "checkpoint 41", 13), DLOCK_OK);
    TU_RELEASE_OK(la);
    expect_value(a, "handoff", "checkpoint 41", t1);
    TU_ACQUIRE_OK(lb, DLOCK_TRY);
    uint64_t t2 = token_of(lb);
    ck_assert_uint_gt(t2, t1);
    expect_value(b, "handoff", "checkpoint 41", t1);
    EXPECT_RC(dlock_value_set(lb, "checkpoint 42", 13), DLOCK_OK);
    TU_ACQUIRE_OK(lb, DLOCK_TRY); /* a re-entry */
    EXPECT_RC(dlock_release_ex(lb, DLOCK_RELEASE_CLEAR_VALUE), DLOCK_OK);
    expect_value(a, "handoff", "checkpoint 42", t2);
    EXPECT_RC(dlock_release_ex(lb, 2), DLOCK_EINVAL);
    ck_assert_uint_eq(dlock_hold_count(lb), 1);
    EXPECT_RC(dlock_release_ex(lb, DLOCK_RELEASE_CLEAR_VALUE), DLOCK_OK);
    ck_assert_uint_eq(dlock_hold_count(lb), 0);
    expect_value(a, "handoff", "", 0);
    TU_ACQUIRE_OK(la, DLOCK_TRY);
    expect_value(a, "handoff", "", 0);
    TU_RELEASE_OK(la);
    value_pair_close(&p);
}

/* A write after the hold was lost fails with DLOCK_ELOST in the
 * backend's own check and changes nothing: the hold force-released
 * (servers), its lock file removed (file); a later holder's value stays
 * its own; the old holder's release says DLOCK_ELOST. Then a fixed lease
 * that ran out: DLOCK_ELOST as well, nothing written. */
TU_TEST(value_after_loss, 60)
{
    struct value_pair p;
    if (!value_pair_open(&p, "gone"))
        return;
    dlock_client *a = p.a, *b = p.b;
    dlock_lock *la = p.la, *lb = p.lb;
    uint64_t t1 = token_of(la);
    EXPECT_RC(dlock_value_set(la, "before", 6), DLOCK_OK);
    if (has(CT_FORCE_LIVE)) {
        EXPECT_RC(dlock_force_release(b, "gone"), DLOCK_OK);
    } else {
        dlock_info *i = NULL;
        EXPECT_RC(dlock_inspect(b, "gone", &i), DLOCK_OK);
        ck_assert_int_eq(unlink(dlock_info_key(i)), 0);
        dlock_info_free(i);
    }
    EXPECT_RC(dlock_value_set(la, "after", 5), DLOCK_ELOST);
    ck_assert_msg(strstr(dlock_errmsg(), "gone"), "%s", dlock_errmsg());
    expect_value(b, "gone", "before", t1);
    TU_ACQUIRE_OK(lb, DLOCK_TRY);
    uint64_t t2 = token_of(lb);
    EXPECT_RC(dlock_value_set(lb, "new holder", 10), DLOCK_OK);
    EXPECT_RC(dlock_value_set(la, "stale", 5), DLOCK_ELOST);
    EXPECT_RC(dlock_release_ex(la, DLOCK_RELEASE_CLEAR_VALUE), DLOCK_ELOST);
    expect_value(a, "gone", "new holder", t2);
    TU_RELEASE_OK(lb);
    if (has(CT_LEASES) && has(CT_FIXED_LEASE)) {
        ck_assert_int_eq(dlock_lock_set_lease(la, 1000, DLOCK_LEASE_FIXED), DLOCK_OK);
        TU_ACQUIRE_OK(la, DLOCK_TRY);
        while (dlock_validity_ms(la) > 0) /* the test's time limit fails a hang */
            usleep(20 * 1000);
        EXPECT_RC(dlock_value_set(la, "late", 4), DLOCK_ELOST);
        expect_value(b, "gone", "new holder", t2);
        EXPECT_RC(dlock_release(la), DLOCK_ELOST);
    }
    value_pair_close(&p);
}

/* The other owner of value_write_races_a_takeover: force-releases the
 * name, takes it (handle-owned, so the test releases it) and writes its
 * own value. */
struct takeover {
    dlock_client *c;
    dlock_lock *l;
    const char *name; /* "race" when NULL */
    const char *key;  /* a guarded key to put, not the value */
    uint64_t token;
    int rc_force, rc_acquire, rc_set;
    atomic_bool done;
};

static void *take_over(void *arg)
{
    struct takeover *t = arg;
    t->rc_force = dlock_force_release(t->c, t->name ? t->name : "race");
    t->rc_acquire = dlock_acquire(t->l, 10000);
    if (t->rc_acquire == DLOCK_OK) {
        dlock_token(t->l, &t->token);
        t->rc_set = t->key ? dlock_guarded_put(t->l, t->key, "b", 1) : dlock_value_set(t->l, "b", 1);
    }
    atomic_store(&t->done, true);
    return NULL;
}

/* One write of the race below through L: the value, or guarded key KEY. */
static int race_write(dlock_lock *l, const char *key)
{
    return key ? dlock_guarded_put(l, key, "a", 1) : dlock_value_set(l, "a", 1);
}

/* A holder writing in a loop -- lock NAME's value, or guarded key KEY --
 * while another client force-releases the name, takes it and writes its
 * own: every write of the first holder is DLOCK_OK or DLOCK_ELOST, and
 * none lands after the second owner's -- what is left is the second
 * owner's, with its token (the backend checks the hold in the write's
 * own request). */
static void write_races_a_takeover(const char *name, const char *key)
{
    dlock_client *a = ct_open_test(NULL), *b = ct_open_test(NULL);
    dlock_lock *la = tu_lock(a, name);
    struct takeover t = {.c = b,
                         .name = name,
                         .key = key,
                         .l = tu_lock_mode(b, name, DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED)};
    TU_ACQUIRE_OK(la, DLOCK_TRY);
    EXPECT_RC(race_write(la, key), DLOCK_OK);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, take_over, &t), 0);
    int rc, written = 0;
    while ((rc = race_write(la, key)) == DLOCK_OK && !atomic_load(&t.done))
        written++;
    pthread_join(th, NULL);
    if (rc == DLOCK_OK) /* the other owner wrote meanwhile: this write must fail */
        rc = race_write(la, key);
    ck_assert_msg(rc == DLOCK_ELOST, "write %d: %s: %s", written, dlock_err_name(rc),
                  dlock_errmsg());
    ck_assert_int_eq(t.rc_force, DLOCK_OK);
    ck_assert_int_eq(t.rc_acquire, DLOCK_OK);
    ck_assert_int_eq(t.rc_set, DLOCK_OK);
    EXPECT_RC(race_write(la, key), DLOCK_ELOST);
    if (key) {
        EXPECT_RC(dlock_guarded_delete(la, key), DLOCK_ELOST);
        expect_key(a, name, key, "b", t.token);
        EXPECT_RC(dlock_guarded_delete(t.l, key), DLOCK_OK);
    } else
        expect_value(a, name, "b", t.token);
    EXPECT_RC(dlock_release(la), DLOCK_ELOST);
    TU_RELEASE_OK(t.l);
    TU_FREE_LOCKS(la, t.l);
    TU_CLOSE_CLIENTS(a, b);
}

TU_TEST(value_write_races_a_takeover, 60)
{
    if (has(CT_NO_VALUE) || !has(CT_FORCE_LIVE))
        return;
    write_races_a_takeover("race", NULL);
}

/* ------------------------------------------------------- guarded writes */


/* A backend that declares no guarded keys (CT_NO_GUARDED) answers
 * DLOCK_ENOTSUP naming itself, for put, delete and read; true then. */
static bool guarded_unsupported(dlock_client *c, dlock_lock *held)
{
    if (!has(CT_NO_GUARDED))
        return false;
    char buf[8];
    dlock_guarded_read r = {.name = "g", .key = "k", .buf = buf, .size = sizeof buf};
    EXPECT_RC(dlock_guarded_put(held, "k", "x", 1), DLOCK_ENOTSUP);
    ck_assert_msg(strstr(dlock_errmsg(), dlock_client_backend(c)), "%s", dlock_errmsg());
    EXPECT_RC(dlock_guarded_delete(held, "k"), DLOCK_ENOTSUP);
    EXPECT_RC(dlock_guarded_get(c, &r), DLOCK_ENOTSUP);
    ck_assert_msg(strstr(dlock_errmsg(), dlock_client_backend(c)), "%s", dlock_errmsg());
    return true;
}

/* The holder puts keys another client reads with the hold's token: text,
 * bytes with a NUL, empty data (a key), the largest; a delete, twice;
 * keys of two names and the name's value are apart; bad keys, a buffer
 * too small, nothing held and a shared hold are refused; keys outlive
 * the release and are no contender: the next acquirer gets the name. */
TU_TEST(guarded_put_get, 60)
{
    dlock_client *a = ct_open_test(NULL), *b = ct_open_test(NULL);
    dlock_lock *la = tu_lock(a, "g"), *lb = tu_lock(b, "g");
    TU_ACQUIRE_OK(la, DLOCK_TRY);
    if (guarded_unsupported(a, la)) {
        TU_RELEASE_OK(la);
        goto done;
    }
    EXPECT_RC(dlock_guarded_put(lb, "k", "x", 1), DLOCK_ENOTOWNER);
    uint64_t t = token_of(la);
    expect_key(b, "g", "k", "", 0); /* never written */
    EXPECT_RC(dlock_guarded_put(la, "k", "leader=10.0.0.7", 15), DLOCK_OK);
    expect_key(b, "g", "k", "leader=10.0.0.7", t);
    expect_key(b, "g", "k2", "", 0);
    expect_key(b, "g2", "k", "", 0); /* another name's store */
    EXPECT_RC(dlock_guarded_put(la, "k2", NULL, 0), DLOCK_OK);
    expect_key(a, "g", "k2", "", t); /* empty data: a key, with its token */
    if (!has(CT_NO_VALUE))
        expect_value(b, "g", "", 0); /* the value is not a key */
    char small[4];
    dlock_guarded_read r = {.name = "g", .key = "k", .buf = small, .size = sizeof small};
    EXPECT_RC(dlock_guarded_get(b, &r), DLOCK_EINVAL);
    ck_assert_uint_eq(r.len, 15);
    const char bytes[] = {'a', 0, '\n', (char)0xff, 'z'};
    EXPECT_RC(dlock_guarded_put(la, "bytes.v-1_x", bytes, sizeof bytes), DLOCK_OK);
    char *big = malloc(DLOCK_GUARDED_MAX + 1), *back = malloc(DLOCK_GUARDED_MAX);
    r = (dlock_guarded_read){.name = "g", .key = "bytes.v-1_x", .buf = back,
                             .size = DLOCK_GUARDED_MAX};
    EXPECT_RC(dlock_guarded_get(b, &r), DLOCK_OK);
    ck_assert(r.len == sizeof bytes && !memcmp(back, bytes, r.len));
    memset(big, 'v', DLOCK_GUARDED_MAX + 1);
    EXPECT_RC(dlock_guarded_put(la, "big", big, DLOCK_GUARDED_MAX + 1), DLOCK_EINVAL);
    EXPECT_RC(dlock_guarded_put(la, "big", big, DLOCK_GUARDED_MAX), DLOCK_OK);
    r = (dlock_guarded_read){.name = "g", .key = "big", .buf = back, .size = DLOCK_GUARDED_MAX};
    EXPECT_RC(dlock_guarded_get(b, &r), DLOCK_OK);
    ck_assert(r.len == DLOCK_GUARDED_MAX && !memcmp(back, big, r.len));
    free(big);
    free(back);
    char longkey[DLOCK_GUARDED_KEY_MAX + 2];
    memset(longkey, 'k', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = 0;
    const char *bad[] = {"", ".", "..", "a/b", "a:b", "a b", longkey};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        EXPECT_RC(dlock_guarded_put(la, bad[i], "x", 1), DLOCK_EINVAL);
        r = (dlock_guarded_read){.name = "g", .key = bad[i], .buf = small, .size = sizeof small};
        EXPECT_RC(dlock_guarded_get(b, &r), DLOCK_EINVAL);
    }
    longkey[DLOCK_GUARDED_KEY_MAX] = 0;
    EXPECT_RC(dlock_guarded_put(la, longkey, "x", 1), DLOCK_OK);
    expect_key(b, "g", longkey, "x", t);
    EXPECT_RC(dlock_guarded_delete(la, longkey), DLOCK_OK);
    expect_key(b, "g", longkey, "", 0);
    EXPECT_RC(dlock_guarded_delete(la, longkey), DLOCK_OK); /* gone already */
    EXPECT_RC(dlock_guarded_put(la, NULL, "x", 1), DLOCK_EINVAL);
    if (has(CT_SHARED)) {
        dlock_lock *sh = tu_lock_mode(b, "g-shared", DLOCK_SHARED, 0);
        TU_ACQUIRE_OK(sh, DLOCK_TRY);
        EXPECT_RC(dlock_guarded_put(sh, "k", "x", 1), DLOCK_EMISUSE);
        TU_RELEASE_OK(sh);
        TU_FREE_LOCKS(sh);
    }
    TU_RELEASE_OK(la);
    expect_key(b, "g", "k", "leader=10.0.0.7", t);
    TU_ACQUIRE_OK(lb, DLOCK_TRY); /* the keys hold nothing up */
    uint64_t t2 = token_of(lb);
    EXPECT_RC(dlock_guarded_put(lb, "k", "next", 4), DLOCK_OK);
    expect_key(a, "g", "k", "next", t2);
    EXPECT_RC(dlock_guarded_delete(lb, "k"), DLOCK_OK);
    EXPECT_RC(dlock_guarded_delete(lb, "k2"), DLOCK_OK);
    EXPECT_RC(dlock_guarded_delete(lb, "big"), DLOCK_OK);
    EXPECT_RC(dlock_guarded_delete(lb, "bytes.v-1_x"), DLOCK_OK);
    expect_key(a, "g", "k", "", 0);
    TU_RELEASE_OK(lb);
    TU_ACQUIRE_OK(la, DLOCK_TRY);
    TU_RELEASE_OK(la);
done:
    TU_FREE_LOCKS(la, lb);
    TU_CLOSE_CLIENTS(a, b);
}

/* A put or a delete after the hold was lost fails with DLOCK_ELOST in
 * the backend's own check and changes nothing: the hold force-released;
 * the next holder's key stays its own; the old holder's release says
 * DLOCK_ELOST. Then a fixed lease that ran out: DLOCK_ELOST, nothing
 * written. */
TU_TEST(guarded_after_loss, 60)
{
    if (has(CT_NO_GUARDED) || !has(CT_FORCE_LIVE))
        return;
    dlock_client *a = ct_open_test(NULL), *b = ct_open_test(NULL);
    dlock_lock *la = tu_lock(a, "g-gone"), *lb = tu_lock(b, "g-gone");
    TU_ACQUIRE_OK(la, DLOCK_TRY);
    uint64_t t1 = token_of(la);
    EXPECT_RC(dlock_guarded_put(la, "k", "before", 6), DLOCK_OK);
    EXPECT_RC(dlock_force_release(b, "g-gone"), DLOCK_OK);
    EXPECT_RC(dlock_guarded_put(la, "k", "after", 5), DLOCK_ELOST);
    ck_assert_msg(strstr(dlock_errmsg(), "g-gone") && strstr(dlock_errmsg(), "'k'"), "%s",
                  dlock_errmsg());
    EXPECT_RC(dlock_guarded_delete(la, "k"), DLOCK_ELOST);
    expect_key(b, "g-gone", "k", "before", t1);
    TU_ACQUIRE_OK(lb, DLOCK_TRY);
    uint64_t t2 = token_of(lb);
    EXPECT_RC(dlock_guarded_put(lb, "k", "new holder", 10), DLOCK_OK);
    EXPECT_RC(dlock_guarded_put(la, "k", "stale", 5), DLOCK_ELOST);
    EXPECT_RC(dlock_guarded_delete(la, "k"), DLOCK_ELOST);
    expect_key(a, "g-gone", "k", "new holder", t2);
    EXPECT_RC(dlock_release(la), DLOCK_ELOST);
    TU_RELEASE_OK(lb);
    if (has(CT_LEASES) && has(CT_FIXED_LEASE)) {
        ck_assert_int_eq(dlock_lock_set_lease(la, 1000, DLOCK_LEASE_FIXED), DLOCK_OK);
        TU_ACQUIRE_OK(la, DLOCK_TRY);
        while (dlock_validity_ms(la) > 0) /* the test's time limit fails a hang */
            usleep(20 * 1000);
        EXPECT_RC(dlock_guarded_put(la, "k", "late", 4), DLOCK_ELOST);
        expect_key(b, "g-gone", "k", "new holder", t2);
        EXPECT_RC(dlock_release(la), DLOCK_ELOST);
    }
    TU_ACQUIRE_OK(lb, DLOCK_TRY);
    EXPECT_RC(dlock_guarded_delete(lb, "k"), DLOCK_OK);
    TU_RELEASE_OK(lb);
    TU_FREE_LOCKS(la, lb);
    TU_CLOSE_CLIENTS(a, b);
}

/* value_write_races_a_takeover for a guarded key: none of the first
 * holder's puts lands after the second owner's. */
TU_TEST(guarded_write_races_a_takeover, 60)
{
    if (has(CT_NO_GUARDED) || !has(CT_FORCE_LIVE))
        return;
    write_races_a_takeover("g-race", "k");
}

/* A release the server never got (every server process stopped: the
 * release fails, the core drops the hold) leaves the owner's entry on
 * the server. The same owner's next acquire of the name, once the server
 * is back, replaces it rather than adopt it: a strictly greater token,
 * and its one release frees the name at once for another client (not
 * after the old entry's lease). docs/safety.md, "token repeat". File: no
 * server to lose. */
TU_TEST(release_unreachable, 60)
{
    if (!has(CT_SERVER))
        return;
    ck_assert_msg(CT->pause, "fixture %s cannot stop its server", CT->name);
    dlock_client *c = ct_open_test("timeout=500ms&connect_timeout=500ms");
    dlock_lock *l = tu_lock(c, "unsent");
    TU_ACQUIRE_OK(l, DLOCK_FOREVER);
    uint64_t t1 = token_of(l);
    CT->pause(CT, true);
    int rc = dlock_release(l);
    CT->pause(CT, false);
    ck_assert_msg(rc != DLOCK_OK, "release with the server stopped: DLOCK_OK");
    TU_ACQUIRE_OK(l, 20000);
    uint64_t t2 = token_of(l);
    ck_assert_msg(t2 > t1, "token after the failed release: %llu, before: %llu",
                  (unsigned long long)t2, (unsigned long long)t1);
    TU_RELEASE_OK(l);
    dlock_client *c2 = ct_open_test(NULL);
    dlock_lock *l2 = tu_lock(c2, "unsent");
    TU_ACQUIRE_OK(l2, DLOCK_TRY);
    TU_RELEASE_OK(l2);
    dlock_lock_free(l2);
    dlock_client_close(c2);
    dlock_lock_free(l);
    dlock_client_close(c);
}

/* dlock_client_close() with every server stopped spends at most one
 * bounded attempt (an op timeout) on what it owes -- a lock still held,
 * the cancel or delete owed by an acquire that timed out meanwhile --
 * and leaves the rest to the lease. It took two to four op timeouts (a
 * 5 s one: redis 15.0 s, etcd 20.0 s, zk 11.5 s -- the release, the
 * keeper's attempt at the owed cleanup that close waited for, close's
 * own attempt, etcd's lease revokes, ZooKeeper's wait for its session's
 * close). The bound (an op timeout and 3 s of slack) is the point of the
 * test, generous for a loaded machine. */
TU_TEST(close_bounded_on_stalled_server, 90)
{
    if (!has(CT_SERVER))
        return;
    ck_assert_msg(CT->pause, "fixture %s cannot stop its server", CT->name);
    const int64_t op_timeout_ms = 5000;
    dlock_client *c = ct_open_test("timeout=5s&lease=60s");
    dlock_lock *held = tu_lock(c, "close-held"), *owed = tu_lock(c, "close-owed");
    TU_ACQUIRE_OK(held, DLOCK_FOREVER);
    CT->pause(CT, true);
    int rc = dlock_acquire(owed, 300); /* gives up while the server is stopped: owes */
    ck_assert_msg(rc != DLOCK_OK, "acquire with the server stopped: DLOCK_OK");
    int64_t t0 = tu_mono_ms();
    dlock_client_close(c);
    int64_t took = tu_mono_ms() - t0;
    CT->pause(CT, false);
    dlock_lock_free(owed);
    dlock_lock_free(held);
    ck_assert_msg(took <= op_timeout_ms + 3000,
                  "%s: dlock_client_close() with the server stopped took %lld ms (op timeout "
                  "%lld ms)",
                  CT->name, (long long)took, (long long)op_timeout_ms);
}

/* A try (DLOCK_TRY) whose server does not answer is not "held by another
 * owner": a failure naming the server (DLOCK_ECONN, DLOCK_EUNAVAIL or
 * DLOCK_ETIMEDOUT, as the backend words a request not answered), never
 * DLOCK_EBUSY -- nobody was seen holding the lock. */
TU_TEST(try_on_stalled_server_is_not_busy, 60)
{
    if (!has(CT_SERVER))
        return;
    ck_assert_msg(CT->pause, "fixture %s cannot stop its server", CT->name);
    dlock_client *c = ct_open_test("timeout=1s");
    dlock_lock *l = tu_lock(c, "stalled-try");
    TU_ACQUIRE_OK(l, DLOCK_TRY); /* connected, the name known */
    TU_RELEASE_OK(l);
    CT->pause(CT, true);
    int rc = dlock_acquire(l, DLOCK_TRY);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", dlock_errmsg());
    CT->pause(CT, false);
    ck_assert_msg(rc != DLOCK_OK && rc != DLOCK_EBUSY && strstr(msg, "127.0.0.1") &&
                      !strstr(msg, "held by another owner"),
                  "%s: a try against a stopped server: %s: %s", CT->name, dlock_err_name(rc), msg);
    dlock_lock_free(l);
    dlock_client_close(c);
}

/* A holder of two locks stopped (SIGSTOP) past its lease: another client
 * gets both, with a greater token; the holder, resumed, is told of each
 * loss (a callback each), its releases say DLOCK_ELOST, and its client
 * then acquires again with a greater token. File: no lease, so the
 * stopped holder keeps its locks and releases them normally. */
TU_TEST(paused_holder, 90)
{
    struct ct_holder h = ct_holder_open("lease=1500ms", "contract-pause");
    char *again = tu_fmt("%s/again", h.dir);
    h.pid = fork_holder(h.url, "paused", DLOCK_EXCLUSIVE, h.dir, false);
    uint64_t t1 = ct_holder_wait(&h);
    kill(h.pid, SIGSTOP);
    dlock_client *c = tu_open(h.url);
    dlock_lock *l = tu_lock(c, "paused"), *l2 = tu_lock(c, "paused-2");
    if (has(CT_LEASES)) {
        TU_ACQUIRE_OK(l, DLOCK_FOREVER);
        ck_assert_uint_gt(token_of(l), t1);
        TU_ACQUIRE_OK(l2, DLOCK_FOREVER);
    } else {
        EXPECT_RC(dlock_acquire(l, 100), DLOCK_ETIMEDOUT);
        EXPECT_RC(dlock_acquire(l2, DLOCK_TRY), DLOCK_EBUSY);
    }
    int rc, rc2, fired, zero;
    ct_holder_resume(&h, &rc, &rc2, &fired, &zero);
    uint64_t mine = 0;
    if (has(CT_LEASES)) {
        /* Both holds of the stopped client are lost, each told once. */
        ck_assert_msg(rc == DLOCK_ELOST && rc2 == DLOCK_ELOST, "stale holder's releases: %s, %s",
                      dlock_err_name(rc), dlock_err_name(rc2));
        ck_assert_int_eq(fired, 2);
        ck_assert_msg(zero == 1, "a lost hold's validity is not 0");
        ck_assert_int_gt(dlock_validity_ms(l), 0); /* ours are untouched */
        ck_assert_int_gt(dlock_validity_ms(l2), 0);
        mine = token_of(l);
        EXPECT_RC(dlock_release(l), DLOCK_OK);
        EXPECT_RC(dlock_release(l2), DLOCK_OK);
    } else {
        ck_assert_msg(rc == DLOCK_OK && rc2 == DLOCK_OK, "holder's releases: %s, %s",
                      dlock_err_name(rc), dlock_err_name(rc2));
        ck_assert_int_eq(fired, 0);
        mine = t1;
    }
    /* The resumed holder's client serves it a new acquisition. */
    ck_assert_msg(tu_wait_file(again, 30000), "the resumed holder never acquired again");
    ck_assert_uint_gt(tu_read_u64(again), mine);
    ck_assert_int_eq(tu_wait_exit(h.pid), 0);
    TU_FREE_LOCKS(l, l2);
    dlock_client_close(c);
    free(again);
    ct_holder_close(&h);
}

/* ============================================ inspect, list, force */

TU_TEST(inspect_list_force, 30)
{
    dlock_client *c = ct_open_test("lease=5s"), *c2 = ct_open_test(NULL);
    dlock_info *info = NULL;
    EXPECT_RC(dlock_inspect(c, "never", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_held(info), 0);
    ck_assert_uint_eq(dlock_info_token(info), 0);
    ck_assert_uint_eq(dlock_info_holder_count(info), 0);
    dlock_info_free(info);

    const char *names[] = {"job-a", "job-b", "other"};
    dlock_lock *l[3];
    for (int i = 0; i < 3; i++) {
        l[i] = tu_lock(c, names[i]);
        TU_ACQUIRE_OK(l[i], DLOCK_TRY);
    }
    EXPECT_RC(dlock_inspect(c2, "job-a", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_held(info), 1);
    ck_assert_int_eq(dlock_info_mode(info), DLOCK_EXCLUSIVE);
    ck_assert_uint_eq(dlock_info_token(info), token_of(l[0]));
    ck_assert_uint_eq(dlock_info_holder_count(info), 1);
    ck_assert_ptr_nonnull(dlock_info_holder(info, 0, NULL));
    ck_assert_msg(dlock_info_key(info) && dlock_info_key(info)[0], "no key");
    int64_t ttl = dlock_info_ttl_ms(info);
    if (has(CT_LEASES))
        ck_assert_msg(ttl == -1 || (ttl > 0 && ttl <= 5000), "ttl %" PRId64 " of a 5 s lease",
                      ttl);
    else
        ck_assert_msg(ttl == DLOCK_VALID_FOREVER, "ttl %" PRId64 " without a lease", ttl);
    dlock_info_free(info);

    char **v = tu_list_names(c2, "job-*");
    ck_assert_uint_eq(tu_count_names(v), 2);
    ck_assert(tu_listed(v, "job-a") && tu_listed(v, "job-b"));
    tu_free_names(v);
    v = tu_list_names(c2, NULL);
    ck_assert_uint_eq(tu_count_names(v), 3);
    ck_assert(tu_listed(v, "other"));
    tu_free_names(v);

    EXPECT_RC(dlock_force_release(c2, "never"), DLOCK_OK); /* nothing there: fine */
    dlock_lock *o = tu_lock(c2, "job-a");
    if (has(CT_FORCE_LIVE)) {
        EXPECT_RC(dlock_force_release(c2, "job-a"), DLOCK_OK);
        EXPECT_RC(dlock_inspect(c2, "job-a", &info), DLOCK_OK);
        ck_assert_int_eq(dlock_info_held(info), 0);
        dlock_info_free(info);
        TU_ACQUIRE_OK(o, DLOCK_TRY);
        EXPECT_RC(dlock_release(l[0]), DLOCK_ELOST);
        EXPECT_RC(dlock_release(o), DLOCK_OK);
    } else {
        EXPECT_RC(dlock_force_release(c2, "job-a"), DLOCK_ENOTSUP);
        EXPECT_RC(dlock_acquire(o, DLOCK_TRY), DLOCK_EBUSY);
        EXPECT_RC(dlock_release(l[0]), DLOCK_OK);
    }
    for (int i = 1; i < 3; i++)
        EXPECT_RC(dlock_release(l[i]), DLOCK_OK);
    for (int i = 0; i < 3; i++)
        dlock_lock_free(l[i]);
    dlock_lock_free(o);
    TU_CLOSE_CLIENTS(c2, c);
}

/* ====================================================== errors, URLs */

/* A server nobody answers: DLOCK_ECONN naming host:port, and no client.
 * File: no server; a directory that is not there is DLOCK_ENOENT. */
TU_TEST(unreachable, 30)
{
    int port = tu_free_port();
    char *url = CT->unreachable_url(CT, port);
    dlock_client *c = (dlock_client *)1;
    int rc = dlock_open(url, &c);
    ck_assert_ptr_null(c);
    char *where = has(CT_SERVER) ? tu_fmt("127.0.0.1:%d", port) : tu_fmt("missing-%d", port);
    int want = has(CT_SERVER) ? DLOCK_ECONN : DLOCK_ENOENT;
    ck_assert_msg(rc == want, "%s: %s (%s)", url, dlock_err_name(rc), dlock_errmsg());
    ck_assert_msg(strstr(dlock_errmsg(), where), "message lacks %s: %s", where, dlock_errmsg());
    free(where);
    free(url);
}

static void expect_bad_url(const char *url)
{
    dlock_client *c = (dlock_client *)1;
    int rc = dlock_open(url, &c);
    ck_assert_msg(rc == DLOCK_EBADURL, "%s: %s (%s)", url, dlock_err_name(rc), dlock_errmsg());
    ck_assert_ptr_null(c);
    ck_assert_msg(strlen(dlock_errmsg()) > 10, "%s: no message", url);
}

TU_TEST(bad_urls, 30)
{
    const char *queries[] = {"bogus=1", "lease=abc", "lease=-5s", "timeout=soon"};
    for (size_t i = 0; i < sizeof queries / sizeof *queries; i++) {
        char *url = CT->url(CT, queries[i]);
        expect_bad_url(url);
        free(url);
    }
    char *plain = CT->url(CT, NULL);
    if (has(CT_SERVER) && !strstr(plain, "layout=")) {
        char *url = CT->url(CT, "layout=nonsense");
        expect_bad_url(url);
        free(url);
    }
    free(plain);
    if (has(CT_SERVER)) {
        const char *hosts[] = {"127.0.0.1:0", "127.0.0.1:99999", "127.0.0.1:12ab", "[::1"};
        for (size_t i = 0; i < sizeof hosts / sizeof *hosts; i++) {
            char *url = tu_fmt("%s://%s", CT->scheme, hosts[i]);
            expect_bad_url(url);
            free(url);
        }
    } else {
        expect_bad_url("file://");
        expect_bad_url("file://otherhost/tmp");
    }
}

/* ================================================================= CLI */

#define CLI(out, err, ...) TU_DLOCK(out, err, NULL, __VA_ARGS__)

/* NAME's bytes in hex, as name_hex shows them. */
static void hex_of(const char *name, char hex[2 * DLOCK_NAME_MAX + 1])
{
    size_t i = 0;
    for (; name[i] && i < DLOCK_NAME_MAX; i++)
        sprintf(hex + 2 * i, "%02x", (unsigned char)name[i]);
    hex[2 * i] = 0;
}

/* KEY of object O is of JSON type TYPE, or null when NULLABLE. */
static void assert_json_type(json_t *o, const char *key, json_type type, bool nullable)
{
    json_t *v = json_object_get(o, key);
    ck_assert_msg(v && (json_typeof(v) == type || (nullable && json_is_null(v))),
                  "%s: %s is %s", CT->name, key, v ? json_dumps(v, JSON_ENCODE_ANY) : "missing");
}

/* One key of a JSON object and the type of its value (NULLABLE: or
 * null; ANY_TYPE: the caller checks it). */
struct json_field {
    const char *key;
    int type;
    bool nullable;
};
#define ANY_TYPE (-1)

/* O has exactly the keys of FIELDS (ended by a NULL key), each value of
 * its type. */
static void assert_json_fields(json_t *o, const struct json_field *fields)
{
    size_t n = 0;
    for (; fields[n].key; n++)
        if (fields[n].type == ANY_TYPE)
            ck_assert_msg(json_object_get(o, fields[n].key), "%s: no \"%s\"", CT->name,
                          fields[n].key);
        else
            assert_json_type(o, fields[n].key, (json_type)fields[n].type, fields[n].nullable);
    ck_assert_msg(json_object_size(o) == n, "%s: %zu keys, want %zu", CT->name,
                  json_object_size(o), n);
}

/* One lock of status/list --json (docs/dlock.1, JSON OUTPUT): the same
 * keys and types on every backend; NAME's exact bytes in name_hex; when
 * HELD by this process, a holder whose pid, where the backend stores
 * one, is ours (file, etcd and zk do; Redis stores a client UUID and a
 * thread id); the token null only where a free name's is unknown (etcd,
 * zk). STATUS: with the master (redis+sentinel://). */
static void assert_lock_json(json_t *o, const char *name, bool held, bool status)
{
    /* redis+sentinel://, rediss+sentinel://: the master the sentinels
     * name; others none */
    bool sentinel = strstr(CT->scheme, "+sentinel") != NULL;
    /* (the status fields come last -- the lock's value, then the
     * master: without STATUS the list ends there) */
    const struct json_field fields[] = {
        {"name", JSON_STRING, false},   {"name_hex", JSON_STRING, false},
        {"backend", JSON_STRING, false}, {"kind", JSON_STRING, false},
        {"key", JSON_STRING, false},     {"held", ANY_TYPE, false},
        {"mode", JSON_STRING, !held},
        {"token", JSON_INTEGER, !held},  {"ttl_ms", JSON_INTEGER, true},
        {"delay_ms", JSON_INTEGER, false},
        {"holders", JSON_ARRAY, false},  {"waiters", JSON_ARRAY, true},
        {"waiter_count", JSON_INTEGER, true},
        {status ? "value" : NULL, JSON_STRING, true},
        {"value_token", JSON_INTEGER, true},
        {"master", JSON_STRING, !sentinel},
        {NULL, 0, false},
    };
    static const struct json_field holder_fields[] = {
        {"id", JSON_STRING, false},    {"owner", JSON_STRING, false},
        {"host", JSON_STRING, true},   {"pid", JSON_INTEGER, true},
        {"thread", JSON_INTEGER, true}, {"count", JSON_INTEGER, true},
        {NULL, 0, false},
    };
    ck_assert_msg(json_is_object(o), "%s: not an object", CT->name);
    assert_json_fields(o, fields);
    ck_assert_str_eq(json_string_value(json_object_get(o, "kind")), "lock");
    ck_assert_msg(json_is_boolean(json_object_get(o, "held")) &&
                      json_is_true(json_object_get(o, "held")) == held,
                  "%s: held", CT->name);
    json_t *w = json_object_get(o, "waiters");
    ck_assert_msg(json_is_null(w) ? json_is_null(json_object_get(o, "waiter_count"))
                                  : json_integer_value(json_object_get(o, "waiter_count")) ==
                                        (json_int_t)json_array_size(w),
                  "%s: waiter_count", CT->name);
    /* the CLI's fresh client has no counters worth a field (e864075) */
    ck_assert_msg(!json_object_get(o, "client"), "%s: a client object", CT->name);
    if (status) {
        const char *m = json_string_value(json_object_get(o, "master"));
        ck_assert_msg(!sentinel || (strncmp(m, "127.0.0.1:", 10) == 0 && atoi(m + 10) > 0),
                      "%s: master %s", CT->name, m);
        if (!sentinel)
            assert_json_type(o, "master", JSON_NULL, false);
    }
    char hex[2 * DLOCK_NAME_MAX + 1];
    hex_of(name, hex);
    ck_assert_str_eq(json_string_value(json_object_get(o, "name_hex")), hex);
    if (strstr(name, "\xe2\x82\xac")) /* valid UTF-8 stays as it is */
        ck_assert_msg(strstr(json_string_value(json_object_get(o, "name")), "\xe2\x82\xac"),
                      "%s: name %s", CT->name, json_string_value(json_object_get(o, "name")));
    json_t *holders = json_object_get(o, "holders"), *h;
    size_t i;
    bool mine = false;
    ck_assert_msg(json_array_size(holders) == (held ? 1u : 0u), "%s: %zu holders", CT->name,
                  json_array_size(holders));
    json_array_foreach(holders, i, h)
    {
        assert_json_fields(h, holder_fields);
        json_t *pid = json_object_get(h, "pid");
        /* Redis: from the holder's client record, which redlock://
         * holds do not write */
        mine = json_is_null(pid) ? strcmp(CT->name, "redlock") == 0
                                 : json_integer_value(pid) == getpid();
        if (!json_is_null(pid))
            assert_json_type(h, "host", JSON_STRING, false);
        else /* Redisson's "<uuid>:<thread>" */
            ck_assert_msg(strlen(json_string_value(json_object_get(h, "owner"))) == 36 &&
                              json_is_integer(json_object_get(h, "thread")),
                          "%s: holder %s", CT->name, json_dumps(h, 0));
    }
    ck_assert_msg(!held || mine, "%s: holder %s", CT->name, json_dumps(holders, 0));
}

/* `dlock status --json NAME` (exit WANT) and `dlock list --json`, parsed
 * by jansson (which refuses invalid UTF-8): NAME's object in each, held
 * as HELD says; list shows held names only. */
static void assert_cli_json(const char *url, const char *name, bool held)
{
    char *out = NULL, *err = NULL;
    int rc = CLI(&out, &err, "-u", url, "status", "--json", name);
    ck_assert_msg(rc == (held ? 0 : 1), "status: exit %d: %s", rc, err);
    json_error_t je;
    json_t *st = json_loads(out, 0, &je);
    ck_assert_msg(st, "%s: status --json: %s: %s", CT->name, je.text, out);
    assert_lock_json(st, name, held, true);
    json_decref(st);
    free(out);
    free(err);
    ck_assert_int_eq(CLI(&out, NULL, "-u", url, "list", "--json"), 0);
    json_t *list = json_loads(out, 0, &je), *o;
    ck_assert_msg(json_is_array(list), "%s: list --json: %s: %s", CT->name, je.text, out);
    size_t i, found = 0;
    char hex[2 * DLOCK_NAME_MAX + 1];
    hex_of(name, hex);
    json_array_foreach(list, i, o)
    {
        ck_assert_msg(json_is_true(json_object_get(o, "held")), "list shows a free name: %s", out);
        if (strcmp(json_string_value(json_object_get(o, "name_hex")), hex) == 0) {
            assert_lock_json(o, name, true, false);
            found++;
        }
    }
    ck_assert_msg(found == (held ? 1u : 0u), "%s: list --json: %s", CT->name, out);
    json_decref(list);
    free(out);
}

/* `dlock run --put KEY=VALUE` puts once COMMAND succeeded, under the
 * hold; `dlock get NAME KEY` prints it (1 and nothing when there is none).
 * A failed COMMAND puts nothing; a lock force-released while COMMAND ran
 * puts nothing and exits 75. Backends without a store: 69 for both. */
TU_TEST(cli_run_put_get, 60)
{
    char *url = ct_test_url(has(CT_LEASES) ? "lease=5s" : NULL);
    char *out = NULL, *err = NULL;
    if (has(CT_NO_GUARDED)) {
        ck_assert_int_eq(CLI(NULL, NULL, "-u", url, "get", "cli-g", "k"), 69);
        ck_assert_int_eq(CLI(NULL, NULL, "-u", url, "run", "--put", "k=v", "cli-g", "true"), 69);
        free(url);
        return;
    }
    ck_assert_int_eq(CLI(&out, NULL, "-u", url, "get", "cli-g", "k"), 1);
    ck_assert_str_eq(out, "");
    free(out);
    int rc = CLI(NULL, &err, "-u", url, "run", "--put", "k=done 1", "--put", "k2=", "cli-g", "true");
    ck_assert_msg(rc == 0, "run --put: exit %d: %s", rc, err);
    free(err);
    ck_assert_int_eq(CLI(&out, NULL, "-u", url, "get", "cli-g", "k"), 0);
    ck_assert_str_eq(out, "done 1");
    free(out);
    ck_assert_int_eq(CLI(&out, NULL, "-u", url, "get", "cli-g", "k2"), 0); /* empty: a key */
    ck_assert_str_eq(out, "");
    free(out);
    ck_assert_int_eq(CLI(NULL, NULL, "-u", url, "run", "--put", "k=again", "cli-g", "false"), 1);
    if (has(CT_FORCE_LIVE)) {
        char *force = tu_fmt("'%s' -u '%s' release --force cli-g", tu_dlock_bin(), url);
        rc = CLI(NULL, &err, "-u", url, "run", "--on-lost", "ignore", "--put", "k=late", "cli-g",
                 "-c", force);
        ck_assert_msg(rc == 75 && strstr(err, "not written"), "exit %d: %s", rc, err);
        free(err);
        free(force);
    }
    ck_assert_int_eq(CLI(&out, NULL, "-u", url, "get", "cli-g", "k"), 0);
    ck_assert_str_eq(out, "done 1");
    free(out);
    ck_assert_int_eq(CLI(NULL, NULL, "-u", url, "run", "--put", "k", "cli-g", "true"), 64);
    ck_assert_int_eq(CLI(NULL, NULL, "-u", url, "run", "--put", "a/b=1", "cli-g", "true"), 64);
    ck_assert_int_eq(CLI(NULL, NULL, "-u", url, "run", "-s", "--put", "k=1", "cli-g", "true"), 64);
    ck_assert_int_eq(CLI(NULL, NULL, "-u", url, "get", "cli-g"), 64);
    free(url);
}

/* The CLI's URLs ask for a lease where holds have one: the command
 * refuses a lease= the file backend has no use for. */
TU_TEST(cli_run_status_list_release, 60)
{
    char *url = ct_test_url(has(CT_LEASES) ? "lease=5s" : NULL);
    char *out = NULL, *err = NULL;
    uint64_t prev = 0;
    for (int i = 0; i < 2; i++) {
        int rc = CLI(&out, &err, "-u", url, "run", "cli-job", "sh", "-c", "echo $DLOCK_TOKEN");
        ck_assert_msg(rc == 0, "run: exit %d: %s", rc, err);
        uint64_t t = strtoull(out, NULL, 10);
        ck_assert_uint_gt(t, prev);
        prev = t;
        free(out);
        free(err);
    }
    /* etcd: ETCD_LOCK_KEY (NAME/<lease hex>, under the prefix) and
     * ETCD_LOCK_REV (its create revision, the token) as etcdctl lock sets
     * them; other backends: neither. */
    int rc = CLI(&out, &err, "-u", url, "run", "cli-job", "sh", "-c",
                 "echo \"${ETCD_LOCK_KEY-unset}|${ETCD_LOCK_REV-unset}|$DLOCK_TOKEN\"");
    ck_assert_msg(rc == 0, "run: exit %d: %s", rc, err);
    char key[512], rev[64], tok[64];
    ck_assert_msg(sscanf(out, "%511[^|]|%63[^|]|%63[^\n]", key, rev, tok) == 3, "%s", out);
    if (strcmp(CT->name, "etcd") == 0) {
        char *want = tu_fmt("%scli-job/", ct_prefix);
        const char *hex = strstr(key, want) ? strstr(key, want) + strlen(want) : "";
        ck_assert_msg(*hex && strlen(hex) <= 16 && strspn(hex, "0123456789abcdef") == strlen(hex),
                      "ETCD_LOCK_KEY=%s", key);
        ck_assert_str_eq(rev, tok);
        free(want);
    } else {
        ck_assert_msg(!strcmp(key, "unset") && !strcmp(rev, "unset"), "%s", out);
    }
    prev = strtoull(tok, NULL, 10);
    free(out);
    free(err);
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock(c, "cli-job");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    ck_assert_uint_gt(token_of(l), prev);
    ck_assert_int_eq(CLI(NULL, NULL, "-u", url, "run", "-n", "cli-job", "true"), 1);
    ck_assert_int_eq(CLI(&out, NULL, "-u", url, "status", "cli-job"), 0);
    ck_assert_msg(strstr(out, "held"), "status: %s", out);
    free(out);
    ck_assert_int_eq(CLI(&out, NULL, "-u", url, "status", "--json", "cli-job"), 0);
    ck_assert_msg(strstr(out, "\"held\":true") && strstr(out, "\"mode\":\"exclusive\""),
                  "status --json: %s", out);
    free(out);
    assert_cli_json(url, "cli-job", true);
    /* A name is bytes: invalid UTF-8, control bytes, quote, backslash, DEL
     * come out as valid JSON, the bytes exact in name_hex. */
    const char *hostile = "cli-\xff\xc3(\x01\x1f\"\\\x7f\xe2\x82\xac\xed\xa0\x80";
    dlock_lock *hl = tu_lock(c, hostile);
    assert_cli_json(url, hostile, false);
    TU_ACQUIRE_OK(hl, DLOCK_TRY);
    assert_cli_json(url, hostile, true);
    EXPECT_RC(dlock_release(hl), DLOCK_OK);
    assert_cli_json(url, hostile, false);
    dlock_lock_free(hl);
    ck_assert_int_eq(CLI(&out, NULL, "-u", url, "list"), 0);
    ck_assert_msg(strstr(out, "cli-job\n"), "list: %s", out);
    free(out);
    ck_assert_int_eq(CLI(&out, NULL, "-u", url, "list", "cli-*"), 0);
    ck_assert_str_eq(out, "cli-job\n");
    free(out);
    ck_assert_int_eq(CLI(&out, NULL, "-u", url, "list", "x*"), 0);
    ck_assert_str_eq(out, "");
    free(out);
    ck_assert_int_eq(CLI(&out, NULL, "-u", url, "list", "--json"), 0);
    ck_assert_msg(strstr(out, "\"cli-job\""), "list --json: %s", out);
    free(out);
    rc = CLI(NULL, &err, "-u", url, "release", "--force", "cli-job");
    if (has(CT_FORCE_LIVE)) {
        ck_assert_msg(rc == 0, "release --force: exit %d: %s", rc, err);
        ck_assert_int_eq(CLI(NULL, NULL, "-u", url, "run", "-n", "cli-job", "true"), 0);
        EXPECT_RC(dlock_release(l), DLOCK_ELOST);
    } else {
        ck_assert_msg(rc == 69, "release --force of a live holder: exit %d: %s", rc, err);
        ck_assert_msg(strchr(err, '\n') == err + strlen(err) - 1, "not one line: %s", err);
        ck_assert_int_eq(CLI(NULL, NULL, "-u", url, "run", "-n", "cli-job", "true"), 1);
        EXPECT_RC(dlock_release(l), DLOCK_OK);
    }
    free(err);
    ck_assert_int_eq(CLI(&out, NULL, "-u", url, "status", "--json", "cli-job"), 1); /* free */
    ck_assert_msg(strstr(out, "\"held\":false"), "status --json: %s", out);
    free(out);
    ck_assert_int_eq(CLI(NULL, NULL, "-u", url, "run", "cli-job", "sh", "-c", "exit 7"), 7);

    /* Nobody answers: one line naming where, exit 69 (file: the missing
     * directory is a configuration error, 78). A bad URL: 78. */
    int port = tu_free_port();
    char *dead = CT->unreachable_url(CT, port);
    char *where = has(CT_SERVER) ? tu_fmt("127.0.0.1:%d", port) : tu_fmt("missing-%d", port);
    rc = CLI(NULL, &err, "-u", dead, "run", "-n", "x", "true");
    ck_assert_msg(rc == (has(CT_SERVER) ? 69 : 78), "%s: exit %d: %s", dead, rc, err);
    ck_assert_msg(strstr(err, where) && strchr(err, '\n') == err + strlen(err) - 1,
                  "stderr: %s", err);
    free(err);
    char *bad = CT->url(CT, "bogus=1");
    ck_assert_int_eq(CLI(NULL, NULL, "-u", bad, "run", "-n", "x", "true"), 78);
    free(bad);
    free(where);
    free(dead);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(url);
}

/* Whether process PID lives (a zombie is dead: its fds are closed). */
static bool pid_alive(pid_t pid)
{
    char *path = tu_fmt("/proc/%d/stat", (int)pid), *text = tu_read_file(path);
    char *p = text ? strrchr(text, ')') : NULL;
    bool alive = p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
    free(text);
    free(path);
    return alive;
}

/* Start `dlock run NAME` with a job whose two grandchildren try to
 * outlive their lock: one stays in COMMAND's process group, one leaves it
 * (setsid); both ignore SIGTERM. Returns dlock's pid once both run, with
 * their pids in GC. */
static pid_t start_escaping_job(const char *url, const char *dir, pid_t gc[2])
{
    char *script = tu_fmt("for i in 1 2; do "
                          "  s=; [ $i = 2 ] && s=setsid; "
                          "  $s sh -c 'trap \"\" TERM; echo $$ > %s/gc$0.tmp; "
                          "mv %s/gc$0.tmp %s/gc$0; while :; do sleep 0.1; done' $i & "
                          "done; wait",
                          dir, dir, dir);
    const char *argv[] = {tu_dlock_bin(), "-u", url, "run", "--kill-after", "0.3", "escape",
                          "-c", script, NULL};
    pid_t d = tu_spawn(argv, NULL);
    for (int i = 0; i < 2; i++) {
        char *path = tu_fmt("%s/gc%d", dir, i + 1);
        ck_assert_msg(tu_wait_file(path, 30000), "grandchild %d never started", i + 1);
        char *text = tu_read_file(path);
        gc[i] = (pid_t)atoi(text);
        ck_assert_int_gt(gc[i], 0);
        unlink(path);
        free(text);
        free(path);
    }
    free(script);
    return d;
}

/* No process of a job outlives its lock, whatever the backend: kill -9
 * of dlock's process group kills the job's grandchildren too, in COMMAND's
 * process group or not (check_cli's kill9_under_load kills dlock alone), and
 * the next holder starts only once they are gone (file: the kernel keeps
 * the lock until the last of them exits; leases: it ends later anyway);
 * a lost lock (a forced release) stops them before dlock exits 75. */
TU_TEST(cli_job_never_outlives_lock, 90)
{
    char *url = ct_test_url(has(CT_LEASES) ? "lease=1500ms" : NULL);
    char *dir = tu_tmpdir("contract-escape");
    pid_t gc[2];
    pid_t d = start_escaping_job(url, dir, gc);
    kill(-d, SIGKILL); /* dlock's whole process group, as timeout(1) or a CI runner does */
    tu_wait_exit(d);
    /* The next holder looks for them as it starts. */
    char *check = tu_fmt("for p in %d %d; do s=$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null); "
                         "[ -n \"$s\" ] && [ \"$s\" != Z ] && echo \"$p alive\"; done; true",
                         (int)gc[0], (int)gc[1]);
    char *out = NULL, *err = NULL;
    int rc = CLI(&out, &err, "-u", url, "run", "escape", "-c", check);
    ck_assert_msg(rc == 0, "next holder: exit %d: %s", rc, err);
    ck_assert_msg(!*out, "the next holder ran beside the killed holder's job: %s", out);
    free(out);
    free(err);
    for (int i = 0; i < 2; i++)
        for (int waited = 0; pid_alive(gc[i]); waited += 10) {
            ck_assert_msg(waited < 30000, "grandchild %d outlived its killed dlock", i + 1);
            tu_sleep_ms(10);
        }
    if (has(CT_FORCE_LIVE)) {
        d = start_escaping_job(url, dir, gc);
        ck_assert_int_eq(CLI(NULL, NULL, "-u", url, "release", "--force", "escape"), 0);
        ck_assert_int_eq(tu_wait_exit(d), 75);
        for (int i = 0; i < 2; i++)
            ck_assert_msg(!pid_alive(gc[i]), "grandchild %d outlived the lost lock", i + 1);
    }
    free(check);
    tu_rmrf(dir);
    free(dir);
    free(url);
}

/* dlock run -s: a shared hold beside the library's readers, its own
 * token in DLOCK_TOKEN, busy (-n: exit 1) against a writer; an exclusive
 * run is busy against a reader. Backends without shared mode: shared_mode
 * asserts DLOCK_ENOTSUP. */
TU_TEST(cli_run_shared, 60)
{
    if (!has(CT_SHARED))
        return;
    char *url = ct_test_url(has(CT_LEASES) ? "lease=5s" : NULL);
    dlock_client *c = tu_open(url);
    dlock_lock *r = tu_lock_mode(c, "cli-rw", DLOCK_SHARED, 0), *w = tu_lock(c, "cli-rw");
    TU_ACQUIRE_OK(r, DLOCK_TRY);
    char *out = NULL, *err = NULL;
    int rc = CLI(&out, &err, "-u", url, "run", "-s", "-n", "cli-rw", "sh", "-c",
                 "echo $DLOCK_TOKEN");
    ck_assert_msg(rc == 0, "run -s beside a reader: exit %d: %s", rc, err);
    ck_assert_uint_gt(strtoull(out, NULL, 10), token_of(r));
    free(out);
    free(err);
    ck_assert_int_eq(CLI(NULL, NULL, "-u", url, "run", "-n", "cli-rw", "true"), 1);
    ck_assert_int_eq(CLI(&out, NULL, "-u", url, "status", "--json", "cli-rw"), 0);
    ck_assert_msg(strstr(out, "\"mode\":\"shared\""), "status --json: %s", out);
    free(out);
    EXPECT_RC(dlock_release(r), DLOCK_OK);
    TU_ACQUIRE_OK(w, DLOCK_TRY);
    ck_assert_int_eq(CLI(NULL, NULL, "-u", url, "run", "-s", "-n", "cli-rw", "true"), 1);
    EXPECT_RC(dlock_release(w), DLOCK_OK);
    ck_assert_int_eq(CLI(NULL, NULL, "-u", url, "run", "-s", "-n", "cli-rw", "true"), 0);
    TU_FREE_LOCKS(w, r);
    dlock_client_close(c);
    free(url);
}

/* dlock hold on every backend, stdin a FIFO as a coproc's pipe: one line
 * once held (etcd: with key=, as etcdctl lock prints it), the name held
 * while stdin stays open; end of input releases it (exit 0); a lock lost
 * meanwhile (a forced release, where the backend allows one) ends the
 * hold with 75. */
TU_TEST(cli_hold, 60)
{
    char *url = ct_test_url(has(CT_LEASES) ? "lease=1500ms" : NULL);
    char *dir = tu_tmpdir("contract-hold");
    for (int lose = 0; lose < (has(CT_FORCE_LIVE) ? 2 : 1); lose++) {
        char *fifo = tu_fmt("%s/in%d", dir, lose), *out = tu_fmt("%s/out%d", dir, lose);
        ck_assert_int_eq(mkfifo(fifo, 0600), 0);
        char *cmd = tu_fmt("exec '%s' -u '%s' hold held < %s > %s", tu_dlock_bin(), url, fifo, out);
        const char *argv[] = {"sh", "-c", cmd, NULL};
        pid_t d = tu_spawn(argv, NULL);
        int in = open(fifo, O_WRONLY | O_CLOEXEC); /* meets the hold's stdin */
        ck_assert_int_ge(in, 0);
        char *text = NULL;
        for (int waited = 0; !(text && strchr(text, '\n')); waited += 10) {
            ck_assert_msg(waited < 30000, "hold printed no line");
            free(text);
            tu_sleep_ms(10);
            text = tu_read_file(out);
        }
        unsigned long long token;
        ck_assert_msg(sscanf(text, "token=%llu mode=exclusive ", &token) == 1, "%s", text);
        ck_assert_msg(strstr(text, " name=held\n"), "%s", text);
        if (strcmp(CT->name, "etcd") == 0) {
            char *want = tu_fmt(" key=%sheld/", ct_prefix);
            ck_assert_msg(strstr(text, want), "%s", text);
            free(want);
        }
        ck_assert_int_eq(CLI(NULL, NULL, "-u", url, "status", "held"), 0);
        ck_assert_int_eq(CLI(NULL, NULL, "-u", url, "run", "-n", "held", "true"), 1);
        if (lose) {
            ck_assert_int_eq(CLI(NULL, NULL, "-u", url, "release", "--force", "held"), 0);
            ck_assert_int_eq(tu_wait_exit(d), 75);
        } else {
            close(in);
            ck_assert_int_eq(tu_wait_exit(d), 0);
            in = -1;
        }
        if (in >= 0)
            close(in);
        ck_assert_int_eq(CLI(NULL, NULL, "-u", url, "status", "held"), 1);
        free(text);
        free(cmd);
        free(out);
        free(fifo);
    }
    tu_rmrf(dir);
    free(dir);
    free(url);
}

/* ===================================================== descriptors */

/* Set by the test below in the child it executes: list the descriptors
 * this process was born with and exit (see main). */
#define LIST_FDS_ENV "DLOCK_CONTRACT_LIST_FDS"

static int list_fds_and_exit(void)
{
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return 2;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        long fd = strtol(de->d_name, NULL, 10);
        /* Not our directory's; valgrind keeps its own above the limit. */
        if (fd != dirfd(d) && (rl.rlim_cur == RLIM_INFINITY || (rlim_t)fd < rl.rlim_cur))
            printf("%ld\n", fd);
    }
    closedir(d);
    return 0;
}

/* What an exec'd child of a process that holds and waits for locks
 * inherits: 0, 1 and 2, none of the library's descriptors. */
TU_TEST(exec_inherits_no_descriptor, 30)
{
    /* Descriptors the process already has (Check's) stay out of the way. */
    DIR *d = opendir("/proc/self/fd");
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.' && atoi(de->d_name) > 2 && atoi(de->d_name) != dirfd(d))
            fcntl(atoi(de->d_name), F_SETFD, FD_CLOEXEC);
    closedir(d);
    struct tu_pair p = pair_open("lease=5s", "lease=5s", "fds");
    TU_ACQUIRE_OK(p.la, DLOCK_TRY);
    EXPECT_RC(dlock_acquire(p.lb, 100), DLOCK_ETIMEDOUT); /* the waiting machinery is up */
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    ck_assert_int_gt(n, 0);
    self[n] = 0;
    char *const argv[] = {self, NULL};
    char *const envp[] = {LIST_FDS_ENV "=1", NULL};
    char *buf = tu_exec_output(self, argv, envp);
    ck_assert_msg(strcmp(buf, "0\n1\n2\n") == 0,
                  "the exec'd child of a %s client inherited descriptors:\n%s", CT->name, buf);
    free(buf);
    EXPECT_RC(dlock_release(p.la), DLOCK_OK);
    tu_pair_close(&p);
}

/* ============================================================ lock-delay */

/* A backend without a lock-delay refuses ?lock_delay= at connect,
 * naming the option: true when this fixture's is such a backend (and
 * that was checked), so a lock-delay test has nothing more to do. */
static bool lock_delay_refused(void)
{
    if (has(CT_LOCK_DELAY))
        return false;
    char *url = ct_test_url("lock_delay=1s");
    dlock_client *c = NULL;
    EXPECT_RC(dlock_client_new(url, &c), DLOCK_OK);
    EXPECT_RC(dlock_client_connect(c), DLOCK_ENOTSUP);
    ck_assert_msg(strstr(dlock_errmsg(), "lock_delay"), "message without the option: %s",
                  dlock_errmsg());
    dlock_client_close(c);
    free(url);
    return true;
}

/* Try L once, again and again, until the name is refused for its
 * lock-delay (DLOCK_EBUSY with a message naming it): a grant first is a
 * name given again without its delay. The test's time limit fails a
 * backend that never says so. Then dlock_inspect() through C shows the
 * name free and in its delay. */
static void until_in_delay(dlock_client *c, dlock_lock *l)
{
    for (;;) {
        int rc = dlock_acquire(l, DLOCK_TRY);
        ck_assert_msg(rc == DLOCK_EBUSY, "try during the hold or its delay: %s (%s)",
                      dlock_err_name(rc), dlock_errmsg());
        if (strstr(dlock_errmsg(), "lock-delay"))
            break;
        tu_sleep_ms(20);
    }
    dlock_info *info = NULL;
    EXPECT_RC(dlock_inspect(c, dlock_lock_name(l), &info), DLOCK_OK);
    ck_assert_msg(!dlock_info_held(info) && dlock_info_delay_ms(info) > 0,
                  "inspect in the delay: held %d, delay %lld ms", dlock_info_held(info),
                  (long long)dlock_info_delay_ms(info));
    dlock_info_free(info);
}

/* lock_delay=: a holder killed holding (kill -9: no clean release) keeps
 * its name from the next acquirer for the delay once its lease or
 * session let go (file: at once), timed by the backend: a try then is
 * DLOCK_EBUSY naming the lock-delay, inspect shows it, and a waiting
 * acquire sleeps it out and gets the name; its clean release grants the
 * name again at once. No timing is asserted. */
TU_TEST(lock_delay_after_kill, 60)
{
    if (lock_delay_refused())
        return;
    struct ct_holder h = ct_holder_open("lease=1s&lock_delay=2s", "contract-delay");
    h.pid = fork_holder(h.url, "dl", DLOCK_EXCLUSIVE, h.dir, true);
    ct_holder_wait(&h);
    ct_holder_kill(&h);
    dlock_client *c = ct_open_test(NULL); /* no lock_delay: the holder's counts */
    dlock_lock *l = tu_lock(c, "dl");
    until_in_delay(c, l);
    TU_ACQUIRE_OK(l, 30000);
    TU_RELEASE_OK(l);
    dlock_client *c2 = ct_open_test("lock_delay=2s");
    dlock_lock *l2 = tu_lock(c2, "dl");
    TU_ACQUIRE_OK(l2, DLOCK_TRY);
    TU_RELEASE_OK(l2);
    TU_FREE_LOCKS(l, l2);
    TU_CLOSE_CLIENTS(c, c2);
    ct_holder_close(&h);
}

/* lock_delay=: a fixed lease that ran out (nothing renews it, nothing
 * released it) ends the hold without a clean release: tries are refused
 * for the delay, then granted; the late release is DLOCK_ELOST. File: no
 * lease; zk: no fixed lease (a session's end is the kill case). */
TU_TEST(lock_delay_after_lease_expiry, 60)
{
    if (lock_delay_refused() || !has(CT_LEASES) || !has(CT_FIXED_LEASE))
        return;
    dlock_client *a = ct_open_test("lock_delay=2s"), *b = ct_open_test(NULL);
    dlock_lock *la = tu_lock(a, "dle"), *lb = tu_lock(b, "dle");
    EXPECT_RC(dlock_lock_set_lease(la, 1000, DLOCK_LEASE_FIXED), DLOCK_OK);
    TU_ACQUIRE_OK(la, DLOCK_TRY);
    until_in_delay(b, lb);
    int rc;
    while ((rc = dlock_acquire(lb, DLOCK_TRY)) == DLOCK_EBUSY)
        tu_sleep_ms(20);
    ck_assert_msg(rc == DLOCK_OK, "try after the delay: %s (%s)", dlock_err_name(rc),
                  dlock_errmsg());
    EXPECT_RC(dlock_release(la), DLOCK_ELOST);
    TU_RELEASE_OK(lb);
    TU_ACQUIRE_OK(la, DLOCK_TRY); /* a clean release: no delay */
    TU_RELEASE_OK(la);
    TU_FREE_LOCKS(la, lb);
    TU_CLOSE_CLIENTS(a, b);
}

/* lock_delay=: a clean release grants the name at once, whoever asks
 * next, with or without the option. */
TU_TEST(lock_delay_clean_release, 30)
{
    if (lock_delay_refused())
        return;
    dlock_client *a = ct_open_test("lock_delay=1m"), *b = ct_open_test("lock_delay=1m");
    dlock_lock *la = tu_lock(a, "dlc"), *lb = tu_lock(b, "dlc");
    for (int i = 0; i < 2; i++) {
        TU_ACQUIRE_OK(la, DLOCK_TRY);
        TU_RELEASE_OK(la);
        TU_ACQUIRE_OK(lb, DLOCK_TRY);
        TU_RELEASE_OK(lb);
    }
    dlock_info *info = NULL;
    EXPECT_RC(dlock_inspect(a, "dlc", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_delay_ms(info), 0);
    dlock_info_free(info);
    TU_FREE_LOCKS(la, lb);
    TU_CLOSE_CLIENTS(a, b);
}

/* lock_delay=: a downgrade ends the exclusive part of a hold cleanly: a
 * reader that joins the shared hold left, and a writer after the readers'
 * clean releases, meet no lock-delay (review-core M1: redis, etcd and zk
 * kept the marker, so the joining reader or the writer waited the whole
 * delay). */
TU_TEST(lock_delay_downgrade_clean, 60)
{
    if (lock_delay_refused() || !has(CT_SHARED))
        return;
    dlock_client *a = ct_open_test("lock_delay=1m"), *b = ct_open_test(NULL);
    dlock_lock *la = tu_lock(a, "dld"), *ra = tu_lock_mode(a, "dld", DLOCK_SHARED, 0);
    dlock_lock *lb = tu_lock(b, "dld"), *rb = tu_lock_mode(b, "dld", DLOCK_SHARED, 0);
    TU_ACQUIRE_OK(la, DLOCK_TRY);
    TU_ACQUIRE_OK(ra, DLOCK_TRY);
    TU_RELEASE_OK(la); /* the downgrade */
    int rc = dlock_acquire(rb, 5000);
    ck_assert_msg(rc == DLOCK_OK, "a reader beside a downgraded hold: %s (%s)",
                  dlock_err_name(rc), dlock_errmsg());
    TU_RELEASE_OK(rb);
    TU_RELEASE_OK(ra);
    rc = dlock_acquire(lb, DLOCK_TRY);
    ck_assert_msg(rc == DLOCK_OK, "a writer after clean releases: %s (%s)", dlock_err_name(rc),
                  dlock_errmsg());
    TU_RELEASE_OK(lb);
    TU_FREE_LOCKS(la, ra, lb, rb);
    TU_CLOSE_CLIENTS(a, b);
}

/* lock_delay=: a clean release with a contender waiting hands it the
 * name at once, round after round: the waiter, woken by the release,
 * must never find the hold's marker still there and start its delay
 * (review-core M2: etcd deleted the marker in a request after the key's
 * delete). A rare race here; check_etcd's
 * lock_delay_clean_release_slow_link shows it every time. */
TU_TEST(lock_delay_clean_release_with_waiter, 120)
{
    if (lock_delay_refused())
        return;
    dlock_client *a = ct_open_test("lock_delay=1m"), *b = ct_open_test(NULL);
    dlock_lock *la = tu_lock(a, "dlw");
    dlock_lock *lb = tu_lock_mode(b, "dlw", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED);
    int bad = 0, rounds = 20;
    for (int i = 0; i < rounds; i++) {
        TU_ACQUIRE_OK(la, DLOCK_TRY);
        struct tu_waiter wb;
        tu_waiter_start_ex(&wb, lb, 4000, NULL, true);
        wait_for_waiter(a, "dlw");
        TU_RELEASE_OK(la);
        tu_waiter_join(&wb);
        if (wb.rc != DLOCK_OK) {
            bad++;
            fprintf(stderr, "round %d: the waiter got %s\n", i, dlock_err_name(wb.rc));
            dlock_force_release(a, "dlw"); /* the next round starts free */
            continue;
        }
        TU_RELEASE_OK(lb);
    }
    ck_assert_msg(bad == 0, "%d of %d waiters met a lock-delay after a clean release", bad, rounds);
    TU_FREE_LOCKS(la, lb);
    TU_CLOSE_CLIENTS(a, b);
}

/* lock_delay=: a wait for a name in its delay sleeps until the delay's
 * end and a cancel ends it at once (DLOCK_ECANCELED, the delay of a
 * minute not waited out), as a bounded wait that ends first is
 * DLOCK_ETIMEDOUT. */
TU_TEST(lock_delay_cancel, 60)
{
    if (lock_delay_refused())
        return;
    struct ct_holder h = ct_holder_open("lease=1s&lock_delay=1m", "contract-delayc");
    h.pid = fork_holder(h.url, "dlx", DLOCK_EXCLUSIVE, h.dir, true);
    ct_holder_wait(&h);
    ct_holder_kill(&h);
    dlock_client *c = ct_open_test(NULL);
    dlock_lock *l = tu_lock(c, "dlx");
    until_in_delay(c, l);
    TU_ACQUIRE_EXPECT(l, 300, DLOCK_ETIMEDOUT, "a wait shorter than the delay");
    int rc;
    ck_assert_msg(tu_canceled_wait_returns(l, true, 0, 20000, &rc),
                  "a canceled wait in the delay did not return");
    ck_assert_msg(rc == DLOCK_ECANCELED, "canceled wait: %s (%s)", dlock_err_name(rc),
                  dlock_errmsg());
    dlock_lock_free(l);
    dlock_client_close(c);
    ct_holder_close(&h);
}

/* ================================================================ suite */

/* Cases a backend is known to fail on main, each with its reason: left
 * out of that backend's run (and named on every run) so main stays green
 * until the fix lands with the line deleted. DLOCK_CONTRACT_ALL=1 runs
 * them anyway (to check a fix). */
static const struct {
    const char *backend, *test, *why;
} failing[] = {
    {NULL, NULL, NULL}, /* ends the list (which may be empty) */
};

static const char *failing_today(const char *backend, const char *test)
{
    for (size_t i = 0; i < TU_COUNT(failing) && failing[i].backend; i++)
        if (strcmp(failing[i].backend, backend) == 0 && strcmp(failing[i].test, test) == 0)
            return failing[i].why;
    return NULL;
}

/* Whether TEST runs on fixture F today: not when failing[] names it (said
 * on stderr), unless DLOCK_CONTRACT_ALL is set. */
static bool runs_today(const struct ct_fixture *f, const char *test)
{
    const char *why = getenv("DLOCK_CONTRACT_ALL") ? NULL : failing_today(f->name, test);
    if (why)
        fprintf(stderr, "contract: NOT RUN %s/%s: %s\n", f->name, test, why);
    return !why;
}

int main(void)
{
    if (getenv(LIST_FDS_ENV))
        return list_fds_and_exit();
    return ct_main("contract", "t", runs_today);
}
