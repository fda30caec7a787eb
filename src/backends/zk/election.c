/* election.c -- the ZooKeeper backend's leader election, on the node
 * layout of Curator's LeaderLatch, so Curator services and dlock share an
 * election.
 *
 * LeaderLatch on path P creates an EPHEMERAL_SEQUENTIAL child
 * "_c_<uuid>-latch-<seq>" (protected mode) whose data is the
 * participant's id, and leads while its child has the lowest sequence;
 * the others watch their predecessor. That is the mutex's recipe
 * (mutex.c, dlock__zk_acquire_at) with the mark "latch-" and the campaign's
 * value as the node's data, so a campaign is that acquire and resign its
 * release. The lock node of election NAME is lock NAME's, and the two
 * kinds of children share one queue, as an election and a lock of one
 * name do on every backend of dlock (Curator keeps them apart: use one
 * name for one purpose). The token is the leader node's czxid.
 *
 * Added here: proclaim (a setData on the leader's own node: LeaderLatch
 * has none, Curator reads the id again with getData) and observe (the
 * children with a child watch; the first one's data and stat, with a data
 * watch on it that a proclaim or its deletion fires).
 */
#include "zk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dlock__zk_elect_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
{
    struct zk_backend *zb = state;
    char *lockpath = dlock__zk_lock_path(zb, h->name);
    if (!lockpath)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    int rc = dlock__zk_acquire_at(zb, lockpath, ZK_LATCH_MARK, h, w);
    free(lockpath);
    return rc;
}

int dlock__zk_elect_proclaim(void *state, struct dlock__hold *h, const char *value)
{
    struct zk_backend *zb = state;
    struct zk_hold *zh = h->bdata;
    struct zk_session *s = zh ? dlock__zk_session_of_hold(zb, zh) : NULL;
    if (!s) {
        char why[512];
        snprintf(why, sizeof why, "%s: the session that held election '%s' ended", zb->servers,
                 h->name);
        dlock__hold_lost(zb->c, h, why);
        return dlock__err(DLOCK_ELOST, "election '%s': leadership was lost: %s", h->name, why);
    }
    int rc = dlock__zk_rq_set(zb, s->zh, zh->path, value, NULL, DLOCK__NEVER);
    dlock__zk_session_put(zb, s);
    if (rc == ZNONODE) {
        char why[512];
        snprintf(why, sizeof why, "%s: node %s is gone", zb->servers, zh->path);
        dlock__hold_lost(zb->c, h, why);
        return dlock__err(DLOCK_ELOST, "election '%s': leadership was lost: %s", h->name, why);
    }
    return rc == ZOK ? DLOCK_OK : dlock__zk_fail(zb, rc, "proclaim on", zh->path);
}

/* One look at LOCKPATH's first child (leaving a child watch), into OUT.
 * A ZooKeeper code; ZNONODE for a lock node that does not exist (yet). */
static int look(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
                struct dlock__wait *w, struct dlock_leader *out, char **leader_path, int64_t until)
{
    free(out->value);
    memset(out, 0, sizeof *out);
    struct String_vector kids = {0, NULL};
    int rc = dlock__zk_rq_children_watch(zb, s->zh, lockpath, dlock__zk_watcher, s, &kids, until);
    if (rc != ZOK)
        return rc;
    dlock__zk_sort_lock_nodes(&kids);
    if (kids.count > 0) {
        char *path = dlock__sprintf("%s/%s", lockpath, kids.data[0]);
        char *data = NULL;
        struct Stat st;
        memset(&st, 0, sizeof st);
        /* A data watch on the leader's node (a proclaim, its deletion),
         * set before its data is read, and our wait keyed by it. */
        if (path)
            dlock__waitset_set_key(&zb->waiters, w, path);
        rc = path ? dlock__zk_rq_exists(zb, s->zh, path, dlock__zk_watcher, s, &st, until)
                  : ZSYSTEMERROR;
        if (rc == ZOK)
            rc = dlock__zk_rq_get(zb, s->zh, path, &data, &st, until);
        if (rc == ZOK) {
            out->held = true;
            out->token = (uint64_t)st.czxid;
            out->version = (uint64_t)st.mzxid;
            out->value = data ? data : dlock__strdup("");
            snprintf(out->id, sizeof out->id, "%s", kids.data[0]);
        } else {
            free(data);
        }
        if (out->held) {
            *leader_path = path;
        } else {
            dlock__waitset_set_key(&zb->waiters, w, lockpath); /* before PATH goes */
            free(path);
        }
    }
    deallocate_String_vector(&kids);
    return rc;
}

int dlock__zk_elect_observe(void *state, const char *name, const struct dlock_leader *known,
                            struct dlock__wait *w, struct dlock_leader *out)
{
    struct zk_backend *zb = state;
    char *lockpath = dlock__zk_lock_path(zb, name);
    if (!lockpath)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    /* registered before the look: a change between it and the sleep wakes */
    int err = dlock__waitset_add(&zb->waiters, w);
    if (err) {
        free(lockpath);
        return err;
    }
    struct dlock__backoff backoff = DLOCK__OBSERVE_BACKOFF;
    struct zk_session *s = NULL;
    int64_t until = dlock__wait_deadline(w);
    char *watched = NULL; /* the leader's node, our wait's key meanwhile */
    for (;;) {
        unsigned seq = dlock__wait_seq(w);
        dlock__waitset_set_key(&zb->waiters, w, lockpath);
        free(watched); /* the key is lockpath's now */
        watched = NULL;
        err = DLOCK_OK;
        int rc = ZOK;
        if (!s) {
            if (!(err = dlock__zk_session_get_w(zb, &s, w)))
                continue; /* then look */
        } else if ((rc = look(zb, s, lockpath, w, out, &watched, until)) == ZNONODE) {
            /* No lock node (or the first child went between the listing
             * and the read): look again once something is created. */
            struct Stat st;
            rc = dlock__zk_rq_exists(zb, s->zh, lockpath, dlock__zk_watcher, s, &st, until);
            if (rc == ZOK)
                continue; /* created meanwhile */
            if (rc == ZNONODE)
                rc = ZOK; /* nobody leads; the exists watch wakes us */
        }
        if (rc != ZOK) {
            err = dlock__zk_fail(zb, rc, "observe", lockpath);
            if (dlock__zk_rc_session_gone(rc)) { /* a new session serves the next look */
                err = DLOCK_ECONN;               /* (with the failure's message) */
                dlock__zk_session_put(zb, s);
                s = NULL;
            }
        }
        if (dlock__observe_retry(known, w, &backoff, &err))
            continue; /* a server restarting, a session lost with it */
        if (err || dlock__observe_done(known, out, true, w, &err))
            break;
        pthread_mutex_lock(&zb->mu);
        int64_t timeout = s->timeout_ms > 0 ? s->timeout_ms : zb->c->opts.lease_ms;
        pthread_mutex_unlock(&zb->mu);
        if ((err = dlock__wait_sleep(w, seq, dlock__now_ms() + timeout)))
            break;
    }
    dlock__waitset_set_key(&zb->waiters, w, NULL);
    dlock__waitset_remove(&zb->waiters, w);
    free(watched);
    if (s)
        dlock__zk_session_put(zb, s);
    free(lockpath);
    return err;
}
