/* semaphore.c -- the Redis backend's counting semaphore, on the wire
 * layout of Redisson's RPermitExpirableSemaphore, so Redisson clients and
 * dlock share the permits of one name.
 *
 * Why this layout: Redisson's plain RSemaphore keeps only a counter, so a
 * holder that crashes takes its permits with it for good; the expirable
 * one records each permit with an expiry, and whoever comes next gives
 * the expired ones back. Keys (docs/protocol-redis.md): NAME, a STRING
 * holding the free permits; {NAME}:timeout, a ZSET of permit id -> expiry
 * (ms since the epoch); the channel redisson_sc:{NAME}, where every
 * release publishes the free count; dlock_sem_token:{NAME}, our
 * fencing counter, and dlock_sem_released:{NAME}, the recent releases
 * (Redisson neither reads nor needs these two). The permit count
 * is what Redisson counts too: free + held.
 *
 * A permit object of K permits is K ids sharing a random 14-byte prefix
 * (id i = prefix + i in two bytes), so acquire, release and renewal send
 * the prefix and K, never K ids. Expiries come from the server's clock
 * (TIME), so clients with skewed clocks agree; the keeper moves them to
 * now + lease, as Redisson's updateLeaseTime does. The scripts are in
 * scripts/sem_*.lua.
 *
 * Ambiguous replies: an acquire whose reply is lost is not sent again
 * (a second try would take more permits); the ids it may have taken are
 * released by the cleanup queue, and their lease bounds the harm if even
 * that fails. So each try of a wait has ids of its own (new_id). A
 * release is idempotent (ZREM counts what it removed) and is retried
 * once; the server remembers each release a while in
 * dlock_sem_released:{NAME}, so a retry that finds nothing to remove
 * knows whether its own lost first attempt gave the ids back (OK) or
 * they were gone (DLOCK_ELOST).
 *
 * ?sync=N: every script here that writes is followed by WAIT N in the
 * same round trip (scripts.c); an acquire too few replicas acknowledged
 * is given back and fails DLOCK_EUNAVAIL, such a renewal does not count.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis.h"

#define ID_PREFIX 14 /* bytes of a permit object's id prefix */

static void sem_keys_free(struct sem_keys *k)
{
    free(k->name); /* one block holds them all */
    memset(k, 0, sizeof *k);
}

/* Redisson's keys of semaphore NAME (prefix applied), in one block:
 * suffixName(name, "timeout") and prefixName("redisson_sc", name), which
 * keep a hash tag the name already has, and dlock's two. */
static int sem_keys_make(struct redis_state *s, const char *name, struct sem_keys *k)
{
    memset(k, 0, sizeof *k);
    const struct key_part parts[] = {
        {"", ":timeout", &k->timeout, &k->timeout_len},
        {"redisson_sc:", "", &k->chan, &k->chan_len},
        {"dlock_sem_token:", "", &k->token, &k->token_len},
        {"dlock_sem_released:", "", &k->released, &k->released_len},
    };
    int rc = dlock__redis_key_block(s, name, &k->name, &k->name_len, parts,
                                    sizeof parts / sizeof parts[0]);
    if (!rc && (rc = dlock__redis_name_check(s, "semaphore", name)))
        sem_keys_free(k);
    return rc;
}

/* H's id prefix, from the hex of its first id in h->owner. */
static void id_prefix(const struct dlock__hold *h, char out[ID_PREFIX])
{
    for (int i = 0; i < ID_PREFIX; i++)
        out[i] = (char)(dlock__hexval(h->owner[2 * i]) << 4 | dlock__hexval(h->owner[2 * i + 1]));
}

/* A fresh id prefix for H: random, its first id (prefix + 0000) in hex
 * as h->owner, the id Redisson would print. */
static void new_id(struct dlock__hold *h)
{
    char uuid[37], hex[33];
    size_t n = 0;
    dlock__uuid(uuid);
    for (const char *p = uuid; *p && n < 2 * ID_PREFIX; p++)
        if (*p != '-')
            hex[n++] = *p;
    snprintf(h->owner, sizeof h->owner, "%.*s0000", 2 * ID_PREFIX, hex);
}

/* "count:N" / "type:T" replies of the scripts (and any other reply a
 * script does not give: DLOCK_EPROTO). */
