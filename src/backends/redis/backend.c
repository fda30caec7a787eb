/* backend.c -- the Redis backend as the core sees it: a client assembled
 * from its URL (open, open_node, close) and the table of what it does.
 *
 * Everything else of the backend stands in a layer of its own (redis.h
 * draws them): this file is the top one, the only one that calls into
 * every layer -- the pool's state, the routing's parse and start
 * (sentinel.c, cluster.c), the scripts' load, the hub's thread -- so that
 * no file below has to call up to put a client together. It also hands
 * the pool its way up, the routing's callbacks (struct redis_routing).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "redis.h"

/* ============================================================ open/close */

/* What the pool asks of the routing of a redis+sentinel:// or
 * redis+cluster:// client (conn.c, struct redis_routing): so the pool,
 * below the routing, reaches it only through the state it is given. */
static const struct redis_routing sentinel_routing = {
    .master = dlock__redis_sentinel_master,
    .master_moved = dlock__redis_sentinel_stale,
};

static const struct redis_routing cluster_routing = {
    .slots_moved = dlock__redis_cluster_stale,
};

void dlock__redis_close(void *state)
{
    struct redis_state *s = state;
    if (!s)
        return;
    if (s->hub.efd >= 0) {
        dlock__redis_hub_stop(s);
        close(s->hub.efd);
    }
    dlock__redis_cluster_free(s);
    dlock__redis_state_free(s); /* the cleanup queue freed every pending cancel */
}

static int parse_db(struct redis_state *s, const char *text, const char *from)
{
    char *end;
    errno = 0;
    long db = strtol(text, &end, 10);
    if (!*text || *end || errno || db < 0 || db > 1000000)
        return dlock__err(DLOCK_EBADURL, "bad URL '%s': %s '%s' is not a database number",
                          s->c->url.redacted, from, text);
    s->db = (int)db;
    return DLOCK_OK;
}

int dlock__redis_open(struct dlock_client *c, void **state)
{
    return dlock__redis_open_node(c, -1, state);
}

