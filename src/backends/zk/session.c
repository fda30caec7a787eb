/* session.c -- the ZooKeeper backend's session: one zhandle per client,
 * its watcher (connection states, expiry, wake-ups of waiters whose
 * predecessor went), the reconnection that starts a new session when the
 * last one expired, opening and closing the backend, and renewal (which
 * confirms that each hold's node still lives in the current session).
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

/* ---------------------------------------------------- client library log */

/* The C client logs connection errors ("Connection refused") through a
 * callback without context. We keep the last error line process-wide to
 * quote it in connect failures, and write everything to $DLOCK_ZK_LOG
 * when that is set; nothing goes to stderr. */
static pthread_mutex_t zk_log_mu = PTHREAD_MUTEX_INITIALIZER;
static char zk_log_last[256];

/* How often, at most, a connected session resolves its server names. */
#define ZK_RESOLVE_EVERY_MS 1000

/* The servers that refused a connection lately, as the client library
 * names them in its "Socket ADDR zk retcode=..., errno=111(...)" lines
 * (under zk_log_mu): an open whose every server refused fails at once
 * (zk_all_refused_since), as a Redis one does, instead of letting the
 * client library retry until the connect timeout. */
#define ZK_REFUSALS 16
static struct {
    char addr[80]; /* "127.0.0.1:2181" */
    int64_t at;    /* monotonic ms */
} zk_refused[ZK_REFUSALS];
static unsigned zk_refused_next;

/* Note a refusal TEXT tells of (zk_log_mu held). */
static void zk_note_refusal(const char *text)
{
    char refused[32];
    snprintf(refused, sizeof refused, "errno=%d(", ECONNREFUSED);
    if (strncmp(text, "Socket ", 7) != 0 || !strstr(text, refused))
        return;
    const char *addr = text + 7;
    size_t len = strcspn(addr, " ");
    unsigned k = 0;
    while (k < ZK_REFUSALS && !(strlen(zk_refused[k].addr) == len &&
                                strncmp(zk_refused[k].addr, addr, len) == 0))
        k++; /* the same server again (the library retries in a loop) */
    if (k == ZK_REFUSALS) {
        k = zk_refused_next++ % ZK_REFUSALS;
        snprintf(zk_refused[k].addr, sizeof zk_refused[k].addr, "%.*s", (int)len, addr);
    }
    zk_refused[k].at = dlock__now_ms();
}

/* Whether every server of ZB's connect string ("h1:p1,h2:p2[/chroot]")
 * refused a connection at SINCE or later. A server named by a host name
 * is never matched (the library names addresses): such an open waits
 * for its connect timeout, as before. */
static bool zk_all_refused_since(const struct zk_backend *zb, int64_t since)
{
    bool all = true;
    pthread_mutex_lock(&zk_log_mu);
    for (const char *h = zb->connect; all && *h && *h != '/';) {
        size_t len = strcspn(h, ",/");
        bool found = false;
        for (unsigned k = 0; k < ZK_REFUSALS && !found; k++)
            found = zk_refused[k].at >= since && strlen(zk_refused[k].addr) == len &&
                    strncmp(zk_refused[k].addr, h, len) == 0;
        all = found;
        h += len;
        if (*h == ',')
            h++;
    }
    pthread_mutex_unlock(&zk_log_mu);
    return all;
}

static void zk_log(const char *message)
{
    const char *file = getenv("DLOCK_ZK_LOG");
    if (file && *file) {
        FILE *f = fopen(file, "a");
        if (f) {
            fprintf(f, "%s\n", message);
            fclose(f);
        }
    }
    if (!strstr(message, "ZOO_ERROR"))
        return;
    /* Keep what follows the "func@line: " header. */
    const char *text = message;
    const char *at = strstr(message, "ZOO_ERROR@");
    if (at) {
        const char *colon = strstr(at, ": ");
        if (colon)
            text = colon + 2;
    }
    pthread_mutex_lock(&zk_log_mu);
    zk_note_refusal(text);
    snprintf(zk_log_last, sizeof zk_log_last, "%s", text);
    size_t n = strlen(zk_log_last);
    while (n && (zk_log_last[n - 1] == '\n' || zk_log_last[n - 1] == ' '))
        zk_log_last[--n] = 0;
    pthread_mutex_unlock(&zk_log_mu);
}

static void zk_log_take(char *buf, size_t size)
{
    pthread_mutex_lock(&zk_log_mu);
    snprintf(buf, size, "%s", zk_log_last);
    zk_log_last[0] = 0;
    pthread_mutex_unlock(&zk_log_mu);
}

/* -------------------------------------------------------------- sessions */

/* Session S, the current one, has ended (STATE: expired, or its
 * authentication failed): every hold of it is gone, so tell the core now
 * instead of at the next renewal, up to lease/3 later (zb->mu held).
 * Every hold of the client belongs to S or to an earlier session, whose
 * holds are lost already: a new session starts only when the current one
 * is unusable, under zb->mu. dlock__hold_lost() takes the client's mutex
 * and lets the core run the callbacks elsewhere: safe from the client
 * library's event thread, as the core never calls the backend, nor waits
 * for this thread, with that mutex held (lock order: zb->mu, then the
 * client's). */
