/* mutex.c -- Curator's InterProcessMutex recipe on ZooKeeper, and the
 * acquire of InterProcessReadWriteLock's read and write locks, which is the
 * same queue: node names, acquire (create a sequential child, hold when
 * lowest -- a reader when no writer is before it --, else watch the node
 * to wait for), release, and the backend table (inspect, force-release
 * and list are in inspect.c, the downgrade in rwlock.c).
 */
#include "zk.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* --------------------------------------------------------------- naming */

static const char *zk_basename_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* Punctuation kept as it is in a node name (ZooKeeper paths are UTF-8
 * with '/' as the separator): every other byte but ASCII letters, digits,
 * '-' and '_' becomes %XX (dlock__name_encode). */
#define ZK_NAME_KEEP ".~:@+=,"

/* Encode NAME as one node name that never leaves the base path; under
 * "/" the name "zookeeper" (the server's reserved node) is %7Aookeeper. */
static char *encode_name(const char *name, bool at_root)
{
    if (at_root && strcmp(name, "zookeeper") == 0)
        return dlock__strdup("%7Aookeeper");
    return dlock__name_encode(name, ZK_NAME_KEEP, 0);
}

/* Path of the lock node for NAME: <base>/<encoded key_prefix + name>. */
char *dlock__zk_lock_path(struct zk_backend *zb, const char *name)
{
    const char *prefix = zb->c->opts.key_prefix ? zb->c->opts.key_prefix : "";
    char *full = dlock__sprintf("%s%s", prefix, name);
    if (!full)
        return NULL;
    bool root = strcmp(zb->base, "/") == 0;
    char *enc = encode_name(full, root);
    free(full);
    if (!enc)
        return NULL;
    char *path = dlock__sprintf("%s/%s", root ? "" : zb->base, enc);
    free(enc);
    return path;
}

/* Is P a UUID's text, 8-4-4-4-12 hex digits? */
static bool is_uuid(const char *p)
{
    for (int i = 0; i < 36; i++) {
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? p[i] != '-' : !isxdigit((unsigned char)p[i]))
            return false;
    }
    return true;
}

/* The sequence part of a lock child in one of Curator's shapes,
 * "<mark><seq>" or, protected, "_c_<uuid>-<mark><seq>", where <mark> is
 * InterProcessMutex's "lock-", InterProcessReadWriteLock's "__WRIT__" or
 * "__READ__", or LeaderLatch's "latch-" (an election's campaign) and <seq> the 10 digits the server appends to a sequential
 * node; NULL for any other child. *KIND (may be NULL) says which mark.
 * Acquire, status and force-release all go by this, so a child no lock
 * client creates ("y-lock-18446744073709551617", "lock-12") is ignored
 * alike by all of them: it cannot be a contender, and counting it would
 * make status report a holder while acquires succeed (or block the lock
 * for good if it sorted first). Curator sorts every kind on the sequence
 * alone, and so do we: one queue per lock node. */
static const char *zk_node_sequence(const char *node, enum zk_kind *kind)
{
    static const struct {
        const char *mark;
        enum zk_kind kind;
    } marks[] = {
        {ZK_LOCK_MARK, ZK_KIND_LOCK},
        {ZK_WRITE_MARK, ZK_KIND_WRITE},
        {ZK_READ_MARK, ZK_KIND_READ},
        {ZK_LATCH_MARK, ZK_KIND_LATCH},
    };
    size_t pl = strlen(ZK_PROTECTED);
    const char *mark = node;
    if (strncmp(node, ZK_PROTECTED, pl) == 0) {
        if (strlen(node) < pl + 37 || !is_uuid(node + pl) || node[pl + 36] != '-')
            return NULL;
        mark = node + pl + 37;
    }
    for (size_t m = 0; m < sizeof marks / sizeof marks[0]; m++) {
        size_t ml = strlen(marks[m].mark);
        if (strncmp(mark, marks[m].mark, ml) != 0)
            continue;
        const char *seq = mark + ml;
        for (int i = 0; i < 10; i++)
            if (!isdigit((unsigned char)seq[i]))
                return NULL;
        if (seq[10])
            return NULL;
        if (kind)
            *kind = marks[m].kind;
        return seq;
    }
    return NULL;
}

