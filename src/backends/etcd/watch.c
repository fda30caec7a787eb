/* watch.c -- the etcd backend's watches: long-lived streaming requests
 * (POST /v3/watch), one per waiting acquire, all driven by one thread per
 * client around a curl multi handle. The thread wakes the waiter
 * (dlock__wait_wake) when etcd confirms the watch, when the watched key is
 * deleted (or, for a reader's watch, made shared: a downgrade) and when the
 * stream ends; the waiter then looks again.
 */
#include "etcd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Mark WT fired and wake its waiter (wmu held). */
static void watch_fire(struct etcd_watch *wt)
{
    if (wt->fired)
        return;
    wt->fired = true;
    if (!wt->stopped)
        dlock__wait_wake(wt->w);
}

/* One message of the watch stream. The first says "created"; later ones
 * carry events; "canceled" (compaction, permission) ends the watch. */
unsigned dlock__etcd_watch_message(const char *text, size_t len, bool any, bool to_shared)
{
    json_error_t jerr;
    json_t *j = json_loadb(text, len, 0, &jerr);
    json_t *result = json_object_get(j, "result");
    bool fire = !result; /* an "error" object, or garbage */
    unsigned what = json_is_true(json_object_get(result, "created")) ? ETCD_WATCH_CREATED : 0;
    if (result) {
        if (json_is_true(json_object_get(result, "canceled")) ||
            dlock__etcd_int(result, "compact_revision") > 0)
            fire = true;
        json_t *events = json_object_get(result, "events");
        size_t i;
        json_t *ev;
        json_array_foreach(events, i, ev)
        {
            const char *type = json_string_value(json_object_get(ev, "type"));
            if (type && strcmp(type, "DELETE") == 0)
                fire = true;
            else if (any)
                fire = true; /* a prefix watch: every put counts */
            else if (to_shared && dlock__etcd_is_shared(json_object_get(ev, "kv")))
                fire = true; /* a PUT (etcd leaves the type out: 0) */
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

/* What one whole message means to WT: wake its waiter once etcd confirms
 * the watch, fire it on a matching event or the stream's end. */
static void watch_message(void *arg, const char *text, size_t len)
{
    struct etcd_watch *wt = arg;
    unsigned what = dlock__etcd_watch_message(text, len, wt->any, wt->to_shared);
    if (!what)
        return;
    pthread_mutex_lock(&wt->k->wmu);
    if (what & ETCD_WATCH_CREATED) {
        wt->created = true;
        if (!wt->stopped)
            dlock__wait_wake(wt->w);
    }
    if (what & ETCD_WATCH_FIRE)
        watch_fire(wt);
    pthread_mutex_unlock(&wt->k->wmu);
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
    free(wt->stream.line);
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

static int watch_start(struct etcd_conn *k, const char *key, int64_t start_rev, bool to_shared,
                       bool prefix, struct dlock__wait *w, struct etcd_watch **out)
{
    *out = NULL;
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
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    json_decref(req);
    wt->k = k;
    wt->w = w;
    wt->to_shared = to_shared;
    wt->any = prefix;
    pthread_mutex_lock(&k->mu);
    size_t ep = k->cur;
    pthread_mutex_unlock(&k->mu);
    char *url = dlock__sprintf("%s/v3/watch", k->eps[ep].base);
    wt->headers = dlock__etcd_headers_for(k, true);
    dlock__etcd_easy_common(k, wt->easy, NULL);
    curl_easy_setopt(wt->easy, CURLOPT_URL, url);
    curl_easy_setopt(wt->easy, CURLOPT_HTTPHEADER, wt->headers);
    curl_easy_setopt(wt->easy, CURLOPT_POSTFIELDS, wt->body);
    curl_easy_setopt(wt->easy, CURLOPT_WRITEFUNCTION, watch_write);
    curl_easy_setopt(wt->easy, CURLOPT_WRITEDATA, wt);
    free(url);

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
    *out = wt;
    return DLOCK_OK;
}

bool dlock__etcd_watch_live(struct etcd_watch *wt)
{
    pthread_mutex_lock(&wt->k->wmu);
    bool live = wt->created && !wt->fired;
    pthread_mutex_unlock(&wt->k->wmu);
    return live;
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
        (*out)->any = false; /* puts stream by, ignored: deletions fire it */
        pthread_mutex_unlock(&k->wmu);
    }
    return rc;
}
