/* check_cli.c -- the dlock command as a user meets it, on the file
 * backend: every exit code, the environment COMMAND sees, tokens across
 * runs, 8 processes x 200 increments through `dlock run`, kill -9 of a
 * holder, signals while waiting and while running, status/list/release,
 * and --help agreeing with the man page; on Redis, etcd and ZooKeeper
 * servers that stop answering, -w and -n bounding the whole run and a
 * signal ending a connect.
 */
#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dlock.h"
#include "fixture_etcd.h"
#include "fixture_redis.h"
#include "fixture_zk.h"
#include "testutil.h"

static char *dir, *url, *env_url;

static void setup(void)
{
    dir = tu_tmpdir("cli");
    url = tu_fmt("file://%s", dir);
    env_url = tu_fmt("DLOCK_URL=%s", url);
}

static void teardown(void)
{
    tu_rmrf(dir);
    free(dir);
    free(url);
    free(env_url);
}

/* Run dlock with ARGS (NULL-terminated) against the test's directory. */
#define DLOCK(out, err, ...) TU_DLOCK(out, err, ((const char *[]){env_url, NULL}), __VA_ARGS__)

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* Start `dlock run NAME` holding the lock until killed; returns once it
 * holds (its command made the marker). */
static pid_t start_holder(const char *name, const char *mode_flag)
{
    char *marker = tu_fmt("%s/held-%s", dir, name);
    char *cmd = tu_fmt("touch %s; exec sleep 120", marker);
    const char *argv[] = {tu_dlock_bin(), "-u", url, "run", mode_flag, name, "-c", cmd, NULL};
    if (!*mode_flag) {
        argv[4] = name;
        argv[5] = "-c";
        argv[6] = cmd;
        argv[7] = NULL;
    }
    pid_t pid = tu_spawn(argv, NULL);
    ck_assert_msg(tu_wait_file(marker, 20000), "holder of %s never started", name);
    unlink(marker);
    free(cmd);
    free(marker);
    return pid;
}

static void stop_holder(pid_t pid)
{
    tu_stop(pid, 2000);
}

#ifdef DLOCK_HAVE_REDIS
/* A redis-server for this test in *R (fx_redis_stop() ends it), asserting
 * that it started. */
static void start_redis(struct fx_redis *r)
{
    *r = (struct fx_redis){0};
    ck_assert_msg(fx_redis_start(r, NULL), "redis-server could not be started");
}

/* The frame of the tests of a job that `dlock run` stops when its lock is
 * lost, on a redis-server of its own (R): in the test's directory, the
 * job's marks -- STARTED once it runs, TERMED when it got SIGTERM -- and
 * dlock's LOG. */
struct lost_job {
    struct fx_redis r;
    char *started, *termed, *log;
};

static void lost_job_begin(struct lost_job *j)
{
    start_redis(&j->r);
    j->started = tu_fmt("%s/started", dir);
    j->termed = tu_fmt("%s/termed", dir);
    j->log = tu_fmt("%s/dlock.log", dir);
}

/* dlock ARGV started, its output to the log: returns once the job runs. */
static pid_t lost_job_spawn(struct lost_job *j, const char *const argv[])
{
    pid_t d = tu_spawn(argv, j->log);
    ck_assert_msg(tu_wait_file(j->started, 20000), "COMMAND never started");
    return d;
}

/* Reap dlock D, asserting that it exited 75 (a lock lost) and that the
 * job got SIGTERM first; returns dlock's log (caller frees). */
static char *lost_job_reap(struct lost_job *j, pid_t d)
{
    int st;
    waitpid(d, &st, 0);
    char *out = tu_read_file(j->log);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 75, "status %#x: %s", st, out);
    ck_assert_msg(access(j->termed, F_OK) == 0, "COMMAND was killed without a SIGTERM first: %s",
                  out);
    return out;
}

static void lost_job_end(struct lost_job *j)
{
    free(j->log);
    free(j->termed);
    free(j->started);
    fx_redis_stop(&j->r);
}
#endif

TU_TEST(conflict_codes, 120)
{
    pid_t h = start_holder("busy", "");
    char *err;
    /* Busy under -n or -w is silent, as with flock(1) (cron mails nothing),
     * unless -v. */
    ck_assert_int_eq(DLOCK(NULL, &err, "run", "-n", "busy", "true"), 1);
    ck_assert_msg(!*err, "not silent: %s", err);
    free(err);
    ck_assert_int_eq(DLOCK(NULL, &err, "run", "-n", "-v", "busy", "true"), 1);
    ck_assert_ptr_nonnull(strstr(err, "busy"));
    ck_assert_msg(strstr(err, "URL ") && count_lines(err) == 2, "%s", err); /* URL, busy */
    free(err);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-n", "-E", "7", "busy", "true"), 7);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-w", "0", "busy", "true"), 1);
    ck_assert_int_eq(DLOCK(NULL, &err, "run", "-w", "0.2", "-E", "9", "busy", "true"), 9);
    ck_assert_msg(!*err, "not silent: %s", err);
    free(err);
    /* -v says who holds it when the wait starts, then why it gave up. */
    ck_assert_int_eq(DLOCK(NULL, &err, "run", "-v", "-w", "0.2", "busy", "true"), 1);
    ck_assert_msg(strstr(err, "is held by") && strstr(err, "waiting up to 0.200 s") &&
                      strstr(err, "still held by another owner after") && count_lines(err) == 3,
                  "%s", err);
    free(err);
    /* A different name is free. */
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-n", "other", "true"), 0);
    stop_holder(h);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-n", "busy", "true"), 0);
}

/* flock(1)'s spellings: -x/-e/--exclusive, -o/--close, --nonblock,
 * --timeout, --conflict-exit-code, --verbose are taken; -c runs $SHELL
 * -c; -F is refused with its reason. */
TU_TEST(flock_spellings, 120)
{
    pid_t h = start_holder("fl", "-s");
    const char *ex[] = {"-x", "-e", "--exclusive"};
    for (size_t i = 0; i < 3; i++)
        ck_assert_msg(DLOCK(NULL, NULL, "run", ex[i], "--nonblock", "--conflict-exit-code", "3",
                            "fl", "true") == 3,
                      "%s is not exclusive", ex[i]);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-s", "-o", "fl", "true"), 0);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "--shared", "--close", "fl", "true"), 0);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "--timeout", "0.1", "-E", "4", "fl", "true"), 4);
    char *err;
    ck_assert_int_eq(DLOCK(NULL, &err, "run", "--verbose", "-n", "fl", "true"), 1);
    ck_assert_msg(strstr(err, "busy") || strstr(err, "held"), "%s", err);
    free(err);
    stop_holder(h);
    ck_assert_int_eq(DLOCK(NULL, &err, "run", "-F", "fl", "true"), 64);
    ck_assert_msg(strstr(err, "no-fork") && strstr(err, "renew"), "%s", err);
    free(err);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "--no-fork", "fl", "true"), 64);
    /* -c runs $SHELL -c, as flock(1) does; /bin/sh without $SHELL. */
    char *out;
    const char *env[] = {env_url, "SHELL=/bin/echo", NULL};
    ck_assert_int_eq(TU_DLOCK(&out, NULL, env, "run", "fl", "-c", "hello"), 0);
    ck_assert_str_eq(out, "-c hello\n");
    free(out);
    const char *noshell[] = {env_url, "SHELL=", NULL};
    ck_assert_int_eq(TU_DLOCK(&out, NULL, noshell, "run", "fl", "-c", "echo sh"), 0);
    ck_assert_str_eq(out, "sh\n");
    free(out);
}

static bool wait_blocked(pid_t pid, int sig, int timeout_ms);

/* A path as the lock locks that file with flock(2), as flock(1) does:
 * the two exclude each other both ways, a waiter wakes when flock(1)
 * lets go, kill -9 of dlock keeps the file locked until its job is gone,
 * and a relative path (./x) is one too. Tested with the real flock(1). */
TU_TEST(path_form_flock, 120)
{
    char *path = tu_fmt("%s/shared-with-flock", dir), *held = tu_fmt("%s/flock-held", dir);
    char *cmd = tu_fmt("touch %s; exec sleep 120", held);
    const char *fl_argv[] = {"flock", path, "-c", cmd, NULL};
    pid_t f = tu_spawn(fl_argv, NULL);
    ck_assert(tu_wait_file(held, 30000));
    unlink(held);
    char *err;
    ck_assert_int_eq(DLOCK(NULL, &err, "run", "-n", path, "true"), 1);
    ck_assert_msg(!*err, "not silent: %s", err);
    free(err);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-w", "0.1", "-E", "5", path, "true"), 5);
    /* -v names flock(1)'s pid, from /proc/locks. */
    char *want_pid = tu_fmt("locked by pid %d (exclusive); waiting", (int)f);
    ck_assert_int_eq(DLOCK(NULL, &err, "run", "-v", "-w", "0.1", path, "true"), 1);
    ck_assert_msg(strstr(err, want_pid), "%s", err);
    free(want_pid);
    free(err);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-s", "-n", path, "true"), 1);
    char *out;
    ck_assert_int_eq(DLOCK(&out, NULL, "status", path), 0); /* from /proc/locks */
    ck_assert_msg(strstr(out, "held (exclusive)") && strstr(out, "holders:  pid "), "%s", out);
    free(out);
    ck_assert_int_eq(DLOCK(NULL, &err, "release", "--force", path), 69); /* the kernel's */
    ck_assert_msg(strstr(err, "flock(2)") && count_lines(err) == 1, "%s", err);
    free(err);
    /* A waiter gets it once flock(1) lets go. */
    char *got = tu_fmt("%s/got", dir), *gotcmd = tu_fmt("touch %s", got);
    const char *w_argv[] = {tu_dlock_bin(), "run", path, "-c", gotcmd, NULL};
    pid_t w = tu_spawn(w_argv, NULL);
    ck_assert(wait_blocked(w, SIGTERM, 30000));
    ck_assert_msg(access(got, F_OK) != 0, "ran beside flock(1)");
    tu_stop(f, 2000);
    ck_assert_int_eq(tu_wait_exit(w), 0);
    ck_assert_msg(access(got, F_OK) == 0, "the waiter never ran");
    /* dlock holding it: flock(1) is kept out, in either mode. */
    const char *d_argv[] = {tu_dlock_bin(), "run", path, "-c", cmd, NULL};
    pid_t d = tu_spawn(d_argv, NULL);
    ck_assert(tu_wait_file(held, 30000));
    const char *fl_n[] = {"flock", "-n", path, "true", NULL};
    const char *fl_sn[] = {"flock", "-s", "-n", path, "true", NULL};
    ck_assert_int_eq(tu_run(fl_n, NULL, NULL, NULL), 1);
    ck_assert_int_eq(tu_run(fl_sn, NULL, NULL, NULL), 1);
    /* kill -9 of dlock: its job is killed, and only then is the file free. */
    kill(d, SIGKILL);
    tu_wait_exit(d);
    const char *fl_wait[] = {"flock", "-w", "30", path, "true", NULL};
    ck_assert_int_eq(tu_run(fl_wait, NULL, NULL, NULL), 0);
    ck_assert_int_eq(DLOCK(&out, NULL, "status", "--json", path), 1); /* free */
    ck_assert_msg(strstr(out, "\"held\":false"), "%s", out);
    free(out);
    /* hold: what it holds, on stdout; </dev/null releases at once. */
    ck_assert_int_eq(DLOCK(&out, NULL, "hold", path), 0);
    char *want = tu_fmt("mode=exclusive name=%s\n", path);
    ck_assert_str_eq(out, want);
    free(want);
    free(out);
    /* ./NAME is a path too (here in the test's directory). */
    char *rel = tu_fmt("cd %s && '%s' run ./rel-lock test -f rel-lock", dir, tu_dlock_bin());
    const char *rel_argv[] = {"sh", "-c", rel, NULL};
    ck_assert_int_eq(tu_run(rel_argv, NULL, NULL, NULL), 0);
    free(rel);
    free(gotcmd);
    free(got);
    free(cmd);
    free(held);
    free(path);
}

/* A path in a directory others may write to (/tmp, 1777) is never a
 * symbolic link: one planted there would make dlock (root, say) create or
 * lock another file, so it is refused with 77 and a message naming it,
 * and its target is not made. A link in a directory only its owner
 * writes is followed, as flock(1) follows it. A FIFO planted there does
 * not hang the open (flock(2) locks it as any file). */
TU_TEST(path_form_planted_link, 60)
{
    char *pub = tu_fmt("%s/pub", dir), *own = tu_fmt("%s/own", dir);
    ck_assert_int_eq(mkdir(pub, 0700), 0);
    ck_assert_int_eq(chmod(pub, 01777), 0);
    ck_assert_int_eq(mkdir(own, 0700), 0);
    char *target = tu_fmt("%s/victim", own), *link = tu_fmt("%s/job.lock", pub);
    ck_assert_int_eq(symlink(target, link), 0);
    char *err;
    ck_assert_int_eq(DLOCK(NULL, &err, "run", "-n", link, "true"), 77);
    ck_assert_msg(strstr(err, link) && strstr(err, "symbolic link"), "%s", err);
    ck_assert_msg(count_lines(err) == 1, "%s", err);
    free(err);
    ck_assert_msg(access(target, F_OK) != 0, "the link's target was created");
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-n", "-s", link, "true"), 77);
    char *own_link = tu_fmt("%s/ok.lock", own);
    ck_assert_int_eq(symlink(target, own_link), 0);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-n", own_link, "true"), 0);
    ck_assert_msg(access(target, F_OK) == 0, "a link in a private directory was not followed");
    char *fifo = tu_fmt("%s/fifo.lock", pub);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-n", fifo, "true"), 0);
    free(fifo);
    free(own_link);
    free(link);
    free(target);
    free(own);
    free(pub);
}

/* A lock directory shared by two users through a group (chgrp G DIR;
 * chmod 2770 DIR): root and nobody (given group G with setpriv) exclude
 * each other both ways, the lock file is 0660 in group G, and a user
 * outside the group is refused with 77. Needs root for setpriv: said, not
 * skipped quietly. */
TU_TEST(shared_dir_two_users, 120)
{
    if (geteuid() != 0) {
        fprintf(stderr, "cli: NOT RUN shared_dir_two_users: needs root (setpriv --reuid)\n");
        return;
    }
    char *shared = tu_fmt("%s/shared", dir), *u = tu_fmt("file://%s", shared);
    ck_assert_int_eq(mkdir(shared, 0700), 0);
    ck_assert_int_eq(chown(shared, 0, 4242), 0);
    ck_assert_int_eq(chmod(shared, 02770), 0);
    char *marker = tu_fmt("%s/nobody-holds", dir);
    char *hold_cmd = tu_fmt("touch %s; exec sleep 120", marker);
    ck_assert_int_eq(chmod(dir, 0777), 0); /* nobody writes its marker there */
    const char *as_nobody[] = {"setpriv", "--reuid=65534", "--regid=65534", "--groups=4242",
                               tu_dlock_bin(), "-u", u, "run", "deploy", "-c", hold_cmd, NULL};
    pid_t h = tu_spawn(as_nobody, NULL);
    ck_assert_msg(tu_wait_file(marker, 30000), "nobody could not take the lock");
    ck_assert_int_eq(DLOCK(NULL, NULL, "-u", u, "run", "-n", "deploy", "true"), 1);
    stop_holder(h);
    char *lockfile = tu_fmt("%s/deploy.lock", shared);
    struct stat st;
    ck_assert_int_eq(stat(lockfile, &st), 0);
    ck_assert_msg((st.st_mode & 0777) == 0660 && st.st_gid == 4242, "lock file mode %o gid %u",
                  (unsigned)(st.st_mode & 0777), (unsigned)st.st_gid);
    const char *root_holds[] = {tu_dlock_bin(), "-u", u, "run", "deploy", "-c", hold_cmd, NULL};
    unlink(marker);
    h = tu_spawn(root_holds, NULL);
    ck_assert(tu_wait_file(marker, 30000));
    const char *nobody_try[] = {"setpriv", "--reuid=65534", "--regid=65534", "--groups=4242",
                                tu_dlock_bin(), "-u", u, "run", "-n", "deploy", "true", NULL};
    ck_assert_int_eq(tu_run(nobody_try, NULL, NULL, NULL), 1);
    stop_holder(h);
    ck_assert_int_eq(tu_run(nobody_try, NULL, NULL, NULL), 0);
    const char *outsider[] = {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                              tu_dlock_bin(), "-u", u, "run", "-n", "deploy", "true", NULL};
    char *err;
    ck_assert_int_eq(tu_run(outsider, NULL, NULL, &err), 77);
    free(err);
    free(lockfile);
    free(hold_cmd);
    free(marker);
    free(u);
    free(shared);
}

/* status exits 0 when NAME is held and 1 when it is free, so scripts can
 * branch on it; --json alike. */
TU_TEST(status_exit, 60)
{
    ck_assert_int_eq(DLOCK(NULL, NULL, "status", "st"), 1);
    pid_t h = start_holder("st", "");
    ck_assert_int_eq(DLOCK(NULL, NULL, "status", "st"), 0);
    ck_assert_int_eq(DLOCK(NULL, NULL, "status", "st", "--json"), 0);
    stop_holder(h);
    ck_assert_int_eq(DLOCK(NULL, NULL, "status", "--json", "st"), 1);
}

/* status prints a valid UTF-8 name as it is and escapes only control
 * characters and bytes that are not UTF-8; --json carries no "client"
 * object (a fresh client's counters, always zero). */
