/* lease.c -- the etcd backend's session: open and close, the one lease
 * per client that carries every hold (granted on first use, kept alive by
 * the keeper through renew(), which also checks each held key is still
 * ours), the short lease waiting keys hang on (kept alive by the waiting
 * threads), the deletes a lost reply left owing (orphans), retried by
 * later acquires and by the keeper, and the keys a put that lands late
 * may make (strays) on a lease then retired, deleted by the keeper while
 * etcd knows that lease.
 */
#include "etcd.h"

#include <ctype.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WAITER_LEASE_MS 2000 /* how long a killed waiter's key holds up the queue */

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
int dlock__etcd_lease_grant(struct etcd_backend *s, const char *name, int64_t ttl_ms,
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
        char *ids = dlock__etcd_i64s((int64_t)id), *ttls = dlock__etcd_i64s(ttl_s);
        json_t *req = ids && ttls ? json_pack("{s:s, s:s}", "TTL", ttls, "ID", ids) : NULL;
        free(ids);
        free(ttls);
        if (!req)
            return dlock__etcd_nomem(s);
        json_t *reply = NULL;
        int code = 0;
        bool resent = false;
        sent = dlock__now_ms();
        rc = dlock__etcd_call_lim(s->k, "/v3/lease/grant", req, &reply, what, &code, &resent, lim);
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

int dlock__etcd_lease_keepalive(struct etcd_backend *s, int64_t id, int64_t *sent,
                                int64_t *ttl_ms, const struct etcd_limits *lim)
{
    char *ids = dlock__etcd_i64s(id);
    json_t *req = ids ? json_pack("{s:s}", "ID", ids) : NULL;
    free(ids);
    if (!req)
        return dlock__etcd_nomem(s);
    json_t *reply = NULL;
    *sent = dlock__now_ms();
    char what[80];
    snprintf(what, sizeof what, "keep lease %llx alive", (unsigned long long)id);
    int rc = dlock__etcd_call_lim(s->k, "/v3/lease/keepalive", req, &reply, what, NULL, NULL, lim);
    json_decref(req);
    if (rc)
        return rc;
    int64_t ttl = dlock__etcd_int(json_object_get(reply, "result"), "TTL");
    json_decref(reply);
    if (ttl <= 0) /* etcd's 0 for a lease it does not know; below: the same */
        return dlock__err(DLOCK_ELOST, "%s: lease %llx expired or was revoked (keepalive "
                                       "answered TTL %lld)",
                          s->label, (unsigned long long)id, (long long)ttl);
    if (ttl_ms) /* (reply.c bounds it: at most etcd's 9000000000 s) */
        *ttl_ms = ttl * 1000;
    return DLOCK_OK;
}

int dlock__etcd_lease_revoke(struct etcd_backend *s, int64_t id, const struct etcd_limits *lim)
{
    char *ids = dlock__etcd_i64s(id);
    json_t *req = ids ? json_pack("{s:s}", "ID", ids) : NULL;
    free(ids);
    json_t *reply = NULL;
    int rc = req ? dlock__etcd_call_lim(s->k, "/v3/lease/revoke", req, &reply, "revoke the lease",
                                        NULL, NULL, lim)
                 : DLOCK_ENOMEM;
    json_decref(req);
    json_decref(reply);
    return rc;
}

static int revoke_owed(void *state, void *arg, int64_t deadline)
{
    struct etcd_limits lim = {deadline, NULL};
    int rc = dlock__etcd_lease_revoke(state, *(int64_t *)arg, &lim);
    return dlock__etcd_transient(rc) || rc == DLOCK_ENOMEM ? rc : DLOCK_OK; /* (not found: gone) */
}

void dlock__etcd_lease_revoke_by(struct etcd_backend *s, int64_t id, int64_t deadline)
{
    int64_t *arg = malloc(sizeof *arg);
    if (!arg)
        return; /* its TTL ends it */
    *arg = id;
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    if (dlock__time_left(deadline, 1) == 0 || revoke_owed(s, arg, deadline) != DLOCK_OK)
        dlock__cleanup_add(s->c, "revoke an etcd lease", revoke_owed, arg, free);
    else
        free(arg);
    dlock__errmsg_restore(DLOCK_OK, msg);
}

/* A put on lease ID may land late (dlock__etcd_late_put): no new key goes
 * on it (mu held). */
static bool lease_retired(const struct etcd_backend *s, int64_t id)
{
    for (const struct etcd_stray *st = s->strays; st; st = st->next)
        if (st->lease == id)
            return true;
    return false;
}

/* Become the one thread that grants or freshens the session lease. While
 * another one does (its request may hang on a stalled member for the
 * whole request timeout), sleep on our wait W: its deadline ends the
 * sleep (DLOCK_ETIMEDOUT), and so does dlock_lock_cancel()
 * (DLOCK_ECANCELED). A try-once wait does not sleep: DLOCK_EBUSY, and the
 * caller takes a lease of its own. */
static int grant_enter(struct etcd_backend *s, const char *name, struct dlock__wait *w)
{
    int rc = DLOCK_OK;
    pthread_mutex_lock(&s->mu);
    while (s->granting) {
        if (!w || dlock__wait_try_once(w)) {
            rc = DLOCK_EBUSY;
            break;
        }
        if ((rc = dlock__waitset_add(&s->grant_ws, w)))
            break;
        unsigned seq = dlock__wait_seq(w); /* grant_leave() wakes under mu */
        pthread_mutex_unlock(&s->mu);
        rc = dlock__wait_sleep(w, seq, DLOCK__NEVER);
        pthread_mutex_lock(&s->mu);
        dlock__waitset_remove(&s->grant_ws, w);
        if (rc)
            break;
    }
    if (!rc)
        s->granting = true;
    pthread_mutex_unlock(&s->mu);
    if (rc == DLOCK_ETIMEDOUT)
        dlock__err(rc, "%s: lock '%s': the session lease another thread is granting did not "
                       "come in time",
                   s->label, name);
    return rc;
}

static void grant_leave(struct etcd_backend *s)
{
    pthread_mutex_lock(&s->mu);
    s->granting = false;
    dlock__waitset_wake_all(&s->grant_ws);
    pthread_mutex_unlock(&s->mu);
}

void dlock__etcd_lease_lower_ttl(int64_t *ttl_ms, int64_t said_ms)
{
    if (said_ms > 0 && said_ms < *ttl_ms)
        *ttl_ms = said_ms;
}

/* Forget the shared lease ID of kind WAITER (the waiters', else the
 * session's): it was lost, the next acquire grants one. */
static void shared_lease_dead(struct etcd_backend *s, bool waiter, int64_t id)
{
    pthread_mutex_lock(&s->mu);
    int64_t *slot = waiter ? &s->wlease : &s->lease;
    if (*slot == id)
        *slot = 0;
    pthread_mutex_unlock(&s->mu);
}

void dlock__etcd_session_lease_dead(struct etcd_backend *s, int64_t id)
{
    shared_lease_dead(s, false, id);
}

void dlock__etcd_waiter_lease_dead(struct etcd_backend *s, int64_t id)
{
    shared_lease_dead(s, true, id);
}

/* The client's shared lease of kind WAITER (the waiters', else the
 * session's) into *LR: granted with TTL_MS if there is none, and
 * freshened with a keepalive when its last confirmation is older than a
 * third of its TTL (so a new hold or waiting key starts with nearly its
 * whole validity). While another thread does that, wait for it within
 * LIM->w (see grant_enter()). */
static int shared_lease(struct etcd_backend *s, const char *name, bool waiter, int64_t ttl_ms,
                        struct lease_ref *lr, const struct etcd_limits *lim)
{
    int rc = grant_enter(s, name, lim->w);
    if (rc)
        return rc;
    pthread_mutex_lock(&s->mu);
    *lr = waiter ? (struct lease_ref){s->wlease, s->wlease_ttl_ms, s->wlease_confirmed, false, true}
                 : (struct lease_ref){s->lease, ttl_ms, s->lease_confirmed, false, false};
    if (!waiter)
        dlock__etcd_lease_lower_ttl(&lr->ttl_ms, s->lease_ttl_ms);
    pthread_mutex_unlock(&s->mu);
    if (lr->id && dlock__now_ms() - lr->confirmed > lr->ttl_ms / 3) {
        int64_t sent, said = 0;
        rc = dlock__etcd_lease_keepalive(s, lr->id, &sent, &said, lim);
        dlock__etcd_lease_lower_ttl(&lr->ttl_ms, said);
        if (rc && rc != DLOCK_ELOST) {
            char msg[DLOCK__MSG_MAX];
            dlock__errmsg_save(msg);
            dlock__err(rc, "%s (for lock '%s')", msg, name);
        }
        if (rc == DLOCK_OK)
            lr->confirmed = sent;
        else if (rc == DLOCK_ELOST)
            lr->id = 0, rc = DLOCK_OK;
    }
    if (!rc && !lr->id) {
        rc = dlock__etcd_lease_grant(s, name, ttl_ms, lr, lim);
        lr->waiter = waiter;
    }
    if (!rc) {
        pthread_mutex_lock(&s->mu);
        if (!lease_retired(s, lr->id)) { /* (retired meanwhile: this acquire may
                                             still use it, no later one) */
            if (waiter) {
                s->wlease = lr->id;
                s->wlease_ttl_ms = lr->ttl_ms;
                s->wlease_confirmed = lr->confirmed;
            } else {
                s->lease = lr->id;
                s->lease_ttl_ms = lr->ttl_ms;
                s->lease_confirmed = lr->confirmed;
            }
        }
        pthread_mutex_unlock(&s->mu);
    }
    grant_leave(s);
    return rc;
}

int dlock__etcd_session_lease(struct etcd_backend *s, const char *name, struct lease_ref *lr,
                              const struct etcd_limits *lim)
{
    int64_t ttl_ms = (s->c->opts.lease_ms + 999) / 1000 * 1000;
    return shared_lease(s, name, false, ttl_ms, lr, lim);
}

int dlock__etcd_waiter_lease(struct etcd_backend *s, const char *name, int64_t max_ttl_ms,
                             struct lease_ref *lr, const struct etcd_limits *lim)
{
    int64_t ttl_ms = max_ttl_ms < WAITER_LEASE_MS ? max_ttl_ms : WAITER_LEASE_MS;
    ttl_ms = ttl_ms < 1000 ? 1000 : (ttl_ms + 999) / 1000 * 1000;
    return shared_lease(s, name, true, ttl_ms, lr, lim);
}

/* Keep LR alive while a wait goes on; note the confirmation time. */
int dlock__etcd_lease_refresh(struct etcd_backend *s, struct lease_ref *lr,
                              const struct etcd_limits *lim)
{
    int64_t sent, said = 0;
    int rc = dlock__etcd_lease_keepalive(s, lr->id, &sent, &said, lim);
    if (rc)
        return rc;
    lr->confirmed = sent;
    dlock__etcd_lease_lower_ttl(&lr->ttl_ms, said);
    pthread_mutex_lock(&s->mu);
    if (lr->waiter && s->wlease == lr->id) {
        dlock__etcd_lease_lower_ttl(&s->wlease_ttl_ms, said);
        if (sent > s->wlease_confirmed)
            s->wlease_confirmed = sent;
    } else if (!lr->own && !lr->waiter && s->lease == lr->id) {
        dlock__etcd_lease_lower_ttl(&s->lease_ttl_ms, said);
        if (sent > s->lease_confirmed)
            s->lease_confirmed = sent;
    }
    pthread_mutex_unlock(&s->mu);
    return DLOCK_OK;
}

/* --------------------------------------------------------------- orphans */

/* Put KEY (ours now; created at REV, 0 = not known) on the orphan list
 * (mu held). */
static void orphan_add(struct etcd_backend *s, char *key, int64_t rev)
{
    struct etcd_orphan *o = calloc(1, sizeof *o);
    if (!o) {
        free(key);
        return;
    }
    o->key = key;
    o->rev = rev;
    o->next = s->orphans;
    s->orphans = o;
}

/* The create revision of KEY now (*REV; 0 = absent) and, when LEASE is
 * not NULL, the lease it hangs on, read within LIM. */
static int read_create_rev(struct etcd_backend *s, const char *key, int64_t *rev,
                           int64_t *lease, const char *what, const struct etcd_limits *lim)
{
    json_t *req = dlock__etcd_range(key, false), *reply = NULL;
    if (req && json_object_set_new(req, "keys_only", json_true())) {
        json_decref(req);
        req = NULL;
    }
    int rc = req ? dlock__etcd_call_lim(s->k, "/v3/kv/range", req, &reply, what, NULL, NULL, lim)
                 : dlock__etcd_nomem(s);
    if (!rc) {
        json_t *kv = json_array_get(json_object_get(reply, "kvs"), 0);
        *rev = dlock__etcd_int(kv, "create_revision");
        if (lease)
            *lease = dlock__etcd_int(kv, "lease");
    }
    json_decref(req);
    json_decref(reply);
    return rc;
}

/* One delete of KEY within (DEADLINE, W), compared on its create
 * revision *REV (0 = not known: read first, and *REV set to what the read
 * found): true when the key is gone or another one now (or can never be
 * deleted by us: no permission). The read comes before any later acquire
 * of KEY puts it again: that acquire forgets the orphan, or waits for the
 * sweep's delete of it in flight (dlock__etcd_orphan_forget). */
static bool delete_once(struct etcd_backend *s, const char *key, int64_t *rev, int64_t deadline,
                        struct dlock__wait *w)
{
    struct etcd_limits lim = {deadline, w};
    char what[1200];
    snprintf(what, sizeof what, "delete own key %s", key);
    int rc = DLOCK_OK;
    if (*rev <= 0) {
        int64_t now_rev = 0;
        rc = read_create_rev(s, key, &now_rev, NULL, what, &lim);
        if (!rc && !now_rev)
            return true; /* not there: nothing of ours to delete */
        if (!rc)
            *rev = now_rev;
    }
    if (!rc)
        rc = dlock__etcd_delete_if_rev(s, key, *rev, what, &lim);
    return rc == DLOCK_OK || rc == DLOCK_EAUTH;
}

static void orphans_sweep(struct etcd_backend *s, int64_t deadline);

/* The core's cleanup work (the keeper, or close, runs it): delete the
 * orphans; DLOCK_OK once none is left, else to be retried after backoff. */
static int orphans_cleanup(void *state, void *arg, int64_t deadline)
{
    (void)arg;
    struct etcd_backend *s = state;
    orphans_sweep(s, deadline);
    pthread_mutex_lock(&s->mu);
    bool left = s->orphans != NULL;
    if (!left)
        s->sweep_queued = false;
    pthread_mutex_unlock(&s->mu);
    return left ? DLOCK_EUNAVAIL : DLOCK_OK;
}

bool dlock__etcd_delete_key(struct etcd_backend *s, const char *key, int64_t rev,
                            int64_t deadline, struct dlock__wait *w)
{
    if (delete_once(s, key, &rev, deadline, w))
        return true;
    char *copy = strdup(key);
    if (!copy)
        return false;
    pthread_mutex_lock(&s->mu);
    orphan_add(s, copy, rev);
    bool queue = !s->sweep_queued;
    s->sweep_queued = true;
    pthread_mutex_unlock(&s->mu);
    if (queue) {
        char msg[DLOCK__MSG_MAX];
        dlock__errmsg_save(msg);
        if (dlock__cleanup_add(s->c, "delete etcd keys left behind", orphans_cleanup, NULL,
                               NULL)) {
            pthread_mutex_lock(&s->mu);
            s->sweep_queued = false; /* the next failed delete tries again */
            pthread_mutex_unlock(&s->mu);
        }
        dlock__errmsg_restore(DLOCK_OK, msg);
    }
    return false;
}

/* Retry the deletes that failed before, none running past DEADLINE. One
 * sweep at a time: a second one gives way at once. No lock is held while
 * a delete is on the wire; the key in flight is s->deleting, which
 * dlock__etcd_orphan_forget() waits for. The keys are taken off the list
 * one at a time, as each is sent: one still waiting its turn stays where
 * an acquire of it forgets it (orphan_drop). And each delete is compared
 * on the create revision the key was made at: one cut short by its
 * deadline, which a member applies afterwards, finds a later hold's key
 * (same name, our lease; another create revision) and leaves it. */
static void orphans_sweep(struct etcd_backend *s, int64_t deadline)
{
    pthread_mutex_lock(&s->mu);
    if (s->sweeping) {
        pthread_mutex_unlock(&s->mu);
        return;
    }
    s->sweeping = true;
    struct etcd_orphan *o;
    while ((o = s->orphans)) {
        s->orphans = o->next;
        s->deleting = o->key;
        pthread_mutex_unlock(&s->mu);
        bool reachable = delete_once(s, o->key, &o->rev, deadline, NULL);
        pthread_mutex_lock(&s->mu);
        s->deleting = NULL;
        if (reachable)
            free(o->key);
        else
            orphan_add(s, o->key, o->rev); /* (with the revision a read found) */
        free(o);
        dlock__waitset_wake_all(&s->forget_ws);
        if (!reachable)
            break; /* the cluster is not answering: the rest stay for later */
    }
    s->sweeping = false;
    pthread_mutex_unlock(&s->mu);
}

/* Take KEY off the orphan list (mu held). */
static void orphan_drop(struct etcd_backend *s, const char *key)
{
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
}

int dlock__etcd_orphan_forget(struct etcd_backend *s, const char *key, struct dlock__wait *w)
{
    int rc = DLOCK_OK;
    pthread_mutex_lock(&s->mu);
    orphan_drop(s, key);
    while (s->deleting && strcmp(s->deleting, key) == 0) {
        if (!w || dlock__wait_try_once(w)) {
            rc = DLOCK_EBUSY;
            break;
        }
        if ((rc = dlock__waitset_add(&s->forget_ws, w)))
            break;
        unsigned seq = dlock__wait_seq(w);
        pthread_mutex_unlock(&s->mu);
        rc = dlock__wait_sleep(w, seq, DLOCK__NEVER);
        pthread_mutex_lock(&s->mu);
        dlock__waitset_remove(&s->forget_ws, w);
        orphan_drop(s, key); /* a failed delete put it back */
        if (rc)
            break;
    }
    pthread_mutex_unlock(&s->mu);
    if (rc == DLOCK_ETIMEDOUT)
        dlock__err(rc, "%s: key %s: an earlier delete of it is still on its way", s->label, key);
    return rc;
}

/* ------------------------------------------------------------- late puts */

/* Does etcd still know lease ID? *GONE when not (expired or revoked: no
 * put naming it can be applied any more, and its keys went with it).
 * /v3/lease/timetolive reads it without keeping it alive. */
static int lease_gone(struct etcd_backend *s, int64_t id, bool *gone,
                      const struct etcd_limits *lim)
{
    char *ids = dlock__etcd_i64s(id);
    json_t *req = ids ? json_pack("{s:s}", "ID", ids) : NULL, *reply = NULL;
    free(ids);
    char what[80];
    snprintf(what, sizeof what, "look at lease %llx", (unsigned long long)id);
    int code = 0;
    int rc = req ? dlock__etcd_call_lim(s->k, "/v3/lease/timetolive", req, &reply, what, &code,
                                        NULL, lim)
                 : dlock__etcd_nomem(s);
    json_decref(req);
    *gone = rc == DLOCK_OK ? dlock__etcd_int(reply, "TTL") < 0
                           : rc == DLOCK_EBACKEND && code == GRPC_NOT_FOUND;
    json_decref(reply);
    return *gone ? DLOCK_OK : rc;
}

/* Take the strays on lease ID off the list (mu held). */
static void strays_drop(struct etcd_backend *s, int64_t id)
{
    for (struct etcd_stray **p = &s->strays; *p;) {
        struct etcd_stray *st = *p;
        if (st->lease == id) {
            *p = st->next;
            free(st->key);
            free(st);
        } else {
            p = &st->next;
        }
    }
}

/* The core's cleanup work for the strays (the keeper runs it, retried
 * with backoff up to the op timeout while any is left): for each lease a
 * late put may still land on, ask etcd whether it still knows it -- gone,
 * its strays are done -- and else read each stray's key: found on that
 * lease at another create revision than the spared hold's, it was made
 * by the late put (no acquire of ours puts anything on a retired lease),
 * and is deleted compared on that revision. */
static int strays_cleanup(void *state, void *arg, int64_t deadline)
{
    (void)arg;
    struct etcd_backend *s = state;
    struct etcd_limits lim = {deadline, NULL};
    /* (only this work removes entries, and it never runs twice at once:
     * the ones after the head read here stay while it runs) */
    pthread_mutex_lock(&s->mu);
    struct etcd_stray *first = s->strays;
    pthread_mutex_unlock(&s->mu);
    int64_t gone[16];
    size_t ngone = 0;
    for (struct etcd_stray *st = first; st; st = st->next) {
        bool dead = false;
        for (size_t i = 0; i < ngone && !dead; i++)
            dead = gone[i] == st->lease;
        if (dead)
            continue;
        char what[1200];
        snprintf(what, sizeof what, "delete key %s a late put may have made", st->key);
        int64_t rev = 0, lease = 0;
        if (lease_gone(s, st->lease, &dead, &lim) || dead) {
            if (dead && ngone < sizeof gone / sizeof gone[0])
                gone[ngone++] = st->lease;
            continue;
        }
        if (read_create_rev(s, st->key, &rev, &lease, what, &lim) == DLOCK_OK && rev &&
            lease == st->lease && rev != st->spare)
            dlock__etcd_delete_if_rev(s, st->key, rev, what, &lim);
    }
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < ngone; i++)
        strays_drop(s, gone[i]);
    bool left = s->strays != NULL;
    if (!left)
        s->strays_queued = false;
    pthread_mutex_unlock(&s->mu);
    return left ? DLOCK_EUNAVAIL : DLOCK_OK;
}

