/* bench_redlock.c -- the baseline of `dlock bench` on redlock:// URLs:
 * dlock itself on the first node alone (redis://h1).
 *
 * What a Redlock acquire+release costs is best read beside the same
 * library taking the same lock on one of its nodes, in the same run: the
 * ratio is what the quorum adds (N requests in parallel, the slowest of a
 * majority to wait for), with the client, scripts and server held equal.
 * PING on that node is the round trip.
 *
 * Whether that ratio is the machine's or dlock's is read against a raw
 * floor in the same rounds: the same work without dlock -- hiredis
 * sending SET NX PX to every node at once and waiting for the replies in
 * one poll, then the compare-and-delete script by EVALSHA the same way --
 * on all N nodes (floor 0) and on the first alone (floor 1). Floor 0 /
 * floor 1 is what the fan-out costs on this machine with no library in
 * the way; dlock's own ratio is to be read beside it. Floor 2 is floor 0
 * answering once a majority replied (the late node's reply read before
 * its next one): what answering at the majority could save. Plain TCP
 * only.
 */
#ifdef DLOCK_HAVE_REDIS

#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "bench.h"
#include "dlock.h"
#include "redis_info.h"

#define FLOOR_NODES 16

static const char CAD_SCRIPT[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) "
    "else return 0 end";

