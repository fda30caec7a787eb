-- fair_lock.lua: the fair layout (docs/protocol-redis.md, "Fair locks").
-- The lock itself is Redisson's (a HASH: owner field = hold count, "mode" =
-- "write", PEXPIRE = lease; the token counter redisson_lock_token:{N}), so
-- RLock and dlock's other layouts still exclude it. Beside it, waiters queue
-- in arrival order, and a release hands the lock to the first live waiter
-- inside the script and tells only that waiter, on its own channel.
-- KEYS: 1 lock, 2 token key, 3 canceled key (dlock_canceled:{N}), 4 queue
-- (dlock_fair_queue:{N}: a ZSET, owner -> arrival number), 5 waiters
-- (dlock_fair_waiters:{N}: a HASH, owner -> record), 6 the lock's channel
-- (redisson_lock__channel:{N}), 7 (optional) the lock-delay marker
-- (dlock_delay:{N}, lib_acquire.lua).
-- ARGV: 1 op, 2 owner field, 3 acquire: the channel where the owner's
-- client hears its grants (dlock_fair__channel:<client uuid>), else '', then
--   acquire: 4 lease ms, 5 request number, 6 the number of the attempt this
--            one retries ('0' for a first attempt), 7 life ms of a
--            cancellation record, 8 queue lease ms, 9 stage ('0' try once,
--            '1' the first try of a wait, '2' a later one), 10 wait id
--            '<wait>.<try>' (the try's own number, new for every try),
--            11 (optional) the hold's lock-delay ms ('0': none)
--   release: 4 our token, 5 life ms of the hand-off record
--   leave:   4 the last request number to cancel ('0': none), 5 life ms of
--            the cancellation record
--   waiters: none (read only: the live waiters' owners, in order; nil when
--            there is no queue)
-- A waiter's record is 'w <deadline ms> <lease ms> <wait id> <channel>
-- <queue lease ms> <lock-delay ms>' while it waits (the deadline is its queue lease: a
-- waiter refreshes it while it waits, a dead one is dropped once it
-- passes), 'g <token> <wait id>' once the lock was handed to it; 'r:<owner>' = token records a release that
-- handed the lock on, so a retried release knows it ran. The grant message
-- on the waiter's channel is '<wait id> <token>'. A waiter that joins the
-- queue says 'dlock-wait <owner>' on the lock's channel (a holder told of
-- its waiters listens there; waiters and Redisson's clients ignore it).
-- acquire returns the token (>= 0) when taken or handed over; -3 - MS
-- (< -1) when busy, MS being the holder's remaining lease (-1: none); -1
-- when this request was canceled; a type name when the lock key is not a
-- hash. release returns 1 released, 2 released already (a retry), 0 not
-- ours, or a type name. leave returns 2 when it gave up a lock handed to
-- the owner (passed on to the next waiter), else 1.
-- Run by hand (with lib_acquire.lua in front): redis-cli --eval /tmp/a.lua N redisson_lock_token:{N} dlock_canceled:{N} dlock_fair_queue:{N} dlock_fair_waiters:{N} redisson_lock__channel:{N} , acquire <uuid>:1 dlock_fair__channel:<uuid> 30000 1 0 600000 5000 1 7
local op, owner = ARGV[1], ARGV[2]

-- The wait a wait id '<wait>.<try>' belongs to (a grant names the try,
-- a queue entry keeps its place across the tries of one wait).
local function wait_of(id)
  return string.match(id or '', '^[^.]*')
end

