/* zk.h -- the ZooKeeper backend: exclusive locks on Curator's
 * InterProcessMutex layout and read-write locks on its
 * InterProcessReadWriteLock layout ("__READ__"/"__WRIT__" children in the
 * same queue), with holds tied to the client's session.
 *
 * A lock NAME lives at <base>/<encoded name>, a container node. Each
 * contender creates an EPHEMERAL_SEQUENTIAL child "_c_<guid>-lock-<seq>"
 * (Curator's protected mode: the guid lets us find our node again when a
 * create's reply is lost to a disconnect). The lowest sequence owns the
 * lock; every other contender watches only the node just before its own, so
 * a release wakes exactly one waiter. Releasing deletes our node; a dead
 * client's nodes vanish when the server expires its session. The fencing
 * token is our node's czxid, which the ensemble only ever increases.
 *
 * One client = one ZooKeeper session (zhandle), shared by all threads; the
 * core queues threads of the client per name, so acquire() sees at most one
 * thread per name. Calls go through the asynchronous API and wait with our
 * own timeout, because the client library's synchronous calls can block for
 * a whole session timeout; that also lets us pipeline (the create and the
 * first listing of the children share one round trip). A node we may have
 * left behind — a create whose reply was lost, a delete without a reply —
 * goes to the core's cleanup queue, which the keeper drains once the
 * session is connected, so it never blocks the queue until the session
 * ends. When the session expires every hold of it is lost (the watcher
 * reports so at once), and the next call opens a new session. docs/protocol-zookeeper.md describes the layout and guarantees.
 *
 * The backend is one folder, one file per concern, and this header is
 * what they share: call.c (asynchronous requests that wait with our own
 * timeout), session.c (the session, its watcher, reconnection and expiry,
 * open/close and renewal), cleanup.c (nodes a lost reply may have left:
 * orphans and suspects), fds.c (close-on-exec for the client library's
 * descriptors), mutex.c (the InterProcessMutex recipe, the read and
 * write acquires, and the backend table), async.c (that acquire's wait
 * cut into attempts, for a parked asynchronous acquire), ahead.c (a
 * waiter that counts the nodes ahead of it down by their deletion
 * events, so that it holds on the release's event without a look),
 * rwlock.c (the downgrade),
 * inspect.c (status, force-release, list), value.c (a lock's value:
 * a child of the lock node, written in a multi guarded by the hold's
 * node), contend.c (the contended signal: a child watch on the lock
 * node). Every function shared
 * between them starts with zk_.
 */
#ifndef DLOCK_BACKEND_ZK_H
#define DLOCK_BACKEND_ZK_H

#include "backend.h"

#include <stdbool.h>
#include <stdint.h>

#include <zookeeper.h>

#define ZK_DEFAULT_PORT 2181
#define ZK_DEFAULT_BASE "/dlock"
#define ZK_PROTECTED "_c_"    /* Curator's protected-mode prefix */
#define ZK_LOCK_MARK "lock-"  /* Curator's lock name, sorted on what follows */
#define ZK_DELAY_NODE "_dlock_delay" /* a lock node's lock-delay marker (delay.c) */
#define ZK_WRITE_MARK "__WRIT__" /* InterProcessReadWriteLock's write lock */
#define ZK_READ_MARK "__READ__"  /* and its read lock */
#define ZK_LATCH_MARK "latch-"   /* Curator's LeaderLatch (elections) */

/* The kinds of lock children: writers ("lock-" of InterProcessMutex, the
 * default of exclusive holds, or "__WRIT__", theirs with layout=curator-rw)
 * and readers ("__READ__", shared holds). */
enum zk_kind { ZK_KIND_NONE, ZK_KIND_LOCK, ZK_KIND_WRITE, ZK_KIND_READ, ZK_KIND_LATCH };
/* Pauses between retries of a request whose reply was lost
 * (dlock__wait_retry's backoff). */
