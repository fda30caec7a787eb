/* mutex.c -- the etcd backend: exclusive locks on the key layout of Go's
 * concurrency.Mutex, so `etcdctl lock NAME` and dlock exclude each other
 * and share one first-come-first-served queue.
 *
 * A contender for NAME puts the key "<prefix>NAME/<lease id in hex>",
 * attached to its lease, in a transaction that creates it only when no
 * contender is there (the lock is ours in one round trip) and otherwise
 * reads the oldest; a waiter then creates its key on the client's short
 * waiters' lease, in a transaction that creates it only if absent and
 * reads the oldest key under "<prefix>NAME/" in the same round trip.
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
 * so acquire() sees at most one exclusive thread per name: one key per
 * lease and name, as in Go. Shared holds (rwmutex.c) are contenders of
 * the same queue with a key per thread; they wait only for writers. The
 * transport (JSON gateway over libcurl, watch thread) lives in http.c,
 * the session lease in lease.c, which keys are contenders in queue.c,
 * status/force/list in inspect.c. The acquire is a row of steps (struct
 * etcd_acquire) that the blocking acquire runs with sleeps between and
 * async.c one attempt at a time, parked where the blocking one sleeps.
 * docs/protocol-etcd.md tells the whole story.
 */
#include "etcd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WITHDRAW_GRACE_MS 1000 /* a give-up's delete (never past the caller's deadline) */
#define WITHDRAW_SLICE_MS 50   /* the same when the member stopped answering */
#define SAFETY_LOOK_MS 10000   /* a waiter whose watch is quiet still looks this often */

/* ------------------------------------------------------------------ keys */

char *dlock__etcd_lock_prefix(struct etcd_backend *s, const char *name)
{
    return dlock__sprintf("%s%s/", s->prefix, name);
}

/* ---------------------------------------------------------------- acquire */

json_t *dlock__etcd_delete_if_txn(const char *key, int64_t rev)
{
    char *kb = dlock__etcd_b64(key, strlen(key));
    char *rs = dlock__etcd_i64s(rev);
    json_t *req = NULL;
    if (kb && rs)
        req = json_pack("{s:[{s:s, s:s, s:s, s:s}], s:[{s:o}]}", "compare", "result", "EQUAL",
                        "target", "CREATE", "key", kb, "create_revision", rs, "success",
                        "request_delete_range", dlock__etcd_range(key, false));
    free(kb);
    free(rs);
    return req;
}

int dlock__etcd_delete_if_rev(struct etcd_backend *s, const char *key, int64_t rev,
                              const char *what, const struct etcd_limits *lim)
{
    json_t *reply = NULL;
    int rc = dlock__etcd_txn(s, dlock__etcd_delete_if_txn(key, rev), &reply, what, NULL, lim);
    json_decref(reply);
    return rc;
}

int dlock__etcd_txn(struct etcd_backend *s, json_t *req, json_t **reply, const char *what,
                    int *code, const struct etcd_limits *lim)
{
    if (!req)
        return dlock__etcd_nomem(s);
    int rc = dlock__etcd_call_lim(s->k, "/v3/kv/txn", req, reply, what, code, NULL, lim);
    json_decref(req);
    return rc;
}

/* One contender in the queue of a lock: hold H's key KEY under the
 * queue's prefix PFX, and the limits LIM of every request made for it
 * (the requests below put, look at and wait on it). OUT collects what
 * they learn. */
struct contender {
    struct etcd_backend *s;
    const struct dlock__hold *h;
    const char *key, *pfx;
    const struct etcd_limits *lim;
    struct {
        int64_t my_rev;    /* KEY's create revision, 0 = not put (or not known) */
        int64_t owner_rev; /* the oldest contender's, ours when none is older */
        bool busy;         /* another contender is queued (put_if_alone) */
        int code;          /* as dlock__etcd_call's */
        bool resent;       /* a put went out twice (the first may still land) */
        bool no_marker;    /* the txn that read owner_rev counted no lock-delay marker */
    } out;
};

/* Put contender C's key (hold H's KEY under PFX) on LEASE unless it
 * exists, and read the oldest contender it waits for (C's owner_rev; our
 * own revision, C's my_rev, when none is older), in one transaction
 * (Go's tryAcquire).
 * The core calls acquire only for an owner that holds nothing here, so
 * a KEY that already exists is a leftover -- of a release that did not
 * reach the member, or of our own first send when the request went out
 * twice (the two cannot be told apart): it is deleted, compared on its
 * create revision, and put anew (a new create revision: a new, greater
 * token), never adopted. An adopted leftover would keep the revision its
 * release, or an owed delete of it, is compared on: landing late, that
 * delete would take the new hold's key. C's resent turns true when a
 * send went out twice (the first may still land). */
static int put_and_read_owner(struct contender *c, int64_t lease)
{
    struct etcd_backend *s = c->s;
    const char *value = dlock__etcd_hold_value(s, c->h);
    bool shared = c->h->mode == DLOCK_SHARED; /* waits for writers only */
    c->out.no_marker = false;
    char *kb = dlock__etcd_b64(c->key, strlen(c->key));
    char *vb = dlock__etcd_b64(value, strlen(value));
    char *ls = dlock__etcd_i64s(lease);
    json_t *req = NULL;
    if (kb && vb && ls)
        req = json_pack("{s:[{s:s, s:s, s:s, s:s}], s:[{s:{s:s, s:s, s:s}}, {s:o}, {s:o}],"
                        " s:[{s:o}, {s:o}, {s:o}]}",
                        "compare", "result", "EQUAL", "target", "CREATE", "key", kb,
                        "create_revision", "0",
                        "success", "request_put", "key", kb, "value", vb, "lease", ls,
                        "request_range", dlock__etcd_queue_range_for(c->pfx, true, 0, shared),
                        "request_range", dlock__etcd_delay_probe(s, c->h->name),
                        "failure", "request_range", dlock__etcd_range(c->key, false),
                        "request_range", dlock__etcd_queue_range_for(c->pfx, true, 0, shared),
                        "request_range", dlock__etcd_delay_probe(s, c->h->name));
    free(kb);
    free(vb);
    free(ls);
    if (!req)
        return dlock__etcd_nomem(s);
    json_t *reply = NULL;
    char what[1200];
    snprintf(what, sizeof what, "acquire '%s' (key %s)", c->h->name, c->key);
    bool created = false;
    int rc;
    for (int round = 0;; round++) {
        bool again = false;
        rc = dlock__etcd_call_lim(s->k, "/v3/kv/txn", req, &reply, what, &c->out.code, &again,
                                  c->lim);
        c->out.resent |= again;
        if (rc)
            break;
        created = json_is_true(json_object_get(reply, "succeeded"));
        if (created || round > 0)
            break; /* (found again: put by this round's first send, its
                      reply lost -- no delete was ever sent for it) */
        int64_t stale = dlock__etcd_int(dlock__etcd_txn_kv(reply, 0), "create_revision");
        json_decref(reply);
        reply = NULL;
        if ((rc = dlock__etcd_delete_if_rev(s, c->key, stale, what, c->lim)))
            break;
    }
    json_decref(req);
    if (rc)
        return rc;
    c->out.my_rev = created ? dlock__etcd_header_rev(reply)
                            : dlock__etcd_int(dlock__etcd_txn_kv(reply, 0), "create_revision");
    c->out.no_marker = dlock__etcd_delay_absent(reply, 2);
    struct etcd_queue_search oldest = {.pfx = c->pfx, .resp = dlock__etcd_txn_range(reply, 1),
                                       .ascending = true, .writers = shared, .what = what,
                                       .lim = c->lim};
    rc = dlock__etcd_queue_find(s, &oldest);
    c->out.no_marker &= !oldest.out.paged; /* (counted at an earlier revision) */
    json_t *owner = oldest.out.kv;
    c->out.owner_rev = owner ? dlock__etcd_int(owner, "create_revision") : c->out.my_rev;
    if (c->out.owner_rev > c->out.my_rev)
        c->out.owner_rev = c->out.my_rev; /* (a reader: the oldest writer came after us) */
    json_decref(owner);
    json_decref(reply);
    if (!rc && c->out.my_rev <= 0)
        return dlock__err(DLOCK_EPROTO, "%s: %s: the reply has no create revision", s->label, what);
    return rc;
}

