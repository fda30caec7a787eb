/* util.c -- small things several parts of the library need: clocks,
 * durations, thread ids and starts, strings, UUIDs and glob matching. */
#include <ctype.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "toolbox.h"

int64_t dlock__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void dlock__cond_init_monotonic(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

void dlock__timed_mutex_init(struct dlock__timed_mutex *m)
{
    pthread_mutex_init(&m->mu, NULL);
    dlock__cond_init_monotonic(&m->cv);
    m->held = false;
}

void dlock__timed_mutex_destroy(struct dlock__timed_mutex *m)
{
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
}

bool dlock__timed_mutex_lock(struct dlock__timed_mutex *m, int64_t until_ms)
{
    struct timespec abs = {(time_t)(until_ms / 1000), (long)(until_ms % 1000) * 1000000};
    pthread_mutex_lock(&m->mu);
    while (m->held && dlock__now_ms() < until_ms)
        pthread_cond_timedwait(&m->cv, &m->mu, &abs);
    bool got = !m->held;
    if (got)
        m->held = true;
    pthread_mutex_unlock(&m->mu);
    return got;
}

void dlock__timed_mutex_unlock(struct dlock__timed_mutex *m)
{
    pthread_mutex_lock(&m->mu);
    m->held = false;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
}

int64_t dlock__wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t dlock__deadline(int64_t wait_ms)
{
    if (wait_ms == 0)
        return 0;
    if (wait_ms < 0)
        return DLOCK__NEVER;
    int64_t now = dlock__now_ms();
    return wait_ms > DLOCK__NEVER - now ? DLOCK__NEVER : now + wait_ms;
}

/* DIGITS[.DIGITS][ms|s|m|h], read with integers: no sign, no spaces, no
 * exponent, no hex, no "nan" or "inf" (strtod accepted all of these, and
 * a NaN cast to int64_t is undefined). Fractions finer than a nanosecond
 * of the unit are dropped; the result is rounded to the nearest ms. */
int64_t dlock__parse_duration(const char *s)
{
    if (!s || !isdigit((unsigned char)*s))
        return -1;
    uint64_t whole = 0, frac = 0, frac_scale = 1;
    for (; isdigit((unsigned char)*s); s++) {
        whole = whole * 10 + (uint64_t)(*s - '0');
        if (whole > 1000000000000ULL) /* 1e12: beyond any sane duration */
            return -1;
    }
    if (*s == '.') {
        s++;
        if (!isdigit((unsigned char)*s))
            return -1;
        for (; isdigit((unsigned char)*s); s++)
            if (frac_scale < 1000000000ULL) {
                frac = frac * 10 + (uint64_t)(*s - '0');
                frac_scale *= 10;
            }
    }
    uint64_t scale;
    if (*s == 0 || strcmp(s, "ms") == 0)
        scale = 1;
    else if (strcmp(s, "s") == 0)
        scale = 1000;
    else if (strcmp(s, "m") == 0)
        scale = 60000;
    else if (strcmp(s, "h") == 0)
        scale = 3600000;
    else
        return -1;
    /* whole <= 1e12 and scale <= 3.6e6: at most 3.6e18 < INT64_MAX */
    return (int64_t)(whole * scale + (frac * scale + frac_scale / 2) / frac_scale);
}

static _Thread_local long cached_tid;
static pid_t cached_pid;
static uint64_t fork_gen;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

/* In the child, only the forking thread runs: its cached thread id and
 * the process id are the parent's until refreshed here. */
static void after_fork_in_child(void)
{
    cached_tid = 0;
    __atomic_store_n(&cached_pid, getpid(), __ATOMIC_RELAXED);
    __atomic_add_fetch(&fork_gen, 1, __ATOMIC_RELAXED);
}

static void watch_forks(void)
{
    __atomic_store_n(&cached_pid, getpid(), __ATOMIC_RELAXED);
    pthread_atfork(NULL, NULL, after_fork_in_child);
}

int dlock__thread_start(pthread_t *t, void *(*main)(void *), void *arg)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(t, NULL, main, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return err;
}

long dlock__tid(void)
{
    if (!cached_tid) {
        pthread_once(&fork_once, watch_forks);
        cached_tid = (long)syscall(SYS_gettid);
    }
    return cached_tid;
}

pid_t dlock__pid(void)
{
    pthread_once(&fork_once, watch_forks);
    return __atomic_load_n(&cached_pid, __ATOMIC_RELAXED);
}

uint64_t dlock__fork_gen(void)
{
    pthread_once(&fork_once, watch_forks);
    return __atomic_load_n(&fork_gen, __ATOMIC_RELAXED);
}

char *dlock__strdup(const char *s)
{
    return s ? strdup(s) : NULL;
}

char *dlock__sprintf(const char *fmt, ...)
{
    va_list ap;
    char *s;
    va_start(ap, fmt);
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    return n < 0 ? NULL : s;
}

void dlock__uuid(char buf[37])
{
    unsigned char b[16];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
        /* No entropy source: mix time, pid and an address. */
        uint64_t x = (uint64_t)dlock__wall_ms() ^ ((uint64_t)getpid() << 32) ^ (uintptr_t)buf;
        for (int i = 0; i < 16; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            b[i] = (unsigned char)x;
        }
    }
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
    snprintf(buf, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

bool dlock__glob(const char *pattern, const char *name)
{
    return !pattern || fnmatch(pattern, name, 0) == 0;
}

const char *dlock_version(void)
{
#define DLOCK__STR2(x) #x
#define DLOCK__STR(x) DLOCK__STR2(x)
    return DLOCK__STR(DLOCK_VERSION_MAJOR) "." DLOCK__STR(DLOCK_VERSION_MINOR) "." DLOCK__STR(
        DLOCK_VERSION_PATCH);
}

unsigned dlock_version_number(void)
{
    return DLOCK_VERSION_NUMBER;
}
