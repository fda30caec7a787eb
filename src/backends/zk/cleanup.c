/* cleanup.c -- nodes of ours that a lost reply may have left behind.
 *
 * An orphan is a node we failed to delete (the delete had no reply); a
 * suspect is a create whose reply never came, so a node "_c_<guid>-..."
 * may exist unseen. Either would sit in the lock's queue until the
 * session ends. Both are remembered and swept with asynchronous requests
 * on the next call and on every reconnection (from the watcher), so they
 * never outlive the next reconnection.
 */
#include "zk.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* -------------------------------------------------------------- suspects */

struct zk_sweep_call {
    struct zk_backend *zb;
    zhandle_t *zh;
    struct zk_suspect *sus; /* identity only: looked up again under mu */
    char *lockpath;
    char guid[37];
    char *keep;
    int64_t issued;
};

void zk_suspect_free(struct zk_suspect *q)
{
    free(q->lockpath);
    free(q->keep);
    free(q);
}

static void on_sweep_children(int rc, const struct String_vector *kids, const void *data)
{
    struct zk_sweep_call *w = (struct zk_sweep_call *)data;
    bool found = false;
    if (rc == ZOK && kids) {
        for (int32_t i = 0; i < kids->count; i++) {
            const char *kid = kids->data[i];
            if (!zk_node_has_guid(kid, w->guid) || (w->keep && strcmp(kid, w->keep) == 0))
                continue;
            found = true;
            char *path = dlock__sprintf("%s/%s", w->lockpath, kid);
            if (path)
                zoo_adelete(w->zh, path, -1, zk_on_ignored, NULL);
            free(path);
        }
    }
    struct zk_backend *zb = w->zb;
    pthread_mutex_lock(&zb->mu);
    for (struct zk_suspect **pp = &zb->suspects; *pp; pp = &(*pp)->next) {
        struct zk_suspect *q = *pp;
        if (q != w->sus)
            continue;
        bool settled = (rc == ZOK || rc == ZNONODE) && !found &&
                       w->issued - q->added >= zb->c->opts.op_timeout_ms;
        if (settled) {
            *pp = q->next;
            zk_suspect_free(q);
        }
        break;
    }
    pthread_mutex_unlock(&zb->mu);
    free(w->lockpath);
    free(w->keep);
    free(w);
}

/* Start a sweep of every suspect of session S (zb->mu held). Suspects of
 * other sessions are dropped: an ended session's nodes are gone. Async
 * only, so it may run from the watcher. */
static void zk_suspects_sweep_locked(struct zk_backend *zb, unsigned gen, zhandle_t *zh)
{
    int64_t now = dlock__now_ms();
    for (struct zk_suspect **pp = &zb->suspects; *pp;) {
        struct zk_suspect *q = *pp;
        if (q->gen != gen) {
            *pp = q->next;
            zk_suspect_free(q);
            continue;
        }
        pp = &q->next;
        struct zk_sweep_call *w = calloc(1, sizeof *w);
        if (!w)
            continue;
        w->zb = zb;
        w->zh = zh;
        w->sus = q;
        w->issued = now;
        memcpy(w->guid, q->guid, sizeof w->guid);
        w->lockpath = dlock__strdup(q->lockpath);
        w->keep = q->keep ? dlock__strdup(q->keep) : NULL;
        if (!w->lockpath || (q->keep && !w->keep) ||
            zoo_aget_children(zh, q->lockpath, 0, on_sweep_children, w) != ZOK) {
            free(w->lockpath);
            free(w->keep);
            free(w);
        }
    }
}

/* ---------------------------------------------------------------- orphans */

/* A delete of an orphan in flight. */
struct zk_unlink {
    struct zk_backend *zb;
    struct zk_orphan *o; /* identity only: looked up again under mu */
    char *path;
};

static void on_orphan_deleted(int rc, const void *data)
{
    struct zk_unlink *u = (struct zk_unlink *)data;
    struct zk_backend *zb = u->zb;
    /* Done unless the reply was lost: deleted, gone, or never possible. */
    if (!zk_rc_transient(rc) && rc != ZCLOSING) {
        pthread_mutex_lock(&zb->mu);
        for (struct zk_orphan **pp = &zb->orphans; *pp; pp = &(*pp)->next) {
            struct zk_orphan *o = *pp;
            if (o == u->o && strcmp(o->path, u->path) == 0) {
                *pp = o->next;
                free(o->path);
                free(o);
                break;
            }
        }
        pthread_mutex_unlock(&zb->mu);
    }
    free(u->path);
    free(u);
}

