-- acquire, simple layout (SET NX PX): the value is "<uuid>:<tid>:<token>".
-- KEYS: lock, token key, canceled key. ARGV: lease ms, owner prefix
-- "<uuid>:<tid>:", request number, the number of the attempt this one
-- retries (0 for a first attempt), life ms of a cancellation record.
-- Returns as acquire_redisson.lua does; the canceled key's field is the
-- owner prefix.
if ARGV[4] ~= '0' then
  local canceled = tonumber(redis.call('hget', KEYS[3], ARGV[2]) or '0')
  if canceled >= tonumber(ARGV[3]) then return -1 end
  if canceled < tonumber(ARGV[4]) then
    redis.call('hset', KEYS[3], ARGV[2], ARGV[4])
    redis.call('pexpire', KEYS[3], ARGV[5])
  end
end
if redis.call('exists', KEYS[1]) == 0 then
  local canceled = redis.call('hget', KEYS[3], ARGV[2])
  if canceled and tonumber(canceled) >= tonumber(ARGV[3]) then return -1 end
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
