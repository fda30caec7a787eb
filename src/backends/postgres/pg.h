/* pg.h -- what the files of the PostgreSQL backend share, and nothing public.
 *
 *   libpq.c  libpq, loaded with dlopen() on the first postgres:// client
 *   conn.c   sessions: dialing within a deadline, one statement within a
 *            deadline (a cancel ends it through PQcancel), the pool of idle
 *            sessions, the server's errors as dlock codes
 *   key.c    a lock name as an advisory-lock key (numbers and "int,int" as
 *            they are, anything else hashed; or DistributedLock's keys)
 *   lock.c   open/close, the schema (a sequence, a table), locks on session
 *            advisory locks, the lease (renew() pings each pinned session)
 *            and the backend table
 *   admin.c  inspect, check, list, force release
 *   value.c  a lock's value: a row of dlock_values written through the hold's session
 *   schema.c the tables semaphores and elections add, made on their first use
 *   notify.c LISTEN/NOTIFY: a channel per semaphore or election, and the
 *            wait for a notification that wakes a semaphore's waiter or an
 *            election's observer
 *   semaphore.c  counting semaphores: a block of advisory keys per name
 *   election.c   leader election: the name's lock, a watch key and a row
 *
 * docs/protocol-postgres.md tells the whole story.
 */
#ifndef DLOCK_PG_H
#define DLOCK_PG_H

#include <libpq-fe.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend.h"

#define PG_DEFAULT_PORT 5432
#define PG_POOL_MAX 4 /* idle sessions kept per client */
#define PG_SEQUENCE "dlock_fence"
#define PG_TABLE "dlock_holds"
#define PG_VALUES "dlock_values"

/* ============================================================= libpq.c
 *
 * libpq pulls OpenSSL, Kerberos and LDAP into a process: a program on
 * another backend must not pay for them at start-up, so the backend
 * reaches libpq through this table, filled by dlopen("libpq.so.5") when
 * the first postgres:// client opens (as etcd does with libcurl). */
struct dlock__pq_api {
    PGconn *(*connectdb)(const char *conninfo);         /* dlock bench's baseline */
    PGresult *(*exec)(PGconn *conn, const char *query); /* dlock bench's baseline */
    PGconn *(*connectStartParams)(const char *const *keys, const char *const *values,
                                  int expand_dbname);
    PostgresPollingStatusType (*connectPoll)(PGconn *conn);
    ConnStatusType (*status)(const PGconn *conn);
    char *(*errorMessage)(const PGconn *conn);
    void (*finish)(PGconn *conn);
    int (*socket)(const PGconn *conn);
    int (*sendQuery)(PGconn *conn, const char *query);
    int (*consumeInput)(PGconn *conn);
    int (*isBusy)(PGconn *conn);
    PGresult *(*getResult)(PGconn *conn);
    ExecStatusType (*resultStatus)(const PGresult *res);
    char *(*resultErrorField)(const PGresult *res, int field);
    char *(*resultErrorMessage)(const PGresult *res);
    void (*clear)(PGresult *res);
    int (*ntuples)(const PGresult *res);
    char *(*getvalue)(const PGresult *res, int row, int col);
    int (*getisnull)(const PGresult *res, int row, int col);
    PGcancel *(*getCancel)(PGconn *conn);
    void (*freeCancel)(PGcancel *cancel);
    int (*cancel)(PGcancel *cancel, char *errbuf, int errbufsize);
    int (*backendPID)(const PGconn *conn);
    PQnoticeProcessor (*setNoticeProcessor)(PGconn *conn, PQnoticeProcessor proc, void *arg);
    PGnotify *(*notifies)(PGconn *conn);
    void (*freemem)(void *ptr);
};
extern struct dlock__pq_api dlock__pq;

/* Load libpq once (thread-safe): DLOCK_OK, or DLOCK_ENOTBUILT naming the
 * library and the package to install. */
int dlock__pq_load(void);

/* ============================================================== conn.c */

/* One session: a connection to the server, used by one thread at a time
 * (mu), pinned to a hold while it holds, in the pool between uses. */
struct pg_conn {
    PGconn *pq;
    pthread_mutex_t mu;
    int64_t idle_timeout_ms; /* the session's idle_session_timeout now */
    int64_t idle_since;      /* monotonic ms of its last statement */
    bool broken;             /* the session is gone or unusable: close it */
    char sqlstate[6];        /* of the last statement's error ("" for none) */
    char last_words[256];    /* the server's last notice: a FATAL sent while idle */
    struct pg_conn *next;    /* pool */
};

