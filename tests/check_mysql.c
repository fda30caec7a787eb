/* check_mysql.c -- the MySQL/MariaDB backend against a real mariadbd, for
 * what only it does (the lock contract runs on it in check_contract).
 *
 * One server for the binary's case (tests/lib/fixture_mysql.h), started
 * once; the restart test starts one of its own. Holders that are frozen
 * or killed are forked children with their own client: a real SIGSTOP,
 * a real SIGKILL. A relay (tests/lib/relay.h) cuts a holder off. No
 * timing assertion is tight: "within about one lease" is checked with a
 * generous bound.
 */
#include <check.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "contract.h" /* EXPECT_RC */
#include "dlock.h"
#include "fixture_mysql.h"
#include "relay.h"
#include "testutil.h"

static struct fx_mysql M;
static bool M_ok;

static void server_up(void)
{
    M_ok = fx_mysql_start(&M);
    if (!M_ok)
        fprintf(stderr, "fixture: %s\n", M.error);
}

static void server_down(void)
{
    fx_mysql_stop(&M);
}

TU_CASE(server, server_up, server_down, TU_AROUND_CASE)

/* The server's URL with QUERY (may be NULL) and a fresh prefix. */
static char *url_with(const char *query)
{
    ck_assert_msg(M_ok, "mariadbd did not start: %s", M.error);
    static int serial;
    return tu_fmt("%s?prefix=t%d-%d-%s%s", M.url, (int)getpid(), serial++, query ? "&" : "",
                  query ? query : "");
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A child that holds NAME on URL -- a lock, or with PERMITS one permit of
 * semaphore NAME of that many -- writes its token to DIR/held, and then
 * sleeps until killed. */
static pid_t fork_sleeping_holder(const char *url, const char *name, unsigned permits,
                                  const char *dir)
{
    pid_t pid = tu_fork();
    if (pid > 0)
        return pid;
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    if (dlock_open(url, &c) ||
        (permits ? dlock_lock_new_permits(c, name, permits, 0, &l)
                 : dlock_lock_new(c, name, DLOCK_EXCLUSIVE, 0, &l)) ||
        dlock_acquire(l, 30000))
        _exit(10);
    uint64_t t = 0;
    dlock_token(l, &t);
    char *path = tu_fmt("%s/held", dir), *text = tu_fmt("%" PRIu64 "\n", t);
    tu_write_marker(path, text);
    for (;;)
        pause();
}

/* A holder frozen (SIGSTOP) or killed (SIGKILL) with SIG: the next
 * holder gets the lock (with PERMITS, a permit of a semaphore of that
 * many, all of them held) within about one lease, with a greater token. */
static void holder_ends_with(int sig, const char *tag, unsigned permits)
{
    char *url = url_with("lease=2s");
    char *dir = tu_tmpdir(tag);
    pid_t pid = fork_sleeping_holder(url, "frozen", permits, dir);
    char *held = tu_fmt("%s/held", dir);
    ck_assert_msg(tu_wait_file(held, 30000), "the holder never held");
    uint64_t t1 = tu_read_u64(held);
    if (sig == SIGSTOP)
        tu_pause(pid);
    else
        kill(pid, sig);
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock(c, "frozen"), *others = NULL;
    if (permits) {
        dlock_lock_free(l);
        ck_assert_int_eq(dlock_lock_new_permits(c, "frozen", permits, 0, &l), 0);
        if (permits > 1) {
            /* the permits the frozen one left: held here meanwhile */
            ck_assert_int_eq(dlock_lock_new_permits(c, "frozen", permits, 0, &others), 0);
            TU_ACQUIRE_OK(others, DLOCK_TRY);
        }
        if (sig == SIGSTOP) /* a killed one's session ended at once */
            EXPECT_RC(dlock_acquire(l, DLOCK_TRY), DLOCK_EBUSY);
    }
    int64_t t0 = now_ms();
    TU_ACQUIRE_OK(l, 30000);
    int64_t took = now_ms() - t0;
    /* about one lease (2 s, whole seconds on the server); bound generous */
    ck_assert_msg(took < 20000, "the lock came back after %lld ms", (long long)took);
    uint64_t t2 = 0;
    dlock_token(l, &t2);
    ck_assert_msg(t2 > t1, "token %" PRIu64 " after %" PRIu64, t2, t1);
    TU_RELEASE_OK(l);
    if (others)
        TU_RELEASE_OK(others);
    kill(pid, SIGKILL);
    kill(pid, SIGCONT);
    tu_wait_exit(pid);
    dlock_lock_free(l);
    dlock_lock_free(others);
    dlock_client_close(c);
    tu_rmrf(dir);
    free(held);
    free(dir);
    free(url);
}

TU_TEST_IN(server, sigstopped_holder_loses_within_a_lease, 90)
{
    holder_ends_with(SIGSTOP, "mysql-stop", 0);
}

TU_TEST_IN(server, killed_holder_frees_the_lock, 90)
{
    holder_ends_with(SIGKILL, "mysql-kill", 0);
}

/* The same for a semaphore's permit: its session idles out, its permit
 * lock with it. */
TU_TEST_IN(server, sigstopped_permit_holder_loses_within_a_lease, 90)
{
    holder_ends_with(SIGSTOP, "mysql-sem-stop", 2);
}

TU_TEST_IN(server, killed_permit_holder_frees_the_permit, 90)
{
    holder_ends_with(SIGKILL, "mysql-sem-kill", 2);
}

/* A cancel ends a wait that sleeps in the server at once: the server's
 * process list no longer shows it (KILL QUERY), not only the client. */
TU_TEST_IN(server, cancel_ends_the_server_side_wait, 60)
{
    char *url = url_with(NULL);
    dlock_client *a = tu_open(url), *b = tu_open(url);
    dlock_lock *la = tu_lock(a, "c"), *lb = tu_lock(b, "c");
    TU_ACQUIRE_OK(la, DLOCK_TRY);
    struct tu_waiter w;
    tu_waiter_start(&w, lb, DLOCK_FOREVER);
    dlock_info *info = NULL;
    long waiters = 0;
    for (int i = 0; i < 1000 && waiters < 1; i++) {
        EXPECT_RC(dlock_inspect(a, "c", &info), DLOCK_OK);
        waiters = dlock_info_waiter_count(info);
        dlock_info_free(info);
        if (waiters < 1)
            tu_sleep_ms(20);
    }
    ck_assert_int_eq(waiters, 1);
    EXPECT_RC(dlock_lock_cancel(lb), DLOCK_OK);
    tu_waiter_join(&w);
    ck_assert_msg(w.rc == DLOCK_ECANCELED, "waiter: %s", dlock_err_name(w.rc));
    EXPECT_RC(dlock_inspect(a, "c", &info), DLOCK_OK);
    ck_assert_int_eq(dlock_info_waiter_count(info), 0); /* gone from the server */
    dlock_info_free(info);
    EXPECT_RC(dlock_acquire(lb, DLOCK_TRY), DLOCK_EBUSY);
    TU_RELEASE_OK(la);
    TU_ACQUIRE_OK(lb, DLOCK_TRY); /* the canceled wait took nothing */
    TU_RELEASE_OK(lb);
    TU_FREE_LOCKS(la, lb);
    TU_CLOSE_CLIENTS(a, b);
    free(url);
}

/* DIRECT (url_with()'s) through relay R instead. */
static char *via_relay(const struct tu_relay *r, const char *direct)
{
    return tu_fmt("mysql://root@127.0.0.1:%d/dlock%s", r->port, strchr(direct, '?'));
}

/* A holder cut off by the network (a relay that swallows everything):
 * its renewals go unanswered, it is told it lost the lock, and the server
 * ends its idle session, so another client gets the lock. */
TU_TEST_IN(server, relay_cut_holder, 90)
{
    struct tu_relay r;
    tu_relay_start(&r, M.port, TU_RELAY_PASS);
    char *direct = url_with("lease=2s");
    char *cut = via_relay(&r, direct);
    dlock_client *a = tu_open(cut), *b = tu_open(direct);
    dlock_lock *la = tu_lock(a, "cut"), *lb = tu_lock(b, "cut");
    struct tu_lost lost = {0};
    dlock_lock_on_lost(la, tu_on_lost, &lost);
    TU_ACQUIRE_OK(la, DLOCK_TRY);
    uint64_t t1 = 0, t2 = 0;
    dlock_token(la, &t1);
    tu_relay_set(&r, TU_RELAY_BLACKHOLE);
    TU_ACQUIRE_OK(lb, 30000);
    dlock_token(lb, &t2);
    ck_assert_msg(t2 > t1, "token %" PRIu64 " after %" PRIu64, t2, t1);
    ck_assert_msg(tu_wait_lost(&lost, 1, 30000), "the cut-off holder was never told");
    ck_assert_int_eq(dlock_validity_ms(la), 0);
    TU_RELEASE_OK(lb);
    EXPECT_RC(dlock_release(la), DLOCK_ELOST);
    TU_FREE_LOCKS(la, lb);
    TU_CLOSE_CLIENTS(a, b);
    tu_relay_stop(&r);
    free(cut);
    free(direct);
}

/* The name whose session stalled_one's relay freezes (its GET_LOCK
 * marks the connection). */
static const char *_Atomic stall_name;

static enum tu_relay_action mark_stalled(struct tu_relay *r, struct tu_relay_conn *c,
                                         const char *req, size_t len)
{
    (void)r;
    const char *name = atomic_load(&stall_name);
    if (name && memmem(req, len, "GET_LOCK", 8) && memmem(req, len, name, strlen(name)))
        c->marked = true;
    return TU_RELAY_FORWARD;
}

/* One round of stalled_renewal_loses_only_its_hold: a client through
 * the relay holds "renew-x" and "renew-y", the session of STALLED's
 * freezes (its renewal gets no reply), the other's flows. */
static void stall_one_of_two(const char *stalled)
{
    struct tu_relay r;
    tu_relay_start_with(&r, &(struct tu_relay_config){.target = M.port,
                                                      .freeze_marked = true,
                                                      .on_request = mark_stalled});
    atomic_store(&stall_name, stalled);
    char *direct = url_with("lease=3s&timeout=10s");
    char *via = via_relay(&r, direct);
    dlock_client *c = tu_open(via);
    dlock_lock *lx = tu_lock(c, "renew-x"), *ly = tu_lock(c, "renew-y");
    struct tu_lost lost_x = {0}, lost_y = {0};
    dlock_lock_on_lost(lx, tu_on_lost, &lost_x);
    dlock_lock_on_lost(ly, tu_on_lost, &lost_y);
    TU_ACQUIRE_OK(lx, DLOCK_TRY);
    TU_ACQUIRE_OK(ly, DLOCK_TRY);
    tu_relay_set(&r, TU_RELAY_FREEZE);
    bool x_stalls = strcmp(stalled, "renew-x") == 0;
    struct tu_lost *gone = x_stalls ? &lost_x : &lost_y, *kept = x_stalls ? &lost_y : &lost_x;
    dlock_lock *lkept = x_stalls ? ly : lx, *lgone = x_stalls ? lx : ly;
    ck_assert_msg(tu_wait_lost(gone, 1, 30000), "the stalled hold was never told lost");
    tu_sleep_ms(1500); /* a later renewal of the healthy one */
    ck_assert_msg(!tu_wait_lost(kept, 1, 0), "'%s' was lost with the stalled session: %s",
                  x_stalls ? "renew-y" : "renew-x", kept->why);
    ck_assert_int_gt(dlock_validity_ms(lkept), 0);
    tu_relay_set(&r, TU_RELAY_PASS);
    TU_RELEASE_OK(lkept);
    EXPECT_RC(dlock_release(lgone), DLOCK_ELOST);
    TU_FREE_LOCKS(lx, ly);
    dlock_client_close(c);
    tu_relay_stop(&r);
    atomic_store(&stall_name, NULL);
    free(via);
    free(direct);
}

/* The keeper renews both holds of a client in one batch, by the batch's
 * deadline. A session that stalls costs its own hold, not the others':
 * a healthy session renewed after it must still be confirmed (it was
 * closed and reported lost when the renewals went one after another on
 * one shared deadline). Which hold comes first in the batch is the
 * registry's order, so each of the two stalls in turn. */
TU_TEST_IN(server, stalled_renewal_loses_only_its_hold, 120)
{
    stall_one_of_two("renew-x");
    stall_one_of_two("renew-y");
}

/* A release whose RELEASE_LOCK gets no reply in time (the relay freezes
 * the server's stream) is a failure of the release -- DLOCK_ETIMEDOUT,
 * the session closed, which frees the lock when the server notices --
 * not DLOCK_ELOST: nothing says the hold was lost. */
TU_TEST_IN(server, release_without_reply_times_out, 60)
{
    struct tu_relay r;
    tu_relay_start(&r, M.port, TU_RELAY_PASS);
    char *direct = url_with("timeout=1s");
    char *via = via_relay(&r, direct);
    dlock_client *a = tu_open(via), *b = tu_open(direct);
    dlock_lock *la = tu_lock(a, "slow-release"), *lb = tu_lock(b, "slow-release");
    TU_ACQUIRE_OK(la, DLOCK_TRY);
    tu_relay_set(&r, TU_RELAY_FREEZE);
    EXPECT_RC(dlock_release(la), DLOCK_ETIMEDOUT);
    tu_relay_set(&r, TU_RELAY_PASS);
    TU_ACQUIRE_OK(lb, 30000); /* freed once the server saw the session close */
    TU_RELEASE_OK(lb);
    TU_FREE_LOCKS(la, lb);
    TU_CLOSE_CLIENTS(a, b);
    tu_relay_stop(&r);
    free(via);
    free(direct);
}

/* Credentials the server refuses, a database it does not have: one clear
 * error naming the thing. */
TU_TEST_IN(server, bad_credentials_and_missing_database, 60)
{
    ck_assert_msg(M_ok, "mariadbd did not start: %s", M.error);
    char *bad = tu_fmt("mysql://nobody:wrong@127.0.0.1:%d/dlock", M.port);
    dlock_client *c = NULL;
    EXPECT_RC(dlock_open(bad, &c), DLOCK_EAUTH);
    ck_assert_msg(strstr(dlock_errmsg(), "'nobody'") && strstr(dlock_errmsg(), "Access denied"),
                  "%s", dlock_errmsg());
    char *missing = tu_fmt("mysql://root@127.0.0.1:%d/no_such_db", M.port);
    EXPECT_RC(dlock_open(missing, &c), DLOCK_ENOENT);
    ck_assert_msg(strstr(dlock_errmsg(), "database 'no_such_db' does not exist"), "%s",
                  dlock_errmsg());
    char *nodb = tu_fmt("mysql://root@127.0.0.1:%d", M.port);
    EXPECT_RC(dlock_open(nodb, &c), DLOCK_EBADURL);
    free(nodb);
    free(missing);
    free(bad);
}

/* Names of every byte (1..255), alone and all in one long name that is
 * hashed: each a lock of its own, busy for another client, listed by its
 * own name. In batches: each hold is a server connection of its own
 * (max_connections is 151). */
TU_TEST_IN(server, names_with_every_byte, 90)
{
    char *url = url_with(NULL);
    dlock_client *a = tu_open(url), *b = tu_open(url);
    enum { N = 256, BATCH = 32 };
    char *names[N];
    char all[256];
    for (int i = 1; i < 256; i++) {
        names[i - 1] = tu_fmt("%c", i);
        all[i - 1] = (char)i;
    }
    all[255] = 0;
    names[N - 1] = tu_fmt("%s", all);
    for (int from = 0; from < N; from += BATCH) {
        dlock_lock *la[BATCH], *lb[BATCH];
        for (int i = from; i < from + BATCH; i++) {
            la[i - from] = tu_lock(a, names[i]);
            lb[i - from] = tu_lock(b, names[i]);
            ck_assert_msg(dlock_acquire(la[i - from], DLOCK_TRY) == DLOCK_OK, "name %d: %s", i,
                          dlock_errmsg());
        }
        for (int i = from; i < from + BATCH; i++)
            ck_assert_msg(dlock_acquire(lb[i - from], DLOCK_TRY) == DLOCK_EBUSY,
                          "name %d not busy: %s", i, dlock_errmsg());
        char **v = tu_list_names(a, NULL);
        for (int i = from; i < from + BATCH; i++)
            ck_assert_msg(tu_listed(v, names[i]), "list lost name %d", i);
        ck_assert_uint_eq(tu_count_names(v), BATCH);
        tu_free_names(v);
        for (int i = 0; i < BATCH; i++) {
            TU_RELEASE_OK(la[i]);
            dlock_lock_free(la[i]);
            dlock_lock_free(lb[i]);
        }
    }
    for (int i = 0; i < N; i++)
        free(names[i]);
    TU_CLOSE_CLIENTS(a, b);
    free(url);
}

static int count_name(const char *name, void *arg)
{
    (void)name;
    ++*(int *)arg;
    return 0;
}

/* A long (hashed) semaphore name's permit taken on a pooled session that
 * held a long lock name before: `dlock list` of the locks does not show
 * the lock given back, and the semaphores' list shows the semaphore. */
TU_TEST_IN(server, hashed_permit_on_a_reused_session_is_no_lock, 60)
{
    char *url = url_with(NULL);
    dlock_client *c = tu_open(url);
    char lock_name[81], sem_name[81];
    memset(lock_name, 'L', 80);
    memset(sem_name, 'S', 80);
    lock_name[80] = sem_name[80] = 0;
    dlock_lock *l = tu_lock(c, lock_name);
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    TU_RELEASE_OK(l); /* its session goes back to the pool */
    dlock_semaphore *s = tu_semaphore(c, sem_name, 2);
    dlock_permit *p = tu_permit(s, 1, DLOCK_TRY); /* on that session */
    int locks = 0, sems = 0;
    EXPECT_RC(dlock_list(c, NULL, count_name, &locks), DLOCK_OK);
    EXPECT_RC(dlock_semaphore_list(c, "SSS*", count_name, &sems), DLOCK_OK);
    ck_assert_msg(locks == 0, "%d locks listed while only a permit is held", locks);
    ck_assert_int_eq(sems, 1);
    EXPECT_RC(dlock_permit_release(p), DLOCK_OK);
    dlock_semaphore_free(s);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(url);
}

/* force-release by a user the server does not let KILL the holder:
 * DLOCK_EACCES with the server's words; list with the instrument off:
 * DLOCK_ENOTSUP naming it. */
TU_TEST_IN(server, force_release_refused_and_list_off, 60)
{
    char *url = url_with(NULL);
    char *out = fx_mysql_sql(&M, "CREATE USER IF NOT EXISTS 'weak'@'127.0.0.1' IDENTIFIED BY "
                                 "'weakpw'; GRANT SELECT ON dlock.* TO 'weak'@'127.0.0.1'");
    ck_assert_msg(out, "could not create the user");
    free(out);
    dlock_client *a = tu_open(url);
    dlock_lock *l = tu_lock(a, "kept");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    char *weak = tu_fmt("mysql://weak:weakpw@127.0.0.1:%d/dlock%s", M.port, strchr(url, '?'));
    dlock_client *w = tu_open(weak);
    EXPECT_RC(dlock_force_release(w, "kept"), DLOCK_EACCES);
    ck_assert_msg(strstr(dlock_errmsg(), "not owner"), "%s", dlock_errmsg());
    ck_assert_int_gt(dlock_validity_ms(l), 0);
    out = fx_mysql_sql(&M, "UPDATE performance_schema.setup_instruments SET ENABLED = 'NO' "
                           "WHERE NAME = 'wait/lock/metadata/sql/mdl'");
    free(out);
    int n = 0;
    EXPECT_RC(dlock_list(a, NULL, count_name, &n), DLOCK_ENOTSUP);
    ck_assert_msg(strstr(dlock_errmsg(), "wait/lock/metadata/sql/mdl"), "%s", dlock_errmsg());
    out = fx_mysql_sql(&M, "UPDATE performance_schema.setup_instruments SET ENABLED = 'YES' "
                           "WHERE NAME = 'wait/lock/metadata/sql/mdl'");
    free(out);
    TU_RELEASE_OK(l);
    dlock_lock_free(l);
    TU_CLOSE_CLIENTS(a, w);
    free(weak);
    free(url);
}

/* A server whose sessions start with autocommit off (SET GLOBAL, or a
 * user's init_connect): dlock's sessions still commit what they write,
 * so a holder's session that ends rolls back no token -- two holders in
 * turn never share one. */
TU_TEST_IN(server, autocommit_off_by_default_tokens_stay_unique, 60)
{
    char *url = url_with(NULL);
    free(fx_mysql_sql(&M, "SET GLOBAL autocommit = 0"));
    dlock_client *a = tu_open(url);
    dlock_lock *la = tu_lock(a, "ac");
    TU_ACQUIRE_OK(la, DLOCK_TRY);
    uint64_t t1 = 0, t2 = 0;
    dlock_token(la, &t1);
    TU_RELEASE_OK(la);
    dlock_lock_free(la);
    dlock_client_close(a); /* its sessions end */
    dlock_client *b = tu_open(url);
    dlock_lock *lb = tu_lock(b, "ac");
    TU_ACQUIRE_OK(lb, 20000);
    dlock_token(lb, &t2);
    TU_RELEASE_OK(lb);
    dlock_lock_free(lb);
    dlock_client_close(b);
    free(fx_mysql_sql(&M, "SET GLOBAL autocommit = 1"));
    ck_assert_msg(t2 > t1, "token %llu after %llu", (unsigned long long)t2, (unsigned long long)t1);
    free(url);
}

/* The CLI: run, hold, status, list. */
TU_TEST_IN(server, cli_run_hold_status_list, 90)
{
    char *url = url_with(NULL);
    char *out = NULL, *err = NULL;
    ck_assert_int_eq(TU_DLOCK(NULL, &err, NULL, "-u", url, "run", "-n", "job", "--", "true"), 0);
    free(err);
    char *inner = tu_fmt("%s -u '%s' status job && %s -u '%s' list && %s -u '%s' run -n job -- "
                         "true; echo busy=$?",
                         tu_dlock_bin(), url, tu_dlock_bin(), url, tu_dlock_bin(), url);
    ck_assert_int_eq(TU_DLOCK(&out, NULL, NULL, "-u", url, "run", "-n", "job", "--", "sh", "-c",
                              inner),
                     0);
    ck_assert_msg(strstr(out, "held (exclusive)") && strstr(out, "token:") &&
                      strstr(out, "\njob\n") && strstr(out, "busy=1"),
                  "%s", out);
    free(out);
    free(inner);
    /* hold: one line once held, released when stdin ends */
    char *hold = tu_fmt("echo | %s -u '%s' hold job", tu_dlock_bin(), url);
    const char *sh[] = {"sh", "-c", hold, NULL};
    ck_assert_int_eq(tu_run(sh, NULL, &out, NULL), 0);
    ck_assert_msg(strstr(out, "token=") && strstr(out, "name=job"), "%s", out);
    free(out);
    free(hold);
    free(url);
}

/* The CLI on the other primitives: run --permits N, run -m (a multi-lock,
 * member by member), elect (its command runs while leading) and leader
 * (what observers read). */
TU_TEST_IN(server, cli_permits_multi_elect, 90)
{
    char *url = url_with(NULL);
    const char *bin = tu_dlock_bin();
    char *out = NULL;
    char *inner = tu_fmt("%s -u '%s' run -n --permits 2 pool -- true; echo second=$?; %s -u '%s' "
                         "run -n --permits 1 pool -- true; echo count=$?",
                         bin, url, bin, url);
    ck_assert_int_eq(TU_DLOCK(&out, NULL, NULL, "-u", url, "run", "-n", "--permits", "2", "pool",
                              "--", "sh", "-c", inner),
                     0);
    /* two permits: the second run holds the other; another count: 78 */
    ck_assert_msg(strstr(out, "second=0") && strstr(out, "count=78"), "%s", out);
    free(out);
    free(inner);
    inner = tu_fmt("%s -u '%s' run -n b -- true; echo b=$?; %s -u '%s' run -n c -- true; echo "
                   "c=$?",
                   bin, url, bin, url);
    ck_assert_int_eq(TU_DLOCK(&out, NULL, NULL, "-u", url, "run", "-n", "-m", "b", "a", "--", "sh",
                              "-c", inner),
                     0);
    ck_assert_msg(strstr(out, "b=1") && strstr(out, "c=0"), "%s", out);
    free(out);
    free(inner);
    ck_assert_int_eq(TU_DLOCK(NULL, NULL, NULL, "-u", url, "run", "-n", "-m", "a", "b", "--",
                              "true"),
                     0);
    inner = tu_fmt("%s -u '%s' leader lead; %s -u '%s' elect -n lead -- true; echo second=$?", bin,
                   url, bin, url);
    ck_assert_int_eq(TU_DLOCK(&out, NULL, NULL, "-u", url, "elect", "--value", "me", "lead", "--",
                              "sh", "-c", inner),
                     0);
    ck_assert_msg(strstr(out, "value=me") && strstr(out, "second=1"), "%s", out);
    free(out);
    free(inner);
    ck_assert_int_eq(TU_DLOCK(NULL, NULL, NULL, "-u", url, "leader", "lead"), 1);
    free(url);
}

/* The token of one hold and release of NAME on C. */
static uint64_t token_of_a_hold(dlock_client *c, const char *name)
{
    dlock_lock *l = tu_lock(c, name);
    TU_ACQUIRE_OK(l, 30000);
    uint64_t t = 0;
    dlock_token(l, &t);
    TU_RELEASE_OK(l);
    dlock_lock_free(l);
    return t;
}

/* The token's epoch and base are a MEMORY row; losing it (what a restart
 * does, or a hand while no dlock session is connected: a session keeps
 * the epoch it saw, docs/protocol-mysql.md) starts a new, greater epoch
 * -- the token's high 24 bits. */
TU_TEST_IN(server, lost_fence_row_starts_a_new_epoch, 60)
{
    char *url = url_with(NULL);
    dlock_client *c = tu_open(url);
    uint64_t t1 = token_of_a_hold(c, "e");
    uint64_t t2 = token_of_a_hold(c, "e");
    ck_assert_msg(t2 > t1 && t2 >> 40 == t1 >> 40,
                  "token %" PRIu64 " after %" PRIu64 " in one epoch", t2, t1);
    dlock_client_close(c);
    char *out = fx_mysql_sql(&M, "DELETE FROM dlock.dlock_fence_base");
    ck_assert_msg(out, "DELETE FROM dlock_fence_base failed");
    free(out);
    c = tu_open(url);
    uint64_t t3 = token_of_a_hold(c, "e");
    ck_assert_msg(t3 > t2 && t3 >> 40 > t2 >> 40,
                  "token %" PRIu64 " after the row was lost, %" PRIu64 " before", t3, t2);
    dlock_client_close(c);
    free(url);
}

/* A waiter's acquire statement that sleeps in GET_LOCK for "epoch-x". */
static void *wait_for_epoch_x(void *arg)
{
    dlock_lock *l = arg;
    intptr_t rc = dlock_acquire(l, 60000);
    if (rc == DLOCK_OK)
        dlock_release(l);
    return (void *)rc;
}

/* Another name's acquire starts the epoch (the row was emptied) while a
 * waiter sleeps in GET_LOCK: the epoch's REPLACE into the MEMORY row must
 * not queue behind the waiter's statement (which holds the table's read
 * lock for as long as it sleeps), nor may a contended name stop every
 * acquire of the database from getting a token. */
TU_TEST_IN(server, new_epoch_not_stalled_by_a_waiter, 90)
{
    char *url = url_with("timeout=2s");
    dlock_client *a = tu_open(url), *w = tu_open(url), *b = tu_open(url);
    dlock_lock *la = tu_lock(a, "epoch-x"), *lw = tu_lock(w, "epoch-x"),
               *lb = tu_lock(b, "epoch-y");
    TU_ACQUIRE_OK(la, DLOCK_TRY);
    char *out = fx_mysql_sql(&M, "DELETE FROM dlock.dlock_fence_base");
    ck_assert_msg(out, "DELETE FROM dlock_fence_base failed");
    free(out);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, wait_for_epoch_x, lw), 0);
    for (int i = 0; i < 600; i++) { /* the waiter's statement sleeps in GET_LOCK */
        out = fx_mysql_sql(&M, "SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                               "WHERE INFO LIKE '%/*dlock-wait:%' AND STATE = 'User lock'");
        bool sleeping = out && atoi(out) > 0;
        free(out);
        if (sleeping)
            break;
        usleep(50 * 1000);
    }
    int rc = dlock_acquire(lb, DLOCK_TRY);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", dlock_errmsg());
    TU_RELEASE_OK(la);
    void *wrc;
    pthread_join(t, &wrc);
    ck_assert_msg(rc == DLOCK_OK, "an acquire of another name beside a waiter: %d %s", rc, msg);
    TU_RELEASE_OK(lb);
    ck_assert_msg((intptr_t)wrc == DLOCK_OK, "the waiter: %d", (int)(intptr_t)wrc);
    TU_FREE_LOCKS(la, lw, lb);
    TU_CLOSE_CLIENTS(a, w, b);
    free(url);
}

