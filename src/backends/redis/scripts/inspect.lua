-- A read-only look at a lock. KEYS: lock, token key. Returns {type, pttl,
-- token, field_1, count_1, ...} (hash) or {type, pttl, token, value} (string).
local t = redis.call('type', KEYS[1]).ok
local r = {t, redis.call('pttl', KEYS[1]), redis.pcall('get', KEYS[2]) or ''}
if type(r[3]) ~= 'string' then r[3] = '' end
if t == 'hash' then
  local kv = redis.call('hgetall', KEYS[1])
  for i = 1, #kv do r[#r + 1] = kv[i] end
elseif t == 'string' then r[4] = redis.call('get', KEYS[1]) end
return r
