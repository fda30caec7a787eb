/* internal.h -- core-private structures: what backends never touch.
 * (Backends see src/backend.h and src/toolbox.h only.) */
#ifndef DLOCK_INTERNAL_H
#define DLOCK_INTERNAL_H

#include "backend.h"

/* The dispatch (dispatch.c), the one place that chooses a hold's ops by
 * its kind: the backend's acquire of H -- the semaphore ops' for a
 * permit (h->sem), the election ops' for a campaign (h->elect), else the
 * lock ops'. */
int dlock__backend_acquire(struct dlock_client *c, struct dlock__hold *h, struct dlock__wait *w);

/* The backend's release of H, chosen as dlock__backend_acquire() does. */
int dlock__backend_release(struct dlock_client *c, struct dlock__hold *h);
/* The asynchronous acquire's (async.c), chosen the same way: whether
 * holds of handle L's kind can be parked (a campaign's cannot yet), and
 * the backend's try_armed() and disarm() of H. */
bool dlock__backend_parks(const struct dlock_client *c, const struct dlock_lock *l);
int dlock__backend_try_armed(struct dlock_client *c, struct dlock__hold *h, struct dlock__wait *w,
                             void **park);
int dlock__backend_disarm(struct dlock_client *c, struct dlock__hold *h, struct dlock__wait *w,
                          void *park, int rc);

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

/* The URL query options SCHEME's backend reads itself (NULL-terminated;
 * never NULL), kept in src/backends/registry.c beside the scheme so the core can
 * refuse an unknown option before the backend dials anything. A backend
 * that reads a new option with dlock__url_param() adds it there. */
const char *const *dlock__backend_params(const char *scheme);
/* Whether KEY is a URL option for SCHEME: one the core reads (lease,
 * timeout, prefix, user, password, tls_*...) or one of the backend's. */
bool dlock__option_known(const char *scheme, const char *key);
/* Parse TEXT into U (url.c); free what it holds. */
int dlock__url_parse(const char *text, struct dlock__url *u);
void dlock__url_free(struct dlock__url *u);

/* One name of one client: the holds of its threads, and, for backends
 * whose server sees one owner per client (DLOCK__CAP_CLIENT_OWNER), the
 * local queue that lets one thread at a time go to the server. */
struct dlock__entry {
    char *name;
    unsigned refs;            /* handles + acquires in flight */
    struct dlock__hold *holds;
    bool busy;                /* CLIENT_OWNER: a thread holds or is acquiring,
                                 exclusive */
    unsigned readers;         /* CLIENT_OWNER: threads holding or acquiring
                                 shared (each with its own key or node) */
    struct dlock__waitset local; /* CLIENT_OWNER: threads waiting their turn */
    struct dlock__entry *next; /* hash chain */
};

struct dlock__waitref {
    struct dlock__wait *w;
    struct dlock__waitref *next;
};

struct dlock_lock {
    dlock_client *c;
    struct dlock__entry *e;
    dlock_mode mode;
    int64_t lease_ms; /* 0 = the client's */
    bool fixed_lease;
    dlock_lost_fn lost_fn;
    void *lost_arg;
    dlock_at_risk_fn at_risk_fn; /* dlock_lock_on_at_risk() (callbacks.c) */
    void *at_risk_arg;
    int64_t at_risk_margin_ms;
    dlock_contended_fn contended_fn; /* dlock_lock_on_contended() (callbacks.c) */
    void *contended_arg;
    struct dlock__waitref *waits; /* acquires in progress, for cancel */
    long owner;        /* DLOCK_LOCK_HANDLE_OWNED: the handle's owner id
                          (above every thread id); 0 = holds per thread */
    bool acquiring;    /* handle-owned: an acquire through it is running */
    bool releasing;    /* handle-owned: its hold's release is at the server */
    struct dlock__waitset turn; /* handle-owned: acquires waiting for it */
    const struct dlock__sem_req *sem; /* a permit's handle (semaphore.c): */
    struct dlock__sem_req sem_req;    /* what sem points to */
    struct dlock__elect_req *elect;   /* a campaign's handle (election.c) */
    struct dlock__elect_req elect_req; /* dlock_lock_new_campaign's (freed with it) */
    bool fair; /* DLOCK_LOCK_FAIR */
    bool async_call; /* an asynchronous call through it has not had its
                        callback yet (async.c; client mutex) */
    /* A job's acquire through it was promised (dlock__lock_job_ahead())
     * and has not begun: no wait exists yet for a cancel to reach, so a
     * cancel meanwhile is kept here and refuses that acquire when it
     * begins (dlock__acquire_then()). Client mutex. */
    bool job_ahead, job_canceled;
};

