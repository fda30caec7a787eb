/* core.h -- what the core shares with the backends, and nothing public.
 *
 * The core (the files in src/) owns everything every backend would otherwise write
 * again: URL parsing, options, the per-name registry with per-thread
 * reentrancy, local queueing for backends whose holds belong to the whole
 * client, deadline arithmetic, cancellation, the keeper thread that renews
 * leases in batches and declares holds lost, and error messages.
 *
 * A backend is a folder under src/backends/ defining one
 * `const struct dlock__backend`: its identity, open/close, renewal, and
 * one small table of ops per primitive (locks, multi-locks, semaphores,
 * elections, administration). Every backend is compiled in, so the
 * tables carry no version: what a backend cannot do is a NULL table or
 * member, which the core answers with DLOCK_ENOTSUP before calling
 * anything. Backends do I/O; the core does bookkeeping.
 */
#ifndef DLOCK_CORE_H
#define DLOCK_CORE_H

#include <pthread.h>
#include <stdbool.h>
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
    char *redacted; /* the URL with any password replaced by nothing */
};

int dlock__url_parse(const char *text, struct dlock__url *u);
void dlock__url_free(struct dlock__url *u);
/* Value of query parameter KEY, marking it used; NULL when absent. */
const char *dlock__url_param(struct dlock__url *u, const char *key);

/* ---------------------------------------------------------------- options */

struct dlock__opts {
    int64_t lease_ms, connect_timeout_ms, op_timeout_ms, drift_ms;
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
    struct dlock_cancel *cancel; /* the acquire's cancel object (core's) */
    struct dlock__wait *next; /* the handle's list of waits */
    bool slept; /* the acquire slept at least once (dlock_stats.waits) */
};

unsigned dlock__wait_seq(struct dlock__wait *w);
void dlock__wait_wake(struct dlock__wait *w);
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

/* ----------------------------------------------------------------- holds */

enum dlock__hold_state { DLOCK__HELD, DLOCK__LOST };

/* One thread's hold on one name (or, for backends with
 * DLOCK__CAP_CLIENT_OWNER, the client's hold lent to one thread). */
struct dlock__hold {
    struct dlock__entry *entry;
    const char *name;  /* the lock name (without key prefix) */
    dlock_mode mode;
    long tid;          /* the holding thread */
    unsigned count;    /* reentrancy */
    unsigned shared_levels; /* EXCLUSIVE hold: levels of COUNT re-entered
                               through shared handles, kept as a shared
                               hold when the last exclusive level goes */
    uint64_t token;    /* fencing token, set by the backend's acquire */
    int64_t lease_ms;  /* 0 = no lease */
    bool fixed_lease;  /* never renewed */
    int64_t valid_until; /* monotonic ms; DLOCK__NEVER without lease */
    int64_t renew_at;    /* monotonic ms of the next renewal */
    enum dlock__hold_state state;
    bool lost_reported;  /* the callback ran (or is running) */
    char *lost_why;
    bool renewing;       /* handed to the backend's renew() right now */
    struct dlock_lock *via; /* the handle it was taken through */
    void *bdata;         /* backend's own per-hold data */
    char owner[96];      /* backend's owner identity for this hold */
    struct dlock__hold *next; /* entry's list */
    /* Appended fields. */
    const struct dlock__sem_req *sem; /* a semaphore's permits, NULL for a
                                         lock: the core then calls the
                                         backend's semaphore ops, and
                                         renew() must renew it as one */
    const struct dlock__elect_req *elect; /* a campaign (election.c), NULL
                                         for a lock: the core then calls the
                                         backend's election ops */
    bool fair; /* taken through a DLOCK_LOCK_FAIR handle (backends with
                  DLOCK__CAP_FAIR whose order is chosen per lock: redis) */
    bool give_back; /* given up by dlock__release_within() while renew()
                       had it: the keeper gives it back (release_within,
                       nothing sent, the rest owed) once renew() returns;
                       no owner finds it meanwhile (dlock__hold_of) */
};

