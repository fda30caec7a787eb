/* redis.h -- what the files of the Redis backend share, and nothing else.
 *
 * The backend stands in layers; a file calls its own layer or those
 * below it, never one above:
 *
 *   redlock    redlock.c, redlock_hold.c, redlock_nodes.c,
 *              redlock_election.c (redlock.h): one lock over N nodes,
 *              each node a whole client of the layers below
 *   backend    backend.c       a client assembled from its URL (open,
 *                              open_node, close) and the backend table
 *   recipes    mutex.c (the lock: acquire, release, renew, inspect,
 *              force, list), rwlock.c (shared holds: Redisson's
 *              RReadWriteLock layout), fair.c (?layout=fair),
 *              semaphore.c, election.c, multi.c, cancel.c (what is owed
 *              after an acquire whose replies were lost), record.c (the
 *              client record: where a holder runs), value.c (a lock's
 *              value, written only while held), contend.c (a holder
 *              told of its waiters)
 *   hub        hub.c           the subscriber thread that turns release
 *                              messages into wake-ups of waiting threads
 *   scripts    scripts.c       the Lua scripts of scripts/NAME.lua
 *                              (embedded at build time, run by EVALSHA),
 *                              and dlock__redis_eval(): one struct
 *                              redis_request, one deadline
 *   routing    sentinel.c      redis+sentinel://: where the master is
 *              cluster.c       redis+cluster://: each request to its
 *                              slot's master, redirects followed
 *   keys       keys.c          the keys of a name (a cluster's encoded
 *                              names too), names that alias another's
 *                              refused; no I/O
 *   pool       conn.c          a server's state, dialing with AUTH and
 *                              SELECT, the connection pool and its
 *                              reconnect backoff
 *   sockets    net.c, tls.c    our sockets: dialing, one bounded poll
 *                              loop per request over one or more
 *                              connections, the reply cap; rediss://
 *                              through OpenSSL (openssl.c, openssl.h)
 *
 * Where a layer needs one above, it is handed a way up rather than
 * calling it (docs/architecture.md, "The Redis backend"): the pool asks
 * s->routing (struct redis_routing, set by backend.c) where the master
 * is and tells it when the master or the slots moved; a cluster loads
 * its scripts by the loader backend.c passes to its start, and renews a
 * hold its master did not renew by the renewer mutex.c passes (struct
 * redis_renewer). Everything here is private to those files; the core
 * sees only the table.
 */
#ifndef DLOCK_REDIS_H
#define DLOCK_REDIS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <hiredis/hiredis.h>

#include "backend.h"

struct ssl_ctx_st; /* OpenSSL's SSL_CTX, SSL (tls.c): no OpenSSL header here */
struct ssl_st;

#define REDIS_DEFAULT_PORT 6379
/* Reconnect backoff of the background users (keeper, hub) and of a
 * waiter during an outage. */
#define REDIS_BACKOFF_MIN_MS 50
#define REDIS_BACKOFF_MAX_MS 1000
#define REDIS_HUB_BUCKETS 1024
/* The masters (and seeds) a redis+cluster:// client keeps track of. */
#define REDIS_CLUSTER_MAX_NODES 64

/* The scripts, one per lock operation (scripts/NAME.lua). */
enum script_id {
    S_ACQUIRE, S_RELEASE, S_RENEW, S_INSPECT, S_FORCE, S_CANCEL,
    S_RW_RELEASE_READ, S_RW_DOWNGRADE, S_RW_UNWAIT, /* rwlock.c */
    S_SEM_ACQUIRE, S_SEM_RELEASE, S_SEM_RENEW, S_SEM_INSPECT, /* semaphore.c */
    S_FAIR, /* fair.c */
    S_ACQUIRE_MULTI, S_RELEASE_MULTI, /* multi.c */
    S_VALUE_SET, /* value.c */
    S_COUNT
};

/* The largest reply the backend takes: a lock's replies are small, a
 * SCAN page or an inspected hash a few kilobytes; past this the
 * connection is closed ("a reply larger than ..."), so a server or proxy
 * that sends a huge or endless bulk string cannot make us buffer it. */
#define REDIS_MAX_REPLY (32u << 20)
/* The longest array a reply may announce: hiredis 0.14 allocates an
 * array's element pointers when it reads the header, so "*555555557",
 * twelve bytes from a broken server or anything on the path, asked for
 * 4 GiB (found by tests/fuzz/fuzz_redis_replies.c). A lock's replies hold
 * a few elements, a SCAN page or an inspected hash some thousands. */
#define REDIS_MAX_ELEMENTS (1 << 20)

/* Where to dial: HOST:PORT, or the unix socket SOCK when not NULL. */
struct redis_addr {
    const char *host;
    int port;
    const char *sock;
    struct ssl_ctx_st *tls; /* TLS with this context (tls.c); NULL: plain */
};

/* One connection of ours (net.c): a non-blocking socket, what is still
 * to be written, hiredis's reader, and the replies parsed so far. */
struct rconn {
    int fd;
    redisReader *reader;
    char *out; /* formatted commands; out_off bytes of them written */
    size_t out_len, out_off, out_cap;
    size_t want; /* replies owed for the commands appended */
    redisReply **got; /* replies received, not yet taken */
    size_t ngot, taken, got_cap;
    size_t partial; /* bytes of the reply being received */
    struct ssl_st *tls; /* NULL: plain */
    bool tls_want_write; /* TLS must write before it can read */
    bool tls_write_wants_read; /* TLS must read before it can write on */
    size_t nreplies; /* replies received since it was dialed */
    bool broken;
    char err[200]; /* why it broke */
    char where[300]; /* "redis 127.0.0.1:6379", for messages */

    unsigned gen; /* pool generation when dialed (conn.c) */
    bool unannounced; /* a reconnect, said once the server answers on it (conn.c) */
    int64_t until; /* the current request ends by then (monotonic ms) */
    /* the wait of the acquire the current request serves (its cancel
     * ends the request: net.c), or NULL */
    struct dlock__wait *wait;
    struct rconn *next;
};

struct redis_routing;  /* conn.c */
struct hub_chan;       /* hub.c */
struct hub_conn;       /* hub.c */
struct redis_cluster;  /* cluster.c */
struct pending_cancel; /* cancel.c */

/* The subscriber hub: one connection and thread per client (hub.c). */
struct hub {
    pthread_mutex_t mu;
    pthread_t thread;
    bool started, stop;
    int efd; /* eventfd: wakes the hub thread */
    struct hub_chan *buckets[REDIS_HUB_BUCKETS];
    struct hub_chan *todo;
    struct hub_conn *conns; /* the hub thread's: one, or one per cluster master */
};

/* One sentinel of a redis+sentinel:// URL (the host is the URL's). */
struct redis_sentinel_addr {
    const char *host;
    int port;
};

struct redis_state {
    struct dlock_client *c;
    char *host; /* NULL for a unix socket; with Sentinel the current master,
                   under pool_mu */
    int port;
    char *sock;
    int db;
    const char *user, *password;
    char *env_password; /* password's storage when it came from the environment */
    struct ssl_ctx_st *tls; /* rediss://: the TLS context; NULL: plain */
    int64_t connect_timeout_ms, op_timeout_ms;
    const char *prefix;
    bool simple;
    bool fair; /* ?layout=fair: every exclusive lock is fair (fair.c) */
    int64_t fair_queue_lease_ms; /* ?queue_lease (fair.c); 0: the default */
    int sync_replicas; /* ?sync=N: replicas that must acknowledge a write (0: off) */
    int64_t sync_timeout_ms; /* ?sync_timeout: WAIT's timeout */
    char uuid[37];
    int64_t record_until_ms; /* atomic: our client record lives until then (record.c) */
    char where[300]; /* "redis 127.0.0.1:6379", for messages */

    const char *src[S_COUNT];
    char sha[S_COUNT][41];
    uint64_t requests; /* acquire request numbers handed out (atomic) */

