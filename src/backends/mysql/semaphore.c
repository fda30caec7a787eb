/* semaphore.c -- the MySQL/MariaDB backend's counting semaphore: N
 * permits as N user locks, taken on one session per permit object.
 *
 * Permit i of semaphore NAME is the user lock "ENC#i", ENC the encoded
 * name (names.c; '#' is always encoded there, so no lock name looks like
 * a permit), or "%h" and 57 hex digits of ENC's SHA-256 when ENC is
 * longer than 59 characters (GET_LOCK takes 64). A permit object of K
 * permits is one session holding K of these locks: the server frees them
 * all when the session ends (release, kill -9, the lease passed while
 * frozen: the session's wait_timeout), and the keeper's renewal checks
 * all K on that session, as it checks a lock. The count N is a row of
 * dlock_semaphore, written by the first acquire; every acquire compares
 * its own count with it in the same statement that takes the permits.
 *
 * One statement per attempt: it reads the stored count, tries each
 * permit with GET_LOCK(permit, 0) until it has K, and, when it has fewer,
 * gives back what it took (RELEASE_ALL_LOCKS: the session holds nothing
 * else) and sleeps in the server in GET_LOCK on one permit, so the
 * release of that permit wakes it at once. MySQL cannot wait for "any of
 * N locks", so that sleep is bounded by MYSQL_RECHECK_MS (and by the
 * wait): a permit other than the one slept on that comes back is seen at
 * the next attempt, at most that long after. The permit slept on turns
 * round-robin from attempt to attempt, starting at the session's id. So
 * waiters are not served in arrival order: whoever tries first when a
 * permit comes back gets it, and a waiter of K > 1 permits can be passed
 * by waiters of one for as long as they keep coming (docs/protocol-mysql.md).
 * A waiter's statement carries the marker dlock-semwait:ENC, and its
 * session keeps ENC in @dlock_sem (what list reads for a hashed name)
 * and clears the @dlock_name a lock it held before left (else the locks'
 * list would read a hashed permit as that lock).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mysql.h"

/* Room after a semaphore's part of a permit's lock name: "#1023". */
#define PERMIT_ROOM 5
#define HASHED_HEX (MYSQL_LOCK_NAME_MAX - PERMIT_ROOM - 2)

/* Semaphore NAME's names: ENC, and BASE, the SQL of the part every
 * permit's lock name starts with (the key of its count's row). */
struct sem_names {
    char *enc;
    char *base;
    bool hashed;
};

static void sem_names_free(struct sem_names *n)
{
    free(n->enc);
    free(n->base);
}

