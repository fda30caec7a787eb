/* backend.h -- what a backend implements, and what the core tells it.
 *
 * A backend is a folder under src/backends/ defining one
 * `const struct dlock__backend`: its identity, open/close, the renewal
 * of every kind of hold, and one small table of ops per primitive
 * (locks, multi-locks, semaphores, elections, administration). Every
 * backend is compiled in, so the tables carry no version: what a
 * backend cannot do is a NULL table or member, which the core answers
 * with DLOCK_ENOTSUP before calling anything. Beside the tables: the
 * hold the ops take and give up, what a semaphore's or a campaign's hold
 * asks, the keeper's renew batch, the inspect snapshot, the calls by
 * which a backend confirms a hold or reports it lost, and the client as
 * a backend sees it (it reads c->url, c->opts, c->pid and c->fork_gen; the rest is
 * the core's). The tools a backend uses are toolbox.h's. Backends do
 * I/O; the core does bookkeeping.
 */
#ifndef DLOCK_BACKEND_H
#define DLOCK_BACKEND_H

#include "toolbox.h"

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
    int64_t valid_for;   /* the validity the last confirmation granted (ms) */
    bool at_risk;        /* told at risk, and no renewal has lifted it
                            above the margin since (callbacks.c) */
    char *renew_why;     /* the last renewal failure since that
                            confirmation, NULL: none */
    bool renewing;       /* handed to the backend's renew() right now */
    struct dlock_lock *via; /* the handle it was taken through */
    void *bdata;         /* backend's own per-hold data */
    char owner[96];      /* backend's owner identity for this hold */
    struct dlock__hold *next; /* entry's list */
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
    char **contenders;  /* the waiters its handle was told of (callbacks.c),
                           oldest first; NULL: none */
    size_t ncontenders;
    struct dlock__hold *pending_next; /* the client's contend_pending list */
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

/* One keeper pass's renewals, handed to the backend's renew(). */
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
/* The same for an acquire whose grant was answered now to a request
 * sent at SENT_MS, on a backend whose server starts a hold's lease when
 * it grants (a session's idle timeout): validity runs from the send --
 * the grant came later -- but only when the answer came within a third of
 * H's lease. Later (a wait), the server may have granted long before the
 * client read it (a paused process) and even ended the hold since:
 * RECONFIRM(ARG) asks the server once more that the hold is still there,
 * and validity runs from that request's send. RECONFIRM's failure is
 * returned, with nothing confirmed (the backend ends what it took);
 * DLOCK_OK once the hold is confirmed. */
int dlock__hold_granted(struct dlock_client *c, struct dlock__hold *h, int64_t sent_ms,
                        int (*reconfirm)(void *arg), void *arg);
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

/* A backend watching hold H for waiters (its contend ops) saw WHO (the
 * waiter's id: a node, a key, a wait) waiting for it: the core tells H's
 * handle once per WHO (dlock_lock_on_contended()). Any thread, the
 * backend's own included, with no backend lock the core's callbacks
 * could need; takes the client's mutex. H is matched, with TOKEN (the
 * hold's h->token), against the holds registered now and never read
 * otherwise, as dlock__hold_lost() does. WHO NULL: only ask. Returns
 * whether H is still held and registered: false tells the backend to
 * stop watching it (released, lost, or not yet registered). */
bool dlock__hold_contended(struct dlock_client *c, const struct dlock__hold *h, uint64_t token,
                           const char *who);

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
    /* Semaphores (0 / -1 for a lock). */
    unsigned permits;
    long free_permits; /* -1 unknown */
    int64_t delay_ms; /* lock-delay left (dlock_info_delay_ms); 0: none */
};

/* What a backend saw of a name for dlock_check() (admin ops' check). */
struct dlock__check_view {
    bool held;
    uint64_t token; /* the newest hold's; 0: none known */
    bool reader_unknown; /* held shared, TOKEN the counter's: whether the
                            reader that took it still holds is not kept
                            (file, redis: one counter, no token per reader) */
};

