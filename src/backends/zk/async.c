/* async.c -- the recipe's wait cut into attempts for the core's
 * asynchronous acquire (src/async.c), which parks the wait between them
 * so no thread sleeps in it.
 *
 * It is mutex.c's wait (dlock__zk_acquire_at, and zk_acquire's
 * lock-delay) turned inside out. The first attempt registers the wait
 * among the backend's waiters (a session event wakes them all, the
 * deletion of the node one watches wakes that one), creates our
 * sequential node and looks where it stands. Not first, it leaves an
 * exists watch on the node it waits for and parks with its node kept:
 * its place in line stays while no thread waits. With few nodes ahead
 * it watches them all and counts their deletions down (ahead.c, as the
 * blocking wait does): the release's event alone makes it first, and
 * it holds without a request (or the watches' replies, when the nodes
 * ahead went before them: the attempt that sent them reads the count
 * too, as no event will come). Else it watches the node just before
 * ours; that event reaches the parked wait through the session watcher
 * (dlock__waitset_wake_key, then dlock__wait_wake), and the woken
 * attempt looks again (one listing, and the watches ahead) only when it
 * must: an event for the watched node came, the watch could not be set,
 * or a session timeout passed since it was (the blocking wait's safety
 * net for a lost event); a wake for anything else (a session event the
 * same session survived) sends nothing. A disconnect is an outage the
 * core rides out until the wait's end (dlock__wait_outage), as the
 * blocking wait does (the reconnection wakes it sooner than the core's
 * backoff); a session that ended takes our node with it and a new one
 * is queued; a connection not back within the connect timeout ends the
 * wait. disarm() forgets the watch (the wait leaves the set: the event,
 * if it comes, wakes nobody) and gives our node back when the acquire
 * did not succeed.
 *
 * A campaign (h->elect) is the same wait with a LeaderLatch node holding
 * the campaign's value, and no lock-delay, as dlock__zk_elect_acquire; a
 * semaphore's Curator mutex (semaphore.c) is the same wait on a lock
 * path of its own (dlock__zk_park_at), with no lock-delay either.
 */
#include "zk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A wait whose watch could not be set looks again this long after. */
#define UNWATCHED_LOOK_MS 200
/* Looks one attempt makes at most while our node vanishes (its session
 * ended, a force-release) or the node ahead goes before its watch is
 * set; then it parks briefly and the next attempt goes on. */
#define AGAIN_MAX 4

struct zk_park {
    char *lockpath;
    const char *mark;     /* the kind of node we queue (dlock__zk_mark) */
    bool bare;            /* the recipe alone, no lock-delay (a campaign,
                             a semaphore's mutex) */
    struct zk_session *s; /* the session NODE lives in (a reference) */
    char *node;           /* our contender node; NULL: none queued */
    int64_t czxid;
    char *pred;               /* the node we wait for: our key among the waiters */
    struct zk_ahead *ahead;   /* or the watches on every node ahead (ahead.c) */
    bool watching;            /* an exists watch on PRED stands */
    uint64_t watch_seq;       /* the node events seen before it was set */
    int64_t look_at;          /* look again by then, event or not */
    int64_t delay_until;      /* a lock-delay runs: no node before then */
    int64_t down_since;       /* not connected since (0: connected) */
    char why[DLOCK__MSG_MAX]; /* our node vanished while waiting, "" not */
};

/* Whether S is still the client's session (the nodes it made live) and,
 * in *CONNECTED, whether it is connected now. */
static bool session_live(struct zk_backend *zb, struct zk_session *s, bool *connected)
{
    pthread_mutex_lock(&zb->mu);
    bool live = zb->cur == s && dlock__zk_session_usable(s);
    *connected = live && s->state == ZOO_CONNECTED_STATE;
    pthread_mutex_unlock(&zb->mu);
    return live;
}

/* Stop waiting for P->pred (W's key goes first: the set borrows it) or
 * counting the nodes ahead (before our node goes: it is borrowed). */
static void unwatch(struct zk_backend *zb, struct zk_park *p, struct dlock__wait *w)
{
    dlock__zk_ahead_free(zb, p->ahead);
    p->ahead = NULL;
    dlock__waitset_set_key(&zb->waiters, w, NULL);
    free(p->pred);
    p->pred = NULL;
    p->watching = false;
}

/* Our node is gone (with its session, or deleted by someone): forget it,
 * and the session too when that ended. */
static void node_gone(struct zk_backend *zb, struct zk_park *p, struct dlock__wait *w,
                      bool session_ended)
{
    unwatch(zb, p, w);
    free(p->node);
    p->node = NULL;
    if (session_ended && p->s) {
        dlock__zk_session_put(zb, p->s);
        p->s = NULL;
    }
}