enum zk_kind dlock__zk_node_kind(const char *node)
{
    enum zk_kind kind = ZK_KIND_NONE;
    zk_node_sequence(node, &kind);
    return kind;
}

const char *dlock__zk_mark(const struct zk_backend *zb, dlock_mode mode)
{
    if (mode == DLOCK_SHARED)
        return ZK_READ_MARK;
    return zb->rw_layout ? ZK_WRITE_MARK : ZK_LOCK_MARK;
}

static int cmp_nodes(const void *a, const void *b)
{
    return strcmp(zk_node_sequence(*(char *const *)a, NULL),
                  zk_node_sequence(*(char *const *)b, NULL));
}

/* Keep only lock children in KIDS and sort them by sequence (the owner
 * first). Other children are freed. */
void dlock__zk_sort_lock_nodes(struct String_vector *kids)
{
    int32_t n = 0;
    for (int32_t i = 0; i < kids->count; i++) {
        if (zk_node_sequence(kids->data[i], NULL))
            kids->data[n++] = kids->data[i];
        else
            free(kids->data[i]);
    }
    kids->count = n;
    if (n > 1)
        qsort(kids->data, (size_t)n, sizeof(char *), cmp_nodes);
}

/* Does NODE carry protected-mode GUID ("_c_<guid>-...")? */
bool dlock__zk_node_has_guid(const char *node, const char *guid)
{
    size_t pl = strlen(ZK_PROTECTED), gl = strlen(guid);
    return strncmp(node, ZK_PROTECTED, pl) == 0 && strncmp(node + pl, guid, gl) == 0 &&
           node[pl + gl] == '-';
}


/* --------------------------------------------------------------- acquire */

/* Create the lock node LOCKPATH as a container (persistent when the
 * server has no containers). ZNODEEXISTS counts as done. */
int dlock__zk_create_container(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
                               int64_t until)
{
    pthread_mutex_lock(&zb->mu); /* threads acquiring other names too */
    int mode = zb->no_containers ? ZOO_PERSISTENT : ZOO_CONTAINER;
    pthread_mutex_unlock(&zb->mu);
    int rc = dlock__zk_rq_create(zb, s->zh, lockpath, NULL, mode, NULL, NULL, until);
    if ((rc == ZUNIMPLEMENTED || rc == ZBADARGUMENTS) && mode == ZOO_CONTAINER) {
        pthread_mutex_lock(&zb->mu);
        zb->no_containers = true;
        pthread_mutex_unlock(&zb->mu);
        rc = dlock__zk_rq_create(zb, s->zh, lockpath, NULL, ZOO_PERSISTENT, NULL, NULL, until);
    }
    return rc == ZNODEEXISTS ? ZOK : rc;
}

/* Create the lock node, and first its persistent parents (the base path)
 * if they are missing: the common case, a new name under an existing
 * base, costs one request. Returns a ZooKeeper code; on failure *failed
 * (owned) names the path. */
static int make_parents(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
                        char **failed, int64_t until)
{
    *failed = NULL;
    int rc = dlock__zk_create_container(zb, s, lockpath, until);
    if (rc != ZNONODE) {
        if (rc != ZOK)
            *failed = dlock__strdup(lockpath);
        return rc;
    }
    char *p = dlock__strdup(lockpath);
    if (!p)
        return ZSYSTEMERROR;
    for (char *slash = strchr(p + 1, '/'); slash && rc != ZSYSTEMERROR;
         slash = strchr(slash + 1, '/')) {
        *slash = 0;
        rc = dlock__zk_rq_create(zb, s->zh, p, NULL, ZOO_PERSISTENT, NULL, NULL, until);
        if (rc != ZOK && rc != ZNODEEXISTS) {
            *failed = p;
            return rc;
        }
        *slash = '/';
    }
    rc = dlock__zk_create_container(zb, s, lockpath, until);
    if (rc != ZOK)
        *failed = p;
    else
        free(p);
    return rc;
}

/* Find our node under LOCKPATH after an ambiguous create: the child
 * carrying GUID that is a lock node of MARK's kind and our session's
 * ephemeral node. The guid alone is no proof: anyone who can list the
 * directory can copy it into a node of their own (a persistent one, with
 * a lower sequence), and adopting that would make us "hold" on a node
 * that is not ours. Returns ZOK and sets *node (owned) and *czxid,
 * ZNONODE when none, or an error. */
