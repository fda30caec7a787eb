/* fixture_zk.c -- see fixture_zk.h. Starting a JVM takes a second or
 * two; electing a leader a few ticks more. Everything waits on the
 * servers' own answers (the "srvr" word says "Mode: leader/follower/
 * standalone" once a server serves), never on a fixed sleep. */
#include "fixture_zk.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#define ZKF_JAR "/usr/share/java/zookeeper.jar"
#define ZKF_LOGGER "/usr/share/java/slf4j-simple.jar"

char *zkf_4lw(int port, const char *word)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return NULL;
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
        write(fd, word, strlen(word)) != (ssize_t)strlen(word)) {
        close(fd);
        return NULL;
    }
    char *buf = tu_read_fd(fd);
    close(fd);
    if (!*buf) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* "leader", "follower", "standalone" or NULL when not serving. */
static const char *server_mode(int port)
{
    char *r = zkf_4lw(port, "srvr");
    const char *mode = NULL;
    if (r) {
        if (strstr(r, "Mode: leader"))
            mode = "leader";
        else if (strstr(r, "Mode: follower"))
            mode = "follower";
        else if (strstr(r, "Mode: standalone"))
            mode = "standalone";
        free(r);
    }
    return mode;
}

static bool write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return false;
    fputs(text, f);
    return fclose(f) == 0;
}

static bool write_config(struct zkf *f, int i)
{
    struct zkf_server *s = &f->s[i];
    char *servers = strdup("");
    if (f->n > 1) {
        for (int k = 0; k < f->n; k++) {
            char *line = tu_fmt("%sserver.%d=127.0.0.1:%d:%d\n", servers, f->s[k].id,
                                f->s[k].quorum_port, f->s[k].election_port);
            free(servers);
            servers = line;
        }
    }
    char *text = tu_fmt("tickTime=250\n"
                        "initLimit=40\n"
                        "syncLimit=20\n"
                        "dataDir=%s\n"
                        "clientPort=%d\n"
                        "clientPortAddress=%s\n"
                        "minSessionTimeout=500\n"
                        "maxSessionTimeout=600000\n"
                        "admin.enableServer=false\n"
                        "4lw.commands.whitelist=*\n"
                        "standaloneEnabled=true\n"
                        "%s",
                        s->dir, s->port, tu_listen_addr(), servers);
    bool ok = write_file(s->cfg, text);
    free(text);
    free(servers);
    if (ok && f->n > 1) {
        char *myid_path = tu_fmt("%s/myid", s->dir);
        char *myid = tu_fmt("%d\n", s->id);
        ok = write_file(myid_path, myid);
        free(myid_path);
        free(myid);
    }
    return ok;
}

static void spawn_server(struct zkf *f, int i)
{
    struct zkf_server *s = &f->s[i];
    const char *argv[] = {"java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                          "-Dzookeeper.jmx.log4j.disable=true",
                          "-Dzookeeper.admin.enableServer=false",
                          /* containers left empty go within a second */
                          "-Dznode.container.checkIntervalMs=1000", "-cp", ZKF_JAR ":" ZKF_LOGGER,
                          "org.apache.zookeeper.server.quorum.QuorumPeerMain", s->cfg, NULL};
    s->pid = tu_spawn(argv, s->log);
}

bool zkf_wait_serving(struct zkf *f, int timeout_ms)
{
    for (int waited = 0; waited <= timeout_ms; waited += 100) {
        bool all = true, leader = false;
        for (int i = 0; i < f->n; i++) {
            if (!f->s[i].pid)
                continue;
            const char *mode = server_mode(f->s[i].port);
            if (!mode)
                all = false;
            else if (strcmp(mode, "leader") == 0 || strcmp(mode, "standalone") == 0)
                leader = true;
        }
        if (all && leader)
            return true;
        tu_sleep_ms(100);
    }
    return false;
}