static void session_lost_locked(struct zk_backend *zb, struct zk_session *s, int state)
{
    char why[DLOCK__WHY_MAX];
    if (state == ZOO_EXPIRED_SESSION_STATE)
        snprintf(why, sizeof why, "%s: the ZooKeeper session 0x%llx holding it expired",
                 zb->servers, (unsigned long long)s->session_id);
    else
        snprintf(why, sizeof why,
                 "%s: the ZooKeeper session 0x%llx holding it failed to authenticate",
                 zb->servers, (unsigned long long)s->session_id);
    dlock__hold_lost(zb->c, NULL, why);
}

/* Node events kept (the oldest half is dropped when full; a hold last
 * checked before a dropped one is checked again): bounded memory while
 * waiters' watches fire and nothing is renewed. */
#define ZK_NODE_EVENTS_MAX 4096

static uint64_t path_hash(const char *path)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)path; *p; p++)
        h = (h ^ *p) * 1099511628211ULL;
    return h;
}

/* The watcher saw an event for the node at PATH (zb->mu held). */
static void note_node_event_locked(struct zk_backend *zb, const char *path)
{
    if (!zb->node_events) {
        zb->node_events = malloc(ZK_NODE_EVENTS_MAX * sizeof *zb->node_events);
        if (!zb->node_events) { /* count it as dropped */
            zb->node_events_forgot = ++zb->node_event_seq;
            return;
        }
    }
    if (zb->n_node_events == ZK_NODE_EVENTS_MAX) {
        size_t half = ZK_NODE_EVENTS_MAX / 2;
        zb->node_events_forgot = zb->node_events[half - 1].seq;
        memmove(zb->node_events, zb->node_events + half,
                (ZK_NODE_EVENTS_MAX - half) * sizeof *zb->node_events);
        zb->n_node_events -= half;
    }
    zb->node_events[zb->n_node_events++] =
        (struct zk_node_event){path_hash(path), ++zb->node_event_seq};
}

uint64_t dlock__zk_node_event_seq(struct zk_backend *zb)
{
    pthread_mutex_lock(&zb->mu);
    uint64_t seq = zb->node_event_seq;
    pthread_mutex_unlock(&zb->mu);
    return seq;
}

bool dlock__zk_node_event_since(struct zk_backend *zb, const char *path, uint64_t since)
{
    uint64_t hash = path_hash(path);
    pthread_mutex_lock(&zb->mu);
    bool seen = since < zb->node_events_forgot;
    for (size_t i = zb->n_node_events; !seen && i-- > 0 && zb->node_events[i].seq > since;)
        seen = zb->node_events[i].hash == hash;
    pthread_mutex_unlock(&zb->mu);
    return seen;
}

/* Watcher of the session and of predecessor nodes: CTX is the session. */
void dlock__zk_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    struct zk_session *s = ctx;
    (void)zh;
    if (!s)
        return;
    struct zk_backend *zb = s->zb;
    pthread_mutex_lock(&zb->mu);
    if (zb->closing) { /* the client may be gone: nobody is left to tell */
        pthread_mutex_unlock(&zb->mu);
        return;
    }
    if (type == ZOO_SESSION_EVENT) {
        if (state == ZOO_CONNECTED_STATE && s->session_id) /* connected before */
            dlock__reconnected(zb->c, "zk session 0x%llx: reconnected", (unsigned long long)s->session_id);
        else if (state == ZOO_CONNECTING_STATE && s->state == ZOO_CONNECTED_STATE)
            dlock__log(zb->c, DLOCK_LOG_WARN, "zk session 0x%llx: disconnected, reconnecting",
                       (unsigned long long)s->session_id);
        s->state = state;
        if (state == ZOO_CONNECTED_STATE) {
            dlock__zk_fds_cloexec_sockets(zb->ports, zb->nports);
            const clientid_t *id = zoo_client_id(s->zh);
            s->session_id = id ? id->client_id : 0;
            s->timeout_ms = zoo_recv_timeout(s->zh);
        } else if (state == ZOO_EXPIRED_SESSION_STATE || state == ZOO_AUTH_FAILED_STATE) {
            bool was_usable = dlock__zk_session_usable(s);
            s->expired |= state == ZOO_EXPIRED_SESSION_STATE;
            s->auth_failed |= state == ZOO_AUTH_FAILED_STATE;
            if (was_usable && zb->cur == s)
                session_lost_locked(zb, s, state);
        }
        pthread_cond_broadcast(&zb->cv);
        dlock__zk_ahead_event_locked(zb, s, type, NULL);
        dlock__waitset_wake_all(&zb->waiters); /* let them look at the new state */
    } else if (path) {
        dlock__zk_ahead_event_locked(zb, s, type, path);
        dlock__waitset_wake_key(&zb->waiters, path);
        note_node_event_locked(zb, path);
    }
    pthread_mutex_unlock(&zb->mu);
}

static const char *zk_state_name(int state)
{
    /* (the client library's states are variables, not constants) */
    const struct {
        int state;
        const char *name;
    } names[] = {
        {ZOO_CONNECTED_STATE, "connected"},
        {ZOO_CONNECTING_STATE, "connecting"},
        {ZOO_ASSOCIATING_STATE, "associating"},
        {ZOO_EXPIRED_SESSION_STATE, "session expired"},
        {ZOO_AUTH_FAILED_STATE, "authentication failed"},
        {ZOO_READONLY_STATE, "read-only"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].state == state)
            return names[i].name;
    return "not connected";
}

/* Drop a reference (zb->mu held). Returns S when it was the last one:
 * the caller gives it to zk_session_destroy() after unlocking (closing
 * waits for the client library's threads, which may want zb->mu). */