/* A try-once acquire, its code returned. */
static void *try_epoch_kept(void *arg)
{
    return (void *)(intptr_t)dlock_acquire(arg, DLOCK_TRY);
}

/* A grant whose fencing token could not be had (the wait for the epoch's
 * internal lock ended without it: here a session holds it by hand and
 * the wait is killed) fails the acquire, and the session that was
 * granted the name must not go back to the pool holding it: the name is
 * free afterwards. */
TU_TEST_IN(server, failed_epoch_start_keeps_no_name_held, 60)
{
    char *url = url_with("timeout=20s");
    dlock_client *a = tu_open(url);
    token_of_a_hold(a, "epoch-kept");
    dlock_client_close(a); /* its session kept the epoch */
    char *out = fx_mysql_sql(&M, "DELETE FROM dlock.dlock_fence_base");
    ck_assert_msg(out, "DELETE FROM dlock_fence_base failed");
    free(out);
    a = tu_open(url);
    dlock_client *b = tu_open(url);
    dlock_lock *la = tu_lock(a, "epoch-kept"), *lb = tu_lock(b, "epoch-kept");
    char *cmd = tu_fmt("mariadb --no-defaults -uroot --socket=%s -e \"DO GET_LOCK('%%epoch', 0); "
                       "DO SLEEP(15)\" >/dev/null 2>&1 &",
                       M.sock);
    ck_assert_int_eq(system(cmd), 0);
    free(cmd);
    for (int i = 0; i < 600; i++) { /* the hand's session holds '%epoch' */
        out = fx_mysql_sql(&M, "SELECT IS_USED_LOCK('%epoch') IS NOT NULL");
        bool held = out && atoi(out) == 1;
        free(out);
        if (held)
            break;
        usleep(50 * 1000);
    }
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, try_epoch_kept, la), 0);
    bool killed = false;
    for (int i = 0; i < 600 && !killed; i++) { /* end A's wait for '%epoch' */
        out = fx_mysql_sql(&M, "SELECT ID FROM information_schema.PROCESSLIST WHERE INFO LIKE "
                               "'SELECT GET_LOCK(''\\%epoch''%' AND STATE = 'User lock'");
        if (out && atoi(out) > 0) {
            char *kill = tu_fmt("KILL QUERY %d", atoi(out));
            char *k = fx_mysql_sql(&M, kill);
            killed = k != NULL;
            free(k);
            free(kill);
        }
        free(out);
        if (!killed)
            usleep(50 * 1000);
    }
    void *rc;
    pthread_join(t, &rc);
    ck_assert_msg(killed, "no wait for '%%epoch' seen");
    ck_assert_msg((intptr_t)rc != DLOCK_OK, "acquired with the epoch's lock held by hand");
    out = fx_mysql_sql(&M, "SELECT IS_USED_LOCK('%epoch')"); /* the hand lets it go */
    char *kill = tu_fmt("KILL %d", out ? atoi(out) : 0);
    free(out);
    out = fx_mysql_sql(&M, kill);
    ck_assert_msg(out, "%s failed", kill);
    free(out);
    free(kill);
    int got = dlock_acquire(lb, DLOCK_TRY);
    ck_assert_msg(got == DLOCK_OK, "the name after a failed epoch start: %d %s", got,
                  dlock_errmsg());
    TU_RELEASE_OK(lb);
    TU_FREE_LOCKS(la, lb);
    TU_CLOSE_CLIENTS(a, b);
    free(url);
}

