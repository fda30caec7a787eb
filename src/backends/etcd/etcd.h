/* etcd.h -- what the files of the etcd backend share, and nothing public.
 *
 *   curl.c   libcurl, loaded with dlopen() on first use (why: below)
 *   http.c   the transport: etcd v3's JSON gateway over libcurl
 *   reply.c  every reply checked against its request (DLOCK_EPROTO)
 *   watch.c  watch streams, driven by one thread per client; the
 *            writers' shared stream of deletions
 *   lease.c  open/close, the session lease and its keepalive (renew()),
 *            the waiters' lease, the deletes a lost reply left owing, the
 *            keys a late put may make
 *   queue.c  which keys are a lock's contenders, finding in the queue,
 *            JSON request builders
 *   mutex.c  the lock recipe (Go's concurrency.Mutex) and the backend
 *            table
 *   async.c  its wait cut into attempts for the asynchronous acquire
 *   rwmutex.c  shared holds beside it: their keys, values and downgrade
 *   semaphore.c  counting semaphores: a key per permit object
 *   inspect.c  status, force-release and list
 *   value.c  a lock's value: a key beside the lock, written in a
 *            transaction guarded by the hold's key
 *   contend.c  the contended signal: a holder's watch of its lock's
 *            prefix (a tapped watch) for keys put behind its own
 *
 * docs/protocol-etcd.md tells the whole story.
 */
#ifndef DLOCK_ETCD_H
#define DLOCK_ETCD_H

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "backend.h"

#define ETCD_DEFAULT_PORT 2379
#define ETCD_MAX_REPLY (64u << 20) /* a reply larger than this is refused (EPROTO) */
#define GRPC_NOT_FOUND 5
#define GRPC_FAILED_PRECONDITION 9

/* ============================================================== curl.c
 *
 * Linking libcurl pulls some thirty libraries (TLS, Kerberos, LDAP, SSH,
 * HTTP/2...) into every process that links libdlock, and loading them
 * costs ~3.5 ms per process start on the reference machine -- more than
 * `dlock run` on the file backend costs in all. So the etcd backend
 * reaches libcurl through this table, filled by dlopen("libcurl.so.4") (src/dlsym.c)
 * when the first etcd client opens; the names below map the ordinary
 * curl_* calls onto it, so the backend's code reads as plain libcurl.
 */
struct dlock__curl_api {
    CURLcode (*global_init)(long flags);
    CURL *(*easy_init)(void);
    void (*easy_cleanup)(CURL *h);
    void (*easy_reset)(CURL *h);
    CURLcode (*easy_setopt)(CURL *h, CURLoption opt, ...);
    CURLcode (*easy_getinfo)(CURL *h, CURLINFO info, ...);
    CURLcode (*easy_perform)(CURL *h);
    const char *(*easy_strerror)(CURLcode code);
    CURLM *(*multi_init)(void);
    CURLMcode (*multi_cleanup)(CURLM *m);
    CURLMcode (*multi_add_handle)(CURLM *m, CURL *h);
    CURLMcode (*multi_remove_handle)(CURLM *m, CURL *h);
    CURLMcode (*multi_perform)(CURLM *m, int *running);
    CURLMcode (*multi_poll)(CURLM *m, struct curl_waitfd *extra, unsigned n, int timeout_ms,
                            int *numfds);
    CURLMcode (*multi_timeout)(CURLM *m, long *timeout_ms);
    CURLMcode (*multi_wakeup)(CURLM *m);
    CURLMsg *(*multi_info_read)(CURLM *m, int *msgs_in_queue);
    struct curl_slist *(*slist_append)(struct curl_slist *list, const char *s);
    void (*slist_free_all)(struct curl_slist *list);
};

extern struct dlock__curl_api dlock__curl;

/* Load libcurl once (thread-safe) and call curl_global_init. DLOCK_OK, or
 * DLOCK_ENOTBUILT with a message naming the library and the package. */
int dlock__curl_load(void);
/* curl_easy_init() / curl_multi_init() whose internal wakeup socketpairs
 * are close-on-exec (see curl.c): every multi handle, and every easy
 * handle run by curl_easy_perform(). */
CURL *dlock__curl_easy_new(void);
CURLM *dlock__curl_multi_new(void);

#undef curl_easy_setopt
#undef curl_easy_getinfo
#define curl_global_init dlock__curl.global_init
#define curl_easy_init dlock__curl.easy_init
#define curl_easy_cleanup dlock__curl.easy_cleanup
#define curl_easy_reset dlock__curl.easy_reset
#define curl_easy_setopt dlock__curl.easy_setopt
#define curl_easy_getinfo dlock__curl.easy_getinfo
#define curl_easy_perform dlock__curl.easy_perform
#define curl_easy_strerror dlock__curl.easy_strerror
#define curl_multi_init dlock__curl.multi_init
#define curl_multi_cleanup dlock__curl.multi_cleanup
#define curl_multi_add_handle dlock__curl.multi_add_handle
#define curl_multi_remove_handle dlock__curl.multi_remove_handle
#define curl_multi_perform dlock__curl.multi_perform
#define curl_multi_poll dlock__curl.multi_poll
#define curl_multi_timeout dlock__curl.multi_timeout
#define curl_multi_wakeup dlock__curl.multi_wakeup
#define curl_multi_info_read dlock__curl.multi_info_read
#define curl_slist_append dlock__curl.slist_append
#define curl_slist_free_all dlock__curl.slist_free_all

/* ============================================================== http.c
 *
 * The transport knows endpoints, connections, authentication tokens and
 * watch streams; it knows nothing about locks. Every call returns
 * DLOCK_OK or a DLOCK_E* code with a message (dlock__err) that names the
 * endpoint(s) tried and quotes etcd's own words.
 */
struct etcd_conn;

