/* semaphore.c -- the file backend's counting semaphore: one file,
 * one kernel byte lock per permit.
 *
 * Semaphore NAME is the file NAME.sem beside the lock files (the name
 * encoded as for NAME.lock, so a lock and a semaphore of one name are two
 * files). It starts with the lock files' header, whose last field keeps
 * the permit count (a semaphore made with another count is refused) and
 * whose token field is the fencing counter. Permit i is an OFD write lock
 * on byte SLOT_BYTE + i; a permit object of K permits is one descriptor
 * holding K such locks, so the kernel frees them all at once when the
 * descriptor closes: at release, or when the process dies (kill -9
 * included). Beside each slot, at REC_OFFSET + i * REC_SIZE, the holder
 * writes its identity ("pid@host#first-slot") for dlock_semaphore_inspect.
 *
 * Slots are only taken, and records only written, under the metadata
 * byte's write lock (byte 1, as the lock files use it), and an acquirer
 * that finds fewer than K free slots gives back the ones it took before
 * it lets go of byte 1. So nobody ever sees a slot held by an acquire
 * that is about to fail, and a waiter cannot miss a permit that is
 * coming back. Waiters sleep as lock waiters do (dlock__file_wait_take: an
 * inotify watch for IN_CLOSE_WRITE set before each try, raised when any
 * holder's descriptor closes); an asynchronous one parks on the client's
 * one watch (park.c) and is woken by every such close.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "file.h"

#define SUFFIX ".sem"
#define SLOT_BYTE 16        /* permit i: an OFD lock on byte 16 + i */
#define REC_OFFSET 8192     /* holder records; header + name stay below */
#define REC_SIZE 96         /* one record: "pid@host#slot", NUL-padded */

static off_t slot_byte(unsigned i)
{
    return (off_t)SLOT_BYTE + i;
}

/* The header of semaphore FULL opened as FD, checked against PERMITS (0:
 * no check). A fresh file reads as all zero. */
static int sem_header(struct file_state *s, int fd, const char *fname, const char *full,
                      unsigned permits, struct header *h)
{
    int rc = dlock__file_read_header(s, fd, fname, full, h);
    if (rc)
        return rc;
    if (h->magic[0] && permits && h->permits != permits)
        return dlock__err(DLOCK_EINVAL,
                          "semaphore '%s' has %u permits (stored in %s/%s), not %u: use its "
                          "count, or delete the file while nobody holds a permit to start over",
                          full, (unsigned)h->permits, s->dir, fname, permits);
    if (h->magic[0] && !h->permits)
        return dlock__err(DLOCK_EWRONGTYPE, "%s/%s is not a dlock semaphore file (left intact)",
                          s->dir, fname);
    return DLOCK_OK;
}

/* With the metadata byte held: take K free slots into SLOTS, all or none. */
static unsigned take_slots(int fd, unsigned permits, unsigned k, unsigned *slots)
{
    unsigned got = 0;
    for (unsigned i = 0; i < permits && got < k; i++)
        if (dlock__file_range_lock(fd, F_WRLCK, slot_byte(i)) == 0)
            slots[got++] = i;
    if (got < k) {
        for (unsigned j = 0; j < got; j++)
            dlock__file_range_lock(fd, F_UNLCK, slot_byte(slots[j]));
        return 0;
    }
    return got;
}

/* What stamp_sem() writes: the semaphore file's header H as read, its
 * PERMITS, and the K slots taken. */
struct sem_stamp {
    struct header *h;
    unsigned permits;
    const unsigned *slots;
    unsigned k;
};

/* With the metadata byte held and ST's slots taken: issue the next token,
 * keep the count, and write the holder's record beside each slot. */
static int stamp_sem(struct file_state *s, int fd, const char *fname, const char *full,
                     const struct sem_stamp *st, struct dlock__hold *hold)
{
    int rc = dlock__file_write_stamp(s, fd, fname, full, st->h, DLOCK_EXCLUSIVE, st->permits);
    if (rc)
        return rc;
    char rec[REC_SIZE] = {0};
    char who[REC_SIZE - 16];
    dlock__identity(who, sizeof who);
    snprintf(rec, sizeof rec, "%s#%u", who, st->slots[0]);
    for (unsigned j = 0; j < st->k; j++)
        if (pwrite(fd, rec, sizeof rec, REC_OFFSET + (off_t)st->slots[j] * REC_SIZE) != REC_SIZE)
            return dlock__errno(dlock__errno_code(errno), errno, "semaphore file %s/%s: write",
                                s->dir, fname);
    hold->token = st->h->token;
    snprintf(hold->owner, sizeof hold->owner, "%s", rec);
    return DLOCK_OK;
}

/* The semaphore's try, under the metadata byte: DLOCK_OK (K slots taken
 * and stamped), DLOCK_EBUSY (fewer free), or a failure. */
