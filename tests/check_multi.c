/* check_multi.c -- the multi-lock's contract (dlock_multi_*, include/
 * dlock.h), written once and run against every backend of
 * tests/lib/contract.h: multi-locks are core code over ordinary lock
 * handles, so every backend has them.
 *
 * What is tested: the canonical order, member tokens and the argument
 * checks; all or nothing when one member is held elsewhere (after
 * DLOCK_EBUSY / DLOCK_ETIMEDOUT nothing of the set is held, seen with
 * dlock_inspect()); a cancel during the wait for a later member releases
 * the members already taken; two processes taking overlapping sets given
 * in opposite orders in a loop never deadlock and never overlap; kill -9
 * of a multi holder frees every member (after the lease on network
 * backends); a member taken away (force-release) fires the multi-lock's
 * lost callback. Tests wait on conditions, never on fixed sleeps, and
 * never assert on time.
 *
 * DLOCK_TEST=<substring or glob of "backend/test"> runs a subset.
 */
#include <check.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "contract.h"
#include "dlock.h"
#include "testutil.h"

/* ------------------------------------------------------------- helpers */

static dlock_multi *multi(dlock_client *c, const char *const *names, size_t n)
{
    dlock_multi *m = NULL;
    EXPECT_RC(dlock_multi_new(c, names, n, DLOCK_EXCLUSIVE, 0, &m), DLOCK_OK);
    ck_assert_ptr_nonnull(m);
    return m;
}

/* Assert that none of NAMES[0..N) is held, but for SKIP (NULL: none). */
static void expect_none_held(dlock_client *c, const char *const *names, size_t n, const char *skip)
{
    for (size_t k = 0; k < n; k++)
        if (!skip || strcmp(names[k], skip) != 0)
            ck_assert_msg(!tu_held(c, names[k]), "member '%s' still held", names[k]);
}

/* ====================================================== the contract */

/* Canonical order, tokens, held, release, argument checks. */
TU_TEST(acquire_release_order, 30)
{
    dlock_client *c = ct_open_test(NULL), *d = ct_open_test(NULL);
    const char *names[] = {"mc", "ma", "mb"};
    dlock_multi *m = multi(c, names, 3);
    ck_assert_uint_eq(dlock_multi_count(m), 3);
    ck_assert_str_eq(dlock_lock_name(dlock_multi_lock(m, 0)), "ma");
    ck_assert_str_eq(dlock_lock_name(dlock_multi_lock(m, 1)), "mb");
    ck_assert_str_eq(dlock_lock_name(dlock_multi_lock(m, 2)), "mc");
    ck_assert_ptr_null(dlock_multi_lock(m, 3));
    ck_assert_int_eq(dlock_multi_held(m), 0);
    EXPECT_RC(dlock_multi_release(m), DLOCK_ENOTOWNER);
    EXPECT_RC(dlock_multi_acquire(m, DLOCK_TRY, NULL), DLOCK_OK);
    ck_assert_int_eq(dlock_multi_held(m), 1);
    for (size_t k = 0; k < 3; k++) {
        ck_assert_msg(tu_held(d, names[k]), "member '%s' not held", names[k]);
        uint64_t t = 0;
        EXPECT_RC(dlock_token(dlock_multi_lock(m, k), &t), DLOCK_OK);
        ck_assert_uint_gt(t, 0);
        ck_assert_int_gt(dlock_validity_ms(dlock_multi_lock(m, k)), 0);
    }
    EXPECT_RC(dlock_multi_acquire(m, DLOCK_TRY, NULL), DLOCK_EMISUSE); /* no reentrancy */
    /* The holds belong to the multi-lock: another handle of the same
     * client is another owner. */
    dlock_lock *other = tu_lock(c, "mb");
    EXPECT_RC(dlock_acquire(other, DLOCK_TRY), DLOCK_EBUSY);
    EXPECT_RC(dlock_multi_release(m), DLOCK_OK);
    ck_assert_int_eq(dlock_multi_held(m), 0);
    expect_none_held(d, names, 3, NULL);
    EXPECT_RC(dlock_multi_release(m), DLOCK_ENOTOWNER);
    tu_acquire_release(other, DLOCK_TRY);
    /* Bad arguments. */
    dlock_multi *bad = (dlock_multi *)1;
    const char *twice[] = {"x", "y", "x"}, *with_null[] = {"x", NULL}, *empty[] = {"x", ""};
    EXPECT_RC(dlock_multi_new(c, twice, 3, DLOCK_EXCLUSIVE, 0, &bad), DLOCK_EINVAL);
    ck_assert_ptr_null(bad);
    EXPECT_RC(dlock_multi_new(c, with_null, 2, DLOCK_EXCLUSIVE, 0, &bad), DLOCK_EINVAL);
    EXPECT_RC(dlock_multi_new(c, empty, 2, DLOCK_EXCLUSIVE, 0, &bad), DLOCK_EINVAL);
    EXPECT_RC(dlock_multi_new(c, names, 0, DLOCK_EXCLUSIVE, 0, &bad), DLOCK_EINVAL);
    EXPECT_RC(dlock_multi_new(c, names, DLOCK_MULTI_MAX + 1, DLOCK_EXCLUSIVE, 0, &bad),
              DLOCK_EINVAL);
    EXPECT_RC(dlock_multi_new(c, names, 3, DLOCK_EXCLUSIVE, 1, &bad), DLOCK_EINVAL);
    EXPECT_RC(dlock_multi_new(c, NULL, 3, DLOCK_EXCLUSIVE, 0, &bad), DLOCK_EINVAL);
    EXPECT_RC(dlock_multi_new(c, names, 3, DLOCK_EXCLUSIVE, 0, NULL), DLOCK_EINVAL);
    ck_assert_ptr_null(bad);
    EXPECT_RC(dlock_multi_acquire(NULL, DLOCK_TRY, NULL), DLOCK_EINVAL);
    EXPECT_RC(dlock_multi_acquire(m, -5, NULL), DLOCK_EINVAL);
    EXPECT_RC(dlock_multi_release(NULL), DLOCK_EINVAL);
    ck_assert_uint_eq(dlock_multi_count(NULL), 0);
    /* Freeing a held multi-lock releases its members. */
    EXPECT_RC(dlock_multi_acquire(m, DLOCK_TRY, NULL), DLOCK_OK);
    dlock_multi_free(m);
    expect_none_held(d, names, 3, NULL);
    dlock_multi_free(NULL);
    TU_FREE_LOCKS(other);
    TU_CLOSE_CLIENTS(c, d);
}
END_TEST

