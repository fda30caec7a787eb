/* conn.c -- the MySQL/MariaDB backend's sessions: dialing, one statement
 * at a time within a deadline and a cancel, the pool of idle sessions,
 * and the errors the server and the client library give, as dlock codes.
 *
 * Every call into libmariadb that talks to the server is its
 * non-blocking form, driven here by poll() on the session's socket, the
 * wait's cancel eventfd and the request's deadline: a stalled server
 * costs a request its deadline, never more, and a cancel reaches a wait
 * that sleeps in the server (GET_LOCK) at once -- it is ended from
 * another session with KILL QUERY, and its reply read. A session left
 * mid-request is shut down, never reused: the server ends it, and frees
 * its locks, when it notices.
 */
#include <errmsg.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <mysqld_error.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "mysql.h"

#define POOL_MAX 8
/* ER_CONNECTION_KILLED: the session was ended while we spoke to it */
#define MY_CONNECTION_KILLED 1927

/* The dlock code of server or client error E. */
static int code_of(unsigned e)
{
    switch (e) {
    case ER_ACCESS_DENIED_ERROR:
    case 1698: /* ER_ACCESS_DENIED_NO_PASSWORD_ERROR */ return DLOCK_EAUTH;
    case ER_BAD_DB_ERROR: return DLOCK_ENOENT;
    case ER_DBACCESS_DENIED_ERROR:
    case ER_TABLEACCESS_DENIED_ERROR:
    case ER_KILL_DENIED_ERROR:
    case ER_SPECIFIC_ACCESS_DENIED_ERROR: return DLOCK_EACCES;
    case ER_SERVER_SHUTDOWN:
    case MY_CONNECTION_KILLED: return DLOCK_ECONN;
    default: return e >= CR_MIN_ERROR && e <= CR_MAX_ERROR ? DLOCK_ECONN : DLOCK_EBACKEND;
    }
}

/* Whether error E leaves the session unusable. */
static bool breaks(unsigned e)
{
    return code_of(e) == DLOCK_ECONN;
}

int dlock__my_fail(struct my_backend *s, struct my_conn *k, const char *what)
{
    unsigned e = mysql_errno(k->db);
    char words[512];
    dlock__escape_text(words, sizeof words, mysql_error(k->db));
    if (e == ER_BAD_DB_ERROR)
        return dlock__err(DLOCK_ENOENT, "%s: %s: database '%s' does not exist (%s)", s->label, what,
                          s->db, words);
    if (code_of(e) == DLOCK_EAUTH)
        return dlock__err(DLOCK_EAUTH, "%s: %s: the server refused user '%s': %s", s->label, what,
                          s->user ? s->user : "(the login name)", words);
    return dlock__err(code_of(e), "%s: %s: %s (error %u)", s->label, what, words, e);
}

/* End the statement session K runs, from another session (a cancel). */
static void kill_query(struct my_backend *s, const struct my_conn *k)
{
    char sql[64], msg[DLOCK__MSG_MAX];
    snprintf(sql, sizeof sql, "KILL QUERY %lu", k->id);
    dlock__errmsg_save(msg);
    if (dlock__my_query_pooled(s, sql, NULL, "cancel a wait (KILL QUERY)"))
        dlock__log(s->c, DLOCK_LOG_WARN, "%s", dlock_errmsg());
    dlock__errmsg_restore(DLOCK_OK, msg);
}

/* Wait for what libmariadb asked (STATUS, MYSQL_WAIT_* bits) within IO:
 * the status to go on with, or DLOCK_ETIMEDOUT at IO's deadline (what is
 * already there is still taken then: the renewals of a batch are read
 * one after another, each by its deadline). A cancel kills the statement
 * and gives its reply the op timeout. */