bool zkf_start(struct zkf *f, int n)
{
    memset(f, 0, sizeof *f);
    if (n < 1 || n > ZKF_MAX) {
        snprintf(f->error, sizeof f->error, "zkf_start: %d servers", n);
        return false;
    }
    if (access(ZKF_JAR, R_OK) != 0) {
        snprintf(f->error, sizeof f->error, "%s missing: install Debian's zookeeper package",
                 ZKF_JAR);
        return false;
    }
    f->n = n;
    f->dir = tu_tmpdir("zk");
    f->hosts = strdup("");
    for (int i = 0; i < n; i++) {
        struct zkf_server *s = &f->s[i];
        s->id = i + 1;
        s->port = tu_free_port();
        /* distinct ports: ask again until none repeats */
        do {
            s->quorum_port = tu_free_port();
            s->election_port = tu_free_port();
        } while (s->quorum_port == s->election_port || s->quorum_port == s->port ||
                 s->election_port == s->port);
        s->dir = tu_fmt("%s/server%d", f->dir, s->id);
        mkdir(s->dir, 0700);
        s->cfg = tu_fmt("%s/zoo.cfg", s->dir);
        s->log = tu_fmt("%s/server.log", s->dir);
        char *h = tu_fmt("%s%s127.0.0.1:%d", f->hosts, i ? "," : "", s->port);
        free(f->hosts);
        f->hosts = h;
    }
    for (int i = 0; i < n; i++) {
        if (!write_config(f, i)) {
            snprintf(f->error, sizeof f->error, "cannot write %s: %s", f->s[i].cfg,
                     strerror(errno));
            return false;
        }
    }
    for (int i = 0; i < n; i++)
        spawn_server(f, i);
    if (!zkf_wait_serving(f, 90000)) {
        char *log = tu_read_file(f->s[0].log);
        const char *tail = log && strlen(log) > 300 ? log + strlen(log) - 300 : log;
        snprintf(f->error, sizeof f->error,
                 "ZooKeeper (%d server%s, %s) did not serve within 90 s; %s: ...%s", n,
                 n > 1 ? "s" : "", f->hosts, f->s[0].log, tail ? tail : "(no log)");
        free(log);
        return false;
    }
    return true;
}

void zkf_server_stop(struct zkf *f, int i, int sig)
{
    struct zkf_server *s = &f->s[i];
    if (!s->pid)
        return;
    tu_stop_with(s->pid, sig, 10000);
    /* A test process is not the server's parent (the runner is), so
     * waitpid() above cannot wait for it: wait until the port is free. */
    for (int waited = 0; waited < 10000 && tu_wait_port(s->port, 0); waited += 50)
        tu_sleep_ms(50);
    s->pid = 0;
}

bool zkf_server_start(struct zkf *f, int i, int timeout_ms)
{
    if (f->s[i].pid)
        return true;
    spawn_server(f, i);
    for (int waited = 0; waited <= timeout_ms; waited += 100) {
        if (server_mode(f->s[i].port))
            return true;
        tu_sleep_ms(100);
    }
    return false;
}

int zkf_leader(struct zkf *f)
{
    for (int i = 0; i < f->n; i++) {
        if (!f->s[i].pid)
            continue;
        const char *mode = server_mode(f->s[i].port);
        if (mode && (strcmp(mode, "leader") == 0 || strcmp(mode, "standalone") == 0))
            return i;
    }
    return -1;
}

void zkf_stop(struct zkf *f)
{
    for (int i = 0; i < f->n; i++) {
        zkf_server_stop(f, i, SIGKILL);
        free(f->s[i].dir);
        free(f->s[i].cfg);
        free(f->s[i].log);
    }
    if (f->dir && !getenv("DLOCK_KEEP_TMP"))
        tu_rmrf(f->dir);
    free(f->dir);
    free(f->hosts);
    memset(f, 0, sizeof *f);
}

char *zkf_url(const struct zkf *f, const char *path, const char *query)
{
    return tu_fmt("zk://%s%s%s%s", f->hosts, path ? path : "", query ? "?" : "",
                  query ? query : "");
}
