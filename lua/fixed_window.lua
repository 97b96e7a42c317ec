--[[ moderato: fixed window decision, atomic over 1..16 policies.

Called as every decision script (docs/internals.md fixes the contract): KEYS[i]
is policy i's base key; ARGV is cost_scaled, apply ("1" charge, "0" peek: the
same reply, nothing written), then capacity_scaled and window_s per policy. The
reply is {allowed, deciding, then remaining_scaled, retry_ms, reset_ms per policy};
a refusal, "MODERATO_ARG ..." or "MODERATO_STATE ...", writes nothing.

State: one counter per window, key <base>:<floor(now_ms / window_ms)>, holding
the scaled units admitted in that window. Its expiry, the window's end, is set
when an admission finds it at 0 (creates it) and kept by later admissions, as
nothing moderato runs leaves a counter without one. (A counter that lost it
to a hand-made PERSIST or SET stays until deleted: its window is never read
again, and reset deletes the current one.) Admit iff used + cost <= capacity;
reset at the window's end, and a denial's wait until then.
]]

local FIELDS_PER_POLICY = 2
-- What the straight-line path's pieces hand on (lua/counter_run.lua says what each holds;
-- window_suffix: ':<window index>', the counter's key after the base key).
local state_key, window_end_ms, expire_at_ms, stored_scaled, found_scaled, used_scaled,
  charged_text, window_suffix
--#include one_policy.lua

-- The common case, straight-line (no function built, none called): one policy, charging,
-- short decimal arguments within range, a cost within capacity. The counter is charged
-- first (INCRBY) and the charge undone (DECRBY) when it does not fit: the script runs
-- atomically, so no one sees the difference from reading first, and an admission costs
-- one command fewer. Anything else, and any counter INCRBY cannot take (another type, not
-- an integer, beyond 2^53), goes on to the general path below with nothing changed.
--
-- Split in pieces at its --#batch lines: what the policy and the instant give (before the
-- key), the key, the read, the decision, the write. Alone, each runs once; a batched script
-- (lua/batch.lua) runs the policy's piece once per policy sent, the key and the read once
-- per run of checks on one counter, the decision per check, the write once per run.
if cost_scaled and cost_scaled <= capacity_scaled then
  window_ms = window_s * 1000
  -- fmod is exact, so this is the window's end exactly (see floor_div in prelude.lua).
  window_end_ms = now_ms - math.fmod(now_ms, window_ms) + window_ms
  -- '%d' writes the window index in full, and faster than '..' would (with '%.14g').
  window_suffix = string_format(':%d', window_end_ms / window_ms - 1)
  expire_at_ms = window_end_ms -- a counter created now lives to the window's end
--#batch key
  state_key = KEYS[1] .. window_suffix
--#batch read
--#include counter_run.lua
--#batch decide
  -- Decided on used_scaled, the counter as the checks before left it (the read's, alone):
  -- valid when 0..2^53 (a sum below 2^53 is exact), else the general path decides. (A sum
  -- within the capacity is below 2^53: only a denial's is checked against it.)
  local charged_used_scaled = used_scaled + cost_scaled
  if used_scaled >= 0 then
    if charged_used_scaled <= capacity_scaled then
      used_scaled = charged_used_scaled
      decided_allowed = 1
      decided_remaining = capacity_scaled - charged_used_scaled
      decided_retry_ms = 0
      decided_reset_ms = window_end_ms
    elseif charged_used_scaled < 9007199254740992 then -- MAX_SAFE_INTEGER
      -- Denied: the counter leaves less than the cost (its excess over a since-lowered
      -- capacity shows as 0 remaining); the next window starts empty, and the cost is
      -- within capacity, so it fits there.
      local headroom_scaled = capacity_scaled - used_scaled
      decided_allowed = 0
      decided_remaining = headroom_scaled > 0 and headroom_scaled or 0
      decided_retry_ms = window_end_ms - now_ms
      decided_reset_ms = window_end_ms
    end
  end
--#batch write
--#include counter_write.lua
--#batch end
--#include decided_reply.lua
end

--#batch shared
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
    key, used_scaled + cost_scaled, used_scaled == 0 and window_end_ms
end

--#include window_counter.lua

return decide(2, nil, evaluate, write_counter)
