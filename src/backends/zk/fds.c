/* fds.c -- close-on-exec for the descriptors the ZooKeeper client library
 * opens on our behalf.
 *
 * libzookeeper_mt (3.8, as Debian builds it: without --with-sock-cloexec)
 * creates its self-pipe in zookeeper_init() with pipe() and a new socket
 * for every (re)connection with socket(), neither close-on-exec: a
 * program that embeds dlock and runs fork()+exec() would hand the child
 * an authenticated connection to the ensemble (and the pipe that wakes
 * the client's I/O thread). The library offers no hook and no accessor
 * for them, so we find them in /proc/self/fd:
 *   - the pipe: the two ends of one pipe that appeared across
 *     zookeeper_init() (a snapshot is taken before it);
 *   - the socket: on every ZOO_CONNECTED_STATE (the watcher runs before
 *     the connection is used), each TCP socket without FD_CLOEXEC whose
 *     peer port is one of the URL's ports.
 * A socket of the application's own to such a port gets FD_CLOEXEC too
 * (harmless: nothing should pass a ZooKeeper connection across exec), and
 * so would a pipe another thread made in the same instant as
 * zookeeper_init(). Not zookeeper_interest(), which returns the socket:
 * it drives the connection (creates sockets, connects) and belongs to the
 * library's I/O thread. A
 * fork()+exec() in another thread between the library's socket() and our
 * watcher can still inherit it; dlock(1) closes every descriptor it was
 * not given before it execs, as a second line. Without /proc nothing is
 * done.
 */
#include "zk.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* Call FN(fd, target, arg) for each open descriptor of the process, with
 * its /proc/self/fd link ("pipe:[1234]", "socket:[99]", a path). */
static void each_fd(void (*fn)(int fd, const char *target, void *arg), void *arg)
{
    DIR *d = opendir("/proc/self/fd"); /* O_CLOEXEC inside */
    if (!d)
        return;
    int own = dirfd(d);
    struct dirent *de;
    while ((de = readdir(d))) {
        char *end;
        long fd = strtol(de->d_name, &end, 10);
        if (*end || end == de->d_name || fd < 0 || fd == own)
            continue;
        char target[64];
        ssize_t n = readlinkat(own, de->d_name, target, sizeof target - 1);
        if (n <= 0)
            continue;
        target[n] = 0;
        fn((int)fd, target, arg);
    }
    closedir(d);
}

static void set_cloexec(int fd)
{
    int flags = fcntl(fd, F_GETFD);
    if (flags >= 0 && !(flags & FD_CLOEXEC))
        fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
}

static void add_pipe(int fd, const char *target, void *arg)
{
    struct zk_fds *s = arg;
    if (strncmp(target, "pipe:[", 6) != 0 || s->failed)
        return;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        struct zk_fd *v = realloc(s->v, cap * sizeof *v);
        if (!v) {
            s->failed = true;
            return;
        }
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n].fd = fd;
    snprintf(s->v[s->n].target, sizeof s->v[s->n].target, "%s", target);
    s->n++;
}

void dlock__zk_fds_snapshot(struct zk_fds *s)
{
    *s = (struct zk_fds){0};
    each_fd(add_pipe, s);
}

void dlock__zk_fds_free(struct zk_fds *s)
{
    free(s->v);
    *s = (struct zk_fds){0};
}

static bool in_snapshot(const struct zk_fds *s, int fd, const char *target)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->v[i].fd == fd && strcmp(s->v[i].target, target) == 0)
            return true;
    return false;
}

void dlock__zk_fds_cloexec_new_pipes(const struct zk_fds *before)
{
    if (before->failed)
        return; /* cannot tell ours from the application's */
    struct zk_fds now;
    dlock__zk_fds_snapshot(&now);
    for (size_t i = 0; i < now.n && !now.failed; i++) {
        if (in_snapshot(before, now.v[i].fd, now.v[i].target))
            continue;
        /* both ends of one new pipe, as the library's self-pipe is (a
         * descriptor that merely reuses a number is not new) */
        for (size_t j = 0; j < now.n; j++)
            if (j != i && strcmp(now.v[i].target, now.v[j].target) == 0 &&
                !in_snapshot(before, now.v[j].fd, now.v[j].target)) {
                set_cloexec(now.v[i].fd);
                break;
            }
    }
    dlock__zk_fds_free(&now);
}

struct socket_scan {
    const int *ports;
    size_t nports;
};

static void cloexec_socket(int fd, const char *target, void *arg)
{
    const struct socket_scan *sc = arg;
    if (strncmp(target, "socket:[", 8) != 0)
        return;
    int flags = fcntl(fd, F_GETFD);
    if (flags < 0 || (flags & FD_CLOEXEC))
        return;
    int type = 0;
    socklen_t tlen = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) != 0 || type != SOCK_STREAM)
        return;
    struct sockaddr_storage peer;
    socklen_t plen = sizeof peer;
    if (getpeername(fd, (struct sockaddr *)&peer, &plen) != 0)
        return;
    int port;
    if (peer.ss_family == AF_INET)
        port = ntohs(((struct sockaddr_in *)&peer)->sin_port);
    else if (peer.ss_family == AF_INET6)
        port = ntohs(((struct sockaddr_in6 *)&peer)->sin6_port);
    else
        return;
    for (size_t i = 0; i < sc->nports; i++)
        if (sc->ports[i] == port) {
            fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
            return;
        }
}

void dlock__zk_fds_cloexec_sockets(const int *ports, size_t nports)
{
    struct socket_scan sc = {ports, nports};
    each_fd(cloexec_socket, &sc);
}
