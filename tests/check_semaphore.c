/* check_semaphore.c -- the counting semaphore's contract, written once
 * and run against every backend of tests/lib/contract.h that has
 * semaphores; a backend without them is held to its documented
 * DLOCK_ENOTSUP instead of being skipped.
 *
 * What is tested: N+1 processes over N permits never have more than N
 * holders at once (a counter in shared memory that holders raise and
 * lower), tokens and K-at-once acquires, try/timed/forever waits and
 * their cancels, a wrong permit count, permits coming back after kill -9
 * of their holder and after a holder paused past its lease (with its
 * lost callback), renewals keeping a permit, and freeing the semaphore
 * giving its permits back. Tests wait on conditions (marker files, a
 * thread asleep in the kernel), never on fixed sleeps, and never assert
 * on time.
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
#include "testutil.h"

/* The fixtures whose backend has semaphores (docs/backends.md). */
static bool has_semaphores(const struct ct_fixture *f)
{
    return strcmp(f->name, "file") == 0 || strncmp(f->name, "redis", 5) == 0 ||
           strcmp(f->name, "zk") == 0 || strncmp(f->name, "etcd", 4) == 0 ||
           strcmp(f->name, "mysql") == 0 || strcmp(f->name, "postgres") == 0;
}

/* Whether the layout stores the permit count (Curator's, on zk, keeps
 * none: each client brings its own). */
static bool stores_count(void)
{
    return strcmp(CT->name, "zk") != 0;
}

static bool leases(void)
{
    return (CT->caps & CT_LEASES) != 0;
}

/* ------------------------------------------------------------- helpers */

static void expect_busy(dlock_semaphore *s, unsigned k)
{
    dlock_permit *p = (dlock_permit *)1;
    EXPECT_RC(dlock_semaphore_acquire(s, k, DLOCK_TRY, NULL, &p), DLOCK_EBUSY);
    ck_assert_ptr_null(p);
}

static uint64_t token_of(dlock_permit *p)
{
    uint64_t t = 0;
    EXPECT_RC(dlock_permit_token(p, &t), DLOCK_OK);
    return t;
}

/* dlock_semaphore_inspect(), asserting it worked. */
static dlock_info *look(dlock_client *c, const char *name, unsigned permits)
{
    dlock_info *i = NULL;
    EXPECT_RC(dlock_semaphore_inspect(c, name, permits, &i), DLOCK_OK);
    return i;
}

static void expect_free(dlock_client *c, const char *name, unsigned permits, long free_permits)
{
    dlock_info *i = look(c, name, permits);
    ck_assert_uint_eq(dlock_info_permits(i), permits);
    ck_assert_int_eq(dlock_info_free_permits(i), free_permits);
    ck_assert_int_eq(dlock_info_held(i), free_permits < (long)permits);
    dlock_info_free(i);
}

/* EXPECT_FREE once a given-up wait's key is gone: a wait canceled or
 * timed out withdraws its key within a grace and owes the rest to the
 * keeper (dlock.h: another client may see it a moment after the call
 * returns), so the count is awaited, up to 20 s, not read once. */
static void expect_free_soon(dlock_client *c, const char *name, unsigned permits, long free_permits)
{
    for (int tries = 0; tries < 400; tries++) {
        dlock_info *i = look(c, name, permits);
        long now = dlock_info_free_permits(i);
        dlock_info_free(i);
        if (now == free_permits)
            break;
        tu_sleep_ms(50);
    }
    expect_free(c, name, permits, free_permits);
}

/* A taker thread (testutil) started and seen asleep in its wait. */
static void taker_start(struct tu_sem_taker *t, dlock_semaphore *s, unsigned k, int64_t wait,
                        dlock_cancel *cancel)
{
    tu_sem_taker_start(t, s, k, wait, cancel);
    ck_assert_msg(tu_wait_thread_asleep(&t->tid, 30000), "the taker never went to sleep");
}

/* ====================================================== the contract */

