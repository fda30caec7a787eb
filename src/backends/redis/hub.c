/* hub.c -- the Redis backend's subscriber hub: one connection and one
 * thread per client that turn release messages into wake-ups.
 *
 * A waiting thread does not poll: it joins the hub for the lock's channel
 * (redisson_lock__channel:{name}), and the hub thread, which owns the
 * subscriber connection shared by every waiting thread and every name,
 * subscribes while a channel has waiters and wakes one waiter per release
 * message (dlock__wait_wake()). A new subscription, a reconnection or a
 * wake that its waiter leaves unused wakes the others, so no release is
 * missed; the lock's TTL bounds each sleep as a safety net.
 *
 * A fair lock's waiters (fair.c) share one channel per client instead,
 * subscribed at their first wait and kept: each grant message there names
 * one wait ("<wait id> <token>"), wakes only that waiter and is kept for
 * it (dlock__redis_hub_take), so a hand-off costs no subscription. They
 * also listen, quietly, on the lock's own channel: a release there (a
 * force release, a client of another layout) wakes one of them to try,
 * which takes the lock or hands it to the queue's head; the subscription
 * starting does not wake them (their grant channel's does); such a
 * channel stays subscribed a while after its last waiter left
 * (HUB_LINGER_MS), since fair waits on one name tend to follow each other.
 *
 * A holder told of its waiters (contend.c) taps the lock's channel
 * (dlock__redis_hub_tap): its tap is called, on the hub thread, when the
 * subscription is confirmed and with every message, and a waiter's
 * announcement there (REDIS_WAIT_MSG, "dlock-wait <owner>") goes to the
 * taps alone, waking no waiter. A tap counts as a waiter of the channel
 * until it answers false.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "redis.h"

/* A channel fair waiters listened on quietly stays subscribed this long
 * after its last waiter left (give or take the hub's one-second tick): a
 * fair lock waited on back to back -- every wait, under contention --
 * then costs no SUBSCRIBE/UNSUBSCRIBE pair per wait. */
#define HUB_LINGER_MS 1000

/* A tap on a channel (dlock__redis_hub_tap). */
struct hub_tap {
    struct redis_tap tap;
    struct hub_tap *next;
};

/* A message kept for the wait it names (a fair lock's grant). */
struct hub_grant {
    struct hub_grant *next;
    char key[48]; /* the message's first word: the wait id */
    char msg[64];
};

/* One channel of the subscriber connection. Its waiters are a core
 * waitset (FIFO, a wake passed on by a waiter that leaves without using
 * it); nwaiters, under the hub mutex, drives the subscription. */
struct hub_chan {
    char *name;
    size_t len;
    unsigned nwaiters;
    bool subscribed; /* as the server last confirmed */
    bool sub_sent, unsub_sent;
    bool dirty; /* on the hub's to-do list */
    bool keyed; /* messages name their waiter (dlock__redis_hub_join_keyed);
                   counted once in nwaiters, so it stays subscribed */
    bool lingers;          /* joined quietly once: HUB_LINGER_MS */
    int64_t unwanted_since; /* when nwaiters last fell to 0 */
    struct hub_grant *grants; /* keyed: messages not yet taken */
    struct hub_tap *taps;     /* holders told of its messages (contend.c) */
    int conn;   /* the connection subscribed on (a cluster: the master's index), -1 none */
    struct dlock__waitset waiters;
    struct dlock__waitset heads; /* joined by dlock__redis_hub_join_head() */
    struct dlock__waitset quiet; /* joined by dlock__redis_hub_join_quiet() */
    struct hub_chan *next;  /* bucket chain */
    struct hub_chan *dnext; /* to-do list */
};

static unsigned hub_hash(const char *p, size_t len)
{
    unsigned h = 2166136261u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)p[i]) * 16777619u;
    return h % REDIS_HUB_BUCKETS;
}

static struct hub_chan *hub_find(struct hub *hb, const char *name, size_t len)
{
    for (struct hub_chan *ch = hb->buckets[hub_hash(name, len)]; ch; ch = ch->next)
        if (ch->len == len && memcmp(ch->name, name, len) == 0)
            return ch;
    return NULL;
}

