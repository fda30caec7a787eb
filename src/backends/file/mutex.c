/* mutex.c -- the embedded default backend: locks between processes of one
 * machine, made real by the kernel.
 *
 * Each name is a file in the lock directory. The lock itself is an
 * open-file-description (OFD) record lock on byte 0 of that file:
 * exclusive = write lock, shared = read lock. The kernel drops it the
 * moment the holder's descriptor closes, which includes kill -9, so a lock
 * is never stale. OFD locks belong to an open file, not to a process, so
 * two threads of one process (each with its own descriptor) exclude each
 * other too.
 *
 * Writers are not starved by a stream of readers: a writer that has to
 * wait write-locks byte 2 (the gate) until it holds byte 0, and a reader
 * does not take byte 0 while another open file holds the gate (the
 * kernel alone would grant every new read lock beside the others). A
 * writer downgrades in place: the kernel turns its write lock on byte 0
 * into a read lock in one fcntl, with no moment unlocked.
 *
 * Waiters sleep in the kernel: before each try they watch the file with
 * inotify for IN_CLOSE_WRITE, which the kernel raises whenever a
 * descriptor opened for writing is closed -- by a release or by the death
 * of its process. A cancel wakes poll() through the wait's eventfd. A
 * parked asynchronous acquire (file_try_armed) makes the same tries with
 * no thread: its watch is on the client's one instance for parked waits,
 * whose thread wakes it (park.c).
 *
 * The file also keeps the fencing counter and the last holder's identity
 * in a small header, written under a second OFD lock (byte 1) so shared
 * holders never race on it. That lock is only ever tried, never waited
 * for in the kernel: whoever can open the file can hold byte 1, and a
 * blocking wait would ignore the caller's deadline and cancel. Lock files
 * are never deleted: deleting one would restart its token counter.
 *
 * Whoever can open a lock file can lock it, so lock files are 0600 (0660
 * with the directory's group in a directory shared by a group), and in a
 * directory others may write to (/run/lock is 1777) a file owned by
 * neither us nor the directory's owner is refused: it may have been
 * planted to reset the token counter or to lock everyone out.
 *
 * Names map to file names without escaping the directory or colliding:
 * [A-Za-z0-9_-] and inner '.' stay, every other byte becomes %XX, and
 * ".lock" is appended. A name whose encoding is too long for one file name
 * becomes "#<prefix>~<128-bit hash>.lock"; the full name is stored in the
 * header and checked on every open, so a hash collision is an error, never
 * a shared lock.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "file.h"

/* ------------------------------------------------------------ names */

static void fnv128(const char *s, size_t n, uint64_t out[2])
{
    uint64_t a = 14695981039346656037ULL, b = 0x6c62272e07bb0142ULL;
    for (size_t i = 0; i < n; i++) {
        a = (a ^ (unsigned char)s[i]) * 1099511628211ULL;
        b = (b ^ (unsigned char)s[i]) * 0x100000001b3ULL + (b >> 29);
    }
    out[0] = a;
    out[1] = b;
}

/* The file name for FULL (prefix + name) into OUT (NAME_MAX + 1). The
 * names of existing lock files may never change (a renamed file is a new
 * lock with a new token counter), so this keeps the encoding the backend
 * has always used (check_file's pinned_names holds it): the shared codec
 * keeping inner dots, except that ".." stays "%2E." rather than the
 * codec's "%2E%2E"; and a name is hashed once an encoded byte would start
 * past MAX_ENCODED - 3, as the old encoder stopped there. */
static int file_name(const char *full, const char *suffix, char out[NAME_MAX + 1])
{
    char *enc = strcmp(full, "..") == 0 ? strdup("%2E.")
                                        : dlock__name_encode(full, ".", DLOCK__ENC_NO_LEADING_DOT);
    if (!enc)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    size_t n = strlen(enc);
    size_t last = n >= 3 && enc[n - 3] == '%' ? n - 3 : n ? n - 1 : 0; /* the last byte's escape */
    if (last + 3 <= MAX_ENCODED) {
        snprintf(out, NAME_MAX + 1, "%s%s", enc, suffix);
        free(enc);
        return DLOCK_OK;
    }
    uint64_t h[2];
    fnv128(full, strlen(full), h);
    enc[100] = 0;
    if (enc[99] == '%' || enc[98] == '%') /* never cut an escape in half */
        enc[enc[99] == '%' ? 99 : 98] = 0;
    snprintf(out, NAME_MAX + 1, "#%s~%016llx%016llx%s", enc, (unsigned long long)h[0],
             (unsigned long long)h[1], suffix);
    free(enc);
    return DLOCK_OK;
}

char *dlock__file_full_name(struct file_state *s, const char *name)
{
    return dlock__sprintf("%s%s", s->prefix ? s->prefix : "", name);
}

/* ------------------------------------------------------ byte locks */

/* Try (never wait for) an OFD lock of TYPE on byte START. */
int dlock__file_range_lock(int fd, short type, off_t start)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = start, .l_len = 1};
    return fcntl(fd, F_OFD_SETLK, &fl);
}

/* Whether another open file holds the gate (byte 2): a writer is
 * waiting, and a new reader lets it go first. */
static bool gate_closed(int fd)
{
    struct flock fl = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = GATE_BYTE, .l_len = 1};
    return fcntl(fd, F_OFD_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
}

static void sleep_ms(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Take B's byte. Its legitimate holders keep it for a few syscalls (a
 * pread and a pwrite), but anyone who can open the file can hold it
 * forever, so it is never waited for in the kernel (F_OFD_SETLKW would
 * ignore the deadline and the cancel): it is tried on a backoff of 1 to
 * 50 ms, within W's deadline and cancellable for a call that waits, for
 * META_TRY_MS for a try-once call (then DLOCK_EBUSY), and for the op
 * timeout when W is NULL (inspect, proclaim; then DLOCK_ETIMEDOUT). */