static int odd_reply(struct redis_state *s, const struct sem_keys *k, const redisReply *r,
                     unsigned permits)
{
    if (r->type == REDIS_REPLY_STRING && strncmp(r->str, "count:", 6) == 0)
        return dlock__err(DLOCK_EINVAL,
                          "%s: semaphore '%s' has %s permits (free + held in '%s' and '%s'), "
                          "not %u: use its count, or delete both keys while nobody holds a permit",
                          s->where, k->name, r->str + 6, k->name, k->timeout, permits);
    if (r->type == REDIS_REPLY_STRING && strncmp(r->str, "type:", 5) == 0)
        return dlock__err(DLOCK_EWRONGTYPE,
                          "%s: WRONGTYPE: key '%s' or '%s' holds a %s, not a semaphore of "
                          "Redisson's RPermitExpirableSemaphore layout; left untouched",
                          s->where, k->name, k->timeout, r->str + 5);
    return dlock__err(DLOCK_EPROTO, "%s: semaphore '%s': unexpected reply (type %d)", s->where,
                      k->name, r->type);
}

/* ---------------------------------------------------------- cleanup */

/* Give back the ids of an acquire whose reply was lost. */
struct lost_acquire {
    char *name;
    char prefix[ID_PREFIX];
    unsigned k;
};

static void lost_acquire_free(void *arg)
{
    struct lost_acquire *a = arg;
    free(a->name);
    free(a);
}

/* How long a release is remembered on the server (ms), so that the retry
 * of a release whose reply was lost can tell "our first attempt gave
 * them back" from "they were gone": a retry runs within the call's one
 * op-timeout budget of the first attempt (scripts.c), so four of those,
 * at least a minute, leave a wide margin. */
static int64_t release_memory_ms(const struct redis_state *s)
{
    return 4 * s->op_timeout_ms > 60000 ? 4 * s->op_timeout_ms : 60000;
}

int dlock__redis_sem_release_reply(struct redis_state *s, const struct sem_keys *k,
                                   const redisReply *r, long long *removed)
{
    if (r->type != REDIS_REPLY_INTEGER)
        return odd_reply(s, k, r, 0);
    *removed = r->integer;
    return DLOCK_OK;
}

/* Give back the K ids of PREFIX (scripts/sem_release.lua; with RETRY,
 * once more after a lost reply). *REMOVED: how many were still held; -1
 * when none was but the lost first attempt had given them back. With
 * ?sync=N the WAIT behind it is waited for, too few acknowledgements are
 * not an error (a release cannot be undone; docs/protocol-redis.md). */
static int release_ids(struct redis_state *s, const char *name, const char prefix[ID_PREFIX],
                       unsigned k, int64_t deadline, bool retry, long long *removed)
{
    struct sem_keys keys;
    int rc = sem_keys_make(s, name, &keys);
    if (rc)
        return rc;
    char kk[16], memory[24];
    int kl = snprintf(kk, sizeof kk, "%u", k);
    int ml = snprintf(memory, sizeof memory, "%lld", (long long)release_memory_ms(s));
    const char *args[] = {keys.name, keys.timeout, keys.chan, keys.released, kk, prefix, memory,
                          "0"};
    const char *retry_args[] = {keys.name, keys.timeout, keys.chan, keys.released,
                                kk,        prefix,       memory,    "1"};
    size_t lens[] = {keys.name_len, keys.timeout_len, keys.chan_len, keys.released_len,
                     (size_t)kl,    ID_PREFIX,        (size_t)ml,    1};
    struct redis_request rq = {.script = S_SEM_RELEASE, .nkeys = 4, .nargs = 8, .args = args,
                               .lens = lens, .retry_args = retry_args, .retry_lens = lens,
                               .once = !retry, .what = "semaphore release",
                               .deadline = deadline};
    rc = dlock__redis_eval(s, &rq);
    if (!rc) {
        rc = dlock__redis_sem_release_reply(s, &keys, rq.out.reply, removed);
        freeReplyObject(rq.out.reply);
    }
    sem_keys_free(&keys);
    return rc;
}

static int lost_acquire_run(void *bstate, void *arg, int64_t deadline)
{
    struct lost_acquire *a = arg;
    long long removed;
    return release_ids(bstate, a->name, a->prefix, a->k, deadline, false, &removed);
}

/* ---------------------------------------------------------- acquire */

