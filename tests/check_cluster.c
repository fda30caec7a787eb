/* check_cluster.c -- redis+cluster:// against a real Redis Cluster (three
 * masters, a replica each, made by `redis-cli --cluster create`): what a
 * cluster adds to the single-node backend.
 *
 * The lock contract runs on the cluster in check_contract (fixture
 * "redis-cluster"); here are what only a cluster has: names on every
 * master, a stale slot map (MOVED), a slot migrated while held (ASK,
 * TRYAGAIN, then MOVED), a manual failover and a master killed while a
 * lock is held and waited for, the CLI on a cluster URL, and redirects
 * followed over TLS (rediss+cluster://, case "tls").
 */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dlock.h"
#include "fixture_redis.h"
#include "testutil.h"

static struct fx_cluster cl;

static void start_cluster(void)
{
    ck_assert_msg(fx_cluster_start(&cl, 3, 1), "the cluster could not be started");
}

static void stop_cluster(void)
{
    for (size_t i = 0; i < cl.n; i++)
        if (cl.node[i].pid > 0)
            kill(cl.node[i].pid, SIGCONT);
    fx_cluster_stop(&cl);
}

/* A lock name ("PREFIX-<n>") whose slot the master on PORT serves now,
 * into BUF. */
static const char *name_on(int port, const char *prefix, char *buf, size_t size)
{
    for (int i = 0; i < 100000; i++) {
        snprintf(buf, size, "%s-%d", prefix, i);
        if (fx_cluster_master_of(&cl, fx_cluster_keyslot(&cl, buf)) == port)
            return buf;
    }
    ck_abort_msg("no name of '%s' falls on the master on port %d", prefix, port);
    return NULL;
}

/* The masters' ports, as the cluster says now. */
static int masters(int *ports, int max)
{
    int n = 0;
    for (unsigned slot = 0; slot < 16384 && n < max; slot += 64) {
        int m = fx_cluster_master_of(&cl, slot);
        bool seen = false;
        for (int i = 0; i < n; i++)
            seen |= ports[i] == m;
        if (m && !seen)
            ports[n++] = m;
    }
    return n;
}

/* The three masters' ports into PORTS, a name PREFIX-<n> the first of
 * them serves into NAME, and that name's slot (to move it to another). */
static unsigned slot_on_first_master(int ports[8], const char *prefix, char *name, size_t size)
{
    ck_assert_int_eq(masters(ports, 8), 3);
    name_on(ports[0], prefix, name, size);
    return fx_cluster_keyslot(&cl, name);
}

/* The port of the I-th of the three masters, and a name PREFIX-<n> on it
 * into NAME. */
static int master_name(int i, const char *prefix, char *name, size_t size)
{
    int ports[8];
    ck_assert_int_eq(masters(ports, 8), 3);
    name_on(ports[i], prefix, name, size);
    return ports[i];
}

/* One raw command on the node on HOST:PORT that must not fail, its
 * arguments split on spaces (none here holds one); the reply (caller
 * frees). must(): on 127.0.0.1, where the fixture's nodes listen. */
