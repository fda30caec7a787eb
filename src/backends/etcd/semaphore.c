/* semaphore.c -- the etcd backend's counting semaphore, on a layout of
 * our own (etcd's Go recipes have none), in the manner of its Mutex.
 *
 * A permit object of semaphore NAME is one key
 * "<prefix>NAME/sem/<lease hex>_<serial hex>" on the hold's lease, whose
 * value "<k> dlock <pid>@<host>" says how many permits it takes. The keys
 * under "<prefix>NAME/sem/" queue in create-revision order, and a key
 * holds its permits when its own K plus the K of every older key fit in
 * N: once in, a key stays in until it goes (only older keys count, and
 * they only leave). The fencing token is the key's create revision. The
 * '_' keeps these keys apart from every lock's contenders (hex, or
 * hex-hex: queue.c), the "sem/" from the keys of lock NAME.
 *
 * The count N is stored in "<prefix>NAME/sem-count" (no lease), written
 * by the first acquire in a transaction that creates it only if absent;
 * every acquire puts its key only if the stored count is its own, so a
 * semaphore used with two counts is refused (DLOCK_EINVAL naming both).
 *
 * A waiter watches the whole "NAME/sem/" prefix for deletions from the
 * revision of its last look on: any key given back may let it in (a watch
 * of the key N places before it would miss the releases of other
 * holders), and a watch from that revision misses nothing in between.
 * Leases, renewal by the keeper, release and the check that a held key is
 * still ours are the lock's (mutex.c, lease.c): a permit's hold data is a
 * struct etcd_hold. A waiting key hangs on the client's short waiters'
 * lease, as the lock's do, so a killed waiter holds the queue up for that
 * lease (2 s), not for the hold's; once in, it goes back to the hold's
 * lease (a put keeps its create revision). Unlike the lock's, it is
 * created on the hold's lease and moved by the next request: whether it
 * holds is known only once it is put, and a permit beside other holders
 * costs one round trip; a waiter killed between the two holds the queue
 * up for the hold lease. A key whose put may have happened without
 * its reply, and a key left by a wait that gave up, go through the core's
 * cleanup queue (dlock__etcd_delete_key).
 */
#include "etcd.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEM_DIR "sem/"
#define SEM_COUNT "sem-count"
#define GIVE_UP_GRACE_MS 1000 /* a give-up's delete while the member answers */
#define RESTART ETCD_RESTART  /* our key or lease vanished; start again */

/* Keys of semaphore NAME: the queue's prefix and the stored count. */
struct sem_keys {
    char *dir;   /* "<prefix>NAME/sem/" */
    char *count; /* "<prefix>NAME/sem-count" */
};

static int sem_keys_make(struct etcd_backend *s, const char *name, struct sem_keys *k)
{
    k->dir = dlock__sprintf("%s%s/" SEM_DIR, s->prefix, name);
    k->count = dlock__sprintf("%s%s/" SEM_COUNT, s->prefix, name);
    if (!k->dir || !k->count) {
        free(k->dir);
        free(k->count);
        return dlock__etcd_nomem(s);
    }
    return DLOCK_OK;
}

static void sem_keys_free(struct sem_keys *k)
{
    free(k->dir);
    free(k->count);
}

/* KV is a permit key directly under DIR ("<hex>_<hex>"): *ID points at
 * its part after DIR (in the decoded key, caller frees *KEY). */
static bool permit_key(const char *dir, const json_t *kv, char **key, const char **id)
{
    *key = dlock__etcd_kv_key((json_t *)kv);
    size_t dl = strlen(dir);
    if (!*key || strncmp(*key, dir, dl) != 0)
        return false;
    *id = *key + dl;
    const char *us = strchr(*id, '_');
    if (!us || us == *id || !us[1])
        return false;
    for (const char *p = *id; *p; p++)
        if (p != us && !strchr("0123456789abcdef", *p))
            return false;
    return true;
}

char *dlock__etcd_sem_name(struct etcd_backend *s, const json_t *kv)
{
    char *key = dlock__etcd_kv_key((json_t *)kv), *name = NULL;
    size_t pl = strlen(s->prefix);
    const char *dir = NULL; /* the last "/sem/" of KEY ends the name */
    for (const char *p = key && strncmp(key, s->prefix, pl) == 0 ? strstr(key + pl, "/" SEM_DIR)
                                                                 : NULL;
         p; p = strstr(p + 1, "/" SEM_DIR))
        dir = p;
    char *queue = dir && dir > key + pl ? dlock__sprintf("%.*s", (int)(dir - key) + 5, key) : NULL;
    char *again = NULL;
    const char *id;
    if (queue && permit_key(queue, kv, &again, &id)) /* "<prefix>NAME/sem/" + a permit id */
        name = dlock__sprintf("%.*s", (int)(dir - key - pl), key + pl);
    free(again);
    free(queue);
    free(key);
    return name;
}

