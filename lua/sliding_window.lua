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
in both cases nothing has been written. The math is /work/shared/ALGORITHMS.md
("sliding_window"); docs/internals.md fixes the contract.
]]

-- ---- BEGIN shared prelude -------------------------------------------------
-- Identical in every decision script (a test checks it): Redis runs each
-- script on its own, so there is nothing to import.

local MAX_SAFE_INTEGER = 9007199254740992 -- 2^53: every integer up to here is exact in a Lua number
local MAX_CAPACITY_SCALED = 9007199254000 -- capacity_scaled * 1000 (permille weights) stays <= 2^53
local MAX_WINDOW_S = 86400
local MAX_POLICIES = 16

-- Refusals are raised as tables; the pcall at the bottom turns them into error replies.
local function fail(kind, message)
  error({ moderato_error = kind .. ' ' .. message }, 0)
end

-- A value for an error message: quoted, printable, and an argument shortened to 40
-- characters (keys, at most a few hundred bytes, are shown whole: pass max_length).
local function shown(value, max_length)
  if type(value) ~= 'string' then
    return tostring(value)
  end
  local text = value
  max_length = max_length or 40
  if #text > max_length then
    text = string.sub(text, 1, max_length) .. '...'
  end
  return '"' .. string.gsub(text, '[^%w%p ]', '?') .. '"'
end

-- Integers are written with %d: tostring() of a large number gives "9.007199254e+15".
local function decimal(integer)
  return string.format('%d', integer)
end

-- The value of a decimal integer string if it lies in [low, high], else nil.
-- Exact: anything longer than 2^53's digits is refused before tonumber can round it.
local function parse_integer(text, low, high)
  if type(text) ~= 'string' or not string.find(text, '^%d+$') then
    return nil
  end
  local digits = string.gsub(text, '^0+', '')
  if #digits > 16 or (#digits == 16 and digits > '9007199254740992') then
    return nil
  end
  local value = tonumber('0' .. digits)
  if value < low or value > high then
    return nil
  end
  return value
end

-- floor(numerator / denominator) for integers 0 <= numerator <= 2^53, denominator >= 1.
-- fmod is exact, so numerator - remainder is an exact multiple and the division is exact;
-- plain '/' then floor could round a quotient just below an integer up to it.
local function floor_div(numerator, denominator)
  return (numerator - math.fmod(numerator, denominator)) / denominator
end