/* What one try tells the wait: how long to sleep at most before trying
 * again without a message (the nearest expiry, at most a lease), and
 * whether a wake-up should go on to the next waiter although this one
 * succeeded (permits left). */
struct redis_try {
    int64_t sleep_ms;
    bool pass_on;
};

/* One try within DEADLINE: DLOCK_OK (token and validity
 * set; T passes the wake on when permits are left), DLOCK_EBUSY (T sleeps
 * until the nearest expiry, at most a lease), or a failure. */
struct sem_try_arg {
    struct dlock__hold *h;
    const struct sem_keys *k;
};

int dlock__redis_sem_acquire_reply(struct redis_state *s, const struct sem_keys *k,
                                   const redisReply *r, struct sem_acquire_reply *q)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER)
        return odd_reply(s, k, r, q->permits);
    long long a = r->element[0]->integer, b = r->element[1]->integer;
    if (a >= 0) {
        q->out.token = (uint64_t)a;
        q->out.pass_on = b > 0;
        return DLOCK_OK;
    }
    q->out.sleep_ms = b >= 0 && b < q->lease_ms ? b + 1 : q->lease_ms;
    return dlock__err(DLOCK_EBUSY, "%s: semaphore '%s': fewer than %u permits free", s->where,
                      k->name, q->want);
}

static int try_take(struct redis_state *s, void *arg, struct dlock__wait *w, struct redis_try *t)
{
    int64_t deadline = dlock__wait_deadline(w);
    struct dlock__hold *h = ((struct sem_try_arg *)arg)->h;
    const struct sem_keys *k = ((struct sem_try_arg *)arg)->k;
    char n[16], kk[16], lease[24], prefix[ID_PREFIX];
    int nl = snprintf(n, sizeof n, "%u", h->sem->permits);
    int kl = snprintf(kk, sizeof kk, "%u", h->sem->k);
    int ll = snprintf(lease, sizeof lease, "%lld", (long long)h->lease_ms);
    /* Ids of this try's own: a try whose reply was lost may have taken
     * its ids (the cleanup queue gives them back), so a later try that
     * reused them would take the permits twice under one id set and lose
     * them to that cleanup. */
    new_id(h);
    id_prefix(h, prefix);
    const char *args[] = {k->name, k->timeout, k->chan, k->token, n, kk, lease, prefix};
    size_t lens[] = {k->name_len, k->timeout_len, k->chan_len, k->token_len,
                     (size_t)nl,  (size_t)kl,     (size_t)ll,  ID_PREFIX};
    struct redis_request rq = {.script = S_SEM_ACQUIRE, .nkeys = 4, .nargs = 8, .args = args,
                               .lens = lens, .once = true, .what = "semaphore acquire",
                               .wait = w, .deadline = deadline};
    int rc = dlock__redis_eval(s, &rq);
    redisReply *r = rq.out.reply;
    int64_t sent = rq.out.sent_ms;
    int acked = rq.out.acked;
    if ((rc == DLOCK_ECONN || rc == DLOCK_ECANCELED) && rq.out.reached) {
        /* It may have run: owe the server a release of those ids. */
        struct lost_acquire *a = calloc(1, sizeof *a);
        char what[300];
        snprintf(what, sizeof what, "release permit %s of semaphore '%s'", h->owner, k->name);
        if (a && (a->name = dlock__strdup(h->name))) {
            memcpy(a->prefix, prefix, ID_PREFIX);
            a->k = h->sem->k;
            char msg[DLOCK__MSG_MAX];
            dlock__errmsg_save(msg);
            dlock__cleanup_add(s->c, what, lost_acquire_run, a, lost_acquire_free);
            dlock__errmsg_restore(rc, msg);
        } else {
            free(a);
        }
    }
    if (rc)
        return rc;
    struct sem_acquire_reply q = {.permits = h->sem->permits,
                                  .want = h->sem->k,
                                  .lease_ms = h->lease_ms,
                                  .out = {.sleep_ms = t->sleep_ms}};
    rc = dlock__redis_sem_acquire_reply(s, k, r, &q);
    t->sleep_ms = q.out.sleep_ms;
    if (!rc) {
        if (acked >= 0 && acked < s->sync_replicas) {
            /* ?sync=N: a permit a failover could forget is given back */
            long long removed;
            int undo = release_ids(s, h->name, prefix, h->sem->k, deadline, true, &removed);
            rc = dlock__err(DLOCK_EUNAVAIL,
                            "%s: semaphore '%s': %u permit(s) were acquired on the master but "
                            "only %d of %d replicas acknowledged it within %lld ms (sync=%d); %s",
                            s->where, k->name, h->sem->k, acked, s->sync_replicas,
                            (long long)s->sync_timeout_ms, s->sync_replicas,
                            undo ? "the undo failed too: they come back when their lease ends"
                                 : "undone");
        } else {
            h->token = q.out.token;
            t->pass_on = q.out.pass_on;
            dlock__hold_confirmed(s->c, h, sent);
        }
    }
    freeReplyObject(r);
    return rc;
}

