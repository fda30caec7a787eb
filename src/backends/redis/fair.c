/* fair.c -- the Redis backend's fair lock: waiters served in arrival
 * order across clients, and each release handing the lock to the first
 * waiter inside the release script (?layout=fair; docs/protocol-redis.md,
 * "Fair locks").
 *
 * Why it is shaped so. With the Redisson layout every release is a race:
 * the release message wakes waiters, which then send an acquire each, and
 * whoever's script runs first wins -- no order, and a hand-off costs the
 * message plus an acquire round trip. Here the lock is the same Redisson
 * hash (so RLock and dlock's other layouts still exclude it), and a queue
 * beside it (scripts/fair_lock.lua) records the waiters in arrival order,
 * each with a queue lease it refreshes while it waits. The release script
 * makes the first live waiter the owner (a new token, for its queue lease:
 * all the releaser knows is that the waiter was alive within it) and
 * publishes the token on that waiter's own channel; the waiter, asleep on
 * the subscriber hub (hub.c), learns from that one message that it holds
 * the lock, and its keeper extends the hold to its lease a third of the
 * way in (dlock__hold_confirmed_short). A waiter that died stays queued only
 * until its queue lease runs out, and holds a lock handed to it no
 * longer. A release that hands nothing on (a force release, a client of
 * another layout) publishes on the lock's own channel, where waiters
 * listen too: one of them tries at once and so takes the lock or hands
 * it to the head. A waiter that gives up (timeout, cancel, a failure) leaves the
 * queue with the same script, which passes on a lock handed to it in the
 * meantime; when that reply is lost too, cancel.c owes the leave to the
 * core's cleanup queue. Reentrancy, renewal (renew_redisson.lua works on
 * the hash as it is) and lost holds are the mutex's (mutex.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis.h"

/* A waiter's queue entry lives this long unless refreshed (at a third of
 * it), and never longer than the lease it asks for: a waiter that died is
 * skipped once it runs out. */
#define FAIR_QUEUE_LEASE_MS 5000

/* The keys of a fair lock: the mutex's (the queue and the waiters'
 * records among them), and the channel where this client hears its
 * grants (one per client, for every fair lock: kept subscribed, so a wait
 * costs no subscription). */
struct fair_keys {
    struct lock_keys k;
    char chan[sizeof "dlock_fair__channel:" + sizeof ((struct redis_state *)0)->uuid];
    size_t chan_len;
};

static void fair_keys_free(struct fair_keys *f)
{
    dlock__redis_keys_free(&f->k);
}

/* The keys of lock NAME. */
static int fair_keys_make(struct redis_state *s, const char *name, struct fair_keys *f)
{
    f->chan_len = (size_t)snprintf(f->chan, sizeof f->chan, "dlock_fair__channel:%s", s->uuid);
    return dlock__redis_keys_make(s, name, &f->k);
}

bool dlock__redis_fair(const struct redis_state *s, const struct dlock__hold *h)
{
    return s->fair || h->fair;
}

/* A waiter's queue lease: ?queue_lease, else FAIR_QUEUE_LEASE_MS cut to
 * the lease LEASE_MS it asks for. */
static int64_t queue_lease_ms(const struct redis_state *s, int64_t lease_ms)
{
    if (s->fair_queue_lease_ms > 0)
        return s->fair_queue_lease_ms;
    return lease_ms > 0 && lease_ms < FAIR_QUEUE_LEASE_MS ? lease_ms : FAIR_QUEUE_LEASE_MS;
}

/* Run fair_lock.lua's OP with the lock's six keys, the owner and (for an
 * acquire) our channel first, then RQ's nargs arguments (NUL-terminated
 * strings, lens unused; retry_args for a retry, NULL: the same), within
 * RQ's deadline and, for an acquire, until its wait's cancel
 * (DLOCK_ECANCELED, the request in flight or not sent); what came of it
 * in rq->out. */
