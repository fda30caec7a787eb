/* lock.c -- the PostgreSQL backend: open/close, its two schema objects,
 * locks on session advisory locks, the lease, and the backend table.
 *
 * A hold is a session advisory lock (pg_advisory_lock, ..._shared) taken
 * on a session of its own, which the hold pins until it is released: the
 * lock lives exactly as long as that session, so the release goes to it
 * and nothing else can end the hold but the session's end. A wait sleeps
 * in the server, in the blocking lock call, bounded by lock_timeout (the
 * wait's deadline) and ended by a dlock cancel through PQcancel
 * (conn.c). The lease is made real by the server: every session runs
 * with idle_session_timeout = the lease, so a holder that stops talking
 * -- frozen, cut off, dead -- has its session, and its locks, ended by
 * the server one lease after its last statement, while the keeper pings
 * each pinned session every lease/3 (renew()). The fencing token is
 * nextval() of one sequence, taken in the statement that takes the lock,
 * which also sets the session's application_name to "dlock#TOKEN
 * pid@host" for inspect; every statement of a hold opens with a comment
 * naming it, which pg_stat_activity.query shows for list (pg_locks knows
 * only the key). No row is written per hold: no transaction id, no
 * commit to wait for.
 * docs/protocol-postgres.md tells the whole story.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pg.h"

static const char *const pg_schemes[] = {"postgres", "postgresql", NULL};

/* The libpq keywords a URL may pass through as they are. */
static const char *const passthrough[] = {"host",
                                          "hostaddr",
                                          "port",
                                          "dbname",
                                          "passfile",
                                          "sslmode",
                                          "sslrootcert",
                                          "sslcert",
                                          "sslkey",
                                          "sslpassword",
                                          "sslcrl",
                                          "sslsni",
                                          "requirepeer",
                                          "gssencmode",
                                          "krbsrvname",
                                          "channel_binding",
                                          "target_session_attrs",
                                          "service",
                                          "ssl_min_protocol_version",
                                          "ssl_max_protocol_version",
                                          NULL};

/* ------------------------------------------------------------ open/close */

static int add_kv(struct pg_backend *b, size_t *n, const char *key, char *value)
{
    if (!value)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    if (*n + 1 >= sizeof b->keys / sizeof *b->keys) {
        free(value);
        return dlock__err(DLOCK_EBADURL, "bad URL '%s': too many options", b->c->url.redacted);
    }
    b->keys[*n] = key;
    b->values[*n] = value;
    (*n)++;
    return DLOCK_OK;
}

static void backend_free(struct pg_backend *b)
{
    if (!b)
        return;
    dlock__pg_pool_drain(b);
    for (size_t i = 0; b->keys[i]; i++)
        free(b->values[i]);
    pthread_mutex_destroy(&b->pool_mu);
    free(b);
}

/* The server settings that make the lease real (docs/protocol-postgres.md):
 * idle sessions end one lease after their last statement, a dead peer is
 * noticed within the lease by TCP and by the check during a statement.
 * No statement_timeout: a wait is bounded by its own lock_timeout, not by
 * the role's or the database's statement_timeout. synchronous_commit on:
 * the token's sequence is logged ahead only every 32 values, and only a
 * flushed commit keeps it from going back after a crash. Into BUF as
 * libpq's `options` ("-c name=value ..."), or AS_SETS as SET statements;
 * NULL when out of room. */
char *dlock__pg_lease_settings(long long lease_ms, bool as_sets, char *buf, size_t size)
{
    long long third_s = lease_ms / 3000 > 0 ? lease_ms / 3000 : 1;
    long long check = lease_ms / 3 > 0 ? lease_ms / 3 : 1;
    char v[6][24];
    snprintf(v[0], sizeof v[0], "%lld", lease_ms);
    snprintf(v[1], sizeof v[1], "%lld", third_s);
    snprintf(v[2], sizeof v[2], "%lld", check);
    const char *const settings[][2] = {{"idle_session_timeout", v[0]},
                                       {"statement_timeout", "0"},
                                       {"synchronous_commit", "on"},
                                       {"tcp_keepalives_idle", v[1]},
                                       {"tcp_keepalives_interval", v[1]},
                                       {"tcp_keepalives_count", "3"},
                                       {"tcp_user_timeout", v[0]},
                                       {"client_connection_check_interval", v[2]}};
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof settings / sizeof *settings; i++) {
        int n = snprintf(buf + len, size - len, as_sets ? "SET %s = %s; " : "-c %s=%s ",
                         settings[i][0], settings[i][1]);
        if (n < 0 || (size_t)n >= size - len)
            return NULL;
        len += (size_t)n;
    }
    return buf;
}