static int find_guid_node(struct zk_backend *zb, struct zk_session *s, const char *lockpath,
                          const char *guid, const char *mark, char **node, int64_t *czxid,
                          int64_t until)
{
    struct String_vector kids;
    int rc = dlock__zk_rq_children(zb, s->zh, lockpath, &kids, until);
    if (rc != ZOK)
        return rc;
    pthread_mutex_lock(&zb->mu);
    int64_t session_id = s->session_id; /* (the watcher writes it) */
    pthread_mutex_unlock(&zb->mu);
    char probe[64]; /* "<mark><10 digits>": the kind our node is of */
    snprintf(probe, sizeof probe, "%s0000000000", mark);
    enum zk_kind want = dlock__zk_node_kind(probe);
    rc = ZNONODE;
    for (int32_t i = 0; i < kids.count && rc == ZNONODE; i++) {
        if (!dlock__zk_node_has_guid(kids.data[i], guid) ||
            dlock__zk_node_kind(kids.data[i]) != want)
            continue;
        char *path = dlock__sprintf("%s/%s", lockpath, kids.data[i]);
        struct Stat st;
        int erc = path ? dlock__zk_rq_exists(zb, s->zh, path, NULL, NULL, &st, until)
                       : ZSYSTEMERROR;
        if (erc == ZOK && st.ephemeralOwner == session_id && session_id) {
            *node = path;
            *czxid = st.czxid;
            rc = ZOK;
            break;
        }
        free(path);
        if (erc != ZOK && erc != ZNONODE)
            rc = erc;
    }
    deallocate_String_vector(&kids);
    return rc;
}

/* Create our contender node, named RQ->mark (dlock__zk_mark), with
 * RQ->data (NULL: our identity) under RQ->lockpath: RQ->out.node = its
 * full path, RQ->out.czxid its creation zxid; RQ->out.listed says
 * whether RQ->kids holds a listing of the children made right after
 * (caller frees it). Retries a lost reply for up to the op timeout, and
 * never past W's deadline (as zk_rq_* take it); the pauses between
 * tries end at W's cancel (DLOCK_ECANCELED). RQ->once: no pause and no
 * retry (a lost reply is looked for once, then DLOCK_ECONN). */
int dlock__zk_create_contender(struct zk_backend *zb, struct zk_session *s,
                               struct zk_contender *rq, struct dlock__wait *w)
{
    const char *lockpath = rq->lockpath, *mark = rq->mark;
    int64_t until = dlock__wait_deadline(w);
    struct dlock__backoff backoff = {.min_ms = ZK_RETRY_MIN_MS, .max_ms = ZK_RETRY_MAX_MS};
    char guid[37];
    dlock__uuid(guid);
    char *prefix = dlock__sprintf("%s/" ZK_PROTECTED "%s-%s", lockpath, guid, mark);
    if (!prefix)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    int64_t deadline = dlock__zk_call_deadline(zb, until);
    if (!deadline) {
        free(prefix);
        return dlock__err(DLOCK_ETIMEDOUT, "%s: no time left to create a node under %s",
                          zb->servers, lockpath);
    }
    int err = DLOCK_OK;
    bool ambiguous = false; /* a create of ours may have happened unseen */
    for (int attempt = 0;; attempt++) {
        struct zk_create_list cl = {.path = prefix,
                                    .data = rq->data,
                                    .lockpath = lockpath,
                                    .kids = rq->kids,
                                    .until = deadline};
        int rc = dlock__zk_rq_create_and_list(zb, s->zh, &cl);
        rq->out.listed = cl.out.listed;
        if (rc == ZOK) {
            rq->out.node = cl.out.created;
            rq->out.czxid = cl.out.stat.czxid;
            break;
        }
        if (rc == ZNONODE && attempt < 5) {
            char *failed = NULL;
            rc = make_parents(zb, s, lockpath, &failed, deadline);
            if (rc == ZOK || rc == ZNONODE || (dlock__zk_rc_transient(rc) && dlock__now_ms() < deadline)) {
                free(failed);
                continue; /* a container may vanish again: try anew */
            }
            err = dlock__zk_fail(zb, rc, "create", failed ? failed : lockpath);
            free(failed);
            break;
        }
        if (dlock__zk_rc_transient(rc))
            ambiguous = true;
        if (dlock__zk_rc_transient(rc) && dlock__now_ms() < deadline) {
            /* The reply was lost: the node may exist. Look for our guid. */
            char *found = NULL;
            int64_t found_czxid = 0;
            if (find_guid_node(zb, s, lockpath, guid, mark, &found, &found_czxid, deadline) ==
                ZOK) {
                rq->out.node = found;
                rq->out.czxid = found_czxid;
                break;
            }
            int r = rq->once ? DLOCK_ETIMEDOUT : dlock__wait_retry(w, &backoff, deadline);
            if (r == DLOCK_OK)
                continue;
            if (r == DLOCK_ECANCELED) {
                err = dlock__err(r, "%s: wait canceled while creating a node under %s",
                                 zb->servers, lockpath);
                break;
            }
        }
        err = dlock__zk_fail(zb, rc, "create lock node under", lockpath);
        break;
    }
    if (ambiguous)
        dlock__zk_suspect_add(zb, s, lockpath, guid,
                              err == DLOCK_OK ? zk_basename_of(rq->out.node) : NULL);
    free(prefix);
    return err;
}

