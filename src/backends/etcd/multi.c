/* multi.c -- the etcd backend's multi-lock op: a whole set of exclusive
 * locks in one transaction, so an uncontended dlock_multi_acquire() costs
 * one round trip instead of one (or more) per member.
 *
 * Why it is shaped so. Each member is what mutex.c makes of a lock: the
 * key "<prefix>NAME/<lease hex>" on the client's session lease, in the
 * layout of Go's concurrency.Mutex, so `etcdctl lock NAME` and a plain
 * dlock_lock exclude the set and the keeper renews and checks each member
 * as any hold. The transaction compares, for every member, that no key
 * at all lives under "<prefix>NAME/" (a compare over the range: create
 * revision 0 for every key in it, which an empty range satisfies), and
 * only then puts every key: all or nothing, and a set taken at once is
 * the first and only contender of each name, so it owns every one. The
 * keys share one create revision, each member's token (greater than
 * every earlier token of that name, as etcd's revisions only grow). When
 * the compare fails, the failure branch reads each name's oldest key,
 * in the same round trip, to say which member is held (DLOCK_EBUSY); a
 * name whose keys are none of a contender's (a semaphore's count, say)
 * or only our own leftover (a release that never reached the member)
 * makes the set one to take member by member (DLOCK_ENOTSUP), as do
 * shared sets, members on a lease of their own and a session lease that
 * expired under us. The core then queues
 * and waits member by member through mutex.c.
 *
 * The set's release is one transaction too: each member's own guarded
 * delete (its key, if its create revision is still ours: mutex.c's
 * release txn) nested as a txn of its own inside one that always
 * succeeds, so every member is checked on its own -- one found gone is
 * DLOCK_ELOST as its single release would say, and the others are still
 * deleted -- and every deleted key wakes that name's watchers. A lost
 * reply is what the single release makes of it: a transient failure
 * leaves each key's delete to the cleanup queue (dlock__etcd_delete_key),
 * a resent txn that finds a key gone takes it as deleted by the first.
 * Members on a lease of their own go member by member (DLOCK_ENOTSUP):
 * mutex.c revokes each lease.
 */
#include "etcd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the set's transaction needs of member H: its lock's prefix, its
 * key on LEASE, and both base64-encoded. */
struct member {
    char *pfx, *key, *kb, *pfx_b64, *end_b64;
};

static void members_free(struct member *mb, size_t n)
{
    for (size_t i = 0; mb && i < n; i++) {
        free(mb[i].pfx);
        free(mb[i].key);
        free(mb[i].kb);
        free(mb[i].pfx_b64);
        free(mb[i].end_b64);
    }
    free(mb);
}

/* The transaction: every prefix empty → put every key on LEASE; else
 * read the oldest keys under each prefix. NULL when out of memory. */
static json_t *set_txn(struct etcd_backend *s, struct dlock__hold **hs, const struct member *mb,
                       size_t n, int64_t lease)
{
    json_t *cmp = json_array(), *ok = json_array(), *fail = json_array();
    char *ls = dlock__etcd_i64s(lease);
    bool good = cmp && ok && fail && ls;
    for (size_t i = 0; good && i < n; i++) {
        const char *value = dlock__etcd_hold_value(s, hs[i]);
        char *vb = dlock__etcd_b64(value, strlen(value));
        json_t *range = dlock__etcd_queue_range_for(mb[i].pfx, true, 0, false);
        good = vb && range &&
               !json_array_append_new(cmp, json_pack("{s:s, s:s, s:s, s:s, s:s}", "result", "EQUAL",
                                                     "target", "CREATE", "key", mb[i].pfx_b64,
                                                     "range_end", mb[i].end_b64, "create_revision",
                                                     "0")) &&
               !json_array_append_new(ok, json_pack("{s:{s:s, s:s, s:s}}", "request_put", "key",
                                                    mb[i].kb, "value", vb, "lease", ls));
        if (good) /* range is the pack's now, packed or not */
            good = !json_array_append_new(fail, json_pack("{s:o}", "request_range", range));
        else
            json_decref(range);
        free(vb);
    }
    free(ls);
    json_t *req =
        good ? json_pack("{s:o, s:o, s:o}", "compare", cmp, "success", ok, "failure", fail) : NULL;
    if (!req) {
        json_decref(cmp);
        json_decref(ok);
        json_decref(fail);
    }
    return req;
}

/* Take the keys of the set back (a put that may have happened, or the
 * first of two sends that did: their create revision is not known, each
 * is read before its delete), within DEADLINE; what is not done now is
 * remembered and done later (dlock__etcd_delete_key). */
