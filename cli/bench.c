/* bench.c -- `dlock bench`: how fast dlock is, beside the raw protocol.
 *
 * Absolute figures on a shared machine drift, so every figure is printed
 * beside a baseline measured in the same run with the same client library
 * (cli/bench.h; for Redis: SET NX PX + compare-and-delete for a lock,
 * PING for one round trip; cli/bench_etcd.c and cli/bench_zk.c for the
 * others), as a ratio. Baseline and dlock runs alternate so both see the
 * same load.
 *
 * Usage (also `dlock bench --help`):
 *   dlock [-u URL] bench [MODE...] [OPTIONS]
 *   MODE: uncontended, contended, renewal, readers, semaphore, multi, async,
 *         all (the default: every mode but async)
 *   -t, --threads T     uncontended: threads, each over its own names (1)
 *   -m, --names M       uncontended: lock names in all (1024)
 *   -d, --duration S    each side is measured 2 x S seconds (3); in the
 *                       uncontended mode as 10 rounds taking turns
 *   -W, --waiters W     contended: threads, one client each, on one name (8);
 *                       async: waiters on one client (1000)
 *   -H, --hold US       contended: each hold lasts US microseconds (0)
 *   -k, --locks K       renewal: locks held at once (10000)
 *   -p, --periods P     renewal: renewal periods measured (5)
 *   -l, --lease MS      renewal: lease in ms (3000: a period of 1 s)
 *   -R, --readers R     readers: threads, one client each, reading one name (8)
 *   -X, --writers N     readers: writer threads among them (0)
 *   -P, --permits N     semaphore: permits (4); -W threads contend for them
 *   -K, --members K     multi: names in the set (8)
 *
 * uncontended: T threads loop acquire(TRY)+release over M names split
 *   between them; acquisitions/s and latency of one acquire+release pair,
 *   p50/p99; the baseline does the same with SET NX PX + EVALSHA.
 * contended: W threads, each with its own client (as W processes would),
 *   fight for one name; hand-off latency = from the holder's release call
 *   to another thread's acquire returning, p50/p99, and acquisitions/s;
 *   the baseline is one PING round trip measured meanwhile (same load),
 *   and, for reference, on the idle server before. With -H each holder
 *   sleeps that long before it releases (the contended run: 4
 *   processes, 0.5 ms holds, beside its peers: bench/peer_contended.js).
 * renewal: one client holds K locks; over P periods (lease/3), the lock
 *   scripts the server ran per period (each a pipelined batch), the
 *   client's CPU time per period and the renewals' mean latency (send to
 *   confirm, per hold: what the slowest backend request of a batch costs).
 * readers: R threads, each with its own client, loop acquire(SHARED)+
 *   release on one name (N writers, if any, acquire EXCLUSIVE among them);
 *   reads/s beside ONE reader alone on the same name, taking turns in 10
 *   rounds: readers must not serialize (issue 11: 8 readers >= 6x one
 *   reader on Redis). With writers: writes/s and a writer's wait p50/p99.
 * semaphore: W threads, each with its own client, loop acquire(1 permit)+
 *   release on one semaphore of N permits; permits/s beside the same W
 *   threads on one lock (a semaphore of 1), taking turns in 10 rounds
 *   (the median round's ratio), the most holders seen at once (never
 *   above N), a pair's latency p50/p99 on each side, and, with a baseline,
 *   what N raw clients' round trips allow beside 1 (the machine's ceiling).
 * multi: one thread loops dlock_multi_acquire(TRY)+dlock_multi_release on
 *   a set of K names, beside the same thread taking the K names as single
 *   locks (K acquire(TRY) then K releases), taking turns in 10 rounds:
 *   sets/s on each side (the median round's ratio), a set's latency
 *   p50/p99 on each side, and, with a baseline, one raw round trip's mean
 *   in the same rounds (a set taken and given back in one request each
 *   costs about 2).
 * async: W waiters on one client on one name the bench holds through
 *   another client: W dlock_acquire_async() calls, parked, beside the same
 *   W as threads blocked in dlock_acquire() (as many as the machine lets
 *   start: it says so); once all wait, the process's threads and (RSS -
 *   RSS before) / W; then the holder lets go and each waiter, once it
 *   holds, releases (asynchronously on the async side): hand-off p50/p99
 *   from a release sent to the next holder's callback or return. Backends
 *   whose waits do not park answer DLOCK_ENOTSUP naming themselves.
 */
#include <getopt.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "cli.h"
#include "dlock.h"

static const struct dlock_bench_baseline *const baselines[] = {
#ifdef DLOCK_HAVE_REDIS
    &dlock_bench_redis_baseline,
    &dlock_bench_redis_unix_baseline,
    &dlock_bench_redlock_baseline,
    &dlock_bench_cluster_baseline,
#endif
#ifdef DLOCK_HAVE_ZK
    &dlock_bench_zk_baseline,
#endif
#ifdef DLOCK_HAVE_ETCD
    &dlock_bench_etcd_baseline,
#endif
#ifdef DLOCK_HAVE_POSTGRES
    &dlock_bench_postgres_baseline,
    &dlock_bench_postgresql_baseline,
#endif
#ifdef DLOCK_HAVE_MYSQL
    &dlock_bench_mysql_baseline,
    &dlock_bench_mariadb_baseline,
#endif
    NULL,
};

void dlock_bench_pct_decode(char *s)
{
    char *o = s;
    for (; *s; s++) {
        if (*s == '%' && s[1] && s[2]) {
            char hex[3] = {s[1], s[2], 0};
            *o++ = (char)strtol(hex, NULL, 16);
            s += 2;
        } else {
            *o++ = *s;
        }
    }
    *o = 0;
}

static const char usage_text[] =
    "Usage: dlock [-u URL] bench [uncontended|contended|renewal|readers|semaphore|multi|\n"
    "       async|all ...] [OPTIONS]\n"
    "\n"
    "Measure dlock beside the raw protocol with the same client library, in\n"
    "the same run, and print each figure with its ratio to the baseline.\n"
    "  -t, --threads T     uncontended: threads, each over its own names (1)\n"
    "  -m, --names M       uncontended: lock names in all (1024)\n"
    "  -d, --duration S    measure 2 x S seconds per side (3); uncontended runs\n"
    "                      take turns with the baseline in 10 short rounds\n"
    "                      (redlock://: with the raw floor on every node, on\n"
    "                      one, and at a majority too)\n"
    "  -W, --waiters W     contended: threads, one client each, on one name (8);\n"
    "                      async: waiters on one client (1000), parked asynchronous\n"
    "                      acquires beside as many blocked threads\n"
    "  -H, --hold US       contended: each hold lasts US microseconds (0)\n"
    "      --spread        async: one name per waiter, released one by one (the\n"
    "                      default where a client may acquire a name once at a\n"
    "                      time: etcd, zk)\n"
    "  -k, --locks K       renewal: locks held at once (10000)\n"
    "  -p, --periods P     renewal: renewal periods measured (5)\n"
    "  -l, --lease MS      renewal: lease in ms (3000: one period a second)\n"
    "  -R, --readers R     readers: threads, one client each, reading one name (8),\n"
    "                      beside one reader alone in the same run\n"
    "  -X, --writers N     readers: writer threads among the readers (0)\n"
    "  -P, --permits N     semaphore: permits (4), -W threads contending for them,\n"
    "                      beside the same threads on one lock\n"
    "  -K, --members K     multi: names in one multi-lock (8), acquired and\n"
    "                      released as a set beside K single locks\n"
    "all runs every mode but async, which runs when named. Lock names start with\n"
    "'dlock-bench:'. See docs/benchmarks.md.\n";

const char *dlock_cli_bench_usage(void)
{
    return usage_text;
}

struct bench_opts {
    const char *url;
    const struct dlock_bench_baseline *base;
    int threads, names, waiters, locks, periods, readers, writers, permits, members;
    int hold_us; /* contended: each hold's length */
    int async_waiters; /* -W for the async mode (ASYNC_DEFAULT_WAITERS without -W) */
    bool async_spread; /* async: one name per waiter (--spread, or the backend's rule) */
    double duration;
    int64_t lease_ms;
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ------------------------------------------------------------ samples */

struct samples {
    int64_t *v;
    size_t n, cap;
};

static void sample_add(struct samples *s, int64_t x)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 4096;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
        if (!s->v) {
            perror("dlock bench");
            exit(EXIT_SOFTWARE);
        }
    }
    s->v[s->n++] = x;
}

