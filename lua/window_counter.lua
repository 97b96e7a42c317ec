-- moderato: the general path's write of a window counter, shared by fixed_window.lua and
-- sliding_window.lua, spliced in after prelude.lua (see moderato/scripts.py).

-- A charged counter's new value in one command, leaving what the one-policy paths leave
-- (INCRBY, and PEXPIREAT on a counter found at 0): with its expiry when it was found at 0
-- (expire_at_ms), else keeping the one it has (expire_at_ms false).
local function write_counter(key, used_scaled, expire_at_ms)
  if expire_at_ms then
    redis.call('SET', key, used_scaled, 'PXAT', expire_at_ms)
  else
    redis.call('SET', key, used_scaled, 'KEEPTTL')
  end
end
