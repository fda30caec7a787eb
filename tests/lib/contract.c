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
#include "fixture_pg.h"
#include "fixture_mysql.h"
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

/* Watches on the inode of INFO's lock file in this process's inotify
 * instances (/proc/self/fdinfo lines "inotify wd:.. ino:<hex> ..."). */
static long inotify_watches(const dlock_info *info)
{
    struct stat st;
    if (stat(dlock_info_key(info), &st) < 0)
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

/* Waiters on NAME as the backend reports them to dlock_inspect() through
 * C (-1 unknown); the file backend reports none, so for it the inotify
 * watches on its lock file. */
static long inspect_waiters(const struct ct_fixture *f, dlock_client *c, const char *prefix,
                            const char *name)
{
    (void)prefix;
    dlock_info *info = NULL;
    if (dlock_inspect(c, name, &info) != DLOCK_OK)
        return -1;
    long n = f->caps & CT_SERVER ? dlock_info_waiter_count(info) : inotify_watches(info);
    dlock_info_free(info);
    return n;
}

static struct ct_fixture fx_file = {
    .name = "file",
    .scheme = "file",
    .caps = CT_SHARED | CT_LOCK_DELAY | CT_NO_GUARDED,
    .start = file_start,
    .stop = file_stop,
    .url = file_url,
    .unreachable_url = file_unreachable,
    .waiters = inspect_waiters,
};

/* ----------------------------------------------------------------- redis */

#ifdef DLOCK_HAVE_REDIS
/* Every Redis form: one redis-server in either layout (plain or TLS),
 * Sentinel (1 master, 1 replica, 1 sentinel: the URL form; failovers are
 * check_redis_sentinel's), plain or over TLS (rediss+sentinel://: the sentinels,
 * the master and the replica all on TLS, one CA), Redlock (three
 * independent redis-servers, one redlock:// URL over them), or Cluster,
 * plain or over TLS (below). */
struct redis_priv {
    struct fx_redis srv;
    const char *query; /* the layout's own option */
    bool tls;          /* the rediss:// URL (TLS port), the plain one for raw looks */
};
static struct fx_sentinels sentinel_topology, tls_sentinel_topology = {.tls = true};
#define REDLOCK_NODES 3
static struct fx_redis redlock_nodes[REDLOCK_NODES];
/* Redis Cluster: three masters, no replicas (failovers are check_cluster's),
 * plain or over TLS (rediss+cluster://: clients, cluster bus and all) */
#define CLUSTER_MASTERS 3
static struct fx_cluster cluster_nodes, tls_cluster_nodes = {.tls = true};

/* OK; when not, F's error says that WHAT did not start. */
static bool started(struct ct_fixture *f, bool ok, const char *what)
{
    if (!ok)
        snprintf(f->error, sizeof f->error, "%s did not start (logs on stderr)", what);
    return ok;
}

static bool redis_start(struct ct_fixture *f)
{
    struct redis_priv *p = f->priv;
    return started(f, p->tls ? fx_redis_start_tls(&p->srv, NULL) : fx_redis_start(&p->srv, NULL),
                   "redis-server");
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
    return tu_fmt("%s://127.0.0.1:%d?connect_timeout=500ms", f->scheme, port);
}

static bool sentinel_start(struct ct_fixture *f)
{
    return started(f, fx_sentinels_start(f->priv, 1, 1), "the Sentinel topology");
}

static void sentinel_stop(struct ct_fixture *f)
{
    struct fx_sentinels *t = f->priv;
    bool tls = t->tls;
    fx_sentinels_stop(t);
    t->tls = tls; /* for a start again */
}

static char *sentinel_url(const struct ct_fixture *f, const char *query)
{
    const struct fx_sentinels *t = f->priv;
    return with_query(t->url, query);
}

static char *sentinel_unreachable(const struct ct_fixture *f, int port)
{
    return tu_fmt("%s://127.0.0.1:%d/%s?connect_timeout=500ms", f->scheme, port,
                  FX_SENTINEL_MASTER);
}

static bool redlock_start(struct ct_fixture *f)
{
    bool ok = true;
    for (int i = 0; i < REDLOCK_NODES && ok; i++)
        ok = fx_redis_start(&redlock_nodes[i], NULL);
    return started(f, ok, "a Redlock node's redis-server");
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

static bool cluster_start(struct ct_fixture *f)
{
    return started(f, fx_cluster_start(f->priv, CLUSTER_MASTERS, 0), "the cluster");
}

static void cluster_stop(struct ct_fixture *f)
{
    fx_cluster_stop(f->priv);
}

static char *cluster_url(const struct ct_fixture *f, const char *query)
{
    const struct fx_cluster *t = f->priv;
    return with_query(t->url, query);
}

static char *cluster_unreachable(const struct ct_fixture *f, int port)
{
    return tu_fmt("%s://127.0.0.1:%d?connect_timeout=500ms", f->scheme, port);
}

/* Subscribers of the lock's channels: the layouts publish releases on
 * Redisson's "redisson_lock__channel:{<key>}", where writers wait, and
 * readers wait on RReadWriteLock's "redisson_rwlock:{<key>}"; a waiter
 * subscribes before it sleeps. A fair lock's waiters are its queue; they
 * listen on the lock's channel too (one subscription per client), so
 * that channel counts the larger of its subscribers and the queue. */
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
    long n = 0, lock_subs = 0;
    /* classic subscribers, and a cluster's sharded ones (SSUBSCRIBE) */
    for (int sharded = 0; sharded < 2 && n >= 0; sharded++) {
        redisReply *r = redisCommand(ctx, sharded ? "PUBSUB SHARDNUMSUB %s %s" : "PUBSUB NUMSUB %s %s",
                                     chan, rwchan);
        if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 4 &&
            r->element[1]->type == REDIS_REPLY_INTEGER && r->element[3]->type == REDIS_REPLY_INTEGER) {
            lock_subs += (long)r->element[1]->integer;
            n += (long)r->element[3]->integer;
        } else {
            n = -1;
        }
        if (r)
            freeReplyObject(r);
    }
    redisReply *r = redisCommand(ctx, "ZCARD dlock_fair_queue:%s%s%s", tagged ? "" : "{", fullname,
                                 tagged ? "" : "}");
    if (n >= 0 && r && r->type == REDIS_REPLY_INTEGER)
        n += (long)r->integer > lock_subs ? (long)r->integer : lock_subs;
    else if (n >= 0)
        n += lock_subs;
    if (r)
        freeReplyObject(r);
    free(rwchan);
    free(chan);
    free(fullname);
    redisFree(ctx);
    return n;
}

