/* run.c -- `dlock run`: hold a lock while a command runs, like flock(1)
 * but across machines.
 *
 * Threads: the main thread acquires, starts COMMAND and waits for it; a
 * signal thread (every other thread has SIGINT, SIGTERM, SIGHUP, SIGQUIT
 * and SIGCHLD blocked) fires the wait's cancel object (dlock_cancel: no
 * race with the wait's start, nothing to repeat) while waiting, passes signals on
 * to the whole job while it runs; the library's keeper thread renews the
 * lease and calls on_lost(), which wakes the main thread through an
 * eventfd so that it can apply --on-lost. COMMAND runs under a guardian
 * process (job.c) that signals every process of the job on request,
 * kills them all if dlock dies, and reports on a pipe, which the main
 * thread polls beside the lost-lock eventfd, when the last has exited.
 *
 * COMMAND inherits what dlock inherited (stdin, stdout, stderr, and any
 * descriptor its caller passed on: a jobserver, `3>file`) and nothing
 * that dlock or the library opened: every other descriptor is closed in
 * the child before exec, a second line of defence behind close-on-exec
 * against handing COMMAND an authenticated backend connection.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "internal.h" /* the library's URL and duration parsers: its reading of lease= */

extern char **environ;

enum phase { WAITING, RUNNING, DONE };
/* The shortest lease, from --lease or the URL's lease= alike: a renewal
 * goes out at a third of the lease and must be answered, or retried and
 * answered, before it ends. */
#define MIN_LEASE_MS 1000
#define LEASE_TOO_SHORT                                                                            \
    "is too short: at least %d s, so that a renewal (at a third of the lease) has time for its " \
    "round trip and a retry"
enum on_lost { LOST_TERM, LOST_KILL, LOST_IGNORE };

struct run {
    pthread_mutex_t mu;
    enum phase phase;
    dlock_lock *lock;     /* the lock held, or NULL: */
    dlock_multi *multi;   /* the set held (run -m) */
    dlock_cancel *cancel; /* the acquire's, while WAITING */
    struct cli_job *job;  /* once COMMAND started */
    int signal;  /* received while waiting */
    int pending; /* received after acquiring, before COMMAND started */
    int lost_fd; /* eventfd: the lock was lost */
    int wake_fd; /* eventfd: a signal came while holding without COMMAND */
    int wait_fd; /* eventfd: a signal came while connecting or waiting for a path's flock */
    bool out_of_time; /* the cancel was fired at -w's deadline, not by a signal */
    bool trying;      /* -v's try-once before the wait is under way */
    const char *name;  /* the lock's, for messages */
    const char *label; /* what is held, quoted for messages: 'a' or 'a', 'b' */
    bool lost;
    bool lost_after_job; /* lost during --min-hold, once COMMAND had ended */
    bool passed_signal;  /* a signal was passed on to the job */
    bool left_held;      /* --no-wait-children: processes of the job keep the lock's descriptor */
    bool contended;      /* --on-contended term: told once; the job is sent SIGTERM */
    char lost_why[512];
    char lost_name[256]; /* the lock lost (run -m: which member), for messages */
};

static struct run R = {.mu = PTHREAD_MUTEX_INITIALIZER, .lost_fd = -1, .wake_fd = -1,
                       .wait_fd = -1};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void signal_set(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGHUP);
    sigaddset(set, SIGQUIT);
    sigaddset(set, SIGCHLD);
    sigaddset(set, SIGCONT); /* dlock continued (fg): so is the job */
}

static void *signal_thread(void *arg)
{
    (void)arg;
    sigset_t set;
    signal_set(&set);
    for (;;) {
        siginfo_t si;
        int sig = sigwaitinfo(&set, &si);
        if (sig < 0)
            continue;
        if (sig == SIGCHLD || (sig == SIGCONT && R.phase != RUNNING))
            continue; /* the guardian reports on its pipe; nothing to continue */
        pthread_mutex_lock(&R.mu);
        if (R.phase == WAITING) {
            /* Fired before the acquire starts or while it waits, the
             * cancel object ends it all the same. */
            R.signal = sig;
            if (R.cancel)
                dlock_cancel_fire(R.cancel);
            uint64_t one = 1;
            if (R.wait_fd >= 0 && write(R.wait_fd, &one, sizeof one) < 0)
                R.signal = sig;
        } else if (R.phase == RUNNING) {
            /* COMMAND has a process group of its own: pass every signal
             * on to the whole job (one from a terminal that dlock was
             * given reaches dlock's group, not COMMAND's). */
            if (R.job) {
                R.passed_signal = true;
                cli_job_signal(R.job, sig);
            } else {
                R.pending = sig; /* COMMAND not started yet, or none: dlock hold */
                uint64_t one = 1;
                if (R.wake_fd >= 0 && write(R.wake_fd, &one, sizeof one) < 0)
                    R.pending = sig;
            }
        }
        pthread_mutex_unlock(&R.mu);
    }
    return NULL;
}

static void set_phase(enum phase p)
{
    pthread_mutex_lock(&R.mu);
    R.phase = p;
    pthread_mutex_unlock(&R.mu);
}

/* The keeper found a hold lost: L is the lock, or the member of the set
 * that was lost (the first one, when several are). */
static void on_lost(dlock_lock *l, const char *why, void *arg)
{
    (void)arg;
    pthread_mutex_lock(&R.mu);
    if (!R.lost) {
        snprintf(R.lost_why, sizeof R.lost_why, "%s", why);
        snprintf(R.lost_name, sizeof R.lost_name, "%s", dlock_lock_name(l));
    }
    R.lost = true;
    pthread_mutex_unlock(&R.mu);
    uint64_t one = 1;
    ssize_t n = write(R.lost_fd, &one, sizeof one);
    (void)n;
}

/* ------------------------------------------------- inherited descriptors */

/* The descriptors above 2 that dlock was started with, ascending: COMMAND
 * inherits these (and, on the file backend, the lock's) and no other.
 * Taken before anything is opened. One slot is left for the lock's. */
#define MAX_INHERITED 256
static int inherited[MAX_INHERITED + 1];
static size_t ninherited;

static int cmp_int(const void *a, const void *b)
{
    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

static void note_inherited_fds(void)
{
    ninherited = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        struct dirent *de;
        while ((de = readdir(d)) && ninherited < MAX_INHERITED) {
            int fd = atoi(de->d_name);
            if (fd > 2 && fd != dirfd(d))
                inherited[ninherited++] = fd;
        }
        closedir(d);
    } else {
        for (int fd = 3; fd < 1024 && ninherited < MAX_INHERITED; fd++)
            if (fcntl(fd, F_GETFD) >= 0)
                inherited[ninherited++] = fd;
    }
    qsort(inherited, ninherited, sizeof *inherited, cmp_int);
}

/* "run" or "hold": the command being parsed, for messages. */
static const char *verb = "run";

/* Start the signal thread, or return EXIT_SOFTWARE after saying why (a
 * thread or memory limit): without it SIGTERM, SIGINT and SIGHUP would
 * be blocked for the whole run and never passed on, so nothing is taken
 * or run. */
static int start_signal_thread(void)
{
    pthread_t st;
    int e = pthread_create(&st, NULL, signal_thread, NULL);
    if (e) {
        fprintf(stderr, "dlock %s: cannot start the signal thread: %s; nothing was run\n", verb,
                strerror(e));
        return EXIT_SOFTWARE;
    }
    pthread_detach(st);
    return 0;
}

__attribute__((format(printf, 1, 2))) static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "dlock %s: ", verb);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    cli_print_usage_line(verb);
    return EXIT_USAGE;
}

/* -v lines: wall-clock time first, so a log shows when dlock started to
 * wait and when it got the lock. Their text holds the server's (who
 * holds a lock, why it was lost): each control character (C0, DEL, C1)
 * is written as \xHH, so no escape sequence reaches the terminal and a
 * line stays one line. */
__attribute__((format(printf, 2, 0))) static void vline(bool timed, const char *fmt, va_list ap)
{
    char when[32] = "", text[4096];
    if (timed) {
        cli_time_of_day(when, sizeof when - 1);
        strcat(when, " ");
    }
    vsnprintf(text, sizeof text, fmt, ap);
    flockfile(stderr); /* one line, also beside the library's callback thread */
    fprintf(stderr, "%sdlock %s: ", when, verb);
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (*p < 0x20 || *p == 0x7f || (p[0] == 0xc2 && p[1] >= 0x80 && p[1] < 0xa0)) {
            fprintf(stderr, "\\x%02x", *p);
            if (*p == 0xc2)
                fprintf(stderr, "\\x%02x", *++p);
        } else {
            fputc(*p, stderr);
        }
    }
    fputc('\n', stderr);
    funlockfile(stderr);
}

__attribute__((format(printf, 1, 2))) static void vlog(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vline(true, fmt, ap);
    va_end(ap);
}

/* A line printed with or without -v (a loss, a risk, a failed release):
 * under -v time-stamped like the -v lines around it. */
__attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vline(cli_verbosity > 0, fmt, ap);
    va_end(ap);
}

/* COMMAND's environment: ours plus DLOCK_NAME, DLOCK_TOKEN, DLOCK_URL, and
 * on etcd ETCD_LOCK_KEY and ETCD_LOCK_REV as `etcdctl lock` sets them
 * (ETCD_KEY: NULL elsewhere). NAMES[0] and TOKENS[0] are the lock's;
 * TOKENS and URL NULL (a path's flock): those left out. A set (run -m,
 * NSET > 0: NAMES[0..NSET) in the order given) adds DLOCK_COUNT,
 * DLOCK_NAME_<i> and DLOCK_TOKEN_<i> (i from 1) and DLOCK_TOKENS (the
 * tokens, space-separated); DLOCK_NAME and DLOCK_TOKEN are then its first
 * NAME's. Ours come last and replace any inherited (a dlock run inside
 * another); free_env() frees them. */
