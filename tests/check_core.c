/* check_core.c -- the core's own machinery, apart from any one backend:
 * the waitset (FIFO, one wake per release, a wake passed on by a waiter
 * that leaves), the local queue of one client's threads on a name, and
 * the cleanup queue the keeper drains. Most tests use the embedded file
 * backend; the local queue exists only for backends whose server sees one
 * owner per client (etcd, ZooKeeper), so its tests start a real etcd
 * member from an unchecked fixture. Tests include the core's headers to
 * reach its test hooks; they wait on conditions, never on fixed sleeps.
 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"
#include "dlock.h"
#include "internal.h"
#include "testutil.h"
#ifdef DLOCK_HAVE_ETCD
#include "fixture_etcd.h"
#endif

static char *dir, *url;

static void setup(void)
{
    dir = tu_tmpdir("core");
    url = tu_fmt("file://%s", dir);
}

static void teardown(void)
{
    tu_rmrf(dir);
    free(dir);
    free(url);
}

static dlock_client *open_url(const char *u)
{
    dlock_client *c = NULL;
    int rc = dlock_open(u, &c);
    ck_assert_msg(rc == DLOCK_OK, "open %s: %s: %s", u, dlock_err_name(rc), dlock_errmsg());
    return c;
}

static dlock_lock *new_lock(dlock_client *c, const char *name)
{
    dlock_lock *l = NULL;
    int rc = dlock_lock_new(c, name, DLOCK_EXCLUSIVE, 0, &l);
    ck_assert_msg(rc == DLOCK_OK, "lock_new %s: %s", name, dlock_errmsg());
    return l;
}

/* Poll COND every millisecond until true; false after TIMEOUT_MS (a bound
 * so a hang fails the test, never a claim about speed). */
#define WAIT_UNTIL(cond, timeout_ms)                                   \
    ({                                                                 \
        int64_t until_ = dlock__now_ms() + (timeout_ms);               \
        bool ok_;                                                      \
        while (!(ok_ = (cond)) && dlock__now_ms() < until_)            \
            tu_sleep_ms(1);                                            \
        ok_;                                                           \
    })

/* ------------------------------------------------------------- waitset */

START_TEST(test_waitset_order_and_passing_on)
{
    struct dlock__waitset ws;
    struct dlock__wait w[4];
    dlock__waitset_init(&ws);
    for (int i = 0; i < 4; i++) {
        dlock__wait_init(&w[i], DLOCK__NEVER);
        ck_assert_int_eq(dlock__waitset_add(&ws, &w[i]), DLOCK_OK);
    }
    ck_assert_uint_eq(dlock__waitset_count(&ws), 4);
    /* The longest waiting first, each once until it consumes its wake. */
    ck_assert_ptr_eq(dlock__waitset_wake_one(&ws), &w[0]);
    ck_assert_uint_eq(dlock__wait_seq(&w[0]), 1);
    ck_assert_ptr_eq(dlock__waitset_wake_one(&ws), &w[1]);
    ck_assert_uint_eq(dlock__wait_seq(&w[2]), 0);
    /* w[0] uses its wake and stays; w[1] leaves holding one: remove()
     * tells it to pass the wake on, which goes to w[2], not w[0]. */
    ck_assert(dlock__waitset_consume(&ws, &w[0]));
    ck_assert(!dlock__waitset_consume(&ws, &w[0]));
    ck_assert(dlock__waitset_remove(&ws, &w[1]));
    ck_assert_ptr_eq(dlock__waitset_wake_one(&ws), &w[0]);
    ck_assert_ptr_eq(dlock__waitset_wake_one(&ws), &w[2]);
    ck_assert(!dlock__waitset_remove(&ws, &w[3])); /* never woken */
    ck_assert(!dlock__waitset_remove(&ws, &w[3])); /* absent: no-op */
    ck_assert_ptr_null(dlock__waitset_wake_one(&ws)); /* both hold wakes */
    ck_assert_uint_eq(dlock__waitset_count(&ws), 2);
    ck_assert_uint_eq(dlock__waitset_wake_all(&ws), 2);
    ck_assert_uint_eq(ws.wakes, 6);
    ck_assert(dlock__waitset_remove(&ws, &w[0]));
    ck_assert(dlock__waitset_remove(&ws, &w[2]));
    ck_assert_uint_eq(dlock__waitset_count(&ws), 0);
    dlock__waitset_destroy(&ws);
    for (int i = 0; i < 4; i++)
        dlock__wait_destroy(&w[i]);
}
END_TEST

/* ------------------------------------------------------- cleanup queue */

struct piece {
    atomic_int calls, freed;
    int fail_first;   /* fail this many calls, then succeed; -1 = always */
    int64_t last_deadline, last_call_at;
    void *bstate;
};