/* Permits, tokens, K at once, inspect. */
TU_TEST(acquire_release_token, 30)
{
    dlock_client *a = ct_open_test(NULL), *b = ct_open_test(NULL);
    dlock_semaphore *sa = tu_semaphore(a, "jobs", 3), *sb = tu_semaphore(b, "jobs", 3);
    ck_assert_str_eq(dlock_semaphore_name(sa), "jobs");
    ck_assert_uint_eq(dlock_semaphore_permits(sa), 3);
    expect_free(b, "jobs", 3, 3);
    dlock_permit *p1 = tu_permit(sa, 1, DLOCK_TRY), *p2 = tu_permit(sb, 1, DLOCK_TRY);
    ck_assert_uint_gt(token_of(p2), token_of(p1));
    ck_assert_str_ne(dlock_permit_id(p1), dlock_permit_id(p2));
    int64_t v = dlock_permit_validity_ms(p1);
    ck_assert_msg(leases() ? v > 0 && v < DLOCK_VALID_FOREVER : v == DLOCK_VALID_FOREVER,
                  "validity %" PRId64, v);
    expect_busy(sb, 2); /* one free, two asked: none taken */
    expect_free(a, "jobs", 3, 1);
    dlock_permit *p3 = tu_permit(sa, 1, DLOCK_TRY); /* the same client twice: no reentrancy */
    expect_busy(sb, 1);
    dlock_info *i = look(b, "jobs", 3);
    ck_assert_uint_eq(dlock_info_permits(i), 3);
    ck_assert_uint_eq(dlock_info_holder_count(i), 3);
    bool seen = false;
    for (size_t k = 0; k < 3; k++) {
        unsigned n = 0;
        seen |= strcmp(dlock_info_holder(i, k, &n), dlock_permit_id(p2)) == 0;
        ck_assert_uint_eq(n, 1);
    }
    ck_assert_msg(seen, "permit %s not among the holders", dlock_permit_id(p2));
    dlock_info_free(i);
    EXPECT_RC(dlock_permit_release(p1), DLOCK_OK);
    EXPECT_RC(dlock_permit_release(p2), DLOCK_OK);
    /* Two at once, in one permit object, from the other client. */
    dlock_permit *p4 = tu_permit(sb, 2, DLOCK_TRY);
    ck_assert_uint_gt(token_of(p4), token_of(p3));
    expect_free(a, "jobs", 3, 0);
    i = look(a, "jobs", 3);
    ck_assert_uint_eq(dlock_info_holder_count(i), 2); /* p3, and p4 counting 2 */
    dlock_info_free(i);
    EXPECT_RC(dlock_permit_release(p4), DLOCK_OK);
    EXPECT_RC(dlock_permit_release(p3), DLOCK_OK);
    expect_free(b, "jobs", 3, 3);
    /* Bad arguments. */
    dlock_permit *p = NULL;
    EXPECT_RC(dlock_semaphore_acquire(sa, 0, DLOCK_TRY, NULL, &p), DLOCK_EINVAL);
    EXPECT_RC(dlock_semaphore_acquire(sa, 4, DLOCK_TRY, NULL, &p), DLOCK_EINVAL);
    EXPECT_RC(dlock_semaphore_acquire(NULL, 1, DLOCK_TRY, NULL, &p), DLOCK_EINVAL);
    EXPECT_RC(dlock_permit_release(NULL), DLOCK_EINVAL);
    dlock_semaphore *bad = NULL;
    EXPECT_RC(dlock_semaphore_new(a, "jobs", 0, 0, &bad), DLOCK_EINVAL);
    EXPECT_RC(dlock_semaphore_new(a, "jobs", DLOCK_PERMITS_MAX + 1, 0, &bad), DLOCK_EINVAL);
    EXPECT_RC(dlock_semaphore_new(a, "jobs", 1, 4, &bad), DLOCK_EINVAL);
    EXPECT_RC(dlock_semaphore_new(a, "", 1, 0, &bad), DLOCK_EINVAL);
    ck_assert_ptr_null(bad);
    dlock_semaphore_free(sa);
    dlock_semaphore_free(sb);
    TU_CLOSE_CLIENTS(a, b);
}

/* N+1 processes (and two threads each) over N permits: never more than
 * N holders at once, counted in shared memory by the holders. */
#define HOLDER_ROUNDS 40
struct shared_count {
    char *url;
    struct tu_inside holders;
    atomic_int over; /* times a holder found more than the permits inside */
};

static void holder_rounds(dlock_semaphore *s, struct shared_count *sc, unsigned permits)
{
    for (int r = 0; r < HOLDER_ROUNDS; r++) {
        dlock_permit *p = NULL;
        if (dlock_semaphore_acquire(s, 1, DLOCK_FOREVER, NULL, &p))
            _exit(11);
        if (tu_inside_enter(&sc->holders) > (int)permits)
            atomic_fetch_add(&sc->over, 1);
        sched_yield();
        tu_inside_leave(&sc->holders);
        if (dlock_permit_release(p))
            _exit(12);
    }
}