static int fair_eval(struct redis_state *s, const struct fair_keys *f, const char *owner,
                     const char *op, struct redis_request *rq)
{
    enum { NKEYS = 7, MAX = 20 };
    int n = rq->nargs;
    const char **args = rq->args, **retry_args = rq->retry_args;
    const char *a[MAX], *ra[MAX];
    size_t l[MAX], rl[MAX];
    const char *head[] = {f->k.lock,    f->k.token, f->k.canceled,
                          f->k.queue,   f->k.waiters, f->k.chan,
                          f->k.delay,   op,         owner,
                          strcmp(op, "acquire") == 0 ? f->chan : ""};
    size_t head_len[] = {f->k.lock_len,  f->k.token_len,   f->k.canceled_len, f->k.queue_len,
                         f->k.waiters_len, f->k.chan_len,  f->k.delay_len,    strlen(op),
                         strlen(owner),  0};
    int nh = (int)(sizeof head / sizeof head[0]);
    head_len[nh - 1] = strlen(head[nh - 1]);
    for (int i = 0; i < nh; i++) {
        a[i] = ra[i] = head[i];
        l[i] = rl[i] = head_len[i];
    }
    for (int i = 0; i < n; i++) {
        a[nh + i] = args[i];
        ra[nh + i] = retry_args ? retry_args[i] : args[i];
        l[nh + i] = strlen(a[nh + i]);
        rl[nh + i] = strlen(ra[nh + i]);
    }
    struct redis_request full = *rq;
    full.script = S_FAIR;
    full.nkeys = NKEYS;
    full.nargs = nh + n;
    full.args = a;
    full.lens = l;
    full.retry_args = ra;
    full.retry_lens = rl;
    int rc = dlock__redis_eval(s, &full);
    rq->out = full.out;
    return rc;
}

/* What the tries of one fair wait share: the id the latest try records
 * in our queue entry (a grant names it), and what the tries saw. */
struct fair_wait {
    const char *wait_id;
    int64_t ttl_ms; /* the holder's remaining lease */
    int64_t queued_at; /* the send time of the latest try that saw us queued */
    uint64_t last; /* the highest request number used (what a leave must cancel) */
};

/* One acquire attempt of a fair lock (the mutex's try_acquire, with the
 * queue) for wait W, at STAGE: DLOCK_OK (h->token set, the hold
 * confirmed), DLOCK_EBUSY with fw->ttl_ms and, when STAGE queues,
 * fw->queued_at; or a failure (DLOCK_ECANCELED: W's cancel cut the
 * request short). fw->last is set once a request number is taken. */
static int fair_try(struct redis_state *s, struct dlock__hold *h, const struct fair_keys *f,
                    const char *stage, struct dlock__wait *w, struct fair_wait *fw)
{
    /* the cancel owed and the acquire share one budget */
    int64_t deadline = dlock__time_budget(dlock__wait_deadline(w), s->op_timeout_ms);
    int rc = dlock__redis_cancel_owed(s, h, deadline, w);
    if (rc)
        return rc;
    char lease[24], first[24], second[24], life[24], qlease[24], delay[24];
    uint64_t n = __atomic_add_fetch(&s->requests, 2, __ATOMIC_RELAXED) - 1; /* n and n + 1 */
    fw->last = n + 1;
    snprintf(lease, sizeof lease, "%lld", (long long)h->lease_ms);
    snprintf(first, sizeof first, "%llu", (unsigned long long)n);
    snprintf(second, sizeof second, "%llu", (unsigned long long)n + 1);
    snprintf(life, sizeof life, "%lld", (long long)dlock__redis_cancel_life_ms(h->lease_ms));
    snprintf(qlease, sizeof qlease, "%lld", (long long)queue_lease_ms(s, h->lease_ms));
    snprintf(delay, sizeof delay, "%lld", (long long)s->c->opts.lock_delay_ms);
    const char *args[] = {lease, first, "0", life, qlease, stage, fw->wait_id, delay};
    const char *retry_args[] = {lease, second, first, life, qlease, stage, fw->wait_id, delay};
    struct redis_request rq = {.nargs = 8, .args = args, .retry_args = retry_args,
                               .what = "acquire", .wait = w, .deadline = deadline};
    rc = fair_eval(s, f, h->owner, "acquire", &rq);
    if ((rc == DLOCK_ECONN || rc == DLOCK_ECANCELED) && rq.out.reached)
        dlock__redis_cancel_lost_acquire(s, h, n + 1, h->lease_ms);
    if (rc)
        return rc;
    rc = dlock__redis_acquire_reply(s, h, &f->k, &rq, n + 1, &fw->ttl_ms);
    if (rc == DLOCK_EBUSY)
        fw->queued_at = rq.out.sent_ms;
    return rc;
}