#define ZK_RETRY_MIN_MS 10
#define ZK_RETRY_MAX_MS 100

/* ------------------------------------------------------------ structures */

struct zk_backend;

/* One ZooKeeper session (one zhandle). Retired sessions are closed when
 * the last thread using them lets go. Fields are guarded by zb->mu. */
struct zk_session {
    struct zk_backend *zb;
    zhandle_t *zh;
    unsigned gen;      /* which session of this client, from 1 */
    int refs;          /* the backend's own reference + callers' */
    int state;         /* last session state from the watcher */
    bool expired;      /* ZOO_EXPIRED_SESSION_STATE seen */
    bool auth_failed;  /* ZOO_AUTH_FAILED_STATE seen */
    int64_t session_id;
    int timeout_ms;    /* negotiated session timeout */
};

struct zk_backend {
    struct dlock_client *c;
    char *connect;     /* "h1:p1,h2:p2[/chroot]" for zookeeper_init */
    char *servers;     /* "zk h1:p1,h2:p2" for messages */
    char *chroot;      /* NULL or "/app" */
    char *base;        /* "/dlock" (chroot-relative) */
    char *auth;        /* "user:password" or NULL */
    bool creator_acl;  /* ?acl=creator */
    bool no_containers; /* the server refused ZOO_CONTAINER */
    bool rw_layout;    /* layout=curator-rw: exclusive holds take __WRIT__ */
    char ident[128];   /* data of our nodes: "dlock <pid>@<host>" */
    int ports[DLOCK__MAX_HOSTS]; /* the servers' ports (close-on-exec) */
    size_t nports;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* session state changed (CLOCK_MONOTONIC) */
    bool closing;      /* dlock__zk_close began: the watcher leaves c alone */
    bool opening;      /* dlock__zk_open's first connect: every server refusing
                          fails it at once */
    struct zk_session *cur;
    unsigned last_gen;
    /* acquires of this client, each keyed by the path of the node it
     * watches: its deletion wakes that one, a session event all */
    struct dlock__waitset waiters;
    /* the last node events (deleted, data changed, ...) the session
     * watcher saw, numbered: a watched hold with one after its last check
     * is checked again (session.c, renew) */
    struct zk_node_event *node_events;
    size_t n_node_events;
    uint64_t node_event_seq;     /* the last event's number */
    uint64_t node_events_forgot; /* events up to this number were dropped */
    struct zk_contend *contends; /* holds watched for waiters (contend.c) */
    struct zk_ahead *aheads;     /* waiters watching every node ahead (ahead.c) */
};

/* One node event: the hash of its path and its number. */
struct zk_node_event {
    uint64_t hash;
    uint64_t seq;
};

/* Per-hold data (h->bdata). */
struct zk_hold {
    char *path;    /* full node path, chroot-relative */
    unsigned gen;  /* the session that created it */
    int64_t czxid;
    bool watched;  /* a renewal found the node and left an exists watch on
                      it: until an event for it, it stands */
    uint64_t watch_seq; /* node events up to this number were looked at */
    char *shadow;  /* an exclusive hold's read node queued right behind it
                      for a downgrade (rwlock.c), or NULL */
    int64_t shadow_czxid;
    bool delay_armed; /* it wrote a lock-delay marker (delay.c) */
    bool delay_listed; /* the listing that found it first showed a
                          lock-delay marker: look at it (delay.c) */
};

/* ------------------------------------------------------ waiting on calls */

/* One asynchronous request. The completion may come after the caller gave
 * up (our timeout), so the record is reference counted: one reference for
 * the caller, one for the completion. */
struct zk_call {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    bool done;
    bool abandoned; /* the caller gave up: undo a late create */
    int rc;
    int64_t deadline; /* set by the request helpers of call.c */
    struct Stat stat;
    char *value;    /* created path, or node data */
    int value_len;
    struct String_vector kids;
    zhandle_t *zh;
    /* a check-then-write multi (dlock__zk_rq_check_then): what the
     * library fills in at its completion, which may come after the caller
     * gave up */
    zoo_op_result_t multi[2];
    struct Stat multi_stat;
};


