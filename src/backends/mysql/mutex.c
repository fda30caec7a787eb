/* mutex.c -- the MySQL/MariaDB backend: open and close, the locks
 * (GET_LOCK and RELEASE_LOCK, each on a session of its own), their
 * renewal, and the backend's table.
 *
 * A lock is taken on a session from the pool by
 *
 *   SELECT CASE GET_LOCK(name, timeout) WHEN 1 THEN ... WHEN 0 THEN 0 END
 *
 * -- the wait sleeps in the server -- and its fencing token comes from
 * the same statement once the lock is granted, with no row written:
 * (epoch << 40) + (UUID_SHORT() - base), the server's own counter (it
 * only grows within a server lifetime) read beside one row of a MEMORY
 * table, the lifetime's epoch (a durable InnoDB counter bumped once per
 * server lifetime) and base (docs/protocol-mysql.md), which a session
 * keeps after its first token so that its later acquires open no table.
 * The session also keeps the token and the encoded name in user variables
 * (@dlock_token, @dlock_name), where inspect and list read them
 * (performance_schema.user_variables_by_thread: a hashed name is listed
 * by its real one). The session then belongs to the hold until its
 * release; its wait_timeout is the lease, and the keeper's renewal (a
 * statement that checks the lock is still the session's) is what
 * keeps it from idling out. A session the server ended is a lost hold.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mysql.h"

/* Why a session a hold pinned may have ended: the server cannot tell
 * the client which. */
#define SESSION_ENDED                                                                   \
    "(killed by another session -- force-released --, the server restarted, the lease " \
    "passed while this process was frozen, or the connection broke)"

void dlock__my_hold_free(struct my_hold *mh)
{
    if (!mh)
        return;
    free(mh->name_sql);
    free(mh->held_sql);
    free(mh);
}

/* ------------------------------------------------------------- acquire */

/* GET_LOCK's timeout for wait deadline WD ("0" for try-once). */
static void lock_timeout(const struct dlock__wait *w, char *buf, size_t size)
{
    int64_t wd = dlock__wait_deadline(w);
    if (dlock__wait_try_once(w)) {
        snprintf(buf, size, "0");
    } else if (wd == DLOCK__NEVER) {
        snprintf(buf, size, "%d", MYSQL_FOREVER_S);
    } else {
        int64_t left = wd - dlock__now_ms();
        if (left < 0)
            left = 0;
        snprintf(buf, size, "%lld.%03lld", (long long)(left / 1000), (long long)(left % 1000));
    }
}

/* The first column of RES's first row as a number (0 for none or NULL);
 * RES is freed. */
static unsigned long long number_of(MYSQL_RES *res)
{
    unsigned long long v = 0;
    dlock__my_first(res, &v, NULL);
    mysql_free_result(res);
    return v;
}

/* The statement that checks MH's lock is still its session's (malloc'd;
 * NULL when out of memory). */
static char *still_ours_sql(const struct my_hold *mh)
{
    return mh->held_sql ? dlock__sprintf("SELECT %s", mh->held_sql)
                        : dlock__sprintf("SELECT IS_USED_LOCK(%s) = CONNECTION_ID()", mh->name_sql);
}

/* Its answer RES (freed here): DLOCK_OK or DLOCK_ELOST. */
static int still_ours_answer(struct my_backend *s, const struct dlock__hold *h,
                             const struct my_hold *mh, MYSQL_RES *res)
{
    if (number_of(res) != 1)
        return dlock__err(DLOCK_ELOST,
                          "%s: lock '%s' is no longer held by its session (connection %lu): "
                          "force-released",
                          s->label, h->name, mh->k->id);
    return DLOCK_OK;
}

/* Check that MH's lock is still its session's: the statement every
 * renewal sends, and an acquire whose wait was long (its validity runs
 * from this send). DLOCK_OK, DLOCK_ELOST, or a failure (*BROKEN: the
 * session is unusable). */
int dlock__my_still_ours(struct my_backend *s, struct dlock__hold *h, struct my_hold *mh,
                         int64_t deadline, bool *broken)
{
    char *sql = still_ours_sql(mh);
    if (!sql)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    struct my_io io = {.deadline = deadline, .cancel_fd = -1};
    MYSQL_RES *res = NULL;
    int rc = dlock__my_query(s, mh->k, sql, &io, &res, broken, "check a hold");
    free(sql);
    return rc ? rc : still_ours_answer(s, h, mh, res);
}