/* What a campaign's hold asks of the backend (election.c): lead election
 * h->name with VALUE, written where observers read it. */
struct dlock__elect_req {
    char *value;
};

/* An election's leader as an observer sees it (dlock_election_leader()).
 * HELD false: nobody leads (the other fields are zero). VERSION changes
 * with every proclaim (etcd: the key's mod revision; file: a counter). */
struct dlock_leader {
    bool held;
    uint64_t token;
    uint64_t version;
    char *value; /* malloc'd ("" when the leader wrote none) */
    char id[96]; /* the leader's identity (pid@host, the etcd key...) */
};
/* Whether A and B describe the same leader with the same value. */
bool dlock__leader_same(const struct dlock_leader *a, const struct dlock_leader *b);
/* The rule of every backend's election observe loop, after a look that read
 * OUT (CONSISTENT false while a new leader has not written its value
 * yet): true when the loop is done, with *RC DLOCK_OK for a leader other
 * than KNOWN (any leader when KNOWN is NULL), or DLOCK_ETIMEDOUT when W
 * is a try-once wait and the leader is still KNOWN; false: wait for a
 * change and look again. */
bool dlock__observe_done(const struct dlock_leader *known, const struct dlock_leader *out,
                         bool consistent, const struct dlock__wait *w, int *rc);
/* The one retry rule of every backend's election observe loop, after a look
 * (or a watch, a session) that returned *RC: true when it is to be tried
 * again now -- *RC is transient (DLOCK_ECONN: refused, reset, no reply;
 * DLOCK_EUNAVAIL: a server loading, no leader or quorum), the observer
 * follows a change (KNOWN not NULL, W no try-once wait) and the pause of
 * B's next delay (dlock__wait_retry) ended before W's deadline or cancel.
 * False: *RC stands -- DLOCK_OK (B is reset), a permanent error, the
 * transient error once W's deadline has passed (with its message), or
 * DLOCK_ECANCELED. B starts as DLOCK__OBSERVE_BACKOFF. */
#define DLOCK__OBSERVE_BACKOFF {.min_ms = 10, .max_ms = 1000}
bool dlock__observe_retry(const struct dlock_leader *known, struct dlock__wait *w,
                          struct dlock__backoff *b, int *rc);

/* What a semaphore hold asks of the backend (semaphore.c): K of the
 * semaphore's PERMITS. The backend keeps its ids in h->owner (the first
 * one; derive the others) and h->bdata. */
struct dlock__sem_req {
    unsigned permits; /* the semaphore's count, checked against the stored one */
    unsigned k;       /* permits this hold takes, 1..permits */
};

/* One keeper pass's renewals, handed to the backend's renew(). Fields
 * are only appended. */
#define DLOCK__WHY_MAX 256
struct dlock__renew_batch {
    struct dlock__hold **holds;
    size_t n;
    int64_t deadline;            /* answer by then (monotonic ms) */
    int *result;                 /* per hold, preset to DLOCK_EIO */
    char (*why)[DLOCK__WHY_MAX]; /* per hold: the reason of a failure */
};

/* Record RC as hold K's result, and the calling thread's message as its
 * reason when RC is a failure. Returns RC. */
int dlock__renew_result(struct dlock__renew_batch *b, size_t k, int rc);

/* Set by the backend's acquire or renew: the request confirming the hold
 * was sent at SENT_MS (monotonic); validity runs from there. */
void dlock__hold_confirmed(struct dlock_client *c, struct dlock__hold *h, int64_t sent_ms);
/* The same for a backend whose holds last what the server granted rather
 * than the lease asked for (zk: the negotiated session timeout): H's
 * lease becomes LEASE_MS (> 0) from now on. */
