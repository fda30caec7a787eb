/* contract.c -- the fixtures of contract.h: each backend's server started
 * once with the helpers of fixture_*.c, its URLs, and how to see a waiter.
 * Linked into every test binary, so the Redis parts (which talk to the
 * server with hiredis) are built only with the Redis backend.
 */
#include "contract.h"

#include <check.h>
#include <dirent.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fixture_etcd.h"
#include "fixture_redis.h"
#include "fixture_zk.h"
#include "testutil.h"

/* BASE + "?" + QUERY, or "&" when BASE already has a query. */
static char *with_query(const char *base, const char *query)
{
    if (!query || !*query)
        return tu_fmt("%s", base);
    return tu_fmt("%s%c%s", base, strchr(base, '?') ? '&' : '?', query);
}

/* Waiters as the backend reports them to dlock_inspect() (-1 unknown). */
static long inspect_waiters(dlock_client *c, const char *name)
{
    dlock_info *info = NULL;
    if (dlock_inspect(c, name, &info) != DLOCK_OK)
        return -1;
    long n = dlock_info_waiter_count(info);
    dlock_info_free(info);
    return n;
}

/* Stop (SIGSTOP, waited for) or continue PID; 0 is no process. */
static void pause_pid(pid_t pid, bool stop)
{
    if (pid <= 0)
        return;
    if (stop)
        tu_pause(pid);
    else
        kill(pid, SIGCONT);
}

/* ------------------------------------------------------------------ file */

struct file_priv {
    char *dir;
};

static bool file_start(struct ct_fixture *f)
{
    struct file_priv *p = calloc(1, sizeof *p);
    p->dir = tu_tmpdir("contract-file");
    f->priv = p;
    return true;
}

static void file_stop(struct ct_fixture *f)
{
    struct file_priv *p = f->priv;
    if (!p)
        return;
    tu_rmrf(p->dir);
    free(p->dir);
    free(p);
    f->priv = NULL;
}

static char *file_url(const struct ct_fixture *f, const char *query)
{
    const struct file_priv *p = f->priv;
    char *base = tu_fmt("file://%s", p->dir);
    char *url = with_query(base, query);
    free(base);
    return url;
}

static char *file_unreachable(const struct ct_fixture *f, int port)
{
    const struct file_priv *p = f->priv;
    return tu_fmt("file://%s/missing-%d", p->dir, port);
}

/* Watches on the lock file's inode in this process's inotify instances
 * (/proc/self/fdinfo lines "inotify wd:.. ino:<hex> ..."). */
static long file_waiters(const struct ct_fixture *f, dlock_client *c, const char *prefix,
                         const char *name)
{
    (void)f, (void)prefix;
    dlock_info *info = NULL;
    if (dlock_inspect(c, name, &info) != DLOCK_OK)
        return -1;
    struct stat st;
    int have = stat(dlock_info_key(info), &st);
    dlock_info_free(info);
    if (have < 0)
        return 0; /* never created: nobody can watch it */
    DIR *d = opendir("/proc/self/fdinfo");
    if (!d)
        return -1;
    long n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char *path = tu_fmt("/proc/self/fdinfo/%s", de->d_name);
        char *text = tu_read_file(path);
        free(path);
        for (const char *line = text; line && (line = strstr(line, "inotify wd:")); line++) {
            const char *ino = strstr(line, " ino:");
            const char *eol = strchr(line, '\n');
            if (ino && (!eol || ino < eol) &&
                strtoull(ino + 5, NULL, 16) == (unsigned long long)st.st_ino)
                n++;
        }
        free(text);
    }
    closedir(d);
    return n;
}

static struct ct_fixture fx_file = {
    .name = "file",
    .scheme = "file",
    .caps = CT_SHARED,
    .start = file_start,
    .stop = file_stop,
    .url = file_url,
    .unreachable_url = file_unreachable,
    .waiters = file_waiters,
};

/* ----------------------------------------------------------------- redis */

#ifdef DLOCK_HAVE_REDIS
struct redis_priv {
    struct fx_redis srv;
    const char *query; /* the layout's own option */
    bool tls;          /* the rediss:// URL (TLS port), the plain one for raw looks */
};

