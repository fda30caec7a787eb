/* testutil.c -- see testutil.h. Plain POSIX; no dlock internals. */
#include "testutil.h"

#include <check.h>

#include <arpa/inet.h>
#include <net/if.h>
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dlock.h"

char *tu_fmt(const char *fmt, ...)
{
    va_list ap;
    char *s = NULL;
    va_start(ap, fmt);
    if (vasprintf(&s, fmt, ap) < 0)
        abort();
    va_end(ap);
    return s;
}

void tu_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Whether every thread of PID is stopped ('T' in /proc/PID/task/N/stat). */
static bool all_threads_stopped(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return false;
    bool stopped = true;
    for (struct dirent *e; stopped && (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char stat[512], buf[512];
        snprintf(stat, sizeof stat, "%s/%s/stat", path, e->d_name);
        FILE *f = fopen(stat, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f)
            fclose(f);
        buf[n] = '\0';
        const char *paren = strrchr(buf, ')'); /* the name may hold spaces */
        stopped = paren && (paren[2] == 'T' || paren[2] == 't');
    }
    closedir(d);
    return stopped;
}

void tu_pause(pid_t pid)
{
    ck_assert_int_gt(pid, 0);
    ck_assert_int_eq(kill(pid, SIGSTOP), 0);
    for (int i = 0; i < 2000 && !all_threads_stopped(pid); i++)
        tu_sleep_ms(5);
    ck_assert_msg(all_threads_stopped(pid), "process %d never stopped", (int)pid);
}

char *tu_tmpdir(const char *tag)
{
    const char *base = getenv("TMPDIR");
    char *t = tu_fmt("%s/dlock-test-%s-XXXXXX", base && *base ? base : "/tmp", tag);
    if (!mkdtemp(t))
        abort();
    return t;
}

void tu_rmrf(const char *path)
{
    if (!path || !*path || strcmp(path, "/") == 0)
        return;
    const char *argv[] = {"rm", "-rf", "--", path, NULL};
    tu_run(argv, NULL, NULL, NULL);
}

int tu_free_port(void)
{
    for (int tries = 0; tries < 50; tries++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof a;
        if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
            getsockname(fd, (struct sockaddr *)&a, &len) < 0)
            abort();
        close(fd);
        int port = ntohs(a.sin_port);
        /* Servers often need port+1 free too (etcd peer, zk quorum):
         * keep to the lower part of the ephemeral range. */
        if (port < 65000)
            return port;
    }
    abort();
}

int tu_listen_loopback(int *port, int backlog)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(fd, backlog), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

int tu_dial_loopback(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

bool tu_send_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t w = send(fd, buf, len, MSG_NOSIGNAL);
        if (w <= 0)
            return false;
        buf += w;
        len -= (size_t)w;
    }
    return true;
}

const char *tu_listen_addr(void)
{
    const char *a = getenv("DLOCK_TEST_LISTEN");
    return a && *a ? a : "127.0.0.1";
}

bool tu_wait_port(int port, int timeout_ms)
{
    for (int waited = 0; waited <= timeout_ms; waited += 50) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok)
            return true;
        tu_sleep_ms(50);
    }
    return false;
}

static void child_redirect(const char *log)
{
    int fd = open(log ? log : "/dev/null", O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
    }
}

pid_t tu_spawn_as_nobody(const char *const argv[], const char *log, bool as_nobody)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0)
        abort();
    if (pid == 0) {
        setpgid(0, 0);
        if (as_nobody && geteuid() == 0 &&
            (setgroups(0, NULL) != 0 || setgid(TU_NOBODY) != 0 || setuid(TU_NOBODY) != 0))
            _exit(126);
        /* after a setuid: changing credentials clears the death signal */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int null = open("/dev/null", O_RDONLY);
        dup2(null, 0);
        child_redirect(log);
        if (as_nobody)
            setenv("HOME", "/tmp", 1);
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid);
    return pid;
}

pid_t tu_spawn(const char *const argv[], const char *log)
{
    return tu_spawn_as_nobody(argv, log, false);
}

/* SIGKILL to PID's process group and to PID, then reap it. */
static int kill_now(pid_t pid)
{
    int status = 0;
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return status;
}

int tu_stop(pid_t pid, int grace_ms)
{
    int status = 0;
    if (pid <= 0)
        return 0;
    kill(-pid, SIGTERM);
    kill(pid, SIGTERM);
    for (int waited = 0; waited < grace_ms; waited += 20) {
        if (waitpid(pid, &status, WNOHANG) == pid)
            return status;
        tu_sleep_ms(20);
    }
    return kill_now(pid);
}

void tu_stop_with(pid_t pid, int sig, int grace_ms)
{
    if (sig == SIGKILL)
        kill_now(pid);
    else
        tu_stop(pid, grace_ms);
}

char *tu_read_fd(int fd)
{
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 1 >= cap)
            buf = realloc(buf, cap *= 2);
        ssize_t n = read(fd, buf + len, cap - len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    buf[len] = 0;
    return buf;
}