static struct zk_session *zk_session_unref_locked(struct zk_session *s)
{
    return --s->refs > 0 ? NULL : s;
}

static void zk_session_destroy(struct zk_session *s)
{
    if (!s)
        return;
    zookeeper_close(s->zh); /* ends the session: its ephemeral nodes go */
    dlock__zk_contend_forget(s->zb, s->gen); /* no watcher runs any more */
    free(s);
}

void dlock__zk_session_put(struct zk_backend *zb, struct zk_session *s)
{
    pthread_mutex_lock(&zb->mu);
    struct zk_session *last = zk_session_unref_locked(s);
    pthread_mutex_unlock(&zb->mu);
    zk_session_destroy(last);
}

bool dlock__zk_session_usable(const struct zk_session *s)
{
    return s && !s->expired && !s->auth_failed;
}

static void auth_done(int rc, const void *data)
{
    (void)rc;
    (void)data;
}

/* Make zb->cur a fresh session (zb->mu held). Returns 0 or a DLOCK_E*. */
static int session_start_locked(struct zk_backend *zb, struct zk_session **to_close)
{
    struct zk_session *s = calloc(1, sizeof *s);
    if (!s)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    s->zb = zb;
    s->refs = 1;
    s->state = ZOO_CONNECTING_STATE;
    s->gen = ++zb->last_gen;
    int timeout = (int)(zb->c->opts.lease_ms > INT32_MAX ? INT32_MAX : zb->c->opts.lease_ms);
    struct zk_fds before;
    dlock__zk_fds_snapshot(&before);
    errno = 0;
    s->zh = zookeeper_init2(zb->connect, dlock__zk_watcher, timeout, NULL, s, 0, zk_log);
    int e = errno;
    if (s->zh)
        dlock__zk_fds_cloexec_new_pipes(&before); /* its self-pipe */
    dlock__zk_fds_free(&before);
    if (!s->zh) {
        free(s);
        if (e == ENOENT) /* the client library's word for a failed lookup */
            return dlock__err(DLOCK_ECONN, "%s: no address found for a host in '%s'",
                              zb->servers, zb->connect);
        return dlock__errno(e == EINVAL ? DLOCK_EBADURL : DLOCK_ECONN, e,
                            "%s: cannot start a ZooKeeper client for '%s'", zb->servers,
                            zb->connect);
    }
    /* The client library resolves the server names again each time its
     * I/O thread checks the socket -- per request and reply: a
     * getaddrinfo() (a netlink socket, /etc/hosts, ~10 system calls),
     * some 40 % of the CPU a held lock's renewal took. Once a second is
     * enough to see a DNS change; a lost connection still resolves at
     * once. */
    zoo_set_servers_resolution_delay(s->zh, ZK_RESOLVE_EVERY_MS);
    /* Queued now, sent first on every (re)connect of this handle. A
     * rejection shows as ZOO_AUTH_FAILED_STATE in the watcher. */
    if (zb->auth)
        zoo_add_auth(s->zh, "digest", zb->auth, (int)strlen(zb->auth), auth_done, NULL);
    if (zb->cur)
        *to_close = zk_session_unref_locked(zb->cur);
    zb->cur = s;
    return DLOCK_OK;
}

/* The current session, connected, with a reference for the caller:
 * starts a new one when the last expired, also when the expiry is only
 * learned while waiting for the reconnection (the client library tells
 * it on reconnecting). Waits up to the connect timeout for a connection
 * of each session it starts; with W (an acquire that waits, registered
 * as a waiter, so session events wake it) also until W's deadline or
 * its cancel: DLOCK_ETIMEDOUT / DLOCK_ECANCELED. A try-once W does not
 * wait at all: DLOCK_ECONN at once when the session is not connected
 * (reconnecting, or a new one just started), since a wait for the
 * connection could last the connect timeout. NOW: wait for nothing
 * either (a parked wait's attempt, which must not sleep: DLOCK_ECONN,
 * and the session's connection wakes the parked wait). */
