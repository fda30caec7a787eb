/* worker.c -- a worker process of the fault harness: THREADS threads on
 * one dlock client, each looping acquire -> fenced read-modify-write ->
 * release on names drawn from a small set (locks, or semaphores of PERMITS
 * through lock handles), and telling the store (store.c) every step, so
 * the store, not dlock, decides what happened.
 *
 * A worker behaves as a careful user would: before each store operation
 * it checks that its hold is neither reported lost (the lost callback)
 * nor past dlock_validity_ms(), and stops the section when it is (CUT).
 * What it cannot see -- a pause between that check and the operation, a
 * partition, a server that forgot the lock -- is what the store's fence
 * and its records are for. A careless worker skips the check (as code
 * that never looks at its lease does): what it writes late only the
 * fence refuses. Waits are random (try once, or bounded), holds
 * mostly short and sometimes longer than the lease (the keeper renews
 * them). Each thread marks when it entered a dlock call so that the
 * orchestrator can see a call that never returns.
 *
 * An election worker (file-election) campaigns instead: its handles come
 * from dlock_lock_new_campaign(), so a section is a term as leader (the
 * token fences it as a lock's does), and after each try it reads the
 * leader once. It also times its own calls: one that returns later than
 * its bound (the wait; a one-shot read: the op timeout, one lease) plus
 * a lease and OVERRUN_SLACK_MS is reported to the store as HUNG.
 */
#include <pthread.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chaos.h"
#include "dlock.h"
#include "testutil.h"

#define MAX_NAMES 16
#define OVERRUN_SLACK_MS 1500

struct thr {
    const struct chaos_worker *w;
    dlock_client *c;
    int t;
    int fd; /* this thread's store connection */
    uint64_t rng;
    dlock_lock *h[MAX_NAMES];
    /* read by the lost callback, on the keeper's thread: atomic */
    _Atomic(dlock_lock *) holding; /* the handle of the open section, or NULL */
    atomic_long sid;               /* the open section's id at the store */
    atomic_int lost;               /* the lost callback fired for it */
};

static pthread_mutex_t cb_mu = PTHREAD_MUTEX_INITIALIZER;
static int cb_fd = -1; /* the callback thread's store connection */