struct holder_thread {
    dlock_semaphore *s;
    struct shared_count *sc;
    unsigned permits;
};

static void *holder_thread_main(void *arg)
{
    struct holder_thread *h = arg;
    holder_rounds(h->s, h->sc, h->permits);
    return NULL;
}

enum { PERMITS = 3 };

/* A process of never_exceed (a tu_fork_all child): HOLDER_ROUNDS in two
 * threads on one client. */
static int hold_in_two_threads(int i, void *arg)
{
    (void)i;
    struct shared_count *sc = arg;
    dlock_client *c = NULL;
    dlock_semaphore *s = NULL;
    if (dlock_open(sc->url, &c) || dlock_semaphore_new(c, "pool", PERMITS, 0, &s))
        return 10;
    struct holder_thread h = {s, sc, PERMITS};
    pthread_t th;
    if (pthread_create(&th, NULL, holder_thread_main, &h))
        return 13;
    holder_rounds(s, sc, PERMITS);
    pthread_join(th, NULL);
    dlock_semaphore_free(s);
    dlock_client_close(c);
    return 0;
}

TU_TEST(never_exceed, 120)
{
    enum { PROCS = PERMITS + 1 };
    struct shared_count *sc = tu_shared_new(sizeof *sc);
    sc->url = ct_test_url(NULL);
    tu_fork_all(PROCS, hold_in_two_threads, sc);
    ck_assert_int_eq(atomic_load(&sc->holders.rounds), PROCS * 2 * HOLDER_ROUNDS);
    ck_assert_msg(atomic_load(&sc->over) == 0 && atomic_load(&sc->holders.max) <= PERMITS,
                  "%d holders at once over %d permits (%d times)",
                  atomic_load(&sc->holders.max), PERMITS, atomic_load(&sc->over));
    dlock_client *c = ct_open_test(NULL);
    expect_free(c, "pool", PERMITS, PERMITS);
    dlock_client_close(c);
    free(sc->url);
    tu_shared_free(sc, sizeof *sc);
}

/* Try, timed and forever waits; a release wakes a waiter; cancels. */
TU_TEST(waits_cancel, 30)
{
    dlock_client *a = ct_open_test(NULL), *b = ct_open_test(NULL);
    dlock_semaphore *sa = tu_semaphore(a, "w", 2), *sb = tu_semaphore(b, "w", 2);
    dlock_permit *p = tu_permit(sa, 2, DLOCK_TRY);
    expect_busy(sb, 1);
    dlock_permit *q = (dlock_permit *)1;
    EXPECT_RC(dlock_semaphore_acquire(sb, 1, 100, NULL, &q), DLOCK_ETIMEDOUT);
    ck_assert_ptr_null(q);
    /* A forever wait, woken by the release. */
    struct tu_sem_taker t;
    taker_start(&t, sb, 1, DLOCK_FOREVER, NULL);
    EXPECT_RC(dlock_permit_release(p), DLOCK_OK);
    EXPECT_RC(tu_sem_taker_join(&t), DLOCK_OK);
    /* dlock_semaphore_cancel ends a forever wait. */
    p = tu_permit(sa, 2, DLOCK_TRY);
    taker_start(&t, sb, 1, DLOCK_FOREVER, NULL);
    EXPECT_RC(dlock_semaphore_cancel(sb), DLOCK_OK);
    EXPECT_RC(tu_sem_taker_join(&t), DLOCK_ECANCELED);
    /* A cancel object: fired during the wait, and before it began. */
    dlock_cancel *k = NULL;
    EXPECT_RC(dlock_cancel_new(&k), DLOCK_OK);
    taker_start(&t, sb, 1, DLOCK_FOREVER, k);
    EXPECT_RC(dlock_cancel_fire(k), DLOCK_OK);
    EXPECT_RC(tu_sem_taker_join(&t), DLOCK_ECANCELED);
    EXPECT_RC(dlock_permit_release(p), DLOCK_OK);
    q = (dlock_permit *)1;
    EXPECT_RC(dlock_semaphore_acquire(sb, 1, DLOCK_FOREVER, k, &q), DLOCK_ECANCELED);
    ck_assert_ptr_null(q);
    dlock_cancel_free(k);
    expect_free_soon(a, "w", 2, 2); /* the canceled waits left nothing held */
    dlock_semaphore_free(sa);
    dlock_semaphore_free(sb);
    TU_CLOSE_CLIENTS(a, b);
}