/* Put contender C's key (exclusive hold H's KEY) on LEASE only when no
 * key under PFX has a lease -- no contender holds or queues: the lock is
 * ours in this one round trip, the common case -- and otherwise read the
 * oldest contender without putting anything: C's my_rev is the key's
 * create revision, 0 when it was not put (or only maybe, by a first send whose reply was lost);
 * then C's busy says whether a contender other than our own
 * leftover KEY is in the queue (we would wait). A key that will wait is
 * thus never created on the hold's lease, which a process killed before
 * it could move the key to the waiters' lease would leave in the queue
 * for a whole hold lease. C's code as dlock__etcd_call's; C's resent
 * turns true when the txn went out twice (the first send may still land). */
static int put_if_alone(struct contender *c, int64_t lease)
{
    struct etcd_backend *s = c->s;
    const char *pfx = c->pfx, *key = c->key, *value = dlock__etcd_hold_value(s, c->h);
    c->out.my_rev = 0;
    c->out.busy = c->out.no_marker = false;
    char *pb = dlock__etcd_b64(pfx, strlen(pfx)), *pe = dlock__etcd_prefix_end_b64(pfx);
    char *kb = dlock__etcd_b64(key, strlen(key)), *vb = dlock__etcd_b64(value, strlen(value));
    char *ls = dlock__etcd_i64s(lease);
    json_t *req = NULL;
    if (pb && pe && kb && vb && ls)
        req = json_pack("{s:[{s:s, s:s, s:s, s:s, s:s}], s:[{s:{s:s, s:s, s:s}}, {s:o}],"
                        " s:[{s:o}]}",
                        "compare", "result", "EQUAL", "target", "LEASE", "key", pb, "range_end",
                        pe, "lease", "0",
                        "success", "request_put", "key", kb, "value", vb, "lease", ls,
                        "request_range", dlock__etcd_delay_probe(s, c->h->name),
                        "failure", "request_range", dlock__etcd_queue_range(pfx, true, 0));
    free(pb);
    free(pe);
    free(kb);
    free(vb);
    free(ls);
    json_t *reply = NULL;
    char what[1200];
    snprintf(what, sizeof what, "acquire '%s' (key %s)", c->h->name, key);
    int rc = req ? dlock__etcd_call_lim(s->k, "/v3/kv/txn", req, &reply, what, &c->out.code,
                                        &c->out.resent, c->lim)
                 : dlock__etcd_nomem(s);
    json_decref(req);
    if (rc)
        return rc;
    if (json_is_true(json_object_get(reply, "succeeded"))) {
        c->out.my_rev = dlock__etcd_header_rev(reply);
        c->out.no_marker = dlock__etcd_delay_absent(reply, 1);
        json_decref(reply);
        return c->out.my_rev > 0 ? DLOCK_OK
                                 : dlock__err(DLOCK_EPROTO, "%s: %s: the reply has no revision",
                                              s->label, what);
    }
    struct etcd_queue_search oldest = {.pfx = pfx, .resp = dlock__etcd_txn_range(reply, 0),
                                       .ascending = true, .what = what, .lim = c->lim};
    rc = dlock__etcd_queue_find(s, &oldest);
    json_t *owner = oldest.out.kv;
    json_decref(reply);
    char *owner_key = owner ? dlock__etcd_kv_key(owner) : NULL;
    if (owner && !owner_key && !rc)
        rc = dlock__etcd_nomem(s);
    /* (our own key first: a leftover, or our request's first send when
     * it went out twice -- put_and_read_owner() puts it anew) */
    c->out.busy = owner_key && strcmp(owner_key, key) != 0;
    free(owner_key);
    json_decref(owner);
    return rc;
}

/* What a look at the queue found (look()). */
struct queue_look {
    bool mine_exists; /* our key is still there */
    char *pred;       /* the contender just before ours, caller frees; NULL = ours */
    bool moved;       /* ours, and our key moved to the hold's lease */
    bool no_marker;   /* no lock-delay marker was counted (delay_probe) */
    int64_t at;       /* the revision the answer is from */
    int code;         /* as dlock__etcd_call's */
};

/* Look at the queue: does contender C's key (created at C's my_rev) still
 * exist, and which contender it waits for was created just before ours
 * (L's pred)? In the same transaction, when no key under the prefix is
 * older than ours (the common case: no other key there), the lock is ours
 * and our key moves to HOLD_LEASE (L's moved): the hand-off costs no
 * round trip more than the look. */
