/* etcd.c -- the etcd backend: exclusive locks on the key layout of Go's
 * concurrency.Mutex, so `etcdctl lock NAME` and dlock exclude each other
 * and share one first-come-first-served queue.
 *
 * A contender for NAME puts the key "<prefix>NAME/<lease id in hex>",
 * attached to its lease, in a transaction that creates it only if absent
 * and reads the oldest key under "<prefix>NAME/" in the same round trip.
 * The key with the smallest create revision owns the lock; every other
 * contender watches only the key created just before its own and, when
 * that one is deleted, looks again -- and checks that its own key still
 * exists (etcd 3.4's own client forgets that: etcd #11456). The fencing
 * token is the own key's create revision, which etcd only ever increases.
 *
 * One lease per client (TTL = the lease option, in whole seconds rounded
 * up) carries every hold; the keeper renews it through renew(), one
 * keepalive for all holds, plus one read that checks each key is still
 * ours (force-released keys are reported lost). A lease that expired or was
 * revoked makes every hold lost and the next acquire grants a fresh one. A
 * hold with a fixed or a different lease gets a lease of its own.
 *
 * The core queues the threads of one client per name (CAP_CLIENT_OWNER),
 * so acquire() sees at most one thread per name: one key per lease and
 * name, as in Go. The transport (JSON gateway over libcurl, watch thread)
 * lives in etcd_http.c. docs/protocol-etcd.md tells the whole story.
 */
#include "core.h"
#include "etcd_http.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ETCD_DEFAULT_PORT 2379
#define GRPC_NOT_FOUND 5
#define GRPC_FAILED_PRECONDITION 9
#define TXN_MAX_OPS 100 /* etcd's default --max-txn-ops is 128 */
#define LIST_PAGE 1000
#define WITHDRAW_GRACE_MS 1000 /* a give-up's delete, past the caller's deadline */

/* ------------------------------------------------------------ structures */

/* A key we could not delete (server unreachable): retried later so a dead
 * waiter's key never blocks the queue while our lease lives on. */
struct etcd_orphan {
    char *key;
    struct etcd_orphan *next;
};

/* An acquire waiting for another thread's session lease grant. */
struct grant_waiter {
    struct dlock__wait *w;
    struct grant_waiter *next;
};

struct etcd_backend {
    struct dlock_client *c;
    struct etcd_conn *k;
    char *prefix;       /* put before every lock name ("" by default) */
    const char *label;  /* "etcd 127.0.0.1:2379" (owned by k) */
    char ident[128];    /* value of our keys: "dlock <pid>@<host>" */

    bool granting;            /* (mu) a thread is granting / freshening the
                                 session lease; the others wait, cancelably */
    struct grant_waiter *grant_waiters; /* (mu) */
    pthread_mutex_t sweep_mu; /* held while orphans are being deleted */
    pthread_mutex_t mu;       /* the fields below */
    int64_t lease;            /* session lease, 0 = none (yet, or lost) */
    int64_t lease_confirmed;  /* send time of its last grant / keepalive */
    struct etcd_orphan *orphans;
};

/* A lease as an acquire uses it. */
struct lease_ref {
    int64_t id;
    int64_t ttl_ms;    /* what we asked for, in ms (whole seconds) */
    int64_t confirmed; /* send time of the last grant or keepalive */
    bool own;          /* a lease of this hold only (fixed / other TTL) */
};

/* h->bdata */
struct etcd_hold {
    char *key;
    int64_t rev;   /* create revision = token */
    int64_t lease;
    bool own_lease;
};

/* ------------------------------------------------------------- requests */

static int nomem(struct etcd_backend *s)
{
    return dlock__err(DLOCK_ENOMEM, "%s: out of memory", s->label);
}

static int saved_err(int rc, char *msg, size_t size)
{
    snprintf(msg, size, "%s", dlock_errmsg());
    return rc;
}

static char *i64s(int64_t v)
{
    return dlock__sprintf("%lld", (long long)v);
}

/* {"key": b64(key)} plus, when PREFIX_END, the range end of KEY as a
 * prefix. */
static json_t *range_of(const char *key, bool prefix_end)
{
    /* An empty prefix means every key: etcd wants the key "\0" then. */
    char *kb = *key || !prefix_end ? etcd_b64(key, strlen(key)) : etcd_b64("", 1);
    json_t *r = kb ? json_pack("{s:s}", "key", kb) : NULL;
    free(kb);
    if (r && prefix_end) {
        char *eb = etcd_prefix_end_b64(key);
        if (!eb) {
            json_decref(r);
            return NULL;
        }
        json_object_set_new(r, "range_end", json_string(eb));
        free(eb);
    }
    return r;
}

/* The range op "oldest key under PFX" (Go's WithFirstCreate). */
static json_t *first_created(const char *pfx)
{
    json_t *r = range_of(pfx, true);
    if (r) {
        json_object_set_new(r, "sort_order", json_string("ASCEND"));
        json_object_set_new(r, "sort_target", json_string("CREATE"));
        json_object_set_new(r, "limit", json_string("1"));
    }
    return r;
}

/* The range op "newest key under PFX created before revision REV" (Go's
 * waitDeletes: WithLastCreate + WithMaxCreateRev). */
static json_t *last_created_before(const char *pfx, int64_t rev)
{
    json_t *r = range_of(pfx, true);
    char *max = i64s(rev - 1);
    if (!r || !max) {
        json_decref(r);
        free(max);
        return NULL;
    }
    json_object_set_new(r, "sort_order", json_string("DESCEND"));
    json_object_set_new(r, "sort_target", json_string("CREATE"));
    json_object_set_new(r, "limit", json_string("1"));
    json_object_set_new(r, "max_create_revision", json_string(max));
    json_object_set_new(r, "keys_only", json_true());
    free(max);
    return r;
}

/* The first kv of response K of a txn reply (NULL if none). */
static json_t *txn_kv(json_t *reply, size_t k)
{
    json_t *resp = json_array_get(json_object_get(reply, "responses"), k);
    json_t *range = json_object_get(resp, "response_range");
    return json_array_get(json_object_get(range, "kvs"), 0);
}

static int64_t header_rev(json_t *reply)
{
    return etcd_int(json_object_get(reply, "header"), "revision");
}

/* Decoded key of a kv (caller frees). */
static char *kv_key(json_t *kv)
{
    const char *kb = json_string_value(json_object_get(kv, "key"));
    return kb ? etcd_unb64(kb, NULL) : NULL;
}

