/* bench_handles.c -- the handles of the `dlock bench` baselines that
 * measure dlock itself on another URL (cli/bench_redlock.c: the first
 * node alone; cli/bench_cluster.c: every name on one master).
 *
 * The dlock side of the benchmark keeps one handle per name; so does such
 * a baseline, so that the two sides differ only in what the baseline is
 * there to show. A thread's handles live in a fixed open-addressing table
 * (FNV-1a of the name), made on first use and freed at disconnect.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "dlock.h"

/* The handle of NAME (SUFFIX appended to it for the lock's name), made
 * through C on first use; NULL when the table is full. */
static dlock_lock *handle_of(struct dlock_bench_handles *t, dlock_client *c, const char *name,
                             const char *suffix)
{
    unsigned h = 2166136261u;
    for (const char *p = name; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    for (size_t i = 0; i < DLOCK_BENCH_HANDLES; i++) {
        size_t k = (h + i) % DLOCK_BENCH_HANDLES;
        if (t->names[k] && strcmp(t->names[k], name) == 0)
            return t->locks[k];
        if (!t->names[k]) {
            char full[128];
            snprintf(full, sizeof full, "%s%s", name, suffix);
            if (dlock_lock_new(c, full, DLOCK_EXCLUSIVE, 0, &t->locks[k]))
                return NULL;
            t->names[k] = strdup(name);
            return t->locks[k];
        }
    }
    return NULL;
}

int dlock_bench_handles_lock_unlock(struct dlock_bench_handles *t, dlock_client *c,
                                    const char *name, const char *suffix)
{
    dlock_lock *l = handle_of(t, c, name, suffix);
    if (!l)
        return -1;
    int rc = dlock_acquire(l, DLOCK_TRY);
    if (rc == DLOCK_EBUSY)
        return 1;
    if (rc)
        return -1;
    return dlock_release(l) ? -1 : 0;
}

void dlock_bench_handles_free(struct dlock_bench_handles *t)
{
    for (size_t i = 0; i < DLOCK_BENCH_HANDLES; i++) {
        dlock_lock_free(t->locks[i]);
        free(t->names[i]);
        t->locks[i] = NULL;
        t->names[i] = NULL;
    }
}