struct etcd_conn_config {
    const struct dlock__host *hosts; /* ports already defaulted */
    size_t nhosts;
    bool tls;                        /* https:// */
    const char *tls_ca, *tls_cert, *tls_key;
    const char *user, *password;     /* NULL user = no authentication */
    int64_t connect_timeout_ms, op_timeout_ms;
    size_t max_reply;                /* largest reply taken; 0 = ETCD_MAX_REPLY */
    const char *label;               /* "etcd 127.0.0.1:2379,..." for messages */
    const char *watch_prefix;        /* the keys the shared stream of deletions
                                        covers (watch.c); NULL: no such stream */
};

/* Make a transport (copies what it needs from CFG) and, with a user,
 * authenticate once so a wrong password fails here. */
int dlock__etcd_conn_new(const struct etcd_conn_config *cfg, struct etcd_conn **out);
void dlock__etcd_conn_free(struct etcd_conn *k);
/* "etcd 127.0.0.1:2379,127.0.0.1:2380" */
const char *dlock__etcd_conn_label(const struct etcd_conn *k);

/* POST REQ (borrowed) to PATH ("/v3/kv/txn") on the first endpoint that
 * answers, starting with the last one that did. On DLOCK_OK *REPLY owns
 * the decoded answer. WHAT names the operation in messages ("acquire
 * 'jobs'"). An expired auth token is renewed and the call retried once.
 * Errors: DLOCK_ECONN (no endpoint reachable: the message lists each
 * with curl's reason), DLOCK_EAUTH, DLOCK_EUNAVAIL (no leader, timeouts),
 * DLOCK_EBACKEND (etcd refused: its message), DLOCK_EPROTO. *GRPC_CODE,
 * when not NULL, gets etcd's gRPC status code of a refusal (else 0). */
int dlock__etcd_call(struct etcd_conn *k, const char *path, json_t *req, json_t **reply,
                     const char *what, int *grpc_code);
/* The same; *RESENT turns true when the request went out to an endpoint
 * whose reply was lost and was then sent again to another: the answer
 * may describe a state our first attempt already changed. */
int dlock__etcd_call_resent(struct etcd_conn *k, const char *path, json_t *req, json_t **reply,
                            const char *what, int *grpc_code, bool *resent);

/* Limits of one call beyond the connection's own timeouts. */
struct etcd_limits {
    int64_t deadline;      /* monotonic ms: every request's timeout is
                              dlock__time_left(deadline, cap), and nothing
                              is sent once it has passed; 0 (try once) and
                              DLOCK__NEVER leave the caps whole */
    struct dlock__wait *w; /* a wait whose cancel aborts the call
                              (DLOCK_ECANCELED); NULL = none */
};

/* dlock__etcd_call() within LIM (NULL = none). A call cut short by LIM's
 * deadline fails like a timeout (DLOCK_EUNAVAIL or DLOCK_ECONN); one
 * aborted by a cancel returns DLOCK_ECANCELED. Either way the request may
 * have been applied. */
int dlock__etcd_call_lim(struct etcd_conn *k, const char *path, json_t *req, json_t **reply,
                  const char *what, int *grpc_code, bool *resent, const struct etcd_limits *lim);
/* The same, the answer's body kept as text in *BODY (*LEN bytes, caller
 * frees; NULL on failure), neither parsed nor checked: the caller checks
 * it as dlock__etcd_check_reply() would (span.c). */
int dlock__etcd_call_body(struct etcd_conn *k, const char *path, json_t *req, char **body,
                          size_t *len, const char *what, const struct etcd_limits *lim);

/* ------------------------------------------- shared by http.c and watch.c */

#define POOL_MAX 8 /* idle easy handles kept for unary calls */

/* Append N bytes at PTR to the buffer *DATA (*LEN bytes used of *CAP,
 * grown by doubling from FIRST, kept 0-terminated): what curl's write
 * callbacks do. False when out of memory. */
bool dlock__etcd_buf_append(char **data, size_t *len, size_t *cap, size_t first, const char *ptr,
                            size_t n);

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
    size_t max_reply;

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
    /* The shared stream (watch.c): one watch of every deletion under
     * PREFIX, run while waiters are registered on it; each event goes to
     * the registrations on its key. */
    struct etcd_hub {
        char *prefix;                 /* NULL: no shared stream */
        struct etcd_watch *wt;        /* the stream running; NULL: none */
        struct etcd_watch **bucket;   /* registrations by key, chained on next */
        size_t nbucket, nreg;
        int64_t through;              /* every deletion up to this revision told */
        int64_t started, idle_since;  /* (ms) when the stream was sent; when the
                                         last registration went */
        int64_t restart_at, backoff_ms; /* after the stream ended */
    } hub;
};

/* A watch's stream (POST /v3/watch answers with one JSON message per
 * line, each cut anywhere by the network): the bytes of the line not yet
 * ended. */
struct etcd_stream {
    char *line;
    size_t len, cap;
};

/* What a watch asked for, and what its stream said so far: each message
 * is checked against both (dlock__etcd_watch_message). */
struct etcd_watch_state {
    char *key;         /* the key watched, or the prefix (PREFIX) */
    bool prefix;       /* every key starting with KEY */
    bool to_shared;    /* a put that makes the key shared fires it too */
    bool any;          /* any event under the prefix fires it */
    bool noput;        /* etcd filters puts out (NOPUT) */
    int64_t start_rev; /* 0: from the moment etcd creates it */
    bool created;      /* etcd said so */
    int64_t id;        /* the watch_id etcd gave it */
    int64_t header_rev, mod_rev; /* the last ones seen: they never go back */
};

