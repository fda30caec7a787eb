/* watch.c -- the etcd backend's watches: long-lived streaming requests
 * (POST /v3/watch), all driven by one thread per client around a curl
 * multi handle.
 *
 * A lock's waiters share one: the client's stream of deletions under its
 * key prefix (struct etcd_hub), opened while waiters are registered on
 * it. A waiter's watch of the key before its own is a registration in a
 * table by key -- a few hundred bytes, not a connection, a curl handle
 * and a gRPC stream each: 10,000 parked waiters cost 10,000 of those
 * otherwise (the gateway serves one watch per HTTP request, and Go's
 * HTTP/1 server may stop reading a request's body once its answer has
 * begun, so watches cannot be added to a stream already open). Each
 * deletion the stream tells fires the registrations on its key; the
 * stream starts at the oldest revision a registration needs, and one
 * that registers after the stream has told a later deletion fires at
 * once (its key's deletion may have gone by: it looks again). The end of
 * the stream -- cut, refused, compacted, canceled, never confirmed --
 * fires every registration and the stream starts again with backoff.
 *
 * Other watches (a reader's, which a downgrade's put fires too; an
 * election's; a semaphore's) are requests of their own. The thread wakes
 * their waiter (dlock__wait_wake) when etcd confirms the watch, when the
 * watched key is deleted (or, for a reader's watch, made shared: a
 * downgrade) and when the stream ends; the waiter then looks again.
 *
 * A tapped watch (dlock__etcd_watch_tap: a holder's watch for waiters,
 * contend.c) has no waiter: its tap is told each event of the stream, on
 * the watch thread, and the watch ends -- freed by the thread, the tap's
 * argument with it -- when the tap says so, when etcd cancels it or when
 * the stream ends.
 */
#include "etcd.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HUB_FIRST_BUCKETS 64     /* the registrations' table, grown x4 past 2 a bucket */
#define HUB_LINGER_MS 5000       /* the shared stream outlives its last registration so long */
#define HUB_CREATE_MS 10000      /* a stream etcd has not confirmed by then starts again (an
                                    auth token that expired on the way leaves it hanging) */
#define HUB_BACKOFF_FIRST_MS 100 /* after the stream ended, doubling up to */
#define HUB_BACKOFF_MAX_MS 2000

static void hub_fire_all(struct etcd_conn *k, const char *bad, const char *endpoint);

/* Mark WT fired and wake its waiter (wmu held); a tapped watch ends; the
 * end of the shared stream fires every registration. */
static void watch_fire(struct etcd_watch *wt)
{
    if (wt->fired)
        return;
    wt->fired = true;
    if (wt->hub)
        hub_fire_all(wt->k, wt->bad, wt->endpoint);
    else if (wt->tap)
        wt->stopped = true; /* the thread frees it on its next turn */
    else if (!wt->stopped)
        dlock__wait_wake(wt->w);
}

/* ------------------------------------------------------ the shared stream */

static size_t hub_hash(const char *key, size_t len)
{
    uint64_t h = 1469598103934665603u; /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)key[i]) * 1099511628211u;
    return (size_t)h;
}

static size_t hub_slot(const struct etcd_hub *hb, const char *key, size_t len)
{
    return hub_hash(key, len) % hb->nbucket;
}

/* Registration R into the table, grown to keep its chains short (wmu
 * held). False: out of memory. */
static bool hub_link(struct etcd_hub *hb, struct etcd_watch *r)
{
    if (hb->nreg >= hb->nbucket * 2) {
        size_t n = hb->nbucket ? hb->nbucket * 4 : HUB_FIRST_BUCKETS, old = hb->nbucket;
        struct etcd_watch **b = calloc(n, sizeof *b), **was = hb->bucket;
        if (!b && !old)
            return false;
        if (b) { /* (else longer chains: still right) */
            hb->bucket = b;
            hb->nbucket = n;
            for (size_t i = 0; i < old; i++)
                while (was[i]) {
                    struct etcd_watch *x = was[i];
                    was[i] = x->next;
                    size_t j = hub_slot(hb, x->st.key, strlen(x->st.key));
                    x->next = b[j];
                    b[j] = x;
                }
            free(was);
        }
    }
    size_t j = hub_slot(hb, r->st.key, strlen(r->st.key));
    r->next = hb->bucket[j];
    hb->bucket[j] = r;
    hb->nreg++;
    return true;
}

