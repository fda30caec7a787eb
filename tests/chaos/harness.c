/* harness.c -- the orchestrator of the fault harness (chaos.h): network
 * namespaces, real servers through the test fixtures, the store and the
 * workers as child processes, and the faults of each phase drawn from the
 * seed. It is single-threaded and forks every child before it opens any
 * dlock client (it never opens one), so a fork copies nothing half-held.
 *
 * Network: the orchestrator moves into a fresh network namespace (the
 * servers' one; the fixtures listen on 0.0.0.0 there, DLOCK_TEST_LISTEN)
 * and gives each worker process a namespace of its own joined by a veth
 * pair: worker k sees the servers at 10.X.Y.1, itself at 10.X.Y.2 (X.Y
 * from k). A partition sets the servers' end of some pairs down; a packet
 * fault puts a token-bucket filter (tbf: slow and lossy) on both ends
 * (this kernel has no netem). Anonymous namespaces die with their last
 * process, so nothing needs undoing when a run crashes.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chaos.h"
#include "fixture_etcd.h"
#include "fixture_redis.h"
#include "fixture_zk.h"
#include "testutil.h"

#define MAX_WORKERS 8
#define MAX_THREADS 4

const char *chaos_fault_name(enum chaos_fault f)
{
    static const char *const names[FAULT_COUNT] = {
        "none", "worker-kill", "worker-stop", "server-stop", "server-restart",
        "server-restart-empty", "leader-kill", "partition", "packet-loss"};
    return f < FAULT_COUNT ? names[f] : "?";
}

/* What the workers and the orchestrator share (MAP_SHARED, inherited). */
struct shared {
    volatile int stop;
    volatile int64_t call_since[MAX_WORKERS][MAX_THREADS];
};

struct slot {
    pid_t pid;          /* 0: none running */
    int spawn;          /* its spawn number: veth name and subnet */
    int threads;
    bool stopped;       /* SIGSTOPped by a fault */
    int64_t cont_at;    /* when last continued or started */
    int64_t hang_seen;  /* call_since value already counted as a hang */
};

struct run {
    const struct chaos_config *cfg;
    struct chaos_result *res;
    const char *kind;   /* file, redis, etcd, zk */
    bool net;
    int members;
    int lease;
    uint64_t rng;
    char *dir;          /* the run's temp directory */
    char *store_path, *dump_path;
    pid_t store_pid;
    int store_fd;
    struct shared *sh;
    struct slot w[MAX_WORKERS];
    int nworkers, spawns;
    int phase;
    struct fx_redis redis[3]; /* one, or redlock's three masters */
    bool redlock;
    struct etcdf etcd;
    struct zkf zk;
    const char *query;  /* the URL's query part */
};

static uint64_t rnd(struct run *r)
{
    return chaos_rand(&r->rng);
}

static int64_t between(struct run *r, int64_t lo, int64_t hi)
{
    return chaos_between(&r->rng, lo, hi);
}

