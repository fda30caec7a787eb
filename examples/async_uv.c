/* async_uv.c -- a libuv program that takes and releases a lock without
 * blocking its loop: while the acquire waits, a timer on the same loop
 * keeps ticking.
 *
 *   async_uv URL [NAME] [WAIT_MS]     (defaults: "job", 10000)
 *
 * The loop ticks every 50 ms; the acquire waits up to WAIT_MS; once held,
 * the lock is kept 200 ms (a timer, not a sleep) and released. It prints
 * a line once the acquire started, then the token, how long the acquire
 * waited and how often the timer fired meanwhile. Exit status 0 when the
 * lock was taken and given back.
 * Waits park on redis://, zk://, etcd:// and file:// (docs/architecture.md,
 * "Asynchronous calls").
 */
#define _DEFAULT_SOURCE /* uv.h needs the POSIX types */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <uv.h>

#include "dlock.h"
#include "dlock/adapters/libuv.h"

struct app {
    uv_loop_t *loop;
    uv_timer_t tick, hold;
    dlock_client *client;
    dlock_lock *lock;
    dlock_uv *watch;
    unsigned ticks, ticks_at_acquire;
    uint64_t started;
    int status;
};

static void on_tick(uv_timer_t *t)
{
    ((struct app *)t->data)->ticks++;
}

static void finish(struct app *a, int status)
{
    a->status = status;
    uv_timer_stop(&a->tick);
    uv_close((uv_handle_t *)&a->tick, NULL);
    uv_close((uv_handle_t *)&a->hold, NULL);
    dlock_uv_detach(a->watch); /* the loop then has nothing left: uv_run returns */
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

static void on_hold_over(uv_timer_t *t)
{
    struct app *a = t->data;
    int rc = dlock_release_async(a->lock, on_released, a);
    if (rc) {
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
    a->ticks_at_acquire = a->ticks;
    printf("acquired: token %" PRIu64 " after %" PRIu64 " ms; the loop ticked %u times meanwhile\n",
           token, uv_now(a->loop) - a->started, a->ticks);
    uv_timer_start(&a->hold, on_hold_over, 200, 0);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s URL [NAME] [WAIT_MS]\n", argv[0]);
        return 2;
    }
    struct app a = {.loop = uv_default_loop(), .status = 1};
    int64_t wait_ms = argc > 3 ? atoll(argv[3]) : 10000;
    if (dlock_open(argv[1], &a.client) ||
        dlock_lock_new(a.client, argc > 2 ? argv[2] : "job", DLOCK_EXCLUSIVE,
                       DLOCK_LOCK_HANDLE_OWNED, &a.lock) ||
        dlock_uv_attach(a.loop, a.client, &a.watch)) {
        fprintf(stderr, "%s\n", dlock_errmsg());
        return 1;
    }
    uv_timer_init(a.loop, &a.tick);
    uv_timer_init(a.loop, &a.hold);
    a.tick.data = a.hold.data = &a;
    uv_timer_start(&a.tick, on_tick, 50, 50);
    a.started = uv_now(a.loop);
    if (dlock_acquire_async(a.lock, wait_ms, NULL, on_acquired, &a)) {
        fprintf(stderr, "acquire: %s\n", dlock_errmsg());
        finish(&a, 1);
    } else {
        printf("waiting for %s (up to %" PRId64 " ms)\n", dlock_lock_name(a.lock), wait_ms);
        fflush(stdout); /* now, not at exit: someone may watch for it */
    }
    uv_run(a.loop, UV_RUN_DEFAULT);
    dlock_lock_free(a.lock);
    dlock_client_close(a.client);
    uv_loop_close(a.loop);
    return a.status;
}