static int look(const struct contender *c, int64_t hold_lease, struct queue_look *l)
{
    struct etcd_backend *s = c->s;
    const char *pfx = c->pfx, *key = c->key, *value = dlock__etcd_hold_value(s, c->h);
    int64_t my_rev = c->out.my_rev;
    l->pred = NULL;
    l->moved = l->no_marker = false;
    bool shared = c->h->mode == DLOCK_SHARED;
    char *pb = dlock__etcd_b64(pfx, strlen(pfx)), *pe = dlock__etcd_prefix_end_b64(pfx);
    char *kb = dlock__etcd_b64(key, strlen(key)), *vb = dlock__etcd_b64(value, strlen(value));
    char *older = dlock__etcd_i64s(my_rev - 1), *mine = dlock__etcd_i64s(my_rev);
    char *ls = dlock__etcd_i64s(hold_lease);
    json_t *req = NULL;
    if (pb && pe && kb && vb && older && mine && ls)
        req = json_pack("{s:[{s:s, s:s, s:s, s:s, s:s}, {s:s, s:s, s:s, s:s}],"
                        " s:[{s:{s:s, s:s, s:s}}, {s:o}], s:[{s:o}, {s:o}, {s:o}]}",
                        "compare", "result", "GREATER", "target", "CREATE", "key", pb,
                        "range_end", pe, "create_revision", older,
                        "result", "EQUAL", "target", "CREATE", "key", kb, "create_revision",
                        mine,
                        "success", "request_put", "key", kb, "value", vb, "lease", ls,
                        "request_range", dlock__etcd_delay_probe(s, c->h->name),
                        "failure", "request_range", dlock__etcd_range(key, false), "request_range",
                        dlock__etcd_queue_range_for(pfx, false, my_rev, shared), "request_range",
                        dlock__etcd_delay_probe(s, c->h->name));
    free(pb);
    free(pe);
    free(kb);
    free(vb);
    free(older);
    free(mine);
    free(ls);
    json_t *reply = NULL;
    char what[1200];
    snprintf(what, sizeof what, "wait for '%s' (key %s)", c->h->name, key);
    int rc = dlock__etcd_txn(s, req, &reply, what, &l->code, c->lim);
    if (rc)
        return rc;
    l->at = dlock__etcd_header_rev(reply);
    if (json_is_true(json_object_get(reply, "succeeded"))) {
        l->mine_exists = l->moved = true;
        l->no_marker = dlock__etcd_delay_absent(reply, 1);
        json_decref(reply);
        return DLOCK_OK;
    }
    json_t *kv = dlock__etcd_txn_kv(reply, 0);
    l->mine_exists = kv && dlock__etcd_int(kv, "create_revision") == my_rev;
    l->no_marker = dlock__etcd_delay_absent(reply, 2);
    struct etcd_queue_search prev = {.pfx = pfx, .resp = dlock__etcd_txn_range(reply, 1),
                                     .bound_rev = my_rev, .writers = shared, .what = what,
                                     .lim = c->lim};
    rc = dlock__etcd_queue_find(s, &prev);
    l->no_marker &= !prev.out.paged; /* (counted at an earlier revision) */
    json_t *before = prev.out.kv;
    if (before && !(l->pred = dlock__etcd_kv_key(before)))
        rc = dlock__etcd_nomem(s);
    json_decref(before);
    json_decref(reply);
    return rc;
}

/* Give up a contention: remove our key (created at REV, 0 = not known:
 * a put whose reply was lost) and our own lease, without outliving the
 * caller's bound. The delete is compared on the key's create revision
 * (dlock__etcd_delete_key), so one that lands late leaves a later hold's
 * key alone. A wait that timed out or was canceled
 * (RC) sends nothing: the delete goes to the core's cleanup queue and the
 * keeper does it. Otherwise it is sent now, cut to the wait's deadline
 * and to GRACE_MS: a whole WITHDRAW_GRACE_MS while the member answers
 * (a try-once's busy), a WITHDRAW_SLICE_MS after it did not answer our
 * last request (it will not answer now either). A delete that fails or
 * is not sent is remembered and done later; an own lease not revoked
 * expires by its TTL, carrying nothing once the key is gone. */
/* The end of a give-up's cleanup: GRACE_MS from now, cut to W's
 * deadline (none for a try-once). */
static int64_t give_up_deadline(const struct dlock__wait *w, int64_t grace_ms)
{
    int64_t deadline = dlock__now_ms() + grace_ms, until = dlock__wait_deadline(w);
    return until != 0 && until < deadline ? until : deadline;
}

/* The end of the revoke of a lease of our own that carries nothing: a
 * WITHDRAW_GRACE_MS, cut to W's deadline, never the op timeout. */
static int64_t grace_deadline(const struct dlock__wait *w)
{
    return give_up_deadline(w, WITHDRAW_GRACE_MS);
}

static void withdraw(struct etcd_backend *s, const char *key, int64_t rev,
                     const struct lease_ref *lr, struct dlock__wait *w, int rc, int64_t grace_ms)
{
    int64_t now = dlock__now_ms(), deadline = give_up_deadline(w, grace_ms);
    if (rc == DLOCK_ETIMEDOUT || rc == DLOCK_ECANCELED)
        deadline = now; /* time is up: nothing is sent, the keeper deletes it */
    struct etcd_limits lim = {deadline, NULL};
    if (lr->own && dlock__time_left(deadline, 1) > 0)
        dlock__etcd_lease_revoke(s, lr->id, &lim); /* takes the key with it */
    dlock__etcd_delete_key(s, key, rev, deadline, NULL);
}

/* A failure RC of a request cut short by the wait W's deadline is that
 * wait's timeout (the message, kept, says what was cut). */
int dlock__etcd_timed_out(struct dlock__wait *w, int rc)
{
    /* (time_left is 0 only once a deadline has passed: never for a
     * try-once nor a wait without one) */
    if ((dlock__etcd_transient(rc) || rc == DLOCK_ETIMEDOUT) && dlock__time_left(dlock__wait_deadline(w), 1) == 0)
        return DLOCK_ETIMEDOUT;
    return rc;
}

bool dlock__etcd_put_failed(struct dlock__wait *w, int *rc, char *msg)
{
    *rc = dlock__etcd_timed_out(w, *rc);
    dlock__errmsg_save(msg);
    return dlock__etcd_transient(*rc) || *rc == DLOCK_ECANCELED || *rc == DLOCK_ETIMEDOUT;
}

int dlock__etcd_wait_failed(struct dlock__wait *w, int rc, char *msg, bool *answering)
{
    *answering = !msg[0] && !dlock__etcd_transient(rc);
    rc = dlock__etcd_timed_out(w, rc);
    if (rc != DLOCK_ETIMEDOUT && rc != DLOCK_ECANCELED)
        dlock__errmsg_save(msg);
    return rc;
}

/* LR's last confirmation as the client knows it: a shared lease (the
 * session's, the waiters') that another acquire's keepalive confirmed
 * later is confirmed for this one too, so the waiters of one client send
 * one keepalive per lease, not one each. */
static void lease_adopt(struct etcd_backend *s, struct lease_ref *lr)
{
    pthread_mutex_lock(&s->mu);
    if (lr->waiter && s->wlease == lr->id && s->wlease_confirmed > lr->confirmed)
        lr->confirmed = s->wlease_confirmed;
    else if (!lr->own && !lr->waiter && s->lease == lr->id && s->lease_confirmed > lr->confirmed)
        lr->confirmed = s->lease_confirmed;
    pthread_mutex_unlock(&s->mu);
}

int dlock__etcd_waiter_keepalive(struct etcd_backend *s, struct lease_ref *wl,
                                 struct lease_ref *lr, char *msg, const struct etcd_limits *lim)
{
    struct lease_ref *const lrs[2] = {wl, lr};
    int rc = DLOCK_OK;
    for (int i = 0; i < 2 && !rc; i++) {
        lease_adopt(s, lrs[i]);
        if (dlock__now_ms() < dlock__etcd_keepalive_due(lrs[i]))
            continue;
        rc = dlock__etcd_lease_refresh(s, lrs[i], lim);
        if (rc == DLOCK_ELOST) {
            dlock__etcd_lease_dead(s, lrs[i]);
            return ETCD_RESTART;
        }
    }
    if (rc == DLOCK_ECANCELED)
        return rc;
    if (rc)
        dlock__errmsg_save(msg);
    return DLOCK_OK;
}

#define RESTART ETCD_RESTART /* our key or lease vanished; start again */

/* When LR's next keepalive is due. */
int64_t dlock__etcd_keepalive_due(const struct lease_ref *lr)
{
    return lr->confirmed + lr->ttl_ms / 3;
}

