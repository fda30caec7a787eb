-- release of a multi-lock's set in one call: release_redisson.lua or
-- release_simple.lua (ARGV[1] says which layout) run over every member, so
-- each is checked against its own owner and token and publishes its own
-- unlock message(s), exactly as its single release would. KEYS: 4 per
-- member (lock, channel, token key, read-write channel). ARGV: the layout,
-- then 2 per member (its owner value, its token). Returns one status per
-- member, as the single script returns it: 1 released, 2 free with our
-- token still last (a retry, or an expired lease), 0 not ours (a field of
-- ours with a token key past our token is a later hold's), or a type name
-- (WRONGTYPE).
local simple = ARGV[1] == 'simple'
local out = {}
for i = 1, #KEYS / 4 do
  local lock, chan, tok, rwchan = KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i]
  local value, token = ARGV[2 * i], ARGV[2 * i + 1]
  local status = 0
  if simple then
    local v = redis.pcall('get', lock)
    if type(v) == 'table' then
      status = redis.call('type', lock).ok
    elseif v == value then
      redis.call('del', lock)
      redis.call('publish', chan, '0')
      status = 1
    elseif v == false and redis.call('get', tok) == token then
      status = 2
    end
  else
    local mine = redis.pcall('hexists', lock, value)
    local counter = redis.call('get', tok)
    if type(mine) == 'table' then
      status = redis.call('type', lock).ok
    elseif mine == 1 and redis.call('hget', lock, 'mode') == 'read' then
      redis.call('hdel', lock, value)
      status = redis.call('hlen', lock) > 1 and 1 or 3
    elseif mine == 1 and (counter == token or counter == false) then
      -- ours only while the token key holds our token: a later hold of
      -- the same owner has the same field and a greater token
      redis.call('hdel', lock, value)
      status = 3
    elseif redis.call('exists', lock) == 0 and counter == token then
      status = 2
    end
    if status == 3 then
      redis.call('del', lock)
      redis.call('publish', chan, '0')
      redis.call('publish', rwchan, '1')
      status = 1
    end
  end
  out[i] = status
end
return out
