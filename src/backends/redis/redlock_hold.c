/* redlock_hold.c -- what Redlock does with a hold once it is granted:
 * give it back (release, and the give-back of an attempt that did not
 * win), turn it shared in place (downgrade), renew it (the keeper).
 *
 * Why it is a file of its own: these paths start from the hold's node
 * record (struct rl_hold: which nodes granted it, with what token and
 * counter) rather than from a name, and each must name on every node
 * exactly the hold we were granted there -- a late copy of a release or
 * downgrade must leave a later hold of the same owner alone -- which is
 * a concern apart from winning the quorum (redlock.c). Every request
 * here is one round to all N nodes (redlock_nodes.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redlock.h"

/* Holds per renewal script call, as in mutex.c. */
#define RL_RENEW_BATCH 1000

/* ============================================================ give back */

/* What node I's token key holds while BD's hold is ours there, as
 * strings for a script: COUNTER, the value we know (the token the node
 * gave us, or the one our raise set), and ALSO, the one our raise asked
 * for when its reply was lost (it may have run; COUNTER again when no
 * raise was left in doubt). Nobody else acquires there meanwhile. */
struct node_counter {
    char counter[24], also[24];
    size_t counter_len, also_len;
};

static void node_counter_of(const struct rl_hold *bd, size_t i, struct node_counter *nc)
{
    nc->counter_len = (size_t)snprintf(nc->counter, sizeof nc->counter, "%llu",
                                       (unsigned long long)bd->counter[i]);
    nc->also_len = (size_t)snprintf(nc->also, sizeof nc->also, "%llu",
                                    (unsigned long long)(bd->asked[i] ? bd->asked[i]
                                                                      : bd->counter[i]));
}

/* Give back what H holds on the nodes marked in BD (NODE_YES), every node
 * at once; a node whose outcome is unknown gets a cancel queued instead
 * (cancel.c). *RELEASED / *GONE (may be NULL) count the nodes that let it
 * go and those where it was no longer ours. Returns the round's first
 * failure code (0 when every node answered). */