    pthread_mutex_t pool_mu;
    struct rconn *idle;
    unsigned gen;
    struct dlock__backoff backoff; /* background reconnects */
    int64_t next_dial_ms;
    unsigned dialed_gen; /* gen + 1 of the last pool dial, 0 none: a reconnect (stats) */
    const struct redis_routing *routing; /* the pool's way up (conn.c); NULL: one server */

    struct hub hub;

    /* redis+sentinel:// (sentinel.c) */
    bool sentinel;
    char *master_name;
    struct redis_sentinel_addr *sentinels;
    size_t sentinel_first; /* atomic: the one that answered last, asked first */
    size_t nsentinels;
    char *sentinel_password; /* the URL's, a file's or the environment's */
    struct dlock__timed_mutex resolve_mu; /* one resolution at a time */
    bool master_stale;          /* under pool_mu: ask the sentinels again */
    unsigned master_epoch;      /* under pool_mu: bumped by each resolution */
    size_t watch_next;          /* hub thread: watch the sentinel after the last watched */

    /* redis+cluster:// (cluster.c): the slot map and a state per master,
     * shared by the URL's front state and each master's (cluster_node) */
    struct redis_cluster *cluster;
    bool cluster_node;

    /* cancels of lost acquires not yet sent (cancel.c) */
    pthread_mutex_t cancel_mu;
    struct pending_cancel *cancels;
};

/* A counter's decimal text (LEN bytes) as a uint64 into *OUT: false for
 * anything else (no digits, other bytes, past 2^64 - 1), which a reader
 * must refuse rather than take the digits in front. */
bool dlock__redis_parse_u64(const char *text, size_t len, uint64_t *out);

/* The keys of one lock: the lock, its token counter, its channel and the
 * record of canceled acquires; for read-write locks RReadWriteLock's
 * channel, the record of waiting writers and the base of the readers'
 * timeout keys, "{name}"; for fair locks the queue and the waiters'
 * records (docs/protocol-redis.md). */
struct lock_keys {
    char *lock, *token, *chan, *canceled, *rwchan, *writers, *queue, *waiters, *tbase, *delay;
    size_t lock_len, token_len, chan_len, canceled_len, rwchan_len, writers_len, queue_len,
        waiters_len, tbase_len, delay_len;
};

/* ---------------------------------------------------------- backend.c */

int dlock__redis_open(struct dlock_client *c, void **state);
/* The state of host NODE of C's URL, one node of a multi-node URL
 * (redlock.c); -1: the one host of a single-node URL (dlock__redis_open). A
 * node's scripts are not loaded at open (it may be down): the caller
 * fills s->sha, and EVALSHA falls back to EVAL. */
int dlock__redis_open_node(struct dlock_client *c, int node, void **state);
void dlock__redis_close(void *state);
extern const struct dlock__backend dlock__backend_redis;

/* ------------------------------------------------------------- conn.c */

/* A state for client C with nothing dialed or parsed yet, its locks and
 * backoff set up; NULL without memory. dlock__redis_state_free() closes
 * its idle connections and frees what it holds (the TLS context too:
 * a state that borrows another's clears s->tls first); a client's state
 * is freed by dlock__redis_close(), which stops its hub first. */
struct redis_state *dlock__redis_state_new(struct dlock_client *c);
void dlock__redis_state_free(struct redis_state *s);
/* What the pool needs of the routing above it (sentinel.c, cluster.c),
 * so that conn.c calls only down: backend.c sets s->routing when it
 * assembles a client (a cluster master's state takes its front's), NULL
 * for one server. A member a routing does without is NULL. */
struct redis_routing {
    /* Where the master is now (HOST, *PORT; *EPOCH the resolution it came
     * from), within DEADLINE: Sentinel asks the sentinels when stale. NULL:
     * s->host and s->port. */
    int (*master)(struct redis_state *s, int64_t deadline, char *host, size_t host_len, int *port,
                  unsigned *epoch);
    /* The master may have moved: a dial to it failed, a connection to it
     * broke, or it refused a write with READONLY (a replica now). */
    void (*master_moved)(struct redis_state *s);
    /* The slots may have moved: MOVED, ASK, TRYAGAIN or CLUSTERDOWN. */
    void (*slots_moved)(struct redis_state *s);
};
/* Map a server error reply to a code, with the server's words; a reply
 * saying the master or the slots moved tells s->routing. */
int dlock__redis_server_error(struct redis_state *s, const char *text, const char *what);
/* One command on K within K->until (ARGL may be NULL: strlen): *OUT is
 * the reply (an error reply too), or the failure is DLOCK_ECONN naming
 * WHAT and K is broken. *WRITTEN (may be NULL) is set true once the whole
 * command was written, so the server may have run it. */
int dlock__redis_command(struct rconn *k, int argc, const char **argv, const size_t *argl,
                         const char *what, redisReply **out, bool *written);
/* Dial, authenticate, select the db (SELECT_DB), every step within what
 * is left until DEADLINE (monotonic ms; 0 or DLOCK__NEVER: the connect
 * and op timeouts whole) and until W's cancel (W may be NULL: the wait of
 * the acquire the connection is dialed for; DLOCK_ECANCELED). On failure
 * *OUT is NULL and the message names host:port and the server's words;
 * DLOCK_ETIMEDOUT when DEADLINE passed before anything was sent. */
int dlock__redis_dial(struct redis_state *s, bool select_db, int64_t deadline,
                      struct dlock__wait *w, struct rconn **out);
/* The same to the address A (Sentinel: a master candidate). */
int dlock__redis_dial_addr(struct redis_state *s, const struct redis_addr *a, bool select_db,
                           int64_t deadline, struct dlock__wait *w, struct rconn **out);
/* Take an idle connection or dial a new one, its request bound (until)
 * set to now + dlock__time_left(DEADLINE, op timeout). BACKGROUND callers (keeper)
 * respect the reconnect backoff; callers' own requests always dial.
 * DLOCK_ETIMEDOUT when DEADLINE has passed: nothing is sent. */
int dlock__redis_pool_get(struct redis_state *s, bool background, int64_t deadline, struct rconn **out);
/* dlock__redis_pool_get() for a caller's request that serves the wait W
 * (an acquire's): a dial, when one is needed, ends at W's cancel too
 * (DLOCK_ECANCELED, nothing sent). */
int dlock__redis_pool_get_for(struct redis_state *s, int64_t deadline, struct dlock__wait *w,
                              struct rconn **out);
/* dlock__redis_pool_get() for the N nodes SS[0..N) of one URL (Redlock,
 * not Sentinel) at once: those with no idle connection are dialed
 * together (dlock__redis_conn_dial_many), and once NEED nodes have a
 * connection (idle ones count) the dials left get only a grace, so a
 * node that does not answer costs the others little. OUT[i], or NULL
 * with RC[i] and MSG[i]. */
void dlock__redis_pool_get_many(struct redis_state **ss, size_t n, bool background,
                                int64_t deadline, size_t need, struct rconn **out, int *rc,
                                char (*msg)[DLOCK__MSG_MAX]);
/* Give K back; BROKEN (an I/O error) closes it and retires every idle
 * connection dialed before, since the server may have restarted. */
void dlock__redis_pool_put(struct redis_state *s, struct rconn *k, bool broken);

/* --------------------------------------------------------------- net.c */

/* Dial A (non-blocking, close-on-exec) within UNTIL (monotonic ms):
 * DLOCK_OK, or DLOCK_ECONN naming the address and why. */
int dlock__redis_conn_dial(const struct redis_addr *a, int64_t until, struct rconn **out);
/* The same for the N addresses A[0..N) at once: every connect (and TLS
 * handshake) under way together in one poll loop ending at UNTIL; once
 * NEED of them are connected, the others get a grace (four times what
 * those took, at least 25 ms and a quarter of the bound), so a node that
 * does not answer costs the others little. W (may be NULL): the wait the
 * dials serve, whose cancel fails those still under way (DLOCK_ECANCELED).
 * OUT[i] is the connection, or NULL with RC[i] and MSG[i] saying why. */