int dlock__info_set_key(struct dlock_info *i, const char *key);
int dlock__info_add_holder(struct dlock_info *i, const char *id, unsigned count);
/* One more of ID's units (a semaphore's permits, by permit object): its
 * holder's count + 1, or a new holder of 1. */
int dlock__info_count_holder(struct dlock_info *i, const char *id);
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
    DLOCK__CAP_LOCK_DELAY = 1u << 5, /* honours c->opts.lock_delay_ms: an
        exclusive lock hold that ends without a clean release leaves a
        marker the backend times, and every acquire of the name (with the
        option or not) is refused until it is gone (DLOCK_EBUSY for a try,
        a sleep until its end otherwise). Without it the core refuses the
        option at connect. A backend whose layout cannot keep it (redis
        fair, Redlock) refuses it itself in open(). */
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

    /* The asynchronous acquire's attempt (async.c), which parks its wait
     * between attempts instead of sleeping in a thread: one attempt at H
     * that never sleeps. The first call (*PARK NULL) arms the wake-up
     * first -- W registered where a release of H->name reaches it with
     * dlock__wait_wake(): a subscription, a watch -- and sets *PARK to
     * what disarm() undoes (it may set it even when failing). DLOCK_OK as
     * acquire(); DLOCK_EBUSY: still held, W armed, a wake or W's retry
     * time (dlock__wait_retry_at) brings the next attempt; any other
     * code: a failure, nothing held. W's deadline bounds each request.
     * NULL: the backend's waiting acquires need a thread (the core then
     * answers an asynchronous acquire that may wait with DLOCK_ENOTSUP;
     * DLOCK_TRY goes through acquire()). */
    int (*try_armed)(void *state, struct dlock__hold *h, struct dlock__wait *w, void **park);

    /* The end of an asynchronous acquire that called try_armed(): undo
     * the wake-up's registration and free PARK (NULL: nothing armed).
     * RC is the acquire's outcome (DLOCK_OK: H is held); returns it,
     * or a better-worded failure in its place (an outage that outlived
     * the wait). Called once, from a core thread, no core lock held. */
    int (*disarm)(void *state, struct dlock__hold *h, struct dlock__wait *w, void *park, int rc);

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
    /* The asynchronous acquire's attempt and its end, for permits: the
     * lock ops' try_armed() and disarm() rules, H a permit's hold. NULL:
     * a permit's waiting asynchronous acquire needs a thread (the core
     * answers it DLOCK_ENOTSUP; DLOCK_TRY goes through acquire()). */
    int (*try_armed)(void *state, struct dlock__hold *h, struct dlock__wait *w, void **park);
    int (*disarm)(void *state, struct dlock__hold *h, struct dlock__wait *w, void *park, int rc);
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
    /* The asynchronous campaign's attempt and its end: the lock ops'
     * try_armed() and disarm() rules, H a campaign's hold, and on
     * DLOCK_OK h->elect->value written as acquire() writes it (a write
     * that fails gives the hold back: nothing stays). NULL: a waiting
     * asynchronous campaign needs a thread (the core answers it
     * DLOCK_ENOTSUP naming the backend; DLOCK_TRY goes through
     * acquire()). */
    int (*try_armed)(void *state, struct dlock__hold *h, struct dlock__wait *w, void **park);
    int (*disarm)(void *state, struct dlock__hold *h, struct dlock__wait *w, void *park, int rc);
};

/* A lock's value (value.c): what a lock's holder wrote for the name, as
 * stored beside the lock. get() fills one (DATA malloc'd by the backend,
 * LEN bytes and a NUL after them); set() writes what the caller gives. */
struct dlock__value {
    char *data;
    size_t len;
    uint64_t token; /* the hold that wrote it; 0: no value (LEN 0, DATA NULL) */
};

