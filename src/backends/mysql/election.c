/* election.c -- the MySQL/MariaDB backend's leader election: the lock
 * plus the leader's row in dlock_leader.
 *
 * Election NAME is lock NAME (mutex.c: GET_LOCK on a session of its own;
 * whoever holds it leads, its token is the leader's, the server frees it
 * when the session ends) plus a row of the InnoDB table dlock_leader
 * keyed by the lock's GET_LOCK name: the leader's token, a version, the
 * leader's connection id and the value. The leader writes the row on its
 * own session, in one statement guarded by IS_USED_LOCK(name) =
 * CONNECTION_ID() -- when it wins (INSERT ... SELECT ... WHERE) and at
 * every proclaim (UPDATE ... WHERE): a session that no longer holds the
 * lock writes nothing, and the statement's affected rows say which.
 * Every write raises the version, so it grows for the name.
 *
 * A reader counts the row only while it is the holder's: its connection
 * is the one IS_USED_LOCK names, and its token is of the fencing epoch
 * the server issues now (dlock_fence_base's row, which a restart empties:
 * connection ids start again after a restart, epochs do not). What a
 * resigned or dead leader left behind is never read as current, and a
 * new leader that has not written its row yet reads as "not yet"
 * (dlock__observe_done waits for it).
 *
 * Observers have no notification to sleep on (MySQL has none, and a
 * GET_LOCK wait on the election's lock would take it when the leader
 * goes, in a campaigner's way): they look again every MYSQL_RECHECK_MS,
 * so a change is seen at most that long after it (docs/protocol-mysql.md).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mysql.h"

/* A new leader's row: at most this long between looks while it has not
 * written it (a round trip or two). */
#define NOT_YET_MS 20

/* Write VALUE as H's in dlock_leader on its session, in one statement
 * with the check that the session still holds the lock: the campaign's
 * row (WON) or a proclaim. DLOCK_ELOST when it no longer does. */
static int write_leader(struct my_backend *s, struct dlock__hold *h, const char *value, bool won)
{
    struct my_hold *mh = h->bdata;
    if (!mh || !mh->k)
        return dlock__err(DLOCK_ELOST, "%s: election '%s': leadership was lost: its session ended",
                          s->label, h->name);
    char *hex = dlock__my_hex(value, strlen(value));
    char *sql = NULL;
    if (hex && won)
        sql = dlock__sprintf("INSERT INTO " MYSQL_LEADER_TABLE
                             " (name, token, version, conn, value) SELECT %s, %llu, 1, "
                             "CONNECTION_ID(), X'%s' FROM DUAL WHERE IS_USED_LOCK(%s) = "
                             "CONNECTION_ID() ON DUPLICATE KEY UPDATE token = VALUES(token), "
                             "version = version + 1, conn = VALUES(conn), value = VALUES(value)",
                             mh->name_sql, (unsigned long long)h->token, hex, mh->name_sql);
    else if (hex)
        sql = dlock__sprintf("UPDATE " MYSQL_LEADER_TABLE " SET value = X'%s', version = version "
                             "+ 1 WHERE name = %s AND token = %llu AND conn = CONNECTION_ID() AND "
                             "IS_USED_LOCK(%s) = CONNECTION_ID()",
                             hex, mh->name_sql, (unsigned long long)h->token, mh->name_sql);
    free(hex);
    if (!sql)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    struct my_io io = {.deadline = dlock__now_ms() + s->c->opts.op_timeout_ms, .cancel_fd = -1};
    bool broken = false;
    int rc = dlock__my_query(s, mh->k, sql, &io, NULL, &broken,
                             won ? "write the leader's value" : "proclaim");
    free(sql);
    if (!rc && mysql_affected_rows(mh->k->db) == 0)
        rc = dlock__err(DLOCK_ELOST,
                        "%s: election '%s': its session (connection %lu) no longer holds the "
                        "election's lock (force-released)",
                        s->label, h->name, mh->k->id);
    if (rc && broken) {
        char why[DLOCK__MSG_MAX];
        dlock__errmsg_save(why);
        rc = dlock__err(DLOCK_ELOST, "election '%s': leadership was lost: its session ended (%s)",
                        h->name, why);
    }
    return rc;
}

static int elect_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
{
    int rc = dlock__my_lock_acquire(state, h, w);
    if (rc)
        return rc;
    rc = write_leader(state, h, h->elect->value, true);
    if (rc) {
        /* no value, no lead (the message stays the write's) */
        char msg[DLOCK__MSG_MAX];
        dlock__errmsg_save(msg);
        dlock__my_lock_release(state, h);
        dlock__errmsg_restore(rc, msg);
    }
    return rc;
}