static int sem_names_make(struct my_backend *s, const char *name, struct sem_names *n)
{
    memset(n, 0, sizeof *n);
    free(dlock__my_name_sql(s, name, &n->enc));
    if (n->enc) {
        n->hashed = strlen(n->enc) > MYSQL_LOCK_NAME_MAX - PERMIT_ROOM;
        n->base = n->hashed ? dlock__sprintf("CONCAT('%%h', LEFT(SHA2('%s', 256), %d))", n->enc,
                                             HASHED_HEX)
                            : dlock__sprintf("'%s'", n->enc);
    }
    if (!n->base) {
        sem_names_free(n);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    return DLOCK_OK;
}

/* Permit I's lock name as SQL, onto F. */
static void put_permit(FILE *f, const struct sem_names *n, unsigned i)
{
    if (n->hashed)
        fprintf(f, "CONCAT(%s, '#%u')", n->base, i);
    else
        fprintf(f, "'%s#%u'", n->enc, i);
}

/* The text F (open_memstream on *TEXT) wrote, once closed; NULL when out
 * of memory. */
static char *memstream_text(FILE *f, char **text)
{
    if (fclose(f) != 0) {
        free(*text);
        return NULL;
    }
    return *text;
}

/* What one attempt asks: K of PERMITS, HELD a permit the session holds
 * already (won in the last sleep; -1: none), and, when fewer are free,
 * a sleep of TIMEOUT (GET_LOCK's seconds; NULL: none, a try) on permit
 * SLEEP_ON. */
struct attempt {
    unsigned permits, k;
    int held;
    unsigned sleep_on;
    const char *timeout;
};

/* One attempt's statement. Its row: the stored count (NULL: none yet),
 * 1, the permits it took ("0,2"), and what it did: 2 took K, 1 slept and
 * won permit SLEEP_ON, 0 slept (or tried) in vain, -1 the sleep was
 * ended (GET_LOCK answered NULL), -2 the stored count is another one
 * (nothing taken). The select list is evaluated left to right, and each
 * IF only takes a permit while some are still wanted. */
static char *attempt_sql(const struct sem_names *n, const struct attempt *a)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return NULL;
    fprintf(f,
            "SELECT /*dlock-semwait:%s*/ @dlock_n := (SELECT permits FROM " MYSQL_SEM_TABLE
            " WHERE name = %s), LENGTH(CONCAT(@dlock_sem := '%s', COALESCE(@dlock_name := NULL, "
            "''))) > 0, CONCAT_WS(',', "
            "IF((@dlock_need := IF(COALESCE(@dlock_n, %u) = %u, %u, -1)) < 0, NULL, NULL)",
            n->enc, n->base, n->enc, a->permits, a->permits, a->k - (a->held >= 0));
    for (unsigned i = 0; i < a->permits; i++) {
        if ((int)i == a->held)
            continue;
        fprintf(f, ", IF(@dlock_need > 0 AND GET_LOCK(");
        put_permit(f, n, i);
        fprintf(f, ", 0) = 1 AND (@dlock_need := @dlock_need - 1) >= 0, %u, NULL)", i);
    }
    /* IF(RELEASE_ALL_LOCKS() >= 0, X, X): the release first, then X */
    fprintf(f, "), CASE WHEN @dlock_need = 0 THEN 2 WHEN @dlock_need < 0 THEN "
               "IF(RELEASE_ALL_LOCKS() >= 0, -2, -2) ELSE IF(RELEASE_ALL_LOCKS() >= 0, ");
    if (a->timeout) {
        fprintf(f, "COALESCE(GET_LOCK(");
        put_permit(f, n, a->sleep_on);
        fprintf(f, ", %s), -1), -1)", a->timeout);
    } else {
        fprintf(f, "0, 0)");
    }
    fprintf(f, " END");
    return memstream_text(f, &text);
}

/* The condition that the session holds the permits SLOTS (a list such
 * as "0,2") of N's: what renewals and the release check. */
static char *held_sql(const struct sem_names *n, const char *slots)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return NULL;
    const char *and = "";
    for (const char *p = slots; *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p)) {
        fprintf(f, "%sIS_USED_LOCK(", and);
        put_permit(f, n, (unsigned)strtoul(p, NULL, 10));
        fprintf(f, ") = CONNECTION_ID()");
        and = " AND ";
    }
    return memstream_text(f, &text);
}

/* Give back whatever MH's session took (a canceled or failed acquire):
 * its session holds nothing else. */
static void give_back_all(struct my_backend *s, struct my_hold *mh, bool *broken)
{
    struct my_io io = {.deadline = dlock__now_ms() + s->c->opts.op_timeout_ms, .cancel_fd = -1};
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    if (dlock__my_query(s, mh->k, "DO RELEASE_ALL_LOCKS()", &io, NULL, broken,
                        "give back a semaphore's permits"))
        *broken = true; /* closing the session frees them */
    dlock__errmsg_restore(DLOCK_OK, msg);
}

/* GET_LOCK's timeout for one sleep of W: what is left of it, at most
 * MYSQL_RECHECK_MS; NULL for a try. */
static const char *sleep_timeout(const struct dlock__wait *w, char *buf, size_t size)
{
    if (dlock__wait_try_once(w))
        return NULL;
    int64_t wd = dlock__wait_deadline(w), left = MYSQL_RECHECK_MS;
    if (wd != DLOCK__NEVER && wd - dlock__now_ms() < left)
        left = wd - dlock__now_ms();
    if (left < 0)
        left = 0;
    snprintf(buf, size, "%lld.%03lld", (long long)(left / 1000), (long long)(left % 1000));
    return buf;
}

/* The stored count of semaphore N, written as PERMITS if none is (the
 * first acquire, on MH's session, which holds its permits): DLOCK_EINVAL
 * when another count got there first. */