/* One member held elsewhere: a try is DLOCK_EBUSY, a timed wait
 * DLOCK_ETIMEDOUT, and either way nothing of the set stays held -- the
 * member before it ("a") was taken and given back. */
TU_TEST(all_or_nothing, 30)
{
    dlock_client *c = ct_open_test(NULL), *d = ct_open_test(NULL);
    const char *names[] = {"a", "b", "c"};
    dlock_lock *b = tu_lock(d, "b");
    TU_ACQUIRE_OK(b, DLOCK_TRY);
    dlock_multi *m = multi(c, names, 3);
    EXPECT_RC(dlock_multi_acquire(m, DLOCK_TRY, NULL), DLOCK_EBUSY);
    ck_assert_msg(strstr(dlock_errmsg(), "'b'"), "message: %s", dlock_errmsg());
    ck_assert_int_eq(dlock_multi_held(m), 0);
    expect_none_held(d, names, 3, "b");
    EXPECT_RC(dlock_multi_acquire(m, 300, NULL), DLOCK_ETIMEDOUT);
    expect_none_held(d, names, 3, "b");
    ck_assert_uint_eq(dlock_hold_count(dlock_multi_lock(m, 0)), 0);
    /* Once b is free the whole set is taken. */
    TU_RELEASE_OK(b);
    EXPECT_RC(dlock_multi_acquire(m, 30000, NULL), DLOCK_OK);
    EXPECT_RC(dlock_acquire(b, DLOCK_TRY), DLOCK_EBUSY);
    EXPECT_RC(dlock_multi_release(m), DLOCK_OK);
    dlock_multi_free(m);
    TU_FREE_LOCKS(b);
    TU_CLOSE_CLIENTS(c, d);
}
END_TEST

/* A multi acquire in a thread of its own. */
struct multi_waiter {
    dlock_multi *m;
    dlock_cancel *cancel;
    int64_t wait;
    volatile long tid;
    atomic_int rc;
    pthread_t thread;
};

