/* redis.c -- the Redis backend: a Redisson-compatible reentrant, fenced lock.
 *
 * Why it is shaped so. Most users already run Redis and trust Redisson's
 * RLock/RFencedLock, so the default layout is Redisson's own wire format
 * (docs/protocol-redis.md): a HASH named after the lock whose field
 * "<client-uuid>:<thread-id>" holds the hold count, a STRING
 * "redisson_lock_token:{name}" INCRed on every new acquisition (the fencing
 * token), and a release message "0" on "redisson_lock__channel:{name}".
 * A Redisson client and dlock on the same name therefore exclude each other
 * and wake each other's waiters. `?layout=simple` speaks the classic
 * "SET name value NX PX" recipe instead (redis-py, node-redlock, redsync).
 *
 * Every operation is one Lua script sent by EVALSHA (EVAL when the server
 * answers NOSCRIPT after a restart or SCRIPT FLUSH), so acquire, release and
 * a whole batch of renewals each cost one round trip. The scripts are
 * written so that sending one twice does no harm: a retried acquire finds
 * its own field and returns the same token; a retried release recognises
 * "already released by us" from the token key. That is how a reply lost to
 * a timeout or a reconnect never double-counts, leaks or misreports a hold.
 *
 * Threads: hiredis contexts are not thread-safe, so the backend keeps a
 * small pool of connections, one per concurrently busy thread (callers and
 * the keeper). Waiting uses one more connection per client, owned by a
 * subscriber thread (the "hub") that is shared by every waiting thread and
 * every name and turns channel messages into dlock__wait_wake() calls.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "core.h"

#define REDIS_DEFAULT_PORT 6379
/* Keys per renewal script call: 10,000 holds = 10 calls, one pipeline. */
#define RENEW_BATCH 1000
/* Reconnect backoff of the background users (keeper, hub). */
#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 1000
#define HUB_BUCKETS 1024

/* ================================================================ scripts */

/* Every lock script returns one integer, or a string naming the type of a
 * key that is not a lock of this layout (WRONGTYPE; nothing written).
 * acquire: token >= 0 = acquired; -3 - PTTL < 0 = held by another owner.
 * release: 1 = released, 2 = already released by us (a retry), 0 = not
 * ours. force: 1 = deleted, 0 = nothing there. An integer rather than a
 * {status, value} table: the table costs the server ~0.5 us per call. */

/* The hot paths (acquire, release) use as few redis.call()s as they can:
 * on Redis 7 each costs about as much as a whole SET, and the server's
 * time per script is most of a lock's cost beside the raw recipe. A key
 * of the wrong type shows up as an error table from redis.pcall() and
 * only then is TYPE asked for the message. */

/* Redisson layout. KEYS: lock, token. ARGV: lease ms, owner field. A field
 * that already exists is our own earlier attempt whose reply was lost: the
 * core only calls acquire for a thread that holds nothing here. */
static const char ACQUIRE_REDISSON[] =
    "if redis.call('exists', KEYS[1]) == 0 then\n"
    "  local token = redis.call('incr', KEYS[2])\n"
    "  redis.call('hset', KEYS[1], ARGV[2], 1)\n"
    "  redis.call('pexpire', KEYS[1], ARGV[1])\n"
    "  return token\n"
    "end\n"
    "local mine = redis.pcall('hexists', KEYS[1], ARGV[2])\n"
    "if type(mine) == 'table' then return redis.call('type', KEYS[1]).ok end\n"
    "if mine == 1 then\n"
    "  redis.call('pexpire', KEYS[1], ARGV[1])\n"
    "  return tonumber(redis.call('get', KEYS[2]) or '0')\n"
    "end\n"
    "return -3 - redis.call('pttl', KEYS[1])\n";

/* KEYS: lock, channel, token. ARGV: owner field, our token. Full release
 * publishes Redisson's unlock message "0" (an exclusive lock has one
 * field, so removing ours is a full release). Status 2: the lock is free and
 * the token key still holds our token, so nobody took it after us (a
 * retried release whose first reply was lost, or an expired lease). */
static const char RELEASE_REDISSON[] =
    "local n = redis.pcall('hdel', KEYS[1], ARGV[1])\n"
    "if type(n) == 'table' then return redis.call('type', KEYS[1]).ok end\n"
    "if n == 1 then\n"
    "  redis.call('publish', KEYS[2], '0')\n"
    "  return 1\n"
    "end\n"
    "if redis.call('exists', KEYS[1]) == 0 and redis.call('get', KEYS[3]) == ARGV[2] then\n"
    "  return 2\n"
    "end\n"
    "return 0\n";

/* KEYS: lock_1..lock_n. ARGV: owner_1, lease_1, ..., owner_n, lease_n.
 * Returns one 1 (renewed) or 0 (gone) per key. */
static const char RENEW_REDISSON[] =
    "local r = {}\n"
    "for i = 1, #KEYS do\n"
    "  if redis.pcall('hexists', KEYS[i], ARGV[2*i-1]) == 1 then\n"
    "    redis.call('pexpire', KEYS[i], ARGV[2*i])\n"
    "    r[i] = 1\n"
    "  else r[i] = 0 end\n"
    "end\n"
    "return r\n";

/* Simple layout: the value is "<uuid>:<tid>:<token>". KEYS: lock, token.
 * ARGV: lease ms, owner prefix "<uuid>:<tid>:". */
static const char ACQUIRE_SIMPLE[] =
    "if redis.call('exists', KEYS[1]) == 0 then\n"
    "  local token = redis.call('incr', KEYS[2])\n"
    "  redis.call('set', KEYS[1], ARGV[2] .. token, 'nx', 'px', ARGV[1])\n"
    "  return token\n"
    "end\n"
    "local v = redis.pcall('get', KEYS[1])\n"
    "if type(v) == 'table' then return redis.call('type', KEYS[1]).ok end\n"
    "if string.sub(v, 1, #ARGV[2]) == ARGV[2] then\n"
    "  redis.call('pexpire', KEYS[1], ARGV[1])\n"
    "  return tonumber(string.sub(v, #ARGV[2] + 1)) or 0\n"
    "end\n"
    "return -3 - redis.call('pttl', KEYS[1])\n";

/* KEYS: lock, channel, token. ARGV: our value, our token, and only when
 * undoing an acquire whose reply was lost, our value's prefix (the token
 * in the value is unknown then). The classic compare-and-delete, plus the
 * wake-up message for dlock waiters. */
static const char RELEASE_SIMPLE[] =
    "local v = redis.pcall('get', KEYS[1])\n"
    "if type(v) == 'table' then return redis.call('type', KEYS[1]).ok end\n"
    "if v == ARGV[1] or (ARGV[3] and v and string.sub(v, 1, #ARGV[3]) == ARGV[3]) then\n"
    "  redis.call('del', KEYS[1])\n"
    "  redis.call('publish', KEYS[2], '0')\n"
    "  return 1\n"
    "end\n"
    "if v == false and redis.call('get', KEYS[3]) == ARGV[2] then return 2 end\n"
    "return 0\n";

/* KEYS: lock_1..lock_n. ARGV: value_1, lease_1, ... */
static const char RENEW_SIMPLE[] =
    "local r = {}\n"
    "for i = 1, #KEYS do\n"
    "  if redis.pcall('get', KEYS[i]) == ARGV[2*i-1] then\n"
    "    redis.call('pexpire', KEYS[i], ARGV[2*i])\n"
    "    r[i] = 1\n"
    "  else r[i] = 0 end\n"
    "end\n"
    "return r\n";

/* Read-only look at a lock. KEYS: lock, token. Returns {type, pttl, token,
 * field_1, count_1, ...} (hash) or {type, pttl, token, value} (string). */
static const char INSPECT[] =
    "local t = redis.call('type', KEYS[1]).ok\n"
    "local r = {t, redis.call('pttl', KEYS[1]), redis.pcall('get', KEYS[2]) or ''}\n"
    "if type(r[3]) ~= 'string' then r[3] = '' end\n"
    "if t == 'hash' then\n"
    "  local kv = redis.call('hgetall', KEYS[1])\n"
    "  for i = 1, #kv do r[#r + 1] = kv[i] end\n"
    "elseif t == 'string' then r[4] = redis.call('get', KEYS[1]) end\n"
    "return r\n";