static int store_count(struct my_backend *s, struct dlock__hold *h, struct my_hold *mh,
                       const struct sem_names *n, bool *broken)
{
    unsigned permits = h->sem->permits;
    char *ins = dlock__sprintf("INSERT INTO " MYSQL_SEM_TABLE " (name, permits) VALUES (%s, %u) "
                               "ON DUPLICATE KEY UPDATE permits = permits",
                               n->base, permits);
    char *sel = dlock__sprintf("SELECT permits FROM " MYSQL_SEM_TABLE " WHERE name = %s", n->base);
    struct my_io io = {.deadline = dlock__now_ms() + s->c->opts.op_timeout_ms, .cancel_fd = -1};
    MYSQL_RES *res = NULL;
    int rc = ins && sel ? dlock__my_query(s, mh->k, ins, &io, NULL, broken,
                                          "store the semaphore's count in " MYSQL_SEM_TABLE)
                        : dlock__err(DLOCK_ENOMEM, "out of memory");
    if (!rc)
        rc = dlock__my_query(s, mh->k, sel, &io, &res, broken, "read the semaphore's count");
    free(ins);
    free(sel);
    if (rc)
        return rc;
    unsigned long long stored = 0;
    dlock__my_first(res, &stored, NULL);
    mysql_free_result(res);
    if (stored != permits)
        return dlock__err(DLOCK_EINVAL,
                          "semaphore '%s' has %llu permits (stored in " MYSQL_SEM_TABLE "), not %u",
                          h->name, stored, permits);
    return DLOCK_OK;
}

/* Run attempt A on MH's session within W (its cancel ends a sleep): the
 * status (attempt_sql) into *STATUS, the permits taken into SLOTS (SIZE
 * bytes), the stored count into *STORED (-1: none). */
struct attempt_out {
    int status;
    long long stored;
    char slots[8 * 1024];
};

static int run_attempt(struct my_backend *s, struct my_hold *mh, const struct sem_names *n,
                       const struct attempt *a, struct my_io *io, struct attempt_out *out,
                       bool *broken)
{
    char *sql = attempt_sql(n, a);
    if (!sql)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    MYSQL_RES *res = NULL;
    int rc = dlock__my_query(s, mh->k, sql, io, &res, broken, "take a semaphore's permits");
    free(sql);
    if (rc)
        return rc;
    MYSQL_ROW row = dlock__my_first(res, NULL, NULL);
    if (!row || mysql_num_fields(res) != 4 || !row[3]) {
        mysql_free_result(res);
        return dlock__err(DLOCK_EPROTO, "%s: a semaphore's attempt answered no status", s->label);
    }
    out->stored = row[0] ? strtoll(row[0], NULL, 10) : -1;
    out->status = (int)strtol(row[3], NULL, 10);
    snprintf(out->slots, sizeof out->slots, "%s", row[2] ? row[2] : "");
    mysql_free_result(res);
    return DLOCK_OK;
}

/* The acquire's loop of attempts on MH's session: DLOCK_OK with the
 * permits in OUT->slots (HELD added), or why not. */