TU_TEST(status_utf8_name_no_client, 60)
{
    char *out;
    ck_assert_int_eq(DLOCK(&out, NULL, "status", "caf\xc3\xa9-\xe6\x97\xa5"), 1);
    ck_assert_msg(strstr(out, "name:     caf\xc3\xa9-\xe6\x97\xa5\n"), "%s", out);
    free(out);
    ck_assert_int_eq(DLOCK(&out, NULL, "status", "a\xff\x01" "b"), 1);
    ck_assert_msg(strstr(out, "name:     a\\xff\\x01b\n"), "%s", out);
    free(out);
    ck_assert_int_eq(DLOCK(&out, NULL, "status", "back\\slash"), 1);
    ck_assert_msg(strstr(out, "name:     back\\x5cslash\n"), "%s", out);
    free(out);
    ck_assert_int_eq(DLOCK(&out, NULL, "status", "--json", "caf\xc3\xa9"), 1);
    ck_assert_msg(!strstr(out, "\"client\""), "%s", out);
    free(out);
}

/* The token line tells the last token issued where the backend keeps it
 * (held, or a counter beside the name: file, redis) and is left out where
 * it does not (etcd, zk: a free name's last token is gone; a name never
 * used): no "token: 0 (last issued)". JSON: null. TOKEN_KEPT: the
 * backend keeps a counter. */
static void status_token_on(const char *u, bool token_kept)
{
    char *out;
    ck_assert_int_eq(DLOCK(&out, NULL, "-u", u, "status", "never-used"), 1);
    ck_assert_msg(!strstr(out, "token:"), "%s", out);
    free(out);
    ck_assert_int_eq(DLOCK(&out, NULL, "-u", u, "status", "--json", "never-used"), 1);
    ck_assert_msg(strstr(out, "\"token\":null"), "%s", out);
    free(out);
    ck_assert_int_eq(DLOCK(NULL, NULL, "-u", u, "run", "issued", "true"), 0);
    ck_assert_int_eq(DLOCK(&out, NULL, "-u", u, "status", "issued"), 1);
    if (token_kept) {
        unsigned long long t = 0;
        const char *line = strstr(out, "token:");
        ck_assert_msg(line && sscanf(line, "token: %llu (last issued)", &t) == 1 && t > 0, "%s",
                      out);
    } else
        ck_assert_msg(!strstr(out, "token:"), "%s", out);
    free(out);
    ck_assert_int_eq(DLOCK(&out, NULL, "-u", u, "status", "--json", "issued"), 1);
    ck_assert_msg(token_kept ? !strstr(out, "\"token\":null") : !!strstr(out, "\"token\":null"),
                  "%s", out);
    free(out);
}

TU_TEST(status_token_file, 60)
{
    status_token_on(url, true);
}

#ifdef DLOCK_HAVE_REDIS
TU_TEST(status_token_redis, 60)
{
    struct fx_redis r;
    start_redis(&r);
    status_token_on(r.url, true);
    fx_redis_stop(&r);
}
#endif

#ifdef DLOCK_HAVE_ETCD
TU_TEST(status_token_etcd, 120)
{
    struct etcdf f = {0};
    ck_assert_msg(etcdf_start(&f, 1), "%s", f.error);
    char *u = etcdf_url(&f, NULL, NULL);
    status_token_on(u, false);
    free(u);
    etcdf_stop(&f);
}
#endif

#ifdef DLOCK_HAVE_ZK
TU_TEST(status_token_zk, 180)
{
    struct zkf f = {0};
    ck_assert_msg(zkf_start(&f, 1), "%s", f.error);
    char *u = zkf_url(&f, NULL, NULL);
    status_token_on(u, false);
    free(u);
    zkf_stop(&f);
}
#endif

/* The holder of a lock names its host and the pid of the dlock that
 * holds it, in status's plain and JSON output, on every backend that
 * stores them beside the hold: on Redis a client record
 * (dlock_client:<uuid>) beside Redisson's own keys. */
static void status_names_holder_host_pid(const char *u)
{
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    char *mark = tu_fmt("%s/hp.started", dir), *cmd = tu_fmt("touch %s; exec sleep 60", mark);
    const char *argv[] = {tu_dlock_bin(), "-u", u, "run", "hp", "-c", cmd, NULL};
    pid_t p = tu_spawn(argv, NULL);
    ck_assert_msg(tu_wait_file(mark, 20000), "the holder never started");
    char *want = tu_fmt("%ld@%s", (long)p, host), *out;
    ck_assert_int_eq(TU_DLOCK(&out, NULL, NULL, "-u", u, "status", "hp"), 0);
    ck_assert_msg(strstr(out, want), "no %s in:\n%s", want, out);
    free(out);
    char *pid_field = tu_fmt("\"pid\":%ld,", (long)p);
    char *host_field = tu_fmt("\"host\":\"%s\"", host);
    ck_assert_int_eq(TU_DLOCK(&out, NULL, NULL, "-u", u, "status", "--json", "hp"), 0);
    ck_assert_msg(strstr(out, pid_field) && strstr(out, host_field), "no %s and %s in %s",
                  pid_field, host_field, out);
    free(out);
    tu_stop(p, 5000);
    free(pid_field), free(host_field), free(want), free(cmd), free(mark);
}

TU_TEST(status_holder_host_pid_file, 60)
{
    status_names_holder_host_pid(url);
}

#ifdef DLOCK_HAVE_REDIS
TU_TEST(status_holder_host_pid_redis, 60)
{
    struct fx_redis r;
    start_redis(&r);
    status_names_holder_host_pid(r.url);
    fx_redis_stop(&r);
}
#endif

/* `dlock hold NAME` as a script uses it with coproc: stdin and stdout are
 * pipes; it prints what it holds once held, holds while stdin is open,
 * and releases at end of input or on SIGTERM. */
static pid_t start_piped(const char *const args[], int *in, int *out);
static pid_t start_hold(const char *name, int *in, int *out)
{
    const char *const args[] = {"hold", name, NULL};
    return start_piped(args, in, out);
}

/* dlock -u URL ARGS... with stdin and stdout pipes (*IN to write, *OUT
 * to read). */
static pid_t start_piped(const char *const args[], int *in, int *out)
{
    int pi[2], po[2];
    ck_assert_int_eq(pipe(pi), 0);
    ck_assert_int_eq(pipe(po), 0);
    pid_t pid = tu_fork();
    if (pid == 0) {
        dup2(pi[0], 0);
        dup2(po[1], 1);
        close(pi[0]);
        close(pi[1]);
        close(po[0]);
        close(po[1]);
        const char *argv[16] = {"dlock", "-u", url};
        for (size_t i = 0; args[i] && i + 4 < sizeof argv / sizeof *argv; i++)
            argv[3 + i] = args[i];
        execv(tu_dlock_bin(), (char **)argv);
        _exit(127);
    }
    close(pi[0]);
    close(po[1]);
    *in = pi[1];
    *out = po[0];
    return pid;
}

TU_TEST(hold_coproc, 60)
{
    for (int by_signal = 0; by_signal < 2; by_signal++) {
        int in, out;
        pid_t d = start_hold("held", &in, &out);
        char line[512] = "";
        FILE *f = fdopen(out, "r");
        ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
        unsigned long long token;
        char mode[32], name[64];
        ck_assert_msg(sscanf(line, "token=%llu mode=%31s name=%63s", &token, mode, name) == 3,
                      "%s", line);
        ck_assert_str_eq(mode, "exclusive");
        ck_assert_str_eq(name, "held");
        ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-n", "held", "true"), 1);
        ck_assert_int_eq(DLOCK(NULL, NULL, "status", "held"), 0);
        /* Input is read and ignored; the hold goes on. */
        ck_assert_int_eq(write(in, "x\n", 2), 2);
        ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-n", "held", "true"), 1);
        if (by_signal)
            kill(d, SIGTERM);
        else
            close(in);
        ck_assert_int_eq(tu_wait_exit(d), 0);
        ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-n", "held", "true"), 0);
        fclose(f);
        if (by_signal)
            close(in);
    }
    /* A command is run's business. */
    ck_assert_int_eq(DLOCK(NULL, NULL, "hold", "held", "true"), 64);
    ck_assert_int_eq(DLOCK(NULL, NULL, "hold", "-c", "true", "held"), 64);
}

/* `dlock elect NAME` without COMMAND campaigns and, once leading, holds
 * the leadership as hold holds a lock (etcdctl elect NAME VALUE): one
 * line saying what it leads, then held until stdin ends. */
TU_TEST(elect_without_command_holds, 60)
{
    int in, out;
    const char *const args[] = {"elect", "--value", "host a", "chief", NULL};
    pid_t d = start_piped(args, &in, &out);
    char line[512] = "";
    FILE *f = fdopen(out, "r");
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
    unsigned long long token;
    ck_assert_msg(sscanf(line, "token=%llu ", &token) == 1, "%s", line);
    ck_assert_msg(strstr(line, " name=chief value=host a\n"), "%s", line);
    char *got;
    ck_assert_int_eq(DLOCK(&got, NULL, "leader", "chief"), 0);
    ck_assert_msg(strstr(got, "value=host a"), "%s", got);
    free(got);
    /* Input is read and ignored; end of input resigns. */
    ck_assert_int_eq(write(in, "x\n", 2), 2);
    close(in);
    ck_assert_int_eq(tu_wait_exit(d), 0);
    fclose(f);
    ck_assert_int_eq(DLOCK(&got, NULL, "leader", "chief"), 1);
    ck_assert_str_eq(got, "none\n");
    free(got);
    /* No NAME: elect's own message and help. */
    char *err;
    ck_assert_int_eq(DLOCK(NULL, &err, "elect"), 64);
    ck_assert_str_eq(err, "dlock elect: missing NAME\ntry 'dlock help elect'\n");
    free(err);
}

TU_TEST(command_status, 120)
{
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "x", "sh", "-c", "exit 3"), 3);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "x", "--", "sh", "-c", "exit 0"), 0);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "x", "-c", "exit 4"), 4);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-c", "exit 5", "x"), 5);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "x", "sh", "-c", "kill -TERM $$"), 143);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "x", "sh", "-c", "kill -KILL $$"), 137);
    char *err;
    ck_assert_int_eq(DLOCK(NULL, &err, "run", "x", "/no/such/command"), 127);
    ck_assert_ptr_nonnull(strstr(err, "/no/such/command"));
    free(err);
    char *notexec = tu_fmt("%s/notexec", dir);
    tu_write_file(notexec, "#!/bin/sh\n");
    chmod(notexec, 0644);
    if (getuid() != 0 || 1) /* root cannot exec a file without x bits either */
        ck_assert_int_eq(DLOCK(NULL, NULL, "run", "x", notexec), 126);
    free(notexec);
    /* The lock was released after each run. */
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-n", "x", "true"), 0);
}

TU_TEST(usage_config, 120)
{
    char *err;
    ck_assert_int_eq(DLOCK(NULL, NULL, "run"), 64);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "name"), 64);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-w", "soon", "n", "true"), 64);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-E", "300", "n", "true"), 64);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "--on-lost", "panic", "n", "true"), 64);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "--bogus", "n", "true"), 64);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "n", "-c", "true", "extra"), 64);
    ck_assert_int_eq(DLOCK(NULL, NULL, "frobnicate"), 64);
    ck_assert_int_eq(DLOCK(NULL, NULL, "release", "n"), 64);
    ck_assert_int_eq(DLOCK(NULL, NULL, "status"), 64);
    ck_assert_int_eq(DLOCK(NULL, NULL, "--bogus"), 64);
    const char *bad[][2] = {{"nosuch://h", "nosuch"},
                            {"redis://h:0", "port"},
                            {"file://", "directory"},
                            {"file:///no/such/dir", "/no/such/dir"},
                            {"not a url", "scheme"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ck_assert_int_eq(DLOCK(NULL, &err, "-u", bad[i][0], "run", "n", "true"), 78);
        ck_assert_msg(strstr(err, bad[i][1]) && count_lines(err) == 1, "%s: '%s'", bad[i][0], err);
        free(err);
    }
    /* A name the library refuses is a usage error, not a configuration one. */
    char toolong[DLOCK_NAME_MAX + 2];
    memset(toolong, 'n', sizeof toolong - 1);
    toolong[sizeof toolong - 1] = 0;
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "", "true"), 64);
    ck_assert_int_eq(DLOCK(NULL, &err, "run", toolong, "true"), 64);
    ck_assert_msg(strstr(err, "longer than 1024") && count_lines(err) >= 1, "%s", err);
    free(err);
    ck_assert_int_eq(DLOCK(NULL, NULL, "status", ""), 64);
    ck_assert_int_eq(DLOCK(NULL, NULL, "release", "--force", ""), 64);
    /* -c after NAME with nothing after it: not a command named "-c". */
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "x", "-c"), 64);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "x", "--command"), 64);
    /* SECONDS are digits and a fraction: no hex, blanks, exponents, inf. */
    const char *secs[] = {"0x10", " 1", "1 ", "1e3", "inf", "nan", "-1", "+1", ".", "", "1.5s"};
    for (size_t i = 0; i < sizeof secs / sizeof *secs; i++) {
        ck_assert_msg(DLOCK(NULL, NULL, "run", "-w", secs[i], "n", "true") == 64, "-w '%s'",
                      secs[i]);
        ck_assert_msg(DLOCK(NULL, NULL, "run", "--kill-after", secs[i], "n", "true") == 64,
                      "--kill-after '%s'", secs[i]);
        ck_assert_msg(DLOCK(NULL, NULL, "run", "--lost-grace", secs[i], "n", "true") == 64,
                      "--lost-grace '%s'", secs[i]);
    }
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-w", ".5", "n", "true"), 0);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-w", "2.", "n", "true"), 0);
    /* A lease too short for a renewal's round trip: refused, with the floor. */
    ck_assert_int_eq(DLOCK(NULL, &err, "run", "--lease", "0.2", "n", "true"), 64);
    ck_assert_msg(strstr(err, "at least 1 s"), "%s", err);
    free(err);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "--lease", "1", "n", "true"), 0);
    /* The URL's lease has the same floor, from -u as from DLOCK_URL, so
     * that ?lease=500ms and --lease 0.5 agree; --lease overrides it. */
    char *short_url = tu_fmt("%s?lease=500ms", url), *short_env = tu_fmt("DLOCK_URL=%s", short_url);
    ck_assert_int_eq(DLOCK(NULL, &err, "-u", short_url, "run", "n", "true"), 64);
    ck_assert_msg(strstr(err, "lease=500ms") && strstr(err, "at least 1 s"), "%s", err);
    free(err);
    ck_assert_int_eq(TU_DLOCK(NULL, &err, ((const char *[]){short_env, NULL}), "hold", "n"), 64);
    ck_assert_msg(strstr(err, "at least 1 s"), "%s", err);
    free(err);
    /* past the floor (not 64), the file backend refuses a lease= (78) */
    ck_assert_int_eq(DLOCK(NULL, NULL, "-u", short_url, "run", "--lease", "2", "n", "true"), 78);
    free(short_url);
    free(short_env);
    char *ok_url = tu_fmt("%s?timeout=2s&lease=1s", url);
    ck_assert_int_eq(DLOCK(NULL, NULL, "-u", ok_url, "run", "n", "true"), 78);
    free(ok_url);
    /* A file where the lock directory should be: configuration, not permission. */
    char *file = tu_fmt("%s/plain", dir), *furl = tu_fmt("file://%s", file);
    tu_write_file(file, "");
    ck_assert_int_eq(DLOCK(NULL, &err, "-u", furl, "run", "n", "true"), 78);
    ck_assert_msg(strstr(err, "not a directory"), "%s", err);
    free(err);
    free(furl);
    free(file);
    /* A name that holds something other than a lock (here a FIFO where
     * the lock file would be): bad data, 65, not an internal error. */
    char *fifo = tu_fmt("%s/pipe.lock", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    ck_assert_int_eq(DLOCK(NULL, &err, "run", "pipe", "true"), 65);
    ck_assert_msg(strstr(err, "pipe.lock"), "%s", err);
    free(err);
    ck_assert_int_eq(DLOCK(NULL, NULL, "status", "pipe"), 65);
    free(fifo);
}

TU_TEST(env_tokens, 120)
{
    char *out;
    unsigned long prev = 0;
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(DLOCK(&out, NULL, "run", "env", "sh", "-c",
                               "echo \"$DLOCK_NAME|$DLOCK_TOKEN|$DLOCK_URL\""),
                         0);
        char name[64], u[512];
        unsigned long tok;
        ck_assert_int_eq(sscanf(out, "%63[^|]|%lu|%511[^\n]", name, &tok, u), 3);
        ck_assert_str_eq(name, "env");
        ck_assert_str_eq(u, url);
        ck_assert_uint_gt(tok, prev);
        prev = tok;
        free(out);
    }
}

/* check NAME TOKEN, as a service handed a holder's DLOCK_TOKEN uses it:
 * exit 0 and "current" while that hold is the newest and alive (asked
 * from inside the run), 1 and "stale: ..." once it ended or another run
 * holds the name; a token never issued (0, 2^64 - 1) is stale, never an
 * error; a TOKEN that is no decimal number below 2^64 is a usage error,
 * a flock(2) path has no token (69), an unreachable backend 69. */
