/* http.c -- the etcd backend's transport: JSON over HTTP to etcd v3's
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
 * Watches (watch.c) are long-lived streaming requests on the same
 * connection settings.
 */
#include "etcd.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define GRPC_PERMISSION_DENIED 7
#define GRPC_UNAVAILABLE 14
#define GRPC_UNAUTHENTICATED 16

/* ------------------------------------------------------------ helpers */

static const char b64chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *dlock__etcd_b64(const void *data, size_t len)
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

/* The value of base64 digit CH, -1 for any other byte. (Compared, not
 * looked up in b64chars: the renewal decodes every key of its ranges,
 * 10,000 a period.) */
static int b64val(unsigned char ch)
{
    if (ch >= 'A' && ch <= 'Z')
        return ch - 'A';
    if (ch >= 'a' && ch <= 'z')
        return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9')
        return ch - '0' + 52;
    return ch == '+' ? 62 : ch == '/' ? 63 : -1;
}

bool dlock__etcd_unb64_into(const char *text, size_t n, char *out, size_t *len)
{
    size_t o = 0;
    unsigned acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n && text[i] != '='; i++) {
        int v = b64val((unsigned char)text[i]);
        if (v < 0)
            return false;
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (char)((acc >> bits) & 0xff);
        }
    }
    out[o] = 0;
    *len = o;
    return true;
}

char *dlock__etcd_unb64(const char *text, size_t *len)
{
    size_t n = strlen(text), got = 0;
    char *out = malloc(n / 4 * 3 + 4);
    if (out && !dlock__etcd_unb64_into(text, n, out, &got)) {
        free(out);
        return NULL;
    }
    if (out && len)
        *len = got;
    return out;
}

char *dlock__etcd_prefix_end_b64(const char *prefix)
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
        out = dlock__etcd_b64("", 1); /* "\0": every key from the start key on */
    } else {
        end[n - 1]++;
        out = dlock__etcd_b64(end, n);
    }
    free(end);
    return out;
}

int64_t dlock__etcd_int(const json_t *obj, const char *field)
{
    json_t *v = json_object_get(obj, field);
    if (json_is_string(v))
        return strtoll(json_string_value(v), NULL, 10);
    if (json_is_integer(v))
        return (int64_t)json_integer_value(v);
    return 0;
}

const char *dlock__etcd_conn_label(const struct etcd_conn *k)
{
    return k->label;
}

/* --------------------------------------------------------- easy handles */

struct buf {
    char *data;
    size_t len, cap;
    size_t limit; /* refuse replies larger than this */
    bool too_big; /* ...and one was */
};

bool dlock__etcd_buf_append(char **data, size_t *len, size_t *cap, size_t first, const char *ptr,
                            size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t grown = *cap ? *cap : first;
        while (grown < *len + n + 1)
            grown *= 2;
        char *d = realloc(*data, grown);
        if (!d)
            return false;
        *data = d;
        *cap = grown;
    }
    memcpy(*data + *len, ptr, n);
    *len += n;
    (*data)[*len] = 0;
    return true;
}

static size_t buf_write(char *ptr, size_t size, size_t nmemb, void *arg)
{
    struct buf *b = arg;
    size_t n = size * nmemb;
    if (b->len + n + 1 > b->limit) {
        b->too_big = true;
        return 0; /* curl ends the transfer (CURLE_WRITE_ERROR) */
    }
    return dlock__etcd_buf_append(&b->data, &b->len, &b->cap, 4096, ptr, n) ? n : 0;
}

static CURL *easy_take(struct etcd_conn *k)
{
    pthread_mutex_lock(&k->mu);
    CURL *e = k->npool ? k->pool[--k->npool] : NULL;
    pthread_mutex_unlock(&k->mu);
    return e ? e : dlock__curl_easy_new();
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

/* Every socket curl opens for us: close-on-exec from the start (so a
 * program that runs a command while it holds a lock -- `dlock run` --
 * never hands the command a connection to etcd), and the errno of a
 * socket() that failed kept for the message (EMFILE). */
static curl_socket_t open_socket(void *arg, curlsocktype purpose, struct curl_sockaddr *a)
{
    (void)purpose;
    struct etcd_sock *sk = arg;
    int fd = socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
    if (fd < 0 && sk)
        sk->err = errno;
    return fd < 0 ? CURL_SOCKET_BAD : fd;
}

void dlock__etcd_easy_common(struct etcd_conn *k, CURL *e, struct etcd_sock *sk)
{
    curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, open_socket);
    curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, sk);
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

struct curl_slist *dlock__etcd_headers_for(struct etcd_conn *k, bool with_token)
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

/* Progress callback of a call tied to a wait: a cancel aborts it. */
static int cancel_check(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    (void)dt, (void)dn, (void)ut, (void)un;
    return dlock__etcd_wait_canceled(arg) ? 1 : 0;
}