/* The server's global counters NAMES (a comma-separated list of
 * GLOBAL_STATUS names, upper case), summed. Reading them writes no row
 * and is one statement. */
static uint64_t status_sum(const char *names)
{
    char *sql = tu_fmt("SELECT SUM(VARIABLE_VALUE) FROM information_schema.GLOBAL_STATUS "
                       "WHERE FIND_IN_SET(VARIABLE_NAME, '%s')",
                       names);
    char *out = fx_mysql_sql(&M, sql);
    ck_assert_msg(out, "%s failed", sql);
    uint64_t v = strtoull(out, NULL, 10);
    free(out);
    free(sql);
    return v;
}

/* An uncontended acquire and release is one statement each, as GET_LOCK
 * and RELEASE_LOCK alone are, and writes no row: the token's source is
 * read, not written (once the server lifetime's epoch exists). Counted
 * by the server over 20 pairs; the counters' reader's own statements
 * are measured first, with no pair between two reads. */
TU_TEST_IN(server, uncontended_pair_is_two_statements_no_write, 60)
{
    char *url = url_with(NULL);
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock(c, "two-statements");
    TU_ACQUIRE_OK(l, DLOCK_TRY); /* the lifetime's epoch, if this is the first */
    TU_RELEASE_OK(l);
    const char *writes = "HANDLER_WRITE,HANDLER_UPDATE,HANDLER_DELETE";
    uint64_t q0 = status_sum("QUESTIONS"), q1 = status_sum("QUESTIONS");
    uint64_t w0 = status_sum(writes);
    for (int i = 0; i < 20; i++) {
        TU_ACQUIRE_OK(l, DLOCK_TRY);
        TU_RELEASE_OK(l);
    }
    uint64_t w1 = status_sum(writes), q2 = status_sum("QUESTIONS");
    uint64_t reader = q1 - q0, statements = q2 - q1 - 3 * reader; /* w0, w1, q2 */
    ck_assert_msg(statements == 40 && w1 == w0,
                  "20 pairs made %" PRIu64 " statements and %" PRIu64
                  " row writes (40 and 0 expected)",
                  statements, w1 - w0);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(url);
}

