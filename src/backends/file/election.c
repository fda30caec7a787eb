/* election.c -- the file backend's leader election: the lock plus
 * a value file beside it.
 *
 * Election NAME is lock NAME (NAME.lock: whoever holds it leads, its
 * counter is the leader's token, the kernel frees it when the leader
 * dies) plus NAME.leader, which the leader writes under the lock when it
 * wins and at every proclaim: a value file (value.c: the leader's token,
 * a version bumped by every write, the value). The value counts only
 * while its token is the lock's current token and the lock is held, so
 * what a resigned or dead leader left behind is never read as current.
 *
 * The campaign takes the lock and issues its token under the lock file's
 * metadata byte (readers take it too), so a reader sees either no leader
 * or the new leader's token, never the new lock with the old token.
 *
 * Observers sleep on an inotify watch of the lock directory, set before
 * each look: a leader's release or death closes NAME.lock opened for
 * writing (IN_CLOSE_WRITE) and every write of NAME.leader ends with a
 * close too, so no change goes unseen and nobody polls.
 *
 * An asynchronous campaign parks as a lock's wait does (mutex.c, park.c:
 * the client's one inotify watch wakes it when the lock file closes).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "file.h"

/* An election's value file: NAME.leader. */
static const struct file_value_kind leader_value = {
    .suffix = ".leader", .magic = "DLOCKel\n", .max = 1u << 20, .what = "election"};

/* Write VALUE as the leader's with TOKEN into NAME.leader (the caller
 * holds lock NAME) within W's bound (NULL: the op timeout). */
static int write_value(struct file_state *s, const char *name, uint64_t token, const char *value,
                       struct dlock__wait *w)
{
    struct file_value_req r = {.kind = &leader_value, .name = name, .token = token,
                               .data = value, .len = strlen(value), .w = w};
    return dlock__file_value_write(s, &r);
}

/* The campaign's try: the lock byte taken and the token issued under the
 * metadata byte's write lock, which readers take too, so a reader never
 * sees the new leader's lock with the old leader's token (and value). */
static int campaign_try(struct file_state *s, int fd, const char *fname, const char *full,
                        struct dlock__wait *w, struct file_turn *turn, void *arg)
{
    (void)turn;
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

/* What a campaign does once its try took the lock: the value written
 * (a failure gives the lock back: no value, no lead; the message stays
 * the write's), the owner. */
static int campaign_won(struct file_state *s, struct dlock__hold *h, struct dlock__wait *w)
{
    int rc = write_value(s, h->name, h->token, h->elect->value, w);
    if (rc)
        dlock__file_release(s, h);
    else
        dlock__identity(h->owner, sizeof h->owner);
    return rc;
}

int dlock__file_elect_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
{
    int rc = dlock__file_acquire_by(state, h, ".lock", w, campaign_try, h);
    return rc ? rc : campaign_won(state, h, w);
}
/* The asynchronous campaign (backend.h): the lock file's parked take
 * (mutex.c) with the campaign's try, then what the blocking one does. */
int dlock__file_elect_try_armed(void *state, struct dlock__hold *h, struct dlock__wait *w,
                                void **park)
{
    struct file_park *p = *park;
    if (!p && !(p = *park = calloc(1, sizeof *p)))
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    struct file_park_req rq = {".lock", campaign_try, h, false};
    int rc = dlock__file_park_take(state, h, w, p, &rq);
    return rc ? rc : campaign_won(state, h, w);
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
    struct file_value vh = {0};
    if (!rc)
        rc = dlock__file_value_read(s, &leader_value, full, &vh, w);
    char *value = vh.data;
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