struct pg_backend {
    dlock_client *c;
    const char *prefix;        /* c->opts.key_prefix or "" */
    bool distributedlock_keys; /* layout=distributedlock: the .NET library's keys */
    char label[256];           /* "postgres host:port/db", for messages */
    char ident[100];           /* "dlock pid@host": every session's application_name */
    char ident_sql[100];       /* "pid@host" as an SQL string literal's contents */
    long query_text_max;       /* track_activity_query_size: what pg_stat_activity keeps */
    /* libpq keywords and values of every dial (NULL-ended), the lease's
     * server settings among them */
    const char *keys[48];
    char *values[48];
    pthread_mutex_t pool_mu;
    struct pg_conn *pool; /* idle sessions */
    size_t npool;
    int sem_tables, elect_tables; /* atomic: schema.c found them */
};

/* A session from the pool, or a new one dialed by DEADLINE (monotonic
 * ms) and W's cancel (W may be NULL). */
int dlock__pg_session(struct pg_backend *b, struct dlock__wait *w, int64_t deadline,
                      struct pg_conn **out);
/* Give session PC back: to the pool when healthy, else closed. */
void dlock__pg_session_put(struct pg_backend *b, struct pg_conn *pc);
/* Close PC (PQfinish: the server ends the session, and its locks). */
void dlock__pg_session_close(struct pg_conn *pc);
/* Close every pooled session. */
void dlock__pg_pool_drain(struct pg_backend *b);

/* One statement (or several, ';'-separated: the simple query protocol)
 * on PC: *OUT the last result (caller clears). Bounded by DEADLINE
 * (monotonic ms): past it the session is marked broken (the caller
 * closes it) and DLOCK_ETIMEDOUT returned. W (may be NULL) cancels: its
 * cancel sends PQcancel (from a thread of its own) and waits for the
 * server's answer, both within the op timeout cut to DEADLINE; a cancel
 * with no answer closes the session instead (DLOCK_ECANCELED).
 * A server error is the code of its SQLSTATE with the server's words
 * (the SQLSTATE itself in PC->sqlstate); WHAT names the statement in
 * messages. */
struct pg_query {
    const char *sql;
    const char *what;
    struct dlock__wait *w;
    int64_t deadline;
};
int dlock__pg_exec(struct pg_backend *b, struct pg_conn *pc, const struct pg_query *q,
                   PGresult **out);
/* Send Q without waiting for its answer; dlock__pg_finish() collects it. */
int dlock__pg_send(struct pg_backend *b, struct pg_conn *pc, const struct pg_query *q);
int dlock__pg_finish(struct pg_backend *b, struct pg_conn *pc, const struct pg_query *q,
                     PGresult **out);
/* A statement on a pooled session, given back after: admin's reads. */
int dlock__pg_exec_pooled(struct pg_backend *b, const char *sql, const char *what, PGresult **out);

/* =============================================================== key.c */

/* An advisory lock key as pg_locks shows it: (classid, objid, objsubid). */
struct pg_key {
    int64_t classid, objid;
    int objsubid;  /* 1: one bigint key; 2: two int4 keys */
    char args[48]; /* the lock functions' arguments: "123::int8" or "1, 2" */
};
/* The key of FULL (prefix and name): docs/protocol-postgres.md. */
void dlock__pg_key(const char *full, struct pg_key *k);
/* The same in B's layout: dlock's own, or DistributedLock's
 * (layout=distributedlock). */
void dlock__pg_key_of(const struct pg_backend *b, const char *full, struct pg_key *k);
/* "prefix" + NAME, malloc'd. */
char *dlock__pg_full_name(struct pg_backend *b, const char *name);
/* The WHERE condition matching K's rows in pg_locks (alias l). */
void dlock__pg_key_where(const struct pg_key *k, char *buf, size_t size);
/* NAME's bytes as hex (for decode(..., 'hex')), malloc'd. */
char *dlock__pg_hex(const char *name);
/* A key of FULL's own for TAG ("semaphore", "leader"): the 64-bit FNV-1a
 * hash of FULL's bytes, a NUL byte, then TAG's -- bytes no lock name
 * hashes (a name has no NUL), whatever the layout. */