static bool redis_start(struct ct_fixture *f)
{
    struct redis_priv *p = f->priv;
    if (!(p->tls ? fx_redis_start_tls(&p->srv, NULL) : fx_redis_start(&p->srv, NULL))) {
        snprintf(f->error, sizeof f->error, "redis-server did not start (log on stderr)");
        return false;
    }
    return true;
}

static void redis_stop(struct ct_fixture *f)
{
    struct redis_priv *p = f->priv;
    fx_redis_stop(&p->srv);
}

static char *redis_url(const struct ct_fixture *f, const char *query)
{
    const struct redis_priv *p = f->priv;
    char *base = with_query(p->tls ? p->srv.tls_url : p->srv.url, p->query);
    char *url = with_query(base, query);
    free(base);
    return url;
}

static char *redis_unreachable(const struct ct_fixture *f, int port)
{
    const struct redis_priv *p = f->priv;
    return tu_fmt("%s://127.0.0.1:%d?connect_timeout=500ms", p->tls ? "rediss" : "redis", port);
}

/* Subscribers of the lock's channels: the layouts publish releases on
 * Redisson's "redisson_lock__channel:{<key>}", where writers wait, and
 * readers wait on RReadWriteLock's "redisson_rwlock:{<key>}"; a waiter
 * subscribes before it sleeps. Plus the fair layout's queued waiters. */
static long waiters_on(const struct fx_redis *srv, const char *prefix, const char *name)
{
    char *fullname = tu_fmt("%s%s", prefix ? prefix : "", name);
    redisContext *ctx = srv ? fx_redis_raw(srv, NULL) : NULL;
    if (!ctx) {
        free(fullname);
        return -1;
    }
    bool tagged = strchr(fullname, '{') != NULL;
    char *chan = tu_fmt("redisson_lock__channel:%s%s%s", tagged ? "" : "{", fullname, tagged ? "" : "}");
    char *rwchan = tu_fmt("redisson_rwlock:%s%s%s", tagged ? "" : "{", fullname, tagged ? "" : "}");
    redisReply *r = redisCommand(ctx, "PUBSUB NUMSUB %s %s", chan, rwchan);
    long n = -1;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 4 &&
        r->element[1]->type == REDIS_REPLY_INTEGER && r->element[3]->type == REDIS_REPLY_INTEGER)
        n = (long)(r->element[1]->integer + r->element[3]->integer);
    if (r)
        freeReplyObject(r);
    /* layout=fair: its waiters are queued (and listen on their client's
     * own channel) */
    r = redisCommand(ctx, "ZCARD dlock_fair_queue:%s%s%s", tagged ? "" : "{", fullname,
                     tagged ? "" : "}");
    if (n >= 0 && r && r->type == REDIS_REPLY_INTEGER)
        n += (long)r->integer;
    if (r)
        freeReplyObject(r);
    free(rwchan);
    free(chan);
    free(fullname);
    redisFree(ctx);
    return n;
}

static long redis_waiters(const struct ct_fixture *f, dlock_client *c, const char *prefix,
                          const char *name)
{
    (void)c;
    const struct redis_priv *p = f->priv;
    return waiters_on(&p->srv, prefix, name);
}

/* Redis: CLIENT PAUSE WRITE, not SIGSTOP. A stopped redis-server still
 * gets what was sent meanwhile (the kernel keeps it) and serves it once
 * continued, even for a client that has since hung up; a client that
 * hangs up while paused is dropped with its command unserved. */
static void redis_pause_srv(const struct fx_redis *srv, bool stop)
{
    redisContext *ctx = fx_redis_raw(srv, NULL);
    ck_assert_msg(ctx, "no raw connection to redis-server :%d", srv->port);
    redisReply *r = stop ? redisCommand(ctx, "CLIENT PAUSE 600000 WRITE")
                         : redisCommand(ctx, "CLIENT UNPAUSE");
    ck_assert_msg(r && r->type == REDIS_REPLY_STATUS, "CLIENT %s: %s", stop ? "PAUSE" : "UNPAUSE",
                  r && r->str ? r->str : ctx->errstr);
    freeReplyObject(r);
    redisFree(ctx);
}

static void redis_pause(const struct ct_fixture *f, bool stop)
{
    const struct redis_priv *p = f->priv;
    redis_pause_srv(&p->srv, stop);
}