int dlock__file_byte_lock(struct file_state *s, const struct file_byte *b, struct dlock__wait *w)
{
    struct dlock__backoff backoff = {.min_ms = 1, .max_ms = 50};
    bool own_clock = !w || dlock__wait_try_once(w);
    int64_t op_ms = s->c->opts.op_timeout_ms > 0 ? s->c->opts.op_timeout_ms : 5000;
    int64_t until = dlock__now_ms() + (w ? META_TRY_MS : op_ms);
    for (;;) {
        if (dlock__file_range_lock(b->fd, b->type, b->byte) == 0)
            return DLOCK_OK;
        if (errno != EAGAIN && errno != EACCES && errno != EINTR)
            return dlock__errno(DLOCK_EIO, errno, "%s %s/%s: lock of its %s", b->what, s->dir,
                                b->fname, b->role);
        int64_t delay = dlock__backoff_next(&backoff);
        int rc = DLOCK_OK;
        if (own_clock) {
            int64_t left = until - dlock__now_ms();
            if (left > 0)
                sleep_ms(delay < left ? delay : left);
            else
                rc = w ? DLOCK_EBUSY : DLOCK_ETIMEDOUT;
        } else {
            rc = dlock__wait_sleep(w, dlock__wait_seq(w), dlock__now_ms() + delay);
        }
        if (rc == DLOCK_ECANCELED)
            return dlock__err(rc, "%s %s/%s: canceled while its %s was locked by another process",
                              b->what, s->dir, b->fname, b->role);
        if (rc)
            return dlock__err(rc, "%s %s/%s: its %s stays locked by another process (a file "
                                  "others can open can be held this way: it should be mode 0600 "
                                  "or 0660)", b->what, s->dir, b->fname, b->role);
    }
}

int dlock__file_meta_lock(struct file_state *s, int fd, const char *fname, short type,
                          struct dlock__wait *w)
{
    struct file_byte b = {.fd = fd, .fname = fname, .what = "lock file",
                          .role = "metadata byte (byte 1)", .byte = META_BYTE, .type = type};
    return dlock__file_byte_lock(s, &b, w);
}

/* Read the header (and, when FULL is given, check the stored name) in
 * one pread; all zero for a new empty file. DLOCK_EWRONGTYPE for a file
 * that is not ours or belongs to another name (hash collision). With
 * AFTER, the same pread goes on past the name, 8-aligned, for AFTER_LEN
 * bytes more (delay.c's record), and *GOT says how many of them the
 * file had. */
int dlock__file_read_header_after(struct file_state *s, int fd, const char *path,
                                  const char *full, struct header *h, void *after,
                                  size_t after_len, size_t *got)
{
    size_t len = full ? strlen(full) : 0;
    char buf[sizeof *h + DLOCK_NAME_MAX + 512 + FILE_AFTER_MAX + 8];
    size_t room = sizeof buf - sizeof *h - FILE_AFTER_MAX - 8;
    size_t want = sizeof *h + (len < room ? len : room);
    size_t at = (want + 7) & ~(size_t)7; /* where AFTER's bytes start */
    if (after && after_len <= FILE_AFTER_MAX && len < room)
        want = at + after_len;
    if (got)
        *got = 0;
    memset(h, 0, sizeof *h);
    ssize_t n = pread(fd, buf, want, 0);
    if (n < 0)
        return dlock__errno(DLOCK_EIO, errno, "file lock %s/%s: read", s->dir, path);
    if (n == 0)
        return DLOCK_OK;
    if ((size_t)n < sizeof *h || memcmp(buf, MAGIC, 8) != 0)
        return dlock__err(DLOCK_EWRONGTYPE, "file %s in %s is not a dlock lock file (left intact)",
                          path, s->dir);
    memcpy(h, buf, sizeof *h);
    if (full && h->name_len &&
        (h->name_len != len || (size_t)n < sizeof *h + len || memcmp(buf + sizeof *h, full, len)))
        return dlock__err(DLOCK_EWRONGTYPE,
                          "file lock %s/%s belongs to another name (hash collision); "
                          "rename the lock",
                          s->dir, path);
    if (got && want > at && (size_t)n > at) {
        *got = (size_t)n - at;
        memcpy(after, buf + at, *got);
    }
    return DLOCK_OK;
}

int dlock__file_read_header(struct file_state *s, int fd, const char *path, const char *full,
                            struct header *h)
{
    return dlock__file_read_header_after(s, fd, path, full, h, NULL, 0, NULL);
}

/* ------------------------------------------------------------ open */

static int check_dir(struct file_state *s, bool is_default)
{
    int rc = is_default ? dlock__file_make_default_dir(s->dir) : DLOCK_OK;
    if (rc)
        return rc;
    /* Open first, then look at what was opened: no window to swap it. The
     * default directory may not be a symlink (someone could plant one in
     * /tmp); a directory named in a URL may. */
    s->dirfd = open(s->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | (is_default ? O_NOFOLLOW : 0));
    if (s->dirfd < 0) {
        int e = errno;
        struct stat lst;
        if (is_default && (e == ELOOP || e == ENOTDIR) && lstat(s->dir, &lst) == 0 &&
            S_ISLNK(lst.st_mode))
            return dlock__err(DLOCK_EACCES,
                              "default lock directory %s is a symlink: refused (someone else "
                              "may have planted it)",
                              s->dir);
        if (e == ENOTDIR) /* a configuration error: DLOCK_ENOENT, "no such directory" */
            return dlock__err(DLOCK_ENOENT, "lock directory %s is not a directory", s->dir);
        return dlock__errno(dlock__errno_code(e), e, "lock directory %s", s->dir);
    }
    struct stat st;
    if (fstat(s->dirfd, &st) < 0)
        return dlock__errno(DLOCK_EIO, errno, "lock directory %s", s->dir);
    if (is_default && st.st_uid != geteuid())
        return dlock__err(DLOCK_EACCES,
                          "default lock directory %s belongs to uid %u, not to you (uid %u); "
                          "refusing to use it",
                          s->dir, (unsigned)st.st_uid, (unsigned)geteuid());
    if (is_default && (st.st_mode & 022))
        return dlock__err(DLOCK_EACCES,
                          "default lock directory %s is writable by others (mode %03o); "
                          "refusing to use it (chmod 700 it)",
                          s->dir, (unsigned)(st.st_mode & 0777));
    if (faccessat(s->dirfd, ".", W_OK | X_OK, AT_EACCESS) < 0)
        return dlock__errno(DLOCK_EACCES, errno, "lock directory %s is not writable", s->dir);
    s->dir_uid = st.st_uid;
    s->dir_gid = st.st_gid;
    s->dir_public = (st.st_mode & S_IWOTH) != 0;
    s->group_shared = !s->dir_public && (st.st_mode & S_IWGRP);
    s->file_mode = s->group_shared ? 0660 : 0600;
    return DLOCK_OK;
}