/* A lock just granted after a wait, on its session: what
 * dlock__hold_granted() reconfirms. */
struct grant {
    struct my_backend *s;
    struct dlock__hold *h;
    struct my_hold *mh;
    bool *broken;
};

static int still_ours_now(void *arg)
{
    const struct grant *g = arg;
    return dlock__my_still_ours(g->s, g->h, g->mh, dlock__now_ms() + g->s->c->opts.op_timeout_ms,
                                g->broken);
}

/* Release what a canceled GET_LOCK took after all. */
static void give_back(struct my_backend *s, struct my_hold *mh, bool *broken)
{
    char *sql = dlock__sprintf("DO RELEASE_LOCK(%s)", mh->name_sql);
    struct my_io io = {.deadline = dlock__now_ms() + s->c->opts.op_timeout_ms, .cancel_fd = -1};
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    if (!sql || dlock__my_query(s, mh->k, sql, &io, NULL, broken, "give back a canceled lock"))
        *broken = true; /* closing the session frees it */
    dlock__errmsg_restore(DLOCK_OK, msg);
    free(sql);
}

/* Run one statement of the token's on MH's session within the op
 * timeout; the first value of its first row (0 for none or NULL) into
 * *VALUE. */
static int token_query(struct my_backend *s, struct my_hold *mh, const char *sql,
                       unsigned long long *value, bool *broken, const char *what)
{
    struct my_io io = {.deadline = dlock__now_ms() + s->c->opts.op_timeout_ms, .cancel_fd = -1};
    MYSQL_RES *res = NULL;
    int rc = dlock__my_query(s, mh->k, sql, &io, value ? &res : NULL, broken, what);
    if (!rc && value)
        *value = number_of(res);
    return rc;
}

/* The next token of this server lifetime, an expression: the epoch's and
 * the server's UUID_SHORT() (a counter of the server's that only grows
 * within its lifetime, whatever session calls it) past the lifetime's
 * base, both read from the MEMORY row; NULL when the row is missing (the
 * server restarted, or someone emptied it), 0 when its epoch's 2^40 are
 * spent or the row is not this lifetime's. UUID_SHORT() is called once,
 * kept in @dlock_u (a user variable holds it signed: CAST gives back its
 * bits); the token is kept in @dlock_token for inspect. */
#define NEXT_IN_EPOCH                                                                          \
    "(SELECT IF(CAST((@dlock_u := UUID_SHORT()) AS UNSIGNED) > f.base AND "                    \
    "CAST(@dlock_u AS UNSIGNED) - f.base < " MYSQL_EPOCH_SPAN ", @dlock_token := (f.epoch << " \
    "40) + (CAST(@dlock_u AS UNSIGNED) - f.base), 0) FROM " MYSQL_FENCE_BASE_TABLE             \
    " f WHERE f.id = 1)"

/* GET_LOCK and, once granted, the next token of this server lifetime in
 * one request: GET_LOCK's answer (1, 0, NULL), then NEXT_IN_EPOCH's (NULL
 * when the lock was not granted, or as NEXT_IN_EPOCH), each named by a
 * letter (a column's name is its expression's text otherwise, and comes
 * back in every reply). Format: the encoded name (twice), the GET_LOCK
 * name, its timeout. A try (timeout 0) does both in one statement:
 * LOCK_AND_TOKEN. A wait may not: a statement opens its tables before it
 * runs, and would hold the MEMORY table's read lock for as long as
 * GET_LOCK sleeps -- new_epoch()'s REPLACE, and every acquire behind it,
 * would queue behind each waiter of any name (check_mysql
 * new_epoch_not_stalled_by_a_waiter). LOCK_THEN_TOKEN sleeps in a DO
 * that opens no table, then reads the row in a second statement of the
 * same request, once GET_LOCK has answered. */
#define GOT_LOCK                                                                               \
    "/*dlock-wait:%s*/ @dlock_got := CASE GET_LOCK(%s, %s) WHEN 1 THEN LENGTH(@dlock_name := " \
    "'%s') > 0 WHEN 0 THEN 0 END"
#define TOKEN_IF_GOT "IF(@dlock_got = 1, %s, NULL) AS t"
#define LOCK_AND_TOKEN "SELECT " GOT_LOCK " AS g, " TOKEN_IF_GOT
#define LOCK_THEN_TOKEN "DO " GOT_LOCK "; SELECT @dlock_got AS g, " TOKEN_IF_GOT

