/* bench_mysql.c -- the raw MySQL/MariaDB baseline of `dlock bench`.
 *
 * The floor of a user lock with the same client library (libmariadb,
 * reached through the library's own dlopen() table, as the etcd
 * baseline reaches libcurl): SELECT GET_LOCK(name, 0) (1 = ours, 0 =
 * busy), then SELECT RELEASE_LOCK(name) -- two round trips, as dlock's
 * acquire and release are (its acquire's statement also reads the fencing
 * token's MEMORY row and UUID_SHORT()); the ratio shows what that and the
 * client's bookkeeping cost. One round trip is
 * SELECT 1. It parses just enough of the URL (user:password@host:port
 * and the database) to reach the same server.
 */
#ifdef DLOCK_HAVE_MYSQL

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/mysql/mysql.h"
#include "bench.h"
#include "dlock.h"

struct mysql_raw {
    MYSQL *db;
};

/* SQL on R, blocking; its first value as a number into *VAL (-1 for
 * NULL). 0, or -1 on a failure. */
static int raw_value(struct mysql_raw *r, const char *sql, long long *val)
{
    if (dlock__mariadb.real_query(r->db, sql, strlen(sql)))
        return -1;
    MYSQL_RES *res = dlock__mariadb.store_result(r->db);
    if (!res)
        return val ? -1 : 0;
    MYSQL_ROW row = mysql_fetch_row(res);
    if (val)
        *val = row && row[0] ? atoll(row[0]) : -1;
    mysql_free_result(res);
    return 0;
}

static void *mysql_raw_connect(const char *url, char *err, size_t errlen)
{
    const char *rest = strncmp(url, "mysql://", 8) == 0      ? url + 8
                       : strncmp(url, "mariadb://", 10) == 0 ? url + 10
                                                             : NULL;
    if (!rest) {
        snprintf(err, errlen, "not a mysql:// URL: %s", url);
        return NULL;
    }
    if (dlock__mariadb_load() != DLOCK_OK) {
        snprintf(err, errlen, "the mysql baseline needs libmariadb: %s", dlock_errmsg());
        return NULL;
    }
    char *s = strdup(rest);
    struct mysql_raw *r = calloc(1, sizeof *r);
    if (!s || !r || !(r->db = mysql_init(NULL))) {
        free(s);
        free(r);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    char *q = strchr(s, '?');
    if (q)
        *q = 0;
    char *user = NULL, *password = NULL, *host = s, *db = NULL;
    char *at = strrchr(s, '@');
    if (at) {
        *at = 0;
        user = s;
        host = at + 1;
        if ((password = strchr(user, ':')))
            *password++ = 0;
        dlock_bench_pct_decode(user);
        if (password)
            dlock_bench_pct_decode(password);
    }
    char *slash = strchr(host, '/');
    if (slash) {
        *slash = 0;
        db = slash + 1;
    }
    unsigned port = 3306;
    char *colon = strrchr(host, ':');
    if (colon) {
        *colon = 0;
        port = (unsigned)atoi(colon + 1);
    }
    if (!dlock__mariadb.real_connect(r->db, host, user, password, db, port, NULL, 0)) {
        snprintf(err, errlen, "mysql %s:%u: %s", host, port, mysql_error(r->db));
        mysql_close(r->db);
        free(r);
        r = NULL;
    }
    free(s);
    return r;
}

static void mysql_raw_disconnect(void *conn)
{
    struct mysql_raw *r = conn;
    if (!r)
        return;
    mysql_close(r->db);
    free(r);
}

static int mysql_raw_lock_unlock(void *conn, const char *name)
{
    /* bench names are "dlock-bench:...": plain characters, no quoting */
    char sql[256];
    long long got = -1, released = -1;
    snprintf(sql, sizeof sql, "SELECT GET_LOCK('%s.raw', 0)", name);
    if (raw_value(conn, sql, &got) || got < 0)
        return -1;
    if (got == 0)
        return 1;
    snprintf(sql, sizeof sql, "SELECT RELEASE_LOCK('%s.raw')", name);
    return raw_value(conn, sql, &released) || released != 1 ? -1 : 0;
}

static int mysql_raw_round_trip(void *conn)
{
    long long v = 0;
    return raw_value(conn, "SELECT 1", &v) == 0 && v == 1 ? 0 : -1;
}

const struct dlock_bench_baseline dlock_bench_mysql_baseline = {
    .scheme = "mysql",
    .what = "libmariadb: SELECT GET_LOCK(<name>.raw, 0) + SELECT RELEASE_LOCK (2 round trips; "
            "as dlock's acquire and release); SELECT 1 for one round trip",
    .connect = mysql_raw_connect,
    .disconnect = mysql_raw_disconnect,
    .lock_unlock = mysql_raw_lock_unlock,
    .round_trip = mysql_raw_round_trip,
};

const struct dlock_bench_baseline dlock_bench_mariadb_baseline = {
    .scheme = "mariadb",
    .what = "libmariadb: SELECT GET_LOCK(<name>.raw, 0) + SELECT RELEASE_LOCK (2 round trips; "
            "as dlock's acquire and release); SELECT 1 for one round trip",
    .connect = mysql_raw_connect,
    .disconnect = mysql_raw_disconnect,
    .lock_unlock = mysql_raw_lock_unlock,
    .round_trip = mysql_raw_round_trip,
};

#endif /* DLOCK_HAVE_MYSQL */