/* An inotify instance with no watch and no pending event. */
int dlock__file_inotify_borrow(struct file_state *s)
{
    int fd = -1, wd = -1;
    pthread_mutex_lock(&s->pool_mu);
    if (s->npool) {
        fd = s->pool[--s->npool];
        wd = s->pool_wd[s->npool];
    }
    pthread_mutex_unlock(&s->pool_mu);
    if (fd < 0)
        return inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (wd >= 0)
        inotify_rm_watch(fd, wd);
    char buf[4096];
    ssize_t n;
    /* IN_IGNORED from the last watch's removal, stale events: a read
     * that left room for another event took the last of them (the
     * watch is gone: nothing comes after its IN_IGNORED). */
    while ((n = read(fd, buf, sizeof buf)) > 0 &&
           (size_t)n > sizeof buf - sizeof(struct inotify_event) - NAME_MAX - 1)
        ;
    return fd;
}

/* Give an instance back. Its watch is removed by the next borrower, off
 * the hand-off path (removing a watch costs microseconds). */
void dlock__file_inotify_return(struct file_state *s, int fd, int wd)
{
    pthread_mutex_lock(&s->pool_mu);
    if (s->npool < INOTIFY_POOL) {
        s->pool_wd[s->npool] = wd;
        s->pool[s->npool++] = fd;
        fd = -1;
    }
    pthread_mutex_unlock(&s->pool_mu);
    if (fd >= 0)
        close(fd);
}

static void file_close(void *state)
{
    struct file_state *s = state;
    if (!s)
        return;
    dlock__file_contend_stop(s);
    dlock__file_parker_free(s);
    while (s->npool)
        close(s->pool[--s->npool]);
    pthread_mutex_destroy(&s->pool_mu);
    if (s->dirfd >= 0)
        close(s->dirfd);
    free(s->dir);
    free(s);
}

static int file_open(dlock_client *c, void **state)
{
    struct dlock__url *u = &c->url;
    for (size_t i = 0; i < u->nhosts; i++)
        if (strcmp(u->hosts[i].host, "localhost") != 0 || u->hosts[i].port)
            return dlock__err(DLOCK_EBADURL,
                              "bad URL '%s': a file URL names a local directory, "
                              "file:///dir (host '%s' given)",
                              u->redacted, u->hosts[i].host);
    if (!u->path || strcmp(u->path, "/") == 0)
        return dlock__err(DLOCK_EBADURL,
                          "bad URL '%s': a file URL needs a directory, e.g. file:///run/lock/myapp",
                          u->redacted);
    /* No server to log in to or speak TLS with, one layout: an option of
     * those is a URL meant for another backend, refused as they refuse
     * theirs (the durations are accepted and unused: no lease here). */
    const char *unused = c->opts.layout     ? "layout"
                         : c->opts.tls_ca   ? "tls_ca"
                         : c->opts.tls_cert ? "tls_cert"
                         : c->opts.tls_key  ? "tls_key"
                         : c->opts.user     ? "user"
                         : c->opts.password ? "password"
                                            : NULL;
    if (unused)
        return dlock__err(DLOCK_EBADURL, "bad URL '%s': option '%s' is not used by the file backend "
                                         "(a local directory: no server, one layout)",
                          u->redacted, unused);
    struct file_state *s = calloc(1, sizeof *s);
    if (!s)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    s->c = c;
    s->dirfd = -1;
    pthread_mutex_init(&s->pool_mu, NULL);
    s->prefix = c->opts.key_prefix;
    size_t len = strlen(u->path);
    s->dir = strndup(u->path, len > 1 && u->path[len - 1] == '/' ? len - 1 : len);
    if (gethostname(s->host, sizeof s->host) < 0)
        strcpy(s->host, "localhost");
    s->host[HOST_MAX - 1] = 0;
    dlock__file_boot_id(s->boot_id);
    /* Only the default directory is made when missing: a directory named
     * in a URL that does not exist is more likely a typo than a wish. */
    bool is_default = s->dir && dlock__file_is_default_dir(s->dir);
    int rc = s->dir ? check_dir(s, is_default) : dlock__err(DLOCK_ENOMEM, "out of memory");
    if (rc) {
        file_close(s);
        return rc;
    }
    *state = s;
    return DLOCK_OK;
}

/* Whether a lock file owned by UID may be used. In a directory others
 * may write to, only files of ours or of the directory's owner: anyone
 * else's may have been planted to reset the token counter or to hold the
 * lock from outside. Elsewhere whoever could create the file is trusted
 * by the directory's owner. */
static bool trusted_owner(const struct file_state *s, uid_t uid)
{
    return !s->dir_public || uid == geteuid() || uid == s->dir_uid;
}

/* A lock file just made by us, or an old one of ours with wider
 * permissions (files were 0644 before): give it the mode new files get,
 * and in a group-shared directory the directory's group (0600 if that
 * group cannot be given). Only ever narrows an old file's mode. */
static void set_file_mode(struct file_state *s, int fd, const struct stat *st, bool created)
{
    mode_t want = s->file_mode;
    if (created && s->group_shared && st->st_gid != s->dir_gid &&
        fchown(fd, (uid_t)-1, s->dir_gid) < 0)
        want = 0600;
    if (!created)
        want &= st->st_mode & 0777;
    if ((st->st_mode & 0777) != want && (created || st->st_uid == geteuid()))
        (void)fchmod(fd, want); /* a failure leaves the mode the umask gave */
}

