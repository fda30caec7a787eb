/* check_core.c -- the core's own machinery, apart from any one backend:
 * the waitset (FIFO, one wake per release, a wake passed on by a waiter
 * that leaves), the local queue of one client's threads on a name, the
 * cleanup queue the keeper drains, lost callbacks on their own thread,
 * the client's lifetime past dlock_client_close(), losses a backend
 * reports from its own thread, and the thread's message. Most tests use
 * the embedded file backend; lost callbacks need leases (redis: each test
 * starts its own server) and the local queue a backend whose server sees
 * one owner per client (etcd: one member for the case, from an unchecked
 * fixture). Tests include the core's headers to reach its test hooks;
 * they wait on conditions, never on fixed sleeps. DLOCK_TEST=core/,
 * redis/ or etcd/ runs one case.
 */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "dlock.h"
#include "internal.h"
#include "testutil.h"
#ifdef DLOCK_HAVE_ETCD
#include "fixture_etcd.h"
#endif
#ifdef DLOCK_HAVE_REDIS
#include "fixture_redis.h"
#endif

static char *dir, *url;

static void setup(void)
{
    tu_file_fixture("core", &dir, &url);
}

static void teardown(void)
{
    tu_file_fixture_end(&dir, &url);
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

/* WS made, with the N waits of W (unbounded) added in order. */
static void waitset_of(struct dlock__waitset *ws, struct dlock__wait *w, int n)
{
    dlock__waitset_init(ws);
    for (int i = 0; i < n; i++) {
        dlock__wait_init(&w[i], DLOCK__NEVER);
        ck_assert_int_eq(dlock__waitset_add(ws, &w[i]), DLOCK_OK);
    }
}

TU_TEST(waitset, 60)
{
    struct dlock__waitset ws;
    struct dlock__wait w[4];
    waitset_of(&ws, w, 4);
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

/* A keyed wake (ZooKeeper: the deletion of one node) wakes only the
 * waiters whose key is that one, whatever their place in the set; a
 * waiter whose key was cleared or changed is not woken by the old key. */
TU_TEST(waitset_keyed, 60)
{
    struct dlock__waitset ws;
    struct dlock__wait w[3];
    waitset_of(&ws, w, 3);
    char a[] = "/dlock/x/_c_1-lock-0000000001", b[] = "/dlock/x/_c_2-lock-0000000002";
    dlock__waitset_set_key(&ws, &w[1], a);
    dlock__waitset_set_key(&ws, &w[2], b);
    ck_assert_uint_eq(dlock__waitset_wake_key(&ws, "/dlock/x/_c_2-lock-0000000002"), 1);
    ck_assert_uint_eq(dlock__wait_seq(&w[0]), 0);
    ck_assert_uint_eq(dlock__wait_seq(&w[1]), 0);
    ck_assert_uint_eq(dlock__wait_seq(&w[2]), 1);
    ck_assert(dlock__waitset_consume(&ws, &w[2]));
    ck_assert_uint_eq(dlock__waitset_wake_key(&ws, "/dlock/x/other"), 0);
    dlock__waitset_set_key(&ws, &w[1], NULL);
    ck_assert_uint_eq(dlock__waitset_wake_key(&ws, a), 0);
    ck_assert_uint_eq(dlock__wait_seq(&w[1]), 0);
    /* a session event still wakes every one of them */
    ck_assert_uint_eq(dlock__waitset_wake_all(&ws), 3);
    ck_assert_uint_eq(ws.wakes, 4);
    for (int i = 0; i < 3; i++) {
        dlock__waitset_remove(&ws, &w[i]);
        dlock__wait_destroy(&w[i]);
    }
    dlock__waitset_destroy(&ws);
}

/* A head wake goes to the longest-waiting wait only while it holds no
 * wake (an event it may have heard through another set): never to the
 * one behind it, so one release does not cost two tries. */
TU_TEST(waitset_wake_head, 60)
{
    struct dlock__waitset ws;
    struct dlock__wait w[2];
    waitset_of(&ws, w, 2);
    ck_assert_ptr_eq(dlock__waitset_wake_head(&ws), &w[0]);
    ck_assert_ptr_null(dlock__waitset_wake_head(&ws)); /* w[0] holds it: nobody */
    ck_assert_uint_eq(dlock__wait_seq(&w[1]), 0);
    ck_assert(dlock__waitset_consume(&ws, &w[0]));
    ck_assert_ptr_eq(dlock__waitset_wake_head(&ws), &w[0]);
    ck_assert(dlock__waitset_remove(&ws, &w[0]));
    ck_assert_ptr_eq(dlock__waitset_wake_head(&ws), &w[1]);
    ck_assert(dlock__waitset_remove(&ws, &w[1]));
    ck_assert_ptr_null(dlock__waitset_wake_head(&ws)); /* empty */
    dlock__waitset_destroy(&ws);
    for (int i = 0; i < 2; i++)
        dlock__wait_destroy(&w[i]);
}

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

TU_TEST(cleanup_keeper, 60)
{
    dlock_client *c = tu_open(url);
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

TU_TEST(cleanup_close, 60)
{
    char *u = tu_fmt("%s?timeout=60s", url);
    dlock_client *c = tu_open(u);
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

/* ------------------------------------------------------ client lifetime */

TU_TEST(free_after_close, 60)
{
    dlock_client *c = tu_open(url);
    dlock_lock *a = tu_lock(c, "outlive-a"), *b = tu_lock(c, "outlive-b");
    ck_assert_int_eq(dlock_acquire(a, DLOCK_TRY), DLOCK_OK);
    dlock_client_close(c);
    /* The handles still answer (with EMISUSE) and free harmlessly; the
     * client's memory goes with the last one (the SAN build checks). */
    ck_assert_int_eq(dlock_acquire(b, DLOCK_TRY), DLOCK_EMISUSE);
    ck_assert_msg(strstr(dlock_errmsg(), "closed"), "%s", dlock_errmsg());
    ck_assert_int_eq(dlock_release(a), DLOCK_EMISUSE);
    ck_assert_uint_eq(dlock_hold_count(a), 0);
    ck_assert_str_eq(dlock_lock_name(a), "outlive-a");
    TU_FREE_LOCKS(a, b);
    /* Close released the hold. */
    dlock_client *c2 = tu_open(url);
    dlock_lock *a2 = tu_lock(c2, "outlive-a");
    ck_assert_int_eq(dlock_acquire(a2, DLOCK_TRY), DLOCK_OK);
    dlock_lock_free(a2);
    dlock_client_close(c2);
}

/* ------------------------------------------------ losses a backend reports */

struct reporter {
    dlock_client *c;
    struct dlock__hold *h;
    const char *why;
};

/* A client library that takes long to initialize: its init says it
 * started, then sleeps, so a fork lands while another thread is inside
 * dlock__dl_load(). */
static atomic_int slow_init_started;
static void slow_init(void)
{
    atomic_store(&slow_init_started, 1);
    tu_sleep_ms(500);
}
static const struct dlock__dl_sym no_syms[1];
static struct dlock__dl_lib slow_lib = {
    .soname = "libc.so.6", .user = "a test", .package = "libc6",
    .syms = no_syms, .nsyms = 0, .init = slow_init,
};
static struct dlock__dl_lib other_lib = {
    .soname = "libm.so.6", .user = "a test", .package = "libc6",
    .syms = no_syms, .nsyms = 0,
};

static atomic_int slow_lib_loaded;
static void *load_slow_lib(void *arg)
{
    (void)arg;
    dlock__dl_load(&slow_lib);
    atomic_store(&slow_lib_loaded, 1);
    return NULL;
}

/* fork() while another thread loads a client library (the etcd
 * backend's libcurl, OpenSSL for rediss://): the child loads one of its
 * own. It hung for good: the child's copy of the loader's mutex was
 * locked by a thread the child does not have. */
TU_TEST(fork_while_loading_a_library, 30)
{
    /* detached: under TSan the child's copy of a joinable thread that
     * never ran there is reported as leaked when the child exits */
    tu_thread_detached(load_slow_lib, NULL);
    while (!atomic_load(&slow_init_started))
        tu_sleep_ms(1);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGALRM, SIG_DFL); /* not Check's handler, which kills the test */
        alarm(5);                 /* a hang ends the child with SIGALRM */
        if (dlock__dl_load(&other_lib) != DLOCK_OK) {
            fprintf(stderr, "child: %s\n", dlock_errmsg());
            _exit(1);
        }
        _exit(0);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    while (!atomic_load(&slow_lib_loaded))
        tu_sleep_ms(1);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "the child's library load %s",
                  WIFSIGNALED(status) ? "hung (killed by its alarm)" : "failed");
}

/* Plays a backend's own thread (a ZooKeeper watcher). */
static void *report_lost(void *arg)
{
    struct reporter *r = arg;
    dlock__hold_lost(r->c, r->h, r->why);
    return NULL;
}

static void report_from_thread(dlock_client *c, struct dlock__hold *h, const char *why)
{
    struct reporter r = {c, h, why};
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, report_lost, &r), 0);
    pthread_join(t, NULL);
}

