/* semaphore.c -- the ZooKeeper backend's counting semaphore, on the
 * layout of Curator's InterProcessSemaphoreV2, so Curator clients and
 * dlock share the leases of one path.
 *
 * Semaphore NAME lives at P = dlock__zk_lock_path(NAME), with two children:
 * P/locks, an InterProcessMutex (Curator's lock nodes, taken with this
 * backend's own mutex recipe), and P/leases, whose EPHEMERAL_SEQUENTIAL
 * children "_c_<guid>-lease-<seq>" are the permits held. To take K
 * permits a client takes the mutex, creates K lease nodes (one guid for
 * all K), and, still holding the mutex, waits until P/leases has at most
 * N children (a child watch wakes it); then it lets the mutex go. So
 * acquirers queue in order behind the mutex and K permits are taken all
 * at once. A release deletes the lease nodes; a dead client's go with its
 * session. The fencing token is the first lease node's czxid; the
 * keeper checks that node as it checks a lock's (session.c), and the
 * other K - 1 with it (dlock__zk_sem_check_send/_end, in the same
 * pipeline as the batch's other checks): a permit of K is lost
 * when any of its nodes is.
 *
 * Curator stores no permit count (each client brings its own maxLeases),
 * so a semaphore used with two counts is not detected here.
 *
 * An asynchronous acquire parks both waits (the mutex's queue, the
 * leases' child watch) instead of sleeping in a thread: see
 * dlock__zk_sem_try_armed() below.
 */
#include "zk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEASE_MARK "lease-"

/* A permit's hold data: base first (dlock__zk_renew and dlock__zk_release read it as a
 * zk_hold on the first lease node), then the other K - 1 nodes. */
struct zk_sem_hold {
    struct zk_hold base;
    char **more;
    unsigned nmore;
};

static void free_more(struct zk_sem_hold *sh)
{
    for (unsigned i = 0; i < sh->nmore; i++)
        free(sh->more[i]);
    free(sh->more);
    sh->more = NULL;
    sh->nmore = 0;
}

/* Create one lease node under LEASES (making it when missing) with GUID:
 * its path in *OUT, its czxid in *CZXID. A ZooKeeper code. */
static int create_lease(struct zk_backend *zb, struct zk_session *s, const char *leases,
                        const char *guid, char **out, int64_t *czxid, int64_t until)
{
    char *prefix = dlock__sprintf("%s/" ZK_PROTECTED "%s-" LEASE_MARK, leases, guid);
    if (!prefix)
        return ZSYSTEMERROR;
    int rc = ZNONODE;
    for (int attempt = 0; rc == ZNONODE && attempt < 3; attempt++) {
        struct Stat st;
        rc = dlock__zk_rq_create(zb, s->zh, prefix, zb->ident, ZOO_EPHEMERAL_SEQUENTIAL, out, &st, until);
        if (rc == ZOK)
            *czxid = st.czxid;
        else if (rc == ZNONODE)
            dlock__zk_create_container(zb, s, leases, until);
    }
    free(prefix);
    return rc;
}

/* Give up the lease nodes PATHS[0..N) (and free them) of wait W that
 * failed with ERR (dlock__zk_give_back_node), so the caller never waits
 * past it. */
static void delete_leases(struct zk_backend *zb, struct zk_session *s, char **paths, unsigned n,
                          struct dlock__wait *w, int err)
{
    for (unsigned i = 0; i < n; i++) {
        dlock__zk_give_back_node(zb, s, paths[i], w, err);
        free(paths[i]);
    }
}

/* The K lease nodes of one acquire, made in session S (a reference). */
struct zk_leases {
    struct zk_session *s;
    char **paths;
    unsigned made;
    int64_t czxid; /* the first one's */
};

/* Create L's K lease nodes under LEASES, one new guid for all, by UNTIL. */
static int leases_make(struct zk_backend *zb, const char *leases, unsigned k, struct zk_leases *l,
                       int64_t until)
{
    if (!(l->paths = calloc(k, sizeof *l->paths)))
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    char guid[37];
    dlock__uuid(guid);
    for (; l->made < k; l->made++) {
        int64_t z = 0;
        int rc = create_lease(zb, l->s, leases, guid, &l->paths[l->made], &z, until);
        if (rc != ZOK) {
            if (dlock__zk_rc_transient(rc)) /* it may exist: sweep our guid later */
                dlock__zk_suspect_add(zb, l->s, leases, guid, NULL);
            return dlock__zk_fail(zb, rc, "create lease under", leases);
        }
        if (l->made == 0)
            l->czxid = z;
    }
    return DLOCK_OK;
}

