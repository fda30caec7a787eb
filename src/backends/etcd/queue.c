/* queue.c -- which keys make up the queue of a lock, and finding in it;
 * and the small JSON request builders every file of the backend shares.
 *
 * The contenders of lock NAME are the keys "<prefix>NAME/<lease id in
 * hex>" attached to a lease: the shape Go's concurrency.Mutex and
 * `etcdctl lock` create, and ours; and our shared holds' keys
 * "<prefix>NAME/<lease hex>-<owner hex>" (rwmutex.c), told apart by their
 * value, which only a reader's look reads. Everything else under "<prefix>NAME/"
 * is not a contender and is ignored by acquire, status, list and
 * force-release: the keys of a lock one level down ("NAME/sub/<hex>",
 * lock "NAME/sub"), an application's own keys ("app1/db", or a
 * hex-looking "app1/beef" without a lease). Otherwise lock 'job' would
 * wait for the holder of 'job/sub', and `release --force app1` would
 * delete a user's data.
 *
 * etcd cannot filter by shape, so a look at the queue asks for a page of
 * keys in create order (keys only) and picks the first contender in it;
 * when the page holds none and etcd has more, the next page follows (from
 * the last create revision seen), until a contender or the end.
 */
#include "etcd.h"

#include <stdlib.h>
#include <string.h>

#define QUEUE_PAGE 16

/* ------------------------------------------------------------- requests */

int dlock__etcd_nomem(struct etcd_backend *s)
{
    return dlock__err(DLOCK_ENOMEM, "%s: out of memory", s->label);
}

char *dlock__etcd_i64s(int64_t v)
{
    return dlock__sprintf("%lld", (long long)v);
}

/* {"key": b64(key)} plus, when PREFIX_END, the range end of KEY as a
 * prefix. */
json_t *dlock__etcd_range(const char *key, bool prefix_end)
{
    /* An empty prefix means every key: etcd wants the key "\0" then. */
    char *kb = *key || !prefix_end ? dlock__etcd_b64(key, strlen(key)) : dlock__etcd_b64("", 1);
    json_t *r = kb ? json_pack("{s:s}", "key", kb) : NULL;
    free(kb);
    if (r && prefix_end) {
        char *eb = dlock__etcd_prefix_end_b64(key);
        if (!eb) {
            json_decref(r);
            return NULL;
        }
        json_object_set_new(r, "range_end", json_string(eb));
        free(eb);
    }
    return r;
}

/* The first kv of response K of a txn reply (NULL if none). */
json_t *dlock__etcd_txn_kv(json_t *reply, size_t k)
{
    json_t *resp = json_array_get(json_object_get(reply, "responses"), k);
    json_t *range = json_object_get(resp, "response_range");
    return json_array_get(json_object_get(range, "kvs"), 0);
}

int64_t dlock__etcd_header_rev(json_t *reply)
{
    return dlock__etcd_int(json_object_get(reply, "header"), "revision");
}

/* Decoded key of a kv (caller frees). */
char *dlock__etcd_kv_key(json_t *kv)
{
    const char *kb = json_string_value(json_object_get(kv, "key"));
    return kb ? dlock__etcd_unb64(kb, NULL) : NULL;
}

bool dlock__etcd_transient(int rc)
{
    return rc == DLOCK_ECONN || rc == DLOCK_EUNAVAIL || rc == DLOCK_EIO;
}

/* ----------------------------------------------------------------- queue */

/* TEXT is 1 to 16 lowercase hex digits (N bytes of it). */
static bool is_hex_id(const char *text, size_t n)
{
    return n >= 1 && n <= 16 && strspn(text, "0123456789abcdef") >= n;
}

bool dlock__etcd_is_contender(const char *pfx, const json_t *kv)
{
    if (dlock__etcd_int(kv, "lease") == 0)
        return false;
    char *key = dlock__etcd_kv_key((json_t *)kv);
    size_t plen = strlen(pfx);
    bool ok = false;
    if (key && strncmp(key, pfx, plen) == 0) {
        /* <lease hex>, or <lease hex>-<owner hex> (a shared hold) */
        const char *hex = key + plen, *dash = strchr(hex, '-');
        size_t n = dash ? (size_t)(dash - hex) : strlen(hex);
        ok = is_hex_id(hex, n) && (!dash || is_hex_id(dash + 1, strlen(dash + 1)));
    }
    free(key);
    return ok;
}