/* The first thing every public call that returns a code does: the
 * thread's message then never describes an earlier call (a timeout in
 * the local queue used to append an unrelated earlier error). Freeing
 * and closing leave it alone, so it can be read after cleaning up. */
static inline void dlock__msg_clear(void)
{
    (void)dlock__err(DLOCK_OK, "%s", "");
}

/* Extra per-hold bookkeeping the core keeps next to the backend's view. */
#define DLOCK__BUCKETS 1024

void dlock__wait_init(struct dlock__wait *w, int64_t deadline);
void dlock__wait_destroy(struct dlock__wait *w);
void dlock__wait_cancel(struct dlock__wait *w);
/* The code of an acquire through W that the backend answered RC: a
 * request cut short by W's own deadline (DLOCK_ECONN "no reply within 1
 * ms", DLOCK_EUNAVAIL "no quorum" of nodes the deadline cut, once it has
 * passed) is W's timeout, DLOCK_ETIMEDOUT, whatever the backend and URL
 * form (the message, kept, says what was cut); never for a try once or a
 * wait forever. Any other RC as it is. */
int dlock__wait_outcome(const struct dlock__wait *w, int rc);

/* The cancel object's side of an acquire (cancel.c): attach the wait of
 * R so a fire cancels it (DLOCK_ECANCELED at once when already fired,
 * DLOCK_EMISUSE for a parent's object after fork), and detach it before
 * the wait is destroyed. */
int dlock__cancel_attach(dlock_cancel *k, struct dlock__waitref *r);
void dlock__cancel_detach(dlock_cancel *k, struct dlock__waitref *r);
/* Put K on the canceler thread's watch (starting the thread if none
 * runs): called by a wait using K before it sleeps. Idempotent. */
int dlock__cancel_arm(dlock_cancel *k);

/* lock.c's pieces of an acquire that async.c drives too: take R off
 * LIST; re-enter the hold H its owner already has (mutex held); the
 * message of outcome RC of an acquire of E that waited WAIT_MS (see
 * lock.c). */
void dlock__waitref_remove(struct dlock__waitref **list, struct dlock__waitref *r);
int dlock__reenter(const dlock_lock *l, struct dlock__hold *h);
int dlock__acquire_outcome(struct dlock__entry *e, int rc, int64_t wait_ms, int64_t delay_until);

/* Asynchronous calls (async.c). dlock__async_close(): the first thing a
 * client's close does -- no new call starts, every one in flight ends
 * (DLOCK_ECANCELED when it was waiting), the pool stops and the
 * completions not yet dispatched run in the closing thread.
 * dlock__async_free(): the rest, as the client's memory goes.
 * dlock__async_forget(): before handle L is freed, its calls in flight
 * are canceled and awaited; their completions come with a NULL handle. */
void dlock__async_close(dlock_client *c);
void dlock__async_free(dlock_client *c);
void dlock__async_forget(dlock_lock *l);

/* Asynchronous calls the core composes (multi.c, semaphore.c): async.c's
 * jobs. A job is a call run on the client's pool: RUN(J) on a pool
 * thread returns its code -- the thread's message goes with it -- or
 * DLOCK__LATER when it goes on in member acquires it started with
 * dlock__acquire_then(), one of whose continuations ends it with
 * dlock__job_end(J, RC) (J is not touched by RUN after it returns
 * that). The completion then runs DELIVER(J, RC) once, in
 * dlock_dispatch() or the client's close, with RC's message as the
 * thread's: DELIVER calls the user's callback and frees J. A close
 * waits for every job to end: the member acquires are canceled, and a
 * member acquire started after the close began is refused
 * (DLOCK_ECANCELED, "the client is closing").
 * dlock__job_start(): DLOCK_OK (started), DLOCK_EMISUSE (closing,
 * closed), DLOCK_ENOMEM, DLOCK_EIO.
 * dlock__acquire_then(): dlock_acquire_async() of handle-owned L that
 * holds nothing yet, for the job ARG (the call's struct, which begins
 * with its struct dlock__job), whose end runs THEN(L, rc, ARG) on the
 * pool thread that ended it (no lock held, L's next call allowed, the outcome's
 * message the thread's) instead of queuing a completion; its start
 * codes are dlock_acquire_async()'s.
 * dlock__async_can_wait(): DLOCK_EINVAL for a bad WAIT_MS, DLOCK_ENOTSUP
 * when the backend of L cannot park a wait (WAIT_MS != 0), each message
 * beginning with WHAT. */
