/* guard.c -- guarded writes: keys the user names in a lock name's own
 * store, put and deleted only by the name's exclusive holder, each in one
 * backend request atomic with the check that the hold is still ours
 * (dlock_guarded_put, dlock_guarded_delete), and read by anyone
 * (dlock_guarded_get).
 *
 * Why a file of its own: the calls check keys and sizes and answer
 * DLOCK_ENOTSUP for a backend without a store; the write itself is the
 * lock value's (value.c, dlock__held_write: the hold found, the keeper
 * kept off it, a backend's DLOCK_ELOST made the hold's loss), through the
 * backend's guarded ops (backend.h, struct dlock__guarded_ops).
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The backend of C keeps no guarded keys: DLOCK_ENOTSUP naming it and
 * why. */
static int no_store(const dlock_client *c, const char *name)
{
    const char *why = c->be->no_guarded_why;
    return dlock__err(DLOCK_ENOTSUP, "lock '%s': the %s backend has no guarded writes: %s", name,
                      c->be->name, why ? why : "not yet");
}

/* Whether KEY is a good key (letters, digits, '.', '_', '-'; 1 to
 * DLOCK_GUARDED_KEY_MAX bytes; not "." nor ".."): DLOCK_OK or
 * DLOCK_EINVAL, said for lock NAME. */
static int check_key(const char *name, const char *key)
{
    if (!key || !*key)
        return dlock__err(DLOCK_EINVAL, "lock '%s': a guarded key is empty", name);
    size_t len = strnlen(key, DLOCK_GUARDED_KEY_MAX + 1);
    if (len > DLOCK_GUARDED_KEY_MAX)
        return dlock__err(DLOCK_EINVAL, "lock '%s': key '%.40s...' is longer than %d bytes", name,
                          key, DLOCK_GUARDED_KEY_MAX);
    if (!strcmp(key, ".") || !strcmp(key, ".."))
        return dlock__err(DLOCK_EINVAL, "lock '%s': key '%s' is not a key", name, key);
    for (const char *p = key; *p; p++) {
        unsigned char ch = (unsigned char)*p;
        bool alnum =
            (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
        if (!alnum && ch != '.' && ch != '_' && ch != '-')
            return dlock__err(DLOCK_EINVAL,
                              "lock '%s': key '%s' has byte 0x%02x (letters, digits, '.', "
                              "'_' and '-' only)",
                              name, key, ch);
    }
    return DLOCK_OK;
}

/* Put V (NULL: delete) at KEY through the owner's hold on L's name. */
static int guarded_write(dlock_lock *l, const char *key, const struct dlock__value *v)
{
    int rc = dlock__check_fork(l->c);
    if (rc || (rc = dlock__check_client(l->c)) || (rc = check_key(l->e->name, key)))
        return rc;
    if (!DLOCK__OP(l->c->be, guarded, put))
        return no_store(l->c, l->e->name);
    return dlock__held_write(l, key, v);
}

int dlock_guarded_put(dlock_lock *l, const char *key, const void *data, size_t len)
{
    dlock__msg_clear();
    if (!l || (!data && len))
        return dlock__err(DLOCK_EINVAL, "dlock_guarded_put: NULL argument");
    if (len > DLOCK_GUARDED_MAX)
        return dlock__err(DLOCK_EINVAL, "lock '%s': %zu bytes for key '%.40s' (at most %d)",
                          l->e->name, len, key ? key : "", DLOCK_GUARDED_MAX);
    struct dlock__value v = {.data = (char *)(data ? data : ""), .len = len};
    return guarded_write(l, key, &v);
}

int dlock_guarded_delete(dlock_lock *l, const char *key)
{
    dlock__msg_clear();
    if (!l)
        return dlock__err(DLOCK_EINVAL, "dlock_guarded_delete: NULL argument");
    return guarded_write(l, key, NULL);
}

int dlock_guarded_get(dlock_client *c, dlock_guarded_read *r)
{
    dlock__msg_clear();
    if (!r)
        return dlock__err(DLOCK_EINVAL, "dlock_guarded_get: NULL argument");
    r->len = 0;
    r->token = 0;
    if (!r->name || (!r->buf && r->size))
        return dlock__err(DLOCK_EINVAL, "dlock_guarded_get: NULL argument");
    int rc = dlock__check_name_call(c, r->name);
    if (rc || (rc = check_key(r->name, r->key)))
        return rc;
    if (!DLOCK__OP(c->be, guarded, get))
        return no_store(c, r->name);
    struct dlock__value v = {0};
    if ((rc = c->be->guarded->get(c->bstate, r->name, r->key, &v))) {
        free(v.data);
        return rc;
    }
    if (v.len > r->size) {
        r->len = v.len;
        free(v.data);
        return dlock__err(DLOCK_EINVAL, "lock '%s': key '%s' has %zu bytes, the buffer %zu",
                          r->name, r->key, v.len, r->size);
    }
    if (v.len)
        memcpy(r->buf, v.data, v.len);
    r->len = v.len;
    r->token = v.token;
    free(v.data);
    return DLOCK_OK;
}
