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
    char *cert = NULL, *key = NULL;
    if (r->tls_port) {
        cert = tu_fmt("%s/server.crt", r->dir);
        key = tu_fmt("%s/server.key", r->dir);
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

bool fx_redis_start_tls(struct fx_redis *r, const char *const *extra)
{
    memset(r, 0, sizeof *r);
    r->dir = tu_tmpdir("redis");
    if (!make_certs(r->dir))
        return false;
    r->ca = tu_fmt("%s/ca.crt", r->dir);
    r->other_ca = tu_fmt("%s/other-ca.crt", r->dir);
    r->client_cert = tu_fmt("%s/client.crt", r->dir);
    r->client_key = tu_fmt("%s/client.key", r->dir);
    r->tls_port = tu_free_port();
    snprintf(r->tls_url, sizeof r->tls_url, "rediss://127.0.0.1:%d?tls_ca=%s", r->tls_port, r->ca);
    return fx_redis_start(r, extra);
}

bool fx_redis_start(struct fx_redis *r, const char *const *extra)
{
    if (!r->tls_port)
        memset(r, 0, sizeof *r);
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
    r->dir = r->log = r->sock = r->ca = r->other_ca = r->client_cert = r->client_key = NULL;
    r->tls_port = 0;
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