/* The next token from the epoch and base a session kept (struct
 * my_conn): UUID_SHORT() alone, no table opened. Format: the epoch, the
 * base. A token of another epoch (the kept one's 2^40 spent) is not
 * used: the caller reads the row again (new_epoch()). */
#define NEXT_IN_KEPT_EPOCH "@dlock_token := (%llu << 40) + (UUID_SHORT() - %llu)"

/* After the session's first token T: keep the lifetime's epoch and base
 * when the row still is T's epoch (one statement, once per session). A
 * server's error keeps nothing (the next acquire reads the row again);
 * a broken session is the acquire's failure. */
static int keep_epoch(struct my_backend *s, struct my_hold *mh, unsigned long long t, bool *broken)
{
    struct my_io io = {.deadline = dlock__now_ms() + s->c->opts.op_timeout_ms, .cancel_fd = -1};
    MYSQL_RES *res = NULL;
    int rc =
        dlock__my_query(s, mh->k, "SELECT epoch, base FROM " MYSQL_FENCE_BASE_TABLE " WHERE id = 1",
                        &io, &res, broken, "read the fencing epoch");
    if (rc)
        return *broken ? rc : DLOCK_OK;
    MYSQL_ROW row = mysql_fetch_row(res);
    if (row && row[0] && row[1] && strtoull(row[0], NULL, 10) == t >> 40) {
        mh->k->epoch = strtoull(row[0], NULL, 10);
        mh->k->base = strtoull(row[1], NULL, 10);
    }
    mysql_free_result(res);
    return DLOCK_OK;
}

/* A new epoch: under the internal user lock MYSQL_EPOCH_LOCK (so that
 * two clients seeding at once cannot write the MEMORY row out of order),
 * look again, and if the row is still missing or spent, bump the durable
 * epoch (InnoDB, committed before the row is written) and write the row
 * as the epoch and a base taken from UUID_SHORT() before it (so every
 * UUID_SHORT() read with the row is past it). Then take the next token
 * as usual. */
static int new_epoch(struct my_backend *s, struct dlock__hold *h, struct my_hold *mh,
                     unsigned long long *token, bool *broken)
{
    struct my_io io = {.deadline = dlock__now_ms() + s->c->opts.op_timeout_ms, .cancel_fd = -1};
    char *sql = dlock__sprintf("SELECT GET_LOCK('%s', %lld)", MYSQL_EPOCH_LOCK,
                               (long long)(s->c->opts.op_timeout_ms + 999) / 1000);
    MYSQL_RES *res = NULL;
    int rc = sql ? dlock__my_query(s, mh->k, sql, &io, &res, broken, "lock the fencing epoch")
                 : dlock__err(DLOCK_ENOMEM, "out of memory");
    free(sql);
    if (rc)
        return rc;
    if (number_of(res) != 1)
        return dlock__err(DLOCK_ETIMEDOUT,
                          "%s: lock '%s': the fencing epoch's lock '%s' stayed busy through "
                          "the op timeout",
                          s->label, h->name, MYSQL_EPOCH_LOCK);
    unsigned long long epoch = 0, base = 0;
    rc = token_query(s, mh, "SELECT " NEXT_IN_EPOCH, token, broken, "take the fencing token");
    if (!rc && !*token)
        rc = token_query(s, mh,
                         "UPDATE " MYSQL_EPOCH_TABLE " SET n = LAST_INSERT_ID(n + 1) WHERE id = 1",
                         NULL, broken, "start a fencing epoch in " MYSQL_EPOCH_TABLE);
    if (!rc && !*token)
        epoch = mysql_insert_id(mh->k->db);
    /* committed before any token of it leaves, autocommit or not (a
     * server may start sessions with autocommit off) */
    if (!rc && !*token)
        rc = token_query(s, mh, "COMMIT", NULL, broken, "commit the fencing epoch");
    if (!rc && !*token && !epoch)
        rc = dlock__err(DLOCK_EPROTO,
                        "%s: lock '%s': the fencing epoch " MYSQL_EPOCH_TABLE
                        " has no row 1 (was it emptied?)",
                        s->label, h->name);
    if (!rc && !*token && epoch >= MYSQL_EPOCH_MAX)
        rc = dlock__err(DLOCK_EPROTO, "%s: lock '%s': the fencing epoch %llu is past %u", s->label,
                        h->name, epoch, MYSQL_EPOCH_MAX - 1);
    if (!rc && !*token)
        rc = token_query(s, mh, "SELECT UUID_SHORT()", &base, broken,
                         "read the server's UUID_SHORT()");
    if (!rc && !*token) {
        sql = dlock__sprintf("REPLACE INTO " MYSQL_FENCE_BASE_TABLE " VALUES (1, %llu, %llu)",
                             epoch, base);
        rc = sql ? token_query(s, mh, sql, NULL, broken, "seed " MYSQL_FENCE_BASE_TABLE)
                 : dlock__err(DLOCK_ENOMEM, "out of memory");
        free(sql);
        if (!rc)
            rc = token_query(s, mh, "SELECT " NEXT_IN_EPOCH, token, broken,
                             "take the fencing token");
    }
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    bool unlock_broken = false;
    if (token_query(s, mh, "DO RELEASE_LOCK('" MYSQL_EPOCH_LOCK "')", NULL, &unlock_broken,
                    "unlock the fencing epoch"))
        *broken = true; /* closing the session frees it */
    dlock__errmsg_restore(rc, msg);
    if (!rc && !*token)
        rc = dlock__err(DLOCK_EPROTO,
                        "%s: lock '%s': " MYSQL_FENCE_BASE_TABLE " gives no token after its "
                        "seeding",
                        s->label, h->name);
    return rc;
}