/* LR was found expired or revoked: a shared one is granted anew. */
void dlock__etcd_lease_dead(struct etcd_backend *s, const struct lease_ref *lr)
{
    if (lr->waiter)
        dlock__etcd_waiter_lease_dead(s, lr->id);
    else if (!lr->own)
        dlock__etcd_session_lease_dead(s, lr->id);
}

json_t *dlock__etcd_put_again_txn(const char *key, int64_t rev, const char *value, int64_t lease)
{
    char *kb = dlock__etcd_b64(key, strlen(key));
    char *vb = dlock__etcd_b64(value, strlen(value));
    char *ls = dlock__etcd_i64s(lease), *rs = dlock__etcd_i64s(rev);
    json_t *req = NULL;
    if (kb && vb && ls && rs)
        req = json_pack("{s:[{s:s, s:s, s:s, s:s}], s:[{s:{s:s, s:s, s:s}}]}", "compare",
                        "result", "EQUAL", "target", "CREATE", "key", kb, "create_revision", rs,
                        "success", "request_put", "key", kb, "value", vb, "lease", ls);
    free(kb);
    free(vb);
    free(ls);
    free(rs);
    return req;
}

int dlock__etcd_txn_also(json_t *txn, json_t *op)
{
    json_t *success = json_object_get(txn, "success");
    if (!op || !success) {
        json_decref(op);
        return -1;
    }
    return json_array_append_new(success, op);
}

int dlock__etcd_put_again_run(struct etcd_backend *s, json_t *txn, const char *what, int *code,
                              const struct etcd_limits *lim)
{
    json_t *reply = NULL;
    int rc = dlock__etcd_txn(s, txn, &reply, what, code, lim);
    if (!rc && !json_is_true(json_object_get(reply, "succeeded")))
        rc = ETCD_KEY_GONE;
    json_decref(reply);
    return rc;
}

int dlock__etcd_put_again(struct etcd_backend *s, const char *key, int64_t rev, const char *value,
                          int64_t lease, const char *what, int *code, const struct etcd_limits *lim)
{
    return dlock__etcd_put_again_run(s, dlock__etcd_put_again_txn(key, rev, value, lease), what,
                                     code, lim);
}

int dlock__etcd_hold_put_again(struct etcd_backend *s, const struct dlock__hold *h,
                               const char *value, const char *verb, int *code,
                               const struct etcd_limits *lim)
{
    const struct etcd_hold *eh = h->bdata;
    if (!eh)
        return dlock__err(DLOCK_ELOST, "%s: '%s': no key held to %s", s->label, h->name, verb);
    char what[1200];
    snprintf(what, sizeof what, "%s '%s' (key %s)", verb, h->name, eh->key);
    return dlock__etcd_put_again(s, eh->key, eh->rev, value, eh->lease, what, code, lim);
}

/* Hang hold H's KEY (create revision REV) on LEASE: a put keeps the key's
 * create revision, so the key keeps its place in the queue and its token.
 * RESTART when the key is gone; *CODE as dlock__etcd_call's (a lease that etcd
 * no longer knows is GRPC_NOT_FOUND). */
static int move_key(struct etcd_backend *s, const struct dlock__hold *h, const char *key,
                    int64_t rev, int64_t lease, int *code, const struct etcd_limits *lim)
{
    char what[1200];
    snprintf(what, sizeof what, "move '%s' (key %s) to lease %llx", h->name, key,
             (unsigned long long)lease);
    int rc = dlock__etcd_put_again(s, key, rev, dlock__etcd_hold_value(s, h), lease, what, code, lim);
    return rc == ETCD_KEY_GONE ? RESTART : rc;
}

/* The leases a put of the acquire's key was sent on that may still land
 * later (its reply lost, or sent twice), settled once the acquire is done
 * with the key (dlock__etcd_late_put): SPARE is the create revision of
 * the hold it made of the key, 0 when none. */
struct late_puts {
    int64_t lease[2];
    int n;
};

bool dlock__etcd_put_may_land(int rc, bool resent)
{
    return resent || dlock__etcd_transient(rc) || rc == DLOCK_ECANCELED || rc == DLOCK_ETIMEDOUT;
}

static void late_note(struct late_puts *lp, int64_t lease, int rc, bool resent)
{
    if (dlock__etcd_put_may_land(rc, resent) && lp->n < 2 && (lp->n == 0 || lp->lease[0] != lease))
        lp->lease[lp->n++] = lease;
}

static void late_settle(struct etcd_backend *s, struct late_puts *lp, const char *key,
                        int64_t spare)
{
    for (int i = 0; i < lp->n; i++)
        dlock__etcd_late_put(s, key, lp->lease[i], spare);
    lp->n = 0;
}

/* What the look that found our turn did and saw. */
struct turn {
    bool moved;     /* our key moved to the hold's lease */
    bool no_marker; /* no lock-delay marker counted */
};

/* Where an acquire is between its steps. */
enum acquire_phase {
    PHASE_ENTER, /* to enter the queue: at the start, or starting over */
    PHASE_WAIT,  /* our key queued on the waiters' lease: look, watch the key before ours */
    PHASE_DONE,  /* over: held, or given up */
};

#define TURN 2 /* a step found our key the oldest: the lock is ours */

/* One acquire of hold H, cut into steps (etcd.h: struct etcd_acquire).
 * Every request ends by the wait's deadline (the request timeout for a
 * try-once) or at a cancel (LIM): wait_ms bounds the whole acquire. */
struct etcd_acquire {
    struct etcd_backend *s;
    struct dlock__hold *h;
    struct etcd_limits lim;
    enum acquire_phase phase;
    bool slept; /* the last step asked for a sleep */
    bool own;   /* the hold gets a lease of its own */
    char *pfx, *key;
    struct lease_ref lr, wl; /* the hold's lease; the waiters' lease our key waits on */
    bool on_waiters_lease;
    int restarts;
    struct late_puts late;
    struct contender c;
    struct turn turn;
    struct etcd_watch *wt; /* on WATCHED, the key before ours (PHASE_WAIT) */
    char *watched;
    unsigned seq;              /* the wait's wake count when the latest look began */
    int64_t looked;            /* when the latest look began */
    bool settled;              /* the watch on the key it found before ours covers all
                                  after it: until that watch fires, no look sees more */
    char msg[DLOCK__MSG_MAX]; /* the failure of the wait's last request, "" when answered */
};

static int acquire_init(struct etcd_acquire *a, struct etcd_backend *s, struct dlock__hold *h,
                        struct dlock__wait *w)
{
    *a = (struct etcd_acquire){.s = s, .h = h, .lim = {dlock__wait_deadline(w), w}};
    a->own = h->fixed_lease || h->lease_ms != s->c->opts.lease_ms;
    a->pfx = dlock__etcd_lock_prefix(s, h->name);
    return a->pfx ? DLOCK_OK : dlock__etcd_nomem(s);
}

static void acquire_clear(struct etcd_acquire *a)
{
    dlock__etcd_watch_stop(a->wt);
    free(a->watched);
    free(a->pfx);
    free(a->key);
}

static int acquire_look(struct etcd_acquire *a, struct dlock__wait *w, int64_t *until);

