-- renew, Redisson layout. KEYS: lock_1..lock_n. ARGV: owner_1, lease_1, ...,
-- owner_n, lease_n. Returns one 1 (renewed) or 0 (gone) per key.
local r = {}
for i = 1, #KEYS do
  if redis.pcall('hexists', KEYS[i], ARGV[2*i-1]) == 1 then
    redis.call('pexpire', KEYS[i], ARGV[2*i])
    r[i] = 1
  else r[i] = 0 end
end
return r
