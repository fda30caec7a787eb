/* rwlock.c -- the write→read downgrade of Curator's InterProcessReadWriteLock
 * layout.
 *
 * Shared holds are "__READ__" children of the lock node, beside the
 * writers' "__WRIT__" (or InterProcessMutex's "lock-") children, all in
 * one queue by sequence (mutex.c does the acquire: a reader waits only for
 * the closest writer before it, a writer for the node before it). What
 * needs more is the downgrade: an owner holding the write lock re-enters
 * it shared, then releases the write level, and must be left holding the
 * read lock with no moment unlocked. Curator does it by creating a read
 * node when the read lock is taken and deleting the write node on
 * release; a writer that queued between the two nodes then wins the
 * write lock while the read node is still held (its predecessor is gone,
 * our read node sorts after it). We queue the read node when the first
 * shared level is taken (share(), called by the core at that re-entry),
 * and check at the downgrade that no writer came between: the read node
 * then takes over, the write node goes. When one did (it queued before
 * the re-entry, or the create failed), the write node stays until the
 * hold ends: a read hold that excludes like a write hold, stricter than
 * asked and never less safe; the read node goes.
 */
#include "zk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The lock node of our node PATH (caller frees). */
static char *lock_path_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? strndup(path, (size_t)(slash - path)) : NULL;
}

static const char *base_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* Queue a read node under ZH's lock node, kept in zh->shadow; false when
 * it could not be made (the message says why). */
static bool shadow_make(struct zk_backend *zb, struct zk_session *s, struct zk_hold *zh)
{
    char *lockpath = lock_path_of(zh->path);
    if (!lockpath) {
        dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
        return false;
    }
    struct String_vector kids = {0, NULL};
    char *data = dlock__sprintf("%s" ZK_SHADOW_TAG, zb->ident);
    struct zk_contender rq = {.lockpath = lockpath,
                              .mark = ZK_READ_MARK,
                              .data = data,
                              .kids = &kids};
    int rc = data ? dlock__zk_create_contender(zb, s, &rq, NULL)
                  : dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    free(data);
    deallocate_String_vector(&kids);
    free(lockpath);
    if (rc != DLOCK_OK)
        return false;
    zh->shadow = rq.out.node;
    zh->shadow_czxid = rq.out.czxid;
    return true;
}

void dlock__zk_share(void *state, struct dlock__hold *h)
{
    struct zk_backend *zb = state;
    struct zk_hold *zh = h->bdata;
    if (!zh || zh->shadow)
        return;
    struct zk_session *s = dlock__zk_session_of_hold(zb, zh);
    if (!s)
        return; /* the hold is gone: the downgrade will say so */
    shadow_make(zb, s, zh);
    dlock__zk_session_put(zb, s);
}

void dlock__zk_shadow_drop(struct zk_backend *zb, struct zk_session *s, struct zk_hold *zh)
{
    if (!zh->shadow)
        return;
    if (s)
        dlock__zk_delete_own_node(zb, s, zh->shadow, NULL);
    free(zh->shadow);
    zh->shadow = NULL;
}

/* Is there a writer between our nodes WRITE and READ under LOCKPATH?
 * ZOK with *between set, ZNONODE when WRITE is gone, or an error. */
static int writer_between(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
                          const char *write, const char *read, bool *between)
{
    struct String_vector kids = {0, NULL};
    int rc = dlock__zk_rq_children(zb, s->zh, lockpath, &kids, DLOCK__NEVER);
    if (rc != ZOK)
        return rc;
    dlock__zk_sort_lock_nodes(&kids);
    int32_t iw = -1, ir = -1;
    for (int32_t i = 0; i < kids.count; i++) {
        if (strcmp(kids.data[i], write) == 0)
            iw = i;
        else if (strcmp(kids.data[i], read) == 0)
            ir = i;
    }
    *between = ir < 0; /* our read node is gone: cannot take over */
    for (int32_t i = iw + 1; iw >= 0 && i < ir; i++)
        if (dlock__zk_node_kind(kids.data[i]) != ZK_KIND_READ)
            *between = true;
    deallocate_String_vector(&kids);
    return iw < 0 ? ZNONODE : ZOK;
}

int dlock__zk_downgrade(void *state, struct dlock__hold *h)
{
    struct zk_backend *zb = state;
    struct zk_hold *zh = h->bdata;
    struct zk_session *s;
    int err = dlock__zk_hold_session(zb, h, &s);
    if (err)
        return err;
    if (!zh->shadow && !shadow_make(zb, s, zh)) {
        dlock__err(DLOCK_OK, "%s", ""); /* no read node: the write node stays (see above) */
        goto out;
    }
    char *lockpath = lock_path_of(zh->path);
    bool between = true;
    int rc = lockpath
                 ? writer_between(zb, s, lockpath, base_of(zh->path), base_of(zh->shadow), &between)
                 : ZSYSTEMERROR;
    if (rc == ZOK && !between && zh->delay_armed) {
        /* The exclusive part ends cleanly: its lock-delay marker goes
         * first, while the write node still holds (as a clean release),
         * so no reader the delete lets in finds it (delay.c). */
        dlock__zk_delay_clear(zb, lockpath, h->token);
        zh->delay_armed = false;
    }
    free(lockpath);
    if (rc == ZNONODE) {
        dlock__zk_shadow_drop(zb, s, zh);
        err = dlock__err(DLOCK_ELOST,
                         "%s: lock '%s': node %s was gone before the downgrade "
                         "(force-released?)",
                         zb->servers, h->name, zh->path);
        goto out;
    }
    if (rc != ZOK || between) {
        /* A writer queued between our nodes (or we cannot tell): it must
         * not take the lock from our read level. Keep the write node. */
        dlock__zk_shadow_drop(zb, s, zh);
        goto out;
    }
    /* The read node takes over: the write node goes (the keeper deletes
     * it if the delete gets no answer; it excludes no more than before
     * meanwhile). Readers waiting for it come in; writers wait for the
     * read node. The token stays the hold's. */
    rc = dlock__zk_rq_delete(zb, s->zh, zh->path, DLOCK__NEVER);
    if (rc != ZOK && rc != ZNONODE)
        dlock__zk_orphan_add(zb, s, zh->path);
    free(zh->path);
    zh->path = zh->shadow;
    zh->czxid = zh->shadow_czxid;
    zh->shadow = NULL;
    zh->watched = false; /* the read node has no watch yet: the next
                            renewal checks it and leaves one */
    snprintf(h->owner, sizeof h->owner, "%s", base_of(zh->path));
out:
    dlock__zk_session_put(zb, s);
    return err;
}