static int take_permits(struct my_backend *s, struct dlock__hold *h, struct my_hold *mh,
                        const struct sem_names *n, struct dlock__wait *w, struct attempt_out *out,
                        bool *broken)
{
    int cancel_fd = -1;
    if (dlock__wait_cancel_fd(w, &cancel_fd) == DLOCK_ECANCELED)
        return dlock__err(DLOCK_ECANCELED, "semaphore '%s': wait canceled", h->name);
    struct attempt a = {.permits = h->sem->permits, .k = h->sem->k, .held = -1};
    for (unsigned round = 0;; round++) {
        char timeout[32];
        a.timeout = sleep_timeout(w, timeout, sizeof timeout);
        a.sleep_on = (unsigned)((mh->k->id + round) % a.permits);
        int64_t wd = dlock__wait_deadline(w), now = dlock__now_ms();
        struct my_io io = {.deadline = now + MYSQL_RECHECK_MS + s->c->opts.op_timeout_ms,
                           .cancel_fd = cancel_fd};
        int rc = run_attempt(s, mh, n, &a, &io, out, broken);
        if (io.canceled)
            return dlock__err(DLOCK_ECANCELED, "semaphore '%s': wait canceled", h->name);
        if (rc)
            return rc;
        if (out->status == -2)
            return dlock__err(DLOCK_EINVAL,
                              "semaphore '%s' has %lld permits (stored in " MYSQL_SEM_TABLE
                              "), not %u",
                              h->name, out->stored, a.permits);
        if (out->status == -1)
            return dlock__err(DLOCK_EBACKEND,
                              "%s: semaphore '%s': GET_LOCK answered NULL (the wait was killed "
                              "by another session, or the server failed)",
                              s->label, h->name);
        if (out->status == 1 && a.k == 1) {
            snprintf(out->slots, sizeof out->slots, "%u", a.sleep_on);
            return DLOCK_OK;
        }
        if (out->status == 2) {
            if (a.held >= 0) {
                size_t used = strlen(out->slots);
                snprintf(out->slots + used, sizeof out->slots - used, "%s%d", used ? "," : "",
                         a.held);
            }
            return DLOCK_OK;
        }
        a.held = out->status == 1 ? (int)a.sleep_on : -1;
        if (dlock__wait_try_once(w))
            return dlock__err(DLOCK_EBUSY, "semaphore '%s': fewer than %u of its %u permits free",
                              h->name, a.k, a.permits);
        if (wd != DLOCK__NEVER && dlock__now_ms() >= wd && a.held < 0)
            return dlock__err(DLOCK_ETIMEDOUT,
                              "semaphore '%s': fewer than %u of its %u permits free when the "
                              "wait ended",
                              h->name, a.k, a.permits);
    }
}

static int sem_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
{
    struct my_backend *s = state;
    struct sem_names n;
    int rc = sem_names_make(s, h->name, &n);
    if (rc)
        return rc;
    struct my_hold *mh = calloc(1, sizeof *mh);
    struct attempt_out *out = calloc(1, sizeof *out);
    if (!mh || !out || !(mh->name_sql = dlock__strdup(n.base))) {
        free(out);
        dlock__my_hold_free(mh);
        sem_names_free(&n);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    int64_t wd = dlock__wait_deadline(w);
    rc = dlock__my_conn_get(s, h->lease_ms, dlock__time_budget(wd, s->c->opts.connect_timeout_ms),
                            &mh->k);
    bool broken = false;
    if (!rc)
        rc = take_permits(s, h, mh, &n, w, out, &broken);
    if (!rc && out->stored < 0)
        rc = store_count(s, h, mh, &n, &broken);
    if (!rc && !(mh->held_sql = held_sql(&n, out->slots)))
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    unsigned long long token = 0;
    int64_t sent = dlock__now_ms();
    if (!rc)
        rc = dlock__my_next_token(s, h, mh, &token, &broken);
    free(out);
    sem_names_free(&n);
    if (rc) {
        /* what the attempts took, also when a cancel's KILL QUERY landed
         * after a grant */
        if (mh->k && !broken)
            give_back_all(s, mh, &broken);
        dlock__my_conn_put(s, mh->k, broken);
        mh->k = NULL;
        dlock__my_hold_free(mh);
        return rc;
    }
    h->token = token;
    h->bdata = mh;
    snprintf(h->owner, sizeof h->owner, "%.70s/%lu", s->ident, mh->k->id);
    dlock__hold_confirmed(s->c, h, sent);
    return DLOCK_OK;
}

/* ------------------------------------------------------------- inspect */

/* The stored count of N into *STORED (0: none). */
static int stored_count(struct my_backend *s, const struct sem_names *n, unsigned long long *stored)
{
    return dlock__my_select_number(s,
                                   dlock__sprintf("SELECT permits FROM " MYSQL_SEM_TABLE
                                                  " WHERE name = %s",
                                                  n->base),
                                   "read a semaphore's count", stored);
}

/* The holders of N's PERMITS permits, one row per session: its id, its
 * permit id, the permits it holds (a row with a NULL id counts the free
 * ones). */
static int look_permits(struct my_backend *s, const struct sem_names *n, unsigned permits,
                        MYSQL_RES **res)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    fprintf(f, "SELECT l.id, IF(l.id IS NULL, NULL, " MYSQL_OWNER_ID("l.id") "), COUNT(*) FROM (");
    for (unsigned i = 0; i < permits; i++) {
        fprintf(f, "%sSELECT IS_USED_LOCK(", i ? " UNION ALL " : "");
        put_permit(f, n, i);
        fprintf(f, ") AS id");
    }
    fprintf(f, ") l GROUP BY l.id");
    char *sql = memstream_text(f, &text);
    if (!sql)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    int rc = dlock__my_query_pooled(s, sql, res, "inspect a semaphore");
    free(sql);
    return rc;
}

