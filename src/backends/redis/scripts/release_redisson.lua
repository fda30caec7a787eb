-- release, Redisson layout (an exclusive hold; rw_release_read.lua gives a
-- shared one back). KEYS: lock, channel, token key, read-write channel.
-- ARGV: owner field, our token. Full release deletes the hash (with its
-- "mode" field) and publishes Redisson's unlock message "0" on the lock's
-- channel (an exclusive lock has one owner field, so removing ours is a
-- full release) and READ_UNLOCK_MESSAGE "1" on RReadWriteLock's, which
-- wakes every reader waiting there, as Redisson's write unlock does.
-- Returns 1 = released, 2 = the lock is free and the token key still holds
-- our token, so nobody took it after us (a retried release whose first reply
-- was lost, or an expired lease), 0 = not ours, or a type name (WRONGTYPE).
local n = redis.pcall('hdel', KEYS[1], ARGV[1])
if type(n) == 'table' then return redis.call('type', KEYS[1]).ok end
-- A downgrade that may have run (its reply lost) is given up as this
-- release: in read mode, other readers' fields stay with the hash.
if n == 1 and redis.call('hlen', KEYS[1]) > 1 and redis.call('hget', KEYS[1], 'mode') == 'read' then
  return 1
end
if n == 1 then
  redis.call('del', KEYS[1])
  redis.call('publish', KEYS[2], '0')
  redis.call('publish', KEYS[4], '1')
  return 1
end
if redis.call('exists', KEYS[1]) == 0 and redis.call('get', KEYS[3]) == ARGV[2] then
  return 2
end
return 0