static void hub_kick(struct hub *hb)
{
    uint64_t one = 1;
    if (write(hb->efd, &one, sizeof one) < 0) {
        /* the counter is saturated: the thread is awake anyway */
    }
}

/* Put CH on the to-do list (hub mutex held). */
static void hub_mark(struct hub *hb, struct hub_chan *ch)
{
    if (ch->dirty)
        return;
    ch->dirty = true;
    ch->dnext = hb->todo;
    hb->todo = ch;
    hub_kick(hb);
}

/* Wake every waiter of CH: the subscription just started or restarted, so
 * any of them may have missed a release. */
static void hub_wake_chan(struct hub_chan *ch)
{
    dlock__waitset_wake_all(&ch->waiters);
    dlock__waitset_wake_all(&ch->heads);
}

/* A release message: wake the longest-waiting waiter that is not already
 * woken, so one release costs one try per client, not a herd (Redisson's
 * semaphore does the same). A woken waiter that leaves without the lock
 * passes the wake on (hub_leave), so none is lost. */
static void hub_wake_one(struct hub_chan *ch)
{
    dlock__waitset_wake_one(&ch->waiters);
}

static void hub_free_chan(struct hub *hb, struct hub_chan *ch)
{
    struct hub_chan **pp = &hb->buckets[hub_hash(ch->name, ch->len)];
    while (*pp && *pp != ch)
        pp = &(*pp)->next;
    if (*pp)
        *pp = ch->next;
    dlock__waitset_destroy(&ch->waiters);
    while (ch->grants) {
        struct hub_grant *g = ch->grants;
        ch->grants = g->next;
        free(g);
    }
    while (ch->taps) {
        struct hub_tap *t = ch->taps;
        ch->taps = t->next;
        t->tap.free(t->tap.arg);
        free(t);
    }
    dlock__waitset_destroy(&ch->heads);
    dlock__waitset_destroy(&ch->quiet);
    free(ch->name);
    free(ch);
}

/* Tell CH's taps of message MSG (LEN bytes; NULL: the subscription
 * confirmed), dropping those that answer false (hub mutex held). */
static void hub_tell_taps(struct hub *hb, struct hub_chan *ch, const char *msg, size_t len)
{
    for (struct hub_tap **p = &ch->taps, *t; (t = *p);) {
        if (t->tap.fn(t->tap.arg, msg, len)) {
            p = &t->next;
            continue;
        }
        *p = t->next;
        t->tap.free(t->tap.arg);
        free(t);
        if (--ch->nwaiters == 0) {
            ch->unwanted_since = dlock__now_ms();
            hub_mark(hb, ch);
        }
    }
}

/* A message M on keyed channel CH: wake the waiter it names and keep it
 * for that waiter; one naming no waiter here (a wait that left) is
 * dropped. */
static void hub_keep_grant(struct hub_chan *ch, const redisReply *m)
{
    struct hub_grant g = {0};
    if (m->type != REDIS_REPLY_STRING || m->len >= sizeof g.msg)
        return;
    memcpy(g.msg, m->str, m->len);
    size_t kl = strcspn(g.msg, " ");
    if (kl >= sizeof g.key)
        return;
    memcpy(g.key, g.msg, kl);
    if (dlock__waitset_wake_key(&ch->waiters, g.key) == 0)
        return;
    struct hub_grant *kept = malloc(sizeof *kept);
    if (!kept)
        return; /* the waiter, woken, tries: its try finds the grant */
    *kept = g;
    kept->next = ch->grants;
    ch->grants = kept;
}

/* Handle one reply on the subscriber connection (hub mutex held). A
 * cluster's sharded pub/sub says smessage, ssubscribe, sunsubscribe. */
