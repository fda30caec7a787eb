/* async_parked.c -- W waiters on one held name of one client: what they
 * cost parked as asynchronous acquires (issue 26) beside W threads
 * blocked in dlock_acquire(), measured the same way: the process's
 * threads and RSS once all wait, then the hand-offs when the holder
 * lets go (each waiter, once it has the lock, releases it at once; the
 * next is woken by the release message).
 *
 *   async_parked URL W [async|blocking]    (default async)
 *
 * RSS per waiter includes its handle. Results by hand in
 * docs/benchmarks.md ("Asynchronous waiters").
 */
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dlock.h"

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = 0;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0)
            v = atol(line + 6);
    if (f)
        fclose(f);
    return v;
}

static int threads_now(void)
{
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static atomic_int done, acquired;
static _Atomic double first_at;

static void took(dlock_lock *l, int rc)
{
    if (rc == DLOCK_OK) {
        double zero = 0;
        atomic_compare_exchange_strong(&first_at, &zero, now_ms());
        atomic_fetch_add(&acquired, 1);
        dlock_release(l);
    }
    atomic_fetch_add(&done, 1);
}

static void on_done(dlock_lock *l, int rc, void *arg)
{
    (void)arg;
    took(l, rc);
}

static void *blocked(void *arg)
{
    dlock_lock *l = arg;
    took(l, dlock_acquire(l, 120000));
    return NULL;
}

/* Dispatch C's completions (FD < 0: just wait) for MS or until W done. */
static void pump(dlock_client *c, int fd, double ms, int w)
{
    double end = now_ms() + ms;
    while (now_ms() < end && atomic_load(&done) < w) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (fd < 0)
            usleep(20000);
        else if (poll(&p, 1, 100) > 0)
            dlock_dispatch(c);
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s URL W [async|blocking]\n", argv[0]);
        return 2;
    }
    int w = atoi(argv[2]);
    int async = argc < 4 || strcmp(argv[3], "blocking") != 0;
    dlock_client *c, *other;
    dlock_lock *holder;
    if (dlock_open(argv[1], &c) || dlock_open(argv[1], &other) ||
        dlock_lock_new(other, "hot", DLOCK_EXCLUSIVE, 0, &holder) ||
        dlock_acquire(holder, DLOCK_TRY)) {
        fprintf(stderr, "%s\n", dlock_errmsg());
        return 1;
    }
    int fd = async ? dlock_client_fd(c) : -1;
    long rss0 = rss_kib();
    int threads0 = threads_now();
    dlock_lock **ls = calloc((size_t)w, sizeof *ls);
    pthread_t *ths = async ? NULL : calloc((size_t)w, sizeof *ths);
    double t0 = now_ms();
    for (int i = 0; i < w; i++) {
        if (dlock_lock_new(c, "hot", DLOCK_EXCLUSIVE, DLOCK_LOCK_HANDLE_OWNED, &ls[i]) ||
            (async && dlock_acquire_async(ls[i], 120000, NULL, on_done, NULL))) {
            fprintf(stderr, "waiter %d: %s\n", i, dlock_errmsg());
            return 1;
        }
        if (!async && pthread_create(&ths[i], NULL, blocked, ls[i])) {
            fprintf(stderr, "waiter %d: no thread\n", i);
            return 1;
        }
    }
    double started = now_ms() - t0;
    pump(c, fd, 3000, w);
    long rss1 = rss_kib();
    int threads1 = threads_now();
    printf("%s W=%d: started in %.0f ms; threads %d -> %d; RSS %ld -> %ld KiB (%.2f KiB per "
           "waiter)\n",
           async ? "async" : "blocking", w, started, threads0, threads1, rss0, rss1,
           (double)(rss1 - rss0) / w);
    double released = now_ms();
    dlock_release(holder);
    pump(c, fd, 120000, w);
    for (int i = 0; !async && i < w; i++)
        pthread_join(ths[i], NULL);
    printf("  after the release: %d of %d acquired in turn, first hand-off %.1f ms, all %.0f ms "
           "(%.2f ms each)\n",
           atomic_load(&acquired), w, atomic_load(&first_at) - released, now_ms() - released,
           (now_ms() - released) / w);
    for (int i = 0; i < w; i++)
        dlock_lock_free(ls[i]);
    dlock_lock_free(holder);
    dlock_client_close(c);
    dlock_client_close(other);
    free(ls);
    free(ths);
    return 0;
}