/* The grant kept by the hub for wait WAIT_ID ("<wait id> <token>"): its
 * token in *TOKEN; false when none came. */
static bool grant_taken(struct redis_state *s, const struct fair_keys *f, const char *wait_id,
                        uint64_t *token)
{
    char msg[64], *end;
    if (!dlock__redis_hub_take(s, f->chan, f->chan_len, wait_id, msg, sizeof msg))
        return false;
    const char *t = msg + strlen(wait_id);
    unsigned long long v = strtoull(t, &end, 10);
    if (*t != ' ' || end == t + 1 || *end)
        return false;
    *token = v;
    return true;
}

int dlock__redis_fair_cancel(struct redis_state *s, const char *name, const char *owner,
                             uint64_t last, int64_t lease_ms, int64_t deadline,
                             struct dlock__wait *w)
{
    struct fair_keys f;
    int rc = fair_keys_make(s, name, &f);
    if (rc)
        return rc;
    char num[24], life[24];
    snprintf(num, sizeof num, "%llu", (unsigned long long)last);
    snprintf(life, sizeof life, "%lld", (long long)dlock__redis_cancel_life_ms(lease_ms));
    const char *args[] = {num, life};
    struct redis_request rq = {.nargs = 2, .args = args, .what = "leave the queue", .wait = w,
                               .deadline = deadline};
    rc = fair_eval(s, &f, owner, "leave", &rq);
    if (!rc) {
        long long n;
        const char *type_name;
        rc = dlock__redis_script_reply(s, rq.out.reply, &n, &type_name);
        freeReplyObject(rq.out.reply); /* a key of another type: nothing of ours to undo */
    }
    fair_keys_free(&f);
    return rc;
}

/* H's owner gives up its wait (timeout, cancel, a failure), which ends
 * at DEADLINE: leave the queue, canceling its requests up to LAST, within
 * what is left of the wait; when that is nothing (a timeout, a cancel:
 * dlock__redis_give_up_deadline) or the reply is lost, owe it (cancel.c queues it on the core's cleanup queue, which
 * the keeper drains at once). Keeps the caller's message. */
static void fair_give_up(struct redis_state *s, struct dlock__hold *h, uint64_t last,
                         int64_t deadline)
{
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    /* within what is left of the wait (nothing once it timed out or was
     * canceled): the
     * caller's wait_ms holds even when the server stalls; the keeper
     * sends what could not be sent by then */
    if (dlock__time_left(deadline, s->op_timeout_ms) == 0 ||
        dlock__redis_fair_cancel(s, h->name, h->owner, last, h->lease_ms, deadline, NULL) !=
            DLOCK_OK)
        dlock__redis_cancel_lost_acquire(s, h, last, h->lease_ms);
    dlock__errmsg_restore(DLOCK_OK, msg);
}

