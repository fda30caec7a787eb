/* watch.c -- the etcd backend's watches: long-lived streaming requests
 * (POST /v3/watch), one per waiting acquire, all driven by one thread per
 * client around a curl multi handle. The thread wakes the waiter
 * (dlock__wait_wake) when etcd confirms the watch, when the watched key is
 * deleted (or, for a reader's watch, made shared: a downgrade) and when the
 * stream ends; the waiter then looks again.
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

/* Mark WT fired and wake its waiter (wmu held); a tapped watch ends. */
static void watch_fire(struct etcd_watch *wt)
{
    if (wt->fired)
        return;
    wt->fired = true;
    if (wt->tap)
        wt->stopped = true; /* the thread frees it on its next turn */
    else if (!wt->stopped)
        dlock__wait_wake(wt->w);
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

static void *watch_thread(void *arg)
{
    struct etcd_conn *k = arg;
    pthread_mutex_lock(&k->wmu);
    while (!k->quit) {
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

static int watch_start(struct etcd_conn *k, const char *key, int64_t start_rev, bool to_shared,
                       bool prefix, struct dlock__wait *w, struct etcd_watch **out);

int dlock__etcd_watch_start_for(struct etcd_conn *k, const char *key, int64_t start_rev, bool to_shared,
                         struct dlock__wait *w, struct etcd_watch **out)
{
    return watch_start(k, key, start_rev, to_shared, false, w, out);
}

int dlock__etcd_watch_prefix(struct etcd_conn *k, const char *prefix, struct dlock__wait *w,
                             struct etcd_watch **out)
{
    return watch_start(k, prefix, 0, false, true, w, out);
}

/* A new watch as watch_start() describes it, not running yet; NULL with
 * a message. */
static struct etcd_watch *watch_new(struct etcd_conn *k, const char *key, int64_t start_rev,
                                    bool to_shared, bool prefix)
{
    struct etcd_watch *wt = calloc(1, sizeof *wt);
    char *kb = dlock__etcd_b64(key, strlen(key));
    json_t *req = kb ? json_pack("{s:{s:s}}", "create_request", "key", kb) : NULL;
    free(kb);
    char *end = req && prefix ? dlock__etcd_prefix_end_b64(key) : NULL;
    if (end)
        json_object_set_new(json_object_get(req, "create_request"), "range_end", json_string(end));
    free(end);
    if (req && !to_shared && !prefix) /* deletions only */
        json_object_set_new(json_object_get(req, "create_request"), "filters",
                            json_pack("[s]", "NOPUT"));
    if (req && start_rev > 0) {
        char rev[32];
        snprintf(rev, sizeof rev, "%lld", (long long)start_rev);
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
    wt->st = (struct etcd_watch_state){.key = strdup(key), .prefix = prefix,
                                       .to_shared = to_shared, .any = prefix,
                                       .noput = !to_shared && !prefix, .start_rev = start_rev};
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

/* Run WT, made by watch_new(), on K's watch thread (started if need be):
 * DLOCK_OK, or the failure (WT freed). */
static int watch_add(struct etcd_conn *k, struct etcd_watch *wt)
{
    pthread_mutex_lock(&k->wmu);
    int rc = DLOCK_OK;
    if (!k->multi && !(k->multi = dlock__curl_multi_new()))
        rc = dlock__err(DLOCK_ENOMEM, "%s: cannot make a curl multi handle", k->label);
    if (!rc && !k->thread_running) {
        int err = pthread_create(&k->thread, NULL, watch_thread, k);
        if (err)
            rc = dlock__errno(DLOCK_ENOMEM, err, "%s: cannot start the watch thread", k->label);
        else
            k->thread_running = true;
    }
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

static int watch_start(struct etcd_conn *k, const char *key, int64_t start_rev, bool to_shared,
                       bool prefix, struct dlock__wait *w, struct etcd_watch **out)
{
    *out = NULL;
    struct etcd_watch *wt = watch_new(k, key, start_rev, to_shared, prefix);
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
    struct etcd_watch *wt = watch_new(k, prefix, start_rev, false, true);
    if (!wt) {
        tap->free(tap->arg);
        return DLOCK_ENOMEM;
    }
    wt->st.any = false; /* events go to the tap; only the stream's end fires it */
    wt->tap = tap->fn;
    wt->tap_free = tap->free;
    wt->tap_arg = tap->arg;
    return watch_add(k, wt);
}

bool dlock__etcd_watch_live(struct etcd_watch *wt)
{
    pthread_mutex_lock(&wt->k->wmu);
    bool live = wt->created && !wt->fired;
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
}

int dlock__etcd_watch_prefix_deletes(struct etcd_conn *k, const char *prefix, int64_t start_rev,
                                     struct dlock__wait *w, struct etcd_watch **out)
{
    int rc = watch_start(k, prefix, start_rev, false, true, w, out);
    if (rc == DLOCK_OK) {
        pthread_mutex_lock(&k->wmu);
        (*out)->st.any = false; /* puts stream by, ignored: deletions fire it */
        pthread_mutex_unlock(&k->wmu);
    }
    return rc;
}
