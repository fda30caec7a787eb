/* check_zk.c -- the ZooKeeper backend against real ZooKeeper servers.
 *
 * Each test case starts its own servers from an unchecked fixture (a JVM
 * takes seconds to start, so the tests of a case share them; each test
 * uses its own lock names): a standalone server for the recipe, errors and
 * faults of a holder; another standalone one that tests stop and restart;
 * a three-server ensemble whose leader is killed under a held lock.
 * Holders that are killed or paused are forked children with their own
 * client. A test that plays Curator's part creates "_c_<guid>-lock-" nodes
 * with the raw C client, as InterProcessMutex does, and checks that dlock
 * and it exclude each other and keep one queue in sequence order.
 */
#include <arpa/inet.h>
#include <check.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define THREADED /* the synchronous calls of libzookeeper_mt */
#include <zookeeper.h>

#include "dlock.h"
#include "fixture_zk.h"
#include "relay.h"
#include "testutil.h"

static struct zkf F;
static bool F_ok;

static void start_servers(int n)
{
    F_ok = zkf_start(&F, n);
    if (!F_ok)
        fprintf(stderr, "fixture: %s\n", F.error);
}

static void setup_standalone(void)
{
    start_servers(1);
}

static void setup_ensemble(void)
{
    start_servers(3);
}

static void teardown_servers(void)
{
    zkf_stop(&F);
}

/* Each case's servers are started once around the case. A server a test
 * stops and starts again is that test's alone (restart, watch, outage: the
 * restarted JVM is the forked test's child and ends with it; stopped: its
 * server is stopped (SIGSTOP) and continued by the test). */
TU_CASE(standalone, setup_standalone, teardown_servers, TU_AROUND_CASE)
TU_CASE(restart, setup_standalone, teardown_servers, TU_AROUND_CASE)
TU_CASE(watch, setup_standalone, teardown_servers, TU_AROUND_CASE)
TU_CASE(outage, setup_standalone, teardown_servers, TU_AROUND_CASE)
TU_CASE(stopped, setup_standalone, teardown_servers, TU_AROUND_CASE)
TU_CASE(ensemble, setup_ensemble, teardown_servers, TU_AROUND_CASE)

/* Every test starts here, or in what gives it a URL (url_with, and the
 * frames opened on it) or a proxy (proxied_open): a test whose server
 * could not start fails. */
#define REQUIRE_SERVERS() ck_assert_msg(F_ok, "ZooKeeper did not start: %s", F.error)

/* The URL of the servers (PATH: a chroot, QUERY: options; either NULL:
 * none), once the test has checked that they started. */
static char *url_with(const char *path, const char *query)
{
    REQUIRE_SERVERS();
    return zkf_url(&F, path, query);
}

/* A client straight to the servers (QUERY: the URL's options) with a
 * handle on NAME: the frame of the server-fault tests (tu_solo_close()
 * ends it). */
static struct tu_solo direct_open(const char *query, const char *name)
{
    return tu_solo_open(url_with(NULL, query), name);
}

/* ------------------------------------------------------- raw ZooKeeper */

/* A raw C-client session: plays other clients (Curator) and checks what
 * dlock wrote. */
static void raw_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    (void)zh, (void)type, (void)state, (void)path, (void)ctx;
}

static void raw_quiet(const char *msg)
{
    (void)msg;
}

static zhandle_t *raw_open(const char *auth)
{
    zhandle_t *zh = zookeeper_init2(F.hosts, raw_watcher, 10000, NULL, NULL, 0, raw_quiet);
    ck_assert_ptr_nonnull(zh);
    for (int i = 0; i < 200 && zoo_state(zh) != ZOO_CONNECTED_STATE; i++)
        tu_sleep_ms(50);
    ck_assert_msg(zoo_state(zh) == ZOO_CONNECTED_STATE, "raw client cannot connect to %s",
                  F.hosts);
    if (auth) {
        int rc = zoo_add_auth(zh, "digest", auth, (int)strlen(auth), NULL, NULL);
        ck_assert_int_eq(rc, ZOK);
    }
    return zh;
}

static void raw_mkdirs(zhandle_t *zh, const char *path, int last_mode, const struct ACL_vector *acl)
{
    char *p = strdup(path);
    for (char *s = strchr(p + 1, '/');; s = strchr(s + 1, '/')) {
        if (s)
            *s = 0;
        int rc = zoo_create(zh, p, NULL, -1, acl, s ? ZOO_PERSISTENT : last_mode, NULL, 0);
        ck_assert_msg(rc == ZOK || rc == ZNODEEXISTS, "create %s: %s", p, zerror(rc));
        if (!s)
            break;
        *s = '/';
    }
    free(p);
}

/* The frame of a test on the standalone server: a client of the URL with
 * QUERY and, with RAW, a raw session beside it (to play Curator or see
 * what dlock wrote). zk_close() closes both and frees the URL. */
struct zk_frame {
    char *url;
    dlock_client *c;
    zhandle_t *zh;
};

static struct zk_frame zk_open(const char *query, bool raw)
{
    struct zk_frame t = {url_with(NULL, query), NULL, NULL};
    t.c = tu_open(t.url);
    if (raw)
        t.zh = raw_open(NULL);
    return t;
}

static void zk_close(struct zk_frame *t)
{
    if (t->zh)
        zookeeper_close(t->zh);
    dlock_client_close(t->c);
    free(t->url);
}

/* Sorted lock children of PATH, as Curator sorts them (by the 10 digits
 * of the sequence that end every kind: "lock-", "__READ__", "__WRIT__");
 * *n set. Caller frees with free_strings. */
static const char *seq_of(const char *node)
{
    size_t n = strlen(node);
    return n > 10 ? node + n - 10 : node;
}

static int cmp_seq(const void *a, const void *b)
{
    return strcmp(seq_of(*(char *const *)a), seq_of(*(char *const *)b));
}

static char **raw_children(zhandle_t *zh, const char *path, int *n)
{
    struct String_vector v = {0, NULL};
    int rc = zoo_get_children(zh, path, 0, &v);
    if (rc == ZNONODE) {
        *n = 0;
        return NULL;
    }
    ck_assert_msg(rc == ZOK, "children of %s: %s", path, zerror(rc));
    char **out = calloc((size_t)v.count + 1, sizeof *out);
    for (int i = 0; i < v.count; i++)
        out[i] = strdup(v.data[i]);
    qsort(out, (size_t)v.count, sizeof *out, cmp_seq);
    *n = v.count;
    deallocate_String_vector(&v);
    return out;
}

static void free_strings(char **s, int n)
{
    for (int i = 0; i < n; i++)
        free(s[i]);
    free(s);
}

/* Contender nodes ("_c_...") under PATH. */
static int raw_contenders(zhandle_t *zh, const char *path)
{
    int n = 0, k = 0;
    char **kids = raw_children(zh, path, &n);
    for (int i = 0; i < n; i++)
        k += strncmp(kids[i], "_c_", 3) == 0;
    free_strings(kids, n);
    return k;
}

/* An empty lock node is a container the server reaps within a second
 * here: a foreign child of the raw session keeps LOCKPATH (dlock ignores
 * it), so that a create sent while the replies are dropped finds it. */
static void raw_keep_lock_node(zhandle_t *zh, const char *lockpath)
{
    raw_mkdirs(zh, lockpath, ZOO_CONTAINER, &ZOO_OPEN_ACL_UNSAFE);
    char *keep = tu_fmt("%s/keep", lockpath);
    int rc = zoo_create(zh, keep, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL, NULL, 0);
    ck_assert_msg(rc == ZOK || rc == ZNODEEXISTS, "create %s: %s", keep, zerror(rc));
    free(keep);
}

/* Create a Curator contender node named MARK ("lock-" of InterProcessMutex,
 * "__READ__" or "__WRIT__" of InterProcessReadWriteLock) under LOCKPATH the
 * way Curator does (protected mode, EPHEMERAL_SEQUENTIAL): returns its name. */
static char *curator_node(zhandle_t *zh, const char *lockpath, const char *mark)
{
    raw_mkdirs(zh, lockpath, ZOO_CONTAINER, &ZOO_OPEN_ACL_UNSAFE);
    char guid[64];
    snprintf(guid, sizeof guid, "%08x-%04x-4%03x-8%03x-%012x", (unsigned)rand(),
             (unsigned)rand() & 0xffff, (unsigned)rand() & 0xfff, (unsigned)rand() & 0xfff,
             (unsigned)rand());
    char *prefix = tu_fmt("%s/_c_%s-%s", lockpath, guid, mark);
    char created[1024];
    int rc = zoo_create(zh, prefix, "127.0.0.1", 9, &ZOO_OPEN_ACL_UNSAFE,
                        ZOO_EPHEMERAL_SEQUENTIAL, created, sizeof created);
    ck_assert_msg(rc == ZOK, "create %s: %s", prefix, zerror(rc));
    free(prefix);
    return strdup(strrchr(created, '/') + 1);
}

static char *curator_contend(zhandle_t *zh, const char *lockpath)
{
    return curator_node(zh, lockpath, "lock-");
}

/* Whether Curator's InterProcessReadWriteLock would say that its node NODE
 * under LOCKPATH holds: a "__READ__" node when no "__WRIT__" node is before
 * it (its readLockPredicate), a "__WRIT__" node when it is first (maxLeases
 * 1). */
static bool curator_rw_holds(zhandle_t *zh, const char *lockpath, const char *node)
{
    int n = 0;
    char **kids = raw_children(zh, lockpath, &n);
    bool reader = strstr(node, "__READ__") != NULL, holds = false, writer_before = false;
    for (int i = 0; i < n; i++) {
        if (strcmp(kids[i], node) == 0) {
            holds = reader ? !writer_before : i == 0;
            break;
        }
        if (strstr(kids[i], "__WRIT__"))
            writer_before = true;
        else if (!reader && !strstr(kids[i], "__READ__"))
            continue; /* (not a contender: "keep") */
        if (!reader)
            break; /* something before a writer: it waits */
    }
    free_strings(kids, n);
    return holds;
}

/* Delete Curator's node NODE under LOCKPATH (its release) and free NODE. */
static void curator_release(zhandle_t *zh, const char *lockpath, char *node)
{
    char *path = tu_fmt("%s/%s", lockpath, node);
    ck_assert_int_eq(zoo_delete(zh, path, -1), ZOK);
    free(path);
    free(node);
}

/* dlock's own client handles, caught by interposing zookeeper_init2 (the
 * test binary's definition comes first; it calls the library's): a test
 * can then read the session id and password dlock's client holds, and
 * play another process that takes the session over and closes it. */
static zhandle_t *dlock_handles[64];
static atomic_int ndlock_handles;

zhandle_t *zookeeper_init2(const char *host, watcher_fn fn, int recv_timeout,
                           const clientid_t *clientid, void *context, int flags,
                           log_callback_fn log_callback)
{
    typedef zhandle_t *(*init2_fn)(const char *, watcher_fn, int, const clientid_t *, void *,
                                   int, log_callback_fn);
    static init2_fn real;
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "zookeeper_init2");
    zhandle_t *zh = real(host, fn, recv_timeout, clientid, context, flags, log_callback);
    if (zh && fn != raw_watcher) {
        int i = atomic_fetch_add(&ndlock_handles, 1);
        if (i < 64)
            dlock_handles[i] = zh;
    }
    return zh;
}

/* The handle of the last session dlock started. */
static zhandle_t *dlock_last_handle(void)
{
    int n = atomic_load(&ndlock_handles);
    ck_assert_msg(n > 0 && n <= 64, "no zookeeper_init2 call of dlock seen (%d)", n);
    return dlock_handles[n - 1];
}

/* ------------------------------------------------------------- children */

/* What the lost callback of a test's holds saw (counts the holds lost). */
static struct tu_lost hold_lost;

/* hold_lost, emptied, records L's lost callback. */
static void watch_lost(dlock_lock *l)
{
    atomic_store(&hold_lost.fired, 0);
    dlock_lock_on_lost(l, tu_on_lost, &hold_lost);
}

/* Strings a test allocates before forking children: kept reachable from
 * here so that valgrind, which checks the children too, does not count
 * the children's copies as leaks when they exit. */
static char *before_fork[8];

static char *kept(char *p)
{
    for (size_t i = 0; i < sizeof before_fork / sizeof *before_fork; i++)
        if (!before_fork[i]) {
            before_fork[i] = p;
            break;
        }
    return p;
}

/* ============================================================ the recipe */

/* The requests the server received (its "srvr" count) from every client
 * since it started. */
static long long zk_received(void)
{
    char *srvr = zkf_4lw(F.s[0].port, "srvr");
    const char *at = srvr ? strstr(srvr, "Received: ") : NULL;
    ck_assert_msg(at, "srvr: %s", srvr ? srvr : "no answer");
    long long n = strtoll(at + 10, NULL, 10);
    free(srvr);
    return n;
}

/* An uncontended acquire and release cost three requests (the create and
 * the listing sent with it, the delete), for a client with ?lock_delay=
 * too (beside its marker's four: the arm's setData and create, the
 * release's read and delete): the lock-delay marker is a child
 * of the lock node, seen in that listing, read only when it is there
 * (docs/protocol-zookeeper.md, "Lock-delay"). 20 pairs each, after a
 * first pair made the lock node; two requests of slack for pings. */
TU_TEST_IN(standalone, uncontended_pair_is_three_requests, 60)
{
    const char *opts[] = {NULL, "lock_delay=1m"};
    int pairs = 20;
    for (int i = 0; i < 2; i++) {
        char *url = url_with(NULL, opts[i]);
        dlock_client *c = tu_open(url);
        free(url);
        dlock_lock *l = tu_lock(c, "pair-count");
        tu_acquire_release(l, 5000);
        long long before = zk_received();
        for (int k = 0; k < pairs; k++)
            tu_acquire_release(l, 5000);
        long long other = zk_received() - before - 3 * pairs - (opts[i] ? 4 * pairs : 0);
        ck_assert_msg(other >= 0 && other <= 2,
                      "%s: %d pairs made %lld requests more than 3 each (0 expected)",
                      opts[i] ? opts[i] : "no options", pairs, other);
        TU_FREE_LOCKS(l);
        TU_CLOSE_CLIENTS(c);
    }
}

/* Whether a session other than OWNER's holds a watch on PATH (the
 * server's "wchp": each path, then a line per session watching it). */
static bool others_watch(const char *path, int64_t owner)
{
    char *wchp = zkf_4lw(F.s[0].port, "wchp");
    char *line = wchp ? strstr(wchp, path) : NULL;
    bool watched = false;
    if (line && line[strlen(path)] == '\n') {
        char self[32];
        snprintf(self, sizeof self, "0x%llx", (unsigned long long)owner);
        for (line = strchr(line, '\n'); line && line[1] == '\t' && !watched;
             line = strchr(line + 1, '\n'))
            watched = strncmp(line + 2, self, strlen(self)) != 0 ||
                      !strchr("\n", line[2 + strlen(self)]);
    }
    free(wchp);
    return watched;
}

/* The path of the node holding the lock NAME, through C, and its
 * session in *OWNER (through ZH). */
