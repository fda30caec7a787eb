/* etcd_http.c -- the etcd backend's transport: JSON over HTTP to etcd v3's
 * gRPC gateway (/v3/kv/txn, /v3/lease/..., /v3/watch), with libcurl and
 * jansson.
 *
 * Why a gateway and not gRPC: etcd 3.4 (what Debian ships) serves every
 * RPC we need as JSON on the client port, so a C program needs nothing
 * but libcurl. Keys and values travel base64-encoded, 64-bit integers as
 * JSON strings, and zero-valued fields are left out of replies.
 *
 * Unary calls take an easy handle from a small pool (a handle keeps its
 * connection alive between calls, and the keeper thread renews from its
 * own thread while callers acquire from theirs). Endpoints are tried in
 * turn starting with the last one that answered; a connection failure,
 * a member without leader or a reply that never came moves on to the
 * next, and the error message lists what each one said.
 *
 * Watches are long-lived streaming requests, one per waiting acquire, all
 * driven by one thread per client around a curl multi handle; the thread
 * wakes the waiter (dlock__wait_wake) when the watched key is deleted or
 * the stream ends, and the waiter looks again.
 */
#include "etcd_curl.h"
#include "etcd_http.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POOL_MAX 8
#define GRPC_NOT_FOUND 5
#define GRPC_PERMISSION_DENIED 7
#define GRPC_UNAVAILABLE 14
#define GRPC_UNAUTHENTICATED 16

struct etcd_endpoint {
    char *base; /* "http://127.0.0.1:2379" */
    char *name; /* "127.0.0.1:2379" */
};

struct etcd_conn {
    struct etcd_endpoint *eps;
    size_t neps;
    char *label;
    bool tls;
    char *tls_ca, *tls_cert, *tls_key;
    char *user, *password;
    long connect_timeout_ms, op_timeout_ms;

    pthread_mutex_t mu; /* cur, token, pool */
    size_t cur;         /* the endpoint that answered last */
    char *token;        /* auth token, NULL before authenticating */
    CURL *pool[POOL_MAX];
    size_t npool;

    /* watches: guarded by wmu; the multi handle is the watch thread's */
    pthread_mutex_t wmu;
    CURLM *multi;
    pthread_t thread;
    bool thread_running, quit;
    struct etcd_watch *watches;
};

struct etcd_watch {
    struct etcd_conn *k;
    CURL *easy;
    struct curl_slist *headers;
    char *body;
    char *line; /* bytes of the stream not yet parsed */
    size_t len, cap;
    struct dlock__wait *w;
    bool added, done, created, fired, stopped;
    struct etcd_watch *next;
};

/* ------------------------------------------------------------ helpers */

static const char b64chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *etcd_b64(const void *data, size_t len)
{
    const unsigned char *p = data;
    char *out = malloc((len + 2) / 3 * 4 + 1), *o = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < len; i += 3) {
        unsigned v = (unsigned)p[i] << 16;
        if (i + 1 < len)
            v |= (unsigned)p[i + 1] << 8;
        if (i + 2 < len)
            v |= p[i + 2];
        *o++ = b64chars[(v >> 18) & 63];
        *o++ = b64chars[(v >> 12) & 63];
        *o++ = i + 1 < len ? b64chars[(v >> 6) & 63] : '=';
        *o++ = i + 2 < len ? b64chars[v & 63] : '=';
    }
    *o = 0;
    return out;
}

static int b64val(char ch)
{
    const char *at = ch ? strchr(b64chars, ch) : NULL;
    return at ? (int)(at - b64chars) : -1;
}

char *etcd_unb64(const char *text, size_t *len)
{
    size_t n = strlen(text);
    char *out = malloc(n / 4 * 3 + 4);
    size_t o = 0;
    unsigned acc = 0;
    int bits = 0;
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (text[i] == '=')
            break;
        int v = b64val(text[i]);
        if (v < 0) {
            free(out);
            return NULL;
        }
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (char)((acc >> bits) & 0xff);
        }
    }
    out[o] = 0;
    if (len)
        *len = o;
    return out;
}

