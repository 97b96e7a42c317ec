-- moderato: the part every decision script shares (argument checks, exact
-- integer division, the clock, the reply builder).
--
-- Redis runs each script on its own and a script cannot import, so the
-- loader (moderato/scripts.py) splices this file in at a script's include
-- line; Redis only ever sees the whole, self-contained text.

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

-- A window counter (scaled units admitted in one window, a decimal string); 0 if missing.
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

-- Room to add waits to a stored time and stay below 2^53: 2^52 ms (~142,000 years).
local MAX_STATE_TIME_MS = 4503599627370496

-- A hash of decimal integer fields (names, each 0..highs[i]), as a table by name;
-- nil for a missing key. Anything else stored there is a state refusal.
local function read_integer_hash(key, names, highs)
  local fields = read('HMGET', key, unpack(names))
  local present = false
  for i = 1, #names do
    present = present or fields[i] ~= false
  end
  if not present then
    if read('EXISTS', key) == 1 then
      fail('MODERATO_STATE', 'key ' .. shown(key, 1024) .. ' holds a hash without '
        .. table.concat(names, ', ', 1, #names - 1) .. ' and ' .. names[#names])
    end
    return nil
  end
  local values = {}
  for i = 1, #names do
    local value = fields[i] and parse_integer(fields[i], 0, highs[i])
    if not value then
      fail('MODERATO_STATE', 'field ' .. names[i] .. ' of key ' .. shown(key, 1024) .. ' is '
        .. (fields[i] and shown(fields[i]) or 'missing')
        .. ', not a decimal integer 0..' .. decimal(highs[i]))
    end
    values[names[i]] = value
  end
  return values
end

-- Accrual at exactly one capacity per window (the token bucket's credit, the leaky
-- bucket's drain): split_per_ms once per policy, then
-- linear_accrual_scaled(elapsed) = floor(elapsed_ms * capacity / window) for
-- 0 <= elapsed_ms <= window. The product can pass 2^53, so capacity =
-- per_ms_whole * window + per_ms_rest is split: elapsed * per_ms_whole <= capacity,
-- elapsed * per_ms_rest < window^2 <= 86,400,000^2 < 2^53.
local function split_per_ms(policy)
  policy.per_ms_whole = floor_div(policy.capacity_scaled, policy.window_ms)
  policy.per_ms_rest = policy.capacity_scaled - policy.per_ms_whole * policy.window_ms
end

local function linear_accrual_scaled(policy, elapsed_ms)
  return elapsed_ms * policy.per_ms_whole
    + floor_div(elapsed_ms * policy.per_ms_rest, policy.window_ms)
end

-- The smallest elapsed_ms in [0, window] accruing at least target_scaled
-- (0 <= target_scaled <= capacity). The float estimate of ceil(target * window / capacity)
-- is off by at most one; the exact accrual settles it.
local function elapsed_for_accrual_ms(policy, target_scaled)
  local window_ms = policy.window_ms
  local elapsed_ms = math.ceil(target_scaled / policy.capacity_scaled * window_ms)
  elapsed_ms = math.max(0, math.min(window_ms, elapsed_ms))
  while elapsed_ms < window_ms and linear_accrual_scaled(policy, elapsed_ms) < target_scaled do
    elapsed_ms = elapsed_ms + 1
  end
  while elapsed_ms > 0 and linear_accrual_scaled(policy, elapsed_ms - 1) >= target_scaled do
    elapsed_ms = elapsed_ms - 1
  end
  return elapsed_ms
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

-- One decision, the whole of every script: the arguments checked, every policy
-- evaluated at Redis's one instant (evaluate(policy, cost_scaled, now_ms) returns
-- its verdict), then concluded. A refusal raised by fail() becomes the error reply
-- the client maps; any other error stays a script error.
local function decision_reply(fields_per_policy, parse_extra, evaluate)
  local ok, result = pcall(function()
    local cost_scaled, apply, policies = parse_arguments(fields_per_policy, parse_extra)
    local now_ms = redis_now_ms()
    local verdicts = {}
    for i = 1, #policies do
      verdicts[i] = evaluate(policies[i], cost_scaled, now_ms)
    end
    return conclude(verdicts, apply)
  end)
  if ok then
    return result
  end
  if type(result) == 'table' and result.moderato_error then
    return redis.error_reply(result.moderato_error)
  end
  error(result, 0)
end