static void sample_merge(struct samples *into, const struct samples *from)
{
    for (size_t i = 0; i < from->n; i++)
        sample_add(into, from->v[i]);
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Percentile P (0..100) in microseconds; sorts S. */
static double pct_us(struct samples *s, double p)
{
    if (!s->n)
        return 0;
    qsort(s->v, s->n, sizeof *s->v, cmp64);
    size_t i = (size_t)(p / 100.0 * (double)(s->n - 1) + 0.5);
    return (double)s->v[i] / 1000.0;
}

static void sleep_secs(double secs)
{
    struct timespec ts = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
    nanosleep(&ts, NULL);
}

/* A thread's failure ERR ("" = none) as the run's exit code: the first
 * one is printed (after WHAT) and makes it EXIT_UNAVAILABLE; RC so far. */
static int thread_failure(int rc, const char *what, const char *err)
{
    if (!err[0] || rc)
        return rc;
    fprintf(stderr, "dlock bench: %s%s\n", what, err);
    return EXIT_UNAVAILABLE;
}

/* --------------------------------------------------------- uncontended */

struct unc_shared {
    const struct bench_opts *o;
    dlock_client *c; /* NULL = baseline */
    int floor;       /* with c NULL: -1 the baseline, else its raw floor */
    atomic_int stop;
    atomic_int failed;
};

struct unc_thread {
    struct unc_shared *sh;
    int index;
    long ops;
    struct samples lat;
    char err[256];
};

static void *unc_main(void *arg)
{
    struct unc_thread *t = arg;
    const struct bench_opts *o = t->sh->o;
    int mine = 0;
    for (int j = t->index; j < o->names; j += o->threads)
        mine++;
    if (!mine)
        return NULL;
    char **names = calloc((size_t)mine, sizeof *names);
    dlock_lock **locks = calloc((size_t)mine, sizeof *locks);
    void *raw = NULL;
    int k = 0;
    for (int j = t->index; j < o->names; j += o->threads, k++) {
        names[k] = malloc(48);
        snprintf(names[k], 48, "dlock-bench:%s:%d", t->sh->c ? "u" : t->sh->floor < 0 ? "raw" : "floor", j);
        if (t->sh->c && dlock_lock_new(t->sh->c, names[k], DLOCK_EXCLUSIVE, 0, &locks[k])) {
            snprintf(t->err, sizeof t->err, "%s", dlock_errmsg());
            atomic_store(&t->sh->failed, 1);
            goto out;
        }
    }
    if (!t->sh->c && !(raw = o->base->connect(o->url, t->err, sizeof t->err))) {
        atomic_store(&t->sh->failed, 1);
        goto out;
    }
    for (int i = 0; !atomic_load_explicit(&t->sh->stop, memory_order_relaxed); i = (i + 1) % mine) {
        int64_t t0 = now_ns();
        int rc;
        if (t->sh->c) {
            rc = dlock_acquire(locks[i], DLOCK_TRY);
            if (!rc)
                rc = dlock_release(locks[i]);
        } else if (t->sh->floor < 0) {
            rc = o->base->lock_unlock(raw, names[i]);
        } else {
            rc = o->base->floor_lock_unlock(raw, t->sh->floor, names[i]);
        }
        if (rc) {
            snprintf(t->err, sizeof t->err, "%s: %s", names[i],
                     t->sh->c ? dlock_errmsg() : "raw lock/unlock failed");
            atomic_store(&t->sh->failed, 1);
            break;
        }
        sample_add(&t->lat, now_ns() - t0);
        t->ops++;
    }
out:
    for (int j = 0; j < mine; j++) {
        dlock_lock_free(locks[j]);
        free(names[j]);
    }
    free(locks);
    free(names);
    if (raw)
        o->base->disconnect(raw);
    return NULL;
}

/* One timed run of SECS seconds; adds ops and latencies; returns 0 or an
 * exit code. */
static int unc_run(const struct bench_opts *o, dlock_client *c, int floor, double secs, long *ops,
                   struct samples *lat)
{
    struct unc_shared sh = {.o = o, .c = c, .floor = floor};
    struct unc_thread *t = calloc((size_t)o->threads, sizeof *t);
    pthread_t *th = calloc((size_t)o->threads, sizeof *th);
    for (int i = 0; i < o->threads; i++) {
        t[i].sh = &sh;
        t[i].index = i;
        pthread_create(&th[i], NULL, unc_main, &t[i]);
    }
    sleep_secs(secs);
    atomic_store(&sh.stop, 1);
    int rc = 0;
    for (int i = 0; i < o->threads; i++) {
        pthread_join(th[i], NULL);
        *ops += t[i].ops;
        sample_merge(lat, &t[i].lat);
        free(t[i].lat.v);
        rc = thread_failure(rc, "", t[i].err);
    }
    free(t);
    free(th);
    return rc;
}

static void print_ratio_row(const char *what, double ours, double base, const char *unit, bool higher_better)
{
    if (base > 0)
        printf("  %-22s dlock %10.1f %-6s raw %10.1f %-6s ratio %.2fx%s\n", what, ours, unit, base, unit,
               ours / base, higher_better ? "" : " (lower is better)");
    else
        printf("  %-22s dlock %10.1f %-6s (no baseline)\n", what, ours, unit);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Baseline and dlock take turns in UNC_ROUNDS short rounds, so a burst of
 * load from elsewhere on the machine hits both sides alike; the rate ratio
 * is the median of the rounds' ratios. */
#define UNC_ROUNDS 10

static int bench_uncontended(const struct bench_opts *o, dlock_client *c)
{
    double secs = 2 * o->duration / UNC_ROUNDS;
    printf("uncontended: %d thread(s) over %d names, acquire(TRY)+release, %d x %.2f s each side, "
           "taking turns\n",
           o->threads, o->names, UNC_ROUNDS, secs);
    /* sides: 0 dlock, 1 the baseline, 2.. the baseline's raw floors */
    int nfloors = o->base ? o->base->nfloors : 0;
    long ops[2 + DLOCK_BENCH_MAX_FLOORS] = {0};
    struct samples lat[2 + DLOCK_BENCH_MAX_FLOORS] = {{0}};
    double ratios[UNC_ROUNDS];
    for (int round = 0; round < UNC_ROUNDS; round++) {
        long before[2] = {ops[0], ops[1]};
        for (int f = 0; f < nfloors; f++) {
            int rc = unc_run(o, NULL, f, secs, &ops[2 + f], &lat[2 + f]);
            if (rc)
                return rc;
        }
        if (o->base) {
            int rc = unc_run(o, NULL, -1, secs, &ops[1], &lat[1]);
            if (rc)
                return rc;
        }
        int rc = unc_run(o, c, 0, secs, &ops[0], &lat[0]);
        if (rc)
            return rc;
        long mine = ops[0] - before[0], theirs = ops[1] - before[1];
        ratios[round] = theirs > 0 ? (double)mine / (double)theirs : 0;
    }
    double total = UNC_ROUNDS * secs;
    print_ratio_row("acquire+release/s", (double)ops[0] / total, (double)ops[1] / total, "/s", true);
    if (o->base) {
        qsort(ratios, UNC_ROUNDS, sizeof *ratios, cmp_double);
        printf("  %-22s %.2fx (min %.2fx, max %.2fx)\n", "rate ratio, median round",
               (ratios[UNC_ROUNDS / 2 - 1] + ratios[UNC_ROUNDS / 2]) / 2, ratios[0], ratios[UNC_ROUNDS - 1]);
    }
    double p50[2] = {pct_us(&lat[0], 50), pct_us(&lat[1], 50)};
    double p99[2] = {pct_us(&lat[0], 99), pct_us(&lat[1], 99)};
    print_ratio_row("pair latency p50", p50[0], p50[1], "us", false);
    print_ratio_row("pair latency p99", p99[0], p99[1], "us", false);
    for (int f = 0; f < nfloors; f++) {
        double f50 = pct_us(&lat[2 + f], 50);
        printf("  floor %d: %s\n    pair p50 %.1f us, %.0f/s; dlock / floor %.2fx, baseline / floor "
               "%.2fx\n",
               f, o->base->floor_what[f], f50, (double)ops[2 + f] / total, f50 > 0 ? p50[0] / f50 : 0,
               f50 > 0 ? p50[1] / f50 : 0);
    }
    if (nfloors >= 2 && pct_us(&lat[3], 50) > 0 && p50[1] > 0)
        printf("  %-22s dlock %.2fx, floor %.2fx (floor 0 / floor 1)\n", "p50 ratio, same work",
               p50[0] / p50[1], pct_us(&lat[2], 50) / pct_us(&lat[3], 50));
    for (int side = 0; side < 2 + DLOCK_BENCH_MAX_FLOORS; side++)
        free(lat[side].v);
    return 0;
}

/* ----------------------------------------------------------- contended */

struct con_shared {
    const struct bench_opts *o;
    atomic_int stop;
    atomic_llong released_at; /* ns, stamped just before a release */
    atomic_int last_holder;
    pthread_mutex_t mu;
    struct samples handoff;
    long acquisitions;
    char err[256];
};

struct con_thread {
    struct con_shared *sh;
    int index;
    dlock_client *c;
};

static void *con_main(void *arg)
{
    struct con_thread *t = arg;
    struct con_shared *sh = t->sh;
    dlock_lock *l = NULL;
    if (dlock_lock_new(t->c, "dlock-bench:contended", DLOCK_EXCLUSIVE, 0, &l)) {
        pthread_mutex_lock(&sh->mu);
        snprintf(sh->err, sizeof sh->err, "%s", dlock_errmsg());
        pthread_mutex_unlock(&sh->mu);
        return NULL;
    }
    while (!atomic_load(&sh->stop)) {
        int rc = dlock_acquire(l, 1000);
        if (rc == DLOCK_ETIMEDOUT)
            continue;
        if (rc) {
            pthread_mutex_lock(&sh->mu);
            snprintf(sh->err, sizeof sh->err, "%s", dlock_errmsg());
            pthread_mutex_unlock(&sh->mu);
            atomic_store(&sh->stop, 1);
            break;
        }
        int64_t got = now_ns();
        int prev = atomic_exchange(&sh->last_holder, t->index);
        long long rel = atomic_load(&sh->released_at);
        pthread_mutex_lock(&sh->mu);
        sh->acquisitions++;
        if (prev != t->index && prev >= 0 && rel > 0)
            sample_add(&sh->handoff, got - rel);
        pthread_mutex_unlock(&sh->mu);
        if (sh->o->hold_us) {
            struct timespec held = {sh->o->hold_us / 1000000, (long)(sh->o->hold_us % 1000000) * 1000};
            nanosleep(&held, NULL);
        }
        atomic_store(&sh->released_at, now_ns());
        dlock_release(l);
    }
    dlock_lock_free(l);
    return NULL;
}

static int bench_contended(const struct bench_opts *o, dlock_client *opened)
{
    (void)opened; /* its own clients */
    printf("contended: %d threads (one client each) on one name, ", o->waiters);
    if (o->hold_us)
        printf("hold %d us, ", o->hold_us);
    printf("2 x %.1f s\n", o->duration);
    struct con_shared sh = {.o = o};
    pthread_mutex_init(&sh.mu, NULL);
    atomic_store(&sh.last_holder, -1);
    struct con_thread *t = calloc((size_t)o->waiters, sizeof *t);
    pthread_t *th = calloc((size_t)o->waiters, sizeof *th);
    for (int i = 0; i < o->waiters; i++) {
        t[i].sh = &sh;
        t[i].index = i;
        if (dlock_open(o->url, &t[i].c))
            return cli_fail(DLOCK_ECONN, "bench");
    }
    struct samples rtt = {0};
    void *raw = o->base ? o->base->connect(o->url, sh.err, sizeof sh.err) : NULL;
    if (o->base && !raw) {
        fprintf(stderr, "dlock bench: baseline: %s\n", sh.err);
        return EXIT_UNAVAILABLE;
    }
    /* PING on an idle server first: the round trip without the load */
    struct samples idle = {0};
    for (int i = 0; raw && i < 500; i++) {
        int64_t t0 = now_ns();
        if (o->base->round_trip(raw) == 0)
            sample_add(&idle, now_ns() - t0);
    }
    for (int i = 0; i < o->waiters; i++)
        pthread_create(&th[i], NULL, con_main, &t[i]);
    /* PING round trips, measured meanwhile on a raw connection at a
     * gentle pace so they see the same load. */
    int64_t end = now_ns() + (int64_t)(2 * o->duration * 1e9);
    while (now_ns() < end) {
        if (raw) {
            int64_t t0 = now_ns();
            if (o->base->round_trip(raw) == 0)
                sample_add(&rtt, now_ns() - t0);
        }
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    atomic_store(&sh.stop, 1);
    for (int i = 0; i < o->waiters; i++) {
        pthread_join(th[i], NULL);
        dlock_client_close(t[i].c);
    }
    if (raw)
        o->base->disconnect(raw);
    if (sh.err[0]) {
        fprintf(stderr, "dlock bench: %s\n", sh.err);
        return EXIT_UNAVAILABLE;
    }
    double p50 = pct_us(&sh.handoff, 50), p99 = pct_us(&sh.handoff, 99);
    double r50 = pct_us(&rtt, 50), r99 = pct_us(&rtt, 99), i50 = pct_us(&idle, 50);
    printf("  acquisitions/s         %10.1f (%zu hand-offs between threads)\n",
           (double)sh.acquisitions / (2 * o->duration), sh.handoff.n);
    if (r50 > 0) {
        printf("  hand-off p50           %10.1f us = %.2f round trips (PING p50 %.1f us)\n", p50, p50 / r50,
               r50);
        printf("  hand-off p99           %10.1f us = %.2f round trips (PING p99 %.1f us)\n", p99, p99 / r99,
               r99);
        printf("  (PING p50 on the idle server before: %.1f us; hand-off p50 = %.1f of those)\n", i50,
               i50 > 0 ? p50 / i50 : 0);
    } else {
        printf("  hand-off p50 %.1f us, p99 %.1f us (no baseline)\n", p50, p99);
    }
    free(sh.handoff.v);
    free(rtt.v);
    free(idle.v);
    free(t);
    free(th);
    return 0;
}

/* ------------------------------------------------------------ readers */

/* What the threads of one timed run share: the stop flag, and the first
 * failure's message. */
struct run_shared {
    atomic_int stop;
    pthread_mutex_t mu;
    char err[256];
};

/* A thread of SH failed (dlock's message): record it, stop the run. */
static void run_failed(struct run_shared *sh)
{
    pthread_mutex_lock(&sh->mu);
    snprintf(sh->err, sizeof sh->err, "%s", dlock_errmsg());
    pthread_mutex_unlock(&sh->mu);
    atomic_store(&sh->stop, 1);
}

/* N threads running FN on ARGS (N structs of SIZE bytes) for SECS
 * seconds, then SH->stop set and all joined. */
static void run_threads(struct run_shared *sh, int n, void *(*fn)(void *), void *args,
                        size_t size, double secs)
{
    pthread_t *th = calloc((size_t)n, sizeof *th);
    for (int i = 0; i < n; i++)
        pthread_create(&th[i], NULL, fn, (char *)args + (size_t)i * size);
    sleep_secs(secs);
    atomic_store(&sh->stop, 1);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    free(th);
}

struct rw_thread {
    struct run_shared *sh;
    dlock_client *c;
    dlock_mode mode;
    long ops;
    struct samples lat; /* acquire+release pairs (readers), acquire waits (writers) */
};

static void *rw_main(void *arg)
{
    struct rw_thread *t = arg;
    struct run_shared *sh = t->sh;
    dlock_lock *l = NULL;
    int rc = dlock_lock_new(t->c, "dlock-bench:rw", t->mode, 0, &l);
    while (!rc && !atomic_load_explicit(&sh->stop, memory_order_relaxed)) {
        int64_t t0 = now_ns();
        rc = dlock_acquire(l, 1000);
        if (rc == DLOCK_ETIMEDOUT) {
            rc = 0;
            continue;
        }
        int64_t got = now_ns();
        if (!rc)
            rc = dlock_release(l);
        if (!rc) {
            sample_add(&t->lat, (t->mode == DLOCK_SHARED ? now_ns() : got) - t0);
            t->ops++;
        }
    }
    if (rc)
        run_failed(sh);
    dlock_lock_free(l);
    return NULL;
}

/* NREADERS readers and NWRITERS writers, the clients C[0..] in that
 * order, for SECS seconds; adds their operations and latencies. */
static int rw_run(dlock_client **c, int nreaders, int nwriters, double secs, long ops[2],
                  struct samples lat[2])
{
    int n = nreaders + nwriters;
    struct run_shared sh = {.mu = PTHREAD_MUTEX_INITIALIZER};
    struct rw_thread *t = calloc((size_t)n, sizeof *t);
    for (int i = 0; i < n; i++)
        t[i] = (struct rw_thread){.sh = &sh, .c = c[i],
                                  .mode = i < nreaders ? DLOCK_SHARED : DLOCK_EXCLUSIVE};
    run_threads(&sh, n, rw_main, t, sizeof *t, secs);
    for (int i = 0; i < n; i++) {
        int k = t[i].mode == DLOCK_SHARED ? 0 : 1;
        ops[k] += t[i].ops;
        sample_merge(&lat[k], &t[i].lat);
        free(t[i].lat.v);
    }
    free(t);
    return thread_failure(0, "", sh.err);
}

/* The machine's own ceiling for the readers' concurrency: N threads,
 * each with its own raw connection, loop the baseline's round trip (PING)
 * for SECS seconds; adds their round trips to *OPS. */
struct rt_thread {
    const struct bench_opts *o;
    atomic_int *stop;
    long ops;
    char err[256];
};

static void *rt_main(void *arg)
{
    struct rt_thread *t = arg;
    void *raw = t->o->base->connect(t->o->url, t->err, sizeof t->err);
    while (raw && !atomic_load_explicit(t->stop, memory_order_relaxed) &&
           t->o->base->round_trip(raw) == 0)
        t->ops++;
    if (raw)
        t->o->base->disconnect(raw);
    return NULL;
}

static int rt_run(const struct bench_opts *o, int n, double secs, long *ops)
{
    atomic_int stop = 0;
    struct rt_thread *t = calloc((size_t)n, sizeof *t);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    for (int i = 0; i < n; i++) {
        t[i] = (struct rt_thread){.o = o, .stop = &stop};
        pthread_create(&th[i], NULL, rt_main, &t[i]);
    }
    sleep_secs(secs);
    atomic_store(&stop, 1);
    int rc = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        *ops += t[i].ops;
        rc = thread_failure(rc, "baseline: ", t[i].err);
    }
    free(t);
    free(th);
    return rc;
}

/* The p50 and p99 of the pair latencies MANY (a row named WHAT) beside
 * those of ONE (named ONE_NAME). */
static void print_pair_pcts(const char *what, struct samples *many, const char *one_name,
                            struct samples *one)
{
    for (int p = 50; p <= 99; p += 49) {
        char row[40];
        snprintf(row, sizeof row, "%s p%d", what, p);
        printf("  %-22s %10.1f us   %s %10.1f us\n", row, pct_us(many, p), one_name,
               pct_us(one, p));
    }
}

/* The rounds' RATIOS (UNC_ROUNDS of them, sorted here): the median
 * round's, the smallest and the largest. */
static void print_median_ratio(double *ratios)
{
    qsort(ratios, UNC_ROUNDS, sizeof *ratios, cmp_double);
    printf("  %-22s %.2fx (min %.2fx, max %.2fx)\n", "ratio, median round",
           (ratios[UNC_ROUNDS / 2 - 1] + ratios[UNC_ROUNDS / 2]) / 2, ratios[0],
           ratios[UNC_ROUNDS - 1]);
}

/* MANY's operations in a round over ONE's (0 when ONE did none). */
static double round_ratio(long many, long one)
{
    return one > 0 ? (double)many / (double)one : 0;
}

/* A row of rates over TOTAL seconds: MANY operations ("UNIT, N WHO")
 * beside ONE's (named ONE_NAME), and their ratio; then the rounds'
 * RATIOS (print_median_ratio). */
static void print_rates(const char *unit, int n, const char *who, long many, const char *one_name,
                        long one, double total, double *ratios)
{
    char row[40];
    snprintf(row, sizeof row, "%s, %d %s", unit, n, who);
    printf("  %-22s %10.1f /s   %s %10.1f /s   ratio %.2fx\n", row, (double)many / total, one_name,
           (double)one / total, one ? (double)many / (double)one : 0);
    print_median_ratio(ratios);
}

/* What the machine allows N raw clients beside 1 (round trips in SECS
 * each side, same run). */
static void print_raw_ceiling(long many, long one, double secs, int n)
{
    printf("  %-22s %10.1f /s   1 client %10.1f /s   ratio %.2fx (what the machine\n"
           "  %-22s allows %d clients beside 1, same run)\n",
           "raw round trips/s", (double)many / secs, (double)one / secs,
           (double)many / (double)one, "", n);
}

/* N clients of O->url in *OUT (close_clients() ends them); 0 or the exit
 * code of the failure. */
static int open_clients(const struct bench_opts *o, int n, dlock_client ***out)
{
    dlock_client **c = calloc((size_t)n, sizeof *c);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++)
        if ((rc = dlock_open(o->url, &c[i])))
            rc = cli_fail(rc, "bench");
    *out = c;
    return rc;
}

static void close_clients(dlock_client **c, int n)
{
    for (int i = 0; i < n; i++)
        dlock_client_close(c[i]);
    free(c);
}

static int bench_readers(const struct bench_opts *o, dlock_client *opened)
{
    (void)opened; /* its own clients */
    double secs = 2 * o->duration / UNC_ROUNDS;
    int n = o->readers + o->writers;
    printf("readers: %d reader(s)%s%.0d%s, one client each, on one name, acquire(SHARED)+release,\n"
           "  beside 1 reader alone; %d x %.2f s each side, taking turns\n",
           o->readers, o->writers ? " + " : "", o->writers, o->writers ? " writer(s)" : "",
           UNC_ROUNDS, secs);
    dlock_client **c;
    int rc = open_clients(o, n, &c);
    long many[2] = {0, 0}, one[2] = {0, 0}, raw_one = 0, raw_many = 0;
    struct samples lmany[2] = {{0}, {0}}, lone[2] = {{0}, {0}};
    double ratios[UNC_ROUNDS];
    for (int round = 0; !rc && round < UNC_ROUNDS; round++) {
        long before[2] = {one[0], many[0]};
        if (o->base && !(rc = rt_run(o, 1, secs / 2, &raw_one)))
            rc = rt_run(o, o->readers, secs / 2, &raw_many);
        if (!rc && !(rc = rw_run(c, 1, 0, secs, one, lone)))
            rc = rw_run(c, o->readers, o->writers, secs, many, lmany);
        ratios[round] = round_ratio(many[0] - before[1], one[0] - before[0]);
    }
    if (!rc) {
        double total = UNC_ROUNDS * secs;
        print_rates("reads/s", o->readers, "readers", many[0], "1 reader", one[0], total, ratios);
        print_pair_pcts("read pair", &lmany[0], "1 reader", &lone[0]);
        if (raw_one)
            print_raw_ceiling(raw_many, raw_one, total / 2, o->readers);
        if (o->writers)
            printf("  %-22s %10.1f /s   writer's wait p50 %.1f us, p99 %.1f us\n", "writes/s",
                   (double)many[1] / total, pct_us(&lmany[1], 50), pct_us(&lmany[1], 99));
    }
    for (int i = 0; i < 2; i++) {
        free(lmany[i].v);
        free(lone[i].v);
    }
    close_clients(c, n);
    return rc;
}

/* ----------------------------------------------------------- semaphore */

struct sem_shared {
    struct run_shared run;
    const struct bench_opts *o;
    bool lock; /* the baseline side: one lock, not the semaphore */
    atomic_int inside, most;
};

struct sem_thread {
    struct sem_shared *sh;
    dlock_client *c;
    long ops;
    struct samples lat; /* acquire+release pairs */
};

/* Between an acquire and its release: count the holders, keep the most. */
static void sem_inside(struct sem_shared *sh)
{
    int now = atomic_fetch_add(&sh->inside, 1) + 1, most = atomic_load(&sh->most);
    while (now > most && !atomic_compare_exchange_weak(&sh->most, &most, now))
        ;
    atomic_fetch_sub(&sh->inside, 1);
}

static void *sem_main(void *arg)
{
    struct sem_thread *t = arg;
    struct sem_shared *sh = t->sh;
    dlock_semaphore *s = NULL;
    dlock_lock *l = NULL;
    int rc = sh->lock ? dlock_lock_new(t->c, "dlock-bench:sem-lock", DLOCK_EXCLUSIVE, 0, &l)
                      : dlock_semaphore_new(t->c, "dlock-bench:sem", (unsigned)sh->o->permits, 0,
                                            &s);
    while (!rc && !atomic_load_explicit(&sh->run.stop, memory_order_relaxed)) {
        int64_t t0 = now_ns();
        dlock_permit *p = NULL;
        rc = l ? dlock_acquire(l, 1000) : dlock_semaphore_acquire(s, 1, 1000, NULL, &p);
        if (rc == DLOCK_ETIMEDOUT) {
            rc = 0;
            continue;
        }
        if (!rc) {
            sem_inside(sh);
            rc = l ? dlock_release(l) : dlock_permit_release(p);
        }
        if (!rc) {
            sample_add(&t->lat, now_ns() - t0);
            t->ops++;
        }
    }
    if (rc)
        run_failed(&sh->run);
    dlock_lock_free(l);
    dlock_semaphore_free(s);
    return NULL;
}

/* O->waiters threads on clients C for SECS seconds, on the semaphore or
 * (LOCK) the lock; adds their pairs to *OPS and LAT, the most holders
 * seen at once to *MOST (the larger). */
static int sem_run(const struct bench_opts *o, dlock_client **c, bool lock, double secs,
                   long *ops, struct samples *lat, int *most)
{
    struct sem_shared sh = {.run.mu = PTHREAD_MUTEX_INITIALIZER, .o = o, .lock = lock};
    struct sem_thread *t = calloc((size_t)o->waiters, sizeof *t);
    for (int i = 0; i < o->waiters; i++)
        t[i] = (struct sem_thread){.sh = &sh, .c = c[i]};
    run_threads(&sh.run, o->waiters, sem_main, t, sizeof *t, secs);
    for (int i = 0; i < o->waiters; i++) {
        *ops += t[i].ops;
        sample_merge(lat, &t[i].lat);
        free(t[i].lat.v);
    }
    if (atomic_load(&sh.most) > *most)
        *most = atomic_load(&sh.most);
    free(t);
    return thread_failure(0, "", sh.run.err);
}

static int bench_semaphore(const struct bench_opts *o, dlock_client *opened)
{
    (void)opened; /* its own clients */
    double secs = 2 * o->duration / UNC_ROUNDS;
    printf("semaphore: %d threads (one client each) on %d permits, acquire(1)+release,\n"
           "  beside the same threads on one lock; %d x %.2f s each side, taking turns\n",
           o->waiters, o->permits, UNC_ROUNDS, secs);
    dlock_client **c;
    int rc = open_clients(o, o->waiters, &c);
    dlock_semaphore *probe = NULL;
    if (!rc && dlock_semaphore_new(c[0], "dlock-bench:sem", (unsigned)o->permits, 0, &probe) ==
                   DLOCK_ENOTSUP) {
        printf("  (no semaphores on this backend: %s)\n", dlock_errmsg());
        close_clients(c, o->waiters);
        return 0;
    }
    dlock_semaphore_free(probe);
    long ops[2] = {0, 0}, raw_one = 0, raw_many = 0;
    struct samples lat[2] = {{0}, {0}};
    int most[2] = {0, 0};
    double ratios[UNC_ROUNDS];
    for (int round = 0; !rc && round < UNC_ROUNDS; round++) {
        long before[2] = {ops[0], ops[1]};
        if (o->base && !(rc = rt_run(o, 1, secs / 2, &raw_one)))
            rc = rt_run(o, o->permits, secs / 2, &raw_many);
        if (!rc && !(rc = sem_run(o, c, true, secs, &ops[1], &lat[1], &most[1])))
            rc = sem_run(o, c, false, secs, &ops[0], &lat[0], &most[0]);
        ratios[round] = round_ratio(ops[0] - before[0], ops[1] - before[1]);
    }
    if (!rc) {
        double total = UNC_ROUNDS * secs;
        print_rates("permits/s", o->permits, "permits", ops[0], "1 lock", ops[1], total, ratios);
        printf("  %-22s %10d      1 lock %10d\n", "most holders at once", most[0], most[1]);
        print_pair_pcts("pair", &lat[0], "1 lock", &lat[1]);
        if (raw_one)
            print_raw_ceiling(raw_many, raw_one, total / 2, o->permits);
        if (most[0] > o->permits) {
            fprintf(stderr, "dlock bench: %d holders of %d permits at once\n", most[0], o->permits);
            rc = EXIT_SOFTWARE;
        }
    }
    for (int i = 0; i < 2; i++)
        free(lat[i].v);
    close_clients(c, o->waiters);
    return rc;
}

/* --------------------------------------------------------------- multi */

/* One side of a multi round: for SECS seconds, the set M (or, M NULL,
 * the K single locks L in order, then released in reverse) taken with a
 * try and given back; adds the pairs to *OPS and LAT. 0, or the exit
 * code of a failure (a busy name too: nothing else takes them). */
static int multi_side(dlock_multi *m, dlock_lock **l, int k, double secs, long *ops,
                      struct samples *lat)
{
    int64_t end = now_ns() + (int64_t)(secs * 1e9);
    while (now_ns() < end) {
        int64_t t0 = now_ns();
        int rc = DLOCK_OK, i = 0;
        if (m) {
            if (!(rc = dlock_multi_acquire(m, DLOCK_TRY, NULL)))
                rc = dlock_multi_release(m);
        } else {
            for (; i < k && !rc; i++)
                rc = dlock_acquire(l[i], DLOCK_TRY);
            for (int j = rc ? i - 1 : i; j-- > 0;) {
                int r = dlock_release(l[j]);
                rc = rc ? rc : r;
            }
        }
        if (rc)
            return cli_fail(rc, "bench multi");
        sample_add(lat, now_ns() - t0);
        (*ops)++;
    }
    return 0;
}

static int bench_multi(const struct bench_opts *o, dlock_client *c)
{
    double secs = 2 * o->duration / UNC_ROUNDS;
    int k = o->members;
    printf("multi: one thread, a multi-lock of %d names acquire(TRY)+release, beside the same\n"
           "  %d names as single locks; %d x %.2f s each side, taking turns\n",
           k, k, UNC_ROUNDS, secs);
    char(*names)[40] = calloc((size_t)k, sizeof *names);
    const char **np = calloc((size_t)k, sizeof *np);
    dlock_lock **l = calloc((size_t)k, sizeof *l);
    dlock_multi *m = NULL;
    int rc = 0;
    for (int i = 0; i < k && !rc; i++) {
        snprintf(names[i], sizeof names[i], "dlock-bench:multi:%d", i);
        np[i] = names[i];
        int e = dlock_lock_new(c, names[i], DLOCK_EXCLUSIVE, 0, &l[i]);
        rc = e ? cli_fail(e, "bench multi") : 0;
    }
    int e = rc ? 0 : dlock_multi_new(c, np, (size_t)k, DLOCK_EXCLUSIVE, 0, &m);
    rc = e ? cli_fail(e, "bench multi") : rc;
    long ops[2] = {0, 0}, raw = 0;
    struct samples lat[2] = {{0}, {0}};
    double ratios[UNC_ROUNDS];
    for (int round = 0; !rc && round < UNC_ROUNDS; round++) {
        long before[2] = {ops[0], ops[1]};
        if (o->base)
            rc = rt_run(o, 1, secs / 2, &raw);
        if (!rc && !(rc = multi_side(NULL, l, k, secs, &ops[1], &lat[1])))
            rc = multi_side(m, NULL, k, secs, &ops[0], &lat[0]);
        ratios[round] = round_ratio(ops[0] - before[0], ops[1] - before[1]);
    }
    if (!rc) {
        double total = UNC_ROUNDS * secs;
        char one[40];
        snprintf(one, sizeof one, "%d singles", k);
        print_rates("sets/s", k, "names", ops[0], one, ops[1], total, ratios);
        print_pair_pcts("set", &lat[0], one, &lat[1]);
        if (raw)
            printf("  %-22s %10.1f us   (one client, the same rounds)\n", "raw round trip, mean",
                   total / 2 / (double)raw * 1e6);
    }
    for (int i = 0; i < 2; i++)
        free(lat[i].v);
    dlock_multi_free(m);
    for (int i = 0; i < k; i++)
        dlock_lock_free(l[i]);
    free(l);
    free(np);
    free(names);
    return rc;
}

/* ------------------------------------------------------------- renewal */

static double cpu_ms(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000.0 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000.0;
}

static int bench_renewal(const struct bench_opts *o, dlock_client *opened)
{
    (void)opened; /* its own clients */
    printf("renewal: %d locks held by one client, lease %lld ms (period %lld ms), %d periods\n", o->locks,
           (long long)o->lease_ms, (long long)o->lease_ms / 3, o->periods);
    dlock_client *c = NULL;
    int rc = dlock_client_new(o->url, &c);
    if (!rc)
        rc = dlock_client_setopt_int(c, DLOCK_OPT_LEASE_MS, o->lease_ms);
    if (!rc)
        rc = dlock_client_connect(c);
    if (rc)
        return cli_fail(rc, "bench");
    dlock_lock **l = calloc((size_t)o->locks, sizeof *l);
    for (int i = 0; i < o->locks; i++) {
        char name[48];
        snprintf(name, sizeof name, "dlock-bench:r:%d", i);
        if ((rc = dlock_lock_new(c, name, DLOCK_EXCLUSIVE, 0, &l[i])) || (rc = dlock_acquire(l[i], 10000))) {
            rc = cli_fail(rc, "bench");
            goto out;
        }
    }
    char err[256] = "";
    void *raw = o->base ? o->base->connect(o->url, err, sizeof err) : NULL;
    /* settle: the first renewals merge holds acquired at different times */
    struct timespec settle = {(time_t)(o->lease_ms / 1000), (long)(o->lease_ms % 1000) * 1000000L};
    nanosleep(&settle, NULL);
    long long calls0 = raw && o->base->server_calls ? o->base->server_calls(raw) : -1;
    dlock_stats st0 = {.size = sizeof st0};
    dlock_client_stats(c, &st0);
    double cpu0 = cpu_ms();
    int64_t span_ms = o->lease_ms / 3 * o->periods;
    struct timespec ts = {(time_t)(span_ms / 1000), (long)(span_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    double cpu1 = cpu_ms();
    long long calls1 = raw && o->base->server_calls ? o->base->server_calls(raw) : -1;
    /* the raw connection's own INFO is not a script call */
    int lost = 0;
    for (int i = 0; i < o->locks; i++)
        lost += dlock_validity_ms(l[i]) <= 0;
    if (calls0 >= 0 && calls1 >= 0)
        printf("  lock scripts per period %8.1f (each one pipelined batch of up to 1000 renewals;\n"
               "                          one script per lock per period would be %d)\n",
               (double)(calls1 - calls0) / o->periods, o->locks);
    else
        printf("  lock scripts per period: unknown (no baseline connection%s%s)\n", err[0] ? ": " : "", err);
    printf("  client CPU per period   %8.2f ms (%.2f us per lock)\n", (cpu1 - cpu0) / o->periods,
           (cpu1 - cpu0) * 1000.0 / o->periods / o->locks);
    printf("  holds lost meanwhile    %8d\n", lost);
    dlock_stats st = {.size = sizeof st};
    if (dlock_client_stats(c, &st) == DLOCK_OK && st.renewals > st0.renewals)
        printf("  renewal latency         %8.1f ms mean (send to confirm; %llu ms max since the "
               "start), %llu failed\n",
               (double)(st.renewal_ms - st0.renewal_ms) / (double)(st.renewals - st0.renewals),
               (unsigned long long)st.renewal_max_ms,
               (unsigned long long)(st.renewal_failures - st0.renewal_failures));
    if (raw)
        o->base->disconnect(raw);
out:
    for (int i = 0; i < o->locks; i++) {
        if (l[i] && dlock_hold_count(l[i]))
            dlock_release(l[i]);
        dlock_lock_free(l[i]);
    }
    free(l);
    dlock_client_close(c);
    return rc;
}

/* --------------------------------------------------------------- async */

/* `bench async`: W waiters on one name that the bench holds through
 * another client (spread: on W names, one waiter each, where a client
 * may have one acquire per name at a time (etcd, zk) or with --spread;
 * the holder then releases the names one by one, each hand-off from
 * that release sent to its waiter holding). One side: W handle-owned handles of one client start
 * dlock_acquire_async() and park; the other: the same W through W
 * threads blocked in dlock_acquire() on one client (as many as the
 * machine lets start). Once all wait, the process's threads and RSS are
 * read; then the holder lets go and the lock is handed along: each
 * waiter, once it holds, releases (asynchronously on the async side) and
 * the next is woken by the backend's push. Not part of `all`. */

#define ASYNC_NAME "dlock-bench:async"
#define ASYNC_DEFAULT_WAITERS 1000

/* The process's threads and resident KiB, from /proc/self/status. */
static void proc_status(int *threads, long *rss_kib)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    *threads = 0;
    *rss_kib = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "Threads:", 8) == 0)
            *threads = atoi(line + 8);
        else if (strncmp(line, "VmRSS:", 6) == 0)
            *rss_kib = atol(line + 6);
    }
    if (f)
        fclose(f);
}

