local t = redis.call('type', KEYS[2]).ok
local mine = false
if t == 'hash' and redis.call('hexists', KEYS[2], ARGV[2]) == 1 then
  local seen = redis.call('hget', KEYS[2], 'mode') == 'read' and KEYS[3] or KEYS[1]
  mine = redis.call('get', seen) == ARGV[3]
elseif t == 'string' then
  mine = redis.call('get', KEYS[2]) == ARGV[2]
end
if not mine then return 0 end
local v = tonumber(redis.call('get', KEYS[1]) or '0') or 0
if v < tonumber(ARGV[1]) then redis.call('set', KEYS[1], ARGV[1]) end
return 1