/* The stored form of V written by the hold of TOKEN where a backend keeps
 * a value as one blob (etcd, zk): TOKEN in decimal, a newline, the bytes.
 * dlock__value_encode(): malloc'd, its length into *LEN (NULL: out of
 * memory). dlock__value_decode(): TEXT's LEN bytes into OUT (data
 * malloc'd), false when they are no such form or out of memory. */
char *dlock__value_encode(const struct dlock__value *v, uint64_t token, size_t *len);
bool dlock__value_decode(const char *text, size_t len, struct dlock__value *out);
/* dlock__value_decode() of data of at most MAX bytes (a guarded key's:
 * DLOCK_GUARDED_MAX). */
bool dlock__value_decode_max(const char *text, size_t len, size_t max, struct dlock__value *out);

/* Lock values (value.c; NULL table or member: the core answers
 * DLOCK_ENOTSUP naming the backend before calling anything). The core
 * calls set() only for an exclusive plain lock hold (h->sem and h->elect
 * NULL) that it has not seen lost, with the keeper kept off it
 * (h->renewing) and the owner not releasing it. */
struct dlock__value_ops {
    /* Write V->len bytes at V->data with h->token (V NULL: clear the
     * value) as h->name's value, in one request atomic with the check
     * that H is still the server's holder: DLOCK_ELOST with nothing
     * written when it is not. DLOCK_ENOTSUP with a message when this URL
     * form cannot check it (redlock). */
    int (*set)(void *state, struct dlock__hold *h, const struct dlock__value *v);
    /* Read NAME's value (OUT zeroed by the core; token 0: none), in one
     * request where the layout allows. */
    int (*get)(void *state, const char *name, struct dlock__value *out);
};

/* The contended signal (dlock_lock_on_contended(); NULL table: the core
 * answers DLOCK_ENOTSUP with no_contend_why). */
struct dlock__contend_ops {
    /* Start watching exclusive plain lock hold H, just acquired (h->token
     * set), for other owners waiting for it,
     * reporting each with dlock__hold_contended() -- those waiting now
     * too -- until the release, a loss or the client's close ends the
     * watch (the backend's to tear down: a report answered false, its
     * release, its close). Called on the acquiring thread with no core
     * lock held, before the acquire registers H (a report meanwhile is
     * kept for it). A failure (a message set) leaves H held and untold. */
    int (*watch)(void *state, struct dlock__hold *h);
    /* Whether this URL form can watch the holds of a handle (FAIR: a
     * DLOCK_LOCK_FAIR one): DLOCK_OK, or DLOCK_ENOTSUP with the reason
     * (dlock_lock_on_contended()'s answer). NULL: every one. */
    int (*able)(void *state, bool fair);
};

/* Guarded writes (guard.c; NULL table or member: the core answers
 * DLOCK_ENOTSUP naming the backend and no_guarded_why). KEY is checked
 * by the core (letters, digits, '.', '_', '-'; not "." nor ".."), the
 * data's length too (DLOCK_GUARDED_MAX). put() is called as the value
 * ops' set() is: an exclusive plain lock hold not seen lost, the keeper
 * kept off it. */
struct dlock__guarded_ops {
    /* Write V->len bytes at V->data with h->token (V NULL: delete) as KEY
     * of h->name's store, in one request atomic with the check that H is
     * still the server's holder: DLOCK_ELOST with nothing written when it
     * is not. */
    int (*put)(void *state, struct dlock__hold *h, const char *key, const struct dlock__value *v);
    /* Read KEY of NAME's store (OUT zeroed by the core; token 0: none). */
    int (*get)(void *state, const char *name, const char *key, struct dlock__value *out);
};

/* Administration (admin.c, client.c): looking at names without taking
 * them. NULL member: the core answers DLOCK_ENOTSUP. */
