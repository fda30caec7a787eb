/* cleanup.c -- nodes of ours that a lost reply may have left behind.
 *
 * An orphan is a node we failed to delete (the delete had no reply); a
 * suspect is a create whose reply never came, so a node "_c_<guid>-..."
 * may exist unseen. Either would sit in the lock's queue until the
 * session ends. Both go to the core's cleanup queue (dlock__cleanup_add),
 * which the keeper drains between renewals, retrying with backoff while
 * the session is disconnected: the work runs on the session that made the
 * node, and is done (nothing left to do) once that session has ended,
 * since its ephemeral nodes went with it.
 */
#include "zk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The session GEN with a reference, when it is the current one and
 * connected: ZOK. ZSESSIONEXPIRED when it has ended (its nodes are gone:
 * nothing left to do), ZCONNECTIONLOSS while it is not connected. */
static int session_of(struct zk_backend *zb, unsigned gen, struct zk_session **out)
{
    *out = NULL;
    pthread_mutex_lock(&zb->mu);
    struct zk_session *s = zb->cur;
    int rc = !s || s->gen != gen || !dlock__zk_session_usable(s) ? ZSESSIONEXPIRED
             : s->state != ZOO_CONNECTED_STATE            ? ZCONNECTIONLOSS
                                                          : ZOK;
    if (rc == ZOK) {
        s->refs++;
        *out = s;
    }
    pthread_mutex_unlock(&zb->mu);
    return rc;
}

/* Queue FN(ARG) on the core's cleanup queue, named WHAT and TARGET in
 * messages ("delete /dlock/x/_c_...-lock-7"). */
static void queue(struct zk_backend *zb, const char *what, const char *target,
                  dlock__cleanup_fn fn, void *arg, void (*free_arg)(void *))
{
    char *text = dlock__sprintf("%s %s", what, target);
    dlock__cleanup_add(zb->c, text ? text : target, fn, arg, free_arg);
    free(text);
}

/* ---------------------------------------------------------------- orphans */

struct zk_orphan {
    char *path;
    unsigned gen; /* the session that created it */
};

static void orphan_free(void *arg)
{
    struct zk_orphan *o = arg;
    free(o->path);
    free(o);
}

/* One try at deleting orphan ARG by DEADLINE (a dlock__cleanup_fn). */
static int orphan_delete(void *bstate, void *arg, int64_t deadline)
{
    struct zk_backend *zb = bstate;
    struct zk_orphan *o = arg;
    struct zk_session *s;
    int rc = session_of(zb, o->gen, &s);
    if (rc == ZOK) {
        rc = dlock__zk_rq_delete(zb, s->zh, o->path, deadline);
        dlock__zk_session_put(zb, s);
    }
    if (rc == ZOK || rc == ZNONODE || dlock__zk_rc_session_gone(rc))
        return DLOCK_OK;
    return dlock__zk_fail(zb, rc, "delete", o->path);
}

void dlock__zk_orphan_add(struct zk_backend *zb, struct zk_session *s, const char *path)
{
    struct zk_orphan *o = calloc(1, sizeof *o);
    if (!o || !(o->path = dlock__strdup(path))) {
        free(o);
        return; /* the node goes with the session */
    }
    o->gen = s->gen;
    queue(zb, "delete", path, orphan_delete, o, orphan_free);
}

/* --------------------------------------------------------------- suspects */

struct zk_suspect {
    char *lockpath;
    char guid[37];
    char *keep;    /* node name we hold or wait with, or NULL */
    unsigned gen;  /* the session that sent the create */
    int64_t added; /* monotonic ms */
};

static void suspect_free(void *arg)
{
    struct zk_suspect *q = arg;
    free(q->lockpath);
    free(q->keep);
    free(q);
}

/* One sweep of suspect ARG by DEADLINE (a dlock__cleanup_fn): delete
 * every child with its guid but KEEP. Done once a listing sent an op
 * timeout after the create (which may still have been in flight) finds
 * none. */