/* Operator's release. KEYS: lock, channel. ARGV: the layout's type. */
static const char FORCE[] =
    "local t = redis.call('type', KEYS[1]).ok\n"
    "if t == 'none' then return 0 end\n"
    "if t ~= ARGV[1] then return t end\n"
    "redis.call('del', KEYS[1])\n"
    "redis.call('publish', KEYS[2], '0')\n"
    "return 1\n";

enum script_id { S_ACQUIRE, S_RELEASE, S_RENEW, S_INSPECT, S_FORCE, S_COUNT };

/* ============================================================== the state */

struct rconn {
    redisContext *ctx;
    unsigned gen; /* pool generation when dialed */
    bool limited; /* I/O timeout cut short by pool_get_within() */
    struct rconn *next;
};

struct hub_waiter {
    struct dlock__wait *w;
    bool woken; /* woken and has not tried since (see hub_wake_one) */
    struct hub_waiter *next;
};

/* One channel of the subscriber connection. */
struct hub_chan {
    char *name;
    size_t len;
    unsigned nwaiters;
    bool subscribed; /* as the server last confirmed */
    bool sub_sent, unsub_sent;
    bool dirty; /* on the hub's to-do list */
    struct hub_waiter *waiters;
    struct hub_chan *next;  /* bucket chain */
    struct hub_chan *dnext; /* to-do list */
};

struct hub {
    pthread_mutex_t mu;
    pthread_t thread;
    bool started, stop;
    int efd; /* eventfd: wakes the hub thread */
    struct hub_chan *buckets[HUB_BUCKETS];
    struct hub_chan *todo;
};

struct redis_state {
    struct dlock_client *c;
    char *host; /* NULL for a unix socket */
    int port;
    char *sock;
    int db;
    const char *user, *password;
    int64_t connect_timeout_ms, op_timeout_ms;
    const char *prefix;
    bool simple;
    char uuid[37];
    char where[300]; /* "redis 127.0.0.1:6379", for messages */

    const char *src[S_COUNT];
    char sha[S_COUNT][41];

    pthread_mutex_t pool_mu;
    struct rconn *idle;
    unsigned gen;
    int64_t next_dial_ms, backoff_ms; /* background reconnect backoff */

    struct hub hub;
};

/* The three keys of one lock. */
struct lock_keys {
    char *lock, *token, *chan;
    size_t lock_len, token_len, chan_len;
};

/* ================================================================ helpers */

/* Append Redisson's prefixName(PREFIX, KEY) at P: "<prefix>:{<key>}", or
 * "<prefix>:<key>" when the key already carries a hash tag. Returns the
 * length written (P has room: see keys_make). */
static size_t put_prefixed(char *p, const char *prefix, const char *key, size_t key_len)
{
    bool tagged = memchr(key, '{', key_len) != NULL;
    size_t pl = strlen(prefix), n = 0;
    memcpy(p, prefix, pl);
    n += pl;
    p[n++] = ':';
    if (!tagged)
        p[n++] = '{';
    memcpy(p + n, key, key_len);
    n += key_len;
    if (!tagged)
        p[n++] = '}';
    p[n] = 0;
    return n;
}

static void keys_free(struct lock_keys *k)
{
    free(k->lock); /* one block holds all three */
    memset(k, 0, sizeof *k);
}

/* The lock's key (prefix + name), token key and channel, in one block:
 * this runs for every acquire and release. */
static int keys_make(struct redis_state *s, const char *name, struct lock_keys *k)
{
    static const char TOKEN[] = "redisson_lock_token", CHAN[] = "redisson_lock__channel";
    size_t pl = s->prefix ? strlen(s->prefix) : 0, nl = strlen(name), kl = pl + nl;
    memset(k, 0, sizeof *k);
    /* each part: key + NUL; each prefixed one adds ":{" "}" */
    char *block = malloc(3 * (kl + 1) + sizeof TOKEN + sizeof CHAN + 8);
    if (!block)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    k->lock = block;
    if (pl)
        memcpy(k->lock, s->prefix, pl);
    memcpy(k->lock + pl, name, nl + 1);
    k->lock_len = kl;
    k->token = k->lock + kl + 1;
    k->token_len = put_prefixed(k->token, TOKEN, k->lock, kl);
    k->chan = k->token + k->token_len + 1;
    k->chan_len = put_prefixed(k->chan, CHAN, k->lock, kl);
    return DLOCK_OK;
}

/* Map a server error reply to a code, with the server's words. */
static int server_error(struct redis_state *s, const char *text, const char *what)
{
    int code = DLOCK_EBACKEND;
    if (strstr(text, "NOAUTH") || strstr(text, "WRONGPASS") || strstr(text, "NOPERM") ||
        strstr(text, "invalid password") || strstr(text, "invalid username-password"))
        code = DLOCK_EAUTH;
    else if (strstr(text, "WRONGTYPE"))
        code = DLOCK_EWRONGTYPE;
    else if (strstr(text, "MASTERDOWN") || strstr(text, "LOADING") || strstr(text, "CLUSTERDOWN"))
        code = DLOCK_EUNAVAIL;
    else if (strstr(text, "not an integer"))
        code = DLOCK_EWRONGTYPE;
    return dlock__err(code, "%s: %s: %s", s->where, what, text);
}

/* Map a failed hiredis call (NULL reply) to DLOCK_ECONN. */
static int io_error(struct redis_state *s, const redisContext *ctx, const char *what)
{
    const char *why = ctx ? ctx->errstr : "no connection";
    if (ctx && ctx->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK ||
                                            strstr(why, "temporarily unavailable")))
        return dlock__err(DLOCK_ECONN, "%s: %s: no reply within %lld ms", s->where, what,
                          (long long)s->op_timeout_ms);
    if (ctx && ctx->err == REDIS_ERR_EOF)
        return dlock__err(DLOCK_ECONN, "%s: %s: the server closed the connection", s->where,
                          what);
    return dlock__err(DLOCK_ECONN, "%s: %s: %s", s->where, what, why && *why ? why : "I/O error");
}

static struct timeval ms_tv(int64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
    return tv;
}

/* ============================================================ connections */

/* Dial, authenticate, select the db, within LIMIT_MS when > 0 (else the
 * connect timeout). On failure *out is NULL and the message names
 * host:port and the server's words. */
static int dial(struct redis_state *s, bool select_db, int64_t limit_ms, redisContext **out)
{
    *out = NULL;
    int64_t cto = limit_ms > 0 && limit_ms < s->connect_timeout_ms ? limit_ms : s->connect_timeout_ms;
    redisContext *ctx = s->sock ? redisConnectUnixWithTimeout(s->sock, ms_tv(cto))
                                : redisConnectWithTimeout(s->host, s->port, ms_tv(cto));
    if (!ctx)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", s->where);
    if (ctx->err) {
        int rc = dlock__err(DLOCK_ECONN, "%s: cannot connect: %s", s->where, ctx->errstr);
        redisFree(ctx);
        return rc;
    }
    redisSetTimeout(ctx, ms_tv(limit_ms > 0 && limit_ms < s->op_timeout_ms ? limit_ms : s->op_timeout_ms));
    if (s->password) {
        redisReply *r;
        if (s->user)
            r = redisCommand(ctx, "AUTH %s %s", s->user, s->password);
        else
            r = redisCommand(ctx, "AUTH %s", s->password);
        int rc = DLOCK_OK;
        if (!r)
            rc = io_error(s, ctx, "AUTH");
        else if (r->type == REDIS_REPLY_ERROR)
            rc = dlock__err(DLOCK_EAUTH, "%s: AUTH%s%s refused: %s", s->where, s->user ? " as " : "",
                            s->user ? s->user : "", r->str);
        if (r)
            freeReplyObject(r);
        if (rc) {
            redisFree(ctx);
            return rc;
        }
    }
    if (select_db && s->db != 0) {
        redisReply *r = redisCommand(ctx, "SELECT %d", s->db);
        int rc = DLOCK_OK;
        if (!r)
            rc = io_error(s, ctx, "SELECT");
        else if (r->type == REDIS_REPLY_ERROR)
            rc = server_error(s, r->str, "SELECT");
        if (r)
            freeReplyObject(r);
        if (rc) {
            redisFree(ctx);
            return rc;
        }
    }
    *out = ctx;
    return DLOCK_OK;
}

