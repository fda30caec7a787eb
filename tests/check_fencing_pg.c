/* check_fencing_pg.c -- the fencing-token recipe of docs/choosing-a-backend.md,
 * run against a real PostgreSQL server: a holder that paused past its
 * lease writes with its old token and the database refuses the write,
 * because the row remembers the newest token it took:
 *
 *   UPDATE account SET fence = $token, ... WHERE id = 1 AND fence < $token
 *
 * The test starts its own server (initdb + postgres, no TCP: a unix socket
 * in a temp dir) and a redis-server (the lock, through the fixture), and
 * plays two holders twice: with the dlock CLI (`dlock run`, the token in
 * $DLOCK_TOKEN, psql for the write), and through libdlock and libpq with
 * the code of examples/fence_pg.c (included here, its main() left out),
 * which is also the code the guide shows: a third test checks that the
 * guide's C block is that file's text. PostgreSQL refuses to run as root:
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

#include <libpq-fe.h>

#include "dlock.h"
#include "fixture_redis.h"
#include "testutil.h"

#define FENCE_PG_NO_MAIN
#include "fence_pg.c"

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

/* The account table of the recipe, with balance 100 and no writer yet. */
static void pg_make_account(const struct pg *p)
{
    ck_assert_int_eq(psql(p, "CREATE TABLE account (id int PRIMARY KEY, balance int NOT NULL, "
                             "fence bigint NOT NULL DEFAULT 0, writer text); "
                             "INSERT INTO account VALUES (1, 100, 0, NULL)",
                          NULL),
                     0);
}

static PGconn *pg_connect(const struct pg *p)
{
    char *info = tu_fmt("host=%s user=postgres dbname=postgres", p->dir);
    PGconn *pg = PQconnectdb(info);
    ck_assert_msg(PQstatus(pg) == CONNECTION_OK, "libpq: %s", PQerrorMessage(pg));
    free(info);
    return pg;
}

/* The row holds B's debit alone (balance 90), written by WRITER ("-" for
 * none) with a token above A's TOKEN_A. */
static void assert_only_b_wrote(const struct pg *p, uint64_t token_a, const char *writer)
{
    char *out = NULL;
    ck_assert_int_eq(psql(p, "SELECT balance, fence, coalesce(writer, '-') FROM account WHERE id = 1", &out), 0);
    long balance = 0;
    unsigned long long fence = 0;
    char who[8] = "";
    ck_assert_msg(sscanf(out, "%ld|%llu|%7s", &balance, &fence, who) == 3, "row: %s", out);
    ck_assert_int_eq(balance, 90);
    ck_assert_str_eq(who, writer);
    ck_assert_msg(fence > token_a, "the row's fence %llu is not above A's token %llu", fence,
                  (unsigned long long)token_a);
    free(out);
}

/* The start of a test, as nobody: PostgreSQL with the account table, a
 * Redis for the lock, and a fresh directory for markers (returned). */
static char *servers_start(struct fx_redis *redis, struct pg *p)
{
    become_nobody();
    pg_start(p);
    ck_assert(fx_redis_start(redis, NULL));
    pg_make_account(p);
    return tu_tmpdir("fence");
}

/* The end of a test: its servers stopped, its directory DIR removed and freed. */
static void servers_stop(struct fx_redis *redis, struct pg *p, char *dir)
{
    fx_redis_stop(redis);
    pg_stop(p);
    tu_rmrf(dir);
    free(dir);
}

/* Holder A takes the lock, is frozen past its lease (SIGSTOP of the dlock
 * process that renews it: a GC pause, a swapped-out VM), holder B takes
 * the lock and writes; A wakes and writes with its old token: refused. */
TU_TEST(stale_holder_write_refused, 180)
{
    struct pg pg;
    struct fx_redis redis;
    char *dir = servers_start(&redis, &pg), *a_token = tu_fmt("%s/a.token", dir), *go = tu_fmt("%s/go", dir),
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
    assert_only_b_wrote(&pg, token_a, "B");

    free(a_out);
    free(b_out);
    free(b_err);
    free(a_script);
    free(b_script);
    servers_stop(&redis, &pg, dir);
    free(a_token);
    free(go);
    free(a_result);
    free(a_log);
}

/* Holder A of the libdlock test, a child process: takes the lock with a
 * 1 s lease, says its token in TOKEN_FILE, waits for GO (the parent
 * freezes it meanwhile, so nothing renews the lease), then writes with
 * fenced_debit() as if it still held the lock and exits with 10 + its
 * result (10 refused, 11 landed, 9 error). */