char *tu_exec_output(const char *path, char *const argv[], char *const envp[])
{
    extern char **environ;
    int p[2];
    ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
    pid_t pid = tu_fork();
    if (pid == 0) {
        dup2(p[1], 1);
        execve(path, argv, envp ? envp : environ);
        _exit(127);
    }
    close(p[1]);
    char *out = tu_read_fd(p[0]);
    close(p[0]);
    ck_assert_int_eq(tu_wait_exit(pid), 0);
    return out;
}

int tu_run(const char *const argv[], const char *const env[], char **out, char **err)
{
    char outpath[] = "/tmp/dlock-tu-out-XXXXXX", errpath[] = "/tmp/dlock-tu-err-XXXXXX";
    int ofd = mkstemp(outpath), efd = mkstemp(errpath);
    unlink(outpath);
    unlink(errpath);
    pid_t pid = fork();
    if (pid < 0)
        abort();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int null = open("/dev/null", O_RDONLY);
        dup2(null, 0);
        dup2(ofd, 1);
        dup2(efd, 2);
        for (size_t i = 0; env && env[i]; i++)
            putenv((char *)env[i]);
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (out) {
        lseek(ofd, 0, SEEK_SET);
        *out = tu_read_fd(ofd);
    }
    if (err) {
        lseek(efd, 0, SEEK_SET);
        *err = tu_read_fd(efd);
    }
    close(ofd);
    close(efd);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}

const char *tu_dlock_bin(void)
{
    const char *b = getenv("DLOCK_BIN");
    return b && *b ? b : "build/dlock";
}

