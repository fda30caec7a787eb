/* bench_redis.c -- the raw Redis baseline of `dlock bench`.
 *
 * The physical floor of a Redis lock with hiredis, which dlock's figures
 * are divided by: SET name value NX PX 30000, then the classic compare-
 * and-delete script by EVALSHA (two round trips per acquire+release, the
 * same count as dlock's acquire and release scripts), and PING for one
 * round trip. It parses just enough of the URL (host, port, db, user,
 * password, unix socket) to dial the same server dlock uses.
 */
#ifdef DLOCK_HAVE_REDIS

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "bench.h"
#include "redis_info.h"

static const char CAD_SCRIPT[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) "
    "else return 0 end";

struct raw_conn {
    redisContext *ctx;
    char sha[41];
    char value[64];
};

static redisReply *check(redisContext *ctx, redisReply *r, char *err, size_t errlen, const char *what)
{
    if (!r) {
        snprintf(err, errlen, "%s: %s", what, ctx->errstr);
        return NULL;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        snprintf(err, errlen, "%s: %s", what, r->str);
        freeReplyObject(r);
        return NULL;
    }
    return r;
}

static void *raw_connect(const char *url, char *err, size_t errlen)
{
    char *u = strdup(url), *user = NULL, *pass = NULL, *host = NULL, *sock = NULL;
    int port = 6379, db = 0;
    char *q = strchr(u, '?');
    if (q)
        *q++ = 0;
    char *rest;
    if (strncmp(u, "redis+unix://", 13) == 0) {
        sock = u + 13;
    } else if (strncmp(u, "redis://", 8) == 0) {
        rest = u + 8;
        char *at = strrchr(rest, '@');
        if (at) {
            *at = 0;
            char *colon = strchr(rest, ':');
            if (colon) {
                *colon = 0;
                pass = colon + 1;
            }
            user = *rest ? rest : NULL;
            rest = at + 1;
        }
        char *slash = strchr(rest, '/');
        if (slash) {
            *slash = 0;
            if (slash[1])
                db = atoi(slash + 1);
        }
        host = rest;
        if (*host == '[') {
            char *end = strchr(host, ']');
            if (end) {
                *end = 0;
                if (end[1] == ':')
                    port = atoi(end + 2);
            }
            host++;
        } else {
            char *colon = strchr(host, ':');
            if (colon) {
                *colon = 0;
                port = atoi(colon + 1);
            }
        }
    } else {
        snprintf(err, errlen, "not a redis URL: %s", url);
        free(u);
        return NULL;
    }
    for (char *p = q, *save = NULL, *kv; p && (kv = strtok_r(p, "&", &save)); p = NULL) {
        if (strncmp(kv, "db=", 3) == 0)
            db = atoi(kv + 3);
        else if (strncmp(kv, "password=", 9) == 0)
            pass = kv + 9;
        else if (strncmp(kv, "user=", 5) == 0)
            user = kv + 5;
    }
    if (user)
        dlock_bench_pct_decode(user);
    if (pass)
        dlock_bench_pct_decode(pass);
    if (!pass && getenv("DLOCK_REDIS_PASSWORD") && *getenv("DLOCK_REDIS_PASSWORD"))
        pass = getenv("DLOCK_REDIS_PASSWORD");
    struct timeval tv = {5, 0};
    redisContext *ctx = sock ? redisConnectUnixWithTimeout(sock, tv) : redisConnectWithTimeout(host, port, tv);
    if (!ctx || ctx->err) {
        snprintf(err, errlen, "connect %s: %s", sock ? sock : host, ctx ? ctx->errstr : "out of memory");
        if (ctx)
            redisFree(ctx);
        free(u);
        return NULL;
    }
    redisReply *r = NULL;
    if (pass) {
        r = user ? redisCommand(ctx, "AUTH %s %s", user, pass) : redisCommand(ctx, "AUTH %s", pass);
        if (!(r = check(ctx, r, err, errlen, "AUTH")))
            goto fail;
        freeReplyObject(r);
    }
    if (db) {
        if (!(r = check(ctx, redisCommand(ctx, "SELECT %d", db), err, errlen, "SELECT")))
            goto fail;
        freeReplyObject(r);
    }
    if (!(r = check(ctx, redisCommand(ctx, "SCRIPT LOAD %s", CAD_SCRIPT), err, errlen, "SCRIPT LOAD")))
        goto fail;
    struct raw_conn *k = calloc(1, sizeof *k);
    k->ctx = ctx;
    snprintf(k->sha, sizeof k->sha, "%s", r->str);
    freeReplyObject(r);
    snprintf(k->value, sizeof k->value, "raw-%ld-%p", (long)getpid(), (void *)k);
    free(u);
    return k;
fail:
    redisFree(ctx);
    free(u);
    return NULL;
}

static void raw_disconnect(void *conn)
{
    struct raw_conn *k = conn;
    if (!k)
        return;
    redisFree(k->ctx);
    free(k);
}

static int raw_lock_unlock(void *conn, const char *name)
{
    struct raw_conn *k = conn;
    redisReply *r = redisCommand(k->ctx, "SET %s %s NX PX 30000", name, k->value);
    if (!r || r->type == REDIS_REPLY_ERROR) {
        if (r)
            freeReplyObject(r);
        return -1;
    }
    int busy = r->type == REDIS_REPLY_NIL;
    freeReplyObject(r);
    if (busy)
        return 1;
    r = redisCommand(k->ctx, "EVALSHA %s 1 %s %s", k->sha, name, k->value);
    int rc = r && r->type == REDIS_REPLY_INTEGER && r->integer == 1 ? 0 : -1;
    if (r)
        freeReplyObject(r);
    return rc;
}

redisContext *dlock_bench_redis_dial(const char *host, int port, char *err, size_t errlen)
{
    redisContext *ctx = redisConnect(host, port);
    if (!ctx || ctx->err) {
        snprintf(err, errlen, "%s:%d: %s", host, port, ctx ? ctx->errstr : "out of memory");
        redisFree(ctx);
        return NULL;
    }
    return ctx;
}

int dlock_bench_redis_ping(struct redisContext *ctx)
{
    redisReply *r = redisCommand(ctx, "PING");
    int rc = r && r->type == REDIS_REPLY_STATUS ? 0 : -1;
    if (r)
        freeReplyObject(r);
    return rc;
}

static int raw_round_trip(void *conn)
{
    struct raw_conn *k = conn;
    return dlock_bench_redis_ping(k->ctx);
}

static long long raw_server_calls(void *conn)
{
    struct raw_conn *k = conn;
    return redis_info_script_calls(k->ctx);
}

/* The same baseline over TCP (redis://) and a unix socket (redis+unix://). */
#define RAW_BASELINE(scheme_)                                                                \
    {                                                                                        \
        .scheme = scheme_,                                                                   \
        .what = "hiredis: SET NX PX 30000 + EVALSHA compare-and-delete; PING",               \
        .connect = raw_connect, .disconnect = raw_disconnect,                                \
        .lock_unlock = raw_lock_unlock, .round_trip = raw_round_trip,                        \
        .server_calls = raw_server_calls,                                                    \
    }
const struct dlock_bench_baseline dlock_bench_redis_baseline = RAW_BASELINE("redis");
const struct dlock_bench_baseline dlock_bench_redis_unix_baseline = RAW_BASELINE("redis+unix");

#endif /* DLOCK_HAVE_REDIS */
