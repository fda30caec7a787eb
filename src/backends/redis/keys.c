/* keys.c -- the Redis keys of a name: the lock key (the key prefix +
 * the name) and the keys made from it (token counter, channel, records,
 * queue...), each carrying the name as a hash tag so that every key of
 * one lock falls in one cluster slot; on a cluster, the encoded key of a
 * name whose braces would split them; and the names that would alias
 * another name's keys, refused.
 *
 * Pure naming: no I/O, nothing of the backend's other files, so every
 * layer above may use it -- the routing finds a name's slot by it
 * (cluster.c), the recipes make their keys (redis.h draws the layers).
 * docs/protocol-redis.md lists the keys.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis.h"

/* ====================================================== names on a cluster */

/* The marker of a name a cluster keeps encoded (docs/protocol-redis.md,
 * "Cluster"). */
#define ENCODED_NAME "dlock_name:"

/* Whether every key made from base key KEY (LEN bytes) falls in KEY's own
 * slot: a tag that is not empty at its first '{' (every key made from it
 * carries that tag), or no brace at all (the keys made from it carry
 * "{KEY}", whose tag is KEY). */
static bool slot_safe(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);
    if (!open)
        return !memchr(key, '}', len);
    const char *close = memchr(open + 1, '}', len - (size_t)(open + 1 - key));
    return close && close > open + 1;
}

/* Every printable ASCII byte but '{', '}' and '%': what an encoded name
 * keeps as it is (dlock__name_encode). */
static const char encode_keep[] = " !\"#$&'()*+,./:;<=>?@[\\]^`|~";

char *dlock__redis_name_key(const struct redis_state *s, const char *name, size_t *len)
{
    const char *prefix = s->prefix ? s->prefix : "";
    char *key = dlock__sprintf("%s%s", prefix, name);
    if (!key || !s->cluster || slot_safe(key, strlen(key))) {
        if (key)
            *len = strlen(key);
        return key;
    }
    free(key);
    char *p = dlock__name_encode(prefix, encode_keep, 0);
    char *n = dlock__name_encode(name, encode_keep, 0);
    key = p && n ? dlock__sprintf("%s" ENCODED_NAME "{%s}", p, n) : NULL;
    free(p);
    free(n);
    if (key)
        *len = strlen(key);
    return key;
}

char *dlock__redis_key_name(const struct redis_state *s, const char *key, size_t len)
{
    size_t pl = s->prefix ? strlen(s->prefix) : 0, ml = strlen(ENCODED_NAME "{");
    if (len < pl)
        return NULL;
    key += pl;
    len -= pl;
    if (!s->cluster || len < ml + 2 || memcmp(key, ENCODED_NAME "{", ml) != 0 ||
        key[len - 1] != '}')
        return dlock__sprintf("%.*s", (int)len, key);
    char *enc = dlock__sprintf("%.*s", (int)(len - ml - 1), key + ml);
    char *name = enc ? dlock__name_decode(enc) : NULL;
    free(enc);
    return name;
}

bool dlock__redis_key_encoded(const struct redis_state *s, const char *key, size_t len)
{
    size_t pl = s->prefix ? strlen(s->prefix) : 0, ml = strlen(ENCODED_NAME "{");
    return s->cluster && len >= pl + ml && memcmp(key + pl, ENCODED_NAME "{", ml) == 0;
}

/* =================================================================== keys */

