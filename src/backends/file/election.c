/* election.c -- the file backend's leader election: the lock plus
 * a value file beside it.
 *
 * Election NAME is lock NAME (NAME.lock: whoever holds it leads, its
 * counter is the leader's token, the kernel frees it when the leader
 * dies) plus NAME.leader, which the leader writes under the lock when it
 * wins and at every proclaim: a small header (magic, the leader's token,
 * a version bumped by every write) and the value. The value counts only
 * while its token is the lock's current token and the lock is held, so
 * what a resigned or dead leader left behind is never read as current.
 * Writers and readers take an OFD lock on byte 0 of NAME.leader around
 * each write or read, so a reader never sees half a value. Anyone who can
 * open the file can hold that byte, so it is tried within the caller's
 * bound and cancel, never waited for in the kernel.
 *
 * The campaign takes the lock and issues its token under the lock file's
 * metadata byte (readers take it too), so a reader sees either no leader
 * or the new leader's token, never the new lock with the old token.
 *
 * Observers sleep on an inotify watch of the lock directory, set before
 * each look: a leader's release or death closes NAME.lock opened for
 * writing (IN_CLOSE_WRITE) and every write of NAME.leader ends with a
 * close too, so no change goes unseen and nobody polls.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "backend.h"
#include "file.h"

#define SUFFIX ".leader"
#define VALUE_MAGIC "DLOCKel\n"
#define VALUE_MAX (1u << 20) /* a value longer than 1 MiB is refused */

struct value_header {
    char magic[8];
    uint64_t token;   /* the lock's token when this value was written */
    uint64_t version; /* bumped by every write, whoever writes */
    uint32_t len;     /* the value's bytes follow */
    uint32_t pad;
};

/* Take byte 0 of the value file FD (FNAME) in TYPE, or let it go
 * (F_UNLCK). Its holders keep it for a read or a write, but anyone who
 * can open the file can hold it, so it is tried within W's bound, as the
 * lock file's metadata byte is (dlock__file_byte_lock). */
static int value_lock(struct file_state *s, int fd, const char *fname, short type,
                      struct dlock__wait *w)
{
    if (type == F_UNLCK)
        return dlock__file_range_lock(fd, F_UNLCK, 0) < 0 ? DLOCK_EIO : DLOCK_OK;
    struct file_byte b = {.fd = fd, .fname = fname, .what = "value file",
                          .role = "lock byte (byte 0)", .byte = 0, .type = type};
    return dlock__file_byte_lock(s, &b, w);
}

/* Open FULL's value file with FLAGS (its name into FNAME) and take its
 * lock within W's bound: a read lock when read-only, else a write lock;
 * DLOCK_ENOENT (no message) when absent. */
static int open_value(struct file_state *s, const char *full, int flags, struct dlock__wait *w,
                      char *fname, int *fd)
{
    int rc = dlock__file_open_named(s, full, SUFFIX, flags, fname, fd);
    if (rc)
        return rc;
    short type = (flags & O_ACCMODE) == O_RDONLY ? F_RDLCK : F_WRLCK;
    if ((rc = value_lock(s, *fd, fname, type, w))) {
        close(*fd);
        *fd = -1;
    }
    return rc;
}

/* Write VALUE as the leader's with TOKEN into NAME.leader (the caller
 * holds lock NAME) within W's bound (NULL: the op timeout). */
static int write_value(struct file_state *s, const char *name, uint64_t token, const char *value,
                       struct dlock__wait *w)
{
    size_t len = strlen(value);
    if (len > VALUE_MAX)
        return dlock__err(DLOCK_EINVAL, "election '%s': a value of %zu bytes (at most %u)", name,
                          len, VALUE_MAX);
    char *full = dlock__file_full_name(s, name);
    if (!full)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    char fname[NAME_MAX + 1];
    int fd = -1;
    int rc = open_value(s, full, O_RDWR | O_CREAT, w, fname, &fd);
    free(full);
    if (rc)
        return rc;
    struct value_header h = {0};
    if (pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h || memcmp(h.magic, VALUE_MAGIC, 8) != 0)
        h.version = 0; /* new (or not ours: rewritten) */
    memcpy(h.magic, VALUE_MAGIC, 8);
    h.token = token;
    h.version++;
    h.len = (uint32_t)len;
    struct iovec iov[2] = {{&h, sizeof h}, {(void *)value, len}};
    if (pwritev(fd, iov, 2, 0) != (ssize_t)(sizeof h + len) ||
        ftruncate(fd, (off_t)(sizeof h + len)) < 0)
        rc = dlock__errno(dlock__errno_code(errno), errno, "value file %s/%s: write", s->dir,
                          fname);
    value_lock(s, fd, fname, F_UNLCK, NULL);
    close(fd); /* IN_CLOSE_WRITE: observers look again */
    return rc;
}

/* Read NAME.leader into *H and *VALUE (malloc'd) within W's bound; an
 * absent or foreign file reads as token 0 and "". */
