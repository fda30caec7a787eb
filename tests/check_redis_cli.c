/* check_redis_cli.c -- the dlock command on redis URLs.
 */
#include "redis_suite.h"

/* ------------------------------------------------------------------ CLI */

TU_TEST(cli_on_redis_urls, 60)
{
    start_server(NULL);
    const char *dl = tu_dlock_bin();
    {
        const char *argv[] = {dl, "-u", srv.url, "run", "-n", "clijob", "true", NULL};
        ck_assert_int_eq(tu_run(argv, NULL, NULL, NULL), 0);
    }
    {
        const char *argv[] = {dl, "-u", srv.url, "run", "-n", "clijob", "sh", "-c", "exit 7", NULL};
        ck_assert_int_eq(tu_run(argv, NULL, NULL, NULL), 7);
    }
    {
        char *out = NULL;
        const char *argv[] = {dl, "-u", srv.url, "run", "clijob", "--", "sh", "-c", "echo $DLOCK_TOKEN", NULL};
        ck_assert_int_eq(tu_run(argv, NULL, &out, NULL), 0);
        redisContext *ctx = raw();
        ck_assert_int_eq(strtoll(out, NULL, 10), cmd_int(ctx, "GET %s", "redisson_lock_token:{clijob}"));
        redisFree(ctx);
        free(out);
    }
    dlock_client *c = tu_open(srv.url);
    dlock_lock *l = tu_lock(c, "clijob");
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    {
        const char *argv[] = {dl, "-u", srv.url, "run", "-n", "clijob", "true", NULL};
        ck_assert_int_eq(tu_run(argv, NULL, NULL, NULL), 1);
    }
    {
        char *out = NULL;
        const char *argv[] = {dl, "-u", srv.url, "status", "clijob", NULL};
        ck_assert_int_eq(tu_run(argv, NULL, &out, NULL), 0);
        ck_assert_msg(out && strstr(out, "4"), "status: %s", out ? out : "");
        free(out);
    }
    {
        char *out = NULL;
        const char *argv[] = {dl, "-u", srv.url, "list", NULL};
        ck_assert_int_eq(tu_run(argv, NULL, &out, NULL), 0);
        ck_assert_msg(out && strstr(out, "clijob"), "list: %s", out ? out : "");
        free(out);
    }
    {
        const char *argv[] = {dl, "-u", srv.url, "release", "--force", "clijob", NULL};
        ck_assert_int_eq(tu_run(argv, NULL, NULL, NULL), 0);
    }
    ck_assert_int_eq(dlock_release(l), DLOCK_ELOST);
    {
        char *bad = tu_fmt("redis://127.0.0.1:%d", tu_free_port());
        char *err = NULL;
        const char *argv[] = {dl, "-u", bad, "run", "-n", "x", "true", NULL};
        ck_assert_int_eq(tu_run(argv, NULL, NULL, &err), 69);
        ck_assert_msg(err && strstr(err, "127.0.0.1:"), "%s", err ? err : "");
        free(err);
        free(bad);
    }
    {
        const char *extra_env[] = {NULL};
        char *u = tu_fmt("%s?layout=nope", srv.url);
        const char *argv[] = {dl, "-u", u, "run", "-n", "x", "true", NULL};
        ck_assert_int_eq(tu_run(argv, extra_env, NULL, NULL), 78);
        free(u);
    }
    dlock_lock_free(l);
    dlock_client_close(c);
    stop_server();
}

/* `dlock run` on a redis URL: the lease is renewed while the command runs
 * and ends soon after the CLI is killed with SIGKILL. */
