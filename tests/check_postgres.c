/* check_postgres.c -- what only the postgres:// backend does, against real
 * PostgreSQL servers (tests/lib/fixture_pg.h); the lock contract itself runs
 * in check_contract's postgres case.
 *
 * The lease the server enforces (a SIGSTOPped holder, a holder cut off by
 * the relay, a killed one: the next holder gets in with a greater token),
 * a server restart (holds lost and told, tokens still growing), a cancel
 * that ends a wait sleeping in the server, the errors that name what is
 * wrong (credentials, database, a standby, a refused force release),
 * names with every byte, numeric names joining an application's own
 * advisory locks, and the CLI. Each test makes names of its own
 * ("<pid>-..."), so the tests of the shared server never meet. No
 * assertion on time beyond generous bounds.
 */
#include <check.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "contract.h" /* EXPECT_RC */
#include "dlock.h"
#include "fixture_pg.h"
#include "relay.h"
#include "testutil.h"

/* One server shared by the tests of the case "shared", started in the
 * runner (which makes the template data directory once: the tests that
 * start servers of their own copy it). */
static struct pgf srv;
static void srv_start(void)
{
    if (!pgf_start(&srv))
        fprintf(stderr, "postgres fixture did not start: %s\n", srv.error);
}
static void srv_stop(void)
{
    pgf_stop(&srv);
}
TU_CASE(shared, srv_start, srv_stop, TU_AROUND_CASE)

/* The shared server's URL with this test's prefix and EXTRA options. */
static char *url_of(const struct pgf *f, const char *extra)
{
    ck_assert_msg(f->pid > 0, "the postgres server is not running: %s", f->error);
    char *q = tu_fmt("prefix=%d-%s%s", (int)getpid(), extra ? "&" : "", extra ? extra : "");
    char *u = pgf_url(f, q);
    free(q);
    return u;
}

static dlock_client *open_url(const char *url)
{
    dlock_client *c = NULL;
    int rc = dlock_open(url, &c);
    ck_assert_msg(rc == DLOCK_OK, "%s: %s (%s)", url, dlock_err_name(rc), dlock_errmsg());
    return c;
}

/* A holder in a child process: opens URL, takes NAME, writes its token
 * to DIR/held, then sleeps until killed. */
static pid_t fork_holder(const char *url, const char *name, const char *dir)
{
    pid_t pid = tu_fork();
    if (pid == 0) {
        dlock_client *c = NULL;
        dlock_lock *l = NULL;
        if (dlock_open(url, &c) || dlock_lock_new(c, name, DLOCK_EXCLUSIVE, 0, &l) ||
            dlock_acquire(l, 30000)) {
            fprintf(stderr, "holder: %s\n", dlock_errmsg());
            _exit(1);
        }
        uint64_t t = 0;
        dlock_token(l, &t);
        char *path = tu_fmt("%s/held", dir), *text = tu_fmt("%" PRIu64, t);
        tu_write_marker(path, text);
        for (;;)
            pause();
    }
    return pid;
}

static uint64_t wait_held(const char *dir)
{
    char *path = tu_fmt("%s/held", dir);
    ck_assert_msg(tu_wait_file(path, 60000), "the holder never held");
    uint64_t t = tu_read_u64(path);
    free(path);
    return t;
}