static redisReply *must_at(const char *host, int port, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define must(...) must_at("127.0.0.1", __VA_ARGS__)
static redisReply *must_at(const char *host, int port, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char cmd[1024];
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    const char *argv[16];
    size_t argl[16];
    int argc = 0;
    for (char *p = strtok(cmd, " "); p && argc < 16; p = strtok(NULL, " ")) {
        argv[argc] = strcmp(p, "''") == 0 ? "" : p;
        argl[argc] = strlen(argv[argc]);
        argc++;
    }
    struct timeval tv = {5, 0};
    redisContext *ctx = redisConnectWithTimeout(host, port, tv);
    ck_assert_msg(ctx && !ctx->err, "no connection to %s:%d", host, port);
    redisReply *r = redisCommandArgv(ctx, argc, argv, argl);
    ck_assert_msg(r && r->type != REDIS_REPLY_ERROR, "'%s' on %s:%d: %s", argv[0], host, port,
                  r ? r->str : ctx->errstr);
    redisFree(ctx);
    return r;
}

#define run_on(...) freeReplyObject(must(__VA_ARGS__))
#define run_at(...) freeReplyObject(must_at(__VA_ARGS__))

#define node_id(port) node_id_at("127.0.0.1", port)
static char *node_id_at(const char *host, int port)
{
    /* CLUSTER MYID is 7.2's: the "myself" line of CLUSTER NODES */
    redisReply *r = must_at(host, port, "CLUSTER NODES");
    char *line = strstr(r->str, "myself");
    while (line && line > r->str && line[-1] != '\n')
        line--;
    ck_assert_msg(line != NULL, "no myself in CLUSTER NODES of %s:%d", host, port);
    char *id = strndup(line, 40);
    freeReplyObject(r);
    return id;
}

/* Mark SLOT as leaving the master on FROM for the one on TO (IMPORTING
 * on TO, MIGRATING on FROM), no key moved yet. */
static void slot_migrating(unsigned slot, int from, int to)
{
    char *from_id = node_id(from), *to_id = node_id(to);
    run_on(to, "CLUSTER SETSLOT %u IMPORTING %s", slot, from_id);
    run_on(from, "CLUSTER SETSLOT %u MIGRATING %s", slot, to_id);
    free(from_id);
    free(to_id);
}

/* Start moving SLOT from the master on FROM to the one on TO, and
 * MIGRATE every key of the slot over, as `redis-cli --cluster reshard`
 * does (the source makes no new key in a migrating slot, so the loop
 * ends). */
static void migrate_start(unsigned slot, int from, int to)
{
    slot_migrating(slot, from, to);
    /* a TLS cluster (tls-cluster) migrates over TLS */
    int dest = cl.tls ? fx_cluster_server(&cl, to)->tls_port : to;
    for (;;) {
        redisReply *r = must(from, "CLUSTER GETKEYSINSLOT %u 100", slot);
        size_t n = r->elements;
        for (size_t i = 0; i < n; i++) /* no key here holds a space */
            run_on(from, "MIGRATE 127.0.0.1 %d %s 0 5000", dest, r->element[i]->str);
        freeReplyObject(r);
        if (n == 0)
            break;
    }
}

/* Finish the move: SLOT belongs to TO, as every master is told. */
static void migrate_end(unsigned slot, int to)
{
    char *to_id = node_id(to);
    int ports[8];
    int n = masters(ports, 8);
    run_on(to, "CLUSTER SETSLOT %u NODE %s", slot, to_id);
    for (int i = 0; i < n; i++)
        if (ports[i] != to)
            run_on(ports[i], "CLUSTER SETSLOT %u NODE %s", slot, to_id);
    free(to_id);
    ck_assert(fx_cluster_wait_ok(&cl));
}

/* Wait until NAME's release channel has WANT sharded subscribers on the
 * node on PORT. */
static void wait_shardnumsub_at(int port, const char *name, long long want)
{
    long long got = fx_redis_wait_lock_subscribers(port, name, true, want);
    ck_assert_msg(got == want, "%lld sharded subscribers of '%s' on port %d, not %lld", got, name,
                  port, want);
}

/* Wait until L's hold is renewed (its validity grows), and assert it was
 * not reported lost (to LOST) meanwhile. */
static void wait_lock_renewed(dlock_lock *l, struct tu_lost *lost)
{
    int64_t before = dlock_validity_ms(l);
    for (int i = 0; i < 800; i++) {
        ck_assert_msg(atomic_load(&lost->fired) == 0, "the hold was lost: %s", lost->why);
        int64_t now = dlock_validity_ms(l);
        if (now > before)
            return;
        before = now;
        tu_sleep_ms(25);
    }
    ck_abort_msg("the hold was never renewed");
}

static void wait_renewed(struct tu_pair *p)
{
    wait_lock_renewed(p->la, &p->lost);
}

/* P: two clients on URL and their handles on NAME; the first holds it,
 * the second waits for it in W, subscribed on the master on PORT. The
 * holder's token. */
static uint64_t hold_and_wait(struct tu_pair *p, struct tu_waiter *w, const char *url,
                              const char *name, int port)
{
    *p = tu_pair_of(tu_open(url), tu_open(url), name);
    tu_pair_watch_lost(p);
    TU_ACQUIRE_OK(p->la, DLOCK_TRY);
    uint64_t first = tu_token(p->la);
    memset(w, 0, sizeof *w);
    tu_waiter_start(w, p->lb, 60000);
    wait_shardnumsub_at(port, name, 1);
    return first;
}

/* P's holder releases; the waiter W gets the lock, with a token above
 * FIRST. */
static void hand_over(struct tu_pair *p, struct tu_waiter *w, uint64_t first)
{
    TU_RELEASE_OK(p->la);
    ck_assert_int_eq(tu_waiter_join(w), DLOCK_OK);
    ck_assert_msg(w->token > first, "token %llu after %llu", (unsigned long long)w->token,
                  (unsigned long long)first);
}

/* ---------------------------------------------------------------- tests */

/* A name on each master, in both layouts: taken, refused to a second
 * client, waited for and handed over on release (the waiter woken by the
 * sharded release message well before the 30 s lease ends), its lock key
 * and token key on that master. */
TU_TEST(locks_on_every_master, 120)
{
    int ports[8];
    ck_assert_int_eq(masters(ports, 8), 3);
    static const char *const layouts[] = {"redisson", "simple"};
    for (int lay = 0; lay < 2; lay++) {
        char *url = tu_fmt("%s?layout=%s", cl.url, layouts[lay]);
        dlock_client *a = tu_open(url), *b = tu_open(url);
        for (int i = 0; i < 3; i++) {
            char name[64];
            name_on(ports[i], layouts[lay], name, sizeof name);
            dlock_lock *la = tu_lock(a, name), *lb = tu_lock(b, name);
            TU_ACQUIRE_OK(la, DLOCK_TRY);
            uint64_t ta = tu_token(la);
            ck_assert_int_eq(dlock_acquire(lb, DLOCK_TRY), DLOCK_EBUSY);
            redisReply *r = fx_cluster_raw(ports[i], "TYPE %s", name);
            ck_assert_str_eq(r->str, lay ? "string" : "hash");
            freeReplyObject(r);
            r = fx_cluster_raw(ports[i], "EXISTS redisson_lock_token:{%s}", name);
            ck_assert_int_eq(r->integer, 1);
            freeReplyObject(r);
            struct tu_waiter w = {0};
            tu_waiter_start(&w, lb, 20000);
            ck_assert(tu_wait_thread_asleep(&w.tid, 10000));
            wait_shardnumsub_at(ports[i], name, 1);
            TU_RELEASE_OK(la);
            ck_assert_int_eq(tu_waiter_join(&w), DLOCK_OK);
            ck_assert_uint_gt(w.token, ta); /* tokens only grow */
            TU_FREE_LOCKS(la, lb);
        }
        TU_CLOSE_CLIENTS(a, b);
        free(url);
    }
}

/* Redisson in cluster mode on the wire, played raw on the slot's master:
 * its hold (a hash with its owner field) keeps dlock out; its unlock (the
 * hash deleted, "0" sent with SPUBLISH on redisson_lock__channel:{name},
 * as Redisson 3.23+ does on a cluster) wakes dlock's waiter at once. */
TU_TEST(redisson_cluster_wire, 60)
{
    char name[64];
    int port = master_name(1, "redisson", name, sizeof name);
    run_on(port, "HSET %s 8a1c0d7e-0000-4000-8000-000000000001:1 1", name);
    run_on(port, "PEXPIRE %s 30000", name);
    dlock_client *c = tu_open(cl.url);
    dlock_lock *l = tu_lock(c, name);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_EBUSY);
    struct tu_waiter w = {0};
    tu_waiter_start(&w, l, 20000);
    wait_shardnumsub_at(port, name, 1);
    run_on(port, "DEL %s", name);
    run_on(port, "SPUBLISH redisson_lock__channel:{%s} 0", name);
    ck_assert_int_eq(tu_waiter_join(&w), DLOCK_OK);
    dlock_lock_free(l);
    dlock_client_close(c);
}

