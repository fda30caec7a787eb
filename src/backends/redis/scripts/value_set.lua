-- a lock's value, written by its holder (redis/value.c). KEYS: lock, value
-- hash, token counter. ARGV: our owner ("<uuid>:<id>": the Redisson
-- layouts' hash field, the simple layout's value before ":<token>"), our
-- token, 'set' or 'clear', the value.
-- Returns 1 written, 0 the lock is no longer ours (nothing written), or
-- the type of a lock key that is no lock.
local t = redis.call('type', KEYS[1]).ok
if t == 'hash' then
  if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then return 0 end
  if redis.call('get', KEYS[3]) ~= ARGV[2] then return 0 end
elseif t == 'string' then
  if redis.call('get', KEYS[1]) ~= ARGV[1] .. ':' .. ARGV[2] then return 0 end
elseif t == 'none' then return 0
else return t end
if ARGV[3] == 'clear' then redis.call('del', KEYS[2])
else redis.call('hset', KEYS[2], 'token', ARGV[2], 'value', ARGV[4]) end
return 1