/* The permits a key's value takes (1 when it says nothing we read). */
static unsigned permit_weight(const json_t *kv)
{
    const char *vb = json_string_value(json_object_get(kv, "value"));
    size_t len = 0;
    char *value = vb ? dlock__etcd_unb64(vb, &len) : NULL;
    unsigned long k = value ? strtoul(value, NULL, 10) : 0;
    free(value);
    return k >= 1 && k <= DLOCK_PERMITS_MAX ? (unsigned)k : 1;
}

/* The queue's keys, oldest first, with values. */
static json_t *queue_range(const char *dir)
{
    json_t *r = dlock__etcd_range(dir, true);
    if (r) {
        json_object_set_new(r, "sort_order", json_string("ASCEND"));
        json_object_set_new(r, "sort_target", json_string("CREATE"));
    }
    return r;
}

/* Whether the key of create revision MY_REV taking K of N permits holds
 * them in range response RESP (its kvs oldest first); *MINE whether the
 * key is there at all. */
static bool holds_in(const char *dir, json_t *resp, int64_t my_rev, unsigned k, unsigned n,
                     bool *mine)
{
    unsigned long before = 0;
    *mine = false;
    size_t i;
    json_t *kv;
    json_array_foreach(json_object_get(resp, "kvs"), i, kv)
    {
        char *key = NULL;
        const char *id;
        bool ours = permit_key(dir, kv, &key, &id);
        free(key);
        if (!ours)
            continue;
        int64_t rev = dlock__etcd_int(kv, "create_revision");
        if (rev == my_rev)
            *mine = true;
        else if (rev < my_rev)
            before += permit_weight(kv);
    }
    return *mine && before + k <= n;
}

/* The create revision of the key whose base64 is KB in range response
 * RESP; 0 when it is not there. */
static int64_t create_rev_in(json_t *resp, const char *kb)
{
    size_t i;
    json_t *kv;
    json_array_foreach(json_object_get(resp, "kvs"), i, kv)
    {
        const char *key = json_string_value(json_object_get(kv, "key"));
        if (key && strcmp(key, kb) == 0)
            return dlock__etcd_int(kv, "create_revision");
    }
    return 0;
}

/* The stored count of range response RESP (0 when absent); *TEXT gets its
 * value for messages. */
static unsigned long stored_count(json_t *resp, char text[32])
{
    json_t *kv = json_array_get(json_object_get(resp, "kvs"), 0);
    const char *vb = json_string_value(json_object_get(kv, "value"));
    size_t len = 0;
    char *value = vb ? dlock__etcd_unb64(vb, &len) : NULL;
    snprintf(text, 32, "%s", value ? value : "");
    free(value);
    return kv ? strtoul(text, NULL, 10) : 0;
}

static int wrong_count(struct etcd_backend *s, const char *name, const struct sem_keys *k,
                       const char *stored, unsigned permits)
{
    return dlock__err(DLOCK_EINVAL, "%s: semaphore '%s' has %s permits (stored in %s), not %u",
                      s->label, name, stored, k->count, permits);
}

/* The value of hold H's key: "<k> dlock <pid>@<host>" (caller frees). */
static char *sem_value(const struct etcd_backend *s, const struct dlock__hold *h)
{
    return dlock__sprintf("%u %s", h->sem->k, s->ident);
}

/* One contender for a semaphore: hold H's key KEY in the queue of the
 * semaphore's keys K. OUT collects what the requests below learn. */
struct sem_contender {
    struct etcd_backend *s;
    const struct dlock__hold *h;
    const struct sem_keys *k;
    const char *key;
    struct {
        int64_t my_rev; /* KEY's create revision, 0 = not known */
        int64_t at;     /* the revision the queue was read at */
        bool held;      /* KEY holds its permits */
        bool late;      /* a send of the put may still land later */
    } out;
};

/* Put C's key (its value, on LEASE) if the stored count is N -- storing
 * it first when there is none -- and read the queue in the same
 * transaction: C's my_rev is the key's create revision, at the revision
 * read, held whether it holds K permits. C's late turns true when a send
 * of the put may still land later (its reply lost, or sent twice). */
