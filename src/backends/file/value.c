/* value.c -- the file backend's value files: a small file beside a lock
 * file that the lock's holder writes under its kernel lock, and anyone
 * reads. Two kinds share it: an election's NAME.leader (election.c: the
 * leader's value) and a lock's NAME.value (dlock_value_set(): the
 * lock's value, this file's value ops).
 *
 * A value file is a header (magic, the writer's token, a version bumped
 * by every write, the length) and the value's bytes. Writers and readers
 * take an OFD lock on byte 0 around each write or read, so a reader never
 * sees half a value; anyone who can open the file can hold that byte, so
 * it is tried within the caller's bound and cancel, never waited for in
 * the kernel. Every write ends with a close (IN_CLOSE_WRITE), which an
 * election's observers wake on.
 *
 * A lock's value is written through the hold's own kernel lock: the
 * holder's process holds it until it releases or dies, so the check that
 * the hold is still ours is that the lock file the hold has open is still
 * the one the directory names (a file removed or replaced by hand is a
 * lost hold: DLOCK_ELOST, nothing written). A cleared value is a header
 * with token 0 (the file stays, as lock files do).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "backend.h"
#include "file.h"

struct value_header {
    char magic[8];
    uint64_t token;   /* the writer's token; 0: cleared */
    uint64_t version; /* bumped by every write, whoever writes */
    uint32_t len;     /* the value's bytes follow */
    uint32_t pad;
};

const struct file_value_kind dlock__file_lock_value = {.suffix = ".value",
                                                       .magic = "DLOCKvl\n",
                                                       .max = DLOCK_VALUE_MAX,
                                                       .what = "lock"};

/* Take byte 0 of the value file FD (FNAME) in TYPE, or let it go
 * (F_UNLCK), within W's bound, as the lock file's metadata byte is
 * (dlock__file_byte_lock). */
static int value_lock(struct file_state *s, int fd, const char *fname, short type,
                      struct dlock__wait *w)
{
    if (type == F_UNLCK)
        return dlock__file_range_lock(fd, F_UNLCK, 0) < 0 ? DLOCK_EIO : DLOCK_OK;
    struct file_byte b = {.fd = fd,
                          .fname = fname,
                          .what = "value file",
                          .role = "lock byte (byte 0)",
                          .byte = 0,
                          .type = type};
    return dlock__file_byte_lock(s, &b, w);
}

/* Open FULL's value file of kind K with FLAGS (its name into FNAME) and
 * take its byte within W's bound: a read lock when read-only, else a
 * write lock; DLOCK_ENOENT (no message) when absent. */
static int open_value(struct file_state *s, const struct file_value_kind *k, const char *full,
                      int flags, struct dlock__wait *w, char *fname, int *fd)
{
    int rc = dlock__file_open_named(s, full, k->suffix, flags, fname, fd);
    if (rc)
        return rc;
    short type = (flags & O_ACCMODE) == O_RDONLY ? F_RDLCK : F_WRLCK;
    if ((rc = value_lock(s, *fd, fname, type, w))) {
        close(*fd);
        *fd = -1;
    }
    return rc;
}

int dlock__file_value_write(struct file_state *s, const struct file_value_req *r)
{
    const struct file_value_kind *k = r->kind;
    if (r->len > k->max)
        return dlock__err(DLOCK_EINVAL, "%s '%s': a value of %zu bytes (at most %zu)", k->what,
                          r->name, r->len, k->max);
    char *full = dlock__file_full_name(s, r->name);
    if (!full)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    char fname[NAME_MAX + 1];
    int fd = -1;
    int rc = open_value(s, k, full, O_RDWR | O_CREAT, r->w, fname, &fd);
    if (!rc && r->guard)
        rc = r->guard(s, full, r->guard_arg);
    free(full);
    if (rc) {
        if (fd >= 0)
            close(fd);
        return rc;
    }
    struct value_header h = {0};
    if (pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h || memcmp(h.magic, k->magic, 8) != 0)
        h.version = 0; /* new (or not ours: rewritten) */
    memcpy(h.magic, k->magic, 8);
    h.token = r->token;
    h.version++;
    h.len = (uint32_t)r->len;
    struct iovec iov[2] = {{&h, sizeof h}, {(void *)r->data, r->len}};
    if (pwritev(fd, iov, 2, 0) != (ssize_t)(sizeof h + r->len) ||
        ftruncate(fd, (off_t)(sizeof h + r->len)) < 0)
        rc =
            dlock__errno(dlock__errno_code(errno), errno, "value file %s/%s: write", s->dir, fname);
    value_lock(s, fd, fname, F_UNLCK, NULL);
    close(fd); /* IN_CLOSE_WRITE: observers look again */
    return rc;
}