struct async_waiter;

/* What one side measured, and the hand-off state its callbacks or
 * threads share (under MU). */
struct async_side {
    const char *what; /* "bench async (async side)", ...: failures begin with it */
    /* blocking: a waiter's failure (a request timing out among thousands
     * of threads on a loaded machine) is a figure, counted; async: the
     * run fails */
    bool failures_counted;
    int w;                 /* waiters that waited (blocking: the threads that started) */
    int threads0, threads; /* the process's threads before the waiters, once all wait */
    long rss0, rss;        /* KiB, the same moments */
    double settle_s;       /* from the first start to all waiting */
    double pass_s;         /* from the holder's release to the last waiter's */
    char note[160];        /* why fewer than asked waited (blocking) */
    pthread_mutex_t mu;
    int64_t released_at; /* ns: the latest release sent; 0 none */
    int64_t *released;   /* spread: ns each waiter's name was released at; else NULL */
    pthread_cond_t took; /* a waiter took its hold or failed (spread: the holder waits) */
    /* the waiters' callback arguments: freed with the side, after its
     * client closed (a call still in flight ends ECANCELED there) */
    struct async_waiter *args;
    struct samples handoff;
    int acquired, ended, failed; /* holds taken; waiters done (released, or failed); failed */
    char err[256];               /* the first failure */
};

