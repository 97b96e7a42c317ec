--[[ moderato: fixed window decision, atomic over 1..16 policies.

KEYS[i]  base key of policy i (distinct)
ARGV[1]  cost_scaled: decimal integer 0..2^53 (0 only when peeking)
ARGV[2]  "1" = decide and charge, "0" = peek (computes the same reply, writes nothing)
then per policy i, in KEYS order:
  ARGV[1 + 2i]  capacity_scaled  1..9007199254000
  ARGV[2 + 2i]  window_s         1..86400

State: one counter per window, key <base>:<floor(now_ms / window_ms)>, holding
the scaled units admitted in that window; it expires at the window's end.

Reply: {allowed, deciding, then per policy remaining_scaled, retry_ms, reset_ms}.
A bad argument is "MODERATO_ARG ...", unusable stored state "MODERATO_STATE ...";
in both cases nothing has been written. The math is docs/internals.md
("fixed_window"); docs/internals.md fixes the contract.
]]

--#include prelude.lua

-- Fixed window.

local function evaluate(policy, cost_scaled, now_ms)
  local window_index = floor_div(now_ms, policy.window_ms)
  local window_end_ms = (window_index + 1) * policy.window_ms
  local key = KEYS[policy.number] .. ':' .. decimal(window_index)
  local used_scaled = read_window_usage_scaled(key)

  -- A lowered capacity can leave more used than the capacity: headroom goes negative.
  local headroom_scaled = policy.capacity_scaled - used_scaled
  local fits = cost_scaled <= headroom_scaled
  return {
    fits = fits,
    permanent = cost_scaled > policy.capacity_scaled,
    remaining_uncharged = math.max(0, headroom_scaled),
    remaining_charged = math.max(0, headroom_scaled - cost_scaled),
    reset_charged_ms = window_end_ms,
    reset_uncharged_ms = window_end_ms,
    -- The next window starts empty, so any cost within capacity fits there.
    retry_ms = window_end_ms - now_ms,
    reset_denied_ms = window_end_ms,
    write = function()
      redis.call('INCRBY', key, decimal(cost_scaled))
      -- Set on every write: this also repairs a counter that lost its expiry.
      redis.call('PEXPIREAT', key, decimal(window_end_ms))
    end,
  }
end

return decision_reply(2, nil, evaluate)