static int io_wait(struct my_backend *s, struct my_conn *k, int status, struct my_io *io)
{
    int fd = mysql_get_socket(k->db);
    short ev = (short)((status & MYSQL_WAIT_READ ? POLLIN : 0) |
                       (status & MYSQL_WAIT_WRITE ? POLLOUT : 0) |
                       (status & MYSQL_WAIT_EXCEPT ? POLLPRI : 0));
    int64_t lib_until = status & MYSQL_WAIT_TIMEOUT
                            ? dlock__now_ms() + mysql_get_timeout_value_ms(k->db)
                            : DLOCK__NEVER;
    for (;;) {
        int64_t now = dlock__now_ms();
        if (lib_until <= now && lib_until < io->deadline)
            return MYSQL_WAIT_TIMEOUT;
        int64_t until = io->deadline < lib_until ? io->deadline : lib_until;
        int64_t ms = until == DLOCK__NEVER ? -1 : until > now ? until - now : 0;
        struct pollfd p[2] = {{fd, ev, 0}, {io->cancel_fd, POLLIN, 0}};
        int n = poll(p, io->cancel_fd >= 0 ? 2 : 1, ms > INT_MAX ? INT_MAX : (int)ms);
        if (n < 0 && errno != EINTR)
            return dlock__errno(DLOCK_EIO, errno, "%s: poll", s->label);
        if (n == 0 && io->deadline <= dlock__now_ms())
            return DLOCK_ETIMEDOUT;
        if (n <= 0)
            continue;
        if (io->cancel_fd >= 0 && p[1].revents) {
            io->cancel_fd = -1;
            io->canceled = true;
            kill_query(s, k);
            io->deadline = dlock__now_ms() + s->c->opts.op_timeout_ms;
            continue;
        }
        if (!p[0].revents)
            continue;
        if (p[0].revents & (POLLHUP | POLLERR | POLLNVAL))
            return status & (MYSQL_WAIT_READ | MYSQL_WAIT_WRITE);
        return (p[0].revents & POLLIN ? MYSQL_WAIT_READ : 0) |
               (p[0].revents & POLLOUT ? MYSQL_WAIT_WRITE : 0) |
               (p[0].revents & POLLPRI ? MYSQL_WAIT_EXCEPT : 0);
    }
}

/* Drive a _start/_cont pair to its end: STATUS is what _start returned,
 * CONT the call that goes on with the ready status `r_`. 0, or
 * io_wait()'s failure. */
#define DRIVE(s, k, io, status, cont)                           \
    ({                                                          \
        int st_ = (status), r_ = 0;                             \
        while (st_ && (r_ = io_wait((s), (k), st_, (io))) >= 0) \
            st_ = (cont);                                       \
        r_ < 0 ? r_ : 0;                                        \
    })

void dlock__my_conn_close(struct my_conn *k)
{
    if (!k)
        return;
    if (k->db) {
        int fd = mysql_get_socket(k->db);
        if (fd >= 0)
            shutdown(fd, SHUT_RDWR); /* so mysql_close() sends nothing that could block */
        mysql_close(k->db);
    }
    free(k);
}

static int timed_out(struct my_backend *s, const char *what)
{
    return dlock__err(DLOCK_ETIMEDOUT, "%s: %s: no reply in time", s->label, what);
}

int dlock__my_send(struct my_backend *s, struct my_conn *k, const char *sql, struct my_io *io,
                   struct my_sent *out)
{
    out->err = 0;
    out->status = mysql_real_query_start(&out->err, k->db, sql, strlen(sql));
    int r = 0;
    while ((out->status & MYSQL_WAIT_WRITE) && (r = io_wait(s, k, out->status, io)) >= 0)
        out->status = mysql_real_query_cont(&out->err, k->db, r);
    return r < 0 ? r : DLOCK_OK;
}