void dlock__redis_conn_dial_many(const struct redis_addr *a, size_t n, int64_t until, size_t need,
                                 struct dlock__wait *w, struct rconn **out, int *rc,
                                 char (*msg)[DLOCK__MSG_MAX]);
/* A connection with no socket yet (fd -1) and its reply reader; NULL
 * when out of memory. */
struct rconn *dlock__redis_conn_new(void);
/* Parse N bytes received on K into replies (dlock__redis_conn_take), as
 * the poll loop does with what it reads; a protocol error or a reply over
 * REDIS_MAX_REPLY leaves K broken. Also how tests/fuzz feeds replies. */
void dlock__redis_conn_feed(struct rconn *k, const char *buf, size_t n);
/* Mark K broken with a reason (the first one sticks). */
void dlock__redis_conn_fail(struct rconn *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Close K and free what it holds (NULL: nothing). */
void dlock__redis_conn_free(struct rconn *k);
/* Format one command onto K's output (ARGL may be NULL: strlen); K then
 * owes one more reply. DLOCK_OK or DLOCK_ENOMEM. Nothing is sent yet. */
int dlock__redis_conn_append(struct rconn *k, int argc, const char **argv, const size_t *argl);
/* One request over the N connections KS, in one poll loop that ends at
 * UNTIL: write what each has appended, read every reply each owes. A
 * connection that fails (closed, reset, silent or trickling past UNTIL,
 * a reply over REDIS_MAX_REPLY, a protocol error) is left broken with
 * its reason; the others go on. DLOCK_OK when none failed, else
 * DLOCK_ECONN with the first failure's message ("WHERE: WHAT: why"). */
int dlock__redis_exchange(struct rconn **ks, size_t n, int64_t until, const char *what);
/* The same for a quorum (Redlock): once NEED connections have answered
 * everything they owe, the others are waited for only a grace (four
 * times what those took, at least 25 ms, within UNTIL) and then left
 * broken ("no reply ... while the others answered"), so a stopped node
 * does not hold every request for the whole bound. */
int dlock__redis_exchange_quorum(struct rconn **ks, size_t n, int64_t until, const char *what,
                                 size_t need);
/* The next reply received on K, in order (the caller frees it), or NULL. */
redisReply *dlock__redis_conn_take(struct rconn *k);
/* Whether everything appended to K was written (the server may have
 * run it). */
bool dlock__redis_conn_sent(const struct rconn *k);
/* For a long-lived connection in someone else's poll (the hub): the
 * events to poll K for, and the non-blocking I/O to do once poll
 * returned REVENTS; replies go to dlock__redis_conn_take(). */
short dlock__redis_conn_events(const struct rconn *k);
void dlock__redis_conn_pump(struct rconn *k, short revents);

/* ---------------------------------------------------------- sentinel.c */

/* Read a redis+sentinel:// URL of C into S (sentinels, master name,
 * sentinel_password). */
int dlock__redis_sentinel_parse(struct redis_state *s, struct dlock_client *c);
/* The current master's address (HOST, *PORT; *EPOCH the resolution it
 * came from), asking the sentinels first when it is stale or unknown,
 * within DEADLINE. */
int dlock__redis_sentinel_master(struct redis_state *s, int64_t deadline, char *host, size_t host_len,
                          int *port, unsigned *epoch);
/* Ask the sentinels where the master is (ROLE-checked), unless another
 * thread did since resolution EPOCH. */
int dlock__redis_sentinel_resolve(struct redis_state *s, unsigned epoch, int64_t deadline);
/* For the hub thread: a connection to the next sentinel subscribed to
 * +switch-master (NULL when it does not answer); and whether what it
 * received announces a failover of our master (then marked stale). */
struct rconn *dlock__redis_sentinel_watch(struct redis_state *s);
bool dlock__redis_sentinel_switched(struct redis_state *s, struct rconn *w);
/* The backend's master(): the current master as "host:port" (Sentinel
 * URLs only, DLOCK_ENOTSUP otherwise). */
int dlock__redis_master(void *state, char *buf, size_t size);
/* The master may have moved (a broken connection, READONLY): ask again
 * before the next dial. No-op without Sentinel. */
void dlock__redis_sentinel_stale(struct redis_state *s);
/* Sentinel: H was just confirmed (acquired or renewed): remember by which
 * master (the current one, in h->bdata, freed by the release). No-op
 * without Sentinel. */
void dlock__redis_sentinel_confirmed(struct redis_state *s, struct dlock__hold *h);
/* Sentinel: when the master now is not the one that last confirmed H (a
 * failover since), a note for H's lost reason naming both into BUF;
 * otherwise BUF is "". */
void dlock__redis_sentinel_lost_note(struct redis_state *s, const struct dlock__hold *h, char *buf,
                                     size_t size);

/* ----------------------------------------------------------- cluster.c */

/* The hash slot of KEY (its "{tag}" when it has one), and of the lock
 * key of NAME under S's prefix. */
unsigned dlock__redis_cluster_slot(const char *key, size_t len);
unsigned dlock__redis_cluster_name_slot(const struct redis_state *s, const char *name);
/* Read a redis+cluster:// URL of C into S; then, once S is set up, learn
 * the slot map and load the scripts (start: LOAD_SCRIPTS on the master
 * that answered, whose digests every master's state then shares;
 * backend.c passes scripts.c's loader). free: every master's state and
 * the map (a master's state: nothing). */
int dlock__redis_cluster_parse(struct redis_state *s, struct dlock_client *c);
int dlock__redis_cluster_start(struct redis_state *s, int (*load_scripts)(struct redis_state *n));
void dlock__redis_cluster_free(struct redis_state *s);
/* Where one request of a cluster goes: the master of its slot, or the
 * node a redirect named; retries of a cluster between two states end at
 * UNTIL (set at the first), or at WAIT's cancel or deadline. Initialise
 * with dlock__redis_route_init(RT, W): W the wait of the acquire the
 * request serves, NULL for none (a release, the keeper's work). */
struct dlock__redis_route {
    int node; /* -1: the slot map's */
    bool ask; /* ASKING first (a slot being migrated) */
    unsigned hops;
    int64_t until;
    struct dlock__backoff backoff;
    struct dlock__wait *wait;
};
void dlock__redis_route_init(struct dlock__redis_route *rt, struct dlock__wait *w);
/* A connection (*OUT, from the pool of *NS) to the master serving the
 * slot of KEYS (all in one slot, else DLOCK_EINVAL), or to the node RT
 * names, within DEADLINE; a master that cannot be reached marks the map
 * stale and is retried (after a refresh) within the call's time left and
 * RT's wait (DLOCK_ECANCELED). */
int dlock__redis_cluster_get(struct redis_state *s, struct dlock__redis_route *rt, int nkeys,
                             const char **keys, const size_t *lens, int64_t deadline,
                             struct redis_state **ns, struct rconn **out);
/* 1 when reply R, from node FROM, redirects the request (MOVED, ASK:
 * to FROM's host when the reply names none) or asks it to pass
 * (TRYAGAIN, CLUSTERDOWN: after a pause within DEADLINE and RT's wait):
 * then RT says where to send it again; 0 when R is the answer; a
 * redirect not followed: DLOCK_EUNAVAIL (too many hops, no time left:
 * R's words are the message to give), DLOCK_ECANCELED (RT's wait was
 * canceled in the pause). Either way the request did not run. */
int dlock__redis_cluster_redirect(struct redis_state *s, struct dlock__redis_route *rt,
                                  const struct redis_state *from, const redisReply *r,
                                  int64_t deadline);
/* One command ARGV about KEY on S's server, or on a cluster the master
 * serving KEY's slot (redirects followed), within DEADLINE: *OUT the
 * reply; an error reply becomes its code with the server's words. */
int dlock__redis_keyed_command(struct redis_state *s, int64_t deadline, const char *key, int argc,
                               const char **argv, const char *what, redisReply **out);
/* For the subscriber (hub.c): the index of the master serving KEY's
 * slot in the map as it is (-1: none known), a connection to the node of
 * index I, and the map read again if it is stale (bounded by the op
 * timeout). */
int dlock__redis_cluster_owner(struct redis_state *s, const char *key, size_t len);
int dlock__redis_cluster_dial_node(struct redis_state *s, int i, int64_t deadline, struct rconn **out);
void dlock__redis_cluster_refresh_stale(struct redis_state *s);
/* SRC with its publish calls made spublish on a cluster (sharded
 * pub/sub: the subscribers of the slot's master only), SRC elsewhere;
 * and the command that publishes on S. */
const char *dlock__redis_sharded_script(struct redis_state *s, const char *src);
const char *dlock__redis_publish_command(const struct redis_state *s);
/* Mark S's slot map stale (a redirect, a master gone). No-op without a
 * cluster. */
void dlock__redis_cluster_stale(struct redis_state *s);
/* How the recipes renew holds (mutex.c passes its own): BATCH, the
 * holds of one server, pipelined; ONE, a lock hold alone within DEADLINE
 * by the routed script path (redirects followed): DLOCK_OK (confirmed),
 * DLOCK_ELOST, or why it could not be renewed. */
struct redis_renewer {
    int (*batch)(void *state, struct dlock__renew_batch *b);
    int (*one)(struct redis_state *s, struct dlock__hold *h, int64_t deadline);
};
/* The backend's renew and SCAN over every master: RENEW->batch (SCAN)
 * run on each master's state with its holds (on its keys); a lock hold
 * its master did not renew (moved, migrating, gone) tried once more by
 * RENEW->one. */
int dlock__redis_cluster_renew(struct redis_state *s, struct dlock__renew_batch *b,
                               const struct redis_renewer *renew);
typedef int dlock__redis_scan_each(struct redis_state *s, struct rconn *k, const redisReply *key,
                                   void *arg, int *err);
int dlock__redis_cluster_scan(struct redis_state *f, const char *match, const char *type,
                              dlock__redis_scan_each *each, void *arg,
                              int (*scan)(struct redis_state *s, const char *match,
                                          const char *type, dlock__redis_scan_each *each,
                                          void *arg));

/* --------------------------------------------------------------- tls.c */

/* S's TLS context (s->tls): verify against CA (a file or a hashed
 * directory; NULL: the system store), client certificate CERT + KEY
 * (both or neither). DLOCK_EINVAL naming a file that does not load. */
int dlock__redis_tls_context(struct redis_state *s, const char *ca, const char *cert, const char *key);
void dlock__redis_tls_context_free(struct ssl_ctx_st *ctx);
/* TLS over K's connected socket: SNI and certificate check against HOST
 * set up (DLOCK_OK or DLOCK_ENOMEM); then each dlock__redis_tls_step()
 * goes on with the handshake without blocking: DLOCK_OK with *EVENTS 0
 * once done, or the poll events it waits for; DLOCK_ECONN naming the
 * verification error or the handshake's failure. net.c bounds it. */
int dlock__redis_tls_start(struct rconn *k, struct ssl_ctx_st *ctx, const char *host);
int dlock__redis_tls_step(struct rconn *k, short *events);
/* Non-blocking SSL_write (WRITE) or SSL_read on K: as send(2)/recv(2)
 * (-1 + EAGAIN when it must wait, 0 when closed); a TLS error marks K
 * broken with OpenSSL's words. */
ssize_t dlock__redis_tls_io(struct rconn *k, char *buf, size_t len, bool write);
void dlock__redis_tls_free(struct rconn *k);

/* ------------------------------------------------------------- keys.c */

/* Lock NAME's keys (prefix + NAME and the rest of struct lock_keys), in
 * one block. */
int dlock__redis_keys_make(struct redis_state *s, const char *name, struct lock_keys *k);
void dlock__redis_keys_free(struct lock_keys *k);
/* One key made from a base key: BEFORE + the base in braces + AFTER
 * (Redisson's prefixName/suffixName, so the key shares the base's cluster
 * slot), the base bare when it carries a hash tag already; where it is
 * made in *KEY, its length in *LEN. */
struct key_part {
    const char *before, *after;
    char **key;
    size_t *len;
};
/* The base key of NAME (S's prefix + NAME) into *BASE, its length in
 * *BASE_LEN, and PARTS[0..N) made from it, all in one malloc'd block that
 * starts at *BASE: free(*BASE) frees them all. DLOCK_ENOMEM (message set)
 * when out of memory. */
int dlock__redis_key_block(const struct redis_state *s, const char *name, char **base,
                           size_t *base_len, const struct key_part *parts, size_t n);
/* What KEY (LEN bytes) is when it is, or can be, one of the keys dlock
 * makes from a name (a token counter, a channel, a record, a semaphore's
 * expiries, a name's "{N}" base...): "a semaphore's token counter
 * (dlock_sem_token:{N})"...; NULL for any other key. A lock, election or
 * semaphore whose key is one would meet another name's keys
 * (docs/protocol-redis.md, "Names that alias dlock's keys"). */
const char *dlock__redis_derived_key(const char *key, size_t len);
/* DLOCK_EINVAL, naming NAME (a KIND: "lock", "semaphore"), its key
 * (prefix + name) and why, when that key is such a key or NAME is one a
 * cluster's encoded names would meet ("dlock_name:..."); else DLOCK_OK. */
int dlock__redis_name_check(const struct redis_state *s, const char *kind, const char *name);
/* NAME's base key (malloc'd, its length in *LEN; NULL without memory):
 * S's prefix + NAME, or on a cluster, when the keys made from that would
 * fall in different slots (a '}' without a '{' before it, a '{' without a
 * '}' after it, an empty tag "{}"), prefix + "dlock_name:{" + NAME + "}"
 * with '{', '}', '%' and bytes outside printable ASCII as %XX (both
 * parts): one tag, one slot (docs/protocol-redis.md, "Cluster"). */
char *dlock__redis_name_key(const struct redis_state *s, const char *name, size_t *len);
/* The name whose base key KEY (LEN bytes, starting with S's prefix) is:
 * the rest after the prefix, decoded when encoded; NULL without memory
 * or when KEY is shorter than the prefix. */
char *dlock__redis_key_name(const struct redis_state *s, const char *key, size_t len);
/* Whether KEY (starting with S's prefix) is a cluster's encoded name's. */
bool dlock__redis_key_encoded(const struct redis_state *s, const char *key, size_t len);

/* ---------------------------------------------------------- scripts.c */

/* A Lua script as embedded from scripts/NAME.lua (NUL-terminated), with
 * its EVALSHA digest (lower-case hex, computed at build time). */
struct redis_script {
    const char *name, *src, *sha;
};

/* Script ID for the layout (SIMPLE or Redisson's). */
const struct redis_script *dlock__redis_script(enum script_id id, bool simple);
/* Every embedded script, by index I from 0 (for the digest test): false
 * past the last. */
bool dlock__redis_script_nth(size_t i, const char **name, const char **src, const char **sha);
/* Redlock's token raise (redlock.c) and a publish on one channel
 * (redlock_election.c). */
extern const struct redis_script dlock__redis_raise_script;
extern const struct redis_script dlock__redis_leader_publish_script;
/* Load the scripts once so EVALSHA has their digests. */
int dlock__redis_load_scripts(struct redis_state *s);
/* The same in two halves, for several nodes in one exchange (Redlock):
 * append every SCRIPT LOAD to K; then, once the exchange ended with RC,
 * take the digests from the replies and give K back to S's pool. */
int dlock__redis_scripts_append(struct redis_state *s, struct rconn *k);
int dlock__redis_scripts_take(struct redis_state *s, struct rconn *k, int rc);
/* The buffers of one renewal batch (redis_renew, dlock__redlock_renew): ARGS
 * argument slots (argv, argl), VALS owner values, HOLDS lease strings and
 * key sets. dlock__redis_renew_bufs_new() gives DLOCK_OK or DLOCK_ENOMEM
 * (with the message set); dlock__redis_renew_bufs_free() frees what was
 * made, each key set too, and may be called after either. */
struct renew_bufs {
    const char **argv;
    size_t *argl;
    char (*vals)[160];
    char (*leases)[24];
    struct lock_keys *keys;
    size_t holds;
};
int dlock__redis_renew_bufs_new(struct renew_bufs *r, size_t args, size_t vals, size_t holds);
void dlock__redis_renew_bufs_free(struct renew_bufs *r);
/* One script request: what to send, the one bound it runs within, and
 * what came of it. The caller fills the first part (a designated
 * initializer: what it leaves out is 0, NULL or false), the call `out`. */
struct redis_request {
    enum script_id script;
    int nkeys, nargs; /* args[0..nargs), the first nkeys of them keys */
    const char **args;
    const size_t *lens;
    /* The arguments of a second attempt (an acquire's carries another
     * request number); NULL: args again. */
    const char **retry_args;
    const size_t *retry_lens;
    bool once; /* no second attempt after a lost reply */
    const char *what; /* for messages: "acquire", "release", ... */
    /* The wait of the acquire the request serves (NULL: none): its cancel
     * ends the request at once (DLOCK_ECANCELED), and a cluster's pause
     * between two tries (TRYAGAIN, CLUSTERDOWN, a master unreachable)
     * at its cancel or deadline; what a run would leave is the caller's
     * to owe the keeper. */
    struct dlock__wait *wait;
    /* The backend call's one deadline (monotonic ms; 0, a try-once, and
     * DLOCK__NEVER: the op timeout whole), cut to the op timeout. */
    int64_t deadline;
    struct {
        redisReply *reply; /* the answer (the caller frees it) */
        int64_t sent_ms; /* send time of the attempt that answered */
        bool retried; /* a second attempt answered */
        /* an attempt was written whole and not refused unrun (a
         * cluster's redirect, a demoted master's READONLY), so that the
         * server may have run it even when the call failed */
        bool reached;
        /* with ?sync=N: how many replicas acknowledged the write, -1
         * when not asked (no ?sync, or a script that only reads) */
        int acked;
    } out;
};
/* Run RQ's script once, or, unless rq->once, when the reply was lost to
 * an I/O error or timeout, once more on a fresh connection (the scripts
 * are written so a repeat is harmless) with the retry arguments, every
 * attempt within one budget (dlock__time_budget of rq->deadline and the
 * op timeout): a retry gets what the first attempt left, none after a
 * timeout. With ?sync=N a WAIT N goes behind a script that writes, in the
 * same round trip; the caller decides what too few acknowledgements mean
 * (an acquire is undone). A failure with rq->out.reached set
 * (DLOCK_ECONN: the reply lost; DLOCK_ECANCELED: the wait canceled with
 * the request in flight, or while the retry of a lost reply paused)
 * may have run: the caller owes what a run would have left. */
int dlock__redis_eval(struct redis_state *s, struct redis_request *rq);
/* With ?sync=N: append WAIT N to K, its timeout sync_timeout cut to what
 * K's request has left; false when sync is off (nothing appended). */
bool dlock__redis_sync_append(struct redis_state *s, struct rconn *k);
/* The number of replicas a WAIT reply R says acknowledged. */
int dlock__redis_sync_acked(const redisReply *r);
/* Decode a lock script's reply: *VALUE, or *TYPE_NAME for a key of the
 * wrong type. */
int dlock__redis_script_reply(struct redis_state *s, const redisReply *r, long long *value,
                              const char **type_name);
/* DLOCK_EWRONGTYPE naming the lock key K and the TYPE_NAME it holds. */
int dlock__redis_wrongtype(struct redis_state *s, const struct lock_keys *k, const char *type_name);

/* ----------------------------------------------------------- cancel.c */

/* How long the record of a canceled acquire lives on the server, for a
 * lease of LEASE_MS. */
int64_t dlock__redis_cancel_life_ms(int64_t lease_ms);
/* An acquire by H's owner whose replies were lost: owe the server a
 * cancel of that owner's requests on H->name up to number LAST (queued;
 * the caller does not wait). Keeps the caller's message. */
void dlock__redis_cancel_lost_acquire(struct redis_state *s, const struct dlock__hold *h, uint64_t last,
                               int64_t lease_ms);
/* A writer's unwait (rwlock.c) owed to the cleanup queue at once, sent
 * by the keeper (Redlock: to a node that did not answer in time), or by
 * H's owner before its next acquire of H->name, whichever comes first.
 * Keeps the message. */
void dlock__redis_rw_unwait_owe(struct redis_state *s, const struct dlock__hold *h);
/* Before H's owner sends an acquire of H->name: send what it still owes
 * there (a cancel, an unwait), within DEADLINE and until the cancel of
 * the acquire's wait W (may be NULL): its requests, a cluster's pauses
 * and the wait while the keeper sends the same end there
 * (DLOCK_ECANCELED). DLOCK_OK, or why it could not. */
int dlock__redis_cancel_owed(struct redis_state *s, const struct dlock__hold *h, int64_t deadline,
                             struct dlock__wait *w);
/* Undo an acquisition of H (request numbers up to LAST) that too few
 * replicas acknowledged (sync=N): owe the cancel of those requests, then
 * send it within DEADLINE, the call's budget. DLOCK_OK once sent; else
 * why, and it stays owed: the cleanup queue (the keeper) sends it, and
 * the owner's next acquire of the name sends it first. */
int dlock__redis_undo_acquire(struct redis_state *s, const struct dlock__hold *h, uint64_t last,
                              int64_t deadline);

/* ------------------------------------------------------------ multi.c */

/* The multi ops' acquire: an exclusive set in one script call
 * (backend.h); DLOCK_ENOTSUP for a shared one. */
int dlock__redis_multi_acquire(void *state, struct dlock__hold **hs, size_t n,
                               struct dlock__wait *w, size_t *busy);
/* The multi ops' release: an exclusive set's release in one script
 * call (scripts/release_multi.lua), each member checked as the single
 * release checks it. */
int dlock__redis_multi_release(void *state, struct dlock__hold **hs, size_t n, int *rcs);

/* ----------------------------------------------------------- rwlock.c */

/* Shared holds need the Redisson layout: DLOCK_ENOTSUP with a message
 * under layout=simple, else DLOCK_OK. */
int dlock__redis_rw_check_layout(struct redis_state *s, const struct dlock__hold *h);
/* Give shared hold H back (scripts/rw_release_read.lua). */
int dlock__redis_rw_release(struct redis_state *s, struct dlock__hold *h);
/* The backend's downgrade: exclusive hold H becomes shared in place. */
int dlock__redis_rw_downgrade(void *state, struct dlock__hold *h);
/* A writer (H's owner) that recorded itself as waiting gives up, its
 * wait ending at DEADLINE: take its record away within what is left of
 * the wait, else owe it to the core's cleanup queue (the keeper sends it;
 * best effort: the record lapses anyway). Keeps the caller's message. */
void dlock__redis_rw_unwait(struct redis_state *s, const struct dlock__hold *h, int64_t deadline);
/* Send OWNER's unwait of NAME (scripts/rw_unwait.lua) within DEADLINE
 * and until W's cancel (W may be NULL: the owner's next wait, which sends
 * it first): DLOCK_OK once done, or when the server answered with an
 * error (it would answer the same again); else the failure of a reply
 * that did not come (DLOCK_ECANCELED: W canceled). */
int dlock__redis_rw_send_unwait(struct redis_state *s, const char *name, const char *owner,
                                int64_t deadline, struct dlock__wait *w);
/* A lock waiter W of H (keys K) with the subscriber hub: listen on the
 * channels releases of H's name are announced on (readers: RReadWriteLock's;
 * writers: RLock's, and on the Redisson layout RReadWriteLock's too, where
 * Redisson's read-write unlocks publish); whether every one of them is
 * subscribed; a try is about to use the wakes received; stop listening
 * (dlock__redis_hub_join/subscribed/ack/leave over each channel). */
int dlock__redis_rw_listen(struct redis_state *s, const struct dlock__hold *h,
                           const struct lock_keys *k, struct dlock__wait *w);
bool dlock__redis_rw_listening(struct redis_state *s, const struct dlock__hold *h,
                               const struct lock_keys *k);
void dlock__redis_rw_heard(struct redis_state *s, const struct dlock__hold *h,
                           const struct lock_keys *k, struct dlock__wait *w);
void dlock__redis_rw_unlisten(struct redis_state *s, const struct dlock__hold *h,
                              const struct lock_keys *k, struct dlock__wait *w, bool acquired);
/* H's reader timeout key, "{name}:<owner>:rwlock_timeout:1", into BUF;
 * "" for an exclusive hold. Returns its length. */
int dlock__redis_rw_timeout_key(const struct lock_keys *k, const struct dlock__hold *h, char *buf,
                                size_t size);

/* -------------------------------------------------------------- hub.c */

/* Start the hub thread now (Sentinel: it watches +switch-master from the
 * start, waiters or not); dlock__redis_hub_join() starts it otherwise. */
int dlock__redis_hub_start(struct redis_state *s);
/* Register W as a waiter on CHAN, subscribing when it is the first. */
int dlock__redis_hub_join(struct redis_state *s, const char *chan, size_t len, struct dlock__wait *w);
/* The same for a waiter woken by every message on CHAN, whatever it says,
 * but one of them per message, and none when the longest-waiting one of
 * them still holds a wake (a writer on RReadWriteLock's channel, woken
 * for the same release through RLock's channel already). */
int dlock__redis_hub_join_head(struct redis_state *s, const char *chan, size_t len,
                               struct dlock__wait *w);
/* The same for a waiter woken by messages on CHAN only, whatever they
 * say, one waiter per message, never by the subscription (re)starting:
 * one that has its own way to catch up on a message it missed (a fair
 * lock's waiter: its grant channel and its refresh). */
int dlock__redis_hub_join_quiet(struct redis_state *s, const char *chan, size_t len,
                                struct dlock__wait *w);
/* Whether messages on CHAN reach us now. */
bool dlock__redis_hub_subscribed(struct redis_state *s, const char *chan, size_t len);
/* W is about to try: a wake it received is being used now. */
void dlock__redis_hub_ack(struct redis_state *s, const char *chan, size_t len, struct dlock__wait *w);
/* W's try was busy where a waiter behind it may not be: wake that one. */
void dlock__redis_hub_pass(struct redis_state *s, const char *chan, size_t len,
                           const struct dlock__wait *w);
/* Register W as a waiter on CHAN under KEY (a fair lock's wait id, a
 * string that outlives the wait): a message on CHAN whose first word is
 * KEY wakes only W and is kept for dlock__redis_hub_take(); a message
 * naming no waiter is dropped. CHAN stays subscribed from then on (one
 * channel per client: no subscription per wait). KEY NULL: as
 * dlock__redis_hub_join(). */
int dlock__redis_hub_join_keyed(struct redis_state *s, const char *chan, size_t len,
                                struct dlock__wait *w, const char *key);
/* Take the message kept for KEY on CHAN into BUF of SIZE bytes,
 * NUL-terminated: its length, or 0 when none is kept. */
size_t dlock__redis_hub_take(struct redis_state *s, const char *chan, size_t len, const char *key,
                             char *buf, size_t size);
/* W, joined on CHAN under OLD, is keyed KEY from now on (a string that
 * outlives the wait): a message kept for OLD is dropped, and one naming
 * OLD that comes later names no waiter. */
void dlock__redis_hub_rekey(struct redis_state *s, const char *chan, size_t len,
                            struct dlock__wait *w, const char *key, const char *old);
/* W stops waiting on CHAN; a wake it leaves unused (not ACQUIRED) goes to
 * the next waiter. */
void dlock__redis_hub_leave(struct redis_state *s, const char *chan, size_t len, struct dlock__wait *w,
                     bool acquired);
/* Stop the hub thread and free every channel. */
void dlock__redis_hub_stop(struct redis_state *s);
/* A waiter's announcement on its lock's channel (contend.c): this, then
 * the waiter's owner field. */
#define REDIS_WAIT_MSG "dlock-wait "
/* A tap on a channel: FN(ARG, MSG, LEN) on the hub thread, with the hub's
 * mutex held, for every message (MSG NULL: the subscription confirmed,
 * again after each reconnection) until it answers false; FREE(ARG) once
 * it is dropped (that, or the hub's stop). */
struct redis_tap {
    bool (*fn)(void *arg, const char *msg, size_t len);
    void (*free)(void *arg);
    void *arg;
};
/* Tap CHAN with TAP, subscribing if need be: DLOCK_OK, or the failure
 * (TAP's argument freed then). */
int dlock__redis_hub_tap(struct redis_state *s, const char *chan, size_t len,
                        const struct redis_tap *tap);

/* ---------------------------------------------------------- contend.c */

/* Holders told of the waiters that announce themselves on the lock's
 * channel (exclusive locks of every single-server layout). */
extern const struct dlock__contend_ops dlock__redis_contend_ops;
/* Waiter H, whose try on keys K was busy, announces itself to the holder
 * (a PUBLISH on the lock's channel; best effort, within W's budget). */
void dlock__redis_contend_announce(struct redis_state *s, const struct dlock__hold *h,
                                   const struct lock_keys *k, struct dlock__wait *w);
/* The outage a waiter rides out between two tries: the server answered
 * once, so a lost connection is transient until the wait's deadline.
 * MS > 0 while the server cannot be reached (the backoff's next pause);
 * MSG keeps the last failure's message for the end of the wait. */
struct dlock__redis_outage {
    struct dlock__backoff backoff;
    int64_t ms;
    char msg[DLOCK__MSG_MAX];
};
#define DLOCK__REDIS_OUTAGE_INIT                                                                   \
    {.backoff = {.min_ms = REDIS_BACKOFF_MIN_MS, .max_ms = REDIS_BACKOFF_MAX_MS}}
/* O takes the RC of a try made while waiting: DLOCK_ECONN (and
 * DLOCK_EUNAVAIL when UNAVAIL_TOO: a failover under way, LOADING, too few
 * replicas) starts or prolongs the outage, keeping the message; DLOCK_EBUSY
 * ends it. True while the wait goes on (busy or outage), false for any
 * other RC (acquired, or a failure the caller returns). */
bool dlock__redis_outage_note(struct dlock__redis_outage *o, int rc, bool unavail_too);
/* When a waiter whom no release message wakes tries lock KEY again
 * (monotonic ms): after O's pause OUTAGE_MS (> 0) in an outage, else at
 * the end of the holder's lease TTL_MS as the try saw it (-1: a lock
 * without expiry, LEASE_MS then; < -1: at once). */
int64_t dlock__redis_try_again_at(int64_t ttl_ms, int64_t lease_ms, int64_t outage_ms);
/* A waiter's sleep between two tries of lock KEY: W from SEQ until a
 * wake, or the holder's lease TTL_MS as the try saw it (-1: a lock
 * without expiry, LEASE_MS then; < -1: try at once), or O's pause while
 * it is in an outage (O NULL: a wait that rides out none). DLOCK_OK to
 * try again, or how the wait ended with its message: DLOCK_ETIMEDOUT
 * naming WHERE and KEY, OUTAGE_RC with O's message when it ended during
 * an outage, DLOCK_ECANCELED. */
int dlock__redis_wait_sleep(struct dlock__wait *w, unsigned seq, int64_t ttl_ms, int64_t lease_ms,
                            const struct dlock__redis_outage *o, int outage_rc, const char *where,
                            const char *key);
/* How long a wait W that ended with RC may still spend sending what its
 * end owes the server (a writer's unwait, a fair waiter's leave), as a
 * deadline: what is left of the wait, and nothing once it was canceled
 * (the caller asked to stop now): what is not sent by then goes to the
 * keeper, so the wait ends at its end even while the server stalls. */
int64_t dlock__redis_give_up_deadline(const struct dlock__wait *w, int rc);

/* ------------------------------------------------------------ mutex.c */

/* SCAN S's key space (one connection, a page per request) for keys of
 * TYPE matching MATCH: EACH(s, k, key, arg, &err) for each, K the
 * connection for its own commands; EACH returning non-zero stops, *ERR
 * set ends the walk with that failure. */
int dlock__redis_scan(struct redis_state *s, const char *match, const char *type,
                      int (*each)(struct redis_state *s, struct rconn *k, const redisReply *key,
                                  void *arg, int *err),
                      void *arg);
/* One node's inspect, force release and list (redlock_nodes.c asks each). */
int dlock__redis_inspect(void *state, const char *name, struct dlock_info *info);
/* dlock_check()'s look (admin ops): the inspect script alone, one request. */
int dlock__redis_check(void *state, const char *name, struct dlock__check_view *view);
int dlock__redis_force_release(void *state, const char *name);
int dlock__redis_list(void *state, const char *pattern, dlock_list_fn fn, void *arg);

/* ------------------------------------------------------------ value.c */

/* A lock's value: the HASH dlock_value:{NAME}, written by a script that
 * finds the hold (every URL form but redlock). */
extern const struct dlock__value_ops dlock__redis_value_ops;
/* The value's write and read (KEY NULL) or a guarded key's (guard.c):
 * one script that finds the hold, then HSET or DEL of the hash; one
 * HMGET. */
int dlock__redis_stored_set(void *state, struct dlock__hold *h, const char *key,
                            const struct dlock__value *v);
int dlock__redis_stored_get(void *state, const char *name, const char *key,
                            struct dlock__value *out);
extern const struct dlock__guarded_ops dlock__redis_guarded_ops;

/* The 5 keys and 7 arguments of an acquire_*.lua call (see the script),
 * the strings kept in the struct: hold H (its lease LEASE_MS, owner and
 * mode) on keys K, request NUMBER retrying request RETRIES (0: a first
 * attempt), a writer's STAGE ("0", "1" or "2"), SIMPLE for the simple
 * layout's owner prefix. */
struct acquire_args {
    char lease[24], prefix[128], number[24], retries[24], life[24];
    const char *v[12];
    size_t len[12];
};
void dlock__redis_acquire_args(struct acquire_args *a, bool simple, const struct dlock__hold *h,
                               const struct lock_keys *k, int64_t lease_ms, uint64_t number,
                               uint64_t retries, const char *stage);
/* Decode (and free) RQ's reply, that of an acquire script of H on K (its
 * send time and acknowledgements in rq->out): DLOCK_OK with h->token set
 * and the hold confirmed, DLOCK_EBUSY with *TTL_MS the holder's remaining
 * lease, or a failure with its message. Too few acknowledgements
 * (sync=N): the acquire (request numbers up to LAST) is undone within
 * rq->deadline, the call's budget, or owed to the cleanup queue. */
int dlock__redis_acquire_reply(struct redis_state *s, struct dlock__hold *h,
                               const struct lock_keys *k, struct redis_request *rq, uint64_t last,
                               int64_t *ttl_ms);

/* The lock ops' acquire, release and release_within (backend.h), the
 * election's on its lock too; and the backend's renew (the keeper's
 * batch). */
int dlock__redis_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w);
/* The lock's pieces that async.c drives too: H's owner field from its
 * owner id; one acquire attempt within W's deadline (STAGE "0" try once,
 * "1" a wait's first try, "2" a later one: a waiting writer keeps new
 * readers out), DLOCK_EBUSY with *TTL_MS the holder's lease left. */