char *etcd_prefix_end_b64(const char *prefix)
{
    size_t n = strlen(prefix);
    unsigned char *end = malloc(n + 1);
    if (!end)
        return NULL;
    memcpy(end, prefix, n);
    while (n && end[n - 1] == 0xff)
        n--;
    char *out;
    if (!n) {
        out = etcd_b64("", 1); /* "\0": every key from the start key on */
    } else {
        end[n - 1]++;
        out = etcd_b64(end, n);
    }
    free(end);
    return out;
}

int64_t etcd_int(const json_t *obj, const char *field)
{
    json_t *v = json_object_get(obj, field);
    if (json_is_string(v))
        return strtoll(json_string_value(v), NULL, 10);
    if (json_is_integer(v))
        return (int64_t)json_integer_value(v);
    return 0;
}

const char *etcd_conn_label(const struct etcd_conn *k)
{
    return k->label;
}

/* --------------------------------------------------------- easy handles */

struct buf {
    char *data;
    size_t len, cap;
    size_t limit; /* refuse replies larger than this */
};

static size_t buf_write(char *ptr, size_t size, size_t nmemb, void *arg)
{
    struct buf *b = arg;
    size_t n = size * nmemb;
    if (b->len + n + 1 > b->limit)
        return 0;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d)
            return 0;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, ptr, n);
    b->len += n;
    b->data[b->len] = 0;
    return n;
}

static CURL *easy_take(struct etcd_conn *k)
{
    pthread_mutex_lock(&k->mu);
    CURL *e = k->npool ? k->pool[--k->npool] : NULL;
    pthread_mutex_unlock(&k->mu);
    return e ? e : curl_easy_init();
}

static void easy_give(struct etcd_conn *k, CURL *e)
{
    pthread_mutex_lock(&k->mu);
    if (k->npool < POOL_MAX) {
        k->pool[k->npool++] = e;
        e = NULL;
    }
    pthread_mutex_unlock(&k->mu);
    if (e)
        curl_easy_cleanup(e);
}

/* Options every request of this transport shares. */
static void easy_common(struct etcd_conn *k, CURL *e)
{
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, k->connect_timeout_ms);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_PROXY, ""); /* never through $http_proxy */
    if (k->tls) {
        if (k->tls_ca)
            curl_easy_setopt(e, CURLOPT_CAINFO, k->tls_ca);
        if (k->tls_cert)
            curl_easy_setopt(e, CURLOPT_SSLCERT, k->tls_cert);
        if (k->tls_key)
            curl_easy_setopt(e, CURLOPT_SSLKEY, k->tls_key);
    }
}

static struct curl_slist *headers_for(struct etcd_conn *k, bool with_token)
{
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    pthread_mutex_lock(&k->mu);
    if (with_token && k->token) {
        char *line = dlock__sprintf("Authorization: %s", k->token);
        if (line)
            h = curl_slist_append(h, line);
        free(line);
    }
    pthread_mutex_unlock(&k->mu);
    return h;
}

/* ---------------------------------------------------------- unary calls */

/* What one endpoint said, kept to explain a failure over all of them. */
struct attempt {
    char text[1536]; /* "h1:p1: Connection refused; h2:p2: ..." */
    size_t len;
    bool unavailable; /* some member answered "no leader" or timed out */
};

