/* cluster.c -- redis+cluster://: the lock recipes of the single-node
 * backend, each request sent to the master that serves its keys' slot.
 *
 * Why it is shaped so. Every key of one lock shares the "{name}" hash
 * tag (the lock key "name" hashes as "name", the token key
 * "redisson_lock_token:{name}" as "name" too), so each script touches one
 * slot and runs on one master, unchanged. The cluster is therefore a node
 * picker under the recipes of mutex.c, rwlock.c, semaphore.c and
 * election.c: the URL's front state (what the core holds) keeps the
 * owner id, the scripts and the waiters; each master gets a state of its
 * own (conn.c's pool, dial and reconnect backoff) created as the slot map
 * names it. dlock__redis_eval() asks here for a connection to the
 * master of its first key's slot and hands back each reply that redirects
 * (MOVED: the slot moved, remembered and the map refreshed; ASK: a slot
 * being migrated, ASKING then the same script on the target; TRYAGAIN and
 * CLUSTERDOWN: the cluster is between two states, tried again with a
 * backoff within the call's time left and the wait of the acquire it
 * serves, which the route carries). A master that cannot be reached
 * marks the map stale too, so requests after a failover find the
 * promoted replica. The keeper's renewals are grouped per master (one
 * pipeline each, one script call per slot, the masters at once); list
 * scans every master.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis.h"

#define CLUSTER_SLOTS 16384
#define CLUSTER_MAX_NODES REDIS_CLUSTER_MAX_NODES
/* MOVED and ASK followed per request before giving up (a map that keeps
 * changing under us, or two nodes pointing at each other). */
#define CLUSTER_MAX_HOPS 16

struct redis_cluster {
    pthread_mutex_t mu; /* the map, the node list, stale, epoch */
    struct redis_state *node[CLUSTER_MAX_NODES]; /* never removed before close */
    size_t nnodes;
    int16_t slot[CLUSTER_SLOTS]; /* index in node[], -1: no master known */
    bool stale;                  /* ask CLUSTER SLOTS before the next pick */
    unsigned epoch;              /* bumped by each refresh */
    size_t last_ok;              /* the node that answered CLUSTER SLOTS last */
    pthread_mutex_t refresh_mu;  /* one refresh at a time */
    struct {
        const char *from; /* a script's source */
        char *to;         /* the same with SPUBLISH */
    } sharded[32];
    size_t nsharded;
};

/* ================================================================ slots */