/* Waiter INDEX holds now: the hand-off since the latest release sent
 * (spread: since its name's); its own release is sent next. */
static void async_took(struct async_side *s, int index)
{
    pthread_mutex_lock(&s->mu);
    int64_t now = now_ns(), since = s->released ? s->released[index] : s->released_at;
    if (since)
        sample_add(&s->handoff, now - since);
    s->acquired++;
    s->released_at = now_ns();
    pthread_cond_broadcast(&s->took);
    pthread_mutex_unlock(&s->mu);
}

/* A waiter is done: RC its outcome (its message dlock_errmsg()). */
static void async_ended(struct async_side *s, int rc)
{
    pthread_mutex_lock(&s->mu);
    if (rc && !s->failed++)
        snprintf(s->err, sizeof s->err, "%s", dlock_errmsg());
    s->ended++;
    pthread_cond_broadcast(&s->took);
    pthread_mutex_unlock(&s->mu);
}

static void async_released(dlock_lock *l, int rc, void *arg)
{
    (void)l;
    async_ended(arg, rc);
}

/* One waiter: its side, handle, place and wait bound (the argument of
 * its callback, or of its thread). */
struct async_waiter {
    struct async_side *s;
    dlock_lock *l;
    int index;
    int64_t wait_ms;
};

static void async_acquired(dlock_lock *l, int rc, void *arg)
{
    struct async_waiter *b = arg;
    if (!rc) {
        async_took(b->s, b->index);
        rc = dlock_release_async(l, async_released, b->s);
    }
    if (rc)
        async_ended(b->s, rc);
}