static char *lease_options(const struct pg_backend *b, const char *user_options)
{
    char settings[512];
    if (!dlock__pg_lease_settings(b->c->opts.lease_ms, false, settings, sizeof settings))
        return NULL;
    return dlock__sprintf("%s%s", settings, user_options ? user_options : "");
}

/* libpq's keywords and values for every dial of B. */
static int make_conninfo(struct pg_backend *b)
{
    dlock_client *c = b->c;
    struct dlock__url *u = &c->url;
    size_t n = 0;
    int rc = DLOCK_OK;
    const char *host_param = dlock__url_param(u, "host");
    const char *port_param = dlock__url_param(u, "port");
    const char *db_param = dlock__url_param(u, "dbname");
    if (!host_param && u->nhosts) {
        char hosts[1024] = "", ports[256] = "";
        size_t hl = 0, pl = 0;
        for (size_t i = 0; i < u->nhosts; i++) {
            hl += (size_t)snprintf(hosts + hl, hl < sizeof hosts ? sizeof hosts - hl : 0, "%s%s",
                                   i ? "," : "", u->hosts[i].host);
            pl += (size_t)snprintf(ports + pl, pl < sizeof ports ? sizeof ports - pl : 0, "%s%d",
                                   i ? "," : "",
                                   u->hosts[i].port ? u->hosts[i].port : PG_DEFAULT_PORT);
        }
        rc = add_kv(b, &n, "host", dlock__strdup(hosts));
        if (!rc && !port_param)
            rc = add_kv(b, &n, "port", dlock__strdup(ports));
    }
    if (!rc && !db_param && u->path && u->path[1])
        rc = add_kv(b, &n, "dbname", dlock__strdup(u->path + 1));
    if (!rc && c->opts.user)
        rc = add_kv(b, &n, "user", dlock__strdup(c->opts.user));
    if (!rc && c->opts.password)
        rc = add_kv(b, &n, "password", dlock__strdup(c->opts.password));
    if (!rc && c->opts.tls_ca)
        rc = add_kv(b, &n, "sslrootcert", dlock__strdup(c->opts.tls_ca));
    if (!rc && c->opts.tls_cert)
        rc = add_kv(b, &n, "sslcert", dlock__strdup(c->opts.tls_cert));
    if (!rc && c->opts.tls_key)
        rc = add_kv(b, &n, "sslkey", dlock__strdup(c->opts.tls_key));
    for (const char *const *k = passthrough; !rc && *k; k++) {
        const char *v = dlock__url_param(u, *k);
        if (v)
            rc = add_kv(b, &n, *k, dlock__strdup(v));
    }
    long long connect_s = (c->opts.connect_timeout_ms + 999) / 1000;
    if (!rc)
        rc = add_kv(b, &n, "connect_timeout", dlock__sprintf("%lld", connect_s));
    if (!rc)
        rc = add_kv(b, &n, "application_name", dlock__strdup(b->ident));
    if (!rc)
        rc = add_kv(b, &n, "options", lease_options(b, dlock__url_param(u, "options")));
    /* the client's side of the lease: keepalives and a send bound */
    long long third_s = c->opts.lease_ms / 3000 > 0 ? c->opts.lease_ms / 3000 : 1;
    if (!rc)
        rc = add_kv(b, &n, "keepalives_idle", dlock__sprintf("%lld", third_s));
    if (!rc)
        rc = add_kv(b, &n, "keepalives_interval", dlock__sprintf("%lld", third_s));
    if (!rc)
        rc = add_kv(b, &n, "tcp_user_timeout", dlock__sprintf("%lld", (long long)c->opts.lease_ms));
    return rc;
}

/* The sequence of tokens, the table of holds and the table of values,
 * made if missing. */