/* A count other than the stored one is refused, naming both. */
TU_TEST(wrong_count, 30)
{
    dlock_client *c = ct_open_test(NULL);
    dlock_semaphore *s3 = tu_semaphore(c, "n", 3), *s5 = tu_semaphore(c, "n", 5);
    dlock_permit *p = tu_permit(s3, 1, DLOCK_TRY), *q = (dlock_permit *)1;
    if (!stores_count()) {
        /* Nothing to check against: each client's own count rules. */
        q = tu_permit(s5, 1, DLOCK_TRY);
        EXPECT_RC(dlock_permit_release(q), DLOCK_OK);
        EXPECT_RC(dlock_permit_release(p), DLOCK_OK);
        dlock_semaphore_free(s3);
        dlock_semaphore_free(s5);
        dlock_client_close(c);
        return;
    }
    EXPECT_RC(dlock_semaphore_acquire(s5, 1, DLOCK_TRY, NULL, &q), DLOCK_EINVAL);
    ck_assert_ptr_null(q);
    ck_assert_msg(strstr(dlock_errmsg(), "3") && strstr(dlock_errmsg(), "5"),
                  "message names both counts: %s", dlock_errmsg());
    dlock_info *i = NULL;
    EXPECT_RC(dlock_semaphore_inspect(c, "n", 5, &i), DLOCK_EINVAL);
    ck_assert_ptr_null(i);
    i = look(c, "n", 0);
    ck_assert_uint_eq(dlock_info_permits(i), 3);
    ck_assert_int_eq(dlock_info_free_permits(i), 2);
    dlock_info_free(i);
    EXPECT_RC(dlock_permit_release(p), DLOCK_OK);
    /* Still refused with nobody holding: the count is stored. */
    EXPECT_RC(dlock_semaphore_acquire(s5, 1, DLOCK_TRY, NULL, &q), DLOCK_EINVAL);
    dlock_semaphore_free(s3);
    dlock_semaphore_free(s5);
    dlock_client_close(c);
}

/* A child holding permits (K of them in one object, and one more), then
 * killed or paused. It writes DIR/held with its first token; unless
 * KILL_ONLY it waits for DIR/go, then (with leases) for the lost callback
 * of both permits, releases both and writes "<rc> <rc> <callbacks>
 * <validities both 0>" to DIR/done. Forked before the test opens a
 * client. */
struct lost_count {
    atomic_int fired;
};

static void on_permit_lost(dlock_semaphore *s, dlock_permit *p, const char *why, void *arg)
{
    (void)s;
    (void)why;
    struct lost_count *n = arg;
    if (dlock_permit_count(p) > 0)
        atomic_fetch_add(&n->fired, 1);
}

static pid_t fork_holder(const char *url, const char *name, unsigned permits, const char *dir,
                         bool kill_only)
{
    pid_t pid = tu_fork();
    if (pid > 0)
        return pid;
    static struct lost_count lost;
    dlock_client *c = NULL;
    dlock_semaphore *s = NULL;
    dlock_permit *p = NULL, *p2 = NULL;
    if (dlock_open(url, &c) || dlock_semaphore_new(c, name, permits, 0, &s))
        _exit(10);
    dlock_semaphore_on_lost(s, on_permit_lost, &lost);
    if (dlock_semaphore_acquire(s, permits - 1, 30000, NULL, &p) ||
        dlock_semaphore_acquire(s, 1, 30000, NULL, &p2))
        _exit(11);
    uint64_t t = 0;
    dlock_permit_token(p, &t);
    ct_holder_held(dir, t, kill_only);
    bool has_leases = dlock_permit_validity_ms(p) != DLOCK_VALID_FOREVER;
    for (int i = 0; has_leases && i < 3000 && atomic_load(&lost.fired) < 2; i++)
        tu_sleep_ms(10);
    int zero = dlock_permit_validity_ms(p) == 0 && dlock_permit_validity_ms(p2) == 0;
    int rc = dlock_permit_release(p), rc2 = dlock_permit_release(p2);
    ct_holder_done(dir, rc, rc2, atomic_load(&lost.fired), zero);
    dlock_semaphore_free(s);
    dlock_client_close(c);
    _exit(0);
}