static int put_key(struct sem_contender *c, int64_t lease, const struct etcd_limits *lim)
{
    struct etcd_backend *s = c->s;
    const struct dlock__hold *h = c->h;
    const struct sem_keys *k = c->k;
    unsigned n = h->sem->permits;
    char ns[16];
    snprintf(ns, sizeof ns, "%u", n);
    char *value = sem_value(s, h);
    char *kb = dlock__etcd_b64(c->key, strlen(c->key));
    char *vb = value ? dlock__etcd_b64(value, strlen(value)) : NULL;
    char *cb = dlock__etcd_b64(k->count, strlen(k->count)), *nb = dlock__etcd_b64(ns, strlen(ns));
    char *ls = dlock__etcd_i64s(lease);
    free(value);
    int rc = kb && vb && cb && nb && ls ? DLOCK_OK : dlock__etcd_nomem(s);
    char what[1200];
    snprintf(what, sizeof what, "acquire semaphore '%s' (key %s)", h->name, c->key);
    for (int attempt = 0; !rc; attempt++) {
        /* The count stored and ours: put. None stored: store it and put. */
        json_t *req = attempt % 2 == 0
            ? json_pack("{s:[{s:s, s:s, s:s, s:s}], s:[{s:{s:s, s:s, s:s}}, {s:o}],"
                        " s:[{s:o}]}",
                        "compare", "result", "EQUAL", "target", "VALUE", "key", cb, "value", nb,
                        "success", "request_put", "key", kb, "value", vb, "lease", ls,
                        "request_range", queue_range(k->dir),
                        "failure", "request_range", dlock__etcd_range(k->count, false))
            : json_pack("{s:[{s:s, s:s, s:s, s:s}], s:[{s:{s:s, s:s}}, {s:{s:s, s:s, s:s}},"
                        " {s:o}], s:[{s:o}]}",
                        "compare", "result", "EQUAL", "target", "CREATE", "key", cb,
                        "create_revision", "0",
                        "success", "request_put", "key", cb, "value", nb,
                        "request_put", "key", kb, "value", vb, "lease", ls,
                        "request_range", queue_range(k->dir),
                        "failure", "request_range", dlock__etcd_range(k->count, false));
        json_t *reply = NULL;
        int code = 0;
        bool resent = false;
        rc = req ? dlock__etcd_call_lim(s->k, "/v3/kv/txn", req, &reply, what, &code, &resent,
                                        lim)
                 : dlock__etcd_nomem(s);
        json_decref(req);
        c->out.late |= req && dlock__etcd_put_may_land(rc, resent);
        if (rc == DLOCK_EBACKEND && code == GRPC_NOT_FOUND)
            rc = RESTART; /* "requested lease not found": it expired under us */
        if (rc)
            break;
        if (json_is_true(json_object_get(reply, "succeeded"))) {
            json_t *queue = dlock__etcd_txn_range(reply, attempt % 2 ? 2 : 1);
            c->out.at = dlock__etcd_header_rev(reply);
            /* (our put's revision unless a first send, its reply lost,
             * had made the key: the put keeps its create revision) */
            c->out.my_rev = create_rev_in(queue, kb);
            if (!c->out.my_rev)
                c->out.my_rev = c->out.at;
            bool mine;
            c->out.held = holds_in(k->dir, queue, c->out.my_rev, h->sem->k, n, &mine);
            json_decref(reply);
            break;
        }
        char stored[32];
        unsigned long count = stored_count(dlock__etcd_txn_range(reply, 0), stored);
        bool absent = json_array_size(json_object_get(dlock__etcd_txn_range(reply, 0), "kvs")) == 0;
        json_decref(reply);
        if (!absent && count != n)
            rc = wrong_count(s, h->name, k, stored, n);
        else if (attempt >= 3)
            rc = dlock__err(DLOCK_EBACKEND, "%s: semaphore '%s': its count %s keeps changing",
                            s->label, h->name, k->count);
    }
    free(kb);
    free(vb);
    free(cb);
    free(nb);
    free(ls);
    return rc;
}

/* Look again: does C's key (create revision C's my_rev) still exist,
 * and does it hold its permits now? *AT the revision read. */
