/* bench.h -- `dlock bench`: the built-in benchmark, and the table of raw
 * protocol baselines it measures beside dlock in the same run.
 *
 * A baseline is the cheapest correct thing the same client library can do
 * on the backend's own protocol (for Redis: SET NX PX + a compare-and-
 * delete script; PING for one round trip). Each backend with a network
 * protocol adds one `struct dlock_bench_baseline` (cli/bench_redis.c today;
 * cli/bench_etcd.c and cli/bench_zk.c can follow) and a row in
 * dlock_bench_baselines[] in cli/bench.c.
 */
#ifndef DLOCK_CLI_BENCH_H
#define DLOCK_CLI_BENCH_H

#include <stddef.h>

/* Run `dlock [-u URL] bench ARGV...` (argv[0] is "bench"). Returns the
 * process exit code. */
int dlock_cli_bench(const char *url, int argc, char **argv);

/* The usage text of `dlock bench` (for `dlock help bench`). */
const char *dlock_cli_bench_usage(void);

#define DLOCK_BENCH_MAX_FLOORS 3

/* One backend's raw-protocol baseline. Every function works on a
 * connection made by connect() and used by one thread only. */
struct dlock_bench_baseline {
    const char *scheme; /* URL scheme served, e.g. "redis" */
    const char *what;   /* one line saying what the baseline does */
    /* Dial the server named by URL; NULL with ERR filled on failure. */
    void *(*connect)(const char *url, char *err, size_t errlen);
    void (*disconnect)(void *conn);
    /* Take and give back NAME the cheapest correct way: 0 on success,
     * 1 when it was busy, -1 on a failure. */
    int (*lock_unlock)(void *conn, const char *name);
    /* One round trip to the server: 0 or -1. */
    int (*round_trip)(void *conn);
    /* Lock commands the server has run so far (for counting renewal
     * calls); -1 when unknown. NULL: never known. */
    long long (*server_calls)(void *conn);
    /* Raw floors measured in the same rounds of `bench uncontended`
     * (redlock: the same raw work on all N nodes at once, and on the
     * first alone, and on all N answering at a majority): NFLOORS of
     * them, FLOOR_WHAT[f] saying what floor F is, FLOOR_LOCK_UNLOCK doing
     * it (returns as lock_unlock). 0: none. */
    int nfloors;
    const char *floor_what[DLOCK_BENCH_MAX_FLOORS];
    int (*floor_lock_unlock)(void *conn, int floor, const char *name);
};

/* Decode the %XX escapes of S (a part of a URL) in place, for the
 * baselines that take the user, password or path apart themselves. */
void dlock_bench_pct_decode(char *s);

/* The handles of a baseline that measures dlock itself on another URL
 * (redlock://: the first node alone; redis+cluster://: every name on one
 * master), one per name as the dlock side keeps, made on first use in an
 * open-addressing table (cli/bench_handles.c). */
#define DLOCK_BENCH_HANDLES 4096
struct dlock_client;
struct dlock_lock;
struct dlock_bench_handles {
    char *names[DLOCK_BENCH_HANDLES];
    struct dlock_lock *locks[DLOCK_BENCH_HANDLES];
};
/* acquire(TRY) + release of the handle through C on NAME with SUFFIX
 * appended (may be ""): returns as lock_unlock does. */
int dlock_bench_handles_lock_unlock(struct dlock_bench_handles *t, struct dlock_client *c,
                                    const char *name, const char *suffix);
/* Free every handle of T (before closing their client). */
void dlock_bench_handles_free(struct dlock_bench_handles *t);

#ifdef DLOCK_HAVE_REDIS
struct redisContext;
/* One PING round trip on CTX: 0, or -1 (cli/bench_redis.c). */
int dlock_bench_redis_ping(struct redisContext *ctx);
/* A connection to HOST:PORT, or NULL with ERR saying why. */
struct redisContext *dlock_bench_redis_dial(const char *host, int port, char *err, size_t errlen);
extern const struct dlock_bench_baseline dlock_bench_redis_baseline;
extern const struct dlock_bench_baseline dlock_bench_redis_unix_baseline;
/* redlock://: dlock on the first node alone (cli/bench_redlock.c) */
extern const struct dlock_bench_baseline dlock_bench_redlock_baseline;
/* redis+cluster://: dlock with every name on one master (cli/bench_cluster.c) */
extern const struct dlock_bench_baseline dlock_bench_cluster_baseline;
#endif
#ifdef DLOCK_HAVE_ZK
extern const struct dlock_bench_baseline dlock_bench_zk_baseline;
#endif
#ifdef DLOCK_HAVE_ETCD
extern const struct dlock_bench_baseline dlock_bench_etcd_baseline;
#endif
#ifdef DLOCK_HAVE_POSTGRES
/* postgres:// and postgresql:// (cli/bench_postgres.c) */
extern const struct dlock_bench_baseline dlock_bench_postgres_baseline;
extern const struct dlock_bench_baseline dlock_bench_postgresql_baseline;
#endif
#ifdef DLOCK_HAVE_MYSQL
/* mysql:// and mariadb:// (cli/bench_mysql.c) */
extern const struct dlock_bench_baseline dlock_bench_mysql_baseline;
extern const struct dlock_bench_baseline dlock_bench_mariadb_baseline;
#endif

#endif
