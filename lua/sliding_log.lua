--[[ moderato: sliding log (exact rolling window) decision, atomic over 1..16 policies.

KEYS[i]  base key of policy i (distinct)
ARGV[1]  cost_scaled: decimal integer 0..2^53 (0 only when peeking)
ARGV[2]  "1" = decide and charge, "0" = peek (computes the same reply, writes nothing)
then per policy i, in KEYS order:
  ARGV[1 + 2i]  capacity_scaled  1..9007199254000
  ARGV[2 + 2i]  window_s         1..86400

State: key <base>:log, a sorted set with one member per admission, scored with its
instant in ms. The member is "<total>:<cost>": cost_scaled, and the running total of
costs through this entry since the log was last empty, zero-padded to 16 digits so
members of one instant sort by it. Usage is the sum of the costs in (now - W, now]:
  usage = newest total - (first total in the window - that entry's cost)
read from two entries, without summing. Admit iff usage + cost <= capacity.
  reset (allowed) = when the newest entry leaves the window (full recovery), or now
                    if the window is empty (a peek of cost 0 adds no entry)
  retry (denied)  = when enough of the oldest entries have left for the cost to fit:
                    a bisection over the running totals of the entries in the window
An admission trims the entries at or before now - W (ZREMRANGEBYSCORE), then adds
its own, stamped max(now, newest entry): a clock that stepped back never reorders the
log. A running total that would pass 2^53 renumbers the log from zero first (O(n),
at most once per 2^53 - capacity scaled units admitted). A peek or a denial trims
nothing: it reads as if trimmed.

Cost: O(log n) per decision, plus the trimmed entries on an admission and
O(log^2 n) for a denial's retry (n = entries in the log). Memory: one member
(about 30 bytes plus the sorted set's overhead) per admission in the window; the key
expires 1 s after its newest entry leaves the window. Entries are validated as read.

Reply: {allowed, deciding, then per policy remaining_scaled, retry_ms, reset_ms}.
A bad argument is "MODERATO_ARG ...", unusable stored state "MODERATO_STATE ...";
in both cases nothing has been written. docs/internals.md fixes the contract.
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

-- Sliding log.

local LOG_SUFFIX = ':log'
local MAX_STATE_TIME_MS = 4503599627370496 -- 2^52 ms: room to add a window below 2^53
local EXPIRY_MARGIN_MS = 1000
local TOTAL_DIGITS = 16
local RENUMBER_BATCH = 1000 -- members per ZADD when renumbering

local function member_text(total_scaled, cost_scaled)
  return string.format('%016d', total_scaled) .. ':' .. decimal(cost_scaled)
end

-- One entry from a member and its score: { at_ms, total, cost }.
local function parse_entry(key, member, score)
  local total_text, cost_text = string.match(member, '^(%d+):(%d+)$')
  local at_ms = parse_integer(score, 0, MAX_STATE_TIME_MS)
  local total = total_text and #total_text == TOTAL_DIGITS
    and parse_integer(total_text, 1, MAX_SAFE_INTEGER)
  local cost = cost_text and parse_integer(cost_text, 1, MAX_SAFE_INTEGER)
  if not at_ms or not total or not cost or cost > total then
    fail('MODERATO_STATE', 'log ' .. shown(key, 1024) .. ' holds member ' .. shown(member)
      .. ' at ' .. shown(score) .. ', not "<16-digit total>:<cost>" (1 <= cost <= total <= 2^53)'
      .. ' at an integer ms 0..' .. decimal(MAX_STATE_TIME_MS))
  end
  return { at_ms = at_ms, total = total, cost = cost }
end

-- The entry at a rank (0-based), or nil.
local function entry_at(key, rank)
  local found = read('ZRANGE', key, rank, rank, 'WITHSCORES')
  if not found[1] then
    return nil
  end
  return parse_entry(key, found[1], found[2])
end

local function evaluate(policy, cost_scaled, now_ms)
  local key = KEYS[policy.number] .. LOG_SUFFIX
  local capacity_scaled, window_ms = policy.capacity_scaled, policy.window_ms
  local cutoff_ms = now_ms - window_ms -- entries at or before it have left the window

  local newest = entry_at(key, -1)
  local first, first_rank, base_total = nil, nil, 0
  local usage_scaled = 0
  if newest and newest.at_ms > cutoff_ms then
    first_rank = read('ZCOUNT', key, '-inf', decimal(cutoff_ms))
    first = entry_at(key, first_rank)
    -- Everything up to the first entry in the window, in running-total terms.
    base_total = first.total - first.cost
    if newest.total < first.total then
      fail('MODERATO_STATE', 'log ' .. shown(key, 1024) .. ': the newest running total '
        .. decimal(newest.total) .. ' is below the oldest in the window, ' .. decimal(first.total))
    end
    usage_scaled = newest.total - base_total
  end
  local stamp_ms = now_ms
  if newest and newest.at_ms > now_ms then
    stamp_ms = newest.at_ms
  end

  local headroom_scaled = capacity_scaled - usage_scaled
  local verdict = {
    fits = cost_scaled <= headroom_scaled,
    permanent = cost_scaled > capacity_scaled,
    remaining_uncharged = math.max(0, headroom_scaled),
    remaining_charged = math.max(0, headroom_scaled - cost_scaled),
    reset_uncharged_ms = first and newest.at_ms + window_ms or now_ms,
  }
  -- Allowed: full recovery once the newest entry has left the window (a usage read, of
  -- cost 0, adds none).
  verdict.reset_charged_ms = verdict.reset_uncharged_ms
  if cost_scaled > 0 then
    verdict.reset_charged_ms = stamp_ms + window_ms
  end

  if not verdict.fits and not verdict.permanent then
    -- The first entry (by rank) whose leaving frees need: totals rise with rank, and the
    -- newest frees the whole usage, which is at least need.
    local need_scaled = cost_scaled - headroom_scaled
    local newest_rank = read('ZCARD', key) - 1
    local low, high = first_rank, newest_rank
    while low < high do
      local middle = floor_div(low + high, 2)
      if entry_at(key, middle).total - base_total >= need_scaled then
        high = middle
      else
        low = middle + 1
      end
    end
    local leaving = low == newest_rank and newest or entry_at(key, low)
    verdict.reset_denied_ms = leaving.at_ms + window_ms
    verdict.retry_ms = verdict.reset_denied_ms - now_ms
    return verdict
  end
  if not verdict.fits then
    return verdict
  end

  -- Admissible: prepare the write (read and checked now, before any policy writes).
  local total_scaled = first and newest.total + cost_scaled or cost_scaled
  local renumbered = nil
  if first and cost_scaled > MAX_SAFE_INTEGER - newest.total then
    -- The running total would pass 2^53: renumber the window's entries from zero.
    renumbered = {}
    local found = read('ZRANGEBYSCORE', key, '(' .. decimal(cutoff_ms), '+inf', 'WITHSCORES')
    for i = 1, #found, 2 do
      local entry = parse_entry(key, found[i], found[i + 1])
      if entry.total - entry.cost < base_total then
        fail('MODERATO_STATE', 'log ' .. shown(key, 1024) .. ': running totals do not rise')
      end
      renumbered[#renumbered + 1] = found[i + 1]
      renumbered[#renumbered + 1] = member_text(entry.total - base_total, entry.cost)
    end
    total_scaled = usage_scaled + cost_scaled
  end
  -- The first write of a script must be one Redis refuses when out of memory
  -- (ZADD is; ZREMRANGEBYSCORE and DEL are not): after a script's first write
  -- Redis lets the rest through, so trimming first would admit under OOM.
  verdict.write = function()
    if renumbered then
      -- Re-adding the newest entry as it is changes nothing but meets the OOM check.
      redis.call('ZADD', key, 'XX', decimal(newest.at_ms), member_text(newest.total, newest.cost))
      -- Only the window's entries are kept: this also trims.
      redis.call('DEL', key)
      for start = 1, #renumbered, 2 * RENUMBER_BATCH do
        redis.call('ZADD', key,
          unpack(renumbered, start, math.min(#renumbered, start + 2 * RENUMBER_BATCH - 1)))
      end
      redis.call('ZADD', key, decimal(stamp_ms), member_text(total_scaled, cost_scaled))
    else
      -- The new entry is stamped at or after now, so the trim below never removes it.
      redis.call('ZADD', key, decimal(stamp_ms), member_text(total_scaled, cost_scaled))
      redis.call('ZREMRANGEBYSCORE', key, '-inf', decimal(cutoff_ms))
    end
    -- Set on every write: this also repairs a log that lost its expiry.
    redis.call('PEXPIREAT', key, decimal(stamp_ms + window_ms + EXPIRY_MARGIN_MS))
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