/* ----------------------------------------------------------------- leases */

static void random_bytes(void *buf, size_t n)
{
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? read(fd, buf, n) : -1;
    if (fd >= 0)
        close(fd);
    if (got != (ssize_t)n) {
        unsigned char *p = buf;
        for (size_t i = 0; i < n; i++)
            p[i] = (unsigned char)(rand() ^ (int)(dlock__now_ms() >> (i % 8)));
    }
}

/* Grant a lease of TTL_MS (rounded up to whole seconds). We choose its ID
 * ourselves, so a grant retried after a lost reply is recognised ("lease
 * already exists") instead of leaving a second lease behind. */
static int lease_grant(struct etcd_backend *s, const char *name, int64_t ttl_ms,
                       struct lease_ref *out, const struct etcd_limits *lim)
{
    uint64_t id = 0;
    int64_t ttl_s = (ttl_ms + 999) / 1000, sent = 0;
    int rc = DLOCK_EBACKEND;
    char what[1200];
    snprintf(what, sizeof what, "grant a lease for lock '%s'", name);
    for (int attempt = 0; rc && attempt < 3; attempt++) {
        id = 0;
        while (!id) {
            random_bytes(&id, sizeof id);
            id &= 0x7fffffffffffffffull;
        }
        char *ids = i64s((int64_t)id), *ttls = i64s(ttl_s);
        json_t *req = ids && ttls ? json_pack("{s:s, s:s}", "TTL", ttls, "ID", ids) : NULL;
        free(ids);
        free(ttls);
        if (!req)
            return nomem(s);
        json_t *reply = NULL;
        int code = 0;
        bool resent = false;
        sent = dlock__now_ms();
        rc = etcd_call_lim(s->k, "/v3/lease/grant", req, &reply, what, &code, &resent, lim);
        json_decref(req);
        json_decref(reply);
        if (rc == DLOCK_EBACKEND && code == GRPC_FAILED_PRECONDITION &&
            strstr(dlock_errmsg(), "lease already exists")) {
            if (resent)
                rc = DLOCK_OK; /* our own earlier attempt went through */
            /* else the ID is someone else's lease: never share it, draw
             * another one */
        } else if (rc) {
            return rc;
        }
    }
    if (rc)
        return rc;
    out->id = (int64_t)id;
    out->ttl_ms = ttl_s * 1000;
    out->confirmed = sent;
    return DLOCK_OK;
}

/* One keepalive of lease ID: DLOCK_OK with *SENT set, DLOCK_ELOST when
 * etcd no longer knows it, or a transport error. */
static int lease_keepalive(struct etcd_backend *s, int64_t id, int64_t *sent,
                           const struct etcd_limits *lim)
{
    char *ids = i64s(id);
    json_t *req = ids ? json_pack("{s:s}", "ID", ids) : NULL;
    free(ids);
    if (!req)
        return nomem(s);
    json_t *reply = NULL;
    *sent = dlock__now_ms();
    char what[80];
    snprintf(what, sizeof what, "keep lease %llx alive", (unsigned long long)id);
    int rc = etcd_call_lim(s->k, "/v3/lease/keepalive", req, &reply, what, NULL, NULL, lim);
    json_decref(req);
    if (rc)
        return rc;
    int64_t ttl = etcd_int(json_object_get(reply, "result"), "TTL");
    json_decref(reply);
    if (ttl <= 0)
        return dlock__err(DLOCK_ELOST, "%s: lease %llx expired or was revoked", s->label,
                          (unsigned long long)id);
    return DLOCK_OK;
}

static void lease_revoke(struct etcd_backend *s, int64_t id, const struct etcd_limits *lim)
{
    char *ids = i64s(id);
    json_t *req = ids ? json_pack("{s:s}", "ID", ids) : NULL;
    free(ids);
    json_t *reply = NULL;
    if (req)
        etcd_call_lim(s->k, "/v3/lease/revoke", req, &reply, "revoke the lease", NULL, NULL, lim);
    json_decref(req);
    json_decref(reply);
}

/* Forget the session lease ID (it was lost): the next acquire grants one. */
static void session_lease_dead(struct etcd_backend *s, int64_t id)
{
    pthread_mutex_lock(&s->mu);
    if (s->lease == id)
        s->lease = 0;
    pthread_mutex_unlock(&s->mu);
}

/* Become the one thread that grants or freshens the session lease. While
 * another one does (its request may hang on a stalled member for the
 * whole request timeout), sleep on our wait W, so that
 * dlock_lock_cancel() ends it: DLOCK_ECANCELED. */
static int grant_enter(struct etcd_backend *s, struct dlock__wait *w)
{
    pthread_mutex_lock(&s->mu);
    while (s->granting) {
        struct grant_waiter me = {w, s->grant_waiters};
        s->grant_waiters = &me;
        unsigned seq = dlock__wait_seq(w);
        pthread_mutex_unlock(&s->mu);
        pthread_mutex_lock(&w->mu);
        while (!w->canceled && w->seq == seq)
            pthread_cond_wait(&w->cv, &w->mu);
        bool canceled = w->canceled;
        pthread_mutex_unlock(&w->mu);
        pthread_mutex_lock(&s->mu);
        for (struct grant_waiter **p = &s->grant_waiters; *p; p = &(*p)->next)
            if (*p == &me) {
                *p = me.next;
                break;
            }
        if (canceled) {
            pthread_mutex_unlock(&s->mu);
            return DLOCK_ECANCELED;
        }
    }
    s->granting = true;
    pthread_mutex_unlock(&s->mu);
    return DLOCK_OK;
}

static void grant_leave(struct etcd_backend *s)
{
    pthread_mutex_lock(&s->mu);
    s->granting = false;
    for (struct grant_waiter *g = s->grant_waiters; g; g = g->next)
        dlock__wait_wake(g->w);
    pthread_mutex_unlock(&s->mu);
}

/* The session lease, granted if there is none and freshened with a
 * keepalive when its last confirmation is older than a third of its TTL
 * (so a new hold starts with nearly its whole validity). */
