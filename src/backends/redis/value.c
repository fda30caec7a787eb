/* value.c -- the Redis backend's lock values: what a lock's holder
 * writes beside the lock, for anyone to read (dlock_value_set(),
 * dlock_value_get()).
 *
 * Lock NAME's value is the HASH dlock_value:{NAME} (the lock's hash tag,
 * so a cluster keeps it in the lock's slot): field value, the bytes, and
 * field token, the token of the hold that wrote them. The holder writes
 * it in one script (scripts/value_set.lua) that first finds the hold:
 * in the Redisson layouts our field in the lock's hash and the token
 * counter still at our token (any later acquisition moves it); in the
 * simple layout the lock's value "<owner>:<token>" itself. A hold that
 * is gone -- expired, force-released, taken by another -- writes nothing
 * and is DLOCK_ELOST. A clear deletes the hash. The hash has no expiry:
 * the value outlives holds, which is its point. A read is one HMGET.
 * Every URL form of this backend (TCP, TLS, unix socket, Sentinel,
 * Cluster) goes through the same request; redlock:// has its own backend
 * and no value (no one request checks a majority).
 */
#include "redis.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The value hash of lock keys K (KEY NULL), or the hash of guarded key
 * KEY of the lock's store (guard.c), into a malloc'd string. */
static char *value_key(const struct lock_keys *k, const char *key)
{
    return key ? dlock__sprintf("dlock_guarded:%s:%s", k->tbase, key)
               : dlock__sprintf("dlock_value:%s", k->tbase);
}

int dlock__redis_stored_set(void *state, struct dlock__hold *h, const char *key,
                            const struct dlock__value *v)
{
    struct redis_state *s = state;
    struct lock_keys k;
    int rc = dlock__redis_keys_make(s, h->name, &k);
    if (rc)
        return rc;
    char *vkey = value_key(&k, key);
    if (!vkey) {
        dlock__redis_keys_free(&k);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    char token[24];
    snprintf(token, sizeof token, "%" PRIu64, h->token);
    const char *op = v ? "set" : "clear";
    const char *args[] = {k.lock, vkey, k.token, h->owner, token, op, v ? v->data : ""};
    size_t lens[] = {k.lock_len,    strlen(vkey), k.token_len,   strlen(h->owner),
                     strlen(token), strlen(op),   v ? v->len : 0};
    char what[300];
    if (key)
        snprintf(what, sizeof what, "%s key '%s' of lock '%.100s'", v ? "put" : "delete", key,
                 h->name);
    else
        snprintf(what, sizeof what, "%s the value of lock '%.100s'", op, h->name);
    struct redis_request rq = {.script = S_VALUE_SET,
                               .nkeys = 3,
                               .nargs = 7,
                               .args = args,
                               .lens = lens,
                               .what = what,
                               .deadline = DLOCK__NEVER};
    rc = dlock__redis_eval(s, &rq);
    if (!rc) {
        long long status;
        rc = dlock__redis_status_reply(s, rq.out.reply, &k, &status);
        if (!rc && status != 1)
            rc = dlock__err(DLOCK_ELOST, "%s: lock '%s': %s is no longer ours (token %s); %s%s%s",
                            s->where, h->name, k.lock, token, key ? "key '" : "its value",
                            key ? key : "", key ? "' is not written" : " is not written");
        freeReplyObject(rq.out.reply);
    }
    free(vkey);
    dlock__redis_keys_free(&k);
    return rc;
}

int dlock__redis_stored_get(void *state, const char *name, const char *key,
                            struct dlock__value *out)
{
    struct redis_state *s = state;
    struct lock_keys k;
    int rc = dlock__redis_keys_make(s, name, &k);
    if (rc)
        return rc;
    char *vkey = value_key(&k, key);
    dlock__redis_keys_free(&k);
    if (!vkey)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    const char *argv[] = {"HMGET", vkey, "token", "value"};
    redisReply *r = NULL;
    rc = dlock__redis_keyed_command(s, DLOCK__NEVER, vkey, 4, argv,
                                    key ? "read a guarded key" : "read a lock's value", &r);
    size_t max = key ? DLOCK_GUARDED_MAX : DLOCK_VALUE_MAX;
    if (!rc && (r->type != REDIS_REPLY_ARRAY || r->elements != 2))
        rc = dlock__err(DLOCK_EPROTO, "%s: HMGET %s: unexpected reply", s->where, vkey);
    const redisReply *t = rc ? NULL : r->element[0], *val = rc ? NULL : r->element[1];
    if (!rc && t->type == REDIS_REPLY_NIL) {
        /* no value */
    } else if (!rc && (t->type != REDIS_REPLY_STRING || val->type != REDIS_REPLY_STRING ||
                       !dlock__redis_parse_u64(t->str, t->len, &out->token) || !out->token ||
                       val->len > max)) {
        out->token = 0;
        rc = dlock__err(DLOCK_EPROTO, "%s: %s holds no dlock %s (a token and at most %zu bytes)",
                        s->where, vkey, key ? "guarded key" : "value", max);
    } else if (!rc) {
        if (!(out->data = malloc(val->len + 1)))
            rc = dlock__err(DLOCK_ENOMEM, "out of memory");
        else {
            memcpy(out->data, val->str, val->len);
            out->data[val->len] = 0;
            out->len = val->len;
        }
    }
    if (r)
        freeReplyObject(r);
    free(vkey);
    return rc;
}

static int redis_value_set(void *state, struct dlock__hold *h, const struct dlock__value *v)
{
    return dlock__redis_stored_set(state, h, NULL, v);
}

static int redis_value_get(void *state, const char *name, struct dlock__value *out)
{
    return dlock__redis_stored_get(state, name, NULL, out);
}

const struct dlock__value_ops dlock__redis_value_ops = {
    .set = redis_value_set,
    .get = redis_value_get,
};
