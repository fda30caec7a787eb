/* semaphore.c -- counting semaphores on PostgreSQL: a block of advisory
 * keys per name, one key per permit, and LISTEN/NOTIFY for the waits.
 *
 * Semaphore NAME owns the 2048 bigint keys from B = (the FNV-1a hash of
 * its full name, a NUL and "semaphore") with its low 11 bits cleared:
 * permit i is key B + i (N <= 1024 permits), and B + 1024 is the gate.
 * A permit object of K permits is K of those keys, each a session
 * advisory lock on one session of its own that the hold pins, as a lock's
 * hold does (lock.c): the server frees them all when that session ends --
 * at release, one lease after a frozen holder's last ping
 * (idle_session_timeout), or at once when it dies -- and the keeper's
 * pings (lock.c's renew) keep them.
 *
 * An acquire is one statement string (one round trip, one transaction)
 * run under the gate, a transaction advisory lock: it stores the count N
 * if none is, checks it, tries the permits' keys in order with
 * pg_try_advisory_lock until K are taken and, when fewer were free, gives
 * back the ones it took before the gate opens. Attempts never overlap,
 * so no attempt sees another's keys held for a moment, and the token
 * (nextval of the locks' sequence) and a row per key of dlock_permits
 * (for inspect and list) come with the keys. A release unlocks its keys
 * and sends a NOTIFY on the semaphore's channel (notify.c); a waiter
 * LISTENs before its second attempt, so a release after any of its
 * attempts wakes it. A holder's session that ends sends nothing: waiters
 * look again every lease/3 (at most 2 s) as well -- the safety re-check,
 * which also keeps the waiting session from its idle timeout. Waiters are
 * served in no order. docs/protocol-postgres.md tells the whole story.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pg.h"

#define PG_SEMAPHORES "dlock_semaphores"
#define PG_PERMITS "dlock_permits"
#define BLOCK_MASK 0x7ffu  /* a semaphore's 2048 keys */
#define GATE_SLOT 1024     /* the key of B + 1024 */
#define RECHECK_MIN_MS 100 /* the safety re-check: lease/3, within these bounds */
#define RECHECK_MAX_MS 2000

static const struct pg_objects sem_objects = {
    .what = "semaphores",
    .names = PG_SEMAPHORES " and " PG_PERMITS,
    .look = "SELECT to_regclass('" PG_SEMAPHORES "') IS NOT NULL AND to_regclass('" PG_PERMITS
            "') IS NOT NULL",
    .create = "CREATE TABLE IF NOT EXISTS " PG_SEMAPHORES " (name bytea PRIMARY KEY, permits "
              "int4 NOT NULL); CREATE UNLOGGED TABLE IF NOT EXISTS " PG_PERMITS " (name bytea "
              "NOT NULL, slot int4 NOT NULL, key int8 NOT NULL, pid int4 NOT NULL, token int8 "
              "NOT NULL, PRIMARY KEY (name, slot))",
};

/* A permit object's hold data (h->bdata): lock.c's first, so renew()
 * pings its session. */
struct pg_sem_hold {
    struct pg_hold base;
    char slots[5 * DLOCK_PERMITS_MAX]; /* "0,2,5": the slots held */
};

/* Semaphore NAME as the server knows it. */
struct sem_ref {
    char *hex;     /* the full name's bytes in hex */
    int64_t first; /* B: the block's first key */
    char channel[PG_CHANNEL_MAX];
};

