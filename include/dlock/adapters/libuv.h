/* dlock/adapters/libuv.h -- dlock's asynchronous calls on a libuv loop.
 *
 * Header-only, as hiredis's adapters are: static functions that watch
 * the client's completion descriptor (dlock_client_fd()) with a uv_poll_t
 * and run dlock_dispatch() on the loop's thread when it is readable, so
 * every callback of dlock_acquire_async() and dlock_release_async() runs
 * there. Nothing of libuv is in dlock.h: only a program that includes
 * this file needs uv.h and -luv.
 *
 *     dlock_uv *w;
 *     dlock_uv_attach(uv_default_loop(), client, &w); // in the loop's thread
 *     dlock_acquire_async(lock, 5000, NULL, on_acquired, NULL);
 *     uv_run(uv_default_loop(), UV_RUN_DEFAULT);
 *     ...
 *     dlock_uv_detach(w);          // before dlock_client_close()
 */
#ifndef DLOCK_ADAPTERS_LIBUV_H
#define DLOCK_ADAPTERS_LIBUV_H

#include <stdlib.h>
#include <uv.h>

#include <dlock.h>

typedef struct dlock_uv {
    uv_poll_t poll;
    dlock_client *client;
} dlock_uv;

static inline void dlock_uv__readable(uv_poll_t *poll, int status, int events)
{
    (void)events;
    if (status == 0)
        (void)dlock_dispatch(((dlock_uv *)poll->data)->client);
}

static inline void dlock_uv__closed(uv_handle_t *handle)
{
    free(handle->data);
}

/* Watch CLIENT's completions on LOOP; call it in the loop's thread, which
 * becomes the one that runs the callbacks. *OUT: the watcher, for
 * dlock_uv_detach(). Returns 0, a dlock code (dlock_client_fd()'s;
 * DLOCK_ENOMEM) or a libuv one (uv_strerror()). */
static inline int dlock_uv_attach(uv_loop_t *loop, dlock_client *client, dlock_uv **out)
{
    int fd = dlock_client_fd(client);
    if (fd < 0)
        return fd;
    dlock_uv *w = (dlock_uv *)calloc(1, sizeof *w);
    if (!w)
        return DLOCK_ENOMEM;
    w->client = client;
    int rc = uv_poll_init(loop, &w->poll, fd);
    if (rc) {
        free(w);
        return rc;
    }
    w->poll.data = w;
    if ((rc = uv_poll_start(&w->poll, UV_READABLE, dlock_uv__readable))) {
        uv_close((uv_handle_t *)&w->poll, dlock_uv__closed);
        return rc;
    }
    *out = w;
    return 0;
}

/* Stop watching (before dlock_client_close(), which closes the
 * descriptor); the watcher's memory goes when the loop has closed it. */
static inline void dlock_uv_detach(dlock_uv *w)
{
    if (!w)
        return;
    uv_poll_stop(&w->poll);
    uv_close((uv_handle_t *)&w->poll, dlock_uv__closed);
}

#endif /* DLOCK_ADAPTERS_LIBUV_H */
