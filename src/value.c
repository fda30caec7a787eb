/* value.c -- a lock's value: a few bytes the holder of a name writes
 * beside the lock and anyone reads, with the token of the hold that wrote
 * them (dlock_value_set, dlock_value_get, dlock_release_ex's clear).
 *
 * Why it is a file of its own: the write is guarded by a hold, but it is
 * no hold's acquire or release. The core finds the owner's hold, refuses
 * what the backend would be asked in vain (a shared, permit or campaign
 * hold; one already lost or past its validity), keeps the keeper and a
 * release off the hold while the backend writes (h->renewing, as a
 * downgrade does), and turns the backend's DLOCK_ELOST into the hold's
 * loss. The check that the hold is still ours is the backend's, in the
 * same request as the write (backend.h, struct dlock__value_ops). That
 * write through a hold, dlock__held_write(), is guard.c's too: a guarded
 * key is written exactly as the value is, through the guarded ops.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The backend of C keeps no lock values: DLOCK_ENOTSUP naming it. */
static int no_values(const dlock_client *c, const char *name)
{
    const char *why = c->be->no_values_why;
    return dlock__err(DLOCK_ENOTSUP, "lock '%s': the %s backend keeps no lock values%s%s", name,
                      c->be->name, why ? ": " : "", why ? why : "");
}

/* Whether H, the owner's hold through L, may write WHAT ("its value", or
 * "key 'K'" for guarded key KEY) (mutex held): DLOCK_OK, or why not,
 * said. */
static int writable(dlock_lock *l, const struct dlock__hold *h, const char *key, const char *what)
{
    const char *name = l->e->name;
    if (!h)
        return dlock__not_held(l);
    if (h->sem || h->elect)
        return dlock__err(DLOCK_ENOTSUP, "lock '%s': a %s's hold writes no %s", name,
                          h->sem ? "semaphore" : "campaign", key ? "guarded key" : "lock value");
    if (h->state == DLOCK__LOST)
        return dlock__err(DLOCK_ELOST, "lock '%s' was lost: %s; %s is not written", name,
                          h->lost_why ? h->lost_why : "no reason given", what);
    if (h->lease_ms && h->valid_until != DLOCK__NEVER && h->valid_until <= dlock__now_ms())
        return dlock__err(DLOCK_ELOST, "lock '%s': its validity has passed; %s is not written",
                          name, what);
    if (h->mode != DLOCK_EXCLUSIVE)
        return dlock__err(DLOCK_EMISUSE,
                          "lock '%s' is held shared: only an exclusive holder writes %s", name,
                          what);
    return DLOCK_OK;
}

