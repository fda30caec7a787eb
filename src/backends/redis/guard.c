/* guard.c -- the Redis backend's guarded writes: keys a lock's holder
 * puts and deletes in the lock's own store only while it holds the lock
 * (dlock_guarded_put(), dlock_guarded_delete()), read by anyone
 * (dlock_guarded_get()).
 *
 * Key KEY of lock NAME's store is the HASH dlock_guarded:{NAME}:KEY
 * (fields token and value, as a lock's value is kept; no expiry), in the
 * lock's hash tag, so a cluster keeps every key of a name in the lock's
 * slot and the guard and the write are one script on one node. The
 * script is the value's (scripts/value_set.lua): it finds the hold --
 * the Redisson layouts (plain and fair): our field in the lock's hash and
 * the token counter at our token; the simple layout: the lock's value
 * "<owner>:<token>" -- then HSETs the key, or DELs it for a delete. A
 * hold that is gone writes nothing: DLOCK_ELOST. No lock name can be a
 * key of this family (keys.c refuses a name starting dlock_guarded:).
 * Every URL form of this backend (TCP, TLS, unix socket, Sentinel,
 * Cluster); redlock:// has none (no one request checks a majority).
 */
#include "redis.h"

const struct dlock__guarded_ops dlock__redis_guarded_ops = {
    .put = dlock__redis_stored_set,
    .get = dlock__redis_stored_get,
};
