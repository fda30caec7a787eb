/* reply.c -- every reply checked against its request before the backend
 * reads it.
 *
 * The backend decides on what etcd answers: that a txn succeeded and
 * what its ranges found, a key's create revision (the token, the queue's
 * order), a lease's ID and TTL. A broken or hostile server (or a proxy on
 * the way) could answer {"succeeded": true} without the put it claims, a
 * lease with a TTL of -1 or of twenty digits, a kv without a revision --
 * and a reader that takes an absent field for zero and a number past
 * int64 for its largest value would grant on it. So the transport
 * (dlock__etcd_call_lim) checks here, once, every field a decision rests
 * on, and a reply that does not hold up is DLOCK_EPROTO naming the
 * field; past this point the readers (dlock__etcd_int and the rest) read
 * fields known to be well formed.
 *
 * What etcd's JSON gateway sends (grpc-gateway, proto3): int64 fields as
 * strings of digits, fields at their zero value (false, 0, empty lists)
 * left out.
 */
#include "etcd.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* etcd's own bound on a lease TTL (lease.MaxLeaseTTL, seconds) */
#define ETCD_MAX_LEASE_TTL 9000000000LL

bool dlock__etcd_int_of(const json_t *obj, const char *field, int64_t *out)
{
    json_t *v = json_object_get(obj, field);
    *out = 0;
    if (!v)
        return true; /* (the gateway leaves zero out) */
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return true;
    }
    const char *t = json_string_value(v);
    if (!t)
        return false;
    size_t sign = t[0] == '-', digits = strspn(t + sign, "0123456789");
    if (!digits || t[sign + digits] || digits > 19)
        return false;
    errno = 0;
    long long n = strtoll(t, NULL, 10);
    if (errno == ERANGE)
        return false;
    *out = n;
    return true;
}

/* What was wrong, in the message: "the reply to acquire 'x' (txn):
 * responses[1] has no response_range" (bad() in this file). */
#define bad dlock__etcd_bad_reply
int dlock__etcd_bad_reply(const char *label, const char *what, const char *path,
                          const char *fmt, ...)
{
    char why[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return dlock__err(DLOCK_EPROTO, "%s: %s: %s replied with %s (not a reply etcd gives)",
                      label, what, path, why);
}

/* Field FIELD of OBJ: an int64 in [MIN, MAX] into *OUT (absent = 0). */
static bool int_in(const json_t *obj, const char *field, int64_t min, int64_t max,
                   int64_t *out)
{
    return dlock__etcd_int_of(obj, field, out) && *out >= min && *out <= max;
}

/* The header's revision: present, positive. */
static int check_header(const char *label, const char *what, const char *path,
                        const json_t *reply)
{
    int64_t rev;
    if (!json_is_object(json_object_get(reply, "header")) ||
        !int_in(json_object_get(reply, "header"), "revision", 1, INT64_MAX, &rev))
        return bad(label, what, path, "no valid header.revision");
    return DLOCK_OK;
}

/* A range response: its kvs each with a key and revisions (a create
 * revision is a token and the queue's order), its count not below them,
 * "more" a boolean. FIELD names it in the message. */
static int check_range(const char *label, const char *what, const char *path,
                       const json_t *range, const char *field)
{
    json_t *kvs = json_object_get(range, "kvs"), *more = json_object_get(range, "more");
    if (!json_is_object(range))
        return bad(label, what, path, "%s not an object", field);
    if (kvs && !json_is_array(kvs))
        return bad(label, what, path, "%s.kvs not a list", field);
    if (more && !json_is_boolean(more))
        return bad(label, what, path, "%s.more not a boolean", field);
    size_t i;
    json_t *kv;
    json_array_foreach(kvs, i, kv)
    {
        int64_t create, mod, version, lease;
        const char *key = json_string_value(json_object_get(kv, "key"));
        json_t *value = json_object_get(kv, "value");
        if (!key || !*key)
            return bad(label, what, path, "%s.kvs[%zu] without a key", field, i);
        if (!int_in(kv, "create_revision", 1, INT64_MAX, &create) ||
            !int_in(kv, "mod_revision", create, INT64_MAX, &mod))
            return bad(label, what, path, "%s.kvs[%zu] without valid revisions", field, i);
        if (!int_in(kv, "version", 0, INT64_MAX, &version) ||
            !int_in(kv, "lease", 0, INT64_MAX, &lease) || (value && !json_is_string(value)))
            return bad(label, what, path, "%s.kvs[%zu] with a bad version, lease or value",
                       field, i);
    }
    int64_t count;
    if (!int_in(range, "count", (int64_t)json_array_size(kvs), INT64_MAX, &count))
        return bad(label, what, path, "%s.count missing or below its kvs", field);
    return DLOCK_OK;
}

/* A txn's reply: "succeeded" a boolean, and one response per operation
 * of the branch it names, each of its operation's kind. */
static int check_txn(const char *label, const char *what, const char *path, const json_t *req,
                     const json_t *reply)
{
    static const char *const kinds[][2] = {{"request_put", "response_put"},
                                           {"request_range", "response_range"},
                                           {"request_delete_range", "response_delete_range"},
                                           {"request_txn", "response_txn"}};
    json_t *succeeded = json_object_get(reply, "succeeded");
    if (succeeded && !json_is_boolean(succeeded))
        return bad(label, what, path, "succeeded not a boolean");
    const char *branch = json_is_true(succeeded) ? "success" : "failure";
    json_t *ops = json_object_get(req, branch), *resps = json_object_get(reply, "responses");
    if (resps && !json_is_array(resps))
        return bad(label, what, path, "responses not a list");
    if (json_array_size(resps) != json_array_size(ops))
        return bad(label, what, path, "%s and %zu responses where its %s branch has %zu "
                                      "operations",
                   json_is_true(succeeded) ? "succeeded:true" : "a failure",
                   json_array_size(resps), branch, json_array_size(ops));
    for (size_t i = 0; i < json_array_size(ops); i++) {
        json_t *op = json_array_get(ops, i), *resp = json_array_get(resps, i);
        for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
            if (!json_object_get(op, kinds[k][0]))
                continue;
            json_t *r = json_object_get(resp, kinds[k][1]);
            if (!json_is_object(r))
                return bad(label, what, path, "responses[%zu] without its %s", i, kinds[k][1]);
            char field[64];
            snprintf(field, sizeof field, "responses[%zu].response_range", i);
            if (k == 1 && check_range(label, what, path, r, field))
                return DLOCK_EPROTO;
        }
    }
    return DLOCK_OK;
}