/* One look whether L's leases fit in H's permits among LEASES' children,
 * leaving a child watch whose event wakes W (keyed by LEASES): DLOCK_OK
 * (they fit; *SENT: when the listing that said so was asked),
 * DLOCK_EBUSY (not yet), or a failure. */
static int leases_fit(struct zk_backend *zb, const struct dlock__hold *h, const char *leases,
                      struct dlock__wait *w, struct zk_leases *l, int64_t *sent)
{
    unsigned n = h->sem->permits;
    dlock__waitset_set_key(&zb->waiters, w, leases);
    struct String_vector kids = {0, NULL};
    *sent = dlock__now_ms(); /* the listing that lets us in confirms the leases */
    int rc = dlock__zk_rq_children_watch(zb, l->s->zh, leases, dlock__zk_watcher, l->s, &kids,
                                         dlock__wait_deadline(w));
    int32_t count = kids.count;
    deallocate_String_vector(&kids);
    if (rc != ZOK)
        return dlock__zk_fail(zb, rc, "list", leases);
    if (count <= (int32_t)n)
        return DLOCK_OK;
    return dlock__err(DLOCK_EBUSY, "%s: semaphore '%s': %d leases under %s, %u permits",
                      zb->servers, h->name, count, leases, n);
}

/* H holds L's leases, confirmed by a listing sent at SENT: its hold data
 * takes L's paths. */
static int leases_keep(struct zk_backend *zb, struct dlock__hold *h, struct zk_leases *l,
                       int64_t sent)
{
    struct zk_sem_hold *sh = calloc(1, sizeof *sh);
    if (!sh)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    unsigned k = l->made;
    char **paths = l->paths;
    l->paths = NULL;
    l->made = 0;
    sh->base.path = paths[0];
    sh->base.gen = l->s->gen;
    sh->base.czxid = l->czxid;
    sh->more = paths; /* paths[1..k) */
    memmove(paths, paths + 1, (k - 1) * sizeof *paths);
    sh->nmore = k - 1;
    h->bdata = sh;
    h->token = (uint64_t)l->czxid;
    const char *slash = strrchr(sh->base.path, '/');
    snprintf(h->owner, sizeof h->owner, "%s", slash ? slash + 1 : sh->base.path);
    pthread_mutex_lock(&zb->mu);
    int64_t session_ms = l->s->timeout_ms;
    pthread_mutex_unlock(&zb->mu);
    dlock__hold_confirmed_lease(zb->c, h, sent, session_ms);
    return DLOCK_OK;
}

/* The end of L: the leases it still has given back (wait W ended with
 * ERR), its session let go. */
static void leases_end(struct zk_backend *zb, struct zk_leases *l, struct dlock__wait *w, int err)
{
    if (l->paths)
        delete_leases(zb, l->s, l->paths, l->made, w, err);
    free(l->paths);
    l->paths = NULL;
    if (l->s)
        dlock__zk_session_put(zb, l->s);
    l->s = NULL;
}

/* How long a wait for leases sleeps without an event: a session timeout
 * (the blocking wait's safety net for a lost one). */
static int64_t leases_look_ms(struct zk_backend *zb, const struct zk_session *s)
{
    pthread_mutex_lock(&zb->mu);
    int64_t timeout = s->timeout_ms > 0 ? s->timeout_ms : zb->c->opts.lease_ms;
    pthread_mutex_unlock(&zb->mu);
    return timeout;
}

/* Under the mutex: create K leases, then wait until they fit in N. */
static int take_leases(struct zk_backend *zb, struct dlock__hold *h, const char *leases,
                       struct dlock__wait *w)
{
    struct zk_leases l = {0};
    int err = dlock__zk_session_get_w(zb, &l.s, w);
    if (err)
        return err;
    err = leases_make(zb, leases, h->sem->k, &l, dlock__wait_deadline(w));
    int64_t sent = 0;
    while (!err) {
        unsigned seq = dlock__wait_seq(w);
        err = leases_fit(zb, h, leases, w, &l, &sent);
        if (err != DLOCK_EBUSY || dlock__wait_try_once(w))
            break;
        err = dlock__wait_sleep(w, seq, dlock__now_ms() + leases_look_ms(zb, l.s));
        if (err == DLOCK_ETIMEDOUT || err == DLOCK_ECANCELED)
            err = dlock__err(err, "%s: semaphore '%s': %s", zb->servers, h->name,
                             err == DLOCK_ECANCELED ? "wait canceled"
                                                    : "timed out waiting for a lease");
    }
    dlock__waitset_set_key(&zb->waiters, w, NULL);
    if (!err)
        err = leases_keep(zb, h, &l, sent);
    leases_end(zb, &l, w, err);
    return err;
}

