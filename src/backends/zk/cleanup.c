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

/* The session GEN with a reference into *OUT, when it is the current one
 * and connected: DLOCK_OK. DLOCK_OK with *OUT NULL when it has ended (its
 * nodes went with it: nothing left to do); while it is not connected, the
 * failure of WHAT on PATH, to be tried again. */
static int session_of(struct zk_backend *zb, unsigned gen, const char *what, const char *path,
                      struct zk_session **out)
{
    *out = NULL;
    pthread_mutex_lock(&zb->mu);
    struct zk_session *s = zb->cur;
    bool ended = !s || s->gen != gen || !dlock__zk_session_usable(s);
    bool connected = !ended && s->state == ZOO_CONNECTED_STATE;
    if (connected) {
        s->refs++;
        *out = s;
    }
    pthread_mutex_unlock(&zb->mu);
    return ended || connected ? DLOCK_OK : dlock__zk_fail(zb, ZCONNECTIONLOSS, what, path);
}

/* A piece of work owed to the cleanup queue: an orphan's delete or a
 * suspect's sweep, done on the session that made the node(s). */
struct zk_owed {
    /* The work on live session S by DEADLINE: a dlock__cleanup_fn's result. */
    int (*work)(struct zk_backend *zb, struct zk_session *s, struct zk_owed *o, int64_t deadline);
    const char *what; /* its request, for messages: "delete", "list" */
    char *path;       /* orphan: the node; suspect: the lock node */
    unsigned gen;     /* the session that made it */
    /* a suspect's */
    char guid[37];
    char *keep;    /* node name we hold or wait with, or NULL */
    int64_t added; /* monotonic ms */
};

static void owed_free(void *arg)
{
    struct zk_owed *o = arg;
    free(o->path);
    free(o->keep);
    free(o);
}

/* One try at owed work ARG by DEADLINE (a dlock__cleanup_fn). */
static int owed_run(void *bstate, void *arg, int64_t deadline)
{
    struct zk_backend *zb = bstate;
    struct zk_owed *o = arg;
    struct zk_session *s;
    int rc = session_of(zb, o->gen, o->what, o->path, &s);
    if (rc || !s)
        return rc;
    rc = o->work(zb, s, o, deadline);
    dlock__zk_session_put(zb, s);
    return rc;
}

/* A new piece of owed work of session S on PATH (NULL when out of memory:
 * the node goes with the session). */
static struct zk_owed *owed_new(struct zk_session *s, const char *what, const char *path)
{
    struct zk_owed *o = calloc(1, sizeof *o);
    if (!o || !(o->path = dlock__strdup(path))) {
        free(o);
        return NULL;
    }
    o->what = what;
    o->gen = s->gen;
    return o;
}

/* Queue O on the core's cleanup queue, named TEXT and its path in
 * messages ("delete /dlock/x/_c_...-lock-7"). */
static void owe(struct zk_backend *zb, struct zk_owed *o, const char *text)
{
    char *name = dlock__sprintf("%s %s", text, o->path);
    dlock__cleanup_add(zb->c, name ? name : o->path, owed_run, o, owed_free);
    free(name);
}

/* ---------------------------------------------------------------- orphans */

/* An orphan's delete. */
static int orphan_delete(struct zk_backend *zb, struct zk_session *s, struct zk_owed *o,
                         int64_t deadline)
{
    int rc = dlock__zk_rq_delete(zb, s->zh, o->path, deadline);
    if (rc == ZOK || rc == ZNONODE || dlock__zk_rc_session_gone(rc))
        return DLOCK_OK;
    return dlock__zk_fail(zb, rc, "delete", o->path);
}

void dlock__zk_orphan_add(struct zk_backend *zb, struct zk_session *s, const char *path)
{
    struct zk_owed *o = owed_new(s, "delete", path);
    if (!o)
        return;
    o->work = orphan_delete;
    owe(zb, o, "delete");
}

/* --------------------------------------------------------------- suspects */

/* A suspect's sweep: delete every child of lock node O->path with its
 * guid but O->keep. Done once a listing sent an op timeout after the
 * create (which may still have been in flight) finds none. */
static int suspect_sweep(struct zk_backend *zb, struct zk_session *s, struct zk_owed *q,
                         int64_t deadline)
{
    int64_t issued = dlock__now_ms();
    struct String_vector kids = {0, NULL};
    int rc = dlock__zk_rq_children(zb, s->zh, q->path, &kids, deadline);
    bool found = false;
    for (int32_t i = 0; rc == ZOK && i < kids.count; i++) {
        const char *kid = kids.data[i];
        if (!dlock__zk_node_has_guid(kid, q->guid) || (q->keep && strcmp(kid, q->keep) == 0))
            continue;
        found = true;
        char *path = dlock__sprintf("%s/%s", q->path, kid);
        int drc = path ? dlock__zk_rq_delete(zb, s->zh, path, deadline) : ZSYSTEMERROR;
        if (drc != ZOK && drc != ZNONODE)
            rc = drc;
        free(path);
    }
    deallocate_String_vector(&kids);
    if (dlock__zk_rc_session_gone(rc))
        return DLOCK_OK;
    if (rc != ZOK && rc != ZNONODE)
        return dlock__zk_fail(zb, rc, "sweep", q->path);
    if (found || issued - q->added < zb->c->opts.op_timeout_ms)
        return dlock__err(DLOCK_EBUSY, "%s: create of %s under %s may still be in flight",
                          zb->servers, q->guid, q->path);
    return DLOCK_OK;
}

void dlock__zk_suspect_add(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
                           const char *guid, const char *keep)
{
    struct zk_owed *q = owed_new(s, "list", lockpath);
    if (!q || (keep && !(q->keep = dlock__strdup(keep)))) {
        if (q)
            owed_free(q);
        return;
    }
    q->work = suspect_sweep;
    snprintf(q->guid, sizeof q->guid, "%s", guid);
    q->added = dlock__now_ms();
    owe(zb, q, "sweep for our guid");
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
    bool usable = dlock__zk_session_usable(s),
         connected = usable && s->state == ZOO_CONNECTED_STATE;
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

int64_t dlock__zk_give_up_deadline(const struct dlock__wait *w, int err)
{
    return err == DLOCK_ECANCELED ? dlock__now_ms() : dlock__wait_deadline(w);
}

void dlock__zk_give_back_node(struct zk_backend *zb, struct zk_session *s, const char *path,
                              struct dlock__wait *w, int err)
{
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    dlock__zk_delete_own_node_by(zb, s, path, dlock__zk_give_up_deadline(w, err),
                                 err == DLOCK_ECANCELED ? NULL : w);
    dlock__errmsg_restore(err, msg);
}