static int suspect_sweep(void *bstate, void *arg, int64_t deadline)
{
    struct zk_backend *zb = bstate;
    struct zk_suspect *q = arg;
    struct zk_session *s;
    int rc = session_of(zb, q->gen, &s);
    if (rc != ZOK)
        return dlock__zk_rc_session_gone(rc) ? DLOCK_OK : dlock__zk_fail(zb, rc, "list", q->lockpath);
    int64_t issued = dlock__now_ms();
    struct String_vector kids = {0, NULL};
    rc = dlock__zk_rq_children(zb, s->zh, q->lockpath, &kids, deadline);
    bool found = false;
    for (int32_t i = 0; rc == ZOK && i < kids.count; i++) {
        const char *kid = kids.data[i];
        if (!dlock__zk_node_has_guid(kid, q->guid) || (q->keep && strcmp(kid, q->keep) == 0))
            continue;
        found = true;
        char *path = dlock__sprintf("%s/%s", q->lockpath, kid);
        int drc = path ? dlock__zk_rq_delete(zb, s->zh, path, deadline) : ZSYSTEMERROR;
        if (drc != ZOK && drc != ZNONODE)
            rc = drc;
        free(path);
    }
    deallocate_String_vector(&kids);
    dlock__zk_session_put(zb, s);
    if (dlock__zk_rc_session_gone(rc))
        return DLOCK_OK;
    if (rc != ZOK && rc != ZNONODE)
        return dlock__zk_fail(zb, rc, "sweep", q->lockpath);
    if (found || issued - q->added < zb->c->opts.op_timeout_ms)
        return dlock__err(DLOCK_EBUSY, "%s: create of %s under %s may still be in flight",
                          zb->servers, q->guid, q->lockpath);
    return DLOCK_OK;
}

void dlock__zk_suspect_add(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
                    const char *guid, const char *keep)
{
    struct zk_suspect *q = calloc(1, sizeof *q);
    if (!q || !(q->lockpath = dlock__strdup(lockpath)) ||
        (keep && !(q->keep = dlock__strdup(keep)))) {
        if (q)
            suspect_free(q);
        return;
    }
    snprintf(q->guid, sizeof q->guid, "%s", guid);
    q->gen = s->gen;
    q->added = dlock__now_ms();
    queue(zb, "sweep for our guid", q->lockpath, suspect_sweep, q, suspect_free);
}

/* Delete our node PATH, retrying on disconnects up to the op timeout and
 * no later than W's deadline (see zk_rq_*), pausing with W's backoff, so
 * a cancel ends the retries; when that fails, no time is left, W was
 * canceled or the session is not connected now (a request would only
 * wait for the reconnection), hand it to the cleanup queue (the keeper
 * deletes it, at once when connected), so a caller that gives up never
 * waits for it. */
void dlock__zk_delete_own_node(struct zk_backend *zb, struct zk_session *s, const char *path,
                        struct dlock__wait *w)
{
    dlock__zk_delete_own_node_by(zb, s, path, dlock__wait_deadline(w), w);
}

void dlock__zk_delete_own_node_by(struct zk_backend *zb, struct zk_session *s, const char *path,
                                  int64_t until, struct dlock__wait *w)
{
    pthread_mutex_lock(&zb->mu);
    bool usable = dlock__zk_session_usable(s), connected = usable && s->state == ZOO_CONNECTED_STATE;
    pthread_mutex_unlock(&zb->mu);
    if (!usable)
        return; /* the session ended: its nodes went with it */
    int64_t deadline = connected ? dlock__zk_call_deadline(zb, until) : 0;
    struct dlock__backoff backoff = {.min_ms = ZK_RETRY_MIN_MS, .max_ms = ZK_RETRY_MAX_MS};
    while (deadline) {
        int rc = dlock__zk_rq_delete(zb, s->zh, path, deadline);
        if (rc == ZOK || rc == ZNONODE || dlock__zk_rc_session_gone(rc))
            return;
        if (!dlock__zk_rc_transient(rc) || dlock__wait_retry(w, &backoff, deadline) != DLOCK_OK)
            break;
    }
    dlock__zk_orphan_add(zb, s, path);
}