TU_TEST(hold_lost, 60)
{
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock(c, "reported"), *other = tu_lock(c, "bystander");
    struct tu_lost n = {0}, m = {0};
    ck_assert_int_eq(dlock_lock_on_lost(l, tu_on_lost, &n), DLOCK_OK);
    ck_assert_int_eq(dlock_lock_on_lost(other, tu_on_lost, &m), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(other, DLOCK_TRY), DLOCK_OK);
    /* One hold: reported at once, the callback fires (the file backend
     * has no lease, so no keeper ran before), the others are untouched. */
    struct dlock__hold *h = l->e->holds;
    report_from_thread(c, h, "session 0x2a expired");
    ck_assert_msg(WAIT_UNTIL(atomic_load(&n.fired) == 1, 30000), "lost callback never fired");
    ck_assert_msg(strstr(n.why, "session 0x2a expired"), "%s", n.why);
    ck_assert_int_eq(dlock_validity_ms(l), 0);
    ck_assert_int_eq(dlock_validity_ms(other), DLOCK_VALID_FOREVER);
    ck_assert_int_eq(dlock_release(l), DLOCK_ELOST);
    ck_assert_msg(strstr(dlock_errmsg(), "session 0x2a expired"), "%s", dlock_errmsg());
    /* A report racing with the release (H is freed now) is ignored. */
    report_from_thread(c, h, "late");
    ck_assert_int_eq(dlock_validity_ms(other), DLOCK_VALID_FOREVER);
    /* Every hold of the client. */
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    report_from_thread(c, NULL, "session 0x2b expired");
    ck_assert(WAIT_UNTIL(atomic_load(&n.fired) == 2 && atomic_load(&m.fired) == 1, 30000));
    ck_assert_int_eq(dlock_release(l), DLOCK_ELOST);
    ck_assert_int_eq(dlock_release(other), DLOCK_ELOST);
    ck_assert_msg(strstr(m.why, "session 0x2b expired"), "%s", m.why);
    TU_FREE_LOCKS(other, l);
    dlock_client_close(c);
}

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

