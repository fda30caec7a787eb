/* semaphore.c -- counting semaphores, built on the lock machinery.
 *
 * A permit is a hold. Each dlock_permit owns a private handle-owned lock
 * handle on the semaphore's name, and that handle's one hold carries a
 * struct dlock__sem_req (K of the semaphore's N permits). So the
 * registry, the keeper's batched renewals, validity, the drift margin,
 * cancel objects and the lost callback (through the handle's lost_fn)
 * serve permits with no code of their own; the dispatch (dispatch.c)
 * calls the backend's semaphore ops for such holds, and the core's
 * acquire and release (lock.c, release.c) keep them out of the per-client local queue (each
 * permit is its own owner, so N of them may be held by one client at
 * once, as N clients would).
 *
 * The semaphore handle keeps what applies to its future permits (lease,
 * lost callback), a plain handle on the name (so the name's registry
 * entry lives as long as the semaphore does), and the list of its permits
 * being acquired or held: dlock_semaphore_cancel() reaches the waits of
 * the first, dlock_semaphore_free() releases the second.
 *
 * The asynchronous acquire (at the end) is the same permit's handle
 * acquired through async.c with a continuation, inside a job whose
 * completion hands the permit to the loop: so a permit's wait parks
 * wherever the backend gives its semaphore ops try_armed() (backend.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

struct dlock_semaphore {
    dlock_client *c;
    dlock_lock *base; /* keeps the name's registry entry */
    unsigned permits;
    int64_t lease_ms; /* 0 = the client's */
    bool fixed_lease;
    struct dlock__user_lost lost; /* dlock_permit_lost_fn */
    struct dlock_permit *head; /* acquiring or held (client mutex) */
    struct permit_call *calls; /* asynchronous calls until their callbacks (client mutex) */
};

struct dlock_permit {
    dlock_semaphore *s;
    dlock_lock *l; /* a permits handle (make_permits_handle): its one hold */
    char id[sizeof ((struct dlock__hold *)0)->owner];
    struct dlock_permit *next;
};

static bool has_semaphores(const dlock_client *c)
{
    const struct dlock__sem_ops *ops = c->be->semaphores;
    return ops && ops->acquire && ops->release && ops->inspect;
}

static int no_semaphores(const dlock_client *c, const char *name)
{
    if (c->be->no_semaphores_why)
        return dlock__err(DLOCK_ENOTSUP, "semaphore '%s': the %s backend has no semaphores: %s",
                          name, c->be->name, c->be->no_semaphores_why);
    return dlock__err(DLOCK_ENOTSUP, "semaphore '%s': the %s backend has no semaphores yet", name,
                      c->be->name);
}

/* A handle-owned lock handle on NAME whose hold is K of the semaphore's
 * PERMITS permits (the dispatch calls the backend's semaphore ops for it), after
 * CHECK (NULL: none) with FLAGS. */
static int make_permits_handle(dlock_client *c, const char *name, unsigned permits, unsigned k,
                               dlock__kind_check_fn check, unsigned flags, dlock_lock **out)
{
    int rc = dlock__handle_new(c, name, DLOCK_LOCK_HANDLE_OWNED, check, permits, flags, out);
    if (rc)
        return rc;
    (*out)->sem_req.permits = permits;
    (*out)->sem_req.k = k;
    (*out)->sem = &(*out)->sem_req;
    return DLOCK_OK;
}

/* The checks inspecting makes after the lock handle's (client, name): the
 * count (0: any) and the backend. */
static int check_inspected(const dlock_client *c, const char *name, unsigned permits,
                           unsigned flags)
{
    (void)flags;
    if (permits > DLOCK_PERMITS_MAX)
        return dlock__err(DLOCK_EINVAL, "semaphore '%s': %u permits (1 to %d)", name, permits,
                          DLOCK_PERMITS_MAX);
    return has_semaphores(c) ? DLOCK_OK : no_semaphores(c, name);
}

/* The checks every semaphore constructor makes after the lock handle's
 * (client, name): flags, the count, the backend. */
static int check_semaphore(const dlock_client *c, const char *name, unsigned permits, unsigned flags)
{
    if (flags)
        return dlock__err(DLOCK_EINVAL, "semaphore '%s': unknown flags 0x%x (reserved, must be 0)",
                          name, flags);
    if (permits < 1)
        return dlock__err(DLOCK_EINVAL, "semaphore '%s': %u permits (1 to %d)", name, permits,
                          DLOCK_PERMITS_MAX);
    return check_inspected(c, name, permits, flags);
}