/* A session that took a token keeps its server lifetime's epoch and
 * base: its later acquires read UUID_SHORT() alone and open no table
 * (the MEMORY row is read once per session). Counted by the server's
 * table locks over 20 pairs, the counters' reader's own measured first. */
TU_TEST_IN(server, cached_epoch_pair_opens_no_table, 60)
{
    char *url = url_with(NULL);
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock(c, "no-table");
    TU_ACQUIRE_OK(l, DLOCK_TRY); /* the session's first token reads the row */
    TU_RELEASE_OK(l);
    const char *locks = "TABLE_LOCKS_IMMEDIATE,TABLE_LOCKS_WAITED";
    uint64_t t0 = status_sum(locks), t1 = status_sum(locks);
    for (int i = 0; i < 20; i++) {
        TU_ACQUIRE_OK(l, DLOCK_TRY);
        TU_RELEASE_OK(l);
    }
    uint64_t t2 = status_sum(locks);
    uint64_t reader = t1 - t0, opened = t2 - t1 - reader;
    ck_assert_msg(opened == 0, "20 pairs on one session took %" PRIu64 " table locks (0 expected)",
                  opened);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(url);
}

/* An epoch is committed before its tokens are handed out, even on a
 * server whose sessions start with autocommit off: another session sees
 * it at once (else a restart, or the session's end, would roll it back
 * and the epoch would be used again). */
