/* fixture_pg.h -- real PostgreSQL servers for the tests, from Debian's
 * postgresql package (initdb and postgres in /usr/lib/postgresql/<v>/bin).
 *
 * initdb costs seconds, so it runs once per test binary, into a template
 * data directory that every server copies. Each server listens on a free
 * loopback TCP port (the relay tests need TCP) and on a unix socket in
 * its own temp directory. Every role is trusted but PGF_PASSWORD_USER,
 * which must give its password (SCRAM) over TCP: a test that wants a
 * password checked creates that role (the SCRAM exchange costs
 * milliseconds of CPU per connection, which every test would pay). PostgreSQL refuses to run as
 * root: as root the fixture runs initdb and the server as nobody, in a child that gives up root
 * first and only then asks to die with the test (PR_SET_PDEATHSIG, which a change of credentials
 * clears). Start servers from an unchecked fixture and every forked test shares them.
 */
#ifndef DLOCK_FIXTURE_PG_H
#define DLOCK_FIXTURE_PG_H

#include <stdbool.h>
#include <sys/types.h>

#define PGF_PASSWORD "dlock-secret"
#define PGF_PASSWORD_USER "dlock_pw"

struct pgf {
    pid_t pid; /* the postmaster (a process group of its own); 0 when stopped */
    int port;  /* on 127.0.0.1 */
    char *dir; /* temp directory: data/, the socket, postgres.log */
    char *data;
    char *log;
    char error[512];
};

/* Start a server (copying the template, made at the first call). False
 * with f->error set on failure. */
bool pgf_start(struct pgf *f);
/* Stop it (SIGQUIT: an immediate shutdown, as a crash) and wait for it;
 * the data stays, for pgf_restart(). */
void pgf_kill(struct pgf *f);
/* kill -9 the postmaster and every backend at once (a crash: the
 * shared memory goes, the next start recovers from the WAL) and reap it;
 * the data stays, for pgf_restart(). */
void pgf_crash(struct pgf *f);
/* Start it again on the same port and data. */
bool pgf_restart(struct pgf *f);
/* Stop it and remove its directory. */
void pgf_stop(struct pgf *f);
/* SIGSTOP (STOP true) or SIGCONT every process of the server. */
void pgf_pause(const struct pgf *f, bool stop);

/* "postgres://postgres:PASSWORD@127.0.0.1:PORT/postgres[?QUERY]" (caller
 * frees; the password is sent only if the server asks). */
char *pgf_url(const struct pgf *f, const char *query);
/* Run SQL through psql on the server's socket as postgres; psql's exit
 * status, its output (unaligned, tuples only) into *OUT (may be NULL). */
int pgf_psql(const struct pgf *f, const char *sql, char **out);

#endif