/* One pass of the recipe: list the contenders and see where Q->mine
 * stands. Returns ZOK with Q->out.pos = 0 (ours) or the index, and the
 * node to wait for in Q->out.pred when not ours; ZNONODE when our node
 * is gone; or an error code. Q->out.holder names the first node. A
 * writer (a "lock-" or "__WRIT__" node) waits for the node just before
 * it, of either kind; a reader ("__READ__") only for the closest writer
 * before it, and holds beside the readers before it (Curator's read
 * lock). */
int dlock__zk_queue_position(struct zk_backend *zb, struct zk_session *s,
                             struct zk_queue_look *q)
{
    const char *lockpath = q->lockpath;
    struct String_vector *given = q->given;
    int *pos = &q->out.pos;
    char **pred = &q->out.pred, **holder = &q->out.holder;
    struct String_vector kids;
    *pred = NULL;
    *holder = NULL;
    const char *me = zk_basename_of(q->mine);
    bool in_given = false;
    for (int32_t i = 0; given && i < given->count && !in_given; i++)
        in_given = strcmp(given->data[i], me) == 0;
    int rc = ZOK;
    if (in_given) { /* the listing made with our create: use it */
        kids = *given;
        given->count = 0;
        given->data = NULL;
    } else {
        rc = dlock__zk_rq_children_synced(zb, s->zh, lockpath, &kids, q->until);
    }
    if (rc != ZOK)
        return rc;
    q->out.marker = false;
    for (int32_t i = 0; i < kids.count && !q->out.marker; i++)
        q->out.marker = strcmp(kids.data[i], ZK_DELAY_NODE) == 0;
    dlock__zk_sort_lock_nodes(&kids);
    rc = ZNONODE;
    bool reader = dlock__zk_node_kind(me) == ZK_KIND_READ;
    for (int32_t i = 0; i < kids.count; i++) {
        if (strcmp(kids.data[i], me) == 0) {
            int32_t before = i - 1;
            while (reader && before >= 0 && dlock__zk_node_kind(kids.data[before]) == ZK_KIND_READ)
                before--;
            *pos = before >= 0 ? i : 0;
            rc = ZOK;
            if (before >= 0)
                *pred = dlock__sprintf("%s/%s", lockpath, kids.data[before]);
            break;
        }
    }
    if (kids.count > 0)
        *holder = dlock__strdup(kids.data[0]);
    if (q->keep && rc == ZOK && *pos > 0) {
        *q->keep = kids;
        kids = (struct String_vector){0, NULL};
    }
    deallocate_String_vector(&kids);
    if (rc == ZOK && *pos > 0 && !*pred)
        rc = ZSYSTEMERROR;
    return rc;
}

