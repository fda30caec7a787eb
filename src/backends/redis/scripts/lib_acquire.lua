-- lib_acquire.lua: what the acquire scripts share (acquire_redisson.lua,
-- acquire_simple.lua, fair_lock.lua, acquire_multi.lua, sem_acquire.lua).
-- EVAL takes one script, so scripts.c embeds this file in front of each of
-- them; to run one by hand, put it in front too: cat lib_acquire.lua
-- acquire_simple.lua > /tmp/a.lua, then redis-cli --eval /tmp/a.lua ... A
-- token key counts a lock's (or a semaphore's) fencing tokens; a canceled
-- key is a hash: owner field = highest canceled request number (see
-- "Ambiguous replies" in docs/protocol-redis.md).

-- The server's clock in milliseconds.
local function now_ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The next fencing token of token key COUNTER, or an error reply (a
-- table) when the counter has reached 2^53.
local function new_token(counter)
  local token = redis.call('incr', counter)
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
      redis.call('set', counter, string.format('%d', token))
    end
  elseif token >= 9007199254740992 then
    return redis.error_reply('DLOCK token counter ' .. counter .. ' is at ' .. redis.call('get', counter) ..
      ', past 2^53 (9007199254740992) where script numbers stop being exact: tokens would repeat; no hold written')
  end
  return token
end

-- The highest request number of OWNER that canceled key CANCELED records
-- (0: none).
local function canceled_upto(canceled, owner)
  return tonumber(redis.call('hget', canceled, owner) or '0')
end

-- Record in canceled key CANCELED that OWNER's requests up to NUMBER are
-- canceled; the record lives LIFE ms.
local function cancel_upto(canceled, owner, number, life)
  if canceled_upto(canceled, owner) < tonumber(number) then
    redis.call('hset', canceled, owner, number)
    redis.call('pexpire', canceled, life)
  end
end

-- Lock-delay (docs/protocol-redis.md, "Lock-delay"): an exclusive hold
-- taken with a delay leaves MARKER, a hash {token, delay} without expiry,
-- that its clean release deletes. What an acquire answers while a name
-- is in its delay: DELAY_REPLY - MS, MS the ms left (below every busy
-- reply, -3 - MS).
local DELAY_REPLY = -1125899906842624 -- -2^50

-- The ms left of the delay MARKER keeps (0: none; MARKER nil: a script
-- call without one, Redlock's), and whether MARKER is known to be gone
-- (delay_arm need not delete it then). Found without expiry while the
-- lock key is gone, the marker's hold ended without its clean release
-- (its lease ran out, or someone forced it): its delay starts now, timed
-- by this server's expiry, the same for every acquirer.
local function delay_left(marker)
  if not marker then return 0, true end
  local left = redis.call('pttl', marker)
  if left == -1 then
    left = tonumber(redis.call('hget', marker, 'delay') or '0') or 0
    if left <= 0 then
      redis.call('del', marker)
      return 0, true
    end
    redis.call('pexpire', marker, left)
  end
  if left < 0 then return 0, true end -- -2: no such key
  return left, false
end

-- A new exclusive hold of TOKEN: MARKER says so until its clean release
-- when it has a delay (DELAY_MS, '0' or nil: none; any old marker goes,
-- unless GONE says delay_left found none).
local function delay_arm(marker, token, delay_ms, gone)
  if not marker then return end
  if not gone then redis.call('del', marker) end
  if delay_ms and delay_ms ~= '0' then
    redis.call('hset', marker, 'token', string.format('%d', token), 'delay', delay_ms)
  end
end