void dlock__redis_owner_of(struct redis_state *s, struct dlock__hold *h);
int dlock__redis_try_acquire(struct redis_state *s, struct dlock__hold *h, const struct lock_keys *k,
                             int64_t lease_ms, struct dlock__wait *w, const char *stage,
                             int64_t *ttl_ms);
/* ------------------------------------------------------------ async.c */

/* The lock ops' try_armed and disarm (backend.h): an asynchronous
 * acquire's attempts, parked by the core between them. */
int dlock__redis_try_armed(void *state, struct dlock__hold *h, struct dlock__wait *w, void **park);
int dlock__redis_disarm(void *state, struct dlock__hold *h, struct dlock__wait *w, void *park,
                        int rc);

int dlock__redis_release_hold(void *state, struct dlock__hold *h);
int dlock__redis_release_within(void *state, struct dlock__hold *h, int64_t deadline);
int dlock__redis_renew(void *state, struct dlock__renew_batch *b);

/* ------------------------------------------------------------- fair.c */

/* Whether H is taken through the fair layout (?layout=fair, or a
 * DLOCK_LOCK_FAIR handle). */
bool dlock__redis_fair(const struct redis_state *s, const struct dlock__hold *h);
/* The fair lock's acquire and release of H (h->owner set). */
int dlock__redis_fair_acquire(struct redis_state *s, struct dlock__hold *h, struct dlock__wait *w);
int dlock__redis_fair_release(struct redis_state *s, struct dlock__hold *h);
/* NAME's queued waiters (live ones, in order) by DEADLINE: *REPLY an
 * array of owner fields, nil without a queue (freed by the caller). */
