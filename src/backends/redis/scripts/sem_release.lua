-- release K permits of a semaphore (Redisson's RPermitExpirableSemaphore
-- layout, as sem_acquire.lua). KEYS: the name, {name}:timeout,
-- redisson_sc:{name}, dlock_sem_released:{name} (a ZSET: id prefix ->
-- until when the release of those ids is remembered, ms since the epoch;
-- dlock's own, Redisson neither reads nor needs it). ARGV: K, the id
-- prefix (14 bytes), how long to remember this release (ms), '1' when
-- this is the retry of a release whose reply was lost, else '0'.
-- Returns how many of the K ids were still held and were given back,
-- after one message with the free permits on the channel, as Redisson's
-- release sends; -1 when none was held but a release of ours (the lost
-- first attempt) gave all K back already; 0 when none was held otherwise
-- (they had expired and were taken back, or were removed by another
-- hand): nothing is given back twice.
-- Run by hand: redis-cli --eval sem_release.lua s {s}:timeout redisson_sc:{s} dlock_sem_released:{s} , 1 abcdefghijklmn 60000 0
if redis.replicate_commands then pcall(redis.replicate_commands) end
local ids = {}
for i = 0, tonumber(ARGV[1]) - 1 do
  ids[#ids + 1] = ARGV[2] .. string.char(math.floor(i / 256), i % 256)
end
local removed = redis.pcall('zrem', KEYS[2], unpack(ids))
if type(removed) == 'table' then return 0 end
if removed == 0 then
  if ARGV[4] == '1' and type(redis.pcall('zscore', KEYS[4], ARGV[2])) == 'string' then
    return -1
  end
  return 0
end
local free = redis.pcall('incrby', KEYS[1], removed)
if type(free) ~= 'table' then redis.call('publish', KEYS[3], free) end
-- Only a whole release is remembered: a retry after a partial one (some
-- ids were gone already) must say lost, as the first reply would have.
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if removed == tonumber(ARGV[1]) and type(redis.pcall('zremrangebyscore', KEYS[4], '-inf', now)) == 'number' then
  redis.call('zadd', KEYS[4], now + tonumber(ARGV[3]), ARGV[2])
  redis.call('pexpire', KEYS[4], ARGV[3])
end
return removed
