/* park.c -- how a parked asynchronous acquire on the file backend learns
 * that its file was closed, without a thread or an inotify instance of
 * its own.
 *
 * A blocking waiter sleeps in poll() on an inotify instance it borrowed
 * (mutex.c). A parked one (the core's try_armed, src/async.c) has no
 * thread to poll with, so the client keeps one inotify instance for all
 * of them and one thread that reads it: every watch of that instance is
 * a file some parked waits wait on (a file has one watch per instance,
 * whoever added it, so its waiters are kept on it and the last one to
 * go removes it), and an event on it wakes them (dlock__wait_wake), which
 * makes the core run their next attempt. The events are the blocking
 * waiter's: IN_CLOSE_WRITE (a release, a holder's death, a waiter giving
 * up), IN_ATTRIB (a downgrade), the file's deletion or move.
 *
 * A close lets at most one exclusive waiter in, so it wakes the
 * longest-waiting exclusive waiter not woken yet, as the Redis hub does
 * with a release message (one try per close, not a herd of them), and
 * every shared waiter (readers enter together). The woken waiter acks the
 * wake when it tries; one that leaves without using it (canceled, timed
 * out) passes it on; a busy try needs none passed, since whatever took
 * the lock closes the file in turn. Any other event (a downgrade, the
 * file replaced), and an overflow of the instance's queue (no waiter can
 * tell whether its event was lost), wakes every waiter. The instance and
 * the thread are made by the first wait that parks and last until the
 * client closes; a user out of inotify instances or watches parks on a
 * backoff instead, as a blocking waiter sleeps on one.
 *
 * Locks: the watch's mutex (pk->mu), then a waitset's and a wait's own
 * (in dlock__wait_wake, whose hook takes the core's async mutex); the
 * core calls try_armed and disarm with no lock held, so nothing is taken
 * in the other order.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include "file.h"

/* A file some parked waits wait on: the instance's watch WD of it, and
 * its waiters by the mode they want, in arrival order. */
struct park_watch {
    int wd;
    struct dlock__waitset excl, shared;
    struct park_watch *next;
};

struct file_parker {
    pthread_mutex_t mu;
    int ifd;     /* the parked waits' inotify instance; -1 until the first */
    int stop_fd; /* eventfd: readable when the thread is to end */
    pthread_t thread;
    bool started;
    struct park_watch *watches;
};

/* Wake WATCH's waiters for an event of MASK (pk->mu held). */
static void wake_watch(struct park_watch *watch, uint32_t mask)
{
    dlock__waitset_wake_all(&watch->shared);
    if (mask == IN_CLOSE_WRITE)
        dlock__waitset_wake_one(&watch->excl);
    else
        dlock__waitset_wake_all(&watch->excl);
}

/* Wake the waiters of the watch EV names; all of them when the queue
 * overflowed (pk->mu held). */
static void wake_for(struct file_parker *pk, const struct inotify_event *ev)
{
    for (struct park_watch *watch = pk->watches; watch; watch = watch->next)
        if (ev->mask & IN_Q_OVERFLOW || watch->wd == ev->wd)
            wake_watch(watch, ev->mask);
}

static void *parker_main(void *arg)
{
    struct file_parker *pk = arg;
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    for (;;) {
        struct pollfd fds[2] = {{.fd = pk->ifd, .events = POLLIN},
                                {.fd = pk->stop_fd, .events = POLLIN}};
        if (poll(fds, 2, -1) < 0 && errno != EINTR)
            break; /* cannot happen with valid descriptors */
        if (fds[1].revents)
            break;
        ssize_t n = read(pk->ifd, buf, sizeof buf); /* whole events only */
        pthread_mutex_lock(&pk->mu);
        for (ssize_t at = 0; n > 0 && at < n;) {
            const struct inotify_event *ev = (const void *)(buf + at);
            wake_for(pk, ev);
            at += (ssize_t)(sizeof *ev + ev->len);
        }
        pthread_mutex_unlock(&pk->mu);
    }
    return NULL;
}

/* S's watch of parked waits, made when first needed; NULL out of memory. */
static struct file_parker *parker_get(struct file_state *s)
{
    pthread_mutex_lock(&s->pool_mu);
    struct file_parker *pk = s->parker;
    if (!pk && (pk = calloc(1, sizeof *pk))) {
        pthread_mutex_init(&pk->mu, NULL);
        pk->ifd = pk->stop_fd = -1;
        s->parker = pk;
    }
    pthread_mutex_unlock(&s->pool_mu);
    return pk;
}

/* The instance and its thread, started by the first wait that parks
 * (pk->mu held). DLOCK_OK also when out of inotify instances (pk->ifd
 * stays -1: the wait goes degraded). */