/* A session for P's next node: the current one when connected. Not
 * connected: an outage the core rides out, until no connection came for the connect
 * timeout (DLOCK_ECONN), as the blocking wait's wait for one does. */
static int session_for_node(struct zk_backend *zb, struct zk_park *p, struct dlock__wait *w)
{
    int err = dlock__zk_session_get_now(zb, &p->s);
    int64_t now = dlock__now_ms();
    if (!err)
        p->down_since = 0;
    if (err != DLOCK_ECONN)
        return err;
    if (!p->down_since)
        p->down_since = now;
    else if (now - p->down_since >= zb->c->opts.connect_timeout_ms)
        return dlock__err(err, "%s: no connection within %lld ms (%s)", zb->servers,
                          (long long)zb->c->opts.connect_timeout_ms, dlock_errmsg());
    return dlock__wait_outage(w);
}

/* Our node came first: H holds on it (LOOK the listing that said so,
 * SENT when it was asked), unless the name is in its lock-delay, which
 * gives the node back and waits for the delay's end (busy). */
static int first_in_line(struct zk_backend *zb, struct dlock__hold *h, struct dlock__wait *w,
                         struct zk_park *p, const struct zk_queue_look *look, int64_t sent)
{
    struct zk_first first = {.node = &p->node,
                             .czxid = p->czxid,
                             .sent = sent,
                             .marker = look->out.marker};
    int err = dlock__zk_hold_on(zb, p->s, h, &first);
    if (err)
        return err; /* the node stays ours: disarm() gives it back */
    if (p->bare)
        return DLOCK_OK; /* no lock-delay */
    int64_t left;
    err = dlock__zk_delay_first(zb, h, p->lockpath, &left);
    if (!err && left > 0) { /* our place is lost: queue anew after it */
        dlock__wait_in_delay(w, left);
        p->delay_until = dlock__now_ms() + left;
        dlock__wait_retry_at(w, p->delay_until);
        return DLOCK_EBUSY;
    }
    return err ? err : dlock__zk_delay_held(zb, h, p->lockpath);
}

/* Wait for LOOK's node ahead of ours: an exists watch on it, W keyed by
 * it. Busy with the next look's time; a node already gone: *AGAIN. */
static int watch_ahead(struct zk_backend *zb, struct dlock__wait *w, struct zk_park *p,
                       struct zk_queue_look *look, bool *again)
{
    p->pred = look->out.pred;
    look->out.pred = NULL;
    dlock__waitset_set_key(&zb->waiters, w, p->pred);
    uint64_t seq = dlock__zk_node_event_seq(zb); /* events from here on count */
    struct Stat st;
    int rc = dlock__zk_rq_exists(zb, p->s->zh, p->pred, dlock__zk_watcher, p->s, &st,
                                 dlock__wait_deadline(w));
    *again = rc == ZNONODE;
    if (rc == ZNONODE)
        return DLOCK_OK;
    if (rc != ZOK && !dlock__zk_rc_transient(rc) && !dlock__zk_rc_session_gone(rc))
        return dlock__zk_fail(zb, rc, "watch", p->pred);
    pthread_mutex_lock(&zb->mu); /* the watcher writes it on each connect */
    int64_t timeout = p->s->timeout_ms > 0 ? p->s->timeout_ms : zb->c->opts.lease_ms;
    pthread_mutex_unlock(&zb->mu);
    p->watching = rc == ZOK;
    p->watch_seq = seq;
    p->look_at = dlock__now_ms() + (p->watching ? timeout : UNWATCHED_LOOK_MS);
    p->why[0] = 0;
    dlock__wait_retry_at(w, p->look_at);
    return DLOCK_EBUSY;
}

/* Few nodes ahead (SORTED, the look's lock nodes; no lock-delay marker
 * listed): watch them all and count their deletions down (ahead.c), so
 * the release's event alone makes ours first. True when P counts (busy,
 * parked until the count ends or a session timeout passed); false: the
 * caller watches the node just before ours instead. */
