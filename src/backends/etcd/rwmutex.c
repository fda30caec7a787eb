/* rwmutex.c -- shared (reader) holds on the etcd backend, in the queue of
 * the exclusive lock (mutex.c) rather than beside it.
 *
 * Go's recipes.RWMutex cannot be joined: its readers wait only for keys
 * under "NAME/write", so they take a lock a concurrency.Mutex (our
 * exclusive lock, `etcdctl lock`) holds; it orders keys by mod revision,
 * which the put that moves our waiting keys to the waiters' lease changes;
 * and its keys are named after the wall clock, so a create whose reply was
 * lost and is sent again leaves a first key that its writer then waits
 * for until the session ends. docs/protocol-etcd.md says more.
 *
 * So a reader is one more contender in the mutex's queue: the key
 * "<prefix>NAME/<lease hex>-<owner hex>" (one per thread or handle of the
 * client: the core lets a client's readers go to the server side by side),
 * on the same leases, whose value starts with ETCD_SHARED_MARK. Every
 * contender still waits in create-revision order, and the fencing token is
 * the key's create revision; a writer waits for every older key, as
 * before (so does Go's Mutex: it takes every key under "NAME/"), a reader
 * only for older keys whose value is not shared. A reader behind a waiting
 * writer waits for it: a stream of readers cannot starve a writer.
 *
 * A downgrade (the owner releases its last exclusive level and keeps a
 * shared one) puts the shared value on the hold's own key: the create
 * revision, so its place and token, stay, and the readers waiting for that
 * key are woken by the put (their watch fires on it, see watch.c).
 */
#include "etcd.h"

#include <stdlib.h>
#include <string.h>

char *dlock__etcd_hold_key(const char *pfx, int64_t lease, const struct dlock__hold *h)
{
    if (h->mode == DLOCK_SHARED)
        return dlock__sprintf("%s%llx-%lx", pfx, (unsigned long long)lease, (unsigned long)h->tid);
    return dlock__sprintf("%s%llx", pfx, (unsigned long long)lease);
}

const char *dlock__etcd_hold_value(struct etcd_backend *s, const struct dlock__hold *h)
{
    if (h->elect) /* a campaign's key holds its proposal, as Go's Election */
        return h->elect->value;
    return h->mode == DLOCK_SHARED ? s->shared_ident : s->ident;
}

int dlock__etcd_downgrade(void *state, struct dlock__hold *h)
{
    struct etcd_backend *s = state;
    struct etcd_hold *eh = h->bdata;
    if (!eh)
        return dlock__err(DLOCK_ELOST, "%s: '%s': no key held to downgrade", s->label, h->name);
    /* Same key, same lease, shared value: the create revision stays. The
     * exclusive part ends cleanly, so the lock-delay marker goes (when
     * still ours) in the same txn: no reader the put wakes finds it. */
    json_t *txn = dlock__etcd_delay_clear_in(s,
                                             dlock__etcd_put_again_txn(eh->key, eh->rev,
                                                                       s->shared_ident, eh->lease),
                                             h->name, h->token, eh->delay_ms);
    char what[1200];
    snprintf(what, sizeof what, "downgrade '%s' (key %s)", h->name, eh->key);
    int rc = dlock__etcd_put_again_run(s, txn, what, NULL, NULL);
    if (rc == DLOCK_OK)
        eh->delay_ms = 0; /* its marker is gone: nothing for the release to clear */
    else if (rc == ETCD_KEY_GONE)
        rc = dlock__err(DLOCK_ELOST,
                        "%s: lock '%s': key %s (token %lld) was gone before the "
                        "downgrade (lease expired or force-released)",
                        s->label, h->name, eh->key, (long long)eh->rev);
    else if (rc && dlock__etcd_transient(rc))
        /* The put may have been applied: readers may be in already, so
         * the hold can no longer pass for exclusive. Give it up. */
        rc = dlock__err(DLOCK_ELOST, "%s: the hold can no longer be trusted exclusive",
                        dlock_errmsg());
    return rc;
}