struct etcd_watch {
    struct etcd_conn *k;
    CURL *easy;
    struct curl_slist *headers;
    char *body;
    struct etcd_stream stream;
    struct etcd_watch_state st;
    const char *endpoint; /* "127.0.0.1:2379", the member it went to (k's) */
    char bad[200];        /* what was wrong with a message etcd never sends */
    struct dlock__wait *w;
    bool added, done, created, fired, stopped;
    bool hub; /* the shared stream itself (no waiter: its end wakes every registration) */
    bool reg; /* a waiter's registration on the shared stream: no request of its own;
                 st.key and st.start_rev (the first revision it needs) only */
    /* a tapped watch (dlock__etcd_watch_tap): its tap, told every event;
     * NULL: a waiter's watch */
    bool (*tap)(void *arg, const json_t *ev);
    void (*tap_free)(void *arg);
    void *tap_arg;
    struct etcd_watch *next;
};

/* What the socket callback of one request learned: the errno of a
 * socket() that failed (EMFILE), else 0. */
struct etcd_sock {
    int err;
};

/* Options every request of this transport shares: among them, every
 * socket is opened close-on-exec. SK (may be NULL) gets socket errors. */
void dlock__etcd_easy_common(struct etcd_conn *k, CURL *e, struct etcd_sock *sk);
/* The request headers: JSON, and the auth token when WITH_TOKEN. */
struct curl_slist *dlock__etcd_headers_for(struct etcd_conn *k, bool with_token);
/* Stop the watch thread and free every watch (dlock__etcd_conn_free). */
void dlock__etcd_watches_end(struct etcd_conn *k);

/* etcd's refusal in the reply body DATA (LEN bytes, NUL-terminated; NULL:
 * none) of HTTP STATUS: its "error"/"message" text, on one line, into
 * TEXT, and its gRPC code. False when the reply is not etcd's (another
 * server on that port). Pure: fuzzed by tests/fuzz/fuzz_etcd_watch.c. */
bool dlock__etcd_refusal(const char *data, size_t len, long status, char *text, size_t size,
                         int *code);

/* True when W (may be NULL) was canceled (dlock_lock_cancel()). */
bool dlock__etcd_wait_canceled(struct dlock__wait *w);

/* ------------------------------------------------------------- watches */

struct etcd_watch;

/* Watch KEY for its deletion from revision START_REV on (0 = from the
 * moment etcd creates the watch), over its own streaming request driven
 * by the transport's watch thread. W is woken (dlock__wait_wake) when etcd
 * confirms the watch, and when the key is deleted or the stream ends or
 * fails -- then the watch has fired (dlock__etcd_watch_fired() turns true) and
 * the caller should look again. */
int dlock__etcd_watch_start(struct etcd_conn *k, const char *key, int64_t start_rev,
                            struct dlock__wait *w, struct etcd_watch **out);
/* Watch KEY for its deletion at revision FROM_REV or later (every
 * earlier one was seen: a look at FROM_REV - 1). A key under the
 * transport's watch prefix is served by the client's shared stream of
 * deletions: a registration, not a request of its own (a waiter costs a
 * few hundred bytes, not a connection); it fires when the stream tells
 * KEY's deletion, at once when the stream has passed FROM_REV already
 * (its deletion may have gone by), and when the stream ends (cut,
 * compacted, canceled, refused) -- then the caller looks again. Live
 * (dlock__etcd_watch_live) while the stream is confirmed by etcd. */
int dlock__etcd_watch_deletes(struct etcd_conn *k, const char *key, int64_t from_rev,
                              struct dlock__wait *w, struct etcd_watch **out);
/* The same; with TO_SHARED, a put that makes KEY a shared hold's key (its
 * value starts with ETCD_SHARED_MARK: a downgrade) fires it too. */
int dlock__etcd_watch_start_for(struct etcd_conn *k, const char *key, int64_t start_rev, bool to_shared,
                         struct dlock__wait *w, struct etcd_watch **out);
/* Watch every key under PREFIX from the moment etcd creates the watch:
 * any put or delete fires it (an election's observers). */
int dlock__etcd_watch_prefix(struct etcd_conn *k, const char *prefix, struct dlock__wait *w,
                             struct etcd_watch **out);
/* Watch every key starting with PREFIX for deletions from START_REV on
 * (a semaphore's waiters: any permit given back may be theirs). */
int dlock__etcd_watch_prefix_deletes(struct etcd_conn *k, const char *prefix, int64_t start_rev,
                                     struct dlock__wait *w, struct etcd_watch **out);
bool dlock__etcd_watch_fired(struct etcd_watch *wt);
/* What a tapped watch does with its events: FN(ARG, EV) for each event of
 * the stream, on the watch thread with no lock held, until it answers
 * false; FREE(ARG) once the watch is over (that, a cancel by etcd, the
 * stream's end, the client's close). */
struct etcd_tap {
    bool (*fn)(void *arg, const json_t *ev);
    void (*free)(void *arg);
    void *arg;
};
/* Watch every key under PREFIX from START_REV on with TAP (no waiter):
 * DLOCK_OK, or the failure (TAP's argument freed then). */
int dlock__etcd_watch_tap(struct etcd_conn *k, const char *prefix, int64_t start_rev,
                          const struct etcd_tap *tap);

/* Reading the stream, with nothing else (no watch, no lock, no I/O), so
 * that tests/fuzz/fuzz_etcd_watch.c feeds it any bytes cut anywhere:
 * dlock__etcd_stream_feed() appends N bytes of P to S and calls
 * ON(ARG, TEXT, LEN) for each line now whole (without its newline; empty
 * lines skipped), in order; false when a line passes 16 MiB or memory
 * runs out (the stream is then given up). dlock__etcd_watch_message()
 * says what one line means to the watch ST (which it updates): ETCD_WATCH_*
 * bits; ETCD_WATCH_BAD (with FIRE) for a message etcd never sends, what
 * was wrong with it in WHY (WHY_SIZE bytes; the field named): one that is
 * not JSON, the wrong watch_id, created twice or not first, a created
 * watch_id -1 not canceled, a header.revision that is not positive or
 * goes back, an event without a kv, of another key, of an unknown type,
 * a PUT on a NOPUT watch, a mod_revision not positive, going back, before
 * the start revision or past the header's, a PUT's create_revision or
 * version not positive. Nothing is decided on a message before it holds
 * up. */