static int ensure_schema(struct pg_backend *b, struct pg_conn *pc, int64_t deadline)
{
    static const char look[] =
        "SELECT pg_is_in_recovery(), to_regclass('" PG_SEQUENCE "') IS NOT NULL AND "
        "to_regclass('" PG_TABLE "') IS NOT NULL AND to_regclass('" PG_VALUES "') IS NOT NULL, "
        "current_setting('track_activity_query_size')";
    static const char make[] =
        "CREATE SEQUENCE IF NOT EXISTS " PG_SEQUENCE "; "
        "CREATE UNLOGGED TABLE IF NOT EXISTS " PG_TABLE " (classid int8 NOT NULL, objid int8 NOT "
        "NULL, objsubid int4 NOT NULL, pid int4 NOT NULL, name bytea NOT NULL, token int8 NOT "
        "NULL, PRIMARY KEY (classid, objid, objsubid, pid)); "
        "CREATE TABLE IF NOT EXISTS " PG_VALUES " (name bytea PRIMARY KEY, token int8 NOT NULL, "
        "value bytea NOT NULL)";
    for (int attempt = 0; attempt < 3; attempt++) {
        PGresult *r = NULL;
        struct pg_query q = {.sql = look, .what = "connect", .deadline = deadline};
        int rc = dlock__pg_exec(b, pc, &q, &r);
        if (rc)
            return rc;
        bool standby = dlock__pq.ntuples(r) == 1 && dlock__pq.getvalue(r, 0, 0)[0] == 't';
        bool ready = dlock__pq.ntuples(r) == 1 && dlock__pq.getvalue(r, 0, 1)[0] == 't';
        /* "1024" or "1kB": the bytes of a statement pg_stat_activity keeps */
        char *unit = NULL;
        long size = dlock__pq.ntuples(r) == 1 ? strtol(dlock__pq.getvalue(r, 0, 2), &unit, 10) : 0;
        b->query_text_max = unit && *unit == 'k' ? size * 1024 : size;
        dlock__pq.clear(r);
        if (standby)
            return dlock__err(DLOCK_EUNAVAIL,
                              "%s is a read-only standby (pg_is_in_recovery()): advisory locks "
                              "and tokens need the primary (target_session_attrs=read-write "
                              "picks it from a list of hosts)",
                              b->label);
        if (ready)
            return DLOCK_OK;
        struct pg_query mq = {.sql = make,
                              .what = "create " PG_SEQUENCE ", " PG_TABLE " and " PG_VALUES,
                              .deadline = deadline};
        rc = dlock__pg_exec(b, pc, &mq, &r);
        if (!rc) {
            dlock__pq.clear(r);
            return DLOCK_OK;
        }
        if (rc == DLOCK_EACCES)
            return dlock__err(DLOCK_EACCES,
                              "%s: cannot create the sequence " PG_SEQUENCE
                              " and the tables " PG_TABLE " and " PG_VALUES
                              " dlock needs (no CREATE privilege on the schema): have the owner "
                              "run docs/protocol-postgres.md's three statements once",
                              b->label);
        if (rc != DLOCK_EBACKEND) /* EBACKEND: another client made them at once: look again */
            return rc;
    }
    return dlock__err(DLOCK_EBACKEND,
                      "%s: could not create " PG_SEQUENCE ", " PG_TABLE " and " PG_VALUES,
                      b->label);
}

