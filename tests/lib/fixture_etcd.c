/* fixture_etcd.c -- see fixture_etcd.h. Everything waits on the members'
 * own answers (`etcdctl endpoint health`), never on a fixed sleep. */
#include "fixture_etcd.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#define CTL_MAX_ARGS 32

static void write_text(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    if (fp) {
        fputs(text, fp);
        fclose(fp);
    }
}

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
    char *client = tu_fmt("%s://127.0.0.1:%d", f->cert_dir ? "https" : "http", m->client_port);
    char *listen = tu_fmt("%s://%s:%d", f->cert_dir ? "https" : "http", tu_listen_addr(), m->client_port);
    char *peer = tu_fmt("http://127.0.0.1:%d", m->peer_port);
    char *cluster = peer_list(f);
    char *token = tu_fmt("dlock-test-%d", (int)getpid());
    const char *argv[40] = {"etcd",
                          "--name", m->name,
                          "--data-dir", m->dir,
                          "--listen-client-urls", listen,
                          "--advertise-client-urls", client,
                          "--listen-peer-urls", peer,
                          "--initial-advertise-peer-urls", peer,
                          "--initial-cluster", cluster,
                          "--initial-cluster-token", token,
                          "--initial-cluster-state", "new",
                          "--heartbeat-interval", "50",
                          "--election-timeout", "500",
                          NULL};
    size_t n = 0;
    while (argv[n])
        n++;
    char *tls[3] = {NULL, NULL, NULL};
    if (f->cert_dir) {
        tls[0] = tu_fmt("--cert-file=%s/server.pem", f->cert_dir);
        tls[1] = tu_fmt("--key-file=%s/server-key.pem", f->cert_dir);
        tls[2] = tu_fmt("--trusted-ca-file=%s/ca.pem", f->cert_dir);
        for (int t = 0; t < 3; t++)
            argv[n++] = tls[t];
        argv[n++] = "--client-cert-auth";
    }
    for (int x = 0; x < 8 && f->extra[x] && n < 39; x++)
        argv[n++] = f->extra[x];
    argv[n] = NULL;
    pid_t pid = tu_spawn(argv, m->log);
    free(client);
    free(listen);
    free(peer);
    free(cluster);
    free(token);
    for (int t = 0; t < 3; t++)
        free(tls[t]);
    return pid;
}

/* etcdctl's TLS flags for F (all NULL without TLS); free with tls_free. */
static void tls_flags(const struct etcdf *f, char *flags[3])
{
    flags[0] = flags[1] = flags[2] = NULL;
    if (!f->cert_dir)
        return;
    flags[0] = tu_fmt("--cacert=%s/ca.pem", f->cert_dir);
    flags[1] = tu_fmt("--cert=%s/client.pem", f->cert_dir);
    flags[2] = tu_fmt("--key=%s/client-key.pem", f->cert_dir);
}

static void tls_free(char *flags[3])
{
    for (int i = 0; i < 3; i++)
        free(flags[i]);
}

static bool member_healthy(const struct etcdf *f, const struct etcdf_member *m)
{
    char *ep = tu_fmt("127.0.0.1:%d", m->client_port);
    char *tls[3];
    tls_flags(f, tls);
    const char *argv[16] = {"etcdctl", "--endpoints", ep, "--dial-timeout", "1s",
                            "--command-timeout", "2s", "endpoint", "health"};
    size_t n = 9;
    for (int i = 0; i < 3 && tls[i]; i++)
        argv[n++] = tls[i];
    argv[n] = NULL;
    int rc = tu_run(argv, NULL, NULL, NULL);
    free(ep);
    tls_free(tls);
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
                all = member_healthy(f, &f->m[i]);
        if (all)
            return true;
        tu_sleep_ms(100);
    }
    return false;
}

bool etcdf_start(struct etcdf *f, int n)
{
    return etcdf_start_args(f, n, NULL);
}

static bool start_members(struct etcdf *f, int n);

bool etcdf_start_args(struct etcdf *f, int n, const char *const *extra)
{
    memset(f, 0, sizeof *f);
    for (int i = 0; extra && extra[i] && i < 7; i++)
        f->extra[i] = extra[i];
    f->dir = tu_tmpdir("etcd");
    return start_members(f, n);
}

/* openssl with ARGV (after "openssl"), its stderr into f->error. */
static bool openssl(struct etcdf *f, const char *const *args)
{
    const char *argv[40] = {"openssl"};
    size_t n = 1;
    for (size_t i = 0; args[i] && n < 39; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    char *err = NULL;
    int rc = tu_run(argv, NULL, NULL, &err);
    if (rc)
        snprintf(f->error, sizeof f->error, "openssl %s: %s", args[0], err ? err : "");
    free(err);
    return rc == 0;
}

bool etcdf_start_tls(struct etcdf *f)
{
    memset(f, 0, sizeof *f);
    f->dir = tu_tmpdir("etcd-tls");
    f->cert_dir = tu_fmt("%s/certs", f->dir);
    mkdir(f->cert_dir, 0700);
    char *ca = tu_fmt("%s/ca.pem", f->cert_dir), *cakey = tu_fmt("%s/ca-key.pem", f->cert_dir);
    char *ext = tu_fmt("%s/san.cnf", f->cert_dir);
    write_text(ext, "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n");
    const char *mkca[] = {"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", cakey,
                          "-out", ca, "-days", "2", "-subj", "/CN=dlock test CA", NULL};
    bool ok = openssl(f, mkca);
    const char *who[] = {"server", "client"};
    for (int i = 0; ok && i < 2; i++) {
        char *key = tu_fmt("%s/%s-key.pem", f->cert_dir, who[i]);
        char *csr = tu_fmt("%s/%s.csr", f->cert_dir, who[i]);
        char *crt = tu_fmt("%s/%s.pem", f->cert_dir, who[i]);
        char *subj = tu_fmt("/CN=%s", i == 0 ? "127.0.0.1" : "root");
        const char *req[] = {"req", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                             "-out", csr, "-subj", subj, NULL};
        const char *sign[] = {"x509", "-req", "-in", csr, "-CA", ca, "-CAkey", cakey,
                              "-CAcreateserial", "-out", crt, "-days", "2", "-extfile", ext,
                              NULL};
        ok = openssl(f, req) && openssl(f, sign);
        free(key);
        free(csr);
        free(crt);
        free(subj);
    }
    free(ca);
    free(cakey);
    free(ext);
    return ok && start_members(f, 1);
}

static bool start_members(struct etcdf *f, int n)
{
    if (n < 1 || n > ETCDF_MAX) {
        snprintf(f->error, sizeof f->error, "cannot start %d members", n);
        return false;
    }
    f->n = n;
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
    tu_stop_with(m->pid, sig, 5000);
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
        if (member_healthy(f, m))
            return true;
        tu_sleep_ms(100);
    }
    return false;
}

