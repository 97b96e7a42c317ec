-- moderato: a bucket's stored state, read for the general path of the token bucket and
-- the leaky bucket. Spliced in after prelude.lua (see moderato/scripts.py).

-- A bucket's stored state (three decimal integer fields: an amount, a base time in ms,
-- an amount accrued since it) brought into now's frame, for refill() and drain(): the
-- amount capped at what the bucket holds (burst_scaled: a lowered capacity caps what is
-- stored), base, accrued,
-- now_eff_ms (now, or base when it is ahead of the clock: Redis's clock stepped back, so
-- no time has passed yet) and elapsed_ms = now_eff - base. nil for a missing key.
local function read_bucket(key, amount_name, base_name, accrued_name)
  local fields = redis.pcall('HMGET', key, amount_name, base_name, accrued_name)
  local amount_scaled = stored_integer(fields[1])
  local base_ms = stored_integer(fields[2])
  local accrued_scaled = stored_integer(fields[3])
  if not (amount_scaled and base_ms and accrued_scaled and base_ms <= MAX_STATE_TIME_MS) then
    if fields[1] == false and fields[2] == false and fields[3] == false
        and redis.call('EXISTS', key) == 0 then
      return nil
    end
    -- Anything unusual: the exact reading, which refuses unusable state.
    local bucket = refusals().integer_hash(key, { amount_name, base_name, accrued_name },
      { MAX_SAFE_INTEGER, MAX_STATE_TIME_MS, MAX_SAFE_INTEGER })
    amount_scaled, base_ms, accrued_scaled = bucket[1], bucket[2], bucket[3]
  end
  local now_eff_ms = now_ms > base_ms and now_ms or base_ms
  return amount_scaled < burst_scaled and amount_scaled or burst_scaled, base_ms,
    accrued_scaled, now_eff_ms, now_eff_ms - base_ms
end