static void say(struct run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(struct run *r, const char *fmt, ...)
{
    if (!r->cfg->verbose || !r->cfg->log)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(r->cfg->log, "chaos %s +%s: ", r->res->backend, chaos_fault_name(r->res->fault[r->phase]));
    vfprintf(r->cfg->log, fmt, ap);
    fputc('\n', r->cfg->log);
    fflush(r->cfg->log);
    va_end(ap);
}

/* Run a shell command line quietly; its exit status. */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[600];
    snprintf(full, sizeof full, "(%s) >/dev/null 2>&1", cmd);
    int st = system(full);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void subnet(int spawn, int *x, int *y)
{
    *x = 100 + spawn / 250;
    *y = spawn % 250;
}

/* ---------------------------------------------------------------- servers */

static bool servers_start(struct run *r)
{
    if (strcmp(r->kind, "file") == 0) {
        char *d = tu_fmt("%s/locks", r->dir);
        mkdir(d, 0700);
        free(d);
        return true;
    }
    if (strcmp(r->kind, "redis") == 0) {
        /* AOF with fsync always, so that a restart can keep the locks
         * (server-restart) or lose them (server-restart-empty: the AOF
         * is removed first) */
        static const char *const extra[] = {"--appendonly", "yes", "--appendfsync", "always", NULL};
        for (int i = 0; i < r->members; i++)
            if (!fx_redis_start(&r->redis[i], extra))
                return false;
        return true;
    }
    if (strcmp(r->kind, "etcd") == 0) {
        if (!etcdf_start(&r->etcd, r->members)) {
            snprintf(r->res->error, sizeof r->res->error, "%s", r->etcd.error);
            return false;
        }
        return true;
    }
    if (!zkf_start(&r->zk, r->members)) {
        snprintf(r->res->error, sizeof r->res->error, "%s", r->zk.error);
        return false;
    }
    return true;
}

static void servers_stop(struct run *r)
{
    for (int i = 0; strcmp(r->kind, "redis") == 0 && i < r->members; i++)
        fx_redis_stop(&r->redis[i]);
    if (strcmp(r->kind, "etcd") == 0)
        etcdf_stop(&r->etcd);
    else if (strcmp(r->kind, "zk") == 0)
        zkf_stop(&r->zk);
}

/* The process ids of the running servers, into PIDS; how many. */
static int server_pids(struct run *r, pid_t *pids)
{
    int n = 0;
    for (int i = 0; strcmp(r->kind, "redis") == 0 && i < r->members; i++)
        if (r->redis[i].pid > 0)
            pids[n++] = r->redis[i].pid;
    for (int i = 0; strcmp(r->kind, "etcd") == 0 && i < r->etcd.n; i++)
        if (r->etcd.m[i].pid > 0)
            pids[n++] = r->etcd.m[i].pid;
    for (int i = 0; strcmp(r->kind, "zk") == 0 && i < r->zk.n; i++)
        if (r->zk.s[i].pid > 0)
            pids[n++] = r->zk.s[i].pid;
    return n;
}

static void member_kill(struct run *r, int i)
{
    if (strcmp(r->kind, "etcd") == 0)
        etcdf_member_stop(&r->etcd, i, SIGKILL);
    else
        zkf_server_stop(&r->zk, i, SIGKILL);
}

static bool member_start(struct run *r, int i)
{
    return strcmp(r->kind, "etcd") == 0 ? etcdf_member_start(&r->etcd, i, 60000)
                                        : zkf_server_start(&r->zk, i, 60000);
}

/* kill -9 every server, wait DOWN_MS, start them again (EMPTY: redis
 * without its AOF). */
static bool servers_restart(struct run *r, bool empty, int64_t down_ms)
{
    if (strcmp(r->kind, "redis") == 0) {
        /* redlock: one master of the three, the majority stays */
        struct fx_redis *x = &r->redis[between(r, 0, r->members - 1)];
        fx_redis_kill(x);
        if (empty)
            sh("rm -rf '%s/appendonlydir' '%s/appendonly.aof' '%s/dump.rdb'", x->dir, x->dir, x->dir);
        tu_sleep_ms((int)down_ms);
        return fx_redis_restart(x);
    }
    int n = strcmp(r->kind, "etcd") == 0 ? r->etcd.n : r->zk.n;
    for (int i = 0; i < n; i++)
        member_kill(r, i);
    tu_sleep_ms((int)down_ms);
    if (strcmp(r->kind, "etcd") == 0)
        return etcdf_revive(&r->etcd, 60000);
    /* a member of an ensemble alone never serves: start them all, then
     * wait for the ensemble */
    for (int i = 0; i < n; i++)
        zkf_server_start(&r->zk, i, 0);
    return zkf_wait_serving(&r->zk, 60000);
}

static char *worker_url(struct run *r, const char *host)
{
    if (strcmp(r->kind, "file") == 0)
        return tu_fmt("file://%s/locks", r->dir);
    char *list = strdup("");
    int n = strcmp(r->kind, "etcd") == 0 ? r->etcd.n : strcmp(r->kind, "zk") == 0 ? r->zk.n : r->members;
    for (int i = 0; i < n; i++) {
        int port = strcmp(r->kind, "etcd") == 0  ? r->etcd.m[i].client_port
                   : strcmp(r->kind, "zk") == 0 ? r->zk.s[i].port
                                                : r->redis[i].port;
        char *next = tu_fmt("%s%s%s:%d", list, i ? "," : "", host, port);
        free(list);
        list = next;
    }
    char *url = tu_fmt("%s://%s?%s", r->redlock ? "redlock" : r->kind, list, r->query);
    free(list);
    return url;
}

/* ---------------------------------------------------------------- workers */

static void spawn_worker(struct run *r, int k)
{
    struct slot *s = &r->w[k];
    s->spawn = r->spawns++;
    int ready[2], go[2];
    if (pipe2(ready, O_CLOEXEC) != 0 || pipe2(go, O_CLOEXEC) != 0)
        abort();
    int x, y;
    subnet(s->spawn, &x, &y);
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        abort();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        char host[32];
        snprintf(host, sizeof host, "10.%d.%d.1", x, y);
        if (r->net) {
            char c = 0;
            if (unshare(CLONE_NEWNET) != 0)
                _exit(5);
            if (write(ready[1], "r", 1) != 1 || read(go[0], &c, 1) != 1)
                _exit(5);
            if (sh("ip link set lo up && ip addr add 10.%d.%d.2/24 dev eth0 && ip link set eth0 up", x,
                   y) != 0)
                _exit(5);
        }
        for (int t = 0; t < MAX_THREADS; t++)
            r->sh->call_since[k][t] = 0;
        struct chaos_worker w = {
            .wid = s->spawn,
            .url = worker_url(r, host),
            .store_path = r->store_path,
            .threads = s->threads,
            .names = r->cfg->names ? r->cfg->names : 3,
            .lease_ms = r->lease,
            .careless = k == 2,
            .seed = r->cfg->seed ^ ((uint64_t)s->spawn << 32),
            .stop = &r->sh->stop,
            .call_since = r->sh->call_since[k],
        };
        chaos_worker_main(&w);
        _exit(0);
    }
    close(ready[1]);
    close(go[0]);
    if (r->net) {
        char c;
        if (read(ready[0], &c, 1) == 1 &&
            sh("ip link add cw%d type veth peer name eth0 netns %d && ip addr add 10.%d.%d.1/24 dev cw%d "
               "&& ip link set cw%d up",
               s->spawn, (int)pid, x, y, s->spawn, s->spawn) == 0)
            (void)!write(go[1], "g", 1);
    }
    close(ready[0]);
    close(go[1]);
    s->pid = pid;
    s->stopped = false;
    s->cont_at = chaos_now_ms();
    s->hang_seen = 0;
}

