-- acquire, simple layout (SET NX PX): the value is "<uuid>:<tid>:<token>".
-- KEYS: lock, token key. ARGV: lease ms, owner prefix "<uuid>:<tid>:".
-- Returns as acquire_redisson.lua does.
if redis.call('exists', KEYS[1]) == 0 then
  local token = redis.call('incr', KEYS[2])
  redis.call('set', KEYS[1], ARGV[2] .. token, 'nx', 'px', ARGV[1])
  return token
end
local v = redis.pcall('get', KEYS[1])
if type(v) == 'table' then return redis.call('type', KEYS[1]).ok end
if string.sub(v, 1, #ARGV[2]) == ARGV[2] then
  redis.call('pexpire', KEYS[1], ARGV[1])
  return tonumber(string.sub(v, #ARGV[2] + 1)) or 0
end
return -3 - redis.call('pttl', KEYS[1])
