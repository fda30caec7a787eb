/* check_contract_async.c -- the asynchronous calls (dlock_acquire_async(),
 * dlock_client_fd(), dlock_dispatch()) on the contract fixtures
 * (tests/lib/contract.h), one test case per backend: the example programs
 * examples/async_uv.c and examples/async_event.c run against the
 * fixture's server, their loop's timer firing while their acquire waits;
 * `dlock bench async` where waits park.
 *
 * A backend whose waits do not park yet answers a waiting asynchronous
 * acquire with DLOCK_ENOTSUP naming itself (dlock.h, "asynchronous
 * calls"); there each test asserts that refusal instead, so a backend
 * that learns to park is tested as one the day it lands, with no change
 * here. The fixtures: file, redis in its three layouts, etcd and
 * ZooKeeper -- those that park or are being taught to. TLS, Sentinel and
 * Cluster reach the same parking code as redis:// (they change how the
 * connection is made), and postgres, mysql and redlock refuse waits with
 * the same message path: left out to keep the suite to seconds per
 * fixture (add a name to FIXTURES to run one).
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

/* `dlock bench async -W 3` measures where W waiters of one client park
 * on one name, and elsewhere fails with exit 69 saying why: the
 * backend's refusal to park, or its one acquire per name per client. */
TU_TEST(bench_async_where_waits_park, 90)
{
    dlock_client *c = ct_open_test(NULL);
    char why[256];
    bool parking = parks(c, why, sizeof why), shared = parking && waits_share_a_client(c);
    dlock_client_close(c);
    char *url = ct_test_url(NULL), *out = NULL, *err = NULL;
    int code = TU_DLOCK(&out, &err, NULL, "-u", url, "bench", "async", "-W", "3");
    if (shared)
        ck_assert_msg(code == 0 && strstr(out, "hand-off p99") && strstr(out, "memory per waiter"),
                      "exit %d: %s%s", code, out, err);
    else if (parking)
        ck_assert_msg(code == 69 && strstr(err, "lets one client acquire a name once at a time"),
                      "exit %d: %s%s", code, out, err);
    else
        ck_assert_msg(code == 69 && strstr(err, why), "exit %d, not with \"%s\": %s%s", code, why,
                      out, err);
    free(out);
    free(err);
    free(url);
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