int dlock_lock_new_permits(dlock_client *c, const char *name, unsigned permits, unsigned flags,
                           dlock_lock **out)
{
    dlock__msg_clear();
    if (!out)
        return dlock__err(DLOCK_EINVAL, "dlock_lock_new_permits: out is NULL");
    *out = NULL;
    return make_permits_handle(c, name, permits, 1, check_semaphore, flags, out);
}

int dlock_semaphore_new(dlock_client *c, const char *name, unsigned permits, unsigned flags,
                        dlock_semaphore **out)
{
    dlock__msg_clear();
    if (!out)
        return dlock__err(DLOCK_EINVAL, "dlock_semaphore_new: out is NULL");
    *out = NULL;
    /* The client and name checks of a lock handle, and the entry. */
    struct dlock__handle_request rq = {.name = name,
                                       .check = check_semaphore,
                                       .count = permits,
                                       .flags = flags,
                                       .size = sizeof(dlock_semaphore)};
    dlock_semaphore *s = dlock__handle_wrap(c, &rq);
    if (!s)
        return rq.out.rc;
    s->c = c;
    s->base = rq.out.base;
    s->permits = permits;
    *out = s;
    return DLOCK_OK;
}

int dlock_semaphore_set_lease(dlock_semaphore *s, int64_t lease_ms, unsigned flags)
{
    if (!s) {
        dlock__msg_clear();
        return dlock__err(DLOCK_EINVAL, "semaphore is NULL");
    }
    /* The base handle checks (and keeps) it; permits copy it. */
    int rc = dlock_lock_set_lease(s->base, lease_ms, flags);
    if (!rc) {
        pthread_mutex_lock(&s->c->mu);
        s->lease_ms = s->base->lease_ms;
        s->fixed_lease = s->base->fixed_lease;
        pthread_mutex_unlock(&s->c->mu);
    }
    return rc;
}

int dlock_semaphore_on_lost(dlock_semaphore *s, dlock_permit_lost_fn fn, void *arg)
{
    return dlock__user_lost_set(s ? s->c : NULL, s ? &s->lost : NULL, "semaphore",
                                (void (*)(void))fn, arg);
}

const char *dlock_semaphore_name(const dlock_semaphore *s)
{
    return s ? dlock_lock_name(s->base) : NULL;
}

unsigned dlock_semaphore_permits(const dlock_semaphore *s)
{
    return s ? s->permits : 0;
}

/* The permit handle's lost callback: the semaphore's, with the permit. */
static void permit_lost(dlock_lock *l, const char *why, void *arg)
{
    (void)l;
    dlock_permit *p = arg;
    dlock_semaphore *s = p->s;
    struct dlock__user_lost u = dlock__user_lost_get(s->c, &s->lost);
    if (u.fn)
        ((dlock_permit_lost_fn)u.fn)(s, p, why, u.arg);
}

/* Take P off its semaphore's list (client mutex held). */
static void permit_unlink(dlock_permit *p)
{
    dlock_permit **q = &p->s->head;
    while (*q && *q != p)
        q = &(*q)->next;
    if (*q)
        *q = p->next;
}

/* Unlink and free P and its handle (its hold already ended). */
static void permit_free(dlock_permit *p)
{
    dlock_client *c = p->s->c;
    bool ours = !dlock__forked(c);
    if (ours)
        pthread_mutex_lock(&c->mu);
    permit_unlink(p);
    if (ours)
        pthread_mutex_unlock(&c->mu);
    dlock_lock_free(p->l);
    free(p);
}

/* The lock words of a contention outcome, said of a semaphore. */
static int acquire_outcome(dlock_semaphore *s, unsigned k, int rc, int64_t wait_ms)
{
    const char *name = dlock_lock_name(s->base);
    char why[DLOCK__MSG_MAX];
    dlock__errmsg_save(why);
    if (rc == DLOCK_EBUSY)
        return dlock__err(rc, "semaphore '%s': fewer than %u of its %u permits are free", name, k,
                          s->permits);
    if (rc == DLOCK_ETIMEDOUT)
        return dlock__err(rc, "semaphore '%s': %u of its %u permits not free within %lld ms (%s)",
                          name, k, s->permits, (long long)wait_ms, why);
    if (rc == DLOCK_ECANCELED)
        return dlock__err(rc, "semaphore '%s': wait canceled", name);
    return dlock__errmsg_restore(rc, why);
}

