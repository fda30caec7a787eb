/* async_event.c -- a libevent program that takes and releases a lock
 * without blocking its loop: while the acquire waits, a timer on the same
 * event_base keeps ticking. examples/async_uv.c is the same program on
 * libuv.
 *
 *   async_event URL [NAME] [WAIT_MS]     (defaults: "job", 10000)
 *
 * The loop ticks every 50 ms; the acquire waits up to WAIT_MS; once held,
 * the lock is kept 200 ms (a timer, not a sleep) and released. It prints
 * a line once the acquire started, then the token, how long the acquire
 * waited and how often the timer fired meanwhile. Exit status 0 when the
 * lock was taken and given back.
 * Waits park on redis://, zk://, etcd:// and file:// (docs/architecture.md,
 * "Asynchronous calls").
 */
#define _DEFAULT_SOURCE /* event2 needs the POSIX types */
#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "dlock.h"
#include "dlock/adapters/libevent.h"

struct app {
    struct event_base *base;
    struct event *tick, *hold;
    dlock_client *client;
    dlock_lock *lock;
    dlock_event *watch;
    unsigned ticks;
    int64_t started; /* ms, monotonic */
    int status;
};

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    ((struct app *)arg)->ticks++;
}

static void finish(struct app *a, int status)
{
    a->status = status;
    event_del(a->tick);
    event_del(a->hold);
    dlock_event_detach(a->watch); /* the base then has nothing left: the loop returns */
    a->watch = NULL;
}

static void on_released(dlock_lock *l, int rc, void *arg)
{
    (void)l;
    struct app *a = arg;
    if (rc)
        fprintf(stderr, "release: %s\n", dlock_errmsg());
    else
        printf("released\n");
    finish(a, rc ? 1 : 0);
}

static void on_hold_over(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct app *a = arg;
    if (dlock_release_async(a->lock, on_released, a)) {
        fprintf(stderr, "release: %s\n", dlock_errmsg());
        finish(a, 1);
    }
}

static void on_acquired(dlock_lock *l, int rc, void *arg)
{
    struct app *a = arg;
    if (rc) {
        fprintf(stderr, "acquire: %s\n", dlock_errmsg());
        finish(a, 1);
        return;
    }
    uint64_t token = 0;
    dlock_token(l, &token);
    printf("acquired: token %" PRIu64 " after %" PRId64 " ms; the loop ticked %u times meanwhile\n",
           token, now_ms() - a->started, a->ticks);
    struct timeval hold = {0, 200 * 1000};
    event_add(a->hold, &hold);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s URL [NAME] [WAIT_MS]\n", argv[0]);
        return 2;
    }
    struct app a = {.status = 1};
    int64_t wait_ms = argc > 3 ? atoll(argv[3]) : 10000;
    if (!(a.base = event_base_new())) {
        fprintf(stderr, "event_base_new failed\n");
        return 1;
    }
    if (dlock_open(argv[1], &a.client) ||
        dlock_lock_new(a.client, argc > 2 ? argv[2] : "job", DLOCK_EXCLUSIVE,
                       DLOCK_LOCK_HANDLE_OWNED, &a.lock) ||
        dlock_event_attach(a.base, a.client, &a.watch)) {
        fprintf(stderr, "%s\n", dlock_errmsg());
        return 1;
    }
    a.tick = event_new(a.base, -1, EV_PERSIST, on_tick, &a);
    a.hold = evtimer_new(a.base, on_hold_over, &a);
    struct timeval every = {0, 50 * 1000};
    event_add(a.tick, &every);
    a.started = now_ms();
    if (dlock_acquire_async(a.lock, wait_ms, NULL, on_acquired, &a)) {
        fprintf(stderr, "acquire: %s\n", dlock_errmsg());
        finish(&a, 1);
    } else {
        printf("waiting for %s (up to %" PRId64 " ms)\n", dlock_lock_name(a.lock), wait_ms);
        fflush(stdout); /* now, not at exit: someone may watch for it */
    }
    event_base_dispatch(a.base);
    event_free(a.tick);
    event_free(a.hold);
    dlock_lock_free(a.lock);
    dlock_client_close(a.client);
    event_base_free(a.base);
    return a.status;
}