/* One etcd member for the case. */
TU_CASE(etcd, setup_etcd, teardown_etcd, TU_AROUND_CASE)

/* A client of the suite's etcd; fails the test if etcd did not start. */
static dlock_client *open_etcd(void)
{
    ck_assert_msg(F_ok, "etcd did not start: %s", F.error);
    char *u = etcdf_url(&F, NULL, NULL);
    dlock_client *c = tu_open(u);
    free(u);
    return c;
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

TU_TEST_IN(etcd, local_fifo, 60)
{
    dlock_client *c = open_etcd();
    dlock_lock *l = tu_lock(c, "core/fifo");
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

TU_TEST_IN(etcd, local_leaver, 60)
{
    /* The first waiter is canceled as the name is released: whether it
     * saw the hand-over or not, the second waiter gets the name. */
    dlock_client *c = open_etcd();
    dlock_lock *l = tu_lock(c, "core/leaver");
    dlock_lock *l1 = tu_lock(c, "core/leaver");
    dlock_lock *l2 = tu_lock(c, "core/leaver");
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
    tu_acquire_release(l, DLOCK_TRY);
    TU_FREE_LOCKS(l2, l1, l);
    dlock_client_close(c);
}

struct timed_waiter {
    dlock_lock *l;
    int rc;
    char msg[1024];
};

/* A thread that failed a call earlier, then times out in the local
 * queue behind another thread of its client. */
static void *timed_waiter_main(void *arg)
{
    struct timed_waiter *x = arg;
    dlock_lock *bad = NULL;
    if (dlock_lock_new(x->l->c, "", DLOCK_EXCLUSIVE, 0, &bad) != DLOCK_EINVAL)
        return NULL;
    x->rc = dlock_acquire(x->l, 200);
    snprintf(x->msg, sizeof x->msg, "%s", dlock_errmsg());
    return NULL;
}

TU_TEST_IN(etcd, timeout_message, 60)
{
    dlock_client *c = open_etcd();
    dlock_lock *l = tu_lock(c, "core/message");
    ck_assert_int_eq(dlock_acquire(l, DLOCK_FOREVER), DLOCK_OK);
    struct timed_waiter x = {l, -100, ""};
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, timed_waiter_main, &x), 0);
    pthread_join(t, NULL);
    ck_assert_msg(x.rc == DLOCK_ETIMEDOUT, "%s: %s", dlock_err_name(x.rc), x.msg);
    ck_assert_msg(strstr(x.msg, "core/message"), "%s", x.msg);
    ck_assert_msg(!strstr(x.msg, "empty"), "the earlier error leaked in: %s", x.msg);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    dlock_client_close(c);
}
#endif