void dlock__hold_confirmed_lease(struct dlock_client *c, struct dlock__hold *h, int64_t sent_ms,
                                 int64_t lease_ms);

/* The same for a hold the server granted for GRANTED_MS only, less than
 * its lease (a fair lock handed to a waiter: no longer than the waiter
 * was known alive): valid that long from SENT_MS, and renewed by the
 * keeper at a third of it, off the caller's path, which extends it to
 * the lease (a fixed lease too, once) or reports it lost. GRANTED_MS >=
 * the lease: as dlock__hold_confirmed(). */
void dlock__hold_confirmed_short(struct dlock_client *c, struct dlock__hold *h, int64_t sent_ms,
                                 int64_t granted_ms);

/* A backend learned that H (or, with h == NULL, every hold of the client:
 * a ZooKeeper session expired) is gone: report it at once instead of at
 * the next renewal. Marks the hold lost with WHY (copied), so validity is
 * 0 and its release returns DLOCK_ELOST, and has the keeper queue its lost
 * callback (the keeper is started if need be). Any thread, including the
 * backend's own (watcher, subscriber) and the core's calls into the
 * backend (acquire, release, renew: the core holds no lock then); takes
 * the client's mutex, and leaves the calling thread's message alone.
 * H is matched against the holds registered now and never read
 * otherwise: a hold still being acquired is not registered yet (fail that
 * acquire instead) and a released one no longer, so a report that races
 * with a release is ignored. Holds already lost are left as they are. */
void dlock__hold_lost(struct dlock_client *c, struct dlock__hold *h, const char *why);

/* ------------------------------------------------------------ inspecting */

struct dlock__who {
    char *id;
    unsigned count;
};

struct dlock_info {
    int held;
    dlock_mode mode;
    uint64_t token;
    int64_t ttl_ms;
    char *key;
    struct dlock__who *holders;
    size_t nholders;
    char **waiters;
    long nwaiters; /* -1 unknown */
    /* Appended: semaphores (0 / -1 for a lock). */
    unsigned permits;
    long free_permits; /* -1 unknown */
};

int dlock__info_set_key(struct dlock_info *i, const char *key);
int dlock__info_add_holder(struct dlock_info *i, const char *id, unsigned count);
int dlock__info_add_waiter(struct dlock_info *i, const char *id);

/* --------------------------------------------------------------- backends */

/* What a backend's functions cannot say by being there. Whether it can
 * do an operation at all is its function pointer in one of the tables
 * below (a NULL table or member: the core answers DLOCK_ENOTSUP with a
 * message before calling anything, or falls back). A bit says how it
 * does what it does. */
enum {
    DLOCK__CAP_SHARED = 1u << 0,       /* shared mode */
    DLOCK__CAP_FAIR = 1u << 1,         /* first come, first served */
    DLOCK__CAP_LEASES = 1u << 2,       /* holds expire unless renewed */
    DLOCK__CAP_CLIENT_OWNER = 1u << 3, /* the server sees one owner per
        client and name (etcd lease, zk session): the core queues threads
        of the client locally so only one of them goes to the backend */
    DLOCK__CAP_FIXED_LEASE = 1u << 4, /* a hold can have a lease nothing
        renews (DLOCK_LEASE_FIXED); without it the core refuses one (zk:
        a hold lasts as long as the session). Backends without leases set
        it: a fixed lease is then simply unused, as every lease is. */
};

/* Locks: plain exclusive or shared holds (h->sem and h->elect NULL).
 * acquire and release are every backend's; the rest may be NULL. */
struct dlock__lock_ops {
    /* Take H->name in H->mode for the calling thread, waiting as W says
     * (w->deadline 0 = try once). On DLOCK_OK set h->token and h->owner,
     * h->bdata if needed, and call dlock__hold_confirmed() (leases).
     * Otherwise nothing may stay held on the server: EBUSY, ETIMEDOUT,
     * ECANCELED or a failure with a message. */
    int (*acquire)(void *state, struct dlock__hold *h, struct dlock__wait *w);

