/* mysql.h -- what the files of the MySQL/MariaDB backend share, and
 * nothing public.
 *
 *   lib.c     libmariadb, loaded with dlopen() on first use (why: below)
 *   conn.c    connections: dialing without blocking, one statement within
 *             a deadline and a cancel, the pool of idle sessions, KILL
 *   names.c   a lock name as a GET_LOCK name (encoded, hashed past 64)
 *   mutex.c   open/close, the locks (GET_LOCK, RELEASE_LOCK), renewal,
 *             the backend table
 *   admin.c   inspect, check, list and force-release
 *   value.c   a lock's value: a row of dlock_value, written under the hold
 *   semaphore.c  semaphores: N permits as N user locks, the count in
 *             dlock_semaphore
 *   election.c   elections: the lock plus the leader's row in dlock_leader
 *
 * Every lock is a user-level lock, GET_LOCK(name, timeout), taken on a
 * session of its own: the session that waited for it keeps it (a hold
 * pins its session) and gives it up with RELEASE_LOCK. The session's
 * wait_timeout is the lease, so a session the keeper stops pinging --
 * a frozen, dead or cut-off holder -- is ended by the server, and its
 * lock with it. docs/protocol-mysql.md tells the whole story.
 */
#ifndef DLOCK_MYSQL_H
#define DLOCK_MYSQL_H

#include <mysql.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend.h"

#define MYSQL_DEFAULT_PORT 3306
/* The fencing token, (epoch << 40) + (UUID_SHORT() - base) (mutex.c): the
 * durable epoch in an InnoDB row; the epoch in use and the server
 * lifetime's base in a MEMORY row (lost at a restart, by design), read
 * by the acquire's own statement; and the internal user lock that orders
 * the start of an epoch (no encoded lock name starts with '%e': a '%' is
 * followed by two hex digits). dlock_fence is the one-counter table of
 * releases before the epoch: read once, to start the epoch past its
 * tokens; dlock_fence_mem, the counter row of the releases that wrote a
 * row per acquire, is no longer used. */
#define MYSQL_FENCE_TABLE "dlock_fence"
#define MYSQL_EPOCH_TABLE "dlock_epoch"
#define MYSQL_FENCE_BASE_TABLE "dlock_fence_base"
#define MYSQL_EPOCH_LOCK "%epoch"
#define MYSQL_EPOCH_SHIFT 40
#define MYSQL_EPOCH_SPAN "1099511627776" /* 2^40: the tokens of one epoch */
#define MYSQL_EPOCH_MAX (1u << 23)       /* epochs that fit in 63 bits */
#define MYSQL_VALUE_TABLE "dlock_value"
#define MYSQL_SEM_TABLE "dlock_semaphore" /* a semaphore's permit count */
#define MYSQL_LEADER_TABLE "dlock_leader" /* an election's leader and value */
/* GET_LOCK's longest name on MySQL 5.7+ (MariaDB takes longer ones): a
 * longer one is hashed (names.c). */
#define MYSQL_LOCK_NAME_MAX 64
/* GET_LOCK's timeout for a wait without end: a year (a negative one is
 * refused by MariaDB 10.11 with NULL). */
#define MYSQL_FOREVER_S 31536000

/* ============================================================== lib.c
 *
 * Linking libmariadb would load it (and its TLS libraries) into every
 * process that links libdlock, used or not. So the backend reaches it
 * through this table, filled by dlopen("libmariadb.so.3") (src/dlsym.c)
 * when the first mysql:// client opens; the names below map the plain
 * mysql_* calls onto it, so the backend's code reads as plain
 * Connector/C. Every call that talks to the server is the non-blocking
 * form (_start/_cont), so that every request ends by a deadline and a
 * cancel (conn.c).
 */
