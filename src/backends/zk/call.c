/* call.c -- the ZooKeeper backend's requests: each one goes through the
 * client library's asynchronous API and is waited for with our own
 * deadline, because the library's synchronous calls can block for a whole
 * session timeout. That also lets requests be pipelined (a create and the
 * listing of its siblings, a sync and the read after it, share one round
 * trip). A reply that comes after its caller gave up finds the record
 * still alive (reference counted) and undoes a late create.
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

struct zk_call *dlock__zk_call_new(zhandle_t *zh)
{
    struct zk_call *k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    dlock__cond_init_monotonic(&k->cv);
    pthread_mutex_init(&k->mu, NULL);
    k->refs = 2;
    k->zh = zh;
    return k;
}

static void zk_call_unref(struct zk_call *k)
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
void dlock__zk_on_ignored(int rc, const void *data)
{
    (void)rc;
    (void)data;
}

static void zk_on_void(int rc, const void *data)
{
    struct zk_call *k = (struct zk_call *)data;
    pthread_mutex_lock(&k->mu);
    call_finish_locked(k, rc);
    pthread_mutex_unlock(&k->mu);
    zk_call_unref(k);
}

void dlock__zk_on_stat(int rc, const struct Stat *stat, const void *data)
{
    struct zk_call *k = (struct zk_call *)data;
    pthread_mutex_lock(&k->mu);
    if (rc == ZOK && stat)
        k->stat = *stat;
    call_finish_locked(k, rc);
    pthread_mutex_unlock(&k->mu);
    zk_call_unref(k);
}

static void zk_on_data(int rc, const char *value, int len, const struct Stat *stat,
                       const void *data)
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
    zk_call_unref(k);
}

static void zk_on_strings(int rc, const struct String_vector *strings, const void *data)
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
    zk_call_unref(k);
}

void dlock__zk_on_synced(int rc, const char *value, const void *data)
{
    (void)value;
    zk_on_void(rc, data);
}

static void zk_on_created(int rc, const char *value, const struct Stat *stat, const void *data)
{
    struct zk_call *k = (struct zk_call *)data;
    pthread_mutex_lock(&k->mu);
    if (rc == ZOK) {
        if (k->abandoned && value) {
            /* The caller timed out and moved on: this node would sit in
             * the queue until the session ends. Take it back. */
            zoo_adelete(k->zh, value, -1, dlock__zk_on_ignored, NULL);
        } else {
            if (stat)
                k->stat = *stat;
            if (value && !(k->value = strdup(value)))
                rc = ZSYSTEMERROR;
        }
    }
    call_finish_locked(k, rc);
    pthread_mutex_unlock(&k->mu);
    zk_call_unref(k);
}

/* Wait for K until DEADLINE (monotonic ms) and drop the caller's
 * reference. Returns the request's code, or ZOPERATIONTIMEOUT. Copies
 * the results out first through the OUT pointers that are not NULL. */
int dlock__zk_call_wait(struct zk_call *k, int64_t deadline, struct Stat *stat, char **value,
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
            zk_call_unref(k);
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
    zk_call_unref(k);
    return rc;
}

/* Start failed synchronously: the completion will never run. */
int dlock__zk_call_dead(struct zk_call *k, int rc)
{
    zk_call_unref(k);
    zk_call_unref(k);
    return rc;
}

/* The deadline of one request of a caller that must be done by UNTIL
 * (monotonic ms; 0 or DLOCK__NEVER: only the op timeout bounds it): now
 * plus dlock__time_left(UNTIL, op timeout), or 0 when UNTIL has passed
 * and nothing may be sent. */
int64_t dlock__zk_call_deadline(struct zk_backend *zb, int64_t until)
{
    int64_t left = dlock__time_left(until, zb->c->opts.op_timeout_ms);
    return left > 0 ? dlock__now_ms() + left : 0;
}

/* ------------------------------------------------------------- requests */

/* The start of every request: N call records in K, each with the
 * request's deadline (see dlock__zk_call_deadline); KIDS, when not NULL, emptied
 * for a listing to fill. ZOPERATIONTIMEOUT when UNTIL has passed,
 * ZSYSTEMERROR when out of memory (then no record is left), else ZOK. */
