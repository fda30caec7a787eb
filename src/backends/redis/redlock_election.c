/* redlock_election.c -- leader elections over Redlock's majority.
 *
 * Why it is a file of its own: an election is the lock (redlock.c) plus
 * the single-node backend's leader hash (election.c) written and read on
 * every node at once through redlock_nodes.c's rounds, with a majority's
 * vote on what an observer sees; none of it is needed by the lock.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redlock.h"

/* ============================================================ elections */

/* Election NAME over Redlock is lock NAME taken on a majority (dlock__redlock_acquire,
 * whose token is the leadership's) plus, on every node, the single-node
 * layout's leader hash dlock_leader:{NAME} (election.c): each node runs
 * the same write and read scripts. The leader writes its value on every
 * node at once; a node takes it only while the lock there is ours and the
 * node's token counter is the leadership's token (the acquisition raised
 * the granting majority's counters to it; a later acquisition there moves
 * it), so what a resigned or expired leader left behind is never read as
 * current. A write counts when a majority took it; fewer, and a proclaim
 * fails (DLOCK_ELOST when too few nodes can still be ours).
 *
 * An observer reads every node at once and believes a majority: the
 * leader is a holder (and token) that a majority of the nodes show with
 * its value written, and the value is the highest version among them;
 * nobody leads when a majority show the lock free. Any other picture (a
 * new leader writing its value, a split acquisition in flight, too few
 * nodes answering) is looked at again after a message on the leader
 * channel of any node or the lock's shortest remaining lease. Any
 * majority an observer reads meets the majority the leader wrote in at
 * least one node, so a value the leader's proclaim returned for is seen.
 * The soundness is Redlock's, no more: the leader's hold and token rely on
 * the nodes keeping their keys and counters (docs/protocol-redis.md,
 * "Redlock"). */

/* Call ONE (its script and arguments) on every node at once by DEADLINE,
 * once a majority answered the others get the grace only; WHAT names it
 * in messages. CALLS[i] is node i's (free with dlock__redlock_calls_free). */
static void on_every_node(struct redlock *rl, struct rl_round *rd, struct rl_call *calls,
                          struct rl_call one, int64_t deadline, const char *what)
{
    for (size_t i = 0; i < rl->n; i++) {
        calls[i] = one;
        calls[i].node = i;
    }
    dlock__redlock_round(rl, rd, calls, rl->n, deadline, false, what, rl->quorum);
}

/* Write VALUE as leader H's on every node at once (once a majority
 * answered, the others get the grace only: a stopped node does not hold
 * a campaign or a proclaim for the node timeout): DLOCK_OK when a
 * majority took it; DLOCK_ELOST when so many nodes refused (the lock is
 * no longer ours there) that no majority can; else DLOCK_EUNAVAIL naming
 * a node's failure. */
static int rl_write_value(void *state, struct dlock__hold *h, const char *value, int64_t deadline)
{
    struct redlock *rl = state;
    struct leader_keys lk;
    int rc = dlock__redis_leader_keys(rl->node[0], h->name, &lk);
    if (rc)
        return rc;
    /* The leader numbers its writes, so the newest is the highest on any
     * node, whichever writes a node missed; from its clock in
     * microseconds when that is ahead (a campaign's first write), so the
     * numbers keep growing from one leadership to the next while the
     * leaders' clocks agree, as the nodes' token counters do. */
    struct rl_hold *bd = h->bdata;
    uint64_t clock_us = (uint64_t)dlock__wall_ms() * 1000;
    bd->version = bd->version + 1 > clock_us ? bd->version + 1 : clock_us;
    char token[24], version[24];
    int tl = snprintf(token, sizeof token, "%llu", (unsigned long long)h->token);
    int vl = snprintf(version, sizeof version, "%llu", (unsigned long long)bd->version);
    const struct lock_keys *k = &lk.k;
    const char *args[] = {k->lock, lk.value, lk.chan, k->token, h->owner, token, value, version};
    size_t lens[] = {k->lock_len,      strlen(lk.value), strlen(lk.chan), k->token_len,
                     strlen(h->owner), (size_t)tl,       strlen(value),   (size_t)vl};
    struct rl_call calls[RL_MAX_NODES];
    struct rl_round rd;
    char shortfall[RL_SHORTFALL_MAX];
    on_every_node(rl, &rd, calls,
                  (struct rl_call){.src = dlock__redis_leader_write_script.src,
                                   .sha = dlock__redis_leader_write_script.sha,
                                   .nkeys = 4,
                                   .nargs = 8,
                                   .args = args,
                                   .lens = lens},
                  deadline, "write the leader's value");
    size_t taken = 0, refused = 0;
    for (size_t i = 0; i < rl->n; i++) {
        const redisReply *r = calls[i].reply;
        if (r && r->type == REDIS_REPLY_INTEGER)
            r->integer == 1 ? taken++ : refused++;
        else if (r && r->type == REDIS_REPLY_ERROR)
            dlock__redlock_node_failed(&rd, i,
                                       dlock__redis_server_error(rl->node[i], r->str, "write"));
    }
    dlock__redlock_calls_free(calls, rl->n);
    if (taken >= rl->quorum)
        rc = DLOCK_OK;
    else if (refused > rl->n - rl->quorum)
        rc = dlock__err(DLOCK_ELOST,
                        "%s: election '%s': the lock is no longer ours on %zu of %zu "
                        "nodes (token %s)",
                        rl->where, h->name, refused, rl->n, token);
    else
        rc = dlock__err(DLOCK_EUNAVAIL, "%s: election '%s': the value was written on %s", rl->where,
                        h->name, dlock__redlock_shortfall(rl, &rd, taken, shortfall));
    dlock__redis_leader_keys_free(&lk);
    return rc;
}