int tu_dlock(char **out, char **err, const char *const env[], const char *const args[])
{
    const char *argv[32] = {tu_dlock_bin()};
    size_t n = 1;
    for (; n < 31 && args[n - 1]; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    return tu_run(argv, env, out, err);
}

void tu_write_marker(const char *path, const char *text)
{
    char *tmp = tu_fmt("%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
        rename(tmp, path);
    }
    free(tmp);
}

int tu_wait_exit(pid_t pid)
{
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void tu_fork_all(int n, int (*child)(int i, void *arg), void *arg)
{
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    ck_assert_ptr_nonnull(pids);
    for (int i = 0; i < n; i++) {
        pids[i] = tu_fork();
        if (pids[i] == 0)
            _exit(child(i, arg));
    }
    for (int i = 0; i < n; i++) {
        int st = tu_wait_exit(pids[i]);
        ck_assert_msg(st == 0, "child %d of %d: exit status %d", i, n, st);
    }
    free(pids);
}

void tu_fork_bounded(int (*child)(void *arg), void *arg)
{
    pid_t pid = tu_fork();
    if (pid == 0) {
        signal(SIGALRM, SIG_DFL);
        alarm(30);
        _exit(child(arg));
    }
    int st = tu_wait_exit(pid);
    ck_assert_msg(st == 0, "child: %s %#x",
                  st == 128 + SIGALRM ? "hung, ended by SIGALRM," : "exit status", st);
}

void *tu_shared_new(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_msg(p != MAP_FAILED, "mmap: %s", strerror(errno));
    return p; /* an anonymous mapping starts zeroed */
}

void tu_shared_free(void *p, size_t size)
{
    munmap(p, size);
}

int tu_inside_enter(struct tu_inside *in)
{
    int now = atomic_fetch_add(&in->now, 1) + 1;
    int max = atomic_load(&in->max);
    while (now > max && !atomic_compare_exchange_weak(&in->max, &max, now))
        ;
    return now;
}

void tu_inside_leave(struct tu_inside *in)
{
    atomic_fetch_sub(&in->now, 1);
    atomic_fetch_add(&in->rounds, 1);
}

/* The syscall thread TID sleeps in, or -1 while it runs (or is gone). */
static long thread_syscall(long tid)
{
    char *path = tu_fmt("/proc/self/task/%ld/syscall", tid);
    char *text = tu_read_file(path);
    long nr = text && text[0] >= '0' && text[0] <= '9' ? strtol(text, NULL, 10) : -1;
    free(text);
    free(path);
    return nr;
}

void tu_thread_detached(void *(*fn)(void *), void *arg)
{
    pthread_t th;
    int rc = pthread_create(&th, NULL, fn, arg);
    ck_assert_msg(rc == 0, "pthread_create: %s", strerror(rc));
    pthread_detach(th);
}

/* tu_wait_thread_asleep(), a clock_nanosleep counted too when TIMED. */
static bool wait_thread_asleep(const atomic_long *tid, int timeout_ms, bool timed)
{
    int seen = 0; /* reads in a row that found it asleep */
    for (int64_t end = tu_mono_ms() + timeout_ms; tu_mono_ms() < end; tu_sleep_ms(5)) {
        long nr = *tid ? thread_syscall(*tid) : -1;
        bool asleep = nr == SYS_futex || nr == SYS_ppoll || (timed && nr == SYS_clock_nanosleep);
#ifdef SYS_poll
        asleep = asleep || nr == SYS_poll;
#endif
        seen = asleep ? seen + 1 : 0;
        if (seen == 3)
            return true;
    }
    return false;
}

bool tu_wait_thread_asleep(const atomic_long *tid, int timeout_ms)
{
    return wait_thread_asleep(tid, timeout_ms, false);
}

bool tu_canceled_wait_returns(struct dlock_lock *l, bool timed_sleeps, pid_t pid, int timeout_ms,
                              int *rc)
{
    dlock_cancel *k = NULL;
    ck_assert_int_eq(dlock_cancel_new(&k), DLOCK_OK);
    struct tu_waiter w;
    tu_waiter_start_ex(&w, l, DLOCK_FOREVER, k, false);
    ck_assert_msg(wait_thread_asleep(&w.tid, 20000, timed_sleeps), "the acquire never blocked");
    ck_assert_int_eq(dlock_cancel_fire(k), DLOCK_OK);
    bool returned = tu_waiter_wait_done(&w, timeout_ms);
    if (pid > 0)
        kill(pid, SIGCONT);
    *rc = tu_waiter_join(&w);
    dlock_cancel_free(k);
    return returned;
}

int64_t tu_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

dlock_client *tu_open(const char *url)
{
    dlock_client *c = NULL;
    int rc = dlock_open(url, &c);
    ck_assert_msg(rc == DLOCK_OK, "dlock_open(%s): %s: %s", url, dlock_err_name(rc),
                  dlock_errmsg());
    return c;
}

dlock_lock *tu_lock_mode(dlock_client *c, const char *name, int mode, unsigned flags)
{
    dlock_lock *l = NULL;
    int rc = dlock_lock_new(c, name, (dlock_mode)mode, flags, &l);
    ck_assert_msg(rc == DLOCK_OK, "dlock_lock_new(%s): %s: %s", name, dlock_err_name(rc),
                  dlock_errmsg());
    return l;
}

dlock_lock *tu_lock(dlock_client *c, const char *name)
{
    return tu_lock_mode(c, name, DLOCK_EXCLUSIVE, 0);
}

static int collect_name(const char *name, void *arg)
{
    char ***v = arg;
    size_t n = tu_count_names(*v);
    char **grown = realloc(*v, (n + 2) * sizeof **v);
    ck_assert_ptr_nonnull(grown);
    *v = grown;
    (*v)[n] = strdup(name);
    (*v)[n + 1] = NULL;
    return 0;
}

char **tu_list_names(dlock_client *c, const char *pattern)
{
    char **v = calloc(1, sizeof *v);
    int rc = dlock_list(c, pattern, collect_name, &v);
    ck_assert_msg(rc == DLOCK_OK, "dlock_list(%s): %s: %s", pattern ? pattern : "NULL",
                  dlock_err_name(rc), dlock_errmsg());
    return v;
}

char *tu_list_text(dlock_client *c, const char *pattern, const char *sep)
{
    char **v = tu_list_names(c, pattern);
    size_t len = 1;
    for (size_t k = 0; v[k]; k++)
        len += strlen(v[k]) + strlen(sep);
    char *text = calloc(1, len);
    for (size_t k = 0; v[k]; k++) {
        strcat(text, v[k]);
        strcat(text, sep);
    }
    tu_free_names(v);
    return text;
}

void tu_free_names(char **v)
{
    for (size_t k = 0; v && v[k]; k++)
        free(v[k]);
    free(v);
}

size_t tu_count_names(char **v)
{
    size_t n = 0;
    while (v[n])
        n++;
    return n;
}

bool tu_listed(char **v, const char *name)
{
    for (size_t k = 0; v[k]; k++)
        if (strcmp(v[k], name) == 0)
            return true;
    return false;
}

void tu_file_fixture(const char *tag, char **dir, char **url)
{
    *dir = tu_tmpdir(tag);
    *url = tu_fmt("file://%s", *dir);
}

void tu_file_fixture_end(char **dir, char **url)
{
    tu_rmrf(*dir);
    free(*dir);
    free(*url);
    *dir = *url = NULL;
}

uint64_t tu_token(dlock_lock *l)
{
    uint64_t t = 0;
    int rc = dlock_token(l, &t);
    ck_assert_msg(rc == DLOCK_OK, "dlock_token(%s): %s", dlock_lock_name(l), dlock_err_name(rc));
    return t;
}

/* dlock_inspect(C, NAME) asserted to work: the holder flag, or (WAITERS)
 * the waiter count. */
static long inspected(dlock_client *c, const char *name, bool waiters)
{
    dlock_info *info = NULL;
    int rc = dlock_inspect(c, name, &info);
    ck_assert_msg(rc == DLOCK_OK, "inspect '%s': %s: %s", name, dlock_err_name(rc), dlock_errmsg());
    long n = waiters ? dlock_info_waiter_count(info) : dlock_info_held(info);
    dlock_info_free(info);
    return n;
}

int tu_held(dlock_client *c, const char *name)
{
    return (int)inspected(c, name, false);
}

long tu_waiters(dlock_client *c, const char *name)
{
    return inspected(c, name, true);
}

void tu_acquire_release(dlock_lock *l, int64_t wait)
{
    TU_ACQUIRE_OK(l, wait);
    TU_RELEASE_OK(l);
}

void tu_free_locks(dlock_lock *const *l, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dlock_lock_free(l[i]);
}

void tu_release_free_all(dlock_lock *const *l, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        TU_RELEASE_OK(l[i]);
        dlock_lock_free(l[i]);
    }
}

void tu_close_clients(dlock_client *const *c, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dlock_client_close(c[i]);
}

uint64_t tu_take_token(dlock_client *c, const char *name)
{
    dlock_lock *l = tu_lock(c, name);
    TU_ACQUIRE_OK(l, DLOCK_TRY);
    uint64_t t = tu_token(l);
    TU_RELEASE_OK(l);
    dlock_lock_free(l);
    return t;
}

uint64_t tu_next_token(dlock_client *c, const char *name, uint64_t last)
{
    uint64_t t = tu_take_token(c, name);
    ck_assert_uint_gt(t, last);
    return t;
}

pid_t tu_fork(void)
{
    pid_t pid = fork();
    ck_assert_msg(pid >= 0, "fork: %s", strerror(errno));
    return pid;
}

pid_t tu_fork_holding(const char *url, const char *name, int mode, int64_t wait, dlock_lock **l)
{
    pid_t pid = tu_fork();
    if (pid > 0)
        return pid;
    dlock_client *c = NULL;
    if (dlock_open(url, &c) || dlock_lock_new(c, name, (dlock_mode)mode, 0, l) ||
        dlock_acquire(*l, wait))
        _exit(10);
    return 0;
}

struct tu_solo tu_solo_open(char *url, const char *name)
{
    struct tu_solo s = {.url = url};
    s.c = tu_open(url);
    s.l = tu_lock(s.c, name);
    return s;
}

int tu_solo_open_quiet(const char *url, const char *name, struct tu_solo *s)
{
    *s = (struct tu_solo){0};
    int rc = dlock_open(url, &s->c);
    if (rc == DLOCK_OK)
        rc = dlock_lock_new(s->c, name, DLOCK_EXCLUSIVE, 0, &s->l);
    if (rc != DLOCK_OK) {
        dlock_client_close(s->c);
        s->c = NULL;
    }
    return rc;
}

void tu_solo_close(struct tu_solo *s)
{
    dlock_lock_free(s->l);
    dlock_client_close(s->c);
    free(s->url);
}

void tu_on_lost(dlock_lock *l, const char *why, void *arg)
{
    (void)l;
    struct tu_lost *f = arg;
    snprintf(f->why, sizeof f->why, "%s", why ? why : "");
    atomic_fetch_add(&f->fired, 1);
}

void tu_on_permit_lost(dlock_semaphore *s, dlock_permit *p, const char *why, void *arg)
{
    (void)s;
    (void)p;
    tu_on_lost(NULL, why, arg);
}

bool tu_wait_lost(struct tu_lost *f, int n, int timeout_ms)
{
    for (int waited = 0; waited < timeout_ms && atomic_load(&f->fired) < n; waited += 10)
        tu_sleep_ms(10);
    return atomic_load(&f->fired) >= n;
}

struct watch {
    dlock_client *c;
    const char *name;
    atomic_int ready; /* the first reading is taken */
    int rc;
    char msg[512];
};

static void *watch_main(void *arg)
{
    struct watch *w = arg;
    dlock_leader *known = NULL;
    w->rc = dlock_election_leader(w->c, w->name, &known);
    atomic_store(&w->ready, 1);
    while (!w->rc && strcmp(dlock_leader_value(known), "after") != 0) {
        dlock_leader *next = NULL;
        w->rc = dlock_election_observe(w->c, w->name, known, DLOCK_FOREVER, NULL, &next);
        dlock_leader_free(known);
        known = next;
    }
    if (w->rc)
        snprintf(w->msg, sizeof w->msg, "%s", dlock_errmsg());
    dlock_leader_free(known);
    return NULL;
}

void tu_watch_across_restart(const char *url, const char *name, void (*restart)(void *arg),
                             void *arg)
{
    dlock_client *a = tu_open(url), *b = tu_open(url), *o = tu_open(url);
    dlock_election *ea = NULL, *eb = NULL;
    ck_assert_int_eq(dlock_election_new(a, name, 0, &ea), DLOCK_OK);
    ck_assert_int_eq(dlock_election_new(b, name, 0, &eb), DLOCK_OK);
    int rc = dlock_election_campaign(ea, "before", DLOCK_TRY, NULL);
    ck_assert_msg(rc == DLOCK_OK, "campaign: %s: %s", dlock_err_name(rc), dlock_errmsg());
    struct watch w = {.c = o, .name = name};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, watch_main, &w), 0);
    while (!atomic_load(&w.ready))
        tu_sleep_ms(10);
    restart(arg);
    (void)dlock_election_resign(ea);
    rc = dlock_election_campaign(eb, "after", DLOCK_FOREVER, NULL); /* the test's limit */
    ck_assert_msg(rc == DLOCK_OK, "campaign after the restart: %s: %s", dlock_err_name(rc),
                  dlock_errmsg());
    pthread_join(th, NULL);
    ck_assert_msg(w.rc == DLOCK_OK, "the watch ended: %s: %s", dlock_err_name(w.rc), w.msg);
    dlock_election_free(ea);
    dlock_election_free(eb);
    TU_CLOSE_CLIENTS(a, b, o);
}

