/* check_contract_async.c -- the asynchronous calls (dlock_acquire_async(),
 * dlock_client_fd(), dlock_dispatch()) on the contract fixtures
 * (tests/lib/contract.h), one test case per backend: the core cases of
 * the lock contract (tokens and re-entry, exclusion, cancel, the wait
 * bound, close with acquires in flight); the example programs
 * examples/async_uv.c and examples/async_event.c against the fixture's
 * server, their loop's timer firing while their acquire waits; and
 * `dlock bench async`.
 *
 * A backend whose waits do not park yet answers a waiting asynchronous
 * acquire with DLOCK_ENOTSUP naming itself (dlock.h, "asynchronous
 * calls"); there each test runs with DLOCK_TRY and asserts that refusal
 * of a wait instead, so a backend that learns to park is tested as one
 * the day it lands, with no change here. The fixtures: file, redis in
 * its three layouts, etcd and ZooKeeper -- those that park or are being
 * taught to. TLS, Sentinel and Cluster reach the same parking code as
 * redis:// (they change how the connection is made), and postgres, mysql
 * and redlock refuse waits with the same message path: left out to keep
 * the suite to seconds per fixture (add a name to FIXTURES to run one).
 *
 * No time is asserted: "the loop was not blocked" is at least a few ticks
 * of a 50 ms timer while the acquire waited a second or more.
 */
#include <check.h>
#include <inttypes.h>
#include <libgen.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "contract.h"
#include "dlock.h"
#include "testutil.h"

/* ------------------------------------------------------------- helpers */

/* The last completion dispatched to a struct done. */
struct done {
    int n, rc;
    char msg[256];
};

static void on_done(dlock_lock *l, int rc, void *arg)
{
    (void)l;
    struct done *d = arg;
    d->n++;
    d->rc = rc;
    snprintf(d->msg, sizeof d->msg, "%s", dlock_errmsg());
}

/* Dispatch C's completions until *COUNT reaches WANT; fails the test
 * after 30 s. */
static void pump_until(dlock_client *c, const int *count, int want)
{
    int fd = dlock_client_fd(c);
    ck_assert_int_ge(fd, 0);
    for (int64_t end = tu_mono_ms() + 30000; *count < want;) {
        ck_assert_msg(tu_mono_ms() < end, "%d of %d completions in 30 s", *count, want);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) > 0)
            ck_assert_int_ge(dlock_dispatch(c), 0);
    }
}

/* Whether this fixture's backend parks a waiting asynchronous acquire:
 * a wait started on a free name through C completes DLOCK_OK (and is
 * given back). Where it does not, the refusal is the documented one --
 * DLOCK_ENOTSUP, from the start call or the first attempt (a fair
 * handle), its message naming the backend or the layout -- and WHY
 * (LEN bytes) gets what that message says after the lock's name. */
static bool parks(dlock_client *c, char *why, size_t len)
{
    dlock_lock *l = tu_lock_mode(c, "parks?", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED);
    struct done d = {0};
    int rc = dlock_acquire_async(l, 1000, NULL, on_done, &d);
    if (rc == DLOCK_OK) {
        pump_until(c, &d.n, 1);
        rc = d.rc;
    } else {
        snprintf(d.msg, sizeof d.msg, "%s", dlock_errmsg());
    }
    ck_assert_msg(rc == DLOCK_OK || rc == DLOCK_ENOTSUP, "%s: a wait on a free name: %s (%s)",
                  CT->name, dlock_err_name(rc), d.msg);
    if (rc == DLOCK_OK)
        TU_RELEASE_OK(l);
    else
        ck_assert_msg(strstr(d.msg, dlock_client_backend(c)) || strstr(d.msg, "fair"),
                      "%s: the refusal names neither the backend nor the layout: %s", CT->name,
                      d.msg);
    const char *after_name = strstr(d.msg, "': ");
    snprintf(why, len, "%s", after_name ? after_name + 3 : d.msg);
    dlock_lock_free(l);
    return rc == DLOCK_OK;
}

/* ------------------------------------------------------ example programs */