static bool env_is_ours(const char *entry)
{
    static const char *const fixed[] = {"DLOCK_NAME=",   "DLOCK_TOKEN=",    "DLOCK_URL=",
                                        "DLOCK_TOKENS=", "DLOCK_COUNT=",    "ETCD_LOCK_KEY=",
                                        "ETCD_LOCK_REV=", "DLOCK_VALUE=",   "DLOCK_VALUE_TOKEN=",
                                        "DLOCK_VALUE_FILE="};
    for (size_t j = 0; j < sizeof fixed / sizeof *fixed; j++)
        if (strncmp(entry, fixed[j], strlen(fixed[j])) == 0)
            return true;
    static const char *const numbered[] = {"DLOCK_NAME_", "DLOCK_TOKEN_"};
    for (size_t j = 0; j < 2; j++) {
        size_t len = strlen(numbered[j]), digits;
        if (strncmp(entry, numbered[j], len) == 0 &&
            (digits = strspn(entry + len, "0123456789")) > 0 && entry[len + digits] == '=')
            return true;
    }
    return false;
}

/* A password dlock reads from its environment (DLOCK_REDIS_PASSWORD,
 * DLOCK_ETCD_PASSWORD, DLOCK_REDIS_SENTINEL_PASSWORD, any DLOCK_*_PASSWORD):
 * dlock's, not COMMAND's, so it is not passed on (the *_PASSWORD_FILE
 * ones, paths, are). */
static bool env_is_password(const char *entry)
{
    size_t name = strcspn(entry, "="), suffix = sizeof "_PASSWORD" - 1;
    return strncmp(entry, "DLOCK_", 6) == 0 && name > 6 + suffix &&
           strncmp(entry + name - suffix, "_PASSWORD", suffix) == 0;
}

static char **child_env(const char *const *names, const uint64_t *tokens, size_t nset,
                        const char *url, const char *etcd_key)
{
    size_t n = 0, k = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 11 + 2 * nset, sizeof *env); /* 3 for run --value */
    if (!env)
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (!env_is_ours(environ[i]) && !env_is_password(environ[i]))
            env[k++] = environ[i];
    if (asprintf(&env[k++], "DLOCK_NAME=%s", names[0]) < 0 ||
        (tokens && asprintf(&env[k++], "DLOCK_TOKEN=%" PRIu64, tokens[0]) < 0) ||
        (url && asprintf(&env[k++], "DLOCK_URL=%s", url) < 0) ||
        (etcd_key && (asprintf(&env[k++], "ETCD_LOCK_KEY=%s", etcd_key) < 0 ||
                      asprintf(&env[k++], "ETCD_LOCK_REV=%" PRIu64, tokens[0]) < 0)))
        return NULL;
    if (nset) {
        /* DLOCK_TOKENS=: at most 20 digits and a space per token */
        char *list = malloc(sizeof "DLOCK_TOKENS=" + 21 * nset);
        if (!list || !(env[k++] = list) || asprintf(&env[k++], "DLOCK_COUNT=%zu", nset) < 0)
            return NULL;
        strcpy(list, "DLOCK_TOKENS=");
        for (size_t i = 0; i < nset; i++)
            sprintf(list + strlen(list), "%s%" PRIu64, i ? " " : "", tokens[i]);
        for (size_t i = 0; i < nset; i++)
            if (asprintf(&env[k++], "DLOCK_NAME_%zu=%s", i + 1, names[i]) < 0 ||
                asprintf(&env[k++], "DLOCK_TOKEN_%zu=%" PRIu64, i + 1, tokens[i]) < 0)
                return NULL;
    }
    return env;
}

static void free_env(char **env)
{
    if (!env)
        return;
    for (size_t i = 0; env[i]; i++)
        if (env_is_ours(env[i]))
            free(env[i]);
    free(env);
}

/* run --value: the lock's value as COMMAND was given it, and the file
 * (DLOCK_VALUE_FILE) whose content, if COMMAND changed it, becomes the
 * value before the release. */
struct run_value {
    char *path; /* NULL: no --value */
    char data[DLOCK_VALUE_MAX + 1];
    size_t len;
    uint64_t token; /* the writer's; 0: no value */
};

/* Read lock NAME's value through C into V and write it to a new file
 * for COMMAND (under $TMPDIR, else /tmp; mode 0600): 0, or the exit code
 * of a failure (said). */
static int value_prepare(dlock_client *c, const char *name, struct run_value *v)
{
    v->len = DLOCK_VALUE_MAX;
    int rc = dlock_value_get(c, name, v->data, &v->len, &v->token);
    if (rc)
        return cli_fail(rc, verb);
    v->data[v->len] = 0;
    const char *tmp = getenv("TMPDIR");
    if (asprintf(&v->path, "%s/dlock-value-XXXXXX", tmp && *tmp ? tmp : "/tmp") < 0) {
        v->path = NULL;
        say("--value: out of memory");
        return EXIT_SOFTWARE;
    }
    int fd = mkstemp(v->path);
    bool ok = fd >= 0 && write(fd, v->data, v->len) == (ssize_t)v->len;
    if (!ok)
        say("--value: the value file %s: %s", v->path, strerror(errno));
    if (fd >= 0)
        close(fd);
    if (!ok) {
        unlink(v->path);
        free(v->path);
        v->path = NULL;
        return EXIT_UNAVAILABLE;
    }
    return 0;
}

/* ENV (from child_env, which keeps room) with DLOCK_VALUE (when the
 * value is text), DLOCK_VALUE_TOKEN and DLOCK_VALUE_FILE added: false
 * when out of memory. */
static bool value_env(char **env, const struct run_value *v)
{
    size_t k = 0;
    while (env[k])
        k++;
    if (!memchr(v->data, 0, v->len) && asprintf(&env[k++], "DLOCK_VALUE=%s", v->data) < 0)
        return false;
    return asprintf(&env[k++], "DLOCK_VALUE_TOKEN=%" PRIu64, v->token) >= 0 &&
           asprintf(&env[k++], "DLOCK_VALUE_FILE=%s", v->path) >= 0;
}

/* After COMMAND (whose exit code is CODE): what V's file holds, if it
 * differs from the value COMMAND was given, becomes the value through L
 * (a file COMMAND removed changes nothing); the file is removed. Returns
 * CODE, or, when CODE is 0, the exit code of a value not written (said
 * either way): 65 too long, 75 the lock was lost, a backend's failure. */
static int value_apply(dlock_lock *l, struct run_value *v, int code)
{
    if (!v->path)
        return code;
    int fd = open(v->path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    char *data = NULL;
    ssize_t len = -1;
    if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size <= DLOCK_VALUE_MAX &&
        (data = malloc((size_t)st.st_size + 1)))
        len = read(fd, data, (size_t)st.st_size + 1);
    int rc = DLOCK_OK, fail = 0;
    if (fd < 0) {
        /* removed: nothing to write */
    } else if (st.st_size > DLOCK_VALUE_MAX) {
        say("--value: the value COMMAND wrote to %s is %lld bytes, at most %d: not written",
            v->path, (long long)st.st_size, DLOCK_VALUE_MAX);
        fail = EXIT_DATAERR;
    } else if (len < 0) {
        say("--value: reading %s: %s", v->path, data ? strerror(errno) : "out of memory");
        fail = EXIT_SOFTWARE;
    } else if ((size_t)len != v->len || memcmp(data, v->data, v->len) != 0) {
        if ((rc = dlock_value_set(l, data, (size_t)len)) == DLOCK_ELOST)
            say("--value: not written: %s", dlock_errmsg());
        fail = rc == DLOCK_ELOST ? EXIT_LOST : rc ? cli_fail(rc, verb) : 0;
    }
    if (fd >= 0)
        close(fd);
    free(data);
    unlink(v->path);
    free(v->path);
    v->path = NULL;
    return code ? code : fail;
}

/* On etcd, the key of our hold (NAME/<lease hex>, as `etcdctl lock`
 * prints it): the holder's key when its create revision is our TOKEN.
 * NULL on other backends or when it cannot be read. */
static char *etcd_key_of(dlock_client *c, const char *name, uint64_t token)
{
    dlock_info *info;
    if (strcmp(dlock_client_backend(c), "etcd") != 0 || dlock_inspect(c, name, &info))
        return NULL;
    char *key = dlock_info_held(info) && dlock_info_token(info) == token
                    ? strdup(dlock_info_key(info))
                    : NULL;
    dlock_info_free(info);
    return key;
}

/* -v before a wait: who holds NAME (one dlock_inspect), when known. */
static void log_holder(dlock_client *c, const char *name, int64_t wait_ms)
{
    dlock_info *info;
    char who[600] = "another owner";
    if (dlock_inspect(c, name, &info) == 0) {
        unsigned count;
        const char *id = dlock_info_holder_count(info) ? dlock_info_holder(info, 0, &count) : NULL;
        if (id)
            snprintf(who, sizeof who, "%s (token %" PRIu64 ")", id, dlock_info_token(info));
        dlock_info_free(info);
    }
    if (wait_ms < 0)
        vlog("'%s' is held by %s; waiting", name, who);
    else
        vlog("'%s' is held by %s; waiting up to %" PRId64 ".%03d s", name, who, wait_ms / 1000,
             (int)(wait_ms % 1000));
}