bool etcdf_revive(struct etcdf *f, int timeout_ms)
{
    /* All of them first: one member alone never has a leader. */
    for (int i = 0; i < f->n; i++)
        if (!tu_wait_port(f->m[i].client_port, 0))
            f->m[i].pid = spawn_member(f, i);
    for (int i = 0; i < f->n; i++)
        if (!tu_wait_port(f->m[i].client_port, timeout_ms))
            return false;
    return etcdf_wait_healthy(f, timeout_ms);
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
    free(f->cert_dir);
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

/* `etcdctl endpoint status` of member I: its id in *ME and the leader's
 * it knows in *LEADER (0 when unknown). Returns etcdctl's exit status. */
static int member_status(struct etcdf *f, int i, unsigned long long *me,
                         unsigned long long *leader)
{
    char *ep = tu_fmt("127.0.0.1:%d", f->m[i].client_port);
    const char *argv[] = {"etcdctl",          "--endpoints", ep, "--dial-timeout", "1s",
                          "--command-timeout", "2s",        "endpoint", "status", "-w",
                          "json",             NULL};
    char *out = NULL;
    int rc = tu_run(argv, NULL, &out, NULL);
    free(ep);
    *me = json_number(out, "\"member_id\"");
    *leader = json_number(out, "\"leader\"");
    free(out);
    return rc;
}

int etcdf_leader(struct etcdf *f)
{
    for (int i = 0; i < f->n; i++) {
        if (!f->m[i].pid)
            continue;
        unsigned long long me, leader;
        if (member_status(f, i, &me, &leader) != 0 || !leader)
            continue;
        if (me == leader)
            return i;
        /* Ask the others who they are. */
        for (int j = 0; j < f->n; j++) {
            if (j == i || !f->m[j].pid)
                continue;
            unsigned long long id, unused;
            member_status(f, j, &id, &unused);
            if (id == leader)
                return j;
        }
    }
    return -1;
}

int etcdf_ctl(const struct etcdf *f, char **out, char **err, ...)
{
    const char *argv[CTL_MAX_ARGS + 8];
    size_t n = 0;
    argv[n++] = "etcdctl";
    argv[n++] = "--endpoints";
    argv[n++] = f->endpoints;
    char *tls[3];
    tls_flags(f, tls);
    for (int i = 0; i < 3 && tls[i]; i++)
        argv[n++] = tls[i];
    va_list ap;
    va_start(ap, err);
    const char *a;
    while ((a = va_arg(ap, const char *)) && n < CTL_MAX_ARGS + 3)
        argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    int rc = tu_run(argv, NULL, out, err);
    tls_free(tls);
    return rc;
}

char *etcdf_url(const struct etcdf *f, const char *path, const char *query)
{
    return tu_fmt("%s://%s%s%s%s", f->cert_dir ? "etcd+https" : "etcd", f->endpoints, path ? path : "", query ? "?" : "",
                  query ? query : "");
}

/* The /metrics page of the member at 127.0.0.1:PORT (caller frees);
 * NULL when it cannot be read. */
static char *metrics_of(int port)
{
    char *url = tu_fmt("http://127.0.0.1:%d/metrics", port);
    const char *argv[] = {"curl", "-sS", "--max-time", "20", url, NULL};
    char *out = NULL;
    if (tu_run(argv, NULL, &out, NULL) != 0) {
        free(out);
        out = NULL;
    }
    free(url);
    return out;
}

long long etcdf_metric(int port, const char *name)
{
    char *out = metrics_of(port);
    if (!out)
        return -1;
    long long sum = 0;
    size_t n = strlen(name);
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        char *sp = strrchr(line, ' ');
        if (strncmp(line, name, n) == 0 && (line[n] == ' ' || line[n] == '{') && sp)
            sum += (long long)strtod(sp + 1, NULL);
    }
    free(out);
    return sum;
}

long long etcdf_handled(int port, const char *method)
{
    char *out = metrics_of(port);
    if (!out)
        return -1;
    long long sum = 0;
    char *want = tu_fmt("grpc_method=\"%s\"", method);
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        char *sp = strrchr(line, ' ');
        if (strncmp(line, "grpc_server_handled_total{", 26) != 0 || !sp)
            continue;
        if (*method && !strstr(line, want))
            continue;
        if (!*method && (strstr(line, "\"Watch\"") || strstr(line, "\"LeaseKeepAlive\"")))
            continue; /* streams, counted when they end */
        sum += strtoll(sp + 1, NULL, 10);
    }
    free(want);
    free(out);
    return sum;
}