int dlock__redis_key_block(const struct redis_state *s, const char *name, char **base,
                           size_t *base_len, const struct key_part *parts, size_t n)
{
    size_t kl;
    char *full = dlock__redis_name_key(s, name, &kl);
    if (!full)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    size_t size = kl + 1;
    for (size_t i = 0; i < n; i++) /* before + "{" base "}" + after + NUL */
        size += strlen(parts[i].before) + kl + 2 + strlen(parts[i].after) + 1;
    char *block = malloc(size);
    if (!block) {
        free(full);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    memcpy(block, full, kl + 1);
    free(full);
    *base = block;
    *base_len = kl;
    bool tagged = memchr(block, '{', kl) != NULL;
    char *p = block + kl + 1;
    for (size_t i = 0; i < n; i++) {
        size_t bl = strlen(parts[i].before), al = strlen(parts[i].after);
        char *key = p;
        memcpy(p, parts[i].before, bl);
        p += bl;
        if (!tagged)
            *p++ = '{';
        memcpy(p, block, kl);
        p += kl;
        if (!tagged)
            *p++ = '}';
        memcpy(p, parts[i].after, al + 1);
        p += al;
        *parts[i].key = key;
        *parts[i].len = (size_t)(p - key);
        p++;
    }
    return DLOCK_OK;
}

/* KEY (LEN bytes) ends with SUFFIX and has a '{' before it: then it is
 * key base + SUFFIX of the name whose base it starts with. */
static bool tagged_with_suffix(const char *key, size_t len, const char *suffix)
{
    size_t sl = strlen(suffix);
    return len > sl && memcmp(key + len - sl, suffix, sl) == 0 && memchr(key, '{', len - sl);
}

const char *dlock__redis_derived_key(const char *key, size_t len)
{
    static const struct {
        const char *prefix, *what;
    } families[] = {
        {"redisson_lock_token:", "a lock's token counter (redisson_lock_token:{N})"},
        {"redisson_lock__channel:", "a lock's channel (redisson_lock__channel:{N})"},
        {"dlock_canceled:", "a lock's record of canceled acquires (dlock_canceled:{N})"},
        {"redisson_rwlock:", "a read-write lock's channel (redisson_rwlock:{N})"},
        {"dlock_writers:", "a read-write lock's waiting writers (dlock_writers:{N})"},
        {"dlock_fair_queue:", "a fair lock's queue (dlock_fair_queue:{N})"},
        {"dlock_fair_waiters:", "a fair lock's waiters (dlock_fair_waiters:{N})"},
        {"dlock_delay:", "a lock's lock-delay marker (dlock_delay:{N})"},
        {"dlock_guarded:", "a guarded key of a lock's store (dlock_guarded:{N}:<key>)"},
        {"dlock_fair__channel:", "a fair client's channel (dlock_fair__channel:<uuid>)"},
        {"dlock_client:", "a client's record of its host and pid (dlock_client:<uuid>)"},
        {"dlock_leader:", "an election's value (dlock_leader:{N})"},
        {"dlock_leader__channel:", "an election's channel (dlock_leader__channel:{N})"},
        {"dlock_sem_token:", "a semaphore's token counter (dlock_sem_token:{N})"},
        {"dlock_sem_released:", "a semaphore's record of releases (dlock_sem_released:{N})"},
        {"redisson_sc:", "a semaphore's channel (redisson_sc:{N})"},
    };
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) {
        size_t pl = strlen(families[i].prefix);
        if (len >= pl && memcmp(key, families[i].prefix, pl) == 0)
            return families[i].what;
    }
    if (tagged_with_suffix(key, len, ":timeout"))
        return "a semaphore's permit expiries ({N}:timeout)";
    if (tagged_with_suffix(key, len, ":rwlock_timeout:1"))
        return "a reader's lease ({N}:<owner>:rwlock_timeout:1)";
    /* "{N}" is the base of N's keys (redisson_lock_token:{N}, {N}:timeout...)
     * and, holding a '{', its own base too: the two would share them all */
    if (len > 2 && key[0] == '{' && key[len - 1] == '}' && !memchr(key + 1, '{', len - 2))
        return "the base of the keys of the name inside its braces ({N}: both names' "
               "token counters, channels, records and permit expiries would be one)";
    return NULL;
}

int dlock__redis_name_check(const struct redis_state *s, const char *kind, const char *name)
{
    char *key = dlock__sprintf("%s%s", s->prefix ? s->prefix : "", name);
    if (!key)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    const char *what = dlock__redis_derived_key(key, strlen(key));
    if (!what && strncmp(name, ENCODED_NAME, strlen(ENCODED_NAME)) == 0)
        what = "a cluster's key for a name its slots cannot hold as it is (" ENCODED_NAME
               "{<name, braces and '%' as %XX>})";
    int rc = DLOCK_OK;
    if (what)
        rc = dlock__err(DLOCK_EINVAL,
                        "%s: %s name '%s' (key '%s') would be %s, a key dlock makes for another "
                        "name; refused",
                        s->where, kind, name, key, what);
    free(key);
    return rc;
}

void dlock__redis_keys_free(struct lock_keys *k)
{
    free(k->lock); /* one block holds them all */
    memset(k, 0, sizeof *k);
}

/* The lock's keys (struct lock_keys) in one block: this runs for every
 * acquire and release. */
int dlock__redis_keys_make(struct redis_state *s, const char *name, struct lock_keys *k)
{
    memset(k, 0, sizeof *k);
    const struct key_part parts[] = {
        {"redisson_lock_token:", "", &k->token, &k->token_len},
        {"redisson_lock__channel:", "", &k->chan, &k->chan_len},
        {"dlock_canceled:", "", &k->canceled, &k->canceled_len},
        {"redisson_rwlock:", "", &k->rwchan, &k->rwchan_len},
        {"dlock_writers:", "", &k->writers, &k->writers_len},
        {"dlock_fair_queue:", "", &k->queue, &k->queue_len},
        {"dlock_fair_waiters:", "", &k->waiters, &k->waiters_len},
        {"", "", &k->tbase, &k->tbase_len},             /* Redisson's suffixName() base */
        {"dlock_delay:", "", &k->delay, &k->delay_len}, /* the lock-delay marker */
    };
    int rc = dlock__redis_key_block(s, name, &k->lock, &k->lock_len, parts,
                                    sizeof parts / sizeof parts[0]);
    if (rc)
        return rc;
    if ((rc = dlock__redis_name_check(s, "lock", name)))
        dlock__redis_keys_free(k);
    return rc;
}