/* Open the lock file for FULL (creating it when FLAGS has O_CREAT), with
 * its name in FNAME. Refuses what is not a regular file and, in a
 * directory others may write to, a file of an untrusted owner. */
int dlock__file_open_named(struct file_state *s, const char *full, const char *suffix, int flags,
                           char *fname, int *fd)
{
    struct stat st;
    return dlock__file_open_named_st(s, full, suffix, flags, fname, fd, &st);
}

int dlock__file_open_named_st(struct file_state *s, const char *full, const char *suffix,
                              int flags, char *fname, int *fd, struct stat *opened)
{
    int rc = file_name(full, suffix, fname);
    if (rc)
        return rc;
    int base = (flags & ~O_CREAT) | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK;
    bool created = false;
    /* Open what exists, else create it exclusively: then we know whether
     * the file is ours to set up. Bounded against a directory where files
     * keep appearing and vanishing. */
    for (int tries = 0;; tries++) {
        *fd = openat(s->dirfd, fname, base);
        if (*fd >= 0 || errno != ENOENT || !(flags & O_CREAT) || tries == 100)
            break;
        *fd = openat(s->dirfd, fname, base | O_CREAT | O_EXCL, s->file_mode);
        if (*fd >= 0) {
            created = true;
            break;
        }
        if (errno != EEXIST)
            break;
    }
    if (*fd < 0) {
        int e = errno;
        struct stat st;
        if (e == ENOENT && !(flags & O_CREAT))
            return DLOCK_ENOENT; /* never locked: no message needed */
        if (e == ELOOP)
            return dlock__err(DLOCK_EWRONGTYPE, "lock file %s/%s is a symlink (left intact)",
                              s->dir, fname);
        if (e == EACCES && fstatat(s->dirfd, fname, &st, AT_SYMLINK_NOFOLLOW) == 0)
            return dlock__err(DLOCK_EACCES,
                              "lock file %s/%s belongs to uid %u with mode %04o: not open to "
                              "you (uid %u); lock files are shared through a directory of a "
                              "group (chmod 2770 DIR; chgrp GROUP DIR)",
                              s->dir, fname, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777),
                              (unsigned)geteuid());
        return dlock__errno(dlock__errno_code(e), e, "lock file %s/%s", s->dir, fname);
    }
    struct stat st;
    if (fstat(*fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(*fd);
        *fd = -1;
        return dlock__err(DLOCK_EWRONGTYPE, "%s/%s is not a regular file (left intact)", s->dir,
                          fname);
    }
    if (!trusted_owner(s, st.st_uid)) {
        close(*fd);
        *fd = -1;
        return dlock__err(DLOCK_EACCES,
                          "lock file %s/%s belongs to uid %u, neither you (uid %u) nor the owner "
                          "of the directory (uid %u), which others may write to: it may have been "
                          "planted to reset the token counter or to hold the lock; refusing it "
                          "(remove it, or use a directory only you or your group can write to)",
                          s->dir, fname, (unsigned)st.st_uid, (unsigned)geteuid(),
                          (unsigned)s->dir_uid);
    }
    if (created || (st.st_mode & 0777 & ~s->file_mode))
        set_file_mode(s, *fd, &st, created);
    *opened = st; /* its identity (the mode may have changed since) */
    return DLOCK_OK;
}

/* ------------------------------------------------------- acquiring */

/* Whether FNAME in the directory is the file whose fstat is OPEN. */
static bool linked_as(struct file_state *s, const struct stat *open, const char *fname)
{
    struct stat b;
    return fstatat(s->dirfd, fname, &b, AT_SYMLINK_NOFOLLOW) == 0 && open->st_dev == b.st_dev &&
           open->st_ino == b.st_ino;
}

/* Whether FNAME in the directory still is the file FD has open. */
bool dlock__file_still_linked(struct file_state *s, int fd, const char *fname)
{
    struct stat a;
    return fstat(fd, &a) == 0 && linked_as(s, &a, fname);
}

int dlock__file_write_stamp(struct file_state *s, int fd, const char *fname, const char *full,
                            struct header *h, dlock_mode mode, uint32_t permits)
{
    size_t len = strlen(full);
    bool fresh = h->magic[0] == 0;
    memcpy(h->magic, MAGIC, 8);
    h->token++;
    h->mode = mode;
    h->pid = (uint32_t)dlock__pid();
    h->since_ms = dlock__wall_ms();
    memcpy(h->host, s->host, HOST_MAX);
    h->name_len = (uint32_t)len;
    h->permits = permits;
    /* One write: a crash or a reader never sees a header without its
     * name. */
    struct iovec iov[2] = {{h, sizeof *h}, {(void *)full, fresh ? len : 0}};
    if (pwritev(fd, iov, 2, 0) != (ssize_t)(sizeof *h + (fresh ? len : 0)))
        return dlock__errno(dlock__errno_code(errno), errno, "%s file %s/%s: write",
                            permits ? "semaphore" : "lock", s->dir, fname);
    return DLOCK_OK;
}

/* Issue the next token and record the holder. Shared holders may do this
 * at the same time, so they take the meta lock; an exclusive holder is
 * alone by definition and skips it (two syscalls off the hand-off path). */
int dlock__file_stamp(struct file_state *s, int fd, const char *fname, const char *full,
                      dlock_mode mode, struct dlock__wait *w, uint64_t *token)
{
    bool meta = mode == DLOCK_SHARED;
    int rc = meta ? dlock__file_meta_lock(s, fd, fname, F_WRLCK, w) : DLOCK_OK;
    if (rc)
        return rc;
    struct header h;
    rc = dlock__file_read_header(s, fd, fname, full, &h);
    if (!rc) {
        rc = dlock__file_write_stamp(s, fd, fname, full, &h, mode, 0);
        *token = h.token;
    }
    if (meta)
        dlock__file_range_lock(fd, F_UNLCK, META_BYTE);
    return rc;
}

/* Open T's file for writing (creating it), its identity known from
 * the open's own fstat. */
