/* value.c -- a lock's value on PostgreSQL: one row per name in the table
 * dlock_values (name, token, value), written through the hold's own
 * session.
 *
 * The check that the writer still holds the lock is the session itself:
 * a session lock ends only with its release (which the core keeps from
 * running meanwhile) or with the session, and a statement sent on a
 * session that has ended fails -- so a write that the server runs was
 * sent by the holder while it held, and one that fails for the session
 * is DLOCK_ELOST, with nothing written. The table is a logged one (not
 * unlogged as dlock_holds): a value outlives its hold and must outlive a
 * server crash as the token sequence does.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pg.h"

/* LEN bytes at DATA as hex (malloc'd). */
static char *hex_bytes(const char *data, size_t len)
{
    char *out = malloc(2 * len + 1);
    for (size_t i = 0; out && i < len; i++)
        snprintf(out + 2 * i, 3, "%02x", (unsigned char)data[i]);
    if (out)
        out[2 * len] = '\0';
    return out;
}

static int pg_value_set(void *state, struct dlock__hold *h, const struct dlock__value *v)
{
    struct pg_backend *b = state;
    const struct pg_hold *hb = h->bdata; /* none: dlock__pg_exec_held() answers DLOCK_ELOST */
    const char *tag = hb && hb->tag ? hb->tag : "";
    char *full = dlock__pg_full_name(b, h->name);
    char *name = full ? dlock__pg_hex(full) : NULL;
    char *value = v ? hex_bytes(v->data ? v->data : "", v->len) : NULL;
    char *sql = NULL;
    if (name && (value || !v))
        sql = v ? dlock__sprintf("%sINSERT INTO " PG_VALUES " VALUES (decode('%s', 'hex'), %llu, "
                                 "decode('%s', 'hex')) ON CONFLICT (name) DO UPDATE SET token = "
                                 "excluded.token, value = excluded.value",
                                 tag, name, (unsigned long long)h->token, value)
                : dlock__sprintf("%sDELETE FROM " PG_VALUES " WHERE name = decode('%s', 'hex')",
                                 tag, name);
    free(full);
    free(name);
    free(value);
    if (!sql)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    char what[300];
    snprintf(what, sizeof what, "write the value of '%s'", h->name);
    PGresult *r = NULL;
    int rc = dlock__pg_exec_held(b, h, sql, what, &r);
    free(sql);
    if (r)
        dlock__pq.clear(r);
    return rc;
}

static int pg_value_get(void *state, const char *name, struct dlock__value *out)
{
    struct pg_backend *b = state;
    char *full = dlock__pg_full_name(b, name);
    char *hex = full ? dlock__pg_hex(full) : NULL;
    free(full);
    char *sql = hex ? dlock__sprintf("SELECT token, encode(value, 'hex') FROM " PG_VALUES
                                     " WHERE name = decode('%s', 'hex')",
                                     hex)
                    : NULL;
    free(hex);
    if (!sql)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    char what[300];
    snprintf(what, sizeof what, "read the value of '%s'", name);
    PGresult *r = NULL;
    int rc = dlock__pg_exec_pooled(b, sql, what, &r);
    free(sql);
    if (rc)
        return rc;
    if (dlock__pq.ntuples(r) == 1) {
        const char *text = dlock__pq.getvalue(r, 0, 1);
        size_t len = strlen(text) / 2;
        out->data = malloc(len + 1);
        if (!out->data) {
            dlock__pq.clear(r);
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        }
        for (size_t i = 0; i < len; i++)
            out->data[i] = (char)(dlock__hexval(text[2 * i]) << 4 | dlock__hexval(text[2 * i + 1]));
        out->data[len] = '\0';
        out->len = len;
        out->token = strtoull(dlock__pq.getvalue(r, 0, 0), NULL, 10);
    }
    dlock__pq.clear(r);
    return DLOCK_OK;
}

const struct dlock__value_ops dlock__pg_value_ops = {
    .set = pg_value_set,
    .get = pg_value_get,
};
