-- release, Redisson layout (an exclusive hold; rw_release_read.lua gives a
-- shared one back). KEYS: lock, channel, token key, read-write channel,
-- timeout base ({N}), and (optional) the lock-delay marker, which a clean
-- release deletes when it is this hold's. ARGV: owner field, our token,
-- and on a Redlock node (optional) a second token that is ours too: the one
-- our counter raise asked for, its reply lost (redlock.c). Full release deletes the hash (with its
-- "mode" field) and publishes Redisson's unlock message "0" on the lock's
-- channel (an exclusive lock has one owner field, so removing ours is a
-- full release) and READ_UNLOCK_MESSAGE "1" on RReadWriteLock's, which
-- wakes every reader waiting there, as Redisson's write unlock does.
-- Our field is our hold only while the token key still holds our token
-- (or is gone): every later acquisition INCRs it, a later hold of the
-- same owner too, which has the same field. So a late copy of this
-- release (its connection broke, the copy sent again ran, and the owner
-- took the lock again before the first one arrived) leaves that later
-- hold alone (docs/protocol-redis.md, "Late releases and cancels").
-- Returns 1 = released, 2 = the lock is free and the token key still holds
-- our token, so nobody took it after us (a retried release whose first reply
-- was lost, or an expired lease), 0 = not ours, or a type name (WRONGTYPE).
local mine = redis.pcall('hexists', KEYS[1], ARGV[1])
if type(mine) == 'table' then return redis.call('type', KEYS[1]).ok end
local counter = redis.call('get', KEYS[3])
if mine == 1 and redis.call('hget', KEYS[1], 'mode') == 'read' then
  -- A downgrade that may have run (its reply lost) is given up as this
  -- release: in read mode, other readers' fields stay with the hash. The
  -- downgrade wrote our timeout key with our token: holding another one,
  -- it is a later read hold of ours (one that expired leaves it to us).
  local level1 = KEYS[5] and redis.call('get', KEYS[5] .. ':' .. ARGV[1] .. ':rwlock_timeout:1')
  if level1 and level1 ~= ARGV[2] then return 0 end
  redis.call('hdel', KEYS[1], ARGV[1])
  if redis.call('hlen', KEYS[1]) > 1 then return 1 end
  mine = 2
elseif mine == 1 and (counter == ARGV[2] or counter == ARGV[3] or counter == false) then
  redis.call('hdel', KEYS[1], ARGV[1])
  mine = 2
end
if mine == 2 then
  redis.call('del', KEYS[1])
  if KEYS[6] and redis.call('hget', KEYS[6], 'token') == ARGV[2] then redis.call('del', KEYS[6]) end
  redis.call('publish', KEYS[2], '0')
  redis.call('publish', KEYS[4], '1')
  return 1
end
if redis.call('exists', KEYS[1]) == 0 and (counter == ARGV[2] or counter == ARGV[3]) then
  return 2
end
return 0