static int parker_start(struct file_state *s, struct file_parker *pk)
{
    if (pk->started)
        return DLOCK_OK;
    if (pk->ifd < 0 && (pk->ifd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK)) < 0)
        return DLOCK_OK;
    if (pk->stop_fd < 0 && (pk->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0)
        return dlock__errno(DLOCK_EIO, errno, "lock directory %s: eventfd for parked waits",
                            s->dir);
    int err = dlock__thread_start(&pk->thread, parker_main, pk);
    if (err)
        return dlock__errno(DLOCK_EIO, err, "lock directory %s: a thread for parked waits", s->dir);
    pk->started = true;
    return DLOCK_OK;
}

/* WATCH unlinked from PK and freed, with its inotify watch (pk->mu
 * held; no waiter left on it). */
static void watch_free(struct file_parker *pk, struct park_watch *watch)
{
    struct park_watch **at = &pk->watches;
    while (*at != watch)
        at = &(*at)->next;
    *at = watch->next;
    inotify_rm_watch(pk->ifd, watch->wd);
    dlock__waitset_destroy(&watch->excl);
    dlock__waitset_destroy(&watch->shared);
    free(watch);
}

/* The watch of WD, made when it is new (pk->mu held); NULL out of memory
 * (WD, new, removed). */
static struct park_watch *watch_of(struct file_parker *pk, int wd)
{
    struct park_watch *watch = pk->watches;
    while (watch && watch->wd != wd)
        watch = watch->next;
    if (watch)
        return watch;
    if (!(watch = calloc(1, sizeof *watch))) {
        inotify_rm_watch(pk->ifd, wd);
        return NULL;
    }
    watch->wd = wd;
    dlock__waitset_init(&watch->excl);
    dlock__waitset_init(&watch->shared);
    watch->next = pk->watches;
    pk->watches = watch;
    return watch;
}

static int parked_watch(struct file_take *t)
{
    struct file_park *p = (struct file_park *)t;
    struct file_parker *pk = parker_get(t->s);
    if (!pk)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    pthread_mutex_lock(&pk->mu);
    int rc = parker_start(t->s, pk);
    if (!rc) {
        t->ifd = pk->started ? pk->ifd : -1;
        if (t->ifd < 0)
            errno = EMFILE; /* no instance to be had */
        rc = dlock__file_watch_add(t);
    }
    struct park_watch *watch = !rc && t->wd >= 0 ? watch_of(pk, t->wd) : NULL;
    if (watch) {
        rc = dlock__waitset_add(p->shared ? &watch->shared : &watch->excl, p->w);
        if (!rc)
            p->watch = watch;
        else if (!dlock__waitset_count(&watch->excl) && !dlock__waitset_count(&watch->shared))
            watch_free(pk, watch);
    } else if (!rc && t->wd >= 0) {
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    if (!p->watch)
        t->ifd = t->wd = -1;
    pthread_mutex_unlock(&pk->mu);
    return rc;
}

static void parked_unwatch(struct file_take *t)
{
    struct file_park *p = (struct file_park *)t;
    struct park_watch *watch = p->watch;
    if (!watch)
        return;
    struct file_parker *pk = t->s->parker;
    pthread_mutex_lock(&pk->mu);
    if (p->shared)
        dlock__waitset_remove(&watch->shared, p->w);
    else if (dlock__waitset_remove(&watch->excl, p->w))
        dlock__waitset_wake_one(&watch->excl); /* a wake it did not use */
    if (!dlock__waitset_count(&watch->excl) && !dlock__waitset_count(&watch->shared))
        watch_free(pk, watch); /* the last waiter on the file */
    pthread_mutex_unlock(&pk->mu);
    p->watch = NULL;
    t->ifd = t->wd = -1;
}

const struct file_watch_ops dlock__file_parked_watch = {parked_watch, parked_unwatch};

void dlock__file_park_ack(struct file_park *p)
{
    if (p->watch) /* only this park's own unwatch frees it */
        dlock__waitset_consume(p->shared ? &p->watch->shared : &p->watch->excl, p->w);
}

void dlock__file_park_busy(struct file_park *p)
{
    struct file_take *t = &p->t;
    dlock__wait_retry_at(p->w, t->turn.retry_at); /* a lock-delay's end */
    if (t->degraded)
        dlock__wait_retry_at(p->w, dlock__now_ms() + dlock__backoff_next(&t->backoff));
}

void dlock__file_parker_free(struct file_state *s)
{
    struct file_parker *pk = s->parker;
    if (!pk)
        return;
    if (pk->started) {
        uint64_t one = 1;
        ssize_t n = write(pk->stop_fd, &one, sizeof one);
        (void)n;
        pthread_join(pk->thread, NULL);
    }
    if (pk->ifd >= 0)
        close(pk->ifd);
    if (pk->stop_fd >= 0)
        close(pk->stop_fd);
    pthread_mutex_destroy(&pk->mu);
    free(pk);
    s->parker = NULL;
}
