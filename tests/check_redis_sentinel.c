/* check_redis_sentinel.c -- the Redis backend over TLS, with replica
 * sync (WAIT) and behind Sentinel, failovers included.
 */
#include "redis_suite.h"

/* ------------------------------------------------------------------ TLS */

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
    u = tu_fmt("rediss://127.0.0.1:%d?tls_ca=%s&tls_cert=%s", srv.tls_port, srv.ca,
               srv.client_cert);
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
        ck_assert_msg(server && strcmp(server, sha) == 0,
                      "%s.lua: the server says %s, the build %s", name, server ? server : "nothing",
                      sha);
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
    for (int i = 0;
         i < 1000 && info_number(ctx, "clients", "blocked_clients") < 1 && !atomic_load(&mt.done);
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
    for (int i = 0;
         i < 1000 && info_number(ctx, "clients", "blocked_clients") < 1 && !atomic_load(&w.done);
         i++)
        tu_sleep_ms(5);
    ck_assert_msg(!atomic_load(&w.done), "the acquire returned before its WAIT blocked: %s",
                  dlock_err_name(atomic_load(&w.rc)));
    freeReplyObject(cmd(ctx, "CLIENT PAUSE 5000 WRITE"));
    int rc = tu_waiter_join(&w);
    ck_assert_msg(rc == DLOCK_EUNAVAIL, "acquire: %s", dlock_err_name(rc));
    /* the pause ends, the keeper's cleanup undoes it: a condition */
    for (int i = 0; i < 600 && cmd_int(ctx, "EXISTS undo") != 0; i++)
        tu_sleep_ms(50);
    ck_assert_msg(cmd_int(ctx, "EXISTS undo") == 0,
                  "the unsynced acquire was never undone (%lld ms of lease left)",
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
    ck_assert_msg(got == want, "%lld subscribers of '%s' on port %d, not %lld", got, name, port,
                  want);
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
        ck_assert_msg(!atomic_load(&w.done),
                      "two owners: the waiter got the lock (%s) while "
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

int main(void)
{
    return tu_main("redis", NULL, NULL);
}