enum { ETCD_WATCH_CREATED = 1, ETCD_WATCH_FIRE = 2, ETCD_WATCH_BAD = 4 };
bool dlock__etcd_stream_feed(struct etcd_stream *s, const char *p, size_t n,
                             void (*on)(void *arg, const char *text, size_t len), void *arg);
unsigned dlock__etcd_watch_message(struct etcd_watch_state *st, const char *text, size_t len,
                                   char *why, size_t why_size);
/* Confirmed by etcd and not fired. */
bool dlock__etcd_watch_live(struct etcd_watch *wt);
/* DLOCK_OK, or DLOCK_EPROTO naming the server, the key and the field when
 * WT (may be NULL) was sent a message etcd never sends: the waiter stops
 * there, it decides nothing on such a stream. */
int dlock__etcd_watch_error(struct etcd_watch *wt);
/* Stop and forget the watch: after this returns W is never touched again. */
void dlock__etcd_watch_stop(struct etcd_watch *wt);

/* ------------------------------------------------------------- helpers */

/* Base64 of LEN bytes (caller frees); NULL when out of memory. */
char *dlock__etcd_b64(const void *data, size_t len);
/* Decode base64 TEXT into a fresh NUL-terminated buffer (*LEN = bytes). */
char *dlock__etcd_unb64(const char *text, size_t *len);
/* Decode the N bytes of base64 at TEXT into OUT (room for N / 4 * 3 + 4
 * bytes, NUL-terminated; *LEN = bytes). False on a byte that is no
 * base64. */
bool dlock__etcd_unb64_into(const char *text, size_t n, char *out, size_t *len);
/* The smallest key greater than every key starting with PREFIX (etcd's
 * range_end for a prefix), base64-encoded; "AA==" (the \0 key, "every
 * key") for an empty prefix. Caller frees. */
char *dlock__etcd_prefix_end_b64(const char *prefix);
/* An int64 field of a gateway reply (encoded as a JSON string, or absent
 * when zero), of a reply dlock__etcd_check_reply() let through. */
int64_t dlock__etcd_int(const json_t *obj, const char *field);
/* The same, strictly: false (*OUT = 0) for anything but an integer or a
 * string of digits within int64 (reply.c). */
bool dlock__etcd_int_of(const json_t *obj, const char *field, int64_t *out);
/* DLOCK_OK when REPLY, etcd's answer at PATH to REQ, has every field a
 * decision rests on, well formed: a txn's responses one per operation of
 * the branch it took, ranges' kvs with keys and revisions, a lease's ID
 * and a TTL etcd could give (a grant's at least the one asked), a header
 * revision. Else DLOCK_EPROTO naming the field (LABEL, WHAT as in the
 * call's messages). dlock__etcd_call_lim() checks every reply so. */
/* DLOCK_EPROTO, the message saying what was wrong with the reply of
 * PATH: "LABEL: WHAT: PATH replied with <FMT...> (not a reply etcd
 * gives)". */
int dlock__etcd_bad_reply(const char *label, const char *what, const char *path,
                          const char *fmt, ...) __attribute__((format(printf, 4, 5)));
int dlock__etcd_check_reply(const char *label, const char *what, const char *path,
                            const json_t *req, const json_t *reply);

/* ============================================================= lease.c */

/* A key we could not delete (server unreachable): retried by the keeper
 * (the core's cleanup queue) so a dead waiter's key never blocks the queue
 * while our lease lives on. */
struct etcd_orphan {
    char *key;
    int64_t rev; /* its create revision when we made it; 0 = not known (a
                    put whose reply was lost): read before the delete */
    struct etcd_orphan *next;
};

/* A put that creates KEY on LEASE and may still reach etcd after we gave
 * it up (its reply lost, or a first send whose second was answered): it
 * would make KEY again, a contender nobody holds, kept alive with LEASE.
 * The keeper deletes such a key (see dlock__etcd_late_put) until LEASE is
 * gone. */
struct etcd_stray {
    char *key;
    int64_t lease;
    int64_t spare; /* the create revision of our hold of KEY (its put's
                      answered send), never deleted; 0 = none */
    struct etcd_stray *next;
};

struct etcd_backend {
    struct dlock_client *c;
    struct etcd_conn *k;
    char *prefix;       /* put before every lock name ("" by default) */
    const char *label;  /* "etcd 127.0.0.1:2379" (owned by k) */
    char ident[128];    /* value of our keys: "dlock <pid>@<host>" */
    char shared_ident[140]; /* of our shared holds' keys: ETCD_SHARED_MARK
                               "<pid>@<host>" */

    bool granting;            /* (mu) a thread is granting / freshening the
                                 session lease; the others wait, cancelably */
    struct dlock__waitset grant_ws; /* acquires waiting for that thread */
    bool sweeping;            /* (mu) a thread is deleting orphans */
    bool sweep_queued;        /* (mu) on the core's cleanup queue */
    const char *deleting;     /* (mu) the orphan whose delete is in flight */
    struct dlock__waitset forget_ws; /* acquires waiting for that delete */
    pthread_mutex_t mu;       /* these fields and the ones below; never
                                 held across a request */
    int64_t lease;            /* session lease, 0 = none (yet, or lost) */
    int64_t lease_ttl_ms;     /* its TTL: asked, or lower as etcd answered */
    int64_t lease_confirmed;  /* send time of its last grant / keepalive */
    int64_t wlease;           /* waiters' lease, 0 = none (yet, or lost) */
    int64_t wlease_ttl_ms;
    int64_t wlease_confirmed;
    struct etcd_orphan *orphans;
    struct etcd_stray *strays;  /* (mu) keys late puts may make */
    bool strays_queued;         /* (mu) their check is on the cleanup queue */
};