int dlock__zk_hold_on(struct zk_backend *zb, struct zk_session *s, struct dlock__hold *h,
                      struct zk_first *f)
{
    struct zk_hold *zh = calloc(1, sizeof *zh);
    if (!zh)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    zh->path = *f->node;
    *f->node = NULL;
    zh->gen = s->gen;
    zh->czxid = f->czxid;
    zh->delay_listed = f->marker;
    h->bdata = zh;
    h->token = (uint64_t)f->czxid;
    snprintf(h->owner, sizeof h->owner, "%s", zk_basename_of(zh->path));
    /* The hold lasts as long as the session: its validity is the
     * negotiated session timeout, whatever lease was asked. */
    pthread_mutex_lock(&zb->mu);
    int64_t session_ms = s->timeout_ms;
    pthread_mutex_unlock(&zb->mu);
    dlock__hold_confirmed_lease(zb->c, h, f->sent, session_ms);
    return DLOCK_OK;
}

/* Give H back after ERR (its message kept). */
static void give_back_keeping(struct zk_backend *zb, struct dlock__hold *h, int err)
{
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    dlock__zk_release(zb, h);
    dlock__errmsg_restore(err, msg);
}

int dlock__zk_delay_first(struct zk_backend *zb, struct dlock__hold *h, const char *lockpath,
                          int64_t *left)
{
    struct zk_session *s;
    *left = 0;
    int err = dlock__zk_hold_session(zb, h, &s);
    if (!err && s) {
        if (((struct zk_hold *)h->bdata)->delay_listed)
            err = dlock__zk_delay_look(zb, s, lockpath, ZK_DELAY_START, left);
        dlock__zk_session_put(zb, s);
    }
    if (err || *left > 0)
        give_back_keeping(zb, h, err);
    return err;
}

int dlock__zk_delay_held(struct zk_backend *zb, struct dlock__hold *h, const char *lockpath)
{
    if (h->mode != DLOCK_EXCLUSIVE || !zb->c->opts.lock_delay_ms)
        return DLOCK_OK;
    int err = dlock__zk_delay_arm(zb, h, lockpath);
    if (err)
        give_back_keeping(zb, h, err);
    else
        ((struct zk_hold *)h->bdata)->delay_armed = true;
    return err;
}

/* The acquire of a lock and its lock-delay (delay.c), looked at once the
 * node came first, and only when the listing that said so showed the
 * marker among the lock node's children (an acquire pays no request for
 * it otherwise): in a delay under way, or finding the last hold ended
 * without its clean release (which starts its delay), the contender
 * gives its node back (its place is lost), sleeps until the delay's end
 * and starts over. */
static int zk_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
{
    struct zk_backend *zb = state;
    char *lockpath = dlock__zk_lock_path(zb, h->name);
    if (!lockpath)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    int err;
    for (;;) {
        err = dlock__zk_acquire_at(zb, lockpath, dlock__zk_mark(zb, h->mode), h, w);
        if (err)
            break;
        int64_t left;
        unsigned seq = dlock__wait_seq(w);
        err = dlock__zk_delay_first(zb, h, lockpath, &left);
        if (!err && left > 0)
            err = dlock__wait_delay(w, seq, left);
        if (err || left <= 0)
            break;
    }
    if (!err)
        err = dlock__zk_delay_held(zb, h, lockpath);
    free(lockpath);
    return err;
}

int dlock__zk_acquire_at(struct zk_backend *zb, const char *lockpath, const char *mark,
                         struct dlock__hold *h, struct dlock__wait *w)
{