/* Reap workers that died (killed by a fault, or failed) and start new
 * ones in their slots, unless the run is stopping. */
static void reap_workers(struct run *r, bool respawn)
{
    for (int k = 0; k < r->nworkers; k++) {
        struct slot *s = &r->w[k];
        if (s->pid > 0 && waitpid(s->pid, NULL, WNOHANG) == s->pid) {
            s->pid = 0;
            if (respawn)
                spawn_worker(r, k);
        }
    }
}

static int64_t hang_limit(struct run *r)
{
    /* the longest wait (2 leases) + a few request timeouts + slack for
     * a machine shared with others; a call past it is reported */
    return 2 * r->lease + 20000;
}

static void check_hangs(struct run *r)
{
    int64_t now = chaos_now_ms();
    for (int k = 0; k < r->nworkers; k++) {
        struct slot *s = &r->w[k];
        if (s->pid <= 0 || s->stopped || now - s->cont_at < hang_limit(r))
            continue;
        for (int t = 0; t < s->threads; t++) {
            int64_t since = r->sh->call_since[k][t];
            if (since && now - since > hang_limit(r) && since != s->hang_seen) {
                s->hang_seen = since;
                r->res->phase[r->phase].hangs++;
                say(r, "worker %d thread %d in a dlock call for %lld ms", s->spawn, t,
                    (long long)(now - since));
            }
        }
    }
}