TU_TEST_IN(server, new_epoch_committed_with_autocommit_off, 60)
{
    char *url = url_with(NULL);
    free(fx_mysql_sql(&M, "SET GLOBAL autocommit = 0"));
    free(fx_mysql_sql(&M, "DELETE FROM dlock.dlock_fence_base"));
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock(c, "ac-epoch");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    uint64_t t = 0;
    dlock_token(l, &t);
    char *out = fx_mysql_sql(&M, "SELECT n FROM dlock.dlock_epoch WHERE id = 1");
    free(fx_mysql_sql(&M, "SET GLOBAL autocommit = 1"));
    ck_assert_msg(out, "SELECT FROM dlock_epoch failed");
    uint64_t epoch = strtoull(out, NULL, 10);
    free(out);
    ck_assert_msg(epoch == t >> 40, "epoch %" PRIu64 " seen by another session, token %" PRIu64,
                  epoch, t);
    TU_RELEASE_OK(l);
    dlock_lock_free(l);
    dlock_client_close(c);
    free(url);
}

/* ------------------------------------------------ a server of its own */

/* A database the one-counter release used: its counter is read once, and
 * the first epoch starts past its tokens. A restart (SIGKILL) between two
 * holds loses the MEMORY row; the next token is in a greater epoch. */
