/* wait.c -- how an acquire sleeps: until a backend's notification, a
 * cancel from another thread, the caller's deadline, or a safety-net time
 * (the lock's remaining TTL) -- never on a polling timer.
 *
 * Backends with a notification thread (Redis pub/sub, etcd watch,
 * ZooKeeper watch) sleep on the condition variable and are woken through
 * dlock__wait_wake(); backends whose event is a file descriptor (the file
 * backend's inotify) sleep in poll() beside an eventfd that a cancel makes
 * readable, taken from a small pool of idle ones and given back unless
 * the cancel wrote it.
 */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* Idle cancel eventfds, for the waits that sleep in poll(): making one
 * and closing it per wait cost two system calls, the close on the way
 * out of every hand-off. A slot holds fd + 1 (0: empty), taken and given
 * back by atomic exchange (no lock a fork could leave held). A fork's
 * child inherits copies that share the parent's counter, so a child (a
 * new fork generation) closes what it finds instead of using it. */
#define CANCEL_FD_POOL 8
static int cancel_fd_pool[CANCEL_FD_POOL];
static uint64_t cancel_fd_pool_gen; /* the fork generation the pool's fds are of */

static int cancel_fd_take(uint64_t gen)
{
    if (__atomic_load_n(&cancel_fd_pool_gen, __ATOMIC_ACQUIRE) != gen) {
        for (int i = 0; i < CANCEL_FD_POOL; i++) {
            int v = __atomic_exchange_n(&cancel_fd_pool[i], 0, __ATOMIC_ACQ_REL);
            if (v)
                close(v - 1); /* our copy of the parent's */
        }
        __atomic_store_n(&cancel_fd_pool_gen, gen, __ATOMIC_RELEASE);
    }
    for (int i = 0; i < CANCEL_FD_POOL; i++) {
        int v = __atomic_exchange_n(&cancel_fd_pool[i], 0, __ATOMIC_ACQ_REL);
        if (v)
            return v - 1;
    }
    return eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
}

/* W's eventfd, unread (never written unless W was canceled), back to
 * the pool when W's fork generation still is the pool's. */