/* ?sync=1: every write waits for the master's replica (WAIT on the
 * master that ran it); with that replica stopped, an acquire is undone
 * and fails, naming the count. */
TU_TEST(sync_waits_for_the_masters_replica, 60)
{
    char name[64];
    int port = master_name(2, "synced", name, sizeof name);
    char *url = tu_fmt("%s?sync=1&sync_timeout=300ms", cl.url);
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock(c, name);
    tu_acquire_release(l, DLOCK_TRY);
    struct fx_redis *replica = fx_cluster_server(&cl, fx_cluster_replica_of(&cl, port));
    ck_assert_ptr_nonnull(replica);
    tu_pause(replica->pid);
    int rc = dlock_acquire(l, DLOCK_TRY);
    kill(replica->pid, SIGCONT);
    ck_assert_msg(rc == DLOCK_EUNAVAIL && strstr(dlock_errmsg(), "only 0 of 1"), "%s: %s",
                  dlock_err_name(rc), dlock_errmsg());
    redisReply *r = fx_cluster_raw(port, "EXISTS %s", name);
    ck_assert_int_eq(r->integer, 0); /* undone */
    freeReplyObject(r);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(url);
}

/* The client learned the map, then a slot moved (keys and all): its
 * next request goes to the old master, which answers MOVED; the client
 * follows it, and remembers. */
TU_TEST(moved_slot_followed, 120)
{
    int ports[8];
    char name[64];
    unsigned slot = slot_on_first_master(ports, "moved", name, sizeof name);
    dlock_client *c = tu_open(cl.url);
    dlock_lock *l = tu_lock(c, name);
    tu_acquire_release(l, DLOCK_TRY); /* the map is known, the token key exists */
    migrate_start(slot, ports[0], ports[1]);
    migrate_end(slot, ports[1]);
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    redisReply *r = fx_cluster_raw(ports[1], "EXISTS %s", name);
    ck_assert_int_eq(r->integer, 1); /* on the new master */
    freeReplyObject(r);
    TU_RELEASE_OK(l);
    dlock_lock_free(l);
    dlock_client_close(c);
}

/* The command line on a cluster URL: run holds a name on one master
 * while a library client holds one on another; status sees each, list
 * sees both (every master scanned), run -n is busy, release --force
 * frees it. */
TU_TEST(cli_on_cluster, 120)
{
    int ports[8];
    ck_assert_int_eq(masters(ports, 8), 3);
    char a[64], b[64];
    name_on(ports[0], "cli-a", a, sizeof a);
    name_on(ports[2], "cli-b", b, sizeof b);
    dlock_client *c = tu_open(cl.url);
    dlock_lock *lb = tu_lock(c, b);
    TU_ACQUIRE_OK(lb, DLOCK_TRY);
    char *dir = tu_tmpdir("cluster-cli"), *tok = tu_fmt("%s/tok", dir), *go = tu_fmt("%s/go", dir);
    char *log = tu_fmt("%s/run.log", dir);
    char *script = tu_fmt("echo \"$DLOCK_TOKEN\" > %s.tmp && mv %s.tmp %s; "
                          "while [ ! -e %s ]; do sleep 0.05; done",
                          tok, tok, tok, go);
    const char *run[] = {tu_dlock_bin(), "-u", cl.url, "run", a, "--", "sh", "-c", script, NULL};
    pid_t runner = tu_spawn(run, log);
    ck_assert_msg(tu_wait_file(tok, 30000), "dlock run never ran its command");
    ck_assert_uint_gt(tu_read_u64(tok), 0);
    char *out = NULL;
    ck_assert_int_eq(TU_DLOCK(&out, NULL, NULL, "-u", cl.url, "status", a), 0);
    free(out);
    ck_assert_int_eq(TU_DLOCK(NULL, NULL, NULL, "-u", cl.url, "status", b), 0);
    ck_assert_int_eq(TU_DLOCK(&out, NULL, NULL, "-u", cl.url, "list", "cli-*"), 0);
    ck_assert_msg(strstr(out, a) && strstr(out, b), "list: %s", out);
    free(out);
    ck_assert_int_eq(TU_DLOCK(NULL, NULL, NULL, "-u", cl.url, "run", "-n", a, "--", "true"), 1);
    ck_assert_int_eq(TU_DLOCK(NULL, NULL, NULL, "-u", cl.url, "release", "--force", a), 0);
    ck_assert_int_eq(TU_DLOCK(NULL, NULL, NULL, "-u", cl.url, "status", a), 1);
    tu_write_marker(go, "go");
    tu_wait_exit(runner);
    TU_RELEASE_OK(lb);
    ck_assert_int_eq(TU_DLOCK(NULL, NULL, NULL, "-u", cl.url, "status", b), 1);
    dlock_lock_free(lb);
    dlock_client_close(c);
    tu_rmrf(dir);
    free(dir);
    free(tok);
    free(go);
    free(log);
    free(script);
}

/* A holder and a waiter on one master's slot through CLUSTER FAILOVER on
 * its replica, then (on another master) through kill -9 of the master:
 * the hold is renewed on the promoted replica, the waiter subscribes
 * there (SSUBSCRIBE on the slot's new master) and acquires once the
 * holder releases, with a greater token. */