static void attempt_add(struct attempt *a, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void attempt_add(struct attempt *a, const char *name, const char *fmt, ...)
{
    if (a->len >= sizeof a->text - 1)
        return;
    int n = snprintf(a->text + a->len, sizeof a->text - a->len, "%s%s: ", a->len ? "; " : "",
                     name);
    if (n > 0)
        a->len += (size_t)n;
    if (a->len >= sizeof a->text - 1)
        return;
    va_list ap;
    va_start(ap, fmt);
    n = vsnprintf(a->text + a->len, sizeof a->text - a->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        a->len += (size_t)n;
    if (a->len >= sizeof a->text)
        a->len = sizeof a->text - 1;
}

/* One POST to one endpoint. Returns 0 and sets *STATUS and B on an HTTP
 * answer, or the CURLcode of a transport failure (ERRBUF says why). */
/* Progress callback of a call tied to a wait: a cancel aborts it. */
static int cancel_check(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    (void)dt, (void)dn, (void)ut, (void)un;
    struct dlock__wait *w = arg;
    pthread_mutex_lock(&w->mu);
    bool canceled = w->canceled;
    pthread_mutex_unlock(&w->mu);
    return canceled ? 1 : 0;
}

static CURLcode post_once(struct etcd_conn *k, size_t ep, const char *path, const char *body,
                          bool with_token, long *status, struct buf *b, char *errbuf,
                          bool *connected, const struct etcd_limits *lim, long *timeout_used)
{
    CURL *e = easy_take(k);
    if (!e) {
        snprintf(errbuf, CURL_ERROR_SIZE, "out of memory");
        return CURLE_OUT_OF_MEMORY;
    }
    curl_easy_reset(e);
    easy_common(k, e);
    char *url = dlock__sprintf("%s%s", k->eps[ep].base, path);
    struct curl_slist *hdrs = headers_for(k, with_token);
    errbuf[0] = 0;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    long timeout = k->op_timeout_ms;
    if (lim && lim->until) {
        int64_t left = lim->until - dlock__now_ms();
        if (left < 1)
            left = 1;
        if (left < timeout)
            timeout = (long)left;
        if (left < k->connect_timeout_ms)
            curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)left);
    }
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout);
    *timeout_used = timeout;
    if (lim && lim->w) {
        curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, cancel_check);
        curl_easy_setopt(e, CURLOPT_XFERINFODATA, lim->w);
    }
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, buf_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
    CURLcode rc = curl_easy_perform(e);
    /* Did the request go out? (A reused connection has no connect time,
     * but every sent request has a pretransfer time.) */
    curl_off_t pretransfer_us = 0;
    curl_easy_getinfo(e, CURLINFO_PRETRANSFER_TIME_T, &pretransfer_us);
    *connected = pretransfer_us > 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, status);
    if (rc && !errbuf[0])
        snprintf(errbuf, CURL_ERROR_SIZE, "%s", curl_easy_strerror(rc));
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, NULL);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, NULL);
    curl_slist_free_all(hdrs);
    free(url);
    if (rc)
        curl_easy_cleanup(e); /* its connection is suspect */
    else
        easy_give(k, e);
    return rc;
}

static int authenticate(struct etcd_conn *k);

/* "etcd 127.0.0.1:2379", or "etcd h1:p1,h2:p2 (at h2:p2)" with several. */
static const char *where(struct etcd_conn *k, size_t ep, char *buf, size_t size)
{
    if (k->neps == 1)
        snprintf(buf, size, "%s", k->label);
    else
        snprintf(buf, size, "%s (at %s)", k->label, k->eps[ep].name);
    return buf;
}

/* etcd's refusal in B: its "error"/"message" text and gRPC code. False
 * when the reply is not etcd's (another server on that port). */
