--[[ moderato: leaky bucket (policing, no queueing) decision, atomic over 1..16 policies.

KEYS[i]  base key of policy i (distinct)
ARGV[1]  cost_scaled: decimal integer 0..2^53 (0 only when peeking)
ARGV[2]  "1" = decide and charge, "0" = peek (computes the same reply, writes nothing)
then per policy i, in KEYS order:
  ARGV[1 + 2i]  capacity_scaled  1..9007199254000
  ARGV[2 + 2i]  window_s         1..311040000; above 94906 s capacity_scaled
                                 <= floor(2^53 / window_ms) (the drain stays exact)
or, with a burst, three per policy (ARGV[3i] .. ARGV[3i + 2]): the two above, then
burst_scaled 1..9007199254000: the bucket holds burst_scaled and drains capacity_scaled
per window, within ten 360-day years in whole windows
(burst_scaled <= floor(311040000 / window_s) * capacity_scaled).

State: key <base>:leaky, a hash of decimal integer strings: level (scaled units in the
bucket), base (ms) and drained (scaled units drained since base). The level drains
capacity per window, exactly: drained since base = floor(elapsed_ms * C / W). A request
is admitted iff level + cost <= capacity, else rejected at once (policing: nothing is
queued). This is the token bucket's dual (tokens = capacity - level) with the token
bucket's public accrual, rebased at whole windows; an empty bucket discards its idle
drain, fractions too, as a full token bucket discards idle credit.
  reset (allowed) = when the level has drained to zero
  retry (denied)  = when enough has drained for the cost to fit
The key expires 1 s after the level reaches zero: a missing key reads the same (empty).
A level above capacity (capacity lowered on a live key) reads as full; state no
consistent history produces (clock stepped back, capacity changed) drains nothing and
restarts the drain at now.

Reply: {allowed, deciding, then per policy remaining_scaled, retry_ms, reset_ms}.
A bad argument is "MODERATO_ARG ...", unusable stored state "MODERATO_STATE ...";
in both cases nothing has been written. docs/internals.md fixes the contract.
]]

local FIELDS_PER_POLICY = 2
-- The state the one-policy path in accrual.lua reads and writes.
local BUCKET_SUFFIX, AMOUNT_FIELD, ACCRUED_FIELD, AMOUNT_IS_LEVEL = ':leaky', 'level', 'drained', true
-- ACCRUAL_STATE: what accrual.lua's straight-line pieces hand on.
local state_key, per_ms_whole, per_ms_rest, deficit_scaled, read_deficit_scaled, base_ms,
  accrued_scaled, written_amount_scaled, expire_at_ms, denial, denied_cost_scaled,
  denied_deficit_scaled, written_amount_text, written_amount_of, written_base_text, written_base_of,
  read_fields, searched_target_scaled, searched_elapsed_ms
--#include one_policy.lua
--#include accrual.lua

--#include prelude.lua
--#include bucket_state.lua

-- Leaky bucket (policing).

local DRAINED_EXPIRY_MARGIN_MS = 1000

