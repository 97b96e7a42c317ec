--[[ moderato: sliding window (two-counter estimate) decision, atomic over 1..16 policies.

Called as every decision script (docs/internals.md fixes the contract): KEYS[i]
is policy i's base key; ARGV is cost_scaled, apply ("1" charge, "0" peek: the
same reply, nothing written), then capacity_scaled and window_s per policy. The
reply is {allowed, deciding, then remaining_scaled, retry_ms, reset_ms per policy};
a refusal, "MODERATO_ARG ..." or "MODERATO_STATE ...", writes nothing.

State: fixed_window.lua's counters (<base>:<window index>, the scaled units
admitted in that window), each living until the end of the following window,
which reads it as its previous counter; that expiry is set, as there, by the
admission that finds the counter at 0. The estimate is
floor(previous * weight_permille / 1000) + current, where the previous
window's weight falls at whole seconds: floor((window_s - elapsed_s) * 1000 / window_s).
The math, waits included: docs/algorithms.md ("Sliding window").
]]

local FIELDS_PER_POLICY = 2
-- What the straight-line path's pieces hand on (lua/counter_run.lua says what most hold;
-- elapsed_s: the instant's whole seconds into its window, room_scaled: the capacity less the weighted
-- previous counter, previous_scaled: that counter; denial: true when the run has denied, its
-- last denial for denied_cost_scaled on the current counter at denied_used_scaled (what it
-- decided still the decided_* scalars: see the decision); the policy's piece's
-- window_suffix and previous_suffix, ':<window index>' of the current and the previous
-- window, the counters' keys after the base key, and weight_permille, the previous
-- counter's weight now).
local state_key, window_end_ms, expire_at_ms, stored_scaled, found_scaled, used_scaled,
  charged_text, elapsed_s, room_scaled, previous_scaled, denial,
  denied_cost_scaled, denied_used_scaled, window_suffix, previous_suffix, weight_permille
--#include one_policy.lua

-- The common case, straight-line (no function built, none called): one policy, charging,
-- short decimal arguments within range, a cost within the capacity, counters that are
-- short decimals (or missing): admitted or denied here. The previous counter is read
-- first: when even an empty current window could not take the cost, the current counter
-- is only read (GET), for the denial. Otherwise the current counter is charged first
-- (INCRBY) and the charge undone (DECRBY) if it does not fit, as in fixed_window.lua: a
-- counter found at 0 always fits, so one that did not exist is never left behind.
-- Anything else, and any counter INCRBY or GET cannot take, goes on to the general path
-- with nothing changed. A denial's wait is the general path's search (retry_at_ms()): the
-- first whole second at which the estimate admits the cost, in this window as the
-- previous counter's weight falls, else in the next one (this window's counter then the
-- previous), else the start of the one after. Each is the smallest second at which a
-- count weighted by floor((window_s - s) * 1000 / window_s) permille stays within a
-- budget; the weight only falls as s grows, so whether it fits is false, then true, and
-- any search finding the first true finds the general path's second: here one bisection
-- over [first, last + 1] (last + 1 standing for "none in this window"), run for each
-- window in turn.
--
-- Split in pieces at its --#batch lines, as fixed_window.lua's: the policy's (the instant's
-- window, the previous counter's weight), the key, the read (both counters), the decision,
-- the write (the current counter).
if cost_scaled and cost_scaled <= capacity_scaled then
  window_ms = window_s * 1000
  -- fmod is exact, so these are exact (see floor_div in prelude.lua).
  local window_start_ms = now_ms - math.fmod(now_ms, window_ms)
  local window_index = window_start_ms / window_ms
  local elapsed_ms = now_ms - window_start_ms
  elapsed_s = (elapsed_ms - math.fmod(elapsed_ms, 1000)) / 1000
  window_end_ms = window_start_ms + window_ms
  -- '%d' writes a window index in full, and faster than '..' would (with '%.14g').
  window_suffix = string_format(':%d', window_index)
  previous_suffix = string_format(':%d', window_index - 1)
  expire_at_ms = window_end_ms + window_ms -- it lives on as the next window's previous counter
  -- weight = floor((window_s - elapsed_s) * 1000 / window_s) permille.
  local weight_numerator = (window_s - elapsed_s) * 1000
  weight_permille = (weight_numerator - math.fmod(weight_numerator, window_s)) / window_s
