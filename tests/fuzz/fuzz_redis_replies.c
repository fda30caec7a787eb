/* fuzz_redis_replies.c -- libFuzzer target for the Redis backend's
 * reading of its scripts' replies: any bytes a server, a proxy or another
 * version of a script could send are parsed by the connection layer
 * (dlock__redis_conn_feed, net.c: hiredis's reader and dlock's reply cap,
 * the input split in two chunks where its second byte says) and every
 * reply is handed to the function that interprets one script's reply
 * (redis.h, "what each script's reply means"), the one the first byte
 * picks; an error reply goes where dlock__redis_eval sends it
 * (dlock__redis_server_error). Promised: no crash, no leak, no undefined
 * behaviour (ASan + UBSan), and every outcome a defined dlock code, with
 * the outputs its documentation promises (a token only on DLOCK_OK, a
 * holder snapshot that frees). Corpus: tests/fuzz/corpus/redis_replies/
 * (first byte: script and flags, second: split point, then RESP).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "backends/redis/redis.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum script {
    ACQUIRE, RELEASE, RENEW, INSPECT, STATUS, CANCEL, SEM_ACQUIRE, SEM_RELEASE, SEM_RENEW,
    SEM_INSPECT, LEADER, NSCRIPTS
};

static bool defined_code(int rc)
{
    return rc == DLOCK_OK || strcmp(dlock_err_name(rc), "DLOCK_E?") != 0;
}

/* Interpret R as script WHICH's reply; the code it gave. */
static int interpret(struct redis_state *s, enum script which, bool retried, const redisReply *r)
{
    static char lock[] = "{x}", token_key[] = "redisson_lock_token:{x}", timeout[] = "{x}:timeout";
    const struct lock_keys k = {.lock = lock, .token = token_key, .lock_len = 3,
                                .token_len = sizeof token_key - 1};
    const struct sem_keys sk = {.name = lock, .timeout = timeout, .name_len = 3,
                                .timeout_len = sizeof timeout - 1};
    if (r->type == REDIS_REPLY_ERROR)
        return dlock__redis_server_error(s, r->str, "fuzz");
    int rc = DLOCK_OK;
    uint64_t token = 0;
    int64_t ms = 0;
    long long value = 0;
    switch (which) {
    case ACQUIRE:
        rc = dlock__redis_acquire_result(s, r, &k, &token, &ms);
        if (rc == DLOCK_EBUSY && ms < -1)
            abort(); /* a lease left below "none" */
        break;
    case RELEASE:
        rc = dlock__redis_release_reply(s, r, "x", &k, 7, retried);
        break;
    case RENEW: {
        bool renewed[4];
        rc = dlock__redis_renew_reply(s, r, retried ? 4 : 1, renewed);
        break;
    }
    case INSPECT:
    case SEM_INSPECT: {
        dlock_info *info = NULL;
        if (dlock__info_new(&info))
            return DLOCK_ENOMEM;
        rc = which == INSPECT ? dlock__redis_inspect_reply(s, r, &k, info)
                              : dlock__redis_sem_inspect_reply(s, &sk, r, retried ? 3 : 0, info);
        /* what a caller reads of a snapshot, whatever the outcome */
        for (size_t i = 0; i < dlock_info_holder_count(info); i++)
            if (!dlock_info_holder(info, i, NULL))
                abort();
        dlock_info_free(info);
        break;
    }
    case STATUS:
        rc = dlock__redis_status_reply(s, r, &k, &value);
        break;
    case CANCEL: {
        const char *type_name = NULL;
        rc = dlock__redis_script_reply(s, r, &value, &type_name);
        break;
    }
    case SEM_ACQUIRE: {
        struct sem_acquire_reply q = {.permits = 3, .want = 2, .lease_ms = 30000};
        rc = dlock__redis_sem_acquire_reply(s, &sk, r, &q);
        token = q.out.token;
        ms = q.out.sleep_ms;
        if (rc == DLOCK_EBUSY && (ms < 1 || ms > 30000))
            abort(); /* a sleep outside (0, lease] */
        break;
    }
    case SEM_RELEASE:
        rc = dlock__redis_sem_release_reply(s, &sk, r, &value);
        break;
    case SEM_RENEW:
        rc = dlock__redis_sem_renew_reply(s, r, "owner", "x");
        break;
    case LEADER: {
        struct dlock_leader out;
        memset(&out, 0, sizeof out);
        bool consistent = false;
        rc = dlock__redis_leader_parse(s, r, "fuzz", &out, &consistent, &ms);
        if (out.held && !out.value && rc == DLOCK_OK)
            abort(); /* a leader without its value */
        free(out.value);
        break;
    }
    case NSCRIPTS:
        break;
    }
    if (rc != DLOCK_OK && token != 0)
        abort();
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    static struct redis_state s; /* what the interpreters read: where, layout */
    snprintf(s.where, sizeof s.where, "redis fuzz:6379");
    s.simple = data[0] & 0x40;
    bool retried = data[0] & 0x80;
    enum script which = (enum script)((data[0] & 0x3f) % NSCRIPTS);
    size_t split = size > 2 ? data[1] % (size - 2) : 0;
    data += 2;
    size -= 2;

    struct rconn *k = dlock__redis_conn_new();
    if (!k)
        return 0;
    dlock__redis_conn_feed(k, (const char *)data, split);
    dlock__redis_conn_feed(k, (const char *)data + split, size - split);
    for (redisReply *r; (r = dlock__redis_conn_take(k));) {
        int rc = interpret(&s, which, retried, r);
        freeReplyObject(r);
        if (!defined_code(rc))
            abort();
    }
    dlock__redis_conn_free(k);
    return 0;
}