int dlock__redis_fair_acquire(struct redis_state *s, struct dlock__hold *h, struct dlock__wait *w)
{
    if (h->mode == DLOCK_SHARED)
        return dlock__err(DLOCK_ENOTSUP, "%s: lock '%s': a fair lock (layout=fair, "
                                         "DLOCK_LOCK_FAIR) queues exclusive holders only and has "
                                         "no shared mode; use the Redisson layout's read-write "
                                         "locks",
                          s->where, h->name);
    if (s->simple)
        return dlock__err(DLOCK_ENOTSUP, "%s: lock '%s': layout=simple (SET NX PX) keeps no "
                                         "queue of waiters (DLOCK_LOCK_FAIR); use the Redisson "
                                         "layout (the default) or layout=fair",
                          s->where, h->name);
    if (s->cluster)
        return dlock__err(DLOCK_ENOTSUP, "%s: lock '%s': a fair lock (DLOCK_LOCK_FAIR) sends "
                                         "its grants on a channel of each client, outside the "
                                         "lock's slot: not on a cluster",
                          s->where, h->name);
    struct fair_keys f;
    int rc = fair_keys_make(s, h->name, &f);
    if (rc)
        return rc;
    /* The id a grant message names: "<wait>.<try>", the wait's number and
     * that of its latest try (each try records it in our queue entry, so a
     * grant names the try that preceded it). A message naming an earlier
     * wait or an earlier try is not taken: a grant made before a try that
     * found us queued again (its lease ran out untold, or a lost reply's
     * retry passed it on) is no longer ours. Two buffers: the hub reads
     * the current one under its mutex while the next is written. */
    char ids[2][48];
    struct fair_wait fw = {.wait_id = ids[0]};
    unsigned long long wait_no = __atomic_add_fetch(&s->requests, 1, __ATOMIC_RELAXED);
    snprintf(ids[0], sizeof ids[0], "%llu.%llu", wait_no, wait_no);
    int64_t qlease = queue_lease_ms(s, h->lease_ms);
    bool once = dlock__wait_try_once(w);
    /* A wait listens before it queues: a grant may reach the hub before
     * the reply of the try that queued us. The channel is kept subscribed
     * once it was (one per client), so only a client's first wait sends a
     * SUBSCRIBE; until it is confirmed a grant may be missed, so the first
     * try after the confirmation looks for one. */
    if (!once && (rc = dlock__redis_hub_join_keyed(s, f.chan, f.chan_len, w, fw.wait_id)))
        goto out;
    /* and, quietly, on the lock's channel: a release that hands nothing
     * on (a force release, a client of another layout) wakes one waiter
     * of ours, whose try takes the lock or hands it to the queue's head */
    if (!once && (rc = dlock__redis_hub_join_quiet(s, f.k.chan, f.k.chan_len, w))) {
        dlock__redis_hub_leave(s, f.chan, f.chan_len, w, false);
        goto out;
    }
    bool subscribed = !once && dlock__redis_hub_subscribed(s, f.chan, f.chan_len);
    rc = fair_try(s, h, &f, once ? "0" : "1", w, &fw);
    if (once)
        goto out;
    if (rc != DLOCK_EBUSY)
        goto leave;

    /* Queued: sleep until the grant message, trying again only when the
     * subscription (re)starts (a grant may have been missed), and every
     * third of the queue lease (the refresh, and the holder's lease as a
     * safety net). */
    struct dlock__redis_outage outage = DLOCK__REDIS_OUTAGE_INIT;
    bool try_now = false;
    for (;;) {
        unsigned seq = dlock__wait_seq(w);
        uint64_t token;
        if (grant_taken(s, &f, fw.wait_id, &token)) {
            /* handed over: the grant names our latest try, so it ran
             * after that try (and after the last one that saw us queued):
             * its lease -- our queue lease only, all the releaser knew of
             * us -- runs at least from that try's sending; the keeper
             * extends it to ours at a third of it */
            dlock__redis_hub_ack(s, f.chan, f.chan_len, w);
            h->token = token;
            dlock__hold_confirmed_short(s->c, h, fw.queued_at,
                                        qlease < h->lease_ms ? qlease : h->lease_ms);
            rc = DLOCK_OK;
            break;
        }
        if (!subscribed && dlock__redis_hub_subscribed(s, f.chan, f.chan_len)) {
            subscribed = true;
            try_now = true;
        }
        if (try_now) {
            dlock__redis_hub_ack(s, f.chan, f.chan_len, w);
            dlock__redis_hub_ack(s, f.k.chan, f.k.chan_len, w);
            char *next = fw.wait_id == ids[0] ? ids[1] : ids[0];
            snprintf(next, sizeof ids[0], "%llu.%llu", wait_no,
                     (unsigned long long)__atomic_add_fetch(&s->requests, 1, __ATOMIC_RELAXED));
            dlock__redis_hub_rekey(s, f.chan, f.chan_len, w, next, fw.wait_id);
            fw.wait_id = next;
            rc = fair_try(s, h, &f, "2", w, &fw);
            if (rc == DLOCK_ECONN && !outage.ms &&
                dlock__time_left(dlock__wait_deadline(w), 1) == 0) {
                dlock__errmsg_save(outage.msg);
                rc = dlock__err(DLOCK_ETIMEDOUT, "%s: timed out waiting for lock '%s' (%s)",
                                s->where, f.k.lock, outage.msg);
                break;
            }
            if (!dlock__redis_outage_note(&outage, rc, true))
                break;
        }
        /* the safety net: the holder's lease, and our queue entry's refresh */
        int64_t nap = fw.ttl_ms >= 0 && fw.ttl_ms < qlease / 3 ? fw.ttl_ms : qlease / 3;
        rc = dlock__redis_wait_sleep(w, seq, nap, h->lease_ms, &outage, DLOCK_ECONN, s->where,
                                     f.k.lock);
        if (rc != DLOCK_OK)
            break;
        /* woken without a grant (a (re)subscription: one may have been
         * lost; a release on the lock's channel) or the nap ran out (the
         * refresh): try again */
        try_now = true;
    }
leave:
    dlock__redis_hub_leave(s, f.chan, f.chan_len, w, rc == DLOCK_OK);
    dlock__redis_hub_leave(s, f.k.chan, f.k.chan_len, w, rc == DLOCK_OK);
    uint64_t late;
    grant_taken(s, &f, fw.wait_id, &late); /* drop one kept after the last look: the leave passes it on */
    if (rc != DLOCK_OK && fw.last)
        fair_give_up(s, h, fw.last, dlock__redis_give_up_deadline(w, rc));
out:
    fair_keys_free(&f);
    return rc;
}

