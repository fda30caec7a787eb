/* inspect.c -- what the ZooKeeper backend tells about locks it does not
 * hold: status (the lock children in queue order: the holder -- or the
 * readers before the first writer, holding together --, then the
 * waiters), dlock_check()'s look (each holder's czxid), force-release
 * (delete the holders' nodes) and list (the lock nodes under the base). They read the same lock
 * children as acquire (dlock__zk_sort_lock_nodes), so status and acquire always agree on who holds.
 */
#include "zk.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ inspecting */

/* Holder text: the node name and, when it is printable, its data
 * (dlock writes "dlock <pid>@<host>", Curator the client's address). */
static char *holder_text(const char *node, const char *data)
{
    bool printable = data && *data;
    for (const char *p = data; printable && *p; p++)
        if (!isprint((unsigned char)*p))
            printable = false;
    return printable ? dlock__sprintf("%s (%s)", node, data) : dlock__strdup(node);
}

/* How many of the sorted lock children KIDS hold the lock: the readers
 * before the first writer, or the first node when it is a writer. */
static int32_t holders_of(const struct String_vector *kids)
{
    int32_t n = 0;
    while (n < kids->count && dlock__zk_node_kind(kids->data[n]) == ZK_KIND_READ)
        n++;
    return n ? n : kids->count > 0;
}

/* Run FN on NAME's lock path with a session, then put the session back
 * and free the path: what inspect and force-release share. */
typedef int lock_path_fn(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
                         void *arg);
static int on_lock_path(struct zk_backend *zb, const char *name, lock_path_fn *fn, void *arg)
{
    char *lockpath = dlock__zk_lock_path(zb, name);
    if (!lockpath)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    struct zk_session *s;
    int err = dlock__zk_session_get(zb, &s);
    if (err == DLOCK_OK) {
        err = fn(zb, s, lockpath, arg);
        dlock__zk_session_put(zb, s);
    }
    free(lockpath);
    return err;
}

static int inspect_nodes(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
                         void *arg)
{
    struct dlock_info *info = arg;
    info->mode = DLOCK_EXCLUSIVE;
    info->ttl_ms = -1;
    info->nwaiters = 0;
    int err = dlock__info_set_key(info, lockpath);
    struct String_vector kids = {0, NULL};
    int rc =
        err == DLOCK_OK ? dlock__zk_rq_children(zb, s->zh, lockpath, &kids, DLOCK__NEVER) : ZOK;
    if (err != DLOCK_OK) {
        /* message set */
    } else if (rc == ZNONODE) {
        info->held = 0;
    } else if (rc != ZOK) {
        err = dlock__zk_fail(zb, rc, "list", lockpath);
    } else {
        dlock__zk_sort_lock_nodes(&kids);
        int32_t holding = holders_of(&kids);
        if (holding > 0 && dlock__zk_node_kind(kids.data[0]) == ZK_KIND_READ)
            info->mode = DLOCK_SHARED;
        for (int32_t i = 0; i < kids.count && err == DLOCK_OK; i++) {
            char *path = dlock__sprintf("%s/%s", lockpath, kids.data[i]);
            char *data = NULL;
            struct Stat st;
            rc = path ? dlock__zk_rq_get(zb, s->zh, path, &data, &st, DLOCK__NEVER) : ZSYSTEMERROR;
            if (rc == ZNOAUTH) /* data unreadable (creator ACL): the stat is not */
                rc = dlock__zk_rq_exists(zb, s->zh, path, NULL, NULL, &st, DLOCK__NEVER);
            if (rc == ZNONODE) {
                free(path);
                continue; /* left meanwhile */
            }
            if (rc != ZOK) {
                err = dlock__zk_fail(zb, rc, "read", path ? path : lockpath);
                free(path);
                break;
            }
            free(path);
            if (i >= holding && data && strstr(data, ZK_SHADOW_TAG)) {
                free(data); /* part of the write hold before it */
                continue;
            }
            char *text = holder_text(kids.data[i], data);
            free(data);
            if (!text) {
                err = dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
                break;
            }
            if (i < holding) {
                if (!info->held)
                    info->token = (uint64_t)st.czxid;
                info->held = 1;
                err = dlock__info_add_holder(info, text, 0); /* count unknown */
            } else {
                err = dlock__info_add_waiter(info, text);
            }
            free(text);
        }
        if (err == DLOCK_OK && !info->held && info->nwaiters < 0)
            info->nwaiters = 0; /* (waiters listed while the holder left stay:
                                   zeroing the count leaked their strings) */
    }
    deallocate_String_vector(&kids);
    return err;
}