/* Take an idle connection or dial a new one. BACKGROUND callers (keeper)
 * respect the reconnect backoff; callers' own requests always dial. With
 * LIMIT_MS > 0, dialing and the connection's I/O timeout are cut to it
 * (the caller restores the timeout with pool_put). */
static int pool_get_within(struct redis_state *s, bool background, int64_t limit_ms, struct rconn **out)
{
    *out = NULL;
    pthread_mutex_lock(&s->pool_mu);
    while (s->idle) {
        struct rconn *k = s->idle;
        s->idle = k->next;
        if (k->gen == s->gen) {
            pthread_mutex_unlock(&s->pool_mu);
            if (limit_ms > 0 && limit_ms < s->op_timeout_ms) {
                redisSetTimeout(k->ctx, ms_tv(limit_ms));
                k->limited = true;
            }
            *out = k;
            return DLOCK_OK;
        }
        redisFree(k->ctx); /* dialed before a failure: suspect */
        free(k);
    }
    int64_t now = dlock__now_ms();
    if (background && now < s->next_dial_ms) {
        int64_t left = s->next_dial_ms - now;
        pthread_mutex_unlock(&s->pool_mu);
        return dlock__err(DLOCK_ECONN, "%s: reconnecting (next attempt in %lld ms)", s->where,
                          (long long)left);
    }
    unsigned gen = s->gen;
    pthread_mutex_unlock(&s->pool_mu);

    struct rconn *k = calloc(1, sizeof *k);
    if (!k)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    int rc = dial(s, true, limit_ms, &k->ctx);
    k->limited = limit_ms > 0;
    pthread_mutex_lock(&s->pool_mu);
    if (rc) {
        s->backoff_ms = s->backoff_ms ? s->backoff_ms * 2 : BACKOFF_MIN_MS;
        if (s->backoff_ms > BACKOFF_MAX_MS)
            s->backoff_ms = BACKOFF_MAX_MS;
        s->next_dial_ms = dlock__now_ms() + s->backoff_ms;
    } else {
        s->backoff_ms = 0;
        s->next_dial_ms = 0;
    }
    pthread_mutex_unlock(&s->pool_mu);
    if (rc) {
        free(k);
        return rc;
    }
    k->gen = gen;
    *out = k;
    return DLOCK_OK;
}

static int pool_get(struct redis_state *s, bool background, struct rconn **out)
{
    return pool_get_within(s, background, 0, out);
}

/* Give K back; BROKEN (an I/O error) closes it and retires every idle
 * connection dialed before, since the server may have restarted. */
static void pool_put(struct redis_state *s, struct rconn *k, bool broken)
{
    if (!k)
        return;
    if (k->limited && !broken && !k->ctx->err) {
        redisSetTimeout(k->ctx, ms_tv(s->op_timeout_ms));
        k->limited = false;
    }
    pthread_mutex_lock(&s->pool_mu);
    if (broken || k->ctx->err) {
        if (k->gen == s->gen)
            s->gen++;
        pthread_mutex_unlock(&s->pool_mu);
        redisFree(k->ctx);
        free(k);
        return;
    }
    k->next = s->idle;
    s->idle = k;
    pthread_mutex_unlock(&s->pool_mu);
}

/* ======================================================== running scripts */

#define MAX_SCRIPT_ARGS 8

/* Send script ID with NKEYS keys then the other args, on K: EVALSHA, and EVAL
 * when the server has forgotten the script. NULL return = I/O error (K is
 * then broken). */
static redisReply *eval_on(struct redis_state *s, struct rconn *k, enum script_id id, int nkeys,
                           int nargs, const char **args, const size_t *lens)
{
    const char *argv[MAX_SCRIPT_ARGS + 3];
    size_t argl[MAX_SCRIPT_ARGS + 3];
    char nk[16];
    snprintf(nk, sizeof nk, "%d", nkeys);
    argv[0] = "EVALSHA";
    argv[1] = s->sha[id];
    argv[2] = nk;
    argl[0] = 7;
    argl[1] = 40;
    argl[2] = strlen(nk);
    for (int i = 0; i < nargs; i++) {
        argv[3 + i] = args[i];
        argl[3 + i] = lens[i];
    }
    redisReply *r = redisCommandArgv(k->ctx, 3 + nargs, argv, argl);
    if (r && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0) {
        freeReplyObject(r);
        argv[0] = "EVAL";
        argl[0] = 4;
        argv[1] = s->src[id];
        argl[1] = strlen(s->src[id]);
        r = redisCommandArgv(k->ctx, 3 + nargs, argv, argl);
    }
    return r;
}

/* Run script ID once, or, when RETRY and the reply was lost to an I/O error
 * or timeout, once more on a fresh connection (the scripts are written so
 * a repeat is harmless). *SENT_MS (may be NULL) = send time of the attempt
 * that answered; *RETRIED tells whether a second attempt answered. */
static int eval_script(struct redis_state *s, bool background, enum script_id id, int nkeys,
                       int nargs, const char **args, const size_t *lens, bool retry,
                       const char *what, redisReply **out, int64_t *sent_ms, bool *retried)
{
    *out = NULL;
    if (retried)
        *retried = false;
    for (int attempt = 0;; attempt++) {
        struct rconn *k;
        int rc = pool_get(s, background, &k);
        if (rc)
            return rc;
        if (sent_ms)
            *sent_ms = dlock__now_ms();
        redisReply *r = eval_on(s, k, id, nkeys, nargs, args, lens);
        if (!r) {
            rc = io_error(s, k->ctx, what);
            pool_put(s, k, true);
            if (retry && attempt == 0) {
                if (retried)
                    *retried = true;
                continue;
            }
            return rc;
        }
        pool_put(s, k, false);
        if (r->type == REDIS_REPLY_ERROR) {
            rc = server_error(s, r->str, what);
            freeReplyObject(r);
            return rc;
        }
        *out = r;
        return DLOCK_OK;
    }
}

/* Decode a lock script's reply: *VALUE, or *TYPE_NAME for a key of the
 * wrong type (see the scripts). */
static int script_reply(struct redis_state *s, const redisReply *r, long long *value,
                        const char **type_name)
{
    *value = 0;
    *type_name = NULL;
    if (r->type == REDIS_REPLY_INTEGER)
        *value = r->integer;
    else if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)
        *type_name = r->str;
    else
        return dlock__err(DLOCK_EPROTO, "%s: unexpected reply to a lock script (type %d)", s->where,
                          r->type);
    return DLOCK_OK;
}

static int wrongtype(struct redis_state *s, const struct lock_keys *k, const char *type_name)
{
    return dlock__err(DLOCK_EWRONGTYPE, "%s: WRONGTYPE key '%s' holds a %s, not a dlock lock "
                                        "(layout %s); left untouched",
                      s->where, k->lock, type_name ? type_name : "value of another type",
                      s->simple ? "simple" : "redisson");
}

/* ==================================================== the subscriber hub */

static unsigned hub_hash(const char *p, size_t len)
{
    unsigned h = 2166136261u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)p[i]) * 16777619u;
    return h % HUB_BUCKETS;
}

static struct hub_chan *hub_find(struct hub *hb, const char *name, size_t len)
{
    for (struct hub_chan *ch = hb->buckets[hub_hash(name, len)]; ch; ch = ch->next)
        if (ch->len == len && memcmp(ch->name, name, len) == 0)
            return ch;
    return NULL;
}

static void hub_kick(struct hub *hb)
{
    uint64_t one = 1;
    if (write(hb->efd, &one, sizeof one) < 0) {
        /* the counter is saturated: the thread is awake anyway */
    }
}

/* Put CH on the to-do list (hub mutex held). */
static void hub_mark(struct hub *hb, struct hub_chan *ch)
{
    if (ch->dirty)
        return;
    ch->dirty = true;
    ch->dnext = hb->todo;
    hb->todo = ch;
    hub_kick(hb);
}

/* Wake every waiter of CH: the subscription just started or restarted, so
 * any of them may have missed a release. */