/* kill -9 of a holder: its permits come back (file: at once; otherwise
 * when the lease ends) and a forever waiter gets them all. */
TU_TEST(kill9_holder, 60)
{
    struct ct_holder h = ct_holder_open("lease=1500ms", "sem-kill9");
    h.pid = fork_holder(h.url, "k9", 3, h.dir, true);
    uint64_t t1 = ct_holder_wait(&h);
    dlock_client *c = tu_open(h.url);
    dlock_semaphore *s = tu_semaphore(c, "k9", 3);
    expect_busy(s, 1);
    ct_holder_kill(&h);
    dlock_permit *p = tu_permit(s, 3, DLOCK_FOREVER); /* the test's time limit fails a hang */
    ck_assert_uint_gt(token_of(p), t1);
    EXPECT_RC(dlock_permit_release(p), DLOCK_OK);
    dlock_semaphore_free(s);
    dlock_client_close(c);
    ct_holder_close(&h);
}

/* A holder stopped (SIGSTOP) past its lease: its permits come back to
 * others; resumed, it is told of each loss once, its releases say
 * DLOCK_ELOST and nothing is given back twice. File: no lease, the
 * stopped holder keeps its permits. */
TU_TEST(paused_holder, 90)
{
    struct ct_holder h = ct_holder_open("lease=1500ms", "sem-pause");
    h.pid = fork_holder(h.url, "pz", 2, h.dir, false);
    ct_holder_wait(&h);
    kill(h.pid, SIGSTOP);
    dlock_client *c = tu_open(h.url);
    dlock_semaphore *s = tu_semaphore(c, "pz", 2);
    dlock_permit *p = NULL;
    if (leases()) {
        p = tu_permit(s, 2, DLOCK_FOREVER);
    } else {
        dlock_permit *q = NULL;
        EXPECT_RC(dlock_semaphore_acquire(s, 1, 100, NULL, &q), DLOCK_ETIMEDOUT);
    }
    int rc, rc2, fired, zero;
    ct_holder_resume(&h, &rc, &rc2, &fired, &zero);
    ck_assert_int_eq(tu_wait_exit(h.pid), 0);
    if (leases()) {
        ck_assert_msg(rc == DLOCK_ELOST && rc2 == DLOCK_ELOST, "stale holder's releases: %s, %s",
                      dlock_err_name(rc), dlock_err_name(rc2));
        ck_assert_int_eq(fired, 2);
        ck_assert_msg(zero == 1, "a lost permit's validity is not 0");
        ck_assert_int_gt(dlock_permit_validity_ms(p), 0);
        /* The stale releases gave nothing back: ours are still both held. */
        expect_free(c, "pz", 2, 0);
        EXPECT_RC(dlock_permit_release(p), DLOCK_OK);
    } else {
        ck_assert_msg(rc == DLOCK_OK && rc2 == DLOCK_OK, "holder's releases: %s, %s",
                      dlock_err_name(rc), dlock_err_name(rc2));
        ck_assert_int_eq(fired, 0);
    }
    expect_free(c, "pz", 2, 2);
    dlock_semaphore_free(s);
    dlock_client_close(c);
    ct_holder_close(&h);
}

/* Renewals keep a permit past several leases (the sleep is the subject:
 * time passing without a loss). */
TU_TEST(lease_renewed, 60)
{
    dlock_client *a = ct_open_test("lease=900ms"), *b = ct_open_test(NULL);
    dlock_semaphore *sa = tu_semaphore(a, "r", 1), *sb = tu_semaphore(b, "r", 1);
    dlock_permit *p = tu_permit(sa, 1, DLOCK_TRY);
    tu_sleep_ms(2500);
    ck_assert_int_gt(dlock_permit_validity_ms(p), 0);
    expect_busy(sb, 1);
    EXPECT_RC(dlock_permit_release(p), DLOCK_OK);
    dlock_permit *q = tu_permit(sb, 1, DLOCK_TRY);
    EXPECT_RC(dlock_permit_release(q), DLOCK_OK);
    /* A fixed lease is not renewed: the permit comes back by itself
     * (zk: refused, a permit lasts as long as the session). */
    if (leases() && !(CT->caps & CT_FIXED_LEASE)) {
        EXPECT_RC(dlock_semaphore_set_lease(sa, 600, DLOCK_LEASE_FIXED), DLOCK_ENOTSUP);
        dlock_semaphore_free(sa);
        dlock_semaphore_free(sb);
        TU_CLOSE_CLIENTS(a, b);
        return;
    }
    EXPECT_RC(dlock_semaphore_set_lease(sa, 600, DLOCK_LEASE_FIXED), DLOCK_OK);
    p = tu_permit(sa, 1, DLOCK_TRY);
    if (leases()) {
        q = tu_permit(sb, 1, DLOCK_FOREVER);
        ck_assert_int_eq(dlock_permit_validity_ms(p), 0);
        EXPECT_RC(dlock_permit_release(p), DLOCK_ELOST);
        EXPECT_RC(dlock_permit_release(q), DLOCK_OK);
    } else {
        ck_assert_int_eq(dlock_permit_validity_ms(p), DLOCK_VALID_FOREVER);
        EXPECT_RC(dlock_permit_release(p), DLOCK_OK);
    }
    dlock_semaphore_free(sa);
    dlock_semaphore_free(sb);
    TU_CLOSE_CLIENTS(a, b);
}

