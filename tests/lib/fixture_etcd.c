/* fixture_etcd.c -- see fixture_etcd.h. Everything waits on the members'
 * own answers (`etcdctl endpoint health`), never on a fixed sleep. */
#include "fixture_etcd.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#define CTL_MAX_ARGS 32

static char *peer_list(const struct etcdf *f)
{
    char *list = strdup("");
    for (int i = 0; i < f->n; i++) {
        char *next = tu_fmt("%s%s%s=http://127.0.0.1:%d", list, i ? "," : "", f->m[i].name,
                            f->m[i].peer_port);
        free(list);
        list = next;
    }
    return list;
}

static pid_t spawn_member(struct etcdf *f, int i)
{
    struct etcdf_member *m = &f->m[i];
    char *client = tu_fmt("http://127.0.0.1:%d", m->client_port);
    char *peer = tu_fmt("http://127.0.0.1:%d", m->peer_port);
    char *cluster = peer_list(f);
    char *token = tu_fmt("dlock-test-%d", (int)getpid());
    const char *argv[] = {"etcd",
                          "--name", m->name,
                          "--data-dir", m->dir,
                          "--listen-client-urls", client,
                          "--advertise-client-urls", client,
                          "--listen-peer-urls", peer,
                          "--initial-advertise-peer-urls", peer,
                          "--initial-cluster", cluster,
                          "--initial-cluster-token", token,
                          "--initial-cluster-state", "new",
                          "--heartbeat-interval", "50",
                          "--election-timeout", "500",
                          NULL};
    pid_t pid = tu_spawn(argv, m->log);
    free(client);
    free(peer);
    free(cluster);
    free(token);
    return pid;
}