static int pg_open(struct dlock_client *c, void **state)
{
    *state = NULL;
    int rc = dlock__pq_load();
    if (rc)
        return rc;
    if (c->opts.layout && strcmp(c->opts.layout, "dlock") != 0 &&
        strcmp(c->opts.layout, "distributedlock") != 0)
        return dlock__err(DLOCK_EBADURL,
                          "bad URL '%s': unknown layout '%s' for postgres (the layouts: 'dlock', "
                          "the default, and 'distributedlock', the keys of .NET's "
                          "DistributedLock.Postgres)",
                          c->url.redacted, c->opts.layout);
    struct pg_backend *b = calloc(1, sizeof *b);
    if (!b)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    b->c = c;
    pthread_mutex_init(&b->pool_mu, NULL);
    b->prefix = c->opts.key_prefix ? c->opts.key_prefix : "";
    b->distributedlock_keys = c->opts.layout && strcmp(c->opts.layout, "distributedlock") == 0;
    char who[90];
    dlock__identity(who, sizeof who);
    snprintf(b->ident, sizeof b->ident, "dlock %s", who);
    /* a quote or a backslash (none in a host name) cannot end the literal */
    snprintf(b->ident_sql, sizeof b->ident_sql, "%s", who);
    for (char *p = b->ident_sql; *p; p++)
        if (*p == '\'' || *p == '\\')
            *p = '?';
    size_t len = (size_t)snprintf(b->label, sizeof b->label, "postgres");
    for (size_t i = 0; i < c->url.nhosts && len < sizeof b->label; i++)
        len += (size_t)snprintf(b->label + len, sizeof b->label - len,
                                strchr(c->url.hosts[i].host, ':') ? "%s[%s]:%d" : "%s%s:%d",
                                i ? "," : " ", c->url.hosts[i].host,
                                c->url.hosts[i].port ? c->url.hosts[i].port : PG_DEFAULT_PORT);
    if (len < sizeof b->label && c->url.path && c->url.path[1])
        snprintf(b->label + len, sizeof b->label - len, "%s", c->url.path);
    rc = make_conninfo(b);
    int64_t deadline = dlock__time_budget(DLOCK__NEVER, c->opts.connect_timeout_ms);
    struct pg_conn *pc = NULL;
    if (!rc)
        rc = dlock__pg_session(b, NULL, deadline, &pc);
    if (!rc)
        rc = ensure_schema(b, pc, dlock__time_budget(DLOCK__NEVER, c->opts.op_timeout_ms));
    dlock__pg_session_put(b, pc);
    if (rc) {
        backend_free(b);
        return rc;
    }
    *state = b;
    return DLOCK_OK;
}

static void pg_close(void *state)
{
    backend_free(state);
}

/* ------------------------------------------------------------------ locks */

static const char *lock_fn(dlock_mode mode, bool try_once)
{
    if (mode == DLOCK_SHARED)
        return try_once ? "pg_try_advisory_lock_shared" : "pg_advisory_lock_shared";
    return try_once ? "pg_try_advisory_lock" : "pg_advisory_lock";
}

static void hold_free(struct pg_hold *hb)
{
    if (hb) {
        free(hb->tag);
        free(hb->row_name_hex);
    }
    free(hb);
}

/* The one statement of an acquire: the lock; once granted, the token,
 * into application_name, which it answers ("dlock#TOKEN pid@host"; no
 * value when a try found the lock taken). The tag first, so that
 * pg_stat_activity names the hold; a CASE on the call (it evaluates its
 * THEN only after the call) costs the server a third of a FROM clause's
 * planning. A hold whose tag pg_stat_activity would cut short has its
 * name and token written in a row of dlock_holds instead (one transaction
 * id and a dead row per cycle: the price of a name that long). */
static char *acquire_sql(const struct pg_backend *b, const struct pg_hold *hb, dlock_mode mode,
                         bool try_once, const char *prelude)
{
    if (!hb->row_name_hex)
        return dlock__sprintf("%s%sSELECT CASE WHEN %s(%s)%s THEN set_config('application_name', "
                              "'" PG_HOLDING_APP "' || nextval('" PG_SEQUENCE "') || ' %s', "
                              "false) END",
                              hb->tag, prelude, lock_fn(mode, try_once), hb->key.args,
                              try_once ? "" : " IS NOT NULL", b->ident_sql);
    return dlock__sprintf(
        "%sWITH l AS (SELECT nextval('" PG_SEQUENCE "') AS t FROM %s(%s) AS got%s) "
        "INSERT INTO " PG_TABLE " SELECT %" PRId64 ", %" PRId64 ", %d, pg_backend_pid(), "
        "decode('%s', 'hex'), t FROM l ON CONFLICT (classid, objid, objsubid, pid) DO UPDATE "
        "SET name = excluded.name, token = excluded.token RETURNING set_config("
        "'application_name', '" PG_HOLDING_APP "' || token || ' %s', false)",
        prelude, lock_fn(mode, try_once), hb->key.args, try_once ? " WHERE got" : "",
        hb->key.classid, hb->key.objid, hb->key.objsubid, hb->row_name_hex, b->ident_sql);
}

/* Give up hold HB's lock on its session and put its application_name
 * back (no token): the statement of release(), and of an acquire
 * canceled as it succeeded. */
