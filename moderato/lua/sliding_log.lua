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

--#include prelude.lua

-- Sliding log.

local LOG_SUFFIX = ':log'
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

return decision_reply(2, nil, evaluate)