#define EXAMPLE_TICK_MS 50 /* the examples' timer */
#define EXAMPLE_HOLD_MS 1000
/* At least a few of the ~20 ticks of the held second (a loop a waiting
 * acquire blocked would see none). */
#define EXAMPLE_MIN_TICKS 4

/* Until FILE holds TEXT: its contents (caller frees), or NULL after 30 s. */
static char *wait_text(const char *file, const char *text)
{
    for (int i = 0; i < 3000; i++) {
        char *s = tu_read_file(file);
        if (s && strstr(s, text))
            return s;
        free(s);
        tu_sleep_ms(10);
    }
    return NULL;
}

/* examples/PROGRAM against the fixture, on a name the test holds: it
 * says it waits, the test holds a second more and lets go, and the
 * program takes the lock, says how often its loop's timer fired while it
 * waited, and gives it back (exit 0). Where waits do not park it exits 1
 * with the backend's refusal. */
static void example_runs_its_loop(const char *program)
{
    char *bin = strdup(tu_dlock_bin());
    char *path = tu_fmt("%s/examples/%s", dirname(bin), program);
    struct stat st;
    ck_assert_msg(stat(path, &st) == 0, "%s: not built (make all builds it)", path);
    dlock_client *c = ct_open_test(NULL);
    char why[256];
    bool parking = parks(c, why, sizeof why);
    dlock_lock *holder = tu_lock(c, "loop");
    TU_ACQUIRE_OK(holder, DLOCK_TRY);
    char *url = ct_test_url(NULL), *dir = tu_tmpdir("example"), *log = tu_fmt("%s/out", dir);
    const char *argv[] = {path, url, "loop", "30000", NULL};
    pid_t pid = tu_spawn(argv, log);
    if (parking) {
        char *out = wait_text(log, "waiting for loop");
        ck_assert_msg(out, "%s never said it waits", program);
        free(out);
        tu_sleep_ms(EXAMPLE_HOLD_MS);
        TU_RELEASE_OK(holder);
    }
    int status = tu_wait_exit(pid);
    char *out = tu_read_file(log);
    ck_assert_ptr_nonnull(out);
    if (parking) {
        ck_assert_msg(status == 0, "%s exited %d: %s", program, status, out);
        const char *ticked = strstr(out, "the loop ticked ");
        ck_assert_msg(strstr(out, "acquired: token ") && ticked && strstr(out, "released"), "%s",
                      out);
        long ticks = strtol(ticked + strlen("the loop ticked "), NULL, 10);
        ck_assert_msg(ticks >= EXAMPLE_MIN_TICKS,
                      "%s: the loop ticked %ld times in a wait of a second or more: %s", program,
                      ticks, out);
    } else {
        ck_assert_msg(status == 1 && strstr(out, why), "%s exited %d, not with \"%s\": %s", program,
                      status, why, out);
        TU_RELEASE_OK(holder);
    }
    free(out);
    free(log);
    tu_rmrf(dir);
    free(dir);
    free(url);
    dlock_lock_free(holder);
    dlock_client_close(c);
    free(path);
    free(bin);
}

#ifdef DLOCK_HAVE_LIBUV
TU_TEST(example_libuv_loop_runs_while_acquire_waits, 60)
{
    example_runs_its_loop("async_uv");
}
#endif

#ifdef DLOCK_HAVE_LIBEVENT
TU_TEST(example_libevent_loop_runs_while_acquire_waits, 60)
{
    example_runs_its_loop("async_event");
}
#endif

/* -------------------------------------------------------- dlock bench async */

/* The completions of two waiters, in the order dispatched. */
struct two_done {
    int n;
    dlock_lock *l[2];
    int rc[2];
};

static void on_two_done(dlock_lock *l, int rc, void *arg)
{
    struct two_done *d = arg;
    ck_assert_int_lt(d->n, 2);
    d->l[d->n] = l;
    d->rc[d->n++] = rc;
}

/* Whether a second handle of C may start an asynchronous wait on a name a
 * first handle of C waits for (etcd, zk: DLOCK_EBUSY, one acquire per
 * name per client at a time; dlock_acquire_async(3)). Backends that park;
 * whichever waiter is woken first holds, then the other. */