int dlock__file_value_read(struct file_state *s, const struct file_value_kind *k, const char *full,
                           struct file_value *out, struct dlock__wait *w)
{
    memset(out, 0, sizeof *out);
    char fname[NAME_MAX + 1];
    int fd = -1;
    /* Read-only: closing it raises no IN_CLOSE_WRITE for the observers. */
    int rc = open_value(s, k, full, O_RDONLY, w, fname, &fd);
    if (rc == DLOCK_ENOENT)
        return (out->data = calloc(1, 1)) ? DLOCK_OK : dlock__err(DLOCK_ENOMEM, "out of memory");
    if (rc)
        return rc;
    struct value_header h;
    if (pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h || memcmp(h.magic, k->magic, 8) ||
        h.len > k->max)
        memset(&h, 0, sizeof h);
    if (!(out->data = calloc(1, h.len + 1)))
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    else if (h.len && pread(fd, out->data, h.len, sizeof h) != (ssize_t)h.len)
        memset(&h, 0, sizeof h); /* cut short: no value */
    out->token = h.token;
    out->version = h.version;
    out->len = h.len;
    value_lock(s, fd, fname, F_UNLCK, NULL);
    close(fd);
    return rc;
}

/* ------------------------------------------------------- a lock's value */

/* The guard of a lock value's write: the hold's lock file (ARG, the
 * hold) is still the one the directory names for FULL. */
static int hold_still_ours(struct file_state *s, const char *full, void *arg)
{
    struct dlock__hold *h = arg;
    struct file_hold *fh = h->bdata;
    char fname[NAME_MAX + 1];
    int fd = -1;
    int rc = dlock__file_open_named(s, full, ".lock", O_RDONLY, fname, &fd);
    if (rc && rc != DLOCK_ENOENT)
        return rc;
    bool ours = !rc && fh && dlock__file_still_linked(s, fh->fd, fname);
    if (fd >= 0)
        close(fd);
    if (!ours)
        return dlock__err(DLOCK_ELOST,
                          "lock '%s' in %s: its lock file was removed or replaced; "
                          "the value is not written",
                          h->name, s->dir);
    return DLOCK_OK;
}

static int file_value_set(void *state, struct dlock__hold *h, const struct dlock__value *v)
{
    struct file_value_req r = {.kind = &dlock__file_lock_value,
                               .name = h->name,
                               .token = v ? h->token : 0,
                               .data = v ? v->data : "",
                               .len = v ? v->len : 0,
                               .guard = hold_still_ours,
                               .guard_arg = h};
    return dlock__file_value_write(state, &r);
}

static int file_value_get(void *state, const char *name, struct dlock__value *out)
{
    struct file_state *s = state;
    char *full = dlock__file_full_name(s, name);
    if (!full)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    struct file_value fv;
    int rc = dlock__file_value_read(s, &dlock__file_lock_value, full, &fv, NULL);
    free(full);
    out->data = fv.data;
    out->len = fv.token ? fv.len : 0;
    out->token = fv.token;
    return rc;
}

const struct dlock__value_ops dlock__file_value_ops = {
    .set = file_value_set,
    .get = file_value_get,
};
