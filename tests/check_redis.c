/* check_redis.c -- the Redis backend against a real redis-server.
 *
 * Every test starts its own server (tests/lib/fixture_redis.c) on a free
 * loopback port and runs in its own process with a time limit. Other
 * clients are played on the wire with raw hiredis commands: a Redisson
 * RLock/RFencedLock (hash field, PEXPIRE, the "0" message on
 * redisson_lock__channel:{name}) and a redis-py style simple lock
 * (SET NX PX, compare-and-delete). Faults are real: the server killed,
 * paused and restarted, scripts flushed, memory exhausted, wrong
 * passwords, nothing listening, and a fault-injecting proxy that loses,
 * holds back, forges or resets. The lock contract itself (reentrancy,
 * waits, fixed leases, holders killed or paused...) is tested once for
 * every backend in check_contract.c; this file keeps the Redis wire
 * layouts and protocol faults. No test asserts on time; waits are bounded
 * only so a hang fails the test.
 */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <net/if.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "dlock.h"
#include "fixture_redis.h"
#include "relay.h"
#include "testutil.h"

static struct fx_redis srv;

/* ---------------------------------------------------------------- helpers */

static void start_server(const char *const *extra)
{
    ck_assert_msg(fx_redis_start(&srv, extra), "redis-server could not be started");
}

static void stop_server(void)
{
    fx_redis_stop(&srv);
}

static char *url_with(const char *query)
{
    return tu_fmt("%s%s%s", srv.url, query && *query ? "?" : "", query ? query : "");
}

/* The server started, and its URL with options QUERY (may be NULL;
 * caller frees): the frame of the tests that open their own clients. */
static char *served_url(const char *query)
{
    start_server(NULL);
    return url_with(query);
}

/* tu_open(url_with(QUERY)), freeing the URL. */
static dlock_client *open_with(const char *query)
{
    char *url = url_with(query);
    dlock_client *c = tu_open(url);
    free(url);
    return c;
}

/* The server started, and a client of it (URL options QUERY, may be
 * NULL) with a handle on NAME: the frame of most tests here.
 * served_close() frees the handle, closes the client, stops the server. */
static struct tu_solo served_open(const char *query, const char *name)
{
    return tu_solo_open(served_url(query), name);
}

/* served_open(), the handle's lost callback recorded in LOST, and held. */
static struct tu_solo served_holding(const char *query, const char *name, struct tu_lost *lost)
{
    struct tu_solo s = served_open(query, name);
    dlock_lock_on_lost(s.l, tu_on_lost, lost);
    TU_ACQUIRE_OK(s.l, DLOCK_TRY);
    return s;
}

static void served_close(struct tu_solo *s)
{
    tu_solo_close(s);
    stop_server();
}

static redisContext *raw(void)
{
    redisContext *ctx = fx_redis_raw(&srv, NULL);
    ck_assert_msg(ctx != NULL, "raw connection to port %d failed", srv.port);
    return ctx;
}

/* The server started and a raw connection to it (to play other clients
 * on the wire or see what dlock wrote): the frame of the wire tests.
 * served_raw_close() closes the connection and stops the server. */
static redisContext *served_raw(void)
{
    start_server(NULL);
    return raw();
}

static void served_raw_close(redisContext *ctx)
{
    redisFree(ctx);
    stop_server();
}

/* served_raw() and a dlock client C of the server (URL options QUERY):
 * the frame of the wire tests where dlock plays beside another client
 * from the start. wire_close() closes both and stops the server. */
struct wire {
    redisContext *ctx;
    dlock_client *c;
};

static struct wire wire_open(const char *query)
{
    redisContext *ctx = served_raw();
    return (struct wire){ctx, open_with(query)};
}

static void wire_close(struct wire *w)
{
    dlock_client_close(w->c);
    served_raw_close(w->ctx);
}

/* The reply of a raw command (caller frees), asserting there is one. */
static redisReply *vcmd(redisContext *ctx, const char *fmt, va_list ap)
{
    redisReply *r = redisvCommand(ctx, fmt, ap);
    ck_assert_msg(r != NULL, "raw command '%s' failed: %s", fmt, ctx->errstr);
    return r;
}

static redisReply *cmd(redisContext *ctx, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = vcmd(ctx, fmt, ap);
    va_end(ap);
    return r;
}

static long long cmd_int(redisContext *ctx, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = vcmd(ctx, fmt, ap);
    va_end(ap);
    long long v = -999;
    if (r->type == REDIS_REPLY_INTEGER)
        v = r->integer;
    else if (r->type == REDIS_REPLY_STRING)
        v = strtoll(r->str, NULL, 10);
    else if (r->type == REDIS_REPLY_NIL)
        v = -1000;
    freeReplyObject(r);
    return v;
}

/* The string value of reply R (a cmd()'s), or NULL for nil (caller
 * frees); R is freed. */
static char *reply_str(redisReply *r)
{
    char *s = NULL;
    if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_ERROR)
        s = strdup(r->str);
    freeReplyObject(r);
    return s;
}

/* The number after "KEY:" in INFO SECTION of the server on CTX; -1 when
 * absent. */
static long long info_number(redisContext *ctx, const char *section, const char *key)
{
    redisReply *r = redisCommand(ctx, "INFO %s", section);
    char *field = tu_fmt("%s:", key);
    long long n = redis_info_number(r ? r->str : NULL, field);
    free(field);
    freeReplyObject(r);
    return n;
}

/* The next message SUB (subscribed) receives is PAYLOAD; SUB is closed. */
static void expect_message(redisContext *sub, const char *payload)
{
    void *msg = NULL;
    ck_assert_int_eq(redisGetReply(sub, &msg), REDIS_OK);
    redisReply *m = msg;
    ck_assert_str_eq(m->element[0]->str, "message");
    ck_assert_str_eq(m->element[2]->str, payload);
    freeReplyObject(m);
    redisFree(sub);
}

/* The N replies of commands pipelined on CTX, each asserted. */
static void drain_replies(redisContext *ctx, int n)
{
    for (int i = 0; i < n; i++) {
        void *r;
        ck_assert_int_eq(redisGetReply(ctx, &r), REDIS_OK);
        freeReplyObject(r);
    }
}

/* The count of KEY's one owner field (a lock hash beside its "mode"):
 * fails the test unless there is exactly one. */
static long long owner_count(redisContext *ctx, const char *key)
{
    redisReply *r = cmd(ctx, "HGETALL %s", key);
    long long count = -1;
    int owners = 0;
    for (size_t i = 0; i + 1 < r->elements; i += 2)
        if (strcmp(r->element[i]->str, "mode") != 0) {
            owners++;
            count = strtoll(r->element[i + 1]->str, NULL, 10);
        }
    freeReplyObject(r);
    ck_assert_int_eq(owners, 1);
    return count;
}

/* Sum of "calls=" for the script commands in INFO commandstats. */
static long long script_calls(redisContext *ctx)
{
    long long n = redis_info_script_calls(ctx);
    ck_assert_msg(n >= 0, "INFO commandstats: %s", ctx->errstr);
    return n;
}

static bool wait_flag(atomic_int *v, int timeout_ms)
{
    for (int waited = 0; waited < timeout_ms; waited += 20) {
        if (atomic_load(v))
            return true;
        tu_sleep_ms(20);
    }
    return atomic_load(v) != 0;
}

/* A socket listening on a free loopback port (*PORT). */
static int listen_loopback(int *port)
{
    return tu_listen_loopback(port, 64);
}

/* ------------------------------------------------------------- the basics */

TU_TEST(acquire_release_token_inspect, 60)
{
    start_server(NULL);
    dlock_client *c = tu_open(srv.url);
    ck_assert_str_eq(dlock_client_backend(c), "redis");
    dlock_lock *l = tu_lock(c, "jobs");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    uint64_t t1 = tu_token(l);
    ck_assert_uint_ge(t1, 1);
    ck_assert_int_gt(dlock_validity_ms(l), 0);

    redisContext *ctx = raw();
    ck_assert_int_eq(cmd_int(ctx, "HLEN jobs"), 2); /* our field and "mode" */
    ck_assert_int_eq(owner_count(ctx, "jobs"), 1);
    ck_assert_int_eq(cmd_int(ctx, "GET %s", "redisson_lock_token:{jobs}"), (long long)t1);
    ck_assert_int_gt(cmd_int(ctx, "PTTL jobs"), 0);

    dlock_info *info = NULL;
    ck_assert_int_eq(dlock_inspect(c, "jobs", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_held(info), 1);
    ck_assert_uint_eq(dlock_info_token(info), t1);
    ck_assert_int_gt(dlock_info_ttl_ms(info), 0);
    ck_assert_str_eq(dlock_info_key(info), "jobs");
    ck_assert_uint_eq(dlock_info_holder_count(info), 1);
    unsigned count = 0;
    const char *who = dlock_info_holder(info, 0, &count);
    ck_assert_uint_eq(count, 1);
    ck_assert_int_eq(strlen(who) > 37 && who[36] == ':', 1);
    dlock_info_free(info);

    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    ck_assert_int_eq(cmd_int(ctx, "EXISTS jobs"), 0);
    ck_assert_int_eq(dlock_release(l), DLOCK_ENOTOWNER);

    TU_ACQUIRE_OK(l, DLOCK_TRY);
    ck_assert_uint_gt(tu_token(l), t1);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);

    ck_assert_int_eq(dlock_inspect(c, "jobs", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_held(info), 0);
    ck_assert_uint_eq(dlock_info_token(info), t1 + 1);
    dlock_info_free(info);
    redisFree(ctx);
    dlock_lock_free(l);
    dlock_client_close(c);
    stop_server();
}

struct waiter_arg {
    dlock_lock *l;
    int64_t wait_ms;
    int rc;
    uint64_t token;
    bool release;         /* release at once after acquiring */
    atomic_int *go;       /* or: release once *go is set (holds are per thread) */
    atomic_int acquired;
    int release_rc;
};

static void *waiter_main(void *p)
{
    struct waiter_arg *a = p;
    a->rc = dlock_acquire(a->l, a->wait_ms);
    if (a->rc == DLOCK_OK) {
        dlock_token(a->l, &a->token);
        atomic_store(&a->acquired, 1);
        if (a->go)
            while (!atomic_load(a->go))
                tu_sleep_ms(5);
        if (a->release || a->go)
            a->release_rc = dlock_release(a->l);
    }
    return NULL;
}

/* Threads of one process are distinct owners ("<uuid>:<tid>"), and a
 * release wakes a waiting thread through the subscriber connection. */
TU_TEST(thread_waits_for_thread, 60)
{
    struct tu_solo s = served_open("lease=60s", "t");
    TU_ACQUIRE_OK(s.l, DLOCK_TRY);
    struct waiter_arg a = {.l = s.l, .wait_ms = 20000, .rc = -99, .release = true};
    pthread_t th;
    pthread_create(&th, NULL, waiter_main, &a);
    redisContext *ctx = raw();
    /* Wait until the waiter subscribed, then release: with a 60 s lease
     * only the release message can wake it within its 20 s wait. */
    for (int i = 0; i < 500 && cmd_int(ctx, "PUBSUB NUMSUB %s", "redisson_lock__channel:{t}") != 1; i++)
        tu_sleep_ms(10);
    ck_assert_int_eq(dlock_release(s.l), DLOCK_OK);
    pthread_join(th, NULL);
    ck_assert_msg(a.rc == DLOCK_OK, "waiter: %s", dlock_err_name(a.rc));
    ck_assert_uint_gt(a.token, 0);
    redisFree(ctx);
    served_close(&s);
}

static long long numsub(redisContext *ctx, const char *chan)
{
    redisReply *r = cmd(ctx, "PUBSUB NUMSUB %s", chan);
    long long n = -1;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[1]->type == REDIS_REPLY_INTEGER)
        n = r->element[1]->integer;
    freeReplyObject(r);
    return n;
}

static void wait_numsub(redisContext *ctx, const char *chan, long long want)
{
    for (int i = 0; i < 1000 && numsub(ctx, chan) != want; i++)
        tu_sleep_ms(10);
    ck_assert_int_eq(numsub(ctx, chan), want);
}

TU_TEST(cancel_a_wait, 60)
{
    start_server(NULL);
    dlock_client *c = open_with("lease=60s");
    dlock_client *c2 = tu_open(srv.url);
    dlock_lock *l = tu_lock(c, "cx"), *l2 = tu_lock(c2, "cx");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    struct waiter_arg a = {.l = l2, .wait_ms = DLOCK_FOREVER, .rc = -99};
    pthread_t th;
    pthread_create(&th, NULL, waiter_main, &a);
    redisContext *ctx = raw();
    wait_numsub(ctx, "redisson_lock__channel:{cx}", 1);
    ck_assert_int_eq(dlock_lock_cancel(l2), DLOCK_OK);
    pthread_join(th, NULL);
    ck_assert_int_eq(a.rc, DLOCK_ECANCELED);
    ck_assert_uint_eq(dlock_hold_count(l2), 0);
    /* the subscription goes away with the last waiter */
    wait_numsub(ctx, "redisson_lock__channel:{cx}", 0);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    redisFree(ctx);
    TU_FREE_LOCKS(l, l2);
    TU_CLOSE_CLIENTS(c, c2);
    stop_server();
}

/* Threads of one client and of two clients fight over one name: never
 * two inside, nobody stuck. Exercises the subscriber's subscribe /
 * unsubscribe churn (waiters join and leave all the time). */
TU_TEST(threads_fight_over_one_name, 60)
{
    enum { T = 8, ROUNDS = 150 };
    start_server(NULL);
    dlock_client *c1 = tu_open(srv.url), *c2 = tu_open(srv.url);
    dlock_lock *l1 = tu_lock(c1, "fight"), *l2 = tu_lock(c2, "fight");
    TU_ACQUIRE_OK(l1, DLOCK_TRY); /* the counter starts from the server's clock */
    uint64_t t0 = tu_token(l1);
    ck_assert_int_eq(dlock_release(l1), DLOCK_OK);
    tu_exclusion_run((dlock_lock *[]){l2, l1}, 2, T, ROUNDS, 30000);
    redisContext *ctx = raw();
    ck_assert_int_eq(cmd_int(ctx, "GET %s", "redisson_lock_token:{fight}"), (long long)t0 + T * ROUNDS);
    wait_numsub(ctx, "redisson_lock__channel:{fight}", 0);
    redisFree(ctx);
    TU_FREE_LOCKS(l1, l2);
    TU_CLOSE_CLIENTS(c1, c2);
    stop_server();
}

/* Many threads of one client wait on one name: each release wakes one of
 * them, not the herd. Counted on the server: script calls per hand-off. */
TU_TEST(one_waiter_woken_per_release, 60)
{
    enum { T = 8 };
    char *url = served_url("lease=60s");
    dlock_client *holder = tu_open(url), *c = tu_open(url);
    dlock_lock *hl = tu_lock(holder, "herd"), *l = tu_lock(c, "herd");
    TU_ACQUIRE_OK(hl, DLOCK_TRY);
    redisContext *ctx = raw();
    long long before = script_calls(ctx);
    struct waiter_arg a[T];
    pthread_t th[T];
    for (int i = 0; i < T; i++) {
        a[i] = (struct waiter_arg){.l = l, .wait_ms = 30000, .rc = -99, .release = true};
        pthread_create(&th[i], NULL, waiter_main, &a[i]);
    }
    wait_numsub(ctx, "redisson_lock__channel:{herd}", 1);
    /* every waiter past its two tries (before and after subscribing), asleep */
    for (int i = 0; i < 2000 && script_calls(ctx) < before + 2 * T; i++)
        tu_sleep_ms(10);
    ck_assert_int_ge(script_calls(ctx), before + 2 * T);
    freeReplyObject(cmd(ctx, "CONFIG RESETSTAT"));
    ck_assert_int_eq(dlock_release(hl), DLOCK_OK);
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        ck_assert_msg(a[i].rc == DLOCK_OK, "waiter %d: %s", i, dlock_err_name(a[i].rc));
    }
    /* T hand-offs: T acquires + T releases, plus the odd retry; a herd
     * would cost about T * T / 2 acquire tries */
    long long calls = script_calls(ctx);
    fprintf(stderr, "one_waiter_woken_per_release: %lld script calls for %d hand-offs\n", calls, T);
    ck_assert_msg(calls < 3 * T, "%lld script calls for %d hand-offs", calls, T);
    redisFree(ctx);
    TU_FREE_LOCKS(hl, l);
    TU_CLOSE_CLIENTS(holder, c);
    free(url);
    stop_server();
}

/* ----------------------------------------------------- interoperability */

/* Redisson's RPermitExpirableSemaphore, its scripts played on the wire
 * (trySetPermits, tryAcquire with a lease, tryRelease, availablePermits,
 * getPermits): dlock and Redisson share the permits of one name, wake
 * each other, and a Redisson permit whose lease ended comes back to
 * dlock; a count Redisson stored is the count dlock must use. */
static const char REDISSON_SEM_TRY_ACQUIRE[] =
    "local expiredIds = redis.call('zrangebyscore', KEYS[2], 0, ARGV[3], 'limit', 0, ARGV[1]); "
    "if #expiredIds > 0 then redis.call('zrem', KEYS[2], unpack(expiredIds)); "
    "local value = redis.call('incrby', KEYS[1], #expiredIds); "
    "if tonumber(value) > 0 then redis.call(ARGV[5], KEYS[3], value); end; end; "
    "local value = redis.call('get', KEYS[1]); "
    "if (value ~= false and tonumber(value) >= tonumber(ARGV[1])) then "
    "redis.call('decrby', KEYS[1], ARGV[1]); "
    "for i = 6, #ARGV, 1 do redis.call('zadd', KEYS[2], ARGV[2], ARGV[i]); end; "
    "return 'OK'; end; "
    "local v = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES'); "
    "if v[1] ~= nil and v[2] ~= ARGV[4] then return ':' .. tostring(v[2]); end return nil;";
static const char REDISSON_SEM_TRY_RELEASE[] =
    "local expire = redis.call('zscore', KEYS[3], ARGV[1]);"
    "local removed = redis.call('zrem', KEYS[3], ARGV[1]);"
    "if tonumber(removed) ~= 1 then return 0; end;"
    "local value = redis.call('incrby', KEYS[1], ARGV[2]); redis.call(ARGV[4], KEYS[2], value); "
    "if tonumber(expire) <= tonumber(ARGV[3]) then return 0; end; return 1;";
static const char REDISSON_SEM_TRY_SET_PERMITS[] =
    "local value = redis.call('get', KEYS[1]); "
    "if (value == false) then redis.call('set', KEYS[1], ARGV[1]); "
    "redis.call(ARGV[2], KEYS[2], ARGV[1]); return 1; end; return 0;";
static const char REDISSON_SEM_GET_PERMITS[] =
    "local available = redis.call('get', KEYS[1]); if available == false then return 0 end;"
    "local acquired = redis.call('zcount', KEYS[2], 0, '+inf'); "
    "return tonumber(available) + acquired;";

static long long wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Redisson's tryAcquire of one permit with id ID (16 raw bytes) and a
 * lease of LEASE_MS: "OK" when taken. */
static bool redisson_sem_acquire(redisContext *ctx, const char *name, const char *id,
                                 long long lease_ms)
{
    long long now = wall_ms();
    redisReply *r = cmd(ctx, "EVAL %s 3 %s {%s}:timeout redisson_sc:{%s} 1 %lld %lld 922337203685477 publish %b",
                        REDISSON_SEM_TRY_ACQUIRE, name, name, name, now + lease_ms, now, id, (size_t)16);
    bool ok = r->type == REDIS_REPLY_STATUS || (r->type == REDIS_REPLY_STRING && strcmp(r->str, "OK") == 0);
    freeReplyObject(r);
    return ok;
}

TU_TEST(redisson_semaphore_on_the_wire, 60)
{
    struct wire w = wire_open("lease=30s");
    dlock_semaphore *s = tu_semaphore(w.c, "pool", 2);
    dlock_permit *mine = tu_permit(s, 1, DLOCK_TRY);
    /* Redisson sees a semaphore of 2 permits, 1 free, and takes it. */
    ck_assert_int_eq(cmd_int(w.ctx, "EVAL %s 2 pool {pool}:timeout", REDISSON_SEM_GET_PERMITS), 2);
    ck_assert_int_eq(cmd_int(w.ctx, "GET pool"), 1);
    const char *rid = "\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10";
    ck_assert(redisson_sem_acquire(w.ctx, "pool", rid, 60000));
    tu_sem_full(w.c, s, "pool", 2, 2);
    /* Redisson's release wakes a dlock waiter (its message on
     * redisson_sc:{pool}). */
    struct tu_sem_taker t;
    tu_sem_taker_start(&t, s, 1, 20000, NULL);
    wait_numsub(w.ctx, "redisson_sc:{pool}", 1);
    ck_assert_int_eq(cmd_int(w.ctx, "EVAL %s 3 pool redisson_sc:{pool} {pool}:timeout %b 1 %lld publish",
                             REDISSON_SEM_TRY_RELEASE, rid, (size_t)16, wall_ms()),
                     1);
    ck_assert_int_eq(tu_sem_taker_join(&t), DLOCK_OK);
    /* dlock's release gives Redisson its permit back, and tells it. */
    redisContext *sub = raw();
    freeReplyObject(cmd(sub, "SUBSCRIBE redisson_sc:{pool}"));
    ck_assert_int_eq(dlock_permit_release(mine), DLOCK_OK);
    expect_message(sub, "2");
    /* A Redisson holder that dies: its permits (a 300 ms lease) come
     * back to a dlock waiter once the lease has ended. */
    ck_assert(redisson_sem_acquire(w.ctx, "pool", "AAAAAAAAAAAAAAAA", 300));
    ck_assert(redisson_sem_acquire(w.ctx, "pool", "BBBBBBBBBBBBBBBB", 300));
    dlock_permit *p = tu_permit(s, 2, 20000);
    ck_assert_int_eq(cmd_int(w.ctx, "EVAL %s 2 pool {pool}:timeout", REDISSON_SEM_GET_PERMITS), 2);
    ck_assert_int_eq(dlock_permit_release(p), DLOCK_OK);
    /* The count Redisson set (trySetPermits 5) is the count. */
    ck_assert_int_eq(cmd_int(w.ctx, "EVAL %s 2 five redisson_sc:{five} 5 publish",
                             REDISSON_SEM_TRY_SET_PERMITS), 1);
    dlock_semaphore *s3 = tu_semaphore(w.c, "five", 3);
    ck_assert_int_eq(dlock_semaphore_acquire(s3, 1, DLOCK_TRY, NULL, &p), DLOCK_EINVAL);
    ck_assert_msg(strstr(dlock_errmsg(), "has 5 permits") && strstr(dlock_errmsg(), "not 3"),
                  "%s", dlock_errmsg());
    dlock_semaphore_free(s3);
    dlock_semaphore_free(s);
    wire_close(&w);
}

/* Play a Redisson client on the wire: its hash field, PEXPIRE, and the "0"
 * message on full release; and see that it observes dlock the same way. */