TU_TEST(failover_holding_and_waiting, 180)
{
    int ports[8];
    ck_assert_int_eq(masters(ports, 8), 3);
    char *url = tu_fmt("%s?lease=6s", cl.url);
    for (int round = 0; round < 2; round++) {
        char name[64];
        name_on(ports[round], round ? "killed" : "failover", name, sizeof name);
        unsigned slot = fx_cluster_keyslot(&cl, name);
        int old = ports[round], replica = fx_cluster_replica_of(&cl, old);
        ck_assert_int_ne(replica, 0);
        struct tu_pair p;
        struct tu_waiter w;
        uint64_t first = hold_and_wait(&p, &w, url, name, old);
        if (round == 0) {
            ck_assert(fx_cluster_failover(&cl, replica));
        } else {
            run_on(old, "WAIT 1 5000"); /* the hold is on the replica */
            fx_redis_kill(fx_cluster_server(&cl, old));
            ck_assert(fx_cluster_wait_ok(&cl));
        }
        ck_assert_int_eq(fx_cluster_master_of(&cl, slot), replica);
        wait_shardnumsub_at(replica, name, 1); /* the waiter followed */
        wait_renewed(&p);                      /* on the new master */
        hand_over(&p, &w, first);
        tu_pair_close(&p);
    }
    free(url);
}

/* A slot migrated while its lock is held and waited for: with the keys
 * moved and the slot still migrating, the hold is renewed through ASK,
 * and another client's try passes TRYAGAIN until its time is up (its
 * script names keys that do not exist, on neither node); once the slot belongs to the new master, requests are MOVED
 * there, the waiter subscribes there, and the hand-over works. */
TU_TEST(slot_migrated_while_held, 120)
{
    int ports[8];
    char name[64];
    unsigned slot = slot_on_first_master(ports, "migrated", name, sizeof name);
    char *url = tu_fmt("%s?lease=6s", cl.url);
    struct tu_pair p;
    struct tu_waiter w;
    uint64_t first = hold_and_wait(&p, &w, url, name, ports[0]);

    migrate_start(slot, ports[0], ports[1]);
    wait_renewed(&p); /* through ASK: the renewal names the lock key alone */
    char *short_url = tu_fmt("%s?timeout=500ms", cl.url);
    dlock_client *c = tu_open(short_url);
    dlock_lock *l = tu_lock(c, name);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_EUNAVAIL);
    ck_assert_msg(strstr(dlock_errmsg(), "TRYAGAIN"), "%s", dlock_errmsg());

    migrate_end(slot, ports[1]);
    wait_shardnumsub_at(ports[1], name, 1); /* the waiter followed the slot */
    wait_renewed(&p);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_EBUSY); /* MOVED */
    hand_over(&p, &w, first);
    redisReply *r = fx_cluster_raw(ports[1], "EXISTS redisson_lock_token:{%s}", name);
    ck_assert_int_eq(r->integer, 1);
    freeReplyObject(r);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(short_url);
    tu_pair_close(&p);
    free(url);
}

/* One client holding a name on each master; one master at a time paused
 * for writes (CLIENT PAUSE WRITE: the renew script waits, the cluster bus
 * goes on, so nothing fails over): the holds on the other two are renewed
 * and never lost. The lease (3 s) is shorter than the request timeout, so
 * a renewal sent to the paused master waits until the batch's deadline;
 * the masters renewed one after another, those after it were sent nothing
 * in time and their holds were lost with its. */
TU_TEST(renewals_go_on_with_a_master_paused, 120)
{
    int ports[8];
    ck_assert_int_eq(masters(ports, 8), 3);
    char *url = tu_fmt("%s?lease=3s", cl.url);
    for (int paused = 0; paused < 3; paused++) {
        dlock_client *c = tu_open(url);
        dlock_lock *l[3];
        struct tu_lost lost[3];
        memset(lost, 0, sizeof lost);
        for (int i = 0; i < 3; i++) {
            char name[64];
            name_on(ports[i], "paused", name, sizeof name);
            l[i] = tu_lock(c, name);
            ck_assert_int_eq(dlock_lock_on_lost(l[i], tu_on_lost, &lost[i]), DLOCK_OK);
            TU_ACQUIRE_OK(l[i], DLOCK_TRY);
        }
        run_on(ports[paused], "CLIENT PAUSE 60000 WRITE");
        for (int i = 0; i < 3; i++)
            if (i != paused)
                wait_lock_renewed(l[i], &lost[i]);
        run_on(ports[paused], "CLIENT UNPAUSE");
        for (int i = 0; i < 3; i++) {
            if (i != paused)
                TU_RELEASE_OK(l[i]);
            else
                dlock_release(l[i]); /* may be lost: no renewal reached it in time */
            dlock_lock_free(l[i]);
        }
        dlock_client_close(c);
    }
    free(url);
}

/* Errors ERR (e.g. "TRYAGAIN") the node on PORT has answered so far. */
static long long errors_answered(int port, const char *err)
{
    redisReply *r = must(port, "INFO errorstats");
    char *tag = tu_fmt("errorstat_%s:count=", err);
    const char *at = strstr(r->str, tag);
    long long n = at ? atoll(at + strlen(tag)) : 0;
    free(tag);
    freeReplyObject(r);
    return n;
}

/* Wait until the node on PORT has answered TRYAGAIN more than BEFORE
 * times. */
static void wait_tryagain(int port, long long before)
{
    for (int i = 0; i < 6000 && errors_answered(port, "TRYAGAIN") == before; i++)
        tu_sleep_ms(10);
    ck_assert_msg(errors_answered(port, "TRYAGAIN") > before, "no TRYAGAIN answered");
}

/* Once the node on PORT has answered TRYAGAIN more than BEFORE times,
 * so that W's acquire pauses between two tries, fire W's cancel object:
 * the acquire returns DLOCK_ECANCELED. */
static void cancel_in_tryagain_pause(struct tu_waiter *w, int port, long long before)
{
    wait_tryagain(port, before);
    ck_assert_int_eq(dlock_cancel_fire(w->cancel), DLOCK_OK);
    int rc = tu_waiter_join(w);
    ck_assert_msg(rc == DLOCK_ECANCELED, "%s", dlock_err_name(rc));
}

