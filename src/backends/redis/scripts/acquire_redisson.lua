-- acquire, Redisson layout. KEYS: lock, token key. ARGV: lease ms, owner field.
-- Returns the token (>= 0) when taken; -3 - PTTL (< 0) when another owner
-- holds it; a type name when the lock key is not a hash (nothing written).
-- A field that already exists is our own earlier attempt whose reply was
-- lost: the core only calls acquire for a thread that holds nothing here.
-- Run by hand: redis-cli --eval acquire_redisson.lua N redisson_lock_token:{N} , 30000 <uuid>:1
if redis.call('exists', KEYS[1]) == 0 then
  local token = redis.call('incr', KEYS[2])
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return token
end
local mine = redis.pcall('hexists', KEYS[1], ARGV[2])
if type(mine) == 'table' then return redis.call('type', KEYS[1]).ok end
if mine == 1 then
  redis.call('pexpire', KEYS[1], ARGV[1])
  return tonumber(redis.call('get', KEYS[2]) or '0')
end
return -3 - redis.call('pttl', KEYS[1])