-- Validates KEYS and ARGV; returns cost_scaled, apply and one table per policy.
-- parse_extra(policy, argv_index) reads an algorithm's fields after capacity and window.
local function parse_arguments(fields_per_policy, parse_extra)
  local policy_count = #KEYS
  if policy_count < 1 or policy_count > MAX_POLICIES then
    fail('MODERATO_ARG', 'expected 1..' .. MAX_POLICIES .. ' keys (one base key per policy), got '
      .. policy_count)
  end
  local expected_argc = 2 + fields_per_policy * policy_count
  if #ARGV ~= expected_argc then
    fail('MODERATO_ARG', 'expected ' .. expected_argc .. ' arguments for ' .. policy_count
      .. ' policies (cost_scaled, apply, then ' .. fields_per_policy .. ' per policy), got ' .. #ARGV)
  end
  local seen = {}
  for i = 1, policy_count do
    if seen[KEYS[i]] then
      fail('MODERATO_ARG', 'KEYS[' .. i .. '] repeats KEYS[' .. seen[KEYS[i]] .. ']: one policy per key')
    end
    seen[KEYS[i]] = i
  end
  local apply_text = ARGV[2]
  if apply_text ~= '0' and apply_text ~= '1' then
    fail('MODERATO_ARG', 'ARGV[2] (apply) must be "1" (decide and charge) or "0" (peek), got '
      .. shown(apply_text))
  end
  local apply = apply_text == '1'
  local cost_scaled = parse_integer(ARGV[1], apply and 1 or 0, MAX_SAFE_INTEGER)
  if not cost_scaled then
    fail('MODERATO_ARG', 'ARGV[1] (cost_scaled) must be an integer ' .. (apply and '1' or '0')
      .. '..9007199254740992' .. (apply and ' when charging' or '') .. ', got ' .. shown(ARGV[1]))
  end
  local policies = {}
  for i = 1, policy_count do
    local first = 3 + fields_per_policy * (i - 1)
    local capacity_scaled = parse_integer(ARGV[first], 1, MAX_CAPACITY_SCALED)
    if not capacity_scaled then
      fail('MODERATO_ARG', 'ARGV[' .. first .. '] (capacity_scaled of policy ' .. i
        .. ') must be an integer 1..' .. decimal(MAX_CAPACITY_SCALED) .. ', got ' .. shown(ARGV[first]))
    end
    local window_s = parse_integer(ARGV[first + 1], 1, MAX_WINDOW_S)
    if not window_s then
      fail('MODERATO_ARG', 'ARGV[' .. (first + 1) .. '] (window_s of policy ' .. i
        .. ') must be an integer 1..' .. MAX_WINDOW_S .. ', got ' .. shown(ARGV[first + 1]))
    end
    local policy = {
      number = i, capacity_scaled = capacity_scaled, window_s = window_s, window_ms = window_s * 1000,
    }
    if parse_extra then
      parse_extra(policy, first + 2)
    end
    policies[i] = policy
  end
  return cost_scaled, apply, policies
end

-- Redis's clock, in milliseconds. The only time source: every policy sees the same instant.
local function redis_now_ms()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- A Redis read that turns an error (e.g. WRONGTYPE) into a state refusal.
local function read(command, key, ...)
  local result = redis.pcall(command, key, ...)
  if type(result) == 'table' and result.err then
    fail('MODERATO_STATE', 'key ' .. shown(key, 1024) .. ' cannot be read: ' .. result.err)
  end
  return result
end

-- Combines the per-policy verdicts into the reply, and applies the writes only
-- when every policy admits and the caller is charging.
-- Each verdict: fits, permanent, retry_ms, and for the two outcomes
-- (charged / not charged) remaining_scaled and reset_ms, plus write().
local function conclude(verdicts, apply)
  local allowed = true
  for i = 1, #verdicts do
    if not verdicts[i].fits then
      allowed = false
    end
  end
  local reply = { allowed and 1 or 0, 0 }
  local deciding, deciding_remaining, deciding_retry = 0, nil, nil
  for i = 1, #verdicts do
    local verdict = verdicts[i]
    local remaining_scaled, retry_ms, reset_ms
    if verdict.permanent then
      remaining_scaled, retry_ms, reset_ms = verdict.remaining_uncharged, -1, -1
    elseif allowed then
      remaining_scaled, retry_ms, reset_ms = verdict.remaining_charged, 0, verdict.reset_charged_ms
    elseif verdict.fits then
      remaining_scaled, retry_ms, reset_ms = verdict.remaining_uncharged, 0, verdict.reset_uncharged_ms
    else
      remaining_scaled, retry_ms, reset_ms =
        verdict.remaining_uncharged, verdict.retry_ms, verdict.reset_denied_ms
    end
    reply[3 * i] = remaining_scaled
    reply[3 * i + 1] = retry_ms
    reply[3 * i + 2] = reset_ms
    -- Admission: the policy with the fewest remaining feeds the headers. Denial: the
    -- longest wait, a permanent one (-1) counting as infinite. Ties: the lowest index.
    if allowed then
      if deciding_remaining == nil or remaining_scaled < deciding_remaining then
        deciding, deciding_remaining = i - 1, remaining_scaled
      end
    elseif deciding_retry ~= -1
        and (deciding_retry == nil or retry_ms == -1 or retry_ms > deciding_retry) then
      deciding, deciding_retry = i - 1, retry_ms
    end
  end
  reply[2] = deciding
  if allowed and apply then
    for i = 1, #verdicts do
      verdicts[i].write()
    end
  end
  return reply
end

-- ---- END shared prelude ---------------------------------------------------

-- Sliding window.

local function read_window_usage_scaled(key)
  local stored = read('GET', key)
  if not stored then
    return 0
  end
  local used_scaled = parse_integer(stored, 0, MAX_SAFE_INTEGER)
  if not used_scaled then
    fail('MODERATO_STATE', 'key ' .. shown(key, 1024) .. ' holds ' .. shown(stored)
      .. ', not a decimal integer 0..9007199254740992')
  end
  return used_scaled
end

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

local function decide()
  local cost_scaled, apply, policies = parse_arguments(2, nil)
  local now_ms = redis_now_ms()
  local verdicts = {}
  for i = 1, #policies do
    verdicts[i] = evaluate(policies[i], cost_scaled, now_ms)
  end
  return conclude(verdicts, apply)
end

local ok, result = pcall(decide)
if ok then
  return result
end
if type(result) == 'table' and result.moderato_error then
  return redis.error_reply(result.moderato_error)
end
error(result, 0)