int dlock__redlock_release_nodes(struct redlock *rl, struct dlock__hold *h, struct rl_hold *bd,
                                 const struct lock_keys *k, int64_t deadline, size_t *released,
                                 size_t *gone, struct rl_round *rd)
{
    struct rl_call calls[RL_MAX_NODES];
    char vals[RL_MAX_NODES][160], readt[RL_MAX_NODES][24];
    struct node_counter nc[RL_MAX_NODES];
    const char *args[RL_MAX_NODES][8];
    size_t lens[RL_MAX_NODES][8];
    size_t n = 0;
    bool reader = h->mode == DLOCK_SHARED;
    for (size_t i = 0; i < rl->n; i++) {
        if (bd->state[i] != NODE_YES)
            continue;
        struct redis_state *s = rl->node[i];
        if (reader) {
            /* RReadWriteLock's read unlock (scripts/rw_release_read.lua),
             * given what our timeout key there holds: holding another
             * token, it is a later read hold of ours, which a late copy of
             * this release leaves alone */
            int tl = snprintf(readt[i], sizeof readt[i], "%llu",
                               (unsigned long long)bd->read_token[i]);
            const char *a[] = {k->lock, k->chan, k->rwchan, k->tbase, h->owner, readt[i]};
            size_t l[] = {k->lock_len,  k->chan_len,      k->rwchan_len,
                          k->tbase_len, strlen(h->owner), (size_t)tl};
            memcpy(args[i], a, sizeof a);
            memcpy(lens[i], l, sizeof l);
            calls[n++] = (struct rl_call){.node = i, .src = s->src[S_RW_RELEASE_READ],
                                          .sha = s->sha[S_RW_RELEASE_READ], .nkeys = 4, .nargs = 6,
                                          .args = args[i], .lens = lens[i]};
            continue;
        }
        int vl = dlock__redlock_node_value(rl, h, bd->token[i], vals[i], sizeof vals[i]);
        /* either value of the token key is ours (release_redisson.lua's
         * ARGV[2], ARGV[3]); a field of ours in read mode (a downgrade
         * given up) is ours while our timeout key holds what the
         * downgrade wrote, the first (KEYS[5]: the timeout base) */
        node_counter_of(bd, i, &nc[i]);
        const char *a[] = {k->lock,  k->chan,          k->token,     k->rwchan,
                           k->tbase, vals[i], nc[i].counter, nc[i].also};
        size_t l[] = {k->lock_len,  k->chan_len, k->token_len,       k->rwchan_len,
                      k->tbase_len, (size_t)vl,  nc[i].counter_len, nc[i].also_len};
        memcpy(args[i], a, sizeof a);
        memcpy(lens[i], l, sizeof l);
        calls[n++] = (struct rl_call){.node = i, .src = s->src[S_RELEASE], .sha = s->sha[S_RELEASE],
                                      .nkeys = 5, .nargs = 8, .args = args[i], .lens = lens[i]};
    }
    size_t ok = 0, lost = 0;
    dlock__redlock_round(rl, rd, calls, n, deadline, false, "release", rl->quorum);
    int rc = DLOCK_OK;
    for (size_t j = 0; j < n; j++) {
        const redisReply *r = calls[j].reply;
        size_t i = calls[j].node;
        if (!r) { /* that node's copy expires with the lease */
            if (!rc)
                rc = rd->rc[i];
            continue;
        }
        if (r->type == REDIS_REPLY_INTEGER && r->integer == 1)
            ok++;
        else
            lost++;
        bd->state[i] = NODE_NO;
    }
    dlock__redlock_calls_free(calls, n);
    for (size_t i = 0; i < rl->n; i++)
        if (bd->state[i] == NODE_UNKNOWN) {
            /* a reply lost at acquire: the cancel was queued then */
            bd->state[i] = NODE_NO;
        }
    if (released)
        *released = ok;
    if (gone)
        *gone = lost;
    return rc;
}

/* ============================================================== release */

/* What a call on the nodes holding H starts from: *BD, H's node record,
 * and its keys in K (to free). DLOCK_ELOST when H has no record. */
static int hold_nodes(struct redlock *rl, struct dlock__hold *h, struct rl_hold **bd,
                      struct lock_keys *k)
{
    if (!(*bd = h->bdata))
        return dlock__err(DLOCK_ELOST, "%s: lock '%s': no node record", rl->where, h->name);
    return dlock__redis_keys_make(rl->node[0], h->name, k);
}

/* Give H up on every node at once within DEADLINE (DLOCK__NEVER: the
 * node timeout; none sent once it has passed). With OWE, a node that has
 * not answered by then is owed the cancel of every request of H's owner
 * so far (cancel.c: the keeper sends it), which the owner's next attempt
 * sends that node first -- a node that cannot take it sits the attempt
 * out -- so it never ends a later hold; too few answers are then no
 * failure. */
static int release_hold(struct redlock *rl, struct dlock__hold *h, int64_t deadline, bool owe)
{
    struct rl_hold *bd;
    struct lock_keys k;
    int rc = hold_nodes(rl, h, &bd, &k);
    h->bdata = NULL;
    if (rc) {
        free(bd);
        return rc;
    }
    size_t held = 0, released = 0, gone = 0;
    for (size_t i = 0; i < rl->n; i++)
        held += bd->state[i] == NODE_YES;
    struct rl_round rd;
    char shortfall[RL_SHORTFALL_MAX];
    int frc = dlock__redlock_release_nodes(rl, h, bd, &k, deadline, &released, &gone, &rd);
    uint64_t last = __atomic_load_n(&rl->requests, __ATOMIC_RELAXED);
    for (size_t i = 0; owe && i < rl->n; i++)
        if (bd->state[i] == NODE_YES)
            dlock__redis_cancel_lost_acquire(rl->node[i], h, last, h->lease_ms);
    if (released >= rl->quorum)
        rc = DLOCK_OK;
    else if (held < rl->quorum || gone > held - rl->quorum)
        rc = dlock__err(DLOCK_ELOST, "%s: lock '%s' was lost: released on %zu of %zu nodes, "
                                     "another owner or none on %zu (our token was %llu)",
                        rl->where, h->name, released, rl->n, gone, (unsigned long long)h->token);
    else if (!owe)
        rc = dlock__err(frc ? frc : DLOCK_ECONN,
                        "%s: lock '%s': released on %s; the others expire with the lease", rl->where,
                        h->name, dlock__redlock_shortfall(rl, &rd, released, shortfall));
    free(bd);
    dlock__redis_keys_free(&k);
    return rc;
}