int dlock__redis_fair_queue(struct redis_state *s, const char *name, int64_t deadline,
                            redisReply **reply);
/* Add NAME's queued waiters (live ones, in order) to INFO: its waiter
 * count and their owner ids. */
int dlock__redis_fair_waiters(struct redis_state *s, const char *name, struct dlock_info *info);
/* cancel.c's cancel for a fair lock: OWNER leaves NAME's queue, its
 * requests up to LAST canceled, a lock handed to it passed on; within
 * DEADLINE and until W's cancel (W may be NULL). */
int dlock__redis_fair_cancel(struct redis_state *s, const char *name, const char *owner,
                             uint64_t last, int64_t lease_ms, int64_t deadline,
                             struct dlock__wait *w);

/* ----------------------------------------------------------- record.c */

/* The client record dlock_client:<uuid> = "dlock <pid>@<host>": written
 * (SET PX LEASE_MS, within DEADLINE) when what is left of its life is
 * under half of LEASE_MS -- by an acquire that succeeded, by the keeper
 * after a renewal -- else nothing sent. Best effort: a failure changes
 * neither the caller's outcome nor its message. */
void dlock__redis_record_touch(struct redis_state *s, int64_t lease_ms, int64_t deadline);
/* INFO's holders "<uuid>:<thread>..." whose client record is there
 * become "<uuid>:<thread>... (dlock <pid>@<host>)" (at most the first
 * 64; a lookup that fails ends the lookups). DLOCK_OK or DLOCK_ENOMEM. */
