/* sha1.c -- SHA-1 (FIPS 180-4), for EVALSHA's script digests.
 *
 * Redlock computes its scripts' digests when the client opens, since a
 * node may be down then (SCRIPT LOAD cannot tell it). OpenSSL had them,
 * but loading libssl for a digest made every redlock:// client map it
 * (openssl.h says why that is avoided), and no library libdlock links
 * (hiredis, jansson, the ZooKeeper client, libc) offers SHA-1. Scripts
 * are small and hashed once per client: a plain implementation serves.
 * Not for anything secret: SHA-1 here names a script, as Redis does.
 */
#include <stdio.h>
#include <string.h>

#include "redis.h"

static uint32_t rol(uint32_t x, int n)
{
    return (x << n) | (x >> (32 - n));
}

/* One 64-byte block B into the state H. */
static void sha1_block(uint32_t h[5], const unsigned char *b)
{
    uint32_t w[80];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)b[4 * i] << 24 | (uint32_t)b[4 * i + 1] << 16 |
               (uint32_t)b[4 * i + 2] << 8 | (uint32_t)b[4 * i + 3];
    for (int i = 16; i < 80; i++)
        w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    uint32_t a = h[0], bb = h[1], c = h[2], d = h[3], e = h[4];
    for (int i = 0; i < 80; i++) {
        uint32_t f, k;
        if (i < 20) {
            f = (bb & c) | (~bb & d);
            k = 0x5a827999;
        } else if (i < 40) {
            f = bb ^ c ^ d;
            k = 0x6ed9eba1;
        } else if (i < 60) {
            f = (bb & c) | (bb & d) | (c & d);
            k = 0x8f1bbcdc;
        } else {
            f = bb ^ c ^ d;
            k = 0xca62c1d6;
        }
        uint32_t t = rol(a, 5) + f + e + k + w[i];
        e = d;
        d = c;
        c = rol(bb, 30);
        bb = a;
        a = t;
    }
    h[0] += a;
    h[1] += bb;
    h[2] += c;
    h[3] += d;
    h[4] += e;
}

void dlock__redis_sha1_hex(const void *data, size_t len, char out[41])
{
    uint32_t h[5] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476, 0xc3d2e1f0};
    const unsigned char *p = data;
    size_t left = len;
    for (; left >= 64; left -= 64, p += 64)
        sha1_block(h, p);
    /* the tail, 0x80, zeros, and the length in bits (big-endian) */
    unsigned char last[128] = {0};
    memcpy(last, p, left);
    last[left] = 0x80;
    size_t n = left < 56 ? 64 : 128;
    uint64_t bits = (uint64_t)len * 8;
    for (int i = 0; i < 8; i++)
        last[n - 1 - i] = (unsigned char)(bits >> (8 * i));
    sha1_block(h, last);
    if (n == 128)
        sha1_block(h, last + 64);
    for (int i = 0; i < 5; i++)
        snprintf(out + 8 * i, 9, "%08x", (unsigned)h[i]);
}