int dlock__redis_open_node(struct dlock_client *c, int node, void **state)
{
    struct redis_state *s = dlock__redis_state_new(c);
    if (!s)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    const char *url = c->url.redacted;
    int rc = DLOCK_OK;

    const char *db_param = dlock__url_param(&c->url, "db");
    if (strcmp(c->url.scheme, "redis+unix") == 0) {
        if (c->url.nhosts > 0 && c->url.hosts[0].host && *c->url.hosts[0].host)
            rc = dlock__err(DLOCK_EBADURL, "bad URL '%s': redis+unix:///path/to/socket takes no host",
                            url);
        else if (!c->url.path || strlen(c->url.path) < 2)
            rc = dlock__err(DLOCK_EBADURL, "bad URL '%s': redis+unix:// needs a socket path, e.g. "
                                           "redis+unix:///run/redis/redis.sock",
                            url);
        else if (!(s->sock = dlock__strdup(c->url.path)))
            rc = DLOCK_ENOMEM;
        if (!rc)
            snprintf(s->where, sizeof s->where, "redis unix:%s", s->sock);
        if (!rc && db_param)
            rc = parse_db(s, db_param, "db");
    } else if (strstr(c->url.scheme, "+sentinel")) {
        rc = dlock__redis_sentinel_parse(s, c);
        s->routing = &sentinel_routing;
        const char *name_end = !rc ? strchr(c->url.path + 1, '/') : NULL;
        if (!rc && name_end && db_param)
            rc = dlock__err(DLOCK_EBADURL, "bad URL '%s': the db is given twice (path and ?db=)",
                            url);
        else if (!rc && name_end)
            rc = parse_db(s, name_end + 1, "path");
        else if (!rc && db_param)
            rc = parse_db(s, db_param, "db");
    } else if (strstr(c->url.scheme, "+cluster")) {
        rc = dlock__redis_cluster_parse(s, c);
        s->routing = &cluster_routing; /* each master's state takes it too (cluster.c) */
    } else {
        size_t hi = node < 0 ? 0 : (size_t)node;
        if (node < 0 && c->url.nhosts != 1)
            rc = dlock__err(DLOCK_EBADURL,
                            "bad URL '%s': %s:// takes exactly one host (for several, use "
                            "redlock://, redis+sentinel:// or redis+cluster://)",
                            url, c->url.scheme);
        else if (!(s->host = dlock__strdup(c->url.hosts[hi].host)))
            rc = DLOCK_ENOMEM;
        s->port = c->url.nhosts ? c->url.hosts[hi].port : 0;
        if (s->port == 0)
            s->port = REDIS_DEFAULT_PORT;
        if (!rc)
            snprintf(s->where, sizeof s->where, strchr(s->host, ':') ? "%s [%s]:%d" : "%s %s:%d",
                     node < 0 ? c->url.scheme : "redlock node", s->host, s->port);
        const char *path = c->url.path;
        if (!rc && path && strcmp(path, "/") != 0 && *path) {
            if (db_param)
                rc = dlock__err(DLOCK_EBADURL, "bad URL '%s': the db is given twice (path and ?db=)",
                                url);
            else
                rc = parse_db(s, path + 1, "path");
        } else if (!rc && db_param) {
            rc = parse_db(s, db_param, "db");
        }
    }
    if (!rc && c->opts.layout && strcmp(c->opts.layout, "redisson") != 0 &&
        strcmp(c->opts.layout, "simple") != 0 && strcmp(c->opts.layout, "fair") != 0)
        rc = dlock__err(DLOCK_EBADURL, "bad URL '%s': layout '%s' is unknown (redisson, simple "
                                       "or fair)",
                        url, c->opts.layout);
    else if (!rc && node >= 0 && c->opts.layout && strcmp(c->opts.layout, "fair") == 0)
        rc = dlock__err(DLOCK_EBADURL, "bad URL '%s': layout=fair queues waiters on one server; "
                                       "redlock:// has no fair layout (redisson or simple)",
                        url);
    bool tls = strncmp(c->url.scheme, "rediss", 6) == 0 || strcmp(c->url.scheme, "redlocks") == 0;
    if (!rc && !tls && (c->opts.tls_ca || c->opts.tls_cert || c->opts.tls_key))
        rc = dlock__err(DLOCK_EBADURL, "bad URL '%s': TLS options need rediss://", url);
    if (!rc && tls)
        rc = dlock__redis_tls_context(s, c->opts.tls_ca, c->opts.tls_cert, c->opts.tls_key);
    if (rc) {
        dlock__redis_close(s);
        return rc;
    }
    const char *sync = dlock__url_param(&c->url, "sync");
    const char *sync_timeout = dlock__url_param(&c->url, "sync_timeout");
    s->sync_timeout_ms = 1000;
    if (!rc && sync) {
        char *end;
        errno = 0;
        long n = strtol(sync, &end, 10);
        if (!*sync || *end || errno || n < 0 || n > 1000)
            rc = dlock__err(DLOCK_EBADURL, "bad URL '%s': sync=%s is not a number of replicas "
                                           "(0 to 1000)",
                            url, sync);
        s->sync_replicas = (int)n;
    }
    const char *queue_lease = dlock__url_param(&c->url, "queue_lease");
    if (!rc && queue_lease) {
        s->fair_queue_lease_ms = dlock__parse_duration(queue_lease);
        if (s->fair_queue_lease_ms < 1 || s->fair_queue_lease_ms > DLOCK__MAX_DURATION_MS)
            rc = dlock__err(DLOCK_EBADURL, "bad URL '%s': queue_lease=%s is not a duration "
                                           "(e.g. 5s)",
                            url, queue_lease);
        else if (!c->opts.layout || strcmp(c->opts.layout, "fair") != 0)
            rc = dlock__err(DLOCK_EBADURL, "bad URL '%s': queue_lease without layout=fair", url);
    }
    if (!rc && sync_timeout) {
        s->sync_timeout_ms = dlock__parse_duration(sync_timeout);
        if (s->sync_timeout_ms < 1)
            rc = dlock__err(DLOCK_EBADURL, "bad URL '%s': sync_timeout=%s is not a duration "
                                           "(e.g. 500ms, 2s)",
                            url, sync_timeout);
        else if (!sync)
            rc = dlock__err(DLOCK_EBADURL, "bad URL '%s': sync_timeout without sync=N", url);
    }
    if (rc) {
        dlock__redis_close(s);
        return rc;
    }
    s->simple = c->opts.layout && strcmp(c->opts.layout, "simple") == 0;
    s->fair = c->opts.layout && strcmp(c->opts.layout, "fair") == 0;
    s->user = c->opts.user;
    s->password = c->opts.password;
    if (!s->password) { /* DLOCK_REDIS_PASSWORD or the file DLOCK_REDIS_PASSWORD_FILE names */
        rc = dlock__password_env("DLOCK_REDIS_PASSWORD", &s->env_password);
        s->password = s->env_password;
        if (rc) {
            dlock__redis_close(s);
            return rc;
        }
    }
    s->connect_timeout_ms = c->opts.connect_timeout_ms > 0 ? c->opts.connect_timeout_ms : 5000;
    s->op_timeout_ms = c->opts.op_timeout_ms > 0 ? c->opts.op_timeout_ms : 5000;
    s->prefix = c->opts.key_prefix;
    dlock__uuid(s->uuid);
    for (int i = 0; i < S_COUNT; i++)
        s->src[i] = dlock__redis_script((enum script_id)i, s->simple)->src;

    s->hub.efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->hub.efd < 0) {
        rc = dlock__errno(DLOCK_EIO, errno, "%s: eventfd", s->where);
        dlock__redis_close(s);
        return rc;
    }
    if (s->cluster)
        rc = dlock__redis_cluster_start(s, dlock__redis_load_scripts); /* the map, the scripts */
    else
        rc = node < 0 ? dlock__redis_load_scripts(s) : DLOCK_OK; /* a node may be down now */
    if (!rc && s->sentinel)
        rc = dlock__redis_hub_start(s); /* +switch-master, for holders and idle connections too */
    if (rc) {
        dlock__redis_close(s);
        return rc;
    }
    *state = s;
    return DLOCK_OK;
}

