-- moderato: a batched decision script's driver, spliced in last (see batched_script() in
-- moderato/scripts.py). Before it, the algorithm's own script, split at its markers:
-- its head (the clock, read once: every decision sees the same instant), each_decision()
-- (the one-policy straight-line path, nil when it leaves the decision to the general
-- path) and general_path() (the general path, its functions built afresh per call, as
-- the script alone builds them). Each part runs with its own KEYS and ARGV, so its reply
-- is the one the script alone gives, at this instant, after the parts before it.
--
-- BATCH_KEYS: every part's keys, in order. BATCH_ARGV: the part count, then per part its
-- key count, its argument count and its arguments. The reply: one entry per part, its
-- decision or its refusal (an error entry: the other parts are decided all the same).
-- A layout that does not add up is refused whole, before any part runs.

local MAX_BATCH_PARTS = 16 -- moderato.scripts.MAX_BATCH_PARTS
local function layout_refused(message)
  return redis.error_reply('MODERATO_ARG batch: ' .. message)
end
local part_count = tonumber(BATCH_ARGV[1])
if not part_count or part_count < 1 or part_count > MAX_BATCH_PARTS or part_count % 1 ~= 0 then
  return layout_refused('ARGV[1] must be a part count 1..' .. MAX_BATCH_PARTS)
end
local keys_at, argv_at = 0, 2
for _ = 1, part_count do
  local key_count, arg_count = tonumber(BATCH_ARGV[argv_at]), tonumber(BATCH_ARGV[argv_at + 1])
  if not key_count or not arg_count or key_count < 0 or arg_count < 0
      or key_count % 1 ~= 0 or arg_count % 1 ~= 0 then
    return layout_refused('ARGV[' .. argv_at .. '] and the next must be counts')
  end
  keys_at, argv_at = keys_at + key_count, argv_at + 2 + arg_count
end
if keys_at ~= #BATCH_KEYS or argv_at ~= #BATCH_ARGV + 1 then
  return layout_refused('the parts take ' .. keys_at .. ' keys and ' .. (argv_at - 1)
    .. ' arguments, the call has ' .. #BATCH_KEYS .. ' and ' .. #BATCH_ARGV)
end

-- One KEYS and one ARGV table for every part, refilled in place: count entries of source
-- from at + 1, then nil up to the last part's count (no holes, so # is the part's count).
local function refill(part_table, source, at, count, last_count)
  for i = 1, count do
    part_table[i] = source[at + i]
  end
  for i = count + 1, last_count do
    part_table[i] = nil
  end
end
local replies = {}
local key_count, arg_count = 0, 0
KEYS, ARGV = {}, {}
keys_at, argv_at = 0, 2
for part = 1, part_count do
  local last_key_count, last_arg_count = key_count, arg_count
  key_count, arg_count = BATCH_ARGV[argv_at] + 0, BATCH_ARGV[argv_at + 1] + 0
  refill(KEYS, BATCH_KEYS, keys_at, key_count, last_key_count)
  refill(ARGV, BATCH_ARGV, argv_at + 1, arg_count, last_arg_count)
  keys_at, argv_at = keys_at + key_count, argv_at + 2 + arg_count
  replies[part] = each_decision() or general_path()
end
return replies