#define DLOCK__LATER 1
struct dlock__job {
    int (*run)(struct dlock__job *j);
    void (*deliver)(struct dlock__job *j, int rc);
    void *op;       /* async.c's */
    bool stopping;  /* dlock__job_forget() began: no member acquire starts (c->mu) */
    bool forgotten; /* its object was freed: DELIVER must not touch it (a->mu) */
};
typedef void (*dlock__then_fn)(dlock_lock *l, int rc, void *arg);
int dlock__job_start(dlock_client *c, struct dlock__job *j);
void dlock__job_end(struct dlock__job *j, int rc);
int dlock__acquire_then(dlock_lock *l, int64_t wait_ms, dlock_cancel *cancel, dlock__then_fn then,
                        void *arg);
/* The object of job J (a multi-lock, a semaphore) is being freed while
 * J may be in flight, as dlock_lock_free() frees a handle: from now on
 * no member acquire of J starts (DLOCK_ECANCELED), the one waiting is
 * canceled, and J's end is awaited. Its completion, when not dispatched
 * yet, then comes with DLOCK_ECANCELED, "WHAT: freed before its
 * completion was dispatched", and J->forgotten set: DELIVER passes NULL
 * for the object. Call it from the dispatching thread (or a callback),
 * never while another thread dispatches J's completion. */
void dlock__job_forget(dlock_client *c, struct dlock__job *j, const char *what);
int dlock__async_can_wait(const dlock_lock *l, int64_t wait_ms, const char *what);
bool dlock__async_closing(dlock_client *c);

unsigned dlock__hash(const char *s);
/* Free an entry taken out of the registry (client closing). */
void dlock__entry_free(struct dlock__entry *e);
/* A kind's own checks of a new handle on NAME, after the lock's (client,
 * name): its COUNT (a semaphore's permits) and FLAGS, and the backend. */
typedef int (*dlock__kind_check_fn)(const dlock_client *c, const char *name, unsigned count,
                                    unsigned flags);
/* The one constructor of the exclusive handle under every kind -- a
 * semaphore's base or permits, an election's campaign: dlock_lock_new()
 * with LOCK_FLAGS, then CHECK (NULL: none) with COUNT and FLAGS; when
 * either fails nothing is left made (*OUT NULL). */
int dlock__handle_new(dlock_client *c, const char *name, unsigned lock_flags,
                      dlock__kind_check_fn check, unsigned count, unsigned flags, dlock_lock **out);
/* The making of a kind's object around its handle: dlock__handle_new()'s
 * arguments, the object's SIZE, and what was made. */
struct dlock__handle_request {
    const char *name;
    unsigned lock_flags;
    dlock__kind_check_fn check; /* NULL: none */
    unsigned count, flags;
    size_t size; /* of the kind's object */
    struct {
        dlock_lock *base; /* the new handle */
        int rc;           /* why nothing was made */
    } out;
};
/* A kind's object of RQ->size zeroed bytes around a new handle
 * RQ->out.base: the semaphore, the election. NULL with RQ->out.rc when
 * either could not be made (nothing left made). */
void *dlock__handle_wrap(dlock_client *c, struct dlock__handle_request *rq);
/* The checks of a call on NAME that makes no handle (inspect, observe):
 * dlock__handle_new()'s, the handle freed at once. */
int dlock__handle_probe(dlock_client *c, const char *name, dlock__kind_check_fn check,
                        unsigned count, unsigned flags);
/* dlock_lock_cancel() of L with the client's mutex held: every acquire
 * in progress through L ends with DLOCK_ECANCELED (a semaphore cancels
 * each permit's handle so, all under one lock). */
void dlock__lock_cancel_waits(dlock_lock *l);
/* A job will acquire through handle-owned L (dlock__acquire_then()) on
 * a pool thread: a cancel of L's waits from now until that acquire
 * begins cancels it (client mutex held). */