/* The controlling terminal when dlock runs in its foreground (an
 * interactive shell's job), to hand to COMMAND's process group; else -1. */
static int foreground_tty(void)
{
    int fd = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (fd >= 0 && tcgetpgrp(fd) != getpgrp()) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Start COMMAND as job J (job.c) and tell the signal thread where to send
 * signals. Returns 0 or -(exit code) after printing why. */
static int start_job(struct cli_job *j)
{
    j->tty_fd = foreground_tty();
    int rc = cli_job_start(j);
    if (j->tty_fd >= 0)
        close(j->tty_fd);
    if (rc)
        return rc;
    pthread_mutex_lock(&R.mu);
    R.job = j;
    if (R.pending)
        cli_job_signal(j, R.pending);
    else if (R.contended)
        cli_job_signal(j, SIGTERM); /* --on-contended term, told before COMMAND started */
    pthread_mutex_unlock(&R.mu);
    return 0;
}

/* What supervise() does when the lock is lost or at risk. */
struct policy {
    enum on_lost on_lost;
    int64_t kill_after_ms;
    int64_t grace_ms; /* act when validity falls to this; -1 = lease/6 */
    bool grace_given; /* --lost-grace was on the command line */
    bool term_on_contended; /* --on-contended term */
};

/* The number of locks held (a set's members, or the one lock; 0 for a
 * path's flock) and lock K of them. */
static size_t held_count(void)
{
    return R.multi ? dlock_multi_count(R.multi) : R.lock ? 1 : 0;
}

static dlock_lock *held_lock(size_t k)
{
    return R.multi ? dlock_multi_lock(R.multi, k) : R.lock;
}

/* The hold's validity (monotonic ms deadline), CLI_NEVER without a
 * lease; for a set (run -m), its member's that ends first, which *WHO
 * (may be NULL) then names. Asked from the thread that acquired: holds
 * are per thread. */
static int64_t valid_until(const char **who)
{
    int64_t until = CLI_NEVER, now = now_ms();
    for (size_t k = 0; k < held_count(); k++) {
        int64_t v = dlock_validity_ms(held_lock(k));
        if (v == DLOCK_VALID_FOREVER || v < 0 || now + v >= until)
            continue;
        until = now + v;
        if (who)
            *who = dlock_lock_name(held_lock(k));
    }
    return until;
}

/* The first signal P sends a job that is to stop: SIGTERM (then SIGKILL
 * after --kill-after), SIGKILL, or none (--on-lost ignore). */
static int stop_signal(const struct policy *p)
{
    return p->on_lost == LOST_KILL ? SIGKILL : p->on_lost == LOST_TERM ? SIGTERM : 0;
}

/* When P has a job sent its first signal at AT killed, at the latest at
 * KILL_BY (CLI_NEVER: --kill-after alone decides); CLI_NEVER when the
 * first signal is SIGKILL or none. */
static int64_t kill_time(const struct policy *p, int64_t at, int64_t kill_by)
{
    if (p->on_lost != LOST_TERM)
        return CLI_NEVER;
    at += p->kill_after_ms;
    return kill_by < at ? kill_by : at;
}

/* The grace P asks for on a hold whose lease is LEASE ms: --lost-grace,
 * else a sixth of the lease; at most half of it (renewals go out at a
 * third). */
static int64_t grace_for(const struct policy *p, int64_t lease)
{
    int64_t grace = p->grace_ms < 0 ? lease / 6 : p->grace_ms;
    return grace > lease / 2 ? lease / 2 : grace;
}

/* The library found a hold at risk (-v): one line each time it falls at
 * risk. Stopping the job then is the guardian's (supervise()). */
static void on_at_risk(dlock_lock *l, int64_t validity_ms, const char *why, void *arg)
{
    (void)l;
    (void)arg;
    vlog("%s (%" PRId64 " ms of its lease left)", why, validity_ms);
}

/* -v: have the library tell when L, just taken, is at risk, at P's grace
 * (as supervise() reckons it, on the validity L starts with). Backends
 * without leases (file) have nothing to tell. */
static void watch_at_risk(dlock_lock *l, const struct policy *p)
{
    int64_t validity = dlock_validity_ms(l);
    if (validity > 0 && validity != DLOCK_VALID_FOREVER)
        dlock_lock_on_at_risk(l, grace_for(p, validity) > 0 ? grace_for(p, validity) : 1,
                              on_at_risk, NULL);
}

/* Wait for the job to end (COMMAND and every process it left), applying
 * --on-lost to all of them: when the keeper reports the lock lost, and
 * before that when renewals fail, once the hold's validity falls to the
 * grace (the job is then told, and killed half the grace before the end
 * of the validity: before the lease can end on the server and be granted
 * to someone else). That deadline is the guardian's to keep (job.c): it
 * is told each new validity, looked up every tenth of the lease, so it
 * stops the job in time even when dlock itself is stopped or frozen (a
 * debugger, SIGSTOP), and reports it. The grace is reckoned on the lease,
 * taken as the longest validity seen: right after acquiring that is the
 * lease, except for a fair lock handed over, granted for the waiter's
 * short queue lease and extended to its lease at the first renewal -- so
 * a --lost-grace of more than half the lease is reported once a renewal
 * has shown the lease (or when the job is stopped). Sets *AT_RISK when
 * the job was stopped on failing renewals. Returns COMMAND's wait
 * status, or -1 when the guardian vanished. */
static int supervise(struct cli_job *j, const struct policy *p, bool *at_risk)
{
    int64_t grace = 0, lease = 0, last_until = CLI_NEVER, told_until = CLI_NEVER, told_grace = 0;
    bool acted = false, renewed = false, warned = !p->grace_given;
    const char *who = R.name;
    for (;;) {
        int64_t until = acted || p->on_lost == LOST_IGNORE ? CLI_NEVER : valid_until(&who);
        int64_t now = now_ms();
        if (until != CLI_NEVER) {
            if (until - now > lease)
                lease = until - now;
            /* Renewed: the validity's end moved on by more than a tick.
             * The end is read as now + validity from two clock reads, so
             * a preemption between them moves it by that much without a
             * renewal (a false warning, once under load in CI). */
            renewed |= last_until != CLI_NEVER && until - last_until > lease / 10;
            last_until = until;
            grace = grace_for(p, lease);
        }
        bool risk = until != CLI_NEVER && until - grace <= now;
        if (!warned && (renewed || risk) && p->grace_ms > lease / 2) {
            say("--lost-grace is more than half the lease (%" PRId64 " ms): using %" PRId64
                " ms",
                lease, grace);
            warned = true;
        }
        if (!acted && until != CLI_NEVER && until > now &&
            (until != told_until || grace != told_grace)) {
            /* Killed half the grace before the validity ends, so neither
             * a late wake-up nor the kill's own delivery can take the job
             * past it. A validity of 0 (a hold lost, its callback on the
             * way) is not told: the loss is --on-lost's, below. */
            int64_t first_at = until - grace;
            cli_job_deadline(j, stop_signal(p), first_at,
                             kill_time(p, first_at, until - grace / 2));
            told_until = until;
            told_grace = grace;
        }
        int64_t tick = lease / 10 > 10 ? lease / 10 : 10;
        int timeout = until == CLI_NEVER ? -1 : tick > 1000000 ? 1000000 : (int)tick;
        struct pollfd fds[2] = {{.fd = j->report_fd, .events = POLLIN},
                                {.fd = R.lost_fd, .events = POLLIN}};
        if (poll(fds, 2, timeout) < 0 && errno != EINTR)
            fds[0].revents = POLLIN; /* read the guardian's word, blocking */
        if (fds[0].revents) {
            struct cli_job_report r;
            if (!cli_job_read(j, &r)) {
                /* Killed from outside: COMMAND dies with it (its parent-
                 * death signal); what else is left of the job is ours now,
                 * killed through pidfds, not by its process group (empty
                 * by now, its number may be another's). */
                cli_job_kill_orphans(j);
                say("the guardian of the command died; what was left of the job was killed");
                return -1;
            }
            if (r.event == JOB_DONE)
                return r.value;
            if (r.event == JOB_EXITED && cli_verbosity)
                vlog("the command exited; holding %s until the processes it started exit too",
                     R.label);
            if (r.event == JOB_AT_RISK) {
                /* Not renewed, and the lease could end on the server soon:
                 * the guardian is stopping the job. */
                now = now_ms();
                say("lock '%s' at risk: not renewed, %" PRId64
                    " ms of its lease left; %s the command",
                    who, last_until > now ? last_until - now : 0,
                    p->on_lost == LOST_KILL ? "killing" : "stopping");
                acted = *at_risk = true;
            }
        }
        if (fds[1].revents) {
            uint64_t v;
            ssize_t r = read(R.lost_fd, &v, sizeof v);
            (void)r;
            pthread_mutex_lock(&R.mu);
            say("lock '%s' lost while the command ran: %s", R.lost_name, R.lost_why);
            pthread_mutex_unlock(&R.mu);
            if (!acted && p->on_lost != LOST_IGNORE)
                cli_job_stop(j, stop_signal(p), kill_time(p, now_ms(), CLI_NEVER));
            acted = true;
        }
    }
}

/* At most this many --put options to one run. */
#define RUN_PUT_MAX 16

struct run_opts {
    const char *url;
    int64_t wait_ms, lease_ms;
    struct policy policy;
    int conflict, verbose, strict_release;
    dlock_mode mode;
    const char *shell_cmd;
    unsigned permits; /* --permits N: a permit of an N-permit semaphore */
    bool multi;       /* -m: the operands up to -- or -c are a set of NAMEs */
    bool close;       /* -o: flock's --close: the job ends with COMMAND, which gets
                         no copy of the lock's descriptor */
    bool leave;       /* --no-wait-children: the job ends with COMMAND; what it started keeps
                         its copy of the descriptor (file, path), as under flock(1) */
    int64_t min_hold_ms; /* --min-hold: held at least this long after it was taken */
    pid_t pid;           /* hold --pid: held for this process, told of a loss */
    bool value;          /* --value: COMMAND gets the lock's value and may write one */
    const char *puts[RUN_PUT_MAX]; /* --put KEY=VALUE: put once COMMAND exits 0 (puts_apply) */
    size_t nput;
};

/* After COMMAND (whose exit code is CODE): when CODE is 0, each of O's
 * --put KEY=VALUE put as KEY of the name's store through L, in order,
 * each guarded by the hold (dlock_guarded_put); the first that fails
 * stops the rest, said. Returns CODE, or the exit code of a put not
 * made: 75 the lock was lost (nothing written), a backend's failure. */
static int puts_apply(dlock_lock *l, const struct run_opts *o, int code)
{
    for (size_t k = 0; !code && k < o->nput; k++) {
        const char *eq = strchr(o->puts[k], '=');
        char key[DLOCK_GUARDED_KEY_MAX + 1];
        snprintf(key, sizeof key, "%.*s", (int)(eq - o->puts[k]), o->puts[k]);
        int rc = dlock_guarded_put(l, key, eq + 1, strlen(eq + 1));
        if (rc == DLOCK_ELOST)
            say("--put %s: not written: %s", key, dlock_errmsg());
        code = rc == DLOCK_ELOST ? EXIT_LOST : rc ? cli_fail(rc, verb) : 0;
    }
    return code;
}

/* The lease the URL (-u, DLOCK_URL or the configuration file's) asks
 * for, read by the library's own parsers, its text into VALUE (SIZE
 * bytes); INT64_MAX when it sets none or does not parse (the library
 * reports that when the client opens). */
static int64_t url_lease_ms(const char *given, char *value, size_t size)
{
    struct cli_url from;
    if (cli_choose_url(given, true, &from) || !from.url || !strstr(from.url, "lease="))
        return INT64_MAX;
    struct dlock__url u;
    int64_t ms = INT64_MAX;
    if (dlock__url_parse(from.url, &u) == DLOCK_OK) {
        const char *text = dlock__url_param(&u, "lease");
        int64_t parsed = text ? dlock__parse_duration(text) : -1;
        if (parsed >= 0) {
            ms = parsed;
            snprintf(value, size, "%s", text);
        }
    }
    dlock__url_free(&u);
    return ms;
}

/* Parse the options of run and hold (flock(1)'s spellings beside ours)
 * into O, with the defaults first. Returns the index of NAME, or -(exit
 * code) after printing why. */
static int parse_opts(int argc, char **argv, struct run_opts *o)
{
    *o = (struct run_opts){o->url, DLOCK_FOREVER, 0, {LOST_TERM, 10000, -1, false, false}, 1, 0, 0,
                           DLOCK_EXCLUSIVE, NULL, 0, false, false, false, 0, 0, false, {NULL}, 0};
    static const struct option longs[] = {
        {"nonblock", no_argument, NULL, 'n'},
        {"nb", no_argument, NULL, 'n'},
        {"wait", required_argument, NULL, 'w'},
        {"timeout", required_argument, NULL, 'w'},
        {"conflict-exit-code", required_argument, NULL, 'E'},
        {"shared", no_argument, NULL, 's'},
        {"exclusive", no_argument, NULL, 'x'},
        {"close", no_argument, NULL, 'o'},
        {"no-wait-children", no_argument, NULL, 'D'},
        {"no-fork", no_argument, NULL, 'F'},
        {"lease", required_argument, NULL, 'L'},
        {"on-lost", required_argument, NULL, 'O'},
        {"kill-after", required_argument, NULL, 'K'},
        {"lost-grace", required_argument, NULL, 'G'},
        {"on-contended", required_argument, NULL, 'T'},
        {"command", required_argument, NULL, 'c'},
        {"verbose", no_argument, NULL, 'v'},
        {"strict-release", no_argument, NULL, 'R'},
        {"permits", required_argument, NULL, 'P'},
        {"multi", no_argument, NULL, 'm'},
        {"min-hold", required_argument, NULL, 'M'},
        {"pid", required_argument, NULL, 'p'},
        {"value", no_argument, NULL, 'V'},
        {"put", required_argument, NULL, 'Y'},
        {"url", required_argument, NULL, 'u'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0}};
    int ch;
    optind = 1;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "+nw:E:sxeoFc:vmu:h", longs, NULL)) != -1) {
        switch (ch) {
        case 'n':
            o->wait_ms = DLOCK_TRY;
            break;
        case 'w':
            if ((o->wait_ms = cli_seconds(optarg)) < 0)
                return -usage_error("-w needs SECONDS (e.g. 2.5), not '%s'", optarg);
            break;
        case 'E': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (end == optarg || *end || v < 0 || v > 255)
                return -usage_error("-E needs an exit code 0-255, not '%s'", optarg);
            o->conflict = (int)v;
            break;
        }
        case 's':
            o->mode = DLOCK_SHARED;
            break;
        case 'x':
        case 'e':
            o->mode = DLOCK_EXCLUSIVE;
            break;
        case 'o':
            o->close = true;
            break;
        case 'D':
            o->leave = true;
            break;
        case 'F':
            return -usage_error("-F (--no-fork) is refused: dlock stays COMMAND's parent's "
                                "parent to renew the lock, to stop the job when the lock is "
                                "lost and to release it after the last process of the job");
        case 'L':
            if ((o->lease_ms = cli_seconds(optarg)) < 0)
                return -usage_error("--lease needs SECONDS, not '%s'", optarg);
            if (o->lease_ms < MIN_LEASE_MS)
                return -usage_error("--lease %s " LEASE_TOO_SHORT, optarg, MIN_LEASE_MS / 1000);
            break;
        case 'O':
            if (strcmp(optarg, "term") == 0)
                o->policy.on_lost = LOST_TERM;
            else if (strcmp(optarg, "kill") == 0)
                o->policy.on_lost = LOST_KILL;
            else if (strcmp(optarg, "ignore") == 0)
                o->policy.on_lost = LOST_IGNORE;
            else
                return -usage_error("--on-lost takes term, kill or ignore, not '%s'", optarg);
            break;
        case 'T':
            if (strcmp(optarg, "term") == 0)
                o->policy.term_on_contended = true;
            else if (strcmp(optarg, "ignore") == 0)
                o->policy.term_on_contended = false;
            else
                return -usage_error("--on-contended takes term or ignore, not '%s'", optarg);
            break;
        case 'K':
            if ((o->policy.kill_after_ms = cli_seconds(optarg)) < 0)
                return -usage_error("--kill-after needs SECONDS, not '%s'", optarg);
            break;
        case 'G':
            if ((o->policy.grace_ms = cli_seconds(optarg)) < 0)
                return -usage_error("--lost-grace needs SECONDS, not '%s'", optarg);
            o->policy.grace_given = true;
            break;
        case 'c':
            o->shell_cmd = optarg;
            break;
        case 'v':
            o->verbose = 1;
            cli_verbosity++; /* the library's events too (cli_open) */
            break;
        case 'R':
            o->strict_release = 1;
            break;
        case 'P': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (end == optarg || *end || v < 1 || v > DLOCK_PERMITS_MAX)
                return -usage_error("--permits needs a count 1-%d, not '%s'", DLOCK_PERMITS_MAX,
                                    optarg);
            o->permits = (unsigned)v;
            break;
        }
        case 'M':
            if (strcmp(verb, "hold") == 0)
                return -usage_error("%s", "--min-hold is for a job (run, elect): a hold ends "
                                          "when its script says so");
            if ((o->min_hold_ms = cli_seconds(optarg)) < 0)
                return -usage_error("--min-hold needs SECONDS, not '%s'", optarg);
            break;
        case 'p': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (strcmp(verb, "run") == 0)
                return -usage_error("%s", "--pid is hold's (and elect's without COMMAND): run "
                                          "holds for COMMAND");
            if (end == optarg || *end || v < 1 || v > INT_MAX)
                return -usage_error("--pid needs a process id, not '%s'", optarg);
            o->pid = (pid_t)v;
            break;
        }
        case 'V':
            if (strcmp(verb, "run") != 0)
                return -usage_error("%s", "--value is run's: COMMAND reads and writes the "
                                          "lock's value");
            o->value = true;
            break;
        case 'Y': {
            const char *eq = strchr(optarg, '=');
            size_t kl = eq ? (size_t)(eq - optarg) : 0;
            if (strcmp(verb, "run") != 0)
                return -usage_error("%s", "--put is run's: it writes once COMMAND succeeded");
            if (!kl || kl > DLOCK_GUARDED_KEY_MAX ||
                strspn(optarg, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") !=
                    kl)
                return -usage_error("--put needs KEY=VALUE, KEY 1 to %d letters, digits, '.', '_' "
                                    "or '-', not '%s'",
                                    DLOCK_GUARDED_KEY_MAX, optarg);
            if (o->nput == RUN_PUT_MAX)
                return -usage_error("at most %d --put options", RUN_PUT_MAX);
            o->puts[o->nput++] = optarg;
            break;
        }
        case 'm':
            if (strcmp(verb, "run") != 0)
                return -usage_error("%s", "-m (a set of NAMEs) is run's alone");
            o->multi = true;
            break;
        case 'u':
            o->url = optarg;
            break;
        case 'h':
            exit(cli_help(verb, 0));
        default:
            if (optopt && strchr("wEcuLOKGPMpTY", optopt))
                return -usage_error("option '%s' needs a value", argv[optind - 1]);
            return -usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc)
        return -usage_error("%s", "missing NAME");
    char url_lease[32];
    if (!o->lease_ms && url_lease_ms(o->url, url_lease, sizeof url_lease) < MIN_LEASE_MS)
        return -usage_error("the URL's lease=%s " LEASE_TOO_SHORT, url_lease, MIN_LEASE_MS / 1000);
    if (o->min_hold_ms && cli_is_path(o->url, argv[optind]))
        return -usage_error("%s", "--min-hold needs a lock NAME, not a path: flock(2) holds a "
                                  "file only while a process keeps it open");
    if (o->value && (o->multi || o->permits || cli_is_path(o->url, argv[optind])))
        return -usage_error("--value hands COMMAND one lock's value: %s",
                            o->multi     ? "not with -m"
                            : o->permits ? "not with --permits (a permit has none)"
                                         : "NAME is a path (flock(2) keeps no value)");
    if (o->nput && (o->multi || o->permits || o->mode == DLOCK_SHARED ||
                    cli_is_path(o->url, argv[optind])))
        return -usage_error("--put writes through one exclusive hold: %s",
                            o->multi                     ? "not with -m"
                            : o->permits                 ? "not with --permits"
                            : o->mode == DLOCK_SHARED    ? "not with -s"
                                                         : "NAME is a path (flock(2) has no store)");
    if (o->permits && o->multi)
        return -usage_error("%s", "--permits takes a permit of one semaphore, not with -m");
    const char *no_contended = !o->policy.term_on_contended ? NULL
                               : o->multi                   ? "not with -m"
                               : o->permits                 ? "not with --permits"
                               : o->mode == DLOCK_SHARED    ? "not with -s"
                               : strcmp(verb, "elect") == 0 ? "not a leadership"
                               : cli_is_path(o->url, argv[optind]) ? "NAME is a path"
                               : strcmp(verb, "hold") == 0 && !o->pid ? "hold needs --pid"
                                                                      : NULL;
    if (no_contended)
        return -usage_error("--on-contended term stops %s when another owner waits for one "
                            "exclusive lock NAME: %s",
                            strcmp(verb, "run") == 0 ? "COMMAND" : "the --pid process",
                            no_contended);
    if (o->permits && (o->mode == DLOCK_SHARED || cli_is_path(o->url, argv[optind])))
        return -usage_error("--permits takes a permit of the semaphore NAME: %s",
                            o->mode == DLOCK_SHARED ? "not with -s (a permit has no mode)"
                                                    : "NAME is a path (flock(2) has no permits)");
    int code = cli_check_name(verb, argv[optind]);
    return code ? -code : optind;
}