/* A registration left the table (wmu held). */
static void hub_gone(struct etcd_hub *hb, struct etcd_watch *r)
{
    r->next = NULL;
    if (--hb->nreg == 0)
        hb->idle_since = dlock__now_ms();
}

/* Registration R, in the table (not fired), out of it (wmu held). */
static void hub_unlink(struct etcd_hub *hb, struct etcd_watch *r)
{
    for (struct etcd_watch **p = &hb->bucket[hub_slot(hb, r->st.key, strlen(r->st.key))]; *p;
         p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            hub_gone(hb, r);
            return;
        }
}

/* Every registration fires -- the stream ended: each waiter looks again
 * -- with BAD (may be empty) as what was wrong with the stream at
 * ENDPOINT (wmu held). */
static void hub_fire_all(struct etcd_conn *k, const char *bad, const char *endpoint)
{
    struct etcd_hub *hb = &k->hub;
    for (size_t i = 0; i < hb->nbucket; i++)
        while (hb->bucket[i]) {
            struct etcd_watch *r = hb->bucket[i];
            hb->bucket[i] = r->next;
            hub_gone(hb, r);
            if (bad[0]) {
                memcpy(r->bad, bad, sizeof r->bad);
                r->endpoint = endpoint;
            }
            r->fired = true;
            dlock__wait_wake(r->w);
        }
}

/* The stream told the deletion of KEY (LEN bytes) at revision REV: the
 * registrations on KEY fire (wmu held). */
static void hub_deleted(struct etcd_hub *hb, const char *key, size_t len, int64_t rev)
{
    if (rev > hb->through)
        hb->through = rev;
    if (!hb->nbucket)
        return;
    for (struct etcd_watch **p = &hb->bucket[hub_slot(hb, key, len)]; *p;) {
        struct etcd_watch *r = *p;
        if (strlen(r->st.key) != len || memcmp(r->st.key, key, len) != 0) {
            p = &r->next;
            continue;
        }
        *p = r->next;
        hub_gone(hb, r);
        r->fired = true;
        dlock__wait_wake(r->w);
    }
}

/* One message of the shared stream WT, checked as any watch's first
 * (dlock__etcd_watch_message): its deletions fire the registrations on
 * their keys; etcd's confirmation makes them live; a cancel, a
 * compaction, a refusal or a message etcd never sends ends the stream
 * (all fire). */
static void hub_message(struct etcd_watch *wt, const char *text, size_t len)
{
    struct etcd_conn *k = wt->k;
    char why[sizeof wt->bad];
    pthread_mutex_lock(&k->wmu);
    unsigned what = wt->fired ? 0 : dlock__etcd_watch_message(&wt->st, text, len, why, sizeof why);
    json_t *j = what && !(what & ETCD_WATCH_BAD) ? json_loadb(text, len, 0, NULL) : NULL;
    json_t *result = json_object_get(j, "result"), *ev;
    int64_t compact = 0;
    if (what & ETCD_WATCH_BAD) {
        memcpy(wt->bad, why, sizeof why);
        watch_fire(wt);
    } else if (what && (!json_is_object(result) || json_is_true(json_object_get(result, "canceled")) ||
                        !dlock__etcd_int_of(result, "compact_revision", &compact) || compact)) {
        watch_fire(wt); /* (a refusal, out of memory too) */
    } else if (what) {
        if (what & ETCD_WATCH_CREATED) {
            wt->created = true;
            k->hub.backoff_ms = 0;
        }
        size_t i;
        json_array_foreach(json_object_get(result, "events"), i, ev)
        {
            json_t *kv = json_object_get(ev, "kv"); /* a DELETE: puts are filtered out */
            size_t klen = 0;
            char *key = dlock__etcd_unb64(json_string_value(json_object_get(kv, "key")), &klen);
            if (!key) { /* out of memory: every waiter looks again */
                watch_fire(wt);
                break;
            }
            hub_deleted(&k->hub, key, klen, dlock__etcd_int(kv, "mod_revision"));
            free(key);
        }
    }
    json_decref(j);
    pthread_mutex_unlock(&k->wmu);
}

/* WHY (WHY_SIZE bytes) says what was wrong; a bad message fires. */
static unsigned bad(char *why, size_t why_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static unsigned bad(char *why, size_t why_size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_size, fmt, ap);
    va_end(ap);
    return ETCD_WATCH_BAD | ETCD_WATCH_FIRE;
}