    struct zk_session *s = NULL;
    char *mine = NULL, *pred = NULL, *holder = NULL;
    int64_t czxid = 0, created_at = 0;
    struct String_vector first = {0, NULL}; /* listed along with our create */
    bool have_first = false;
    int err;
    bool try_once = dlock__wait_try_once(w);
    int64_t until = dlock__wait_deadline(w); /* every request's timeout is cut to it */
    char msg[DLOCK__MSG_MAX];
    /* registered before anything is sent: a session event or our
     * predecessor's deletion between a look and the sleep is a wake */
    err = dlock__waitset_add(&zb->waiters, w);
    if (err != DLOCK_OK)
        return err;

restart:
    if (s) {
        dlock__zk_session_put(zb, s);
        s = NULL;
    }
    free(mine);
    mine = NULL;
    /* a try-once does not wait for a (re)connection: DLOCK_ECONN at once */
    err = dlock__zk_session_get_w(zb, &s, w);
    if (err != DLOCK_OK)
        goto out;
    deallocate_String_vector(&first);
    first = (struct String_vector){0, NULL};
    created_at = dlock__now_ms();
    unsigned create_seq = dlock__wait_seq(w);
    struct zk_contender contender = {.lockpath = lockpath,
                                     .mark = mark,
                                     .data = h->elect ? h->elect->value : NULL,
                                     .kids = &first};
    err = dlock__zk_create_contender(zb, s, &contender, w);
    mine = contender.out.node;
    czxid = contender.out.czxid;
    have_first = contender.out.listed;
    if ((err == DLOCK_ECONN || err == DLOCK_ETIMEDOUT) && !try_once) {
        /* The create met a disconnect (any node it may have left is a
         * suspect, queued for cleanup): a waiting acquire goes on waiting, as a queued
         * waiter does, and tries again on a reconnection (the watcher
         * wakes us), a second later at the latest, or on a new session. */
        dlock__errmsg_save(msg);
        int r = dlock__wait_sleep(w, create_seq, dlock__now_ms() + 1000);
        if (r == DLOCK_OK)
            goto restart;
        err = r == DLOCK_ECANCELED
                  ? dlock__err(r, "%s: lock '%s': wait canceled", zb->servers, h->name)
                  : dlock__err(r, "%s: lock '%s': timed out waiting (%s)", zb->servers, h->name,
                               msg);
        goto out;
    }
    if (err != DLOCK_OK)
        goto out;

    bool counted_first = false; /* the watches ahead said ours is first (ahead.c) */
    int64_t counted_sent = 0;   /* when they were set */
    for (;;) {
        unsigned seq = dlock__wait_seq(w);
        int64_t sent = counted_first ? counted_sent : have_first ? created_at : dlock__now_ms();
        dlock__waitset_set_key(&zb->waiters, w, NULL); /* pred is about to be freed */
        free(pred);
        free(holder);
        struct String_vector sorted = {0, NULL};
        struct zk_queue_look look = {.lockpath = lockpath,
                                     .mine = mine,
                                     .given = have_first ? &first : NULL,
                                     .keep = try_once ? NULL : &sorted,
                                     .until = until};
        /* no look when the count said it: pos 0, no marker listed (none made since) */
        int rc = counted_first ? ZOK : dlock__zk_queue_position(zb, s, &look);
        counted_first = false;
        int pos = look.out.pos;
        pred = look.out.pred;
        holder = look.out.holder;
        have_first = false;
        if (rc == ZNONODE || dlock__zk_rc_session_gone(rc)) {
            /* Our node vanished (session expired, or someone deleted it
             * while we waited): start over if time allows. */
            if (!try_once && dlock__time_left(until, 1) > 0)
                goto restart;
            err = dlock__err(DLOCK_ECONN, "%s: lock '%s': our node %s vanished while waiting",
                             zb->servers, h->name, mine);
            goto out_delete;
        }
        if (dlock__zk_rc_transient(rc) && !try_once) {
            /* Disconnected: the session (and our place) may survive.
             * Wait for a reconnect (the watcher wakes us) and look again. */
            int r = dlock__wait_sleep(w, seq, dlock__now_ms() + 1000);
            if (r == DLOCK_OK)
                continue;
            err = r == DLOCK_ECANCELED
                      ? dlock__err(r, "%s: lock '%s': wait canceled", zb->servers, h->name)
                      : dlock__err(r, "%s: lock '%s': timed out waiting (disconnected: %s)",
                                   zb->servers, h->name, zerror(rc));
            goto out_delete;
        }
        if (rc != ZOK) {
            err = dlock__zk_fail(zb, rc, "list", lockpath);
            goto out_delete;
        }
        if (pos == 0) {
            struct zk_first first_look = {
                .node = &mine, .czxid = czxid, .sent = sent, .marker = look.out.marker};
            err = dlock__zk_hold_on(zb, s, h, &first_look);
            if (err)
                goto out_delete;
            goto out;
        }
        if (try_once) {
            err = dlock__err(DLOCK_EBUSY, "%s: lock '%s' is held by node %s/%s", zb->servers,
                             h->name, lockpath, holder ? holder : "?");
            goto out_delete;
        }
        pthread_mutex_lock(&zb->mu); /* the watcher writes it on each connect */
        int64_t timeout = s->timeout_ms > 0 ? s->timeout_ms : zb->c->opts.lease_ms;
        pthread_mutex_unlock(&zb->mu);
        /* Few nodes ahead (and no lock-delay marker to read): watch them
         * all and learn from their deletions that ours is first. */
        struct zk_ahead *ahead = NULL;
        if (!look.out.marker && sorted.count) {
            struct zk_ahead_view v = {
                .lockpath = lockpath, .mine = mine, .kids = sorted.data, .pos = pos};
            ahead = dlock__zk_ahead_watch(zb, s, &v, w, until);
        }
        deallocate_String_vector(&sorted);
        int r;
        if (ahead) {
            r = dlock__zk_ahead_wait(zb, ahead, timeout, &counted_first);
            counted_sent = ahead->sent;
            dlock__zk_ahead_free(zb, ahead);
        } else {
            /* Watch only our predecessor; if it is already gone, look again. */
            dlock__waitset_set_key(&zb->waiters, w, pred);
            struct Stat st;
            rc = dlock__zk_rq_exists(zb, s->zh, pred, dlock__zk_watcher, s, &st, until);
            if (rc == ZNONODE)
                continue;
            if (rc != ZOK && !dlock__zk_rc_transient(rc) && !dlock__zk_rc_session_gone(rc)) {
                err = dlock__zk_fail(zb, rc, "watch", pred);
                goto out_delete;
            }
            /* Sleep until the predecessor goes, the session changes, or a
             * session timeout passes (safety net for a lost notification). */
            r = dlock__wait_sleep(w, seq, dlock__now_ms() + (rc == ZOK ? timeout : 200));
        }
        if (r == DLOCK_ETIMEDOUT) {
            err = dlock__err(DLOCK_ETIMEDOUT, "%s: lock '%s': timed out waiting behind node %s",
                             zb->servers, h->name, pred);
            goto out_delete;
        }
        if (r == DLOCK_ECANCELED) {
            err = dlock__err(DLOCK_ECANCELED, "%s: lock '%s': wait canceled", zb->servers,
                             h->name);
            goto out_delete;
        }
        if (r != DLOCK_OK) {
            err = r;
            goto out_delete;
        }
        pthread_mutex_lock(&zb->mu);
        bool usable = dlock__zk_session_usable(s);
        pthread_mutex_unlock(&zb->mu);
        if (!usable)
            goto restart;
    }

out_delete:
    if (mine)
        dlock__zk_give_back_node(zb, s, mine, w, err);
out:
    dlock__waitset_remove(&zb->waiters, w);
    deallocate_String_vector(&first);
    if (s)
        dlock__zk_session_put(zb, s);
    free(mine);
    free(pred);
    free(holder);
    return err;
}

