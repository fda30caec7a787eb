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
 * from k), and every worker reaches the servers at SERVERS_ADDR too (the
 * one address Sentinel can hand out). A partition sets the servers' end
 * of some pairs down, or drops a server's port with nftables (a master
 * cut off from its replicas and sentinels, a Redlock master from the
 * workers); packet faults use what this kernel has, since it has no
 * netem: a token-bucket filter (slow-link), nftables' random drop (loss),
 * a slow HTB class a random share of packets is steered into (reorder),
 * and a relay process the worker's connections are redirected through
 * (relay.c: a fixed delay). Anonymous namespaces die with their last process,
 * so nothing needs undoing when a run crashes.
 *
 * For leader-partition (etcd3, zk3, by hand) each member of the ensemble
 * also gets a namespace of its own, joined to the servers' one by a veth
 * pair cmI (10.98.I.1 there, 10.98.I.2 on the member's side), so that
 * setting cmI down cuts member I off from the other members and from
 * every worker at once. The fixtures keep 127.0.0.1 in every address
 * they write and probe; NAT makes 127.0.0.1:PORT mean the member that
 * owns PORT everywhere (members_apart() below).
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chaos.h"
#include "fixture_etcd.h"
#include "fixture_mysql.h"
#include "fixture_pg.h"
#include "fixture_redis.h"
#include "fixture_zk.h"
#include "testutil.h"

#define MAX_WORKERS CHAOS_MAX_WORKERS
#define MAX_THREADS CHAOS_MAX_THREADS

const char *chaos_fault_name(enum chaos_fault f)
{
    static const char *const names[FAULT_COUNT] = {
        "none", "worker-kill", "worker-stop", "server-stop", "server-restart",
        "server-restart-empty", "leader-kill", "partition", "slow-link", "master-kill",
        "failover", "master-partition", "node-partition", "packet-loss", "packet-reorder",
        "packet-delay", "clock-step", "clock-back-empty", "leader-partition", "value-lock"};
    return f < FAULT_COUNT ? names[f] : "?";
}

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
    const char *kind;   /* file, redis, etcd, zk, postgres, mysql */
    bool net;
    int members;
    int lease;
    uint64_t rng;
    char *dir;          /* the run's temp directory */
    char *store_path, *dump_path;
    pid_t store_pid;
    int store_fd;
    struct chaos_shared *sh;
    int shm_fd;         /* the memfd behind SH, inherited by the workers */
    pid_t relay_pid;    /* the delaying relay (relay.c), 0: none */
    int relay_port;
    const char *clockshift; /* clockshift.so, NULL: no clock faults */
    struct slot w[MAX_WORKERS];
    int nworkers, spawns;
    int phase;
    struct fx_redis redis[3]; /* one, redlock's three masters, or Sentinel's
                                 first master and its two replicas */
    bool redlock;
    bool elect;         /* file-election: the workers campaign (worker.c) */
    bool sentinel;      /* redis+sentinel:// (sentinel.c in tests/chaos) */
    unsigned permits;   /* redis-sem: each name a semaphore of so many permits */
    const char *redis_args[3][12]; /* each server's arguments (outlive it) */
    char replicaof_port[16];
    pid_t sentinel_pid[3];
    bool healing;       /* a Sentinel fault ended: no next one until whole again */
    int sentinel_port[3];
    struct etcdf etcd;
    struct zkf zk;
    struct pgf pg;
    struct fx_mysql my;
    const char *query;  /* the URL's query part */
    bool apart;         /* each ensemble member in a namespace of its own */
    int servers_ns;     /* the servers' namespace (open while apart) */
    int member_ns[ZKF_MAX + ETCDF_MAX];
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

/* ------------------------------------------------------------ wall clocks */

/* Clock steps without touching the machine's clock (shared by everyone):
 * each worker and each Redis server runs with clockshift.so preloaded
 * (clockshift.c) and reads its wall clock as the real one plus the
 * offset in a file of its own; its monotonic clock is left alone. */

/* The preloaded library (NULL: none, no clock faults): built beside the
 * harness (CHAOS_CLOCKSHIFT, from the Makefile). */
static const char *clockshift_lib(void)
{
#ifdef CHAOS_CLOCKSHIFT
    if (!getenv("DLOCK_CHAOS_NO_CLOCKSHIFT") && access(CHAOS_CLOCKSHIFT, R_OK) == 0)
        return CHAOS_CLOCKSHIFT;
#endif
    return NULL;
}

/* The offset file of worker spawn N ('w') or server N ('s'), in the run's
 * directory (caller frees). */
static char *clock_file(struct run *r, char who, int n)
{
    return tu_fmt("%s/clock-%c%d", r->dir, who, n);
}

/* Step the clock behind FILE to OFFSET_S seconds from the real one. */
static void clock_set(const char *file, long offset_s)
{
    /* not tu_write_file(): its check assertions need a running test */
    char *tmp = tu_fmt("%s.tmp", file);
    FILE *f = fopen(tmp, "w");
    if (f) {
        fprintf(f, "%+ld\n", offset_s);
        if (fclose(f) == 0)
            rename(tmp, file);
    }
    free(tmp);
}

/* ENV (room for 2 + NULL): what preloads the clock shift reading FILE. */
static void clockshift_env(struct run *r, const char *file, char **env)
{
    env[0] = tu_fmt("LD_PRELOAD=%s", r->clockshift);
    env[1] = tu_fmt("DLOCK_CLOCKSHIFT_FILE=%s", file);
    env[2] = NULL;
}

/* Start (RESTART: start again) Redis server I of the run under its own
 * clock file: the environment is set for the exec and taken back. */
static bool redis_spawn(struct run *r, int i, const char *const *extra, bool restart)
{
    char *env[8] = {NULL};
    char *file = NULL;
    if (r->clockshift) {
        file = clock_file(r, 's', i);
        if (!restart)
            clock_set(file, 0);
        clockshift_env(r, file, env);
        for (int k = 0; env[k]; k++)
            putenv(env[k]);
    }
    bool ok = restart ? fx_redis_restart(&r->redis[i]) : fx_redis_start(&r->redis[i], extra);
    for (int k = 0; env[k]; k++) {
        *strchr(env[k], '=') = '\0';
        unsetenv(env[k]);
        free(env[k]);
    }
    free(file);
    return ok;
}

/* ---------------------------------------------------------------- servers */

/* The address every server of the servers' namespace also answers on, on
 * its loopback: each worker routes it through its own veth pair. Sentinel
 * hands out the master's address, so it must be one address every worker
 * reaches (each worker sees the servers' side of its pair at its own
 * 10.X.Y.1); the servers, the replicas and the sentinels announce it. */
#define SERVERS_ADDR "10.99.0.1"

/* The nftables table of the harness in the current namespace: an input
 * and an output chain that the faults fill and flush. */
#define NFT_SETUP                                                                                  \
    "nft add table inet chaos && "                                                                 \
    "nft 'add chain inet chaos in { type filter hook input priority 0; }' && "                     \
    "nft 'add chain inet chaos out { type filter hook output priority 0; }' && "                  \
    "nft add table ip chaosnat && "                                                                \
    "nft 'add chain ip chaosnat pre { type nat hook prerouting priority -100; }'"

/* The index of the server sentinel 0 names as master now (-1: none). */
static int sentinel_master(struct run *r)
{
    redisReply *rep =
        fx_redis_raw_at(r->sentinel_port[0], NULL, "SENTINEL get-master-addr-by-name dlockm");
    int port = rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 ? atoi(rep->element[1]->str) : 0;
    if (rep)
        freeReplyObject(rep);
    for (int i = 0; i < r->members; i++)
        if (r->redis[i].port == port)
            return i;
    return -1;
}

/* Whether the topology is whole again: sentinel 0's master says it is
 * master, with both replicas online. */
static bool sentinel_healed(struct run *r)
{
    int m = sentinel_master(r);
    redisReply *rep = m >= 0 ? fx_redis_raw_at(r->redis[m].port, NULL, "INFO replication") : NULL;
    bool whole = rep && rep->type == REDIS_REPLY_STRING && strstr(rep->str, "role:master") &&
                 strstr(rep->str, "connected_slaves:2");
    for (const char *p = whole ? rep->str : NULL; p && (p = strstr(p, "\nslave")); p++) {
        const char *eol = strchr(p + 1, '\n'), *online = strstr(p, "state=online");
        whole = whole && online && (!eol || online < eol);
    }
    if (rep)
        freeReplyObject(rep);
    return whole;
}

/* Whether every sentinel sees the 2 replicas and the 2 other sentinels. */
static bool sentinels_ready(struct run *r)
{
    for (int i = 0; i < 3; i++) {
        redisReply *rep = fx_redis_raw_at(r->sentinel_port[i], NULL, "SENTINEL master dlockm");
        long slaves = -1, others = -1;
        for (size_t k = 0; rep && rep->type == REDIS_REPLY_ARRAY && k + 1 < rep->elements; k += 2) {
            if (strcmp(rep->element[k]->str, "num-slaves") == 0)
                slaves = atol(rep->element[k + 1]->str);
            if (strcmp(rep->element[k]->str, "num-other-sentinels") == 0)
                others = atol(rep->element[k + 1]->str);
        }
        if (rep)
            freeReplyObject(rep);
        if (slaves != 2 || others != 2)
            return false;
    }
    return true;
}

/* redis+sentinel://: a master and two replicas (AOF, as the plain Redis
 * runs), then three sentinels (quorum 2, down after 1 s) announcing
 * SERVERS_ADDR; waits until each sentinel sees the whole topology. */
static bool sentinel_start(struct run *r)
{
    for (int i = 0; i < r->members; i++) {
        const char **a = r->redis_args[i];
        int n = 0;
        a[n++] = "--appendonly";
        a[n++] = "yes";
        a[n++] = "--appendfsync";
        a[n++] = "always";
        a[n++] = "--replica-announce-ip";
        a[n++] = SERVERS_ADDR;
        if (i > 0) {
            a[n++] = "--replicaof";
            a[n++] = SERVERS_ADDR;
            a[n++] = r->replicaof_port;
        }
        a[n] = NULL;
        if (!redis_spawn(r, i, a, false))
            return false;
        if (i == 0)
            snprintf(r->replicaof_port, sizeof r->replicaof_port, "%d", r->redis[0].port);
    }
    for (int i = 0; i < 3; i++) {
        r->sentinel_port[i] = tu_free_port();
        char *conf = tu_fmt("%s/sentinel%d.conf", r->dir, i), *log = tu_fmt("%s/sentinel%d.log", r->dir, i);
        FILE *f = fopen(conf, "w");
        if (f) {
            fprintf(f, "port %d\ndir %s\nsentinel announce-ip %s\n"
                       "sentinel monitor dlockm %s %d 2\n"
                       "sentinel down-after-milliseconds dlockm 1000\n"
                       "sentinel failover-timeout dlockm 4000\n",
                    r->sentinel_port[i], r->dir, SERVERS_ADDR, SERVERS_ADDR, r->redis[0].port);
            fclose(f);
        }
        const char *argv[] = {"redis-server", conf, "--sentinel", NULL};
        r->sentinel_pid[i] = tu_spawn(argv, log);
        bool up = f && tu_wait_port(r->sentinel_port[i], 10000);
        free(conf);
        free(log);
        if (!up) {
            snprintf(r->res->error, sizeof r->res->error, "sentinel %d did not start", i);
            return false;
        }
    }
    for (int i = 0; i < 600; i++) {
        if (sentinels_ready(r))
            return true;
        tu_sleep_ms(50);
    }
    snprintf(r->res->error, sizeof r->res->error, "the sentinels never saw the replicas and each other");
    char *log = tu_fmt("%s/sentinel0.log", r->dir), *text = tu_read_file(log);
    fprintf(stderr, "chaos: %s:\n%s\n", log, text ? text : "(none)");
    free(text);
    free(log);
    return false;
}

static bool servers_start(struct run *r)
{
    if (strcmp(r->kind, "file") == 0) {
        char *d = tu_fmt("%s/locks", r->dir);
        mkdir(d, 0700);
        free(d);
        return true;
    }
    if (r->sentinel)
        return sentinel_start(r);
    if (strcmp(r->kind, "redis") == 0) {
        /* AOF with fsync always, so that a restart can keep the locks
         * (server-restart) or lose them (server-restart-empty: the AOF
         * is removed first) */
        static const char *const extra[] = {"--appendonly", "yes", "--appendfsync", "always", NULL};
        for (int i = 0; i < r->members; i++)
            if (!redis_spawn(r, i, extra, false))
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
    if (strcmp(r->kind, "postgres") == 0) {
        if (!pgf_start(&r->pg)) {
            snprintf(r->res->error, sizeof r->res->error, "%s", r->pg.error);
            return false;
        }
        return true;
    }
    if (strcmp(r->kind, "mysql") == 0) {
        /* root from the workers' addresses too (the data directory keeps
         * the grant through restarts) */
        char *out = NULL;
        if (!fx_mysql_start(&r->my) ||
            !(out = fx_mysql_sql(&r->my, "CREATE USER IF NOT EXISTS root@'%'; "
                                         "GRANT ALL ON *.* TO root@'%' WITH GRANT OPTION"))) {
            snprintf(r->res->error, sizeof r->res->error, "%s",
                     r->my.error[0] ? r->my.error : "mysql: the workers' user was not made");
            return false;
        }
        free(out);
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
    for (int i = 0; r->sentinel && i < 3; i++)
        if (r->sentinel_pid[i] > 0)
            tu_stop(r->sentinel_pid[i], 2000);
    for (int i = 0; strcmp(r->kind, "redis") == 0 && i < r->members; i++)
        fx_redis_stop(&r->redis[i]);
    if (strcmp(r->kind, "etcd") == 0)
        etcdf_stop(&r->etcd);
    else if (strcmp(r->kind, "zk") == 0)
        zkf_stop(&r->zk);
    else if (strcmp(r->kind, "postgres") == 0)
        pgf_stop(&r->pg);
    else if (strcmp(r->kind, "mysql") == 0)
        fx_mysql_stop(&r->my);
}

/* The process ids of the servers a server-stop freezes, into PIDS; how
 * many: every server; Redlock's one master of the three (a minority);
 * Sentinel's current master (the replicas and sentinels go on, and fail
 * over when the pause outlasts down-after-milliseconds). */
static int server_pids(struct run *r, pid_t *pids)
{
    int n = 0;
    if (r->sentinel) {
        int m = sentinel_master(r);
        if (m >= 0 && r->redis[m].pid > 0)
            pids[n++] = r->redis[m].pid;
        return n;
    }
    if (r->redlock) {
        int m = (int)between(r, 0, r->members - 1);
        if (r->redis[m].pid > 0)
            pids[n++] = r->redis[m].pid;
        return n;
    }
    for (int i = 0; strcmp(r->kind, "redis") == 0 && i < r->members; i++)
        if (r->redis[i].pid > 0)
            pids[n++] = r->redis[i].pid;
    for (int i = 0; strcmp(r->kind, "etcd") == 0 && i < r->etcd.n; i++)
        if (r->etcd.m[i].pid > 0)
            pids[n++] = r->etcd.m[i].pid;
    for (int i = 0; strcmp(r->kind, "zk") == 0 && i < r->zk.n; i++)
        if (r->zk.s[i].pid > 0)
            pids[n++] = r->zk.s[i].pid;
    if (strcmp(r->kind, "mysql") == 0 && r->my.pid > 0)
        pids[n++] = r->my.pid;
    /* postgres: its backends are sessions of their own (pgf_pause) */
    return n;
}

static void member_kill(struct run *r, int i)
{
    if (strcmp(r->kind, "etcd") == 0)
        etcdf_member_stop(&r->etcd, i, SIGKILL);
    else
        zkf_server_stop(&r->zk, i, SIGKILL);
}

/* Start member I again without waiting for it; in its own namespace
 * when the members are apart (the fixture's process is spawned from
 * there, then the orchestrator returns to the servers' namespace). */
static void member_spawn(struct run *r, int i)
{
    if (r->apart)
        setns(r->member_ns[i], CLONE_NEWNET);
    if (strcmp(r->kind, "etcd") == 0)
        etcdf_member_start(&r->etcd, i, 0);
    else
        zkf_server_start(&r->zk, i, 0);
    if (r->apart)
        setns(r->servers_ns, CLONE_NEWNET);
}

/* Wait until the ensemble serves again: every running member answers and
 * one leads. */
static bool members_wait(struct run *r)
{
    return strcmp(r->kind, "etcd") == 0 ? etcdf_wait_healthy(&r->etcd, 60000) : zkf_wait_serving(&r->zk, 60000);
}

static bool member_start(struct run *r, int i)
{
    member_spawn(r, i);
    return members_wait(r);
}

/* kill -9 every server, wait DOWN_MS, start them again (EMPTY: redis
 * without its AOF). */
static bool servers_restart(struct run *r, bool empty, int64_t down_ms)
{
    if (strcmp(r->kind, "postgres") == 0) {
        pgf_crash(&r->pg); /* the postmaster and every backend at once */
        tu_sleep_ms((int)down_ms);
        return pgf_restart(&r->pg);
    }
    if (strcmp(r->kind, "mysql") == 0) {
        fx_mysql_kill(&r->my, SIGKILL);
        tu_sleep_ms((int)down_ms);
        return fx_mysql_restart(&r->my);
    }
    if (strcmp(r->kind, "redis") == 0) {
        /* redlock: one master of the three, the majority stays */
        int m = (int)between(r, 0, r->members - 1);
        struct fx_redis *x = &r->redis[m];
        fx_redis_kill(x);
        if (empty)
            sh("rm -rf '%s/appendonlydir' '%s/appendonly.aof' '%s/dump.rdb'", x->dir, x->dir, x->dir);
        tu_sleep_ms((int)down_ms);
        return redis_spawn(r, m, NULL, true);
    }
    int n = strcmp(r->kind, "etcd") == 0 ? r->etcd.n : r->zk.n;
    for (int i = 0; i < n; i++)
        member_kill(r, i);
    tu_sleep_ms((int)down_ms);
    /* a member of an ensemble alone never serves: start them all, then
     * wait for the ensemble */
    for (int i = 0; i < n; i++)
        member_spawn(r, i);
    return members_wait(r);
}

/* The ports member I listens on, into PORTS; how many. */
static int member_ports(struct run *r, int i, int *ports)
{
    if (strcmp(r->kind, "etcd") == 0) {
        ports[0] = r->etcd.m[i].client_port;
        ports[1] = r->etcd.m[i].peer_port;
        return 2;
    }
    ports[0] = r->zk.s[i].port;
    ports[1] = r->zk.s[i].quorum_port;
    ports[2] = r->zk.s[i].election_port;
    return 3;
}

/* NAT chains of the current namespace: output, prerouting (PRE_PRIO:
 * after the relay's chain in the servers' namespace, so a delayed
 * worker's connections still go through the relay first) and a
 * postrouting masquerade on the links named OIF. Packets sent to
 * 127.0.0.1 may leave the namespace (route_localnet) once rewritten. */
#define NAT_SETUP(pre_prio, oif)                                                                   \
    "echo 1 > /proc/sys/net/ipv4/conf/all/route_localnet && "                                      \
    "nft add table ip chaosm && "                                                                  \
    "nft 'add chain ip chaosm out { type nat hook output priority -100; }' && "                    \
    "nft 'add chain ip chaosm pre { type nat hook prerouting priority " pre_prio "; }' && "        \
    "nft 'add chain ip chaosm post { type nat hook postrouting priority 100; }' && "               \
    "nft 'add rule ip chaosm post oifname \"" oif "\" masquerade'"

/* Move every member of the ensemble into a namespace of its own (the
 * members are killed, the namespaces made, then each is started in its
 * own). 127.0.0.1:PORT of member I, the address the fixtures and the
 * other members use, is rewritten to 10.98.I.2:PORT in the servers'
 * namespace (local and from the workers' links, forwarded to cmI) and in
 * every other member's; on member I's side back to 127.0.0.1 (its peer
 * listeners are bound there). */
static bool members_apart(struct run *r)
{
    int n = strcmp(r->kind, "etcd") == 0 ? r->etcd.n : r->zk.n;
    for (int i = 0; i < n; i++)
        member_kill(r, i);
    r->servers_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (r->servers_ns < 0 || sh("echo 1 > /proc/sys/net/ipv4/ip_forward && " NAT_SETUP("-90", "cm*")) != 0)
        return false;
    for (int i = 0; i < n; i++) {
        int ports[3], np = member_ports(r, i, ports);
        if (unshare(CLONE_NEWNET) != 0)
            return false;
        r->member_ns[i] = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
        bool ok = r->member_ns[i] >= 0 && sh("ip link set lo up && " NAT_SETUP("-100", "eth0")) == 0;
        for (int k = 0; ok && k < np; k++)
            ok = sh("nft 'add rule ip chaosm pre iifname \"eth0\" tcp dport %d dnat to 127.0.0.1'", ports[k]) == 0;
        for (int j = 0; ok && j < n; j++) {
            int other[3], no = member_ports(r, j, other);
            for (int k = 0; j != i && ok && k < no; k++)
                ok = sh("nft 'add rule ip chaosm out ip daddr 127.0.0.1 tcp dport %d dnat to 10.98.%d.2'", other[k],
                        j) == 0;
        }
        setns(r->servers_ns, CLONE_NEWNET);
        ok = ok && sh("ip link add cm%d type veth peer name eth0 netns /proc/%d/fd/%d && "
                      "ip addr add 10.98.%d.1/24 dev cm%d && ip link set cm%d up",
                      i, (int)getpid(), r->member_ns[i], i, i, i) == 0;
        for (int k = 0; ok && k < np; k++)
            ok = sh("nft 'add rule ip chaosm out fib daddr type local tcp dport %d dnat to 10.98.%d.2' && "
                    "nft 'add rule ip chaosm pre fib daddr type local tcp dport %d dnat to 10.98.%d.2'",
                    ports[k], i, ports[k], i) == 0;
        setns(r->member_ns[i], CLONE_NEWNET);
        ok = ok && sh("echo 1 > /proc/sys/net/ipv4/conf/eth0/route_localnet && ip addr add 10.98.%d.2/24 dev eth0 && "
                      "ip link set eth0 up && ip route add default via 10.98.%d.1",
                      i, i) == 0;
        setns(r->servers_ns, CLONE_NEWNET);
        if (!ok)
            return false;
    }
    r->apart = true;
    for (int i = 0; i < n; i++)
        member_spawn(r, i);
    return members_wait(r);
}

static char *worker_url(struct run *r, const char *host)
{
    if (strcmp(r->kind, "file") == 0)
        return tu_fmt("file://%s/locks", r->dir);
    if (strcmp(r->kind, "postgres") == 0)
        return tu_fmt("postgres://postgres@%s:%d/postgres?%s", host, r->pg.port, r->query);
    if (strcmp(r->kind, "mysql") == 0)
        return tu_fmt("mysql://root@%s:%d/dlock?%s", host, r->my.port, r->query);
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
    if (r->sentinel) {
        free(url);
        url = tu_fmt("redis+sentinel://%s:%d,%s:%d,%s:%d/dlockm?%s", SERVERS_ADDR, r->sentinel_port[0],
                     SERVERS_ADDR, r->sentinel_port[1], SERVERS_ADDR, r->sentinel_port[2], r->query);
    }
    free(list);
    return url;
}

/* The delaying relay (relay.c) on a free port of the servers' namespace. */
static bool relay_start(struct run *r)
{
    r->relay_port = tu_free_port();
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)r->relay_port)};
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(lfd, 64) != 0) {
        if (lfd >= 0)
            close(lfd);
        return false;
    }
    fflush(NULL);
    r->relay_pid = fork();
    if (r->relay_pid == 0)
        chaos_relay_main(lfd, r->sh);
    close(lfd);
    return r->relay_pid > 0;
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
            if (sh("ip link set lo up && ip addr add 10.%d.%d.2/24 dev eth0 && ip link set eth0 up && "
                   "ip route add %s/32 via 10.%d.%d.1",
                   x, y, SERVERS_ADDR, x, y) != 0)
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
            .permits = r->permits,
            .elect = r->elect,
            .seed = r->cfg->seed ^ ((uint64_t)s->spawn << 32),
            .stop = &r->sh->stop,
            .call_since = r->sh->call_since[k],
        };
        /* exec'd again so that its wall clock can be stepped: the clock
         * shift preloaded, reading the offset from its own file (not
         * under a sanitizer, whose runtime must be the first library) */
        char *env[8] = {NULL};
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
        if (r->clockshift) {
            char *clock = clock_file(r, 'w', s->spawn);
            clock_set(clock, 0);
            clockshift_env(r, clock, env);
        }
