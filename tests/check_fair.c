/* check_fair.c -- the fair Redis layout (?layout=fair, src/backends/redis/
 * fair.c): waiters served in arrival order across processes, a waiter
 * killed while queued skipped once its queue lease runs out, a hand-off
 * that costs the new owner no request (counted by the server), no
 * starvation among 8 clients, and the queue script's give-up race.
 *
 * Every test starts its own redis-server; the order and the queue are
 * read from the server (the queue's length, INFO commandstats), so each
 * step waits on a condition, never on a fixed sleep.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <signal.h>
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

static struct fx_redis srv;

/* A server for this test, and its URL with the fair layout and QUERY. */
static char *start_fair(const char *query)
{
    ck_assert_msg(fx_redis_start(&srv, NULL), "redis-server could not be started");
    return tu_fmt("%s?layout=fair%s%s", srv.url, query ? "&" : "", query ? query : "");
}

static redisContext *raw(void)
{
    redisContext *ctx = fx_redis_raw(&srv, NULL);
    ck_assert_msg(ctx != NULL, "raw connection to port %d failed", srv.port);
    return ctx;
}

/* The end of a test on the server: the raw connection CTX closed, URL
 * (the start_fair() one; may be NULL) freed, the server stopped. */
static void stop_fair(redisContext *ctx, char *url)
{
    redisFree(ctx);
    free(url);
    fx_redis_stop(&srv);
}

/* The integer reply of a raw command (-1 for nil), asserting one came. */
static long long raw_int(redisContext *ctx, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(ctx, fmt, ap);
    va_end(ap);
    ck_assert_msg(r != NULL, "raw command '%s' failed: %s", fmt, ctx->errstr);
    ck_assert_msg(r->type == REDIS_REPLY_INTEGER || r->type == REDIS_REPLY_NIL,
                  "raw command '%s': reply type %d (%s)", fmt, r->type, r->str ? r->str : "");
    long long v = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    return v;
}

/* Waiters queued on lock NAME now. */
static long long queued(redisContext *ctx, const char *name)
{
    return raw_int(ctx, "ZCARD dlock_fair_queue:{%s}", name);
}

/* Wait until WANT waiters are queued on NAME (a minute at most). */
static void wait_queued(redisContext *ctx, const char *name, long long want)
{
    for (int i = 0; i < 6000 && queued(ctx, name) != want; i++)
        tu_sleep_ms(10);
    ck_assert_msg(queued(ctx, name) == want, "%lld waiters queued on '%s', not %lld",
                  queued(ctx, name), name, want);
}

/* Wait until N clients' grant channels are subscribed (a minute at most). */
static void wait_grant_channels(redisContext *ctx, size_t n)
{
    size_t subscribed = 0;
    for (int i = 0; i < 6000 && subscribed < n; i++) {
        redisReply *r = redisCommand(ctx, "PUBSUB CHANNELS dlock_fair__channel:*");
        subscribed = r && r->type == REDIS_REPLY_ARRAY ? r->elements : 0;
        freeReplyObject(r);
        if (subscribed < n)
            tu_sleep_ms(10);
    }
    ck_assert_int_eq(subscribed, n);
}

/* Script calls the server ran so far (EVALSHA and EVAL). */
static long long script_calls(redisContext *ctx)
{
    long long n = redis_info_script_calls(ctx);
    ck_assert_msg(n >= 0, "INFO commandstats: %s", ctx->errstr);
    return n;
}

/* `dlock -u URL run -w 60 NAME -- sh -c 'echo TAG $DLOCK_TOKEN >> FILE'`
 * in the background: a process that queues for NAME, writes down that it
 * got it, and releases. */
static pid_t spawn_taker(const char *url, const char *name, const char *tag, const char *file)
{
    char *script = tu_fmt("echo %s $DLOCK_TOKEN >> %s", tag, file);
    const char *argv[] = {tu_dlock_bin(), "-u", url, "run", "-w", "60", name, "--", "sh", "-c",
                          script, NULL};
    pid_t pid = tu_spawn(argv, NULL);
    free(script);
    ck_assert_msg(pid > 0, "cannot start %s", tu_dlock_bin());
    return pid;
}

/* ============================================================ the tests */

/* A test where processes queue for a lock a client of ours holds: the
 * server (fair layout, QUERY), the holder's handle on NAME taken, a raw
 * connection, and a file the takers write to. */
struct takers {
    char *url, *dir, *file;
    dlock_client *c;
    dlock_lock *l;
    redisContext *ctx;
};

static struct takers takers_begin(const char *query, const char *name)
{
    struct takers t = {.url = start_fair(query), .dir = tu_tmpdir("fair")};
    t.file = tu_fmt("%s/got", t.dir);
    t.c = tu_open(t.url);
    t.l = tu_lock(t.c, name);
    TU_ACQUIRE_OK(t.l, DLOCK_TRY);
    t.ctx = raw();
    return t;
}

static void takers_end(struct takers *t)
{
    TU_FREE_LOCKS(t->l);
    TU_CLOSE_CLIENTS(t->c);
    tu_rmrf(t->dir);
    free(t->file);
    free(t->dir);
    stop_fair(t->ctx, t->url);
}

/* A taker TAG (spawn_taker) queued for NAME, seen by the server as the
 * waiter that makes NTH of them. */
static pid_t queue_taker(struct takers *t, const char *name, const char *tag, long long nth)
{
    pid_t pid = spawn_taker(t->url, name, tag, t->file);
    wait_queued(t->ctx, name, nth);
    return pid;
}

/* 8 processes queue one after the other (each seen queued by the server
 * before the next starts; inspect lists them); one release hands the
 * lock down the queue in that order, tokens growing. */
