-- moderato: the part every decision script shares (argument checks, exact
-- integer division, the clock, reading stored integers, the reply).
--
-- Redis runs each script on its own and a script cannot import, so the
-- loader (moderato/scripts.py) splices this file in at a script's include
-- line; Redis only ever sees the whole, self-contained text.
--
-- Cost: Redis runs this whole text on every call, so each `local function`
-- below is a closure built per decision, each table literal an allocation,
-- each string.format a formatting pass, and each local a function uses an upvalue
-- Redis looks up when it builds the function. The success path therefore builds no
-- per-policy table, formats no string (Redis writes a Lua number argument as
-- %.17g, exact for every integer up to 2^53) and checks the arguments in one
-- pass; everything a refusal needs is built only on the way to one (refusals()).

-- The contract's numbers (csrc/contract.h, the one source; tests/unit/test_algorithms.py checks
-- every copy in the scripts against it, each named where it is written as a literal).
local MAX_SAFE_INTEGER = 9007199254740992 -- 2^53: every integer up to here is exact in a Lua number
local MAX_CAPACITY_SCALED = 9007199254000 -- capacity_scaled * 1000 (permille weights) stays <= 2^53
local MAX_WINDOW_S = 86400 -- a day: the direct contract's windows (and custom refill rates)
local MAX_POLICIES = 16
-- Room to add waits to a stored time and stay below 2^53: 2^52 ms (~142,000 years).
local MAX_STATE_TIME_MS = 4503599627370496

-- Refusals are raised as tables; the pcall in decide() turns them into error replies.
--#include replied.lua

local function fail(kind, message)
  error({ moderato_error = kind .. ' ' .. message }, 0)
end

-- floor(numerator / denominator) for integers 0 <= numerator <= 2^53, denominator >= 1.
-- fmod is exact, so numerator - remainder is an exact multiple and the division is exact;
-- plain '/' then floor could round a quotient just below an integer up to it.
local function floor_div(numerator, denominator)
  return (numerator - math.fmod(numerator, denominator)) / denominator
end

-- What a window's headroom leaves without and with a charge of cost_scaled, never below
-- zero (a lowered capacity can leave more used than the capacity).
local function remaining_scaled(headroom_scaled, cost_scaled)
  local charged_scaled = headroom_scaled - cost_scaled
  if charged_scaled >= 0 then
    return headroom_scaled, charged_scaled
  end
  return headroom_scaled > 0 and headroom_scaled or 0, 0
end

-- The value of a stored decimal integer string of 1..16 digits up to 2^53 (conversion is
-- exact there; `text + 0` converts as tonumber does, without its C call); nil for anything
-- else, which then takes refusals()' exact, slower route.
local function stored_integer(text)
  if type(text) == 'string' then
    local length = #text
    if (length < 16 or (length == 16 and text <= '9007199254740992')) -- MAX_SAFE_INTEGER
        and string.find(text, '^%d+$') then
      return text + 0
    end
  end
  return nil
end

