/* bench_etcd.c -- the raw etcd baseline of `dlock bench`.
 *
 * The floor of an etcd lock over the same transport dlock uses (etcd's
 * JSON gateway, libcurl, jansson): one txn "create <prefix><name>/raw
 * with our lease if absent" (succeeded = ours, else busy), then one
 * deleterange. Two round trips per acquire+release, each a Raft write --
 * the same count as dlock's recipe (create-and-read-owner txn, compare-
 * and-delete txn), so the ratio shows what dlock adds on top. One round
 * trip is a linearizable range of one key. Lock calls counted on the
 * server come from etcd's own /metrics (gRPC messages received by the KV
 * and Lease services). It parses just enough of the URL (first host,
 * user:password, /prefix) to reach the same server and key space.
 */
#ifdef DLOCK_HAVE_ETCD

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd/etcd.h"
#include "bench.h"
#include "dlock.h"

/* libcurl is not linked (loading it costs every dlock process start ~3.5
 * ms, see src/backends/etcd/etcd.h): the baseline's curl_* calls go
 * through the library's own table (etcd.h maps them onto dlock__curl),
 * loaded once by dlock__curl_load() -- one dlopen() for both. False, with
 * the reason in ERR, when libcurl cannot be loaded. */
static bool raw_curl_load(char *err, size_t errlen)
{
    if (dlock__curl_load() == DLOCK_OK)
        return true;
    snprintf(err, errlen, "the etcd baseline needs libcurl: %s", dlock_errmsg());
    return false;
}

struct etcd_raw {
    CURL *curl;
    char base[512];   /* "http://host:port" */
    char prefix[512]; /* key prefix, as dlock makes it from the path */
    char auth[1024];  /* "Authorization: <token>" or "" */
    char lease[32];   /* the lease every raw key hangs on */
    char *reply;
    size_t len;
};

static size_t collect(char *ptr, size_t size, size_t nmemb, void *arg)
{
    struct etcd_raw *r = arg;
    size_t n = size * nmemb;
    char *grown = realloc(r->reply, r->len + n + 1);
    if (!grown)
        return 0;
    r->reply = grown;
    memcpy(r->reply + r->len, ptr, n);
    r->len += n;
    r->reply[r->len] = 0;
    return n;
}

/* POST BODY to PATH; the parsed reply (NULL on any failure). GET when
 * BODY is NULL. */
static json_t *call(struct etcd_raw *r, const char *path, const char *body)
{
    char url[700];
    snprintf(url, sizeof url, "%s%s", r->base, path);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    if (r->auth[0])
        h = curl_slist_append(h, r->auth);
    r->len = 0;
    curl_easy_setopt(r->curl, CURLOPT_URL, url);
    curl_easy_setopt(r->curl, CURLOPT_HTTPHEADER, h);
    if (body)
        curl_easy_setopt(r->curl, CURLOPT_POSTFIELDS, body);
    else
        curl_easy_setopt(r->curl, CURLOPT_HTTPGET, 1L);
    CURLcode rc = curl_easy_perform(r->curl);
    long status = 0;
    curl_easy_getinfo(r->curl, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_setopt(r->curl, CURLOPT_HTTPHEADER, NULL);
    curl_slist_free_all(h);
    if (rc != CURLE_OK || status != 200 || !r->reply)
        return NULL;
    if (!body)
        return json_string(r->reply);
    return json_loadb(r->reply, r->len, 0, NULL);
}

static char *b64(const char *s)
{
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t len = strlen(s);
    char *out = malloc((len + 2) / 3 * 4 + 1), *o = out;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; out && i < len; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < len ? (unsigned)p[i + 1] << 8 : 0) |
                     (i + 2 < len ? p[i + 2] : 0);
        *o++ = t[v >> 18 & 63];
        *o++ = t[v >> 12 & 63];
        *o++ = i + 1 < len ? t[v >> 6 & 63] : '=';
        *o++ = i + 2 < len ? t[v & 63] : '=';
    }
    if (out)
        *o = 0;
    return out;
}

static void etcd_raw_disconnect(void *conn)
{
    struct etcd_raw *r = conn;
    if (!r)
        return;
    if (r->lease[0]) {
        char body[80];
        snprintf(body, sizeof body, "{\"ID\":\"%s\"}", r->lease);
        json_decref(call(r, "/v3/lease/revoke", body));
    }
    curl_easy_cleanup(r->curl);
    free(r->reply);
    free(r);
}