void dlock__etcd_late_put(struct etcd_backend *s, const char *key, int64_t lease, int64_t spare)
{
    struct etcd_stray *st = calloc(1, sizeof *st);
    char *copy = strdup(key);
    pthread_mutex_lock(&s->mu);
    /* retired: the next acquire takes a fresh lease (its keys another
     * name); holds on this one are still kept alive */
    if (s->lease == lease)
        s->lease = 0;
    if (s->wlease == lease)
        s->wlease = 0;
    if (st && copy) {
        *st = (struct etcd_stray){copy, lease, spare, s->strays};
        s->strays = st;
        st = NULL;
        copy = NULL;
    }
    bool queue = s->strays && !s->strays_queued;
    if (queue)
        s->strays_queued = true;
    pthread_mutex_unlock(&s->mu);
    free(st);
    free(copy);
    if (queue) {
        char msg[DLOCK__MSG_MAX];
        dlock__errmsg_save(msg);
        if (dlock__cleanup_add(s->c, "delete etcd keys late puts may make", strays_cleanup,
                               NULL, NULL)) {
            pthread_mutex_lock(&s->mu);
            s->strays_queued = false;
            pthread_mutex_unlock(&s->mu);
        }
        dlock__errmsg_restore(DLOCK_OK, msg);
    }
}

