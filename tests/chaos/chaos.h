/* chaos.h -- the fault harness of issue 13: it measures what each backend
 * keeps and loses when processes, servers and the network fail, with a
 * checker that does not trust dlock.
 *
 * One run = one backend (one URL form), a seed and a duration. The
 * orchestrator (chaos_run) moves into a network namespace of its own,
 * starts the backend's real servers there through the test fixtures
 * (tests/lib/fixture_*.c, listening on every address of that namespace
 * only), forks a fenced store (store.c) and worker processes (worker.c),
 * each worker in a namespace of its own joined to the servers by a veth
 * pair. Workers loop acquire -> fenced read-modify-write -> release
 * through libdlock and tell the store what they do; the store keeps the
 * truth. The run goes through phases, one kind of fault each, on a
 * schedule drawn from the seed; the store's records give per phase the
 * counts of struct chaos_counts. Everything dies with the orchestrator
 * (PR_SET_PDEATHSIG, anonymous namespaces), even when it crashes.
 */
#ifndef DLOCK_CHAOS_H
#define DLOCK_CHAOS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* The kinds of fault, one per phase. */
enum chaos_fault {
    FAULT_NONE,          /* baseline: contention only */
    FAULT_WORKER_KILL,   /* kill -9 of a worker (then a new one starts) */
    FAULT_WORKER_STOP,   /* SIGSTOP of a worker for 0.5-3 leases, SIGCONT */
    FAULT_SERVER_STOP,   /* SIGSTOP of a server (every member) 0.5-2.5 leases */
    FAULT_SERVER_RESTART,       /* kill -9, start again on its data (persistent) */
    FAULT_SERVER_RESTART_EMPTY, /* kill -9, start again with no data (redis) */
    FAULT_LEADER_KILL,   /* kill -9 of the leader of an ensemble, back later */
    FAULT_PARTITION,     /* veth link down between some workers and the servers */
    FAULT_PACKET,        /* a slow lossy link (tbf: 16 kbit/s, 40 ms queue) */
    FAULT_MASTER_KILL,   /* Sentinel: kill -9 of the master, back after 1.5-4 leases */
    FAULT_FAILOVER,      /* Sentinel: SENTINEL FAILOVER */
    FAULT_MASTER_PARTITION, /* Sentinel: the master cut off from replicas and
                               sentinels (the workers still reach it) */
    FAULT_NODE_PARTITION, /* Redlock: one master cut off from every worker, or
                             one worker from two masters (it sees a minority) */
    FAULT_LOSS,          /* 5-30 % of the packets of a link dropped (nftables) */
    FAULT_REORDER,       /* 20-50 % of a link's packets held back in a slow queue */
    FAULT_DELAY,         /* a worker's connections through a relay adding 50-400 ms each way */
    FAULT_CLOCK_STEP,    /* wall clock of workers or a Redis server stepped (clockshift.c) */
    FAULT_CLOCK_BACK_EMPTY, /* Redis: a server's clock an hour back, then restarted
                               without its data (by hand only: -f clock-back-empty) */
    FAULT_LEADER_PARTITION, /* etcd3, zk3: the leader's own namespace cut off from the other
                               members and the workers, 3-8 leases (by hand only:
                               -f leader-partition) */
    FAULT_VALUE_LOCK,    /* file-election: another process holds the lock byte of an
                            election's value file (NAME.leader) for 4-5 leases */
    FAULT_COUNT
};
const char *chaos_fault_name(enum chaos_fault f);

/* What one phase counts; the meaning of each is written in
 * docs/safety.md ("What the numbers mean"). */
struct chaos_counts {
    long acquisitions;     /* acquires that returned DLOCK_OK */
    long writes;           /* fenced writes the store accepted */
    long overlaps;         /* sections inside which another holder's began, same name */
    long overlaps_accepted; /* ... where the store took an op of the older after the newer began */
    long stale_rejected;   /* ops and begins the store refused: token below its fence */
    long token_regressions; /* an acquisition whose token is not above every earlier one */
    long token_repeats;    /* ... the same worker given its own last token again */
    long lost_updates;     /* an accepted write not based on the current value */
    long lost_before;      /* holds reported lost before another owner got in */
    long lost_after;       /* ... after another owner had got in */
    long lost_at_release;  /* reported only by dlock_release() (DLOCK_ELOST) */
    long stopped_on_lost;  /* sections cut short because the hold was lost/invalid */
    long errors;           /* calls that failed with a backend failure */
    long contention;       /* acquires that ended in EBUSY or ETIMEDOUT */
    long faults;           /* fault events injected */
    int64_t max_gap_ms;    /* longest time without an accepted write */
    long hangs;            /* dlock calls that did not return in time */
};

