/* value.c -- the ZooKeeper backend's lock values: what a lock's holder
 * writes beside the lock, for anyone to read (dlock_value_set(),
 * dlock_value_get()).
 *
 * Lock NAME's value is the persistent child "_dlock_value" of its lock
 * node: its data the writer's token in decimal, a newline, then the
 * bytes; empty data is no value. The name carries none of the marks of
 * a contender ("lock-", "latch-", "__READ__", "__WRIT__"), so dlock skips
 * it, and Curator, which sorts children on what follows the mark and
 * takes a name without it whole, sorts it after every sequence number:
 * never a predecessor nor an owner. The child keeps the lock's container
 * node alive while a value is there.
 *
 * The holder writes it in one multi: a check that its own node (the
 * EPHEMERAL_SEQUENTIAL child of its session, named with its guid and
 * sequence) still exists, then a setData of the value node -- or its
 * create, the first time. A node gone (its session expired, a force
 * release) fails the check and nothing is written: DLOCK_ELOST. A clear
 * sets the data empty. A read is one getData.
 */
#include "zk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VALUE_NODE "_dlock_value"
#define KEYS_NODE "_dlock_keys"

/* Lock NAME's value node (KEY NULL), or the node of guarded key KEY of
 * its store under KEYS_NODE (guard.c) (caller frees; NULL: out of
 * memory). */
static char *value_path(struct zk_backend *zb, const char *name, const char *key)
{
    char *lockpath = dlock__zk_lock_path(zb, name);
    char *path = !lockpath ? NULL
                 : key     ? dlock__sprintf("%s/" KEYS_NODE "/%s", lockpath, key)
                           : dlock__sprintf("%s/" VALUE_NODE, lockpath);
    free(lockpath);
    return path;
}

/* Create the parent of guarded key node PATH (KEYS_NODE, a container:
 * the server deletes it once its last key is deleted) through S. */
static int make_keys_node(struct zk_backend *zb, struct zk_session *s, const char *path)
{
    char *parent = dlock__strdup(path);
    if (!parent)
        return ZSYSTEMERROR;
    *strrchr(parent, '/') = 0;
    int rc = dlock__zk_create_container(zb, s, parent, DLOCK__NEVER);
    free(parent);
    return rc;
}

/* Write GW (the node's new data, or its delete) guarded by hold H's node
 * through session S: setData, or the create when the node is not there
 * yet (its KEYS_NODE parent first for a guarded key, KEY), and setData
 * again when a create finds it made meanwhile. */
static int guarded_write(struct zk_backend *zb, struct zk_session *s, struct dlock__hold *h,
                         const char *key, struct zk_guarded_write *gw)
{
    char thing[DLOCK_GUARDED_KEY_MAX + 8];
    snprintf(thing, sizeof thing, key ? "key '%s'" : "its value", key);
    int rc = ZOK;
    for (int tries = 0; tries < 4; tries++) {
        rc = dlock__zk_rq_check_then(zb, s->zh, gw, DLOCK__NEVER);
        if (rc == ZOK)
            return DLOCK_OK;
        if (gw->errs[0] == ZNONODE)
            return dlock__err(DLOCK_ELOST, "%s: lock '%s': node %s is gone; %s is not written",
                              zb->servers, h->name, gw->check, thing);
        if (gw->errs[0] != ZOK)
            break;
        if (gw->errs[1] == ZNONODE && (gw->remove || (!key && !gw->len && !gw->create)))
            return DLOCK_OK; /* a clear or a delete with nothing there */
        if (gw->errs[1] == ZNONODE && gw->create && key) {
            if ((rc = make_keys_node(zb, s, gw->path)) != ZOK)
                break;
        } else if (gw->errs[1] == ZNONODE || gw->errs[1] == ZNODEEXISTS)
            gw->create = gw->errs[1] == ZNONODE;
        else
            break;
    }
    return dlock__zk_fail(zb, rc, key ? "write a guarded key" : "write the value", gw->path);
}

int dlock__zk_stored_set(void *state, struct dlock__hold *h, const char *key,
                         const struct dlock__value *v)
{
    struct zk_backend *zb = state;
    struct zk_session *s;
    int rc = dlock__zk_hold_session(zb, h, &s);
    if (rc)
        return rc;
    const struct zk_hold *zh = h->bdata;
    char *path = value_path(zb, h->name, key);
    size_t len = 0;
    char *data = v ? dlock__value_encode(v, h->token, &len) : NULL;
    if (!path || (v && !data))
        rc = dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    else {
        struct zk_guarded_write gw = {.check = zh->path,
                                      .path = path,
                                      .data = data ? data : "",
                                      .len = len,
                                      .remove = key && !v};
        rc = guarded_write(zb, s, h, key, &gw);
    }
    dlock__zk_session_put(zb, s);
    free(data);
    free(path);
    return rc;
}

int dlock__zk_stored_get(void *state, const char *name, const char *key, struct dlock__value *out)
{
    struct zk_backend *zb = state;
    char *path = value_path(zb, name, key);
    if (!path)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    struct zk_session *s;
    int rc = dlock__zk_session_get(zb, &s);
    if (rc) {
        free(path);
        return rc;
    }
    char *data = NULL;
    struct Stat st = {0};
    int zrc = dlock__zk_rq_get(zb, s->zh, path, &data, &st, DLOCK__NEVER);
    dlock__zk_session_put(zb, s);
    if (zrc != ZOK && zrc != ZNONODE)
        rc = dlock__zk_fail(zb, zrc, key ? "read a guarded key" : "read the value", path);
    else if (zrc == ZOK && st.dataLength > 0 &&
             (!data || !dlock__value_decode_max(data, (size_t)st.dataLength,
                                                key ? DLOCK_GUARDED_MAX : DLOCK_VALUE_MAX, out)))
        rc = dlock__err(DLOCK_EPROTO,
                        "%s: node %s holds no dlock %s (a token, a newline and at most %d "
                        "bytes)",
                        zb->servers, path, key ? "guarded key" : "value",
                        key ? DLOCK_GUARDED_MAX : DLOCK_VALUE_MAX);
    free(data);
    free(path);
    return rc;
}

static int zk_value_set(void *state, struct dlock__hold *h, const struct dlock__value *v)
{
    return dlock__zk_stored_set(state, h, NULL, v);
}

static int zk_value_get(void *state, const char *name, struct dlock__value *out)
{
    return dlock__zk_stored_get(state, name, NULL, out);
}

const struct dlock__value_ops dlock__zk_value_ops = {
    .set = zk_value_set,
    .get = zk_value_get,
};