/* The checks of an acquire of K permits of S (S not NULL), and a new
 * permit object for it on S's list into *OUT (its handle not acquiring
 * yet). */
static int permit_new(dlock_semaphore *s, unsigned k, dlock_permit **out)
{
    dlock_client *c = s->c;
    const char *name = dlock_lock_name(s->base);
    int rc = dlock__check_client(c);
    if (rc)
        return rc;
    if (k < 1 || k > s->permits)
        return dlock__err(DLOCK_EINVAL, "semaphore '%s': cannot take %u of its %u permits", name,
                          k, s->permits);
    dlock_permit *p = calloc(1, sizeof *p);
    if (!p)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    p->s = s;
    if ((rc = make_permits_handle(c, name, s->permits, k, NULL, 0, &p->l))) {
        free(p);
        return rc;
    }
    pthread_mutex_lock(&c->mu);
    p->l->lease_ms = s->lease_ms;
    p->l->fixed_lease = s->fixed_lease;
    p->l->lost_fn = permit_lost;
    p->l->lost_arg = p;
    p->next = s->head;
    s->head = p;
    pthread_mutex_unlock(&c->mu);
    *out = p;
    return DLOCK_OK;
}

/* P's acquire (WAIT_MS) ended with RC: DLOCK_OK with its id read, or
 * the failure in the semaphore's words with P freed. */
static int permit_acquired(dlock_permit *p, int rc, int64_t wait_ms)
{
    if (rc) {
        rc = acquire_outcome(p->s, p->l->sem_req.k, rc, wait_ms);
        char msg[DLOCK__MSG_MAX];
        dlock__errmsg_save(msg);
        permit_free(p);
        return dlock__errmsg_restore(rc, msg);
    }
    dlock_client *c = p->s->c;
    pthread_mutex_lock(&c->mu);
    for (struct dlock__hold *h = p->l->e->holds; h; h = h->next)
        if (h->tid == p->l->owner)
            memcpy(p->id, h->owner, sizeof p->id);
    pthread_mutex_unlock(&c->mu);
    return DLOCK_OK;
}

int dlock_semaphore_acquire(dlock_semaphore *s, unsigned k, int64_t wait_ms, dlock_cancel *cancel,
                            dlock_permit **out)
{
    dlock__msg_clear();
    if (!out)
        return dlock__err(DLOCK_EINVAL, "dlock_semaphore_acquire: out is NULL");
    *out = NULL;
    if (!s)
        return dlock__err(DLOCK_EINVAL, "semaphore is NULL");
    dlock_permit *p;
    int rc = permit_new(s, k, &p);
    if (rc)
        return rc;
    rc = permit_acquired(p, dlock_acquire_ex(p->l, wait_ms, cancel), wait_ms);
    if (!rc)
        *out = p;
    return rc;
}

int dlock_semaphore_cancel(dlock_semaphore *s)
{
    dlock__msg_clear();
    if (!s)
        return dlock__err(DLOCK_EINVAL, "semaphore is NULL");
    int rc = dlock__check_fork(s->c);
    if (rc)
        return rc;
    pthread_mutex_lock(&s->c->mu);
    for (dlock_permit *p = s->head; p; p = p->next)
        dlock__lock_cancel_waits(p->l);
    pthread_mutex_unlock(&s->c->mu);
    return DLOCK_OK;
}

int dlock_permit_release(dlock_permit *p)
{
    dlock__msg_clear();
    if (!p)
        return dlock__err(DLOCK_EINVAL, "permit is NULL");
    const char *name = dlock_lock_name(p->s->base);
    int rc = dlock_release(p->l);
    char msg[DLOCK__MSG_MAX];
    if (rc == DLOCK_ELOST) {
        /* "lock 'NAME' was lost before this release: WHY" */
        const char *was = strstr(dlock_errmsg(), " was lost");
        rc = dlock__err(rc, "semaphore '%s': permit %s%s", name, p->id, was ? was : " was lost");
    } else if (rc) {
        dlock__errmsg_save(msg);
        rc = dlock__err(rc, "semaphore '%s': releasing permit %s: %s", name, p->id, msg);
    }
    dlock__errmsg_save(msg);
    permit_free(p);
    return dlock__errmsg_restore(rc, msg);
}