static bool member_healthy(const struct etcdf_member *m)
{
    char *ep = tu_fmt("127.0.0.1:%d", m->client_port);
    const char *argv[] = {"etcdctl", "--endpoints", ep, "--dial-timeout", "1s",
                          "--command-timeout", "2s", "endpoint", "health", NULL};
    int rc = tu_run(argv, NULL, NULL, NULL);
    free(ep);
    return rc == 0;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

bool etcdf_wait_healthy(struct etcdf *f, int timeout_ms)
{
    for (long long end = now_ms() + timeout_ms; now_ms() <= end;) {
        bool all = true;
        for (int i = 0; i < f->n && all; i++)
            if (f->m[i].pid)
                all = member_healthy(&f->m[i]);
        if (all)
            return true;
        tu_sleep_ms(100);
    }
    return false;
}

bool etcdf_start(struct etcdf *f, int n)
{
    memset(f, 0, sizeof *f);
    if (n < 1 || n > ETCDF_MAX) {
        snprintf(f->error, sizeof f->error, "cannot start %d members", n);
        return false;
    }
    f->n = n;
    f->dir = tu_tmpdir("etcd");
    f->endpoints = strdup("");
    for (int i = 0; i < n; i++) {
        struct etcdf_member *m = &f->m[i];
        snprintf(m->name, sizeof m->name, "n%d", i);
        /* Two distinct free ports per member. */
        m->client_port = tu_free_port();
        do
            m->peer_port = tu_free_port();
        while (m->peer_port == m->client_port);
        for (int j = 0; j < i; j++)
            if (f->m[j].client_port == m->client_port || f->m[j].peer_port == m->client_port ||
                f->m[j].client_port == m->peer_port || f->m[j].peer_port == m->peer_port) {
                i--; /* clash with an earlier member: draw again */
                goto next;
            }
        m->dir = tu_fmt("%s/%s", f->dir, m->name);
        m->log = tu_fmt("%s/%s.log", f->dir, m->name);
        char *eps = tu_fmt("%s%s127.0.0.1:%d", f->endpoints, i ? "," : "", m->client_port);
        free(f->endpoints);
        f->endpoints = eps;
    next:;
    }
    for (int i = 0; i < n; i++)
        f->m[i].pid = spawn_member(f, i);
    for (int i = 0; i < n; i++)
        if (!tu_wait_port(f->m[i].client_port, 20000)) {
            char *log = tu_read_file(f->m[i].log);
            size_t len = log ? strlen(log) : 0;
            snprintf(f->error, sizeof f->error, "etcd %s (port %d) did not listen; log: %s",
                     f->m[i].name, f->m[i].client_port, log ? log + (len > 300 ? len - 300 : 0) : "");
            free(log);
            return false;
        }
    if (!etcdf_wait_healthy(f, 30000)) {
        snprintf(f->error, sizeof f->error, "etcd cluster of %d at %s never became healthy (logs in %s)",
                 n, f->endpoints, f->dir);
        return false;
    }
    return true;
}

void etcdf_member_stop(struct etcdf *f, int i, int sig)
{
    struct etcdf_member *m = &f->m[i];
    if (!m->pid)
        return;
    if (sig == SIGKILL) {
        kill(-m->pid, SIGKILL);
        kill(m->pid, SIGKILL);
        waitpid(m->pid, NULL, 0);
    } else {
        tu_stop(m->pid, 5000);
    }
    m->pid = 0;
}

bool etcdf_member_start(struct etcdf *f, int i, int timeout_ms)
{
    struct etcdf_member *m = &f->m[i];
    if (m->pid)
        return true;
    /* With its data directory in place, etcd ignores the --initial-*
     * flags and rejoins as the member it was. */
    m->pid = spawn_member(f, i);
    if (!tu_wait_port(m->client_port, timeout_ms))
        return false;
    for (long long end = now_ms() + timeout_ms; now_ms() <= end;) {
        if (member_healthy(m))
            return true;
        tu_sleep_ms(100);
    }
    return false;
}

void etcdf_stop(struct etcdf *f)
{
    for (int i = 0; i < f->n; i++) {
        etcdf_member_stop(f, i, SIGKILL);
        free(f->m[i].dir);
        free(f->m[i].log);
    }
    if (f->dir)
        tu_rmrf(f->dir);
    free(f->dir);
    free(f->endpoints);
    memset(f, 0, sizeof *f);
}

/* The number after "KEY": in TEXT, or 0. */
static unsigned long long json_number(const char *text, const char *key)
{
    const char *at = text ? strstr(text, key) : NULL;
    if (!at)
        return 0;
    at += strlen(key);
    while (*at == '"' || *at == ':' || *at == ' ')
        at++;
    return strtoull(at, NULL, 10);
}

int etcdf_leader(struct etcdf *f)
{
    for (int i = 0; i < f->n; i++) {
        if (!f->m[i].pid)
            continue;
        char *ep = tu_fmt("127.0.0.1:%d", f->m[i].client_port);
        const char *argv[] = {"etcdctl",          "--endpoints", ep, "--dial-timeout", "1s",
                              "--command-timeout", "2s",        "endpoint", "status", "-w",
                              "json",             NULL};
        char *out = NULL;
        int rc = tu_run(argv, NULL, &out, NULL);
        free(ep);
        unsigned long long me = json_number(out, "\"member_id\""),
                           leader = json_number(out, "\"leader\"");
        free(out);
        if (rc != 0 || !leader)
            continue;
        if (me == leader)
            return i;
        /* Ask the others who they are. */
        for (int j = 0; j < f->n; j++) {
            if (j == i || !f->m[j].pid)
                continue;
            char *ep2 = tu_fmt("127.0.0.1:%d", f->m[j].client_port);
            const char *argv2[] = {"etcdctl",          "--endpoints", ep2, "--dial-timeout", "1s",
                                   "--command-timeout", "2s",        "endpoint", "status", "-w",
                                   "json",             NULL};
            char *out2 = NULL;
            tu_run(argv2, NULL, &out2, NULL);
            free(ep2);
            unsigned long long id = json_number(out2, "\"member_id\"");
            free(out2);
            if (id == leader)
                return j;
        }
    }
    return -1;
}

int etcdf_ctl(const struct etcdf *f, char **out, char **err, ...)
{
    const char *argv[CTL_MAX_ARGS + 4];
    size_t n = 0;
    argv[n++] = "etcdctl";
    argv[n++] = "--endpoints";
    argv[n++] = f->endpoints;
    va_list ap;
    va_start(ap, err);
    const char *a;
    while ((a = va_arg(ap, const char *)) && n < CTL_MAX_ARGS + 3)
        argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    return tu_run(argv, NULL, out, err);
}

char *etcdf_url(const struct etcdf *f, const char *path, const char *query)
{
    return tu_fmt("etcd://%s%s%s%s", f->endpoints, path ? path : "", query ? "?" : "",
                  query ? query : "");
}
