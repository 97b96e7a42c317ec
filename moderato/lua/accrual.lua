-- moderato: exact linear accrual, shared by the token bucket (credit) and the leaky
-- bucket (drain), their one-policy paths and their general paths alike. Spliced in (see
-- moderato/scripts.py) after one_policy.lua (the clock, the policy scalars) and before
-- prelude.lua, so it uses nothing of prelude.lua: fmod is exact, so
-- (n - fmod(n, d)) / d is floor(n / d) exactly (floor_div there).

-- Accrual at exactly one capacity per window (the token bucket's credit, the leaky
-- bucket's drain): split_per_ms once per policy, then
-- linear_accrual_scaled(elapsed) = floor(elapsed_ms * capacity / window) for
-- 0 <= elapsed_ms <= window. The product can pass 2^53, so capacity =
-- per_ms_whole * window + per_ms_rest is split: elapsed * per_ms_whole <= capacity,
-- elapsed * per_ms_rest < window^2 <= 86,400,000^2 < 2^53 (a longer window takes a
-- capacity below 2^53 / window, checked with the arguments: then per_ms_rest = capacity).
local per_ms_whole, per_ms_rest

local function split_per_ms()
  per_ms_rest = math.fmod(capacity_scaled, window_ms)
  per_ms_whole = (capacity_scaled - per_ms_rest) / window_ms
end

local function linear_accrual_scaled(elapsed_ms)
  local rest_product = elapsed_ms * per_ms_rest
  return elapsed_ms * per_ms_whole + (rest_product - math.fmod(rest_product, window_ms)) / window_ms
end

-- The smallest elapsed_ms in [0, window] accruing at least target_scaled
-- (0 <= target_scaled <= capacity). The float estimate of ceil(target * window / capacity)
-- is off by at most one; the exact accrual settles it.
local function elapsed_for_accrual_ms(target_scaled)
  local elapsed_ms = math.ceil(target_scaled / capacity_scaled * window_ms)
  if elapsed_ms < 0 then
    elapsed_ms = 0
  elseif elapsed_ms > window_ms then
    elapsed_ms = window_ms
  end
  while elapsed_ms < window_ms and linear_accrual_scaled(elapsed_ms) < target_scaled do
    elapsed_ms = elapsed_ms + 1
  end
  while elapsed_ms > 0 and linear_accrual_scaled(elapsed_ms - 1) >= target_scaled do
    elapsed_ms = elapsed_ms - 1
  end
  return elapsed_ms
end

-- The instant at which need_scaled more units have accrued, given accrued_scaled accrued
-- since base_ms (need_scaled <= capacity). accrued + need can pass 2^53: compare
-- through the headroom left in this window.
local function accrued_at_ms(base_ms, accrued_scaled, need_scaled)
  local left_in_window_scaled = capacity_scaled - accrued_scaled
  if need_scaled <= left_in_window_scaled then
    return base_ms + elapsed_for_accrual_ms(accrued_scaled + need_scaled)
  end
  return base_ms + window_ms + elapsed_for_accrual_ms(need_scaled - left_in_window_scaled)
end

-- For the one-policy paths: a bucket's three fields (an amount, base, an amount accrued
-- since base) if each is a decimal of up to 15 digits (so below 2^53, and base below
-- 2^52); false for a missing key; nil for anything else, left to the general path.
-- It also sets up the policy's accrual (window_ms, split_per_ms).
local function usual_bucket(key, amount_name, accrued_name)
  window_ms = window_s * 1000
  split_per_ms()
  local fields = redis.pcall('HMGET', key, amount_name, 'base', accrued_name)
  local amount_text, base_text, accrued_text = fields[1], fields[2], fields[3]
  if amount_text and base_text and accrued_text
      and #amount_text < 16 and #base_text < 16 and #accrued_text < 16
      and string.find(amount_text .. base_text .. accrued_text, '^%d+$') then
    return tonumber(amount_text), tonumber(base_text), tonumber(accrued_text)
  end
  if not fields.err and not amount_text and not base_text and not accrued_text
      and redis.call('EXISTS', key) == 0 then
    return false
  end
  return nil
end

-- For the one-policy paths: a consistent bucket brought up to now. deficit_scaled is
-- what accrual makes up (the token bucket's capacity - tokens, the leaky bucket's level),
-- 0..capacity. Returns deficit, base, accrued, made up in full (0, now, 0: the accrual
-- restarts now, idle fractions discarded) two windows or more after base, or within the
-- first window; nil one window after base (a rebase) or for state no consistent history
-- leaves (accrued >= capacity, accrued above what is due): the general path's cases.
local function settled(deficit_scaled, base_ms, accrued_scaled)
  -- A base ahead of the clock (Redis's clock stepped back): no time has passed yet.
  local now_eff_ms = now_ms > base_ms and now_ms or base_ms
  local elapsed_ms = now_eff_ms - base_ms
  if accrued_scaled >= capacity_scaled or (elapsed_ms >= window_ms and elapsed_ms < 2 * window_ms) then
    return nil
  end
  if elapsed_ms < window_ms then
    local due_scaled = linear_accrual_scaled(elapsed_ms)
    if due_scaled < accrued_scaled then
      return nil
    end
    if due_scaled - accrued_scaled < deficit_scaled then
      return deficit_scaled - (due_scaled - accrued_scaled), base_ms, due_scaled
    end
  end
  return 0, now_eff_ms, 0
end
