/* cli.h -- what the parts of the dlock command share. The command uses
 * only the public API in dlock.h. */
#ifndef DLOCK_CLI_H
#define DLOCK_CLI_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "dlock.h"

/* Exit codes (sysexits.h where one fits; see dlock(1)). */
enum {
    EXIT_FREE = 1,         /* status: NAME is not held (0: held) */
    EXIT_STALE = 1,        /* check: TOKEN is not the newest live hold (0: it is) */
    EXIT_NOVALUE = 1,      /* value, get: NAME has no value, no such key (0: printed) */
    EXIT_USAGE = 64,       /* EX_USAGE: bad command line */
    EXIT_DATAERR = 65,     /* EX_DATAERR: the name holds something that is not a lock */
    EXIT_SOFTWARE = 70,    /* EX_SOFTWARE: internal error */
    EXIT_UNAVAILABLE = 69, /* EX_UNAVAILABLE: backend unreachable or lacking */
    EXIT_LOST = 75,        /* EX_TEMPFAIL: the lock was lost while COMMAND ran */
    EXIT_NOPERM = 77,      /* EX_NOPERM: authentication or permission */
    EXIT_CONFIG = 78,      /* EX_CONFIG: bad URL or configuration */
    EXIT_NOEXEC = 126,     /* COMMAND found but not executable */
    EXIT_NOTFOUND = 127,   /* COMMAND not found */
};

/* The exit code for a library error. */
int cli_exit_code(int err);
/* Print "dlock: WHAT: <dlock_errmsg()>" and return cli_exit_code(err). */
int cli_fail(int err, const char *what);
/* The URL to use and where it came from (config.c): the -u one (GIVEN),
 * else $DLOCK_URL (unless empty), else the configuration file's, else
 * none (URL NULL: the library's default). FROM names the source for -v:
 * "-u", "DLOCK_URL", the file's path, or a sentence. */
struct cli_url {
    const char *url, *from;
    bool from_argv, from_config;
};
/* 0, or EXIT_CONFIG after printing (unless QUIET) what is wrong with the
 * configuration file. */
int cli_choose_url(const char *given, bool quiet, struct cli_url *out);
/* Open the client for URL (NULL: cli_choose_url()'s), with an optional
 * lease in ms (0 = default). Prints the failure; warns when a -u URL holds
 * a password (ps shows it), refuses a configuration file that holds one;
 * under -v says which URL, from where. */
int cli_open(const char *url, int64_t lease_ms, dlock_client **out);
/* cli_open()'s client before it connects: made, lease and log hook set,
 * the URL chosen, warned about, refused and said as cli_open() says.
 * Returns 0, or an exit code after printing the failure. */
int cli_client_new(const char *url, int64_t lease_ms, dlock_client **out);

/* The bound of `run -w` (bound.c): one deadline for the whole run. */
#define CLI_NEVER INT64_MAX /* no deadline */
/* The monotonic clock in ms. */
int64_t cli_now_ms(void);
/* Flush stdio and _exit(CODE) at once: a thread may still be inside the
 * library (a connect or close left behind), which exit() must not race. */
void cli_exit_now(int code) __attribute__((noreturn));
/* cli_open() whose connect ends at DEADLINE (CLI_NEVER: none) or when
 * WAKE_FD (-1: none) becomes readable (a signal came), whichever is
 * first. Returns 0 (*OUT connected), an exit code after printing the
 * failure, or, with the connect still running in a thread of its own,
 * CLI_WOKEN (woken; nothing printed) or CLI_OUT_OF_TIME (printed): the
 * caller must then leave through cli_exit_now(). */
enum { CLI_WOKEN = -1, CLI_OUT_OF_TIME = -2 };
int cli_open_within(const char *url, int64_t lease_ms, int64_t deadline, int wake_fd,
                    dlock_client **out);
/* dlock_client_close(C), waited for until DEADLINE or, when that is
 * (nearly) spent, a short grace; a close still running then is left
 * behind through cli_exit_now(CODE). For a client that holds nothing. */
void cli_close_within(dlock_client *c, int64_t deadline, int code);
/* How many -v were given to run/hold: clients cli_open() makes then log
 * the library's events on stderr with the time of day (1: losses, renewal
 * trouble, disconnects and reconnects; 2: also every acquisition and
 * renewal). */
extern int cli_verbosity;
/* run, hold and elect print a loss themselves (time-stamped under -v):
 * the library's own line of it (DLOCK_LOG_ERROR) is left out then, so a
 * loss is said once. */
extern bool cli_reports_losses;
/* The time of day as "HH:MM:SS.mmm", how -v lines begin (SIZE >= 13). */
void cli_time_of_day(char *buf, size_t size);
/* Parse SECONDS ("1.5", "2", ".5": digits and an optional fraction,
 * nothing else) into ms; -1 when malformed. */
int64_t cli_seconds(const char *s);
/* 0 when NAME can be a lock name (1 to DLOCK_NAME_MAX bytes); else print
 * a usage error for command CMD and return EXIT_USAGE. */
int cli_check_name(const char *cmd, const char *name);
/* Server text (a name, a holder, a leader's value) for the terminal:
 * valid UTF-8 as it is; control characters (C0, DEL, C1), the backslash
 * and bytes that are not part of valid UTF-8 as \xHH, so no escape
 * sequence reaches the terminal and the line stays one line. */
void cli_print_text(const char *s);
/* Whether NAME names a file to lock as flock(1) does: it starts with '/',
 * "./" or "../", and URL (NULL: cli_choose_url()'s) is a file URL or none. */
bool cli_is_path(const char *url, const char *name);
/* Who holds PATH's flock(2) (flock.c, from /proc/locks): held, in which
 * mode, the holders' pids (space-separated) and how many wait. Returns 0
 * (a missing file is free), or an errno. */
