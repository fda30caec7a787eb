-- The operator's release. KEYS: lock, channel. ARGV: the layout's key type.
-- Returns 1 = deleted, 0 = nothing there, or the type name of a key of
-- another type (left intact).
local t = redis.call('type', KEYS[1]).ok
if t == 'none' then return 0 end
if t ~= ARGV[1] then return t end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], '0')
return 1