static bool call(struct thr *x, char *reply, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool call(struct thr *x, char *reply, size_t len, const char *fmt, ...)
{
    char line[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (!chaos_store_call(x->fd, reply, len, "%s", line)) {
        /* the store is gone: the run is over */
        _exit(3);
    }
    return strncmp(reply, "OK", 2) == 0;
}

static void on_lost(dlock_lock *l, const char *why, void *arg)
{
    (void)why;
    struct thr *x = arg;
    if (x->holding != l)
        return;
    x->lost = 1;
    char reply[64];
    pthread_mutex_lock(&cb_mu);
    if (cb_fd >= 0)
        chaos_store_call(cb_fd, reply, sizeof reply, "LOST %ld", (long)x->sid);
    pthread_mutex_unlock(&cb_mu);
}

/* In a dlock call since when (0: not), for the hang check. */
static void in_call(struct thr *x, bool on)
{
    x->w->call_since[x->t] = on ? chaos_now_ms() : 0;
}

static bool still_held(struct thr *x, dlock_lock *l)
{
    if (x->w->careless)
        return true; /* writes on regardless: only the fence stops it */
    if (x->lost)
        return false;
    in_call(x, true);
    int64_t v = dlock_validity_ms(l);
    in_call(x, false);
    return v > 0;
}

static void section(struct thr *x, dlock_lock *l, int name, int64_t asked)
{
    const struct chaos_worker *w = x->w;
    char reply[64];
    uint64_t token = 0;
    dlock_token(l, &token);
    x->lost = 0;
    x->sid = -1;
    x->holding = l;
    if (!chaos_store_call(x->fd, reply, sizeof reply, "BEGIN %d %llu %lld", name,
                          (unsigned long long)token, (long long)asked))
        _exit(3);
    long sid = -1;
    sscanf(reply, "%*s %ld", &sid);
    x->sid = sid;
    if (strncmp(reply, "OK", 2) == 0) {
        /* mostly short, sometimes longer than the lease */
        int64_t hold = chaos_rand(&x->rng) % 100 < 6
                           ? chaos_between(&x->rng, w->lease_ms * 6 / 5, w->lease_ms * 2)
                           : chaos_between(&x->rng, 0, 20);
        int rounds = (int)chaos_between(&x->rng, 1, 3);
        for (int r = 0; r < rounds; r++) {
            if (!still_held(x, l)) {
                call(x, reply, sizeof reply, "CUT %ld", sid);
                break;
            }
            if (!call(x, reply, sizeof reply, "READ %ld", sid))
                break; /* fenced off: stop */
            long value = atol(reply + 3);
            tu_sleep_ms((int)hold / rounds);
            if (!still_held(x, l)) {
                call(x, reply, sizeof reply, "CUT %ld", sid);
                break;
            }
            if (!call(x, reply, sizeof reply, "WRITE %ld %ld", sid, value + 1))
                break;
        }
    }
    call(x, reply, sizeof reply, "END %ld", sid);
    in_call(x, true);
    int rc = dlock_release(l);
    in_call(x, false);
    x->holding = NULL;
    if (rc == DLOCK_ELOST)
        call(x, reply, sizeof reply, "LOSTREL %ld", sid);
    else if (rc != DLOCK_OK)
        call(x, reply, sizeof reply, "ERR %ld", (long)rc);
}

/* An election worker's check of a call that began at SINCE with a bound
 * of BOUND_MS: HUNG to the store when it returned too late. */
static void check_overrun(struct thr *x, int64_t since, int64_t bound_ms)
{
    char reply[64];
    if (x->w->elect && chaos_now_ms() - since > bound_ms + x->w->lease_ms + OVERRUN_SLACK_MS)
        call(x, reply, sizeof reply, "HUNG");
}

/* An election worker's one-shot read of election NAME's leader. */
static void read_leader(struct thr *x, int name)
{
    char label[32], reply[64];
    snprintf(label, sizeof label, "chaos-%d", name);
    dlock_leader *l = NULL;
    in_call(x, true);
    int64_t since = chaos_now_ms();
    int rc = dlock_election_leader(x->c, label, &l);
    in_call(x, false);
    check_overrun(x, since, x->w->lease_ms); /* the op timeout */
    if (rc != DLOCK_OK && rc != DLOCK_ETIMEDOUT && rc != DLOCK_EBUSY)
        call(x, reply, sizeof reply, "ERR %ld", (long)rc);
    dlock_leader_free(l);
}

static void *thread_main(void *arg)
{
    struct thr *x = arg;
    const struct chaos_worker *w = x->w;
    char reply[64];
    while (!*w->stop) {
        int name = (int)chaos_between(&x->rng, 0, w->names - 1);
        int64_t wait =
            chaos_rand(&x->rng) % 4 == 0 ? DLOCK_TRY : chaos_between(&x->rng, 100, 2 * w->lease_ms);
        in_call(x, true);
        int64_t asked = chaos_now_ms();
        int rc = dlock_acquire(x->h[name], wait);
        in_call(x, false);
        check_overrun(x, asked, wait);
        if (rc == DLOCK_OK) {
            section(x, x->h[name], name, asked);
        } else if (rc == DLOCK_EBUSY || rc == DLOCK_ETIMEDOUT) {
            call(x, reply, sizeof reply, "BUSY");
        } else {
            call(x, reply, sizeof reply, "ERR %ld", (long)rc);
            tu_sleep_ms((int)chaos_between(&x->rng, 10, 100)); /* a failure: do not spin on it */
        }
        if (w->elect)
            read_leader(x, name);
        tu_sleep_ms((int)chaos_between(&x->rng, 0, 15));
    }
    return NULL;
}

void chaos_worker_exec(const struct chaos_worker *w, int shm_fd, int slot, char *const *env)
{
    for (int i = 0; env && env[i]; i++)
        putenv(env[i]);
    char spec[256];
    snprintf(spec, sizeof spec, "%d %d %d %d %d %d %llu %d %d %u", w->wid, w->threads, w->names,
             w->lease_ms, (int)w->careless, (int)w->elect, (unsigned long long)w->seed, shm_fd,
             slot, w->permits);
    setenv("DLOCK_CHAOS_WORKER", spec, 1);
    setenv("DLOCK_CHAOS_URL", w->url, 1);
    setenv("DLOCK_CHAOS_STORE", w->store_path, 1);
    char *const argv[] = {"chaos-worker", NULL};
    execv("/proc/self/exe", argv);
}

/* A worker exec'd by chaos_worker_exec(): before main() (the test
 * framework's or the chaos tool's) ever runs, it becomes the worker. */
__attribute__((constructor)) static void worker_from_environment(void)
{
    const char *spec = getenv("DLOCK_CHAOS_WORKER"), *url = getenv("DLOCK_CHAOS_URL"),
               *store = getenv("DLOCK_CHAOS_STORE");
    if (!spec)
        return;
    struct chaos_worker w = {.url = url, .store_path = store};
    int careless = 0, elect = 0, fd = -1, slot = 0;
    unsigned long long seed = 0;
    if (!url || !store ||
        sscanf(spec, "%d %d %d %d %d %d %llu %d %d %u", &w.wid, &w.threads, &w.names, &w.lease_ms,
               &careless, &elect, &seed, &fd, &slot, &w.permits) != 10 ||
        slot < 0 || slot >= CHAOS_MAX_WORKERS || w.threads > CHAOS_MAX_THREADS)
        _exit(6);
    struct chaos_shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (sh == MAP_FAILED)
        _exit(6);
    close(fd);
    w.careless = careless != 0;
    w.elect = elect != 0;
    w.seed = seed;
    w.stop = &sh->stop;
    w.call_since = sh->call_since[slot];
    /* not ours to pass on: the servers it might start are not workers */
    unsetenv("DLOCK_CHAOS_WORKER");
    chaos_worker_main(&w);
    _exit(0);
}

void chaos_worker_main(const struct chaos_worker *w)
{
    uint64_t rng = w->seed ^ (0x51ed27u * (uint64_t)(w->wid + 1));
    dlock_client *c = NULL;
    cb_fd = chaos_store_connect(w->store_path);
    int fd0 = chaos_store_connect(w->store_path);
    if (cb_fd < 0 || fd0 < 0)
        _exit(3);
    char reply[64];
    /* the servers may be down or out of reach right now: keep trying */
    for (;;) {
        if (*w->stop)
            _exit(0);
        w->call_since[0] = chaos_now_ms();
        int rc = dlock_open(w->url, &c);
        w->call_since[0] = 0;
        if (rc == DLOCK_OK)
            break;
        if (!chaos_store_call(fd0, reply, sizeof reply, "ERR %d", rc))
            _exit(3);
        tu_sleep_ms((int)chaos_between(&rng, 50, 200));
    }
    struct thr *x = calloc((size_t)w->threads, sizeof *x);
    pthread_t *tid = calloc((size_t)w->threads, sizeof *tid);
    for (int t = 0; t < w->threads; t++) {
        x[t].w = w;
        x[t].c = c;
        x[t].t = t;
        x[t].fd = t == 0 ? fd0 : chaos_store_connect(w->store_path);
        x[t].rng = rng ^ (0x9e37u * (uint64_t)(t + 1));
        if (x[t].fd < 0 ||
            !chaos_store_call(x[t].fd, reply, sizeof reply, "HELLO %d.%d", w->wid, t))
            _exit(3);
        for (int k = 0; k < w->names && k < MAX_NAMES; k++) {
            char name[32];
            snprintf(name, sizeof name, "chaos-%d", k);
            char value[32];
            snprintf(value, sizeof value, "worker %d.%d", w->wid, t);
            int rc = w->permits ? dlock_lock_new_permits(c, name, w->permits, 0, &x[t].h[k])
                     : w->elect ? dlock_lock_new_campaign(c, name, value, 0, &x[t].h[k])
                                : dlock_lock_new(c, name, DLOCK_EXCLUSIVE, 0, &x[t].h[k]);
            if (rc != DLOCK_OK)
                _exit(4);
            dlock_lock_on_lost(x[t].h[k], on_lost, &x[t]);
        }
    }
    for (int t = 0; t < w->threads; t++)
        pthread_create(&tid[t], NULL, thread_main, &x[t]);
    for (int t = 0; t < w->threads; t++)
        pthread_join(tid[t], NULL);
    w->call_since[0] = chaos_now_ms();
    for (int t = 0; t < w->threads; t++)
        for (int k = 0; k < w->names && k < MAX_NAMES; k++)
            dlock_lock_free(x[t].h[k]);
    dlock_client_close(c);
    w->call_since[0] = 0;
    _exit(0);
}
