/* registry.c -- the table of backends this library was built with, the
 * one place that names them (the core never does).
 *
 * Every backend docs/architecture.md names has a row, built or not: a URL
 * for a backend left out of the build (its client library was missing)
 * gives DLOCK_ENOTBUILT naming what to install, never "unknown scheme".
 */
#include <string.h>

#include "internal.h"

extern const struct dlock__backend dlock__backend_file;
#ifdef DLOCK_HAVE_REDIS
extern const struct dlock__backend dlock__backend_redis;
extern const struct dlock__backend dlock__backend_redlock;
#endif
#ifdef DLOCK_HAVE_ETCD
extern const struct dlock__backend dlock__backend_etcd;
#endif
#ifdef DLOCK_HAVE_ZK
extern const struct dlock__backend dlock__backend_zk;
#endif
#ifdef DLOCK_HAVE_POSTGRES
extern const struct dlock__backend dlock__backend_postgres;
#endif
#ifdef DLOCK_HAVE_MYSQL
extern const struct dlock__backend dlock__backend_mysql;
#endif

/* The query options each backend reads itself with dlock__url_param(),
 * beyond the core's (client.c). The core refuses any other option in
 * dlock_client_new(), before a backend dials: a typo never costs a
 * connect timeout, and the list a user reads in docs/backends.md is this
 * one. (Kept here rather than in each backend's table so that the list of
 * every scheme's options is in one place; dlock_client_connect() still
 * refuses an option a backend did not consume, as a second line.) */
static const char *const no_params[] = {NULL};
static const char *const redis_params[] = {"db",          "sync",
                                           "sync_timeout", "sentinel_password",
                                           "sentinel_password_file", "queue_lease",
                                           NULL};
static const char *const redlock_params[] = {"db", "node_timeout", NULL};
static const char *const zk_params[] = {"base", "acl", NULL};
static const char *const etcd_params[] = {"max_reply", NULL};
/* libpq's connection keywords that pass through as they are
 * (src/backends/postgres/lock.c) */
static const char *const postgres_params[] = {
    "host",        "hostaddr",    "port",         "dbname",      "passfile",   "sslmode",
    "sslrootcert", "sslcert",     "sslkey",       "sslpassword", "sslcrl",     "sslsni",
    "requirepeer", "gssencmode",  "krbsrvname",   "channel_binding", "target_session_attrs",
    "service",     "options",     "ssl_min_protocol_version", "ssl_max_protocol_version", NULL};
static const char *const mysql_params[] = {"socket", NULL};