/* Permits freed while a waiter of more of them sleeps go to a later
 * waiter of one client that wants fewer: a release message woke the
 * first waiter (K = 3, still too few), and its busy try must pass the
 * wake on rather than keep it (else the second sleeps until a permit's
 * expiry, a lease away, past its own wait). zk and etcd serve waiters in
 * arrival order (Curator's mutex; etcd's keys by create revision,
 * dlock.h), so there the second waits its turn. */
TU_TEST(smaller_waiter_served, 120)
{
    dlock_client *c = ct_open_test(NULL);
    dlock_semaphore *s = tu_semaphore(c, "m", 3);
    if (leases())
        EXPECT_RC(dlock_semaphore_set_lease(s, 120000, 0), DLOCK_OK);
    /* Redis: releasing the 2 publishes "2" (a "1" would wake everyone). */
    dlock_permit *p2 = tu_permit(s, 2, DLOCK_TRY), *p1 = tu_permit(s, 1, DLOCK_TRY);
    struct tu_sem_taker all, one;
    taker_start(&all, s, 3, DLOCK_FOREVER, NULL);
    bool in_order = strcmp(CT->name, "zk") == 0 || strcmp(CT->name, "etcd") == 0;
    taker_start(&one, s, 1, in_order ? 300 : 60000, NULL);
    EXPECT_RC(dlock_permit_release(p2), DLOCK_OK);
    EXPECT_RC(tu_sem_taker_join(&one), in_order ? DLOCK_ETIMEDOUT : DLOCK_OK);
    EXPECT_RC(dlock_permit_release(p1), DLOCK_OK);
    EXPECT_RC(tu_sem_taker_join(&all), DLOCK_OK);
    expect_free(c, "m", 3, 3);
    dlock_semaphore_free(s);
    dlock_client_close(c);
}

/* Freeing a semaphore gives back the permits still held through it, and
 * closing the client does too. */
TU_TEST(free_releases, 30)
{
    dlock_client *a = ct_open_test(NULL), *b = ct_open_test(NULL);
    dlock_semaphore *sa = tu_semaphore(a, "f", 2), *sb = tu_semaphore(b, "f", 2);
    tu_permit(sa, 1, DLOCK_TRY);
    tu_permit(sa, 1, DLOCK_TRY);
    expect_busy(sb, 1);
    dlock_semaphore_free(sa);
    expect_free(b, "f", 2, 2);
    sa = tu_semaphore(a, "f", 2);
    tu_permit(sa, 2, DLOCK_TRY);
    dlock_client_close(a);
    dlock_semaphore_free(sa); /* after close: frees only */
    dlock_permit *p = tu_permit(sb, 2, DLOCK_TRY);
    EXPECT_RC(dlock_permit_release(p), DLOCK_OK);
    dlock_semaphore_free(sb);
    dlock_client_close(b);
}

/* A forked child's side of fork_child_frees: the parent's semaphore and
 * permit refuse it (DLOCK_EMISUSE), then it frees them and closes the
 * client, under an alarm. 0, or a bit per failed check. */
struct sem_of_parent {
    dlock_client *c;
    dlock_semaphore *s;
    dlock_permit *p;
};