/* Field FIELD of OBJ: an int64 (absent = 0) of at least MIN into *OUT. */
static bool int_min(const json_t *obj, const char *field, int64_t min, int64_t *out)
{
    return dlock__etcd_int_of(obj, field, out) && *out >= min;
}

/* A flag FIELD of OBJ: absent (false) or a boolean. */
static bool flag(const json_t *obj, const char *field, bool *out)
{
    json_t *v = json_object_get(obj, field);
    *out = json_is_true(v);
    return !v || json_is_boolean(v);
}

/* Event I of a message checked against ST (HEADER_REV the message's):
 * 0, or what bad() says. *FIRE set when it concerns the waiter. */
static unsigned check_event(struct etcd_watch_state *st, const json_t *ev, size_t i,
                            int64_t header_rev, bool *fire, char *why, size_t why_size)
{
    const json_t *kv = json_object_get(ev, "kv"), *type = json_object_get(ev, "type");
    bool del = json_is_string(type) && strcmp(json_string_value(type), "DELETE") == 0;
    if (!json_is_object(ev) || !json_is_object(kv))
        return bad(why, why_size, "events[%zu] without a kv", i);
    if (type && !del && !(json_is_string(type) && strcmp(json_string_value(type), "PUT") == 0))
        return bad(why, why_size, "events[%zu].type neither PUT nor DELETE", i);
    if (!del && st->noput)
        return bad(why, why_size, "events[%zu] a PUT on a watch of deletions only", i);
    size_t klen = 0, want = strlen(st->key);
    const char *k64 = json_string_value(json_object_get(kv, "key"));
    char *key = k64 ? dlock__etcd_unb64(k64, &klen) : NULL;
    bool ours = key && (st->prefix ? klen >= want : klen == want) && memcmp(key, st->key, want) == 0;
    free(key);
    if (!ours)
        return bad(why, why_size, "events[%zu].kv.key not the key%s watched", i,
                   st->prefix ? " prefix" : "");
    int64_t mod, create, version;
    if (!int_min(kv, "mod_revision", 1, &mod))
        return bad(why, why_size, "events[%zu].kv.mod_revision missing or not positive", i);
    if (mod < st->mod_rev || mod < st->start_rev || mod > header_rev)
        return bad(why, why_size, "events[%zu].kv.mod_revision %lld %s %lld", i, (long long)mod,
                   mod > header_rev ? "past the header's revision" : mod < st->mod_rev
                                                                     ? "going back from"
                                                                     : "before the start revision",
                   (long long)(mod > header_rev ? header_rev : mod < st->mod_rev ? st->mod_rev
                                                                                 : st->start_rev));
    if (!del && (!int_min(kv, "create_revision", 1, &create) || create > mod ||
                 !int_min(kv, "version", 1, &version) ||
                 (json_object_get(kv, "value") && !json_is_string(json_object_get(kv, "value")))))
        return bad(why, why_size, "events[%zu].kv (a PUT) without a valid create_revision, "
                                  "version or value", i);
    st->mod_rev = mod;
    if (del || st->any || (st->to_shared && dlock__etcd_is_shared(kv)))
        *fire = true; /* a deletion; a prefix watch's put; a downgrade */
    return 0;
}

/* One message of the watch stream. The first says "created"; later ones
 * carry events; "canceled" (compaction, permission) ends the watch. */
