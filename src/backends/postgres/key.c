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

uint64_t dlock__pg_tagged_hash(const char *full, const char *tag)
{
    uint64_t h = fnv1a64(full) * 0x100000001b3ull; /* then the NUL: h ^= 0 */
    for (const unsigned char *p = (const unsigned char *)tag; *p; p++) {
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

/* -------------------------------------- layout=distributedlock (.NET) */

/* SHA-1 of LEN bytes at DATA into OUT (FIPS 180-4): DistributedLock's
 * hash of a long name. */
static uint32_t rol(uint32_t x, int n)
{
    return (x << n) | (x >> (32 - n));
}

static void sha1_block(uint32_t h[5], const unsigned char *p)
{
    uint32_t w[80];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 80; i++)
        w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (int i = 0; i < 80; i++) {
        uint32_t f, k;
        if (i < 20)
            f = (b & c) | (~b & d), k = 0x5a827999;
        else if (i < 40)
            f = b ^ c ^ d, k = 0x6ed9eba1;
        else if (i < 60)
            f = (b & c) | (b & d) | (c & d), k = 0x8f1bbcdc;
        else
            f = b ^ c ^ d, k = 0xca62c1d6;
        uint32_t t = rol(a, 5) + f + e + k + w[i];
        e = d, d = c, c = rol(b, 30), b = a, a = t;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e;
}

static void sha1(const unsigned char *data, size_t len, unsigned char out[20])
{
    uint32_t h[5] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476, 0xc3d2e1f0};
    size_t done = 0;
    for (; len - done >= 64; done += 64)
        sha1_block(h, data + done);
    unsigned char tail[128] = {0};
    size_t rest = len - done, n = rest < 56 ? 64 : 128;
    memcpy(tail, data + done, rest);
    tail[rest] = 0x80;
    uint64_t bits = (uint64_t)len * 8;
    for (int i = 0; i < 8; i++)
        tail[n - 1 - i] = (unsigned char)(bits >> (8 * i));
    for (size_t off = 0; off < n; off += 64)
        sha1_block(h, tail + off);
    for (int i = 0; i < 20; i++)
        out[i] = (unsigned char)(h[i / 4] >> (24 - 8 * (i % 4)));
}

/* S's first 8 characters as a hexadecimal int32 (its 32 bits). */
static bool hex8(const char *s, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < 8; i++) {
        int d = dlock__hexval((unsigned char)s[i]);
        if (d < 0)
            return false;
        v = v << 4 | (uint32_t)d;
    }
    *out = v;
    return true;
}

static void set_single(struct pg_key *k, uint64_t u)
{
    k->classid = (int64_t)(u >> 32);
    k->objid = (int64_t)(u & 0xffffffffu);
    k->objsubid = 1;
    snprintf(k->args, sizeof k->args, "(%lld)::int8", (long long)u);
}

/* The key DistributedLock's PostgresAdvisoryLockKey(name, allowHashing:
 * true) gives FULL: up to 9 ASCII characters packed 7 bits each (then a
 * 0 bit, then 1s); 16 hex digits as one bigint; "8 hex,8 hex" as the
 * two-int4 form; anything else the first 8 bytes of its SHA-1, little
 * endian (docs/protocol-postgres.md). */
static void distributedlock_key(const char *full, struct pg_key *k)
{
    size_t len = strlen(full);
    bool ascii = len <= 9;
    for (size_t i = 0; ascii && i < len; i++)
        ascii = (unsigned char)full[i] <= 127;
    if (ascii) {
        uint64_t v = 0;
        for (size_t i = 0; i < len; i++)
            v = v << 7 | (unsigned char)full[i];
        v <<= 1;
        for (size_t i = len; i < 9; i++)
            v = v << 7 | 127;
        set_single(k, v);
        return;
    }
    uint32_t a, b;
    if (len == 16 && hex8(full, &a) && hex8(full + 8, &b)) {
        set_single(k, (uint64_t)a << 32 | b);
        return;
    }
    if (len == 17 && full[8] == ',' && hex8(full, &a) && hex8(full + 9, &b)) {
        k->classid = a;
        k->objid = b;
        k->objsubid = 2;
        snprintf(k->args, sizeof k->args, "%d, %d", (int)(int32_t)a, (int)(int32_t)b);
        return;
    }
    unsigned char digest[20];
    sha1((const unsigned char *)full, len, digest);
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | digest[i];
    set_single(k, v);
}

void dlock__pg_key_of(const struct pg_backend *b, const char *full, struct pg_key *k)
{
    if (b->distributedlock_keys) {
        memset(k, 0, sizeof *k);
        distributedlock_key(full, k);
    } else {
        dlock__pg_key(full, k);
    }
}
