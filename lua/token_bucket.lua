--[[ moderato: token bucket decision, atomic over 1..16 policies.

KEYS[i]  base key of policy i (distinct)
ARGV[1]  cost_scaled: decimal integer 0..2^53 (0 only when peeking)
ARGV[2]  "1" = decide and charge, "0" = peek (computes the same reply, writes nothing)
then per policy i, in KEYS order:
  ARGV[3i]      capacity_scaled      1..9007199254000
  ARGV[3i + 1]  window_s             1..311040000; above 94906 s capacity_scaled
                                     <= floor(2^53 / window_ms) (the credit stays exact)
  ARGV[3i + 2]  refill_scaled_per_s  "" = the exact public rule (capacity per window);
                                     else a finite decimal number (exponent allowed) in
                                     [capacity_scaled / 86400, 9007199254000]
or, with a burst, four per policy (ARGV[4i - 1] .. ARGV[4i + 2]): the three above, the
refill rate "", then burst_scaled 1..9007199254000: the bucket holds burst_scaled and
refills capacity_scaled per window, within ten 360-day years in whole windows
(burst_scaled <= floor(311040000 / window_s) * capacity_scaled).

State: a hash at <base>:bucket:v2 of decimal integer strings: tokens (scaled),
base (ms) and credited (scaled units credited since base). A missing bucket is
full. Only an admitted charge writes it (the refill is a function of time
alone, so a denial loses no progress by not saving it).

Reply: {allowed, deciding, then per policy remaining_scaled, retry_ms, reset_ms}.
A bad argument is "MODERATO_ARG ...", unusable stored state "MODERATO_STATE ...";
in both cases nothing has been written. The math is docs/internals.md
("token_bucket"); docs/internals.md fixes the contract.
]]

local FIELDS_PER_POLICY = 3
-- The state the one-policy path in accrual.lua reads and writes.
local BUCKET_SUFFIX, AMOUNT_FIELD, ACCRUED_FIELD, AMOUNT_IS_LEVEL = ':bucket:v2', 'tokens', 'credited', false
-- ACCRUAL_STATE: what accrual.lua's straight-line pieces hand on.
local state_key, per_ms_whole, per_ms_rest, deficit_scaled, read_deficit_scaled, base_ms,
  accrued_scaled, written_amount_scaled, expire_at_ms, denial, denied_cost_scaled,
  denied_deficit_scaled, written_amount_text, written_amount_of, written_base_text, written_base_of,
  read_fields, searched_target_scaled, searched_elapsed_ms
--#include one_policy.lua
--#include accrual.lua

--#include prelude.lua
--#include bucket_state.lua

-- Token bucket.

local BUCKET_EXPIRY_MARGIN_MS = 60000
local MAX_SEARCH_STEPS = 1000 -- the float estimates below are off by a few ms at most

-- The policy's custom rate (scaled units per second), nil for the exact public rule,
-- and its number (for messages): set by evaluate().
local refill_scaled_per_s, policy_number

-- The refill argument refusals() checks: "" or a plain or exponent decimal in range.
local function parse_refill_rate(R, policy_number, argv_index, capacity)
  local text = ARGV[argv_index]
  if text == '' then
    return
  end
  local rate = nil
  local _, exponent = string.match(text, '^(%d+%.?%d*)(.*)$')
  if exponent and (exponent == '' or string.find(exponent, '^[eE][+-]?%d+$')) then
    rate = tonumber(text)
  end
  -- rate ~= rate is NaN; the lower bound keeps a full refill within one day.
  if not rate or rate ~= rate or rate >= math.huge
      or rate < capacity / MAX_WINDOW_S or rate > MAX_CAPACITY_SCALED then
    fail('MODERATO_ARG', 'ARGV[' .. argv_index .. '] (refill_scaled_per_s of policy ' .. policy_number
      .. ') must be "" or a finite number from capacity_scaled / ' .. MAX_WINDOW_S .. ' to '
      .. R.decimal(MAX_CAPACITY_SCALED) .. ', got ' .. R.shown(text))
  end
end

-- Custom rate: floating point by design (custom rates are documented as floating point).
-- Monotone in elapsed_ms, which the wait search relies on.
local function custom_credit_scaled(elapsed_ms)
  return math.floor(elapsed_ms * refill_scaled_per_s / 1000)
