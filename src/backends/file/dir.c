/* dir.c -- the file backend's default lock directory: one place per
 * user whatever the environment, that no other local user can take away.
 *
 * One place: a process of one user must find the same directory from a
 * login shell, cron, a systemd service or sudo, or the same job runs
 * twice. So nothing the session sets counts ($XDG_RUNTIME_DIR, $HOME),
 * only the effective uid and the file system: /run/lock/dlock-<uid>.
 * /run/lock is the FHS place for lock files, a tmpfs emptied at boot only
 * (tmp cleaners age files out of /tmp and /var/tmp: a lock file deleted
 * in use is a second holder), not made private by systemd's PrivateTmp,
 * and not deleted at logout as logind's /run/user/<uid> is. Where
 * /run/lock is not open to us (Fedora, Arch: 0755 root, so only root
 * uses it) the place is /var/tmp/dlock-<uid>.
 *
 * No squatting: anyone may write in a sticky world-writable directory,
 * so another user can make our name first, or plant a symlink there.
 * Such an entry is never used (it must be a directory, not a link, owned
 * by us); the next name is: dlock-<uid>.1, ... .7. Every process of the
 * user takes the highest-numbered one that is ours, making the first
 * free one when none is: a name once ours stays ours (the sticky bit
 * keeps others from removing it), so a squatter who later removes its
 * own directory cannot send later processes back to a lower name while
 * earlier ones hold locks in the higher one. With every name taken the
 * open fails with DLOCK_EACCES naming them and the way out.
 *
 * dlock_client_new() only looks (it creates nothing); the connect makes
 * the directory and checks that the choice still stands (a squatter can
 * take the name in between: then it fails, saying to open again).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file.h"

#define FALLBACKS 7 /* dlock-<uid>.1 ... .7 after dlock-<uid> */

static const char *const bases[] = {"/run/lock", "/var/tmp"};

/* Whether BASE can hold our directory: a directory (not a link) of
 * root's (or ours: the root of a user namespace) that is sticky and
 * world-writable, or that only we may write. Its owner may rename what is
 * in it, so no other owner is trusted. *PUBLIC: others may write there. */
static bool usable_base(const char *base, bool *public)
{
    struct stat st;
    uid_t me = geteuid();
    if (lstat(base, &st) < 0 || !S_ISDIR(st.st_mode) || (st.st_uid != 0 && st.st_uid != me))
        return false;
    *public = (st.st_mode & S_IWOTH) != 0;
    if (*public)
        return (st.st_mode & S_ISVTX) != 0;
    return !(st.st_mode & S_IWGRP) && st.st_uid == me;
}

static void candidate(char *out, size_t size, const char *base, unsigned uid, int i)
{
    if (i == 0)
        snprintf(out, size, "%s/dlock-%u", base, uid);
    else
        snprintf(out, size, "%s/dlock-%u.%d", base, uid, i);
}

/* Whether PATH is a directory of ours (not a link to one); else, when it
 * exists, its owner in *OWNER. */
static bool ours(const char *path, uid_t *owner)
{
    struct stat st;
    if (lstat(path, &st) < 0)
        return false;
    *owner = st.st_uid;
    return S_ISDIR(st.st_mode) && !S_ISLNK(st.st_mode) && st.st_uid == geteuid();
}

/* Which of BASE's N names to use: the highest that is ours; else the
 * first that does not exist yet (*ABSENT set: it is to be made); else -1
 * (all taken by others). */
static int pick(const char *base, unsigned uid, int n, bool *absent)
{
    char path[128];
    uid_t owner;
    *absent = false;
    for (int i = n - 1; i >= 0; i--) {
        candidate(path, sizeof path, base, uid, i);
        if (ours(path, &owner))
            return i;
    }
    struct stat st;
    for (int i = 0; i < n; i++) {
        candidate(path, sizeof path, base, uid, i);
        if (lstat(path, &st) < 0 && errno == ENOENT) {
            *absent = true;
            return i;
        }
    }
    return -1;
}

static int all_taken(const char *base, unsigned uid, int n)
{
    char first[128];
    uid_t owner = (uid_t)-1;
    candidate(first, sizeof first, base, uid, 0);
    (void)ours(first, &owner);
    if (n == 1)
        return dlock__err(DLOCK_EACCES,
                          "default lock directory %s is not a directory of yours (its owner: "
                          "uid %u); remove it, or name a directory of your own (-u "
                          "file:///DIR, or DLOCK_URL=file:///DIR)",
                          first, (unsigned)owner);
    return dlock__err(DLOCK_EACCES,
                      "default lock directory: %s and its fallbacks %s.1 to %s.%d are all taken "
                      "by other users (%s: uid %u), maybe to lock you out; remove them as root "
                      "(rm -r %s %s.*), or name a directory of your own (-u file:///DIR, or "
                      "DLOCK_URL=file:///DIR)",
                      first, first, first, n - 1, first, (unsigned)owner, first, first);
}

/* The base the default directory lives in, *N names there; NULL with a
 * message when there is none. */
static const char *find_base(int *n)
{
    bool public = false;
    for (size_t b = 0; b < sizeof bases / sizeof *bases; b++)
        if (usable_base(bases[b], &public)) {
            *n = public ? FALLBACKS + 1 : 1; /* only we may write there: no squatter */
            return bases[b];
        }
    dlock__err(DLOCK_ENOENT, "no default lock directory: neither /run/lock nor /var/tmp is a "
                             "sticky directory anyone may write to; name one (-u file:///DIR, "
                             "or DLOCK_URL=file:///DIR)");
    return NULL;
}

int dlock__file_default_dir(char **out)
{
    *out = NULL;
    int n;
    const char *base = find_base(&n);
    if (!base)
        return DLOCK_ENOENT;
    unsigned uid = (unsigned)geteuid();
    bool absent;
    int i = pick(base, uid, n, &absent);
    if (i < 0)
        return all_taken(base, uid, n);
    char path[128];
    candidate(path, sizeof path, base, uid, i);
    return (*out = dlock__strdup(path)) ? DLOCK_OK : dlock__err(DLOCK_ENOMEM, "out of memory");
}

int dlock__file_make_default_dir(const char *dir)
{
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
        return dlock__errno(dlock__errno_code(errno), errno,
                            "cannot create the default lock directory %s", dir);
    /* Another user may have taken the name since the client was made, or
     * another of our processes made a higher one: then this is no longer
     * the place every process of ours uses. */
    char *now = NULL;
    int rc = dlock__file_default_dir(&now);
    if (!rc && strcmp(now, dir) != 0)
        rc = dlock__err(DLOCK_EACCES,
                        "default lock directory %s was taken by another user while the client "
                        "was being made; the default is now %s: open the client again",
                        dir, now);
    free(now);
    return rc;
}

bool dlock__file_is_default_dir(const char *dir)
{
    char prefix[128];
    unsigned uid = (unsigned)geteuid();
    for (size_t b = 0; b < sizeof bases / sizeof *bases; b++) {
        int len = snprintf(prefix, sizeof prefix, "%s/dlock-%u", bases[b], uid);
        if (strncmp(dir, prefix, (size_t)len) != 0)
            continue;
        const char *rest = dir + len;
        if (!*rest)
            return true;
        if (rest[0] == '.' && rest[1] >= '1' && rest[1] <= '0' + FALLBACKS && !rest[2])
            return true;
    }
    return false;
}