TU_TEST(check_exit, 60)
{
    char *tok_path = tu_fmt("%s/tok", dir);
    char *cmd = tu_fmt("\"%s\" check ck \"$DLOCK_TOKEN\" >%s.out && echo \"$DLOCK_TOKEN\" >%s",
                       tu_dlock_bin(), tok_path, tok_path);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "ck", "-c", cmd), 0);
    char *tok = tu_read_file(tok_path), *inner = tu_fmt("%s.out", tok_path);
    char *inner_out = tu_read_file(inner);
    ck_assert_msg(tok && inner_out && !strcmp(inner_out, "current\n"), "%s", inner_out);
    tok[strcspn(tok, "\n")] = 0;
    char *out;
    ck_assert_int_eq(DLOCK(&out, NULL, "check", "ck", tok), 1);
    ck_assert_msg(!strncmp(out, "stale: ", 7) && strstr(out, "'ck'"), "%s", out);
    free(out);
    pid_t h = start_holder("ck", "");
    ck_assert_int_eq(DLOCK(NULL, NULL, "check", "ck", tok), 1);
    ck_assert_int_eq(DLOCK(NULL, NULL, "check", "ck", "0"), 1);
    ck_assert_int_eq(DLOCK(NULL, NULL, "check", "ck", "18446744073709551615"), 1);
    stop_holder(h);
    static const char *const bad[] = {"", "x", "1x", "-1", "+1", " 1", "18446744073709551616"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        ck_assert_msg(DLOCK(NULL, NULL, "check", "ck", bad[i]) == 64, "TOKEN '%s'", bad[i]);
    ck_assert_int_eq(DLOCK(NULL, NULL, "check", "ck"), 64);
    ck_assert_int_eq(DLOCK(NULL, NULL, "check", "ck", "1", "2"), 64);
    ck_assert_int_eq(DLOCK(NULL, NULL, "check", "/tmp/ck", "1"), 69);
    char *down = tu_fmt("redis://127.0.0.1:%d?connect_timeout=1s", tu_free_port());
    ck_assert_int_eq(DLOCK(NULL, NULL, "-u", down, "check", "ck", "1"), 69);
    free(down);
    free(inner_out);
    free(inner);
    free(tok);
    free(cmd);
    free(tok_path);
}

/* A lock's value from the command line: `dlock value NAME` prints it
 * (exit 1 and nothing when there is none); `run --value` hands COMMAND
 * the value (DLOCK_VALUE, DLOCK_VALUE_TOKEN: the token of the hold that
 * wrote it, 0 for none) and a file holding it (DLOCK_VALUE_FILE), and
 * writes what the file holds when COMMAND ends, if it changed, before the
 * release; a value too long is refused (65) and nothing changes; `status`
 * shows it. Usage errors as every command's. */
TU_TEST(value_command_run_and_status, 60)
{
    char *out = NULL;
    ck_assert_int_eq(DLOCK(&out, NULL, "value", "vv"), 1);
    ck_assert_str_eq(out, "");
    free(out);
    char *seen = tu_fmt("%s/vv.seen", dir);
    char *cmd = tu_fmt("printf '%%s|%%s' \"$DLOCK_VALUE_TOKEN\" \"$DLOCK_VALUE\" >%s; "
                       "printf 'step 1' >\"$DLOCK_VALUE_FILE\"", seen);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "--value", "vv", "-c", cmd), 0);
    char *text = tu_read_file(seen);
    ck_assert_str_eq(text, "0|");
    free(text);
    ck_assert_int_eq(DLOCK(&out, NULL, "value", "vv"), 0);
    ck_assert_str_eq(out, "step 1");
    free(out);
    free(cmd);
    /* a COMMAND that leaves the file alone changes nothing */
    cmd = tu_fmt("printf '%%s|%%s|' \"$DLOCK_VALUE_TOKEN\" \"$DLOCK_VALUE\" >%s; "
                 "cat \"$DLOCK_VALUE_FILE\" >>%s",
                 seen, seen);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "--value", "vv", "-c", cmd), 0);
    text = tu_read_file(seen);
    ck_assert_msg(text && strtoull(text, NULL, 10) > 0 && strstr(text, "|step 1|step 1"), "%s",
                  text);
    free(text);
    ck_assert_int_eq(DLOCK(&out, NULL, "status", "vv"), 1);
    ck_assert_msg(strstr(out, "\nvalue:    step 1 (written by token "), "%s", out);
    free(out);
    ck_assert_int_eq(DLOCK(&out, NULL, "status", "vv", "--json"), 1);
    ck_assert_msg(strstr(out, "\"value\":\"step 1\",\"value_token\":") && strstr(out, "\"master\":null}\n"),
                  "%s", out);
    free(out);
    free(cmd);
    /* longer than DLOCK_VALUE_MAX: refused, the value stays */
    cmd = strdup("head -c 5000 /dev/zero | tr '\\0' x >\"$DLOCK_VALUE_FILE\"");
    ck_assert_int_eq(DLOCK(NULL, &out, "run", "--value", "vv", "-c", cmd), 65);
    ck_assert_msg(strstr(out, "5000 bytes"), "%s", out);
    free(out);
    ck_assert_int_eq(DLOCK(&out, NULL, "value", "vv"), 0);
    ck_assert_str_eq(out, "step 1");
    free(out);
    ck_assert_int_eq(DLOCK(NULL, NULL, "value"), 64);
    ck_assert_int_eq(DLOCK(NULL, NULL, "value", "a", "b"), 64);
    ck_assert_int_eq(DLOCK(NULL, NULL, "value", "/tmp/vv"), 69);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "--value", "-m", "a", "b", "--", "true"), 64);
    free(cmd);
    free(seen);
}

/* The passwords dlock reads from its environment are dlock's, not
 * COMMAND's: `dlock run` leaves DLOCK_*_PASSWORD out of COMMAND's
 * environment (they reached it, and whatever COMMAND starts, logs or
 * dumps). Everything else in the environment still reaches it. */
TU_TEST(no_password_in_command_env, 60)
{
    const char *env[] = {env_url,
                         "DLOCK_REDIS_PASSWORD=pw-redis-hunter2",
                         "DLOCK_ETCD_PASSWORD=pw-etcd-hunter2",
                         "DLOCK_REDIS_SENTINEL_PASSWORD=pw-sentinel-hunter2",
                         "DLOCK_SOMETHING_PASSWORD=pw-other-hunter2",
                         "NOT_DLOCKS_PASSWORD=kept",
                         NULL};
    char *out, *err;
    ck_assert_int_eq(TU_DLOCK(&out, &err, env, "run", "n", "env"), 0);
    ck_assert_msg(!strstr(out, "hunter2"), "COMMAND saw a password:\n%s", out);
    ck_assert_msg(strstr(out, "NOT_DLOCKS_PASSWORD=kept"), "%s", out);
    ck_assert_msg(strstr(out, "DLOCK_NAME=n"), "%s", out);
    ck_assert_str_eq(err, "");
    free(out);
    free(err);
}

/* Write TEXT to the configuration file at PATH, mode 0644 (as
 * /etc/dlock/dlock.conf would be), making its directory. */
static void write_config(const char *path, const char *text)
{
    char *parent = strdup(path);
    for (char *p = parent + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(parent, 0755);
            *p = '/';
        }
    free(parent);
    tu_write_file(path, text);
    ck_assert_int_eq(chmod(path, 0644), 0);
}

/* The URL COMMAND saw (its DLOCK_URL) when dlock ran with ENV and ARGS
 * before `run n sh -c ...`, asserting that it ran; caller frees. */
static char *url_seen(const char *const env[], const char *u)
{
    char *out;
    int rc = u ? TU_DLOCK(&out, NULL, env, "-u", u, "run", "n", "sh", "-c", "echo \"$DLOCK_URL\"")
               : TU_DLOCK(&out, NULL, env, "run", "n", "sh", "-c", "echo \"$DLOCK_URL\"");
    ck_assert_msg(rc == 0, "dlock run: %d", rc);
    out[strcspn(out, "\n")] = 0;
    return out;
}

/* The file backend has no lease and no server to time out: a file URL's
 * lease=, timeout= or connect_timeout= (from -u, DLOCK_URL or a
 * configuration file) is a URL meant for another backend, or a lease
 * believed in that does not exist; refused in one line naming the option,
 * as layout= and tls_*= are. --lease stays accepted (documented: "on
 * backends with leases"), so one script runs against any DLOCK_URL. */
TU_TEST(file_url_unused_options_refused, 60)
{
    static const char *const opts[] = {"lease=10s", "timeout=2s", "connect_timeout=1s"};
    for (size_t i = 0; i < sizeof opts / sizeof *opts; i++) {
        char *u = tu_fmt("%s?%s", url, opts[i]), *e = tu_fmt("DLOCK_URL=%s", u), *err;
        char *option = tu_fmt("'%.*s'", (int)strcspn(opts[i], "="), opts[i]);
        ck_assert_int_eq(DLOCK(NULL, &err, "-u", u, "run", "n", "true"), 78);
        ck_assert_msg(strstr(err, option) && strstr(err, "file backend") && count_lines(err) == 1,
                      "%s", err);
        free(err);
        ck_assert_int_eq(TU_DLOCK(NULL, &err, ((const char *[]){e, NULL}), "status", "n"), 78);
        ck_assert_msg(strstr(err, option), "%s", err);
        free(err);
        free(option), free(e), free(u);
    }
    char *conf = tu_fmt("%s/lease.conf", dir), *env_conf = tu_fmt("DLOCK_CONFIG=%s", conf), *err;
    char *text = tu_fmt("url = %s\nlease = 30s\n", url);
    tu_write_file(conf, text);
    ck_assert_int_eq(TU_DLOCK(NULL, &err, ((const char *[]){env_conf, NULL}), "run", "n", "true"),
                     78);
    ck_assert_msg(strstr(err, "'lease'") && strstr(err, conf), "%s", err);
    free(err), free(text), free(env_conf), free(conf);
    char *pfx = tu_fmt("%s?prefix=app-", url);
    ck_assert_int_eq(DLOCK(NULL, NULL, "-u", pfx, "run", "--lease", "2", "n", "true"), 0);
    free(pfx);
}

/* A configuration file gives the URL a crontab line would otherwise need
 * -u for: key = value lines (url, then any URL option), # comments.
 * DLOCK_CONFIG names it (tests write no /etc), else
 * $XDG_CONFIG_HOME/dlock/dlock.conf, else ~/.config/dlock/dlock.conf,
 * else /etc/dlock/dlock.conf; DLOCK_URL and -u override it; -v says which
 * file and which URL were used. */
TU_TEST(config_file, 60)
{
    char *conf = tu_fmt("%s/etc/dlock.conf", dir), *locks = tu_fmt("%s/fromconf", dir);
    mkdir(locks, 0700);
    char *text = tu_fmt("# the nightly jobs' locks\n\n  url = file://%s\n"
                        "   # indented comment\nprefix = nightly-\n", locks);
    write_config(conf, text);
    char *env_conf = tu_fmt("DLOCK_CONFIG=%s", conf);
    const char *env[] = {env_conf, NULL};
    char *want = tu_fmt("file://%s?prefix=nightly-", locks);
    char *seen = url_seen(env, NULL);
    ck_assert_str_eq(seen, want);
    free(seen);
    char *err;
    /* -v: the file and the URL */
    ck_assert_int_eq(TU_DLOCK(NULL, &err, env, "run", "-v", "n", "true"), 0);
    ck_assert_msg(strstr(err, conf) && strstr(err, want), "%s", err);
    free(err);
    ck_assert_int_eq(TU_DLOCK(NULL, &err, env, "-v", "status", "n"), 1);
    ck_assert_msg(strstr(err, conf) && strstr(err, want), "%s", err);
    free(err);
    /* DLOCK_URL, then -u, override the file */
    const char *env_both[] = {env_conf, env_url, NULL};
    seen = url_seen(env_both, NULL);
    ck_assert_str_eq(seen, url);
    free(seen);
    char *other = tu_fmt("file://%s", locks);
    seen = url_seen(env_both, other);
    ck_assert_str_eq(seen, other);
    free(seen);
    ck_assert_int_eq(TU_DLOCK(NULL, &err, env_both, "run", "-v", "n", "true"), 0);
    ck_assert_msg(strstr(err, "DLOCK_URL") && !strstr(err, conf), "%s", err);
    free(err);
    /* $XDG_CONFIG_HOME/dlock/dlock.conf, else ~/.config/dlock/dlock.conf */
    char *xdg = tu_fmt("%s/xdg", dir), *xdg_conf = tu_fmt("%s/xdg/dlock/dlock.conf", dir);
    char *home = tu_fmt("%s/home", dir), *home_conf = tu_fmt("%s/home/.config/dlock/dlock.conf", dir);
    write_config(xdg_conf, "url = file:///tmp\n");
    write_config(home_conf, text);
    char *env_xdg = tu_fmt("XDG_CONFIG_HOME=%s", xdg), *env_home = tu_fmt("HOME=%s", home);
    const char *env_user[] = {"DLOCK_CONFIG", env_xdg, env_home, NULL}; /* DLOCK_CONFIG unset */
    seen = url_seen(env_user, NULL);
    ck_assert_str_eq(seen, "file:///tmp");
    free(seen);
    const char *env_noxdg[] = {"DLOCK_CONFIG", "XDG_CONFIG_HOME=", env_home, NULL};
    seen = url_seen(env_noxdg, NULL);
    ck_assert_str_eq(seen, want);
    free(seen);
    /* an empty DLOCK_CONFIG reads no file: the library's default */
    const char *env_none[] = {"DLOCK_CONFIG=", env_home, NULL};
    seen = url_seen(env_none, NULL);
    ck_assert_msg(strncmp(seen, "file://", 7) == 0 && !strstr(seen, "fromconf"), "%s", seen);
    free(seen);
    free(env_home);
    free(env_xdg);
    free(home_conf);
    free(home);
    free(xdg_conf);
    free(xdg);
    free(other);
    free(want);
    free(env_conf);
    free(text);
    free(locks);
    free(conf);
}

/* What is wrong with a configuration file is said with its path and line,
 * exit 78; a password is not kept in one (password_file = instead). */
TU_TEST(config_file_errors, 60)
{
    char *conf = tu_fmt("%s/dlock.conf", dir), *env_conf = tu_fmt("DLOCK_CONFIG=%s", conf);
    const char *env[] = {env_conf, NULL};
    static const struct {
        const char *text, *word;
    } bad[] = {
        {"url = file:///tmp\nthis line has no equals sign\n", "dlock.conf:2"},
        {"url = file:///tmp\ncolour = blue\n", "colour"},
        {"url = file:///tmp\nlease = 1s\nlease = 2s\n", "dlock.conf:3"},
        {"lease = 30s\n", "url"},
        {"url = \n", "dlock.conf:1"},
        {"url = file:///tmp\npassword = hunter2\n", "password_file"},
        {"url = redis://:hunter2@127.0.0.1:1\n", "password_file"},
        {"url = redis://127.0.0.1:1?sentinel_password=hunter2\n", "password_file"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_config(conf, bad[i].text);
        char *err;
        int rc = TU_DLOCK(NULL, &err, env, "run", "n", "true");
        ck_assert_msg(rc == 78 && strstr(err, conf) && strstr(err, bad[i].word) &&
                          !strstr(err, "hunter2"),
                      "'%s': %d %s", bad[i].text, rc, err);
        free(err);
    }
    /* DLOCK_CONFIG names a file that is not there: said, not ignored */
    char *missing = tu_fmt("DLOCK_CONFIG=%s/none.conf", dir);
    const char *env_missing[] = {missing, NULL};
    char *err;
    ck_assert_int_eq(TU_DLOCK(NULL, &err, env_missing, "run", "n", "true"), 78);
    ck_assert_msg(strstr(err, "none.conf"), "%s", err);
    free(err);
    /* -u overrides a broken file without reading it */
    write_config(conf, "nonsense\n");
    ck_assert_int_eq(TU_DLOCK(NULL, NULL, env, "-u", url, "run", "n", "true"), 0);
    free(missing);
    free(env_conf);
    free(conf);
}

/* A password in -u is visible to every user in ps: said on stderr (and
 * the run goes on); password_file= in the URL is not warned about. A
 * password file the configuration names is checked as the library checks
 * it (here: readable by others, refused naming it). On a Redis server
 * that wants the password: the file backend refuses password options. */
#ifdef DLOCK_HAVE_REDIS
TU_TEST(password_in_argv_warned, 120)
{
    struct fx_redis r = {0};
    const char *extra[] = {"--requirepass", "hunter2", NULL};
    ck_assert_msg(fx_redis_start(&r, extra), "redis-server could not be started");
    const char *base = r.url, *sep = strchr(base, '?') ? "&" : "?";
    char *u = tu_fmt("%s%spassword=hunter2", base, sep);
    char *err;
    ck_assert_int_eq(DLOCK(NULL, &err, "-u", u, "run", "n", "true"), 0);
    ck_assert_msg(strstr(err, "warning") && strstr(err, "ps") && strstr(err, "password_file") &&
                      !strstr(err, "hunter2"),
                  "%s", err);
    free(err);
    ck_assert_int_eq(DLOCK(NULL, &err, "run", "-u", u, "n", "true"), 0);
    ck_assert_msg(strstr(err, "warning"), "%s", err);
    free(err);
    char *pw = tu_fmt("%s/pw", dir);
    tu_write_file(pw, "hunter2\n");
    ck_assert_int_eq(chmod(pw, 0600), 0);
    char *uf = tu_fmt("%s%spassword_file=%s", base, sep, pw);
    ck_assert_int_eq(DLOCK(NULL, &err, "-u", uf, "run", "n", "true"), 0);
    ck_assert_str_eq(err, "");
    free(err);
    /* the same file named by a configuration file, then made readable */
    char *conf = tu_fmt("%s/dlock.conf", dir), *env_conf = tu_fmt("DLOCK_CONFIG=%s", conf);
    char *text = tu_fmt("url = %s\npassword_file = %s\n", base, pw);
    write_config(conf, text);
    const char *env[] = {env_conf, NULL};
    ck_assert_int_eq(TU_DLOCK(NULL, &err, env, "run", "n", "true"), 0);
    ck_assert_str_eq(err, "");
    free(err);
    ck_assert_int_eq(chmod(pw, 0644), 0);
    ck_assert_int_eq(TU_DLOCK(NULL, &err, env, "run", "n", "true"), 77);
    ck_assert_msg(strstr(err, pw) && strstr(err, "group or others"), "%s", err);
    free(err);
    free(text);
    free(env_conf);
    free(conf);
    free(uf);
    free(pw);
    free(u);
    fx_redis_stop(&r);
}
#endif

/* Eight workers each add 1 to a shared counter file ROUNDS times, each
 * addition a `dlock run`: no addition may be lost. 50 rounds each in
 * `make check`; the whole 200 (1,600 sections, ~50 s) in make check-long. */
TU_TEST(counter_8_workers, 120)
{
    const int rounds = tu_long() ? 200 : 50;
    char *counter = tu_fmt("%s/counter", dir);
    tu_write_file(counter, "0\n");
    /* Each worker waited for by pid (wait -n can miss a worker that ended
     * early and fail with no word said), and a failure says which. */
    char *script = tu_fmt("pids=; for w in 1 2 3 4 5 6 7 8; do "
                          "  (i=0; while [ $i -lt %d ]; do "
                          "     '%s' run counter -c 'n=$(cat %s); echo $((n+1)) > %s' || "
                          "     { echo \"worker $w, round $i: dlock exit $?\" >&2; exit 1; }; "
                          "     i=$((i+1)); done) & pids=\"$pids $!\"; "
                          "done; fail=0; for p in $pids; do wait $p || fail=1; done; "
                          "exit $fail",
                          rounds, tu_dlock_bin(), counter, counter);
    const char *argv[] = {"bash", "-c", script, NULL};
    const char *env[] = {env_url, NULL};
    char *err;
    int rc = tu_run(argv, env, NULL, &err);
    ck_assert_msg(rc == 0, "a worker failed (exit %d): %s", rc, err);
    free(err);
    char *text = tu_read_file(counter), *want = tu_fmt("%d\n", 8 * rounds);
    ck_assert_str_eq(text, want);
    free(want);
    free(text);
    free(script);
    free(counter);
}

TU_TEST(kill9, 120)
{
    /* The command dies with a killed dlock: it must not go on unlocked. */
    char *pidfile = tu_fmt("%s/cmd.pid", dir), *cmd = tu_fmt("echo $$ > %s; exec sleep 120", pidfile);
    const char *argv[] = {tu_dlock_bin(), "-u", url, "run", "orphan", "-c", cmd, NULL};
    pid_t d = tu_spawn(argv, NULL);
    ck_assert(tu_wait_file(pidfile, 20000));
    tu_sleep_ms(50);
    char *text = tu_read_file(pidfile);
    pid_t cmd_pid = (pid_t)atoi(text);
    ck_assert_int_gt(cmd_pid, 0);
    kill(d, SIGKILL);
    waitpid(d, NULL, 0);
    bool gone = false;
    for (int i = 0; i < 1000 && !gone; i++) {
        gone = kill(cmd_pid, 0) < 0;
        if (!gone)
            tu_sleep_ms(10);
    }
    ck_assert_msg(gone, "command %d outlived its killed dlock", (int)cmd_pid);
    free(text);
    free(cmd);
    free(pidfile);

    pid_t h = start_holder("k9", "");
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-n", "k9", "true"), 1);
    kill(h, SIGKILL); /* the dlock process, not its command */
    /* Unbounded wait: only the kernel freeing the lock lets this return. */
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "k9", "true"), 0);
    stop_holder(h); /* reap, and end the orphaned sleep's group */
}