/* ------------------------------------------------------------------ renew */

/* A renewal checks that each held key is still there at the create
 * revision we made it at. etcd 3.4 serves one range op per key inside a
 * txn slowly (100 of them cost ~7-13 ms, ~100 us a key, most of it the
 * gateway's JSON of a whole response per op), and a txn takes at most
 * --max-txn-ops (128) of them: 10,000 holds took ~1 s of one-at-a-time
 * txns every third of the lease, and lost holds under load. One range
 * over a span of keys costs ~15 us a key. So the batch's keys are sorted
 * (etcd's byte order) and read SPAN_KEYS at a time with one keys-only
 * range from the first to the last: each of ours found at its revision is
 * confirmed, one not found is lost. Other keys between ours (other
 * clients' keys of the same names, anything else under the prefix) come
 * along; the range is cut at a limit, and those of ours past the cut are
 * checked one range op each, in txns, as before. */
#define SPAN_KEYS 1000
#define TXN_MAX_OPS 100 /* etcd's default --max-txn-ops is 128 */

/* A held key of the batch being checked. */
struct held_key {
    const char *key;
    size_t len;
    size_t i; /* its hold in the batch */
};

static int bytes_cmp(const char *a, size_t alen, const char *b, size_t blen)
{
    int c = memcmp(a, b, alen < blen ? alen : blen);
    return c ? c : (alen > blen) - (alen < blen);
}