bool dlock__etcd_wait_canceled(struct dlock__wait *w)
{
    /* A sleep from a sequence number that is not the current one returns
     * at once: DLOCK_ECANCELED when canceled, DLOCK_OK otherwise. */
    return w && dlock__wait_sleep(w, dlock__wait_seq(w) + 1, 0) == DLOCK_ECANCELED;
}

/* One request to the gateway, tried on each endpoint in turn: BODY
 * POSTed to PATH (with the auth token when WITH_TOKEN), within LIM (NULL
 * = none); WHAT names it in messages. */
struct gateway_post {
    const char *path, *body;
    bool with_token;
    const char *what;
    const struct etcd_limits *lim;
    bool raw; /* keep the answer's body as it came (out.body), unparsed */
    struct {
        json_t *reply;      /* the answer (a JSON object), caller's */
        char *body;         /* the same as text (RAW), caller's */
        size_t len;
        int grpc_code;      /* etcd's code of a refusal, 0 = none */
        bool token_expired; /* refused for a stale token: authenticate again */
        bool resent;        /* a send before the answered one may have landed */
    } out;
};

/* What one POST to one endpoint brought back. */
struct post_answer {
    long status;                  /* HTTP status of an answer */
    struct buf b;                 /* its body */
    char errbuf[CURL_ERROR_SIZE]; /* why a transport failure failed */
    bool connected;               /* the request went out */
    long timeout_used;            /* the timeout it was given, ms */
    struct etcd_sock sk;          /* the socket's open error, if any */
};

/* One POST of P to endpoint EP. Returns 0 and sets A's status and body on
 * an HTTP answer, or the CURLcode of a transport failure (A's errbuf says
 * why). */
static CURLcode post_once(struct etcd_conn *k, size_t ep, const struct gateway_post *p,
                          struct post_answer *a)
{
    CURL *e = easy_take(k);
    if (!e) {
        snprintf(a->errbuf, sizeof a->errbuf, "out of memory");
        return CURLE_OUT_OF_MEMORY;
    }
    curl_easy_reset(e);
    dlock__etcd_easy_common(k, e, &a->sk);
    char *url = dlock__sprintf("%s%s", k->eps[ep].base, p->path);
    struct curl_slist *hdrs = dlock__etcd_headers_for(k, p->with_token);
    a->errbuf[0] = 0;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, p->body);
    /* Both timeouts come from the one time-left function: the caps, cut
     * to what is left of P's deadline (the caller made sure some is). */
    int64_t deadline = p->lim ? p->lim->deadline : 0;
    long timeout = (long)dlock__time_left(deadline, k->op_timeout_ms);
    long connect_timeout = (long)dlock__time_left(deadline, k->connect_timeout_ms);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, connect_timeout > 0 ? connect_timeout : 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout > 0 ? timeout : 1L);
    a->timeout_used = timeout;
    if (p->lim && p->lim->w) {
        curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, cancel_check);
        curl_easy_setopt(e, CURLOPT_XFERINFODATA, p->lim->w);
    }
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, buf_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &a->b);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, a->errbuf);
    CURLcode rc = curl_easy_perform(e);
    /* Did the request go out? (A reused connection has no connect time,
     * but every sent request has a pretransfer time.) */
    curl_off_t pretransfer_us = 0;
    curl_easy_getinfo(e, CURLINFO_PRETRANSFER_TIME_T, &pretransfer_us);
    a->connected = pretransfer_us > 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &a->status);
    if (rc && !a->errbuf[0])
        snprintf(a->errbuf, sizeof a->errbuf, "%s", curl_easy_strerror(rc));
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, NULL);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, NULL);
    curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, NULL); /* A's sk is the caller's */
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

bool dlock__etcd_refusal(const char *data, size_t len, long status, char *text, size_t size,
                         int *code)
{
    json_error_t jerr;
    json_t *j = data ? json_loadb(data, len, 0, &jerr) : NULL;
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
                 data ? data : "(empty)");
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

/* Send P to the endpoints in turn, from the last that answered, until
 * one answers; the results go to P's out. */