/* Wait until process PID blocks SIG (dlock run blocks its signals before
 * it opens anything): from then on a signal cannot kill it outright. */
static bool wait_blocked(pid_t pid, int sig, int timeout_ms)
{
    char *path = tu_fmt("/proc/%d/status", (int)pid);
    bool blocked = false;
    for (int waited = 0; !blocked && waited <= timeout_ms; waited += 5) {
        char *text = tu_read_file(path), *line = text ? strstr(text, "\nSigBlk:") : NULL;
        unsigned long long mask = 0;
        if (line && sscanf(line, "\nSigBlk: %llx", &mask) == 1)
            blocked = (mask >> (sig - 1)) & 1;
        free(text);
        if (!blocked)
            tu_sleep_ms(5);
    }
    free(path);
    return blocked;
}

/* kill -9 of a holder under load, file backend: its job (a shell loop at
 * idle priority whose date(1) children append "A <time>" lines to a log:
 * grandchildren of dlock) must be gone
 * before the next holder's job appends its "B" line -- with CPU burners,
 * the idle job gets the CPU late, which is when a lock freed as dlock died
 * let B run beside it. Asserted on the order of the log's lines and on
 * the intervals of their timestamps, never on durations. */
TU_TEST(kill9_under_load, 240)
{
    for (int round = 0; round < 3; round++) {
        char *log = tu_fmt("%s/load-%d.log", dir, round);
        char *a_cmd = tu_fmt("while :; do date '+A %%s.%%N' >> %s; done", log);
        char *b_cmd = tu_fmt("date '+B %%s.%%N' >> %s", log);
        const char *a_argv[] = {"chrt", "--idle", "0", tu_dlock_bin(), "-u", url,
                                "run", "load", "-c", a_cmd, NULL};
        const char *b_argv[] = {tu_dlock_bin(), "-u", url, "run", "load", "-c", b_cmd, NULL};
        const char *burn_argv[] = {"sh", "-c", "while :; do :; done", NULL};
        pid_t a = tu_spawn(a_argv, NULL);
        ck_assert_msg(tu_wait_file(log, 30000), "the idle holder never wrote");
        pid_t burners[3];
        for (int i = 0; i < 3; i++)
            burners[i] = tu_spawn(burn_argv, NULL);
        pid_t b = tu_spawn(b_argv, NULL);
        ck_assert(wait_blocked(b, SIGTERM, 30000)); /* about to wait, or waiting */
        kill(a, SIGKILL);
        ck_assert_int_eq(tu_wait_exit(b), 0);
        tu_wait_exit(a);
        for (int i = 0; i < 3; i++)
            tu_stop(burners[i], 0);
        char *text = tu_read_file(log);
        double a_last = 0, b_first = 0, t;
        char who;
        int lines = 0;
        bool b_seen = false;
        for (char *line = text; *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : "") {
            ck_assert_msg(sscanf(line, "%c %lf", &who, &t) == 2, "bad line in %s", text);
            lines++;
            ck_assert_msg(!(b_seen && who == 'A'),
                          "round %d: the killed holder's job wrote after the next holder's "
                          "(line %d):\n%s", round, lines, text);
            if (who == 'B' && !b_seen)
                b_first = t, b_seen = true;
            if (who == 'A')
                a_last = t;
        }
        ck_assert_msg(b_seen, "no B line:\n%s", text);
        ck_assert_msg(a_last <= b_first, "round %d: A's interval ends at %.2f, after B's starts "
                      "at %.2f", round, a_last, b_first);
        free(text);
        free(b_cmd);
        free(a_cmd);
        free(log);
    }
}

static void signal_while_waiting(int sig, int expect)
{
    pid_t h = start_holder("sigwait", "");
    const char *argv[] = {tu_dlock_bin(), "-u", url, "run", "sigwait", "true", NULL};
    pid_t w = tu_spawn(argv, NULL);
    /* As soon as it can take the signal: whether or not its wait has
     * begun, the signal ends it (the cancel object has no race). */
    ck_assert(wait_blocked(w, sig, 20000));
    kill(w, sig);
    int st;
    waitpid(w, &st, 0);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == expect, "status %#x", st);
    stop_holder(h);
    /* The interrupted waiter left nothing held. */
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-n", "sigwait", "true"), 0);
}

TU_TEST(sigterm_waiting, 120)
{
    signal_while_waiting(SIGTERM, 143);
}

TU_TEST(sigint_waiting, 120)
{
    signal_while_waiting(SIGINT, 130);
}

/* Set in the environment of this binary run as COMMAND (see main): count
 * the SIGTERMs it gets, one line each, in the file it names. */
#define TERM_COUNTER_ENV "DLOCK_CLI_TERM_COUNTER"
static int term_counter_fd = -1;

static void count_term(int sig)
{
    (void)sig;
    ssize_t n = write(term_counter_fd, "T\n", 2);
    (void)n;
}

static int term_counter_main(const char *path)
{
    term_counter_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    struct sigaction sa = {.sa_handler = count_term};
    sigaction(SIGTERM, &sa, NULL);
    char *ready = tu_fmt("%s.ready", path);
    tu_write_marker(ready, "");
    free(ready);
    for (int i = 0; i < 20; i++) /* long enough for a second delivery to land */
        tu_sleep_ms(50);
    return 0;
}

/* A signal sent to dlock reaches each process of the job once: COMMAND's
 * group gets it, and the walk below the guardian skips that group. */
TU_TEST(signal_once, 60)
{
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    ck_assert_int_gt(n, 0);
    exe[n] = 0;
    char *counter = tu_fmt("%s/terms", dir), *ready = tu_fmt("%s.ready", counter);
    setenv(TERM_COUNTER_ENV, counter, 1);
    const char *argv[] = {tu_dlock_bin(), "-u", url, "run", "once", exe, NULL};
    pid_t d = tu_spawn(argv, NULL);
    ck_assert(tu_wait_file(ready, 30000));
    kill(d, SIGTERM);
    ck_assert_int_eq(tu_wait_exit(d), 0);
    char *text = tu_read_file(counter);
    ck_assert_msg(text && strcmp(text, "T\n") == 0, "COMMAND got SIGTERM %d times",
                  text ? count_lines(text) : 0);
    free(text);
    free(ready);
    free(counter);
}

TU_TEST(signal_running, 120)
{
    char *marker = tu_fmt("%s/running", dir);
    char *cmd = tu_fmt("trap 'exit 5' TERM; touch %s; while :; do sleep 0.05; done", marker);
    const char *argv[] = {tu_dlock_bin(), "-u", url, "run", "sigrun", "-c", cmd, NULL};
    pid_t d = tu_spawn(argv, NULL);
    ck_assert(tu_wait_file(marker, 20000));
    kill(d, SIGTERM); /* passed on to the command, which exits 5 */
    int st;
    waitpid(d, &st, 0);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 5, "status %#x", st);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-n", "sigrun", "true"), 0);
    free(cmd);
    free(marker);
}

/* The signal thread cannot start (every pthread_create() fails, as under a
 * thread or memory limit: tests/preload/no_threads.c): `dlock run` must
 * fail cleanly -- one line naming the thread, exit 70, COMMAND not run,
 * the lock left free -- on a name and on a path alike. Before, the
 * failure went unchecked: COMMAND ran with SIGTERM, SIGINT and SIGHUP
 * blocked in dlock and nobody to pass them on. */
TU_TEST(signal_thread_cannot_start, 60)
{
    char *ran = tu_fmt("%s/ran", dir), *cmd = tu_fmt("touch %s", ran);
    char *path = tu_fmt("%s/path-lock", dir);
    const char *preload[] = {env_url, "LD_PRELOAD=" CLI_NO_THREADS_SO,
                             "ASAN_OPTIONS=verify_asan_link_order=0", NULL};
    const char *names[] = {"nothread", path};
    for (size_t i = 0; i < 2; i++) {
        char *err;
        int rc = TU_DLOCK(NULL, &err, preload, "run", names[i], "-c", cmd);
        ck_assert_msg(rc == 70 && strstr(err, "signal thread") && count_lines(err) == 1,
                      "%s: exit %d: %s", names[i], rc, err);
        ck_assert_msg(access(ran, F_OK) != 0, "%s: COMMAND ran without a signal thread",
                      names[i]);
        ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-n", names[i], "true"), 0);
        free(err);
    }
    free(path);
    free(cmd);
    free(ran);
}

/* The first child of PID (as /proc lists them) that is not EXCEPT, or 0. */
static pid_t child_of(pid_t pid, pid_t except)
{
    char *path = tu_fmt("/proc/%d/task/%d/children", (int)pid, (int)pid);
    char *text = tu_read_file(path);
    pid_t kid = 0;
    for (char *p = text, *end; p && *p && !kid; p = end) {
        long k = strtol(p, &end, 10);
        if (end == p)
            break;
        if (k != except)
            kid = (pid_t)k;
    }
    free(text);
    free(path);
    return kid;
}

/* Whether PID has exited (gone, or a zombie not yet reaped). */
static bool exited(pid_t pid)
{
    char *path = tu_fmt("/proc/%d/stat", (int)pid);
    char *text = tu_read_file(path);
    const char *close = text ? strrchr(text, ')') : NULL;
    bool gone = !close || close[1] == '\0' || close[2] == 'Z' || close[2] == 'X';
    free(text);
    free(path);
    return gone;
}

/* Kill the guardian of `dlock run` D (its child other than EXCEPT) from
 * outside, reap D, which fails then, and say whether the job's process
 * JOB exited too (within a bound so that a survivor fails the test, not
 * a claim on time; a survivor is killed). */
static bool guardian_killed_ends(pid_t d, pid_t except, pid_t job)
{
    pid_t guardian = child_of(d, except);
    ck_assert_int_gt(guardian, 0);
    kill(guardian, SIGKILL);
    ck_assert_int_ne(tu_wait_exit(d), 0);
    bool gone = false;
    for (int i = 0; i < 2000 && !(gone = exited(job)); i++)
        tu_sleep_ms(10);
    if (!gone)
        kill(job, SIGKILL);
    return gone;
}

/* The guardian killed from outside (kill -9 of it alone): dlock kills
 * what is left of the job -- here a process COMMAND started in a session
 * of its own, which its process group never reached -- and does it
 * without kill(-PGID), whose group may be empty by then and its number
 * another's: dlock is the job's subreaper, so the rest is its own. */
TU_TEST(guardian_killed, 60)
{
    char *pidfile = tu_fmt("%s/escaped", dir);
    char *cmd = tu_fmt("setsid sleep 1000 & echo $! > %s.tmp && mv %s.tmp %s; exec sleep 1000",
                       pidfile, pidfile, pidfile);
    const char *argv[] = {tu_dlock_bin(), "-u", url, "run", "guarded", "-c", cmd, NULL};
    pid_t d = tu_spawn(argv, NULL);
    ck_assert(tu_wait_file(pidfile, 30000));
    char *text = tu_read_file(pidfile);
    pid_t escaped = (pid_t)strtol(text, NULL, 10);
    ck_assert_int_gt(escaped, 0);
    ck_assert_msg(guardian_killed_ends(d, 0, escaped),
                  "a process of the job outlived its guardian and dlock");
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-n", "guarded", "true"), 0);
    free(text);
    free(cmd);
    free(pidfile);
}

/* A process of the job that SIGKILL does not end (here held at its exit
 * by the test, its tracer with PTRACE_O_TRACEEXIT: what a process in
 * uninterruptible sleep does, a hung NFS read, made on demand): when the
 * guardian is killed from outside, dlock kills it, gives up waiting for
 * it after a bound, names it, and exits. Before, dlock waited for it in
 * a blocking waitpid(): `dlock run` hung as long as it did. */
TU_TEST(guardian_killed_with_a_process_that_does_not_end, 60)
{
    char *pidfile = tu_fmt("%s/held", dir), *log = tu_fmt("%s/held.log", dir);
    char *cmd = tu_fmt("setsid sleep 1000 & echo $! > %s.tmp && mv %s.tmp %s; exec sleep 1000",
                       pidfile, pidfile, pidfile);
    const char *argv[] = {tu_dlock_bin(), "-u", url, "run", "held", "-c", cmd, NULL};
    pid_t d = tu_spawn(argv, log);
    ck_assert(tu_wait_file(pidfile, 30000));
    pid_t held = (pid_t)tu_read_u64(pidfile);
    ck_assert_int_gt(held, 0);
    ck_assert_msg(ptrace(PTRACE_SEIZE, held, NULL, (void *)PTRACE_O_TRACEEXIT) == 0,
                  "ptrace(PTRACE_SEIZE, %d): %s", (int)held, strerror(errno));
    pid_t guardian = child_of(d, 0);
    ck_assert_int_gt(guardian, 0);
    kill(guardian, SIGKILL);
    /* dlock must exit while HELD is still held at its exit stop */
    bool dlock_exited = false;
    for (int i = 0; i < 3000 && !(dlock_exited = waitpid(d, NULL, WNOHANG) == d); i++)
        tu_sleep_ms(10);
    bool held_stopped = !exited(held);
    ptrace(PTRACE_DETACH, held, NULL, NULL); /* (at its exit stop: it exits now) */
    kill(held, SIGKILL);
    if (!dlock_exited) {
        kill(d, SIGKILL);
        tu_wait_exit(d);
    }
    ck_assert_msg(held_stopped, "the traced process was not held at its exit");
    ck_assert_msg(dlock_exited, "dlock run still waiting for a process SIGKILL did not end");
    char *text = tu_read_file(log), *named = tu_fmt("process %d of the job", (int)held);
    ck_assert_msg(text && strstr(text, named), "dlock's stderr does not name %d: %s", (int)held,
                  text ? text : "(none)");
    free(named);
    free(text);
    free(cmd);
    free(log);
    free(pidfile);
}

/* dlock run exec'd by a shell that left a child behind (`sleep 1000 &
 * exec dlock run ...`): when the guardian is killed from outside, dlock
 * kills what is left of the job (COMMAND) and spares that child, which
 * was never the job's -- and exits without waiting for it. Before, every
 * child of dlock was killed. */