--#batch key
  state_key = KEYS[1] .. window_suffix
--#batch read
  -- GET answers a key of another type with an error, so a nil (false) is a missing counter.
  local previous_text = redis_pcall('GET', KEYS[1] .. previous_suffix)
  stored_scaled, found_scaled, used_scaled = -1, -1, -1 -- nothing read: the general path's
  denial, previous_scaled = nil, nil
  if not previous_text then
    previous_scaled, room_scaled = 0, capacity_scaled -- missing: it weighs nothing
  elseif previous_text.err then
    if string_find(previous_text.err, "can't run this command", 1, true) then
      return previous_text -- an ACL without GET: a misconfiguration to report
    end
  -- Up to 15 digits: below 2^53, so reading them is exact (by arithmetic: digits only, so
  -- it reads them as tonumber would, with no call).
  elseif #previous_text < 16 and string_find(previous_text, '^%d+$') then
    previous_scaled = previous_text + 0
    -- The previous count weighted, floor(previous * weight / 1000), split as 1000 *
    -- thousands + rest so that no product passes 2^53: the same integers as the general
    -- path's. (Integers below 2^53: % is exact, as fmod.)
    local rest_scaled = previous_scaled % 1000
    local rest_weighted = rest_scaled * weight_permille
    room_scaled = capacity_scaled - ((previous_scaled - rest_scaled) / 1000 * weight_permille
      + (rest_weighted - rest_weighted % 1000) / 1000)
  end
  if previous_scaled then
    if cost_scaled <= room_scaled then
--#include counter_run.lua
    else
      -- Denied whatever the current counter holds: read it (nothing charged, nothing to
      -- undo) for the denial's remaining and wait.
      local current_text = redis_pcall('GET', state_key) or '0'
      if not current_text.err and #current_text < 16 and string_find(current_text, '^%d+$') then
        stored_scaled = current_text + 0
        found_scaled, used_scaled = stored_scaled, stored_scaled
      end
    end
  end