static void withdraw_all(struct etcd_backend *s, const struct member *mb, size_t n,
                         int64_t deadline)
{
    for (size_t i = 0; i < n; i++)
        dlock__etcd_delete_key(s, mb[i].key, 0, deadline, NULL);
}

int dlock__etcd_multi_acquire(void *state, struct dlock__hold **hs, size_t n, struct dlock__wait *w,
                              size_t *busy)
{
    struct etcd_backend *s = state;
    if (hs[0]->mode != DLOCK_EXCLUSIVE || s->c->opts.lock_delay_ms) /* each arms its marker */
        return DLOCK_ENOTSUP;
    for (size_t i = 0; i < n; i++)
        if (hs[i]->fixed_lease || hs[i]->lease_ms != s->c->opts.lease_ms)
            return DLOCK_ENOTSUP; /* a lease of its own: mutex.c grants it */
    struct etcd_limits lim = {dlock__wait_deadline(w), w};
    struct lease_ref lr = {0};
    int rc = dlock__etcd_session_lease(s, hs[0]->name, &lr, &lim);
    /* Validity counts from a fresh confirmation of the lease, as mutex.c's */
    if (!rc && dlock__now_ms() - lr.confirmed > lr.ttl_ms / 3)
        rc = dlock__etcd_lease_refresh(s, &lr, &lim);
    if (rc)
        return rc == DLOCK_EBUSY ? DLOCK_ENOTSUP : dlock__etcd_timed_out(w, rc);
    struct member *mb = calloc(n, sizeof *mb);
    if (!mb)
        return dlock__etcd_nomem(s);
    for (size_t i = 0; i < n && !rc; i++) {
        mb[i].pfx = dlock__etcd_lock_prefix(s, hs[i]->name);
        mb[i].key = mb[i].pfx ? dlock__etcd_hold_key(mb[i].pfx, lr.id, hs[i]) : NULL;
        mb[i].kb = mb[i].key ? dlock__etcd_b64(mb[i].key, strlen(mb[i].key)) : NULL;
        mb[i].pfx_b64 = mb[i].pfx ? dlock__etcd_b64(mb[i].pfx, strlen(mb[i].pfx)) : NULL;
        mb[i].end_b64 = mb[i].pfx ? dlock__etcd_prefix_end_b64(mb[i].pfx) : NULL;
        if (!mb[i].kb || !mb[i].pfx_b64 || !mb[i].end_b64)
            rc = dlock__etcd_nomem(s);
        else if ((rc = dlock__etcd_orphan_forget(s, mb[i].key, w)) == DLOCK_EBUSY)
            rc = DLOCK_ENOTSUP; /* a sweep's delete of it in flight */
    }
    json_t *req = rc ? NULL : set_txn(s, hs, mb, n, lr.id);
    if (!rc && !req)
        rc = dlock__etcd_nomem(s);
    json_t *reply = NULL;
    bool resent = false;
    char what[200];
    snprintf(what, sizeof what, "acquire a multi-lock of %zu names ('%s'...)", n, hs[0]->name);
    if (!rc) {
        int code = 0;
        rc = dlock__etcd_call_lim(s->k, "/v3/kv/txn", req, &reply, what, &code, &resent, &lim);
        if (dlock__etcd_put_may_land(rc, resent)) {
            /* (a first send may put the keys after the set gave them up:
             * the keeper deletes them; held now, the holds are spared) */
            int64_t spare = !rc && json_is_true(json_object_get(reply, "succeeded"))
                                ? dlock__etcd_header_rev(reply)
                                : 0;
            for (size_t i = 0; i < n; i++)
                dlock__etcd_late_put(s, mb[i].key, lr.id, spare);
        }
        char msg[DLOCK__MSG_MAX];
        if (rc == DLOCK_EBACKEND && code == GRPC_NOT_FOUND) {
            /* "requested lease not found": it expired under us; the
             * member by member path grants a new one */
            dlock__etcd_session_lease_dead(s, lr.id);
            rc = DLOCK_ENOTSUP;
        } else if (rc && dlock__etcd_put_failed(w, &rc, msg)) {
            /* (the member did not answer: a short slice for the deletes) */
            withdraw_all(s, mb, n,
                         rc == DLOCK_ETIMEDOUT || rc == DLOCK_ECANCELED ? dlock__now_ms()
                                                                        : dlock__now_ms() + 50);
            dlock__errmsg_restore(rc, msg);
        }
    }
    if (!rc && json_is_true(json_object_get(reply, "succeeded"))) {
        int64_t rev = dlock__etcd_header_rev(reply);
        if (rev <= 0) {
            withdraw_all(s, mb, n, dlock__now_ms() + 1000);
            rc = dlock__err(DLOCK_EPROTO, "%s: %s: the reply has no revision", s->label, what);
        }
        for (size_t i = 0; !rc && i < n; i++) {
            struct etcd_hold *eh = calloc(1, sizeof *eh);
            if (!eh) { /* the others are registered: the core releases them */
                dlock__etcd_delete_key(s, mb[i].key, rev, dlock__now_ms() + 1000, NULL);
                rc = dlock__etcd_nomem(s);
                for (size_t j = i + 1; j < n; j++)
                    dlock__etcd_delete_key(s, mb[j].key, rev, dlock__now_ms() + 1000, NULL);
                for (size_t j = 0; j < i; j++)
                    dlock__etcd_release(s, hs[j]);
                break;
            }
            dlock__etcd_hold_keep(s, hs[i], eh, mb[i].key, rev, &lr, false, mb[i].key);
            mb[i].key = NULL; /* the hold's now */
        }
    } else if (!rc && resent) {
        /* The first send may have put the keys: take them back, and let
         * the core go member by member. */
        withdraw_all(s, mb, n, dlock__now_ms() + 1000);
        rc = DLOCK_ENOTSUP;
    } else if (!rc) {
        /* Which member is held? The oldest contender under each prefix,
         * from the failure branch's ranges. */
        rc = DLOCK_ENOTSUP;
        for (size_t i = 0; i < n && rc == DLOCK_ENOTSUP; i++) {
            struct etcd_queue_search oldest = {.pfx = mb[i].pfx,
                                               .resp = dlock__etcd_txn_range(reply, i),
                                               .ascending = true,
                                               .what = what,
                                               .lim = &lim};
            int found = dlock__etcd_queue_find(s, &oldest);
            json_t *owner = oldest.out.kv;
            char *first = owner ? dlock__etcd_kv_key(owner) : NULL;
            if (found)
                rc = found;
            else if (owner && first && strcmp(first, mb[i].key) == 0)
                ; /* our own leftover: mutex.c replaces it, member by member */
            else if (owner) {
                *busy = i;
                rc = dlock__err(DLOCK_EBUSY, "%s: lock '%s' is held by another owner", s->label,
                                hs[i]->name);
            }
            free(first);
            json_decref(owner);
        }
    }
    json_decref(req);
    json_decref(reply);
    members_free(mb, n);
    return rc;
}