struct dlock__mariadb_api {
    int (*library_init)(int argc, char **argv, char **groups);
    MYSQL *(*init)(MYSQL *m);
    int (*optionsv)(MYSQL *m, enum mysql_option opt, ...);
    int (*real_connect_start)(MYSQL **ret, MYSQL *m, const char *host, const char *user,
                              const char *passwd, const char *db, unsigned int port,
                              const char *unix_socket, unsigned long flags);
    int (*real_connect_cont)(MYSQL **ret, MYSQL *m, int status);
    int (*real_query_start)(int *ret, MYSQL *m, const char *q, unsigned long len);
    int (*real_query_cont)(int *ret, MYSQL *m, int status);
    int (*store_result_start)(MYSQL_RES **ret, MYSQL *m);
    int (*store_result_cont)(MYSQL_RES **ret, MYSQL *m, int status);
    my_bool (*more_results)(MYSQL *m);
    int (*next_result_start)(int *ret, MYSQL *m);
    int (*next_result_cont)(int *ret, MYSQL *m, int status);
    MYSQL_ROW (*fetch_row)(MYSQL_RES *r);
    unsigned long *(*fetch_lengths)(MYSQL_RES *r);
    unsigned int (*num_fields)(MYSQL_RES *r);
    void (*free_result)(MYSQL_RES *r);
    void (*close)(MYSQL *m);
    const char *(*error)(MYSQL *m);
    unsigned int (*errno_)(MYSQL *m);
    my_socket (*get_socket)(MYSQL *m);
    unsigned int (*get_timeout_value_ms)(const MYSQL *m);
    unsigned long (*thread_id)(MYSQL *m);
    my_ulonglong (*insert_id)(MYSQL *m);
    my_ulonglong (*affected_rows)(MYSQL *m);
    /* blocking forms, for cli/bench_mysql.c's raw baseline only */
    MYSQL *(*real_connect)(MYSQL *m, const char *host, const char *user, const char *passwd,
                           const char *db, unsigned int port, const char *unix_socket,
                           unsigned long flags);
    int (*real_query)(MYSQL *m, const char *q, unsigned long len);
    MYSQL_RES *(*store_result)(MYSQL *m);
};
extern struct dlock__mariadb_api dlock__mariadb;

/* Load libmariadb once (thread-safe). DLOCK_OK, or DLOCK_ENOTBUILT with
 * a message naming the library and the package. */
int dlock__mariadb_load(void);

#define mysql_init dlock__mariadb.init
#define mysql_optionsv dlock__mariadb.optionsv
#define mysql_real_connect_start dlock__mariadb.real_connect_start
#define mysql_real_connect_cont dlock__mariadb.real_connect_cont
#define mysql_real_query_start dlock__mariadb.real_query_start
#define mysql_real_query_cont dlock__mariadb.real_query_cont
#define mysql_store_result_start dlock__mariadb.store_result_start
#define mysql_store_result_cont dlock__mariadb.store_result_cont
#define mysql_more_results dlock__mariadb.more_results
#define mysql_next_result_start dlock__mariadb.next_result_start
#define mysql_next_result_cont dlock__mariadb.next_result_cont
#define mysql_fetch_row dlock__mariadb.fetch_row
#define mysql_fetch_lengths dlock__mariadb.fetch_lengths
#define mysql_num_fields dlock__mariadb.num_fields
#define mysql_free_result dlock__mariadb.free_result
#define mysql_close dlock__mariadb.close
#define mysql_error dlock__mariadb.error
#define mysql_errno dlock__mariadb.errno_
#define mysql_get_socket dlock__mariadb.get_socket
#define mysql_get_timeout_value_ms dlock__mariadb.get_timeout_value_ms
#define mysql_thread_id dlock__mariadb.thread_id
#define mysql_insert_id dlock__mariadb.insert_id
#define mysql_affected_rows dlock__mariadb.affected_rows

/* ============================================================== conn.c */

/* One server session. */
struct my_conn {
    MYSQL *db;
    unsigned long id;     /* CONNECTION_ID(): what KILL names */
    int64_t wait_timeout; /* the session's wait_timeout (s) */
    int64_t idle_since;   /* monotonic ms of its last reply (the pool's) */
    /* The server lifetime's fencing epoch and base (the MEMORY row),
     * kept after the session's first token so that its later acquires
     * open no table (mutex.c); epoch 0: none kept yet. Only a restart
     * starts another lifetime, and it ends the session. */
    unsigned long long epoch, base;
    struct my_conn *next; /* the pool's list */
};

