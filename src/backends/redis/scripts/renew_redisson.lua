-- renew, Redisson layout. KEYS: lock_1..lock_n. ARGV: owner_1, lease_1,
-- timeout_1, ..., owner_n, lease_n, timeout_n: TIMEOUT is '' for an
-- exclusive hold, the reader's timeout key ({N}:<owner>:rwlock_timeout:1)
-- for a shared one, renewed with the hash, which then keeps the longest
-- lease of its readers (as Redisson's read lock does). A reader whose own
-- timeout key expired is gone (its field stays until the readers leave).
-- Returns one 1 (renewed) or 0 (gone) per key.
local r = {}
for i = 1, #KEYS do
  local lease = ARGV[3*i-1]
  if redis.pcall('hexists', KEYS[i], ARGV[3*i-2]) ~= 1 then
    r[i] = 0
  elseif ARGV[3*i] == '' then
    redis.call('pexpire', KEYS[i], lease)
    r[i] = 1
  elseif redis.call('pexpire', ARGV[3*i], lease) == 1 then
    if redis.call('pttl', KEYS[i]) < tonumber(lease) then redis.call('pexpire', KEYS[i], lease) end
    r[i] = 1
  else r[i] = 0 end
end
return r