static int take_open(struct file_take *t)
{
    int rc = dlock__file_open_named_st(t->s, t->full, t->suffix, O_RDWR | O_CREAT, t->fname,
                                       &t->fd, &t->opened);
    t->known = rc == DLOCK_OK;
    return rc;
}

int dlock__file_take_begin(struct file_take *t)
{
    t->fd = t->ifd = t->wd = -1;
    t->degraded = t->known = t->undrained = false;
    t->backoff = (struct dlock__backoff){.min_ms = 1, .max_ms = 100};
    t->turn = (struct file_turn){.fresh = true}; /* the next try is the first on this descriptor */
    return take_open(t);
}

int dlock__file_watch_add(struct file_take *t)
{
    if (t->ifd >= 0) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "/proc/self/fd/%d", t->fd);
        t->wd = inotify_add_watch(t->ifd, path,
                                  IN_CLOSE_WRITE | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF);
        if (t->wd >= 0)
            return DLOCK_OK;
    }
    /* Out of inotify instances or watches (per-user limits,
     * fs.inotify.max_user_instances / max_user_watches): rather than
     * fail, retry on a backoff of 1 to 100 ms. */
    if (errno != EMFILE && errno != ENFILE && errno != ENOSPC && errno != ENOMEM)
        return dlock__errno(DLOCK_EIO, errno, "lock file %s/%s: inotify", t->s->dir, t->fname);
    t->degraded = true;
    return DLOCK_OK;
}

int dlock__file_take_step(struct file_take *t, struct dlock__wait *w)
{
    for (;;) {
        t->turn.retry_at = DLOCK__NEVER;
        int rc = t->try_take(t->s, t->fd, t->fname, t->full, w, &t->turn, t->arg);
        t->turn.fresh = false;
        if (rc && rc != DLOCK_EBUSY)
            return rc;
        if (!t->known && fstat(t->fd, &t->opened) == 0)
            t->known = true;
        if (!t->known || !linked_as(t->s, &t->opened, t->fname)) {
            /* Someone deleted or replaced the file: a lock on the old inode
             * excludes nobody. Start over on what the name points to now
             * (closing gives back what the try took). */
            close(t->fd);
            t->fd = -1;
            t->known = t->undrained = false;
            t->ops->unwatch(t);
            t->turn.fresh = true;
            rc = take_open(t);
            if (rc)
                return rc;
            continue;
        }
        if (rc == DLOCK_OK || dlock__wait_try_once(w) || t->wd >= 0 || t->degraded)
            return rc;
        /* Watch first, then try again: a release in between is seen. */
        if ((rc = t->ops->watch(t)))
            return rc;
    }
}

void dlock__file_take_end(struct file_take *t)
{
    t->ops->unwatch(t);
    if (t->fd >= 0)
        close(t->fd); /* drops the locks if we got them */
    t->fd = -1;
}

/* The blocking wait's watch: an instance of its own, borrowed from the
 * client's idle ones. */
static int borrowed_watch(struct file_take *t)
{
    t->ifd = dlock__file_inotify_borrow(t->s);
    int rc = dlock__file_watch_add(t);
    if (t->degraded)
        t->ops->unwatch(t);
    return rc;
}

static void borrowed_unwatch(struct file_take *t)
{
    if (t->ifd >= 0)
        dlock__file_inotify_return(t->s, t->ifd, t->wd);
    t->ifd = t->wd = -1;
}

static const struct file_watch_ops borrowed_watch_ops = {borrowed_watch, borrowed_unwatch};

/* The blocking wait: T's tries, sleeping between them in poll() on the
 * watch (or on a backoff, degraded) within W's deadline and cancel. */
static int take_wait(struct file_take *t, struct dlock__wait *w)
{
    int rc;
    while ((rc = dlock__file_take_step(t, w)) == DLOCK_EBUSY && !dlock__wait_try_once(w)) {
        if (t->degraded) {
            int64_t next = dlock__now_ms() + dlock__backoff_next(&t->backoff);
            rc = dlock__wait_sleep(w, dlock__wait_seq(w),
                                   next < t->turn.retry_at ? next : t->turn.retry_at);
        } else if (t->undrained) {
            /* The last wake's events are read only now that its try failed
             * (a try that takes the lock leaves them to the pool, which
             * empties an instance it lends); a release before this read is
             * seen by the try after it, one after it by the poll. */
            char buf[4096];
            ssize_t drained = read(t->ifd, buf, sizeof buf); /* one read takes all queued */
            (void)drained;
            t->undrained = false;
            continue;
        } else {
            /* a lock-delay: until its end */
            rc = dlock__wait_poll(w, t->ifd, POLLIN, t->turn.retry_at);
            t->undrained = true;
        }
        if (rc)
            break;
    }
    return rc;
}

/* The lock's try: byte 0 in TYPE, then the token issued. A reader
 * finding the gate closed (a writer waits) does not try: the writer goes
 * first. A writer that will wait closes the gate (unless another waiting
 * writer has it), and opens it again once byte 0 keeps readers out. */
struct lock_try {
    short type;
    dlock_mode mode;
    uint64_t *token; /* the hold's: set once taken */
    bool gated;      /* we hold the gate (a waiting writer) */
    struct file_waiting waiting; /* announced to a holder (contend.c) */
};