/* A lease's reply (grant, keepalive's "result", timetolive): the ID asked
 * about, a TTL etcd could give -- for a grant, at least the TTL asked
 * (etcd raises, never lowers it); -1 only from timetolive (expired). */
static int check_lease(const char *label, const char *what, const char *path,
                       const json_t *req, const json_t *lease, bool grant)
{
    int64_t asked_id, asked_ttl, id, ttl;
    if (!json_is_object(lease))
        return bad(label, what, path, "no lease result");
    dlock__etcd_int_of(req, "ID", &asked_id);
    dlock__etcd_int_of(req, "TTL", &asked_ttl);
    /* (a keepalive's TTL <= 0: the lease is gone, lease.c's to say) */
    int64_t min_ttl = grant                         ? (asked_ttl > 1 ? asked_ttl : 1)
                      : strstr(path, "timetolive") ? -1
                                                   : INT64_MIN;
    if (!int_in(lease, "TTL", min_ttl, ETCD_MAX_LEASE_TTL, &ttl))
        return bad(label, what, path, "a TTL that is no number or is out of range "
                                      "(below %lld or past %lld s)",
                   (long long)min_ttl, ETCD_MAX_LEASE_TTL);
    if (!dlock__etcd_int_of(lease, "ID", &id) || (id != asked_id && (grant || id != 0)))
        return bad(label, what, path, "the ID of another lease than the one asked about");
    return DLOCK_OK;
}

int dlock__etcd_check_reply(const char *label, const char *what, const char *path,
                            const json_t *req, const json_t *reply)
{
    bool kv = strncmp(path, "/v3/kv/", 7) == 0;
    if ((kv || strncmp(path, "/v3/lease/", 10) == 0) && strcmp(path, "/v3/lease/keepalive") != 0 &&
        check_header(label, what, path, reply))
        return DLOCK_EPROTO;
    if (strcmp(path, "/v3/kv/txn") == 0)
        return check_txn(label, what, path, req, reply);
    if (strcmp(path, "/v3/kv/range") == 0)
        return check_range(label, what, path, reply, "the range");
    if (strcmp(path, "/v3/lease/grant") == 0 || strcmp(path, "/v3/lease/timetolive") == 0)
        return check_lease(label, what, path, req, reply, path[10] == 'g');
    if (strcmp(path, "/v3/lease/keepalive") == 0) {
        json_t *result = json_object_get(reply, "result");
        if (check_header(label, what, path, result))
            return DLOCK_EPROTO;
        return check_lease(label, what, path, req, result, false);
    }
    return DLOCK_OK;
}