/* CRC16-CCITT (XMODEM), the hash of Redis Cluster's key slots. */
static uint16_t crc16(const char *p, size_t len)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)((unsigned char)p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = crc & 0x8000 ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

unsigned dlock__redis_cluster_slot(const char *key, size_t len)
{
    /* Only the part between the first '{' and the next '}' is hashed,
     * when it is not empty. */
    const char *open = memchr(key, '{', len);
    if (open) {
        size_t rest = len - (size_t)(open + 1 - key);
        const char *close = memchr(open + 1, '}', rest);
        if (close && close > open + 1) {
            key = open + 1;
            len = (size_t)(close - key);
        }
    }
    return crc16(key, len) & (CLUSTER_SLOTS - 1);
}

unsigned dlock__redis_cluster_name_slot(const struct redis_state *s, const char *name)
{
    size_t len = 0;
    char *key = dlock__redis_name_key(s, name, &len);
    /* without memory: any slot; the renewal routed there is redirected */
    unsigned slot = key ? dlock__redis_cluster_slot(key, len) : 0;
    free(key);
    return slot;
}

/* ============================================================= pub/sub */

/* The release messages of a cluster go by sharded pub/sub (Redis 7.0):
 * SPUBLISH reaches the subscribers of the channel's slot on its master
 * (hub.c subscribes there with SSUBSCRIBE) instead of every node of the
 * cluster, as Redisson 3.23+ does in cluster mode. The scripts stay one
 * source: the cluster runs a copy whose publish calls say spublish. */
const char *dlock__redis_sharded_script(struct redis_state *s, const char *src)
{
    static const char from[] = "redis.call('publish'", to[] = "redis.call('spublish'";
    struct redis_cluster *cl = s->cluster;
    if (!cl || !strstr(src, from))
        return src;
    pthread_mutex_lock(&cl->mu);
    const char *out = src;
    size_t i = 0;
    while (i < cl->nsharded && cl->sharded[i].from != src)
        i++;
    if (i < cl->nsharded) {
        out = cl->sharded[i].to;
    } else if (i < sizeof cl->sharded / sizeof cl->sharded[0]) {
        size_t n = 0;
        for (const char *p = src; (p = strstr(p, from)); p += sizeof from - 1)
            n++;
        char *copy = malloc(strlen(src) + n + 1), *q = copy;
        for (const char *p = src, *hit; copy && (hit = strstr(p, from)); p = hit + sizeof from - 1) {
            memcpy(q, p, (size_t)(hit - p));
            q += hit - p;
            memcpy(q, to, sizeof to - 1);
            q += sizeof to - 1;
            if (!strstr(hit + sizeof from - 1, from))
                strcpy(q, hit + sizeof from - 1);
        }
        if (copy) {
            cl->sharded[i].from = src;
            cl->sharded[i].to = copy;
            cl->nsharded++;
            out = copy;
        }
    }
    pthread_mutex_unlock(&cl->mu);
    return out;
}

const char *dlock__redis_publish_command(const struct redis_state *s)
{
    return s->cluster ? "SPUBLISH" : "PUBLISH";
}

/* ================================================================ nodes */

/* A state for the master at HOST:PORT, with F's settings: its own pool
 * and dial (conn.c), the front's owner id, scripts and key layout. */
static struct redis_state *node_new(struct redis_state *f, const char *host, int port)
{
    struct redis_state *n = dlock__redis_state_new(f->c);
    if (!n)
        return NULL;
    if (!(n->host = dlock__strdup(host))) {
        dlock__redis_state_free(n);
        return NULL;
    }
    n->port = port;
    n->user = f->user;
    n->password = f->password;
    n->tls = f->tls; /* the front's: not freed with the node */
    n->connect_timeout_ms = f->connect_timeout_ms;
    n->op_timeout_ms = f->op_timeout_ms;
    n->prefix = f->prefix;
    n->simple = f->simple;
    n->sync_replicas = f->sync_replicas;
    n->sync_timeout_ms = f->sync_timeout_ms;
    memcpy(n->uuid, f->uuid, sizeof n->uuid);
    memcpy(n->src, f->src, sizeof n->src);
    memcpy(n->sha, f->sha, sizeof n->sha);
    n->cluster = f->cluster;
    n->cluster_node = true;
    n->routing = f->routing;
    snprintf(n->where, sizeof n->where,
             strchr(host, ':') ? "redis+cluster node [%s]:%d" : "redis+cluster node %s:%d", host,
             port);
    return n;
}

static void node_free(struct redis_state *n)
{
    n->tls = NULL; /* the front's */
    n->cluster = NULL;
    dlock__redis_state_free(n);
}

/* The index of the node at HOST:PORT, added when new (cluster mutex
 * held); -1 when the list is full or memory is short. */
static int node_index_locked(struct redis_state *f, const char *host, int port)
{
    struct redis_cluster *cl = f->cluster;
    for (size_t i = 0; i < cl->nnodes; i++)
        if (cl->node[i]->port == port && strcmp(cl->node[i]->host, host) == 0)
            return (int)i;
    if (cl->nnodes == CLUSTER_MAX_NODES)
        return -1;
    struct redis_state *n = node_new(f, host, port);
    if (!n)
        return -1;
    cl->node[cl->nnodes] = n;
    return (int)cl->nnodes++;
}

static int node_index(struct redis_state *f, const char *host, int port)
{
    pthread_mutex_lock(&f->cluster->mu);
    int i = node_index_locked(f, host, port);
    pthread_mutex_unlock(&f->cluster->mu);
    return i;
}

static struct redis_state *node_at(struct redis_cluster *cl, int i)
{
    pthread_mutex_lock(&cl->mu);
    struct redis_state *n = cl->node[i];
    pthread_mutex_unlock(&cl->mu);
    return n;
}

void dlock__redis_cluster_stale(struct redis_state *s)
{
    if (!s->cluster)
        return;
    pthread_mutex_lock(&s->cluster->mu);
    s->cluster->stale = true;
    pthread_mutex_unlock(&s->cluster->mu);
}

/* ============================================================ slot map */

static bool reply_is(const redisReply *r, int type)
{
    return r && r->type == type;
}

/* Ask node N for CLUSTER SLOTS and install the map it gives: DLOCK_OK, or
 * why not (the message names N). */
static int ask_slots(struct redis_state *f, struct redis_state *n, int64_t deadline)
{
    struct redis_cluster *cl = f->cluster;
    struct rconn *k;
    int rc = dlock__redis_pool_get(n, false, deadline, &k);
    if (rc)
        return rc;
    const char *argv[] = {"CLUSTER", "SLOTS"};
    redisReply *r;
    rc = dlock__redis_command(k, 2, argv, NULL, "CLUSTER SLOTS", &r, NULL);
    dlock__redis_pool_put(n, k, rc != DLOCK_OK);
    if (rc)
        return rc;
    if (r->type == REDIS_REPLY_ERROR) {
        rc = dlock__redis_server_error(n, r->str, "CLUSTER SLOTS");
        if (strstr(r->str, "cluster support disabled"))
            rc = dlock__err(DLOCK_EBADURL, "%s: CLUSTER SLOTS: %s (not a cluster node: use "
                                           "redis://)",
                            n->where, r->str);
        freeReplyObject(r);
        return rc;
    }
    if (r->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(r);
        return dlock__err(DLOCK_EPROTO, "%s: CLUSTER SLOTS: unexpected reply", n->where);
    }
    int16_t *map = malloc(sizeof cl->slot);
    if (!map) {
        freeReplyObject(r);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < CLUSTER_SLOTS; i++)
        map[i] = -1;
    size_t covered = 0;
    pthread_mutex_lock(&cl->mu);
    for (size_t i = 0; i < r->elements && !rc; i++) {
        const redisReply *e = r->element[i];
        if (!reply_is(e, REDIS_REPLY_ARRAY) || e->elements < 3 ||
            !reply_is(e->element[0], REDIS_REPLY_INTEGER) ||
            !reply_is(e->element[1], REDIS_REPLY_INTEGER) ||
            !reply_is(e->element[2], REDIS_REPLY_ARRAY) || e->element[2]->elements < 2 ||
            !(reply_is(e->element[2]->element[0], REDIS_REPLY_STRING) ||
              reply_is(e->element[2]->element[0], REDIS_REPLY_NIL)) ||
            !reply_is(e->element[2]->element[1], REDIS_REPLY_INTEGER)) {
            rc = dlock__err(DLOCK_EPROTO, "%s: CLUSTER SLOTS: unexpected entry %zu", n->where, i);
            break;
        }
        long long lo = e->element[0]->integer, hi = e->element[1]->integer;
        const char *host = e->element[2]->element[0]->str;
        int port = (int)e->element[2]->element[1]->integer;
        /* nil (unknown-endpoint), "" or "?" (hostname, none set): the
         * master's endpoint is unknown, i.e. the host we reached N at */
        if (!host || !*host || strcmp(host, "?") == 0)
            host = n->host;
        int idx = node_index_locked(f, host, port);
        if (idx < 0 || lo < 0 || hi >= CLUSTER_SLOTS || lo > hi) {
            rc = dlock__err(idx < 0 ? DLOCK_ENOMEM : DLOCK_EPROTO,
                            "%s: CLUSTER SLOTS: cannot use range %lld-%lld of %s:%d", n->where, lo,
                            hi, host, port);
            break;
        }
        for (long long sl = lo; sl <= hi; sl++)
            map[sl] = (int16_t)idx;
        covered += (size_t)(hi - lo + 1);
    }
    if (!rc) {
        memcpy(cl->slot, map, sizeof cl->slot);
        cl->stale = false;
        cl->epoch++;
    }
    pthread_mutex_unlock(&cl->mu);
    free(map);
    freeReplyObject(r);
    if (!rc && covered == 0)
        rc = dlock__err(DLOCK_EUNAVAIL, "%s: CLUSTER SLOTS: no slot is served yet", n->where);
    return rc;
}

/* Read the slot map again from the first node that answers (the one that
 * answered last first), unless another thread did since EPOCH, within
 * DEADLINE. */
static int refresh(struct redis_state *f, unsigned epoch, int64_t deadline)
{
    struct redis_cluster *cl = f->cluster;
    pthread_mutex_lock(&cl->refresh_mu);
    pthread_mutex_lock(&cl->mu);
    bool done = cl->epoch != epoch;
    size_t n = cl->nnodes, first = cl->last_ok;
    pthread_mutex_unlock(&cl->mu);
    int rc = DLOCK_OK;
    char why[DLOCK__MSG_MAX] = "";
    for (size_t i = 0; !done && i < n; i++) {
        size_t at = (first + i) % n;
        rc = ask_slots(f, node_at(cl, (int)at), deadline);
        if (!rc) {
            pthread_mutex_lock(&cl->mu);
            cl->last_ok = at;
            pthread_mutex_unlock(&cl->mu);
            break;
        }
        if (rc == DLOCK_EBADURL || rc == DLOCK_EAUTH || rc == DLOCK_ENOMEM)
            break;
        if (!*why)
            dlock__errmsg_save(why);
        if (dlock__time_left(deadline, 1) == 0)
            break;
    }
    pthread_mutex_unlock(&cl->refresh_mu);
    if (rc && *why && rc != DLOCK_EBADURL && rc != DLOCK_EAUTH)
        return dlock__err(rc, "%s: no node answered CLUSTER SLOTS (first: %s)", f->where, why);
    return rc;
}

/* ============================================================= routing */

void dlock__redis_route_init(struct dlock__redis_route *rt, struct dlock__wait *w)
{
    memset(rt, 0, sizeof *rt);
    rt->node = -1;
    rt->wait = w;
    rt->backoff.min_ms = 10;
    rt->backoff.max_ms = 500;
}

/* Pause before trying RT's request again (the cluster is between two
 * states), within what is left of DEADLINE and within RT's wait:
 * DLOCK_OK to try again, DLOCK_ETIMEDOUT when no time is left,
 * DLOCK_ECANCELED when the wait was canceled. */
static int route_pause(struct redis_state *f, struct dlock__redis_route *rt, int64_t deadline)
{
    if (!rt->until)
        rt->until = dlock__time_budget(deadline, f->op_timeout_ms);
    return dlock__wait_retry(rt->wait, &rt->backoff, rt->until);
}

int dlock__redis_cluster_get(struct redis_state *f, struct dlock__redis_route *rt, int nkeys,
                             const char **keys, const size_t *lens, int64_t deadline,
                             struct redis_state **ns, struct rconn **out)
{
    struct redis_cluster *cl = f->cluster;
    *out = NULL;
    *ns = f;
    if (nkeys < 1)
        return dlock__err(DLOCK_EINVAL, "%s: a request without a key has no slot", f->where);
    unsigned slot = dlock__redis_cluster_slot(keys[0], lens[0]);
    for (int i = 1; i < nkeys; i++)
        if (dlock__redis_cluster_slot(keys[i], lens[i]) != slot)
            return dlock__err(DLOCK_EINVAL,
                              "%s: keys '%.*s' and '%.*s' of one request fall in different "
                              "slots; refused",
                              f->where, (int)lens[0], keys[0], (int)lens[i], keys[i]);
    for (;;) {
        pthread_mutex_lock(&cl->mu);
        int idx = rt->node >= 0 ? rt->node : cl->slot[slot];
        bool stale = cl->stale;
        unsigned epoch = cl->epoch;
        pthread_mutex_unlock(&cl->mu);
        int rc = DLOCK_OK;
        if (rt->node < 0 && (stale || idx < 0)) {
            rc = refresh(f, epoch, deadline);
            pthread_mutex_lock(&cl->mu);
            idx = cl->slot[slot];
            pthread_mutex_unlock(&cl->mu);
        }
        if (idx < 0 && !rc)
            rc = dlock__err(DLOCK_EUNAVAIL, "%s: no master serves slot %u (the cluster is down "
                                            "or being resharded)",
                            f->where, slot);
        if (!rc) {
            *ns = node_at(cl, idx);
            rc = dlock__redis_pool_get_for(*ns, deadline, rt->wait, out);
        }
        if (!rc && rt->ask) {
            /* the target of a migration serves the slot's keys only
             * after ASKING, for the next command on this connection */
            const char *asking[] = {"ASKING"};
            redisReply *r;
            rc = dlock__redis_command(*out, 1, asking, NULL, "ASKING", &r, NULL);
            if (!rc)
                freeReplyObject(r);
            else
                dlock__redis_pool_put(*ns, *out, true);
        }
        if (!rc)
            return DLOCK_OK;
        *out = NULL;
        /* Nothing was sent: a master that cannot be reached may be gone
         * (a failover under way), so ask for the map again and retry
         * within the call's time left. */
        if (rc != DLOCK_ECONN && rc != DLOCK_EUNAVAIL)
            return rc;
        dlock__redis_cluster_stale(f);
        rt->node = -1;
        rt->ask = false;
        char why[DLOCK__MSG_MAX];
        dlock__errmsg_save(why);
        int paused = route_pause(f, rt, deadline);
        if (paused == DLOCK_ECANCELED)
            return paused;
        if (paused)
            return dlock__errmsg_restore(rc, why);
    }
}

int dlock__redis_cluster_redirect(struct redis_state *f, struct dlock__redis_route *rt,
                                  const struct redis_state *from, const redisReply *r,
                                  int64_t deadline)
{
    if (r->type != REDIS_REPLY_ERROR)
        return 0;
    bool moved = strncmp(r->str, "MOVED ", 6) == 0, ask = strncmp(r->str, "ASK ", 4) == 0;
    if (moved || ask) {
        if (rt->hops++ >= CLUSTER_MAX_HOPS)
            return DLOCK_EUNAVAIL;
        /* "MOVED <slot> <host>:<port>"; a host "" (unknown-endpoint) or "?"
         * (hostname, none set) is the node that answered's, as in
         * CLUSTER SLOTS */
        const char *p = strchr(r->str, ' ') + 1;
        char *end;
        long slot = strtol(p, &end, 10);
        const char *addr = end + (*end == ' ');
        const char *colon = strrchr(addr, ':');
        if (*end != ' ' || slot < 0 || slot >= CLUSTER_SLOTS || !colon)
            return DLOCK_EUNAVAIL;
        char host[256];
        snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
        int port = atoi(colon + 1);
        int idx = node_index(f, *host && strcmp(host, "?") != 0 ? host : from->host, port);
        if (idx < 0)
            return DLOCK_EUNAVAIL;
        if (moved) {
            pthread_mutex_lock(&f->cluster->mu);
            f->cluster->slot[slot] = (int16_t)idx;
            f->cluster->stale = true; /* other slots may have moved too */
            pthread_mutex_unlock(&f->cluster->mu);
        }
        rt->node = ask ? idx : -1;
        rt->ask = ask;
        return 1;
    }
    bool down = strncmp(r->str, "CLUSTERDOWN", 11) == 0;
    if (!down && strncmp(r->str, "TRYAGAIN", 8) != 0)
        return 0;
    /* CLUSTERDOWN: a master failed and no replica took over yet;
     * TRYAGAIN: the slot's keys are split between the two nodes of a
     * migration. Both pass. */
    if (down)
        dlock__redis_cluster_stale(f);
    rt->node = -1;
    rt->ask = false;
    int paused = route_pause(f, rt, deadline);
    /* The hops bound redirects that follow one another at once (a loop);
     * after a pause the time left bounds them: a slot migrating answers
     * ASK then TRYAGAIN to every try until it ends, and a request gave up
     * after 16 of them (5 s of pauses) whatever its time. */
    rt->hops = 0;
    return paused == DLOCK_OK ? 1 : paused == DLOCK_ECANCELED ? paused : DLOCK_EUNAVAIL;
}

int dlock__redis_keyed_command(struct redis_state *s, int64_t deadline, const char *key, int argc,
                               const char **argv, const char *what, redisReply **out)
{
    struct dlock__redis_route rt;
    dlock__redis_route_init(&rt, NULL);
    /* redirects and pauses share one budget */
    deadline = dlock__time_budget(deadline, s->op_timeout_ms);
    size_t key_len = strlen(key);
    for (;;) {
        struct redis_state *ns = s;
        struct rconn *k;
        *out = NULL;
        int rc = s->cluster ? dlock__redis_cluster_get(s, &rt, 1, &key, &key_len, deadline, &ns, &k)
                            : dlock__redis_pool_get(s, false, deadline, &k);
        if (rc)
            return rc;
        rc = dlock__redis_command(k, argc, argv, NULL, what, out, NULL);
        dlock__redis_pool_put(ns, k, rc != DLOCK_OK);
        if (rc)
            return rc;
        int redirected =
            s->cluster ? dlock__redis_cluster_redirect(s, &rt, ns, *out, deadline) : 0;
        if (redirected > 0) {
            freeReplyObject(*out);
            *out = NULL;
            continue;
        }
        if ((*out)->type == REDIS_REPLY_ERROR) {
            rc = dlock__redis_server_error(ns, (*out)->str, what);
            freeReplyObject(*out);
            *out = NULL;
        }
        return rc;
    }
}

/* ========================================================= connections */

int dlock__redis_cluster_owner(struct redis_state *s, const char *key, size_t len)
{
    unsigned slot = dlock__redis_cluster_slot(key, len);
    pthread_mutex_lock(&s->cluster->mu);
    int i = s->cluster->slot[slot];
    pthread_mutex_unlock(&s->cluster->mu);
    return i;
}

int dlock__redis_cluster_dial_node(struct redis_state *s, int i, int64_t deadline, struct rconn **out)
{
    return dlock__redis_dial(node_at(s->cluster, i), false, deadline, NULL, out);
}

void dlock__redis_cluster_refresh_stale(struct redis_state *s)
{
    struct redis_cluster *cl = s->cluster;
    pthread_mutex_lock(&cl->mu);
    bool stale = cl->stale;
    unsigned epoch = cl->epoch;
    pthread_mutex_unlock(&cl->mu);
    if (stale)
        refresh(s, epoch, dlock__now_ms() + s->op_timeout_ms); /* a failure: the map as it was */
}

/* ============================================================== renewal */

struct renew_item {
    int node;
    unsigned slot;
    size_t at; /* in the caller's batch */
};

static int renew_item_cmp(const void *a, const void *b)
{
    const struct renew_item *x = a, *y = b;
    if (x->node != y->node)
        return x->node < y->node ? -1 : 1;
    if (x->slot != y->slot)
        return x->slot < y->slot ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at;
}

/* One master's share of the keeper's batch, renewed in a thread of its
 * own. */
struct renew_group {
    struct redis_state *node;
    struct dlock__renew_batch sub;
    int (*renew)(void *state, struct dlock__renew_batch *b);
    pthread_t thread;
    bool started;
};

static void *renew_group_main(void *arg)
{
    struct renew_group *g = arg;
    g->renew(g->node, &g->sub);
    return NULL;
}

/* Renew the N groups G at once: each but the last in a thread of its
 * own, the last (and one whose thread does not start) in the caller's;
 * back when all are done. So a master that does not answer holds its own
 * holds' renewals until the batch's deadline, not the other masters'
 * (one after another, those came after it with no time left, and their
 * holds were lost with the silent master's). */
static void renew_groups(struct renew_group *g, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++)
        g[i].started = pthread_create(&g[i].thread, NULL, renew_group_main, &g[i]) == 0;
    for (size_t i = 0; i < n; i++)
        if (!g[i].started)
            g[i].renew(g[i].node, &g[i].sub);
    for (size_t i = 0; i + 1 < n; i++)
        if (g[i].started)
            pthread_join(g[i].thread, NULL);
}