static int lock_try(struct file_state *s, int fd, const char *fname, const char *full,
                    struct dlock__wait *w, struct file_turn *turn, void *arg)
{
    struct lock_try *t = arg;
    if (turn->fresh)
        t->gated = false; /* a new descriptor holds no gate */
    if (t->type == F_RDLCK && gate_closed(fd))
        return DLOCK_EBUSY;
    if (dlock__file_range_lock(fd, t->type, LOCK_BYTE) == 0) {
        /* Byte 0 ours: the last hold is over. Did it end cleanly? If not,
         * its lock-delay (delay.c) keeps the name, gate and all, until its
         * end; a close of the file meanwhile (another try) wakes us early,
         * nothing else does. */
        struct header h;
        struct file_delay_req q = {.fd = fd, .fname = fname, .full = full, .start = true,
                                   .header = &h};
        int64_t left = 0;
        int rc = dlock__file_delay_look(s, &q, &left);
        dlock__wait_in_delay(w, left);
        if (rc || left > 0) {
            dlock__file_range_lock(fd, F_UNLCK, LOCK_BYTE);
            turn->retry_at = dlock__now_ms() + left;
            return rc ? rc : DLOCK_EBUSY;
        }
        if (t->gated)
            dlock__file_range_lock(fd, F_UNLCK, GATE_BYTE); /* byte 0 keeps readers out now */
        t->gated = false;
        if (t->mode == DLOCK_SHARED) { /* other readers stamp too: under the meta lock */
            rc = dlock__file_stamp(s, fd, fname, full, t->mode, w, t->token);
        } else { /* alone on byte 0: the header the look read is the file's */
            rc = dlock__file_write_stamp(s, fd, fname, full, &h, t->mode, 0);
            *t->token = h.token;
        }
        if (rc)
            dlock__file_range_lock(fd, F_UNLCK, LOCK_BYTE);
        return rc;
    }
    if (errno != EAGAIN && errno != EACCES)
        return dlock__errno(DLOCK_EIO, errno, "lock file %s/%s", s->dir, fname);
    if (t->type == F_WRLCK && !t->gated && !dlock__wait_try_once(w))
        t->gated = dlock__file_range_lock(fd, F_WRLCK, GATE_BYTE) == 0; /* else another writer has it */
    if (!dlock__wait_try_once(w))
        dlock__file_wait_announce(s, full, &t->waiting); /* to a holder that listens */
    return DLOCK_EBUSY;
}

/* HOLD keeps FD, its file's descriptor, until its release; out of
 * memory, FD is closed, giving back what it locked. */
