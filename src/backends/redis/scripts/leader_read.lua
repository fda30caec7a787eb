local t = redis.call('type', KEYS[1]).ok
local holder = ''
if t == 'hash' then local f = redis.call('hkeys', KEYS[1]); holder = f[1] or ''
elseif t == 'string' then holder = redis.call('get', KEYS[1]) end
local v = redis.call('hmget', KEYS[2], 'token', 'version', 'value')
return {t == 'none' and 0 or 1, holder, redis.call('get', KEYS[3]) or '0',
        v[1] or '0', v[2] or '0', v[3] or '', redis.call('pttl', KEYS[1])}
