-- moderato: a bucket's stored state, read for the general path of the token bucket and
-- the leaky bucket. Spliced in after prelude.lua (see moderato/scripts.py).

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
