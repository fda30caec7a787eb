/* conn.c -- the backend's sessions: dialing within a deadline, statements
 * within a deadline that a dlock cancel ends, the pool of idle sessions,
 * and the server's errors as dlock codes.
 *
 * libpq is driven in its asynchronous calls (PQconnectStartParams /
 * PQconnectPoll, PQsendQuery / PQconsumeInput) and this file sleeps in
 * poll() on the session's socket and the wait's cancel descriptor: every
 * statement ends by its deadline, and a wait that sleeps in the server
 * (a blocking pg_advisory_lock) is ended by a cancel through PQcancel --
 * the server answers the statement with query_canceled and the session
 * stays usable; libpq 15's PQcancel blocks with no timeout, so it runs in
 * a thread of its own and a cancel it does not deliver in time closes
 * the session instead. A statement that outlives its deadline leaves its
 * session broken: it is closed (PQfinish), which ends the session on the
 * server and every lock it had.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pg.h"

/* libpq's default notice processor prints to stderr: the warnings of a
 * pg_advisory_unlock of a lock no longer held are answered by its
 * result, so notices are only kept, the last one per session -- a FATAL
 * the server sends while the session is idle (idle_session_timeout,
 * pg_terminate_backend) reaches libpq as a notice and names why the
 * session ended. */
static void keep_notice(void *arg, const char *message)
{
    struct pg_conn *pc = arg;
    snprintf(pc->last_words, sizeof pc->last_words, "%s", message ? message : "");
    pc->last_words[strcspn(pc->last_words, "\n")] = '\0';
}

/* The first line of libpq's or the server's message, without its
 * trailing newline, into BUF. */
static const char *first_line(const char *msg, char *buf, size_t size)
{
    snprintf(buf, size, "%s", msg && *msg ? msg : "no message");
    buf[strcspn(buf, "\n")] = '\0';
    return buf;
}

/* Sleep until FD is ready for EVENTS, W is canceled (unless IGNORE_CANCEL)
 * or DEADLINE passes: DLOCK_OK, DLOCK_ECANCELED, DLOCK_ETIMEDOUT. */
