/* internal.h -- core-private structures: what backends never touch.
 * (Backends see src/core.h only.) */
#ifndef DLOCK_INTERNAL_H
#define DLOCK_INTERNAL_H

#include "core.h"

/* One name of one client: the holds of its threads, and, for backends
 * whose server sees one owner per client (DLOCK__CAP_CLIENT_OWNER), the
 * local queue that lets one thread at a time go to the server. */
struct dlock__entry {
    char *name;
    unsigned refs;            /* handles + acquires in flight */
    struct dlock__hold *holds;
    bool busy;                /* CLIENT_OWNER: a thread holds or is acquiring */
    struct dlock__waitref *local_waiters;
    struct dlock__entry *next; /* hash chain */
};

struct dlock__waitref {
    struct dlock__wait *w;
    struct dlock__waitref *next;
};

struct dlock_lock {
    dlock_client *c;
    struct dlock__entry *e;
    dlock_mode mode;
    int64_t lease_ms; /* 0 = the client's */
    bool fixed_lease;
    dlock_lost_fn lost_fn;
    void *lost_arg;
    struct dlock__waitref *waits; /* acquires in progress, for cancel */
    unsigned cb_running;          /* lost callbacks in flight (keeper) */
};

/* Extra per-hold bookkeeping the core keeps next to the backend's view. */
#define DLOCK__BUCKETS 1024

void dlock__wait_init(struct dlock__wait *w, int64_t deadline);
void dlock__wait_destroy(struct dlock__wait *w);
void dlock__wait_cancel(struct dlock__wait *w);

unsigned dlock__hash(const char *s);
/* Release every hold of C (closing). */
void dlock__release_all(dlock_client *c);

#endif
