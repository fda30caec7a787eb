/* key.c -- a lock name as a PostgreSQL advisory-lock key.
 *
 * Advisory locks are keyed by one bigint or by two int4s. The name the
 * lock has on the server is the client's prefix followed by the lock's
 * name (the full name), and:
 *   - a full name that is a decimal integer in the bigint range ("42",
 *     "-7") is that bigint: pg_advisory_lock(42);
 *   - "A,B" with A and B decimal int4s is the two-key form:
 *     pg_advisory_lock(A, B);
 *   - any other name is the 64-bit FNV-1a hash of its bytes, as a
 *     signed bigint (docs/protocol-postgres.md states the odds of two
 *     names sharing a key).
 * So an application's own advisory locks can be joined by number. In
 * pg_locks a bigint key K shows as classid = K >> 32, objid = K & 0xffffffff,
 * objsubid 1; the two-key form as classid = A, objid = B, objsubid 2.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pg.h"

/* S as a decimal integer in [MIN, MAX] into *OUT: the whole of S. */
static bool decimal(const char *s, size_t len, long long min, long long max, long long *out)
{
    char buf[32];
    if (len == 0 || len >= sizeof buf)
        return false;
    memcpy(buf, s, len);
    buf[len] = '\0';
    const char *p = buf[0] == '-' ? buf + 1 : buf;
    if (!*p)
        return false;
    for (const char *q = p; *q; q++)
        if (*q < '0' || *q > '9')
            return false;
    if (p[0] == '0' && p[1]) /* "007" is a name, not the number 7 */
        return false;
    errno = 0;
    char *end = NULL;
    long long v = strtoll(buf, &end, 10);
    if (errno || *end || v < min || v > max)
        return false;
    *out = v;
    return true;
}

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    return h;
}

void dlock__pg_key(const char *full, struct pg_key *k)
{
    memset(k, 0, sizeof *k);
    size_t len = strlen(full);
    const char *comma = strchr(full, ',');
    long long a = 0, b = 0;
    if (comma && decimal(full, (size_t)(comma - full), INT32_MIN, INT32_MAX, &a) &&
        decimal(comma + 1, len - (size_t)(comma + 1 - full), INT32_MIN, INT32_MAX, &b)) {
        /* pg_locks shows each int4 as an oid: its 32 bits unsigned */
        k->classid = (int64_t)(uint32_t)(int32_t)a;
        k->objid = (int64_t)(uint32_t)(int32_t)b;
        k->objsubid = 2;
        snprintf(k->args, sizeof k->args, "%lld, %lld", a, b);
        return;
    }
    long long v = 0;
    if (!decimal(full, len, INT64_MIN, INT64_MAX, &v))
        v = (long long)fnv1a64(full);
    uint64_t u = (uint64_t)v;
    k->classid = (int64_t)(u >> 32);
    k->objid = (int64_t)(u & 0xffffffffu);
    k->objsubid = 1;
    snprintf(k->args, sizeof k->args, "(%lld)::int8", v);
}

char *dlock__pg_full_name(struct pg_backend *b, const char *name)
{
    return dlock__sprintf("%s%s", b->prefix, name);
}

void dlock__pg_key_where(const struct pg_key *k, char *buf, size_t size)
{
    snprintf(buf, size,
             "l.locktype = 'advisory' AND l.classid::int8 = %" PRId64
             " AND l.objid::int8 = %" PRId64
             " AND l.objsubid = %d AND l.database = (SELECT oid FROM pg_database WHERE datname = "
             "current_database())",
             k->classid, k->objid, k->objsubid);
}

char *dlock__pg_hex(const char *name)
{
    size_t n = strlen(name);
    char *out = malloc(2 * n + 1);
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++)
        snprintf(out + 2 * i, 3, "%02x", (unsigned char)name[i]);
    out[2 * n] = '\0';
    return out;
}
