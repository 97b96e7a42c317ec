--[[ moderato: GCRA (generic cell rate algorithm) decision, atomic over 1..16 policies.

KEYS[i]  base key of policy i (distinct)
ARGV[1]  cost_scaled: decimal integer 0..2^53 (0 only when peeking)
ARGV[2]  "1" = decide and charge, "0" = peek (computes the same reply, writes nothing)
then per policy i, in KEYS order:
  ARGV[1 + 2i]  capacity_scaled  1..9007199254000
  ARGV[2 + 2i]  window_s         1..3599627 (41 days: times in µs stay below 2^53)
or, with a burst, three per policy (ARGV[3i] .. ARGV[3i + 2]): the two above, then
burst_scaled 1..9007199254000: the bucket holds burst_scaled, refilled capacity_scaled
per window, so the TAT may run burst_scaled * W / capacity_scaled ahead of now (the
tolerance, W without a burst), within 3599627 s in whole windows
(burst_scaled <= floor(3599627 / window_s) * capacity_scaled).

State: key <base>:gcra, a hash of decimal integer strings holding the theoretical
arrival time (TAT: when the virtual bucket is empty again), exactly:
  tat   whole microseconds (Unix time)
  frac  the remainder in 1/capacity_scaled of a microsecond, 0..capacity_scaled - 1
A request of cost c moves the TAT from max(TAT, now) by exactly c * W / C µs (W the
window in µs, C the capacity) and is admitted iff the new TAT is at most W ahead of
now: a fresh key admits C scaled units at once, capacity drains continuously, and no
rounding accumulates (the remainder keeps every fraction of a microsecond).
  remaining = C - ceil((TAT - now) * C / W)        scaled units still admissible
  reset     = ceil(TAT / 1000)                     ms, when the bucket is empty again
  retry     = ceil((new TAT - W) / 1000) - now_ms  when the cost fits
The key expires 1 s after its reset: by then a missing key reads the same (empty).
A TAT more than one window ahead (the clock stepped back) reads as a full bucket;
a frac of capacity_scaled or more (capacity lowered) counts as one whole µs.
Times are now_ms * 1000 µs; every intermediate stays below 2^53 until the year 2255.

Reply: {allowed, deciding, then per policy remaining_scaled, retry_ms, reset_ms}.
A bad argument is "MODERATO_ARG ...", unusable stored state "MODERATO_STATE ...";
in both cases nothing has been written. docs/internals.md fixes the contract.
]]

local FIELDS_PER_POLICY = 2
-- What the straight-line path's pieces hand on: the state's key, the instant and window in
-- µs, the start (max(TAT, now), nil for the general path), the last admission's reset.
-- denial: true when the run has denied, its last denial for denied_cost_scaled at
-- denied_start_us and denied_start_frac (the same check again is answered without the
-- arithmetic).
local state_key, now_us, window_us, start_us, start_frac, reset_ms, denial,
  denied_cost_scaled, denied_start_us, denied_start_frac, written_tat_text, written_tat_of,
  written_frac_text, written_frac_of, read_fields
--#include one_policy.lua

-- The common case, straight-line (no function is built: Redis would build each one on
-- every call): one policy, charging, short decimal arguments within range, a stored TAT of
-- the usual shape (or none), every product below 2^53 (then one division is exact, and
-- so is %: see accrual.lua), and a cost within the capacity: admitted or denied here.
-- Anything else goes on to the general path below, nothing written yet; the integers are
-- the general path's (start_of(), evaluate()).
--
-- Split in pieces at its --#batch lines (lua/batch.lua): the policy's (the instant and the
-- window in µs, before the key); the key; the read (the TAT, as the start); the decision
-- (an admission: the new TAT becomes the start; a denial: its reply, the start as it was,
-- as a denial charges nothing); the write (the TAT and its expiry, when a check was
-- admitted). At one instant a TAT an admission wrote reads back as the start it left (it
-- is at least now and at most now + W), so a run's checks decide on the locals as each
-- alone on the hash.
if cost_scaled and cost_scaled <= capacity_scaled then
  window_us = window_s * 1000000
  now_us = now_ms * 1000