static int held_key_cmp(const void *x, const void *y)
{
    const struct held_key *a = x, *b = y;
    return bytes_cmp(a->key, a->len, b->key, b->len);
}

/* A renewal's keepalive of a hold's lease: sent when, answered with what
 * TTL. */
struct keepalive_said {
    int64_t sent, ttl_ms;
};

/* Hold I of B, its key read at create revision CREATE_REV (0: not
 * there), its lease kept alive by the keepalive SAID: confirmed (for no
 * longer than the TTL etcd answered), or lost. */
static void key_checked(struct etcd_backend *s, struct dlock__renew_batch *b, size_t i,
                        int64_t create_rev, struct keepalive_said said)
{
    struct etcd_hold *eh = b->holds[i]->bdata;
    if (create_rev != eh->rev) {
        dlock__err(DLOCK_ELOST, "%s: lock '%s': key %s (token %lld) is gone or replaced "
                                "(force-released or deleted)",
                   s->label, b->holds[i]->name, eh->key, (long long)eh->rev);
        dlock__renew_result(b, i, DLOCK_ELOST);
    } else {
        dlock__hold_confirmed_short(s->c, b->holds[i], said.sent, said.ttl_ms);
    }
}

/* Check the N keys of HK one range op each, TXN_MAX_OPS to a read-only
 * txn. Sets each hold's result. */
