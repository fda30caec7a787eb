/* guard.c -- the etcd backend's guarded writes: keys a lock's holder
 * puts and deletes in the lock's own store only while it holds the lock
 * (dlock_guarded_put(), dlock_guarded_delete()), read by anyone
 * (dlock_guarded_get()).
 *
 * Key KEY of lock NAME's store is the etcd key
 * "<prefix>dlock_guarded:NAME:KEY" (no lease; its value the writer's
 * token in decimal, a newline, then the bytes, as a lock's value is
 * kept). It is outside the lock's prefix "<prefix>NAME/", where Go's
 * concurrency.Mutex would take it for a contender; a key has no ':'
 * (the core checks it), so the last ':' ends the name and two names
 * never share a key. The write is one transaction guarded by the hold's
 * own key, as Go's IsOwner() guards one: if the hold's key still has the
 * hold's create revision (its token), put the key, or delete it. A hold
 * whose key is gone -- its lease expired while the holder was paused, a
 * force release -- fails the compare and nothing is written:
 * DLOCK_ELOST. A read is one range of the key.
 */
#include "etcd.h"

const struct dlock__guarded_ops dlock__etcd_guarded_ops = {
    .put = dlock__etcd_stored_set,
    .get = dlock__etcd_stored_get,
};
