/* callbacks.c -- the thread that runs lost callbacks, one per client,
 * started with the first callback.
 *
 * The keeper only queues a callback when it declares a hold lost; this
 * thread runs them one after another. So a callback that blocks delays
 * other callbacks, never a renewal, and one that frees another handle of
 * the same batch finds that handle's call still queued and drops it
 * instead of waiting for a keeper that waits for it. dlock_lock_free()
 * waits for a running callback of its handle, unless it is called from
 * that very callback (see dlock_lock_on_lost() in dlock.h). The queue and
 * the thread's state live under the client's mutex.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct dlock__lost_call {
    dlock_lost_fn fn;
    dlock_lock *l;
    void *arg;
    char *why;
    struct dlock__lost_call *next;
};

static void *callbacks_main(void *arg)
{
    dlock_client *c = arg;
    struct dlock__callbacks *cb = &c->cb;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        struct dlock__lost_call *call = cb->head;
        if (!call) {
            if (cb->stop)
                break;
            pthread_cond_wait(&cb->cv, &c->mu);
            continue;
        }
        cb->head = call->next;
        if (!cb->head)
            cb->tail = NULL;
        cb->current = call->l;
        pthread_mutex_unlock(&c->mu);
        call->fn(call->l, call->why, call->arg);
        /* The handle may be gone now (the callback freed it): never
         * touch call->l again. */
        free(call->why);
        free(call);
        pthread_mutex_lock(&c->mu);
        cb->current = NULL;
        pthread_cond_broadcast(&cb->cv);
    }
    cb->running = false; /* our id may be reused once we are gone */
    pthread_mutex_unlock(&c->mu);
    dlock__client_unref(c); /* may be the last: a callback closed the client */
    return NULL;
}

int dlock__callback_queue(dlock_client *c, dlock_lock *l, const char *why)
{
    struct dlock__callbacks *cb = &c->cb;
    struct dlock__lost_call *call = calloc(1, sizeof *call);
    if (!call || !(call->why = strdup(why && *why ? why : "no reason given"))) {
        free(call);
        return DLOCK_ENOMEM;
    }
    if (!cb->running) {
        cb->stop = false;
        dlock__client_ref(c); /* the thread's, dropped as it ends */
        if (pthread_create(&cb->thread, NULL, callbacks_main, c)) {
            __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL); /* never the last */
            free(call->why);
            free(call);
            return DLOCK_ENOMEM;
        }
        cb->running = true;
    }
    call->fn = l->lost_fn;
    call->l = l;
    call->arg = l->lost_arg;
    if (cb->tail)
        cb->tail->next = call;
    else
        cb->head = call;
    cb->tail = call;
    pthread_cond_broadcast(&cb->cv);
    return DLOCK_OK;
}

bool dlock__callback_thread(const dlock_client *c)
{
    return c->cb.running && pthread_equal(pthread_self(), c->cb.thread);
}

void dlock__callback_forget(dlock_client *c, dlock_lock *l)
{
    struct dlock__callbacks *cb = &c->cb;
    struct dlock__lost_call **p = &cb->head, *call;
    cb->tail = NULL;
    while ((call = *p)) {
        if (call->l == l) {
            *p = call->next;
            free(call->why);
            free(call);
        } else {
            cb->tail = call;
            p = &call->next;
        }
    }
    if (dlock__callback_thread(c))
        return; /* from a callback: it may be L's own, which cannot end first */
    while (cb->current == l)
        pthread_cond_wait(&cb->cv, &c->mu);
}

void dlock__callbacks_stop(dlock_client *c)
{
    struct dlock__callbacks *cb = &c->cb;
    pthread_mutex_lock(&c->mu);
    bool running = cb->running, self = dlock__callback_thread(c);
    cb->stop = true;
    pthread_cond_broadcast(&cb->cv);
    pthread_mutex_unlock(&c->mu);
    if (running && self) {
        pthread_detach(cb->thread);
        return;
    }
    if (running)
        pthread_join(cb->thread, NULL);
    cb->running = false;
}

int dlock__user_lost_set(dlock_client *c, struct dlock__user_lost *u, const char *what,
                         void (*fn)(void), void *arg)
{
    dlock__msg_clear();
    if (!u)
        return dlock__err(DLOCK_EINVAL, "%s is NULL", what);
    int rc = dlock__check_fork(c);
    if (rc)
        return rc;
    pthread_mutex_lock(&c->mu);
    u->fn = fn;
    u->arg = arg;
    pthread_mutex_unlock(&c->mu);
    return DLOCK_OK;
}

struct dlock__user_lost dlock__user_lost_get(dlock_client *c, const struct dlock__user_lost *u)
{
    pthread_mutex_lock(&c->mu);
    struct dlock__user_lost copy = *u;
    pthread_mutex_unlock(&c->mu);
    return copy;
}