static bool waits_share_a_client(dlock_client *c)
{
    dlock_client *other = ct_open_test(NULL);
    dlock_lock *holder = tu_lock(other, "share");
    TU_ACQUIRE_OK(holder, DLOCK_TRY);
    dlock_lock *a = tu_lock_mode(c, "share", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED);
    dlock_lock *b = tu_lock_mode(c, "share", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED);
    struct two_done d = {0};
    EXPECT_RC(dlock_acquire_async(a, 30000, NULL, on_two_done, &d), DLOCK_OK);
    int rc = dlock_acquire_async(b, 30000, NULL, on_two_done, &d);
    ck_assert_msg(rc == DLOCK_OK || rc == DLOCK_EBUSY, "a second waiter: %s (%s)",
                  dlock_err_name(rc), dlock_errmsg());
    TU_RELEASE_OK(holder);
    for (int i = 0; i < (rc == DLOCK_OK ? 2 : 1); i++) {
        pump_until(c, &d.n, i + 1);
        ck_assert_msg(d.rc[i] == DLOCK_OK, "waiter %d: %s", i + 1, dlock_err_name(d.rc[i]));
        TU_RELEASE_OK(d.l[i]);
    }
    TU_FREE_LOCKS(b, a, holder);
    dlock_client_close(other);
    return rc == DLOCK_OK;
}

/* The first number in OUT's row of `dlock bench async`'s table that
 * starts with ROW (its async cell), or -1. */
static long bench_async_first_cell(const char *out, const char *row)
{
    const char *at = strstr(out, row);
    long v = -1;
    if (at && sscanf(at + strlen(row), "%ld", &v) != 1)
        v = -1;
    return v;
}

/* `dlock bench async -W 50` measures where W waiters of one client park:
 * on one name where a client may wait on a name many times at once, else
 * (etcd, zk: one acquire per name per client) spread over W names, one
 * waiter each, saying so; where waits do not park it fails with exit 69
 * saying why. */
TU_TEST(bench_async_where_waits_park, 120)
{
    dlock_client *c = ct_open_test(NULL);
    char why[256];
    bool parking = parks(c, why, sizeof why), shared = parking && waits_share_a_client(c);
    dlock_client_close(c);
    char *url = ct_test_url(NULL), *out = NULL, *err = NULL;
    int code = TU_DLOCK(&out, &err, NULL, "-u", url, "bench", "async", "-W", "50");
    if (parking) {
        ck_assert_msg(code == 0 && strstr(out, "hand-off p99") && strstr(out, "memory per waiter"),
                      "exit %d: %s%s", code, out, err);
        ck_assert_msg(!strstr(out, "spread: one per name") == shared, "%s", out);
        ck_assert_msg(bench_async_first_cell(out, "waiting, all after") == 50, "%s", out);
        ck_assert_msg(bench_async_first_cell(out, "holds, handed along") == 50, "%s", out);
        long threads = bench_async_first_cell(out, "threads in the process");
        ck_assert_msg(threads > 0 && threads <= 16, "%s", out);
    } else {
        ck_assert_msg(code == 69 && strstr(err, why), "exit %d, not with \"%s\": %s%s", code, why,
                      out, err);
    }
    free(out);
    free(err);
    free(url);
}

/* ------------------------------------------- the lock contract, async */

/* The core cases of check_contract.c through the asynchronous calls:
 * tokens and re-entry, exclusion, cancel, the wait bound, the close with
 * acquires in flight. Where waits do not park, the same through
 * DLOCK_TRY (the part every backend has). */

static uint64_t token_of(dlock_lock *l)
{
    uint64_t t = 0;
    EXPECT_RC(dlock_token(l, &t), DLOCK_OK);
    return t;
}

static dlock_lock *owned(dlock_client *c, const char *name)
{
    return tu_lock_mode(c, name, DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED);
}

/* The message of the latest completion acquire_now() or release_now()
 * saw (dlock_errmsg() in its callback). */
static char last_msg[256];

/* An asynchronous acquire of L through C, waiting up to WAIT_MS (CANCEL
 * may be NULL), dispatched to its end: the start call's code when it
 * fails, else the completion's (message in last_msg). */
