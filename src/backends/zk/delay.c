/* delay.c -- the ZooKeeper backend's lock-delay (?lock_delay=): a name
 * whose exclusive hold ended without a clean release is not granted again
 * until the delay has passed, timed by the servers' clock.
 *
 * A session's end runs no code and ZooKeeper has no timer a client may
 * rely on (TTL nodes need a server option), so the hold leaves a marker
 * that only its clean release removes: the persistent child
 * "_dlock_delay" of the lock node (no contender's mark: dlock skips it,
 * Curator sorts it after every sequence number, as "_dlock_value"), data
 * "<token> <delay ms> held". The contender that comes first in the queue
 * and finds it "held" knows that hold ended otherwise (its session
 * expired, a force release): it reads the servers' clock -- the mtime a
 * setData of the lock node gets, stamped by the leader -- and writes
 * "<token> <delay> running <that time>"; it then gives its node back and
 * waits. Every acquirer waits until that start plus the delay, by the
 * same clock read the same way; none by its own clock alone. The delay
 * runs from when a contender first finds the end: later than the
 * session's expiry, never earlier. The head that finds the delay over
 * deletes the marker, so a finished one does not stay under the name.
 */
#include "zk.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct marker {
    unsigned long long token;
    long long delay_ms, start_ms; /* START_MS: servers' ms; 0: held */
    bool found;
};

static char *delay_path(const char *lockpath)
{
    return dlock__sprintf("%s/" ZK_DELAY_NODE, lockpath);
}

static int read_marker(struct zk_backend *zb, struct zk_session *s, const char *path,
                       struct marker *m)
{
    char *data = NULL;
    struct Stat st = {0};
    memset(m, 0, sizeof *m);
    int zrc = dlock__zk_rq_get(zb, s->zh, path, &data, &st, DLOCK__NEVER);
    if (zrc != ZOK && zrc != ZNONODE) {
        free(data);
        return dlock__zk_fail(zb, zrc, "read the lock-delay marker", path);
    }
    char state[16] = "";
    if (zrc == ZOK && data && st.dataLength > 0 &&
        sscanf(data, "%llu %lld %15s %lld", &m->token, &m->delay_ms, state, &m->start_ms) >= 3 &&
        m->delay_ms > 0)
        m->found = true;
    if (strcmp(state, "running") != 0)
        m->start_ms = 0;
    free(data);
    return DLOCK_OK;
}

/* The servers' clock now, in ms: the mtime the leader stamps on a setData
 * of the lock node (its own data, which no layout reads). */
static int servers_now(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
                       int64_t *now)
{
    struct Stat st = {0};
    int zrc = dlock__zk_rq_set(zb, s->zh, lockpath, "", &st, DLOCK__NEVER);
    if (zrc != ZOK)
        return dlock__zk_fail(zb, zrc, "read the servers' clock (setData)", lockpath);
    *now = st.mtime;
    return DLOCK_OK;
}

int dlock__zk_delay_look(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
                         enum zk_delay_look how, int64_t *left)
{
    char *path = delay_path(lockpath);
    if (!path)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    struct marker m;
    int64_t now = 0;
    *left = 0;
    int rc = read_marker(zb, s, path, &m);
    if (!rc && m.found && !m.start_ms && how == ZK_DELAY_SHOW)
        *left = m.delay_ms; /* the whole delay, not started */
    else if (!rc && m.found && (m.start_ms || how == ZK_DELAY_START))
        rc = servers_now(zb, s, lockpath, &now);
    if (!rc && m.found && !m.start_ms && how == ZK_DELAY_START) {
        /* its hold ended without its clean release, found now */
        char *data = dlock__sprintf("%llu %lld running %lld", m.token, m.delay_ms, (long long)now);
        int zrc = data ? dlock__zk_rq_set(zb, s->zh, path, data, NULL, DLOCK__NEVER) : ZSYSTEMERROR;
        free(data);
        if (zrc != ZOK)
            rc = dlock__zk_fail(zb, zrc, "start the lock-delay", path);
        m.start_ms = now;
    }
    if (!rc && m.found && m.start_ms) {
        int64_t end = m.start_ms + m.delay_ms;
        *left = end > now ? end - now : 0;
        if (*left > m.delay_ms)
            *left = m.delay_ms; /* a clock stepped back: never more than the delay */
    }
    if (!rc && m.found && m.start_ms && !*left && how == ZK_DELAY_START) {
        /* over: the marker goes, so a name keeps no finished one. Only
         * the queue's head starts or ends a delay and nobody holds before
         * it, so no newer marker can be there; a failed delete leaves a
         * finished one, deleted by the next head (logged) */
        int zrc = dlock__zk_rq_delete(zb, s->zh, path, DLOCK__NEVER);
        if (zrc != ZOK && zrc != ZNONODE)
            dlock__log(zb->c, DLOCK_LOG_DEBUG, "%s: the finished lock-delay marker %s stays: %s",
                       zb->servers, path, zerror(zrc));
    }
    free(path);
    return rc;
}

int dlock__zk_delay_arm(struct zk_backend *zb, const struct dlock__hold *h, const char *lockpath)
{
    struct zk_session *s;
    int rc = dlock__zk_hold_session(zb, h, &s);
    if (rc)
        return rc;
    char *path = delay_path(lockpath);
    char *data =
        dlock__sprintf("%" PRIu64 " %lld held", h->token, (long long)zb->c->opts.lock_delay_ms);
    int zrc =
        path && data ? dlock__zk_rq_set(zb, s->zh, path, data, NULL, DLOCK__NEVER) : ZSYSTEMERROR;
    if (zrc == ZNONODE)
        zrc = dlock__zk_rq_create(zb, s->zh, path, data, 0, NULL, NULL, DLOCK__NEVER);
    if (zrc == ZNODEEXISTS) /* made meanwhile: ours to overwrite, we hold */
        zrc = dlock__zk_rq_set(zb, s->zh, path, data, NULL, DLOCK__NEVER);
    if (zrc != ZOK)
        rc = dlock__zk_fail(zb, zrc, "write the lock-delay marker", path ? path : lockpath);
    dlock__zk_session_put(zb, s);
    free(data);
    free(path);
    return rc;
}

void dlock__zk_delay_clear(struct zk_backend *zb, const char *lockpath, uint64_t token)
{
    struct zk_session *s;
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    char *path = delay_path(lockpath);
    struct marker m;
    /* A failure leaves the marker: the next acquirer waits a delay it did
     * not need to, never the other way round. */
    if (path && dlock__zk_session_get(zb, &s) == DLOCK_OK) {
        if (read_marker(zb, s, path, &m) == DLOCK_OK && m.found && m.token == token && !m.start_ms)
            dlock__zk_rq_delete(zb, s->zh, path, DLOCK__NEVER);
        dlock__zk_session_put(zb, s);
    }
    free(path);
    dlock__errmsg_restore(DLOCK_OK, msg);
}
