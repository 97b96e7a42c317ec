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
-- The call's layout (moderato.redis.grouping's encoder writes it). BATCH_ARGV[1]: the part
-- count. Then per part, in order, one of:
--   key count, argument count, the arguments  a part in full: its keys are the next
--                                             key count entries of BATCH_KEYS;
--   "="                                       the part before again: its keys and
--                                             arguments (one hot identity's checks);
--   "K"                                       the part before's arguments, its own keys:
--                                             as many as the part before's, the next
--                                             entries of BATCH_KEYS;
--   "C", cost                                 the part before's keys and policy fields
--                                             (ARGV[2] on), its own cost (ARGV[1]);
--   "KC", cost                                its own keys (as "K") and cost (as "C"), the
--                                             part before's policy fields (many
--                                             identities under one policy).
-- BATCH_KEYS: the keys the parts send, in order ("=" and "C" send none). A marker is a
-- part as it would be sent in full, so each is decided exactly as that part alone.
-- The reply: one flat array, per part, in order, its reply's length then its entries (a
-- decision: allowed, deciding, then remaining, retry and reset per policy), or its refusal
-- as one error entry (the other parts are decided all the same). A layout that does not
-- add up (counts that are not counts, more or fewer keys or arguments than the parts take,
-- a marker first, a cost for a part of no arguments) is refused whole, before any part
-- runs: "MODERATO_ARG batch: ...".