struct tu_pair tu_pair_of(dlock_client *a, dlock_client *b, const char *name)
{
    struct tu_pair p = {.a = a, .b = b};
    p.la = tu_lock(a, name);
    p.lb = tu_lock(b, name);
    return p;
}

void tu_pair_watch_lost(struct tu_pair *p)
{
    int rc = dlock_lock_on_lost(p->la, tu_on_lost, &p->lost);
    ck_assert_msg(rc == DLOCK_OK, "on_lost: %s", dlock_err_name(rc));
}

void tu_pair_close(struct tu_pair *p)
{
    dlock_lock_free(p->la);
    dlock_lock_free(p->lb);
    dlock_client_close(p->a);
    dlock_client_close(p->b);
}

static void *waiter_main(void *arg)
{
    struct tu_waiter *w = arg;
    w->tid = (long)syscall(SYS_gettid);
    w->rc = dlock_acquire_ex(w->l, w->wait, w->cancel);
    if (w->rc == DLOCK_OK) {
        dlock_token(w->l, &w->token);
        if (!w->keep)
            dlock_release(w->l);
    }
    atomic_store(&w->done, 1);
    return NULL;
}

void tu_waiter_start_ex(struct tu_waiter *w, dlock_lock *l, int64_t wait, dlock_cancel *cancel,
                        bool keep)
{
    *w = (struct tu_waiter){.l = l, .wait = wait, .cancel = cancel, .keep = keep, .rc = 1};
    ck_assert_int_eq(pthread_create(&w->th, NULL, waiter_main, w), 0);
}