static int unlock_on(struct pg_backend *b, struct pg_hold *hb, dlock_mode mode, const char *name,
                     int64_t deadline)
{
    char forget[256] = ""; /* the row of a hold that has one */
    if (hb->row_name_hex)
        snprintf(forget, sizeof forget,
                 "DELETE FROM " PG_TABLE " WHERE classid = %" PRId64 " AND objid = %" PRId64
                 " AND objsubid = %d AND pid = pg_backend_pid(); ",
                 hb->key.classid, hb->key.objid, hb->key.objsubid);
    char *sql =
        dlock__sprintf("%sSELECT %s(%s), set_config('application_name', 'dlock %s', false)", forget,
                       mode == DLOCK_SHARED ? "pg_advisory_unlock_shared" : "pg_advisory_unlock",
                       hb->key.args, b->ident_sql);
    if (!sql)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    char what[300];
    snprintf(what, sizeof what, "release '%s'", name);
    struct pg_query q = {.sql = sql, .what = what, .deadline = deadline};
    PGresult *r = NULL;
    int rc = dlock__pg_exec(b, hb->pc, &q, &r);
    free(sql);
    if (rc == DLOCK_ECONN)
        return dlock__err(DLOCK_ELOST, "lock '%s': its session on %s has ended", name, b->label);
    if (rc)
        return rc;
    bool released = dlock__pq.ntuples(r) == 1 && dlock__pq.getvalue(r, 0, 0)[0] == 't';
    dlock__pq.clear(r);
    if (!released)
        return dlock__err(DLOCK_ELOST, "lock '%s' was no longer held by its session on %s", name,
                          b->label);
    return DLOCK_OK;
}

/* What ended a session, from the server's words MSG. */
static const char *end_cause_of(const char *msg)
{
    if (strstr(msg, "idle-session timeout"))
        return "its lease expired on the server: idle_session_timeout";
    if (strstr(msg, "administrator command"))
        return "force-released (pg_terminate_backend) or the server shut down";
    if (strstr(msg, "no answer"))
        return "the server did not answer within the lease";
    return NULL;
}

/* What ended session PC, from the error MSG, else from the last notice
 * (the FATAL the server sent while the session was idle). */
static const char *session_end_cause(const struct pg_conn *pc, const char *msg)
{
    const char *cause = end_cause_of(msg);
    if (!cause)
        cause = end_cause_of(pc->last_words);
    return cause ? cause : "the connection ended";
}

/* A lock just granted after a wait, on its session: what
 * dlock__hold_granted() reconfirms. */
struct grant {
    struct pg_backend *b;
    struct pg_conn *pc;
    const char *name;
    const char *tag; /* the hold's (pg_hold) */
};

/* One statement on the session of a grant: the grant may have waited
 * unread (the client paused) while the server ended the session. */
static int confirm_grant(void *arg)
{
    const struct grant *g = arg;
    struct pg_backend *b = g->b;
    struct pg_conn *pc = g->pc;
    const char *name = g->name;
    char what[300];
    snprintf(what, sizeof what, "confirm '%s'", name);
    char *sql = dlock__sprintf("%sSELECT 1", g->tag);
    if (!sql)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    struct pg_query q = {.sql = sql,
                         .what = what,
                         .deadline = dlock__time_budget(DLOCK__NEVER, b->c->opts.op_timeout_ms)};
    PGresult *r = NULL;
    int rc = dlock__pg_exec(b, pc, &q, &r);
    free(sql);
    if (r)
        dlock__pq.clear(r);
    if (!rc)
        return DLOCK_OK;
    char msg[DLOCK__MSG_MAX];
    snprintf(msg, sizeof msg, "%s", dlock_errmsg());
    return dlock__err(DLOCK_ECONN,
                      "lock '%s' was granted, but its session on %s ended before the grant was "
                      "confirmed (%s): %s",
                      name, b->label, session_end_cause(pc, msg), msg);
}

