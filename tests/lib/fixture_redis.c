/* fixture_redis.c -- see fixture_redis.h. Built only with hiredis (it is
 * linked into every test binary, and needs hiredis to talk to the server). */
#include "fixture_redis.h"

#ifdef DLOCK_HAVE_REDIS

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "testutil.h"

static void dump_log(const struct fx_redis *r)
{
    char *text = r->log ? tu_read_file(r->log) : NULL;
    fprintf(stderr, "redis-server on port %d did not start; its log:\n%s\n", r->port,
            text ? text : "(none)");
    free(text);
}

static bool spawn(struct fx_redis *r)
{
    const char *argv[26 + FX_REDIS_MAX_ARGS];
    char port[16], tls_port[16];
    snprintf(port, sizeof port, "%d", r->port);
    snprintf(tls_port, sizeof tls_port, "%d", r->tls_port);
    size_t n = 0;
    argv[n++] = "redis-server";
    argv[n++] = "--port";
    argv[n++] = port;
    argv[n++] = "--bind";
    argv[n++] = tu_listen_addr();
    argv[n++] = "--protected-mode";
    argv[n++] = "no";
    argv[n++] = "--save";
    argv[n++] = "";
    argv[n++] = "--appendonly";
    argv[n++] = "no";
    argv[n++] = "--dir";
    argv[n++] = r->dir;
    /* a replica's sync starts at once, not after 5 s (Redis 7's default
     * waits for more replicas to share one transfer) */
    argv[n++] = "--repl-diskless-sync-delay";
    argv[n++] = "0";
    char *cert = NULL, *key = NULL;
    if (r->tls_port) {
        cert = tu_fmt("%s/server.crt", r->certs);
        key = tu_fmt("%s/server.key", r->certs);
        const char *tls[] = {"--tls-port", tls_port, "--tls-cert-file", cert, "--tls-key-file", key,
                             "--tls-ca-cert-file", r->ca, "--tls-auth-clients", "optional"};
        for (size_t i = 0; i < sizeof tls / sizeof *tls; i++)
            argv[n++] = tls[i];
    }
    for (size_t i = 0; i < FX_REDIS_MAX_ARGS && r->extra[i]; i++)
        argv[n++] = r->extra[i];
    argv[n] = NULL;
    /* the unix socket rides along as two more arguments */
    const char *full[30 + FX_REDIS_MAX_ARGS];
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        full[m++] = argv[i];
    full[m++] = "--unixsocket";
    full[m++] = r->sock;
    full[m] = NULL;
    r->pid = tu_spawn(full, r->log);
    free(cert);
    free(key);
    if (!tu_wait_port(r->port, 10000) || (r->tls_port && !tu_wait_port(r->tls_port, 10000))) {
        dump_log(r);
        return false;
    }
    /* Listening is not serving: wait for any reply to PING (LOADING,
     * NOAUTH and PONG all mean it is up). */
    for (int i = 0; i < 200; i++) {
        redisContext *ctx = redisConnect("127.0.0.1", r->port);
        if (ctx && !ctx->err) {
            redisReply *rep = redisCommand(ctx, "PING");
            bool up = rep && (rep->type != REDIS_REPLY_ERROR || strncmp(rep->str, "LOADING", 7) != 0);
            if (rep)
                freeReplyObject(rep);
            redisFree(ctx);
            if (up)
                return true;
        } else if (ctx) {
            redisFree(ctx);
        }
        tu_sleep_ms(50);
    }
    dump_log(r);
    return false;
}

/* Make DIR's certificates with openssl(1): ca.crt (+ key), server.crt
 * for localhost and 127.0.0.1, client.crt, and other-ca.crt. EC keys:
 * quick to make. */
