/* contend.c -- the file backend's contended signal: a holder told when
 * another owner starts waiting for its lock (dlock_lock_on_contended()).
 *
 * A waiter sleeps in the kernel's view of byte 0 and on inotify, where
 * no holder can see it, so waiters announce themselves in a second file
 * beside the lock file, NAME.waiting: WAIT_SLOTS slots of SLOT_SIZE
 * bytes. A waiter whose try is busy (a wait, not a try-once) takes the
 * first slot whose first byte no other open file has OFD-locked, keeps
 * that lock for as long as it waits, and writes its id there (the
 * kernel drops the lock when it stops waiting or dies, so a locked slot
 * with an id is a live waiter); when it stops waiting it zeroes the slot
 * and closes the file -- a wait that took the lock closes it only at the
 * release, after the lock file (its slot stays locked, empty, until
 * then: one call fewer between a release and the next hold). One open,
 * one lock, two writes per wait, none per try.
 *
 * A holder that asked watches NAME.waiting with inotify (IN_MODIFY, which
 * the lock file's waiters, watching that file for IN_CLOSE_WRITE, never
 * see) and reads it -- one pread, and an F_OFD_GETLK per slot with an id
 * -- once as the acquire returns (those already waiting) and again at
 * every write: each locked slot's id is a waiter (the core tells each
 * once). The watch is added before the first read, so a waiter that
 * writes meanwhile is read then or raises the event. One thread per
 * client, started by its first watch, waits on one inotify instance for
 * every watched hold; a hold's watch ends at the first event after the
 * hold is gone (the core answers false), or at the client's close.
 *
 * The limits: the first WAIT_SLOTS waiters of a name are seen, the rest
 * are not; a slot whose waiter died before it zeroed it keeps that
 * waiter's id until the next waiter takes the slot, which is then read
 * once more under the old id until it writes its own (a hint, as every
 * contended call is). NAME.waiting, like the lock file, is never deleted.
 * docs/protocol-file.md, "Contended".
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include "backend.h"
#include "file.h"

#define WAIT_SLOTS 64
#define SLOT_SIZE 128
#define WAITING_SUFFIX ".waiting"

/* Whether another open file holds slot I of FD: a live waiter. */
static bool slot_taken(int fd, int i)
{
    struct flock fl = {.l_type = F_WRLCK,
                       .l_whence = SEEK_SET,
                       .l_start = (off_t)i * SLOT_SIZE,
                       .l_len = 1};
    return fcntl(fd, F_OFD_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
}

/* ============================================================= waiters */

void dlock__file_wait_announce(struct file_state *s, const char *full, struct file_waiting *wt)
{
    if (wt->fd >= 0 || wt->tried)
        return;
    wt->tried = true; /* once per wait, whatever comes of it */
    static unsigned waits;
    char fname[NAME_MAX + 1], msg[DLOCK__MSG_MAX], id[SLOT_SIZE] = {0};
    dlock__errmsg_save(msg); /* the wait's own story stays the caller's */
    int fd;
    if (dlock__file_open_named(s, full, WAITING_SUFFIX, O_RDWR | O_CREAT, fname, &fd)) {
        dlock__log(s->c, DLOCK_LOG_DEBUG, "file %s: lock '%s': waiting unannounced: %s", s->dir,
                   full, dlock_errmsg());
        dlock__errmsg_restore(DLOCK_OK, msg);
        return;
    }
    dlock__errmsg_restore(DLOCK_OK, msg);
    char who[SLOT_SIZE - 16];
    dlock__identity(who, sizeof who);
    snprintf(id, sizeof id, "%s/wait-%u", who, __atomic_add_fetch(&waits, 1, __ATOMIC_RELAXED));
    for (int i = 0; i < WAIT_SLOTS; i++) {
        if (dlock__file_range_lock(fd, F_WRLCK, (off_t)i * SLOT_SIZE) != 0)
            continue;
        if (pwrite(fd, id, sizeof id, (off_t)i * SLOT_SIZE) == (ssize_t)sizeof id) {
            wt->fd = fd;
            wt->slot = i;
            return;
        }
        break;
    }
    dlock__log(s->c, DLOCK_LOG_DEBUG, "file %s/%s: no slot for waiter %s (%d are taken)", s->dir,
               fname, id, WAIT_SLOTS);
    close(fd);
}

/* WT's slot zeroed: no holder reads a waiter in it any more. */
static void slot_clear(struct file_waiting *wt)
{
    static const char zero[SLOT_SIZE];
    ssize_t n = pwrite(wt->fd, zero, sizeof zero, (off_t)wt->slot * SLOT_SIZE);
    (void)n; /* a slot left written is read once more at most (see above) */
}

void dlock__file_wait_leave(struct file_waiting *wt)
{
    if (wt->fd < 0)
        return;
    slot_clear(wt);
    close(wt->fd); /* drops the slot's lock */
    wt->fd = -1;
}

void dlock__file_wait_settle(struct file_waiting *wt, struct file_hold *fh)
{
    if (wt->fd < 0)
        return;
    slot_clear(wt);
    fh->waiting_fd = wt->fd;
    wt->fd = -1;
}

/* ============================================================= holders */

/* One watched hold. */
struct file_watch {
    const struct dlock__hold *h; /* identity only: the core matches it */
    uint64_t token;
    int fd; /* NAME.waiting, read-only */
    int wd;
    struct file_watch *next;
};

struct file_contend {
    struct file_state *s;
    pthread_mutex_t mu; /* the list, and every read of a watched file */
    pthread_t thread;
    int ifd;  /* one inotify instance for every watch */
    int stop; /* an eventfd: the thread's end */
    struct file_watch *watches;
};

/* Report W's waiters: whether its hold still stands. Under mu. */
static bool watch_read(struct file_state *s, struct file_watch *w)
{
    char buf[WAIT_SLOTS * SLOT_SIZE];
    ssize_t n = pread(w->fd, buf, sizeof buf, 0);
    for (int i = 0; n > 0 && i < WAIT_SLOTS && (i + 1) * SLOT_SIZE <= n; i++) {
        char *id = buf + (size_t)i * SLOT_SIZE;
        id[SLOT_SIZE - 1] = 0;
        if (*id && slot_taken(w->fd, i) && !dlock__hold_contended(s->c, w->h, w->token, id))
            return false;
    }
    return dlock__hold_contended(s->c, w->h, w->token, NULL);
}

/* Drop *P's watch from the list. Under mu. */
static void watch_drop(struct file_contend *k, struct file_watch **p)
{
    struct file_watch *w = *p;
    *p = w->next;
    bool shared = false; /* another hold of the file, whose watch is the same wd */
    for (struct file_watch *o = k->watches; o; o = o->next)
        shared |= o->wd == w->wd;
    if (!shared)
        inotify_rm_watch(k->ifd, w->wd);
    close(w->fd);
    free(w);
}

static void *contend_thread(void *arg)
{
    struct file_contend *k = arg;
    struct file_state *s = k->s;
    for (;;) {
        struct pollfd p[2] = {{.fd = k->ifd, .events = POLLIN}, {.fd = k->stop, .events = POLLIN}};
        if (poll(p, 2, -1) < 0 && errno != EINTR)
            break;
        if (p[1].revents)
            break;
        char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
        ssize_t n = read(k->ifd, buf, sizeof buf);
        pthread_mutex_lock(&k->mu);
        for (ssize_t off = 0; off + (ssize_t)sizeof(struct inotify_event) <= n;) {
            const struct inotify_event *e = (const struct inotify_event *)(buf + off);
            off += (ssize_t)sizeof *e + e->len;
            for (struct file_watch **w = &k->watches; *w;)
                if ((*w)->wd == e->wd && !watch_read(s, *w))
                    watch_drop(k, w);
                else
                    w = &(*w)->next;
        }
        pthread_mutex_unlock(&k->mu);
    }
    return NULL;
}

/* S's watching thread, started once. */
static int contend_start(struct file_state *s)
{
    pthread_mutex_lock(&s->pool_mu);
    int rc = DLOCK_OK;
    struct file_contend *k = s->contend;
    if (!k && !(k = calloc(1, sizeof *k)))
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    if (k && !s->contend) {
        k->s = s;
        pthread_mutex_init(&k->mu, NULL);
        k->ifd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
        k->stop = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        int e = errno;
        if (k->ifd < 0 || k->stop < 0 ||
            (e = pthread_create(&k->thread, NULL, contend_thread, k))) {
            rc = dlock__errno(DLOCK_EIO, e, "file %s: the thread that watches for waiters", s->dir);
            if (k->ifd >= 0)
                close(k->ifd);
            if (k->stop >= 0)
                close(k->stop);
            pthread_mutex_destroy(&k->mu);
            free(k);
        } else {
            s->contend = k;
        }
    }
    pthread_mutex_unlock(&s->pool_mu);
    return rc;
}

static int file_contend_watch(void *state, struct dlock__hold *h)
{
    struct file_state *s = state;
    int rc = contend_start(s);
    char *full = rc ? NULL : dlock__file_full_name(s, h->name);
    if (!rc && !full)
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    struct file_watch *w = rc ? NULL : calloc(1, sizeof *w);
    if (!rc && !w)
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    char fname[NAME_MAX + 1];
    if (!rc)
        rc = dlock__file_open_named(s, full, WAITING_SUFFIX, O_RDONLY | O_CREAT, fname, &w->fd);
    free(full);
    if (rc) {
        free(w);
        return rc;
    }
    struct file_contend *k = s->contend;
    w->h = h;
    w->token = h->token;
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", w->fd);
    pthread_mutex_lock(&k->mu);
    w->wd = inotify_add_watch(k->ifd, path, IN_MODIFY);
    if (w->wd < 0) {
        rc = dlock__errno(DLOCK_EIO, errno, "file %s/%s: inotify", s->dir, fname);
        close(w->fd);
        free(w);
    } else {
        w->next = k->watches;
        k->watches = w;
        /* those waiting already; the core keeps reports until it
         * registers H (a false answer then means nothing yet) */
        watch_read(s, w);
    }
    pthread_mutex_unlock(&k->mu);
    return rc;
}

void dlock__file_contend_stop(struct file_state *s)
{
    struct file_contend *k = s->contend;
    if (!k)
        return;
    uint64_t one = 1;
    ssize_t n = write(k->stop, &one, sizeof one);
    (void)n;
    pthread_join(k->thread, NULL);
    while (k->watches) {
        struct file_watch *w = k->watches;
        k->watches = w->next;
        close(w->fd);
        free(w);
    }
    close(k->ifd);
    close(k->stop);
    pthread_mutex_destroy(&k->mu);
    free(k);
    s->contend = NULL;
}

const struct dlock__contend_ops dlock__file_contend_ops = {
    .watch = file_contend_watch,
};
