/* fixture_pg.c -- real PostgreSQL servers for the tests (fixture_pg.h says
 * what and why). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture_pg.h"
#include "testutil.h"

static char *template_dir; /* initdb's output, copied by every server */
static char template_error[512];

/* Debian keeps initdb and postgres out of PATH: the newest version's bin
 * directory, with a trailing '/', else "" (PATH). */
static const char *bin_dir(void)
{
    static char bin[256];
    static bool found;
    if (found)
        return bin;
    glob_t g;
    if (glob("/usr/lib/postgresql/*/bin/postgres", 0, NULL, &g) == 0 && g.gl_pathc > 0) {
        snprintf(bin, sizeof bin, "%s", g.gl_pathv[g.gl_pathc - 1]);
        *strrchr(bin, '/') = '\0';
        strcat(bin, "/");
    }
    globfree(&g);
    found = true;
    return bin;
}

/* Make PATH (and what is under it) the server's: nobody's when we are root. */
static void give_to_server_user(const char *path)
{
    if (geteuid() != 0)
        return;
    const char *argv[] = {"chown", "-R", "65534:65534", path, NULL};
    tu_run(argv, NULL, NULL, NULL);
}

/* TEXT into PATH; false when it could not be written. No check
 * assertion: the fault harness's `make chaos` runs outside any test. */
static bool write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return false;
    bool ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

/* The state letter of process PID ('T': stopped), '?' when gone. */
static char state_of(pid_t pid)
{
    char *path = tu_fmt("/proc/%d/stat", (int)pid), buf[512] = "";
    FILE *fp = fopen(path, "r");
    free(path);
    const char *text = fp ? fgets(buf, sizeof buf, fp) : NULL;
    if (fp)
        fclose(fp);
    const char *end = text ? strrchr(text, ')') : NULL; /* "pid (comm) state" */
    return end && end[1] == ' ' ? end[2] : '?';
}

/* SIGSTOP PID and wait (up to 10 s) until it is stopped; no assertion. */
static void pause_process(pid_t pid)
{
    kill(pid, SIGSTOP);
    for (int i = 0; i < 2000 && state_of(pid) != 'T' && state_of(pid) != '?'; i++)
        tu_sleep_ms(5);
}

/* initdb once per process into template_dir. */
static bool make_template(void)
{
    if (template_dir)
        return true;
    if (template_error[0])
        return false;
    char *dir = tu_tmpdir("pgtemplate");
    chmod(dir, 0755);
    char *data = tu_fmt("%s/data", dir), *pw = tu_fmt("%s/pw", dir),
         *log = tu_fmt("%s/initdb.log", dir);
    bool written = write_text(pw, PGF_PASSWORD "\n");
    chmod(pw, 0644);
    give_to_server_user(dir);
    char *initdb = tu_fmt("%sinitdb", bin_dir());
    char *pwopt = tu_fmt("--pwfile=%s", pw);
    /* clang-format off */
    const char *argv[] = {initdb, "-D", data, "-U", "postgres", "--auth=trust", pwopt,
                          "-N", "--locale=C", "-E", "UTF8", NULL};
    /* clang-format on */
    pid_t pid = written ? tu_spawn_as_nobody(argv, log, true) : -1;
    int rc = pid > 0 ? tu_wait_exit(pid) : 1;
    if (rc == 0) {
        /* SCRAM costs milliseconds of CPU per connection on each side: only
         * PGF_PASSWORD_USER's connections over TCP pay for it */
        char *hba = tu_fmt("%s/pg_hba.conf", data), *old = tu_read_file(hba);
        /* every other role trusted from any address: the server listens on
         * more than loopback only in the fault harness's own namespace */
        char *text = tu_fmt("host all " PGF_PASSWORD_USER " 127.0.0.1/32 scram-sha-256\n%s"
                            "host all all 0.0.0.0/0 trust\n",
                            old);
        if (!write_text(hba, text))
            rc = 1;
        give_to_server_user(hba);
        free(hba);
        free(old);
        free(text);
    }
    if (rc != 0) {
        char *text = tu_read_file(log);
        snprintf(template_error, sizeof template_error, "initdb failed (%d): %.400s", rc,
                 text ? text : "");
        free(text);
        tu_rmrf(dir);
        free(dir);
    } else {
        template_dir = dir;
    }
    free(initdb);
    free(pwopt);
    free(data);
    free(pw);
    free(log);
    return template_dir != NULL;
}