static bool count_ahead(struct zk_backend *zb, struct dlock__wait *w, struct zk_park *p,
                        const struct zk_queue_look *look, struct String_vector *sorted)
{
    if (look->out.marker || !sorted->count)
        return false;
    struct zk_ahead_view v = {.lockpath = p->lockpath,
                              .mine = p->node,
                              .kids = sorted->data,
                              .pos = look->out.pos};
    p->ahead = dlock__zk_ahead_watch(zb, p->s, &v, w, dlock__wait_deadline(w));
    if (p->ahead && dlock__zk_ahead_state(zb, p->ahead) == ZK_AHEAD_LOOK) {
        dlock__zk_ahead_free(zb, p->ahead); /* spoiled at once: the old way */
        p->ahead = NULL;
    }
    if (!p->ahead)
        return false;
    pthread_mutex_lock(&zb->mu);
    int64_t timeout = p->s->timeout_ms > 0 ? p->s->timeout_ms : zb->c->opts.lease_ms;
    pthread_mutex_unlock(&zb->mu);
    p->look_at = dlock__now_ms() + timeout;
    p->why[0] = 0;
    dlock__wait_retry_at(w, p->look_at);
    return true;
}

/* Where P's count of the nodes ahead stands: nodes left (busy, parked
 * until an event or P->look_at), none left and ours first (H holds on
 * it, with no request), or a look owed (*LOOK: the count spoiled, or no
 * word for a session timeout; the watches are dropped). The attempt that
 * set the watches reads it too: a node ahead that went before its watch
 * reached the server is counted by the watch's reply (no node), and no
 * event will wake the parked wait for it. */
static int count_read(struct zk_backend *zb, struct dlock__hold *h, struct dlock__wait *w,
                      struct zk_park *p, bool *look)
{
    *look = false;
    enum zk_ahead_state state = dlock__zk_ahead_state(zb, p->ahead);
    if (state == ZK_AHEAD_WAITING && dlock__now_ms() < p->look_at) {
        dlock__wait_retry_at(w, p->look_at);
        return DLOCK_EBUSY;
    }
    int64_t sent = p->ahead->sent;
    unwatch(zb, p, w);
    if (state != ZK_AHEAD_FIRST) {
        *look = true;
        return DLOCK_EBUSY;
    }
    struct zk_queue_look counted = {.out.pos = 0, .out.marker = false};
    return first_in_line(zb, h, w, p, &counted, sent);
}

/* One pass: a session, our node (made when there is none), where it
 * stands, and the hold or the watch. *AGAIN: look again at once (our
 * node vanished, or the node ahead went before its watch was set). */
static int look_once(struct zk_backend *zb, struct dlock__hold *h, struct dlock__wait *w,
                     struct zk_park *p, bool *again)
{
    *again = false;
    if (!p->s) {
        int err = session_for_node(zb, p, w);
        if (err)
            return err;
    }
    struct String_vector listed = {0, NULL}; /* along with our create */
    int64_t sent = dlock__now_ms();
    if (!p->node) {
        struct zk_contender rq = {.lockpath = p->lockpath,
                                  .mark = p->mark,
                                  .data = h->elect ? h->elect->value : NULL,
                                  .kids = &listed,
                                  .once = true};
        int err = dlock__zk_create_contender(zb, p->s, &rq, w);
        if (err) {
            deallocate_String_vector(&listed);
            bool outage = err == DLOCK_ECONN || err == DLOCK_ETIMEDOUT;
            return outage ? dlock__wait_outage(w) : err;
        }
        p->node = rq.out.node;
        p->czxid = rq.out.czxid;
    }
    unwatch(zb, p, w);
    struct String_vector sorted = {0, NULL};
    struct zk_queue_look look = {.lockpath = p->lockpath,
                                 .mine = p->node,
                                 .given = &listed,
                                 .keep = &sorted,
                                 .until = dlock__wait_deadline(w)};
    int rc = dlock__zk_queue_position(zb, p->s, &look);
    deallocate_String_vector(&listed);
    free(look.out.holder);
    int err = DLOCK_EBUSY;
    if (rc == ZNONODE || dlock__zk_rc_session_gone(rc)) { /* queue a new one */
        dlock__err(DLOCK_ECONN, "%s: lock '%s': our node %s vanished while waiting", zb->servers,
                   h->name, p->node);
        snprintf(p->why, sizeof p->why, "%s", dlock_errmsg());
        *again = true;
        node_gone(zb, p, w, rc != ZNONODE);
    } else if (dlock__zk_rc_transient(rc)) {
        dlock__err(DLOCK_ECONN, "%s: lock '%s': disconnected: %s", zb->servers, h->name,
                   zerror(rc));
        err = dlock__wait_outage(w);
    } else if (rc != ZOK) {
        err = dlock__zk_fail(zb, rc, "list", p->lockpath);
    } else if (look.out.pos == 0) {
        err = first_in_line(zb, h, w, p, &look, sent);
    } else if (count_ahead(zb, w, p, &look, &sorted)) {
        err = count_read(zb, h, w, p, again);
    } else {
        err = watch_ahead(zb, w, p, &look, again);
    }
    deallocate_String_vector(&sorted);
    free(look.out.pred);
    return err;
}