/* ----------------------------------------------------------------- faults */

struct active {
    enum chaos_fault kind;
    int64_t until;      /* 0: nothing active */
    bool workers[MAX_WORKERS];
    int spawn[MAX_WORKERS];
    pid_t pid[MAX_WORKERS];
    int member;
};

static int pick_worker(struct run *r)
{
    for (int tries = 0; tries < 16; tries++) {
        int k = (int)between(r, 0, r->nworkers - 1);
        if (r->w[k].pid > 0 && !r->w[k].stopped)
            return k;
    }
    return -1;
}

static void tbf(struct run *r, int k, bool on)
{
    const char *q = "root tbf rate 16kbit burst 1600 latency 40ms";
    if (on) {
        sh("tc qdisc replace dev cw%d %s", r->w[k].spawn, q);
        sh("nsenter -t %d -n tc qdisc replace dev eth0 %s", (int)r->w[k].pid, q);
    } else {
        sh("tc qdisc del dev cw%d root", r->w[k].spawn);
        sh("nsenter -t %d -n tc qdisc del dev eth0 root", (int)r->w[k].pid);
    }
}

/* Start one event of the phase's fault; A records what to undo. */
static void fault_start(struct run *r, struct active *a, enum chaos_fault f)
{
    int64_t now = chaos_now_ms();
    memset(a, 0, sizeof *a);
    a->kind = f;
    pid_t pids[ZKF_MAX + ETCDF_MAX + 1];
    int k, n;
    r->res->phase[r->phase].faults++;
    switch (f) {
    case FAULT_NONE:
    case FAULT_COUNT:
        r->res->phase[r->phase].faults--;
        break;
    case FAULT_WORKER_KILL:
        if ((k = pick_worker(r)) >= 0) {
            say(r, "kill -9 worker %d", r->w[k].spawn);
            char reply[16];
            chaos_store_call(r->store_fd, reply, sizeof reply, "KILL %d", r->w[k].spawn);
            kill(r->w[k].pid, SIGKILL);
        }
        break;
    case FAULT_WORKER_STOP:
        if ((k = pick_worker(r)) >= 0) {
            a->until = now + between(r, r->lease / 2, 3 * r->lease);
            a->workers[k] = true;
            a->pid[k] = r->w[k].pid;
            r->w[k].stopped = true;
            say(r, "SIGSTOP worker %d for %lld ms", r->w[k].spawn, (long long)(a->until - now));
            kill(r->w[k].pid, SIGSTOP);
        }
        break;
    case FAULT_SERVER_STOP:
        a->until = now + between(r, r->lease / 2, 5 * r->lease / 2);
        n = server_pids(r, pids);
        say(r, "SIGSTOP %d server(s) for %lld ms", n, (long long)(a->until - now));
        for (int i = 0; i < n; i++)
            kill(-pids[i], SIGSTOP);
        break;
    case FAULT_SERVER_RESTART:
    case FAULT_SERVER_RESTART_EMPTY: {
        int64_t down = between(r, r->lease / 5, r->lease);
        say(r, "kill -9 server(s), down %lld ms%s", (long long)down,
            f == FAULT_SERVER_RESTART_EMPTY ? ", data removed" : "");
        if (!servers_restart(r, f == FAULT_SERVER_RESTART_EMPTY, down))
            say(r, "servers did not come back");
        break;
    }
    case FAULT_LEADER_KILL:
        a->member = strcmp(r->kind, "etcd") == 0 ? etcdf_leader(&r->etcd) : zkf_leader(&r->zk);
        if (a->member < 0) {
            r->res->phase[r->phase].faults--;
            break;
        }
        a->until = now + between(r, r->lease, 3 * r->lease);
        say(r, "kill -9 leader %d for %lld ms", a->member, (long long)(a->until - now));
        member_kill(r, a->member);
        break;
    case FAULT_PARTITION:
    case FAULT_PACKET:
        a->until = now + between(r, r->lease / 2, 3 * r->lease);
        /* one worker, or (one time in three) all: the servers cut off */
        for (k = 0; k < r->nworkers; k++)
            a->workers[k] = r->w[k].pid > 0;
        if (rnd(r) % 3) {
            int keep = pick_worker(r);
            for (k = 0; k < r->nworkers; k++)
                a->workers[k] = a->workers[k] && k == keep;
        }
        for (k = 0; k < r->nworkers; k++) {
            if (!a->workers[k])
                continue;
            a->spawn[k] = r->w[k].spawn;
            a->pid[k] = r->w[k].pid;
            say(r, "%s worker %d for %lld ms", f == FAULT_PARTITION ? "link down to" : "tbf on",
                r->w[k].spawn, (long long)(a->until - now));
            if (f == FAULT_PARTITION)
                sh("ip link set cw%d down", r->w[k].spawn);
            else
                tbf(r, k, true);
        }
        break;
    }
}