#endif
        chaos_worker_exec(&w, r->shm_fd, k, env);
        _exit(7);
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
    pid_t servers[ZKF_MAX + ETCDF_MAX + 1]; /* server-stop: the ones frozen */
    int nservers;
    bool nft;           /* rules in the servers' chains to flush */
    char *clocks[MAX_WORKERS + 1]; /* clock-step: the offset files stepped */
    int nclocks;
    long step_s;
    int value_fd;       /* value-lock: the value file whose byte 0 is held, -1: none */
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

/* Packet loss on worker K's link: PERCENT of the packets each way
 * dropped at random by the servers' namespace (nftables numgen; the
 * kernel has no netem). Undone by flushing the chains. */
static void loss_on(struct run *r, int k, int percent)
{
    int c = r->w[k].spawn;
    sh("nft 'add rule inet chaos in iifname \"cw%d\" numgen random mod 100 < %d drop'", c, percent);
    sh("nft 'add rule inet chaos out oifname \"cw%d\" numgen random mod 100 < %d drop'", c, percent);
}

/* Reordering on worker K's link, both ways: PERCENT of the packets go
 * through a slow HTB class (8 kbit/s, no burst), chosen at random by an
 * nftables rule that sets their priority, so they leave after packets
 * sent later through the fast class. The worker's side is set up in its
 * namespace (nsenter). ON false removes the queues (the servers' rules
 * go with the flush). */