unsigned dlock_permit_count(const dlock_permit *p)
{
    return p ? p->l->sem_req.k : 0;
}

const char *dlock_permit_id(const dlock_permit *p)
{
    return p ? p->id : NULL;
}

int dlock_permit_token(dlock_permit *p, uint64_t *token)
{
    if (!p || !token) {
        dlock__msg_clear();
        return dlock__err(DLOCK_EINVAL, "dlock_permit_token: NULL argument");
    }
    return dlock_token(p->l, token);
}

int64_t dlock_permit_validity_ms(dlock_permit *p)
{
    if (!p) {
        dlock__msg_clear();
        return dlock__err(DLOCK_EINVAL, "permit is NULL");
    }
    return dlock_validity_ms(p->l);
}

static void calls_forget(dlock_semaphore *s);

void dlock_semaphore_free(dlock_semaphore *s)
{
    if (!s)
        return;
    dlock_client *c = s->c;
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg); /* freeing leaves the message alone */
    bool ours = !dlock__forked(c);
    if (ours) /* its calls in flight end first, as a lock handle's do */
        calls_forget(s);
    for (;;) {
        if (ours)
            pthread_mutex_lock(&c->mu);
        dlock_permit *p = s->head;
        if (ours)
            pthread_mutex_unlock(&c->mu);
        if (!p)
            break;
        if (ours && !c->closed)
            (void)dlock_release(p->l); /* best effort; also a lost one */
        permit_free(p);
    }
    dlock_lock_free(s->base);
    free(s);
    dlock__errmsg_restore(DLOCK_OK, msg);
}

/* ------------------------------------------------------ asynchronous calls */

/* One asynchronous call on a semaphore: a job on the client's pool. */
struct permit_call {
    struct dlock__job job;
    dlock_semaphore *s;
    dlock_permit *p; /* acquired (the acquire's DLOCK_OK), or to release */
    dlock_permit_done_fn done;
    void *arg;
    int64_t wait_ms;
    dlock_cancel *cancel;
    struct permit_call *next; /* on s->calls */
};

/* The permit handle's acquire ended (its continuation, a pool thread). */
static void permit_taken(dlock_lock *l, int rc, void *arg)
{
    (void)l;
    struct permit_call *pc = arg;
    if ((rc = permit_acquired(pc->p, rc, pc->wait_ms)))
        pc->p = NULL; /* freed */
    dlock__job_end(&pc->job, rc);
}

static int acquire_run(struct dlock__job *j)
{
    struct permit_call *pc = (struct permit_call *)j;
    int rc = dlock__acquire_then(pc->p->l, pc->wait_ms, pc->cancel, permit_taken, pc);
    if (!rc)
        return DLOCK__LATER;
    rc = permit_acquired(pc->p, rc, pc->wait_ms);
    pc->p = NULL;
    return rc;
}

static int release_run(struct dlock__job *j)
{
    struct permit_call *pc = (struct permit_call *)j;
    int rc = dlock_permit_release(pc->p);
    pc->p = NULL; /* freed, whatever the outcome */
    return rc;
}

/* Take PC off its semaphore's calls (no-op when absent). */
static void call_unlink(struct permit_call *pc)
{
    dlock_client *c = pc->s->c;
    pthread_mutex_lock(&c->mu);
    struct permit_call **q = &pc->s->calls;
    while (*q && *q != pc)
        q = &(*q)->next;
    if (*q)
        *q = pc->next;
    pthread_mutex_unlock(&c->mu);
}

static void call_deliver(struct dlock__job *j, int rc)
{
    struct permit_call *pc = (struct permit_call *)j;
    struct permit_call copy = *pc;
    if (j->forgotten) /* the semaphore was freed, its permits with it */
        copy.s = NULL, copy.p = NULL;
    else
        call_unlink(pc);
    free(pc); /* before the callback, which may start the next call */
    copy.done(copy.s, copy.p, rc, copy.arg);
}

/* S is being freed: each call in flight is canceled and ended, and its
 * completion comes with a NULL semaphore and permit (dlock__job_forget). */
