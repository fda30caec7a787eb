/* bench_cluster.c -- the baseline of `dlock bench` on redis+cluster://
 * URLs: dlock on the same cluster with every name on one master.
 *
 * What spreading locks over the masters buys is best read beside the
 * same library, scripts and servers with the whole load on one master,
 * in the same run: the baseline appends a hash tag to each name ("{t}",
 * chosen so that its slot is served by the master of slot 0), so every
 * lock lands there. The ratio of the two is the scaling with the number
 * of masters (on a machine with fewer cores than masters, expect none).
 * PING on that master is the round trip. The baseline's threads share
 * one client, as the dlock side's do.
 */
#ifdef DLOCK_HAVE_REDIS

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "bench.h"
#include "dlock.h"

/* The client every baseline thread shares, and the tag of the master. */
static pthread_mutex_t shared_mu = PTHREAD_MUTEX_INITIALIZER;
static dlock_client *shared_client;
static int shared_users;
static char shared_tag[16];

struct one_master {
    redisContext *ctx; /* PING to the master */
    struct dlock_bench_handles handles;
};

/* The first host:port of a redis[s]+cluster:// URL. */
static int first_host(const char *url, char *host, size_t hostlen, int *port)
{
    const char *rest = strstr(url, "://");
    if (!rest)
        return -1;
    rest += 3;
    const char *at = strchr(rest, '@'),
               *hosts = at && at < rest + strcspn(rest, "/?") ? at + 1 : rest;
    size_t hl = strcspn(hosts, ",/?");
    const char *colon = memchr(hosts, ':', hl);
    snprintf(host, hostlen, "%.*s", (int)(colon ? (size_t)(colon - hosts) : hl), hosts);
    *port = colon ? atoi(colon + 1) : 6379;
    return 0;
}

/* The master of slot 0 (*HOST, *PORT) and a tag hashing to one of its
 * slots, asked of the node at HOST:PORT. */
static int find_master_tag(redisContext *seed, char *host, size_t hostlen, int *port, char *tag,
                           size_t taglen)
{
    redisReply *r = redisCommand(seed, "CLUSTER SLOTS");
    long long lo = -1, hi = -1;
    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        const redisReply *e = r->element[i];
        if (e->elements >= 3 && e->element[0]->integer == 0) {
            lo = e->element[0]->integer;
            hi = e->element[1]->integer;
            if (e->element[2]->element[0]->len)
                snprintf(host, hostlen, "%s", e->element[2]->element[0]->str);
            *port = (int)e->element[2]->element[1]->integer;
        }
    }
    if (r)
        freeReplyObject(r);
    for (int i = 0; lo >= 0 && i < 100000; i++) {
        snprintf(tag, taglen, "{t%d}", i);
        r = redisCommand(seed, "CLUSTER KEYSLOT %s", tag);
        long long slot = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
        if (r)
            freeReplyObject(r);
        if (slot >= lo && slot <= hi)
            return 0;
    }
    return -1;
}

static void master_disconnect(void *conn);

static void *master_connect(const char *url, char *err, size_t errlen)
{
    char host[256];
    int port;
    struct one_master *b = calloc(1, sizeof *b);
    if (!b || first_host(url, host, sizeof host, &port)) {
        snprintf(err, errlen, "cannot read the first node of %s", url);
        free(b);
        return NULL;
    }
    redisContext *seed = dlock_bench_redis_dial(host, port, err, errlen);
    if (!seed) {
        free(b);
        return NULL;
    }
    pthread_mutex_lock(&shared_mu);
    int rc = 0;
    char tag[16];
    if (find_master_tag(seed, host, sizeof host, &port, tag, sizeof tag))
        rc = snprintf(err, errlen, "%s: no tag found on the master of slot 0", url);
    else if (!shared_client && dlock_open(url, &shared_client))
        rc = snprintf(err, errlen, "%s: %s", url, dlock_errmsg());
    if (!rc) {
        shared_users++;
        snprintf(shared_tag, sizeof shared_tag, "%s", tag);
    }
    pthread_mutex_unlock(&shared_mu);
    redisFree(seed);
    if (rc) {
        free(b);
        return NULL;
    }
    b->ctx = dlock_bench_redis_dial(host, port, err, errlen);
    if (!b->ctx) {
        master_disconnect(b); /* gives its use of the shared client back */
        return NULL;
    }
    return b;
}

static void master_disconnect(void *conn)
{
    struct one_master *b = conn;
    dlock_bench_handles_free(&b->handles);
    redisFree(b->ctx);
    free(b);
    pthread_mutex_lock(&shared_mu);
    if (--shared_users == 0) {
        dlock_client_close(shared_client);
        shared_client = NULL;
    }
    pthread_mutex_unlock(&shared_mu);
}

/* NAME + the master's tag, taken and given back by the shared client. */
static int master_lock_unlock(void *conn, const char *name)
{
    struct one_master *b = conn;
    return dlock_bench_handles_lock_unlock(&b->handles, shared_client, name, shared_tag);
}

static int master_round_trip(void *conn)
{
    struct one_master *b = conn;
    return dlock_bench_redis_ping(b->ctx);
}

const struct dlock_bench_baseline dlock_bench_cluster_baseline = {
    .scheme = "redis+cluster",
    .what = "dlock on the same cluster, every name tagged onto the master of slot 0: "
            "acquire(TRY) + release; PING",
    .connect = master_connect,
    .disconnect = master_disconnect,
    .lock_unlock = master_lock_unlock,
    .round_trip = master_round_trip,
};

#endif /* DLOCK_HAVE_REDIS */