static void hub_wake_chan(struct hub_chan *ch)
{
    for (struct hub_waiter *x = ch->waiters; x; x = x->next) {
        x->woken = true;
        dlock__wait_wake(x->w);
    }
}

/* A release message: wake the longest-waiting waiter that is not already
 * woken, so one release costs one try per client, not a herd (Redisson's
 * semaphore does the same). A woken waiter that leaves without the lock
 * passes the wake on (hub_leave), so none is lost. */
static void hub_wake_one(struct hub_chan *ch)
{
    for (struct hub_waiter *x = ch->waiters; x; x = x->next)
        if (!x->woken) {
            x->woken = true;
            dlock__wait_wake(x->w);
            return;
        }
}

static void hub_free_chan(struct hub *hb, struct hub_chan *ch)
{
    struct hub_chan **pp = &hb->buckets[hub_hash(ch->name, ch->len)];
    while (*pp && *pp != ch)
        pp = &(*pp)->next;
    if (*pp)
        *pp = ch->next;
    free(ch->name);
    free(ch);
}

/* Handle one reply on the subscriber connection (hub mutex held). */
static void hub_on_reply(struct hub *hb, const redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING)
        return;
    const char *kind = r->element[0]->str;
    struct hub_chan *ch = hub_find(hb, r->element[1]->str, r->element[1]->len);
    if (!ch)
        return;
    if (strcmp(kind, "message") == 0) {
        hub_wake_one(ch);
    } else if (strcmp(kind, "subscribe") == 0) {
        ch->subscribed = true;
        ch->sub_sent = false;
        hub_wake_chan(ch); /* waiters that tried before this may have missed a release */
        if (ch->nwaiters == 0)
            hub_mark(hb, ch);
    } else if (strcmp(kind, "unsubscribe") == 0) {
        ch->subscribed = false;
        ch->unsub_sent = false;
        if (ch->nwaiters > 0)
            hub_mark(hb, ch);
        else if (!ch->dirty && !ch->sub_sent)
            hub_free_chan(hb, ch);
    }
}

/* Connection lost: forget server state, resubscribe what is wanted, and
 * wake every waiter so it tries again (messages may have been lost). */
static void hub_on_disconnect(struct hub *hb)
{
    hb->todo = NULL;
    for (size_t b = 0; b < HUB_BUCKETS; b++) {
        for (struct hub_chan *ch = hb->buckets[b], *next; ch; ch = next) {
            next = ch->next;
            ch->subscribed = ch->sub_sent = ch->unsub_sent = ch->dirty = false;
            if (ch->nwaiters == 0) {
                hub_free_chan(hb, ch);
                continue;
            }
            hub_wake_chan(ch);
            hub_mark(hb, ch);
        }
    }
}

/* Append SUBSCRIBE/UNSUBSCRIBE for the to-do list (hub mutex held). */
static void hub_flush_todo(struct hub *hb, redisContext *ctx)
{
    struct hub_chan *ch = hb->todo;
    hb->todo = NULL;
    while (ch) {
        struct hub_chan *next = ch->dnext;
        ch->dirty = false;
        const char *argv[2];
        size_t argl[2] = {0, ch->len};
        argv[1] = ch->name;
        if (ch->nwaiters > 0 && (!ch->subscribed || ch->unsub_sent) && !ch->sub_sent) {
            if (ch->unsub_sent) {
                /* re-subscribe once the unsubscribe is confirmed */
            } else {
                argv[0] = "SUBSCRIBE";
                argl[0] = 9;
                redisAppendCommandArgv(ctx, 2, argv, argl);
                ch->sub_sent = true;
            }
        } else if (ch->nwaiters == 0 && ch->subscribed && !ch->unsub_sent && !ch->sub_sent) {
            argv[0] = "UNSUBSCRIBE";
            argl[0] = 11;
            redisAppendCommandArgv(ctx, 2, argv, argl);
            ch->unsub_sent = true;
        } else if (ch->nwaiters == 0 && !ch->subscribed && !ch->sub_sent && !ch->unsub_sent) {
            hub_free_chan(hb, ch);
        }
        ch = next;
    }
}

static void *hub_main(void *arg)
{
    struct redis_state *s = arg;
    struct hub *hb = &s->hub;
    redisContext *ctx = NULL;
    int64_t backoff = 0, next_dial = 0;

    pthread_mutex_lock(&hb->mu);
    while (!hb->stop) {
        if (!ctx) {
            int64_t now = dlock__now_ms();
            if (now >= next_dial) {
                pthread_mutex_unlock(&hb->mu);
                int rc = dial(s, false, 0, &ctx);
                pthread_mutex_lock(&hb->mu);
                if (rc) {
                    backoff = backoff ? backoff * 2 : BACKOFF_MIN_MS;
                    if (backoff > BACKOFF_MAX_MS)
                        backoff = BACKOFF_MAX_MS;
                    next_dial = dlock__now_ms() + backoff;
                } else {
                    backoff = 0;
                    redisSetTimeout(ctx, ms_tv(s->op_timeout_ms));
                    /* everything wanted is marked dirty by hub_on_disconnect */
                    for (size_t b = 0; b < HUB_BUCKETS; b++)
                        for (struct hub_chan *ch = hb->buckets[b]; ch; ch = ch->next)
                            if (ch->nwaiters > 0)
                                hub_mark(hb, ch);
                }
            }
        }
        if (ctx)
            hub_flush_todo(hb, ctx);
        pthread_mutex_unlock(&hb->mu);

        bool broken = false;
        if (ctx) {
            int done = 0;
            while (!done && !broken)
                if (redisBufferWrite(ctx, &done) == REDIS_ERR)
                    broken = true;
        }
        struct pollfd p[2] = {{.fd = s->hub.efd, .events = POLLIN}, {.fd = -1, .events = POLLIN}};
        if (ctx && !broken)
            p[1].fd = ctx->fd;
        int timeout = 1000;
        if (!ctx) {
            int64_t left = next_dial - dlock__now_ms();
            timeout = left < 0 ? 0 : (int)left;
        }
        if (!broken && poll(p, 2, timeout) > 0) {
            if (p[0].revents & POLLIN) {
                uint64_t v;
                if (read(s->hub.efd, &v, sizeof v) < 0) {
                    /* nothing to drain */
                }
            }
            if (p[1].fd >= 0 && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
                if (redisBufferRead(ctx) == REDIS_ERR)
                    broken = true;
            }
        }
        pthread_mutex_lock(&hb->mu);
        if (ctx) {
            void *reply;
            while (!broken) {
                if (redisGetReplyFromReader(ctx, &reply) == REDIS_ERR) {
                    broken = true;
                    break;
                }
                if (!reply)
                    break;
                hub_on_reply(hb, reply);
                freeReplyObject(reply);
            }
        }
        if (broken) {
            redisFree(ctx);
            ctx = NULL;
            hub_on_disconnect(hb);
            backoff = backoff ? backoff * 2 : BACKOFF_MIN_MS;
            if (backoff > BACKOFF_MAX_MS)
                backoff = BACKOFF_MAX_MS;
            next_dial = dlock__now_ms() + backoff;
        }
    }
    pthread_mutex_unlock(&hb->mu);
    if (ctx)
        redisFree(ctx);
    return NULL;
}

/* Register W as a waiter on CHAN, subscribing when it is the first. */
static int hub_join(struct redis_state *s, const char *chan, size_t len, struct dlock__wait *w)
{
    struct hub *hb = &s->hub;
    struct hub_waiter *x = calloc(1, sizeof *x);
    if (!x)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    x->w = w;
    pthread_mutex_lock(&hb->mu);
    if (!hb->started) {
        int err = pthread_create(&hb->thread, NULL, hub_main, s);
        if (err) {
            pthread_mutex_unlock(&hb->mu);
            free(x);
            return dlock__errno(DLOCK_EIO, err, "%s: cannot start the subscriber thread", s->where);
        }
        hb->started = true;
    }
    struct hub_chan *ch = hub_find(hb, chan, len);
    if (!ch) {
        ch = calloc(1, sizeof *ch);
        if (ch)
            ch->name = malloc(len + 1);
        if (!ch || !ch->name) {
            pthread_mutex_unlock(&hb->mu);
            if (ch)
                free(ch);
            free(x);
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        }
        memcpy(ch->name, chan, len);
        ch->name[len] = 0;
        ch->len = len;
        unsigned b = hub_hash(chan, len);
        ch->next = hb->buckets[b];
        hb->buckets[b] = ch;
    }
    struct hub_waiter **tail = &ch->waiters; /* oldest first */
    while (*tail)
        tail = &(*tail)->next;
    *tail = x;
    if (ch->nwaiters++ == 0 || !ch->subscribed || ch->unsub_sent)
        hub_mark(hb, ch);
    pthread_mutex_unlock(&hb->mu);
    return DLOCK_OK;
}