static int zk_calls_start(struct zk_backend *zb, zhandle_t *zh, int64_t until, struct zk_call **k,
                          int n, struct String_vector *kids)
{
    if (kids) {
        kids->count = 0;
        kids->data = NULL;
    }
    int64_t deadline = dlock__zk_call_deadline(zb, until);
    if (!deadline)
        return ZOPERATIONTIMEOUT;
    for (int i = 0; i < n; i++) {
        k[i] = dlock__zk_call_new(zh);
        if (!k[i]) {
            while (i-- > 0)
                dlock__zk_call_dead(k[i], ZSYSTEMERROR);
            return ZSYSTEMERROR;
        }
        k[i]->deadline = deadline;
    }
    return ZOK;
}

/* The end of a one-request call: SENT is what starting the request on K
 * returned; wait for its reply until its deadline, or drop K when it
 * never went out. */
static int zk_call_sent(struct zk_call *k, int sent, struct Stat *stat, char **value,
                        struct String_vector *kids)
{
    if (sent != ZOK)
        return dlock__zk_call_dead(k, sent);
    return dlock__zk_call_wait(k, k->deadline, stat, value, kids);
}

static const struct ACL_vector *zk_node_acl(struct zk_backend *zb)
{
    return zb->creator_acl ? &ZOO_CREATOR_ALL_ACL : &ZOO_OPEN_ACL_UNSAFE;
}

int dlock__zk_rq_create(struct zk_backend *zb, zhandle_t *zh, const char *path, const char *data,
                        int mode, char **created, struct Stat *stat, int64_t until)
{
    struct zk_call *k;
    int rc = zk_calls_start(zb, zh, until, &k, 1, NULL);
    if (rc != ZOK)
        return rc;
    rc = zoo_acreate2(zh, path, data, data ? (int)strlen(data) : -1, zk_node_acl(zb), mode,
                      zk_on_created, k);
    return zk_call_sent(k, rc, stat, created, NULL);
}

int dlock__zk_rq_exists(struct zk_backend *zb, zhandle_t *zh, const char *path, watcher_fn watcher,
                        void *watch_ctx, struct Stat *stat, int64_t until)
{
    struct zk_call *k;
    int rc = zk_calls_start(zb, zh, until, &k, 1, NULL);
    if (rc != ZOK)
        return rc;
    rc = watcher ? zoo_awexists(zh, path, watcher, watch_ctx, dlock__zk_on_stat, k)
                 : zoo_aexists(zh, path, 0, dlock__zk_on_stat, k);
    return zk_call_sent(k, rc, stat, NULL, NULL);
}

int dlock__zk_rq_get(struct zk_backend *zb, zhandle_t *zh, const char *path, char **data,
                     struct Stat *stat, int64_t until)
{
    struct zk_call *k;
    int rc = zk_calls_start(zb, zh, until, &k, 1, NULL);
    if (rc != ZOK)
        return rc;
    return zk_call_sent(k, zoo_aget(zh, path, 0, zk_on_data, k), stat, data, NULL);
}

int dlock__zk_rq_set(struct zk_backend *zb, zhandle_t *zh, const char *path, const char *data,
                     struct Stat *stat, int64_t until)
{
    struct zk_call *k;
    int rc = zk_calls_start(zb, zh, until, &k, 1, NULL);
    if (rc != ZOK)
        return rc;
    rc = zoo_aset(zh, path, data, (int)strlen(data), -1, dlock__zk_on_stat, k);
    return zk_call_sent(k, rc, stat, NULL, NULL);
}