static void fault_end(struct run *r, struct active *a)
{
    pid_t pids[ZKF_MAX + ETCDF_MAX + 1];
    int n;
    if (!a->until)
        return;
    switch (a->kind) {
    case FAULT_WORKER_STOP:
        for (int k = 0; k < r->nworkers; k++)
            if (a->workers[k] && r->w[k].pid == a->pid[k]) {
                kill(a->pid[k], SIGCONT);
                r->w[k].stopped = false;
                r->w[k].cont_at = chaos_now_ms();
            }
        break;
    case FAULT_SERVER_STOP:
        n = server_pids(r, pids);
        for (int i = 0; i < n; i++)
            kill(-pids[i], SIGCONT);
        for (int k = 0; k < r->nworkers; k++)
            r->w[k].cont_at = chaos_now_ms();
        break;
    case FAULT_LEADER_KILL:
        if (!member_start(r, a->member))
            say(r, "member %d did not come back", a->member);
        break;
    case FAULT_PARTITION:
    case FAULT_PACKET:
        for (int k = 0; k < r->nworkers; k++) {
            if (!a->workers[k] || r->w[k].spawn != a->spawn[k] || r->w[k].pid != a->pid[k])
                continue; /* that worker died meanwhile: its namespace went with it */
            if (a->kind == FAULT_PARTITION)
                sh("ip link set cw%d up", a->spawn[k]);
            else
                tbf(r, k, false);
            r->w[k].cont_at = chaos_now_ms();
        }
        break;
    default:
        break;
    }
    say(r, "%s over", chaos_fault_name(a->kind));
    a->until = 0;
}

/* ----------------------------------------------------------------- phases */

static void phases_of(struct run *r, const char *backend)
{
    enum chaos_fault list[FAULT_COUNT];
    int n = 0;
    list[n++] = FAULT_NONE;
    list[n++] = FAULT_WORKER_KILL;
    list[n++] = FAULT_WORKER_STOP;
    if (r->net) {
        list[n++] = FAULT_SERVER_STOP;
        list[n++] = FAULT_SERVER_RESTART;
        if (strcmp(r->kind, "redis") == 0)
            list[n++] = FAULT_SERVER_RESTART_EMPTY;
        if (r->members > 1 && !r->redlock)
            list[n++] = FAULT_LEADER_KILL;
        list[n++] = FAULT_PARTITION;
        list[n++] = FAULT_PACKET;
    }
    (void)backend;
    r->res->nphases = 0;
    for (int i = 0; i < n; i++) {
        const char *name = chaos_fault_name(list[i]), *o = r->cfg->only;
        size_t len = strlen(name);
        bool wanted = !o;
        for (const char *p = o; p && !wanted && (p = strstr(p, name)); p += len)
            wanted = (p == o || p[-1] == ',') && (p[len] == ',' || p[len] == '\0');
        if (wanted)
            r->res->fault[r->res->nphases++] = list[i];
    }
}

