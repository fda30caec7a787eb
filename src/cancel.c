/* cancel.c -- the cancel object: a sticky cancel that cannot race.
 *
 * dlock_lock_cancel() reaches only the waits in progress when it is
 * called, so a program that cancels from a signal or another thread had to
 * loop until the acquire noticed. A dlock_cancel is fired once and stays
 * fired: an acquire that starts after the fire returns DLOCK_ECANCELED
 * before doing anything, and the waits of acquires already running are
 * canceled through dlock__wait_cancel() -- the same call dlock_lock_cancel()
 * makes -- so every backend's way of sleeping (a condition variable, poll()
 * on the wait's cancel eventfd, curl's progress callback) sees it unchanged.
 *
 * Firing must be async-signal-safe, and waking a condition variable is
 * not. So dlock_cancel_fire() only stores a flag and writes to the
 * object's eventfd; one canceler thread per process watches those
 * eventfds (epoll, one shot each) and cancels the waits attached to a
 * fired object. An object joins the canceler ("is armed") the first time
 * a wait using it is about to sleep, and the thread starts with the first
 * armed object and stops with the last: an acquire that never waits (the
 * common `dlock run` case) costs no thread. A fire before the arming is
 * not missed: the eventfd is already readable when it joins the epoll set.
 * An acquire attaches its wait under the object's mutex and reads the flag
 * there: either it sees the fire, or the canceler, which takes that mutex
 * after the flag was stored, sees the wait. Nothing can slip between.
 */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "internal.h"

/* dlock_cancel_fire() stores the flag from signal handlers: only a
 * lock-free atomic is async-signal-safe. */
_Static_assert(ATOMIC_BOOL_LOCK_FREE == 2, "atomic_bool must be lock-free");

struct dlock_cancel {
    atomic_bool fired;
    int efd;     /* readable once fired; never read, so it stays so */
    uint64_t id; /* epoll's key: an id, not a pointer, so a late event for
                    a freed object finds nothing instead of freed memory */
    pid_t pid;         /* the process that made it, for messages */
    uint64_t fork_gen; /* dlock__fork_gen() when made: fork detection */
    atomic_bool armed; /* on the canceler's list (g_mu to change it) */
    pthread_mutex_t mu;           /* waits */
    struct dlock__waitref *waits; /* acquires using it right now */
    struct dlock_cancel *next;    /* the canceler's list */
};

/* The canceler: every live object of the process, and its thread. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct dlock_cancel *g_list;
static size_t g_count;
static uint64_t g_next_id = 1;
static int g_epfd = -1, g_stopfd = -1; /* the stop eventfd's key is 0 */
static pthread_t g_thread;
static uint64_t g_fork_gen; /* the process the state above belongs to */

/* fork() while another thread holds g_mu would leave the child's copy
 * locked for good: hold it across fork (the child then starts afresh in
 * dlock_cancel_new(), seeing another pid). */
static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;
static void g_lock(void)
{
    pthread_mutex_lock(&g_mu);
}
static void g_unlock(void)
{
    pthread_mutex_unlock(&g_mu);
}
static void register_atfork(void)
{
    pthread_atfork(g_lock, g_unlock, g_unlock);
}

/* Cancel the waits of the object with ID if it was fired (g_mu held). */
static void deliver(uint64_t id)
{
    for (struct dlock_cancel *k = g_list; k; k = k->next)
        if (k->id == id) {
            if (!atomic_load(&k->fired))
                return;
            pthread_mutex_lock(&k->mu);
            for (struct dlock__waitref *r = k->waits; r; r = r->next)
                dlock__wait_cancel(r->w);
            pthread_mutex_unlock(&k->mu);
            return;
        }
}