-- Everything a refusal (or an unusual but valid input) needs: the full argument check
-- with its messages, exact parsing of any length, and the state refusals. Built only
-- when the cheap checks in the success path did not settle a case.
local function refusals()
  local R = {}

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
  R.shown = shown

  -- Integers are written with %d: tostring() of a large number gives "9.007199254e+15".
  local function decimal(integer)
    return string.format('%d', integer)
  end
  R.decimal = decimal

  -- The value of a decimal integer string if it lies in [low, high], else nil.
  -- Exact: anything longer than 2^53's digits is refused before tonumber can round it.
  local function parse_integer(text, low, high)
    if type(text) ~= 'string' or not string.find(text, '^%d+$') then
      return nil
    end
    local digits = string.gsub(text, '^0+', '')
    if #digits > 16 or (#digits == 16 and digits > decimal(MAX_SAFE_INTEGER)) then
      return nil
    end
    local value = tonumber('0' .. digits)
    if value < low or value > high then
      return nil
    end
    return value
  end
  R.parse_integer = parse_integer

  -- The long-window path (docs/internals.md, "Long windows"): a window above a day never
  -- passes arguments_fit, so it is checked here, up to ten 360-day years, and by its
  -- algorithm's rule for the range it keeps exact (named by decide()'s long_window).
  local MAX_LONG_WINDOW_S = 311040000
  local ACCRUAL_EXACT_WINDOW_MS = 94906266
  local GCRA_MAX_WINDOW_S = 3599627
  local long_window_rules = {
    -- Token and leaky bucket: past ACCRUAL_EXACT_WINDOW_MS, capacity <= 2^53 / window keeps
    -- capacity < window, so elapsed * (capacity mod window) <= 2^53 (accrual.lua).
    exact_accrual = function(policy_number, first, capacity, window)
      local largest_scaled = floor_div(MAX_SAFE_INTEGER, window * 1000)
      if window * 1000 > ACCRUAL_EXACT_WINDOW_MS and capacity > largest_scaled then
        fail('MODERATO_ARG', 'ARGV[' .. first .. '] (capacity_scaled of policy ' .. policy_number
          .. ') must be at most ' .. decimal(largest_scaled) .. ' for a window of ' .. decimal(window)
          .. ' s (accrual stays below 2^53), got ' .. decimal(capacity))
      end
    end,
    -- GCRA: times in µs reach now + 2 windows, below 2^53 until now_ms = 9e12 (2255).
    gcra_window = function(policy_number, first, capacity, window)
      if window > GCRA_MAX_WINDOW_S then
        fail('MODERATO_ARG', 'ARGV[' .. (first + 1) .. '] (window_s of policy ' .. policy_number
          .. ') must be at most ' .. GCRA_MAX_WINDOW_S .. ' for gcra (its microsecond times stay'
          .. ' below 2^53), got ' .. decimal(window))
      end
    end,
  }

  -- A burst (the buckets and GCRA take one): burst_scaled after a policy's own fields,
  -- what the bucket holds while it refills capacity_scaled per window. It must refill
  -- within a bound, counted in whole windows: ceil(burst / capacity) * window_s <= bound_s,
  -- i.e. burst <= floor(bound_s / window_s) * capacity (docs/internals.md, "Bursts").
  local burst_bounds_s = { bucket_burst = MAX_LONG_WINDOW_S, gcra_burst = GCRA_MAX_WINDOW_S }
  local function check_burst(policy_number, first, fields_per_policy, capacity, window, burst_rule)
    local burst_index = first + fields_per_policy
    local burst = parse_integer(ARGV[burst_index], 1, MAX_CAPACITY_SCALED)
    if not burst then
      fail('MODERATO_ARG', 'ARGV[' .. burst_index .. '] (burst_scaled of policy ' .. policy_number
        .. ') must be an integer 1..' .. decimal(MAX_CAPACITY_SCALED) .. ', got '
        .. shown(ARGV[burst_index]))
    end
    -- The token bucket's third field: a custom rate already sets its own capacity.
    if fields_per_policy == 3 and ARGV[first + 2] ~= '' then
      fail('MODERATO_ARG', 'ARGV[' .. (first + 2) .. '] (refill_scaled_per_s of policy '
        .. policy_number .. ') must be "" with a burst_scaled (a burst refills at the exact'
        .. ' public rate), got ' .. shown(ARGV[first + 2]))
    end
    local bound_s = burst_bounds_s[burst_rule]
    local whole_windows = floor_div(bound_s, window)
    local largest = MAX_CAPACITY_SCALED
    if whole_windows <= floor_div(MAX_CAPACITY_SCALED, capacity) then
      largest = whole_windows * capacity
    end
    if burst > largest then
      fail('MODERATO_ARG', 'ARGV[' .. burst_index .. '] (burst_scaled of policy ' .. policy_number
        .. ') must be at most ' .. decimal(largest) .. ' for capacity_scaled ' .. decimal(capacity)
        .. ' per ' .. decimal(window) .. ' s (a burst refills within ' .. bound_s
        .. ' s), got ' .. decimal(burst))
    end
  end

  -- The full check of KEYS and ARGV, raising the refusal that names what is wrong.
  -- parse_extra(policy_number, argv_index, capacity_scaled) checks an algorithm's fields
  -- after capacity and window; long_window names its rule above, if it has one, and
  -- burst_rule its burst bound, if it takes a burst. Returns the fields per policy: one
  -- more than its own when every policy carries a burst_scaled.
  function R.arguments(fields_per_policy, parse_extra, long_window, burst_rule)
    local policy_count = #KEYS
    if policy_count < 1 or policy_count > MAX_POLICIES then
      fail('MODERATO_ARG', 'expected 1..' .. MAX_POLICIES .. ' keys (one base key per policy), got '
        .. policy_count)
    end
    local expected_argc = 2 + fields_per_policy * policy_count
    local width = fields_per_policy
    if burst_rule and #ARGV == expected_argc + policy_count then
      width = fields_per_policy + 1
    elseif #ARGV ~= expected_argc then
      fail('MODERATO_ARG', 'expected ' .. expected_argc .. ' arguments for ' .. policy_count
        .. ' policies (cost_scaled, apply, then ' .. fields_per_policy .. ' per policy)'
        .. (burst_rule and ', or ' .. (expected_argc + policy_count) .. ' with burst_scaled' or '')
        .. ', got ' .. #ARGV)
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
    if not parse_integer(ARGV[1], apply and 1 or 0, MAX_SAFE_INTEGER) then
      fail('MODERATO_ARG', 'ARGV[1] (cost_scaled) must be an integer ' .. (apply and '1' or '0')
        .. '..' .. decimal(MAX_SAFE_INTEGER) .. (apply and ' when charging' or '') .. ', got '
        .. shown(ARGV[1]))
    end
    for i = 1, policy_count do
      local first = 3 + width * (i - 1)
      local capacity_scaled = parse_integer(ARGV[first], 1, MAX_CAPACITY_SCALED)
      if not capacity_scaled then
        fail('MODERATO_ARG', 'ARGV[' .. first .. '] (capacity_scaled of policy ' .. i
          .. ') must be an integer 1..' .. decimal(MAX_CAPACITY_SCALED) .. ', got ' .. shown(ARGV[first]))
      end
      local window = parse_integer(ARGV[first + 1], 1, MAX_LONG_WINDOW_S)
      if not window then
        fail('MODERATO_ARG', 'ARGV[' .. (first + 1) .. '] (window_s of policy ' .. i
          .. ') must be an integer 1..' .. MAX_LONG_WINDOW_S .. ', got ' .. shown(ARGV[first + 1]))
      end
      if parse_extra then
        parse_extra(R, i, first + 2, capacity_scaled)
      end
      if long_window and window > MAX_WINDOW_S then
        long_window_rules[long_window](i, first, capacity_scaled, window)
      end
      if width > fields_per_policy then
        check_burst(i, first, fields_per_policy, capacity_scaled, window, burst_rule)
      end
    end
    return width
  end

  -- A Redis read that turns an error (e.g. WRONGTYPE) into a state refusal.
  local function read(command, key, ...)
    local result = redis.pcall(command, key, ...)
    if type(result) == 'table' and result.err then
      fail('MODERATO_STATE', 'key ' .. shown(key, 1024) .. ' cannot be read: ' .. result.err)
    end
    return result
  end
  R.read = read

  -- A window counter (scaled units admitted in one window, a decimal string); 0 if missing.
  function R.counter(key)
    local stored = read('GET', key)
    if not stored then
      return 0
    end
    local used_scaled = parse_integer(stored, 0, MAX_SAFE_INTEGER)
    if not used_scaled then
      fail('MODERATO_STATE', 'key ' .. shown(key, 1024) .. ' holds ' .. shown(stored)
        .. ', not a decimal integer 0..' .. decimal(MAX_SAFE_INTEGER))
    end
    return used_scaled
  end

  -- A hash of decimal integer fields (names, each 0..highs[i]), as a table by name;
  -- nil for a missing key. Anything else stored there is a state refusal.
  function R.integer_hash(key, names, highs)
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
      values[i] = value
    end
    return values
  end

  return R
end

-- The arguments, checked in one pass with no string built but one: true when every
-- argument is a short decimal within its range (the common case). Anything else,
-- valid or not, is left to refusals().arguments, which names what is wrong.
-- An algorithm's third field (the token bucket's refill rate) fits when it is empty.
local function arguments_fit(fields_per_policy)
  local policy_count, argc = #KEYS, #ARGV
  -- The limits are literals here, each named on its line: each named local a function
  -- uses is one more upvalue to find when Redis builds it.
  if policy_count < 1 or policy_count > 16 -- MAX_POLICIES
      or argc ~= 2 + fields_per_policy * policy_count then
    return false
  end
  local cost_text, apply_text = ARGV[1], ARGV[2]
  if (apply_text ~= '1' and apply_text ~= '0') or #cost_text == 0 or #cost_text > 15 then
    return false
  end
  -- Every number argument non-empty and short, then all their digits checked by one
  -- pattern match (arithmetic alone would also take " 5", "1e3", "0x10", "nan"), and only
  -- then converted: by arithmetic, which (unlike tonumber, a C call) raises on a non-number.
  local digits = cost_text
  for first = 3, argc, fields_per_policy do
    local capacity_text, window_text = ARGV[first], ARGV[first + 1]
    local capacity_length, window_length = #capacity_text, #window_text
    if capacity_length == 0 or capacity_length > 13 or window_length == 0 or window_length > 5
        or (fields_per_policy == 3 and ARGV[first + 2] ~= '') then
      return false
    end
    digits = digits .. capacity_text .. window_text
  end
  if string.find(digits, '%D') or (apply_text == '1' and cost_text + 0 < 1) then
    return false
  end
  for first = 3, argc, fields_per_policy do
    local capacity_scaled, window_s = ARGV[first] + 0, ARGV[first + 1] + 0
    if capacity_scaled < 1 or capacity_scaled > 9007199254000 -- MAX_CAPACITY_SCALED
        or window_s < 1 or window_s > 86400 then -- MAX_WINDOW_S
      return false
    end
  end
  -- Distinct keys, pairwise (equal strings are one object in Lua: each test is a pointer
  -- comparison), with no table built.
  for i = 2, policy_count do
    local key = KEYS[i]
    for j = 1, i - 1 do
      if KEYS[j] == key then
        return false
      end
    end
  end
  return true
