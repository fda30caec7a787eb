/* redlock_stalled.c -- what one stopped node costs a Redlock client:
 * acquire and release of one name on a redlock:// URL, ROUNDS times with
 * every node answering (the baseline), then ROUNDS times with one node
 * stopped (SIGSTOP to STOPPED_PID, continued at the end), in the same
 * run. Prints the median and p90 of each call in each phase.
 *
 * The same name by the same owner each time is the case that cost most:
 * an acquire the stopped node never answered leaves a cancel owed to it,
 * which must reach the node before the owner's next acquire there.
 *
 *   redlock_stalled REDLOCK_URL STOPPED_PID [ROUNDS]    (default 300)
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <time.h>

#include "dlock.h"

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* ROUNDS acquire+release of L, the times of each call into ACQ and REL
 * (sorted); false (with the message on stderr) when a call fails. */
static int measure(dlock_lock *l, int rounds, double *acq, double *rel)
{
    for (int i = 0; i < rounds; i++) {
        double t0 = now_us();
        int rc = dlock_acquire(l, 0);
        double t1 = now_us();
        if (rc == DLOCK_OK)
            rc = dlock_release(l);
        double t2 = now_us();
        if (rc) {
            fprintf(stderr, "redlock_stalled: round %d: %s: %s\n", i, dlock_err_name(rc),
                    dlock_errmsg());
            return 0;
        }
        acq[i] = t1 - t0;
        rel[i] = t2 - t1;
    }
    qsort(acq, (size_t)rounds, sizeof *acq, cmp);
    qsort(rel, (size_t)rounds, sizeof *rel, cmp);
    return 1;
}

static void print(const char *phase, int rounds, const double *acq, const double *rel)
{
    printf("  %-22s acquire p50 %9.0f us  p90 %9.0f us   release p50 %7.0f us  p90 %7.0f us\n",
           phase, acq[rounds / 2], acq[rounds * 9 / 10], rel[rounds / 2], rel[rounds * 9 / 10]);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: redlock_stalled REDLOCK_URL STOPPED_PID [ROUNDS]\n");
        return 2;
    }
    pid_t stopped = (pid_t)atol(argv[2]);
    int rounds = argc > 3 ? atoi(argv[3]) : 300;
    if (rounds < 10)
        rounds = 10;
    dlock_client *c;
    dlock_lock *l;
    if (dlock_open(argv[1], &c) || dlock_lock_new(c, "bench-stalled", DLOCK_EXCLUSIVE, 0, &l)) {
        fprintf(stderr, "redlock_stalled: %s\n", dlock_errmsg());
        return 1;
    }
    double *acq = calloc((size_t)rounds, sizeof *acq), *rel = calloc((size_t)rounds, sizeof *rel);
    if (!acq || !rel)
        return 1;
    printf("== redlock, one node stopped: %d acquire+release of one name per phase\n", rounds);
    int ok = measure(l, rounds, acq, rel);
    if (ok)
        print("every node answering", rounds, acq, rel);
    if (ok && kill(stopped, SIGSTOP) == 0) {
        ok = measure(l, rounds, acq, rel);
        kill(stopped, SIGCONT);
        if (ok)
            print("one node stopped", rounds, acq, rel);
    }
    dlock_lock_free(l);
    dlock_client_close(c);
    free(acq);
    free(rel);
    return ok ? 0 : 1;
}
