-- release K permits of a semaphore (Redisson's RPermitExpirableSemaphore
-- layout, as sem_acquire.lua). KEYS: the name, {name}:timeout,
-- redisson_sc:{name}. ARGV: K, the id prefix (14 bytes). Returns how many
-- of the K ids were still held and were given back (0: all had expired and
-- were taken back, or were already released: nothing is given back twice),
-- after one message with the free permits on the channel, as Redisson's
-- release sends.
local ids = {}
for i = 0, tonumber(ARGV[1]) - 1 do
  ids[#ids + 1] = ARGV[2] .. string.char(math.floor(i / 256), i % 256)
end
local removed = redis.pcall('zrem', KEYS[2], unpack(ids))
if type(removed) == 'table' or removed == 0 then return 0 end
local free = redis.pcall('incrby', KEYS[1], removed)
if type(free) ~= 'table' then redis.call('publish', KEYS[3], free) end
return removed