/* The redis-servers of F that a waiter subscribes on and a pause stops,
 * into OUT: its one server, Sentinel's master, every Redlock node, or
 * every cluster master. */
static size_t redis_servers(const struct ct_fixture *f, const struct fx_redis *out[REDLOCK_NODES])
{
    _Static_assert(CLUSTER_MASTERS <= REDLOCK_NODES, "OUT holds the cluster's masters");
    if (strstr(f->scheme, "+cluster")) {
        for (int i = 0; i < CLUSTER_MASTERS; i++)
            out[i] = &((const struct fx_cluster *)f->priv)->node[i];
        return CLUSTER_MASTERS;
    }
    if (strcmp(f->scheme, "redlock") == 0) {
        for (int i = 0; i < REDLOCK_NODES; i++)
            out[i] = &redlock_nodes[i];
        return REDLOCK_NODES;
    }
    if (strstr(f->scheme, "+sentinel"))
        out[0] = fx_sentinels_server(f->priv, fx_sentinels_master_port(f->priv));
    else
        out[0] = &((const struct redis_priv *)f->priv)->srv;
    return 1;
}

/* A Redlock waiter listens on every node: the fewest subscribers any of
 * F's servers sees. A cluster's listens on the master of its slot: the
 * sum over the masters. */
static long redis_waiters(const struct ct_fixture *f, dlock_client *c, const char *prefix,
                          const char *name)
{
    (void)c;
    const struct fx_redis *srv[REDLOCK_NODES];
    bool sum = strstr(f->scheme, "+cluster") != NULL;
    long least = -1, total = 0;
    for (size_t i = 0, n = redis_servers(f, srv); i < n; i++) {
        long k = waiters_on(srv[i], prefix, name);
        if (k < 0)
            return -1;
        if (least < 0 || k < least)
            least = k;
        total += k;
    }
    return sum ? total : least;
}