/* ================================================================ table */

static const char *const redis_schemes[] = {"redis",          "rediss",          "redis+unix",
                                            "redis+sentinel", "rediss+sentinel", "redis+cluster",
                                            "rediss+cluster", NULL};

static const struct dlock__lock_ops redis_lock_ops = {
    .acquire = dlock__redis_acquire,
    .release = dlock__redis_release_hold,
    .release_within = dlock__redis_release_within,
    .downgrade = dlock__redis_rw_downgrade,
    .try_armed = dlock__redis_try_armed,
    .disarm = dlock__redis_disarm,
};

static const struct dlock__multi_ops redis_multi_ops = {
    .acquire = dlock__redis_multi_acquire,
    .release = dlock__redis_multi_release,
};

static const struct dlock__sem_ops redis_sem_ops = {
    .acquire = dlock__redis_sem_acquire,
    .release = dlock__redis_sem_release,
    .try_armed = dlock__redis_sem_try_armed,
    .disarm = dlock__redis_sem_disarm,
    .inspect = dlock__redis_sem_inspect,
    .list = dlock__redis_sem_list,
};

static const struct dlock__elect_ops redis_elect_ops = {
    .acquire = dlock__redis_elect_acquire,
    .release = dlock__redis_elect_release,
    .proclaim = dlock__redis_elect_proclaim,
    .observe = dlock__redis_elect_observe,
    .try_armed = dlock__redis_elect_try_armed,
    .disarm = dlock__redis_disarm,
};

static const struct dlock__admin_ops redis_admin_ops = {
    .inspect = dlock__redis_inspect,
    .check = dlock__redis_check,
    .force_release = dlock__redis_force_release,
    .list = dlock__redis_list,
    .master = dlock__redis_master,
};

const struct dlock__backend dlock__backend_redis = {
    .name = "redis",
    .schemes = redis_schemes,
    .caps = DLOCK__CAP_SHARED | DLOCK__CAP_LEASES | DLOCK__CAP_FIXED_LEASE |
            DLOCK__CAP_FAIR | DLOCK__CAP_LOCK_DELAY,
    .default_port = REDIS_DEFAULT_PORT,
    .open = dlock__redis_open,
    .close = dlock__redis_close,
    .renew = dlock__redis_renew,
    .locks = &redis_lock_ops,
    .multi = &redis_multi_ops,
    .semaphores = &redis_sem_ops,
    .elections = &redis_elect_ops,
    .admin = &redis_admin_ops,
    .values = &dlock__redis_value_ops,
    .guarded = &dlock__redis_guarded_ops,
    .contend = &dlock__redis_contend_ops,
};