static int lock_and_run(struct run_opts *o, const char *const *names, size_t n, char **cmd);
static int path_lock_and_run(const struct run_opts *o, const char *path, char **cmd);
static int finish(const struct run_opts *o, dlock_client *c, int code, bool at_risk);
static void hold_at_least(const struct run_opts *o, int64_t acquired_at);
static int hold_until_done(const char *name, const uint64_t *token, dlock_mode mode,
                           const char *etcd_key);
static int prepare_hold(const struct run_opts *o);
static int watch_contended(const struct policy *p, bool verbose, dlock_mode mode);

/* dlock elect (elect.c): run's job under leadership of election NAME
 * campaigning with this value instead of under the lock; NULL for run. */
static const char *campaign_value;

int cmd_run_campaign(const char *url, const char *value, int argc, char **argv)
{
    campaign_value = value;
    return cmd_run(url, argc, argv);
}

/* run -m: the operands from argv[I] up to --, -c or --command are the
 * set's NAMEs. Sets *N; returns 0 or the exit code of a usage error. A
 * separator is needed because without -m `run NAME COMMAND ARG...` takes
 * everything after NAME as the command, with or without a --, so
 * `run a b -- c` already means "lock a, run b -- c". */
static int set_names(const struct run_opts *o, int argc, char **argv, int i, size_t *n)
{
    size_t k = 0;
    while (i + (int)k < argc && strcmp(argv[i + k], "--") != 0 &&
           strcmp(argv[i + k], "-c") != 0 && strcmp(argv[i + k], "--command") != 0)
        k++;
    if (k > DLOCK_MULTI_MAX)
        return usage_error("-m takes at most %d NAMEs, not %zu", DLOCK_MULTI_MAX, k);
    for (size_t a = 0; a < k; a++) {
        int code = cli_check_name(verb, argv[i + a]);
        if (code)
            return code;
        if (cli_is_path(o->url, argv[i + a]))
            return usage_error("-m takes lock names; '%s' is a path (a file's flock(2) is "
                               "not taken as part of a set)",
                               argv[i + a]);
        for (size_t b = 0; b < a; b++)
            if (strcmp(argv[i + a], argv[i + b]) == 0)
                return usage_error("-m: NAME '%s' given twice", argv[i + a]);
    }
    *n = k;
    return 0;
}