int dlock__zk_rq_check_then(struct zk_backend *zb, zhandle_t *zh, struct zk_guarded_write *gw,
                            int64_t until)
{
    gw->errs[0] = gw->errs[1] = ZRUNTIMEINCONSISTENCY;
    struct zk_call *k;
    int rc = zk_calls_start(zb, zh, until, &k, 1, NULL);
    if (rc != ZOK)
        return rc;
    zoo_op_t ops[2];
    zoo_check_op_init(&ops[0], gw->check, -1);
    if (gw->remove)
        zoo_delete_op_init(&ops[1], gw->path, -1);
    else if (gw->create)
        zoo_create_op_init(&ops[1], gw->path, gw->data, (int)gw->len, zk_node_acl(zb), 0, NULL, 0);
    else
        zoo_set_op_init(&ops[1], gw->path, gw->data, (int)gw->len, -1, &k->multi_stat);
    k->refs++; /* ours, to read the results after the wait let go of its own */
    rc = zoo_amulti(zh, 2, ops, k->multi, zk_on_void, k);
    if (rc != ZOK) {
        zk_call_unref(k);
        return dlock__zk_call_dead(k, rc);
    }
    rc = dlock__zk_call_wait(k, k->deadline, NULL, NULL, NULL);
    pthread_mutex_lock(&k->mu);
    if (k->done)
        for (int i = 0; i < 2; i++)
            gw->errs[i] = k->multi[i].err;
    pthread_mutex_unlock(&k->mu);
    zk_call_unref(k);
    return rc;
}

int dlock__zk_rq_children(struct zk_backend *zb, zhandle_t *zh, const char *path,
                          struct String_vector *kids, int64_t until)
{
    struct zk_call *k;
    int rc = zk_calls_start(zb, zh, until, &k, 1, kids);
    if (rc != ZOK)
        return rc;
    rc = zoo_aget_children(zh, path, 0, zk_on_strings, k);
    return zk_call_sent(k, rc, NULL, NULL, kids);
}

int dlock__zk_rq_children_watch(struct zk_backend *zb, zhandle_t *zh, const char *path,
                                watcher_fn watcher, void *watch_ctx, struct String_vector *kids,
                                int64_t until)
{
    struct zk_call *k;
    int rc = zk_calls_start(zb, zh, until, &k, 1, kids);
    if (rc != ZOK)
        return rc;
    rc = zoo_awget_children(zh, path, watcher, watch_ctx, zk_on_strings, k);
    return zk_call_sent(k, rc, NULL, NULL, kids);
}

int dlock__zk_rq_delete(struct zk_backend *zb, zhandle_t *zh, const char *path, int64_t until)
{
    struct zk_call *k;
    int rc = zk_calls_start(zb, zh, until, &k, 1, NULL);
    if (rc != ZOK)
        return rc;
    return zk_call_sent(k, zoo_adelete(zh, path, -1, zk_on_void, k), NULL, NULL, NULL);
}

/* A failure of a request on PATH as a DLOCK_E* code with a message in
 * the server's (the client library's) words. */
int dlock__zk_fail(struct zk_backend *zb, int rc, const char *what, const char *path)
{
    const char *words = zerror(rc);
    switch (rc) {
    case ZNOAUTH:
        return dlock__err(DLOCK_EAUTH, "%s: %s %s: %s (the node's ACL denies this client%s)",
                          zb->servers, what, path, words,
                          zb->auth ? ""
                                   : "; no user:password given: zk://USER@..., the password "
                                     "in the URL or its ?password_file=FILE");
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
        return dlock__err(DLOCK_EBACKEND, "%s: %s %s: %s (%d)", zb->servers, what, path, words, rc);
    }
}

bool dlock__zk_rc_transient(int rc)
{
    return rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT;
}

bool dlock__zk_rc_session_gone(int rc)
{
    return rc == ZSESSIONEXPIRED || rc == ZINVALIDSTATE || rc == ZCLOSING;
}

/* The second request of a pipelined pair, a listing of PATH's children
 * on K[1] behind the first on K[0]: SENT is what starting the first
 * returned. When that failed, both records are dropped and SENT is
 * returned; else *LISTED_SENT says whether the listing went out (its
 * record is dropped when not) and ZOK is returned. */
static int zk_list_behind(zhandle_t *zh, struct zk_call **k, int sent, const char *path,
                          int *listed_sent)
{
    if (sent != ZOK) {
        dlock__zk_call_dead(k[1], sent);
        return dlock__zk_call_dead(k[0], sent);
    }
    *listed_sent = zoo_aget_children(zh, path, 0, zk_on_strings, k[1]);
    if (*listed_sent != ZOK)
        dlock__zk_call_dead(k[1], *listed_sent);
    return ZOK;
}

/* Create RQ->path (EPHEMERAL_SEQUENTIAL) with its data (NULL: our
 * identity) and, in the same round trip, list RQ->lockpath's children:
 * the server handles a session's requests in order, so the listing
 * already shows the new node. Returns the create's code; RQ->out.listed
 * tells whether RQ->kids was filled (caller frees). */
