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

/* Lock NAME's value node (caller frees; NULL: out of memory). */
static char *value_path(struct zk_backend *zb, const char *name)
{
    char *lockpath = dlock__zk_lock_path(zb, name);
    char *path = lockpath ? dlock__sprintf("%s/" VALUE_NODE, lockpath) : NULL;
    free(lockpath);
    return path;
}

/* Write GW (the value node's new data) guarded by hold H's node through
 * session S: setData, or the create when the node is not there yet (and
 * setData again when a create finds it made meanwhile). */
static int guarded_write(struct zk_backend *zb, struct zk_session *s, struct dlock__hold *h,
                         struct zk_guarded_write *gw)
{
    int rc = ZOK;
    for (int tries = 0; tries < 3; tries++) {
        rc = dlock__zk_rq_check_then(zb, s->zh, gw, DLOCK__NEVER);
        if (rc == ZOK)
            return DLOCK_OK;
        if (gw->errs[0] == ZNONODE)
            return dlock__err(DLOCK_ELOST,
                              "%s: lock '%s': node %s is gone; its value is not "
                              "written",
                              zb->servers, h->name, gw->check);
        if (gw->errs[0] != ZOK)
            break;
        if (gw->errs[1] == ZNONODE && !gw->len && !gw->create)
            return DLOCK_OK; /* a clear with nothing there */
        if (gw->errs[1] == ZNONODE || gw->errs[1] == ZNODEEXISTS)
            gw->create = gw->errs[1] == ZNONODE;
        else
            break;
    }
    return dlock__zk_fail(zb, rc, "write the value", gw->path);
}

static int zk_value_set(void *state, struct dlock__hold *h, const struct dlock__value *v)
{
    struct zk_backend *zb = state;
    struct zk_session *s;
    int rc = dlock__zk_hold_session(zb, h, &s);
    if (rc)
        return rc;
    const struct zk_hold *zh = h->bdata;
    char *path = value_path(zb, h->name);
    size_t len = 0;
    char *data = v ? dlock__value_encode(v, h->token, &len) : NULL;
    if (!path || (v && !data))
        rc = dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    else {
        struct zk_guarded_write gw = {.check = zh->path,
                                      .path = path,
                                      .data = data ? data : "",
                                      .len = len};
        rc = guarded_write(zb, s, h, &gw);
    }
    dlock__zk_session_put(zb, s);
    free(data);
    free(path);
    return rc;
}

static int zk_value_get(void *state, const char *name, struct dlock__value *out)
{
    struct zk_backend *zb = state;
    char *path = value_path(zb, name);
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
        rc = dlock__zk_fail(zb, zrc, "read the value", path);
    else if (zrc == ZOK && st.dataLength > 0 &&
             (!data || !dlock__value_decode(data, (size_t)st.dataLength, out)))
        rc = dlock__err(DLOCK_EPROTO,
                        "%s: node %s holds no dlock value (a token, a newline and "
                        "at most %d bytes)",
                        zb->servers, path, DLOCK_VALUE_MAX);
    free(data);
    free(path);
    return rc;
}

const struct dlock__value_ops dlock__zk_value_ops = {
    .set = zk_value_set,
    .get = zk_value_get,
};