static bool make_certs(const char *dir)
{
    char *cmd = tu_fmt(
        "set -e; cd '%s'; K='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes';"
        "openssl req -x509 $K -keyout ca.key -out ca.crt -days 2 -subj '/CN=dlock test CA';"
        "openssl req -x509 $K -keyout other-ca.key -out other-ca.crt -days 2 -subj '/CN=other CA';"
        "openssl req $K -keyout server.key -out server.csr -subj '/CN=localhost';"
        "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > san.cnf;"
        "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial"
        " -out server.crt -days 2 -extfile san.cnf;"
        "openssl req $K -keyout client.key -out client.csr -subj '/CN=dlock client';"
        "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial"
        " -out client.crt -days 2",
        dir);
    char *quiet = tu_fmt("(%s) >'%s/openssl.log' 2>&1", cmd, dir);
    bool ok = system(quiet) == 0;
    if (!ok) {
        char *log = tu_fmt("%s/openssl.log", dir), *text = tu_read_file(log);
        fprintf(stderr, "openssl could not make the test certificates:\n%s\n", text ? text : "");
        free(text);
        free(log);
    }
    free(cmd);
    free(quiet);
    return ok;
}

static bool start(struct fx_redis *r, const char *const *extra);

bool fx_redis_start_tls(struct fx_redis *r, const char *const *extra)
{
    memset(r, 0, sizeof *r);
    r->dir = tu_tmpdir("redis");
    if (!make_certs(r->dir))
        return false;
    return fx_redis_start_tls_with(r, r->dir, extra);
}

bool fx_redis_start_tls_with(struct fx_redis *r, const char *certs, const char *const *extra)
{
    if (!r->dir) {
        memset(r, 0, sizeof *r);
        r->dir = tu_tmpdir("redis");
    }
    r->certs = strdup(certs);
    r->ca = tu_fmt("%s/ca.crt", certs);
    r->other_ca = tu_fmt("%s/other-ca.crt", certs);
    r->client_cert = tu_fmt("%s/client.crt", certs);
    r->client_key = tu_fmt("%s/client.key", certs);
    r->tls_port = tu_free_port();
    snprintf(r->tls_url, sizeof r->tls_url, "rediss://127.0.0.1:%d?tls_ca=%s", r->tls_port, r->ca);
    return start(r, extra);
}

bool fx_redis_start(struct fx_redis *r, const char *const *extra)
{
    /* R may be a stack variable with anything in it (start_replica's):
     * nothing of it is read */
    memset(r, 0, sizeof *r);
    return start(r, extra);
}

/* fx_redis_start() of R, whose TLS fields (and dir) may be set already. */
static bool start(struct fx_redis *r, const char *const *extra)
{
    for (size_t i = 0; extra && extra[i] && i < FX_REDIS_MAX_ARGS - 1; i++)
        r->extra[i] = extra[i];
    if (!r->dir)
        r->dir = tu_tmpdir("redis");
    r->log = tu_fmt("%s/redis.log", r->dir);
    r->sock = tu_fmt("%s/redis.sock", r->dir);
    r->port = tu_free_port();
    snprintf(r->url, sizeof r->url, "redis://127.0.0.1:%d", r->port);
    return spawn(r);
}

void fx_redis_kill(struct fx_redis *r)
{
    if (r->pid > 0) {
        kill(r->pid, SIGKILL);
        waitpid(r->pid, NULL, 0);
    }
    r->pid = 0;
}

bool fx_redis_restart(struct fx_redis *r)
{
    fx_redis_kill(r);
    return spawn(r);
}

void fx_redis_stop(struct fx_redis *r)
{
    if (r->pid > 0)
        tu_stop(r->pid, 2000);
    r->pid = 0;
    if (r->dir)
        tu_rmrf(r->dir);
    free(r->dir);
    free(r->log);
    free(r->sock);
    free(r->ca);
    free(r->other_ca);
    free(r->client_cert);
    free(r->client_key);
    free(r->certs);
    r->dir = r->log = r->sock = r->ca = r->other_ca = r->client_cert = r->client_key = NULL;
    r->certs = NULL;
    r->tls_port = 0;
}

/* ------------------------------------------------------------ Sentinel */

/* A raw command to 127.0.0.1:PORT (a sentinel or a server), after AUTH
 * PASSWORD when not NULL; NULL when it does not answer. */
static redisReply *raw_vat(int port, const char *password, int timeout_s, const char *fmt,
                           va_list ap)
{
    struct timeval tv = {timeout_s, 0};
    redisContext *ctx = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (!ctx || ctx->err) {
        if (ctx)
            redisFree(ctx);
        return NULL;
    }
    redisSetTimeout(ctx, tv);
    if (password) {
        redisReply *a = redisCommand(ctx, "AUTH %s", password);
        if (a)
            freeReplyObject(a);
    }
    redisReply *r = redisvCommand(ctx, fmt, ap);
    redisFree(ctx);
    return r;
}