/* A lease as an acquire uses it. */
struct lease_ref {
    int64_t id;
    int64_t ttl_ms;    /* what we asked for, in ms (whole seconds), or
                          less when a keepalive's TTL said so */
    int64_t confirmed; /* send time of the last grant or keepalive */
    bool own;          /* a lease of this hold only (fixed / other TTL) */
    bool waiter;       /* the client's waiters' lease */
};

/* h->bdata */
struct etcd_hold {
    char *key;
    int64_t rev;   /* create revision = token */
    int64_t lease;
    bool own_lease;
    int64_t delay_ms; /* the lock-delay its marker names (delay.c); 0: none */
};

/* The end of an acquire: hold H keeps EH (allocated by the caller), which
 * takes KEY (created at revision REV = the token, on lease LR, the hold's
 * own when OWN); OWNER names the holder; LR's last confirmation starts
 * the validity. */
void dlock__etcd_hold_keep(struct etcd_backend *s, struct dlock__hold *h, struct etcd_hold *eh,
                           char *key, int64_t rev, const struct lease_ref *lr, bool own,
                           const char *owner);
int dlock__etcd_nomem(struct etcd_backend *s);
char *dlock__etcd_i64s(int64_t v);
/* {"key": b64(key)} plus, when PREFIX_END, the range end of KEY as a
 * prefix. */
json_t *dlock__etcd_range(const char *key, bool prefix_end);
/* The first kv of response K of a txn reply (NULL if none). */
json_t *dlock__etcd_txn_kv(json_t *reply, size_t k);
int64_t dlock__etcd_header_rev(json_t *reply);
/* Decoded key of a kv (caller frees). */
char *dlock__etcd_kv_key(json_t *kv);
/* A failure worth retrying (outage, election). */
bool dlock__etcd_transient(int rc);

/* Grant a lease of TTL_MS (rounded up to whole seconds) for lock NAME. */
int dlock__etcd_lease_grant(struct etcd_backend *s, const char *name, int64_t ttl_ms,
                            struct lease_ref *out, const struct etcd_limits *lim);
/* One keepalive of lease ID: DLOCK_OK with *SENT set (and *TTL_MS, when
 * not NULL, to the TTL etcd answered: how long the lease lasts from
 * now), DLOCK_ELOST when etcd no longer knows it (a TTL <= 0), or a
 * transport error. */
int dlock__etcd_lease_keepalive(struct etcd_backend *s, int64_t id, int64_t *sent,
                                int64_t *ttl_ms, const struct etcd_limits *lim);
/* *TTL_MS lowered to SAID_MS when that is shorter (and positive): etcd
 * ends a lease when its own TTL says, whatever was asked. */
void dlock__etcd_lease_lower_ttl(int64_t *ttl_ms, int64_t said_ms);
int dlock__etcd_lease_revoke(struct etcd_backend *s, int64_t id, const struct etcd_limits *lim);
/* Revoke lease ID (one that carries nothing any longer) by DEADLINE
 * (monotonic ms; nothing is sent once it has passed); one not answered by
 * then is owed to the core's cleanup queue, which the keeper drains. */
void dlock__etcd_lease_revoke_by(struct etcd_backend *s, int64_t id, int64_t deadline);
/* Forget the session lease ID (it was lost): the next acquire grants one. */
void dlock__etcd_session_lease_dead(struct etcd_backend *s, int64_t id);
/* The session lease, granted or freshened as needed, into *LR. */
int dlock__etcd_session_lease(struct etcd_backend *s, const char *name, struct lease_ref *lr,
                              const struct etcd_limits *lim);
/* The lease waiting keys hang on (see mutex.c): short (WAITER_LEASE_MS,
 * at most MAX_TTL_MS), one per client, granted or freshened as needed. */
int dlock__etcd_waiter_lease(struct etcd_backend *s, const char *name, int64_t max_ttl_ms,
                             struct lease_ref *lr, const struct etcd_limits *lim);
/* Forget the waiters' lease ID (it was lost). */
void dlock__etcd_waiter_lease_dead(struct etcd_backend *s, int64_t id);
/* Keep LR alive while a wait goes on; note the confirmation time. */
int dlock__etcd_lease_refresh(struct etcd_backend *s, struct lease_ref *lr,
                              const struct etcd_limits *lim);

/* ============================================================= queue.c */

/* KV (a range reply's kv) is a contender of the lock whose keys start with
 * PFX ("<prefix>NAME/"): the key PFX<hex> (exclusive, or downgraded) or
 * PFX<hex>-<hex> (shared), with a lease. */
bool dlock__etcd_is_contender(const char *pfx, const json_t *kv);
/* KV's value (absent from a keys-only range) marks a shared hold. */
bool dlock__etcd_is_shared(const json_t *kv);
/* The range op "a page of keys under PFX in create order" (keys only),
 * ascending from after BOUND_REV or descending from before it (0: from
 * the start / the end). */
json_t *dlock__etcd_queue_range(const char *pfx, bool ascending, int64_t bound_rev);
/* The same; with WRITERS (a reader looking for the writers it waits for)
 * the page carries values, which tell shared keys apart. */
json_t *dlock__etcd_queue_range_for(const char *pfx, bool ascending, int64_t bound_rev, bool writers);
/* The range response K of a txn reply. */
json_t *dlock__etcd_txn_range(json_t *reply, size_t k);
/* A search of the queue under PFX for its first contender in create
 * order, ASCENDING from after BOUND_REV or descending from before it (0:
 * from the start / the end); with WRITERS, the first that is not shared.
 * RESP is a page already read (made by dlock__etcd_queue_range_for with
 * the same ASCENDING, BOUND_REV and WRITERS), NULL to start with a
 * request. WHAT names it in messages; LIM bounds its requests (NULL =
 * none). */