/* ---------------------------------------------- lost callbacks (redis) */

#ifdef DLOCK_HAVE_REDIS
static struct fx_redis srv;

/* Each test starts its own redis-server. */
TU_CASE(redis, NULL, NULL, TU_AROUND_EACH)

/* A client of a fresh redis-server with LEASE; *OP gets a second client
 * (the operator that force-releases). */
static dlock_client *open_redis(const char *lease, dlock_client **op)
{
    ck_assert_msg(fx_redis_start(&srv, NULL), "redis-server could not be started");
    char *u = tu_fmt("%s?lease=%s", srv.url, lease);
    dlock_client *c = tu_open(u);
    free(u);
    *op = tu_open(srv.url);
    return c;
}

struct batch {
    dlock_lock *l[2];
    atomic_int fired[2], done, freed;
};

/* The first callback to run frees the other handle of its batch. */
static void free_the_other(dlock_lock *l, const char *why, void *arg)
{
    (void)why;
    struct batch *b = arg;
    int me = l == b->l[0] ? 0 : 1, none = -1;
    atomic_fetch_add(&b->fired[me], 1);
    if (atomic_compare_exchange_strong(&b->freed, &none, 1 - me))
        dlock_lock_free(b->l[1 - me]);
    atomic_fetch_add(&b->done, 1);
}