int dlock__redis_cluster_renew(struct redis_state *f, struct dlock__renew_batch *b,
                               const struct redis_renewer *renew)
{
    struct redis_cluster *cl = f->cluster;
    size_t n = b->n;
    if (n == 0)
        return DLOCK_OK;
    pthread_mutex_lock(&cl->mu);
    bool stale = cl->stale;
    unsigned epoch = cl->epoch;
    pthread_mutex_unlock(&cl->mu);
    if (stale)
        refresh(f, epoch, b->deadline); /* a failure leaves the map as it was */
    struct renew_item *it = calloc(n, sizeof *it);
    struct dlock__hold **holds = calloc(n, sizeof *holds);
    int *result = calloc(n, sizeof *result);
    char(*why)[DLOCK__WHY_MAX] = calloc(n, sizeof *why);
    struct renew_group *groups = calloc(n, sizeof *groups);
    size_t ngroups = 0;
    if (!it || !holds || !result || !why || !groups) {
        free(it);
        free(holds);
        free(result);
        free(why);
        free(groups);
        int rc = dlock__err(DLOCK_ENOMEM, "out of memory");
        for (size_t i = 0; i < n; i++)
            dlock__renew_result(b, i, rc);
        return rc;
    }
    pthread_mutex_lock(&cl->mu);
    for (size_t i = 0; i < n; i++) {
        it[i].slot = dlock__redis_cluster_name_slot(f, b->holds[i]->name);
        it[i].node = cl->slot[it[i].slot];
        it[i].at = i;
    }
    pthread_mutex_unlock(&cl->mu);
    /* one pipeline per master, its holds in slot order (mutex.c's renewal
     * makes one script call per slot), the masters at once */
    qsort(it, n, sizeof *it, renew_item_cmp);
    for (size_t i = 0; i < n; i++)
        holds[i] = b->holds[it[i].at];
    for (size_t g = 0, e; g < n; g = e) {
        for (e = g + 1; e < n && it[e].node == it[g].node;)
            e++;
        struct dlock__renew_batch sub = {.holds = holds + g, .n = e - g, .deadline = b->deadline,
                                         .result = result + g, .why = why + g};
        for (size_t i = g; i < e; i++)
            result[i] = DLOCK_EIO;
        if (it[g].node < 0) {
            int rc = dlock__err(DLOCK_EUNAVAIL, "%s: renew: no master known for slot %u",
                                f->where, it[g].slot);
            for (size_t i = 0; i < sub.n; i++)
                dlock__renew_result(&sub, i, rc);
        } else {
            groups[ngroups++] =
                (struct renew_group){.node = node_at(cl, it[g].node), .sub = sub, .renew = renew->batch};
        }
    }
    renew_groups(groups, ngroups);
    for (size_t i = 0; i < n; i++) {
        /* A lock hold whose master did not renew it (a slot being
         * migrated: ASK; moved: MOVED; a master gone) is tried once more
         * alone, by the routed path that follows redirects. */
        if (result[i] != DLOCK_OK && result[i] != DLOCK_ELOST && !holds[i]->sem &&
            dlock__time_left(b->deadline, 1) > 0) {
            dlock__redis_cluster_stale(f);
            int rc = renew->one(f, holds[i], b->deadline);
            result[i] = rc;
            if (rc)
                snprintf(why[i], sizeof why[i], "%s", dlock_errmsg());
        }
        b->result[it[i].at] = result[i];
        if (result[i] != DLOCK_OK)
            memcpy(b->why[it[i].at], why[i], sizeof why[i]);
    }
    free(it);
    free(holds);
    free(result);
    free(why);
    free(groups);
    return DLOCK_OK;
}

