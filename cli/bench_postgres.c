/* bench_postgres.c -- the raw PostgreSQL baseline of `dlock bench`.
 *
 * The floor of an advisory lock with the same client library (libpq, on
 * one session): pg_try_advisory_lock(key) then pg_advisory_unlock(key),
 * two round trips, the key hashed as dlock hashes names (of NAME.raw, so
 * the two sides never meet). dlock does the same two trips, with the
 * token's nextval() and the name's row in them (src/backends/postgres/);
 * the ratio shows what those cost. One round trip is SELECT 1. It keeps
 * of the URL what libpq understands (the scheme, user, password, hosts,
 * database and libpq's own query keywords), dropping dlock's options, and
 * runs with the session settings dlock's sessions run with (the lease's
 * idle_session_timeout, keepalives, client_connection_check_interval,
 * synchronous_commit: the server arms a timer or two per statement for
 * them), so that the two sides differ only in what dlock sends.
 */
#ifdef DLOCK_HAVE_POSTGRES

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/postgres/pg.h"
#include "bench.h"
#include "dlock.h"

/* URL without the query options libpq would refuse (dlock's own). */
static char *libpq_url(const char *url)
{
    static const char *const keep[] = {"host",
                                       "hostaddr",
                                       "port",
                                       "dbname",
                                       "user",
                                       "password",
                                       "sslmode",
                                       "sslrootcert",
                                       "sslcert",
                                       "sslkey",
                                       "options",
                                       "passfile",
                                       "target_session_attrs",
                                       NULL};
    char *out = malloc(strlen(url) + 1), *copy = strdup(url);
    if (!out || !copy) {
        free(out);
        free(copy);
        return NULL;
    }
    char *query = strchr(copy, '?');
    if (query)
        *query++ = '\0';
    strcpy(out, copy);
    char sep = '?';
    for (char *kv = query ? strtok(query, "&") : NULL; kv; kv = strtok(NULL, "&")) {
        size_t klen = strcspn(kv, "=");
        for (const char *const *k = keep; *k; k++)
            if (strlen(*k) == klen && strncmp(kv, *k, klen) == 0) {
                size_t len = strlen(out);
                out[len] = sep;
                strcpy(out + len + 1, kv);
                sep = '&';
            }
    }
    free(copy);
    return out;
}

static void *pg_raw_connect(const char *url, char *err, size_t errlen)
{
    if (dlock__pq_load() != DLOCK_OK) {
        snprintf(err, errlen, "the postgres baseline needs libpq: %s", dlock_errmsg());
        return NULL;
    }
    char *u = libpq_url(url);
    PGconn *pq = u ? dlock__pq.connectdb(u) : NULL;
    free(u);
    if (!pq || dlock__pq.status(pq) != CONNECTION_OK) {
        snprintf(err, errlen, "postgres: %s", pq ? dlock__pq.errorMessage(pq) : "out of memory");
        if (pq)
            dlock__pq.finish(pq);
        return NULL;
    }
    /* the lease dlock's client on URL runs with, and its settings */
    long long lease_ms = 30000;
    dlock_client *c = NULL;
    if (dlock_open(url, &c) == DLOCK_OK) {
        lease_ms = c->opts.lease_ms;
        dlock_client_close(c);
    }
    char sets[600];
    PGresult *r = dlock__pg_lease_settings(lease_ms, true, sets, sizeof sets)
                      ? dlock__pq.exec(pq, sets)
                      : NULL;
    if (!r || dlock__pq.resultStatus(r) != PGRES_COMMAND_OK) {
        snprintf(err, errlen, "postgres: setting dlock's session settings: %s",
                 dlock__pq.errorMessage(pq));
        if (r)
            dlock__pq.clear(r);
        dlock__pq.finish(pq);
        return NULL;
    }
    dlock__pq.clear(r);
    return pq;
}

static void pg_raw_disconnect(void *conn)
{
    if (conn)
        dlock__pq.finish(conn);
}

/* SQL on CONN: the first value of its one row in VALUE (a byte), 0; -1. */
static int raw_exec(PGconn *pq, const char *sql, char *value)
{
    PGresult *r = dlock__pq.exec(pq, sql);
    int rc =
        r && dlock__pq.resultStatus(r) == PGRES_TUPLES_OK && dlock__pq.ntuples(r) == 1 ? 0 : -1;
    if (!rc)
        *value = dlock__pq.getvalue(r, 0, 0)[0];
    if (r)
        dlock__pq.clear(r);
    return rc;
}

static int pg_raw_lock_unlock(void *conn, const char *name)
{
    char *raw = malloc(strlen(name) + 5);
    if (!raw)
        return -1;
    sprintf(raw, "%s.raw", name);
    struct pg_key k;
    dlock__pg_key(raw, &k);
    free(raw);
    char sql[128], got = 0;
    snprintf(sql, sizeof sql, "SELECT pg_try_advisory_lock(%s)", k.args);
    if (raw_exec(conn, sql, &got))
        return -1;
    if (got != 't')
        return 1;
    snprintf(sql, sizeof sql, "SELECT pg_advisory_unlock(%s)", k.args);
    return raw_exec(conn, sql, &got) == 0 && got == 't' ? 0 : -1;
}

static int pg_raw_round_trip(void *conn)
{
    char one = 0;
    return raw_exec(conn, "SELECT 1", &one);
}

const struct dlock_bench_baseline dlock_bench_postgres_baseline = {
    .scheme = "postgres",
    .what = "libpq: SELECT pg_try_advisory_lock(key) + SELECT pg_advisory_unlock(key) on one "
            "session with dlock's session settings (2 round trips, as dlock's acquire and "
            "release); SELECT 1 for one round trip",
    .connect = pg_raw_connect,
    .disconnect = pg_raw_disconnect,
    .lock_unlock = pg_raw_lock_unlock,
    .round_trip = pg_raw_round_trip,
};

const struct dlock_bench_baseline dlock_bench_postgresql_baseline = {
    .scheme = "postgresql",
    .what = "libpq: SELECT pg_try_advisory_lock(key) + SELECT pg_advisory_unlock(key) on one "
            "session with dlock's session settings (2 round trips, as dlock's acquire and "
            "release); SELECT 1 for one round trip",
    .connect = pg_raw_connect,
    .disconnect = pg_raw_disconnect,
    .lock_unlock = pg_raw_lock_unlock,
    .round_trip = pg_raw_round_trip,
};

#endif /* DLOCK_HAVE_POSTGRES */