int dlock__etcd_multi_release(void *state, struct dlock__hold **hs, size_t n, int *rcs)
{
    struct etcd_backend *s = state;
    for (size_t i = 0; i < n; i++) {
        const struct etcd_hold *eh = hs[i]->bdata;
        if (!eh || eh->own_lease || eh->delay_ms) /* a marker to clear: one by one */
            return DLOCK_ENOTSUP;
    }
    json_t *ops = json_array();
    bool good = ops != NULL;
    for (size_t i = 0; good && i < n; i++) {
        const struct etcd_hold *eh = hs[i]->bdata;
        json_t *one = dlock__etcd_delete_if_txn(eh->key, eh->rev);
        good = one && !json_array_append_new(ops, json_pack("{s:o}", "request_txn", one));
    }
    json_t *req = good ? json_pack("{s:o}", "success", ops) : NULL;
    if (!req) {
        json_decref(ops);
        return DLOCK_ENOTSUP; /* member by member */
    }
    char what[200];
    snprintf(what, sizeof what, "release a multi-lock of %zu names ('%s'...)", n, hs[0]->name);
    json_t *reply = NULL;
    bool resent = false;
    int rc = dlock__etcd_call_resent(s->k, "/v3/kv/txn", req, &reply, what, NULL, &resent);
    char said[DLOCK__MSG_MAX];
    dlock__errmsg_save(said);
    char msg[DLOCK__MSG_MAX] = "";
    json_t *resps = json_object_get(reply, "responses");
    for (size_t i = 0; i < n; i++) {
        struct etcd_hold *eh = hs[i]->bdata;
        hs[i]->bdata = NULL;
        json_t *txn = json_object_get(json_array_get(resps, i), "response_txn");
        if (rc)
            dlock__errmsg_restore(rc, said);
        rcs[i] =
            dlock__etcd_release_answer(s, hs[i], eh, rc,
                                       json_is_true(json_object_get(txn, "succeeded")), resent);
        if (rcs[i])
            dlock__errmsg_save(msg); /* the last member that failed says */
        dlock__etcd_hold_drop(s, eh, rcs[i]);
    }
    json_decref(req);
    json_decref(reply);
    if (msg[0])
        dlock__errmsg_restore(DLOCK_OK, msg);
    return DLOCK_OK;
}