static int piece_fn(void *bstate, void *arg, int64_t deadline)
{
    struct piece *p = arg;
    p->bstate = bstate;
    p->last_deadline = deadline;
    p->last_call_at = dlock__now_ms();
    int n = atomic_fetch_add(&p->calls, 1) + 1;
    if (p->fail_first < 0 || n <= p->fail_first)
        return dlock__err(DLOCK_ECONN, "test: server unreachable (call %d)", n);
    return DLOCK_OK;
}

static void piece_free(void *arg)
{
    struct piece *p = arg;
    atomic_fetch_add(&p->freed, 1);
}

START_TEST(test_cleanup_keeper_retries_until_done)
{
    dlock_client *c = open_url(url);
    struct piece p = {.fail_first = 2};
    /* The caller's message is not touched by queueing. */
    dlock__err(DLOCK_EIO, "the caller's own words");
    ck_assert_int_eq(dlock__cleanup_add(c, "delete x", piece_fn, &p, piece_free), DLOCK_OK);
    ck_assert_str_eq(dlock_errmsg(), "the caller's own words");
    /* No caller does anything: the keeper runs it, retries twice after
     * backoff, and frees it once it succeeds. */
    ck_assert_msg(WAIT_UNTIL(atomic_load(&p.freed) == 1, 30000), "calls %d, freed %d",
                  atomic_load(&p.calls), atomic_load(&p.freed));
    ck_assert_int_eq(atomic_load(&p.calls), 3);
    ck_assert_ptr_nonnull(p.bstate);
    /* Each call had a bounded slice: at most an op timeout. */
    ck_assert(p.last_deadline != DLOCK__NEVER);
    ck_assert(p.last_deadline <= p.last_call_at + 5000);
    dlock_client_close(c);
    ck_assert_int_eq(atomic_load(&p.calls), 3);
    ck_assert_int_eq(atomic_load(&p.freed), 1);
}
END_TEST

START_TEST(test_cleanup_close_tries_once_more_then_frees)
{
    char *u = tu_fmt("%s?timeout=60s", url);
    dlock_client *c = open_url(u);
    free(u);
    struct piece p = {.fail_first = -1}, q = {.fail_first = -1};
    ck_assert_int_eq(dlock__cleanup_add(c, "delete p", piece_fn, &p, piece_free), DLOCK_OK);
    ck_assert(WAIT_UNTIL(atomic_load(&p.calls) >= 2, 30000));
    ck_assert_int_eq(dlock__cleanup_add(c, "delete q", piece_fn, &q, NULL), DLOCK_OK);
    ck_assert(WAIT_UNTIL(atomic_load(&q.calls) >= 1, 30000));
    int before = atomic_load(&p.calls), qbefore = atomic_load(&q.calls);
    ck_assert_int_eq(atomic_load(&p.freed), 0);
    dlock__err(DLOCK_EIO, "kept across close");
    dlock_client_close(c);
    /* Close ran each piece once more (the keeper may have been in one
     * already, close waits for it), then gave up and freed it. */
    ck_assert_int_ge(atomic_load(&p.calls), before + 1);
    ck_assert_int_ge(atomic_load(&q.calls), qbefore + 1);
    ck_assert_int_eq(atomic_load(&p.freed), 1);
    ck_assert_str_eq(dlock_errmsg(), "kept across close");
}
END_TEST

/* ------------------------------------------------ local queue (etcd) */

#ifdef DLOCK_HAVE_ETCD
static struct etcdf F;
static bool F_ok;

static void setup_etcd(void)
{
    F_ok = etcdf_start(&F, 1);
    if (!F_ok)
        fprintf(stderr, "fixture: %s\n", F.error);
}

static void teardown_etcd(void)
{
    etcdf_stop(&F);
}

#define NQ 4
struct queuer {
    dlock_lock *l;
    int index;
    int *order;
    atomic_int *norder;
    int rc;
};

static void *queuer_main(void *arg)
{
    struct queuer *q = arg;
    q->rc = dlock_acquire(q->l, DLOCK_FOREVER);
    if (q->rc == DLOCK_OK) {
        q->order[atomic_fetch_add(q->norder, 1)] = q->index;
        q->rc = dlock_release(q->l);
    }
    return NULL;
}