struct etcd_queue_search {
    const char *pfx;
    json_t *resp;
    bool ascending;
    int64_t bound_rev;
    bool writers;
    const char *what;
    const struct etcd_limits *lim;
    struct {
        json_t *kv; /* the contender found (a new reference), NULL = none */
        bool paged; /* a page past RESP was read (at a later revision) */
    } out;
};
/* Run search Q, paging on as needed. */
int dlock__etcd_queue_find(struct etcd_backend *s, struct etcd_queue_search *q);
/* The lock name of contender KV under the client's prefix (caller frees);
 * NULL for any other key. */
char *dlock__etcd_contender_name(struct etcd_backend *s, const json_t *kv);

/* ============================================================= lease.c */

/* Delete KEY within (DEADLINE, W) if its create revision is still REV,
 * the one we created it at (0: not known, a put whose reply was lost --
 * the key is read first and the delete compared on what that read
 * found); on failure remember it as an orphan to try again later. A
 * delete that lands late (its reply lost, or retried by the keeper)
 * thus never takes a later hold's key: the same key name (our lease),
 * another create revision. True when the key is gone or no longer the
 * one we made (or can never be deleted by us: no permission). */
bool dlock__etcd_delete_key(struct etcd_backend *s, const char *key, int64_t rev,
                            int64_t deadline, struct dlock__wait *w);
/* A put of KEY on LEASE may still land after we gave it up (cut short by
 * a deadline, a cancel or an outage, or sent twice; SPARE: the create
 * revision of the hold the acquire made of KEY, 0 = none). LEASE is
 * retired -- no later acquire of this client puts anything on it, so a
 * key of ours on it is KEY made by that late put (or SPARE's hold) -- and
 * the keeper, until etcd no longer knows LEASE (after which no put on it
 * can land) or the client closes (which revokes it), deletes KEY when it
 * finds it on LEASE at another create revision than SPARE, compared on
 * that revision. Without this the late put leaves a contender nobody
 * holds on a lease we keep alive: the name is taken until we close. */
void dlock__etcd_late_put(struct etcd_backend *s, const char *key, int64_t lease, int64_t spare);
/* A put answered with RC (RESENT: sent twice) may still land later: its
 * reply was lost (RC an outage, a timeout, a cancel) or its first send's
 * was (mutex.c). */
bool dlock__etcd_put_may_land(int rc, bool resent);

/* KEY is about to be ours again (put by an acquire): it is no orphan any
 * more. When a sweep's delete of it is in flight, wait until it is done
 * (it must not land after our put) within W's deadline and cancel:
 * DLOCK_OK, DLOCK_ETIMEDOUT, DLOCK_ECANCELED, or DLOCK_EBUSY at once for a
 * try-once W (the caller then uses another key). */
int dlock__etcd_orphan_forget(struct etcd_backend *s, const char *key, struct dlock__wait *w);

/* ============================================================ mutex.c */

/* The transaction "delete KEY if its create revision is REV" (NULL: out
 * of memory): how every delete of a key of ours is sent -- a release, a
 * withdrawn waiter, an owed delete -- so one that reaches etcd late never
 * takes a later hold's key (same name, another create revision). */
json_t *dlock__etcd_delete_if_txn(const char *key, int64_t rev);
/* Send it within LIM (WHAT names it in errors). */
int dlock__etcd_delete_if_rev(struct etcd_backend *s, const char *key, int64_t rev,
                              const char *what, const struct etcd_limits *lim);
/* Send REQ (taken over; NULL: out of memory, said so) as a transaction
 * to /v3/kv/txn, the reply into *REPLY; WHAT, *CODE and LIM as
 * dlock__etcd_call_lim's. */
int dlock__etcd_txn(struct etcd_backend *s, json_t *req, json_t **reply, const char *what,
                    int *code, const struct etcd_limits *lim);

/* value.c: lock values (the key "<prefix>dlock_value:NAME"). */
extern const struct dlock__value_ops dlock__etcd_value_ops;
/* The value's guarded write and read (KEY NULL) or a guarded key's
 * (guard.c): one transaction comparing the hold's key's create revision,
 * then a put or a delete; one range. */
int dlock__etcd_stored_set(void *state, struct dlock__hold *h, const char *key,
                           const struct dlock__value *v);
int dlock__etcd_stored_get(void *state, const char *name, const char *key,
                           struct dlock__value *out);
extern const struct dlock__guarded_ops dlock__etcd_guarded_ops;
/* contend.c */
extern const struct dlock__contend_ops dlock__etcd_contend_ops;

/* "<prefix>NAME/": where lock NAME's keys live (caller frees). */
char *dlock__etcd_lock_prefix(struct etcd_backend *s, const char *name);
/* Put KEY again, with VALUE on LEASE, if its create revision is still REV
 * (a put keeps it: the key keeps its place and token). ETCD_KEY_GONE when
 * it is not; WHAT and *CODE as dlock__etcd_call's. */
#define ETCD_KEY_GONE 1
int dlock__etcd_put_again(struct etcd_backend *s, const char *key, int64_t rev, const char *value,
                   int64_t lease, const char *what, int *code, const struct etcd_limits *lim);
/* The parts of dlock__etcd_put_again(), for a txn that does more (a
 * downgrade): its txn (NULL: out of memory); OP (taken over; NULL: out of
 * memory) added to a TXN's success branch (-1: not added, TXN to drop);
 * TXN (taken over) sent, ETCD_KEY_GONE when its compare failed. */
json_t *dlock__etcd_put_again_txn(const char *key, int64_t rev, const char *value, int64_t lease);
int dlock__etcd_txn_also(json_t *txn, json_t *op);
int dlock__etcd_put_again_run(struct etcd_backend *s, json_t *txn, const char *what, int *code,
                              const struct etcd_limits *lim);
