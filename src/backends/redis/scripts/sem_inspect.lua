-- A read-only look at a semaphore (Redisson's RPermitExpirableSemaphore
-- layout, as sem_acquire.lua). KEYS: the name, {name}:timeout,
-- dlock_sem_token:{name}. Returns {type of the name, type of the timeout
-- key, free permits ('' when absent), now in ms, last token ('' when
-- none), id_1, expiry_1, ...}. Expired permits are listed with their past
-- expiry (the caller counts them free); nothing is written.
local t = redis.call('time')
local r = {redis.call('type', KEYS[1]).ok, redis.call('type', KEYS[2]).ok, '',
           tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)), ''}
if r[1] == 'string' then r[3] = redis.call('get', KEYS[1]) end
local token = redis.pcall('get', KEYS[3])
if type(token) == 'string' then r[5] = token end
if r[2] == 'zset' then
  local kv = redis.call('zrange', KEYS[2], 0, -1, 'WITHSCORES')
  for i = 1, #kv do r[#r + 1] = kv[i] end
end
return r