static int acquire_now(dlock_client *c, dlock_lock *l, int64_t wait_ms, dlock_cancel *cancel)
{
    struct done d = {0};
    int rc = dlock_acquire_async(l, wait_ms, cancel, on_done, &d);
    if (rc)
        return rc;
    pump_until(c, &d.n, 1);
    snprintf(last_msg, sizeof last_msg, "%s", d.msg);
    return d.rc;
}

/* dlock_release_async() of L, dispatched to its end, as acquire_now(). */
static int release_now(dlock_client *c, dlock_lock *l)
{
    struct done d = {0};
    int rc = dlock_release_async(l, on_done, &d);
    if (rc)
        return rc;
    pump_until(c, &d.n, 1);
    snprintf(last_msg, sizeof last_msg, "%s", d.msg);
    return d.rc;
}

/* Dispatch C's completions for MS milliseconds (a parked wait stays
 * parked meanwhile). */
static void pump_for(dlock_client *c, int ms)
{
    int fd = dlock_client_fd(c);
    ck_assert_int_ge(fd, 0);
    for (int64_t end = tu_mono_ms() + ms; tu_mono_ms() < end;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 20) > 0)
            ck_assert_int_ge(dlock_dispatch(c), 0);
    }
}

/* Tokens and re-entry through the asynchronous calls, DLOCK_TRY only:
 * a fresh hold has a token and a greater one than the last, a re-entry
 * keeps it and counts, as many releases as acquires, a release of
 * nothing is refused at the start, one call per handle at a time. */
TU_TEST(async_tokens_reentrancy, 30)
{
    dlock_client *c = ct_open_test(NULL), *c2 = ct_open_test(NULL);
    dlock_lock *l = owned(c, "re"), *other = tu_lock(c2, "re");
    struct done d = {0}, d2 = {0};
    EXPECT_RC(dlock_release_async(l, on_done, &d), DLOCK_ENOTOWNER);
    EXPECT_RC(acquire_now(c, l, DLOCK_TRY, NULL), DLOCK_OK);
    uint64_t t1 = token_of(l);
    ck_assert_uint_gt(t1, 0);
    EXPECT_RC(acquire_now(c, l, DLOCK_TRY, NULL), DLOCK_OK); /* re-entry */
    ck_assert_uint_eq(dlock_hold_count(l), 2);
    ck_assert_uint_eq(token_of(l), t1);
    EXPECT_RC(dlock_acquire(other, DLOCK_TRY), DLOCK_EBUSY);
    EXPECT_RC(release_now(c, l), DLOCK_OK);
    ck_assert_uint_eq(dlock_hold_count(l), 1);
    EXPECT_RC(dlock_acquire(other, DLOCK_TRY), DLOCK_EBUSY); /* as many releases */
    EXPECT_RC(release_now(c, l), DLOCK_OK);
    ck_assert_uint_eq(dlock_hold_count(l), 0);
    EXPECT_RC(dlock_release_async(l, on_done, &d), DLOCK_ENOTOWNER);
    TU_ACQUIRE_OK(other, DLOCK_TRY);
    uint64_t t2 = token_of(other);
    ck_assert_uint_gt(t2, t1);
    int rc = acquire_now(c, l, DLOCK_TRY, NULL);
    ck_assert_msg(rc == DLOCK_EBUSY && strstr(last_msg, "re"), "a try on a held name: %s (%s)",
                  dlock_err_name(rc), last_msg);
    ck_assert_uint_eq(dlock_hold_count(l), 0);
    TU_RELEASE_OK(other);
    EXPECT_RC(dlock_acquire_async(l, DLOCK_TRY, NULL, on_done, &d), DLOCK_OK);
    EXPECT_RC(dlock_acquire_async(l, DLOCK_TRY, NULL, on_done, &d2), DLOCK_EBUSY);
    pump_until(c, &d.n, 1);
    ck_assert_msg(d.rc == DLOCK_OK, "%s (%s)", dlock_err_name(d.rc), d.msg);
    ck_assert_uint_gt(token_of(l), t2);
    EXPECT_RC(release_now(c, l), DLOCK_OK);
    ck_assert_int_eq(d2.n, 0); /* the refused start has no callback */
    TU_FREE_LOCKS(other, l);
    TU_CLOSE_CLIENTS(c2, c);
}