struct dlock__admin_ops {
    /* Fill INFO for NAME (the plain lock name; the backend applies
     * c->opts.key_prefix as it does in acquire). */
    int (*inspect)(void *state, const char *name, struct dlock_info *info);
    int (*force_release)(void *state, const char *name);
    /* What dlock_check() compares its token with: whether NAME (as
     * inspect names it) is held now and the token of its newest hold
     * (shared: the newest reader's; 0 when the holder took none, a
     * foreign client's lock), in one request where the layout allows.
     * The core decides and words the answer. */
    int (*check)(void *state, const char *name, struct dlock__check_view *view);
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
     * success set *state. Errors name the URL (c->url.redacted). */
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
    const struct dlock__value_ops *values;
    const struct dlock__contend_ops *contend;
    const struct dlock__guarded_ops *guarded;

    /* Without semaphores, why (for the message of dlock_semaphore_new()'s
     * DLOCK_ENOTSUP); NULL: "no semaphores yet". */
    const char *no_semaphores_why;
    /* Without lock values (no values table), why (for the message of
     * dlock_value_set()'s and dlock_value_get()'s DLOCK_ENOTSUP); NULL: the
     * backend keeps none yet. */
    const char *no_values_why;
    /* Without the contend table, why no holder can be told of its
     * waiters (dlock_lock_on_contended()'s DLOCK_ENOTSUP). */
    const char *no_contend_why;
    /* Without guarded writes (no guarded table), why (for the message of
     * dlock_guarded_*()'s DLOCK_ENOTSUP); NULL: the backend has none yet. */
    const char *no_guarded_why;
};

/* Member M of table T of backend BE, NULL when the backend has no such
 * table: what the core tests before it calls an op that may be missing. */
#define DLOCK__OP(be, t, m) ((be)->t ? (be)->t->m : NULL)

/* ---------------------------------------------------------------- clients */

struct dlock__entry; /* the registry's per-name record (internal.h, lock.c) */

struct dlock_client {
    const struct dlock__backend *be;
    void *bstate;
    struct dlock__url url;
    struct dlock__opts opts;
    pid_t pid;         /* the creating process, for messages */
    uint64_t fork_gen; /* dlock__fork_gen() when made: fork detection */
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

    /* lost and at-risk callbacks' thread (callbacks.c), under mu */
    struct dlock__callbacks {
        pthread_t thread;
        bool running, stop;
        pthread_cond_t cv; /* a call queued, a call ended, stop, a hold to
                              time (CLOCK_MONOTONIC) */
        struct dlock__call *head, *tail;
        struct dlock_lock *current; /* whose callback runs now */
        unsigned watchers; /* handles with an at-risk callback: while
                              any, the thread times their holds' margins */
    } cb;

    /* holds whose backend watch for waiters started before they were
     * registered (callbacks.c, dlock__contend_watch), under mu */
    struct dlock__hold *contend_pending;

    /* lifetime: the client's own reference (dropped by close), one per
     * handle, and the callback thread's; the last one frees (atomic) */
    unsigned refs;
    bool closed; /* dlock_client_close() began: every call but freeing
                    handles is DLOCK_EMISUSE */
    int64_t close_deadline; /* set as closing begins (under mu): one op timeout
                               from then, the bound of everything close does
                               for the server -- releases, owed cleanups, the
                               backend's own close (dlock__close_deadline) */

    struct dlock__async *async; /* asynchronous calls (async.c): made by
                                   the first one, under mu; NULL: none yet */

    /* observability (observe.c): the log hook under log_mu (log_level
     * also read without it, atomically), counters updated atomically */
    pthread_mutex_t log_mu;
    dlock_log_fn log_fn;
    void *log_arg;
    int log_level; /* 0: off */
    dlock_stats stats;
};

/* Add N to the counter at FIELD of C's stats (atomic). */
#define DLOCK__COUNT(c, field, n) __atomic_add_fetch(&(c)->stats.field, (n), __ATOMIC_RELAXED)

#endif /* DLOCK_BACKEND_H */
