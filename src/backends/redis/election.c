/* election.c -- the Redis backend's leader election: the lock plus the
 * leader's value in a hash beside it.
 *
 * Election NAME is lock NAME in the client's layout (Redisson's hash, or
 * the simple layout's string): whoever holds it leads, and its fencing
 * token (INCR of redisson_lock_token:{NAME}) is the leader's token. Beside
 * it, the HASH dlock_leader:{NAME} (same hash tag, so same cluster slot)
 * holds the value the leader wrote (field value), its token (field token)
 * and a version bumped by every write (field version; absent or below
 * 10^15 it goes on from the server's clock in microseconds, as the token
 * counter does). The leader writes
 * it right after winning and at each proclaim, in a script that first
 * checks the lock is still its own (held, and the token counter still at
 * its token: any later acquisition would have moved it), and publishes on
 * dlock_leader__channel:{NAME}. The value counts only while the lock is
 * held and its token is the counter's: what a resigned or expired leader
 * left behind is never read as current, and the hash needs no lease of
 * its own (the lock's lease is the leader's).
 *
 * Observers sleep on pub/sub, never on a timer: the leader channel, on
 * which every value written and every resign publishes "1" (which the
 * hub hands to every waiter of the channel, not one); a leader whose
 * lease ran out (or a forced release) publishes nothing, so the lock's
 * remaining TTL bounds each sleep as the lock waiters' does.
 *
 * An asynchronous campaign parks as a lock's wait does (async.c) and
 * writes the value once it holds, as the blocking campaign does.
 */