int cmd_run(const char *url, int argc, char **argv)
{
    struct run_opts o = {.url = url};
    verb = campaign_value ? "elect" : "run";
    note_inherited_fds();
    int i = parse_opts(argc, argv, &o);
    if (i < 0)
        return -i;
    const char *const *names = (const char *const *)argv + i;
    size_t n = 1;
    if (o.multi) {
        int code = set_names(&o, argc, argv, i, &n);
        if (code)
            return code;
    }
    i += (int)n;
    /* -c may also come after NAME, as in flock(1). */
    if (!o.shell_cmd && i < argc &&
        (strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "--command") == 0)) {
        if (i + 1 >= argc)
            return usage_error("option '%s' needs a value", argv[i]);
        o.shell_cmd = argv[i + 1];
        i += 2;
        if (i < argc)
            return usage_error("unexpected '%s' after -c COMMAND", argv[i]);
    }
    if (i < argc && strcmp(argv[i], "--") == 0)
        i++;
    /* -c runs $SHELL -c, as flock(1) does. */
    const char *shell = getenv("SHELL");
    char *sh_argv[] = {(char *)(shell && *shell ? shell : "/bin/sh"), "-c", (char *)o.shell_cmd,
                       NULL};
    char **cmd = o.shell_cmd ? sh_argv : argv + i;
    if (o.shell_cmd && i < argc)
        return usage_error("give either -c 'SHELL COMMAND' or COMMAND [ARG...], not both (%s)",
                           argv[i]);
    if (o.pid && (o.shell_cmd || i < argc))
        return usage_error("%s", "--pid is for elect without COMMAND: with one, elect holds "
                                 "for COMMAND");
    if (campaign_value && !o.shell_cmd && i >= argc) {
        /* elect NAME: lead until stdin ends or a signal, as hold holds */
        if (o.min_hold_ms)
            return usage_error("%s", "--min-hold is for a COMMAND: without one, elect leads "
                                     "until its stdin ends or a signal comes");
        int code = prepare_hold(&o);
        return code ? code : lock_and_run(&o, names, 1, NULL);
    }
    if (!o.shell_cmd && i >= argc)
        return usage_error("%s", o.multi ? "missing COMMAND (with -m the NAMEs end at --: "
                                           "run -m NAME1 NAME2 -- COMMAND)"
                                         : "missing COMMAND");
    if (!o.multi && cli_is_path(o.url, names[0]))
        return path_lock_and_run(&o, names[0], cmd);
    return lock_and_run(&o, names, n, cmd);
}

/* Run CMD with ENV (freed here) as a job (job.c) under the lock held
 * now, LOCK_FDS[0..NLOCK) inherited beside what dlock was given (not with
 * -o), and wait for its end (with -o or --no-wait-children, COMMAND's), applying O's
 * --on-lost.
 * Returns the exit status from COMMAND's wait status; sets *AT_RISK as
 * supervise() does. */
static int run_job(const struct run_opts *o, char **cmd, char **env, const int *lock_fds,
                   size_t nlock, const sigset_t *oldmask, bool *at_risk)
{
    int keep[MAX_INHERITED + DLOCK_MULTI_MAX];
    size_t nkeep = ninherited;
    memcpy(keep, inherited, nkeep * sizeof *keep);
    for (size_t k = 0; k < nlock && !o->close; k++)
        keep[nkeep++] = lock_fds[k];
    qsort(keep, nkeep, sizeof *keep, cmp_int);
    struct cli_job job = {.argv = cmd, .env = env, .sigmask = oldmask, .keep = keep,
                          .nkeep = nkeep, .leave_rest = o->close || o->leave, .ctl_fd = -1,
                          .report_fd = -1};
    int code = env ? -start_job(&job) : EXIT_SOFTWARE;
    free_env(env);
    if (!code) {
        int status = supervise(&job, &o->policy, at_risk);
        code = status < 0              ? EXIT_SOFTWARE
               : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                     : WEXITSTATUS(status);
    }
    set_phase(DONE);
    cli_job_end(&job);
    return code;
}

/* The set's lost callback: the member's loss is the run's (on_lost). */
static void on_member_lost(dlock_multi *m, dlock_lock *member, const char *why, void *arg)
{
    (void)m;
    on_lost(member, why, arg);
}

/* How long after -w's deadline the deadline thread cancels: the wait
 * itself is bounded by the library and ends at the deadline with its own
 * reason ("still held by another owner after ..."); the thread is the
 * backstop for the steps it does not bound, and firing at the same
 * instant would race the wait's own answer. */