static void run_phase(struct run *r, int64_t len_ms)
{
    enum chaos_fault f = r->res->fault[r->phase];
    char reply[64];
    chaos_store_call(r->store_fd, reply, sizeof reply, "PHASE %d", r->phase);
    int64_t start = chaos_now_ms(), end = start + len_ms;
    int64_t fault_until = start + len_ms * 65 / 100; /* then recovery */
    int64_t next = start + between(r, r->lease / 4, r->lease);
    struct active a = {.until = 0};
    bool restart_fault = f == FAULT_SERVER_RESTART || f == FAULT_SERVER_RESTART_EMPTY;
    int restarts = 0;
    for (int64_t now = start; now < end; now = chaos_now_ms()) {
        reap_workers(r, true);
        check_hangs(r);
        if (a.until && now >= a.until) {
            fault_end(r, &a);
            next = now + between(r, r->lease / 5, r->lease);
        }
        /* restarts are slow (a JVM, a WAL): two per phase, or one per
         * ten leases of a long phase */
        if (f != FAULT_NONE && !a.until && now >= next && now < fault_until &&
            !(restart_fault && restarts >= 2 && restarts >= len_ms / (10 * r->lease))) {
            restarts += restart_fault;
            fault_start(r, &a, f);
            if (!a.until)
                next = chaos_now_ms() + between(r, r->lease / 3, r->lease);
        }
        tu_sleep_ms(20);
    }
    fault_end(r, &a);
}

/* ------------------------------------------------------------- the run */

static void backend_kind(struct run *r, const char *b)
{
    r->members = 1;
    r->query = "";
    if (strcmp(b, "file") == 0) {
        r->kind = "file";
    } else if (strcmp(b, "redlock") == 0) {
        r->kind = "redis";
        r->redlock = true;
        r->members = 3;
    } else if (strcmp(b, "redis") == 0 || strcmp(b, "redis-simple") == 0) {
        r->kind = "redis";
        r->query = strcmp(b, "redis") == 0 ? "layout=redisson" : "layout=simple";
    } else if (strncmp(b, "etcd", 4) == 0) {
        r->kind = "etcd";
        r->members = b[4] == '3' ? 3 : 1;
    } else if (strncmp(b, "zk", 2) == 0) {
        r->kind = "zk";
        r->members = b[2] == '3' ? 3 : 1;
    } else {
        r->kind = NULL;
    }
    r->net = r->kind && strcmp(r->kind, "file") != 0;
}