static void check_keys(struct etcd_backend *s, struct dlock__renew_batch *b,
                       const struct held_key *hk, size_t n, const struct keepalive_said *said,
                       const struct etcd_limits *lim)
{
    for (size_t from = 0; from < n; from += TXN_MAX_OPS) {
        size_t cnt = n - from < TXN_MAX_OPS ? n - from : TXN_MAX_OPS;
        json_t *ops = json_array();
        for (size_t j = from; ops && j < from + cnt; j++) {
            json_t *r = dlock__etcd_range(hk[j].key, false);
            if (!r || json_object_set_new(r, "keys_only", json_true()) ||
                json_array_append_new(ops, json_pack("{s:o}", "request_range", r))) {
                json_decref(ops);
                ops = NULL;
            }
        }
        json_t *reply = NULL;
        char what[1200];
        snprintf(what, sizeof what, "check held keys (%.1000s%s)", hk[from].key,
                 cnt > 1 ? ", ..." : "");
        int rc = dlock__etcd_txn(s, ops ? json_pack("{s:o}", "success", ops) : NULL, &reply,
                                 what, NULL, lim);
        for (size_t j = from; j < from + cnt; j++) {
            if (rc)
                dlock__renew_result(b, hk[j].i, rc);
            else
                key_checked(s, b, hk[j].i,
                            dlock__etcd_int(dlock__etcd_txn_kv(reply, j - from),
                                            "create_revision"),
                            said[hk[j].i]);
        }
        json_decref(reply);
    }
}

