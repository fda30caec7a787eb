-- cancel, simple layout: undo an acquire whose replies were lost, or give
-- back a hold whose release did not fit in its bound. KEYS: lock,
-- channel, canceled key. ARGV: owner prefix "<uuid>:<tid>:", the owner's
-- last request number so far, life ms of the cancellation record.
-- As cancel_redisson.lua: record the cancellation, then delete the value
-- if it starts with our prefix (the token after it was never learned);
-- only the copy that raises the record does anything (a late copy finds
-- a later hold's value, of a greater request number).
local canceled = tonumber(redis.call('hget', KEYS[3], ARGV[1]) or '0')
if canceled >= tonumber(ARGV[2]) then return 0 end
redis.call('hset', KEYS[3], ARGV[1], ARGV[2])
redis.call('pexpire', KEYS[3], ARGV[3])
local v = redis.pcall('get', KEYS[1])
if type(v) == 'table' then return redis.call('type', KEYS[1]).ok end
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
  redis.call('del', KEYS[1])
  redis.call('publish', KEYS[2], '0')
  return 1
end
return 0