TU_TEST(cli_holder_renewed_then_killed, 60)
{
    start_server(NULL);
    const char *argv[] = {tu_dlock_bin(), "-u", srv.url, "run", "--lease", "1.5", "clik9", "--", "sleep", "60", NULL};
    pid_t pid = tu_spawn(argv, NULL);
    redisContext *ctx = raw();
    for (int i = 0; i < 500 && cmd_int(ctx, "EXISTS clik9") != 1; i++)
        tu_sleep_ms(10);
    ck_assert_int_eq(cmd_int(ctx, "EXISTS clik9"), 1);
    long long held_token = cmd_int(ctx, "GET %s", "redisson_lock_token:{clik9}");
    tu_sleep_ms(3000); /* two leases: only renewals keep it */
    ck_assert_int_eq(cmd_int(ctx, "EXISTS clik9"), 1);
    long long ttl = cmd_int(ctx, "PTTL clik9");
    ck_assert_msg(ttl > 0 && ttl <= 1500, "pttl %lld", ttl);
    kill(-pid, SIGKILL);
    waitpid(pid, NULL, 0);
    dlock_client *c = tu_open(srv.url);
    dlock_lock *l = tu_lock(c, "clik9");
    TU_ACQUIRE_OK(l, 20000);
    ck_assert_uint_eq(tu_token(l), (uint64_t)held_token + 1);
    dlock_release(l);
    dlock_lock_free(l);
    dlock_client_close(c);
    redisFree(ctx);
    stop_server();
}

/* The number that begins the cell of row ROW in column COL (0: async,
 * 1: blocking) of `dlock bench async`'s table in OUT (the label 26
 * columns wide, then cells of 24 and a space); -1 when the row is missing. */
static long bench_async_cell(const char *out, const char *row, int col)
{
    const char *p = strstr(out, row);
    if (!p || strlen(p) < 27 + 25 * (size_t)col)
        return -1;
    return strtol(p + 27 + 25 * col, NULL, 10);
}

/* dlock bench async: W parked waiters on one client use a few threads
 * (the pool's, not one each) beside W blocked threads, and every waiter
 * takes the lock in turn on both sides. (A smoke run: the figures go to
 * docs/benchmarks.md.) */
TU_TEST(cli_bench_async, 90)
{
    start_server(NULL);
    char *out = NULL, *err = NULL;
    int code = TU_DLOCK(&out, &err, NULL, "-u", srv.url, "bench", "async", "-W", "50");
    ck_assert_msg(code == 0, "exit %d: %s%s", code, out, err);
    ck_assert_msg(strstr(out, "memory per waiter") && strstr(out, "hand-off p50") &&
                      strstr(out, "hand-off p99"),
                  "%s", out);
    ck_assert_msg(bench_async_cell(out, "waiting, all after", 0) == 50, "%s", out);
    long threads = bench_async_cell(out, "threads in the process", 0);
    ck_assert_msg(threads >= 1 && threads <= 16, "async side: %ld threads: %s", threads, out);
    ck_assert_msg(bench_async_cell(out, "threads in the process", 1) >= 50, "%s", out);
    ck_assert_msg(bench_async_cell(out, "holds, handed along", 0) == 50, "%s", out);
    ck_assert_msg(bench_async_cell(out, "holds, handed along", 1) == 50, "%s", out);
    free(out);
    free(err);
    stop_server();
}

/* dlock bench contended -H US: each hold lasts at least US, so two
 * threads make at most 1 / US acquisitions a second (the bound is the
 * sleep's, not the machine's speed); the header says the hold, which
 * bench/summary.sh reads for its row 3. */
TU_TEST(cli_bench_contended_hold, 90)
{
    start_server(NULL);
    char *out = NULL, *err = NULL;
    int code = TU_DLOCK(&out, &err, NULL, "-u", srv.url, "bench", "contended", "-W", "2", "-H",
                        "20000", "-d", "0.5");
    ck_assert_msg(code == 0, "exit %d: %s%s", code, out, err);
    ck_assert_msg(strstr(out, "on one name, hold 20000 us, 2 x 0.5 s"), "%s", out);
    const char *rate = strstr(out, "acquisitions/s");
    ck_assert_msg(rate, "%s", out);
    double per_s = strtod(rate + strlen("acquisitions/s"), NULL);
    ck_assert_msg(per_s > 0 && per_s <= 50, "%.1f acquisitions/s with 20 ms holds: %s", per_s, out);
    free(out);
    free(err);
    code = TU_DLOCK(&out, &err, NULL, "-u", srv.url, "bench", "contended", "-H", "-1");
    ck_assert_msg(code == 64 && strstr(err, "hold 0 to 1000000 us"), "exit %d: %s", code, err);
    free(out);
    free(err);
    stop_server();
}

int main(void)
{
    return tu_main("redis", NULL, NULL);
}
