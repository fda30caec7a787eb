/* check_fencing_pg.c -- the fencing-token recipe of docs/choosing-a-backend.md,
 * run against a real PostgreSQL server: a holder that paused past its
 * lease writes with its old token and the database refuses the write,
 * because the row remembers the newest token it took:
 *
 *   UPDATE account SET fence = $token, ... WHERE id = 1 AND fence < $token
 *
 * The test starts its own server (initdb + postgres, no TCP: a unix socket
 * in a temp dir) and a redis-server (the lock, through the fixture), and
 * plays two holders with the dlock CLI (`dlock run`, the token in
 * $DLOCK_TOKEN, psql for the write). PostgreSQL refuses to run as root:
 * when the tests run as root, the test process first becomes nobody, so
 * the server it starts still dies with it (PR_SET_PDEATHSIG survives no
 * change of user at exec, but here none happens).
 */
#include <check.h>
#include <glob.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture_redis.h"
#include "testutil.h"

/* A PostgreSQL server of the test: data and socket in DIR. */
struct pg {
    char *dir, *data, *log;
    char bin[256]; /* the server's bin directory, "" when in PATH */
    pid_t pid;
};

/* Debian keeps initdb and postgres out of PATH, in
 * /usr/lib/postgresql/<version>/bin: the newest found there, else PATH. */
static void pg_find_bin(struct pg *p)
{
    glob_t g;
    p->bin[0] = '\0';
    if (glob("/usr/lib/postgresql/*/bin/postgres", 0, NULL, &g) == 0 && g.gl_pathc > 0) {
        snprintf(p->bin, sizeof p->bin, "%s", g.gl_pathv[g.gl_pathc - 1]);
        *strrchr(p->bin, '/') = '\0';
        strcat(p->bin, "/");
    }
    globfree(&g);
}

/* Run SQL through psql on P's socket; psql's exit status, its output
 * (unaligned, tuples only, plus command tags) into *OUT. */
static int psql(const struct pg *p, const char *sql, char **out)
{
    const char *argv[] = {"psql", "-h", p->dir, "-U", "postgres", "-d", "postgres", "-X", "-A", "-t",
                          "-v", "ON_ERROR_STOP=1", "-c", sql, NULL};
    return tu_run(argv, NULL, out, NULL);
}

static void pg_start(struct pg *p)
{
    memset(p, 0, sizeof *p);
    pg_find_bin(p);
    p->dir = tu_tmpdir("pg");
    p->data = tu_fmt("%s/data", p->dir);
    p->log = tu_fmt("%s/postgres.log", p->dir);
    char *initdb = tu_fmt("%sinitdb", p->bin), *postgres = tu_fmt("%spostgres", p->bin);
    const char *init[] = {initdb, "-D", p->data, "-U", "postgres", "-A", "trust", "-N",
                          "--locale=C", "-E", "UTF8", NULL};
    char *err = NULL;
    int rc = tu_run(init, NULL, NULL, &err);
    ck_assert_msg(rc == 0, "initdb failed (%d): %s", rc, err ? err : "");
    free(err);
    /* no TCP at all: the socket in DIR is the only way in */
    const char *argv[] = {postgres, "-D", p->data, "-k", p->dir, "-c", "listen_addresses=", "-F", NULL};
    p->pid = tu_spawn(argv, p->log);
    /* up when it answers (initdb and a first start take seconds on a
     * loaded machine) */
    bool up = false;
    for (int i = 0; i < 1200 && !up; i++) {
        up = psql(p, "SELECT 1", NULL) == 0;
        if (!up)
            tu_sleep_ms(50);
    }
    if (!up) {
        char *text = tu_read_file(p->log);
        ck_abort_msg("postgres did not start; its log:\n%s", text ? text : "(none)");
    }
    free(initdb);
    free(postgres);
}

static void pg_stop(struct pg *p)
{
    if (p->pid > 0)
        tu_stop(p->pid, 5000);
    tu_rmrf(p->dir);
    free(p->dir);
    free(p->data);
    free(p->log);
}

/* PostgreSQL will not run as root; neither must anything this test starts. */
static void become_nobody(void)
{
    if (geteuid() != 0)
        return;
    ck_assert_int_eq(setgroups(0, NULL), 0);
    ck_assert_int_eq(setgid(65534), 0);
    ck_assert_int_eq(setuid(65534), 0);
    setenv("HOME", "/tmp", 1);
}

