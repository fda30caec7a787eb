/* ahead.c -- a ZooKeeper waiter that knows when it is first without
 * looking: it watches every node ahead of its own, not only the one just
 * before it, when they are few (ZK_AHEAD_MAX).
 *
 * The recipe's waiter watches its predecessor and, on its deletion, lists
 * the children again (sync + getChildren): the predecessor may have given
 * up (a timeout, a cancel, an expired session) while nodes before it
 * remain, and its deletion does not say which. That look is a second
 * round trip after the release's. But sequence numbers only grow: no
 * node can come ahead of ours after our listing, so the nodes ahead are
 * the ones it showed, and with a watch on each their deletion events
 * count them down -- when none is left, ours is first, whatever order
 * they went in and however each ended. Three more watches keep that
 * true: our own node's (deleted behind our back -- a force release --
 * its event spoils the count, the look then finds it gone), the
 * lock-delay marker's path (its creation means the next holder must read
 * it, delay.c) and the session's (a disconnect or expiry spoils the
 * count). A spoiled count, or a data event on a node ahead (which ends
 * its watch), falls back to the look. The hold's validity is counted
 * from when the watches went out (the server heard the session then):
 * a count that ends later than a third of the session timeout after
 * that falls back to the look too. The cost: each deletion is an event
 * to every waiter behind it (at most ZK_AHEAD_MAX), where the recipe
 * sends one; docs/protocol-zookeeper.md ("Hand-off").
 */
#include "zk.h"

#include <stdlib.h>
#include <string.h>

static void ahead_destroy(struct zk_ahead *t)
{
    for (int i = 0; t->paths && i < t->n; i++)
        free(t->paths[i]);
    free(t->paths);
    free(t->gone);
    free(t->marker);
    free(t);
}

/* The nodes that keep the node at V->pos out: all before it, or for a
 * reader the writers before it. Fills T's paths; false on no memory. */
static bool ahead_collect(struct zk_ahead *t, const struct zk_ahead_view *v)
{
    bool reader = dlock__zk_node_kind(v->kids[v->pos]) == ZK_KIND_READ;
    t->paths = calloc((size_t)v->pos, sizeof *t->paths);
    t->gone = calloc((size_t)v->pos, sizeof *t->gone);
    if (!t->paths || !t->gone)
        return false;
    for (int i = 0; i < v->pos; i++) {
        if (reader && dlock__zk_node_kind(v->kids[i]) == ZK_KIND_READ)
            continue;
        if (!(t->paths[t->n] = dlock__sprintf("%s/%s", v->lockpath, v->kids[i])))
            return false;
        t->n++;
    }
    t->left = t->n;
    return t->n > 0;
}

/* Mark node I of T gone (zb->mu held). */
static void ahead_gone_locked(struct zk_ahead *t, int i)
{
    if (!t->gone[i]) {
        t->gone[i] = true;
        t->left--;
    }
}

struct zk_ahead *dlock__zk_ahead_watch(struct zk_backend *zb, struct zk_session *s,
                                       const struct zk_ahead_view *v, struct dlock__wait *w,
                                       int64_t until)
{
    if (v->pos > ZK_AHEAD_MAX)
        return NULL;
    struct zk_ahead *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->s = s;
    t->w = w;
    t->mine = v->mine;
    t->marker = dlock__sprintf("%s/" ZK_DELAY_NODE, v->lockpath);
    struct zk_watch_rq *rq = NULL;
    if (!t->marker || !ahead_collect(t, v) || !(rq = calloc((size_t)t->n + 2, sizeof *rq))) {
        ahead_destroy(t);
        return NULL;
    }
    /* the nodes ahead last: once the server holds their watches, it has
     * handled the two before them (one session's requests go in order) */
    rq[0] = (struct zk_watch_rq){.path = t->marker, .exists = true};
    rq[1] = (struct zk_watch_rq){.path = t->mine};
    for (int i = 0; i < t->n; i++)
        rq[i + 2] = (struct zk_watch_rq){.path = t->paths[i]};
    pthread_mutex_lock(&zb->mu); /* registered first: an event may beat the replies */
    t->next = zb->aheads;
    zb->aheads = t;
    pthread_mutex_unlock(&zb->mu);
    t->sent = dlock__now_ms();
    int rc = dlock__zk_rq_watch_many(zb, s->zh, rq, t->n + 2, dlock__zk_watcher, s, until);
    pthread_mutex_lock(&zb->mu);
    /* the marker there, our node gone, or an answer missing: look */
    t->spoiled |= rc != ZOK || rq[0].rc != ZNONODE || rq[1].rc != ZOK;
    for (int i = 0; i < t->n; i++) {
        if (rq[i + 2].rc == ZNONODE)
            ahead_gone_locked(t, i);
        else if (rq[i + 2].rc != ZOK)
            t->spoiled = true;
    }
    pthread_mutex_unlock(&zb->mu);
    free(rq);
    return t;
}

enum zk_ahead_state dlock__zk_ahead_state(struct zk_backend *zb, struct zk_ahead *t)
{
    pthread_mutex_lock(&zb->mu);
    bool look = t->spoiled || !dlock__zk_session_usable(t->s) || t->s->state != ZOO_CONNECTED_STATE;
    int left = t->left;
    int64_t heard_for = t->s->timeout_ms / 3; /* how long T's requests vouch for us */
    pthread_mutex_unlock(&zb->mu);
    if (look)
        return ZK_AHEAD_LOOK;
    if (left > 0)
        return ZK_AHEAD_WAITING;
    return dlock__now_ms() - t->sent <= heard_for ? ZK_AHEAD_FIRST : ZK_AHEAD_LOOK;
}

int dlock__zk_ahead_wait(struct zk_backend *zb, struct zk_ahead *t, int64_t timeout_ms, bool *first)
{
    *first = false;
    int64_t net = dlock__now_ms() + timeout_ms;
    for (;;) {
        unsigned seq = dlock__wait_seq(t->w);
        enum zk_ahead_state state = dlock__zk_ahead_state(zb, t);
        if (state != ZK_AHEAD_WAITING) {
            *first = state == ZK_AHEAD_FIRST;
            return DLOCK_OK;
        }
        if (dlock__now_ms() >= net)
            return DLOCK_OK; /* no event for a session timeout: look */
        int r = dlock__wait_sleep(t->w, seq, net);
        if (r != DLOCK_OK)
            return r;
    }
}

void dlock__zk_ahead_free(struct zk_backend *zb, struct zk_ahead *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&zb->mu);
    for (struct zk_ahead **p = &zb->aheads; *p; p = &(*p)->next)
        if (*p == t) {
            *p = t->next;
            break;
        }
    pthread_mutex_unlock(&zb->mu);
    ahead_destroy(t);
}

void dlock__zk_ahead_event_locked(struct zk_backend *zb, struct zk_session *s, int type,
                                  const char *path)
{
    for (struct zk_ahead *t = zb->aheads; t; t = t->next) {
        if (t->s != s)
            continue;
        bool was = t->spoiled || t->left == 0;
        if (!path) {
            t->spoiled = true; /* the session changed: its state decides */
        } else if (strcmp(path, t->mine) == 0 || strcmp(path, t->marker) == 0) {
            t->spoiled = true;
        } else {
            for (int i = 0; i < t->n; i++)
                if (strcmp(path, t->paths[i]) == 0) {
                    if (type == ZOO_DELETED_EVENT)
                        ahead_gone_locked(t, i);
                    else
                        t->spoiled = true; /* its watch is spent */
                }
        }
        if (!was && (t->spoiled || t->left == 0))
            dlock__wait_wake(t->w);
    }
}
