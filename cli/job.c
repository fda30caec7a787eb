/* job.c -- COMMAND and everything it starts, as one job that never runs
 * without its lock.
 *
 * dlock does not fork COMMAND itself. It forks a guardian, a small
 * single-purpose process, which forks COMMAND into a process group of its
 * own and stays its parent:
 *
 *   dlock (threads, the lock) --ctl pipe--> guardian --> COMMAND (own group)
 *                             <-report----  (subreaper)    `-> its children
 *
 * - The guardian is a child subreaper (PR_SET_CHILD_SUBREAPER): whatever
 *   COMMAND's descendants orphan -- a double fork, a `setsid` daemon --
 *   is reparented to it, not to init, so it sees every process of the job
 *   and reports the job done only once the last of them has exited.
 * - dlock asks for a signal by writing its number on the ctl pipe; the
 *   guardian sends it to COMMAND's process group and to every descendant
 *   it finds under /proc/PID/task/TID/children (those that left the group
 *   with setsid or setpgid included).
 * - If dlock dies, even by SIGKILL, the kernel closes the ctl pipe's write
 *   end: the guardian reads end-of-file, SIGKILLs the whole job and exits
 *   once it is gone. On the file backend the guardian and COMMAND hold an
 *   inherited copy of the lock's descriptor (dlock_lock_inherit_fd), so
 *   the kernel keeps the lock until the last of them has exited, never
 *   "as dlock dies, before its job does".
 * - dlock gives the guardian the hold's deadline, anew as renewals extend
 *   it (cli_job_deadline), and the guardian keeps it: SIGTERM (or what
 *   --on-lost says) when it comes, SIGKILL a little later, and a report
 *   (JOB_AT_RISK). So the job is stopped before the lease can end even
 *   when dlock itself is stopped (SIGSTOP, a debugger) or frozen.
 * - COMMAND has PR_SET_PDEATHSIG = SIGKILL against the guardian, should the
 *   guardian itself be killed; dlock is a child subreaper too, so what is
 *   left of the job then is reparented to dlock, which kills it through
 *   pidfds (cli_job_kill_orphans) -- never by COMMAND's process group,
 *   which may be empty by then and its number another group's.
 *
 * Why not a PID namespace or a cgroup: both would also catch a process
 * that escapes to another subreaper, but an unprivileged PID namespace
 * needs a user namespace (setuid programs such as sudo stop working in
 * it, and many hosts disable them), and a cgroup needs a delegated
 * subtree, which cron, CI runners and containers rarely give. The
 * subreaper and the process group work for every user on every Linux
 * since 3.4.
 *
 * The guardian has a process group of its own too, so that a SIGKILL to
 * dlock's group (timeout(1), a CI runner, `kill -9 -PGID`) leaves it
 * alive to kill the job, rather than killing the guardian beside dlock and
 * orphaning COMMAND's descendants. For the same reason it goes by another
 * name (CLI_GUARDIAN_NAME: comm and command line), which `killall dlock`,
 * `pkill dlock` and `pkill -f dlock` do not match. Killing both by pid
 * still orphans COMMAND's descendants (to init): only a PID namespace,
 * refused above, would take them along.
 *
 * A process group, not a session: a new session would cut COMMAND off
 * its terminal (/dev/tty prompts of ssh or sudo). When dlock runs in the
 * foreground of a terminal, the guardian hands the terminal to COMMAND's
 * group (as a shell does for a job) and takes it back at the end; when
 * COMMAND is stopped from the terminal (^Z), the guardian stops dlock's
 * group with the terminal given back, so the shell sees its job stopped;
 * on `fg` the shell continues dlock, which passes SIGCONT on, and the
 * guardian then gives the terminal to COMMAND again and continues it.
 *
 * The guardian is forked from a process with threads, so it keeps to
 * system calls and to what glibc makes safe after fork.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* Close descriptors LO..HI (in a child after fork: syscalls only).
 * Without close_range (Linux < 5.9), one close per number below LIMIT. */
static void close_span(unsigned lo, unsigned hi, unsigned limit)
{
    if (lo > hi)
        return;
#ifdef SYS_close_range
    if (syscall(SYS_close_range, lo, hi, 0) == 0)
        return;
#endif
    for (unsigned fd = lo; fd <= hi && fd < limit; fd++)
        close((int)fd);
}