static const struct {
    const char *scheme;
    const struct dlock__backend *be; /* NULL = not built */
    const char *needs;
    const char *const *params;
} table[] = {
    {"file", &dlock__backend_file, NULL, no_params},
#ifdef DLOCK_HAVE_REDIS
    {"redis", &dlock__backend_redis, NULL, redis_params},
    {"rediss", &dlock__backend_redis, NULL, redis_params},
    {"redis+unix", &dlock__backend_redis, NULL, redis_params},
    {"redis+sentinel", &dlock__backend_redis, NULL, redis_params},
    {"rediss+sentinel", &dlock__backend_redis, NULL, redis_params},
    {"redis+cluster", &dlock__backend_redis, NULL, redis_params},
    {"rediss+cluster", &dlock__backend_redis, NULL, redis_params},
    {"redlock", &dlock__backend_redlock, NULL, redlock_params},
    {"redlocks", &dlock__backend_redlock, NULL, redlock_params},
#else
    {"redis", NULL, "hiredis and OpenSSL (libhiredis-dev libssl-dev)", redis_params},
    {"rediss", NULL, "hiredis and OpenSSL (libhiredis-dev libssl-dev)", redis_params},
    {"redis+unix", NULL, "hiredis and OpenSSL (libhiredis-dev libssl-dev)", redis_params},
    {"redis+sentinel", NULL, "hiredis and OpenSSL (libhiredis-dev libssl-dev)", redis_params},
    {"rediss+sentinel", NULL, "hiredis and OpenSSL (libhiredis-dev libssl-dev)", redis_params},
    {"redis+cluster", NULL, "hiredis and OpenSSL (libhiredis-dev libssl-dev)", redis_params},
    {"rediss+cluster", NULL, "hiredis and OpenSSL (libhiredis-dev libssl-dev)", redis_params},
    {"redlock", NULL, "hiredis and OpenSSL (libhiredis-dev libssl-dev)", redlock_params},
    {"redlocks", NULL, "hiredis and OpenSSL (libhiredis-dev libssl-dev)", redlock_params},
#endif
#ifdef DLOCK_HAVE_ETCD
    {"etcd", &dlock__backend_etcd, NULL, etcd_params},
    {"etcd+https", &dlock__backend_etcd, NULL, etcd_params},
#else
    {"etcd", NULL, "libcurl and jansson (libcurl4-openssl-dev libjansson-dev)", etcd_params},
    {"etcd+https", NULL, "libcurl and jansson (libcurl4-openssl-dev libjansson-dev)", etcd_params},
#endif
#ifdef DLOCK_HAVE_ZK
    {"zk", &dlock__backend_zk, NULL, zk_params},
#else
    {"zk", NULL, "the ZooKeeper C client (libzookeeper-mt-dev)", zk_params},
#endif
#ifdef DLOCK_HAVE_POSTGRES
    {"postgres", &dlock__backend_postgres, NULL, postgres_params},
    {"postgresql", &dlock__backend_postgres, NULL, postgres_params},
#else
    {"postgres", NULL, "libpq's headers (libpq-dev)", postgres_params},
    {"postgresql", NULL, "libpq's headers (libpq-dev)", postgres_params},
#endif
#ifdef DLOCK_HAVE_MYSQL
    {"mysql", &dlock__backend_mysql, NULL, mysql_params},
    {"mariadb", &dlock__backend_mysql, NULL, mysql_params},
#else
    {"mysql", NULL, "the MariaDB client library's headers (libmariadb-dev)", mysql_params},
    {"mariadb", NULL, "the MariaDB client library's headers (libmariadb-dev)", mysql_params},
#endif
};

const char *const *dlock__backend_params(const char *scheme)
{
    for (size_t i = 0; scheme && i < sizeof table / sizeof *table; i++)
        if (strcmp(table[i].scheme, scheme) == 0)
            return table[i].params;
    return no_params;
}

const struct dlock__backend *dlock__backend_find(const char *scheme, int *err)
{
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        if (strcmp(table[i].scheme, scheme) != 0)
            continue;
        const struct dlock__backend *be = table[i].be;
        if (!be) {
            *err = dlock__err(DLOCK_ENOTBUILT,
                              "the %s:// backend is not built into this libdlock; rebuild with %s",
                              scheme, table[i].needs);
            return NULL;
        }
        /* A scheme the backend does not list (e.g. redlock before the
         * Redlock issue) is not served yet. */
        bool listed = false;
        for (const char *const *s = be->schemes; s && *s; s++)
            listed |= strcmp(*s, scheme) == 0;
        if (!listed) {
            *err = dlock__err(DLOCK_ENOTSUP, "the %s:// scheme is not supported yet by the %s backend",
                              scheme, be->name);
            return NULL;
        }
        /* Every backend takes and gives up locks: the dispatch calls
         * these two without asking. */
        if (!be->locks || !be->locks->acquire || !be->locks->release) {
            *err = dlock__err(DLOCK_ENOTSUP, "the %s backend has no lock ops", be->name);
            return NULL;
        }
        *err = DLOCK_OK;
        return be;
    }
    *err = dlock__err(DLOCK_EBADURL,
                      "unknown URL scheme '%s://' (known: file, redis, redis+unix, "
                      "redis+sentinel, redis+cluster, redlock, redlocks, etcd, etcd+https, zk, "
                      "postgres, postgresql, mysql, mariadb)",
                      scheme);
    return NULL;
}
