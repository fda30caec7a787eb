local t = redis.call('type', KEYS[1]).ok
if t == 'none' or redis.call('get', KEYS[4]) ~= ARGV[2] then return 0 end
if t == 'hash' and redis.call('hexists', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('hset', KEYS[2], 'token', ARGV[2], 'value', ARGV[3])
if ARGV[4] then redis.call('hset', KEYS[2], 'version', ARGV[4])
else
  local v = redis.call('hincrby', KEYS[2], 'version', 1)
  if v < 1e15 then
    local c = redis.call('time')
    local now = tonumber(c[1]) * 1000000 + tonumber(c[2])
    if now > v then redis.call('hset', KEYS[2], 'version', string.format('%d', now)) end
  end
end
redis.call('publish', KEYS[3], '1')
return 1
