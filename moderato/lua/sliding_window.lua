--[[ moderato: sliding window (two-counter estimate) decision, atomic over 1..16 policies.

KEYS[i]  base key of policy i (distinct)
ARGV[1]  cost_scaled: decimal integer 0..2^53 (0 only when peeking)
ARGV[2]  "1" = decide and charge, "0" = peek (computes the same reply, writes nothing)
then per policy i, in KEYS order:
  ARGV[1 + 2i]  capacity_scaled  1..9007199254000
  ARGV[2 + 2i]  window_s         1..86400

State: one counter per window, key <base>:<floor(now_ms / window_ms)>, holding
the scaled units admitted in it; it lives until the end of the following
window, where it serves as the previous counter. The estimate is
floor(previous * weight_permille / 1000) + current, where the previous
window's weight falls at whole seconds: floor((window_s - elapsed_s) * 1000 / window_s).

Reply: {allowed, deciding, then per policy remaining_scaled, retry_ms, reset_ms}.
A bad argument is "MODERATO_ARG ...", unusable stored state "MODERATO_STATE ...";
in both cases nothing has been written. The math is docs/internals.md
("sliding_window"); docs/internals.md fixes the contract.
]]

--#include prelude.lua

-- Sliding window.

-- The previous window's weight after elapsed_s whole seconds of the current one, in permille.
local function previous_weight_permille(window_s, elapsed_s)
  return floor_div((window_s - elapsed_s) * 1000, window_s)
end

-- floor(count_scaled * weight_permille / 1000), exactly, for any stored count up to 2^53
-- (the product passes 2^53 for a count above a since-lowered capacity): count is split
-- into 1000 * thousands + rest, and floor_div never rounds a quotient up.
local function weighted_scaled(count_scaled, weight_permille)
  local thousands = floor_div(count_scaled, 1000)
  local rest = count_scaled - thousands * 1000
  return thousands * weight_permille + floor_div(rest * weight_permille, 1000)
end

-- The smallest second s in [first_s, last_s] at which previous_scaled, weighted for s,
-- stays within budget_scaled; nil if none. The weight only falls as s grows.
local function first_fitting_second(previous_scaled, budget_scaled, window_s, first_s, last_s)
  local function fits_at(second)
    local weight_permille = previous_weight_permille(window_s, second)
    return weighted_scaled(previous_scaled, weight_permille) <= budget_scaled
  end
  if budget_scaled < 0 or first_s > last_s or not fits_at(last_s) then
    return nil
  end
  while first_s < last_s do
    local middle_s = floor_div(first_s + last_s, 2)
    if fits_at(middle_s) then
      last_s = middle_s
    else
      first_s = middle_s + 1
    end
  end
  return first_s
end

-- When the same quantized estimate first admits cost_scaled, assuming no other traffic:
-- later in this window as the previous weight falls, else in the next window (where this
-- window's counter becomes the previous one), else at the start of the one after (both empty).
local function retry_at_ms(policy, cost_scaled, window_index, elapsed_s, previous_scaled, current_scaled)
  local window_s, window_ms = policy.window_s, policy.window_ms
  local window_start_ms = window_index * window_ms
  local budget_scaled = policy.capacity_scaled - cost_scaled
  local second = first_fitting_second(previous_scaled, budget_scaled - current_scaled, window_s,
    elapsed_s + 1, window_s - 1)
  if second then
    return window_start_ms + second * 1000
  end
  second = first_fitting_second(current_scaled, budget_scaled, window_s, 0, window_s - 1)
  if second then
    return window_start_ms + window_ms + second * 1000
  end
  return window_start_ms + 2 * window_ms
end

local function evaluate(policy, cost_scaled, now_ms)
  local window_s, window_ms = policy.window_s, policy.window_ms
  local window_index = floor_div(now_ms, window_ms)
  local window_start_ms = window_index * window_ms
  local elapsed_s = floor_div(now_ms - window_start_ms, 1000)
  local current_key = KEYS[policy.number] .. ':' .. decimal(window_index)
  local previous_key = KEYS[policy.number] .. ':' .. decimal(window_index - 1)
  local current_scaled = read_window_usage_scaled(current_key)
  local previous_scaled = read_window_usage_scaled(previous_key)

  local weighted_previous_scaled =
    weighted_scaled(previous_scaled, previous_weight_permille(window_s, elapsed_s))
  -- capacity - estimate, by subtraction: the estimate itself could pass 2^53 for stored counts
  -- above a lowered capacity; then this is negative and the request does not fit.
  local headroom_scaled = (policy.capacity_scaled - current_scaled) - weighted_previous_scaled
  local fits = cost_scaled <= headroom_scaled
  local permanent = cost_scaled > policy.capacity_scaled
  local window_end_ms = window_start_ms + window_ms
  local verdict = {
    fits = fits,
    permanent = permanent,
    remaining_uncharged = math.max(0, headroom_scaled),
    remaining_charged = math.max(0, headroom_scaled - cost_scaled),
    reset_charged_ms = window_end_ms,
    reset_uncharged_ms = window_end_ms,
    write = function()
      redis.call('INCRBY', current_key, decimal(cost_scaled))
      -- Set on every write (this repairs a counter that lost its expiry); the counter is
      -- read as the previous one until the end of the next window.
      redis.call('PEXPIREAT', current_key, decimal(window_end_ms + window_ms))
      if redis.call('PTTL', previous_key) == -1 then
        redis.call('PEXPIREAT', previous_key, decimal(window_end_ms))
      end
    end,
  }
  if not fits and not permanent then
    verdict.reset_denied_ms =
      retry_at_ms(policy, cost_scaled, window_index, elapsed_s, previous_scaled, current_scaled)
    verdict.retry_ms = verdict.reset_denied_ms - now_ms
  end
  return verdict
end

return decision_reply(2, nil, evaluate)