static int session_get(struct zk_backend *zb, struct zk_session **out, struct dlock__wait *w,
                       bool now)
{
    struct zk_session *to_close[8] = {NULL};
    size_t nclose = 0;
    int err = DLOCK_OK;
    struct zk_session *s = NULL;
    *out = NULL;
    pthread_mutex_lock(&zb->mu);
    for (int starts = 0;; ) {
        int64_t since = dlock__now_ms(); /* refusals from now on count */
        bool refused = false;
        if (!dlock__zk_session_usable(zb->cur)) {
            err = session_start_locked(zb, &to_close[nclose]);
            if (err != DLOCK_OK)
                break;
            if (to_close[nclose])
                nclose++;
            starts++;
        }
        s = zb->cur;
        s->refs++;
        int64_t deadline = dlock__now_ms() + zb->c->opts.connect_timeout_ms;
        int werr = DLOCK_OK;
        if ((now || (w && dlock__wait_try_once(w))) && s->state != ZOO_CONNECTED_STATE &&
            dlock__zk_session_usable(s))
            werr = DLOCK_ECONN;
        while (werr == DLOCK_OK && s->state != ZOO_CONNECTED_STATE && dlock__zk_session_usable(s) &&
               dlock__now_ms() < deadline) {
            if (w) {
                /* seq taken under zb->mu: a state change after this is a
                 * wake (dlock__zk_watcher wakes every waiter under zb->mu) */
                unsigned seq = dlock__wait_seq(w);
                pthread_mutex_unlock(&zb->mu);
                werr = dlock__wait_sleep(w, seq, deadline);
                pthread_mutex_lock(&zb->mu);
                if (werr != DLOCK_OK)
                    break;
                continue;
            }
            /* Opening: look every 50 ms whether every server refused. */
            int64_t until = deadline;
            if (zb->opening && until - dlock__now_ms() > 50)
                until = dlock__now_ms() + 50;
            struct timespec ts = {(time_t)(until / 1000), (long)(until % 1000) * 1000000L};
            pthread_cond_timedwait(&zb->cv, &zb->mu, &ts);
            if (zb->opening && s->state != ZOO_CONNECTED_STATE &&
                zk_all_refused_since(zb, since)) {
                refused = true;
                break;
            }
        }
        if (werr == DLOCK_OK && s->state == ZOO_CONNECTED_STATE && dlock__zk_session_usable(s))
            break;
        bool retry = werr == DLOCK_OK && s->expired && !s->auth_failed && starts < 2;
        if (werr == DLOCK_ECONN) {
            err = dlock__err(DLOCK_ECONN, "%s: not connected (%s)%s", zb->servers,
                             zk_state_name(s->state),
                             now ? "" : "; a try-once acquire does not wait for the session to "
                                        "connect");
        } else if (werr == DLOCK_ECANCELED) {
            err = dlock__err(DLOCK_ECANCELED, "%s: wait canceled while connecting (%s)",
                             zb->servers, zk_state_name(s->state));
        } else if (werr != DLOCK_OK) {
            err = dlock__err(werr, "%s: timed out waiting for a connection (%s)", zb->servers,
                             zk_state_name(s->state));
        } else if (refused) {
            char last[256];
            zk_log_take(last, sizeof last);
            err = dlock__err(DLOCK_ECONN, "%s: every server refused the connection%s%s",
                             zb->servers, last[0] ? ": " : "", last);
        } else if (!retry) {
            char last[256];
            zk_log_take(last, sizeof last);
            if (s->auth_failed)
                err = dlock__err(DLOCK_EAUTH, "%s: digest authentication as '%s' failed",
                                 zb->servers, zb->c->opts.user ? zb->c->opts.user : "?");
            else if (s->expired)
                err = dlock__err(DLOCK_ECONN, "%s: session expired while connecting",
                                 zb->servers);
            else
                err = dlock__err(DLOCK_ECONN, "%s: no connection within %lld ms (%s)%s%s",
                                 zb->servers, (long long)zb->c->opts.connect_timeout_ms,
                                 zk_state_name(s->state), last[0] ? ": " : "", last);
        }
        /* Our reference may be the last one: another thread may have
         * replaced an expired session meanwhile. */
        struct zk_session *last_ref = zk_session_unref_locked(s);
        if (last_ref)
            to_close[nclose++] = last_ref;
        s = NULL;
        if (!retry)
            break;
        /* The session expired while we waited for it to reconnect: the
         * next pass starts a new one (unless another thread did). */
    }
    pthread_mutex_unlock(&zb->mu);
    for (size_t i = 0; i < nclose; i++)
        zk_session_destroy(to_close[i]);
    if (err != DLOCK_OK)
        return err;
    *out = s;
    return DLOCK_OK;
}

struct zk_session *dlock__zk_session_of_hold(struct zk_backend *zb, const struct zk_hold *zh)
{
    pthread_mutex_lock(&zb->mu);
    struct zk_session *s = zb->cur;
    bool same = s && s->gen == zh->gen && dlock__zk_session_usable(s);
    if (same)
        s->refs++;
    pthread_mutex_unlock(&zb->mu);
    return same ? s : NULL;
}

int dlock__zk_hold_session(struct zk_backend *zb, const struct dlock__hold *h,
                           struct zk_session **out)
{
    const struct zk_hold *zh = h->bdata;
    *out = zh ? dlock__zk_session_of_hold(zb, zh) : NULL;
    if (!zh)
        return dlock__err(DLOCK_ELOST, "%s: lock '%s' has no node", zb->servers, h->name);
    if (!*out)
        return dlock__err(DLOCK_ELOST, "%s: lock '%s': the session that held node %s expired",
                          zb->servers, h->name, zh->path);
    return DLOCK_OK;
}

int dlock__zk_session_get_w(struct zk_backend *zb, struct zk_session **out, struct dlock__wait *w)
{
    return session_get(zb, out, w, false);
}

int dlock__zk_session_get_now(struct zk_backend *zb, struct zk_session **out)
{
    return session_get(zb, out, NULL, true);
}

int dlock__zk_session_get(struct zk_backend *zb, struct zk_session **out)
{
    return session_get(zb, out, NULL, false);
}

/* Is P /zookeeper or below it: the server's own namespace (its config,
 * quotas), where nobody's nodes belong? */
static bool path_reserved(const char *p)
{
    return strcmp(p, "/zookeeper") == 0 || strncmp(p, "/zookeeper/", 11) == 0;
}