local MAX_BATCH_PARTS = 16 -- moderato.scripts.MAX_BATCH_PARTS
-- The markers (moderato.redis.grouping's encoder writes them): a part as the part before
-- (REPEAT), with its own keys (OWN_KEYS), its own cost (OWN_COST), or both.
local REPEAT, OWN_KEYS, OWN_COST, OWN_KEYS_AND_COST = '=', 'K', 'C', 'KC'
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
  local head = BATCH_ARGV[argv_at]
  if head == REPEAT or head == OWN_KEYS or head == OWN_COST or head == OWN_KEYS_AND_COST then
    if not key_count then
      return layout_refused('ARGV[' .. argv_at .. '] ("' .. head
        .. '") marks a part as the part before it, and the first part has none')
    end
    if head == OWN_KEYS or head == OWN_KEYS_AND_COST then
      keys_at = keys_at + key_count
    end
    if head == OWN_COST or head == OWN_KEYS_AND_COST then
      if arg_count < 1 then
        return layout_refused('ARGV[' .. argv_at .. '] ("' .. head
          .. '") gives a cost to a part of no arguments')
      end
      argv_at = argv_at + 2
    else
      argv_at = argv_at + 1
    end
  else
    -- Counts as the part before's (the same strings) are read again no more.
    if head ~= key_count_text or BATCH_ARGV[argv_at + 1] ~= arg_count_text then
      key_count_text, arg_count_text = head, BATCH_ARGV[argv_at + 1]
      key_count, arg_count = tonumber(key_count_text), tonumber(arg_count_text)
      if not key_count or not arg_count or key_count < 0 or arg_count < 0
          or key_count % 1 ~= 0 or arg_count % 1 ~= 0 then
        return layout_refused('ARGV[' .. argv_at .. '] and the next must be counts or ARGV['
          .. argv_at .. '] a marker ("=", "K", "C" or "KC")')
      end
    end
    keys_at, argv_at = keys_at + key_count, argv_at + 2 + arg_count
  end
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
-- A part's place in the call: its keys BATCH_KEYS[keys_from + 1 .. keys_from + key_count],
-- its ARGV[1] (the cost) BATCH_ARGV[cost_at], its ARGV[i] for i >= 2 (the policy fields)
-- BATCH_ARGV[fields_at + i], i up to arg_count. A marker keeps the part before's places
-- but for what it sends itself. filled_*: the places KEYS and ARGV hold now (-1: none).
local keys_from, cost_at, fields_at
local filled_keys_from, filled_key_count, filled_cost_at = -1, 0, -1
local filled_fields_at, filled_arg_count = -1, 0
-- The open run: its key, its policy fields' place and count (run_key nil: no run open;
-- one is open exactly when the part before was decided in it), and run_cost, the cost
-- text of the part before.
local run_key, run_fields_at, run_arg_count, run_cost
local replies, replies_at = {}, 0
KEYS, ARGV = {}, {}
keys_at, argv_at = 0, 2
key_count_text, arg_count_text = nil, nil
for _ = 1, part_count do
  local head = BATCH_ARGV[argv_at]
  local continues
  if head == REPEAT then
    argv_at = argv_at + 1
    continues = run_key -- the part before again: it continues the run the part before did
  else
    if head == OWN_KEYS then
      keys_from, keys_at, argv_at = keys_at, keys_at + key_count, argv_at + 1
    elseif head == OWN_COST then
      cost_at, argv_at = argv_at + 1, argv_at + 2
    elseif head == OWN_KEYS_AND_COST then
      keys_from, keys_at = keys_at, keys_at + key_count
      cost_at, argv_at = argv_at + 1, argv_at + 2
    else
      if head ~= key_count_text or BATCH_ARGV[argv_at + 1] ~= arg_count_text then
        key_count_text, arg_count_text = head, BATCH_ARGV[argv_at + 1]
        key_count, arg_count = key_count_text + 0, arg_count_text + 0
      end
      keys_from, keys_at = keys_at, keys_at + key_count
      fields_at = argv_at + 1
      cost_at, argv_at = fields_at + 1, fields_at + 1 + arg_count
    end
    -- Does it continue the run: one key, that key, the same policy fields?
    continues = run_key and key_count == 1 and arg_count == run_arg_count
      and BATCH_KEYS[keys_from + 1] == run_key
    if continues and fields_at ~= run_fields_at then
      for i = 2, arg_count do
        if BATCH_ARGV[fields_at + i] ~= BATCH_ARGV[run_fields_at + i] then
          continues = false
          break
        end
      end
    end
  end
  if run_key and not continues then
    write_state()
    run_key = nil
  end
  local decided
  reply = nil
  if continues and BATCH_ARGV[cost_at] == run_cost then
    decide_check() -- the same check as the one before: its scalars and key stand
    decided = reply
  else
    if keys_from ~= filled_keys_from or key_count ~= filled_key_count then
      refill(KEYS, BATCH_KEYS, keys_from, key_count, filled_key_count)
      filled_keys_from, filled_key_count = keys_from, key_count
    end
    if fields_at ~= filled_fields_at then
      refill(ARGV, BATCH_ARGV, fields_at, arg_count, filled_arg_count)
      filled_fields_at, filled_arg_count, filled_cost_at = fields_at, arg_count, fields_at + 1
    end
    if cost_at ~= filled_cost_at then
      ARGV[1] = BATCH_ARGV[cost_at]
      filled_cost_at = cost_at
    end
    if continues then
      if parse_check() then -- another cost: its own scalars (the same key)
        decide_check()
        decided = reply
      end
    else
      decided = open_check()
      if decided == true then
        run_key, run_fields_at, run_arg_count = BATCH_KEYS[keys_from + 1], fields_at, arg_count
        decided = reply
      end
    end
  end
  if decided then
    if run_key then
      run_cost = BATCH_ARGV[cost_at]
    end
  else
    if run_key then
      write_state() -- what the run admitted, before the general path reads the state
      run_key = nil
    end
    decided = general_path()
  end
  -- The reply, flat: per part its length then its entries, or its refusal (an error entry).
  if decided.err then
    replies_at = replies_at + 1
    replies[replies_at] = decided
  else
    local length = #decided
    replies[replies_at + 1] = length
    for i = 1, length do
      replies[replies_at + 1 + i] = decided[i]
    end
    replies_at = replies_at + 1 + length
  end
end
if run_key then
  write_state()
end
return replies