static struct redis_priv redisson_priv, simple_priv = {.query = "layout=simple"},
                         tls_priv = {.tls = true}, fair_priv = {.query = "layout=fair"};

static struct ct_fixture fx_redis = {
    .name = "redis",
    .scheme = "redis",
    .caps = CT_SERVER | CT_WAITERS_EXACT | CT_LEASES | CT_FORCE_LIVE | CT_FIXED_LEASE | CT_SHARED |
            CT_FAIR,
    .priv = &redisson_priv,
    .start = redis_start,
    .stop = redis_stop,
    .url = redis_url,
    .unreachable_url = redis_unreachable,
    .waiters = redis_waiters,
    .pause = redis_pause,
};

static struct ct_fixture fx_redis_simple = {
    .name = "redis-simple",
    .scheme = "redis",
    .caps = CT_SERVER | CT_WAITERS_EXACT | CT_LEASES | CT_FORCE_LIVE | CT_FIXED_LEASE,
    .priv = &simple_priv,
    .start = redis_start,
    .stop = redis_stop,
    .url = redis_url,
    .unreachable_url = redis_unreachable,
    .waiters = redis_waiters,
    .pause = redis_pause,
};

/* The fair layout (waiters queued in arrival order, direct hand-off). */
static struct ct_fixture fx_redis_fair = {
    .name = "redis-fair",
    .scheme = "redis",
    .caps = CT_SERVER | CT_WAITERS_EXACT | CT_LEASES | CT_FORCE_LIVE | CT_FIXED_LEASE | CT_FAIR,
    .priv = &fair_priv,
    .start = redis_start,
    .stop = redis_stop,
    .url = redis_url,
    .unreachable_url = redis_unreachable,
    .waiters = redis_waiters,
    .pause = redis_pause,
};

/* The whole contract through Sentinel (1 master, 1 replica, 1 sentinel:
 * the URL form; failovers are check_redis's). */
static struct fx_sentinels sentinel_topology;

static bool sentinel_start(struct ct_fixture *f)
{
    if (!fx_sentinels_start(&sentinel_topology, 1, 1)) {
        snprintf(f->error, sizeof f->error, "the Sentinel topology did not start (logs on stderr)");
        return false;
    }
    return true;
}

static void sentinel_stop(struct ct_fixture *f)
{
    (void)f;
    fx_sentinels_stop(&sentinel_topology);
}

static char *sentinel_url(const struct ct_fixture *f, const char *query)
{
    (void)f;
    return with_query(sentinel_topology.url, query);
}

static char *sentinel_unreachable(const struct ct_fixture *f, int port)
{
    (void)f;
    return tu_fmt("redis+sentinel://127.0.0.1:%d/%s?connect_timeout=500ms", port,
                  FX_SENTINEL_MASTER);
}

static long sentinel_waiters(const struct ct_fixture *f, dlock_client *c, const char *prefix,
                             const char *name)
{
    (void)f;
    (void)c;
    int port = fx_sentinels_master_port(&sentinel_topology);
    return waiters_on(fx_sentinels_server(&sentinel_topology, port), prefix, name);
}

/* The master, as redis_pause_srv() does it. */
static void sentinel_pause(const struct ct_fixture *f, bool stop)
{
    (void)f;
    int port = fx_sentinels_master_port(&sentinel_topology);
    redis_pause_srv(fx_sentinels_server(&sentinel_topology, port), stop);
}

static struct ct_fixture fx_redis_sentinel = {
    .name = "redis-sentinel",
    .scheme = "redis+sentinel",
    .caps = CT_SERVER | CT_WAITERS_EXACT | CT_LEASES | CT_FORCE_LIVE | CT_FIXED_LEASE | CT_SHARED |
            CT_FAIR,
    .start = sentinel_start,
    .stop = sentinel_stop,
    .url = sentinel_url,
    .unreachable_url = sentinel_unreachable,
    .waiters = sentinel_waiters,
    .pause = sentinel_pause,
};

/* The whole contract over TLS (rediss://, the fixture's own CA). */
static struct ct_fixture fx_rediss = {
    .name = "rediss",
    .scheme = "rediss",
    .caps = CT_SERVER | CT_WAITERS_EXACT | CT_LEASES | CT_FORCE_LIVE | CT_FIXED_LEASE | CT_SHARED |
            CT_FAIR,
    .priv = &tls_priv,
    .start = redis_start,
    .stop = redis_stop,
    .url = redis_url,
    .unreachable_url = redis_unreachable,
    .waiters = redis_waiters,
    .pause = redis_pause,
};
#endif