bool dlock__etcd_is_shared(const json_t *kv)
{
    const char *vb = json_string_value(json_object_get(kv, "value"));
    size_t len = 0;
    char *value = vb ? dlock__etcd_unb64(vb, &len) : NULL;
    bool shared = value && strncmp(value, ETCD_SHARED_MARK, strlen(ETCD_SHARED_MARK)) == 0;
    free(value);
    return shared;
}

json_t *dlock__etcd_queue_range(const char *pfx, bool ascending, int64_t bound_rev)
{
    return dlock__etcd_queue_range_for(pfx, ascending, bound_rev, false);
}

json_t *dlock__etcd_queue_range_for(const char *pfx, bool ascending, int64_t bound_rev,
                                    bool writers)
{
    json_t *r = dlock__etcd_range(pfx, true);
    if (!r)
        return NULL;
    json_object_set_new(r, "sort_order", json_string(ascending ? "ASCEND" : "DESCEND"));
    json_object_set_new(r, "sort_target", json_string("CREATE"));
    /* (a reader skips the readers beside it: larger pages, with values) */
    json_object_set_new(r, "limit", json_integer(writers ? QUEUE_PAGE * 4 : QUEUE_PAGE));
    if (!writers)
        json_object_set_new(r, "keys_only", json_true());
    if (bound_rev > 0) {
        char *b = dlock__etcd_i64s(ascending ? bound_rev + 1 : bound_rev - 1);
        if (!b) {
            json_decref(r);
            return NULL;
        }
        json_object_set_new(r, ascending ? "min_create_revision" : "max_create_revision",
                            json_string(b));
        free(b);
    }
    return r;
}

json_t *dlock__etcd_txn_range(json_t *reply, size_t k)
{
    json_t *resp = json_array_get(json_object_get(reply, "responses"), k);
    return json_object_get(resp, "response_range");
}

/* The first contender of the range response RESP, in its order (a
 * borrowed reference, NULL when none), the first not shared with WRITERS;
 * *LAST_REV gets the create revision of its last kv, *MORE whether etcd
 * has more. */
static json_t *pick(const char *pfx, json_t *resp, bool writers, int64_t *last_rev, bool *more)
{
    json_t *kvs = json_object_get(resp, "kvs");
    size_t i;
    json_t *kv;
    *more = json_is_true(json_object_get(resp, "more"));
    *last_rev = 0;
    json_array_foreach(kvs, i, kv)
    {
        *last_rev = dlock__etcd_int(kv, "create_revision");
        if (dlock__etcd_is_contender(pfx, kv) && !(writers && dlock__etcd_is_shared(kv)))
            return kv;
    }
    return NULL;
}

int dlock__etcd_queue_find(struct etcd_backend *s, struct etcd_queue_search *q)
{
    json_t *resp = q->resp; /* the page and its bound move on as it pages */
    int64_t bound_rev = q->bound_rev;
    q->out.kv = NULL;
    q->out.paged = false;
    json_t *reply = NULL;
    int rc = DLOCK_OK;
    for (;;) {
        int64_t last = 0;
        bool more = false;
        json_t *kv = resp ? pick(q->pfx, resp, q->writers, &last, &more) : NULL;
        if (kv) {
            q->out.kv = json_incref(kv);
            break;
        }
        if (resp && !more)
            break;
        if (resp)
            bound_rev = last;
        json_t *req = dlock__etcd_queue_range_for(q->pfx, q->ascending, bound_rev, q->writers);
        q->out.paged = true;
        json_decref(reply);
        reply = NULL;
        rc = req ? dlock__etcd_call_lim(s->k, "/v3/kv/range", req, &reply, q->what, NULL, NULL,
                                        q->lim)
                 : dlock__etcd_nomem(s);
        json_decref(req);
        if (rc)
            break;
        resp = reply;
    }
    json_decref(reply);
    return rc;
}

char *dlock__etcd_contender_name(struct etcd_backend *s, const json_t *kv)
{
    char *key = dlock__etcd_kv_key((json_t *)kv);
    size_t plen = strlen(s->prefix);
    char *name = NULL;
    if (key && strncmp(key, s->prefix, plen) == 0) {
        const char *rest = key + plen, *slash = strrchr(rest, '/');
        char *pfx = slash && slash != rest ? strndup(key, (size_t)(slash + 1 - key)) : NULL;
        if (pfx && dlock__etcd_is_contender(pfx, kv))
            name = strndup(rest, (size_t)(slash - rest));
        free(pfx);
    }
    free(key);
    return name;
}