void dlock__lock_job_ahead(dlock_lock *l);
/* Test hook: threads of L's client queued locally on its name, and
 * (WAKES, may be NULL) how many wakes the local queue has handed out. */
size_t dlock__local_waiters(dlock_lock *l, uint64_t *wakes);
/* An acquire through one handle in pieces, for a caller that takes
 * several handles' holds in one backend request (multi.c), and for
 * dlock_acquire_ex() itself. All with the client's mutex held.
 * dlock__acquire_claim_now() starts an acquire through L without
 * waiting: DLOCK_EBUSY when L is busy (acquiring, releasing, holding)
 * or, on a CLIENT_OWNER backend, another thread of the client has the
 * name or waits for it; else the name is claimed for L. Then
 * dlock__hold_make() makes L's hold for the backend (NULL: out of
 * memory, message set), and dlock__acquire_end() closes the acquire
 * once the backend answered RC: the hold registered with the keeper
 * (DLOCK_OK) or freed (H may be NULL), the local claim (CLAIMED) given
 * back on failure. Returns RC, or the failure to start the keeper (the
 * hold then released). May drop the mutex meanwhile. */
int dlock__acquire_claim_now(dlock_lock *l);
struct dlock__hold *dlock__hold_make(dlock_lock *l);
int dlock__acquire_end(dlock_lock *l, struct dlock__hold *h, int rc, bool claimed);
/* What of the registry lock.c shares with release.c, all with the
 * client's mutex held. dlock__hold_of(): owner TID's hold on E, never one
 * the keeper is giving back (NULL: none); dlock__owner_of(): who holds
 * through L when the calling thread acts (the handle's owner id or the
 * thread's); dlock__not_held(): DLOCK_ENOTOWNER, said for L; frees of a
 * hold out of the registry (NULL: no-op) and of a reference on E (the
 * entry goes once nothing uses it); on CLIENT_OWNER backends, the name's
 * local turn taken or given up in SHARED or exclusive mode (giving it up
 * wakes the next local waiter). */
struct dlock__hold *dlock__hold_of(struct dlock__entry *e, long tid);
long dlock__owner_of(const dlock_lock *l);
int dlock__not_held(const dlock_lock *l);
void dlock__hold_free(struct dlock__hold *h);
void dlock__entry_put(dlock_client *c, struct dlock__entry *e);
void dlock__local_claim(struct dlock__entry *e, bool shared);
void dlock__local_dequeue(struct dlock__entry *e, bool shared);
/* End H (release.c): give it up at the backend and free it (mutex held;
 * dropped meanwhile). The backend's result, or DLOCK_ELOST for a hold
 * lost before. */
int dlock__hold_end(dlock_client *c, struct dlock__hold *h);
/* A multi-lock's release (multi.c) of the holds of LS[0..N) (one client,
 * canonical order) in one backend request (the multi ops' release): RCS[k] each
 * member's result as dlock_release() would give it; returns the last
 * member's failure with its message, or DLOCK_OK. DLOCK_ENOTSUP, nothing
 * done: the backend has no such op, or a member is not a plain one-level
 * hold of its handle (the caller releases member by member). */
int dlock__release_set(dlock_lock *const *ls, size_t n, int *rcs);
/* Release every hold of C (closing): a plain hold within DEADLINE where
 * the backend has release_within (what is not sent by then is owed to
 * the cleanup queue), any other with the backend's release. */
void dlock__release_all(dlock_client *c, int64_t deadline);

/* The checks of a call naming NAME through client C (admin.c): a good
 * client, connected, and a good name (NULL: no name to check). */
int dlock__check_name_call(dlock_client *c, const char *name);
/* dlock_release_ex()'s clear (value.c): when the owner's hold through L
 * is at its last level, clear the name's value through it, guarded as
 * dlock_value_set() is; DLOCK_OK when not held or not the last level. */
int dlock__value_clear_last(dlock_lock *l);
/* A write through the owner's hold on L's name (value.c), guarded by it
 * in the backend: the lock's value (KEY NULL; V NULL clears it) or KEY
 * of the name's store (guard.c; V NULL deletes it). The core's refusals
 * first (nothing held, a shared, permit or campaign hold, one lost or
 * past its validity); a backend's DLOCK_ELOST becomes the hold's loss.
 * The client is checked and the backend known to have the op. */