#define DEADLINE_SLACK_MS 50

static void set_trying(bool on)
{
    pthread_mutex_lock(&R.mu);
    R.trying = on;
    pthread_mutex_unlock(&R.mu);
}

/* -w's deadline, in a thread of its own: a step of the wait that the
 * library does not bound by the wait -- the try-once of -v before it,
 * which has the op timeout -- is canceled then (as a signal would). */
static void *deadline_thread(void *arg)
{
    int64_t deadline = *(const int64_t *)arg + DEADLINE_SLACK_MS;
    struct timespec ts = {(time_t)(deadline / 1000), (long)(deadline % 1000) * 1000000L};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
    pthread_mutex_lock(&R.mu);
    if (R.phase == WAITING && R.cancel && R.trying) { /* the wait itself ends on its own */
        R.out_of_time = true;
        dlock_cancel_fire(R.cancel);
    }
    pthread_mutex_unlock(&R.mu);
    return NULL;
}

/* Acquire, release and free what R holds: the set or the lock. */
static int take_held(int64_t wait_ms, dlock_cancel *cancel)
{
    return R.multi ? dlock_multi_acquire(R.multi, wait_ms, cancel)
                   : dlock_acquire_ex(R.lock, wait_ms, cancel);
}

static int release_held(void)
{
    return R.multi ? dlock_multi_release(R.multi) : dlock_release(R.lock);
}

static void free_held(void)
{
    dlock_multi_free(R.multi);
    dlock_lock_free(R.lock);
    R.multi = NULL;
    R.lock = NULL;
}

/* NAMES[0..N) as 'a', 'b', 'c' (malloc'd; NULL when out of memory). */
static char *quoted_list(const char *const *names, size_t n)
{
    size_t len = 1;
    for (size_t k = 0; k < n; k++)
        len += strlen(names[k]) + 4;
    char *s = malloc(len), *p = s;
    for (size_t k = 0; s && k < n; k++)
        p += sprintf(p, "%s'%s'", k ? ", " : "", names[k]);
    return s;
}

/* -v before a wait for a set: who holds its first member held elsewhere. */
static void log_set_holder(dlock_client *c, int64_t wait_ms)
{
    for (size_t k = 0; k < held_count(); k++) {
        const char *name = dlock_lock_name(held_lock(k));
        dlock_info *info;
        int held = dlock_inspect(c, name, &info) == 0 && dlock_info_held(info);
        if (held)
            dlock_info_free(info);
        if (held || k + 1 == held_count()) {
            log_holder(c, name, wait_ms);
            return;
        }
    }
}

/* The tokens of the set for COMMAND, in the order the NAMEs were given
 * (not the canonical order the members are taken in). */
static void set_tokens(const char *const *names, size_t n, uint64_t *tokens)
{
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < held_count(); k++)
            if (strcmp(dlock_lock_name(held_lock(k)), names[i]) == 0)
                dlock_token(held_lock(k), &tokens[i]);
}

/* Take the lock (or, with -m, the set NAMES[0..N)) as O says and run CMD
 * under it (NULL: hold it until stdin closes or a signal comes: `dlock
 * hold`). */
/* A run that took its locks ends before COMMAND starts: the descriptors
 * FDS[0..N) closed, the locks released, LABEL freed, C closed; returns
 * CODE. */
static int abandon_run(dlock_client *c, char *label, const int *fds, size_t n, int code)
{
    for (size_t k = 0; k < n; k++)
        close(fds[k]);
    release_held();
    free_held();
    free(label);
    dlock_client_close(c);
    return code;
}