static int sem_ref_make(struct pg_backend *b, const char *name, struct sem_ref *r)
{
    char *full = dlock__pg_full_name(b, name);
    r->hex = full ? dlock__pg_hex(full) : NULL;
    if (!r->hex) {
        free(full);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    r->first = (int64_t)(dlock__pg_tagged_hash(full, "semaphore") & ~(uint64_t)BLOCK_MASK);
    free(full);
    dlock__pg_channel("sem", (uint64_t)r->first, r->channel);
    return DLOCK_OK;
}

static int wrong_count(struct pg_backend *b, const char *name, const char *stored, unsigned permits)
{
    return dlock__err(DLOCK_EINVAL,
                      "%s: semaphore '%s' has %s permits (stored in " PG_SEMAPHORES "), not %u",
                      b->label, name, stored, permits);
}

/* ---------------------------------------------------------------- acquire */

/* What one attempt saw. */
struct attempt {
    bool counted;    /* a count is stored */
    char stored[16]; /* that count */
    uint64_t token;  /* 0: fewer than K free */
    char *slots;     /* the slots taken (a row's text, valid until cleared) */
};

/* One attempt of hold H at its permits on its session, with PRELUDE
 * (settings, a LISTEN) sent first; *OUT what it saw, R its result
 * (caller clears). */
static int attempt(struct pg_backend *b, struct dlock__hold *h, const struct sem_ref *r,
                   const char *prelude, PGresult **res, struct attempt *out)
{
    struct pg_sem_hold *sh = h->bdata;
    unsigned n = h->sem->permits, k = h->sem->k;
    char *sql = dlock__sprintf(
        "%sSELECT pg_advisory_xact_lock((%" PRId64 ")::int8 + %d); "
        "INSERT INTO " PG_SEMAPHORES " SELECT decode('%s', 'hex'), %u WHERE NOT EXISTS (SELECT "
        "1 FROM " PG_SEMAPHORES " WHERE name = decode('%s', 'hex')) ON CONFLICT (name) DO "
        "NOTHING; "
        "WITH c AS (SELECT permits FROM " PG_SEMAPHORES " WHERE name = decode('%s', 'hex')), "
        "got AS MATERIALIZED (SELECT s FROM generate_series(0, %u) s WHERE CASE WHEN (SELECT "
        "permits FROM c) = %u THEN pg_try_advisory_lock((%" PRId64 ")::int8 + s) ELSE false END "
        "LIMIT %u), "
        "n AS (SELECT count(*) AS k FROM got), "
        "undo AS (SELECT pg_advisory_unlock((%" PRId64 ")::int8 + s) FROM got WHERE (SELECT k "
        "FROM n) < %u), "
        "t AS (SELECT nextval('" PG_SEQUENCE "') AS token FROM n WHERE k = %u), "
        "rec AS (INSERT INTO " PG_PERMITS " SELECT decode('%s', 'hex'), s, (%" PRId64
        ")::int8 + s, pg_backend_pid(), token FROM got, t ON CONFLICT (name, slot) DO UPDATE SET "
        "key = excluded.key, pid = excluded.pid, token = excluded.token RETURNING slot) "
        "SELECT (SELECT permits FROM c), (SELECT count(*) FROM undo), (SELECT token FROM t), "
        "(SELECT string_agg(slot::text, ',' ORDER BY slot) FROM rec)",
        prelude, r->first, GATE_SLOT, r->hex, n, r->hex, r->hex, n - 1, n, r->first, k, r->first, k,
        k, r->hex, r->first);
    if (!sql)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    char what[300];
    snprintf(what, sizeof what, "acquire semaphore '%s'", h->name);
    struct pg_query q = {.sql = sql,
                         .what = what,
                         .deadline = dlock__time_budget(DLOCK__NEVER, b->c->opts.op_timeout_ms)};
    int rc = dlock__pg_exec(b, sh->base.pc, &q, res);
    free(sql);
    if (rc)
        return rc;
    memset(out, 0, sizeof *out);
    if (dlock__pq.ntuples(*res) != 1)
        return dlock__err(DLOCK_EPROTO, "%s: %s: %d rows", b->label, what, dlock__pq.ntuples(*res));
    out->counted = !dlock__pq.getisnull(*res, 0, 0);
    snprintf(out->stored, sizeof out->stored, "%s", dlock__pq.getvalue(*res, 0, 0));
    if (!dlock__pq.getisnull(*res, 0, 2)) {
        out->token = strtoull(dlock__pq.getvalue(*res, 0, 2), NULL, 10);
        out->slots = dlock__pq.getvalue(*res, 0, 3);
    }
    return DLOCK_OK;
}

/* LISTEN (or, with !ON, UNLISTEN) on hold H's session for semaphore R's
 * releases, in a transaction of its own: a LISTEN before the next
 * attempt, so that every release after that attempt's look wakes the
 * waiter; an UNLISTEN once the permits are taken, since a pinned session
 * would gather every later release's notification. */
static int listen_for_releases(struct pg_backend *b, struct dlock__hold *h, const struct sem_ref *r,
                               bool on)
{
    struct pg_sem_hold *sh = h->bdata;
    char sql[80], what[300];
    snprintf(sql, sizeof sql, "%sLISTEN \"%s\"", on ? "" : "UN", r->channel);
    snprintf(what, sizeof what, "acquire semaphore '%s' (%slisten)", h->name, on ? "" : "un");
    struct pg_query q = {.sql = sql,
                         .what = what,
                         .deadline = dlock__time_budget(DLOCK__NEVER, b->c->opts.op_timeout_ms)};
    PGresult *res = NULL;
    int rc = dlock__pg_exec(b, sh->base.pc, &q, &res);
    if (res)
        dlock__pq.clear(res);
    if (!on)
        dlock__pg_notified(sh->base.pc, false);
    return rc;
}

static int pg_sem_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
{
    struct pg_backend *b = state;
    dlock_client *c = b->c;
    int rc = dlock__pg_ensure(b, &sem_objects, &b->sem_tables);
    struct sem_ref r = {0};
    if (!rc)
        rc = sem_ref_make(b, h->name, &r);
    if (rc)
        return rc;
    bool try_once = dlock__wait_try_once(w);
    struct pg_sem_hold *sh = calloc(1, sizeof *sh);
    if (!sh) {
        free(r.hex);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    rc = dlock__pg_session(b, w,
                           dlock__time_budget(try_once ? 0 : dlock__wait_deadline(w),
                                              c->opts.connect_timeout_ms),
                           &sh->base.pc);
    if (rc) {
        free(r.hex);
        free(sh);
        return rc;
    }
    struct pg_conn *pc = sh->base.pc;
    h->bdata = sh;
    bool listening = false;
    int64_t recheck = h->lease_ms / 3 > RECHECK_MAX_MS ? RECHECK_MAX_MS : h->lease_ms / 3;
    if (recheck < RECHECK_MIN_MS)
        recheck = RECHECK_MIN_MS;
    for (int uncounted = 0;;) {
        char prelude[80] = "";
        if (pc->idle_timeout_ms != h->lease_ms)
            snprintf(prelude, sizeof prelude, "SET idle_session_timeout = %lld; ",
                     (long long)h->lease_ms);
        int64_t sent = dlock__now_ms();
        PGresult *res = NULL;
        struct attempt seen;
        rc = attempt(b, h, &r, prelude, &res, &seen);
        if (rc) {
            pc->broken = true; /* closed: whatever it may have taken ends with it */
            break;
        }
        pc->idle_timeout_ms = h->lease_ms;
        if (!seen.counted && ++uncounted < 3) { /* made by another client this instant */
            dlock__pq.clear(res);
            continue;
        }
        if (!seen.counted || strtoul(seen.stored, NULL, 10) != h->sem->permits) {
            rc = seen.counted ? wrong_count(b, h->name, seen.stored, h->sem->permits)
                              : dlock__err(DLOCK_EBACKEND, "%s: semaphore '%s': no count stored",
                                           b->label, h->name);
            dlock__pq.clear(res);
            break;
        }
        if (seen.token) {
            h->token = seen.token;
            snprintf(sh->slots, sizeof sh->slots, "%s", seen.slots);
            dlock__pq.clear(res);
            if (listening && (rc = listen_for_releases(b, h, &r, false))) {
                pc->broken = true;
                break;
            }
            snprintf(h->owner, sizeof h->owner, "%s/%d", b->ident + 6,
                     dlock__pq.backendPID(pc->pq));
            dlock__hold_confirmed(c, h, sent);
            free(r.hex);
            return DLOCK_OK;
        }
        dlock__pq.clear(res);
        if (try_once) {
            rc = dlock__err(DLOCK_EBUSY, "semaphore '%s': fewer than %u of its %u permits free",
                            h->name, h->sem->k, h->sem->permits);
            break;
        }
        if (!listening) { /* the first attempt goes without: one round trip uncontended */
            listening = true;
            if ((rc = listen_for_releases(b, h, &r, true))) {
                pc->broken = true;
                break;
            }
            continue;
        }
        if (dlock__pg_notified(pc, false))
            continue; /* a release came while the attempt ran */
        struct pg_conn *one[1] = {pc};
        int woke = dlock__pg_wait_readable(one, 1, w, dlock__now_ms() + recheck);
        if (woke < 0) {
            rc = woke == DLOCK_ECANCELED
                     ? dlock__err(DLOCK_ECANCELED, "semaphore '%s': canceled", h->name)
                     : dlock__err(DLOCK_ETIMEDOUT,
                                  "semaphore '%s': fewer than %u of its %u permits free when "
                                  "the wait ended (%s)",
                                  h->name, h->sem->k, h->sem->permits, b->label);
            break;
        }
        dlock__pg_notified(pc, true);
    }
    if (listening)
        pc->broken = true; /* closed rather than pooled while it listens */
    h->bdata = NULL;
    dlock__pg_session_put(b, pc);
    free(sh);
    free(r.hex);
    return rc;
}

/* ---------------------------------------------------------------- release */

static int pg_sem_release(void *state, struct dlock__hold *h)
{
    struct pg_backend *b = state;
    struct pg_sem_hold *sh = h->bdata;
    h->bdata = NULL;
    if (!sh)
        return dlock__err(DLOCK_ELOST, "semaphore '%s': no session", h->name);
    struct pg_conn *pc = sh->base.pc;
    struct sem_ref r = {0};
    int rc = sem_ref_make(b, h->name, &r);
    char *sql = rc ? NULL
                   : dlock__sprintf("DELETE FROM " PG_PERMITS " WHERE name = decode('%s', 'hex') "
                                    "AND pid = pg_backend_pid(); SELECT pg_notify('%s', ''); "
                                    "SELECT bool_and(pg_advisory_unlock((%" PRId64 ")::int8 + s)) "
                                    "FROM unnest('{%s}'::int4[]) s",
                                    r.hex, r.channel, r.first, sh->slots);
    free(r.hex);
    if (!rc && !sql)
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    pthread_mutex_lock(&pc->mu);
    if (!rc && (!pc->pq || pc->broken))
        rc = dlock__err(DLOCK_ELOST, "semaphore '%s': its session on %s has ended", h->name,
                        b->label);
    if (!rc) {
        char what[300];
        snprintf(what, sizeof what, "release semaphore '%s'", h->name);
        struct pg_query q = {.sql = sql,
                             .what = what,
                             .deadline =
                                 dlock__time_budget(DLOCK__NEVER, b->c->opts.op_timeout_ms)};
        PGresult *res = NULL;
        rc = dlock__pg_exec(b, pc, &q, &res);
        if (rc == DLOCK_ECONN)
            rc = dlock__err(DLOCK_ELOST, "semaphore '%s': its session on %s has ended", h->name,
                            b->label);
        else if (!rc && !(dlock__pq.ntuples(res) == 1 && dlock__pq.getvalue(res, 0, 0)[0] == 't'))
            rc = dlock__err(DLOCK_ELOST,
                            "semaphore '%s': its permits were no longer held by their session "
                            "on %s",
                            h->name, b->label);
        if (res)
            dlock__pq.clear(res);
    }
    if (rc && rc != DLOCK_ELOST)
        pc->broken = true; /* closed: the session, and its permits, end with it */
    pthread_mutex_unlock(&pc->mu);
    free(sql);
    dlock__pg_session_put(b, pc);
    free(sh);
    return rc;
}

/* ---------------------------------------------------------------- inspect */

static int pg_sem_inspect(void *state, const char *name, unsigned permits, struct dlock_info *info)
{
    struct pg_backend *b = state;
    int rc = dlock__pg_ensure(b, &sem_objects, &b->sem_tables);
    struct sem_ref r = {0};
    if (!rc)
        rc = sem_ref_make(b, name, &r);
    if (rc)
        return rc;
    uint64_t first = (uint64_t)r.first;
    char *sql = dlock__sprintf(
        "SELECT c.permits, x.slot, x.pid, x.app, x.token FROM (SELECT (SELECT permits FROM " PG_SEMAPHORES
        " WHERE name = decode('%s', 'hex')) AS permits) c LEFT JOIN (SELECT l.objid::int8 - "
        "%" PRIu64 " AS slot, l.pid, coalesce(a.application_name, '') AS app, coalesce(p.token, "
        "-1) AS token FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid LEFT JOIN " PG_PERMITS
        " p ON p.name = decode('%s', 'hex') AND p.key = (l.classid::int8 << 32 | "
        "l.objid::int8) AND p.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted AND "
        "l.objsubid = 1 AND l.classid::int8 = %" PRIu64 " AND l.objid::int8 BETWEEN %" PRIu64
        " AND %" PRIu64 " AND l.database = (SELECT oid FROM pg_database WHERE datname = "
        "current_database())) x ON true ORDER BY x.pid",
        r.hex, first & 0xffffffffu, r.hex, first >> 32, first & 0xffffffffu,
        (first & 0xffffffffu) + GATE_SLOT - 1);
    free(r.hex);
    if (!sql)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    char what[300];
    snprintf(what, sizeof what, "inspect semaphore '%s'", name);
    PGresult *res = NULL;
    rc = dlock__pg_exec_pooled(b, sql, what, &res);
    free(sql);
    if (rc)
        return rc;
    int rows = dlock__pq.ntuples(res);
    unsigned stored = rows > 0 && !dlock__pq.getisnull(res, 0, 0)
                          ? (unsigned)strtoul(dlock__pq.getvalue(res, 0, 0), NULL, 10)
                          : 0;
    if (stored && permits && stored != permits) {
        rc = wrong_count(b, name, dlock__pq.getvalue(res, 0, 0), permits);
        dlock__pq.clear(res);
        return rc;
    }
    info->permits = stored ? stored : permits;
    info->free_permits = info->permits;
    info->ttl_ms = -1; /* the server's idle timeout, not a deadline it tells */
    for (int i = 0; !rc && i < rows; i++) {
        if (dlock__pq.getisnull(res, i, 1) ||
            strtoul(dlock__pq.getvalue(res, i, 1), NULL, 10) >= info->permits)
            continue;
        const char *app = dlock__pq.getvalue(res, i, 3), *pid = dlock__pq.getvalue(res, i, 2);
        char id[200];
        if (strncmp(app, "dlock ", 6) == 0)
            snprintf(id, sizeof id, "%s/%s", app + 6, pid);
        else
            snprintf(id, sizeof id, "%s%sbackend %s", app, *app ? " " : "", pid);
        long long token = strtoll(dlock__pq.getvalue(res, i, 4), NULL, 10);
        if (token > 0 && (uint64_t)token > info->token)
            info->token = (uint64_t)token;
        info->held = 1;
        info->free_permits--;
        rc = dlock__info_count_holder(info, id); /* a permit object: one session */
    }
    dlock__pq.clear(res);
    return rc;
}

/* The semaphores with a permit held: the rows of dlock_permits whose
 * session holds their key (the rows of sessions gone deleted first). */
static int pg_sem_list(void *state, const char *pattern, dlock_list_fn fn, void *arg)
{
    struct pg_backend *b = state;
    int rc = dlock__pg_ensure(b, &sem_objects, &b->sem_tables);
    if (rc)
        return rc;
    static const char sql[] =
        "DELETE FROM " PG_PERMITS " WHERE pid NOT IN (SELECT pid FROM pg_stat_activity); "
        "SELECT DISTINCT encode(p.name, 'hex') FROM " PG_PERMITS " p JOIN pg_locks l ON "
        "l.locktype = 'advisory' AND l.granted AND l.pid = p.pid AND l.objsubid = 1 AND "
        "(l.classid::int8 << 32 | l.objid::int8) = p.key AND l.database = (SELECT oid FROM "
        "pg_database WHERE datname = current_database())";
    return dlock__pg_list_names(b, sql, "list semaphores", pattern, fn, arg);
}

const struct dlock__sem_ops dlock__pg_sem_ops = {
    .acquire = pg_sem_acquire,
    .release = pg_sem_release,
    .inspect = pg_sem_inspect,
    .list = pg_sem_list,
};