static bool refusal(const struct buf *b, long status, char *text, size_t size, int *code)
{
    json_error_t jerr;
    json_t *j = b->data ? json_loadb(b->data, b->len, 0, &jerr) : NULL;
    const char *msg = j ? json_string_value(json_object_get(j, "message")) : NULL;
    if (!msg && j)
        msg = json_string_value(json_object_get(j, "error"));
    *code = j ? (int)json_integer_value(json_object_get(j, "code")) : 0;
    /* Streaming RPCs (/v3/lease/keepalive, /v3/watch) wrap their error:
     * {"error": {"grpc_code": 14, "http_code": 503, "message": "etcdserver:
     * no leader", ...}}. */
    json_t *nested = j ? json_object_get(j, "error") : NULL;
    if (!msg && json_is_object(nested)) {
        msg = json_string_value(json_object_get(nested, "message"));
        *code = (int)json_integer_value(json_object_get(nested, "grpc_code"));
    }
    bool from_etcd = msg != NULL;
    if (msg)
        snprintf(text, size, "%s", msg);
    else if (status == 404)
        snprintf(text, size, "HTTP 404: no etcd v3 JSON gateway here (is it etcd >= 3.4 with "
                             "--enable-grpc-gateway, its default?)");
    else
        snprintf(text, size, "HTTP %ld, not an etcd v3 gateway reply: %.120s", status,
                 b->data ? b->data : "(empty)");
    /* One line: servers other than etcd answer with HTML. */
    char *w = text;
    for (char *r = text; *r; r++) {
        char ch = (*r == '\n' || *r == '\r' || *r == '\t') ? ' ' : *r;
        if (!(ch == ' ' && w > text && w[-1] == ' '))
            *w++ = ch;
    }
    *w = 0;
    json_decref(j);
    return from_etcd;
}

static int call_endpoints(struct etcd_conn *k, const char *path, const char *body,
                          bool with_token, json_t **reply, const char *what, int *grpc_code,
                          bool *token_expired, bool *resent, const struct etcd_limits *lim)
{
    struct attempt a = {.len = 0};
    bool maybe_applied = false; /* a request went out and its reply was lost */
    char at[1200];
    pthread_mutex_lock(&k->mu);
    size_t start = k->cur;
    pthread_mutex_unlock(&k->mu);
    *token_expired = false;
    for (size_t i = 0; i < k->neps; i++) {
        size_t ep = (start + i) % k->neps;
        if (i && lim && lim->until && dlock__now_ms() >= lim->until) {
            a.unavailable |= maybe_applied;
            attempt_add(&a, k->eps[ep].name, "not tried: out of time");
            break;
        }
        struct buf b = {.limit = 64u << 20};
        char errbuf[CURL_ERROR_SIZE];
        long status = 0;
        bool connected = false;
        long used = k->op_timeout_ms;
        CURLcode rc =
            post_once(k, ep, path, body, with_token, &status, &b, errbuf, &connected, lim, &used);
        if (rc == CURLE_ABORTED_BY_CALLBACK) {
            free(b.data);
            return dlock__err(DLOCK_ECANCELED, "%s: %s: canceled", where(k, ep, at, sizeof at),
                              what);
        }
        if (rc) {
            maybe_applied |= connected;
            if (rc == CURLE_OPERATION_TIMEDOUT && connected) {
                a.unavailable = true;
                attempt_add(&a, k->eps[ep].name, "no reply within %ld ms%s", used,
                            used < k->op_timeout_ms ? " (the time left)" : "");
            } else {
                attempt_add(&a, k->eps[ep].name, "%s", errbuf);
            }
            free(b.data);
            continue;
        }
        if (resent && maybe_applied)
            *resent = true;
        if (status == 200) {
            json_error_t jerr;
            json_t *j = json_loadb(b.data ? b.data : "", b.len, 0, &jerr);
            free(b.data);
            if (!json_is_object(j)) {
                json_decref(j);
                return dlock__err(DLOCK_EPROTO, "%s: %s: %s replied with something not JSON (%s)",
                                  where(k, ep, at, sizeof at), what, path, jerr.text);
            }
            pthread_mutex_lock(&k->mu);
            k->cur = ep;
            pthread_mutex_unlock(&k->mu);
            *reply = j;
            return DLOCK_OK;
        }
        char text[512];
        int code = 0;
        bool from_etcd = refusal(&b, status, text, sizeof text, &code);
        free(b.data);
        if (!from_etcd)
            return dlock__err(DLOCK_EPROTO, "%s: %s: %s", where(k, ep, at, sizeof at), what, text);
        if (grpc_code)
            *grpc_code = code;
        if (code == GRPC_UNAUTHENTICATED && with_token && k->user) {
            *token_expired = true;
            return dlock__err(DLOCK_EAUTH, "%s: %s: %s", where(k, ep, at, sizeof at), what, text);
        }
        if (code == GRPC_UNAVAILABLE || status == 503 || strstr(text, "no leader") ||
            strstr(text, "timed out") || strstr(text, "leader changed")) {
            a.unavailable = true;
            attempt_add(&a, k->eps[ep].name, "%s", text);
            continue;
        }
        if (code == GRPC_UNAUTHENTICATED || code == GRPC_PERMISSION_DENIED ||
            strstr(text, "authentication failed") || strstr(text, "user name is empty") ||
            strstr(text, "permission denied"))
            return dlock__err(DLOCK_EAUTH, "%s: %s: %s%s", where(k, ep, at, sizeof at), what,
                              text,
                              strstr(text, "user name is empty")
                                  ? " (the server has authentication enabled: give "
                                    "etcd://USER:PASSWORD@...)"
                                  : "");
        return dlock__err(DLOCK_EBACKEND, "%s: %s: %s", where(k, ep, at, sizeof at), what, text);
    }
    if (a.unavailable)
        return dlock__err(DLOCK_EUNAVAIL, "%s: %s: no member could serve it (no leader or no "
                                          "quorum?): %s",
                          k->label, what, a.text);
    return dlock__err(DLOCK_ECONN, "%s: %s: cannot reach any endpoint: %s", k->label, what,
                      a.text);
}