static void calls_forget(dlock_semaphore *s)
{
    char what[DLOCK__MSG_MAX];
    snprintf(what, sizeof what, "semaphore '%s'", dlock_lock_name(s->base));
    for (;;) {
        pthread_mutex_lock(&s->c->mu);
        struct permit_call *pc = s->calls;
        if (pc)
            s->calls = pc->next;
        pthread_mutex_unlock(&s->c->mu);
        if (!pc)
            break;
        dlock__job_forget(s->c, &pc->job, what);
    }
}

/* Start PC (its run set) on S's client; frees PC when it does not start. */
static int call_start(dlock_semaphore *s, struct permit_call *pc, const char *fn)
{
    pc->s = s;
    pc->job.deliver = call_deliver;
    pthread_mutex_lock(&s->c->mu);
    pc->next = s->calls;
    s->calls = pc;
    pthread_mutex_unlock(&s->c->mu);
    int rc = dlock__job_start(s->c, &pc->job);
    if (rc) {
        call_unlink(pc);
        free(pc);
        char why[DLOCK__MSG_MAX];
        dlock__errmsg_save(why);
        return dlock__err(rc, "%s: %s", fn, why);
    }
    return DLOCK_OK;
}

int dlock_semaphore_acquire_async(dlock_semaphore *s, unsigned k, int64_t wait_ms,
                                  dlock_cancel *cancel, dlock_permit_done_fn done, void *arg)
{
    dlock__msg_clear();
    if (!s || !done)
        return dlock__err(DLOCK_EINVAL, "dlock_semaphore_acquire_async: NULL argument");
    const char *name = dlock_lock_name(s->base);
    char what[DLOCK__MSG_MAX];
    snprintf(what, sizeof what, "semaphore '%s'", name);
    struct permit_call *pc = calloc(1, sizeof *pc);
    if (!pc)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    int rc = permit_new(s, k, &pc->p);
    if (!rc && !(rc = dlock__async_can_wait(pc->p->l, wait_ms, what)) && dlock_cancel_fired(cancel))
        rc = dlock__err(DLOCK_ECANCELED, "%s: canceled before the acquire began", what);
    if (rc) {
        if (pc->p)
            permit_free(pc->p);
        free(pc);
        return rc;
    }
    dlock_permit *p = pc->p;
    pthread_mutex_lock(&s->c->mu);
    dlock__lock_job_ahead(p->l); /* dlock_semaphore_cancel() from now on ends it */
    pthread_mutex_unlock(&s->c->mu);
    pc->job.run = acquire_run;
    pc->done = done;
    pc->arg = arg;
    pc->wait_ms = wait_ms;
    pc->cancel = cancel;
    if ((rc = call_start(s, pc, "dlock_semaphore_acquire_async"))) {
        char msg[DLOCK__MSG_MAX];
        dlock__errmsg_save(msg);
        permit_free(p);
        dlock__errmsg_restore(rc, msg);
    }
    return rc;
}

int dlock_permit_release_async(dlock_permit *p, dlock_permit_done_fn done, void *arg)
{
    dlock__msg_clear();
    if (!p || !done)
        return dlock__err(DLOCK_EINVAL, "dlock_permit_release_async: NULL argument");
    int rc = dlock__check_client(p->s->c);
    if (rc)
        return rc;
    struct permit_call *pc = calloc(1, sizeof *pc);
    if (!pc)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    pc->job.run = release_run;
    pc->p = p;
    pc->done = done;
    pc->arg = arg;
    return call_start(p->s, pc, "dlock_permit_release_async");
}

/* ------------------------------------------------------------ inspecting */

int dlock_semaphore_inspect(dlock_client *c, const char *name, unsigned permits, dlock_info **out)
{
    dlock__msg_clear();
    if (!out || !name)
        return dlock__err(DLOCK_EINVAL, "dlock_semaphore_inspect: NULL argument");
    *out = NULL;
    int rc = dlock__handle_probe(c, name, check_inspected, permits, 0);
    if (rc)
        return rc;
    dlock_info *i = NULL;
    if ((rc = dlock__info_new(&i)))
        return rc;
    return dlock__info_give(i, c->be->semaphores->inspect(c->bstate, name, permits, i), out);
}

unsigned dlock_info_permits(const dlock_info *i)
{
    return i ? i->permits : 0;
}

long dlock_info_free_permits(const dlock_info *i)
{
    return i && i->permits ? i->free_permits : -1;
}