static void cancel_fd_give(struct dlock__wait *w)
{
    int fd = w->cancel_fd;
    w->cancel_fd = -1;
    if (!w->canceled && w->cancel_fd_gen == dlock__fork_gen() &&
        __atomic_load_n(&cancel_fd_pool_gen, __ATOMIC_ACQUIRE) == w->cancel_fd_gen)
        for (int i = 0; i < CANCEL_FD_POOL; i++) {
            int empty = 0;
            if (__atomic_compare_exchange_n(&cancel_fd_pool[i], &empty, fd + 1, false,
                                            __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
                return;
        }
    close(fd);
}

void dlock__wait_init(struct dlock__wait *w, int64_t deadline)
{
    dlock__cond_init_monotonic(&w->cv);
    pthread_mutex_init(&w->mu, NULL);
    w->deadline = deadline;
    w->seq = 0;
    w->canceled = false;
    w->cancel_fd = -1;
    w->cancel = NULL;
    w->next = NULL;
    w->slept = false;
    w->delay_until = 0;
    w->on_wake = NULL;
    w->retry_at = DLOCK__NEVER;
}

void dlock__wait_destroy(struct dlock__wait *w)
{
    if (w->cancel_fd >= 0)
        cancel_fd_give(w);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
}

void dlock__wait_cancel(struct dlock__wait *w)
{
    pthread_mutex_lock(&w->mu);
    w->canceled = true;
    if (w->cancel_fd >= 0) {
        uint64_t one = 1;
        ssize_t n = write(w->cancel_fd, &one, sizeof one);
        (void)n;
    }
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (w->on_wake)
        w->on_wake(w);
}

unsigned dlock__wait_seq(struct dlock__wait *w)
{
    pthread_mutex_lock(&w->mu);
    unsigned s = w->seq;
    pthread_mutex_unlock(&w->mu);
    return s;
}

void dlock__wait_wake(struct dlock__wait *w)
{
    pthread_mutex_lock(&w->mu);
    w->seq++;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (w->on_wake)
        w->on_wake(w);
}

void dlock__wait_retry_at(struct dlock__wait *w, int64_t until)
{
    if (until < w->retry_at)
        w->retry_at = until;
}

static struct timespec abs_time(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    return ts;
}

/* Sleep until woken since SEQ, canceled, DEADLINE or UNTIL (see
 * dlock__wait_sleep, whose deadline is the wait's own). */
static int sleep_until(struct dlock__wait *w, unsigned seq, int64_t until, int64_t deadline)
{
    int rc = w->cancel ? dlock__cancel_arm(w->cancel) : DLOCK_OK;
    if (rc)
        return rc;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        if (w->canceled) {
            rc = DLOCK_ECANCELED;
            break;
        }
        if (w->seq != seq)
            break;
        int64_t now = dlock__now_ms();
        if (now >= deadline) {
            rc = DLOCK_ETIMEDOUT;
            break;
        }
        if (now >= until)
            break;
        int64_t t = deadline < until ? deadline : until;
        w->slept = true;
        if (t == DLOCK__NEVER) {
            pthread_cond_wait(&w->cv, &w->mu);
        } else {
            struct timespec ts = abs_time(t);
            pthread_cond_timedwait(&w->cv, &w->mu, &ts);
        }
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

int dlock__wait_sleep(struct dlock__wait *w, unsigned seq, int64_t until)
{
    return sleep_until(w, seq, until, w->deadline);
}

int dlock__wait_retry(struct dlock__wait *w, struct dlock__backoff *b, int64_t until)
{
    int64_t now = dlock__now_ms();
    int64_t deadline = w && !dlock__wait_try_once(w) ? w->deadline : DLOCK__NEVER;
    if (now >= until || now >= deadline)
        return DLOCK_ETIMEDOUT;
    int64_t t = now + dlock__backoff_next(b);
    if (t > until)
        t = until;
    if (w) {
        int rc = sleep_until(w, dlock__wait_seq(w), t, deadline);
        if (rc)
            return rc;
    } else {
        struct timespec ts = abs_time(t);
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
            ;
    }
    return dlock__now_ms() >= until ? DLOCK_ETIMEDOUT : DLOCK_OK;
}

int dlock__wait_cancel_fd(struct dlock__wait *w, int *fd)
{
    *fd = -1;
    if (w->cancel) {
        int rc = dlock__cancel_arm(w->cancel);
        if (rc)
            return rc;
    }
    pthread_mutex_lock(&w->mu);
    if (w->cancel_fd < 0) {
        w->cancel_fd_gen = dlock__fork_gen();
        w->cancel_fd = cancel_fd_take(w->cancel_fd_gen);
    }
    bool canceled = w->canceled;
    *fd = w->cancel_fd;
    pthread_mutex_unlock(&w->mu);
    if (canceled)
        return DLOCK_ECANCELED;
    if (*fd < 0)
        return dlock__errno(DLOCK_EIO, errno, "eventfd");
    return DLOCK_OK;
}

bool dlock__wait_canceled(struct dlock__wait *w)
{
    if (!w)
        return false;
    pthread_mutex_lock(&w->mu);
    bool canceled = w->canceled;
    pthread_mutex_unlock(&w->mu);
    return canceled;
}

int dlock__wait_poll(struct dlock__wait *w, int fd, short events, int64_t until)
{
    int cfd;
    int rc = dlock__wait_cancel_fd(w, &cfd);
    if (rc)
        return rc;
    for (;;) {
        int64_t now = dlock__now_ms();
        if (now >= w->deadline)
            return DLOCK_ETIMEDOUT;
        if (now >= until)
            return DLOCK_OK;
        int64_t t = w->deadline < until ? w->deadline : until;
        int timeout = t == DLOCK__NEVER ? -1 : (int)((t - now) > 1000000 ? 1000000 : t - now);
        w->slept = true;
        struct pollfd p[2] = {{.fd = fd, .events = events}, {.fd = cfd, .events = POLLIN}};
        int n = poll(p, 2, timeout);
        if (n < 0 && errno != EINTR)
            return dlock__errno(DLOCK_EIO, errno, "poll");
        if (n > 0 && p[1].revents)
            return DLOCK_ECANCELED;
        if (n > 0 && p[0].revents)
            return DLOCK_OK;
    }
}

/* ------------------------------------------------------ time left, backoff */

void dlock__wait_in_delay(struct dlock__wait *w, int64_t left_ms)
{
    if (w)
        w->delay_until = left_ms > 0 ? dlock__now_ms() + left_ms : 0;
}

int dlock__wait_delay(struct dlock__wait *w, unsigned seq, int64_t left_ms)
{
    dlock__wait_in_delay(w, left_ms);
    if (dlock__wait_try_once(w))
        return DLOCK_EBUSY;
    /* until the delay's end as the backend timed it: no event comes then */
    return dlock__wait_sleep(w, seq, dlock__now_ms() + left_ms);
}

bool dlock__wait_try_once(const struct dlock__wait *w)
{
    return w && w->deadline == 0;
}

int64_t dlock__wait_deadline(const struct dlock__wait *w)
{
    return w ? w->deadline : 0;
}

int dlock__wait_outcome(const struct dlock__wait *w, int rc)
{
    if ((rc == DLOCK_ECONN || rc == DLOCK_EUNAVAIL) && dlock__time_left(w->deadline, 1) == 0)
        return DLOCK_ETIMEDOUT;
    return rc;
}

int64_t dlock__time_left(int64_t deadline, int64_t cap_ms)
{
    if (deadline == 0 || deadline == DLOCK__NEVER)
        return cap_ms;
    int64_t left = deadline - dlock__now_ms();
    if (left <= 0)
        return 0;
    return cap_ms > 0 && cap_ms < left ? cap_ms : left;
}

int64_t dlock__time_budget(int64_t deadline, int64_t cap_ms)
{
    return dlock__now_ms() + dlock__time_left(deadline, cap_ms);
}

int64_t dlock__backoff_next(struct dlock__backoff *b)
{
    int64_t lo = b->min_ms > 0 ? b->min_ms : 1, hi = b->max_ms > lo ? b->max_ms : lo;
    b->cur_ms = b->cur_ms ? b->cur_ms * 2 : lo;
    if (b->cur_ms > hi)
        b->cur_ms = hi;
    return b->cur_ms;
}

void dlock__backoff_reset(struct dlock__backoff *b)
{
    b->cur_ms = 0;
}
