/* fence_pg.c -- the fencing token used with a real store: a debit of a
 * PostgreSQL row made under a dlock lock, written so that the database
 * itself refuses the write of a holder whose lock has passed on.
 *
 * The row keeps the highest token that wrote it (column `fence`), and the
 * write lands only while no newer token has written:
 *
 *   UPDATE account SET balance = balance - $2, fence = $1
 *    WHERE id = 1 AND fence < $1
 *
 * A holder paused past its lease (a GC pause, a swapped-out VM, a
 * partition) wakes up with an old token: its UPDATE matches 0 rows. This
 * file is the code docs/choosing-a-backend.md shows (the part between the
 * doc:begin and doc:end lines, compared by tests/check_fencing_pg.c, which
 * also runs it against a real PostgreSQL with two holders).
 *
 *   fence_pg DLOCK_URL PG_CONNINFO [AMOUNT]
 *
 * debits AMOUNT (default 10) from account 1 once, under the lock
 * "account-1", and says whether the write landed. The table:
 *
 *   CREATE TABLE account (id int PRIMARY KEY, balance int NOT NULL,
 *                         fence bigint NOT NULL DEFAULT 0);
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "dlock.h"

/* doc:begin */
/* Debit AMOUNT from account 1 with the fencing TOKEN of the hold that
 * makes the write, on connection PG. Returns 1 when the write landed, 0
 * when PostgreSQL refused it (a newer token has written the row: this
 * hold is stale -- stop, do not retry with this token), -1 on an error
 * (message on stderr). */
static int fenced_debit(PGconn *pg, uint64_t token, int amount)
{
    char tok[24], amt[16];
    snprintf(tok, sizeof tok, "%" PRIu64, token);
    snprintf(amt, sizeof amt, "%d", amount);
    const char *params[] = {tok, amt};
    const char *debit = "UPDATE account SET balance = balance - $2::int, fence = $1::bigint "
                        "WHERE id = 1 AND fence < $1::bigint";
    PGresult *res = PQexecParams(pg, debit, 2, NULL, params, NULL, NULL, 0);
    int rc = -1;
    if (PQresultStatus(res) == PGRES_COMMAND_OK)
        rc = atoi(PQcmdTuples(res)) == 1; /* "1" landed, "0" refused */
    else
        fprintf(stderr, "fenced_debit: %s", PQerrorMessage(pg));
    PQclear(res);
    return rc;
}

/* Take lock L (waiting up to 5 s), debit AMOUNT under it, release.
 * Returns what fenced_debit() did, or -1 when the lock was not taken. */
static int debit_under_lock(dlock_lock *l, PGconn *pg, int amount)
{
    int rc = dlock_acquire(l, 5000);
    if (rc != DLOCK_OK) {
        fprintf(stderr, "acquire: %s: %s\n", dlock_err_name(rc), dlock_errmsg());
        return -1;
    }
    uint64_t token;
    dlock_token(l, &token);
    int wrote = fenced_debit(pg, token, amount);
    dlock_release(l);
    return wrote;
}
/* doc:end */

#ifndef FENCE_PG_NO_MAIN
int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s DLOCK_URL PG_CONNINFO [AMOUNT]\n", argv[0]);
        return 2;
    }
    int amount = argc > 3 ? atoi(argv[3]) : 10;
    PGconn *pg = PQconnectdb(argv[2]);
    if (PQstatus(pg) != CONNECTION_OK) {
        fprintf(stderr, "postgresql: %s", PQerrorMessage(pg));
        PQfinish(pg);
        return 1;
    }
    dlock_client *c;
    dlock_lock *l;
    if (dlock_open(argv[1], &c) != DLOCK_OK) {
        fprintf(stderr, "dlock: %s\n", dlock_errmsg());
        PQfinish(pg);
        return 1;
    }
    if (dlock_lock_new(c, "account-1", DLOCK_EXCLUSIVE, 0, &l) != DLOCK_OK) {
        fprintf(stderr, "dlock: %s\n", dlock_errmsg());
        dlock_client_close(c);
        PQfinish(pg);
        return 1;
    }
    int wrote = debit_under_lock(l, pg, amount);
    printf("%s\n", wrote == 1   ? "debited"
                   : wrote == 0 ? "refused: a newer holder has written"
                                : "error");
    dlock_lock_free(l);
    dlock_client_close(c);
    PQfinish(pg);
    return wrote == 1 ? 0 : wrote == 0 ? 3 : 1;
}
#endif
