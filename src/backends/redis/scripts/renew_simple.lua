-- renew, simple layout. KEYS: lock_1..lock_n. ARGV: value_1, lease_1, '',
-- ... (the third of each is the Redisson layout's reader timeout key,
-- always '' here). Returns one 1 (renewed) or 0 (gone) per key.
local r = {}
for i = 1, #KEYS do
  if redis.pcall('get', KEYS[i]) == ARGV[3*i-2] then
    redis.call('pexpire', KEYS[i], ARGV[3*i-1])
    r[i] = 1
  else r[i] = 0 end
end
return r