static void reorder(struct run *r, int k, int percent, bool on)
{
    int c = r->w[k].spawn, pid = (int)r->w[k].pid;
    char dev[16];
    snprintf(dev, sizeof dev, "cw%d", c);
    for (int side = 0; side < 2; side++) {
        char ns[48] = "";
        if (side)
            snprintf(ns, sizeof ns, "nsenter -t %d -n ", pid);
        const char *d = side ? "eth0" : dev;
        if (!on) {
            sh("%stc qdisc del dev %s root", ns, d);
            if (side)
                sh("%snft flush chain inet chaos out", ns);
            continue;
        }
        sh("%stc qdisc replace dev %s root handle 1: htb default 10 && "
           "%stc class add dev %s parent 1: classid 1:10 htb rate 1gbit && "
           "%stc class add dev %s parent 1: classid 1:20 htb rate 8kbit ceil 8kbit burst 1 cburst 1",
           ns, d, ns, d, ns, d);
        if (side)
            sh("%s sh -c \"%s\"", ns, "nft add table inet chaos; "
               "nft 'add chain inet chaos out { type filter hook output priority 0; }' && "                  \
    "nft add table ip chaosnat && "                                                                \
    "nft 'add chain ip chaosnat pre { type nat hook prerouting priority -100; }'");
        sh("%snft 'add rule inet chaos out oifname \"%s\" numgen random mod 100 < %d meta priority set 1:20'",
           ns, d, percent);
    }
}