#include "redis.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dlock__redis_leader_keys(struct redis_state *s, const char *name, struct leader_keys *lk)
{
    int rc = dlock__redis_keys_make(s, name, &lk->k);
    if (rc)
        return rc;
    lk->value = dlock__sprintf("dlock_leader:%s", lk->k.tbase);
    lk->chan = dlock__sprintf("dlock_leader__channel:%s", lk->k.tbase);
    if (!lk->value || !lk->chan) {
        free(lk->value);
        free(lk->chan);
        dlock__redis_keys_free(&lk->k);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    return DLOCK_OK;
}

void dlock__redis_leader_keys_free(struct leader_keys *lk)
{
    free(lk->value);
    free(lk->chan);
    dlock__redis_keys_free(&lk->k);
}

/* EVAL SCRIPT with ARGC arguments (after the script) on a pooled
 * connection, answering by DEADLINE: *OUT the reply. */
static int eval(struct redis_state *s, int64_t deadline, const char *script, int argc,
                const char **args, const char *what, redisReply **out)
{
    const char *argv[12] = {"EVAL", dlock__redis_sharded_script(s, script)};
    for (int i = 0; i < argc; i++)
        argv[2 + i] = args[i];
    return dlock__redis_keyed_command(s, deadline, args[1], 2 + argc, argv, what, out);
}

/* Write VALUE as H's (the leader's) by DEADLINE (a wait's): DLOCK_ELOST
 * when H no longer holds. */
static int write_value(void *state, struct dlock__hold *h, const char *value, int64_t deadline)
{
    struct redis_state *s = state;
    struct leader_keys lk;
    int rc = dlock__redis_leader_keys(s, h->name, &lk);
    if (rc)
        return rc;
    char token[32];
    snprintf(token, sizeof token, "%" PRIu64, h->token);
    const char *args[] = {"4", lk.k.lock, lk.value, lk.chan, lk.k.token, h->owner, token, value};
    redisReply *r = NULL;
    char what[600];
    snprintf(what, sizeof what, "write the value of election '%s'", h->name);
    rc = eval(s, dlock__time_budget(deadline, s->op_timeout_ms),
              dlock__redis_leader_write_script.src, 8, args, what, &r);
    if (!rc && (r->type != REDIS_REPLY_INTEGER || r->integer != 1))
        rc = dlock__err(DLOCK_ELOST, "%s: election '%s': lock %s is no longer ours (token %s)",
                        s->where, h->name, lk.k.lock, token);
    if (r)
        freeReplyObject(r);
    dlock__redis_leader_keys_free(&lk);
    return rc;
}

/* The end of a campaign whose lock H just took: its value written by
 * W's deadline, the lock given back when that fails. */
static int campaign_write(void *state, struct dlock__hold *h, struct dlock__wait *w,
                          const struct dlock__redis_leader_ops *ops)
{
    int64_t deadline = dlock__wait_deadline(w);
    int rc = ops->write(state, h, h->elect->value, deadline);
    if (rc) {
        char msg[DLOCK__MSG_MAX];
        dlock__errmsg_save(msg);
        ops->give_up(state, h, deadline);
        return dlock__errmsg_restore(rc, msg);
    }
    return DLOCK_OK;
}

int dlock__redis_campaign(void *state, struct dlock__hold *h, struct dlock__wait *w,
                          const struct dlock__redis_leader_ops *ops)
{
    int rc = ops->acquire(state, h, w);
    return rc ? rc : campaign_write(state, h, w, ops);
}

int dlock__redis_proclaim(void *state, struct dlock_client *c, struct dlock__hold *h,
                          const char *value, const struct dlock__redis_leader_ops *ops)
{
    int rc = ops->write(state, h, value, DLOCK__NEVER);
    if (rc == DLOCK_ELOST)
        dlock__hold_lost(c, h, dlock_errmsg());
    return rc;
}

/* The single node's give-up: its release (the request timeout). */
static int give_up(void *state, struct dlock__hold *h, int64_t deadline)
{
    (void)deadline;
    return dlock__redis_release_hold(state, h);
}

static const struct dlock__redis_leader_ops node_ops = {dlock__redis_acquire, give_up, write_value};

int dlock__redis_elect_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
{
    return dlock__redis_campaign(state, h, w, &node_ops);
}

int dlock__redis_elect_try_armed(void *state, struct dlock__hold *h, struct dlock__wait *w,
                                 void **park)
{
    int rc = dlock__redis_try_armed(state, h, w, park);
    return rc ? rc : campaign_write(state, h, w, &node_ops);
}

int dlock__redis_elect_release(void *state, struct dlock__hold *h)
{
    struct redis_state *s = state;
    int rc = dlock__redis_release_hold(state, h);
    /* Observers listen on the leader channel only: tell them (best
     * effort; a lost message is made up by their lease-bounded sleep). */
    struct leader_keys lk;
    if (dlock__redis_leader_keys(s, h->name, &lk) == DLOCK_OK) {
        char msg[DLOCK__MSG_MAX];
        dlock__errmsg_save(msg);
        const char *argv[] = {dlock__redis_publish_command(s), lk.chan, "1"};
        redisReply *r = NULL;
        dlock__redis_keyed_command(s, dlock__now_ms() + s->op_timeout_ms, lk.chan, 3, argv,
                                   "publish", &r);
        if (r)
            freeReplyObject(r);
        dlock__redis_leader_keys_free(&lk);
        dlock__errmsg_restore(rc, msg);
    }
    return rc;
}

int dlock__redis_elect_proclaim(void *state, struct dlock__hold *h, const char *value)
{
    struct redis_state *s = state;
    return dlock__redis_proclaim(state, s->c, h, value, &node_ops);
}

/* The number in R (a string of digits below 2^64, or an integer >= 0)
 * into *OUT: false for anything else ("12abc" is no 12). */
static bool reply_u64(const redisReply *r, uint64_t *out)
{
    if (r->type == REDIS_REPLY_INTEGER && r->integer >= 0) {
        *out = (uint64_t)r->integer;
        return true;
    }
    return r->type == REDIS_REPLY_STRING && dlock__redis_parse_u64(r->str, r->len, out);
}

/* One look at the election on its node into OUT; *CONSISTENT false while
 * a new leader has not written its value yet; *TTL the lock's PTTL. */
static int look(const struct dlock__redis_observer *ob, const struct leader_keys *lk,
                int64_t deadline, struct dlock_leader *out, bool *consistent, int64_t *ttl)
{
    struct redis_state *s = ob->nodes[0];
    const char *args[] = {"3", lk->k.lock, lk->value, lk->k.token};
    redisReply *r = NULL;
    char what[600];
    snprintf(what, sizeof what, "read the leader of election '%s'", ob->name);
    int rc = eval(s, deadline, dlock__redis_leader_read_script.src, 4, args, what, &r);
    free(out->value);
    memset(out, 0, sizeof *out);
    if (rc)
        return rc;
    rc = dlock__redis_leader_parse(s, r, what, out, consistent, ttl);
    freeReplyObject(r);
    return rc;
}

int dlock__redis_leader_parse(struct redis_state *s, const redisReply *r, const char *what,
                              struct dlock_leader *out, bool *consistent, int64_t *ttl)
{
    int rc = DLOCK_OK;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 7)
        return dlock__err(DLOCK_EPROTO, "%s: %s: unexpected reply", s->where, what);
    /* the lock's token counter, then the token and version the value's
     * writer had (leader_read.lua) */
    static const char *const field[] = {"token counter", "value's token", "value's version"};
    uint64_t n[3], held = 0;
    for (int i = 0; i < 3; i++)
        if (!reply_u64(r->element[2 + i], &n[i]))
            return dlock__err(DLOCK_EPROTO, "%s: %s: its %s is '%.40s', not a number", s->where,
                              what, field[i],
                              r->element[2 + i]->type == REDIS_REPLY_STRING ? r->element[2 + i]->str
                                                                            : "(no string)");
    if (!reply_u64(r->element[0], &held))
        return dlock__err(DLOCK_EPROTO, "%s: %s: unexpected reply", s->where, what);
    uint64_t counter = n[0], vtoken = n[1];
    *ttl = r->element[6]->type == REDIS_REPLY_INTEGER ? r->element[6]->integer : -2;
    *consistent = held != 1 || vtoken == counter;
    if (held == 1 && *consistent) {
        out->held = true;
        out->token = counter;
        out->version = n[2];
        out->value = r->element[5]->type == REDIS_REPLY_STRING
                         ? strndup(r->element[5]->str, r->element[5]->len)
                         : dlock__strdup("");
        if (r->element[1]->type == REDIS_REPLY_STRING)
            snprintf(out->id, sizeof out->id, "%.*s", (int)r->element[1]->len, r->element[1]->str);
        if (!out->value)
            rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    return rc;
}

int dlock__redis_observe(const struct dlock__redis_observer *ob, const struct dlock_leader *known,
                         struct dlock__wait *w, struct dlock_leader *out)
{
    struct leader_keys lk;
    int rc = dlock__redis_leader_keys(ob->nodes[0], ob->name, &lk);
    if (rc)
        return rc;
    const char *chan = lk.chan;
    size_t chan_len = strlen(chan), joined = 0;
    struct dlock__backoff backoff = DLOCK__OBSERVE_BACKOFF;
    for (;;) {
        unsigned seq = dlock__wait_seq(w);
        bool consistent = false;
        int64_t ttl = -2;
        rc = ob->look(ob, &lk, dlock__wait_deadline(w), out, &consistent, &ttl);
        if (dlock__observe_retry(known, w, &backoff, &rc))
            continue; /* a server restarting, loading, failing over */
        if (rc || dlock__observe_done(known, out, consistent, w, &rc))
            break;
        /* Every node's leader channel: a subscription's confirmation
         * wakes us, and then we look again. */
        for (; joined < ob->n; joined++)
            if ((rc = dlock__redis_hub_join(ob->nodes[joined], chan, chan_len, w)))
                break;
        if (dlock__observe_retry(known, w, &backoff, &rc))
            continue;
        if (rc)
            break;
        /* Until a message, or the lock's remaining lease (an expiry
         * publishes nothing); none held, or no expiry: IDLE_MS. */
        int64_t bound = ttl >= 0 ? ttl : ob->idle_ms;
        rc = dlock__redis_wait_sleep(w, seq, bound, ob->idle_ms, NULL, DLOCK_ECONN, ob->where,
                                     lk.k.lock);
        if (rc)
            break;
        for (size_t i = 0; i < joined; i++)
            dlock__redis_hub_ack(ob->nodes[i], chan, chan_len, w);
    }
    for (size_t i = 0; i < joined; i++)
        dlock__redis_hub_leave(ob->nodes[i], chan, chan_len, w, true);
    dlock__redis_leader_keys_free(&lk);
    return rc;
}

int dlock__redis_elect_observe(void *state, const char *name, const struct dlock_leader *known,
                               struct dlock__wait *w, struct dlock_leader *out)
{
    struct redis_state *s = state;
    struct redis_state *const nodes[] = {s};
    const struct dlock__redis_observer ob = {.nodes = nodes,
                                             .n = 1,
                                             .name = name,
                                             .where = s->where,
                                             .idle_ms = s->op_timeout_ms,
                                             .look = look};
    return dlock__redis_observe(&ob, known, w, out);
}