/* A campaign's give-up: every node at once by DEADLINE, a node that did
 * not answer by then owed the cancel of the owner's requests
 * (redlock_hold.c). */
static int rl_give_up(void *state, struct dlock__hold *h, int64_t deadline)
{
    return dlock__redlock_release_by(state, h, deadline, true);
}

static const struct dlock__redis_leader_ops rl_leader_ops = {dlock__redlock_acquire, rl_give_up,
                                                             rl_write_value};

int dlock__redlock_elect_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
{
    return dlock__redis_campaign(state, h, w, &rl_leader_ops);
}

/* Publish on every node's leader channel of NAME by DEADLINE (best
 * effort: an observer that misses it wakes at the lease's end). */
static void rl_leader_publish(struct redlock *rl, const char *name, int64_t deadline)
{
    const struct redis_script *sc = &dlock__redis_leader_publish_script;
    struct leader_keys lk;
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    if (dlock__redis_leader_keys(rl->node[0], name, &lk) == DLOCK_OK) {
        const char *args[] = {lk.chan};
        size_t lens[] = {strlen(lk.chan)};
        struct rl_call calls[RL_MAX_NODES];
        struct rl_round rd;
        on_every_node(rl, &rd, calls,
                      (struct rl_call){.src = sc->src,
                                       .sha = sc->sha,
                                       .nkeys = 1,
                                       .nargs = 1,
                                       .args = args,
                                       .lens = lens},
                      deadline, "publish");
        dlock__redlock_calls_free(calls, rl->n);
        dlock__redis_leader_keys_free(&lk);
    }
    dlock__errmsg_restore(DLOCK_OK, msg);
}

int dlock__redlock_elect_release(void *state, struct dlock__hold *h)
{
    struct redlock *rl = state;
    /* one node timeout for the release and the publish after it */
    int64_t deadline = dlock__now_ms() + rl->node_timeout_ms;
    int rc = dlock__redlock_release_by(state, h, deadline, false);
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    rl_leader_publish(state, h->name, deadline);
    return dlock__errmsg_restore(rc, msg);
}

int dlock__redlock_elect_proclaim(void *state, struct dlock__hold *h, const char *value)
{
    struct redlock *rl = state;
    return dlock__redis_proclaim(state, rl->c, h, value, &rl_leader_ops);
}

/* Whether two nodes show the same holder: the same id, but in the simple
 * layout without the value's last part, each node's own token. */
static bool same_holder(const struct redlock *rl, const char *a, const char *b)
{
    if (!rl->node[0]->simple)
        return strcmp(a, b) == 0;
    const char *ea = strrchr(a, ':'), *eb = strrchr(b, ':');
    size_t la = ea ? (size_t)(ea - a) : strlen(a), lb = eb ? (size_t)(eb - b) : strlen(b);
    return la == lb && memcmp(a, b, la) == 0;
}

