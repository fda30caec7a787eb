/* bench_redlock.c -- the baseline of `dlock bench` on redlock:// URLs:
 * dlock itself on the first node alone (redis://h1).
 *
 * What a Redlock acquire+release costs is best read beside the same
 * library taking the same lock on one of its nodes, in the same run: the
 * ratio is what the quorum adds (N requests in parallel, the slowest of a
 * majority to wait for), with the client, scripts and server held equal.
 * PING on that node is the round trip.
 */
#ifdef DLOCK_HAVE_REDIS

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "bench.h"
#include "dlock.h"

#define HANDLES 4096 /* names a connection keeps a handle for (open addressing) */

struct one_node {
    dlock_client *c;
    redisContext *ctx; /* for PING */
    char *names[HANDLES];
    dlock_lock *locks[HANDLES];
};

/* redlock[s]://[userinfo@]h1[:p1],h2...[?query] -> redis[s]://[userinfo@]h1[:p1][?query
 * without node_timeout]; *HOST and *PORT of h1 for the raw PING. */
static char *first_node_url(const char *url, char *host, size_t hostlen, int *port)
{
    const char *rest = strstr(url, "://");
    if (!rest)
        return NULL;
    bool tls = rest - url == 8; /* "redlocks" */
    rest += 3;
    const char *at = strchr(rest, '@'), *hosts = at ? at + 1 : rest;
    size_t hl = strcspn(hosts, ",/?");
    const char *query = strchr(hosts, '?');
    char *out = malloc(strlen(url) + 16);
    if (!out)
        return NULL;
    int n = sprintf(out, "%s://%.*s%.*s", tls ? "rediss" : "redis", (int)(at ? at + 1 - rest : 0),
                    rest, (int)hl, hosts);
    for (const char *q = query; q && *q;) { /* keep every option but node_timeout */
        q++;
        size_t len = strcspn(q, "&");
        if (len && strncmp(q, "node_timeout=", 13) != 0)
            n += sprintf(out + n, "%c%.*s", strchr(out, '?') ? '&' : '?', (int)len, q);
        q += len;
    }
    const char *colon = memchr(hosts, ':', hl);
    size_t name_len = colon ? (size_t)(colon - hosts) : hl;
    snprintf(host, hostlen, "%.*s", (int)name_len, hosts);
    *port = colon ? atoi(colon + 1) : 6379;
    return out;
}

static void *node_connect(const char *url, char *err, size_t errlen)
{
    char host[256];
    int port;
    char *single = first_node_url(url, host, sizeof host, &port);
    struct one_node *b = calloc(1, sizeof *b);
    if (!single || !b) {
        snprintf(err, errlen, "cannot make the first node's URL of %s", url);
        free(single);
        free(b);
        return NULL;
    }
    int rc = dlock_open(single, &b->c);
    if (rc) {
        snprintf(err, errlen, "%s: %s", single, dlock_errmsg());
        free(single);
        free(b);
        return NULL;
    }
    free(single);
    b->ctx = redisConnect(host, port);
    if (!b->ctx || b->ctx->err) {
        snprintf(err, errlen, "%s:%d: %s", host, port, b->ctx ? b->ctx->errstr : "out of memory");
        redisFree(b->ctx);
        dlock_client_close(b->c);
        free(b);
        return NULL;
    }
    return b;
}

static void node_disconnect(void *conn)
{
    struct one_node *b = conn;
    for (size_t i = 0; i < HANDLES; i++) {
        dlock_lock_free(b->locks[i]);
        free(b->names[i]);
    }
    redisFree(b->ctx);
    dlock_client_close(b->c);
    free(b);
}

/* The handle of NAME, made on first use (as the dlock side keeps one per
 * name); NULL when the table is full. */
static dlock_lock *handle_of(struct one_node *b, const char *name)
{
    unsigned h = 2166136261u;
    for (const char *p = name; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    for (size_t i = 0; i < HANDLES; i++) {
        size_t k = (h + i) % HANDLES;
        if (b->names[k] && strcmp(b->names[k], name) == 0)
            return b->locks[k];
        if (!b->names[k]) {
            if (dlock_lock_new(b->c, name, DLOCK_EXCLUSIVE, 0, &b->locks[k]))
                return NULL;
            b->names[k] = strdup(name);
            return b->locks[k];
        }
    }
    return NULL;
}

static int node_lock_unlock(void *conn, const char *name)
{
    dlock_lock *l = handle_of(conn, name);
    if (!l)
        return -1;
    int rc = dlock_acquire(l, DLOCK_TRY);
    if (rc == DLOCK_EBUSY)
        return 1;
    if (rc)
        return -1;
    return dlock_release(l) ? -1 : 0;
}

static int node_round_trip(void *conn)
{
    struct one_node *b = conn;
    redisReply *r = redisCommand(b->ctx, "PING");
    int rc = r && r->type == REDIS_REPLY_STATUS ? 0 : -1;
    if (r)
        freeReplyObject(r);
    return rc;
}

static long long node_server_calls(void *conn)
{
    (void)conn;
    return -1;
}

const struct dlock_bench_baseline dlock_bench_redlock_baseline = {
    "redlock",         "dlock on the first node alone (redis://h1): acquire(TRY) + release; PING",
    node_connect,      node_disconnect,
    node_lock_unlock,  node_round_trip,
    node_server_calls,
};

#endif /* DLOCK_HAVE_REDIS */