static int call_endpoints(struct etcd_conn *k, struct gateway_post *p)
{
    struct attempt a = {.len = 0};
    bool maybe_applied = false; /* a request went out and its reply was lost */
    char at[1200];
    pthread_mutex_lock(&k->mu);
    size_t start = k->cur;
    pthread_mutex_unlock(&k->mu);
    p->out.token_expired = false;
    for (size_t i = 0; i < k->neps; i++) {
        size_t ep = (start + i) % k->neps;
        if (dlock__time_left(p->lim ? p->lim->deadline : 0, k->op_timeout_ms) == 0) {
            if (i == 0)
                return dlock__err(DLOCK_ETIMEDOUT, "%s: %s: no time left to send it", k->label,
                                  p->what);
            a.unavailable |= maybe_applied;
            attempt_add(&a, k->eps[ep].name, "not tried: out of time");
            break;
        }
        struct post_answer ans = {.b = {.limit = k->max_reply}, .timeout_used = k->op_timeout_ms};
        CURLcode rc = post_once(k, ep, p, &ans);
        if (ans.b.too_big) { /* another member would say as much */
            free(ans.b.data);
            return dlock__err(DLOCK_EPROTO, "%s: %s: reply larger than %zu bytes (max_reply)",
                              where(k, ep, at, sizeof at), p->what, k->max_reply);
        }
        if (rc == CURLE_ABORTED_BY_CALLBACK) {
            free(ans.b.data);
            return dlock__err(DLOCK_ECANCELED, "%s: %s: canceled", where(k, ep, at, sizeof at),
                              p->what);
        }
        if (rc && (ans.sk.err == EMFILE || ans.sk.err == ENFILE)) {
            free(ans.b.data);
            return dlock__err(DLOCK_EIO, "%s: %s: cannot open a connection: too many open files "
                                         "(%s: %s)",
                              where(k, ep, at, sizeof at), p->what,
                              ans.sk.err == EMFILE ? "the process's limit, ulimit -n"
                                                   : "the system's limit",
                              strerror(ans.sk.err));
        }
        if (rc) {
            maybe_applied |= ans.connected;
            if (rc == CURLE_OPERATION_TIMEDOUT && ans.connected) {
                a.unavailable = true;
                attempt_add(&a, k->eps[ep].name, "no reply within %ld ms%s", ans.timeout_used,
                            ans.timeout_used < k->op_timeout_ms ? " (the time left)" : "");
            } else {
                attempt_add(&a, k->eps[ep].name, "%s", ans.errbuf);
            }
            free(ans.b.data);
            continue;
        }
        if (maybe_applied)
            p->out.resent = true;
        if (ans.status == 200 && p->raw) {
            p->out.body = ans.b.data ? ans.b.data : dlock__strdup("");
            p->out.len = ans.b.len;
            pthread_mutex_lock(&k->mu);
            k->cur = ep;
            pthread_mutex_unlock(&k->mu);
            return p->out.body ? DLOCK_OK
                               : dlock__err(DLOCK_ENOMEM, "%s: %s: out of memory", k->label,
                                            p->what);
        }
        if (ans.status == 200) {
            json_error_t jerr;
            json_t *j = json_loadb(ans.b.data ? ans.b.data : "", ans.b.len, 0, &jerr);
            free(ans.b.data);
            if (!json_is_object(j)) {
                json_decref(j);
                return dlock__err(DLOCK_EPROTO, "%s: %s: %s replied with something not JSON (%s)",
                                  where(k, ep, at, sizeof at), p->what, p->path, jerr.text);
            }
            pthread_mutex_lock(&k->mu);
            k->cur = ep;
            pthread_mutex_unlock(&k->mu);
            p->out.reply = j;
            return DLOCK_OK;
        }
        char text[512];
        int code = 0;
        bool from_etcd =
            dlock__etcd_refusal(ans.b.data, ans.b.len, ans.status, text, sizeof text, &code);
        free(ans.b.data);
        if (!from_etcd)
            return dlock__err(DLOCK_EPROTO, "%s: %s: %s", where(k, ep, at, sizeof at), p->what,
                              text);
        p->out.grpc_code = code;
        if (code == GRPC_UNAUTHENTICATED && p->with_token && k->user) {
            p->out.token_expired = true;
            return dlock__err(DLOCK_EAUTH, "%s: %s: %s", where(k, ep, at, sizeof at), p->what,
                              text);
        }
        if (code == GRPC_UNAVAILABLE || ans.status == 503 || strstr(text, "no leader") ||
            strstr(text, "timed out") || strstr(text, "leader changed")) {
            a.unavailable = true;
            attempt_add(&a, k->eps[ep].name, "%s", text);
            continue;
        }
        if (code == GRPC_UNAUTHENTICATED || code == GRPC_PERMISSION_DENIED ||
            strstr(text, "authentication failed") || strstr(text, "user name is empty") ||
            strstr(text, "permission denied"))
            return dlock__err(DLOCK_EAUTH, "%s: %s: %s%s", where(k, ep, at, sizeof at), p->what,
                              text,
                              strstr(text, "user name is empty")
                                  ? " (the server has authentication enabled: give "
                                    "etcd://USER@... and the password with ?password_file=FILE, "
                                    "DLOCK_ETCD_PASSWORD_FILE=FILE or DLOCK_ETCD_PASSWORD)"
                              : strstr(text, "authentication failed")
                                  ? " (check the user and the password: the URL's, its "
                                    "password_file's, DLOCK_ETCD_PASSWORD_FILE's or "
                                    "DLOCK_ETCD_PASSWORD)"
                                  : "");
        return dlock__err(DLOCK_EBACKEND, "%s: %s: %s", where(k, ep, at, sizeof at), p->what,
                          text);
    }
    if (a.unavailable)
        return dlock__err(DLOCK_EUNAVAIL, "%s: %s: no member could serve it (no leader or no "
                                          "quorum?): %s",
                          k->label, p->what, a.text);
    return dlock__err(DLOCK_ECONN, "%s: %s: cannot reach any endpoint: %s", k->label, p->what,
                      a.text);
}