/* The fencing token of the hold MH's session was just granted:
 * (epoch << 40) + (UUID_SHORT() - base), the epoch and base read from a
 * MEMORY row (no disk write; its rows vanish when the server restarts)
 * whose epoch is a durable InnoDB counter bumped only when a server
 * lifetime's first token is asked (docs/protocol-mysql.md). */
int dlock__my_next_token(struct my_backend *s, struct dlock__hold *h, struct my_hold *mh,
                         unsigned long long *token, bool *broken)
{
    *token = 0;
    int rc = token_query(s, mh, "SELECT " NEXT_IN_EPOCH, token, broken, "take the fencing token");
    if (!rc && !*token)
        rc = new_epoch(s, h, mh, token, broken);
    return rc;
}

int dlock__my_lock_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
{
    struct my_backend *s = state;
    int cancel_fd = -1;
    /* A try-once GET_LOCK answers at once: as on postgres, its statement
     * is not watched for a cancel (no eventfd made and closed per try,
     * a tenth of the client's CPU in an uncontended pair). */
    int rc = !dlock__wait_try_once(w)  ? dlock__wait_cancel_fd(w, &cancel_fd)
             : dlock__wait_canceled(w) ? DLOCK_ECANCELED
                                       : DLOCK_OK;
    if (rc == DLOCK_ECANCELED)
        return rc;
    struct my_hold *mh = calloc(1, sizeof *mh);
    char *enc = NULL;
    if (!mh || !(mh->name_sql = dlock__my_name_sql(s, h->name, &enc))) {
        dlock__my_hold_free(mh);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    int64_t wd = dlock__wait_deadline(w);
    rc = dlock__my_conn_get(s, h->lease_ms, dlock__time_budget(wd, s->c->opts.connect_timeout_ms),
                            &mh->k);
    if (rc) {
        free(enc);
        dlock__my_hold_free(mh);
        return rc;
    }
    char timeout[32], kept[128];
    lock_timeout(w, timeout, sizeof timeout);
    snprintf(kept, sizeof kept, NEXT_IN_KEPT_EPOCH, mh->k->epoch, mh->k->base);
    char *sql = dlock__sprintf(dlock__wait_try_once(w) ? LOCK_AND_TOKEN : LOCK_THEN_TOKEN, enc,
                               mh->name_sql, timeout, enc, mh->k->epoch ? kept : NEXT_IN_EPOCH);
    free(enc);
    /* The server answers a wait by its end; the reply gets the op
     * timeout beyond it. */
    int64_t now = dlock__now_ms();
    struct my_io io = {
        .deadline = dlock__wait_try_once(w) || wd == DLOCK__NEVER ? now + s->c->opts.op_timeout_ms
                                                                  : wd + s->c->opts.op_timeout_ms,
        .cancel_fd = cancel_fd,
    };
    if (wd == DLOCK__NEVER && !dlock__wait_try_once(w))
        io.deadline = DLOCK__NEVER;
    MYSQL_RES *res = NULL;
    bool broken = false, isnull = true;
    unsigned long long got = 0, token = 0;
    rc = sql ? dlock__my_query(s, mh->k, sql, &io, &res, &broken, "GET_LOCK")
             : dlock__err(DLOCK_ENOMEM, "out of memory");
    free(sql);
    if (!rc) {
        MYSQL_ROW row = dlock__my_first(res, &got, &isnull);
        if (row && mysql_num_fields(res) > 1 && row[1])
            token = strtoull(row[1], NULL, 10);
        mysql_free_result(res);
    }
    if (io.canceled) {
        if (!rc && got)
            give_back(s, mh, &broken);
        else if (rc)
            broken = true; /* KILL QUERY may have landed after the grant (the
                              server keeps the lock then, error 1317): closing
                              the session frees it if so */
        rc = dlock__err(DLOCK_ECANCELED, "lock '%s': wait canceled", h->name);
    } else if (!rc && isnull) {
        rc = dlock__err(DLOCK_EBACKEND,
                        "%s: lock '%s': GET_LOCK answered NULL (the wait was "
                        "killed by another session, or the server failed)",
                        s->label, h->name);
    } else if (!rc && !got) {
        rc = dlock__wait_try_once(w)
                 ? dlock__err(DLOCK_EBUSY, "lock '%s' is held by another session", h->name)
                 : dlock__err(DLOCK_ETIMEDOUT,
                              "lock '%s': still held by another session when "
                              "the wait ended",
                              h->name);
    }
    /* granted: from here a failure must not leave the name locked by a
     * session that goes back to the pool */
    bool granted = !rc;
    if (!rc && mh->k->epoch && token >> 40 != mh->k->epoch)
        token = mh->k->epoch = 0; /* the kept epoch is spent */
    if (!rc && !token)            /* the lifetime's first token, or its epoch spent */
        rc = new_epoch(s, h, mh, &token, &broken);
    if (!rc && !mh->k->epoch)
        rc = keep_epoch(s, mh, token, &broken);
    /* the server's idle clock starts when it answers: after a long
     * wait, a check first (keeper.c) */
    if (!rc)
        rc = dlock__hold_granted(s->c, h, now, still_ours_now,
                                 &(struct grant){.s = s, .h = h, .mh = mh, .broken = &broken});
    if (rc) {
        /* anything went wrong after the grant (an epoch's start timed
         * out too), or anything else: closing the session frees the lock */
        dlock__my_conn_put(s, mh->k,
                           broken || granted ||
                               (rc != DLOCK_EBUSY && rc != DLOCK_ETIMEDOUT &&
                                rc != DLOCK_ECANCELED));
        mh->k = NULL;
        dlock__my_hold_free(mh);
        return rc;
    }
    h->token = token;
    h->bdata = mh;
    snprintf(h->owner, sizeof h->owner, "%.70s/%lu", s->ident, mh->k->id);
    return DLOCK_OK;
}

/* ------------------------------------------------------------- release */

int dlock__my_lock_release(void *state, struct dlock__hold *h)
{
    struct my_backend *s = state;
    struct my_hold *mh = h->bdata;
    h->bdata = NULL;
    if (!mh)
        return dlock__err(DLOCK_ELOST, "lock '%s': no session holds it", h->name);
    if (!mh->k) {
        dlock__my_hold_free(mh);
        return dlock__err(DLOCK_ELOST, "%s: lock '%s' was lost: its session ended", s->label,
                          h->name);
    }
    /* A semaphore's permits: checked, then all given back (the session
     * holds nothing else); IF runs its condition first. */
    char *sql = mh->held_sql ? dlock__sprintf("SELECT IF((%s) IS TRUE, RELEASE_ALL_LOCKS() >= 0, "
                                              "RELEASE_ALL_LOCKS() < 0)",
                                              mh->held_sql)
                             : dlock__sprintf("SELECT RELEASE_LOCK(%s)", mh->name_sql);
    const char *kind = h->sem ? "semaphore" : "lock";
    struct my_io io = {.deadline = dlock__now_ms() + s->c->opts.op_timeout_ms, .cancel_fd = -1};
    MYSQL_RES *res = NULL;
    bool broken = false;
    int rc = sql ? dlock__my_query(s, mh->k, sql, &io, &res, &broken, "RELEASE_LOCK")
                 : dlock__err(DLOCK_ENOMEM, "out of memory");
    free(sql);
    if (!rc) {
        if (number_of(res) != 1)
            rc = dlock__err(DLOCK_ELOST,
                            "%s: %s '%s' was lost: its session (connection %lu) no longer "
                            "held it (force-released)",
                            s->label, kind, h->name, mh->k->id);
    } else if (rc == DLOCK_ETIMEDOUT) {
        /* nothing says the hold was lost: the release failed, and closing
         * the session frees the lock once the server notices */
        char why[DLOCK__MSG_MAX];
        dlock__errmsg_save(why);
        rc = dlock__err(DLOCK_ETIMEDOUT,
                        "%s '%s': release not answered in time (%s); its session is closed, "
                        "which frees it when the server notices",
                        kind, h->name, why);
    } else if (broken) {
        char why[DLOCK__MSG_MAX];
        dlock__errmsg_save(why);
        rc = dlock__err(DLOCK_ELOST, "%s '%s' was lost: its session ended " SESSION_ENDED " (%s)",
                        kind, h->name, why);
    } else {
        rc = DLOCK_OK; /* the session is closed below, and its lock with it */
        broken = true;
    }
    dlock__my_conn_put(s, mh->k, broken);
    mh->k = NULL;
    dlock__my_hold_free(mh);
    return rc;
}

/* --------------------------------------------------------------- renew */

/* A renewal that failed on session MH->k (BROKEN: unusable): the hold is
 * lost with it, and the session closed. */
static int renew_failed(struct dlock__hold *h, struct my_hold *mh, int rc, bool broken)
{
    if (!rc || !broken)
        return rc;
    /* The session cannot be resumed: what it held is gone, or will be
     * when the server ends it (its wait_timeout). */
    char why[DLOCK__MSG_MAX];
    dlock__errmsg_save(why);
    rc = dlock__err(DLOCK_ELOST, "lock '%s' was lost: its session ended " SESSION_ENDED " (%s)",
                    h->name, why);
    dlock__my_conn_close(mh->k);
    mh->k = NULL;
    return rc;
}

/* Every hold's check is sent before any reply is read, each with its own
 * budget (the op timeout, cut to the batch's deadline): a session that
 * stalls costs its own hold, not those read after it. */
static int my_renew(void *state, struct dlock__renew_batch *b)
{
    struct my_backend *s = state;
    struct my_io *io = calloc(b->n ? b->n : 1, sizeof *io);
    struct my_sent *sent = calloc(b->n ? b->n : 1, sizeof *sent);
    int64_t *sent_at = calloc(b->n ? b->n : 1, sizeof *sent_at);
    if (!io || !sent || !sent_at) {
        free(io);
        free(sent);
        free(sent_at);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < b->n; i++) {
        struct dlock__hold *h = b->holds[i];
        struct my_hold *mh = h->bdata;
        sent_at[i] = -1;
        if (!mh || !mh->k) {
            dlock__renew_result(b, i,
                                dlock__err(DLOCK_ELOST, "%s: lock '%s' was lost: its session ended",
                                           s->label, h->name));
            continue;
        }
        char *sql = still_ours_sql(mh);
        io[i] =
            (struct my_io){.deadline = dlock__time_budget(b->deadline, s->c->opts.op_timeout_ms),
                           .cancel_fd = -1};
        int64_t now = dlock__now_ms();
        bool sendable = sql != NULL; /* a failed send leaves the session unusable */
        int rc = sendable ? dlock__my_send(s, mh->k, sql, &io[i], &sent[i])
                          : dlock__err(DLOCK_ENOMEM, "out of memory");
        free(sql);
        if (rc)
            dlock__renew_result(b, i, renew_failed(h, mh, rc, sendable));
        else
            sent_at[i] = now;
    }
    for (size_t i = 0; i < b->n; i++) {
        if (sent_at[i] < 0)
            continue;
        struct dlock__hold *h = b->holds[i];
        struct my_hold *mh = h->bdata;
        MYSQL_RES *res = NULL;
        bool broken = false;
        int rc = dlock__my_finish(s, mh->k, &sent[i], &io[i], &res, &broken, "check a hold");
        if (!rc)
            rc = still_ours_answer(s, h, mh, res);
        rc = renew_failed(h, mh, rc, broken);
        if (!rc)
            dlock__hold_confirmed(s->c, h, sent_at[i]);
        dlock__renew_result(b, i, rc);
    }
    free(io);
    free(sent);
    free(sent_at);
    return DLOCK_OK;
}

/* ---------------------------------------------------------- open, close */

static void backend_free(struct my_backend *s)
{
    if (!s)
        return;
    dlock__my_pool_drain(s);
    pthread_mutex_destroy(&s->mu);
    free(s->host);
    free(s->socket);
    free(s->user);
    free(s->password);
    free(s->db);
    free(s->prefix);
    free(s);
}

/* The fencing token's tables (LOCK_AND_TOKEN, new_epoch()), made when missing.
 * A database a release before the epoch used keeps its one counter in
 * MYSQL_FENCE_TABLE: the epoch then starts at (counter >> 40) + 1, so the
 * first token, >= epoch << 40, is past every token it gave. */
static int create_fence_tables(struct my_backend *s)
{
    MYSQL_RES *res = NULL;
    int rc =
        dlock__my_query_pooled(s,
                               "SELECT COUNT(*) FROM information_schema.TABLES WHERE "
                               "TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '" MYSQL_FENCE_TABLE "'",
                               &res, "look for the old fencing counter " MYSQL_FENCE_TABLE);
    if (rc)
        return rc;
    unsigned long long old_counter = number_of(res);
    rc = dlock__my_query_pooled(s,
                                "CREATE TABLE IF NOT EXISTS " MYSQL_EPOCH_TABLE
                                " (id TINYINT PRIMARY KEY, n BIGINT UNSIGNED NOT NULL) "
                                "ENGINE=InnoDB",
                                NULL,
                                "create the fencing epoch " MYSQL_EPOCH_TABLE
                                " (needs the CREATE privilege once)");
    if (!rc)
        rc = dlock__my_query_pooled(
            s,
            old_counter ? "INSERT IGNORE INTO " MYSQL_EPOCH_TABLE
                          " SELECT 1, COALESCE(MAX(n), 0) >> 40 FROM " MYSQL_FENCE_TABLE
                        : "INSERT IGNORE INTO " MYSQL_EPOCH_TABLE " VALUES (1, 0)",
            NULL, "seed the fencing epoch " MYSQL_EPOCH_TABLE);
    if (!rc)
        rc = dlock__my_query_pooled(s,
                                    "CREATE TABLE IF NOT EXISTS " MYSQL_FENCE_BASE_TABLE
                                    " (id TINYINT PRIMARY KEY, epoch BIGINT UNSIGNED NOT NULL, "
                                    "base BIGINT UNSIGNED NOT NULL) ENGINE=MEMORY",
                                    NULL, "create the fencing base " MYSQL_FENCE_BASE_TABLE);
    return rc;
}

/* What the server is, refused when it cannot serve (Galera refuses
 * GET_LOCK), and the fencing counter, made when missing. */
static int check_server(struct my_backend *s)
{
    MYSQL_RES *res = NULL;
    int rc = dlock__my_query_pooled(
        s,
        "SELECT VERSION(), (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_VARIABLES "
        "WHERE VARIABLE_NAME = 'WSREP_ON'), (SELECT COUNT(*) FROM information_schema.TABLES "
        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ('" MYSQL_EPOCH_TABLE
        "', '" MYSQL_FENCE_BASE_TABLE "', '" MYSQL_VALUE_TABLE "', '" MYSQL_SEM_TABLE
        "', '" MYSQL_LEADER_TABLE "'))",
        &res, "read the server's version");
    if (rc)
        return rc;
    MYSQL_ROW row = dlock__my_first(res, NULL, NULL);
    char version[128] = "";
    bool galera = false, have_tables = row && row[2] && strcmp(row[2], "5") == 0;
    if (row && row[0])
        dlock__escape_text(version, sizeof version, row[0]);
    if (row && row[1])
        galera = strcasecmp(row[1], "ON") == 0;
    mysql_free_result(res);
    if (galera)
        return dlock__err(DLOCK_ENOTSUP,
                          "%s: the server (%s) is a Galera cluster node (wsrep_on=ON): Galera "
                          "does not replicate GET_LOCK's locks and refuses them; point the URL "
                          "at a server outside the cluster",
                          s->label, version);
    /* Only when missing: creating them needs the CREATE privilege, using
     * them only UPDATE, INSERT, DELETE, SELECT. */
    if (have_tables)
        return DLOCK_OK;
    rc = create_fence_tables(s);
    if (!rc)
        rc = dlock__my_query_pooled(s,
                                    "CREATE TABLE IF NOT EXISTS " MYSQL_VALUE_TABLE
                                    " (name VARCHAR(66) CHARACTER SET ascii COLLATE ascii_bin "
                                    "PRIMARY KEY, token BIGINT UNSIGNED NOT NULL, value LONGBLOB "
                                    "NOT NULL) ENGINE=InnoDB",
                                    NULL, "create the lock values' table " MYSQL_VALUE_TABLE);
    if (!rc)
        rc = dlock__my_sem_create_table(s);
    if (!rc)
        rc = dlock__my_elect_create_table(s);
    return rc;
}

static int my_open(struct dlock_client *c, void **state)
{
    *state = NULL;
    const char *url = c->url.redacted;
    int rc = dlock__mariadb_load();
    if (rc)
        return rc;
    const char *socket = dlock__url_param(&c->url, "socket");
    if (c->url.nhosts > 1)
        return dlock__err(DLOCK_EBADURL, "bad URL '%s': one server only (mysql://HOST:PORT/DB)",
                          url);
    if (c->url.nhosts == 0 && !socket)
        return dlock__err(DLOCK_EBADURL,
                          "bad URL '%s': no server (mysql://HOST:PORT/DB, or ?socket=PATH)", url);
    if (!c->url.path || !c->url.path[1] || strchr(c->url.path + 1, '/'))
        return dlock__err(DLOCK_EBADURL,
                          "bad URL '%s': name the database in the path (mysql://HOST/DB): the "
                          "fencing counter lives there",
                          url);
    if (c->opts.tls_ca || c->opts.tls_cert || c->opts.tls_key)
        return dlock__err(DLOCK_ENOTSUP, "%s: TLS is not supported by the mysql backend yet", url);
    if (c->opts.layout)
        return dlock__err(DLOCK_EBADURL, "bad URL '%s': the mysql backend has no layouts", url);
    struct my_backend *s = calloc(1, sizeof *s);
    if (!s)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    s->c = c;
    pthread_mutex_init(&s->mu, NULL);
    s->host = c->url.nhosts ? dlock__strdup(c->url.hosts[0].host) : NULL;
    s->port =
        c->url.nhosts && c->url.hosts[0].port ? (unsigned)c->url.hosts[0].port : MYSQL_DEFAULT_PORT;
    s->socket = socket ? dlock__strdup(socket) : NULL;
    s->user = c->opts.user ? dlock__strdup(c->opts.user) : NULL;
    s->db = dlock__strdup(c->url.path + 1);
    s->prefix = dlock__strdup(c->opts.key_prefix ? c->opts.key_prefix : "");
    if (c->opts.password)
        s->password = dlock__strdup(c->opts.password);
    else if ((rc = dlock__password_env("DLOCK_MYSQL_PASSWORD", &s->password))) {
        backend_free(s);
        return rc;
    }
    if (s->socket)
        snprintf(s->label, sizeof s->label, "mysql %s/%s", s->socket, s->db);
    else
        snprintf(s->label, sizeof s->label,
                 strchr(s->host, ':') ? "mysql [%s]:%u/%s" : "mysql %s:%u/%s", s->host, s->port,
                 s->db);
    dlock__identity(s->ident, sizeof s->ident);
    rc = check_server(s);
    if (rc) {
        backend_free(s);
        return rc;
    }
    *state = s;
    return DLOCK_OK;
}

static void my_close(void *state)
{
    backend_free(state);
}

/* --------------------------------------------------------------- table */

static const char *const my_schemes[] = {"mysql", "mariadb", NULL};

static const struct dlock__lock_ops my_lock_ops = {
    .acquire = dlock__my_lock_acquire,
    .release = dlock__my_lock_release,
};

static const struct dlock__value_ops my_value_ops = {
    .set = dlock__my_value_set,
    .get = dlock__my_value_get,
};

static const struct dlock__admin_ops my_admin_ops = {
    .inspect = dlock__my_inspect,
    .check = dlock__my_check,
    .force_release = dlock__my_force_release,
    .list = dlock__my_list,
};

const struct dlock__backend dlock__backend_mysql = {
    .name = "mysql",
    .schemes = my_schemes,
    .caps = DLOCK__CAP_LEASES | DLOCK__CAP_FIXED_LEASE,
    .default_port = MYSQL_DEFAULT_PORT,
    .open = my_open,
    .close = my_close,
    .renew = my_renew,
    .locks = &my_lock_ops,
    .admin = &my_admin_ops,
    .values = &my_value_ops,
    .semaphores = &dlock__my_sem_ops,
    .elections = &dlock__my_elect_ops,
    /* docs/protocol-mysql.md, "Guarded writes" */
    .no_guarded_why = "not yet (a table written in the hold's session is the plan); use "
                      "redis://, etcd:// or zk:// for guarded writes",
    .no_contend_why = "a mysql waiter sleeps in GET_LOCK(), seen only by a query of "
                      "performance_schema (not yet)",
};