unsigned dlock__etcd_watch_message(struct etcd_watch_state *st, const char *text, size_t len,
                                   char *why, size_t why_size)
{
    json_error_t jerr;
    json_t *j = json_loadb(text, len, 0, &jerr);
    json_t *result = json_object_get(j, "result"), *header = json_object_get(result, "header");
    json_t *events = json_object_get(result, "events");
    unsigned what = 0;
    bool created = false, canceled = false, fire = false;
    int64_t rev = 0, id = 0, compact = 0;
    if (!result && json_is_object(json_object_get(j, "error")))
        what = ETCD_WATCH_FIRE; /* the stream's refusal: the look says what */
    else if (!json_is_object(result))
        what = bad(why, why_size, "%s", j ? "a message without a result" : "a line that is not JSON");
    else if (!json_is_object(header) || !int_min(header, "revision", 1, &rev))
        what = bad(why, why_size, "result.header.revision missing or not positive");
    else if (rev < st->header_rev)
        what = bad(why, why_size, "result.header.revision %lld going back from %lld",
                   (long long)rev, (long long)st->header_rev);
    else if (!flag(result, "created", &created) || !flag(result, "canceled", &canceled) ||
             !dlock__etcd_int_of(result, "watch_id", &id) ||
             !int_min(result, "compact_revision", 0, &compact) || (events && !json_is_array(events)))
        what = bad(why, why_size, "result.created, canceled, watch_id, compact_revision or "
                                  "events not of their type");
    else if (created && st->created)
        what = bad(why, why_size, "result.created a second time");
    else if (!created && !st->created)
        what = bad(why, why_size, "result without created first");
    else if (created && (id < -1 || (id == -1 && !canceled) || json_array_size(events)))
        what = bad(why, why_size, "result.created with watch_id %lld%s", (long long)id,
                   json_array_size(events) ? " and events" : id == -1 ? " and not canceled" : "");
    else if (!created && id != st->id)
        what = bad(why, why_size, "result.watch_id %lld, not the watch's %lld", (long long)id,
                   (long long)st->id);
    if (!what && json_is_object(result)) {
        st->header_rev = rev;
        if (created) {
            st->created = true;
            st->id = id;
            what = ETCD_WATCH_CREATED;
        }
        fire = canceled || compact > 0;
        size_t i;
        json_t *ev;
        json_array_foreach(events, i, ev)
        {
            if ((what = check_event(st, ev, i, rev, &fire, why, why_size)))
                break;
        }
    }
    json_decref(j);
    return what | (fire ? ETCD_WATCH_FIRE : 0);
}

bool dlock__etcd_stream_feed(struct etcd_stream *s, const char *p, size_t n,
                             void (*on)(void *arg, const char *text, size_t len), void *arg)
{
    if (s->len + n + 1 > (16u << 20) || /* a line that long is no watch event */
        !dlock__etcd_buf_append(&s->line, &s->len, &s->cap, 1024, p, n))
        return false;
    char *nl;
    while ((nl = memchr(s->line, '\n', s->len))) {
        size_t one = (size_t)(nl - s->line);
        if (one)
            on(arg, s->line, one);
        memmove(s->line, nl + 1, s->len - one - 1);
        s->len -= one + 1;
    }
    return true;
}

/* Tell the tap of WT each event of message TEXT (LEN bytes), checked
 * already; the watch thread, no lock held. False: the tap is done, or
 * etcd canceled the watch (a compaction, a permission). */
static bool watch_tap(struct etcd_watch *wt, const char *text, size_t len)
{
    json_t *j = json_loadb(text, len, 0, NULL);
    json_t *result = json_object_get(j, "result"), *ev;
    int64_t compact = 0;
    bool more = json_is_object(result) && !json_is_true(json_object_get(result, "canceled")) &&
                dlock__etcd_int_of(result, "compact_revision", &compact) && compact == 0;
    size_t i;
    json_array_foreach(json_object_get(result, "events"), i, ev)
    {
        if (more)
            more = wt->tap(wt->tap_arg, ev);
    }
    json_decref(j);
    return more;
}

/* What one whole message means to WT: wake its waiter once etcd confirms
 * the watch, fire it on a matching event or the stream's end; a tapped
 * watch's tap is told every event instead. */
static void watch_message(void *arg, const char *text, size_t len)
{
    struct etcd_watch *wt = arg;
    if (wt->hub) {
        hub_message(wt, text, len);
        return;
    }
    char why[sizeof wt->bad];
    pthread_mutex_lock(&wt->k->wmu);
    bool tap = wt->tap && !wt->fired && !wt->stopped;
    unsigned what = wt->fired ? 0 : dlock__etcd_watch_message(&wt->st, text, len, why, sizeof why);
    if (what & ETCD_WATCH_BAD)
        memcpy(wt->bad, why, sizeof why);
    if ((what & ETCD_WATCH_CREATED) && !(what & ETCD_WATCH_BAD)) {
        wt->created = true;
        if (!wt->stopped && !wt->tap)
            dlock__wait_wake(wt->w);
    }
    tap &= !(what & ETCD_WATCH_BAD);
    if ((what & ETCD_WATCH_FIRE) && (!wt->tap || (what & ETCD_WATCH_BAD)))
        watch_fire(wt);
    pthread_mutex_unlock(&wt->k->wmu);
    /* The thread alone frees watches, and it is running this: WT stays. */
    if (tap && !watch_tap(wt, text, len)) {
        pthread_mutex_lock(&wt->k->wmu);
        watch_fire(wt);
        pthread_mutex_unlock(&wt->k->wmu);
    }
}

