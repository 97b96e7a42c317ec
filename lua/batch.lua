--[[ moderato: several independent decisions in one call, in order (a batch).

moderato/scripts.py (batch_script) builds the script Redis runs: first
`local scripts = { ... }`, one function per decision script of the registry, in the
registry's order, taking KEYS, ARGV and redis as arguments instead of the globals (each
function is that script's whole text), then this file.

KEYS   every part's keys, part after part
ARGV   part after part: its script's index in `scripts`, its key count, its argument
       count, then its script's own arguments (cost_scaled, apply, per-policy fields).
       The layout only ever grows at its end, so a client can append parts to a call
       until the call is written.

Every part is decided on its own, in order, exactly as if it were sent alone: the same
script text runs on the same keys and arguments, and sees what the parts before it
wrote. TIME is read once, here, and each script's own TIME call answers it, so the parts
see one instant, as calls sent one by one within the same millisecond would. A script
is atomic, so no other client's command comes between two parts.

The reply: one element per part, that part's reply as its script would give it (an
array of integers), or the error reply the script gave or raised, in place: a part's
refusal or failure leaves the parts after it to be decided.
]]

--#include one_instant.lua

-- Hot keys: when a base key repeats in the batch, the parts' state is read once and
-- written once. Their commands go through a cache of the keys they touch: a read of a
-- key cached is answered from it; a key's first write in the batch goes to Redis (so a
-- refusal, an ACL or OOM error, meets the part it belongs to), its later writes only to
-- the cache, and what they left is written back at the end, one command per key. Only the
-- commands the decision scripts use on their state are answered (HMGET, EXISTS, HSET,
-- GET, INCRBY, DECRBY, PEXPIREAT), each only in the plain case (integers within 2^53,
-- an expiry ahead of the batch's instant); anything else writes the key's cached state
-- back, forgets it and goes to Redis as it is, so every reply and the final state are
-- what the parts one by one would have met and left.
local write_back_all
local hot = false
do
  local seen = {}
  for i = 1, #KEYS do
    local key = KEYS[i]
    if seen[key] then
      hot = true
      break
    end
    seen[key] = true
  end
end

if hot then
  local instant_ms = instant[1] * 1000 + (instant[2] - instant[2] % 1000) / 1000
  local cache, dirty_keys = {}, {}
  local real_call, real_pcall = real_redis.call, real_redis.pcall

  -- A written value as Redis stores it (a Lua number as '%.17g' writes it), or nil when
  -- it is not a plain integer within 2^53 (then Redis is asked).
  local function stored_text(value)
    if type(value) == 'string' then
      return value
    end
    if type(value) == 'number' and value == math.floor(value) and value < 9007199254740992 -- MAX_SAFE_INTEGER
        and value > -9007199254740992 then -- MAX_SAFE_INTEGER
      return string.format('%d', value)
    end
    return nil
  end

  local function integer_of(text)
    if text == false then
      return 0
    end
    if type(text) == 'string' and #text < 16 and (text == '0' or string.find(text, '^-?[1-9]%d*$')) then
      return text + 0
    end
    return nil
  end

  local function write_back(key)
    local entry = cache[key]
    cache[key] = nil
    if not entry or not entry.dirty then
      return
    end
    if entry.kind == 'hash' then
      local arguments = {}
      for i, name in ipairs(entry.dirty_order) do
        arguments[2 * i - 1], arguments[2 * i] = name, entry.fields[name]
      end
      if #arguments > 0 then
        real_call('HSET', key, unpack(arguments))
      end
    elseif entry.value_dirty then
      real_call('SET', key, entry.value, 'KEEPTTL')
    end
    if entry.expire_at then
      real_call('PEXPIREAT', key, entry.expire_at)
    end
  end

  local function mark_dirty(key, entry)
    if not entry.dirty then
      entry.dirty = true
      dirty_keys[#dirty_keys + 1] = key
    end
  end

  -- Each returns the reply, or nil to send the command to Redis (the key written back and
  -- forgotten first).
  local answers = {
    HMGET = function(key, ...)
      local entry = cache[key]
      if entry and entry.kind == 'hash' then
        local reply = {}
        for i = 1, select('#', ...) do
          local value = entry.fields[select(i, ...)]
          if value == nil then
            return nil
          end
          reply[i] = value
        end
        return reply
      end
      return nil
    end,
    EXISTS = function(key, ...)
      local entry = cache[key]
      if entry and entry.present ~= nil and select('#', ...) == 0 then
        return entry.present and 1 or 0
      end
      return nil
    end,
    HSET = function(key, ...)
      local entry = cache[key]
      if not (entry and entry.kind == 'hash' and entry.written) then
        return nil
      end
      local count = select('#', ...)
      local texts = {}
      for i = 2, count, 2 do
        local text = stored_text(select(i, ...))
        if not text then
          return nil
        end
        texts[i] = text
      end
      local added = 0
      for i = 1, count, 2 do
        local name = select(i, ...)
        if type(name) ~= 'string' then
          return nil
        end
        local before = entry.fields[name]
        if before == false then
          added = added + 1
        elseif before == nil then
          return nil -- a field this batch never read: Redis knows whether it is new
        end
        if not entry.dirty_fields[name] then
          entry.dirty_fields[name] = true
          entry.dirty_order[#entry.dirty_order + 1] = name
        end
        entry.fields[name] = texts[i + 1]
      end
      mark_dirty(key, entry)
      return added
    end,
    GET = function(key)
      local entry = cache[key]
      if entry and entry.kind == 'string' then
        return entry.value
      end
      return nil
    end,
    PEXPIREAT = function(key, at_ms, ...)
      local entry = cache[key]
      local at = tonumber(at_ms)
      if not (entry and entry.written and entry.present) or select('#', ...) > 0
          or not at or at <= instant_ms or at ~= math.floor(at) then
        return nil
      end
      entry.expire_at = stored_text(at)
      mark_dirty(key, entry)
      return 1
    end,
  }
  local function add_to_counter(sign)
    return function(key, amount)
      local entry = cache[key]
      if not (entry and entry.kind == 'string' and entry.written) then
        return nil
      end
      local current, change = integer_of(entry.value), integer_of(stored_text(amount) or '')
      if not current or not change then
        return nil
      end
      local result = current + sign * change
      if result >= 9007199254740992 or result <= -9007199254740992 then -- MAX_SAFE_INTEGER
        return nil
      end
      entry.value, entry.value_dirty, entry.present = string.format('%d', result), true, true
      mark_dirty(key, entry)
      return result
    end
  end
  answers.INCRBY, answers.DECRBY = add_to_counter(1), add_to_counter(-1)

  -- What Redis's own reply to a command teaches the cache.
  local function learn(command, key, reply, ...)
    if type(reply) == 'table' and reply.err then
      return
    end
    local entry = cache[key]
    if command == 'HMGET' then
      entry = { kind = 'hash', fields = {}, dirty_fields = {}, dirty_order = {} }
      local any = false
      for i = 1, select('#', ...) do
        entry.fields[select(i, ...)] = reply[i]
        any = any or reply[i] ~= false
      end
      if any then
        entry.present = true
      end
      cache[key] = entry
    elseif command == 'EXISTS' then
      if entry and select('#', ...) == 0 then
        entry.present = reply == 1
      end
    elseif command == 'HSET' then
      if entry and entry.kind == 'hash' then
        for i = 1, select('#', ...), 2 do
          entry.fields[select(i, ...)] = stored_text(select(i + 1, ...))
        end
        entry.written, entry.present = true, true
      end
    elseif command == 'GET' then
      cache[key] = { kind = 'string', value = reply, present = reply ~= false }
    elseif command == 'INCRBY' or command == 'DECRBY' then
      -- The counter holds the reply now, whatever was cached of it.
      cache[key] = { kind = 'string', value = string.format('%d', reply), written = true,
        present = true, dirty = entry and entry.dirty }
    end
  end

  local function through(send, command, key, ...)
    local answer = answers[command]
    if answer and type(key) == 'string' then
      local reply = answer(key, ...)
      if reply ~= nil then
        return reply
      end
    end
    if key ~= nil and cache[key] then
      local entry = cache[key]
      -- A first write of a key this batch read: Redis writes it, the cache learns it.
      if not (entry.dirty or answer == nil or command == 'HMGET' or command == 'GET') then
        local reply = send(command, key, ...)
        learn(command, key, reply, ...)
        return reply
      end
      write_back(key)
    end
    local reply = send(command, key, ...)
    if answer and type(key) == 'string' then
      learn(command, key, reply, ...)
    end
    return reply
  end

  redis_at_instant = setmetatable({
    call = function(command, ...)
      if command == 'TIME' then
        return { instant[1], instant[2] }
      end
      return through(real_call, command, ...)
    end,
    pcall = function(command, ...)
      return through(real_pcall, command, ...)
    end,
  }, { __index = real_redis })

  write_back_all = function()
    for _, key in ipairs(dirty_keys) do
      write_back(key)
    end
  end
end

local function refuse(message)
  if write_back_all then
    write_back_all() -- the parts decided before the fault keep what they wrote
  end
  return real_redis.error_reply('MODERATO_ARG batch: ' .. message)
end

local replies = {}
local part_count, key_at, at, argc, keyc = 0, 0, 1, #ARGV, #KEYS
while at <= argc do
  local script = scripts[tonumber(ARGV[at])]
  local key_count, argument_count = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  part_count = part_count + 1
  if not script or not key_count or not argument_count or key_count < 1
      or argument_count < 2 or key_at + key_count > keyc
      or at + 2 + argument_count > argc then
    -- The layout itself is wrong: nothing after this point can be read.
    return refuse('part ' .. part_count .. ' needs a script index, a key count and an'
      .. ' argument count within the call')
  end
  local keys, arguments = {}, {}
  for k = 1, key_count do
    keys[k] = KEYS[key_at + k]
  end
  for a = 1, argument_count do
    arguments[a] = ARGV[at + 2 + a]
  end
  key_at, at = key_at + key_count, at + 3 + argument_count
  -- A script that raises (a command Redis refused) answers that error alone, as the
  -- script sent alone would; what it wrote before stays written, as it would.
  local ok, reply = pcall(script, keys, arguments, redis_at_instant)
  if not ok then
    if type(reply) ~= 'table' or not reply.err then
      reply = real_redis.error_reply('ERR ' .. tostring(reply))
    end
  end
  replies[part_count] = reply
end
if write_back_all then
  write_back_all()
end
if key_at ~= keyc then
  return refuse('the parts name ' .. key_at .. ' keys, got ' .. keyc)
end
return replies
