/* zk.c -- the ZooKeeper backend: exclusive locks on Curator's
 * InterProcessMutex layout, with holds tied to the client's session.
 *
 * A lock NAME lives at <base>/<encoded name>, a container node. Each
 * contender creates an EPHEMERAL_SEQUENTIAL child "_c_<guid>-lock-<seq>"
 * (Curator's protected mode: the guid lets us find our node again when a
 * create's reply is lost to a disconnect). The lowest sequence owns the
 * lock; every other contender watches only the node just before its own, so
 * a release wakes exactly one waiter. Releasing deletes our node; a dead
 * client's nodes vanish when the server expires its session. The fencing
 * token is our node's czxid, which the ensemble only ever increases.
 *
 * One client = one ZooKeeper session (zhandle), shared by all threads; the
 * core queues threads of the client per name, so acquire() sees at most one
 * thread per name. Calls go through the asynchronous API and wait with our
 * own timeout, because the client library's synchronous calls can block for
 * a whole session timeout; that also lets us pipeline (the create and the
 * first listing of the children share one round trip). A node we may have
 * left behind — a create whose reply was lost, a delete without a reply —
 * is remembered and deleted on the next reconnection, so it never blocks
 * the queue until the session ends. When the session expires every hold
 * of it is lost (renew() reports so), and the next call opens a new
 * session. docs/protocol-zookeeper.md describes the layout and guarantees.
 */
#include "core.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zookeeper.h>

#define ZK_DEFAULT_PORT 2181
#define ZK_DEFAULT_BASE "/dlock"
#define ZK_PROTECTED "_c_"    /* Curator's protected-mode prefix */
#define ZK_LOCK_MARK "lock-"  /* Curator's lock name, sorted on what follows */

/* ------------------------------------------------------------ structures */

struct zk_backend;

/* One ZooKeeper session (one zhandle). Retired sessions are closed when
 * the last thread using them lets go. Fields are guarded by zb->mu. */
struct zk_session {
    struct zk_backend *zb;
    zhandle_t *zh;
    unsigned gen;      /* which session of this client, from 1 */
    int refs;          /* the backend's own reference + callers' */
    int state;         /* last session state from the watcher */
    bool expired;      /* ZOO_EXPIRED_SESSION_STATE seen */
    bool auth_failed;  /* ZOO_AUTH_FAILED_STATE seen */
    int64_t session_id;
    int timeout_ms;    /* negotiated session timeout */
};

/* A thread sleeping until its predecessor node goes away. */
struct zk_waiter {
    struct dlock__wait *w;
    const char *watch_path;
    struct zk_waiter *next;
};

/* A node we failed to delete (timeout, disconnect): retried later. */
struct zk_orphan {
    char *path;
    unsigned gen;
    struct zk_orphan *next;
};

/* A create whose reply never came: a node "_c_<guid>-..." of this session
 * may exist under LOCKPATH (or appear, if the request is still in flight)
 * and would stay in the queue until the session ends. Swept: any child
 * with the guid other than KEEP is deleted; the record goes once a
 * listing made well after the create (an op timeout) found none. */
struct zk_suspect {
    char *lockpath;
    char guid[37];
    char *keep;      /* node name we hold or wait with, or NULL */
    unsigned gen;
    int64_t added;   /* monotonic ms */
    struct zk_suspect *next;
};

struct zk_backend {
    struct dlock_client *c;
    char *connect;     /* "h1:p1,h2:p2[/chroot]" for zookeeper_init */
    char *servers;     /* "zk h1:p1,h2:p2" for messages */
    char *chroot;      /* NULL or "/app" */
    char *base;        /* "/dlock" (chroot-relative) */
    char *auth;        /* "user:password" or NULL */
    bool creator_acl;  /* ?acl=creator */
    bool no_containers; /* the server refused ZOO_CONTAINER */
    char ident[128];   /* data of our nodes: "dlock <pid>@<host>" */

    pthread_mutex_t mu;
    pthread_cond_t cv; /* session state changed (CLOCK_MONOTONIC) */
    struct zk_session *cur;
    unsigned last_gen;
    struct zk_waiter *waiters;
    struct zk_orphan *orphans;
    struct zk_suspect *suspects;
};

/* Per-hold data (h->bdata). */
struct zk_hold {
    char *path;    /* full node path, chroot-relative */
    unsigned gen;  /* the session that created it */
    int64_t czxid;
};

/* ---------------------------------------------------- client library log */

/* The C client logs connection errors ("Connection refused") through a
 * callback without context. We keep the last error line process-wide to
 * quote it in connect failures, and write everything to $DLOCK_ZK_LOG
 * when that is set; nothing goes to stderr. */
static pthread_mutex_t zk_log_mu = PTHREAD_MUTEX_INITIALIZER;
static char zk_log_last[256];

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

/* ------------------------------------------------------ waiting on calls */

/* One asynchronous request. The completion may come after the caller gave
 * up (our timeout), so the record is reference counted: one reference for
 * the caller, one for the completion. */
struct zk_call {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    bool done;
    bool abandoned; /* the caller gave up: undo a late create */
    int rc;
    struct Stat stat;
    char *value;    /* created path, or node data */
    int value_len;
    struct String_vector kids;
    zhandle_t *zh;
};

static struct zk_call *call_new(zhandle_t *zh)
{
    struct zk_call *k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&k->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&k->mu, NULL);
    k->refs = 2;
    k->zh = zh;
    return k;
}

static void call_unref(struct zk_call *k)
{
    pthread_mutex_lock(&k->mu);
    bool last = --k->refs == 0;
    pthread_mutex_unlock(&k->mu);
    if (!last)
        return;
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->cv);
    free(k->value);
    deallocate_String_vector(&k->kids);
    free(k);
}

/* Mark K done with RC; the caller of the completion holds k->mu. */
static void call_finish_locked(struct zk_call *k, int rc)
{
    k->rc = rc;
    k->done = true;
    pthread_cond_broadcast(&k->cv);
}

/* For fire-and-forget requests: the client library wants a completion. */
static void on_ignored(int rc, const void *data)
{
    (void)rc;
    (void)data;
}

static void on_void(int rc, const void *data)
{
    struct zk_call *k = (struct zk_call *)data;
    pthread_mutex_lock(&k->mu);
    call_finish_locked(k, rc);
    pthread_mutex_unlock(&k->mu);
    call_unref(k);
}

static void on_stat(int rc, const struct Stat *stat, const void *data)
{
    struct zk_call *k = (struct zk_call *)data;
    pthread_mutex_lock(&k->mu);
    if (rc == ZOK && stat)
        k->stat = *stat;
    call_finish_locked(k, rc);
    pthread_mutex_unlock(&k->mu);
    call_unref(k);
}

static void on_data(int rc, const char *value, int len, const struct Stat *stat, const void *data)
{
    struct zk_call *k = (struct zk_call *)data;
    pthread_mutex_lock(&k->mu);
    if (rc == ZOK) {
        if (stat)
            k->stat = *stat;
        if (value && len > 0 && (k->value = malloc((size_t)len + 1))) {
            memcpy(k->value, value, (size_t)len);
            k->value[len] = 0;
            k->value_len = len;
        }
    }
    call_finish_locked(k, rc);
    pthread_mutex_unlock(&k->mu);
    call_unref(k);
}

static void on_strings(int rc, const struct String_vector *strings, const void *data)
{
    struct zk_call *k = (struct zk_call *)data;
    pthread_mutex_lock(&k->mu);
    if (rc == ZOK && strings && strings->count > 0) {
        k->kids.data = calloc((size_t)strings->count, sizeof(char *));
        if (!k->kids.data) {
            rc = ZSYSTEMERROR;
        } else {
            for (int32_t i = 0; i < strings->count; i++) {
                k->kids.data[i] = strdup(strings->data[i]);
                if (!k->kids.data[i]) {
                    rc = ZSYSTEMERROR;
                    break;
                }
                k->kids.count = i + 1;
            }
        }
    }
    call_finish_locked(k, rc);
    pthread_mutex_unlock(&k->mu);
    call_unref(k);
}