int dlock__zk_sem_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
{
    struct zk_backend *zb = state;
    char *path = dlock__zk_lock_path(zb, h->name);
    char *locks = path ? dlock__sprintf("%s/locks", path) : NULL;
    char *leases = path ? dlock__sprintf("%s/leases", path) : NULL;
    int err = locks && leases ? DLOCK_OK : dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    /* Curator's mutex on P/locks first: a hold of our own, never
     * registered with the core, let go as soon as the leases fit. */
    struct dlock__hold mutex = {.name = h->name, .mode = DLOCK_EXCLUSIVE, .count = 1,
                                .lease_ms = h->lease_ms, .valid_until = DLOCK__NEVER,
                                .renew_at = DLOCK__NEVER};
    if (!err)
        err = dlock__zk_acquire_at(zb, locks, ZK_LOCK_MARK, &mutex, w); /* InterProcessMutex */
    if (!err) {
        if ((err = dlock__waitset_add(&zb->waiters, w)) == DLOCK_OK) {
            err = take_leases(zb, h, leases, w);
            dlock__waitset_remove(&zb->waiters, w);
        }
        char msg[DLOCK__MSG_MAX];
        dlock__errmsg_save(msg);
        /* a wait that failed lets the mutex go within what is left of
         * it, like its leases: the rest is owed to the cleanup queue */
        if (err)
            dlock__zk_release_within(zb, &mutex, dlock__zk_give_up_deadline(w, err));
        else
            dlock__zk_release(zb, &mutex);
        dlock__errmsg_restore(err, msg);
    }
    free(path);
    free(locks);
    free(leases);
    return err;
}

/* A parked permit wait (backend.h: try_armed): the blocking acquire's
 * two waits, each cut into attempts that never sleep. Curator's mutex on
 * P/locks is queued and waited for as a lock's parked wait is (async.c,
 * dlock__zk_park_at: its node keeps its place, the watch on the node
 * ahead wakes it); once it is ours, the K leases are made and each
 * attempt lists P/leases with a child watch, whose event (a lease
 * deleted: a release, a session gone) wakes the parked wait, until they
 * fit. disarm() lets the mutex go (within what is left of the wait when
 * it failed, as the blocking acquire does) and gives back the leases of
 * a wait that did not succeed. */
struct zk_sem_park {
    struct dlock__hold mutex; /* ours, never registered with the core */
    void *mutex_park;         /* its wait's (async.c) */
    bool in;                  /* the mutex is ours, the leases are made */
    char *locks, *leases;
    struct zk_leases l;
};

static void sem_park_free(struct zk_sem_park *p)
{
    free(p->locks);
    free(p->leases);
    free(p);
}

int dlock__zk_sem_try_armed(void *state, struct dlock__hold *h, struct dlock__wait *w, void **park)
{
    struct zk_backend *zb = state;
    struct zk_sem_park *p = *park;
    if (!p) {
        char *path = dlock__zk_lock_path(zb, h->name);
        if ((p = path ? calloc(1, sizeof *p) : NULL)) {
            p->locks = dlock__sprintf("%s/locks", path);
            p->leases = dlock__sprintf("%s/leases", path);
        }
        free(path);
        if (!p || !p->locks || !p->leases) {
            if (p)
                sem_park_free(p);
            return dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
        }
        p->mutex = (struct dlock__hold){.name = h->name, .mode = DLOCK_EXCLUSIVE, .count = 1,
                                        .lease_ms = h->lease_ms, .valid_until = DLOCK__NEVER,
                                        .renew_at = DLOCK__NEVER};
        *park = p;
    }
    int err;
    if (!p->in) {
        err = dlock__zk_park_at(zb, p->locks, ZK_LOCK_MARK, &p->mutex, w, &p->mutex_park);
        if (err)
            return err;
        p->in = true;
        if ((err = dlock__zk_session_get_now(zb, &p->l.s)) ||
            (err = leases_make(zb, p->leases, h->sem->k, &p->l, dlock__wait_deadline(w))))
            return err;
    }
    int64_t sent = 0;
    err = leases_fit(zb, h, p->leases, w, &p->l, &sent);
    if (err == DLOCK_EBUSY)
        dlock__wait_retry_at(w, dlock__now_ms() + leases_look_ms(zb, p->l.s));
    return err ? err : leases_keep(zb, h, &p->l, sent);
}

