/* flock.c -- who holds a file's flock(2), for the path form of the
 * commands (`dlock status PATH`, `dlock run -v PATH`): read from
 * /proc/locks, which lists every FLOCK lock with its mode, the pid that
 * took it and the device and inode of its file, and the waiters ("->"),
 * so nothing is locked or unlocked to find out.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

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