    /* Give H up on the server. DLOCK_ELOST when it was no longer ours.
     * Free h->bdata. */
    int (*release)(void *state, struct dlock__hold *h);

    /* Give H (a plain lock's hold of one level, exclusive or shared) up
     * as release() does, but within DEADLINE (monotonic ms; one already
     * past: send nothing) -- the give-back of a multi-lock's members when
     * its wait ends, which must end at the wait's end even while the
     * server stalls. What the server did not answer by then is owed to
     * the cleanup queue (the keeper sends it), and an owed give-back must
     * never end a later hold of the same owner on H->name. DLOCK_OK when
     * given back or owed, DLOCK_ELOST as release(). Frees h->bdata.
     * NULL: release(), with its own timeout. */
    int (*release_within)(void *state, struct dlock__hold *h, int64_t deadline);

    /* Turn exclusive hold H into a shared one on the server with no
     * moment unlocked (the owner released its last exclusive level and
     * keeps shared ones: dlock.h "Modes and owners"); wake the waiters
     * that may now share it. H->mode is still DLOCK_EXCLUSIVE; the core
     * sets DLOCK_SHARED after DLOCK_OK. The keeper does not renew H
     * meanwhile. DLOCK_ELOST when H was no longer ours; any other failure
     * leaves H exclusive on the server. NULL: holds stay exclusive until
     * their last level is released. */
    int (*downgrade)(void *state, struct dlock__hold *h);

    /* Exclusive hold H just gained its first shared level (the owner
     * re-entered it through a shared handle): a downgrade may follow,
     * and a backend whose layout must prepare for it now (zk: a read
     * node queued right behind the write node, before any other writer
     * can come between) does so. Best effort: the result is only a hint,
     * a failure leaves the downgrade to do without. Called with no core
     * lock held; the keeper does not renew H meanwhile. NULL: nothing to
     * prepare. */
    void (*share)(void *state, struct dlock__hold *h);

    /* For dlock_lock_inherit_fd(): a new descriptor of H's kernel lock
     * without close-on-exec, which a child keeps across exec; from then
     * on H's release only closes. -1 with a message on failure. Called
     * with the client's mutex held. NULL: no hold of this backend is a
     * kernel lock (only the file backend's is). */
    int (*inherit_fd)(void *state, struct dlock__hold *h);
};

/* Multi-locks (multi.c): a set of plain holds taken or given up in one
 * request. NULL table or member: member by member. */
struct dlock__multi_ops {
    /* One attempt at the holds HS[0..N) (a multi-lock's members, N >= 2,
     * distinct names in the canonical order, one mode, each with its own
     * owner h->tid) all or nothing, in one request where the layout
     * allows it. Each hold as the lock ops' acquire() would take it: on
     * DLOCK_OK every one has its token and owner and was confirmed. It
     * never waits for a busy member: DLOCK_EBUSY with *BUSY the index of
     * one held elsewhere, nothing taken. W bounds the requests (its
     * deadline; a try-once W: the op timeout) and cancels them; the core
     * waits, if the caller wants to, member by member. DLOCK_ENOTSUP,
     * nothing sent or nothing left: this set cannot be taken at once (a
     * mode, lease or key placement the request cannot cover); the core
     * then takes it member by member. Any other failure leaves nothing
     * held, as acquire(). */
    int (*acquire)(void *state, struct dlock__hold **hs, size_t n, struct dlock__wait *w,
                   size_t *busy);

