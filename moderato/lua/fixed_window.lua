--[[ moderato: fixed window decision, atomic over 1..16 policies.

KEYS[i]  base key of policy i (distinct)
ARGV[1]  cost_scaled: decimal integer 0..2^53 (0 only when peeking)
ARGV[2]  "1" = decide and charge, "0" = peek (computes the same reply, writes nothing)
then per policy i, in KEYS order:
  ARGV[1 + 2i]  capacity_scaled  1..9007199254000
  ARGV[2 + 2i]  window_s         1..311040000

State: one counter per window, key <base>:<floor(now_ms / window_ms)>, holding
the scaled units admitted in that window; it expires at the window's end.

Reply: {allowed, deciding, then per policy remaining_scaled, retry_ms, reset_ms}.
A bad argument is "MODERATO_ARG ...", unusable stored state "MODERATO_STATE ...";
in both cases nothing has been written. The math is docs/internals.md
("fixed_window"); docs/internals.md fixes the contract.
]]

--#include prelude.lua

-- Fixed window.

local function evaluate(i, first, cost_scaled, now_ms)
  capacity_scaled, window_s = tonumber(ARGV[first]), tonumber(ARGV[first + 1])
  window_ms = window_s * 1000
  local window_index = floor_div(now_ms, window_ms)
  local window_end_ms = (window_index + 1) * window_ms
  -- A window index is below 10^14, which '..' writes in full.
  local key = KEYS[i] .. ':' .. window_index
  local used_scaled = read_counter(key)

  -- A lowered capacity can leave more used than the capacity: headroom goes negative.
  local headroom_scaled = capacity_scaled - used_scaled
  local remaining_uncharged, remaining_charged = remaining_scaled(headroom_scaled, cost_scaled)
  -- Denied: the next window starts empty, so any cost within capacity fits there.
  return cost_scaled <= headroom_scaled, cost_scaled > capacity_scaled,
    remaining_uncharged, remaining_charged, window_end_ms, window_end_ms,
    window_end_ms - now_ms, window_end_ms,
    key, used_scaled + cost_scaled, window_end_ms
end

-- The counter's new value and its expiry in one command (what INCRBY then PEXPIREAT
-- would leave): set on every write, which also repairs a counter that lost its expiry.
local function write(key, used_scaled, window_end_ms)
  redis.call('SET', key, used_scaled, 'PXAT', window_end_ms)
end

return decide(2, nil, evaluate, write)