static size_t watch_write(char *ptr, size_t size, size_t nmemb, void *arg)
{
    struct etcd_watch *wt = arg;
    size_t n = size * nmemb;
    return dlock__etcd_stream_feed(&wt->stream, ptr, n, watch_message, wt) ? n : 0;
}

static void watch_free(struct etcd_watch *wt)
{
    if (!wt)
        return;
    if (wt->easy)
        curl_easy_cleanup(wt->easy);
    curl_slist_free_all(wt->headers);
    free(wt->body);
    free(wt->st.key);
    free(wt->stream.line);
    if (wt->tap_free)
        wt->tap_free(wt->tap_arg);
    free(wt);
}

static struct etcd_watch *watch_new(struct etcd_conn *k, const struct etcd_watch_state *want);

/* Start the shared stream at the oldest revision a registration needs
 * (wmu held; some are registered). */
static void hub_start(struct etcd_conn *k, int64_t now)
{
    struct etcd_hub *hb = &k->hub;
    int64_t from = INT64_MAX;
    for (size_t i = 0; i < hb->nbucket; i++)
        for (struct etcd_watch *r = hb->bucket[i]; r; r = r->next)
            if (r->st.start_rev < from)
                from = r->st.start_rev;
    struct etcd_watch_state want = {.key = hb->prefix, .prefix = true, .noput = true,
                                    .start_rev = from};
    struct etcd_watch *wt = watch_new(k, &want);
    hb->started = now;
    if (!wt) { /* out of memory: every waiter looks again, and again later */
        hub_fire_all(k, "", NULL);
        hb->restart_at = now + HUB_BACKOFF_MAX_MS;
        return;
    }
    wt->hub = true;
    wt->next = k->watches;
    k->watches = wt;
    hb->wt = wt;
    hb->through = from - 1; /* (every deletion before FROM predates every look) */
}

/* The shared stream's turn of the watch thread (wmu held): one that
 * ended goes (every registration fired already) and starts again after
 * a backoff while waiters are registered; one never confirmed ends; one
 * without registrations for HUB_LINGER_MS stops. The ms until the next
 * of these is due; -1: none. */
static int64_t hub_tend(struct etcd_conn *k)
{
    struct etcd_hub *hb = &k->hub;
    int64_t now = dlock__now_ms();
    if (hb->wt && !hb->wt->fired && !hb->wt->created && now - hb->started >= HUB_CREATE_MS)
        watch_fire(hb->wt);
    if (hb->wt && hb->wt->fired) {
        hb->wt->stopped = true; /* freed by the loop below */
        hb->wt = NULL;
        hb->backoff_ms = hb->backoff_ms ? hb->backoff_ms * 2 : HUB_BACKOFF_FIRST_MS;
        if (hb->backoff_ms > HUB_BACKOFF_MAX_MS)
            hb->backoff_ms = HUB_BACKOFF_MAX_MS;
        hb->restart_at = now + hb->backoff_ms;
    }
    if (hb->wt && !hb->nreg && now - hb->idle_since >= HUB_LINGER_MS) {
        hb->wt->stopped = true;
        hb->wt = NULL;
    }
    if (!hb->wt && hb->nreg && now >= hb->restart_at)
        hub_start(k, now);
    if (hb->wt && !hb->wt->created)
        return hb->started + HUB_CREATE_MS - now;
    if (hb->wt && !hb->nreg)
        return hb->idle_since + HUB_LINGER_MS - now;
    if (!hb->wt && hb->nreg)
        return hb->restart_at > now ? hb->restart_at - now : 0;
    return -1;
}

