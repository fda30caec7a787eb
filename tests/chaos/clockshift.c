/* clockshift.c -- a preloaded library (LD_PRELOAD) of the fault harness
 * that steps one process's wall clock, never the machine's: the harness's
 * clock-step fault.
 *
 * A process started with LD_PRELOAD=clockshift.so and
 * DLOCK_CLOCKSHIFT_FILE=PATH reads CLOCK_REALTIME (clock_gettime,
 * gettimeofday, time) as the real time plus the number of seconds written
 * in PATH ("+5", "-3600"), re-read at most every 50 ms; its monotonic
 * clocks are untouched. The harness writes the file to step a worker's
 * clock or a Redis server's (whose key expiry and token seeds follow the
 * wall clock).
 *
 * Why not libfaketime: 0.9.10 (Debian 12) cannot start redis-server (its
 * jemalloc asks for the time while libfaketime initialises: "Unexpected
 * recursive calls to clock_gettime()"), and its pthread_cond_timedwait
 * misreads CLOCK_MONOTONIC deadlines once the wall clock is stepped. Why
 * not a time namespace: it offsets only the monotonic and boot clocks.
 * Hence this: raw system calls only (no malloc, no stdio, no dlsym), so
 * it is safe however early the process asks for the time.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile long shift_s;           /* the offset in force */
static volatile long long next_read_ns; /* monotonic time of the next look at the file */

static long long mono_ns(void)
{
    struct timespec ts;
    syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The offset, from the file at most every 50 ms (a racy refresh by two
 * threads reads the same file: harmless). */
static long shift(void)
{
    long long now = mono_ns();
    if (now < next_read_ns)
        return shift_s;
    next_read_ns = now + 50000000LL;
    const char *path = getenv("DLOCK_CLOCKSHIFT_FILE");
    if (!path)
        return shift_s = 0;
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return shift_s;
    char buf[32];
    long n = syscall(SYS_read, fd, buf, sizeof buf - 1);
    syscall(SYS_close, fd);
    if (n <= 0)
        return shift_s;
    buf[n] = '\0';
    long v = 0, sign = 1;
    const char *p = buf;
    if (*p == '+' || *p == '-')
        sign = *p++ == '-' ? -1 : 1;
    for (; *p >= '0' && *p <= '9'; p++)
        v = v * 10 + (*p - '0');
    return shift_s = sign * v;
}

int clock_gettime(clockid_t clk, struct timespec *ts)
{
    int rc = (int)syscall(SYS_clock_gettime, clk, ts);
    if (rc == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE))
        ts->tv_sec += shift();
    return rc;
}

/* glibc declares TV nonnull; a caller may still pass NULL */
#pragma GCC diagnostic ignored "-Wnonnull-compare"
int gettimeofday(struct timeval *restrict tv, void *restrict tz)
{
    int rc = (int)syscall(SYS_gettimeofday, tv, tz);
    if (rc == 0 && tv)
        tv->tv_sec += shift();
    return rc;
}

time_t time(time_t *out)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
