/* admin.c -- looking at the MySQL/MariaDB backend's locks without taking
 * them: inspect (IS_USED_LOCK, the holder's dlock_id connection
 * attribute, its token in the holder's @dlock_token, the waiters in the
 * process list), check (the same look), force-release (KILL of
 * the holder's session) and list (performance_schema.metadata_locks).
 *
 * What the server shows depends on what it has on: a holder is named
 * "pid@host" through performance_schema.session_connect_attrs, else by
 * its session in the process list; the list of held names is only in
 * performance_schema.metadata_locks (performance_schema=ON and the
 * wait/lock/metadata/sql/mdl instrument enabled), else DLOCK_ENOTSUP
 * says which is off. A user without the PROCESS privilege sees only its
 * own sessions in the process list (the waiters it counts).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mysql.h"

/* The identity of session ID (an SQL expression): its dlock_id
 * connection attribute, else who it is in the process list. */
#define WHO(id)                                                                                  \
    "COALESCE((SELECT a.ATTR_VALUE FROM performance_schema.session_connect_attrs a WHERE "       \
    "a.PROCESSLIST_ID = " id " AND a.ATTR_NAME = 'dlock_id' LIMIT 1), (SELECT "                  \
    "CONCAT('connection ', p.ID, ' ', p.USER, '@', p.HOST) FROM information_schema.PROCESSLIST " \
    "p WHERE p.ID = " id "), CONCAT('connection ', " id "))"

/* What the server shows of lock NAME: its holder's session, identity
 * and token, its waiters (one per line, longest waiting first) and its
 * GET_LOCK name, in one row (*ROW, of *RES: the caller frees it); *FREE
 * when nobody holds it. */
static int look(struct my_backend *s, const char *name, MYSQL_RES **res, MYSQL_ROW *row,
                bool *free_now)
{
    char *enc = NULL;
    char *nsql = dlock__my_name_sql(s, name, &enc);
    char *sql =
        nsql
            ? dlock__sprintf(
                  "SELECT l.id, " WHO(
                      "l.id") ", (SELECT v.VARIABLE_VALUE FROM "
                              "performance_schema.user_variables_by_thread v JOIN performance_schema.threads "
                              "t ON t.THREAD_ID = v.THREAD_ID WHERE t.PROCESSLIST_ID = l.id AND "
                              "v.VARIABLE_NAME = 'dlock_token'), (SELECT GROUP_CONCAT(" WHO(
                                  "w.ID") " ORDER BY w.TIME DESC, w.ID SEPARATOR '\\n') FROM "
                                          "information_schema.PROCESSLIST w WHERE w.STATE = 'User lock' AND "
                                          "LOCATE('/*dlock-wait:%s*/', w.INFO) > 0), %s FROM (SELECT IS_USED_LOCK(%s) "
                                          "AS id) l",
                  enc, nsql, nsql)
            : NULL;
    free(enc);
    free(nsql);
    if (!sql)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    int rc = dlock__my_query_pooled(s, sql, res, "inspect a lock");
    free(sql);
    if (rc)
        return rc;
    *free_now = true;
    *row = dlock__my_first(*res, NULL, free_now);
    return DLOCK_OK;
}

int dlock__my_inspect(void *state, const char *name, struct dlock_info *info)
{
    MYSQL_RES *res = NULL;
    MYSQL_ROW row = NULL;
    bool free_now = true;
    int rc = look(state, name, &res, &row, &free_now);
    if (rc)
        return rc;
    if (row && row[4])
        rc = dlock__info_set_key(info, row[4]);
    if (!rc && !free_now) {
        info->held = 1;
        info->mode = DLOCK_EXCLUSIVE;
        info->token = row[2] ? strtoull(row[2], NULL, 10) : 0;
        rc = dlock__info_add_holder(info, row[1] ? row[1] : row[0], 1);
    }
    info->nwaiters = 0;
    for (char *w = row ? row[3] : NULL, *nl; !rc && w && *w; w = nl ? nl + 1 : NULL) {
        if ((nl = strchr(w, '\n')))
            *nl = 0;
        rc = dlock__info_add_waiter(info, w);
    }
    mysql_free_result(res);
    return rc;
}

int dlock__my_check(void *state, const char *name, struct dlock__check_view *view)
{
    MYSQL_RES *res = NULL;
    MYSQL_ROW row = NULL;
    bool free_now = true;
    int rc = look(state, name, &res, &row, &free_now);
    if (rc)
        return rc;
    view->held = !free_now;
    view->token = !free_now && row[2] ? strtoull(row[2], NULL, 10) : 0;
    mysql_free_result(res);
    return DLOCK_OK;
}