/* When a waiting acquire wakes if nothing wakes it: its leases' next
 * keepalive (not in a hot loop after a failed one). */
static int64_t keepalive_time(const struct etcd_acquire *a, int64_t now)
{
    int64_t next = dlock__etcd_keepalive_due(&a->lr), wl_due = dlock__etcd_keepalive_due(&a->wl);
    if (wl_due < next)
        next = wl_due;
    return next < now + 200 ? now + 500 : next;
}

/* The wait for our turn ended with RC, not ours: start over (RESTART,
 * with PHASE_ENTER, while the restarts last) or give up -- our key
 * withdrawn (owed to the keeper after a timeout or a cancel), RC
 * returned with the failure of the last look (an outage) or its own. */
static int wait_ended(struct etcd_acquire *a, struct dlock__wait *w, int rc)
{
    struct etcd_backend *s = a->s;
    dlock__etcd_watch_stop(a->wt);
    a->wt = NULL;
    if (rc == RESTART) {
        if (a->on_waiters_lease) /* (a key on the waiters' lease outlives a lost hold lease) */
            dlock__etcd_delete_key(s, a->key, a->c.out.my_rev, dlock__wait_deadline(w), w);
        a->phase = PHASE_ENTER;
        if (a->restarts++ < 5)
            return RESTART;
        rc = dlock__err(DLOCK_EBACKEND, "%s: lock '%s': our key %s keeps vanishing while we wait",
                        s->label, a->h->name, a->key);
    }
    /* (a timeout keeps the reason of the last failed look, if any: an
     * outage; none says the other owner kept it) */
    bool answering;
    rc = dlock__etcd_wait_failed(w, rc, a->msg, &answering);
    withdraw(s, a->key, a->c.out.my_rev, &a->lr, w, rc,
             answering ? WITHDRAW_GRACE_MS : WITHDRAW_SLICE_MS);
    late_settle(s, &a->late, a->key, 0);
    a->phase = PHASE_DONE;
    return dlock__errmsg_restore(rc, a->msg);
}

/* Enter the queue (Go's tryAcquire), at the start or starting over: the
 * lease, our key put -- at once ours when nobody else is there -- and,
 * when it must wait, on the waiters' short lease (a waiter killed
 * meanwhile holds the queue up for that lease, not for the hold's: an
 * exclusive hold that finds the queue busy creates its key there; a
 * reader, or a race with another contender, creates it on the hold's
 * lease and moves it), then its first look. TURN, ETCD_SLEEP (waiting,
 * as acquire_look()), RESTART, or the end (a try-once's EBUSY). */
static int acquire_enter(struct etcd_acquire *a, struct dlock__wait *w, int64_t *until)
{
    struct etcd_backend *s = a->s;
    struct dlock__hold *h = a->h;
    int rc = DLOCK_OK;
restart:
    if (a->key)
        late_settle(s, &a->late, a->key, 0);
    free(a->key);
    a->key = NULL;
    if (a->own && a->lr.id) /* starting over: the old lease of our own goes */
        dlock__etcd_lease_revoke(s, a->lr.id, &a->lim);
    a->wl = (struct lease_ref){0};
    a->on_waiters_lease = false;
    a->turn = (struct turn){false, false};
    a->msg[0] = 0;
    a->phase = PHASE_DONE; /* until queued */
    if (!a->own) {
        rc = dlock__etcd_session_lease(s, h->name, &a->lr, &a->lim);
        /* (EBUSY: a try-once found another thread granting it) */
        a->own = rc == DLOCK_EBUSY;
    }
    if (a->own) {
        rc = dlock__etcd_lease_grant(s, h->name, h->lease_ms, &a->lr, &a->lim);
        a->lr.own = true;
    }
    if (rc) {
        a->lr.id = 0; /* none granted */
        return dlock__etcd_timed_out(w, rc);
    }
    if (!(a->key = dlock__etcd_hold_key(a->pfx, a->lr.id, h)))
        return dlock__etcd_nomem(s);
    rc = dlock__etcd_orphan_forget(s, a->key, w);
    if (rc == DLOCK_EBUSY && !a->own && a->restarts++ < 5) {
        a->own = true; /* a try-once: another key, on a lease of its own */
        goto restart;
    }
    if (rc) {
        if (a->own)
            dlock__etcd_lease_revoke(s, a->lr.id, &a->lim);
        return dlock__etcd_timed_out(w, rc);
    }
    struct contender *c = &a->c;
    *c = (struct contender){.s = s, .h = h, .key = a->key, .pfx = a->pfx, .lim = &a->lim};
    if (h->mode != DLOCK_SHARED) {
        rc = put_if_alone(c, a->lr.id);
        late_note(&a->late, a->lr.id, rc, c->out.resent);
    }
    if (!rc && c->out.busy && dlock__wait_try_once(w)) {
        if (a->own) /* nothing was put on it */
            dlock__etcd_lease_revoke_by(s, a->lr.id, grace_deadline(w));
        late_settle(s, &a->late, a->key, 0);
        return DLOCK_EBUSY;
    }
    if (!rc && c->out.busy) {
        rc = dlock__etcd_waiter_lease(s, h->name, a->lr.ttl_ms, &a->wl, &a->lim);
        a->on_waiters_lease = rc == DLOCK_OK;
    }
    if (!rc && c->out.my_rev) {
        c->out.owner_rev = c->out.my_rev; /* put by put_if_alone(): nobody else was there */
    } else if (!rc) {
        int64_t lease = a->on_waiters_lease ? a->wl.id : a->lr.id;
        c->out.resent = false;
        rc = put_and_read_owner(c, lease);
        late_note(&a->late, lease, rc, c->out.resent);
    }
    if (rc == DLOCK_EBACKEND && c->out.code == GRPC_NOT_FOUND && a->restarts++ < 3) {
        /* "requested lease not found": it expired under us. */
        if (a->on_waiters_lease)
            dlock__etcd_waiter_lease_dead(s, a->wl.id);
        else if (!a->own)
            dlock__etcd_session_lease_dead(s, a->lr.id);
        goto restart;
    }
    if (rc) {
        /* A put that may have happened: the member did not answer, so it
         * gets no more than a slice for the delete. */
        if (dlock__etcd_put_failed(w, &rc, a->msg))
            withdraw(s, a->key, c->out.my_rev, &a->lr, w, rc, WITHDRAW_SLICE_MS);
        else if (a->own)
            dlock__etcd_lease_revoke_by(s, a->lr.id, grace_deadline(w));
        late_settle(s, &a->late, a->key, 0);
        return dlock__errmsg_restore(rc, a->msg);
    }
    if (c->out.owner_rev == c->out.my_rev)
        return TURN;
    if (dlock__wait_try_once(w)) {
        withdraw(s, a->key, c->out.my_rev, &a->lr, w, DLOCK_EBUSY, WITHDRAW_GRACE_MS);
        late_settle(s, &a->late, a->key, 0);
        return DLOCK_EBUSY;
    }
    /* Wait our turn, our key on the waiters' short lease. */
    a->phase = PHASE_WAIT;
    if (!a->on_waiters_lease) {
        rc = dlock__etcd_waiter_lease(s, h->name, a->lr.ttl_ms, &a->wl, &a->lim);
        if (!rc) {
            rc = move_key(s, h, a->key, c->out.my_rev, a->wl.id, &c->out.code, &a->lim);
            a->on_waiters_lease = rc == DLOCK_OK;
            if (rc == DLOCK_EBACKEND && c->out.code == GRPC_NOT_FOUND) {
                dlock__etcd_waiter_lease_dead(s, a->wl.id); /* expired just now */
                rc = RESTART;
            }
        }
    }
    return rc ? wait_ended(a, w, rc) : acquire_look(a, w, until);
}

