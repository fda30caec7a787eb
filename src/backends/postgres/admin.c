/* admin.c -- looking at names without taking them: inspect, check, list,
 * force release.
 *
 * pg_locks is the truth of who holds a key and who waits for it;
 * pg_stat_activity names each session (application_name "dlock
 * pid@host" for ours, "dlock#TOKEN pid@host" while it holds: the token)
 * and, in the tag that opens every statement of a hold, the name it
 * holds (list). The rows of dlock_holds, which releases before this one
 * wrote per hold, still count for their holds: a row whose session no
 * longer holds the key is stale and never counts (list deletes the rows
 * of sessions that are gone). Force
 * release ends the holders' sessions with pg_terminate_backend(), which
 * the server allows a superuser, a member of pg_signal_backend or the
 * sessions' own role: anything else is DLOCK_EACCES in the server's words.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pg.h"

/* The key of NAME (the client's prefix applied) and its pg_locks
 * condition into WHERE. */
static int key_of(struct pg_backend *b, const char *name, struct pg_key *k, char *where,
                  size_t size)
{
    char *full = dlock__pg_full_name(b, name);
    if (!full)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    dlock__pg_key_of(b, full, k);
    free(full);
    dlock__pg_key_where(k, where, size);
    return DLOCK_OK;
}

/* The rows of pg_locks for NAME: granted, mode, holder's application
 * name, pid, token of an older release's row (-1 none). */
static int look(struct pg_backend *b, const char *name, PGresult **out)
{
    struct pg_key k;
    char where[512];
    int rc = key_of(b, name, &k, where, sizeof where);
    if (rc)
        return rc;
    char *sql = dlock__sprintf(
        "SELECT l.granted, l.mode, coalesce(a.application_name, ''), l.pid, coalesce(h.token, "
        "-1) FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid LEFT JOIN " PG_TABLE
        " h ON h.classid = l.classid::int8 AND h.objid = l.objid::int8 AND h.objsubid = "
        "l.objsubid AND h.pid = l.pid WHERE %s ORDER BY l.granted DESC, h.token DESC NULLS LAST",
        where);
    if (!sql)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    char what[300];
    snprintf(what, sizeof what, "inspect '%s'", name);
    rc = dlock__pg_exec_pooled(b, sql, what, out);
    free(sql);
    return rc;
}

/* A session's name as a holder: "pid@host" for ours, "pid N" (the
 * server's process) for another client's. */
static void holder_id(const char *app, const char *pid, char *buf, size_t size)
{
    if (strncmp(app, PG_HOLDING_APP, strlen(PG_HOLDING_APP)) == 0 && strchr(app, ' '))
        snprintf(buf, size, "%s", strchr(app, ' ') + 1);
    else if (strncmp(app, "dlock ", 6) == 0)
        snprintf(buf, size, "%s", app + 6);
    else
        snprintf(buf, size, "%s%sbackend %s", app, *app ? " " : "", pid);
}

/* The token of row I of look()'s rows: the one in the holder's
 * application_name, else its dlock_holds row's; 0 when neither. */
static uint64_t token_of(PGresult *r, int i)
{
    const char *app = dlock__pq.getvalue(r, i, 2);
    long long token = 0;
    if (strncmp(app, PG_HOLDING_APP, strlen(PG_HOLDING_APP)) == 0)
        token = strtoll(app + strlen(PG_HOLDING_APP), NULL, 10);
    if (token <= 0)
        token = strtoll(dlock__pq.getvalue(r, i, 4), NULL, 10);
    return token > 0 ? (uint64_t)token : 0;
}

int dlock__pg_inspect(void *state, const char *name, struct dlock_info *info)
{
    struct pg_backend *b = state;
    PGresult *r = NULL;
    struct pg_key k;
    char where[512];
    int rc = key_of(b, name, &k, where, sizeof where);
    if (!rc)
        rc = look(b, name, &r);
    if (rc)
        return rc;
    char key[80];
    if (k.objsubid == 2)
        snprintf(key, sizeof key, "advisory %s", k.args);
    else
        snprintf(key, sizeof key, "advisory %" PRId64,
                 (int64_t)(((uint64_t)k.classid << 32) | (uint64_t)k.objid));
    rc = dlock__info_set_key(info, key);
    info->ttl_ms = -1; /* the server's idle timeout, not a deadline it tells */
    info->nwaiters = 0;
    for (int i = 0; !rc && i < dlock__pq.ntuples(r); i++) {
        char id[160];
        holder_id(dlock__pq.getvalue(r, i, 2), dlock__pq.getvalue(r, i, 3), id, sizeof id);
        if (dlock__pq.getvalue(r, i, 0)[0] == 't') {
            info->held = 1;
            info->mode = strcmp(dlock__pq.getvalue(r, i, 1), "ShareLock") == 0 ? DLOCK_SHARED
                                                                               : DLOCK_EXCLUSIVE;
            uint64_t token = token_of(r, i);
            if (token > info->token)
                info->token = token;
            rc = dlock__info_add_holder(info, id, 1);
        } else {
            rc = dlock__info_add_waiter(info, id);
        }
    }
    dlock__pq.clear(r);
    return rc;
}