int dlock__my_finish(struct my_backend *s, struct my_conn *k, struct my_sent *sent,
                     struct my_io *io, MYSQL_RES **res, bool *broken, const char *what)
{
    *broken = false;
    if (res)
        *res = NULL;
    int rc = DRIVE(s, k, io, sent->status, mysql_real_query_cont(&sent->err, k->db, r_));
    if (rc) {
        *broken = true;
        return rc == DLOCK_ETIMEDOUT ? timed_out(s, what) : rc;
    }
    if (sent->err) {
        *broken = breaks(mysql_errno(k->db));
        return dlock__my_fail(s, k, what);
    }
    MYSQL_RES *r = NULL;
    for (bool first = true;; first = false) {
        if (!first) { /* the next statement's result: it ran, or failed */
            int err = 0;
            rc = DRIVE(s, k, io, mysql_next_result_start(&err, k->db),
                       mysql_next_result_cont(&err, k->db, r_));
            if (!rc && err > 0) {
                *broken = breaks(mysql_errno(k->db));
                if (r)
                    mysql_free_result(r);
                return dlock__my_fail(s, k, what);
            }
        }
        MYSQL_RES *next = NULL;
        if (!rc)
            rc = DRIVE(s, k, io, mysql_store_result_start(&next, k->db),
                       mysql_store_result_cont(&next, k->db, r_));
        if (!rc && !next && mysql_errno(k->db)) {
            *broken = breaks(mysql_errno(k->db));
            if (r)
                mysql_free_result(r);
            return dlock__my_fail(s, k, what);
        }
        if (rc) {
            *broken = true;
            if (r)
                mysql_free_result(r);
            return rc == DLOCK_ETIMEDOUT ? timed_out(s, what) : rc;
        }
        if (next && r)
            mysql_free_result(next); /* the first result set is the answer */
        else if (next)
            r = next;
        if (!mysql_more_results(k->db))
            break;
    }
    k->idle_since = dlock__now_ms();
    if (res)
        *res = r;
    else if (r)
        mysql_free_result(r);
    return DLOCK_OK;
}

int dlock__my_query(struct my_backend *s, struct my_conn *k, const char *sql, struct my_io *io,
                    MYSQL_RES **res, bool *broken, const char *what)
{
    struct my_sent sent;
    int rc = dlock__my_send(s, k, sql, io, &sent);
    if (rc) {
        *broken = true;
        if (res)
            *res = NULL;
        return rc == DLOCK_ETIMEDOUT ? timed_out(s, what) : rc;
    }
    return dlock__my_finish(s, k, &sent, io, res, broken, what);
}

/* The session's wait_timeout for LEASE_MS: whole seconds, rounded up
 * (the server keeps an idle session at least the lease). */
static int64_t wait_timeout_of(int64_t lease_ms)
{
    int64_t t = (lease_ms + 999) / 1000;
    return t < 1 ? 1 : t;
}

/* Set K's wait_timeout (and interactive_timeout) to T seconds, and what
 * the server or the user's defaults may have set otherwise: autocommit
 * on (a token written in a transaction left open would be rolled back
 * when the session ends, and handed out again), and on MariaDB no
 * max_statement_time (it would end a forever wait). The first call on a
 * session is the one after its dial (its wait_timeout is 0 until then). */
static int set_wait_timeout(struct my_backend *s, struct my_conn *k, int64_t t, int64_t deadline)
{
    char sql[192];
    snprintf(sql, sizeof sql,
             "SET SESSION wait_timeout = %lld, interactive_timeout = %lld, autocommit = 1"
             " /*M!100108 , max_statement_time = 0 */",
             (long long)t, (long long)t);
    struct my_io io = {.deadline = deadline, .cancel_fd = -1};
    bool broken;
    int rc = dlock__my_query(s, k, sql, &io, NULL, &broken, "set the session's wait_timeout");
    if (!rc)
        k->wait_timeout = t;
    return rc;
}

/* A socket that a forever wait keeps open notices a silent peer:
 * keepalive probes from the op timeout on. */
static void tune_socket(struct my_backend *s, int fd)
{
    int fl = fcntl(fd, F_GETFD);
    if (fl >= 0)
        fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
    int on = 1, idle = (int)(s->c->opts.op_timeout_ms / 1000), intvl = 1, cnt = 3;
    if (idle < 1)
        idle = 1;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
}