TU_TEST_IN(redis, lost_frees_other, 60)
{
    dlock_client *op, *c = open_redis("1500ms", &op);
    struct batch b = {.freed = -1};
    const char *names[2] = {"batch-a", "batch-b"};
    for (int i = 0; i < 2; i++) {
        b.l[i] = tu_lock(c, names[i]);
        ck_assert_int_eq(dlock_lock_on_lost(b.l[i], free_the_other, &b), DLOCK_OK);
    }
    /* Taken together, renewed in one batch, lost in one pass. */
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(dlock_acquire(b.l[i], DLOCK_TRY), DLOCK_OK);
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(dlock_force_release(op, names[i]), DLOCK_OK);
    /* The keeper used to run the callback itself, and dlock_lock_free()
     * waited for the other callback the keeper had yet to run. */
    ck_assert_msg(WAIT_UNTIL(atomic_load(&b.done) == 1, 30000), "the callback never returned");
    int freed = atomic_load(&b.freed), kept = 1 - freed;
    /* The freed handle's callback was dropped, not run on a freed handle. */
    ck_assert_int_eq(atomic_load(&b.fired[freed]), 0);
    ck_assert_int_eq(atomic_load(&b.fired[kept]), 1);
    ck_assert_int_eq(dlock_release(b.l[kept]), DLOCK_ELOST);
    ck_assert_int_eq(atomic_load(&b.done), 1);
    dlock_lock_free(b.l[kept]);
    TU_CLOSE_CLIENTS(c, op);
    fx_redis_stop(&srv);
}

struct blocker {
    atomic_int entered, go;
};

static void block_until_told(dlock_lock *l, const char *why, void *arg)
{
    (void)l, (void)why;
    struct blocker *b = arg;
    atomic_store(&b->entered, 1);
    while (!atomic_load(&b->go))
        tu_sleep_ms(2);
}

/* The monotonic time until which L's hold is guaranteed: it moves on
 * with each confirmed renewal. */
static int64_t valid_until(dlock_lock *l)
{
    int64_t v = dlock_validity_ms(l);
    ck_assert_msg(v > 0, "hold no longer valid (%lld): %s", (long long)v, dlock_errmsg());
    return dlock__now_ms() + v;
}

