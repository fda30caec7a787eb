-- The operator's release. KEYS: lock, channel. ARGV: the layout's key type.
-- Deletes only a key of a lock's shape: a hash whose every field is an
-- owner "<uuid>:<thread>" (Redisson, dlock), a Redisson writer
-- "<uuid>:<thread>:write" or the read-write lock's "mode", or a string
-- "<uuid>:<thread>:<token>" (dlock's simple layout). Returns 1 = deleted, 0 = nothing
-- there, or what the key holds instead (left intact).
local t = redis.call('type', KEYS[1]).ok
if t == 'none' then return 0 end
if t ~= ARGV[1] then return t end
local uuid = '%x%x%x%x%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x'
if t == 'hash' then
  local fields = redis.call('hkeys', KEYS[1])
  for i = 1, #fields do
    if fields[i] ~= 'mode' and not string.find(fields[i], '^' .. uuid .. ':%d+$') and
        not string.find(fields[i], '^' .. uuid .. ':%d+:write$') then
      return 'hash whose fields are not lock owners (<uuid>:<thread>)'
    end
  end
elseif not string.find(redis.call('get', KEYS[1]), '^' .. uuid .. ':%d+:%d+$') then
  return "string that is not dlock's lock value (<uuid>:<thread>:<token>)"
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], '0')
return 1
