/* fixture_redis.c -- see fixture_redis.h. Built only with hiredis (it is
 * linked into every test binary, and needs hiredis to talk to the server). */
#include "fixture_redis.h"

#ifdef DLOCK_HAVE_REDIS

#include <signal.h>
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
    const char *argv[12 + FX_REDIS_MAX_ARGS];
    char port[16];
    snprintf(port, sizeof port, "%d", r->port);
    size_t n = 0;
    argv[n++] = "redis-server";
    argv[n++] = "--port";
    argv[n++] = port;
    argv[n++] = "--bind";
    argv[n++] = "127.0.0.1";
    argv[n++] = "--save";
    argv[n++] = "";
    argv[n++] = "--appendonly";
    argv[n++] = "no";
    argv[n++] = "--dir";
    argv[n++] = r->dir;
    for (size_t i = 0; i < FX_REDIS_MAX_ARGS && r->extra[i]; i++)
        argv[n++] = r->extra[i];
    argv[n] = NULL;
    /* the unix socket rides along as two more arguments */
    const char *full[16 + FX_REDIS_MAX_ARGS];
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        full[m++] = argv[i];
    full[m++] = "--unixsocket";
    full[m++] = r->sock;
    full[m] = NULL;
    r->pid = tu_spawn(full, r->log);
    if (!tu_wait_port(r->port, 10000)) {
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

bool fx_redis_start(struct fx_redis *r, const char *const *extra)
{
    memset(r, 0, sizeof *r);
    for (size_t i = 0; extra && extra[i] && i < FX_REDIS_MAX_ARGS - 1; i++)
        r->extra[i] = extra[i];
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
    r->dir = r->log = r->sock = NULL;
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

#endif /* DLOCK_HAVE_REDIS */