TU_TEST(guardian_killed_spares_children_from_before, 60)
{
    char *before = tu_fmt("%s/before", dir), *command = tu_fmt("%s/command", dir);
    char *cmd = tu_fmt("sleep 1000 & echo $! > %s.tmp && mv %s.tmp %s; exec %s -u %s run spared "
                       "-c 'echo $$ > %s.tmp && mv %s.tmp %s; exec sleep 1000'",
                       before, before, before, tu_dlock_bin(), url, command, command, command);
    const char *argv[] = {"sh", "-c", cmd, NULL};
    pid_t d = tu_spawn(argv, NULL);
    ck_assert(tu_wait_file(before, 30000));
    ck_assert(tu_wait_file(command, 30000));
    pid_t old = (pid_t)tu_read_u64(before), job = (pid_t)tu_read_u64(command);
    ck_assert_int_gt(old, 0);
    ck_assert_int_gt(job, 0);
    bool job_gone = guardian_killed_ends(d, old, job);
    bool old_alive = !exited(old);
    kill(old, SIGKILL);
    ck_assert_msg(job_gone, "COMMAND outlived its guardian and dlock");
    ck_assert_msg(old_alive, "dlock killed a child it had before the job");
    free(cmd);
    free(command);
    free(before);
}

/* The parent of PID by /proc/PID/stat, 0 when it is gone. */
static pid_t parent_pid(pid_t pid)
{
    char *path = tu_fmt("/proc/%d/stat", (int)pid);
    char *text = tu_read_file(path);
    const char *close = text ? strrchr(text, ')') : NULL;
    int ppid = 0;
    if (!close || sscanf(close + 1, " %*c %d", &ppid) != 1)
        ppid = 0;
    free(text);
    free(path);
    return (pid_t)ppid;
}

/* Whether PID is ROOT or below it. */
static bool in_tree(pid_t pid, pid_t root)
{
    for (int depth = 0; pid > 1 && depth < 64; depth++, pid = parent_pid(pid))
        if (pid == root)
            return true;
    return false;
}

/* What `killall -9 dlock` / `pkill -9 dlock` (WHAT "dlock": a process
 * whose name, /proc/PID/comm, holds it) or `pkill -9 -f PATTERN` (WHAT
 * any other string: its command line, arguments joined by spaces, holds
 * it) do, kept to ROOT and the processes below it so that no other
 * test's dlock is hit: every match is found first, then all are killed.
 * Returns how many. */
static int kill_by_name(pid_t root, const char *what)
{
    bool by_comm = strcmp(what, "dlock") == 0;
    pid_t hit[64];
    int n = 0;
    DIR *d = opendir("/proc");
    ck_assert_ptr_nonnull(d);
    for (struct dirent *de; (de = readdir(d)) && n < 64;) {
        pid_t pid = (pid_t)atoi(de->d_name);
        if (pid <= 0 || !in_tree(pid, root))
            continue;
        char *path = tu_fmt("/proc/%d/%s", (int)pid, by_comm ? "comm" : "cmdline");
        int fd = open(path, O_RDONLY);
        char buf[8192];
        ssize_t len = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
        if (fd >= 0)
            close(fd);
        free(path);
        if (len <= 0)
            continue;
        for (ssize_t i = 0; i < len; i++)
            buf[i] = buf[i] ? buf[i] : ' ';
        buf[len] = 0;
        if (strstr(buf, what))
            hit[n++] = pid;
    }
    closedir(d);
    for (int i = 0; i < n; i++)
        kill(hit[i], SIGKILL);
    return n;
}

/* `dlock run NAME` on URL (LEASE: --lease, or NULL) whose COMMAND leaves
 * a loop writing A lines to a file in the background, then every dlock
 * process killed by name as kill_by_name(WHAT) does: the loop must end
 * (a bounded wait; a survivor fails the test, not a claim on time), and
 * the next holder's section, B to C in the same file, must see no A.
 * Before, `killall -9 dlock` hit the guardian too (same name): COMMAND
 * died with it and the loop, reparented above dlock, wrote on unlocked
 * -- on the file backend keeping the lock from the next holder, on Redis
 * beside it once the lease ended. */
static void killed_by_name(const char *u, const char *lease, const char *name, const char *what)
{
    char *out = tu_fmt("%s/%s.out", dir, name), *pidfile = tu_fmt("%s/%s.pid", dir, name);
    char *cmd = tu_fmt("sh -c 'while :; do echo A >> %s; sleep 0.05; done' & "
                       "echo $! > %s.tmp && mv %s.tmp %s; exec sleep 1000",
                       out, pidfile, pidfile, pidfile);
    const char *argv[] = {tu_dlock_bin(), "-u", u, "run", "--lease", lease ? lease : "",
                          name, "-c", cmd, NULL};
    if (!lease) /* no --lease */
        memmove(&argv[4], &argv[6], 4 * sizeof *argv);
    pid_t d = tu_spawn(argv, NULL);
    ck_assert(tu_wait_file(pidfile, 30000));
    ck_assert(tu_wait_file(out, 30000));
    pid_t loop = (pid_t)tu_read_u64(pidfile);
    ck_assert_int_gt(loop, 0);
    char *pattern = strcmp(what, "dlock") == 0 ? tu_fmt("%s", what) : tu_fmt("-u %s run", u);
    int killed = kill_by_name(d, pattern);
    tu_wait_exit(d);
    bool gone = false;
    for (int i = 0; i < 2000 && !(gone = exited(loop)); i++)
        tu_sleep_ms(10);
    char *next = tu_fmt("echo B >> %s; sleep 0.3; echo C >> %s", out, out);
    int rc = TU_DLOCK(NULL, NULL, NULL, "-u", u, "run", "-w", "30", name, "-c", next);
    kill(loop, SIGKILL);
    char *text = tu_read_file(out), *b = text ? strstr(text, "B\n") : NULL;
    char *c = b ? strstr(b, "C\n") : NULL;
    bool overlap = b && c && memchr(b, 'A', (size_t)(c - b));
    ck_assert_msg(gone, "%s: a process of the job outlived dlock killed by name ('%s', %d killed)",
                  name, pattern, killed);
    ck_assert_msg(rc == 0 && b && c, "%s: the next holder did not run (exit %d)", name, rc);
    ck_assert_msg(!overlap, "%s: the killed job wrote inside the next holder's section", name);
    free(text);
    free(next);
    free(pattern);
    free(cmd);
    free(pidfile);
    free(out);
}

/* dlock run OPT U_NAME with a COMMAND that leaves behind a process
 * waiting for a file and exits 3: dlock returns when COMMAND exits, with
 * its status and without a word on stderr, and leaves that process
 * alone; U_NAME is then busy (HELD_BY_IT) until that process exits, or
 * free at once. */
static void left_behind(const char *opt, const char *u_name, bool held_by_it)
{
    char *pidfile = tu_fmt("%s/left.pid", dir), *go = tu_fmt("%s/left.go", dir);
    char *log = tu_fmt("%s/left.log", dir);
    char *cmd = tu_fmt("sh -c 'while [ ! -e %s ]; do sleep 0.05; done' & "
                       "echo $! > %s.tmp && mv %s.tmp %s; exit 3",
                       go, pidfile, pidfile, pidfile);
    const char *argv[] = {tu_dlock_bin(), "-u", url, "run", opt, u_name, "-c", cmd, NULL};
    pid_t d = tu_spawn(argv, log);
    int st = 0;
    bool returned = false;
    for (int i = 0; i < 2000 && !(returned = waitpid(d, &st, WNOHANG) == d); i++)
        tu_sleep_ms(10);
    ck_assert(tu_wait_file(pidfile, 30000));
    pid_t left = (pid_t)tu_read_u64(pidfile);
    bool alive = left > 0 && !exited(left);
    int busy = DLOCK(NULL, NULL, "run", "-n", u_name, "true");
    tu_write_file(go, "");
    if (!returned)
        waitpid(d, &st, 0);
    char *said = tu_read_file(log);
    ck_assert_msg(returned, "dlock run %s waited for a process COMMAND left behind: %s", opt,
                  said ? said : "");
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 3, "status %#x: %s", st, said ? said : "");
    ck_assert_msg(alive, "the process COMMAND left behind was not left alone");
    ck_assert_msg(busy == (held_by_it ? 1 : 0), "%s: %s after COMMAND exited (exit %d)", opt,
                  held_by_it ? "the name is not held by what COMMAND left behind"
                             : "the name is still held",
                  busy);
    ck_assert_msg(!said || !*said, "a line on stderr without -v: %s", said);
    int free_now = 1;
    for (int i = 0; i < 600 && free_now; i++) { /* free once it exits */
        free_now = exited(left) ? DLOCK(NULL, NULL, "run", "-n", u_name, "true") : 1;
        if (free_now)
            tu_sleep_ms(50);
    }
    ck_assert_msg(free_now == 0, "%s still held after the last process exited", u_name);
    free(said), free(cmd), free(log), free(go), free(pidfile);
}

/* -o (--close) as flock(1) means it: what COMMAND started never had the
 * lock's descriptor: the name is free at once. Before, -o was accepted
 * and ignored: dlock held the lock until that process exited, and said
 * so on stderr. */
TU_TEST(close_returns_when_command_exits, 60)
{
    left_behind("-o", "left", false);
}

/* --no-wait-children, flock(1)'s default behaviour: on the file backend
 * and the path form what COMMAND started kept the lock's inherited
 * descriptor: the name stays held while that process lives. */
static void leave_keeps_lock_with_descendants(const char *u_name)
{
    left_behind("--no-wait-children", u_name, true);
}

TU_TEST(leave_keeps_lock_with_descendants_file, 60)
{
    leave_keeps_lock_with_descendants("leave");
}

TU_TEST(leave_keeps_lock_with_descendants_path, 60)
{
    char *path = tu_fmt("%s/leave.path", dir);
    leave_keeps_lock_with_descendants(path);
    free(path);
}

/* dlock stopped on the file backend, where a hold has no lease: the
 * job goes on (its guardian has no deadline to keep), the name stays
 * held, and once dlock is continued a SIGTERM to it ends the job as
 * usual (143), with no word of a lock at risk. */
TU_TEST(paused_dlock_file, 60)
{
    char *out = tu_fmt("%s/paused.out", dir), *log = tu_fmt("%s/paused.log", dir);
    char *cmd = tu_fmt("while :; do echo A >> %s; sleep 0.05; done", out);
    const char *argv[] = {tu_dlock_bin(), "-u", url, "run", "pausedf", "-c", cmd, NULL};
    pid_t d = tu_spawn(argv, log);
    ck_assert(tu_wait_file(out, 30000));
    tu_pause(d);
    char *text = tu_read_file(out);
    int lines = text ? count_lines(text) : 0, now = lines;
    for (int i = 0; i < 3000 && now < lines + 20; i++) {
        tu_sleep_ms(10);
        free(text);
        text = tu_read_file(out);
        now = text ? count_lines(text) : 0;
    }
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-n", "pausedf", "true"), 1);
    kill(d, SIGCONT);
    kill(d, SIGTERM);
    int code = tu_wait_exit(d);
    char *said = tu_read_file(log);
    ck_assert_msg(now >= lines + 20, "the job stopped while dlock was stopped (%d lines, then %d)",
                  lines, now);
    ck_assert_msg(code == 143 && !(said && strstr(said, "at risk")), "dlock exit %d: %s", code,
                  said ? said : "");
    free(said);
    free(text);
    free(cmd);
    free(log);
    free(out);
}

TU_TEST(killed_by_name_file, 120)
{
    killed_by_name(url, NULL, "byname", "dlock");
    killed_by_name(url, NULL, "bycmdline", "cmdline");
}

#ifdef DLOCK_HAVE_REDIS
TU_TEST(killed_by_name_redis, 120)
{
    struct fx_redis r;
    start_redis(&r);
    killed_by_name(r.url, "2", "byname", "dlock");
    killed_by_name(r.url, "2", "bycmdline", "cmdline");
    fx_redis_stop(&r);
}
#endif

TU_TEST(shared, 120)
{
    pid_t h = start_holder("rw", "-s");
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-s", "-n", "rw", "true"), 0);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-n", "rw", "true"), 1);
    stop_holder(h);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-n", "rw", "true"), 0);
}

/* COMMAND inherits what dlock inherited and nothing dlock opened -- but,
 * on the file backend, a copy of the lock's own descriptor (LOCK_FDS: 1;
 * as flock(1) gives its COMMAND): a wrapper shell lists its descriptors
 * (fd 7 opened for the occasion), execs dlock, and COMMAND lists its own,
 * those open on the lock file apart. */
static void check_command_fds(const char *u, int lock_fds)
{
    char *before = tu_fmt("%s/fds-before", dir), *after = tu_fmt("%s/fds-after", dir);
    char *locks = tu_fmt("%s/fds-lock", dir);
    const char *list = "l() { for f in /proc/$$/fd/*; do [ -e \"$f\" ] || continue; "
                       "case $(readlink \"$f\") in *fds.lock) echo \"${f##*/}\" >> $1;; "
                       "*) printf \" %s \" \"${f##*/}\";; esac; done; true; }";
    /* Listed from a subshell: /proc/$$ is the shell, without the copy of
     * stdout a redirected function call would keep aside. */
    char *script = tu_fmt("%s; exec 7</dev/null; (l /dev/null) > %s; exec '%s' -u '%s' run fds -- "
                          "sh -c '%s; (l %s) > %s'",
                          list, before, tu_dlock_bin(), u, list, locks, after);
    const char *argv[] = {"sh", "-c", script, NULL};
    char *err;
    int rc = tu_run(argv, NULL, NULL, &err);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, err);
    free(err);
    char *b = tu_read_file(before), *a = tu_read_file(after), *k = tu_read_file(locks);
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_nonnull(a);
    ck_assert_msg(strstr(a, " 7 "), "%s: fd 7 passed to dlock did not reach COMMAND (%s)", u, a);
    ck_assert_msg(count_lines(k ? k : "") == lock_fds, "%s: COMMAND has %d descriptors of the "
                  "lock file, not %d", u, count_lines(k ? k : ""), lock_fds);
    /* Every other descriptor COMMAND has, the wrapper had (the same numbers). */
    char *copy = strdup(a), *save, *tok;
    for (tok = strtok_r(copy, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        char *needle = tu_fmt(" %s ", tok);
        ck_assert_msg(strstr(b, needle), "%s: COMMAND inherited fd %s that dlock opened "
                      "(COMMAND: %s; dlock was given: %s)", u, tok, a, b);
        free(needle);
    }
    free(copy);
    free(k);
    free(a);
    free(b);
    free(script);
    free(locks);
    free(after);
    free(before);
}

TU_TEST(command_fds_file, 120)
{
    check_command_fds(url, 1);
}

#ifdef DLOCK_HAVE_REDIS
TU_TEST(command_fds_redis, 120)
{
    struct fx_redis r;
    start_redis(&r);
    check_command_fds(r.url, 0);
    fx_redis_stop(&r);
}

/* A server that wants a password and got none: exit 77, the message says
 * how to give one. DLOCK_REDIS_PASSWORD_FILE and ?password_file= give it
 * (no warning: nothing secret in argv); a file others can read is
 * refused, naming it. */
TU_TEST(password_file_redis, 120)
{
    struct fx_redis r = {0};
    const char *extra[] = {"--requirepass", "hunter2", NULL};
    ck_assert_msg(fx_redis_start(&r, extra), "redis-server could not be started");
    char *err;
    ck_assert_int_eq(DLOCK(NULL, &err, "-u", r.url, "run", "n", "true"), 77);
    ck_assert_msg(strstr(err, "password_file") && strstr(err, "DLOCK_REDIS_PASSWORD_FILE"), "%s",
                  err);
    free(err);
    char *pw = tu_fmt("%s/redis.pass", dir), *env_pw = tu_fmt("DLOCK_REDIS_PASSWORD_FILE=%s", pw);
    tu_write_file(pw, "hunter2\n");
    ck_assert_int_eq(chmod(pw, 0600), 0);
    const char *env[] = {env_pw, NULL};
    ck_assert_int_eq(TU_DLOCK(NULL, &err, env, "-u", r.url, "run", "n", "true"), 0);
    ck_assert_str_eq(err, "");
    free(err);
    char *uf = tu_fmt("%s?password_file=%s", r.url, pw);
    ck_assert_int_eq(DLOCK(NULL, &err, "-u", uf, "run", "n", "true"), 0);
    ck_assert_str_eq(err, "");
    free(err);
    /* both the variable and its _FILE: which one is meant is not guessed */
    const char *env_both[] = {env_pw, "DLOCK_REDIS_PASSWORD=hunter2", NULL};
    ck_assert_int_eq(TU_DLOCK(NULL, &err, env_both, "-u", r.url, "run", "n", "true"), 78);
    ck_assert_msg(strstr(err, "DLOCK_REDIS_PASSWORD_FILE"), "%s", err);
    free(err);
    ck_assert_int_eq(chmod(pw, 0640), 0);
    ck_assert_int_eq(TU_DLOCK(NULL, &err, env, "-u", r.url, "run", "n", "true"), 77);
    ck_assert_msg(strstr(err, pw) && strstr(err, "DLOCK_REDIS_PASSWORD_FILE"), "%s", err);
    free(err);
    free(uf);
    free(env_pw);
    free(pw);
    fx_redis_stop(&r);
}

/* sentinel_password given in the URL never shows: not in COMMAND's
 * DLOCK_URL or environment, not in -v's lines, not in an error about the
 * same URL; nor does a mis-cased password option's value. */