/* One look at every node (once a majority answered, the others get the
 * grace only): OUT as a majority says it (*CONSISTENT false
 * when no majority says anything yet), *TTL the shortest remaining lease
 * of the lock among the nodes that hold it (-2: none). DLOCK_EUNAVAIL when
 * fewer than a majority answered. */
static int rl_look(const struct dlock__redis_observer *ob, const struct leader_keys *lk,
                   int64_t deadline, struct dlock_leader *out, bool *consistent, int64_t *ttl)
{
    struct redlock *rl = ob->arg;
    const char *name = ob->name;
    const struct lock_keys *k = &lk->k;
    const char *args[] = {k->lock, lk->value, k->token};
    size_t lens[] = {k->lock_len, strlen(lk->value), k->token_len};
    struct rl_call calls[RL_MAX_NODES];
    struct rl_round rd;
    char what[600];
    snprintf(what, sizeof what, "read the leader of election '%s'", name);
    int64_t until = dlock__time_left(deadline, rl->node_timeout_ms);
    on_every_node(rl, &rd, calls,
                  (struct rl_call){.src = dlock__redis_leader_read_script.src,
                                   .sha = dlock__redis_leader_read_script.sha,
                                   .nkeys = 3,
                                   .nargs = 3,
                                   .args = args,
                                   .lens = lens},
                  dlock__now_ms() + until, what);
    struct dlock_leader seen[RL_MAX_NODES];
    bool ok[RL_MAX_NODES] = {false}, cons[RL_MAX_NODES] = {false};
    size_t answered = 0, free_nodes = 0;
    int rc = DLOCK_OK;
    *ttl = -2;
    for (size_t i = 0; i < rl->n; i++) {
        memset(&seen[i], 0, sizeof seen[i]);
        const redisReply *r = calls[i].reply;
        int64_t t = -2;
        int prc = !r ? rd.rc[i]
                  : r->type == REDIS_REPLY_ERROR
                      ? dlock__redis_server_error(rl->node[i], r->str, what)
                      : dlock__redis_leader_parse(rl->node[i], r, what, &seen[i], &cons[i], &t);
        if (prc) {
            if (r)
                dlock__redlock_node_failed(&rd, i, prc);
            if (prc == DLOCK_ENOMEM)
                rc = prc;
            continue;
        }
        ok[i] = true;
        answered++;
        free_nodes += !seen[i].held && cons[i];
        if (t >= 0 && (*ttl < 0 || t < *ttl))
            *ttl = t;
    }
    dlock__redlock_calls_free(calls, rl->n);
    free(out->value);
    memset(out, 0, sizeof *out);
    *consistent = false;
    if (!rc && answered < rl->quorum)
        rc = dlock__err(DLOCK_EUNAVAIL, "%s: %s: %zu of %zu nodes answered, %zu needed (%s)",
                        rl->where, what, answered, rl->n, rl->quorum,
                        dlock__redlock_first_failure(&rd, rl->n));
    if (!rc && free_nodes >= rl->quorum)
        *consistent = true; /* nobody leads */
    for (size_t i = 0; !rc && !*consistent && i < rl->n; i++) {
        if (!ok[i] || !seen[i].held)
            continue;
        size_t votes = 0, best = i;
        for (size_t j = 0; j < rl->n; j++)
            if (ok[j] && seen[j].held && seen[j].token == seen[i].token &&
                same_holder(rl, seen[j].id, seen[i].id)) {
                votes++;
                if (seen[j].version > seen[best].version)
                    best = j;
            }
        if (votes >= rl->quorum) {
            *out = seen[best];
            seen[best].value = NULL; /* out's now */
            *consistent = true;
        }
    }
    for (size_t i = 0; i < rl->n; i++)
        free(seen[i].value);
    return rc;
}

int dlock__redlock_elect_observe(void *state, const char *name, const struct dlock_leader *known,
                                 struct dlock__wait *w, struct dlock_leader *out)
{
    struct redlock *rl = state;
    /* the shortest remaining lease among the nodes bounds each sleep;
     * none held: the node timeout */
    const struct dlock__redis_observer ob = {.nodes = rl->node,
                                             .n = rl->n,
                                             .name = name,
                                             .where = rl->where,
                                             .idle_ms = rl->node_timeout_ms,
                                             .look = rl_look,
                                             .arg = rl};
    return dlock__redis_observe(&ob, known, w, out);
}
