/* check_redlock.c -- redlock:// against real redis-servers: what a quorum
 * of independent masters adds to the single-node backend.
 *
 * The lock contract runs on three nodes in check_contract (fixture
 * "redlock"); here are the faults only several nodes have: a minority
 * down or stopped (the lock still works), a majority down (DLOCK_EUNAVAIL
 * at once) or stopped while held (the hold is lost), the fencing token
 * across acquisitions granted by different majorities, the condition
 * under which it only grows (a node that restarts from a stale snapshot
 * makes it go back; with appendfsync always it does not), the
 * node-redlock / redsync keys played on the wire, and elections over the
 * majority (the election contract runs on three nodes in check_election).
 */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dlock.h"
#include "fixture_redis.h"
#include "relay.h"
#include "testutil.h"

#define MAX_NODES 7

static struct fx_redis nodes[MAX_NODES];
static int nnodes;

/* ---------------------------------------------------------------- helpers */

/* Start N nodes with EXTRA server arguments (may be NULL). */
static void start_nodes(int n, const char *const *extra)
{
    nnodes = n;
    for (int i = 0; i < n; i++)
        ck_assert_msg(fx_redis_start(&nodes[i], extra), "redis-server %d could not be started", i);
}

static void stop_nodes(void)
{
    for (int i = 0; i < nnodes; i++) {
        if (nodes[i].pid > 0)
            kill(nodes[i].pid, SIGCONT);
        fx_redis_stop(&nodes[i]);
    }
}

/* redlock://every node?QUERY (caller frees). */
static char *rl_url(const char *query)
{
    char hosts[MAX_NODES * 24] = "";
    size_t len = 0;
    for (int i = 0; i < nnodes; i++)
        len += (size_t)snprintf(hosts + len, sizeof hosts - len, "%s127.0.0.1:%d", i ? "," : "",
                                nodes[i].port);
    return tu_fmt("redlock://%s%s%s", hosts, query && *query ? "?" : "", query ? query : "");
}

static dlock_client *rl_open(const char *query)
{
    char *url = rl_url(query);
    dlock_client *c = tu_open(url);
    free(url);
    return c;
}

/* One raw command on node I with FMT's arguments in AP; the reply
 * (caller frees). */
static redisReply *node_vcmd(int i, const char *fmt, va_list ap)
{
    redisContext *ctx = fx_redis_raw(&nodes[i], NULL);
    ck_assert_msg(ctx != NULL, "raw connection to node %d failed", i);
    redisReply *r = redisvCommand(ctx, fmt, ap);
    ck_assert_msg(r != NULL, "raw command '%s' on node %d failed: %s", fmt, i, ctx->errstr);
    redisFree(ctx);
    return r;
}

/* One raw command on node I; the reply (caller frees). */
static redisReply *node_cmd(int i, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = node_vcmd(i, fmt, ap);
    va_end(ap);
    return r;
}

/* The integer (or integer string) a raw command on node I answers; -1 for
 * nil. */
static long long node_int(int i, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = node_vcmd(i, fmt, ap);
    va_end(ap);
    long long v = r->type == REDIS_REPLY_INTEGER  ? r->integer
                  : r->type == REDIS_REPLY_STRING ? strtoll(r->str, NULL, 10)
                                                  : -1;
    freeReplyObject(r);
    return v;
}

static void node_signal(int i, int sig)
{
    ck_assert_int_eq(kill(nodes[i].pid, sig), 0);
}

/* A client of the nodes (options QUERY) with a handle on "job"
 * (tu_solo_close() ends it). */
static struct tu_solo job_client(const char *query)
{
    return tu_solo_open(rl_url(query), "job");
}

/* Three nodes and job_client(QUERY), its lost callback recorded in LOST;
 * job_close() closes it and stops the nodes. */
static struct tu_solo watched_job(const char *query, struct tu_lost *lost)
{
    start_nodes(3, NULL);
    struct tu_solo s = job_client(query);
    dlock_lock_on_lost(s.l, tu_on_lost, lost);
    return s;
}

static void job_close(struct tu_solo *s)
{
    tu_solo_close(s);
    stop_nodes();
}

/* Another client gets "job" within WAIT and gives it back: its token. */
static uint64_t next_owner_token(int64_t wait)
{
    struct tu_solo b = job_client("lease=1500ms&node_timeout=1s");
    TU_ACQUIRE_OK(b.l, wait);
    uint64_t t = tu_token(b.l);
    TU_RELEASE_OK(b.l);
    tu_solo_close(&b);
    return t;
}

/* ------------------------------------------------------------------ tests */

/* Two of five nodes down: the lock works on the other three, exclusion
 * included; the message of a failure would name the nodes. */
