-- A read-only look at a lock. KEYS: lock, token key, and (optional) the
-- lock-delay marker. Returns {type, pttl, token, field_1, count_1, ...}
-- (hash) or {type, pttl, token, value} (string); a free lock {'none', pttl,
-- token, delay}, DELAY the ms left of its lock-delay (0: none; a marker
-- without expiry: its whole delay, which the next acquire starts).
local t = redis.call('type', KEYS[1]).ok
local r = {t, redis.call('pttl', KEYS[1]), redis.pcall('get', KEYS[2]) or ''}
if type(r[3]) ~= 'string' then r[3] = '' end
if t == 'hash' then
  local kv = redis.call('hgetall', KEYS[1])
  for i = 1, #kv do r[#r + 1] = kv[i] end
elseif t == 'string' then r[4] = redis.call('get', KEYS[1])
elseif t == 'none' and KEYS[3] then
  local left = redis.call('pttl', KEYS[3])
  if left == -1 then left = tonumber(redis.call('hget', KEYS[3], 'delay') or '0') or 0 end
  r[4] = math.max(left, 0)
end
return r