TU_TEST(sentinel_password_not_shown, 120)
{
    struct fx_sentinels sen = {.sentinel_password = "hunter2"};
    ck_assert_msg(fx_sentinels_start(&sen, 0, 1), "the Sentinel topology did not start");
    char *u = tu_fmt("%s?sentinel_password=hunter2", sen.url);
    char *out, *err;
    ck_assert_int_eq(DLOCK(&out, &err, "-u", u, "run", "-v", "n", "env"), 0);
    ck_assert_msg(strstr(out, "DLOCK_URL=redis+sentinel://"), "%s", out);
    ck_assert_msg(!strstr(out, "hunter2"), "COMMAND saw the password:\n%s", out);
    ck_assert_msg(!strstr(err, "hunter2"), "stderr shows the password:\n%s", err);
    free(out);
    free(err);
    char *bad[] = {tu_fmt("%s&lease=soon", u), tu_fmt("%s?Password=hunter2", sen.url),
                   tu_fmt("%s&colour=blue", u)};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ck_assert_int_eq(DLOCK(NULL, &err, "-u", bad[i], "run", "n", "true"), 78);
        ck_assert_msg(*err && !strstr(err, "hunter2"), "%s: %s", bad[i], err);
        free(err);
        free(bad[i]);
    }
    /* from a file: ?sentinel_password_file=, DLOCK_REDIS_SENTINEL_PASSWORD_FILE */
    char *pw = tu_fmt("%s/sentinel.pass", dir);
    tu_write_file(pw, "hunter2\n");
    ck_assert_int_eq(chmod(pw, 0600), 0);
    char *uf = tu_fmt("%s?sentinel_password_file=%s", sen.url, pw);
    ck_assert_int_eq(DLOCK(NULL, &err, "-u", uf, "run", "n", "true"), 0);
    ck_assert_str_eq(err, "");
    free(err);
    char *env_pw = tu_fmt("DLOCK_REDIS_SENTINEL_PASSWORD_FILE=%s", pw);
    const char *env[] = {env_pw, NULL};
    ck_assert_int_eq(TU_DLOCK(NULL, &err, env, "-u", sen.url, "run", "n", "true"), 0);
    ck_assert_str_eq(err, "");
    free(err);
    ck_assert_int_eq(DLOCK(NULL, &err, "-u", sen.url, "run", "n", "true"), 77);
    ck_assert_msg(strstr(err, "sentinel_password_file"), "%s", err);
    free(err);
    free(env_pw);
    free(uf);
    free(pw);
    free(u);
    fx_sentinels_stop(&sen);
}

/* Renewals fail (the server is stopped): COMMAND, which shrugs off
 * SIGTERM, is told and killed before the lease ends on the server --
 * proved by order of events, not by clocks: COMMAND is dead while the
 * server is still stopped, and dlock's release, sent after that and
 * answered once the server resumes, still finds the lock its own. With
 * the old behaviour COMMAND got SIGTERM only once the lease had ended. */
TU_TEST(lost_grace_redis, 120)
{
    struct lost_job j;
    lost_job_begin(&j);
    char *pidfile = tu_fmt("%s/cmd.pid", dir);
    char *cmd = tu_fmt("echo $$ > %s; trap 'touch %s' TERM; touch %s; "
                       "while :; do sleep 0.05; done",
                       pidfile, j.termed, j.started);
    /* A 9 s lease: the default grace is 1.5 s, and --kill-after 0.3
     * leaves 1.2 s of lease after the kill for the test to resume the
     * server in. */
    const char *argv[] = {tu_dlock_bin(), "-u", j.r.url, "run", "-v", "--lease", "9",
                          "--kill-after", "0.3", "atrisk", "-c", cmd, NULL};
    pid_t d = lost_job_spawn(&j, argv);
    char *text = tu_read_file(pidfile);
    pid_t cmd_pid = text ? (pid_t)atoi(text) : 0;
    free(text);
    ck_assert_int_gt(cmd_pid, 0);
    kill(j.r.pid, SIGSTOP); /* every renewal from now on fails */
    bool gone = false;
    for (int i = 0; i < 6000 && !gone; i++) { /* at most 60 s; the test's limit is 120 */
        gone = kill(cmd_pid, 0) < 0;
        if (!gone)
            tu_sleep_ms(10);
    }
    kill(j.r.pid, SIGCONT);
    ck_assert_msg(gone, "COMMAND still runs");
    char *out = lost_job_reap(&j, d);
    ck_assert_msg(strstr(out, "at risk"), "%s", out);
    ck_assert_msg(strstr(out, "released 'atrisk'"),
                  "the release did not find the lock its own: COMMAND outlived the lease\n%s",
                  out);
    free(out);
    free(cmd);
    free(pidfile);
    lost_job_end(&j);
}

/* --lost-grace of more than half the lease is cut to half and said so,
 * once a renewal has shown the lease: here a 2 s lease renewed every
 * 0.67 s, a grace of 1.5 s. The counterpart of check_fair's test that a
 * handed-over lock gives no such warning: the renewal test in run.c must
 * still see a real renewal. */
TU_TEST(lost_grace_over_half_the_lease_is_said, 120)
{
    struct lost_job j;
    lost_job_begin(&j);
    char *go = tu_fmt("%s/go", dir);
    char *cmd = tu_fmt("touch %s; until [ -e %s ]; do sleep 0.05; done", j.started, go);
    const char *argv[] = {tu_dlock_bin(), "-u", j.r.url, "run", "--lease", "2", "--lost-grace",
                          "1.5", "half", "-c", cmd, NULL};
    pid_t d = lost_job_spawn(&j, argv);
    char *out = NULL;
    for (int i = 0; i < 6000; i++) { /* at most 60 s */
        free(out);
        out = tu_read_file(j.log);
        if (out && strstr(out, "more than half the lease"))
            break;
        tu_sleep_ms(10);
    }
    tu_write_file(go, "");
    ck_assert_int_eq(tu_wait_exit(d), 0);
    ck_assert_msg(out && strstr(out, "more than half the lease"), "no warning:\n%s", out);
    free(out), free(cmd), free(go);
    lost_job_end(&j);
}

/* A stopped redis-server (SIGSTOP) still accepts connections (the
 * kernel's backlog) but answers nothing: the keeper's redials after a
 * failed renewal connect, and -v said "reconnected" each time although
 * no reply ever came. The job ends with the lease (75); no line may say
 * reconnected. */
TU_TEST(reconnected_only_once_answered, 120)
{
    struct lost_job j;
    lost_job_begin(&j);
    char *u = tu_fmt("%s?timeout=300ms", j.r.url);
    char *cmd = tu_fmt("trap 'touch %s; exit 0' TERM; touch %s; while :; do sleep 0.05; done",
                       j.termed, j.started);
    const char *argv[] = {tu_dlock_bin(), "-u", u, "run", "-v", "--lease", "2", "silent", "-c",
                          cmd, NULL};
    pid_t d = lost_job_spawn(&j, argv);
    kill(j.r.pid, SIGSTOP); /* accepts, never answers */
    int st;
    waitpid(d, &st, 0);
    kill(j.r.pid, SIGCONT);
    char *out = tu_read_file(j.log);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 75, "status %#x: %s", st, out);
    ck_assert_msg(strstr(out, "renewal failed"), "no failed renewal: %s", out);
    ck_assert_msg(!strstr(out, "reconnected"), "reconnected to a server that never answered:\n%s",
                  out);
    free(out), free(cmd), free(u);
    lost_job_end(&j);
}

/* dlock run -v says when the lock is at risk (the library's at-risk
 * callback, with --lost-grace as its margin): renewals unanswered (the
 * server stopped), one line naming the lock and the lease left, while
 * COMMAND runs on under --on-lost ignore; the server back, a renewal is
 * confirmed, nothing is lost and the run ends as COMMAND does (0).
 * Before, -v said nothing until the loss, and under --on-lost ignore
 * nothing at all. */
TU_TEST(at_risk_line_redis, 120)
{
    struct lost_job j;
    lost_job_begin(&j);
    char *go = tu_fmt("%s/go", dir);
    char *cmd = tu_fmt("touch %s; while [ ! -e %s ]; do sleep 0.05; done", j.started, go);
    /* A 6 s lease, a 3 s grace: the line comes 3 s after the last
     * confirmed renewal was sent, leaving 3 s to continue the server. */
    const char *argv[] = {tu_dlock_bin(), "-u", j.r.url, "run", "-v", "--on-lost", "ignore",
                          "--lease", "6", "--lost-grace", "3", "risky", "-c", cmd, NULL};
    pid_t d = lost_job_spawn(&j, argv);
    kill(j.r.pid, SIGSTOP); /* every renewal from now on is unanswered */
    bool said = false;
    for (int i = 0; i < 3000 && !said; i++) { /* at most 30 s */
        char *text = tu_read_file(j.log);
        said = text && strstr(text, "at risk");
        free(text);
        if (!said)
            tu_sleep_ms(10);
    }
    kill(j.r.pid, SIGCONT);
    tu_write_file(go, "");
    int st;
    waitpid(d, &st, 0);
    char *out = tu_read_file(j.log);
    ck_assert_msg(said, "no at-risk line with the server stopped:\n%s", out);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %#x:\n%s", st, out);
    char *line = strstr(out, "at risk");
    ck_assert_msg(strstr(out, "lock 'risky' at risk") && strstr(line, "ms of its lease left") &&
                      !strstr(line + 1, "at risk") && !strstr(out, "lost"),
                  "not one at-risk line naming the lock and the lease left:\n%s", out);
    free(out);
    free(cmd);
    free(go);
    lost_job_end(&j);
}

/* run -v --on-contended term on URL: COMMAND runs until a second dlock
 * starts waiting for its lock; then a -v line names the waiter, COMMAND
 * is sent SIGTERM (its trap exits 7, which is the run's status), and the
 * waiter gets the lock once it is released. A hold nobody waits for runs
 * to its end untold. Before: --on-contended was an unknown option. */
static void contended_term_on(const char *u)
{
    char *started = tu_fmt("%s/contend-started", dir), *log = tu_fmt("%s/contend.log", dir),
         *wlog = tu_fmt("%s/contend-waiter.log", dir);
    char *cmd = tu_fmt("trap 'exit 7' TERM; touch %s; while :; do sleep 0.05; done", started);
    const char *alone[] = {tu_dlock_bin(), "-u", u, "run", "-v", "--on-contended", "term",
                           "quiet", "true", NULL};
    pid_t q = tu_spawn(alone, log);
    int st = tu_wait_exit(q);
    char *out = tu_read_file(log);
    ck_assert_msg(st == 0 && !strstr(out, "contended"), "status %d, alone:\n%s", st, out);
    free(out);
    const char *holder[] = {tu_dlock_bin(), "-u", u, "run", "-v", "--on-contended", "term",
                            "contended", "-c", cmd, NULL};
    pid_t d = tu_spawn(holder, log);
    ck_assert_msg(tu_wait_file(started, 30000), "COMMAND never started");
    const char *waiter[] = {tu_dlock_bin(), "-u", u, "run", "-w", "60", "contended", "true",
                            NULL};
    pid_t w = tu_spawn(waiter, wlog);
    st = tu_wait_exit(d);
    out = tu_read_file(log);
    ck_assert_msg(st == 7, "the holder's status %d, not 7 (COMMAND's on SIGTERM):\n%s", st, out);
    ck_assert_msg(strstr(out, "lock 'contended' contended: ") && strstr(out, " waits") &&
                      strstr(out, "stopping the command (SIGTERM)"),
                  "no contended line:\n%s", out);
    free(out);
    st = tu_wait_exit(w);
    out = tu_read_file(wlog);
    ck_assert_msg(st == 0, "the waiter's status %d:\n%s", st, out);
    free(out);
    free(cmd);
    free(wlog);
    free(log);
    free(started);
}

/* The file backend: waiters announce themselves in NAME.waiting. */
TU_TEST(contended_term_file, 120)
{
    contended_term_on(url);
}

#ifdef DLOCK_HAVE_REDIS
TU_TEST(contended_term_redis, 120)
{
    struct fx_redis r;
    start_redis(&r);
    contended_term_on(r.url);
    fx_redis_stop(&r);
}
#endif

#ifdef DLOCK_HAVE_ETCD
TU_TEST(contended_term_etcd, 120)
{
    struct etcdf f = {0};
    ck_assert_msg(etcdf_start(&f, 1), "%s", f.error);
    char *u = etcdf_url(&f, NULL, NULL);
    contended_term_on(u);
    free(u);
    etcdf_stop(&f);
}
#endif

#ifdef DLOCK_HAVE_ZK
TU_TEST(contended_term_zk, 180)
{
    struct zkf f = {0};
    ck_assert_msg(zkf_start(&f, 1), "%s", f.error);
    char *u = zkf_url(&f, NULL, NULL);
    contended_term_on(u);
    free(u);
    zkf_stop(&f);
}
#endif

/* dlock itself stopped (SIGSTOP: a debugger, a frozen parent) while its
 * job, a loop writing A lines, runs under a 2 s Redis lease: nothing
 * renews the lease, and the next holder's section (B..C in the same
 * file, after a wait of up to 30 s) must see no A -- the guardian, which
 * is not stopped, ends the job before the validity dlock last told it
 * runs out. Continued, dlock says the lock was at risk and exits 75.
 * Before, the job ran on beside the next holder until dlock was
 * continued. */
TU_TEST(paused_dlock_redis, 120)
{
    struct fx_redis r;
    start_redis(&r);
    char *out = tu_fmt("%s/paused.out", dir), *pidfile = tu_fmt("%s/paused.pid", dir);
    char *log = tu_fmt("%s/paused.log", dir);
    char *cmd = tu_fmt("echo $$ > %s.tmp && mv %s.tmp %s; "
                       "while :; do echo A >> %s; sleep 0.05; done",
                       pidfile, pidfile, pidfile, out);
    const char *argv[] = {tu_dlock_bin(), "-u", r.url, "run", "--lease", "2", "paused", "-c",
                          cmd, NULL};
    pid_t d = tu_spawn(argv, log);
    ck_assert(tu_wait_file(pidfile, 30000));
    ck_assert(tu_wait_file(out, 30000));
    pid_t job = (pid_t)tu_read_u64(pidfile);
    ck_assert_int_gt(job, 0);
    tu_pause(d);
    char *next = tu_fmt("echo B >> %s; sleep 0.3; echo C >> %s", out, out);
    int rc = TU_DLOCK(NULL, NULL, NULL, "-u", r.url, "run", "-w", "30", "paused", "-c", next);
    kill(d, SIGCONT);
    int code = tu_wait_exit(d);
    kill(job, SIGKILL);
    char *text = tu_read_file(out), *b = text ? strstr(text, "B\n") : NULL;
    char *c = b ? strstr(b, "C\n") : NULL, *said = tu_read_file(log);
    ck_assert_msg(rc == 0 && b && c, "the next holder did not run (exit %d)", rc);
    ck_assert_msg(!memchr(b, 'A', (size_t)(c - b)),
                  "the job of the stopped dlock wrote inside the next holder's section");
    ck_assert_msg(code == 75 && said && strstr(said, "at risk"), "dlock exit %d: %s", code,
                  said ? said : "");
    free(said);
    free(text);
    free(next);
    free(cmd);
    free(log);
    free(pidfile);
    free(out);
    fx_redis_stop(&r);
}

/* The release fails after COMMAND succeeded (COMMAND stops the server, so
 * the release times out): the job did run under the lock, so its status
 * stands and the failure is a line on stderr; --strict-release fails. */
TU_TEST(release_failure_redis, 120)
{
    struct fx_redis r;
    start_redis(&r);
    char *u = tu_fmt("%s?timeout=300ms", r.url), *stop = tu_fmt("kill -STOP %d", (int)r.pid);
    for (int strict = 0; strict < 2; strict++) {
        char *err;
        int rc = DLOCK(NULL, &err, "-u", u, "run", strict ? "--strict-release" : "-v", "relfail",
                       "-c", stop);
        kill(r.pid, SIGCONT);
        ck_assert_msg(strstr(err, "release of 'relfail' failed"), "%s", err);
        if (strict)
            ck_assert_msg(rc != 0 && rc != 75, "--strict-release: exit %d: %s", rc, err);
        else
            ck_assert_msg(rc == 0, "exit %d: %s", rc, err);
        free(err);
    }
    free(stop);
    free(u);
    fx_redis_stop(&r);
}
#endif

/* run -m: two loops take {a,b} and {b,a} (and a third plain `run a`)
 * over and over. Sets are taken in one order, so none deadlocks (each
 * wait is bounded: a deadlock fails a worker instead of hanging), and the
 * marker file, created exclusively inside the section and removed before
 * leaving it, proves no two sections overlapped. */
TU_TEST(multi_no_deadlock, 240)
{
    char *marker = tu_fmt("%s/inside", dir);
    char *section = tu_fmt("set -C; : > %s || { echo overlap >&2; exit 99; }; "
                           "sleep 0.00$(($$ %% 10)); rm -f %s",
                           marker, marker);
    char *script = tu_fmt(
        "pids=; for w in '-m a b --' '-m b a --' 'a'; do "
        "  (i=0; while [ $i -lt 40 ]; do "
        "     '%s' run -w 30 $w sh -c '%s' || "
        "     { echo \"worker '$w', round $i: dlock exit $?\" >&2; exit 1; }; "
        "     i=$((i+1)); done) & pids=\"$pids $!\"; "
        "done; fail=0; for p in $pids; do wait $p || fail=1; done; exit $fail",
        tu_dlock_bin(), section);
    const char *argv[] = {"bash", "-c", script, NULL};
    const char *env[] = {env_url, NULL};
    char *err;
    int rc = tu_run(argv, env, NULL, &err);
    ck_assert_msg(rc == 0, "a worker failed (exit %d): %s", rc, err);
    ck_assert_msg(access(marker, F_OK) != 0, "a section never ended");
    free(err);
    free(script);
    free(section);
    free(marker);
}