/* Check P is an absolute ZooKeeper path we accept as chroot or base. */
static bool path_valid(const char *p)
{
    if (!p || p[0] != '/')
        return false;
    if (strcmp(p, "/") == 0)
        return true;
    size_t n = strlen(p);
    if (p[n - 1] == '/')
        return false;
    for (const char *seg = p + 1; *seg;) {
        const char *end = strchr(seg, '/');
        size_t len = end ? (size_t)(end - seg) : strlen(seg);
        if (len == 0 || (len == 1 && seg[0] == '.') ||
            (len == 2 && seg[0] == '.' && seg[1] == '.'))
            return false;
        for (size_t i = 0; i < len; i++)
            if ((unsigned char)seg[i] < 0x20 || seg[i] == 0x7f)
                return false;
        seg += len;
        if (*seg == '/')
            seg++;
    }
    return true;
}

/* ------------------------------------------------------------ open/close */

static void zk_backend_free(struct zk_backend *zb)
{
    if (!zb)
        return;
    free(zb->connect);
    free(zb->servers);
    free(zb->chroot);
    free(zb->base);
    if (zb->auth) {
        memset(zb->auth, 0, strlen(zb->auth));
        free(zb->auth);
    }
    dlock__waitset_destroy(&zb->waiters);
    free(zb->node_events);
    pthread_mutex_destroy(&zb->mu);
    pthread_cond_destroy(&zb->cv);
    free(zb);
}

/* A session's close in a thread of its own (dlock__zk_close): the
 * client library sends the close and waits for the server's answer, up
 * to a third of the session timeout, past the deadline of a client's
 * close on a server that stopped answering. The thread frees the
 * session and the backend; the closing thread waits for it until its
 * deadline only. */
struct zk_closer {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC */
    struct zk_backend *zb;
    struct zk_session *s;
    bool done, abandoned; /* under mu */
};

static void zk_closer_free(struct zk_closer *k)
{
    zk_backend_free(k->zb);
    pthread_cond_destroy(&k->cv);
    pthread_mutex_destroy(&k->mu);
    free(k);
}

static void *zk_closer_main(void *arg)
{
    struct zk_closer *k = arg;
    zk_session_destroy(k->s);
    pthread_mutex_lock(&k->mu);
    k->done = true;
    bool abandoned = k->abandoned;
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
    if (abandoned)
        zk_closer_free(k);
    return NULL;
}

/* Close S and free ZB within DEADLINE (dlock_client_close()'s); what is
 * not done by then finishes in the closer thread, which touches neither
 * the client nor anything of it (the watcher is off: zb->closing).
 * False, nothing done, when that thread cannot start. */
static bool zk_close_within(struct zk_backend *zb, struct zk_session *s, int64_t deadline)
{
    struct zk_closer *k = calloc(1, sizeof *k);
    if (!k)
        return false;
    pthread_mutex_init(&k->mu, NULL);
    dlock__cond_init_monotonic(&k->cv);
    k->zb = zb;
    k->s = s;
    pthread_t t;
    if (pthread_create(&t, NULL, zk_closer_main, k) != 0) {
        k->zb = NULL;
        pthread_cond_destroy(&k->cv);
        pthread_mutex_destroy(&k->mu);
        free(k);
        return false;
    }
    pthread_detach(t);
    struct timespec ts = {(time_t)(deadline / 1000), (long)(deadline % 1000) * 1000000L};
    pthread_mutex_lock(&k->mu);
    while (!k->done && pthread_cond_timedwait(&k->cv, &k->mu, &ts) != ETIMEDOUT)
        ;
    bool done = k->done;
    k->abandoned = !done;
    pthread_mutex_unlock(&k->mu);
    if (done)
        zk_closer_free(k);
    return true;
}

void dlock__zk_close(void *state)
{
    struct zk_backend *zb = state;
    if (!zb)
        return;
    struct zk_session *last = NULL;
    pthread_mutex_lock(&zb->mu);
    if (zb->cur)
        last = zk_session_unref_locked(zb->cur);
    zb->cur = NULL;
    zb->closing = true;
    pthread_mutex_unlock(&zb->mu);
    /* Within dlock_client_close()'s deadline: a stopped server's session
     * is left to expire (its ephemeral nodes go then). */
    int64_t deadline = dlock__close_deadline(zb->c);
    if (last && deadline != DLOCK__NEVER && zk_close_within(zb, last, deadline))
        return;
    zk_session_destroy(last);
    zk_backend_free(zb);
}

/* Build "h1:p1,h2:p2" (IPv6 in brackets). */
static char *host_list(const struct dlock__url *u)
{
    size_t cap = 1;
    for (size_t i = 0; i < u->nhosts; i++)
        cap += strlen(u->hosts[i].host) + 10;
    char *out = malloc(cap), *p = out;
    if (!out)
        return NULL;
    *p = 0;
    for (size_t i = 0; i < u->nhosts; i++) {
        const char *h = u->hosts[i].host;
        int port = u->hosts[i].port ? u->hosts[i].port : ZK_DEFAULT_PORT;
        p += sprintf(p, strchr(h, ':') ? "%s[%s]:%d" : "%s%s:%d", i ? "," : "", h, port);
    }
    return out;
}