static int pg_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
{
    struct pg_backend *b = state;
    dlock_client *c = b->c;
    bool try_once = dlock__wait_try_once(w);
    bool waits = !try_once; /* a wait whose time ran out before its statement: ETIMEDOUT */
    int64_t wait_deadline = dlock__wait_deadline(w);
    if (!try_once && wait_deadline != DLOCK__NEVER && wait_deadline <= dlock__now_ms())
        try_once = true;
    struct pg_hold *hb = calloc(1, sizeof *hb);
    char *full = dlock__pg_full_name(b, h->name);
    char *hex = full ? dlock__pg_hex(full) : NULL;
    if (hb && hex)
        hb->tag = dlock__sprintf(PG_TAG_OPEN "%s" PG_TAG_CLOSE, hex);
    if (!hb || !hb->tag) {
        hold_free(hb);
        free(full);
        free(hex);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    dlock__pg_key_of(b, full, &hb->key);
    free(full);
    if (strlen(hb->tag) >= (size_t)b->query_text_max) {
        /* pg_stat_activity would cut the tag short: a row names the hold */
        hb->row_name_hex = hex;
        hex = NULL;
        hb->tag[0] = '\0';
    }
    free(hex);
    int rc = dlock__pg_session(b, w,
                               dlock__time_budget(try_once ? 0 : wait_deadline,
                                                  c->opts.connect_timeout_ms),
                               &hb->pc);
    if (rc) {
        hold_free(hb);
        return rc;
    }
    struct pg_conn *pc = hb->pc;
    /* what is left of the wait once connected: the dial took its part */
    int64_t lock_timeout = 0; /* 0: none (wait forever) */
    if (!try_once && wait_deadline != DLOCK__NEVER) {
        lock_timeout = wait_deadline - dlock__now_ms();
        if (lock_timeout <= 0)
            try_once = true;
    }
    char prelude[160] = "";
    size_t pl = 0;
    if (pc->idle_timeout_ms != h->lease_ms)
        pl += (size_t)snprintf(prelude, sizeof prelude, "SET idle_session_timeout = %lld; ",
                               (long long)h->lease_ms);
    if (!try_once)
        snprintf(prelude + pl, sizeof prelude - pl, "SET lock_timeout = %lld; ",
                 (long long)lock_timeout);
    char *sql = acquire_sql(b, hb, h->mode, try_once, prelude);
    if (!sql) {
        dlock__pg_session_put(b, pc);
        hold_free(hb);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    char what[300];
    snprintf(what, sizeof what, "lock '%s'", h->name);
    /* the server ends a wait at its deadline (lock_timeout); the client
     * gives it one op timeout more before giving up on the session */
    int64_t deadline =
        try_once || wait_deadline == DLOCK__NEVER
            ? (try_once ? dlock__time_budget(0, c->opts.op_timeout_ms) : DLOCK__NEVER)
            : wait_deadline + c->opts.op_timeout_ms;
    struct pg_query q = {.sql = sql, .what = what, .w = try_once ? NULL : w, .deadline = deadline};
    int64_t sent = dlock__now_ms();
    PGresult *r = NULL;
    rc = dlock__pg_exec(b, pc, &q, &r);
    free(sql);
    /* A session advisory lock outlives the statement that took it: a
     * statement that failed after the grant (a cancel or a timeout during
     * nextval, waiting for the sequence's lock) leaves the session holding it. Only
     * lock_timeout (55P03, raised only while waiting) surely took nothing;
     * after any other failure the session is closed, which ends the lock. */
    bool took_nothing = false;
    if (rc == DLOCK_ECANCELED && r) {
        /* taken just as the cancel came: given back, canceled all the same */
        dlock__pq.clear(r);
        took_nothing =
            unlock_on(b, hb, h->mode, h->name,
                      dlock__time_budget(DLOCK__NEVER, c->opts.op_timeout_ms)) == DLOCK_OK;
        rc = dlock__err(DLOCK_ECANCELED, "lock '%s': canceled", h->name);
    } else if (rc == DLOCK_ETIMEDOUT && !pc->broken && strcmp(pc->sqlstate, "55P03") == 0) {
        took_nothing = true;
        rc = dlock__err(DLOCK_ETIMEDOUT,
                        "lock '%s' still held by another session when the wait "
                        "ended (%s)",
                        h->name, b->label);
    }
    if (rc && !took_nothing)
        pc->broken = true;
    if (!rc && (dlock__pq.ntuples(r) != 1 || dlock__pq.getisnull(r, 0, 0))) {
        dlock__pq.clear(r);
        dlock__pg_session_put(b, pc);
        hold_free(hb);
        if (waits)
            return dlock__err(DLOCK_ETIMEDOUT,
                              "lock '%s' still held by another session when the "
                              "wait ended (%s)",
                              h->name, b->label);
        return dlock__err(DLOCK_EBUSY, "lock '%s' is held by another session", h->name);
    }
    if (rc) {
        dlock__pg_session_put(b, pc);
        hold_free(hb);
        return rc;
    }
    h->token = strtoull(dlock__pq.getvalue(r, 0, 0) + strlen(PG_HOLDING_APP), NULL, 10);
    dlock__pq.clear(r);
    pc->idle_timeout_ms = h->lease_ms;
    /* the server's idle clock starts when it grants: after a long wait,
     * a ping first (keeper.c) */
    rc = dlock__hold_granted(c, h, sent, confirm_grant,
                             &(struct grant){.b = b, .pc = pc, .name = h->name, .tag = hb->tag});
    if (rc) {
        pc->broken = true; /* closed: whatever is left of it ends */
        dlock__pg_session_put(b, pc);
        hold_free(hb);
        return rc;
    }
    snprintf(h->owner, sizeof h->owner, "%s/%d", b->ident + 6, dlock__pq.backendPID(pc->pq));
    h->bdata = hb;
    return DLOCK_OK;
}

static int pg_release(void *state, struct dlock__hold *h)
{
    struct pg_backend *b = state;
    struct pg_hold *hb = h->bdata;
    h->bdata = NULL;
    if (!hb)
        return dlock__err(DLOCK_ELOST, "lock '%s': no session", h->name);
    pthread_mutex_lock(&hb->pc->mu);
    int rc;
    if (!hb->pc->pq || hb->pc->broken)
        rc = dlock__err(DLOCK_ELOST, "lock '%s': its session on %s has ended", h->name, b->label);
    else
        rc = unlock_on(b, hb, h->mode, h->name,
                       dlock__time_budget(DLOCK__NEVER, b->c->opts.op_timeout_ms));
    if (rc && rc != DLOCK_ELOST)
        hb->pc->broken = true; /* closed: the session, and the lock, end with it */
    pthread_mutex_unlock(&hb->pc->mu);
    dlock__pg_session_put(b, hb->pc);
    hold_free(hb);
    return rc;
}

int dlock__pg_exec_held(struct pg_backend *b, struct dlock__hold *h, const char *sql,
                        const char *what, PGresult **out)
{
    struct pg_hold *hb = h->bdata;
    *out = NULL;
    if (!hb || !hb->pc->pq || hb->pc->broken)
        return dlock__err(DLOCK_ELOST, "lock '%s': its session on %s has ended", h->name, b->label);
    struct pg_query q = {.sql = sql,
                         .what = what,
                         .deadline = dlock__time_budget(DLOCK__NEVER, b->c->opts.op_timeout_ms)};
    pthread_mutex_lock(&hb->pc->mu);
    int rc = dlock__pg_exec(b, hb->pc, &q, out);
    pthread_mutex_unlock(&hb->pc->mu);
    if (rc == DLOCK_ECONN)
        return dlock__err(DLOCK_ELOST, "lock '%s': its session on %s has ended (%s: not done)",
                          h->name, b->label, what);
    return rc;
}

/* Exclusive to shared on the pinned session with no moment unlocked: the
 * session takes the shared lock beside its exclusive one (a session never
 * conflicts with itself), then gives the exclusive one up. */
static int pg_downgrade(void *state, struct dlock__hold *h)
{
    struct pg_backend *b = state;
    struct pg_hold *hb = h->bdata;
    char *sql = NULL, what[300];
    if (hb) /* without it, dlock__pg_exec_held() answers DLOCK_ELOST */
        sql = dlock__sprintf("%sSELECT pg_advisory_lock_shared(%s); SELECT pg_advisory_unlock(%s)",
                             hb->tag, hb->key.args, hb->key.args);
    if (hb && !sql)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    snprintf(what, sizeof what, "downgrade '%s'", h->name);
    PGresult *r = NULL;
    int rc = dlock__pg_exec_held(b, h, sql ? sql : "", what, &r);
    free(sql);
    if (rc)
        return rc;
    bool released = dlock__pq.ntuples(r) == 1 && dlock__pq.getvalue(r, 0, 0)[0] == 't';
    dlock__pq.clear(r);
    if (!released)
        return dlock__err(DLOCK_ELOST, "lock '%s' was no longer held by its session on %s", h->name,
                          b->label);
    return DLOCK_OK;
}

/* ------------------------------------------------------------------ lease */

/* One ping per pinned session, all sent before any answer is read; each
 * opens with its hold's tag, which stays the session's last statement. */
static int pg_renew(void *state, struct dlock__renew_batch *batch)
{
    struct pg_backend *b = state;
    int64_t *sent = calloc(batch->n ? batch->n : 1, sizeof *sent);
    if (!sent)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    for (size_t k = 0; k < batch->n; k++) {
        struct dlock__hold *h = batch->holds[k];
        struct pg_hold *hb = h->bdata;
        sent[k] = -1;
        if (!hb || !hb->pc->pq || hb->pc->broken) {
            dlock__renew_result(batch, k,
                                dlock__err(DLOCK_ELOST, "lock '%s': its session on %s has ended",
                                           h->name, b->label));
            continue;
        }
        pthread_mutex_lock(&hb->pc->mu);
        char *sql = dlock__sprintf("%sSELECT 1", hb->tag ? hb->tag : "");
        struct pg_query q = {.sql = sql, .what = "renew", .deadline = batch->deadline};
        sent[k] = dlock__now_ms();
        int rc = sql ? dlock__pg_send(b, hb->pc, &q) : dlock__err(DLOCK_ENOMEM, "out of memory");
        free(sql);
        if (rc) {
            sent[k] = -1;
            pthread_mutex_unlock(&hb->pc->mu);
            dlock__renew_result(batch, k,
                                dlock__err(DLOCK_ELOST, "lock '%s': its session on %s has ended",
                                           h->name, b->label));
        }
    }
    for (size_t k = 0; k < batch->n; k++) {
        if (sent[k] < 0)
            continue;
        struct dlock__hold *h = batch->holds[k];
        struct pg_hold *hb = h->bdata;
        char what[300];
        snprintf(what, sizeof what, "renew '%s'", h->name);
        struct pg_query q = {.sql = "SELECT 1", .what = what, .deadline = batch->deadline};
        PGresult *r = NULL;
        int rc = dlock__pg_finish(b, hb->pc, &q, &r);
        if (r)
            dlock__pq.clear(r);
        if (!rc) {
            dlock__hold_confirmed(b->c, h, sent[k]);
        } else {
            /* the session ended (the server's idle timeout, a restart,
             * pg_terminate_backend) or did not answer within the lease: closed,
             * so that whatever is left of it on the server ends too */
            char msg[DLOCK__MSG_MAX];
            snprintf(msg, sizeof msg, "%s", dlock_errmsg());
            dlock__pq.finish(hb->pc->pq);
            hb->pc->pq = NULL;
            hb->pc->broken = true;
            rc = dlock__err(DLOCK_ELOST, "lock '%s' lost with its session (%s): %s", h->name,
                            session_end_cause(hb->pc, msg), msg);
        }
        pthread_mutex_unlock(&hb->pc->mu);
        dlock__renew_result(batch, k, rc);
    }
    free(sent);
    return DLOCK_OK;
}

/* ------------------------------------------------------------------ table */

static const struct dlock__lock_ops pg_lock_ops = {
    .acquire = pg_acquire,
    .release = pg_release,
    .downgrade = pg_downgrade,
};

const struct dlock__admin_ops dlock__pg_admin_ops = {
    .inspect = dlock__pg_inspect,
    .force_release = dlock__pg_force_release,
    .check = dlock__pg_check,
    .list = dlock__pg_list,
};

const struct dlock__backend dlock__backend_postgres = {
    .name = "postgres",
    .schemes = pg_schemes,
    .caps = DLOCK__CAP_SHARED | DLOCK__CAP_LEASES | DLOCK__CAP_FIXED_LEASE,
    .default_port = PG_DEFAULT_PORT,
    .open = pg_open,
    .close = pg_close,
    .renew = pg_renew,
    .locks = &pg_lock_ops,
    .admin = &dlock__pg_admin_ops,
    .semaphores = &dlock__pg_sem_ops,
    .elections = &dlock__pg_elect_ops,
    .values = &dlock__pg_value_ops,
    /* docs/protocol-postgres.md, "Guarded writes" */
    .no_guarded_why = "not yet (a table written in the hold's session is the plan); use "
                      "redis://, etcd:// or zk:// for guarded writes",
    .no_contend_why = "a postgres waiter sleeps in pg_advisory_lock(), seen only by a query of "
                      "pg_locks (not yet)",
};