/* One turn of the wait for our key (create revision my_rev) to be the
 * oldest under its prefix: Go's waitDeletes, with a watch on the key
 * just before ours. A writer's is a registration on the client's shared
 * stream of deletions (watch.c) from the revision after the look's, and
 * it sleeps until that fires. A reader's is a watch of its own created
 * "from now": once etcd confirms it (a wake) the reader looks again -- a
 * deletion between the look and the watch's creation is seen then --
 * and sleeps until it fires. The keepalives of our key's lease (the waiters') and of the
 * lease the hold will hang on bound every sleep; a look follows only
 * when it may see something new (acquire_woke), and every
 * SAFETY_LOOK_MS as a safety net. An outage or election is looked at
 * again shortly, within the wait. TURN
 * (a->turn says what the look that said so did and saw), ETCD_SLEEP
 * until a wake of W since a->seq or *UNTIL, RESTART, or the end
 * (wait_ended). */
static int acquire_look(struct etcd_acquire *a, struct dlock__wait *w, int64_t *until)
{
    struct etcd_backend *s = a->s;
    a->seq = dlock__wait_seq(w);
    bool confirmed = a->wt && dlock__etcd_watch_live(a->wt); /* before the look reads */
    a->looked = dlock__now_ms();
    a->settled = false;
    struct queue_look l = {0};
    int rc = look(&a->c, a->lr.id, &l);
    char *pred = l.pred; /* ours to free, or to keep as the key watched */
    a->turn = (struct turn){l.moved, l.no_marker};
    if (rc == DLOCK_EBACKEND && l.code == GRPC_NOT_FOUND) {
        /* "requested lease not found": the hold's lease expired */
        dlock__etcd_lease_dead(s, &a->lr);
        return wait_ended(a, w, RESTART);
    }
    if (rc == DLOCK_OK)
        a->msg[0] = 0;
    if (rc == DLOCK_OK && !l.mine_exists) {
        /* Our key is gone while we waited: our lease expired (paused
         * process, long outage) or someone deleted it. Start again at
         * the end of the queue with a live lease. */
        int64_t sent;
        if (dlock__etcd_lease_keepalive(s, a->wl.id, &sent, NULL, &a->lim) == DLOCK_ELOST)
            dlock__etcd_lease_dead(s, &a->wl);
        free(pred);
        return wait_ended(a, w, RESTART);
    }
    if (rc == DLOCK_OK && !pred) { /* nobody before us: ours */
        dlock__etcd_watch_stop(a->wt);
        a->wt = NULL;
        return TURN;
    }
    int64_t now = dlock__now_ms(), next = keepalive_time(a, now);
    if (rc == DLOCK_OK) /* a watch sent what etcd never sends: no more waits on it */
        rc = dlock__etcd_watch_error(a->wt);
    if (rc == DLOCK_OK) {
        /* Keep a watch on the same key that etcd confirmed and that has
         * not fired. One started last turn and still unconfirmed is
         * replaced: etcd never answers a watch whose auth token expired
         * on the way, it just leaves it hanging. */
        bool same = a->wt && strcmp(a->watched, pred) == 0 && dlock__etcd_watch_live(a->wt);
        a->settled = same && confirmed;
        if (!same) {
            dlock__etcd_watch_stop(a->wt);
            a->wt = NULL;
            free(a->watched);
            a->watched = pred;
            pred = NULL;
            /* A writer registers on the client's stream of deletions from
             * the revision after this look's: it covers what the look did
             * not see, so no look follows once the stream is confirmed. A
             * reader also wakes when that writer downgrades (a put): a
             * watch of its own from now, looked after once confirmed. */
            bool reader = a->h->mode == DLOCK_SHARED;
            rc = reader ? dlock__etcd_watch_start_for(s->k, a->watched, 0, true, w, &a->wt)
                        : dlock__etcd_watch_deletes(s->k, a->watched, l.at + 1, w, &a->wt);
            a->settled = rc == DLOCK_OK && !reader;
        }
    } else if (dlock__etcd_transient(rc)) {
        /* Outage or election: try again shortly, within our wait. */
        dlock__errmsg_save(a->msg);
        rc = DLOCK_OK;
        if (next > now + 500)
            next = now + 500;
    }
    free(pred);
    if (rc)
        return wait_ended(a, w, rc);
    *until = next;
    return ETCD_SLEEP;
}

/* Woken, or at the time the wait asked for: the watch's error, the
 * leases' keepalives. DLOCK_OK to look again; ETCD_SLEEP (until a wake
 * or *UNTIL) when a look would see nothing new -- the last one was
 * settled (a registration made after it, or a watch confirmed before
 * it), the watch is live (confirmed) and has not fired since,
 * no request failed and the safety net's look is not due: a waiter is
 * woken by its watch, not by polling the queue at each keepalive. Or
 * the end (wait_ended). */
static int acquire_woke(struct etcd_acquire *a, struct dlock__wait *w, int64_t *until)
{
    unsigned seq = dlock__wait_seq(w); /* a fire from the check below on wakes the sleep */
    int rc = dlock__etcd_watch_error(a->wt); /* EPROTO */
    if (!rc)
        rc = dlock__etcd_waiter_keepalive(a->s, &a->wl, &a->lr, a->msg, &a->lim);
    if (rc)
        return wait_ended(a, w, rc);
    int64_t now = dlock__now_ms(), safety = a->looked + SAFETY_LOOK_MS;
    if (!a->settled || a->msg[0] || now >= safety || !dlock__etcd_watch_live(a->wt))
        return DLOCK_OK;
    int64_t next = keepalive_time(a, now);
    *until = next < safety ? next : safety;
    a->seq = seq;
    return ETCD_SLEEP;
}

/* Ours -- unless the name is in a lock-delay (delay.c), or the hold
 * before ours ended without its clean release and starts one now: then
 * we step out of the queue and start over at the delay's end (ETCD_SLEEP
 * until *UNTIL, PHASE_ENTER; our place is lost). The txn that found our
 * key first counted the marker (delay_probe): only a marker found is
 * looked at, so an acquire pays no request for the delay when none is
 * there. Then the hold: DLOCK_OK, RESTART, or the end. */