uint64_t dlock__pg_tagged_hash(const char *full, const char *tag);

/* ============================================================== lock.c */

/* The hold's own data (h->bdata). */
struct pg_hold {
    struct pg_conn *pc; /* the pinned session */
    struct pg_key key;
    char *tag;          /* PG_TAG_OPEN <full name in hex> PG_TAG_CLOSE: opens its statements;
                           NULL for a permit's or a leader's hold (not listed by it) */
    char *row_name_hex; /* a name too long for the tag ("" then): its row in PG_TABLE */
};
/* What opens a hold's statements: the full name in hex in a comment, so
 * that the session's pg_stat_activity.query names what it holds (list). */
#define PG_TAG_OPEN "/*dlock:"
#define PG_TAG_CLOSE "*/ "
/* The application_name of a session while it holds: "dlock#TOKEN pid@host"
 * (inspect reads the token there); "dlock pid@host" otherwise. */
#define PG_HOLDING_APP "dlock#"

/* SQL (named WHAT in messages) on hold H's pinned session, under its
 * mutex, within the op timeout: as dlock__pg_exec(), but DLOCK_ELOST
 * naming the hold when the session had ended or ends meanwhile. */
int dlock__pg_exec_held(struct pg_backend *b, struct dlock__hold *h, const char *sql,
                        const char *what, PGresult **out);

extern const struct dlock__admin_ops dlock__pg_admin_ops;

/* The session settings that make the lease LEASE_MS real into BUF: as
 * libpq's `options`, what every dial passes, or AS_SETS as SET
 * statements (dlock bench's raw session). NULL when BUF is too small. */
char *dlock__pg_lease_settings(long long lease_ms, bool as_sets, char *buf, size_t size);

/* ============================================================ schema.c */

/* The objects a primitive adds beside the locks' (made on first use, so a
 * database whose owner made the locks' three objects by hand keeps
 * working for locks without CREATE). */
struct pg_objects {
    const char *what;   /* "semaphores", "elections": for messages */
    const char *names;  /* "dlock_semaphores and dlock_permits": for messages */
    const char *look;   /* SELECT of one boolean: all there */
    const char *create; /* the statements that make them */
};
/* Make sure OBJ's objects exist: looked up once per client, *READY (a
 * field of B, atomic) remembering that they do. */
int dlock__pg_ensure(struct pg_backend *b, const struct pg_objects *obj, int *ready);

/* ============================================================ notify.c */

#define PG_CHANNEL_MAX 40
/* The channel of the name whose key is KEY for KIND ("sem", "elect"):
 * "dlock_<kind>_<key in hex>" into BUF. */
void dlock__pg_channel(const char *kind, uint64_t key, char buf[PG_CHANNEL_MAX]);
/* Whether a notification from another session than PC's own is queued
 * on PC (read from its socket if READ); all queued ones are dropped. */
bool dlock__pg_notified(struct pg_conn *pc, bool read);
/* Sleep until one of the N sessions PCS is readable (a notification, or
 * the answer of a statement sent on it), W is canceled or past its
 * deadline, or UNTIL (monotonic ms) passes: the index of the session, N
 * for UNTIL, or DLOCK_ETIMEDOUT / DLOCK_ECANCELED (< 0, never a message). */
int dlock__pg_wait_readable(struct pg_conn *const *pcs, int n, struct dlock__wait *w,
                            int64_t until);

/* ============================================================= value.c */

extern const struct dlock__value_ops dlock__pg_value_ops;

/* ========================================================= semaphore.c */

extern const struct dlock__sem_ops dlock__pg_sem_ops;

/* ========================================================== election.c */

extern const struct dlock__elect_ops dlock__pg_elect_ops;

/* ============================================================= admin.c */

int dlock__pg_inspect(void *state, const char *name, struct dlock_info *info);
int dlock__pg_check(void *state, const char *name, struct dlock__check_view *view);
int dlock__pg_list(void *state, const char *pattern, dlock_list_fn fn, void *arg);
/* FN for each name SQL (run on a pooled session; WHAT names it) answers
 * as hex in its first column, the client's prefix taken off (names
 * outside it left out), matching PATTERN, in order. */
int dlock__pg_list_names(struct pg_backend *b, const char *sql, const char *what,
                         const char *pattern, dlock_list_fn fn, void *arg);
int dlock__pg_force_release(void *state, const char *name);

#endif /* DLOCK_PG_H */