static void *canceler_main(void *arg)
{
    int epfd = (int)(intptr_t)arg;
    for (;;) {
        struct epoll_event ev[16];
        int n = epoll_wait(epfd, ev, 16, -1);
        if (n < 0 && errno != EINTR)
            return NULL; /* cannot happen with a valid epfd */
        for (int i = 0; i < n; i++) {
            if (ev[i].data.u64 == 0)
                return NULL; /* stop */
            pthread_mutex_lock(&g_mu);
            deliver(ev[i].data.u64);
            pthread_mutex_unlock(&g_mu);
        }
    }
}

/* Stop THREAD through STOPFD, wait for it, close its descriptors. */
static void canceler_stop(pthread_t thread, int epfd, int stopfd)
{
    uint64_t one = 1;
    ssize_t n = write(stopfd, &one, sizeof one);
    (void)n;
    pthread_join(thread, NULL);
    close(epfd);
    close(stopfd);
}

/* Start the canceler thread (g_mu held). */
static int canceler_start(void)
{
    g_epfd = epoll_create1(EPOLL_CLOEXEC);
    g_stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0};
    int err = g_epfd < 0 || g_stopfd < 0 ? errno : 0;
    if (!err && epoll_ctl(g_epfd, EPOLL_CTL_ADD, g_stopfd, &ev) < 0)
        err = errno;
    if (!err) {
        /* No signal meant for the program may land on our thread. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        err = pthread_create(&g_thread, NULL, canceler_main, (void *)(intptr_t)g_epfd);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (err) {
            int e = dlock__errno(DLOCK_EIO, err, "cannot start the canceler thread");
            close(g_epfd);
            close(g_stopfd);
            g_epfd = g_stopfd = -1;
            return e;
        }
        return DLOCK_OK;
    }
    if (g_epfd >= 0)
        close(g_epfd);
    if (g_stopfd >= 0)
        close(g_stopfd);
    g_epfd = g_stopfd = -1;
    return dlock__errno(err == ENOMEM ? DLOCK_ENOMEM : DLOCK_EIO, err,
                        "cannot set up the canceler (epoll, eventfd)");
}

int dlock_cancel_new(dlock_cancel **out)
{
    if (!out)
        return dlock__err(DLOCK_EINVAL, "dlock_cancel_new: out is NULL");
    *out = NULL;
    dlock_cancel *k = calloc(1, sizeof *k);
    if (!k)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    atomic_init(&k->fired, false);
    atomic_init(&k->armed, false);
    k->pid = dlock__pid();
    k->fork_gen = dlock__fork_gen();
    k->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (k->efd < 0) {
        int err = errno;
        free(k);
        return dlock__errno(err == ENOMEM ? DLOCK_ENOMEM : DLOCK_EIO, err,
                            "cannot make a cancel object (eventfd)");
    }
    pthread_mutex_init(&k->mu, NULL);
    pthread_once(&g_atfork_once, register_atfork);
    *out = k;
    return DLOCK_OK;
}

int dlock__cancel_arm(dlock_cancel *k)
{
    if (atomic_load(&k->armed))
        return DLOCK_OK;
    pthread_mutex_lock(&g_mu);
    if (atomic_load(&k->armed)) {
        pthread_mutex_unlock(&g_mu);
        return DLOCK_OK;
    }
    if (g_fork_gen != dlock__fork_gen()) {
        /* A child after fork(): the parent's thread and objects are not
         * ours. The epoll set and stop eventfd are shared with the parent:
         * close our copies (closing never affects the parent's). */
        if (g_epfd >= 0)
            close(g_epfd);
        if (g_stopfd >= 0)
            close(g_stopfd);
        g_list = NULL;
        g_count = 0;
        g_epfd = g_stopfd = -1;
        g_fork_gen = dlock__fork_gen();
    }
    int rc = g_count ? DLOCK_OK : canceler_start();
    struct epoll_event ev = {.events = EPOLLIN | EPOLLONESHOT};
    if (!rc) {
        k->id = g_next_id++;
        ev.data.u64 = k->id;
        if (epoll_ctl(g_epfd, EPOLL_CTL_ADD, k->efd, &ev) < 0)
            rc = dlock__errno(DLOCK_EIO, errno, "cannot watch a cancel object (epoll)");
    }
    if (rc && g_count == 0 && g_epfd >= 0) {
        /* The thread started for this object: stop it (no object, so it
         * never waits for g_mu). */
        canceler_stop(g_thread, g_epfd, g_stopfd);
        g_epfd = g_stopfd = -1;
    }
    if (!rc) {
        k->next = g_list;
        g_list = k;
        g_count++;
        atomic_store(&k->armed, true);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

int dlock_cancel_fire(dlock_cancel *k)
{
    if (!k)
        return DLOCK_EINVAL;
    int saved = errno;
    atomic_store(&k->fired, true);
    /* In a child after fork() the eventfd is the parent's too, and its
     * canceler takes one wake-up per object (EPOLLONESHOT): a write here
     * would spend it, and the parent's own fire would never reach its
     * waits. The child's copy is fired; no wait of the child can use it. */
    if (k->fork_gen == dlock__fork_gen()) {
        uint64_t one = 1;
        ssize_t n = write(k->efd, &one, sizeof one);
        (void)n; /* only EAGAIN at a counter of 2^64-2: readable anyway */
    }
    errno = saved;
    return DLOCK_OK;
}

int dlock_cancel_fired(const dlock_cancel *k)
{
    return k && atomic_load(&((dlock_cancel *)k)->fired) ? 1 : 0;
}

void dlock_cancel_free(dlock_cancel *k)
{
    if (!k)
        return;
    int epfd = -1, stopfd = -1;
    pthread_t thread;
    pthread_mutex_lock(&g_mu);
    /* In a child after fork() the process-wide state (g_fork_gen still the
     * parent's until the child makes an object) is the parent's: freeing
     * an inherited object only closes our copy of its eventfd, never
     * touches the shared epoll set nor stops the parent's thread. */
    if (atomic_load(&k->armed) && k->fork_gen == g_fork_gen && k->fork_gen == dlock__fork_gen()) {
        struct dlock_cancel **p = &g_list;
        while (*p && *p != k)
            p = &(*p)->next;
        if (*p) {
            *p = k->next;
            epoll_ctl(g_epfd, EPOLL_CTL_DEL, k->efd, NULL);
            if (--g_count == 0) {
                /* The last one: stop the thread, outside g_mu (it may be
                 * waiting for it). A new object meanwhile starts another. */
                epfd = g_epfd;
                stopfd = g_stopfd;
                thread = g_thread;
                g_epfd = g_stopfd = -1;
            }
        }
    }
    pthread_mutex_unlock(&g_mu);
    if (epfd >= 0)
        canceler_stop(thread, epfd, stopfd);
    close(k->efd);
    if (k->fork_gen == dlock__fork_gen()) /* in a child, a parent's thread may have held it */
        pthread_mutex_destroy(&k->mu);
    free(k);
}

/* ------------------------------------------------------ the core's side */

int dlock__cancel_attach(dlock_cancel *k, struct dlock__waitref *r)
{
    if (k->fork_gen != dlock__fork_gen())
        return dlock__err(DLOCK_EMISUSE, "this cancel object was made by process %d; a child "
                                         "after fork() must make its own",
                          (int)k->pid);
    pthread_mutex_lock(&k->mu);
    bool fired = atomic_load(&k->fired);
    if (!fired) {
        r->next = k->waits;
        k->waits = r;
    }
    pthread_mutex_unlock(&k->mu);
    return fired ? DLOCK_ECANCELED : DLOCK_OK;
}

void dlock__cancel_detach(dlock_cancel *k, struct dlock__waitref *r)
{
    pthread_mutex_lock(&k->mu);
    struct dlock__waitref **p = &k->waits;
    while (*p && *p != r)
        p = &(*p)->next;
    if (*p)
        *p = r->next;
    pthread_mutex_unlock(&k->mu);
}