redisReply *fx_redis_raw_at(int port, const char *password, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = raw_vat(port, password, 1, fmt, ap);
    va_end(ap);
    return r;
}

/* The master's port sentinel PORT names, 0 when none. */
static int sentinel_says(int port, const char *password)
{
    redisReply *r =
        fx_redis_raw_at(port, password, "SENTINEL get-master-addr-by-name %s", FX_SENTINEL_MASTER);
    int master = 0;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2)
        master = atoi(r->element[1]->str);
    if (r)
        freeReplyObject(r);
    return master;
}

/* Whether the server on PORT says ROLE master. */
static bool role_is_master(int port)
{
    redisReply *r = fx_redis_raw_at(port, NULL, "ROLE");
    bool yes = r && r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
               strcmp(r->element[0]->str, "master") == 0;
    if (r)
        freeReplyObject(r);
    return yes;
}

/* A field of SENTINEL master NAME on sentinel PORT, as a number (-1). */
static long sentinel_field(int port, const char *password, const char *field)
{
    redisReply *r = fx_redis_raw_at(port, password, "SENTINEL master %s", FX_SENTINEL_MASTER);
    long v = -1;
    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i + 1 < r->elements; i += 2)
        if (strcmp(r->element[i]->str, field) == 0)
            v = atol(r->element[i + 1]->str);
    if (r)
        freeReplyObject(r);
    return v;
}

/* Wait until the master on MASTER_PORT counts N replicas online. */
static bool replicas_online(int master_port, size_t n)
{
    char want[32];
    snprintf(want, sizeof want, "connected_slaves:%zu", n);
    for (int i = 0; i < 400; i++) {
        redisReply *r = fx_redis_raw_at(master_port, NULL, "INFO replication");
        bool ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, want);
        for (size_t k = 0; ok && k < n; k++) {
            char slave[32];
            snprintf(slave, sizeof slave, "slave%zu:", k);
            const char *p = strstr(r->str, slave);
            ok = p && strstr(p, "state=online") && (!strchr(p, '\n') || strstr(p, "state=online") < strchr(p, '\n'));
        }
        if (r)
            freeReplyObject(r);
        if (ok)
            return true;
        tu_sleep_ms(50);
    }
    return false;
}

bool fx_sentinels_start(struct fx_sentinels *t, size_t nreplicas, size_t nsentinels)
{
    return fx_sentinels_start_via(t, nreplicas, nsentinels, NULL, NULL);
}