static void *watch_thread(void *arg)
{
    struct etcd_conn *k = arg;
    pthread_mutex_lock(&k->wmu);
    while (!k->quit) {
        int64_t hub_due = hub_tend(k);
        for (struct etcd_watch **p = &k->watches; *p;) {
            struct etcd_watch *wt = *p;
            if (wt->stopped) {
                *p = wt->next;
                if (wt->added)
                    curl_multi_remove_handle(k->multi, wt->easy);
                watch_free(wt);
                continue;
            }
            if (!wt->added && !wt->done) {
                if (curl_multi_add_handle(k->multi, wt->easy) == CURLM_OK)
                    wt->added = true;
                else {
                    wt->done = true;
                    watch_fire(wt);
                }
            }
            p = &wt->next;
        }
        pthread_mutex_unlock(&k->wmu);
        int running = 0;
        curl_multi_perform(k->multi, &running);
        CURLMsg *m;
        int left;
        pthread_mutex_lock(&k->wmu);
        while ((m = curl_multi_info_read(k->multi, &left))) {
            if (m->msg != CURLMSG_DONE)
                continue;
            for (struct etcd_watch *wt = k->watches; wt; wt = wt->next)
                if (wt->easy == m->easy_handle) {
                    /* The stream ended (server gone, connection refused,
                     * token refused): the waiter must look again. */
                    curl_multi_remove_handle(k->multi, wt->easy);
                    wt->added = false;
                    wt->done = true;
                    watch_fire(wt);
                    break;
                }
        }
        pthread_mutex_unlock(&k->wmu);
        /* Sleep until a stream has data, a timer of curl's is due, or
         * curl_multi_wakeup() (a watch added or stopped, closing). */
        long timeout = -1;
        curl_multi_timeout(k->multi, &timeout);
        if (timeout < 0 || timeout > 60000)
            timeout = 60000;
        if (hub_due >= 0 && hub_due < timeout)
            timeout = (long)hub_due;
        curl_multi_poll(k->multi, NULL, 0, (int)timeout, NULL);
        pthread_mutex_lock(&k->wmu);
    }
    pthread_mutex_unlock(&k->wmu);
    return NULL;
}

int dlock__etcd_watch_start(struct etcd_conn *k, const char *key, int64_t start_rev,
                            struct dlock__wait *w, struct etcd_watch **out)
{
    return dlock__etcd_watch_start_for(k, key, start_rev, false, w, out);
}

static int watch_start(struct etcd_conn *k, const struct etcd_watch_state *want,
                       struct dlock__wait *w, struct etcd_watch **out);

/* What a watch of KEY from START_REV asks for: with TO_SHARED, a put
 * making it shared fires it too; with PREFIX, every key under KEY, any
 * event firing it; otherwise deletions only. */
static struct etcd_watch_state watch_want(const char *key, int64_t start_rev, bool to_shared,
                                          bool prefix)
{
    return (struct etcd_watch_state){.key = (char *)key, .prefix = prefix,
                                     .to_shared = to_shared, .any = prefix,
                                     .noput = !to_shared && !prefix, .start_rev = start_rev};
}

int dlock__etcd_watch_start_for(struct etcd_conn *k, const char *key, int64_t start_rev, bool to_shared,
                         struct dlock__wait *w, struct etcd_watch **out)
{
    struct etcd_watch_state want = watch_want(key, start_rev, to_shared, false);
    return watch_start(k, &want, w, out);
}

int dlock__etcd_watch_prefix(struct etcd_conn *k, const char *prefix, struct dlock__wait *w,
                             struct etcd_watch **out)
{
    struct etcd_watch_state want = watch_want(prefix, 0, false, true);
    return watch_start(k, &want, w, out);
}

/* A new watch asking for WANT (its key copied), not running yet; NULL
 * with a message. */