bool chaos_run(const struct chaos_config *cfg, struct chaos_result *res)
{
    static struct run run;
    struct run *r = &run;
    memset(r, 0, sizeof *r);
    memset(res, 0, sizeof *res);
    r->cfg = cfg;
    r->res = res;
    snprintf(res->backend, sizeof res->backend, "%s", cfg->backend);
    res->seed = cfg->seed;
    r->rng = cfg->seed;
    r->lease = cfg->lease_ms > 0 ? cfg->lease_ms : 1000;
    r->nworkers = cfg->workers > 0 ? cfg->workers : 3;
    if (r->nworkers > MAX_WORKERS)
        r->nworkers = MAX_WORKERS;
    backend_kind(r, cfg->backend);
    if (!r->kind) {
        snprintf(res->error, sizeof res->error, "unknown backend '%s'", cfg->backend);
        return false;
    }
    res->safe_claimed = strncmp(cfg->backend, "redis", 5) != 0;
    phases_of(r, cfg->backend);
    if (res->nphases == 0) {
        snprintf(res->error, sizeof res->error, "no phase of %s is among '%s'", cfg->backend, cfg->only);
        return false;
    }
    char query[128];
    snprintf(query, sizeof query, "%s%slease=%d&timeout=%d&connect_timeout=%d", r->query,
             *r->query ? "&" : "", r->lease, r->lease, r->lease);
    r->query = query;

    if (r->net) {
        if (unshare(CLONE_NEWNET) != 0 || sh("ip link set lo up") != 0) {
            snprintf(res->error, sizeof res->error,
                     "no network namespace (unshare: %s): the harness needs root", strerror(errno));
            return false;
        }
        setenv("DLOCK_TEST_LISTEN", "0.0.0.0", 1);
    }
    r->dir = tu_tmpdir("chaos");
    r->store_path = tu_fmt("%s/store.sock", r->dir);
    r->dump_path = tu_fmt("%s/store.dump", r->dir);
    bool ok = servers_start(r);
    if (!ok) {
        if (!res->error[0])
            snprintf(res->error, sizeof res->error, "%s: the servers did not start", cfg->backend);
        goto out;
    }
    fflush(NULL);
    r->store_pid = fork();
    if (r->store_pid == 0)
        chaos_store_main(r->store_path, r->dump_path, cfg->names ? cfg->names : 3);
    for (int i = 0; i < 500 && (r->store_fd = chaos_store_connect(r->store_path)) < 0; i++)
        tu_sleep_ms(10);
    if (r->store_fd < 0) {
        snprintf(res->error, sizeof res->error, "the store did not start");
        ok = false;
        goto out;
    }
    r->sh = mmap(NULL, sizeof *r->sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (r->sh == MAP_FAILED)
        abort();
    /* one worker with several threads on its client, the others fewer;
     * the third is careless (never checks its hold before writing) */
    for (int k = 0; k < r->nworkers; k++) {
        r->w[k].threads = k == 0 ? 3 : 1 + k % 2;
        spawn_worker(r, k);
    }
    int64_t len = (int64_t)cfg->duration_s * 1000 / res->nphases;
    for (r->phase = 0; r->phase < res->nphases; r->phase++) {
        if (cfg->log)
            fprintf(cfg->log, "chaos %s seed %llu: phase %s (%lld ms)\n", cfg->backend,
                    (unsigned long long)cfg->seed, chaos_fault_name(res->fault[r->phase]),
                    (long long)len);
        run_phase(r, len);
    }
    r->phase = res->nphases - 1;
    /* stop: every worker finishes its section, releases and exits */
    r->sh->stop = 1;
    for (int k = 0; k < r->nworkers; k++)
        if (r->w[k].pid > 0)
            kill(r->w[k].pid, SIGCONT);
    int64_t give_up = chaos_now_ms() + hang_limit(r);
    for (bool left = true; left && chaos_now_ms() < give_up;) {
        reap_workers(r, false);
        left = false;
        for (int k = 0; k < r->nworkers; k++)
            left = left || r->w[k].pid > 0;
        tu_sleep_ms(20);
    }
    for (int k = 0; k < r->nworkers; k++)
        if (r->w[k].pid > 0) {
            say(r, "worker %d did not stop: a hang", r->w[k].spawn);
            res->phase[r->phase].hangs++;
            kill(r->w[k].pid, SIGKILL);
            waitpid(r->w[k].pid, NULL, 0);
            r->w[k].pid = 0;
        }
    char reply[16];
    ok = chaos_store_call(r->store_fd, reply, sizeof reply, "DUMP") && strcmp(reply, "OK") == 0 &&
         chaos_store_analyse(r->dump_path, res->nphases, res);
    if (!ok)
        snprintf(res->error, sizeof res->error, "the store gave no records");
    waitpid(r->store_pid, NULL, 0);
    r->store_pid = 0;
out:
    for (int k = 0; k < r->nworkers; k++)
        if (r->w[k].pid > 0) {
            kill(r->w[k].pid, SIGKILL);
            waitpid(r->w[k].pid, NULL, 0);
        }
    if (r->store_pid > 0) {
        kill(r->store_pid, SIGKILL);
        waitpid(r->store_pid, NULL, 0);
    }
    if (r->store_fd > 0)
        close(r->store_fd);
    servers_stop(r);
    if (r->sh && r->sh != MAP_FAILED)
        munmap(r->sh, sizeof *r->sh);
    tu_rmrf(r->dir);
    free(r->dir);
    free(r->store_path);
    free(r->dump_path);
    memset(&res->total, 0, sizeof res->total);
    for (int k = 0; k < res->nphases; k++) {
        struct chaos_counts *p = &res->phase[k], *t = &res->total;
        t->acquisitions += p->acquisitions;
        t->writes += p->writes;
        t->overlaps += p->overlaps;
        t->overlaps_accepted += p->overlaps_accepted;
        t->stale_rejected += p->stale_rejected;
        t->token_regressions += p->token_regressions;
        t->token_repeats += p->token_repeats;
        t->lost_updates += p->lost_updates;
        t->lost_before += p->lost_before;
        t->lost_after += p->lost_after;
        t->lost_at_release += p->lost_at_release;
        t->stopped_on_lost += p->stopped_on_lost;
        t->errors += p->errors;
        t->contention += p->contention;
        t->faults += p->faults;
        t->hangs += p->hangs;
        if (p->max_gap_ms > t->max_gap_ms)
            t->max_gap_ms = p->max_gap_ms;
    }
    return ok;
}

bool chaos_safe(const struct chaos_result *res, char *why, size_t len)
{
    const struct chaos_counts *t = &res->total;
    why[0] = '\0';
    if (res->error[0])
        snprintf(why, len, "%s", res->error);
    else if (t->hangs)
        snprintf(why, len, "%ld dlock call(s) hung", t->hangs);
    else if (t->token_regressions)
        snprintf(why, len, "%ld token regression(s)", t->token_regressions);
    else if (t->lost_updates)
        snprintf(why, len, "%ld lost update(s)", t->lost_updates);
    else if (res->safe_claimed && t->overlaps_accepted)
        snprintf(why, len, "%ld overlap(s) the store accepted", t->overlaps_accepted);
    return why[0] == '\0';
}

/* ----------------------------------------------------------------- output */

static const char *const columns[] = {"acq", "writes", "overlap", "ovl-acc", "stale", "regress", "repeat",
                                      "lost-bef", "lost-aft", "lost-rel", "cut", "errors", "busy",
                                      "faults", "gap-ms", "hangs"};

static void counts_values(const struct chaos_counts *c, long long *v)
{
    long long x[] = {c->acquisitions, c->writes, c->overlaps, c->overlaps_accepted,
                     c->stale_rejected, c->token_regressions, c->token_repeats, c->lost_before, c->lost_after,
                     c->lost_at_release, c->stopped_on_lost, c->errors, c->contention,
                     c->faults, c->max_gap_ms, c->hangs};
    memcpy(v, x, sizeof x);
}

#define NCOL (sizeof columns / sizeof *columns)

void chaos_print_table(FILE *out, const struct chaos_result *res)
{
    fprintf(out, "backend %s, seed %llu%s%s\n", res->backend, (unsigned long long)res->seed,
            res->error[0] ? ": " : "", res->error);
    fprintf(out, "%-21s", "fault");
    for (size_t i = 0; i < NCOL; i++)
        fprintf(out, " %8s", columns[i]);
    fputc('\n', out);
    long long v[NCOL];
    for (int k = 0; k <= res->nphases; k++) {
        const struct chaos_counts *c = k < res->nphases ? &res->phase[k] : &res->total;
        counts_values(c, v);
        fprintf(out, "%-21s", k < res->nphases ? chaos_fault_name(res->fault[k]) : "total");
        for (size_t i = 0; i < NCOL; i++)
            fprintf(out, " %8lld", v[i]);
        fputc('\n', out);
    }
}

void chaos_print_json(FILE *out, const struct chaos_result *res)
{
    long long v[NCOL];
    fprintf(out, "{\"backend\":\"%s\",\"seed\":%llu,\"error\":\"%s\",\"phases\":[", res->backend,
            (unsigned long long)res->seed, res->error);
    for (int k = 0; k <= res->nphases; k++) {
        const struct chaos_counts *c = k < res->nphases ? &res->phase[k] : &res->total;
        counts_values(c, v);
        fprintf(out, "%s{\"fault\":\"%s\"", k ? "," : "",
                k < res->nphases ? chaos_fault_name(res->fault[k]) : "total");
        for (size_t i = 0; i < NCOL; i++)
            fprintf(out, ",\"%s\":%lld", columns[i], v[i]);
        fputc('}', out);
    }
    fprintf(out, "]}\n");
}
