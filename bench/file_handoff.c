/* file_handoff.c -- hand-off latency on the file backend beside the
 * kernel's flock(2) (what flock(1) uses), measured in the same run.
 *
 * Two processes take turns: the holder waits until the other is blocked
 * in its acquire, stamps the time and releases; the waiter stamps the
 * time it got the lock. Latency = acquire stamp - release stamp, on the
 * monotonic clock shared through an anonymous shared mapping. Prints the
 * median and p99 of each and their ratio.
 *
 *   file_handoff [ROUNDS]   (default 2000)
 */
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dlock.h"

struct shared {
    _Atomic int waiting[2]; /* process k is about to block */
    _Atomic long released_ns;
    _Atomic int round;
    long lat_ns[];
};

static long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

struct locker {
    int (*acquire)(void *);
    int (*release)(void *);
    void *arg;
};

static int flock_acquire(void *arg)
{
    return flock(*(int *)arg, LOCK_EX);
}
static int flock_release(void *arg)
{
    return flock(*(int *)arg, LOCK_UN);
}
static int dl_acquire(void *arg)
{
    return dlock_acquire(arg, DLOCK_FOREVER);
}
static int dl_release(void *arg)
{
    return dlock_release(arg);
}

/* Process ME of two: take turns ROUNDS times in all. */
static void play(struct shared *s, int me, int rounds, struct locker *lk)
{
    for (;;) {
        s->waiting[me] = 1;
        if (lk->acquire(lk->arg))
            exit(2);
        long t = now_ns();
        s->waiting[me] = 0;
        int r = s->round;
        if (r >= rounds) {
            lk->release(lk->arg);
            return;
        }
        if (s->released_ns)
            s->lat_ns[r] = t - s->released_ns;
        s->round = r + 1;
        /* Hand over only once the other is asleep in its acquire. */
        while (!s->waiting[!me] && s->round <= rounds)
            sched_yield();
        usleep(300);
        s->released_ns = now_ns();
        lk->release(lk->arg);
        /* Let the other take it before we queue again. */
        while (s->round == r + 1 && r + 1 < rounds)
            sched_yield();
        if (r + 1 >= rounds)
            return;
    }
}

static int cmp(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

static void measure(const char *label, int rounds, const char *dir, int use_dlock, double *median,
                    double *p99)
{
    struct shared *s = mmap(NULL, sizeof *s + (size_t)rounds * sizeof(long), PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(s, 0, sizeof *s);
    pid_t kids[2];
    for (int k = 0; k < 2; k++) {
        if ((kids[k] = fork()) == 0) {
            struct locker lk;
            int fd;
            if (use_dlock) {
                char url[512];
                snprintf(url, sizeof url, "file://%s", dir);
                dlock_client *c;
                dlock_lock *l;
                if (dlock_open(url, &c) || dlock_lock_new(c, "handoff", DLOCK_EXCLUSIVE, 0, &l)) {
                    fprintf(stderr, "%s\n", dlock_errmsg());
                    _exit(1);
                }
                lk = (struct locker){dl_acquire, dl_release, l};
            } else {
                char path[512];
                snprintf(path, sizeof path, "%s/flock-handoff", dir);
                fd = open(path, O_RDWR | O_CREAT, 0644);
                lk = (struct locker){flock_acquire, flock_release, &fd};
            }
            play(s, k, rounds, &lk);
            _exit(0);
        }
    }
    for (int k = 0; k < 2; k++)
        waitpid(kids[k], NULL, 0);
    int n = 0;
    long *lat = malloc((size_t)rounds * sizeof *lat);
    for (int i = 0; i < rounds; i++)
        if (s->lat_ns[i] > 0)
            lat[n++] = s->lat_ns[i];
    qsort(lat, (size_t)n, sizeof *lat, cmp);
    *median = n ? lat[n / 2] / 1000.0 : 0;
    *p99 = n ? lat[n * 99 / 100] / 1000.0 : 0;
    printf("  %-28s %6d hand-offs  median %8.1f us  p99 %8.1f us\n", label, n, *median, *p99);
    free(lat);
    munmap(s, sizeof *s + (size_t)rounds * sizeof(long));
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 2000;
    char dir[] = "/tmp/dlock-bench-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    double fm, fp, dm, dp;
    printf("file backend hand-off (release -> waiting process acquires), %d rounds\n", rounds);
    measure("flock(2) baseline", rounds, dir, 0, &fm, &fp);
    measure("dlock file://", rounds, dir, 1, &dm, &dp);
    printf("  ratio dlock/flock: median %.2fx  p99 %.2fx  (target: median <= 1.5x)\n", dm / fm,
           dp / fp);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : 1;
}
