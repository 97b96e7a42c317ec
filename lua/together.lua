--[[ moderato: several decisions as one, atomically: every part is charged, or none is.

moderato/scripts.py (composite_script) builds the script Redis runs: first
`local scripts = { ... }`, one function per decision script taking KEYS, ARGV and
redis as arguments instead of the globals (each function is that script's whole text),
then this file.

KEYS   every part's keys, part after part
ARGV   the number of parts n; then per part: its script's index in `scripts`, its key
       count, its argument count; then every part's arguments, part after part: its
       script's own (cost_scaled, apply, then the per-policy fields), apply as "1"

Every part sees one instant: TIME is read once, here, and each script's own TIME call
answers it. The parts but the last are peeked (apply "0": the same reply, nothing
written); when all of them fit, the last one decides and charges at once, and only when
it fits too are the others charged. A charge finds what its peek found (the parts' keys
are distinct, the instant is the same, and the scripts are deterministic), so it fits.
When a part does not fit, nothing is written and every part's reply is its peek (the last
one's: its decision, which wrote nothing).

The reply: the parts' replies, each in its script's own layout, one after another. An
error reply from a part (a refused argument, unreadable state) is the reply.
]]

--#include one_instant.lua

local function refuse(message)
  return real_redis.error_reply('MODERATO_ARG composite: ' .. message)
end

local part_count = tonumber(ARGV[1])
if not part_count or part_count < 1 or #ARGV < 1 + 3 * part_count then
  return refuse('ARGV[1] must count the parts, each with three fields after it')
end
local parts = {}
local key_at, argument_at = 0, 1 + 3 * part_count
for i = 1, part_count do
  local script = scripts[tonumber(ARGV[3 * i - 1])]
  local key_count, argument_count = tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  if not script or not key_count or not argument_count or key_count < 1 or argument_count < 2 then
    return refuse('part ' .. i .. ' needs a script index, a key count and an argument count')
  end
  local keys, arguments = {}, {}
  for k = 1, key_count do
    keys[k] = KEYS[key_at + k]
  end
  for a = 1, argument_count do
    arguments[a] = ARGV[argument_at + a]
  end
  key_at, argument_at = key_at + key_count, argument_at + argument_count
  parts[i] = { script, keys, arguments }
end
if key_at ~= #KEYS or argument_at ~= #ARGV then
  return refuse('the parts name ' .. key_at .. ' keys and ' .. argument_at
    .. ' arguments, got ' .. #KEYS .. ' and ' .. #ARGV)
end

local function run(i, apply)
  local part = parts[i]
  part[3][2] = apply
  return part[1](part[2], part[3], redis_at_instant)
end

local replies = {}

-- Every part but the last, with apply, into replies; a part's error reply ends it.
local function run_others(apply)
  for i = 1, part_count - 1 do
    local reply = run(i, apply)
    if reply.err then
      return reply
    end
    replies[i] = reply
  end
end

local failed = run_others('0')
if failed then
  return failed
end
local every_other_fits = true
for i = 1, part_count - 1 do
  every_other_fits = every_other_fits and replies[i][1] == 1
end
local last = run(part_count, every_other_fits and '1' or '0')
if last.err then
  return last
end
replies[part_count] = last
if every_other_fits and last[1] == 1 then
  failed = run_others('1')
  if failed then
    return failed
  end
end

local flat = {}
for i = 1, part_count do
  local reply = replies[i]
  for j = 1, #reply do
    flat[#flat + 1] = reply[j]
  end
end
return flat
