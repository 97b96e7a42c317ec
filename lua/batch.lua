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

local function refuse(message)
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
if key_at ~= keyc then
  return refuse('the parts name ' .. key_at .. ' keys, got ' .. keyc)
end
return replies