/* Whether messages on CHAN reach us now. */
static bool hub_subscribed(struct redis_state *s, const char *chan, size_t len)
{
    pthread_mutex_lock(&s->hub.mu);
    struct hub_chan *ch = hub_find(&s->hub, chan, len);
    bool yes = ch && ch->subscribed && !ch->unsub_sent;
    pthread_mutex_unlock(&s->hub.mu);
    return yes;
}

/* W is about to try: a wake it received is being used now. */
static void hub_ack(struct redis_state *s, const char *chan, size_t len, struct dlock__wait *w)
{
    struct hub *hb = &s->hub;
    pthread_mutex_lock(&hb->mu);
    struct hub_chan *ch = hub_find(hb, chan, len);
    for (struct hub_waiter *x = ch ? ch->waiters : NULL; x; x = x->next)
        if (x->w == w)
            x->woken = false;
    pthread_mutex_unlock(&hb->mu);
}

/* W stops waiting on CHAN. If it was woken and leaves without the lock
 * (timed out, canceled, failed), the wake goes to the next waiter. */
static void hub_leave(struct redis_state *s, const char *chan, size_t len, struct dlock__wait *w,
                      bool acquired)
{
    struct hub *hb = &s->hub;
    pthread_mutex_lock(&hb->mu);
    struct hub_chan *ch = hub_find(hb, chan, len);
    if (ch) {
        for (struct hub_waiter **pp = &ch->waiters; *pp; pp = &(*pp)->next) {
            if ((*pp)->w == w) {
                struct hub_waiter *x = *pp;
                *pp = x->next;
                if (x->woken && !acquired)
                    hub_wake_one(ch);
                free(x);
                ch->nwaiters--;
                break;
            }
        }
        if (ch->nwaiters == 0)
            hub_mark(hb, ch);
    }
    pthread_mutex_unlock(&hb->mu);
}

static void hub_stop(struct redis_state *s)
{
    struct hub *hb = &s->hub;
    pthread_mutex_lock(&hb->mu);
    bool started = hb->started;
    hb->stop = true;
    hub_kick(hb);
    pthread_mutex_unlock(&hb->mu);
    if (started)
        pthread_join(hb->thread, NULL);
    for (size_t b = 0; b < HUB_BUCKETS; b++) {
        while (hb->buckets[b]) {
            struct hub_chan *ch = hb->buckets[b];
            while (ch->waiters) {
                struct hub_waiter *x = ch->waiters;
                ch->waiters = x->next;
                free(x);
            }
            hub_free_chan(hb, ch);
        }
    }
}

/* ============================================================ open/close */

static void redis_close(void *state)
{
    struct redis_state *s = state;
    if (!s)
        return;
    if (s->hub.efd >= 0) {
        hub_stop(s);
        close(s->hub.efd);
    }
    while (s->idle) {
        struct rconn *k = s->idle;
        s->idle = k->next;
        redisFree(k->ctx);
        free(k);
    }
    pthread_mutex_destroy(&s->pool_mu);
    pthread_mutex_destroy(&s->hub.mu);
    free(s->host);
    free(s->sock);
    free(s);
}

static int parse_db(struct redis_state *s, const char *text, const char *from)
{
    char *end;
    errno = 0;
    long db = strtol(text, &end, 10);
    if (!*text || *end || errno || db < 0 || db > 1000000)
        return dlock__err(DLOCK_EBADURL, "bad URL '%s': %s '%s' is not a database number",
                          dlock_client_url(s->c), from, text);
    s->db = (int)db;
    return DLOCK_OK;
}

/* Load the scripts once so EVALSHA has their digests. */
static int load_scripts(struct redis_state *s)
{
    struct rconn *k;
    int rc = pool_get(s, false, &k);
    if (rc)
        return rc;
    /* pipelined: one round trip for all of them */
    for (int i = 0; i < S_COUNT; i++)
        redisAppendCommand(k->ctx, "SCRIPT LOAD %s", s->src[i]);
    bool broken = false;
    for (int i = 0; i < S_COUNT; i++) {
        redisReply *r = NULL;
        if (redisGetReply(k->ctx, (void **)&r) != REDIS_OK || !r) {
            if (!rc)
                rc = io_error(s, k->ctx, "SCRIPT LOAD");
            broken = true;
            break;
        }
        /* keep the first failure, but read every reply */
        if (!rc && r->type == REDIS_REPLY_ERROR)
            rc = server_error(s, r->str, "SCRIPT LOAD");
        else if (!rc && (r->type != REDIS_REPLY_STRING || r->len != 40))
            rc = dlock__err(DLOCK_EPROTO, "%s: SCRIPT LOAD: unexpected reply", s->where);
        else if (!rc)
            memcpy(s->sha[i], r->str, 41);
        freeReplyObject(r);
    }
    pool_put(s, k, broken);
    return rc;
}

static int redis_open(struct dlock_client *c, void **state)
{
    struct redis_state *s = calloc(1, sizeof *s);
    if (!s)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    s->c = c;
    s->hub.efd = -1;
    pthread_mutex_init(&s->pool_mu, NULL);
    pthread_mutex_init(&s->hub.mu, NULL);
    const char *url = dlock_client_url(c);
    int rc = DLOCK_OK;

    const char *db_param = dlock__url_param(&c->url, "db");
    if (strcmp(c->url.scheme, "redis+unix") == 0) {
        if (c->url.nhosts > 0 && c->url.hosts[0].host && *c->url.hosts[0].host)
            rc = dlock__err(DLOCK_EBADURL, "bad URL '%s': redis+unix:///path/to/socket takes no host",
                            url);
        else if (!c->url.path || strlen(c->url.path) < 2)
            rc = dlock__err(DLOCK_EBADURL, "bad URL '%s': redis+unix:// needs a socket path, e.g. "
                                           "redis+unix:///run/redis/redis.sock",
                            url);
        else if (!(s->sock = dlock__strdup(c->url.path)))
            rc = DLOCK_ENOMEM;
        if (!rc)
            snprintf(s->where, sizeof s->where, "redis unix:%s", s->sock);
        if (!rc && db_param)
            rc = parse_db(s, db_param, "db");
    } else {
        if (c->url.nhosts != 1)
            rc = dlock__err(DLOCK_EBADURL,
                            "bad URL '%s': redis:// takes exactly one host (for several, use "
                            "redlock:// or redis+sentinel://)",
                            url);
        else if (!(s->host = dlock__strdup(c->url.hosts[0].host)))
            rc = DLOCK_ENOMEM;
        s->port = c->url.nhosts ? c->url.hosts[0].port : 0;
        if (s->port == 0)
            s->port = REDIS_DEFAULT_PORT;
        if (!rc)
            snprintf(s->where, sizeof s->where, strchr(s->host, ':') ? "redis [%s]:%d" : "redis %s:%d",
                     s->host, s->port);
        const char *path = c->url.path;
        if (!rc && path && strcmp(path, "/") != 0 && *path) {
            if (db_param)
                rc = dlock__err(DLOCK_EBADURL, "bad URL '%s': the db is given twice (path and ?db=)",
                                url);
            else
                rc = parse_db(s, path + 1, "path");
        } else if (!rc && db_param) {
            rc = parse_db(s, db_param, "db");
        }
    }
    if (!rc && c->opts.layout && strcmp(c->opts.layout, "redisson") != 0 &&
        strcmp(c->opts.layout, "simple") != 0)
        rc = dlock__err(DLOCK_EBADURL, "bad URL '%s': layout '%s' is unknown (redisson or simple)",
                        url, c->opts.layout);
    if (!rc && (c->opts.tls_ca || c->opts.tls_cert || c->opts.tls_key))
        rc = dlock__err(DLOCK_ENOTSUP, "%s: TLS is not supported: this build uses hiredis 0.14, "
                                       "which has no TLS (hiredis >= 1.0 does)",
                        url);
    if (rc) {
        redis_close(s);
        return rc;
    }
    s->simple = c->opts.layout && strcmp(c->opts.layout, "simple") == 0;
    s->user = c->opts.user;
    s->password = c->opts.password;
    if (!s->password && getenv("DLOCK_REDIS_PASSWORD") && *getenv("DLOCK_REDIS_PASSWORD"))
        s->password = getenv("DLOCK_REDIS_PASSWORD");
    s->connect_timeout_ms = c->opts.connect_timeout_ms > 0 ? c->opts.connect_timeout_ms : 5000;
    s->op_timeout_ms = c->opts.op_timeout_ms > 0 ? c->opts.op_timeout_ms : 5000;
    s->prefix = c->opts.key_prefix;
    dlock__uuid(s->uuid);
    s->src[S_ACQUIRE] = s->simple ? ACQUIRE_SIMPLE : ACQUIRE_REDISSON;
    s->src[S_RELEASE] = s->simple ? RELEASE_SIMPLE : RELEASE_REDISSON;
    s->src[S_RENEW] = s->simple ? RENEW_SIMPLE : RENEW_REDISSON;
    s->src[S_INSPECT] = INSPECT;
    s->src[S_FORCE] = FORCE;

    s->hub.efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->hub.efd < 0) {
        rc = dlock__errno(DLOCK_EIO, errno, "%s: eventfd", s->where);
        redis_close(s);
        return rc;
    }
    rc = load_scripts(s);
    if (rc) {
        redis_close(s);
        return rc;
    }
    *state = s;
    return DLOCK_OK;
}

