/* schema.c -- the tables semaphores and elections add beside the locks'
 * sequence and two tables (lock.c makes those at open).
 *
 * They are made on the first use of their primitive, not at open: a
 * database whose owner made the locks' three objects by hand for a role
 * without CREATE keeps working for locks, and only a semaphore or an
 * election asks for more -- refused then with DLOCK_EACCES naming what
 * the owner must make (docs/protocol-postgres.md lists the statements).
 * A client looks once (to_regclass) and remembers what it found.
 */
#include <stdio.h>

#include "pg.h"

/* Look for OBJ's objects on PC, and make them when missing. */
static int ensure_on(struct pg_backend *b, struct pg_conn *pc, const struct pg_objects *obj,
                     int64_t deadline)
{
    char what[200];
    for (int attempt = 0; attempt < 3; attempt++) {
        snprintf(what, sizeof what, "look for the tables of %s", obj->what);
        struct pg_query q = {.sql = obj->look, .what = what, .deadline = deadline};
        PGresult *r = NULL;
        int rc = dlock__pg_exec(b, pc, &q, &r);
        if (rc)
            return rc;
        bool ready = dlock__pq.ntuples(r) == 1 && dlock__pq.getvalue(r, 0, 0)[0] == 't';
        dlock__pq.clear(r);
        if (ready)
            return DLOCK_OK;
        snprintf(what, sizeof what, "create %s", obj->names);
        struct pg_query mq = {.sql = obj->create, .what = what, .deadline = deadline};
        rc = dlock__pg_exec(b, pc, &mq, &r);
        if (!rc) {
            dlock__pq.clear(r);
            return DLOCK_OK;
        }
        if (rc == DLOCK_EACCES)
            return dlock__err(DLOCK_EACCES,
                              "%s: cannot create %s, which %s need (no CREATE privilege on the "
                              "schema): have the owner run the statements of "
                              "docs/protocol-postgres.md once",
                              b->label, obj->names, obj->what);
        if (rc != DLOCK_EBACKEND) /* EBACKEND: another client made them at once: look again */
            return rc;
    }
    return dlock__err(DLOCK_EBACKEND, "%s: could not create %s", b->label, obj->names);
}

int dlock__pg_ensure(struct pg_backend *b, const struct pg_objects *obj, int *ready)
{
    if (__atomic_load_n(ready, __ATOMIC_ACQUIRE))
        return DLOCK_OK;
    int64_t deadline = dlock__time_budget(DLOCK__NEVER, b->c->opts.op_timeout_ms);
    struct pg_conn *pc = NULL;
    int rc = dlock__pg_session(b, NULL, deadline, &pc);
    if (!rc)
        rc = ensure_on(b, pc, obj, deadline);
    dlock__pg_session_put(b, pc);
    if (!rc)
        __atomic_store_n(ready, 1, __ATOMIC_RELEASE);
    return rc;
}