int dlock__zk_sem_disarm(void *state, struct dlock__hold *h, struct dlock__wait *w, void *park,
                         int rc)
{
    (void)h;
    struct zk_backend *zb = state;
    struct zk_sem_park *p = park;
    if (!p)
        return rc;
    char msg[DLOCK__MSG_MAX];
    dlock__errmsg_save(msg);
    dlock__waitset_set_key(&zb->waiters, w, NULL);
    leases_end(zb, &p->l, w, rc);
    if (p->in && rc)
        dlock__zk_release_within(zb, &p->mutex, dlock__zk_give_up_deadline(w, rc));
    else if (p->in)
        dlock__zk_release(zb, &p->mutex);
    dlock__errmsg_restore(rc, msg);
    /* the mutex's wait: its node given back unless it was ours, W out of
     * the waiters; while it waited for the mutex, its words say why */
    if (p->mutex_park) {
        int mrc = dlock__zk_disarm(zb, &p->mutex, w, p->mutex_park, p->in ? DLOCK_OK : rc);
        if (!p->in)
            rc = mrc;
        else
            dlock__errmsg_restore(rc, msg);
    }
    sem_park_free(p);
    return rc;
}

int dlock__zk_sem_release(void *state, struct dlock__hold *h)
{
    struct zk_backend *zb = state;
    struct zk_sem_hold *sh = h->bdata;
    if (sh && sh->nmore) {
        struct zk_session *s = NULL;
        if (dlock__zk_session_get(zb, &s) == DLOCK_OK) {
            int64_t deadline = dlock__zk_call_deadline(zb, DLOCK__NEVER);
            for (unsigned i = 0; i < sh->nmore; i++) {
                int rc = dlock__zk_rq_delete(zb, s->zh, sh->more[i], deadline);
                if (dlock__zk_rc_transient(rc))
                    dlock__zk_orphan_add(zb, s, sh->more[i]); /* the keeper deletes it */
            }
            dlock__zk_session_put(zb, s);
        }
        dlock__err(DLOCK_OK, "%s", ""); /* the first node's release says how it went */
    }
    if (sh)
        free_more(sh);
    return dlock__zk_release(state, h); /* the first node; frees SH */
}

int dlock__zk_sem_check_send(struct zk_backend *zb, zhandle_t *zh, const struct dlock__hold *h,
                             struct zk_call ***calls)
{
    const struct zk_sem_hold *sh = h->bdata;
    *calls = NULL;
    if (!sh || !sh->nmore)
        return DLOCK_OK;
    if (!(*calls = calloc(sh->nmore, sizeof **calls)))
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    for (unsigned i = 0; i < sh->nmore; i++) {
        struct zk_call *k = dlock__zk_call_new(zh);
        int rc = k ? zoo_aexists(zh, sh->more[i], 0, dlock__zk_on_stat, k) : ZSYSTEMERROR;
        if (rc != ZOK) {
            if (k)
                dlock__zk_call_dead(k, rc);
            return dlock__zk_fail(zb, rc, "check", sh->more[i]);
        }
        (*calls)[i] = k;
    }
    return DLOCK_OK;
}

int dlock__zk_sem_check_end(struct zk_backend *zb, const struct dlock__hold *h,
                            struct zk_call **calls, int err, int64_t session_id, int64_t deadline)
{
    const struct zk_sem_hold *sh = h->bdata;
    for (unsigned i = 0; calls && i < sh->nmore; i++) {
        if (!calls[i])
            continue;
        struct Stat st;
        int rc = dlock__zk_call_wait(calls[i], deadline, &st, NULL, NULL);
        if (err)
            continue;
        if (rc == ZNONODE || (rc == ZOK && st.ephemeralOwner != session_id))
            err = dlock__err(DLOCK_ELOST,
                             "%s: semaphore '%s': lease node %s of permit %s is gone (deleted "
                             "or force-released)",
                             zb->servers, h->name, sh->more[i], h->owner);
        else if (dlock__zk_rc_session_gone(rc))
            err = dlock__err(DLOCK_ELOST,
                             "%s: semaphore '%s': the ZooKeeper session holding it expired",
                             zb->servers, h->name);
        else if (rc != ZOK)
            err = dlock__zk_fail(zb, rc, "check", sh->more[i]);
    }
    free(calls);
    return err;
}

