/* delay.c -- the etcd backend's lock-delay (?lock_delay=): a name whose
 * exclusive hold ended without a clean release is not granted again until
 * the delay has passed, timed by an etcd lease.
 *
 * etcd runs no code when a lease expires, and a key cannot be given a
 * lease once its holder is gone, so the hold leaves a marker that only its
 * clean release removes: "<prefix>dlock_delay:NAME" (outside the lock's
 * prefix "<prefix>NAME/", whose every key Go's concurrency.Mutex takes for
 * a contender), value "<token> <delay ms>", no lease. An acquirer that
 * finds it without a lease knows the hold ended some other way (its
 * lease expired, it was force-released): it grants a lease of the delay's
 * TTL and puts the marker on it, in a transaction on the marker's mod
 * revision so that two acquirers start one delay, and etcd deletes the
 * marker when that lease runs out. Every acquirer then waits for the same
 * end: the lease's TTL as etcd tells it (/v3/lease/timetolive), never a
 * client's clock alone. The delay runs from when an acquirer first finds
 * the end -- later than the expiry, never earlier.
 */
#include "etcd.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *dlock__etcd_delay_key(struct etcd_backend *s, const char *name)
{
    return dlock__sprintf("%sdlock_delay:%s", s->prefix, name);
}

json_t *dlock__etcd_delay_probe(struct etcd_backend *s, const char *name)
{
    char *key = dlock__etcd_delay_key(s, name);
    json_t *range = key ? dlock__etcd_range(key, false) : NULL;
    free(key);
    if (range && json_object_set_new(range, "count_only", json_true())) {
        json_decref(range);
        return NULL;
    }
    return range;
}

bool dlock__etcd_delay_absent(json_t *reply, size_t k)
{
    json_t *resp = dlock__etcd_txn_range(reply, k);
    return resp && dlock__etcd_int(resp, "count") == 0;
}

/* What the marker of a hold of TOKEN with DELAY_MS says (caller frees). */
static char *marker_value(uint64_t token, int64_t delay_ms)
{
    return dlock__sprintf("%" PRIu64 " %lld", token, (long long)delay_ms);
}

/* The marker KEY's kv (NULL: none) in *REPLY's keeping. */
static int read_marker(struct etcd_backend *s, const char *key, json_t **reply, json_t **kv,
                       const struct etcd_limits *lim)
{
    json_t *req = dlock__etcd_range(key, false);
    if (!req)
        return dlock__etcd_nomem(s);
    char what[1200];
    snprintf(what, sizeof what, "read the lock-delay marker %s", key);
    int rc = dlock__etcd_call_lim(s->k, "/v3/kv/range", req, reply, what, NULL, NULL, lim);
    json_decref(req);
    *kv = rc ? NULL : json_array_get(json_object_get(*reply, "kvs"), 0);
    return rc;
}

/* The delay a marker KV asks for (0: not a marker of ours). */
static int64_t marker_delay(const json_t *kv)
{
    const char *vb = json_string_value(json_object_get(kv, "value"));
    size_t len = 0;
    char *text = vb ? dlock__etcd_unb64(vb, &len) : NULL;
    long long token = 0, delay = 0;
    if (!text || sscanf(text, "%lld %lld", &token, &delay) != 2 || delay < 0)
        delay = 0;
    free(text);
    return delay > DLOCK__MAX_DURATION_MS ? DLOCK__MAX_DURATION_MS : delay;
}

/* The ms left of lease ID (0: gone), rounded up to the next whole second
 * of its TTL: etcd answers whole seconds, and a look a little late costs
 * less than one a little early. */
static int lease_left(struct etcd_backend *s, int64_t id, int64_t *left,
                      const struct etcd_limits *lim)
{
    char *ids = dlock__etcd_i64s(id);
    json_t *req = ids ? json_pack("{s:s}", "ID", ids) : NULL, *reply = NULL;
    free(ids);
    if (!req)
        return dlock__etcd_nomem(s);
    int code = 0;
    int rc = dlock__etcd_call_lim(s->k, "/v3/lease/timetolive", req, &reply,
                                  "look at a lock-delay's lease", &code, NULL, lim);
    json_decref(req);
    int64_t ttl = rc ? -1 : dlock__etcd_int(reply, "TTL");
    json_decref(reply);
    if (rc == DLOCK_EBACKEND && code == GRPC_NOT_FOUND)
        rc = DLOCK_OK;
    *left = ttl >= 0 ? (ttl + 1) * 1000 : 0;
    return rc;
}

/* A marker KV without a lease, found by an acquirer: its hold ended
 * without its clean release; start its delay now on a lease of its own.
 * *LEFT: the delay's TTL; 0 when another acquirer changed the marker
 * first (look again). */