void tu_waiter_start(struct tu_waiter *w, dlock_lock *l, int64_t wait)
{
    tu_waiter_start_ex(w, l, wait, NULL, false);
}

int tu_waiter_join(struct tu_waiter *w)
{
    pthread_join(w->th, NULL);
    return w->rc;
}

void tu_waiter_cancel_until_returned(struct tu_waiter *w)
{
    for (;;) {
        int rc = dlock_lock_cancel(w->l);
        ck_assert_msg(rc == DLOCK_OK, "cancel: %s", dlock_err_name(rc));
        if (pthread_tryjoin_np(w->th, NULL) == 0)
            return;
        tu_sleep_ms(10);
    }
}

bool tu_waiter_wait_done(struct tu_waiter *w, int timeout_ms)
{
    for (int waited = 0; waited < timeout_ms && !atomic_load(&w->done); waited += 10)
        tu_sleep_ms(10);
    return atomic_load(&w->done) != 0;
}

struct exclusion_turns {
    dlock_lock *l;
    int rounds;
    int64_t wait;
    atomic_int *inside;
    int *counter;
    int bad, rc;
};

static void *exclusion_main(void *arg)
{
    struct exclusion_turns *t = arg;
    for (int i = 0; i < t->rounds && !t->rc; i++) {
        if ((t->rc = dlock_acquire(t->l, t->wait)))
            break;
        if (atomic_fetch_add(t->inside, 1) != 0)
            t->bad++; /* two holders at once */
        int v = *t->counter;
        if (i % 3 == 0)
            tu_sleep_ms(1);
        else
            sched_yield();
        *t->counter = v + 1;
        atomic_fetch_sub(t->inside, 1);
        t->rc = dlock_release(t->l);
    }
    return NULL;
}

void tu_exclusion_run(dlock_lock *const *l, size_t n, int threads, int rounds, int64_t wait)
{
    atomic_int inside = 0;
    int counter = 0;
    struct exclusion_turns *t = calloc((size_t)threads, sizeof *t);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    ck_assert(t && th);
    for (int i = 0; i < threads; i++) {
        t[i] = (struct exclusion_turns){l[(size_t)i % n], rounds, wait, &inside, &counter, 0, 0};
        pthread_create(&th[i], NULL, exclusion_main, &t[i]);
    }
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        ck_assert_msg(t[i].rc == DLOCK_OK, "thread %d: %s", i, dlock_err_name(t[i].rc));
        ck_assert_msg(t[i].bad == 0, "thread %d saw another holder inside", i);
    }
    ck_assert_int_eq(counter, threads * rounds);
    free(th);
    free(t);
}

static void *sem_taker_main(void *arg)
{
    struct tu_sem_taker *t = arg;
    t->tid = (long)syscall(SYS_gettid);
    dlock_permit *p = NULL;
    t->rc = dlock_semaphore_acquire(t->s, t->k, t->wait, t->cancel, &p);
    if (p)
        dlock_permit_release(p);
    return NULL;
}

void tu_sem_taker_start(struct tu_sem_taker *t, dlock_semaphore *s, unsigned k, int64_t wait,
                        dlock_cancel *cancel)
{
    *t = (struct tu_sem_taker){.s = s, .k = k, .wait = wait, .cancel = cancel, .rc = 1};
    ck_assert_int_eq(pthread_create(&t->th, NULL, sem_taker_main, t), 0);
}

int tu_sem_taker_join(struct tu_sem_taker *t)
{
    pthread_join(t->th, NULL);
    return t->rc;
}