static int look(const struct sem_contender *c, const struct etcd_limits *lim, bool *mine,
                bool *held, int64_t *at)
{
    struct etcd_backend *s = c->s;
    const struct dlock__hold *h = c->h;
    char *kb = dlock__etcd_b64(c->key, strlen(c->key)), *rs = dlock__etcd_i64s(c->out.my_rev);
    json_t *req = kb && rs ? json_pack("{s:[{s:s, s:s, s:s, s:s}], s:[{s:o}]}", "compare",
                                       "result", "EQUAL", "target", "CREATE", "key", kb,
                                       "create_revision", rs, "success", "request_range",
                                       queue_range(c->k->dir))
                           : NULL;
    free(kb);
    free(rs);
    char what[1200];
    snprintf(what, sizeof what, "wait for semaphore '%s' (key %s)", h->name, c->key);
    json_t *reply = NULL;
    int rc = dlock__etcd_txn(s, req, &reply, what, NULL, lim);
    if (rc)
        return rc;
    *at = dlock__etcd_header_rev(reply);
    *mine = *held = false;
    if (json_is_true(json_object_get(reply, "succeeded")))
        *held = holds_in(c->k->dir, dlock__etcd_txn_range(reply, 0), c->out.my_rev, h->sem->k,
                         h->sem->permits, mine);
    json_decref(reply);
    return DLOCK_OK;
}

/* Hang hold H's KEY (create revision REV) on LEASE: a put keeps the
 * create revision, so the key keeps its place in the queue and its
 * token. RESTART when the key is gone; DLOCK_ELOST when etcd no longer
 * knows LEASE. */
static int move_key(struct etcd_backend *s, const struct dlock__hold *h, const char *key,
                    int64_t rev, int64_t lease, const struct etcd_limits *lim)
{
    char what[1200], *value = sem_value(s, h);
    if (!value)
        return dlock__etcd_nomem(s);
    snprintf(what, sizeof what, "move semaphore '%s' (key %s) to lease %llx", h->name, key,
             (unsigned long long)lease);
    int code = 0;
    int rc = dlock__etcd_put_again(s, key, rev, value, lease, what, &code, lim);
    free(value);
    if (rc == DLOCK_EBACKEND && code == GRPC_NOT_FOUND)
        return DLOCK_ELOST; /* "requested lease not found" */
    return rc == ETCD_KEY_GONE ? RESTART : rc;
}

/* Wait until C's key holds its permits: a prefix watch from the revision
 * after each look (the first after C's at), the leases LR (the hold's)
 * and WL (the waiters', the key's while it waits) kept alive meanwhile. DLOCK_OK, RESTART,
 * DLOCK_ETIMEDOUT / DLOCK_ECANCELED or a failure; MSG keeps the failure
 * of the last request, "" when it was answered. */
static int wait_turn(const struct sem_contender *c, struct dlock__wait *w, struct lease_ref *lr,
                     struct lease_ref *wl, char msg[DLOCK__MSG_MAX])
{
    struct etcd_backend *s = c->s;
    int64_t at = c->out.at; /* the revision the last look read */
    struct etcd_limits lim = {dlock__wait_deadline(w), w};
    struct etcd_watch *wt = NULL;
    bool need_look = false;
    int rc = DLOCK_OK;
    for (;;) {
        unsigned seq = dlock__wait_seq(w);
        int64_t now = dlock__now_ms(), until = dlock__etcd_keepalive_due(lr);
        int64_t wl_due = dlock__etcd_keepalive_due(wl);
        if (wl_due < until)
            until = wl_due;
        if (need_look) {
            bool mine = false, held = false;
            rc = look(c, &lim, &mine, &held, &at);
            if (rc == DLOCK_OK) {
                msg[0] = 0;
                if (!mine) {
                    rc = RESTART; /* our lease expired, or the key was deleted */
                    break;
                }
                if (held || (rc = dlock__etcd_watch_error(wt)))
                    break;
                need_look = false;
                dlock__etcd_watch_stop(wt);
                wt = NULL;
            } else if (dlock__etcd_transient(rc)) {
                dlock__errmsg_save(msg); /* outage or election: again shortly */
                rc = DLOCK_OK;
                until = now + 500;
            } else {
                break;
            }
        }
        if (!need_look && !wt &&
            (rc = dlock__etcd_watch_prefix_deletes(s->k, c->k->dir, at + 1, w, &wt)))
            break;
        if (until < now + 200)
            until = now + 500; /* the last keepalive failed: not in a hot loop */
        if ((rc = dlock__wait_sleep(w, seq, until)) || /* ETIMEDOUT or ECANCELED */
            (rc = dlock__etcd_watch_error(wt)))        /* a stream etcd never sends */
            break;
        if ((rc = dlock__etcd_waiter_keepalive(s, wl, lr, msg, &lim)))
            break;
        if (need_look || (wt && dlock__etcd_watch_fired(wt)))
            need_look = true;
    }
    dlock__etcd_watch_stop(wt);
    return rc;
}