/* ---------------------------------------------------------------- call.c */

/* Requests through the asynchronous API, each waited for until its own
 * deadline. Every zk_rq_* takes UNTIL, the deadline of the caller's whole
 * operation (an acquire's wait deadline, a renewal batch's deadline; 0 or
 * DLOCK__NEVER when only the op timeout bounds it): a request waits at
 * most dlock__time_left(UNTIL, op timeout), and when UNTIL has passed it
 * is not sent and returns ZOPERATIONTIMEOUT. They return ZooKeeper codes. */
struct zk_call *dlock__zk_call_new(zhandle_t *zh);
int dlock__zk_call_wait(struct zk_call *k, int64_t deadline, struct Stat *stat, char **value,
                        struct String_vector *kids);
int dlock__zk_call_dead(struct zk_call *k, int rc);
int64_t dlock__zk_call_deadline(struct zk_backend *zb, int64_t until);
void dlock__zk_on_ignored(int rc, const void *data);
void dlock__zk_on_stat(int rc, const struct Stat *stat, const void *data);
void dlock__zk_on_synced(int rc, const char *value, const void *data);

int dlock__zk_rq_create(struct zk_backend *zb, zhandle_t *zh, const char *path, const char *data,
                        int mode, char **created, struct Stat *stat, int64_t until);
int dlock__zk_rq_exists(struct zk_backend *zb, zhandle_t *zh, const char *path, watcher_fn watcher,
                        void *watch_ctx, struct Stat *stat, int64_t until);
int dlock__zk_rq_get(struct zk_backend *zb, zhandle_t *zh, const char *path, char **data,
                     struct Stat *stat, int64_t until);
int dlock__zk_rq_children(struct zk_backend *zb, zhandle_t *zh, const char *path,
                          struct String_vector *kids, int64_t until);
/* The children of PATH, leaving WATCHER (with WATCH_CTX) to be called
 * when they change (a child created or deleted). */
int dlock__zk_rq_children_watch(struct zk_backend *zb, zhandle_t *zh, const char *path,
                                watcher_fn watcher, void *watch_ctx, struct String_vector *kids,
                                int64_t until);
int dlock__zk_rq_delete(struct zk_backend *zb, zhandle_t *zh, const char *path, int64_t until);
/* Set PATH's data to DATA (any version), *STAT (may be NULL) its new stat. */
int dlock__zk_rq_set(struct zk_backend *zb, zhandle_t *zh, const char *path, const char *data,
                     struct Stat *stat, int64_t until);
/* A node's create with its directory's listing in the same round trip
 * (call.c): PATH (EPHEMERAL_SEQUENTIAL) with DATA (NULL: our identity),
 * LOCKPATH's children into KIDS, within UNTIL; out: the node made, its
 * stat, and whether KIDS was filled (caller frees). */
struct zk_create_list {
    const char *path, *data, *lockpath;
    struct String_vector *kids;
    int64_t until;
    struct {
        char *created;
        struct Stat stat;
        bool listed;
    } out;
};
int dlock__zk_rq_create_and_list(struct zk_backend *zb, zhandle_t *zh, struct zk_create_list *rq);
int dlock__zk_rq_children_synced(struct zk_backend *zb, zhandle_t *zh, const char *path,
                                 struct String_vector *kids, int64_t until);
/* Watches left on N nodes in one round trip: V[i].path gets a data
 * watch (a getData, which leaves none on a node that is gone) or, with
 * V[i].exists, an exists watch (left on a missing node too: its creation
 * is the event), each for WATCHER with WATCH_CTX; V[i].rc each one's
 * code. ZOK when every reply came, else why not (the V[i].rc not come
 * are ZOPERATIONTIMEOUT). */