/* Holder A takes the lock, is frozen past its lease (SIGSTOP of the dlock
 * process that renews it: a GC pause, a swapped-out VM), holder B takes
 * the lock and writes; A wakes and writes with its old token: refused. */
TU_TEST(stale_holder_write_refused, 180)
{
    become_nobody();
    struct pg pg;
    pg_start(&pg);
    struct fx_redis redis;
    ck_assert(fx_redis_start(&redis, NULL));
    char *out = NULL;
    ck_assert_int_eq(psql(&pg, "CREATE TABLE account (id int PRIMARY KEY, balance int NOT NULL, "
                               "fence bigint NOT NULL DEFAULT 0, writer text); "
                               "INSERT INTO account VALUES (1, 100, 0, NULL)",
                          NULL),
                     0);
    char *dir = tu_tmpdir("fence"), *a_token = tu_fmt("%s/a.token", dir), *go = tu_fmt("%s/go", dir),
         *a_result = tu_fmt("%s/a.result", dir), *a_log = tu_fmt("%s/a.log", dir);
    setenv("PGHOST", pg.dir, 1);
    setenv("PGUSER", "postgres", 1);
    setenv("PGDATABASE", "postgres", 1);
    /* the recipe: the write names the token and only lands while no newer
     * one has been seen for this row */
    const char *write_sql = "psql -X -c \"UPDATE account SET balance = balance - 10, fence = $DLOCK_TOKEN, "
                            "writer = '$WRITER' WHERE id = 1 AND fence < $DLOCK_TOKEN\"";
    char *a_script = tu_fmt("echo $DLOCK_TOKEN > %s.tmp && mv %s.tmp %s; "
                            "while [ ! -e %s ]; do sleep 0.05; done; WRITER=A; %s > %s 2>&1",
                            a_token, a_token, a_token, go, write_sql, a_result);
    const char *a_argv[] = {tu_dlock_bin(), "-u", redis.url, "run", "--lease", "1", "--on-lost", "ignore",
                            "account-1", "--", "sh", "-c", a_script, NULL};
    pid_t a = tu_spawn(a_argv, a_log);
    ck_assert_msg(tu_wait_file(a_token, 30000), "holder A never got the lock");
    uint64_t token_a = tu_read_u64(a_token);
    tu_pause(a); /* A's lease runs out: nothing renews it */

    char *b_script = tu_fmt("WRITER=B; %s", write_sql);
    char *b_out = NULL, *b_err = NULL;
    int rc = TU_DLOCK(&b_out, &b_err, NULL, "-u", redis.url, "run", "-w", "30", "account-1", "--", "sh", "-c",
                      b_script);
    ck_assert_msg(rc == 0, "holder B: exit %d: %s", rc, b_err);
    ck_assert_msg(strstr(b_out, "UPDATE 1"), "B's write did not land: %s", b_out);

    /* A goes on as if it still held the lock */
    tu_write_file(go, "");
    ck_assert_msg(tu_wait_file(a_result, 30000), "holder A never wrote");
    kill(a, SIGCONT);
    int status = 0;
    waitpid(a, &status, 0);
    char *a_out = NULL;
    for (int i = 0; i < 600 && !(a_out && strstr(a_out, "UPDATE")); i++) {
        free(a_out);
        a_out = tu_read_file(a_result);
        if (!strstr(a_out ? a_out : "", "UPDATE"))
            tu_sleep_ms(50);
    }
    ck_assert_msg(a_out && strstr(a_out, "UPDATE 0"), "the stale write was not refused: %s", a_out);

    /* the row holds B's write and B's token, the newer one */
    ck_assert_int_eq(psql(&pg, "SELECT balance, fence, writer FROM account WHERE id = 1", &out), 0);
    long balance = 0;
    unsigned long long fence = 0;
    char writer[8] = "";
    ck_assert_msg(sscanf(out, "%ld|%llu|%7s", &balance, &fence, writer) == 3, "row: %s", out);
    ck_assert_int_eq(balance, 90);
    ck_assert_str_eq(writer, "B");
    ck_assert_msg(fence > token_a, "the row's fence %llu is not above A's token %llu", fence,
                  (unsigned long long)token_a);

    free(out);
    free(a_out);
    free(b_out);
    free(b_err);
    free(a_script);
    free(b_script);
    fx_redis_stop(&redis);
    pg_stop(&pg);
    tu_rmrf(dir);
    free(dir);
    free(a_token);
    free(go);
    free(a_result);
    free(a_log);
}
END_TEST

int main(void)
{
    return tu_main("fencing_pg", NULL, NULL);
}