TU_TEST(restart_between_holds_starts_a_new_epoch, 120)
{
    struct fx_mysql own;
    ck_assert_msg(fx_mysql_start(&own), "%s", own.error);
    uint64_t old_token = (UINT64_C(3) << 40) + 5;
    char *sql =
        tu_fmt("CREATE TABLE dlock.dlock_fence (id TINYINT PRIMARY KEY, n BIGINT UNSIGNED "
               "NOT NULL) ENGINE=InnoDB; INSERT INTO dlock.dlock_fence VALUES (1, %" PRIu64 ")",
               old_token);
    char *out = fx_mysql_sql(&own, sql);
    ck_assert_msg(out, "%s failed", sql);
    free(out);
    free(sql);
    dlock_client *a = tu_open(own.url);
    uint64_t t1 = token_of_a_hold(a, "r");
    ck_assert_msg(t1 > old_token, "token %" PRIu64 " after the old counter's %" PRIu64, t1,
                  old_token);
    for (int i = 0; i < 3; i++)
        t1 = token_of_a_hold(a, "r");
    dlock_client_close(a);
    ck_assert_msg(fx_mysql_restart(&own), "%s", own.error);
    dlock_client *b = tu_open(own.url);
    uint64_t t2 = token_of_a_hold(b, "r");
    ck_assert_msg(t2 > t1 && t2 >> 40 > t1 >> 40,
                  "token %" PRIu64 " after the restart, %" PRIu64 " before", t2, t1);
    dlock_client_close(b);
    fx_mysql_stop(&own);
}