/* An acquire waiting forever while the cluster answers TRYAGAIN (its
 * slot set migrating with no key moved yet: the token key is there, the
 * lock key is not, so the source refuses the script) is canceled in its
 * pause between two tries: it returns DLOCK_ECANCELED. Before, the pause
 * did not see the cancel: it went on trying until the 60 s op timeout
 * and returned that TRYAGAIN (DLOCK_EUNAVAIL). */
TU_TEST(canceled_wait_ends_a_tryagain_pause, 120)
{
    int ports[8];
    char name[64];
    unsigned slot = slot_on_first_master(ports, "paused", name, sizeof name);
    char *url = tu_fmt("%s?timeout=60s", cl.url);
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock(c, name);
    tu_acquire_release(l, DLOCK_TRY); /* the map is known, the token key exists */
    slot_migrating(slot, ports[0], ports[1]);
    long long before = errors_answered(ports[0], "TRYAGAIN");
    dlock_cancel *k;
    ck_assert_int_eq(dlock_cancel_new(&k), DLOCK_OK);
    struct tu_waiter w = {0};
    tu_waiter_start_ex(&w, l, DLOCK_FOREVER, k, false);
    cancel_in_tryagain_pause(&w, ports[0], before);
    /* the slot stable again, so the cancel the wait owes goes through
     * (a pause now tries for the whole op timeout, at the close) */
    run_on(ports[0], "CLUSTER SETSLOT %u STABLE", slot);
    run_on(ports[1], "CLUSTER SETSLOT %u STABLE", slot);
    dlock_cancel_free(k);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(url);
}

/* The id of a client of the node on PORT blocked in WAIT (a write that
 * ran, its reply held back until a replica acknowledges it), 0 while
 * there is none. */
static long long client_blocked_in_wait(int port)
{
    redisReply *r = must(port, "CLIENT LIST");
    long long id = 0;
    char *save = NULL;
    for (char *line = strtok_r(r->str, "\n", &save); line && !id;
         line = strtok_r(NULL, "\n", &save)) {
        const char *flags = strstr(line, " flags="), *cmd = strstr(line, " cmd=wait ");
        if (cmd && flags && strcspn(flags + 7, " b") < strcspn(flags + 7, " "))
            id = atoll(line + 3); /* "id=<n> ..." */
    }
    freeReplyObject(r);
    return id;
}

/* Names whose keys the layouts put in different slots (a '}' without a
 * '{', a lone '{', an empty tag '{}'), which every other URL form takes,
 * work on a cluster too: a lock excludes a second client and is handed
 * on, a semaphore and an election on the name work, and list shows the
 * names as they are. They were refused ("fall in different slots"). */
TU_TEST(every_name_works, 120)
{
    static const char *const names[] = {"a}b", "}", "{", "{}", "a{}b", "x{y", "{}{x}", "}{", "%7D"};
    dlock_client *a = tu_open(cl.url), *b = tu_open(cl.url);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *n = names[i];
        dlock_lock *la = tu_lock(a, n), *lb = tu_lock(b, n);
        int rc = dlock_acquire(la, DLOCK_TRY);
        ck_assert_msg(rc == DLOCK_OK, "'%s': %s: %s", n, dlock_err_name(rc), dlock_errmsg());
        uint64_t first = tu_token(la);
        ck_assert_int_eq(dlock_acquire(lb, DLOCK_TRY), DLOCK_EBUSY);
        struct tu_waiter w = {0};
        tu_waiter_start(&w, lb, 20000);
        ck_assert(tu_wait_thread_asleep(&w.tid, 10000));
        TU_RELEASE_OK(la);
        ck_assert_int_eq(tu_waiter_join(&w), DLOCK_OK);
        ck_assert_uint_gt(w.token, first);
        /* a semaphore and a lock of one name share its key: other names */
        char *sn = tu_fmt("%s-s", n);
        dlock_semaphore *s = tu_semaphore(a, sn, 2);
        dlock_permit *p = tu_permit(s, 1, DLOCK_TRY);
        ck_assert_int_eq(dlock_permit_release(p), DLOCK_OK);
        dlock_semaphore_free(s);
        free(sn);
        dlock_election *e = NULL;
        char *en = tu_fmt("%s-e", n);
        ck_assert_int_eq(dlock_election_new(b, en, 0, &e), DLOCK_OK);
        rc = dlock_election_campaign(e, "v", DLOCK_TRY, NULL);
        ck_assert_msg(rc == DLOCK_OK, "election '%s': %s: %s", en, dlock_err_name(rc),
                      dlock_errmsg());
        dlock_leader *l = NULL;
        ck_assert_int_eq(dlock_election_leader(a, en, &l), DLOCK_OK);
        ck_assert_str_eq(dlock_leader_value(l), "v");
        dlock_leader_free(l);
        ck_assert_int_eq(dlock_election_resign(e), DLOCK_OK);
        dlock_election_free(e);
        free(en);
        char *listed = tu_list_text(a, n, "|");
        ck_assert_str_eq(listed, ""); /* released */
        free(listed);
        TU_ACQUIRE_OK(la, DLOCK_TRY);
        listed = tu_list_text(b, NULL, "|");
        char *want = tu_fmt("|%s|", n), *all = tu_fmt("|%s", listed);
        ck_assert_msg(strstr(all, want), "list shows '%s', not '%s'", listed, n);
        free(want);
        free(all);
        free(listed);
        TU_RELEASE_OK(la);
        TU_FREE_LOCKS(la, lb);
    }
    TU_CLOSE_CLIENTS(a, b);
}

/* A release whose slot is being migrated meets TRYAGAIN until the
 * migration ends (its script names keys that never exist, which a
 * migrating slot refuses): it is tried again within its time (timeout
 * 20 s here), and frees the name once the slot has moved. It gave up
 * after 16 ASK redirects, about 5 s of pauses, whatever its time, and
 * left the name held until its lease ran out. */
struct releaser {
    dlock_lock *l;
    atomic_int rc, done;
};

static void *release_main(void *arg)
{
    struct releaser *r = arg;
    atomic_store(&r->rc, dlock_release(r->l));
    atomic_store(&r->done, 1);
    return NULL;
}