START_TEST(test_local_queue_fifo_one_wake_per_release)
{
    ck_assert_msg(F_ok, "etcd did not start: %s", F.error);
    char *u = etcdf_url(&F, NULL, NULL);
    dlock_client *c = open_url(u);
    free(u);
    dlock_lock *l = new_lock(c, "core/fifo");
    ck_assert_int_eq(dlock_acquire(l, DLOCK_FOREVER), DLOCK_OK);
    int order[NQ];
    atomic_int norder = 0;
    struct queuer q[NQ];
    pthread_t t[NQ];
    /* Queue the threads one after another: each is in the local queue
     * before the next starts. */
    for (int i = 0; i < NQ; i++) {
        q[i] = (struct queuer){l, i, order, &norder, -100};
        ck_assert_int_eq(pthread_create(&t[i], NULL, queuer_main, &q[i]), 0);
        ck_assert_msg(WAIT_UNTIL(dlock__local_waiters(l, NULL) == (size_t)i + 1, 30000),
                      "thread %d never queued", i);
    }
    uint64_t wakes = 0;
    dlock__local_waiters(l, &wakes);
    ck_assert_uint_eq(wakes, 0);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    for (int i = 0; i < NQ; i++) {
        pthread_join(t[i], NULL);
        ck_assert_msg(q[i].rc == DLOCK_OK, "thread %d: %s", i, dlock_err_name(q[i].rc));
    }
    ck_assert_int_eq(atomic_load(&norder), NQ);
    for (int i = 0; i < NQ; i++)
        ck_assert_msg(order[i] == i, "acquired in order %d %d %d %d, queued 0 1 2 3", order[0],
                      order[1], order[2], order[3]);
    /* One wake per release that had a waiter: ours and the first NQ-1. */
    ck_assert_uint_eq(dlock__local_waiters(l, &wakes), 0);
    ck_assert_uint_eq(wakes, NQ);
    dlock_lock_free(l);
    dlock_client_close(c);
}
END_TEST

struct leaver {
    dlock_lock *l;
    int rc;
};

static void *leaver_main(void *arg)
{
    struct leaver *x = arg;
    x->rc = dlock_acquire(x->l, DLOCK_FOREVER);
    if (x->rc == DLOCK_OK)
        dlock_release(x->l);
    return NULL;
}

START_TEST(test_local_queue_leaver_passes_on)
{
    /* The first waiter is canceled as the name is released: whether it
     * saw the hand-over or not, the second waiter gets the name. */
    ck_assert_msg(F_ok, "etcd did not start: %s", F.error);
    char *u = etcdf_url(&F, NULL, NULL);
    dlock_client *c = open_url(u);
    free(u);
    dlock_lock *l = new_lock(c, "core/leaver");
    dlock_lock *l1 = new_lock(c, "core/leaver");
    dlock_lock *l2 = new_lock(c, "core/leaver");
    ck_assert_int_eq(dlock_acquire(l, DLOCK_FOREVER), DLOCK_OK);
    struct leaver a = {l1, -100}, b = {l2, -100};
    pthread_t ta, tb;
    ck_assert_int_eq(pthread_create(&ta, NULL, leaver_main, &a), 0);
    ck_assert(WAIT_UNTIL(dlock__local_waiters(l, NULL) == 1, 30000));
    ck_assert_int_eq(pthread_create(&tb, NULL, leaver_main, &b), 0);
    ck_assert(WAIT_UNTIL(dlock__local_waiters(l, NULL) == 2, 30000));
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    ck_assert_int_eq(dlock_lock_cancel(l1), DLOCK_OK);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    ck_assert_msg(a.rc == DLOCK_OK || a.rc == DLOCK_ECANCELED, "a: %s", dlock_err_name(a.rc));
    ck_assert_msg(b.rc == DLOCK_OK, "b: %s", dlock_err_name(b.rc));
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l2);
    dlock_lock_free(l1);
    dlock_lock_free(l);
    dlock_client_close(c);
}
END_TEST
#endif

static Suite *core_suite(void)
{
    Suite *s = suite_create("core");
    struct {
        const char *name;
        const TTest *test;
        int backend; /* 0 file, 1 etcd */
    } tests[] = {
        {"waitset", test_waitset_order_and_passing_on, 0},
        {"cleanup_keeper", test_cleanup_keeper_retries_until_done, 0},
        {"cleanup_close", test_cleanup_close_tries_once_more_then_frees, 0},
#ifdef DLOCK_HAVE_ETCD
        {"local_fifo", test_local_queue_fifo_one_wake_per_release, 1},
        {"local_leaver", test_local_queue_leaver_passes_on, 1},
#endif
    };
    TCase *etcd_case = NULL;
    for (size_t i = 0; i < sizeof tests / sizeof *tests; i++) {
        if (tests[i].backend == 1) {
            /* One etcd member for every test that needs one. */
            if (!etcd_case) {
#ifdef DLOCK_HAVE_ETCD
                etcd_case = tcase_create("etcd");
                tcase_add_unchecked_fixture(etcd_case, setup_etcd, teardown_etcd);
                tcase_set_timeout(etcd_case, 60);
                suite_add_tcase(s, etcd_case);
#endif
            }
            tcase_add_test(etcd_case, tests[i].test);
            continue;
        }
        TCase *tc = tcase_create(tests[i].name);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, tests[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    return tu_run_suite(core_suite());
}