static void *etcd_raw_connect(const char *url, char *err, size_t errlen)
{
    bool tls = strncmp(url, "etcd+https://", 13) == 0;
    if (!tls && strncmp(url, "etcd://", 7) != 0) {
        snprintf(err, errlen, "not an etcd:// URL: %s", url);
        return NULL;
    }
    if (!raw_curl_load(err, errlen))
        return NULL;
    char *rest = strdup(url + (tls ? 13 : 7));
    struct etcd_raw *r = calloc(1, sizeof *r);
    if (!rest || !r || !(r->curl = curl_easy_init())) {
        free(rest);
        free(r);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    char *query = strchr(rest, '?');
    if (query)
        *query = 0; /* TLS files and other options are not for the baseline */
    char *hosts = rest, *user = NULL;
    char *at = strrchr(rest, '@');
    if (at) {
        *at = 0;
        user = rest;
        hosts = at + 1;
    }
    char *path = strchr(hosts, '/');
    if (path) {
        *path++ = 0;
        dlock_bench_pct_decode(path);
        size_t n = strlen(path);
        snprintf(r->prefix, sizeof r->prefix, "%s%s", path, n && path[n - 1] != '/' ? "/" : "");
    }
    hosts[strcspn(hosts, ",")] = 0; /* the first endpoint */
    snprintf(r->base, sizeof r->base, "%s://%s%s", tls ? "https" : "http", hosts,
             strchr(hosts, ':') ? "" : ":2379");
    curl_easy_setopt(r->curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(r->curl, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(r->curl, CURLOPT_PROXY, "");
    curl_easy_setopt(r->curl, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(r->curl, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(r->curl, CURLOPT_WRITEDATA, r);
    if (user) {
        char *colon = strchr(user, ':');
        const char *pw = colon ? colon + 1 : getenv("DLOCK_ETCD_PASSWORD");
        if (colon)
            *colon = 0;
        dlock_bench_pct_decode(user);
        char pwbuf[256];
        snprintf(pwbuf, sizeof pwbuf, "%s", pw ? pw : "");
        dlock_bench_pct_decode(pwbuf);
        json_t *req = json_pack("{s:s, s:s}", "name", user, "password", pwbuf);
        char *body = json_dumps(req, JSON_COMPACT);
        json_t *rep = body ? call(r, "/v3/auth/authenticate", body) : NULL;
        const char *token = json_string_value(json_object_get(rep, "token"));
        if (token)
            snprintf(r->auth, sizeof r->auth, "Authorization: %s", token);
        json_decref(req);
        json_decref(rep);
        free(body);
    }
    json_t *grant = call(r, "/v3/lease/grant", "{\"TTL\":\"60\"}");
    const char *id = json_string_value(json_object_get(grant, "ID"));
    if (id)
        snprintf(r->lease, sizeof r->lease, "%s", id);
    json_decref(grant);
    free(rest);
    if (!r->lease[0]) {
        snprintf(err, errlen, "etcd %s: cannot grant a lease%s%.200s", r->base,
                 r->reply ? ": " : "", r->reply ? r->reply : "");
        etcd_raw_disconnect(r);
        return NULL;
    }
    return r;
}

static int etcd_raw_lock_unlock(void *conn, const char *name)
{
    struct etcd_raw *r = conn;
    char key[2048];
    snprintf(key, sizeof key, "%s%s/raw", r->prefix, name);
    char *kb = b64(key);
    if (!kb)
        return -1;
    char body[4096];
    snprintf(body, sizeof body,
             "{\"compare\":[{\"result\":\"EQUAL\",\"target\":\"CREATE\",\"key\":\"%s\","
             "\"create_revision\":\"0\"}],\"success\":[{\"request_put\":{\"key\":\"%s\","
             "\"value\":\"\",\"lease\":\"%s\"}}]}",
             kb, kb, r->lease);
    json_t *rep = call(r, "/v3/kv/txn", body);
    int rc = !rep ? -1 : json_is_true(json_object_get(rep, "succeeded")) ? 0 : 1;
    json_decref(rep);
    if (rc == 0) {
        snprintf(body, sizeof body, "{\"key\":\"%s\"}", kb);
        rep = call(r, "/v3/kv/deleterange", body);
        rc = rep ? 0 : -1;
        json_decref(rep);
    }
    free(kb);
    return rc;
}

static int etcd_raw_round_trip(void *conn)
{
    struct etcd_raw *r = conn;
    json_t *rep = call(r, "/v3/kv/range", "{\"key\":\"ZGxvY2stYmVuY2g=\"}");
    json_decref(rep);
    return rep ? 0 : -1;
}

/* Messages the KV and Lease services received, from etcd's /metrics. */
static long long etcd_raw_server_calls(void *conn)
{
    struct etcd_raw *r = conn;
    json_t *text = call(r, "/metrics", NULL);
    const char *s = json_string_value(text);
    long long total = -1;
    for (const char *line = s; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        if (strncmp(line, "grpc_server_msg_received_total{", 31) == 0 &&
            (memmem(line, n, "etcdserverpb.KV\"", 16) ||
             memmem(line, n, "etcdserverpb.Lease\"", 19))) {
            const char *sp = memchr(line, ' ', n);
            if (sp) {
                if (total < 0)
                    total = 0;
                total += strtoll(sp + 1, NULL, 10);
            }
        }
        line = end ? end + 1 : NULL;
    }
    json_decref(text);
    return total;
}

const struct dlock_bench_baseline dlock_bench_etcd_baseline = {
    .scheme = "etcd",
    .what = "etcd JSON gateway via libcurl: txn create-if-absent <prefix><name>/raw with a "
            "lease + deleterange (2 Raft writes, as dlock's recipe); a linearizable range for "
            "one round trip",
    .connect = etcd_raw_connect,
    .disconnect = etcd_raw_disconnect,
    .lock_unlock = etcd_raw_lock_unlock,
    .round_trip = etcd_raw_round_trip,
    .server_calls = etcd_raw_server_calls,
};

#endif /* DLOCK_HAVE_ETCD */