/* Whether nothing the wait watches has changed since its last look: the
 * same session, connected, its watch standing, no event for the node
 * ahead, and the look's safety-net time not reached. */
static bool nothing_new(struct zk_backend *zb, struct zk_park *p)
{
    return p->watching && dlock__now_ms() < p->look_at &&
           !dlock__zk_node_event_since(zb, p->pred, p->watch_seq);
}

static int attempt(struct zk_backend *zb, struct dlock__hold *h, struct dlock__wait *w,
                   struct zk_park *p)
{
    if (dlock__now_ms() < p->delay_until) {
        dlock__wait_retry_at(w, p->delay_until);
        return DLOCK_EBUSY;
    }
    bool connected = false;
    if (p->s && !session_live(zb, p->s, &connected))
        node_gone(zb, p, w, true); /* its nodes went with it */
    if (p->s && !connected) {      /* the same session, reconnecting: its watch stays */
        dlock__err(DLOCK_ECONN, "%s: lock '%s': disconnected while waiting", zb->servers, h->name);
        return dlock__wait_outage(w);
    }
    if (p->ahead) { /* counting the nodes ahead down */
        bool look;
        int err = count_read(zb, h, w, p, &look);
        if (!look)
            return err;
    } else if (p->s && nothing_new(zb, p)) {
        p->why[0] = 0;
        dlock__wait_retry_at(w, p->look_at);
        return DLOCK_EBUSY;
    }
    int err = DLOCK_EBUSY;
    bool again = true;
    for (int passes = 0; again && passes < AGAIN_MAX; passes++)
        err = look_once(zb, h, w, p, &again);
    if (again) { /* the queue keeps changing under us: anew a little later */
        dlock__wait_retry_at(w, dlock__now_ms() + ZK_RETRY_MAX_MS);
        err = DLOCK_EBUSY;
    }
    return err;
}

/* The first attempt's park at LOCKPATH (taken: freed on failure) with
 * MARK, BARE as in struct zk_park, into *PARK. */
static int park_new(struct zk_backend *zb, char *lockpath, const char *mark, bool bare,
                    struct dlock__wait *w, void **park)
{
    struct zk_park *p = lockpath ? calloc(1, sizeof *p) : NULL;
    if (!p) {
        free(lockpath);
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    }
    p->lockpath = lockpath;
    p->mark = mark;
    p->bare = bare;
    /* registered before anything is sent: a session event or the
     * deletion of the node ahead from now on is a wake */
    int err = dlock__waitset_add(&zb->waiters, w);
    if (err) {
        free(p->lockpath);
        free(p);
        return err;
    }
    *park = p;
    return DLOCK_OK;
}

int dlock__zk_try_armed(void *state, struct dlock__hold *h, struct dlock__wait *w, void **park)
{
    struct zk_backend *zb = state;
    if (!*park) {
        const char *mark = h->elect ? ZK_LATCH_MARK : dlock__zk_mark(zb, h->mode);
        int err = park_new(zb, dlock__zk_lock_path(zb, h->name), mark, h->elect != NULL, w, park);
        if (err)
            return err;
    }
    return attempt(zb, h, w, *park);
}

int dlock__zk_park_at(struct zk_backend *zb, const char *lockpath, const char *mark,
                      struct dlock__hold *h, struct dlock__wait *w, void **park)
{
    if (!*park) {
        int err = park_new(zb, dlock__strdup(lockpath), mark, true, w, park);
        if (err)
            return err;
    }
    return attempt(zb, h, w, *park);
}

int dlock__zk_disarm(void *state, struct dlock__hold *h, struct dlock__wait *w, void *park, int rc)
{
    struct zk_backend *zb = state;
    struct zk_park *p = park;
    if (!p)
        return rc;
    dlock__zk_ahead_free(zb, p->ahead);
    dlock__waitset_remove(&zb->waiters, w); /* the watch's event wakes nobody now */
    if (rc == DLOCK_ETIMEDOUT && p->why[0]) /* as the blocking wait words it */
        rc = dlock__err(rc, "%s: lock '%s': timed out waiting (%s)", zb->servers, h->name, p->why);
    else if (rc == DLOCK_ETIMEDOUT && p->pred)
        rc = dlock__err(rc, "%s: lock '%s': timed out waiting behind node %s", zb->servers, h->name,
                        p->pred);
    if (rc != DLOCK_OK && p->node && p->s)
        dlock__zk_give_back_node(zb, p->s, p->node, w, rc);
    if (p->s)
        dlock__zk_session_put(zb, p->s);
    free(p->node);
    free(p->pred);
    free(p->lockpath);
    free(p);
    return rc;
}