/* ================================================================= scan */

struct scan_walk {
    dlock__redis_scan_each *each;
    void *arg;
    bool stopped;
};

static int scan_one(struct redis_state *s, struct rconn *k, const redisReply *key, void *arg,
                    int *err)
{
    struct scan_walk *sw = arg;
    int stop = sw->each(s, k, key, sw->arg, err);
    sw->stopped = stop != 0;
    return stop;
}

int dlock__redis_cluster_scan(struct redis_state *f, const char *match, const char *type,
                              dlock__redis_scan_each *each, void *arg,
                              int (*scan)(struct redis_state *s, const char *match,
                                          const char *type, dlock__redis_scan_each *each,
                                          void *arg))
{
    struct redis_cluster *cl = f->cluster;
    pthread_mutex_lock(&cl->mu);
    unsigned epoch = cl->epoch;
    pthread_mutex_unlock(&cl->mu);
    int rc = refresh(f, epoch, dlock__now_ms() + f->op_timeout_ms);
    if (rc)
        return rc;
    /* every master once: each holds the keys of its slots */
    bool seen[CLUSTER_MAX_NODES] = {false};
    struct redis_state *masters[CLUSTER_MAX_NODES];
    size_t nm = 0;
    pthread_mutex_lock(&cl->mu);
    for (size_t sl = 0; sl < CLUSTER_SLOTS; sl++) {
        int i = cl->slot[sl];
        if (i >= 0 && !seen[i]) {
            seen[i] = true;
            masters[nm++] = cl->node[i];
        }
    }
    pthread_mutex_unlock(&cl->mu);
    struct scan_walk sw = {.each = each, .arg = arg};
    for (size_t i = 0; i < nm && !rc && !sw.stopped; i++)
        rc = scan(masters[i], match, type, scan_one, &sw);
    return rc;
}

