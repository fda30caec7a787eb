/* dlock/adapters/libevent.h -- dlock's asynchronous calls on a libevent
 * event_base.
 *
 * Header-only, as hiredis's adapters are: static functions that watch
 * the client's completion descriptor (dlock_client_fd()) with a
 * persistent EV_READ event and run dlock_dispatch() on the loop's thread
 * when it is readable, so every callback of dlock_acquire_async() and
 * dlock_release_async() runs there. Nothing of libevent is in dlock.h:
 * only a program that includes this file needs event2/event.h and
 * -levent.
 *
 *     dlock_event *w;
 *     dlock_event_attach(base, client, &w); // in the loop's thread
 *     dlock_acquire_async(lock, 5000, NULL, on_acquired, NULL);
 *     event_base_dispatch(base);
 *     ...
 *     dlock_event_detach(w);       // before dlock_client_close()
 */
#ifndef DLOCK_ADAPTERS_LIBEVENT_H
#define DLOCK_ADAPTERS_LIBEVENT_H

#include <event2/event.h>
#include <stdlib.h>

#include <dlock.h>

typedef struct dlock_event {
    struct event *ev;
    dlock_client *client;
} dlock_event;

static inline void dlock_event__readable(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)dlock_dispatch(((dlock_event *)arg)->client);
}

/* Watch CLIENT's completions on BASE; call it in the loop's thread,
 * which becomes the one that runs the callbacks. *OUT: the watcher, for
 * dlock_event_detach(). Returns 0, a dlock code (dlock_client_fd()'s;
 * DLOCK_ENOMEM) or -1 (libevent refused the event). */
static inline int dlock_event_attach(struct event_base *base, dlock_client *client,
                                     dlock_event **out)
{
    int fd = dlock_client_fd(client);
    if (fd < 0)
        return fd;
    dlock_event *w = (dlock_event *)calloc(1, sizeof *w);
    if (!w)
        return DLOCK_ENOMEM;
    w->client = client;
    w->ev = event_new(base, fd, EV_READ | EV_PERSIST, dlock_event__readable, w);
    if (!w->ev || event_add(w->ev, NULL) != 0) {
        if (w->ev)
            event_free(w->ev);
        free(w);
        return -1;
    }
    *out = w;
    return 0;
}

/* Stop watching and free the watcher (before dlock_client_close(),
 * which closes the descriptor). */
static inline void dlock_event_detach(dlock_event *w)
{
    if (!w)
        return;
    event_free(w->ev);
    free(w);
}

#endif /* DLOCK_ADAPTERS_LIBEVENT_H */