    /* Give up the holds HS[0..N) (a multi-lock's members, N >= 2,
     * distinct names in the canonical order, plain exclusive or shared
     * holds of one level) in one request where the layout allows it,
     * each checked against its own owner and token as release() checks
     * it, its waiters woken as release() wakes them. RCS[k]: each
     * member's result as release() would give it (DLOCK_ELOST for one no
     * longer ours, the others still released; a lost reply handled as
     * release() handles it), the message that of the last member that
     * failed; return DLOCK_OK when sent, else a failure copied into RCS.
     * Frees each h->bdata. DLOCK_ENOTSUP, nothing sent and nothing freed:
     * this set cannot be given up at once, and the core calls release()
     * for each member. */
    int (*release)(void *state, struct dlock__hold **hs, size_t n, int *rcs);
};

/* Counting semaphores (semaphore.c; NULL table or one of acquire,
 * release, inspect: none, and dlock_semaphore_new() answers
 * DLOCK_ENOTSUP). The core calls them only for holds with h->sem set,
 * with the rules of the lock ops' acquire/release; the backend's renew()
 * receives such holds too. */
struct dlock__sem_ops {
    /* Take h->sem->k of the semaphore h->name's permits (all or none),
     * check h->sem->permits against the stored count (DLOCK_EINVAL naming
     * both), set h->owner to the permit's id and h->token. */
    int (*acquire)(void *state, struct dlock__hold *h, struct dlock__wait *w);
    int (*release)(void *state, struct dlock__hold *h);
    /* Fill INFO (permits, free_permits, a holder per permit object);
     * PERMITS 0 = no count to check. */
    int (*inspect)(void *state, const char *name, unsigned permits, struct dlock_info *info);
    /* FN for each semaphore name matching PATTERN (fnmatch; NULL all) the
     * backend knows, at least every one with a permit held; names nobody
     * holds may come too (the caller inspects). NULL: semaphores are not
     * enumerated. */
    int (*list)(void *state, const char *pattern, dlock_list_fn fn, void *arg);
};

/* Leader election (election.c; NULL table or member: none, and
 * dlock_election_new() answers DLOCK_ENOTSUP). A campaign is an
 * exclusive hold with h->elect set: acquire/release follow the lock ops'
 * rules (and renew() receives such holds), and acquire makes
 * h->elect->value the leader's value when it wins. */
struct dlock__elect_ops {
    int (*acquire)(void *state, struct dlock__hold *h, struct dlock__wait *w);
    int (*release)(void *state, struct dlock__hold *h);
    /* Replace the value of H, which leads: DLOCK_ELOST when it no longer
     * does. */
    int (*proclaim)(void *state, struct dlock__hold *h, const char *value);
    /* Read election NAME's leader into OUT (zeroed by the core; the
     * backend mallocs out->value): at once when W is a try-once wait or
     * KNOWN is NULL, else when the leader or its value differs from KNOWN
     * (dlock__leader_same), sleeping until the backend reports a change
     * (never on a timer): DLOCK_ETIMEDOUT, DLOCK_ECANCELED as W says. */
    int (*observe)(void *state, const char *name, const struct dlock_leader *known,
                   struct dlock__wait *w, struct dlock_leader *out);
};

/* Administration (info.c, client.c): looking at names without taking
 * them. NULL member: the core answers DLOCK_ENOTSUP. */
struct dlock__admin_ops {
    /* Fill INFO for NAME (the plain lock name; the backend applies
     * c->opts.key_prefix as it does in acquire). */
    int (*inspect)(void *state, const char *name, struct dlock_info *info);
    int (*force_release)(void *state, const char *name);
    int (*list)(void *state, const char *pattern, dlock_list_fn fn, void *arg);
    /* The master the client talks to now as "host:port" in BUF of SIZE
     * bytes (redis+sentinel://: asked of the sentinels when unknown or
     * stale); DLOCK_ENOTSUP for a URL without one. NULL: none on this
     * backend. */
    int (*master)(void *state, char *buf, size_t size);
};

/* A backend: its identity, open/close, the renewal of every kind of
 * hold, and one table per primitive. Every backend is compiled in, so
 * there is no version: a member a backend does not have is NULL. */