end

-- A window counter (scaled units admitted in one window, a decimal string); 0 if missing.
local function read_counter(key)
  local stored = redis.pcall('GET', key)
  if not stored then
    return 0
  end
  return stored_integer(stored) or refusals().counter(key)
end

-- The policy being evaluated (a scalar per field, not a table per policy): declared by
-- the script before this file (`local cost_scaled, capacity_scaled, window_s, window_ms`,
-- which its one-policy path uses too), set by the algorithm's evaluate(), read by its helpers.
-- And burst_scaled: what the bucket holds (the buckets and GCRA), its burst_scaled argument
-- when the call carries one (at burst_field past a policy's first field: decide() sets it),
-- else its capacity_scaled, which is then both what it holds and what refills per window.
local burst_scaled, burst_field

-- The arguments are valid: one decision at Redis's one instant (now_ms, read by the
-- script before this file, on its first lines). One policy (the common
-- case) needs no bookkeeping: it alone decides, and it is written at once. evaluate
-- returns fits, permanent, remaining_uncharged, remaining_charged, reset_charged_ms,
-- reset_uncharged_ms, retry_ms, reset_denied_ms, then up to six arguments of write().
local function decide_valid(fields_per_policy, evaluate, write)
  local cost_scaled = ARGV[1] + 0 -- digits only, checked above
  local apply = ARGV[2] == '1'
  if #KEYS > 1 then
    -- Several policies: every one evaluated on the state as read, then the reply, and the
    -- writes only when every policy admits and the caller is charging. (Inline, not a
    -- function of its own: a single policy would build that closure for nothing.)
    local policy_count = #KEYS
    local verdicts, writes = {}, {}
    local allowed = true
    for i = 1, policy_count do
      local fits, permanent, remaining_uncharged, remaining_charged, reset_charged_ms,
        reset_uncharged_ms, retry_ms, reset_denied_ms, w1, w2, w3, w4, w5, w6 =
        evaluate(i, 3 + fields_per_policy * (i - 1), cost_scaled, now_ms, true)
      local at = 8 * (i - 1)
      verdicts[at + 1], verdicts[at + 2], verdicts[at + 3], verdicts[at + 4] =
        fits, permanent, remaining_uncharged, remaining_charged
      verdicts[at + 5], verdicts[at + 6], verdicts[at + 7], verdicts[at + 8] =
        reset_charged_ms, reset_uncharged_ms, retry_ms, reset_denied_ms
      at = 6 * (i - 1)
      writes[at + 1], writes[at + 2], writes[at + 3], writes[at + 4], writes[at + 5], writes[at + 6] =
        w1, w2, w3, w4, w5, w6
      if not fits then
        allowed = false
      end
    end
    local reply = { allowed and 1 or 0, 0 }
    local deciding, deciding_remaining, deciding_retry = 0, nil, nil
    for i = 1, policy_count do
      local at = 8 * (i - 1)
      local remaining_scaled, retry_ms, reset_ms
      if verdicts[at + 2] then
        remaining_scaled, retry_ms, reset_ms = verdicts[at + 3], -1, -1
      elseif allowed then
        remaining_scaled, retry_ms, reset_ms = verdicts[at + 4], 0, verdicts[at + 5]
      elseif verdicts[at + 1] then
        remaining_scaled, retry_ms, reset_ms = verdicts[at + 3], 0, verdicts[at + 6]
      else
        remaining_scaled, retry_ms, reset_ms = verdicts[at + 3], verdicts[at + 7], verdicts[at + 8]
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
      for i = 1, policy_count do
        local at = 6 * (i - 1)
        write(writes[at + 1], writes[at + 2], writes[at + 3], writes[at + 4], writes[at + 5],
          writes[at + 6])
      end
    end
    return reply
  end
  local fits, permanent, remaining_uncharged, remaining_charged, reset_charged_ms, _,
    retry_ms, reset_denied_ms, w1, w2, w3, w4, w5, w6 = evaluate(1, 3, cost_scaled, now_ms, false)
  if permanent then
    return { 0, 0, remaining_uncharged, -1, -1 }
  end
  if fits then
    if apply then
      write(w1, w2, w3, w4, w5, w6)
    end
    return { 1, 0, remaining_charged, 0, reset_charged_ms }
  end
  return { 0, 0, remaining_uncharged, retry_ms, reset_denied_ms }
end

-- One decision, the whole of every script: the arguments checked (cheaply, or by
-- refusals() when something is unusual), then decided. evaluate(i, first_argv_index,
-- cost_scaled, now_ms, many) evaluates policy i (need_uncharged: several policies, so
-- the uncharged reset is needed too); write(...) applies an admitted policy's writes.
-- A refusal raised by fail() becomes the error reply the client maps; any other error
-- stays a script error. long_window names the algorithm's long-window rule, burst_rule
-- its burst bound if it takes a burst (refusals()); a call with a burst always takes
-- the full check.
local function decide(fields_per_policy, parse_extra, evaluate, write, long_window, burst_rule)
  local width = fields_per_policy
  if not arguments_fit(fields_per_policy) then
    local ok, refusal = pcall(function()
      width = refusals().arguments(fields_per_policy, parse_extra, long_window, burst_rule)
    end)
    if not ok then
      if type(refusal) == 'table' and refusal.moderato_error then
        return redis.error_reply(refusal.moderato_error)
      end
      error(refusal, 0)
    end
    if width > fields_per_policy then
      burst_field = fields_per_policy
    end
  end
  return replied(pcall(decide_valid, width, evaluate, write))
end