static int read_value(struct file_state *s, const char *full, struct value_header *h,
                      char **value, struct dlock__wait *w)
{
    memset(h, 0, sizeof *h);
    *value = NULL;
    char fname[NAME_MAX + 1];
    int fd = -1;
    /* Read-only: closing it raises no IN_CLOSE_WRITE for the observers. */
    int rc = open_value(s, full, O_RDONLY, w, fname, &fd);
    if (rc == DLOCK_ENOENT) {
        return (*value = dlock__strdup("")) ? DLOCK_OK : dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    if (rc)
        return rc;
    if (pread(fd, h, sizeof *h, 0) != (ssize_t)sizeof *h || memcmp(h->magic, VALUE_MAGIC, 8) ||
        h->len > VALUE_MAX)
        memset(h, 0, sizeof *h);
    *value = calloc(1, h->len + 1);
    if (!*value)
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    else if (h->len && pread(fd, *value, h->len, sizeof *h) != (ssize_t)h->len)
        memset(h, 0, sizeof *h), (*value)[0] = 0; /* cut short: no value */
    value_lock(s, fd, fname, F_UNLCK, NULL);
    close(fd);
    return rc;
}

/* The campaign's try: the lock byte taken and the token issued under the
 * metadata byte's write lock, which readers take too, so a reader never
 * sees the new leader's lock with the old leader's token (and value). */
static int campaign_try(struct file_state *s, int fd, const char *fname, const char *full,
                        struct dlock__wait *w, bool fresh, void *arg)
{
    (void)fresh;
    struct dlock__hold *h = arg;
    int rc = dlock__file_meta_lock(s, fd, fname, F_WRLCK, w);
    if (rc)
        return rc;
    if (dlock__file_range_lock(fd, F_WRLCK, LOCK_BYTE) == 0) {
        rc = dlock__file_stamp(s, fd, fname, full, DLOCK_EXCLUSIVE, w, &h->token);
        if (rc)
            dlock__file_range_lock(fd, F_UNLCK, LOCK_BYTE);
    } else if (errno == EAGAIN || errno == EACCES) {
        rc = DLOCK_EBUSY;
    } else {
        rc = dlock__errno(DLOCK_EIO, errno, "lock file %s/%s", s->dir, fname);
    }
    dlock__file_range_lock(fd, F_UNLCK, META_BYTE);
    return rc;
}

int dlock__file_elect_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
{
    int rc = dlock__file_acquire_by(state, h, ".lock", w, campaign_try, h);
    if (!rc && (rc = write_value(state, h->name, h->token, h->elect->value, w)))
        dlock__file_release(state, h); /* no value, no lead (the message stays the write's) */
    if (!rc)
        dlock__identity(h->owner, sizeof h->owner);
    return rc;
}

int dlock__file_elect_proclaim(void *state, struct dlock__hold *h, const char *value)
{
    return write_value(state, h->name, h->token, value, NULL);
}

/* One look at election NAME within W's bound: *CONSISTENT false while a
 * new leader holds the lock but has not written its value yet. */
static int look(struct file_state *s, const char *name, struct dlock__wait *w,
                struct dlock_leader *out, bool *consistent)
{
    dlock_info *info = calloc(1, sizeof *info);
    if (!info)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    info->nwaiters = -1;
    int rc = dlock__file_inspect_within(s, name, info, w);
    char *full = rc ? NULL : dlock__file_full_name(s, name);
    if (!rc && !full)
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    struct value_header vh;
    char *value = NULL;
    if (!rc)
        rc = read_value(s, full, &vh, &value, w);
    free(full);
    free(out->value);
    memset(out, 0, sizeof *out);
    if (!rc) {
        *consistent = !info->held || vh.token == info->token;
        if (info->held && *consistent) {
            out->held = true;
            out->token = info->token;
            out->version = vh.version;
            out->value = value;
            value = NULL;
            snprintf(out->id, sizeof out->id, "%s", info->nholders ? info->holders[0].id : "");
        }
    }
    free(value);
    dlock_info_free(info);
    return rc;
}

int dlock__file_elect_observe(void *state, const char *name, const struct dlock_leader *known,
                              struct dlock__wait *w, struct dlock_leader *out)
{
    struct file_state *s = state;
    int ifd = dlock__file_inotify_borrow(s), wd = -1;
    if (ifd >= 0)
        wd = inotify_add_watch(ifd, s->dir,
                               IN_CLOSE_WRITE | IN_ATTRIB | IN_CREATE | IN_DELETE | IN_MOVED_TO |
                                   IN_MOVED_FROM);
    /* Out of inotify instances or watches: look again on a backoff. */
    struct dlock__backoff backoff = {.min_ms = 1, .max_ms = 100};
    int rc;
    for (;;) {
        bool consistent = false;
        /* The watch is set before the look: a change after it is seen. */
        rc = look(s, name, w, out, &consistent);
        if (rc)
            break;
        if (dlock__observe_done(known, out, consistent, w, &rc))
            break;
        if (wd >= 0) {
            rc = dlock__wait_poll(w, ifd, POLLIN, DLOCK__NEVER);
            char buf[4096];
            ssize_t drained = read(ifd, buf, sizeof buf);
            (void)drained;
        } else {
            rc = dlock__wait_sleep(w, dlock__wait_seq(w),
                                   dlock__now_ms() + dlock__backoff_next(&backoff));
        }
        if (rc)
            break;
    }
    if (ifd >= 0)
        dlock__file_inotify_return(s, ifd, wd);
    return rc;
}
