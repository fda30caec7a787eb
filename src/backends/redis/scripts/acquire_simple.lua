-- acquire, simple layout (SET NX PX): the value is "<uuid>:<tid>:<token>".
-- KEYS: lock, token key, canceled key, the writers key (dlock_writers:{N}),
-- the Redisson layout's timeout base (unused), and (optional) the
-- lock-delay marker.
-- ARGV: lease ms, owner prefix "<uuid>:<tid>:", request number, the
-- number of the attempt this one retries (0 for a first attempt), life ms
-- of a cancellation record, the Redisson layout's mode (always 'write',
-- unused), the writer's stage ('0' try once, '1' the first try of a wait,
-- '2' a later one), then the hold's lock-delay ms ('0').
-- Returns as acquire_redisson.lua does; the canceled key's field is the
-- owner prefix. A waiting writer (stage '1' or '2') records itself in the
-- writers key as the Redisson layout's do, by its owner field (the prefix
-- without its last ':'), so that a holder told of its waiters finds those
-- already waiting (contend.c); a later try that takes the lock drops it.
if ARGV[4] ~= '0' then
  if canceled_upto(KEYS[3], ARGV[2]) >= tonumber(ARGV[3]) then return -1 end
  cancel_upto(KEYS[3], ARGV[2], ARGV[4], ARGV[5])
end
-- A value of ours is a leftover of a release that did not reach the
-- server (the core calls acquire only for an owner that holds nothing
-- here), or of this acquire's own attempt whose reply was lost: either
-- way it is replaced, with a new token.
local v = redis.pcall('get', KEYS[1])
if type(v) == 'table' then return redis.call('type', KEYS[1]).ok end
local unmarked = false -- no lock-delay marker (delay_left found none)
if not v then
  local left
  left, unmarked = delay_left(KEYS[6])
  if left > 0 then return DELAY_REPLY - left end
end
if not v or string.sub(v, 1, #ARGV[2]) == ARGV[2] then
  if canceled_upto(KEYS[3], ARGV[2]) >= tonumber(ARGV[3]) then return -1 end
  local token = new_token(KEYS[2])
  if type(token) == 'table' then return token end
  redis.call('set', KEYS[1], ARGV[2] .. string.format('%d', token), 'px', ARGV[1])
  delay_arm(KEYS[6], token, ARGV[8], unmarked)
  if ARGV[7] == '2' then redis.call('zrem', KEYS[4], string.sub(ARGV[2], 1, -2)) end
  return token
end
local pttl = redis.call('pttl', KEYS[1])
if ARGV[7] == '1' or ARGV[7] == '2' then
  local life = math.max(pttl, 0) + tonumber(ARGV[1])
  redis.call('zadd', KEYS[4], now_ms() + life, string.sub(ARGV[2], 1, -2))
  redis.call('pexpire', KEYS[4], life)
end
return -3 - pttl