end

-- Brings a bucket, as read_bucket() returns it, up to now. Returns tokens_scaled, base_ms,
-- credited_scaled and elapsed_ms (now - base, never negative), with
-- credited == credit(elapsed). The bucket holds burst_scaled and, under the public rule,
-- is credited capacity_scaled per window.
local function refill(tokens_scaled, base_ms, credited_scaled, now_eff_ms, elapsed_ms)
  if not tokens_scaled then
    return burst_scaled, now_ms, 0, 0
  end
  local full

  if refill_scaled_per_s then
    local due_scaled = custom_credit_scaled(elapsed_ms)
    if due_scaled < credited_scaled then
      -- More was credited than is due: the clock stepped back or the rate changed.
      -- Credit nothing now and restart the accrual here.
      base_ms, credited_scaled, elapsed_ms = now_eff_ms, 0, 0
      full = tokens_scaled >= burst_scaled
    else
      full = due_scaled - credited_scaled >= burst_scaled - tokens_scaled
      if not full then
        if due_scaled > MAX_SAFE_INTEGER then
          local R = refusals()
          fail('MODERATO_STATE', 'custom refill accrual of '
            .. R.shown(KEYS[policy_number] .. BUCKET_SUFFIX, 1024)
            .. ' passed 2^53 scaled units without the bucket filling up; reset the key')
        end
        tokens_scaled = tokens_scaled + (due_scaled - credited_scaled)
        credited_scaled = due_scaled
      end
    end
  else
    local whole_windows = floor_div(elapsed_ms, window_ms)
    -- Within the first window the credit due is small enough to compute directly.
    local due_scaled = whole_windows == 0 and linear_accrual_scaled(elapsed_ms) or nil
    if credited_scaled >= capacity_scaled or (due_scaled and due_scaled < credited_scaled) then
      -- A consistent public bucket always has credit(elapsed) >= credited < capacity: this one was
      -- written under another capacity, or the clock stepped back. Restart the accrual here.
      base_ms, credited_scaled, elapsed_ms = now_eff_ms, 0, 0
      full = tokens_scaled >= burst_scaled
    elseif whole_windows >= 2 and (whole_windows - 1) * capacity_scaled >= burst_scaled then
      -- k windows credit k * capacity - credited > (k - 1) * capacity units: full whatever
      -- the tokens once that reaches the burst (two windows without one). A product past
      -- 2^53 is still far above any burst.
      full = true
    elseif whole_windows >= 1 then
      -- Due since base = k * capacity + credit(elapsed - k windows) (k * capacity stays
      -- below burst + capacity); rebase by k whole windows.
      local credit_in_window_scaled = linear_accrual_scaled(elapsed_ms - whole_windows * window_ms)
      local gain_scaled = whole_windows * capacity_scaled - credited_scaled + credit_in_window_scaled
      full = gain_scaled >= burst_scaled - tokens_scaled
      if not full then
        tokens_scaled = tokens_scaled + gain_scaled
        base_ms = base_ms + whole_windows * window_ms
        elapsed_ms = elapsed_ms - whole_windows * window_ms
        credited_scaled = credit_in_window_scaled
      end
    else
      full = due_scaled - credited_scaled >= burst_scaled - tokens_scaled
      if not full then
        tokens_scaled = tokens_scaled + (due_scaled - credited_scaled)
        credited_scaled = due_scaled
      end
    end
  end

  if full then
    -- A full bucket discards idle credit, fractions too: accrual restarts now.
    return burst_scaled, now_eff_ms, 0, 0
  end
  return tokens_scaled, base_ms, credited_scaled, elapsed_ms
end