struct chaos_config {
    const char *backend;   /* file, file-election, redis, redis-simple, redis-fair, redis-sem,
                              sentinel, sentinel-sync, redlock, etcd, etcd3, zk, zk3 */
    uint64_t seed;
    int duration_s;        /* whole run, split among the phases */
    int lease_ms;          /* 0: 1000 */
    int lock_delay_ms;     /* 0: off; else every worker's ?lock_delay= */
    int workers;           /* processes; 0: 3 */
    int names;             /* 0: 3 */
    const char *only;      /* NULL, or the faults to run: "worker-stop,partition" */
    bool verbose;          /* every fault event on stderr */
    FILE *log;             /* progress lines (NULL: none) */
};

struct chaos_result {
    char backend[32];
    uint64_t seed;
    int nphases;
    enum chaos_fault fault[FAULT_COUNT];
    struct chaos_counts phase[FAULT_COUNT];
    struct chaos_counts total;
    bool safe_claimed;     /* the backend promises exclusion the fence need not rescue */
    bool tokens_claimed;   /* ... and tokens that never go back (not Sentinel without
                              sync=<every replica>) */
    bool repeats_claimed;  /* ... and none given again, even to its last owner (semaphores) */
    const char *promise;   /* what the URL form promises under these faults, in words */
    char error[512];       /* set when the run itself could not be made */
};

/* Run one backend under its phases. Returns false when the run could not
 * be made (servers did not start, no namespaces): res->error says why. */
bool chaos_run(const struct chaos_config *cfg, struct chaos_result *res);

/* The safety verdict CI asserts: no hang; no token regression (nor a
 * repeat, where claimed) and no lost update where tokens are claimed; no
 * overlap the store accepted where exclusion is (res->promise says
 * which). Writes why not into WHY. */
bool chaos_safe(const struct chaos_result *res, char *why, size_t len);

/* The table (text) and one JSON object, to OUT. */
void chaos_print_table(FILE *out, const struct chaos_result *res);
void chaos_print_json(FILE *out, const struct chaos_result *res);

/* ------------------------------------------------------ internal parts */

/* monotonic milliseconds, shared by every process of the machine */
int64_t chaos_now_ms(void);
/* The seeded generator: the next number of *STATE, and one in [LO, HI]. */
uint64_t chaos_rand(uint64_t *state);
int64_t chaos_between(uint64_t *state, int64_t lo, int64_t hi);

/* The store (store.c): a process serving a unix socket at PATH until it
 * is told DUMP, then it writes its records to DUMP_PATH and exits. */
void chaos_store_main(const char *path, const char *dump_path, int names);
/* Read the records the store dumped and count them per phase.
 * PHASE_START[k] is when phase k began (store clock), N phases. */
bool chaos_store_analyse(const char *dump_path, int nphases, struct chaos_result *res);

/* One line to the store on connection FD, its one-line answer into REPLY. */
bool chaos_store_call(int fd, char *reply, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int chaos_store_connect(const char *path);

/* What the workers and the orchestrator share: a memfd mapped by both
 * (a worker is exec'd again, so that clockshift.so can be preloaded into
 * it, and finds the mapping through the descriptor it inherits). */
#define CHAOS_MAX_WORKERS 8
#define CHAOS_MAX_THREADS 4
#define CHAOS_MAX_SPAWNS 256 /* worker spawn y (of 10.X.y.2) indexes DELAY_MS */
struct chaos_shared {
    volatile int stop;
    volatile int64_t call_since[CHAOS_MAX_WORKERS][CHAOS_MAX_THREADS];
    volatile int delay_ms[CHAOS_MAX_SPAWNS]; /* packet-delay: the relay's one-way delay */
};

/* The relay (relay.c): a process serving the listening socket LFD,
 * passing each redirected connection on to its server, delayed by
 * SH->delay_ms of the worker it comes from. Never returns. */
void chaos_relay_main(int lfd, const struct chaos_shared *sh) __attribute__((noreturn));

/* A worker (worker.c): THREADS threads on one client of URL, looping
 * until *STOP. CALL_SINCE[t] is when thread t entered a dlock call (0:
 * not in one), for the orchestrator's hang check. */
struct chaos_worker {
    int wid;
    const char *url;
    const char *store_path;
    int threads;
    int names;
    int lease_ms;
    bool careless;       /* never checks its hold before writing */
    unsigned permits;    /* 0: lock handles; N: semaphores of N permits (dlock_lock_new_permits) */
    bool elect;          /* campaigns for elections (dlock_lock_new_campaign) instead of
                            taking locks, reads the leader after each try, and reports
                            a call that overran its own bound (HUNG) */
    uint64_t seed;
    volatile int *stop;
    volatile int64_t *call_since; /* [threads] */
};
void chaos_worker_main(const struct chaos_worker *w);
/* Run W in a fresh image of this program (/proc/self/exe): W's fields go
 * through the environment with ENV (NULL-terminated "K=V", e.g.
 * LD_PRELOAD of clockshift.so), SHM_FD is the memfd of struct chaos_shared
 * and SLOT the worker's row in it. A constructor of worker.c picks the
 * worker up before main() runs. Returns only if the exec failed. */
void chaos_worker_exec(const struct chaos_worker *w, int shm_fd, int slot, char *const *env);

#endif