/* Give KEY up (created at REV, 0 = not known: a put whose reply was
 * lost): deleted now within GRACE_MS while the member answers (a waiter's
 * key in front would hold others up), else by the keeper; compared on
 * its create revision either way (dlock__etcd_delete_key). */
static void give_up(struct etcd_backend *s, const char *key, int64_t rev,
                    const struct lease_ref *lr, int64_t grace_ms)
{
    int64_t deadline = dlock__now_ms() + grace_ms;
    struct etcd_limits lim = {deadline, NULL};
    if (lr->own && grace_ms > 0)
        dlock__etcd_lease_revoke(s, lr->id, &lim); /* takes the key with it */
    dlock__etcd_delete_key(s, key, rev, deadline, NULL);
}

int dlock__etcd_sem_acquire(void *state, struct dlock__hold *h, struct dlock__wait *w)
{
    static atomic_uint serial;
    struct etcd_backend *s = state;
    struct etcd_limits lim = {dlock__wait_deadline(w), w};
    bool own = h->fixed_lease || h->lease_ms != s->c->opts.lease_ms;
    struct sem_keys k;
    int rc = sem_keys_make(s, h->name, &k);
    if (rc)
        return rc;
    struct lease_ref lr = {0};
    char *key = NULL, msg[DLOCK__MSG_MAX];
    /* (its late: a put of KEY may land later, dlock__etcd_late_put) */
    struct sem_contender c = {.s = s, .h = h, .k = &k};
    for (int restarts = 0;; restarts++) {
        if (c.out.late)
            dlock__etcd_late_put(s, key, lr.id, 0);
        c.out.late = false;
        free(key);
        key = NULL;
        c.out.my_rev = 0;
        if (own && lr.id)
            dlock__etcd_lease_revoke(s, lr.id, &lim);
        rc = own ? DLOCK_EBUSY : dlock__etcd_session_lease(s, h->name, &lr, &lim);
        if (rc == DLOCK_EBUSY) { /* (a try-once found another thread granting it) */
            own = true;
            rc = dlock__etcd_lease_grant(s, h->name, h->lease_ms, &lr, &lim);
            lr.own = true;
        }
        if (rc)
            break;
        key = dlock__sprintf("%s%llx_%x", k.dir, (unsigned long long)lr.id,
                             atomic_fetch_add(&serial, 1) + 1);
        if (!key) {
            rc = dlock__etcd_nomem(s);
            break;
        }
        c.key = key;
        c.out.at = 0;
        c.out.held = false;
        rc = put_key(&c, lr.id, &lim);
        if (rc == RESTART && !own && restarts < 3) {
            dlock__etcd_session_lease_dead(s, lr.id);
            continue;
        }
        if (rc == RESTART)
            rc = dlock__err(DLOCK_EBACKEND, "%s: semaphore '%s': lease %llx expired as it "
                                            "was used", s->label, h->name,
                            (unsigned long long)lr.id);
        if (rc) {
            /* A put that may have happened: the keeper deletes the key. */
            if (dlock__etcd_put_failed(w, &rc, msg))
                give_up(s, key, c.out.my_rev, &lr, 0);
            else if (own)
                dlock__etcd_lease_revoke(s, lr.id, NULL);
            dlock__errmsg_restore(rc, msg);
            break;
        }
        if (!c.out.held && dlock__wait_try_once(w)) {
            give_up(s, key, c.out.my_rev, &lr, GIVE_UP_GRACE_MS);
            rc = dlock__err(DLOCK_EBUSY, "%s: semaphore '%s': fewer than %u of its %u permits "
                                         "free", s->label, h->name, h->sem->k, h->sem->permits);
            break;
        }
        msg[0] = 0;
        if (!c.out.held) {
            /* Wait our turn with the key on the waiters' short lease: a
             * waiter killed meanwhile holds the queue up for that lease,
             * not for the hold's; once in, the key goes back to the
             * hold's lease (same create revision: same place, token). */
            struct lease_ref wl = {0};
            rc = dlock__etcd_waiter_lease(s, h->name, lr.ttl_ms, &wl, &lim);
            if (!rc) {
                rc = move_key(s, h, key, c.out.my_rev, wl.id, &lim);
                if (rc == DLOCK_ELOST) {
                    dlock__etcd_waiter_lease_dead(s, wl.id); /* expired just now */
                    rc = RESTART;
                }
            }
            if (!rc)
                rc = wait_turn(&c, w, &lr, &wl, msg);
            if (!rc && dlock__now_ms() - lr.confirmed > lr.ttl_ms / 3)
                rc = dlock__etcd_lease_refresh(s, &lr, &lim);
            if (!rc)
                rc = move_key(s, h, key, c.out.my_rev, lr.id, &lim);
        }
        if (!rc && dlock__now_ms() - lr.confirmed > lr.ttl_ms / 3)
            rc = dlock__etcd_lease_refresh(s, &lr, &lim);
        if (rc == DLOCK_ELOST) {
            dlock__etcd_lease_dead(s, &lr);
            rc = RESTART;
        }
        if (rc == RESTART && restarts < 5) {
            give_up(s, key, c.out.my_rev, &lr, 0);
            continue;
        }
        if (rc == RESTART)
            rc = dlock__err(DLOCK_EBACKEND, "%s: semaphore '%s': our key %s keeps vanishing",
                            s->label, h->name, key);
        if (rc) {
            bool answering;
            rc = dlock__etcd_wait_failed(w, rc, msg, &answering);
            if ((rc == DLOCK_ETIMEDOUT || rc == DLOCK_ECANCELED) && !msg[0])
                snprintf(msg, sizeof msg, "%s: semaphore '%s': %s", s->label, h->name,
                         rc == DLOCK_ECANCELED ? "wait canceled"
                                               : "timed out waiting for a permit");
            give_up(s, key, c.out.my_rev, &lr, answering ? GIVE_UP_GRACE_MS : 0);
            dlock__errmsg_restore(rc, msg);
        }
        break;
    }
    sem_keys_free(&k);
    struct etcd_hold *eh = rc ? NULL : calloc(1, sizeof *eh);
    if (!rc && !eh) {
        give_up(s, key, c.out.my_rev, &lr, GIVE_UP_GRACE_MS);
        rc = dlock__etcd_nomem(s);
    }
    if (c.out.late) /* (the key is this acquire's alone: a serial of its own) */
        dlock__etcd_late_put(s, key, lr.id, rc ? 0 : c.out.my_rev);
    if (rc) {
        free(key);
        return rc;
    }
    const char *id = strrchr(key, '/');
    dlock__etcd_hold_keep(s, h, eh, key, c.out.my_rev, &lr, own, id ? id + 1 : key);
    return DLOCK_OK;
}