TU_TEST(minority_down_still_works, 60)
{
    start_nodes(5, NULL);
    dlock_client *a = rl_open("node_timeout=2s"), *b = rl_open("node_timeout=2s");
    fx_redis_kill(&nodes[1]);
    fx_redis_kill(&nodes[3]);
    dlock_lock *la = tu_lock(a, "job"), *lb = tu_lock(b, "job");
    TU_ACQUIRE_OK(la, DLOCK_TRY);
    int rc = dlock_acquire(lb, DLOCK_TRY);
    ck_assert_msg(rc == DLOCK_EBUSY, "second owner: %s: %s", dlock_err_name(rc), dlock_errmsg());
    dlock_info *info = NULL;
    ck_assert_int_eq(dlock_inspect(b, "job", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_held(info), 1);
    ck_assert_uint_eq(dlock_info_token(info), tu_token(la));
    dlock_info_free(info);
    ck_assert_int_eq(dlock_release(la), DLOCK_OK);
    TU_ACQUIRE_OK(lb, DLOCK_TRY);
    ck_assert_int_eq(dlock_release(lb), DLOCK_OK);
    TU_FREE_LOCKS(la, lb);
    TU_CLOSE_CLIENTS(a, b);
    stop_nodes();
}

/* dlock_check over Redlock: a token is current while a majority of the
 * nodes hold the name with it, also with 2 of 5 nodes down; once only 2
 * of the 3 answering still hold it (an operator's DEL on the third), it
 * is stale; with 2 of 5 answering nothing is known: an error naming the
 * count, never "stale". */
TU_TEST(check_needs_a_majority, 60)
{
    start_nodes(5, NULL);
    dlock_client *a = rl_open("node_timeout=1s"), *b = rl_open("node_timeout=1s");
    dlock_lock *l = tu_lock(a, "job");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    uint64_t t = tu_token(l);
    ck_assert_int_eq(dlock_check(b, "job", t), DLOCK_OK);
    fx_redis_kill(&nodes[3]);
    fx_redis_kill(&nodes[4]);
    int rc = dlock_check(b, "job", t);
    ck_assert_msg(rc == DLOCK_OK, "3 of 5 hold it: %s: %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_int_eq(node_int(0, "DEL job"), 1);
    rc = dlock_check(b, "job", t);
    ck_assert_msg(rc == DLOCK_ELOST, "2 of 5 hold it: %s: %s", dlock_err_name(rc), dlock_errmsg());
    fx_redis_kill(&nodes[2]);
    rc = dlock_check(b, "job", t);
    ck_assert_msg(rc != DLOCK_OK && rc != DLOCK_ELOST &&
                      strstr(dlock_errmsg(), "only 2 of 5 nodes answered, 3 needed"),
                  "2 of 5 answer: %s: %s", dlock_err_name(rc), dlock_errmsg());
    dlock_release(l); /* lost or unreachable: either way given up */
    TU_FREE_LOCKS(l);
    TU_CLOSE_CLIENTS(a, b);
    stop_nodes();
}

/* A black-holed port: a socket listening with a backlog of 0 whose queue
 * is filled by connections nobody accepts, so the kernel drops further
 * SYNs and a connect to *PORT hangs until its timeout, as to a host
 * behind a firewall that drops. Returns the listening socket (the fillers
 * stay open with it, leaked for the test's life). */
static int black_hole(int *port)
{
    int fd = tu_listen_loopback(port, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)*port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    /* fill the queue: until a connect no longer completes */
    for (int i = 0; i < 16; i++) {
        int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (connect(c, (struct sockaddr *)&a, sizeof a) == 0)
            continue;
        struct pollfd p = {.fd = c, .events = POLLOUT};
        if (poll(&p, 1, 500) == 0)
            return fd; /* this one hangs: so will the client's */
    }
    ck_abort_msg("the listening socket's queue never filled");
    return fd;
}

/* A node whose port drops connects (black_hole), first in the URL: the
 * nodes are dialed at once, so the two others answer within the node
 * timeout and the acquire is granted by them. Dialed one after the
 * other, the black hole's connect took the whole node timeout and the
 * acquire failed (DLOCK_EUNAVAIL: its time was gone before the others
 * were asked). */
TU_TEST(black_holed_node_dialed_beside_the_others, 60)
{
    start_nodes(2, NULL);
    int hole_port;
    int hole = black_hole(&hole_port);
    char *url = tu_fmt("redlock://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d?node_timeout=1s",
                       hole_port, nodes[0].port, nodes[1].port);
    struct tu_solo s = tu_solo_open(url, "job");
    for (int round = 0; round < 3; round++) {
        int rc = dlock_acquire(s.l, DLOCK_TRY);
        ck_assert_msg(rc == DLOCK_OK, "acquire %d: %s: %s", round, dlock_err_name(rc),
                      dlock_errmsg());
        for (int i = 0; i < 2; i++) /* granted by both answering nodes */
            ck_assert_int_eq(node_int(i, "EXISTS job"), 1);
        TU_RELEASE_OK(s.l);
    }
    tu_solo_close(&s);
    close(hole);
    stop_nodes();
}

/* A node named by a name whose name server never answers, first in the
 * URL: the names are resolved side by side with the other nodes' dials,
 * so the two others answer within the node timeout and grant the lock.
 * Resolved before the others were dialed, the name took the whole node
 * timeout and left the others none (the open or the acquire failed). */
TU_TEST(unresolved_node_name_resolved_beside_the_others, 60)
{
    int ns = tu_silent_name_server(); /* before the nodes: they live in its namespace */
    start_nodes(2, NULL);
    char *url = tu_fmt("redlock://slow.invalid:6379,127.0.0.1:%d,127.0.0.1:%d?node_timeout=1s",
                       nodes[0].port, nodes[1].port);
    dlock_client *c = NULL;
    int rc = dlock_open(url, &c);
    ck_assert_msg(rc == DLOCK_OK, "open: %s: %s", dlock_err_name(rc), dlock_errmsg());
    dlock_lock *l = tu_lock(c, "job");
    for (int round = 0; round < 3; round++) {
        rc = dlock_acquire(l, DLOCK_TRY);
        ck_assert_msg(rc == DLOCK_OK, "acquire %d: %s: %s", round, dlock_err_name(rc),
                      dlock_errmsg());
        for (int i = 0; i < 2; i++) /* granted by both answering nodes */
            ck_assert_int_eq(node_int(i, "EXISTS job"), 1);
        TU_RELEASE_OK(l);
    }
    TU_FREE_LOCKS(l);
    TU_CLOSE_CLIENTS(c);
    free(url);
    stop_nodes();
    close(ns);
}

/* Two of three nodes down: an acquire fails with DLOCK_EUNAVAIL at its
 * first attempt (a bounded wait does not wait it out), naming how many
 * answered; the CLI exits 69; a client opened then fails to connect. */
TU_TEST(majority_down_unavailable, 60)
{
    start_nodes(3, NULL);
    dlock_client *c = rl_open("node_timeout=500ms");
    fx_redis_kill(&nodes[0]);
    fx_redis_kill(&nodes[2]);
    dlock_lock *l = tu_lock(c, "job");
    int rc = dlock_acquire(l, 60000);
    ck_assert_msg(rc == DLOCK_EUNAVAIL, "acquire: %s: %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_msg(strstr(dlock_errmsg(), "only 1 of 3 nodes answered, 2 needed"), "message: %s",
                  dlock_errmsg());
    dlock_lock_free(l);
    dlock_client_close(c);

    char *url = rl_url("node_timeout=500ms");
    char *out = NULL, *err = NULL;
    const char *args[] = {"-u", url, "run", "-w", "60", "job", "true", NULL};
    rc = tu_dlock(&out, &err, NULL, args);
    ck_assert_msg(rc == 69 || rc == 75, "dlock run exit %d: %s", rc, err);
    free(out);
    free(err);
    dlock_client *d = NULL;
    rc = dlock_open(url, &d);
    ck_assert_msg(rc == DLOCK_ECONN && !d, "open: %s: %s", dlock_err_name(rc), dlock_errmsg());
    free(url);
    stop_nodes();
}

/* A node stopped (SIGSTOP) while the lock is acquired and held past its
 * lease: the acquire, the renewals and the release answer from the other
 * two, renewals keep the hold valid, nothing is lost (the cancel owed to
 * the stopped node holds the keeper at most a node timeout, a third of
 * the lease here); once the node resumes its copy has expired and the
 * lock goes on. */
TU_TEST(node_stopped_during_acquire_and_hold, 60)
{
    struct tu_lost lost = {0};
    struct tu_solo a = watched_job("lease=3s&node_timeout=1s", &lost);
    node_signal(1, SIGSTOP);
    TU_ACQUIRE_OK(a.l, DLOCK_TRY);
    /* past two leases, renewed by the other two nodes */
    ck_assert_msg(!tu_wait_lost(&lost, 1, 6500), "lost: %s", lost.why);
    ck_assert_msg(dlock_validity_ms(a.l) > 0, "validity %lld", (long long)dlock_validity_ms(a.l));
    node_signal(1, SIGCONT);
    uint64_t first = tu_token(a.l);
    ck_assert_int_eq(dlock_release(a.l), DLOCK_OK);
    ck_assert_int_eq(atomic_load(&lost.fired), 0);
    ck_assert_uint_gt(next_owner_token(DLOCK_TRY), first);
    job_close(&a);
}

/* A majority stopped while the lock is held: no renewal reaches Q nodes,
 * the hold is declared lost at its validity deadline (the callback once),
 * and its release does not say DLOCK_OK; resumed, the nodes let a new
 * owner in. */
TU_TEST(majority_stopped_while_held_is_lost, 60)
{
    struct tu_lost lost = {0};
    struct tu_solo a = watched_job("lease=1500ms&node_timeout=300ms", &lost);
    TU_ACQUIRE_OK(a.l, DLOCK_TRY);
    node_signal(0, SIGSTOP);
    node_signal(2, SIGSTOP);
    ck_assert_msg(tu_wait_lost(&lost, 1, 30000), "the hold was never declared lost");
    ck_assert_int_eq(dlock_validity_ms(a.l), 0);
    node_signal(0, SIGCONT);
    node_signal(2, SIGCONT);
    int rc = dlock_release(a.l);
    ck_assert_msg(rc != DLOCK_OK, "release of a lost hold: %s", dlock_err_name(rc));
    next_owner_token(20000);
    tu_solo_close(&a);
    ck_assert_int_eq(atomic_load(&lost.fired), 1);
    stop_nodes();
}

/* Acquisitions granted by different majorities (a different node stopped
 * each time) get growing tokens even though the nodes' counters started
 * apart: the granting nodes below the token are raised to it. The node
 * timeout is 30 s: each acquire and release answers once the majority has
 * (the stopped node gets a short grace), or this test would outlive its
 * time limit. */
TU_TEST(tokens_grow_across_majorities, 60)
{
    start_nodes(3, NULL);
    /* counters far apart, the highest on node 2 */
    for (int i = 0; i < 3; i++)
        freeReplyObject(
            node_cmd(i, "SET redisson_lock_token:{job} %lld", 2000000000000000LL + 1000 * i));
    dlock_client *c = rl_open("lease=5s&node_timeout=30s");
    uint64_t last = tu_take_token(c, "job");
    ck_assert_uint_eq(last, 2000000000002001ULL);
    for (int round = 0; round < 6; round++) {
        int down = (2 + round) % 3; /* node 2 first: the one with the highest counter */
        node_signal(down, SIGSTOP);
        uint64_t t = tu_take_token(c, "job");
        node_signal(down, SIGCONT);
        ck_assert_msg(t > last, "round %d (node %d stopped): token %llu after %llu", round, down,
                      (unsigned long long)t, (unsigned long long)last);
        last = t;
    }
    dlock_client_close(c);
    stop_nodes();
}

/* The condition of the token, both sides, with the same sequence: the
 * counters agree at T0; node 0 saves a snapshot; node 2 is stopped while
 * three acquisitions by {0, 1} take the token to T0 + 3; node 0 crashes
 * and restarts; node 1 is stopped and {0, 2} grant the next acquisition.
 * Node 0 restarted from the snapshot (RDB only) lost its increments and
 * node 2 never saw them (at most the first request, delivered late): the
 * token goes back (the documented failure).
 * With appendonly yes + appendfsync always node 0 keeps its counter and
 * the token grows. */
static void token_after_restart(bool fsync_always)
{
    const char *aof[] = {"--appendonly", "yes", "--appendfsync", "always", NULL};
    start_nodes(3, fsync_always ? aof : NULL);
    dlock_client *c = rl_open("lease=5s&node_timeout=30s");
    uint64_t t0 = tu_take_token(c, "job");
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(node_int(i, "GET redisson_lock_token:{job}"), (long long)t0);
    freeReplyObject(node_cmd(0, "SAVE"));
    node_signal(2, SIGSTOP);
    uint64_t last = t0;
    for (int k = 0; k < 3; k++)
        last = tu_take_token(c, "job");
    ck_assert_uint_eq(last, t0 + 3);
    ck_assert(fx_redis_restart(&nodes[0]));
    node_signal(2, SIGCONT);
    node_signal(1, SIGSTOP);
    uint64_t next = tu_take_token(c, "job");
    node_signal(1, SIGCONT);
    if (fsync_always)
        ck_assert_msg(next > last, "with appendfsync always: token %llu after %llu",
                      (unsigned long long)next, (unsigned long long)last);
    else
        ck_assert_msg(next <= last,
                      "restarted from a stale snapshot: token %llu after %llu (T0 %llu); the "
                      "documented regression did not show",
                      (unsigned long long)next, (unsigned long long)last, (unsigned long long)t0);
    dlock_client_close(c);
    stop_nodes();
}

TU_TEST(token_regresses_without_persistence, 60)
{
    token_after_restart(false);
}

TU_TEST(token_grows_with_appendfsync_always, 60)
{
    token_after_restart(true);
}

/* node-redlock's scripts and redsync's commands, played on the nodes,
 * against dlock with layout=simple on the same names. */
static const char NODE_REDLOCK_ACQUIRE[] =
    "for i, key in ipairs(KEYS) do if redis.call('exists', key) == 1 then return 0 end end "
    "for i, key in ipairs(KEYS) do redis.call('set', key, ARGV[1], 'PX', ARGV[2]) end "
    "return #KEYS";
static const char NODE_REDLOCK_RELEASE[] =
    "local count = 0 for i, key in ipairs(KEYS) do if redis.call('get', key) == ARGV[1] then "
    "redis.pcall('del', key) count = count + 1 end end return count";

TU_TEST(redlock_simple_interop, 60)
{
    start_nodes(3, NULL);
    dlock_client *c = rl_open("layout=simple&node_timeout=2s&lease=5s");
    dlock_lock *l = tu_lock(c, "resource");
    const char *value = "0123456789abcdef0123456789abcdef"; /* node-redlock: 16 random bytes, hex */

    /* node-redlock holds it on a majority: dlock is busy */
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(node_int(i, "EVAL %s 1 resource %s 10000", NODE_REDLOCK_ACQUIRE, value),
                         1);
    int rc = dlock_acquire(l, DLOCK_TRY);
    ck_assert_msg(rc == DLOCK_EBUSY, "over node-redlock's lock: %s: %s", dlock_err_name(rc),
                  dlock_errmsg());
    /* nothing of dlock's is left on the free node */
    ck_assert_int_eq(node_int(2, "EXISTS resource"), 0);
    /* node-redlock releases: a dlock waiter gets in */
    struct tu_waiter w = {0};
    tu_waiter_start(&w, l, 20000);
    ck_assert(tu_wait_thread_asleep(&w.tid, 10000));
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(node_int(i, "EVAL %s 1 resource %s", NODE_REDLOCK_RELEASE, value), 1);
    ck_assert_int_eq(tu_waiter_join(&w), DLOCK_OK);
    TU_ACQUIRE_OK(l, DLOCK_TRY);

    /* dlock holds it: node-redlock's acquire and redsync's SET NX fail
     * on every node; their release scripts leave dlock's key alone */
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(node_int(i, "EVAL %s 1 resource %s 10000", NODE_REDLOCK_ACQUIRE, value),
                         0);
        redisReply *r = node_cmd(i, "SET resource redsyncvalue== NX PX 8000");
        ck_assert_int_eq(r->type, REDIS_REPLY_NIL);
        freeReplyObject(r);
        ck_assert_int_eq(node_int(i, "EVAL %s 1 resource %s", NODE_REDLOCK_RELEASE, value), 0);
        ck_assert_int_eq(node_int(i, "EXISTS resource"), 1);
    }
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(node_int(i, "EXISTS resource"), 0);

    /* a redsync lock on one node only (a minority): dlock takes the others */
    redisReply *r = node_cmd(0, "SET resource redsyncvalue== NX PX 8000");
    ck_assert_int_eq(r->type, REDIS_REPLY_STATUS);
    freeReplyObject(r);
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    dlock_client_close(c);
    stop_nodes();
}

/* An election on three nodes: A (a client with QUERY) campaigns for
 * "boss" with VALUE through E, B (another) looks at it. */
struct boss_election {
    dlock_client *a, *b;
    dlock_election *e;
};

static struct boss_election boss_campaign(const char *query, const char *value)
{
    start_nodes(3, NULL);
    struct boss_election x = {rl_open(query), rl_open(query), NULL};
    ck_assert_int_eq(dlock_election_new(x.a, "boss", 0, &x.e), DLOCK_OK);
    ck_assert_int_eq(dlock_election_campaign(x.e, value, DLOCK_TRY, NULL), DLOCK_OK);
    return x;
}

static void boss_election_end(struct boss_election *x)
{
    dlock_election_free(x->e);
    TU_CLOSE_CLIENTS(x->a, x->b);
    stop_nodes();
}

/* The leader of "boss" as B sees it, asserting that the look worked. */
static dlock_leader *boss_seen_by(dlock_client *b)
{
    dlock_leader *l = NULL;
    int rc = dlock_election_leader(b, "boss", &l);
    ck_assert_msg(rc == DLOCK_OK, "%s: %s", dlock_err_name(rc), dlock_errmsg());
    return l;
}

/* The leader election over the majority: a value proclaimed while one
 * node was stopped (so that node keeps the old one) is what observers
 * read, whichever majority answers them -- every majority meets the one
 * the proclaim wrote; with one node down the election goes on (proclaim,
 * observe); with two down a proclaim and a look fail DLOCK_EUNAVAIL,
 * naming the nodes that answered, rather than report a stale leader. */
TU_TEST(election_over_the_majority, 90)
{
    struct boss_election x = boss_campaign("node_timeout=1s", "v1");
    dlock_client *b = x.b;
    dlock_election *e = x.e;
    uint64_t token = 0;
    ck_assert_int_eq(dlock_election_token(e, &token), DLOCK_OK);
    /* Node 2 keeps v1: writes paused there, the proclaim's connection
     * to it times out and its command is dropped unserved. */
    redisReply *r = node_cmd(2, "CLIENT PAUSE 60000 WRITE");
    freeReplyObject(r);
    ck_assert_int_eq(dlock_election_proclaim(e, "v2"), DLOCK_OK);
    freeReplyObject(node_cmd(2, "CLIENT UNPAUSE"));
    r = node_cmd(2, "HGET dlock_leader:{boss} value");
    ck_assert_msg(r->type == REDIS_REPLY_STRING && strcmp(r->str, "v1") == 0,
                  "node 2 took v2 after all");
    freeReplyObject(r);
    for (int stopped = -1; stopped < 3; stopped++) { /* every majority, then all three */
        if (stopped >= 0)
            node_signal(stopped, SIGSTOP);
        dlock_leader *l = NULL;
        int rc = dlock_election_leader(b, "boss", &l);
        if (stopped >= 0)
            node_signal(stopped, SIGCONT);
        ck_assert_msg(rc == DLOCK_OK, "node %d stopped: %s: %s", stopped, dlock_err_name(rc),
                      dlock_errmsg());
        ck_assert_int_eq(dlock_leader_held(l), 1);
        ck_assert_str_eq(dlock_leader_value(l), "v2");
        ck_assert_uint_eq(dlock_leader_token(l), token);
        dlock_leader_free(l);
    }
    /* Now node 1 misses v3: node 1 has v1 v2, node 2 has v1 v3, node 0
     * all three. Read through nodes 1 and 2 alone, v3 is the newer one
     * (the leader numbers its writes; counted by each node, both would
     * be that node's second write). */
    freeReplyObject(node_cmd(1, "CLIENT PAUSE 60000 WRITE"));
    ck_assert_int_eq(dlock_election_proclaim(e, "v3"), DLOCK_OK);
    freeReplyObject(node_cmd(1, "CLIENT UNPAUSE"));
    node_signal(0, SIGSTOP);
    dlock_leader *l = NULL;
    int rc = dlock_election_leader(b, "boss", &l);
    node_signal(0, SIGCONT);
    ck_assert_msg(rc == DLOCK_OK, "%s: %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_str_eq(dlock_leader_value(l), "v3");
    dlock_leader_free(l);
    fx_redis_kill(&nodes[0]); /* a minority down: the election goes on */
    ck_assert_int_eq(dlock_election_proclaim(e, "v4"), DLOCK_OK);
    l = boss_seen_by(b);
    ck_assert_str_eq(dlock_leader_value(l), "v4");
    dlock_leader_free(l);
    fx_redis_kill(&nodes[1]); /* a majority down */
    rc = dlock_election_proclaim(e, "v5");
    ck_assert_msg(rc == DLOCK_EUNAVAIL && strstr(dlock_errmsg(), "1 of 3"), "%s: %s",
                  dlock_err_name(rc), dlock_errmsg());
    l = NULL;
    rc = dlock_election_leader(b, "boss", &l);
    ck_assert_msg(rc == DLOCK_EUNAVAIL && strstr(dlock_errmsg(), "1 of 3 nodes answered"), "%s: %s",
                  dlock_err_name(rc), dlock_errmsg());
    ck_assert_ptr_null(l);
    boss_election_end(&x);
}

/* The leader numbers its writes, and the numbers keep growing from one
 * leadership to the next, as every counter dlock keeps on Redis: they
 * began at 1 at every campaign, so a reader that kept a version saw the
 * same number again for another leader's value (version 1 after 2). */
TU_TEST(election_versions_keep_growing, 60)
{
    struct boss_election x = boss_campaign(NULL, "v1");
    ck_assert_int_eq(dlock_election_proclaim(x.e, "v2"), DLOCK_OK);
    dlock_leader *l = boss_seen_by(x.b);
    ck_assert_str_eq(dlock_leader_value(l), "v2");
    uint64_t before = dlock_leader_version(l);
    dlock_leader_free(l);
    ck_assert_int_eq(dlock_election_resign(x.e), DLOCK_OK);
    dlock_election *e = NULL;
    ck_assert_int_eq(dlock_election_new(x.b, "boss", 0, &e), DLOCK_OK);
    ck_assert_int_eq(dlock_election_campaign(e, "w1", 10000, NULL), DLOCK_OK);
    l = boss_seen_by(x.a);
    ck_assert_str_eq(dlock_leader_value(l), "w1");
    ck_assert_msg(dlock_leader_version(l) > before, "version %llu after %llu",
                  (unsigned long long)dlock_leader_version(l), (unsigned long long)before);
    dlock_leader_free(l);
    ck_assert_int_eq(dlock_election_resign(e), DLOCK_OK);
    dlock_election_free(e);
    boss_election_end(&x);
}

/* The same election in the simple layout, where each node's lock value
 * carries that node's own token ("<owner>:<token>", and the nodes' tokens
 * differ): the nodes still agree on one leader. */
TU_TEST(election_simple_layout, 60)
{
    struct boss_election x = boss_campaign("layout=simple", "s1");
    dlock_leader *l = boss_seen_by(x.b);
    ck_assert_int_eq(dlock_leader_held(l), 1);
    ck_assert_str_eq(dlock_leader_value(l), "s1");
    dlock_leader_free(l);
    ck_assert_int_eq(dlock_election_resign(x.e), DLOCK_OK);
    l = boss_seen_by(x.b);
    ck_assert_int_eq(dlock_leader_held(l), 0);
    dlock_leader_free(l);
    boss_election_end(&x);
}

/* ------------------------------------------------------- shared holds */

/* The readers' timeout keys ({name}:<owner>:rwlock_timeout:1) node I has. */
static long long node_reader_keys(int i, const char *name)
{
    redisReply *r = node_cmd(i, "KEYS {%s}:*:rwlock_timeout:*", name);
    long long n = r->type == REDIS_REPLY_ARRAY ? (long long)r->elements : -1;
    freeReplyObject(r);
    return n;
}

/* A try of L is refused (DLOCK_EBUSY): WHO for the message. */
static void expect_busy(dlock_lock *l, const char *who)
{
    int rc = dlock_acquire(l, DLOCK_TRY);
    ck_assert_msg(rc == DLOCK_EBUSY, "%s: %s: %s", who, dlock_err_name(rc), dlock_errmsg());
}

/* Two readers and a writer of "job", each its own client (options
 * QUERY, may be NULL) on the nodes started. */
struct readers {
    dlock_client *a, *b, *c;
    dlock_lock *ra, *rb, *wc;
};

static struct readers readers_open(const char *query)
{
    struct readers r = {rl_open(query), rl_open(query), rl_open(NULL), NULL, NULL, NULL};
    r.ra = tu_lock_mode(r.a, "job", DLOCK_SHARED, 0);
    r.rb = tu_lock_mode(r.b, "job", DLOCK_SHARED, 0);
    r.wc = tu_lock(r.c, "job");
    return r;
}

static void readers_close(struct readers *r)
{
    TU_FREE_LOCKS(r->ra, r->rb, r->wc);
    TU_CLOSE_CLIENTS(r->a, r->b, r->c);
    stop_nodes();
}

/* Readers on a majority share the lock: two readers in at once, each
 * with a token from the majority (the later greater), a writer refused
 * while either reads, and a reader refused while the writer writes; the
 * readers' leases are renewed on the nodes (their timeout keys live past
 * the lease); inspect says shared. Was DLOCK_ENOTSUP. */
TU_TEST(readers_share_writer_excluded, 60)
{
    start_nodes(3, NULL);
    struct readers r = readers_open("lease=1500ms&node_timeout=2s");
    dlock_lock *ra = r.ra, *rb = r.rb, *wc = r.wc;
    TU_ACQUIRE_OK(ra, DLOCK_TRY);
    TU_ACQUIRE_OK(rb, DLOCK_TRY);
    uint64_t reader_token = tu_token(rb);
    ck_assert_uint_gt(reader_token, tu_token(ra));
    expect_busy(wc, "writer beside readers");
    dlock_info *info = NULL;
    ck_assert_int_eq(dlock_inspect(r.c, "job", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_held(info), 1);
    ck_assert_int_eq(dlock_info_mode(info), DLOCK_SHARED);
    dlock_info_free(info);
    /* past two leases: the keeper renewed each reader's timeout key */
    tu_sleep_ms(3000);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(node_reader_keys(i, "job"), 2);
    TU_RELEASE_OK(ra);
    expect_busy(wc, "writer beside a reader");
    /* a waiting writer is woken by the last reader's release */
    struct tu_waiter w = {0};
    tu_waiter_start(&w, wc, 20000);
    ck_assert(tu_wait_thread_asleep(&w.tid, 10000));
    TU_RELEASE_OK(rb);
    ck_assert_int_eq(tu_waiter_join(&w), DLOCK_OK); /* it released once in */
    ck_assert_uint_gt(w.token, reader_token);
    TU_ACQUIRE_OK(wc, DLOCK_TRY);
    expect_busy(ra, "reader beside the writer");
    TU_RELEASE_OK(wc);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(node_int(i, "EXISTS job"), 0);
    readers_close(&r);
}

/* One of three nodes down: readers still share on the two others, a
 * writer is still refused, and gets in once they left. */
TU_TEST(readers_with_minority_down, 60)
{
    start_nodes(3, NULL);
    struct readers r = readers_open("node_timeout=2s");
    fx_redis_kill(&nodes[2]);
    TU_ACQUIRE_OK(r.ra, DLOCK_TRY);
    TU_ACQUIRE_OK(r.rb, DLOCK_TRY);
    expect_busy(r.wc, "writer beside readers");
    TU_RELEASE_OK(r.ra);
    TU_RELEASE_OK(r.rb);
    tu_acquire_release(r.wc, DLOCK_TRY);
    readers_close(&r);
}

/* layout=simple (one owner per key) has no shared mode, on Redlock as on
 * one node: DLOCK_ENOTSUP naming the layout. */
TU_TEST(readers_need_the_redisson_layout, 60)
{
    start_nodes(3, NULL);
    dlock_client *a = rl_open("layout=simple&node_timeout=2s");
    dlock_lock *ra = tu_lock_mode(a, "job", DLOCK_SHARED, 0);
    int rc = dlock_acquire(ra, DLOCK_TRY);
    ck_assert_msg(rc == DLOCK_ENOTSUP && strstr(dlock_errmsg(), "layout=simple"), "%s: %s",
                  dlock_err_name(rc), dlock_errmsg());
    dlock_lock_free(ra);
    dlock_client_close(a);
    stop_nodes();
}

/* No semaphores on Redlock, and the message says why: permits counted
 * per node over majorities let three holders share two permits. */
TU_TEST(semaphores_refused_with_the_reason, 60)
{
    start_nodes(3, NULL);
    dlock_client *c = rl_open("node_timeout=2s");
    dlock_semaphore *sem = NULL;
    int rc = dlock_semaphore_new(c, "pool", 2, 0, &sem);
    ck_assert_msg(rc == DLOCK_ENOTSUP && sem == NULL, "%s: %s", dlock_err_name(rc), dlock_errmsg());
    ck_assert_msg(strstr(dlock_errmsg(), "majorities") && strstr(dlock_errmsg(), "{a,c}"), "%s",
                  dlock_errmsg());
    dlock_client_close(c);
    stop_nodes();
}

/* No lock values on Redlock, and the message says why (no one request
 * checks a majority), for the write as for the read. */
TU_TEST(values_refused_with_the_reason, 60)
{
    start_nodes(3, NULL);
    dlock_client *c = rl_open("node_timeout=2s");
    dlock_lock *l = tu_lock(c, "val");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    int rc = dlock_value_set(l, "x", 1);
    ck_assert_msg(rc == DLOCK_ENOTSUP && strstr(dlock_errmsg(), "majority of nodes"), "%s: %s",
                  dlock_err_name(rc), dlock_errmsg());
    size_t len = 0;
    rc = dlock_value_get(c, "val", NULL, &len, NULL);
    ck_assert_msg(rc == DLOCK_ENOTSUP && strstr(dlock_errmsg(), "majority of nodes"), "%s: %s",
                  dlock_err_name(rc), dlock_errmsg());
    TU_RELEASE_OK(l);
    dlock_lock_free(l);
    dlock_client_close(c);
    stop_nodes();
}

/* dlock bench on redlock:// measures, in the same rounds, the raw floor
 * of the same work without dlock: hiredis on every node at once, on the
 * first alone, and answering at a majority, and prints dlock's ratio
 * beside the floor's (docs/benchmarks.md); the floors leave no key
 * behind, the late replies of the majority floor included. (A smoke run:
 * the figures go to the docs.) */
TU_TEST(bench_prints_the_raw_floor, 60)
{
    start_nodes(3, NULL);
    char *url = rl_url(NULL), *out = NULL, *err = NULL;
    int code = TU_DLOCK(&out, &err, NULL, "-u", url, "bench", "uncontended", "-d", "0.2", "-t", "1",
                        "-m", "4");
    ck_assert_msg(code == 0, "exit %d: %s%s", code, out, err);
    ck_assert_msg(strstr(out, "floor 0: ") && strstr(out, "floor 1: ") &&
                      strstr(out, "floor 2: ") && strstr(out, "p50 ratio, same work"),
                  "%s", out);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(node_int(i, "EXISTS dlock-bench:floor:0 dlock-bench:floor:1 "
                                     "dlock-bench:floor:2 dlock-bench:floor:3"),
                         0);
    free(out);
    free(err);
    free(url);
    stop_nodes();
}

/* dlock bench async on a backend whose waits do not park (redlock):
 * exit 69 with the library's DLOCK_ENOTSUP message, which names the
 * backend, and no blocked-thread side started. */
TU_TEST(bench_async_refused_naming_the_backend, 60)
{
    start_nodes(3, NULL);
    char *url = rl_url(NULL), *out = NULL, *err = NULL;
    int code = TU_DLOCK(&out, &err, NULL, "-u", url, "bench", "async", "-W", "3");
    ck_assert_msg(code == 69, "exit %d: %s%s", code, out, err);
    ck_assert_msg(strstr(err, "bench async (async side): ") && strstr(err, "redlock") &&
                      strstr(err, "cannot park"),
                  "%s", err);
    ck_assert_msg(!strstr(out, "blocking"), "%s", out);
    free(out);
    free(err);
    free(url);
    stop_nodes();
}

/* Until no node records a writer waiting for "job" (false after 30 s). */
static bool no_writer_waits(void)
{
    for (int t = 0; t < 3000; t++) {
        long long waiting = 0;
        for (int i = 0; i < nnodes; i++)
            waiting += node_int(i, "ZCARD dlock_writers:{job}");
        if (waiting == 0)
            return true;
        tu_sleep_ms(10);
    }
    return false;
}

/* Whether the thread *TID is parked in its wait (a condition variable's
 * futex, not a request's poll) in ten reads in a row, within 30 s. */
static bool thread_parked(const atomic_long *tid)
{
    char *path = tu_fmt("/proc/self/task/%ld/wchan", (long)*tid);
    int seen = 0;
    for (int t = 0; t < 3000 && seen < 10; t++) {
        char *wchan = tu_read_file(path);
        seen = wchan && strstr(wchan, "futex") ? seen + 1 : 0;
        free(wchan);
        tu_sleep_ms(10);
    }
    free(path);
    return seen == 10;
}

/* Until every node has a subscriber on CHANNEL (false after 30 s). */
static bool subscribed_everywhere(const char *channel)
{
    for (int t = 0; t < 3000; t++) {
        int on = 0;
        for (int i = 0; i < nnodes; i++) {
            redisReply *r = node_cmd(i, "PUBSUB NUMSUB %s", channel);
            on += r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
                  r->element[1]->type == REDIS_REPLY_INTEGER && r->element[1]->integer > 0;
            freeReplyObject(r);
        }
        if (on == nnodes)
            return true;
        tu_sleep_ms(10);
    }
    return false;
}

/* A writer's wait that ends while nodes are stopped (SIGSTOP) returns at
 * its end, not when the nodes answer: the writer that gives up takes its
 * waiting record (dlock_writers:{job}, which keeps new readers out) off
 * every node within what is left of the wait -- nothing after a timeout
 * (one node stopped) or a cancel (two: no majority either) -- and owes it
 * to the keeper, which sends it to each node once it answers. */
static void writer_gives_up_with_nodes_stopped(bool cancel)
{
    start_nodes(3, NULL);
    struct tu_solo a = job_client("lease=60s&node_timeout=120s");
    TU_ACQUIRE_OK(a.l, DLOCK_TRY);
    struct tu_solo b = job_client("lease=60s&node_timeout=120s");
    int stopped = cancel ? 2 : 1, rc;
    char msg[512] = "";
    if (cancel) {
        struct tu_waiter w;
        tu_waiter_start(&w, b.l, DLOCK_FOREVER);
        /* parked until the holder's lease: every subscription confirmed
         * (each wakes it for one more try), no try under way */
        ck_assert(subscribed_everywhere("redisson_lock__channel:{job}"));
        ck_assert(subscribed_everywhere("redisson_rwlock:{job}"));
        ck_assert_msg(thread_parked(&w.tid), "the writer never parked");
        ck_assert_int_eq(node_int(0, "ZCARD dlock_writers:{job}"), 1);
        for (int i = 1; i <= stopped; i++)
            node_signal(i, SIGSTOP);
        ck_assert_int_eq(dlock_lock_cancel(b.l), DLOCK_OK);
        rc = tu_waiter_join(&w);
    } else {
        node_signal(1, SIGSTOP);
        rc = dlock_acquire(b.l, 1500);
        snprintf(msg, sizeof msg, "%s", dlock_errmsg());
    }
    for (int i = 1; i <= stopped; i++)
        node_signal(i, SIGCONT);
    ck_assert_msg(rc == (cancel ? DLOCK_ECANCELED : DLOCK_ETIMEDOUT), "%s: %s", dlock_err_name(rc),
                  msg);
    ck_assert_msg(no_writer_waits(), "the keeper never took the waiting record off every node");
    TU_RELEASE_OK(a.l);
    TU_ACQUIRE_OK(b.l, DLOCK_TRY);
    TU_RELEASE_OK(b.l);
    tu_solo_close(&b);
    job_close(&a);
}

/* (The record was taken off with no deadline, waiting for every node for
 * the node timeout, here 120 s: the test's own limit ended it first.) */
TU_TEST(wait_ends_on_time_with_a_node_stopped, 60)
{
    writer_gives_up_with_nodes_stopped(false);
}

/* (A canceled wait forever sent it within the node timeout, and waited
 * for a majority: past the test's limit with two nodes stopped.) */
TU_TEST(canceled_wait_ends_with_nodes_stopped, 60)
{
    writer_gives_up_with_nodes_stopped(true);
}

/* With one node stopped, a campaign, a proclaim and an observer's look
 * end once a majority answered (the stopped node gets the grace, as every
 * request's other nodes do), not at the node timeout (120 s: the test's
 * limit ends it first). The value was written waiting for every node, so
 * a campaign's wait (here 1.5 s) and every proclaim lasted the node
 * timeout; a look waited for every node too, so an observer saw a change
 * only at the node timeout or the end of its wait. */
TU_TEST(election_goes_on_with_a_node_stopped, 60)
{
    start_nodes(3, NULL);
    dlock_client *a = rl_open("node_timeout=120s"), *b = rl_open("node_timeout=120s");
    dlock_election *e = NULL;
    ck_assert_int_eq(dlock_election_new(a, "boss", 0, &e), DLOCK_OK);
    node_signal(2, SIGSTOP);
    int rc = dlock_election_campaign(e, "v1", 1500, NULL);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", dlock_errmsg());
    int prc = rc ? rc : dlock_election_proclaim(e, "v2");
    dlock_leader *l = NULL;
    int lrc = prc ? prc : dlock_election_leader(b, "boss", &l);
    snprintf(msg, sizeof msg, "%s", dlock_errmsg());
    node_signal(2, SIGCONT);
    ck_assert_msg(rc == DLOCK_OK, "campaign: %s", dlock_err_name(rc));
    ck_assert_msg(prc == DLOCK_OK, "proclaim: %s", dlock_err_name(prc));
    ck_assert_msg(lrc == DLOCK_OK, "leader: %s: %s", dlock_err_name(lrc), msg);
    ck_assert_str_eq(dlock_leader_value(l), "v2");
    dlock_leader_free(l);
    ck_assert_int_eq(dlock_election_resign(e), DLOCK_OK);
    dlock_election_free(e);
    TU_CLOSE_CLIENTS(a, b);
    stop_nodes();
}

/* Every node stops answering right after a campaign's acquire: the
 * leader's value write, held at a relay in front of each node (node
 * timeout 120 s), ends with the campaign's wait (1.5 s), not at the node
 * timeout, and the campaign gives the lock back within that wait, owing
 * the nodes that did not answer the cancel of its requests: once they
 * answer again, another client leads. */
TU_TEST(campaign_ends_on_time_with_nodes_stopped_after_the_acquire, 60)
{
    start_nodes(3, NULL);
    struct tu_relay relay[3];
    char hosts[3 * 24] = "";
    size_t len = 0;
    for (int i = 0; i < 3; i++) {
        tu_relay_start(&relay[i], nodes[i].port, TU_RELAY_PASS);
        len += (size_t)snprintf(hosts + len, sizeof hosts - len, "%s127.0.0.1:%d", i ? "," : "",
                                relay[i].port);
    }
    char *url = tu_fmt("redlock://%s?node_timeout=120s&lease=5s", hosts);
    dlock_client *a = tu_open(url);
    dlock_lock *l = NULL;
    ck_assert_int_eq(dlock_lock_new_campaign(a, "boss", "v1", 0, &l), DLOCK_OK);
    for (int i = 0; i < 3; i++) /* the write names the leader hash; the acquire does not */
        tu_relay_hold_at(&relay[i], "dlock_leader:");
    struct tu_waiter w;
    tu_waiter_start_ex(&w, l, 1500, NULL, false);
    bool done = tu_waiter_wait_done(&w, 20000);
    for (int i = 0; i < 3; i++)
        tu_relay_set(&relay[i], TU_RELAY_PASS);
    ck_assert_msg(done, "the campaign still writing its value to nodes that do not answer");
    int rc = tu_waiter_join(&w);
    ck_assert_msg(rc != DLOCK_OK, "a campaign whose value no node took leads");
    dlock_client *b = rl_open(NULL);
    dlock_election *e = NULL;
    ck_assert_int_eq(dlock_election_new(b, "boss", 0, &e), DLOCK_OK);
    rc = dlock_election_campaign(e, "v2", 30000, NULL);
    ck_assert_msg(rc == DLOCK_OK, "campaign after: %s: %s", dlock_err_name(rc), dlock_errmsg());
    dlock_leader *seen = boss_seen_by(b);
    ck_assert_str_eq(dlock_leader_value(seen), "v2");
    dlock_leader_free(seen);
    dlock_election_free(e);
    dlock_lock_free(l);
    TU_CLOSE_CLIENTS(a, b);
    for (int i = 0; i < 3; i++)
        tu_relay_stop(&relay[i]);
    free(url);
    stop_nodes();
}

/* Three of seven nodes stopped: the acquire they never answered leaves
 * the owner a cancel owed to each, which must reach a node before the
 * owner's next acquire there. The next acquires, each within a 700 ms
 * wait, are granted by the four others, which answer first: the owing
 * nodes sit them out (their cancels are the keeper's). Before, each
 * owing node held every attempt up to 250 ms for its cancel, one after
 * another, so the wait was spent before the acquire was sent
 * (DLOCK_EUNAVAIL, "the deadline passed"). Once the nodes are continued
 * their cancels go through and they are asked again: an acquire is
 * granted by all seven. */
TU_TEST(owed_cancels_do_not_hold_the_majority, 60)
{
    start_nodes(7, NULL);
    struct tu_solo s = job_client("timeout=1s");
    tu_acquire_release(s.l, DLOCK_TRY); /* a pooled connection to every node */
    for (int i = 4; i < 7; i++)
        node_signal(i, SIGSTOP);
    TU_ACQUIRE_OK(s.l, DLOCK_TRY); /* written to 4-6, never answered: a cancel owed to each */
    TU_RELEASE_OK(s.l);
    for (int round = 0; round < 3; round++) {
        int rc = dlock_acquire(s.l, 700);
        ck_assert_msg(rc == DLOCK_OK, "acquire %d with three owing nodes stopped: %s: %s", round,
                      dlock_err_name(rc), dlock_errmsg());
        for (int i = 0; i < 4; i++)
            ck_assert_int_eq(node_int(i, "EXISTS job"), 1);
        TU_RELEASE_OK(s.l);
    }
    for (int i = 4; i < 7; i++)
        node_signal(i, SIGCONT);
    bool everywhere = false;
    for (int round = 0; round < 800 && !everywhere; round++) {
        TU_ACQUIRE_OK(s.l, DLOCK_TRY);
        everywhere = true;
        for (int i = 4; i < 7; i++)
            everywhere &= node_int(i, "EXISTS job") == 1;
        TU_RELEASE_OK(s.l);
        if (!everywhere)
            tu_sleep_ms(25);
    }
    ck_assert_msg(everywhere, "the continued nodes were never asked again");
    job_close(&s);
}

/* The sha of the script node I ran (its slow log logs every command)
 * by EVALSHA with NKEYS keys (NULL: any number), the K-th of them (from
 * 0) KEY. */
static char *sha_from_slowlog(int i, const char *nkeys, size_t k, const char *key)
{
    redisReply *r = node_cmd(i, "SLOWLOG GET -1");
    char *sha = NULL;
    for (size_t e = 0; r->type == REDIS_REPLY_ARRAY && e < r->elements && !sha; e++) {
        const redisReply *argv = r->element[e]->element[3];
        if (argv->elements > 3 + k && strcmp(argv->element[0]->str, "EVALSHA") == 0 &&
            (!nkeys || strcmp(argv->element[2]->str, nkeys) == 0) &&
            strcmp(argv->element[3 + k]->str, key) == 0)
            sha = strdup(argv->element[1]->str);
    }
    freeReplyObject(r);
    ck_assert_msg(sha != NULL, "node %d ran no script of %s keys with '%s'", i, nkeys, key);
    return sha;
}

/* The sha of the counter raise (scripts/redlock_raise.lua) node I ran: its
 * keys are the token key, the lock and a reader's timeout key, its
 * arguments the token, the owner and the token the node gave. */
static char *raise_sha_from_slowlog(int i)
{
    return sha_from_slowlog(i, "3", 0, "redisson_lock_token:{job}");
}

/* Another client's raise of the token counter (the second round of an
 * acquire whose majority came back with different tokens,
 * redlock_raise.lua) reaches two of the three nodes late, after that client gave
 * its grants back and this one took the name there: it must not push the
 * counters past this hold's token, or the release, which frees our field
 * only while the counter holds our token (release_redisson.lua), does
 * nothing there (DLOCK_ELOST, the name held until the lease ends). Played
 * by the library's own raise script (node 0's counter set ahead, so our
 * acquire raises nodes 1 and 2 and they cache it), sent again with the
 * other client's owner field. */
TU_TEST(late_raise_of_another_client_spares_our_release, 60)
{
    start_nodes(3, NULL);
    freeReplyObject(node_cmd(0, "SET redisson_lock_token:{job} 4000000000000000"));
    for (int i = 1; i < 3; i++)
        freeReplyObject(node_cmd(i, "CONFIG SET slowlog-log-slower-than 0"));
    struct tu_solo s = job_client("lease=60s");
    TU_ACQUIRE_OK(s.l, DLOCK_TRY);
    uint64_t t = tu_token(s.l);
    for (int i = 1; i < 3; i++) {
        char *sha = raise_sha_from_slowlog(i);
        freeReplyObject(node_cmd(i, "EVALSHA %s 3 redisson_lock_token:{job} job %s %llu %s %llu",
                                 sha, "{job}:another-client-uuid:1:rwlock_timeout:1",
                                 (unsigned long long)t + 1000, "another-client-uuid:1",
                                 (unsigned long long)t - 1));
        free(sha);
    }
    int rc = dlock_release(s.l);
    ck_assert_msg(rc == DLOCK_OK, "release after a late raise: %s: %s", dlock_err_name(rc),
                  dlock_errmsg());
    for (int i = 0; i < 3; i++)
        ck_assert_msg(node_int(i, "EXISTS job") == 0, "node %d still has the lock", i);
    job_close(&s);
}

/* A client of the three nodes with a handle on "job" (S) whose requests
 * to node 2 go through RELAY, which can keep one of them back: a call to
 * that node whose reply never came (its call timed out) and which lands
 * late, the node answering the others meanwhile. */
struct late_node {
    struct tu_relay relay;
    struct tu_solo s;
    char *sha; /* the script of the call kept */
};

static void late_node_start(struct late_node *f)
{
    start_nodes(3, NULL);
    tu_relay_start(&f->relay, nodes[2].port, TU_RELAY_PASS);
    f->s = tu_solo_open(tu_fmt("redlock://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d"
                               "?lease=60s&node_timeout=2s",
                               nodes[0].port, nodes[1].port, f->relay.port),
                        "job");
    f->sha = NULL;
    freeReplyObject(node_cmd(2, "CONFIG SET slowlog-log-slower-than 0"));
}

/* Keep the next call of script SHA (taken over) to node 2 back. */
static void late_node_keep(struct late_node *f, char *sha)
{
    f->sha = sha;
    tu_relay_keep_at(&f->relay, sha);
}

/* The call kept (a WHAT) lands on node 2 now, and is served. */
static void late_node_land(struct late_node *f, const char *what)
{
    ck_assert_msg(atomic_load(&f->relay.kept) == 1, "the %s never reached node 2's relay", what);
    tu_relay_let_kept(&f->relay);
    ck_assert_msg(tu_relay_wait_served(&f->relay, 20000), "the kept %s was never served", what);
}

/* Every hold given back: the name must be free on every node. Ends F. */
static void late_node_end(struct late_node *f)
{
    for (int i = 0; i < 3; i++)
        ck_assert_msg(node_int(i, "EXISTS job") == 0, "node %d still has the lock", i);
    free(f->sha);
    tu_relay_stop(&f->relay);
    job_close(&f->s);
}

/* Our own raise of node 2's counter for one hold reaches the node late
 * (its call timed out, the request kept at a relay in front of the node),
 * after that hold was given back and we took the name again: nodes 0 and
 * 1 agreed on the later hold's token, so node 2 was not raised for it and
 * its counter holds what it gave that hold, below the old raise. The old
 * raise must leave it so, or the later release, which frees our field
 * only while the counter holds our token there, misses on node 2 and the
 * name stays held there until the lease ends. */
TU_TEST(late_raise_of_our_earlier_hold_spares_our_release, 60)
{
    struct late_node f;
    late_node_start(&f);
    /* node 0's counter ahead: nodes 1 and 2 are raised (and cache the raise) */
    freeReplyObject(node_cmd(0, "SET redisson_lock_token:{job} 4000000000000000"));
    tu_acquire_release(f.s.l, DLOCK_TRY);
    freeReplyObject(node_cmd(0, "SET redisson_lock_token:{job} 8000000000000000"));
    late_node_keep(&f, raise_sha_from_slowlog(2));
    TU_ACQUIRE_OK(f.s.l, DLOCK_TRY); /* node 2's raise kept: its call times out */
    TU_RELEASE_OK(f.s.l);
    TU_ACQUIRE_OK(f.s.l, DLOCK_TRY); /* nodes 0 and 1 agree: no raise */
    late_node_land(&f, "raise");
    TU_RELEASE_OK(f.s.l);
    late_node_end(&f);
}

/* A reader's release reaches node 2 late (kept at the relay in front of
 * it until the call timed out; the release is done on the other two),
 * after the same owner took the name again as a reader there (its
 * leftover field taken anew): it must leave that later read hold on node
 * 2 alone, as a late release on one server does
 * (late_shared_release_spares_a_later_hold in check_redis_faults). */
TU_TEST(late_shared_release_spares_a_later_read_hold, 60)
{
    struct late_node f;
    late_node_start(&f);
    dlock_lock *r = tu_lock_mode(f.s.c, "job", DLOCK_SHARED, 0);
    tu_acquire_release(r, DLOCK_TRY);
    TU_ACQUIRE_OK(r, DLOCK_TRY);
    /* rw_release_read.lua: lock, channel, read-write channel, timeout base */
    late_node_keep(&f, sha_from_slowlog(2, "4", 2, "redisson_rwlock:{job}"));
    TU_RELEASE_OK(r); /* node 2's copy kept: its call times out */
    TU_ACQUIRE_OK(r, DLOCK_TRY);
    late_node_land(&f, "release");
    for (int i = 0; i < 3; i++)
        ck_assert_msg(node_int(i, "EXISTS job") == 1, "node %d lost the later read hold", i);
    TU_RELEASE_OK(r);
    dlock_lock_free(r);
    late_node_end(&f);
}

/* A downgrade (the last write level released, a read level kept)
 * reaches node 2 late (kept at the relay until its call timed out; done
 * on the other two), after the owner gave the name back and took it
 * again exclusively there: it must leave that later hold exclusive on
 * node 2 ("mode" "write"), or readers could come in there beside it. */
TU_TEST(late_downgrade_spares_a_later_exclusive_hold, 60)
{
    struct late_node f;
    late_node_start(&f);
    dlock_lock *r = tu_lock_mode(f.s.c, "job", DLOCK_SHARED, 0);
    for (int round = 0; round < 2; round++) {
        TU_ACQUIRE_OK(f.s.l, DLOCK_TRY);
        TU_ACQUIRE_OK(r, DLOCK_TRY);
        if (round == 1) /* rw_downgrade.lua: lock, read-write channel, ... */
            late_node_keep(&f, sha_from_slowlog(2, NULL, 1, "redisson_rwlock:{job}"));
        TU_RELEASE_OK(f.s.l); /* the last write level: a downgrade */
        TU_RELEASE_OK(r);
    }
    TU_ACQUIRE_OK(f.s.l, DLOCK_TRY);
    late_node_land(&f, "downgrade");
    redisReply *mode = node_cmd(2, "HGET job mode");
    ck_assert_msg(mode->type == REDIS_REPLY_STRING && strcmp(mode->str, "write") == 0,
                  "a late downgrade of an earlier hold made the later exclusive hold '%s' on "
                  "node 2",
                  mode->type == REDIS_REPLY_STRING ? mode->str : "(gone)");
    freeReplyObject(mode);
    TU_RELEASE_OK(f.s.l);
    dlock_lock_free(r);
    late_node_end(&f);
}

int main(void)
{
    return tu_main("redlock", NULL, stop_nodes);
}