int dlock__redis_record_names(struct redis_state *s, struct dlock_info *info);

/* --------------------------------------------------------- election.c */

/* An election's keys beside its lock: dlock_leader:{NAME} (the leader's
 * value, token, version) and dlock_leader__channel:{NAME}. */
struct leader_keys {
    struct lock_keys k;
    char *value, *chan;
};
int dlock__redis_leader_keys(struct redis_state *s, const char *name, struct leader_keys *lk);
void dlock__redis_leader_keys_free(struct leader_keys *lk);
/* The scripts of one node (redlock_election.c runs them on each): write the
 * leader's value (KEYS lock, value hash, channel, token counter; ARGV
 * field, token, value, and optionally the version, else counted by the
 * node: 1 written, 0 the lock is not ours there), and read
 * the leader (KEYS lock, value hash, token counter). */
extern const struct redis_script dlock__redis_leader_write_script;
extern const struct redis_script dlock__redis_leader_read_script;
/* A campaign's recipe, on one node (election.c) or on Redlock's majority
 * (redlock_election.c), through OPS: take the lock, write the campaign's value,
 * and give the lock back when the write fails (its failure returned),
 * both by the campaign's wait (its deadline: 0, a try-once, and
 * DLOCK__NEVER leave the request timeout whole; give_up owes what is not
 * answered by then); and a proclaim: write VALUE (the request timeout),
 * and report H lost (client C) when the write finds the lock no longer
 * ours (DLOCK_ELOST). */