struct my_backend {
    struct dlock_client *c;
    char *host, *socket, *user, *password, *db;
    unsigned port;
    char label[300]; /* "mysql 127.0.0.1:3306/db", for messages */
    char ident[120]; /* "pid@host": the dlock_id connection attribute */
    char *prefix;    /* c->opts.key_prefix or "" */
    pthread_mutex_t mu;
    struct my_conn *idle; /* the pool: sessions that hold nothing */
    size_t nidle;
};

/* How one statement may run: until DEADLINE (monotonic ms), and, while
 * CANCEL_FD (-1: none) is not readable. When it becomes readable the
 * statement is ended from another session (KILL QUERY) and its reply
 * read within the op timeout; CANCELED tells the caller. */
struct my_io {
    int64_t deadline;
    int cancel_fd;
    bool canceled;
};

/* A session: from the pool when one idled less than half its
 * wait_timeout, else dialed (connect, then its wait_timeout set to
 * LEASE_MS rounded up to whole seconds). By DEADLINE; DLOCK_OK with *OUT,
 * or a code with a message naming the server. */
int dlock__my_conn_get(struct my_backend *s, int64_t lease_ms, int64_t deadline,
                       struct my_conn **out);
/* Give K back to the pool (it holds nothing), or close it when BROKEN. */
void dlock__my_conn_put(struct my_backend *s, struct my_conn *k, bool broken);
/* Close K at once (a session abandoned mid-request: the server ends it,
 * and frees its locks, when it notices). */
void dlock__my_conn_close(struct my_conn *k);
/* Close every pooled session. */
void dlock__my_pool_drain(struct my_backend *s);

/* Run SQL on K as IO says; with RES, the result set (caller frees with
 * mysql_free_result): of several statements (the session speaks
 * CLIENT_MULTI_STATEMENTS), the first result set, all of them read
 * (mysql_affected_rows() and mysql_insert_id() tell of the last); the
 * first statement that fails ends the request. DLOCK_OK; a server error (K still usable:
 * *BROKEN false); or a lost connection, the deadline (DLOCK_ETIMEDOUT),
 * K unusable (*BROKEN true). WHAT names the request in messages. */
int dlock__my_query(struct my_backend *s, struct my_conn *k, const char *sql, struct my_io *io,
                    MYSQL_RES **res, bool *broken, const char *what);
/* The same in two halves, so that several sessions' statements can be
 * on the way at once (the renewals of a batch): dlock__my_send() sends
 * SQL on K within IO (a failure leaves K unusable), *OUT what the reply
 * needs; dlock__my_finish() reads that reply within IO as
 * dlock__my_query() does. */
struct my_sent {
    int status; /* what libmariadb waits for next (0: done) */
    int err;    /* mysql_real_query's result once done */
};
int dlock__my_send(struct my_backend *s, struct my_conn *k, const char *sql, struct my_io *io,
                   struct my_sent *out);
int dlock__my_finish(struct my_backend *s, struct my_conn *k, struct my_sent *sent,
                     struct my_io *io, MYSQL_RES **res, bool *broken, const char *what);
/* Run SQL on a session of the pool (dialed if none) within the op
 * timeout, the result set into *RES when not NULL (caller frees). */
int dlock__my_query_pooled(struct my_backend *s, const char *sql, MYSQL_RES **res,
                           const char *what);
/* Run SQL (dlock__sprintf's, freed here; NULL: out of memory) as
 * dlock__my_query_pooled() does, its first row's first column into *VAL
 * (0 when no row or NULL). */
int dlock__my_select_number(struct my_backend *s, char *sql, const char *what,
                            unsigned long long *val);
/* The first row of RES (NULL when none) and, when it has one, its first
 * column as a number in *VAL (0 for NULL: *ISNULL). */
MYSQL_ROW dlock__my_first(MYSQL_RES *res, unsigned long long *val, bool *isnull);
/* The code and message of K's last error, for WHAT. */
int dlock__my_fail(struct my_backend *s, struct my_conn *k, const char *what);

/* ============================================================= names.c */