/* --------------------------------------------------------------- redlock */

#ifdef DLOCK_HAVE_REDIS
/* Three independent redis-servers, one redlock:// URL over them. */
#define REDLOCK_NODES 3
static struct fx_redis redlock_nodes[REDLOCK_NODES];

static bool redlock_start(struct ct_fixture *f)
{
    for (int i = 0; i < REDLOCK_NODES; i++)
        if (!fx_redis_start(&redlock_nodes[i], NULL)) {
            snprintf(f->error, sizeof f->error, "redis-server %d of %d did not start (log on "
                     "stderr)", i + 1, REDLOCK_NODES);
            return false;
        }
    return true;
}

static void redlock_stop(struct ct_fixture *f)
{
    (void)f;
    for (int i = 0; i < REDLOCK_NODES; i++)
        fx_redis_stop(&redlock_nodes[i]);
}

static char *redlock_url(const struct ct_fixture *f, const char *query)
{
    (void)f;
    char *base = tu_fmt("redlock://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", redlock_nodes[0].port,
                        redlock_nodes[1].port, redlock_nodes[2].port);
    char *url = with_query(base, query);
    free(base);
    return url;
}

static char *redlock_unreachable(const struct ct_fixture *f, int port)
{
    (void)f;
    return tu_fmt("redlock://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d?connect_timeout=500ms", port,
                  port, port);
}

/* A waiter listens on every node: the fewest subscribers any node sees. */
static long redlock_waiters(const struct ct_fixture *f, dlock_client *c, const char *prefix,
                            const char *name)
{
    (void)f;
    (void)c;
    long least = -1;
    for (int i = 0; i < REDLOCK_NODES; i++) {
        long n = waiters_on(&redlock_nodes[i], prefix, name);
        if (n < 0)
            return -1;
        if (least < 0 || n < least)
            least = n;
    }
    return least;
}

static void redlock_pause(const struct ct_fixture *f, bool stop)
{
    (void)f;
    for (int i = 0; i < REDLOCK_NODES; i++)
        redis_pause_srv(&redlock_nodes[i], stop);
}

static struct ct_fixture fx_redlock = {
    .name = "redlock",
    .scheme = "redlock",
    .caps = CT_SERVER | CT_WAITERS_EXACT | CT_LEASES | CT_FORCE_LIVE | CT_FIXED_LEASE,
    .start = redlock_start,
    .stop = redlock_stop,
    .url = redlock_url,
    .unreachable_url = redlock_unreachable,
    .waiters = redlock_waiters,
    .pause = redlock_pause,
};
#endif

/* ------------------------------------------------------------------ etcd */

#ifdef DLOCK_HAVE_ETCD
static struct etcdf etcd_servers;

static bool etcd_start(struct ct_fixture *f)
{
    if (etcdf_start(&etcd_servers, 1))
        return true;
    snprintf(f->error, sizeof f->error, "%s", etcd_servers.error);
    return false;
}

static void etcd_stop(struct ct_fixture *f)
{
    (void)f;
    etcdf_stop(&etcd_servers);
}

static char *etcd_url(const struct ct_fixture *f, const char *query)
{
    (void)f;
    return etcdf_url(&etcd_servers, NULL, query && *query ? query : NULL);
}

static char *etcd_unreachable(const struct ct_fixture *f, int port)
{
    (void)f;
    return tu_fmt("etcd://127.0.0.1:%d?connect_timeout=1s", port);
}

static long etcd_waiters(const struct ct_fixture *f, dlock_client *c, const char *prefix,
                         const char *name)
{
    (void)f, (void)prefix;
    return inspect_waiters(c, name);
}

static void etcd_pause(const struct ct_fixture *f, bool stop)
{
    (void)f;
    for (int i = 0; i < etcd_servers.n; i++)
        pause_pid(etcd_servers.m[i].pid, stop);
}