bool fx_sentinels_start_via(struct fx_sentinels *t, size_t nreplicas, size_t nsentinels,
                            int (*via)(int master_port, size_t i, void *arg), void *arg)
{
    const char *password = t->sentinel_password; /* the fields set before */
    bool tls = t->tls;
    memset(t, 0, sizeof *t);
    t->sentinel_password = password;
    t->tls = tls;
    t->dir = tu_tmpdir("sentinel");
    if (nreplicas > FX_SENTINEL_MAX || nsentinels > FX_SENTINEL_MAX || (tls && !make_certs(t->dir)) ||
        !(tls ? fx_redis_start_tls_with(&t->master, t->dir, NULL) : fx_redis_start(&t->master, NULL)))
        return false;
    int master_port = tls ? t->master.tls_port : t->master.port; /* what replicas and sentinels use */
    for (t->nreplicas = 0; t->nreplicas < nreplicas; t->nreplicas++) {
        char port[16];
        snprintf(port, sizeof port, "%d", via ? via(master_port, t->nreplicas, arg) : master_port);
        const char *extra[] = {"--replicaof", "127.0.0.1", port, tls ? "--tls-replication" : NULL,
                               "yes", NULL};
        struct fx_redis *rep = &t->replicas[t->nreplicas];
        if (!(tls ? fx_redis_start_tls_with(rep, t->dir, extra) : fx_redis_start(rep, extra)))
            return false;
    }
    if (!replicas_online(t->master.port, nreplicas)) {
        fprintf(stderr, "fx_sentinels: the replicas never came online\n");
        return false;
    }
    size_t ul = (size_t)snprintf(t->url, sizeof t->url, "%s://", tls ? "rediss+sentinel" : "redis+sentinel");
    for (t->nsentinels = 0; t->nsentinels < nsentinels; t->nsentinels++) {
        size_t i = t->nsentinels;
        t->sentinel_port[i] = tu_free_port();
        t->sentinel_tls_port[i] = tls ? tu_free_port() : 0;
        char *conf = tu_fmt("%s/sentinel%zu.conf", t->dir, i);
        char *log = tu_fmt("%s/sentinel%zu.log", t->dir, i);
        char *tls_conf = tls ? tu_fmt("tls-port %d\ntls-cert-file %s/server.crt\n"
                                      "tls-key-file %s/server.key\ntls-ca-cert-file %s/ca.crt\n"
                                      "tls-auth-clients optional\ntls-replication yes\n",
                                      t->sentinel_tls_port[i], t->dir, t->dir, t->dir)
                             : strdup("");
        char *text = tu_fmt("port %d\nbind 127.0.0.1\ndir %s\n%s"
                            "sentinel monitor %s 127.0.0.1 %d 2\n"
                            "sentinel down-after-milliseconds %s 1000\n"
                            "sentinel failover-timeout %s 4000\n"
                            "sentinel parallel-syncs %s 5\n%s%s\n",
                            t->sentinel_port[i], t->dir, tls_conf, FX_SENTINEL_MASTER, master_port,
                            FX_SENTINEL_MASTER, FX_SENTINEL_MASTER, FX_SENTINEL_MASTER,
                            password ? "requirepass " : "", password ? password : "");
        free(tls_conf);
        FILE *f = fopen(conf, "w");
        if (f) {
            fputs(text, f);
            fclose(f);
        }
        const char *argv[] = {"redis-server", conf, "--sentinel", NULL};
        t->sentinel_pid[i] = tu_spawn(argv, log);
        bool up = f && tu_wait_port(t->sentinel_port[i], 10000) &&
                  (!tls || tu_wait_port(t->sentinel_tls_port[i], 10000));
        free(conf);
        free(log);
        free(text);
        if (!up)
            return false;
        ul += (size_t)snprintf(t->url + ul, sizeof t->url - ul, "%s127.0.0.1:%d", i ? "," : "",
                               tls ? t->sentinel_tls_port[i] : t->sentinel_port[i]);
    }
    if (tls)
        snprintf(t->url + ul, sizeof t->url - ul, "/%s?tls_ca=%s/ca.crt", FX_SENTINEL_MASTER, t->dir);
    else
        snprintf(t->url + ul, sizeof t->url - ul, "/%s", FX_SENTINEL_MASTER);
    /* every sentinel sees the replicas and the other sentinels (hello
     * messages every 2 s, INFO every 10 s at most) */
    for (int i = 0; i < 600; i++) {
        bool all = true;
        for (size_t k = 0; k < t->nsentinels && all; k++)
            all = sentinel_field(t->sentinel_port[k], t->sentinel_password, "num-slaves") ==
                      (long)nreplicas &&
                  sentinel_field(t->sentinel_port[k], t->sentinel_password,
                                 "num-other-sentinels") == (long)nsentinels - 1;
        if (all)
            return true;
        tu_sleep_ms(50);
    }
    fprintf(stderr, "fx_sentinels: the sentinels never saw each other and the replicas\n");
    return false;
}

int fx_sentinels_master_port(const struct fx_sentinels *t)
{
    return t->nsentinels ? sentinel_says(t->sentinel_port[0], t->sentinel_password) : 0;
}

struct fx_redis *fx_sentinels_server(struct fx_sentinels *t, int port)
{
    if (t->master.port == port || (t->master.tls_port && t->master.tls_port == port))
        return &t->master;
    for (size_t i = 0; i < t->nreplicas; i++)
        if (t->replicas[i].port == port || (t->replicas[i].tls_port && t->replicas[i].tls_port == port))
            return &t->replicas[i];
    return NULL;
}

/* The plain port of T's server on PORT (the sentinels name TLS ports
 * when T->tls; the fixture looks through the plain ones). */
