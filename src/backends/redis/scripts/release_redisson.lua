-- release, Redisson layout. KEYS: lock, channel, token key. ARGV: owner field,
-- our token. Full release publishes Redisson's unlock message "0" (an
-- exclusive lock has one field, so removing ours is a full release).
-- Returns 1 = released, 2 = the lock is free and the token key still holds
-- our token, so nobody took it after us (a retried release whose first reply
-- was lost, or an expired lease), 0 = not ours, or a type name (WRONGTYPE).
local n = redis.pcall('hdel', KEYS[1], ARGV[1])
if type(n) == 'table' then return redis.call('type', KEYS[1]).ok end
if n == 1 then
  redis.call('publish', KEYS[2], '0')
  return 1
end
if redis.call('exists', KEYS[1]) == 0 and redis.call('get', KEYS[3]) == ARGV[2] then
  return 2
end
return 0