static struct ct_fixture fx_etcd = {
    .name = "etcd",
    .scheme = "etcd",
    .caps = CT_SERVER | CT_WAITERS_EXACT | CT_LEASES | CT_FORCE_LIVE | CT_FIXED_LEASE | CT_FAIR |
            CT_SHARED,
    .start = etcd_start,
    .stop = etcd_stop,
    .url = etcd_url,
    .unreachable_url = etcd_unreachable,
    .waiters = etcd_waiters,
    .pause = etcd_pause,
};
#endif

/* -------------------------------------------------------------------- zk */

#ifdef DLOCK_HAVE_ZK
static struct zkf zk_servers;

static bool zk_start(struct ct_fixture *f)
{
    if (zkf_start(&zk_servers, 1))
        return true;
    snprintf(f->error, sizeof f->error, "%s", zk_servers.error);
    return false;
}

static void zk_stop(struct ct_fixture *f)
{
    (void)f;
    zkf_stop(&zk_servers);
}

static char *zk_url(const struct ct_fixture *f, const char *query)
{
    (void)f;
    return zkf_url(&zk_servers, NULL, query && *query ? query : NULL);
}

static char *zk_unreachable(const struct ct_fixture *f, int port)
{
    (void)f;
    return tu_fmt("zk://127.0.0.1:%d?connect_timeout=700ms", port);
}

static long zk_waiters(const struct ct_fixture *f, dlock_client *c, const char *prefix,
                         const char *name)
{
    (void)f, (void)prefix;
    return inspect_waiters(c, name);
}

static void zk_pause(const struct ct_fixture *f, bool stop)
{
    (void)f;
    for (int i = 0; i < zk_servers.n; i++)
        pause_pid(zk_servers.s[i].pid, stop);
}

/* A node lives as long as its session: no fixed lease (DLOCK_ENOTSUP). */
static struct ct_fixture fx_zk = {
    .name = "zk",
    .scheme = "zk",
    .caps = CT_SERVER | CT_WAITERS_EXACT | CT_LEASES | CT_FORCE_LIVE | CT_FAIR | CT_SHARED,
    .start = zk_start,
    .stop = zk_stop,
    .url = zk_url,
    .unreachable_url = zk_unreachable,
    .waiters = zk_waiters,
    .pause = zk_pause,
};
#endif

struct ct_fixture *const ct_fixtures[] = {
    &fx_file,
#ifdef DLOCK_HAVE_REDIS
    &fx_redis,
    &fx_redis_simple,
    &fx_redis_fair,
    &fx_rediss,
    &fx_redis_sentinel,
    &fx_redlock,
#endif
#ifdef DLOCK_HAVE_ETCD
    &fx_etcd,
#endif
#ifdef DLOCK_HAVE_ZK
    &fx_zk,
#endif
    NULL,
};

/* ------------------------------------------- suites run over the fixtures */

struct ct_fixture *CT;
char ct_prefix[64];
static const char *prefix_tag = "t";

static void fixture_begin(size_t i)
{
    CT = ct_fixtures[i];
    CT->started = CT->start(CT);
    if (!CT->started)
        fprintf(stderr, "%s fixture did not start: %s\n", CT->name, CT->error);
}

static void fixture_end(size_t i)
{
    if (ct_fixtures[i]->started)
        ct_fixtures[i]->stop(ct_fixtures[i]);
    ct_fixtures[i]->started = false;
}

/* Check's fixtures take no argument: one pair of hooks per fixture. */
#define FIXTURE_HOOKS(i)                                                                     \
    static void begin_##i(void)                                                              \
    {                                                                                        \
        fixture_begin(i);                                                                    \
    }                                                                                        \
    static void end_##i(void)                                                                \
    {                                                                                        \
        fixture_end(i);                                                                      \
    }
FIXTURE_HOOKS(0)
FIXTURE_HOOKS(1)
FIXTURE_HOOKS(2)
FIXTURE_HOOKS(3)
FIXTURE_HOOKS(4)
FIXTURE_HOOKS(5)
FIXTURE_HOOKS(6)
FIXTURE_HOOKS(7)
FIXTURE_HOOKS(8)
static void (*const begins[])(void) = {begin_0, begin_1, begin_2, begin_3, begin_4,
                                       begin_5, begin_6, begin_7, begin_8};
static void (*const ends[])(void) = {end_0, end_1, end_2, end_3, end_4,
                                     end_5, end_6, end_7, end_8};