struct dlock__redis_leader_ops {
    int (*acquire)(void *state, struct dlock__hold *h, struct dlock__wait *w);
    int (*give_up)(void *state, struct dlock__hold *h, int64_t deadline);
    int (*write)(void *state, struct dlock__hold *h, const char *value, int64_t deadline);
};
int dlock__redis_campaign(void *state, struct dlock__hold *h, struct dlock__wait *w,
                          const struct dlock__redis_leader_ops *ops);
/* The asynchronous campaign's attempt on one node (backend.h): the lock's
 * parked attempt (async.c), then the value written as a campaign writes
 * it; its disarm is the lock's. */
int dlock__redis_elect_try_armed(void *state, struct dlock__hold *h, struct dlock__wait *w,
                                 void **park);
int dlock__redis_proclaim(void *state, struct dlock_client *c, struct dlock__hold *h,
                          const char *value, const struct dlock__redis_leader_ops *ops);
/* One node's reply R to the read script (WHAT for messages) into OUT
 * (zeroed; value malloc'd when held): *CONSISTENT false while a new
 * leader has not written its value there, *TTL the lock's PTTL. */
int dlock__redis_leader_parse(struct redis_state *s, const redisReply *r, const char *what,
                              struct dlock_leader *out, bool *consistent, int64_t *ttl);