/* Redis: CLIENT PAUSE WRITE, not SIGSTOP, on each of F's servers. A
 * stopped redis-server still gets what was sent meanwhile (the kernel
 * keeps it) and serves it once continued, even for a client that has
 * since hung up; a client that hangs up while paused is dropped with its
 * command unserved. */
static void redis_pause(const struct ct_fixture *f, bool stop)
{
    const struct fx_redis *srv[REDLOCK_NODES];
    for (size_t i = 0, n = redis_servers(f, srv); i < n; i++) {
        redisContext *ctx = fx_redis_raw(srv[i], NULL);
        ck_assert_msg(ctx, "no raw connection to redis-server :%d", srv[i]->port);
        redisReply *r = stop ? redisCommand(ctx, "CLIENT PAUSE 600000 WRITE")
                             : redisCommand(ctx, "CLIENT UNPAUSE");
        ck_assert_msg(r && r->type == REDIS_REPLY_STATUS, "CLIENT %s: %s",
                      stop ? "PAUSE" : "UNPAUSE", r && r->str ? r->str : ctx->errstr);
        freeReplyObject(r);
        redisFree(ctx);
    }
}

/* A Redis form whose own functions are FORM_start, FORM_stop, FORM_url
 * and FORM_unreachable; waiters and pause are every form's. */
#define REDIS_FIXTURE(form, name_, scheme_, caps_, priv_)                                    \
    {                                                                                        \
        .name = name_, .scheme = scheme_, .caps = caps_, .priv = priv_,                      \
        .start = form##_start, .stop = form##_stop, .url = form##_url,                       \
        .unreachable_url = form##_unreachable, .waiters = redis_waiters,                     \
        .pause = redis_pause,                                                                \
    }
/* What every Redis form does: a server, leases that renew, force. */
#define REDIS_CAPS (CT_SERVER | CT_WAITERS_EXACT | CT_LEASES | CT_FORCE_LIVE | CT_FIXED_LEASE)
/* ... and the forms with a lock-delay: one server's scripts or one slot's
 * (not Redlock: DLOCK_ENOTSUP). */
#define REDIS_DELAY_CAPS (REDIS_CAPS | CT_LOCK_DELAY)

static struct redis_priv redisson_priv, simple_priv = {.query = "layout=simple"},
                         tls_priv = {.tls = true}, fair_priv = {.query = "layout=fair"};
static struct ct_fixture fx_redis =
    REDIS_FIXTURE(redis, "redis", "redis", REDIS_DELAY_CAPS | CT_SHARED | CT_FAIR, &redisson_priv);
static struct ct_fixture fx_redis_simple =
    REDIS_FIXTURE(redis, "redis-simple", "redis", REDIS_DELAY_CAPS, &simple_priv);
/* The fair layout (waiters queued in arrival order, direct hand-off). */
static struct ct_fixture fx_redis_fair =
    REDIS_FIXTURE(redis, "redis-fair", "redis", REDIS_DELAY_CAPS | CT_FAIR, &fair_priv);
static struct ct_fixture fx_rediss =
    REDIS_FIXTURE(redis, "rediss", "rediss", REDIS_DELAY_CAPS | CT_SHARED | CT_FAIR, &tls_priv);
static struct ct_fixture fx_redis_sentinel =
    REDIS_FIXTURE(sentinel, "redis-sentinel", "redis+sentinel", REDIS_DELAY_CAPS | CT_SHARED | CT_FAIR,
                  &sentinel_topology);
static struct ct_fixture fx_rediss_sentinel =
    REDIS_FIXTURE(sentinel, "rediss-sentinel", "rediss+sentinel",
                  REDIS_DELAY_CAPS | CT_SHARED | CT_FAIR, &tls_sentinel_topology);
static struct ct_fixture fx_redlock =
    REDIS_FIXTURE(redlock, "redlock", "redlock", REDIS_CAPS | CT_SHARED | CT_NO_VALUE | CT_NO_GUARDED,
                  NULL);