static void *multi_waiter_main(void *arg)
{
    struct multi_waiter *w = arg;
    w->tid = (long)syscall(SYS_gettid);
    atomic_store(&w->rc, dlock_multi_acquire(w->m, w->wait, w->cancel));
    return NULL;
}

/* A cancel fired while the multi-lock holds "a" and waits for "b"
 * (held elsewhere): the acquire returns DLOCK_ECANCELED and "a" is
 * given back. */
TU_TEST(cancel_releases_taken, 60)
{
    dlock_client *c = ct_open_test(NULL), *d = ct_open_test(NULL);
    const char *names[] = {"b", "a"};
    dlock_lock *b = tu_lock(d, "b");
    TU_ACQUIRE_OK(b, DLOCK_TRY);
    struct multi_waiter w = {.m = multi(c, names, 2), .wait = DLOCK_FOREVER, .rc = 1};
    EXPECT_RC(dlock_cancel_new(&w.cancel), DLOCK_OK);
    ck_assert_int_eq(pthread_create(&w.thread, NULL, multi_waiter_main, &w), 0);
    /* "a" taken, then the thread asleep in its wait for "b". */
    while (!tu_held(d, "a"))
        tu_sleep_ms(5);
    ck_assert_msg(tu_wait_thread_asleep(&w.tid, 30000), "the multi waiter never went to sleep");
    ck_assert_int_eq(atomic_load(&w.rc), 1);
    EXPECT_RC(dlock_cancel_fire(w.cancel), DLOCK_OK);
    pthread_join(w.thread, NULL);
    EXPECT_RC(atomic_load(&w.rc), DLOCK_ECANCELED);
    ck_assert_msg(!tu_held(d, "a"), "'a' still held after the cancel");
    ck_assert_int_eq(dlock_multi_held(w.m), 0);
    /* A fired object refuses at once, taking nothing. */
    TU_RELEASE_OK(b);
    EXPECT_RC(dlock_multi_acquire(w.m, DLOCK_FOREVER, w.cancel), DLOCK_ECANCELED);
    expect_none_held(d, names, 2, NULL);
    dlock_multi_free(w.m);
    dlock_cancel_free(w.cancel);
    TU_FREE_LOCKS(b);
    TU_CLOSE_CLIENTS(c, d);
}
END_TEST

/* Two processes, each with its own client, take {a,b} and {b,a} in a
 * loop, waiting forever: they never deadlock (the test's time limit
 * would fail a hang) and never hold at once (a counter in shared memory
 * that holders raise and lower). */
#define ROUNDS 25
struct overlap {
    atomic_int now, over, rounds;
};

static pid_t fork_looper(const char *url, const char *first, const char *second,
                         struct overlap *ov)
{
    pid_t pid = tu_fork();
    if (pid > 0)
        return pid;
    const char *names[] = {first, second};
    dlock_client *c = NULL;
    dlock_multi *m = NULL;
    if (dlock_open(url, &c) || dlock_multi_new(c, names, 2, DLOCK_EXCLUSIVE, 0, &m))
        _exit(10);
    for (int r = 0; r < ROUNDS; r++) {
        if (dlock_multi_acquire(m, DLOCK_FOREVER, NULL))
            _exit(11);
        if (atomic_fetch_add(&ov->now, 1) != 0)
            atomic_fetch_add(&ov->over, 1);
        sched_yield();
        atomic_fetch_sub(&ov->now, 1);
        atomic_fetch_add(&ov->rounds, 1);
        if (dlock_multi_release(m))
            _exit(12);
    }
    dlock_multi_free(m);
    dlock_client_close(c);
    _exit(0);
}

