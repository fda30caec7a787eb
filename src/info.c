/* info.c -- the snapshot of a name that an inspect fills
 * (dlock_inspect, dlock_semaphore_inspect): made here, filled by the
 * backend through dlock__info_set_key/add_holder/add_waiter, read by the
 * program through getters. It is opaque so that adding a field never
 * breaks a program built against an older header. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int dlock__info_new(dlock_info **i)
{
    if (!(*i = calloc(1, sizeof **i)))
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    (*i)->ttl_ms = -1;
    (*i)->nwaiters = -1;
    (*i)->free_permits = -1;
    return DLOCK_OK;
}

int dlock__info_give(dlock_info *i, int rc, dlock_info **out)
{
    if (rc)
        dlock_info_free(i);
    else
        *out = i;
    return rc;
}

void dlock_info_free(dlock_info *i)
{
    if (!i)
        return;
    free(i->key);
    for (size_t k = 0; k < i->nholders; k++)
        free(i->holders[k].id);
    free(i->holders);
    for (long k = 0; k < i->nwaiters; k++)
        free(i->waiters[k]);
    free(i->waiters);
    free(i);
}

int dlock__info_set_key(struct dlock_info *i, const char *key)
{
    free(i->key);
    i->key = strdup(key);
    return i->key ? DLOCK_OK : dlock__err(DLOCK_ENOMEM, "out of memory");
}

int dlock__info_add_holder(struct dlock_info *i, const char *id, unsigned count)
{
    struct dlock__who *n = realloc(i->holders, (i->nholders + 1) * sizeof *n);
    if (!n)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    i->holders = n;
    if (!(n[i->nholders].id = strdup(id)))
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    n[i->nholders++].count = count;
    return DLOCK_OK;
}

int dlock__info_count_holder(struct dlock_info *i, const char *id)
{
    for (size_t j = 0; j < i->nholders; j++)
        if (strcmp(i->holders[j].id, id) == 0) {
            i->holders[j].count++;
            return DLOCK_OK;
        }
    return dlock__info_add_holder(i, id, 1);
}

int dlock__info_add_waiter(struct dlock_info *i, const char *id)
{
    long have = i->nwaiters < 0 ? 0 : i->nwaiters;
    char **n = realloc(i->waiters, (size_t)(have + 1) * sizeof *n);
    if (!n)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    i->waiters = n;
    if (!(n[have] = strdup(id)))
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    i->nwaiters = have + 1;
    return DLOCK_OK;
}

int dlock_info_held(const dlock_info *i)
{
    return i ? i->held : 0;
}

dlock_mode dlock_info_mode(const dlock_info *i)
{
    return i ? i->mode : DLOCK_EXCLUSIVE;
}

uint64_t dlock_info_token(const dlock_info *i)
{
    return i ? i->token : 0;
}

int64_t dlock_info_ttl_ms(const dlock_info *i)
{
    return i ? i->ttl_ms : -1;
}

const char *dlock_info_key(const dlock_info *i)
{
    return i && i->key ? i->key : "";
}

size_t dlock_info_holder_count(const dlock_info *i)
{
    return i ? i->nholders : 0;
}

const char *dlock_info_holder(const dlock_info *i, size_t k, unsigned *count)
{
    if (!i || k >= i->nholders)
        return NULL;
    if (count)
        *count = i->holders[k].count;
    return i->holders[k].id;
}

long dlock_info_waiter_count(const dlock_info *i)
{
    return i ? i->nwaiters : -1;
}

const char *dlock_info_waiter(const dlock_info *i, size_t k)
{
    if (!i || i->nwaiters < 0 || k >= (size_t)i->nwaiters)
        return NULL;
    return i->waiters[k];
}

int64_t dlock_info_delay_ms(const dlock_info *i)
{
    return i ? i->delay_ms : 0;
}