/* --------------------------------------------------------------- release */

int dlock__zk_release(void *state, struct dlock__hold *h)
{
    struct zk_backend *zb = state;
    struct zk_session *s;
    int err = dlock__zk_hold_session(zb, h, &s);
    struct zk_hold *zh = h->bdata;
    h->bdata = NULL;
    if (!zh)
        return err;
    if (s && zh->delay_armed) { /* a clean release: its marker goes first, while we hold */
        char *lockpath = dlock__zk_lock_path(zb, h->name);
        if (lockpath)
            dlock__zk_delay_clear(zb, lockpath, h->token);
        free(lockpath);
    }
    if (!s) {
        dlock__zk_shadow_drop(zb, NULL, zh); /* it went with the session */
    } else {
        dlock__zk_shadow_drop(zb, s, zh); /* before the write node: never a reader left alone */
        int64_t deadline = dlock__zk_call_deadline(zb, DLOCK__NEVER);
        int rc;
        bool unheard = false; /* a delete of ours may have been executed */
        struct dlock__backoff backoff = {.min_ms = ZK_RETRY_MIN_MS, .max_ms = ZK_RETRY_MAX_MS};
        for (;;) {
            rc = dlock__zk_rq_delete(zb, s->zh, zh->path, deadline);
            if (!dlock__zk_rc_transient(rc))
                break;
            unheard = true;
            if (dlock__wait_retry(NULL, &backoff, deadline) != DLOCK_OK)
                break;
        }
        /* "No node" after a delete whose reply was lost: most likely that
         * delete did it (the node was there when we sent it, else the
         * keeper would have said so); the release succeeded. */
        if (rc == ZNONODE && unheard)
            rc = ZOK;
        if (rc == ZNONODE)
            err = dlock__err(DLOCK_ELOST,
                             "%s: lock '%s': node %s was already gone (force-released?)",
                             zb->servers, h->name, zh->path);
        else if (dlock__zk_rc_session_gone(rc))
            err = dlock__err(DLOCK_ELOST, "%s: lock '%s': session expired before release",
                             zb->servers, h->name);
        else if (rc != ZOK) {
            err = dlock__zk_fail(zb, rc, "delete", zh->path);
            dlock__zk_orphan_add(zb, s, zh->path);
        }
        dlock__zk_session_put(zb, s);
    }
    free(zh->path);
    free(zh);
    return err;
}


