/* election.c -- leader election on PostgreSQL: the election's lock, a
 * watch key, and a row the leader writes.
 *
 * Election NAME is lock NAME's advisory key E (key.c; an election and a
 * lock of one name exclude each other, as on the file and etcd
 * backends): whoever holds E leads, on a session of its own that the
 * campaign pins, with the locks' lease, pings and lost holds. The leader
 * also holds W, a key of the name's own (FNV-1a of the full name, a NUL
 * and "leader"), and writes its token, a version and its value into its
 * row of dlock_leaders -- all in the statement that takes E, so W and the
 * row come with the lead, and they are written only through the leader's
 * own session: a statement runs there only while the session, and so the
 * lead, lives (value.c's argument). Proclaim updates the row where it
 * is still the leader's (its pid and token); resign deletes it and
 * unlocks E and W.
 *
 * Observers push, never poll: an observer LISTENs on the election's
 * channel before it looks, and every campaign, proclaim and resign
 * NOTIFYs it in its own transaction. A leader whose session ends
 * (killed, frozen past its lease, terminated) sends nothing: for that,
 * while a dlock leader holds W, the observer keeps a second session
 * waiting in pg_advisory_xact_lock_shared(W), which the server grants
 * the moment the leader's session ends (and the transaction gives back
 * at once, so the next leader waits for nobody). Only a holder of E that
 * is no dlock campaign (an application's own pg_advisory_lock of the
 * number) has no W and no NOTIFY: observers look again every 5 s, the
 * safety re-check. docs/protocol-postgres.md tells the whole story.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pg.h"

#define PG_LEADERS "dlock_leaders"
#define OBSERVE_SAFETY_MS 5000

static const struct pg_objects elect_objects = {
    .what = "elections",
    .names = PG_LEADERS,
    .look = "SELECT to_regclass('" PG_LEADERS "') IS NOT NULL",
    .create = "CREATE UNLOGGED TABLE IF NOT EXISTS " PG_LEADERS " (name bytea PRIMARY KEY, token "
              "int8 NOT NULL, version int8 NOT NULL, pid int4 NOT NULL, value bytea NOT NULL)",
};

/* Election NAME as the server knows it. */
struct elect_ref {
    char *hex;       /* the full name's bytes in hex */
    struct pg_key e; /* the lead: lock NAME's key */
    int64_t watch;   /* W */
    char channel[PG_CHANNEL_MAX];
};

