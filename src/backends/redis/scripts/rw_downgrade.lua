-- downgrade, Redisson's RReadWriteLock layout: our exclusive hold becomes
-- a shared one in place (the hash is never without an owner). KEYS: lock,
-- read-write channel, timeout base ({N}), token key, and (optional) the
-- lock-delay marker. ARGV: owner field, lease ms, token, and on a Redlock
-- node (optional) a second value of the token key that is ours too
-- (redlock.c: the one our counter raise asked for, its reply lost;
-- ARGV[3] is then what that node's key holds for us, its own counter).
-- Our field is our hold only while the token key still holds our token
-- (or is gone): a later hold of the same owner has the same field and
-- a greater token, and a late copy of this downgrade leaves it alone
-- (docs/protocol-redis.md, "Late releases and cancels").
-- Our field (count 1) stays and becomes a reader's; "mode" turns
-- "read"; our timeout key is written (its value is the hold's token); the
-- readers waiting are woken with Redisson's READ_UNLOCK_MESSAGE "1".
-- The exclusive part of the hold ends cleanly here: KEYS[5] (optional,
-- none on a Redlock node), the lock-delay marker, goes when it is this
-- hold's (docs/protocol-redis.md, "Lock-delay"), as a clean release's.
-- Returns 1 = done (also when an earlier attempt whose reply was lost did
-- it: our field in read mode, our timeout key holding our token), 0 = the
-- hold is not ours any more (nothing written).
local function delay_clear()
  if KEYS[5] and redis.call('hget', KEYS[5], 'token') == ARGV[3] then redis.call('del', KEYS[5]) end
end
local mode = redis.pcall('hget', KEYS[1], 'mode')
if type(mode) == 'table' then return 0 end
if mode == 'read' then
  local ours = redis.call('get', KEYS[3] .. ':' .. ARGV[1] .. ':rwlock_timeout:1')
  if ours == ARGV[3] and redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
    delay_clear()
    return 1
  end
  return 0
end
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then return 0 end
local counter = KEYS[4] and redis.call('get', KEYS[4])
if counter and counter ~= ARGV[3] and counter ~= ARGV[4] then return 0 end
redis.call('hset', KEYS[1], 'mode', 'read')
redis.call('set', KEYS[3] .. ':' .. ARGV[1] .. ':rwlock_timeout:1', ARGV[3], 'px', ARGV[2])
delay_clear()
redis.call('publish', KEYS[2], '1')
return 1
