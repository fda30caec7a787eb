/* guard.c -- the ZooKeeper backend's guarded writes: keys a lock's
 * holder puts and deletes in the lock's own store only while it holds
 * the lock (dlock_guarded_put(), dlock_guarded_delete()), read by anyone
 * (dlock_guarded_get()).
 *
 * Key KEY of lock NAME's store is the persistent node
 * <lock node>/_dlock_keys/KEY (its data the writer's token in decimal, a
 * newline, then the bytes, as a lock's value is kept). _dlock_keys is a
 * container (persistent on a server without containers), made at the
 * first put; it carries none of the marks of a contender, so dlock and
 * Curator pass it by as they pass the value's _dlock_value, and it keeps
 * the lock's container node alive while a key is there. A write is one
 * multi: a check that the hold's own node (the EPHEMERAL_SEQUENTIAL child
 * of its session) still exists, then setData of the key -- its create the
 * first time -- or its delete. A node gone (its session expired while
 * the holder was paused, a force release) fails the check and nothing is
 * written: DLOCK_ELOST. A read is one getData.
 */
#include "zk.h"

const struct dlock__guarded_ops dlock__zk_guarded_ops = {
    .put = dlock__zk_stored_set,
    .get = dlock__zk_stored_get,
};
