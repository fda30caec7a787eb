/* contend.c -- the Redis backend's contended signal: a holder told when a
 * dlock waiter starts waiting for its lock (dlock_lock_on_contended()).
 *
 * The Redisson and simple layouts keep no queue, so waiters announce
 * themselves: a dlock waiter whose try is busy publishes "dlock-wait
 * <owner field>" (REDIS_WAIT_MSG) on the lock's own channel,
 * redisson_lock__channel:{N}, after its first try and after each later
 * one that lost to another owner (so a new holder hears those still
 * waiting). A fair lock (layout=fair, DLOCK_LOCK_FAIR) has a queue, and
 * the script that queues a waiter publishes the same message there
 * (fair_lock.lua): no request of its own. Redisson's clients ignore any
 * message there but its unlock messages, and dlock's hub wakes no waiter
 * for one. A holder that asked taps that channel on its client's
 * subscriber connection (hub.c): each announcement is a waiter (the core
 * tells each owner once), and any other message -- the release's "0"
 * among them -- is the moment to ask the core whether the hold still
 * stands, the tap ending when it does not. Since a waiter that announced
 * before the subscription took effect would go unheard, the watch waits
 * for the subscription's confirmation and then reads those waiting: the
 * fair queue, or the writers recorded in dlock_writers:{N} (where every
 * waiting dlock writer of the other layouts records itself: the Redisson
 * layout's for the read-write lock's fairness, the simple layout's for
 * this alone): one request as the acquire returns besides the SUBSCRIBE,
 * none per renewal. Waiters of other clients (Redisson's, other clients
 * of the simple recipe) announce nothing and are not seen. Redlock has
 * its own table (redlock.c), without this one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis.h"

/* One watched hold, the tap's argument (hub.c frees it). */
struct redis_contend {
    struct redis_state *s;
    const struct dlock__hold *h; /* identity only: the core matches it */
    uint64_t token;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* the subscription confirmed (CLOCK_MONOTONIC) */
    bool subscribed;
};

/* The tap: an announcement is a waiter; anything else asks whether the
 * hold still stands. Hub thread, hub mutex held. */
static bool contend_heard(void *arg, const char *msg, size_t len)
{
    struct redis_contend *k = arg;
    if (!msg) {
        pthread_mutex_lock(&k->mu);
        k->subscribed = true;
        pthread_cond_broadcast(&k->cv);
        pthread_mutex_unlock(&k->mu);
        return dlock__hold_contended(k->s->c, k->h, k->token, NULL);
    }
    size_t pl = strlen(REDIS_WAIT_MSG);
    char who[256];
    if (len <= pl || memcmp(msg, REDIS_WAIT_MSG, pl) != 0 || len - pl >= sizeof who)
        return dlock__hold_contended(k->s->c, k->h, k->token, NULL);
    memcpy(who, msg + pl, len - pl);
    who[len - pl] = 0;
    return dlock__hold_contended(k->s->c, k->h, k->token, who);
}

static void contend_free(void *arg)
{
    struct redis_contend *k = arg;
    pthread_cond_destroy(&k->cv);
    pthread_mutex_destroy(&k->mu);
    free(k);
}

/* Wait for K's subscription until DEADLINE: whether it came. */
static bool contend_subscribed(struct redis_contend *k, int64_t deadline)
{
    struct timespec ts = {(time_t)(deadline / 1000), (long)(deadline % 1000) * 1000000L};
    pthread_mutex_lock(&k->mu);
    while (!k->subscribed && pthread_cond_timedwait(&k->cv, &k->mu, &ts) == 0)
        ;
    bool yes = k->subscribed;
    pthread_mutex_unlock(&k->mu);
    return yes;
}

/* Tell the core of the waiters recorded for hold H by DEADLINE, H's own
 * owner aside: a fair lock's queue (fair.c), else the writers recorded
 * as waiting on keys K (the Redisson and simple layouts). */
static int contend_recorded(struct redis_state *s, const struct dlock__hold *h,
                            const struct lock_keys *k, int64_t deadline)
{
    const char *argv[] = {"ZRANGE", k->writers, "0", "-1"};
    redisReply *r = NULL;
    int rc = dlock__redis_fair(s, h)
                 ? dlock__redis_fair_queue(s, h->name, deadline, &r)
                 : dlock__redis_keyed_command(s, deadline, k->writers, 4, argv, "ZRANGE", &r);
    for (size_t i = 0; !rc && r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        const redisReply *e = r->element[i];
        if (e->type == REDIS_REPLY_STRING && strcmp(e->str, h->owner) != 0 &&
            !dlock__hold_contended(s->c, h, h->token, e->str))
            break;
    }
    freeReplyObject(r);
    return rc;
}

static int redis_contend_watch(void *state, struct dlock__hold *h)
{
    struct redis_state *s = state;
    struct lock_keys k;
    int rc = dlock__redis_keys_make(s, h->name, &k);
    if (rc)
        return rc;
    struct redis_contend *c = calloc(1, sizeof *c);
    if (!c) {
        dlock__redis_keys_free(&k);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    c->s = s;
    c->h = h;
    c->token = h->token;
    pthread_mutex_init(&c->mu, NULL);
    dlock__cond_init_monotonic(&c->cv);
    struct redis_tap tap = {.fn = contend_heard, .free = contend_free, .arg = c};
    int64_t deadline = dlock__time_budget(DLOCK__NEVER, s->op_timeout_ms);
    /* The tap stays until the hold is gone: C lives while H is pending. */
    rc = dlock__redis_hub_tap(s, k.chan, k.chan_len, &tap);
    if (!rc && !contend_subscribed(c, deadline))
        rc = dlock__err(DLOCK_ECONN,
                        "%s: lock '%s': the subscription to %s was not confirmed "
                        "in time: waiters that announced meanwhile go untold",
                        s->where, h->name, k.chan);
    if (!rc)
        rc = contend_recorded(s, h, &k, deadline);
    dlock__redis_keys_free(&k);
    return rc;
}

const struct dlock__contend_ops dlock__redis_contend_ops = {
    .watch = redis_contend_watch,
};

void dlock__redis_contend_announce(struct redis_state *s, const struct dlock__hold *h,
                                   const struct lock_keys *k, struct dlock__wait *w)
{
    if (dlock__redis_fair(s, h) || h->mode != DLOCK_EXCLUSIVE || dlock__wait_try_once(w))
        return;
    char msg[sizeof REDIS_WAIT_MSG + sizeof h->owner];
    snprintf(msg, sizeof msg, REDIS_WAIT_MSG "%s", h->owner);
    const char *argv[] = {dlock__redis_publish_command(s), k->chan, msg};
    redisReply *r = NULL;
    char kept[DLOCK__MSG_MAX];
    dlock__errmsg_save(kept);
    if (dlock__redis_keyed_command(s, dlock__wait_deadline(w), k->chan, 3, argv, "PUBLISH", &r))
        dlock__log(s->c, DLOCK_LOG_DEBUG, "%s: lock '%s': the announcement of a waiter failed: %s",
                   s->where, h->name, dlock_errmsg());
    dlock__errmsg_restore(DLOCK_OK, kept);
    freeReplyObject(r);
}