--#batch decide
  -- Decided on used_scaled, the current counter as the checks before left it (valid when
  -- 0..2^53, charged too), and the previous counter as read. (A sum within the room, at
  -- most the capacity, is below 2^53: only a denial's is checked against it.)
  local charged_used_scaled = used_scaled + cost_scaled
  if used_scaled >= 0 then
    if charged_used_scaled <= room_scaled then
      used_scaled = charged_used_scaled
      decided_allowed = 1
      decided_remaining = room_scaled - charged_used_scaled
      decided_retry_ms = 0
      decided_reset_ms = window_end_ms
    elseif charged_used_scaled >= 9007199254740992 then -- MAX_SAFE_INTEGER
      decided_allowed = nil -- the general path decides
    elseif denial and cost_scaled == denied_cost_scaled and used_scaled == denied_used_scaled then
      -- The run's denial before, of this cost on the same counters: the same. Nothing since
      -- changed the decided_* scalars it left (an admission would have charged the counter,
      -- another denial would be the run's last), so only allowed is set again.
      decided_allowed = 0
    else
      -- Denied: the first fitting second of this window for the previous counter (within
      -- the budget less the current one), else of the next for the current counter, else
      -- the start of the window after. (Integers below 2^53: % is exact, as fmod.)
      local budget_scaled = capacity_scaled - cost_scaled
      local retry_at_ms = window_end_ms + window_ms
      local window_at_ms, count_scaled, within_scaled, first_s =
        window_end_ms - window_ms, previous_scaled, budget_scaled - used_scaled, elapsed_s + 1
      for _ = 1, 2 do
        local last_s = window_s - 1
        if within_scaled >= 0 and first_s <= last_s then
          local thousands_scaled = count_scaled - count_scaled % 1000
          local rest_scaled = count_scaled - thousands_scaled
          local high_s = last_s + 1
          while first_s < high_s do
            local middle_s = first_s + high_s
            middle_s = (middle_s - middle_s % 2) / 2
            local weight_numerator = (window_s - middle_s) * 1000
            local weight_permille = (weight_numerator - weight_numerator % window_s) / window_s
            local rest_weighted = rest_scaled * weight_permille
            if thousands_scaled / 1000 * weight_permille
                + (rest_weighted - rest_weighted % 1000) / 1000 <= within_scaled then
              high_s = middle_s
            else
              first_s = middle_s + 1
            end
          end
          if first_s <= last_s then
            retry_at_ms = window_at_ms + first_s * 1000
            break
          end
        end
        window_at_ms, count_scaled, within_scaled, first_s =
          window_end_ms, used_scaled, budget_scaled, 0
      end
      local headroom_scaled = room_scaled - used_scaled
      decided_allowed = 0
      decided_remaining = headroom_scaled > 0 and headroom_scaled or 0
      decided_retry_ms = retry_at_ms - now_ms
      decided_reset_ms = retry_at_ms
      denial = true
      denied_cost_scaled = cost_scaled
      denied_used_scaled = used_scaled
    end
  end
--#batch write
--#include counter_write.lua
--#batch end
--#include decided_reply.lua
end

--#batch shared
--#include prelude.lua

-- Sliding window.

-- The previous window's weight after elapsed_s whole seconds of the current one, in permille.
local function previous_weight_permille(elapsed_s)
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

-- When the same quantized estimate first admits cost_scaled, assuming no other traffic:
-- later in this window as the previous weight falls, else in the next window (where this
-- window's counter becomes the previous one), else at the start of the one after (both empty).
local function retry_at_ms(cost_scaled, window_index, elapsed_s, previous_scaled, current_scaled)
  -- The smallest second s in [first_s, last_s] at which previous_scaled, weighted for s,
  -- stays within budget_scaled; nil if none. The weight only falls as s grows.
  local function first_fitting_second(count_scaled, budget_scaled, first_s, last_s)
    local function fits_at(second)
      return weighted_scaled(count_scaled, previous_weight_permille(second)) <= budget_scaled
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
  local window_start_ms = window_index * window_ms
  local budget_scaled = capacity_scaled - cost_scaled
  local second = first_fitting_second(previous_scaled, budget_scaled - current_scaled,
    elapsed_s + 1, window_s - 1)
  if second then
    return window_start_ms + second * 1000
  end
  second = first_fitting_second(current_scaled, budget_scaled, 0, window_s - 1)
  if second then
    return window_start_ms + window_ms + second * 1000
  end
  return window_start_ms + 2 * window_ms
end

local function evaluate(i, first, cost_scaled, now_ms)
  capacity_scaled, window_s = tonumber(ARGV[first]), tonumber(ARGV[first + 1])
  window_ms = window_s * 1000
  local window_index = floor_div(now_ms, window_ms)
  local window_start_ms = window_index * window_ms
  local elapsed_s = floor_div(now_ms - window_start_ms, 1000)
  -- A window index is below 10^14, which '..' writes in full.
  local current_key = KEYS[i] .. ':' .. window_index
  local previous_key = KEYS[i] .. ':' .. (window_index - 1)
  -- Two GETs, not one MGET: MGET answers nil for a key of another type as for a missing
  -- one, and the previous counter is usually missing, so it would be read again.
  local current_scaled = read_counter(current_key)
  local stored_previous = redis.pcall('GET', previous_key)
  local previous_scaled = 0
  if stored_previous then
    previous_scaled = stored_integer(stored_previous) or refusals().counter(previous_key)
  end

  local weighted_previous_scaled =
    weighted_scaled(previous_scaled, previous_weight_permille(elapsed_s))
  -- capacity - estimate, by subtraction: the estimate itself could pass 2^53 for stored counts
  -- above a lowered capacity; then this is negative and the request does not fit.
  local headroom_scaled = (capacity_scaled - current_scaled) - weighted_previous_scaled
  local fits = cost_scaled <= headroom_scaled
  local permanent = cost_scaled > capacity_scaled
  local window_end_ms = window_start_ms + window_ms
  local remaining_uncharged, remaining_charged = remaining_scaled(headroom_scaled, cost_scaled)
  local retry_ms, reset_denied_ms
  if not fits and not permanent then
    reset_denied_ms =
      retry_at_ms(cost_scaled, window_index, elapsed_s, previous_scaled, current_scaled)
    retry_ms = reset_denied_ms - now_ms
  end
  return fits, permanent, remaining_uncharged, remaining_charged, window_end_ms, window_end_ms,
    retry_ms, reset_denied_ms,
    current_key, current_scaled + cost_scaled, current_scaled == 0 and window_end_ms + window_ms
end

--#include window_counter.lua

return decide(2, nil, evaluate, write_counter)
