/* observe.c -- what a client tells the program about itself: the log hook
 * (dlock_client_set_log: losses, renewal trouble, reconnects, failovers,
 * found by the core and the backends through dlock__log) and the counters
 * of dlock_client_stats(). Both are per client and cost an atomic load
 * when nobody listens, so the keeper and the backends call them freely.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

int dlock_client_set_log(dlock_client *c, dlock_log_fn fn, void *arg, dlock_log_level max_level)
{
    dlock__msg_clear();
    if (!c)
        return dlock__err(DLOCK_EINVAL, "dlock_client_set_log: client is NULL");
    if (max_level < DLOCK_LOG_ERROR || max_level > DLOCK_LOG_DEBUG)
        return dlock__err(DLOCK_EINVAL, "dlock_client_set_log: level %d is not a dlock_log_level",
                          (int)max_level);
    int rc = dlock__check_fork(c);
    if (rc)
        return rc;
    pthread_mutex_lock(&c->log_mu);
    c->log_fn = fn;
    c->log_arg = arg;
    __atomic_store_n(&c->log_level, fn ? (int)max_level : 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&c->log_mu);
    return DLOCK_OK;
}

static void vlog(struct dlock_client *c, int level, const char *fmt, va_list ap)
{
    char raw[1024], msg[1024];
    vsnprintf(raw, sizeof raw, fmt, ap);
    for (char *p = raw; *p; p++) /* one line, as promised */
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    dlock__escape_text(msg, sizeof msg, raw); /* server text and names quoted */
    pthread_mutex_lock(&c->log_mu);
    if (c->log_fn && level <= c->log_level)
        c->log_fn(c, (dlock_log_level)level, msg, c->log_arg);
    pthread_mutex_unlock(&c->log_mu);
}

void dlock__log(struct dlock_client *c, int level, const char *fmt, ...)
{
    if (!c || level > __atomic_load_n(&c->log_level, __ATOMIC_ACQUIRE))
        return;
    va_list ap;
    va_start(ap, fmt);
    vlog(c, level, fmt, ap);
    va_end(ap);
}

void dlock__reconnected(struct dlock_client *c, const char *fmt, ...)
{
    DLOCK__COUNT(c, reconnects, 1);
    if (DLOCK_LOG_INFO > __atomic_load_n(&c->log_level, __ATOMIC_ACQUIRE))
        return;
    va_list ap;
    va_start(ap, fmt);
    vlog(c, DLOCK_LOG_INFO, fmt, ap);
    va_end(ap);
}

int dlock_client_stats(const dlock_client *c, dlock_stats *st)
{
    dlock__msg_clear();
    if (!c || !st)
        return dlock__err(DLOCK_EINVAL, "dlock_client_stats: a NULL argument");
    size_t size = st->size;
    if (size < offsetof(dlock_stats, waits))
        return dlock__err(DLOCK_EINVAL,
                          "dlock_client_stats: size %zu is too small (set it to "
                          "sizeof(dlock_stats))",
                          size);
    dlock_stats now;
    const uint64_t *from =
        (const uint64_t *)((const char *)&c->stats + offsetof(dlock_stats, acquisitions));
    uint64_t *to = (uint64_t *)((char *)&now + offsetof(dlock_stats, acquisitions));
    for (size_t i = 0; i < (sizeof now - offsetof(dlock_stats, acquisitions)) / sizeof *to; i++)
        to[i] = __atomic_load_n(&from[i], __ATOMIC_RELAXED);
    now.size = size < sizeof now ? size : sizeof now;
    memcpy(st, &now, now.size);
    return DLOCK_OK;
}