int dlock__redlock_release(void *state, struct dlock__hold *h)
{
    return release_hold(state, h, DLOCK__NEVER, false);
}

int dlock__redlock_release_by(void *state, struct dlock__hold *h, int64_t deadline, bool owe)
{
    return release_hold(state, h, deadline, owe);
}

/* The lock ops' release_within (backend.h). */
int dlock__redlock_release_within(void *state, struct dlock__hold *h, int64_t deadline)
{
    return release_hold(state, h, deadline, true);
}

/* The backend's downgrade: exclusive hold H becomes shared in place on
 * every node that holds it, all at once (scripts/rw_downgrade.lua: the
 * field stays, "mode" turns "read", the reader's timeout key is written,
 * waiting readers are woken). Done when a majority did it; the nodes
 * that did not keep nothing of H for the renewals (their copy expires).
 * Otherwise the hold can no longer pass for exclusive (readers may be in
 * on some nodes already): DLOCK_ELOST, as on one node. */
int dlock__redlock_downgrade(void *state, struct dlock__hold *h)
{
    struct redlock *rl = state;
    struct rl_hold *bd;
    struct lock_keys k;
    int rc = hold_nodes(rl, h, &bd, &k);
    if (rc)
        return rc;
    /* Per node: the token key, and what it holds while the hold is ours
     * (either value, rw_downgrade.lua's ARGV[3], ARGV[4]), the first
     * written in our timeout key there. */
    char lease[24];
    int ll = snprintf(lease, sizeof lease, "%lld", (long long)h->lease_ms);
    struct node_counter nc[RL_MAX_NODES];
    const char *args[RL_MAX_NODES][8];
    size_t lens[RL_MAX_NODES][8];
    struct rl_call calls[RL_MAX_NODES];
    size_t n = 0, done = 0;
    for (size_t i = 0; i < rl->n; i++) {
        struct redis_state *s = rl->node[i];
        if (bd->state[i] != NODE_YES)
            continue;
        node_counter_of(bd, i, &nc[i]);
        const char *a[] = {k.lock,   k.rwchan, k.tbase,       k.token,
                           h->owner, lease,    nc[i].counter, nc[i].also};
        size_t l[] = {k.lock_len,       k.rwchan_len, k.tbase_len,       k.token_len,
                      strlen(h->owner), (size_t)ll,   nc[i].counter_len, nc[i].also_len};
        memcpy(args[i], a, sizeof a);
        memcpy(lens[i], l, sizeof l);
        calls[n++] = (struct rl_call){.node = i, .src = s->src[S_RW_DOWNGRADE],
                                      .sha = s->sha[S_RW_DOWNGRADE], .nkeys = 4, .nargs = 8,
                                      .args = args[i], .lens = lens[i]};
    }
    int64_t sent = dlock__now_ms();
    struct rl_round rd;
    char shortfall[RL_SHORTFALL_MAX];
    dlock__redlock_round(rl, &rd, calls, n, DLOCK__NEVER, false, "downgrade", rl->quorum);
    for (size_t j = 0; j < n; j++) {
        const redisReply *r = calls[j].reply;
        if (r && r->type == REDIS_REPLY_INTEGER && r->integer == 1) {
            done++;
            bd->read_token[calls[j].node] = bd->counter[calls[j].node];
        } else
            bd->state[calls[j].node] = r ? NODE_NO : NODE_UNKNOWN;
    }
    dlock__redlock_calls_free(calls, n);
    if (done >= rl->quorum)
        dlock__hold_confirmed(rl->c, h, sent); /* the timeout keys' leases run from now */
    else
        rc = dlock__err(DLOCK_ELOST,
                        "%s: lock '%s': downgraded to shared on %s; the hold can no longer be "
                        "trusted exclusive",
                        rl->where, h->name, dlock__redlock_shortfall(rl, &rd, done, shortfall));
    dlock__redis_keys_free(&k);
    return rc;
}