int dlock__zk_open(struct dlock_client *c, void **state)
{
    const char *url = c->url.redacted;
    *state = NULL;
    if (c->url.nhosts == 0)
        return dlock__err(DLOCK_EBADURL, "%s: no ZooKeeper server given (zk://host:port)", url);
    for (size_t i = 0; i < c->url.nhosts; i++)
        if (!c->url.hosts[i].host || !*c->url.hosts[i].host)
            return dlock__err(DLOCK_EBADURL, "%s: empty host name", url);

    const char *base = dlock__url_param(&c->url, "base");
    const char *acl = dlock__url_param(&c->url, "acl");
    if (!base || !*base)
        base = ZK_DEFAULT_BASE;
    if (!path_valid(base))
        return dlock__err(DLOCK_EBADURL,
                          "%s: base '%s' is not a ZooKeeper path (absolute, no empty, '.' or "
                          "'..' components, no trailing '/')",
                          url, base);
    const char *chroot = c->url.path && strcmp(c->url.path, "/") != 0 ? c->url.path : NULL;
    if (chroot && !path_valid(chroot))
        return dlock__err(DLOCK_EBADURL, "%s: chroot '%s' is not a ZooKeeper path", url, chroot);
    if (chroot && path_reserved(chroot))
        return dlock__err(DLOCK_EBADURL,
                          "%s: chroot '%s' is inside /zookeeper, reserved for the server's own "
                          "nodes",
                          url, chroot);
    if (!chroot && path_reserved(base))
        return dlock__err(DLOCK_EBADURL,
                          "%s: base '%s' is inside /zookeeper, reserved for the server's own "
                          "nodes",
                          url, base);
    if (acl && strcmp(acl, "open") != 0 && strcmp(acl, "creator") != 0)
        return dlock__err(DLOCK_EBADURL, "%s: acl '%s' is neither 'open' nor 'creator'", url, acl);
    if (c->opts.password && !c->opts.user)
        return dlock__err(DLOCK_EBADURL, "%s: a password without a user name", url);
    if (c->opts.user && !c->opts.password)
        return dlock__err(DLOCK_EBADURL,
                          "%s: user '%s' has no password (digest authentication needs "
                          "user:password)",
                          url, c->opts.user);
    if (c->opts.user && strchr(c->opts.user, ':'))
        return dlock__err(DLOCK_EBADURL, "%s: user name '%s' contains ':'", url, c->opts.user);
    if (acl && strcmp(acl, "creator") == 0 && !c->opts.user)
        return dlock__err(DLOCK_EBADURL, "%s: acl=creator needs a user:password to own nodes", url);
    if (c->opts.tls_ca || c->opts.tls_cert || c->opts.tls_key)
        return dlock__err(DLOCK_ENOTSUP,
                          "%s: TLS is not supported by the ZooKeeper backend (the Debian "
                          "libzookeeper_mt is built without it)",
                          url);
    if (c->opts.layout && strcmp(c->opts.layout, "curator") != 0 &&
        strcmp(c->opts.layout, "curator-rw") != 0)
        return dlock__err(DLOCK_EBADURL,
                          "%s: layout '%s' is unknown to the ZooKeeper backend ('curator': "
                          "InterProcessMutex, or 'curator-rw': InterProcessReadWriteLock)",
                          url, c->opts.layout);
    if (c->opts.lease_ms <= 0 || c->opts.lease_ms > INT32_MAX)
        return dlock__err(DLOCK_EBADURL, "%s: lease %lld ms cannot be a session timeout", url,
                          (long long)c->opts.lease_ms);

    struct zk_backend *zb = calloc(1, sizeof *zb);
    if (!zb)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", url);
    zb->c = c;
    pthread_mutex_init(&zb->mu, NULL);
    dlock__cond_init_monotonic(&zb->cv);
    dlock__waitset_init(&zb->waiters);
    zb->rw_layout = c->opts.layout && strcmp(c->opts.layout, "curator-rw") == 0;
    zb->creator_acl = acl && strcmp(acl, "creator") == 0;
    for (size_t i = 0; i < c->url.nhosts && i < DLOCK__MAX_HOSTS; i++)
        zb->ports[zb->nports++] = c->url.hosts[i].port ? c->url.hosts[i].port : ZK_DEFAULT_PORT;
    char *hosts = host_list(&c->url);
    zb->base = dlock__strdup(base);
    zb->chroot = chroot ? dlock__strdup(chroot) : NULL;
    zb->connect = hosts ? dlock__sprintf("%s%s", hosts, chroot ? chroot : "") : NULL;
    zb->servers = hosts ? dlock__sprintf("zk %s", hosts) : NULL;
    zb->auth = c->opts.user ? dlock__sprintf("%s:%s", c->opts.user, c->opts.password) : NULL;
    free(hosts);
    char who[96];
    dlock__identity(who, sizeof who);
    snprintf(zb->ident, sizeof zb->ident, "dlock %s", who);
    if (!zb->base || !zb->connect || !zb->servers || (chroot && !zb->chroot) ||
        (c->opts.user && !zb->auth)) {
        zk_backend_free(zb);
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", url);
    }

    struct zk_session *s;
    zb->opening = true;
    int err = dlock__zk_session_get(zb, &s);
    zb->opening = false;
    if (err != DLOCK_OK) {
        dlock__zk_close(zb);
        return err;
    }
    /* A chroot the server does not have would fail every request with
     * "no node": say so now. */
    if (chroot) {
        struct Stat st;
        int rc = dlock__zk_rq_exists(zb, s->zh, "/", NULL, NULL, &st, DLOCK__NEVER);
        if (rc != ZOK) {
            err = rc == ZNONODE
                      ? dlock__err(DLOCK_EBADURL,
                                   "%s: chroot '%s' does not exist on the server (create it "
                                   "first, e.g. zkCli.sh create %s)",
                                   zb->servers, chroot, chroot)
                      : dlock__zk_fail(zb, rc, "check chroot", chroot);
            dlock__zk_session_put(zb, s);
            dlock__zk_close(zb);
            return err;
        }
    }
    dlock__zk_session_put(zb, s);
    *state = zb;
    return DLOCK_OK;
}