static void hub_on_reply(struct redis_state *s, struct hub *hb, const redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING)
        return;
    const char *kind = r->element[0]->str;
    if (s->cluster && (!strcmp(kind, "smessage") || !strcmp(kind, "ssubscribe") ||
                       !strcmp(kind, "sunsubscribe")))
        kind++;
    struct hub_chan *ch = hub_find(hb, r->element[1]->str, r->element[1]->len);
    if (!ch)
        return;
    if (s->cluster && strcmp(kind, "unsubscribe") == 0 && !ch->unsub_sent)
        dlock__redis_cluster_stale(s); /* the master gave the channel's slot away */
    if (strcmp(kind, "message") == 0) {
        const redisReply *m = r->element[2];
        bool string = m->type == REDIS_REPLY_STRING;
        hub_tell_taps(hb, ch, string ? m->str : "", string ? m->len : 0);
        if (string && m->len >= strlen(REDIS_WAIT_MSG) &&
            memcmp(m->str, REDIS_WAIT_MSG, strlen(REDIS_WAIT_MSG)) == 0)
            return; /* a waiter's announcement, for the taps alone */
        if (ch->keyed)
            hub_keep_grant(ch, m);
        else if (m->type == REDIS_REPLY_STRING && m->len == 1 && m->str[0] == '1')
            dlock__waitset_wake_all(&ch->waiters); /* READ_UNLOCK_MESSAGE: every reader may enter */
        else
            hub_wake_one(ch);
        dlock__waitset_wake_head(&ch->heads); /* whatever it says, one */
        if (!ch->keyed)
            dlock__waitset_wake_one(&ch->quiet);
    } else if (strcmp(kind, "subscribe") == 0) {
        ch->subscribed = true;
        ch->sub_sent = false;
        hub_wake_chan(ch); /* waiters that tried before this may have missed a release */
        hub_tell_taps(hb, ch, NULL, 0);
        if (ch->nwaiters == 0)
            hub_mark(hb, ch);
    } else if (strcmp(kind, "unsubscribe") == 0) {
        ch->subscribed = false;
        ch->unsub_sent = false;
        ch->conn = -1;
        if (ch->nwaiters > 0)
            hub_mark(hb, ch);
        else if (!ch->dirty && !ch->sub_sent)
            hub_free_chan(hb, ch);
    }
}

/* Connection CONN lost: forget what the server knew of its channels,
 * resubscribe what is wanted, and wake every waiter there so it tries
 * again (messages may have been lost). */
static void hub_on_disconnect(struct hub *hb, int conn)
{
    for (size_t b = 0; b < REDIS_HUB_BUCKETS; b++) {
        for (struct hub_chan *ch = hb->buckets[b], *next; ch; ch = next) {
            next = ch->next;
            if (ch->conn != conn)
                continue;
            ch->subscribed = ch->sub_sent = ch->unsub_sent = false;
            ch->conn = -1;
            if (ch->nwaiters == 0 && !ch->dirty) {
                hub_free_chan(hb, ch);
                continue;
            }
            hub_wake_chan(ch);
            hub_mark(hb, ch);
        }
    }
}

/* One subscriber connection: to the server, or to one cluster master. */
struct hub_conn {
    struct rconn *k;
    bool wanted; /* a channel waits for it (the server's: always) */
    int64_t next_dial;
    struct dlock__backoff backoff;
};

/* Append SUBSCRIBE/UNSUBSCRIBE for the to-do list (hub mutex held), on
 * the connection of each channel: a cluster's on the master of its slot
 * (SSUBSCRIBE: sharded pub/sub). A channel whose connection is not up
 * stays on the list, its connection wanted. */