struct zk_watch_rq {
    const char *path;
    bool exists;
    int rc;
};
int dlock__zk_rq_watch_many(struct zk_backend *zb, zhandle_t *zh, struct zk_watch_rq *v, int n,
                            watcher_fn watcher, void *watch_ctx, int64_t until);

/* A failed request as a DLOCK_E* code with a message; the kinds of codes. */
/* A write guarded by a node (value.c): one multi of "CHECK exists, then
 * WRITE" -- LEN bytes at DATA set on PATH, or PATH created (persistent)
 * with them when CREATE, or PATH deleted when REMOVE (guard.c). ERRS[0]
 * the check's result, ERRS[1] the write's
 * (ZOK both when applied; ZRUNTIMEINCONSISTENCY for the one after the op
 * that failed); returns the multi's code (ZOPERATIONTIMEOUT: unknown). */
struct zk_guarded_write {
    const char *check;
    const char *path;
    const char *data;
    size_t len;
    bool create;
    bool remove;
    int errs[2];
};
int dlock__zk_rq_check_then(struct zk_backend *zb, zhandle_t *zh, struct zk_guarded_write *gw,
                            int64_t until);
int dlock__zk_fail(struct zk_backend *zb, int rc, const char *what, const char *path);
bool dlock__zk_rc_transient(int rc);
bool dlock__zk_rc_session_gone(int rc);

/* ------------------------------------------------------------- cleanup.c */

/* Orphans (deletes without a reply) and suspects (creates without a
 * reply) go to the core's cleanup queue, done by the keeper on their
 * session while it lives. */
void dlock__zk_orphan_add(struct zk_backend *zb, struct zk_session *s, const char *path);
void dlock__zk_suspect_add(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
                           const char *guid, const char *keep);
void dlock__zk_delete_own_node(struct zk_backend *zb, struct zk_session *s, const char *path,
                               struct dlock__wait *w);
/* The same, no later than UNTIL instead of W's deadline (W may be NULL:
 * no cancel). */
void dlock__zk_delete_own_node_by(struct zk_backend *zb, struct zk_session *s, const char *path,
                                  int64_t until, struct dlock__wait *w);
/* How long wait W, ended by ERR, may still spend giving back what it
 * made: nothing once canceled (the caller asked to stop now: what is left
 * is owed to the cleanup queue at once), else until W's deadline (a
 * try-once: the op timeout). */
int64_t dlock__zk_give_up_deadline(const struct dlock__wait *w, int err);
/* Give back our node PATH, made by wait W that ended with ERR, within
 * dlock__zk_give_up_deadline() (the rest owed to the cleanup queue),
 * keeping the thread's message (ERR's). */
void dlock__zk_give_back_node(struct zk_backend *zb, struct zk_session *s, const char *path,
                              struct dlock__wait *w, int err);

/* ------------------------------------------------------------- session.c */

void dlock__zk_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx);
bool dlock__zk_session_usable(const struct zk_session *s);
int dlock__zk_session_get(struct zk_backend *zb, struct zk_session **out);
int dlock__zk_session_get_w(struct zk_backend *zb, struct zk_session **out, struct dlock__wait *w);
/* The current session only when connected now, never waiting (a parked
 * wait's attempt): DLOCK_ECONN otherwise (a session that ended is
 * replaced first; its connection is a session event that wakes the
 * waiters). */
int dlock__zk_session_get_now(struct zk_backend *zb, struct zk_session **out);
/* The number of the last node event the watcher saw, and whether one for
 * PATH may have come after the one numbered SINCE (older ones dropped
 * count as may). */
uint64_t dlock__zk_node_event_seq(struct zk_backend *zb);
bool dlock__zk_node_event_since(struct zk_backend *zb, const char *path, uint64_t since);
void dlock__zk_session_put(struct zk_backend *zb, struct zk_session *s);
/* The current session with a reference when it is the one hold ZH's
 * nodes live in, else NULL (it ended: they went with it). */
