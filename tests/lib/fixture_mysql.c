/* fixture_mysql.c -- the MariaDB server of fixture_mysql.h: a template
 * data directory made once per process, a copy per server, mariadbd on
 * it. */
#include "fixture_mysql.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

/* The InnoDB sizes of the template and of every server (they must match). */
#define INNODB_LOG "--innodb-log-file-size=4M"
#define INNODB_POOL "--innodb-buffer-pool-size=16M"

static pthread_mutex_t template_mu = PTHREAD_MUTEX_INITIALIZER;
static char *template_dir; /* data directory made by mariadb-install-db */
static pid_t template_owner;

static void template_remove(void)
{
    if (template_dir && template_owner == getpid()) {
        char *dir = tu_fmt("%s/..", template_dir);
        tu_rmrf(dir);
        free(dir);
    }
}

/* The template, made once per process (a forked test makes its own
 * only if the suite's process never did). */
static const char *template_get(struct fx_mysql *m)
{
    pthread_mutex_lock(&template_mu);
    if (!template_dir || template_owner != getpid()) {
        char *dir = tu_tmpdir("mysql-template");
        char *data = tu_fmt("%s/data", dir);
        char *datadir = tu_fmt("--datadir=%s", data);
        const char *argv[] = {"mariadb-install-db",
                              "--no-defaults",
                              datadir,
                              "--auth-root-authentication-method=normal",
                              "--skip-test-db",
                              INNODB_LOG,
                              INNODB_POOL,
                              geteuid() == 0 ? "--user=root" : NULL,
                              NULL};
        int st = tu_run(argv, NULL, NULL, NULL);
        if (st != 0) {
            snprintf(m->error, sizeof m->error, "mariadb-install-db exited %d", st);
            tu_rmrf(dir);
            free(data);
        } else {
            template_dir = data;
            template_owner = getpid();
            atexit(template_remove);
        }
        free(dir);
        free(datadir);
    }
    pthread_mutex_unlock(&template_mu);
    return template_dir;
}

static bool answers(const struct fx_mysql *m)
{
    char *out = fx_mysql_sql(m, "SELECT 1");
    bool ok = out && strncmp(out, "1", 1) == 0;
    free(out);
    return ok;
}

static bool spawn(struct fx_mysql *m)
{
    char *datadir = tu_fmt("--datadir=%s", m->data);
    char *port = tu_fmt("--port=%d", m->port);
    char *sock = tu_fmt("--socket=%s", m->sock);
    char *pidf = tu_fmt("--pid-file=%s/mariadbd.pid", m->dir);
    char *bind = tu_fmt("--bind-address=%s", tu_listen_addr());
    const char *argv[32] = {"mariadbd",
                            "--no-defaults",
                            datadir,
                            port,
                            sock,
                            pidf,
                            bind,
                            "--skip-name-resolve",
                            INNODB_LOG,
                            INNODB_POOL,
                            "--performance-schema=ON",
                            "--performance-schema-instrument=wait/lock/metadata/sql/mdl=ON"};
    size_t n = 12;
    if (geteuid() == 0)
        argv[n++] = "--user=root";
    for (size_t i = 0; m->extra && m->extra[i] && n < 31; i++)
        argv[n++] = m->extra[i];
    m->pid = tu_spawn(argv, m->log);
    free(datadir);
    free(port);
    free(sock);
    free(pidf);
    free(bind);
    for (int i = 0; i < 1500; i++) { /* up to 30 s on a loaded machine */
        if (answers(m))
            return true;
        if (waitpid(m->pid, NULL, WNOHANG) == m->pid) {
            m->pid = 0;
            break;
        }
        tu_sleep_ms(20);
    }
    snprintf(m->error, sizeof m->error, "mariadbd on port %d did not start (log: %s)", m->port,
             m->log);
    return false;
}

bool fx_mysql_start(struct fx_mysql *m)
{
    return fx_mysql_start_with(m, NULL);
}

bool fx_mysql_start_with(struct fx_mysql *m, const char *const *extra)
{
    memset(m, 0, sizeof *m);
    m->extra = extra;
    const char *tpl = template_get(m);
    if (!tpl)
        return false;
    m->dir = tu_tmpdir("mysql");
    m->data = tu_fmt("%s/data", m->dir);
    m->sock = tu_fmt("%s/mysql.sock", m->dir);
    m->log = tu_fmt("%s/mariadbd.log", m->dir);
    m->port = tu_free_port();
    snprintf(m->url, sizeof m->url, "mysql://root@127.0.0.1:%d/dlock", m->port);
    const char *cp[] = {"cp", "-a", tpl, m->data, NULL};
    if (tu_run(cp, NULL, NULL, NULL) != 0) {
        snprintf(m->error, sizeof m->error, "cannot copy the template %s", tpl);
        return false;
    }
    char *db = tu_fmt("%s/dlock", m->data); /* a directory is a database */
    mkdir(db, 0700);
    free(db);
    return spawn(m);
}

void fx_mysql_kill(struct fx_mysql *m, int sig)
{
    if (m->pid > 0)
        tu_stop_with(m->pid, sig, 10000);
    m->pid = 0;
}

bool fx_mysql_restart(struct fx_mysql *m)
{
    fx_mysql_kill(m, SIGKILL);
    return spawn(m);
}

void fx_mysql_stop(struct fx_mysql *m)
{
    fx_mysql_kill(m, SIGKILL); /* its data goes too: nothing to flush */
    if (m->dir)
        tu_rmrf(m->dir);
    free(m->dir);
    free(m->data);
    free(m->sock);
    free(m->log);
    memset(m, 0, sizeof *m);
}

char *fx_mysql_sql(const struct fx_mysql *m, const char *sql)
{
    char *sock = tu_fmt("--socket=%s", m->sock);
    const char *argv[] = {"mariadb", "--no-defaults", "-uroot", sock, "-N",
                          "-B",      "--comments",    "-e",     sql,  NULL};
    char *out = NULL;
    int st = tu_run(argv, NULL, &out, NULL);
    free(sock);
    if (st != 0) {
        free(out);
        return NULL;
    }
    return out;
}