struct dlock__backend {
    const char *name; /* "file", "redis", ... */
    const char *const *schemes; /* NULL-terminated URL schemes */
    unsigned caps;
    int default_port; /* used when a host has none; 0 = no hosts */

    /* Validate c->url and c->opts, consume own URL params, connect. On
     * success set *state. Errors name the URL (dlock_client_url(c)). */
    int (*open)(struct dlock_client *c, void **state);
    /* Disconnect and free. Holds are already released. */
    void (*close)(void *state);

    /* Renew B->n leases -- holds of every kind: locks, permits,
     * campaigns -- in as few round trips as possible, answering by
     * B->deadline (monotonic ms, the earliest validity deadline of the
     * batch, computed by the core; DLOCK__NEVER when none): no request may
     * outlive it. Set B->result[k] with dlock__renew_result(): DLOCK_OK
     * (after dlock__hold_confirmed), DLOCK_ELOST (the hold is gone; the
     * message at that moment becomes the hold's reason) or another error
     * (transient: the core keeps trying until the validity deadline).
     * Called from the keeper thread only, with no core lock held; the
     * backend never reads the core's fields of the holds (valid_until,
     * renew_at...). NULL without leases. */
    int (*renew)(void *state, struct dlock__renew_batch *b);

    const struct dlock__lock_ops *locks;
    const struct dlock__multi_ops *multi;
    const struct dlock__sem_ops *semaphores;
    const struct dlock__elect_ops *elections;
    const struct dlock__admin_ops *admin;

    /* Without semaphores, why (for the message of dlock_semaphore_new()'s
     * DLOCK_ENOTSUP); NULL: "no semaphores yet". */
    const char *no_semaphores_why;
};

/* Member M of table T of backend BE, NULL when the backend has no such
 * table: what the core tests before it calls an op that may be missing. */
#define DLOCK__OP(be, t, m) ((be)->t ? (be)->t->m : NULL)

/* The dispatch (dispatch.c), the one place that chooses a hold's ops by
 * its kind: the backend's acquire of H -- the semaphore ops' for a
 * permit (h->sem), the election ops' for a campaign (h->elect), else the
 * lock ops'. */
int dlock__backend_acquire(struct dlock_client *c, struct dlock__hold *h, struct dlock__wait *w);

/* The backend's release of H, chosen as dlock__backend_acquire() does. */
int dlock__backend_release(struct dlock_client *c, struct dlock__hold *h);

/* Release L (release.c) as dlock_release() does, but a plain hold's last
 * level within DEADLINE where the lock ops have release_within (the rest
 * is owed to the keeper); DLOCK__NEVER, or any other hold: dlock_release().
 * A hold lost before is DLOCK_ELOST, also when the keeper's renewal of it
 * is under way and the keeper is left to give it back. */
int dlock__release_within(struct dlock_lock *l, int64_t deadline);
/* Whether L's owner holds L's name only as a hold marked lost, or past
 * its validity deadline (not held for sure; false when nothing is held). */
bool dlock__lock_lost(struct dlock_lock *l);
/* The keeper, once renew() returned H marked give_back: end H as
 * dlock__release_within() would have, owing what is not sent (mutex
 * held; dropped meanwhile). */
void dlock__hold_give_back(struct dlock_client *c, struct dlock__hold *h);

/* ---------------------------------------------------------------- clients */

struct dlock__entry; /* the registry's per-name record (registry.c) */

struct dlock_client {
    const struct dlock__backend *be;
    void *bstate;
    struct dlock__url url;
    struct dlock__opts opts;
    pid_t pid; /* the creating process: fork detection */
    bool connected;

    pthread_mutex_t mu; /* registry, holds, keeper state */
    struct dlock__entry **buckets; /* name -> entry */
    size_t nholds;                 /* holds with a lease, for the keeper */
    pthread_cond_t renew_cv;       /* a renew() finished (CLOCK_MONOTONIC) */

