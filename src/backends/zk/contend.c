/* contend.c -- the ZooKeeper backend's contended signal: a holder told
 * when another owner queues a node behind its own
 * (dlock_lock_on_contended()).
 *
 * A contender waits by creating its EPHEMERAL_SEQUENTIAL child of the lock
 * node, so a child watch on the lock node sees it come: the hold's watch
 * lists the children (zoo_awget_children), reports every lock child with
 * a sequence after its own node's as a waiter (the core tells each once),
 * and lists again each time the watch fires. Pushed, then: one request
 * as the acquire returns and one per change of the children, none per
 * renewal. Everything after the first request runs on the client
 * library's completion thread, so nothing here waits for a reply.
 *
 * One record per watched hold, owned by whichever request is
 * outstanding -- the listing (its completion) or, once it succeeded, the
 * watch it left (its watcher): the last one to run frees it when the hold
 * is gone (the core answers false: released, lost), and the end of the
 * session frees what is left (a watch that never fired again), after
 * zookeeper_close(), when no callback can run any more.
 */
#include "zk.h"

#include <stdlib.h>
#include <string.h>

/* Listing failures in a row (a connection lost) after which a hold is
 * no longer watched: said in the log. */
#define LIST_TRIES 3

struct zk_contend {
    struct zk_backend *zb;
    const struct dlock__hold *h; /* identity only: the core matches it */
    uint64_t token;
    unsigned gen;            /* the session its requests go to */
    char *lockpath;          /* the lock node */
    char seq[11];            /* our node's sequence */
    int failures;            /* listings failed in a row */
    struct zk_contend *next; /* zb->contends */
};

static void contend_changed(zhandle_t *zh, int type, int state, const char *path, void *ctx);
static void contend_listed(int rc, const struct String_vector *kids, const void *data);

/* The sequence of lock child NODE (its last 10 digits), NULL for any
 * other child. */
static const char *sequence_of(const char *node)
{
    size_t n = strlen(node);
    return n >= 10 && dlock__zk_node_kind(node) != ZK_KIND_NONE ? node + n - 10 : NULL;
}

/* K's hold is no longer watched: out of the backend's list and freed. */
static void contend_drop(struct zk_contend *k)
{
    struct zk_backend *zb = k->zb;
    pthread_mutex_lock(&zb->mu);
    for (struct zk_contend **p = &zb->contends; *p; p = &(*p)->next)
        if (*p == k) {
            *p = k->next;
            break;
        }
    pthread_mutex_unlock(&zb->mu);
    free(k->lockpath);
    free(k);
}

/* List K's lock node on ZH, leaving a watch: a ZooKeeper code (ZOK: sent). */
static int contend_list(struct zk_contend *k, zhandle_t *zh)
{
    return zoo_awget_children(zh, k->lockpath, contend_changed, k, contend_listed, k);
}

/* The listing's answer: every lock child after our node waits for it. */
static void contend_listed(int rc, const struct String_vector *kids, const void *data)
{
    struct zk_contend *k = (struct zk_contend *)data;
    struct dlock_client *c = k->zb->c;
    if (rc != ZOK) {
        /* no watch was left: this was the last request of K */
        bool held = dlock__hold_contended(c, k->h, k->token, NULL);
        zhandle_t *zh = NULL;
        pthread_mutex_lock(&k->zb->mu);
        if (held && ++k->failures < LIST_TRIES && k->zb->cur && k->zb->cur->gen == k->gen)
            zh = k->zb->cur->zh;
        pthread_mutex_unlock(&k->zb->mu);
        if (zh && contend_list(k, zh) == ZOK)
            return;
        if (held)
            dlock__log(c, DLOCK_LOG_WARN, "%s: lock node %s: its waiters are no longer watched: %s",
                       k->zb->servers, k->lockpath, zerror(rc));
        contend_drop(k);
        return;
    }
    k->failures = 0;
    bool held = dlock__hold_contended(c, k->h, k->token, NULL);
    for (int32_t i = 0; held && kids && i < kids->count; i++) {
        const char *seq = sequence_of(kids->data[i]);
        if (seq && strcmp(seq, k->seq) > 0)
            held = dlock__hold_contended(c, k->h, k->token, kids->data[i]);
    }
    /* the watch left stands: its watcher frees K once the hold is gone */
}

/* The watch fired: list again while the hold lasts. Session events
 * (disconnected, reconnected) leave the watch in place: the client
 * library sets it again on the next connection of the session. */
static void contend_changed(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    (void)state;
    (void)path;
    struct zk_contend *k = ctx;
    if (type == ZOO_SESSION_EVENT)
        return;
    if (type == ZOO_CHILD_EVENT && dlock__hold_contended(k->zb->c, k->h, k->token, NULL) &&
        contend_list(k, zh) == ZOK)
        return;
    contend_drop(k);
}

/* The backend's contend op: watch H's lock node for nodes queued behind
 * H's own. */
static int zk_contend_watch(void *state, struct dlock__hold *h)
{
    struct zk_backend *zb = state;
    const struct zk_hold *zh = h->bdata;
    struct zk_session *s;
    int rc = dlock__zk_hold_session(zb, h, &s);
    if (rc)
        return rc;
    const char *slash = strrchr(zh->path, '/'), *seq = sequence_of(slash + 1);
    struct zk_contend *k = calloc(1, sizeof *k);
    if (k)
        k->lockpath = strndup(zh->path, (size_t)(slash - zh->path));
    if (!k || !k->lockpath || !seq) {
        if (k)
            free(k->lockpath);
        free(k);
        dlock__zk_session_put(zb, s);
        return seq ? dlock__err(DLOCK_ENOMEM, "out of memory")
                   : dlock__err(DLOCK_EPROTO, "%s: node %s has no sequence", zb->servers, zh->path);
    }
    k->zb = zb;
    k->h = h;
    k->token = h->token;
    k->gen = s->gen;
    memcpy(k->seq, seq, 10);
    pthread_mutex_lock(&zb->mu);
    k->next = zb->contends;
    zb->contends = k;
    pthread_mutex_unlock(&zb->mu);
    int zrc = contend_list(k, s->zh);
    dlock__zk_session_put(zb, s);
    if (zrc != ZOK) {
        rc = dlock__zk_fail(zb, zrc, "watch the children of", k->lockpath);
        contend_drop(k);
        return rc;
    }
    return DLOCK_OK;
}

void dlock__zk_contend_forget(struct zk_backend *zb, unsigned gen)
{
    pthread_mutex_lock(&zb->mu);
    struct zk_contend **p = &zb->contends, *k;
    while ((k = *p)) {
        if (k->gen == gen) {
            *p = k->next;
            free(k->lockpath);
            free(k);
        } else {
            p = &k->next;
        }
    }
    pthread_mutex_unlock(&zb->mu);
}

const struct dlock__contend_ops dlock__zk_contend_ops = {
    .watch = zk_contend_watch,
};