struct cli_flock_info {
    bool held, shared;
    char pids[512];
    long waiters;
};
int cli_flock_info(const char *path, struct cli_flock_info *out);
/* Open PATH to flock(2) it as flock(1) does (flock.c): created when
 * missing (0666 less the umask), read-only, a directory too, never
 * blocking on a FIFO or a device. In a directory others may write to,
 * PATH may not be a symbolic link. Returns the descriptor, or -1 with
 * errno (ELOOP: such a link, refused). */
int cli_path_open(const char *path);
#define DLOCK__CLI_STR2(x) #x
#define DLOCK__CLI_STR(x) DLOCK__CLI_STR2(x)

/* A job (job.c): COMMAND in a process group of its own under a guardian
 * process that kills every process of it when dlock dies, and reports
 * when the last of them has exited. */
struct cli_job {
    char **argv, **env;     /* COMMAND's */
    const sigset_t *sigmask; /* COMMAND's signal mask */
    const int *keep;        /* descriptors COMMAND inherits (ascending) */
    size_t nkeep;
    int tty_fd;             /* a terminal to hand to COMMAND's group, or -1 */
    bool leave_rest;        /* -o: the job ends with COMMAND; what it started is
                               left alone (unless the job is being stopped) */
    pid_t parent_pgrp;      /* dlock's process group (set by cli_job_start) */
    /* set by cli_job_start() */
    pid_t guardian, pgid;   /* pgid: COMMAND's pid and process group */
    int ctl_fd, report_fd;
    pid_t *before;          /* dlock's children before the job, not the job's (a */
    size_t nbefore;         /* program that exec'd dlock may have left some) */
};
enum { JOB_STARTED = 1, JOB_FAILED, JOB_EXEC_FAILED, JOB_EXITED, JOB_DONE, JOB_AT_RISK };
/* What the guardian reports: JOB_STARTED (value: COMMAND's pid),
 * JOB_FAILED (errno: could not fork), JOB_EXEC_FAILED (errno), JOB_EXITED
 * (COMMAND's wait status; processes it started live on), JOB_DONE
 * (COMMAND's wait status; the last process of the job has exited),
 * JOB_AT_RISK (the deadline dlock last gave came before a newer one: the
 * job is being stopped; value 0). */
struct cli_job_report {
    int event, value;
};
/* The name the guardian goes by (/proc/PID/comm and its command line), in
 * which "dlock" does not appear: `killall dlock`, `pkill dlock` and
 * `pkill -f dlock` leave it, so it outlives dlock killed by name and
 * kills the job. */
#define CLI_GUARDIAN_NAME "dl-guardian"
/* Note where main()'s ARGC arguments lie, so that the guardian can
 * write its name over them (its command line); called first thing. */
void cli_job_note_args(int argc, char **argv);
/* Start J. Returns 0, or -(exit code) after printing why. */
int cli_job_start(struct cli_job *j);
/* The next report: 1, or 0 when the guardian is gone without a word. */
int cli_job_read(struct cli_job *j, struct cli_job_report *r);
/* Send SIG to every process of the job (through the guardian). Any
 * thread; async-signal-safe. */
void cli_job_signal(struct cli_job *j, int sig);
/* A time on CLOCK_MONOTONIC in ms that never comes. */
#define CLI_NEVER INT64_MAX
/* The hold's deadline, which the guardian keeps even while dlock is
 * stopped or frozen: unless a newer one comes first, at FIRST_AT
 * (CLOCK_MONOTONIC ms, the same on both sides) it sends SIG to every
 * process of the job and reports JOB_AT_RISK, and at KILL_AT it sends
 * SIGKILL (CLI_NEVER: none). FIRST_AT CLI_NEVER: no deadline. Ignored
 * once the job is being stopped. */
void cli_job_deadline(struct cli_job *j, int sig, int64_t first_at, int64_t kill_at);
/* Stop the job: SIG to every process of it now, SIGKILL at KILL_AT
 * (CLI_NEVER: none), and no deadline from then on. */
void cli_job_stop(struct cli_job *j, int sig, int64_t kill_at);
/* Close the pipes (a guardian still running then kills the job), reap
 * the guardian and free what cli_job_start() kept. */
void cli_job_end(struct cli_job *j);
/* The guardian vanished (killed from outside): reap it and SIGKILL every
 * process left of the job, which dlock, their subreaper, now parents --
 * every child of dlock but those it had before the job began. */
void cli_job_kill_orphans(struct cli_job *j);

int cmd_run(const char *url, int argc, char **argv);
int cmd_hold(const char *url, int argc, char **argv);
int cmd_status(const char *url, int argc, char **argv);
int cmd_check(const char *url, int argc, char **argv);
int cmd_value(const char *url, int argc, char **argv);
int cmd_get(const char *url, int argc, char **argv);
int cmd_release(const char *url, int argc, char **argv);
int cmd_list(const char *url, int argc, char **argv);
/* run with ARGV (run's options, NAME, COMMAND) campaigning in election
 * NAME with VALUE instead of taking the lock (run.c, for elect.c). */
int cmd_run_campaign(const char *url, const char *value, int argc, char **argv);
int cmd_elect(const char *url, int argc, char **argv);
int cmd_leader(const char *url, int argc, char **argv);

/* Help: the whole text, or one command's. Returns 0, or EXIT_USAGE for an
 * unknown command. */
int cli_help(const char *command, int to_stderr);
/* The line that ends a usage error of COMMAND on stderr: "try 'dlock help
 * COMMAND'" (the error is one line; the usage text would drown it). */
void cli_print_usage_line(const char *command);

#endif