TU_TEST(release_waits_out_a_slot_migration, 120)
{
    int ports[8];
    char name[64];
    unsigned slot = slot_on_first_master(ports, "released", name, sizeof name);
    char *url = tu_fmt("%s?timeout=20s&lease=60s", cl.url);
    dlock_client *c = tu_open(url);
    struct releaser r = {0};
    ck_assert_int_eq(dlock_lock_new(c, name, DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED, &r.l),
                     DLOCK_OK);
    TU_ACQUIRE_OK(r.l, DLOCK_TRY);
    migrate_start(slot, ports[0], ports[1]);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, release_main, &r), 0);
    for (int i = 0; i < 80 && !atomic_load(&r.done); i++)
        tu_sleep_ms(100);
    int early = atomic_load(&r.done) ? atomic_load(&r.rc) : -1;
    migrate_end(slot, ports[1]);
    pthread_join(th, NULL);
    ck_assert_msg(early == -1, "the release returned while the slot migrated: %s",
                  dlock_err_name(early));
    ck_assert_msg(atomic_load(&r.rc) == DLOCK_OK, "release: %s", dlock_err_name(atomic_load(&r.rc)));
    redisReply *x = fx_cluster_raw(ports[1], "EXISTS %s", name);
    ck_assert_int_eq(x->integer, 0);
    freeReplyObject(x);
    dlock_lock_free(r.l);
    dlock_client_close(c);
    free(url);
}

/* A wait forever of L, while its owner still owes a cancel the cluster
 * answers TRYAGAIN to, canceled once it is blocked: it returns
 * DLOCK_ECANCELED while the slot is still migrating (given 15 s, the op
 * timeout 60 s). */
static void canceled_wait_ends_while_its_cancel_is_owed(dlock_lock *l)
{
    int rc; /* a TRYAGAIN pause sent without the wait sleeps in clock_nanosleep */
    bool returned = tu_canceled_wait_returns(l, true, 0, 15000, &rc);
    ck_assert_msg(returned, "the canceled wait returned only when its budget for the owed "
                            "cancel ran out (%s)",
                  dlock_err_name(rc));
    ck_assert_msg(rc == DLOCK_ECANCELED, "%s", dlock_err_name(rc));
}

/* An acquire whose first attempt ran on the master but lost its reply
 * (sync=1: the connection killed while the reply waited for the paused
 * replica), and whose retry then met TRYAGAIN (the slot set migrating
 * meanwhile: the lock key is there, the canceled key is not) and never
 * got past it: CANCELED in that pause, it returns DLOCK_ECANCELED; else
 * its wait (WAIT_MS) runs out there, and it returns DLOCK_ETIMEDOUT (a
 * wait that ran out, since a174f07; the first attempt's lost reply is in
 * the message). Either way it owes the cancel of its requests, which the
 * keeper sends once the slot is stable again, so the name is free long
 * before the 10 min lease of the attempt that ran. Before, nothing was
 * owed (DLOCK_ECANCELED, or the TRYAGAIN's DLOCK_EUNAVAIL): the name
 * stayed held by nobody for the whole lease. */
enum after_the_cancel { NOTHING_MORE, WAIT_AGAIN };

static void retry_of_a_lost_acquire_ends_in_tryagain(bool canceled, int64_t wait_ms,
                                                     enum after_the_cancel then)
{
    int ports[8];
    char name[64];
    unsigned slot = slot_on_first_master(ports, "lostretry", name, sizeof name);
    /* WAIT_AGAIN: the simple layout, whose canceled wait owes no
     * writer's unwait: the next wait owes only the cancel */
    char *url = tu_fmt("%s?timeout=60s&lease=600s&sync=1&sync_timeout=60s%s", cl.url,
                       then == WAIT_AGAIN ? "&layout=simple" : "");
    dlock_client *c = tu_open(url);
    /* held by the handle: a wait in another thread owes what this one owed */
    dlock_lock *l = tu_lock_mode(c, name, DLOCK_EXCLUSIVE,
                                 then == WAIT_AGAIN ? DLOCK_LOCK_HANDLE_OWNED : 0);
    /* the map is known, the token key exists, every write so far is
     * acknowledged (a pooled connection's WAIT answers at once) */
    tu_acquire_release(l, DLOCK_TRY);
    struct fx_redis *replica = fx_cluster_server(&cl, fx_cluster_replica_of(&cl, ports[0]));
    ck_assert_ptr_nonnull(replica);
    tu_pause(replica->pid);
    dlock_cancel *k = NULL;
    ck_assert_int_eq(canceled ? dlock_cancel_new(&k) : DLOCK_OK, DLOCK_OK);
    struct tu_waiter w = {0};
    tu_waiter_start_ex(&w, l, canceled ? DLOCK_FOREVER : wait_ms, k, false);
    long long id = 0;
    for (int i = 0; i < 6000 && !(id = client_blocked_in_wait(ports[0])); i++)
        tu_sleep_ms(10);
    ck_assert_msg(id != 0, "the acquire never waited for the replica");
    redisReply *r = fx_cluster_raw(ports[0], "EXISTS %s", name);
    ck_assert_int_eq(r->integer, 1); /* it ran: the lock key is there */
    freeReplyObject(r);
    slot_migrating(slot, ports[0], ports[1]);
    long long before = errors_answered(ports[0], "TRYAGAIN");
    run_on(ports[0], "CLIENT KILL ID %lld", id); /* the reply is lost */
    if (canceled) {
        cancel_in_tryagain_pause(&w, ports[0], before);
        if (then == WAIT_AGAIN) {
            /* writes answered again: what holds the next wait is the
             * owed cancel's TRYAGAIN alone */
            kill(replica->pid, SIGCONT);
            canceled_wait_ends_while_its_cancel_is_owed(l);
        }
    } else {
        wait_tryagain(ports[0], before);
        int rc = tu_waiter_join(&w);
        ck_assert_msg(rc == DLOCK_ETIMEDOUT, "%s", dlock_err_name(rc));
    }
    kill(replica->pid, SIGCONT);
    run_on(ports[0], "CLUSTER SETSLOT %u STABLE", slot);
    run_on(ports[1], "CLUSTER SETSLOT %u STABLE", slot);
    char *other_url = tu_fmt("%s%s", cl.url, then == WAIT_AGAIN ? "?layout=simple" : "");
    dlock_client *other = tu_open(other_url); /* the layout of the name */
    free(other_url);
    dlock_lock *ol = tu_lock(other, name);
    int rc = DLOCK_EBUSY;
    for (int i = 0; i < 2000 && rc == DLOCK_EBUSY; i++) /* 20 s and more, the test's limit */
        if ((rc = dlock_acquire(ol, DLOCK_TRY)) == DLOCK_EBUSY)
            tu_sleep_ms(10);
    ck_assert_msg(rc == DLOCK_OK, "the name is still held (lease 10 min): %s: %s",
                  dlock_err_name(rc), dlock_errmsg());
    TU_RELEASE_OK(ol);
    dlock_lock_free(ol);
    dlock_client_close(other);
    dlock_cancel_free(k);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(url);
}

