/* check_chaos.c -- the short fixed-seed run of the fault harness that
 * `make check` runs: every backend (file, redis in both layouts,
 * redis+sentinel:// without sync, with ?sync=1 and with ?sync=2 -- every
 * replica of the two --, redlock, etcd, zk, postgres, mysql; a Redis semaphore through
 * data-losing restarts; the file backend's elections, a value file's
 * byte held by another process among their faults) through each of its
 * faults for a couple of
 * seconds, asserting only what each URL form promises whatever the
 * timing (each test's name says it, and the table's "promises:" line):
 * no overlap the fenced store accepted (file, etcd, zk, postgres, mysql, redlock,
 * Sentinel with sync=<every replica>), no token regression and no lost
 * update (all but Sentinel with fewer replicas synced), no repeated
 * semaphore token, no dlock call that hung (all). Sentinel without sync
 * and with sync=1 of two replicas lose holds and tokens at a failover,
 * by design (docs/protocol-redis.md, "Replica sync"): their overlaps are
 * measured and printed, not asserted. The counts are printed (a loaded
 * machine changes them); docs/safety.md has the long runs.
 * The two measured Sentinel runs assert only that nothing hung: they are
 * a long schedule (make check-long), out of `make check`.
 * CHAOS_SEED and CHAOS_SECONDS replay another schedule;
 * DLOCK_SKIP_FIXTURES leaves backends out.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "chaos.h"
#include "testutil.h"

/* BACKEND for SECONDS through the faults ONLY ("none,partition"; NULL:
 * all of its faults). */
static void run_faults(const char *backend, int seconds, const char *only)
{
    const char *seed = getenv("CHAOS_SEED"), *secs = getenv("CHAOS_SECONDS");
    struct chaos_config cfg = {
        .backend = backend,
        .seed = seed ? strtoull(seed, NULL, 0) : 13,
        .duration_s = secs ? atoi(secs) : seconds,
        .lease_ms = 1000,
        .only = only,
        .log = stdout,
    };
    struct chaos_result res;
    bool made = chaos_run(&cfg, &res);
    chaos_print_table(stdout, &res);
    fflush(stdout);
    ck_assert_msg(made, "chaos %s: %s", backend, res.error);
    char why[256];
    ck_assert_msg(chaos_safe(&res, why, sizeof why), "chaos %s seed %llu: %s (it promises %s)",
                  backend, (unsigned long long)res.seed, why, res.promise);
    /* the run did work: a harness that measured nothing proves nothing */
    ck_assert_msg(res.total.writes > 0, "chaos %s: no write reached the store", backend);
}

static void run_backend(const char *backend, int seconds)
{
    run_faults(backend, seconds, NULL);
}

TU_TEST(file, 60)
{
    run_backend("file", 6);
}

/* Elections on the file backend, with another process holding the lock
 * byte of a value file for 4-5 leases at a time (issue 22, item 3): no
 * campaign or leader read may outlast its own bound (the workers report
 * one that does as a hang). */
TU_TEST(file_election, 60)
{
    run_backend("file-election", 18);
}

TU_TEST(redis, 120)
{
    run_backend("redis", 20);
}

TU_TEST(redis_simple, 120)
{
    run_backend("redis-simple", 20);
}

/* A semaphore (one permit a name) through restarts that lose the data:
 * its tokens must never go back nor repeat (they began again at 1). */
TU_TEST(redis_semaphore, 120)
{
    run_faults("redis-sem", 12, "none,worker-kill,server-restart-empty");
}

/* redis+sentinel:// without sync: only no hang is asserted */
TU_TEST(sentinel_nosync_measured, 120)
{
    run_backend("sentinel", 20);
}

/* ?sync=1 with two replicas: a failover may promote the replica that did
 * not acknowledge (CI once saw seed 13 accept an overlap so): no hang is
 * asserted, the rest measured */
TU_TEST(sentinel_sync1_of_2_measured, 120)
{
    run_backend("sentinel-sync", 20);
}

/* ?sync=2, every replica: no accepted overlap, no token regression */
TU_TEST(sentinel_sync_every_replica, 120)
{
    run_backend("sentinel-sync2", 30);
}

TU_TEST(redlock, 120)
{
    run_backend("redlock", 16);
}

TU_TEST(etcd, 120)
{
    run_backend("etcd", 18);
}

TU_TEST(zk, 120)
{
    run_backend("zk", 18);
}

#ifdef DLOCK_HAVE_POSTGRES
/* session advisory locks: a frozen or cut-off holder's session ends by
 * the server's idle_session_timeout, its token is a sequence's */
TU_TEST(postgres, 120)
{
    run_backend("postgres", 18);
}
#endif

#ifdef DLOCK_HAVE_MYSQL
/* GET_LOCK: a frozen or cut-off holder's session ends by wait_timeout,
 * its token the durable epoch and the MEMORY row's count */
TU_TEST(mysql, 120)
{
    run_backend("mysql", 18);
}
#endif

int main(void)
{
    tu_skip_fixture_tests("chaos");
    tu_long_only("chaos", "sentinel_nosync_measured");
    tu_long_only("chaos", "sentinel_sync1_of_2_measured");
    return tu_main("chaos", NULL, NULL);
}