static void *blocked_main(void *arg)
{
    struct async_waiter *b = arg;
    int rc = dlock_acquire(b->l, b->wait_ms);
    if (!rc) {
        async_took(b->s, b->index);
        rc = dlock_release(b->l);
    }
    async_ended(b->s, rc);
    return NULL;
}

static bool async_over(struct async_side *s)
{
    pthread_mutex_lock(&s->mu);
    bool over = s->ended >= s->w || (s->failed && !s->failures_counted);
    pthread_mutex_unlock(&s->mu);
    return over;
}

/* Dispatch C's completions (FD >= 0; else just wait) until every waiter
 * of S ended, one failed, or SECS passed. */
static void async_pump(dlock_client *c, int fd, struct async_side *s, double secs)
{
    int64_t end = now_ns() + (int64_t)(secs * 1e9);
    while (!async_over(s) && now_ns() < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (fd < 0)
            sleep_secs(0.01);
        else if (poll(&p, 1, 50) > 0 && dlock_dispatch(c) < 0)
            return;
    }
}

/* Spread: until N waiters of S took their hold or failed, or SECS
 * passed; C's completions dispatched meanwhile (FD >= 0). */
static void async_await_took(dlock_client *c, int fd, struct async_side *s, int n, double secs)
{
    struct timespec end;
    clock_gettime(CLOCK_REALTIME, &end);
    end.tv_sec += (time_t)secs;
    int64_t stop = now_ns() + (int64_t)(secs * 1e9);
    pthread_mutex_lock(&s->mu);
    while (s->acquired + s->failed < n && now_ns() < stop) {
        if (fd < 0) {
            pthread_cond_timedwait(&s->took, &s->mu, &end);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int broken = poll(&p, 1, 50) > 0 && dlock_dispatch(c) < 0;
        pthread_mutex_lock(&s->mu);
        if (broken)
            break;
    }
    pthread_mutex_unlock(&s->mu);
}

/* Until the waiters of S all wait: the process idle (under 2% of a core
 * in two windows of 250 ms in a row: every first attempt made, every
 * waiter parked or blocked), a waiter failed, or 120 s; C's completions
 * dispatched meanwhile (FD >= 0). */
static void async_settle(dlock_client *c, int fd, struct async_side *s)
{
    for (int i = 0, quiet = 0; i < 480 && quiet < 2 && !async_over(s); i++) {
        double cpu0 = cpu_ms();
        async_pump(c, fd, s, 0.25);
        quiet = cpu_ms() - cpu0 < 5 ? quiet + 1 : 0;
    }
}

/* async_start()'s answer where the backend lets a client acquire a
 * name once at a time: bench_async() spreads the waiters. */
#define ASYNC_ONE_PER_CLIENT (-1)

/* The name of waiter I (spread: one each) in NAME. */
static void async_name(const struct bench_opts *o, int i, char *name, size_t size)
{
    if (o->async_spread)
        snprintf(name, size, "%s:%d", ASYNC_NAME, i);
    else
        snprintf(name, size, "%s", ASYNC_NAME);
}

/* Start S's waiters through C (FD >= 0: asynchronous; else a thread
 * each, TH theirs) on handles L, B their arguments, each waiting up to
 * WAIT_MS; S->w those started. 0, ASYNC_ONE_PER_CLIENT, or the exit
 * code of a failure (printed). */
static int async_start(const struct bench_opts *o, dlock_client *c, int fd, dlock_lock **l,
                       pthread_t *th, struct async_waiter *b, int64_t wait_ms,
                       struct async_side *s)
{
    for (; s->w < o->waiters; s->w++) {
        int i = s->w;
        char name[64];
        async_name(o, i, name, sizeof name);
        b[i] = (struct async_waiter){.s = s, .index = i, .wait_ms = wait_ms};
        int rc = dlock_lock_new(c, name, DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED, &l[i]);
        b[i].l = l[i];
        if (!rc && fd >= 0)
            rc = dlock_acquire_async(l[i], wait_ms, NULL, async_acquired, &b[i]);
        if (rc == DLOCK_EBUSY && i > 0 && !o->async_spread) /* etcd, zk: dlock_acquire_async(3) */
            return ASYNC_ONE_PER_CLIENT;
        if (rc)
            return cli_fail(rc, s->what);
        if (fd >= 0)
            continue;
        int e = pthread_create(&th[i], NULL, blocked_main, &b[i]);
        if (e) { /* the machine's limit: measure those that started */
            snprintf(s->note, sizeof s->note, "thread %d of %d did not start: %s", i + 1,
                     o->waiters, strerror(e));
            return 0;
        }
    }
    return 0;
}

/* Spread: HOLDERS let go of the names one by one, each once the
 * previous waiter took its hold (each hand-off alone). 0 or the exit
 * code of a failure. */
static int async_release_each(dlock_client *c, int fd, dlock_lock **holders, int64_t wait_ms,
                              struct async_side *s)
{
    for (int i = 0; i < s->w; i++) {
        pthread_mutex_lock(&s->mu);
        s->released[i] = now_ns();
        pthread_mutex_unlock(&s->mu);
        int rc = dlock_release(holders[i]);
        if (rc)
            return cli_fail(rc, "bench async: the holder's release");
        async_await_took(c, fd, s, i + 1, (double)wait_ms / 1000);
    }
    return 0;
}

/* One side: S's waiters through C (FD: C's descriptor, asynchronous;
 * < 0: threads) while HOLDERS hold the names (spread: one each; else
 * one), then handed along. 0, ASYNC_ONE_PER_CLIENT, or the exit code
 * of a failure. */
static int async_side_run(const struct bench_opts *o, dlock_client *c, int fd,
                          dlock_lock **holders, struct async_side *s)
{
    int64_t wait_ms = 120000 + 20 * (int64_t)o->waiters; /* the whole line's turn, loaded */
    dlock_lock **l = calloc((size_t)o->waiters, sizeof *l);
    pthread_t *th = fd < 0 ? calloc((size_t)o->waiters, sizeof *th) : NULL;
    struct async_waiter *b = s->args = calloc((size_t)o->waiters, sizeof *b);
    s->released = o->async_spread ? calloc((size_t)o->waiters, sizeof *s->released) : NULL;
    proc_status(&s->threads0, &s->rss0);
    int64_t t0 = now_ns();
    int rc = async_start(o, c, fd, l, th, b, wait_ms, s);
    if (!rc) {
        async_settle(c, fd, s);
        s->settle_s = (double)(now_ns() - t0) / 1e9;
        proc_status(&s->threads, &s->rss);
        int64_t released = now_ns();
        pthread_mutex_lock(&s->mu);
        s->released_at = released;
        pthread_mutex_unlock(&s->mu);
        if (o->async_spread)
            rc = async_release_each(c, fd, holders, wait_ms, s);
        else if ((rc = dlock_release(holders[0])))
            rc = cli_fail(rc, "bench async: the holder's release");
        async_pump(c, fd, s, (double)wait_ms / 1000 + 10);
        s->pass_s = (double)(now_ns() - released) / 1e9;
    }
    for (int i = 0; th && i < s->w; i++)
        pthread_join(th[i], NULL);
    if (!rc && s->failed && !s->failures_counted) {
        fprintf(stderr, "dlock: %s: %s\n", s->what, s->err);
        rc = EXIT_UNAVAILABLE;
    } else if (!rc && s->ended < s->w) {
        fprintf(stderr, "dlock: %s: %d of %d waiters still waiting\n", s->what, s->w - s->ended,
                s->w);
        rc = EXIT_SOFTWARE;
    }
    for (int i = 0; i < o->waiters; i++)
        dlock_lock_free(l[i]); /* a call still in flight (a failure) ends ECANCELED */
    free(l);
    free(th);
    free(s->released);
    s->released = NULL;
    return rc;
}

/* A row of the table: WHAT, then each side's cell. */
static void async_row(const char *what, const char cells[2][48])
{
    printf("  %-26s %-24s %s\n", what, cells[0], cells[1]);
}

static void async_print(struct async_side *s)
{
    char cells[2][48];
    for (int i = 0; i < 2; i++)
        snprintf(cells[i], sizeof cells[i], "%d in %.2f s", s[i].w, s[i].settle_s);
    async_row("waiting, all after", cells);
    for (int i = 0; i < 2; i++)
        snprintf(cells[i], sizeof cells[i], "%d (%d before)", s[i].threads, s[i].threads0);
    async_row("threads in the process", cells);
    for (int i = 0; i < 2; i++)
        snprintf(cells[i], sizeof cells[i], "%.2f KiB",
                 s[i].w ? (double)(s[i].rss - s[i].rss0) / s[i].w : 0);
    async_row("memory per waiter", cells);
    for (int p = 50; p <= 99; p += 49) {
        char row[32];
        snprintf(row, sizeof row, "hand-off p%d", p);
        for (int i = 0; i < 2; i++)
            snprintf(cells[i], sizeof cells[i], "%.1f us", pct_us(&s[i].handoff, p));
        async_row(row, cells);
    }
    for (int i = 0; i < 2; i++)
        snprintf(cells[i], sizeof cells[i], "%d in %.2f s", s[i].acquired, s[i].pass_s);
    async_row("holds, handed along", cells);
    for (int i = 0; i < 2; i++)
        if (s[i].failed)
            printf("  %s: %d of %d waiters failed, the first: %s\n", s[i].what, s[i].failed, s[i].w,
                   s[i].err);
    printf("  (memory per waiter: (RSS once all wait - RSS before) / waiters, handles included;\n"
           "  hand-off: from a release sent to the next waiter's callback dispatched, or its\n"
           "  dlock_acquire() returning)\n");
    if (s[1].note[0])
        printf("  blocking: %d threads, the most this machine allowed (%s)\n", s[1].w, s[1].note);
}

/* Side S on a client of its own, after HOLDERS (of another client; one,
 * or spread one per waiter) took the names; they let go before this
 * returns. 0, ASYNC_ONE_PER_CLIENT, or the exit code of a failure. */
static int async_side_on_client(const struct bench_opts *o, dlock_lock **holders, bool async,
                                struct async_side *s)
{
    int n = o->async_spread ? o->waiters : 1;
    dlock_client *wc = NULL;
    int fd = -1, e = dlock_open(o->url, &wc);
    for (int i = 0; !e && i < n; i++)
        e = dlock_acquire(holders[i], DLOCK_TRY);
    if (!e && async && (fd = dlock_client_fd(wc)) < 0)
        e = fd;
    int rc = e ? cli_fail(e, s->what) : async_side_run(o, wc, fd, holders, s);
    for (int i = 0; i < n; i++)
        if (dlock_hold_count(holders[i]))
            dlock_release(holders[i]);
    dlock_client_close(wc);
#ifdef __GLIBC__
    malloc_trim(0); /* the next side's RSS grows from what is in use, not from a cache */
#endif
    return rc;
}

/* The holders of the async mode's names on C (spread: one per waiter),
 * or NULL with the exit code of a failure in *RC. */
static dlock_lock **async_holders(const struct bench_opts *o, dlock_client *c, int *rc)
{
    int n = o->async_spread ? o->waiters : 1;
    dlock_lock **h = calloc((size_t)n, sizeof *h);
    for (int i = 0; h && i < n; i++) {
        char name[64];
        async_name(o, i, name, sizeof name);
        int e = dlock_lock_new(c, name, DLOCK_EXCLUSIVE, 0, &h[i]);
        if (e) {
            *rc = cli_fail(e, "bench async");
            return h;
        }
    }
    return h;
}

static void async_holders_free(const struct bench_opts *o, dlock_lock **h)
{
    for (int i = 0; h && i < (o->async_spread ? o->waiters : 1); i++)
        dlock_lock_free(h[i]);
    free(h);
}

static void async_side_init(struct async_side *s, const char *what, bool failures_counted)
{
    *s = (struct async_side){.what = what, .failures_counted = failures_counted};
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->took, NULL);
}