/* ----------------------------------------------------------------- renew */

/* A copy of the node events seen so far, sorted by hash (then number),
 * for node_event_for(); the caller frees .v. */
struct node_events {
    struct zk_node_event *v;
    size_t n;
    uint64_t last;   /* the last event's number: what a check now has seen */
    uint64_t forgot; /* events up to this number are not in .v */
};

static int cmp_event(const void *a, const void *b)
{
    const struct zk_node_event *x = a, *y = b;
    return x->hash != y->hash ? (x->hash < y->hash ? -1 : 1) : (x->seq > y->seq) - (x->seq < y->seq);
}

static struct node_events take_node_events(struct zk_backend *zb)
{
    struct node_events ev = {0};
    pthread_mutex_lock(&zb->mu);
    ev.last = zb->node_event_seq;
    ev.forgot = zb->node_events_forgot;
    ev.v = zb->n_node_events ? malloc(zb->n_node_events * sizeof *ev.v) : NULL;
    if (ev.v) {
        memcpy(ev.v, zb->node_events, zb->n_node_events * sizeof *ev.v);
        ev.n = zb->n_node_events;
    } else if (zb->n_node_events) {
        ev.forgot = ev.last; /* no memory: every hold is asked about */
    }
    pthread_mutex_unlock(&zb->mu);
    if (ev.n) /* qsort() of NULL is undefined even for 0 entries */
        qsort(ev.v, ev.n, sizeof *ev.v, cmp_event);
    return ev;
}

/* Whether an event for ZH's node may have come after the one numbered
 * SINCE (one of its path's is numbered above it, or some were dropped). */
static bool node_event_for(const struct node_events *ev, const struct zk_hold *zh, uint64_t since)
{
    if (since < ev->forgot)
        return true;
    struct zk_node_event key = {path_hash(zh->path), UINT64_MAX};
    size_t lo = 0, hi = ev->n; /* the first entry above KEY */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cmp_event(&ev->v[mid], &key) <= 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 && ev->v[lo - 1].hash == key.hash && ev->v[lo - 1].seq > since;
}

/* One hold's renewal requests in flight. */
struct hold_check {
    struct zk_call *node; /* its node's exists */
    struct zk_call **rest; /* a permit's other lease nodes */
    int rest_rc;
    bool by_watch;     /* its watch stands: confirmed by the sync alone */
    bool after_events; /* sent after the node events were taken */
};

/* Send HOLD's exists (a lock's with an exists watch of the session, so
 * that the next renewals need not ask again) and a permit's others. */
static void send_check(struct zk_backend *zb, struct zk_session *s, struct dlock__renew_batch *b,
                       size_t i, struct hold_check *check)
{
    struct dlock__hold *h = b->holds[i];
    struct zk_hold *zh = h->bdata;
    struct zk_call *k = dlock__zk_call_new(s->zh);
    int rc = !k        ? ZSYSTEMERROR
             : h->sem ? zoo_aexists(s->zh, zh->path, 0, dlock__zk_on_stat, k)
                      : zoo_awexists(s->zh, zh->path, dlock__zk_watcher, s, dlock__zk_on_stat, k);
    if (k && rc != ZOK) {
        dlock__zk_call_dead(k, rc);
        k = NULL;
    }
    check->node = k;
    if (!k)
        dlock__renew_result(b, i, dlock__zk_fail(zb, rc, "check", zh->path));
    else if (h->sem)
        check->rest_rc = dlock__zk_sem_check_send(zb, s->zh, h, &check->rest);
}

/* Confirm each hold's node still exists in the same session: a sync,
 * then one exists per hold (and per other lease node of a permit of K),
 * all pipelined on the session before any reply is waited for (one round
 * trip plus the hop from our server to the leader, however many holds).
 * The sync matters in an ensemble: a follower cut off from the leader
 * still answers reads for a while (up to syncLimit ticks) after the
 * leader expired our session; reads ordered after a sync come from a
 * follower the leader still talks to, and so do the session touches that
 * keep the session alive.
 *
 * A lock's exists leaves a watch on its node, and while no event came
 * for that node its next renewals send nothing of their own: the sync
 * alone confirms it. Why that is the same check: a node is only ever
 * deleted (or recreated, which deletes it first) by a change the watch
 * reports, and the session's watch events and replies arrive in the order
 * the server made them -- also after a reconnect, where the client
 * library sets its watches again and the server reports what changed
 * meanwhile before it answers what follows -- so once the sync's reply
 * is in, every event for a change before the sync has been noted. A
 * renewal cost a request per held lock per period (45 us of CPU each, in
 * the client library's threads); now a held lock costs a lookup. */