/* The lock ops' release_within (backend.h): the hold's node (and a shadow
 * read node) deleted within DEADLINE by cleanup.c's
 * dlock__zk_delete_own_node_by -- nothing is sent once it has passed or
 * while the session is not connected, and a delete not done by then is
 * owed to the cleanup queue (the keeper does it; the session's end takes
 * the node anyway). The node is this hold's own sequential node: a later
 * hold of the same owner has a node of its own, which the owed delete
 * never touches. A node found already gone is not reported lost here. */
int dlock__zk_release_within(void *state, struct dlock__hold *h, int64_t deadline)
{
    struct zk_backend *zb = state;
    struct zk_hold *zh = h->bdata;
    struct zk_session *s;
    if (dlock__zk_hold_session(zb, h, &s))
        return dlock__zk_release(state, h); /* nothing to send: it says why */
    h->bdata = NULL;
    if (zh->shadow) /* before the write node: never a reader left alone */
        dlock__zk_delete_own_node_by(zb, s, zh->shadow, deadline, NULL);
    dlock__zk_delete_own_node_by(zb, s, zh->path, deadline, NULL);
    dlock__zk_session_put(zb, s);
    free(zh->shadow);
    free(zh->path);
    free(zh);
    return DLOCK_OK;
}

/* ----------------------------------------------------------------- table */

static const char *const zk_schemes[] = {"zk", NULL};

static const struct dlock__lock_ops zk_lock_ops = {
    .acquire = zk_acquire,
    .release = dlock__zk_release,
    .release_within = dlock__zk_release_within,
    .downgrade = dlock__zk_downgrade,
    .share = dlock__zk_share,
    .try_armed = dlock__zk_try_armed,
    .disarm = dlock__zk_disarm,
};

static const struct dlock__sem_ops zk_sem_ops = {
    .acquire = dlock__zk_sem_acquire,
    .release = dlock__zk_sem_release,
    .try_armed = dlock__zk_sem_try_armed,
    .disarm = dlock__zk_sem_disarm,
    .inspect = dlock__zk_sem_inspect,
    .list = dlock__zk_list, /* the base's nodes, locks and semaphores alike */
};

static const struct dlock__elect_ops zk_elect_ops = {
    .acquire = dlock__zk_elect_acquire,
    .release = dlock__zk_release,
    .proclaim = dlock__zk_elect_proclaim,
    .observe = dlock__zk_elect_observe,
    .try_armed = dlock__zk_try_armed, /* the recipe's, with a latch node (async.c) */
    .disarm = dlock__zk_disarm,
};

static const struct dlock__admin_ops zk_admin_ops = {
    .inspect = dlock__zk_inspect,
    .check = dlock__zk_check,
    .force_release = dlock__zk_force_release,
    .list = dlock__zk_list,
};

const struct dlock__backend dlock__backend_zk = {
    .name = "zk",
    .schemes = zk_schemes,
    .caps = DLOCK__CAP_SHARED | DLOCK__CAP_LEASES | DLOCK__CAP_FAIR | DLOCK__CAP_LOCK_DELAY |
            DLOCK__CAP_CLIENT_OWNER,
    .default_port = ZK_DEFAULT_PORT,
    .open = dlock__zk_open,
    .close = dlock__zk_close,
    .renew = dlock__zk_renew,
    .locks = &zk_lock_ops,
    .semaphores = &zk_sem_ops,
    .elections = &zk_elect_ops,
    .admin = &zk_admin_ops,
    .values = &dlock__zk_value_ops,
    .contend = &dlock__zk_contend_ops,
    .guarded = &dlock__zk_guarded_ops,
};