/* The GET_LOCK name of lock NAME (with the key prefix) as an SQL
 * expression: 'ENC' where ENC is the prefix and name percent-encoded
 * (every byte but letters, digits and -_/.:@+=,~), or, when ENC is longer
 * than 64 characters, CONCAT('%h', LEFT(SHA2('ENC', 256), 62)). Into
 * *ENC, ENC itself (caller frees both). NULL when out of memory. */
char *dlock__my_name_sql(const struct my_backend *s, const char *name, char **enc);
/* The lock name of GET_LOCK name LOCK, if it is one of this client's
 * (the key prefix, not hashed); NULL otherwise. Caller frees. */
char *dlock__my_name_of(const struct my_backend *s, const char *lock);

/* ============================================================= mutex.c */

/* A hold's session and its GET_LOCK name (h->bdata). */
struct my_hold {
    struct my_conn *k; /* NULL once the session ended */
    char *name_sql;
    char *held_sql; /* an SQL condition true while the session holds all
                       the hold took (a semaphore's slots); NULL: the lock
                       NAME_SQL is the session's */
};

void dlock__my_hold_free(struct my_hold *mh);

/* Locks (the campaign of an election is one): mutex.c's acquire and
 * release; the release gives back a semaphore's permits too (those of
 * the hold's HELD_SQL). */
int dlock__my_lock_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w);
int dlock__my_lock_release(void *state, struct dlock__hold *h);

/* The next fencing token, taken on MH's session, which just got what H
 * asked (*BROKEN: the session is unusable). */
int dlock__my_next_token(struct my_backend *s, struct dlock__hold *h, struct my_hold *mh,
                         unsigned long long *token, bool *broken);

/* Whether H's lock is still its session's, asked on that session
 * (IS_USED_LOCK = CONNECTION_ID()) by DEADLINE: DLOCK_OK, DLOCK_ELOST,
 * or a failure (*BROKEN: the session is unusable). */
int dlock__my_still_ours(struct my_backend *s, struct dlock__hold *h, struct my_hold *mh,
                         int64_t deadline, bool *broken);

/* ============================================================= value.c */

/* The hex digits of LEN bytes at DATA (a X'...' literal's inside), malloc'd;
 * NULL when out of memory. */
char *dlock__my_hex(const char *data, size_t len);
int dlock__my_value_set(void *state, struct dlock__hold *h, const struct dlock__value *v);
int dlock__my_value_get(void *state, const char *name, struct dlock__value *out);

/* ============================================================= admin.c */

int dlock__my_inspect(void *state, const char *name, struct dlock_info *info);
int dlock__my_check(void *state, const char *name, struct dlock__check_view *view);
int dlock__my_force_release(void *state, const char *name);
int dlock__my_list(void *state, const char *pattern, dlock_list_fn fn, void *arg);
/* DLOCK_OK when the server lists its user locks
 * (performance_schema.metadata_locks), else DLOCK_ENOTSUP saying what is
 * off. */
int dlock__my_list_refused(struct my_backend *s);

/* ========================================================= semaphore.c */

/* Who session ID (an SQL expression) is, as h->owner names a hold: its
 * dlock_id connection attribute ("pid@host", else "connection"), '/',
 * and its connection id. */
#define MYSQL_OWNER_ID(id)                                                            \
    "CONCAT(COALESCE((SELECT LEFT(a.ATTR_VALUE, 70) FROM "                            \
    "performance_schema.session_connect_attrs a WHERE a.PROCESSLIST_ID = " id " AND " \
    "a.ATTR_NAME = 'dlock_id' LIMIT 1), 'connection'), '/', " id ")"

/* How long a semaphore waiter sleeps in the server on one permit's lock,
 * and an observer of an election between two looks, before it looks
 * again: MySQL has no notification, and one user lock wait covers one
 * permit only (semaphore.c, election.c). */
#define MYSQL_RECHECK_MS 500

/* The semaphore ops' table, and its permit-count table (made at open). */
extern const struct dlock__sem_ops dlock__my_sem_ops;
int dlock__my_sem_create_table(struct my_backend *s);

/* ========================================================== election.c */

extern const struct dlock__elect_ops dlock__my_elect_ops;
int dlock__my_elect_create_table(struct my_backend *s);

#endif