/* Close every descriptor above 2 but those in KEEP (N, ascending). */
static void close_all_but(const int *keep, size_t n, unsigned limit)
{
    unsigned lo = 3;
    for (size_t i = 0; i < n; i++) {
        if (keep[i] < 0 || (unsigned)keep[i] < lo)
            continue;
        if ((unsigned)keep[i] > lo)
            close_span(lo, (unsigned)keep[i] - 1, limit);
        lo = (unsigned)keep[i] + 1;
    }
    close_span(lo, ~0U, limit);
}

static void report(int fd, int event, int value)
{
    struct cli_job_report r = {event, value};
    ssize_t n = write(fd, &r, sizeof r);
    (void)n; /* dlock is gone: nobody to tell */
}

/* The parent of PID by /proc/PID/stat, -1 when it is gone. */
static pid_t parent_of(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command name may hold anything */
    int ppid;
    return p && sscanf(p + 1, " %*c %d", &ppid) == 1 ? (pid_t)ppid : -1;
}

/* SIG to PID, through its pidfd PFD when there is one. */
static void signal_pid(pid_t pid, int pfd, int sig)
{
#ifdef SYS_pidfd_send_signal
    if (pfd >= 0 && syscall(SYS_pidfd_send_signal, pfd, sig, NULL, 0) == 0)
        return;
    if (pfd >= 0)
        return; /* gone, or its pid reused: not ours to signal */
#else
    (void)pfd;
#endif
    kill(pid, sig);
}

/* Call FN(KID, ARG) for each child of PARENT that
 * /proc/PARENT/task/TID/children lists (PARENT's threads each have a
 * list); false when PARENT's tasks cannot be read. */
static bool each_child(pid_t parent, void (*fn)(pid_t kid, void *arg), void *arg)
{
    char path[96];
    snprintf(path, sizeof path, "/proc/%d/task", (int)parent);
    DIR *d = opendir(path);
    if (!d)
        return false;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/proc/%d/task/%.20s/children", (int)parent, de->d_name);
        char buf[4096];
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
        if (fd >= 0)
            close(fd);
        if (n <= 0)
            continue;
        buf[n] = 0;
        for (char *p = buf, *end; *p; p = end) {
            long kid = strtol(p, &end, 10);
            if (end == p)
                break;
            fn((pid_t)kid, arg);
        }
    }
    closedir(d);
    return true;
}

struct tree_signal {
    pid_t parent, pgid;
    int sig, depth;
};

static void signal_tree(pid_t parent, pid_t pgid, int sig, int depth);

/* signal_tree() of child KID of T->parent, then KID itself. */
static void signal_subtree(pid_t kid, void *arg)
{
    const struct tree_signal *t = arg;
    int pfd = -1;
#ifdef SYS_pidfd_open
    pfd = (int)syscall(SYS_pidfd_open, kid, 0);
    if (pfd < 0 && errno != ENOSYS)
        return; /* gone already */
#endif
    if (parent_of(kid) == t->parent) {
        signal_tree(kid, t->pgid, t->sig, t->depth + 1);
        if (getpgid(kid) != t->pgid) /* else it had SIG with the group */
            signal_pid(kid, pfd, t->sig);
    }
    if (pfd >= 0)
        close(pfd);
}

/* Send SIG to every descendant of PARENT found through
 * /proc/PARENT/task/TID/children, the deepest first, but those in process
 * group PGID (signalled with the group already: once is enough). Each is
 * signalled through a pidfd taken while it is still PARENT's child, so a
 * pid reused meanwhile by another process is never hit. */
static void signal_tree(pid_t parent, pid_t pgid, int sig, int depth)
{
    struct tree_signal t = {parent, pgid, sig, depth};
    if (depth < 64)
        each_child(parent, signal_subtree, &t);
}

/* SIG to the whole job: COMMAND's group, then every process below us. */
static void signal_job(pid_t pgid, int sig)
{
    kill(-pgid, sig);
    signal_tree(getpid(), pgid, sig, 0);
}

/* COMMAND was stopped. Interactive: do as a shell expects of its job --
 * give the terminal back to dlock's group (J->parent_pgrp) and stop it;
 * `fg` continues dlock, which sends SIGCONT on (see continue_job).
 * Otherwise whoever stopped it will continue it. */
static void job_stopped(const struct cli_job *j)
{
    if (j->tty_fd < 0)
        return;
    tcsetpgrp(j->tty_fd, j->parent_pgrp);
    kill(-j->parent_pgrp, SIGTSTP);
}

/* SIGCONT from dlock: if the shell gave dlock the terminal back (fg),
 * hand it to COMMAND's group (PGID) before the job goes on. */