struct zk_session *dlock__zk_session_of_hold(struct zk_backend *zb, const struct zk_hold *zh);
/* The same for hold H (h->bdata its zk_hold) into *OUT: DLOCK_OK, or
 * DLOCK_ELOST with the message (*OUT NULL) when H has no node or the
 * session that made it ended. */
int dlock__zk_hold_session(struct zk_backend *zb, const struct dlock__hold *h,
                           struct zk_session **out);
int dlock__zk_open(struct dlock_client *c, void **state);
void dlock__zk_close(void *state);
int dlock__zk_renew(void *state, struct dlock__renew_batch *b);

/* ----------------------------------------------------------------- fds.c */

/* Close-on-exec for the client library's descriptors: snapshot the pipes
 * before zookeeper_init(), mark the pipe it made after; mark its socket
 * (a TCP socket to one of PORTS) on every connection. */
struct zk_fd {
    int fd;
    char target[32]; /* "pipe:[1234]" */
};
struct zk_fds {
    struct zk_fd *v;
    size_t n, cap;
    bool failed; /* out of memory: the snapshot is incomplete */
};
void dlock__zk_fds_snapshot(struct zk_fds *s);
void dlock__zk_fds_free(struct zk_fds *s);
void dlock__zk_fds_cloexec_new_pipes(const struct zk_fds *before);
void dlock__zk_fds_cloexec_sockets(const int *ports, size_t nports);

/* --------------------------------------------------------------- mutex.c */

/* The kind of lock child NODE (ZK_KIND_NONE: not a lock child). */
enum zk_kind dlock__zk_node_kind(const char *node);
/* The mark of the node a hold in MODE creates (ZK_READ_MARK...). */
const char *dlock__zk_mark(const struct zk_backend *zb, dlock_mode mode);
/* A contender node to create: named MARK with DATA (NULL: our identity)
 * under LOCKPATH, the children listed along with it into KIDS; out: the
 * node's full path (owned), its creation zxid, and whether KIDS was
 * filled (caller frees). */
struct zk_contender {
    const char *lockpath, *mark, *data;
    struct String_vector *kids;
    bool once; /* no retry pauses (a parked wait's attempt): see mutex.c */
    struct {
        char *node;
        int64_t czxid;
        bool listed;
    } out;
};
/* Create RQ's contender node (see mutex.c); W may be NULL (no wait:
 * retries within the op timeout). */
int dlock__zk_create_contender(struct zk_backend *zb, struct zk_session *s,
                               struct zk_contender *rq, struct dlock__wait *w);
/* What follows our identity in the data of a read node queued behind a
 * write hold for its downgrade (rwlock.c): while it waits there, status
 * leaves it out (it is part of that hold, not a waiter). */
#define ZK_SHADOW_TAG " (read level of a write hold)"
/* Does NODE carry protected-mode GUID ("_c_<guid>-...")? */
bool dlock__zk_node_has_guid(const char *node, const char *guid);
/* Path of the lock node for NAME: <base>/<encoded key_prefix + name>
 * (caller frees; NULL when out of memory). */
char *dlock__zk_lock_path(struct zk_backend *zb, const char *name);
/* Keep only the lock children of KIDS (Curator's two shapes), sorted by
 * sequence: the owner first. The others are freed. */
void dlock__zk_sort_lock_nodes(struct String_vector *kids);
/* Create LOCKPATH as a container (persistent when the server has none);
 * ZNODEEXISTS counts as done. A ZooKeeper code. */
int dlock__zk_create_container(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
                               int64_t until);
/* The recipe on the lock node LOCKPATH for H with a node named MARK
 * (dlock__zk_mark: InterProcessMutex's, or the read-write lock's read or write),
 * waiting as W says (the backend's acquire on dlock__zk_lock_path(h->name)); and
 * the release of a hold it gave (frees h->bdata). */
