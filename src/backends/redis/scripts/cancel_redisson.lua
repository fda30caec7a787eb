-- cancel, Redisson layout: undo an acquire whose replies were lost, or
-- give back a hold whose release did not fit in its bound. KEYS: lock,
-- channel, canceled key. ARGV: owner field, the owner's last request
-- number so far, life ms of the cancellation record.
-- Records that every request of this owner up to that number is canceled
-- (an attempt still on its way then does nothing when it arrives), and
-- takes our field away if an attempt did run, with the hash when only its
-- "mode" is left (a reader's timeout key then simply expires). Only the
-- copy that raises the record does anything: once it ran, no request it
-- covers can write our field any more, so a field of ours that a later
-- copy finds (its connection broke, the copy sent again ran, the owner
-- took the lock again before this one arrived) is a later hold's, with a
-- greater request number (docs/protocol-redis.md, "Late releases and
-- cancels"). Returns 1 when a field was removed (and the release message
-- published when the lock became free), 0 when there was none or this
-- copy came late, or a type name (WRONGTYPE; the record is written,
-- nothing else).
local canceled = tonumber(redis.call('hget', KEYS[3], ARGV[1]) or '0')
if canceled >= tonumber(ARGV[2]) then return 0 end
redis.call('hset', KEYS[3], ARGV[1], ARGV[2])
redis.call('pexpire', KEYS[3], ARGV[3])
local n = redis.pcall('hdel', KEYS[1], ARGV[1])
if type(n) == 'table' then return redis.call('type', KEYS[1]).ok end
if n == 1 and redis.call('hlen', KEYS[1]) == 1 and redis.call('hexists', KEYS[1], 'mode') == 1 then
  redis.call('del', KEYS[1])
end
if n == 1 and redis.call('exists', KEYS[1]) == 0 then
  redis.call('publish', KEYS[2], '0')
end
return n
