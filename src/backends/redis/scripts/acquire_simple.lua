-- acquire, simple layout (SET NX PX): the value is "<uuid>:<tid>:<token>".
-- KEYS: lock, token key, canceled key (then the Redisson layout's writers
-- key and timeout base, unused). ARGV: lease ms, owner prefix
-- "<uuid>:<tid>:", request number, the number of the attempt this one
-- retries (0 for a first attempt), life ms of a cancellation record (then
-- the Redisson layout's mode and writer stage: always 'write', unused).
-- Returns as acquire_redisson.lua does; the canceled key's field is the
-- owner prefix.
if ARGV[4] ~= '0' then
  local canceled = tonumber(redis.call('hget', KEYS[3], ARGV[2]) or '0')
  if canceled >= tonumber(ARGV[3]) then return -1 end
  if canceled < tonumber(ARGV[4]) then
    redis.call('hset', KEYS[3], ARGV[2], ARGV[4])
    redis.call('pexpire', KEYS[3], ARGV[5])
  end
end
-- A value of ours is a leftover of a release that did not reach the
-- server (the core calls acquire only for an owner that holds nothing
-- here), or of this acquire's own attempt whose reply was lost: either
-- way it is replaced, with a new token.
local v = redis.pcall('get', KEYS[1])
if type(v) == 'table' then return redis.call('type', KEYS[1]).ok end
if not v or string.sub(v, 1, #ARGV[2]) == ARGV[2] then
  local canceled = redis.call('hget', KEYS[3], ARGV[2])
  if canceled and tonumber(canceled) >= tonumber(ARGV[3]) then return -1 end
  local token = redis.call('incr', KEYS[2])
  if token < 1e15 then
    -- The counter was absent (a new name, or the data was lost in a
    -- restart) or below 10^15, which no clock seed gives (restarted at 1
    -- by a Redisson client, older than this rule, or negative): go on
    -- from the server's clock in microseconds, so tokens keep increasing
    -- across data loss.
    local t = redis.call('time')
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    if now > token then
      token = now
      redis.call('set', KEYS[2], string.format('%d', token))
    end
  elseif token >= 9007199254740992 then
    return redis.error_reply('DLOCK token counter ' .. KEYS[2] .. ' is at ' .. redis.call('get', KEYS[2]) ..
      ', past 2^53 (9007199254740992) where script numbers stop being exact: tokens would repeat; no hold written')
  end
  redis.call('set', KEYS[1], ARGV[2] .. string.format('%d', token), 'px', ARGV[1])
  return token
end
return -3 - redis.call('pttl', KEYS[1])