TU_TEST(redisson_on_the_wire, 60)
{
    redisContext *ctx = served_raw();
    const char *redisson = "6f0b9c2e-1d1a-4c55-8a0e-2b8f3c9d7e11:1";
    /* Redisson RFencedLock takes "orders" (lease 60 s, renewed by its
     * watchdog; we simply never let it expire within the test). */
    freeReplyObject(cmd(ctx, "INCR %s", "redisson_lock_token:{orders}"));
    freeReplyObject(cmd(ctx, "HINCRBY orders %s 1", redisson));
    freeReplyObject(cmd(ctx, "PEXPIRE orders 60000"));

    dlock_client *c = tu_open(srv.url);
    dlock_lock *l = tu_lock(c, "orders");
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_EBUSY);
    dlock_info *info = NULL;
    ck_assert_int_eq(dlock_inspect(c, "orders", &info), DLOCK_OK);
    unsigned count = 0;
    ck_assert_str_eq(dlock_info_holder(info, 0, &count), redisson);
    ck_assert_uint_eq(count, 1);
    ck_assert_uint_eq(dlock_info_token(info), 1);
    dlock_info_free(info);

    atomic_int go = 0;
    struct waiter_arg a = {.l = l, .wait_ms = 20000, .rc = -99, .go = &go};
    pthread_t th;
    pthread_create(&th, NULL, waiter_main, &a);
    wait_numsub(ctx, "redisson_lock__channel:{orders}", 1);
    /* Redisson's unlock: count to 0, DEL, PUBLISH 0. */
    freeReplyObject(cmd(ctx, "DEL orders"));
    freeReplyObject(cmd(ctx, "PUBLISH %s 0", "redisson_lock__channel:{orders}"));
    ck_assert_msg(wait_flag(&a.acquired, 20000), "not woken by Redisson's message");
    ck_assert_msg(a.rc == DLOCK_OK, "woken by Redisson's message: %s", dlock_err_name(a.rc));
    /* Redisson's counter (1) is below any clock seed: dlock goes on from
     * the server's clock, on the same counter */
    ck_assert_uint_gt(a.token, 1000000000000000ull);
    ck_assert_int_eq(cmd_int(ctx, "GET %s", "redisson_lock_token:{orders}"), (long long)a.token);

    /* Now Redisson tries: its acquire script sees another owner and gets
     * the remaining TTL instead of nil. */
    const char *try_script =
        "if ((redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then "
        "redis.call('incr', KEYS[2]); redis.call('hincrby', KEYS[1], ARGV[2], 1); "
        "redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; "
        "return redis.call('pttl', KEYS[1]);";
    redisReply *r = cmd(ctx, "EVAL %s 2 orders %s 30000 %s", try_script, "redisson_lock_token:{orders}",
                        redisson);
    ck_assert_int_eq(r->type, REDIS_REPLY_INTEGER);
    ck_assert_int_gt(r->integer, 0);
    freeReplyObject(r);

    /* Redisson's waiter subscribes; dlock's release must send it "0". */
    redisContext *sub = raw();
    freeReplyObject(cmd(sub, "SUBSCRIBE %s", "redisson_lock__channel:{orders}"));
    atomic_store(&go, 1);
    pthread_join(th, NULL);
    ck_assert_int_eq(a.release_rc, DLOCK_OK);
    void *msg = NULL;
    ck_assert_int_eq(redisGetReply(sub, &msg), REDIS_OK);
    r = msg;
    ck_assert_int_eq(r->type, REDIS_REPLY_ARRAY);
    ck_assert_str_eq(r->element[0]->str, "message");
    ck_assert_str_eq(r->element[2]->str, "0");
    freeReplyObject(r);
    r = cmd(ctx, "EVAL %s 2 orders %s 30000 %s", try_script, "redisson_lock_token:{orders}", redisson);
    ck_assert_int_eq(r->type, REDIS_REPLY_NIL); /* Redisson acquired */
    freeReplyObject(r);
    ck_assert_int_eq(cmd_int(ctx, "GET %s", "redisson_lock_token:{orders}"), (long long)a.token + 1);
    redisFree(sub);
    dlock_lock_free(l);
    dlock_client_close(c);
    served_raw_close(ctx);
}

/* A Redisson RReadWriteLock client played on the wire: the scripts below
 * do what RedissonReadLock and RedissonWriteLock do to the keys (the hash
 * with "mode", the reader's "{name}:<id>:rwlock_timeout:<n>" keys, the
 * writer's "<id>:write" field, "0" / "1" on "redisson_rwlock:{name}"),
 * written for this test. KEYS: the lock, Redisson's timeout prefix
 * "{name}:<id>:rwlock_timeout", the channel. ARGV: lease ms, <id>.
 * Acquires return nil when taken, else the PTTL; releases 1 or nil. */
static const char *const redisson_rw[] = {
    /* read lock */
    "local mode = redis.call('hget', KEYS[1], 'mode') "
    "if mode == false or mode == 'read' or "
    "   (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2] .. ':write') == 1) then "
    "  if mode == false then redis.call('hset', KEYS[1], 'mode', 'read') end "
    "  local n = redis.call('hincrby', KEYS[1], ARGV[2], 1) "
    "  redis.call('set', KEYS[2] .. ':' .. n, 1, 'px', ARGV[1]) "
    "  redis.call('pexpire', KEYS[1], math.max(redis.call('pttl', KEYS[1]), ARGV[1])) "
    "  return nil end "
    "return redis.call('pttl', KEYS[1])",
    /* write lock */
    "local mode = redis.call('hget', KEYS[1], 'mode') "
    "local w = ARGV[2] .. ':write' "
    "if mode == false or (mode == 'write' and redis.call('hexists', KEYS[1], w) == 1) then "
    "  redis.call('hset', KEYS[1], 'mode', 'write') redis.call('hincrby', KEYS[1], w, 1) "
    "  redis.call('pexpire', KEYS[1], ARGV[1]) return nil end "
    "return redis.call('pttl', KEYS[1])",
    /* read unlock (one reader of Redisson's, the others' timeout keys
     * looked at as Redisson does) */
    "if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then return nil end "
    "local n = redis.call('hincrby', KEYS[1], ARGV[2], -1) "
    "if n == 0 then redis.call('hdel', KEYS[1], ARGV[2]) end "
    "redis.call('del', KEYS[2] .. ':' .. (n + 1)) "
    "local base = string.sub(KEYS[2], 1, string.find(KEYS[2], ':', 1, true) - 1) "
    "local remain = -3 "
    "for _, f in ipairs(redis.call('hkeys', KEYS[1])) do "
    "  local c = tonumber(redis.call('hget', KEYS[1], f)) "
    "  if c then for i = c, 1, -1 do "
    "    remain = math.max(remain, redis.call('pttl', base .. ':' .. f .. ':rwlock_timeout:' .. i)) "
    "  end end end "
    "if remain > 0 then redis.call('pexpire', KEYS[1], remain) return 1 end "
    "if redis.call('hget', KEYS[1], 'mode') == 'write' then return 1 end "
    "redis.call('del', KEYS[1]) redis.call('publish', KEYS[3], '0') return 1",
    /* write unlock */
    "local w = ARGV[2] .. ':write' "
    "if redis.call('hexists', KEYS[1], w) == 0 then return nil end "
    "if redis.call('hincrby', KEYS[1], w, -1) > 0 then return 1 end "
    "redis.call('hdel', KEYS[1], w) "
    "if redis.call('hlen', KEYS[1]) == 1 then "
    "  redis.call('del', KEYS[1]) redis.call('publish', KEYS[3], '1') "
    "else redis.call('hset', KEYS[1], 'mode', 'read') end "
    "return 1",
};
enum { RS_READ, RS_WRITE, RS_READ_UNLOCK, RS_WRITE_UNLOCK };

/* Run Redisson's OP on lock NAME as owner ID: 1 = taken or released, 0 =
 * busy (its script answered a PTTL) or not released. */
static int redisson_rw_op(redisContext *ctx, int op, const char *name, const char *id)
{
    char *tprefix = tu_fmt("{%s}:%s:rwlock_timeout", name, id);
    char *chan = tu_fmt("redisson_rwlock:{%s}", name);
    redisReply *r = cmd(ctx, "EVAL %s 3 %s %s %s 60000 %s", redisson_rw[op], name, tprefix, chan,
                        id);
    ck_assert_msg(r->type != REDIS_REPLY_ERROR, "Redisson's script: %s", r->str);
    int done = op < RS_READ_UNLOCK ? r->type == REDIS_REPLY_NIL : r->type == REDIS_REPLY_INTEGER;
    freeReplyObject(r);
    free(chan);
    free(tprefix);
    return done;
}

static void expect_mode(redisContext *ctx, const char *name, const char *want)
{
    char *mode = reply_str(cmd(ctx, "HGET %s mode", name));
    ck_assert_msg(mode && strcmp(mode, want) == 0, "mode of %s: %s, not %s", name,
                  mode ? mode : "(nil)", want);
    free(mode);
}

/* Start a thread that waits (up to 20 s) for the lock through L and
 * releases it at once; return once it is subscribed to CHAN (one more
 * subscriber there than before). */
static void wait_then_release(redisContext *ctx, struct waiter_arg *a, pthread_t *th, dlock_lock *l,
                              const char *chan)
{
    long long before = numsub(ctx, chan);
    *a = (struct waiter_arg){.l = l, .wait_ms = 20000, .rc = -99, .release = true};
    pthread_create(th, NULL, waiter_main, a);
    wait_numsub(ctx, chan, before + 1);
}

/* Acquire scripts of lock NAME the server ran (MONITOR on MON) after
 * the first script call naming AFTER, until a PING sent now. */
static int acquires_after(redisContext *mon, const char *name, const char *after)
{
    redisContext *marker = raw();
    freeReplyObject(cmd(marker, "PING")); /* everything before it is in */
    redisFree(marker);
    char *canceled = tu_fmt("\"dlock_canceled:{%s}\"", name); /* an acquire's own key */
    int n = 0;
    bool seen = false;
    for (bool end = false; !end;) {
        redisReply *r = NULL;
        ck_assert_int_eq(redisGetReply(mon, (void **)&r), REDIS_OK);
        end = r->type == REDIS_REPLY_STATUS && strstr(r->str, "\"PING\"");
        if (r->type == REDIS_REPLY_STATUS) {
            n += seen && strstr(r->str, "\"EVALSHA\"") && strstr(r->str, canceled);
            seen = seen || strstr(r->str, after);
        }
        freeReplyObject(r);
    }
    free(canceled);
    return n;
}

/* Redisson's read-write unlocks publish on "redisson_rwlock:{N}" only
 * ("0" read, "1" write), never on RLock's channel: a waiting dlock writer
 * listens there too, so it is woken by the message. Its wait (20 s) ends
 * before the holder's lease (60 s) could wake it through the TTL's safety
 * net, and after the unlock it tries once (MONITOR: one acquire script),
 * so the message woke it, nothing polled; before, it slept until the TTL
 * and timed out. */
TU_TEST(redisson_rw_unlock_wakes_writer, 90)
{
    struct wire w = wire_open("lease=60s");
    const char *rid = "9a1c4e2f-7b3d-4e8a-9c1f-5d2e8b7a6c40:3";
    dlock_lock *wr = tu_lock(w.c, "rwk");
    for (int op = RS_READ; op <= RS_WRITE; op++) {
        ck_assert(redisson_rw_op(w.ctx, op, "rwk", rid));
        struct waiter_arg a;
        pthread_t th;
        wait_then_release(w.ctx, &a, &th, wr, "redisson_lock__channel:{rwk}");
        redisContext *mon = raw();
        freeReplyObject(cmd(mon, "MONITOR"));
        ck_assert(redisson_rw_op(w.ctx, op == RS_READ ? RS_READ_UNLOCK : RS_WRITE_UNLOCK, "rwk",
                                 rid));
        pthread_join(th, NULL);
        ck_assert_msg(a.rc == DLOCK_OK, "dlock's writer after Redisson's %s unlock: %s",
                      op == RS_READ ? "read" : "write", dlock_err_name(a.rc));
        ck_assert_int_eq(a.release_rc, DLOCK_OK);
        int tries = acquires_after(mon, "rwk", "\"redisson_rwlock:{rwk}\"");
        ck_assert_msg(tries == 1, "%d acquire tries after Redisson's unlock, not 1", tries);
        redisFree(mon);
        /* the waiter's channel unsubscribed (the hub does it after the
         * waiter left): the next round counts its waiter from 0 (it read
         * 1 here once, then saw the unsubscribe and its own subscribe) */
        wait_numsub(w.ctx, "redisson_lock__channel:{rwk}", 0);
    }
    dlock_lock_free(wr);
    wire_close(&w);
}

/* Redisson's RReadWriteLock and dlock on one name: readers of both share,
 * a writer of either excludes every reader and writer of the other, and
 * each one's release wakes the other's readers on "redisson_rwlock:{N}". */