/* Cut the servers listening on PORTS (N of them) off: from the other
 * servers and the sentinels (FROM_LOCAL: traffic on the loopback), or
 * from every worker (the veth pairs cw*), or from worker SPAWN alone. */
static void cut_ports(struct run *r, const int *ports, int n, bool from_local, int spawn)
{
    (void)r;
    char iif[32], oif[32];
    if (from_local)
        snprintf(iif, sizeof iif, "iifname \"lo\"");
    else if (spawn < 0)
        snprintf(iif, sizeof iif, "iifname \"cw*\"");
    else
        snprintf(iif, sizeof iif, "iifname \"cw%d\"", spawn);
    snprintf(oif, sizeof oif, "o%s", iif + 1);
    for (int i = 0; i < n; i++) {
        /* both directions: stateless, so established connections go
         * silent too (on the loopback both pass the input hook) */
        sh("nft 'add rule inet chaos in %s tcp dport %d drop'", iif, ports[i]);
        sh("nft 'add rule inet chaos in %s tcp sport %d drop'", iif, ports[i]);
        if (!from_local)
            sh("nft 'add rule inet chaos out %s tcp sport %d drop'", oif, ports[i]);
    }
}

static void nft_flush(void)
{
    sh("nft flush chain inet chaos in && nft flush chain inet chaos out");
}