int dlock__pg_check(void *state, const char *name, struct dlock__check_view *view)
{
    struct pg_backend *b = state;
    PGresult *r = NULL;
    int rc = look(b, name, &r);
    if (rc)
        return rc;
    memset(view, 0, sizeof *view);
    for (int i = 0; i < dlock__pq.ntuples(r); i++) {
        if (dlock__pq.getvalue(r, i, 0)[0] != 't')
            continue;
        view->held = true;
        uint64_t token = token_of(r, i);
        if (token > view->token)
            view->token = token;
    }
    dlock__pq.clear(r);
    return DLOCK_OK;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int dlock__pg_list_names(struct pg_backend *b, const char *sql, const char *what,
                         const char *pattern, dlock_list_fn fn, void *arg)
{
    PGresult *r = NULL;
    int rc = dlock__pg_exec_pooled(b, sql, what, &r);
    if (rc)
        return rc;
    size_t plen = strlen(b->prefix), n = 0;
    int rows = dlock__pq.ntuples(r);
    char **names = calloc(rows ? (size_t)rows : 1, sizeof *names);
    for (int i = 0; names && i < rows; i++) {
        const char *hex = dlock__pq.getvalue(r, i, 0);
        size_t len = strlen(hex) / 2;
        char *full = malloc(len + 1);
        if (!full)
            break;
        for (size_t j = 0; j < len; j++)
            full[j] = (char)(dlock__hexval(hex[2 * j]) << 4 | dlock__hexval(hex[2 * j + 1]));
        full[len] = '\0';
        if (strlen(full) == len && len > plen && strncmp(full, b->prefix, plen) == 0 &&
            dlock__glob(pattern, full + plen)) {
            memmove(full, full + plen, len - plen + 1);
            names[n++] = full;
        } else {
            free(full);
        }
    }
    dlock__pq.clear(r);
    if (!names)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    if (n > 1)
        qsort(names, n, sizeof *names, cmp_str);
    bool stop = false;
    for (size_t i = 0; i < n; i++) {
        if (!stop && fn(names[i], arg))
            stop = true;
        free(names[i]);
    }
    free(names);
    return DLOCK_OK;
}

int dlock__pg_list(void *state, const char *pattern, dlock_list_fn fn, void *arg)
{
    /* the name in the tag of the last statement of each session holding
     * as ours do (its query text: visible to its own role, superusers and
     * pg_read_all_stats), and the rows of long names and older releases */
    static const char sql[] =
        "DELETE FROM " PG_TABLE " WHERE pid NOT IN (SELECT pid FROM pg_stat_activity); "
        "SELECT DISTINCT n FROM (SELECT encode(h.name, 'hex') AS n FROM " PG_TABLE " h JOIN "
        "pg_locks l ON l.locktype = 'advisory' AND l.granted AND l.pid = h.pid AND "
        "l.classid::int8 = h.classid AND l.objid::int8 = h.objid AND l.objsubid = h.objsubid AND "
        "l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) UNION "
        "SELECT substring(a.query FROM '^/\\*dlock:([0-9a-f]*)\\*/') FROM pg_locks l JOIN "
        "pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted AND "
        "l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND "
        "a.application_name LIKE '" PG_HOLDING_APP "%') AS held WHERE n IS NOT NULL";
    return dlock__pg_list_names(state, sql, "list locks", pattern, fn, arg);
}

int dlock__pg_force_release(void *state, const char *name)
{
    struct pg_backend *b = state;
    struct pg_key k;
    char where[512];
    int rc = key_of(b, name, &k, where, sizeof where);
    if (rc)
        return rc;
    /* pg_terminate_backend(pid, timeout) waits until the session is gone
     * and answers false when it was not gone by then (its backend did not
     * run the SIGTERM): half the op timeout, so that the answer comes back
     * before the client gives up on the statement */
    long long server_ms = b->c->opts.op_timeout_ms / 2 > 0 ? b->c->opts.op_timeout_ms / 2 : 1;
    char *sql = dlock__sprintf("SELECT l.pid, pg_terminate_backend(l.pid, %lld) FROM pg_locks l "
                               "WHERE %s AND l.granted AND l.pid <> pg_backend_pid()",
                               server_ms, where);
    if (!sql)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    char what[300];
    snprintf(what, sizeof what, "force release '%s' (pg_terminate_backend)", name);
    PGresult *r = NULL;
    rc = dlock__pg_exec_pooled(b, sql, what, &r);
    free(sql);
    if (rc)
        return rc;
    for (int i = 0; !rc && i < dlock__pq.ntuples(r); i++)
        if (dlock__pq.getvalue(r, i, 1)[0] != 't')
            rc = dlock__err(DLOCK_ETIMEDOUT,
                            "%s: %s: the holder's session (backend %s) did not end within %lld ms; "
                            "it was told to and ends when its server process runs it, the lock "
                            "with it",
                            b->label, what, dlock__pq.getvalue(r, i, 0), server_ms);
    dlock__pq.clear(r);
    return rc;
}
