-- moderato: what a script running other scripts as parts does first (lua/together.lua),
-- spliced in at its include line: read TIME once, and hand the parts a
-- `redis` whose TIME answers that instant, so every part decides at one instant.
local real_redis = redis
local instant = real_redis.call('TIME')
local redis_at_instant = setmetatable({
  call = function(command, ...)
    if command == 'TIME' then
      return { instant[1], instant[2] }
    end
    return real_redis.call(command, ...)
  end,
}, { __index = real_redis })