static struct etcd_watch *watch_new(struct etcd_conn *k, const struct etcd_watch_state *want)
{
    const char *key = want->key;
    struct etcd_watch *wt = calloc(1, sizeof *wt);
    char *kb = dlock__etcd_b64(key, strlen(key));
    json_t *req = kb ? json_pack("{s:{s:s}}", "create_request", "key", kb) : NULL;
    free(kb);
    char *end = req && want->prefix ? dlock__etcd_prefix_end_b64(key) : NULL;
    if (end)
        json_object_set_new(json_object_get(req, "create_request"), "range_end", json_string(end));
    free(end);
    if (req && want->noput) /* deletions only */
        json_object_set_new(json_object_get(req, "create_request"), "filters",
                            json_pack("[s]", "NOPUT"));
    if (req && want->start_rev > 0) {
        char rev[32];
        snprintf(rev, sizeof rev, "%lld", (long long)want->start_rev);
        json_object_set_new(json_object_get(req, "create_request"), "start_revision",
                            json_string(rev));
    }
    if (!wt || !req || !(wt->body = json_dumps(req, JSON_COMPACT)) ||
        !(wt->easy = curl_easy_init())) {
        json_decref(req);
        watch_free(wt);
        dlock__err(DLOCK_ENOMEM, "out of memory");
        return NULL;
    }
    json_decref(req);
    wt->k = k;
    wt->st = *want;
    wt->st.key = strdup(key);
    if (!wt->st.key) {
        watch_free(wt);
        dlock__err(DLOCK_ENOMEM, "out of memory");
        return NULL;
    }
    pthread_mutex_lock(&k->mu);
    size_t ep = k->cur;
    pthread_mutex_unlock(&k->mu);
    wt->endpoint = k->eps[ep].name;
    char *url = dlock__sprintf("%s/v3/watch", k->eps[ep].base);
    wt->headers = dlock__etcd_headers_for(k, true);
    dlock__etcd_easy_common(k, wt->easy, NULL);
    curl_easy_setopt(wt->easy, CURLOPT_URL, url);
    curl_easy_setopt(wt->easy, CURLOPT_HTTPHEADER, wt->headers);
    curl_easy_setopt(wt->easy, CURLOPT_POSTFIELDS, wt->body);
    curl_easy_setopt(wt->easy, CURLOPT_WRITEFUNCTION, watch_write);
    curl_easy_setopt(wt->easy, CURLOPT_WRITEDATA, wt);
    free(url);
    return wt;
}

/* K's multi handle and watch thread, made if need be (wmu held):
 * DLOCK_OK or the failure. */
static int watch_thread_ensure(struct etcd_conn *k)
{
    if (!k->multi && !(k->multi = dlock__curl_multi_new()))
        return dlock__err(DLOCK_ENOMEM, "%s: cannot make a curl multi handle", k->label);
    if (!k->thread_running) {
        int err = pthread_create(&k->thread, NULL, watch_thread, k);
        if (err)
            return dlock__errno(DLOCK_ENOMEM, err, "%s: cannot start the watch thread", k->label);
        k->thread_running = true;
    }
    return DLOCK_OK;
}

/* Run WT, made by watch_new(), on K's watch thread (started if need be):
 * DLOCK_OK, or the failure (WT freed). */
static int watch_add(struct etcd_conn *k, struct etcd_watch *wt)
{
    pthread_mutex_lock(&k->wmu);
    int rc = watch_thread_ensure(k);
    if (rc) {
        pthread_mutex_unlock(&k->wmu);
        watch_free(wt);
        return rc;
    }
    wt->next = k->watches;
    k->watches = wt;
    pthread_mutex_unlock(&k->wmu);
    curl_multi_wakeup(k->multi);
    return DLOCK_OK;
}

static int watch_start(struct etcd_conn *k, const struct etcd_watch_state *want,
                       struct dlock__wait *w, struct etcd_watch **out)
{
    *out = NULL;
    struct etcd_watch *wt = watch_new(k, want);
    if (!wt)
        return DLOCK_ENOMEM;
    wt->w = w;
    int rc = watch_add(k, wt);
    if (rc == DLOCK_OK)
        *out = wt;
    return rc;
}

int dlock__etcd_watch_tap(struct etcd_conn *k, const char *prefix, int64_t start_rev,
                          const struct etcd_tap *tap)
{
    struct etcd_watch_state want = watch_want(prefix, start_rev, false, true);
    want.any = false; /* events go to the tap; only the stream's end fires it */
    struct etcd_watch *wt = watch_new(k, &want);
    if (!wt) {
        tap->free(tap->arg);
        return DLOCK_ENOMEM;
    }
    wt->tap = tap->fn;
    wt->tap_free = tap->free;
    wt->tap_arg = tap->arg;
    return watch_add(k, wt);
}