static char *holder_path(dlock_client *c, zhandle_t *zh, const char *name, int64_t *owner)
{
    dlock_info *info = NULL;
    ck_assert_int_eq(dlock_inspect(c, name, &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_holder_count(info), 1);
    const char *node = dlock_info_holder(info, 0, NULL); /* "<node> (<its data>)" */
    char *path = tu_fmt("/dlock/%s/%.*s", name, (int)strcspn(node, " "), node);
    dlock_info_free(info);
    struct Stat st;
    ck_assert_int_eq(zoo_exists(zh, path, 0, &st), ZOK);
    *owner = st.ephemeralOwner;
    return path;
}

/* A hand-off costs the waiter no request: once it has queued and its
 * watches are set (the node ahead carries one of its session), the
 * release's delete is the only request until the waiter holds -- the
 * deletion's event tells it that it is first
 * (docs/protocol-zookeeper.md, "Hand-off"). Five hand-offs between two
 * clients; the server counts our own "srvr" too (one per hand-off), and
 * two requests of slack for pings. */
TU_TEST_IN(standalone, handoff_costs_the_waiter_no_request, 60)
{
    struct zk_frame zt = zk_open(NULL, true);
    dlock_client *c[2] = {zt.c, tu_open(zt.url)};
    dlock_lock *l[2] = {tu_lock_mode(c[0], "handoff-count", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED),
                        tu_lock_mode(c[1], "handoff-count", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED)};
    ck_assert_int_eq(dlock_acquire(l[0], DLOCK_TRY), DLOCK_OK);
    long long extra = 0;
    int handoffs = 5;
    for (int k = 0; k < handoffs; k++) {
        int holder = k % 2, next = 1 - holder;
        int64_t owner = 0;
        char *path = holder_path(c[holder], zt.zh, "handoff-count", &owner);
        struct tu_waiter w;
        tu_waiter_start_ex(&w, l[next], 30000, NULL, true);
        for (int waited = 0; waited < 20000 && !others_watch(path, owner); waited += 20)
            tu_sleep_ms(20);
        ck_assert_msg(others_watch(path, owner), "the waiter never watched %s", path);
        long long before = zk_received();
        ck_assert_int_eq(dlock_release(l[holder]), DLOCK_OK);
        ck_assert_int_eq(tu_waiter_join(&w), DLOCK_OK);
        extra += zk_received() - before - 2;
        free(path);
    }
    ck_assert_msg(extra <= 2, "%d hand-offs made %lld requests besides the releases (0 expected)",
                  handoffs, extra);
    ck_assert_int_eq(dlock_release(l[handoffs % 2]), DLOCK_OK);
    TU_FREE_LOCKS(l[0], l[1]);
    dlock_client_close(c[1]);
    zk_close(&zt);
}

/* A lock-delay marker (_dlock_delay under the lock node) goes once its
 * delay has run out: the contender that finds the delay over deletes it,
 * so a name does not keep a finished marker (and the lock node a child)
 * forever. Here the hold of a client with lock_delay ends by a force
 * release, the next hold is taken after the delay by a client without
 * the option and released cleanly. Before: the marker stayed, "running",
 * after every such end. */
TU_TEST_IN(standalone, finished_lock_delay_marker_deleted, 60)
{
    struct zk_frame zt = zk_open(NULL, true);
    char *url = url_with(NULL, "lock_delay=1s");
    dlock_client *a = tu_open(url);
    free(url);
    dlock_lock *la = tu_lock(a, "delay-gone"), *lb = tu_lock(zt.c, "delay-gone");
    TU_ACQUIRE_OK(la, DLOCK_TRY);
    struct Stat st;
    ck_assert_int_eq(zoo_exists(zt.zh, "/dlock/delay-gone/_dlock_delay", 0, &st), ZOK);
    ck_assert_int_eq(dlock_force_release(zt.c, "delay-gone"), DLOCK_OK);
    TU_ACQUIRE_OK(lb, 30000); /* waits out the delay */
    TU_RELEASE_OK(lb);
    ck_assert_msg(zoo_exists(zt.zh, "/dlock/delay-gone/_dlock_delay", 0, &st) == ZNONODE,
                  "the finished lock-delay marker is still there");
    dlock_info *info = NULL;
    ck_assert_int_eq(dlock_inspect(zt.c, "delay-gone", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_delay_ms(info), 0);
    dlock_info_free(info);
    TU_FREE_LOCKS(la, lb);
    TU_CLOSE_CLIENTS(a);
    zk_close(&zt);
}

TU_TEST_IN(standalone, acquire_release_token, 90)
{
    struct zk_frame zt = zk_open(NULL, true);
    ck_assert_str_eq(dlock_client_backend(zt.c), "zk");
    dlock_lock *l = tu_lock(zt.c, "basic");
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    uint64_t t1 = tu_token(l);
    ck_assert_uint_gt(t1, 0);
    ck_assert_int_gt(dlock_validity_ms(l), 0);

    /* reentrant: same token, one node */
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    ck_assert_uint_eq(dlock_hold_count(l), 2);
    ck_assert_uint_eq(tu_token(l), t1);

    dlock_info *info = NULL;
    ck_assert_int_eq(dlock_inspect(zt.c, "basic", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_held(info), 1);
    ck_assert_str_eq(dlock_info_key(info), "/dlock/basic");
    ck_assert_uint_eq(dlock_info_token(info), t1);
    ck_assert_uint_eq(dlock_info_holder_count(info), 1);
    const char *holder = dlock_info_holder(info, 0, NULL);
    ck_assert_msg(strncmp(holder, "_c_", 3) == 0 && strstr(holder, "-lock-0000000000"),
                  "holder node %s", holder);
    ck_assert_int_eq(dlock_info_waiter_count(info), 0);
    dlock_info_free(info);

    /* the node on the server is Curator's shape */
    int n;
    char **kids = raw_children(zt.zh, "/dlock/basic", &n);
    ck_assert_int_eq(n, 1);
    ck_assert_msg(strlen(kids[0]) == 3 + 36 + 6 + 10, "node name %s", kids[0]);
    char *path = tu_fmt("/dlock/basic/%s", kids[0]);
    struct Stat st;
    ck_assert_int_eq(zoo_exists(zt.zh, path, 0, &st), ZOK);
    ck_assert_uint_eq((uint64_t)st.czxid, t1);
    ck_assert_int_ne(st.ephemeralOwner, 0);
    free(path);
    free_strings(kids, n);

    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    ck_assert_int_eq(dlock_release(l), DLOCK_ENOTOWNER);
    kids = raw_children(zt.zh, "/dlock/basic", &n);
    ck_assert_int_eq(n, 0);
    free_strings(kids, n);

    ck_assert_int_eq(dlock_inspect(zt.c, "basic", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_held(info), 0);
    dlock_info_free(info);

    /* a new acquisition: a strictly greater token */
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    ck_assert_uint_gt(tu_token(l), t1);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    zk_close(&zt);
}

/* Waiters in their own clients (threads here), each recording the order in
 * which it acquired. */
struct waiter_arg {
    const char *url, *name;
    int id;
    int result;
    uint64_t token;
};

static pthread_mutex_t order_mu = PTHREAD_MUTEX_INITIALIZER;
static int order[8], norder;

static void *waiter_thread(void *p)
{
    struct waiter_arg *a = p;
    struct tu_solo s;
    a->result = tu_solo_open_quiet(a->url, a->name, &s);
    if (a->result)
        return NULL;
    a->result = dlock_acquire(s.l, 30000);
    if (a->result == DLOCK_OK) {
        dlock_token(s.l, &a->token);
        pthread_mutex_lock(&order_mu);
        order[norder++] = a->id;
        pthread_mutex_unlock(&order_mu);
        a->result = dlock_release(s.l);
    }
    tu_solo_close(&s);
    return NULL;
}

/* Wait up to TIMEOUT_MS until C sees N waiters on NAME, and assert it. */
static void expect_waiters(dlock_client *c, const char *name, long n, int timeout_ms)
{
    for (int waited = 0; waited < timeout_ms && tu_waiters(c, name) != n; waited += 20)
        tu_sleep_ms(20);
    ck_assert_int_eq(tu_waiters(c, name), n);
}

TU_TEST_IN(standalone, waiters_fifo_and_inspect, 90)
{
    struct zk_frame zt = zk_open(NULL, false);
    dlock_lock *l = tu_lock(zt.c, "fifo");
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    uint64_t t0 = tu_token(l);

    struct waiter_arg args[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        args[i] = (struct waiter_arg){.url = zt.url, .name = "fifo", .id = i};
        pthread_create(&th[i], NULL, waiter_thread, &args[i]);
        /* each queues before the next starts */
        expect_waiters(zt.c, "fifo", i + 1, 4000);
    }
    dlock_info *info = NULL;
    ck_assert_int_eq(dlock_inspect(zt.c, "fifo", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_waiter_count(info), 3);
    for (int i = 0; i < 3; i++) /* in queue order, dlock's own data shown */
        ck_assert_msg(strstr(dlock_info_waiter(info, (size_t)i), "-lock-000000000") &&
                          strstr(dlock_info_waiter(info, (size_t)i), "(dlock "),
                      "waiter %d: %s", i, dlock_info_waiter(info, (size_t)i));
    dlock_info_free(info);

    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(args[i].result == DLOCK_OK, "waiter %d: %s", i, dlock_err_name(args[i].result));
        ck_assert_int_eq(order[i], i); /* first come, first served */
        ck_assert_uint_gt(args[i].token, i ? args[i - 1].token : t0);
    }
    dlock_lock_free(l);
    zk_close(&zt);
}

/* The path of the newest node of NAME's queue (the highest sequence),
 * through ZH. */
static char *last_node(zhandle_t *zh, const char *name)
{
    char *lockpath = tu_fmt("/dlock/%s", name);
    int n = 0;
    char **kids = raw_children(zh, lockpath, &n);
    ck_assert_int_ge(n, 1);
    char *last = kids[0];
    for (int i = 1; i < n; i++) /* the sequence ends each name */
        if (strcmp(strrchr(kids[i], '-'), strrchr(last, '-')) > 0)
            last = kids[i];
    char *path = tu_fmt("%s/%s", lockpath, last);
    free_strings(kids, n);
    free(lockpath);
    return path;
}

/* A waiter that counts the nodes ahead of it down by their deletions
 * (ahead.c) must not count one that gave up as the holder's release:
 * with A holding and B, then C queued, B's timeout leaves C waiting; A's
 * release lets C in. */
TU_TEST_IN(standalone, waiter_ahead_giving_up_is_no_handoff, 60)
{
    struct zk_frame zt = zk_open(NULL, true);
    dlock_client *c[3] = {zt.c, tu_open(zt.url), tu_open(zt.url)};
    dlock_lock *l[3];
    for (int i = 0; i < 3; i++)
        l[i] = tu_lock_mode(c[i], "gives-up", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED);
    ck_assert_int_eq(dlock_acquire(l[0], DLOCK_TRY), DLOCK_OK);
    int64_t owner = 0;
    char *holder = holder_path(c[0], zt.zh, "gives-up", &owner);
    struct tu_waiter b, w;
    tu_waiter_start_ex(&b, l[1], 2000, NULL, true);
    expect_waiters(c[0], "gives-up", 1, 10000);
    char *bpath = last_node(zt.zh, "gives-up");
    tu_waiter_start_ex(&w, l[2], 60000, NULL, true);
    expect_waiters(c[0], "gives-up", 2, 10000);
    struct Stat st;
    for (int waited = 0; waited < 20000 && zoo_exists(zt.zh, bpath, 0, &st) == ZOK &&
                         !others_watch(bpath, st.ephemeralOwner);
         waited += 20)
        tu_sleep_ms(20);
    ck_assert_int_eq(tu_waiter_join(&b), DLOCK_ETIMEDOUT);
    expect_waiters(c[0], "gives-up", 1, 10000);
    ck_assert_msg(!tu_waiter_wait_done(&w, 300), "C held while A did (rc %d)", atomic_load(&w.rc));
    ck_assert_int_eq(dlock_release(l[0]), DLOCK_OK);
    ck_assert_int_eq(tu_waiter_join(&w), DLOCK_OK);
    ck_assert_int_eq(dlock_release(l[2]), DLOCK_OK);
    free(bpath);
    free(holder);
    TU_FREE_LOCKS(l[0], l[1], l[2]);
    dlock_client_close(c[1]);
    dlock_client_close(c[2]);
    zk_close(&zt);
}

/* A waiter whose own node is deleted behind its back while it waits (a
 * force release of it) must not hold on the holder's release as if it
 * were still queued: it queues again, and holds on a node that exists. */
TU_TEST_IN(standalone, waiter_node_deleted_then_handoff_holds_a_node, 60)
{
    struct zk_frame zt = zk_open(NULL, true);
    dlock_client *c2 = tu_open(zt.url);
    dlock_lock *a = tu_lock_mode(zt.c, "lost-place", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED);
    dlock_lock *b = tu_lock_mode(c2, "lost-place", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED);
    ck_assert_int_eq(dlock_acquire(a, DLOCK_TRY), DLOCK_OK);
    int64_t owner = 0;
    char *holder = holder_path(zt.c, zt.zh, "lost-place", &owner);
    struct tu_waiter w;
    tu_waiter_start_ex(&w, b, 60000, NULL, true);
    for (int waited = 0; waited < 20000 && !others_watch(holder, owner); waited += 20)
        tu_sleep_ms(20);
    ck_assert_msg(others_watch(holder, owner), "the waiter never watched %s", holder);
    char *mine = last_node(zt.zh, "lost-place");
    ck_assert_str_ne(mine, holder);
    ck_assert_int_eq(zoo_delete(zt.zh, mine, -1), ZOK);
    ck_assert_int_eq(dlock_release(a), DLOCK_OK);
    ck_assert_int_eq(tu_waiter_join(&w), DLOCK_OK);
    int n = 0;
    char **kids = raw_children(zt.zh, "/dlock/lost-place", &n);
    ck_assert_msg(n == 1, "the new holder holds on %d nodes", n);
    free_strings(kids, n);
    ck_assert_int_eq(dlock_release(b), DLOCK_OK);
    free(mine);
    free(holder);
    TU_FREE_LOCKS(a, b);
    dlock_client_close(c2);
    zk_close(&zt);
}

/* An acquire of L that waits forever in a thread of its own and keeps
 * what it gets. */
static void forever_waiter(struct tu_waiter *w, dlock_lock *l)
{
    tu_waiter_start_ex(w, l, DLOCK_FOREVER, NULL, true);
}

/* The server clamps the session timeout (the fixture allows 0.5 to 600 s):
 * a hold is valid for what the server granted, not what was asked. A
 * fixed lease cannot be honoured (a node lives as long as its session). */
TU_TEST_IN(standalone, validity_is_the_negotiated_session, 90)
{
    struct tu_solo d = direct_open("lease=1000000", "clamped");
    ck_assert_int_eq(dlock_acquire(d.l, DLOCK_TRY), DLOCK_OK);
    int64_t v = dlock_validity_ms(d.l);
    ck_assert_msg(v > 0 && v <= 600000, "validity %lld ms beyond the server's 600 s maximum",
                  (long long)v);
    ck_assert_int_eq(dlock_release(d.l), DLOCK_OK);
    dlock_lock *f = tu_lock(d.c, "fixed");
    ck_assert_int_eq(dlock_lock_set_lease(f, 20000, DLOCK_LEASE_FIXED), DLOCK_ENOTSUP);
    ck_assert_msg(strstr(dlock_errmsg(), "fixed"), "message: %s", dlock_errmsg());
    dlock_lock_free(f);
    tu_solo_close(&d);
}

/* ======================================================= Curator's part */

/* Curator's side while dlock waits: once dlock queued, a second Curator
 * contender queues behind it, and the first Curator holder lets go. */
struct curator_arg {
    zhandle_t *zh;
    dlock_client *c;
    const char *lockpath, *first;
    char *second;
};

static void *curator_thread(void *p)
{
    struct curator_arg *a = p;
    for (int k = 0; k < 200 && tu_waiters(a->c, "shared-with-java") < 1; k++)
        tu_sleep_ms(20);
    a->second = curator_contend(a->zh, a->lockpath);
    char *path = tu_fmt("%s/%s", a->lockpath, a->first);
    zoo_delete(a->zh, path, -1);
    free(path);
    return NULL;
}


/* Curator's InterProcessSemaphoreV2 played with the raw client: a
 * Curator lease node ("_c_<guid>-lease-<seq>" under P/leases) is a permit
 * dlock counts, dlock's leases are where Curator counts them, and a
 * Curator lease deleted lets a dlock waiter in; the mutex dlock takes
 * around it is Curator's, under P/locks. */
static char *curator_lease(zhandle_t *zh, const char *leases)
{
    raw_mkdirs(zh, leases, ZOO_CONTAINER, &ZOO_OPEN_ACL_UNSAFE);
    char *prefix = tu_fmt("%s/_c_%08x-%04x-4%03x-8%03x-%012x-lease-", leases, (unsigned)rand(),
                          (unsigned)rand() & 0xffff, (unsigned)rand() & 0xfff,
                          (unsigned)rand() & 0xfff, (unsigned)rand());
    char created[1024];
    int rc = zoo_create(zh, prefix, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL_SEQUENTIAL,
                        created, sizeof created);
    ck_assert_msg(rc == ZOK, "create %s: %s", prefix, zerror(rc));
    free(prefix);
    return strdup(created);
}

TU_TEST_IN(standalone, curator_semaphore_interop, 90)
{
    struct zk_frame zt = zk_open(NULL, true);
    const char *leases = "/dlock/pool-with-java/leases";
    dlock_semaphore *s = NULL;
    ck_assert_int_eq(dlock_semaphore_new(zt.c, "pool-with-java", 2, 0, &s), DLOCK_OK);
    /* Curator holds one lease, dlock takes the other: both are counted. */
    char *cur = curator_lease(zt.zh, leases);
    dlock_permit *mine = NULL;
    ck_assert_int_eq(dlock_semaphore_acquire(s, 1, DLOCK_TRY, NULL, &mine), DLOCK_OK);
    int n = 0;
    char **kids = raw_children(zt.zh, leases, &n);
    ck_assert_int_eq(n, 2);
    bool found = false;
    for (int i = 0; i < n; i++)
        found |= strcmp(kids[i], dlock_permit_id(mine)) == 0 && strncmp(kids[i], "_c_", 3) == 0 &&
                 strstr(kids[i], "-lease-") != NULL;
    ck_assert_msg(found, "dlock's lease %s is not a Curator lease node", dlock_permit_id(mine));
    free_strings(kids, n);
    ck_assert_int_eq(raw_contenders(zt.zh, "/dlock/pool-with-java/locks"), 0); /* mutex let go */
    tu_sem_full(zt.c, s, "pool-with-java", 2, 2);
    /* A dlock waiter holds Curator's mutex while it waits; Curator's
     * release of its lease lets it in. */
    struct tu_sem_taker a;
    tu_sem_taker_start(&a, s, 1, 30000, NULL);
    ck_assert(tu_wait_thread_asleep(&a.tid, 30000));
    ck_assert_int_eq(raw_contenders(zt.zh, "/dlock/pool-with-java/locks"), 1);
    ck_assert_int_eq(zoo_delete(zt.zh, cur, -1), ZOK);
    ck_assert_int_eq(tu_sem_taker_join(&a), DLOCK_OK);
    ck_assert_int_eq(dlock_permit_release(mine), DLOCK_OK);
    kids = raw_children(zt.zh, leases, &n);
    ck_assert_int_eq(n, 0);
    free_strings(kids, n);
    free(cur);
    dlock_semaphore_free(s);
    zk_close(&zt);
}

/* Inspect while a waiter waits: Curator's waiter creates its lease
 * nodes before it is let in (it waits, holding the mutex, for P/leases
 * to have at most N children), so they are not a holder's: one holder
 * (mine), no free permit, the waiter queued on P/locks as a waiter. */
TU_TEST_IN(standalone, sem_inspect_waiter_not_holder, 90)
{
    struct zk_frame zt = zk_open(NULL, true);
    const char *leases = "/dlock/sw/leases";
    dlock_semaphore *s = tu_semaphore(zt.c, "sw", 1);
    dlock_permit *mine = tu_permit(s, 1, DLOCK_TRY);
    struct tu_sem_taker a;
    tu_sem_taker_start(&a, s, 1, 30000, NULL);
    ck_assert(tu_wait_thread_asleep(&a.tid, 30000));
    int n = 0;
    for (int k = 0; k < 500 && n < 2; k++) {
        char **kids = raw_children(zt.zh, leases, &n);
        free_strings(kids, n); /* n is set by the call above: not in one expression */
        if (n < 2)
            tu_sleep_ms(20);
    }
    ck_assert_int_eq(n, 2); /* the waiter's lease node is there */
    dlock_info *info = NULL;
    ck_assert_int_eq(dlock_semaphore_inspect(zt.c, "sw", 1, &info), DLOCK_OK);
    ck_assert_uint_eq(dlock_info_holder_count(info), 1);
    ck_assert_str_eq(dlock_info_holder(info, 0, NULL), dlock_permit_id(mine));
    ck_assert_int_eq(dlock_info_free_permits(info), 0);
    ck_assert_int_eq(dlock_info_waiter_count(info), 1);
    ck_assert_ptr_nonnull(strstr(dlock_info_waiter(info, 0), "-lock-")); /* its mutex node */
    dlock_info_free(info);
    ck_assert_int_eq(dlock_permit_release(mine), DLOCK_OK);
    ck_assert_int_eq(tu_sem_taker_join(&a), DLOCK_OK);
    dlock_semaphore_free(s);
    zk_close(&zt);
}

/* `dlock status --permits 0` on a semaphore whose count zk does not
 * store: the free permits are unknown, so the plain output says so and
 * JSON gives null, never -1 (nor a count of 0 permits). */
TU_TEST_IN(standalone, cli_status_unknown_free_permits, 90)
{
    struct zk_frame zt = zk_open(NULL, false);
    dlock_semaphore *s = tu_semaphore(zt.c, "su", 2);
    dlock_permit *mine = tu_permit(s, 1, DLOCK_TRY);
    char *out = NULL;
    ck_assert_int_eq(TU_DLOCK(&out, NULL, NULL, "-u", zt.url, "status", "--permits", "0", "su"),
                     0);
    ck_assert_msg(strstr(out, dlock_permit_id(mine)), "status: %s", out);
    ck_assert_msg(!strstr(out, "-1 free") &&
                      strstr(out, "permits:  unknown (count not stored), free unknown\n"),
                  "status: %s", out);
    free(out);
    ck_assert_int_eq(TU_DLOCK(&out, NULL, NULL, "-u", zt.url, "status", "--permits", "0", "su",
                              "--json"),
                     0);
    ck_assert_msg(!strstr(out, "\"free_permits\":-1") &&
                      strstr(out, "\"permits\":null,\"free_permits\":null,"),
                  "status --json: %s", out);
    free(out);
    ck_assert_int_eq(dlock_permit_release(mine), DLOCK_OK);
    dlock_semaphore_free(s);
    zk_close(&zt);
}

/* A permit of 2 is 2 lease nodes; deleting the second (not the one the
 * permit's id and token name) loses the permit: the keeper checks every
 * lease node of a permit, not only the first. */
TU_TEST_IN(standalone, sem_keeper_checks_every_lease, 90)
{
    struct zk_frame zt = zk_open("lease=1500", true);
    const char *leases = "/dlock/k2/leases";
    dlock_semaphore *s = NULL;
    ck_assert_int_eq(dlock_semaphore_new(zt.c, "k2", 3, 0, &s), DLOCK_OK);
    struct tu_lost lost = {0};
    ck_assert_int_eq(dlock_semaphore_on_lost(s, tu_on_permit_lost, &lost), DLOCK_OK);
    dlock_permit *p = NULL;
    ck_assert_int_eq(dlock_semaphore_acquire(s, 2, DLOCK_TRY, NULL, &p), DLOCK_OK);
    int n = 0;
    char **kids = raw_children(zt.zh, leases, &n);
    ck_assert_int_eq(n, 2);
    ck_assert_str_eq(kids[0], dlock_permit_id(p));
    char *second = tu_fmt("%s/%s", leases, kids[1]);
    free_strings(kids, n);
    ck_assert_int_eq(zoo_delete(zt.zh, second, -1), ZOK);
    ck_assert_msg(tu_wait_lost(&lost, 1, 30000) && atomic_load(&lost.fired) == 1,
                  "deleting the 2nd lease node of a permit of 2 was never reported lost");
    ck_assert_msg(strstr(lost.why, second) && strstr(lost.why, "is gone"), "%s", lost.why);
    ck_assert_int_eq(dlock_permit_release(p), DLOCK_ELOST);
    free(second);
    dlock_semaphore_free(s);
    zk_close(&zt);
}

TU_TEST_IN(standalone, curator_interop, 90)
{
    struct zk_frame zt = zk_open(NULL, true);
    const char *lockpath = "/dlock/shared-with-java";

    /* 1. Curator holds: dlock is busy and sees the Curator node as holder. */
    char *cur1 = curator_contend(zt.zh, lockpath);
    dlock_lock *l = tu_lock(zt.c, "shared-with-java");
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_EBUSY);
    dlock_info *info = NULL;
    ck_assert_int_eq(dlock_inspect(zt.c, "shared-with-java", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_held(info), 1);
    ck_assert_msg(strncmp(dlock_info_holder(info, 0, NULL), cur1, strlen(cur1)) == 0,
                  "holder %s, curator node %s", dlock_info_holder(info, 0, NULL), cur1);
    dlock_info_free(info);

    /* 2. dlock queues behind it; a second Curator contender queues
     * behind dlock; then the first Curator holder releases. */
    struct curator_arg arg = {.zh = zt.zh, .c = zt.c, .lockpath = lockpath, .first = cur1};
    pthread_t th;
    pthread_create(&th, NULL, curator_thread, &arg);
    /* 3. dlock (next in sequence) owns, not cur2. */
    ck_assert_msg(dlock_acquire(l, 30000) == DLOCK_OK, "%s", dlock_errmsg());
    pthread_join(th, NULL);
    char *cur2 = arg.second;
    char *p1 = tu_fmt("%s/%s", lockpath, cur1);
    int n;
    char **kids = raw_children(zt.zh, lockpath, &n);
    ck_assert_int_eq(n, 2);
    /* as Curator sorts them: dlock's node first, cur2 after it */
    ck_assert_msg(strncmp(kids[0], "_c_", 3) == 0 && strcmp(kids[1], cur2) == 0,
                  "queue: %s, %s", kids[0], kids[1]);
    char owner_data[256];
    int len = sizeof owner_data - 1;
    char *p0 = tu_fmt("%s/%s", lockpath, kids[0]);
    ck_assert_int_eq(zoo_get(zt.zh, p0, 0, owner_data, &len, NULL), ZOK);
    owner_data[len > 0 ? len : 0] = 0;
    ck_assert_msg(strncmp(owner_data, "dlock ", 6) == 0, "owner data %s", owner_data);
    free_strings(kids, n);

    /* 4. dlock releases: cur2 is first, i.e. Curator's owner. */
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    kids = raw_children(zt.zh, lockpath, &n);
    ck_assert_int_eq(n, 1);
    ck_assert_str_eq(kids[0], cur2);
    free_strings(kids, n);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_EBUSY);
    char *p2 = tu_fmt("%s/%s", lockpath, cur2);
    ck_assert_int_eq(zoo_delete(zt.zh, p2, -1), ZOK);
    tu_acquire_release(l, DLOCK_TRY);

    free(p0);
    free(p1);
    free(p2);
    free(cur1);
    free(cur2);
    dlock_lock_free(l);
    zk_close(&zt);
}

/* Curator's LeaderLatch on the same path, its nodes played with the raw
 * client ("_c_<uuid>-latch-<seq>", EPHEMERAL_SEQUENTIAL, the participant
 * id as data): dlock sees the Curator leader and its id, waits behind it,
 * leads once the Curator session ends, and its own node is what Curator's
 * getLeader() reads first (dlock's value as data); a Curator participant
 * queued behind dlock leads once dlock resigns. */
struct latch_campaign {
    dlock_election *e;
    int rc;
};

static void *latch_campaign_thread(void *p)
{
    struct latch_campaign *a = p;
    a->rc = dlock_election_campaign(a->e, "dlock-node:8080", 30000, NULL);
    return NULL;
}

TU_TEST_IN(standalone, curator_leader_latch_interop, 90)
{
    struct zk_frame zt = zk_open(NULL, false);
    zhandle_t *zh = raw_open(NULL), *zh2 = raw_open(NULL);
    const char *lockpath = "/dlock/latch-with-java";
    /* 1. A Curator participant leads: dlock reads its id and is busy. */
    char *cur1 = curator_node(zh, lockpath, "latch-");
    dlock_leader *l = NULL;
    ck_assert_int_eq(dlock_election_leader(zt.c, "latch-with-java", &l), DLOCK_OK);
    ck_assert_int_eq(dlock_leader_held(l), 1);
    ck_assert_str_eq(dlock_leader_value(l), "127.0.0.1");
    ck_assert_str_eq(dlock_leader_id(l), cur1);
    dlock_leader_free(l);
    dlock_election *e = NULL;
    ck_assert_int_eq(dlock_election_new(zt.c, "latch-with-java", 0, &e), DLOCK_OK);
    ck_assert_int_eq(dlock_election_campaign(e, "x", DLOCK_TRY, NULL), DLOCK_EBUSY);
    /* 2. dlock campaigns; the Curator leader's session ends: dlock leads. */
    struct latch_campaign arg = {.e = e, .rc = 1};
    pthread_t th;
    pthread_create(&th, NULL, latch_campaign_thread, &arg);
    int n = 0;
    char **kids = NULL;
    for (int i = 0; i < 2000 && n < 2; i++) { /* dlock's node queued behind */
        free_strings(kids, n);
        kids = raw_children(zh2, lockpath, &n);
        if (n < 2)
            tu_sleep_ms(10);
    }
    ck_assert_int_eq(n, 2);
    free_strings(kids, n);
    zookeeper_close(zh); /* its ephemeral node goes with the session */
    pthread_join(th, NULL);
    ck_assert_msg(arg.rc == DLOCK_OK, "campaign: %s", dlock_errmsg());
    /* 3. What Curator's getLeader() reads: the first latch node, dlock's
     * value as its data. A second Curator participant queues behind. */
    char *cur2 = curator_node(zh2, lockpath, "latch-");
    kids = raw_children(zh2, lockpath, &n);
    ck_assert_int_eq(n, 2);
    ck_assert_msg(strstr(kids[0], "-latch-") && strcmp(kids[1], cur2) == 0, "queue: %s, %s",
                  kids[0], kids[1]);
    char data[256];
    int len = sizeof data - 1;
    char *p0 = tu_fmt("%s/%s", lockpath, kids[0]);
    ck_assert_int_eq(zoo_get(zh2, p0, 0, data, &len, NULL), ZOK);
    data[len > 0 ? len : 0] = 0;
    ck_assert_str_eq(data, "dlock-node:8080");
    free_strings(kids, n);
    /* 4. dlock resigns: the Curator participant leads. */
    ck_assert_int_eq(dlock_election_resign(e), DLOCK_OK);
    ck_assert_int_eq(dlock_election_leader(zt.c, "latch-with-java", &l), DLOCK_OK);
    ck_assert_str_eq(dlock_leader_id(l), cur2);
    dlock_leader_free(l);
    free(p0);
    free(cur1);
    free(cur2);
    zookeeper_close(zh2);
    dlock_election_free(e);
    zk_close(&zt);
}

/* Curator's InterProcessReadWriteLock on the same path, its nodes played
 * with the raw client: a Curator reader shares with dlock's readers and
 * keeps dlock's writer out, a Curator writer keeps both out, and dlock's
 * reader and writer keep Curator's writer (and its reader, for dlock's
 * writer) out -- judged by Curator's own predicates. With
 * layout=curator-rw dlock's exclusive nodes are "__WRIT__". A dlock
 * reader waiting for a Curator writer is woken by its release; a reader
 * arriving behind a waiting writer waits (no writer starvation). */
TU_TEST_IN(standalone, curator_rwlock_interop, 90)
{
    struct zk_frame zt = zk_open("layout=curator-rw", true);
    const char *lockpath = "/dlock/rw-with-java";
    dlock_lock *r = tu_lock_mode(zt.c, "rw-with-java", DLOCK_SHARED, 0);
    dlock_lock *w = tu_lock(zt.c, "rw-with-java");

    /* Curator reads: dlock reads beside it, dlock's writer stays out. */
    char *cr = curator_node(zt.zh, lockpath, "__READ__");
    ck_assert(curator_rw_holds(zt.zh, lockpath, cr));
    ck_assert_int_eq(dlock_acquire(r, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(w, DLOCK_TRY), DLOCK_EMISUSE); /* same thread: upgrade */
    ck_assert_int_eq(dlock_release(r), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(w, DLOCK_TRY), DLOCK_EBUSY);
    curator_release(zt.zh, lockpath, cr);

    /* dlock writes ("__WRIT__"): Curator's reader and writer wait. */
    ck_assert_int_eq(dlock_acquire(w, DLOCK_TRY), DLOCK_OK);
    int n = 0;
    char **kids = raw_children(zt.zh, lockpath, &n);
    ck_assert_int_eq(n, 1);
    ck_assert_msg(strstr(kids[0], "-__WRIT__"), "dlock's write node: %s", kids[0]);
    free_strings(kids, n);
    cr = curator_node(zt.zh, lockpath, "__READ__");
    char *cw = curator_node(zt.zh, lockpath, "__WRIT__");
    ck_assert(!curator_rw_holds(zt.zh, lockpath, cr));
    ck_assert(!curator_rw_holds(zt.zh, lockpath, cw));
    ck_assert_int_eq(dlock_release(w), DLOCK_OK);
    ck_assert(curator_rw_holds(zt.zh, lockpath, cr)); /* the reader first, */
    ck_assert(!curator_rw_holds(zt.zh, lockpath, cw)); /* the writer behind it */
    curator_release(zt.zh, lockpath, cr);
    ck_assert(curator_rw_holds(zt.zh, lockpath, cw));

    /* Curator writes: dlock's reader and writer wait; a dlock reader
     * waiting (a handle-owned hold, to release it here) is woken by the
     * writer's release. */
    ck_assert_int_eq(dlock_acquire(r, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_int_eq(dlock_acquire(w, DLOCK_TRY), DLOCK_EBUSY);
    dlock_lock *ro = tu_lock_mode(zt.c, "rw-with-java", DLOCK_SHARED, DLOCK_LOCK_HANDLE_OWNED);
    struct tu_waiter ra;
    forever_waiter(&ra, ro);
    expect_waiters(zt.c, "rw-with-java", 1, 20000);
    curator_release(zt.zh, lockpath, cw);
    tu_waiter_join(&ra);
    ck_assert_msg(ra.rc == DLOCK_OK, "reader behind Curator's writer: %s", dlock_err_name(ra.rc));

    /* dlock reads: Curator's writer waits; a reader arriving behind that
     * waiting writer (another client's) waits too: writers are not
     * starved across the two libraries. */
    cw = curator_node(zt.zh, lockpath, "__WRIT__");
    ck_assert(!curator_rw_holds(zt.zh, lockpath, cw));
    char *direct = url_with(NULL, NULL);
    dlock_client *c2 = tu_open(direct);
    dlock_lock *r2 = tu_lock_mode(c2, "rw-with-java", DLOCK_SHARED, 0);
    ck_assert_int_eq(dlock_acquire(r2, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_int_eq(dlock_release(ro), DLOCK_OK);
    ck_assert(curator_rw_holds(zt.zh, lockpath, cw));
    ck_assert_int_eq(dlock_acquire(r2, DLOCK_TRY), DLOCK_EBUSY);
    curator_release(zt.zh, lockpath, cw);
    ck_assert_int_eq(dlock_acquire(r2, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_release(r2), DLOCK_OK);

    dlock_lock_free(r2);
    dlock_client_close(c2);
    free(direct);
    TU_FREE_LOCKS(ro, w, r);
    zk_close(&zt);
}

/* The downgrade with a writer queued between: A holds the write lock, B's
 * writer queues behind it, then A takes a read level and releases its
 * write level. A read node of A's made now would sort after B's writer,
 * which would then see itself first and take the write lock beside A's
 * read hold (what Curator's own downgrade does). dlock keeps A's write
 * node instead until A's hold ends: B stays out, and gets in once A
 * releases its read level. */
TU_TEST_IN(standalone, downgrade_behind_queued_writer_keeps_it_out, 90)
{
    char *url = url_with(NULL, NULL);
    dlock_client *a = tu_open(url), *b = tu_open(url);
    dlock_lock *wa = tu_lock(a, "down-between"), *wb = tu_lock(b, "down-between");
    dlock_lock *ra = tu_lock_mode(a, "down-between", DLOCK_SHARED, 0);
    zhandle_t *zh = raw_open(NULL);
    ck_assert_int_eq(dlock_acquire(wa, DLOCK_TRY), DLOCK_OK);
    uint64_t t = tu_token(wa);
    struct tu_waiter arg;
    tu_waiter_start(&arg, wb, DLOCK_FOREVER); /* (releases what it gets) */
    expect_waiters(a, "down-between", 1, 20000);
    ck_assert_int_eq(dlock_acquire(ra, DLOCK_TRY), DLOCK_OK); /* a read level */
    ck_assert_int_eq(dlock_release(wa), DLOCK_OK);            /* the downgrade */
    ck_assert_uint_eq(dlock_hold_count(ra), 1);
    ck_assert_uint_eq(tu_token(ra), t);
    /* A's write node is still first, B's writer behind it: B cannot hold */
    int n = 0;
    char **kids = raw_children(zh, "/dlock/down-between", &n);
    ck_assert_int_eq(n, 2);
    ck_assert_msg(strstr(kids[0], "-lock-") && strstr(kids[1], "-lock-"), "queue: %s, %s",
                  kids[0], kids[1]);
    char *first = tu_fmt("/dlock/down-between/%s", kids[0]);
    struct Stat st;
    ck_assert_int_eq(zoo_exists(zh, first, 0, &st), ZOK);
    ck_assert_uint_eq((uint64_t)st.czxid, t);
    free(first);
    free_strings(kids, n);
    ck_assert_int_eq(dlock_release(ra), DLOCK_OK);
    tu_waiter_join(&arg);
    ck_assert_msg(arg.rc == DLOCK_OK, "B's writer: %s", dlock_err_name(arg.rc));
    zookeeper_close(zh);
    TU_FREE_LOCKS(ra, wb, wa);
    TU_CLOSE_CLIENTS(b, a);
    free(url);
}

/* A node whose create reply was lost is found again by its guid: a
 * Curator-protected node left by the same client in the queue is
 * recognised. Here: a foreign node without "lock-" is ignored in the
 * ordering, and a lock node created by Curator as a container is reused. */
/* Children that no lock client creates -- not a sequential node (the
 * server appends exactly 10 digits), not Curator's "lock-<seq>" nor its
 * protected "_c_<uuid>-lock-<seq>" -- are ignored alike by acquire and
 * status (issue 15: "y-lock-18446744073709551617" made status say held
 * while an acquire took the lock). An unprotected Curator contender
 * ("lock-<seq>") counts for both. */
TU_TEST_IN(standalone, foreign_children_ignored, 90)
{
    struct zk_frame zt = zk_open(NULL, true);
    raw_mkdirs(zt.zh, "/dlock/odd/not-a-lock-node", ZOO_PERSISTENT, &ZOO_OPEN_ACL_UNSAFE);
    const char *junk[] = {"y-lock-18446744073709551617", "y-lock-0000000001",
                          "_c_not-a-uuid-lock-0000000002", "lock-12", "lock-000000000x"};
    for (size_t i = 0; i < sizeof junk / sizeof *junk; i++) {
        char *path = tu_fmt("/dlock/odd/%s", junk[i]);
        int rc = zoo_create(zt.zh, path, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_PERSISTENT, NULL, 0);
        ck_assert_msg(rc == ZOK || rc == ZNODEEXISTS, "create %s: %s", path, zerror(rc));
        free(path);
    }
    dlock_info *info = NULL;
    ck_assert_int_eq(dlock_inspect(zt.c, "odd", &info), DLOCK_OK);
    ck_assert_msg(dlock_info_held(info) == 0, "status says held by %s",
                  dlock_info_holder(info, 0, NULL));
    ck_assert_int_eq(dlock_info_waiter_count(info), 0);
    dlock_info_free(info);
    dlock_lock *l = tu_lock(zt.c, "odd");
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_inspect(zt.c, "odd", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_held(info), 1);
    ck_assert_uint_eq(dlock_info_token(info), tu_token(l));
    ck_assert_int_eq(dlock_info_waiter_count(info), 0);
    dlock_info_free(info);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);

    /* Curator without protection: "lock-<seq>", held by the raw client */
    char created[256];
    int rc = zoo_create(zt.zh, "/dlock/odd/lock-", "127.0.0.1", 9, &ZOO_OPEN_ACL_UNSAFE,
                        ZOO_EPHEMERAL_SEQUENTIAL, created, sizeof created);
    ck_assert_msg(rc == ZOK, "create lock-: %s", zerror(rc));
    ck_assert_int_eq(dlock_inspect(zt.c, "odd", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_held(info), 1);
    ck_assert_msg(strstr(dlock_info_holder(info, 0, NULL), strrchr(created, '/') + 1),
                  "holder %s", dlock_info_holder(info, 0, NULL));
    dlock_info_free(info);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_int_eq(zoo_delete(zt.zh, created, -1), ZOK);
    tu_acquire_release(l, DLOCK_TRY);
    dlock_lock_free(l);
    zk_close(&zt);
}

/* ================================================================ names */

TU_TEST_IN(standalone, hostile_names, 90)
{
    struct zk_frame zt = zk_open("base=/hostile", true);
    const char *names[] = {"..", ".", "../../zookeeper", "a/b/../../c", "/", "with space",
                           "%2F", "\x01\x7f\xff\xfe", "zookeeper", "lock-0000000001",
                           "_c_x-lock-", "ünïcødé"};
    size_t nn = sizeof names / sizeof *names;
    dlock_lock *locks[sizeof names / sizeof *names];
    for (size_t i = 0; i < nn; i++) {
        dlock_lock *l = locks[i] = tu_lock(zt.c, names[i]);
        ck_assert_msg(dlock_acquire(l, DLOCK_TRY) == DLOCK_OK, "acquire '%s': %s", names[i],
                      dlock_errmsg());
        dlock_info *info = NULL;
        ck_assert_int_eq(dlock_inspect(zt.c, names[i], &info), DLOCK_OK);
        const char *key = dlock_info_key(info);
        ck_assert_msg(strncmp(key, "/hostile/", 9) == 0 && !strchr(key + 9, '/') &&
                          strcmp(key + 9, ".") && strcmp(key + 9, ".."),
                      "name '%s' mapped to %s", names[i], key);
        ck_assert_int_eq(dlock_info_held(info), 1);
        dlock_info_free(info);
    }
    /* nothing was created outside the base path */
    int n;
    char **kids = raw_children(zt.zh, "/", &n);
    for (int i = 0; i < n; i++)
        ck_assert_msg(strcmp(kids[i], "zookeeper") == 0 || strcmp(kids[i], "hostile") == 0 ||
                          strcmp(kids[i], "dlock") == 0,
                      "stray node /%s", kids[i]);
    free_strings(kids, n);
    kids = raw_children(zt.zh, "/zookeeper", &n);
    for (int i = 0; i < n; i++)
        ck_assert_msg(strcmp(kids[i], "quota") == 0 || strcmp(kids[i], "config") == 0,
                      "stray node /zookeeper/%s", kids[i]);
    free_strings(kids, n);

    /* list gives every name back byte for byte (all still held: the
     * server reaps empty lock nodes, containers, within a second here) */
    char **listed = tu_list_names(zt.c, NULL);
    for (size_t i = 0; i < nn; i++)
        ck_assert_msg(tu_listed(listed, names[i]), "list lost name '%s'", names[i]);
    tu_release_free_all(locks, nn);
    tu_free_names(listed);
    zk_close(&zt);
}

TU_TEST_IN(standalone, list_and_prefix, 90)
{
    char *url = url_with(NULL, "base=/listing&prefix=app1.");
    char *url2 = url_with(NULL, "base=/listing");
    dlock_client *c = tu_open(url), *raw = tu_open(url2);
    dlock_lock *a = tu_lock(c, "jobs-a"), *b = tu_lock(c, "jobs-b"), *x = tu_lock(c, "other");
    ck_assert_int_eq(dlock_acquire(a, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(b, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(x, DLOCK_TRY), DLOCK_OK);
    char **listed = tu_list_names(c, "jobs-*");
    ck_assert_uint_eq(tu_count_names(listed), 2);
    ck_assert_msg(tu_listed(listed, "jobs-a") && tu_listed(listed, "jobs-b"), "listed %s %s",
                  listed[0], listed[1]);
    tu_free_names(listed);
    /* without the prefix the prefixed names are seen whole */
    dlock_info *info = NULL;
    ck_assert_int_eq(dlock_inspect(raw, "app1.other", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_held(info), 1);
    dlock_info_free(info);
    dlock_release(a);
    dlock_release(b);
    dlock_release(x);
    TU_FREE_LOCKS(a, b, x);
    TU_CLOSE_CLIENTS(c, raw);
    free(url);
    free(url2);
}

/* A waiter paused past its session timeout loses its place (the server
 * deletes its node) and, resumed, queues again with a new session and
 * gets the lock when it is released. */
TU_TEST_IN(standalone, paused_waiter_requeues, 90)
{
    char *url = kept(url_with(NULL, "lease=1500"));
    char *dir = kept(tu_tmpdir("zk-waiter"));
    char *go = kept(tu_fmt("%s/go", dir)), *done = kept(tu_fmt("%s/acquired", dir));
    /* the child is forked before this process opens a client */
    pid_t child = tu_fork();
    if (child == 0) {
        dlock_client *wc = NULL;
        dlock_lock *wl = NULL;
        if (!tu_wait_file(go, 30000))
            _exit(9);
        if (dlock_open(url, &wc) || dlock_lock_new(wc, "paused-waiter", DLOCK_EXCLUSIVE, 0, &wl))
            _exit(10);
        if (dlock_acquire(wl, 60000) != DLOCK_OK)
            _exit(11);
        uint64_t t = 0;
        dlock_token(wl, &t);
        char *text = tu_fmt("%" PRIu64, t);
        tu_write_marker(done, text);
        free(text);
        dlock_release(wl);
        dlock_lock_free(wl);
        dlock_client_close(wc);
        _exit(0);
    }
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock(c, "paused-waiter");
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    uint64_t mine = tu_token(l);
    tu_write_marker(go, "1");
    expect_waiters(c, "paused-waiter", 1, 10000);
    kill(child, SIGSTOP);
    /* the server expires the stopped waiter's session: its node goes */
    expect_waiters(c, "paused-waiter", 0, 20000);
    kill(child, SIGCONT);
    /* resumed, it queues again */
    expect_waiters(c, "paused-waiter", 1, 20000);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    ck_assert_int_eq(tu_wait_exit(child), 0);
    char *text = tu_read_file(done);
    ck_assert_ptr_nonnull(text);
    ck_assert_uint_gt(strtoull(text, NULL, 10), mine);
    free(text);
    dlock_lock_free(l);
    dlock_client_close(c);
    tu_rmrf(dir);
}

/* =============================================================== errors */

TU_TEST_IN(standalone, missing_chroot, 90)
{
    char *url = url_with("/no/such/app", NULL);
    dlock_client *c = NULL;
    ck_assert_int_eq(dlock_open(url, &c), DLOCK_EBADURL);
    ck_assert_msg(strstr(dlock_errmsg(), "'/no/such/app'") && strstr(dlock_errmsg(), "does not exist"),
                  "message: %s", dlock_errmsg());
    /* an existing chroot holds everything beneath it */
    zhandle_t *zh = raw_open(NULL);
    raw_mkdirs(zh, "/tenant", ZOO_PERSISTENT, &ZOO_OPEN_ACL_UNSAFE);
    free(url);
    url = url_with("/tenant", NULL);
    c = tu_open(url);
    dlock_lock *l = tu_lock(c, "in-chroot");
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    int n;
    char **kids = raw_children(zh, "/tenant/dlock/in-chroot", &n);
    ck_assert_int_eq(n, 1);
    free_strings(kids, n);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    dlock_client_close(c);
    zookeeper_close(zh);
    free(url);
}

/* A server that refuses connections (nothing on its port) fails the open
 * at once with DLOCK_ECONN, as Redis does, not after the connect timeout:
 * the C client retries a refused server without telling its caller, so
 * `dlock run -n` against a ZooKeeper that is down took the whole
 * connect_timeout (5 s by default; 20 s here, which the bound, 5 s, is
 * far below: the bound is the point of the test). Two hosts, both
 * refusing, the same. */
TU_TEST_IN(standalone, refused_open_fails_at_once, 60)
{
    int p1 = tu_free_port(), p2 = tu_free_port();
    char *forms[] = {tu_fmt("zk://127.0.0.1:%d?connect_timeout=20s", p1),
                     tu_fmt("zk://127.0.0.1:%d,127.0.0.1:%d?connect_timeout=20s", p1, p2)};
    for (size_t i = 0; i < 2; i++) {
        char *u = forms[i];
        dlock_client *c = NULL;
        int64_t t0 = tu_mono_ms();
        int rc = dlock_open(u, &c);
        int64_t took = tu_mono_ms() - t0;
        ck_assert_msg(rc == DLOCK_ECONN, "%s: %s: %s", u, dlock_err_name(rc), dlock_errmsg());
        ck_assert_msg(strstr(dlock_errmsg(), "refused"), "%s: message %s", u, dlock_errmsg());
        ck_assert_msg(took <= 5000, "%s: open took %lld ms with every server refusing", u,
                      (long long)took);
        free(u);
    }
}

TU_TEST_IN(standalone, bad_urls, 90)
{
    REQUIRE_SERVERS();
    const char *queries[] = {"base=relative", "base=/a//b", "base=/a/../b", "base=/trailing/",
                             "acl=everyone", "layout=redisson", "acl=creator", "nonsense=1"};
    for (size_t i = 0; i < sizeof queries / sizeof *queries; i++) {
        char *url = url_with(NULL, queries[i]);
        dlock_client *c = NULL;
        int rc = dlock_open(url, &c);
        ck_assert_msg(rc == DLOCK_EBADURL, "%s: %s %s", url, dlock_err_name(rc), dlock_errmsg());
        ck_assert_msg(strlen(dlock_errmsg()) > 10, "%s: empty message", url);
        free(url);
    }
    /* ZooKeeper's own namespace (/zookeeper: config, quotas) is refused as
     * a base or a chroot, and the message names it (issue 15) */
    const char *reserved[][2] = {{NULL, "base=/zookeeper"},
                                 {NULL, "base=/zookeeper/quota/locks"},
                                 {"/zookeeper", NULL},
                                 {"/zookeeper/config", NULL}};
    for (size_t i = 0; i < sizeof reserved / sizeof *reserved; i++) {
        char *url = url_with(reserved[i][0], reserved[i][1]);
        dlock_client *c = NULL;
        int rc = dlock_open(url, &c);
        ck_assert_msg(rc == DLOCK_EBADURL, "%s: %s %s", url, dlock_err_name(rc), dlock_errmsg());
        const char *named = reserved[i][0] ? reserved[i][0] : strchr(reserved[i][1], '/');
        ck_assert_msg(strstr(dlock_errmsg(), named) && strstr(dlock_errmsg(), "reserved"),
                      "%s: message %s", url, dlock_errmsg());
        dlock_client_close(c);
        free(url);
    }
    /* under a chroot, /zookeeper is the application's own path */
    zhandle_t *zh = raw_open(NULL);
    raw_mkdirs(zh, "/zkapp", ZOO_PERSISTENT, &ZOO_OPEN_ACL_UNSAFE);
    zookeeper_close(zh);
    struct tu_solo s = tu_solo_open(url_with("/zkapp", "base=/zookeeper"), "in-chroot");
    tu_acquire_release(s.l, DLOCK_TRY);
    tu_solo_close(&s);
}

TU_TEST_IN(standalone, auth_and_acl, 90)
{
    REQUIRE_SERVERS();
    /* alice owns /secure: only she may create under it */
    zhandle_t *zh = raw_open("alice:s3cret");
    raw_mkdirs(zh, "/secure", ZOO_PERSISTENT, &ZOO_CREATOR_ALL_ACL);

    const char *cases[][2] = {{"", "no credentials"}, {"alice:wrong@", "wrong password"},
                              {"bob:pw@", "other user"}};
    for (size_t i = 0; i < 3; i++) {
        char *url = tu_fmt("zk://%s%s?base=/secure/locks", cases[i][0], F.hosts);
        dlock_client *c = tu_open(url);
        dlock_lock *l = tu_lock(c, "guarded");
        int rc = dlock_acquire(l, DLOCK_TRY);
        ck_assert_msg(rc == DLOCK_EAUTH, "%s: %s %s", cases[i][1], dlock_err_name(rc),
                      dlock_errmsg());
        ck_assert_msg(strstr(dlock_errmsg(), "/secure"), "%s: message %s", cases[i][1],
                      dlock_errmsg());
        dlock_lock_free(l);
        dlock_client_close(c);
        free(url);
    }
    char *url = tu_fmt("zk://alice:s3cret@%s?base=/secure/locks&acl=creator", F.hosts);
    dlock_client *c = tu_open(url);
    ck_assert_msg(strstr(dlock_client_url(c), "s3cret") == NULL, "password shown: %s",
                  dlock_client_url(c));
    dlock_lock *l = tu_lock(c, "guarded");
    ck_assert_msg(dlock_acquire(l, DLOCK_TRY) == DLOCK_OK, "%s", dlock_errmsg());
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    /* the creator ACL keeps bob out of alice's lock node too */
    char *bob = tu_fmt("zk://bob:pw@%s?base=/secure/locks", F.hosts);
    dlock_client *cb = tu_open(bob);
    dlock_lock *lb = tu_lock(cb, "guarded");
    ck_assert_int_eq(dlock_acquire(lb, DLOCK_TRY), DLOCK_EAUTH);
    ck_assert_msg(strstr(dlock_errmsg(), "/secure/locks"), "message %s", dlock_errmsg());
    /* alice's node under an open lock node: others still see the holder
     * (its name and token; its data is hers alone) */
    raw_mkdirs(zh, "/secure/locks/mixed", ZOO_CONTAINER, &ZOO_OPEN_ACL_UNSAFE);
    dlock_lock *lm = tu_lock(c, "mixed");
    ck_assert_int_eq(dlock_acquire(lm, DLOCK_TRY), DLOCK_OK);
    dlock_info *info = NULL;
    ck_assert_msg(dlock_inspect(cb, "mixed", &info) == DLOCK_OK, "%s", dlock_errmsg());
    ck_assert_int_eq(dlock_info_held(info), 1);
    ck_assert_uint_eq(dlock_info_token(info), tu_token(lm));
    ck_assert_msg(strstr(dlock_info_holder(info, 0, NULL), "(dlock ") == NULL, "holder %s",
                  dlock_info_holder(info, 0, NULL));
    dlock_info_free(info);
    dlock_lock *lbm = tu_lock(cb, "mixed");
    int brc = dlock_acquire(lbm, DLOCK_TRY);
    ck_assert_msg(brc == DLOCK_EBUSY, "bob on the open lock node: %s %s", dlock_err_name(brc),
                  dlock_errmsg());
    dlock_lock_free(lbm);
    ck_assert_int_eq(dlock_release(lm), DLOCK_OK);
    TU_FREE_LOCKS(lm, lb);
    dlock_client_close(cb);
    dlock_lock_free(l);
    dlock_client_close(c);
    zookeeper_close(zh);
    free(bob);
    free(url);
}

/* ===================================================== server faults */

TU_TEST_IN(restart, server_restart_keeps_hold, 120)
{
    struct tu_solo d = direct_open("lease=15000", "restart");
    watch_lost(d.l);
    ck_assert_int_eq(dlock_acquire(d.l, DLOCK_TRY), DLOCK_OK);
    uint64_t t = tu_token(d.l);
    zkf_server_stop(&F, 0, SIGKILL);
    ck_assert_msg(zkf_server_start(&F, 0, 60000), "server did not come back");
    /* a renewal after the restart confirms the hold again: validity
     * grows back above what is left of it without one */
    int64_t t0 = tu_mono_ms(), v0 = dlock_validity_ms(d.l);
    ck_assert_int_gt(v0, 0);
    bool renewed = false;
    for (int i = 0; i < 400 && !renewed && !atomic_load(&hold_lost.fired); i++) {
        tu_sleep_ms(50);
        renewed = dlock_validity_ms(d.l) > v0 - (tu_mono_ms() - t0) + 1000;
    }
    ck_assert_int_eq(atomic_load(&hold_lost.fired), 0);
    ck_assert_msg(renewed, "hold not confirmed after restart");
    ck_assert_uint_eq(tu_token(d.l), t);
    ck_assert_int_eq(dlock_release(d.l), DLOCK_OK);
    tu_solo_close(&d);
}

static void restart_server(void *arg)
{
    (void)arg;
    zkf_server_stop(&F, 0, SIGKILL);
    ck_assert_msg(zkf_server_start(&F, 0, 60000), "server did not come back");
}

/* `dlock leader --watch` across the server's restart: the observer
 * retries the lost connection and reports the leader elected afterwards. */
TU_TEST_IN(watch, observe_goes_on_across_a_restart, 120)
{
    char *url = url_with(NULL, "lease=5000");
    tu_watch_across_restart(url, "watched", restart_server, NULL);
    free(url);
}

TU_TEST_IN(outage, server_down_hold_lost, 120)
{
    struct tu_solo d = direct_open("lease=1500", "outage");
    dlock_lock *l = d.l;
    watch_lost(l);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    uint64_t t = tu_token(l);
    zkf_server_stop(&F, 0, SIGKILL);
    /* jeopardy: no contact, so the validity deadline passes */
    tu_wait_lost(&hold_lost, 1, 10000);
    ck_assert_int_eq(atomic_load(&hold_lost.fired), 1);
    ck_assert_int_eq(dlock_validity_ms(l), 0);
    /* while down: a clear connection error naming the server */
    dlock_lock *l2 = tu_lock(d.c, "outage-2");
    int rc = dlock_acquire(l2, DLOCK_TRY);
    ck_assert_msg(rc == DLOCK_ECONN, "%s %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_msg(strstr(dlock_errmsg(), "127.0.0.1:"), "message %s", dlock_errmsg());
    ck_assert_msg(zkf_server_start(&F, 0, 60000), "server did not come back");
    /* the lost hold releases as lost; the lock serves again */
    ck_assert_int_eq(dlock_release(l), DLOCK_ELOST);
    rc = dlock_acquire(l, 20000);
    ck_assert_msg(rc == DLOCK_OK, "%s %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_uint_gt(tu_token(l), t);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l2);
    tu_solo_close(&d);
}

/* A server that stops answering (SIGSTOP: its sockets stay open, so the
 * client library believes it is connected until 2/3 of the session
 * passes, then reconnects to it forever) must not stretch a short wait
 * or a try-once: a 100 ms acquire ends at its deadline, not after the op
 * timeout; once the client is reconnecting, a try-once says DLOCK_ECONN
 * at once instead of waiting the connect timeout. Both timeouts are a
 * minute, past this case's time limit, so the old behaviour fails the
 * test by its timeout rather than by a clock. */
TU_TEST_IN(stopped, stopped_server_bounds_short_waits, 50)
{
    struct tu_solo d = direct_open("lease=3000&timeout=60000&connect_timeout=60000", "stopped");
    ck_assert_int_eq(kill(F.s[0].pid, SIGSTOP), 0);
    TU_ACQUIRE_EXPECT(d.l, 100, DLOCK_ETIMEDOUT, "100 ms acquire, server stopped");
    /* short waits until the client library gives the connection up */
    bool reconnecting = false;
    for (int i = 0; i < 2000 && !reconnecting; i++) {
        TU_ACQUIRE_EXPECT(d.l, 100, DLOCK_ETIMEDOUT, "100 ms acquire, server stopped");
        reconnecting = strstr(dlock_errmsg(), "(connecting)") ||
                       strstr(dlock_errmsg(), "(associating)");
    }
    ck_assert_msg(reconnecting, "the client never noticed the stopped server: %s",
                  dlock_errmsg());
    TU_ACQUIRE_EXPECT(d.l, DLOCK_TRY, DLOCK_ECONN, "try-once while reconnecting");
    ck_assert_msg(strstr(dlock_errmsg(), "not connected"), "message %s", dlock_errmsg());
    ck_assert_int_eq(kill(F.s[0].pid, SIGCONT), 0);
    TU_ACQUIRE_EXPECT(d.l, 30000, DLOCK_OK, "after SIGCONT");
    ck_assert_int_eq(dlock_release(d.l), DLOCK_OK);
    tu_solo_close(&d);
}

/* Until PATH has WANT children of ours ("_c_"); false after 20 s. */
static bool contenders_become(zhandle_t *zh, const char *path, int want)
{
    for (int i = 0; i < 2000; i++) {
        if (raw_contenders(zh, path) == want)
            return true;
        tu_sleep_ms(10);
    }
    return false;
}

/* A semaphore wait (for the one permit another client holds) that ends
 * while the server is stopped returns at its end, not once the server
 * answers: its lease node and Curator's mutex node under P/locks are
 * deleted within what is left of the wait (nothing) and owed to the
 * cleanup queue; the keeper deletes them once the server is continued.
 * With CANCEL a wait forever is canceled once the server is stopped: the
 * caller asked to stop now, nothing is sent. (They were deleted in the
 * caller's thread with the op timeout, 30 s each.) The acquire is given
 * 15 s, half an op timeout, far past the 4 s wait. */
static void sem_wait_gives_up_on_a_stopped_server(const char *name, bool cancel)
{
    struct zk_frame zt = zk_open("timeout=30s&lease=60s", true);
    dlock_client *d = tu_open(zt.url);
    dlock_semaphore *s = NULL, *sd = NULL;
    ck_assert_int_eq(dlock_semaphore_new(zt.c, name, 1, 0, &s), DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_new(d, name, 1, 0, &sd), DLOCK_OK);
    dlock_permit *held = NULL;
    ck_assert_int_eq(dlock_semaphore_acquire(sd, 1, DLOCK_TRY, NULL, &held), DLOCK_OK);
    char *leases = tu_fmt("/dlock/%s/leases", name), *locks = tu_fmt("/dlock/%s/locks", name);
    dlock_cancel *k = NULL;
    if (cancel)
        ck_assert_int_eq(dlock_cancel_new(&k), DLOCK_OK);
    struct tu_sem_taker t;
    tu_sem_taker_start(&t, s, 1, cancel ? DLOCK_FOREVER : 4000, k);
    ck_assert_msg(contenders_become(zt.zh, leases, 2), "the waiter never made its lease node");
    /* asleep in its wait with no request left unserved: asleep, a round
     * trip of another session through the server, asleep again */
    ck_assert(tu_wait_thread_asleep(&t.tid, 30000));
    ck_assert_int_eq(raw_contenders(zt.zh, locks), 1);
    ck_assert(tu_wait_thread_asleep(&t.tid, 30000));
    tu_pause(F.s[0].pid);
    if (cancel)
        ck_assert_int_eq(dlock_cancel_fire(k), DLOCK_OK);
    bool returned = false;
    for (int i = 0; i < 1500 && !returned; i++) {
        returned = atomic_load(&t.rc) != 1;
        tu_sleep_ms(10);
    }
    ck_assert_int_eq(kill(F.s[0].pid, SIGCONT), 0);
    int rc = tu_sem_taker_join(&t);
    ck_assert_msg(returned, "the %s returned only once the stopped server was continued (%s)",
                  cancel ? "canceled semaphore wait" : "4 s semaphore wait", dlock_err_name(rc));
    ck_assert_int_eq(rc, cancel ? DLOCK_ECANCELED : DLOCK_ETIMEDOUT);
    /* the keeper deleted what was owed: D's lease alone, the mutex free */
    ck_assert_msg(contenders_become(zt.zh, leases, 1), "the waiter's lease node was never deleted");
    ck_assert_msg(contenders_become(zt.zh, locks, 0), "the waiter's mutex node was never deleted");
    ck_assert_int_eq(dlock_permit_release(held), DLOCK_OK);
    dlock_cancel_free(k);
    free(leases);
    free(locks);
    dlock_semaphore_free(s);
    dlock_semaphore_free(sd);
    dlock_client_close(d);
    zk_close(&zt);
}

TU_TEST_IN(stopped, sem_wait_ends_on_time_on_a_stopped_server, 90)
{
    sem_wait_gives_up_on_a_stopped_server("sem-stopped-bounded", false);
}

TU_TEST_IN(stopped, canceled_sem_wait_ends_on_a_stopped_server, 90)
{
    sem_wait_gives_up_on_a_stopped_server("sem-stopped-canceled", true);
}

/* ============================================================= ensemble */

TU_TEST_IN(ensemble, ensemble_basic, 180)
{
    char *url = url_with(NULL, "lease=4000");
    dlock_client *a = tu_open(url), *b = tu_open(url);
    dlock_lock *la = tu_lock(a, "ens"), *lb = tu_lock(b, "ens");
    ck_assert_int_eq(dlock_acquire(la, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(lb, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_int_eq(dlock_release(la), DLOCK_OK);
    tu_acquire_release(lb, DLOCK_TRY);
    TU_FREE_LOCKS(la, lb);
    TU_CLOSE_CLIENTS(a, b);
    free(url);
}

TU_TEST_IN(ensemble, leader_killed_never_two_holders, 180)
{
    char *url = kept(url_with(NULL, "lease=3000&timeout=1500&connect_timeout=3000"));
    char *dir = kept(tu_tmpdir("zk-fence"));
    pid_t w[3];
    const struct tu_fenced_turn turn = {
        .writes = 30, .min_validity_ms = 50, .pause_ms = 20, .rest_ms = 5};
    for (int i = 0; i < 3; i++)
        w[i] = tu_fenced_worker(url, dir, &turn);
    char *store = tu_fmt("%s/store", dir);
    /* fenced turns before the kill... */
    for (int i = 0; i < 600 && tu_fenced_count(store, NULL) < 50; i++)
        tu_sleep_ms(50);
    uint64_t before = tu_fenced_count(store, NULL);
    ck_assert_msg(before >= 50, "only %" PRIu64 " fenced writes before the kill", before);
    int leader = zkf_leader(&F);
    ck_assert_int_ge(leader, 0);
    zkf_server_stop(&F, leader, SIGKILL);
    ck_assert_msg(zkf_wait_serving(&F, 60000), "no new leader");
    /* ...and under the new leader */
    uint64_t at_election = tu_fenced_count(store, NULL);
    for (int i = 0; i < 600 && tu_fenced_count(store, NULL) < at_election + 50; i++)
        tu_sleep_ms(50);
    ck_assert_msg(tu_fenced_count(store, NULL) >= at_election + 50,
                  "no fenced turns under the new leader (%" PRIu64 " -> %" PRIu64 ")",
                  at_election, tu_fenced_count(store, NULL));
    uint64_t total = tu_fenced_stop(w, 3, dir, "leader test");
    uint64_t stale = 0, count = tu_fenced_count(store, &stale);
    ck_assert_uint_eq(stale, 0);
    ck_assert_uint_eq(count, total);
    ck_assert_uint_gt(count, 0);
    /* the old leader rejoins */
    ck_assert(zkf_server_start(&F, leader, 60000));
    free(store);
    tu_rmrf(dir);
    free(dir);
    free(url);
}

/* ============================================== a fault-injecting proxy */

/* The fault relay (tests/lib/relay.h) as a proxy in front of the
 * standalone server. TU_RELAY_DROP keeps passing the client's bytes to
 * the server but throws the server's replies away: requests are
 * executed, their replies are lost. BLACKHOLE drops both directions.
 * REFUSE closes every connection at once and each new one as it comes
 * (a server that is down: requests fail fast with a connection loss).
 * Entering REFUSE, and leaving DROP or BLACKHOLE, closes the proxied
 * connections (their streams are cut mid-reply, before a reply after the
 * lost ones could reach the client with an xid it does not expect:
 * ZRUNTIMEINCONSISTENCY) so the client reconnects through the proxy, to
 * the same session. A client that goes takes its server side along. */
static void proxy_start(struct tu_relay *px, int target)
{
    tu_relay_start_with(px, &(struct tu_relay_config){.target = target, .close_with_client = true});
}

/* A client of the standalone server through a fresh proxy (QUERY: the
 * URL's options), with a handle on NAME: the frame of the proxy tests. */
struct proxied {
    struct tu_relay px;
    char *url;
    dlock_client *c;
    dlock_lock *l;
    zhandle_t *zh; /* proxied_open_kept()'s raw session, else NULL */
};

static void proxied_open(struct proxied *f, const char *query, const char *name)
{
    REQUIRE_SERVERS();
    proxy_start(&f->px, F.s[0].port);
    f->url = tu_fmt("zk://127.0.0.1:%d?%s", f->px.port, query);
    f->c = tu_open(f->url);
    f->l = tu_lock(f->c, name);
    f->zh = NULL;
}

/* proxied_open(), and the lock node of NAME made (an acquire and a
 * release) and kept (a foreign child: a container would vanish when its
 * last contender leaves); F->zh is a raw session to the server. */
static void proxied_open_kept(struct proxied *f, const char *query, const char *name)
{
    proxied_open(f, query, name);
    tu_acquire_release(f->l, DLOCK_TRY);
    f->zh = raw_open(NULL);
    char *lockpath = tu_fmt("/dlock/%s", name);
    raw_keep_lock_node(f->zh, lockpath);
    free(lockpath);
}

static void proxied_close(struct proxied *f)
{
    if (f->zh)
        zookeeper_close(f->zh);
    dlock_lock_free(f->l);
    dlock_client_close(f->c);
    tu_relay_stop(&f->px);
    free(f->url);
}

/* The blocking waiter's side of check_async's
 * parked_count_ended_by_the_watch_replies_holds: A holds, B waits, and C
 * (through the proxy) lists both ahead; its watches on them are kept at
 * the proxy while B gives up (its wait ends) and, when A_GOES, A
 * releases. The watches' replies (no node) then count those nodes gone:
 * with A still there C waits until A's release (its event); with both
 * gone C holds at once, with no event to come (its safety-net look would
 * be a session timeout, 60 s, later). */
static void count_ended_by_replies(const char *name, bool a_goes)
{
    struct proxied f;
    proxied_open(&f, "lease=60s", name);
    struct zk_frame zt = zk_open("lease=60s", true);
    dlock_client *cb = tu_open(zt.url);
    dlock_lock *a = tu_lock_mode(zt.c, name, DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED);
    dlock_lock *b = tu_lock_mode(cb, name, DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED);
    dlock_lock *c = tu_lock_mode(f.c, name, DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED);
    ck_assert_int_eq(dlock_acquire(a, DLOCK_TRY), DLOCK_OK);
    int64_t owner = 0;
    char *holder = holder_path(zt.c, zt.zh, name, &owner);
    struct tu_waiter wb, wc;
    tu_waiter_start_ex(&wb, b, 2000, NULL, true);
    expect_waiters(zt.c, name, 1, 10000);
    tu_relay_keep_at(&f.px, strrchr(holder, '/') + 1); /* C's watches name A's node */
    tu_waiter_start_ex(&wc, c, 60000, NULL, true);
    for (int i = 0; i < 2000 && atomic_load(&f.px.kept) == 0; i++)
        tu_sleep_ms(10);
    ck_assert_msg(atomic_load(&f.px.kept) == 1, "C never watched %s", holder);
    ck_assert_int_eq(tu_waiter_join(&wb), DLOCK_ETIMEDOUT);
    expect_waiters(zt.c, name, 1, 10000); /* C's node alone behind A's */
    if (a_goes)
        ck_assert_int_eq(dlock_release(a), DLOCK_OK);
    tu_relay_let_kept(&f.px);
    if (!a_goes) {
        ck_assert_msg(!tu_waiter_wait_done(&wc, 300), "C held while A did (rc %d)",
                      atomic_load(&wc.rc));
        ck_assert_int_eq(dlock_release(a), DLOCK_OK);
    }
    ck_assert_msg(tu_waiter_wait_done(&wc, 20000), "C not handed the lock within 20 s");
    ck_assert_int_eq(tu_waiter_join(&wc), DLOCK_OK);
    ck_assert_int_eq(dlock_acquire(a, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_int_eq(dlock_release(c), DLOCK_OK);
    free(holder);
    TU_FREE_LOCKS(a, b, c);
    dlock_client_close(cb);
    zk_close(&zt);
    proxied_close(&f);
}

TU_TEST_IN(standalone, waiter_counting_by_replies_waits_for_the_holder, 60)
{
    count_ended_by_replies("replies-wait", false);
}

TU_TEST_IN(standalone, waiter_counted_out_by_replies_holds_at_once, 60)
{
    count_ended_by_replies("replies-hold", true);
}

/* A create whose reply is lost: the node exists on the server but the
 * client never learned its name. dlock must not leave it in the queue
 * (it would block the lock until the session ends): once the connection
 * is back it finds the node by its guid and deletes it. */
TU_TEST_IN(standalone, lost_create_reply_leaves_no_node, 90)
{
    struct proxied f;
    proxied_open_kept(&f, "lease=6000&timeout=400", "lost-reply");
    dlock_lock *warm = f.l;
    tu_relay_set(&f.px, TU_RELAY_DROP);
    TU_ACQUIRE_EXPECT(warm, DLOCK_TRY, DLOCK_ECONN, "acquire without replies");
    /* the server did create it */
    int n = 0;
    for (int i = 0; i < 200 && n == 0; i++) {
        if (i)
            tu_sleep_ms(25);
        n = raw_contenders(f.zh, "/dlock/lost-reply");
    }
    ck_assert_msg(n >= 1, "the create never reached the server (acquire: %s)", dlock_errmsg());
    tu_relay_set(&f.px, TU_RELAY_PASS);
    /* reconnected: the stray node goes, without any further call */
    for (int i = 0; i < 400 && n > 0; i++) {
        tu_sleep_ms(25);
        n = raw_contenders(f.zh, "/dlock/lost-reply");
    }
    ck_assert_msg(n == 0, "a node of the lost create stays in the queue");
    /* and the lock is free for others */
    struct tu_solo other = direct_open(NULL, "lost-reply");
    tu_acquire_release(other.l, DLOCK_TRY);
    tu_solo_close(&other);
    proxied_close(&f);
}

/* A release whose request never reaches the server: the caller hears
 * DLOCK_ECONN and the hold is gone for it, so the node must go too, as
 * soon as the connection is back, without any further call. */
TU_TEST_IN(standalone, lost_release_leaves_no_node, 90)
{
    struct proxied f;
    proxied_open(&f, "lease=6000&timeout=400", "lost-release");
    ck_assert_int_eq(dlock_acquire(f.l, DLOCK_TRY), DLOCK_OK);
    zhandle_t *zh = raw_open(NULL);
    tu_relay_set(&f.px, TU_RELAY_BLACKHOLE);
    int rc = dlock_release(f.l);
    ck_assert_msg(rc == DLOCK_ECONN, "release unheard: %s %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_msg(strstr(dlock_errmsg(), "lost-release"), "message: %s", dlock_errmsg());
    int n = 0;
    char **kids = raw_children(zh, "/dlock/lost-release", &n);
    ck_assert_int_eq(n, 1); /* still there: the delete never arrived */
    free_strings(kids, n);
    tu_relay_set(&f.px, TU_RELAY_PASS);
    for (int i = 0; i < 400 && n > 0; i++) {
        tu_sleep_ms(25);
        kids = raw_children(zh, "/dlock/lost-release", &n);
        free_strings(kids, n);
    }
    ck_assert_msg(n == 0, "the node of the unheard release stays");
    zookeeper_close(zh);
    proxied_close(&f);
}

/* Waits (from a helper thread) until LOCKPATH has exactly WANT children on
 * the server, then lets replies through again (the proxy cuts the
 * connections: the client reconnects to the same session). */
struct heal_arg {
    struct tu_relay *px;
    const char *lockpath;
    int want;
    bool seen;
};

/* Wait (up to 8 s) until LOCKPATH has exactly WANT protected children
 * ("_c_..."), through ZH; the last one's name into NAME (SIZE bytes; may
 * be NULL). Whether it came to that. */
static bool wait_protected(zhandle_t *zh, const char *lockpath, int want, char *name,
                           size_t size)
{
    for (int i = 0; i < 800; i++) {
        struct String_vector v = {0, NULL};
        int rc = zoo_get_children(zh, lockpath, 0, &v);
        int n = rc == ZOK ? 0 : rc == ZNONODE ? 0 : -1;
        for (int32_t k = 0; rc == ZOK && k < v.count; k++)
            if (strncmp(v.data[k], "_c_", 3) == 0 && ++n && name)
                snprintf(name, size, "%s", v.data[k]);
        deallocate_String_vector(&v);
        if (n == want)
            return true;
        tu_sleep_ms(10);
    }
    return false;
}

static void *heal_when(void *p)
{
    struct heal_arg *a = p;
    zhandle_t *zh = raw_open(NULL);
    a->seen = wait_protected(zh, a->lockpath, a->want, NULL, 0);
    tu_relay_set(a->px, TU_RELAY_PASS);
    zookeeper_close(zh);
    return NULL;
}

/* A release whose delete is executed but whose reply is lost, with the
 * connection back within the op timeout: the retried delete finds no
 * node. That is our own delete, not a lock lost before the release: the
 * release succeeded and must say DLOCK_OK, not DLOCK_ELOST. */
TU_TEST_IN(standalone, release_reply_lost_then_reconnect, 90)
{
    struct proxied f;
    proxied_open(&f, "lease=6000&timeout=4000", "release-reply");
    ck_assert_int_eq(dlock_acquire(f.l, DLOCK_TRY), DLOCK_OK);
    struct heal_arg ha = {.px = &f.px, .lockpath = "/dlock/release-reply", .want = 0};
    tu_relay_set(&f.px, TU_RELAY_DROP);
    pthread_t th;
    pthread_create(&th, NULL, heal_when, &ha);
    int rc = dlock_release(f.l);
    pthread_join(th, NULL);
    ck_assert_msg(ha.seen, "the delete never reached the server");
    ck_assert_msg(rc == DLOCK_OK, "release whose reply was lost: %s %s", dlock_err_name(rc),
                  dlock_errmsg());
    /* and the lock is free */
    tu_acquire_release(f.l, DLOCK_TRY);
    proxied_close(&f);
}

/* A create executed on the server whose reply is lost to a cut
 * connection, the connection back within the op timeout: the node is
 * ours (found again by its guid), the acquisition succeeds on the free
 * lock, even as a try-once, with that one node and its czxid as token,
 * and no second node of ours stays in the queue. */
TU_TEST_IN(standalone, create_reply_lost_node_found_by_guid, 90)
{
    struct proxied f;
    proxied_open_kept(&f, "lease=6000&timeout=4000", "create-reply");
    for (int round = 0; round < 3; round++) {
        struct heal_arg ha = {.px = &f.px, .lockpath = "/dlock/create-reply", .want = 1};
        tu_relay_set(&f.px, TU_RELAY_DROP);
        pthread_t th;
        pthread_create(&th, NULL, heal_when, &ha);
        int rc = dlock_acquire(f.l, DLOCK_TRY);
        pthread_join(th, NULL);
        ck_assert_msg(ha.seen, "the create never reached the server");
        ck_assert_msg(rc == DLOCK_OK, "round %d: try-once on a free lock whose create reply "
                      "was lost: %s %s", round, dlock_err_name(rc), dlock_errmsg());
        int n = 0;
        char **kids = raw_children(f.zh, "/dlock/create-reply", &n);
        ck_assert_int_eq(raw_contenders(f.zh, "/dlock/create-reply"), 1);
        char *path = NULL;
        for (int i = 0; i < n; i++)
            if (strncmp(kids[i], "_c_", 3) == 0)
                path = tu_fmt("/dlock/create-reply/%s", kids[i]);
        struct Stat st;
        ck_assert_int_eq(zoo_exists(f.zh, path, 0, &st), ZOK);
        ck_assert_uint_eq((uint64_t)st.czxid, tu_token(f.l));
        free(path);
        free_strings(kids, n);
        ck_assert_int_eq(dlock_release(f.l), DLOCK_OK);
        ck_assert_int_eq(raw_contenders(f.zh, "/dlock/create-reply"), 0);
    }
    proxied_close(&f);
}

/* impostor_when: once the node of a create whose reply is lost shows up
 * under LOCKPATH ("_c_<guid>-lock-<seq>"), a raw client puts a persistent
 * node beside it with the same guid and a lower sequence (anyone who can
 * list the directory can copy the guid), deletes ours, then lets replies
 * through: the one node with our guid is not ours. */
struct impostor_arg {
    struct tu_relay *px;
    const char *lockpath;
    bool made;
};

static void *impostor_when(void *p)
{
    struct impostor_arg *a = p;
    zhandle_t *zh = raw_open(NULL);
    char ours[128] = "";
    if (wait_protected(zh, a->lockpath, 1, ours, sizeof ours)) {
        char *path = tu_fmt("%s/%.39s-lock-0000000000", a->lockpath, ours);
        char *mine = tu_fmt("%s/%s", a->lockpath, ours);
        a->made = zoo_create(zh, path, "impostor", 8, &ZOO_OPEN_ACL_UNSAFE, ZOO_PERSISTENT, NULL,
                             0) == ZOK &&
                  zoo_delete(zh, mine, -1) == ZOK;
        free(path);
        free(mine);
    }
    tu_relay_set(a->px, TU_RELAY_PASS);
    zookeeper_close(zh);
    return NULL;
}

/* A create whose reply is lost is found again by its guid -- but a node
 * that carries the guid and is not our session's ephemeral node is not
 * ours, whatever its name says. Here the one node with our guid is a
 * persistent impostor: adopting it makes a try-once "hold" the lock on a
 * node that is not ours (before: DLOCK_OK, the impostor's czxid as the
 * token); refused, the create is tried again and ours stands behind it:
 * DLOCK_EBUSY. */
TU_TEST_IN(standalone, create_reply_lost_impostor_not_adopted, 90)
{
    struct proxied f;
    proxied_open_kept(&f, "lease=6000&timeout=4000", "impostor");
    struct impostor_arg ia = {.px = &f.px, .lockpath = "/dlock/impostor"};
    for (int k = 0; k < 4; k++) { /* our sequence past the impostor's */
        char made[256];
        ck_assert_int_eq(zoo_create(f.zh, "/dlock/impostor/x-", NULL, -1, &ZOO_OPEN_ACL_UNSAFE,
                                    ZOO_EPHEMERAL_SEQUENTIAL, made, sizeof made),
                         ZOK);
        ck_assert_int_eq(zoo_delete(f.zh, made, -1), ZOK);
    }
    tu_relay_set(&f.px, TU_RELAY_DROP);
    pthread_t th;
    pthread_create(&th, NULL, impostor_when, &ia);
    int rc = dlock_acquire(f.l, DLOCK_TRY);
    pthread_join(th, NULL);
    ck_assert_msg(ia.made, "the impostor was not put in place");
    ck_assert_msg(rc == DLOCK_EBUSY, "try-once whose create reply was lost, an impostor with "
                  "our guid: %s %s (token %llu)", dlock_err_name(rc), dlock_errmsg(),
                  (unsigned long long)(rc == DLOCK_OK ? tu_token(f.l) : 0));
    if (rc == DLOCK_OK)
        dlock_release(f.l);
    int n = 0;
    char **kids = raw_children(f.zh, "/dlock/impostor", &n);
    for (int i = 0; i < n; i++) {
        char *path = tu_fmt("/dlock/impostor/%s", kids[i]);
        zoo_delete(f.zh, path, -1);
        free(path);
    }
    free_strings(kids, n);
    proxied_close(&f);
}

/* A waiting acquire whose create lost its reply retries the create while
 * the server cannot be reached (each try fails at once: connection
 * refused); a cancel during those retries ends the acquire at once. The
 * op timeout, which bounds the retries, is two minutes, past this case's
 * time limit: retries that paused without looking at the cancel fail the
 * test by its timeout. The node of the lost create goes once the server
 * is back. */
TU_TEST_IN(standalone, cancel_during_create_retries, 60)
{
    struct proxied f;
    proxied_open_kept(&f, "lease=6000&timeout=120000&connect_timeout=120000", "create-retry");
    tu_relay_set(&f.px, TU_RELAY_DROP);
    struct tu_waiter arg;
    forever_waiter(&arg, f.l);
    int n = 0;
    for (int i = 0; i < 800 && n < 1; i++) {
        if (i)
            tu_sleep_ms(25);
        n = raw_contenders(f.zh, "/dlock/create-retry");
    }
    ck_assert_msg(n == 1, "the create never reached the server");
    tu_relay_set(&f.px, TU_RELAY_REFUSE); /* the reply is lost; every retry fails */
    ck_assert_int_eq(dlock_lock_cancel(f.l), DLOCK_OK);
    tu_waiter_join(&arg);
    ck_assert_msg(arg.rc == DLOCK_ECANCELED, "canceled during create retries: %s",
                  dlock_err_name(arg.rc));
    tu_relay_set(&f.px, TU_RELAY_PASS);
    for (int i = 0; i < 800 && n > 0; i++) {
        tu_sleep_ms(25);
        n = raw_contenders(f.zh, "/dlock/create-retry");
    }
    ck_assert_msg(n == 0, "the node of the canceled create stays in the queue");
    proxied_close(&f);
}

struct other_taker {
    const char *url, *name;
    int64_t wait;
    const atomic_int *watch; /* what SEEN samples */
    bool hold;               /* keep the lock until RELEASE_NOW (20 s at most) */
    int rc, seen;
    uint64_t token;
    atomic_int done; /* RC, SEEN and TOKEN are set */
    atomic_int release_now;
};

/* Another client of URL taking NAME in a thread of its own, waiting WAIT
 * ms: when its acquire returns, RC is what it returned, TOKEN its token
 * and SEEN what *WATCH held at that moment (whether what the test wants
 * to happen first had happened), then DONE is set; it releases at once,
 * or once RELEASE_NOW is set when HOLD. */
static void *other_taker_main(void *p)
{
    struct other_taker *a = p;
    struct tu_solo s;
    a->rc = tu_solo_open_quiet(a->url, a->name, &s);
    if (a->rc == DLOCK_OK) {
        a->rc = dlock_acquire(s.l, a->wait);
        a->seen = atomic_load(a->watch);
        if (a->rc == DLOCK_OK)
            dlock_token(s.l, &a->token);
    }
    atomic_store(&a->done, 1);
    if (a->rc == DLOCK_OK) {
        for (int i = 0; a->hold && i < 2000 && !atomic_load(&a->release_now); i++)
            tu_sleep_ms(10);
        dlock_release(s.l);
    }
    tu_solo_close(&s);
    return NULL;
}

/* A holder cut off from the server (a proxy that drops both directions)
 * past its session timeout, while another client waits for the lock:
 * the holder's loss is reported (once) before the other client gets the
 * lock, never after. Once the connection is back the old session is
 * found expired: the release says DLOCK_ELOST, the lost callback does not
 * run again, and the very next acquisition opens a new session and
 * queues (busy while the other client holds, then taken). */
TU_TEST_IN(standalone, partitioned_holder_lost_before_other_holds, 90)
{
    struct proxied f;
    proxied_open(&f, "lease=2000&timeout=1000&connect_timeout=3000", "partitioned");
    watch_lost(f.l);
    ck_assert_int_eq(dlock_acquire(f.l, DLOCK_TRY), DLOCK_OK);
    uint64_t t = tu_token(f.l);

    char *direct = url_with(NULL, "lease=2000");
    struct other_taker a = {.url = direct, .name = "partitioned", .wait = 30000,
                            .watch = &hold_lost.fired, .hold = true, .rc = -1};
    pthread_t th;
    tu_relay_set(&f.px, TU_RELAY_BLACKHOLE);
    pthread_create(&th, NULL, other_taker_main, &a);
    /* the other client gets the lock once our session expired */
    for (int i = 0; i < 3000 && !atomic_load(&a.done); i++)
        tu_sleep_ms(10);
    ck_assert_msg(atomic_load(&a.done), "the other client is still waiting");
    ck_assert_msg(a.rc == DLOCK_OK, "the other client: %s", dlock_err_name(a.rc));
    ck_assert_msg(a.seen == 1,
                  "the other client held the lock before our loss was reported");
    tu_relay_set(&f.px, TU_RELAY_PASS);
    /* the next acquire opens a new session, even one made while the
     * client is still learning that the old one expired (a waiting one:
     * a try-once does not wait for a connection) */
    dlock_lock *l2 = tu_lock(f.c, "partitioned-2");
    TU_ACQUIRE_EXPECT(l2, 20000, DLOCK_OK, "first acquire after the partition");
    ck_assert_int_eq(dlock_release(l2), DLOCK_OK);
    dlock_lock_free(l2);
    /* the expired session: lost, once */
    ck_assert_int_eq(dlock_release(f.l), DLOCK_ELOST);
    TU_ACQUIRE_EXPECT(f.l, DLOCK_TRY, DLOCK_EBUSY, "acquire while the other client holds");
    atomic_store(&a.release_now, 1);
    TU_ACQUIRE_EXPECT(f.l, 20000, DLOCK_OK, "acquire after the other released");
    ck_assert_uint_gt(tu_token(f.l), t);
    pthread_join(th, NULL);
    ck_assert_int_eq(dlock_release(f.l), DLOCK_OK);
    ck_assert_int_eq(atomic_load(&hold_lost.fired), 1);
    free(direct);
    proxied_close(&f);
}

/* A waiter cut off from the server past its session timeout while the
 * lock changes hands: its node went with its session, so once the
 * connection is back it must queue again with a new session (never
 * believe it holds while another client does) and get the lock when that
 * client releases, within its one acquire call. */
TU_TEST_IN(standalone, partitioned_waiter_requeues, 90)
{
    REQUIRE_SERVERS();
    struct tu_relay px;
    proxy_start(&px, F.s[0].port);
    char *purl = tu_fmt("zk://127.0.0.1:%d?lease=2000&timeout=1000&connect_timeout=3000",
                        px.port);
    char *direct = url_with(NULL, "lease=2000");
    dlock_client *h = tu_open(direct), *o = tu_open(direct);
    dlock_lock *lh = tu_lock(h, "pwait"), *lo = tu_lock(o, "pwait");
    ck_assert_int_eq(dlock_acquire(lh, DLOCK_TRY), DLOCK_OK);
    atomic_int other_holds = 0; /* set while another client holds */
    struct other_taker a = {.url = purl, .name = "pwait", .wait = 60000, .watch = &other_holds,
                            .rc = -1};
    pthread_t th;
    pthread_create(&th, NULL, other_taker_main, &a);
    expect_waiters(h, "pwait", 1, 4000);
    /* cut the waiter off; the lock goes to another client meanwhile */
    tu_relay_set(&px, TU_RELAY_BLACKHOLE);
    atomic_store(&other_holds, 1);
    ck_assert_int_eq(dlock_release(lh), DLOCK_OK);
    int rc = dlock_acquire(lo, 20000); /* once the waiter's session expired */
    ck_assert_msg(rc == DLOCK_OK, "%s %s", dlock_err_name(rc), dlock_errmsg());
    uint64_t to = tu_token(lo);
    tu_relay_set(&px, TU_RELAY_PASS);
    /* the waiter comes back, finds its session expired, queues again */
    for (int k = 0; k < 300 && tu_waiters(o, "pwait") < 1 && !atomic_load(&a.done); k++)
        tu_sleep_ms(20);
    ck_assert_msg(!atomic_load(&a.done), "the waiter returned %s while another client held",
                  dlock_err_name(a.rc));
    ck_assert_int_eq(tu_waiters(o, "pwait"), 1);
    atomic_store(&other_holds, 0);
    ck_assert_int_eq(dlock_release(lo), DLOCK_OK);
    pthread_join(th, NULL);
    ck_assert_msg(a.rc == DLOCK_OK, "the waiter: %s", dlock_err_name(a.rc));
    ck_assert_int_eq(a.seen, 0); /* it never held while the other did */
    ck_assert_uint_gt(a.token, to);
    TU_FREE_LOCKS(lh, lo);
    TU_CLOSE_CLIENTS(h, o);
    tu_relay_stop(&px);
    free(direct);
    free(purl);
}

/* An acquire that waits while the client cannot reach the server (its
 * session reconnecting) honours its cancel and its deadline: ECANCELED /
 * ETIMEDOUT when they come, not a connection error a whole connect
 * timeout later. */
TU_TEST_IN(standalone, wait_while_disconnected_honours_cancel_and_deadline, 90)
{
    struct proxied f;
    proxied_open(&f, "lease=2000&timeout=1000&connect_timeout=30000", "offline");
    tu_relay_set(&f.px, TU_RELAY_BLACKHOLE);
    tu_sleep_ms(2500); /* the client library notices (2/3 of the session) */
    struct tu_waiter arg;
    forever_waiter(&arg, f.l);
    ck_assert_msg(tu_wait_thread_asleep(&arg.tid, 20000), "the acquire never went to sleep");
    ck_assert_int_eq(dlock_lock_cancel(f.l), DLOCK_OK);
    tu_waiter_join(&arg);
    ck_assert_msg(arg.rc == DLOCK_ECANCELED, "canceled wait while disconnected: %s",
                  dlock_err_name(arg.rc));
    TU_ACQUIRE_EXPECT(f.l, 500, DLOCK_ETIMEDOUT, "bounded wait while disconnected");
    tu_relay_set(&f.px, TU_RELAY_PASS);
    TU_ACQUIRE_EXPECT(f.l, 20000, DLOCK_OK, "after reconnecting");
    ck_assert_int_eq(dlock_release(f.l), DLOCK_OK);
    proxied_close(&f);
}

/* A waiting acquire whose create meets a disconnect (no reply within the
 * op timeout) keeps waiting, as a queued waiter does: once the
 * connection is back it takes the free lock, and no stray node of the
 * unanswered create stays behind. */
TU_TEST_IN(standalone, wait_survives_disconnect_during_create, 90)
{
    struct proxied f;
    proxied_open(&f, "lease=4000&timeout=500", "blip");
    dlock_lock *l = f.l;
    zhandle_t *zh = raw_open(NULL);
    raw_keep_lock_node(zh, "/dlock/blip");
    tu_relay_set(&f.px, TU_RELAY_BLACKHOLE);
    struct tu_waiter arg;
    forever_waiter(&arg, l); /* waits forever */
    tu_sleep_ms(1200); /* past the op timeout of its create */
    tu_relay_set(&f.px, TU_RELAY_PASS);
    /* its acquire returns holding the lock; a cancel only for one that
     * never gets there (a cancel 200 ms after the lock showed held could
     * reach an acquire still on its way back on a loaded machine) */
    if (!tu_waiter_wait_done(&arg, 30000))
        dlock_lock_cancel(l);
    tu_waiter_join(&arg);
    ck_assert_msg(arg.rc == DLOCK_OK, "waiting acquire across a disconnect: %s",
                  dlock_err_name(arg.rc));
    ck_assert_int_eq(raw_contenders(zh, "/dlock/blip"), 1);
    /* the last handle's free releases the hold: its node goes */
    proxied_close(&f);
    for (int i = 0; i < 400 && raw_contenders(zh, "/dlock/blip") > 0; i++)
        tu_sleep_ms(25);
    ck_assert_int_eq(raw_contenders(zh, "/dlock/blip"), 0);
    zookeeper_close(zh);
}

/* A waiter canceled while its client is cut off (and knows it: the
 * session is reconnecting) returns at once: the delete of its node cannot
 * be sent now, so it goes to the cleanup queue, and the node is gone
 * once the connection is back. The op timeout is two minutes, past this
 * case's time limit: a cancel that retried the delete for it fails the
 * test by its timeout. */
TU_TEST_IN(standalone, cancel_while_disconnected_returns_at_once, 90)
{
    struct tu_solo holder = direct_open("lease=2000", "cut-cancel");
    struct proxied f;
    proxied_open(&f, "lease=2000&timeout=120000&connect_timeout=120000", "cut-cancel");
    dlock_lock *lh = holder.l, *l = f.l;
    dlock_lock *probe = tu_lock(f.c, "cut-cancel-probe");
    ck_assert_int_eq(dlock_acquire(lh, DLOCK_TRY), DLOCK_OK);
    struct tu_waiter arg;
    forever_waiter(&arg, l);
    expect_waiters(holder.c, "cut-cancel", 1, 10000);

    tu_relay_set(&f.px, TU_RELAY_BLACKHOLE);
    /* short waits until the client library gives the connection up */
    bool reconnecting = false;
    for (int i = 0; i < 2000 && !reconnecting; i++) {
        TU_ACQUIRE_EXPECT(probe, 100, DLOCK_ETIMEDOUT, "probe");
        reconnecting = strstr(dlock_errmsg(), "(connecting)") ||
                       strstr(dlock_errmsg(), "(associating)");
    }
    ck_assert_msg(reconnecting, "the client never noticed the cut: %s", dlock_errmsg());
    ck_assert_int_eq(dlock_lock_cancel(l), DLOCK_OK);
    tu_waiter_join(&arg);
    ck_assert_int_eq(arg.rc, DLOCK_ECANCELED);

    tu_relay_set(&f.px, TU_RELAY_PASS);
    /* its node goes once reconnected (or with its session) */
    expect_waiters(holder.c, "cut-cancel", 0, 30000);
    ck_assert_int_eq(dlock_release(lh), DLOCK_OK);
    dlock_lock_free(probe);
    proxied_close(&f);
    tu_solo_close(&holder);
}

/* A session closed by someone else (another process that took it over
 * with its id and password, as Curator's KillSession does): the client
 * library learns it on reconnecting (ZOO_EXPIRED_SESSION_STATE) and the
 * hold must be reported lost then, not at the next renewal. The session
 * is ten minutes long, so the keeper renews every 200 s and sleeps in
 * between, far past this case's time limit: only the watcher can report
 * it in time. dlock connects through the proxy, held in BLACKHOLE while
 * the session is taken over, so that it cannot take it back first. */
TU_TEST_IN(standalone, session_closed_elsewhere_reported_lost_at_once, 90)
{
    struct proxied f;
    proxied_open(&f, "lease=600000&timeout=2000&connect_timeout=5000", "killed-session");
    clientid_t id = *zoo_client_id(dlock_last_handle());
    ck_assert(id.client_id != 0);
    dlock_lock *l = f.l;
    watch_lost(l);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    uint64_t t = tu_token(l);
    ck_assert_int_gt(dlock_validity_ms(l), 60000);

    tu_relay_set(&f.px, TU_RELAY_BLACKHOLE);
    zhandle_t *thief = zookeeper_init2(F.hosts, raw_watcher, 600000, &id, NULL, 0, raw_quiet);
    ck_assert_ptr_nonnull(thief);
    for (int i = 0; i < 400 && zoo_state(thief) != ZOO_CONNECTED_STATE; i++)
        tu_sleep_ms(25);
    ck_assert_msg(zoo_state(thief) == ZOO_CONNECTED_STATE, "could not take the session over");
    ck_assert(zoo_client_id(thief)->client_id == id.client_id);
    zookeeper_close(thief); /* ends the session: its nodes go */
    ck_assert_int_eq(atomic_load(&hold_lost.fired), 0);
    tu_relay_set(&f.px, TU_RELAY_PASS);

    tu_wait_lost(&hold_lost, 1, 30000);
    ck_assert_msg(atomic_load(&hold_lost.fired) == 1,
                  "the expired session's hold was not reported lost before the next renewal");
    ck_assert_msg(strstr(hold_lost.why, "expired"), "reason: %s", hold_lost.why);
    ck_assert_int_eq(dlock_validity_ms(l), 0);
    ck_assert_int_eq(dlock_release(l), DLOCK_ELOST);
    TU_ACQUIRE_EXPECT(l, 20000, DLOCK_OK, "acquire on a new session");
    ck_assert_uint_gt(tu_token(l), t);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    ck_assert_int_eq(atomic_load(&hold_lost.fired), 1);
    proxied_close(&f);
}

/* Wait (up to 30 s) until L's hold has been renewed TIMES times: its
 * validity went up by more than it fell since the last look. */
static void wait_renewed(dlock_lock *l, int times)
{
    int64_t last = dlock_validity_ms(l);
    for (int i = 0; i < 1500 && times > 0; i++) {
        tu_sleep_ms(20);
        int64_t now = dlock_validity_ms(l);
        if (now > last + 50)
            times--;
        last = now;
    }
    ck_assert_msg(times == 0, "the hold was not renewed");
}

/* The only node of the lock NAME's queue, deleted through ZH (another
 * client's force-release); its path into PATH (SIZE bytes). */
static void delete_only_node(zhandle_t *zh, const char *name, char *path, size_t size)
{
    char *lockpath = tu_fmt("/dlock/%s", name);
    int n = 0;
    char **kids = raw_children(zh, lockpath, &n);
    ck_assert_int_eq(n, 1);
    snprintf(path, size, "%s/%s", lockpath, kids[0]);
    free_strings(kids, n);
    free(lockpath);
    ck_assert_int_eq(zoo_delete(zh, path, -1), ZOK);
}

/* After its first renewal a hold's node carries an exists watch and the
 * renewals send nothing for it but the sync: deleting the node behind the
 * client's back must still be reported (the watch's event makes the next
 * renewal ask), as "gone", not as a lost session. */
TU_TEST_IN(standalone, watched_hold_deleted_is_lost, 60)
{
    struct zk_frame zt = zk_open("lease=1500", true);
    dlock_lock *l = tu_lock(zt.c, "watched");
    watch_lost(l);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    wait_renewed(l, 3); /* checked, then confirmed by the watch */
    char path[256];
    delete_only_node(zt.zh, "watched", path, sizeof path);
    ck_assert_msg(tu_wait_lost(&hold_lost, 1, 30000), "the deleted node's hold was never lost");
    ck_assert_msg(strstr(hold_lost.why, path) && strstr(hold_lost.why, "is gone"), "%s",
                  hold_lost.why);
    ck_assert_int_eq(dlock_release(l), DLOCK_ELOST);
    dlock_lock_free(l);
    zk_close(&zt);
}

/* A watched exclusive hold downgraded: its read node takes over (the
 * hold's path changes) and must be checked, not confirmed by the write
 * node's old watch; deleting it is reported lost. */
TU_TEST_IN(standalone, watched_hold_downgraded_then_deleted_is_lost, 60)
{
    struct zk_frame zt = zk_open("lease=1500", true);
    dlock_lock *l = tu_lock(zt.c, "wdown");
    dlock_lock *r = tu_lock_mode(zt.c, "wdown", DLOCK_SHARED, 0);
    watch_lost(r);
    dlock_lock_on_lost(l, tu_on_lost, &hold_lost);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    wait_renewed(l, 3); /* checked, then confirmed by the watch */
    ck_assert_int_eq(dlock_acquire(r, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK); /* the downgrade */
    wait_renewed(r, 3);
    char path[256];
    delete_only_node(zt.zh, "wdown", path, sizeof path);
    bool lost = tu_wait_lost(&hold_lost, 1, 15000);
    ck_assert_msg(lost, "the deleted read node's hold was never lost");
    ck_assert_int_eq(dlock_release(r), DLOCK_ELOST);
    TU_FREE_LOCKS(l, r);
    zk_close(&zt);
}

/* The same while the client's connection is cut off: the node's deletion
 * and its watch event are lost on the way; the client reconnects to the
 * same session, the client library sets its watches again and the server
 * reports the deletion, so the hold is lost as "gone" -- never confirmed
 * by a sync after the reconnect. */
TU_TEST_IN(standalone, watched_hold_deleted_while_cut_off_is_lost, 60)
{
    struct proxied f;
    proxied_open(&f, "lease=4500&timeout=1000", "watched-cut");
    zhandle_t *zh = raw_open(NULL);
    watch_lost(f.l);
    ck_assert_int_eq(dlock_acquire(f.l, DLOCK_TRY), DLOCK_OK);
    wait_renewed(f.l, 2);
    tu_relay_set(&f.px, TU_RELAY_BLACKHOLE);
    char path[256];
    delete_only_node(zh, "watched-cut", path, sizeof path);
    tu_sleep_ms(200);
    tu_relay_set(&f.px, TU_RELAY_PASS); /* cuts the connection: the client reconnects */
    ck_assert_msg(tu_wait_lost(&hold_lost, 1, 30000), "the deleted node's hold was never lost");
    ck_assert_msg(strstr(hold_lost.why, path) && strstr(hold_lost.why, "is gone"), "%s",
                  hold_lost.why);
    ck_assert_int_eq(dlock_release(f.l), DLOCK_ELOST);
    zookeeper_close(zh);
    proxied_close(&f);
}

/* "<fd> <link>" lines for the descriptors open in this process. */
static char *own_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    ck_assert_ptr_nonnull(d);
    char *out = strdup("");
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.' || atoi(de->d_name) == dirfd(d))
            continue;
        char link[256], *path = tu_fmt("/proc/self/fd/%s", de->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        free(path);
        if (n <= 0)
            continue;
        link[n] = 0;
        char *more = tu_fmt("%s%s %s\n", out, de->d_name, link);
        free(out);
        out = more;
    }
    closedir(d);
    return out;
}

/* What a program exec'd now finds open: `ls -l /proc/self/fd` run with
 * fork() and execv(), as an application embedding dlock would run one. */
static char *exec_child_fds(void)
{
    char *const argv[] = {"ls", "-l", "/proc/self/fd", NULL};
    return tu_exec_output("/bin/ls", argv, NULL);
}

/* Every descriptor dlock's client opened (sockets, the client library's
 * self-pipe) that a child exec'd now would inherit: NULL when none. */
static char *inherited_of_ours(const char *before)
{
    char *after = own_fds(), *child = exec_child_fds(), *found = NULL;
    for (char *line = strtok(after, "\n"); line && !found; line = strtok(NULL, "\n")) {
        const char *target = strchr(line, ' ');
        char *probe = tu_fmt("%s\n", line);
        bool ours = target && !strstr(before, probe) &&
                    (strncmp(target + 1, "socket:", 7) == 0 || strncmp(target + 1, "pipe:", 5) == 0 ||
                     strncmp(target + 1, "anon_inode:", 11) == 0);
        free(probe);
        if (ours && strstr(child, target + 1))
            found = tu_fmt("fd %s (the child's: %s)", line, child);
    }
    free(after);
    free(child);
    return found;
}

/* Issue 15: the client library's socket and self-pipe are not
 * close-on-exec, so a program that embeds dlock and execs a command hands
 * it an authenticated connection to the ensemble. After an acquire, and
 * again after a reconnection (a new socket), an exec'd child finds none
 * of them. Through the proxy so that the connection can be cut. */
TU_TEST_IN(standalone, descriptors_not_inherited_by_exec, 90)
{
    REQUIRE_SERVERS();
    struct tu_relay px;
    proxy_start(&px, F.s[0].port);
    char *before = own_fds();
    char *url = tu_fmt("zk://127.0.0.1:%d?timeout=2000&connect_timeout=10000", px.port);
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock(c, "cloexec");
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    char *leak = inherited_of_ours(before);
    ck_assert_msg(!leak, "inherited across exec after an acquire: %s", leak ? leak : "");
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);

    tu_relay_set(&px, TU_RELAY_PASS); /* cuts the connection: the client reconnects */
    ck_assert_int_eq(dlock_acquire(l, 20000), DLOCK_OK);
    leak = inherited_of_ours(before);
    ck_assert_msg(!leak, "inherited across exec after a reconnection: %s", leak ? leak : "");
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    dlock_client_close(c);
    tu_relay_stop(&px);
    free(before);
    free(url);
}

/* ================================================================== CLI */

/* Lines of S, not counting valgrind's ("==PID== ...") under
 * `make check VALGRIND=1`, which traces the CLI too. */
static int lines_of(const char *s)
{
    int n = 0;
    for (const char *line = s; *line;) {
        const char *end = strchr(line, '\n');
        if (strncmp(line, "==", 2) != 0)
            n++;
        if (!end)
            break;
        line = end + 1;
    }
    return n;
}

/* Token printed by `run -v` ("token N"). */
static uint64_t cli_token(const char *err)
{
    const char *t = strstr(err, "token ");
    ck_assert_msg(t, "no token in: %s", err);
    return strtoull(t + 6, NULL, 10);
}

TU_TEST_IN(standalone, cli_run_status_list_release, 90)
{
    char *url = url_with(NULL, "lease=1500");
    char *dir = tu_tmpdir("zk-cli");
    char *out = NULL, *err = NULL;

    /* tokens strictly increase across runs */
    ck_assert_int_eq(TU_DLOCK(NULL, &err, NULL, "-u", url, "run", "-v", "cli-job", "true"), 0);
    uint64_t t1 = cli_token(err);
    free(err);
    ck_assert_int_eq(TU_DLOCK(NULL, &err, NULL, "-u", url, "run", "-v", "cli-job", "true"), 0);
    ck_assert_uint_gt(cli_token(err), t1);
    free(err);

    /* a holder; a second run is busy (exit 1, one line) */
    char *m1 = tu_fmt("%s/m1", dir), *m2 = tu_fmt("%s/m2", dir);
    /* the holder's command ends by itself in 10 s: under valgrind the CLI
     * cannot use pidfd_open and learns of the loss only then */
    char *cmd1 = tu_fmt("touch %s; sleep 10", m1), *cmd2 = tu_fmt("touch %s", m2);
    char *log1 = tu_fmt("%s/holder.log", dir);
    const char *holder_argv[] = {tu_dlock_bin(), "-u", url, "run", "cli-job", "-c", cmd1, NULL};
    pid_t holder = tu_spawn(holder_argv, log1);
    ck_assert_msg(tu_wait_file(m1, 30000), "CLI holder never ran its command");
    /* busy under -n: silent, as flock(1), unless -v says why */
    ck_assert_int_eq(TU_DLOCK(NULL, &err, NULL, "-u", url, "run", "-n", "cli-job", "true"), 1);
    ck_assert_int_eq(lines_of(err), 0);
    free(err);
    ck_assert_int_eq(TU_DLOCK(NULL, &err, NULL, "-u", url, "run", "-n", "-v", "cli-job", "true"), 1);
    ck_assert_int_ge(lines_of(err), 1);
    free(err);

    /* a waiter queues behind it */
    const char *waiter_argv[] = {tu_dlock_bin(), "-u", url, "run", "-w", "60", "cli-job", "-c", cmd2, NULL};
    pid_t waiter = tu_spawn(waiter_argv, NULL);
    bool queued = false;
    for (int i = 0; i < 200 && !queued; i++) {
        ck_assert_int_eq(TU_DLOCK(&out, NULL, NULL, "-u", url, "status", "cli-job"), 0);
        queued = strstr(out, "waiters:  1") != NULL;
        if (!queued)
            free(out);
        tu_sleep_ms(50);
    }
    ck_assert_msg(queued, "waiter never queued");
    /* status: holder node, token, waiters in order */
    ck_assert_msg(strstr(out, "/dlock/cli-job") && strstr(out, "_c_") &&
                      strstr(out, "-lock-") && strstr(out, "held"),
                  "status: %s", out);
    free(out);
    ck_assert_int_eq(TU_DLOCK(&out, NULL, NULL, "-u", url, "status", "cli-job", "--json"), 0);
    ck_assert_msg(strstr(out, "\"waiters\":[\"_c_"), "status --json: %s", out);
    free(out);
    ck_assert_int_eq(TU_DLOCK(&out, NULL, NULL, "-u", url, "list"), 0);
    ck_assert_msg(strstr(out, "cli-job\n"), "list: %s", out);
    free(out);

    /* the operator frees it: the waiter runs, the old holder learns it
     * lost the lock (its command is terminated, exit 75) */
    ck_assert_int_eq(TU_DLOCK(NULL, &err, NULL, "-u", url, "release", "--force", "cli-job"), 0);
    free(err);
    ck_assert_msg(tu_wait_file(m2, 30000), "waiter never ran after the forced release");
    int st = -1;
    for (int i = 0; i < 1200; i++) { /* it exits by itself after its command */
        if (waitpid(waiter, &st, WNOHANG) == waiter)
            break;
        tu_sleep_ms(50);
    }
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "waiter status %d", st);
    int hst = 0;
    for (int i = 0; i < 1200; i++) {
        if (waitpid(holder, &hst, WNOHANG) == holder)
            break;
        tu_sleep_ms(50);
    }
    ck_assert_msg(WIFEXITED(hst) && WEXITSTATUS(hst) == 75, "old holder status %d (log %s)", hst,
                  log1);
    free(m1);
    free(m2);
    free(cmd1);
    free(cmd2);
    free(log1);
    tu_rmrf(dir);
    free(dir);
    free(url);
}

TU_TEST_IN(standalone, cli_curator_holder_and_errors, 90)
{
    char *url = url_with(NULL, NULL);
    char *err = NULL, *out = NULL;
    zhandle_t *zh = raw_open(NULL);
    char *node = curator_contend(zh, "/dlock/java-job");
    ck_assert_int_eq(TU_DLOCK(NULL, &err, NULL, "-u", url, "run", "-n", "java-job", "true"), 1);
    free(err);
    ck_assert_int_eq(TU_DLOCK(&out, NULL, NULL, "-u", url, "status", "java-job"), 0);
    ck_assert_msg(strstr(out, node), "status does not show Curator's node %s: %s", node, out);
    free(out);
    char *path = tu_fmt("/dlock/java-job/%s", node);
    ck_assert_int_eq(zoo_delete(zh, path, -1), ZOK);
    ck_assert_int_eq(TU_DLOCK(NULL, NULL, NULL, "-u", url, "run", "-n", "java-job", "true"), 0);

    /* errors: one clear line each */
    int port = tu_free_port();
    char *dead = tu_fmt("zk://127.0.0.1:%d?connect_timeout=500", port);
    ck_assert_int_eq(TU_DLOCK(NULL, &err, NULL, "-u", dead, "status", "x"), 69);
    char *where = tu_fmt("127.0.0.1:%d", port);
    ck_assert_msg(strstr(err, where) && lines_of(err) == 1, "stderr: %s", err);
    free(err);
    char *chroot = url_with("/missing", NULL);
    ck_assert_int_eq(TU_DLOCK(NULL, &err, NULL, "-u", chroot, "list"), 78);
    ck_assert_msg(strstr(err, "/missing") && lines_of(err) == 1, "stderr: %s", err);
    free(err);
    free(chroot);
    free(where);
    free(dead);
    free(path);
    free(node);
    zookeeper_close(zh);
    free(url);
}

/* ============================================================== suite */

int main(void)
{
    srand((unsigned)getpid());
    return tu_main("zk", NULL, NULL);
}
