/* fixture_mysql.h -- a real MariaDB server for the tests: mariadbd from
 * Debian's mariadb-server on a free loopback port and a socket in a temp
 * directory, a child of the calling process (tu_spawn: killed with it).
 *
 * mariadb-install-db runs once per test binary, into a template data
 * directory (small InnoDB log and buffer pool, so a copy is ~20 MB and
 * quick); each server starts on a copy of it, with a database `dlock`,
 * performance_schema on and the metadata-lock instrument enabled (what
 * dlock_list() reads). No client library here: SQL goes through the
 * `mariadb` command-line client on the socket, as root.
 */
#ifndef DLOCK_FIXTURE_MYSQL_H
#define DLOCK_FIXTURE_MYSQL_H

#include <stdbool.h>
#include <sys/types.h>

struct fx_mysql {
    pid_t pid; /* 0 when stopped */
    int port;  /* on 127.0.0.1 */
    char *dir; /* the temp directory: data/, the socket, the log */
    char *data, *sock, *log;
    char url[128];            /* "mysql://root@127.0.0.1:PORT/dlock" */
    char error[512];          /* why a start failed */
    const char *const *extra; /* more mariadbd options (fx_mysql_start_with) */
};

/* Start a server and wait until it answers SQL. False with M->error set. */
bool fx_mysql_start(struct fx_mysql *m);
/* The same with EXTRA, a NULL-terminated list of more mariadbd options
 * (at most 19; the caller keeps it alive for restarts), e.g. a Galera
 * node's. */
bool fx_mysql_start_with(struct fx_mysql *m, const char *const *extra);
/* Stop it with SIG (SIGKILL: a crash; SIGTERM: a clean shutdown), reap it. */
void fx_mysql_kill(struct fx_mysql *m, int sig);
/* Start it again on its port and data; wait until it answers. */
bool fx_mysql_restart(struct fx_mysql *m);
/* Stop it and remove its directory. */
void fx_mysql_stop(struct fx_mysql *m);
/* Run SQL as root; its output (tab-separated, no column names) or NULL
 * when the client failed (caller frees). */
char *fx_mysql_sql(const struct fx_mysql *m, const char *sql);

#endif