int dlock__etcd_watch_deletes(struct etcd_conn *k, const char *key, int64_t from_rev,
                              struct dlock__wait *w, struct etcd_watch **out)
{
    struct etcd_hub *hb = &k->hub;
    if (!hb->prefix || strncmp(key, hb->prefix, strlen(hb->prefix)) != 0 || from_rev <= 0)
        return dlock__etcd_watch_start_for(k, key, from_rev, false, w, out); /* its own */
    *out = NULL;
    struct etcd_watch *r = calloc(1, sizeof *r);
    if (!r || !(r->st.key = strdup(key))) {
        free(r);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    r->k = k;
    r->reg = true;
    r->w = w;
    r->st.start_rev = from_rev;
    pthread_mutex_lock(&k->wmu);
    int rc = watch_thread_ensure(k);
    if (rc == DLOCK_OK && hb->wt && !hb->wt->fired && from_rev <= hb->through) {
        r->fired = true; /* the stream told a later deletion: KEY's may have gone by */
        dlock__wait_wake(w);
    } else if (rc == DLOCK_OK && !hub_link(hb, r)) {
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    bool start = rc == DLOCK_OK && !hb->wt;
    pthread_mutex_unlock(&k->wmu);
    if (rc) {
        free(r->st.key);
        free(r);
        return rc;
    }
    if (start)
        curl_multi_wakeup(k->multi);
    *out = r;
    return DLOCK_OK;
}

bool dlock__etcd_watch_live(struct etcd_watch *wt)
{
    struct etcd_hub *hb = &wt->k->hub;
    pthread_mutex_lock(&wt->k->wmu);
    bool live = wt->reg ? !wt->fired && hb->wt && hb->wt->created && !hb->wt->fired
                        : wt->created && !wt->fired;
    pthread_mutex_unlock(&wt->k->wmu);
    return live;
}

int dlock__etcd_watch_error(struct etcd_watch *wt)
{
    if (!wt)
        return DLOCK_OK;
    char bad[sizeof wt->bad];
    pthread_mutex_lock(&wt->k->wmu);
    memcpy(bad, wt->bad, sizeof bad);
    pthread_mutex_unlock(&wt->k->wmu);
    if (!bad[0])
        return DLOCK_OK;
    return dlock__err(DLOCK_EPROTO, "%s: watch of %s%s at %s: /v3/watch sent %s (not a watch "
                                    "event etcd sends)",
                      wt->k->label, wt->st.key, wt->st.prefix ? "*" : "", wt->endpoint, bad);
}

bool dlock__etcd_watch_fired(struct etcd_watch *wt)
{
    pthread_mutex_lock(&wt->k->wmu);
    bool fired = wt->fired;
    pthread_mutex_unlock(&wt->k->wmu);
    return fired;
}

void dlock__etcd_watch_stop(struct etcd_watch *wt)
{
    if (!wt)
        return;
    struct etcd_conn *k = wt->k;
    pthread_mutex_lock(&k->wmu);
    if (wt->reg) { /* the thread keeps no pointer to it outside the table */
        if (!wt->fired)
            hub_unlink(&k->hub, wt);
        bool idle = !k->hub.nreg && k->hub.wt;
        pthread_mutex_unlock(&k->wmu);
        if (idle) /* (the linger's timer) */
            curl_multi_wakeup(k->multi);
        free(wt->st.key);
        free(wt);
        return;
    }
    wt->stopped = true; /* the thread frees it on its next turn */
    pthread_mutex_unlock(&k->wmu);
    curl_multi_wakeup(k->multi);
}

/* Stop the watch thread and free every watch (dlock__etcd_conn_free). */
void dlock__etcd_watches_end(struct etcd_conn *k)
{
    if (k->thread_running) {
        pthread_mutex_lock(&k->wmu);
        k->quit = true;
        pthread_mutex_unlock(&k->wmu);
        curl_multi_wakeup(k->multi);
        pthread_join(k->thread, NULL);
    }
    while (k->watches) {
        struct etcd_watch *wt = k->watches;
        k->watches = wt->next;
        if (wt->added)
            curl_multi_remove_handle(k->multi, wt->easy);
        watch_free(wt);
    }
    if (k->multi)
        curl_multi_cleanup(k->multi);
    free(k->hub.bucket); /* (empty: every acquire ended before the close) */
    free(k->hub.prefix);
}

int dlock__etcd_watch_prefix_deletes(struct etcd_conn *k, const char *prefix, int64_t start_rev,
                                     struct dlock__wait *w, struct etcd_watch **out)
{
    struct etcd_watch_state want = watch_want(prefix, start_rev, false, true);
    want.any = false; /* puts stream by, ignored: deletions fire it */
    return watch_start(k, &want, w, out);
}