/* ============================================================ open/close */

int dlock__redis_cluster_parse(struct redis_state *s, struct dlock_client *c)
{
    const char *url = c->url.redacted;
    if (c->url.nhosts < 1)
        return dlock__err(DLOCK_EBADURL, "bad URL '%s': %s://h1:7000,h2:7001 needs at least one "
                                         "node",
                          url, c->url.scheme);
    if (c->url.path && strcmp(c->url.path, "/") != 0 && strcmp(c->url.path, "/0") != 0)
        return dlock__err(DLOCK_EBADURL, "bad URL '%s': a cluster has only database 0", url);
    const char *db = dlock__url_param(&c->url, "db");
    if (db && strcmp(db, "0") != 0)
        return dlock__err(DLOCK_EBADURL, "bad URL '%s': a cluster has only database 0", url);
    if (c->opts.layout && strcmp(c->opts.layout, "fair") == 0)
        return dlock__err(DLOCK_EBADURL, "bad URL '%s': layout=fair is not served on a cluster "
                                         "(its grants go to a channel of each client, outside "
                                         "the lock's slot)",
                          url);
    struct redis_cluster *cl = calloc(1, sizeof *cl);
    if (!cl)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    pthread_mutex_init(&cl->mu, NULL);
    pthread_mutex_init(&cl->refresh_mu, NULL);
    for (size_t i = 0; i < CLUSTER_SLOTS; i++)
        cl->slot[i] = -1;
    cl->stale = true;
    s->cluster = cl;
    snprintf(s->where, sizeof s->where, "%s %s:%d%s", c->url.scheme, c->url.hosts[0].host,
             c->url.hosts[0].port ? c->url.hosts[0].port : REDIS_DEFAULT_PORT,
             c->url.nhosts > 1 ? ",..." : "");
    return DLOCK_OK;
}