static void hub_flush_todo(struct redis_state *s, struct hub *hb, struct hub_conn *hc)
{
    struct hub_chan *ch = hb->todo, *later = NULL;
    hb->todo = NULL;
    int64_t now = dlock__now_ms();
    while (ch) {
        struct hub_chan *next = ch->dnext;
        ch->dirty = false;
        const char *argv[2];
        size_t argl[2] = {0, ch->len};
        argv[1] = ch->name;
        if (ch->nwaiters > 0 && (!ch->subscribed || ch->unsub_sent) && !ch->sub_sent) {
            int conn = s->cluster ? dlock__redis_cluster_owner(s, ch->name, ch->len) : 0;
            if (ch->unsub_sent) {
                /* re-subscribe once the unsubscribe is confirmed */
            } else if (conn < 0 || !hc[conn].k) {
                if (conn >= 0)
                    hc[conn].wanted = true;
                ch->dirty = true; /* once the master is known and reached */
                ch->dnext = later;
                later = ch;
            } else {
                argv[0] = s->cluster ? "SSUBSCRIBE" : "SUBSCRIBE";
                argl[0] = strlen(argv[0]);
                dlock__redis_conn_append(hc[conn].k, 2, argv, argl);
                ch->sub_sent = true;
                ch->conn = conn;
            }
        } else if (ch->nwaiters == 0 && ch->subscribed && !ch->unsub_sent && !ch->sub_sent &&
                   ch->lingers && now - ch->unwanted_since < HUB_LINGER_MS) {
            ch->dirty = true; /* looked at again on a later pass */
            ch->dnext = later;
            later = ch;
        } else if (ch->nwaiters == 0 && ch->subscribed && !ch->unsub_sent && !ch->sub_sent &&
                   ch->conn >= 0 && hc[ch->conn].k) {
            argv[0] = s->cluster ? "SUNSUBSCRIBE" : "UNSUBSCRIBE";
            argl[0] = strlen(argv[0]);
            dlock__redis_conn_append(hc[ch->conn].k, 2, argv, argl);
            ch->unsub_sent = true;
        } else if (ch->nwaiters == 0 && !ch->subscribed && !ch->sub_sent && !ch->unsub_sent) {
            hub_free_chan(hb, ch);
        }
        ch = next;
    }
    hb->todo = later;
}