static void async_side_clear(struct async_side *s)
{
    free(s->handoff.v);
    free(s->args);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->took);
}

static int bench_async(const struct bench_opts *o, dlock_client *c)
{
    struct bench_opts one = *o;
    one.waiters = o->async_waiters;
    int rc = 0;
    dlock_lock **holders = async_holders(&one, c, &rc);
    struct async_side s[2];
    async_side_init(&s[0], "bench async (async side)", false);
    async_side_init(&s[1], "bench async (blocking side)", true);
    if (!rc && (rc = async_side_on_client(&one, holders, true, &s[0])) == ASYNC_ONE_PER_CLIENT) {
        printf("async: the %s backend lets one client acquire a name once at a time, so the "
               "waiters\n  are spread: one per name\n",
               dlock_client_backend(c));
        async_holders_free(&one, holders);
        one.async_spread = true;
        rc = 0;
        holders = async_holders(&one, c, &rc);
        async_side_clear(&s[0]);
        async_side_init(&s[0], "bench async (async side)", false);
        if (!rc)
            rc = async_side_on_client(&one, holders, true, &s[0]);
    }
    if (!rc)
        rc = async_side_on_client(&one, holders, false, &s[1]);
    if (!rc) {
        if (one.async_spread)
            printf("async: %d waiters on one client, each on a name of its own the bench holds "
                   "(another\n  client), released one by one; beside the same waiters as threads "
                   "blocked in\n  dlock_acquire()\n",
                   one.waiters);
        else
            printf("async: %d waiters on one client, on one name the bench holds (another "
                   "client), then\n  handed along; beside the same waiters as threads blocked in "
                   "dlock_acquire()\n",
                   one.waiters);
        char cells[2][48] = {"async (1 client)", "blocking (1 client)"};
        async_row("", cells);
        async_print(s);
    }
    for (int i = 0; i < 2; i++)
        async_side_clear(&s[i]);
    async_holders_free(&one, holders);
    return rc;
}