void tu_sem_full(dlock_client *c, dlock_semaphore *s, const char *name, unsigned permits,
                 size_t holders)
{
    dlock_permit *p = NULL;
    ck_assert_int_eq(dlock_semaphore_acquire(s, 1, DLOCK_TRY, NULL, &p), DLOCK_EBUSY);
    dlock_info *info = NULL;
    int rc = dlock_semaphore_inspect(c, name, permits, &info);
    ck_assert_msg(rc == DLOCK_OK, "inspect '%s': %s", name, dlock_errmsg());
    ck_assert_uint_eq(dlock_info_holder_count(info), holders);
    ck_assert_int_eq(dlock_info_free_permits(info), 0);
    dlock_info_free(info);
}

dlock_semaphore *tu_semaphore(dlock_client *c, const char *name, unsigned permits)
{
    dlock_semaphore *s = NULL;
    int rc = dlock_semaphore_new(c, name, permits, 0, &s);
    ck_assert_msg(rc == DLOCK_OK, "semaphore_new '%s': %s: %s", name, dlock_err_name(rc),
                  dlock_errmsg());
    return s;
}

dlock_permit *tu_permit(dlock_semaphore *s, unsigned k, int64_t wait)
{
    dlock_permit *p = NULL;
    int rc = dlock_semaphore_acquire(s, k, wait, NULL, &p);
    ck_assert_msg(rc == DLOCK_OK, "semaphore_acquire '%s' of %u: %s: %s", dlock_semaphore_name(s),
                  k, dlock_err_name(rc), dlock_errmsg());
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq(dlock_permit_count(p), k);
    return p;
}

struct tu_sem_pair tu_sem_pair_open(const char *url, const char *name, unsigned permits)
{
    struct tu_sem_pair p = {tu_open(url), tu_open(url), NULL, NULL};
    p.sa = tu_semaphore(p.a, name, permits);
    p.sb = tu_semaphore(p.b, name, permits);
    return p;
}

void tu_sem_pair_close(struct tu_sem_pair *p)
{
    dlock_semaphore_free(p->sa);
    dlock_semaphore_free(p->sb);
    dlock_client_close(p->a);
    dlock_client_close(p->b);
    memset(p, 0, sizeof *p);
}

void tu_write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    fputs(text, f);
    fclose(f);
}

char *tu_read_file(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return NULL;
    char *s = tu_read_fd(fd);
    close(fd);
    return s;
}

uint64_t tu_read_u64(const char *path)
{
    char *s = tu_read_file(path);
    ck_assert_msg(s != NULL, "missing %s", path);
    uint64_t v = strtoull(s, NULL, 10);
    free(s);
    return v;
}

bool tu_wait_file(const char *path, int timeout_ms)
{
    for (int waited = 0; waited <= timeout_ms; waited += 10) {
        if (access(path, F_OK) == 0)
            return true;
        tu_sleep_ms(10);
    }
    return false;
}

static size_t tests_added;

/* Whether "TCASE/NAME" is what PATTERN names: a glob, or else a
 * substring of it. */
static bool name_matches(const char *pattern, const char *tcase, const char *name)
{
    char *full = tu_fmt("%s/%s", tcase, name);
    bool glob = strpbrk(pattern, "*?[") != NULL;
    bool ok = glob ? fnmatch(pattern, full, 0) == 0 : strstr(full, pattern) != NULL;
    free(full);
    return ok;
}

/* DLOCK_TEST picks tests; DLOCK_SKIP_TESTS (globs or substrings separated
 * by spaces) leaves some out, saying so on stderr. */
static bool name_selected(const char *tcase, const char *name)
{
    const char *want = getenv("DLOCK_TEST");
    if (want && *want && !name_matches(want, tcase, name))
        return false;
    const char *skip = getenv("DLOCK_SKIP_TESTS");
    while (skip && *(skip += strspn(skip, " "))) {
        size_t len = strcspn(skip, " ");
        char *pattern = tu_fmt("%.*s", (int)len, skip);
        bool left_out = name_matches(pattern, tcase, name);
        free(pattern);
        if (left_out) {
            fprintf(stderr, "%s/%s left out of this run (DLOCK_SKIP_TESTS)\n", tcase, name);
            return false;
        }
        skip += len;
    }
    return true;
}

TCase *tu_add_tests(Suite *s, const char *tcase, const struct tu_test *tests, size_t n)
{
    TCase *tc = NULL;
    int timeout = 0;
    for (size_t i = 0; i < n; i++) {
        if (!name_selected(tcase, tests[i].name))
            continue;
        if (!tc)
            tc = tcase_create(tcase);
        tcase_add_test(tc, tests[i].fn);
        int t = tests[i].timeout > 0 ? tests[i].timeout : 60;
        if (getenv("DLOCK_TEST_LIST"))
            printf("%s/%s %d\n", tcase, tests[i].name, t);
        if (t > timeout)
            timeout = t;
        tests_added++;
    }
    if (tc) {
        tcase_set_timeout(tc, timeout);
        suite_add_tcase(s, tc);
    }
    return tc;
}

int tu_run_suite(Suite *s)
{
    const char *want = getenv("DLOCK_TEST");
    if (want && *want && tests_added == 0)
        fprintf(stderr, "DLOCK_TEST=%s matches no test of this binary\n", want);
    SRunner *sr = srunner_create(s);
    int failed = 0;
    if (!getenv("DLOCK_TEST_LIST")) {
        srunner_set_fork_status(sr, CK_FORK);
        srunner_run_all(sr, CK_NORMAL);
        failed = srunner_ntests_failed(sr);
    }
    srunner_free(sr);
    return failed ? 1 : 0;
}