--#batch key
  state_key = KEYS[1] .. ':gcra'
--#batch read
  local fields = redis_pcall('HMGET', state_key, 'tat', 'frac')
  local tat_text, frac_text = fields[1], fields[2]
  read_fields = fields -- what the write leaves as it is
  -- start = max(TAT, now), at most now + W: (start_us + start_frac / C) µs.
  start_us, start_frac, reset_ms, denial = nil, nil, nil, nil
  -- The TAT a decimal of 1 to 16 digits up to MAX_SAFE_INTEGER, frac one of 1 to 15, each
  -- checked on its own (no text is built for one pattern). The frac this call last wrote
  -- (its '%d' text, of a number below the capacity: over many identities, the frac every
  -- emptied bucket holds after one admission) is such a decimal, its number known.
  local tat_us, tat_frac
  if tat_text and (#tat_text < 16 or (#tat_text == 16 and tat_text <= '9007199254740992')) -- MAX_SAFE_INTEGER
      and string_find(tat_text, '^%d+$') then
    tat_us = tat_text + 0
  end
  if frac_text == written_frac_text then
    tat_frac = written_frac_of
  elseif frac_text and #frac_text < 16 and string_find(frac_text, '^%d+$') then
    tat_frac = frac_text + 0
  end
  if tat_us and tat_frac then
    start_us, start_frac = tat_us, tat_frac
    if start_us >= now_us + window_us then
      start_us, start_frac = now_us + window_us, 0 -- more than a full bucket: the clock stepped back
    else
      if start_frac >= capacity_scaled then
        start_us, start_frac = start_us + 1, 0 -- a capacity lowered since: one whole µs
      end
      if start_us < now_us then
        start_us, start_frac = now_us, 0
      end
    end
  elseif not fields.err and not tat_text and not frac_text and redis_call('EXISTS', state_key) == 0 then
    start_us, start_frac = now_us, 0
  end
--#batch decide
  local backlog_product = start_us and (start_us - now_us) * capacity_scaled
  local step_product = cost_scaled * window_us
  if denial and cost_scaled == denied_cost_scaled and start_us == denied_start_us
      and start_frac == denied_start_frac then
    -- The run's denial before, of this cost on the same TAT: the same. Nothing since changed
    -- the decided_* scalars it left (an admission would have moved the TAT, another denial
    -- would be the run's last), so only allowed is set again.
    decided_allowed = 0
  elseif backlog_product and backlog_product < 9007199254740992 -- MAX_SAFE_INTEGER
      and step_product < 9007199254740992 then -- MAX_SAFE_INTEGER
    -- Scaled units in the bucket, rounded up: ceil(((start - now) * C + frac) / W).
    local backlog_remainder = backlog_product % window_us
    local rounded_up = backlog_remainder + start_frac + window_us - 1
    local remaining_scaled = capacity_scaled - (backlog_product - backlog_remainder) / window_us
      - (rounded_up - rounded_up % window_us) / window_us
    -- new TAT = start + c * W / C, exactly: whole µs and a remainder below C.
    local step_frac = step_product % capacity_scaled
    local new_us = start_us + (step_product - step_frac) / capacity_scaled
    local new_frac = start_frac + step_frac
    if new_frac >= capacity_scaled then
      new_us = new_us + 1
      new_frac = new_frac - capacity_scaled
    end
    local admitted = cost_scaled <= remaining_scaled
    if not admitted then
      -- Denied, nothing charged: the cost fits once the new TAT is no more than the
      -- tolerance (W, frac 0: no burst here) ahead, the general path's wait.
      new_us = new_us - window_us
    end
    -- ceil((new_us + new_frac / C) / 1000), the first whole ms at or after it.
    local at_us = new_us + (new_frac > 0 and 1 or 0) + 999
    local at_ms = (at_us - at_us % 1000) / 1000
    if admitted then
      start_us = new_us
      start_frac = new_frac
      reset_ms = at_ms
      decided_allowed = 1
      decided_remaining = remaining_scaled - cost_scaled
      decided_retry_ms = 0
      decided_reset_ms = at_ms
    else
      decided_allowed = 0
      decided_remaining = remaining_scaled
      decided_retry_ms = at_ms - now_ms
      decided_reset_ms = at_ms
      denial = true
      denied_cost_scaled = cost_scaled
      denied_start_us = start_us
      denied_start_frac = start_frac
    end
  end
--#batch write
  if reset_ms then
    -- A whole-µs TAT stores frac 0: a literal, which need not be formatted.
    -- Each number as '%d' text, formatted when it differs from the last write's (see
    -- one_policy.lua).
    if start_us ~= written_tat_of or start_frac ~= written_frac_of then
      written_tat_of, written_tat_text = start_us, string_format('%d', start_us)
      written_frac_of, written_frac_text = start_frac, start_frac == 0 and '0'
        or string_format('%d', start_frac)
    end
    local expire_at_ms = reset_ms + 1000
--#include expiry_text.lua
    -- A field whose text is the one read is left as it is: the same hash, fewer fields for
    -- Redis to set (an emptied bucket, over many identities, writes the TAT alone). A
    -- missing key read false in each field: it is written whole.
    if written_frac_text == read_fields[2] then
      redis_call('HSET', state_key, 'tat', written_tat_text)
    elseif written_tat_text == read_fields[1] then
      redis_call('HSET', state_key, 'frac', written_frac_text)
    else
      redis_call('HSET', state_key, 'tat', written_tat_text, 'frac', written_frac_text)
    end
    redis_call('PEXPIREAT', state_key, expiry_text)
  end
--#batch end
--#include decided_reply.lua
end

--#batch shared
--#include prelude.lua

-- GCRA.

local GCRA_SUFFIX = ':gcra'
local US_PER_MS = 1000
local DRAINED_EXPIRY_MARGIN_MS = 1000

-- start = max(TAT, now), at most now + the tolerance (tolerance_us + tolerance_frac / C:
-- the window without a burst): (start_us + start_frac / C) µs, for a stored TAT
-- (whole µs, frac).
local function start_of(tat_us, tat_frac, now_us, tolerance_us, tolerance_frac)
  if tat_frac >= capacity_scaled then
    tat_us, tat_frac = tat_us + 1, 0 -- a capacity lowered since: one whole µs
  end
  local full_us = now_us + tolerance_us
  if tat_us > full_us or (tat_us == full_us and tat_frac >= tolerance_frac) then
    return full_us, tolerance_frac -- more than a full bucket: the clock stepped back
  end
  if tat_us >= now_us then
    return tat_us, tat_frac
  end
  return now_us, 0
end

-- floor(a * b / m) and (a * b) mod m, exactly, for integers 0 <= a, m < 2^44 and
-- 0 <= b < 2^53 (the product may pass 2^53; the quotient stays below 2^53). Past 2^53, b
-- is taken in base-256 digits, most significant first (no table: each digit is divided
-- out of b by its power of 256): each step keeps remainder * 256 + a * digit below 2^53.
local function mul_div_mod(a, b, m)
  if a == m then
    return b, 0
  end
  if a * b < MAX_SAFE_INTEGER then
    -- Below 2^53 the product is exact (a rounded one would be 2^53 or more): one division.
    local product = a * b
    local remainder = product % m -- exact below 2^53 (accrual.lua)
    return (product - remainder) / m, remainder
  end
  local quotient, remainder = 0, 0
  local scale = 1
  while scale * 256 <= b do
    scale = scale * 256
  end
  while scale >= 1 do
    local digit = floor_div(b, scale)
    b = b - digit * scale
    local partial = remainder * 256 + a * digit
    remainder = partial % m
    quotient = quotient * 256 + (partial - remainder) / m
    scale = scale / 256
  end
  return quotient, remainder
end

-- The stored TAT as (whole µs, frac); nil for a missing key (an empty bucket).
local function read_tat(key)
  local fields = redis.pcall('HMGET', key, 'tat', 'frac')
  local tat_us, tat_frac = stored_integer(fields[1]), stored_integer(fields[2])
  if tat_us and tat_frac then
    return tat_us, tat_frac
  end
  if fields[1] == false and fields[2] == false and redis.call('EXISTS', key) == 0 then
    return nil
  end
  -- Anything unusual: the exact reading, which refuses unusable state.
  local values = refusals().integer_hash(key, { 'tat', 'frac' }, { MAX_SAFE_INTEGER, MAX_SAFE_INTEGER })
  return values[1], values[2]
end

-- ceil((us + frac / C) / 1000): the first whole millisecond at or after a TAT.
local function ceil_ms(us, frac)
  return floor_div(us + (frac > 0 and 1 or 0) + US_PER_MS - 1, US_PER_MS)
end

local function evaluate(i, first, cost_scaled, now_ms, many)
  -- Checked digits: arithmetic converts them (tonumber is a C call).
  capacity_scaled, window_s = ARGV[first] + 0, ARGV[first + 1] + 0
  burst_scaled = burst_field and ARGV[first + burst_field] + 0 or capacity_scaled
  window_ms = window_s * 1000
  local key = KEYS[i] .. GCRA_SUFFIX
  local window_us = window_ms * US_PER_MS
  local now_us = now_ms * US_PER_MS
  -- The tolerance, burst * W / C µs exactly (W itself without a burst).
  local tolerance_us, tolerance_frac = mul_div_mod(burst_scaled, window_us, capacity_scaled)

  local start_us, start_frac = now_us, 0
  local tat_us, tat_frac = read_tat(key)
  if tat_us then
    start_us, start_frac = start_of(tat_us, tat_frac, now_us, tolerance_us, tolerance_frac)
  end

  -- Scaled units in the bucket, rounded up: ceil(((start - now) * C + frac) / W).
  local backlog_quotient, backlog_remainder =
    mul_div_mod(start_us - now_us, capacity_scaled, window_us)
  local level_scaled =
    backlog_quotient + floor_div(backlog_remainder + start_frac + window_us - 1, window_us)
  local remaining_scaled = burst_scaled - level_scaled
  local fits = cost_scaled <= remaining_scaled
  local reset_uncharged_ms = many and ceil_ms(start_us, start_frac) or nil
  if cost_scaled > burst_scaled then
    return false, true, remaining_scaled, nil, nil, reset_uncharged_ms
  end
  -- new TAT = start + c * W / C, exactly: whole µs and a remainder below C.
  local step_us, step_frac = mul_div_mod(cost_scaled, window_us, capacity_scaled)
  local new_us, new_frac = start_us + step_us, start_frac + step_frac
  if new_frac >= capacity_scaled then
    new_us, new_frac = new_us + 1, new_frac - capacity_scaled
  end
  if fits then
    local reset_charged_ms = ceil_ms(new_us, new_frac)
    return true, false, remaining_scaled, remaining_scaled - cost_scaled, reset_charged_ms,
      reset_uncharged_ms, nil, nil, key, new_us, new_frac, reset_charged_ms
  end
  -- The cost fits once the new TAT is no more than the tolerance ahead.
  local ahead_us, ahead_frac = new_us - tolerance_us, new_frac - tolerance_frac
  if ahead_frac < 0 then
    ahead_us, ahead_frac = ahead_us - 1, ahead_frac + capacity_scaled
  end
  local reset_denied_ms = ceil_ms(ahead_us, ahead_frac)
  return false, false, remaining_scaled, nil, nil, reset_uncharged_ms,
    reset_denied_ms - now_ms, reset_denied_ms
end

local function write(key, tat_us, tat_frac, reset_ms)
  -- A whole-µs TAT stores frac 0 as a literal, which Redis need not format.
  redis.call('HSET', key, 'tat', tat_us, 'frac', tat_frac == 0 and '0' or tat_frac)
  -- Set on every write: this also repairs a key that lost its expiry.
  redis.call('PEXPIREAT', key, reset_ms + DRAINED_EXPIRY_MARGIN_MS)
end

return decide(2, nil, evaluate, write, 'gcra_window', 'gcra_burst')