static int plain_port(struct fx_sentinels *t, int port)
{
    struct fx_redis *r = fx_sentinels_server(t, port);
    return r ? r->port : port;
}

int fx_sentinels_failover(struct fx_sentinels *t)
{
    int old = fx_sentinels_master_port(t);
    redisReply *r = fx_redis_raw_at(t->sentinel_port[0], t->sentinel_password,
                                    "SENTINEL FAILOVER %s", FX_SENTINEL_MASTER);
    bool started = r && r->type != REDIS_REPLY_ERROR;
    if (r && !started)
        fprintf(stderr, "SENTINEL FAILOVER: %s\n", r->str);
    if (r)
        freeReplyObject(r);
    for (int i = 0; started && i < 600; i++) {
        int now = 0;
        bool agree = true;
        for (size_t k = 0; k < t->nsentinels && agree; k++) {
            int says = sentinel_says(t->sentinel_port[k], t->sentinel_password);
            agree = says != 0 && says != old && (now == 0 || says == now);
            now = says;
        }
        /* and the old master is demoted (it refuses writes from then on) */
        if (agree && role_is_master(plain_port(t, now)) && !role_is_master(plain_port(t, old)))
            return now;
        tu_sleep_ms(50);
    }
    return 0;
}

void fx_sentinels_stop(struct fx_sentinels *t)
{
    for (size_t i = 0; i < t->nsentinels; i++)
        if (t->sentinel_pid[i] > 0)
            tu_stop(t->sentinel_pid[i], 2000);
    for (size_t i = 0; i < t->nreplicas; i++)
        fx_redis_stop(&t->replicas[i]);
    fx_redis_stop(&t->master);
    if (t->dir)
        tu_rmrf(t->dir);
    free(t->dir);
    memset(t, 0, sizeof *t);
}

redisContext *fx_redis_raw(const struct fx_redis *r, const char *password)
{
    redisContext *ctx = redisConnect("127.0.0.1", r->port);
    if (!ctx || ctx->err) {
        if (ctx)
            redisFree(ctx);
        return NULL;
    }
    if (password) {
        redisReply *rep = redisCommand(ctx, "AUTH %s", password);
        bool ok = rep && rep->type != REDIS_REPLY_ERROR;
        if (rep)
            freeReplyObject(rep);
        if (!ok) {
            redisFree(ctx);
            return NULL;
        }
    }
    return ctx;
}

long long fx_redis_lock_subscribers(int port, const char *name, bool sharded)
{
    redisReply *r = fx_redis_raw_at(port, NULL, "PUBSUB %s redisson_lock__channel:{%s}",
                                    sharded ? "SHARDNUMSUB" : "NUMSUB", name);
    long long n = -1;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_INTEGER)
        n = r->element[1]->integer;
    if (r)
        freeReplyObject(r);
    return n;
}

long long fx_redis_wait_lock_subscribers(int port, const char *name, bool sharded,
                                         long long want)
{
    long long n = fx_redis_lock_subscribers(port, name, sharded);
    for (int i = 0; i < 800 && n != want; i++) {
        tu_sleep_ms(25);
        n = fx_redis_lock_subscribers(port, name, sharded);
    }
    return n;
}

/* ------------------------------------------------------------- Cluster */

redisReply *fx_cluster_raw(int port, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = raw_vat(port, NULL, 2, fmt, ap);
    va_end(ap);
    return r;
}

struct fx_redis *fx_cluster_server(struct fx_cluster *t, int port)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->node[i].port == port)
            return &t->node[i];
    return NULL;
}

/* The master port serving SLOT per CLUSTER SLOTS of the node on PORT
 * (0: none or no answer). */
static int master_per(int port, unsigned slot)
{
    redisReply *r = fx_cluster_raw(port, "CLUSTER SLOTS");
    int master = 0;
    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        const redisReply *e = r->element[i];
        if (e->elements >= 3 && (unsigned)e->element[0]->integer <= slot &&
            slot <= (unsigned)e->element[1]->integer)
            master = (int)e->element[2]->element[1]->integer;
    }
    if (r)
        freeReplyObject(r);
    return master;
}