/* ================================================================ renew */

/* The keeper's batch: per node, the holds granted there in calls of
 * RL_RENEW_BATCH, every node at once in one round trip. A hold is renewed
 * when a majority renewed it and the validity of the renewal (its send
 * time + lease - drift) has not passed; lost when fewer than a majority
 * can still have it. */
int dlock__redlock_renew(void *state, struct dlock__renew_batch *b)
{
    struct redlock *rl = state;
    size_t n = b->n;
    if (n == 0)
        return DLOCK_OK;
    size_t chunks = (n + RL_RENEW_BATCH - 1) / RL_RENEW_BATCH;
    size_t ncalls = chunks * rl->n;
    struct rl_call *calls = calloc(ncalls, sizeof *calls);
    struct renew_bufs rb;
    int rc = dlock__redis_renew_bufs_new(&rb, ncalls * 4 * RL_RENEW_BATCH, n * rl->n, n);
    size_t *hold_of = calloc(ncalls * RL_RENEW_BATCH, sizeof *hold_of); /* call slot -> hold */
    unsigned char *renewed = calloc(n, 1);
    char **timeouts = calloc(n, sizeof *timeouts); /* a reader's timeout key; NULL: a writer */
    if (!rc && (!calls || !hold_of || !renewed || !timeouts))
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    if (rc)
        goto fail_all;
    for (size_t j = 0; j < n; j++) {
        struct dlock__hold *h = b->holds[j];
        if ((rc = dlock__redis_keys_make(rl->node[0], h->name, &rb.keys[j])))
            goto fail_all;
        snprintf(rb.leases[j], sizeof rb.leases[j], "%lld", (long long)h->lease_ms);
        if (h->mode != DLOCK_SHARED)
            continue;
        size_t size = rb.keys[j].tbase_len + strlen(h->owner) + 32;
        if (!(timeouts[j] = malloc(size))) {
            rc = dlock__err(DLOCK_ENOMEM, "out of memory");
            goto fail_all;
        }
        dlock__redis_rw_timeout_key(&rb.keys[j], h, timeouts[j], size);
    }
    /* Lay out each node's calls: keys first, then (value, lease, the
     * reader's timeout key or '') each. */
    size_t nc = 0;
    const char **ap = rb.argv;
    size_t *lp = rb.argl;
    for (size_t i = 0; i < rl->n; i++) {
        struct redis_state *s = rl->node[i];
        size_t j = 0;
        while (j < n) {
            size_t slots[RL_RENEW_BATCH], m = 0;
            for (; j < n && m < RL_RENEW_BATCH; j++) {
                struct rl_hold *bd = b->holds[j]->bdata;
                if (bd && bd->state[i] == NODE_YES)
                    slots[m++] = j;
            }
            if (m == 0)
                break;
            struct rl_call *cl = &calls[nc];
            *cl = (struct rl_call){.node = i, .src = s->src[S_RENEW], .sha = s->sha[S_RENEW],
                                   .nkeys = (int)m, .nargs = (int)(4 * m), .args = ap, .lens = lp};
            for (size_t x = 0; x < m; x++) {
                ap[x] = rb.keys[slots[x]].lock;
                lp[x] = rb.keys[slots[x]].lock_len;
                hold_of[nc * RL_RENEW_BATCH + x] = slots[x];
            }
            for (size_t x = 0; x < m; x++) {
                struct dlock__hold *h = b->holds[slots[x]];
                struct rl_hold *bd = h->bdata;
                char *v = rb.vals[slots[x] * rl->n + i];
                int vl = dlock__redlock_node_value(rl, h, bd->token[i], v, 160);
                ap[m + 3 * x] = v;
                lp[m + 3 * x] = (size_t)vl;
                ap[m + 3 * x + 1] = rb.leases[slots[x]];
                lp[m + 3 * x + 1] = strlen(rb.leases[slots[x]]);
                ap[m + 3 * x + 2] = timeouts[slots[x]] ? timeouts[slots[x]] : "";
                lp[m + 3 * x + 2] = strlen(ap[m + 3 * x + 2]);
            }
            ap += 4 * m;
            lp += 4 * m;
            nc++;
        }
    }
    int64_t sent = dlock__now_ms();
    struct rl_round rd;
    dlock__redlock_round(rl, &rd, calls, nc, b->deadline, true, "renew", rl->quorum);
    for (size_t c = 0; c < nc; c++) {
        const redisReply *r = calls[c].reply;
        size_t i = calls[c].node;
        size_t m = (size_t)calls[c].nkeys;
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != m)
            continue; /* the node failed: its holds may still be there */
        for (size_t x = 0; x < m; x++) {
            size_t j = hold_of[c * RL_RENEW_BATCH + x];
            struct rl_hold *bd = b->holds[j]->bdata;
            if (r->element[x]->type == REDIS_REPLY_INTEGER && r->element[x]->integer == 1)
                renewed[j]++;
            else
                bd->state[i] = NODE_NO; /* gone from that node */
        }
    }
    int64_t now = dlock__now_ms();
    for (size_t j = 0; j < n; j++) {
        struct dlock__hold *h = b->holds[j];
        struct rl_hold *bd = h->bdata;
        size_t still = 0;
        for (size_t i = 0; bd && i < rl->n; i++)
            still += bd->state[i] == NODE_YES;
        if (renewed[j] >= rl->quorum && now < sent + h->lease_ms - rl->c->opts.drift_ms) {
            dlock__renew_result(b, j, DLOCK_OK);
            dlock__hold_confirmed(rl->c, h, sent);
        } else if (still < rl->quorum) {
            char nodes[200] = "";
            size_t nl = 0;
            for (size_t i = 0; bd && i < rl->n && nl < sizeof nodes - 1; i++)
                if (bd->state[i] != NODE_YES)
                    nl += (size_t)snprintf(nodes + nl, sizeof nodes - nl, "%s%s:%d", nl ? ", " : "",
                                           rl->node[i]->host, rl->node[i]->port);
            dlock__err(DLOCK_ELOST, "%s: renewal found lock '%s' held by another owner or gone "
                                    "(lease expired, force-released or the node lost its data) on "
                                    "%zu of %zu nodes (%s); a majority needs %zu",
                       rl->where, h->name, rl->n - still, rl->n, nodes, rl->quorum);
            dlock__renew_result(b, j, DLOCK_ELOST);
        } else {
            dlock__err(DLOCK_EUNAVAIL, "%s: renewal of lock '%s' reached %zu of %zu nodes in time, "
                                       "%zu needed (%s)",
                       rl->where, h->name, (size_t)renewed[j], rl->n, rl->quorum,
                       dlock__redlock_first_failure(&rd, rl->n));
            dlock__renew_result(b, j, DLOCK_EUNAVAIL);
        }
    }
    dlock__redlock_calls_free(calls, nc);
    goto out;
fail_all:
    for (size_t j = 0; j < n; j++)
        dlock__renew_result(b, j, rc);
out:
    for (size_t j = 0; timeouts && j < n; j++)
        free(timeouts[j]);
    free(timeouts);
    dlock__redis_renew_bufs_free(&rb);
    free(calls);
    free(hold_of);
    free(renewed);
    return rc;
}