static void *hub_main(void *arg)
{
    struct redis_state *s = arg;
    struct hub *hb = &s->hub;
    /* one connection to the server, or one per cluster master */
    size_t nc = s->cluster ? REDIS_CLUSTER_MAX_NODES : 1;
    struct hub_conn *hc = hb->conns;
    for (size_t i = 0; i < nc; i++)
        hc[i].backoff = (struct dlock__backoff){.min_ms = REDIS_BACKOFF_MIN_MS,
                                                .max_ms = REDIS_BACKOFF_MAX_MS};
    hc[0].wanted = !s->cluster;
    struct pollfd p[2 + REDIS_CLUSTER_MAX_NODES];
    int at[2 + REDIS_CLUSTER_MAX_NODES]; /* p[j] is hc[at[j]]'s */
    struct rconn *watch = NULL; /* Sentinel: +switch-master (sentinel.c) */
    int64_t next_watch = 0;

    pthread_mutex_lock(&hb->mu);
    while (!hb->stop) {
        if (s->cluster) { /* a slot moved, a master failed: the map first */
            pthread_mutex_unlock(&hb->mu);
            dlock__redis_cluster_refresh_stale(s);
            pthread_mutex_lock(&hb->mu);
        }
        int64_t timeout = 1000;
        for (size_t i = 0; i < nc; i++) {
            if (!hc[i].wanted || hc[i].k)
                continue;
            int64_t now = dlock__now_ms();
            if (now < hc[i].next_dial) {
                timeout = hc[i].next_dial - now < timeout ? hc[i].next_dial - now : timeout;
                continue;
            }
            pthread_mutex_unlock(&hb->mu);
            struct rconn *k;
            int rc = s->cluster ? dlock__redis_cluster_dial_node(s, (int)i, DLOCK__NEVER, &k)
                                : dlock__redis_dial(s, false, DLOCK__NEVER, NULL, &k);
            pthread_mutex_lock(&hb->mu);
            if (rc) {
                hc[i].next_dial = dlock__now_ms() + dlock__backoff_next(&hc[i].backoff);
                dlock__redis_cluster_stale(s); /* a master gone: who serves its slots now? */
                timeout = 0;
            } else {
                dlock__backoff_reset(&hc[i].backoff);
                hc[i].k = k;
                /* everything wanted is marked dirty by hub_on_disconnect */
                for (size_t b = 0; b < REDIS_HUB_BUCKETS; b++)
                    for (struct hub_chan *ch = hb->buckets[b]; ch; ch = ch->next)
                        if (ch->nwaiters > 0 && !ch->subscribed && !ch->sub_sent)
                            hub_mark(hb, ch);
            }
        }
        hub_flush_todo(s, hb, hc);
        if (hb->todo && timeout > 50)
            timeout = 50; /* channels whose master is not known yet */
        pthread_mutex_unlock(&hb->mu);
        if (s->sentinel && !watch && dlock__now_ms() >= next_watch) {
            watch = dlock__redis_sentinel_watch(s);
            next_watch = dlock__now_ms() + REDIS_BACKOFF_MAX_MS;
        }

        /* The subscriber's replies are pushed, never owed: only what it
         * writes is waited for, in the same poll as the wake-ups. */
        size_t np = 2;
        bool broken = false;
        p[0] = (struct pollfd){.fd = s->hub.efd, .events = POLLIN};
        p[1] = (struct pollfd){.fd = -1};
        if (watch) {
            p[1].fd = watch->fd;
            p[1].events = dlock__redis_conn_events(watch);
        }
        for (size_t i = 0; i < nc; i++) {
            struct rconn *k = hc[i].k;
            if (!k)
                continue;
            k->want = 0;
            dlock__redis_conn_pump(k, 0);
            broken |= k->broken;
            if (k->ngot > 0)
                timeout = 0; /* replies already read: take them now */
            p[np] = (struct pollfd){.fd = k->fd, .events = dlock__redis_conn_events(k)};
            at[np++] = (int)i;
        }
        if (!broken && poll(p, (nfds_t)np, (int)timeout) > 0) {
            if (watch && p[1].revents) {
                dlock__redis_conn_pump(watch, p[1].revents);
                if (dlock__redis_sentinel_switched(s, watch) && hc[0].k)
                    dlock__redis_conn_fail(hc[0].k, "the master moved"); /* subscribed to the old one */
                if (watch->broken) {
                    dlock__redis_conn_free(watch);
                    watch = NULL;
                }
            }
            if (p[0].revents & POLLIN) {
                uint64_t v;
                if (read(s->hub.efd, &v, sizeof v) < 0) {
                    /* nothing to drain */
                }
            }
            for (size_t j = 2; j < np; j++)
                if (p[j].revents)
                    dlock__redis_conn_pump(hc[at[j]].k, p[j].revents);
        }
        pthread_mutex_lock(&hb->mu);
        for (size_t i = 0; i < nc; i++) {
            struct rconn *k = hc[i].k;
            if (!k)
                continue;
            redisReply *reply;
            while ((reply = dlock__redis_conn_take(k))) {
                /* a cluster master refusing SSUBSCRIBE (MOVED: the map
                 * was stale): resubscribe its channels where they are */
                if (s->cluster && reply->type == REDIS_REPLY_ERROR) {
                    dlock__redis_server_error(s, reply->str, "SSUBSCRIBE"); /* marks the map stale */
                    dlock__redis_conn_fail(k, "%s", reply->str);
                }
                hub_on_reply(s, hb, reply);
                freeReplyObject(reply);
            }
            if (k->broken) {
                dlock__redis_conn_free(k);
                hc[i].k = NULL;
                dlock__redis_sentinel_stale(s); /* Sentinel: a failover closes subscribers too */
                dlock__redis_cluster_stale(s);
                hub_on_disconnect(hb, (int)i);
                hc[i].next_dial = dlock__now_ms() + dlock__backoff_next(&hc[i].backoff);
            }
        }
    }
    pthread_mutex_unlock(&hb->mu);
    for (size_t i = 0; i < nc; i++)
        dlock__redis_conn_free(hc[i].k);
    dlock__redis_conn_free(watch);
    return NULL;
}

