-- moderato: exact linear accrual, shared by the token bucket (credit) and the leaky
-- bucket (drain), their one-policy paths and their general paths alike. Spliced in (see
-- moderato/scripts.py) before prelude.lua, after the script's policy scalars
-- (capacity_scaled, window_ms), so it uses nothing of prelude.lua: fmod is exact, so
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
