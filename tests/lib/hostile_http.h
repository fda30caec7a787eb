/* hostile_http.h -- an HTTP proxy in front of a real etcd whose replies a
 * test can rewrite: a broken or hostile server made on demand. Every
 * request goes on to etcd, which serves it as usual; its reply then
 * passes through the test's rewrite, which may give another body (and
 * status) instead -- a txn that "succeeded" with no responses, a lease
 * granted with a TTL of -1, a refusal whose message carries an escape
 * sequence. etcd itself stays real: what the client did before and after
 * the bad reply changed the server as it would have.
 *
 * One thread accepts; each connection gets a thread of its own. A watch
 * stream (/v3/watch) goes through the rewrite one message at a time: its
 * PATH "/v3/watch", its REQUEST the watch's body, its REPLY one line.
 */
#ifndef DLOCK_TEST_HOSTILE_HTTP_H
#define DLOCK_TEST_HOSTILE_HTTP_H

#include <pthread.h>
#include <stdatomic.h>

/* The reply to send instead of etcd's REPLY (status *STATUS) to a request
 * of PATH with body REQUEST: a malloc'd body (*STATUS may be changed too),
 * or NULL to pass etcd's reply as it is. Called from the proxy's
 * connection threads, one call at a time. */
typedef char *(*tu_http_rewrite_fn)(void *arg, const char *path, const char *request, int *status,
                                    const char *reply);

struct tu_hostile_http {
    int listen_fd, port, target;
    tu_http_rewrite_fn rewrite;
    void *arg;
    atomic_int stop;
    atomic_uint rewritten; /* replies the rewrite replaced so far */
    pthread_mutex_t mu;    /* one rewrite at a time */
    pthread_t thread;
};

/* A proxy on a free port of 127.0.0.1 (H->port) to 127.0.0.1:TARGET, its
 * replies passed through REWRITE(ARG, ...). */
void tu_hostile_http_start(struct tu_hostile_http *h, int target, tu_http_rewrite_fn rewrite,
                           void *arg);
/* Stop accepting; connections still open end with their clients. */
void tu_hostile_http_stop(struct tu_hostile_http *h);

#endif
