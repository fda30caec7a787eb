-- acquire of a multi-lock's set, exclusive, all or nothing in one call:
-- each member as acquire_redisson.lua (or acquire_simple.lua) takes it
-- with a writer's stage '0' (try once), each with its own token from its
-- own counter. Nothing is written unless every member is free, so a busy
-- set leaves no trace. KEYS: per member, in the canonical order: lock,
-- token key, canceled key. ARGV: request number, the number of the
-- attempt this one retries (0 for a first attempt), life ms of a
-- cancellation record, 'redisson' or 'simple', then per member its owner
-- (the Redisson field, or the simple layout's prefix "<uuid>:<tid>:") and
-- its lease ms.
-- Returns {1, token, token...} when taken; {0, i, ms} when member i (from
-- 1) is held by another owner, its lease running MS more; {-1} when this
-- request was canceled (nothing written); {2, i, type} when member i's
-- key is not a lock of this layout (nothing written).
-- Run by hand (with lib_acquire.lua in front): redis-cli --eval /tmp/a.lua a redisson_lock_token:{a} dlock_canceled:{a} b redisson_lock_token:{b} dlock_canceled:{b} , 1 0 600000 redisson <uuid>:1 30000 <uuid>:2 30000
local n = #KEYS / 3
local simple = ARGV[4] == 'simple'
local request = tonumber(ARGV[1])
for i = 0, n - 1 do
  local canceled_key, owner = KEYS[3 * i + 3], ARGV[5 + 2 * i]
  if canceled_upto(canceled_key, owner) >= request then return {-1} end
  if ARGV[2] ~= '0' then cancel_upto(canceled_key, owner, ARGV[2], ARGV[3]) end
end
-- Every member free, or a leftover of its own owner (replaced, as the
-- single acquire does)?
for i = 0, n - 1 do
  local lock, owner = KEYS[3 * i + 1], ARGV[5 + 2 * i]
  local free
  if simple then
    local v = redis.pcall('get', lock)
    if type(v) == 'table' then return {2, i + 1, redis.call('type', lock).ok} end
    free = not v or string.sub(v, 1, #owner) == owner
  else
    local mine = redis.pcall('hexists', lock, owner)
    if type(mine) == 'table' then return {2, i + 1, redis.call('type', lock).ok} end
    free = redis.call('exists', lock) == 0 or (mine == 1 and redis.call('hget', lock, 'mode') ~= 'read')
  end
  if not free then return {0, i + 1, math.max(redis.call('pttl', lock), 0)} end
end
-- The tokens first (a counter past 2^53 fails the set before any hold is
-- written), then the holds.
local reply = {1}
for i = 0, n - 1 do
  local token = new_token(KEYS[3 * i + 2])
  if type(token) == 'table' then return token end
  reply[i + 2] = token
end
for i = 0, n - 1 do
  local lock, owner, lease = KEYS[3 * i + 1], ARGV[5 + 2 * i], ARGV[6 + 2 * i]
  if simple then
    redis.call('set', lock, owner .. string.format('%d', reply[i + 2]), 'px', lease)
  else
    redis.call('hset', lock, owner, 1, 'mode', 'write')
    redis.call('pexpire', lock, lease)
  end
end
return reply