TU_TEST(canceled_retry_of_a_lost_acquire_owes_its_cancel, 150)
{
    retry_of_a_lost_acquire_ends_in_tryagain(true, DLOCK_FOREVER, NOTHING_MORE);
}

/* The same frame, then the owner's next wait while its cancel is still
 * owed (the slot still migrating: the cancel too meets TRYAGAIN, sent by
 * the keeper or by that wait first) is canceled once blocked: it must
 * return DLOCK_ECANCELED then, not after the 60 s op timeout. (The owed
 * cancel was sent, or waited for while the keeper sent it, without the
 * wait: neither the TRYAGAIN pauses nor the wait for the keeper saw its
 * cancel.) */
TU_TEST(canceled_wait_ends_while_its_cancel_meets_tryagain, 150)
{
    retry_of_a_lost_acquire_ends_in_tryagain(true, DLOCK_FOREVER, WAIT_AGAIN);
}

/* The wait outlasts the time it takes to see the first attempt wait
 * for the replica (about a round trip), by far. */
TU_TEST(timed_out_retry_of_a_lost_acquire_owes_its_cancel, 150)
{
    retry_of_a_lost_acquire_ends_in_tryagain(false, 15000, NOTHING_MORE);
}

/* ------------------------------------------------- a cluster over TLS */

/* Three masters serving TLS to clients, on the cluster bus and for
 * replication (tls-cluster), as `cl`: the helpers above keep looking
 * through the plain ports, the client under test uses rediss+cluster://
 * alone, so every connection it makes -- the first CLUSTER SLOTS, each
 * master's pool, a redirect's target, the sharded subscriber -- is TLS
 * with the URL's CA. */
static void start_tls_cluster(void)
{
    cl.tls = true;
    ck_assert_msg(fx_cluster_start(&cl, 3, 0), "the TLS cluster could not be started");
}

static void stop_tls_cluster(void)
{
    stop_cluster();
    cl.tls = false;
}

TU_CASE(tls, start_tls_cluster, stop_tls_cluster, TU_AROUND_EACH)

/* rediss+cluster://: a name on each master taken and refused to another
 * client; then a held and waited-for lock's slot migrated: the renewal
 * follows ASK, a client with the old map follows MOVED (a TLS client is
 * redirected to the TLS port), the waiter subscribes on the new master,
 * and the hand-over works -- all over TLS. */
TU_TEST_IN(tls, redirects_followed_over_tls, 120)
{
    int ports[8];
    ck_assert_int_eq(masters(ports, 8), 3);
    ck_assert_msg(strncmp(cl.url, "rediss+cluster://", 17) == 0, "%s", cl.url);
    char *url = tu_fmt("%s&lease=6s", cl.url);
    dlock_client *a = tu_open(url), *c = tu_open(url);
    for (int i = 0; i < 3; i++) {
        char name[64];
        name_on(ports[i], "tls", name, sizeof name);
        dlock_lock *la = tu_lock(a, name), *lc = tu_lock(c, name);
        TU_ACQUIRE_OK(la, DLOCK_TRY);
        ck_assert_int_eq(dlock_acquire(lc, DLOCK_TRY), DLOCK_EBUSY);
        TU_RELEASE_OK(la);
        TU_FREE_LOCKS(la, lc);
    }
    char name[64];
    name_on(ports[0], "tls-moved", name, sizeof name);
    unsigned slot = fx_cluster_keyslot(&cl, name);
    dlock_lock *l = tu_lock(c, name);
    struct tu_pair p;
    struct tu_waiter w;
    uint64_t first = hold_and_wait(&p, &w, url, name, ports[0]);
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_EBUSY); /* C knows the slot's master */
    migrate_start(slot, ports[0], ports[1]);
    wait_renewed(&p); /* through ASK */
    migrate_end(slot, ports[1]);
    wait_shardnumsub_at(ports[1], name, 1); /* the waiter followed the slot */
    ck_assert_int_eq(dlock_acquire(l, DLOCK_TRY), DLOCK_EBUSY); /* MOVED */
    hand_over(&p, &w, first);
    dlock_lock_free(l);
    TU_CLOSE_CLIENTS(a, c);
    tu_pair_close(&p);
    free(url);
}

/* ------------------------------------------ a cluster on another address */

/* Two masters listening on 127.0.0.2 alone, made by hand (the first
 * serves every slot), whose redirects name no host (cluster-preferred-
 * endpoint-type unknown-endpoint: "ASK <slot> :<port>", meaning the host
 * the client reached the answering node at). Not the fixture's cluster:
 * its nodes are on 127.0.0.1, where a wrong guess of that host works. */
#define FAR_HOST "127.0.0.2"

struct far_cluster {
    pid_t pid[2];
    int port[2];
    char *dir[2];
};