/* ================================================================= locks */

static void owner_of(struct redis_state *s, struct dlock__hold *h)
{
    snprintf(h->owner, sizeof h->owner, "%s:%ld", s->uuid, h->tid);
}

/* An acquire whose replies were lost (timeout, connection reset) may have
 * run on the server: take our field away again if it is there, so the
 * name is not left held by nobody until the lease ends. Best effort: if
 * the server cannot be reached now, the lease ends it. Keeps the caller's
 * error message. */
static void undo_lost_acquire(struct redis_state *s, struct dlock__hold *h, const struct lock_keys *k)
{
    char msg[512], value[160];
    snprintf(msg, sizeof msg, "%s", dlock_errmsg());
    /* Redisson layout: our field. Simple layout: our value's prefix
     * "<uuid>:<tid>:" (the token after it was never learned). */
    int vl = snprintf(value, sizeof value, s->simple ? "%s:" : "%s", h->owner);
    const char *args[] = {k->lock, k->chan, k->token, s->simple ? "" : value, "0", value};
    size_t lens[] = {k->lock_len, k->chan_len, k->token_len, s->simple ? 0 : (size_t)vl, 1, (size_t)vl};
    redisReply *r = NULL;
    if (eval_script(s, false, S_RELEASE, 3, s->simple ? 6 : 5, args, lens, false, "undo acquire", &r, NULL,
                    NULL) == DLOCK_OK &&
        r)
        freeReplyObject(r);
    dlock__err(DLOCK_ECONN, "%s", msg);
}

/* One acquire attempt: DLOCK_OK (h->token set), DLOCK_EBUSY with *TTL_MS
 * the holder's remaining lease, or a failure. */
static int try_acquire(struct redis_state *s, struct dlock__hold *h, const struct lock_keys *k,
                       int64_t lease_ms, int64_t *ttl_ms)
{
    char lease[24], prefix[128];
    int pl = snprintf(lease, sizeof lease, "%lld", (long long)lease_ms);
    int ol = s->simple ? snprintf(prefix, sizeof prefix, "%s:", h->owner)
                       : snprintf(prefix, sizeof prefix, "%s", h->owner);
    const char *args[] = {k->lock, k->token, lease, prefix};
    size_t lens[] = {k->lock_len, k->token_len, (size_t)pl, (size_t)ol};
    redisReply *r;
    int64_t sent;
    int rc = eval_script(s, false, S_ACQUIRE, 2, 4, args, lens, true, "acquire", &r, &sent, NULL);
    if (rc == DLOCK_ECONN)
        undo_lost_acquire(s, h, k);
    if (rc) {
        if (rc == DLOCK_EWRONGTYPE) {
            char why[512];
            snprintf(why, sizeof why, "%s", dlock_errmsg());
            return dlock__err(rc, "%s: WRONGTYPE: key '%s' or its token key '%s' holds a value "
                                  "that is not a dlock lock; left untouched (%s)",
                              s->where, k->lock, k->token, why);
        }
        return rc;
    }
    long long value;
    const char *type_name;
    rc = script_reply(s, r, &value, &type_name);
    if (!rc) {
        if (type_name) {
            rc = wrongtype(s, k, type_name);
        } else if (value >= 0) {
            h->token = (uint64_t)value;
            dlock__hold_confirmed(s->c, h, sent);
        } else {
            *ttl_ms = -3 - value;
            rc = dlock__err(DLOCK_EBUSY, "%s: lock '%s' is held by another owner (%lld ms of lease left)",
                            s->where, k->lock, (long long)*ttl_ms);
        }
    }
    freeReplyObject(r);
    return rc;
}

static int redis_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
{
    struct redis_state *s = state;
    if (h->mode != DLOCK_EXCLUSIVE)
        return dlock__err(DLOCK_ENOTSUP, "%s: shared (read) locks are not supported by the redis "
                                         "backend yet; lock '%s' can only be taken exclusively",
                          s->where, h->name);
    struct lock_keys k;
    int rc = keys_make(s, h->name, &k);
    if (rc)
        return rc;
    owner_of(s, h);
    int64_t lease = h->lease_ms > 0 ? h->lease_ms : s->c->opts.lease_ms;
    int64_t ttl = 0;

    rc = try_acquire(s, h, &k, lease, &ttl);
    if (rc != DLOCK_EBUSY || w->deadline == 0)
        goto out;

    /* Contended: subscribe (shared connection), then try, sleep until a
     * release message or the holder's remaining lease, try again. */
    rc = hub_join(s, k.chan, k.chan_len, w);
    if (rc)
        goto out;
    /* A connection lost while waiting (server restart, network blip) is
     * retried with backoff until the wait's deadline: the waiter already
     * reached the server once, so the outage is transient until proven
     * otherwise. The message of the last failure is kept for the end. */
    int64_t outage_backoff = 0;
    char outage[512] = "";
    for (bool first = true;; first = false) {
        unsigned seq = dlock__wait_seq(w);
        /* Before the subscription is confirmed a release could be missed,
         * so the first sleep lasts until the confirmation wakes us. */
        if (!first || hub_subscribed(s, k.chan, k.chan_len)) {
            hub_ack(s, k.chan, k.chan_len, w);
            rc = try_acquire(s, h, &k, lease, &ttl);
            if (rc == DLOCK_ECONN) {
                snprintf(outage, sizeof outage, "%s", dlock_errmsg());
                outage_backoff = outage_backoff ? outage_backoff * 2 : BACKOFF_MIN_MS;
                if (outage_backoff > BACKOFF_MAX_MS)
                    outage_backoff = BACKOFF_MAX_MS;
            } else if (rc != DLOCK_EBUSY) {
                break;
            } else {
                outage_backoff = 0;
            }
        }
        int64_t now = dlock__now_ms();
        int64_t until;
        if (outage_backoff)
            until = now + outage_backoff;
        else if (ttl == -1)
            until = now + lease; /* a foreign lock without expiry */
        else if (ttl < 0)
            until = now; /* vanished between the two calls: try at once */
        else
            until = now + ttl + 1; /* PTTL rounds down; 0 = expiring now */
        rc = dlock__wait_sleep(w, seq, until);
        if (rc == DLOCK_ETIMEDOUT && outage_backoff) {
            rc = dlock__err(DLOCK_ECONN, "%s (still failing when the wait for '%s' ended)", outage,
                            k.lock);
            break;
        }
        if (rc == DLOCK_ETIMEDOUT) {
            rc = dlock__err(DLOCK_ETIMEDOUT, "%s: timed out waiting for lock '%s'", s->where, k.lock);
            break;
        }
        if (rc != DLOCK_OK)
            break;
    }
    hub_leave(s, k.chan, k.chan_len, w, rc == DLOCK_OK);
out:
    keys_free(&k);
    return rc;
}