/* dlock__etcd_put_again() of hold H's own key, on its own lease, with
 * VALUE (a proclaim, a downgrade: VERB says which in messages);
 * DLOCK_ELOST when H has no key. */
int dlock__etcd_hold_put_again(struct etcd_backend *s, const struct dlock__hold *h,
                               const char *value, const char *verb, int *code,
                               const struct etcd_limits *lim);

/* A failure RC of a request cut short by the wait W's deadline is that
 * wait's timeout (DLOCK_ETIMEDOUT; the message, kept, says what was cut). */
int dlock__etcd_timed_out(struct dlock__wait *w, int rc);
/* The put of a waiter's key failed with RC: RC as the acquire returns it
 * (dlock__etcd_timed_out()), its message saved into MSG. True when the put
 * may have happened before the reply was lost (or the cancel, or the
 * deadline): the key must be withdrawn. */
bool dlock__etcd_put_failed(struct dlock__wait *w, int *rc, char *msg);
/* The wait for our turn failed with RC: RC as the acquire returns it. A
 * timeout or a cancel keeps in MSG the reason of the last failed look (an
 * outage; empty: none); any other failure saves its message there.
 * *ANSWERING: the cluster still answered (no failed look and RC not
 * transient), so the withdraw of our key may take a grace. */
int dlock__etcd_wait_failed(struct dlock__wait *w, int rc, char *msg, bool *answering);
/* A waiter's key or lease vanished: it starts again (mutex.c, semaphore.c). */
#define ETCD_RESTART 1
/* While a waiter sleeps: refresh the waiters' lease WL and the lease LR
 * the hold will hang on, each when its keepalive is due. ETCD_RESTART
 * when one of them expired (marked dead), DLOCK_ECANCELED, or DLOCK_OK to
 * go on -- after a failed keepalive too, its message kept in MSG: the
 * next look tells. */
int dlock__etcd_waiter_keepalive(struct etcd_backend *s, struct lease_ref *wl,
                                 struct lease_ref *lr, char *msg, const struct etcd_limits *lim);
/* A lock's acquire cut into steps (mutex.c): the blocking acquire runs
 * them in a row and sleeps where they say; the asynchronous one
 * (async.c) runs one step per attempt and parks its wait instead. */
struct etcd_acquire;
#define ETCD_SLEEP 3 /* a step's "wait": until a wake of W or *UNTIL */
/* An acquire of hold H bounded by W (its deadline and cancel); NULL
 * with a message when out of memory. */
struct etcd_acquire *dlock__etcd_acquire_new(struct etcd_backend *s, struct dlock__hold *h,
                                             struct dlock__wait *w);
/* Run A on from where it is (after a sleep: the watch's error and the
 * leases' keepalives first) until H is held (DLOCK_OK), it must wait
 * (ETCD_SLEEP: its key queued and the key before it watched -- the
 * watch wakes W -- or stepped out for a lock-delay, until *UNTIL), or it
 * ended: EBUSY (a try-once), ETIMEDOUT, ECANCELED or a failure, nothing
 * left queued but what is owed to the keeper. Never sleeps itself; every
 * request ends by W's deadline or its cancel. */
int dlock__etcd_acquire_step(struct etcd_acquire *a, struct dlock__wait *w, int64_t *until);
/* End A, which waits (ETCD_SLEEP) or stepped out, with RC (ETIMEDOUT,
 * ECANCELED): its queued key withdrawn -- owed to the keeper after a
 * timeout or a cancel -- RC returned with the failure of the wait's last
 * request, if any (an outage). After any other end: RC as it is. */
int dlock__etcd_acquire_give_up(struct etcd_acquire *a, struct dlock__wait *w, int rc);
/* A, which just ended with a transient failure (given up, nothing
 * queued), starts over at its next step; its message is kept for a
 * give-up. */
void dlock__etcd_acquire_again(struct etcd_acquire *a);
void dlock__etcd_acquire_free(struct etcd_acquire *a);
/* async.c: the lock ops' try_armed and disarm (backend.h). */
int dlock__etcd_try_armed(void *state, struct dlock__hold *h, struct dlock__wait *w, void **park);
int dlock__etcd_disarm(void *state, struct dlock__hold *h, struct dlock__wait *w, void *park,
                       int rc);
/* When LR's next keepalive is due (a third of its TTL after the last). */
int64_t dlock__etcd_keepalive_due(const struct lease_ref *lr);
/* LR was found expired or revoked: a shared one is granted anew. */
void dlock__etcd_lease_dead(struct etcd_backend *s, const struct lease_ref *lr);

/* ============================================================ multi.c */

/* The multi ops' acquire: an exclusive set in one transaction
 * (backend.h); DLOCK_ENOTSUP for a shared one or members on leases of their
 * own. */
int dlock__etcd_multi_acquire(void *state, struct dlock__hold **hs, size_t n,
                              struct dlock__wait *w, size_t *busy);
/* The multi ops' release: every member's guarded delete
 * (dlock__etcd_delete_if_txn) nested in one transaction. */
int dlock__etcd_multi_release(void *state, struct dlock__hold **hs, size_t n, int *rcs);

/* ========================================================== rwmutex.c */

/* The value of a shared hold's key starts with this. */
#define ETCD_SHARED_MARK "dlock shared "

/* The key hold H puts under PFX on lease LEASE (caller frees):
 * "PFX<lease hex>" exclusive (Go's Mutex), "PFX<lease hex>-<owner hex>"
 * shared (one per thread or handle of the client). */
char *dlock__etcd_hold_key(const char *pfx, int64_t lease, const struct dlock__hold *h);
/* The value of H's key: s->ident, or s->shared_ident for a shared hold. */
const char *dlock__etcd_hold_value(struct etcd_backend *s, const struct dlock__hold *h);
/* The backend's downgrade(): exclusive hold H becomes shared in place. */
int dlock__etcd_downgrade(void *state, struct dlock__hold *h);