TU_TEST(opposite_orders_no_deadlock, 120)
{
    struct overlap *ov = mmap(NULL, sizeof *ov, PROT_READ | PROT_WRITE,
                              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(ov, MAP_FAILED);
    memset(ov, 0, sizeof *ov);
    char *url = ct_test_url(NULL);
    pid_t p1 = fork_looper(url, "a", "b", ov), p2 = fork_looper(url, "b", "a", ov);
    ck_assert_int_eq(tu_wait_exit(p1), 0);
    ck_assert_int_eq(tu_wait_exit(p2), 0);
    ck_assert_int_eq(atomic_load(&ov->rounds), 2 * ROUNDS);
    ck_assert_int_eq(atomic_load(&ov->over), 0);
    free(url);
    munmap(ov, sizeof *ov);
}
END_TEST

/* kill -9 of a process holding a multi-lock: every member comes back
 * (file: at once; otherwise when the lease ends) and a forever waiter
 * takes the set. */
TU_TEST(kill9_holder, 60)
{
    struct ct_holder h = ct_holder_open("lease=1500ms", "multi-kill9");
    const char *names[] = {"k3", "k1", "k2"};
    h.pid = tu_fork();
    if (h.pid == 0) {
        dlock_client *c = NULL;
        dlock_multi *m = NULL;
        uint64_t t = 0;
        if (dlock_open(h.url, &c) || dlock_multi_new(c, names, 3, DLOCK_EXCLUSIVE, 0, &m) ||
            dlock_multi_acquire(m, 30000, NULL) || dlock_token(dlock_multi_lock(m, 0), &t))
            _exit(10);
        ct_holder_held(h.dir, t, true);
        _exit(0);
    }
    uint64_t t1 = ct_holder_wait(&h);
    dlock_client *c = tu_open(h.url);
    for (size_t k = 0; k < 3; k++)
        ck_assert_msg(tu_held(c, names[k]), "member '%s' not held", names[k]);
    dlock_multi *m = multi(c, names, 3);
    EXPECT_RC(dlock_multi_acquire(m, DLOCK_TRY, NULL), DLOCK_EBUSY);
    kill(h.pid, SIGKILL);
    tu_wait_exit(h.pid);
    EXPECT_RC(dlock_multi_acquire(m, DLOCK_FOREVER, NULL), DLOCK_OK); /* the time limit fails a hang */
    uint64_t t = 0;
    EXPECT_RC(dlock_token(dlock_multi_lock(m, 0), &t), DLOCK_OK);
    ck_assert_uint_gt(t, t1);
    EXPECT_RC(dlock_multi_release(m), DLOCK_OK);
    dlock_multi_free(m);
    dlock_client_close(c);
    ct_holder_close(&h);
}
END_TEST

/* A member taken away by an operator: the multi-lock's callback names
 * it, and the release gives the others back and says DLOCK_ELOST. File:
 * a live holder's lock cannot be taken (DLOCK_ENOTSUP). */
struct multi_lost {
    atomic_int fired;
    char member[64];
};

static void on_multi_lost(dlock_multi *m, dlock_lock *member, const char *why, void *arg)
{
    (void)m;
    (void)why;
    struct multi_lost *ml = arg;
    snprintf(ml->member, sizeof ml->member, "%s", dlock_lock_name(member));
    atomic_fetch_add(&ml->fired, 1);
}

TU_TEST(member_lost, 60)
{
    dlock_client *c = ct_open_test("lease=900ms"), *d = ct_open_test(NULL);
    const char *names[] = {"la", "lb", "lc"};
    dlock_multi *m = multi(c, names, 3);
    static struct multi_lost ml;
    EXPECT_RC(dlock_multi_on_lost(m, on_multi_lost, &ml), DLOCK_OK);
    EXPECT_RC(dlock_multi_on_lost(NULL, on_multi_lost, &ml), DLOCK_EINVAL);
    EXPECT_RC(dlock_multi_acquire(m, DLOCK_TRY, NULL), DLOCK_OK);
    if (!(CT->caps & CT_FORCE_LIVE)) {
        EXPECT_RC(dlock_force_release(d, "lb"), DLOCK_ENOTSUP);
        EXPECT_RC(dlock_multi_release(m), DLOCK_OK);
    } else {
        EXPECT_RC(dlock_force_release(d, "lb"), DLOCK_OK);
        for (int i = 0; i < 3000 && atomic_load(&ml.fired) == 0; i++)
            tu_sleep_ms(10); /* waiting for the keeper's renewal to find it */
        ck_assert_int_eq(atomic_load(&ml.fired), 1);
        ck_assert_str_eq(ml.member, "lb");
        EXPECT_RC(dlock_multi_release(m), DLOCK_ELOST);
    }
    expect_none_held(d, names, 3, NULL);
    dlock_multi_free(m);
    TU_CLOSE_CLIENTS(c, d);
}
END_TEST

int main(void)
{
    return ct_main("multi", "m", NULL);
}