static int redis_release(void *state, struct dlock__hold *h)
{
    struct redis_state *s = state;
    struct lock_keys k;
    int rc = keys_make(s, h->name, &k);
    if (rc)
        return rc;
    char token[24], value[160];
    int tl = snprintf(token, sizeof token, "%llu", (unsigned long long)h->token);
    int vl = s->simple ? snprintf(value, sizeof value, "%s:%llu", h->owner, (unsigned long long)h->token)
                       : snprintf(value, sizeof value, "%s", h->owner);
    const char *args[] = {k.lock, k.chan, k.token, value, token};
    size_t lens[] = {k.lock_len, k.chan_len, k.token_len, (size_t)vl, (size_t)tl};
    redisReply *r;
    bool retried;
    rc = eval_script(s, false, S_RELEASE, 3, 5, args, lens, true, "release", &r, NULL, &retried);
    if (!rc) {
        long long status;
        const char *type_name;
        rc = script_reply(s, r, &status, &type_name);
        if (!rc) {
            if (type_name)
                rc = dlock__err(DLOCK_ELOST, "%s: lock '%s' was lost: key '%s' now holds a %s",
                                s->where, h->name, k.lock, type_name);
            else if (status == 1 || (status == 2 && retried))
                rc = DLOCK_OK;
            else
                rc = dlock__err(DLOCK_ELOST, "%s: lock '%s' was lost: key '%s' is %s (our token was %llu)",
                                s->where, h->name, k.lock,
                                status == 2 ? "free, its lease had expired" : "held by another owner or expired",
                                (unsigned long long)h->token);
        }
        freeReplyObject(r);
    }
    free(h->bdata);
    h->bdata = NULL;
    keys_free(&k);
    return rc;
}

/* The keeper's batch: RENEW_BATCH holds per script call, every call of
 * the batch pipelined on one connection, so N holds cost one round trip
 * and ceil(N / RENEW_BATCH) commands. */
static int redis_renew(void *state, struct dlock__renew_batch *b)
{
    struct redis_state *s = state;
    struct dlock__hold **holds = b->holds;
    size_t n = b->n;
    int *result = b->result;
    if (n == 0)
        return DLOCK_OK;
    /* A renewal must not outlive the earliest validity deadline of the
     * batch: the keeper declares holds lost at their deadline, not at the
     * end of a connect or read timeout against a server that went silent. */
    int64_t now = dlock__now_ms();
    int64_t limit = b->deadline == DLOCK__NEVER ? 0 : b->deadline - now;
    if (b->deadline != DLOCK__NEVER && limit < 10)
        limit = 10;
    struct rconn *k;
    int rc = pool_get_within(s, true, limit, &k);
    if (rc) {
        for (size_t i = 0; i < n; i++)
            result[i] = rc;
        return rc;
    }
    size_t nchunks = (n + RENEW_BATCH - 1) / RENEW_BATCH;
    size_t maxargs = 3 + 3 * RENEW_BATCH;
    const char **argv = calloc(maxargs, sizeof *argv);
    size_t *argl = calloc(maxargs, sizeof *argl);
    char (*vals)[160] = calloc(RENEW_BATCH, sizeof *vals);
    char (*leases)[24] = calloc(RENEW_BATCH, sizeof *leases);
    struct lock_keys *keys = calloc(RENEW_BATCH, sizeof *keys);
    if (!argv || !argl || !vals || !leases || !keys) {
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
        goto fail_all;
    }
    int64_t sent = dlock__now_ms();
    bool noscript = false;
    /* Append every chunk, then read every reply: one round trip. */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t c0 = 0; c0 < n; c0 += RENEW_BATCH) {
            size_t m = n - c0 < RENEW_BATCH ? n - c0 : RENEW_BATCH;
            char nk[16];
            snprintf(nk, sizeof nk, "%zu", m);
            size_t a = 0;
            argv[a] = pass ? "EVAL" : "EVALSHA";
            argl[a++] = pass ? 4 : 7;
            argv[a] = pass ? s->src[S_RENEW] : s->sha[S_RENEW];
            argl[a++] = strlen(argv[1]);
            argv[a] = nk;
            argl[a++] = strlen(nk);
            for (size_t i = 0; i < m; i++) {
                if ((rc = keys_make(s, holds[c0 + i]->name, &keys[i])))
                    goto fail_all;
                argv[a] = keys[i].lock;
                argl[a++] = keys[i].lock_len;
            }
            for (size_t i = 0; i < m; i++) {
                struct dlock__hold *h = holds[c0 + i];
                int vl = s->simple ? snprintf(vals[i], sizeof vals[i], "%s:%llu", h->owner,
                                              (unsigned long long)h->token)
                                   : snprintf(vals[i], sizeof vals[i], "%s", h->owner);
                int ll = snprintf(leases[i], sizeof leases[i], "%lld",
                                  (long long)(h->lease_ms > 0 ? h->lease_ms : s->c->opts.lease_ms));
                argv[a] = vals[i];
                argl[a++] = (size_t)vl;
                argv[a] = leases[i];
                argl[a++] = (size_t)ll;
            }
            int ok = redisAppendCommandArgv(k->ctx, (int)a, argv, argl);
            for (size_t i = 0; i < m; i++)
                keys_free(&keys[i]);
            if (ok != REDIS_OK) {
                rc = dlock__err(DLOCK_ENOMEM, "out of memory");
                goto fail_all;
            }
        }
        /* Read every reply (all must be read to keep the connection in step). */
        noscript = false;
        for (size_t ci = 0; ci < nchunks; ci++) {
            redisReply *r = NULL;
            if (redisGetReply(k->ctx, (void **)&r) != REDIS_OK || !r) {
                rc = io_error(s, k->ctx, "renew");
                pool_put(s, k, true);
                k = NULL;
                for (size_t i = ci * RENEW_BATCH; i < n; i++)
                    result[i] = rc;
                goto out;
            }
            size_t c0 = ci * RENEW_BATCH;
            size_t m = n - c0 < RENEW_BATCH ? n - c0 : RENEW_BATCH;
            if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0) {
                noscript = true;
            } else if (r->type == REDIS_REPLY_ERROR) {
                int e = server_error(s, r->str, "renew");
                for (size_t i = 0; i < m; i++)
                    result[c0 + i] = e;
            } else if (r->type != REDIS_REPLY_ARRAY || r->elements != m) {
                int e = dlock__err(DLOCK_EPROTO, "%s: renew: unexpected reply", s->where);
                for (size_t i = 0; i < m; i++)
                    result[c0 + i] = e;
            } else {
                for (size_t i = 0; i < m; i++) {
                    struct dlock__hold *h = holds[c0 + i];
                    if (r->element[i]->type == REDIS_REPLY_INTEGER && r->element[i]->integer == 1) {
                        result[c0 + i] = DLOCK_OK;
                        dlock__hold_confirmed(s->c, h, sent);
                    } else {
                        /* One message serves every hold lost in this
                         * batch, so it names the server, not the key. */
                        dlock__err(DLOCK_ELOST,
                                   "%s: renewal found lock '%s' held by another owner or gone "
                                   "(lease expired, force-released or the server lost its data)",
                                   s->where, h->name);
                        dlock__renew_result(b, c0 + i, DLOCK_ELOST);
                    }
                }
            }
            freeReplyObject(r);
        }
        if (!noscript)
            break;
        /* The server forgot the script (restart, SCRIPT FLUSH): resend as
         * EVAL, which also reloads it. */
        sent = dlock__now_ms();
    }
    rc = DLOCK_OK;
    goto out;
fail_all:
    for (size_t i = 0; i < n; i++)
        result[i] = rc;
    pool_put(s, k, true); /* commands may be half-appended */
    k = NULL;