static void on_synced(int rc, const char *value, const void *data)
{
    (void)value;
    on_void(rc, data);
}

static void on_created(int rc, const char *value, const struct Stat *stat, const void *data)
{
    struct zk_call *k = (struct zk_call *)data;
    pthread_mutex_lock(&k->mu);
    if (rc == ZOK) {
        if (k->abandoned && value) {
            /* The caller timed out and moved on: this node would sit in
             * the queue until the session ends. Take it back. */
            zoo_adelete(k->zh, value, -1, on_ignored, NULL);
        } else {
            if (stat)
                k->stat = *stat;
            if (value && !(k->value = strdup(value)))
                rc = ZSYSTEMERROR;
        }
    }
    call_finish_locked(k, rc);
    pthread_mutex_unlock(&k->mu);
    call_unref(k);
}

/* Wait for K until DEADLINE (monotonic ms) and drop the caller's
 * reference. Returns the request's code, or ZOPERATIONTIMEOUT. Copies
 * the results out first through the OUT pointers that are not NULL. */
static int call_wait(struct zk_call *k, int64_t deadline, struct Stat *stat, char **value,
                     struct String_vector *kids)
{
    pthread_mutex_lock(&k->mu);
    while (!k->done) {
        int64_t ms = deadline;
        struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
        if (dlock__now_ms() >= deadline ||
            pthread_cond_timedwait(&k->cv, &k->mu, &ts) == ETIMEDOUT) {
            if (k->done)
                break;
            k->abandoned = true;
            pthread_mutex_unlock(&k->mu);
            call_unref(k);
            return ZOPERATIONTIMEOUT;
        }
    }
    int rc = k->rc;
    if (rc == ZOK) {
        if (stat)
            *stat = k->stat;
        if (value) {
            *value = k->value;
            k->value = NULL;
        }
        if (kids) {
            *kids = k->kids;
            k->kids.count = 0;
            k->kids.data = NULL;
        }
    }
    pthread_mutex_unlock(&k->mu);
    call_unref(k);
    return rc;
}

/* Start failed synchronously: the completion will never run. */
static int call_dead(struct zk_call *k, int rc)
{
    call_unref(k);
    call_unref(k);
    return rc;
}

static int64_t op_deadline(struct zk_backend *zb)
{
    return dlock__now_ms() + zb->c->opts.op_timeout_ms;
}

/* ------------------------------------------------------------- requests */

static const struct ACL_vector *node_acl(struct zk_backend *zb)
{
    return zb->creator_acl ? &ZOO_CREATOR_ALL_ACL : &ZOO_OPEN_ACL_UNSAFE;
}

static int rq_create(struct zk_backend *zb, zhandle_t *zh, const char *path, const char *data,
                     int mode, char **created, struct Stat *stat)
{
    struct zk_call *k = call_new(zh);
    if (!k)
        return ZSYSTEMERROR;
    int rc = zoo_acreate2(zh, path, data, data ? (int)strlen(data) : -1, node_acl(zb), mode,
                          on_created, k);
    if (rc != ZOK)
        return call_dead(k, rc);
    return call_wait(k, op_deadline(zb), stat, created, NULL);
}

static int rq_exists(struct zk_backend *zb, zhandle_t *zh, const char *path, watcher_fn watcher,
                     void *watch_ctx, struct Stat *stat)
{
    struct zk_call *k = call_new(zh);
    if (!k)
        return ZSYSTEMERROR;
    int rc = watcher ? zoo_awexists(zh, path, watcher, watch_ctx, on_stat, k)
                     : zoo_aexists(zh, path, 0, on_stat, k);
    if (rc != ZOK)
        return call_dead(k, rc);
    return call_wait(k, op_deadline(zb), stat, NULL, NULL);
}

static int rq_get(struct zk_backend *zb, zhandle_t *zh, const char *path, char **data,
                  struct Stat *stat)
{
    struct zk_call *k = call_new(zh);
    if (!k)
        return ZSYSTEMERROR;
    int rc = zoo_aget(zh, path, 0, on_data, k);
    if (rc != ZOK)
        return call_dead(k, rc);
    return call_wait(k, op_deadline(zb), stat, data, NULL);
}

static int rq_children(struct zk_backend *zb, zhandle_t *zh, const char *path,
                       struct String_vector *kids)
{
    struct zk_call *k = call_new(zh);
    kids->count = 0;
    kids->data = NULL;
    if (!k)
        return ZSYSTEMERROR;
    int rc = zoo_aget_children(zh, path, 0, on_strings, k);
    if (rc != ZOK)
        return call_dead(k, rc);
    return call_wait(k, op_deadline(zb), NULL, NULL, kids);
}

static int rq_delete(struct zk_backend *zb, zhandle_t *zh, const char *path)
{
    struct zk_call *k = call_new(zh);
    if (!k)
        return ZSYSTEMERROR;
    int rc = zoo_adelete(zh, path, -1, on_void, k);
    if (rc != ZOK)
        return call_dead(k, rc);
    return call_wait(k, op_deadline(zb), NULL, NULL, NULL);
}

/* A failure of a request on PATH as a DLOCK_E* code with a message in
 * the server's (the client library's) words. */
static int zk_fail(struct zk_backend *zb, int rc, const char *what, const char *path)
{
    const char *words = zerror(rc);
    switch (rc) {
    case ZNOAUTH:
        return dlock__err(DLOCK_EAUTH, "%s: %s %s: %s (the node's ACL denies this client%s)",
                          zb->servers, what, path, words,
                          zb->auth ? "" : "; no user:password given in the URL");
    case ZAUTHFAILED:
        return dlock__err(DLOCK_EAUTH, "%s: %s %s: %s", zb->servers, what, path, words);
    case ZCONNECTIONLOSS:
    case ZOPERATIONTIMEOUT:
    case ZCLOSING:
    case ZINVALIDSTATE:
        return dlock__err(DLOCK_ECONN, "%s: %s %s: %s%s", zb->servers, what, path, words,
                          rc == ZOPERATIONTIMEOUT ? " (no reply within the op timeout)" : "");
    case ZSESSIONEXPIRED:
        return dlock__err(DLOCK_ELOST, "%s: %s %s: %s", zb->servers, what, path, words);
    case ZSYSTEMERROR:
        return dlock__err(DLOCK_ENOMEM, "%s: %s %s: out of memory", zb->servers, what, path);
    case ZBADARGUMENTS:
        return dlock__err(DLOCK_EINVAL, "%s: %s %s: %s", zb->servers, what, path, words);
    default:
        return dlock__err(DLOCK_EBACKEND, "%s: %s %s: %s (%d)", zb->servers, what, path,
                          words, rc);
    }
}

static bool rc_transient(int rc)
{
    return rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT;
}

static bool rc_session_gone(int rc)
{
    return rc == ZSESSIONEXPIRED || rc == ZINVALIDSTATE || rc == ZCLOSING;
}

/* -------------------------------------------------------------- suspects */

static bool node_has_guid(const char *node, const char *guid);
static void sweep_locked(struct zk_backend *zb, struct zk_session *s);

struct zk_sweep {
    struct zk_backend *zb;
    zhandle_t *zh;
    struct zk_suspect *sus; /* identity only: looked up again under mu */
    char *lockpath;
    char guid[37];
    char *keep;
    int64_t issued;
};

static void suspect_free(struct zk_suspect *q)
{
    free(q->lockpath);
    free(q->keep);
    free(q);
}

