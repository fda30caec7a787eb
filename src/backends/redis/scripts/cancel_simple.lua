-- cancel, simple layout: undo an acquire whose replies were lost. KEYS:
-- lock, channel, canceled key. ARGV: owner prefix "<uuid>:<tid>:", the
-- acquire's last request number, life ms of the cancellation record.
-- As cancel_redisson.lua: record the cancellation, then delete the value
-- if it starts with our prefix (the token after it was never learned).
local canceled = tonumber(redis.call('hget', KEYS[3], ARGV[1]) or '0')
if canceled < tonumber(ARGV[2]) then
  redis.call('hset', KEYS[3], ARGV[1], ARGV[2])
end
redis.call('pexpire', KEYS[3], ARGV[3])
local v = redis.pcall('get', KEYS[1])
if type(v) == 'table' then return redis.call('type', KEYS[1]).ok end
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
  redis.call('del', KEYS[1])
  redis.call('publish', KEYS[2], '0')
  return 1
end
return 0