static int elect_proclaim(void *state, struct dlock__hold *h, const char *value)
{
    struct my_backend *s = state;
    int rc = write_leader(s, h, value, false);
    if (rc == DLOCK_ELOST) {
        char why[DLOCK__MSG_MAX];
        dlock__errmsg_save(why);
        dlock__hold_lost(s->c, h, why);
        return dlock__err(DLOCK_ELOST, "election '%s': leadership was lost: %s", h->name, why);
    }
    return rc;
}

/* One look at election NAME: the lock's holder, the row, the epoch the
 * server issues tokens in, in one statement. *CONSISTENT false while the
 * holder's row is not there yet. */
static int look(struct my_backend *s, const char *name, struct dlock_leader *out, bool *consistent)
{
    char *enc = NULL;
    char *nsql = dlock__my_name_sql(s, name, &enc);
    free(enc);
    char *sql =
        nsql ? dlock__sprintf(
                   "SELECT l.id, r.conn, r.token, r.version, r.value, (SELECT f.epoch FROM "
                   "" MYSQL_FENCE_BASE_TABLE " f WHERE f.id = 1) = r.token >> %d, "
                   "" MYSQL_OWNER_ID("l.id") " FROM (SELECT IS_USED_LOCK(%s) AS id) l LEFT JOIN "
                                             "" MYSQL_LEADER_TABLE " r ON r.name = %s",
                   MYSQL_EPOCH_SHIFT, nsql, nsql)
             : NULL;
    free(nsql);
    if (!sql)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    MYSQL_RES *res = NULL;
    int rc = dlock__my_query_pooled(s, sql, &res, "read an election's leader");
    free(sql);
    if (rc)
        return rc;
    free(out->value);
    memset(out, 0, sizeof *out);
    MYSQL_ROW row = dlock__my_first(res, NULL, NULL);
    bool held = row && row[0];
    *consistent =
        !held || (row[1] && strcmp(row[0], row[1]) == 0 && row[5] && strcmp(row[5], "1") == 0);
    if (held && *consistent) {
        unsigned long *lens = mysql_fetch_lengths(res);
        if (!(out->value = malloc(lens[4] + 1))) {
            mysql_free_result(res);
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        }
        memcpy(out->value, row[4] ? row[4] : "", row[4] ? lens[4] : 0);
        out->value[row[4] ? lens[4] : 0] = 0;
        out->held = true;
        out->token = strtoull(row[2], NULL, 10);
        out->version = strtoull(row[3], NULL, 10);
        snprintf(out->id, sizeof out->id, "%s", row[6] ? row[6] : row[0]);
    }
    mysql_free_result(res);
    return DLOCK_OK;
}

static int elect_observe(void *state, const char *name, const struct dlock_leader *known,
                         struct dlock__wait *w, struct dlock_leader *out)
{
    struct my_backend *s = state;
    struct dlock__backoff backoff = DLOCK__OBSERVE_BACKOFF;
    int rc;
    for (;;) {
        unsigned seq = dlock__wait_seq(w);
        bool consistent = false;
        rc = look(s, name, out, &consistent);
        if (dlock__observe_retry(known, w, &backoff, &rc))
            continue; /* a server restarting */
        if (rc || dlock__observe_done(known, out, consistent, w, &rc))
            break;
        /* No notification: look again a period on (docs/protocol-mysql.md). */
        rc = dlock__wait_sleep(w, seq,
                               dlock__now_ms() + (consistent ? MYSQL_RECHECK_MS : NOT_YET_MS));
        if (rc)
            break;
    }
    return rc;
}

int dlock__my_elect_create_table(struct my_backend *s)
{
    return dlock__my_query_pooled(s,
                                  "CREATE TABLE IF NOT EXISTS " MYSQL_LEADER_TABLE
                                  " (name VARCHAR(66) CHARACTER SET ascii COLLATE ascii_bin "
                                  "PRIMARY KEY, token BIGINT UNSIGNED NOT NULL, version BIGINT "
                                  "UNSIGNED NOT NULL, conn BIGINT UNSIGNED NOT NULL, value "
                                  "LONGBLOB NOT NULL) ENGINE=InnoDB",
                                  NULL, "create the elections' table " MYSQL_LEADER_TABLE);
}

const struct dlock__elect_ops dlock__my_elect_ops = {
    .acquire = elect_acquire,
    .release = dlock__my_lock_release,
    .proclaim = elect_proclaim,
    .observe = elect_observe,
};