static bool run_server(struct pgf *f)
{
    char *postgres = tu_fmt("%spostgres", bin_dir()), *port = tu_fmt("%d", f->port);
    char *listen = tu_fmt("listen_addresses=%s", tu_listen_addr());
    /* clang-format off */
    const char *argv[] = {postgres, "-D", f->data, "-k", f->dir, "-p", port,
                          "-c", listen, "-F",
                          "-c", "max_connections=200", "-c", "shared_buffers=16MB",
                          "-c", "log_min_messages=fatal", NULL};
    /* clang-format on */
    f->pid = tu_spawn_as_nobody(argv, f->log, true);
    free(postgres);
    free(port);
    free(listen);
    /* up when psql gets an answer through the socket and the port listens */
    for (int i = 0; i < 1200; i++) {
        if (pgf_psql(f, "SELECT 1", NULL) == 0 && tu_wait_port(f->port, 100))
            return true;
        int status;
        if (waitpid(f->pid, &status, WNOHANG) == f->pid) {
            f->pid = 0;
            break;
        }
        tu_sleep_ms(50);
    }
    char *text = tu_read_file(f->log);
    snprintf(f->error, sizeof f->error, "postgres did not start: %.400s", text ? text : "(no log)");
    free(text);
    return false;
}

bool pgf_start(struct pgf *f)
{
    memset(f, 0, sizeof *f);
    if (!make_template()) {
        snprintf(f->error, sizeof f->error, "%s", template_error);
        return false;
    }
    f->dir = tu_tmpdir("pg");
    chmod(f->dir, 0755);
    f->data = tu_fmt("%s/data", f->dir);
    f->log = tu_fmt("%s/postgres.log", f->dir);
    char *from = tu_fmt("%s/data", template_dir);
    const char *cp[] = {"cp", "-a", from, f->data, NULL};
    int rc = tu_run(cp, NULL, NULL, NULL);
    free(from);
    if (rc != 0) {
        snprintf(f->error, sizeof f->error, "copying the template data directory failed");
        return false;
    }
    give_to_server_user(f->dir);
    f->port = tu_free_port();
    return run_server(f);
}

/* Signal SIG to the server's process group, and wait for the postmaster. */
static void signal_and_reap(struct pgf *f, int sig)
{
    if (f->pid <= 0)
        return;
    kill(-f->pid, SIGCONT);
    kill(f->pid, sig);
    int status;
    for (int waited = 0; waited < 10000; waited += 20) {
        if (waitpid(f->pid, &status, WNOHANG) == f->pid) {
            f->pid = 0;
            return;
        }
        tu_sleep_ms(20);
    }
    kill(-f->pid, SIGKILL);
    waitpid(f->pid, &status, 0);
    f->pid = 0;
}

void pgf_kill(struct pgf *f)
{
    signal_and_reap(f, SIGQUIT);
}

bool pgf_restart(struct pgf *f)
{
    pgf_kill(f);
    return run_server(f);
}

void pgf_stop(struct pgf *f)
{
    signal_and_reap(f, SIGQUIT);
    if (f->dir)
        tu_rmrf(f->dir);
    free(f->dir);
    free(f->data);
    free(f->log);
    f->dir = f->data = f->log = NULL;
}

/* Send SIG to each child of the postmaster (every backend is a session
 * of its own: setsid()). */
static void signal_children(const struct pgf *f, int sig)
{
    DIR *d = opendir("/proc");
    struct dirent *de;
    while (d && (de = readdir(d))) {
        pid_t pid = (pid_t)atoi(de->d_name);
        if (pid <= 0)
            continue;
        char *path = tu_fmt("/proc/%d/stat", (int)pid), *text = NULL;
        FILE *fp = fopen(path, "r");
        char buf[512] = "";
        if (fp) {
            text = fgets(buf, sizeof buf, fp);
            fclose(fp);
        }
        free(path);
        const char *end = text ? strrchr(text, ')') : NULL; /* "pid (comm) state ppid" */
        int ppid = 0;
        if (end && sscanf(end + 1, " %*c %d", &ppid) == 1 && ppid == f->pid) {
            if (sig == SIGSTOP)
                pause_process(pid);
            else
                kill(pid, sig);
        }
    }
    if (d)
        closedir(d);
}

void pgf_pause(const struct pgf *f, bool stop)
{
    if (f->pid <= 0)
        return;
    /* the postmaster first, so it forks no backend meanwhile */
    if (stop)
        pause_process(f->pid);
    signal_children(f, stop ? SIGSTOP : SIGCONT);
    if (!stop)
        kill(f->pid, SIGCONT);
}

void pgf_crash(struct pgf *f)
{
    if (f->pid <= 0)
        return;
    pause_process(f->pid); /* forks no backend meanwhile */
    signal_children(f, SIGKILL);
    kill(f->pid, SIGKILL);
    waitpid(f->pid, NULL, 0);
    f->pid = 0;
}

char *pgf_url(const struct pgf *f, const char *query)
{
    return tu_fmt("postgres://postgres:" PGF_PASSWORD "@127.0.0.1:%d/postgres%s%s", f->port,
                  query && *query ? "?" : "", query && *query ? query : "");
}

int pgf_psql(const struct pgf *f, const char *sql, char **out)
{
    const char *argv[] = {"psql",     "-h", f->dir, "-p", NULL, "-U", "postgres",        "-d",
                          "postgres", "-X", "-A",   "-t", "-q", "-v", "ON_ERROR_STOP=1", "-c",
                          sql,        NULL};
    char *port = tu_fmt("%d", f->port);
    argv[4] = port;
    int rc = tu_run(argv, NULL, out, NULL);
    free(port);
    return rc;
}