static void continue_job(const struct cli_job *j, pid_t pgid)
{
    if (j->tty_fd >= 0 && tcgetpgrp(j->tty_fd) == j->parent_pgrp)
        tcsetpgrp(j->tty_fd, pgid);
}

/* main()'s arguments, contiguous as the kernel lays them out: what
 * /proc/PID/cmdline shows, which the guardian writes its name over. */
static char *args_area;
static size_t args_len;

void cli_job_note_args(int argc, char **argv)
{
    if (argc < 1 || !argv[0])
        return;
    char *end = argv[0];
    for (int k = 0; k < argc && argv[k] == end; k++)
        end = argv[k] + strlen(argv[k]) + 1;
    args_area = argv[0];
    args_len = (size_t)(end - argv[0]);
}

/* Go by CLI_GUARDIAN_NAME from now on: the process name (comm, what
 * killall and pkill match) and the command line (pkill -f, ps). Only
 * main()'s argument strings are written over: COMMAND's are copies. */
static void take_guardian_name(void)
{
    prctl(PR_SET_NAME, CLI_GUARDIAN_NAME);
    if (!args_len)
        return;
    size_t n = strlen(CLI_GUARDIAN_NAME);
    if (n >= args_len)
        n = args_len - 1;
    memset(args_area, 0, args_len);
    memcpy(args_area, CLI_GUARDIAN_NAME, n);
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* What dlock writes on the ctl pipe (one write each, atomic): pass a
 * signal on, the hold's deadline, or stop the job now. */
enum { ORDER_SIGNAL = 1, ORDER_DEADLINE, ORDER_STOP };
struct order {
    int kind, sig;
    int64_t first_at, kill_at; /* CLOCK_MONOTONIC ms, CLI_NEVER: none */
};

static void send_order(struct cli_job *j, struct order o)
{
    if (j->ctl_fd < 0)
        return;
    ssize_t n = write(j->ctl_fd, &o, sizeof o);
    (void)n; /* the guardian is gone: so is the job */
}

/* The guardian's timers, set by dlock's orders: the deadline's first
 * signal (SIG at FIRST_AT, until the job is being stopped: STOPPING) and
 * SIGKILL at KILL_AT. */
struct timers {
    int sig;
    int64_t first_at, kill_at;
    bool stopping;
};

/* Fire the timers of T that are due, as signals to the job (COMMAND's
 * group PGID and all below); a deadline passed is reported on REP.
 * Returns the poll timeout until the next, -1 for none. Sets *KILLING
 * once SIGKILL went out. */
static int fire_timers(struct timers *t, pid_t pgid, int rep, bool *killing)
{
    int64_t now = mono_ms();
    if (!t->stopping && t->first_at <= now) {
        signal_job(pgid, t->sig);
        *killing |= t->sig == SIGKILL;
        t->stopping = true;
        report(rep, JOB_AT_RISK, 0); /* dlock may be stopped: it reads this later */
    }
    if (t->kill_at <= now) {
        signal_job(pgid, SIGKILL);
        *killing = true;
        t->kill_at = CLI_NEVER;
    }
    int64_t next = t->kill_at;
    if (!t->stopping && t->first_at < next)
        next = t->first_at;
    return next == CLI_NEVER ? -1 : next - now > 1000000 ? 1000000 : (int)(next - now);
}

/* Carry out dlock's order O for job J (COMMAND's group PGID) with timers
 * T; sets *KILLING once SIGKILL went out. */
static void obey(const struct cli_job *j, pid_t pgid, const struct order *o, struct timers *t,
                 bool *killing)
{
    switch (o->kind) {
    case ORDER_SIGNAL:
        if (o->sig == 0)
            return;
        if (o->sig == SIGCONT)
            continue_job(j, pgid);
        signal_job(pgid, o->sig);
        *killing |= o->sig == SIGKILL;
        return;
    case ORDER_DEADLINE:
        if (t->stopping)
            return; /* the job is being stopped: no later deadline saves it */
        t->sig = o->sig;
        t->first_at = o->first_at;
        t->kill_at = o->first_at == CLI_NEVER ? CLI_NEVER : o->kill_at;
        return;
    case ORDER_STOP:
        if (o->sig)
            signal_job(pgid, o->sig);
        *killing |= o->sig == SIGKILL;
        t->stopping = true;
        if (o->kill_at < t->kill_at)
            t->kill_at = o->kill_at;
        return;
    }
}

static _Noreturn void guardian(const struct cli_job *j, int ctl, int rep, unsigned limit)
{
    take_guardian_name();
    setpgid(0, 0);
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    close_all_but(j->keep, j->nkeep, limit);
    sigset_t chld, ttou;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigemptyset(&ttou);
    sigaddset(&ttou, SIGTTOU); /* tcsetpgrp from a background group */
    sigprocmask(SIG_BLOCK, &chld, NULL);
    sigprocmask(SIG_BLOCK, &ttou, NULL);
    int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK), ep[2];
    if (sfd < 0 || pipe2(ep, O_CLOEXEC) < 0) {
        report(rep, JOB_FAILED, errno);
        _exit(0);
    }
    pid_t self = getpid(), pid = fork();
    if (pid < 0) {
        report(rep, JOB_FAILED, errno);
        _exit(0);
    }
    if (pid == 0) {
        setpgid(0, 0);
        if (j->tty_fd >= 0)
            tcsetpgrp(j->tty_fd, getpid());
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != self)
            _exit(EXIT_LOST);
        signal(SIGPIPE, SIG_DFL);
        sigprocmask(SIG_SETMASK, j->sigmask, NULL);
        execvpe(j->argv[0], j->argv, j->env);
        int e = errno;
        ssize_t n = write(ep[1], &e, sizeof e);
        (void)n;
        _exit(EXIT_NOTFOUND);
    }
    setpgid(pid, pid); /* both sides, as shells do: no window either way */
    if (j->tty_fd >= 0)
        tcsetpgrp(j->tty_fd, pid);
    close(ep[1]);
    int e = 0;
    ssize_t n;
    while ((n = read(ep[0], &e, sizeof e)) < 0 && errno == EINTR)
        ;
    if (n == (ssize_t)sizeof e) {
        waitpid(pid, NULL, 0);
        if (j->tty_fd >= 0)
            tcsetpgrp(j->tty_fd, j->parent_pgrp);
        report(rep, JOB_EXEC_FAILED, e);
        _exit(0);
    }
    report(rep, JOB_STARTED, pid);
    int status = 0;
    bool exited = false, told = false, killing = false, ctl_open = true;
    struct timers timers = {0, CLI_NEVER, CLI_NEVER, false};
    for (;;) {
        int st;
        pid_t p;
        while ((p = waitpid(-1, &st, WNOHANG | WUNTRACED)) > 0) {
            if (WIFSTOPPED(st)) {
                if (p == pid)
                    job_stopped(j);
            } else if (p == pid) {
                status = st;
                exited = true;
            }
        }
        if (p < 0 && errno == ECHILD)
            break; /* the last process of the job is gone */
        if (exited && j->leave_rest && !timers.stopping && !killing)
            break; /* -o: what COMMAND started is left alone */
        if (exited && !told) {
            report(rep, JOB_EXITED, status); /* and some of its processes live on */
            told = true;
        }
        if (killing) /* the orphans of those just killed came to us */
            signal_job(pid, SIGKILL);
        int timeout = fire_timers(&timers, pid, rep, &killing);
        struct pollfd fds[2] = {{.fd = ctl_open ? ctl : -1, .events = POLLIN},
                                {.fd = sfd, .events = POLLIN}};
        if (poll(fds, 2, timeout) < 0 && errno != EINTR)
            killing = true;
        if (fds[0].revents) {
            struct order o;
            n = read(ctl, &o, sizeof o);
            if (n == (ssize_t)sizeof o && o.sig >= 0 && o.sig < NSIG) {
                obey(j, pid, &o, &timers, &killing);
            } else if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
                ctl_open = false; /* dlock is gone, and with it the lock */
                killing = true;
                signal_job(pid, SIGKILL);
            }
        }
        struct signalfd_siginfo si;
        while (read(sfd, &si, sizeof si) > 0)
            ;
    }
    if (j->tty_fd >= 0)
        tcsetpgrp(j->tty_fd, j->parent_pgrp);
    report(rep, JOB_DONE, status);
    _exit(0);
}