/* Checked setup, in the test's own process. */
static void test_begin(void)
{
    ck_assert_msg(CT && CT->started, "the %s backend did not start: %s", CT ? CT->name : "?",
                  CT ? CT->error : "");
    static int serial;
    snprintf(ct_prefix, sizeof ct_prefix, "%s%d-%d-", prefix_tag, (int)getpid(), serial++);
}

/* Add to S the test case of fixture ct_fixtures[I]: named after it,
 * holding TESTS[0..N) that DLOCK_TEST lets through (tu_add_tests), with
 * the fixture's server started once around the case and a fresh prefix
 * around each test. */
static void add_fixture_case(Suite *s, size_t i, const struct tu_test *tests, size_t n)
{
    if (i >= TU_COUNT(begins)) {
        fprintf(stderr, "contract.c: more fixtures than FIXTURE_HOOKS\n");
        exit(2);
    }
    TCase *tc = tu_add_tests(s, ct_fixtures[i]->name, tests, n);
    if (tc) {
        tcase_add_unchecked_fixture(tc, begins[i], ends[i]);
        tcase_add_checked_fixture(tc, test_begin, NULL);
    }
}

int ct_main(const char *suite, const char *tag,
            bool (*runs)(const struct ct_fixture *f, const char *test))
{
    prefix_tag = tag;
    size_t n;
    struct tu_test *all = tu_registered(NULL, &n);
    struct tu_test *mine = calloc(n ? n : 1, sizeof *mine);
    if (!mine)
        abort();
    Suite *s = suite_create(suite);
    for (size_t i = 0; ct_fixtures[i]; i++) {
        size_t k = 0;
        for (size_t j = 0; j < n; j++)
            if (!runs || runs(ct_fixtures[i], all[j].name))
                mine[k++] = all[j];
        add_fixture_case(s, i, mine, k);
    }
    free(mine);
    free(all);
    return tu_run_suite(s);
}

char *ct_test_url(const char *extra)
{
    char *q = tu_fmt("prefix=%s%s%s", ct_prefix, extra ? "&" : "", extra ? extra : "");
    char *url = CT->url(CT, q);
    free(q);
    return url;
}

struct dlock_client *ct_open_test(const char *extra)
{
    char *url = ct_test_url(extra);
    dlock_client *c = tu_open(url);
    free(url);
    return c;
}

void ct_holder_held(const char *dir, uint64_t token, bool kill_only)
{
    char *held = tu_fmt("%s/held", dir), *go = tu_fmt("%s/go", dir);
    char *text = tu_fmt("%" PRIu64 "\n", token);
    tu_write_marker(held, text);
    if (kill_only)
        for (;;)
            pause();
    while (!tu_wait_file(go, 1000))
        ;
    free(text);
    free(go);
    free(held);
}

void ct_holder_done(const char *dir, int rc, int rc2, int fired, int zero)
{
    char *done = tu_fmt("%s/done", dir), *result = tu_fmt("%d %d %d %d\n", rc, rc2, fired, zero);
    tu_write_marker(done, result);
    free(result);
    free(done);
}

struct ct_holder ct_holder_open(const char *opts, const char *tag)
{
    return (struct ct_holder){.url = ct_test_url(opts), .dir = tu_tmpdir(tag)};
}

uint64_t ct_holder_wait(const struct ct_holder *h)
{
    char *held = tu_fmt("%s/held", h->dir);
    ck_assert_msg(tu_wait_file(held, 30000), "the holder never held");
    uint64_t token = tu_read_u64(held);
    free(held);
    return token;
}

void ct_holder_close(struct ct_holder *h)
{
    tu_rmrf(h->dir);
    free(h->dir);
    free(h->url);
}

void ct_holder_resume(const struct ct_holder *h, int *rc, int *rc2, int *fired, int *zero)
{
    char *go = tu_fmt("%s/go", h->dir), *done = tu_fmt("%s/done", h->dir);
    tu_write_marker(go, "1");
    kill(h->pid, SIGCONT);
    ck_assert_msg(tu_wait_file(done, 30000), "the resumed holder never released");
    char *text = tu_read_file(done);
    *rc = 1, *rc2 = 1, *fired = -1, *zero = -1;
    ck_assert_int_eq(sscanf(text, "%d %d %d %d", rc, rc2, fired, zero), 4);
    free(text);
    free(done);
    free(go);
}