int dlock__etcd_sem_inspect(void *state, const char *name, unsigned permits,
                            struct dlock_info *info)
{
    struct etcd_backend *s = state;
    struct sem_keys k;
    int rc = sem_keys_make(s, name, &k);
    if (rc)
        return rc;
    dlock__info_set_key(info, k.dir);
    json_t *req = json_pack("{s:[{s:o}, {s:o}]}", "success", "request_range",
                            dlock__etcd_range(k.count, false), "request_range",
                            queue_range(k.dir));
    json_t *reply = NULL;
    char what[1200];
    snprintf(what, sizeof what, "inspect semaphore '%s'", name);
    rc = dlock__etcd_txn(s, req, &reply, what, NULL, NULL);
    char stored[32];
    unsigned long n = rc ? 0 : stored_count(dlock__etcd_txn_range(reply, 0), stored);
    if (!rc && n && permits && n != permits)
        rc = wrong_count(s, name, &k, stored, permits);
    if (!rc) {
        info->permits = n ? (unsigned)n : permits;
        info->free_permits = info->permits ? (long)info->permits : -1;
        unsigned long taken = 0;
        info->nwaiters = 0; /* the whole queue is read: none is known */
        size_t i;
        json_t *kv;
        json_array_foreach(json_object_get(dlock__etcd_txn_range(reply, 1), "kvs"), i, kv)
        {
            char *key = NULL;
            const char *id;
            if (!rc && permit_key(k.dir, kv, &key, &id)) {
                unsigned wgt = permit_weight(kv);
                if (!info->permits || taken + wgt <= info->permits) {
                    taken += wgt;
                    info->held = 1;
                    info->token = (uint64_t)dlock__etcd_int(kv, "create_revision");
                    rc = dlock__info_add_holder(info, id, wgt);
                } else {
                    rc = dlock__info_add_waiter(info, id);
                }
            }
            free(key);
        }
        if (info->permits)
            info->free_permits = (long)info->permits - (long)taken;
    }
    json_decref(reply);
    sem_keys_free(&k);
    return rc;
}