int dlock__zk_acquire_at(struct zk_backend *zb, const char *lockpath, const char *mark,
                         struct dlock__hold *h, struct dlock__wait *w);
/* Where a contender stands (dlock__zk_queue_position): its node MINE
 * under LOCKPATH, the listing GIVEN with its create (NULL: none; taken
 * when it shows MINE), within UNTIL; out: its place, the node to wait
 * for and the first node; KEEP (may be NULL) gets the sorted lock nodes
 * when ours is not first (caller frees), for the watches ahead
 * (ahead.c). */
struct zk_queue_look {
    const char *lockpath, *mine;
    struct String_vector *given, *keep;
    int64_t until;
    struct {
        int pos;      /* 0: ours, else our index */
        char *pred;   /* owned, full path; when not ours */
        char *holder; /* owned, the first node's name */
        bool marker;  /* a lock-delay marker is among the children */
    } out;
};
/* One look of the recipe (see mutex.c): ZOK with Q->out set, ZNONODE
 * when our node is gone, or a ZooKeeper error. */
int dlock__zk_queue_position(struct zk_backend *zb, struct zk_session *s,
                             struct zk_queue_look *q);
/* Our contender node came first (dlock__zk_hold_on): *NODE (taken on
 * success), its CZXID, when the request that showed it first was SENT,
 * and whether that listing showed a lock-delay MARKER. */
struct zk_first {
    char **node;
    int64_t czxid, sent;
    bool marker;
};
/* H holds on F's node, made in session S: h->bdata, token, owner and
 * validity (the session timeout from F->sent). DLOCK_ENOMEM leaves the
 * node to the caller. */
int dlock__zk_hold_on(struct zk_backend *zb, struct zk_session *s, struct dlock__hold *h,
                      struct zk_first *f);
/* H just came first on LOCKPATH: *LEFT the ms of the name's lock-delay
 * still to run (0: none; looked at only when the listing showed the
 * marker). A delay under way or a failure gives H back (its place is
 * lost; the message kept); the caller waits LEFT and starts over. */
int dlock__zk_delay_first(struct zk_backend *zb, struct dlock__hold *h, const char *lockpath,
                          int64_t *left);
/* The end of H's acquire: its lock-delay marker armed when the client
 * asks for lock-delays (exclusive holds); a failure gives H back. */
int dlock__zk_delay_held(struct zk_backend *zb, struct dlock__hold *h, const char *lockpath);
int dlock__zk_release(void *state, struct dlock__hold *h);
/* The backend's release_within: H's node deleted no later than DEADLINE,
 * what is not done by then owed to the cleanup queue (frees h->bdata). */
int dlock__zk_release_within(void *state, struct dlock__hold *h, int64_t deadline);

/* ------------------------------------------------------------ election.c */

/* value.c */
extern const struct dlock__value_ops dlock__zk_value_ops;
/* The value's guarded write and read (KEY NULL) or a guarded key's
 * (guard.c): one multi checking the hold's node, then a setData, create
 * or delete; one getData. */
int dlock__zk_stored_set(void *state, struct dlock__hold *h, const char *key,
                         const struct dlock__value *v);
int dlock__zk_stored_get(void *state, const char *name, const char *key,
                         struct dlock__value *out);
extern const struct dlock__guarded_ops dlock__zk_guarded_ops;

/* ------------------------------------------------------------ contend.c */

/* Holds told who queues behind them: a child watch on the lock node. */
extern const struct dlock__contend_ops dlock__zk_contend_ops;
/* Session GEN of ZB ended (zookeeper_close() returned): free what its
 * watches for waiters left. */
void dlock__zk_contend_forget(struct zk_backend *zb, unsigned gen);

int dlock__zk_elect_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w);
int dlock__zk_elect_proclaim(void *state, struct dlock__hold *h, const char *value);
int dlock__zk_elect_observe(void *state, const char *name, const struct dlock_leader *known,
                            struct dlock__wait *w, struct dlock_leader *out);