static int holder_a(const char *url, const struct pg *p, const char *token_file, const char *go)
{
    dlock_client *c;
    dlock_lock *l;
    if (dlock_open(url, &c) || dlock_lock_new(c, "account-1", DLOCK_EXCLUSIVE, 0, &l) ||
        dlock_lock_set_lease(l, 1000, 0) || dlock_acquire(l, 30000))
        return 2;
    uint64_t token = 0;
    dlock_token(l, &token);
    char text[32];
    snprintf(text, sizeof text, "%llu", (unsigned long long)token);
    tu_write_marker(token_file, text);
    while (access(go, F_OK) != 0)
        tu_sleep_ms(20);
    PGconn *pg = pg_connect(p);
    int wrote = fenced_debit(pg, token, 10);
    PQfinish(pg);
    dlock_release(l); /* DLOCK_ELOST or not held: expected, not checked */
    dlock_lock_free(l);
    dlock_client_close(c);
    return 10 + wrote;
}

/* The same two holders through libdlock and libpq with the example's
 * code: A frozen past its lease, B takes the lock and debits with
 * debit_under_lock(), A wakes and its fenced_debit() is refused. */
TU_TEST(stale_holder_refused_through_libdlock, 180)
{
    struct pg pg;
    struct fx_redis redis;
    char *dir = servers_start(&redis, &pg), *a_token = tu_fmt("%s/a.token", dir), *go = tu_fmt("%s/go", dir);

    pid_t a = fork();
    ck_assert_int_ge(a, 0);
    if (a == 0)
        _exit(holder_a(redis.url, &pg, a_token, go));
    ck_assert_msg(tu_wait_file(a_token, 30000), "holder A never got the lock");
    uint64_t token_a = tu_read_u64(a_token);
    tu_pause(a); /* A's keeper is frozen with it: its lease runs out */

    dlock_client *c;
    dlock_lock *l;
    ck_assert_int_eq(dlock_open(redis.url, &c), DLOCK_OK);
    ck_assert_int_eq(dlock_lock_new(c, "account-1", DLOCK_EXCLUSIVE, 0, &l), DLOCK_OK);
    PGconn *conn = pg_connect(&pg);
    /* debit_under_lock() waits 5 s; A's 1 s lease may outlive that on a
     * loaded machine: wait for the lock first, then run the example */
    ck_assert_int_eq(dlock_acquire(l, 30000), DLOCK_OK);
    ck_assert_int_eq(dlock_release(l), DLOCK_OK);
    ck_assert_int_eq(debit_under_lock(l, conn, 10), 1);

    tu_write_file(go, "");
    kill(a, SIGCONT);
    int status = 0;
    ck_assert_int_eq(waitpid(a, &status, 0), a);
    ck_assert_msg(WIFEXITED(status), "holder A died: status %d", status);
    ck_assert_msg(WEXITSTATUS(status) == 10, "the stale write was not refused (A exited %d: 11 landed, 9 error)",
                  WEXITSTATUS(status));

    assert_only_b_wrote(&pg, token_a, "-"); /* the example leaves writer NULL */

    PQfinish(conn);
    dlock_lock_free(l);
    dlock_client_close(c);
    servers_stop(&redis, &pg, dir);
    free(a_token);
    free(go);
}

/* The guide's C block is examples/fence_pg.c's text between its doc:begin
 * and doc:end lines, verbatim: the code shown is the code run above. The
 * source tree is found from this file's name (compiled from the top of
 * the tree) or, run from elsewhere, from $DLOCK_SRCDIR. */
TU_TEST(guide_shows_example_code, 30)
{
    const char *top = getenv("DLOCK_SRCDIR") ? getenv("DLOCK_SRCDIR") : ".";
    char *ex_path = tu_fmt("%s/examples/fence_pg.c", top), *doc_path = tu_fmt("%s/docs/choosing-a-backend.md", top);
    char *ex = tu_read_file(ex_path), *doc = tu_read_file(doc_path);
    ck_assert_msg(ex && doc, "%s or %s not found (set DLOCK_SRCDIR to the source tree)", ex_path, doc_path);
    char *begin = strstr(ex, "/* doc:begin */\n"), *end = strstr(ex, "/* doc:end */");
    ck_assert_msg(begin && end && end > begin, "no doc:begin/doc:end region in %s", ex_path);
    begin += strlen("/* doc:begin */\n");
    *end = '\0';
    char *block = tu_fmt("```c\n%s```\n", begin);
    ck_assert_msg(strstr(doc, block), "%s does not show examples/fence_pg.c's code as it is; its block must be:\n%s",
                  doc_path, block);
    free(block);
    free(ex);
    free(doc);
    free(ex_path);
    free(doc_path);
}

int main(void)
{
    return tu_main("fencing_pg", NULL, NULL);
}