/* Start the hub thread unless it runs (hub mutex held). */
static int hub_start_locked(struct redis_state *s)
{
    struct hub *hb = &s->hub;
    if (hb->started)
        return DLOCK_OK;
    if (!hb->conns && !(hb->conns = calloc(s->cluster ? REDIS_CLUSTER_MAX_NODES : 1,
                                           sizeof *hb->conns)))
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    int err = pthread_create(&hb->thread, NULL, hub_main, s);
    if (err)
        return dlock__errno(DLOCK_EIO, err, "%s: cannot start the subscriber thread", s->where);
    hb->started = true;
    return DLOCK_OK;
}

int dlock__redis_hub_start(struct redis_state *s)
{
    pthread_mutex_lock(&s->hub.mu);
    int rc = hub_start_locked(s);
    pthread_mutex_unlock(&s->hub.mu);
    return rc;
}

/* Channel CHAN (LEN bytes), made if it is new (hub mutex held); NULL:
 * out of memory. */
static struct hub_chan *hub_chan_get(struct hub *hb, const char *chan, size_t len)
{
    struct hub_chan *ch = hub_find(hb, chan, len);
    if (ch)
        return ch;
    ch = calloc(1, sizeof *ch);
    if (ch)
        ch->name = malloc(len + 1);
    if (!ch || !ch->name) {
        free(ch);
        return NULL;
    }
    dlock__waitset_init(&ch->waiters);
    dlock__waitset_init(&ch->heads);
    dlock__waitset_init(&ch->quiet);
    ch->conn = -1;
    memcpy(ch->name, chan, len);
    ch->name[len] = 0;
    ch->len = len;
    unsigned b = hub_hash(chan, len);
    ch->next = hb->buckets[b];
    hb->buckets[b] = ch;
    return ch;
}

/* Register W as a waiter on CHAN (in WAITERS, HEADS or QUIET as KIND
 * says, with KEY when not NULL), subscribing when it is the first. */