static void on_sweep_children(int rc, const struct String_vector *kids, const void *data)
{
    struct zk_sweep *w = (struct zk_sweep *)data;
    bool found = false;
    if (rc == ZOK && kids) {
        for (int32_t i = 0; i < kids->count; i++) {
            const char *kid = kids->data[i];
            if (!node_has_guid(kid, w->guid) || (w->keep && strcmp(kid, w->keep) == 0))
                continue;
            found = true;
            char *path = dlock__sprintf("%s/%s", w->lockpath, kid);
            if (path)
                zoo_adelete(w->zh, path, -1, on_ignored, NULL);
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
            suspect_free(q);
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
static void suspects_sweep_locked(struct zk_backend *zb, unsigned gen, zhandle_t *zh)
{
    int64_t now = dlock__now_ms();
    for (struct zk_suspect **pp = &zb->suspects; *pp;) {
        struct zk_suspect *q = *pp;
        if (q->gen != gen) {
            *pp = q->next;
            suspect_free(q);
            continue;
        }
        pp = &q->next;
        struct zk_sweep *w = calloc(1, sizeof *w);
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

/* -------------------------------------------------------------- sessions */

static void wake_waiters_locked(struct zk_backend *zb, const char *path)
{
    for (struct zk_waiter *q = zb->waiters; q; q = q->next)
        if (!path || (q->watch_path && strcmp(q->watch_path, path) == 0))
            dlock__wait_wake(q->w);
}

/* Watcher of the session and of predecessor nodes: CTX is the session. */
static void zk_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    struct zk_session *s = ctx;
    (void)zh;
    if (!s)
        return;
    struct zk_backend *zb = s->zb;
    pthread_mutex_lock(&zb->mu);
    if (type == ZOO_SESSION_EVENT) {
        s->state = state;
        if (state == ZOO_CONNECTED_STATE) {
            const clientid_t *id = zoo_client_id(s->zh);
            s->session_id = id ? id->client_id : 0;
            s->timeout_ms = zoo_recv_timeout(s->zh);
            if (zb->cur == s)
                sweep_locked(zb, s);
        } else if (state == ZOO_EXPIRED_SESSION_STATE) {
            s->expired = true;
        } else if (state == ZOO_AUTH_FAILED_STATE) {
            s->auth_failed = true;
        }
        pthread_cond_broadcast(&zb->cv);
        wake_waiters_locked(zb, NULL); /* let them look at the new state */
    } else if (path) {
        wake_waiters_locked(zb, path);
    }
    pthread_mutex_unlock(&zb->mu);
}

static const char *state_name(int state)
{
    if (state == ZOO_CONNECTED_STATE)
        return "connected";
    if (state == ZOO_CONNECTING_STATE)
        return "connecting";
    if (state == ZOO_ASSOCIATING_STATE)
        return "associating";
    if (state == ZOO_EXPIRED_SESSION_STATE)
        return "session expired";
    if (state == ZOO_AUTH_FAILED_STATE)
        return "authentication failed";
    if (state == ZOO_READONLY_STATE)
        return "read-only";
    return "not connected";
}

/* Drop a reference (zb->mu held). Returns S when it was the last one:
 * the caller gives it to session_destroy() after unlocking (closing
 * waits for the client library's threads, which may want zb->mu). */
static struct zk_session *session_unref_locked(struct zk_session *s)
{
    return --s->refs > 0 ? NULL : s;
}

static void session_destroy(struct zk_session *s)
{
    if (!s)
        return;
    zookeeper_close(s->zh); /* ends the session: its ephemeral nodes go */
    free(s);
}

static void session_put(struct zk_backend *zb, struct zk_session *s)
{
    pthread_mutex_lock(&zb->mu);
    struct zk_session *last = session_unref_locked(s);
    pthread_mutex_unlock(&zb->mu);
    session_destroy(last);
}

static bool session_usable(const struct zk_session *s)
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
    errno = 0;
    s->zh = zookeeper_init2(zb->connect, zk_watcher, timeout, NULL, s, 0, zk_log);
    if (!s->zh) {
        int e = errno;
        free(s);
        if (e == ENOENT) /* the client library's word for a failed lookup */
            return dlock__err(DLOCK_ECONN, "%s: no address found for a host in '%s'",
                              zb->servers, zb->connect);
        return dlock__errno(e == EINVAL ? DLOCK_EBADURL : DLOCK_ECONN, e,
                            "%s: cannot start a ZooKeeper client for '%s'", zb->servers,
                            zb->connect);
    }
    /* Queued now, sent first on every (re)connect of this handle. A
     * rejection shows as ZOO_AUTH_FAILED_STATE in the watcher. */
    if (zb->auth)
        zoo_add_auth(s->zh, "digest", zb->auth, (int)strlen(zb->auth), auth_done, NULL);
    if (zb->cur)
        *to_close = session_unref_locked(zb->cur);
    zb->cur = s;
    return DLOCK_OK;
}

/* The current session, connected, with a reference for the caller:
 * starts a new one when the last expired, also when the expiry is only
 * learned while waiting for the reconnection (the client library tells
 * it on reconnecting). Waits up to the connect timeout for a connection
 * of each session it starts; with W (an acquire that waits, registered
 * as a waiter, so session events wake it) also until W's deadline or
 * its cancel: DLOCK_ETIMEDOUT / DLOCK_ECANCELED. */
static int session_get_w(struct zk_backend *zb, struct zk_session **out, struct dlock__wait *w)
{
    struct zk_session *to_close[8] = {NULL};
    size_t nclose = 0;
    int err = DLOCK_OK;
    struct zk_session *s = NULL;
    *out = NULL;
    pthread_mutex_lock(&zb->mu);
    for (int starts = 0;; ) {
        if (!session_usable(zb->cur)) {
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
        while (s->state != ZOO_CONNECTED_STATE && session_usable(s) &&
               dlock__now_ms() < deadline) {
            if (w) {
                /* seq taken under zb->mu: a state change after this is a
                 * wake (zk_watcher wakes every waiter under zb->mu) */
                unsigned seq = dlock__wait_seq(w);
                pthread_mutex_unlock(&zb->mu);
                werr = dlock__wait_sleep(w, seq, deadline);
                pthread_mutex_lock(&zb->mu);
                if (werr != DLOCK_OK)
                    break;
                continue;
            }
            struct timespec ts = {(time_t)(deadline / 1000), (long)(deadline % 1000) * 1000000L};
            pthread_cond_timedwait(&zb->cv, &zb->mu, &ts);
        }
        if (werr == DLOCK_OK && s->state == ZOO_CONNECTED_STATE && session_usable(s))
            break;
        bool retry = werr == DLOCK_OK && s->expired && !s->auth_failed && starts < 2;
        if (werr == DLOCK_ECANCELED) {
            err = dlock__err(DLOCK_ECANCELED, "%s: wait canceled while connecting (%s)",
                             zb->servers, state_name(s->state));
        } else if (werr != DLOCK_OK) {
            err = dlock__err(werr, "%s: timed out waiting for a connection (%s)", zb->servers,
                             state_name(s->state));
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
                                 state_name(s->state), last[0] ? ": " : "", last);
        }
        /* Our reference may be the last one: another thread may have
         * replaced an expired session meanwhile. */
        struct zk_session *last_ref = session_unref_locked(s);
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
        session_destroy(to_close[i]);
    if (err != DLOCK_OK)
        return err;
    *out = s;
    return DLOCK_OK;
}

static int session_get(struct zk_backend *zb, struct zk_session **out)
{
    return session_get_w(zb, out, NULL);
}

/* --------------------------------------------------------------- naming */

static const char *basename_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* Bytes kept as they are in a node name; everything else is %XX. */
static bool name_byte_plain(unsigned char ch)
{
    /* ASCII only: isalnum() would follow the caller's locale, and a
     * Latin-1 byte sent raw is not UTF-8 to the server. */
    return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
           ch == '-' || ch == '_' || ch == '.' || ch == '~' || ch == ':' ||
           ch == '@' || ch == '+' || ch == '=' || ch == ',';
}

/* Encode NAME (any bytes) as one node name that never leaves the base
 * path: '/', '%', control and non-ASCII bytes become %XX, and so do the
 * names "." and ".." and the reserved "zookeeper" right under "/". */
static char *encode_name(const char *name, bool at_root)
{
    size_t n = strlen(name);
    char *out = malloc(n * 3 + 1), *p = out;
    if (!out)
        return NULL;
    bool dots = strcmp(name, ".") == 0 || strcmp(name, "..") == 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (name_byte_plain(ch) && !(dots && ch == '.') &&
            !(at_root && i == 0 && strcmp(name, "zookeeper") == 0))
            *p++ = (char)ch;
        else
            p += sprintf(p, "%%%02X", ch);
    }
    *p = 0;
    return out;
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    return -1;
}

/* Decode a node name written by encode_name (or by someone else: bytes
 * that are not %XX are kept). */
static char *decode_name(const char *enc)
{
    size_t n = strlen(enc);
    char *out = malloc(n + 1), *p = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        int hi, lo;
        if (enc[i] == '%' && i + 2 < n && (hi = hexval(enc[i + 1])) >= 0 &&
            (lo = hexval(enc[i + 2])) >= 0) {
            *p++ = (char)(hi * 16 + lo);
            i += 2;
        } else {
            *p++ = enc[i];
        }
    }
    *p = 0;
    return out;
}

/* Path of the lock node for NAME: <base>/<encoded key_prefix + name>. */
static char *lock_path(struct zk_backend *zb, const char *name)
{
    const char *prefix = zb->c->opts.key_prefix ? zb->c->opts.key_prefix : "";
    char *full = dlock__sprintf("%s%s", prefix, name);
    if (!full)
        return NULL;
    bool root = strcmp(zb->base, "/") == 0;
    char *enc = encode_name(full, root);
    free(full);
    if (!enc)
        return NULL;
    char *path = dlock__sprintf("%s/%s", root ? "" : zb->base, enc);
    free(enc);
    return path;
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

/* The sequence part of a Curator lock child ("..lock-0000000042"), or
 * NULL when NODE is not one. */
static const char *node_sequence(const char *node)
{
    const char *mark = NULL;
    for (const char *p = strstr(node, ZK_LOCK_MARK); p; p = strstr(p + 1, ZK_LOCK_MARK))
        mark = p;
    if (!mark)
        return NULL;
    const char *seq = mark + strlen(ZK_LOCK_MARK);
    if (!*seq)
        return NULL;
    for (const char *p = seq; *p; p++)
        if (!isdigit((unsigned char)*p))
            return NULL;
    return seq;
}

static int cmp_nodes(const void *a, const void *b)
{
    const char *x = node_sequence(*(char *const *)a), *y = node_sequence(*(char *const *)b);
    size_t lx = strlen(x), ly = strlen(y);
    if (lx != ly) /* sequences overflow into longer numbers */
        return lx < ly ? -1 : 1;
    return strcmp(x, y);
}

/* Keep only lock children in KIDS and sort them by sequence (the owner
 * first). Other children are freed. */
static void sort_lock_nodes(struct String_vector *kids)
{
    int32_t n = 0;
    for (int32_t i = 0; i < kids->count; i++) {
        if (node_sequence(kids->data[i]))
            kids->data[n++] = kids->data[i];
        else
            free(kids->data[i]);
    }
    kids->count = n;
    if (n > 1)
        qsort(kids->data, (size_t)n, sizeof(char *), cmp_nodes);
}

/* Does NODE carry protected-mode GUID ("_c_<guid>-...")? */
static bool node_has_guid(const char *node, const char *guid)
{
    size_t pl = strlen(ZK_PROTECTED), gl = strlen(guid);
    return strncmp(node, ZK_PROTECTED, pl) == 0 && strncmp(node + pl, guid, gl) == 0 &&
           node[pl + gl] == '-';
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
    if (!rc_transient(rc) && rc != ZCLOSING) {
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
static void orphans_retry_locked(struct zk_backend *zb, unsigned gen, zhandle_t *zh)
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
static void sweep_locked(struct zk_backend *zb, struct zk_session *s)
{
    if (zb->orphans)
        orphans_retry_locked(zb, s->gen, s->zh);
    if (zb->suspects)
        suspects_sweep_locked(zb, s->gen, s->zh);
}

static void sweep(struct zk_backend *zb, struct zk_session *s)
{
    pthread_mutex_lock(&zb->mu);
    sweep_locked(zb, s);
    pthread_mutex_unlock(&zb->mu);
}

/* Our node PATH could not be deleted (no reply): keep trying. */
static void orphan_add(struct zk_backend *zb, struct zk_session *s, const char *path)
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
        sweep_locked(zb, s);
    pthread_mutex_unlock(&zb->mu);
}

/* Remember that a create of GUID under LOCKPATH may have left a node
 * other than KEEP, and sweep for it at once. */
static void suspect_add(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
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
    pthread_mutex_lock(&zb->mu);
    q->next = zb->suspects;
    zb->suspects = q;
    sweep_locked(zb, s);
    pthread_mutex_unlock(&zb->mu);
}

/* Delete our node PATH, retrying on disconnects up to the op timeout;
 * on failure remember it for a later sweep. */
static void delete_own_node(struct zk_backend *zb, struct zk_session *s, const char *path)
{
    int64_t deadline = op_deadline(zb);
    int rc;
    do {
        rc = rq_delete(zb, s->zh, path);
        if (rc == ZOK || rc == ZNONODE || rc_session_gone(rc))
            return;
        if (!rc_transient(rc))
            break;
        struct timespec pause = {0, 50 * 1000000L};
        nanosleep(&pause, NULL);
    } while (dlock__now_ms() < deadline);
    orphan_add(zb, s, path);
}

/* ------------------------------------------------------------ open/close */

static void backend_free(struct zk_backend *zb)
{
    if (!zb)
        return;
    while (zb->orphans) {
        struct zk_orphan *o = zb->orphans;
        zb->orphans = o->next;
        free(o->path);
        free(o);
    }
    while (zb->suspects) {
        struct zk_suspect *q = zb->suspects;
        zb->suspects = q->next;
        suspect_free(q);
    }
    free(zb->connect);
    free(zb->servers);
    free(zb->chroot);
    free(zb->base);
    if (zb->auth) {
        memset(zb->auth, 0, strlen(zb->auth));
        free(zb->auth);
    }
    pthread_mutex_destroy(&zb->mu);
    pthread_cond_destroy(&zb->cv);
    free(zb);
}

static void zk_close(void *state)
{
    struct zk_backend *zb = state;
    if (!zb)
        return;
    struct zk_session *last = NULL;
    pthread_mutex_lock(&zb->mu);
    if (zb->cur)
        last = session_unref_locked(zb->cur);
    zb->cur = NULL;
    pthread_mutex_unlock(&zb->mu);
    session_destroy(last);
    backend_free(zb);
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

static int zk_open(struct dlock_client *c, void **state)
{
    const char *url = dlock_client_url(c);
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
    if (c->opts.layout && strcmp(c->opts.layout, "curator") != 0)
        return dlock__err(DLOCK_EBADURL,
                          "%s: layout '%s' is unknown to the ZooKeeper backend (only 'curator')",
                          url, c->opts.layout);
    const char *chroot = c->url.path && strcmp(c->url.path, "/") != 0 ? c->url.path : NULL;
    if (chroot && !path_valid(chroot))
        return dlock__err(DLOCK_EBADURL, "%s: chroot '%s' is not a ZooKeeper path", url, chroot);
    if (c->opts.lease_ms <= 0 || c->opts.lease_ms > INT32_MAX)
        return dlock__err(DLOCK_EBADURL, "%s: lease %lld ms cannot be a session timeout", url,
                          (long long)c->opts.lease_ms);

    struct zk_backend *zb = calloc(1, sizeof *zb);
    if (!zb)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", url);
    zb->c = c;
    pthread_mutex_init(&zb->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&zb->cv, &ca);
    pthread_condattr_destroy(&ca);
    zb->creator_acl = acl && strcmp(acl, "creator") == 0;
    char *hosts = host_list(&c->url);
    zb->base = dlock__strdup(base);
    zb->chroot = chroot ? dlock__strdup(chroot) : NULL;
    zb->connect = hosts ? dlock__sprintf("%s%s", hosts, chroot ? chroot : "") : NULL;
    zb->servers = hosts ? dlock__sprintf("zk %s", hosts) : NULL;
    zb->auth = c->opts.user ? dlock__sprintf("%s:%s", c->opts.user, c->opts.password) : NULL;
    free(hosts);
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    snprintf(zb->ident, sizeof zb->ident, "dlock %ld@%s", (long)getpid(), host);
    if (!zb->base || !zb->connect || !zb->servers || (chroot && !zb->chroot) ||
        (c->opts.user && !zb->auth)) {
        backend_free(zb);
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", url);
    }

    struct zk_session *s;
    int err = session_get(zb, &s);
    if (err != DLOCK_OK) {
        zk_close(zb);
        return err;
    }
    /* A chroot the server does not have would fail every request with
     * "no node": say so now. */
    if (chroot) {
        struct Stat st;
        int rc = rq_exists(zb, s->zh, "/", NULL, NULL, &st);
        if (rc != ZOK) {
            err = rc == ZNONODE
                      ? dlock__err(DLOCK_EBADURL,
                                   "%s: chroot '%s' does not exist on the server (create it "
                                   "first, e.g. zkCli.sh create %s)",
                                   zb->servers, chroot, chroot)
                      : zk_fail(zb, rc, "check chroot", chroot);
            session_put(zb, s);
            zk_close(zb);
            return err;
        }
    }
    session_put(zb, s);
    *state = zb;
    return DLOCK_OK;
}

/* --------------------------------------------------------------- acquire */

/* Create the lock node LOCKPATH as a container (persistent when the
 * server has no containers). ZNODEEXISTS counts as done. */
static int create_lock_node(struct zk_backend *zb, struct zk_session *s, const char *lockpath)
{
    pthread_mutex_lock(&zb->mu); /* threads acquiring other names too */
    int mode = zb->no_containers ? ZOO_PERSISTENT : ZOO_CONTAINER;
    pthread_mutex_unlock(&zb->mu);
    int rc = rq_create(zb, s->zh, lockpath, NULL, mode, NULL, NULL);
    if ((rc == ZUNIMPLEMENTED || rc == ZBADARGUMENTS) && mode == ZOO_CONTAINER) {
        pthread_mutex_lock(&zb->mu);
        zb->no_containers = true;
        pthread_mutex_unlock(&zb->mu);
        rc = rq_create(zb, s->zh, lockpath, NULL, ZOO_PERSISTENT, NULL, NULL);
    }
    return rc == ZNODEEXISTS ? ZOK : rc;
}

/* Create the lock node, and first its persistent parents (the base path)
 * if they are missing: the common case, a new name under an existing
 * base, costs one request. Returns a ZooKeeper code; on failure *failed
 * (owned) names the path. */
static int make_parents(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
                        char **failed)
{
    *failed = NULL;
    int rc = create_lock_node(zb, s, lockpath);
    if (rc != ZNONODE) {
        if (rc != ZOK)
            *failed = dlock__strdup(lockpath);
        return rc;
    }
    char *p = dlock__strdup(lockpath);
    if (!p)
        return ZSYSTEMERROR;
    for (char *slash = strchr(p + 1, '/'); slash && rc != ZSYSTEMERROR;
         slash = strchr(slash + 1, '/')) {
        *slash = 0;
        rc = rq_create(zb, s->zh, p, NULL, ZOO_PERSISTENT, NULL, NULL);
        if (rc != ZOK && rc != ZNODEEXISTS) {
            *failed = p;
            return rc;
        }
        *slash = '/';
    }
    rc = create_lock_node(zb, s, lockpath);
    if (rc != ZOK)
        *failed = p;
    else
        free(p);
    return rc;
}

/* Create PATH (EPHEMERAL_SEQUENTIAL) and, in the same round trip, list
 * LOCKPATH's children: the server handles a session's requests in order,
 * so the listing already shows the new node. Returns the create's code;
 * *listed tells whether KIDS was filled (caller frees). */
static int rq_create_and_list(struct zk_backend *zb, zhandle_t *zh, const char *path,
                              const char *lockpath, char **created, struct Stat *stat,
                              struct String_vector *kids, bool *listed)
{
    *listed = false;
    kids->count = 0;
    kids->data = NULL;
    struct zk_call *kc = call_new(zh), *kl = call_new(zh);
    if (!kc || !kl) {
        if (kc)
            call_dead(kc, ZSYSTEMERROR);
        if (kl)
            call_dead(kl, ZSYSTEMERROR);
        return ZSYSTEMERROR;
    }
    int rc = zoo_acreate2(zh, path, zb->ident, (int)strlen(zb->ident), node_acl(zb),
                          ZOO_EPHEMERAL_SEQUENTIAL, on_created, kc);
    if (rc != ZOK) {
        call_dead(kl, rc);
        return call_dead(kc, rc);
    }
    int lrc = zoo_aget_children(zh, lockpath, 0, on_strings, kl);
    if (lrc != ZOK)
        call_dead(kl, lrc);
    int64_t deadline = op_deadline(zb);
    rc = call_wait(kc, deadline, stat, created, NULL);
    if (lrc == ZOK) {
        lrc = call_wait(kl, deadline, NULL, NULL, kids);
        *listed = rc == ZOK && lrc == ZOK;
        if (!*listed)
            deallocate_String_vector(kids);
    }
    return rc;
}

/* Find the child of LOCKPATH carrying GUID after an ambiguous create.
 * Returns ZOK and sets *node (owned), ZNONODE when none, or an error. */
static int find_guid_node(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
                          const char *guid, char **node)
{
    struct String_vector kids;
    int rc = rq_children(zb, s->zh, lockpath, &kids);
    if (rc != ZOK)
        return rc;
    rc = ZNONODE;
    for (int32_t i = 0; i < kids.count; i++) {
        if (node_has_guid(kids.data[i], guid)) {
            *node = dlock__sprintf("%s/%s", lockpath, kids.data[i]);
            rc = *node ? ZOK : ZSYSTEMERROR;
            break;
        }
    }
    deallocate_String_vector(&kids);
    return rc;
}

/* Create our contender node under LOCKPATH: *mine = its full path,
 * *czxid its creation zxid; *listed says whether KIDS holds a listing of
 * the children made right after (caller frees it). */
static int create_contender(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
                            char **mine, int64_t *czxid, struct String_vector *kids,
                            bool *listed)
{
    char guid[37];
    dlock__uuid(guid);
    char *prefix = dlock__sprintf("%s/" ZK_PROTECTED "%s-" ZK_LOCK_MARK, lockpath, guid);
    if (!prefix)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    int64_t deadline = op_deadline(zb);
    int err = DLOCK_OK;
    bool ambiguous = false; /* a create of ours may have happened unseen */
    for (int attempt = 0;; attempt++) {
        struct Stat st;
        char *created = NULL;
        int rc = rq_create_and_list(zb, s->zh, prefix, lockpath, &created, &st, kids, listed);
        if (rc == ZOK) {
            *mine = created;
            *czxid = st.czxid;
            break;
        }
        if (rc == ZNONODE && attempt < 5) {
            char *failed = NULL;
            rc = make_parents(zb, s, lockpath, &failed);
            if (rc == ZOK || rc == ZNONODE || (rc_transient(rc) && dlock__now_ms() < deadline)) {
                free(failed);
                continue; /* a container may vanish again: try anew */
            }
            err = zk_fail(zb, rc, "create", failed ? failed : lockpath);
            free(failed);
            break;
        }
        if (rc_transient(rc))
            ambiguous = true;
        if (rc_transient(rc) && dlock__now_ms() < deadline) {
            /* The reply was lost: the node may exist. Look for our guid. */
            char *found = NULL;
            int frc = find_guid_node(zb, s, lockpath, guid, &found);
            if (frc == ZOK) {
                struct Stat fst;
                frc = rq_exists(zb, s->zh, found, NULL, NULL, &fst);
                if (frc == ZOK) {
                    *mine = found;
                    *czxid = fst.czxid;
                    break;
                }
                free(found);
            }
            struct timespec pause = {0, 100 * 1000000L};
            nanosleep(&pause, NULL);
            continue;
        }
        err = zk_fail(zb, rc, "create lock node under", lockpath);
        break;
    }
    if (ambiguous)
        suspect_add(zb, s, lockpath, guid, err == DLOCK_OK ? basename_of(*mine) : NULL);
    free(prefix);
    return err;
}

/* Register/unregister a waiter on PATH's deletion. */
static void waiter_add(struct zk_backend *zb, struct zk_waiter *q)
{
    pthread_mutex_lock(&zb->mu);
    q->next = zb->waiters;
    zb->waiters = q;
    pthread_mutex_unlock(&zb->mu);
}

static void waiter_remove(struct zk_backend *zb, struct zk_waiter *q)
{
    pthread_mutex_lock(&zb->mu);
    for (struct zk_waiter **pp = &zb->waiters; *pp; pp = &(*pp)->next) {
        if (*pp == q) {
            *pp = q->next;
            break;
        }
    }
    pthread_mutex_unlock(&zb->mu);
}


/* A listing of PATH's children made current: a sync pipelined before the
 * getChildren (no extra round trip). A follower cut off from the leader
 * keeps answering reads for up to syncLimit ticks while the leader may
 * already have expired our session and given the lock to the next
 * contender: a listing it serves could show us first although we are
 * not, with a validity counted from now. The sync goes through the
 * leader, and reads after it are at least as new. */
static int rq_children_synced(struct zk_backend *zb, zhandle_t *zh, const char *path,
                              struct String_vector *kids)
{
    kids->count = 0;
    kids->data = NULL;
    struct zk_call *ks = call_new(zh), *kl = call_new(zh);
    if (!ks || !kl) {
        if (ks)
            call_dead(ks, ZSYSTEMERROR);
        if (kl)
            call_dead(kl, ZSYSTEMERROR);
        return ZSYSTEMERROR;
    }
    int rc = zoo_async(zh, "/", on_synced, ks);
    if (rc != ZOK) {
        call_dead(kl, rc);
        return call_dead(ks, rc);
    }
    int64_t deadline = op_deadline(zb);
    int lrc = zoo_aget_children(zh, path, 0, on_strings, kl);
    if (lrc != ZOK)
        call_dead(kl, lrc);
    rc = call_wait(ks, deadline, NULL, NULL, NULL);
    if (lrc == ZOK)
        lrc = call_wait(kl, deadline, NULL, NULL, kids);
    if (rc != ZOK || lrc != ZOK) {
        deallocate_String_vector(kids);
        kids->count = 0;
        kids->data = NULL;
    }
    return rc != ZOK ? rc : lrc;
}

/* One pass of the recipe: list the contenders and see where MINE stands.
 * Returns ZOK with *pos = 0 (owner) or the index, and the predecessor's
 * full path in *pred (owned) when not first; ZNONODE when our node is
 * gone; or an error code. *holder names the owner node (owned). */
static int queue_position(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
                          const char *mine, struct String_vector *given, int *pos, char **pred,
                          char **holder)
{
    struct String_vector kids;
    *pred = NULL;
    *holder = NULL;
    const char *me = basename_of(mine);
    bool in_given = false;
    for (int32_t i = 0; given && i < given->count && !in_given; i++)
        in_given = strcmp(given->data[i], me) == 0;
    int rc = ZOK;
    if (in_given) { /* the listing made with our create: use it */
        kids = *given;
        given->count = 0;
        given->data = NULL;
    } else {
        rc = rq_children_synced(zb, s->zh, lockpath, &kids);
    }
    if (rc != ZOK)
        return rc;
    sort_lock_nodes(&kids);
    rc = ZNONODE;
    for (int32_t i = 0; i < kids.count; i++) {
        if (strcmp(kids.data[i], me) == 0) {
            *pos = i;
            rc = ZOK;
            if (i > 0)
                *pred = dlock__sprintf("%s/%s", lockpath, kids.data[i - 1]);
            break;
        }
    }
    if (kids.count > 0)
        *holder = dlock__strdup(kids.data[0]);
    deallocate_String_vector(&kids);
    if (rc == ZOK && *pos > 0 && !*pred)
        rc = ZSYSTEMERROR;
    return rc;
}

static int zk_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
{
    struct zk_backend *zb = state;
    if (h->mode != DLOCK_EXCLUSIVE)
        return dlock__err(DLOCK_ENOTSUP,
                          "%s: lock '%s': shared mode is not supported by the ZooKeeper "
                          "backend (Curator's InterProcessMutex layout is exclusive)",
                          zb->servers, h->name);
    if (h->fixed_lease)
        return dlock__err(DLOCK_ENOTSUP,
                          "%s: lock '%s': fixed leases are not supported by the ZooKeeper "
                          "backend (a hold lasts as long as the client's session)",
                          zb->servers, h->name);
    char *lockpath = lock_path(zb, h->name);
    if (!lockpath)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);

    struct zk_session *s = NULL;
    char *mine = NULL, *pred = NULL, *holder = NULL;
    int64_t czxid = 0, created_at = 0;
    struct String_vector first = {0, NULL}; /* listed along with our create */
    bool have_first = false;
    int err;
    struct zk_waiter waiter = {.w = w};
    waiter_add(zb, &waiter);

restart:
    if (s) {
        session_put(zb, s);
        s = NULL;
    }
    free(mine);
    mine = NULL;
    /* a try-once still waits for a connection, up to the connect timeout */
    err = session_get_w(zb, &s, w->deadline != 0 ? w : NULL);
    if (err != DLOCK_OK)
        goto out;
    sweep(zb, s);
    deallocate_String_vector(&first);
    first = (struct String_vector){0, NULL};
    created_at = dlock__now_ms();
    unsigned create_seq = dlock__wait_seq(w);
    err = create_contender(zb, s, lockpath, &mine, &czxid, &first, &have_first);
    if (err == DLOCK_ECONN && w->deadline != 0) {
        /* The create met a disconnect (any node it may have left is a
         * suspect, swept): a waiting acquire goes on waiting, as a queued
         * waiter does, and tries again on a reconnection (the watcher
         * wakes us), a second later at the latest, or on a new session. */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", dlock_errmsg());
        int r = dlock__wait_sleep(w, create_seq, dlock__now_ms() + 1000);
        if (r == DLOCK_OK)
            goto restart;
        err = r == DLOCK_ECANCELED
                  ? dlock__err(r, "%s: lock '%s': wait canceled", zb->servers, h->name)
                  : dlock__err(r, "%s: lock '%s': timed out waiting (%s)", zb->servers, h->name,
                               msg);
        goto out;
    }
    if (err != DLOCK_OK)
        goto out;

    for (;;) {
        unsigned seq = dlock__wait_seq(w);
        int64_t sent = have_first ? created_at : dlock__now_ms();
        int pos = 0;
        pthread_mutex_lock(&zb->mu);
        waiter.watch_path = NULL; /* pred is about to be freed */
        pthread_mutex_unlock(&zb->mu);
        free(pred);
        free(holder);
        int rc = queue_position(zb, s, lockpath, mine, have_first ? &first : NULL, &pos, &pred,
                                &holder);
        have_first = false;
        if (rc == ZNONODE || rc_session_gone(rc)) {
            /* Our node vanished (session expired, or someone deleted it
             * while we waited): start over if time allows. */
            if (w->deadline != 0 && dlock__now_ms() < w->deadline)
                goto restart;
            err = dlock__err(DLOCK_ECONN, "%s: lock '%s': our node %s vanished while waiting",
                             zb->servers, h->name, mine);
            goto out_delete;
        }
        if (rc_transient(rc) && w->deadline != 0) {
            /* Disconnected: the session (and our place) may survive.
             * Wait for a reconnect (the watcher wakes us) and look again. */
            int r = dlock__wait_sleep(w, seq, dlock__now_ms() + 1000);
            if (r == DLOCK_OK)
                continue;
            err = r == DLOCK_ECANCELED
                      ? dlock__err(r, "%s: lock '%s': wait canceled", zb->servers, h->name)
                      : dlock__err(r, "%s: lock '%s': timed out waiting (disconnected: %s)",
                                   zb->servers, h->name, zerror(rc));
            goto out_delete;
        }
        if (rc != ZOK) {
            err = zk_fail(zb, rc, "list", lockpath);
            goto out_delete;
        }
        if (pos == 0) {
            struct zk_hold *zh = calloc(1, sizeof *zh);
            if (!zh) {
                err = dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
                goto out_delete;
            }
            zh->path = mine;
            mine = NULL;
            zh->gen = s->gen;
            zh->czxid = czxid;
            h->bdata = zh;
            h->token = (uint64_t)czxid;
            snprintf(h->owner, sizeof h->owner, "%s", basename_of(zh->path));
            /* The hold lasts as long as the session: its validity is the
             * negotiated session timeout, whatever lease was asked. */
            pthread_mutex_lock(&zb->mu);
            if (s->timeout_ms > 0)
                h->lease_ms = s->timeout_ms;
            pthread_mutex_unlock(&zb->mu);
            dlock__hold_confirmed(zb->c, h, sent);
            err = DLOCK_OK;
            goto out;
        }
        if (w->deadline == 0) {
            err = dlock__err(DLOCK_EBUSY, "%s: lock '%s' is held by node %s/%s", zb->servers,
                             h->name, lockpath, holder ? holder : "?");
            goto out_delete;
        }
        /* Watch only our predecessor; if it is already gone, look again. */
        pthread_mutex_lock(&zb->mu);
        waiter.watch_path = pred;
        pthread_mutex_unlock(&zb->mu);
        struct Stat st;
        rc = rq_exists(zb, s->zh, pred, zk_watcher, s, &st);
        if (rc == ZNONODE)
            continue;
        if (rc != ZOK && !rc_transient(rc) && !rc_session_gone(rc)) {
            err = zk_fail(zb, rc, "watch", pred);
            goto out_delete;
        }
        /* Sleep until the predecessor goes, the session changes, or a
         * session timeout passes (safety net for a lost notification). */
        pthread_mutex_lock(&zb->mu); /* the watcher writes it on each connect */
        int64_t timeout = s->timeout_ms > 0 ? s->timeout_ms : zb->c->opts.lease_ms;
        pthread_mutex_unlock(&zb->mu);
        int64_t until = dlock__now_ms() + (rc == ZOK ? timeout : 200);
        int r = dlock__wait_sleep(w, seq, until);
        if (r == DLOCK_ETIMEDOUT) {
            err = dlock__err(DLOCK_ETIMEDOUT, "%s: lock '%s': timed out waiting behind node %s",
                             zb->servers, h->name, pred);
            goto out_delete;
        }
        if (r == DLOCK_ECANCELED) {
            err = dlock__err(DLOCK_ECANCELED, "%s: lock '%s': wait canceled", zb->servers,
                             h->name);
            goto out_delete;
        }
        if (r != DLOCK_OK) {
            err = r;
            goto out_delete;
        }
        pthread_mutex_lock(&zb->mu);
        bool usable = session_usable(s);
        pthread_mutex_unlock(&zb->mu);
        if (!usable)
            goto restart;
    }

out_delete:
    if (mine) {
        int saved = err;
        char msg[512];
        snprintf(msg, sizeof msg, "%s", dlock_errmsg());
        delete_own_node(zb, s, mine);
        err = dlock__err(saved, "%s", msg);
    }
out:
    waiter_remove(zb, &waiter);
    deallocate_String_vector(&first);
    if (s)
        session_put(zb, s);
    free(mine);
    free(pred);
    free(holder);
    free(lockpath);
    return err;
}

/* --------------------------------------------------------------- release */

static int zk_release(void *state, struct dlock__hold *h)
{
    struct zk_backend *zb = state;
    struct zk_hold *zh = h->bdata;
    h->bdata = NULL;
    if (!zh)
        return dlock__err(DLOCK_ELOST, "%s: lock '%s' has no node", zb->servers, h->name);
    int err = DLOCK_OK;
    pthread_mutex_lock(&zb->mu);
    struct zk_session *s = zb->cur;
    bool same = s && s->gen == zh->gen && session_usable(s);
    if (same)
        s->refs++;
    pthread_mutex_unlock(&zb->mu);
    if (!same) {
        err = dlock__err(DLOCK_ELOST, "%s: lock '%s': the session that held node %s expired",
                         zb->servers, h->name, zh->path);
    } else {
        int64_t deadline = op_deadline(zb);
        int rc;
        bool unheard = false; /* a delete of ours may have been executed */
        for (;;) {
            rc = rq_delete(zb, s->zh, zh->path);
            if (!rc_transient(rc) || dlock__now_ms() >= deadline)
                break;
            unheard = true;
            struct timespec pause = {0, 50 * 1000000L};
            nanosleep(&pause, NULL);
        }
        /* "No node" after a delete whose reply was lost: most likely that
         * delete did it (the node was there when we sent it, else the
         * keeper would have said so); the release succeeded. */
        if (rc == ZNONODE && unheard)
            rc = ZOK;
        if (rc == ZNONODE)
            err = dlock__err(DLOCK_ELOST,
                             "%s: lock '%s': node %s was already gone (force-released?)",
                             zb->servers, h->name, zh->path);
        else if (rc_session_gone(rc))
            err = dlock__err(DLOCK_ELOST, "%s: lock '%s': session expired before release",
                             zb->servers, h->name);
        else if (rc != ZOK) {
            err = zk_fail(zb, rc, "delete", zh->path);
            orphan_add(zb, s, zh->path);
        }
        session_put(zb, s);
    }
    free(zh->path);
    free(zh);
    return err;
}

/* ----------------------------------------------------------------- renew */

/* Confirm each hold's node still exists in the same session: a sync,
 * then one exists per hold, pipelined on the session (one round trip plus
 * the hop from our server to the leader). The sync matters in an
 * ensemble: a follower cut off from the leader still answers reads for a
 * while (up to syncLimit ticks) after the leader expired our session;
 * reads ordered after a sync come from a follower the leader still talks
 * to, and so do the session touches that keep the session alive. */
static int zk_renew(void *state, struct dlock__renew_batch *b)
{
    struct zk_backend *zb = state;
    struct dlock__hold **holds = b->holds;
    size_t n = b->n;
    int *result = b->result;
    pthread_mutex_lock(&zb->mu);
    struct zk_session *s = zb->cur;
    bool usable = session_usable(s);
    bool connected = usable && s->state == ZOO_CONNECTED_STATE;
    int64_t session_id = s ? s->session_id : 0; /* the watcher writes it */
    if (s)
        s->refs++;
    pthread_mutex_unlock(&zb->mu);

    struct zk_call **calls = calloc(n ? n : 1, sizeof *calls);
    if (!calls) {
        for (size_t i = 0; i < n; i++)
            result[i] = DLOCK_ENOMEM;
        if (s)
            session_put(zb, s);
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    }
    int64_t sent = dlock__now_ms();
    struct zk_call *barrier = NULL;
    int barrier_rc = ZOK;
    if (connected && n > 0) {
        barrier = call_new(s->zh);
        barrier_rc = barrier ? zoo_async(s->zh, "/", on_synced, barrier) : ZSYSTEMERROR;
        if (barrier && barrier_rc != ZOK) {
            call_dead(barrier, barrier_rc);
            barrier = NULL;
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct dlock__hold *h = holds[i];
        struct zk_hold *zh = h->bdata;
        if (!zh || !s || s->gen != zh->gen || !usable) {
            result[i] = dlock__err(DLOCK_ELOST, "%s: lock '%s': ZooKeeper session expired",
                                   zb->servers, h->name);
            continue;
        }
        if (!connected) {
            result[i] = dlock__err(DLOCK_ECONN,
                                   "%s: lock '%s': disconnected, hold in jeopardy until the "
                                   "session timeout",
                                   zb->servers, h->name);
            continue;
        }
        struct zk_call *k = call_new(s->zh);
        int rc = k ? zoo_aexists(s->zh, zh->path, 0, on_stat, k) : ZSYSTEMERROR;
        if (k && rc != ZOK) {
            call_dead(k, rc);
            k = NULL;
        }
        calls[i] = k;
        result[i] = k ? DLOCK_OK : zk_fail(zb, rc, "check", zh->path);
    }
    /* Wait no longer than the first validity deadline of the batch: the
     * keeper is blocked meanwhile and must be free to declare a hold lost
     * on time (a reply stuck behind a sync could otherwise hold it for a
     * whole op timeout past it). */
    int64_t deadline = op_deadline(zb);
    if (b->deadline < deadline)
        deadline = b->deadline;
    if (barrier)
        barrier_rc = call_wait(barrier, deadline, NULL, NULL, NULL);
    for (size_t i = 0; i < n; i++) {
        if (!calls[i])
            continue;
        struct dlock__hold *h = holds[i];
        struct zk_hold *zh = h->bdata;
        struct Stat st;
        int rc = call_wait(calls[i], deadline, &st, NULL, NULL);
        if (rc == ZOK && barrier_rc != ZOK) {
            /* read, but not known to be current: no confirmation */
            result[i] = zk_fail(zb, barrier_rc, "sync before checking", zh->path);
        } else if (rc == ZOK && st.czxid == zh->czxid && st.ephemeralOwner == session_id) {
            dlock__hold_confirmed(zb->c, h, sent);
            result[i] = DLOCK_OK;
        } else if (rc == ZOK || rc == ZNONODE) {
            result[i] = dlock__err(DLOCK_ELOST,
                                   "%s: lock '%s': node %s is gone (deleted or force-released)",
                                   zb->servers, h->name, zh->path);
        } else if (rc_session_gone(rc)) {
            result[i] = dlock__err(DLOCK_ELOST, "%s: lock '%s': ZooKeeper session expired",
                                   zb->servers, h->name);
        } else {
            result[i] = zk_fail(zb, rc, "check", zh->path);
        }
    }
    free(calls);
    /* Each lost hold's own reason. */
    for (size_t i = 0; i < n; i++) {
        if (result[i] == DLOCK_ELOST) {
            struct zk_hold *zh = holds[i]->bdata;
            bool expired = !zh || !s || s->gen != zh->gen || !usable;
            dlock__err(DLOCK_ELOST,
                       expired ? "%s: lock '%s': the ZooKeeper session holding it expired"
                               : "%s: lock '%s': its node is gone (deleted or force-released)",
                       zb->servers, holds[i]->name);
            dlock__renew_result(b, i, DLOCK_ELOST);
        }
    }
    if (s) {
        if (connected)
            sweep(zb, s);
        session_put(zb, s);
    }
    return DLOCK_OK;
}

/* ------------------------------------------------------------ inspecting */

/* Holder text: the node name and, when it is printable, its data
 * (dlock writes "dlock <pid>@<host>", Curator the client's address). */
static char *holder_text(const char *node, const char *data)
{
    bool printable = data && *data;
    for (const char *p = data; printable && *p; p++)
        if (!isprint((unsigned char)*p))
            printable = false;
    return printable ? dlock__sprintf("%s (%s)", node, data) : dlock__strdup(node);
}

static int zk_inspect(void *state, const char *name, struct dlock_info *info)
{
    struct zk_backend *zb = state;
    char *lockpath = lock_path(zb, name);
    if (!lockpath)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    struct zk_session *s;
    int err = session_get(zb, &s);
    if (err != DLOCK_OK) {
        free(lockpath);
        return err;
    }
    info->mode = DLOCK_EXCLUSIVE;
    info->ttl_ms = -1;
    info->nwaiters = 0;
    err = dlock__info_set_key(info, lockpath);
    struct String_vector kids = {0, NULL};
    int rc = err == DLOCK_OK ? rq_children(zb, s->zh, lockpath, &kids) : ZOK;
    if (err != DLOCK_OK) {
        /* message set */
    } else if (rc == ZNONODE) {
        info->held = 0;
    } else if (rc != ZOK) {
        err = zk_fail(zb, rc, "list", lockpath);
    } else {
        sort_lock_nodes(&kids);
        for (int32_t i = 0; i < kids.count && err == DLOCK_OK; i++) {
            char *path = dlock__sprintf("%s/%s", lockpath, kids.data[i]);
            char *data = NULL;
            struct Stat st;
            rc = path ? rq_get(zb, s->zh, path, &data, &st) : ZSYSTEMERROR;
            if (rc == ZNOAUTH) /* data unreadable (creator ACL): the stat is not */
                rc = rq_exists(zb, s->zh, path, NULL, NULL, &st);
            if (rc == ZNONODE) {
                free(path);
                continue; /* left meanwhile */
            }
            if (rc != ZOK) {
                err = zk_fail(zb, rc, "read", path ? path : lockpath);
                free(path);
                break;
            }
            free(path);
            char *text = holder_text(kids.data[i], data);
            free(data);
            if (!text) {
                err = dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
                break;
            }
            if (!info->held) {
                info->held = 1;
                info->token = (uint64_t)st.czxid;
                err = dlock__info_add_holder(info, text, 0); /* count unknown */
            } else {
                err = dlock__info_add_waiter(info, text);
            }
            free(text);
        }
        if (err == DLOCK_OK && !info->held)
            info->nwaiters = 0;
    }
    deallocate_String_vector(&kids);
    session_put(zb, s);
    free(lockpath);
    return err;
}

static int zk_force_release(void *state, const char *name)
{
    struct zk_backend *zb = state;
    char *lockpath = lock_path(zb, name);
    if (!lockpath)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    struct zk_session *s;
    int err = session_get(zb, &s);
    if (err != DLOCK_OK) {
        free(lockpath);
        return err;
    }
    struct String_vector kids = {0, NULL};
    int rc = rq_children(zb, s->zh, lockpath, &kids);
    if (rc == ZOK) {
        sort_lock_nodes(&kids);
        if (kids.count > 0) {
            char *owner = dlock__sprintf("%s/%s", lockpath, kids.data[0]);
            rc = owner ? rq_delete(zb, s->zh, owner) : ZSYSTEMERROR;
            if (rc != ZOK && rc != ZNONODE)
                err = zk_fail(zb, rc, "delete", owner ? owner : lockpath);
            free(owner);
        }
    } else if (rc != ZNONODE) {
        err = zk_fail(zb, rc, "list", lockpath);
    }
    deallocate_String_vector(&kids);
    session_put(zb, s);
    free(lockpath);
    return err;
}

static int zk_list(void *state, const char *pattern, dlock_list_fn fn, void *arg)
{
    struct zk_backend *zb = state;
    struct zk_session *s;
    int err = session_get(zb, &s);
    if (err != DLOCK_OK)
        return err;
    struct String_vector kids = {0, NULL};
    int rc = rq_children(zb, s->zh, zb->base, &kids);
    session_put(zb, s);
    if (rc == ZNONODE)
        return DLOCK_OK;
    if (rc != ZOK)
        return zk_fail(zb, rc, "list", zb->base);
    const char *prefix = zb->c->opts.key_prefix ? zb->c->opts.key_prefix : "";
    size_t plen = strlen(prefix);
    for (int32_t i = 0; i < kids.count; i++) {
        if (strcmp(zb->base, "/") == 0 && strcmp(kids.data[i], "zookeeper") == 0)
            continue;
        char *name = decode_name(kids.data[i]);
        if (!name) {
            err = dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
            break;
        }
        bool stop = false;
        if (strncmp(name, prefix, plen) == 0 && name[plen] && dlock__glob(pattern, name + plen))
            stop = fn(name + plen, arg) != 0;
        free(name);
        if (stop)
            break;
    }
    deallocate_String_vector(&kids);
    return err;
}

/* ----------------------------------------------------------------- table */

static const char *const zk_schemes[] = {"zk", NULL};

const struct dlock__backend dlock__backend_zk = {
    .version = DLOCK__BACKEND_VERSION,
    .name = "zk",
    .schemes = zk_schemes,
    .caps = DLOCK__CAP_FENCING | DLOCK__CAP_LEASES | DLOCK__CAP_LIST | DLOCK__CAP_FORCE |
            DLOCK__CAP_FAIR | DLOCK__CAP_CLIENT_OWNER,
    .default_port = ZK_DEFAULT_PORT,
    .open = zk_open,
    .close = zk_close,
    .acquire = zk_acquire,
    .release = zk_release,
    .renew = zk_renew,
    .inspect = zk_inspect,
    .force_release = zk_force_release,
    .list = zk_list,
};
