-- A waiting writer gives up (timed out, canceled, failed): its record in
-- the writers key goes, and when no writer waits any more the readers that
-- queued behind them are woken ("1" on the read-write channel). KEYS:
-- writers key, read-write channel. ARGV: owner field. Returns 1 when a
-- record was removed, else 0.
local n = redis.call('zrem', KEYS[1], ARGV[1])
if n == 1 and redis.call('zcard', KEYS[1]) == 0 then
  redis.call('publish', KEYS[2], '1')
end
return n