static int lock_and_run(struct run_opts *o, const char *const *names, size_t n, char **cmd)
{
    const char *url = o->url, *name = names[0];
    int64_t wait_ms = o->wait_ms, lease_ms = o->lease_ms;
    cli_reports_losses = true;
    dlock_mode mode = o->mode;
    int code, verbose = o->verbose;
    /* Block the signals before any thread starts, so only the signal
     * thread receives them. */
    sigset_t set, oldmask;
    signal_set(&set);
    pthread_sigmask(SIG_BLOCK, &set, &oldmask);
    signal(SIGPIPE, SIG_IGN);

    /* -w bounds the whole run up to COMMAND, connecting included: one
     * deadline, each step gets what is left of it. -n: one try, each step
     * within the library's timeouts, the close after a failure a grace. */
    static int64_t deadline; /* static: the deadline thread reads it */
    int64_t t0 = now_ms();
    deadline = wait_ms > 0 ? t0 + wait_ms : CLI_NEVER;
    int64_t close_by = wait_ms == DLOCK_TRY ? t0 : deadline;
    /* A signal while connecting ends the run at once (the signal thread
     * wakes the connect's wait through R.wait_fd). */
    R.wait_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if ((code = start_signal_thread()))
        return code;
    dlock_client *c;
    code = cli_open_within(url, lease_ms, deadline, R.wait_fd, &c);
    if (code == CLI_WOKEN || code == CLI_OUT_OF_TIME) {
        pthread_mutex_lock(&R.mu);
        int sig = R.signal;
        pthread_mutex_unlock(&R.mu);
        if (code == CLI_WOKEN)
            fprintf(stderr, "dlock %s: interrupted by signal %d while connecting\n", verb, sig);
        cli_exit_now(code == CLI_WOKEN ? 128 + sig : EXIT_UNAVAILABLE);
    }
    if (code)
        return code;
    char *label = quoted_list(names, n);
    int rc = !label           ? DLOCK_ENOMEM
             : o->multi       ? dlock_multi_new(c, names, n, mode, 0, &R.multi)
             : campaign_value ? dlock_lock_new_campaign(c, name, campaign_value, 0, &R.lock)
             : o->permits     ? dlock_lock_new_permits(c, name, o->permits, 0, &R.lock)
                              : dlock_lock_new(c, name, mode, 0, &R.lock);
    if (!rc && (R.lost_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0)
        rc = DLOCK_EIO;
    if (!rc)
        rc = R.multi ? dlock_multi_on_lost(R.multi, on_member_lost, NULL)
                     : dlock_lock_on_lost(R.lock, on_lost, NULL);
    if (!rc && !o->permits)
        rc = watch_contended(&o->policy, verbose, mode);
    dlock_cancel *cancel = NULL;
    if (!rc && !(rc = dlock_cancel_new(&cancel))) {
        /* The signal thread runs since before the connect: a signal that
         * came once the connect was over, before this cancel object
         * existed, fires it now (else the wait would not end). */
        pthread_mutex_lock(&R.mu);
        R.cancel = cancel;
        if (R.signal)
            dlock_cancel_fire(cancel);
        pthread_mutex_unlock(&R.mu);
    }
    if (rc) {
        code = rc == DLOCK_EIO ? (fprintf(stderr, "dlock %s: eventfd: %s\n", verb,
                                          strerror(errno)),
                                  EXIT_SOFTWARE)
                               : cli_fail(rc, verb);
        free(label);
        free_held();
        dlock_client_close(c);
        return code;
    }
    R.name = name;
    R.label = label;
    pthread_t dt;
    if (deadline != CLI_NEVER && pthread_create(&dt, NULL, deadline_thread, &deadline) == 0)
        pthread_detach(dt);

    if (verbose && wait_ms != DLOCK_TRY) {
        /* Say who holds it before waiting: one try, then the wait. */
        set_trying(true);
        rc = take_held(DLOCK_TRY, R.cancel);
        set_trying(false);
        if (rc == DLOCK_EBUSY) {
            if (R.multi)
                log_set_holder(c, wait_ms);
            else
                log_holder(c, name, wait_ms);
            int64_t left = deadline - now_ms();
            rc = take_held(wait_ms < 0 ? wait_ms : left > 0 ? left : 1, R.cancel);
        }
    } else {
        int64_t left = deadline - now_ms();
        rc = take_held(wait_ms <= 0 ? wait_ms : left > 0 ? left : 1, R.cancel);
    }
    int64_t waited = now_ms() - t0;
    pthread_mutex_lock(&R.mu);
    int sig = R.signal;
    bool cut = rc == DLOCK_ECANCELED && !sig && R.out_of_time;
    if (cut)
        rc = DLOCK_ETIMEDOUT; /* cut at -w's deadline: a wait that timed out */
    R.phase = rc ? DONE : RUNNING;
    pthread_mutex_unlock(&R.mu);
    dlock_cancel_free(R.cancel); /* the signal thread fires it only while WAITING */
    R.cancel = NULL;
    if (rc == DLOCK_OK && sig) {
        /* The signal came as the lock arrived: honour the signal. */
        release_held();
        rc = DLOCK_ECANCELED;
    }
    if (rc) {
        bool busy = rc == DLOCK_EBUSY || rc == DLOCK_ETIMEDOUT;
        if (sig)
            fprintf(stderr, "dlock %s: interrupted by signal %d while waiting for %s\n", verb,
                    sig, label);
        else if (busy && verbose) /* silent otherwise, as flock(1): cron mails nothing */
            vlog("%s", cut ? "not acquired within -w's bound: still held, or no answer from "
                             "the backend"
                           : dlock_errmsg());
        code = sig ? 128 + sig : busy ? o->conflict : cli_fail(rc, verb);
        free_held();
        free(label);
        cli_close_within(c, sig ? CLI_NEVER : close_by, code); /* what is owed: the lease's */
        return code;
    }
    int64_t acquired_at = now_ms();
    uint64_t tokens[DLOCK_MULTI_MAX] = {0};
    if (R.multi)
        set_tokens(names, n, tokens);
    else
        dlock_token(R.lock, &tokens[0]);
    if (verbose)
        for (size_t k = 0; k < n; k++) {
            vlog("holding '%s' on %s (%s, token %" PRIu64 ", waited %" PRId64 " ms)", names[k],
                 dlock_client_url(c), mode == DLOCK_SHARED ? "shared" : "exclusive", tokens[k],
                 waited);
            watch_at_risk(held_lock(k), &o->policy);
        }
    /* One lock on etcd: ETCD_LOCK_KEY as etcdctl lock sets it (not a
     * leadership: its key is the election's, which dlock_inspect does not read). */
    char *etcd_key = R.multi || campaign_value ? NULL : etcd_key_of(c, name, tokens[0]);
    if (!cmd) {
        code = hold_until_done(name, &tokens[0], mode, etcd_key);
        free(etcd_key);
        return finish(o, c, code, false);
    }
    /* File backend: COMMAND inherits a copy of each lock's descriptor, as
     * with flock(1), so the kernel keeps the locks until the last process
     * of the job has exited, even if dlock is killed first. */
    int lock_fds[DLOCK_MULTI_MAX];
    size_t nlock = 0;
    for (rc = DLOCK_OK; !rc && nlock < held_count(); nlock++)
        if ((rc = dlock_lock_inherit_fd(held_lock(nlock), &lock_fds[nlock])))
            break;
    if (rc && rc != DLOCK_ENOTSUP) {
        free(etcd_key);
        return abandon_run(c, label, lock_fds, nlock, cli_fail(rc, verb));
    }
    struct run_value value = {0};
    code = o->value ? value_prepare(c, name, &value) : 0;
    char **env = code ? NULL
                      : child_env(names, tokens, R.multi ? n : 0, dlock_client_url(c), etcd_key);
    free(etcd_key);
    if (!code && (!env || (o->value && !value_env(env, &value)))) {
        say("out of memory");
        code = EXIT_SOFTWARE;
    }
    if (code) {
        free_env(env);
        value_apply(R.lock, &value, code); /* removes the file */
        return abandon_run(c, label, lock_fds, nlock, code);
    }
    bool at_risk = false;
    code = run_job(o, cmd, env, lock_fds, nlock, &oldmask, &at_risk);
    code = value_apply(R.lock, &value, code);
    code = puts_apply(R.lock, o, code);
    R.left_held = o->leave && nlock > 0;
    for (size_t k = 0; k < nlock; k++)
        close(lock_fds[k]);
    if (!at_risk)
        hold_at_least(o, acquired_at);
    return finish(o, c, code, at_risk);
}

/* --min-hold: once the job has ended, keep what is held (renewed as
 * before) until O->min_hold_ms after it was taken, as ShedLock's
 * lockAtLeastFor: copies of a short job that other hosts start a little
 * later, their clocks seconds apart, find it busy instead of running it
 * again. A signal (SIGTERM: stop now) or a loss ends it early; a loss
 * then is not the job's, whose status stands. If dlock is killed
 * meanwhile, a network backend keeps the name until its lease ends. */
static void hold_at_least(const struct run_opts *o, int64_t acquired_at)
{
    int64_t until = acquired_at + o->min_hold_ms;
    if (!o->min_hold_ms || now_ms() >= until)
        return;
    pthread_mutex_lock(&R.mu);
    bool skip = R.lost || R.passed_signal || R.pending;
    if (R.wake_fd < 0)
        R.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    R.job = NULL; /* ended: a signal now wakes the wait below */
    if (!skip && R.wake_fd >= 0)
        R.phase = RUNNING;
    pthread_mutex_unlock(&R.mu);
    if (skip || R.wake_fd < 0)
        return;
    if (o->verbose)
        vlog("the command exited; holding %s %.3f s more (--min-hold)", R.label,
             (double)(until - now_ms()) / 1000);
    for (int64_t left; (left = until - now_ms()) > 0;) {
        struct pollfd fds[2] = {{.fd = R.lost_fd, .events = POLLIN},
                                {.fd = R.wake_fd, .events = POLLIN}};
        int n = poll(fds, 2, left > INT_MAX ? INT_MAX : (int)left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n != 0)
            break; /* lost, a signal, or poll failing: release now */
    }
    pthread_mutex_lock(&R.mu);
    R.phase = DONE;
    R.lost_after_job = R.lost;
    pthread_mutex_unlock(&R.mu);
}

/* Release what is held after the job (or the hold) ended with CODE,
 * close C, and return the exit status: CODE, or 75 when the lock (a
 * member of the set) was lost or at risk (AT_RISK), or the release's
 * failure with --strict-release. */
static int finish(const struct run_opts *o, dlock_client *c, int code, bool at_risk)
{
    int rc = release_held();
    pthread_mutex_lock(&R.mu);
    bool lost = R.lost, after_job = R.lost_after_job;
    pthread_mutex_unlock(&R.mu);
    if (after_job) {
        /* lost during --min-hold: the job ran under the lock */
        if (o->verbose)
            vlog("lost during --min-hold, after the command ended: %s", R.lost_why);
    } else if (rc == DLOCK_ELOST || lost) {
        if (!lost)
            say("%s", dlock_errmsg());
        code = EXIT_LOST;
    } else if (rc) {
        /* The job ran under the lock: its status stands, unless asked. */
        say("release of %s failed%s: %s", R.label,
            o->strict_release || code ? "" : " (the command's status kept; see --strict-release)",
            dlock_errmsg());
        if (o->strict_release && !code)
            code = cli_exit_code(rc);
    } else if (o->verbose) {
        vlog(R.left_held ? "left %s to what COMMAND started (it keeps the lock's descriptor)"
                         : "released %s",
             R.label);
    }
    if (at_risk) /* stopped because the lease could not be kept */
        code = EXIT_LOST;
    free_held();
    dlock_client_close(c);
    return code;
}

/* hold --pid: the process held for (0: none), its pidfd, and the signal
 * a loss sends it (--on-lost: SIGTERM, SIGKILL, or 0 for ignore). */
static struct {
    pid_t pid;
    int pidfd;
    int signal;
} held_for = {0, -1, 0};

/* Tell the process held for that the lock was lost: its process group
 * when it leads one (a script started from a terminal, by cron or by
 * setsid: its steps stop with it), else itself. */
static void tell_held_for(void)
{
    if (!held_for.pid || !held_for.signal)
        return;
    pid_t target = getpgid(held_for.pid) == held_for.pid ? -held_for.pid : held_for.pid;
    kill(target, held_for.signal);
}

/* Another owner started waiting for the lock (dlock_lock_on_contended(),
 * on the library's callback thread): a -v line for each waiter; with
 * --on-contended term, the first one sends COMMAND's job (hold: the --pid
 * process, as a loss would) SIGTERM, once, and the lock is held until
 * the job ends. */
static void on_contended(dlock_lock *l, const char *who, void *arg)
{
    const struct policy *p = arg;
    if (cli_verbosity)
        vlog("lock '%s' contended: %s waits", dlock_lock_name(l), who);
    pthread_mutex_lock(&R.mu);
    bool first = p->term_on_contended && !R.contended;
    R.contended |= p->term_on_contended;
    if (first) {
        say("lock '%s' contended: another owner waits; stopping the %s (SIGTERM)",
            dlock_lock_name(l), held_for.pid ? "--pid process" : "command");
        if (R.job)
            cli_job_signal(R.job, SIGTERM);
    }
    pthread_mutex_unlock(&R.mu);
    if (first && held_for.pid) {
        pid_t target = getpgid(held_for.pid) == held_for.pid ? -held_for.pid : held_for.pid;
        kill(target, SIGTERM);
    }
}

/* -v or --on-contended term: have the library tell when another owner
 * waits for R.lock, before it is taken (an exclusive lock of its own,
 * not a set, a permit or a leadership). -v alone on a backend that
 * cannot tell says nothing; --on-contended term there fails the run.
 * DLOCK_OK or the library's code. */
static int watch_contended(const struct policy *p, bool verbose, dlock_mode mode)
{
    if ((!verbose && !p->term_on_contended) || !R.lock || mode != DLOCK_EXCLUSIVE ||
        campaign_value)
        return DLOCK_OK;
    int rc = dlock_lock_on_contended(R.lock, on_contended, (void *)p);
    return p->term_on_contended || rc == DLOCK_EMISUSE || rc == DLOCK_ENOMEM ? rc : DLOCK_OK;
}

/* dlock hold, and elect without COMMAND: print what is held (one line,
 * key=value; a lock's NAME last, a leadership's value after its NAME:
 * either may hold spaces), then hold it until stdin reaches its end, a
 * signal comes (0) or the lock is lost (75). With --pid: until that
 * process exits or the reader of standard output (a pipe) closes it,
 * instead of stdin's end; a loss is signalled to it. */
static int hold_until_done(const char *name, const uint64_t *token, dlock_mode mode,
                           const char *etcd_key)
{
    if (token)
        printf("token=%" PRIu64 " ", *token);
    if (!campaign_value)
        printf("mode=%s ", mode == DLOCK_SHARED ? "shared" : "exclusive");
    printf("%s%s%sname=%s", etcd_key ? "key=" : "", etcd_key ? etcd_key : "",
           etcd_key ? " " : "", name);
    if (campaign_value)
        printf(" value=%s", campaign_value);
    printf("\n");
    fflush(stdout);
    struct stat out;
    bool out_is_pipe = fstat(1, &out) == 0 && S_ISFIFO(out.st_mode);
    for (;;) {
        /* stdin, or with --pid the process's pidfd and stdout's reader */
        struct pollfd fds[4] = {{.fd = held_for.pid ? held_for.pidfd : 0, .events = POLLIN},
                                {.fd = R.lost_fd, .events = POLLIN},
                                {.fd = R.wake_fd, .events = POLLIN},
                                {.fd = held_for.pid && out_is_pipe ? 1 : -1, .events = 0}};
        if (poll(fds, 4, -1) < 0) {
            if (errno == EINTR)
                continue;
            return EXIT_SOFTWARE;
        }
        if (fds[1].revents) {
            pthread_mutex_lock(&R.mu);
            say("%s '%s' lost: %s", campaign_value ? "leadership of" : "lock", name,
                R.lost_why);
            pthread_mutex_unlock(&R.mu);
            tell_held_for();
            return EXIT_LOST;
        }
        if (fds[2].revents)
            return 0; /* signalled: the usual way to end a hold */
        if (held_for.pid) {
            if (fds[0].revents || fds[3].revents)
                return 0; /* the process exited, or closed its end: done with the lock */
        } else if (fds[0].revents) {
            char buf[4096];
            ssize_t n = read(0, buf, sizeof buf);
            if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN) ||
                (fds[0].revents & POLLNVAL))
                return 0; /* end of input: the script is done with the lock */
        }
    }
}