int dlock__held_write(dlock_lock *l, const char *key, const struct dlock__value *v)
{
    dlock_client *c = l->c;
    int rc;
    char what[DLOCK_GUARDED_KEY_MAX + 8];
    snprintf(what, sizeof what, key ? "key '%s'" : "its value", key);
    pthread_mutex_lock(&c->mu);
    struct dlock__hold *h = dlock__hold_of(l->e, dlock__owner_of(l));
    while (h && h->renewing) { /* the keeper's renewal, or another write */
        pthread_cond_wait(&c->renew_cv, &c->mu);
        h = dlock__hold_of(l->e, dlock__owner_of(l));
    }
    if ((rc = writable(l, h, key, what))) {
        /* refused for a validity that has passed: the hold is lost now,
         * as the keeper would find it, so that its release says so too */
        bool expired = rc == DLOCK_ELOST && h && h->state != DLOCK__LOST;
        pthread_mutex_unlock(&c->mu);
        if (expired) {
            char msg[DLOCK__MSG_MAX];
            dlock__errmsg_save(msg);
            dlock__hold_lost(c, h, msg);
            dlock__errmsg_restore(rc, msg);
        }
        return rc;
    }
    h->renewing = true; /* the keeper and a release wait for the write */
    pthread_mutex_unlock(&c->mu);
    rc = key ? c->be->guarded->put(c->bstate, h, key, v) : c->be->values->set(c->bstate, h, v);
    if (rc == DLOCK_ELOST) {
        char msg[DLOCK__MSG_MAX];
        dlock__errmsg_save(msg);
        dlock__hold_lost(c, h, msg);
        dlock__errmsg_restore(rc, msg);
    }
    pthread_mutex_lock(&c->mu);
    h->renewing = false;
    pthread_cond_broadcast(&c->renew_cv);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Write V (NULL: clear) as the value of L's name through the owner's
 * hold, guarded by it in the backend. */
static int value_write(dlock_lock *l, const struct dlock__value *v)
{
    int rc = dlock__check_client(l->c);
    if (rc)
        return rc;
    if (!DLOCK__OP(l->c->be, values, set))
        return no_values(l->c, l->e->name);
    return dlock__held_write(l, NULL, v);
}

int dlock_value_set(dlock_lock *l, const void *value, size_t len)
{
    dlock__msg_clear();
    if (!l || (!value && len))
        return dlock__err(DLOCK_EINVAL, "dlock_value_set: NULL argument");
    if (len > DLOCK_VALUE_MAX)
        return dlock__err(DLOCK_EINVAL, "lock '%s': a value of %zu bytes (at most %d)", l->e->name,
                          len, DLOCK_VALUE_MAX);
    int rc = dlock__check_fork(l->c);
    if (rc)
        return rc;
    struct dlock__value v = {.data = (char *)(value ? value : ""), .len = len};
    return value_write(l, &v);
}

int dlock_value_get(dlock_client *c, const char *name, void *buf, size_t *len, uint64_t *token)
{
    dlock__msg_clear();
    if (token)
        *token = 0;
    if (!name || !len || (!buf && *len))
        return dlock__err(DLOCK_EINVAL, "dlock_value_get: NULL argument");
    size_t size = *len;
    *len = 0;
    int rc = dlock__check_name_call(c, name);
    if (rc)
        return rc;
    if (!DLOCK__OP(c->be, values, get))
        return no_values(c, name);
    struct dlock__value v = {0};
    if ((rc = c->be->values->get(c->bstate, name, &v))) {
        free(v.data);
        return rc;
    }
    if (v.len > size) {
        *len = v.len;
        free(v.data);
        return dlock__err(DLOCK_EINVAL, "lock '%s': its value has %zu bytes, the buffer %zu", name,
                          v.len, size);
    }
    if (v.len)
        memcpy(buf, v.data, v.len);
    *len = v.len;
    if (token)
        *token = v.token;
    free(v.data);
    return DLOCK_OK;
}

int dlock__value_clear_last(dlock_lock *l)
{
    int rc = dlock__check_fork(l->c);
    if (rc)
        return rc;
    pthread_mutex_lock(&l->c->mu);
    struct dlock__hold *h = dlock__hold_of(l->e, dlock__owner_of(l));
    bool last = h && h->count == 1;
    pthread_mutex_unlock(&l->c->mu);
    return last ? value_write(l, NULL) : DLOCK_OK;
}

char *dlock__value_encode(const struct dlock__value *v, uint64_t token, size_t *len)
{
    char head[24];
    int hl = snprintf(head, sizeof head, "%" PRIu64 "\n", token);
    char *out = malloc((size_t)hl + v->len + 1);
    if (!out)
        return NULL;
    memcpy(out, head, (size_t)hl);
    memcpy(out + hl, v->data, v->len);
    out[(size_t)hl + v->len] = 0;
    *len = (size_t)hl + v->len;
    return out;
}

bool dlock__value_decode(const char *text, size_t len, struct dlock__value *out)
{
    return dlock__value_decode_max(text, len, DLOCK_VALUE_MAX, out);
}

bool dlock__value_decode_max(const char *text, size_t len, size_t max, struct dlock__value *out)
{
    const char *nl = memchr(text, '\n', len);
    if (!nl || nl == text || nl - text > 20)
        return false;
    uint64_t t = 0;
    for (const char *p = text; p < nl; p++) {
        if (*p < '0' || *p > '9' || t > (UINT64_MAX - 9) / 10)
            return false;
        t = t * 10 + (uint64_t)(*p - '0');
    }
    size_t n = len - (size_t)(nl + 1 - text);
    if (!t || n > max || !(out->data = malloc(n + 1)))
        return false;
    memcpy(out->data, nl + 1, n);
    out->data[n] = 0;
    out->len = n;
    out->token = t;
    return true;
}