int dlock__zk_rq_create_and_list(struct zk_backend *zb, zhandle_t *zh, struct zk_create_list *rq)
{
    const char *data = rq->data ? rq->data : zb->ident;
    struct String_vector *kids = rq->kids;
    rq->out.listed = false;
    struct zk_call *k[2];
    int rc = zk_calls_start(zb, zh, rq->until, k, 2, kids);
    if (rc != ZOK)
        return rc;
    int64_t deadline = k[0]->deadline;
    rc = zoo_acreate2(zh, rq->path, data, (int)strlen(data), zk_node_acl(zb),
                      ZOO_EPHEMERAL_SEQUENTIAL, zk_on_created, k[0]);
    int lrc;
    rc = zk_list_behind(zh, k, rc, rq->lockpath, &lrc);
    if (rc != ZOK)
        return rc;
    rc = dlock__zk_call_wait(k[0], deadline, &rq->out.stat, &rq->out.created, NULL);
    if (lrc == ZOK) {
        lrc = dlock__zk_call_wait(k[1], deadline, NULL, NULL, kids);
        rq->out.listed = rc == ZOK && lrc == ZOK;
        if (!rq->out.listed)
            deallocate_String_vector(kids);
    }
    return rc;
}

/* A listing of PATH's children made current: a sync pipelined before the
 * getChildren (no extra round trip). A follower cut off from the leader
 * keeps answering reads for up to syncLimit ticks while the leader may
 * already have expired our session and given the lock to the next
 * contender: a listing it serves could show us first although we are
 * not, with a validity counted from now. The sync goes through the
 * leader, and reads after it are at least as new. */
int dlock__zk_rq_children_synced(struct zk_backend *zb, zhandle_t *zh, const char *path,
                                 struct String_vector *kids, int64_t until)
{
    struct zk_call *k[2];
    int rc = zk_calls_start(zb, zh, until, k, 2, kids);
    if (rc != ZOK)
        return rc;
    int64_t deadline = k[0]->deadline;
    int lrc;
    rc = zk_list_behind(zh, k, zoo_async(zh, "/", dlock__zk_on_synced, k[0]), path, &lrc);
    if (rc != ZOK)
        return rc;
    rc = dlock__zk_call_wait(k[0], deadline, NULL, NULL, NULL);
    if (lrc == ZOK)
        lrc = dlock__zk_call_wait(k[1], deadline, NULL, NULL, kids);
    if (rc != ZOK || lrc != ZOK) {
        deallocate_String_vector(kids);
        kids->count = 0;
        kids->data = NULL;
    }
    return rc != ZOK ? rc : lrc;
}

int dlock__zk_rq_watch_many(struct zk_backend *zb, zhandle_t *zh, struct zk_watch_rq *v, int n,
                            watcher_fn watcher, void *watch_ctx, int64_t until)
{
    struct zk_call **k = calloc((size_t)n, sizeof *k);
    int rc = k ? zk_calls_start(zb, zh, until, k, n, NULL) : ZSYSTEMERROR;
    for (int i = 0; i < n; i++)
        v[i].rc = ZOPERATIONTIMEOUT;
    if (rc != ZOK) {
        free(k);
        return rc;
    }
    int sent = 0;
    while (sent < n && rc == ZOK) {
        struct zk_call *ki = k[sent];
        rc = v[sent].exists
                 ? zoo_awexists(zh, v[sent].path, watcher, watch_ctx, dlock__zk_on_stat, ki)
                 : zoo_awget(zh, v[sent].path, watcher, watch_ctx, zk_on_data, ki);
        if (rc == ZOK)
            sent++;
    }
    for (int i = sent; i < n; i++) /* never went out */
        dlock__zk_call_dead(k[i], rc);
    int64_t deadline = n ? k[0]->deadline : 0;
    for (int i = 0; i < sent; i++) {
        v[i].rc = dlock__zk_call_wait(k[i], deadline, NULL, NULL, NULL);
        if (rc == ZOK && dlock__zk_rc_transient(v[i].rc))
            rc = v[i].rc;
    }
    free(k);
    return rc;
}