local function words(s)
  local w = {}
  for x in string.gmatch(s or '', '%S+') do w[#w + 1] = x end
  return w
end

-- The queue's keys live at least MS more.
local function keep(ms)
  for i = 4, 5 do
    if redis.call('pttl', KEYS[i]) < ms then redis.call('pexpire', KEYS[i], ms) end
  end
end

-- The server's clock in ms, read once per call and only when a queue
-- record needs it (an uncontended pair never does).
local clock_ms
local function clock()
  if not clock_ms then clock_ms = now_ms() end
  return clock_ms
end

-- The first waiter whose queue lease has not run out, and its record;
-- the dead ones before it are dropped.
local function first_live()
  while true do
    local head = redis.call('zrange', KEYS[4], 0, 0)[1]
    if not head then return nil end
    local w = words(redis.call('hget', KEYS[5], head))
    if w[1] == 'w' and #w >= 6 and tonumber(w[2]) >= clock() then return head, w end
    redis.call('zrem', KEYS[4], head)
    if w[1] == 'w' then redis.call('hdel', KEYS[5], head) end
  end
end

-- Hand the free lock to waiter HEAD (record W): it owns it from now on with
-- a new token, and learns so from one message. The lease granted is its
-- queue lease (when shorter than its lease): all we know is that it was
-- alive within that long, so a waiter that died holds the queue up no
-- longer; a live one extends the hold to its lease at once (its keeper's
-- renewal).
local function grant(head, w)
  local token = new_token(KEYS[2])
  if type(token) == 'table' then return token end
  local t = string.format('%d', token)
  redis.call('hset', KEYS[1], head, 1, 'mode', 'write')
  redis.call('pexpire', KEYS[1], math.min(tonumber(w[3]), tonumber(w[6])))
  redis.call('zrem', KEYS[4], head)
  redis.call('hset', KEYS[5], head, 'g ' .. t .. ' ' .. w[4])
  delay_arm(KEYS[7], token, w[7])
  redis.call('publish', w[5], w[4] .. ' ' .. t)
  return token
end

-- The lock just became free: to the first live waiter, or, with nobody
-- queued, Redisson's unlock message for everyone else's waiters.
local function hand_off()
  local head, w = first_live()
  if head then return grant(head, w) end
  redis.call('publish', KEYS[6], '0')
  return nil
end

-- Whether our field is in the lock, which also says the lock key is a
-- hash or none: any other type answers WRONGTYPE, and its name is our
-- reply. Nothing below changes the lock key before it is read again.
local ours = redis.pcall('hexists', KEYS[1], owner)
if type(ours) == 'table' then return redis.call('type', KEYS[1]).ok end

if op == 'acquire' then
  if ARGV[6] ~= '0' then cancel_upto(KEYS[3], owner, ARGV[6], ARGV[7]) end
  if canceled_upto(KEYS[3], owner) >= tonumber(ARGV[5]) then return -1 end
  local mine = words(redis.call('hget', KEYS[5], owner))
  if mine[1] == 'g' then
    -- handed to us: this try learns it (the message was lost or is late),
    -- and, alive, takes the lease it asks for
    redis.call('hdel', KEYS[5], owner)
    if ours == 1 then
      redis.call('pexpire', KEYS[1], ARGV[4])
      return tonumber(mine[2])
    end
    mine = {} -- its lease ran out before we learned: a new arrival
  end
  redis.call('hdel', KEYS[5], 'r:' .. owner)
  -- A field of ours without a grant is a leftover (acquire_redisson.lua):
  -- dropped as the release that never arrived would have; we take the
  -- lock anew (count 1, a new token) or queue like anyone else.
  if ours == 1 and redis.call('hget', KEYS[1], 'mode') ~= 'read' then
    redis.call('del', KEYS[1])
  end
  local free = redis.call('exists', KEYS[1]) == 0
  -- free but in a lock-delay: nobody gets it until its end; a waiter
  -- still queues, in order, and tries again then
  local left, unmarked = 0, false
  if free then left, unmarked = delay_left(KEYS[7]) end
  if left > 0 then free = false end
  local head, hw = first_live()
  if free and (head == nil or head == owner) then
    local token = new_token(KEYS[2])
    if type(token) == 'table' then return token end
    redis.call('hset', KEYS[1], owner, 1, 'mode', 'write')
    redis.call('pexpire', KEYS[1], ARGV[4])
    -- our place in the queue and our record, when we had them (a head
    -- nil: first_live emptied the queue)
    if head == owner then redis.call('zrem', KEYS[4], owner) end
    if mine[1] then redis.call('hdel', KEYS[5], owner) end
    delay_arm(KEYS[7], token, ARGV[11], unmarked)
    return token
  end
  if free then
    -- free (a lease ran out, a release of another layout) with a live
    -- waiter before us: it is that waiter's now
    local g = grant(head, hw)
    if type(g) == 'table' then return g end
  end
  if ARGV[9] ~= '0' then
    if not (mine[1] == 'w' and wait_of(mine[4]) == wait_of(ARGV[10])) or not redis.call('zscore', KEYS[4], owner) then
      -- a new wait goes to the back, whatever an older one of ours left,
      -- and says so to a holder that listens (contend.c)
      local last = redis.call('zrange', KEYS[4], -1, -1, 'withscores')
      redis.call('zadd', KEYS[4], last[2] and tonumber(last[2]) + 1 or 1, owner)
      redis.call('publish', KEYS[6], 'dlock-wait ' .. owner)
    end
    local qlease = tonumber(ARGV[8])
    redis.call('hset', KEYS[5], owner, string.format('w %d %s %s %s %d %s', clock() + qlease, ARGV[4], ARGV[10], ARGV[3], qlease, ARGV[11] or '0'))
    keep(2 * qlease)
  end
  if left > 0 then return DELAY_REPLY - left end
  return -3 - redis.call('pttl', KEYS[1])
elseif op == 'release' then
  -- Our field is our hold only while the token key holds our token (or
  -- is gone): a later hold of the same owner has the same field and a
  -- greater token, and a late copy of this release leaves it, and that
  -- owner's queue record, alone ("Late releases and cancels").
  local counter = redis.call('get', KEYS[2])
  if counter and counter ~= ARGV[4] then
    if redis.call('hget', KEYS[5], 'r:' .. owner) == ARGV[4] then return 2 end
    return 0
  end
  redis.call('hdel', KEYS[5], owner) -- the record of a grant we learned by message
  if ours == 1 then
    redis.call('del', KEYS[1]) -- our field with it: an exclusive hold has no other
    -- a clean release: no lock-delay (a grant below arms the next one's)
    if KEYS[7] and redis.call('hget', KEYS[7], 'token') == ARGV[4] then redis.call('del', KEYS[7]) end
    local g = hand_off()
    if type(g) == 'table' then return g end
    if g then
      redis.call('hset', KEYS[5], 'r:' .. owner, ARGV[4])
      keep(tonumber(ARGV[5]))
    end
    return 1
  end
  if redis.call('exists', KEYS[1]) == 0 and redis.call('get', KEYS[2]) == ARGV[4] then return 2 end
  if redis.call('hget', KEYS[5], 'r:' .. owner) == ARGV[4] then return 2 end
  return 0
elseif op == 'leave' then
  if ARGV[4] ~= '0' then
    -- only the copy that raises the record acts: once a leave of number L
    -- ran, a field or queue entry of ours is a later wait's or hold's
    if canceled_upto(KEYS[3], owner) >= tonumber(ARGV[4]) then return 1 end
    cancel_upto(KEYS[3], owner, ARGV[4], ARGV[5])
  end
  redis.call('zrem', KEYS[4], owner)
  redis.call('hdel', KEYS[5], owner)
  local r = 1
  -- A lock handed to us as we gave up, or taken by an attempt whose reply
  -- was lost: given up, to the next waiter.
  if ours == 1 and redis.call('hget', KEYS[1], 'mode') ~= 'read' then
    redis.call('del', KEYS[1])
    if KEYS[7] then redis.call('del', KEYS[7]) end -- its marker (each arm replaces the last): unused
    r = 2
  end
  -- free now (ours given up, or we were the head of a free lock): the
  -- next waiter's, unless a hold that ended uncleanly left a lock-delay
  if redis.call('exists', KEYS[1]) == 0 and (r == 2 or redis.call('zcard', KEYS[4]) > 0) and
     delay_left(KEYS[7]) == 0 then
    local g = hand_off()
    if type(g) == 'table' then return g end
  end
  return r
elseif op == 'waiters' then
  -- read only: the live waiters, first to last; nil without a queue (a
  -- client of another layout then knows nothing of its waiters)
  if redis.call('exists', KEYS[4]) == 0 then return nil end
  local r = {}
  for _, o in ipairs(redis.call('zrange', KEYS[4], 0, -1)) do
    local w = words(redis.call('hget', KEYS[5], o))
    if w[1] == 'w' and tonumber(w[2]) >= clock() then r[#r + 1] = o end
  end
  return r
end
return redis.error_reply('DLOCK fair_lock.lua: unknown op ' .. tostring(op))