/* Exclusion: EX_CLIENTS clients, a handle each, take one name EX_ROUNDS
 * times each through asynchronous acquires (waits where they park, tries
 * again and again elsewhere), hold it EX_HOLD_MS of loop time and
 * release it asynchronously, all dispatched by this thread. A holder
 * counts itself out when it sends its release (the hold cannot end
 * before), so a completion that finds another holder inside is two
 * holds at once; and each new hold's token is greater than the last. */
#define EX_CLIENTS 3
#define EX_ROUNDS 4
#define EX_HOLD_MS 5

struct ex_state {
    bool parking;
    int inside, taken;
    uint64_t last_token;
};

struct ex_waiter {
    struct ex_state *st;
    dlock_client *c;
    dlock_lock *l;
    int left;
    bool busy, held;              /* a call in flight; holds now */
    int64_t release_at, retry_at; /* ms, monotonic */
};

static void ex_acquired(dlock_lock *l, int rc, void *arg)
{
    struct ex_waiter *w = arg;
    struct ex_state *st = w->st;
    w->busy = false;
    if (rc == DLOCK_EBUSY && !st->parking) {
        w->retry_at = tu_mono_ms() + EX_HOLD_MS;
        return;
    }
    ck_assert_msg(rc == DLOCK_OK, "%s: %s (%s)", CT->name, dlock_err_name(rc), dlock_errmsg());
    ck_assert_msg(st->inside == 0, "%s: two holders at once", CT->name);
    st->inside = 1;
    uint64_t t = token_of(l);
    ck_assert_msg(t > st->last_token, "token %" PRIu64 " after %" PRIu64, t, st->last_token);
    st->last_token = t;
    st->taken++;
    w->held = true;
    w->release_at = tu_mono_ms() + EX_HOLD_MS;
    w->left--;
}

static void ex_released(dlock_lock *l, int rc, void *arg)
{
    (void)l;
    struct ex_waiter *w = arg;
    w->busy = false;
    ck_assert_msg(rc == DLOCK_OK, "release: %s (%s)", dlock_err_name(rc), dlock_errmsg());
}

/* W's next step, if it has one now: start its acquire, or its release. */
static void ex_step(struct ex_waiter *w)
{
    int64_t now = tu_mono_ms();
    if (w->busy)
        return;
    if (w->held && now >= w->release_at) {
        w->st->inside = 0;
        w->held = false;
        w->busy = true;
        EXPECT_RC(dlock_release_async(w->l, ex_released, w), DLOCK_OK);
    } else if (!w->held && w->left > 0 && now >= w->retry_at) {
        w->busy = true;
        EXPECT_RC(dlock_acquire_async(w->l, w->st->parking ? 30000 : DLOCK_TRY, NULL, ex_acquired,
                                      w),
                  DLOCK_OK);
    }
}

TU_TEST(async_exclusion, 90)
{
    struct ex_state st = {0};
    struct ex_waiter w[EX_CLIENTS];
    struct pollfd p[EX_CLIENTS];
    char why[256];
    for (int i = 0; i < EX_CLIENTS; i++) {
        w[i] = (struct ex_waiter){.st = &st, .c = ct_open_test(NULL), .left = EX_ROUNDS};
        if (i == 0)
            st.parking = parks(w[0].c, why, sizeof why);
        w[i].l = owned(w[i].c, "ex");
        p[i] = (struct pollfd){.fd = dlock_client_fd(w[i].c), .events = POLLIN};
        ck_assert_int_ge(p[i].fd, 0);
    }
    int64_t end = tu_mono_ms() + 60000;
    for (bool more = true; more;) {
        ck_assert_msg(tu_mono_ms() < end, "%d of %d holds in 60 s", st.taken,
                      EX_CLIENTS * EX_ROUNDS);
        more = false;
        for (int i = 0; i < EX_CLIENTS; i++) {
            ex_step(&w[i]);
            more = more || w[i].busy || w[i].held || w[i].left > 0;
        }
        if (poll(p, EX_CLIENTS, EX_HOLD_MS) > 0)
            for (int i = 0; i < EX_CLIENTS; i++)
                if (p[i].revents)
                    ck_assert_int_ge(dlock_dispatch(w[i].c), 0);
    }
    ck_assert_int_eq(st.taken, EX_CLIENTS * EX_ROUNDS);
    for (int i = 0; i < EX_CLIENTS; i++) {
        dlock_lock_free(w[i].l);
        dlock_client_close(w[i].c);
    }
}