    /* keeper */
    pthread_t keeper;
    bool keeper_running, keeper_stop;
    pthread_cond_t keeper_cv; /* CLOCK_MONOTONIC */
    int64_t keeper_asleep_until; /* while the keeper waits: its next pass; 0 = awake */

    /* cleanup queue (cleanup.c), under mu */
    struct dlock__cleanup *cleanup_head, *cleanup_tail;

    /* lost callbacks' thread (callbacks.c), under mu */
    struct dlock__callbacks {
        pthread_t thread;
        bool running, stop;
        pthread_cond_t cv; /* a call queued, a call ended, stop */
        struct dlock__lost_call *head, *tail;
        struct dlock_lock *current; /* whose callback runs now */
    } cb;

    /* lifetime: the client's own reference (dropped by close), one per
     * handle, and the callback thread's; the last one frees (atomic) */
    unsigned refs;
    bool closed; /* dlock_client_close() began: every call but freeing
                    handles is DLOCK_EMISUSE */

    /* observability (observe.c): the log hook under log_mu (log_level
     * also read without it, atomically), counters updated atomically */
    pthread_mutex_t log_mu;
    dlock_log_fn log_fn;
    void *log_arg;
    int log_level; /* 0: off */
    dlock_stats stats;
};

/* Tell C's log hook, if it wants LEVEL (dlock_log_level), the message
 * FMT... Cheap when off. Any thread, any lock held; the calling thread's
 * message is left alone. */
void dlock__log(struct dlock_client *c, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A backend's connection or session came back after breaking: counted
 * (stats.reconnects) and logged at DLOCK_LOG_INFO with FMT... */
void dlock__reconnected(struct dlock_client *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Add N to the counter at FIELD of C's stats (atomic). */
#define DLOCK__COUNT(c, field, n) __atomic_add_fetch(&(c)->stats.field, (n), __ATOMIC_RELAXED)

/* The calling thread's id (Linux tid). */
long dlock__tid(void);

/* The file backend's default directory (client.c says which; caller
 * frees). */
char *dlock__default_dir(void);

/* Find the backend for SCHEME: NULL with DLOCK_EBADURL/ENOTBUILT set. */
const struct dlock__backend *dlock__backend_find(const char *scheme, int *err);

/* Check the caller is the process that made C (fork). */
int dlock__check_client(const struct dlock_client *c);

/* Start the keeper thread if not running (client mutex held). */
int dlock__keeper_start(struct dlock_client *c);
void dlock__keeper_stop(struct dlock_client *c);
/* Wake the keeper only if new hold H is due before its next pass (mutex
 * held): a new hold then costs no keeper wake-up in the common case. */
void dlock__keeper_kick_for(struct dlock_client *c, const struct dlock__hold *h);

/* Small helpers used by several backends. */
char *dlock__strdup(const char *s);
char *dlock__sprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Fill BUF (37 bytes) with a random version-4 UUID string. */
void dlock__uuid(char buf[37]);
/* fnmatch()-style glob test; NULL pattern matches everything. */
bool dlock__glob(const char *pattern, const char *name);

/* ---------------------------------------------------------- URL options */

/* The URL query options SCHEME's backend reads itself (NULL-terminated;
 * never NULL), kept in src/backends.c beside the scheme so the core can
 * refuse an unknown option before the backend dials anything. A backend
 * that reads a new option with dlock__url_param() adds it there. */
const char *const *dlock__backend_params(const char *scheme);
/* Whether KEY is a URL option for SCHEME: one the core reads (lease,
 * timeout, prefix, user, password, tls_*...) or one of the backend's. */
bool dlock__option_known(const char *scheme, const char *key);
/* The longest duration any option or lease may have: a year, in ms. */
#define DLOCK__MAX_DURATION_MS (365LL * 86400000)

/* ------------------------------------------------------------ dlsym.c */

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

#endif /* DLOCK_CORE_H */
