-- moderato: a batched decision script's driver, spliced in last (see batched_script() in
-- moderato/scripts.py). Before it, the algorithm's own script, split at its markers:
-- its head (the clock, read once: every decision sees the same instant, and the locals
-- its straight-line path's pieces hand on); its one-policy straight-line path as
-- parse_check() (the argument check and the key piece: true when the check takes that
-- path), open_check() (those, then the read and the decision: true when the check took
-- the path, its reply in reply or nil for the general path; or the read's refusal),
-- decide_check() and write_state() (the decision and the write pieces); and
-- general_path() (the general path, its functions built afresh per call, as the script
-- alone builds them). A script whose straight-line path is not split yet has it whole as
-- open_check(), which then answers the check's reply or nil.
--
-- A run: the checks, one after the other, that take the straight-line path with the same
-- key and the same policy fields (the arguments after the cost, as sent), so the same
-- state key at this instant. The state is read once, at the run's first check; each
-- check is decided on the Lua locals the read and the checks before it left
-- (decide_check() sets reply, or leaves it nil for the general path); the state is
-- written once, when the run ends: before a check of another key or policy, before the
-- general path (which reads the state), or after the last check. So each check's reply,
-- and the state written, are the script's alone, at this instant, after the checks
-- before it. A check sent exactly as the one before it in the run (the common case: one
-- identity's checks) is decided without its arguments checked again: the same text,
-- checked at the same instant, gives the same scalars and key.
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
local key_count, arg_count, key_count_text, arg_count_text
for _ = 1, part_count do
  -- Counts as the part before's (the same strings) are read again no more.
  if BATCH_ARGV[argv_at] ~= key_count_text or BATCH_ARGV[argv_at + 1] ~= arg_count_text then
    key_count_text, arg_count_text = BATCH_ARGV[argv_at], BATCH_ARGV[argv_at + 1]
    key_count, arg_count = tonumber(key_count_text), tonumber(arg_count_text)
    if not key_count or not arg_count or key_count < 0 or arg_count < 0
        or key_count % 1 ~= 0 or arg_count % 1 ~= 0 then
      return layout_refused('ARGV[' .. argv_at .. '] and the next must be counts')
    end
  end
  keys_at, argv_at = keys_at + key_count, argv_at + 2 + arg_count
end
if keys_at ~= #BATCH_KEYS or argv_at ~= #BATCH_ARGV + 1 then
  return layout_refused('the parts take ' .. keys_at .. ' keys and ' .. (argv_at - 1)
    .. ' arguments, the call has ' .. #BATCH_KEYS .. ' and ' .. #BATCH_ARGV)
end

-- One KEYS and one ARGV table for every part, refilled in place: count entries of source
-- from at + 1, then nil up to the count it had (no holes, so # is the part's count).
local function refill(part_table, source, at, count, had_count)
  for i = 1, count do
    part_table[i] = source[at + i]
  end
  for i = count + 1, had_count do
    part_table[i] = nil
  end
end
local replies = {}
local filled_keys, filled_args = 0, 0
key_count_text, arg_count_text = nil, nil
-- The open run's first part: its key's index in BATCH_KEYS and its arguments' in BATCH_ARGV
-- (just before the first; run_at nil: no run open); same_at, the part before's, when it
-- was decided in the run.
local run_key_at, run_at, same_at
KEYS, ARGV = {}, {}
keys_at, argv_at = 0, 2
for part = 1, part_count do
  if BATCH_ARGV[argv_at] ~= key_count_text or BATCH_ARGV[argv_at + 1] ~= arg_count_text then
    key_count_text, arg_count_text = BATCH_ARGV[argv_at], BATCH_ARGV[argv_at + 1]
    key_count, arg_count = key_count_text + 0, arg_count_text + 0
  end
  argv_at = argv_at + 1 -- its arguments from argv_at + 1
  -- Does it continue the run: one key, that key, the same policy fields?
  local continues = run_at and key_count == 1 and arg_count == filled_args
    and BATCH_KEYS[keys_at + 1] == BATCH_KEYS[run_key_at]
  if continues then
    for i = 2, arg_count do
      if BATCH_ARGV[argv_at + i] ~= BATCH_ARGV[run_at + i] then
        continues = false
        break
      end
    end
  end
  if run_at and not continues then
    write_state()
    run_at = nil
  end
  local decided
  reply = nil
  if continues and BATCH_ARGV[argv_at + 1] == BATCH_ARGV[same_at + 1] then
    decide_check() -- the same check as the one before: its scalars and key stand
    decided = reply
  else
    refill(KEYS, BATCH_KEYS, keys_at, key_count, filled_keys)
    refill(ARGV, BATCH_ARGV, argv_at, arg_count, filled_args)
    filled_keys, filled_args = key_count, arg_count
    if continues then
      if parse_check() then -- another cost: its own scalars (the same key)
        decide_check()
        decided = reply
      end
    else
      decided = open_check()
      if decided == true then
        run_key_at, run_at = keys_at + 1, argv_at
        decided = reply
      end
    end
  end
  if decided then
    same_at = run_at and argv_at
  else
    if run_at then
      write_state() -- what the run admitted, before the general path reads the state
      run_at = nil
    end
    same_at = nil
    decided = general_path()
  end
  replies[part] = decided
  keys_at, argv_at = keys_at + key_count, argv_at + 1 + arg_count
end
if run_at then
  write_state()
end
return replies