int etcd_call(struct etcd_conn *k, const char *path, json_t *req, json_t **reply,
              const char *what, int *grpc_code)
{
    return etcd_call_resent(k, path, req, reply, what, grpc_code, NULL);
}

int etcd_call_resent(struct etcd_conn *k, const char *path, json_t *req, json_t **reply,
                     const char *what, int *grpc_code, bool *resent)
{
    return etcd_call_lim(k, path, req, reply, what, grpc_code, resent, NULL);
}

int etcd_call_lim(struct etcd_conn *k, const char *path, json_t *req, json_t **reply,
                  const char *what, int *grpc_code, bool *resent, const struct etcd_limits *lim)
{
    *reply = NULL;
    if (resent)
        *resent = false;
    if (grpc_code)
        *grpc_code = 0;
    char *body = json_dumps(req, JSON_COMPACT);
    if (!body)
        return dlock__err(DLOCK_ENOMEM, "%s: %s: out of memory", k->label, what);
    bool expired = false;
    int rc = call_endpoints(k, path, body, true, reply, what, grpc_code, &expired, resent, lim);
    if (rc && expired) {
        /* The auth token timed out (etcd forgets simple tokens after
         * --auth-token-ttl): get a fresh one and try again once. */
        rc = authenticate(k);
        if (!rc)
            rc = call_endpoints(k, path, body, true, reply, what, grpc_code, &expired, resent,
                                lim);
    }
    free(body);
    return rc;
}

