/* etcd_http.h -- the etcd backend's transport: etcd v3's JSON gateway over
 * libcurl, shared by the lock logic in etcd.c and nothing else.
 *
 * It knows endpoints, connections, authentication tokens and watch
 * streams; it knows nothing about locks. Every call returns DLOCK_OK or a
 * DLOCK_E* code with a message (dlock__err) that names the endpoint(s)
 * tried and quotes etcd's own words.
 */
#ifndef DLOCK_ETCD_HTTP_H
#define DLOCK_ETCD_HTTP_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "core.h"

struct etcd_conn;

struct etcd_conn_config {
    const struct dlock__host *hosts; /* ports already defaulted */
    size_t nhosts;
    bool tls;                        /* https:// */
    const char *tls_ca, *tls_cert, *tls_key;
    const char *user, *password;     /* NULL user = no authentication */
    int64_t connect_timeout_ms, op_timeout_ms;
    const char *label;               /* "etcd 127.0.0.1:2379,..." for messages */
};

/* Make a transport (copies what it needs from CFG) and, with a user,
 * authenticate once so a wrong password fails here. */
int etcd_conn_new(const struct etcd_conn_config *cfg, struct etcd_conn **out);
void etcd_conn_free(struct etcd_conn *k);
/* "etcd 127.0.0.1:2379,127.0.0.1:2380" */
const char *etcd_conn_label(const struct etcd_conn *k);

/* POST REQ (borrowed) to PATH ("/v3/kv/txn") on the first endpoint that
 * answers, starting with the last one that did. On DLOCK_OK *REPLY owns
 * the decoded answer. WHAT names the operation in messages ("acquire
 * 'jobs'"). An expired auth token is renewed and the call retried once.
 * Errors: DLOCK_ECONN (no endpoint reachable: the message lists each
 * with curl's reason), DLOCK_EAUTH, DLOCK_EUNAVAIL (no leader, timeouts),
 * DLOCK_EBACKEND (etcd refused: its message), DLOCK_EPROTO. *GRPC_CODE,
 * when not NULL, gets etcd's gRPC status code of a refusal (else 0). */
int etcd_call(struct etcd_conn *k, const char *path, json_t *req, json_t **reply,
              const char *what, int *grpc_code);
/* The same; *RESENT turns true when the request went out to an endpoint
 * whose reply was lost and was then sent again to another: the answer
 * may describe a state our first attempt already changed. */
int etcd_call_resent(struct etcd_conn *k, const char *path, json_t *req, json_t **reply,
                     const char *what, int *grpc_code, bool *resent);

/* Limits of one call beyond the connection's own timeouts. */
struct etcd_limits {
    int64_t until;         /* monotonic ms: no request runs past it, and no
                              further endpoint is tried after it; 0 = none */
    struct dlock__wait *w; /* a wait whose cancel aborts the call
                              (DLOCK_ECANCELED); NULL = none */
};

/* etcd_call() within LIM (NULL = none). A call cut short by LIM->until
 * fails like a timeout (DLOCK_EUNAVAIL or DLOCK_ECONN); one aborted by a
 * cancel returns DLOCK_ECANCELED. Either way the request may have been
 * applied. */
int etcd_call_lim(struct etcd_conn *k, const char *path, json_t *req, json_t **reply,
                  const char *what, int *grpc_code, bool *resent, const struct etcd_limits *lim);

/* ------------------------------------------------------------- watches */

struct etcd_watch;

/* Watch KEY for its deletion from revision START_REV on (0 = from the
 * moment etcd creates the watch), over its own streaming request driven
 * by the transport's watch thread. W is woken (dlock__wait_wake) when etcd
 * confirms the watch, and when the key is deleted or the stream ends or
 * fails -- then the watch has fired (etcd_watch_fired() turns true) and
 * the caller should look again. */
int etcd_watch_start(struct etcd_conn *k, const char *key, int64_t start_rev,
                     struct dlock__wait *w, struct etcd_watch **out);
bool etcd_watch_fired(struct etcd_watch *wt);
/* Confirmed by etcd and not fired. */
bool etcd_watch_live(struct etcd_watch *wt);
/* Stop and forget the watch: after this returns W is never touched again. */
void etcd_watch_stop(struct etcd_watch *wt);

/* ------------------------------------------------------------- helpers */

/* Base64 of LEN bytes (caller frees); NULL when out of memory. */
char *etcd_b64(const void *data, size_t len);
/* Decode base64 TEXT into a fresh NUL-terminated buffer (*LEN = bytes). */
char *etcd_unb64(const char *text, size_t *len);
/* The smallest key greater than every key starting with PREFIX (etcd's
 * range_end for a prefix), base64-encoded; "AA==" (the \0 key, "every
 * key") for an empty prefix. Caller frees. */
char *etcd_prefix_end_b64(const char *prefix);
/* An int64 field of a gateway reply (encoded as a JSON string, or absent
 * when zero). */
int64_t etcd_int(const json_t *obj, const char *field);

#endif