int dlock__held_write(dlock_lock *l, const char *key, const struct dlock__value *v);

/* True in a child after fork(): C is its parent's, whose threads (keeper,
 * callbacks, the backend's) the child does not have. There nothing may
 * touch C's mutexes, condition variables or connection -- one of those
 * threads may have held or waited on them at the fork -- so every call
 * checks this before taking the client's mutex, and freeing leaves them
 * alone. dlock__check_fork(): DLOCK_EMISUSE said of C there, else
 * DLOCK_OK. */
bool dlock__forked(const dlock_client *c);
int dlock__check_fork(const dlock_client *c);

/* Take / drop a reference on C's memory (client.c); the last drop frees
 * it. Any thread, no lock needed. */
void dlock__client_ref(dlock_client *c);
void dlock__client_unref(dlock_client *c);

/* Lost and at-risk callbacks (callbacks.c), all under the client's
 * mutex. Queue L's lost callback with WHY and start the thread if
 * needed; DLOCK_ENOMEM when neither memory nor a thread could be had (try
 * again later). */
int dlock__callback_queue(dlock_client *c, dlock_lock *l, const char *why);
/* True on the client's callback thread. */
bool dlock__callback_thread(const dlock_client *c);
/* L is being freed: drop its queued callbacks, and wait for its running
 * one unless called from the callback thread (mutex held; may wait). */
void dlock__callback_forget(dlock_client *c, dlock_lock *l);
/* H is lost or leaves the registry: drop its queued at-risk call, so
 * none is made after the loss or the release (mutex held). */
void dlock__callback_forget_hold(dlock_client *c, const struct dlock__hold *h);
/* Hold H was registered: when its handle has an at-risk callback, wake
 * the callback thread to time H's margin (mutex held). */
void dlock__callback_watch(dlock_client *c, const struct dlock__hold *h);
/* Hold H, just acquired through L and not registered yet (no mutex
 * held): when L wants the contended signal, have the backend watch H for
 * waiters, H on the client's pending list until dlock__contend_unpend()
 * (mutex held), which dlock__acquire_end() calls as it registers or frees
 * H (dropping then what was queued for it). */
void dlock__contend_watch(dlock_client *c, dlock_lock *l, struct dlock__hold *h);
void dlock__contend_unpend(dlock_client *c, struct dlock__hold *h, bool registered);
/* Closing: run what is queued, then stop the thread (takes the mutex).
 * From the callback thread itself (a callback closing the client) the
 * thread is detached instead and ends after that callback, dropping its
 * reference on the client. */
void dlock__callbacks_stop(dlock_client *c);
/* A semaphore's or an election's own lost callback: the user's function
 * as a plain function pointer (cast back to its type where it is called)
 * and its argument, both set and read under the client's mutex. */
struct dlock__user_lost {
    void (*fn)(void);
    void *arg;
};
/* The whole of dlock_semaphore_on_lost() and dlock_election_on_lost():
 * FN and ARG into U (NULL: the object, a WHAT, is NULL: DLOCK_EINVAL). */
int dlock__user_lost_set(dlock_client *c, struct dlock__user_lost *u, const char *what,
                         void (*fn)(void), void *arg);
struct dlock__user_lost dlock__user_lost_get(dlock_client *c, const struct dlock__user_lost *u);

/* Inspecting (info.c): *I a new snapshot with everything unknown (-1)
 * for the backend to fill; DLOCK_ENOMEM. */
int dlock__info_new(dlock_info **i);
/* The end of an inspect: the backend filled I with result RC; on success
 * *OUT is I, else I is freed. Returns RC. */
int dlock__info_give(dlock_info *i, int rc, dlock_info **out);

/* The cleanup queue (cleanup.c). Run the pieces due, each at most once,
 * until DEADLINE (client mutex held; dropped while each runs); true when
 * any ran. */
bool dlock__cleanup_run(dlock_client *c, int64_t deadline);
/* When the next queued piece is due (mutex held); DLOCK__NEVER if none. */
int64_t dlock__cleanup_next(const dlock_client *c);
/* Closing, keeper stopped: run each piece once more (when RUN: not in a
 * child after fork) until DEADLINE (close's), then free them all. */
void dlock__cleanup_close(dlock_client *c, bool run, int64_t deadline);

#endif