/* ------------------------------------------------ a server of its own */

/* The server restarts (a crash) under a holder: the holder is told it
 * lost the lock, and the next holder's token is greater -- the epoch
 * is durable. */
TU_TEST(server_restart_token_grows, 120)
{
    struct fx_mysql own;
    ck_assert_msg(fx_mysql_start(&own), "%s", own.error);
    char *url = tu_fmt("%s?lease=2s", own.url);
    dlock_client *a = tu_open(url);
    dlock_lock *l = tu_lock(a, "r");
    struct tu_lost lost = {0};
    dlock_lock_on_lost(l, tu_on_lost, &lost);
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    uint64_t t1 = 0, t2 = 0;
    dlock_token(l, &t1);
    ck_assert_msg(fx_mysql_restart(&own), "%s", own.error);
    ck_assert_msg(tu_wait_lost(&lost, 1, 30000), "the holder was never told");
    EXPECT_RC(dlock_release(l), DLOCK_ELOST);
    dlock_client *b = tu_open(url);
    dlock_lock *l2 = tu_lock(b, "r");
    TU_ACQUIRE_OK(l2, 30000);
    dlock_token(l2, &t2);
    ck_assert_msg(t2 > t1, "token %" PRIu64 " after the restart, %" PRIu64 " before", t2, t1);
    TU_RELEASE_OK(l2);
    TU_FREE_LOCKS(l, l2);
    TU_CLOSE_CLIENTS(a, b);
    fx_mysql_stop(&own);
    free(url);
}