static int cmp_int(const void *a, const void *b)
{
    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

/* A list of pids that grows (out of memory: it holds only some). */
struct pids {
    pid_t *v;
    size_t n, cap;
};

static void pids_add(pid_t pid, void *arg)
{
    struct pids *s = arg;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 8;
        pid_t *v = realloc(s->v, cap * sizeof *v);
        if (!v)
            return;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = pid;
}

static void free_argv(char **argv)
{
    for (size_t i = 0; argv && argv[i]; i++)
        free(argv[i]);
    free(argv);
}

/* ARGV (NULL-terminated) copied, strings and all; NULL when out of
 * memory. */
static char **copy_argv(char *const *argv)
{
    size_t n = 0;
    while (argv[n])
        n++;
    char **copy = calloc(n + 1, sizeof *copy);
    for (size_t i = 0; copy && i < n; i++)
        if (!(copy[i] = strdup(argv[i]))) {
            free_argv(copy);
            return NULL;
        }
    return copy;
}

int cli_job_start(struct cli_job *j)
{
    int ctl[2] = {-1, -1}, rep[2] = {-1, -1};
    /* What the guardian keeps: what COMMAND inherits, its pipe ends and
     * the terminal, worked out before fork; and COMMAND's arguments as
     * copies, since the guardian writes its name over dlock's. */
    int *keep = NULL;
    char **argv = NULL;
    const char *failed = pipe2(ctl, O_CLOEXEC) < 0 || pipe2(rep, O_CLOEXEC) < 0 ? strerror(errno)
                         : !(keep = calloc(j->nkeep + 3, sizeof *keep)) ||
                                 !(argv = copy_argv(j->argv))
                             ? "out of memory"
                             : NULL;
    if (failed) { /* nothing left open: the first pipe of two made */
        free(keep);
        fprintf(stderr, "dlock run: cannot start the job: %s\n", failed);
        for (int i = 0; i < 2; i++) {
            if (ctl[i] >= 0)
                close(ctl[i]);
            if (rep[i] >= 0)
                close(rep[i]);
        }
        return -EXIT_SOFTWARE;
    }
    memcpy(keep, j->keep, j->nkeep * sizeof *keep);
    struct cli_job g = *j;
    g.keep = keep;
    g.argv = argv;
    g.parent_pgrp = getpgrp();
    keep[g.nkeep++] = ctl[0];
    keep[g.nkeep++] = rep[1];
    if (j->tty_fd >= 0)
        keep[g.nkeep++] = j->tty_fd;
    qsort(keep, g.nkeep, sizeof *keep, cmp_int);
    /* Children dlock has already were left by the program that exec'd it
     * (`sleep 9 & exec dlock run ...`): not the job's, whatever happens
     * to it. They are never reaped here, so their pids stay theirs.
     * /proc is read only when there is a child (waitid's ECHILD says
     * there is none): that read costs every run about a third of its
     * wall time on a loaded machine. */
    struct pids before = {0};
    siginfo_t si;
    if (waitid(P_ALL, 0, &si, WEXITED | WSTOPPED | WCONTINUED | WNOHANG | WNOWAIT) == 0)
        each_child(getpid(), pids_add, &before);
    j->before = before.v;
    j->nbefore = before.n;
    struct rlimit rl;
    unsigned limit = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (1u << 20)
                         ? (unsigned)rl.rlim_cur
                         : 1u << 20;
    prctl(PR_SET_CHILD_SUBREAPER, 1); /* the job's, should the guardian be killed */
    pid_t pid = fork();
    if (pid == 0)
        guardian(&g, ctl[0], rep[1], limit);
    free(keep);
    free_argv(argv);
    close(ctl[0]);
    close(rep[1]);
    if (pid < 0) {
        fprintf(stderr, "dlock run: fork: %s\n", strerror(errno));
        close(ctl[1]);
        close(rep[0]);
        return -EXIT_SOFTWARE;
    }
    j->guardian = pid;
    j->ctl_fd = ctl[1];
    j->report_fd = rep[0];
    struct cli_job_report r;
    int got = cli_job_read(j, &r);
    if (got > 0 && r.event == JOB_STARTED) {
        j->pgid = r.value;
        return 0;
    }
    cli_job_end(j);
    if (got > 0 && r.event == JOB_EXEC_FAILED) {
        fprintf(stderr, "dlock run: cannot run '%s': %s\n", j->argv[0], strerror(r.value));
        return r.value == ENOENT ? -EXIT_NOTFOUND : -EXIT_NOEXEC;
    }
    fprintf(stderr, "dlock run: cannot start '%s': %s\n", j->argv[0],
            got > 0 ? strerror(r.value) : "the guardian process died");
    return -EXIT_SOFTWARE;
}

int cli_job_read(struct cli_job *j, struct cli_job_report *r)
{
    ssize_t n;
    while ((n = read(j->report_fd, r, sizeof *r)) < 0 && errno == EINTR)
        ;
    return n == (ssize_t)sizeof *r ? 1 : 0;
}

void cli_job_signal(struct cli_job *j, int sig)
{
    send_order(j, (struct order){ORDER_SIGNAL, sig, CLI_NEVER, CLI_NEVER});
}

void cli_job_deadline(struct cli_job *j, int sig, int64_t first_at, int64_t kill_at)
{
    send_order(j, (struct order){ORDER_DEADLINE, sig, first_at, kill_at});
}

void cli_job_stop(struct cli_job *j, int sig, int64_t kill_at)
{
    send_order(j, (struct order){ORDER_STOP, sig, CLI_NEVER, kill_at});
}

/* How long dlock waits, in all, for the job's processes it killed to
 * end: SIGKILL ends a process at once, unless it sleeps uninterruptibly
 * (D state: a hung NFS server or disk) or a tracer holds it at its exit
 * (ptrace): dlock then exits without it rather than hang. */
#define ORPHANS_REAP_MS 5000

/* What kill_orphan() is given: the children to spare, how many of the
 * job's it has killed and reaped this pass, the end of the wait for them
 * (monotonic ms) and those it gave up on (spared by the next passes). */
struct orphans {
    const pid_t *spare;
    size_t nspare, reaped;
    int64_t until;
    pid_t stuck[64];
    size_t nstuck;
};

/* Reap child KID, polling until UNTIL: false when it has not ended by then. */
static bool reap_until(pid_t kid, int64_t until)
{
    for (;;) {
        pid_t got = waitpid(kid, NULL, WNOHANG);
        if (got == kid || (got < 0 && errno != EINTR))
            return true; /* (ECHILD: reaped already) */
        if (got == 0 && mono_ms() >= until)
            return false;
        if (got == 0)
            nanosleep(&(struct timespec){.tv_nsec = 10 * 1000000}, NULL);
    }
}

/* Child KID of dlock, unless it is one to spare: SIGKILL to it and to
 * everything below it, then reap it (until O->until). */
static void kill_orphan(pid_t kid, void *arg)
{
    struct orphans *o = arg;
    for (size_t i = 0; i < o->nspare; i++)
        if (o->spare[i] == kid)
            return;
    for (size_t i = 0; i < o->nstuck; i++)
        if (o->stuck[i] == kid)
            return;
    signal_tree(kid, 0, SIGKILL, 0);
    kill(kid, SIGKILL); /* ours and not reaped: its pid is its own */
    if (reap_until(kid, o->until)) {
        o->reaped++;
        return;
    }
    fprintf(stderr, "dlock run: process %d of the job has not ended %d s after SIGKILL "
                    "(uninterruptible sleep, or held by a tracer); not waiting for it\n",
            (int)kid, ORPHANS_REAP_MS / 1000);
    if (o->nstuck < sizeof o->stuck / sizeof o->stuck[0])
        o->stuck[o->nstuck++] = kid;
}

void cli_job_kill_orphans(struct cli_job *j)
{
    struct orphans o = {.spare = j->before, .nspare = j->nbefore,
                        .until = mono_ms() + ORPHANS_REAP_MS};
    j->before = NULL; /* kept past cli_job_end() */
    cli_job_end(j);   /* once it is reaped, its children are ours */
    /* Until a pass finds no child of the job: a process of the job whose
     * parent is still exiting (COMMAND, on its parent-death signal) is
     * not ours yet when one pass looks, and would go to init once dlock
     * exits. A child reaped has handed us its own children (a zombie
     * child is still one) before its wait returns, so when a pass finds
     * none, nothing of the job is left. The children dlock had before the
     * job are spared, and not waited for; one of the job's that has not
     * ended ORPHANS_REAP_MS after the first kill is named and left. */
    do {
        o.reaped = 0;
        if (!each_child(getpid(), kill_orphan, &o))
            break;
    } while (o.reaped);
    free((void *)o.spare);
}

void cli_job_end(struct cli_job *j)
{
    if (j->ctl_fd >= 0)
        close(j->ctl_fd); /* a guardian still running kills the job */
    if (j->report_fd >= 0)
        close(j->report_fd);
    j->ctl_fd = j->report_fd = -1;
    if (j->guardian > 0)
        while (waitpid(j->guardian, NULL, 0) < 0 && errno == EINTR)
            ;
    j->guardian = 0;
    free(j->before);
    j->before = NULL;
    j->nbefore = 0;
}
