/* waitset.c -- the one registry of waiters: waits in arrival order, woken
 * one at a time (the longest waiting first) or all at once.
 *
 * Every place that keeps waiters (the core's local queue of one client's
 * threads per name, a backend's waiters per name or per watch) keeps them
 * here, so first come is first served everywhere and a wake handed to a
 * waiter that is leaving is passed on instead of lost (see toolbox.h). A
 * waiter may carry a key (what it waits for: ZooKeeper's predecessor
 * node), so that the event of that key wakes it alone. The
 * set is a small array: a name rarely has more than a few local waiters,
 * and removing from the middle is a shift.
 */
#include <stdlib.h>
#include <string.h>

#include "toolbox.h"

/* W's slot in WS, NULL when absent (ws->mu held). */
static struct dlock__waitset_slot *slot_of(struct dlock__waitset *ws, const struct dlock__wait *w)
{
    for (size_t i = 0; i < ws->n; i++)
        if (ws->v[i].w == w)
            return &ws->v[i];
    return NULL;
}

void dlock__waitset_init(struct dlock__waitset *ws)
{
    memset(ws, 0, sizeof *ws);
    pthread_mutex_init(&ws->mu, NULL);
}

void dlock__waitset_destroy(struct dlock__waitset *ws)
{
    free(ws->v);
    ws->v = NULL;
    ws->n = ws->cap = 0;
    pthread_mutex_destroy(&ws->mu);
}

int dlock__waitset_add(struct dlock__waitset *ws, struct dlock__wait *w)
{
    pthread_mutex_lock(&ws->mu);
    if (ws->n == ws->cap) {
        size_t cap = ws->cap ? ws->cap * 2 : 4;
        struct dlock__waitset_slot *v = realloc(ws->v, cap * sizeof *v);
        if (!v) {
            pthread_mutex_unlock(&ws->mu);
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        }
        ws->v = v;
        ws->cap = cap;
    }
    ws->v[ws->n++] = (struct dlock__waitset_slot){w, false, NULL};
    pthread_mutex_unlock(&ws->mu);
    return DLOCK_OK;
}

/* W's mark (false when absent), cleared; LEAVE also takes W out. */
static bool take_mark(struct dlock__waitset *ws, struct dlock__wait *w, bool leave)
{
    bool woken = false;
    pthread_mutex_lock(&ws->mu);
    struct dlock__waitset_slot *sl = slot_of(ws, w);
    if (sl) {
        woken = sl->woken;
        sl->woken = false;
        if (leave) {
            memmove(sl, sl + 1, (size_t)(ws->v + ws->n - sl - 1) * sizeof *sl);
            ws->n--;
        }
    }
    pthread_mutex_unlock(&ws->mu);
    return woken;
}

bool dlock__waitset_remove(struct dlock__waitset *ws, struct dlock__wait *w)
{
    return take_mark(ws, w, true);
}

/* Wake and mark the first wait holding no wake from slot FROM on (ws->mu
 * held); NULL when there is none. */
static struct dlock__wait *wake_first_from(struct dlock__waitset *ws, size_t from)
{
    for (size_t i = from; i < ws->n; i++)
        if (!ws->v[i].woken) {
            ws->v[i].woken = true;
            ws->wakes++;
            dlock__wait_wake(ws->v[i].w);
            return ws->v[i].w;
        }
    return NULL;
}

struct dlock__wait *dlock__waitset_wake_one(struct dlock__waitset *ws)
{
    pthread_mutex_lock(&ws->mu);
    struct dlock__wait *w = wake_first_from(ws, 0);
    pthread_mutex_unlock(&ws->mu);
    return w;
}

struct dlock__wait *dlock__waitset_wake_head(struct dlock__waitset *ws)
{
    pthread_mutex_lock(&ws->mu);
    struct dlock__wait *w = ws->n && !ws->v[0].woken ? wake_first_from(ws, 0) : NULL;
    pthread_mutex_unlock(&ws->mu);
    return w;
}

struct dlock__wait *dlock__waitset_wake_after(struct dlock__waitset *ws,
                                              const struct dlock__wait *w)
{
    pthread_mutex_lock(&ws->mu);
    const struct dlock__waitset_slot *sl = slot_of(ws, w);
    struct dlock__wait *next = sl ? wake_first_from(ws, (size_t)(sl - ws->v) + 1) : NULL;
    pthread_mutex_unlock(&ws->mu);
    return next;
}

/* Wake and mark every wait whose key is KEY, or every wait for NULL. */
static size_t wake_matching(struct dlock__waitset *ws, const char *key)
{
    size_t n = 0;
    pthread_mutex_lock(&ws->mu);
    for (size_t i = 0; i < ws->n; i++)
        if (!key || (ws->v[i].key && strcmp(ws->v[i].key, key) == 0)) {
            ws->v[i].woken = true;
            dlock__wait_wake(ws->v[i].w);
            n++;
        }
    ws->wakes += n;
    pthread_mutex_unlock(&ws->mu);
    return n;
}

size_t dlock__waitset_wake_all(struct dlock__waitset *ws)
{
    return wake_matching(ws, NULL);
}

bool dlock__waitset_consume(struct dlock__waitset *ws, struct dlock__wait *w)
{
    return take_mark(ws, w, false);
}

size_t dlock__waitset_count(struct dlock__waitset *ws)
{
    pthread_mutex_lock(&ws->mu);
    size_t n = ws->n;
    pthread_mutex_unlock(&ws->mu);
    return n;
}

void dlock__waitset_set_key(struct dlock__waitset *ws, struct dlock__wait *w, const char *key)
{
    pthread_mutex_lock(&ws->mu);
    struct dlock__waitset_slot *sl = slot_of(ws, w);
    if (sl)
        sl->key = key;
    pthread_mutex_unlock(&ws->mu);
}

size_t dlock__waitset_wake_key(struct dlock__waitset *ws, const char *key)
{
    return key ? wake_matching(ws, key) : 0;
}

struct dlock__wait *dlock__waitset_first(struct dlock__waitset *ws)
{
    pthread_mutex_lock(&ws->mu);
    struct dlock__wait *w = ws->n ? ws->v[0].w : NULL;
    pthread_mutex_unlock(&ws->mu);
    return w;
}