static int session_lease(struct etcd_backend *s, const char *name, struct lease_ref *lr,
                         const struct etcd_limits *lim)
{
    int64_t ttl_ms = (s->c->opts.lease_ms + 999) / 1000 * 1000;
    int rc = grant_enter(s, lim->w);
    if (rc)
        return rc;
    pthread_mutex_lock(&s->mu);
    *lr = (struct lease_ref){s->lease, ttl_ms, s->lease_confirmed, false};
    pthread_mutex_unlock(&s->mu);
    if (lr->id && dlock__now_ms() - lr->confirmed > ttl_ms / 3) {
        int64_t sent;
        rc = lease_keepalive(s, lr->id, &sent, lim);
        if (rc && rc != DLOCK_ELOST) {
            char msg[1024];
            saved_err(rc, msg, sizeof msg);
            dlock__err(rc, "%s (for lock '%s')", msg, name);
        }
        if (rc == DLOCK_OK)
            lr->confirmed = sent;
        else if (rc == DLOCK_ELOST)
            lr->id = 0, rc = DLOCK_OK;
    }
    if (!rc && !lr->id)
        rc = lease_grant(s, name, ttl_ms, lr, lim);
    if (!rc) {
        pthread_mutex_lock(&s->mu);
        s->lease = lr->id;
        s->lease_confirmed = lr->confirmed;
        pthread_mutex_unlock(&s->mu);
    }
    grant_leave(s);
    return rc;
}

/* Keep LR alive while a wait goes on; note the confirmation time. */
static int lease_refresh(struct etcd_backend *s, struct lease_ref *lr,
                         const struct etcd_limits *lim)
{
    int64_t sent;
    int rc = lease_keepalive(s, lr->id, &sent, lim);
    if (rc)
        return rc;
    lr->confirmed = sent;
    if (!lr->own) {
        pthread_mutex_lock(&s->mu);
        if (s->lease == lr->id && sent > s->lease_confirmed)
            s->lease_confirmed = sent;
        pthread_mutex_unlock(&s->mu);
    }
    return DLOCK_OK;
}

/* ------------------------------------------------------------------ keys */

static char *lock_prefix(struct etcd_backend *s, const char *name)
{
    return dlock__sprintf("%s%s/", s->prefix, name);
}

/* Delete KEY; on failure remember it and try again later. True when the
 * key is gone (or can never be deleted by us: no permission). */
static bool delete_key(struct etcd_backend *s, const char *key, int64_t until,
                       struct dlock__wait *w)
{
    json_t *req = range_of(key, false), *reply = NULL;
    struct etcd_limits lim = {until, w};
    char what[1200];
    snprintf(what, sizeof what, "delete own key %s", key);
    int rc = req ? etcd_call_lim(s->k, "/v3/kv/deleterange", req, &reply, what, NULL, NULL, &lim)
                 : DLOCK_ENOMEM;
    json_decref(req);
    json_decref(reply);
    if (rc == DLOCK_OK || rc == DLOCK_EAUTH)
        return true;
    struct etcd_orphan *o = calloc(1, sizeof *o);
    if (o && (o->key = strdup(key))) {
        pthread_mutex_lock(&s->mu);
        o->next = s->orphans;
        s->orphans = o;
        pthread_mutex_unlock(&s->mu);
    } else {
        free(o);
    }
    return false;
}

/* Retry the deletes that failed before (keeper or acquire, best effort),
 * none running past UNTIL (0 = no limit). With TRY, give way to a sweep
 * already under way instead of waiting for it (the keeper). */
static void orphans_sweep(struct etcd_backend *s, int64_t until, bool try,
                          struct dlock__wait *w)
{
    if (try) {
        if (pthread_mutex_trylock(&s->sweep_mu))
            return;
    } else {
        pthread_mutex_lock(&s->sweep_mu);
    }
    pthread_mutex_lock(&s->mu);
    struct etcd_orphan *list = s->orphans;
    s->orphans = NULL;
    pthread_mutex_unlock(&s->mu);
    bool reachable = true;
    while (list) {
        struct etcd_orphan *o = list;
        list = o->next;
        if (reachable) {
            reachable = delete_key(s, o->key, until, w); /* re-queues itself on failure */
            free(o->key);
            free(o);
        } else { /* the cluster is not answering: keep the rest for later */
            pthread_mutex_lock(&s->mu);
            o->next = s->orphans;
            s->orphans = o;
            pthread_mutex_unlock(&s->mu);
        }
    }
    pthread_mutex_unlock(&s->sweep_mu);
}

/* KEY is about to be ours again (put by an acquire): it is no orphan any
 * more. Waits for a sweep in flight, so none of its deletes can land
 * after our put and take the new hold's key away. */
static void orphan_forget(struct etcd_backend *s, const char *key)
{
    pthread_mutex_lock(&s->sweep_mu);
    pthread_mutex_lock(&s->mu);
    for (struct etcd_orphan **p = &s->orphans; *p;) {
        struct etcd_orphan *o = *p;
        if (strcmp(o->key, key) == 0) {
            *p = o->next;
            free(o->key);
            free(o);
        } else {
            p = &o->next;
        }
    }
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_unlock(&s->sweep_mu);
}

/* ---------------------------------------------------------------- acquire */

/* Put our key KEY (under PFX, attached to LEASE) unless it exists, and
 * read the owner, in one transaction (Go's tryAcquire). */
static int put_and_read_owner(struct etcd_backend *s, const char *name, const char *key,
                              const char *pfx, int64_t lease, int64_t *my_rev,
                              int64_t *owner_rev, int *code, const struct etcd_limits *lim)
{
    char *kb = etcd_b64(key, strlen(key));
    char *vb = etcd_b64(s->ident, strlen(s->ident));
    char *ls = i64s(lease);
    json_t *req = NULL;
    if (kb && vb && ls)
        req = json_pack("{s:[{s:s, s:s, s:s, s:s}], s:[{s:{s:s, s:s, s:s}}, {s:o}],"
                        " s:[{s:o}, {s:o}]}",
                        "compare", "result", "EQUAL", "target", "CREATE", "key", kb,
                        "create_revision", "0",
                        "success", "request_put", "key", kb, "value", vb, "lease", ls,
                        "request_range", first_created(pfx),
                        "failure", "request_range", range_of(key, false),
                        "request_range", first_created(pfx));
    free(kb);
    free(vb);
    free(ls);
    if (!req)
        return nomem(s);
    json_t *reply = NULL;
    char what[1200];
    snprintf(what, sizeof what, "acquire '%s' (key %s)", name, key);
    int rc = etcd_call_lim(s->k, "/v3/kv/txn", req, &reply, what, code, NULL, lim);
    json_decref(req);
    if (rc)
        return rc;
    bool created = json_is_true(json_object_get(reply, "succeeded"));
    *my_rev = created ? header_rev(reply) : etcd_int(txn_kv(reply, 0), "create_revision");
    json_t *owner = txn_kv(reply, 1);
    *owner_rev = owner ? etcd_int(owner, "create_revision") : *my_rev;
    json_decref(reply);
    if (*my_rev <= 0)
        return dlock__err(DLOCK_EPROTO, "%s: %s: the reply has no create revision", s->label, what);
    return DLOCK_OK;
}