/* A free name's lock-delay (delay.c), into INFO. */
static int inspect_delay(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
                         void *arg)
{
    struct dlock_info *info = arg;
    return dlock__zk_delay_look(zb, s, lockpath, ZK_DELAY_SHOW, &info->delay_ms);
}

int dlock__zk_inspect(void *state, const char *name, struct dlock_info *info)
{
    int err = on_lock_path(state, name, inspect_nodes, info);
    if (!err && !info->held)
        err = on_lock_path(state, name, inspect_delay, info);
    return err;
}

/* FN on the path of each holder node of LOCKPATH (the sorted children's
 * holders_of), in order, until it fails: what check and force-release
 * share. A lock node that is not there has no holder. */
typedef int holder_fn(struct zk_backend *zb, struct zk_session *s, const char *path, void *arg);
static int for_each_holder(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
                           holder_fn *fn, void *arg)
{
    int err = DLOCK_OK;
    struct String_vector kids = {0, NULL};
    int rc = dlock__zk_rq_children(zb, s->zh, lockpath, &kids, DLOCK__NEVER);
    if (rc == ZOK) {
        dlock__zk_sort_lock_nodes(&kids);
        for (int32_t i = 0, n = holders_of(&kids); i < n && err == DLOCK_OK; i++) {
            char *path = dlock__sprintf("%s/%s", lockpath, kids.data[i]);
            err = path ? fn(zb, s, path, arg)
                       : dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
            free(path);
        }
    } else if (rc != ZNONODE) {
        err = dlock__zk_fail(zb, rc, "list", lockpath);
    }
    deallocate_String_vector(&kids);
    return err;
}

/* dlock_check()'s look, per holder node: its stat for the czxid (after
 * the children, one request each: an exclusive hold has one). A holder
 * node lives as long as its session, so a node there is a holder
 * ZooKeeper still counts alive; one gone meanwhile is not counted. */
static int check_holder(struct zk_backend *zb, struct zk_session *s, const char *path, void *arg)
{
    struct dlock__check_view *view = arg;
    struct Stat st;
    int rc = dlock__zk_rq_exists(zb, s->zh, path, NULL, NULL, &st, DLOCK__NEVER);
    if (rc == ZOK) {
        view->held = true;
        if ((uint64_t)st.czxid > view->token)
            view->token = (uint64_t)st.czxid;
    }
    return rc == ZOK || rc == ZNONODE ? DLOCK_OK : dlock__zk_fail(zb, rc, "stat", path);
}

static int check_nodes(struct zk_backend *zb, struct zk_session *s, const char *lockpath, void *arg)
{
    return for_each_holder(zb, s, lockpath, check_holder, arg);
}

int dlock__zk_check(void *state, const char *name, struct dlock__check_view *view)
{
    return on_lock_path(state, name, check_nodes, view);
}

static int delete_holder(struct zk_backend *zb, struct zk_session *s, const char *path, void *arg)
{
    (void)arg;
    int rc = dlock__zk_rq_delete(zb, s->zh, path, DLOCK__NEVER);
    return rc == ZOK || rc == ZNONODE ? DLOCK_OK : dlock__zk_fail(zb, rc, "delete", path);
}

static int delete_holder_node(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
                              void *arg)
{
    return for_each_holder(zb, s, lockpath, delete_holder, arg);
}

int dlock__zk_force_release(void *state, const char *name)
{
    return on_lock_path(state, name, delete_holder_node, NULL);
}

int dlock__zk_list(void *state, const char *pattern, dlock_list_fn fn, void *arg)
{
    struct zk_backend *zb = state;
    struct zk_session *s;
    int err = dlock__zk_session_get(zb, &s);
    if (err != DLOCK_OK)
        return err;
    struct String_vector kids = {0, NULL};
    int rc = dlock__zk_rq_children(zb, s->zh, zb->base, &kids, DLOCK__NEVER);
    dlock__zk_session_put(zb, s);
    if (rc == ZNONODE)
        return DLOCK_OK;
    if (rc != ZOK)
        return dlock__zk_fail(zb, rc, "list", zb->base);
    const char *prefix = zb->c->opts.key_prefix ? zb->c->opts.key_prefix : "";
    size_t plen = strlen(prefix);
    for (int32_t i = 0; i < kids.count; i++) {
        if (strcmp(zb->base, "/") == 0 && strcmp(kids.data[i], "zookeeper") == 0)
            continue;
        char *name = dlock__name_decode(kids.data[i]);
        if (!name) {
            err = dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
            break;
        }
        bool stop = false;
        if (strncmp(name, prefix, plen) == 0 && name[plen] && dlock__glob(pattern, name + plen))
            stop = fn(name + plen, arg) != 0;
        free(name);
        if (stop)
            break;
    }
    deallocate_String_vector(&kids);
    return err;
}
