/* check_redis_faults.c -- the Redis backend under faults that are real:
 * the server killed, paused and restarted, scripts flushed, memory
 * exhausted, wrong passwords, nothing listening, and the fault-injecting
 * proxy (redis_suite.h) that loses, holds back, forges or resets.
 */
#include "redis_suite.h"

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
    ck_assert_int_eq(cmd_int(ctx, "GET %s", "redisson_lock_token:{amb}"),
                     (long long)t1); /* the last */
    if (!simple) {
        ck_assert_int_eq(cmd_int(ctx, "HLEN amb"), 2);
        ck_assert_int_eq(owner_count(ctx, "amb"), 1);
    }

    atomic_store(&px.drop_release, 1);
    int rc = dlock_release(via.l);
    ck_assert_msg(rc == DLOCK_OK, "release after a lost reply: %s: %s", dlock_err_name(rc),
                  dlock_errmsg());
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
    ck_assert_int_eq(cmd_int(ctx, "GET %s", "redisson_lock_token:{late}"),
                     (long long)tu_token(via.l));
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
    ck_assert_int_eq(atomic_load(timed_out ? &px.stalled : &px.r.served[GATE_HELD]),
                     timed_out ? 1 : 0);
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
    ck_assert_msg(rc == DLOCK_OK, "downgrade sent again: %s: %s", dlock_err_name(rc),
                  dlock_errmsg());
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
    ck_assert_msg(a.rc2 == DLOCK_ETIMEDOUT, "acquire while a cancel is owed: %s",
                  dlock_err_name(a.rc2));
    tu_relay_gate(&px.r, GATE_STALLED, false);
    late_attempts_do_nothing(ctx, &px, "stall", 20000);
    tu_acquire_release(via.l, DLOCK_TRY);
    redisFree(ctx);
    tu_solo_close(&via);
    stop_server();
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
    ck_assert_msg(rc == DLOCK_ETIMEDOUT,
                  "the next wait went out before the owed unwait: %s, "
                  "%lld writer record(s) left (readers kept out)",
                  dlock_err_name(rc), records);
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
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
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

int main(void)
{
    return tu_main("redis", NULL, NULL);
}
