-- release, simple layout: the classic compare-and-delete, plus the wake-up
-- message for dlock waiters. KEYS: lock, channel, token key, read-write
-- channel and timeout base (both unused: no shared mode here), and
-- (optional) the lock-delay marker, which a clean release deletes when it
-- is this hold's. ARGV: our value, our token.
-- Returns as release_redisson.lua does.
local v = redis.pcall('get', KEYS[1])
if type(v) == 'table' then return redis.call('type', KEYS[1]).ok end
if v == ARGV[1] then
  redis.call('del', KEYS[1])
  if KEYS[6] and redis.call('hget', KEYS[6], 'token') == ARGV[2] then redis.call('del', KEYS[6]) end
  redis.call('publish', KEYS[2], '0')
  return 1
end
if v == false and redis.call('get', KEYS[3]) == ARGV[2] then return 2 end
return 0