/* After a busy first try (T: what it said): wait on Redisson's channel
 * (the subscriber hub) and try again on every release message, or when
 * T's sleep ends, until a try is not busy or W's deadline or cancel; a
 * connection lost meanwhile is retried on a backoff until the deadline,
 * as the lock's wait does (mutex.c). */
static int wait_on(struct redis_state *s, const char *chan, size_t chan_len, const char *what,
                   struct dlock__wait *w, struct sem_try_arg *arg, struct redis_try *t)
{
    /* Subscribe (shared connection), then try, sleep until a release
     * message or the safety net the last try gave, try again. */
    int rc = dlock__redis_hub_join(s, chan, chan_len, w);
    if (rc)
        return rc;
    /* A connection lost while waiting (server restart, network blip) is
     * retried with backoff until the wait's deadline: the waiter already
     * reached the server once, so the outage is transient until proven
     * otherwise. The message of the last failure is kept for the end. */
    struct dlock__redis_outage outage = DLOCK__REDIS_OUTAGE_INIT;
    int outage_rc = DLOCK_ECONN;
    for (bool first = true;; first = false) {
        unsigned seq = dlock__wait_seq(w);
        /* Before the subscription is confirmed a release could be missed,
         * so the first sleep lasts until the confirmation wakes us. */
        if (!first || dlock__redis_hub_subscribed(s, chan, chan_len)) {
            dlock__redis_hub_ack(s, chan, chan_len, w);
            rc = try_take(s, arg, w, t);
            /* EUNAVAIL is transient too: too few replicas acknowledged
             * (the permits were given back), a failover under way */
            if (rc == DLOCK_ECONN || rc == DLOCK_EUNAVAIL)
                outage_rc = rc;
            if (!dlock__redis_outage_note(&outage, rc, true))
                break;
            /* Busy: fewer than our K came back, maybe enough for a waiter
             * behind us that wants fewer: the release message woke only
             * us (K = 1 busy: none is free, nobody can use it). */
            if (rc == DLOCK_EBUSY && arg->h->sem->k > 1)
                dlock__redis_hub_pass(s, chan, chan_len, w);
        }
        int64_t now = dlock__now_ms();
        rc = dlock__wait_sleep(w, seq, now + (outage.ms ? outage.ms : t->sleep_ms));
        if (rc == DLOCK_ETIMEDOUT && outage.ms) {
            rc = dlock__err(outage_rc, "%s (still failing when the wait for %s ended)",
                            outage.msg, what);
            break;
        }
        if (rc == DLOCK_ETIMEDOUT) {
            rc = dlock__err(DLOCK_ETIMEDOUT, "%s: timed out waiting for %s", s->where, what);
            break;
        }
        if (rc != DLOCK_OK)
            break;
    }
    dlock__redis_hub_leave(s, chan, chan_len, w, rc == DLOCK_OK && !t->pass_on);
    return rc;
}

int dlock__redis_sem_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
{
    struct redis_state *s = state;
    struct sem_keys k;
    int rc = sem_keys_make(s, h->name, &k);
    if (rc)
        return rc;
    struct sem_try_arg a = {h, &k};
    struct redis_try t = {0};
    rc = try_take(s, &a, w, &t);
    if (rc == DLOCK_EBUSY && !dlock__wait_try_once(w)) {
        char what[DLOCK_NAME_MAX + 300];
        snprintf(what, sizeof what, "semaphore '%s'", k.name);
        rc = wait_on(s, k.chan, k.chan_len, what, w, &a, &t);
    }
    sem_keys_free(&k);
    return rc;
}