static int hold_keep(struct dlock__hold *hold, int fd)
{
    struct file_hold *fh = calloc(1, sizeof *fh);
    if (!fh) {
        close(fd);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    fh->fd = fd;
    fh->waiting_fd = -1;
    hold->bdata = fh;
    return DLOCK_OK;
}

int dlock__file_acquire_by(struct file_state *s, struct dlock__hold *hold, const char *suffix,
                           struct dlock__wait *w, file_try_fn try_take, void *arg)
{
    char *full = dlock__file_full_name(s, hold->name);
    if (!full)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    struct file_take t = {.s = s, .full = full, .suffix = suffix, .try_take = try_take,
                          .arg = arg, .ops = &borrowed_watch_ops};
    int rc = dlock__file_take_begin(&t);
    if (!rc)
        rc = take_wait(&t, w);
    if (!rc) {
        rc = hold_keep(hold, t.fd);
        t.fd = -1;
    }
    dlock__file_take_end(&t);
    free(full);
    return rc;
}

/* An exclusive hold just taken by a client with a lock-delay: its record
 * says "held" until its clean release (delay.c). Before the acquire
 * returns, so a holder that dies in between has done nothing under the
 * lock yet. A failure gives the lock back. */
static int arm_delay(struct file_state *s, struct dlock__hold *hold)
{
    struct file_hold *fh = hold->bdata;
    char fname[NAME_MAX + 1] = "";
    char *full = dlock__file_full_name(s, hold->name);
    int rc = full ? file_name(full, ".lock", fname) : dlock__err(DLOCK_ENOMEM, "out of memory");
    struct file_delay_req q = {.fd = fh->fd, .fname = fname, .full = full};
    if (!rc)
        rc = dlock__file_delay_arm(s, &q, hold->token, s->c->opts.lock_delay_ms, &fh->delay_at);
    free(full);
    if (rc)
        dlock__file_release(s, hold);
    return rc;
}

/* The lock's try (lock_try) for HOLD. */
static struct lock_try lock_try_of(struct dlock__hold *hold)
{
    return (struct lock_try){.type = hold->mode == DLOCK_SHARED ? F_RDLCK : F_WRLCK,
                             .mode = hold->mode, .token = &hold->token,
                             .waiting = FILE_WAITING_INIT};
}

/* What every lock acquire does once its try took HOLD: the lock-delay's
 * record, the owner. A failure gives the lock back. */
static int lock_taken(struct file_state *s, struct dlock__hold *hold)
{
    int rc = DLOCK_OK;
    if (hold->mode == DLOCK_EXCLUSIVE && s->c->opts.lock_delay_ms)
        rc = arm_delay(s, hold);
    if (!rc)
        dlock__identity(hold->owner, sizeof hold->owner);
    return rc;
}

static int file_acquire(void *state, struct dlock__hold *hold, struct dlock__wait *w)
{
    struct lock_try t = lock_try_of(hold);
    struct file_state *s = state;
    int rc = dlock__file_acquire_by(s, hold, ".lock", w, lock_try, &t);
    if (!rc)
        dlock__file_wait_settle(&t.waiting, hold->bdata);
    dlock__file_wait_leave(&t.waiting);
    return rc ? rc : lock_taken(s, hold);
}

int dlock__file_park_take(struct file_state *s, struct dlock__hold *h, struct dlock__wait *w,
                          struct file_park *p, const struct file_park_req *rq)
{
    int rc;
    if (!p->begun) {
        p->begun = true;
        p->w = w;
        p->shared = rq->shared;
        p->t = (struct file_take){.s = s, .suffix = rq->suffix, .try_take = rq->try_take,
                                  .arg = rq->arg, .ops = &dlock__file_parked_watch,
                                  .fd = -1, .ifd = -1, .wd = -1}; /* nothing to undo yet */
        if (!(p->t.full = dlock__file_full_name(s, h->name)))
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        if ((rc = dlock__file_take_begin(&p->t)))
            return rc;
    }
    dlock__file_park_ack(p);
    rc = dlock__file_take_step(&p->t, w);
    if (rc == DLOCK_EBUSY)
        dlock__file_park_busy(p);
    if (rc)
        return rc;
    rc = hold_keep(h, p->t.fd);
    p->t.fd = -1;
    return rc;
}

void dlock__file_park_end(struct file_park *p)
{
    if (!p->begun)
        return;
    dlock__file_take_end(&p->t); /* a wait given up: its gate goes too */
    free((char *)p->t.full);
    p->t.full = NULL;
}

int dlock__file_park_disarm(void *state, struct dlock__hold *h, struct dlock__wait *w, void *park,
                            int rc)
{
    (void)state, (void)h, (void)w;
    if (park)
        dlock__file_park_end(park);
    free(park);
    return rc;
}

/* A parked asynchronous acquire's state (try_armed): the take, watched
 * through the client's parked-wait watch (park.c), and the lock's try. */
struct lock_park {
    struct file_park p; /* first */
    struct lock_try lt;
};

/* The blocking wait cut into attempts for the core's asynchronous
 * acquire (backend.h): one step of the same take, whose watch is the
 * client's shared one, so a waiting acquire holds neither a thread nor
 * an inotify instance. A waiting writer keeps its gate between attempts
 * (its descriptor stays open), so the hand-off to writers is the
 * blocking wait's. */
static int file_try_armed(void *state, struct dlock__hold *h, struct dlock__wait *w, void **park)
{
    struct lock_park *lp = *park;
    if (!lp) {
        if (!(lp = calloc(1, sizeof *lp)))
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        *park = lp;
        lp->lt = lock_try_of(h);
    }
    struct file_park_req rq = {".lock", lock_try, &lp->lt, h->mode == DLOCK_SHARED};
    int rc = dlock__file_park_take(state, h, w, &lp->p, &rq);
    if (!rc)
        dlock__file_wait_settle(&lp->lt.waiting, h->bdata);
    return rc ? rc : lock_taken(state, h);
}

static int file_disarm(void *state, struct dlock__hold *h, struct dlock__wait *w, void *park,
                       int rc)
{
    (void)state, (void)h, (void)w;
    struct lock_park *lp = park;
    if (lp) {
        dlock__file_park_end(&lp->p);
        dlock__file_wait_leave(&lp->lt.waiting);
        free(lp);
    }
    return rc;
}

int dlock__file_release(void *state, struct dlock__hold *hold)
{
    (void)state;
    struct file_hold *fh = hold->bdata;
    if (!fh)
        return DLOCK_OK;
    /* Closing a descriptor opened for writing drops the OFD lock and
     * raises IN_CLOSE_WRITE for the waiters. Once children inherited a
     * copy, only closing ours: an unlock would end the lock under them,
     * and the kernel ends it when the last copy closes. */
    if (fh->delay_at) /* a clean release: no lock-delay (children that
                         inherited the lock keep it while they live) */
        dlock__file_delay_release(fh->fd, fh->delay_at);
    if (!fh->inherited)
        dlock__file_range_lock(fh->fd, F_UNLCK, LOCK_BYTE);
    close(fh->fd);
    if (fh->waiting_fd >= 0) /* after the wake: off the next holder's way */
        close(fh->waiting_fd);
    free(fh);
    hold->bdata = NULL;
    return DLOCK_OK;
}

/* Exclusive to shared in place: F_OFD_SETLK converts the write lock on
 * byte 0 into a read lock atomically (the kernel never leaves the range
 * unlocked). Readers waiting on inotify learn of it from IN_ATTRIB (a
 * timestamp touch): no descriptor is closed. */
static int file_downgrade(void *state, struct dlock__hold *hold)
{
    struct file_state *s = state;
    struct file_hold *fh = hold->bdata;
    if (fh->delay_at) /* the exclusive hold ends cleanly here */
        dlock__file_delay_release(fh->fd, fh->delay_at);
    fh->delay_at = 0;
    if (dlock__file_range_lock(fh->fd, F_RDLCK, LOCK_BYTE) < 0)
        return dlock__errno(DLOCK_EIO, errno, "lock '%s' in %s: downgrade to shared", hold->name,
                            s->dir);
    (void)futimens(fh->fd, NULL);
    return DLOCK_OK;
}

/* For dlock_lock_inherit_fd(): a new descriptor of H's lock file,
 * without close-on-exec, for children to inherit as flock(1)'s COMMAND
 * does. An OFD lock belongs to the open file, so it lasts until the last
 * copy is closed. Returns the descriptor, or -1 with a message. */
static int file_inherit_fd(void *state, struct dlock__hold *h)
{
    (void)state;
    struct file_hold *fh = h->bdata;
    int fd = fh ? fcntl(fh->fd, F_DUPFD, 3) : -1;
    if (fd < 0)
        return dlock__errno(DLOCK_EIO, errno, "lock '%s': dup of its lock file", h->name), -1;
    fh->inherited = true;
    return fd;
}

/* ------------------------------------------------------ inspecting */

int dlock__file_inspect_open(struct file_state *s, const char *full, const char *suffix,
                             struct dlock_info *info, char *fname, int *fd)
{
    int rc = dlock__file_open_named(s, full, suffix, O_RDONLY, fname, fd);
    char *path = dlock__sprintf("%s/%s", s->dir, fname);
    info->ttl_ms = DLOCK_VALID_FOREVER;
    if (path)
        dlock__info_set_key(info, path);
    free(path);
    return rc;
}

int dlock__file_inspect(void *state, const char *name, struct dlock_info *info)
{
    return dlock__file_inspect_within(state, name, info, NULL);
}

int dlock__file_inspect_within(struct file_state *s, const char *name, struct dlock_info *info,
                               struct dlock__wait *w)
{
    char fname[NAME_MAX + 1];
    char *full = dlock__file_full_name(s, name);
    if (!full)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    int fd;
    int rc = dlock__file_inspect_open(s, full, ".lock", info, fname, &fd);
    if (rc == DLOCK_ENOENT) {
        free(full);
        return DLOCK_OK; /* never locked */
    }
    if (rc) {
        free(full);
        return rc;
    }
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = LOCK_BYTE, .l_len = 1};
    if (fcntl(fd, F_OFD_GETLK, &fl) < 0)
        rc = dlock__errno(DLOCK_EIO, errno, "lock file %s/%s", s->dir, fname);
    struct header h;
    if (!rc)
        rc = dlock__file_meta_lock(s, fd, fname, F_RDLCK, w);
    if (!rc) {
        rc = dlock__file_read_header(s, fd, fname, full, &h);
        dlock__file_range_lock(fd, F_UNLCK, META_BYTE);
    }
    struct file_delay_req q = {.fd = fd, .fname = fname, .full = full};
    if (!rc && fl.l_type == F_UNLCK) /* free: in a lock-delay? */
        rc = dlock__file_delay_look(s, &q, &info->delay_ms);
    if (!rc) {
        info->token = h.token;
        info->held = fl.l_type != F_UNLCK;
        info->mode = fl.l_type == F_RDLCK ? DLOCK_SHARED : DLOCK_EXCLUSIVE;
        if (info->held && h.pid) {
            char who[HOST_MAX + 32];
            snprintf(who, sizeof who, "%u@%.*s", (unsigned)h.pid, HOST_MAX, h.host);
            /* Shared: the last of possibly several holders. */
            rc = dlock__info_add_holder(info, who, 0);
        }
    }
    close(fd);
    free(full);
    return rc;
}