static int acquire_finish(struct etcd_acquire *a, struct dlock__wait *w, int64_t *until)
{
    struct etcd_backend *s = a->s;
    struct dlock__hold *h = a->h;
    struct contender *c = &a->c;
    const char *key = a->key;
    int rc = DLOCK_OK;
    int64_t delay_left = 0;
    a->seq = dlock__wait_seq(w);
    bool no_marker = c->out.owner_rev == c->out.my_rev ? c->out.no_marker : a->turn.no_marker;
    if (!no_marker)
        rc = dlock__etcd_delay_look(s, h->name, ETCD_DELAY_START, &delay_left, &a->lim);
    if (!rc && delay_left > 0) {
        withdraw(s, key, c->out.my_rev, &a->lr, w, DLOCK_EBUSY, WITHDRAW_GRACE_MS);
        dlock__wait_in_delay(w, delay_left);
        a->phase = PHASE_ENTER;
        if (dlock__wait_try_once(w)) {
            late_settle(s, &a->late, key, 0);
            return DLOCK_EBUSY;
        }
        /* until the delay's end as the backend timed it: no event comes then */
        *until = dlock__now_ms() + delay_left;
        return ETCD_SLEEP;
    }
    /* Make sure the validity we report starts from a fresh lease
     * confirmation, and hang a key that waited back on the hold's lease
     * (same create revision: same token) unless the look that found it
     * ours did. */
    if (!rc && dlock__now_ms() - a->lr.confirmed > a->lr.ttl_ms / 3)
        rc = dlock__etcd_lease_refresh(s, &a->lr, &a->lim);
    if (!rc && a->on_waiters_lease && !a->turn.moved) {
        rc = move_key(s, h, key, c->out.my_rev, a->lr.id, &c->out.code, &a->lim);
        if (rc == DLOCK_EBACKEND && c->out.code == GRPC_NOT_FOUND)
            rc = DLOCK_ELOST;
    }
    if ((rc == DLOCK_ELOST || rc == RESTART) && a->restarts++ < 5) {
        if (rc == DLOCK_ELOST) { /* the hold's lease is gone; our key, maybe not */
            dlock__etcd_lease_dead(s, &a->lr);
            if (a->on_waiters_lease)
                dlock__etcd_delete_key(s, key, c->out.my_rev, dlock__wait_deadline(w), w);
        }
        a->phase = PHASE_ENTER;
        return RESTART;
    }
    a->phase = PHASE_DONE;
    if (rc) {
        if (rc == RESTART)
            rc = dlock__err(DLOCK_EBACKEND, "%s: lock '%s': our key %s keeps vanishing", s->label,
                            h->name, key);
        rc = dlock__etcd_timed_out(w, rc);
        dlock__errmsg_save(a->msg);
        withdraw(s, key, c->out.my_rev, &a->lr, w, rc, WITHDRAW_SLICE_MS);
        late_settle(s, &a->late, key, 0);
        return dlock__errmsg_restore(rc, a->msg);
    }
    struct etcd_hold *eh = calloc(1, sizeof *eh);
    if (!eh) {
        withdraw(s, key, c->out.my_rev, &a->lr, w, DLOCK_ENOMEM, WITHDRAW_GRACE_MS);
        late_settle(s, &a->late, key, 0);
        return dlock__etcd_nomem(s);
    }
    late_settle(s, &a->late, key, c->out.my_rev);
    dlock__etcd_hold_keep(s, h, eh, a->key, c->out.my_rev, &a->lr, a->own, key);
    a->key = NULL; /* the hold's now */
    if (h->mode == DLOCK_EXCLUSIVE && s->c->opts.lock_delay_ms) {
        /* the marker a clean release deletes (delay.c) */
        rc = dlock__etcd_delay_arm(s, h, &a->lim);
        if (rc) {
            dlock__errmsg_save(a->msg);
            dlock__etcd_release(s, h);
            return dlock__errmsg_restore(dlock__etcd_timed_out(w, rc), a->msg);
        }
        eh->delay_ms = s->c->opts.lock_delay_ms;
    }
    return DLOCK_OK;
}

int dlock__etcd_acquire_step(struct etcd_acquire *a, struct dlock__wait *w, int64_t *until)
{
    int rc = DLOCK_OK;
    if (a->slept && a->phase == PHASE_WAIT)
        rc = acquire_woke(a, w, until);
    a->slept = rc == ETCD_SLEEP;
    if (rc && rc != RESTART)
        return rc;
    do {
        rc = a->phase == PHASE_ENTER ? acquire_enter(a, w, until) : acquire_look(a, w, until);
        if (rc == TURN)
            rc = acquire_finish(a, w, until);
    } while (rc == RESTART);
    a->slept = rc == ETCD_SLEEP;
    return rc;
}

int dlock__etcd_acquire_give_up(struct etcd_acquire *a, struct dlock__wait *w, int rc)
{
    if (a->phase == PHASE_DONE)
        return rc;
    if (a->phase == PHASE_WAIT)
        return wait_ended(a, w, rc);
    if (a->key) /* stepped out of the queue (a delay, an outage) */
        late_settle(a->s, &a->late, a->key, 0);
    a->phase = PHASE_DONE;
    return rc == DLOCK_ETIMEDOUT && a->msg[0] ? dlock__errmsg_restore(rc, a->msg) : rc;
}

void dlock__etcd_acquire_again(struct etcd_acquire *a)
{
    dlock__errmsg_save(a->msg);
    if (a->own)
        a->lr.id = 0; /* revoked, or owed, by the give-up */
    a->phase = PHASE_ENTER;
}

struct etcd_acquire *dlock__etcd_acquire_new(struct etcd_backend *s, struct dlock__hold *h,
                                             struct dlock__wait *w)
{
    struct etcd_acquire *a = malloc(sizeof *a);
    if (!a) {
        dlock__etcd_nomem(s);
        return NULL;
    }
    if (acquire_init(a, s, h, w)) {
        free(a);
        return NULL;
    }
    return a;
}

void dlock__etcd_acquire_free(struct etcd_acquire *a)
{
    if (!a)
        return;
    acquire_clear(a);
    free(a);
}

/* The blocking acquire: its steps in a row, sleeping where they say. */
static int etcd_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
{
    struct etcd_acquire a;
    int64_t until = 0;
    int rc = acquire_init(&a, state, h, w);
    while (!rc && (rc = dlock__etcd_acquire_step(&a, w, &until)) == ETCD_SLEEP) {
        if ((rc = dlock__wait_sleep(w, a.seq, until)))
            rc = dlock__etcd_acquire_give_up(&a, w, rc);
    }
    acquire_clear(&a);
    return rc;
}

void dlock__etcd_hold_keep(struct etcd_backend *s, struct dlock__hold *h, struct etcd_hold *eh,
                           char *key, int64_t rev, const struct lease_ref *lr, bool own,
                           const char *owner)
{
    eh->key = key;
    eh->rev = rev;
    eh->lease = lr->id;
    eh->own_lease = own;
    h->bdata = eh;
    h->token = (uint64_t)rev;
    snprintf(h->owner, sizeof h->owner, "%s", owner);
    dlock__hold_confirmed_short(s->c, h, lr->confirmed, lr->ttl_ms);
}

/* ---------------------------------------------------------------- release */