static int sem_inspect(void *state, const char *name, unsigned permits, struct dlock_info *info)
{
    struct my_backend *s = state;
    struct sem_names n;
    int rc = sem_names_make(s, name, &n);
    if (rc)
        return rc;
    unsigned long long stored = 0;
    rc = stored_count(s, &n, &stored);
    if (!rc && stored && permits && stored != permits)
        rc = dlock__err(DLOCK_EINVAL,
                        "semaphore '%s' has %llu permits (stored in " MYSQL_SEM_TABLE "), not %u",
                        name, stored, permits);
    if (!rc && stored > DLOCK_PERMITS_MAX)
        rc = dlock__err(DLOCK_EPROTO, "semaphore '%s': a stored count of %llu permits", name,
                        stored);
    if (!rc && stored)
        permits = (unsigned)stored;
    info->permits = permits;
    info->free_permits = permits;
    MYSQL_RES *res = NULL;
    if (!rc && permits && !(rc = look_permits(s, &n, permits, &res))) {
        MYSQL_ROW row;
        while (!rc && (row = mysql_fetch_row(res))) {
            if (!row[0] || !row[1] || !row[2])
                continue;
            unsigned count = (unsigned)strtoul(row[2], NULL, 10);
            info->held = 1;
            info->free_permits -= count;
            rc = dlock__info_add_holder(info, row[1], count);
        }
        mysql_free_result(res);
    }
    if (!rc)
        rc = dlock__info_set_key(info, n.enc);
    sem_names_free(&n);
    return rc;
}

/* ---------------------------------------------------------------- list */

static int sem_list(void *state, const char *pattern, dlock_list_fn fn, void *arg)
{
    struct my_backend *s = state;
    int rc = dlock__my_list_refused(s);
    if (rc)
        return rc;
    MYSQL_RES *res = NULL;
    rc = dlock__my_query_pooled(
        s,
        "SELECT DISTINCT IF(LEFT(m.OBJECT_NAME, 2) = '%h', (SELECT v.VARIABLE_VALUE FROM "
        "performance_schema.user_variables_by_thread v WHERE v.THREAD_ID = m.OWNER_THREAD_ID "
        "AND v.VARIABLE_NAME = 'dlock_sem'), SUBSTRING_INDEX(m.OBJECT_NAME, '#', 1)) FROM "
        "performance_schema.metadata_locks m WHERE m.OBJECT_TYPE = 'USER LEVEL LOCK' AND "
        "m.LOCK_STATUS = 'GRANTED' AND LOCATE('#', m.OBJECT_NAME) > 0 ORDER BY 1",
        &res, "list the semaphores");
    if (rc)
        return rc;
    MYSQL_ROW row;
    while ((row = mysql_fetch_row(res))) {
        char *name = row[0] ? dlock__my_name_of(s, row[0]) : NULL;
        bool stop = name && dlock__glob(pattern, name) && fn(name, arg) != 0;
        free(name);
        if (stop)
            break;
    }
    mysql_free_result(res);
    return DLOCK_OK;
}

int dlock__my_sem_create_table(struct my_backend *s)
{
    return dlock__my_query_pooled(s,
                                  "CREATE TABLE IF NOT EXISTS " MYSQL_SEM_TABLE
                                  " (name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin "
                                  "PRIMARY KEY, permits INT UNSIGNED NOT NULL) ENGINE=InnoDB",
                                  NULL, "create the semaphores' table " MYSQL_SEM_TABLE);
}

const struct dlock__sem_ops dlock__my_sem_ops = {
    .acquire = sem_acquire,
    .release = dlock__my_lock_release, /* knows a permit by its held_sql */
    .inspect = sem_inspect,
    .list = sem_list,
};
