/* redlock.h -- what the files of the Redlock backend (redlock://, one lock
 * over N independent masters) share, and nothing else.
 *
 * The backend is split by concern: redlock.c is the lock's acquire (its
 * quorum and token), the client's open and close, and the backend table;
 * redlock_hold.c is what is done with a granted hold (release, downgrade,
 * renew); redlock_nodes.c is how a request
 * reaches the nodes (one round to all N at once, which every recipe
 * step goes through, and the operator's calls asked of each node in
 * turn: inspect, force release, list); redlock_election.c builds
 * elections on the lock. Each node is a whole single-node state of the
 * Redis backend (redis.h). Everything here is private to those files; the
 * core sees only dlock__backend_redlock.
 */
#ifndef DLOCK_REDLOCK_H
#define DLOCK_REDLOCK_H

#include "redis.h"

#define RL_MAX_NODES DLOCK__MAX_HOSTS

/* The client's state: its nodes and what every request needs of them. */
struct redlock {
    struct dlock_client *c;
    size_t n, quorum;
    struct redis_state *node[RL_MAX_NODES];
    int64_t node_timeout_ms;
    char where[64];    /* "redlock (3 nodes)" */
    uint64_t requests; /* acquire request numbers (atomic) */
};

/* What a hold knows of each node (h->bdata). */
enum { NODE_NO, NODE_YES, NODE_UNKNOWN };
struct rl_hold {
    unsigned char state[RL_MAX_NODES];
    uint64_t token[RL_MAX_NODES];      /* what the node's INCR gave (its value's suffix) */
    uint64_t counter[RL_MAX_NODES];    /* its token key after our acquisition */
    uint64_t asked[RL_MAX_NODES];      /* what our raise asked it for (0: no raise sent) */
    uint64_t read_token[RL_MAX_NODES]; /* shared: what our timeout key there holds (the
                                          node's token, or what our downgrade wrote) */
    uint64_t version;                  /* a campaign's: the number of its last value written */
};

/* ---------------------------------------- a request on N nodes (redlock_nodes.c) */

/* One script call on one node within a parallel request. */
struct rl_call {
    size_t node;
    const char *src, *sha; /* the script */
    int nkeys, nargs;
    const char **args;
    const size_t *lens;
    redisReply *reply; /* its reply (an error reply too); NULL when the node failed */
};

/* One parallel request: a connection per node, and each node's failure. */
struct rl_round {
    struct rconn *k[RL_MAX_NODES];
    int rc[RL_MAX_NODES];
    bool written[RL_MAX_NODES]; /* every command was sent: it may have run */
    char err[RL_MAX_NODES][300];
};

/* Send CALLS[0..N) to their nodes in one round within DEADLINE (each
 * exchange has the node timeout, cut to what is left of DEADLINE; none
 * left: nothing is sent); once NEED nodes answered the others get a
 * grace only. BACKGROUND: the keeper's (its reconnect backoff). WHAT
 * names the request in messages. A node that fails leaves its calls'
 * replies NULL, its code in RD->rc and its message in RD->err. */
void dlock__redlock_round(struct redlock *rl, struct rl_round *rd, struct rl_call *calls, size_t n,
                          int64_t deadline, bool background, const char *what, size_t need);
/* Free the replies of CALLS[0..N). */
void dlock__redlock_calls_free(struct rl_call *calls, size_t n);
/* Record node I's failure RC (and the thread's message) in RD, unless
 * one is recorded already. */
void dlock__redlock_node_failed(struct rl_round *rd, size_t i, int rc);
/* The first failure among the first N nodes, for a message: "<node>: why". */
const char *dlock__redlock_first_failure(const struct rl_round *rd, size_t n);
/* How a request that GOT of RL's nodes did fell short of the quorum, for
 * a message: "<GOT> of <n> nodes, <quorum> needed (<RD's first
 * failure>)", into BUF. Returns BUF. */
#define RL_SHORTFALL_MAX 400
const char *dlock__redlock_shortfall(const struct redlock *rl, const struct rl_round *rd,
                                     size_t got, char buf[RL_SHORTFALL_MAX]);

/* The operator's calls, each node asked in turn. */
int dlock__redlock_inspect(void *state, const char *name, struct dlock_info *info);
int dlock__redlock_check(void *state, const char *name, struct dlock__check_view *view);
int dlock__redlock_force_release(void *state, const char *name);
int dlock__redlock_list(void *state, const char *pattern, dlock_list_fn fn, void *arg);

/* -------------------------------------------------------- the lock (redlock.c) */

int dlock__redlock_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w);
/* The value a node holds for H in the simple layout ("<owner>:<token>"),
 * or the owner field in Redisson's. */
int dlock__redlock_node_value(struct redlock *rl, const struct dlock__hold *h, uint64_t token,
                              char *buf, size_t size);
/* The SHA-1 of SRC in hex (EVALSHA's digest) into OUT. */

/* ------------------------------------------------- a granted hold (redlock_hold.c) */

/* Give back what H holds on the nodes marked in BD (NODE_YES), every node
 * at once by DEADLINE; a node whose outcome is unknown gets a cancel
 * queued instead. *RELEASED / *GONE (may be NULL) count the nodes that
 * let it go and those where it was no longer ours. Returns the round's
 * first failure code (0 when every node answered). */
int dlock__redlock_release_nodes(struct redlock *rl, struct dlock__hold *h, struct rl_hold *bd,
                                 const struct lock_keys *k, int64_t deadline, size_t *released,
                                 size_t *gone, struct rl_round *rd);
int dlock__redlock_release(void *state, struct dlock__hold *h);
/* Give H up on every node at once by DEADLINE (a wait's: 0 and
 * DLOCK__NEVER leave the node timeout whole; none sent once it has
 * passed); with OWE a node that did not answer is owed the cancel of the
 * owner's requests so far, and too few answers are no failure. */
int dlock__redlock_release_by(void *state, struct dlock__hold *h, int64_t deadline, bool owe);
/* The lock ops' release_within (backend.h): release_by with OWE. */
int dlock__redlock_release_within(void *state, struct dlock__hold *h, int64_t deadline);
int dlock__redlock_downgrade(void *state, struct dlock__hold *h);
int dlock__redlock_renew(void *state, struct dlock__renew_batch *b);

/* --------------------------------------------- elections (redlock_election.c) */

int dlock__redlock_elect_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w);
int dlock__redlock_elect_release(void *state, struct dlock__hold *h);
int dlock__redlock_elect_proclaim(void *state, struct dlock__hold *h, const char *value);
int dlock__redlock_elect_observe(void *state, const char *name, const struct dlock_leader *known,
                                 struct dlock__wait *w, struct dlock_leader *out);

#endif