-- Milliseconds after base at which need_scaled more units have been credited, given
-- credited_scaled credited by elapsed_ms. need_scaled <= burst_scaled.
local function wait_end_after_base_ms(credited_scaled, elapsed_ms, need_scaled)
  if not refill_scaled_per_s then
    return accrued_at_ms(0, credited_scaled, need_scaled)
  end
  -- Custom rate: the smallest elapsed >= the current one whose float accrual reaches the
  -- target; the estimate is within a few ms, the accrual function itself decides.
  local target_scaled = credited_scaled + need_scaled
  local wait_end_ms = math.max(elapsed_ms, math.ceil(target_scaled * 1000 / refill_scaled_per_s))
  local steps = 0
  local function count_step()
    steps = steps + 1
    if steps > MAX_SEARCH_STEPS then
      fail('MODERATO_STATE', 'custom refill wait did not converge for '
        .. refusals().shown(KEYS[policy_number] .. BUCKET_SUFFIX, 1024))
    end
  end
  while custom_credit_scaled(wait_end_ms) < target_scaled do
    count_step()
    wait_end_ms = wait_end_ms + 1
  end
  while wait_end_ms > elapsed_ms and custom_credit_scaled(wait_end_ms - 1) >= target_scaled do
    count_step()
    wait_end_ms = wait_end_ms - 1
  end
  return wait_end_ms
end

-- Expiry: twice the longer of the window and a full refill, plus a margin, so an idle
-- bucket only disappears once it would have been full anyway. A burst's full refill is
-- counted in whole windows: ceil(burst / capacity) of them.
local function bucket_ttl_ms()
  local full_refill_ms = window_ms
  if burst_scaled > capacity_scaled then
    full_refill_ms = window_ms * floor_div(burst_scaled + capacity_scaled - 1, capacity_scaled)
  end
  if refill_scaled_per_s then
    full_refill_ms = math.max(full_refill_ms,
      math.ceil(capacity_scaled * 1000 / refill_scaled_per_s))
  end
  return 2 * full_refill_ms + BUCKET_EXPIRY_MARGIN_MS
end

local function evaluate(i, first, cost_scaled, now_ms, many)
  -- Checked digits: arithmetic converts them (tonumber is a C call).
  capacity_scaled, window_s = ARGV[first] + 0, ARGV[first + 1] + 0
  burst_scaled = burst_field and ARGV[first + burst_field] + 0 or capacity_scaled
  window_ms = window_s * 1000
  policy_number = i
  local rate_text = ARGV[first + 2]
  refill_scaled_per_s = nil
  if rate_text ~= '' then
    refill_scaled_per_s = tonumber(rate_text)
  end
  split_per_ms()
  local key = KEYS[i] .. BUCKET_SUFFIX
  local tokens_scaled, base_ms, credited_scaled, elapsed_ms =
    refill(read_bucket(key, 'tokens', 'base', 'credited'))

  local fits = cost_scaled <= tokens_scaled
  local permanent = cost_scaled > burst_scaled
  local remaining_charged, reset_charged_ms, reset_uncharged_ms, retry_ms, reset_denied_ms
  local expire_at_ms
  if fits then
    -- Allowed: reset is the full-refill time, with or without this charge.
    remaining_charged = tokens_scaled - cost_scaled
    reset_charged_ms = base_ms
      + wait_end_after_base_ms(credited_scaled, elapsed_ms, burst_scaled - remaining_charged)
    if many then
      reset_uncharged_ms = base_ms
        + wait_end_after_base_ms(credited_scaled, elapsed_ms, burst_scaled - tokens_scaled)
    end
    expire_at_ms = now_ms + bucket_ttl_ms()
  elseif not permanent then
    -- Denied: reset is when this cost fits, assuming no other traffic.
    reset_denied_ms = base_ms
      + wait_end_after_base_ms(credited_scaled, elapsed_ms, cost_scaled - tokens_scaled)
    retry_ms = reset_denied_ms - now_ms
  end
  return fits, permanent, tokens_scaled, remaining_charged, reset_charged_ms, reset_uncharged_ms,
    retry_ms, reset_denied_ms, key, remaining_charged, base_ms, credited_scaled, expire_at_ms
end

local function write(key, tokens_scaled, base_ms, credited_scaled, expire_at_ms)
  -- A restarted accrual stores 0 as a literal, which Redis need not format.
  redis.call('HSET', key, 'tokens', tokens_scaled, 'base', base_ms, 'credited',
    credited_scaled == 0 and '0' or credited_scaled)
  -- Set on every write: this also repairs a bucket that lost its expiry.
  redis.call('PEXPIREAT', key, expire_at_ms)
end

return decide(3, parse_refill_rate, evaluate, write, 'exact_accrual', 'bucket_burst')
