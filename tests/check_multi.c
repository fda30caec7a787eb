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
 * lost callback; a member forced away before the set's release is
 * DLOCK_ELOST while the others are given back and every member's waiter
 * wakes. Tests wait on conditions, never on fixed sleeps, and
 * never assert on time.
 *
 * Beside the contract, the one-request path (the backend's multi_acquire)
 * is counted by the server itself: on Redis, INFO commandstats sees one
 * script call for a whole uncontended set (both layouts); on etcd, the
 * member's gRPC metrics see one Txn and nothing else.
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
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "contract.h"
#include "dlock.h"
#include "fixture_etcd.h"
#include "fixture_redis.h"
#include "fixture_zk.h"
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

/* Wait until none of NAMES[0..N) but SKIP is held (after 30 s, assert
 * that none is): a set that gave up its wait gives its members back
 * within what was left of it, the rest owed to the keeper, which gives
 * them back soon after. */
static void wait_none_held(dlock_client *c, const char *const *names, size_t n, const char *skip)
{
    for (size_t k = 0; k < n; k++)
        for (int i = 0; i < 3000 && (!skip || strcmp(names[k], skip) != 0) && tu_held(c, names[k]);
             i++)
            tu_sleep_ms(10);
    expect_none_held(c, names, n, skip);
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

/* A forked child's side of fork_child_frees: the parent's multi-lock
 * refuses it (DLOCK_EMISUSE), then it frees it and closes the client,
 * under an alarm. 0, or a bit per failed check. */
struct multi_of_parent {
    dlock_client *c;
    dlock_multi *m, *idle; /* held by the parent, not held */
};

static int child_frees_multi(void *arg)
{
    const struct multi_of_parent *mp = arg;
    int bad = 0;
    bad |= (dlock_multi_acquire(mp->m, DLOCK_TRY, NULL) != DLOCK_EMISUSE) << 0;
    bad |= (dlock_multi_release(mp->m) != DLOCK_EMISUSE) << 1;
    bad |= (dlock_multi_acquire(mp->idle, DLOCK_TRY, NULL) != DLOCK_EMISUSE) << 2;
    dlock_multi_free(mp->m);
    dlock_multi_free(mp->idle);
    dlock_client_close(mp->c);
    return bad;
}

/* A child after fork() that frees the multi-locks and closes the client
 * it inherited, while the parent holds one with leases its keeper renews,
 * ends at once and changes nothing: every member stays held until the
 * parent releases them, and the other set is not taken. */
TU_TEST(fork_child_frees, 60)
{
    dlock_client *c = ct_open_test("lease=2s"), *d = ct_open_test(NULL);
    const char *names[] = {"fa", "fb"}, *idle_names[] = {"fc", "fd"};
    dlock_multi *m = multi(c, names, 2), *idle = multi(c, idle_names, 2);
    EXPECT_RC(dlock_multi_acquire(m, DLOCK_TRY, NULL), DLOCK_OK);
    tu_fork_bounded(child_frees_multi, &(struct multi_of_parent){c, m, idle});
    ck_assert_int_eq(dlock_multi_held(m), 1);
    for (size_t k = 0; k < 2; k++)
        ck_assert_msg(tu_held(d, names[k]), "member '%s' not held", names[k]);
    expect_none_held(d, idle_names, 2, NULL);
    EXPECT_RC(dlock_multi_release(m), DLOCK_OK);
    expect_none_held(d, names, 2, NULL);
    tu_acquire_release(dlock_multi_lock(idle, 0), DLOCK_TRY);
    dlock_multi_free(m);
    dlock_multi_free(idle);
    dlock_client_close(c);
    dlock_client_close(d);
}

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
    wait_none_held(d, names, 3, "b");
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

/* A multi acquire in a thread of its own. */
struct multi_waiter {
    dlock_multi *m;
    dlock_cancel *cancel;
    int64_t wait;
    atomic_long tid;
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
    wait_none_held(d, names, 2, "b");
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

/* Two processes, each with its own client, take {a,b} and {b,a} in a
 * loop, waiting forever: they never deadlock (the test's time limit
 * would fail a hang) and never hold at once (a counter in shared memory
 * that holders raise and lower). */
#define ROUNDS 25
struct overlap {
    char *url;
    struct tu_inside holders;
};

/* Process I (a tu_fork_all child): ROUNDS of {a,b} (I = 0) or {b,a}. */
static int multi_rounds(int i, void *arg)
{
    struct overlap *ov = arg;
    const char *names[] = {i ? "b" : "a", i ? "a" : "b"};
    dlock_client *c = NULL;
    dlock_multi *m = NULL;
    if (dlock_open(ov->url, &c) || dlock_multi_new(c, names, 2, DLOCK_EXCLUSIVE, 0, &m))
        return 10;
    for (int r = 0; r < ROUNDS; r++) {
        if (dlock_multi_acquire(m, DLOCK_FOREVER, NULL))
            return 11;
        tu_inside_enter(&ov->holders);
        sched_yield();
        tu_inside_leave(&ov->holders);
        if (dlock_multi_release(m))
            return 12;
    }
    dlock_multi_free(m);
    dlock_client_close(c);
    return 0;
}

TU_TEST(opposite_orders_no_deadlock, 120)
{
    struct overlap *ov = tu_shared_new(sizeof *ov);
    ov->url = ct_test_url(NULL);
    tu_fork_all(2, multi_rounds, ov);
    ck_assert_int_eq(atomic_load(&ov->holders.rounds), 2 * ROUNDS);
    ck_assert_int_eq(atomic_load(&ov->holders.max), 1); /* never both at once */
    free(ov->url);
    tu_shared_free(ov, sizeof *ov);
}

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
    ct_holder_kill(&h);
    /* the time limit fails a hang */
    EXPECT_RC(dlock_multi_acquire(m, DLOCK_FOREVER, NULL), DLOCK_OK);
    uint64_t t = 0;
    EXPECT_RC(dlock_token(dlock_multi_lock(m, 0), &t), DLOCK_OK);
    ck_assert_uint_gt(t, t1);
    EXPECT_RC(dlock_multi_release(m), DLOCK_OK);
    dlock_multi_free(m);
    dlock_client_close(c);
    ct_holder_close(&h);
}

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

/* A member taken away before the set's release: the release says
 * DLOCK_ELOST (naming it) and still gives every other member back, and a
 * waiter on each member wakes -- the forced one by the force-release, the
 * others by the set's release, which must wake them itself: the holder's
 * lease is long (2 minutes), so a waiter left to sleep until it expires
 * would not be done when checked. File: nothing can be forced; the
 * release wakes every waiter. */
TU_TEST(release_lost_member_wakes_waiters, 90)
{
    bool zk = strcmp(CT->name, "zk") == 0; /* the lease is ZooKeeper's session */
    dlock_client *c = ct_open_test(zk ? NULL : "lease=120s"), *d = ct_open_test(NULL);
    const char *names[] = {"wa", "wb", "wc"};
    dlock_multi *m = multi(c, names, 3);
    EXPECT_RC(dlock_multi_acquire(m, DLOCK_TRY, NULL), DLOCK_OK);
    dlock_lock *l[3];
    struct tu_waiter w[3];
    for (size_t k = 0; k < 3; k++) {
        l[k] = tu_lock(d, names[k]);
        EXPECT_RC(dlock_acquire(l[k], DLOCK_TRY), DLOCK_EBUSY);
        memset(&w[k], 0, sizeof w[k]);
        tu_waiter_start(&w[k], l[k], DLOCK_FOREVER);
        ck_assert(tu_wait_thread_asleep(&w[k].tid, 20000));
    }
    bool forced = CT->caps & CT_FORCE_LIVE;
    if (forced) {
        EXPECT_RC(dlock_force_release(d, "wb"), DLOCK_OK);
        ck_assert_msg(tu_waiter_wait_done(&w[1], 30000), "the waiter on the forced member");
        EXPECT_RC(tu_waiter_join(&w[1]), DLOCK_OK); /* took it and gave it back */
        EXPECT_RC(dlock_multi_release(m), DLOCK_ELOST);
        ck_assert_msg(strstr(dlock_errmsg(), "'wb'"), "%s", dlock_errmsg());
    } else {
        EXPECT_RC(dlock_multi_release(m), DLOCK_OK);
    }
    for (size_t k = 0; k < 3; k++) {
        if (forced && k == 1)
            continue;
        ck_assert_msg(tu_waiter_wait_done(&w[k], 30000), "the waiter on '%s' still waits",
                      names[k]);
        EXPECT_RC(tu_waiter_join(&w[k]), DLOCK_OK);
    }
    expect_none_held(d, names, 3, NULL);
    dlock_multi_free(m);
    TU_FREE_LOCKS(l[0], l[1], l[2]);
    TU_CLOSE_CLIENTS(c, d);
}

/* ============================================= one request for the set */

/* A set of 8 names in one client; the caller counts what the server saw
 * around MEASURE's acquire. Returns the multi-lock (held). */
static const char *const eight[] = {"rt-h", "rt-c", "rt-a", "rt-g", "rt-b", "rt-f", "rt-e", "rt-d"};

#ifdef DLOCK_HAVE_REDIS
/* Calls the server counted (INFO commandstats) of the commands a client
 * sends itself -- every command but INFO and those the lock scripts run
 * inside (commandstats counts those too) -- and of EVAL + EVALSHA. */
static void redis_calls(redisContext *ctx, long long *all, long long *scripts)
{
    redisReply *r = redisCommand(ctx, "INFO commandstats");
    ck_assert_msg(r && r->str, "INFO commandstats: %s", ctx->errstr);
    *all = *scripts = 0;
    for (const char *p = r->str; (p = strstr(p, "cmdstat_")); p++) {
        char cmd[64];
        long long calls;
        if (sscanf(p, "cmdstat_%63[^:]:calls=%lld", cmd, &calls) != 2)
            continue;
        static const char *const inside[] = {"info", "hget", "hset", "hexists", "exists", "pexpire",
                                             "incr", "time", "set",  "get",     "pttl",   "type",
                                             "hdel", "del",  "hlen", "publish"};
        bool own = true;
        for (size_t k = 0; k < TU_COUNT(inside); k++)
            own &= strcmp(cmd, inside[k]) != 0;
        if (own)
            *all += calls;
        if (strcmp(cmd, "eval") == 0 || strcmp(cmd, "evalsha") == 0)
            *scripts += calls;
    }
    freeReplyObject(r);
}

/* An uncontended set of 8 costs the server one script call and no other
 * command, on both layouts; a busy member makes a try fail in one call
 * too, with nothing written; the members are ordinary holds (a plain
 * lock on one of them is busy; their tokens are their own counters'). */
TU_TEST(redis_one_script, 60)
{
    struct fx_redis r = {0};
    ck_assert_msg(fx_redis_start(&r, NULL), "redis-server could not be started");
    redisContext *raw = fx_redis_raw(&r, NULL);
    ck_assert_ptr_nonnull(raw);
    for (int simple = 0; simple < 2; simple++) {
        char *u = tu_fmt("%s%s", r.url, simple ? "?layout=simple" : "");
        dlock_client *c = tu_open(u), *d = tu_open(u);
        dlock_lock *warm = tu_lock(c, "rt-warm"); /* dials, loads the scripts */
        tu_acquire_release(warm, DLOCK_TRY);
        dlock_multi *m = multi(c, eight, 8);
        long long all0, scripts0, all1, scripts1;
        redis_calls(raw, &all0, &scripts0);
        EXPECT_RC(dlock_multi_acquire(m, 5000, NULL), DLOCK_OK);
        redis_calls(raw, &all1, &scripts1);
        ck_assert_msg(scripts1 - scripts0 == 1 && all1 - all0 == 1,
                      "layout %s: %lld script calls, %lld commands for a set of 8 (1 and 1 "
                      "expected)",
                      simple ? "simple" : "redisson", scripts1 - scripts0, all1 - all0);
        uint64_t t[8];
        for (size_t k = 0; k < 8; k++) {
            EXPECT_RC(dlock_token(dlock_multi_lock(m, k), &t[k]), DLOCK_OK);
            ck_assert_uint_gt(t[k], 0);
        }
        dlock_lock *e = tu_lock(d, "rt-e");
        EXPECT_RC(dlock_acquire(e, DLOCK_TRY), DLOCK_EBUSY);
        redis_calls(raw, &all0, &scripts0);
        EXPECT_RC(dlock_multi_release(m), DLOCK_OK);
        redis_calls(raw, &all1, &scripts1);
        ck_assert_msg(scripts1 - scripts0 == 1 && all1 - all0 == 1,
                      "layout %s: %lld script calls, %lld commands to release a set of 8 (1 "
                      "and 1 expected)",
                      simple ? "simple" : "redisson", scripts1 - scripts0, all1 - all0);
        /* e held elsewhere: the try fails in one call, naming it, and
         * nothing of the set is written. */
        TU_ACQUIRE_OK(e, DLOCK_TRY);
        uint64_t te;
        EXPECT_RC(dlock_token(e, &te), DLOCK_OK);
        redis_calls(raw, &all0, &scripts0);
        EXPECT_RC(dlock_multi_acquire(m, DLOCK_TRY, NULL), DLOCK_EBUSY);
        redis_calls(raw, &all1, &scripts1);
        ck_assert_msg(strstr(dlock_errmsg(), "'rt-e'"), "%s", dlock_errmsg());
        ck_assert_msg(all1 - all0 == 1, "%lld commands for a busy try", all1 - all0);
        expect_none_held(d, eight, 8, "rt-e");
        /* Taken again once free: every token greater than before. */
        TU_RELEASE_OK(e);
        EXPECT_RC(dlock_multi_acquire(m, 5000, NULL), DLOCK_OK);
        for (size_t k = 0; k < 8; k++) {
            uint64_t again;
            EXPECT_RC(dlock_token(dlock_multi_lock(m, k), &again), DLOCK_OK);
            ck_assert_uint_gt(again, t[k]);
            if (strcmp(dlock_lock_name(dlock_multi_lock(m, k)), "rt-e") == 0)
                ck_assert_uint_gt(again, te);
        }
        /* Freed while held: given back in one call too. */
        redis_calls(raw, &all0, &scripts0);
        dlock_multi_free(m);
        redis_calls(raw, &all1, &scripts1);
        ck_assert_msg(scripts1 - scripts0 == 1 && all1 - all0 == 1,
                      "%lld script calls, %lld commands to free a held set of 8",
                      scripts1 - scripts0, all1 - all0);
        expect_none_held(d, eight, 8, NULL);
        TU_FREE_LOCKS(e, warm);
        TU_CLOSE_CLIENTS(c, d);
        free(u);
    }
    redisFree(raw);
    fx_redis_stop(&r);
}
#endif

#ifdef DLOCK_HAVE_ETCD
/* An uncontended set of 8 on etcd is one Txn and no other request (after
 * a first acquire granted the client's session lease); a busy member
 * makes a try fail in one Txn too, with nothing written. */
TU_TEST(etcd_one_txn, 120)
{
    struct etcdf f = {0};
    ck_assert_msg(etcdf_start(&f, 1), "etcd: %s", f.error);
    char *u = etcdf_url(&f, NULL, NULL);
    dlock_client *c = tu_open(u), *d = tu_open(u);
    dlock_lock *warm = tu_lock(c, "rt-warm"); /* grants the session lease */
    tu_acquire_release(warm, DLOCK_TRY);
    dlock_multi *m = multi(c, eight, 8);
    int port = f.m[0].client_port;
    long long txn0 = etcdf_handled(port, "Txn"), all0 = etcdf_handled(port, "");
    EXPECT_RC(dlock_multi_acquire(m, 5000, NULL), DLOCK_OK);
    long long txn1 = etcdf_handled(port, "Txn"), all1 = etcdf_handled(port, "");
    ck_assert_msg(txn1 - txn0 == 1 && all1 - all0 == 1,
                  "%lld Txn, %lld requests for a set of 8 (1 and 1 expected)", txn1 - txn0,
                  all1 - all0);
    dlock_lock *e = tu_lock(d, "rt-e");
    EXPECT_RC(dlock_acquire(e, DLOCK_TRY), DLOCK_EBUSY);
    uint64_t t0;
    EXPECT_RC(dlock_token(dlock_multi_lock(m, 0), &t0), DLOCK_OK);
    txn0 = etcdf_handled(port, "Txn"), all0 = etcdf_handled(port, "");
    EXPECT_RC(dlock_multi_release(m), DLOCK_OK);
    txn1 = etcdf_handled(port, "Txn"), all1 = etcdf_handled(port, "");
    ck_assert_msg(txn1 - txn0 == 1 && all1 - all0 == 1,
                  "%lld Txn, %lld requests to release a set of 8 (1 and 1 expected)", txn1 - txn0,
                  all1 - all0);
    expect_none_held(d, eight, 8, NULL);
    TU_ACQUIRE_OK(e, DLOCK_TRY);
    all0 = etcdf_handled(port, "");
    EXPECT_RC(dlock_multi_acquire(m, DLOCK_TRY, NULL), DLOCK_EBUSY);
    all1 = etcdf_handled(port, "");
    ck_assert_msg(strstr(dlock_errmsg(), "'rt-e'"), "%s", dlock_errmsg());
    ck_assert_msg(all1 - all0 == 1, "%lld requests for a busy try", all1 - all0);
    expect_none_held(d, eight, 8, "rt-e");
    TU_RELEASE_OK(e);
    EXPECT_RC(dlock_multi_acquire(m, 5000, NULL), DLOCK_OK);
    uint64_t t1;
    EXPECT_RC(dlock_token(dlock_multi_lock(m, 0), &t1), DLOCK_OK);
    ck_assert_uint_gt(t1, t0);
    EXPECT_RC(dlock_multi_release(m), DLOCK_OK);
    /* The client's session lease revoked behind its back: the set's txn
     * finds it gone, and the set is taken member by member on a new one
     * (not failed with etcd's "requested lease not found"). */
    char *out = NULL;
    ck_assert_int_eq(etcdf_ctl(&f, &out, NULL, "lease", "list", NULL), 0);
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"))
        if (!strstr(line, "found"))
            ck_assert_int_eq(etcdf_ctl(&f, NULL, NULL, "lease", "revoke", line, NULL), 0);
    free(out);
    EXPECT_RC(dlock_multi_acquire(m, 5000, NULL), DLOCK_OK);
    EXPECT_RC(dlock_multi_release(m), DLOCK_OK);
    dlock_multi_free(m);
    TU_FREE_LOCKS(e, warm);
    TU_CLOSE_CLIENTS(c, d);
    free(u);
    etcdf_stop(&f);
}
#endif

/* ============ the give-back within the wait (Redis, Redlock, etcd, zk) */

/* Where the frame's servers come from. */
enum give_back_servers { GB_REDIS, GB_REDLOCK, GB_ETCD, GB_ZK };
#define GB_REDLOCK_NODES 3

/* A set {gb-a, gb-b} on servers of its own (op timeout 30 s), "gb-b"
 * held by another client D: the multi acquire (WAIT, with a cancel
 * object when CANCEL) takes "gb-a" and waits for "gb-b" in a thread; the
 * servers are then stopped (SIGSTOP) and, with CANCEL, the cancel fired. */
struct stalled_give_back {
    enum give_back_servers kind;
    const char *lease; /* the clients' lease */
    pid_t server[GB_REDLOCK_NODES];
    size_t nservers;
    dlock_client *c, *d;
    dlock_lock *b;
    struct multi_waiter w;
#ifdef DLOCK_HAVE_REDIS
    struct fx_redis r[GB_REDLOCK_NODES];
#endif
#ifdef DLOCK_HAVE_ETCD
    struct etcdf e;
#endif
    struct zkf z;
};

/* Start G's servers (KIND): its URL with the frame's options. */
static char *give_back_serve(struct stalled_give_back *g, enum give_back_servers kind)
{
    char *one = tu_fmt("timeout=30s&lease=%s", g->lease), *url = NULL;
    char *opts = tu_fmt("%s&node_timeout=30s", one);
    g->kind = kind;
    if (kind == GB_ZK) {
        ck_assert_msg(zkf_start(&g->z, 1), "zookeeper: %s", g->z.error);
        g->server[g->nservers++] = g->z.s[0].pid;
        url = zkf_url(&g->z, NULL, one);
    }
#ifdef DLOCK_HAVE_ETCD
    if (kind == GB_ETCD) {
        ck_assert_msg(etcdf_start(&g->e, 1), "etcd: %s", g->e.error);
        g->server[g->nservers++] = g->e.m[0].pid;
        url = etcdf_url(&g->e, NULL, one);
    }
#endif
#ifdef DLOCK_HAVE_REDIS
    if (kind == GB_REDIS || kind == GB_REDLOCK) {
        char hosts[200] = "";
        for (size_t i = 0; i < (kind == GB_REDLOCK ? GB_REDLOCK_NODES : 1); i++) {
            ck_assert_msg(fx_redis_start(&g->r[i], NULL), "redis-server could not be started");
            g->server[g->nservers++] = g->r[i].pid;
            size_t at = strlen(hosts);
            snprintf(hosts + at, sizeof hosts - at, "%s127.0.0.1:%d", i ? "," : "", g->r[i].port);
        }
        url = kind == GB_REDLOCK ? tu_fmt("redlock://%s?%s", hosts, opts)
                                 : tu_fmt("%s?%s", g->r[0].url, one);
    }
#endif
    ck_assert_msg(url, "no server of kind %d in this build", (int)kind);
    free(one);
    free(opts);
    return url;
}

/* The frame up to the stop: its clients' lease LEASE, the multi waiter
 * asleep in its wait for "gb-b". */
static void give_back_open(struct stalled_give_back *g, enum give_back_servers kind, int64_t wait,
                           bool cancel, const char *lease)
{
    *g = (struct stalled_give_back){.lease = lease, .w = {.wait = wait, .rc = 1}};
    char *u = give_back_serve(g, kind);
    g->c = tu_open(u);
    g->d = tu_open(u);
    free(u);
    g->b = tu_lock(g->d, "gb-b");
    TU_ACQUIRE_OK(g->b, DLOCK_TRY);
    const char *names[] = {"gb-a", "gb-b"};
    g->w.m = multi(g->c, names, 2);
    if (cancel)
        EXPECT_RC(dlock_cancel_new(&g->w.cancel), DLOCK_OK);
    ck_assert_int_eq(pthread_create(&g->w.thread, NULL, multi_waiter_main, &g->w), 0);
    while (!tu_held(g->d, "gb-a"))
        tu_sleep_ms(5);
#ifdef DLOCK_HAVE_REDIS
    /* Subscribed to "gb-b"'s releases on every server: the subscription's
     * confirmation wakes the waiter, whose try then goes to every server
     * (a Redlock round, which a cancel does not cut short), so asleep
     * before it says nothing. */
    for (size_t i = 0; (kind == GB_REDIS || kind == GB_REDLOCK) && i < g->nservers; i++)
        ck_assert_int_eq(fx_redis_wait_lock_subscribers(g->r[i].port, "gb-b", false, 1), 1);
#endif
    /* Asleep in its wait for "gb-b", with no request of its own left
     * unserved: a request the server has not served when it stops (a
     * thread asleep in poll() for a reply looks asleep too) would hold the
     * waiter until the request's own timeout, which a cancel does not cut
     * short. So: asleep, then a round trip of D's through the server
     * (which serves what came before it), then asleep again. */
    ck_assert_msg(tu_wait_thread_asleep(&g->w.tid, 30000), "the multi waiter never went to sleep");
    ck_assert_msg(tu_held(g->d, "gb-b"), "'gb-b' is not held");
    ck_assert_msg(tu_wait_thread_asleep(&g->w.tid, 30000), "the multi waiter never went to sleep");
}

/* give_back_open(), then the servers stopped; the cancel not fired yet. */
static void give_back_stop(struct stalled_give_back *g, enum give_back_servers kind, int64_t wait,
                           bool cancel, const char *lease)
{
    give_back_open(g, kind, wait, cancel, lease);
    for (size_t i = 0; i < g->nservers; i++)
        tu_pause(g->server[i]);
}

static void give_back_start(struct stalled_give_back *g, enum give_back_servers kind, int64_t wait,
                            bool cancel)
{
    give_back_stop(g, kind, wait, cancel, "60s");
    if (cancel)
        EXPECT_RC(dlock_cancel_fire(g->w.cancel), DLOCK_OK);
}

/* Whether the multi acquire returned while the server was still stopped:
 * given 15 s (far past the wait's end, half the op timeout a give-back
 * sent in the caller's thread would wait for). The server stays stopped. */
static bool give_back_returned_while_stopped(struct stalled_give_back *g)
{
    for (int i = 0; i < 1500; i++) {
        if (atomic_load(&g->w.rc) != 1)
            return true;
        tu_sleep_ms(10);
    }
    return false;
}

/* The server continued, the multi waiter joined: its result. */
static int give_back_continue(struct stalled_give_back *g)
{
    for (size_t i = 0; i < g->nservers; i++)
        kill(g->server[i], SIGCONT);
    pthread_join(g->w.thread, NULL);
    return atomic_load(&g->w.rc);
}

static void give_back_close(struct stalled_give_back *g)
{
    dlock_multi_free(g->w.m);
    dlock_cancel_free(g->w.cancel);
    TU_FREE_LOCKS(g->b);
    TU_CLOSE_CLIENTS(g->c, g->d);
    if (g->kind == GB_ZK)
        zkf_stop(&g->z);
#ifdef DLOCK_HAVE_ETCD
    if (g->kind == GB_ETCD)
        etcdf_stop(&g->e);
#endif
#ifdef DLOCK_HAVE_REDIS
    for (size_t i = 0; (g->kind == GB_REDIS || g->kind == GB_REDLOCK) && i < g->nservers; i++)
        fx_redis_stop(&g->r[i]);
#endif
}

/* A bounded multi acquire that times out while the server is stopped
 * returns at its end, not once the server answers: "gb-a", taken before,
 * is given back within what is left of the wait (nothing) and owed to the
 * keeper, which gives it back once the server is continued. With CANCEL
 * a wait forever is canceled instead: nothing is left of a canceled
 * wait, the give-back is owed at once. (The give-back was a release in
 * the caller's thread with the op timeout.) */
static void multi_gives_up_on_a_stalled_server(enum give_back_servers kind, bool cancel)
{
    struct stalled_give_back g;
    give_back_start(&g, kind, cancel ? DLOCK_FOREVER : 4000, cancel);
    bool returned = give_back_returned_while_stopped(&g);
    int rc = give_back_continue(&g);
    ck_assert_msg(returned, "the %s returned only once the stopped server was continued (%s)",
                  cancel ? "canceled multi wait" : "4 s multi wait", dlock_err_name(rc));
    EXPECT_RC(rc, cancel ? DLOCK_ECANCELED : DLOCK_ETIMEDOUT);
    ck_assert_int_eq(dlock_multi_held(g.w.m), 0);
    const char *a[] = {"gb-a"};
    wait_none_held(g.d, a, 1, NULL); /* the keeper gave it back */
    give_back_close(&g);
}

/* The owed give-back never ends a later hold of the same owner: while it
 * is still owed (the server stopped), the same multi-lock is acquired
 * again (60 s); once the server is continued (and "gb-b" released) that
 * acquire does what is owed first (Redis, Redlock: sends the cancel,
 * recorded on each node; etcd: forgets the key's owed delete; zk: a new
 * node, never the one owed), then holds the set, and "gb-a"'s hold
 * stays: held, the set released with DLOCK_OK (not DLOCK_ELOST). */
static void owed_give_back_spares_a_later_hold(enum give_back_servers kind)
{
    struct stalled_give_back g;
    give_back_start(&g, kind, DLOCK_FOREVER, true);
    ck_assert_msg(give_back_returned_while_stopped(&g), "the canceled multi wait did not return "
                                                        "while the server was stopped");
    struct multi_waiter again = {.m = g.w.m, .wait = 60000, .rc = 1};
    ck_assert_int_eq(pthread_create(&again.thread, NULL, multi_waiter_main, &again), 0);
    EXPECT_RC(give_back_continue(&g), DLOCK_ECANCELED);
    TU_RELEASE_OK(g.b);
    pthread_join(again.thread, NULL);
    EXPECT_RC(atomic_load(&again.rc), DLOCK_OK);
#ifdef DLOCK_HAVE_REDIS
    for (size_t i = 0; (kind == GB_REDIS || kind == GB_REDLOCK) && i < g.nservers; i++) {
        redisContext *raw = fx_redis_raw(&g.r[i], NULL);
        ck_assert_ptr_nonnull(raw);
        redisReply *rep = redisCommand(raw, "HLEN dlock_canceled:{gb-a}");
        ck_assert_msg(rep && rep->type == REDIS_REPLY_INTEGER && rep->integer >= 1,
                      "no cancel recorded for 'gb-a': the owed give-back was not sent first");
        freeReplyObject(rep);
        redisFree(raw);
    }
#endif
    ck_assert_msg(tu_held(g.d, "gb-a"), "the later hold of 'gb-a' is gone");
    ck_assert_int_eq(dlock_multi_held(g.w.m), 1);
    EXPECT_RC(dlock_multi_release(g.w.m), DLOCK_OK);
    give_back_close(&g);
}

/* The give-back of a member whose renewal the keeper has under way does
 * not wait for that renewal: "gb-a" (lease 30 s) is renewed a third of
 * its lease after it was taken, against the stopped server, a request
 * that waits until the hold's validity ends (some 19 s on); the canceled
 * multi wait fired meanwhile must still return at once, owing the
 * give-back, and the keeper gives "gb-a" back once the server is
 * continued. (The give-back waited for the renewal to return.) */
static void give_back_beside_a_renewal(enum give_back_servers kind)
{
    struct stalled_give_back g;
    give_back_stop(&g, kind, DLOCK_FOREVER, true, "30s");
    dlock_lock *a = dlock_multi_lock(g.w.m, 0);
    ck_assert_str_eq(dlock_lock_name(a), "gb-a");
    /* a second past the renewal's due time: the keeper has sent it */
    while (dlock_validity_ms(a) > 19000)
        tu_sleep_ms(20);
    EXPECT_RC(dlock_cancel_fire(g.w.cancel), DLOCK_OK);
    bool returned = give_back_returned_while_stopped(&g);
    int rc = give_back_continue(&g);
    ck_assert_msg(returned,
                  "the canceled multi wait returned only once the keeper's renewal "
                  "of 'gb-a' did (%s)",
                  dlock_err_name(rc));
    EXPECT_RC(rc, DLOCK_ECANCELED);
    ck_assert_int_eq(dlock_multi_held(g.w.m), 0);
    const char *names[] = {"gb-a"};
    wait_none_held(g.d, names, 1, NULL);
    give_back_close(&g);
}

/* A member taken before is lost while the set waits for a later one (an
 * operator's force release here; a server stalled past the lease alike)
 * and another client takes it: the set is not held, so the acquire must
 * not say DLOCK_OK once the later member is free -- it takes the set
 * again within what is left of its wait, and times out, "gb-a" being
 * D's. (It said DLOCK_OK, "gb-a" held by D and lost to M.) */
static void lost_member_is_taken_again(enum give_back_servers kind)
{
    struct stalled_give_back g;
    give_back_open(&g, kind, 15000, false, "2s");
    dlock_lock *a = dlock_multi_lock(g.w.m, 0);
    ck_assert_str_eq(dlock_lock_name(a), "gb-a");
    EXPECT_RC(dlock_force_release(g.d, "gb-a"), DLOCK_OK);
    while (atomic_load(&g.w.rc) == 1 && dlock_validity_ms(a) != 0) /* the keeper finds it lost */
        tu_sleep_ms(10);
    dlock_lock *taker = tu_lock(g.d, "gb-a"); /* (waits out a give-back of a set that gave up) */
    TU_ACQUIRE_OK(taker, 20000);
    TU_RELEASE_OK(g.b); /* the set's wait goes on */
    pthread_join(g.w.thread, NULL);
    int rc = atomic_load(&g.w.rc);
    ck_assert_msg(rc != DLOCK_OK, "the set says every member is held, 'gb-a' too, which D holds");
    EXPECT_RC(rc, DLOCK_ETIMEDOUT);
    ck_assert_int_eq(dlock_multi_held(g.w.m), 0);
    ck_assert_uint_eq(dlock_hold_count(a), 0);
    ck_assert_uint_eq(dlock_hold_count(taker), 1);
    TU_RELEASE_FREE(taker);
    give_back_close(&g);
}

#ifdef DLOCK_HAVE_REDIS
TU_TEST(lost_member_is_taken_again, 120)
{
    lost_member_is_taken_again(GB_REDIS);
}

TU_TEST(give_back_beside_a_renewal, 120)
{
    give_back_beside_a_renewal(GB_REDIS);
}

TU_TEST(multi_wait_ends_on_time_on_a_stalled_server, 90)
{
    multi_gives_up_on_a_stalled_server(GB_REDIS, false);
}

TU_TEST(canceled_multi_wait_ends_on_a_stalled_server, 90)
{
    multi_gives_up_on_a_stalled_server(GB_REDIS, true);
}

TU_TEST(owed_give_back_spares_a_later_hold, 90)
{
    owed_give_back_spares_a_later_hold(GB_REDIS);
}

TU_TEST(redlock_multi_wait_ends_on_time_on_a_stalled_server, 120)
{
    multi_gives_up_on_a_stalled_server(GB_REDLOCK, false);
}

TU_TEST(redlock_canceled_multi_wait_ends_on_a_stalled_server, 120)
{
    multi_gives_up_on_a_stalled_server(GB_REDLOCK, true);
}

TU_TEST(redlock_owed_give_back_spares_a_later_hold, 120)
{
    owed_give_back_spares_a_later_hold(GB_REDLOCK);
}
#endif

TU_TEST(zk_multi_wait_ends_on_time_on_a_stalled_server, 120)
{
    multi_gives_up_on_a_stalled_server(GB_ZK, false);
}

TU_TEST(zk_canceled_multi_wait_ends_on_a_stalled_server, 120)
{
    multi_gives_up_on_a_stalled_server(GB_ZK, true);
}

TU_TEST(zk_owed_give_back_spares_a_later_hold, 120)
{
    owed_give_back_spares_a_later_hold(GB_ZK);
}

#ifdef DLOCK_HAVE_ETCD
TU_TEST(etcd_multi_wait_ends_on_time_on_a_stalled_server, 120)
{
    multi_gives_up_on_a_stalled_server(GB_ETCD, false);
}

TU_TEST(etcd_canceled_multi_wait_ends_on_a_stalled_server, 120)
{
    multi_gives_up_on_a_stalled_server(GB_ETCD, true);
}

TU_TEST(etcd_owed_give_back_spares_a_later_hold, 120)
{
    owed_give_back_spares_a_later_hold(GB_ETCD);
}
#endif

#ifdef DLOCK_HAVE_ETCD
/* A set that times out owes the deletes of the members it took (nothing
 * was left of the wait to send them in), and the keeper's sweep deletes
 * them one after another. A member the client takes again at once (any
 * handle: an exclusive hold's key is the client's lease), while the
 * sweep is still busy with the members before it, is forgotten by the
 * sweep: the key is the later hold's now. (The sweep took the whole
 * list off the client at once, so that acquire did not find the owed
 * delete to forget, and the sweep deleted the later hold's key after it
 * was put: another client then took the name beside it.) */
#define SWEPT_MEMBERS DLOCK_MULTI_MAX
TU_TEST(etcd_owed_deletes_spare_a_member_taken_again, 120)
{
    struct etcdf f = {0};
    ck_assert_msg(etcdf_start(&f, 1), "etcd: %s", f.error);
    char *u = etcdf_url(&f, NULL, NULL);
    dlock_client *c = tu_open(u), *d = tu_open(u);
    char buf[SWEPT_MEMBERS][16];
    const char *names[SWEPT_MEMBERS];
    for (size_t i = 0; i < SWEPT_MEMBERS; i++) {
        snprintf(buf[i], sizeof buf[i], "sw-%02zu", i); /* canonical order: as given */
        names[i] = buf[i];
    }
    /* the last member busy: the set times out holding the others */
    dlock_lock *busy = tu_lock(d, names[SWEPT_MEMBERS - 1]);
    TU_ACQUIRE_OK(busy, DLOCK_TRY);
    dlock_multi *m = multi(c, names, SWEPT_MEMBERS);
    EXPECT_RC(dlock_multi_acquire(m, 2000, NULL), DLOCK_ETIMEDOUT);
    /* The members go back last first, and the keeper's first sweep takes
     * those owed by the time it wakes; the next one the rest, member 0
     * first. Once that one has begun, a member half way along it is taken
     * again long before the sweep gets there. */
    const char *first[] = {names[0]}, *taken_again = names[SWEPT_MEMBERS / 2];
    wait_none_held(d, first, 1, NULL);
    dlock_lock *again = tu_lock(c, taken_again); /* the same key: the client's lease */
    TU_ACQUIRE_OK(again, 30000);
    wait_none_held(d, names, SWEPT_MEMBERS - 1, taken_again); /* the sweeps are done */
    ck_assert_msg(tu_held(d, taken_again), "the owed delete ended the later hold");
    dlock_lock *other = tu_lock(d, taken_again);
    EXPECT_RC(dlock_acquire(other, DLOCK_TRY), DLOCK_EBUSY);
    EXPECT_RC(dlock_release(again), DLOCK_OK);
    dlock_multi_free(m);
    TU_FREE_LOCKS(busy, other, again);
    TU_CLOSE_CLIENTS(c, d);
    free(u);
    etcdf_stop(&f);
}
#endif

/* The contract on every fixture; the counted one-request tests, which
 * start servers of their own, once (in the case of their backend). */
static bool runs_on(const struct ct_fixture *f, const char *test)
{
    if (strcmp(test, "redis_one_script") == 0)
        return strcmp(f->name, "redis") == 0;
    if (strcmp(test, "etcd_one_txn") == 0 ||
        strcmp(test, "etcd_owed_deletes_spare_a_member_taken_again") == 0)
        return strcmp(f->name, "etcd") == 0;
    if (strstr(test, "stalled_server") || strstr(test, "owed_give_back_spares_a_later_hold") ||
        strstr(test, "give_back_beside_a_renewal") || strstr(test, "lost_member_is_taken_again"))
        /* etcd_*, zk_*: that backend's case; the others (redlock_* too)
         * the redis one */
        return strcmp(f->name, strncmp(test, "etcd_", 5) == 0 ? "etcd"
                               : strncmp(test, "zk_", 3) == 0 ? "zk"
                                                              : "redis") == 0;
    return true;
}

int main(void)
{
    return ct_main("multi", "m", runs_on);
}