/* Check the N keys of HK (sorted) with one keys-only range from the first
 * to the last, cut at a limit. Sets the result of each hold the range
 * decides (its request's failure, if it failed) and returns how many of
 * HK it decided: those after them lie past the cut. The reply is read
 * as text (span.c): no JSON tree for its kvs. */
static size_t check_span(struct etcd_backend *s, struct dlock__renew_batch *b,
                         const struct held_key *hk, size_t n, const struct keepalive_said *said,
                         const struct etcd_limits *lim)
{
    /* the range end: the smallest key after the last, that key + "\0" */
    char *last = malloc(hk[n - 1].len + 1);
    char *kb = dlock__etcd_b64(hk[0].key, hk[0].len);
    char *eb = last ? dlock__etcd_b64(memcpy(last, hk[n - 1].key, hk[n - 1].len + 1),
                                      hk[n - 1].len + 1)
                    : NULL;
    char *limit = dlock__etcd_i64s((int64_t)(2 * n + 16));
    json_t *req = kb && eb && limit ? json_pack("{s:s, s:s, s:b, s:s}", "key", kb, "range_end",
                                                eb, "keys_only", 1, "limit", limit)
                                    : NULL;
    free(last);
    free(kb);
    free(eb);
    free(limit);
    char what[1200];
    snprintf(what, sizeof what, "check held keys (%zu from %.1000s)", n, hk[0].key);
    char *body = NULL;
    size_t len = 0;
    struct etcd_span_reply reply = {0};
    int rc = req ? dlock__etcd_call_body(s->k, "/v3/kv/range", req, &body, &len, what, lim)
                 : dlock__etcd_nomem(s);
    json_decref(req);
    if (!rc)
        rc = dlock__etcd_span_scan(body, len, s->label, what, &reply);
    size_t r = 0, j = 0, rklen = 0, rkcap = 0;
    char *rk = NULL; /* the key of kvs[r], decoded (rklen bytes), once decoded */
    bool decoded = false;
    for (; !rc && j < n; j++) {
        /* (both in etcd's order: the reply's keys before ours are others') */
        int c = 1;
        for (; r < reply.n; r++, decoded = false) {
            const struct etcd_span_kv *kv = &reply.kvs[r];
            if (!decoded && kv->key_len / 4 * 3 + 4 > rkcap) {
                rkcap = kv->key_len / 4 * 3 + 64;
                char *grown = realloc(rk, rkcap);
                if (!grown) {
                    rc = dlock__etcd_nomem(s);
                    break;
                }
                rk = grown;
            }
            if (!decoded && (kv->esc || !dlock__etcd_unb64_into(kv->key, kv->key_len, rk, &rklen))) {
                rc = dlock__etcd_bad_reply(s->label, what, "/v3/kv/range",
                                           "the range.kvs[%zu].key not base64", r);
                break;
            }
            decoded = true;
            if ((c = bytes_cmp(rk, rklen, hk[j].key, hk[j].len)) >= 0)
                break;
        }
        if (rc || (r == reply.n && reply.more))
            break; /* past the cut: not decided here */
        key_checked(s, b, hk[j].i, c == 0 ? reply.kvs[r].create_rev : 0, said[hk[j].i]);
    }
    free(rk);
    free(reply.kvs);
    free(body);
    if (!rc)
        return j;
    for (; j < n; j++)
        dlock__renew_result(b, hk[j].i, rc);
    return n;
}