TU_TEST_IN(redis, lost_blocks, 60)
{
    dlock_client *op, *c = open_redis("1500ms", &op);
    dlock_lock *lost = tu_lock(c, "blocked"), *kept = tu_lock(c, "renewed");
    struct blocker b = {0};
    ck_assert_int_eq(dlock_lock_on_lost(lost, block_until_told, &b), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(lost, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(kept, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_force_release(op, "blocked"), DLOCK_OK);
    ck_assert_msg(WAIT_UNTIL(atomic_load(&b.entered), 30000), "the lost callback never ran");
    /* While the callback blocks, the other hold's validity moves on:
     * renewals are confirmed (twice, so not one already in flight). */
    for (int i = 0; i < 2; i++) {
        int64_t before = valid_until(kept);
        ck_assert_msg(WAIT_UNTIL(valid_until(kept) > before + 50, 30000),
                      "no renewal confirmed while a lost callback blocks");
    }
    atomic_store(&b.go, 1);
    ck_assert_int_eq(dlock_release(lost), DLOCK_ELOST);
    ck_assert_int_eq(dlock_release(kept), DLOCK_OK);
    TU_FREE_LOCKS(kept, lost);
    TU_CLOSE_CLIENTS(c, op);
    fx_redis_stop(&srv);
}

/* A callback may free its own handle (dlock_lock_free() does not wait for
 * the very callback it is called from). */
static void free_myself(dlock_lock *l, const char *why, void *arg)
{
    (void)why;
    dlock_lock_free(l);
    atomic_store((atomic_int *)arg, 1);
}

TU_TEST_IN(redis, lost_frees_self, 60)
{
    dlock_client *op, *c = open_redis("1500ms", &op);
    dlock_lock *l = tu_lock(c, "self-free");
    atomic_int done = 0;
    ck_assert_int_eq(dlock_lock_on_lost(l, free_myself, &done), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_force_release(op, "self-free"), DLOCK_OK);
    ck_assert_msg(WAIT_UNTIL(atomic_load(&done), 30000), "the callback never returned");
    TU_CLOSE_CLIENTS(c, op);
    fx_redis_stop(&srv);
}

struct slow_cb {
    atomic_int entered, go, freer_tid, freed, freed_when_done;
    char name[64];
};

static void slow_then_touch(dlock_lock *l, const char *why, void *arg)
{
    (void)why;
    struct slow_cb *x = arg;
    atomic_store(&x->entered, 1);
    while (!atomic_load(&x->go))
        tu_sleep_ms(2);
    /* Still ours: dlock_lock_free() in another thread waits for us. */
    snprintf(x->name, sizeof x->name, "%s", dlock_lock_name(l));
    atomic_store(&x->freed_when_done, atomic_load(&x->freed));
}

struct freer {
    dlock_lock *l;
    struct slow_cb *x;
};

static void *free_from_thread(void *arg)
{
    struct freer *f = arg;
    atomic_store(&f->x->freer_tid, (int)dlock__tid());
    dlock_lock_free(f->l);
    atomic_store(&f->x->freed, 1);
    return NULL;
}

/* True once thread TID sleeps (blocked in the kernel, e.g. on a futex). */
static bool thread_sleeps(int tid)
{
    char *path = tu_fmt("/proc/self/task/%d/stat", tid);
    char *st = tu_read_file(path);
    free(path);
    const char *p = st ? strrchr(st, ')') : NULL;
    bool sleeping = p && p[1] == ' ' && p[2] == 'S';
    free(st);
    return sleeping;
}

TU_TEST_IN(redis, free_waits_callback, 60)
{
    dlock_client *op, *c = open_redis("1500ms", &op);
    dlock_lock *l = tu_lock(c, "slow-cb");
    struct slow_cb x = {0};
    ck_assert_int_eq(dlock_lock_on_lost(l, slow_then_touch, &x), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_force_release(op, "slow-cb"), DLOCK_OK);
    ck_assert_msg(WAIT_UNTIL(atomic_load(&x.entered), 30000), "the callback never ran");
    struct freer f = {l, &x};
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, free_from_thread, &f), 0);
    /* The freeing thread blocks (or, wrongly, finishes) before we let the
     * callback go on. */
    ck_assert(WAIT_UNTIL(atomic_load(&x.freer_tid) != 0, 30000));
    ck_assert(WAIT_UNTIL(atomic_load(&x.freed) || thread_sleeps(atomic_load(&x.freer_tid)),
                         30000));
    ck_assert_int_eq(atomic_load(&x.freed), 0);
    atomic_store(&x.go, 1);
    pthread_join(t, NULL);
    ck_assert_int_eq(atomic_load(&x.freed_when_done), 0);
    ck_assert_str_eq(x.name, "slow-cb");
    TU_CLOSE_CLIENTS(c, op);
    fx_redis_stop(&srv);
}

struct closer {
    dlock_client *c;
    atomic_int done;
};

/* Two threads take turns on one handle-owned handle, each acquiring and
 * then releasing. A release is at the server while the other thread's
 * acquire, with the same owner id, may be sent: it must wait for the
 * release, or Redis takes the dying hold for a re-entry (the old token,
 * then deleted by the release) and a later release finds it gone. */
struct turns {
    dlock_lock *l;
    int bad_acquire, bad_release;
};

static void *take_turns(void *arg)
{
    struct turns *t = arg;
    for (int i = 0; i < 300; i++) {
        int rc = dlock_acquire(t->l, DLOCK_FOREVER);
        if (rc) {
            t->bad_acquire = rc;
            break;
        }
        if ((rc = dlock_release(t->l))) {
            t->bad_release = rc;
            break;
        }
    }
    return NULL;
}