static int try_take(struct file_state *s, int fd, const char *fname, const char *full,
                    struct dlock__wait *w, struct file_turn *turn, void *arg)
{
    (void)turn;
    struct dlock__hold *hold = arg;
    unsigned permits = hold->sem->permits, k = hold->sem->k;
    int rc = dlock__file_meta_lock(s, fd, fname, F_WRLCK, w);
    if (rc)
        return rc;
    struct header h;
    unsigned *slots = calloc(k, sizeof *slots);
    rc = slots ? sem_header(s, fd, fname, full, permits, &h)
               : dlock__err(DLOCK_ENOMEM, "out of memory");
    if (!rc && !take_slots(fd, permits, k, slots))
        rc = DLOCK_EBUSY;
    struct sem_stamp st = {.h = &h, .permits = permits, .slots = slots, .k = k};
    if (!rc && (rc = stamp_sem(s, fd, fname, full, &st, hold)))
        for (unsigned j = 0; j < k; j++)
            dlock__file_range_lock(fd, F_UNLCK, slot_byte(slots[j]));
    free(slots);
    dlock__file_range_lock(fd, F_UNLCK, META_BYTE);
    return rc;
}

/* Whether HOLD's prefixed name fits below the holder records. */
static int name_fits(struct file_state *s, const struct dlock__hold *hold)
{
    size_t full_len = (s->prefix ? strlen(s->prefix) : 0) + strlen(hold->name);
    if (sizeof(struct header) + full_len > REC_OFFSET)
        return dlock__err(DLOCK_EINVAL, "semaphore '%.40s...': prefix and name are longer than %zu "
                                        "bytes", hold->name, REC_OFFSET - sizeof(struct header));
    return DLOCK_OK;
}

int dlock__file_sem_acquire(void *state, struct dlock__hold *hold, struct dlock__wait *w)
{
    struct file_state *s = state;
    int rc = name_fits(s, hold);
    return rc ? rc : dlock__file_acquire_by(s, hold, SUFFIX, w, try_take, hold); /* a close gives back the slots */
}

/* The asynchronous acquire (backend.h): the semaphore file's parked take
 * (mutex.c) with the semaphore's try. Its waiters are woken by every
 * close of the file (shared, in park.c's words), not one at a time: a
 * permit object given back may free several permits, and a waiter that
 * wants more than are free must not swallow the wake of one that wants
 * fewer. */
int dlock__file_sem_try_armed(void *state, struct dlock__hold *hold, struct dlock__wait *w,
                              void **park)
{
    struct file_park *p = *park;
    if (!p) {
        int rc = name_fits(state, hold);
        if (rc)
            return rc;
        if (!(p = *park = calloc(1, sizeof *p)))
            return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    struct file_park_req rq = {SUFFIX, try_take, hold, true};
    return dlock__file_park_take(state, hold, w, p, &rq);
}

int dlock__file_sem_release(void *state, struct dlock__hold *hold)
{
    (void)state;
    struct file_hold *fh = hold->bdata;
    if (!fh)
        return DLOCK_OK;
    /* Closing drops every slot lock of the permit and raises
     * IN_CLOSE_WRITE for the waiters. */
    close(fh->fd);
    free(fh);
    hold->bdata = NULL;
    return DLOCK_OK;
}

int dlock__file_sem_inspect(void *state, const char *name, unsigned permits, struct dlock_info *info)
{
    struct file_state *s = state;
    char fname[NAME_MAX + 1];
    char *full = dlock__file_full_name(s, name);
    if (!full)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    int fd = -1;
    int rc = dlock__file_inspect_open(s, full, SUFFIX, info, fname, &fd);
    info->permits = permits;
    info->free_permits = permits;
    if (rc == DLOCK_ENOENT) {
        free(full);
        return DLOCK_OK; /* never used */
    }
    struct header h;
    if (!rc && !(rc = dlock__file_meta_lock(s, fd, fname, F_RDLCK, NULL))) {
        rc = sem_header(s, fd, fname, full, permits, &h);
        if (!rc && h.magic[0]) {
            info->permits = h.permits;
            info->free_permits = h.permits;
            info->token = h.token;
        }
        for (unsigned i = 0; !rc && h.magic[0] && i < h.permits; i++) {
            struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = slot_byte(i),
                               .l_len = 1};
            if (fcntl(fd, F_OFD_GETLK, &fl) < 0) {
                rc = dlock__errno(DLOCK_EIO, errno, "semaphore file %s/%s", s->dir, fname);
                break;
            }
            if (fl.l_type == F_UNLCK)
                continue;
            info->held = 1;
            info->free_permits--;
            char rec[REC_SIZE + 1] = {0};
            if (pread(fd, rec, REC_SIZE, REC_OFFSET + (off_t)i * REC_SIZE) <= 0 || !rec[0])
                snprintf(rec, sizeof rec, "?#%u", i);
            rc = dlock__info_count_holder(info, rec); /* a holder per permit object */
        }
        dlock__file_range_lock(fd, F_UNLCK, META_BYTE);
    }
    if (fd >= 0)
        close(fd);
    free(full);
    return rc;
}