/* The wait of wait_on() turned inside out for the core's asynchronous
 * acquire (src/async.c parks W between attempts, as redis/async.c does
 * for locks): the first attempt is the first try; a busy one joins
 * Redisson's channel through the hub, whose thread wakes the parked W
 * on a release message or the subscription's confirmation. Until that
 * confirmation no try is made (a release before it could be missed);
 * once it came, each attempt acknowledges the wake it used and tries,
 * and a busy try of K > 1 passes the wake on. The retry time is the
 * try's sleep (the nearest permit expiry); a lost connection or a
 * failover is an outage the core rides out until the wait's end
 * (dlock__wait_outage), as wait_on() does. */
struct sem_park {
    struct sem_keys k;
    struct sem_try_arg a;
    struct redis_try t;
    bool joined;
    bool confirmed; /* the subscription was confirmed once: each attempt tries */
};

int dlock__redis_sem_try_armed(void *state, struct dlock__hold *h, struct dlock__wait *w,
                               void **park)
{
    struct redis_state *s = state;
    struct sem_park *p = *park;
    int rc;
    if (!p) {
        if (!(p = calloc(1, sizeof *p)))
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        if ((rc = sem_keys_make(s, h->name, &p->k))) {
            free(p);
            return rc;
        }
        p->a = (struct sem_try_arg){h, &p->k};
        *park = p;
        if ((rc = try_take(s, &p->a, w, &p->t)) != DLOCK_EBUSY)
            return rc;
        if ((rc = dlock__redis_hub_join(s, p->k.chan, p->k.chan_len, w)))
            return rc;
        p->joined = true;
    } else if (p->confirmed ||
               (p->confirmed = dlock__redis_hub_subscribed(s, p->k.chan, p->k.chan_len))) {
        dlock__redis_hub_ack(s, p->k.chan, p->k.chan_len, w);
        rc = try_take(s, &p->a, w, &p->t);
        if (rc == DLOCK_ECONN || rc == DLOCK_EUNAVAIL) /* the core rides it out */
            return dlock__wait_outage(w);
        /* Taken with permits left (a permit object of K > 1 given back):
         * the next waiter may take one too, and the wake this try used
         * was acknowledged, so leaving passes nothing on: pass it now. */
        if (rc == DLOCK_OK && p->t.pass_on)
            dlock__redis_hub_pass(s, p->k.chan, p->k.chan_len, w);
        if (rc != DLOCK_EBUSY)
            return rc;
        if (h->sem->k > 1)
            dlock__redis_hub_pass(s, p->k.chan, p->k.chan_len, w);
    }
    dlock__wait_retry_at(w, dlock__now_ms() + p->t.sleep_ms);
    return DLOCK_EBUSY;
}

int dlock__redis_sem_disarm(void *state, struct dlock__hold *h, struct dlock__wait *w, void *park,
                            int rc)
{
    (void)h;
    struct redis_state *s = state;
    struct sem_park *p = park;
    if (!p)
        return rc;
    if (p->joined)
        dlock__redis_hub_leave(s, p->k.chan, p->k.chan_len, w, rc == DLOCK_OK && !p->t.pass_on);
    sem_keys_free(&p->k);
    free(p);
    return rc;
}

/* ---------------------------------------------------------- release */

int dlock__redis_sem_release(void *state, struct dlock__hold *h)
{
    struct redis_state *s = state;
    char prefix[ID_PREFIX];
    id_prefix(h, prefix);
    long long removed = 0;
    int rc = release_ids(s, h->name, prefix, h->sem->k, DLOCK__NEVER, true, &removed);
    /* -1: the retry found the ids given back by our own first attempt,
     * whose reply was lost (the server remembers that release). Removing
     * fewer than K otherwise, on the first attempt or on a retry, means
     * they were gone: taken back after their lease, or removed by another
     * hand (a deleted key, a failover to a replica that never had them). */
    if (!rc && removed != (long long)h->sem->k && removed != -1)
        rc = dlock__err(DLOCK_ELOST,
                        "%s: semaphore '%s': permit %s was lost: its lease had ended and it was "
                        "taken back, or its ids were removed (%lld of %u ids still held)",
                        s->where, h->name, h->owner, removed, h->sem->k);
    return rc;
}

/* ------------------------------------------------------------ renew */

/* Renew the semaphore holds of B, one script call each, within the
 * batch's deadline. */
