-- moderato: a batched decision script's driver, spliced in last (see batched_script() in
-- moderato/scripts.py). Before it, the algorithm's own script, split at its markers:
-- its head (the clock, read once: every decision sees the same instant, and the locals
-- its straight-line path's pieces hand on); its one-policy straight-line path as
-- parse_check() (the argument check, the policy's piece and the key piece: true when the
-- check takes that path), open_check() (those, then the read: true when the check took
-- the path, nil for the general path, or the read's refusal), keyed_check() (open_check()
-- but for the argument check and the policy's piece, whose scalars stand) and
-- write_state() (the write piece); its decide piece, spliced into this driver at its
-- `--#batch decide` lines as a block (on the script's locals, no call: it sets the
-- decided_* scalars, or leaves decided_allowed nil for the general path); and
-- general_path() (the general path, its functions built afresh per call, as the script
-- alone builds them). A script whose straight-line path is not split yet has it whole as
-- open_check(), which then answers the check's reply or nil.
--
-- A run: the checks, one after the other, that take the straight-line path with the same
-- key and the same policy fields (the arguments after the cost, as sent), so the same
-- state key at this instant. The state is read once, at the run's first check; each
-- check is decided on the Lua locals the read and the checks before it left (the
-- decide piece sets the decided_* scalars, or leaves decided_allowed nil for the general
-- path); the state is
-- written once, when the run ends: before a check of another key or policy, before the
-- general path (which reads the state), or after the last check. So each check's reply,
-- and the state written, are the script's alone, at this instant, after the checks
-- before it. A check sent exactly as the one before it in the run (the common case: one
-- identity's checks) is decided without its arguments checked again: the same text,
-- checked at the same instant, gives the same scalars and key. So is the first check of a
-- run whose arguments are those of the last check parsed (many identities under one
-- policy): only its key is its own.
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
-- as one error entry (the other parts are decided all the same). A one-policy decision
-- after one (5 entries each) that differs from it only in remaining or reset (a run's
-- admissions, its denials of one cost) is sent as what changed: -1 - mask, mask's bit
-- i - 1 set for each entry i sent, 4 for remaining, 16 for reset, then those entries (the
-- same decision again: -1 alone). Each integer of the reply costs Redis its conversion,
-- the most of a repeated check's price (BENCHMARKS.md, "A run's replies as changes").
-- A layout that does not add up (counts that are not counts, more or fewer keys or
-- arguments than the parts take, a marker first, a cost for a part of no arguments, parts
-- weighing more than MAX_BATCH_UNITS) is refused whole, before any part runs:
-- "MODERATO_ARG batch: ...".

-- A call's bound, in units (moderato.scripts.MAX_BATCH_UNITS): a part sent in full or with
-- its own keys or cost weighs PART_UNITS (so 16 such parts at most), a part marked "=" (the
-- part before again, decided on the run's locals: a hot identity's checks) 1.
local MAX_BATCH_UNITS, PART_UNITS = 64, 4 -- moderato.scripts.MAX_BATCH_UNITS, BATCH_PART_UNITS
-- The markers (moderato.redis.grouping's encoder writes them): a part as the part before
-- (REPEAT), with its own keys (OWN_KEYS), its own cost (OWN_COST), or both.
local REPEAT, OWN_KEYS, OWN_COST, OWN_KEYS_AND_COST = '=', 'K', 'C', 'KC'
local function layout_refused(message)
  return redis.error_reply('MODERATO_ARG batch: ' .. message)
end
local part_count = tonumber(BATCH_ARGV[1])
if not part_count or part_count < 1 or part_count > MAX_BATCH_UNITS or part_count % 1 ~= 0 then
  return layout_refused('ARGV[1] must be a part count 1..' .. MAX_BATCH_UNITS)
end
local keys_at, argv_at, units = 0, 2, 0
local key_count, arg_count, key_count_text, arg_count_text
-- Only the first part can come before any part in full: a marker there has none before it.
local first_head = BATCH_ARGV[2]
if first_head == REPEAT or first_head == OWN_KEYS or first_head == OWN_COST
    or first_head == OWN_KEYS_AND_COST then
  return layout_refused('ARGV[2] ("' .. first_head
    .. '") marks a part as the part before it, and the first part has none')
end
local PART_EXTRA_UNITS = PART_UNITS - 1 -- a part's weight beyond a repeat's 1
for _ = 1, part_count do
  local head = BATCH_ARGV[argv_at]
  if head == REPEAT then
    argv_at = argv_at + 1
  elseif head == OWN_KEYS then
    keys_at = keys_at + key_count
    argv_at = argv_at + 1
    units = units + PART_EXTRA_UNITS
  elseif head == OWN_COST or head == OWN_KEYS_AND_COST then
    if arg_count < 1 then
      return layout_refused('ARGV[' .. argv_at .. '] ("' .. head
        .. '") gives a cost to a part of no arguments')
    end
    if head == OWN_KEYS_AND_COST then
      keys_at = keys_at + key_count
    end
    argv_at = argv_at + 2
    units = units + PART_EXTRA_UNITS
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
    keys_at = keys_at + key_count
    argv_at = argv_at + 2 + arg_count
    units = units + PART_EXTRA_UNITS
  end
end
units = units + part_count
if units > MAX_BATCH_UNITS then
  return layout_refused('the parts weigh ' .. units .. ' units, more than ' .. MAX_BATCH_UNITS
    .. ' (a part ' .. PART_UNITS .. ', one marked "=" 1)')
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
-- but for what it sends itself. KEYS holds the part before's keys, filled_key_count of
-- them; ARGV its arguments, filled_arg_count of them (a part in full whose arguments are
-- the same strings leaves ARGV as it is).
local keys_from, cost_at, fields_at
local filled_key_count, filled_arg_count = 0, 0
-- parsed: the straight-line path's scalars (the argument check's and the policy's piece's)
-- stand for KEYS and ARGV as they are: the last check parsed (open_check() or
-- parse_check()) took that path, with one key, and the arguments have not changed since,
-- nor has the general path (which sets the scalars its own way) run. A check of other keys
-- then only needs the key piece, the read and the decision (keyed_check()): the same text
-- at the same instant gives the same scalars. (A check sent exactly as the one before it in
-- a run is decided on them alone.)
-- The open run: its key (nil: no run open; one is open exactly when the part before was
-- decided in it). Its policy fields, and the cost of the part before, are ARGV's.
local parsed, run_key
local replies, replies_at = {}, 0
-- The part before's decision when it had one policy's 5 entries, as scalars (before_allowed
-- nil: none, or other): its allowed, deciding, remaining, retry and reset; before_plain its
-- allowed when its deciding is 0 (a straight-line decision's), else nil.
local before_allowed, before_deciding, before_remaining, before_retry_ms, before_reset_ms
local before_plain
-- A reply as a table (a refusal, the general path's decision), into the flat reply.
local function table_replied(decided)
  if decided.err then
    replies_at = replies_at + 1
    replies[replies_at] = decided
    before_allowed, before_plain = nil, nil
    return
  end
  local length = #decided
  if length == 5 and decided[1] == before_allowed and decided[2] == before_deciding
      and decided[4] == before_retry_ms then
    local remaining, reset = decided[3], decided[5]
    if remaining == before_remaining then
      if reset == before_reset_ms then
        replies[replies_at + 1] = -1
        replies_at = replies_at + 1
      else
        replies[replies_at + 1], replies[replies_at + 2] = -17, reset
        replies_at = replies_at + 2
      end
    elseif reset == before_reset_ms then
      replies[replies_at + 1], replies[replies_at + 2] = -5, remaining
      replies_at = replies_at + 2
    else
      replies[replies_at + 1], replies[replies_at + 2], replies[replies_at + 3] = -21,
        remaining, reset
      replies_at = replies_at + 3
    end
  else
    replies[replies_at + 1] = length
    for i = 1, length do
      replies[replies_at + 1 + i] = decided[i]
    end
    replies_at = replies_at + 1 + length
  end
  if length == 5 then
    before_allowed, before_deciding, before_remaining, before_retry_ms, before_reset_ms =
      decided[1], decided[2], decided[3], decided[4], decided[5]
    before_plain = before_deciding == 0 and before_allowed or nil
  else
    before_allowed, before_plain = nil, nil
  end
end
KEYS, ARGV = {}, {}
keys_at, argv_at = 0, 2
key_count_text, arg_count_text = nil, nil
local part = 0
while part < part_count do
  part = part + 1
  local head = BATCH_ARGV[argv_at]
  -- Its keys, its policy fields, its cost: other than the part before's (what KEYS and ARGV
  -- hold)? (nil: no.)
  local own_keys, own_fields, own_cost
  if head == REPEAT then
    argv_at = argv_at + 1
  elseif head == OWN_KEYS then
    keys_from = keys_at
    keys_at = keys_at + key_count
    argv_at = argv_at + 1
    own_keys = true
  elseif head == OWN_COST or head == OWN_KEYS_AND_COST then
    if head == OWN_KEYS_AND_COST then
      keys_from = keys_at
      keys_at = keys_at + key_count
      own_keys = true
    end
    cost_at = argv_at + 1
    argv_at = argv_at + 2
    own_cost = BATCH_ARGV[cost_at] ~= ARGV[1]
  else
    if head ~= key_count_text or BATCH_ARGV[argv_at + 1] ~= arg_count_text then
      key_count_text, arg_count_text = head, BATCH_ARGV[argv_at + 1]
      key_count, arg_count = key_count_text + 0, arg_count_text + 0
    end
    keys_from = keys_at
    keys_at = keys_at + key_count
    fields_at = argv_at + 1
    cost_at = fields_at + 1
    argv_at = cost_at + arg_count
    own_keys = true
    -- The same strings as ARGV's (the same policy, sent in full after another check) leave
    -- ARGV, and the scalars parsed from it, as they are.
    own_fields = arg_count ~= filled_arg_count
    if not own_fields then
      for i = 2, arg_count do
        if BATCH_ARGV[fields_at + i] ~= ARGV[i] then
          own_fields = true
          break
        end
      end
      own_cost = arg_count > 0 and BATCH_ARGV[cost_at] ~= ARGV[1]
    end
    if key_count ~= 1 then
      parsed = false
    end
  end
  -- Does it continue the run: one key, that key, the same policy fields?
  local continues = run_key and not own_fields
    and (not own_keys or key_count == 1 and BATCH_KEYS[keys_from + 1] == run_key)
  if run_key and not continues then
    write_state()
    run_key = nil
  end
  if own_keys then
    if key_count == 1 and filled_key_count == 1 then
      KEYS[1] = BATCH_KEYS[keys_from + 1] -- one key for one, the common case: no call
    else
      refill(KEYS, BATCH_KEYS, keys_from, key_count, filled_key_count)
      filled_key_count = key_count
    end
  end
  if own_fields then
    refill(ARGV, BATCH_ARGV, fields_at, arg_count, filled_arg_count)
    filled_arg_count, parsed = arg_count, false
  elseif own_cost then
    ARGV[1], parsed = BATCH_ARGV[cost_at], false
  end
  -- The straight-line path: the open run's check (another cost parsed first), or a run
  -- opened by the read (open_check(), or keyed_check() when the scalars stand), then the
  -- decision (the decide piece, spliced in below): decided_allowed set, and the other
  -- decided_* scalars. Else the reply is a table (the read's refusal, or the general
  -- path's), in decided.
  local decided
  decided_allowed = nil
  if continues then
    if own_cost then
      parsed = parse_check() -- another cost: its own scalars (the same key)
    end
  else
    if parsed then
      decided = keyed_check()
    else
      decided = open_check()
      parsed = decided == true
    end
    if decided == true then
      run_key, decided = KEYS[1], nil
    end
  end
  if run_key and parsed then
--#batch decide (the decide piece, spliced in here and below as a block: on the script's
-- locals as the checks before left them, without a call; see batched_script())
  end
  if not decided_allowed and not decided then
    if run_key then
      write_state() -- what the run admitted, before the general path reads the state
      run_key = nil
    end
    parsed = false
    decided = general_path()
  end
  -- The reply, flat: per part its length then its entries, or its refusal (an error entry),
  -- or a one-policy decision as what changed since the part before's (see the top).
  if not decided_allowed then
    table_replied(decided)
  else
--#include batch_reply.lua
    -- The parts after it that go as the loop's body above would take them, with less to go
    -- through, while the run is open and parsed: one marked "=" (the part before again:
    -- one hot identity's checks) is decided on the run's locals; one marked "K" (another
    -- identity under the same policy: one key, as parsed stands for one) ends the run, its
    -- own is opened by keyed_check()'s key and read pieces, then it is decided. A refusal
    -- of the read, or a check the decision leaves to the general path, ends this loop as
    -- the body would.
    if run_key and parsed then
      while part < part_count do
        local next_head = BATCH_ARGV[argv_at]
        if next_head == REPEAT then
          argv_at = argv_at + 1
        elseif next_head == OWN_KEYS then
          local key = BATCH_KEYS[keys_at + 1]
          keys_at = keys_at + 1
          argv_at = argv_at + 1
          if key ~= run_key then
--#batch write (the write piece, spliced in here as a block, as the decide piece is)
            KEYS[1] = key
--#batch keyed (the key and the read piece, spliced in here as a block that leaves `decided`
-- true, or the read's refusal as keyed_check() would return it: see batched_script())
            if decided ~= true then
              part = part + 1
              run_key = nil
              table_replied(decided)
              break
            end
            run_key = key
          end
        else
          break
        end
        part = part + 1
        decided_allowed = nil
--#batch decide
        if not decided_allowed then
          write_state() -- what the run admitted, before the general path reads the state
          run_key = nil
          parsed = false
          table_replied(general_path())
          break
        end
--#include batch_reply.lua
      end
    end
  end
end
if run_key then
  write_state()
end
return replies
