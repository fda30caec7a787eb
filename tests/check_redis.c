/* check_redis.c -- the Redis backend against a real redis-server: the
 * basics, interoperability, at scale, URLs. The other concerns have
 * binaries of their own (redis_suite.h names them).
 *
 * Other clients are played on the wire with raw hiredis commands: a
 * Redisson RLock/RFencedLock (hash field, PEXPIRE, the "0" message on
 * redisson_lock__channel:{name}) and a redis-py style simple lock
 * (SET NX PX, compare-and-delete). The lock contract itself (reentrancy,
 * waits, fixed leases, holders killed or paused...) is tested once for
 * every backend in check_contract.c; these files keep the Redis wire
 * layouts and protocol faults.
 */
#include "redis_suite.h"

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

/* Threads of one process are distinct owners ("<uuid>:<tid>"), and a
 * release wakes a waiting thread through the subscriber connection. */
/* The token counter is what dlock_check() and status read a token from:
 * a counter that is no number ("<T>abc", left by a broken server or any
 * writer of the key) is DLOCK_EPROTO naming it, not read as T (before:
 * strtoull took the digits in front, and dlock_check said T current). */
TU_TEST(garbled_token_counter_is_an_error, 60)
{
    start_server(NULL);
    dlock_client *c = tu_open(srv.url);
    dlock_lock *l = tu_lock(c, "gtok");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    uint64_t t = tu_token(l);
    redisContext *ctx = raw();
    freeReplyObject(cmd(ctx, "SET %s %lluabc", "redisson_lock_token:{gtok}", (unsigned long long)t));
    int rc = dlock_check(c, "gtok", t);
    ck_assert_msg(rc == DLOCK_EPROTO && strstr(dlock_errmsg(), "redisson_lock_token:{gtok}"),
                  "check against a garbled counter: %s (%s)", dlock_err_name(rc), dlock_errmsg());
    dlock_info *info = NULL;
    ck_assert_int_eq(dlock_inspect(c, "gtok", &info), DLOCK_EPROTO);
    redisFree(ctx);
    dlock_release(l);
    dlock_lock_free(l);
    dlock_client_close(c);
}

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

int main(void)
{
    return tu_main("redis", NULL, NULL);
}
