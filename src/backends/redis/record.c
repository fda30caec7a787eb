/* record.c -- the Redis backend's client record: where a holder runs.
 *
 * Why it exists. A Redisson hold is a hash field "<client-uuid>:<thread>":
 * it says which client holds a lock, not on which host or in which
 * process, while the file, etcd and ZooKeeper backends store "pid@host"
 * with every hold and `dlock status` shows it. So a dlock client that
 * holds something keeps one small key of its own beside Redisson's,
 * dlock_client:<uuid> = "dlock <pid>@<host>" (the data etcd and ZooKeeper
 * holds carry), PX the lease of its holds: written by its first acquire,
 * refreshed by the keeper's renewals while it holds, gone one lease after
 * the client stops renewing. Inspect appends it to a holder's field,
 * "<uuid>:<thread> (dlock <pid>@<host>)", the form etcd and ZooKeeper
 * holders have. Redisson's own keys are not touched, and a Redisson
 * client (it writes no record) is shown as before
 * (docs/protocol-redis.md, "Client records").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis.h"

/* Record lookups one inspect makes at most: a shared lock of thousands
 * of readers shows the first holders' hosts, not thousands of GETs. */
#define RECORD_LOOKUPS_MAX 64

static void record_key(const char *uuid, char key[64])
{
    snprintf(key, 64, "dlock_client:%.36s", uuid);
}

void dlock__redis_record_touch(struct redis_state *s, int64_t lease_ms, int64_t deadline)
{
    int64_t now = dlock__now_ms();
    int64_t until = __atomic_load_n(&s->record_until_ms, __ATOMIC_RELAXED);
    if (lease_ms <= 0 || until - now > lease_ms / 2)
        return;
    char key[64], who[128], px[24];
    record_key(s->uuid, key);
    memcpy(who, "dlock ", 6);
    dlock__identity(who + 6, sizeof who - 6);
    snprintf(px, sizeof px, "%lld", (long long)lease_ms);
    const char *argv[] = {"SET", key, who, "PX", px};
    char kept[DLOCK__MSG_MAX]; /* the caller's outcome stands: a record is extra */
    dlock__errmsg_save(kept);
    redisReply *r;
    if (dlock__redis_keyed_command(s, deadline, key, 5, argv, "client record", &r) == DLOCK_OK) {
        __atomic_store_n(&s->record_until_ms, now + lease_ms, __ATOMIC_RELAXED);
        freeReplyObject(r);
    }
    dlock__errmsg_restore(DLOCK_OK, kept);
}

/* Whether V (LEN bytes) is a record dlock writes: "dlock " and printable
 * text with no parenthesis, so that a holder reads "<field> (<V>)". */
static bool record_like(const char *v, size_t len)
{
    if (len <= 6 || len > 120 || memcmp(v, "dlock ", 6) != 0)
        return false;
    for (size_t i = 0; i < len; i++)
        if (v[i] < 0x20 || v[i] > 0x7e || v[i] == '(' || v[i] == ')')
            return false;
    return true;
}

int dlock__redis_record_names(struct redis_state *s, struct dlock_info *info)
{
    int64_t deadline = dlock__now_ms() + s->op_timeout_ms; /* every lookup together */
    size_t n = info->nholders < RECORD_LOOKUPS_MAX ? info->nholders : RECORD_LOOKUPS_MAX;
    for (size_t i = 0; i < n; i++) {
        char *id = info->holders[i].id;
        if (strlen(id) < 38 || id[36] != ':') /* "<uuid>:<thread>[...]" only */
            continue;
        char key[64];
        record_key(id, key);
        const char *argv[] = {"GET", key};
        redisReply *r;
        if (dlock__redis_keyed_command(s, deadline, key, 2, argv, "client record", &r))
            break; /* no answer (or no permission): the fields as they are */
        bool found = r->type == REDIS_REPLY_STRING && record_like(r->str, r->len);
        char *named = found ? dlock__sprintf("%s (%s)", id, r->str) : NULL;
        freeReplyObject(r);
        if (found && !named)
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        if (named) {
            free(id);
            info->holders[i].id = named;
        }
    }
    return DLOCK_OK;
}