/* --------------------------------------------------------------- main */

/* The modes, in the order `all` (and no mode named) runs them; each gets
 * the client dlock_cli_bench opened. ON_ITS_OWN: run when named only
 * (async: thousands of threads on its blocking side). */
static const struct bench_mode {
    const char *name;
    int (*run)(const struct bench_opts *o, dlock_client *c);
    bool on_its_own;
} modes[] = {{"uncontended", bench_uncontended, false}, {"contended", bench_contended, false},
             {"renewal", bench_renewal, false},         {"readers", bench_readers, false},
             {"semaphore", bench_semaphore, false},     {"multi", bench_multi, false},
             {"async", bench_async, true}};
#define NMODES (sizeof modes / sizeof modes[0])

int dlock_cli_bench(const char *url, int argc, char **argv)
{
    struct bench_opts o = {.url = url, .threads = 1, .names = 1024, .waiters = 8, .locks = 10000,
                           .periods = 5, .duration = 3, .lease_ms = 3000, .readers = 8,
                           .permits = 4, .members = 8};
    static const struct option longopts[] = {
        {"threads", required_argument, NULL, 't'}, {"names", required_argument, NULL, 'm'},
        {"duration", required_argument, NULL, 'd'}, {"waiters", required_argument, NULL, 'W'},
        {"locks", required_argument, NULL, 'k'},    {"periods", required_argument, NULL, 'p'},
        {"lease", required_argument, NULL, 'l'},    {"help", no_argument, NULL, 'h'},
        {"readers", required_argument, NULL, 'R'},  {"writers", required_argument, NULL, 'X'},
        {"permits", required_argument, NULL, 'P'},  {"members", required_argument, NULL, 'K'},
        {"spread", no_argument, NULL, 'S'},         {"hold", required_argument, NULL, 'H'},
        {NULL, 0, NULL, 0}};
    optind = 0; /* GNU: start afresh after the global options' getopt */
    int ch;
    bool waiters_given = false;
    while ((ch = getopt_long(argc, argv, "t:m:d:W:k:p:l:R:X:P:K:H:h", longopts, NULL)) != -1) {
        switch (ch) {
        case 't': o.threads = atoi(optarg); break;
        case 'm': o.names = atoi(optarg); break;
        case 'd': o.duration = atof(optarg); break;
        case 'W': o.waiters = atoi(optarg); waiters_given = true; break;
        case 'k': o.locks = atoi(optarg); break;
        case 'p': o.periods = atoi(optarg); break;
        case 'l': o.lease_ms = atoll(optarg); break;
        case 'R': o.readers = atoi(optarg); break;
        case 'X': o.writers = atoi(optarg); break;
        case 'P': o.permits = atoi(optarg); break;
        case 'K': o.members = atoi(optarg); break;
        case 'S': o.async_spread = true; break;
        case 'H': o.hold_us = atoi(optarg); break;
        case 'h': fputs(usage_text, stdout); return 0;
        default: fputs(usage_text, stderr); return EXIT_USAGE;
        }
    }
    o.async_waiters = waiters_given ? o.waiters : ASYNC_DEFAULT_WAITERS;
    if (o.threads < 1 || o.names < o.threads || o.duration <= 0 || o.waiters < 2 || o.locks < 1 ||
        o.periods < 1 || o.lease_ms < 30 || o.readers < 1 || o.writers < 0 || o.permits < 1 ||
        o.permits > DLOCK_PERMITS_MAX || o.members < 2 || o.members > DLOCK_MULTI_MAX ||
        o.hold_us < 0 || o.hold_us > 1000000) {
        fprintf(stderr, "dlock bench: need threads >= 1, names >= threads, duration > 0, waiters >= 2, "
                        "locks >= 1, periods >= 1, lease >= 30 ms, readers >= 1, writers >= 0, "
                        "permits 1 to %d, members 2 to %d, hold 0 to 1000000 us\n", DLOCK_PERMITS_MAX,
                DLOCK_MULTI_MAX);
        return EXIT_USAGE;
    }
    bool want[NMODES] = {false}, all = optind >= argc;
    for (int i = optind; i < argc; i++) {
        size_t m = 0;
        while (m < NMODES && strcmp(argv[i], modes[m].name) != 0)
            m++;
        if (m < NMODES) {
            want[m] = true;
        } else if (strcmp(argv[i], "all") == 0) {
            all = true;
        } else {
            fprintf(stderr, "dlock bench: unknown mode '%s' (uncontended, contended, renewal, readers, "
                            "semaphore, multi, async, all)\n", argv[i]);
            return EXIT_USAGE;
        }
    }

    dlock_client *c = NULL;
    int rc = dlock_open(url, &c);
    if (rc)
        return cli_fail(rc, "bench");
    o.url = dlock_client_url(c); /* the default URL too; password kept out */
    /* the baseline dials with the URL as given (it may carry a password) */
    const char *scheme_end = url ? strstr(url, "://") : NULL;
    for (size_t i = 0; scheme_end && baselines[i]; i++)
        if (strlen(baselines[i]->scheme) == (size_t)(scheme_end - url) &&
            strncmp(url, baselines[i]->scheme, (size_t)(scheme_end - url)) == 0)
            o.base = baselines[i];
    if (url)
        o.url = url;
    printf("dlock bench on %s (%s backend), %ld cores\n", dlock_client_url(c), dlock_client_backend(c),
           sysconf(_SC_NPROCESSORS_ONLN));
    printf("baseline: %s\n", o.base ? o.base->what : "none for this backend");
    for (size_t m = 0; !rc && m < NMODES; m++)
        if ((all && !modes[m].on_its_own) || want[m])
            rc = modes[m].run(&o, c);
    dlock_client_close(c);
    return rc;
}