TU_TEST(order_of_arrival_across_processes, 120)
{
    enum { P = 8 };
    struct takers t = takers_begin(NULL, "q");
    uint64_t last = tu_token(t.l);
    pid_t pid[P];
    for (int i = 0; i < P; i++) {
        char tag[8];
        snprintf(tag, sizeof tag, "p%d", i);
        pid[i] = queue_taker(&t, "q", tag, i + 1);
    }
    /* inspect shows the queue, first to last (the CLI's owners) */
    dlock_info *info = NULL;
    ck_assert_int_eq(dlock_inspect(t.c, "q", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_waiter_count(info), P);
    for (int i = 0; i < P; i++)
        ck_assert_ptr_nonnull(strchr(dlock_info_waiter(info, (size_t)i), ':'));
    dlock_info_free(info);
    TU_RELEASE_OK(t.l);
    for (int i = 0; i < P; i++) {
        int status = tu_wait_exit(pid[i]);
        ck_assert_msg(status == 0, "taker %d: exit status %d", i, status);
    }
    char *order = tu_read_file(t.file);
    ck_assert_ptr_nonnull(order);
    const char *p = order;
    for (int i = 0; i < P; i++) {
        int who = -1, n = 0;
        unsigned long long token = 0;
        ck_assert_msg(sscanf(p, "p%d %llu\n%n", &who, &token, &n) == 2, "order file: %s", order);
        ck_assert_msg(who == i, "grant %d went to p%d, not p%d (order: %s)", i, who, i, order);
        ck_assert_msg(token > last, "p%d's token %llu is not above %llu", i, token,
                      (unsigned long long)last);
        last = token;
        p += n;
    }
    ck_assert_int_eq(queued(t.ctx, "q"), 0);
    free(order);
    takers_end(&t);
}

/* A waiter killed -9 while queued is dropped once its queue lease runs
 * out (the live waiter behind it, refreshing its own entry, drops it),
 * and the release then goes to the live waiter, not to the dead one. */
TU_TEST(killed_waiter_skipped_after_queue_lease, 120)
{
    struct takers t = takers_begin("queue_lease=1s", "k");
    pid_t dead = queue_taker(&t, "k", "dead", 1);
    pid_t live = queue_taker(&t, "k", "live", 2);
    kill(dead, SIGKILL);
    tu_wait_exit(dead);
    /* the live one's refresh drops the dead entry once its lease is out */
    wait_queued(t.ctx, "k", 1);
    TU_RELEASE_OK(t.l);
    int status = tu_wait_exit(live);
    ck_assert_msg(status == 0, "live taker: exit status %d", status);
    char *got = tu_read_file(t.file);
    ck_assert_msg(got && strncmp(got, "live ", 5) == 0 && !strstr(got, "dead"),
                  "the lock went to: %s", got ? got : "(nobody)");
    free(got);
    takers_end(&t);
}

/* A waiter killed -9 at the head of the queue and a release at once,
 * before its queue lease runs out: the lock is handed to the dead waiter,
 * but for its queue lease (3 s) only, not its hold lease (60 s), so the
 * live waiter behind it gets the lock within the queue lease and a
 * margin -- its wait, bounded so, is enough -- with the token after the
 * dead one's grant. */
TU_TEST(dead_waiter_handed_the_lock_blocks_only_its_queue_lease, 120)
{
    struct takers t = takers_begin("queue_lease=3s&lease=60s", "x");
    uint64_t t0 = tu_token(t.l);
    pid_t dead = queue_taker(&t, "x", "dead", 1);
    dlock_client *c = tu_open(t.url);
    dlock_lock *l = tu_lock(c, "x");
    struct tu_waiter w;
    tu_waiter_start_ex(&w, l, 3000 + 20000, NULL, false);
    wait_queued(t.ctx, "x", 2);
    kill(dead, SIGKILL);
    tu_wait_exit(dead);
    TU_RELEASE_OK(t.l);
    ck_assert_int_eq(tu_waiter_join(&w), DLOCK_OK);
    ck_assert_msg(w.token == t0 + 2, "the live waiter's token %llu is not the one after the dead "
                                     "waiter's grant (%llu + 2)",
                  (unsigned long long)w.token, (unsigned long long)t0);
    char *got = tu_read_file(t.file);
    ck_assert_msg(!got || !*got, "the dead waiter ran: %s", got);
    free(got);
    TU_FREE_LOCKS(l);
    TU_CLOSE_CLIENTS(c);
    takers_end(&t);
}

/* Wait until lock NAME, handed over for a queue lease of QUEUE_LEASE_MS,
 * expires later than that by the server's clock: its new owner extended
 * it to its lease (a minute at most). */
static void wait_extended(redisContext *ctx, const char *name, long long queue_lease_ms)
{
    long long pttl = 0;
    for (int i = 0; i < 6000 && (pttl = raw_int(ctx, "PTTL %s", name)) <= queue_lease_ms; i++)
        tu_sleep_ms(10);
    ck_assert_msg(pttl > queue_lease_ms,
                  "lock '%s' expires in %lld ms: not extended past the queue lease", name, pttl);
}

/* A live waiter handed the lock for its queue lease extends it to its
 * lease a third of the way in (its keeper renews, after the acquire
 * returned): held past the queue lease, by the server's clock, never
 * lost, and released as its own; a fixed lease (never renewed otherwise)
 * is extended that once too. */
TU_TEST(handed_over_lock_extended_to_its_lease, 60)
{
    struct takers t = takers_begin("queue_lease=1s&lease=60s", "e");
    dlock_client *c = tu_open(t.url);
    for (int fixed = 0; fixed < 2; fixed++) { /* 1: a fixed lease, extended once */
        if (fixed)
            TU_ACQUIRE_OK(t.l, DLOCK_TRY);
        dlock_lock *l = tu_lock_mode(c, "e", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED);
        if (fixed)
            ck_assert_int_eq(dlock_lock_set_lease(l, 60000, DLOCK_LEASE_FIXED), DLOCK_OK);
        struct tu_waiter w;
        tu_waiter_start_ex(&w, l, 60000, NULL, true);
        wait_queued(t.ctx, "e", 1);
        ck_assert(tu_wait_thread_asleep(&w.tid, 60000));
        TU_RELEASE_OK(t.l);
        ck_assert_int_eq(tu_waiter_join(&w), DLOCK_OK);
        wait_extended(t.ctx, "e", 1000);
        dlock_stats st = {.size = sizeof st};
        ck_assert_int_eq(dlock_client_stats(c, &st), DLOCK_OK);
        ck_assert_int_eq(st.losses, 0);
        TU_RELEASE_OK(l);
        TU_FREE_LOCKS(l);
    }
    TU_CLOSE_CLIENTS(c);
    takers_end(&t);
}

/* `dlock run --lost-grace 3s` handed a fair lock by a release (the default
 * 30 s lease, granted for the 5 s queue lease until its keeper extends
 * it): the grace is reckoned on the 30 s lease, so no warning that 3 s is
 * more than half the lease, and the command ends as it would. Before,
 * the grace came from the validity just after the hand-off (the queue
 * lease): --lost-grace 3s was cut to 2.5 s with that false warning, and
 * the default grace to 0.8 s. */
TU_TEST(run_on_a_handed_over_lock_reckons_its_grace_on_the_lease, 120)
{
    struct takers t = takers_begin(NULL, "g");
    char *go = tu_fmt("%s/go", t.dir), *log = tu_fmt("%s/log", t.dir);
    char *script = tu_fmt("until [ -e %s ]; do sleep 0.05; done", go);
    const char *argv[] = {tu_dlock_bin(), "-u", t.url, "run", "--lost-grace", "3", "-w", "60",
                          "g", "--", "sh", "-c", script, NULL};
    pid_t pid = tu_spawn(argv, log);
    ck_assert_msg(pid > 0, "cannot start %s", tu_dlock_bin());
    wait_queued(t.ctx, "g", 1);
    TU_RELEASE_OK(t.l); /* handed to dlock run for its queue lease */
    wait_extended(t.ctx, "g", 5000);
    tu_write_file(go, "");
    int status = tu_wait_exit(pid);
    char *out = tu_read_file(log);
    ck_assert_msg(status == 0, "dlock run: status %d\n%s", status, out);
    ck_assert_msg(!strstr(out, "more than half the lease"), "a false warning:\n%s", out);
    free(out);
    free(script);
    free(log);
    free(go);
    takers_end(&t);
}

/* Wait until the server has a subscriber on CHANNEL (a minute at most). */
static void wait_subscribed(redisContext *ctx, const char *channel)
{
    long long n = 0;
    for (int i = 0; i < 6000; i++) {
        redisReply *r = redisCommand(ctx, "PUBSUB NUMSUB %s", channel);
        n = r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 ? r->element[1]->integer : 0;
        freeReplyObject(r);
        if (n > 0)
            break;
        tu_sleep_ms(10);
    }
    ck_assert_msg(n > 0, "nobody subscribed to %s", channel);
}

/* A release that hands nothing on -- dlock_force_release (`dlock release
 * --force`), a release by a client of the default layout -- wakes the
 * fair waiter queued behind it through the lock's own channel: it takes
 * the lock with one try, the only script call after the release's. Its
 * refresh (a third of the 300 s queue lease) and the holder's lease
 * (300 s) are far past its wait of 30 s. */
TU_TEST(release_of_another_kind_wakes_the_fair_head, 120)
{
    ck_assert_msg(fx_redis_start(&srv, NULL), "redis-server could not be started");
    char *fair = tu_fmt("%s?layout=fair&lease=300s&queue_lease=300s", srv.url);
    char *plain = tu_fmt("%s?lease=300s", srv.url);
    dlock_client *a = tu_open(fair), *p = tu_open(plain), *b = tu_open(fair);
    dlock_lock *la = tu_lock(a, "f"), *lp = tu_lock(p, "f");
    dlock_lock *lb = tu_lock_mode(b, "f", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED);
    redisContext *ctx = raw();
    for (int round = 0; round < 2; round++) { /* 0: force release, 1: a plain client's */
        dlock_lock *holder = round == 0 ? la : lp;
        TU_ACQUIRE_OK(holder, DLOCK_TRY);
        struct tu_waiter w;
        tu_waiter_start_ex(&w, lb, 30000, NULL, true);
        wait_queued(ctx, "f", 1);
        wait_subscribed(ctx, "redisson_lock__channel:{f}");
        ck_assert(tu_wait_thread_asleep(&w.tid, 60000));
        long long before = script_calls(ctx);
        if (round == 0)
            ck_assert_int_eq(dlock_force_release(a, "f"), DLOCK_OK);
        else
            TU_RELEASE_OK(lp);
        ck_assert_msg(tu_waiter_join(&w) == DLOCK_OK, "round %d: the fair waiter did not get "
                                                       "the lock: %d", round, w.rc);
        long long calls = script_calls(ctx) - before;
        ck_assert_msg(calls == 2, "round %d: %lld script calls from the release on, not 2 (the "
                                  "release, the waiter's one try)", round, calls);
        TU_RELEASE_OK(lb);
        if (round == 0)
            ck_assert_int_eq(dlock_release(la), DLOCK_ELOST);
    }
    TU_FREE_LOCKS(la, lp, lb);
    TU_CLOSE_CLIENTS(a, p, b);
    free(plain);
    stop_fair(ctx, fair);
}

/* The deadline (server ms) in the queue record of NAME's waiter at
 * position NTH (0: the first), or -1. */
static long long queued_deadline(redisContext *ctx, const char *name, int nth)
{
    redisReply *q = redisCommand(ctx, "ZRANGE dlock_fair_queue:{%s} %d %d", name, nth, nth);
    long long deadline = -1;
    if (q && q->type == REDIS_REPLY_ARRAY && q->elements == 1) {
        redisReply *w = redisCommand(ctx, "HGET dlock_fair_waiters:{%s} %s", name,
                                     q->element[0]->str);
        if (w && w->type == REDIS_REPLY_STRING && w->str[0] == 'w')
            deadline = strtoll(w->str + 2, NULL, 10);
        freeReplyObject(w);
    }
    freeReplyObject(q);
    return deadline;
}

/* A live waiter keeps its place however long it waits: it refreshes its
 * queue entry (every third of the queue lease), so after several queue
 * leases it is still first, and gets the lock before the one behind it. */
TU_TEST(waiter_keeps_its_place_past_its_queue_lease, 120)
{
    struct takers t = takers_begin("queue_lease=600ms", "p");
    pid_t first = queue_taker(&t, "p", "first", 1);
    pid_t second = queue_taker(&t, "p", "second", 2);
    long long d0 = queued_deadline(t.ctx, "p", 0), d = d0;
    ck_assert_int_gt(d0, 0);
    /* three queue leases later, by the server's clock */
    for (int i = 0; i < 6000 && (d = queued_deadline(t.ctx, "p", 0)) < d0 + 3 * 600; i++)
        tu_sleep_ms(10);
    ck_assert_msg(d >= d0 + 3 * 600, "the first waiter's deadline went from %lld to %lld", d0, d);
    ck_assert_int_eq(queued(t.ctx, "p"), 2);
    TU_RELEASE_OK(t.l);
    ck_assert_int_eq(tu_wait_exit(first), 0);
    ck_assert_int_eq(tu_wait_exit(second), 0);
    char *got = tu_read_file(t.file);
    ck_assert_msg(got && strncmp(got, "first ", 6) == 0 && strstr(got, "\nsecond "),
                  "order: %s", got ? got : "(nobody)");
    free(got);
    takers_end(&t);
}

/* The hand-off counted by the server: with the waiter queued (its
 * client's grant channel already subscribed by an earlier wait), the
 * holder's release is the only script call until the waiter holds the
 * lock: it learned so from the grant message, with no acquire of its own.
 * The Redisson layout, for contrast, costs the woken waiter an acquire. */
static long long calls_per_handoff(const char *layout)
{
    ck_assert_msg(fx_redis_start(&srv, NULL), "redis-server could not be started");
    char *url = tu_fmt("%s?layout=%s&queue_lease=60s&lease=60s", srv.url, layout);
    if (strcmp(layout, "fair") != 0) {
        free(url);
        url = tu_fmt("%s?layout=%s&lease=60s", srv.url, layout);
    }
    dlock_client *a = tu_open(url), *b = tu_open(url);
    dlock_lock *la = tu_lock(a, "h"), *lb = tu_lock_mode(b, "h", DLOCK_EXCLUSIVE,
                                                         DLOCK_LOCK_HANDLE_OWNED);
    redisContext *ctx = raw();
    long long handoff = -1;
    for (int round = 0; round < 2; round++) { /* the first one warms b's subscription */
        TU_ACQUIRE_OK(la, DLOCK_TRY);
        struct tu_waiter w;
        tu_waiter_start_ex(&w, lb, 60000, NULL, true);
        if (strcmp(layout, "fair") == 0)
            wait_queued(ctx, "h", 1);
        /* asleep: no try of its own is under way */
        ck_assert(tu_wait_thread_asleep(&w.tid, 60000));
        long long before = script_calls(ctx);
        TU_RELEASE_OK(la);
        ck_assert_int_eq(tu_waiter_join(&w), DLOCK_OK);
        handoff = script_calls(ctx) - before - 1; /* the release's own call */
        TU_RELEASE_OK(lb);
    }
    TU_FREE_LOCKS(la, lb);
    TU_CLOSE_CLIENTS(a, b);
    stop_fair(ctx, url);
    return handoff;
}

TU_TEST(handoff_costs_the_new_owner_no_request, 120)
{
    long long fair = calls_per_handoff("fair");
    long long redisson = calls_per_handoff("redisson");
    fprintf(stderr, "handoff_costs_the_new_owner_no_request: script calls by the new owner "
                    "after the release: fair %lld, redisson %lld\n", fair, redisson);
    ck_assert_msg(fair == 0, "the new owner ran %lld scripts after the hand-off", fair);
    ck_assert_msg(redisson >= 1, "the Redisson layout's waiter ran %lld scripts", redisson);
}

/* The commands the server ran since its counters were reset, less the
 * scripts themselves, the counting (INFO, CONFIG) and the hub's
 * (UNSUBSCRIBE, SUBSCRIBE): what the scripts called inside; *TYPE and *CLOCK get the TYPE and TIME calls among them. */
static long long commands_inside_scripts(redisContext *ctx, long long *type, long long *clock)
{
    redisReply *r = redisCommand(ctx, "INFO commandstats");
    ck_assert_msg(r && r->type == REDIS_REPLY_STRING, "INFO commandstats: %s", ctx->errstr);
    long long total = 0;
    *type = *clock = 0;
    for (const char *p = strstr(r->str, "cmdstat_"); p; p = strstr(p + 1, "cmdstat_")) {
        const char *name = p + strlen("cmdstat_"), *calls = strstr(p, ":calls=");
        ck_assert(calls != NULL);
        size_t len = (size_t)(calls - name);
        long long n = strtoll(calls + strlen(":calls="), NULL, 10);
        if ((len == 7 && !strncmp(name, "evalsha", 7)) || (len == 4 && !strncmp(name, "eval", 4)) ||
            (len == 4 && !strncmp(name, "info", 4)) || !strncmp(name, "config", 6) ||
            (len >= 9 && !strncmp(name + len - 9, "subscribe", 9)))
            continue; /* (the hub's SUBSCRIBE at a client's first wait, sent on its own) */
        if (len == 4 && !strncmp(name, "type", 4))
            *type = n;
        if (len == 4 && !strncmp(name, "time", 4))
            *clock = n;
        total += n;
    }
    freeReplyObject(r);
    return total;
}

/* The calls inside the two scripts of PAIRS uncontended acquire+release
 * pairs on LAYOUT, asserting there were two scripts a pair; *TYPE and
 * *CLOCK as commands_inside_scripts() gives them. */
static long long pair_calls(const char *layout, int pairs, long long *type, long long *clock)
{
    ck_assert_msg(fx_redis_start(&srv, NULL), "redis-server could not be started");
    char *url = tu_fmt("%s?layout=%s", srv.url, layout);
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock(c, "u");
    redisContext *ctx = raw();
    tu_acquire_release(l, 5000); /* the client record, the scripts loaded */
    redisReply *r = redisCommand(ctx, "CONFIG RESETSTAT");
    ck_assert(r != NULL);
    freeReplyObject(r);
    for (int i = 0; i < pairs; i++)
        tu_acquire_release(l, 5000);
    long long inside = commands_inside_scripts(ctx, type, clock);
    long long scripts = script_calls(ctx);
    fprintf(stderr, "uncontended_pair_calls_little: %s: %d pairs: %lld scripts, %lld calls inside "
                    "(%lld TYPE, %lld TIME)\n", layout, pairs, scripts, inside, *type, *clock);
    ck_assert_msg(scripts == 2 * pairs, "%s: %lld scripts for %d pairs", layout, scripts, pairs);
    TU_FREE_LOCKS(l);
    TU_CLOSE_CLIENTS(c);
    stop_fair(ctx, url);
    return inside;
}

/* An uncontended acquire+release: two scripts, and inside them only what
 * a free lock (and, fair, an empty queue) needs (issue 28's row 1: each
 * call a script makes costs the server about a microsecond here, and a
 * pair ran 24 (fair), 10 (simple) and 16 (Redisson) where SET NX PX +
 * compare-and-delete runs 3). The fair layout reads no TYPE (the first
 * hash read says WRONGTYPE) and no TIME (the clock is read only when a
 * queue record needs it); no layout deletes a lock-delay marker its
 * acquire just found absent, nor (simple, default) looks for one at
 * the release of a client without a lock_delay (its holds arm none; a
 * fair release still passes it: a grant arms the next holder's). */
TU_TEST(uncontended_pair_calls_little, 90)
{
    enum { PAIRS = 20 };
    const struct {
        const char *layout;
        long long most; /* calls inside a pair's scripts */
    } layouts[] = {{"fair", 17}, {"simple", 8}, {"redisson", 14}};
    for (size_t i = 0; i < TU_COUNT(layouts); i++) {
        long long type, clock, inside = pair_calls(layouts[i].layout, PAIRS, &type, &clock);
        ck_assert_msg(type == 0 && clock == 0, "%s: %lld TYPE and %lld TIME calls in %d pairs",
                      layouts[i].layout, type, clock, PAIRS);
        ck_assert_msg(inside <= layouts[i].most * PAIRS,
                      "%s: %lld calls inside the scripts of %d pairs (%lld a pair at most)",
                      layouts[i].layout, inside, PAIRS, layouts[i].most);
    }
}

/* 8 clients, each taking the lock ROUNDS times; every holder waits, before
 * it releases, until every other client that has rounds left is queued.
 * Fair means strict turns then: the holders' sequence repeats with period
 * 8 (nobody overtakes, nobody starves). */
enum { SV = 8, ROUNDS = 5 };

struct starve {
    char *url;
    atomic_int rounds[SV];
    atomic_int seq_len;
    int seq[SV * ROUNDS];
    atomic_int failed;
};

/* One of the SV clients: its thread, and its place in the turns. */
struct starve_client {
    struct starve *st;
    int id;
    pthread_t th;
};

static void *starve_main(void *arg)
{
    struct starve_client *a = arg;
    struct starve *st = a->st;
    dlock_client *c = NULL;
    if (dlock_open(st->url, &c) != DLOCK_OK) {
        atomic_store(&st->failed, 1);
        return NULL;
    }
    dlock_lock *l = NULL;
    redisContext *ctx = fx_redis_raw(&srv, NULL);
    if (!ctx || dlock_lock_new(c, "s", DLOCK_EXCLUSIVE, 0, &l) != DLOCK_OK)
        atomic_store(&st->failed, 1);
    for (int r = 0; r < ROUNDS && !atomic_load(&st->failed); r++) {
        if (dlock_acquire(l, 60000) != DLOCK_OK) {
            atomic_store(&st->failed, 1);
            break;
        }
        st->seq[atomic_fetch_add(&st->seq_len, 1)] = a->id;
        atomic_fetch_add(&st->rounds[a->id], 1);
        long long want = 0;
        for (int i = 0; i < SV; i++)
            want += i != a->id && atomic_load(&st->rounds[i]) < ROUNDS;
        bool all = false;
        for (int i = 0; i < 6000 && !all; i++) {
            redisReply *q = redisCommand(ctx, "ZCARD dlock_fair_queue:{s}");
            all = q && q->type == REDIS_REPLY_INTEGER && q->integer >= want;
            freeReplyObject(q);
            if (!all)
                tu_sleep_ms(5);
        }
        if (!all || dlock_release(l) != DLOCK_OK)
            atomic_store(&st->failed, 1);
    }
    if (ctx)
        redisFree(ctx);
    dlock_lock_free(l);
    dlock_client_close(c);
    return NULL;
}

TU_TEST(no_starvation_among_8_clients, 120)
{
    struct starve st = {.url = start_fair(NULL)};
    struct starve_client a[SV];
    /* one client holds while the 8 queue, so the turns start in order */
    dlock_client *c = tu_open(st.url);
    dlock_lock *l = tu_lock(c, "s");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    redisContext *ctx = raw();
    for (int i = 0; i < SV; i++) {
        a[i] = (struct starve_client){.st = &st, .id = i};
        pthread_create(&a[i].th, NULL, starve_main, &a[i]);
        wait_queued(ctx, "s", i + 1);
    }
    TU_RELEASE_OK(l);
    for (int i = 0; i < SV; i++)
        pthread_join(a[i].th, NULL);
    ck_assert_msg(!atomic_load(&st.failed), "a client failed: %s", dlock_errmsg());
    ck_assert_int_eq(atomic_load(&st.seq_len), SV * ROUNDS);
    for (int i = 0; i < SV * ROUNDS; i++)
        ck_assert_msg(st.seq[i] == i % SV, "turn %d went to client %d, not %d", i, st.seq[i],
                      i % SV);
    TU_FREE_LOCKS(l);
    TU_CLOSE_CLIENTS(c);
    stop_fair(ctx, st.url);
}

/* A waiter that gives up while a release hands it the lock: the leave
 * passes the lock on to the next waiter, so nothing stays held by a wait
 * that ended. The grant message to b is made to miss it: its client's
 * subscriber is cut (CLIENT KILL) once the default user needs a password
 * (c is another user), so b's hub cannot subscribe again while its pooled
 * connection (authenticated before) still serves its requests.
 * Then b's wait is canceled: ECANCELED, and c gets the lock with the
 * token after b's (the lock was handed to b, then passed on). */
TU_TEST(grant_to_a_waiter_that_gave_up_is_passed_on, 120)
{
    char *url = start_fair("lease=60s&queue_lease=60s");
    char *url_pw = tu_fmt("redis://cee:sekrit@127.0.0.1:%d?layout=fair&lease=60s&queue_lease=60s",
                          srv.port);
    redisContext *ctx = raw();
    redisReply *r = redisCommand(ctx, "ACL SETUSER cee on >sekrit ~* &* +@all");
    ck_assert_msg(r && r->type == REDIS_REPLY_STATUS, "ACL SETUSER cee failed");
    freeReplyObject(r);
    dlock_client *a = tu_open(url), *b = tu_open(url), *c = tu_open(url_pw);
    dlock_lock *la = tu_lock(a, "g"), *lb = tu_lock(b, "g"), *lc = tu_lock(c, "g");
    TU_ACQUIRE_OK(la, DLOCK_TRY);
    uint64_t t0 = tu_token(la);
    struct tu_waiter wb, wc;
    tu_waiter_start_ex(&wb, lb, DLOCK_FOREVER, NULL, true);
    wait_queued(ctx, "g", 1);
    tu_waiter_start_ex(&wc, lc, DLOCK_FOREVER, NULL, false);
    wait_queued(ctx, "g", 2);
    wait_grant_channels(ctx, 2); /* both clients' */
    r = redisCommand(ctx, "ACL SETUSER default resetpass >sekrit");
    ck_assert_msg(r && r->type == REDIS_REPLY_STATUS, "ACL SETUSER default failed");
    freeReplyObject(r);
    r = redisCommand(ctx, "CLIENT KILL TYPE pubsub");
    ck_assert_msg(r && r->type == REDIS_REPLY_INTEGER && r->integer == 2,
                  "CLIENT KILL TYPE pubsub: %lld subscribers cut, not 2",
                  r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1);
    freeReplyObject(r);
    /* the cut woke b for one try (a still holds), then b sleeps again */
    ck_assert(tu_wait_thread_asleep(&wb.tid, 60000));
    TU_RELEASE_OK(la);
    /* handed to b: c still queued, the lock held, b not told */
    wait_queued(ctx, "g", 1);
    ck_assert_int_eq(raw_int(ctx, "EXISTS g"), 1);
    ck_assert_int_eq(wb.rc, 1); /* still waiting */
    tu_waiter_cancel_until_returned(&wb);
    ck_assert_int_eq(wb.rc, DLOCK_ECANCELED);
    ck_assert_int_eq(dlock_hold_count(lb), 0);
    ck_assert_int_eq(tu_waiter_join(&wc), DLOCK_OK);
    ck_assert_msg(wc.token == t0 + 2, "c's token %llu: not the one after b's grant (%llu + 2)",
                  (unsigned long long)wc.token, (unsigned long long)t0);
    TU_FREE_LOCKS(la, lb, lc);
    TU_CLOSE_CLIENTS(a, b, c);
    free(url_pw);
    stop_fair(ctx, url);
}

/* The fault relay (tests/lib/relay.h) in front of the server that, in
 * TU_RELAY_FREEZE, stops passing the server's bytes to the subscriber
 * connections (those whose client sent a SUBSCRIBE): a grant message
 * held up on the way, as by a slow or lossy path, while the client's
 * requests go through. */
static enum tu_relay_action mark_subscriber(struct tu_relay *r, struct tu_relay_conn *c,
                                            const char *req, size_t len)
{
    (void)r;
    c->marked = c->marked || memmem(req, len, "SUBSCRIBE", 9);
    return TU_RELAY_FORWARD;
}

static void sub_relay_start(struct tu_relay *rl, int target_port)
{
    tu_relay_start_with(rl, &(struct tu_relay_config){.target = target_port,
                                                      .close_with_client = true,
                                                      .freeze_marked = true,
                                                      .on_request = mark_subscriber});
}

/* A grant that reaches its waiter only after its lease ran out and the
 * lock went to the next waiter never makes a second owner. w (a 1 s
 * lease, refreshing its queue entry every 10 s, behind a relay that holds
 * its grant message up) is handed the lock; the grant's lease runs out
 * untold, a try of a's hands the lock to c, queued behind, and w's next
 * refresh finds its grant gone and queues again. Then the old message
 * arrives: it must not count as a grant of that wait (it did: w returned
 * holding the lock beside c, with c's predecessor's token). */
TU_TEST(late_grant_after_its_lease_is_not_taken, 120)
{
    char *url = start_fair("lease=60s&queue_lease=60s");
    struct tu_relay rl;
    sub_relay_start(&rl, srv.port);
    char *url_w = tu_fmt("redis://127.0.0.1:%d?layout=fair&lease=1s&queue_lease=30s", rl.port);
    redisContext *ctx = raw();
    dlock_client *a = tu_open(url), *b = tu_open(url_w), *c = tu_open(url);
    dlock_lock *la = tu_lock(a, "late"), *lw = tu_lock(b, "late"),
               *lc = tu_lock_mode(c, "late", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED);
    TU_ACQUIRE_OK(la, DLOCK_TRY);
    struct tu_waiter ww, wc;
    tu_waiter_start_ex(&ww, lw, 25000, NULL, true); /* past its refresh, 10 s in */
    wait_queued(ctx, "late", 1);
    tu_waiter_start_ex(&wc, lc, DLOCK_FOREVER, NULL, true);
    wait_queued(ctx, "late", 2);
    wait_grant_channels(ctx, 2); /* both clients': w's through the relay */
    /* w asleep after its tries: its next one is 10 s away (a try between
     * the release and the grant's end would take the lock from its reply) */
    ck_assert(tu_wait_thread_asleep(&ww.tid, 60000));
    tu_relay_set(&rl, TU_RELAY_FREEZE);
    for (int i = 0; i < 6000 && atomic_load(&rl.frozen) < 1; i++)
        tu_sleep_ms(10);
    ck_assert_int_eq(atomic_load(&rl.frozen), 1);
    TU_RELEASE_OK(la); /* handed to w, whose message is held up */
    wait_queued(ctx, "late", 1);
    for (int i = 0; i < 6000 && raw_int(ctx, "EXISTS late") == 1; i++)
        tu_sleep_ms(10); /* w's grant ran out, untold */
    ck_assert_int_eq(raw_int(ctx, "EXISTS late"), 0);
    ck_assert_int_eq(dlock_acquire(la, DLOCK_TRY), DLOCK_EBUSY); /* hands it to c */
    ck_assert_int_eq(tu_waiter_join(&wc), DLOCK_OK);
    wait_queued(ctx, "late", 1); /* w's refresh: queued again */
    tu_relay_set(&rl, TU_RELAY_PASS); /* the old grant arrives */
    int rc = tu_waiter_join(&ww);
    ck_assert_msg(rc != DLOCK_OK, "w took a late grant (token %llu) while c holds the lock "
                                  "(token %llu): two owners",
                  (unsigned long long)ww.token, (unsigned long long)wc.token);
    ck_assert_int_eq(rc, DLOCK_ETIMEDOUT);
    ck_assert_int_eq(dlock_hold_count(lc), 1); /* c held it throughout */
    ck_assert_int_eq(raw_int(ctx, "HLEN late"), 2); /* c's field and mode */
    TU_RELEASE_OK(lc);
    TU_FREE_LOCKS(la, lw, lc);
    TU_CLOSE_CLIENTS(a, b, c);
    tu_relay_stop(&rl);
    free(url_w);
    stop_fair(ctx, url);
}

/* A script that keeps the server busy MS (under Redis's 5 s script time
 * limit, so nothing is answered meanwhile, not even BUSY), on a
 * connection of its own. */
static void *busy_server_main(void *arg)
{
    int ms = *(int *)arg;
    redisContext *ctx = fx_redis_raw(&srv, NULL);
    redisReply *r = ctx ? redisCommand(ctx, "EVAL %s 0 %d",
                                       "local t = redis.call('time') "
                                       "local t0 = t[1] * 1000000 + t[2] repeat "
                                       "t = redis.call('time') until t[1] * 1000000 + t[2] - t0 > "
                                       "ARGV[1] * 1000 return 1",
                                       ms)
                        : NULL;
    freeReplyObject(r);
    if (ctx)
        redisFree(ctx);
    return NULL;
}

/* Whether the server answers a PING within 200 ms. */
static bool server_answers(void)
{
    redisContext *p = fx_redis_raw(&srv, NULL);
    if (!p)
        return false;
    struct timeval tv = {0, 200000};
    redisSetTimeout(p, tv);
    redisReply *r = redisCommand(p, "PING");
    bool answered = r != NULL;
    freeReplyObject(r);
    redisFree(p);
    return answered;
}

/* A wait that ends while the server is stalled returns at its end, not
 * when the server answers again: leaving the queue is owed to the
 * keeper, which sends it once the server is back. With CANCEL the wait
 * (forever) is canceled once the server stalls: nothing is left of it
 * either, the caller asked to stop now. */
static void gives_up_on_a_stalled_server(bool cancel)
{
    struct takers t = takers_begin("timeout=20s&queue_lease=60s", "st");
    dlock_client *b = tu_open(t.url);
    dlock_lock *lb = tu_lock(b, "st");
    struct tu_waiter wb;
    tu_waiter_start(&wb, lb, cancel ? DLOCK_FOREVER : 1500);
    wait_queued(t.ctx, "st", 1);
    ck_assert(tu_wait_thread_asleep(&wb.tid, 60000)); /* its next try is 20 s away */
    int busy_ms = 4500;
    pthread_t th;
    pthread_create(&th, NULL, busy_server_main, &busy_ms);
    for (int i = 0; i < 100 && server_answers(); i++)
        ; /* until the script runs */
    if (cancel)
        ck_assert_int_eq(dlock_lock_cancel(lb), DLOCK_OK);
    int rc = tu_waiter_join(&wb);
    bool stalled = !server_answers();
    ck_assert_int_eq(rc, cancel ? DLOCK_ECANCELED : DLOCK_ETIMEDOUT);
    ck_assert_msg(stalled, "the %s returned only once the stalled server answered",
                  cancel ? "canceled wait" : "1.5 s wait");
    pthread_join(th, NULL);
    wait_queued(t.ctx, "st", 0); /* the keeper's leave, once the server is back */
    TU_FREE_LOCKS(lb);
    TU_CLOSE_CLIENTS(b);
    takers_end(&t);
}

/* (The leave was sent in the caller's thread: a 1.5 s wait returned once
 * the stalled server answered, 4.5 s in, or after the op timeout.) */
TU_TEST(wait_ends_on_time_on_a_stalled_server, 60)
{
    gives_up_on_a_stalled_server(false);
}

/* (The leave of a canceled wait was sent in the caller's thread within
 * what was left of a wait forever, the op timeout: the cancel returned
 * once the stalled server answered.) */
TU_TEST(canceled_wait_ends_on_a_stalled_server, 60)
{
    gives_up_on_a_stalled_server(true);
}

/* A cancel ends a fair acquire whose request is in flight: the server
 * stopped (SIGSTOP) before the wait's first try, that try's script gets
 * no reply; canceled once the waiter is seen blocked, the wait must
 * return DLOCK_ECANCELED while the server is still stopped, not after
 * the op timeout (30 s; given 15 s). What the request may still do (it
 * runs once the server is continued) is undone by the leave the keeper
 * owes: the name is free and nobody is queued. */
TU_TEST(cancel_ends_a_fair_request_in_flight, 60)
{
    char *url = start_fair("timeout=30s&queue_lease=60s");
    dlock_client *c = tu_open(url), *other = tu_open(url);
    dlock_lock *l = tu_lock(c, "infl"), *ol = tu_lock(other, "infl");
    redisContext *ctx = raw();
    tu_pause(srv.pid);
    int rc;
    bool returned = tu_canceled_wait_returns(l, false, srv.pid, 15000, &rc);
    ck_assert_msg(returned, "the canceled acquire returned only once the server answered (%s)",
                  dlock_err_name(rc));
    ck_assert_msg(rc == DLOCK_ECANCELED, "%s", dlock_err_name(rc));
    tu_acquire_release(ol, 20000); /* free once the owed leave ran */
    wait_queued(ctx, "infl", 0);
    TU_FREE_LOCKS(l, ol);
    TU_CLOSE_CLIENTS(c, other);
    stop_fair(ctx, url);
}

/* The script itself, played on the wire: an owner's leftover field (a
 * release that never reached the server) is dropped by that owner's next
 * acquire even when another waiter is queued first, which then gets the
 * lock: never two owners' fields in the hash. */
static redisReply *fair_script(redisContext *ctx, const char *src, const char *op,
                               const char *owner, const char *stage, const char *wait_id)
{
    const char *argv[] = {"EVAL", src, "6", "g", "redisson_lock_token:{g}", "dlock_canceled:{g}",
                          "dlock_fair_queue:{g}", "dlock_fair_waiters:{g}",
                          "redisson_lock__channel:{g}", op, owner, "dlock_fair__channel:test",
                          "60000", wait_id, "0", "600000", "60000", stage, wait_id};
    redisReply *r = redisCommandArgv(ctx, 19, argv, NULL);
    ck_assert_msg(r != NULL && r->type != REDIS_REPLY_ERROR, "fair_lock.lua %s: %s", op,
                  r && r->str ? r->str : ctx->errstr);
    return r;
}

/* fair_lock.lua as the library sends it: lib_acquire.lua in front
 * (scripts.c). Freed by the caller. */
static char *fair_script_source(void)
{
    char *lib = tu_read_file("src/backends/redis/scripts/lib_acquire.lua");
    char *fair = tu_read_file("src/backends/redis/scripts/fair_lock.lua");
    ck_assert_msg(lib && fair, "run from the source tree: src/backends/redis/scripts/");
    char *src = malloc(strlen(lib) + strlen(fair) + 1);
    ck_assert_ptr_nonnull(src);
    strcpy(stpcpy(src, lib), fair);
    free(lib);
    free(fair);
    return src;
}

TU_TEST(leftover_field_never_makes_two_owners, 60)
{
    ck_assert_msg(fx_redis_start(&srv, NULL), "redis-server could not be started");
    char *src = fair_script_source();
    redisContext *ctx = raw();
    const char *x = "00000000-0000-4000-8000-000000000001:1";
    const char *y = "00000000-0000-4000-8000-000000000002:1";
    freeReplyObject(redisCommand(ctx, "HSET g %s 1 mode write", x)); /* x's leftover */
    freeReplyObject(redisCommand(ctx, "PEXPIRE g 60000"));
    redisReply *r = fair_script(ctx, src, "acquire", y, "1", "1"); /* y queues */
    ck_assert_msg(r->type == REDIS_REPLY_INTEGER && r->integer < -1, "y was not queued");
    freeReplyObject(r);
    r = fair_script(ctx, src, "acquire", x, "1", "2"); /* x comes back */
    ck_assert_msg(r->type == REDIS_REPLY_INTEGER && r->integer < -1,
                  "x took the lock before y, queued first");
    freeReplyObject(r);
    ck_assert_int_eq(raw_int(ctx, "HEXISTS g %s", x), 0);
    ck_assert_int_eq(raw_int(ctx, "HEXISTS g %s", y), 1);
    ck_assert_int_eq(raw_int(ctx, "HLEN g"), 2); /* y and mode */
    ck_assert_int_eq(queued(ctx, "g"), 1);      /* x, behind */
    free(src);
    stop_fair(ctx, NULL);
}

/* A client of the default layout with fair handles (DLOCK_LOCK_FAIR):
 * inspect reads the fair queue it finds beside the lock, so its waiters
 * are counted, not shown as unknown; a name without a queue stays
 * unknown (the Redisson layout keeps no list of its waiters). */
TU_TEST(inspect_on_default_layout_lists_fair_waiters, 60)
{
    ck_assert_msg(fx_redis_start(&srv, NULL), "redis-server could not be started");
    dlock_client *a = tu_open(srv.url), *b = tu_open(srv.url);
    dlock_lock *la = tu_lock_mode(a, "d", DLOCK_EXCLUSIVE, DLOCK_LOCK_FAIR);
    dlock_lock *lb = tu_lock_mode(b, "d", DLOCK_EXCLUSIVE, DLOCK_LOCK_FAIR);
    dlock_lock *plain = tu_lock(a, "plain");
    TU_ACQUIRE_OK(la, DLOCK_TRY);
    TU_ACQUIRE_OK(plain, DLOCK_TRY);
    redisContext *ctx = raw();
    struct tu_waiter w;
    tu_waiter_start_ex(&w, lb, DLOCK_FOREVER, NULL, false);
    wait_queued(ctx, "d", 1);
    dlock_info *info = NULL;
    ck_assert_int_eq(dlock_inspect(a, "d", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_waiter_count(info), 1);
    ck_assert_ptr_nonnull(strchr(dlock_info_waiter(info, 0), ':'));
    dlock_info_free(info);
    ck_assert_int_eq(dlock_inspect(a, "plain", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_waiter_count(info), -1);
    dlock_info_free(info);
    TU_RELEASE_OK(la);
    ck_assert_int_eq(tu_waiter_join(&w), DLOCK_OK); /* and released */
    TU_FREE_LOCKS(la, lb, plain);
    TU_CLOSE_CLIENTS(a, b);
    stop_fair(ctx, NULL);
}

int main(void)
{
    return tu_main("fair", NULL, NULL);
}