TU_TEST_IN(redis, handle_owned_turns, 120)
{
    dlock_client *op = NULL;
    /* the simple layout deletes the key on release: the worst case */
    dlock_client *c = open_redis("30s&layout=simple", &op);
    dlock_lock *l = NULL;
    ck_assert_int_eq(dlock_lock_new(c, "turns", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED, &l),
                     DLOCK_OK);
    struct turns t[2] = {{l, 0, 0}, {l, 0, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, take_turns, &t[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(!t[i].bad_acquire && !t[i].bad_release,
                      "thread %d: acquire %s, release %s", i, dlock_err_name(t[i].bad_acquire),
                      dlock_err_name(t[i].bad_release));
    ck_assert_uint_eq(dlock_hold_count(l), 0);
    dlock_lock_free(l);
    TU_CLOSE_CLIENTS(c, op);
    fx_redis_stop(&srv);
}

/* Whether the keeper has L's one hold in a renewal (renew() running). */
static bool renewing(dlock_lock *l)
{
    pthread_mutex_lock(&l->c->mu);
    bool r = l->e->holds && l->e->holds->renewing;
    pthread_mutex_unlock(&l->c->mu);
    return r;
}

/* A hold already lost, given up within a deadline while the keeper's
 * renewal of it is under way (a canceled multi wait's give-back): the
 * keeper gives it back once renew() returns, and the release reports the
 * loss, DLOCK_ELOST with its reason, as dlock_release() does. The server
 * is stopped so the renewal (a third of the 10 s lease on) waits; the
 * loss is reported as a backend's own thread does (a zk session expiry).
 * (It said DLOCK_OK.) */
TU_TEST_IN(redis, lost_hold_given_back, 60)
{
    dlock_client *op, *c = open_redis("10s", &op);
    dlock_lock *l = NULL;
    ck_assert_int_eq(dlock_lock_new(c, "given-back", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED, &l),
                     DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    tu_pause(srv.pid);
    ck_assert_msg(WAIT_UNTIL(renewing(l), 30000), "the keeper never renewed the hold");
    report_from_thread(c, NULL, "session 0x2c expired");
    int rc = dlock__release_within(l, dlock__now_ms() + 100);
    char msg[DLOCK__MSG_MAX];
    snprintf(msg, sizeof msg, "%s", dlock_errmsg());
    kill(srv.pid, SIGCONT);
    ck_assert_msg(rc == DLOCK_ELOST, "release of a lost hold: %s (%s)", dlock_err_name(rc), msg);
    ck_assert_msg(strstr(msg, "session 0x2c expired"), "%s", msg);
    ck_assert_uint_eq(dlock_hold_count(l), 0);
    dlock_lock_free(l);
    TU_CLOSE_CLIENTS(c, op);
    fx_redis_stop(&srv);
}

static void close_my_client(dlock_lock *l, const char *why, void *arg)
{
    (void)l, (void)why;
    struct closer *x = arg;
    dlock_client_close(x->c);
    atomic_store(&x->done, 1);
}

TU_TEST_IN(redis, lost_closes, 60)
{
    dlock_client *op, *c = open_redis("1500ms", &op);
    dlock_lock *l = tu_lock(c, "closer"), *other = tu_lock(c, "closer-other");
    struct closer x = {c, 0};
    ck_assert_int_eq(dlock_lock_on_lost(l, close_my_client, &x), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(other, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_force_release(op, "closer"), DLOCK_OK);
    ck_assert_msg(WAIT_UNTIL(atomic_load(&x.done), 30000), "the callback never returned");
    /* The close released our other hold and left the handles to free. */
    ck_assert_int_eq(dlock_release(other), DLOCK_EMISUSE);
    TU_FREE_LOCKS(l, other);
    dlock_lock *probe = tu_lock(op, "closer-other");
    ck_assert_int_eq(dlock_acquire(probe, DLOCK_TRY), DLOCK_OK);
    dlock_lock_free(probe);
    dlock_client_close(op);
    fx_redis_stop(&srv);
}
#endif

int main(void)
{
    return tu_main("core", setup, teardown);
}