bool fx_cluster_wait_ok(struct fx_cluster *t)
{
    for (int round = 0; round < 600; round++) {
        bool ok = true;
        for (size_t i = 0; i < t->n && ok; i++) {
            if (t->node[i].pid <= 0)
                continue;
            redisReply *r = fx_cluster_raw(t->node[i].port, "CLUSTER INFO");
            ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");
            if (r)
                freeReplyObject(r);
        }
        /* every node names the same live master for a slot of each range */
        for (unsigned slot = 0; ok && slot < 16384; slot += 1024) {
            int want = 0;
            for (size_t i = 0; i < t->n && ok; i++) {
                if (t->node[i].pid <= 0)
                    continue;
                int m = master_per(t->node[i].port, slot);
                struct fx_redis *mr = fx_cluster_server(t, m);
                ok = m != 0 && (want == 0 || m == want) && mr && mr->pid > 0;
                want = m;
            }
            redisReply *role = ok ? fx_cluster_raw(want, "ROLE") : NULL;
            ok = role && role->type == REDIS_REPLY_ARRAY &&
                 strcmp(role->element[0]->str, "master") == 0;
            if (role)
                freeReplyObject(role);
        }
        if (ok)
            return true;
        tu_sleep_ms(50);
    }
    fprintf(stderr, "fx_cluster: the cluster never became ok\n");
    return false;
}

bool fx_cluster_start(struct fx_cluster *t, size_t nmasters, size_t replicas)
{
    bool tls = t->tls;
    memset(t, 0, sizeof *t);
    t->tls = tls;
    size_t n = nmasters * (1 + replicas);
    if (nmasters < 3 || n > FX_CLUSTER_MAX)
        return false;
    if (tls && (!(t->certs = tu_tmpdir("redis-cluster-certs")) || !make_certs(t->certs)))
        return false;
    char *ca = tls ? tu_fmt("%s/ca.crt", t->certs) : NULL;
    const char *argv[11 + FX_CLUSTER_MAX];
    size_t a = 0;
    argv[a++] = "redis-cli";
    if (tls) {
        argv[a++] = "--tls";
        argv[a++] = "--cacert";
        argv[a++] = ca;
    }
    argv[a++] = "--cluster";
    argv[a++] = "create";
    char *addr[FX_CLUSTER_MAX];
    size_t ul = (size_t)snprintf(t->url, sizeof t->url, tls ? "rediss+cluster://" : "redis+cluster://");
    for (t->n = 0; t->n < n; t->n++) {
        const char *extra[] = {"--cluster-enabled", "yes", "--cluster-node-timeout", "1000",
                               "--cluster-config-file", "nodes.conf", "--cluster-port",
                               t->bus_port[t->n], tls ? "--tls-cluster" : NULL, "yes",
                               "--tls-replication", "yes", NULL};
        memcpy(t->extra[t->n], extra, sizeof extra);
        struct fx_redis *r = &t->node[t->n];
        /* The data and bus ports are each free when chosen, not when the
         * node binds them (another test's client may take one, or the
         * two choices meet): a node that cannot bind gets new ones. */
        bool started = false;
        for (int attempt = 0; attempt < 3 && !started; attempt++) {
            if (attempt)
                fx_redis_stop(r);
            snprintf(t->bus_port[t->n], sizeof t->bus_port[t->n], "%d", tu_free_port());
            started = tls ? fx_redis_start_tls_with(r, t->certs, t->extra[t->n])
                          : fx_redis_start(r, t->extra[t->n]);
        }
        if (!started) {
            free(ca);
            return false;
        }
        addr[t->n] = tu_fmt("127.0.0.1:%d", tls ? r->tls_port : r->port);
        argv[a++] = addr[t->n];
        ul += (size_t)snprintf(t->url + ul, sizeof t->url - ul, "%s%s", t->n ? "," : "",
                               addr[t->n]);
    }
    if (tls)
        snprintf(t->url + ul, sizeof t->url - ul, "?tls_ca=%s", ca);
    char reps[16];
    snprintf(reps, sizeof reps, "%zu", replicas);
    argv[a++] = "--cluster-replicas";
    argv[a++] = reps;
    argv[a++] = "--cluster-yes";
    argv[a] = NULL;
    char *out = NULL, *err = NULL;
    int rc = tu_run(argv, NULL, &out, &err);
    if (rc != 0)
        fprintf(stderr, "redis-cli --cluster create: exit %d\n%s\n%s\n", rc, out ? out : "",
                err ? err : "");
    free(ca);
    for (size_t i = 0; i < n; i++)
        free(addr[i]);
    free(out);
    free(err);
    if (rc != 0 || !fx_cluster_wait_ok(t))
        return false;
    /* redis-cli may pair replicas with masters in any order: put the
     * masters first */
    for (size_t i = 0; i < n; i++) {
        redisReply *role = fx_cluster_raw(t->node[i].port, "ROLE");
        bool master = role && role->type == REDIS_REPLY_ARRAY &&
                      strcmp(role->element[0]->str, "master") == 0;
        if (role)
            freeReplyObject(role);
        for (size_t j = 0; master && j < i; j++) {
            redisReply *rj = fx_cluster_raw(t->node[j].port, "ROLE");
            bool jm = rj && strcmp(rj->element[0]->str, "master") == 0;
            if (rj)
                freeReplyObject(rj);
            if (!jm) {
                struct fx_redis tmp = t->node[j];
                t->node[j] = t->node[i];
                t->node[i] = tmp;
                break;
            }
        }
    }
    /* every replica caught up with its master's (empty) data set */
    for (size_t i = nmasters; i < n; i++) {
        for (int round = 0;; round++) {
            redisReply *r = fx_cluster_raw(t->node[i].port, "INFO replication");
            bool up = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "master_link_status:up");
            if (r)
                freeReplyObject(r);
            if (up)
                break;
            if (round == 600)
                return false;
            tu_sleep_ms(50);
        }
    }
    return true;
}