/* What TU_TEST and TU_CASE registered, each list kept in the order of the
 * source (constructors run in no promised order). */
static struct tu_reg *registered;
static struct tu_case *cases;

static bool written_before(const char *file_a, int line_a, const char *file_b, int line_b)
{
    int c = strcmp(file_a, file_b);
    return c < 0 || (c == 0 && line_a < line_b);
}

void tu_register(struct tu_reg *r)
{
    struct tu_reg **at = &registered;
    while (*at && written_before((*at)->tt->file, (*at)->tt->line, r->tt->file, r->tt->line))
        at = &(*at)->next;
    r->next = *at;
    *at = r;
}

void tu_register_case(struct tu_case *c)
{
    struct tu_case **at = &cases;
    while (*at && (*at)->line < c->line)
        at = &(*at)->next;
    c->next = *at;
    *at = c;
}

struct tu_test *tu_registered(const struct tu_case *tcase, size_t *n)
{
    size_t k = 0;
    for (struct tu_reg *r = registered; r; r = r->next)
        k += r->tcase == tcase;
    struct tu_test *t = calloc(k ? k : 1, sizeof *t);
    if (!t)
        abort(); /* before any test runs: no Check assertion yet */
    *n = 0;
    for (struct tu_reg *r = registered; r; r = r->next)
        if (r->tcase == tcase)
            t[(*n)++] = (struct tu_test){r->tt->name, r->tt, r->timeout};
    return t;
}

/* Whether the first LEN characters of A name B, '_' and '-' alike. */
static bool same_fixture(const char *a, size_t len, const char *b)
{
    for (size_t i = 0; i < len; i++, b++)
        if (!*b || (a[i] != *b && !(strchr("-_", a[i]) && strchr("-_", *b))))
            return false;
    return *b == 0;
}

bool tu_fixture_skipped(const char *suite, const char *fixture)
{
    const char *p = getenv("DLOCK_SKIP_FIXTURES");
    while (p && *(p += strspn(p, " ,"))) {
        size_t len = strcspn(p, " ,");
        if (same_fixture(p, len, fixture)) {
            fprintf(stderr, "%s: %s left out of this run (DLOCK_SKIP_FIXTURES)\n", suite, fixture);
            return true;
        }
        p += len;
    }
    return false;
}

void tu_skip_fixture_tests(const char *suite)
{
    for (struct tu_reg **at = &registered; *at;)
        if (!(*at)->tcase && tu_fixture_skipped(suite, (*at)->tt->name))
            *at = (*at)->next;
        else
            at = &(*at)->next;
}

bool tu_long(void)
{
    const char *v = getenv("DLOCK_LONG");
    return v && strcmp(v, "1") == 0;
}

void tu_long_only(const char *suite, const char *test)
{
    if (tu_long())
        return;
    for (struct tu_reg **at = &registered; *at; at = &(*at)->next)
        if (!(*at)->tcase && strcmp((*at)->tt->name, test) == 0) {
            fprintf(stderr, "%s: %s left out of this run (a long schedule: make check-long)\n",
                    suite, test);
            *at = (*at)->next;
            return;
        }
}

/* The tests registered in TCASE as Check's test case NAME, with SETUP and
 * TEARDOWN around each test (EACH) or around the case. */
static void add_registered(Suite *s, const char *name, const struct tu_case *tcase,
                           void (*setup)(void), void (*teardown)(void), bool each)
{
    size_t n;
    struct tu_test *tests = tu_registered(tcase, &n);
    TCase *tc = tu_add_tests(s, name, tests, n);
    free(tests);
    if (!tc || (!setup && !teardown))
        return;
    if (each)
        tcase_add_checked_fixture(tc, setup, teardown);
    else
        tcase_add_unchecked_fixture(tc, setup, teardown);
}

int tu_main(const char *suite, void (*setup)(void), void (*teardown)(void))
{
    Suite *s = suite_create(suite);
    add_registered(s, suite, NULL, setup, teardown, true);
    for (const struct tu_case *c = cases; c; c = c->next)
        add_registered(s, c->name, c, c->setup, c->teardown, c->around == TU_AROUND_EACH);
    return tu_run_suite(s);
}

/* ------------------------------------------------------ a fenced store */

bool tu_fenced_write(const char *path, uint64_t token)
{
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0)
        return false;
    flock(fd, LOCK_EX);
    char buf[128] = {0};
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    unsigned long long max = 0, count = 0, stale = 0;
    if (n > 0)
        sscanf(buf, "%llu %llu %llu", &max, &count, &stale);
    bool ok = token >= max;
    if (ok) {
        max = token;
        count++;
    } else {
        stale++;
    }
    int len = snprintf(buf, sizeof buf, "%llu %llu %llu\n", max, count, stale);
    if (ftruncate(fd, 0) == 0 && pwrite(fd, buf, (size_t)len, 0) == len)
        fsync(fd);
    flock(fd, LOCK_UN);
    close(fd);
    return ok;
}