static int start_delay(struct etcd_backend *s, const char *name, const char *key, json_t *kv,
                       int64_t *left, const struct etcd_limits *lim)
{
    int64_t delay = marker_delay(kv);
    *left = 0;
    struct lease_ref lr = {0};
    int rc = dlock__etcd_lease_grant(s, name, delay > 0 ? delay : 1, &lr, lim);
    if (rc)
        return rc;
    char *kb = dlock__etcd_b64(key, strlen(key)), *ids = dlock__etcd_i64s(lr.id);
    char *mod = dlock__etcd_i64s(dlock__etcd_int(kv, "mod_revision"));
    const char *vb = json_string_value(json_object_get(kv, "value"));
    json_t *req =
        kb && ids && vb && mod
            ? json_pack("{s:[{s:s, s:s, s:s, s:s}], s:[{s:{s:s, s:s, s:s}}]}", "compare", "result",
                        "EQUAL", "target", "MOD", "key", kb, "mod_revision", mod, "success",
                        "request_put", "key", kb, "value", vb, "lease", ids)
            : NULL;
    free(kb);
    free(ids);
    free(mod);
    json_t *reply = NULL;
    char what[1200];
    snprintf(what, sizeof what, "start the lock-delay of '%s' (%s)", name, key);
    rc = dlock__etcd_txn(s, req, &reply, what, NULL, lim);
    bool started = !rc && json_is_true(json_object_get(reply, "succeeded"));
    json_decref(reply);
    if (started)
        *left = lr.ttl_ms;
    else
        dlock__etcd_lease_revoke(s, lr.id, lim); /* carries nothing */
    return rc;
}

int dlock__etcd_delay_look(struct etcd_backend *s, const char *name, enum etcd_delay_look how,
                           int64_t *left, const struct etcd_limits *lim)
{
    bool start = how == ETCD_DELAY_START;
    char *key = dlock__etcd_delay_key(s, name);
    if (!key)
        return dlock__etcd_nomem(s);
    int rc = DLOCK_OK;
    *left = 0;
    for (int tries = 0; !rc && tries < 5; tries++) {
        json_t *reply = NULL, *kv = NULL;
        rc = read_marker(s, key, &reply, &kv, lim);
        int64_t lease = kv ? dlock__etcd_int(kv, "lease") : 0;
        if (!rc && kv && lease)
            rc = lease_left(s, lease, left, lim);
        else if (!rc && kv && how == ETCD_DELAY_SHOW)
            *left = marker_delay(kv); /* the whole delay, not started */
        else if (!rc && kv && start)
            rc = start_delay(s, name, key, kv, left, lim);
        bool again = !rc && kv && !lease && start && *left == 0 && marker_delay(kv) > 0;
        json_decref(reply);
        if (!again)
            break;
    }
    free(key);
    return rc;
}

int dlock__etcd_delay_arm(struct etcd_backend *s, const struct dlock__hold *h,
                          const struct etcd_limits *lim)
{
    char *key = dlock__etcd_delay_key(s, h->name);
    char *value = marker_value(h->token, s->c->opts.lock_delay_ms);
    char *kb = key ? dlock__etcd_b64(key, strlen(key)) : NULL;
    char *vb = value ? dlock__etcd_b64(value, strlen(value)) : NULL;
    json_t *req = kb && vb ? json_pack("{s:s, s:s}", "key", kb, "value", vb) : NULL;
    int rc = DLOCK_OK;
    if (!req) {
        rc = dlock__etcd_nomem(s);
    } else {
        char what[1200];
        snprintf(what, sizeof what, "put the lock-delay marker %s", key);
        json_t *reply = NULL;
        rc = dlock__etcd_call_lim(s->k, "/v3/kv/put", req, &reply, what, NULL, NULL, lim);
        json_decref(reply);
    }
    json_decref(req);
    free(kb);
    free(vb);
    free(value);
    free(key);
    return rc;
}

/* The txn that deletes the marker KEY when its value is still
 * VALUE's (NULL: out of memory). */
static json_t *clear_txn(const char *key, const char *value)
{
    char *kb = key ? dlock__etcd_b64(key, strlen(key)) : NULL;
    char *vb = value ? dlock__etcd_b64(value, strlen(value)) : NULL;
    json_t *req = kb && vb
                      ? json_pack("{s:[{s:s, s:s, s:s, s:s}], s:[{s:o}]}", "compare", "result",
                                  "EQUAL", "target", "VALUE", "key", kb, "value", vb, "success",
                                  "request_delete_range", dlock__etcd_range(key, false))
                      : NULL;
    free(kb);
    free(vb);
    return req;
}

json_t *dlock__etcd_delay_clear_in(struct etcd_backend *s, json_t *txn, const char *name,
                                   uint64_t token, int64_t delay_ms)
{
    if (!txn || !delay_ms)
        return txn;
    char *key = dlock__etcd_delay_key(s, name);
    char *value = marker_value(token, delay_ms);
    json_t *clear = clear_txn(key, value);
    free(value);
    free(key);
    if (dlock__etcd_txn_also(txn, clear ? json_pack("{s:o}", "request_txn", clear) : NULL)) {
        json_decref(txn);
        return NULL;
    }
    return txn;
}