#define GALERA_PROVIDER "/usr/lib/galera/libgalera_smm.so" /* Debian's galera-4 */

/* A Galera node (wsrep_on=ON: a one-node cluster bootstrapped on free
 * loopback ports, its group port included) is refused at open with
 * DLOCK_ENOTSUP naming Galera: it does not replicate GET_LOCK's locks. */
TU_TEST(galera_node_refused, 90)
{
    ck_assert_msg(access(GALERA_PROVIDER, R_OK) == 0,
                  "%s missing: install galera-4 (scripts/install-deps.sh)", GALERA_PROVIDER);
    int group = tu_free_port(), ist = tu_free_port(), sst = tu_free_port();
    char *options = tu_fmt("--wsrep_provider_options=gmcast.listen_addr=tcp://127.0.0.1:%d;"
                           "ist.recv_addr=127.0.0.1:%d",
                           group, ist);
    char *sst_addr = tu_fmt("--wsrep_sst_receive_address=127.0.0.1:%d", sst);
    const char *const extra[] = {"--wsrep_on=ON",
                                 "--wsrep_provider=" GALERA_PROVIDER,
                                 "--wsrep_cluster_address=gcomm://",
                                 "--wsrep_node_address=127.0.0.1",
                                 "--binlog_format=ROW",
                                 "--innodb_autoinc_lock_mode=2",
                                 options,
                                 sst_addr,
                                 NULL};
    struct fx_mysql own;
    ck_assert_msg(fx_mysql_start_with(&own, extra), "%s", own.error);
    char *on = fx_mysql_sql(&own, "SELECT @@wsrep_on");
    ck_assert_msg(on && atoi(on) == 1, "wsrep_on is %s", on ? on : "(no answer)");
    free(on);
    dlock_client *c = NULL;
    EXPECT_RC(dlock_open(own.url, &c), DLOCK_ENOTSUP);
    ck_assert_msg(strstr(dlock_errmsg(), "Galera") && strstr(dlock_errmsg(), "wsrep_on=ON"), "%s",
                  dlock_errmsg());
    fx_mysql_stop(&own);
    free(sst_addr);
    free(options);
}

/* Tokens of holds taken in turn by two clients (two sessions, each
 * keeping its epoch), ROUNDS times, each checked greater than *LAST. */
static void interleave(dlock_client *a, dlock_client *b, int rounds, uint64_t *last)
{
    for (int i = 0; i < 2 * rounds; i++) {
        uint64_t t = token_of_a_hold(i % 2 ? b : a, "turns");
        ck_assert_msg(t > *last, "token %" PRIu64 " after %" PRIu64 " (hold %d)", t, *last, i);
        *last = t;
    }
}

/* After a restart C's idle pooled session is dead and is not checked
 * before reuse: its next acquire may fail once with DLOCK_ECONN (a lost
 * connection, the session dropped), and the call after dials anew
 * (docs/protocol-mysql.md: a retry on a fresh session is not built). */
static void drop_dead_pooled_session(dlock_client *c)
{
    dlock_lock *l = tu_lock(c, "after-restart");
    int rc = dlock_acquire(l, 30000);
    ck_assert_msg(rc == DLOCK_OK || rc == DLOCK_ECONN, "%s: %s", dlock_strerror(rc),
                  dlock_errmsg());
    if (rc == DLOCK_OK)
        TU_RELEASE_OK(l);
    dlock_lock_free(l);
}

/* Two clients' sessions take the name in turn, a restart ends both
 * sessions (and the epoch's row) between two series, and the clients go
 * on: every token is greater than the one before, across the sessions
 * and across the restart, whose tokens are of a greater epoch. */
TU_TEST(interleaved_sessions_tokens_grow_across_a_restart, 120)
{
    struct fx_mysql own;
    ck_assert_msg(fx_mysql_start(&own), "%s", own.error);
    char *url = tu_fmt("%s?lease=2s", own.url);
    dlock_client *a = tu_open(url), *b = tu_open(url);
    uint64_t last = 0;
    interleave(a, b, 5, &last);
    uint64_t before = last;
    ck_assert_msg(fx_mysql_restart(&own), "%s", own.error);
    drop_dead_pooled_session(a);
    drop_dead_pooled_session(b);
    interleave(a, b, 5, &last);
    ck_assert_msg(last >> 40 > before >> 40, "epoch %" PRIu64 " after the restart, %" PRIu64,
                  last >> 40, before >> 40);
    TU_CLOSE_CLIENTS(a, b);
    fx_mysql_stop(&own);
    free(url);
}

int main(void)
{
    return tu_main("mysql", NULL, NULL);
}
