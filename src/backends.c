/* backends.c -- the table of backends this library was built with.
 *
 * Every backend DESIGN.md names has a row, built or not: a URL for a
 * backend left out of the build (its client library was missing) gives
 * DLOCK_ENOTBUILT naming what to install, never "unknown scheme".
 */
#include <string.h>

#include "core.h"

extern const struct dlock__backend dlock__backend_file;
#ifdef DLOCK_HAVE_REDIS
extern const struct dlock__backend dlock__backend_redis;
#endif
#ifdef DLOCK_HAVE_ETCD
extern const struct dlock__backend dlock__backend_etcd;
#endif
#ifdef DLOCK_HAVE_ZK
extern const struct dlock__backend dlock__backend_zk;
#endif

static const struct {
    const char *scheme;
    const struct dlock__backend *be; /* NULL = not built */
    const char *needs;
} table[] = {
    {"file", &dlock__backend_file, NULL},
#ifdef DLOCK_HAVE_REDIS
    {"redis", &dlock__backend_redis, NULL},
    {"redis+unix", &dlock__backend_redis, NULL},
    {"redis+sentinel", &dlock__backend_redis, NULL},
    {"redlock", &dlock__backend_redis, NULL},
#else
    {"redis", NULL, "hiredis (libhiredis-dev)"},
    {"redis+unix", NULL, "hiredis (libhiredis-dev)"},
    {"redis+sentinel", NULL, "hiredis (libhiredis-dev)"},
    {"redlock", NULL, "hiredis (libhiredis-dev)"},
#endif
#ifdef DLOCK_HAVE_ETCD
    {"etcd", &dlock__backend_etcd, NULL},
    {"etcd+https", &dlock__backend_etcd, NULL},
#else
    {"etcd", NULL, "libcurl and jansson (libcurl4-openssl-dev libjansson-dev)"},
    {"etcd+https", NULL, "libcurl and jansson (libcurl4-openssl-dev libjansson-dev)"},
#endif
#ifdef DLOCK_HAVE_ZK
    {"zk", &dlock__backend_zk, NULL},
#else
    {"zk", NULL, "the ZooKeeper C client (libzookeeper-mt-dev)"},
#endif
};

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
        if (be->version < 1) {
            *err = dlock__err(DLOCK_EPROTO, "backend %s has an unknown table version %u", be->name,
                              be->version);
            return NULL;
        }
        *err = DLOCK_OK;
        return be;
    }
    *err = dlock__err(DLOCK_EBADURL,
                      "unknown URL scheme '%s://' (known: file, redis, redis+unix, "
                      "redis+sentinel, redlock, etcd, etcd+https, zk)",
                      scheme);
    return NULL;
}