/* Look at the queue: does our KEY still exist, and which key was created
 * just before ours (*PRED, caller frees; NULL = we own the lock)? *AT is
 * the revision the answer is from. */
static int look(struct etcd_backend *s, const char *name, const char *key, const char *pfx,
                int64_t my_rev, bool *mine_exists, char **pred, int64_t *at,
                const struct etcd_limits *lim)
{
    *pred = NULL;
    json_t *req = json_pack("{s:[{s:o}, {s:o}]}", "success", "request_range",
                            range_of(key, false), "request_range",
                            last_created_before(pfx, my_rev));
    if (!req)
        return nomem(s);
    json_t *reply = NULL;
    char what[1200];
    snprintf(what, sizeof what, "wait for '%s' (key %s)", name, key);
    int rc = etcd_call_lim(s->k, "/v3/kv/txn", req, &reply, what, NULL, NULL, lim);
    json_decref(req);
    if (rc)
        return rc;
    json_t *mine = txn_kv(reply, 0);
    *mine_exists = mine && etcd_int(mine, "create_revision") == my_rev;
    json_t *before = txn_kv(reply, 1);
    *at = header_rev(reply);
    if (before && !(*pred = kv_key(before)))
        rc = nomem(s);
    json_decref(reply);
    return rc;
}

static bool transient(int rc)
{
    return rc == DLOCK_ECONN || rc == DLOCK_EUNAVAIL || rc == DLOCK_EIO;
}

/* Give up a contention: remove our key (and our own lease). The caller's
 * time is up (or it canceled), so this takes a short grace at most; a
 * delete that fails is remembered and retried later. */
static void withdraw(struct etcd_backend *s, const char *key, const struct lease_ref *lr)
{
    int64_t grace = s->c->opts.op_timeout_ms < WITHDRAW_GRACE_MS ? s->c->opts.op_timeout_ms
                                                                  : WITHDRAW_GRACE_MS;
    struct etcd_limits lim = {dlock__now_ms() + grace, NULL};
    if (lr->own)
        lease_revoke(s, lr->id, &lim); /* takes the key with it */
    delete_key(s, key, lim.until, NULL);
}

#define RESTART 1 /* wait_turn(): our key or lease vanished; start again */

/* Sleep until our key (create revision MY_REV) is the oldest under PFX.
 * Go's waitDeletes, with a watch created "from now" on the key just before
 * ours: once etcd confirms the watch we look again (a deletion between our
 * look and the watch's creation is seen then), and sleep until the watch
 * fires. (A watch from a past revision would be served by etcd's 100 ms
 * catch-up loop instead of at once.) Our lease is kept alive meanwhile;
 * the keepalive also bounds every sleep, as a safety net. Returns DLOCK_OK
 * (ours), RESTART, DLOCK_ETIMEDOUT / DLOCK_ECANCELED, or a failure. */
static int wait_turn(struct etcd_backend *s, const char *name, struct dlock__wait *w,
                     const char *key, const char *pfx, int64_t my_rev, struct lease_ref *lr,
                     char *msg, size_t msgsize)
{
    struct etcd_watch *wt = NULL;
    char *watched = NULL;
    int rc;
    /* No request outlives the wait's deadline, and a cancel aborts one in
     * flight: a stalled member must not hold the caller past either. */
    struct etcd_limits lim = {w->deadline == DLOCK__NEVER ? 0 : w->deadline, w};
    for (;;) {
        unsigned seq = dlock__wait_seq(w);
        bool mine = false;
        char *pred = NULL;
        int64_t at = 0;
        rc = look(s, name, key, pfx, my_rev, &mine, &pred, &at, &lim);
        if (rc == DLOCK_OK && !mine) {
            /* Our key is gone while we waited: our lease expired (paused
             * process, long outage) or someone deleted it. Start again at
             * the end of the queue with a live lease. */
            int64_t sent;
            if (lease_keepalive(s, lr->id, &sent, &lim) == DLOCK_ELOST && !lr->own)
                session_lease_dead(s, lr->id);
            free(pred);
            rc = RESTART;
            break;
        }
        if (rc == DLOCK_OK && !pred)
            break; /* nobody before us: ours */
        int64_t now = dlock__now_ms();
        int64_t until = lr->confirmed + lr->ttl_ms / 3; /* keepalive due */
        if (until < now + 200)
            until = now + 500; /* the last keepalive failed: not in a hot loop */
        if (rc == DLOCK_OK) {
            /* Keep a watch on the same key that etcd confirmed and that
             * has not fired. One started last turn and still unconfirmed
             * is replaced: etcd never answers a watch whose auth token
             * expired on the way, it just leaves it hanging. */
            bool same = wt && strcmp(watched, pred) == 0 && etcd_watch_live(wt);
            if (!same) {
                etcd_watch_stop(wt);
                wt = NULL;
                free(watched);
                watched = pred;
                pred = NULL;
                rc = etcd_watch_start(s->k, watched, 0, w, &wt);
            }
        } else if (transient(rc) && w->deadline != 0) {
            /* Outage or election: try again shortly, within our wait. */
            saved_err(rc, msg, msgsize);
            rc = DLOCK_OK;
            if (until > now + 500)
                until = now + 500;
        }
        free(pred);
        if (rc)
            break;
        rc = dlock__wait_sleep(w, seq, until);
        if (rc) /* ETIMEDOUT or ECANCELED */
            break;
        if (dlock__now_ms() >= lr->confirmed + lr->ttl_ms / 3 &&
            (rc = lease_refresh(s, lr, &lim)) == DLOCK_ELOST) {
            if (!lr->own)
                session_lease_dead(s, lr->id);
            rc = RESTART;
            break;
        }
        if (rc == DLOCK_ECANCELED)
            break;
        rc = DLOCK_OK; /* a failed keepalive: the next look tells */
    }
    etcd_watch_stop(wt);
    free(watched);
    return rc;
}