int dlock__redis_cluster_start(struct redis_state *f, int (*load_scripts)(struct redis_state *n))
{
    struct redis_cluster *cl = f->cluster;
    struct dlock_client *c = f->c;
    for (int i = 0; i < S_COUNT; i++) /* before any master's state copies them */
        f->src[i] = dlock__redis_sharded_script(f, f->src[i]);
    for (size_t i = 0; i < c->url.nhosts; i++) {
        int port = c->url.hosts[i].port ? c->url.hosts[i].port : REDIS_DEFAULT_PORT;
        if (node_index(f, c->url.hosts[i].host, port) < 0)
            return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    int rc = refresh(f, cl->epoch, DLOCK__NEVER);
    if (rc)
        return rc;
    /* the digests are the same on every master; each loads a script on
     * its first EVAL (NOSCRIPT) */
    struct redis_state *n = node_at(cl, (int)cl->last_ok);
    rc = load_scripts(n);
    if (rc)
        return rc;
    memcpy(f->sha, n->sha, sizeof f->sha);
    pthread_mutex_lock(&cl->mu);
    for (size_t i = 0; i < cl->nnodes; i++)
        memcpy(cl->node[i]->sha, f->sha, sizeof f->sha);
    pthread_mutex_unlock(&cl->mu);
    return DLOCK_OK;
}

void dlock__redis_cluster_free(struct redis_state *f)
{
    struct redis_cluster *cl = f->cluster;
    if (!cl || f->cluster_node)
        return;
    for (size_t i = 0; i < cl->nnodes; i++)
        node_free(cl->node[i]);
    for (size_t i = 0; i < cl->nsharded; i++)
        free(cl->sharded[i].to);
    pthread_mutex_destroy(&cl->mu);
    pthread_mutex_destroy(&cl->refresh_mu);
    free(cl);
    f->cluster = NULL;
}