int dlock__redis_sem_renew_reply(struct redis_state *s, const redisReply *r, const char *owner,
                                 const char *name)
{
    if (r->type == REDIS_REPLY_INTEGER && r->integer == 1)
        return DLOCK_OK;
    return dlock__err(DLOCK_ELOST, "%s: renewal found permit %s of semaphore '%s' gone (its lease "
                                   "ended and it was taken back, or the server lost its data)",
                      s->where, owner, name);
}

static void sem_renew(struct redis_state *s, struct dlock__renew_batch *b)
{
    for (size_t i = 0; i < b->n; i++) {
        struct dlock__hold *h = b->holds[i];
        struct sem_keys k;
        int rc = sem_keys_make(s, h->name, &k);
        if (rc) {
            dlock__renew_result(b, i, rc);
            continue;
        }
        char kk[16], lease[24], prefix[ID_PREFIX];
        int kl = snprintf(kk, sizeof kk, "%u", h->sem->k);
        int ll = snprintf(lease, sizeof lease, "%lld", (long long)h->lease_ms);
        id_prefix(h, prefix);
        const char *args[] = {k.name, k.timeout, k.chan, kk, prefix, lease};
        size_t lens[] = {k.name_len, k.timeout_len, k.chan_len, (size_t)kl, ID_PREFIX, (size_t)ll};
        struct redis_request rq = {.script = S_SEM_RENEW, .nkeys = 3, .nargs = 6, .args = args,
                                   .lens = lens, .what = "semaphore renew",
                                   .deadline = b->deadline};
        rc = dlock__redis_eval(s, &rq);
        redisReply *r = rq.out.reply;
        int64_t sent = rq.out.sent_ms;
        int acked = rq.out.acked;
        if (!rc) {
            rc = dlock__redis_sem_renew_reply(s, r, h->owner, h->name);
            if (!rc && acked >= 0 && acked < s->sync_replicas) {
                /* ?sync=N: does not count; lost at the validity deadline
                 * unless a later renewal is acknowledged */
                rc = dlock__err(DLOCK_EUNAVAIL, "%s: renewal of permit %s of semaphore '%s': "
                                                "only %d of %d replicas acknowledged it (sync=%d)",
                                s->where, h->owner, h->name, acked, s->sync_replicas,
                                s->sync_replicas);
            } else if (!rc) {
                dlock__hold_confirmed(s->c, h, sent);
            }
            freeReplyObject(r);
        }
        dlock__renew_result(b, i, rc);
        sem_keys_free(&k);
    }
}

bool dlock__redis_sem_renew_apart(struct redis_state *s, struct dlock__renew_batch *b,
                                  int (*renew_locks)(void *state, struct dlock__renew_batch *b))
{
    size_t nsem = 0;
    for (size_t i = 0; i < b->n; i++)
        nsem += b->holds[i]->sem != NULL;
    if (!nsem)
        return false;
    /* Two batches, locks and permits, each with its own results. */
    struct dlock__hold **holds = calloc(b->n, sizeof *holds);
    int *result = calloc(b->n, sizeof *result);
    char(*why)[DLOCK__WHY_MAX] = calloc(b->n, sizeof *why);
    size_t *from = calloc(b->n, sizeof *from);
    if (!holds || !result || !why || !from) {
        int rc = dlock__err(DLOCK_ENOMEM, "out of memory");
        for (size_t i = 0; i < b->n; i++)
            dlock__renew_result(b, i, rc);
    } else {
        size_t nlock = b->n - nsem, l = 0, m = nlock;
        for (size_t i = 0; i < b->n; i++) {
            size_t j = b->holds[i]->sem ? m++ : l++;
            holds[j] = b->holds[i];
            from[j] = i;
            result[j] = DLOCK_EIO;
            why[j][0] = '\0';
        }
        struct dlock__renew_batch locks = {holds, nlock, b->deadline, result, why};
        struct dlock__renew_batch sems = {holds + nlock, nsem, b->deadline, result + nlock,
                                          why + nlock};
        if (nlock)
            renew_locks(s, &locks);
        sem_renew(s, &sems);
        for (size_t j = 0; j < b->n; j++) {
            b->result[from[j]] = result[j];
            memcpy(b->why[from[j]], why[j], DLOCK__WHY_MAX);
        }
    }
    free(holds);
    free(result);
    free(why);
    free(from);
    return true;
}