/* The leader of the run's etcd or ZooKeeper ensemble now (-1: none). */
static int ensemble_leader(struct run *r)
{
    return strcmp(r->kind, "etcd") == 0 ? etcdf_leader(&r->etcd) : zkf_leader(&r->zk);
}

/* A->member = MEMBER, the server a fault is aimed at; false when there is
 * none (-1), and then the fault is not counted. */
static bool fault_member(struct run *r, struct active *a, int member)
{
    a->member = member;
    if (member < 0)
        r->res->phase[r->phase].faults--;
    return member >= 0;
}

/* Start one event of the phase's fault; A records what to undo. */
static void fault_start(struct run *r, struct active *a, enum chaos_fault f)
{
    int64_t now = chaos_now_ms();
    memset(a, 0, sizeof *a);
    a->kind = f;
    int k;
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
    case FAULT_VALUE_LOCK: {
        /* as any process of the user may (the same uid, a group member in
         * a 2770 directory, a frozen reader): the byte that every write of
         * the value (a campaign's, a proclaim) and, in write mode, every
         * read waits for -- in the kernel, before issue 22's item 3 */
        int name = (int)between(r, 0, (r->cfg->names ? r->cfg->names : 3) - 1);
        char *path = tu_fmt("%s/locks/chaos-%d.leader", r->dir, name);
        bool write = rnd(r) % 2;
        a->value_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        struct flock fl = {.l_type = write ? F_WRLCK : F_RDLCK, .l_whence = SEEK_SET, .l_len = 1};
        if (a->value_fd >= 0 && fcntl(a->value_fd, F_OFD_SETLK, &fl) == 0) {
            a->until = now + between(r, 4 * r->lease, 5 * r->lease);
            say(r, "%s lock on %s for %lld ms", write ? "write" : "read", path,
                (long long)(a->until - now));
        } else {
            if (a->value_fd >= 0)
                close(a->value_fd);
            r->res->phase[r->phase].faults--;
        }
        free(path);
        break;
    }
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
        a->nservers = server_pids(r, a->servers);
        say(r, "SIGSTOP %d server(s) for %lld ms", a->nservers, (long long)(a->until - now));
        for (int i = 0; i < a->nservers; i++)
            kill(-a->servers[i], SIGSTOP);
        if (strcmp(r->kind, "postgres") == 0)
            pgf_pause(&r->pg, true);
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
        if (!fault_member(r, a, ensemble_leader(r)))
            break;
        a->until = now + between(r, r->lease, 3 * r->lease);
        say(r, "kill -9 leader %d for %lld ms", a->member, (long long)(a->until - now));
        member_kill(r, a->member);
        break;
    case FAULT_LEADER_PARTITION:
        if (!fault_member(r, a, ensemble_leader(r)))
            break;
        /* past ZooKeeper's syncLimit (20 ticks of 250 ms), so that its
         * followers too give the leader up, not only the leader them */
        a->until = now + between(r, 3 * r->lease, 8 * r->lease);
        say(r, "leader %d cut off (cm%d down) for %lld ms", a->member, a->member, (long long)(a->until - now));
        sh("ip link set cm%d down", a->member);
        break;
    case FAULT_MASTER_KILL:
        if (!fault_member(r, a, sentinel_master(r)))
            break;
        a->until = now + between(r, 3 * r->lease / 2, 4 * r->lease);
        say(r, "kill -9 master %d for %lld ms", a->member, (long long)(a->until - now));
        fx_redis_kill(&r->redis[a->member]);
        break;
    case FAULT_FAILOVER: {
        redisReply *rep =
            fx_redis_raw_at(r->sentinel_port[between(r, 0, 2)], NULL, "SENTINEL FAILOVER dlockm");
        say(r, "SENTINEL FAILOVER: %s", rep && rep->type == REDIS_REPLY_ERROR ? rep->str : "started");
        if (!rep || rep->type == REDIS_REPLY_ERROR)
            r->res->phase[r->phase].faults--;
        if (rep)
            freeReplyObject(rep);
        /* the next one after this one is over (a few seconds) */
        a->until = now + between(r, 2 * r->lease, 4 * r->lease);
        break;
    }
    case FAULT_MASTER_PARTITION:
        if (!fault_member(r, a, sentinel_master(r)))
            break;
        a->until = now + between(r, 3 * r->lease / 2, 4 * r->lease);
        say(r, "master %d cut off from replicas and sentinels for %lld ms", a->member,
            (long long)(a->until - now));
        cut_ports(r, &r->redis[a->member].port, 1, true, -1);
        a->nft = true;
        break;
    case FAULT_NODE_PARTITION:
        a->until = now + between(r, r->lease / 2, 3 * r->lease);
        a->nft = true;
        if (rnd(r) % 2 && (k = pick_worker(r)) >= 0) {
            int m = (int)between(r, 0, r->members - 1), ports[2], np = 0;
            for (int i = 0; i < r->members; i++)
                if (i != m)
                    ports[np++] = r->redis[i].port;
            say(r, "worker %d sees master %d only, for %lld ms", r->w[k].spawn, m,
                (long long)(a->until - now));
            cut_ports(r, ports, np, false, r->w[k].spawn);
        } else {
            int m = (int)between(r, 0, r->members - 1);
            say(r, "master %d cut off from every worker for %lld ms", m, (long long)(a->until - now));
            cut_ports(r, &r->redis[m].port, 1, false, -1);
        }
        break;
    case FAULT_CLOCK_STEP:
        /* forward 2-10 leases (a Redis key's expiry comes early), or back
         * as much or (one time in three) an hour; stepped back to the
         * real time when the event ends, 1-3 leases later */
        a->until = now + between(r, r->lease, 3 * r->lease);
        a->step_s = between(r, 2, 10) * r->lease / 1000 + 1;
        if (rnd(r) % 2)
            a->step_s = rnd(r) % 3 ? -a->step_s : -3600;
        if (strcmp(r->kind, "redis") == 0 && rnd(r) % 2) {
            int m = r->sentinel ? sentinel_master(r) : (int)between(r, 0, r->members - 1);
            a->clocks[a->nclocks++] = clock_file(r, 's', m < 0 ? 0 : m);
            say(r, "wall clock of server %d stepped %+ld s for %lld ms", m, a->step_s, (long long)(a->until - now));
        } else {
            bool all = rnd(r) % 3 == 0;
            int one = pick_worker(r);
            for (k = 0; k < r->nworkers; k++)
                if (r->w[k].pid > 0 && (all || k == one))
                    a->clocks[a->nclocks++] = clock_file(r, 'w', r->w[k].spawn);
            say(r, "wall clock of %s stepped %+ld s for %lld ms", all ? "every worker" : "one worker", a->step_s,
                (long long)(a->until - now));
        }
        for (int i = 0; i < a->nclocks; i++)
            clock_set(a->clocks[i], a->step_s);
        break;
    case FAULT_CLOCK_BACK_EMPTY: {
        /* what Redis's tokens rest on when the counter is lost: the
         * server's clock, here an hour slow when it restarts empty */
        int m = r->sentinel ? sentinel_master(r) : (int)between(r, 0, r->members - 1);
        m = m < 0 ? 0 : m;
        a->until = now + between(r, r->lease, 3 * r->lease);
        a->clocks[a->nclocks++] = clock_file(r, 's', m);
        say(r, "server %d: clock stepped -3600 s, kill -9, restarted without data, for %lld ms", m,
            (long long)(a->until - now));
        clock_set(a->clocks[0], -3600);
        struct fx_redis *x = &r->redis[m];
        fx_redis_kill(x);
        sh("rm -rf '%s/appendonlydir' '%s/appendonly.aof' '%s/dump.rdb'", x->dir, x->dir, x->dir);
        if (!redis_spawn(r, m, NULL, true))
            say(r, "server %d did not come back", m);
        break;
    }
    case FAULT_DELAY: {
        /* one worker, or (one time in three) all: new connections
         * redirected to the relay, the old ones broken so that the client
         * reconnects through it */
        int delay = (int)between(r, r->lease / 20, 2 * r->lease / 5);
        a->until = now + between(r, r->lease, 3 * r->lease);
        a->nft = true;
        bool all = rnd(r) % 3 == 0;
        int one = pick_worker(r);
        for (k = 0; k < r->nworkers; k++) {
            if (r->w[k].pid <= 0 || !(all || k == one))
                continue;
            int x, y;
            subnet(r->w[k].spawn, &x, &y);
            a->workers[k] = true;
            a->spawn[k] = r->w[k].spawn;
            r->sh->delay_ms[y] = delay;
            say(r, "worker %d through the relay, %d ms each way, for %lld ms", r->w[k].spawn, delay,
                (long long)(a->until - now));
            sh("nft 'add rule ip chaosnat pre iifname \"cw%d\" tcp dport != %d redirect to :%d'", r->w[k].spawn,
               r->relay_port, r->relay_port);
            sh("nsenter -t %d -n ss -K dst 10.0.0.0/8", (int)r->w[k].pid);
        }
        break;
    }
    case FAULT_PARTITION:
    case FAULT_PACKET:
    case FAULT_LOSS:
    case FAULT_REORDER: {
        int percent = f == FAULT_LOSS ? (int)between(r, 5, 30) : (int)between(r, 20, 50);
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
            say(r, "%s worker %d for %lld ms (%d %%)",
                f == FAULT_PARTITION ? "link down to"
                : f == FAULT_PACKET  ? "tbf on"
                : f == FAULT_LOSS    ? "loss on"
                                     : "reorder on",
                r->w[k].spawn, (long long)(a->until - now), f == FAULT_LOSS || f == FAULT_REORDER ? percent : 100);
            if (f == FAULT_PARTITION)
                sh("ip link set cw%d down", r->w[k].spawn);
            else if (f == FAULT_PACKET)
                tbf(r, k, true);
            else if (f == FAULT_LOSS)
                loss_on(r, k, percent);
            else
                reorder(r, k, percent, true);
        }
        a->nft = f == FAULT_LOSS || f == FAULT_REORDER;
        break;
    }
    }
}