static int elect_ref_make(struct pg_backend *b, const char *name, struct elect_ref *r)
{
    char *full = dlock__pg_full_name(b, name);
    r->hex = full ? dlock__pg_hex(full) : NULL;
    if (!r->hex) {
        free(full);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    dlock__pg_key_of(b, full, &r->e);
    r->watch = (int64_t)dlock__pg_tagged_hash(full, "leader");
    free(full);
    dlock__pg_channel("elect", (uint64_t)r->watch, r->channel);
    return DLOCK_OK;
}

/* One statement on hold H's pinned session within the op timeout. */
static int on_session(struct pg_backend *b, struct dlock__hold *h, const char *sql,
                      const char *what, PGresult **res)
{
    struct pg_hold *hb = h->bdata;
    if (!hb || !hb->pc->pq || hb->pc->broken)
        return dlock__err(DLOCK_ELOST, "election '%s': its session on %s has ended", h->name,
                          b->label);
    struct pg_query q = {.sql = sql,
                         .what = what,
                         .deadline = dlock__time_budget(DLOCK__NEVER, b->c->opts.op_timeout_ms)};
    pthread_mutex_lock(&hb->pc->mu);
    int rc = dlock__pg_exec(b, hb->pc, &q, res);
    pthread_mutex_unlock(&hb->pc->mu);
    if (rc == DLOCK_ECONN)
        return dlock__err(DLOCK_ELOST, "election '%s': its session on %s has ended", h->name,
                          b->label);
    return rc;
}

/* ---------------------------------------------------------------- campaign */

static int pg_elect_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
{
    struct pg_backend *b = state;
    dlock_client *c = b->c;
    int rc = dlock__pg_ensure(b, &elect_objects, &b->elect_tables);
    struct elect_ref r = {0};
    if (!rc)
        rc = elect_ref_make(b, h->name, &r);
    if (rc)
        return rc;
    const char *value = h->elect->value ? h->elect->value : "";
    char *vhex = dlock__pg_hex(value);
    struct pg_hold *hb = calloc(1, sizeof *hb);
    bool try_once = dlock__wait_try_once(w);
    int64_t wait_deadline = dlock__wait_deadline(w);
    if (!vhex || !hb) {
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
        goto out;
    }
    hb->key = r.e;
    rc = dlock__pg_session(b, w,
                           dlock__time_budget(try_once ? 0 : wait_deadline,
                                              c->opts.connect_timeout_ms),
                           &hb->pc);
    if (rc)
        goto out;
    struct pg_conn *pc = hb->pc;
    /* the lock timeout is what is left of the wait once connected */
    int64_t lock_timeout = 0;
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
    snprintf(prelude + pl, sizeof prelude - pl, "SET lock_timeout = %lld; ",
             (long long)(try_once ? 0 : lock_timeout));
    /* E, then W (its argument depends on the token, so it is taken
     * after E), the row and the notification, in one transaction */
    char *sql = dlock__sprintf(
        "%sWITH l AS MATERIALIZED (SELECT nextval('" PG_SEQUENCE "') AS t FROM %s(%s) AS got%s), "
        "w AS MATERIALIZED (SELECT t, pg_advisory_lock((%" PRId64 ")::int8 + 0 * t)::text AS gw "
        "FROM l), "
        "r AS (INSERT INTO " PG_LEADERS " SELECT decode('%s', 'hex'), t, 1, pg_backend_pid(), "
        "decode('%s', 'hex') FROM w ON CONFLICT (name) DO UPDATE SET token = excluded.token, "
        "version = " PG_LEADERS ".version + 1, pid = excluded.pid, value = excluded.value "
        "RETURNING token) "
        "SELECT token, pg_notify('%s', '') FROM r",
        prelude, try_once ? "pg_try_advisory_lock" : "pg_advisory_lock", r.e.args,
        try_once ? " WHERE got" : "", r.watch, r.hex, vhex, r.channel);
    if (!sql) {
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
        goto out;
    }
    char what[300];
    snprintf(what, sizeof what, "campaign in election '%s'", h->name);
    int64_t deadline = try_once ? dlock__time_budget(0, c->opts.op_timeout_ms)
                       : wait_deadline == DLOCK__NEVER ? DLOCK__NEVER
                                                       : wait_deadline + c->opts.op_timeout_ms;
    struct pg_query q = {.sql = sql, .what = what, .w = try_once ? NULL : w, .deadline = deadline};
    int64_t sent = dlock__now_ms();
    PGresult *res = NULL;
    rc = dlock__pg_exec(b, pc, &q, &res);
    free(sql);
    /* E may be held after any failure (W's wait, the INSERT): the
     * session is closed, which ends whatever it took */
    if (rc == DLOCK_ECANCELED) {
        rc = dlock__err(DLOCK_ECANCELED, "election '%s': campaign canceled", h->name);
    } else if (rc == DLOCK_ETIMEDOUT && strcmp(pc->sqlstate, "55P03") == 0) {
        rc = dlock__err(DLOCK_ETIMEDOUT,
                        "election '%s' still led by another session when the "
                        "wait ended (%s)",
                        h->name, b->label);
    } else if (!rc && dlock__pq.ntuples(res) != 1) {
        rc = try_once ? dlock__err(DLOCK_EBUSY, "election '%s' is led by another session", h->name)
                      : dlock__err(DLOCK_EPROTO, "%s: %s: no row", b->label, what);
        if (try_once) {
            dlock__pq.clear(res);
            res = NULL;
            dlock__pg_session_put(b, pc);
            hb->pc = NULL;
            goto out;
        }
    }
    if (rc) {
        if (res)
            dlock__pq.clear(res);
        pc->broken = true;
        dlock__pg_session_put(b, pc);
        hb->pc = NULL;
        goto out;
    }
    h->token = strtoull(dlock__pq.getvalue(res, 0, 0), NULL, 10);
    dlock__pq.clear(res);
    pc->idle_timeout_ms = h->lease_ms;
    h->bdata = hb;
    /* after a long wait the grant may have sat unread while the server
     * ended the session: a ping confirms it (lock.c's confirm_grant) */
    if (!try_once && h->lease_ms > 0 && dlock__now_ms() - sent > h->lease_ms / 3) {
        sent = dlock__now_ms();
        res = NULL;
        rc = on_session(b, h, "SELECT 1", what, &res);
        if (res)
            dlock__pq.clear(res);
        if (rc) {
            rc = dlock__err(DLOCK_ECONN,
                            "election '%s' was won, but its session on %s ended before the lead "
                            "was confirmed",
                            h->name, b->label);
            h->bdata = NULL;
            pc->broken = true;
            dlock__pg_session_put(b, pc);
            hb->pc = NULL;
            goto out;
        }
    }
    snprintf(h->owner, sizeof h->owner, "%s/%d", b->ident + 6, dlock__pq.backendPID(pc->pq));
    dlock__hold_confirmed(c, h, sent);
    hb = NULL;
out:
    free(hb);
    free(vhex);
    free(r.hex);
    return rc;
}

/* ---------------------------------------------------------------- resign */

static int pg_elect_release(void *state, struct dlock__hold *h)
{
    struct pg_backend *b = state;
    struct pg_hold *hb = h->bdata;
    if (!hb)
        return dlock__err(DLOCK_ELOST, "election '%s': no session", h->name);
    struct elect_ref r = {0};
    int rc = elect_ref_make(b, h->name, &r);
    char *sql = rc ? NULL
                   : dlock__sprintf("DELETE FROM " PG_LEADERS " WHERE name = decode('%s', 'hex') "
                                    "AND pid = pg_backend_pid() AND token = %" PRIu64 "; "
                                    "SELECT pg_notify('%s', ''); "
                                    "SELECT pg_advisory_unlock(%s), pg_advisory_unlock((%" PRId64
                                    ")::int8)",
                                    r.hex, h->token, r.channel, hb->key.args, r.watch);
    free(r.hex);
    if (!rc && !sql)
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    PGresult *res = NULL;
    char what[300];
    snprintf(what, sizeof what, "resign from election '%s'", h->name);
    if (!rc)
        rc = on_session(b, h, sql, what, &res);
    free(sql);
    if (!rc && !(dlock__pq.ntuples(res) == 1 && dlock__pq.getvalue(res, 0, 0)[0] == 't'))
        rc = dlock__err(DLOCK_ELOST, "election '%s' was no longer led by its session on %s",
                        h->name, b->label);
    if (res)
        dlock__pq.clear(res);
    h->bdata = NULL;
    if (rc && rc != DLOCK_ELOST)
        hb->pc->broken = true; /* closed: the session, and the lead, end with it */
    dlock__pg_session_put(b, hb->pc);
    free(hb);
    return rc;
}

/* ---------------------------------------------------------------- proclaim */

static int pg_elect_proclaim(void *state, struct dlock__hold *h, const char *value)
{
    struct pg_backend *b = state;
    struct elect_ref r = {0};
    int rc = elect_ref_make(b, h->name, &r);
    if (rc)
        return rc;
    char *vhex = dlock__pg_hex(value);
    char *sql = vhex ? dlock__sprintf("SELECT pg_notify('%s', ''); UPDATE " PG_LEADERS
                                      " SET value = decode('%s', 'hex'), version = version + 1 "
                                      "WHERE name = decode('%s', 'hex') AND pid = pg_backend_pid() "
                                      "AND token = %" PRIu64 " RETURNING version",
                                      r.channel, vhex, r.hex, h->token)
                     : NULL;
    free(vhex);
    free(r.hex);
    if (!sql)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    char what[300];
    snprintf(what, sizeof what, "proclaim in election '%s'", h->name);
    PGresult *res = NULL;
    rc = on_session(b, h, sql, what, &res);
    free(sql);
    if (!rc && dlock__pq.ntuples(res) != 1) {
        char why[600];
        snprintf(why, sizeof why, "%s: the row of election '%s' is no longer this leader's",
                 b->label, h->name);
        dlock__hold_lost(b->c, h, why);
        rc = dlock__err(DLOCK_ELOST, "election '%s': leadership was lost: %s", h->name, why);
    }
    if (res)
        dlock__pq.clear(res);
    return rc;
}

/* ---------------------------------------------------------------- observe */

/* What one look saw. */
struct look {
    bool consistent;   /* false: a dlock campaign holds E but its row is not written yet */
    bool dlock_leader; /* the leader is a dlock campaign: it holds W */
};

/* Read election R's leader on session PC into OUT. */
static int look_once(struct pg_backend *b, struct pg_conn *pc, const char *name,
                     const struct elect_ref *r, struct dlock_leader *out, struct look *seen)
{
    char where[512];
    dlock__pg_key_where(&r->e, where, sizeof where);
    char *sql = dlock__sprintf(
        "SELECT l.pid, coalesce(a.application_name, ''), e.pid, e.token, e.version, "
        "encode(e.value, 'hex') FROM (SELECT 1) one LEFT JOIN pg_locks l ON %s AND l.granted AND "
        "l.mode = 'ExclusiveLock' LEFT JOIN pg_stat_activity a ON a.pid = l.pid LEFT JOIN " PG_LEADERS
        " e ON e.name = decode('%s', 'hex') LIMIT 1",
        where, r->hex);
    if (!sql)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    char what[300];
    snprintf(what, sizeof what, "leader of election '%s'", name);
    struct pg_query q = {.sql = sql,
                         .what = what,
                         .deadline = dlock__time_budget(DLOCK__NEVER, b->c->opts.op_timeout_ms)};
    PGresult *res = NULL;
    int rc = dlock__pg_exec(b, pc, &q, &res);
    free(sql);
    if (rc)
        return rc;
    free(out->value);
    memset(out, 0, sizeof *out);
    memset(seen, 0, sizeof *seen);
    seen->consistent = true;
    if (dlock__pq.ntuples(res) == 1 && !dlock__pq.getisnull(res, 0, 0)) {
        const char *pid = dlock__pq.getvalue(res, 0, 0), *app = dlock__pq.getvalue(res, 0, 1);
        bool ours = strncmp(app, "dlock ", 6) == 0;
        out->held = true;
        if (ours)
            snprintf(out->id, sizeof out->id, "%s/%s", app + 6, pid);
        else
            snprintf(out->id, sizeof out->id, "%s%sbackend %s", app, *app ? " " : "", pid);
        if (!dlock__pq.getisnull(res, 0, 2) && strcmp(dlock__pq.getvalue(res, 0, 2), pid) == 0) {
            seen->dlock_leader = true;
            out->token = strtoull(dlock__pq.getvalue(res, 0, 3), NULL, 10);
            out->version = strtoull(dlock__pq.getvalue(res, 0, 4), NULL, 10);
            const char *text = dlock__pq.getvalue(res, 0, 5);
            size_t len = strlen(text) / 2;
            out->value = malloc(len + 1);
            for (size_t i = 0; out->value && i < len; i++)
                out->value[i] =
                    (char)(dlock__hexval(text[2 * i]) << 4 | dlock__hexval(text[2 * i + 1]));
            if (out->value)
                out->value[len] = '\0';
            else
                rc = dlock__err(DLOCK_ENOMEM, "out of memory");
        } else if (ours) {
            seen->consistent = false; /* won, its row not committed yet */
        }
    }
    dlock__pq.clear(res);
    return rc;
}

/* An observer's two sessions: LISTEN on one, the wait for W on the other. */
struct observer {
    struct pg_backend *b;
    struct pg_conn *listen; /* LISTENs on the channel */
    struct pg_conn *watch;  /* NULL, or waiting in pg_advisory_xact_lock_shared(W) */
    bool watching;          /* WATCH has that statement outstanding */
};

static void observer_close(struct observer *o)
{
    if (o->listen)
        o->listen->broken = true; /* not pooled while it listens */
    dlock__pg_session_put(o->b, o->listen);
    if (o->watch && o->watching)
        o->watch->broken = true;
    dlock__pg_session_put(o->b, o->watch);
    o->listen = o->watch = NULL;
    o->watching = false;
}

/* A session that listens on R's channel, with no idle timeout (it idles
 * for as long as the observer waits; it holds nothing). */
static int observer_listen(struct observer *o, const char *name, const struct elect_ref *r,
                           struct dlock__wait *w)
{
    struct pg_backend *b = o->b;
    int rc =
        dlock__pg_session(b, w, dlock__time_budget(DLOCK__NEVER, b->c->opts.connect_timeout_ms),
                          &o->listen);
    if (rc)
        return rc;
    char sql[120], what[300];
    snprintf(sql, sizeof sql, "SET idle_session_timeout = 0; LISTEN \"%s\"", r->channel);
    snprintf(what, sizeof what, "observe election '%s' (listen)", name);
    struct pg_query q = {.sql = sql,
                         .what = what,
                         .deadline = dlock__time_budget(DLOCK__NEVER, b->c->opts.op_timeout_ms)};
    PGresult *res = NULL;
    rc = dlock__pg_exec(b, o->listen, &q, &res);
    if (res)
        dlock__pq.clear(res);
    return rc;
}

/* Send the wait for W (granted when the leader's session ends) on the
 * observer's second session. */
static int observer_watch(struct observer *o, const char *name, const struct elect_ref *r,
                          struct dlock__wait *w)
{
    struct pg_backend *b = o->b;
    int rc =
        o->watch
            ? DLOCK_OK
            : dlock__pg_session(b, w,
                                dlock__time_budget(DLOCK__NEVER, b->c->opts.connect_timeout_ms),
                                &o->watch);
    if (rc)
        return rc;
    char sql[160], what[300];
    snprintf(sql, sizeof sql,
             "SET idle_session_timeout = 0; SET lock_timeout = 0; SELECT "
             "pg_advisory_xact_lock_shared((%" PRId64 ")::int8)",
             r->watch);
    snprintf(what, sizeof what, "observe election '%s' (watch)", name);
    struct pg_query q = {.sql = sql, .what = what, .deadline = DLOCK__NEVER};
    rc = dlock__pg_send(b, o->watch, &q);
    o->watching = !rc;
    return rc;
}

/* The watch's statement answered: read its answer (the leader's session
 * ended, or a failure the next look will meet too). */
static void observer_watch_done(struct observer *o)
{
    struct pg_query q = {.sql = "",
                         .what = "observe (watch)",
                         .deadline = dlock__time_budget(DLOCK__NEVER, o->b->c->opts.op_timeout_ms)};
    PGresult *res = NULL;
    if (dlock__pg_finish(o->b, o->watch, &q, &res))
        o->watch->broken = true;
    if (res)
        dlock__pq.clear(res);
    o->watching = false;
    if (o->watch->broken) {
        dlock__pg_session_put(o->b, o->watch);
        o->watch = NULL;
    }
}

static int pg_elect_observe(void *state, const char *name, const struct dlock_leader *known,
                            struct dlock__wait *w, struct dlock_leader *out)
{
    struct pg_backend *b = state;
    int rc = dlock__pg_ensure(b, &elect_objects, &b->elect_tables);
    struct elect_ref r = {0};
    if (!rc)
        rc = elect_ref_make(b, name, &r);
    if (rc)
        return rc;
    struct observer o = {.b = b};
    struct dlock__backoff backoff = DLOCK__OBSERVE_BACKOFF;
    bool watch_useless = false; /* W came free while the same leader led: not a dlock W */
    uint64_t watched_token = 0;
    for (;;) {
        struct look seen = {0};
        rc = o.listen ? DLOCK_OK : observer_listen(&o, name, &r, w);
        if (!rc)
            rc = look_once(b, o.listen, name, &r, out, &seen);
        if (rc) {
            observer_close(&o);
            if (dlock__observe_retry(known, w, &backoff, &rc))
                continue; /* a server restarting: a new session, and look again */
            break;
        }
        if (dlock__observe_done(known, out, seen.consistent, w, &rc))
            break;
        if (seen.dlock_leader && !o.watching && !watch_useless &&
            (rc = observer_watch(&o, name, &r, w))) {
            observer_close(&o);
            if (dlock__observe_retry(known, w, &backoff, &rc))
                continue;
            break;
        }
        watched_token = seen.dlock_leader ? out->token : 0;
        if (dlock__pg_notified(o.listen, false))
            continue; /* a change came while the look ran */
        struct pg_conn *both[2] = {o.listen, o.watch};
        int woke = dlock__pg_wait_readable(both, o.watching ? 2 : 1, w,
                                           dlock__now_ms() + OBSERVE_SAFETY_MS);
        if (woke == DLOCK_ETIMEDOUT || woke == DLOCK_ECANCELED) {
            rc = dlock__err(woke, "election '%s': %s", name,
                            woke == DLOCK_ECANCELED ? "observing canceled" : "no change in time");
            break;
        }
        if (woke == 0) {
            dlock__pg_notified(o.listen, true);
        } else if (woke == 1 && o.watching) {
            observer_watch_done(&o);
            /* granted while the leader it watched still leads: W is not
             * that leader's (a foreign holder); notifications only */
            struct look again = {0};
            if (!look_once(b, o.listen, name, &r, out, &again) && again.dlock_leader &&
                out->token == watched_token)
                watch_useless = true;
        }
    }
    observer_close(&o);
    free(r.hex);
    return rc;
}

const struct dlock__elect_ops dlock__pg_elect_ops = {
    .acquire = pg_elect_acquire,
    .release = pg_elect_release,
    .proclaim = pg_elect_proclaim,
    .observe = pg_elect_observe,
};
