-- release of a shared hold, Redisson's RReadWriteLock layout (its read
-- lock's unlock). KEYS: lock, channel, read-write channel, timeout base
-- ({N}). ARGV: owner field, our token (on a Redlock node, what our
-- timeout key there holds: the token that node gave us, or the value our
-- downgrade wrote; optional).
-- Takes our field and our timeout key away. dlock's reader has one level,
-- whose timeout key holds the hold's token: given our token, a timeout
-- key of ours holding another one is a later hold of the same owner (the
-- same field), which a late copy of this release leaves alone
-- (docs/protocol-redis.md, "Late releases and cancels"); one that expired
-- leaves the field to us. If other readers' timeout keys
-- still run, the hash lives as long as the longest of them; otherwise the
-- lock is free: the hash goes (with the fields of readers that died, whose
-- timeout keys expired) and "0" is published on both channels.
-- Returns 1 = released, 2 = our field is not there (released by an
-- earlier attempt whose reply was lost, or the hold was lost), or a type
-- name (WRONGTYPE).
local mode = redis.pcall('hget', KEYS[1], 'mode')
if type(mode) == 'table' then return redis.call('type', KEYS[1]).ok end
if mode == false or redis.call('hexists', KEYS[1], ARGV[1]) == 0 then return 2 end
local level1 = redis.call('get', KEYS[4] .. ':' .. ARGV[1] .. ':rwlock_timeout:1')
if ARGV[2] and level1 and level1 ~= ARGV[2] then return 2 end
local counter = redis.call('hincrby', KEYS[1], ARGV[1], -1)
if counter <= 0 then redis.call('hdel', KEYS[1], ARGV[1]) end
redis.call('del', KEYS[4] .. ':' .. ARGV[1] .. ':rwlock_timeout:' .. (counter + 1))
if redis.call('hlen', KEYS[1]) > 1 then
  local remain = -3
  local fields = redis.call('hkeys', KEYS[1])
  for _, f in ipairs(fields) do
    local n = tonumber(redis.call('hget', KEYS[1], f))
    if n then
      for i = n, 1, -1 do
        remain = math.max(remain, redis.call('pttl', KEYS[4] .. ':' .. f .. ':rwlock_timeout:' .. i))
      end
    end
  end
  if remain > 0 then
    redis.call('pexpire', KEYS[1], remain)
    return 1
  end
  if mode == 'write' then return 1 end
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], '0')
redis.call('publish', KEYS[3], '0')
return 1