/* Another client takes NAME within WAIT_MS (generous) and returns its token. */
static uint64_t next_holder_token(const char *url, const char *name, int64_t wait_ms)
{
    dlock_client *c = open_url(url);
    dlock_lock *l = tu_lock(c, name);
    EXPECT_RC(dlock_acquire(l, wait_ms), DLOCK_OK);
    uint64_t t = tu_token(l);
    EXPECT_RC(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    dlock_client_close(c);
    return t;
}

/* ====================================================== the lease, for real */

/* A holder frozen with SIGSTOP keeps its TCP connection (the kernel still
 * answers for it) but sends nothing: the server's idle_session_timeout
 * ends its session one lease after its last ping, and the next holder
 * gets the lock with a greater token. */
TU_TEST_IN(shared, sigstopped_holder_loses_lock, 90)
{
    char *url = url_of(&srv, "lease=1500ms"), *dir = tu_tmpdir("pg-stop");
    pid_t pid = fork_holder(url, "frozen", dir);
    uint64_t t1 = wait_held(dir);
    ck_assert_int_eq(kill(pid, SIGSTOP), 0);
    int64_t t0 = tu_mono_ms();
    uint64_t t2 = next_holder_token(url, "frozen", 60000);
    int64_t took = tu_mono_ms() - t0;
    ck_assert_msg(t2 > t1, "token %" PRIu64 " after the frozen holder's %" PRIu64, t2, t1);
    /* about one lease; bounded generously for a loaded machine */
    ck_assert_msg(took < 30000, "the frozen holder kept the lock %lld ms", (long long)took);
    kill(pid, SIGKILL);
    tu_wait_exit(pid);
    tu_rmrf(dir);
    free(dir);
    free(url);
}

/* kill -9: the kernel closes the holder's socket, the server ends its
 * session at once, and the lock with it. */
TU_TEST_IN(shared, killed_holder_frees_lock, 60)
{
    char *url = url_of(&srv, "lease=60s"), *dir = tu_tmpdir("pg-kill");
    pid_t pid = fork_holder(url, "killed", dir);
    uint64_t t1 = wait_held(dir);
    kill(pid, SIGKILL);
    tu_wait_exit(pid);
    /* a lease of a minute: only the closed socket can free it this soon */
    uint64_t t2 = next_holder_token(url, "killed", 30000);
    ck_assert_uint_gt(t2, t1);
    tu_rmrf(dir);
    free(dir);
    free(url);
}

/* A holder cut off by the network (the relay throws everything away):
 * its pings go unanswered, it is told it lost the lock, and the server,
 * hearing nothing, ends its session so that a client on a working path
 * gets in with a greater token. */
TU_TEST_IN(shared, cut_off_holder_loses_lock, 90)
{
    struct tu_relay relay;
    tu_relay_start_with(&relay, &(struct tu_relay_config){.target = srv.port});
    char *q = tu_fmt("prefix=%d-&lease=1500ms&timeout=1s&connect_timeout=1s", (int)getpid());
    char *via =
        tu_fmt("postgres://postgres:" PGF_PASSWORD "@127.0.0.1:%d/postgres?%s", relay.port, q);
    char *direct = url_of(&srv, NULL);
    dlock_client *a = open_url(via);
    dlock_lock *la = tu_lock(a, "cut");
    struct tu_lost lost = {0};
    EXPECT_RC(dlock_lock_on_lost(la, tu_on_lost, &lost), DLOCK_OK);
    EXPECT_RC(dlock_acquire(la, DLOCK_TRY), DLOCK_OK);
    uint64_t t1 = tu_token(la);
    tu_relay_set(&relay, TU_RELAY_BLACKHOLE);
    uint64_t t2 = next_holder_token(direct, "cut", 60000);
    ck_assert_uint_gt(t2, t1);
    ck_assert_msg(tu_wait_lost(&lost, 1, 30000), "the cut-off holder was never told");
    ck_assert_msg(strstr(lost.why, "'cut'"), "reason: %s", lost.why);
    ck_assert_int_eq(dlock_validity_ms(la), 0);
    EXPECT_RC(dlock_release(la), DLOCK_ELOST);
    dlock_lock_free(la);
    dlock_client_close(a);
    tu_relay_stop(&relay);
    free(q);
    free(via);
    free(direct);
}

/* ================================================================= restart */

/* A server restart (an immediate shutdown: crash recovery on start) ends
 * every session: the holder is told, its release is DLOCK_ELOST, and the
 * tokens after it are still greater (the sequence is durable). */
TU_TEST_IN(shared, restart_loses_holds_tokens_grow, 120)
{
    struct pgf f;
    ck_assert_msg(pgf_start(&f), "%s", f.error);
    char *url = pgf_url(&f, "lease=2s&timeout=2s&connect_timeout=2s");
    dlock_client *c = open_url(url);
    dlock_lock *l = tu_lock(c, "restart");
    struct tu_lost lost = {0};
    EXPECT_RC(dlock_lock_on_lost(l, tu_on_lost, &lost), DLOCK_OK);
    EXPECT_RC(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    uint64_t t1 = tu_token(l);
    ck_assert_msg(pgf_restart(&f), "%s", f.error);
    ck_assert_msg(tu_wait_lost(&lost, 1, 30000), "the holder was never told of the restart");
    ck_assert_msg(strstr(lost.why, "'restart'"), "reason: %s", lost.why);
    EXPECT_RC(dlock_release(l), DLOCK_ELOST);
    /* the same client acquires again on fresh sessions */
    EXPECT_RC(dlock_acquire(l, 10000), DLOCK_OK);
    uint64_t t2 = tu_token(l);
    ck_assert_msg(t2 > t1, "token %" PRIu64 " after the restart, %" PRIu64 " before", t2, t1);
    EXPECT_RC(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(url);
    pgf_stop(&f);
}

/* ===================================================== waits in the server */

/* Sessions of server F in pg_stat_activity that match WHERE. */
static long sessions_where(const struct pgf *f, const char *where)
{
    char *sql = tu_fmt("SELECT count(*) FROM pg_stat_activity WHERE %s", where), *out = NULL;
    ck_assert_int_eq(pgf_psql(f, sql, &out), 0);
    long n = strtol(out, NULL, 10);
    free(out);
    free(sql);
    return n;
}

/* Sessions of the server waiting for a lock. */
static long lock_waits(void)
{
    return sessions_where(&srv, "wait_event_type = 'Lock' AND wait_event = 'advisory'");
}

/* A wait sleeps in the server (a backend waiting on an advisory lock,
 * not a client polling) until a cancel ends it: at once, leaving no
 * waiter behind. */
TU_TEST_IN(shared, cancel_ends_server_side_wait, 60)
{
    char *url = url_of(&srv, NULL);
    dlock_client *a = open_url(url), *b = open_url(url);
    dlock_lock *la = tu_lock(a, "wait"), *lb = tu_lock(b, "wait");
    EXPECT_RC(dlock_acquire(la, DLOCK_TRY), DLOCK_OK);
    long before = lock_waits();
    struct tu_waiter w;
    tu_waiter_start(&w, lb, DLOCK_FOREVER);
    long n = 0;
    for (int i = 0; i < 1000 && (n = lock_waits()) <= before; i++)
        tu_sleep_ms(20);
    ck_assert_msg(n > before, "no session ever waited in the server");
    int64_t t0 = tu_mono_ms();
    EXPECT_RC(dlock_lock_cancel(lb), DLOCK_OK);
    ck_assert_msg(tu_waiter_wait_done(&w, 20000), "the cancel did not end the wait");
    int64_t took = tu_mono_ms() - t0;
    EXPECT_RC(tu_waiter_join(&w), DLOCK_ECANCELED);
    ck_assert_msg(took < 10000, "the cancel took %lld ms", (long long)took);
    for (int i = 0; i < 500 && lock_waits() > before; i++)
        tu_sleep_ms(20);
    ck_assert_int_le(lock_waits(), before);
    /* b takes the lock next (on a new session: the canceled one was closed) */
    EXPECT_RC(dlock_release(la), DLOCK_OK);
    EXPECT_RC(dlock_acquire(lb, 10000), DLOCK_OK);
    EXPECT_RC(dlock_release(lb), DLOCK_OK);
    TU_FREE_LOCKS(la, lb);
    TU_CLOSE_CLIENTS(a, b);
    free(url);
}

/* What slow_dial's relay saw: when the first request of a connection
 * that came after the delay was turned on arrived, and when the
 * statement with the wait's lock_timeout did, with its value. */
static struct {
    atomic_bool delay;
    atomic_llong first_at, lock_at, lock_timeout;
} slow_dial;

static int slow_dial_delay(struct tu_relay *r, const struct tu_relay_conn *c)
{
    (void)r;
    (void)c;
    return atomic_load(&slow_dial.delay) ? 500 : 0;
}

static enum tu_relay_action slow_dial_seen(struct tu_relay *r, struct tu_relay_conn *c,
                                           const char *req, size_t len)
{
    (void)r;
    if (!atomic_load(&slow_dial.delay)) {
        c->marked = true; /* a connection of before: not the dial */
        return TU_RELAY_FORWARD;
    }
    long long unset = 0;
    if (!c->marked)
        atomic_compare_exchange_strong(&slow_dial.first_at, &unset, tu_mono_ms());
    const char *at = memmem(req, len, "lock_timeout = ", 15);
    if (at && !atomic_load(&slow_dial.lock_at)) {
        atomic_store(&slow_dial.lock_timeout, strtoll(at + 15, NULL, 10));
        atomic_store(&slow_dial.lock_at, tu_mono_ms());
    }
    return TU_RELAY_FORWARD;
}

/* A wait's bound covers the time its session took to connect: the
 * lock_timeout the server is given is what is left of the wait once
 * connected. The relay delays every chunk of the waiter's new session by
 * 500 ms (its dial takes seconds); the lock_timeout sent may not exceed
 * the wait less the time from the dial's first request to the lock
 * statement (a second of slack for a loaded machine). */
TU_TEST_IN(shared, wait_bound_counts_the_dial, 60)
{
    struct tu_relay relay;
    tu_relay_start_with(&relay, &(struct tu_relay_config){.target = srv.port,
                                                          .delay_of = slow_dial_delay,
                                                          .on_request = slow_dial_seen});
    char *via = tu_fmt("postgres://postgres:" PGF_PASSWORD "@127.0.0.1:%d/postgres?prefix=%d-",
                       relay.port, (int)getpid());
    char *direct = url_of(&srv, NULL);
    dlock_client *a = open_url(direct), *b = open_url(via);
    dlock_lock *la = tu_lock(a, "slow"), *pin = tu_lock(b, "pin"), *lb = tu_lock(b, "slow");
    EXPECT_RC(dlock_acquire(la, DLOCK_TRY), DLOCK_OK);
    EXPECT_RC(dlock_acquire(pin, DLOCK_TRY), DLOCK_OK); /* pins b's pooled session */
    atomic_store(&slow_dial.delay, true);
    const int64_t wait = 20000;
    struct tu_waiter w;
    tu_waiter_start(&w, lb, wait);
    for (int i = 0; i < 1500 && !atomic_load(&slow_dial.lock_at); i++)
        tu_sleep_ms(20);
    ck_assert_msg(atomic_load(&slow_dial.lock_at), "the wait's statement never came");
    EXPECT_RC(dlock_release(la), DLOCK_OK);
    EXPECT_RC(tu_waiter_join(&w), DLOCK_OK);
    long long dial = atomic_load(&slow_dial.lock_at) - atomic_load(&slow_dial.first_at);
    long long sent = atomic_load(&slow_dial.lock_timeout);
    ck_assert_msg(dial >= 1000, "the dial took only %lld ms", dial);
    ck_assert_msg(sent <= wait - dial + 1000,
                  "lock_timeout = %lld ms after a dial of %lld ms, for a wait of %lld ms", sent,
                  dial, (long long)wait);
    EXPECT_RC(dlock_release(pin), DLOCK_OK);
    TU_FREE_LOCKS(la, lb, pin);
    TU_CLOSE_CLIENTS(a, b);
    tu_relay_stop(&relay);
    free(via);
    free(direct);
}

/* A cancel toward a server that stalls (its postmaster frozen with
 * SIGSTOP: the cancel request's connection is accepted by the kernel and
 * never answered) still ends the wait within the op timeout: the
 * session is closed instead, which ends the wait in the server. */
TU_TEST_IN(shared, cancel_toward_a_stalled_server_returns, 90)
{
    struct pgf f;
    ck_assert_msg(pgf_start(&f), "%s", f.error);
    char *url = pgf_url(&f, "timeout=2s");
    dlock_client *a = open_url(url), *b = open_url(url);
    dlock_lock *la = tu_lock(a, "stalled"), *lb = tu_lock(b, "stalled");
    EXPECT_RC(dlock_acquire(la, DLOCK_TRY), DLOCK_OK);
    ck_assert_int_eq(kill(f.pid, SIGSTOP), 0); /* b's wait runs on its pooled session */
    int rc = DLOCK_OK;
    bool returned = tu_canceled_wait_returns(lb, false, f.pid, 30000, &rc);
    ck_assert_msg(returned, "the canceled wait hung on the stalled server (%s)",
                  dlock_err_name(rc));
    EXPECT_RC(rc, DLOCK_ECANCELED);
    EXPECT_RC(dlock_release(la), DLOCK_OK);
    TU_FREE_LOCKS(la, lb);
    TU_CLOSE_CLIENTS(a, b);
    free(url);
    pgf_stop(&f);
}

/* ================================================= what a failed wait leaves */

/* Sessions of server F sleeping in pg_sleep. */
static long sleeping_sessions(const struct pgf *f)
{
    return sessions_where(f, "wait_event = 'PgSleep'");
}

/* A session advisory lock outlives the statement that took it: a wait
 * granted its lock, then canceled while the rest of its statement ran
 * (here nextval(), waiting for the token's sequence, which another
 * session keeps locked by an ALTER SEQUENCE in an open transaction), must
 * close its session -- pooled, the session would keep the lock with no
 * hold to release it. Another client takes the name at once after the
 * cancel. A server of its own: the lock would stall every other test's
 * acquires. */
TU_TEST_IN(shared, canceled_after_grant_keeps_no_lock, 120)
{
    struct pgf f;
    ck_assert_msg(pgf_start(&f), "%s", f.error);
    char *url = pgf_url(&f, "lease=60s");
    dlock_client *a = open_url(url), *b = open_url(url), *c = open_url(url);
    dlock_lock *la = tu_lock(a, "granted"), *lb = tu_lock(b, "granted"),
               *lc = tu_lock(c, "granted");
    EXPECT_RC(dlock_acquire(la, DLOCK_TRY), DLOCK_OK);
    struct tu_waiter w;
    tu_waiter_start(&w, lb, DLOCK_FOREVER);
    for (int i = 0; i < 1500 && tu_waiters(a, "granted") < 1; i++)
        tu_sleep_ms(20);
    pid_t locker = tu_fork();
    if (locker == 0) /* ALTER SEQUENCE's lock conflicts with nextval()'s */
        _exit(pgf_psql(&f, "BEGIN; ALTER SEQUENCE dlock_fence CACHE 1; SELECT pg_sleep(60); COMMIT",
                       NULL));
    long n = 0;
    for (int i = 0; i < 1500 && (n = sleeping_sessions(&f)) < 1; i++)
        tu_sleep_ms(20);
    ck_assert_msg(n >= 1, "the sequence was never locked");
    EXPECT_RC(dlock_release(la), DLOCK_OK); /* b is granted, its nextval() waits */
    static const char waiting[] = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                                  "'Lock' AND wait_event = 'relation'";
    n = 0;
    for (int i = 0; i < 1500 && n < 1; i++) {
        char *out = NULL;
        ck_assert_int_eq(pgf_psql(&f, waiting, &out), 0);
        n = strtol(out, NULL, 10);
        free(out);
        if (n < 1)
            tu_sleep_ms(20);
    }
    ck_assert_msg(n >= 1, "the granted waiter never waited for the sequence");
    EXPECT_RC(dlock_lock_cancel(lb), DLOCK_OK);
    ck_assert_msg(tu_waiter_wait_done(&w, 30000), "the cancel did not end the wait");
    EXPECT_RC(tu_waiter_join(&w), DLOCK_ECANCELED);
    ck_assert_int_eq(pgf_psql(&f,
                              "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                              "wait_event = 'PgSleep'",
                              NULL),
                     0);
    tu_wait_exit(locker);
    int rc = DLOCK_EBUSY;
    for (int i = 0; i < 100 && (rc = dlock_acquire(lc, DLOCK_TRY)) == DLOCK_EBUSY; i++)
        tu_sleep_ms(50); /* the server ends a closed session a moment after */
    EXPECT_RC(rc, DLOCK_OK);
    EXPECT_RC(dlock_release(lc), DLOCK_OK);
    TU_FREE_LOCKS(la, lb, lc);
    TU_CLOSE_CLIENTS(a, b, c);
    free(url);
    pgf_stop(&f);
}

/* A waiter frozen (SIGSTOP) after the server granted its lock but before
 * it read the grant: the server ends the idle session one lease after
 * the grant and a third client takes the lock. Thawed, the waiter must
 * not be told it holds the lock (OK with validity left) while the third
 * client does: its validity counts from its request, and a wait that long
 * is confirmed again with the server. */
TU_TEST_IN(shared, waiter_frozen_after_grant_not_told_held, 90)
{
    char *url = url_of(&srv, "lease=2s"), *dir = tu_tmpdir("pg-thaw");
    char *result = tu_fmt("%s/result", dir);
    dlock_client *a = open_url(url);
    dlock_lock *la = tu_lock(a, "thaw");
    EXPECT_RC(dlock_acquire(la, DLOCK_TRY), DLOCK_OK);
    pid_t kid = tu_fork();
    if (kid == 0) {
        dlock_client *k = NULL;
        dlock_lock *kl = NULL;
        if (dlock_open(url, &k) || dlock_lock_new(k, "thaw", DLOCK_EXCLUSIVE, 0, &kl))
            _exit(1);
        int rc = dlock_acquire(kl, 60000);
        long long validity = rc == DLOCK_OK ? (long long)dlock_validity_ms(kl) : 0;
        char *text = tu_fmt("%d %lld", rc, validity);
        tu_write_marker(result, text);
        _exit(0);
    }
    for (int i = 0; i < 1500 && tu_waiters(a, "thaw") < 1; i++)
        tu_sleep_ms(20);
    ck_assert_int_ge(tu_waiters(a, "thaw"), 1);
    ck_assert_int_eq(kill(kid, SIGSTOP), 0);
    EXPECT_RC(dlock_release(la), DLOCK_OK); /* granted to the frozen waiter */
    /* the server ends the frozen waiter's session one lease later */
    dlock_client *c = open_url(url);
    dlock_lock *lc = tu_lock(c, "thaw");
    int rc = DLOCK_EBUSY;
    for (int i = 0; i < 600 && (rc = dlock_acquire(lc, DLOCK_TRY)) == DLOCK_EBUSY; i++)
        tu_sleep_ms(50);
    EXPECT_RC(rc, DLOCK_OK);
    ck_assert_int_eq(kill(kid, SIGCONT), 0);
    ck_assert_msg(tu_wait_file(result, 60000), "the thawed waiter never returned");
    char *text = tu_read_file(result);
    int kid_rc = 1;
    long long kid_validity = 0;
    ck_assert_int_eq(sscanf(text, "%d %lld", &kid_rc, &kid_validity), 2);
    ck_assert_msg(dlock_validity_ms(lc) > 0, "the third client lost its hold");
    ck_assert_msg(kid_rc != DLOCK_OK || kid_validity <= 0,
                  "the thawed waiter was told it holds (validity %lld ms) while another "
                  "client does",
                  kid_validity);
    tu_wait_exit(kid);
    EXPECT_RC(dlock_release(lc), DLOCK_OK);
    TU_FREE_LOCKS(la, lc);
    TU_CLOSE_CLIENTS(a, c);
    tu_rmrf(dir);
    free(text);
    free(result);
    free(dir);
    free(url);
}

/* A role whose sessions get a statement_timeout (ALTER ROLE ... SET, common
 * in production): dlock's sessions run with none, so a wait longer than
 * it is ended by its own deadline or the holder's release, not by it. */
TU_TEST_IN(shared, role_statement_timeout_does_not_end_waits, 60)
{
    char *url = url_of(&srv, NULL);
    dlock_client *a = open_url(url); /* makes the schema the grants name */
    char *role = tu_fmt("st%d", (int)getpid());
    char *sql = tu_fmt("CREATE ROLE %s LOGIN; GRANT USAGE, UPDATE ON SEQUENCE dlock_fence TO %s; "
                       "GRANT SELECT, INSERT, UPDATE, DELETE ON dlock_holds TO %s; "
                       "ALTER ROLE %s SET statement_timeout = '1s'",
                       role, role, role, role);
    ck_assert_int_eq(pgf_psql(&srv, sql, NULL), 0);
    char *as_role =
        tu_fmt("postgres://%s@127.0.0.1:%d/postgres?prefix=%d-", role, srv.port, (int)getpid());
    dlock_client *b = open_url(as_role);
    dlock_lock *la = tu_lock(a, "patient"), *lb = tu_lock(b, "patient");
    EXPECT_RC(dlock_acquire(la, DLOCK_TRY), DLOCK_OK);
    struct tu_waiter w;
    tu_waiter_start(&w, lb, 60000);
    tu_sleep_ms(3000); /* three of the role's statement timeouts */
    EXPECT_RC(dlock_release(la), DLOCK_OK);
    EXPECT_RC(tu_waiter_join(&w), DLOCK_OK);
    TU_FREE_LOCKS(la, lb);
    TU_CLOSE_CLIENTS(a, b);
    free(as_role);
    free(sql);
    free(role);
    free(url);
}

/* The next transaction id of server F (pg_snapshot_xmax: takes none). */
static long long next_xid(const struct pgf *f)
{
    char *out = NULL;
    ck_assert_int_eq(pgf_psql(f, "SELECT pg_snapshot_xmax(pg_current_snapshot())", &out), 0);
    long long xid = strtoll(out, NULL, 10);
    free(out);
    return xid;
}

/* A lock cycle writes no row: no transaction id, no dead tuple, no commit
 * (docs/protocol-postgres.md, "Locks"); the sequence takes one in 32
 * cycles when it logs ahead. 40 cycles took 80 xids when every hold wrote
 * its row of dlock_holds; a bound of 10 leaves room for the server's own
 * (autovacuum). The token, the holder and the name stay readable. */
TU_TEST_IN(shared, lock_cycle_takes_no_xid, 60)
{
    char *url = url_of(&srv, NULL);
    dlock_client *a = open_url(url);
    dlock_lock *l = tu_lock(a, "cheap");
    EXPECT_RC(dlock_acquire(l, DLOCK_TRY), DLOCK_OK); /* the session dialed */
    EXPECT_RC(dlock_release(l), DLOCK_OK);
    long long before = next_xid(&srv);
    for (int i = 0; i < 40; i++) {
        EXPECT_RC(dlock_acquire(l, i % 2 ? DLOCK_TRY : 10000), DLOCK_OK);
        EXPECT_RC(dlock_release(l), DLOCK_OK);
    }
    long long used = next_xid(&srv) - before;
    ck_assert_msg(used <= 10, "40 lock cycles took %lld transaction ids", used);
    EXPECT_RC(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    dlock_info *info = NULL;
    EXPECT_RC(dlock_inspect(a, "cheap", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_held(info), 1);
    uint64_t token = 0;
    EXPECT_RC(dlock_token(l, &token), DLOCK_OK);
    ck_assert_uint_eq(dlock_info_token(info), token);
    ck_assert_msg(strchr(dlock_info_holder(info, 0, NULL), '@'), "holder '%s'",
                  dlock_info_holder(info, 0, NULL));
    char **names = tu_list_names(a, NULL);
    ck_assert_msg(tu_listed(names, "cheap"), "list lost the name");
    tu_free_names(names);
    dlock_info_free(info);
    EXPECT_RC(dlock_release(l), DLOCK_OK);
    dlock_lock_free(l);
    dlock_client_close(a);
    free(url);
}

/* The token is nextval() of a sequence, which logs ahead only every 32
 * values: a commit that does not wait for its WAL (synchronous_commit =
 * off, set for the server, a database or a role) could, after a crash,
 * hand out tokens again. dlock's sessions run with it on: a trigger on
 * dlock_values records the setting of the session the acquire ran on
 * (a value is written through the hold's own session). */
TU_TEST_IN(shared, tokens_commit_synchronously, 60)
{
    int pid = (int)getpid();
    char *url = url_of(&srv, NULL);
    dlock_client_close(open_url(url)); /* makes the schema the grants name */
    char *role = tu_fmt("sc%d", pid);
    char *sql = tu_fmt(
        "CREATE ROLE %s LOGIN; GRANT USAGE, UPDATE ON SEQUENCE dlock_fence TO %s; "
        "GRANT SELECT, INSERT, UPDATE, DELETE ON dlock_holds, dlock_values TO %s; "
        "ALTER ROLE %s SET synchronous_commit = off; "
        "CREATE TABLE seen%d (setting text); GRANT INSERT ON seen%d TO %s; "
        "CREATE FUNCTION seen%d() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN IF current_user = "
        "'%s' THEN INSERT INTO seen%d VALUES (current_setting('synchronous_commit')); END IF; "
        "RETURN NEW; END$$; CREATE TRIGGER seen%d BEFORE INSERT ON dlock_values FOR EACH ROW "
        "EXECUTE FUNCTION seen%d()",
        role, role, role, role, pid, pid, role, pid, role, pid, pid, pid);
    ck_assert_int_eq(pgf_psql(&srv, sql, NULL), 0);
    char *as_role = tu_fmt("postgres://%s@127.0.0.1:%d/postgres?prefix=%d-", role, srv.port, pid);
    dlock_client *c = open_url(as_role);
    dlock_lock *l = tu_lock(c, "durable");
    EXPECT_RC(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    EXPECT_RC(dlock_value_set(l, "v", 1), DLOCK_OK);
    EXPECT_RC(dlock_release(l), DLOCK_OK);
    char *look = tu_fmt("SELECT string_agg(setting, ',') FROM seen%d", pid), *out = NULL;
    ck_assert_int_eq(pgf_psql(&srv, look, &out), 0);
    char *drop = tu_fmt("DROP TRIGGER seen%d ON dlock_values", pid);
    ck_assert_int_eq(pgf_psql(&srv, drop, NULL), 0);
    ck_assert_msg(strncmp(out, "on", 2) == 0, "the acquire ran with synchronous_commit '%s'", out);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(out);
    free(drop);
    free(look);
    free(as_role);
    free(sql);
    free(role);
    free(url);
}

/* ================================================================== errors */

/* The role the server asks a password of (fixture_pg.h): the right one
 * opens, a wrong one is DLOCK_EAUTH naming the user, never the password. */
TU_TEST_IN(shared, bad_credentials_named, 30)
{
    char *out = NULL;
    pgf_psql(
        &srv,
        "DO $$BEGIN CREATE ROLE " PGF_PASSWORD_USER " LOGIN PASSWORD 'right'; EXCEPTION WHEN "
        "duplicate_object THEN NULL; END$$; GRANT USAGE, UPDATE ON SEQUENCE dlock_fence TO " PGF_PASSWORD_USER
        "; GRANT SELECT, INSERT, UPDATE, DELETE ON dlock_holds TO " PGF_PASSWORD_USER,
        &out);
    free(out);
    char *good = tu_fmt("postgres://" PGF_PASSWORD_USER ":right@127.0.0.1:%d/postgres", srv.port);
    dlock_client *c = open_url(good);
    dlock_client_close(c);
    free(good);
    char *url = tu_fmt("postgres://" PGF_PASSWORD_USER ":wrong@127.0.0.1:%d/postgres", srv.port);
    c = (dlock_client *)1;
    EXPECT_RC(dlock_open(url, &c), DLOCK_EAUTH);
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(dlock_errmsg(), "password authentication failed") &&
                      strstr(dlock_errmsg(), PGF_PASSWORD_USER),
                  "%s", dlock_errmsg());
    ck_assert_msg(!strstr(dlock_errmsg(), "wrong"), "the password shows: %s", dlock_errmsg());
    free(url);
    url = tu_fmt("postgres://nobody_here:x@127.0.0.1:%d/postgres", srv.port);
    EXPECT_RC(dlock_open(url, &c), DLOCK_EAUTH); /* a role that does not exist */
    ck_assert_msg(strstr(dlock_errmsg(), "nobody_here"), "%s", dlock_errmsg());
    free(url);
}

TU_TEST_IN(shared, missing_database_named, 30)
{
    char *url = pgf_url(&srv, NULL);
    char *missing =
        tu_fmt("postgres://postgres:" PGF_PASSWORD "@127.0.0.1:%d/no_such_db", srv.port);
    dlock_client *c = (dlock_client *)1;
    EXPECT_RC(dlock_open(missing, &c), DLOCK_ENOENT);
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(dlock_errmsg(), "no_such_db"), "%s", dlock_errmsg());
    free(missing);
    free(url);
}

/* A server in recovery (a standby: here one started with standby.signal
 * and no primary) serves reads only: DLOCK_EUNAVAIL naming it. */
TU_TEST_IN(shared, standby_refused, 60)
{
    struct pgf f;
    ck_assert_msg(pgf_start(&f), "%s", f.error);
    pgf_kill(&f);
    char *signal_file = tu_fmt("%s/standby.signal", f.data);
    tu_write_file(signal_file, "");
    if (geteuid() == 0)
        ck_assert_int_eq(chown(signal_file, 65534, 65534), 0);
    ck_assert_msg(pgf_restart(&f), "%s", f.error);
    char *url = pgf_url(&f, NULL);
    dlock_client *c = (dlock_client *)1;
    EXPECT_RC(dlock_open(url, &c), DLOCK_EUNAVAIL);
    ck_assert_msg(strstr(dlock_errmsg(), "standby") && strstr(dlock_errmsg(), "127.0.0.1:"), "%s",
                  dlock_errmsg());
    free(url);
    free(signal_file);
    pgf_stop(&f);
}

/* A role that may not end the holder's session (a superuser's) gets the
 * server's refusal as DLOCK_EACCES; the lock stays held. */
TU_TEST_IN(shared, force_release_refused, 30)
{
    char *url = url_of(&srv, NULL);
    dlock_client *a = open_url(url);
    dlock_lock *la = tu_lock(a, "guarded");
    EXPECT_RC(dlock_acquire(la, DLOCK_TRY), DLOCK_OK);
    char *role = tu_fmt("weak%d", (int)getpid());
    char *sql = tu_fmt("CREATE ROLE %s LOGIN PASSWORD 'weakpw'; GRANT USAGE, UPDATE ON SEQUENCE "
                       "dlock_fence TO %s; GRANT SELECT, INSERT, UPDATE, DELETE ON dlock_holds TO "
                       "%s",
                       role, role, role);
    ck_assert_int_eq(pgf_psql(&srv, sql, NULL), 0);
    char *weak = tu_fmt("postgres://%s:weakpw@127.0.0.1:%d/postgres?prefix=%d-", role, srv.port,
                        (int)getpid());
    dlock_client *b = open_url(weak);
    EXPECT_RC(dlock_force_release(b, "guarded"), DLOCK_EACCES);
    ck_assert_msg(strstr(dlock_errmsg(), "superuser") || strstr(dlock_errmsg(), "permission"), "%s",
                  dlock_errmsg());
    ck_assert_int_eq(tu_held(b, "guarded"), 1);
    EXPECT_RC(dlock_release(la), DLOCK_OK);
    dlock_lock_free(la);
    TU_CLOSE_CLIENTS(a, b);
    free(role);
    free(sql);
    free(weak);
    free(url);
}

/* The backend (server process) of the session holding NAME under this
 * test's prefix: the one whose last statement opens with the hold's tag
 * (docs/protocol-postgres.md, "Locks"). */
static pid_t holder_backend(const char *name)
{
    char *sql = tu_fmt("SELECT a.pid FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid AND "
                       "l.granted AND l.locktype = 'advisory' WHERE a.query LIKE '/*dlock:' || "
                       "encode(convert_to('%d-%s', 'UTF8'), 'hex') || '*/%%' LIMIT 1",
                       (int)getpid(), name);
    char *out = NULL;
    ck_assert_int_eq(pgf_psql(&srv, sql, &out), 0);
    pid_t pid = (pid_t)strtol(out, NULL, 10);
    ck_assert_msg(pid > 0, "no backend holds '%s': %s", name, out);
    free(out);
    free(sql);
    return pid;
}

/* Force release ends the holder's session with pg_terminate_backend(),
 * which answers false when the session did not end within its timeout
 * (here its backend is frozen with SIGSTOP, so the SIGTERM waits): the
 * lock may still be held, so the answer is DLOCK_ETIMEDOUT naming the
 * holder's session -- never DLOCK_OK -- and the session ends once the
 * backend runs again. */
TU_TEST_IN(shared, force_release_of_a_session_that_stays, 60)
{
    char *url = url_of(&srv, "timeout=2s");
    dlock_client *a = open_url(url), *b = open_url(url);
    dlock_lock *la = tu_lock(a, "stays");
    EXPECT_RC(dlock_acquire(la, DLOCK_TRY), DLOCK_OK);
    pid_t backend = holder_backend("stays");
    ck_assert_int_eq(kill(backend, SIGSTOP), 0);
    int rc = dlock_force_release(b, "stays");
    char msg[512];
    snprintf(msg, sizeof msg, "%s", dlock_errmsg());
    ck_assert_int_eq(kill(backend, SIGCONT), 0);
    EXPECT_RC(rc, DLOCK_ETIMEDOUT);
    char *pid_text = tu_fmt("%d", (int)backend);
    ck_assert_msg(strstr(msg, "did not end") && strstr(msg, pid_text), "%s", msg);
    free(pid_text);
    int held = 1;
    for (int i = 0; i < 200 && (held = tu_held(b, "stays")) == 1; i++)
        tu_sleep_ms(50); /* the SIGTERM it had pending ends it now */
    ck_assert_int_eq(held, 0);
    EXPECT_RC(dlock_release(la), DLOCK_ELOST);
    dlock_lock_free(la);
    TU_CLOSE_CLIENTS(a, b);
    free(url);
}

/* =================================================================== names */

/* Every byte but NUL in a name: taken, inspected and listed as it is
 * (the table keeps it as bytea), and excluded from another client. */
TU_TEST_IN(shared, names_with_every_byte, 60)
{
    char name[256];
    for (int i = 1; i < 256; i++)
        name[i - 1] = (char)i;
    name[255] = '\0';
    char *url = url_of(&srv, NULL);
    dlock_client *a = open_url(url), *b = open_url(url);
    dlock_lock *la = tu_lock(a, name), *lb = tu_lock(b, name);
    EXPECT_RC(dlock_acquire(la, DLOCK_TRY), DLOCK_OK);
    EXPECT_RC(dlock_acquire(lb, DLOCK_TRY), DLOCK_EBUSY);
    ck_assert_int_eq(tu_held(b, name), 1);
    char **v = tu_list_names(b, NULL);
    ck_assert_uint_eq(tu_count_names(v), 1);
    ck_assert_msg(strcmp(v[0], name) == 0, "listed a different name");
    tu_free_names(v);
    EXPECT_RC(dlock_release(la), DLOCK_OK);
    EXPECT_RC(dlock_acquire(lb, DLOCK_TRY), DLOCK_OK);
    EXPECT_RC(dlock_release(lb), DLOCK_OK);
    TU_FREE_LOCKS(la, lb);
    TU_CLOSE_CLIENTS(a, b);
    free(url);
}

/* A numeric name is that advisory-lock key: an application's own
 * pg_advisory_lock(N) (here psql's) and dlock exclude each other, in
 * both key forms; inspect names the foreign holder and force release
 * ends its session. */
TU_TEST_IN(shared, numeric_names_join_advisory_locks, 60)
{
    long long key = 7000000000LL + getpid(); /* beyond int4: the bigint form */
    char *sql = tu_fmt("SELECT pg_advisory_lock(%lld); SELECT pg_sleep(120)", key);
    char *port = tu_fmt("%d", srv.port), *log = tu_fmt("%s/psql.log", srv.dir);
    const char *argv[] = {"psql", "-h",       srv.dir, "-p", port, "-U", "postgres",
                          "-d",   "postgres", "-X",    "-q", "-c", sql,  NULL};
    pid_t psql = tu_spawn(argv, log);
    char *url = pgf_url(&srv, NULL), *name = tu_fmt("%lld", key);
    dlock_client *c = open_url(url);
    dlock_lock *l = tu_lock(c, name);
    int rc = DLOCK_OK;
    for (int i = 0; i < 500; i++) { /* until psql holds it */
        if ((rc = dlock_acquire(l, DLOCK_TRY)) == DLOCK_EBUSY)
            break;
        EXPECT_RC(rc, DLOCK_OK);
        EXPECT_RC(dlock_release(l), DLOCK_OK);
        tu_sleep_ms(20);
    }
    EXPECT_RC(rc, DLOCK_EBUSY);
    dlock_info *info = NULL;
    EXPECT_RC(dlock_inspect(c, name, &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_held(info), 1);
    ck_assert_msg(strstr(dlock_info_holder(info, 0, NULL), "psql"), "holder %s",
                  dlock_info_holder(info, 0, NULL));
    dlock_info_free(info);
    /* force release ends psql's session (its own statement would sleep on) */
    EXPECT_RC(dlock_force_release(c, name), DLOCK_OK);
    EXPECT_RC(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
    tu_stop(psql, 5000);

    /* the two-int4 form, the other way round */
    int a = getpid() % 100000, b = 17;
    char *pair = tu_fmt("%d,%d", a, b), *out = NULL;
    dlock_lock *lp = tu_lock(c, pair);
    EXPECT_RC(dlock_acquire(lp, DLOCK_TRY), DLOCK_OK);
    char *try_sql = tu_fmt("SELECT pg_try_advisory_lock(%d, %d)", a, b);
    ck_assert_int_eq(pgf_psql(&srv, try_sql, &out), 0);
    ck_assert_msg(out[0] == 'f', "psql took the lock dlock holds: %s", out);
    free(out);
    EXPECT_RC(dlock_release(lp), DLOCK_OK);
    ck_assert_int_eq(pgf_psql(&srv, try_sql, &out), 0);
    ck_assert_msg(out[0] == 't', "psql could not take the released lock: %s", out);
    free(out);
    EXPECT_RC(dlock_release(l), DLOCK_OK);
    TU_FREE_LOCKS(l, lp);
    dlock_client_close(c);
    free(try_sql);
    free(pair);
    free(sql);
    free(port);
    free(log);
    free(url);
    free(name);
}

/* ================================================= layout=distributedlock */

/* The key .NET's DistributedLock.Postgres gives NAME, derived here as that
 * client does (its PostgresAdvisoryLockKey with hashing allowed), the
 * SHA-1 taken from the server (pgcrypto's digest): the lock functions'
 * arguments into ARGS. */
static void dotnet_key(const char *name, char *args, size_t size)
{
    size_t len = strlen(name);
    if (len <= 9) { /* 7-bit ASCII: packed, a 0 bit, then 1s */
        unsigned long long v = 0;
        for (size_t i = 0; i < len; i++)
            v = v << 7 | (unsigned char)name[i];
        v <<= 1;
        for (size_t i = len; i < 9; i++)
            v = v << 7 | 0x7f;
        snprintf(args, size, "(%lld)::int8", (long long)v);
        return;
    }
    if (len == 17 && name[8] == ',') { /* two 8-digit hex int4s */
        unsigned a = (unsigned)strtoul(name, NULL, 16), b = (unsigned)strtoul(name + 9, NULL, 16);
        snprintf(args, size, "%d, %d", (int)a, (int)b);
        return;
    }
    char *sql = tu_fmt("CREATE EXTENSION IF NOT EXISTS pgcrypto; SELECT encode(digest('%s', "
                       "'sha1'), 'hex')",
                       name),
         *out = NULL;
    ck_assert_int_eq(pgf_psql(&srv, sql, &out), 0);
    unsigned long long v = 0;
    for (int i = 7; i >= 0; i--) { /* the first 8 bytes, little endian */
        char byte[3] = {out[2 * i], out[2 * i + 1], 0};
        v = v << 8 | strtoul(byte, NULL, 16);
    }
    snprintf(args, size, "(%lld)::int8", (long long)v);
    free(sql);
    free(out);
}

/* With layout=distributedlock dlock takes the key the .NET client takes
 * for the same name -- a short ASCII name, a long one (hashed), the
 * "hex,hex" form -- so each excludes the other (the other client played
 * through psql with that key). */
TU_TEST_IN(shared, distributedlock_layout_keys, 60)
{
    char *url = pgf_url(&srv, "layout=distributedlock");
    dlock_client *c = open_url(url);
    char *names[] = {tu_fmt("job%d", (int)getpid() % 100000),
                     tu_fmt("a name longer than nine %d", (int)getpid()),
                     tu_fmt("%08x,0000000b", (unsigned)getpid())};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char args[64], *out = NULL;
        dotnet_key(names[i], args, sizeof args);
        dlock_lock *l = tu_lock(c, names[i]);
        EXPECT_RC(dlock_acquire(l, DLOCK_TRY), DLOCK_OK);
        char *try_sql = tu_fmt("SELECT pg_try_advisory_lock(%s)", args);
        ck_assert_int_eq(pgf_psql(&srv, try_sql, &out), 0);
        ck_assert_msg(out[0] == 'f', "'%s': the .NET key %s is not the one dlock holds", names[i],
                      args);
        free(out);
        EXPECT_RC(dlock_release(l), DLOCK_OK);
        ck_assert_int_eq(pgf_psql(&srv, try_sql, &out), 0);
        ck_assert_msg(out[0] == 't', "'%s': key %s still held", names[i], args);
        free(out);
        dlock_lock_free(l);
        free(try_sql);
        free(names[i]);
    }
    dlock_client_close(c);
    free(url);
}

/* ===================================================================== CLI */

/* dlock run on both schemes, hold + status + list while held. */
TU_TEST_IN(shared, cli_run_hold_status_list, 60)
{
    char *url = url_of(&srv, NULL), *alt = tu_fmt("postgresql%s", strchr(url, ':'));
    char *out = NULL, *err = NULL;
    const char *run[] = {"-u", url, "run", "-n", "job", "--", "true", NULL};
    ck_assert_msg(tu_dlock(&out, &err, NULL, run) == 0, "run: %s", err);
    free(out);
    free(err);
    const char *run2[] = {"-u", alt, "run", "-n", "job", "--", "sh", "-c", "echo $DLOCK_TOKEN",
                          NULL};
    ck_assert_msg(tu_dlock(&out, &err, NULL, run2) == 0, "run: %s", err);
    ck_assert_msg(strtoull(out, NULL, 10) > 0, "token: %s", out);
    free(out);
    free(err);
    /* hold in the background, then status and list see it */
    char *dir = tu_tmpdir("pg-cli"), *ready = tu_fmt("%s/ready", dir);
    char *script = tu_fmt("touch %s; sleep 60", ready);
    const char *hold[] = {tu_dlock_bin(), "-u", url,  "run",  "held-job",
                          "--",           "sh", "-c", script, NULL};
    char *log = tu_fmt("%s/hold.log", dir);
    pid_t pid = tu_spawn(hold, log);
    ck_assert_msg(tu_wait_file(ready, 30000), "dlock run never held");
    const char *status[] = {"-u", url, "status", "held-job", NULL};
    tu_dlock(&out, &err, NULL, status);
    ck_assert_msg(out && strstr(out, "held"), "status: %s %s", out, err);
    free(out);
    free(err);
    const char *list[] = {"-u", url, "list", NULL};
    ck_assert_int_eq(tu_dlock(&out, &err, NULL, list), 0);
    ck_assert_msg(strstr(out, "held-job"), "list: %s", out);
    free(out);
    free(err);
    tu_stop(pid, 5000);
    tu_rmrf(dir);
    free(dir);
    free(ready);
    free(script);
    free(log);
    free(alt);
    free(url);
}

/* ============================================================ semaphores */

/* A permit holder frozen with SIGSTOP: its session idles out one lease
 * after its last ping, the server frees its permit's key, and a waiter
 * (asleep on the semaphore's channel, which nobody notifies then) gets it
 * at its next look, with a greater token. */
TU_TEST_IN(shared, sigstopped_permit_holder_loses_permit, 90)
{
    char *url = url_of(&srv, "lease=1500ms"), *dir = tu_tmpdir("pg-sem-stop");
    pid_t pid = tu_fork();
    if (pid == 0) {
        dlock_client *c = NULL;
        dlock_semaphore *s = NULL;
        dlock_permit *p = NULL;
        uint64_t t = 0;
        if (dlock_open(url, &c) || dlock_semaphore_new(c, "frozen-sem", 1, 0, &s) ||
            dlock_semaphore_acquire(s, 1, 30000, NULL, &p) || dlock_permit_token(p, &t))
            _exit(1);
        char *path = tu_fmt("%s/held", dir), *text = tu_fmt("%" PRIu64, t);
        tu_write_marker(path, text);
        for (;;)
            pause();
    }
    uint64_t t1 = wait_held(dir);
    ck_assert_int_eq(kill(pid, SIGSTOP), 0);
    dlock_client *c = open_url(url);
    dlock_semaphore *s = tu_semaphore(c, "frozen-sem", 1);
    int64_t t0 = tu_mono_ms();
    dlock_permit *p = NULL;
    EXPECT_RC(dlock_semaphore_acquire(s, 1, 60000, NULL, &p), DLOCK_OK);
    int64_t took = tu_mono_ms() - t0;
    uint64_t t2 = 0;
    EXPECT_RC(dlock_permit_token(p, &t2), DLOCK_OK);
    ck_assert_msg(t2 > t1, "token %" PRIu64 " after the frozen holder's %" PRIu64, t2, t1);
    /* about one lease and a re-check; bounded generously for a loaded machine */
    ck_assert_msg(took < 30000, "the frozen holder kept its permit %lld ms", (long long)took);
    EXPECT_RC(dlock_permit_release(p), DLOCK_OK);
    dlock_semaphore_free(s);
    dlock_client_close(c);
    kill(pid, SIGKILL);
    tu_wait_exit(pid);
    tu_rmrf(dir);
    free(dir);
    free(url);
}

/* ============================================================ elections */

/* An observer of election NAME through C, in a thread: OBSERVE with the
 * leader KNOWN and a bound of WAIT_MS. */
struct observer_thread {
    dlock_client *c;
    const char *name;
    const dlock_leader *known;
    int64_t wait_ms;
    dlock_leader *next;
    atomic_int rc;
    atomic_long tid;
    pthread_t th;
};

static void *observer_main(void *arg)
{
    struct observer_thread *o = arg;
    atomic_store(&o->tid, (long)syscall(SYS_gettid));
    atomic_store(&o->rc,
                 dlock_election_observe(o->c, o->name, o->known, o->wait_ms, NULL, &o->next));
    return NULL;
}

/* A leader killed (kill -9) while nobody campaigns sends no notification
 * and leaves no successor: an observer asleep on the leader learns that
 * nobody leads from the watch key, which the server grants it the moment
 * the leader's session ends -- well before the observer's 5 s safety
 * look, so within a bound of 4 s (generous: the push takes milliseconds). */
TU_TEST_IN(shared, observer_learns_a_killed_leader_at_once, 60)
{
    char *url = url_of(&srv, "lease=30s"), *dir = tu_tmpdir("pg-elect-kill");
    pid_t pid = tu_fork();
    if (pid == 0) {
        dlock_client *c = NULL;
        dlock_election *e = NULL;
        if (dlock_open(url, &c) || dlock_election_new(c, "dies", 0, &e) ||
            dlock_election_campaign(e, "doomed", 30000, NULL))
            _exit(1);
        char *path = tu_fmt("%s/held", dir);
        tu_write_marker(path, "1");
        for (;;)
            pause();
    }
    wait_held(dir);
    dlock_client *c = open_url(url);
    dlock_leader *known = NULL;
    EXPECT_RC(dlock_election_leader(c, "dies", &known), DLOCK_OK);
    ck_assert_str_eq(dlock_leader_value(known), "doomed");
    struct observer_thread o = {.c = c, .name = "dies", .known = known, .wait_ms = 4000};
    atomic_store(&o.rc, 1);
    ck_assert_int_eq(pthread_create(&o.th, NULL, observer_main, &o), 0);
    ck_assert_msg(tu_wait_thread_asleep(&o.tid, 30000), "the observer never went to sleep");
    /* and it has looked: its session's last statement is the look, done */
    bool looked = false;
    for (int i = 0; i < 600 && !looked; i++) {
        char *out = NULL;
        pgf_psql(&srv,
                 "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'dlock %' "
                 "AND state = 'idle' AND query LIKE 'SELECT l.pid, coalesce%'",
                 &out);
        looked = out && atoi(out) > 0;
        free(out);
        if (!looked)
            tu_sleep_ms(50);
    }
    ck_assert_msg(looked, "the observer never looked");
    kill(pid, SIGKILL);
    tu_wait_exit(pid);
    pthread_join(o.th, NULL);
    EXPECT_RC(atomic_load(&o.rc), DLOCK_OK);
    ck_assert_int_eq(dlock_leader_held(o.next), 0);
    dlock_leader_free(o.next);
    dlock_leader_free(known);
    dlock_client_close(c);
    tu_rmrf(dir);
    free(dir);
    free(url);
}

/* A leader's session is renewed like a lock's: still the leader, able to
 * proclaim, several leases on (the sleep is the subject). */
TU_TEST_IN(shared, leader_session_renewed, 60)
{
    char *url = url_of(&srv, "lease=900ms");
    dlock_client *c = open_url(url);
    dlock_election *e = NULL;
    EXPECT_RC(dlock_election_new(c, "renewed", 0, &e), DLOCK_OK);
    EXPECT_RC(dlock_election_campaign(e, "one", DLOCK_TRY, NULL), DLOCK_OK);
    tu_sleep_ms(2500);
    ck_assert_int_gt(dlock_election_validity_ms(e), 0);
    EXPECT_RC(dlock_election_proclaim(e, "two"), DLOCK_OK);
    EXPECT_RC(dlock_election_resign(e), DLOCK_OK);
    dlock_election_free(e);
    dlock_client_close(c);
    free(url);
}

int main(void)
{
    return tu_main("postgres", NULL, NULL);
}