static int etcd_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
{
    struct etcd_backend *s = state;
    if (h->mode != DLOCK_EXCLUSIVE)
        return dlock__err(DLOCK_ENOTSUP, "%s: lock '%s': shared mode is not supported by the "
                                         "etcd backend (Go's concurrency.Mutex is exclusive)",
                          s->label, h->name);
    orphans_sweep(s, 0, false, w); /* a cancel stops it (the rest stays for later) */
    bool own = h->fixed_lease || h->lease_ms != s->c->opts.lease_ms;
    char *pfx = lock_prefix(s, h->name);
    char *key = NULL;
    if (!pfx)
        return nomem(s);
    struct lease_ref lr = {0};
    int rc = DLOCK_OK, restarts = 0;
    char msg[1024];
    /* A cancel aborts the first round trips (lease, put) in flight; like
     * a try-once they are bounded by the request timeout, not by the
     * wait's deadline (which wait_turn() honours), so a short wait still
     * gets a free lock from a slow cluster. */
    struct etcd_limits lim = {0, w};

restart:
    free(key);
    key = NULL;
    if (own && lr.id)
        lease_revoke(s, lr.id, NULL); /* starting over: the old lease of our own goes */
    if (own) {
        rc = lease_grant(s, h->name, h->lease_ms, &lr, &lim);
        lr.own = true;
    } else {
        rc = session_lease(s, h->name, &lr, &lim);
    }
    if (rc) {
        free(pfx);
        return rc;
    }
    key = dlock__sprintf("%s%llx", pfx, (unsigned long long)lr.id);
    if (!key) {
        free(pfx);
        return nomem(s);
    }
    orphan_forget(s, key);
    int64_t my_rev = 0, owner_rev = 0;
    int code = 0;
    rc = put_and_read_owner(s, h->name, key, pfx, lr.id, &my_rev, &owner_rev, &code, &lim);
    if (rc == DLOCK_EBACKEND && code == GRPC_NOT_FOUND && restarts++ < 3) {
        /* "requested lease not found": it expired under us. */
        if (!own)
            session_lease_dead(s, lr.id);
        goto restart;
    }
    if (rc) {
        saved_err(rc, msg, sizeof msg);
        /* The put may have happened before the reply was lost (or the
         * cancel, or the deadline). */
        if (transient(rc) || rc == DLOCK_ECANCELED)
            withdraw(s, key, &lr);
        else if (own)
            lease_revoke(s, lr.id, NULL);
        free(pfx);
        free(key);
        return dlock__err(rc, "%s", msg);
    }
    if (owner_rev != my_rev && w->deadline == 0) {
        withdraw(s, key, &lr);
        free(pfx);
        free(key);
        return DLOCK_EBUSY;
    }

    if (owner_rev != my_rev) {
        /* Wait our turn. */
        rc = wait_turn(s, h->name, w, key, pfx, my_rev, &lr, msg, sizeof msg);
        if (rc == RESTART) {
            if (restarts++ < 5)
                goto restart;
            rc = dlock__err(DLOCK_EBACKEND, "%s: lock '%s': our key %s keeps vanishing while "
                                            "we wait",
                            s->label, h->name, key);
        }
        if (rc) {
            if (rc != DLOCK_ETIMEDOUT && rc != DLOCK_ECANCELED)
                saved_err(rc, msg, sizeof msg);
            withdraw(s, key, &lr);
            free(pfx);
            free(key);
            return rc == DLOCK_ETIMEDOUT || rc == DLOCK_ECANCELED ? rc : dlock__err(rc, "%s", msg);
        }
    }

    /* Ours. Make sure the validity we report starts from a fresh lease
     * confirmation. */
    if (dlock__now_ms() - lr.confirmed > lr.ttl_ms / 3) {
        rc = lease_refresh(s, &lr, NULL);
        if (rc == DLOCK_ELOST && restarts++ < 5) {
            if (!own)
                session_lease_dead(s, lr.id);
            goto restart;
        }
        if (rc) {
            saved_err(rc, msg, sizeof msg);
            withdraw(s, key, &lr);
            free(pfx);
            free(key);
            return dlock__err(rc, "%s", msg);
        }
    }
    free(pfx);
    struct etcd_hold *eh = calloc(1, sizeof *eh);
    if (!eh) {
        withdraw(s, key, &lr);
        free(key);
        return nomem(s);
    }
    eh->key = key;
    eh->rev = my_rev;
    eh->lease = lr.id;
    eh->own_lease = own;
    h->bdata = eh;
    h->token = (uint64_t)my_rev;
    snprintf(h->owner, sizeof h->owner, "%s", key);
    dlock__hold_confirmed(s->c, h, lr.confirmed);
    return DLOCK_OK;
}

/* ---------------------------------------------------------------- release */

static int etcd_release(void *state, struct dlock__hold *h)
{
    struct etcd_backend *s = state;
    struct etcd_hold *eh = h->bdata;
    if (!eh)
        return DLOCK_OK;
    h->bdata = NULL;
    /* Delete the key only if it is still the one we created. */
    char *kb = etcd_b64(eh->key, strlen(eh->key));
    char *rev = i64s(eh->rev);
    json_t *req = NULL;
    if (kb && rev)
        req = json_pack("{s:[{s:s, s:s, s:s, s:s}], s:[{s:o}]}", "compare", "result", "EQUAL",
                        "target", "CREATE", "key", kb, "create_revision", rev, "success",
                        "request_delete_range", range_of(eh->key, false));
    free(kb);
    free(rev);
    int rc;
    json_t *reply = NULL;
    if (!req) {
        rc = nomem(s);
    } else {
        char what[1200];
        snprintf(what, sizeof what, "release '%s' (key %s)", h->name, eh->key);
        bool resent = false;
        rc = etcd_call_resent(s->k, "/v3/kv/txn", req, &reply, what, NULL, &resent);
        /* A release sent again after a lost reply finds the key gone:
         * most likely our first attempt deleted it. Not a loss. */
        if (rc == DLOCK_OK && !json_is_true(json_object_get(reply, "succeeded")) && !resent)
            rc = dlock__err(DLOCK_ELOST, "%s: lock '%s': key %s (token %lld) was gone before "
                                         "the release (lease expired or force-released)",
                            s->label, h->name, eh->key, (long long)eh->rev);
        else if (rc && transient(rc)) {
            char msg[1024];
            saved_err(rc, msg, sizeof msg);
            delete_key(s, eh->key, 0, NULL); /* remembered for a later retry */
            dlock__err(rc, "%s", msg);
        }
    }
    json_decref(req);
    json_decref(reply);
    if (eh->own_lease) {
        char msg[1024];
        saved_err(rc, msg, sizeof msg);
        lease_revoke(s, eh->lease, NULL);
        if (rc)
            dlock__err(rc, "%s", msg);
    }
    free(eh->key);
    free(eh);
    return rc;
}