/* What hold_until_done() needs before the lock is taken: with --pid, the
 * process's pidfd and the signal a loss sends it; the eventfd a signal
 * wakes it by. Returns 0 or the exit code, the failure printed. */
static int prepare_hold(const struct run_opts *o)
{
    if (o->pid) {
        held_for.pid = o->pid;
        held_for.pidfd = (int)syscall(SYS_pidfd_open, o->pid, 0);
        if (held_for.pidfd < 0) {
            fprintf(stderr, "dlock %s: --pid %d: %s\n", verb, (int)o->pid, strerror(errno));
            return errno == ESRCH ? EXIT_USAGE : EXIT_SOFTWARE;
        }
        held_for.signal = o->policy.on_lost == LOST_KILL   ? SIGKILL
                          : o->policy.on_lost == LOST_TERM ? SIGTERM
                                                           : 0;
        setpgid(0, 0); /* out of the group a loss may signal */
    }
    R.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (R.wake_fd < 0) {
        fprintf(stderr, "dlock %s: eventfd: %s\n", verb, strerror(errno));
        return EXIT_SOFTWARE;
    }
    return 0;
}

int cmd_hold(const char *url, int argc, char **argv)
{
    struct run_opts o = {.url = url};
    verb = "hold";
    int i = parse_opts(argc, argv, &o);
    if (i < 0)
        return -i;
    const char *name = argv[i++];
    if (o.shell_cmd || i < argc)
        return usage_error("takes no COMMAND ('%s'): it holds NAME until stdin ends or a "
                           "signal comes; use run for a command",
                           o.shell_cmd ? o.shell_cmd : argv[i]);
    int code = prepare_hold(&o);
    if (code)
        return code;
    if (cli_is_path(o.url, name))
        return path_lock_and_run(&o, name, NULL);
    return lock_and_run(&o, &name, 1, NULL);
}

/* ------------------------------------------------------------- paths */

bool cli_is_path(const char *url, const char *name)
{
    struct cli_url from;
    if (cli_choose_url(url, true, &from) == 0 && from.url && *from.url &&
        strncmp(from.url, "file:", 5) != 0)
        return false;
    return name[0] == '/' || strncmp(name, "./", 2) == 0 || strncmp(name, "../", 3) == 0;
}

/* A blocking flock(2) on its own thread, so that a timeout or a signal
 * can give up on it: the thread is then left blocked, and dies with the
 * process, which exits at once (a lock it might still get goes with it). */
struct path_wait {
    int fd, op, rc, err, done_fd;
};

static void *path_waiter(void *arg)
{
    struct path_wait *w = arg;
    while ((w->rc = flock(w->fd, w->op)) < 0 && errno == EINTR)
        ;
    w->err = errno;
    uint64_t one = 1;
    ssize_t n = write(w->done_fd, &one, sizeof one);
    (void)n;
    return NULL;
}

/* Take flock(2) on FD as O says. Returns 0 (held), 1 (busy or timed out),
 * 2 (a signal came: R.signal) or -errno. */
static int path_acquire(const struct run_opts *o, const char *path, int fd)
{
    int op = o->mode == DLOCK_SHARED ? LOCK_SH : LOCK_EX;
    if (flock(fd, op | LOCK_NB) == 0)
        return 0;
    if (errno != EWOULDBLOCK)
        return -errno;
    if (o->verbose) {
        struct cli_flock_info fi;
        char who[600] = "another process";
        if (cli_flock_info(path, &fi) == 0 && fi.held)
            snprintf(who, sizeof who, "pid %s (%s)", fi.pids, fi.shared ? "shared" : "exclusive");
        vlog("'%s' is locked by %s%s", path, who, o->wait_ms == DLOCK_TRY ? "" : "; waiting");
    }
    if (o->wait_ms == DLOCK_TRY)
        return 1;
    static struct path_wait w; /* the thread may outlive this call */
    w = (struct path_wait){.fd = fd, .op = op, .done_fd = eventfd(0, EFD_CLOEXEC)};
    pthread_t t;
    if (w.done_fd < 0 || pthread_create(&t, NULL, path_waiter, &w))
        return -errno;
    pthread_detach(t);
    int64_t deadline = o->wait_ms < 0 ? CLI_NEVER : now_ms() + o->wait_ms;
    for (;;) {
        int64_t now = now_ms();
        int timeout = deadline == CLI_NEVER ? -1
                      : deadline <= now   ? 0
                                          : (int)(deadline - now > 1000000 ? 1000000
                                                                           : deadline - now);
        struct pollfd fds[2] = {{.fd = w.done_fd, .events = POLLIN},
                                {.fd = R.wait_fd, .events = POLLIN}};
        int n = poll(fds, 2, timeout);
        if (n < 0 && errno != EINTR)
            return -errno;
        if (fds[1].revents)
            return 2;
        if (fds[0].revents)
            return w.rc == 0 ? 0 : -w.err;
        if (n == 0 && deadline != CLI_NEVER && now_ms() >= deadline) {
            if (o->verbose)
                vlog("'%s' still locked by another process after %" PRId64 " ms", path,
                     o->wait_ms);
            return 1;
        }
    }
}

/* The path form of run and hold: PATH itself is locked with flock(2), as
 * flock(1) locks it, so the two exclude each other on the same file. No
 * lease and no fencing token (DLOCK_TOKEN is not set); COMMAND inherits
 * the descriptor, so the kernel keeps the lock until the last process of
 * the job has exited. */
static int path_lock_and_run(const struct run_opts *o, const char *path, char **cmd)
{
    sigset_t set, oldmask;
    signal_set(&set);
    pthread_sigmask(SIG_BLOCK, &set, &oldmask);
    signal(SIGPIPE, SIG_IGN);
    /* As flock(1): created when missing, opened read-only, so a file one
     * may only read can be locked too; no link followed in /tmp. */
    int fd = cli_path_open(path);
    if (fd < 0 && errno == ELOOP) {
        fprintf(stderr, "dlock %s: %s is a symbolic link in a directory others may write to: "
                        "refused (it may have been planted to make dlock create or lock another "
                        "file; name the file itself)\n", verb, path);
        return EXIT_NOPERM;
    }
    if (fd < 0) {
        int e = errno;
        fprintf(stderr, "dlock %s: cannot open %s: %s\n", verb, path, strerror(e));
        return e == EACCES || e == EPERM ? EXIT_NOPERM : e == ENOENT ? EXIT_CONFIG
                                                                     : EXIT_UNAVAILABLE;
    }
    R.name = path;
    R.label = quoted_list(&path, 1); /* freed at exit */
    R.wait_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    int code = start_signal_thread();
    if (code) {
        close(fd);
        return code;
    }
    int64_t t0 = now_ms();
    int rc = path_acquire(o, path, fd);
    pthread_mutex_lock(&R.mu);
    int sig = R.signal;
    R.phase = rc ? DONE : RUNNING;
    pthread_mutex_unlock(&R.mu);
    if (rc == 0 && sig)
        rc = 2; /* the signal came as the lock arrived: honour the signal */
    if (rc) {
        if (rc < 0)
            fprintf(stderr, "dlock %s: flock %s: %s\n", verb, path, strerror(-rc));
        else if (rc == 2)
            fprintf(stderr, "dlock %s: interrupted by signal %d while waiting for '%s'\n", verb,
                    sig, path);
        return rc == 1 ? o->conflict : rc == 2 ? 128 + sig : EXIT_UNAVAILABLE;
    }
    if (o->verbose)
        vlog("holding '%s' (%s, flock(2), waited %" PRId64 " ms)", path,
             o->mode == DLOCK_SHARED ? "shared" : "exclusive", now_ms() - t0);
    if (!cmd) {
        code = hold_until_done(path, NULL, o->mode, NULL);
    } else {
        int flags = fcntl(fd, F_GETFD);
        fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC); /* the job's copy of the lock */
        bool at_risk = false;
        code = run_job(o, cmd, child_env(&path, NULL, 0, NULL, NULL), &fd, 1, &oldmask,
                       &at_risk);
    }
    close(fd);
    if (o->verbose)
        vlog(o->leave && cmd ? "left '%s' to what COMMAND started (it keeps the lock's descriptor)"
                             : "released '%s'",
             path);
    return code;
}
