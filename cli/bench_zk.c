/* bench_zk.c -- the raw ZooKeeper baseline of `dlock bench`.
 *
 * The floor of a ZooKeeper lock with the same C client (libzookeeper_mt):
 * create an EPHEMERAL node at a fixed path (created = ours, "node exists"
 * = busy), then delete it. Two round trips per acquire+release, each a
 * write through the leader. dlock's fair, Curator-compatible recipe
 * needs a listing of the children too, sent in the same round trip as
 * its create; the ratio shows what that costs. One round trip is an
 * `exists` on the root. It parses just enough
 * of the URL (hosts, chroot, user:password, base) to reach the same
 * servers and base path as dlock.
 */
#ifdef DLOCK_HAVE_ZK

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define THREADED /* the synchronous calls of libzookeeper_mt */
#include <zookeeper.h>

#include "bench.h"

struct zk_raw {
    zhandle_t *zh;
    char base[256];
};

static void raw_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    (void)zh, (void)type, (void)state, (void)path, (void)ctx;
}

static void raw_log(const char *message)
{
    (void)message;
}

static void *zk_raw_connect(const char *url, char *err, size_t errlen)
{
    if (strncmp(url, "zk://", 5) != 0) {
        snprintf(err, errlen, "not a zk:// URL: %s", url);
        return NULL;
    }
    char *rest = strdup(url + 5);
    struct zk_raw *r = calloc(1, sizeof *r);
    if (!rest || !r) {
        free(rest);
        free(r);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    snprintf(r->base, sizeof r->base, "/dlock");
    char *query = strchr(rest, '?');
    if (query) {
        *query++ = 0;
        for (char *kv = strtok(query, "&"); kv; kv = strtok(NULL, "&"))
            if (strncmp(kv, "base=", 5) == 0) {
                dlock_bench_pct_decode(kv + 5);
                snprintf(r->base, sizeof r->base, "%s", strcmp(kv + 5, "/") ? kv + 5 : "");
            }
    }
    char *hosts = rest, *auth = NULL;
    char *at = strrchr(rest, '@');
    if (at) {
        *at = 0;
        auth = rest;
        dlock_bench_pct_decode(auth);
        hosts = at + 1;
    }
    r->zh = zookeeper_init2(hosts, raw_watcher, 30000, NULL, NULL, 0, raw_log);
    for (int i = 0; r->zh && i < 100 && zoo_state(r->zh) != ZOO_CONNECTED_STATE; i++) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (!r->zh || zoo_state(r->zh) != ZOO_CONNECTED_STATE) {
        snprintf(err, errlen, "zk %s: no connection within 5 s", hosts);
        if (r->zh)
            zookeeper_close(r->zh);
        free(rest);
        free(r);
        return NULL;
    }
    if (auth)
        zoo_add_auth(r->zh, "digest", auth, (int)strlen(auth), NULL, NULL);
    free(rest);
    if (*r->base) {
        int rc =
            zoo_create(r->zh, r->base, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_PERSISTENT, NULL, 0);
        if (rc != ZOK && rc != ZNODEEXISTS) {
            snprintf(err, errlen, "create %s: %s", r->base, zerror(rc));
            zookeeper_close(r->zh);
            free(r);
            return NULL;
        }
    }
    return r;
}

static void zk_raw_disconnect(void *conn)
{
    struct zk_raw *r = conn;
    if (!r)
        return;
    zookeeper_close(r->zh);
    free(r);
}

static int zk_raw_lock_unlock(void *conn, const char *name)
{
    struct zk_raw *r = conn;
    char path[1024];
    /* bench names are "dlock-bench:<n>": plain path characters */
    snprintf(path, sizeof path, "%s/%s.raw", r->base, name);
    int rc = zoo_create(r->zh, path, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL, NULL, 0);
    if (rc == ZNODEEXISTS)
        return 1;
    if (rc != ZOK)
        return -1;
    return zoo_delete(r->zh, path, -1) == ZOK ? 0 : -1;
}

static int zk_raw_round_trip(void *conn)
{
    struct zk_raw *r = conn;
    struct Stat st;
    return zoo_exists(r->zh, "/", 0, &st) == ZOK ? 0 : -1;
}

const struct dlock_bench_baseline dlock_bench_zk_baseline = {
    .scheme = "zk",
    .what = "libzookeeper_mt: create EPHEMERAL <base>/<name>.raw + delete "
            "(2 round trips, as dlock's create+list, delete); exists / for one round trip",
    .connect = zk_raw_connect,
    .disconnect = zk_raw_disconnect,
    .lock_unlock = zk_raw_lock_unlock,
    .round_trip = zk_raw_round_trip,
};

#endif /* DLOCK_HAVE_ZK */