/* ------------------------------------------------------------------ renew */

/* Check that each key of HOLDS[from..to) still exists with its create
 * revision: one read-only transaction. */
static int check_keys(struct etcd_backend *s, struct dlock__hold **holds, size_t from, size_t to,
                      int *result, const struct etcd_limits *lim)
{
    json_t *ops = json_array();
    for (size_t i = from; ops && i < to; i++) {
        if (result[i] != DLOCK_OK)
            continue;
        struct etcd_hold *eh = holds[i]->bdata;
        json_t *r = range_of(eh->key, false);
        if (!r || json_array_append_new(ops, json_pack("{s:o}", "request_range", r))) {
            json_decref(ops);
            return nomem(s);
        }
    }
    if (!ops)
        return nomem(s);
    if (!json_array_size(ops)) {
        json_decref(ops);
        return DLOCK_OK;
    }
    json_t *req = json_pack("{s:o}", "success", ops), *reply = NULL;
    char what[1200] = "check held keys";
    for (size_t i = from; i < to; i++)
        if (result[i] == DLOCK_OK) {
            snprintf(what, sizeof what, "check held keys (%s%s)",
                     ((struct etcd_hold *)holds[i]->bdata)->key, to - from > 1 ? ", ..." : "");
            break;
        }
    int rc = req ? etcd_call_lim(s->k, "/v3/kv/txn", req, &reply, what, NULL, NULL, lim)
                 : nomem(s);
    json_decref(req);
    if (rc) {
        for (size_t i = from; i < to; i++)
            if (result[i] == DLOCK_OK)
                result[i] = rc;
        return rc;
    }
    size_t k = 0;
    int out = DLOCK_OK;
    for (size_t i = from; i < to; i++) {
        if (result[i] != DLOCK_OK)
            continue;
        struct etcd_hold *eh = holds[i]->bdata;
        json_t *kv = txn_kv(reply, k++);
        if (!kv || etcd_int(kv, "create_revision") != eh->rev) {
            result[i] = DLOCK_ELOST;
            out = dlock__err(DLOCK_ELOST, "%s: lock '%s': key %s (token %lld) is gone or "
                                          "replaced (force-released or deleted)",
                             s->label, holds[i]->name, eh->key, (long long)eh->rev);
        }
    }
    json_decref(reply);
    return out;
}

static int etcd_renew(void *state, struct dlock__renew_batch *b)
{
    struct etcd_backend *s = state;
    struct dlock__hold **holds = b->holds;
    size_t n = b->n;
    int *result = b->result;
    char lost_msg[1024] = "", other_msg[1024] = "";
    int64_t *sent_at = calloc(n ? n : 1, sizeof *sent_at);
    if (!sent_at)
        return nomem(s);
    /* Nothing we send may outlive the earliest validity deadline of the
     * batch: past it the keeper must be free to declare the hold lost,
     * not stuck waiting on a member that stopped answering. */
    struct etcd_limits lim = {b->deadline == DLOCK__NEVER ? 0 : b->deadline, NULL};
    /* One keepalive per distinct lease (usually just the session's). */
    for (size_t i = 0; i < n; i++)
        result[i] = 1; /* not done yet */
    for (size_t i = 0; i < n; i++) {
        if (result[i] != 1)
            continue;
        struct etcd_hold *eh = holds[i]->bdata;
        int64_t sent = 0;
        int rc = eh ? lease_keepalive(s, eh->lease, &sent, &lim)
                    : dlock__err(DLOCK_ELOST, "%s: lock '%s' has no key", s->label, holds[i]->name);
        if (rc == DLOCK_ELOST) {
            snprintf(lost_msg, sizeof lost_msg, "%s", dlock_errmsg());
            if (eh && !eh->own_lease)
                session_lease_dead(s, eh->lease);
        } else if (rc) {
            snprintf(other_msg, sizeof other_msg, "%s", dlock_errmsg());
        } else if (!eh->own_lease) {
            pthread_mutex_lock(&s->mu);
            if (s->lease == eh->lease && sent > s->lease_confirmed)
                s->lease_confirmed = sent;
            pthread_mutex_unlock(&s->mu);
        }
        for (size_t j = i; j < n; j++) {
            struct etcd_hold *ej = holds[j]->bdata;
            if (result[j] == 1 && (j == i || (ej && eh && ej->lease == eh->lease))) {
                result[j] = rc;
                sent_at[j] = sent;
            }
        }
    }
    /* Then one read that our keys are still ours. */
    for (size_t from = 0; from < n; from += TXN_MAX_OPS) {
        size_t to = from + TXN_MAX_OPS < n ? from + TXN_MAX_OPS : n;
        int rc = check_keys(s, holds, from, to, result, &lim);
        if (rc == DLOCK_ELOST)
            snprintf(lost_msg, sizeof lost_msg, "%s", dlock_errmsg());
        else if (rc)
            snprintf(other_msg, sizeof other_msg, "%s", dlock_errmsg());
    }
    for (size_t i = 0; i < n; i++) {
        if (result[i] == DLOCK_OK)
            dlock__hold_confirmed(s->c, holds[i], sent_at[i]);
        else if (result[i] == DLOCK_ELOST)
            snprintf(b->why[i], sizeof b->why[i], "%s", lost_msg);
    }
    free(sent_at);
    /* Deletes that failed before, last and within the same limit (and
     * not at all while an acquire sweeps). */
    int64_t sweep_until = lim.until, now = dlock__now_ms();
    for (size_t i = 0; i < n; i++) /* nor past the next renewal */
        if (holds[i]->lease_ms && (!sweep_until || now + holds[i]->lease_ms / 6 < sweep_until))
            sweep_until = now + holds[i]->lease_ms / 6;
    char saved[1024];
    saved_err(DLOCK_OK, saved, sizeof saved);
    orphans_sweep(s, sweep_until, true, NULL);
    dlock__err(DLOCK_OK, "%s", saved);
    if (*lost_msg)
        dlock__err(DLOCK_ELOST, "%s", lost_msg);
    else if (*other_msg)
        dlock__err(DLOCK_EIO, "%s", other_msg);
    return DLOCK_OK;
}

/* ------------------------------------------------------- inspect and co. */