enum hub_kind { HUB_WAITERS, HUB_HEADS, HUB_QUIET };
static int hub_join(struct redis_state *s, const char *chan, size_t len, struct dlock__wait *w,
                    const char *key, enum hub_kind kind)
{
    struct hub *hb = &s->hub;
    pthread_mutex_lock(&hb->mu);
    int rc = hub_start_locked(s);
    if (rc) {
        pthread_mutex_unlock(&hb->mu);
        return rc;
    }
    struct hub_chan *ch = hub_chan_get(hb, chan, len);
    if (!ch) {
        pthread_mutex_unlock(&hb->mu);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    rc = dlock__waitset_add(kind == HUB_HEADS   ? &ch->heads
                            : kind == HUB_QUIET ? &ch->quiet
                                                : &ch->waiters,
                            w);
    if (rc) {
        if (ch->nwaiters == 0)
            hub_mark(hb, ch); /* freed by the hub thread once unwanted */
        pthread_mutex_unlock(&hb->mu);
        return rc;
    }
    if (kind == HUB_QUIET)
        ch->lingers = true;
    if (key) {
        dlock__waitset_set_key(&ch->waiters, w, key);
        if (!ch->keyed) {
            ch->keyed = true;
            ch->nwaiters++; /* kept subscribed from now on */
        }
    }
    if (ch->nwaiters++ == 0 || !ch->subscribed || ch->unsub_sent)
        hub_mark(hb, ch);
    pthread_mutex_unlock(&hb->mu);
    return DLOCK_OK;
}

int dlock__redis_hub_join_keyed(struct redis_state *s, const char *chan, size_t len,
                                struct dlock__wait *w, const char *key)
{
    return hub_join(s, chan, len, w, key, HUB_WAITERS);
}

int dlock__redis_hub_join(struct redis_state *s, const char *chan, size_t len, struct dlock__wait *w)
{
    return hub_join(s, chan, len, w, NULL, HUB_WAITERS);
}

int dlock__redis_hub_join_quiet(struct redis_state *s, const char *chan, size_t len,
                                struct dlock__wait *w)
{
    return hub_join(s, chan, len, w, NULL, HUB_QUIET);
}

int dlock__redis_hub_join_head(struct redis_state *s, const char *chan, size_t len,
                               struct dlock__wait *w)
{
    return hub_join(s, chan, len, w, NULL, HUB_HEADS);
}

int dlock__redis_hub_tap(struct redis_state *s, const char *chan, size_t len,
                        const struct redis_tap *tap)
{
    struct hub *hb = &s->hub;
    struct hub_tap *t = malloc(sizeof *t);
    pthread_mutex_lock(&hb->mu);
    int rc = t ? hub_start_locked(s) : dlock__err(DLOCK_ENOMEM, "out of memory");
    struct hub_chan *ch = rc ? NULL : hub_chan_get(hb, chan, len);
    if (!ch) {
        pthread_mutex_unlock(&hb->mu);
        free(t);
        tap->free(tap->arg);
        return rc ? rc : dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    t->tap = *tap;
    t->next = ch->taps;
    ch->taps = t;
    if (ch->nwaiters++ == 0 || !ch->subscribed || ch->unsub_sent)
        hub_mark(hb, ch);
    if (ch->subscribed && !ch->unsub_sent)
        t->tap.fn(t->tap.arg, NULL, 0); /* subscribed already (a lingering channel) */
    pthread_mutex_unlock(&hb->mu);
    return DLOCK_OK;
}

/* Whether messages on CHAN reach us now. */
bool dlock__redis_hub_subscribed(struct redis_state *s, const char *chan, size_t len)
{
    pthread_mutex_lock(&s->hub.mu);
    struct hub_chan *ch = hub_find(&s->hub, chan, len);
    bool yes = ch && ch->subscribed && !ch->unsub_sent;
    pthread_mutex_unlock(&s->hub.mu);
    return yes;
}

/* W is about to try: a wake it received is being used now. */
void dlock__redis_hub_ack(struct redis_state *s, const char *chan, size_t len, struct dlock__wait *w)
{
    struct hub *hb = &s->hub;
    pthread_mutex_lock(&hb->mu);
    struct hub_chan *ch = hub_find(hb, chan, len);
    if (ch) {
        dlock__waitset_consume(&ch->waiters, w);
        dlock__waitset_consume(&ch->heads, w);
        dlock__waitset_consume(&ch->quiet, w);
    }
    pthread_mutex_unlock(&hb->mu);
}

/* W's try after a release message was busy, though a waiter behind it
 * might not be (it wants fewer of a semaphore's permits): wake the next. */
void dlock__redis_hub_pass(struct redis_state *s, const char *chan, size_t len,
                           const struct dlock__wait *w)
{
    struct hub *hb = &s->hub;
    pthread_mutex_lock(&hb->mu);
    struct hub_chan *ch = hub_find(hb, chan, len);
    if (ch)
        dlock__waitset_wake_after(&ch->waiters, w);
    pthread_mutex_unlock(&hb->mu);
}

size_t dlock__redis_hub_take(struct redis_state *s, const char *chan, size_t len, const char *key,
                             char *buf, size_t size)
{
    struct hub *hb = &s->hub;
    size_t n = 0;
    pthread_mutex_lock(&hb->mu);
    struct hub_chan *ch = hub_find(hb, chan, len);
    for (struct hub_grant **p = ch ? &ch->grants : NULL; p && *p; p = &(*p)->next) {
        struct hub_grant *g = *p;
        if (strcmp(g->key, key) != 0)
            continue;
        n = strlen(g->msg);
        if (n < size) {
            memcpy(buf, g->msg, n + 1);
        } else {
            n = 0;
        }
        *p = g->next;
        free(g);
        break;
    }
    pthread_mutex_unlock(&hb->mu);
    return n;
}

void dlock__redis_hub_rekey(struct redis_state *s, const char *chan, size_t len,
                            struct dlock__wait *w, const char *key, const char *old)
{
    struct hub *hb = &s->hub;
    pthread_mutex_lock(&hb->mu);
    struct hub_chan *ch = hub_find(hb, chan, len);
    if (ch) {
        dlock__waitset_set_key(&ch->waiters, w, key);
        for (struct hub_grant **p = &ch->grants; *p;) {
            struct hub_grant *g = *p;
            if (strcmp(g->key, old) == 0) {
                *p = g->next;
                free(g);
            } else {
                p = &g->next;
            }
        }
    }
    pthread_mutex_unlock(&hb->mu);
}

/* W stops waiting on CHAN. If it was woken and leaves without the lock
 * (timed out, canceled, failed), the wake goes to the next waiter. */
void dlock__redis_hub_leave(struct redis_state *s, const char *chan, size_t len, struct dlock__wait *w,
                      bool acquired)
{
    struct hub *hb = &s->hub;
    pthread_mutex_lock(&hb->mu);
    struct hub_chan *ch = hub_find(hb, chan, len);
    if (ch) {
        /* a keyed channel's wakes each name their waiter: none to pass on */
        if (dlock__waitset_remove(&ch->waiters, w) && !acquired && !ch->keyed)
            hub_wake_one(ch);
        if (dlock__waitset_remove(&ch->heads, w) && !acquired)
            dlock__waitset_wake_one(&ch->heads);
        if (dlock__waitset_remove(&ch->quiet, w) && !acquired)
            dlock__waitset_wake_one(&ch->quiet);
        ch->nwaiters--;
        if (ch->nwaiters == 0) {
            ch->unwanted_since = dlock__now_ms();
            hub_mark(hb, ch);
        }
    }
    pthread_mutex_unlock(&hb->mu);
}

void dlock__redis_hub_stop(struct redis_state *s)
{
    struct hub *hb = &s->hub;
    pthread_mutex_lock(&hb->mu);
    bool started = hb->started;
    hb->stop = true;
    hub_kick(hb);
    pthread_mutex_unlock(&hb->mu);
    if (started)
        pthread_join(hb->thread, NULL);
    for (size_t b = 0; b < REDIS_HUB_BUCKETS; b++) {
        while (hb->buckets[b]) {
            hub_free_chan(hb, hb->buckets[b]);
        }
    }
    free(hb->conns);
    hb->conns = NULL;
}

/* ====================================================== a waiter's sleep */

bool dlock__redis_outage_note(struct dlock__redis_outage *o, int rc, bool unavail_too)
{
    if (rc == DLOCK_ECONN || (unavail_too && rc == DLOCK_EUNAVAIL)) {
        dlock__errmsg_save(o->msg);
        o->ms = dlock__backoff_next(&o->backoff);
        return true;
    }
    if (rc != DLOCK_EBUSY)
        return false;
    dlock__backoff_reset(&o->backoff);
    o->ms = 0;
    return true;
}

int64_t dlock__redis_try_again_at(int64_t ttl_ms, int64_t lease_ms, int64_t outage_ms)
{
    int64_t now = dlock__now_ms();
    if (outage_ms > 0)
        return now + outage_ms;
    if (ttl_ms == -1)
        return now + lease_ms; /* a foreign lock without expiry */
    if (ttl_ms < 0)
        return now; /* vanished between the two calls: try at once */
    /* PTTL rounds down; 0 = expiring now; an absurd TTL is clamped */
    return now + (ttl_ms < DLOCK__MAX_DURATION_MS ? ttl_ms : DLOCK__MAX_DURATION_MS) + 1;
}

int dlock__redis_wait_sleep(struct dlock__wait *w, unsigned seq, int64_t ttl_ms, int64_t lease_ms,
                            const struct dlock__redis_outage *o, int outage_rc, const char *where,
                            const char *key)
{
    int64_t outage_ms = o ? o->ms : 0;
    int rc = dlock__wait_sleep(w, seq, dlock__redis_try_again_at(ttl_ms, lease_ms, outage_ms));
    if (rc == DLOCK_ETIMEDOUT && outage_ms > 0)
        return dlock__err(outage_rc, "%s (still failing when the wait for '%s' ended)", o->msg,
                          key);
    if (rc == DLOCK_ETIMEDOUT)
        return dlock__err(DLOCK_ETIMEDOUT, "%s: timed out waiting for lock '%s'", where, key);
    return rc;
}

int64_t dlock__redis_give_up_deadline(const struct dlock__wait *w, int rc)
{
    return rc == DLOCK_ECANCELED ? dlock__now_ms() : dlock__wait_deadline(w);
}