TU_TEST(redisson_rwlock_on_the_wire, 60)
{
    struct wire w = wire_open("lease=60s");
    const char *rid = "6f0b9c2e-1d1a-4c55-8a0e-2b8f3c9d7e11:7";
    dlock_lock *rd = tu_lock_mode(w.c, "docs", DLOCK_SHARED, 0), *wr = tu_lock(w.c, "docs");
    dlock_info *info = NULL;

    /* A Redisson reader: dlock's readers share, its writer waits. */
    ck_assert(redisson_rw_op(w.ctx, RS_READ, "docs", rid));
    TU_ACQUIRE_OK(rd, DLOCK_TRY);
    ck_assert_int_eq(cmd_int(w.ctx, "PTTL {docs}:%s:rwlock_timeout:1", rid) > 0, 1);
    ck_assert_int_eq(cmd_int(w.ctx, "HLEN docs"), 3); /* mode, Redisson's reader, ours */
    ck_assert_int_eq(dlock_inspect(w.c, "docs", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_mode(info), DLOCK_SHARED);
    ck_assert_uint_eq(dlock_info_holder_count(info), 2);
    dlock_info_free(info);
    struct waiter_arg a;
    pthread_t th;
    a = (struct waiter_arg){.l = wr, .wait_ms = DLOCK_TRY, .rc = -99};
    pthread_create(&th, NULL, waiter_main, &a); /* this thread reads: try from another */
    pthread_join(th, NULL);
    ck_assert_int_eq(a.rc, DLOCK_EBUSY);
    ck_assert_int_eq(dlock_release(rd), DLOCK_OK);
    expect_mode(w.ctx, "docs", "read"); /* Redisson still reads */
    ck_assert_int_eq(dlock_acquire(wr, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert(redisson_rw_op(w.ctx, RS_READ_UNLOCK, "docs", rid));
    ck_assert_int_eq(cmd_int(w.ctx, "EXISTS docs"), 0);

    /* dlock's writer: Redisson's reader and writer get the PTTL; dlock's
     * release wakes Redisson's subscriber ("1" on its channel, as its own
     * write unlock says: every reader may come in). */
    TU_ACQUIRE_OK(wr, DLOCK_TRY);
    uint64_t tw = tu_token(wr);
    ck_assert(!redisson_rw_op(w.ctx, RS_READ, "docs", rid));
    ck_assert(!redisson_rw_op(w.ctx, RS_WRITE, "docs", rid));
    redisContext *sub = raw();
    freeReplyObject(cmd(sub, "SUBSCRIBE %s", "redisson_rwlock:{docs}"));
    ck_assert_int_eq(dlock_release(wr), DLOCK_OK);
    expect_message(sub, "1");

    /* dlock's reader: Redisson's writer is busy, its reader shares. */
    TU_ACQUIRE_OK(rd, DLOCK_TRY);
    ck_assert_uint_gt(tu_token(rd), tw); /* the one counter */
    ck_assert(!redisson_rw_op(w.ctx, RS_WRITE, "docs", rid));
    ck_assert(redisson_rw_op(w.ctx, RS_READ, "docs", rid));
    ck_assert(redisson_rw_op(w.ctx, RS_READ_UNLOCK, "docs", rid));
    ck_assert(!redisson_rw_op(w.ctx, RS_WRITE, "docs", rid)); /* we still read */
    ck_assert_int_eq(dlock_release(rd), DLOCK_OK);
    ck_assert_int_eq(cmd_int(w.ctx, "EXISTS docs"), 0);

    /* Redisson's writer: dlock's reader and writer are busy; a dlock
     * reader waiting is woken by Redisson's write unlock ("1"). */
    ck_assert(redisson_rw_op(w.ctx, RS_WRITE, "docs", rid));
    ck_assert_int_eq(dlock_acquire(rd, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_int_eq(dlock_acquire(wr, DLOCK_TRY), DLOCK_EBUSY);
    wait_then_release(w.ctx, &a, &th, rd, "redisson_rwlock:{docs}");
    ck_assert(redisson_rw_op(w.ctx, RS_WRITE_UNLOCK, "docs", rid));
    pthread_join(th, NULL);
    ck_assert_msg(a.rc == DLOCK_OK, "dlock's reader after Redisson's write unlock: %s",
                  dlock_err_name(a.rc));

    /* Redisson's downgrade (write, read, unlock the write) leaves a read
     * lock: dlock's reader comes in, its writer does not. */
    ck_assert(redisson_rw_op(w.ctx, RS_WRITE, "docs", rid));
    ck_assert(redisson_rw_op(w.ctx, RS_READ, "docs", rid));
    ck_assert(redisson_rw_op(w.ctx, RS_WRITE_UNLOCK, "docs", rid));
    tu_acquire_release(rd, DLOCK_TRY);
    ck_assert_int_eq(dlock_acquire(wr, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert(redisson_rw_op(w.ctx, RS_READ_UNLOCK, "docs", rid));

    /* dlock's downgrade, seen by Redisson: mode "read", our field a
     * reader's with its timeout key; Redisson's reader comes in, its
     * writer does not. */
    TU_ACQUIRE_OK(wr, DLOCK_TRY);
    TU_ACQUIRE_OK(rd, DLOCK_TRY);
    ck_assert_int_eq(dlock_release(wr), DLOCK_OK);
    expect_mode(w.ctx, "docs", "read");
    ck_assert(redisson_rw_op(w.ctx, RS_READ, "docs", rid));
    ck_assert(!redisson_rw_op(w.ctx, RS_WRITE, "docs", rid));
    ck_assert(redisson_rw_op(w.ctx, RS_READ_UNLOCK, "docs", rid));
    ck_assert_int_eq(dlock_release(rd), DLOCK_OK);
    ck_assert_int_eq(cmd_int(w.ctx, "EXISTS docs"), 0);

    TU_FREE_LOCKS(wr, rd);
    wire_close(&w);
}

/* Every reader of one client waiting behind a writer comes in when the
 * writer releases (within their 20 s waits, the writer's lease being
 * 60 s): the release must wake every reader waiting on the read-write
 * channel, not one per client. */
TU_TEST(readers_of_one_client_all_woken, 60)
{
    redisContext *ctx = served_raw();
    dlock_client *w = open_with("lease=60s"), *r = open_with("lease=60s");
    dlock_lock *wl = tu_lock(w, "many");
    TU_ACQUIRE_OK(wl, DLOCK_TRY);
    struct tu_waiter rd[3];
    dlock_lock *rl[3];
    for (int i = 0; i < 3; i++) {
        rl[i] = tu_lock_mode(r, "many", DLOCK_SHARED, 0);
        tu_waiter_start_ex(&rd[i], rl[i], 20000, NULL, true); /* they keep it: side by side */
    }
    wait_numsub(ctx, "redisson_rwlock:{many}", 1);
    for (int i = 0; i < 3; i++)
        ck_assert(tu_wait_thread_asleep(&rd[i].tid, 10000));
    ck_assert_int_eq(dlock_release(wl), DLOCK_OK);
    for (int i = 0; i < 3; i++) {
        int rc = tu_waiter_join(&rd[i]);
        ck_assert_msg(rc == DLOCK_OK, "reader %d: %s", i, dlock_err_name(rc));
    }
    ck_assert_int_eq(cmd_int(ctx, "HLEN many"), 4); /* mode and three readers */
    for (int i = 0; i < 3; i++)
        dlock_lock_free(rl[i]); /* releases the thread's hold: best effort */
    dlock_lock_free(wl);
    TU_CLOSE_CLIENTS(r, w);
    served_raw_close(ctx);
}

/* How many reader timeout keys of lock NAME exist. */
static long long timeout_keys(redisContext *ctx, const char *name)
{
    redisReply *r = cmd(ctx, "KEYS {%s}:*:rwlock_timeout:*", name);
    long long n = r->type == REDIS_REPLY_ARRAY ? (long long)r->elements : -1;
    freeReplyObject(r);
    return n;
}

/* A reader killed with -9 while another reads: its timeout key ends with
 * its lease (the live reader renews only its own, not every reader's as
 * Redisson's watchdog does), so when the live reader leaves, the lock is
 * free at once for a writer -- the dead reader's field does not hold it. */
TU_TEST(killed_reader_among_readers_expires, 60)
{
    start_server(NULL);
    char *dir = tu_tmpdir("redis-rw-kill"), *held = tu_fmt("%s/held", dir);
    char *url = tu_fmt("%s?lease=1500ms", srv.url);
    dlock_lock *l = NULL;
    pid_t child = tu_fork_holding(url, "dead", DLOCK_SHARED, 10000, &l);
    if (child == 0) {
        tu_write_marker(held, "1");
        for (;;)
            pause();
    }
    ck_assert_msg(tu_wait_file(held, 30000), "the child never read");
    redisContext *ctx = raw();
    dlock_client *c = open_with("lease=60s");
    dlock_lock *r = tu_lock_mode(c, "dead", DLOCK_SHARED, 0), *w = tu_lock(c, "dead");
    TU_ACQUIRE_OK(r, DLOCK_TRY);
    ck_assert_int_eq(timeout_keys(ctx, "dead"), 2);
    kill(child, SIGKILL);
    tu_wait_exit(child);
    for (int i = 0; i < 3000 && timeout_keys(ctx, "dead") != 1; i++)
        tu_sleep_ms(10); /* the dead reader's lease runs out; ours is renewed */
    ck_assert_int_eq(timeout_keys(ctx, "dead"), 1);
    ck_assert_int_eq(cmd_int(ctx, "HLEN dead"), 3); /* its field stays meanwhile */
    ck_assert_int_eq(dlock_release(r), DLOCK_OK);
    ck_assert_int_eq(cmd_int(ctx, "EXISTS dead"), 0);
    TU_ACQUIRE_OK(w, DLOCK_TRY);
    ck_assert_int_eq(dlock_release(w), DLOCK_OK);
    TU_FREE_LOCKS(w, r);
    dlock_client_close(c);
    redisFree(ctx);
    tu_rmrf(dir);
    free(url);
    free(held);
    free(dir);
    stop_server();
}

/* Play a redis-py / redsync client (SET NX PX, compare-and-delete). */
TU_TEST(simple_layout_on_the_wire, 60)
{
    redisContext *ctx = served_raw();
    char *url = url_with("layout=simple&lease=60s");
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock(c, "report");

    /* redis-py holds it with a short lease and dies: dlock gets it when
     * the lease ends (no message: redis-py does not publish). */
    redisReply *r = cmd(ctx, "SET report py-7b1c NX PX 1500");
    ck_assert_int_eq(r->type, REDIS_REPLY_STATUS);
    freeReplyObject(r);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_EBUSY);
    TU_ACQUIRE_OK(l, 20000);
    uint64_t t = tu_token(l);
    char *v = reply_str(cmd(ctx, "GET report"));
    char *want_suffix = tu_fmt(":%llu", (unsigned long long)t);
    ck_assert_msg(v && strlen(v) > strlen(want_suffix) &&
                      strcmp(v + strlen(v) - strlen(want_suffix), want_suffix) == 0,
                  "value %s", v ? v : "(nil)");

    /* While dlock holds it: redis-py's SET NX fails, its compare-and-
     * delete with its own value deletes nothing. */
    r = cmd(ctx, "SET report py-9 NX PX 1500");
    ck_assert_int_eq(r->type, REDIS_REPLY_NIL);
    freeReplyObject(r);
    const char *cad = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) "
                      "else return 0 end";
    ck_assert_int_eq(cmd_int(ctx, "EVAL %s 1 report py-9", cad), 0);
    ck_assert_int_eq(cmd_int(ctx, "EXISTS report"), 1);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    r = cmd(ctx, "SET report py-10 NX PX 60000");
    ck_assert_int_eq(r->type, REDIS_REPLY_STATUS);
    freeReplyObject(r);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_EBUSY);
    /* inspect sees the foreign lock held, without showing its value */
    dlock_info *info = NULL;
    ck_assert_int_eq(dlock_inspect(c, "report", &info), DLOCK_OK);
    unsigned count;
    ck_assert_int_eq(dlock_info_held(info), 1);
    ck_assert_str_eq(dlock_info_holder(info, 0, &count), "(a value that is not dlock's)");
    dlock_info_free(info);
    ck_assert_int_eq(cmd_int(ctx, "EVAL %s 1 report py-10", cad), 1);
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    ck_assert_uint_gt(tu_token(l), t);
    dlock_release(l);
    free(v);
    free(want_suffix);
    free(url);
    dlock_lock_free(l);
    dlock_client_close(c);
    served_raw_close(ctx);
}

/* --------------------------------------------------------------- faults */

TU_TEST(wrongtype_left_intact, 60)
{
    redisContext *ctx = served_raw();
    freeReplyObject(cmd(ctx, "SET jobs %s", "not-a-lock"));
    dlock_client *c = tu_open(srv.url);
    dlock_lock *l = tu_lock(c, "jobs");
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_EWRONGTYPE);
    ck_assert_msg(strstr(dlock_errmsg(), "'jobs'") && strstr(dlock_errmsg(), "WRONGTYPE"), "%s",
                  dlock_errmsg());
    ck_assert_int_eq(dlock_acquire(l, 500), DLOCK_EWRONGTYPE);
    char *v = reply_str(cmd(ctx, "GET jobs"));
    ck_assert_str_eq(v, "not-a-lock");
    free(v);
    ck_assert_int_eq(cmd_int(ctx, "EXISTS %s", "redisson_lock_token:{jobs}"), 0);
    dlock_info *info = NULL;
    ck_assert_int_eq(dlock_inspect(c, "jobs", &info), DLOCK_EWRONGTYPE);
    ck_assert_int_eq(dlock_force_release(c, "jobs"), DLOCK_EWRONGTYPE);
    ck_assert_int_eq(cmd_int(ctx, "EXISTS jobs"), 1);
    /* a token key that is not a counter is refused too */
    freeReplyObject(cmd(ctx, "SET %s abc", "redisson_lock_token:{tok}"));
    dlock_lock *l2 = tu_lock(c, "tok");
    ck_assert_int_eq(dlock_acquire(l2, DLOCK_TRY), DLOCK_EWRONGTYPE);
    ck_assert_int_eq(cmd_int(ctx, "EXISTS tok"), 0);
    TU_FREE_LOCKS(l2, l);
    dlock_client_close(c);

    /* the simple layout refuses a hash */
    char *url = url_with("layout=simple");
    c = tu_open(url);
    freeReplyObject(cmd(ctx, "HSET h f v"));
    l = tu_lock(c, "h");
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_EWRONGTYPE);
    ck_assert_int_eq(cmd_int(ctx, "HLEN h"), 1);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(url);
    served_raw_close(ctx);
}

TU_TEST(auth_password_and_acl_user, 60)
{
    const char *extra[] = {"--requirepass", "s3cret", NULL};
    start_server(extra);
    dlock_client *c = NULL;
    ck_assert_int_eq(dlock_open(srv.url, &c), DLOCK_EAUTH);
    ck_assert_ptr_null(c);
    char *bad = tu_fmt("redis://:wrong@127.0.0.1:%d", srv.port);
    TU_OPEN_FAILS(bad, DLOCK_EAUTH, "127.0.0.1");
    ck_assert_msg(strstr(dlock_errmsg(), "wrong") == NULL, "password leaked: %s", dlock_errmsg());
    char *good = tu_fmt("redis://:s3cret@127.0.0.1:%d", srv.port);
    c = tu_open(good);
    dlock_lock *l = tu_lock(c, "a");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    dlock_release(l);
    dlock_lock_free(l);
    dlock_client_close(c);

    /* the password from the environment */
    setenv("DLOCK_REDIS_PASSWORD", "s3cret", 1);
    c = tu_open(srv.url);
    dlock_client_close(c);
    unsetenv("DLOCK_REDIS_PASSWORD");

    /* an ACL user */
    redisContext *ctx = fx_redis_raw(&srv, "s3cret");
    ck_assert_ptr_nonnull(ctx);
    freeReplyObject(cmd(ctx, "ACL SETUSER alice on >pw1 ~* &* +@all"));
    char *alice = tu_fmt("redis://alice:pw1@127.0.0.1:%d", srv.port);
    c = tu_open(alice);
    dlock_client_close(c);
    char *alice_bad = tu_fmt("redis://alice:nope@127.0.0.1:%d", srv.port);
    ck_assert_int_eq(dlock_open(alice_bad, &c), DLOCK_EAUTH);
    /* a user denied the commands dlock needs */
    freeReplyObject(cmd(ctx, "ACL SETUSER bob on >pw2 ~* +@all -evalsha -eval -script"));
    char *bob = tu_fmt("redis://bob:pw2@127.0.0.1:%d", srv.port);
    TU_OPEN_FAILS(bob, DLOCK_EAUTH, "NOPERM");
    redisFree(ctx);
    free(bad);
    free(good);
    free(alice);
    free(alice_bad);
    free(bob);
    stop_server();
}

TU_TEST(unreachable_and_silent_servers, 60)
{
    int port = tu_free_port();
    char *url = tu_fmt("redis://127.0.0.1:%d?connect_timeout=500ms", port);
    char *where = tu_fmt("127.0.0.1:%d", port);
    TU_OPEN_FAILS(url, DLOCK_ECONN, where);

    /* A server that accepts and never answers: the operation timeout. */
    int silent_port;
    int fd = listen_loopback(&silent_port);
    char *silent = tu_fmt("redis://127.0.0.1:%d?connect_timeout=500ms&timeout=500ms", silent_port);
    TU_OPEN_FAILS(silent, DLOCK_ECONN, "no reply");
    close(fd);
    free(url);
    free(where);
    free(silent);
}

TU_TEST(server_killed_while_held, 60)
{
    struct tu_lost lost = {0};
    struct tu_solo s = served_holding("lease=1500ms", "srv", &lost);
    uint64_t t = tu_token(s.l);
    (void)t;
    fx_redis_kill(&srv);
    ck_assert_msg(tu_wait_lost(&lost, 1, 10000), "lost callback never fired");
    ck_assert_int_eq(atomic_load(&lost.fired), 1);
    ck_assert_int_eq(dlock_validity_ms(s.l), 0);
    ck_assert_msg(fx_redis_restart(&srv), "restart failed");
    ck_assert_int_eq(dlock_release(s.l), DLOCK_ELOST);
    /* After the server is back: new acquisitions work (scripts reloaded,
     * dead connections replaced), and renewals resume. */
    TU_ACQUIRE_OK(s.l, DLOCK_TRY);
    dlock_lock *l2 = tu_lock(s.c, "srv2");
    TU_ACQUIRE_OK(l2, DLOCK_TRY);
    tu_sleep_ms(2500); /* longer than the lease: only renewals keep it, no event to wait on */
    ck_assert_int_gt(dlock_validity_ms(s.l), 0);
    ck_assert_int_eq(atomic_load(&lost.fired), 1);
    ck_assert_int_eq(dlock_release(s.l), DLOCK_OK);
    ck_assert_int_eq(dlock_release(l2), DLOCK_OK);
    dlock_lock_free(l2);
    served_close(&s);
}

static void restart_server(void *arg)
{
    (void)arg;
    fx_redis_kill(&srv);
    ck_assert_msg(fx_redis_restart(&srv), "restart failed");
}

/* `dlock leader --watch` across a server restart: the observer retries
 * the refused and reset connections and reports the leader elected
 * afterwards (it ended at the first error). */
TU_TEST(observe_goes_on_across_a_restart, 60)
{
    char *url = served_url(NULL);
    tu_watch_across_restart(url, "watched", restart_server, NULL);
    free(url);
    stop_server();
}

/* A server that stops answering without refusing connections (SIGSTOP):
 * renewals get no reply, the hold is declared lost (the renewal's I/O is
 * cut to the hold's validity deadline), and after the server resumes the
 * release reports the loss and new acquisitions work. */
TU_TEST(server_paused_holds_lost, 60)
{
    struct tu_lost lost = {0};
    struct tu_solo s = served_holding("lease=1500ms", "sp", &lost);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kill(srv.pid, SIGSTOP);
    bool fired = tu_wait_lost(&lost, 1, 15000);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    kill(srv.pid, SIGCONT);
    /* informational (no timing assertion): with a 1.5 s lease and the
     * default 5 s timeouts this stays near the lease */
    fprintf(stderr, "server_paused_holds_lost: lost %ld ms after the pause\n",
            (long)((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000));
    ck_assert_msg(fired, "lost callback never fired");
    ck_assert_int_eq(dlock_validity_ms(s.l), 0);
    ck_assert_int_eq(dlock_release(s.l), DLOCK_ELOST);
    tu_acquire_release(s.l, 10000);
    served_close(&s);
}

TU_TEST(script_flush_is_invisible, 60)
{
    struct tu_solo s = served_open("lease=1500ms", "fl");
    redisContext *ctx = raw();
    freeReplyObject(cmd(ctx, "SCRIPT FLUSH"));
    TU_ACQUIRE_OK(s.l, DLOCK_TRY);
    freeReplyObject(cmd(ctx, "SCRIPT FLUSH"));
    tu_sleep_ms(2500); /* renewals after a flush: longer than the lease, no event to wait on */
    ck_assert_int_gt(dlock_validity_ms(s.l), 0);
    freeReplyObject(cmd(ctx, "SCRIPT FLUSH"));
    ck_assert_int_eq(dlock_release(s.l), DLOCK_OK);
    redisFree(ctx);
    served_close(&s);
}

TU_TEST(out_of_memory_is_reported, 60)
{
    start_server(NULL);
    dlock_client *c = tu_open(srv.url);
    redisContext *ctx = raw();
    freeReplyObject(cmd(ctx, "CONFIG SET maxmemory-policy noeviction"));
    freeReplyObject(cmd(ctx, "CONFIG SET maxmemory 1"));
    dlock_lock *l = tu_lock(c, "m");
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_EBACKEND);
    ck_assert_msg(strstr(dlock_errmsg(), "OOM") != NULL, "%s", dlock_errmsg());
    freeReplyObject(cmd(ctx, "CONFIG SET maxmemory 0"));
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    dlock_release(l);
    redisFree(ctx);
    dlock_lock_free(l);
    dlock_client_close(c);
    stop_server();
}

/* A renewal that finds the hold gone fires the callback once and the
 * release reports the loss; force_release wakes waiters. */
TU_TEST(force_release_and_lost, 60)
{
    char *url = served_url("lease=1500ms");
    dlock_client *c = tu_open(url), *op = tu_open(srv.url);
    dlock_lock *l = tu_lock(c, "f");
    struct tu_lost lost = {0};
    dlock_lock_on_lost(l, tu_on_lost, &lost);
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    ck_assert_int_eq(dlock_force_release(op, "f"), DLOCK_OK);
    ck_assert_msg(tu_wait_lost(&lost, 1, 10000), "lost callback never fired");
    ck_assert_msg(strstr(lost.why, "127.0.0.1") != NULL, "%s", lost.why);
    tu_sleep_ms(1000); /* renewal periods pass: a second callback has no event to wait on */
    ck_assert_int_eq(atomic_load(&lost.fired), 1);
    ck_assert_int_eq(dlock_release(l), DLOCK_ELOST);
    ck_assert_int_eq(dlock_force_release(op, "f"), DLOCK_OK); /* nothing there: fine */
    dlock_lock_free(l);
    TU_CLOSE_CLIENTS(c, op);
    free(url);
    stop_server();
}

/* A fault-injecting proxy in front of the real server: the fault relay
 * (tests/lib/relay.h) with a callback that reads the lock script calls
 * on one name (RESP-aware) and picks those a test asked to play with. It
 * can forward a call to the server, wait for the server's reply (so the
 * script did run), throw the reply away and close the client's
 * connection: the client sees a reset after its request ran, the
 * ambiguous case, made deterministic. Each counter below says how many
 * of the next such calls meet that fault. */
struct proxy {
    struct tu_relay r;
    atomic_int drop_acquire, drop_release;
    atomic_int drop_downgrade; /* the same for a downgrade (it names only the rwlock channel) */
    const char *name; /* the lock whose calls are played with */
    /* hold_acquire: keep that many acquire calls back (the client sees
     * its connection closed) until gate GATE_HELD opens, then send them
     * to the server: a late original. r.served[GATE_HELD] counts those
     * that ran. */
    atomic_int hold_acquire;
    /* hold_release: the same for that many release-like calls (they name
     * the channel: release, cancel) */
    atomic_int hold_release;
    atomic_int hold_downgrade; /* the same for that many downgrades */
    /* forge_acquire: answer every acquire call (after the server ran it)
     * with r.cf.forged instead; r.forged counts them. */
    atomic_int forge_acquire;
    /* stall_release: keep that many release-like calls (they name the
     * channel: release, cancel) back, the connection open, until gate
     * GATE_STALLED opens; stalled counts them, r.served[GATE_STALLED]
     * those the server then answered (the client may have given up on
     * them: a late request on a connection it abandoned). stall_downgrade:
     * the same for downgrades. */
    atomic_int stall_release, stall_downgrade, stalled;
    /* stall_unwait: the same for that many writers' unwaits (they name
     * the writers key and not the token key), counted in stalled too */
    atomic_int stall_unwait;
    /* stall_acquire: the same for that many acquire calls, counted in
     * stalled too; once let through, each one's reply is passed on (when
     * the client is still there) */
    atomic_int stall_acquire;
    /* drop_named: drop the reply of that many calls whose request holds
     * NEEDLE, after the server ran them (then close the connection) */
    atomic_int drop_named;
    const char *needle;
    char tok[160], chan[160], rwchan[160], writers[160]; /* the keys that tell calls apart */
};

#define GATE_STALLED 0 /* the relay's gate of TU_RELAY_KEEP */
#define GATE_HELD 1    /* and of TU_RELAY_KEEP_CUT */

static bool chunk_has(const char *buf, size_t n, const char *needle)
{
    return memmem(buf, n, needle, strlen(needle)) != NULL;
}

static bool take_one(atomic_int *counter)
{
    int v = atomic_load(counter);
    while (v > 0)
        if (atomic_compare_exchange_weak(counter, &v, v - 1))
            return true;
    return false;
}

/* The relay's callback: which call BUF is, and the fault it meets. */
static enum tu_relay_action proxy_judge(struct tu_relay *r, struct tu_relay_conn *c,
                                        const char *buf, size_t n)
{
    (void)c;
    struct proxy *px = r->cf.arg;
    bool is_script = chunk_has(buf, n, "EVAL");
    bool is_release = is_script && chunk_has(buf, n, px->chan);
    bool is_acquire = is_script && !is_release && chunk_has(buf, n, px->tok);
    bool is_downgrade = is_script && !is_release && chunk_has(buf, n, px->rwchan);
    if (is_script && chunk_has(buf, n, "dlock_fair_queue:")) {
        /* fair_lock.lua names the channel in every op: its op says */
        is_acquire = chunk_has(buf, n, "\r\nacquire\r\n");
        is_release = chunk_has(buf, n, "\r\nrelease\r\n") || chunk_has(buf, n, "\r\nleave\r\n");
    }
    bool is_unwait = is_script && !is_release && !is_acquire && chunk_has(buf, n, px->writers);
    if ((is_release && take_one(&px->stall_release)) ||
        (is_unwait && take_one(&px->stall_unwait)) ||
        (is_downgrade && take_one(&px->stall_downgrade)) ||
        (is_acquire && take_one(&px->stall_acquire))) {
        atomic_fetch_add(&px->stalled, 1);
        return TU_RELAY_KEEP;
    }
    if (is_acquire && atomic_load(&px->forge_acquire))
        return TU_RELAY_FORGE;
    if ((is_acquire && take_one(&px->hold_acquire)) ||
        (is_release && take_one(&px->hold_release)) ||
        (is_downgrade && take_one(&px->hold_downgrade)))
        return TU_RELAY_KEEP_CUT;
    if ((is_acquire && take_one(&px->drop_acquire)) ||
        (is_release && take_one(&px->drop_release)) ||
        (is_downgrade && take_one(&px->drop_downgrade)) ||
        (px->needle && chunk_has(buf, n, px->needle) && take_one(&px->drop_named)))
        return TU_RELAY_DROP_REPLY;
    return TU_RELAY_FORWARD;
}

/* PX in front of 127.0.0.1:TARGET_PORT, playing with the calls on NAME;
 * it dies with the test. */
static void proxy_start(struct proxy *px, int target_port, const char *name)
{
    memset(px, 0, sizeof *px);
    px->name = name;
    snprintf(px->tok, sizeof px->tok, "redisson_lock_token:{%s}", name);
    snprintf(px->writers, sizeof px->writers, "dlock_writers:{%s}", name);
    snprintf(px->chan, sizeof px->chan, "redisson_lock__channel:{%s}", name);
    snprintf(px->rwchan, sizeof px->rwchan, "redisson_rwlock:{%s}", name);
    tu_relay_start_with(&px->r, &(struct tu_relay_config){.target = target_port,
                                                          .close_with_client = true,
                                                          .gates_shut = true,
                                                          .on_request = proxy_judge,
                                                          .arg = px});
}

/* Open GATE of PX; wait until N calls it kept were served. */
static void let_late_calls_run(struct proxy *px, int gate, int n)
{
    tu_relay_gate(&px->r, gate, false);
    for (int waited = 0; atomic_load(&px->r.served[gate]) < n && waited < 10000; waited += 5)
        tu_sleep_ms(5);
    ck_assert_int_eq(atomic_load(&px->r.served[gate]), n);
}

/* Once the keeper's cancel of the lost acquire of NAME is recorded on
 * the server (within TIMEOUT_MS), the two attempts PX held back are let
 * through: they must not take NAME. */
static void late_attempts_do_nothing(redisContext *ctx, struct proxy *px, const char *name,
                                     int timeout_ms)
{
    char *canceled = tu_fmt("dlock_canceled:{%s}", name);
    for (int waited = 0; waited < timeout_ms && cmd_int(ctx, "EXISTS %s", canceled) == 0;
         waited += 5)
        tu_sleep_ms(5);
    ck_assert_int_eq(cmd_int(ctx, "EXISTS %s", canceled), 1);
    let_late_calls_run(px, GATE_HELD, 2);
    ck_assert_msg(cmd_int(ctx, "EXISTS %s", name) == 0, "a late acquire took the lock '%s'", name);
    free(canceled);
}

/* The frame of the proxy tests: PX started in front of the running
 * server, playing with the calls on NAME, and a client through it --
 * "redis://USERINFO127.0.0.1:<port>?QUERY" (either may be NULL) -- with a
 * handle on NAME (tu_solo_close() ends it; the proxy dies with the test). */
static struct tu_solo proxied_open(struct proxy *px, const char *userinfo, const char *query,
                                   const char *name)
{
    proxy_start(px, srv.port, name);
    return tu_solo_open(tu_fmt("redis://%s127.0.0.1:%d%s%s", userinfo ? userinfo : "", px->r.port,
                               query ? "?" : "", query ? query : ""),
                        name);
}

/* The server started and proxied_open() with LAYOUT and a 60 s lease. */
static struct tu_solo layout_proxied(struct proxy *px, const char *layout, const char *name)
{
    start_server(NULL);
    char *q = tu_fmt("layout=%s&lease=60s", layout);
    struct tu_solo via = proxied_open(px, NULL, q, name);
    free(q);
    return via;
}

/* Replies lost after the script ran, through the proxy: one lost acquire
 * reply → the retry replaces the first attempt's field (one hold, count
 * 1, the newer token, which the counter holds); one lost
 * release reply → the retry reports success; every reply of an acquire
 * lost → DLOCK_ECONN and the hold that did happen is undone. */
static void lost_replies_through_proxy(const char *layout)
{
    struct proxy px;
    struct tu_solo via = layout_proxied(&px, layout, "amb");
    redisContext *ctx = raw();
    bool simple = strcmp(layout, "simple") == 0;

    atomic_store(&px.drop_acquire, 1);
    TU_ACQUIRE_OK(via.l, DLOCK_TRY);
    ck_assert_int_eq(atomic_load(&px.drop_acquire), 0); /* the fault did happen */
    uint64_t t1 = tu_token(via.l);
    ck_assert_int_eq(cmd_int(ctx, "GET %s", "redisson_lock_token:{amb}"), (long long)t1); /* the last */
    if (!simple) {
        ck_assert_int_eq(cmd_int(ctx, "HLEN amb"), 2);
        ck_assert_int_eq(owner_count(ctx, "amb"), 1);
    }

    atomic_store(&px.drop_release, 1);
    int rc = dlock_release(via.l);
    ck_assert_msg(rc == DLOCK_OK, "release after a lost reply: %s: %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_int_eq(atomic_load(&px.drop_release), 0);
    ck_assert_int_eq(cmd_int(ctx, "EXISTS amb"), 0);

    atomic_store(&px.drop_acquire, 2);
    ck_assert_int_eq(dlock_acquire(via.l, DLOCK_TRY), DLOCK_ECONN);
    ck_assert_int_eq(atomic_load(&px.drop_acquire), 0);
    /* both attempts did run (the retry replaced the first one's field) */
    ck_assert_int_eq(cmd_int(ctx, "GET %s", "redisson_lock_token:{amb}"), (long long)t1 + 2);
    /* The cancel it owes is queued for the keeper; this acquire of the
     * same thread sends it first, so it does not take the lost attempt's
     * hold as its own: a new hold, the next token. */
    TU_ACQUIRE_OK(via.l, DLOCK_TRY);
    ck_assert_uint_eq(tu_token(via.l), t1 + 3);
    ck_assert_int_eq(dlock_release(via.l), DLOCK_OK);
    redisFree(ctx);
    tu_solo_close(&via);
    stop_server();
}

TU_TEST(lost_replies_redisson_layout, 60)
{
    lost_replies_through_proxy("redisson");
}

TU_TEST(lost_replies_simple_layout, 60)
{
    lost_replies_through_proxy("simple");
}

/* Every attempt of an acquire is held back by the proxy and the client's
 * connection closed: the acquire fails (DLOCK_ECONN) and undoes what it
 * may have left. Then the held attempts reach the server, after the
 * undo: they must do nothing (no hold for a lease, no token spent). */
static void late_acquire_through_proxy(const char *layout)
{
    struct proxy px;
    struct tu_solo via = layout_proxied(&px, layout, "late");
    redisContext *ctx = raw();

    atomic_store(&px.hold_acquire, 2); /* the first attempt and its retry */
    int rc = dlock_acquire(via.l, DLOCK_TRY);
    ck_assert_msg(rc == DLOCK_ECONN, "acquire with every reply lost: %s: %s", dlock_err_name(rc),
                  dlock_errmsg());
    ck_assert_int_eq(atomic_load(&px.hold_acquire), 0);
    /* the cancel is sent by the keeper: wait until it is recorded */
    late_attempts_do_nothing(ctx, &px, "late", 10000);
    ck_assert_msg(cmd_int(ctx, "GET %s", "redisson_lock_token:{late}") == -1000,
                  "a late acquire spent a token");
    TU_ACQUIRE_OK(via.l, DLOCK_TRY);
    ck_assert_int_eq(cmd_int(ctx, "GET %s", "redisson_lock_token:{late}"), (long long)tu_token(via.l));
    ck_assert_int_eq(dlock_release(via.l), DLOCK_OK);
    redisFree(ctx);
    tu_solo_close(&via);
    stop_server();
}

TU_TEST(late_acquire_redisson_layout, 60)
{
    late_acquire_through_proxy("redisson");
}

TU_TEST(late_acquire_simple_layout, 60)
{
    late_acquire_through_proxy("simple");
}

/* The end of a late-request test: after requests meant for an earlier
 * hold of the same owner (the same field) ran, NAME must still be held
 * by L's later hold. L is released, CTX freed, VIA closed, the server
 * stopped. */
static void later_hold_survives(redisContext *ctx, struct tu_solo *via, dlock_lock *l,
                                const char *name)
{
    ck_assert_msg(cmd_int(ctx, "EXISTS %s", name) == 1,
                  "a late request of an earlier hold ended the later hold of '%s'", name);
    int rc = dlock_release(l);
    ck_assert_msg(rc == DLOCK_OK, "release of the later hold: %s: %s", dlock_err_name(rc),
                  dlock_errmsg());
    redisFree(ctx);
    tu_solo_close(via);
    stop_server();
}

/* A release whose first copy is held back on a connection the client
 * saw closed (in the kernel or the network, on a server that stalled):
 * the client sends it again on a new connection and goes on, then the
 * same owner takes the name again. The old copy reaches the server
 * after that: it must not end the later hold (same owner field; the
 * token differs). */
static void late_release_through_proxy(const char *layout, int mode, bool timed_out)
{
    struct proxy px;
    start_server(NULL);
    char *q = tu_fmt("layout=%s&lease=60s%s", layout, timed_out ? "&timeout=1s" : "");
    struct tu_solo via = proxied_open(&px, NULL, q, "lrel");
    free(q);
    if (mode == DLOCK_SHARED) { /* a reader's release (rw_release_read.lua) */
        dlock_lock_free(via.l);
        via.l = tu_lock_mode(via.c, "lrel", DLOCK_SHARED, 0);
    }
    redisContext *ctx = raw();
    TU_ACQUIRE_OK(via.l, DLOCK_TRY);
    uint64_t t1 = tu_token(via.l);
    atomic_store(timed_out ? &px.stall_release : &px.hold_release, 1);
    int rc = dlock_release(via.l);
    ck_assert_msg(rc == (timed_out ? DLOCK_ECONN : DLOCK_OK), "release: %s: %s", dlock_err_name(rc),
                  dlock_errmsg());
    /* the first copy is kept back */
    ck_assert_int_eq(atomic_load(timed_out ? &px.stalled : &px.r.served[GATE_HELD]), timed_out ? 1 : 0);
    ck_assert_int_eq(atomic_load(&px.hold_release), 0);
    TU_ACQUIRE_OK(via.l, DLOCK_TRY); /* a timed-out release left our field: replaced */
    ck_assert_uint_gt(tu_token(via.l), t1);
    if (timed_out)
        let_late_calls_run(&px, GATE_STALLED, 1);
    else
        let_late_calls_run(&px, GATE_HELD, 1);
    later_hold_survives(ctx, &via, via.l, "lrel");
}

TU_TEST(late_release_spares_a_later_hold_redisson_layout, 60)
{
    late_release_through_proxy("redisson", DLOCK_EXCLUSIVE, false);
}

TU_TEST(late_release_spares_a_later_hold_simple_layout, 60)
{
    late_release_through_proxy("simple", DLOCK_EXCLUSIVE, false);
}

TU_TEST(late_release_spares_a_later_hold_fair_layout, 60)
{
    late_release_through_proxy("fair", DLOCK_EXCLUSIVE, false);
}

TU_TEST(late_shared_release_spares_a_later_hold, 60)
{
    late_release_through_proxy("redisson", DLOCK_SHARED, false);
}

/* A release that times out on a stalled server (here the proxy keeps it
 * back on the open connection) is abandoned with its connection: the
 * call fails DLOCK_ECONN and the hold is dropped. The same owner then
 * takes the name again on a new connection, and only then does the old
 * request reach the server: it must not end the later hold. */
TU_TEST(timed_out_release_spares_a_later_hold, 60)
{
    late_release_through_proxy("redisson", DLOCK_EXCLUSIVE, true);
}

/* A downgrade that times out (the proxy keeps it back) gives the hold up
 * (DLOCK_ELOST), which sends the exclusive release; that release's first
 * copy is held back too (its connection closed, the copy sent again
 * runs). The owner then takes the name again as a reader, and only then
 * do the old downgrade and the old release reach the server: neither
 * may end the later read hold (the same field; its timeout key holds its
 * own token). */
TU_TEST(late_release_of_a_downgrade_spares_a_later_read_hold, 60)
{
    start_server(NULL);
    struct proxy px;
    struct tu_solo via = proxied_open(&px, NULL, "timeout=1s&lease=60s", "ldr");
    dlock_lock *r = tu_lock_mode(via.c, "ldr", DLOCK_SHARED, 0);
    redisContext *ctx = raw();
    TU_ACQUIRE_OK(via.l, DLOCK_TRY);
    TU_ACQUIRE_OK(r, DLOCK_TRY);
    atomic_store(&px.stall_downgrade, 1);
    atomic_store(&px.hold_release, 1);
    int rc = dlock_release(via.l); /* the last write level: a downgrade */
    ck_assert_msg(rc == DLOCK_ELOST, "downgrade on a stalled server: %s: %s", dlock_err_name(rc),
                  dlock_errmsg());
    ck_assert_int_eq(atomic_load(&px.stalled), 1);
    ck_assert_int_eq(atomic_load(&px.hold_release), 0); /* the give-up's first copy is held */
    ck_assert_uint_eq(dlock_hold_count(r), 0);
    TU_ACQUIRE_OK(r, DLOCK_TRY);
    let_late_calls_run(&px, GATE_HELD, 1);
    let_late_calls_run(&px, GATE_STALLED, 1);
    later_hold_survives(ctx, &via, r, "ldr");
    dlock_lock_free(r);
}





/* A downgrade (the last write level released while a read level is
 * held) whose first copy the proxy holds back, the copy sent again ran;
 * the owner then gives the name up and takes it again, exclusive. The
 * old copy reaching the server after that must not turn the later
 * exclusive hold into a shared one (readers would come in beside it). */
TU_TEST(late_downgrade_spares_a_later_hold, 60)
{
    struct proxy px;
    struct tu_solo via = layout_proxied(&px, "redisson", "ldg");
    dlock_lock *r = tu_lock_mode(via.c, "ldg", DLOCK_SHARED, 0);
    redisContext *ctx = raw();
    TU_ACQUIRE_OK(via.l, DLOCK_TRY);
    TU_ACQUIRE_OK(r, DLOCK_TRY);
    atomic_store(&px.hold_downgrade, 1);
    int rc = dlock_release(via.l); /* the last write level: a downgrade */
    ck_assert_msg(rc == DLOCK_OK, "downgrade sent again: %s: %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_int_eq(atomic_load(&px.hold_downgrade), 0); /* the first copy is held */
    ck_assert_int_eq(dlock_release(r), DLOCK_OK);
    TU_ACQUIRE_OK(via.l, DLOCK_TRY);
    let_late_calls_run(&px, GATE_HELD, 1);
    char *mode = reply_str(cmd(ctx, "HGET %s mode", "ldg"));
    ck_assert_msg(mode && strcmp(mode, "write") == 0,
                  "a late copy of an earlier hold's downgrade made the later exclusive hold '%s'",
                  mode ? mode : "(gone)");
    free(mode);
    ck_assert_int_eq(dlock_release(via.l), DLOCK_OK);
    dlock_lock_free(r);
    redisFree(ctx);
    tu_solo_close(&via);
    stop_server();
}

/* An acquire whose replies are lost owes a cancel; the keeper's first
 * copy of it is held back on a connection the client saw closed, the
 * copy sent again runs. The owner then takes the name again, and only
 * after that do the held calls (both acquire attempts and the first
 * cancel) reach the server: the late cancel must not end the later hold
 * (the same owner field: what differs is the request number). */
static void late_cancel_through_proxy(const char *layout)
{
    struct proxy px;
    struct tu_solo via = layout_proxied(&px, layout, "lcan");
    redisContext *ctx = raw();
    atomic_store(&px.hold_acquire, 2);
    atomic_store(&px.hold_release, 1);
    int rc = dlock_acquire(via.l, DLOCK_TRY);
    ck_assert_msg(rc == DLOCK_ECONN, "acquire with every reply lost: %s: %s", dlock_err_name(rc),
                  dlock_errmsg());
    /* the keeper's cancel: its first copy held, another one recorded */
    for (int waited = 0; waited < 10000 && cmd_int(ctx, "EXISTS dlock_canceled:{lcan}") == 0;
         waited += 5)
        tu_sleep_ms(5);
    ck_assert_int_eq(cmd_int(ctx, "EXISTS dlock_canceled:{lcan}"), 1);
    ck_assert_int_eq(atomic_load(&px.hold_release), 0);
    TU_ACQUIRE_OK(via.l, DLOCK_TRY);
    let_late_calls_run(&px, GATE_HELD, 3);
    later_hold_survives(ctx, &via, via.l, "lcan");
}

TU_TEST(late_cancel_spares_a_later_hold_redisson_layout, 60)
{
    late_cancel_through_proxy("redisson");
}

TU_TEST(late_cancel_spares_a_later_hold_simple_layout, 60)
{
    late_cancel_through_proxy("simple");
}

TU_TEST(late_cancel_spares_a_later_hold_fair_layout, 60)
{
    late_cancel_through_proxy("fair");
}

/* One thread (one owner): an acquire, then, once told, another. */
struct acquire_thread {
    dlock_lock *l;
    int rc, rc2;
    atomic_int done, go, done2;
};

static void *acquire_thread_main(void *p)
{
    struct acquire_thread *a = p;
    a->rc = dlock_acquire(a->l, DLOCK_TRY);
    atomic_store(&a->done, 1);
    while (!atomic_load(&a->go))
        tu_sleep_ms(5);
    a->rc2 = dlock_acquire(a->l, 300);
    atomic_store(&a->done2, 1);
    return NULL;
}

/* The server started, a client through PX (op timeout 30 s, lease 60 s)
 * with a handle on NAME, and a raw connection in *CTX: the frame of the
 * tests that hold a request in the proxy. */
static struct tu_solo served_proxied(struct proxy *px, const char *name, redisContext **ctx)
{
    start_server(NULL);
    struct tu_solo via = proxied_open(px, NULL, "timeout=30s&lease=60s", name);
    *ctx = raw();
    return via;
}

/* The cancel that an acquire with lost replies owes goes on the client's
 * cleanup queue: the caller gets its DLOCK_ECONN at once, even when the
 * cancel itself is stalled (here held by the proxy), and the keeper sends
 * it -- before the late attempts arrive, which then do nothing. */
TU_TEST(lost_acquire_cancel_does_not_hold_the_caller, 60)
{
    struct proxy px;
    redisContext *ctx;
    struct tu_solo via = served_proxied(&px, "stall", &ctx);
    atomic_store(&px.hold_acquire, 2);
    atomic_store(&px.stall_release, 1);
    struct acquire_thread a = {.l = via.l, .rc = -99};
    pthread_t th;
    pthread_create(&th, NULL, acquire_thread_main, &a);
    ck_assert_msg(wait_flag(&a.done, 20000), "the caller waits for the cancel of its lost acquire");
    ck_assert_msg(a.rc == DLOCK_ECONN, "%s", dlock_err_name(a.rc));
    ck_assert_msg(wait_flag(&px.stalled, 20000), "the keeper never sent the cancel");
    /* While the cancel is owed, the same thread's next acquire of the
     * name must not take a field the lost attempts may have left as its
     * own (the cancel would then delete its hold): it sends the cancel
     * first, and here that cannot finish within its wait. */
    atomic_store(&a.go, 1);
    pthread_join(th, NULL);
    ck_assert_msg(a.rc2 == DLOCK_ETIMEDOUT, "acquire while a cancel is owed: %s", dlock_err_name(a.rc2));
    tu_relay_gate(&px.r, GATE_STALLED, false);
    late_attempts_do_nothing(ctx, &px, "stall", 20000);
    tu_acquire_release(via.l, DLOCK_TRY);
    redisFree(ctx);
    tu_solo_close(&via);
    stop_server();
}

/* Until ZCARD dlock_writers:{NAME} is WANT (false after 20 s). */
static bool writers_become(redisContext *ctx, const char *name, long long want)
{
    for (int i = 0; i < 2000; i++) {
        if (cmd_int(ctx, "ZCARD dlock_writers:{%s}", name) == want)
            return true;
        tu_sleep_ms(10);
    }
    return false;
}

/* A writer's unwait owed to the keeper (its wait timed out) goes out
 * before the same owner's next request on the name: the keeper's is held
 * in the proxy, so the owner's next wait sends it first and here cannot
 * finish within its 1 s (DLOCK_ETIMEDOUT, as an owed cancel). Sent after
 * that wait, the unwait would take away the record of a later wait
 * (readers then overtake it), or leave the old record while the owner
 * holds and after, keeping readers out. (The wait went out first: it took
 * the lock beside the old record, readers kept out after its release.) */
TU_TEST(owed_unwait_goes_before_the_next_wait, 60)
{
    start_server(NULL);
    struct proxy px;
    struct tu_solo via = proxied_open(&px, NULL, "timeout=30s&lease=60s", "uwo");
    dlock_client *d = open_with("lease=60s");
    dlock_lock *holder = tu_lock(d, "uwo");
    dlock_lock *reader = tu_lock_mode(d, "uwo", DLOCK_SHARED, 0);
    redisContext *ctx = raw();
    TU_ACQUIRE_OK(holder, DLOCK_TRY);
    atomic_store(&px.stall_unwait, 1);
    TU_ACQUIRE_EXPECT(via.l, 300, DLOCK_ETIMEDOUT, "a writer's wait behind a holder");
    ck_assert_msg(wait_flag(&px.stalled, 20000), "the keeper never sent the owed unwait");
    ck_assert_int_eq(cmd_int(ctx, "ZCARD dlock_writers:{uwo}"), 1); /* the old wait's record */
    TU_RELEASE_OK(holder);
    int rc = dlock_acquire(via.l, 1000);
    long long records = cmd_int(ctx, "ZCARD dlock_writers:{uwo}");
    if (rc == DLOCK_OK)
        TU_RELEASE_OK(via.l);
    ck_assert_msg(rc == DLOCK_ETIMEDOUT, "the next wait went out before the owed unwait: %s, "
                  "%lld writer record(s) left (readers kept out)", dlock_err_name(rc), records);
    tu_relay_gate(&px.r, GATE_STALLED, false);
    ck_assert_msg(writers_become(ctx, "uwo", 0), "the owed unwait never ran");
    tu_acquire_release(via.l, 1000);
    tu_acquire_release(reader, DLOCK_TRY); /* no record left to keep it out */
    redisFree(ctx);
    TU_FREE_LOCKS(holder, reader);
    TU_CLOSE_CLIENTS(d);
    tu_solo_close(&via);
    stop_server();
}

/* Once the keeper's cancel of the acquire of NAME that PX holds back
 * (stall_acquire) is recorded on the server, the held request is let
 * through: it must take nothing and spend no token. */
static void held_acquire_does_nothing(redisContext *ctx, struct proxy *px, const char *name)
{
    for (int i = 0; i < 2000 && cmd_int(ctx, "EXISTS dlock_canceled:{%s}", name) == 0; i++)
        tu_sleep_ms(10);
    ck_assert_msg(cmd_int(ctx, "EXISTS dlock_canceled:{%s}", name) == 1,
                  "the held acquire of '%s' was never canceled on the server", name);
    tu_relay_gate(&px->r, GATE_STALLED, false);
    ck_assert_msg(wait_flag(&px->r.served[GATE_STALLED], 20000), "the held request never ran");
    ck_assert_msg(cmd_int(ctx, "EXISTS %s", name) == 0, "the held acquire took '%s'", name);
    ck_assert_msg(cmd_int(ctx, "GET redisson_lock_token:{%s}", name) == -1000,
                  "the held acquire of '%s' spent a token", name);
}

/* A cancel ends a wait whose request is in flight: here the acquire's
 * script is held in the proxy (the connection open, no reply) when the
 * wait's cancel object fires. The acquire returns DLOCK_ECANCELED then,
 * not after the op timeout (30 s; given 15 s), and owes the cancel of
 * that request, which was sent and may still run: once the keeper's
 * cancel is recorded, the held request reaches the server and takes
 * nothing, spends no token. (The request in flight did not see the
 * cancel: the acquire returned only once the proxy let it through.) */
TU_TEST(cancel_ends_a_request_in_flight, 60)
{
    struct proxy px;
    redisContext *ctx;
    struct tu_solo via = served_proxied(&px, "infl", &ctx);
    dlock_cancel *k = NULL;
    ck_assert_int_eq(dlock_cancel_new(&k), DLOCK_OK);
    atomic_store(&px.stall_acquire, 1);
    struct tu_waiter w;
    tu_waiter_start_ex(&w, via.l, DLOCK_FOREVER, k, false);
    ck_assert_msg(wait_flag(&px.stalled, 20000), "the acquire never reached the proxy");
    ck_assert_int_eq(dlock_cancel_fire(k), DLOCK_OK);
    bool returned = tu_waiter_wait_done(&w, 15000);
    if (!returned)
        tu_relay_gate(&px.r, GATE_STALLED, false);
    int rc = tu_waiter_join(&w);
    ck_assert_msg(returned, "the canceled acquire returned only once its request was answered (%s)",
                  dlock_err_name(rc));
    ck_assert_msg(rc == DLOCK_ECANCELED, "%s", dlock_err_name(rc));
    held_acquire_does_nothing(ctx, &px, "infl");
    tu_acquire_release(via.l, DLOCK_TRY);
    dlock_cancel_free(k);
    redisFree(ctx);
    tu_solo_close(&via);
    stop_server();
}

/* A bounded wait whose first request the wait's own end cuts short (the
 * acquire held in the proxy past the 300 ms wait, the op timeout 30 s)
 * returns DLOCK_ETIMEDOUT, the reply's loss in the message, as the tries
 * after the first already did: a wait that ran out, not an outage -- a
 * slow reply under load made check_contract's time_bound see DLOCK_ECONN.
 * What the held request may do is owed as ever: let through after the
 * keeper's cancel is recorded, it takes nothing. */
TU_TEST(first_try_cut_by_the_wait_times_out, 60)
{
    struct proxy px;
    redisContext *ctx;
    struct tu_solo via = served_proxied(&px, "cut", &ctx);
    atomic_store(&px.stall_acquire, 1);
    int rc = dlock_acquire(via.l, 300);
    ck_assert_msg(rc == DLOCK_ETIMEDOUT, "%s: %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_msg(strstr(dlock_errmsg(), "no reply within"), "%s", dlock_errmsg());
    held_acquire_does_nothing(ctx, &px, "cut");
    tu_acquire_release(via.l, DLOCK_TRY);
    redisFree(ctx);
    tu_solo_close(&via);
    stop_server();
}

/* Fill the accept queue of the stopped server on PORT (started with
 * --tcp-backlog 0) with connects of our own, until one no longer
 * completes: the kernel then drops further SYNs, so a dial's connect
 * hangs as to a host behind a firewall that drops. The sockets, until
 * the server is continued, into FDS[0..MAX); how many. */
static int fill_accept_queue(int port, int *fds, int max)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (int n = 0; n < max; n++) {
        int c = fds[n] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        ck_assert_int_ge(c, 0);
        if (connect(c, (struct sockaddr *)&a, sizeof a) == 0)
            continue;
        struct pollfd p = {.fd = c, .events = POLLOUT};
        if (poll(&p, 1, 500) == 0)
            return n + 1; /* this one hangs: so will the client's */
    }
    ck_abort_msg("the accept queue of port %d never filled", port);
    return max;
}

/* A cancel ends a wait whose connection is being set up on a stalled
 * server: the pooled connection killed (CLIENT KILL) and the server
 * stopped (SIGSTOP), a wait's acquire finds the connection closed and
 * dials again -- in AUTH the connect completes (the kernel queues it)
 * and AUTH gets no answer; in CONNECT (--tcp-backlog 0, the accept queue
 * filled) the connect itself hangs. Canceled once the waiter is seen
 * blocked, it must return DLOCK_ECANCELED while the server is still
 * stopped, not after the connect or op timeout (30 s; given 15 s). Once
 * the server is continued, what the lost attempt owes is sent and the
 * name is free. */
enum stalled_setup { STALLED_AUTH, STALLED_CONNECT };

static void cancel_ends_a_stalled_setup(enum stalled_setup step)
{
    const char *auth[] = {"--requirepass", "pw", NULL};
    const char *connect_args[] = {"--tcp-backlog", "0", NULL};
    start_server(step == STALLED_AUTH ? auth : connect_args);
    const char *pw = step == STALLED_AUTH ? "pw" : NULL;
    char *url = tu_fmt("redis://%s127.0.0.1:%d?timeout=30s&connect_timeout=30s&lease=60s",
                       pw ? ":pw@" : "", srv.port);
    struct tu_solo s = tu_solo_open(url, "setup");
    redisContext *ctx = fx_redis_raw(&srv, pw);
    ck_assert_ptr_nonnull(ctx);
    freeReplyObject(cmd(ctx, "CLIENT KILL TYPE normal SKIPME yes")); /* the pooled connection */
    tu_pause(srv.pid);
    int fillers[64], nfill = 0;
    if (step == STALLED_CONNECT)
        nfill = fill_accept_queue(srv.port, fillers, 64);
    int rc;
    bool returned = tu_canceled_wait_returns(s.l, false, srv.pid, 15000, &rc);
    ck_assert_msg(returned, "the canceled acquire returned only once the stalled %s ended (%s)",
                  step == STALLED_AUTH ? "AUTH" : "connect", dlock_err_name(rc));
    ck_assert_msg(rc == DLOCK_ECANCELED, "%s", dlock_err_name(rc));
    for (int i = 0; i < nfill; i++)
        close(fillers[i]);
    tu_acquire_release(s.l, 20000); /* sends what is owed first */
    redisFree(ctx);
    tu_solo_close(&s);
    stop_server();
}

/* (AUTH was sent with the op timeout, whatever the wait's cancel: the
 * canceled acquire returned 30 s later.) */
TU_TEST(cancel_ends_a_stalled_auth, 90)
{
    cancel_ends_a_stalled_setup(STALLED_AUTH);
}

/* (The dial's poll watched the socket only: the canceled acquire
 * returned after the connect timeout.) */
TU_TEST(cancel_ends_a_stalled_connect, 90)
{
    cancel_ends_a_stalled_setup(STALLED_CONNECT);
}

/* An acquire that never got its request onto a connection (the dial
 * failed: here AUTH meets a closed connection) has nothing to undo: it
 * must not dial again to undo it. */
TU_TEST(no_undo_when_nothing_was_sent, 60)
{
    const char *extra[] = {"--requirepass", "pw", NULL};
    start_server(extra);
    struct proxy px;
    struct tu_solo via = proxied_open(&px, ":pw@", NULL, "unsent");
    tu_relay_set(&px.r, TU_RELAY_REFUSE); /* closes every live connection */
    /* the pooled connection is dead: a status sends on it and retires it
     * (an acquire would owe a cancel, which the keeper would dial for) */
    dlock_info *info = NULL;
    ck_assert_int_eq(dlock_inspect(via.c, "unsent", &info), DLOCK_ECONN);
    atomic_store(&px.r.accepts, 0);
    int rc = dlock_acquire(via.l, DLOCK_TRY);
    ck_assert_msg(rc == DLOCK_ECONN, "%s: %s", dlock_err_name(rc), dlock_errmsg());
    tu_solo_close(&via); /* the close runs any cancel still queued once more */
    ck_assert_msg(atomic_load(&px.r.accepts) == 1,
                  "%d connections for one acquire whose dial failed (an undo dialed again)",
                  atomic_load(&px.r.accepts));
    stop_server();
}

/* fork(); the child has SIGPIPE's default action in force (not ignored,
 * not blocked), as a program that never touched it. */
static pid_t fork_default_sigpipe(void)
{
    pid_t pid = tu_fork();
    if (pid == 0) {
        signal(SIGPIPE, SIG_DFL);
        sigset_t pipe_set;
        sigemptyset(&pipe_set);
        sigaddset(&pipe_set, SIGPIPE);
        pthread_sigmask(SIG_UNBLOCK, &pipe_set, NULL);
    }
    return pid;
}

/* Wait for the child PID: it must have exited 0, not died of a signal. */
static void assert_child_lived(pid_t pid)
{
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(!WIFSIGNALED(status), "the client died of signal %d (%s)", WTERMSIG(status),
                  strsignal(WTERMSIG(status)));
    ck_assert_msg(WEXITSTATUS(status) == 0, "the client exited %d", WEXITSTATUS(status));
}

/* ------------------------------------------------ a misbehaving server */

/* A fake Redis server on loopback, a thread per connection: it answers
 * SCRIPT LOAD as a server would (any 40-character digest does) and
 * misbehaves at the first other command, the way a broken server or a
 * hostile proxy could. */
enum fake_mode {
    FAKE_HUGE_BULK, /* announce a 1 GiB bulk string and stream it as fast as it goes */
    FAKE_TRICKLE,   /* announce a reply, then send it one byte per 100 ms, forever */
    FAKE_CLOSE,     /* read a little of the command, then close the connection */
    FAKE_ZERO_TOKEN, /* answer the acquire's script with :0, a grant of token 0 */
};

struct fake_server {
    int listen_fd, port;
    enum fake_mode mode;
    pthread_t thread;
    atomic_int stop;
    atomic_int misbehaved; /* connections that got the bad answer */
};

struct fake_conn {
    struct fake_server *fs;
    int fd;
};

static void fake_misbehave(struct fake_server *fs, int fd)
{
    atomic_fetch_add(&fs->misbehaved, 1);
    if (fs->mode == FAKE_HUGE_BULK) {
        static char zeros[64 * 1024];
        const char *head = "$1073741824\r\n";
        if (!tu_send_all(fd, head, strlen(head)))
            return;
        for (size_t sent = 0; sent < (1u << 30) && !atomic_load(&fs->stop); sent += sizeof zeros)
            if (!tu_send_all(fd, zeros, sizeof zeros))
                return;
    } else if (fs->mode == FAKE_TRICKLE) {
        if (!tu_send_all(fd, "$1000\r\n", 7))
            return;
        while (!atomic_load(&fs->stop) && tu_send_all(fd, "x", 1))
            tu_sleep_ms(100);
    } else if (fs->mode == FAKE_ZERO_TOKEN) {
        tu_send_all(fd, ":0\r\n", 4);
    }
    /* FAKE_CLOSE: the caller closes with the command half read */
}

static void *fake_conn_main(void *arg)
{
    struct fake_conn *fc = arg;
    struct fake_server *fs = fc->fs;
    redisReader *rd = redisReaderCreate();
    char buf[4096];
    bool done = false;
    while (!done && !atomic_load(&fs->stop)) {
        struct pollfd p = {.fd = fc->fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t n = recv(fc->fd, buf, sizeof buf, 0);
        if (n <= 0)
            break;
        redisReaderFeed(rd, buf, (size_t)n);
        void *cmd = NULL;
        while (!done && redisReaderGetReply(rd, &cmd) == REDIS_OK && cmd) {
            redisReply *r = cmd;
            if (r->type == REDIS_REPLY_ARRAY && r->elements >= 2 &&
                strcasecmp(r->element[0]->str, "SCRIPT") == 0) {
                const char *sha = "$40\r\n0123456789012345678901234567890123456789\r\n";
                done = !tu_send_all(fc->fd, sha, strlen(sha));
            } else {
                fake_misbehave(fs, fc->fd);
                done = true;
            }
            freeReplyObject(r);
        }
        if (!done && fs->mode == FAKE_CLOSE && rd->len - rd->pos > 0) {
            /* a command is arriving: close under the writer */
            atomic_fetch_add(&fs->misbehaved, 1);
            done = true;
        }
    }
    redisReaderFree(rd);
    close(fc->fd);
    free(fc);
    return NULL;
}

static void *fake_main(void *arg)
{
    struct fake_server *fs = arg;
    while (!atomic_load(&fs->stop)) {
        struct pollfd p = {.fd = fs->listen_fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        int fd = accept(fs->listen_fd, NULL, NULL);
        if (fd < 0)
            continue;
        struct fake_conn *fc = malloc(sizeof *fc);
        fc->fs = fs;
        fc->fd = fd;
        tu_thread_detached(fake_conn_main, fc);
    }
    return NULL;
}

static void fake_start(struct fake_server *fs, enum fake_mode mode)
{
    memset(fs, 0, sizeof *fs);
    fs->mode = mode;
    fs->listen_fd = listen_loopback(&fs->port);
    ck_assert_int_eq(pthread_create(&fs->thread, NULL, fake_main, fs), 0);
}

static void fake_stop(struct fake_server *fs)
{
    atomic_store(&fs->stop, 1);
    pthread_join(fs->thread, NULL);
    close(fs->listen_fd);
}

/* An acquire through the fake server in MODE with URL options QUERY: its
 * result code, the message kept in MSG. */
static int acquire_from_fake(struct fake_server *fs, enum fake_mode mode, const char *query,
                             char *msg, size_t msg_len)
{
    fake_start(fs, mode);
    char *url = tu_fmt("redis://127.0.0.1:%d?%s", fs->port, query);
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock(c, "fake");
    int rc = dlock_acquire(l, DLOCK_TRY);
    snprintf(msg, msg_len, "%s", dlock_errmsg());
    dlock_lock_free(l);
    dlock_client_close(c);
    fake_stop(fs);
    free(url);
    return rc;
}

/* A server that announces a 1 GiB bulk string and streams it: the reply
 * is cut at the cap with a message saying so, and the client's memory
 * stays far from the gigabyte (hiredis alone would buffer it all). The
 * generous timeout makes the cap, not the clock, end it. */
TU_TEST(huge_reply_is_capped, 60)
{
    struct rusage before, after;
    getrusage(RUSAGE_SELF, &before);
    struct fake_server fs;
    char msg[512];
    int rc = acquire_from_fake(&fs, FAKE_HUGE_BULK, "timeout=50s", msg, sizeof msg);
    getrusage(RUSAGE_SELF, &after);
    ck_assert_msg(rc == DLOCK_ECONN, "%s: %s", dlock_err_name(rc), msg);
    ck_assert_msg(strstr(msg, "a reply larger than") != NULL, "%s", msg);
    long grown_mib = (after.ru_maxrss - before.ru_maxrss) / 1024;
    /* half the announced gigabyte: the cap is 32 MiB, but a sanitizer's
     * quarantine and shadow memory keep what the reader's buffer freed
     * as it grew (~350 MiB under ASan); without the cap the whole
     * gigabyte is buffered */
    ck_assert_msg(grown_mib < 512, "the client's memory grew by %ld MiB on a 1 GiB reply", grown_mib);
}

/* A server that trickles its reply one byte per 100 ms: each byte comes
 * well within the timeout, but the request as a whole does not, and that
 * is what the timeout bounds (hiredis alone would wait forever). */
TU_TEST(trickled_reply_times_out, 60)
{
    struct fake_server fs;
    char msg[512];
    int rc = acquire_from_fake(&fs, FAKE_TRICKLE, "timeout=1s", msg, sizeof msg);
    ck_assert_msg(rc == DLOCK_ECONN, "%s: %s", dlock_err_name(rc), msg);
    ck_assert_msg(strstr(msg, "no reply within") != NULL, "%s", msg);
    ck_assert_int_ge(atomic_load(&fs.misbehaved), 1);
}

/* A server that answers the acquire's script with 0: the script answers
 * a grant with its token, which is never 0 (the counter starts at 1, or
 * from the server's clock), so 0 is a reply dlock's script never gives,
 * not a grant. */
TU_TEST(zero_token_is_no_grant, 60)
{
    struct fake_server fs;
    char msg[512];
    int rc = acquire_from_fake(&fs, FAKE_ZERO_TOKEN, "timeout=5s", msg, sizeof msg);
    ck_assert_msg(rc == DLOCK_EPROTO, "%s: %s", dlock_err_name(rc), msg);
    ck_assert_msg(strstr(msg, "token 0") != NULL, "%s", msg);
    ck_assert_int_ge(atomic_load(&fs.misbehaved), 1);
}

/* A server that closes the connection while a large command is being
 * written to it (an 8 MiB password): in a program with SIGPIPE's default
 * action, the dial fails with DLOCK_ECONN and the program lives. */
TU_TEST(server_closing_mid_write_survived, 60)
{
    struct fake_server fs;
    fake_start(&fs, FAKE_CLOSE);
    pid_t pid = fork_default_sigpipe();
    if (pid == 0) {
        char *url = tu_fmt("redis://127.0.0.1:%d?timeout=10s", fs.port);
        size_t big = 8u << 20;
        char *password = malloc(big + 1);
        memset(password, 'p', big);
        password[big] = 0;
        dlock_client *c = NULL;
        if (dlock_client_new(url, &c) != DLOCK_OK ||
            dlock_client_setopt_str(c, DLOCK_OPT_PASSWORD, password) != DLOCK_OK)
            _exit(2);
        int rc = dlock_client_connect(c);
        if (rc != DLOCK_ECONN) {
            fprintf(stderr, "connect: %s: %s\n", dlock_err_name(rc), dlock_errmsg());
            _exit(3);
        }
        dlock_client_close(c);
        _exit(0);
    }
    assert_child_lived(pid);
    fake_stop(&fs);
    ck_assert_int_ge(atomic_load(&fs.misbehaved), 1);
}

/* A program that keeps SIGPIPE's default action survives a server that
 * closes a pooled connection (FIN, then a reset): the next request's
 * write fails with EPIPE, and the library must neither die of SIGPIPE nor
 * fail the request (it goes again on a fresh connection). In a forked
 * child, so the default action is really the one in force. */
TU_TEST(sigpipe_default_action_survives, 60)
{
    start_server(NULL);
    pid_t pid = fork_default_sigpipe();
    if (pid == 0) {
        struct proxy px;
        proxy_start(&px, srv.port, "pipe");
        char *url = tu_fmt("redis://127.0.0.1:%d", px.r.port);
        dlock_client *c = NULL;
        if (dlock_open(url, &c) != DLOCK_OK)
            _exit(2);
        dlock_lock *l = NULL;
        if (dlock_lock_new(c, "pipe", DLOCK_EXCLUSIVE, 0, &l) != DLOCK_OK)
            _exit(2);
        if (dlock_acquire(l, DLOCK_TRY) != DLOCK_OK || dlock_release(l) != DLOCK_OK)
            _exit(3);
        tu_relay_cut(&px.r, true);
        int rc = dlock_acquire(l, DLOCK_TRY);
        if (rc != DLOCK_OK) {
            fprintf(stderr, "acquire after the reset: %s: %s\n", dlock_err_name(rc), dlock_errmsg());
            _exit(5);
        }
        dlock_release(l);
        dlock_lock_free(l);
        dlock_client_close(c);
        _exit(0);
    }
    assert_child_lived(pid);
    stop_server();
}

/* A busy reply whose TTL is absurd (a server or proxy answering
 * :-9223372036854775808): the waiter's safety-net sleep is clamped, not
 * overflowed into a past time that would make it spin. */
TU_TEST(absurd_busy_reply_is_clamped, 60)
{
    struct tu_solo s = served_open("lease=60s", "spin");
    TU_ACQUIRE_OK(s.l, DLOCK_TRY);
    struct proxy px;
    struct tu_solo via = proxied_open(&px, NULL, NULL, "spin");
    px.r.cf.forged = ":-9223372036854775808\r\n";
    atomic_store(&px.forge_acquire, 1);
    int rc = dlock_acquire(via.l, 500);
    ck_assert_msg(rc == DLOCK_ETIMEDOUT, "%s: %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_msg(atomic_load(&px.r.forged) <= 4, "%d acquire calls in one 500 ms wait: the sleep "
                  "until the holder's TTL overflowed", atomic_load(&px.r.forged));
    tu_solo_close(&via);
    dlock_release(s.l);
    served_close(&s);
}

/* Fencing tokens keep growing across a restart that loses the data (no
 * persistence): an absent counter starts from the server's clock in
 * microseconds, so the next token is greater than every earlier one. A
 * Redisson-style INCR on the same counter goes on from there. */
TU_TEST(tokens_survive_a_data_losing_restart, 60)
{
    struct tu_solo s = served_open(NULL, "fenced");
    TU_ACQUIRE_OK(s.l, DLOCK_TRY);
    uint64_t t1 = tu_token(s.l);
    ck_assert_int_eq(dlock_release(s.l), DLOCK_OK);
    TU_ACQUIRE_OK(s.l, DLOCK_TRY);
    ck_assert_uint_eq(tu_token(s.l), t1 + 1);
    ck_assert_int_eq(dlock_release(s.l), DLOCK_OK);
    ck_assert(fx_redis_restart(&srv));
    TU_ACQUIRE_OK(s.l, 10000);
    uint64_t t2 = tu_token(s.l);
    ck_assert_msg(t2 > t1 + 1, "token %llu after the restart, %llu before",
                  (unsigned long long)t2, (unsigned long long)t1 + 1);
    ck_assert_msg(t2 < (1ull << 53), "token %llu is past 2^53", (unsigned long long)t2);
    ck_assert_int_eq(dlock_release(s.l), DLOCK_OK);
    redisContext *ctx = raw();
    ck_assert_int_eq(cmd_int(ctx, "INCR %s", "redisson_lock_token:{fenced}"), (long long)t2 + 1);
    redisFree(ctx);
    served_close(&s);
}

/* Every counter dlock keeps on Redis follows the lock's rule: absent (a
 * new name, data lost in a restart) or below 10^15, it goes on from the
 * server's clock in microseconds. Semaphore tokens: 1 2 3, then after a
 * restart without persistence 1 2 again, before the rule reached
 * sem_acquire.lua; and a new name's first token was 1. */
/* K=1 of S within 10 s; a try on a connection the restart closed fails
 * DLOCK_ECONN (a semaphore acquire whose reply is lost is not sent
 * again: its ids go to the cleanup queue), so such a try is made again. */
static dlock_permit *permit_after_restart(dlock_semaphore *s)
{
    dlock_permit *p = NULL;
    int rc = DLOCK_ECONN;
    for (int tries = 0; tries < 20 && rc == DLOCK_ECONN; tries++)
        rc = dlock_semaphore_acquire(s, 1, 10000, NULL, &p);
    ck_assert_msg(rc == DLOCK_OK, "semaphore acquire: %s: %s", dlock_err_name(rc), dlock_errmsg());
    return p;
}

TU_TEST(semaphore_tokens_survive_a_data_losing_restart, 60)
{
    start_server(NULL);
    dlock_client *c = open_with(NULL);
    dlock_semaphore *s = tu_semaphore(c, "stok", 3);
    uint64_t last = 0;
    for (int round = 0; round < 2; round++) {
        dlock_permit *p[3];
        for (int i = 0; i < 3; i++) {
            p[i] = permit_after_restart(s);
            uint64_t t = 0;
            ck_assert_int_eq(dlock_permit_token(p[i], &t), DLOCK_OK);
            ck_assert_msg(t > last, "round %d permit %d: token %llu after %llu", round, i,
                          (unsigned long long)t, (unsigned long long)last);
            ck_assert_msg(t < (1ull << 53), "token %llu is past 2^53", (unsigned long long)t);
            last = t;
        }
        for (int i = 0; i < 3; i++)
            ck_assert_int_eq(dlock_permit_release(p[i]), DLOCK_OK);
        if (round == 0)
            ck_assert(fx_redis_restart(&srv));
    }
    /* a new name starts above what the other names issued */
    dlock_semaphore *fresh = tu_semaphore(c, "snew", 2);
    dlock_permit *p = tu_permit(fresh, 1, DLOCK_TRY);
    uint64_t t = 0;
    ck_assert_int_eq(dlock_permit_token(p, &t), DLOCK_OK);
    ck_assert_msg(t > last, "new semaphore: first token %llu, %llu issued before",
                  (unsigned long long)t, (unsigned long long)last);
    ck_assert_int_eq(dlock_permit_release(p), DLOCK_OK);
    dlock_semaphore_free(fresh);
    dlock_semaphore_free(s);
    dlock_client_close(c);
    stop_server();
}

/* The version of an election's value, the same rule: it went on from 1
 * after a data-losing restart (and began at 1), so a reader that kept a
 * version saw the same number again for another value. */
TU_TEST(election_versions_survive_a_data_losing_restart, 60)
{
    start_server(NULL);
    dlock_client *c = open_with(NULL);
    uint64_t last = 0;
    for (int round = 0; round < 2; round++) {
        dlock_election *e = NULL;
        ck_assert_int_eq(dlock_election_new(c, "ever", 0, &e), DLOCK_OK);
        ck_assert_int_eq(dlock_election_campaign(e, "a", 10000, NULL), DLOCK_OK);
        for (int i = 0; i < 2; i++) {
            if (i)
                ck_assert_int_eq(dlock_election_proclaim(e, "b"), DLOCK_OK);
            dlock_leader *l = NULL;
            ck_assert_int_eq(dlock_election_leader(c, "ever", &l), DLOCK_OK);
            uint64_t v = dlock_leader_version(l);
            ck_assert_msg(v > last, "round %d write %d: version %llu after %llu", round, i,
                          (unsigned long long)v, (unsigned long long)last);
            ck_assert_msg(v < (1ull << 53), "version %llu is past 2^53", (unsigned long long)v);
            last = v;
            dlock_leader_free(l);
        }
        if (round == 0) {
            ck_assert(fx_redis_restart(&srv));
            dlock_election_resign(e); /* its lock went with the data */
        } else {
            ck_assert_int_eq(dlock_election_resign(e), DLOCK_OK);
        }
        dlock_election_free(e);
    }
    dlock_client_close(c);
    stop_server();
}

/* Token arithmetic at the edges of the counter, in both layouts: tokens
 * of 15 digits and more are written exactly (Lua formats 1e14 as
 * "1e+14"); a counter past 2^53 (where Lua numbers stop being exact and
 * tokens would repeat) is a clear error with nothing written; a negative
 * counter never leaves a hold written but reported as busy. */
static void token_edges(const char *layout)
{
    start_server(NULL);
    char *q = tu_fmt("layout=%s", layout);
    dlock_client *c = open_with(q);
    redisContext *ctx = raw();
    bool simple = strcmp(layout, "simple") == 0;

    freeReplyObject(cmd(ctx, "SET %s 99999999999999", "redisson_lock_token:{big}"));
    dlock_lock *l = tu_lock(c, "big");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    uint64_t t = tu_token(l);
    ck_assert_uint_ge(t, 100000000000000ull);
    if (simple) {
        char *v = reply_str(cmd(ctx, "GET big"));
        char *suffix = tu_fmt(":%llu", (unsigned long long)t);
        ck_assert_msg(v && strlen(v) > strlen(suffix) && strcmp(v + strlen(v) - strlen(suffix), suffix) == 0,
                      "value '%s' does not end in '%s'", v ? v : "(nil)", suffix);
        free(v);
        free(suffix);
    }
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);

    freeReplyObject(cmd(ctx, "SET %s 9007199254740993", "redisson_lock_token:{huge}"));
    l = tu_lock(c, "huge");
    int rc = dlock_acquire(l, DLOCK_TRY);
    ck_assert_msg(rc == DLOCK_EBACKEND, "counter past 2^53: %s: %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_msg(strstr(dlock_errmsg(), "2^53") && strstr(dlock_errmsg(), "redisson_lock_token:{huge}"),
                  "%s", dlock_errmsg());
    ck_assert_int_eq(cmd_int(ctx, "EXISTS huge"), 0);
    dlock_lock_free(l);

    freeReplyObject(cmd(ctx, "SET %s -5", "redisson_lock_token:{neg}"));
    l = tu_lock(c, "neg");
    rc = dlock_acquire(l, DLOCK_TRY);
    if (rc == DLOCK_OK) {
        ck_assert_uint_gt(tu_token(l), 0);
        ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    }
    ck_assert_msg(cmd_int(ctx, "EXISTS neg") == 0, "a hold was left written (acquire said %s)",
                  dlock_err_name(rc));
    dlock_lock_free(l);
    redisFree(ctx);
    dlock_client_close(c);
    free(q);
    stop_server();
}

TU_TEST(token_edges_redisson_layout, 60)
{
    token_edges("redisson");
}

TU_TEST(token_edges_simple_layout, 60)
{
    token_edges("simple");
}

/* force release, status and list act only on keys of a lock's shape:
 * every hash field "<uuid>:<digits>" (redisson), a value
 * "<uuid>:<tid>:<token>" (simple). An application's hash or string is
 * left alone and its value never shown as a holder. */
TU_TEST(force_status_list_touch_only_locks, 60)
{
    redisContext *ctx = served_raw();
    freeReplyObject(cmd(ctx, "HSET user:1000 name alice age 30"));
    freeReplyObject(cmd(ctx, "SET app:config secret-value"));
    freeReplyObject(cmd(ctx, "SET app:cache secret-cached PX 60000"));
    for (int simple = 0; simple < 2; simple++) {
        dlock_client *c = open_with(simple ? "layout=simple" : "");
        const char *name = simple ? "app:config" : "user:1000";
        int rc = dlock_force_release(c, name);
        ck_assert_msg(rc == DLOCK_EWRONGTYPE, "force on %s: %s: %s", name, dlock_err_name(rc),
                      dlock_errmsg());
        ck_assert_int_eq(cmd_int(ctx, "EXISTS %s", name), 1);
        dlock_info *info = NULL;
        rc = dlock_inspect(c, name, &info);
        if (rc == DLOCK_OK) {
            for (size_t i = 0; i < dlock_info_holder_count(info); i++) {
                const char *who = dlock_info_holder(info, i, NULL);
                ck_assert_msg(!strstr(who, "secret") && !strstr(who, "alice") && strcmp(who, "name") != 0,
                              "status shows '%s' as a holder", who);
            }
            dlock_info_free(info);
        } else {
            ck_assert_int_eq(rc, DLOCK_EWRONGTYPE);
        }
        char *all = tu_list_text(c, NULL, ",");
        ck_assert_msg(!strstr(all, "app:") && !strstr(all, "user:"), "list shows '%s'", all);
        /* a real lock is still forced, listed and shown */
        dlock_lock *l = tu_lock(c, "real");
        TU_ACQUIRE_OK(l, DLOCK_TRY);
        free(all);
        all = tu_list_text(c, NULL, ",");
        ck_assert_str_eq(all, "real,");
        free(all);
        ck_assert_int_eq(dlock_force_release(c, "real"), DLOCK_OK);
        ck_assert_int_eq(cmd_int(ctx, "EXISTS real"), 0);
        dlock_lock_free(l);
        dlock_client_close(c);
    }
    served_raw_close(ctx);
}

/* Names that fall in dlock's own key space (another lock's token counter,
 * channel or cancellation record) are refused, naming the space. */
TU_TEST(own_key_space_names_refused, 60)
{
    struct tu_solo s = served_open(NULL, "x");
    TU_ACQUIRE_OK(s.l, DLOCK_TRY);
    uint64_t t = tu_token(s.l);
    redisContext *ctx = raw();
    const char *names[] = {"redisson_lock_token:{x}", "redisson_lock__channel:{x}", "dlock_canceled:{x}"};
    for (size_t i = 0; i < 3; i++) {
        int rc = dlock_force_release(s.c, names[i]);
        ck_assert_msg(rc == DLOCK_EINVAL, "force %s: %s: %s", names[i], dlock_err_name(rc), dlock_errmsg());
        ck_assert_msg(strstr(dlock_errmsg(), names[i]) != NULL, "%s", dlock_errmsg());
        dlock_info *info = NULL;
        ck_assert_int_eq(dlock_inspect(s.c, names[i], &info), DLOCK_EINVAL);
        dlock_lock *l = tu_lock(s.c, names[i]);
        ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_EINVAL);
        dlock_lock_free(l);
    }
    ck_assert_int_eq(cmd_int(ctx, "GET %s", "redisson_lock_token:{x}"), (long long)t);
    /* with a prefix, the key is prefix + name */
    dlock_client *p = open_with("prefix=redisson_lock_token:");
    ck_assert_int_eq(dlock_force_release(p, "{x}"), DLOCK_EINVAL);
    ck_assert_int_eq(cmd_int(ctx, "GET %s", "redisson_lock_token:{x}"), (long long)t);
    dlock_client_close(p);
    ck_assert_int_eq(dlock_release(s.l), DLOCK_OK);
    redisFree(ctx);
    served_close(&s);
}

/* Names that would be, or share, the keys dlock derives from another
 * name are refused by every primitive, naming the name and why, with
 * nothing written: a lock named dlock_sem_token:{smz} was semaphore smz's
 * counter (whose acquire then failed after it had taken a permit), a lock
 * named dlock_leader:{elz} shared one hash with election elz, and
 * semaphores x and {x} shared {x}:timeout (as locks x and {x} shared
 * redisson_lock_token:{x}). Names merely like them are taken. */
TU_TEST(names_aliasing_derived_keys_refused, 60)
{
    start_server(NULL);
    dlock_client *c = open_with(NULL);
    redisContext *ctx = raw();
    const char *refused[] = {
        "dlock_sem_token:{smz}", "dlock_sem_released:{smz}", "redisson_sc:{smz}",
        "{smz}:timeout", "a{b}:timeout", "dlock_leader:{elz}", "dlock_leader__channel:{elz}",
        "dlock_fair_queue:{f}", "dlock_fair_waiters:{f}", "dlock_fair__channel:u",
        "dlock_client:u",
        "{rw}:0b7e5d64-6f1c-4c6a-9d41-1d7f3f3c8a21:1:rwlock_timeout:1", "{x}", "{x}}",
        "{x}y}", "redisson_lock_token:{x}", "dlock_name:{x}"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        const char *n = refused[i];
        dlock_lock *l = tu_lock(c, n);
        int rc = dlock_acquire(l, DLOCK_TRY);
        ck_assert_msg(rc == DLOCK_EINVAL && strstr(dlock_errmsg(), n), "lock '%s': %s: %s", n,
                      dlock_err_name(rc), dlock_errmsg());
        dlock_lock_free(l);
        dlock_semaphore *sem = tu_semaphore(c, n, 2);
        dlock_permit *p = NULL;
        rc = dlock_semaphore_acquire(sem, 1, DLOCK_TRY, NULL, &p);
        ck_assert_msg(rc == DLOCK_EINVAL && strstr(dlock_errmsg(), n), "semaphore '%s': %s: %s",
                      n, dlock_err_name(rc), dlock_errmsg());
        dlock_info *info = NULL;
        ck_assert_int_eq(dlock_semaphore_inspect(c, n, 2, &info), DLOCK_EINVAL);
        dlock_semaphore_free(sem);
        dlock_election *e = NULL;
        ck_assert_int_eq(dlock_election_new(c, n, 0, &e), DLOCK_OK);
        rc = dlock_election_campaign(e, "v", DLOCK_TRY, NULL);
        ck_assert_msg(rc == DLOCK_EINVAL, "election '%s': %s: %s", n, dlock_err_name(rc),
                      dlock_errmsg());
        dlock_election_free(e);
        ck_assert_msg(cmd_int(ctx, "DBSIZE") == 0, "'%s' wrote a key", n);
    }
    const char *taken[] = {"job:timeout", "a{b}", "{a}b", "x", "x}", "dlock_semx", "x:{y}z"};
    for (size_t i = 0; i < sizeof taken / sizeof taken[0]; i++) {
        dlock_lock *l = tu_lock(c, taken[i]);
        TU_ACQUIRE_OK(l, DLOCK_TRY);
        ck_assert_int_eq(dlock_release(l), DLOCK_OK);
        dlock_lock_free(l);
        dlock_semaphore *sem = tu_semaphore(c, taken[i], 2);
        dlock_permit *p = tu_permit(sem, 1, DLOCK_TRY);
        ck_assert_int_eq(dlock_permit_release(p), DLOCK_OK);
        dlock_semaphore_free(sem);
    }
    /* a token counter that cannot count fails the acquire before any
     * permit is taken */
    freeReplyObject(cmd(ctx, "HSET %s a 1", "dlock_sem_token:{smz}"));
    dlock_semaphore *sem = tu_semaphore(c, "smz", 2);
    dlock_permit *p = NULL;
    int rc = dlock_semaphore_acquire(sem, 1, DLOCK_TRY, NULL, &p);
    ck_assert_msg(rc != DLOCK_OK, "acquire took a permit");
    dlock_info *info = NULL;
    ck_assert_int_eq(dlock_semaphore_inspect(c, "smz", 2, &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_free_permits(info), 2);
    dlock_info_free(info);
    dlock_semaphore_free(sem);
    redisFree(ctx);
    dlock_client_close(c);
    stop_server();
}

/* A semaphore and a lock of one name share its key, as in Redisson (one
 * name, one object): each refuses the other as the wrong type, with
 * nothing written. The simple layout's lock value is a string too, which
 * the semaphore took for its count (a Lua error, DLOCK_EBACKEND). */
TU_TEST(semaphore_refuses_a_simple_lock_of_its_name, 60)
{
    start_server(NULL);
    dlock_client *c = open_with("layout=simple");
    dlock_lock *l = tu_lock(c, "shared");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    redisContext *ctx = raw();
    char *before = reply_str(cmd(ctx, "GET shared"));
    dlock_semaphore *sem = tu_semaphore(c, "shared", 2);
    dlock_permit *p = NULL;
    int rc = dlock_semaphore_acquire(sem, 1, DLOCK_TRY, NULL, &p);
    ck_assert_msg(rc == DLOCK_EWRONGTYPE, "%s: %s", dlock_err_name(rc), dlock_errmsg());
    char *after = reply_str(cmd(ctx, "GET shared"));
    ck_assert_str_eq(after, before);
    ck_assert_int_eq(cmd_int(ctx, "EXISTS %s", "{shared}:timeout"), 0);
    dlock_info *info = NULL;
    rc = dlock_semaphore_inspect(c, "shared", 2, &info);
    ck_assert_msg(rc == DLOCK_EWRONGTYPE, "inspect: %s: %s", dlock_err_name(rc), dlock_errmsg());
    free(before);
    free(after);
    dlock_semaphore_free(sem);
    TU_RELEASE_OK(l);
    dlock_lock_free(l);
    redisFree(ctx);
    dlock_client_close(c);
    stop_server();
}

/* The reply of an acquire or release lost to a timeout (CLIENT PAUSE
 * holds the scripts on the server longer than the client's operation
 * timeout): the first attempt spent the call's budget, so the call fails
 * DLOCK_ECONN rather than trying again past its timeout, and nothing is
 * double-counted: the owner's next acquire sends the cancel it owes
 * first and then holds the name once, with the token the counter shows. */
TU_TEST(timed_out_replies_fail_cleanly, 60)
{
    struct tu_solo s = served_open("timeout=500ms&lease=10s", "amb");
    redisContext *ctx = raw();
    freeReplyObject(cmd(ctx, "CLIENT PAUSE 650 WRITE"));
    int rc = dlock_acquire(s.l, DLOCK_TRY);
    ck_assert_msg(rc == DLOCK_ECONN, "acquire: %s: %s", dlock_err_name(rc), dlock_errmsg());
    TU_ACQUIRE_OK(s.l, 10000);
    uint64_t t = tu_token(s.l);
    tu_sleep_ms(300); /* let any duplicate run */
    ck_assert_int_eq(cmd_int(ctx, "GET %s", "redisson_lock_token:{amb}"), (long long)t);
    ck_assert_int_eq(owner_count(ctx, "amb"), 1);

    freeReplyObject(cmd(ctx, "CLIENT PAUSE 650 WRITE"));
    rc = dlock_release(s.l);
    ck_assert_msg(rc == DLOCK_ECONN, "release: %s: %s", dlock_err_name(rc), dlock_errmsg());
    redisFree(ctx);
    served_close(&s);
}

/* Connections the server accepted so far (INFO stats), asked on a fresh
 * connection of its own: it is accepted after every connection the
 * kernel queued before it, so those are counted too. */
static long long connections_received(void)
{
    redisContext *ctx = raw();
    long long n = info_number(ctx, "stats", "total_connections_received");
    ck_assert_msg(n >= 0, "INFO stats has no total_connections_received");
    redisFree(ctx);
    return n;
}

/* A server that stops answering (SIGSTOP, every thread stopped) under a
 * call with no deadline of its own (a release): the call gets one op
 * timeout in all. Its lost reply is not sent again on a fresh connection
 * with a fresh timeout (which made a call take twice its timeout): the
 * retry shares the call's budget, which the first attempt spent. Seen
 * without timing: the stopped server's kernel accepts a retry's connect,
 * so the server counts it once continued; here it counts only the
 * connection that asks. */
TU_TEST(stalled_server_costs_one_op_timeout, 60)
{
    struct tu_solo s = served_open("timeout=1s&lease=60s", "stall");
    TU_ACQUIRE_OK(s.l, DLOCK_TRY); /* an idle pooled connection for the release */
    long long before = connections_received();
    tu_pause(srv.pid);
    int64_t t0 = tu_mono_ms();
    int rc = dlock_release(s.l);
    int64_t took = tu_mono_ms() - t0;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", dlock_errmsg());
    kill(srv.pid, SIGCONT);
    fprintf(stderr, "stalled_server_costs_one_op_timeout: the release returned after %lld ms "
                    "(timeout 1 s)\n", (long long)took); /* informational */
    ck_assert_msg(rc == DLOCK_ECONN, "release: %s: %s", dlock_err_name(rc), msg);
    ck_assert_msg(strstr(msg, "no reply within") != NULL, "%s", msg);
    long long dialed = connections_received() - before - 1; /* (the asking one) */
    ck_assert_msg(dialed == 0, "the stalled release dialed %lld more connection(s): a retry "
                               "with a timeout of its own", dialed);
    served_close(&s);
}

/* Keep the server busy MS ms in a script sent on a connection of its
 * own (returned, to free), and wait until it runs: a PING on a fresh
 * connection gets no answer within 100 ms. */
static redisContext *server_busy(int ms)
{
    redisContext *busy = raw();
    redisAppendCommand(busy, "EVAL %s 0 %d",
                       "local t = redis.call('time') local t0 = t[1] * 1000000 + t[2] "
                       "repeat t = redis.call('time') until t[1] * 1000000 + t[2] - t0 > ARGV[1] * 1000 "
                       "return 1", ms);
    int done = 0;
    while (!done)
        ck_assert_int_eq(redisBufferWrite(busy, &done), REDIS_OK);
    for (int i = 0; i < 200; i++) {
        redisContext *p = raw();
        struct timeval tv = {0, 100000};
        redisSetTimeout(p, tv);
        redisReply *r = redisCommand(p, "PING");
        bool answered = r != NULL;
        freeReplyObject(r);
        redisFree(p);
        if (!answered)
            return busy;
    }
    ck_abort_msg("the server never got busy");
    return busy;
}

/* A writer's wait (default layout) that ends while the server is stalled
 * returns at its end, not when the server answers: its "unwait" (its
 * record in the writers key goes, readers behind it come in) is sent
 * within what is left of the wait, here nothing, and owed to the keeper,
 * which sends it once the server is back. With CANCEL the wait (forever)
 * is canceled once the server stalls, and nothing is left either: the
 * caller asked to stop now. */
static void writer_gives_up_on_a_stalled_server(bool cancel)
{
    struct tu_solo s = served_open("timeout=20s&lease=60s", "uw");
    TU_ACQUIRE_OK(s.l, DLOCK_TRY);
    dlock_client *b = open_with("timeout=20s&lease=60s");
    dlock_lock *lb = tu_lock(b, "uw");
    redisContext *ctx = raw();
    struct tu_waiter wb;
    tu_waiter_start(&wb, lb, cancel ? DLOCK_FOREVER : 1500);
    ck_assert_msg(writers_become(ctx, "uw", 1), "the waiting writer was never recorded");
    ck_assert(tu_wait_thread_asleep(&wb.tid, 60000)); /* its next try is at the wait's end */
    redisContext *busy = server_busy(4500);
    if (cancel)
        ck_assert_int_eq(dlock_lock_cancel(lb), DLOCK_OK);
    int rc = tu_waiter_join(&wb);
    redisContext *p = raw();
    struct timeval tv = {0, 200000};
    redisSetTimeout(p, tv);
    redisReply *r = redisCommand(p, "PING");
    bool stalled = r == NULL;
    freeReplyObject(r);
    redisFree(p);
    ck_assert_int_eq(rc, cancel ? DLOCK_ECANCELED : DLOCK_ETIMEDOUT);
    ck_assert_msg(stalled, "the %s returned only once the stalled server answered",
                  cancel ? "canceled wait" : "1.5 s wait");
    redisReply *done = NULL;
    ck_assert_int_eq(redisGetReply(busy, (void **)&done), REDIS_OK); /* the server is back */
    freeReplyObject(done);
    redisFree(busy);
    ck_assert_msg(writers_become(ctx, "uw", 0), "the keeper never sent the owed unwait");
    redisFree(ctx);
    dlock_lock_free(lb);
    dlock_client_close(b);
    served_close(&s);
}

/* (The unwait was sent in the caller's thread with the op timeout: a
 * 1.5 s wait returned once the stalled server answered.) */
TU_TEST(writer_wait_ends_on_time_on_a_stalled_server, 60)
{
    writer_gives_up_on_a_stalled_server(false);
}

/* (The unwait of a canceled wait was sent in the caller's thread within
 * what was left of a wait forever, the op timeout: the cancel returned
 * once the stalled server answered, 4.5 s later.) */
TU_TEST(canceled_writer_wait_ends_on_a_stalled_server, 60)
{
    writer_gives_up_on_a_stalled_server(true);
}

/* The reply of a downgrade lost after the script ran (the proxy drops it
 * and closes the connection): the script ran (mode "read", readers
 * woken), so the hold is shared now, whatever the retry finds; reporting
 * it lost, or keeping it exclusive, would leave a holder believing the
 * wrong thing while readers come in. */
TU_TEST(lost_downgrade_reply, 60)
{
    struct proxy px;
    struct tu_solo s = layout_proxied(&px, "redisson", "dg");
    dlock_lock *r = tu_lock_mode(s.c, "dg", DLOCK_SHARED, 0);
    TU_ACQUIRE_OK(s.l, DLOCK_TRY);
    TU_ACQUIRE_OK(r, DLOCK_TRY);
    uint64_t t = tu_token(s.l);
    redisContext *ctx = raw();
    atomic_store(&px.drop_downgrade, 1);
    int rc = dlock_release(s.l); /* the last write level: a downgrade */
    ck_assert_msg(rc == DLOCK_OK, "downgrade: %s: %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_int_eq(atomic_load(&px.drop_downgrade), 0); /* the fault did happen */
    ck_assert_uint_eq(dlock_hold_count(r), 1);
    ck_assert_uint_eq(tu_token(r), t);
    char *mode = reply_str(cmd(ctx, "HGET %s mode", "dg"));
    ck_assert_str_eq(mode, "read");
    free(mode);
    dlock_client *b = open_with(NULL);
    dlock_lock *rb = tu_lock_mode(b, "dg", DLOCK_SHARED, 0);
    tu_acquire_release(rb, DLOCK_TRY); /* a reader comes in beside us */
    ck_assert_int_eq(dlock_release(r), DLOCK_OK);
    ck_assert_int_eq(cmd_int(ctx, "EXISTS dg"), 0);
    dlock_lock_free(rb);
    dlock_client_close(b);
    dlock_lock_free(r);
    redisFree(ctx);
    tu_solo_close(&s);
    stop_server();
}

/* A downgrade with no reply at all (the server busy past the call's budget)
 * may have run: the hold is given up (DLOCK_ELOST), never kept as an
 * exclusive hold while readers come in; and its release, exclusive, keeps
 * the readers that did come in (a hash in read mode with another reader's
 * field, as such a downgrade leaves it). */
TU_TEST(unanswered_downgrade_gives_up, 60)
{
    struct tu_solo s = served_open("timeout=500ms&lease=10s", "dg");
    dlock_lock *r = tu_lock_mode(s.c, "dg", DLOCK_SHARED, 0);
    TU_ACQUIRE_OK(s.l, DLOCK_TRY);
    TU_ACQUIRE_OK(r, DLOCK_TRY);
    redisContext *ctx = raw(), *busy = server_busy(1500);
    int rc = dlock_release(s.l);
    ck_assert_msg(rc == DLOCK_ELOST, "downgrade: %s: %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_uint_eq(dlock_hold_count(r), 0);
    ck_assert_uint_eq(dlock_hold_count(s.l), 0);
    redisFree(busy);
    freeReplyObject(cmd(ctx, "PING")); /* answered once the server is free again */
    /* What a downgrade whose reply was lost leaves, a reader joined. */
    dlock_lock *w = tu_lock_mode(s.c, "dg2", DLOCK_EXCLUSIVE, 0);
    TU_ACQUIRE_OK(w, DLOCK_TRY);
    freeReplyObject(cmd(ctx, "HSET dg2 mode read other:1 1"));
    ck_assert_int_eq(dlock_release(w), DLOCK_OK);
    ck_assert_int_eq(cmd_int(ctx, "HEXISTS dg2 other:1"), 1);
    TU_FREE_LOCKS(w, r);
    redisFree(ctx);
    served_close(&s);
}

/* A multi-lock's release whose first reply is lost (the proxy drops it
 * after the server ran it, and closes the connection) is sent once more,
 * as a single release is: every member then found free with our token
 * still its last counts as released by the first attempt, DLOCK_OK, and
 * nothing of the set is left. */
TU_TEST(multi_release_lost_reply_retried, 60)
{
    struct proxy px;
    struct tu_solo via = layout_proxied(&px, "redisson", "mr-a");
    px.needle = "redisson_lock__channel:{mr-b}"; /* only the set's release names it */
    redisContext *ctx = raw();
    const char *names[] = {"mr-a", "mr-b", "mr-c"};
    dlock_multi *m = NULL;
    ck_assert_int_eq(dlock_multi_new(via.c, names, 3, DLOCK_EXCLUSIVE, 0, &m), DLOCK_OK);
    ck_assert_msg(dlock_multi_acquire(m, DLOCK_TRY, NULL) == DLOCK_OK, "%s", dlock_errmsg());
    atomic_store(&px.drop_named, 1);
    int rc = dlock_multi_release(m);
    ck_assert_int_eq(atomic_load(&px.drop_named), 0); /* the fault did happen */
    ck_assert_msg(rc == DLOCK_OK, "release: %s: %s", dlock_err_name(rc), dlock_errmsg());
    for (size_t k = 0; k < 3; k++)
        ck_assert_int_eq(cmd_int(ctx, "EXISTS %s", names[k]), 0);
    dlock_multi_free(m);
    redisFree(ctx);
    tu_solo_close(&via);
    stop_server();
}

struct busy_later {
    int after_ms, busy_ms;
};

static void *busy_later_main(void *arg)
{
    struct busy_later *b = arg;
    tu_sleep_ms(b->after_ms);
    redisFree(server_busy(b->busy_ms));
    return NULL;
}

/* A permit release whose first reply is lost (the proxy drops it after
 * the server ran it, and closes the connection) is sent once more; a retry
 * that removes nothing must tell why. Its own first attempt gave the ids
 * back: the server remembers that release (dlock_sem_released:{NAME}),
 * DLOCK_OK. The ids were removed by another hand while the permit was
 * valid: nothing remembered, DLOCK_ELOST (it was DLOCK_OK for any retry
 * that removed nothing). */
TU_TEST(sem_release_retry_tells_lost, 60)
{
    struct proxy px;
    struct tu_solo via = layout_proxied(&px, "redisson", "rr");
    px.needle = "redisson_sc:{rr}"; /* set just before a release: its call */
    redisContext *ctx = raw();
    dlock_semaphore *s = NULL;
    ck_assert_int_eq(dlock_semaphore_new(via.c, "rr", 2, 0, &s), DLOCK_OK);
    /* 0: nothing removed; 1: the permit's id; 2: one of a 2-permit's ids
     * (the first attempt gave the other back: that partial release is
     * not remembered, it was taken for ours, DLOCK_OK) */
    for (int removed_by_another = 0; removed_by_another < 3; removed_by_another++) {
        dlock_permit *p = NULL;
        unsigned k = removed_by_another == 2 ? 2 : 1;
        ck_assert_int_eq(dlock_semaphore_acquire(s, k, DLOCK_TRY, NULL, &p), DLOCK_OK);
        if (removed_by_another)
            ck_assert_int_eq(cmd_int(ctx, "ZREMRANGEBYRANK {rr}:timeout 0 0"), 1);
        atomic_store(&px.drop_named, 1);
        int rc = dlock_permit_release(p);
        ck_assert_int_eq(atomic_load(&px.drop_named), 0); /* the fault did happen */
        ck_assert_msg(rc == (removed_by_another ? DLOCK_ELOST : DLOCK_OK), "release%s: %s: %s",
                      removed_by_another ? " of removed ids" : "", dlock_err_name(rc),
                      dlock_errmsg());
        ck_assert_int_eq(cmd_int(ctx, "ZCARD {rr}:timeout"), 0);
        if (removed_by_another) /* the removed id's permit, back in the count */
            ck_assert_int_eq(cmd_int(ctx, "INCRBY rr 1"), 2);
    }
    dlock_semaphore_free(s);
    redisFree(ctx);
    tu_solo_close(&via);
    stop_server();
}

/* A waiting semaphore acquire whose try reached the server but got no
 * reply (server busy past the timeout) tries again with new permit ids:
 * reusing the ids would take the permits twice under one id set (the
 * free count off for good: every acquire then refused as another count)
 * and the cleanup queued for the lost try would give back the permit
 * this acquire returned. Checked on what the server ran (MONITOR): no
 * two acquire scripts with the same ids; then the count still adds up. */
TU_TEST(sem_wait_lost_reply_new_ids, 60)
{
    char *url = served_url("timeout=500ms");
    dlock_client *a = tu_open(url), *b = tu_open(url);
    dlock_semaphore *sa = NULL, *sb = NULL;
    ck_assert_int_eq(dlock_semaphore_new(a, "lr", 2, 0, &sa), DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_new(b, "lr", 2, 0, &sb), DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_set_lease(sb, 2000, DLOCK_LEASE_FIXED), DLOCK_OK);
    dlock_permit *pb = NULL, *pa = NULL;
    ck_assert_int_eq(dlock_semaphore_acquire(sb, 2, DLOCK_TRY, NULL, &pb), DLOCK_OK);
    /* A's wait tries again when B's permits expire (2 s): the server is
     * busy from 250 ms before that until 650 ms after. */
    struct busy_later bl = {1750, 900};
    pthread_t th;
    redisContext *mon = raw();
    freeReplyObject(cmd(mon, "MONITOR"));
    pthread_create(&th, NULL, busy_later_main, &bl);
    int rc = dlock_semaphore_acquire(sa, 1, 20000, NULL, &pa);
    pthread_join(th, NULL);
    ck_assert_msg(rc == DLOCK_OK, "acquire: %s: %s", dlock_err_name(rc), dlock_errmsg());
    /* Every acquire script the server ran had ids of its own: the last
     * argument (the id prefix) of those that name the token key. */
    redisContext *marker = raw();
    freeReplyObject(cmd(marker, "PING")); /* a marker: all before it are in */
    redisFree(marker);
    char *prefixes[64];
    size_t np = 0;
    for (;;) {
        redisReply *r = NULL;
        ck_assert_int_eq(redisGetReply(mon, (void **)&r), REDIS_OK);
        bool end = r->type == REDIS_REPLY_STATUS && strstr(r->str, "\"PING\"");
        const char *last = r->type == REDIS_REPLY_STATUS && strstr(r->str, "dlock_sem_token:{lr}") &&
                                   strstr(r->str, "\"EVALSHA\"")
                               ? strrchr(r->str, ' ')
                               : NULL;
        if (last && np < 64)
            prefixes[np++] = strdup(last);
        freeReplyObject(r);
        if (end)
            break;
    }
    for (size_t i = 0; i < np; i++)
        for (size_t j = i + 1; j < np; j++)
            ck_assert_msg(strcmp(prefixes[i], prefixes[j]) != 0,
                          "two acquire scripts ran with the ids %s", prefixes[i]);
    for (size_t i = 0; i < np; i++)
        free(prefixes[i]);
    redisFree(mon);
    /* Once the lost try's ids are given back: one of two permits held. */
    long free_permits = -2;
    for (int i = 0; i < 200 && free_permits != 1; i++) {
        dlock_info *info = NULL;
        rc = dlock_semaphore_inspect(b, "lr", 2, &info);
        ck_assert_msg(rc == DLOCK_OK, "inspect: %s: %s", dlock_err_name(rc), dlock_errmsg());
        free_permits = dlock_info_free_permits(info);
        dlock_info_free(info);
        if (free_permits != 1)
            tu_sleep_ms(50);
    }
    ck_assert_int_eq(free_permits, 1);
    ck_assert_int_eq(dlock_permit_release(pa), DLOCK_OK);
    ck_assert_int_eq(dlock_permit_release(pb), DLOCK_ELOST);
    dlock_semaphore_free(sa);
    dlock_semaphore_free(sb);
    TU_CLOSE_CLIENTS(a, b);
    free(url);
}

/* Redisson's prefixName(): a name that has a hash tag keeps it. */
TU_TEST(hash_tag_names, 60)
{
    struct tu_solo s = served_open(NULL, "{user1}:cart");
    TU_ACQUIRE_OK(s.l, DLOCK_TRY);
    redisContext *ctx = raw();
    ck_assert_int_eq(cmd_int(ctx, "EXISTS %s", "{user1}:cart"), 1);
    ck_assert_int_eq(cmd_int(ctx, "GET %s", "redisson_lock_token:{user1}:cart"), (long long)tu_token(s.l));
    ck_assert_int_eq(dlock_release(s.l), DLOCK_OK);
    redisFree(ctx);
    served_close(&s);
}

/* Connections dropped by the server (CLIENT KILL) while holding and
 * waiting: renewals resume on new connections, no hold is lost, and the
 * waiter is still woken by the release. */
TU_TEST(connections_killed_renewals_resume, 60)
{
    char *url = served_url("lease=1500ms");
    dlock_client *c = tu_open(url), *c2 = tu_open(url);
    dlock_lock *l = tu_lock(c, "ck"), *l2 = tu_lock(c2, "ck");
    struct tu_lost lost = {0};
    dlock_lock_on_lost(l, tu_on_lost, &lost);
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    struct waiter_arg a = {.l = l2, .wait_ms = 30000, .rc = -99, .release = true};
    pthread_t th;
    pthread_create(&th, NULL, waiter_main, &a);
    redisContext *ctx = raw();
    wait_numsub(ctx, "redisson_lock__channel:{ck}", 1);
    for (int i = 0; i < 3; i++) {
        freeReplyObject(cmd(ctx, "CLIENT KILL TYPE normal SKIPME yes"));
        freeReplyObject(cmd(ctx, "CLIENT KILL TYPE pubsub"));
        tu_sleep_ms(1000);
    }
    ck_assert_int_eq(atomic_load(&lost.fired), 0);
    ck_assert_int_gt(dlock_validity_ms(l), 0);
    wait_numsub(ctx, "redisson_lock__channel:{ck}", 1); /* resubscribed */
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    pthread_join(th, NULL);
    ck_assert_msg(a.rc == DLOCK_OK, "waiter: %s", dlock_err_name(a.rc));
    redisFree(ctx);
    TU_FREE_LOCKS(l, l2);
    TU_CLOSE_CLIENTS(c, c2);
    free(url);
    stop_server();
}

/* The server restarts while a thread waits: the subscriber connection is
 * redialed, the waiter is woken to try again, and gets the lock (the
 * restarted server lost the foreign holder's key). */
TU_TEST(server_restart_while_waiting, 60)
{
    redisContext *ctx = served_raw();
    freeReplyObject(cmd(ctx, "HSET w 6f0b9c2e-1d1a-4c55-8a0e-2b8f3c9d7e11:1 1"));
    freeReplyObject(cmd(ctx, "PEXPIRE w 600000"));
    dlock_client *c = tu_open(srv.url);
    dlock_lock *l = tu_lock(c, "w");
    struct waiter_arg a = {.l = l, .wait_ms = 30000, .rc = -99, .release = true};
    pthread_t th;
    pthread_create(&th, NULL, waiter_main, &a);
    wait_numsub(ctx, "redisson_lock__channel:{w}", 1);
    ck_assert_msg(fx_redis_restart(&srv), "restart failed");
    pthread_join(th, NULL);
    ck_assert_msg(a.rc == DLOCK_OK, "waiter after restart: %s", dlock_err_name(a.rc));
    ck_assert_int_eq(a.release_rc, DLOCK_OK);
    ck_assert_uint_gt(a.token, 1000000000000000ull); /* from the clock: the data was lost */
    dlock_lock_free(l);
    dlock_client_close(c);
    served_raw_close(ctx);
}

/* ------------------------------------------------------------ at scale */

#define MANY 1000

struct many_arg {
    dlock_client *c;
    int i;
    int rc;
};

static void *many_main(void *p)
{
    struct many_arg *a = p;
    char name[32];
    snprintf(name, sizeof name, "many-%d", a->i);
    dlock_lock *l = NULL;
    a->rc = dlock_lock_new(a->c, name, DLOCK_EXCLUSIVE, 0, &l);
    if (!a->rc)
        a->rc = dlock_acquire(l, 60000);
    if (!a->rc)
        a->rc = dlock_release(l);
    dlock_lock_free(l);
    return NULL;
}

/* One client waits on 1,000 names at once over one subscriber connection,
 * and every waiter is woken by its release message (the foreign holder's
 * lease of 10 minutes would outlast the test). */
TU_TEST(thousand_names_waited_at_once, 60)
{
    /* valgrind runs at most 500 threads: 400 waiters there, 1,000 else */
    const char *vg = getenv("DLOCK_VALGRIND");
    int many = vg && strcmp(vg, "1") == 0 ? 400 : MANY;
    start_server(NULL);
    redisContext *ctx = raw();
    for (int i = 0; i < many; i++) {
        redisAppendCommand(ctx, "HSET many-%d 6f0b9c2e-1d1a-4c55-8a0e-2b8f3c9d7e11:7 1", i);
        redisAppendCommand(ctx, "PEXPIRE many-%d 600000", i);
    }
    drain_replies(ctx, 2 * many);
    dlock_client *c = tu_open(srv.url);
    pthread_t th[MANY];
    struct many_arg args[MANY];
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (int i = 0; i < many; i++) {
        args[i] = (struct many_arg){c, i, -99};
        ck_assert_int_eq(pthread_create(&th[i], &attr, many_main, &args[i]), 0);
    }
    /* all 1,000 channels on one pub/sub connection */
    for (int i = 0; i < 3000; i++) {
        redisReply *r = cmd(ctx, "PUBSUB CHANNELS %s", "redisson_lock__channel:*");
        size_t n = r->elements;
        freeReplyObject(r);
        if (n == (size_t)many)
            break;
        tu_sleep_ms(10);
    }
    redisReply *r = cmd(ctx, "PUBSUB CHANNELS %s", "redisson_lock__channel:*");
    ck_assert_uint_eq(r->elements, (size_t)many);
    freeReplyObject(r);
    char *clients = reply_str(cmd(ctx, "CLIENT LIST TYPE pubsub"));
    int npubsub = 0;
    for (char *p = clients; p && (p = strstr(p, "id=")); p++)
        npubsub++;
    ck_assert_int_eq(npubsub, 1);
    free(clients);
    for (int i = 0; i < many; i++) {
        redisAppendCommand(ctx, "DEL many-%d", i);
        redisAppendCommand(ctx, "PUBLISH redisson_lock__channel:{many-%d} 0", i);
    }
    drain_replies(ctx, 2 * many);
    for (int i = 0; i < many; i++) {
        pthread_join(th[i], NULL);
        ck_assert_msg(args[i].rc == DLOCK_OK, "waiter %d: %s", i, dlock_err_name(args[i].rc));
    }
    redisFree(ctx);
    dlock_client_close(c);
    stop_server();
}

/* Renewing many holds costs a handful of script calls per period, not one
 * per hold: counted on the server (INFO commandstats). */
TU_TEST(renewal_is_batched, 60)
{
    enum { N = 2000 };
    char *url = served_url("lease=3s");
    dlock_client *c = tu_open(url);
    dlock_lock **l = calloc(N, sizeof *l);
    for (int i = 0; i < N; i++) {
        char name[32];
        snprintf(name, sizeof name, "r-%d", i);
        l[i] = tu_lock(c, name);
        TU_ACQUIRE_OK(l[i], DLOCK_TRY);
    }
    redisContext *ctx = raw();
    freeReplyObject(cmd(ctx, "CONFIG RESETSTAT"));
    tu_sleep_ms(4500); /* > one lease: every hold renewed at least twice */
    long long calls = script_calls(ctx);
    for (int i = 0; i < N; i++)
        ck_assert_int_gt(dlock_validity_ms(l[i]), 0);
    ck_assert_int_gt(cmd_int(ctx, "PTTL r-0"), 0);
    ck_assert_int_gt(cmd_int(ctx, "PTTL r-1999"), 0);
    /* two or three periods; one call per 1000 holds per period, and the
     * core may split a period into a few batches */
    fprintf(stderr, "renewal_is_batched: %lld script calls for %d holds over 4.5 s\n", calls, N);
    ck_assert_msg(calls >= 2 && calls <= 60, "%lld script calls", calls);
    tu_release_free_all(l, N);
    free(l);
    redisFree(ctx);
    dlock_client_close(c);
    free(url);
    stop_server();
}

/* -------------------------------------------- URLs, list, db, unix socket */

TU_TEST(urls_db_prefix_unix_and_list, 60)
{
    redisContext *ctx = served_raw();
    dlock_client *c = NULL;
    char *u;

    /* the db from the path and from ?db= */
    u = tu_fmt("%s/3?prefix=app:", srv.url);
    c = tu_open(u);
    dlock_lock *l = tu_lock(c, "x");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    freeReplyObject(cmd(ctx, "SELECT 3"));
    ck_assert_int_eq(cmd_int(ctx, "EXISTS app:x"), 1);
    ck_assert_int_eq(cmd_int(ctx, "EXISTS %s", "redisson_lock_token:{app:x}"), 1);
    /* list: only lock keys, prefix stripped, glob applied */
    freeReplyObject(cmd(ctx, "SET app:plain v"));
    freeReplyObject(cmd(ctx, "HSET app:userhash name bob"));
    dlock_lock *l2 = tu_lock(c, "y1");
    TU_ACQUIRE_OK(l2, DLOCK_TRY);
    char *names = tu_list_text(c, NULL, ",");
    ck_assert_msg(strstr(names, "x,") && strstr(names, "y1,") && !strstr(names, "plain") &&
                      !strstr(names, "userhash") && !strstr(names, "token"),
                  "list: %s", names);
    free(names);
    names = tu_list_text(c, "y*", ",");
    ck_assert_str_eq(names, "y1,");
    free(names);
    dlock_release(l2);
    dlock_lock_free(l2);
    dlock_release(l);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(u);

    u = tu_fmt("redis+unix://%s?db=2", srv.sock);
    c = tu_open(u);
    l = tu_lock(c, "viaunix");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    freeReplyObject(cmd(ctx, "SELECT 2"));
    ck_assert_int_eq(cmd_int(ctx, "EXISTS viaunix"), 1);
    dlock_release(l);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(u);

    const char *bad[] = {"/notadb", "/1?db=2", "?layout=fancy", "?bogus=1", ",127.0.0.1:2"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        u = tu_fmt("%s%s", srv.url, bad[i]);
        int rc = dlock_open(u, &c);
        ck_assert_msg(rc == DLOCK_EBADURL, "%s: %s (%s)", u, dlock_err_name(rc), dlock_errmsg());
        free(u);
    }
    u = tu_fmt("%s?tls_ca=/etc/ssl/ca.pem", srv.url);
    ck_assert_int_eq(dlock_open(u, &c), DLOCK_EBADURL); /* TLS is rediss:// */
    free(u);
    u = tu_fmt("%s?layout=simple", srv.url);
    c = tu_open(u);
    free(u);
    l = tu_lock_mode(c, "s", DLOCK_SHARED, 0);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_ENOTSUP); /* one value, one owner */
    ck_assert_msg(strstr(dlock_errmsg(), "layout=simple"), "%s", dlock_errmsg());
    dlock_lock_free(l);
    dlock_client_close(c);
    served_raw_close(ctx);
}

/* ------------------------------------------------------------------ TLS */

/* dlock_open(URL) must fail with CODE and a message naming WANT. */
static void open_fails(const char *url, int code, const char *want)
{
    dlock_client *c = NULL;
    int rc = dlock_open(url, &c);
    ck_assert_msg(rc == code, "%s: %s (%s), not %s", url, dlock_err_name(rc), dlock_errmsg(),
                  dlock_err_name(code));
    ck_assert_msg(strstr(dlock_errmsg(), want) != NULL, "%s: '%s' lacks '%s'", url, dlock_errmsg(),
                  want);
}

/* Test hook (net.c): the names that went to the resolver thread. */
extern unsigned long dlock__redis_resolver_calls;

/* Names are resolved within the connect timeout: an address never goes
 * to the resolver (parsed on the spot), a name does (localhost, from
 * /etc/hosts), a name nobody knows fails DLOCK_ECONN naming it, and a
 * name server that never answers costs the connect timeout, not the
 * resolver's own 30 s: the dial leaves its resolver thread behind. */
TU_TEST(names_resolved_within_the_connect_timeout, 60)
{
    start_server(NULL);
    unsigned long calls = dlock__redis_resolver_calls;
    dlock_client *c = open_with(NULL); /* 127.0.0.1 */
    ck_assert_msg(dlock__redis_resolver_calls == calls, "an address went to the resolver");
    dlock_client_close(c);
    char *byname = tu_fmt("redis://localhost:%d", srv.port);
    c = tu_open(byname);
    ck_assert_msg(dlock__redis_resolver_calls > calls, "a name did not go to the resolver");
    dlock_client_close(c);
    open_fails("redis://nosuch.invalid:6379?connect_timeout=5s", DLOCK_ECONN,
               "cannot resolve 'nosuch.invalid'");
    stop_server();

    int ns = tu_silent_name_server();
    open_fails("redis://slow.invalid:6379?connect_timeout=300ms", DLOCK_ECONN,
               "cannot resolve 'slow.invalid': no answer within 300 ms");
    open_fails("redis://127.0.0.1:1?connect_timeout=300ms", DLOCK_ECONN, "refused");
    close(ns);
    free(byname);
}

/* rediss:// against a server that wants client certificates: verified
 * against tls_ca, by name (SNI + the certificate's DNS entry) or by
 * address; a client without a certificate, a CA that signed nothing
 * here, TLS to the plain port and plain to the TLS port all fail as
 * DLOCK_ECONN saying what went wrong, within the connect timeout. */
TU_TEST(tls_verification_and_client_certs, 60)
{
    const char *extra[] = {"--tls-auth-clients", "yes", NULL};
    ck_assert_msg(fx_redis_start_tls(&srv, extra), "redis-server (TLS) could not be started");
    char *certs = tu_fmt("tls_cert=%s&tls_key=%s", srv.client_cert, srv.client_key);
    const char *hosts[] = {"127.0.0.1", "localhost"};
    for (size_t i = 0; i < 2; i++) {
        char *url = tu_fmt("rediss://%s:%d?tls_ca=%s&%s", hosts[i], srv.tls_port, srv.ca, certs);
        struct tu_solo s = tu_solo_open(url, "tls");
        tu_acquire_release(s.l, DLOCK_TRY);
        tu_solo_close(&s);
    }
    redisContext *ctx = raw(); /* what the TLS clients did, seen on the plain port */
    ck_assert_int_eq(cmd_int(ctx, "EXISTS redisson_lock_token:{tls}"), 1);
    redisFree(ctx);

    char *u = tu_fmt("%s&connect_timeout=2s", srv.tls_url); /* no client certificate */
    open_fails(u, DLOCK_ECONN, "rediss 127.0.0.1");
    free(u);
    u = tu_fmt("rediss://127.0.0.1:%d?tls_ca=%s&%s", srv.tls_port, srv.other_ca, certs);
    open_fails(u, DLOCK_ECONN, "the server's certificate was refused");
    free(u);
    u = tu_fmt("rediss://127.0.0.1:%d?tls_ca=%s&connect_timeout=1s", srv.port, srv.ca);
    open_fails(u, DLOCK_ECONN, "TLS handshake");
    free(u);
    u = tu_fmt("redis://127.0.0.1:%d?connect_timeout=1s", srv.tls_port);
    open_fails(u, DLOCK_ECONN, "rediss://");
    free(u);
    u = tu_fmt("rediss://127.0.0.1:%d?tls_ca=%s/nowhere.crt", srv.tls_port, srv.dir);
    open_fails(u, DLOCK_EINVAL, "nowhere.crt");
    free(u);
    u = tu_fmt("rediss://127.0.0.1:%d?tls_ca=%s&tls_cert=%s", srv.tls_port, srv.ca, srv.client_cert);
    open_fails(u, DLOCK_EBADURL, "tls_key");
    free(u);
    free(certs);
    stop_server();
}

/* Whether this process has libssl mapped (/proc/self/maps). */
static bool libssl_mapped(void)
{
    char *maps = tu_read_file("/proc/self/maps");
    ck_assert_msg(maps != NULL, "cannot read /proc/self/maps");
    bool mapped = strstr(maps, "/libssl.so") != NULL;
    free(maps);
    return mapped;
}

/* OpenSSL is loaded by the first rediss:// client, not by linking
 * libdlock: file://, redis:// and redlock:// clients (Redlock's script
 * digests come from the build), a lock taken on each, leave it unmapped
 * (docs/benchmarks.md: loading it made every start 1.5 ms slower); the
 * rediss:// client then has it and works. */
TU_TEST(openssl_loaded_by_the_first_rediss_client, 60)
{
    ck_assert_msg(fx_redis_start_tls(&srv, NULL), "redis-server (TLS) could not be started");
    char *dir, *file_url;
    tu_file_fixture("redis-lazy-tls", &dir, &file_url);
    char *plain[] = {strdup(file_url), strdup(srv.url), tu_fmt("redlock://127.0.0.1:%d", srv.port)};
    for (size_t i = 0; i < 3; i++) {
        struct tu_solo s = tu_solo_open(plain[i], "lazy");
        tu_acquire_release(s.l, DLOCK_TRY);
        ck_assert_msg(!libssl_mapped(), "libssl is mapped after a client of %s", s.url);
        tu_solo_close(&s);
    }
    struct tu_solo s = tu_solo_open(strdup(srv.tls_url), "lazy");
    ck_assert_msg(libssl_mapped(), "libssl is not mapped after a client of %s", s.url);
    tu_acquire_release(s.l, DLOCK_TRY);
    tu_solo_close(&s);
    tu_file_fixture_end(&dir, &file_url);
    stop_server();
}

/* scripts.c: every embedded script (I from 0; false past the last) with
 * the digest EVALSHA names it by, computed at build time. */
bool dlock__redis_script_nth(size_t i, const char **name, const char **src, const char **sha);

/* The digests dlock takes from the build (Redlock's, for nodes it cannot
 * ask at open) are the server's: SCRIPT LOAD of every embedded script, in
 * both layouts, gives the digest built with it. A wrong digest would not
 * fail a lock: EVALSHA would answer NOSCRIPT and EVAL go every time. */
TU_TEST(script_digests_match_the_server, 60)
{
    start_server(NULL);
    redisContext *ctx = raw();
    const char *name, *src, *sha;
    size_t n = 0;
    for (; dlock__redis_script_nth(n, &name, &src, &sha); n++) {
        char *server = reply_str(cmd(ctx, "SCRIPT LOAD %s", src));
        ck_assert_msg(server && strcmp(server, sha) == 0, "%s.lua: the server says %s, the build %s",
                      name, server ? server : "nothing", sha);
        free(server);
    }
    ck_assert_uint_ge(n, 36); /* 16 scripts in 2 layouts, Redlock's and the election's 4 */
    redisFree(ctx);
    stop_server();
}

/* ------------------------------------------------------- replica sync */

/* A replica of srv (started by the caller), once the master counts it
 * online. */
static void start_replica(struct fx_redis *rep)
{
    char port[16];
    snprintf(port, sizeof port, "%d", srv.port);
    const char *extra[] = {"--replicaof", "127.0.0.1", port, NULL};
    ck_assert_msg(fx_redis_start(rep, extra), "the replica could not be started");
    redisContext *ctx = raw();
    bool online = false;
    for (int i = 0; i < 400 && !online; i++) {
        char *info = reply_str(cmd(ctx, "INFO replication"));
        online = info && strstr(info, "connected_slaves:1") && strstr(info, "state=online");
        free(info);
        if (!online)
            tu_sleep_ms(25);
    }
    redisFree(ctx);
    ck_assert_msg(online, "the replica never came online");
}

/* The frame of the sync tests: a server and its replica REP (online), a
 * raw connection *CTX to the master, and a client with sync=1 and a 1.5 s
 * lease. WAIT's timeout (1 s) leaves a loaded machine's replica time to
 * acknowledge (at 300 ms, under a load of 12, it once did not). */
static dlock_client *sync_open(struct fx_redis *rep, redisContext **ctx)
{
    start_server(NULL);
    start_replica(rep);
    *ctx = raw();
    return open_with("sync=1&sync_timeout=1s&lease=1500ms");
}

/* A multi-lock's acquire in a thread of its own. */
struct multi_try {
    dlock_multi *m;
    atomic_int rc, done;
    pthread_t th;
};

static void *multi_try_main(void *arg)
{
    struct multi_try *mt = arg;
    atomic_store(&mt->rc, dlock_multi_acquire(mt->m, DLOCK_TRY, NULL));
    atomic_store(&mt->done, 1);
    return NULL;
}

/* sync_undo_owed_past_the_budget for a multi-lock of two names (one
 * script; the undo is each member's cancel, owed when the budget is
 * gone). */
TU_TEST(sync_multi_undo_owed_past_the_budget, 60)
{
    start_server(NULL);
    redisContext *ctx = raw();
    dlock_client *c = open_with("sync=1&sync_timeout=1s&timeout=2s&lease=120s");
    const char *names[] = {"undo", "undo2"};
    struct multi_try mt = {0};
    ck_assert_int_eq(dlock_multi_new(c, names, 2, DLOCK_EXCLUSIVE, 0, &mt.m), DLOCK_OK);
    ck_assert_int_eq(pthread_create(&mt.th, NULL, multi_try_main, &mt), 0);
    for (int i = 0; i < 1000 && info_number(ctx, "clients", "blocked_clients") < 1 &&
                    !atomic_load(&mt.done);
         i++)
        tu_sleep_ms(5);
    ck_assert_msg(!atomic_load(&mt.done), "the acquire returned before its WAIT blocked");
    freeReplyObject(cmd(ctx, "CLIENT PAUSE 5000 WRITE"));
    pthread_join(mt.th, NULL);
    ck_assert_msg(atomic_load(&mt.rc) == DLOCK_EUNAVAIL, "acquire: %s",
                  dlock_err_name(atomic_load(&mt.rc)));
    for (int i = 0; i < 600 && cmd_int(ctx, "EXISTS undo undo2") != 0; i++)
        tu_sleep_ms(50);
    ck_assert_msg(cmd_int(ctx, "EXISTS undo undo2") == 0,
                  "the unsynced multi-lock was never undone (%lld ms of lease left)",
                  cmd_int(ctx, "PTTL undo"));
    dlock_multi_free(mt.m);
    dlock_client_close(c);
    redisFree(ctx);
    stop_server();
}

/* sync=1 with no replica: WAIT answers 0 at sync_timeout and the acquire
 * is undone. Writes paused on the master (CLIENT PAUSE WRITE, longer than
 * an op timeout) while the WAIT blocks: the undo does not fit in what is
 * left of the acquire's budget, so it is owed to the cleanup queue and the
 * keeper sends it once writes resume -- the lock is free long before its
 * lease ends. (A separate undo request with its own op timeout failed
 * against the pause and left the lock held until its lease ran out.) */
TU_TEST(sync_undo_owed_past_the_budget, 60)
{
    start_server(NULL);
    redisContext *ctx = raw();
    dlock_client *c = open_with("sync=1&sync_timeout=1s&timeout=2s&lease=120s");
    dlock_lock *l = tu_lock(c, "undo");
    struct tu_waiter w = {0};
    tu_waiter_start(&w, l, DLOCK_TRY);
    for (int i = 0; i < 1000 && info_number(ctx, "clients", "blocked_clients") < 1 && !atomic_load(&w.done); i++)
        tu_sleep_ms(5);
    ck_assert_msg(!atomic_load(&w.done), "the acquire returned before its WAIT blocked: %s",
                  dlock_err_name(atomic_load(&w.rc)));
    freeReplyObject(cmd(ctx, "CLIENT PAUSE 5000 WRITE"));
    int rc = tu_waiter_join(&w);
    ck_assert_msg(rc == DLOCK_EUNAVAIL, "acquire: %s", dlock_err_name(rc));
    /* the pause ends, the keeper's cleanup undoes it: a condition */
    for (int i = 0; i < 600 && cmd_int(ctx, "EXISTS undo") != 0; i++)
        tu_sleep_ms(50);
    ck_assert_msg(cmd_int(ctx, "EXISTS undo") == 0, "the unsynced acquire was never undone (%lld "
                                                   "ms of lease left)",
                  cmd_int(ctx, "PTTL undo"));
    dlock_lock_free(l);
    dlock_client_close(c);
    redisFree(ctx);
    stop_server();
}

/* ?sync=N: the acquire script and WAIT N go in one round trip. With the
 * replica acknowledging, acquire and release work; with the replica
 * stopped (SIGSTOP) or N above the replicas there are, the acquisition
 * is undone (the master holds nothing) and the call fails with
 * DLOCK_EUNAVAIL naming how many acknowledged; a hold whose renewals the
 * stopped replica no longer acknowledges is reported lost. */
TU_TEST(sync_acquire_needs_replica_acks, 60)
{
    struct fx_redis rep;
    redisContext *ctx;
    dlock_client *c = sync_open(&rep, &ctx);
    dlock_lock *l = tu_lock(c, "synced");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    ck_assert_int_eq(cmd_int(ctx, "EXISTS synced"), 1);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);

    kill(rep.pid, SIGSTOP);
    int rc = dlock_acquire(l, DLOCK_TRY);
    ck_assert_msg(rc == DLOCK_EUNAVAIL, "%s: %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_msg(strstr(dlock_errmsg(), "only 0 of 1 replicas") != NULL, "%s", dlock_errmsg());
    ck_assert_int_eq(cmd_int(ctx, "EXISTS synced"), 0); /* undone */
    kill(rep.pid, SIGCONT);

    dlock_client *two = open_with("sync=2&sync_timeout=200ms");
    dlock_lock *l2 = tu_lock(two, "synced");
    rc = dlock_acquire(l2, DLOCK_TRY);
    ck_assert_msg(rc == DLOCK_EUNAVAIL, "%s: %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_msg(strstr(dlock_errmsg(), "only 1 of 2 replicas") != NULL, "%s", dlock_errmsg());
    dlock_lock_free(l2);
    dlock_client_close(two);

    /* renewals: acknowledged while the replica runs, not once it stops */
    struct tu_lost lost = {0};
    dlock_lock_on_lost(l, tu_on_lost, &lost);
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    kill(rep.pid, SIGSTOP);
    bool fired = tu_wait_lost(&lost, 1, 15000);
    kill(rep.pid, SIGCONT);
    ck_assert_msg(fired, "the hold whose renewals no replica acknowledged was never reported lost");
    ck_assert_int_eq(dlock_release(l), DLOCK_ELOST);
    dlock_lock_free(l);
    dlock_client_close(c);

    const char *bad[] = {"sync=x", "sync=-1", "sync_timeout=1s", "sync=1&sync_timeout=soon"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *u = url_with(bad[i]);
        ck_assert_int_eq(dlock_open(u, &c), DLOCK_EBADURL);
        free(u);
    }
    redisFree(ctx);
    fx_redis_stop(&rep);
    stop_server();
}

/* The free count and the held ids of semaphore NAME on the master. */
static void expect_sem_on_master(redisContext *ctx, const char *name, long long free_permits,
                                 long long held)
{
    char *f = reply_str(cmd(ctx, "GET %s", name));
    ck_assert_msg(f && atoll(f) == free_permits, "free permits on the master: %s, not %lld",
                  f ? f : "(none)", free_permits);
    free(f);
    ck_assert_int_eq(cmd_int(ctx, "ZCARD {%s}:timeout", name), held);
}

/* ?sync=N on the semaphore: acquire, renewal and release scripts go with
 * WAIT N in one round trip, as the lock's. A permit taken while the
 * replica is stopped (SIGSTOP), or with N above the replicas there are,
 * is given back (the master holds none) and the acquire fails
 * DLOCK_EUNAVAIL naming how many acknowledged; a permit whose renewals
 * the stopped replica no longer acknowledges ends at its validity. */
TU_TEST(sync_semaphore_needs_replica_acks, 60)
{
    struct fx_redis rep;
    redisContext *ctx;
    dlock_client *c = sync_open(&rep, &ctx);
    dlock_semaphore *s = NULL;
    ck_assert_int_eq(dlock_semaphore_new(c, "ps", 2, 0, &s), DLOCK_OK);
    dlock_permit *p = NULL;
    ck_assert_int_eq(dlock_semaphore_acquire(s, 1, DLOCK_TRY, NULL, &p), DLOCK_OK);
    expect_sem_on_master(ctx, "ps", 1, 1);
    ck_assert_int_eq(dlock_permit_release(p), DLOCK_OK);

    kill(rep.pid, SIGSTOP);
    p = NULL;
    int rc = dlock_semaphore_acquire(s, 2, DLOCK_TRY, NULL, &p);
    ck_assert_msg(rc == DLOCK_EUNAVAIL, "%s: %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_msg(strstr(dlock_errmsg(), "only 0 of 1 replicas") != NULL, "%s", dlock_errmsg());
    ck_assert_ptr_null(p);
    expect_sem_on_master(ctx, "ps", 2, 0); /* undone */
    kill(rep.pid, SIGCONT);

    dlock_client *two = open_with("sync=2&sync_timeout=200ms");
    dlock_semaphore *s2 = NULL;
    ck_assert_int_eq(dlock_semaphore_new(two, "ps", 2, 0, &s2), DLOCK_OK);
    rc = dlock_semaphore_acquire(s2, 1, DLOCK_TRY, NULL, &p);
    ck_assert_msg(rc == DLOCK_EUNAVAIL, "%s: %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_msg(strstr(dlock_errmsg(), "only 1 of 2 replicas") != NULL, "%s", dlock_errmsg());
    expect_sem_on_master(ctx, "ps", 2, 0);
    dlock_semaphore_free(s2);
    dlock_client_close(two);

    /* renewals: acknowledged while the replica runs, not once it stops;
     * the release is DLOCK_ELOST once the keeper has reported the loss
     * (validity reads 0 a moment before: a release between the two may
     * still find the permit on the master) */
    struct tu_lost lost = {0};
    ck_assert_int_eq(dlock_semaphore_on_lost(s, tu_on_permit_lost, &lost), DLOCK_OK);
    ck_assert_int_eq(dlock_semaphore_acquire(s, 1, DLOCK_TRY, NULL, &p), DLOCK_OK);
    kill(rep.pid, SIGSTOP);
    bool fired = tu_wait_lost(&lost, 1, 15000);
    kill(rep.pid, SIGCONT);
    ck_assert_msg(fired, "a permit whose renewals no replica acknowledged was never reported lost");
    ck_assert_int_eq(dlock_permit_validity_ms(p), 0);
    ck_assert_int_eq(dlock_permit_release(p), DLOCK_ELOST);
    dlock_semaphore_free(s);
    dlock_client_close(c);
    redisFree(ctx);
    fx_redis_stop(&rep);
    stop_server();
}

/* -------------------------------------------------------------- Sentinel */

static struct fx_sentinels sen;

/* Wait until the lock NAME's channel has WANT subscribers on the server
 * at PORT (plain or TLS). */
static void wait_numsub_at(int port, const char *name, long long want)
{
    const struct fx_redis *server = fx_sentinels_server(&sen, port);
    ck_assert_msg(server != NULL, "no server of the topology on port %d", port);
    long long got = fx_redis_wait_lock_subscribers(server->port, name, false, want);
    ck_assert_msg(got == want, "%lld subscribers of '%s' on port %d, not %lld", got, name, port, want);
}

/* Wait until the sentinels name a master other than OLD (the one killed):
 * its port. */
static int failed_over_from(int old)
{
    int now = 0;
    for (int i = 0; i < 1200 && ((now = fx_sentinels_master_port(&sen)) == old || !now); i++)
        tu_sleep_ms(50);
    ck_assert_msg(now != 0 && now != old, "no failover (master %d, now %d)", old, now);
    return now;
}

/* The frame of the failover tests: P's first client takes "job" (its
 * token in *FIRST), the second waits for it in W (up to 90 s), subscribed
 * on the master: its port. */
static int held_and_awaited(struct tu_pair *p, struct tu_waiter *w, uint64_t *first)
{
    TU_ACQUIRE_OK(p->la, DLOCK_TRY);
    *first = tu_token(p->la);
    tu_waiter_start(w, p->lb, 90000);
    int old = fx_sentinels_master_port(&sen);
    wait_numsub_at(old, "job", 1);
    return old;
}

/* redis+sentinel:// with 1 master, 2 replicas, 3 sentinels: a holder
 * and a waiter through a SENTINEL FAILOVER. The hold (replicated before)
 * is not lost and is released on the new master; the waiter re-subscribes
 * there (+switch-master) and acquires from it once the holder releases,
 * with a greater token. Then the same with the new master killed -9. */
TU_TEST(sentinel_failover_holding_and_waiting, 120)
{
    ck_assert_msg(fx_sentinels_start(&sen, 2, 3), "the Sentinel topology did not start");
    char *nosuch = tu_fmt("redis+sentinel://127.0.0.1:%d/nosuch", sen.sentinel_port[0]);
    open_fails(nosuch, DLOCK_ECONN, "monitors no master named 'nosuch'");
    open_fails("redis+sentinel://127.0.0.1:1", DLOCK_EBADURL, "MASTERNAME");
    free(nosuch);
    /* a lease longer than a failover takes: until Sentinel demotes the
     * old master, renewals land there, not on the new one */
    char *url = tu_fmt("%s?lease=20s", sen.url);
    struct tu_pair p = tu_pair_of(tu_open(url), tu_open(url), "job");
    tu_pair_watch_lost(&p);
    for (int round = 0; round < 2; round++) {
        uint64_t first;
        struct tu_waiter w = {0};
        int old = held_and_awaited(&p, &w, &first), now;
        if (round == 0) {
            now = fx_sentinels_failover(&sen);
        } else { /* the master dies: the sentinels agree it is down, then fail over */
            fx_redis_kill(fx_sentinels_server(&sen, old));
            now = failed_over_from(old);
        }
        ck_assert_msg(now != 0 && now != old, "no failover (master %d, now %d)", old, now);
        wait_numsub_at(now, "job", 1); /* the waiter followed */
        /* the hold is on the new master: its release there is ours */
        ck_assert_msg(atomic_load(&p.lost.fired) == 0, "the hold was lost: %s", p.lost.why);
        ck_assert_int_eq(dlock_release(p.la), DLOCK_OK);
        ck_assert_int_eq(tu_waiter_join(&w), DLOCK_OK);
        ck_assert_msg(w.token > first, "token %llu after %llu", (unsigned long long)w.token,
                      (unsigned long long)first);
        if (round == 1)
            break;
    }
    tu_pair_close(&p);
    free(url);
    fx_sentinels_stop(&sen);
}

/* The confirmed renewals of C so far (dlock_client_stats). */
static uint64_t renewals_of(dlock_client *c)
{
    dlock_stats st = {.size = sizeof st};
    ck_assert_int_eq(dlock_client_stats(c, &st), DLOCK_OK);
    return st.renewals;
}

/* kill -9 of the master under sync=1 (1 master, 2 replicas, 3
 * sentinels), a holder and a waiter on it: every write counted only once
 * a replica acknowledged it, so the promoted replica knows the hold. The
 * hold renews on the new master (or is reported lost, never kept
 * silently), the waiter re-subscribes there and does not get the lock
 * while the holder holds it (never two owners), then acquires from the
 * new master once it is released, with a greater token; and the token
 * after that is greater again. */
TU_TEST(sentinel_master_killed_under_sync, 150)
{
    ck_assert_msg(fx_sentinels_start(&sen, 2, 3), "the Sentinel topology did not start");
    char *url = tu_fmt("%s?lease=20s&sync=1&sync_timeout=500ms", sen.url);
    struct tu_pair p = tu_pair_of(tu_open(url), tu_open(url), "job");
    tu_pair_watch_lost(&p);
    uint64_t first;
    struct tu_waiter w = {0};
    int old = held_and_awaited(&p, &w, &first);
    uint64_t renewed = renewals_of(p.a);
    fx_redis_kill(fx_sentinels_server(&sen, old));
    int now = failed_over_from(old);
    wait_numsub_at(now, "job", 1); /* the waiter followed */
    /* the holder's keeper reaches the new master: a renewal confirmed
     * there (acknowledged by the replica left), or the hold reported lost */
    for (int i = 0; i < 1200 && renewals_of(p.a) == renewed && !atomic_load(&p.lost.fired); i++)
        tu_sleep_ms(50);
    bool lost = atomic_load(&p.lost.fired) > 0;
    ck_assert_msg(lost || renewals_of(p.a) > renewed, "the hold neither renewed nor was lost");
    fprintf(stderr, "sentinel_master_killed_under_sync: the hold %s\n",
            lost ? "was reported lost" : "renewed on the new master"); /* informational */
    if (!lost) {
        ck_assert_msg(dlock_validity_ms(p.la) > 0, "renewed, yet no validity");
        ck_assert_msg(!atomic_load(&w.done), "two owners: the waiter got the lock (%s) while "
                                             "the holder still holds it",
                      dlock_err_name(w.rc));
        ck_assert_int_eq(dlock_release(p.la), DLOCK_OK);
    } else {
        ck_assert_int_eq(dlock_validity_ms(p.la), 0);
        ck_assert_int_eq(dlock_release(p.la), DLOCK_ELOST);
    }
    ck_assert_int_eq(tu_waiter_join(&w), DLOCK_OK);
    ck_assert_msg(w.token > first, "token %llu after %llu", (unsigned long long)w.token,
                  (unsigned long long)first);
    TU_ACQUIRE_OK(p.la, 30000);
    ck_assert_msg(tu_token(p.la) > w.token, "token %llu after %llu",
                  (unsigned long long)tu_token(p.la), (unsigned long long)w.token);
    TU_RELEASE_OK(p.la);
    tu_pair_close(&p);
    free(url);
    fx_sentinels_stop(&sen);
}

/* `dlock status` on a sentinel URL names the master the sentinels name
 * now: the old one before SENTINEL FAILOVER, the new one after (a new
 * process each time, as a user runs it); through redis+sentinel:// and
 * through rediss+sentinel:// (every server and sentinel on TLS: the
 * master found, ROLE-checked and inspected over TLS after the failover).
 * Over TLS a holder and a waiter ride the failover too: the waiter's
 * subscriber hears +switch-master from a sentinel over TLS, follows to the
 * new master and acquires there once the holder releases, with a greater
 * token. */
TU_TEST(sentinel_status_names_the_new_master, 150)
{
    for (int tls = 0; tls < 2; tls++) {
        sen.tls = tls;
        ck_assert_msg(fx_sentinels_start(&sen, 1, 3), "the Sentinel topology did not start");
        char *url = tu_fmt("%s%clease=20s", sen.url, tls ? '&' : '?');
        struct tu_pair p = tu_pair_of(tu_open(url), tu_open(url), "job");
        struct tu_waiter w = {0};
        uint64_t first = 0;
        int ports[2];
        ports[0] = tls ? held_and_awaited(&p, &w, &first) : fx_sentinels_master_port(&sen);
        for (int round = 0; round < 2; round++) {
            if (round)
                ports[1] = fx_sentinels_failover(&sen);
            ck_assert_msg(ports[round] != 0, "no master (round %d)", round);
            char *out = NULL, *err = NULL;
            TU_DLOCK(&out, &err, NULL, "-u", sen.url, "status", "job");
            char *want = tu_fmt("master:   127.0.0.1:%d\n", ports[round]);
            ck_assert_msg(out && strstr(out, want), "%s, round %d: '%s' lacks '%s' (stderr: %s)",
                          sen.url, round, out ? out : "", want, err ? err : "");
            free(want);
            free(out);
            free(err);
        }
        ck_assert_int_ne(ports[0], ports[1]);
        if (tls) {
            wait_numsub_at(ports[1], "job", 1); /* the waiter followed */
            TU_RELEASE_OK(p.la);
            ck_assert_int_eq(tu_waiter_join(&w), DLOCK_OK);
            ck_assert_msg(w.token > first, "token %llu after %llu", (unsigned long long)w.token,
                          (unsigned long long)first);
        }
        tu_pair_close(&p);
        free(url);
        fx_sentinels_stop(&sen);
    }
}

/* The connections sentinel I accepted so far (INFO stats; a sentinel
 * keeps no commandstats): each lookup of a client dials every sentinel
 * anew, the sentinels' own links to each other stay up. */
static long long sentinel_dialed(int i)
{
    redisContext *ctx = redisConnect("127.0.0.1", sen.sentinel_port[i]);
    ck_assert_msg(ctx && !ctx->err, "no raw connection to sentinel %d", i);
    long long n = info_number(ctx, "stats", "total_connections_received");
    ck_assert_msg(n >= 0, "sentinel %d: no total_connections_received in INFO stats", i);
    redisFree(ctx);
    return n;
}

/* The sentinels are asked together: with the sentinel that answered last
 * (asked first) stopped (SIGSTOP: it accepts connections but answers
 * nothing), a lookup forced inside an acquire (the master's connections
 * killed, so the pooled one breaks and the master goes stale) is answered
 * by the other sentinel within the acquire's budget (timeout=2s).
 * Asked one after another, the stopped one used the whole budget and the
 * acquire failed. */
TU_TEST(sentinel_stopped_is_asked_beside_the_others, 60)
{
    ck_assert_msg(fx_sentinels_start(&sen, 0, 2), "the Sentinel topology did not start");
    char *url = tu_fmt("%s?timeout=2s&connect_timeout=5s", sen.url);
    struct tu_solo s = tu_solo_open(url, "job");
    TU_ACQUIRE_OK(s.l, DLOCK_TRY); /* sentinel 0 answered: asked first next time */
    TU_RELEASE_OK(s.l);
    long long dialed = sentinel_dialed(1);
    kill(sen.sentinel_pid[0], SIGSTOP);
    redisContext *ctx = fx_redis_raw(&sen.master, NULL);
    freeReplyObject(redisCommand(ctx, "CLIENT KILL TYPE normal SKIPME yes"));
    int rc = dlock_acquire(s.l, 60000);
    kill(sen.sentinel_pid[0], SIGCONT);
    ck_assert_msg(rc == DLOCK_OK, "acquire: %s: %s", dlock_err_name(rc), dlock_errmsg());
    /* more than this test's own look: the client asked sentinel 1 */
    ck_assert_msg(sentinel_dialed(1) > dialed + 1, "sentinel 1 was not asked");
    redisReply *r = redisCommand(ctx, "EXISTS job");
    ck_assert_msg(r && r->integer == 1, "the hold is not on the master");
    freeReplyObject(r);
    TU_RELEASE_OK(s.l);
    redisFree(ctx);
    tu_solo_close(&s); /* frees URL */
    fx_sentinels_stop(&sen);
}

/* Sentinels that want a password (requirepass): refused without one
 * (DLOCK_EAUTH saying what to give) or with a wrong one; served with
 * ?sentinel_password= or DLOCK_REDIS_SENTINEL_PASSWORD. */
TU_TEST(sentinel_password_from_url_and_environment, 60)
{
    sen.sentinel_password = "s3cret";
    ck_assert_msg(fx_sentinels_start(&sen, 0, 1), "the Sentinel topology did not start");
    open_fails(sen.url, DLOCK_EAUTH, "sentinel_password");
    char *wrong = tu_fmt("%s?sentinel_password=nope", sen.url);
    open_fails(wrong, DLOCK_EAUTH, "sentinel_password refused");
    char *right = tu_fmt("%s?sentinel_password=s3cret", sen.url);
    const char *urls[] = {right, sen.url};
    setenv("DLOCK_REDIS_SENTINEL_PASSWORD", "s3cret", 1); /* used by the second only */
    for (size_t i = 0; i < 2; i++) {
        dlock_client *c = tu_open(urls[i]);
        dlock_lock *l = tu_lock(c, "authed");
        TU_ACQUIRE_OK(l, DLOCK_TRY);
        ck_assert_int_eq(dlock_release(l), DLOCK_OK);
        dlock_lock_free(l);
        dlock_client_close(c);
    }
    unsetenv("DLOCK_REDIS_SENTINEL_PASSWORD");
    free(wrong);
    free(right);
    fx_sentinels_stop(&sen);
}

/* The fault relay (tests/lib/relay.h) on the replication link between a
 * replica and the master: in TU_RELAY_FREEZE it stops passing the
 * master's stream on, so the replica stays connected and up to its
 * sentinels but receives no more writes. */
static int link_relay_start(int master_port, size_t i, void *arg)
{
    struct tu_relay *lr = &((struct tu_relay *)arg)[i];
    tu_relay_start_with(lr, &(struct tu_relay_config){.target = master_port,
                                                      .close_with_client = true});
    return lr->port;
}

/* The failover loss, shown: replication held back (the replicas stay up
 * and connected, their stream frozen by a proxy), a lock acquired on the
 * master, SENTINEL FAILOVER to a replica that never saw it: without sync
 * a second client is granted the lock while the first still holds it
 * (its validity left, no loss reported yet). With sync=1 the first acquire
 * already fails (no replica acknowledged; undone), so after the same
 * failover the second client is the only owner. Then the first owner's
 * next renewal reaches the new master: its hold is reported lost with a
 * reason naming the failover and the master that confirmed it last, and
 * the second owner's hold is untouched (never re-created over it). */
TU_TEST(sentinel_failover_loses_unsynced_hold, 180)
{
    struct tu_relay links[2];
    ck_assert_msg(fx_sentinels_start_via(&sen, 2, 3, link_relay_start, links),
                  "the Sentinel topology did not start");
    for (int i = 0; i < 2; i++) {
        tu_relay_set(&links[i], TU_RELAY_FREEZE);
        while (atomic_load(&links[i].frozen) < 1)
            tu_sleep_ms(10);
    }
    /* a lease longer than the failover: the first owner renews only after */
    char *plain_url = tu_fmt("%s?lease=90s", sen.url);
    char *sync_url = tu_fmt("%s?lease=30s&sync=1&sync_timeout=300ms", sen.url);
    struct tu_pair plain = tu_pair_of(tu_open(plain_url), tu_open(plain_url), "loss");
    struct tu_pair synced = tu_pair_of(tu_open(sync_url), tu_open(sync_url), "synced");
    tu_pair_watch_lost(&plain);

    int rc = dlock_acquire(synced.la, DLOCK_TRY);
    ck_assert_msg(rc == DLOCK_EUNAVAIL, "%s: %s", dlock_err_name(rc), dlock_errmsg());
    TU_ACQUIRE_OK(plain.la, DLOCK_TRY);
    int old = fx_sentinels_master_port(&sen);
    int now = fx_sentinels_failover(&sen);
    ck_assert_msg(now != 0 && now != old, "no failover (master %d, now %d)", old, now);

    /* without sync: a second owner */
    rc = dlock_acquire(plain.lb, DLOCK_TRY);
    ck_assert_msg(rc == DLOCK_OK, "no second owner: %s: %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_msg(atomic_load(&plain.lost.fired) == 0 && dlock_validity_ms(plain.la) > 0,
                  "the first owner already knew it lost the lock");
    /* with sync=1: the only owner */
    TU_ACQUIRE_OK(synced.lb, DLOCK_TRY);
    ck_assert_int_eq(dlock_release(synced.lb), DLOCK_OK);
    /* the first owner's next renewal (a third of its lease after the
     * acquire) reaches the new master: the hold is reported lost, naming
     * the failover, and not re-created there over the second owner */
    ck_assert_msg(tu_wait_lost(&plain.lost, 1, 90000), "the lost hold was never reported");
    char *by_old = tu_fmt("master 127.0.0.1:%d confirmed it last", old);
    ck_assert_msg(strstr(plain.lost.why, "lost in a Sentinel failover") &&
                      strstr(plain.lost.why, by_old),
                  "the reason does not name the failover: %s", plain.lost.why);
    free(by_old);
    ck_assert_int_eq(dlock_validity_ms(plain.la), 0);
    ck_assert_msg(dlock_validity_ms(plain.lb) > 0, "the second owner lost its hold");
    ck_assert_int_eq(dlock_release(plain.la), DLOCK_ELOST);
    ck_assert_int_eq(dlock_release(plain.lb), DLOCK_OK);

    tu_pair_close(&plain);
    tu_pair_close(&synced);
    free(plain_url);
    free(sync_url);
    fx_sentinels_stop(&sen);
    tu_relay_stop(&links[0]);
    tu_relay_stop(&links[1]);
}

/* ------------------------------------------------------------------ CLI */

TU_TEST(cli_on_redis_urls, 60)
{
    start_server(NULL);
    const char *dl = tu_dlock_bin();
    {
        const char *argv[] = {dl, "-u", srv.url, "run", "-n", "clijob", "true", NULL};
        ck_assert_int_eq(tu_run(argv, NULL, NULL, NULL), 0);
    }
    {
        const char *argv[] = {dl, "-u", srv.url, "run", "-n", "clijob", "sh", "-c", "exit 7", NULL};
        ck_assert_int_eq(tu_run(argv, NULL, NULL, NULL), 7);
    }
    {
        char *out = NULL;
        const char *argv[] = {dl, "-u", srv.url, "run", "clijob", "--", "sh", "-c", "echo $DLOCK_TOKEN", NULL};
        ck_assert_int_eq(tu_run(argv, NULL, &out, NULL), 0);
        redisContext *ctx = raw();
        ck_assert_int_eq(strtoll(out, NULL, 10), cmd_int(ctx, "GET %s", "redisson_lock_token:{clijob}"));
        redisFree(ctx);
        free(out);
    }
    dlock_client *c = tu_open(srv.url);
    dlock_lock *l = tu_lock(c, "clijob");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    {
        const char *argv[] = {dl, "-u", srv.url, "run", "-n", "clijob", "true", NULL};
        ck_assert_int_eq(tu_run(argv, NULL, NULL, NULL), 1);
    }
    {
        char *out = NULL;
        const char *argv[] = {dl, "-u", srv.url, "status", "clijob", NULL};
        ck_assert_int_eq(tu_run(argv, NULL, &out, NULL), 0);
        ck_assert_msg(out && strstr(out, "4"), "status: %s", out ? out : "");
        free(out);
    }
    {
        char *out = NULL;
        const char *argv[] = {dl, "-u", srv.url, "list", NULL};
        ck_assert_int_eq(tu_run(argv, NULL, &out, NULL), 0);
        ck_assert_msg(out && strstr(out, "clijob"), "list: %s", out ? out : "");
        free(out);
    }
    {
        const char *argv[] = {dl, "-u", srv.url, "release", "--force", "clijob", NULL};
        ck_assert_int_eq(tu_run(argv, NULL, NULL, NULL), 0);
    }
    ck_assert_int_eq(dlock_release(l), DLOCK_ELOST);
    {
        char *bad = tu_fmt("redis://127.0.0.1:%d", tu_free_port());
        char *err = NULL;
        const char *argv[] = {dl, "-u", bad, "run", "-n", "x", "true", NULL};
        ck_assert_int_eq(tu_run(argv, NULL, NULL, &err), 69);
        ck_assert_msg(err && strstr(err, "127.0.0.1:"), "%s", err ? err : "");
        free(err);
        free(bad);
    }
    {
        const char *extra_env[] = {NULL};
        char *u = tu_fmt("%s?layout=nope", srv.url);
        const char *argv[] = {dl, "-u", u, "run", "-n", "x", "true", NULL};
        ck_assert_int_eq(tu_run(argv, extra_env, NULL, NULL), 78);
        free(u);
    }
    dlock_lock_free(l);
    dlock_client_close(c);
    stop_server();
}

/* `dlock run` on a redis URL: the lease is renewed while the command runs
 * and ends soon after the CLI is killed with SIGKILL. */
TU_TEST(cli_holder_renewed_then_killed, 60)
{
    start_server(NULL);
    const char *argv[] = {tu_dlock_bin(), "-u", srv.url, "run", "--lease", "1.5", "clik9", "--", "sleep", "60", NULL};
    pid_t pid = tu_spawn(argv, NULL);
    redisContext *ctx = raw();
    for (int i = 0; i < 500 && cmd_int(ctx, "EXISTS clik9") != 1; i++)
        tu_sleep_ms(10);
    ck_assert_int_eq(cmd_int(ctx, "EXISTS clik9"), 1);
    long long held_token = cmd_int(ctx, "GET %s", "redisson_lock_token:{clik9}");
    tu_sleep_ms(3000); /* two leases: only renewals keep it */
    ck_assert_int_eq(cmd_int(ctx, "EXISTS clik9"), 1);
    long long ttl = cmd_int(ctx, "PTTL clik9");
    ck_assert_msg(ttl > 0 && ttl <= 1500, "pttl %lld", ttl);
    kill(-pid, SIGKILL);
    waitpid(pid, NULL, 0);
    dlock_client *c = tu_open(srv.url);
    dlock_lock *l = tu_lock(c, "clik9");
    TU_ACQUIRE_OK(l, 20000);
    ck_assert_uint_eq(tu_token(l), (uint64_t)held_token + 1);
    dlock_release(l);
    dlock_lock_free(l);
    dlock_client_close(c);
    redisFree(ctx);
    stop_server();
}

int main(void)
{
    return tu_main("redis", NULL, NULL);
}