/* ------------------------------------------------------------- list */

/* The semaphore whose timeout ZSET is KEY ("{NAME}:timeout", or
 * "NAME:timeout" for a name with a hash tag; a cluster's encoded name
 * decoded), its free count a STRING; NULL for any other key (caller
 * frees). "{x}:timeout" is x's: the name "{x}" is refused. */
static char *sem_of_timeout_key(struct redis_state *s, struct rconn *k, const redisReply *key,
                                int *err)
{
    size_t plen = s->prefix ? strlen(s->prefix) : 0, tl = strlen(":timeout");
    if (key->len <= tl || strcmp(key->str + key->len - tl, ":timeout") != 0)
        return NULL;
    size_t fl = key->len - tl; /* the key without ":timeout" */
    bool braced = fl > 2 && key->str[0] == '{' && key->str[fl - 1] == '}';
    for (int tagged = braced ? 0 : 1; tagged < 2; tagged++) {
        const char *full = tagged ? key->str : key->str + 1; /* prefix + name */
        size_t len = tagged ? fl : fl - 2;
        if (len <= plen || (plen && strncmp(full, s->prefix, plen) != 0))
            continue;
        char *name = dlock__redis_key_name(s, full, len); /* a cluster's encoded one decoded */
        struct sem_keys keys;
        int made = name ? sem_keys_make(s, name, &keys) : DLOCK_ENOMEM;
        if (made == DLOCK_EINVAL) { /* "{x}": x's keys, not a name of its own */
            free(name);
            continue;
        }
        if (made) {
            free(name);
            *err = dlock__err(DLOCK_ENOMEM, "out of memory");
            return NULL;
        }
        bool same = keys.timeout_len == key->len && memcmp(keys.timeout, key->str, key->len) == 0;
        redisReply *r = NULL;
        if (same) {
            const char *argv[] = {"TYPE", keys.name};
            size_t argl[] = {4, keys.name_len};
            k->until = dlock__now_ms() + s->op_timeout_ms;
            *err = dlock__redis_command(k, 2, argv, argl, "list semaphores", &r, NULL);
        }
        same = same && !*err && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "string") == 0;
        freeReplyObject(r);
        sem_keys_free(&keys);
        if (same)
            return name;
        free(name);
        if (*err)
            return NULL;
    }
    return NULL;
}

struct sem_walk {
    const char *pattern;
    dlock_list_fn fn;
    void *arg;
};

static int sem_list_each(struct redis_state *s, struct rconn *k, const redisReply *key, void *arg,
                         int *err)
{
    struct sem_walk *sw = arg;
    char *name = sem_of_timeout_key(s, k, key, err);
    int stop = name && dlock__glob(sw->pattern, name) ? sw->fn(name, sw->arg) : 0;
    free(name);
    return stop;
}

int dlock__redis_sem_list(void *state, const char *pattern, dlock_list_fn fn, void *arg)
{
    /* Held permits live in the {NAME}:timeout ZSET, which goes with the
     * last of them: the ZSETs of that shape are the semaphores held. */
    struct sem_walk sw = {pattern, fn, arg};
    return dlock__redis_scan(state, "*:timeout", "zset", sem_list_each, &sw);
}

/* ---------------------------------------------------------- inspect */

static void hex_of(const char *p, size_t len, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < len; i++) {
        out[2 * i] = digits[(unsigned char)p[i] >> 4];
        out[2 * i + 1] = digits[(unsigned char)p[i] & 15];
    }
    out[2 * len] = '\0';
}