/* not CT_FAIR: a fair lock's grants go to a per-client channel outside the
 * lock's slot (DLOCK_ENOTSUP on a cluster) */
static struct ct_fixture fx_redis_cluster = REDIS_FIXTURE(
    cluster, "redis-cluster", "redis+cluster", REDIS_DELAY_CAPS | CT_SHARED, &cluster_nodes);
static struct ct_fixture fx_rediss_cluster = REDIS_FIXTURE(
    cluster, "rediss-cluster", "rediss+cluster", REDIS_DELAY_CAPS | CT_SHARED, &tls_cluster_nodes);
#endif

/* ------------------------------------------------------------ etcd, zk */

/* etcd and ZooKeeper have one fixture shape: one server of
 * fixture_etcd.c or fixture_zk.c (TYPE is struct etcdf or struct zkf,
 * with TYPE_start, TYPE_stop and TYPE_url), waiters as dlock_inspect()
 * counts them, a pause that stops every server process (the pids in
 * SERVERS.ARRAY[i].pid), and an unreachable URL that gives up connecting
 * after TIMEOUT. Defines the fixture fx_BE, named and of scheme BE. */
#define SERVER_FIXTURE(be, type, array, timeout, caps_)                                      \
    static struct type be##_servers;                                                         \
    static bool be##_start(struct ct_fixture *f)                                             \
    {                                                                                        \
        if (type##_start(&be##_servers, 1))                                                  \
            return true;                                                                     \
        snprintf(f->error, sizeof f->error, "%s", be##_servers.error);                       \
        return false;                                                                        \
    }                                                                                        \
    static void be##_stop(struct ct_fixture *f)                                              \
    {                                                                                        \
        (void)f;                                                                             \
        type##_stop(&be##_servers);                                                          \
    }                                                                                        \
    static char *be##_url(const struct ct_fixture *f, const char *query)                     \
    {                                                                                        \
        (void)f;                                                                             \
        return type##_url(&be##_servers, NULL, query && *query ? query : NULL);              \
    }                                                                                        \
    static char *be##_unreachable(const struct ct_fixture *f, int port)                      \
    {                                                                                        \
        return tu_fmt("%s://127.0.0.1:%d?connect_timeout=" timeout, f->scheme, port);        \
    }                                                                                        \
    static void be##_pause(const struct ct_fixture *f, bool stop)                            \
    {                                                                                        \
        (void)f;                                                                             \
        for (int i = 0; i < be##_servers.n; i++)                                             \
            pause_pid(be##_servers.array[i].pid, stop);                                      \
    }                                                                                        \
    static struct ct_fixture fx_##be = {                                                     \
        .name = #be,                                                                         \
        .scheme = #be,                                                                       \
        .caps = caps_,                                                                       \
        .start = be##_start,                                                                 \
        .stop = be##_stop,                                                                   \
        .url = be##_url,                                                                     \
        .unreachable_url = be##_unreachable,                                                 \
        .waiters = inspect_waiters,                                                          \
        .pause = be##_pause,                                                                 \
    };

#ifdef DLOCK_HAVE_ETCD
SERVER_FIXTURE(etcd, etcdf, m, "1s",
               CT_SERVER | CT_WAITERS_EXACT | CT_LEASES | CT_FORCE_LIVE | CT_FIXED_LEASE |
                   CT_LOCK_DELAY |
                   CT_FAIR | CT_SHARED | CT_READERS_BOUNDED)
#endif

#ifdef DLOCK_HAVE_ZK
/* A node lives as long as its session: no fixed lease (DLOCK_ENOTSUP). */
SERVER_FIXTURE(zk, zkf, s, "700ms",
               CT_SERVER | CT_WAITERS_EXACT | CT_LEASES | CT_FORCE_LIVE | CT_FAIR | CT_SHARED |
                   CT_LOCK_DELAY |
                   CT_READERS_BOUNDED)
#endif

/* -------------------------------------------------------------- postgres */

#ifdef DLOCK_HAVE_POSTGRES
/* One PostgreSQL server (fixture_pg.c); its pause stops the postmaster
 * and every backend. */
static struct pgf pg_server;
static bool pg_start(struct ct_fixture *f)
{
    if (pgf_start(&pg_server))
        return true;
    snprintf(f->error, sizeof f->error, "%s", pg_server.error);
    return false;
}
static void pg_stop(struct ct_fixture *f)
{
    (void)f;
    pgf_stop(&pg_server);
}
static char *pg_url(const struct ct_fixture *f, const char *query)
{
    (void)f;
    return pgf_url(&pg_server, query);
}
static char *pg_unreachable(const struct ct_fixture *f, int port)
{
    return tu_fmt("%s://127.0.0.1:%d/postgres?connect_timeout=1s", f->scheme, port);
}
static void pg_pause(const struct ct_fixture *f, bool stop)
{
    (void)f;
    pgf_pause(&pg_server, stop);
}
static struct ct_fixture fx_postgres = {
    .name = "postgres",
    .scheme = "postgres",
    .caps = CT_SERVER | CT_WAITERS_EXACT | CT_LEASES | CT_FORCE_LIVE | CT_FIXED_LEASE | CT_SHARED |
            CT_NO_GUARDED,
    .start = pg_start,
    .stop = pg_stop,
    .url = pg_url,
    .unreachable_url = pg_unreachable,
    .waiters = inspect_waiters,
    .pause = pg_pause,
};
#endif

#ifdef DLOCK_HAVE_MYSQL
/* MariaDB: GET_LOCK on a session per hold; no shared mode, no fair one. */
static struct fx_mysql mysql_server;

static bool mysql_start(struct ct_fixture *f)
{
    if (fx_mysql_start(&mysql_server))
        return true;
    snprintf(f->error, sizeof f->error, "%s", mysql_server.error);
    return false;
}

static void mysql_stop(struct ct_fixture *f)
{
    (void)f;
    fx_mysql_stop(&mysql_server);
}

static char *mysql_url(const struct ct_fixture *f, const char *query)
{
    (void)f;
    return with_query(mysql_server.url, query);
}

static char *mysql_unreachable(const struct ct_fixture *f, int port)
{
    return tu_fmt("%s://127.0.0.1:%d/dlock?connect_timeout=1s", f->scheme, port);
}

static void mysql_pause(const struct ct_fixture *f, bool stop)
{
    (void)f;
    pause_pid(mysql_server.pid, stop);
}

static struct ct_fixture fx_mysql = {
    .name = "mysql",
    .scheme = "mysql",
    .caps = CT_SERVER | CT_WAITERS_EXACT | CT_LEASES | CT_FORCE_LIVE | CT_FIXED_LEASE |
            CT_NO_GUARDED,
    .start = mysql_start,
    .stop = mysql_stop,
    .url = mysql_url,
    .unreachable_url = mysql_unreachable,
    .waiters = inspect_waiters,
    .pause = mysql_pause,
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
    &fx_rediss_sentinel,
    &fx_redis_cluster,
    &fx_rediss_cluster,
    &fx_redlock,
#endif
#ifdef DLOCK_HAVE_ETCD
    &fx_etcd,
#endif
#ifdef DLOCK_HAVE_ZK
    &fx_zk,
#endif
#ifdef DLOCK_HAVE_POSTGRES
    &fx_postgres,
#endif
#ifdef DLOCK_HAVE_MYSQL
    &fx_mysql,
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
FIXTURE_HOOKS(9)
FIXTURE_HOOKS(10)
FIXTURE_HOOKS(11)
FIXTURE_HOOKS(12)
FIXTURE_HOOKS(13)
static void (*const begins[])(void) = {begin_0,  begin_1,  begin_2,  begin_3,  begin_4,
                                       begin_5,  begin_6,  begin_7,  begin_8,  begin_9,
                                       begin_10, begin_11, begin_12, begin_13};
static void (*const ends[])(void) = {end_0, end_1, end_2,  end_3,  end_4,  end_5,  end_6,
                                     end_7, end_8, end_9, end_10, end_11, end_12, end_13};

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
        if (tu_fixture_skipped(suite, ct_fixtures[i]->name))
            continue;
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

void ct_holder_kill(const struct ct_holder *h)
{
    kill(h->pid, SIGKILL);
    tu_wait_exit(h->pid);
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