/* The session holding lock NAME (SQL expression NSQL) into *ID, 0 when
 * free. */
static int holder_of(struct my_backend *s, const char *nsql, unsigned long long *id)
{
    return dlock__my_select_number(s, dlock__sprintf("SELECT IS_USED_LOCK(%s)", nsql),
                                   "find a lock's holder", id);
}

int dlock__my_force_release(void *state, const char *name)
{
    struct my_backend *s = state;
    char *enc = NULL;
    char *nsql = dlock__my_name_sql(s, name, &enc);
    free(enc);
    if (!nsql)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    unsigned long long id = 0, now = 0;
    int rc = holder_of(s, nsql, &id);
    if (rc || !id) {
        free(nsql);
        return rc;
    }
    char kill[64], what[128];
    snprintf(kill, sizeof kill, "KILL CONNECTION %llu", id);
    snprintf(what, sizeof what, "force-release: end the holder's session (KILL CONNECTION %llu)",
             id);
    rc = dlock__my_query_pooled(s, kill, NULL, what);
    if (rc == DLOCK_EBACKEND && strstr(dlock_errmsg(), "Unknown thread"))
        rc = DLOCK_OK;
    /* KILL returns before the killed session has ended and let its locks
     * go: wait for that (an operator's call, so a short poll), within the
     * op timeout. */
    int64_t until = dlock__now_ms() + s->c->opts.op_timeout_ms;
    while (!rc && !(rc = holder_of(s, nsql, &now)) && now == id) {
        if (dlock__now_ms() >= until) {
            rc = dlock__err(DLOCK_ETIMEDOUT,
                            "%s: force-release '%s': the killed session %llu still holds it",
                            s->label, name, id);
            break;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    free(nsql);
    return rc;
}

int dlock__my_list_refused(struct my_backend *s)
{
    MYSQL_RES *res = NULL;
    int rc = dlock__my_query_pooled(s,
                                    "SELECT @@performance_schema, (SELECT ENABLED FROM "
                                    "performance_schema.setup_instruments WHERE NAME = "
                                    "'wait/lock/metadata/sql/mdl')",
                                    &res, "see whether the server lists its locks");
    if (rc)
        return rc;
    MYSQL_ROW row = dlock__my_first(res, NULL, NULL);
    bool ps = row && row[0] && strcmp(row[0], "1") == 0;
    bool mdl = row && row[1] && strcmp(row[1], "YES") == 0;
    mysql_free_result(res);
    if (!ps)
        return dlock__err(DLOCK_ENOTSUP,
                          "%s: the server cannot list its locks: performance_schema is off "
                          "(start it with --performance-schema=ON)",
                          s->label);
    if (!mdl)
        return dlock__err(DLOCK_ENOTSUP,
                          "%s: the server cannot list its locks: the instrument "
                          "wait/lock/metadata/sql/mdl is off (start it with "
                          "--performance-schema-instrument='wait/lock/metadata/sql/mdl=ON')",
                          s->label);
    return DLOCK_OK;
}

int dlock__my_list(void *state, const char *pattern, dlock_list_fn fn, void *arg)
{
    struct my_backend *s = state;
    int rc = dlock__my_list_refused(s);
    if (rc)
        return rc;
    MYSQL_RES *res = NULL;
    rc = dlock__my_query_pooled(s,
                                "SELECT m.OBJECT_NAME, (SELECT v.VARIABLE_VALUE FROM "
                                "performance_schema.user_variables_by_thread v WHERE v.THREAD_ID = "
                                "m.OWNER_THREAD_ID AND v.VARIABLE_NAME = 'dlock_name') FROM "
                                "performance_schema.metadata_locks m WHERE m.OBJECT_TYPE = 'USER "
                                "LEVEL LOCK' AND m.LOCK_STATUS = 'GRANTED' ORDER BY 1",
                                &res, "list the locks");
    if (rc)
        return rc;
    MYSQL_ROW row;
    while ((row = mysql_fetch_row(res))) {
        /* a hashed name by the real one its holder keeps (@dlock_name) */
        const char *lock = row[0] && strncmp(row[0], "%h", 2) == 0 && row[1] ? row[1] : row[0];
        char *name = lock ? dlock__my_name_of(s, lock) : NULL;
        bool stop = name && dlock__glob(pattern, name) && fn(name, arg) != 0;
        free(name);
        if (stop)
            break;
    }
    mysql_free_result(res);
    return DLOCK_OK;
}