int dlock__redis_sem_inspect_reply(struct redis_state *s, const struct sem_keys *k,
                                   const redisReply *r, unsigned permits, struct dlock_info *info)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 5 || (r->elements - 5) % 2)
        return odd_reply(s, k, r, permits);
    for (size_t i = 0; i < r->elements; i++) /* the script sends strings only */
        if (r->element[i]->type != REDIS_REPLY_STRING)
            return dlock__err(DLOCK_EPROTO, "%s: semaphore '%s': unexpected reply (element %zu "
                                            "of type %d)",
                              s->where, k->name, i, r->element[i]->type);
    const char *t1 = r->element[0]->str, *t2 = r->element[1]->str;
    if ((strcmp(t1, "string") && strcmp(t1, "none")) || (strcmp(t2, "zset") && strcmp(t2, "none")))
        return dlock__err(DLOCK_EWRONGTYPE,
                          "%s: WRONGTYPE: keys '%s' (%s) and '%s' (%s) are not a semaphore of "
                          "Redisson's RPermitExpirableSemaphore layout",
                          s->where, k->name, t1, k->timeout, t2);
    char *end = NULL;
    long long free_now = strtoll(r->element[2]->str, &end, 10);
    if (!strcmp(t1, "string") && (end == r->element[2]->str || *end))
        return dlock__err(DLOCK_EWRONGTYPE,
                          "%s: WRONGTYPE: key '%s' holds a string that is not a count of free "
                          "permits (a simple-layout lock of that name?), not a semaphore of "
                          "Redisson's RPermitExpirableSemaphore layout",
                          s->where, k->name);
    int rc = dlock__info_set_key(info, k->name);
    if (rc)
        return rc;
    long long now = strtoll(r->element[3]->str, NULL, 10);
    if (r->element[4]->len && /* "": no counter yet */
        !dlock__redis_parse_u64(r->element[4]->str, r->element[4]->len, &info->token))
        return dlock__err(DLOCK_EPROTO, "%s: semaphore '%s': the token counter %s holds '%.40s', "
                                        "not a number",
                          s->where, k->name, k->token ? k->token : "", r->element[4]->str);
    size_t nids = (r->elements - 5) / 2;
    info->ttl_ms = -1;
    if (!strcmp(t1, "none") && !nids) { /* never used */
        info->permits = permits;
        info->free_permits = permits;
        return DLOCK_OK;
    }
    if (free_now < 0 || free_now > UINT_MAX || nids > UINT_MAX - (unsigned long long)free_now)
        return dlock__err(DLOCK_EPROTO, "%s: semaphore '%s': %lld free permits and %zu held",
                          s->where, k->name, free_now, nids);
    info->permits = (unsigned)(free_now + (long long)nids);
    if (permits && info->permits != permits)
        return dlock__err(DLOCK_EINVAL,
                          "%s: semaphore '%s' has %u permits (free + held in '%s' and '%s'), not %u",
                          s->where, k->name, info->permits, k->name, k->timeout, permits);
    info->free_permits = free_now;
    for (size_t i = 0; !rc && i < nids; i++) {
        const redisReply *id = r->element[5 + 2 * i];
        long long expiry = strtoll(r->element[6 + 2 * i]->str, NULL, 10);
        if (expiry <= now) { /* expired: the next acquire takes it back */
            info->free_permits++;
            continue;
        }
        info->held = 1;
        long long left;
        if (__builtin_sub_overflow(expiry, now, &left))
            left = LLONG_MAX;
        if (left > info->ttl_ms)
            info->ttl_ms = left;
        /* One holder per permit object: ids sharing our prefix are one. */
        char hex[2 * 64 + 1];
        size_t len = id->len < 64 ? id->len : 64;
        hex_of(id->str, len, hex);
        bool ours = id->len == ID_PREFIX + 2;
        bool counted = false;
        for (size_t j = 0; ours && j < info->nholders; j++)
            if (strncmp(info->holders[j].id, hex, 2 * ID_PREFIX) == 0) {
                info->holders[j].count++;
                counted = true;
            }
        if (!counted)
            rc = dlock__info_add_holder(info, hex, 1);
    }
    return rc;
}

int dlock__redis_sem_inspect(void *state, const char *name, unsigned permits, struct dlock_info *info)
{
    struct redis_state *s = state;
    struct sem_keys k;
    int rc = sem_keys_make(s, name, &k);
    if (rc)
        return rc;
    const char *args[] = {k.name, k.timeout, k.token};
    size_t lens[] = {k.name_len, k.timeout_len, k.token_len};
    struct redis_request rq = {.script = S_SEM_INSPECT, .nkeys = 3, .nargs = 3, .args = args,
                               .lens = lens, .what = "semaphore inspect",
                               .deadline = DLOCK__NEVER};
    rc = dlock__redis_eval(s, &rq);
    if (!rc) {
        rc = dlock__redis_sem_inspect_reply(s, &k, rq.out.reply, permits, info);
        freeReplyObject(rq.out.reply);
    }
    sem_keys_free(&k);
    return rc;
}