out:
    if (k)
        pool_put(s, k, false);
    for (size_t i = 0; keys && i < RENEW_BATCH; i++)
        keys_free(&keys[i]);
    free(argv);
    free(argl);
    free(vals);
    free(leases);
    free(keys);
    return rc;
}

/* ============================================================ inspecting */

/* "<uuid>:<digits>": the shape of a Redisson / dlock hash field. */
static bool owner_field_like(const char *f, size_t len)
{
    if (len < 38)
        return false;
    for (size_t i = 0; i < 36; i++) {
        char ch = f[i];
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (ch != '-')
                return false;
        } else if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F'))) {
            return false;
        }
    }
    if (f[36] != ':')
        return false;
    for (size_t i = 37; i < len; i++)
        if (f[i] < '0' || f[i] > '9')
            return false;
    return true;
}

static int redis_inspect(void *state, const char *name, struct dlock_info *info)
{
    struct redis_state *s = state;
    struct lock_keys k;
    int rc = keys_make(s, name, &k);
    if (rc)
        return rc;
    const char *args[] = {k.lock, k.token};
    size_t lens[] = {k.lock_len, k.token_len};
    redisReply *r;
    rc = eval_script(s, false, S_INSPECT, 2, 2, args, lens, true, "inspect", &r, NULL, NULL);
    if (rc)
        goto out;
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 || r->element[0]->type != REDIS_REPLY_STRING ||
        r->element[1]->type != REDIS_REPLY_INTEGER) {
        rc = dlock__err(DLOCK_EPROTO, "%s: inspect '%s': unexpected reply", s->where, k.lock);
        goto done;
    }
    const char *type = r->element[0]->str;
    long long pttl = r->element[1]->integer;
    if ((rc = dlock__info_set_key(info, k.lock)))
        goto done;
    info->mode = DLOCK_EXCLUSIVE;
    info->nwaiters = -1;
    if (r->element[2]->type == REDIS_REPLY_STRING)
        info->token = strtoull(r->element[2]->str, NULL, 10);
    const char *want = s->simple ? "string" : "hash";
    if (strcmp(type, "none") == 0) {
        info->held = 0;
        info->ttl_ms = -1;
    } else if (strcmp(type, want) != 0) {
        rc = wrongtype(s, &k, type);
    } else {
        info->held = 1;
        info->ttl_ms = pttl >= 0 ? pttl : (pttl == -1 ? DLOCK_VALID_FOREVER : -1);
        if (s->simple) {
            if (r->elements >= 4 && r->element[3]->type == REDIS_REPLY_STRING)
                rc = dlock__info_add_holder(info, r->element[3]->str, 1);
        } else {
            for (size_t i = 3; i + 1 < r->elements && !rc; i += 2) {
                const redisReply *f = r->element[i], *v = r->element[i + 1];
                unsigned count = v->type == REDIS_REPLY_STRING ? (unsigned)strtoul(v->str, NULL, 10) : 0;
                rc = dlock__info_add_holder(info, f->str, count);
            }
        }
    }
done:
    freeReplyObject(r);
out:
    keys_free(&k);
    return rc;
}

static int redis_force_release(void *state, const char *name)
{
    struct redis_state *s = state;
    struct lock_keys k;
    int rc = keys_make(s, name, &k);
    if (rc)
        return rc;
    const char *type = s->simple ? "string" : "hash";
    const char *args[] = {k.lock, k.chan, type};
    size_t lens[] = {k.lock_len, k.chan_len, strlen(type)};
    redisReply *r;
    rc = eval_script(s, false, S_FORCE, 2, 3, args, lens, true, "force release", &r, NULL, NULL);
    if (!rc) {
        long long status;
        const char *type_name;
        rc = script_reply(s, r, &status, &type_name);
        if (!rc && type_name)
            rc = wrongtype(s, &k, type_name);
        freeReplyObject(r);
    }
    keys_free(&k);
    return rc;
}

/* Escape glob specials of the key prefix so SCAN MATCH takes it literally. */
static char *match_pattern(const char *prefix, const char *pattern)
{
    size_t pl = prefix ? strlen(prefix) : 0;
    size_t gl = pattern ? strlen(pattern) : 1;
    char *m = malloc(2 * pl + gl + 2), *p = m;
    if (!m)
        return NULL;
    for (size_t i = 0; i < pl; i++) {
        if (strchr("*?[]\\", prefix[i]))
            *p++ = '\\';
        *p++ = prefix[i];
    }
    strcpy(p, pattern ? pattern : "*");
    return m;
}

/* Whether KEY (a hash/string of the right type) looks like a lock. */
static bool key_is_lock(struct redis_state *s, redisContext *ctx, const char *key, size_t len, int *err)
{
    const char *argv[2] = {s->simple ? "GET" : "HKEYS", key};
    size_t argl[2] = {strlen(argv[0]), len};
    if (s->simple) {
        /* A string with a lease that is not one of our token keys. */
        if (len > 20 && memcmp(key, "redisson_lock_token:", 20) == 0)
            return false;
        argv[0] = "PTTL";
        argl[0] = 4;
        redisReply *r = redisCommandArgv(ctx, 2, argv, argl);
        if (!r) {
            *err = io_error(s, ctx, "list");
            return false;
        }
        bool yes = r->type == REDIS_REPLY_INTEGER && r->integer >= 0;
        freeReplyObject(r);
        return yes;
    }
    redisReply *r = redisCommandArgv(ctx, 2, argv, argl);
    if (!r) {
        *err = io_error(s, ctx, "list");
        return false;
    }
    bool yes = r->type == REDIS_REPLY_ARRAY && r->elements > 0;
    for (size_t i = 0; yes && i < r->elements; i++)
        yes = r->element[i]->type == REDIS_REPLY_STRING &&
              owner_field_like(r->element[i]->str, r->element[i]->len);
    freeReplyObject(r);
    return yes;
}

static int redis_list(void *state, const char *pattern, dlock_list_fn fn, void *arg)
{
    struct redis_state *s = state;
    struct rconn *k;
    int rc = pool_get(s, false, &k);
    if (rc)
        return rc;
    char *match = match_pattern(s->prefix, pattern);
    if (!match) {
        pool_put(s, k, false);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    size_t plen = s->prefix ? strlen(s->prefix) : 0;
    char cursor[32] = "0";
    bool stop = false, broken = false;
    do {
        redisReply *r = redisCommand(k->ctx, "SCAN %s MATCH %s COUNT 1000 TYPE %s", cursor, match,
                                     s->simple ? "string" : "hash");
        if (!r) {
            rc = io_error(s, k->ctx, "SCAN");
            broken = true;
            break;
        }
        if (r->type == REDIS_REPLY_ERROR) {
            rc = server_error(s, r->str, "SCAN");
            freeReplyObject(r);
            break;
        }
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY) {
            rc = dlock__err(DLOCK_EPROTO, "%s: SCAN: unexpected reply", s->where);
            freeReplyObject(r);
            break;
        }
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        const redisReply *keys = r->element[1];
        for (size_t i = 0; i < keys->elements && !stop && !rc; i++) {
            const redisReply *key = keys->element[i];
            if (key->type != REDIS_REPLY_STRING || key->len < plen || memchr(key->str, 0, key->len))
                continue;
            if (!key_is_lock(s, k->ctx, key->str, key->len, &rc)) {
                if (rc)
                    broken = true;
                continue;
            }
            stop = fn(key->str + plen, arg) != 0;
        }
        freeReplyObject(r);
    } while (!stop && !rc && strcmp(cursor, "0") != 0);
    free(match);
    pool_put(s, k, broken);
    return rc;
}

/* ================================================================ table */

static const char *const redis_schemes[] = {"redis", "redis+unix", NULL};

const struct dlock__backend dlock__backend_redis = {
    .version = DLOCK__BACKEND_VERSION,
    .name = "redis",
    .schemes = redis_schemes,
    .caps = DLOCK__CAP_FENCING | DLOCK__CAP_LEASES | DLOCK__CAP_LIST | DLOCK__CAP_FORCE,
    .default_port = REDIS_DEFAULT_PORT,
    .open = redis_open,
    .close = redis_close,
    .acquire = redis_acquire,
    .release = redis_release,
    .renew = redis_renew,
    .inspect = redis_inspect,
    .force_release = redis_force_release,
    .list = redis_list,
};
