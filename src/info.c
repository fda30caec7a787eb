/* info.c -- looking at names without taking them: inspect, list, and the
 * operator's force-release. The snapshot is opaque with getters so that
 * adding a field never breaks a program built against an older header. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static int check_args(dlock_client *c, const char *name)
{
    int rc = dlock__check_client(c);
    if (rc)
        return rc;
    if (!c->connected)
        return dlock__err(DLOCK_EMISUSE, "%s: connect the client first", c->url.redacted);
    if (name && !*name)
        return dlock__err(DLOCK_EINVAL, "lock name is empty");
    if (name && strnlen(name, DLOCK_NAME_MAX + 1) > DLOCK_NAME_MAX)
        return dlock__err(DLOCK_EINVAL, "lock name '%.40s...' is longer than %d bytes", name,
                          DLOCK_NAME_MAX);
    return DLOCK_OK;
}

/* The backend of C, known good by check_args(), cannot do WHAT. */
static int cannot(const dlock_client *c, const char *what)
{
    return dlock__err(DLOCK_ENOTSUP, "the %s backend cannot %s", c->be->name, what);
}

int dlock_inspect(dlock_client *c, const char *name, dlock_info **out)
{
    dlock__msg_clear();
    if (!out || !name)
        return dlock__err(DLOCK_EINVAL, "dlock_inspect: NULL argument");
    *out = NULL;
    int rc = check_args(c, name);
    if (rc)
        return rc;
    dlock_info *i = NULL;
    if ((rc = dlock__info_new(&i)))
        return rc;
    if (!DLOCK__OP(c->be, admin, inspect)) {
        dlock_info_free(i);
        return cannot(c, "inspect locks");
    }
    return dlock__info_give(i, c->be->admin->inspect(c->bstate, name, i), out);
}

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

int dlock_force_release(dlock_client *c, const char *name)
{
    dlock__msg_clear();
    if (!name)
        return dlock__err(DLOCK_EINVAL, "dlock_force_release: name is NULL");
    int rc = check_args(c, name);
    if (!rc && !DLOCK__OP(c->be, admin, force_release))
        rc = cannot(c, "force-release locks");
    return rc ? rc : c->be->admin->force_release(c->bstate, name);
}

/* dlock_list (SEMS false) and dlock_semaphore_list (SEMS true), named API
 * in messages: the table's list is chosen once C is known good. */
static int list_names(dlock_client *c, const char *api, bool sems, const char *pattern,
                      dlock_list_fn fn, void *arg)
{
    dlock__msg_clear();
    if (!fn)
        return dlock__err(DLOCK_EINVAL, "%s: callback is NULL", api);
    int rc = check_args(c, NULL);
    if (rc)
        return rc;
    int (*list)(void *, const char *, dlock_list_fn, void *) =
        sems ? DLOCK__OP(c->be, semaphores, list) : DLOCK__OP(c->be, admin, list);
    if (!list)
        return cannot(c, sems ? "list semaphores" : "list locks");
    return list(c->bstate, pattern, fn, arg);
}

int dlock_semaphore_list(dlock_client *c, const char *pattern, dlock_list_fn fn, void *arg)
{
    return list_names(c, "dlock_semaphore_list", true, pattern, fn, arg);
}

int dlock_list(dlock_client *c, const char *pattern, dlock_list_fn fn, void *arg)
{
    return list_names(c, "dlock_list", false, pattern, fn, arg);
}