uint64_t tu_fenced_count(const char *path, uint64_t *stale)
{
    unsigned long long max = 0, count = 0, refused = 0;
    char *text = tu_read_file(path);
    if (text)
        sscanf(text, "%llu %llu %llu", &max, &count, &refused);
    free(text);
    if (stale)
        *stale = refused;
    return count;
}

pid_t tu_fenced_worker(const char *url, const char *dir, const struct tu_fenced_turn *turn)
{
    pid_t pid = tu_fork();
    if (pid > 0)
        return pid;
    char *store = tu_fmt("%s/store", dir), *stop = tu_fmt("%s/stop", dir);
    char *mine = tu_fmt("%s/count.%d", dir, (int)getpid());
    dlock_client *c = NULL;
    while (dlock_open(url, &c) != DLOCK_OK) {
        if (access(stop, F_OK) == 0)
            _exit(30);
        tu_sleep_ms(100);
    }
    dlock_lock *l = NULL;
    dlock_lock_new(c, "fenced", DLOCK_EXCLUSIVE, 0, &l);
    unsigned long long accepted = 0, turns = 0, lost = 0, failures = 0;
    while (access(stop, F_OK) != 0) {
        int rc = dlock_acquire(l, 2000);
        if (rc == DLOCK_ETIMEDOUT)
            continue;
        if (rc != DLOCK_OK) { /* while the leader is gone */
            if (rc != DLOCK_ECONN && rc != DLOCK_EUNAVAIL && rc != DLOCK_ELOST)
                _exit(31);
            failures++;
            tu_sleep_ms(100);
            continue;
        }
        uint64_t tok = 0;
        dlock_token(l, &tok);
        for (int i = 0; i < turn->writes && dlock_validity_ms(l) > turn->min_validity_ms; i++) {
            if (!tu_fenced_write(store, tok))
                _exit(32); /* a stale holder wrote: two holders */
            accepted++;
            tu_sleep_ms(turn->pause_ms);
        }
        turns++;
        rc = dlock_release(l);
        if (rc != DLOCK_OK && rc != DLOCK_ELOST && rc != DLOCK_ECONN && rc != DLOCK_EUNAVAIL)
            _exit(33);
        lost += rc == DLOCK_ELOST;
        if (turn->rest_ms)
            tu_sleep_ms(turn->rest_ms);
    }
    char *text = tu_fmt("%llu %llu %llu %llu", accepted, turns, lost, failures);
    tu_write_marker(mine, text);
    free(text);
    free(mine);
    free(store);
    free(stop);
    dlock_lock_free(l);
    dlock_client_close(c);
    _exit(0);
}

uint64_t tu_fenced_stop(const pid_t *w, int n, const char *dir, const char *what)
{
    char *stop = tu_fmt("%s/stop", dir);
    tu_write_marker(stop, "1");
    free(stop);
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        int code = tu_wait_exit(w[i]);
        ck_assert_msg(code == 0, "worker %d exited %d", i, code);
        char *path = tu_fmt("%s/count.%d", dir, (int)w[i]);
        char *text = tu_read_file(path);
        ck_assert_ptr_nonnull(text);
        total += strtoull(text, NULL, 10);
        fprintf(stderr, "%s: worker %d: writes, turns, lost, failed acquires: %s\n", what, i, text);
        free(text);
        free(path);
    }
    return total;
}

/* A name server that never answers, for this process only: a private
 * mount and network namespace (a user namespace too when not root), its
 * own loopback up, /etc/resolv.conf bound over by one naming a UDP socket
 * on 127.0.0.1:53 that reads and never replies, with the resolver's own
 * timeout far longer than any connect timeout here. Returns the socket. */
int tu_silent_name_server(void)
{
    char *dir = tu_tmpdir("resolv");
    char *conf = tu_fmt("%s/resolv.conf", dir);
    tu_write_file(conf, "nameserver 127.0.0.1\noptions timeout:30 attempts:1\n");
    int flags = CLONE_NEWNS | CLONE_NEWNET | (geteuid() != 0 ? CLONE_NEWUSER : 0);
    ck_assert_msg(unshare(flags) == 0, "unshare: %s (needs root or user namespaces)",
                  strerror(errno));
    ck_assert_int_eq(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL), 0);
    ck_assert_msg(mount(conf, "/etc/resolv.conf", NULL, MS_BIND, NULL) == 0,
                  "mount resolv.conf: %s", strerror(errno));
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct ifreq ifr = {0};
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
    ck_assert_int_eq(ioctl(fd, SIOCGIFFLAGS, &ifr), 0);
    ifr.ifr_flags |= IFF_UP;
    ck_assert_msg(ioctl(fd, SIOCSIFFLAGS, &ifr) == 0, "lo up: %s", strerror(errno));
    struct sockaddr_in at = {.sin_family = AF_INET,
                             .sin_port = htons(53),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_msg(bind(fd, (struct sockaddr *)&at, sizeof at) == 0, "bind :53: %s",
                  strerror(errno));
    free(conf);
    free(dir); /* (left on disk: the bind mount uses it; the namespace ends with the test) */
    return fd;
}