static int wait_fd(struct dlock__wait *w, int fd, short events, int64_t deadline,
                   bool ignore_cancel)
{
    int cancel_fd = -1;
    if (w && !ignore_cancel && dlock__wait_cancel_fd(w, &cancel_fd) == DLOCK_ECANCELED)
        return DLOCK_ECANCELED;
    for (;;) {
        int64_t left = deadline == DLOCK__NEVER ? -1 : deadline - dlock__now_ms();
        if (deadline != DLOCK__NEVER && left <= 0)
            return DLOCK_ETIMEDOUT;
        struct pollfd p[2] = {{.fd = fd, .events = events}, {.fd = cancel_fd, .events = POLLIN}};
        int n = poll(p, cancel_fd >= 0 ? 2 : 1, left > 1000000 ? 1000000 : (int)left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return dlock__errno(DLOCK_EIO, errno, "poll");
        if (cancel_fd >= 0 && p[1].revents)
            return DLOCK_ECANCELED;
        if (n > 0)
            return DLOCK_OK;
    }
}

/* One PQcancel(), in a thread of its own: libpq 15 sends the cancel
 * request on a connection of its own with blocking calls and no timeout,
 * so a server that accepts the connection and then stalls would hold the
 * canceling thread for ever. The thread holds one reference, the caller
 * another; the last one frees. */
struct cancel_call {
    PGcancel *cancel;
    int done[2]; /* a pipe: the thread writes a byte when PQcancel returned */
    atomic_int refs;
    atomic_bool sent; /* PQcancel's answer: the request was delivered */
};

static void cancel_call_drop(struct cancel_call *cc)
{
    if (atomic_fetch_sub(&cc->refs, 1) != 1)
        return;
    dlock__pq.freeCancel(cc->cancel);
    close(cc->done[0]);
    close(cc->done[1]);
    free(cc);
}

static void *cancel_thread(void *arg)
{
    struct cancel_call *cc = arg;
    char err[256];
    atomic_store(&cc->sent, dlock__pq.cancel(cc->cancel, err, sizeof err) == 1);
    ssize_t n;
    do
        n = write(cc->done[1], "", 1);
    while (n < 0 && errno == EINTR);
    cancel_call_drop(cc);
    return NULL;
}

/* Ask the server to end the statement PC runs (PQcancel), giving up at
 * DEADLINE: true when the request was delivered. A PQcancel still
 * blocked then is left to finish in its thread. */
static bool send_cancel(struct pg_conn *pc, int64_t deadline)
{
    struct cancel_call *cc = calloc(1, sizeof *cc);
    if (!cc)
        return false;
    cc->cancel = dlock__pq.getCancel(pc->pq);
    if (!cc->cancel || pipe2(cc->done, O_CLOEXEC) != 0) {
        if (cc->cancel)
            dlock__pq.freeCancel(cc->cancel);
        free(cc);
        return false;
    }
    atomic_init(&cc->refs, 2);
    pthread_attr_t attr;
    pthread_t th;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    bool started = pthread_create(&th, &attr, cancel_thread, cc) == 0;
    pthread_attr_destroy(&attr);
    if (!started)
        atomic_fetch_sub(&cc->refs, 1); /* no thread: the caller's is the last */
    bool sent = false;
    if (started && wait_fd(NULL, cc->done[0], POLLIN, deadline, true) == 0)
        sent = atomic_load(&cc->sent);
    cancel_call_drop(cc);
    return sent;
}

/* The code of a failed dial, from libpq's words. */
static int dial_code(const char *msg)
{
    if (strstr(msg, "password authentication failed") || strstr(msg, "no password supplied") ||
        strstr(msg, "authentication failed") ||
        (strstr(msg, "role \"") && strstr(msg, "does not exist")) ||
        strstr(msg, "no pg_hba.conf entry"))
        return DLOCK_EAUTH;
    if (strstr(msg, "database \"") && strstr(msg, "does not exist"))
        return DLOCK_ENOENT;
    if (strstr(msg, "permission denied"))
        return DLOCK_EACCES;
    return DLOCK_ECONN;
}

static int dial(struct pg_backend *b, struct dlock__wait *w, int64_t deadline, struct pg_conn **out)
{
    PGconn *pq = dlock__pq.connectStartParams(b->keys, (const char *const *)b->values, 0);
    if (!pq)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    int rc = DLOCK_OK;
    PostgresPollingStatusType st = PGRES_POLLING_WRITING;
    if (dlock__pq.status(pq) == CONNECTION_BAD)
        st = PGRES_POLLING_FAILED;
    while (st != PGRES_POLLING_OK && st != PGRES_POLLING_FAILED) {
        rc = wait_fd(w, dlock__pq.socket(pq), st == PGRES_POLLING_READING ? POLLIN : POLLOUT,
                     deadline, false);
        if (rc)
            break;
        st = dlock__pq.connectPoll(pq);
    }
    char line[512];
    if (rc == DLOCK_ETIMEDOUT)
        rc = dlock__err(DLOCK_ECONN, "%s: no connection within the connect timeout", b->label);
    else if (rc == DLOCK_ECANCELED)
        rc = dlock__err(DLOCK_ECANCELED, "%s: canceled while connecting", b->label);
    else if (!rc && st == PGRES_POLLING_FAILED) {
        const char *msg = dlock__pq.errorMessage(pq);
        rc = dlock__err(dial_code(msg), "%s: %s", b->label, first_line(msg, line, sizeof line));
    }
    if (rc) {
        dlock__pq.finish(pq);
        return rc;
    }
    struct pg_conn *pc = calloc(1, sizeof *pc);
    if (!pc) {
        dlock__pq.finish(pq);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    dlock__pq.setNoticeProcessor(pq, keep_notice, pc);
    pc->pq = pq;
    pthread_mutex_init(&pc->mu, NULL);
    pc->idle_timeout_ms = b->c->opts.lease_ms;
    pc->idle_since = dlock__now_ms();
    *out = pc;
    return DLOCK_OK;
}

void dlock__pg_session_close(struct pg_conn *pc)
{
    if (!pc)
        return;
    if (pc->pq)
        dlock__pq.finish(pc->pq);
    pthread_mutex_destroy(&pc->mu);
    free(pc);
}

int dlock__pg_session(struct pg_backend *b, struct dlock__wait *w, int64_t deadline,
                      struct pg_conn **out)
{
    struct pg_conn *stale = NULL;
    *out = NULL;
    pthread_mutex_lock(&b->pool_mu);
    while (b->pool && !*out) {
        struct pg_conn *pc = b->pool;
        b->pool = pc->next;
        b->npool--;
        pc->next = NULL;
        /* a session idle for half its idle_session_timeout may be ended
         * by the server before it answers: a fresh one instead */
        if (dlock__now_ms() - pc->idle_since >= pc->idle_timeout_ms / 2) {
            pc->next = stale;
            stale = pc;
        } else {
            *out = pc;
        }
    }
    pthread_mutex_unlock(&b->pool_mu);
    while (stale) {
        struct pg_conn *next = stale->next;
        dlock__pg_session_close(stale);
        stale = next;
    }
    return *out ? DLOCK_OK : dial(b, w, deadline, out);
}

void dlock__pg_session_put(struct pg_backend *b, struct pg_conn *pc)
{
    if (!pc)
        return;
    if (pc->broken || !pc->pq || dlock__pq.status(pc->pq) != CONNECTION_OK) {
        dlock__pg_session_close(pc);
        return;
    }
    pthread_mutex_lock(&b->pool_mu);
    if (b->npool < PG_POOL_MAX) {
        pc->next = b->pool;
        b->pool = pc;
        b->npool++;
        pc = NULL;
    }
    pthread_mutex_unlock(&b->pool_mu);
    dlock__pg_session_close(pc);
}

void dlock__pg_pool_drain(struct pg_backend *b)
{
    pthread_mutex_lock(&b->pool_mu);
    struct pg_conn *pc = b->pool;
    b->pool = NULL;
    b->npool = 0;
    pthread_mutex_unlock(&b->pool_mu);
    while (pc) {
        struct pg_conn *next = pc->next;
        dlock__pg_session_close(pc);
        pc = next;
    }
}

/* The code of a server error by its SQLSTATE (docs/protocol-postgres.md). */
static int sqlstate_code(const char *state, bool cancel_sent)
{
    if (!state)
        return DLOCK_EBACKEND;
    if (strcmp(state, "57014") == 0) /* query_canceled */
        return cancel_sent ? DLOCK_ECANCELED : DLOCK_ETIMEDOUT;
    if (strcmp(state, "55P03") == 0) /* lock_not_available: lock_timeout */
        return DLOCK_ETIMEDOUT;
    if (strcmp(state, "42501") == 0) /* insufficient_privilege */
        return DLOCK_EACCES;
    if (strncmp(state, "28", 2) == 0) /* invalid authorization */
        return DLOCK_EAUTH;
    if (strcmp(state, "3D000") == 0) /* invalid_catalog_name */
        return DLOCK_ENOENT;
    if (strcmp(state, "25006") == 0) /* read_only_sql_transaction: a standby */
        return DLOCK_EUNAVAIL;
    if (strncmp(state, "57P", 3) == 0 || strncmp(state, "08", 2) == 0) /* shutdown, gone */
        return DLOCK_ECONN;
    return DLOCK_EBACKEND;
}

int dlock__pg_send(struct pg_backend *b, struct pg_conn *pc, const struct pg_query *q)
{
    char line[512];
    if (!dlock__pq.sendQuery(pc->pq, q->sql)) {
        pc->broken = true;
        return dlock__err(DLOCK_ECONN, "%s: %s: %s", b->label, q->what,
                          first_line(dlock__pq.errorMessage(pc->pq), line, sizeof line));
    }
    return DLOCK_OK;
}

int dlock__pg_finish(struct pg_backend *b, struct pg_conn *pc, const struct pg_query *q,
                     PGresult **out)
{
    char line[512];
    PGresult *last = NULL, *failed = NULL;
    bool cancel_sent = false;
    int64_t deadline = q->deadline;
    int rc = DLOCK_OK;
    *out = NULL;
    pc->sqlstate[0] = '\0';
    /* what libpq already read is parsed first, then the socket is
     * polled before it is read: no read that would block (EAGAIN) */
    for (bool polled = false;; polled = true) {
        if (polled && !dlock__pq.consumeInput(pc->pq)) {
            pc->broken = true;
            rc = dlock__err(DLOCK_ECONN, "%s: %s: %s", b->label, q->what,
                            first_line(dlock__pq.errorMessage(pc->pq), line, sizeof line));
            break;
        }
        bool done = false;
        while (!dlock__pq.isBusy(pc->pq)) {
            PGresult *r = dlock__pq.getResult(pc->pq);
            if (!r) {
                done = true;
                break;
            }
            ExecStatusType st = dlock__pq.resultStatus(r);
            if ((st == PGRES_FATAL_ERROR || st == PGRES_BAD_RESPONSE) && !failed) {
                failed = r;
                continue;
            }
            if (last)
                dlock__pq.clear(last);
            last = r;
        }
        if (done)
            break;
        rc = wait_fd(q->w, dlock__pq.socket(pc->pq), POLLIN, deadline, cancel_sent);
        if (rc == DLOCK_ECANCELED) {
            /* the server ends the statement and answers query_canceled:
             * the request and that answer get the op timeout (within the
             * statement's own deadline) */
            deadline = dlock__time_budget(q->deadline, b->c->opts.op_timeout_ms);
            cancel_sent = true;
            if (send_cancel(pc, deadline))
                continue;
            pc->broken = true; /* closing it ends the wait in the server */
            rc = dlock__err(DLOCK_ECANCELED,
                            "%s: %s: canceled (the cancel request got no answer: "
                            "the session is closed instead)",
                            b->label, q->what);
            break;
        }
        if (rc == DLOCK_ETIMEDOUT) {
            pc->broken = true;
            rc = cancel_sent ? dlock__err(DLOCK_ECANCELED,
                                          "%s: %s: canceled (no answer to the cancel within the "
                                          "op timeout: the session is closed instead)",
                                          b->label, q->what)
                             : dlock__err(DLOCK_ETIMEDOUT, "%s: %s: no answer within the timeout",
                                          b->label, q->what);
            break;
        }
        if (rc) {
            pc->broken = true;
            break;
        }
    }
    pc->idle_since = dlock__now_ms();
    if (!rc && failed) {
        const char *state = dlock__pq.resultErrorField(failed, PG_DIAG_SQLSTATE);
        const char *msg = dlock__pq.resultErrorField(failed, PG_DIAG_MESSAGE_PRIMARY);
        if (!msg)
            msg = dlock__pq.resultErrorMessage(failed);
        int code = sqlstate_code(state, cancel_sent);
        snprintf(pc->sqlstate, sizeof pc->sqlstate, "%s", state ? state : "");
        if (dlock__pq.status(pc->pq) != CONNECTION_OK) {
            pc->broken = true;
            code = DLOCK_ECONN;
        }
        rc = dlock__err(code, "%s: %s: %s (SQLSTATE %s)", b->label, q->what,
                        first_line(msg, line, sizeof line), state ? state : "none");
    } else if (!rc && !last) {
        rc = dlock__err(DLOCK_EPROTO, "%s: %s: no result", b->label, q->what);
    } else if (!rc && cancel_sent) {
        /* done before the cancel reached it: the caller undoes it */
        rc = DLOCK_OK;
    }
    if (failed)
        dlock__pq.clear(failed);
    if (rc) {
        if (last)
            dlock__pq.clear(last);
        return rc;
    }
    *out = last;
    return cancel_sent ? DLOCK_ECANCELED : DLOCK_OK;
}

int dlock__pg_exec(struct pg_backend *b, struct pg_conn *pc, const struct pg_query *q,
                   PGresult **out)
{
    int rc = dlock__pg_send(b, pc, q);
    return rc ? rc : dlock__pg_finish(b, pc, q, out);
}

int dlock__pg_exec_pooled(struct pg_backend *b, const char *sql, const char *what, PGresult **out)
{
    int64_t deadline = dlock__time_budget(DLOCK__NEVER, b->c->opts.op_timeout_ms);
    struct pg_conn *pc = NULL;
    int rc = dlock__pg_session(b, NULL, deadline, &pc);
    if (rc)
        return rc;
    struct pg_query q = {.sql = sql, .what = what, .deadline = deadline};
    rc = dlock__pg_exec(b, pc, &q, out);
    dlock__pg_session_put(b, pc);
    return rc;
}
