/* flock.c -- the file of the path form of the commands (`dlock run
 * PATH`, `dlock status PATH`): opening it safely for flock(2), and who
 * holds its flock, read from /proc/locks, which lists every FLOCK lock
 * with its mode, the pid that took it and the device and inode of its
 * file, and the waiters ("->"), so nothing is locked or unlocked to find
 * out.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "cli.h"

int cli_flock_info(const char *path, struct cli_flock_info *out)
{
    memset(out, 0, sizeof *out);
    struct stat st;
    if (stat(path, &st) < 0)
        return errno == ENOENT ? 0 : errno; /* no file: nobody holds it */
    char want[64], line[256];
    snprintf(want, sizeof want, " %02x:%02x:%lu ", major(st.st_dev), minor(st.st_dev),
             (unsigned long)st.st_ino);
    FILE *f = fopen("/proc/locks", "re");
    if (!f)
        return errno;
    while (fgets(line, sizeof line, f)) {
        const char *adv = strstr(line, "ADVISORY");
        char rw[16];
        int pid;
        if (!strstr(line, " FLOCK ") || !strstr(line, want) || !adv)
            continue;
        if (strstr(line, "->")) {
            out->waiters++;
        } else if (sscanf(adv, "ADVISORY %15s %d", rw, &pid) == 2) {
            out->held = true;
            out->shared = strcmp(rw, "READ") == 0;
            size_t len = strlen(out->pids);
            snprintf(out->pids + len, sizeof out->pids - len, "%s%d", len ? " " : "", pid);
        }
    }
    fclose(f);
    return 0;
}

/* Whether others may write to the directory PATH's entry lives in (/tmp,
 * /var/tmp, /dev/shm): anyone could have planted the entry there. */
static bool in_public_dir(const char *path)
{
    char parent[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(parent, sizeof parent, ".");
    else if (slash == path)
        snprintf(parent, sizeof parent, "/");
    else
        snprintf(parent, sizeof parent, "%.*s", (int)(slash - path), path);
    struct stat st;
    return stat(parent, &st) == 0 && (st.st_mode & S_IWOTH);
}

int cli_path_open(const char *path)
{
    /* A link planted in a directory others may write to would make us
     * create or lock the file it points to (the kernel's
     * fs.protected_symlinks stops only other users' links, where it is
     * on): not followed there. O_NONBLOCK: opening a FIFO or a terminal
     * planted in PATH's place would wait for a writer. */
    int flags = O_RDONLY | O_NOCTTY | O_CLOEXEC | O_NONBLOCK;
    if (in_public_dir(path))
        flags |= O_NOFOLLOW;
    int fd = open(path, flags | O_CREAT, 0666);
    if (fd < 0 && errno == EISDIR)
        fd = open(path, flags | O_DIRECTORY);
    if (fd >= 0)
        (void)fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}
