/* redis_suite.h -- what the Redis backend's test binaries share: the
 * server of the test (SRV) and its helpers, raw hiredis on the wire, and
 * the fault-injecting proxy. The suite is split by concern into
 * check_redis.c (basics, interoperability, scale, URLs),
 * check_redis_faults.c, check_redis_hostile.c (a misbehaving server),
 * check_redis_sentinel.c (TLS, replica sync, Sentinel) and
 * check_redis_cli.c; all of them are the Check suite "redis", so a
 * test's name is "redis/NAME" whichever binary runs it.
 *
 * Every test starts its own server (tests/lib/fixture_redis.c) on a free
 * loopback port and runs in its own process with a time limit. No test
 * asserts on time; waits are bounded only so a hang fails the test.
 *
 * Included by one .c file per binary; each uses a part of it, so unused
 * static helpers are not warned about here.
 */
#ifndef DLOCK_TEST_REDIS_SUITE_H
#define DLOCK_TEST_REDIS_SUITE_H

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

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

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
    if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS ||
        r->type == REDIS_REPLY_ERROR)
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

/* ------------------------------------------- shared by several binaries */

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
    const char *name;          /* the lock whose calls are played with */
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

struct waiter_arg {
    dlock_lock *l;
    int64_t wait_ms;
    int rc;
    uint64_t token;
    bool release;   /* release at once after acquiring */
    atomic_int *go; /* or: release once *go is set (holds are per thread) */
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

static long long numsub(redisContext *ctx, const char *chan)
{
    redisReply *r = cmd(ctx, "PUBSUB NUMSUB %s", chan);
    long long n = -1;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_INTEGER)
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

#pragma GCC diagnostic pop

#endif