/* run -m when a member is held elsewhere: -n and -w exit with the
 * conflict code (-E) and keep nothing (the free member is free after);
 * once free, COMMAND sees every token, numbered in the order given. */
TU_TEST(multi_busy_env, 120)
{
    pid_t h = start_holder("mb", "");
    char *err;
    ck_assert_int_eq(DLOCK(NULL, &err, "run", "-n", "-m", "ma", "mb", "--", "true"), 1);
    ck_assert_msg(!*err, "not silent: %s", err);
    free(err);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-n", "-E", "7", "-m", "mb", "ma", "-c", "true"), 7);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-w", "0.2", "-m", "ma", "mb", "--", "true"), 1);
    ck_assert_int_eq(DLOCK(NULL, &err, "run", "-v", "-w", "0.2", "-m", "ma", "mb", "--", "true"),
                     1);
    ck_assert_msg(strstr(err, "'mb' is held by"), "%s", err);
    free(err);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-n", "ma", "true"), 0); /* nothing kept */
    stop_holder(h);
    char *out;
    ck_assert_int_eq(DLOCK(&out, NULL, "run", "-n", "-m", "mb", "ma", "--", "sh", "-c",
                           "echo \"$DLOCK_COUNT|$DLOCK_NAME_1=$DLOCK_TOKEN_1|"
                           "$DLOCK_NAME_2=$DLOCK_TOKEN_2|$DLOCK_TOKENS|$DLOCK_NAME=$DLOCK_TOKEN\""),
                     0);
    unsigned long tb, ta, l1, l2, first;
    char n1[8], n2[8], nf[8];
    ck_assert_msg(sscanf(out, "2|%7[^=]=%lu|%7[^=]=%lu|%lu %lu|%7[^=]=%lu", n1, &tb, n2, &ta, &l1,
                         &l2, nf, &first) == 8,
                  "%s", out);
    ck_assert_str_eq(n1, "mb");
    ck_assert_str_eq(n2, "ma");
    ck_assert_str_eq(nf, "mb");
    ck_assert_msg(l1 == tb && l2 == ta && first == tb && tb >= 2 && ta >= 2, "%s", out);
    free(out);
    /* Usage: no -- after the names, a name twice, a path, elect. */
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-m", "ma", "mb", "true"), 64);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-m", "ma", "ma", "--", "true"), 64);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-m", "ma", "./p", "--", "true"), 64);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-m", "--permits", "2", "ma", "--", "true"), 64);
    ck_assert_int_eq(DLOCK(NULL, NULL, "hold", "-m", "ma"), 64);
    /* Without -m, everything after NAME is COMMAND, as before. */
    ck_assert_int_eq(DLOCK(&out, NULL, "run", "ma", "echo", "x", "--", "y"), 0);
    ck_assert_str_eq(out, "x -- y\n");
    free(out);
}

#ifdef DLOCK_HAVE_REDIS
/* run -m on redis: one member deleted behind dlock's back (release
 * --force) is a lost member: --on-lost stops the job (SIGTERM first),
 * stderr names that member, and the exit status is 75. */
TU_TEST(multi_lost_member_redis, 120)
{
    struct lost_job j;
    lost_job_begin(&j);
    char *cmd = tu_fmt("trap 'touch %s; exit 0' TERM; touch %s; while :; do sleep 0.05; done",
                       j.termed, j.started);
    const char *argv[] = {tu_dlock_bin(), "-u", j.r.url, "run", "--lease", "3", "-m", "lx", "ly",
                          "-c", cmd, NULL};
    pid_t d = lost_job_spawn(&j, argv);
    ck_assert_int_eq(TU_DLOCK(NULL, NULL, NULL, "-u", j.r.url, "release", "--force", "ly"), 0);
    char *out = lost_job_reap(&j, d);
    ck_assert_msg(strstr(out, "lock 'ly' lost"), "%s", out);
    /* The other member was released: free now. */
    ck_assert_int_eq(TU_DLOCK(NULL, NULL, NULL, "-u", j.r.url, "run", "-n", "lx", "true"), 0);
    free(out);
    free(cmd);
    lost_job_end(&j);
}
#endif

/* ------------------------------------------- -w and -n bound the run */

/* `dlock -u U run OPT [ARG] bound true` against a server that does not
 * answer must end as dlock(1) says a run that cannot get its lock in
 * time ends -- exit 1 (timed out) or 69 (unavailable) -- within BOUND_MS:
 * -w bounds the whole run, connection and close included. The bound (4x
 * the wait and 3 s) is the point of these tests, generous for a loaded
 * machine; without it the runs took the connect timeout, or the wait and
 * then an op timeout for the owed cancel and another for the close. */
static void run_is_bounded(const char *u, const char *const opts[], int64_t bound_ms,
                           const char *what)
{
    const char *argv[16] = {tu_dlock_bin(), "-u", u, "run"};
    size_t n = 4;
    char shown[64] = "";
    for (size_t i = 0; opts[i] && n < 12; i++) {
        argv[n++] = opts[i];
        snprintf(shown + strlen(shown), sizeof shown - strlen(shown), "%s%s", i ? " " : "",
                 opts[i]);
    }
    argv[n++] = "bound";
    argv[n++] = "true";
    argv[n] = NULL;
    char *err = NULL;
    int64_t t0 = tu_mono_ms();
    int st = tu_run(argv, NULL, NULL, &err);
    int64_t took = tu_mono_ms() - t0;
    ck_assert_msg(st == 1 || st == 69, "%s: run %s: exit %d, not 1 or 69: %s", what, shown, st,
                  err);
    ck_assert_msg(took <= bound_ms, "%s: run %s took %lld ms, past its bound of %lld ms: %s",
                  what, shown, (long long)took, (long long)bound_ms, err);
    free(err);
}
#define RUN_IS_BOUNDED(u, bound_ms, what, ...)                                                 \
    run_is_bounded(u, (const char *const[]){__VA_ARGS__, NULL}, bound_ms, what)

/* -w's bound for a wait of WAIT_MS: 4x it and 3 s. */
static int64_t bound_of(int64_t wait_ms)
{
    return 4 * wait_ms + 3000;
}

#ifdef DLOCK_HAVE_REDIS
/* Redis taking no writes (CLIENT PAUSE WRITE: connecting works, the
 * acquire's script waits): -w 1 took 11 s (the wait, then the owed
 * cancel's op timeout, then close's), -v -w 1 15 s (its try-once before
 * the wait had the op timeout), -n 15 s (the try, the cancel, the close;
 * -n's bound is one op timeout, the try's, and a short close). A stopped server
 * (SIGSTOP) stalls the connect: -w 0.3 took the connect timeout, 5 s. */
TU_TEST(wait_bounds_run_redis, 120)
{
    struct fx_redis r;
    start_redis(&r);
    redisReply *rep = fx_redis_raw_at(r.port, NULL, "CLIENT PAUSE 60000 WRITE");
    ck_assert_ptr_nonnull(rep);
    freeReplyObject(rep);
    const char *u = r.url; /* the op timeout: 5 s */
    RUN_IS_BOUNDED(u, bound_of(1000), "redis paused", "-w", "1");
    RUN_IS_BOUNDED(u, bound_of(1000), "redis paused", "-v", "-w", "1");
    /* -n: one try, within the op timeout, and a short close */
    RUN_IS_BOUNDED(u, 5000 + 3000, "redis paused", "-n");
    rep = fx_redis_raw_at(r.port, NULL, "CLIENT UNPAUSE");
    freeReplyObject(rep);
    tu_pause(r.pid);
    RUN_IS_BOUNDED(r.url, bound_of(300), "redis stopped", "-w", "0.3");
    kill(r.pid, SIGCONT);
    fx_redis_stop(&r);
}
#endif

#ifdef DLOCK_HAVE_ETCD
/* A stopped etcd member (SIGSTOP): -w 0.3 took the connect timeout, 5 s. */
TU_TEST(wait_bounds_run_etcd, 120)
{
    struct etcdf f = {0};
    ck_assert_msg(etcdf_start(&f, 1), "%s", f.error);
    char *u = etcdf_url(&f, NULL, NULL);
    tu_pause(f.m[0].pid);
    RUN_IS_BOUNDED(u, bound_of(300), "etcd stopped", "-w", "0.3");
    kill(f.m[0].pid, SIGCONT);
    free(u);
    etcdf_stop(&f);
}
#endif

#ifdef DLOCK_HAVE_ZK
/* ZooKeeper stopped (SIGSTOP), then down (nothing on its port): -w 0.3
 * took the connect timeout, 5 s, both ways, and so did -n when down. */
TU_TEST(wait_bounds_run_zk, 180)
{
    struct zkf f = {0};
    ck_assert_msg(zkf_start(&f, 1), "%s", f.error);
    char *u = zkf_url(&f, NULL, NULL);
    tu_pause(f.s[0].pid);
    RUN_IS_BOUNDED(u, bound_of(300), "zk stopped", "-w", "0.3");
    kill(f.s[0].pid, SIGCONT);
    zkf_server_stop(&f, 0, SIGKILL);
    RUN_IS_BOUNDED(u, bound_of(300), "zk down", "-w", "0.3");
    RUN_IS_BOUNDED(u, bound_of(0), "zk down", "-n"); /* every server refused: at once */
    free(u);
    zkf_stop(&f);
}
#endif

#ifdef DLOCK_HAVE_REDIS
/* SIGINT or SIGTERM while connecting ends the run at once, 128 + the
 * signal, as while waiting: it was ignored until the connect timeout
 * (here 40 s, past the test's limit; then exit 69). */
static void signal_while_connecting(int sig)
{
    struct fx_redis r;
    start_redis(&r);
    tu_pause(r.pid); /* the connection is accepted, nothing answers */
    char *u = tu_fmt("%s?connect_timeout=40s", r.url);
    const char *argv[] = {tu_dlock_bin(), "-u", u, "run", "connecting", "true", NULL};
    char *log = tu_fmt("%s/connecting.log", dir);
    pid_t d = tu_spawn(argv, log);
    ck_assert(wait_blocked(d, sig, 20000));
    tu_sleep_ms(300); /* inside the connect, most likely; before it, the same */
    kill(d, sig);
    int st = tu_wait_exit(d);
    char *out = tu_read_file(log);
    ck_assert_msg(st == 128 + sig, "status %d, not %d: %s", st, 128 + sig, out);
    kill(r.pid, SIGCONT);
    free(out);
    free(log);
    free(u);
    fx_redis_stop(&r);
}

TU_TEST(sigint_connecting, 60)
{
    signal_while_connecting(SIGINT);
}

TU_TEST(sigterm_connecting, 60)
{
    signal_while_connecting(SIGTERM);
}
#endif

/* A negative wait other than forever (-1) is a mistake, not "forever":
 * DLOCK_EINVAL from the API, a usage error from the command. */
TU_TEST(negative_wait, 60)
{
    dlock_client *c = tu_open(url);
    dlock_lock *l = tu_lock(c, "negwait");
    ck_assert_int_eq(dlock_acquire(l, -2), DLOCK_EINVAL);
    ck_assert_msg(strstr(dlock_errmsg(), "-2"), "%s", dlock_errmsg());
    ck_assert_int_eq(dlock_acquire(l, INT64_MIN), DLOCK_EINVAL);
    ck_assert_int_eq(dlock_hold_count(l), 0);
    tu_acquire_release(l, DLOCK_FOREVER);
    dlock_lock_free(l);
    dlock_client_close(c);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-w", "-2", "negwait", "true"), 64);
    ck_assert_int_eq(DLOCK(NULL, NULL, "run", "-w", "-1", "negwait", "true"), 64);
}

/* The options a text names: --long words and -x letters. */
static void collect_options(const char *text, char *set, size_t size)
{
    set[0] = 0;
    for (const char *p = text; *p; p++) {
        if (*p != '-' || (p > text && (isalnum((unsigned char)p[-1]) || p[-1] == '-')))
            continue;
        const char *q = p + 1;
        if (*q == '-')
            q++;
        const char *start = q;
        while (isalnum((unsigned char)*q) || (*q == '-' && isalnum((unsigned char)q[1])))
            q++;
        size_t len = (size_t)(q - p);
        if (q == start || (start == p + 1 && q - start != 1))
            continue; /* "-" alone, or -word that is not an option */
        char opt[64];
        snprintf(opt, sizeof opt, " %.*s ", (int)len, p);
        if (!strstr(set, opt) && strlen(set) + strlen(opt) < size)
            strcat(set, opt + (set[0] ? 1 : 0));
        p = q - 1;
    }
}