static void fault_end(struct run *r, struct active *a)
{
    if (!a->until)
        return;
    /* a Sentinel topology needs seconds to heal (the old master turned
     * into a replica of the new one, chains of replicas fixed, resynced:
     * about 15 s here): the next event on the servers, in this phase or
     * the next, once it has, else kills and failovers pile up on a
     * topology that never recovers between them (faults of the workers
     * and their links go on meanwhile) */
    r->healing = r->healing || (r->sentinel && (a->kind == FAULT_SERVER_STOP || a->kind == FAULT_MASTER_KILL ||
                                                a->kind == FAULT_FAILOVER || a->kind == FAULT_MASTER_PARTITION));
    switch (a->kind) {
    case FAULT_VALUE_LOCK:
        close(a->value_fd); /* gives the byte back */
        break;
    case FAULT_WORKER_STOP:
        for (int k = 0; k < r->nworkers; k++)
            if (a->workers[k] && r->w[k].pid == a->pid[k]) {
                kill(a->pid[k], SIGCONT);
                r->w[k].stopped = false;
                r->w[k].cont_at = chaos_now_ms();
            }
        break;
    case FAULT_SERVER_STOP:
        for (int i = 0; i < a->nservers; i++)
            kill(-a->servers[i], SIGCONT);
        if (strcmp(r->kind, "postgres") == 0)
            pgf_pause(&r->pg, false);
        for (int k = 0; k < r->nworkers; k++)
            r->w[k].cont_at = chaos_now_ms();
        break;
    case FAULT_LEADER_KILL:
        if (!member_start(r, a->member))
            say(r, "member %d did not come back", a->member);
        break;
    case FAULT_LEADER_PARTITION:
        sh("ip link set cm%d up", a->member);
        break;
    case FAULT_DELAY:
        /* the connections already relayed stay so, undelayed */
        for (int k = 0; k < r->nworkers; k++) {
            int x, y;
            subnet(a->spawn[k], &x, &y);
            if (a->workers[k])
                r->sh->delay_ms[y] = 0;
        }
        sh("nft flush chain ip chaosnat pre");
        break;
    case FAULT_CLOCK_STEP:
    case FAULT_CLOCK_BACK_EMPTY:
        for (int i = 0; i < a->nclocks; i++) {
            clock_set(a->clocks[i], 0);
            free(a->clocks[i]);
        }
        a->nclocks = 0;
        break;
    case FAULT_MASTER_KILL:
        if (!redis_spawn(r, a->member, NULL, true))
            say(r, "master %d did not come back", a->member);
        break;
    case FAULT_PARTITION:
    case FAULT_PACKET:
    case FAULT_LOSS:
    case FAULT_REORDER:
        for (int k = 0; k < r->nworkers; k++) {
            if (!a->workers[k] || r->w[k].spawn != a->spawn[k] || r->w[k].pid != a->pid[k])
                continue; /* that worker died meanwhile: its namespace went with it */
            if (a->kind == FAULT_PARTITION)
                sh("ip link set cw%d up", a->spawn[k]);
            else if (a->kind == FAULT_PACKET)
                tbf(r, k, false);
            else if (a->kind == FAULT_REORDER)
                reorder(r, k, 0, false);
            r->w[k].cont_at = chaos_now_ms();
        }
        break;
    default:
        break;
    }
    if (a->nft)
        nft_flush();
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
    if (r->elect) /* elections: what only they have, beside a holder's death */
        list[n++] = FAULT_VALUE_LOCK;
    else
        list[n++] = FAULT_WORKER_STOP;
    if (r->net) {
        list[n++] = FAULT_SERVER_STOP;
        if (r->sentinel) {
            list[n++] = FAULT_MASTER_KILL;
            list[n++] = FAULT_FAILOVER;
            list[n++] = FAULT_MASTER_PARTITION;
        } else {
            list[n++] = FAULT_SERVER_RESTART;
        }
        if (strcmp(r->kind, "redis") == 0 && !r->sentinel)
            list[n++] = FAULT_SERVER_RESTART_EMPTY;
        if (r->members > 1 && strcmp(r->kind, "redis") != 0)
            list[n++] = FAULT_LEADER_KILL;
        if (r->redlock)
            list[n++] = FAULT_NODE_PARTITION;
        list[n++] = FAULT_PARTITION;
        list[n++] = FAULT_PACKET;
        list[n++] = FAULT_LOSS;
        list[n++] = FAULT_REORDER;
        list[n++] = FAULT_DELAY;
    }
    if (r->clockshift && !r->elect)
        list[n++] = FAULT_CLOCK_STEP;
    /* by hand only (it breaks what the CI run asserts on Redis alone) */
    if (r->clockshift && strcmp(r->kind, "redis") == 0 && r->cfg->only && strstr(r->cfg->only, "clock-back-empty"))
        list[n++] = FAULT_CLOCK_BACK_EMPTY;
    /* by hand only: the members apart change the paths of every other
     * fault's packets (forwarded, not delivered: the loss and reorder
     * rules of the input and output chains miss them), and the phase is
     * slow (elections, 3-8 s partitions) */
    if (r->net && r->members > 1 && strcmp(r->kind, "redis") != 0 && r->cfg->only &&
        strstr(r->cfg->only, "leader-partition"))
        list[n++] = FAULT_LEADER_PARTITION;
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
    bool restart_fault = f == FAULT_SERVER_RESTART || f == FAULT_SERVER_RESTART_EMPTY || f == FAULT_CLOCK_BACK_EMPTY;
    int restarts = 0;
    for (int64_t now = start; now < end; now = chaos_now_ms()) {
        reap_workers(r, true);
        check_hangs(r);
        if (a.until && now >= a.until) {
            fault_end(r, &a);
            next = now + between(r, r->lease / 5, r->lease);
        }
        bool topology = f == FAULT_SERVER_STOP || f == FAULT_MASTER_KILL || f == FAULT_FAILOVER ||
                        f == FAULT_MASTER_PARTITION || f == FAULT_SERVER_RESTART;
        if (r->healing && topology && now >= next) {
            if (sentinel_healed(r))
                r->healing = false;
            else
                next = now + 250;
        }
        /* restarts are slow (a JVM, a WAL): two per phase, or one per
         * ten leases of a long phase */
        if (f != FAULT_NONE && !a.until && now >= next && now < fault_until && !(r->healing && topology) &&
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
    if (strcmp(b, "file") == 0 || strcmp(b, "file-election") == 0) {
        r->kind = "file";
        r->elect = b[4] != 0;
    } else if (strcmp(b, "redlock") == 0) {
        r->kind = "redis";
        r->redlock = true;
        r->members = 3;
    } else if (strcmp(b, "sentinel") == 0 || strcmp(b, "sentinel-sync") == 0 ||
               strcmp(b, "sentinel-sync2") == 0) {
        /* sync=1: one replica of the two acknowledges every write;
         * sync=2: both do, so whichever is promoted has it */
        r->kind = "redis";
        r->sentinel = true;
        r->members = 3;
        r->query = !b[8] ? "" : b[13] ? "sync=2" : "sync=1";
    } else if (strcmp(b, "redis") == 0 || strcmp(b, "redis-simple") == 0 || strcmp(b, "redis-fair") == 0) {
        r->kind = "redis";
        r->query = strcmp(b, "redis") == 0 ? "layout=redisson" : b[6] == 's' ? "layout=simple" : "layout=fair";
    } else if (strcmp(b, "redis-sem") == 0) {
        /* Redisson's RPermitExpirableSemaphore of one permit a name,
         * through lock handles (dlock_lock_new_permits): its token
         * counter is dlock_sem_token:{N}, reseeded as the lock's */
        r->kind = "redis";
        r->query = "layout=redisson";
        r->permits = 1;
    } else if (strncmp(b, "etcd", 4) == 0) {
        r->kind = "etcd";
        r->members = b[4] == '3' ? 3 : 1;
    } else if (strncmp(b, "zk", 2) == 0) {
        r->kind = "zk";
        r->members = b[2] == '3' ? 3 : 1;
    } else if (strcmp(b, "postgres") == 0 || strcmp(b, "mysql") == 0) {
        r->kind = b; /* one server: its restarts are kill -9, its data kept */
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
    /* Redis alone promises no exclusion a crash or a pause cannot break,
     * but its tokens never go back (seeded from the server's clock when
     * the counter is gone); Sentinel without sync loses what the master
     * had not replicated at a failover, tokens included, and with sync=1
     * of two replicas the promoted replica may be the one that did not
     * acknowledge: the lock granted again with a lower token while its
     * holder still works, an overlap the fenced store accepts (seed 13
     * of the CI run once had one). Only sync=<every replica> promises
     * both. */
    bool sentinel = strncmp(cfg->backend, "sentinel", 8) == 0;
    bool every_replica = strcmp(cfg->backend, "sentinel-sync2") == 0;
    res->safe_claimed = strncmp(cfg->backend, "redis", 5) != 0 && (!sentinel || every_replica);
    res->tokens_claimed = !sentinel || every_replica;
    /* a permit's token is a new INCR at every acquire: never one seen
     * before, not even by its own worker (a lock's leftover can be) */
    res->repeats_claimed = strcmp(cfg->backend, "redis-sem") == 0;
    if (res->safe_claimed)
        res->promise = "no overlap the fenced store accepts, no token regression";
    else if (res->repeats_claimed)
        res->promise = "tokens never go back nor repeat; exclusion not under these faults";
    else if (res->tokens_claimed)
        res->promise = "tokens never go back; exclusion not under these faults";
    else if (strcmp(cfg->backend, "sentinel") == 0)
        res->promise = "no sync: a failover loses holds and tokens (measured, not asserted)";
    else
        res->promise = "sync=1 of 2 replicas: a failover to the replica that did not acknowledge "
                       "loses holds and tokens (measured, not asserted)";
    r->clockshift = clockshift_lib();
    phases_of(r, cfg->backend);
    if (res->nphases == 0) {
        snprintf(res->error, sizeof res->error, "no phase of %s is among '%s'", cfg->backend, cfg->only);
        return false;
    }
    char query[160];
    int ql = snprintf(query, sizeof query, "%s%slease=%d&timeout=%d&connect_timeout=%d", r->query,
                      *r->query ? "&" : "", r->lease, r->lease, r->lease);
    if (cfg->lock_delay_ms > 0 && ql > 0 && (size_t)ql < sizeof query)
        snprintf(query + ql, sizeof query - (size_t)ql, "&lock_delay=%d", cfg->lock_delay_ms);
    r->query = query;

    if (r->net) {
        if (unshare(CLONE_NEWNET) != 0 ||
            sh("ip link set lo up && ip addr add %s/32 dev lo && " NFT_SETUP, SERVERS_ADDR) != 0) {
            snprintf(res->error, sizeof res->error,
                     "no network namespace (unshare: %s) or no nftables (nft): the harness needs root",
                     strerror(errno));
            return false;
        }
        setenv("DLOCK_TEST_LISTEN", "0.0.0.0", 1);
    }
    r->dir = tu_tmpdir("chaos");
    r->store_path = tu_fmt("%s/store.sock", r->dir);
    r->dump_path = tu_fmt("%s/store.dump", r->dir);
    bool ok = servers_start(r);
    for (int i = 0; ok && i < res->nphases; i++)
        if (res->fault[i] == FAULT_LEADER_PARTITION && !members_apart(r)) {
            snprintf(res->error, sizeof res->error, "%s: the members could not be moved apart", cfg->backend);
            ok = false;
            break;
        }
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
    r->shm_fd = memfd_create("chaos-shared", 0);
    if (r->shm_fd < 0 || ftruncate(r->shm_fd, sizeof *r->sh) != 0)
        abort();
    r->sh = mmap(NULL, sizeof *r->sh, PROT_READ | PROT_WRITE, MAP_SHARED, r->shm_fd, 0);
    if (r->sh == MAP_FAILED)
        abort();
    if (r->net && !relay_start(r)) {
        snprintf(res->error, sizeof res->error, "the relay did not start");
        ok = false;
        goto out;
    }
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
    /* a relay that died took packet-delay's workers off the servers: the
     * run measured the wrong fault (it lives until killed below) */
    if (ok && r->relay_pid > 0 && waitpid(r->relay_pid, NULL, WNOHANG) != 0) {
        r->relay_pid = 0;
        ok = false;
        snprintf(res->error, sizeof res->error, "the delaying relay (relay.c) ended during the run");
    }
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
    if (r->relay_pid > 0) {
        kill(r->relay_pid, SIGKILL);
        waitpid(r->relay_pid, NULL, 0);
    }
    if (r->store_fd > 0)
        close(r->store_fd);
    servers_stop(r);
    for (int i = 0; i < ZKF_MAX + ETCDF_MAX; i++)
        if (r->member_ns[i] > 0)
            close(r->member_ns[i]);
    if (r->servers_ns > 0)
        close(r->servers_ns);
    if (r->sh && r->sh != MAP_FAILED)
        munmap(r->sh, sizeof *r->sh);
    if (r->shm_fd > 0)
        close(r->shm_fd);
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
    else if (res->tokens_claimed && t->token_regressions)
        snprintf(why, len, "%ld token regression(s)", t->token_regressions);
    else if (res->repeats_claimed && t->token_repeats)
        snprintf(why, len, "%ld repeated token(s)", t->token_repeats);
    else if (res->tokens_claimed && t->lost_updates)
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
    if (res->promise)
        fprintf(out, "promises: %s\n", res->promise);
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