/* Send a delete for every orphan of session GEN (zb->mu held); drop the
 * others (an ended session's nodes are gone). Async only. */
static void zk_orphans_retry_locked(struct zk_backend *zb, unsigned gen, zhandle_t *zh)
{
    for (struct zk_orphan **pp = &zb->orphans; *pp;) {
        struct zk_orphan *o = *pp;
        if (o->gen != gen) {
            *pp = o->next;
            free(o->path);
            free(o);
            continue;
        }
        pp = &o->next;
        struct zk_unlink *u = calloc(1, sizeof *u);
        if (u) {
            u->zb = zb;
            u->o = o;
            u->path = dlock__strdup(o->path);
        }
        if (!u || !u->path || zoo_adelete(zh, o->path, -1, on_orphan_deleted, u) != ZOK) {
            if (u)
                free(u->path);
            free(u);
        }
    }
}

/* Retry what an earlier call could not finish: orphans and suspects of
 * session S (zb->mu held). Also run from the watcher on reconnection, so
 * a node we could not delete never outlives the next reconnection. */
void zk_sweep_locked(struct zk_backend *zb, struct zk_session *s)
{
    if (zb->orphans)
        zk_orphans_retry_locked(zb, s->gen, s->zh);
    if (zb->suspects)
        zk_suspects_sweep_locked(zb, s->gen, s->zh);
}

void zk_sweep(struct zk_backend *zb, struct zk_session *s)
{
    pthread_mutex_lock(&zb->mu);
    zk_sweep_locked(zb, s);
    pthread_mutex_unlock(&zb->mu);
}

/* Our node PATH could not be deleted (no reply): keep trying. */
void zk_orphan_add(struct zk_backend *zb, struct zk_session *s, const char *path)
{
    struct zk_orphan *o = calloc(1, sizeof *o);
    if (!o || !(o->path = dlock__strdup(path))) {
        free(o);
        return;
    }
    o->gen = s->gen;
    pthread_mutex_lock(&zb->mu);
    o->next = zb->orphans;
    zb->orphans = o;
    if (s->state == ZOO_CONNECTED_STATE)
        zk_sweep_locked(zb, s);
    pthread_mutex_unlock(&zb->mu);
}

/* Remember that a create of GUID under LOCKPATH may have left a node
 * other than KEEP, and sweep for it at once. */
void zk_suspect_add(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
                        const char *guid, const char *keep)
{
    struct zk_suspect *q = calloc(1, sizeof *q);
    if (!q || !(q->lockpath = dlock__strdup(lockpath)) ||
        (keep && !(q->keep = dlock__strdup(keep)))) {
        if (q)
            zk_suspect_free(q);
        return;
    }
    snprintf(q->guid, sizeof q->guid, "%s", guid);
    q->gen = s->gen;
    q->added = dlock__now_ms();
    pthread_mutex_lock(&zb->mu);
    q->next = zb->suspects;
    zb->suspects = q;
    zk_sweep_locked(zb, s);
    pthread_mutex_unlock(&zb->mu);
}

/* Delete our node PATH, retrying on disconnects up to the op timeout and
 * no later than UNTIL (see zk_rq_*); when that fails or no time is left,
 * remember it: the sweep deletes it asynchronously (at once when
 * connected), so a caller out of time never waits for it. */
void zk_delete_own_node(struct zk_backend *zb, struct zk_session *s, const char *path,
                        int64_t until)
{
    int64_t deadline = zk_call_deadline(zb, until);
    while (deadline) {
        int rc = zk_rq_delete(zb, s->zh, path, deadline);
        if (rc == ZOK || rc == ZNONODE || zk_rc_session_gone(rc))
            return;
        int64_t left = dlock__time_left(deadline, 50);
        if (!zk_rc_transient(rc) || left == 0)
            break;
        struct timespec pause = {0, (long)left * 1000000L};
        nanosleep(&pause, NULL);
    }
    zk_orphan_add(zb, s, path);
}
