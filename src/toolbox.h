/* toolbox.h -- what the core lends every backend: the tools, not the
 * contract.
 *
 * Time (monotonic and wall clocks, the one time budget of a call,
 * backoff), error messages, the parsed URL and options, waits (sleeping,
 * polling, cancel, retry pauses), waitsets (first-come, first-served
 * registries of waiters), the cleanup queue of work owed after an
 * ambiguous reply, name encoding, logging and counters, small string
 * helpers, and the loader of client libraries opened with dlopen(). A
 * backend includes backend.h, which includes this file; nothing here
 * knows what a lock is.
 */
#ifndef DLOCK_TOOLBOX_H
#define DLOCK_TOOLBOX_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dlock.h"

/* ------------------------------------------------------------------ time */

/* Monotonic milliseconds. */
int64_t dlock__now_ms(void);
/* pthread_cond_init() of a condition variable whose timed waits take
 * CLOCK_MONOTONIC deadlines (the clock of dlock__now_ms). */
void dlock__cond_init_monotonic(pthread_cond_t *cv);
/* A mutex whose lock gives up at a monotonic deadline: what
 * pthread_mutex_clocklock() does, made of a mutex, a condition variable
 * and a flag because ThreadSanitizer has no interceptor for clocklock (it
 * saw only the unlock, reported "unlock of an unlocked mutex", and lost
 * the happens-before the lock gives). dlock__timed_mutex_lock() returns
 * true when it holds M, false when UNTIL_MS (dlock__now_ms) came first. */
struct dlock__timed_mutex {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC; signalled at each unlock */
    bool held;
};
void dlock__timed_mutex_init(struct dlock__timed_mutex *m);
void dlock__timed_mutex_destroy(struct dlock__timed_mutex *m);
bool dlock__timed_mutex_lock(struct dlock__timed_mutex *m, int64_t until_ms);
void dlock__timed_mutex_unlock(struct dlock__timed_mutex *m);
/* Wall-clock milliseconds since the epoch. */
int64_t dlock__wall_ms(void);
/* Deadline for a wait of WAIT_MS from now: 0 stays 0 (try once), < 0 is
 * DLOCK__NEVER. */
#define DLOCK__NEVER INT64_MAX
int64_t dlock__deadline(int64_t wait_ms);
/* Parse "250", "250ms", "1.5s", "2m" into ms; -1 when malformed. */
int64_t dlock__parse_duration(const char *s);

/* ---------------------------------------------------------------- errors */