/* The sequence of lease node KID: what follows its last '-' (ZooKeeper's
 * ten zero-padded digits, so they compare as strings). */
static const char *lease_seq(const char *kid)
{
    const char *dash = strrchr(kid, '-');
    return dash ? dash + 1 : kid;
}

/* Whether lease nodes A and B are of one permit object (one guid). */
static bool same_permit(const char *a, const char *b)
{
    size_t pl = strlen(ZK_PROTECTED);
    return strncmp(a, ZK_PROTECTED, pl) == 0 && strncmp(a, b, pl + 36) == 0;
}

/* The lease node of KIDS a waiter made (NULL: none waits). Curator's
 * waiter creates its nodes before it is let in, holding the mutex, and
 * waits until P/leases has at most PERMITS children: with more, the
 * newest node's permit object is that waiter's (only the mutex holder
 * creates). Unknown without PERMITS (Curator stores no count). */
static const char *waiting_lease(const struct String_vector *kids, unsigned permits)
{
    if (!permits || kids->count <= (int32_t)permits)
        return NULL;
    const char *newest = kids->data[0];
    for (int32_t i = 1; i < kids->count; i++)
        if (strcmp(lease_seq(kids->data[i]), lease_seq(newest)) > 0)
            newest = kids->data[i];
    return newest;
}

/* The acquirers queued on P/locks, in order, as the waiters of INFO: the
 * first of them is the one waiting for a permit with its lease nodes. */
static int sem_waiters(struct zk_backend *zb, struct zk_session *s, const char *path,
                       struct dlock_info *info)
{
    char *locks = dlock__sprintf("%s/locks", path);
    if (!locks)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    struct String_vector kids = {0, NULL};
    int err = DLOCK_OK, rc = dlock__zk_rq_children(zb, s->zh, locks, &kids, DLOCK__NEVER);
    if (rc != ZOK && rc != ZNONODE)
        err = dlock__zk_fail(zb, rc, "list", locks);
    info->nwaiters = 0;
    dlock__zk_sort_lock_nodes(&kids);
    for (int32_t i = 0; !err && i < kids.count; i++)
        err = dlock__info_add_waiter(info, kids.data[i]);
    deallocate_String_vector(&kids);
    free(locks);
    return err;
}

int dlock__zk_sem_inspect(void *state, const char *name, unsigned permits, struct dlock_info *info)
{
    struct zk_backend *zb = state;
    char *path = dlock__zk_lock_path(zb, name);
    char *leases = path ? dlock__sprintf("%s/leases", path) : NULL;
    if (!leases) {
        free(path);
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", zb->servers);
    }
    dlock__info_set_key(info, path);
    info->permits = permits;
    info->free_permits = permits ? (long)permits : -1;
    struct zk_session *s = NULL;
    int err = dlock__zk_session_get(zb, &s);
    struct String_vector kids = {0, NULL};
    int rc = err ? ZOK : dlock__zk_rq_children(zb, s->zh, leases, &kids, DLOCK__NEVER);
    if (!err && rc != ZOK && rc != ZNONODE)
        err = dlock__zk_fail(zb, rc, "list", leases);
    const char *waiter = err ? NULL : waiting_lease(&kids, permits);
    /* One holder per permit object: its lease nodes share a guid. */
    for (int32_t i = 0; !err && i < kids.count; i++) {
        const char *kid = kids.data[i];
        if (waiter && (kid == waiter || same_permit(kid, waiter)))
            continue; /* a waiter's, not held yet */
        bool counted = false;
        for (size_t j = 0; j < info->nholders; j++)
            if (same_permit(kid, info->holders[j].id)) {
                info->holders[j].count++;
                counted = true;
                /* its id is its first node's (dlock_permit_id), the lowest
                 * sequence; the children come in no order */
                char *first = strcmp(kid, info->holders[j].id) < 0 ? dlock__strdup(kid) : NULL;
                if (first) {
                    free(info->holders[j].id);
                    info->holders[j].id = first;
                }
            }
        if (!counted)
            err = dlock__info_add_holder(info, kid, 1);
        info->held = 1;
        if (permits)
            info->free_permits--;
    }
    if (permits && info->free_permits < 0)
        info->free_permits = 0; /* more held than this count says: none free */
    if (!err)
        err = sem_waiters(zb, s, path, info);
    deallocate_String_vector(&kids);
    if (s)
        dlock__zk_session_put(zb, s);
    free(path);
    free(leases);
    return err;
}