int dlock__etcd_call(struct etcd_conn *k, const char *path, json_t *req, json_t **reply,
                     const char *what, int *grpc_code)
{
    return dlock__etcd_call_resent(k, path, req, reply, what, grpc_code, NULL);
}

int dlock__etcd_call_resent(struct etcd_conn *k, const char *path, json_t *req, json_t **reply,
                            const char *what, int *grpc_code, bool *resent)
{
    return dlock__etcd_call_lim(k, path, req, reply, what, grpc_code, resent, NULL);
}

/* REQ sent as P says (its body made here from REQ), with the auth token. */
static int post_req(struct etcd_conn *k, json_t *req, struct gateway_post *p)
{
    char *body = json_dumps(req, JSON_COMPACT);
    if (!body)
        return dlock__err(DLOCK_ENOMEM, "%s: %s: out of memory", k->label, p->what);
    p->body = body;
    p->with_token = true;
    int rc = call_endpoints(k, p);
    if (rc && p->out.token_expired) {
        /* The auth token timed out (etcd forgets simple tokens after
         * --auth-token-ttl): get a fresh one and try again once. */
        rc = authenticate(k);
        if (!rc)
            rc = call_endpoints(k, p);
    }
    free(body);
    return rc;
}

int dlock__etcd_call_body(struct etcd_conn *k, const char *path, json_t *req, char **body,
                          size_t *len, const char *what, const struct etcd_limits *lim)
{
    struct gateway_post p = {.path = path, .what = what, .lim = lim, .raw = true};
    int rc = post_req(k, req, &p);
    *body = p.out.body;
    *len = p.out.len;
    return rc;
}

int dlock__etcd_call_lim(struct etcd_conn *k, const char *path, json_t *req, json_t **reply,
                  const char *what, int *grpc_code, bool *resent, const struct etcd_limits *lim)
{
    *reply = NULL;
    if (resent)
        *resent = false;
    if (grpc_code)
        *grpc_code = 0;
    struct gateway_post p = {.path = path, .what = what, .lim = lim};
    int rc = post_req(k, req, &p);
    *reply = p.out.reply;
    if (resent)
        *resent = p.out.resent;
    if (grpc_code)
        *grpc_code = p.out.grpc_code;
    if (!rc && (rc = dlock__etcd_check_reply(k->label, what, path, req, *reply))) {
        json_decref(*reply);
        *reply = NULL;
    }
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
    char what[300];
    snprintf(what, sizeof what, "authenticate as '%s'", k->user);
    struct gateway_post p = {.path = "/v3/auth/authenticate", .body = body, .what = what};
    int rc = call_endpoints(k, &p);
    json_t *reply = p.out.reply;
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

int dlock__etcd_conn_new(const struct etcd_conn_config *cfg, struct etcd_conn **out)
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
    k->max_reply = cfg->max_reply ? cfg->max_reply : ETCD_MAX_REPLY;
    k->hub.prefix = dup_or_null(cfg->watch_prefix);
    if (!k->eps || !k->label || (cfg->watch_prefix && !k->hub.prefix)) {
        dlock__etcd_conn_free(k);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < cfg->nhosts; i++) {
        const struct dlock__host *h = &cfg->hosts[i];
        bool v6 = strchr(h->host, ':') != NULL;
        k->eps[i].name = dlock__sprintf(v6 ? "[%s]:%d" : "%s:%d", h->host, h->port);
        k->eps[i].base = dlock__sprintf("%s://%s", cfg->tls ? "https" : "http", k->eps[i].name);
        k->neps++;
        if (!k->eps[i].name || !k->eps[i].base) {
            dlock__etcd_conn_free(k);
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        }
    }
    int rc = authenticate(k);
    if (rc) {
        dlock__etcd_conn_free(k);
        return rc;
    }
    *out = k;
    return DLOCK_OK;
}

void dlock__etcd_conn_free(struct etcd_conn *k)
{
    if (!k)
        return;
    dlock__etcd_watches_end(k);
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
