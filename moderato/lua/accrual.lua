-- moderato: exact linear accrual and the stored state's reading, shared by the token
-- bucket (credit) and the leaky bucket (drain). Spliced in after prelude.lua, like it (see moderato/scripts.py).

-- Accrual at exactly one capacity per window (the token bucket's credit, the leaky
-- bucket's drain): split_per_ms once per policy, then
-- linear_accrual_scaled(elapsed) = floor(elapsed_ms * capacity / window) for
-- 0 <= elapsed_ms <= window. The product can pass 2^53, so capacity =
-- per_ms_whole * window + per_ms_rest is split: elapsed * per_ms_whole <= capacity,
-- elapsed * per_ms_rest < window^2 <= 86,400,000^2 < 2^53 (a longer window takes a
-- capacity below 2^53 / window, checked with the arguments: then per_ms_rest = capacity).
local per_ms_whole, per_ms_rest

local function split_per_ms()
  per_ms_whole = floor_div(capacity_scaled, window_ms)
  per_ms_rest = capacity_scaled - per_ms_whole * window_ms
end

local function linear_accrual_scaled(elapsed_ms)
  return elapsed_ms * per_ms_whole + floor_div(elapsed_ms * per_ms_rest, window_ms)
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

-- A bucket's stored state: three decimal integer fields (an amount, a base time in ms,
-- an amount accrued since it), or nil for a missing key.
local function read_bucket(key, amount_name, base_name, accrued_name)
  local fields = redis.pcall('HMGET', key, amount_name, base_name, accrued_name)
  local amount_scaled = stored_integer(fields[1])
  local base_ms = stored_integer(fields[2])
  local accrued_scaled = stored_integer(fields[3])
  if amount_scaled and base_ms and accrued_scaled and base_ms <= MAX_STATE_TIME_MS then
    return amount_scaled, base_ms, accrued_scaled
  end
  if fields[1] == false and fields[2] == false and fields[3] == false
      and redis.call('EXISTS', key) == 0 then
    return nil
  end
  -- Anything unusual: the exact reading, which refuses unusable state.
  local bucket = refusals().integer_hash(key, { amount_name, base_name, accrued_name },
    { MAX_SAFE_INTEGER, MAX_STATE_TIME_MS, MAX_SAFE_INTEGER })
  return bucket[1], bucket[2], bucket[3]
end