/* Whether the node on FAR_HOST:PORT says cluster_state:ok and knows N
 * nodes. */
static bool far_ok(int port, int n)
{
    struct timeval tv = {5, 0};
    redisContext *ctx = redisConnectWithTimeout(FAR_HOST, port, tv);
    redisReply *r = ctx && !ctx->err ? redisCommand(ctx, "CLUSTER INFO") : NULL;
    char known[64];
    snprintf(known, sizeof known, "cluster_known_nodes:%d\r", n);
    bool ok = r && r->str && strstr(r->str, "cluster_state:ok") && strstr(r->str, known);
    if (r)
        freeReplyObject(r);
    if (ctx)
        redisFree(ctx);
    return ok;
}

static void far_start(struct far_cluster *f)
{
    char port[2][16], bus[2][16];
    for (int i = 0; i < 2; i++) {
        f->dir[i] = tu_tmpdir("far");
        f->port[i] = tu_free_port();
        snprintf(port[i], sizeof port[i], "%d", f->port[i]);
        snprintf(bus[i], sizeof bus[i], "%d", tu_free_port());
        char *log = tu_fmt("%s/redis.log", f->dir[i]);
        const char *argv[] = {"redis-server", "--bind", FAR_HOST, "--port", port[i],
                              "--protected-mode", "no", "--save", "", "--appendonly", "no",
                              "--dir", f->dir[i], "--cluster-enabled", "yes",
                              "--cluster-config-file", "nodes.conf", "--cluster-port", bus[i],
                              "--cluster-node-timeout", "1000", "--cluster-announce-ip",
                              FAR_HOST, /* not the source address of its bus links */
                              "--cluster-preferred-endpoint-type", "unknown-endpoint", NULL};
        f->pid[i] = tu_spawn(argv, log);
        free(log);
        redisReply *r = NULL;
        for (int t = 0; t < 1000 && !r; t++) {
            redisContext *ctx = redisConnect(FAR_HOST, f->port[i]);
            r = ctx && !ctx->err ? redisCommand(ctx, "PING") : NULL;
            if (ctx)
                redisFree(ctx);
            if (!r)
                tu_sleep_ms(10);
        }
        ck_assert_msg(r != NULL, "redis-server on %s:%d never answered", FAR_HOST, f->port[i]);
        freeReplyObject(r);
    }
    run_at(FAR_HOST, f->port[0], "CLUSTER ADDSLOTSRANGE 0 16383");
    run_at(FAR_HOST, f->port[0], "CLUSTER MEET %s %d %s", FAR_HOST, f->port[1], bus[1]);
    bool ok = false;
    for (int t = 0; t < 3000 && !ok; t++) {
        ok = far_ok(f->port[0], 2) && far_ok(f->port[1], 2);
        if (!ok)
            tu_sleep_ms(10);
    }
    ck_assert_msg(ok, "the cluster on %s never became ok", FAR_HOST);
}

static void far_stop(struct far_cluster *f)
{
    for (int i = 0; i < 2; i++) {
        tu_stop(f->pid[i], 2000);
        tu_rmrf(f->dir[i]);
        free(f->dir[i]);
    }
}

TU_CASE(far, NULL, NULL, TU_AROUND_EACH)

/* A held lock's slot is being migrated (its keys moved to the second
 * node): the first node answers its renewal "ASK <slot> :<port>", and
 * the renewal is sent, after ASKING, to that port on the host the client
 * reached the first node at -- so the hold is renewed, never lost; once
 * the slot is the second node's, the release follows "MOVED <slot>
 * :<port>" there. Before, a host-less redirect went to 127.0.0.1, where
 * nothing listens: the renewal never got through. */
TU_TEST_IN(far, hostless_ask_goes_to_the_answering_nodes_host, 120)
{
    struct far_cluster f;
    far_start(&f);
    char *url = tu_fmt("redis+cluster://%s:%d?lease=6s", FAR_HOST, f.port[0]);
    struct tu_pair p = tu_pair_of(tu_open(url), tu_open(url), "far");
    tu_pair_watch_lost(&p);
    TU_ACQUIRE_OK(p.la, DLOCK_TRY);
    redisReply *r = must_at(FAR_HOST, f.port[0], "CLUSTER KEYSLOT far");
    long long slot = r->integer;
    freeReplyObject(r);
    char *from = node_id_at(FAR_HOST, f.port[0]), *to = node_id_at(FAR_HOST, f.port[1]);
    run_at(FAR_HOST, f.port[1], "CLUSTER SETSLOT %lld IMPORTING %s", slot, from);
    run_at(FAR_HOST, f.port[0], "CLUSTER SETSLOT %lld MIGRATING %s", slot, to);
    r = must_at(FAR_HOST, f.port[0], "CLUSTER GETKEYSINSLOT %lld 100", slot);
    ck_assert_int_gt(r->elements, 0);
    for (size_t i = 0; i < r->elements; i++)
        run_at(FAR_HOST, f.port[0], "MIGRATE %s %d %s 0 5000", FAR_HOST, f.port[1],
               r->element[i]->str);
    freeReplyObject(r);
    r = must_at(FAR_HOST, f.port[0], "CLUSTER COUNTKEYSINSLOT %lld", slot);
    ck_assert_int_eq(r->integer, 0); /* all moved: the next renewal is ASKed over */
    freeReplyObject(r);
    wait_renewed(&p);
    /* the slot is the second node's: the release is MOVED there (":<port>") */
    run_at(FAR_HOST, f.port[1], "CLUSTER SETSLOT %lld NODE %s", slot, to);
    run_at(FAR_HOST, f.port[0], "CLUSTER SETSLOT %lld NODE %s", slot, to);
    TU_RELEASE_OK(p.la);
    tu_pair_close(&p);
    free(from);
    free(to);
    free(url);
    far_stop(&f);
}

int main(void)
{
    return tu_main("cluster", start_cluster, stop_cluster);
}