static int etcd_inspect(void *state, const char *name, struct dlock_info *info)
{
    struct etcd_backend *s = state;
    char *pfx = lock_prefix(s, name);
    json_t *req = pfx ? range_of(pfx, true) : NULL;
    if (!req) {
        free(pfx);
        return nomem(s);
    }
    json_object_set_new(req, "sort_order", json_string("ASCEND"));
    json_object_set_new(req, "sort_target", json_string("CREATE"));
    json_object_set_new(req, "limit", json_string("10000"));
    json_t *reply = NULL;
    char what[1200];
    snprintf(what, sizeof what, "inspect '%s' (keys %s*)", name, pfx);
    int rc = etcd_call(s->k, "/v3/kv/range", req, &reply, what, NULL);
    json_decref(req);
    info->mode = DLOCK_EXCLUSIVE;
    info->ttl_ms = -1;
    info->nwaiters = 0;
    info->held = 0;
    json_t *kvs = rc ? NULL : json_object_get(reply, "kvs");
    size_t i;
    json_t *kv;
    int64_t holder_lease = 0;
    json_array_foreach(kvs, i, kv)
    {
        if (rc)
            break;
        char *key = kv_key(kv);
        const char *vb = json_string_value(json_object_get(kv, "value"));
        char *value = vb ? etcd_unb64(vb, NULL) : NULL;
        char *text = key ? dlock__sprintf("%s%s%s%s", key, value && *value ? " (" : "",
                                          value && *value ? value : "",
                                          value && *value ? ")" : "")
                         : NULL;
        if (!text) {
            rc = nomem(s);
        } else if (i == 0) {
            info->held = 1;
            info->token = (uint64_t)etcd_int(kv, "create_revision");
            holder_lease = etcd_int(kv, "lease");
            rc = dlock__info_set_key(info, key);
            if (!rc)
                rc = dlock__info_add_holder(info, text, 1);
        } else {
            rc = dlock__info_add_waiter(info, text);
        }
        free(text);
        free(key);
        free(value);
    }
    json_decref(reply);
    if (!rc && !info->held)
        rc = dlock__info_set_key(info, pfx);
    if (!rc && info->held && !holder_lease)
        info->ttl_ms = DLOCK_VALID_FOREVER; /* a key without lease */
    if (!rc && holder_lease) {
        char *ids = i64s(holder_lease);
        json_t *treq = ids ? json_pack("{s:s}", "ID", ids) : NULL, *treply = NULL;
        free(ids);
        if (treq && etcd_call(s->k, "/v3/lease/timetolive", treq, &treply, what, NULL) == 0) {
            int64_t ttl = etcd_int(treply, "TTL");
            info->ttl_ms = ttl >= 0 ? ttl * 1000 : -1;
        }
        json_decref(treq);
        json_decref(treply);
    }
    free(pfx);
    return rc;
}

static int etcd_force_release(void *state, const char *name)
{
    struct etcd_backend *s = state;
    char *pfx = lock_prefix(s, name);
    json_t *req = pfx ? first_created(pfx) : NULL, *reply = NULL;
    if (!req) {
        free(pfx);
        return nomem(s);
    }
    char what[1200];
    snprintf(what, sizeof what, "force-release '%s' (keys %s*)", name, pfx);
    free(pfx);
    int rc = etcd_call(s->k, "/v3/kv/range", req, &reply, what, NULL);
    json_decref(req);
    json_t *owner = rc ? NULL : json_array_get(json_object_get(reply, "kvs"), 0);
    if (owner) {
        /* Delete that very key (not a newer owner that came meanwhile). */
        const char *kb = json_string_value(json_object_get(owner, "key"));
        char *rev = i64s(etcd_int(owner, "create_revision"));
        char *key = kv_key(owner);
        json_t *del = kb && rev && key
                          ? json_pack("{s:[{s:s, s:s, s:s, s:s}], s:[{s:o}]}", "compare",
                                      "result", "EQUAL", "target", "CREATE", "key", kb,
                                      "create_revision", rev, "success",
                                      "request_delete_range", range_of(key, false))
                          : NULL;
        json_t *dreply = NULL;
        rc = del ? etcd_call(s->k, "/v3/kv/txn", del, &dreply, what, NULL) : nomem(s);
        json_decref(del);
        json_decref(dreply);
        free(rev);
        free(key);
    }
    json_decref(reply);
    return rc;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The lock name of KEY under our prefix: "<prefix>NAME/<hex lease>"; NULL
 * for keys of another shape. */
static char *name_of_key(struct etcd_backend *s, const char *key)
{
    size_t plen = strlen(s->prefix);
    if (strncmp(key, s->prefix, plen) != 0)
        return NULL;
    const char *rest = key + plen, *slash = strrchr(rest, '/');
    if (!slash || slash == rest)
        return NULL;
    size_t hex = strlen(slash + 1);
    if (hex == 0 || hex > 16 || strspn(slash + 1, "0123456789abcdef") != hex)
        return NULL;
    return strndup(rest, (size_t)(slash - rest));
}

static int etcd_list(void *state, const char *pattern, dlock_list_fn fn, void *arg)
{
    struct etcd_backend *s = state;
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = DLOCK_OK;
    char *from = strdup(s->prefix);
    char *end = etcd_prefix_end_b64(s->prefix);
    while (!rc && from && end) {
        char *fb = *from ? etcd_b64(from, strlen(from)) : etcd_b64("", 1);
        json_t *req = fb ? json_pack("{s:s, s:s, s:s, s:b}", "key", fb, "range_end", end,
                                     "limit", "1000", "keys_only", 1)
                         : NULL;
        free(fb);
        json_t *reply = NULL;
        rc = req ? etcd_call(s->k, "/v3/kv/range", req, &reply, "list locks", NULL) : nomem(s);
        json_decref(req);
        if (rc)
            break;
        json_t *kvs = json_object_get(reply, "kvs");
        size_t i;
        json_t *kv;
        char *last = NULL;
        json_array_foreach(kvs, i, kv)
        {
            free(last);
            last = kv_key(kv);
            char *name = last ? name_of_key(s, last) : NULL;
            if (!name)
                continue;
            if (!dlock__glob(pattern, name) || (n && strcmp(names[n - 1], name) == 0)) {
                free(name);
                continue;
            }
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                char **grown = realloc(names, cap * sizeof *names);
                if (!grown) {
                    free(name);
                    rc = nomem(s);
                    break;
                }
                names = grown;
            }
            names[n++] = name;
        }
        bool more = json_is_true(json_object_get(reply, "more"));
        json_decref(reply);
        free(from);
        from = NULL;
        if (!rc && more && last) { /* next page: from the key right after LAST */
            size_t len = strlen(last);
            from = malloc(len + 2);
            if (from) {
                memcpy(from, last, len);
                from[len] = '\x01'; /* keys hold no NUL here: the next key is > last */
                from[len + 1] = 0;
            }
        }
        free(last);
        if (!more)
            break;
    }
    if (!rc && (!end))
        rc = nomem(s);
    free(from);
    free(end);
    qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        bool dup = i + 1 < n && strcmp(names[i], names[i + 1]) == 0; /* report the last */
        if (!rc && !dup && fn(names[i], arg))
            rc = 1;
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc == 1 ? DLOCK_OK : rc;
}

