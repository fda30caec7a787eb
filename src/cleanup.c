/* cleanup.c -- the queue of work a backend owes after an ambiguous reply.
 *
 * A create whose reply was lost may have left a key or node on the server;
 * a delete that timed out may not have happened. The backend cannot wait
 * for the server to come back in the caller's thread, and must not forget
 * it either: it queues the work here (dlock__cleanup_add, see toolbox.h) and
 * the keeper does it between renewals, in bounded slices, retrying with
 * backoff; closing the client tries what is left once more, within what
 * is left of close's one op timeout (dlock__close_deadline). One queue per
 * client, FIFO, under the client's mutex; the work itself runs without it.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct dlock__cleanup {
    char *what;
    dlock__cleanup_fn fn;
    void *arg;
    void (*free_arg)(void *);
    struct dlock__backoff backoff;
    int64_t next_at; /* monotonic ms: not before */
    struct dlock__cleanup *next;
};

static void item_free(struct dlock__cleanup *it)
{
    if (it->free_arg)
        it->free_arg(it->arg);
    free(it->what);
    free(it);
}

/* Append IT to the queue (mutex held). */
static void item_append(dlock_client *c, struct dlock__cleanup *it)
{
    it->next = NULL;
    if (c->cleanup_tail)
        c->cleanup_tail->next = it;
    else
        c->cleanup_head = it;
    c->cleanup_tail = it;
}

int dlock__cleanup_add(struct dlock_client *c, const char *what, dlock__cleanup_fn fn, void *arg,
                       void (*free_arg)(void *))
{
    struct dlock__cleanup *it = calloc(1, sizeof *it);
    if (!it || !(it->what = strdup(what ? what : "cleanup"))) {
        free(it);
        if (free_arg)
            free_arg(arg);
        return dlock__err(DLOCK_ENOMEM, "out of memory queueing a cleanup (%s)",
                          what ? what : "cleanup");
    }
    it->fn = fn;
    it->arg = arg;
    it->free_arg = free_arg;
    it->backoff = (struct dlock__backoff){.min_ms = 10, .max_ms = c->opts.op_timeout_ms};
    it->next_at = dlock__now_ms();
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    pthread_mutex_lock(&c->mu);
    item_append(c, it);
    /* Without a keeper (it failed to start) the work waits for close. */
    if (dlock__keeper_start(c) == DLOCK_OK)
        pthread_cond_signal(&c->keeper_cv);
    pthread_mutex_unlock(&c->mu);
    dlock__errmsg_restore(DLOCK_OK, msg);
    return DLOCK_OK;
}

bool dlock__cleanup_run(dlock_client *c, int64_t deadline)
{
    size_t n = 0;
    for (struct dlock__cleanup *it = c->cleanup_head; it; it = it->next)
        n++;
    bool ran = false;
    /* Each piece at most once per slice: a failure goes to the back. */
    while (n-- > 0 && dlock__now_ms() < deadline) {
        int64_t now = dlock__now_ms();
        struct dlock__cleanup **p = &c->cleanup_head, *it;
        while ((it = *p) && it->next_at > now)
            p = &it->next;
        if (!it)
            break;
        *p = it->next;
        if (c->cleanup_tail == it) {
            c->cleanup_tail = NULL;
            for (struct dlock__cleanup *x = c->cleanup_head; x; x = x->next)
                c->cleanup_tail = x;
        }
        pthread_mutex_unlock(&c->mu);
        int rc = it->fn(c->bstate, it->arg, deadline);
        pthread_mutex_lock(&c->mu);
        ran = true;
        if (rc == DLOCK_OK) {
            pthread_mutex_unlock(&c->mu);
            item_free(it);
            pthread_mutex_lock(&c->mu);
        } else {
            it->next_at = dlock__now_ms() + dlock__backoff_next(&it->backoff);
            item_append(c, it);
        }
    }
    return ran;
}

int64_t dlock__cleanup_next(const dlock_client *c)
{
    int64_t next = DLOCK__NEVER;
    for (const struct dlock__cleanup *it = c->cleanup_head; it; it = it->next)
        if (it->next_at < next)
            next = it->next_at;
    return next;
}

void dlock__cleanup_close(dlock_client *c, bool run, int64_t deadline)
{
    /* dlock__cleanup_add appends under the mutex; a child after fork
     * (RUN false) must not take it: another thread may have held it. */
    if (run)
        pthread_mutex_lock(&c->mu);
    struct dlock__cleanup *it = c->cleanup_head;
    c->cleanup_head = c->cleanup_tail = NULL;
    if (run)
        pthread_mutex_unlock(&c->mu);
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    while (it) {
        struct dlock__cleanup *next = it->next;
        if (run && c->bstate && dlock__now_ms() < deadline)
            it->fn(c->bstate, it->arg, deadline);
        item_free(it);
        it = next;
    }
    dlock__errmsg_restore(DLOCK_OK, msg);
}