int dlock__zk_renew(void *state, struct dlock__renew_batch *b)
{
    struct zk_backend *zb = state;
    struct dlock__hold **holds = b->holds;
    size_t n = b->n;
    pthread_mutex_lock(&zb->mu);
    struct zk_session *s = zb->cur;
    bool usable = dlock__zk_session_usable(s);
    bool connected = usable && s->state == ZOO_CONNECTED_STATE;
    int64_t session_id = s ? s->session_id : 0; /* the watcher writes it */
    if (s)
        s->refs++;
    pthread_mutex_unlock(&zb->mu);

    struct hold_check *checks = calloc(n ? n : 1, sizeof *checks);
    if (!checks) {
        dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
        for (size_t i = 0; i < n; i++)
            dlock__renew_result(b, i, DLOCK_ENOMEM);
        if (s)
            dlock__zk_session_put(zb, s);
        return DLOCK_ENOMEM;
    }
    /* Wait no longer than the first validity deadline of the batch: the
     * keeper is blocked meanwhile and must be free to declare a hold lost
     * on time (a reply stuck behind a sync could otherwise hold it for a
     * whole op timeout past it). */
    int64_t sent = dlock__now_ms();
    int64_t deadline = dlock__zk_call_deadline(zb, b->deadline);
    struct zk_call *barrier = NULL;
    int barrier_rc = ZOK;
    pthread_mutex_lock(&zb->mu);
    uint64_t seq_at_send = zb->node_event_seq; /* events after it: after the checks sent now */
    pthread_mutex_unlock(&zb->mu);
    if (connected && deadline && n > 0) {
        barrier = dlock__zk_call_new(s->zh);
        barrier_rc = barrier ? zoo_async(s->zh, "/", dlock__zk_on_synced, barrier) : ZSYSTEMERROR;
        if (barrier && barrier_rc != ZOK) {
            dlock__zk_call_dead(barrier, barrier_rc);
            barrier = NULL;
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct dlock__hold *h = holds[i];
        struct zk_hold *zh = h->bdata;
        /* a hold that cannot be checked now, and why */
        int skip = !zh || !s || s->gen != zh->gen || !usable ? DLOCK_ELOST
                   : !connected                              ? DLOCK_ECONN
                   : !deadline                               ? DLOCK_ETIMEDOUT
                                                             : DLOCK_OK;
        if (skip) {
            const char *why = skip == DLOCK_ELOST ? "the ZooKeeper session holding it expired"
                              : skip == DLOCK_ECONN
                                  ? "disconnected, hold in jeopardy until the session timeout"
                                  : "no time left to check it before its validity deadline";
            dlock__renew_result(b, i, dlock__err(skip, "%s: lock '%s': %s", zb->servers, h->name,
                                                 why));
            continue;
        }
        if (zh->watched && !h->sem)
            checks[i].by_watch = true; /* decided once the sync is answered */
        else
            send_check(zb, s, b, i, &checks[i]);
    }
    if (barrier)
        barrier_rc = dlock__zk_call_wait(barrier, deadline, NULL, NULL, NULL);
    struct node_events ev = take_node_events(zb);
    for (size_t i = 0; i < n; i++) {
        struct zk_hold *zh = holds[i]->bdata;
        if (!checks[i].by_watch || (barrier_rc == ZOK && !node_event_for(&ev, zh, zh->watch_seq)))
            continue;
        /* an event came for its node (or the sync failed): ask */
        checks[i].by_watch = zh->watched = false;
        if (barrier_rc == ZOK) {
            checks[i].after_events = true;
            send_check(zb, s, b, i, &checks[i]);
        } else {
            dlock__renew_result(b, i, dlock__zk_fail(zb, barrier_rc, "sync before checking",
                                                     zh->path));
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct dlock__hold *h = holds[i];
        struct zk_hold *zh = h->bdata;
        if (checks[i].by_watch) {
            zh->watch_seq = ev.last;
            dlock__hold_confirmed(zb->c, h, sent);
            dlock__renew_result(b, i, DLOCK_OK);
            continue;
        }
        if (!checks[i].node)
            continue;
        zh->watched = false;
        struct Stat st;
        int rc = dlock__zk_call_wait(checks[i].node, deadline, &st, NULL, NULL);
        /* a permit of K: its other lease nodes too (semaphore.c) */
        int rest = h->sem ? dlock__zk_sem_check_end(zb, h, checks[i].rest, checks[i].rest_rc,
                                                    session_id, deadline)
                          : DLOCK_OK;
        if (rc == ZOK && barrier_rc != ZOK) {
            /* read, but not known to be current: no confirmation */
            dlock__renew_result(b, i, dlock__zk_fail(zb, barrier_rc, "sync before checking", zh->path));
        } else if (rc == ZOK && st.czxid == zh->czxid && st.ephemeralOwner == session_id) {
            if (rest == DLOCK_OK)
                dlock__hold_confirmed(zb->c, h, sent);
            dlock__renew_result(b, i, rest);
            /* its watch stands unless an event taken above may have
             * spent it (one that came after this exists was sent) */
            zh->watched = !h->sem && (checks[i].after_events ||
                                      !node_event_for(&ev, zh, seq_at_send));
            zh->watch_seq = ev.last;
        } else if (rc == ZOK || rc == ZNONODE) {
            dlock__renew_result(b, i, dlock__err(DLOCK_ELOST,
                                                 "%s: lock '%s': its node %s is gone (deleted "
                                                 "or force-released)",
                                                 zb->servers, h->name, zh->path));
        } else if (dlock__zk_rc_session_gone(rc)) {
            dlock__renew_result(b, i, dlock__err(DLOCK_ELOST,
                                                 "%s: lock '%s': the ZooKeeper session holding "
                                                 "it expired",
                                                 zb->servers, h->name));
        } else {
            dlock__renew_result(b, i, dlock__zk_fail(zb, rc, "check", zh->path));
        }
    }
    free(ev.v);
    free(checks);
    if (s)
        dlock__zk_session_put(zb, s);
    return DLOCK_OK;
}