/* ------------------------------------------------------------ open/close */

static void backend_free(struct etcd_backend *s)
{
    if (!s)
        return;
    etcd_conn_free(s->k);
    while (s->orphans) {
        struct etcd_orphan *o = s->orphans;
        s->orphans = o->next;
        free(o->key);
        free(o);
    }
    free(s->prefix);
    pthread_mutex_destroy(&s->sweep_mu);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static void etcd_close(void *state)
{
    struct etcd_backend *s = state;
    if (!s)
        return;
    orphans_sweep(s, 0, false, NULL);
    pthread_mutex_lock(&s->mu);
    int64_t lease = s->lease;
    s->lease = 0;
    pthread_mutex_unlock(&s->mu);
    if (lease)
        lease_revoke(s, lease, NULL); /* waiters behind us need not wait for the TTL */
    backend_free(s);
}

/* The key prefix: the URL's path (without its leading '/', with a '/'
 * added at the end) followed by the prefix option, as given. */
static char *make_prefix(struct dlock_client *c)
{
    const char *path = c->url.path && strcmp(c->url.path, "/") != 0 ? c->url.path + 1 : "";
    size_t plen = strlen(path);
    const char *opt = c->opts.key_prefix ? c->opts.key_prefix : "";
    return dlock__sprintf("%s%s%s", path, plen && path[plen - 1] != '/' ? "/" : "", opt);
}

static int etcd_open(struct dlock_client *c, void **state)
{
    *state = NULL;
    const char *url = c->url.redacted;
    bool tls = strcmp(c->url.scheme, "etcd+https") == 0;
    if (c->url.nhosts == 0)
        return dlock__err(DLOCK_EBADURL, "bad URL '%s': no etcd endpoint (etcd://HOST:PORT)",
                          url);
    if (!tls && (c->opts.tls_ca || c->opts.tls_cert || c->opts.tls_key))
        return dlock__err(DLOCK_EBADURL, "bad URL '%s': TLS options need the etcd+https:// "
                                         "scheme",
                          url);
    if (c->opts.layout && strcmp(c->opts.layout, "concurrency") != 0 &&
        strcmp(c->opts.layout, "etcdctl") != 0)
        return dlock__err(DLOCK_EBADURL, "bad URL '%s': unknown layout '%s' for etcd (the only "
                                         "one is 'concurrency', Go's concurrency.Mutex)",
                          url, c->opts.layout);
    if (c->opts.password && !c->opts.user)
        return dlock__err(DLOCK_EBADURL, "bad URL '%s': a password without a user", url);
    struct etcd_backend *s = calloc(1, sizeof *s);
    if (!s)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    s->c = c;
    pthread_mutex_init(&s->sweep_mu, NULL);
    pthread_mutex_init(&s->mu, NULL);
    s->prefix = make_prefix(c);
    char label[1024];
    size_t len = (size_t)snprintf(label, sizeof label, "etcd");
    for (size_t i = 0; i < c->url.nhosts && len < sizeof label; i++) {
        const struct dlock__host *h = &c->url.hosts[i];
        len += (size_t)snprintf(label + len, sizeof label - len,
                                strchr(h->host, ':') ? "%s[%s]:%d" : "%s%s:%d", i ? "," : " ",
                                h->host, h->port);
    }
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    snprintf(s->ident, sizeof s->ident, "dlock %d@%s", (int)getpid(), host);
    const char *password = c->opts.password;
    if (c->opts.user && !password)
        password = getenv("DLOCK_ETCD_PASSWORD");
    struct etcd_conn_config cfg = {
        .hosts = c->url.hosts,
        .nhosts = c->url.nhosts,
        .tls = tls,
        .tls_ca = c->opts.tls_ca,
        .tls_cert = c->opts.tls_cert,
        .tls_key = c->opts.tls_key,
        .user = c->opts.user,
        .password = password,
        .connect_timeout_ms = c->opts.connect_timeout_ms,
        .op_timeout_ms = c->opts.op_timeout_ms,
        .label = label,
    };
    int rc = s->prefix ? etcd_conn_new(&cfg, &s->k) : dlock__err(DLOCK_ENOMEM, "out of memory");
    if (rc) {
        backend_free(s);
        return rc;
    }
    s->label = etcd_conn_label(s->k);
    /* Say now whether the cluster answers: a serializable read needs no
     * quorum, so a cluster without leader still connects (acquires then
     * report DLOCK_EUNAVAIL). */
    json_t *req = range_of(s->prefix, true), *reply = NULL;
    if (req) {
        json_object_set_new(req, "count_only", json_true());
        json_object_set_new(req, "serializable", json_true());
        rc = etcd_call(s->k, "/v3/kv/range", req, &reply, "connect", NULL);
    } else {
        rc = nomem(s);
    }
    json_decref(req);
    json_decref(reply);
    if (rc) {
        backend_free(s);
        return rc;
    }
    *state = s;
    return DLOCK_OK;
}

static const char *const etcd_schemes[] = {"etcd", "etcd+https", NULL};

const struct dlock__backend dlock__backend_etcd = {
    .version = DLOCK__BACKEND_VERSION,
    .name = "etcd",
    .schemes = etcd_schemes,
    .caps = DLOCK__CAP_FENCING | DLOCK__CAP_LEASES | DLOCK__CAP_LIST | DLOCK__CAP_FORCE |
            DLOCK__CAP_FAIR | DLOCK__CAP_CLIENT_OWNER,
    .default_port = ETCD_DEFAULT_PORT,
    .open = etcd_open,
    .close = etcd_close,
    .acquire = etcd_acquire,
    .release = etcd_release,
    .renew = etcd_renew,
    .inspect = etcd_inspect,
    .force_release = etcd_force_release,
    .list = etcd_list,
};