/* ======================================================== semaphore.c */

int dlock__etcd_sem_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w);
/* The semaphore name of permit key KV ("<prefix>NAME/sem/<hex>_<hex>";
 * caller frees); NULL for any other key. */
char *dlock__etcd_sem_name(struct etcd_backend *s, const json_t *kv);
int dlock__etcd_sem_inspect(void *state, const char *name, unsigned permits,
                            struct dlock_info *info);
/* mutex.c's release(): deletes a hold's key if it is still the one made
 * (the same for a permit's key). */
int dlock__etcd_release(void *state, struct dlock__hold *h);
/* Its pieces, shared with a multi-lock's release (multi.c): the hold's
 * result from the call's RC and whether that txn SUCCEEDED
 * (RESENT: sent again after a lost reply, so a key found gone was most
 * likely ours deleted), a transient failure's delete remembered for
 * later; and EH freed, its own lease revoked (the message of RC kept). */
int dlock__etcd_release_answer(struct etcd_backend *s, struct dlock__hold *h,
                               const struct etcd_hold *eh, int rc, bool succeeded, bool resent);
void dlock__etcd_hold_drop(struct etcd_backend *s, struct etcd_hold *eh, int rc);

/* ========================================================== inspect.c */

int dlock__etcd_inspect(void *state, const char *name, struct dlock_info *info);
/* dlock_check()'s look (admin ops): one range of NAME's keys. */
int dlock__etcd_check(void *state, const char *name, struct dlock__check_view *view);
int dlock__etcd_force_release(void *state, const char *name);
int dlock__etcd_list(void *state, const char *pattern, dlock_list_fn fn, void *arg);
/* The semaphore ops' list: the names of the semaphores with a permit key. */
int dlock__etcd_sem_list(void *state, const char *pattern, dlock_list_fn fn, void *arg);

/* ============================================================= lease.c */

int dlock__etcd_open(struct dlock_client *c, void **state);
void dlock__etcd_close(void *state);
int dlock__etcd_renew(void *state, struct dlock__renew_batch *b);

/* election.c: Go's concurrency.Election (the campaign is the mutex's
 * acquire and release with the proposal as the key's value). */
int dlock__etcd_elect_proclaim(void *state, struct dlock__hold *h, const char *value);
int dlock__etcd_elect_observe(void *state, const char *name, const struct dlock_leader *known,
                              struct dlock__wait *w, struct dlock_leader *out);

/* ============================================================== span.c */

/* A kv of a range reply as dlock__etcd_span_scan() read it: its key's
 * base64 text in the reply (KEY, KEY_LEN bytes; ESC: with a JSON escape,
 * which etcd never writes) and its create revision. */
struct etcd_span_kv {
    const char *key;
    size_t key_len;
    bool esc;
    int64_t create_rev;
};
/* A range reply as read: its kvs (N of them, caller frees KVS; LISTED:
 * the elements of its list) and whether etcd has more. */
struct etcd_span_reply {
    struct etcd_span_kv *kvs;
    size_t n, listed;
    bool more;
};
/* Read BODY (LEN bytes), the reply to a /v3/kv/range request, into *R
 * without a JSON tree, checked as dlock__etcd_check_reply() checks a
 * range's (LABEL and WHAT as in its messages): DLOCK_OK or DLOCK_EPROTO.
 * Free R->kvs either way. */
int dlock__etcd_span_scan(const char *body, size_t len, const char *label, const char *what,
                          struct etcd_span_reply *r);

/* ============================================================= delay.c */

/* Lock NAME's lock-delay marker key (caller frees). */
char *dlock__etcd_delay_key(struct etcd_backend *s, const char *name);
/* How a look at a lock-delay marker reads one without a lease (its hold
 * still holds, or ended without a clean release and nobody looked since). */
enum etcd_delay_look {
    ETCD_DELAY_START,   /* its hold ended: start its delay now, on a lease
                           of the delay's TTL (an acquirer whose key came
                           first in the queue) */
    ETCD_DELAY_SHOW,    /* its whole delay, nothing written (inspect of a
                           free name) */
};
/* The op (a request_range's body; NULL: out of memory) that counts
 * NAME's lock-delay marker, put into the acquire's own txn: the txn that
 * finds the key first tells in the same round trip whether the name may
 * be in a delay, and only then is it looked at (delay_look). */
json_t *dlock__etcd_delay_probe(struct etcd_backend *s, const char *name);
/* Did response K of txn REPLY, a delay_probe's, count no marker? */
bool dlock__etcd_delay_absent(json_t *reply, size_t k);
/* *LEFT: the ms left of NAME's lock-delay (0: none), as HOW says. */
int dlock__etcd_delay_look(struct etcd_backend *s, const char *name, enum etcd_delay_look how,
                           int64_t *left, const struct etcd_limits *lim);
/* The marker of exclusive hold H (its token set), kept until its clean
 * release: no lease. */
int dlock__etcd_delay_arm(struct etcd_backend *s, const struct dlock__hold *h,
                          const struct etcd_limits *lim);
/* TXN (taken over; NULL: out of memory), the txn that ends the
 * exclusive part of NAME's hold of TOKEN (a release, a downgrade), with
 * that hold's lock-delay marker (DELAY_MS; 0: none, TXN as it is)
 * deleted in its success branch if still the hold's -- a nested txn
 * comparing the marker's value: a clean end leaves no delay, and no
 * contender the txn wakes finds the marker first. NULL: out of memory. */
json_t *dlock__etcd_delay_clear_in(struct etcd_backend *s, json_t *txn, const char *name,
                                   uint64_t token, int64_t delay_ms);

#endif
