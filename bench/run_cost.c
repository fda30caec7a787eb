/* run_cost.c -- the per-run cost of `dlock run NAME true` beside
 * `flock FILE true`, measured in the same run: each command is started
 * RUNS times in alternation (so both see the same machine load) and the
 * median and p99 wall times are compared.
 *
 *   run_cost DLOCK_BIN [RUNS]    (default 300)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double run_once(char *const argv[], char *const envp[])
{
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    pid_t pid = fork();
    if (pid == 0) {
        execve(argv[0], argv, envp);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
        fprintf(stderr, "run_cost: %s failed (%#x)\n", argv[0], st);
        exit(1);
    }
    return (b.tv_sec - a.tv_sec) * 1e6 + (b.tv_nsec - a.tv_nsec) / 1e3;
}

static int cmp(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: run_cost DLOCK_BIN [RUNS]\n");
        return 64;
    }
    int runs = argc > 2 ? atoi(argv[2]) : 300;
    char dir[] = "/tmp/dlock-bench-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char url[600], file[600], envurl[700];
    snprintf(url, sizeof url, "file://%s", dir);
    snprintf(file, sizeof file, "%s/flock-file", dir);
    snprintf(envurl, sizeof envurl, "DLOCK_URL=%s", url);
    char *dl[] = {argv[1], "run", "bench", "/bin/true", NULL};
    char *fl[] = {"/usr/bin/flock", file, "/bin/true", NULL};
    char *envp[] = {envurl, "PATH=/usr/bin:/bin", NULL};
    double *d = malloc(sizeof(double) * (size_t)runs), *f = malloc(sizeof(double) * (size_t)runs);
    for (int i = 0; i < runs; i++) {
        f[i] = run_once(fl, envp);
        d[i] = run_once(dl, envp);
    }
    qsort(d, (size_t)runs, sizeof *d, cmp);
    qsort(f, (size_t)runs, sizeof *f, cmp);
    printf("per-run cost of a locked /bin/true, %d runs each, alternating\n", runs);
    printf("  %-28s median %8.1f us  p99 %8.1f us\n", "flock FILE true", f[runs / 2],
           f[runs * 99 / 100]);
    printf("  %-28s median %8.1f us  p99 %8.1f us\n", "dlock run NAME true", d[runs / 2],
           d[runs * 99 / 100]);
    printf("  ratio dlock/flock: median %.2fx  (target: <= 2x)\n", d[runs / 2] / f[runs / 2]);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : 1;
}