unsigned fx_cluster_keyslot(struct fx_cluster *t, const char *key)
{
    redisReply *r = fx_cluster_raw(t->node[0].port, "CLUSTER KEYSLOT %s", key);
    unsigned slot = r && r->type == REDIS_REPLY_INTEGER ? (unsigned)r->integer : 0;
    if (r)
        freeReplyObject(r);
    return slot;
}

int fx_cluster_master_of(struct fx_cluster *t, unsigned slot)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->node[i].pid > 0) {
            int m = master_per(t->node[i].port, slot);
            if (m)
                return m;
        }
    return 0;
}

int fx_cluster_replica_of(struct fx_cluster *t, int port)
{
    for (size_t i = 0; i < t->n; i++) {
        if (t->node[i].pid <= 0 || t->node[i].port == port)
            continue;
        redisReply *r = fx_cluster_raw(t->node[i].port, "ROLE");
        bool yes = r && r->type == REDIS_REPLY_ARRAY && r->elements >= 3 &&
                   strcmp(r->element[0]->str, "slave") == 0 && r->element[2]->integer == port;
        if (r)
            freeReplyObject(r);
        if (yes)
            return t->node[i].port;
    }
    return 0;
}

bool fx_cluster_failover(struct fx_cluster *t, int replica)
{
    redisReply *r = fx_cluster_raw(replica, "CLUSTER FAILOVER");
    bool started = r && r->type == REDIS_REPLY_STATUS;
    if (r && !started)
        fprintf(stderr, "CLUSTER FAILOVER: %s\n", r->str);
    if (r)
        freeReplyObject(r);
    for (int round = 0; started && round < 600; round++) {
        redisReply *role = fx_cluster_raw(replica, "ROLE");
        bool master = role && role->type == REDIS_REPLY_ARRAY &&
                      strcmp(role->element[0]->str, "master") == 0;
        if (role)
            freeReplyObject(role);
        if (master)
            return fx_cluster_wait_ok(t);
        tu_sleep_ms(50);
    }
    return false;
}

void fx_cluster_stop(struct fx_cluster *t)
{
    for (size_t i = 0; i < t->n; i++)
        fx_redis_stop(&t->node[i]);
    if (t->certs)
        tu_rmrf(t->certs);
    free(t->certs);
    bool tls = t->tls;
    memset(t, 0, sizeof *t);
    t->tls = tls; /* for a start again */
}

#endif /* DLOCK_HAVE_REDIS */