struct one_node {
    dlock_client *c;
    redisContext *ctx;              /* for PING */
    redisContext *raw[FLOOR_NODES]; /* the floors' connections, one per node */
    size_t late[FLOOR_NODES];       /* replies a connection owes from earlier requests */
    size_t nraw;
    char sha[41], value[64];
    struct dlock_bench_handles handles;
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

static void node_disconnect(void *conn);

/* The floors' connections to every node of URL (redlock://[user:pass@]
 * h1[:p1],h2...): AUTH when the URL has a password, the compare-and-
 * delete script loaded. 0, or -1 with ERR. */
static int floor_connect(struct one_node *b, const char *url, char *err, size_t errlen)
{
    const char *rest = strstr(url, "://") + 3;
    if (strncmp(url, "redlocks", 8) == 0) {
        snprintf(err, errlen, "the raw floor speaks plain TCP: use redlock://");
        return -1;
    }
    char user[256] = "", pass[256] = "";
    const char *at = strchr(rest, '@'), *hosts = at ? at + 1 : rest;
    if (at) {
        const char *colon = memchr(rest, ':', (size_t)(at - rest));
        if (colon) {
            snprintf(user, sizeof user, "%.*s", (int)(colon - rest), rest);
            snprintf(pass, sizeof pass, "%.*s", (int)(at - colon - 1), colon + 1);
        } else {
            snprintf(pass, sizeof pass, "%.*s", (int)(at - rest), rest);
        }
        dlock_bench_pct_decode(user);
        dlock_bench_pct_decode(pass);
    }
    snprintf(b->value, sizeof b->value, "floor-%ld-%p", (long)getpid(), (void *)b);
    size_t end = strcspn(hosts, "/?");
    for (const char *h = hosts; h < hosts + end && b->nraw < FLOOR_NODES;) {
        size_t hl = strcspn(h, ",/?");
        const char *colon = memchr(h, ':', hl);
        char host[256];
        snprintf(host, sizeof host, "%.*s", (int)(colon ? (size_t)(colon - h) : hl), h);
        redisContext *ctx =
            dlock_bench_redis_dial(host, colon ? atoi(colon + 1) : 6379, err, errlen);
        if (!ctx)
            return -1;
        b->raw[b->nraw++] = ctx;
        redisReply *r = NULL;
        if (pass[0]) {
            r = user[0] ? redisCommand(ctx, "AUTH %s %s", user, pass)
                        : redisCommand(ctx, "AUTH %s", pass);
            if (!r || r->type == REDIS_REPLY_ERROR)
                goto refused;
            freeReplyObject(r);
        }
        r = redisCommand(ctx, "SCRIPT LOAD %s", CAD_SCRIPT);
        if (!r || r->type != REDIS_REPLY_STRING)
            goto refused;
        snprintf(b->sha, sizeof b->sha, "%s", r->str);
        freeReplyObject(r);
        h += hl + (h[hl] == ',');
        continue;
refused:
        snprintf(err, errlen, "%s: %s", host, r ? r->str : ctx->errstr);
        if (r)
            freeReplyObject(r);
        return -1;
    }
    return 0;
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
    b->ctx = dlock_bench_redis_dial(host, port, err, errlen);
    if (!b->ctx) {
        dlock_client_close(b->c);
        free(b);
        return NULL;
    }
    if (floor_connect(b, url, err, errlen)) {
        node_disconnect(b);
        return NULL;
    }
    return b;
}

/* Read the replies the floor connections still owe (floor 2's late
 * node), 5 s at most each, before they close: what a closed connection
 * sent was otherwise still in flight (or dropped) when the next run's
 * connections, with values of their own, set the same names, and its
 * SET NX then found a name taken on that node ("raw lock/unlock
 * failed"). */
static void floor_drain(struct one_node *b)
{
    for (size_t i = 0; i < b->nraw; i++) {
        while (b->late[i] > 0) {
            void *r = NULL;
            if (redisGetReplyFromReader(b->raw[i], &r) != REDIS_OK)
                break;
            if (r) {
                freeReplyObject(r);
                b->late[i]--;
                continue;
            }
            struct pollfd p = {.fd = b->raw[i]->fd, .events = POLLIN};
            if (poll(&p, 1, 5000) <= 0 || redisBufferRead(b->raw[i]) != REDIS_OK)
                break;
        }
    }
}

static void node_disconnect(void *conn)
{
    struct one_node *b = conn;
    floor_drain(b);
    dlock_bench_handles_free(&b->handles);
    for (size_t i = 0; i < b->nraw; i++)
        redisFree(b->raw[i]);
    redisFree(b->ctx);
    dlock_client_close(b->c);
    free(b);
}

static int node_lock_unlock(void *conn, const char *name)
{
    struct one_node *b = conn;
    return dlock_bench_handles_lock_unlock(&b->handles, b->c, name, "");
}

static int node_round_trip(void *conn)
{
    struct one_node *b = conn;
    return dlock_bench_redis_ping(b->ctx);
}

/* The command appended to each of the N first floor connections sent at
 * once, the replies read in one poll loop into OUT[0..N) until NEED of
 * them came (a reply owed from an earlier request is read and dropped
 * first); the others stay NULL and owe it. 0 or -1. */
static int floor_exchange(struct one_node *b, size_t n, size_t need, redisReply **out)
{
    struct pollfd p[FLOOR_NODES];
    for (size_t i = 0; i < n; i++) {
        out[i] = NULL;
        for (int done = 0; !done;)
            if (redisBufferWrite(b->raw[i], &done) != REDIS_OK)
                return -1;
        p[i] = (struct pollfd){.fd = b->raw[i]->fd, .events = POLLIN};
    }
    for (size_t got = 0; got < need;) {
        if (poll(p, (nfds_t)n, 5000) <= 0)
            return -1;
        for (size_t i = 0; i < n; i++) {
            if (p[i].fd < 0 || !p[i].revents)
                continue;
            if (redisBufferRead(b->raw[i]) != REDIS_OK)
                return -1;
            for (void *r = NULL; p[i].fd >= 0; r = NULL) {
                if (redisGetReplyFromReader(b->raw[i], &r) != REDIS_OK)
                    return -1;
                if (!r)
                    break;
                if (b->late[i] > 0) {
                    b->late[i]--;
                    freeReplyObject(r);
                    continue;
                }
                out[i] = r;
                p[i].fd = -1;
                got++;
            }
        }
    }
    for (size_t i = 0; i < n; i++)
        b->late[i] += !out[i];
    return 0;
}

static void replies_free(redisReply **r, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (r[i])
            freeReplyObject(r[i]);
}

/* Floor 0: SET NX PX on every node at once, then the compare-and-delete
 * on every node at once; floor 1: the same on the first node alone;
 * floor 2: floor 0 answering at a majority. Busy (1) unless the nodes
 * waited for all granted (what was granted is given back). */
static int floor_lock_unlock(void *conn, int floor, const char *name)
{
    struct one_node *b = conn;
    size_t n = floor == 1 ? 1 : b->nraw, need = floor == 2 ? n / 2 + 1 : n;
    redisReply *r[FLOOR_NODES];
    for (size_t i = 0; i < n; i++)
        redisAppendCommand(b->raw[i], "SET %s %s NX PX 30000", name, b->value);
    if (floor_exchange(b, n, need, r)) {
        replies_free(r, n);
        return -1;
    }
    size_t granted = 0;
    for (size_t i = 0; i < n; i++)
        granted += r[i] && r[i]->type == REDIS_REPLY_STATUS;
    replies_free(r, n);
    for (size_t i = 0; i < n; i++)
        redisAppendCommand(b->raw[i], "EVALSHA %s 1 %s %s", b->sha, name, b->value);
    int rc = floor_exchange(b, n, need, r);
    for (size_t i = 0; !rc && i < n; i++)
        if (r[i] && r[i]->type != REDIS_REPLY_INTEGER)
            rc = -1;
    replies_free(r, n);
    return rc ? rc : granted >= need ? 0 : 1;
}

/* Lock scripts every node has run so far, summed. */
static long long node_server_calls(void *conn)
{
    struct one_node *b = conn;
    long long total = 0;
    for (size_t i = 0; i < b->nraw; i++) {
        long long one = redis_info_script_calls(b->raw[i]);
        if (one < 0)
            return -1;
        total += one;
    }
    return total;
}

const struct dlock_bench_baseline dlock_bench_redlock_baseline = {
    .scheme = "redlock",
    .what = "dlock on the first node alone (redis://h1): acquire(TRY) + release; PING",
    .connect = node_connect,
    .disconnect = node_disconnect,
    .lock_unlock = node_lock_unlock,
    .round_trip = node_round_trip,
    .server_calls = node_server_calls,
    .nfloors = 3,
    .floor_what = {"hiredis: SET NX PX on every node at once (one poll), then EVALSHA "
                   "compare-and-delete the same way",
                   "the same on the first node alone",
                   "floor 0 answering once a majority replied (a late reply read at the next)"},
    .floor_lock_unlock = floor_lock_unlock,
};

#endif /* DLOCK_HAVE_REDIS */