/* Set the calling thread's message and return ERR. printf-style. */
int dlock__err(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Same, with ": strerror(errnum)" appended. */
int dlock__errno(int err, int errnum, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* SRC into DST (SIZE bytes, always NUL-terminated, cut before an escape
 * that does not fit) with every control character -- C0, DEL, C1 --
 * written as \xHH: what every message and log line goes through, so
 * that server text and names cannot reach a terminal raw. Returns the
 * length written. */
size_t dlock__escape_text(char *dst, size_t size, const char *src);
/* Map an errno from open/mkdir/... to a DLOCK_E* code. */
int dlock__errno_code(int errnum);
/* Keep the calling thread's message aside across a call that may
 * overwrite it, and put it back (returning ERR). */
#define DLOCK__MSG_MAX 1024
void dlock__errmsg_save(char buf[DLOCK__MSG_MAX]);
int dlock__errmsg_restore(int err, const char buf[DLOCK__MSG_MAX]);

/* ------------------------------------------------------------------- URL */

#define DLOCK__MAX_HOSTS 16
#define DLOCK__MAX_PARAMS 16

struct dlock__host {
    char *host; /* without brackets for IPv6 */
    int port;   /* 0 = the backend's default */
};

struct dlock__param {
    char *key, *value;
    bool used; /* consumed by the core or the backend */
};

struct dlock__url {
    char *scheme;   /* "redis", "file", ... */
    char *user;     /* percent-decoded, NULL if absent */
    char *password; /* percent-decoded, NULL if absent */
    struct dlock__host hosts[DLOCK__MAX_HOSTS];
    size_t nhosts;
    char *path; /* percent-decoded, starts with '/', NULL if absent */
    struct dlock__param params[DLOCK__MAX_PARAMS];
    size_t nparams;
    char *redacted; /* the URL as given, its secrets left out (url.c) */
};

/* Value of query parameter KEY, marking it used; NULL when absent. */
const char *dlock__url_param(struct dlock__url *u, const char *key);

/* Passwords from files (secret.c). The first line of the file at PATH
 * into *OUT (caller frees), refused as ssh refuses a key: not a regular
 * file owned by this user, or any group or other permission bit set
 * (DLOCK_EACCES); missing (DLOCK_ENOENT); empty (DLOCK_EINVAL). FROM names
 * what gave PATH ("password_file", "DLOCK_REDIS_PASSWORD_FILE") in the
 * message. */
int dlock__password_file(const char *path, const char *from, char **out);
/* The password in environment variable VAR, else in the file VAR_FILE
 * names; *OUT NULL when neither is set (or set empty); both set:
 * DLOCK_EINVAL. */
int dlock__password_env(const char *var, char **out);
/* The secret of U's option KEY, else of the file its KEY_file names (both:
 * DLOCK_EBADURL), else dlock__password_env(VAR) (VAR NULL: none). */
int dlock__secret_option(struct dlock__url *u, const char *key, const char *var, char **out);

/* ---------------------------------------------------------------- options */

struct dlock__opts {
    int64_t lease_ms, connect_timeout_ms, op_timeout_ms, drift_ms;
    int64_t lock_delay_ms; /* 0: off (DLOCK__CAP_LOCK_DELAY) */
    char *key_prefix, *user, *password, *layout, *tls_ca, *tls_cert, *tls_key;
};

/* --------------------------------------------------------------- waiting */

/* One acquire's wait. The backend sleeps in dlock__wait_sleep() or
 * dlock__wait_poll(); whoever learns of a release (a notification thread,
 * a watch callback) calls dlock__wait_wake(). dlock_lock_cancel() cancels.
 * Take seq = dlock__wait_seq(w) BEFORE trying, then sleep(seq): a wake
 * between the try and the sleep is never missed. */
struct dlock__wait {
    int64_t deadline; /* monotonic ms; 0 = try once; DLOCK__NEVER */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned seq;  /* bumped by every wake */
    bool canceled; /* set by dlock_lock_cancel() */
    int cancel_fd; /* eventfd readable once canceled, for poll()ers */
    uint64_t cancel_fd_gen; /* the fork generation CANCEL_FD was taken in */
    struct dlock_cancel *cancel; /* the acquire's cancel object (core's) */
    struct dlock__wait *next; /* the handle's list of waits */
    bool slept; /* the acquire slept at least once (dlock_stats.waits) */
    int64_t delay_until; /* monotonic ms the name's lock-delay ends, as the
                            backend's last look saw it; 0: none seen
                            (dlock__wait_in_delay) */
    /* A parked asynchronous acquire (async.c): called after every wake
     * and cancel of the wait, with no lock of the wait's held; NULL for
     * a wait a thread sleeps in. */
    void (*on_wake)(struct dlock__wait *w);
    int64_t retry_at; /* set by a backend's try_armed(): try again by
                         then even without a wake (dlock__wait_retry_at) */
};

unsigned dlock__wait_seq(struct dlock__wait *w);
void dlock__wait_wake(struct dlock__wait *w);
/* For a backend's try_armed() (backend.h) that answers DLOCK_EBUSY: no
 * wake may come before UNTIL (monotonic ms: the holder's lease end, a
 * lock-delay's end, an outage's next retry), so the core tries again
 * then. Without it the core waits for a wake or the deadline. */
void dlock__wait_retry_at(struct dlock__wait *w, int64_t until);
/* For a backend's try_armed() whose attempt failed by an outage (the
 * server unreachable, a connection lost, a failover under way), the
 * thread's message naming the server and what failed: returns
 * DLOCK_EBUSY for try_armed() to return. The core (async.c) rides it
 * out -- the next attempt after a backoff (100 ms doubling to 2 s), an
 * attempt that gets through ends the outage -- and a wait that ends
 * during it is DLOCK_ETIMEDOUT "still failing when the wait ended: "
 * and that message. The one policy; a backend keeps none of its own. */
int dlock__wait_outage(struct dlock__wait *w);
/* Sleep until woken since SEQ, canceled, the wait's deadline, or UNTIL
 * (monotonic ms, a safety net such as the lock's TTL; DLOCK__NEVER for
 * none). Returns DLOCK_OK (woken, or UNTIL passed: try again),
 * DLOCK_ETIMEDOUT (deadline passed; for a try-once wait at once) or
 * DLOCK_ECANCELED. */
int dlock__wait_sleep(struct dlock__wait *w, unsigned seq, int64_t until);
/* Same, but sleeping in poll() on FD for EVENTS as well as the cancel
 * eventfd: DLOCK_OK when FD is ready or UNTIL passed. */
int dlock__wait_poll(struct dlock__wait *w, int fd, short events, int64_t until);

/* The eventfd that W's cancel makes readable, in *FD, for a backend that
 * polls its own sockets (the cancel object, if any, armed): DLOCK_OK;
 * DLOCK_ECANCELED when W is canceled already; else why not (*FD -1). */
int dlock__wait_cancel_fd(struct dlock__wait *w, int *fd);
/* The backend's last look found the name in its lock-delay (a hold that
 * ended without a clean release, DLOCK__CAP_LOCK_DELAY) for LEFT_MS more,
 * as the backend times it (0: not, or no longer): an acquire refused or
 * timed out then says so, with what is left. The backend sleeps until the
 * delay's end itself (dlock__wait_sleep's UNTIL, never a poll). */
void dlock__wait_in_delay(struct dlock__wait *w, int64_t left_ms);
/* An acquire's wait for a lock-delay of LEFT_MS (> 0) that a look begun
 * at SEQ (dlock__wait_seq) found: recorded (dlock__wait_in_delay), then
 * DLOCK_EBUSY for a try-once W, else W's sleep until the delay's end
 * (DLOCK_OK: look again; DLOCK_ETIMEDOUT, DLOCK_ECANCELED). */
int dlock__wait_delay(struct dlock__wait *w, unsigned seq, int64_t left_ms);

/* Whether W (may be NULL) was canceled. */
bool dlock__wait_canceled(struct dlock__wait *w);

/* True for a try-once wait (DLOCK_TRY): every backend asks this, never
 * w->deadline itself. */
bool dlock__wait_try_once(const struct dlock__wait *w);
/* The wait's deadline (monotonic ms; 0 = try once; DLOCK__NEVER), to give
 * to dlock__time_left(): backends read no other field of a wait. */
int64_t dlock__wait_deadline(const struct dlock__wait *w);

/* The one place a request's timeout comes from (in the spirit of curl's
 * Curl_timeleft()): CAP_MS (the op or connect timeout), cut to what is
 * left until DEADLINE (monotonic ms; 0 = try once and DLOCK__NEVER leave
 * CAP_MS whole). 0 means the deadline has passed: send nothing. */
int64_t dlock__time_left(int64_t deadline, int64_t cap_ms);
/* The end (monotonic ms) of one call's time budget: CAP_MS from now, cut
 * to DEADLINE as dlock__time_left() cuts it (now when it has passed).
 * Every request of the call -- a dial, AUTH, the request, its retry
 * after a lost reply, a cancel owed before an acquire, a redirect --
 * takes this as its deadline, so a stalled server costs the call one
 * CAP_MS, not one per request. */
int64_t dlock__time_budget(int64_t deadline, int64_t cap_ms);

/* Exponential backoff between MIN_MS and MAX_MS for retries and
 * reconnects: next() returns the delay to sleep now and doubles it;
 * reset() after a success. Zero-initialise with the bounds set. */
struct dlock__backoff {
    int64_t min_ms, max_ms, cur_ms;
};
int64_t dlock__backoff_next(struct dlock__backoff *b);
void dlock__backoff_reset(struct dlock__backoff *b);

/* The one retry pause of every backend: before trying a transient
 * failure again (a lost reply, a refused connection), sleep the next delay
 * of B, cut to UNTIL (monotonic ms: when the retries must stop, e.g. the
 * request's deadline; DLOCK__NEVER for none). With W (may be NULL: a
 * release, the keeper) the pause also ends at W's cancel, at a wake of W
 * (a reconnection: try at once) and at W's deadline (a try-once W is
 * bounded by UNTIL alone). DLOCK_OK: try again now; DLOCK_ETIMEDOUT:
 * UNTIL or W's deadline has passed, stop retrying; DLOCK_ECANCELED. */
int dlock__wait_retry(struct dlock__wait *w, struct dlock__backoff *b, int64_t until);

/* ---------------------------------------------------------------- waitsets */

/* A first-come, first-served set of waits: the one registry of waiters
 * keyed by whatever the owner keys it by (the core's local queue of one
 * client's threads per name; a backend's waiters per name or per watch;
 * ZooKeeper's waiters, each keyed by the node it watches).
 *
 * Thread safety: the set has its own mutex, a leaf lock -- every function
 * may be called from any thread, with or without the caller's own locks
 * held; inside, it takes only the waits' own mutexes (dlock__wait_wake).
 *
 * A wake_one() marks the wait it wakes; that wake is the waiter's to use
 * or to pass on. A waiter that wakes calls consume() to learn whether it
 * was chosen (and clears the mark, so a later wake_one() may choose it
 * again); a waiter that leaves without using a wake it was given
 * (timeout, cancel) sees remove() return true and passes it on with
 * wake_one(), so a wake is never lost on a waiter that left. */
struct dlock__waitset_slot {
    struct dlock__wait *w;
    bool woken; /* chosen by a wake, not yet consumed */
    const char *key; /* what it waits for (borrowed), NULL for none */
};
struct dlock__waitset {
    pthread_mutex_t mu;
    struct dlock__waitset_slot *v; /* in arrival order */
    size_t n, cap;
    uint64_t wakes; /* waits woken so far (wake_one and wake_all) */
};

void dlock__waitset_init(struct dlock__waitset *ws);
/* Frees the slots; the set must be empty of waiters that still sleep. */
void dlock__waitset_destroy(struct dlock__waitset *ws);
/* Append W (arrival order); DLOCK_ENOMEM with a message. W must not be
 * in the set already. */
int dlock__waitset_add(struct dlock__waitset *ws, struct dlock__wait *w);
/* Take W out (no-op when absent). True when W held a wake it had not
 * consumed: the caller that leaves without acting on it passes it on
 * with dlock__waitset_wake_one(). */
bool dlock__waitset_remove(struct dlock__waitset *ws, struct dlock__wait *w);
/* Wake the longest-waiting wait still in the set that holds no wake yet,
 * mark it, and return it (it stays in the set until it removes itself);
 * NULL when there is none. */
struct dlock__wait *dlock__waitset_wake_one(struct dlock__waitset *ws);
/* Wake and mark the longest-waiting wait unless it holds a wake already
 * (then nothing): for an event that may have reached it through another
 * set too, so a second set does not wake a second waiter for it. */
struct dlock__wait *dlock__waitset_wake_head(struct dlock__waitset *ws);
/* As dlock__waitset_wake_one(), but among the waits behind W only: a
 * woken waiter that could not use a wake someone behind it may use (a
 * semaphore's waiter of more permits than came back) hands it on; the
 * hand-off only goes backwards, so it ends. NULL when none (or W absent). */
struct dlock__wait *dlock__waitset_wake_after(struct dlock__waitset *ws,
                                              const struct dlock__wait *w);
/* Wake and mark every wait in the set; returns how many. */
size_t dlock__waitset_wake_all(struct dlock__waitset *ws);
/* Give W (in the set) the key KEY, what it waits for (NULL: none): a
 * string of the caller's that must outlive the key -- set another one
 * (or NULL) before freeing it, or remove W. */
void dlock__waitset_set_key(struct dlock__waitset *ws, struct dlock__wait *w, const char *key);
/* Wake and mark only the waits whose key equals KEY (the event of one
 * node wakes the one waiter watching it, no herd); returns how many. */
size_t dlock__waitset_wake_key(struct dlock__waitset *ws, const char *key);
/* True when W holds a wake (clears the mark). */
bool dlock__waitset_consume(struct dlock__waitset *ws, struct dlock__wait *w);
/* Waits in the set. */
size_t dlock__waitset_count(struct dlock__waitset *ws);
/* The longest-waiting wait in the set; NULL when empty. */
struct dlock__wait *dlock__waitset_first(struct dlock__waitset *ws);

/* ---------------------------------------------------------- cleanup queue */

/* Work a backend owes after an ambiguous reply: a create whose reply was
 * lost may have left a key or node behind that must be deleted, a release
 * that timed out may have to be sent again. The backend hands it to the
 * core and moves on; the keeper does it without a caller.
 *
 * dlock__cleanup_add(c, what, fn, arg, free_arg) queues one piece of work
 * (WHAT, copied, names it in messages: "delete /locks/x/_c_..-lock-7").
 * FN(bstate, arg, deadline) does it once: it must return by DEADLINE
 * (monotonic ms: take every request's timeout from dlock__time_left
 * (deadline, cap)), DLOCK_OK when the work is done or nothing is left to
 * do (the key is already gone), any other code to be retried later.
 * FN runs on the keeper thread (or in dlock_client_close), never with a
 * core lock held, never twice at once for one client. FREE_ARG(arg) (may
 * be NULL) runs once when the work is done or given up.
 *
 * The keeper drains the queue on each pass in a bounded slice -- at most
 * the op timeout and never past the next renewal due -- and retries a
 * failure after dlock__backoff (from 10 ms up to the op timeout).
 * dlock_client_close() stops the keeper, then runs every piece still
 * queued once more within one op timeout in all, then frees them: work
 * not done by then is given up (the lease reclaims what it left).
 * Any thread; takes the client's mutex (never call it while the core
 * calls you with it held: no core callback does). DLOCK_ENOMEM (arg is
 * then freed with FREE_ARG) or DLOCK_OK. */
typedef int (*dlock__cleanup_fn)(void *bstate, void *arg, int64_t deadline);
int dlock__cleanup_add(struct dlock_client *c, const char *what, dlock__cleanup_fn fn, void *arg,
                       void (*free_arg)(void *));

/* ----------------------------------------------------------------- names */

/* Encode NAME (any bytes) as one path segment: ASCII letters, digits, '-'
 * and '_' kept, and the bytes in KEEP; every other byte %XX, and so are
 * the dots of "." and "..". DLOCK__ENC_NO_LEADING_DOT also encodes a
 * leading '.' (no hidden files). Caller frees; NULL when out of memory. */
#define DLOCK__ENC_NO_LEADING_DOT 1u
char *dlock__name_encode(const char *name, const char *keep, unsigned flags);
/* Decode %XX escapes (bytes that are not a valid escape are kept). */
char *dlock__name_decode(const char *enc);
/* The value of one hex digit, -1 for any other character. */
int dlock__hexval(int ch);
/* "pid@host" of the calling process, the holder identity every backend
 * writes beside its locks. */
void dlock__identity(char *buf, size_t size);

/* ------------------------------------------------------------ log, misc */

/* While C closes, the deadline every step of dlock_client_close() shares
 * (the keeper's cleanup slices and a backend's close included): one op
 * timeout from its start, so that close spends at most one bounded
 * attempt on what it owes and leaves the rest to the lease. Before
 * closing (or in a child after fork): DLOCK__NEVER. Any thread. */
int64_t dlock__close_deadline(const struct dlock_client *c);

/* Tell C's log hook, if it wants LEVEL (dlock_log_level), the message
 * FMT... Cheap when off. Any thread, any lock held; the calling thread's
 * message is left alone. */
void dlock__log(struct dlock_client *c, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A backend's connection or session came back after breaking: counted
 * (stats.reconnects) and logged at DLOCK_LOG_INFO with FMT... */
void dlock__reconnected(struct dlock_client *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The calling thread's id (Linux tid). */
long dlock__tid(void);
/* pthread_create() of MAIN(ARG) into *T with every signal blocked in the
 * new thread: the program's handlers run in its own threads, never in
 * the library's. 0 or pthread_create's error. */
int dlock__thread_start(pthread_t *t, void *(*main)(void *), void *arg);
/* This process's id, without a system call: cached, and refreshed in a
 * child by a pthread_atfork handler. */
pid_t dlock__pid(void);
/* How many fork()s separate this process from the one that loaded the
 * library: 0 there, one more in each child (a pthread_atfork handler
 * counts). A client or cancel object records it when made; a different
 * value later means "used in a child after fork()" -- a load, not a
 * getpid() per request. A child made without the fork handlers (a raw
 * clone(), _Fork()) is not seen, as it runs none of the library's. */
uint64_t dlock__fork_gen(void);

/* The file backend's default directory (backends/file/dir.c says which
 * and why; nothing is made here) into *OUT (caller frees): the URL with
 * no URL given is file://<it>. */
int dlock__file_default_dir(char **out);

/* Small helpers used by several backends. */
char *dlock__strdup(const char *s);
char *dlock__sprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Fill BUF (37 bytes) with a random version-4 UUID string. */
void dlock__uuid(char buf[37]);
/* fnmatch()-style glob test; NULL pattern matches everything. */
bool dlock__glob(const char *pattern, const char *name);

/* The longest duration any option or lease may have: a year, in ms. */
#define DLOCK__MAX_DURATION_MS (365LL * 86400000)

/* ------------------------------------------- client libraries (dlsym.c) */

/* A client library loaded with dlopen() when a backend first needs it
 * (dlsym.c says why): SONAME, and the function pointers SYMS[i].slot set
 * to the symbols SYMS[i].name; then INIT, if any, is called once. */
struct dlock__dl_sym {
    void **slot;
    const char *name;
};
struct dlock__dl_lib {
    const char *soname;  /* "libcurl.so.4" */
    const char *user;    /* "the etcd backend", for the message */
    const char *package; /* what to install, e.g. "libcurl4" */
    const struct dlock__dl_sym *syms;
    size_t nsyms;
    void (*init)(void);
    bool tried;      /* (dlsym.c's own state, under its lock) */
    char error[256]; /* why it could not be loaded; "" */
};
/* Load LIB once (thread-safe; later calls return the first answer).
 * DLOCK_OK, or DLOCK_ENOTBUILT with a message naming the library, why it
 * failed (dlerror(), or the missing symbol) and the package to install. */
int dlock__dl_load(struct dlock__dl_lib *lib);
/* The initializer of a struct dlock__dl_lib for the symbol table SYMS
 * (an array). */
#define DLOCK__DL_LIB(soname_, user_, package_, syms_, init_)                                 \
    {                                                                                        \
        .soname = soname_, .user = user_, .package = package_, .syms = syms_,                \
        .nsyms = sizeof syms_ / sizeof *syms_, .init = init_,                                \
    }

#endif /* DLOCK_TOOLBOX_H */