/* The frame of a test against a held name: client C with a handle-owned
 * handle L on NAME, which a handle of another client (C2, HOLDER) holds;
 * PARKING: whether this backend parks waits (parks()). */
struct held_frame {
    dlock_client *c, *c2;
    dlock_lock *l, *holder;
    bool parking;
};

static struct held_frame held_frame_open(const char *name)
{
    struct held_frame f = {.c = ct_open_test(NULL), .c2 = ct_open_test(NULL)};
    char why[256];
    f.parking = parks(f.c, why, sizeof why);
    f.holder = tu_lock(f.c2, name);
    f.l = owned(f.c, name);
    TU_ACQUIRE_OK(f.holder, DLOCK_TRY);
    return f;
}

/* After the test released the holder: L taken and given back, the frame
 * freed. */
static void held_frame_close(struct held_frame *f)
{
    EXPECT_RC(acquire_now(f->c, f->l, f->parking ? 10000 : DLOCK_TRY, NULL), DLOCK_OK);
    EXPECT_RC(release_now(f->c, f->l), DLOCK_OK);
    TU_FREE_LOCKS(f->l, f->holder);
    TU_CLOSE_CLIENTS(f->c2, f->c);
}

/* Cancel: a cancel object fired before the start refuses it
 * (DLOCK_ECANCELED, nothing started) on every backend; where waits park,
 * a parked wait ends DLOCK_ECANCELED when its cancel object fires and
 * when dlock_lock_cancel() is called, holding nothing, the holder's hold
 * untouched; a later acquire is not canceled. */
TU_TEST(async_cancel, 30)
{
    struct held_frame f = held_frame_open("cancel");
    dlock_client *c = f.c;
    dlock_lock *l = f.l;
    dlock_cancel *k;
    EXPECT_RC(dlock_cancel_new(&k), DLOCK_OK);
    EXPECT_RC(dlock_cancel_fire(k), DLOCK_OK);
    struct done d = {0};
    EXPECT_RC(dlock_acquire_async(l, DLOCK_TRY, k, on_done, &d), DLOCK_ECANCELED);
    dlock_cancel_free(k);
    if (f.parking) {
        EXPECT_RC(dlock_cancel_new(&k), DLOCK_OK);
        EXPECT_RC(dlock_acquire_async(l, DLOCK_FOREVER, k, on_done, &d), DLOCK_OK);
        pump_for(c, 300);
        ck_assert_int_eq(d.n, 0); /* parked */
        EXPECT_RC(dlock_cancel_fire(k), DLOCK_OK);
        pump_until(c, &d.n, 1);
        ck_assert_msg(d.rc == DLOCK_ECANCELED, "cancel object: %s (%s)", dlock_err_name(d.rc),
                      d.msg);
        dlock_cancel_free(k);
        d = (struct done){0};
        EXPECT_RC(dlock_acquire_async(l, DLOCK_FOREVER, NULL, on_done, &d), DLOCK_OK);
        pump_for(c, 300);
        ck_assert_int_eq(d.n, 0);
        EXPECT_RC(dlock_lock_cancel(l), DLOCK_OK);
        pump_until(c, &d.n, 1);
        ck_assert_msg(d.rc == DLOCK_ECANCELED, "dlock_lock_cancel: %s (%s)", dlock_err_name(d.rc),
                      d.msg);
        ck_assert_uint_eq(dlock_hold_count(l), 0);
    }
    ck_assert_uint_eq(dlock_hold_count(f.holder), 1); /* the holder's is untouched */
    TU_RELEASE_OK(f.holder);
    held_frame_close(&f); /* a later acquire is not canceled */
}

