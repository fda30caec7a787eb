-- acquire, Redisson layout: an exclusive hold as RLock / RFencedLock take it
-- (plus RReadWriteLock's "mode" = "write", so Redisson's read-write locks
-- see it), a shared one as RReadWriteLock's read lock. KEYS: lock, token
-- key, canceled key, writers key (dlock_writers:{N}), timeout base ({N}),
-- and (optional: not on Redlock nodes) the lock-delay marker
-- (dlock_delay:{N}). ARGV: lease ms, owner field, request number, the
-- number of the attempt this one retries (0 for a first attempt), life ms
-- of a cancellation record, 'write' or 'read', for a writer its stage: '0'
-- try once, '1' the first try of a wait, '2' a later try of it; then
-- (with the marker) the hold's lock-delay in ms, '0' for none.
-- Returns the token (>= 0) when taken; -3 - MS (< -1) when busy, MS being
-- how long the holder's lease (or the waiting writer's record) still runs;
-- DELAY_REPLY - MS when free but in its lock-delay for MS more;
-- -1 when this request was canceled (nothing written); a type name when
-- the lock key is not a hash (nothing written).
-- A field of ours that already exists is a leftover of a release that
-- did not reach the server, or this acquire's own earlier attempt whose
-- reply was lost (the core only calls acquire for an owner that holds
-- nothing here): either way it is replaced, count 1 and a new token,
-- never adopted with its old token. The canceled key (a hash: owner field = highest canceled
-- request number) makes an attempt that reaches the server after its
-- acquire gave up do nothing: see "Ambiguous replies" in
-- docs/protocol-redis.md. A writer that has to wait records itself in the
-- writers key (a sorted set: owner field -> when the record lapses, server
-- ms) and new readers wait behind it: see "Read-write locks".
-- Run by hand (with lib_acquire.lua in front): redis-cli --eval /tmp/a.lua N redisson_lock_token:{N} dlock_canceled:{N} dlock_writers:{N} {N} , 30000 <uuid>:1 1 0 600000 write 0
if ARGV[4] ~= '0' then
  if canceled_upto(KEYS[3], ARGV[2]) >= tonumber(ARGV[3]) then return -1 end
  cancel_upto(KEYS[3], ARGV[2], ARGV[4], ARGV[5])
end
-- The next fencing token, nil when this request was canceled.
local function next_token()
  if canceled_upto(KEYS[3], ARGV[2]) >= tonumber(ARGV[3]) then return nil end
  return new_token(KEYS[2])
end
if ARGV[6] == 'write' then
  local mine = redis.pcall('hexists', KEYS[1], ARGV[2])
  if type(mine) == 'table' then return redis.call('type', KEYS[1]).ok end
  local free = redis.call('exists', KEYS[1]) == 0
  local unmarked = false -- no lock-delay marker (delay_left found none)
  if free then
    local left
    left, unmarked = delay_left(KEYS[6])
    if left > 0 then return DELAY_REPLY - left end
  end
  if free or (mine == 1 and redis.call('hget', KEYS[1], 'mode') ~= 'read') then
    local token = next_token()
    if token == nil then return -1 end
    if type(token) == 'table' then return token end
    redis.call('hset', KEYS[1], ARGV[2], 1, 'mode', 'write')
    redis.call('pexpire', KEYS[1], ARGV[1])
    delay_arm(KEYS[6], token, ARGV[8], unmarked)
    if ARGV[7] == '2' then redis.call('zrem', KEYS[4], ARGV[2]) end
    return token
  end
  local pttl = redis.call('pttl', KEYS[1])
  if ARGV[7] ~= '0' then
    -- Waiting: new readers queue behind us until we get in, give up, or
    -- stop retrying for a lease longer than the holder's (we crashed).
    local life = math.max(pttl, 0) + tonumber(ARGV[1])
    redis.call('zadd', KEYS[4], now_ms() + life, ARGV[2])
    redis.call('pexpire', KEYS[4], life)
  end
  return -3 - pttl
end
-- read
local mode = redis.pcall('hget', KEYS[1], 'mode')
if type(mode) == 'table' then return redis.call('type', KEYS[1]).ok end
local timeout = KEYS[5] .. ':' .. ARGV[2] .. ':rwlock_timeout:1'
if mode == 'read' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hdel', KEYS[1], ARGV[2]) -- our leftover: taken anew below
  redis.call('del', timeout)
  if redis.call('hlen', KEYS[1]) <= 1 then
    redis.call('del', KEYS[1])
    mode = false
  end
end
if mode == 'write' or (mode == false and redis.call('exists', KEYS[1]) == 1) then
  return -3 - redis.call('pttl', KEYS[1]) -- a writer, or an RLock (no mode)
end
if mode == false then -- free: in a writer's lock-delay?
  local left = delay_left(KEYS[6])
  if left > 0 then return DELAY_REPLY - left end
end
local first = redis.call('zrange', KEYS[4], 0, 0, 'withscores')
if #first > 0 then
  local now = now_ms()
  redis.call('zremrangebyscore', KEYS[4], '-inf', now)
  first = redis.call('zrange', KEYS[4], 0, 0, 'withscores')
  if #first > 0 then
    local wait = tonumber(first[2]) - now
    if mode then
      local pttl = redis.call('pttl', KEYS[1])
      if pttl >= 0 and pttl < wait then wait = pttl end
    end
    return -3 - wait
  end
end
local token = next_token()
if token == nil then return -1 end
if type(token) == 'table' then return token end
if mode then
  redis.call('hset', KEYS[1], ARGV[2], 1)
else
  redis.call('hset', KEYS[1], 'mode', 'read', ARGV[2], 1)
end
redis.call('set', timeout, string.format('%d', token), 'px', ARGV[1])
if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('pexpire', KEYS[1], ARGV[1])
end
return token