/* ----------------------------------------------------------- semaphore.c */

int dlock__zk_sem_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w);
int dlock__zk_sem_release(void *state, struct dlock__hold *h);
int dlock__zk_sem_try_armed(void *state, struct dlock__hold *h, struct dlock__wait *w, void **park);
int dlock__zk_sem_disarm(void *state, struct dlock__hold *h, struct dlock__wait *w, void *park,
                         int rc);
int dlock__zk_sem_inspect(void *state, const char *name, unsigned permits, struct dlock_info *info);
/* The keeper's check of a permit of K beyond its first lease node (which
 * session.c checks as a lock's), in two halves so that a renewal batch
 * sends every request before it waits for any reply. _send asks on ZH
 * whether H's other K - 1 nodes exist, the requests into *CALLS (NULL
 * when there are none): DLOCK_OK, or the failure (those sent before it
 * stay in *CALLS). _end waits for them by DEADLINE and frees CALLS,
 * keeping ERR (_send's result) when it is a failure, else DLOCK_OK when
 * every node belongs to SESSION_ID, DLOCK_ELOST naming the node gone, or
 * the failure. */
int dlock__zk_sem_check_send(struct zk_backend *zb, zhandle_t *zh, const struct dlock__hold *h,
                             struct zk_call ***calls);
int dlock__zk_sem_check_end(struct zk_backend *zb, const struct dlock__hold *h,
                            struct zk_call **calls, int err, int64_t session_id, int64_t deadline);

/* -------------------------------------------------------------- rwlock.c */

/* The downgrade of InterProcessReadWriteLock (write, read, release the
 * write): share() queues a read node right behind an exclusive hold's,
 * downgrade() keeps it and deletes the write node. */
void dlock__zk_share(void *state, struct dlock__hold *h);
int dlock__zk_downgrade(void *state, struct dlock__hold *h);
/* Delete an exclusive hold's shadow read node, if any (release). */
void dlock__zk_shadow_drop(struct zk_backend *zb, struct zk_session *s, struct zk_hold *zh);

/* --------------------------------------------------------------- async.c */

/* The lock ops' try_armed and disarm (backend.h): the recipe's wait cut
 * into attempts for the core's parked asynchronous acquire. */
int dlock__zk_try_armed(void *state, struct dlock__hold *h, struct dlock__wait *w, void **park);
/* dlock__zk_try_armed() of hold H (exclusive or shared by MARK) queued
 * under LOCKPATH rather than its name's lock path, with no lock-delay (a
 * semaphore's Curator mutex); its end is dlock__zk_disarm(). */
int dlock__zk_park_at(struct zk_backend *zb, const char *lockpath, const char *mark,
                      struct dlock__hold *h, struct dlock__wait *w, void **park);
int dlock__zk_disarm(void *state, struct dlock__hold *h, struct dlock__wait *w, void *park, int rc);

/* ------------------------------------------------------------- inspect.c */

int dlock__zk_inspect(void *state, const char *name, struct dlock_info *info);
/* dlock_check()'s look (admin ops): the children, then each holder's stat. */
int dlock__zk_check(void *state, const char *name, struct dlock__check_view *view);
int dlock__zk_force_release(void *state, const char *name);
int dlock__zk_list(void *state, const char *pattern, dlock_list_fn fn, void *arg);

/* --------------------------------------------------------------- ahead.c */

/* At most this many nodes ahead are watched one by one; a waiter behind
 * more watches only its predecessor and looks again when it goes. */
#define ZK_AHEAD_MAX 16

/* A waiter that watches every node ahead of its own (the nodes that keep
 * it out: every lock node before it, or for a reader the writers), its
 * own node and the lock-delay marker's path: sequence numbers only grow,
 * so no node can come ahead later, and when the deletion events have
 * taken them all the waiter is first without a look. Registered in
 * zb->aheads; its fields after the registration are guarded by zb->mu. */