/* An observer of election NAME, on one node (election.c) or on Redlock's
 * N (redlock_election.c): the nodes whose hubs carry its leader channel,
 * and LOOK, one look at the election (keys LK) by DEADLINE into OUT
 * (*CONSISTENT false while no settled answer is seen, *TTL the lock's
 * remaining lease, -2 when none is held) with ARG, the look's own. */
struct dlock__redis_observer {
    struct redis_state *const *nodes;
    size_t n;
    const char *name, *where; /* the election's, and the backend's for messages */
    int64_t idle_ms; /* a sleep's bound while no lock with a lease is seen */
    int (*look)(const struct dlock__redis_observer *ob, const struct leader_keys *lk,
                int64_t deadline, struct dlock_leader *out, bool *consistent, int64_t *ttl);
    void *arg;
};
/* The elect_observe of both: the election's keys (as NODES[0] names
 * them), then look, and until dlock__observe_done(), listen on every
 * node's leader channel and sleep until a message or the lock's remaining
 * lease (an expiry publishes nothing), then look again. */
int dlock__redis_observe(const struct dlock__redis_observer *ob, const struct dlock_leader *known,
                         struct dlock__wait *w, struct dlock_leader *out);

int dlock__redis_elect_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w);
int dlock__redis_elect_release(void *state, struct dlock__hold *h);
int dlock__redis_elect_proclaim(void *state, struct dlock__hold *h, const char *value);
int dlock__redis_elect_observe(void *state, const char *name, const struct dlock_leader *known,
                               struct dlock__wait *w, struct dlock_leader *out);

/* ------------------------------------------ what each script's reply means
 *
 * One function per script turns its reply R (not an error reply: those
 * went through dlock__redis_server_error) into a dlock code with the
 * message, and does nothing else: no I/O, no hold or client state, so
 * tests/fuzz/fuzz_redis_replies.c feeds each one any reply a server, a
 * proxy or another version of a script could send. R is not freed. */

/* acquire (mutex.c; each node of redlock.c): DLOCK_OK with *TOKEN,
 * DLOCK_EBUSY with *TTL_MS the holder's lease left (-1: none), or
 * DLOCK_EWRONGTYPE / DLOCK_EPROTO naming K's lock. */
int dlock__redis_acquire_result(struct redis_state *s, const redisReply *r,
                                const struct lock_keys *k, uint64_t *token, int64_t *ttl_ms);
/* release (mutex.c; fair.c's too) of lock NAME held with TOKEN: DLOCK_OK, or
 * DLOCK_ELOST; RETRIED: the first attempt's reply was lost, so "free"
 * means it ran. */
int dlock__redis_release_reply(struct redis_state *s, const redisReply *r, const char *name,
                               const struct lock_keys *k, uint64_t token, bool retried);
/* One renew call of M holds (mutex.c): DLOCK_OK with RENEWED[0..M), else
 * the failure of all M. */
int dlock__redis_renew_reply(struct redis_state *s, const redisReply *r, size_t m, bool *renewed);
/* inspect (mutex.c) into INFO (whose key is set; the caller frees it). */
int dlock__redis_inspect_reply(struct redis_state *s, const redisReply *r, const struct lock_keys *k,
                               struct dlock_info *info);
/* acquire, force release, the read-write scripts (rwlock.c): the integer in
 * *VALUE, or DLOCK_EWRONGTYPE naming K's lock, or DLOCK_EPROTO. (cancel
 * reads its reply with dlock__redis_script_reply alone.) */
int dlock__redis_status_reply(struct redis_state *s, const redisReply *r, const struct lock_keys *k,
                              long long *value);
/* The semaphore's keys (semaphore.c): NAME, {NAME}:timeout, its channel,
 * dlock's token counter and its record of released ids. */
struct sem_keys {
    char *name, *timeout, *chan, *token, *released;
    size_t name_len, timeout_len, chan_len, token_len, released_len;
};
/* A semaphore acquire's reply to read: WANT of PERMITS permits with a
 * lease of LEASE_MS; out, what it said. */
struct sem_acquire_reply {
    unsigned permits, want;
    int64_t lease_ms;
    struct {
        uint64_t token; /* DLOCK_OK: the acquire's */
        bool pass_on;   /* DLOCK_OK: permits are left, wake the next */
        int64_t sleep_ms; /* DLOCK_EBUSY: until the nearest expiry, at most the lease */
    } out;
};
/* semaphore acquire of Q: DLOCK_OK with Q->out.token and .pass_on,
 * DLOCK_EBUSY with Q->out.sleep_ms, DLOCK_EINVAL (another permit count),
 * DLOCK_EWRONGTYPE, DLOCK_EPROTO; what a code does not name is left as
 * it was. */
int dlock__redis_sem_acquire_reply(struct redis_state *s, const struct sem_keys *k,
                                   const redisReply *r, struct sem_acquire_reply *q);
/* semaphore release: DLOCK_OK with *REMOVED, the ids it gave back. */
int dlock__redis_sem_release_reply(struct redis_state *s, const struct sem_keys *k,
                                   const redisReply *r, long long *removed);
/* semaphore renew of permit OWNER of NAME: DLOCK_OK or DLOCK_ELOST. */
int dlock__redis_sem_renew_reply(struct redis_state *s, const redisReply *r, const char *owner,
                                 const char *name);
/* semaphore inspect of PERMITS (0: any) into INFO, its key K's name. */
int dlock__redis_sem_inspect_reply(struct redis_state *s, const struct sem_keys *k,
                                   const redisReply *r, unsigned permits, struct dlock_info *info);
/* election (election.c; each node of redlock_election.c): the read script's reply
 * is dlock__redis_leader_parse(), above. */

/* -------------------------------------------------------- semaphore.c */

int dlock__redis_sem_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w);
int dlock__redis_sem_release(void *state, struct dlock__hold *h);
/* The asynchronous acquire's attempt and end for a permit (semaphore.c). */
int dlock__redis_sem_try_armed(void *state, struct dlock__hold *h, struct dlock__wait *w,
                               void **park);
int dlock__redis_sem_disarm(void *state, struct dlock__hold *h, struct dlock__wait *w, void *park,
                            int rc);
int dlock__redis_sem_inspect(void *state, const char *name, unsigned permits, struct dlock_info *info);
/* The semaphore ops' list: the semaphores with a permit held (their
 * {NAME}:timeout ZSETs). */
int dlock__redis_sem_list(void *state, const char *pattern, dlock_list_fn fn, void *arg);
/* When B holds semaphore permits: renew them (one script call each) and
 * the locks through RENEW_LOCKS, each hold's result in B, and return
 * true; false (nothing done) when B holds locks only. */
bool dlock__redis_sem_renew_apart(struct redis_state *s, struct dlock__renew_batch *b,
                                  int (*renew_locks)(void *state, struct dlock__renew_batch *b));

#endif /* DLOCK_REDIS_H */