/* Get a token for k->user (no-op without a user). */
static int authenticate(struct etcd_conn *k)
{
    if (!k->user)
        return DLOCK_OK;
    json_t *req = json_pack("{s:s, s:s}", "name", k->user, "password",
                            k->password ? k->password : "");
    char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (!body)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", k->label);
    json_t *reply = NULL;
    bool expired;
    char what[300];
    snprintf(what, sizeof what, "authenticate as '%s'", k->user);
    int rc = call_endpoints(k, "/v3/auth/authenticate", body, false, &reply, what, NULL, &expired,
                            NULL, NULL);
    free(body);
    if (rc == DLOCK_EBACKEND && strstr(dlock_errmsg(), "authentication is not enabled"))
        return DLOCK_OK; /* a user on a server without auth: nothing to do */
    if (rc)
        return rc;
    const char *token = json_string_value(json_object_get(reply, "token"));
    if (!token) {
        json_decref(reply);
        return dlock__err(DLOCK_EPROTO, "%s: %s: the reply has no token", k->label, what);
    }
    char *copy = strdup(token);
    json_decref(reply);
    if (!copy)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", k->label);
    pthread_mutex_lock(&k->mu);
    free(k->token);
    k->token = copy;
    pthread_mutex_unlock(&k->mu);
    return DLOCK_OK;
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

int etcd_conn_new(const struct etcd_conn_config *cfg, struct etcd_conn **out)
{
    *out = NULL;
    int loaded = dlock__curl_load();
    if (loaded)
        return loaded;
    struct etcd_conn *k = calloc(1, sizeof *k);
    if (!k)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    pthread_mutex_init(&k->mu, NULL);
    pthread_mutex_init(&k->wmu, NULL);
    k->eps = calloc(cfg->nhosts ? cfg->nhosts : 1, sizeof *k->eps);
    k->label = strdup(cfg->label);
    k->tls = cfg->tls;
    k->tls_ca = dup_or_null(cfg->tls_ca);
    k->tls_cert = dup_or_null(cfg->tls_cert);
    k->tls_key = dup_or_null(cfg->tls_key);
    k->user = dup_or_null(cfg->user);
    k->password = dup_or_null(cfg->password);
    k->connect_timeout_ms = (long)cfg->connect_timeout_ms;
    k->op_timeout_ms = (long)cfg->op_timeout_ms;
    if (!k->eps || !k->label) {
        etcd_conn_free(k);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < cfg->nhosts; i++) {
        const struct dlock__host *h = &cfg->hosts[i];
        bool v6 = strchr(h->host, ':') != NULL;
        k->eps[i].name = dlock__sprintf(v6 ? "[%s]:%d" : "%s:%d", h->host, h->port);
        k->eps[i].base = dlock__sprintf("%s://%s", cfg->tls ? "https" : "http", k->eps[i].name);
        k->neps++;
        if (!k->eps[i].name || !k->eps[i].base) {
            etcd_conn_free(k);
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        }
    }
    int rc = authenticate(k);
    if (rc) {
        etcd_conn_free(k);
        return rc;
    }
    *out = k;
    return DLOCK_OK;
}

/* ------------------------------------------------------------- watches */

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
static void watch_message(struct etcd_watch *wt, const char *text, size_t len)
{
    json_error_t jerr;
    json_t *j = json_loadb(text, len, 0, &jerr);
    json_t *result = json_object_get(j, "result");
    bool fire = !result; /* an "error" object, or garbage */
    if (json_is_true(json_object_get(result, "created"))) {
        pthread_mutex_lock(&wt->k->wmu);
        wt->created = true;
        if (!wt->stopped)
            dlock__wait_wake(wt->w);
        pthread_mutex_unlock(&wt->k->wmu);
    }
    if (result) {
        if (json_is_true(json_object_get(result, "canceled")) ||
            etcd_int(result, "compact_revision") > 0)
            fire = true;
        json_t *events = json_object_get(result, "events");
        size_t i;
        json_t *ev;
        json_array_foreach(events, i, ev)
        {
            if (json_is_string(json_object_get(ev, "type")) &&
                strcmp(json_string_value(json_object_get(ev, "type")), "DELETE") == 0)
                fire = true;
        }
    }
    json_decref(j);
    if (fire) {
        pthread_mutex_lock(&wt->k->wmu);
        watch_fire(wt);
        pthread_mutex_unlock(&wt->k->wmu);
    }
}

static size_t watch_write(char *ptr, size_t size, size_t nmemb, void *arg)
{
    struct etcd_watch *wt = arg;
    size_t n = size * nmemb;
    if (wt->len + n + 1 > wt->cap) {
        size_t cap = wt->cap ? wt->cap : 1024;
        while (cap < wt->len + n + 1)
            cap *= 2;
        if (cap > (16u << 20))
            return 0;
        char *d = realloc(wt->line, cap);
        if (!d)
            return 0;
        wt->line = d;
        wt->cap = cap;
    }
    memcpy(wt->line + wt->len, ptr, n);
    wt->len += n;
    char *nl;
    while ((nl = memchr(wt->line, '\n', wt->len))) {
        size_t one = (size_t)(nl - wt->line);
        if (one)
            watch_message(wt, wt->line, one);
        memmove(wt->line, nl + 1, wt->len - one - 1);
        wt->len -= one + 1;
    }
    return n;
}

static void watch_free(struct etcd_watch *wt)
{
    if (!wt)
        return;
    if (wt->easy)
        curl_easy_cleanup(wt->easy);
    curl_slist_free_all(wt->headers);
    free(wt->body);
    free(wt->line);
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

int etcd_watch_start(struct etcd_conn *k, const char *key, int64_t start_rev,
                     struct dlock__wait *w, struct etcd_watch **out)
{
    *out = NULL;
    struct etcd_watch *wt = calloc(1, sizeof *wt);
    char *kb = etcd_b64(key, strlen(key));
    json_t *req = kb ? json_pack("{s:{s:s, s:[s]}}", "create_request", "key", kb, "filters",
                                 "NOPUT")
                     : NULL;
    free(kb);
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
    pthread_mutex_lock(&k->mu);
    size_t ep = k->cur;
    pthread_mutex_unlock(&k->mu);
    char *url = dlock__sprintf("%s/v3/watch", k->eps[ep].base);
    wt->headers = headers_for(k, true);
    easy_common(k, wt->easy);
    curl_easy_setopt(wt->easy, CURLOPT_URL, url);
    curl_easy_setopt(wt->easy, CURLOPT_HTTPHEADER, wt->headers);
    curl_easy_setopt(wt->easy, CURLOPT_POSTFIELDS, wt->body);
    curl_easy_setopt(wt->easy, CURLOPT_WRITEFUNCTION, watch_write);
    curl_easy_setopt(wt->easy, CURLOPT_WRITEDATA, wt);
    free(url);

    pthread_mutex_lock(&k->wmu);
    int rc = DLOCK_OK;
    if (!k->multi && !(k->multi = curl_multi_init()))
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

bool etcd_watch_live(struct etcd_watch *wt)
{
    pthread_mutex_lock(&wt->k->wmu);
    bool live = wt->created && !wt->fired;
    pthread_mutex_unlock(&wt->k->wmu);
    return live;
}

bool etcd_watch_fired(struct etcd_watch *wt)
{
    pthread_mutex_lock(&wt->k->wmu);
    bool fired = wt->fired;
    pthread_mutex_unlock(&wt->k->wmu);
    return fired;
}

void etcd_watch_stop(struct etcd_watch *wt)
{
    if (!wt)
        return;
    struct etcd_conn *k = wt->k;
    pthread_mutex_lock(&k->wmu);
    wt->stopped = true; /* the thread frees it on its next turn */
    pthread_mutex_unlock(&k->wmu);
    curl_multi_wakeup(k->multi);
}

void etcd_conn_free(struct etcd_conn *k)
{
    if (!k)
        return;
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
    for (size_t i = 0; i < k->npool; i++)
        curl_easy_cleanup(k->pool[i]);
    for (size_t i = 0; i < k->neps; i++) {
        free(k->eps[i].base);
        free(k->eps[i].name);
    }
    free(k->eps);
    free(k->label);
    free(k->tls_ca);
    free(k->tls_cert);
    free(k->tls_key);
    free(k->user);
    free(k->password);
    free(k->token);
    pthread_mutex_destroy(&k->mu);
    pthread_mutex_destroy(&k->wmu);
    free(k);
}