int dlock__etcd_renew(void *state, struct dlock__renew_batch *b)
{
    struct etcd_backend *s = state;
    size_t n = b->n;
    struct keepalive_said *said = calloc(n ? n : 1, sizeof *said);
    bool *done = calloc(n ? n : 1, sizeof *done);
    if (!said || !done) {
        free(said);
        free(done);
        return dlock__etcd_nomem(s);
    }
    /* Nothing we send may outlive the earliest validity deadline of the
     * batch: past it the keeper must be free to declare the hold lost,
     * not stuck waiting on a member that stopped answering. */
    struct etcd_limits lim = {b->deadline, NULL};
    /* One keepalive per distinct lease (usually just the session's); its
     * outcome, and its message, is every hold's on that lease. */
    for (size_t i = 0; i < n; i++) {
        if (done[i])
            continue;
        struct etcd_hold *eh = b->holds[i]->bdata;
        int64_t sent = 0, ttl_ms = 0;
        int rc = eh ? dlock__etcd_lease_keepalive(s, eh->lease, &sent, &ttl_ms, &lim)
                    : dlock__err(DLOCK_ELOST, "%s: lock '%s' has no key", s->label,
                                 b->holds[i]->name);
        if (rc == DLOCK_ELOST && eh && !eh->own_lease) {
            dlock__etcd_session_lease_dead(s, eh->lease);
        } else if (rc == DLOCK_OK && !eh->own_lease) {
            pthread_mutex_lock(&s->mu);
            if (s->lease == eh->lease && sent > s->lease_confirmed)
                s->lease_confirmed = sent;
            if (s->lease == eh->lease)
                dlock__etcd_lease_lower_ttl(&s->lease_ttl_ms, ttl_ms);
            pthread_mutex_unlock(&s->mu);
        }
        for (size_t j = i; j < n; j++) {
            struct etcd_hold *ej = b->holds[j]->bdata;
            if (!done[j] && (j == i || (ej && eh && ej->lease == eh->lease))) {
                done[j] = true;
                said[j] = (struct keepalive_said){sent, ttl_ms};
                dlock__renew_result(b, j, rc);
            }
        }
    }
    free(done);
    /* Then read that the keys of the holds on live leases are still ours. */
    struct held_key *hk = calloc(n ? n : 1, sizeof *hk);
    size_t m = 0;
    for (size_t i = 0; hk && i < n; i++) {
        const struct etcd_hold *eh = b->holds[i]->bdata;
        if (b->result[i] == DLOCK_OK)
            hk[m++] = (struct held_key){eh->key, strlen(eh->key), i};
    }
    if (hk)
        qsort(hk, m, sizeof *hk, held_key_cmp);
    for (size_t from = 0; from < m; from += SPAN_KEYS) {
        size_t cnt = m - from < SPAN_KEYS ? m - from : SPAN_KEYS;
        size_t decided = check_span(s, b, hk + from, cnt, said, &lim);
        check_keys(s, b, hk + from + decided, cnt - decided, said, &lim);
    }
    if (!hk) {
        int rc = dlock__etcd_nomem(s);
        for (size_t i = 0; i < n; i++)
            if (b->result[i] == DLOCK_OK)
                dlock__renew_result(b, i, rc);
    }
    free(hk);
    free(said);
    return DLOCK_OK;
}

/* ------------------------------------------------------------ open/close */