/* Every word of the space-separated set SUB is in SET. */
static void assert_subset(const char *sub, const char *set, const char *sub_name,
                          const char *set_name)
{
    char *copy = strdup(sub), *save, *tok;
    char *padded = tu_fmt(" %s ", set);
    for (tok = strtok_r(copy, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        char *needle = tu_fmt(" %s ", tok);
        ck_assert_msg(strstr(padded, needle), "%s names %s, %s does not", sub_name, tok, set_name);
        free(needle);
    }
    free(padded);
    free(copy);
}

TU_TEST(help_man, 120)
{
    char *help;
    ck_assert_int_eq(DLOCK(&help, NULL, "--help"), 0);
    const char *man_path = getenv("DLOCK_MAN") ? getenv("DLOCK_MAN") : "docs/dlock.1";
    char *man = tu_read_file(man_path);
    ck_assert_msg(man, "cannot read %s", man_path);
    /* roff writes '-' as '\-' */
    char *m = man, *w = man;
    for (; *m; m++)
        if (!(m[0] == '\\' && m[1] == '-'))
            *w++ = *m;
    *w = 0;
    static char hs[4096], ms[4096];
    collect_options(help, hs, sizeof hs);
    collect_options(man, ms, sizeof ms);
    /* Every option in --help is in the man page and the other way round. */
    assert_subset(hs, ms, "--help", "dlock(1)");
    assert_subset(ms, hs, "dlock(1)", "--help");
    free(man);
    free(help);
    char *out;
    ck_assert_int_eq(DLOCK(&out, NULL, "help", "run"), 0);
    ck_assert_ptr_nonnull(strstr(out, "--on-lost"));
    free(out);
    ck_assert_int_eq(DLOCK(&out, NULL, "--version"), 0);
    ck_assert_ptr_nonnull(strstr(out, "dlock 0."));
    free(out);
}

/* A usage error is its one line then a pointer to the command's help,
 * exit 64: never the whole usage text on stderr. */
TU_TEST(usage_error_is_one_line_and_a_pointer, 60)
{
    const char *const forms[][6] = {
        {"run", "-w", "soon", "u", "true", NULL},
        {"run", "u", NULL},
        {"run", NULL},
        {"hold", "--bogus", "u", NULL},
        {"status", NULL},
        {"list", "a", "b", NULL},
        {"release", "--bogus", "u", NULL},
        {"check", "u", NULL},
        {"check", "u", "x", NULL},
    };
    for (size_t f = 0; f < sizeof forms / sizeof *forms; f++) {
        char *err;
        int code = tu_dlock(NULL, &err, (const char *[]){env_url, NULL}, forms[f]);
        ck_assert_msg(code == 64, "%s form %zu: exit %d", forms[f][0], f, code);
        char want[64];
        snprintf(want, sizeof want, "try 'dlock help %s'\n", forms[f][0]);
        char *nl = strchr(err, '\n');
        ck_assert_msg(nl && strcmp(nl + 1, want) == 0,
                      "%s form %zu: stderr is not one line then %s: %s", forms[f][0], f, want, err);
        free(err);
    }
}

/* --json given twice, before and after the operand or both after it, is
 * still the option: never taken as a NAME or PATTERN. */
TU_TEST(duplicated_json_is_not_an_operand, 60)
{
    const char *const forms[][5] = {
        {"status", "--json", "dupjson", "--json", NULL},
        {"status", "dupjson", "--json", "--json", NULL},
        {"list", "--json", "--json", NULL, NULL},
        {"list", "dup*", "--json", "--json", NULL},
        {"list", "--json", "dup*", "--json", NULL},
    };
    for (size_t f = 0; f < sizeof forms / sizeof *forms; f++) {
        char *out, *err;
        int code = tu_dlock(&out, &err, (const char *[]){env_url, NULL}, forms[f]);
        ck_assert_msg(code == 0 || (code == 1 && !strcmp(forms[f][0], "status")),
                      "%s form %zu: exit %d, stderr %s", forms[f][0], f, code, err);
        ck_assert_msg(out[0] == '{' || out[0] == '[', "%s form %zu printed no JSON: %s%s",
                      forms[f][0], f, out, err);
        free(out);
        free(err);
    }
}

/* run's --permits entry in --help names every backend with semaphores, as
 * dlock(1) does (the man page names each one's stored count). */
TU_TEST(help_permits_names_every_semaphore_backend, 60)
{
    char *out;
    ck_assert_int_eq(DLOCK(&out, NULL, "help", "run"), 0);
    char *entry = strstr(out, "  --permits N");
    ck_assert_ptr_nonnull(entry);
    char *end = strstr(entry + 1, "\n  -");
    if (end)
        *end = '\0';
    static const char *const backends[] = {"file", "redis", "etcd", "zk"};
    for (size_t i = 0; i < sizeof backends / sizeof *backends; i++)
        ck_assert_msg(strstr(entry, backends[i]), "--permits in --help omits %s: %s", backends[i],
                      entry);
    free(out);
}

/* --version names the backends this build has, as `make backends` does:
 * the tests are compiled with the same DLOCK_HAVE_* as the library. */
TU_TEST(version_lists_backends, 60)
{
    char *out;
    ck_assert_int_eq(DLOCK(&out, NULL, "--version"), 0);
    char want[128] = "(backends: file";
#ifdef DLOCK_HAVE_REDIS
    strcat(want, " redis");
#endif
#ifdef DLOCK_HAVE_ETCD
    strcat(want, " etcd");
#endif
#ifdef DLOCK_HAVE_ZK
    strcat(want, " zk");
#endif
#ifdef DLOCK_HAVE_POSTGRES
    strcat(want, " postgres");
#endif
    strcat(want, ")\n");
    ck_assert_msg(strstr(out, want), "--version says '%s', not '%s'", out, want);
    free(out);
}

/* The shell completions (cli/completion/) offer every command --help
 * names, run's options, the URL schemes and, past --, COMMAND; zsh's file
 * parses. Options come from `dlock help` at completion time, so what is
 * checked here is that the words are found where a user types them. */
TU_TEST(completion_offers_commands_options_and_schemes, 60)
{
    const char *script =
        "source cli/completion/dlock.bash\n"
        "t() { COMP_WORDS=(\"$DLOCK_BIN\" \"$@\"); COMP_CWORD=$#; COMPREPLY=(); _dlock;\n"
        "      echo \"$*: ${COMPREPLY[*]}\"; }\n"
        "t ''; t r; t -u ''; t -u redis://h run --le; t hold --on-l; t run --on-lost k;\n"
        "t run n -- ech; t help s; t run ./\n";
    char *out, *err, *help;
    int rc = tu_run((const char *[]){"bash", "-c", script, NULL}, NULL, &out, &err);
    ck_assert_msg(rc == 0, "bash: %d %s", rc, err);
    const char *expect[] = {
        ": run hold elect leader status check value get release list bench help\n",
        "r: run release\n",
        "redis+cluster:// ",
        "-u redis://h run --le: --lease\n",
        "hold --on-l: --on-lost\n",
        "run --on-lost k: kill\n",
        "run n -- ech: echo",
        "help s: status\n",
        "run ./: ./",
    };
    for (size_t i = 0; i < sizeof expect / sizeof *expect; i++)
        ck_assert_msg(strstr(out, expect[i]), "completion lacks '%s' in:\n%s", expect[i], out);
    /* every command --help's usage lines name is offered */
    ck_assert_int_eq(DLOCK(&help, NULL, "--help"), 0);
    char *first = strstr(out, ": ");
    ck_assert_ptr_nonnull(first);
    for (const char *u = help; (u = strstr(u, "dlock [-u URL] ")); u++) {
        char cmd[16];
        if (sscanf(u + strlen("dlock [-u URL] "), "%15[a-z]", cmd) == 1) {
            char *word = tu_fmt(" %s ", cmd), *line = tu_fmt(" %.*s ", (int)strcspn(first + 1, "\n"), first + 1);
            ck_assert_msg(strstr(line, word), "--help names '%s', completion does not", cmd);
            free(word);
            free(line);
        }
    }
    free(help);
    free(out);
    free(err);
    rc = tu_run((const char *[]){"zsh", "-n", "cli/completion/_dlock", NULL}, NULL, &out, &err);
    ck_assert_msg(rc == 0, "zsh -n cli/completion/_dlock: %d %s", rc, err);
    free(out);
    free(err);
}

/* The next argument of a roff macro line at *P ("quoted" with "" for a
 * quote, or up to a space) into BUF; false at the line's end. */
static bool roff_arg(const char **p, char *buf, size_t size)
{
    const char *s = *p;
    size_t n = 0;
    while (*s == ' ')
        s++;
    if (!*s || *s == '\n')
        return false;
    if (*s == '"') {
        for (s++; *s && *s != '\n'; s++) {
            if (*s == '"' && s[1] != '"')
                break;
            s += *s == '"'; /* "" is one quote */
            if (n + 1 < size)
                buf[n++] = *s;
        }
        s += *s == '"';
    } else {
        for (; *s && *s != ' ' && *s != '\n'; s++)
            if (n + 1 < size)
                buf[n++] = *s;
    }
    buf[n] = 0;
    *p = s;
    return true;
}

/* Lines of PAGE where an alternating-font macro (.BR, .IR, .BI, ...) runs
 * two words together: its arguments are set with no space between them,
 * so ".BR flock (2). On Redis" renders "flock(2).OnRedis". */
static void assert_no_glued_words(const char *path)
{
    char *page = tu_read_file(path);
    ck_assert_msg(page, "cannot read %s", path);
    int line = 1;
    for (const char *l = page; *l; line++) {
        static const char *const macros[] = {".BR ", ".RB ", ".BI ", ".IB ", ".RI ", ".IR "};
        for (size_t k = 0; k < sizeof macros / sizeof *macros; k++) {
            if (strncmp(l, macros[k], 4))
                continue;
            const char *p = l + 4;
            char prev[256] = "", arg[256];
            while (roff_arg(&p, arg, sizeof arg)) {
                size_t n = strlen(prev);
                bool glued = n && (isalnum((unsigned char)prev[n - 1]) || strchr(".,;:)", prev[n - 1])) &&
                             isalnum((unsigned char)arg[0]);
                ck_assert_msg(!glued, "%s:%d: '%s' and '%s' render as one word", path, line, prev,
                              arg);
                snprintf(prev, sizeof prev, "%s", arg);
            }
        }
        l += strcspn(l, "\n");
        l += *l == '\n';
    }
    free(page);
}

/* dlock(1) renders with man(1) without a warning, and no alternating-font
 * line of it or of the man3 pages glues words together. */
TU_TEST(man_pages_render_without_glued_words, 60)
{
    char *out, *err;
    int rc = tu_run((const char *[]){"man", "--warnings=w", "-l", "docs/dlock.1", NULL},
                    (const char *[]){"MANWIDTH=80", "MAN_KEEP_FORMATTING=", NULL}, &out, &err);
    ck_assert_msg(rc == 0 && !*err, "man -l docs/dlock.1: exit %d: %s", rc, err);
    ck_assert_ptr_nonnull(strstr(out, "DESCRIPTION"));
    free(out);
    free(err);
    assert_no_glued_words("docs/dlock.1");
    char *list;
    rc = tu_run((const char *[]){"sh", "-c", "ls docs/man3/*.3", NULL}, NULL, &list, &err);
    ck_assert_int_eq(rc, 0);
    char *save, *tok;
    for (tok = strtok_r(list, "\n", &save); tok; tok = strtok_r(NULL, "\n", &save))
        assert_no_glued_words(tok);
    free(list);
    free(err);
}

/* The man pages and README say what dlock does, not what it did: a
 * history note ("(Before, such a name silently became ...)") promises
 * a changelog that is not there and reads as current behaviour to whom
 * skims. Phrases of a change log are refused, with file and line. */
TU_TEST(docs_carry_no_changelog_text, 60)
{
    static const char *const phrases[] = {"(Before,", "Before this", "used to ", "Previously",
                                          "previously", "formerly", "changelog", "ChangeLog",
                                          "in earlier versions", "since version"};
    char *list, *err;
    int rc = tu_run((const char *[]){"sh", "-c", "ls docs/dlock.1 docs/man3/*.3 README.md", NULL},
                    NULL, &list, &err);
    ck_assert_int_eq(rc, 0);
    char *save, *path;
    for (path = strtok_r(list, "\n", &save); path; path = strtok_r(NULL, "\n", &save)) {
        char *text = tu_read_file(path);
        ck_assert_msg(text, "cannot read %s", path);
        int line = 1;
        for (char *l = text, *end; *l; l = end + (*end == '\n'), line++) {
            end = l + strcspn(l, "\n");
            char keep = *end;
            *end = 0;
            for (size_t k = 0; k < sizeof phrases / sizeof *phrases; k++)
                ck_assert_msg(!strstr(l, phrases[k]), "%s:%d: '%s' tells history: %s", path, line,
                              phrases[k], l);
            *end = keep;
        }
        free(text);
    }
    free(list);
    free(err);
}

/* --min-hold (ShedLock's lockAtLeastFor) on URL U: a job that ends at
 * once keeps its lock for the time asked, so the copy another host starts
 * a moment later, its clock a few seconds off, finds it busy. SIGTERM
 * ends the hold early, with COMMAND's status (3); with KILL9 dlock is
 * killed instead, and a network backend keeps the name until its lease. */
static void min_hold(const char *u, bool kill9)
{
    char *log = tu_fmt("%s/minhold.log", dir);
    const char *argv[] = {tu_dlock_bin(), "-u", u, "run", "-v", "--min-hold", "300",
                          "nightly", "-c", "exit 3", NULL};
    pid_t p = tu_spawn(argv, log);
    char *text = NULL;
    for (int i = 0; i < 400 && !(text && strstr(text, "(--min-hold)")); i++) {
        free(text);
        usleep(50000);
        text = tu_read_file(log);
    }
    ck_assert_msg(text && strstr(text, "(--min-hold)"), "no --min-hold line: %s",
                  text ? text : "(no log)");
    free(text);
    /* the job has ended; the name is still held */
    ck_assert_int_eq(TU_DLOCK(NULL, NULL, NULL, "-u", u, "run", "-n", "nightly", "true"), 1);
    int status = 0;
    if (kill9) {
        kill(p, SIGKILL);
        waitpid(p, &status, 0);
        ck_assert_int_eq(TU_DLOCK(NULL, NULL, NULL, "-u", u, "run", "-n", "nightly", "true"), 1);
        ck_assert_int_eq(TU_DLOCK(NULL, NULL, NULL, "-u", u, "release", "--force", "nightly"), 0);
    } else {
        status = tu_stop(p, 20000);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 3,
                      "status %#x: not COMMAND's 3", status);
    }
    ck_assert_int_eq(TU_DLOCK(NULL, NULL, NULL, "-u", u, "run", "-n", "nightly", "true"), 0);
    unlink(log);
    free(log);
}

TU_TEST(min_hold_file, 120)
{
    min_hold(url, false);
    /* a path NAME has no hold without a process: refused */
    char *err;
    char *path = tu_fmt("%s/pathlock", dir);
    ck_assert_int_eq(DLOCK(NULL, &err, "run", "--min-hold", "5", path, "true"), 64);
    ck_assert_ptr_nonnull(strstr(err, "--min-hold"));
    free(err);
    free(path);
}

#ifdef DLOCK_HAVE_REDIS
TU_TEST(min_hold_redis, 120)
{
    struct fx_redis r;
    start_redis(&r);
    min_hold(r.url, false);
    min_hold(r.url, true);
    fx_redis_stop(&r);
}
#endif

/* The recipe README and docs/recipes.md give for `hold` in a script, run
 * as written (DLOCK and URL from the environment; a marker per step):
 * busy, it exits with hold's status and runs no step; on a loss (the
 * lock freed by force while a step runs) hold stops the script's process
 * group, the later step never runs; done, the lock is free again. */
static const char hold_recipe[] =
    "exec {lock}< <(exec \"$DLOCK\" -u \"$URL\" hold --pid $$ --lease 2 $HOLD_OPTS deploy)\n"
    "read -r held <&\"$lock\" || { wait $!; exit; }   # busy, timed out or failed\n"
    "touch \"$MARK.1\"; sleep \"$STEP\"; touch \"$MARK.2\"\n"
    "exec {lock}<&-; wait $!                          # release now: 0, or 75 if lost\n";

static int run_hold_recipe(const char *u, const char *opts, const char *step, const char *mark)
{
    char *script = tu_fmt("%s/recipe.sh", dir);
    tu_write_file(script, hold_recipe);
    char *e_dlock = tu_fmt("DLOCK=%s", tu_dlock_bin()), *e_url = tu_fmt("URL=%s", u),
         *e_opts = tu_fmt("HOLD_OPTS=%s", opts), *e_step = tu_fmt("STEP=%s", step),
         *e_mark = tu_fmt("MARK=%s", mark);
    const char *env[] = {e_dlock, e_url, e_opts, e_step, e_mark, NULL};
    int rc = tu_run((const char *[]){"setsid", "-w", "bash", script, NULL}, env, NULL, NULL);
    free(e_dlock), free(e_url), free(e_opts), free(e_step), free(e_mark);
    free(script);
    return rc;
}

static void hold_recipe_busy_and_done(const char *u)
{
    char *mark = tu_fmt("%s/step", dir), *m1 = tu_fmt("%s.1", mark), *m2 = tu_fmt("%s.2", mark);
    const char *argv[] = {tu_dlock_bin(), "-u", u, "run", "deploy", "-c", "exec sleep 120", NULL};
    pid_t h = tu_spawn(argv, NULL);
    int busy = 1;
    for (int i = 0; i < 200 && busy; i++) { /* until the holder holds */
        busy = TU_DLOCK(NULL, NULL, NULL, "-u", u, "status", "deploy") != 0;
        if (busy)
            usleep(50000);
    }
    ck_assert_int_eq(run_hold_recipe(u, "-n", "0", mark), 1);
    ck_assert_msg(access(m1, F_OK) != 0, "a step ran although the lock was busy");
    tu_stop(h, 5000);
    ck_assert_int_eq(run_hold_recipe(u, "-n", "0", mark), 0);
    ck_assert_msg(access(m2, F_OK) == 0, "the steps did not run");
    ck_assert_int_eq(TU_DLOCK(NULL, NULL, NULL, "-u", u, "run", "-n", "deploy", "true"), 0);
    unlink(m1), unlink(m2);
    free(m1), free(m2), free(mark);
}

TU_TEST(hold_recipe_file, 120)
{
    hold_recipe_busy_and_done(url);
}

#ifdef DLOCK_HAVE_REDIS
TU_TEST(hold_recipe_redis, 180)
{
    struct fx_redis r;
    start_redis(&r);
    hold_recipe_busy_and_done(r.url);
    /* lost while a step runs: the script's group is stopped by SIGTERM */
    char *mark = tu_fmt("%s/lost", dir), *m1 = tu_fmt("%s.1", mark), *m2 = tu_fmt("%s.2", mark);
    pid_t killer = fork();
    if (killer == 0) {
        for (int i = 0; i < 600 && access(m1, F_OK) != 0; i++)
            usleep(50000);
        _exit(TU_DLOCK(NULL, NULL, NULL, "-u", r.url, "release", "--force", "deploy"));
    }
    int rc = run_hold_recipe(r.url, "", "60", mark);
    int st;
    waitpid(killer, &st, 0);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the forced release failed: %#x", st);
    ck_assert_msg(access(m1, F_OK) == 0, "the first step never ran");
    ck_assert_msg(access(m2, F_OK) != 0, "the step after the loss ran");
    ck_assert_msg(rc == 128 + SIGTERM, "the script ended %d, not by SIGTERM", rc);
    unlink(m1);
    free(m1), free(m2), free(mark);
    fx_redis_stop(&r);
}
#endif

/* docs/recipes.md's recipes run as written (tests/recipes.sh): the crontab
 * line once per night across two "hosts", the systemd units verified, the
 * elected service and the pod's command leading, the deploy script. */
TU_TEST(recipes_run_as_written, 120)
{
    char *out, *err;
    int rc = tu_run((const char *[]){"bash", "tests/recipes.sh", "docs/recipes.md", NULL}, NULL,
                    &out, &err);
    ck_assert_msg(rc == 0, "tests/recipes.sh: exit %d\n%s%s", rc, out, err);
    ck_assert_ptr_nonnull(strstr(out, "recipe pod-command: ok"));
    free(out);
    free(err);
}

#ifdef DLOCK_HAVE_REDIS
/* Under -v every line around a loss carries the time of day, and the
 * loss is said once (the library's own line of it and run's were both
 * printed, run's without a time). */
TU_TEST(loss_said_once_with_a_time, 120)
{
    struct fx_redis r;
    start_redis(&r);
    char *log = tu_fmt("%s/loss.log", dir), *mark = tu_fmt("%s/loss.started", dir);
    char *cmd = tu_fmt("touch %s; exec sleep 60", mark);
    const char *argv[] = {tu_dlock_bin(), "-u", r.url, "run", "-v", "--lease", "2", "lx",
                          "-c", cmd, NULL};
    pid_t p = tu_spawn(argv, log);
    ck_assert_msg(tu_wait_file(mark, 20000), "the command never started");
    ck_assert_int_eq(TU_DLOCK(NULL, NULL, NULL, "-u", r.url, "release", "--force", "lx"), 0);
    int status;
    waitpid(p, &status, 0);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 75, "status %#x, not 75", status);
    char *text = tu_read_file(log);
    ck_assert_ptr_nonnull(text);
    int losses = 0;
    for (char *line = text, *end; *line; line = end + (*end == '\n')) {
        end = line + strcspn(line, "\n");
        int h, m, sec, ms;
        ck_assert_msg(sscanf(line, "%2d:%2d:%2d.%3d ", &h, &m, &sec, &ms) == 4,
                      "a -v line without the time: %.*s", (int)(end - line), line);
        char *lost = strstr(line, " lost");
        losses += lost && lost < end;
    }
    ck_assert_msg(losses == 1, "the loss said %d times:\n%s", losses, text);
    free(text), free(cmd), free(mark), free(log);
    fx_redis_stop(&r);
}
#endif

int main(void)
{
    if (getenv(TERM_COUNTER_ENV))
        return term_counter_main(getenv(TERM_COUNTER_ENV));
    return tu_main("cli", setup, teardown);
}