int dlock__redis_fair_queue(struct redis_state *s, const char *name, int64_t deadline,
                            redisReply **reply)
{
    struct fair_keys f;
    int rc = fair_keys_make(s, name, &f);
    if (rc)
        return rc;
    struct redis_request rq = {.what = "inspect the queue", .deadline = deadline};
    rc = fair_eval(s, &f, "", "waiters", &rq);
    *reply = rq.out.reply;
    fair_keys_free(&f);
    return rc;
}

int dlock__redis_fair_waiters(struct redis_state *s, const char *name, struct dlock_info *info)
{
    redisReply *r = NULL;
    int rc = dlock__redis_fair_queue(s, name, DLOCK__NEVER, &r);
    if (!rc && r->type == REDIS_REPLY_NIL && s->fair)
        info->nwaiters = 0; /* nobody queued; on another layout: not known */
    if (!rc && r->type == REDIS_REPLY_ARRAY) {
        info->nwaiters = 0;
        for (size_t i = 0; i < r->elements && !rc; i++)
            if (r->element[i]->type == REDIS_REPLY_STRING)
                rc = dlock__info_add_waiter(info, r->element[i]->str);
    }
    freeReplyObject(r); /* another reply: a key of another type, said by the lock's inspect */
    return rc;
}

int dlock__redis_fair_release(struct redis_state *s, struct dlock__hold *h)
{
    struct fair_keys f;
    int rc = fair_keys_make(s, h->name, &f);
    if (rc)
        return rc;
    char token[24], life[24];
    snprintf(token, sizeof token, "%llu", (unsigned long long)h->token);
    snprintf(life, sizeof life, "%lld", (long long)dlock__redis_cancel_life_ms(h->lease_ms));
    const char *args[] = {token, life};
    struct redis_request rq = {.nargs = 2, .args = args, .what = "release",
                               .deadline = DLOCK__NEVER};
    rc = fair_eval(s, &f, h->owner, "release", &rq);
    if (!rc) {
        rc = dlock__redis_release_reply(s, rq.out.reply, h->name, &f.k, h->token, rq.out.retried);
        freeReplyObject(rq.out.reply);
    }
    fair_keys_free(&f);
    return rc;
}
