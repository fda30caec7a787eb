/* value.c -- the etcd backend's lock values: what a lock's holder writes
 * beside the lock, for anyone to read (dlock_value_set(),
 * dlock_value_get()).
 *
 * Lock NAME's value is the key "<prefix>dlock_value:NAME", outside the
 * lock's own prefix "<prefix>NAME/": Go's concurrency.Mutex (`etcdctl
 * lock NAME`) takes every key under that prefix for a contender, so a
 * value kept there would hold its locks up forever. The key has no lease
 * (a value outlives holds); its value is the writer's token in decimal,
 * a newline, then the bytes. The holder writes it in one transaction
 * guarded by its own key, as Go's IsOwner() guards a write: if the
 * hold's key still has the hold's create revision (the token) put the
 * value (or, for a clear, delete it). A key that is gone -- its lease
 * expired, force-released -- fails the compare and nothing is written:
 * DLOCK_ELOST. A read is one range of the value's key.
 */
#include "etcd.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Lock NAME's value key (KEY NULL), or the key of guarded key KEY of
 * its store (guard.c) (caller frees). */
static char *value_key(struct etcd_backend *s, const char *name, const char *key)
{
    return key ? dlock__sprintf("%sdlock_guarded:%s:%s", s->prefix, name, key)
               : dlock__sprintf("%sdlock_value:%s", s->prefix, name);
}

/* The transaction that writes V (NULL: deletes) at value key VKEY if the
 * key of hold EH still has its create revision (NULL: out of memory). */
static json_t *guarded_txn(const struct etcd_hold *eh, const char *vkey,
                           const struct dlock__value *v, uint64_t token)
{
    char *kb = dlock__etcd_b64(eh->key, strlen(eh->key)),
         *vkb = dlock__etcd_b64(vkey, strlen(vkey));
    char *rs = dlock__etcd_i64s(eh->rev);
    char *body = NULL, *bb = NULL;
    size_t blen = 0;
    if (v && (body = dlock__value_encode(v, token, &blen)))
        bb = dlock__etcd_b64(body, blen);
    json_t *req = NULL;
    if (kb && vkb && rs && (!v || bb)) {
        json_t *op = v ? json_pack("{s:{s:s, s:s}}", "request_put", "key", vkb, "value", bb)
                       : json_pack("{s:{s:s}}", "request_delete_range", "key", vkb);
        req = op ? json_pack("{s:[{s:s, s:s, s:s, s:s}], s:[o]}", "compare", "result", "EQUAL",
                             "target", "CREATE", "key", kb, "create_revision", rs, "success", op)
                 : NULL;
    }
    free(kb);
    free(vkb);
    free(rs);
    free(body);
    free(bb);
    return req;
}

int dlock__etcd_stored_set(void *state, struct dlock__hold *h, const char *key,
                           const struct dlock__value *v)
{
    struct etcd_backend *s = state;
    const struct etcd_hold *eh = h->bdata;
    char thing[DLOCK_GUARDED_KEY_MAX + 8];
    snprintf(thing, sizeof thing, key ? "key '%s'" : "its value", key);
    if (!eh)
        return dlock__err(DLOCK_ELOST, "%s: lock '%s': no key held; %s is not written", s->label,
                          h->name, thing);
    char *vkey = value_key(s, h->name, key);
    if (!vkey)
        return dlock__etcd_nomem(s);
    char what[1400];
    if (key)
        snprintf(what, sizeof what, "%s %s of '%s' (%s) if %s is still ours", v ? "put" : "delete",
                 thing, h->name, vkey, eh->key);
    else
        snprintf(what, sizeof what, "%s the value of '%s' (key %s) if %s is still ours",
                 v ? "write" : "clear", h->name, vkey, eh->key);
    struct etcd_limits lim = {dlock__now_ms() + s->k->op_timeout_ms, NULL};
    json_t *reply = NULL;
    int code = 0;
    int rc = dlock__etcd_txn(s, guarded_txn(eh, vkey, v, h->token), &reply, what, &code, &lim);
    if (!rc && !json_is_true(json_object_get(reply, "succeeded")))
        rc = dlock__err(DLOCK_ELOST,
                        "%s: lock '%s': key %s (create revision %lld) is gone; %s is not "
                        "written",
                        s->label, h->name, eh->key, (long long)eh->rev, thing);
    json_decref(reply);
    free(vkey);
    return rc;
}

int dlock__etcd_stored_get(void *state, const char *name, const char *key, struct dlock__value *out)
{
    struct etcd_backend *s = state;
    char *vkey = value_key(s, name, key);
    json_t *req = vkey ? dlock__etcd_range(vkey, false) : NULL;
    if (!req) {
        free(vkey);
        return dlock__etcd_nomem(s);
    }
    char what[1200];
    snprintf(what, sizeof what, "read the %s of '%s' (key %s)", key ? "guarded key" : "value", name,
             vkey);
    size_t max = key ? DLOCK_GUARDED_MAX : DLOCK_VALUE_MAX;
    json_t *reply = NULL;
    int rc = dlock__etcd_call(s->k, "/v3/kv/range", req, &reply, what, NULL);
    json_decref(req);
    json_t *kv = rc ? NULL : json_array_get(json_object_get(reply, "kvs"), 0);
    if (kv) {
        const char *vb = json_string_value(json_object_get(kv, "value"));
        size_t len = 0;
        char *text = vb ? dlock__etcd_unb64(vb, &len) : NULL;
        if (!text || !dlock__value_decode_max(text, len, max, out))
            rc = dlock__err(DLOCK_EPROTO,
                            "%s: key %s holds no dlock %s (a token, a newline and at most %zu "
                            "bytes)",
                            s->label, vkey, key ? "guarded key" : "value", max);
        free(text);
    }
    json_decref(reply);
    free(vkey);
    return rc;
}

static int etcd_value_set(void *state, struct dlock__hold *h, const struct dlock__value *v)
{
    return dlock__etcd_stored_set(state, h, NULL, v);
}

static int etcd_value_get(void *state, const char *name, struct dlock__value *out)
{
    return dlock__etcd_stored_get(state, name, NULL, out);
}

const struct dlock__value_ops dlock__etcd_value_ops = {
    .set = etcd_value_set,
    .get = etcd_value_get,
};
