/* admin.c -- looking at names without taking them: inspect, list,
 * dlock_check()'s look at a token, and the operator's force-release.
 * Each checks the client and the name, then calls the backend's
 * administration ops (or, for semaphores, the semaphore ops' list); a
 * backend without one is answered DLOCK_ENOTSUP here, before anything is
 * sent. The snapshot an inspect fills is info.c's. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int dlock__check_name_call(dlock_client *c, const char *name)
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

/* The backend of C, known good by dlock__check_name_call(), cannot do WHAT. */
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
    int rc = dlock__check_name_call(c, name);
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

int dlock_force_release(dlock_client *c, const char *name)
{
    dlock__msg_clear();
    if (!name)
        return dlock__err(DLOCK_EINVAL, "dlock_force_release: name is NULL");
    int rc = dlock__check_name_call(c, name);
    if (!rc && !DLOCK__OP(c->be, admin, force_release))
        rc = cannot(c, "force-release locks");
    return rc ? rc : c->be->admin->force_release(c->bstate, name);
}

int dlock_check(dlock_client *c, const char *name, uint64_t token)
{
    dlock__msg_clear();
    if (!name)
        return dlock__err(DLOCK_EINVAL, "dlock_check: name is NULL");
    int rc = dlock__check_name_call(c, name);
    if (!rc && !DLOCK__OP(c->be, admin, check))
        rc = cannot(c, "check tokens");
    struct dlock__check_view v = {0};
    if (rc || (rc = c->be->admin->check(c->bstate, name, &v)))
        return rc;
    if (!v.held)
        return dlock__err(DLOCK_ELOST, "lock '%s' is not held: token %" PRIu64 " is stale", name,
                          token);
    if (v.token == token && v.reader_unknown)
        return dlock__err(DLOCK_ENOTSUP, "lock '%s' is held shared and token %" PRIu64 " is the "
                          "newest reader's, but the %s backend keeps no token per reader: "
                          "whether that reader still holds is unknown", name, token, c->be->name);
    if (v.token != token && v.token)
        return dlock__err(DLOCK_ELOST, "lock '%s': token %" PRIu64 " is stale: the newest hold has "
                          "token %" PRIu64, name, token, v.token);
    if (v.token != token)
        return dlock__err(DLOCK_ELOST, "lock '%s': token %" PRIu64 " is stale: its holder took "
                          "no token (a foreign client's lock)", name, token);
    return DLOCK_OK;
}

/* dlock_list (SEMS false) and dlock_semaphore_list (SEMS true), named API
 * in messages: the table's list is chosen once C is known good. */
static int list_names(dlock_client *c, const char *api, bool sems, const char *pattern,
                      dlock_list_fn fn, void *arg)
{
    dlock__msg_clear();
    if (!fn)
        return dlock__err(DLOCK_EINVAL, "%s: callback is NULL", api);
    int rc = dlock__check_name_call(c, NULL);
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