static void backend_free(struct etcd_backend *s)
{
    if (!s)
        return;
    dlock__etcd_conn_free(s->k);
    while (s->orphans) {
        struct etcd_orphan *o = s->orphans;
        s->orphans = o->next;
        free(o->key);
        free(o);
    }
    while (s->strays)
        strays_drop(s, s->strays->lease);
    free(s->prefix);
    dlock__waitset_destroy(&s->grant_ws);
    dlock__waitset_destroy(&s->forget_ws);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* Close's revoke of lease ID (0: none) within LIM; one not done is
 * logged, left to its TTL (etcd's refusal: it knows the lease no more). */
static void close_revoke(struct etcd_backend *s, int64_t id, const struct etcd_limits *lim)
{
    int rc = id ? dlock__etcd_lease_revoke(s, id, lim) : DLOCK_OK;
    if (rc != DLOCK_OK && rc != DLOCK_EBACKEND)
        dlock__log(s->c, DLOCK_LOG_WARN, "%s: close: lease %llx left to its TTL: %s", s->label,
                   (unsigned long long)id, dlock_errmsg());
}

void dlock__etcd_close(void *state)
{
    struct etcd_backend *s = state;
    if (!s)
        return;
    /* (the orphans' deletes were tried once more by the core's cleanup
     * queue; what is left goes with our leases, revoked now: the session
     * lease first -- waiters behind us need not wait for its TTL -- then
     * the waiters' lease, then the retired leases a late put may still
     * land on: revoked, none can, and what one made goes). Every revoke
     * shares one deadline, dlock_client_close()'s (one op timeout from
     * its start, releases and owed deletes included): a member that
     * stopped answering holds close up that long in all, not that long
     * per lease. A lease not revoked by then ends with its TTL, and its
     * keys with it. */
    pthread_mutex_lock(&s->mu);
    int64_t lease = s->lease, wlease = s->wlease;
    s->lease = s->wlease = 0;
    pthread_mutex_unlock(&s->mu);
    int64_t deadline = dlock__close_deadline(s->c);
    struct etcd_limits lim = {deadline != DLOCK__NEVER ? deadline
                                                       : dlock__now_ms() + s->c->opts.op_timeout_ms,
                              NULL};
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    close_revoke(s, lease, &lim);
    close_revoke(s, wlease, &lim);
    while (s->strays) {
        int64_t id = s->strays->lease;
        close_revoke(s, id, &lim);
        strays_drop(s, id);
    }
    dlock__errmsg_restore(DLOCK_OK, msg);
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

int dlock__etcd_open(struct dlock_client *c, void **state)
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
    const char *max_reply_text = dlock__url_param(&c->url, "max_reply");
    unsigned long long max_reply = 0;
    if (max_reply_text) {
        char *end = NULL;
        max_reply = strtoull(max_reply_text, &end, 10);
        if (!isdigit((unsigned char)*max_reply_text) || *end || max_reply < 1024 ||
            max_reply > (1ull << 32))
            return dlock__err(DLOCK_EBADURL, "bad URL '%s': max_reply=%s: give the largest reply "
                                             "to accept in bytes, 1024 to 4294967296",
                              url, max_reply_text);
    }
    struct etcd_backend *s = calloc(1, sizeof *s);
    if (!s)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    s->c = c;
    pthread_mutex_init(&s->mu, NULL);
    dlock__waitset_init(&s->grant_ws);
    dlock__waitset_init(&s->forget_ws);
    s->prefix = make_prefix(c);
    char label[1024];
    size_t len = (size_t)snprintf(label, sizeof label, "etcd");
    for (size_t i = 0; i < c->url.nhosts && len < sizeof label; i++) {
        const struct dlock__host *h = &c->url.hosts[i];
        len += (size_t)snprintf(label + len, sizeof label - len,
                                strchr(h->host, ':') ? "%s[%s]:%d" : "%s%s:%d", i ? "," : " ",
                                h->host, h->port);
    }
    char who[100];
    dlock__identity(who, sizeof who);
    snprintf(s->ident, sizeof s->ident, "dlock %s", who);
    snprintf(s->shared_ident, sizeof s->shared_ident, ETCD_SHARED_MARK "%s", who);
    const char *password = c->opts.password;
    char *env_password = NULL; /* DLOCK_ETCD_PASSWORD or its _FILE's */
    if (c->opts.user && !password) {
        int rc = dlock__password_env("DLOCK_ETCD_PASSWORD", &env_password);
        if (rc) {
            backend_free(s);
            return rc;
        }
        password = env_password;
    }
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
        .max_reply = (size_t)max_reply,
        .label = label,
        .watch_prefix = s->prefix,
    };
    int rc = s->prefix ? dlock__etcd_conn_new(&cfg, &s->k) : dlock__err(DLOCK_ENOMEM, "out of memory");
    free(env_password); /* the connection keeps its own copy */
    if (rc) {
        backend_free(s);
        return rc;
    }
    s->label = dlock__etcd_conn_label(s->k);
    /* Say now whether the cluster answers: a serializable read needs no
     * quorum, so a cluster without leader still connects (acquires then
     * report DLOCK_EUNAVAIL). */
    json_t *req = dlock__etcd_range(s->prefix, true), *reply = NULL;
    if (req) {
        json_object_set_new(req, "count_only", json_true());
        json_object_set_new(req, "serializable", json_true());
        rc = dlock__etcd_call(s->k, "/v3/kv/range", req, &reply, "connect", NULL);
    } else {
        rc = dlock__etcd_nomem(s);
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