/* dlock_check()'s look: inspect's, which asks the kernel whether byte 0
 * is locked (a dead holder's lock is gone at once) and reads the counter,
 * the newest hold's token. */
static int file_check(void *state, const char *name, struct dlock__check_view *view)
{
    struct dlock_info *info = calloc(1, sizeof *info);
    int rc = info ? DLOCK_OK : dlock__err(DLOCK_ENOMEM, "out of memory");
    if (!rc)
        rc = dlock__file_inspect(state, name, info);
    if (!rc)
        *view = (struct dlock__check_view){.held = info->held, .token = info->token,
                                           .reader_unknown = info->mode == DLOCK_SHARED};
    dlock_info_free(info);
    return rc;
}

static int file_force_release(void *state, const char *name)
{
    struct dlock_info info = {.nwaiters = -1};
    int rc = dlock__file_inspect(state, name, &info);
    if (!rc && info.held)
        rc = dlock__err(DLOCK_ENOTSUP,
                        "lock '%s' is held by %s; the file backend cannot take a lock from a "
                        "live process (the kernel holds it): stop that process to free it",
                        name, info.nholders ? info.holders[0].id : "a live process");
    free(info.key);
    for (size_t k = 0; k < info.nholders; k++)
        free(info.holders[k].id);
    free(info.holders);
    return rc;
}

/* FN for the name in the header of each file of the directory ending in
 * SUFFIX (".lock", ".sem") that matches PATTERN. */
static int list_files(struct file_state *s, const char *suffix, const char *pattern,
                      dlock_list_fn fn, void *arg)
{
    int dfd = openat(s->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) {
        if (dfd >= 0)
            close(dfd);
        return dlock__errno(dlock__errno_code(errno), errno, "lock directory %s", s->dir);
    }
    size_t plen = s->prefix ? strlen(s->prefix) : 0;
    int rc = DLOCK_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name), sl = strlen(suffix);
        if (len <= sl || strcmp(de->d_name + len - sl, suffix) != 0)
            continue;
        int fd = openat(s->dirfd, de->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0)
            continue;
        struct stat st;
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || !trusted_owner(s, st.st_uid)) {
            close(fd);
            continue;
        }
        struct header h;
        char *full = NULL;
        if (pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h && memcmp(h.magic, MAGIC, 8) == 0 &&
            h.name_len <= DLOCK_NAME_MAX + 4096 && (full = calloc(1, h.name_len + 1)) &&
            pread(fd, full, h.name_len, sizeof h) == (ssize_t)h.name_len &&
            strlen(full) == h.name_len && (!plen || strncmp(full, s->prefix, plen) == 0) &&
            dlock__glob(pattern, full + plen) && fn(full + plen, arg)) {
            free(full);
            close(fd);
            break;
        }
        free(full);
        close(fd);
    }
    closedir(d);
    return rc;
}

static int file_list(void *state, const char *pattern, dlock_list_fn fn, void *arg)
{
    return list_files(state, ".lock", pattern, fn, arg);
}

static int file_sem_list(void *state, const char *pattern, dlock_list_fn fn, void *arg)
{
    return list_files(state, ".sem", pattern, fn, arg);
}

static const char *const file_schemes[] = {"file", NULL};

static const struct dlock__lock_ops file_lock_ops = {
    .acquire = file_acquire,
    .release = dlock__file_release,
    .downgrade = file_downgrade,
    .try_armed = file_try_armed,
    .disarm = file_disarm,
    .inherit_fd = file_inherit_fd,
};

static const struct dlock__sem_ops file_sem_ops = {
    .acquire = dlock__file_sem_acquire,
    .release = dlock__file_sem_release,
    .try_armed = dlock__file_sem_try_armed,
    .disarm = dlock__file_park_disarm,
    .inspect = dlock__file_sem_inspect,
    .list = file_sem_list,
};

static const struct dlock__elect_ops file_elect_ops = {
    .acquire = dlock__file_elect_acquire,
    .release = dlock__file_release,
    .proclaim = dlock__file_elect_proclaim,
    .observe = dlock__file_elect_observe,
    .try_armed = dlock__file_elect_try_armed,
    .disarm = dlock__file_park_disarm,
};

static const struct dlock__admin_ops file_admin_ops = {
    .inspect = dlock__file_inspect,
    .check = file_check,
    .force_release = file_force_release,
    .list = file_list,
};

const struct dlock__backend dlock__backend_file = {
    .name = "file",
    .schemes = file_schemes,
    .caps = DLOCK__CAP_SHARED | DLOCK__CAP_FIXED_LEASE | DLOCK__CAP_LOCK_DELAY,
    .default_port = 0,
    .open = file_open,
    .close = file_close,
    .locks = &file_lock_ops,
    .semaphores = &file_sem_ops,
    .elections = &file_elect_ops,
    .admin = &file_admin_ops,
    .values = &dlock__file_value_ops,
    /* docs/protocol-file.md, "Guarded writes" */
    .no_guarded_why = "the file backend has no store (a lock's value is all it keeps beside a "
                      "lock); use redis://, etcd:// or zk:// for guarded writes",
    .contend = &dlock__file_contend_ops,
};
