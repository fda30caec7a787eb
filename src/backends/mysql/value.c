/* value.c -- a lock's value on MySQL/MariaDB: a row of the InnoDB table
 * dlock_value keyed by the lock's GET_LOCK name (token, bytes), written
 * on the hold's own session.
 *
 * The guard: the write follows a check, on the same session, that the
 * session holds the lock (IS_USED_LOCK = CONNECTION_ID()). Only that
 * session can give the lock up, and a KILL of it fails the write too, so
 * the lock stays the session's from the check through the write: the
 * pair is as atomic as one statement, at the cost of a round trip.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mysql.h"

char *dlock__my_hex(const char *data, size_t len)
{
    static const char digits[] = "0123456789abcdef";
    char *out = malloc(2 * len + 1);
    for (size_t i = 0; out && i < len; i++) {
        out[2 * i] = digits[(unsigned char)data[i] >> 4];
        out[2 * i + 1] = digits[(unsigned char)data[i] & 15];
    }
    if (out)
        out[2 * len] = 0;
    return out;
}

int dlock__my_value_set(void *state, struct dlock__hold *h, const struct dlock__value *v)
{
    struct my_backend *s = state;
    struct my_hold *mh = h->bdata;
    if (!mh || !mh->k)
        return dlock__err(DLOCK_ELOST, "%s: lock '%s' was lost: its session ended", s->label,
                          h->name);
    bool broken = false;
    int rc = dlock__my_still_ours(s, h, mh, dlock__now_ms() + s->c->opts.op_timeout_ms, &broken);
    char *hex = v ? dlock__my_hex(v->data, v->len) : NULL;
    char *sql = NULL;
    if (!rc && v)
        sql = hex ? dlock__sprintf("INSERT INTO " MYSQL_VALUE_TABLE
                                   " (name, token, value) VALUES (%s, %llu, X'%s') ON DUPLICATE "
                                   "KEY UPDATE token = VALUES(token), value = VALUES(value)",
                                   mh->name_sql, (unsigned long long)h->token, hex)
                  : NULL;
    else if (!rc)
        sql = dlock__sprintf("DELETE FROM " MYSQL_VALUE_TABLE " WHERE name = %s", mh->name_sql);
    free(hex);
    if (!rc && !sql)
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    struct my_io io = {.deadline = dlock__now_ms() + s->c->opts.op_timeout_ms, .cancel_fd = -1};
    if (!rc)
        rc = dlock__my_query(s, mh->k, sql, &io, NULL, &broken, "write the lock's value");
    free(sql);
    if (rc == DLOCK_ELOST || broken) {
        char why[DLOCK__MSG_MAX];
        dlock__errmsg_save(why);
        rc = dlock__err(DLOCK_ELOST, "lock '%s': no value written: %s", h->name, why);
    }
    return rc;
}

int dlock__my_value_get(void *state, const char *name, struct dlock__value *out)
{
    struct my_backend *s = state;
    char *enc = NULL;
    char *nsql = dlock__my_name_sql(s, name, &enc);
    free(enc);
    char *sql =
        nsql
            ? dlock__sprintf("SELECT token, value FROM " MYSQL_VALUE_TABLE " WHERE name = %s", nsql)
            : NULL;
    free(nsql);
    if (!sql)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    MYSQL_RES *res = NULL;
    int rc = dlock__my_query_pooled(s, sql, &res, "read the lock's value");
    free(sql);
    if (rc)
        return rc;
    unsigned long long token = 0;
    MYSQL_ROW row = dlock__my_first(res, &token, NULL);
    if (row && row[1]) {
        unsigned long *lens = mysql_fetch_lengths(res);
        if (!(out->data = malloc(lens[1] + 1))) {
            rc = dlock__err(DLOCK_ENOMEM, "out of memory");
        } else {
            memcpy(out->data, row[1], lens[1]);
            out->data[lens[1]] = 0;
            out->len = lens[1];
            out->token = token;
        }
    }
    mysql_free_result(res);
    return rc;
}
