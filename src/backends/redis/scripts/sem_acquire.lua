-- acquire K permits of a semaphore at once, on Redisson's
-- RPermitExpirableSemaphore layout. KEYS: the name (a STRING: the free
-- permits), {name}:timeout (a ZSET: permit id -> expiry in ms since the
-- epoch), redisson_sc:{name} (the channel), dlock_sem_token:{name} (our
-- fencing counter). ARGV: the permit count N, K, the lease in ms, the id
-- prefix (14 bytes: permit i is the prefix followed by i in 2 bytes).
-- Returns {token, free permits left} when taken; {-1, ms until the
-- nearest expiry, -1 when none will expire} when fewer than K are free;
-- 'count:<stored count>' when the semaphore has another count than N;
-- 'type:<type>' when a key is not of this layout, or the name a string that
-- is not a count (nothing written then).
-- Expired permits are given back first, as Redisson does (one message).
-- The token counter follows the lock's rule (lib_acquire.lua's new_token:
-- absent or below 10^15, it goes on from the server's clock in
-- microseconds), and is counted before anything is taken, so a counter
-- that cannot count fails the acquire with nothing written.
-- Run by hand (with lib_acquire.lua in front): redis-cli --eval /tmp/a.lua s {s}:timeout redisson_sc:{s} dlock_sem_token:{s} , 3 1 30000 abcdefghijklmn
if redis.replicate_commands then pcall(redis.replicate_commands) end
local free = redis.pcall('get', KEYS[1])
if type(free) == 'table' then return 'type:' .. redis.call('type', KEYS[1]).ok end
-- a string that is no count: a simple-layout lock of the name (its value)
if free and not string.match(free, '^%-?%d+$') then return 'type:string that is not a count' end
local zt = redis.call('type', KEYS[2]).ok
if zt ~= 'zset' and zt ~= 'none' then return 'type:' .. zt end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n, k = tonumber(ARGV[1]), tonumber(ARGV[2])
local expired = redis.call('zrangebyscore', KEYS[2], 0, now)
if #expired > 0 then
  redis.call('zrem', KEYS[2], unpack(expired))
  if free then
    free = redis.call('incrby', KEYS[1], #expired)
    redis.call('publish', KEYS[3], free)
  end
end
local held = redis.call('zcard', KEYS[2])
if not free then
  free = n - held
  redis.call('set', KEYS[1], free)
else
  free = tonumber(free)
  if free + held ~= n then return 'count:' .. (free + held) end
end
if free < k then
  local v = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')
  if v[2] and tonumber(v[2]) < 922337203685477 then return {-1, tonumber(v[2]) - now} end
  return {-1, -1}
end
local token = new_token(KEYS[4])
if type(token) == 'table' then return token end
redis.call('decrby', KEYS[1], k)
local expiry = now + tonumber(ARGV[3])
for i = 0, k - 1 do
  redis.call('zadd', KEYS[2], expiry, ARGV[4] .. string.char(math.floor(i / 256), i % 256))
end
return {token, free - k}