-- Brings a bucket, as read_bucket() returns it, up to now. Returns level_scaled, base_ms,
-- drained_scaled and elapsed_ms (now - base, never negative), with
-- drained == drained_by(elapsed).
local function drain(level_scaled, base_ms, drained_scaled, now_eff_ms, elapsed_ms)
  if not level_scaled then
    return 0, now_ms, 0, 0
  end
  local whole_windows = floor_div(elapsed_ms, window_ms)
  -- Within the first window the drain due is small enough to compute directly.
  local due_scaled = whole_windows == 0 and linear_accrual_scaled(elapsed_ms) or nil
  local empty
  if drained_scaled >= capacity_scaled or (due_scaled and due_scaled < drained_scaled) then
    -- A consistent bucket always has drained_by(elapsed) >= drained < capacity: this one was
    -- written under another capacity, or the clock stepped back. Restart the drain here.
    base_ms, drained_scaled, elapsed_ms = now_eff_ms, 0, 0
    empty = level_scaled == 0
  elseif whole_windows >= 2 and (whole_windows - 1) * capacity_scaled >= burst_scaled then
    -- k windows drain k * capacity - drained > (k - 1) * capacity units: empty whatever the
    -- level once that reaches the burst (two windows without one). A product past 2^53 is
    -- still far above any burst.
    empty = true
  elseif whole_windows >= 1 then
    -- Due since base = k * capacity + drained_by(elapsed - k windows) (k * capacity stays
    -- below burst + capacity); rebase by k whole windows. The level stays positive.
    local drain_in_window_scaled = linear_accrual_scaled(elapsed_ms - whole_windows * window_ms)
    local gain_scaled = whole_windows * capacity_scaled - drained_scaled + drain_in_window_scaled
    empty = gain_scaled >= level_scaled
    if not empty then
      level_scaled = level_scaled - gain_scaled
      base_ms = base_ms + whole_windows * window_ms
      elapsed_ms = elapsed_ms - whole_windows * window_ms
      drained_scaled = drain_in_window_scaled
    end
  else
    empty = due_scaled - drained_scaled >= level_scaled
    if not empty then
      level_scaled = level_scaled - (due_scaled - drained_scaled)
      drained_scaled = due_scaled
    end
  end

  if empty then
    -- An empty bucket discards idle drain, fractions too: the drain restarts now.
    return 0, now_eff_ms, 0, 0
  end
  return level_scaled, base_ms, drained_scaled, elapsed_ms
end

local function evaluate(i, first, cost_scaled, now_ms, many)
  -- Checked digits: arithmetic converts them (tonumber is a C call).
  capacity_scaled, window_s = ARGV[first] + 0, ARGV[first + 1] + 0
  burst_scaled = burst_field and ARGV[first + burst_field] + 0 or capacity_scaled
  window_ms = window_s * 1000
  split_per_ms()
  local key = KEYS[i] .. BUCKET_SUFFIX
  local level_scaled, base_ms, drained_scaled = drain(read_bucket(key, 'level', 'base', 'drained'))
  local headroom_scaled = burst_scaled - level_scaled

  local fits = cost_scaled <= headroom_scaled
  local permanent = cost_scaled > burst_scaled
  local remaining_charged, reset_charged_ms, reset_uncharged_ms, retry_ms, reset_denied_ms
  if fits then
    -- Allowed: reset is when the level has drained to zero, with or without this charge.
    remaining_charged = headroom_scaled - cost_scaled
    reset_charged_ms = accrued_at_ms(base_ms, drained_scaled, level_scaled + cost_scaled)
    if many then
      reset_uncharged_ms = accrued_at_ms(base_ms, drained_scaled, level_scaled)
    end
  elseif not permanent then
    -- Denied: reset is when enough has drained for this cost to fit.
    reset_denied_ms = accrued_at_ms(base_ms, drained_scaled, cost_scaled - headroom_scaled)
    retry_ms = reset_denied_ms - now_ms
  end
  return fits, permanent, headroom_scaled, remaining_charged, reset_charged_ms, reset_uncharged_ms,
    retry_ms, reset_denied_ms,
    key, level_scaled + cost_scaled, base_ms, drained_scaled, reset_charged_ms
end

local function write(key, level_scaled, base_ms, drained_scaled, empty_at_ms)
  -- A restarted drain stores 0 as a literal, which Redis need not format.
  redis.call('HSET', key, 'level', level_scaled, 'base', base_ms, 'drained',
    drained_scaled == 0 and '0' or drained_scaled)
  -- Set on every write: this also repairs a bucket that lost its expiry.
  redis.call('PEXPIREAT', key, empty_at_ms + DRAINED_EXPIRY_MARGIN_MS)
end

return decide(2, nil, evaluate, write, 'exact_accrual', 'bucket_burst')