int dlock__etcd_release_answer(struct etcd_backend *s, struct dlock__hold *h,
                               const struct etcd_hold *eh, int rc, bool succeeded, bool resent)
{
    /* A release sent again after a lost reply finds the key gone: most
     * likely our first attempt deleted it. Not a loss. */
    if (rc == DLOCK_OK && !succeeded && !resent)
        return dlock__err(DLOCK_ELOST, "%s: lock '%s': key %s (token %lld) was gone before the "
                                       "release (lease expired or force-released)",
                          s->label, h->name, eh->key, (long long)eh->rev);
    if (rc && dlock__etcd_transient(rc)) {
        char msg[DLOCK__MSG_MAX];
        dlock__errmsg_save(msg);
        dlock__etcd_delete_key(s, eh->key, eh->rev, 0, NULL); /* remembered for a later retry */
        dlock__errmsg_restore(rc, msg);
    }
    return rc;
}

void dlock__etcd_hold_drop(struct etcd_backend *s, struct etcd_hold *eh, int rc)
{
    if (eh->own_lease) {
        char msg[DLOCK__MSG_MAX];
        dlock__errmsg_save(msg);
        dlock__etcd_lease_revoke(s, eh->lease, NULL);
        dlock__errmsg_restore(rc, msg);
    }
    free(eh->key);
    free(eh);
}

/* The txn that gives hold H (its key EH) up: the key deleted if it is
 * still the one we created and, when the hold armed a lock-delay, its
 * marker deleted in the same step if still its own (delay.c) -- a clean
 * release leaves no delay, and no contender the delete wakes can find
 * the marker first. NULL: out of memory. */
static json_t *release_txn(struct etcd_backend *s, const struct dlock__hold *h,
                           const struct etcd_hold *eh)
{
    return dlock__etcd_delay_clear_in(s, dlock__etcd_delete_if_txn(eh->key, eh->rev), h->name,
                                      h->token, eh->delay_ms);
}

int dlock__etcd_release(void *state, struct dlock__hold *h)
{
    struct etcd_backend *s = state;
    struct etcd_hold *eh = h->bdata;
    if (!eh)
        return DLOCK_OK;
    h->bdata = NULL;
    /* Delete the key only if it is still the one we created. */
    json_t *req = release_txn(s, h, eh);
    int rc;
    json_t *reply = NULL;
    if (!req) {
        rc = dlock__etcd_nomem(s);
    } else {
        char what[1200];
        snprintf(what, sizeof what, "release '%s' (key %s)", h->name, eh->key);
        bool resent = false;
        rc = dlock__etcd_call_resent(s->k, "/v3/kv/txn", req, &reply, what, NULL, &resent);
        rc = dlock__etcd_release_answer(s, h, eh, rc,
                                        json_is_true(json_object_get(reply, "succeeded")), resent);
    }
    json_decref(req);
    json_decref(reply);
    dlock__etcd_hold_drop(s, eh, rc);
    return rc;
}

/* The lock ops' release_within (backend.h): the release txn, only while
 * DEADLINE leaves time; what is not answered by then, or not sent, is
 * owed -- the key remembered as an orphan the keeper deletes (lease.c),
 * which an acquire of the same key by this client forgets first, so it
 * never ends a later hold. An own lease is revoked within DEADLINE only,
 * else it expires by its TTL, carrying nothing once the key is gone. */
static int etcd_release_within(void *state, struct dlock__hold *h, int64_t deadline)
{
    struct etcd_backend *s = state;
    struct etcd_hold *eh = h->bdata;
    if (!eh)
        return DLOCK_OK;
    h->bdata = NULL;
    struct etcd_limits lim = {deadline, NULL};
    json_t *req = (dlock__time_left(deadline, 1) > 0) ? release_txn(s, h, eh) : NULL;
    json_t *reply = NULL;
    int rc = DLOCK_ETIMEDOUT;
    if (req) {
        char what[1200];
        snprintf(what, sizeof what, "release '%s' (key %s)", h->name, eh->key);
        bool resent = false;
        rc = dlock__etcd_call_lim(s->k, "/v3/kv/txn", req, &reply, what, NULL, &resent, &lim);
        if (rc == DLOCK_OK)
            rc = dlock__etcd_release_answer(s, h, eh, rc,
                                            json_is_true(json_object_get(reply, "succeeded")),
                                            resent);
    }
    json_decref(req);
    json_decref(reply);
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    if (rc == DLOCK_ETIMEDOUT || dlock__etcd_transient(rc)) {
        dlock__etcd_delete_key(s, eh->key, eh->rev, dlock__now_ms(), NULL); /* owed: nothing sent now */
        rc = DLOCK_OK;
    }
    if (eh->own_lease && (dlock__time_left(deadline, 1) > 0))
        dlock__etcd_lease_revoke(s, eh->lease, &lim);
    free(eh->key);
    free(eh);
    return dlock__errmsg_restore(rc, msg);
}

static const char *const etcd_schemes[] = {"etcd", "etcd+https", NULL};

static const struct dlock__lock_ops etcd_lock_ops = {
    .acquire = etcd_acquire,
    .release = dlock__etcd_release,
    .release_within = etcd_release_within,
    .downgrade = dlock__etcd_downgrade,
    .try_armed = dlock__etcd_try_armed,
    .disarm = dlock__etcd_disarm,
};

static const struct dlock__multi_ops etcd_multi_ops = {
    .acquire = dlock__etcd_multi_acquire,
    .release = dlock__etcd_multi_release,
};

static const struct dlock__sem_ops etcd_sem_ops = {
    .acquire = dlock__etcd_sem_acquire,
    .release = dlock__etcd_release, /* a permit's key goes as a lock's */
    .inspect = dlock__etcd_sem_inspect,
    .list = dlock__etcd_sem_list,
};

static const struct dlock__elect_ops etcd_elect_ops = {
    .acquire = etcd_acquire, /* Go's Election is the Mutex's layout */
    .release = dlock__etcd_release,
    .proclaim = dlock__etcd_elect_proclaim,
    .observe = dlock__etcd_elect_observe,
    .try_armed = dlock__etcd_try_armed, /* the mutex's, its key holding the proposal */
    .disarm = dlock__etcd_disarm,
};

static const struct dlock__admin_ops etcd_admin_ops = {
    .inspect = dlock__etcd_inspect,
    .check = dlock__etcd_check,
    .force_release = dlock__etcd_force_release,
    .list = dlock__etcd_list,
};

const struct dlock__backend dlock__backend_etcd = {
    .name = "etcd",
    .schemes = etcd_schemes,
    .caps = DLOCK__CAP_SHARED | DLOCK__CAP_LEASES | DLOCK__CAP_FAIR | DLOCK__CAP_LOCK_DELAY |
            DLOCK__CAP_CLIENT_OWNER | DLOCK__CAP_FIXED_LEASE,
    .default_port = ETCD_DEFAULT_PORT,
    .open = dlock__etcd_open,
    .close = dlock__etcd_close,
    .renew = dlock__etcd_renew,
    .locks = &etcd_lock_ops,
    .multi = &etcd_multi_ops,
    .semaphores = &etcd_sem_ops,
    .elections = &etcd_elect_ops,
    .admin = &etcd_admin_ops,
    .values = &dlock__etcd_value_ops,
    .contend = &dlock__etcd_contend_ops,
    .guarded = &dlock__etcd_guarded_ops,
};
