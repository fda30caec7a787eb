-- renew the lease of K permits of a semaphore (Redisson's
-- RPermitExpirableSemaphore layout, as sem_acquire.lua; Redisson's
-- updateLeaseTime). KEYS: the name, {name}:timeout, redisson_sc:{name}.
-- ARGV: K, the id prefix (14 bytes), the lease in ms. Expired permits are
-- given back first, ours included: then they are gone. Returns 1 when
-- all K were still held (their expiry moved to now + lease), else 0.
if redis.replicate_commands then pcall(redis.replicate_commands) end
local zt = redis.call('type', KEYS[2]).ok
if zt ~= 'zset' then return 0 end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expired = redis.call('zrangebyscore', KEYS[2], 0, now)
if #expired > 0 then
  redis.call('zrem', KEYS[2], unpack(expired))
  local free = redis.pcall('incrby', KEYS[1], #expired)
  if type(free) ~= 'table' then redis.call('publish', KEYS[3], free) end
end
local expiry = now + tonumber(ARGV[3])
local ids = {}
for i = 0, tonumber(ARGV[1]) - 1 do
  local id = ARGV[2] .. string.char(math.floor(i / 256), i % 256)
  if not redis.call('zscore', KEYS[2], id) then return 0 end
  ids[#ids + 1] = id
end
for i = 1, #ids do redis.call('zadd', KEYS[2], expiry, ids[i]) end
return 1