/* The wait bound: where waits park, a 200 ms wait on a held name ends
 * DLOCK_ETIMEDOUT (the code, never the time), its message naming the
 * lock, holding nothing; everywhere a try ends DLOCK_EBUSY; once free,
 * the name is taken. */
TU_TEST(async_wait_bound, 30)
{
    struct held_frame f = held_frame_open("bound");
    for (int i = 0; f.parking && i < 3; i++) {
        int rc = acquire_now(f.c, f.l, 200, NULL);
        ck_assert_msg(rc == DLOCK_ETIMEDOUT && strstr(last_msg, "bound"), "%s (%s)",
                      dlock_err_name(rc), last_msg);
        ck_assert_uint_eq(dlock_hold_count(f.l), 0);
    }
    EXPECT_RC(acquire_now(f.c, f.l, DLOCK_TRY, NULL), DLOCK_EBUSY);
    TU_RELEASE_OK(f.holder);
    held_frame_close(&f);
}

/* Close with acquires in flight: CLOSE_N handles of one client, each on
 * a name another client holds, start acquires (parked waits where they
 * park, tries elsewhere); dlock_client_close() returns once each has
 * completed exactly once -- DLOCK_ECANCELED for a parked wait, DLOCK_EBUSY
 * or DLOCK_ECANCELED for a try -- and none completes after. */
#define CLOSE_N 4

TU_TEST(async_close_with_acquires_in_flight, 30)
{
    dlock_client *c = ct_open_test(NULL), *c2 = ct_open_test(NULL);
    char why[256];
    bool parking = parks(c, why, sizeof why);
    dlock_lock *holders[CLOSE_N], *l[CLOSE_N];
    struct done d[CLOSE_N] = {{0}};
    for (int i = 0; i < CLOSE_N; i++) {
        char name[16];
        snprintf(name, sizeof name, "close%d", i);
        holders[i] = tu_lock(c2, name);
        TU_ACQUIRE_OK(holders[i], DLOCK_TRY);
        l[i] = owned(c, name);
        EXPECT_RC(dlock_acquire_async(l[i], parking ? DLOCK_FOREVER : DLOCK_TRY, NULL, on_done,
                                      &d[i]),
                  DLOCK_OK);
    }
    if (parking) {
        ck_assert_int_ge(dlock_client_fd(c), 0);
        pump_for(c, 300);
        for (int i = 0; i < CLOSE_N; i++)
            ck_assert_int_eq(d[i].n, 0); /* parked */
    }
    dlock_client_close(c);
    for (int i = 0; i < CLOSE_N; i++) {
        ck_assert_int_eq(d[i].n, 1);
        ck_assert_msg(d[i].rc == DLOCK_ECANCELED || (!parking && d[i].rc == DLOCK_EBUSY),
                      "acquire %d: %s (%s)", i, dlock_err_name(d[i].rc), d[i].msg);
    }
    for (int i = 0; i < CLOSE_N; i++)
        dlock_lock_free(l[i]);
    tu_sleep_ms(100);
    for (int i = 0; i < CLOSE_N; i++)
        ck_assert_int_eq(d[i].n, 1); /* none after close */
    for (int i = 0; i < CLOSE_N; i++) {
        ck_assert_uint_eq(dlock_hold_count(holders[i]), 1);
        TU_RELEASE_OK(holders[i]);
        dlock_lock_free(holders[i]);
    }
    dlock_client_close(c2);
}

/* ------------------------------------------------------------------ main */

/* The fixtures this suite runs on (see the top of the file). */
static const char *const FIXTURES[] = {"file", "redis", "redis-simple", "redis-fair", "etcd",
                                       "zk",   NULL};

static bool runs_here(const struct ct_fixture *f, const char *test)
{
    (void)test;
    for (size_t i = 0; FIXTURES[i]; i++)
        if (strcmp(f->name, FIXTURES[i]) == 0)
            return true;
    return false;
}

int main(void)
{
    return ct_main("contract_async", "a", runs_here);
}