struct zk_ahead {
    struct zk_ahead *next;
    struct zk_session *s;
    struct dlock__wait *w;
    char **paths;  /* the nodes ahead, full paths */
    bool *gone;    /* paths[i]'s deletion seen */
    int n, left;   /* how many; how many not yet gone */
    const char *mine; /* our node (the caller's) */
    char *marker;  /* the lock-delay marker's path */
    bool spoiled;  /* an event other than a deletion ahead: look again */
    int64_t sent;  /* when the watches went out: the server heard us then */
};

/* Watch the nodes ahead of MINE that LOOK_KIDS (the listing's lock
 * nodes, sorted, MINE at index POS) shows, for wait W on session S:
 * NULL when there are more than ZK_AHEAD_MAX or no memory (the caller
 * watches its predecessor alone), else the registered watcher, its
 * requests answered (a failure among them spoils it). */
struct zk_ahead_view {
    const char *lockpath, *mine;
    char *const *kids; /* names */
    int pos;
};
struct zk_ahead *dlock__zk_ahead_watch(struct zk_backend *zb, struct zk_session *s,
                                       const struct zk_ahead_view *v, struct dlock__wait *w,
                                       int64_t until);
/* Where T's count stands now, without a request or a sleep (a parked
 * wait's attempt, async.c): nodes ahead remain (WAITING); none is left
 * and ours is first, counted from T's requests (FIRST); or a look is
 * needed (LOOK: an event spoiled T, the session changed, or the server
 * was last heard too long ago). */
enum zk_ahead_state { ZK_AHEAD_WAITING, ZK_AHEAD_FIRST, ZK_AHEAD_LOOK };
enum zk_ahead_state dlock__zk_ahead_state(struct zk_backend *zb, struct zk_ahead *t);
/* Sleep in W until every node ahead of T is gone (*FIRST true: ours is
 * first, counted from T's requests) or a look is needed (*FIRST false:
 * an event spoiled T, the session changed, a safety-net TIMEOUT_MS
 * passed without a wake, or the server was last heard too long ago).
 * DLOCK_OK, or the sleep's DLOCK_ETIMEDOUT / DLOCK_ECANCELED. */
int dlock__zk_ahead_wait(struct zk_backend *zb, struct zk_ahead *t, int64_t timeout_ms,
                         bool *first);
/* Unregister and free T (NULL: nothing). */
void dlock__zk_ahead_free(struct zk_backend *zb, struct zk_ahead *t);
/* The session watcher's part (zb->mu held): a node event of TYPE on PATH
 * of session S, or (PATH NULL) a session event of S. */
void dlock__zk_ahead_event_locked(struct zk_backend *zb, struct zk_session *s, int type,
                                  const char *path);

/* ------------------------------------------------------------- delay.c */

/* How a look at a lock-delay marker reads one still "held" (its hold
 * still holds, or ended without a clean release and nobody looked since). */
enum zk_delay_look {
    ZK_DELAY_START,   /* its hold ended: start its delay now (a contender
                         that came first in the queue) */
    ZK_DELAY_SHOW,    /* its whole delay, nothing written (inspect) */
};
/* *LEFT: the ms left of the lock-delay of lock node LOCKPATH (0: none),
 * as HOW says, through session S. */
int dlock__zk_delay_look(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
                         enum zk_delay_look how, int64_t *left);
/* The marker of exclusive hold H (its token set) on LOCKPATH: "held". */
int dlock__zk_delay_arm(struct zk_backend *zb, const struct dlock__hold *h, const char *lockpath);
/* Before the clean release of the hold of TOKEN: its marker goes (best
 * effort; the calling thread's message is kept). */
void dlock__zk_delay_clear(struct zk_backend *zb, const char *lockpath, uint64_t token);

#endif /* DLOCK_BACKEND_ZK_H */