static int child_frees_semaphore(void *arg)
{
    const struct sem_of_parent *sp = arg;
    dlock_permit *q = NULL;
    uint64_t t;
    int bad = 0;
    bad |= (dlock_semaphore_acquire(sp->s, 1, DLOCK_TRY, NULL, &q) != DLOCK_EMISUSE) << 0;
    bad |= (dlock_permit_token(sp->p, &t) != DLOCK_EMISUSE) << 1;
    bad |= (dlock_semaphore_cancel(sp->s) != DLOCK_EMISUSE) << 2;
    bad |= (dlock_permit_release(sp->p) != DLOCK_EMISUSE) << 3; /* frees the child's copy */
    dlock_semaphore_free(sp->s);
    dlock_client_close(sp->c);
    return bad;
}

/* A child after fork() that frees the semaphore and closes the client it
 * inherited, while the parent holds a permit renewed by its keeper, ends
 * at once and changes nothing: the parent's permit stays, with its token. */
TU_TEST(fork_child_frees, 60)
{
    dlock_client *a = ct_open_test("lease=2s"), *b = ct_open_test(NULL);
    dlock_semaphore *sa = tu_semaphore(a, "fk", 1), *sb = tu_semaphore(b, "fk", 1);
    dlock_permit *p = tu_permit(sa, 1, DLOCK_TRY);
    uint64_t t = token_of(p);
    tu_fork_bounded(child_frees_semaphore, &(struct sem_of_parent){a, sa, p});
    ck_assert_uint_eq(token_of(p), t);
    expect_busy(sb, 1);
    EXPECT_RC(dlock_permit_release(p), DLOCK_OK);
    EXPECT_RC(dlock_permit_release(tu_permit(sb, 1, DLOCK_TRY)), DLOCK_OK);
    dlock_semaphore_free(sa);
    dlock_semaphore_free(sb);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* dlock run --permits N: busy when the N permits are held (the conflict
 * code), runs when one is free, refuses another count; dlock status
 * --permits shows the holders and the free permits. */
TU_TEST(cli_run_permits, 60)
{
    char *url = ct_test_url(NULL);
    dlock_client *c = tu_open(url);
    dlock_semaphore *s = tu_semaphore(c, "cli", 2);
    dlock_permit *p = tu_permit(s, 2, DLOCK_TRY);
    ck_assert_int_eq(TU_DLOCK(NULL, NULL, NULL, "-u", url, "run", "-n", "--permits", "2", "cli",
                              "true"),
                     1);
    EXPECT_RC(dlock_permit_release(p), DLOCK_OK);
    p = tu_permit(s, 1, DLOCK_TRY);
    char *out = NULL;
    ck_assert_int_eq(TU_DLOCK(&out, NULL, NULL, "-u", url, "run", "-n", "--permits", "2", "cli",
                              "--", "sh", "-c", "echo token=$DLOCK_TOKEN"),
                     0);
    ck_assert_msg(strstr(out, "token=") && strtoull(strstr(out, "token=") + 6, NULL, 10) >
                      token_of(p), "%s", out);
    free(out);
    ck_assert_int_eq(TU_DLOCK(&out, NULL, NULL, "-u", url, "status", "--permits", "2", "cli",
                              "--json"),
                     0);
    ck_assert_msg(strstr(out, "\"permits\":2,\"free_permits\":1") &&
                      strstr(out, "\"mode\":null") && strstr(out, dlock_permit_id(p)),
                  "%s", out);
    free(out);
    ck_assert_int_eq(TU_DLOCK(&out, NULL, NULL, "-u", url, "status", "--permits", "2", "cli"), 0);
    ck_assert_msg(strstr(out, "state:    permits held\n") && strstr(out, "(permits 1)") &&
                      strstr(out, "permits:  2, 1 free"),
                  "%s", out);
    free(out);
    char *err = NULL;
    ck_assert_int_eq(TU_DLOCK(NULL, &err, NULL, "-u", url, "run", "--permits", "3", "cli", "true"),
                     stores_count() ? 78 : 0);
    ck_assert_msg(!stores_count() || strstr(err, "not 3"), "%s", err);
    free(err);
    EXPECT_RC(dlock_permit_release(p), DLOCK_OK);
    ck_assert_int_eq(TU_DLOCK(NULL, NULL, NULL, "-u", url, "status", "--permits", "0", "cli"), 1);
    dlock_semaphore_free(s);
    dlock_client_close(c);
    free(url);
}

/* dlock list shows the semaphores held beside the locks (name, kind,
 * holders and free permits; --json with "kind"), not one used and given
 * back, and applies the pattern to them too. */
TU_TEST(cli_list_shows_semaphores, 60)
{
    char *url = ct_test_url(NULL);
    dlock_client *c = tu_open(url);
    dlock_semaphore *s = tu_semaphore(c, "lst-sem", 3), *f = tu_semaphore(c, "lst-free", 2);
    dlock_permit *p = tu_permit(s, 2, DLOCK_TRY);
    EXPECT_RC(dlock_permit_release(tu_permit(f, 1, DLOCK_TRY)), DLOCK_OK);
    dlock_lock *l = tu_lock(c, "lst-lock");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    char *out = NULL;
    ck_assert_int_eq(TU_DLOCK(&out, NULL, NULL, "-u", url, "list", "lst-*"), 0);
    const char *line = stores_count() ? "lst-sem (semaphore: 1 holder, 1 of 3 permits free)\n"
                                      : "lst-sem (semaphore: 1 holder, 2 permits held, count "
                                        "not stored)\n";
    ck_assert_msg(strstr(out, "lst-lock\n") && strstr(out, line) && !strstr(out, "lst-free"),
                  "%s", out);
    free(out);
    ck_assert_int_eq(TU_DLOCK(&out, NULL, NULL, "-u", url, "list", "lst-*", "--json"), 0);
    ck_assert_msg(strstr(out, "\"kind\":\"semaphore\"") && strstr(out, "\"kind\":\"lock\"") &&
                      strstr(out, dlock_permit_id(p)) && !strstr(out, "lst-free") &&
                      (!stores_count() || strstr(out, "\"permits\":3,\"free_permits\":1")),
                  "%s", out);
    free(out);
    ck_assert_int_eq(TU_DLOCK(&out, NULL, NULL, "-u", url, "list", "lst-s*"), 0);
    ck_assert_msg(strstr(out, line) && !strstr(out, "lst-lock"), "%s", out);
    free(out);
    EXPECT_RC(dlock_release(l), DLOCK_OK);
    EXPECT_RC(dlock_permit_release(p), DLOCK_OK);
    ck_assert_int_eq(TU_DLOCK(&out, NULL, NULL, "-u", url, "list", "lst-*"), 0);
    ck_assert_msg(strcmp(out, "") == 0, "%s", out);
    free(out);
    dlock_lock_free(l);
    dlock_semaphore_free(s);
    dlock_semaphore_free(f);
    dlock_client_close(c);
    free(url);
}

/* dlock bench semaphore: W clients over N permits beside the same
 * clients on one lock, in the same run; never more than N holders seen
 * at once. (A smoke run: the figures themselves go to docs/benchmarks.md.) */
TU_TEST(cli_bench_semaphore, 60)
{
    char *url = ct_test_url(NULL);
    char *out = NULL, *err = NULL;
    int code = TU_DLOCK(&out, &err, NULL, "-u", url, "bench", "semaphore", "-d", "0.2", "-W", "3",
                        "-P", "2");
    ck_assert_msg(code == 0, "exit %d: %s%s", code, out, err);
    const char *most = strstr(out, "most holders at once");
    ck_assert_msg(strstr(out, "permits/s, 2 permits") && strstr(out, "1 lock") && most, "%s", out);
    long n = strtol(most + strlen("most holders at once"), NULL, 10);
    ck_assert_msg(n >= 1 && n <= 2, "%ld holders of 2 permits seen at once: %s", n, out);
    free(out);
    free(err);
    free(url);
}

/* A backend without semaphores says so, naming itself. */
TU_TEST(not_supported, 30)
{
    dlock_client *c = ct_open_test(NULL);
    dlock_semaphore *s = NULL;
    EXPECT_RC(dlock_semaphore_new(c, "x", 2, 0, &s), DLOCK_ENOTSUP);
    ck_assert_ptr_null(s);
    ck_assert_msg(strstr(dlock_errmsg(), dlock_client_backend(c)), "message: %s", dlock_errmsg());
    dlock_info *i = NULL;
    EXPECT_RC(dlock_semaphore_inspect(c, "x", 2, &i), DLOCK_ENOTSUP);
    dlock_client_close(c);
}

/* The semaphore tests run on a backend that has semaphores, not_supported
 * on the others. */
static bool runs_on(const struct ct_fixture *f, const char *test)
{
    return has_semaphores(f) == (strcmp(test, "not_supported") != 0);
}

int main(void)
{
    return ct_main("semaphore", "s", runs_on);
}