static int dial(struct my_backend *s, int64_t deadline, struct my_conn **out)
{
    struct my_conn *k = calloc(1, sizeof *k);
    if (!k || !(k->db = mysql_init(NULL))) {
        free(k);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    mysql_optionsv(k->db, MYSQL_OPT_NONBLOCK, 0);
    mysql_optionsv(k->db, MYSQL_OPT_CONNECT_ATTR_ADD, "dlock_id", s->ident);
    MYSQL *ret = NULL;
    struct my_io io = {.deadline = deadline, .cancel_fd = -1};
    int rc = DRIVE(s, k, &io,
                   mysql_real_connect_start(&ret, k->db, s->host, s->user, s->password, s->db,
                                            s->port, s->socket, CLIENT_MULTI_STATEMENTS),
                   mysql_real_connect_cont(&ret, k->db, r_));
    if (rc || !ret) {
        rc = rc == DLOCK_ETIMEDOUT
                 ? dlock__err(DLOCK_ECONN, "%s: connect: no answer in time", s->label)
             : rc ? rc
                  : dlock__my_fail(s, k, "connect");
        dlock__my_conn_close(k);
        return rc;
    }
    k->id = mysql_thread_id(k->db);
    tune_socket(s, mysql_get_socket(k->db));
    *out = k;
    return DLOCK_OK;
}

int dlock__my_conn_get(struct my_backend *s, int64_t lease_ms, int64_t deadline,
                       struct my_conn **out)
{
    int64_t want = wait_timeout_of(lease_ms);
    struct my_conn *k = NULL;
    pthread_mutex_lock(&s->mu);
    while (!k && s->idle) {
        k = s->idle;
        s->idle = k->next;
        s->nidle--;
        /* one that idled half its wait_timeout may be ended any moment */
        if (dlock__now_ms() - k->idle_since >= k->wait_timeout * 500) {
            pthread_mutex_unlock(&s->mu);
            dlock__my_conn_close(k);
            k = NULL;
            pthread_mutex_lock(&s->mu);
        }
    }
    pthread_mutex_unlock(&s->mu);
    int rc = k ? DLOCK_OK : dial(s, deadline, &k);
    if (!rc && k->wait_timeout != want)
        rc = set_wait_timeout(s, k, want, deadline);
    if (rc) {
        dlock__my_conn_close(k);
        return rc;
    }
    k->next = NULL;
    *out = k;
    return DLOCK_OK;
}

void dlock__my_conn_put(struct my_backend *s, struct my_conn *k, bool broken)
{
    if (!k)
        return;
    pthread_mutex_lock(&s->mu);
    if (!broken && s->nidle < POOL_MAX) {
        k->next = s->idle;
        s->idle = k;
        s->nidle++;
        k = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    dlock__my_conn_close(k);
}

void dlock__my_pool_drain(struct my_backend *s)
{
    pthread_mutex_lock(&s->mu);
    struct my_conn *k = s->idle;
    s->idle = NULL;
    s->nidle = 0;
    pthread_mutex_unlock(&s->mu);
    while (k) {
        struct my_conn *next = k->next;
        dlock__my_conn_close(k);
        k = next;
    }
}

int dlock__my_query_pooled(struct my_backend *s, const char *sql, MYSQL_RES **res, const char *what)
{
    struct my_conn *k = NULL;
    int64_t now = dlock__now_ms();
    int rc = dlock__my_conn_get(s, s->c->opts.lease_ms, now + s->c->opts.connect_timeout_ms, &k);
    if (rc)
        return rc;
    struct my_io io = {.deadline = now + s->c->opts.op_timeout_ms, .cancel_fd = -1};
    bool broken = false;
    rc = dlock__my_query(s, k, sql, &io, res, &broken, what);
    dlock__my_conn_put(s, k, broken);
    return rc;
}

int dlock__my_select_number(struct my_backend *s, char *sql, const char *what,
                            unsigned long long *val)
{
    *val = 0;
    if (!sql)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    MYSQL_RES *res = NULL;
    int rc = dlock__my_query_pooled(s, sql, &res, what);
    free(sql);
    if (!rc) {
        dlock__my_first(res, val, NULL);
        mysql_free_result(res);
    }
    return rc;
}

MYSQL_ROW dlock__my_first(MYSQL_RES *res, unsigned long long *val, bool *isnull)
{
    MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
    if (val)
        *val = row && row[0] ? strtoull(row[0], NULL, 10) : 0;
    if (isnull)
        *isnull = !row || !row[0];
    return row;
}
