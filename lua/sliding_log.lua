--[[ moderato: sliding log (exact rolling window) decision, atomic over 1..16 policies.

Called as every decision script (docs/internals.md fixes the contract): KEYS[i]
is policy i's base key; ARGV is cost_scaled, apply ("1" charge, "0" peek: the
same reply, nothing written), then capacity_scaled and window_s per policy. The
reply is {allowed, deciding, then remaining_scaled, retry_ms, reset_ms per policy};
a refusal, "MODERATO_ARG ..." or "MODERATO_STATE ...", writes nothing.

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
An admission adds its entry, stamped max(now, newest entry): a clock that stepped
back never reorders the log. Once per second of that stamp (the log was empty, or
its newest entry is from an earlier second) it also trims the entries at or before
now - W (ZREMRANGEBYSCORE) and sets the expiry, floor(stamp / 1 s) + 2 s + W: from
1 to 2 s after the newest entry leaves the window, the same for every stamp of one
second, so the admissions in between need neither command. A running total that
would pass 2^53 renumbers the log from zero first (O(n), at most once per
2^53 - capacity scaled units admitted; it trims and sets the expiry too). A peek or
a denial trims nothing: it reads as if trimmed.

Cost: O(log n) per decision, plus the trimmed entries once a second and
O(log^2 n) for a denial's retry (n = entries in the log: ZCOUNT, ZCARD and about
log2 n ZRANGEs by rank; a batched run's denials of one cost on the log as read, once).
Memory: one member
(about 30 bytes plus the sorted set's overhead) per admission in the window and in
up to one second before it. The key's window is fixed (the key names it): an
admission of another window within the second keeps the expiry it has. Entries
are validated as read.

]]

local FIELDS_PER_POLICY = 2
-- What the straight-line path's pieces hand on: the log's key (the key piece's), the cutoff,
-- its '%d' text and that text after '(' (the policy's piece's); the stamp of an admission
-- now, the expiry an admission sets (false: not due), the usage and the running total an
-- admission adds to (the read's, then as the checks decided leave them; usage nil: the
-- general path's); the first entry admitted and the rest (score, member, ...), for the
-- write. The reader of an entry of the usual shape (the policy's piece's). For a denial's
-- wait: the newest entry's score and the running total before the first entry in the
-- window (the read's); the cost of the run's last denial searched (nil: none, or its
-- search left it to the general path), whose decided_* scalars stand (see the decision).
local state_key, cutoff_ms, cutoff_text, open_cutoff_text, stamp_ms, expire_at_ms, usage_scaled,
  last_total_scaled, admitted_member, more_entries, usual_entry, newest_read_ms,
  base_total_scaled, denied_cost_scaled, stamp_text, stamp_text_of
--#include one_policy.lua

-- The common case, straight-line: one policy, charging, short decimal arguments within
-- range, and an admission with no renumbering, or a denial on the log as read, the entries
-- read short and well-formed. Anything else goes on to the general path below, nothing
-- written yet. The one function built reads an entry the general path's way, but only one
-- of the usual shape: 16-digit total, cost and score under 16 digits.
--
-- Split in pieces at its --#batch lines (lua/batch.lua): the policy's (the cutoff, the
-- reader of an entry), the key; the read (the newest
-- entry and the first in the window: the usage, the running total, the stamp); the
-- decision (an admission: its entry's member, from the running total the checks before
-- left); the write (the entries admitted, the trim and the expiry). Alone, each runs once,
-- with the commands the unsplit path ran. In a batch's run of checks on one log, the
-- entries admitted earlier in the run are all stamped alike (max(now, newest entry)) with
-- rising totals, above every entry read: the newest entry and the first in the window are
-- the read's or the run's own, so each check is decided on the locals as alone on the log
-- the checks before it wrote. The write adds the first entry admitted, then (due once per
-- second of the stamp, as alone: only a run's first admission can find it due) the trim
-- and the expiry, then the rest in one ZADD: the log never holds more entries than it
-- would alone, so its encoding (a listpack up to zset-max-listpack-entries) is the same.
if cost_scaled and cost_scaled <= capacity_scaled then
  window_ms = window_s * 1000
  cutoff_ms = now_ms - window_ms -- entries at or before it have left the window
  -- Numbers go to Redis as '%d' text: Redis would write a Lua number with '%.17g',
  -- a floating-point formatting several times as long (so would '..', with '%.14g').
  cutoff_text = string_format('%d', cutoff_ms)
  open_cutoff_text = '(' .. cutoff_text -- the first in the window is scored after it
  usual_entry = function(found)
    local member, score = found[1], found[2]
    if member and #score < 16 and string_find(score, '^%d+$') then
      -- (digits, then ':' and digits, the total's 16: a pattern of one class each matches
      -- in far fewer steps than one of 16)
      local total_text, cost_text = string.match(member, '^(%d+):(%d+)$')
      if total_text and #total_text == 16 and total_text <= '9007199254740992' -- MAX_SAFE_INTEGER
          and #cost_text < 16 then
        -- Digits only (checked): arithmetic reads them as tonumber would, with no call.
        local total, cost = total_text + 0, cost_text + 0
        if cost >= 1 and cost <= total then
          return score + 0, total, cost
        end
      end
    end
  end
--#batch key
  state_key = KEYS[1] .. ':log'
--#batch read
  -- Ranks and limits as text, as every number sent (see one_policy.lua): Redis formats a
  -- number argument with '%.17g', some 2,000 instructions each on Redis 7.0.
  local newest = redis_pcall('ZRANGE', state_key, '-1', '-1', 'WITHSCORES')
  local newest_at_ms, newest_total
  if not newest.err then
    newest_at_ms, newest_total = usual_entry(newest)
  end
  -- usage: the costs in the window, from the newest total and the first in the window; the
  -- running total restarts from 0 in an empty window.
  usage_scaled, last_total_scaled = 0, 0
  newest_read_ms = newest_at_ms
  if newest_at_ms and newest_at_ms > cutoff_ms then
    local first_at_ms, first_total, first_cost = usual_entry(redis_call('ZRANGE', state_key,
      open_cutoff_text, '+inf', 'BYSCORE', 'LIMIT', '0', '1', 'WITHSCORES'))
    if first_at_ms and newest_total >= first_total then
      base_total_scaled = first_total - first_cost
      usage_scaled, last_total_scaled = newest_total - base_total_scaled, newest_total
    else
      usage_scaled = nil
    end
  elseif not newest_at_ms and (newest.err or newest[1]) then
    usage_scaled = nil -- an entry of another shape, or a key of another type
  end
  -- Stamped max(now, newest entry): a clock that stepped back never reorders the log.
  stamp_ms = newest_at_ms and newest_at_ms > now_ms and newest_at_ms or now_ms
  -- The second of the stamp: trim and expiry once per second (see above), so due only
  -- when the log is empty or its newest entry is from an earlier second.
  local stamp_second_ms = stamp_ms - math.fmod(stamp_ms, 1000)
  expire_at_ms = (not newest_at_ms or newest_at_ms < stamp_second_ms)
    and stamp_second_ms + 2000 + window_ms
  admitted_member, more_entries, denied_cost_scaled = nil, nil, nil
--#batch decide
  -- Admitted when the cost fits the usage the checks before left, and the running total
  -- stays within 2^53 (compared by subtraction: the sum could round; past it, the general
  -- path renumbers the log).
  if usage_scaled and cost_scaled <= capacity_scaled - usage_scaled
      and cost_scaled <= 9007199254740992 - last_total_scaled then -- MAX_SAFE_INTEGER
    usage_scaled = usage_scaled + cost_scaled
    last_total_scaled = last_total_scaled + cost_scaled
    local member = string_format('%016d:%d', last_total_scaled, cost_scaled)
    -- The stamp the write adds entries at, as '%d' text, formatted when it differs from the
    -- last admission's (see one_policy.lua).
    if stamp_ms ~= stamp_text_of then
      stamp_text_of, stamp_text = stamp_ms, string_format('%d', stamp_ms)
    end
    if not admitted_member then
      admitted_member = member
    elseif more_entries then
      local count = #more_entries
      more_entries[count + 1], more_entries[count + 2] = more_entries[1], member
    else
      more_entries = { stamp_text, member }
    end
    decided_allowed = 1
    decided_remaining = capacity_scaled - usage_scaled
    decided_retry_ms = 0
    decided_reset_ms = stamp_ms + window_ms
  elseif usage_scaled and not admitted_member and cost_scaled > capacity_scaled - usage_scaled then
    -- A denial with nothing admitted before it in the run, so the log holds what was read
    -- (a denial writes nothing): its wait is the general path's search over the log's
    -- ranks, with its commands (those reads the general path would repeat aside) and on
    -- entries of the usual shape only (any other: the general path, which reads it
    -- exactly or refuses it). The cost is at most the capacity (checked above), so the
    -- denial is not permanent, and the whole usage (the newest entry's leaving) frees
    -- need. A denial of the same cost again in the run has the same reply: searched once.
    if cost_scaled ~= denied_cost_scaled then
      local headroom_scaled = capacity_scaled - usage_scaled
      local need_scaled = cost_scaled - headroom_scaled
      local low = redis_call('ZCOUNT', state_key, '-inf', cutoff_text)
      local high = redis_call('ZCARD', state_key) - 1
      local leaving_at_ms = newest_read_ms -- the entry at rank high's
      while low < high do
        local middle = (low + high - (low + high) % 2) / 2
        local rank_text = string_format('%d', middle)
        local at_ms, total = usual_entry(
          redis_call('ZRANGE', state_key, rank_text, rank_text, 'WITHSCORES'))
        if not at_ms then
          leaving_at_ms = nil
          break
        elseif total - base_total_scaled >= need_scaled then
          high, leaving_at_ms = middle, at_ms
        else
          low = middle + 1
        end
      end
      denied_cost_scaled = nil
      if leaving_at_ms then
        denied_cost_scaled = cost_scaled
        decided_remaining = headroom_scaled > 0 and headroom_scaled or 0
        decided_retry_ms = leaving_at_ms + window_ms - now_ms
        decided_reset_ms = leaving_at_ms + window_ms
      end
    end
    -- Searched again only for another cost: one searched before in the run is its last
    -- denial (nothing admitted in the run, and a search since for another cost is the last
    -- or ended the run), so its decided_* scalars stand.
    if denied_cost_scaled then
      decided_allowed = 0
    end
  end
--#batch write
  if admitted_member then
    -- ZADD first: the write Redis refuses when out of memory (see write() below).
    redis_call('ZADD', state_key, stamp_text, admitted_member)
    if expire_at_ms then
      redis_call('ZREMRANGEBYSCORE', state_key, '-inf', cutoff_text)
--#include expiry_text.lua
      redis_call('PEXPIREAT', state_key, expiry_text)
    end
    if more_entries then
      redis_call('ZADD', state_key, unpack(more_entries))
    end
  end
--#batch end
--#include decided_reply.lua
end

--#batch shared
--#include prelude.lua

-- Sliding log.

local LOG_SUFFIX = ':log'
local LOG_TOTAL_DIGITS = 16
local RENUMBER_BATCH = 1000 -- members per ZADD when renumbering

local function member_text(total_scaled, cost_scaled)
  return string.format('%016d:%d', total_scaled, cost_scaled)
end

-- One entry from a member and its score: at_ms, total, cost.
local function parse_entry(key, member, score)
  local total_text, cost_text = string.match(member, '^(%d+):(%d+)$')
  local at_ms = stored_integer(score)
  local total = total_text and #total_text == LOG_TOTAL_DIGITS and stored_integer(total_text)
  local cost = stored_integer(cost_text)
  if at_ms and total and cost and at_ms <= MAX_STATE_TIME_MS and total >= 1 and cost >= 1
      and cost <= total then
    return at_ms, total, cost
  end
  -- Anything unusual: the exact reading, which refuses an unusable entry.
  local R = refusals()
  at_ms = R.parse_integer(score, 0, MAX_STATE_TIME_MS)
  total = total_text and #total_text == LOG_TOTAL_DIGITS and R.parse_integer(total_text, 1, MAX_SAFE_INTEGER)
  cost = cost_text and R.parse_integer(cost_text, 1, MAX_SAFE_INTEGER)
  if not at_ms or not total or not cost or cost > total then
    fail('MODERATO_STATE', 'log ' .. R.shown(key, 1024) .. ' holds member ' .. R.shown(member)
      .. ' at ' .. R.shown(score) .. ', not "<16-digit total>:<cost>" (1 <= cost <= total <= 2^53)'
      .. ' at an integer ms 0..' .. R.decimal(MAX_STATE_TIME_MS))
  end
  return at_ms, total, cost
end

-- A ZRANGE reply's first entry (at_ms, total, cost), or nil; a read error is a state refusal.
local function first_entry(key, found)
  if found.err then
    refusals().read('ZRANGE', key, 0, 0)
  end
  if not found[1] then
    return nil
  end
  return parse_entry(key, found[1], found[2])
end

-- The entry at a rank (0-based), or nil.
local function entry_at(key, rank)
  local rank_text = string.format('%d', rank)
  return first_entry(key, redis.pcall('ZRANGE', key, rank_text, rank_text, 'WITHSCORES'))
end

local function evaluate(i, first, cost_scaled, now_ms)
  capacity_scaled, window_s = tonumber(ARGV[first]), tonumber(ARGV[first + 1])
  window_ms = window_s * 1000
  local key = KEYS[i] .. LOG_SUFFIX
  local cutoff_ms = now_ms - window_ms -- entries at or before it have left the window

  local newest_at_ms, newest_total, newest_cost = entry_at(key, -1)
  local first_at_ms, first_total, first_cost
  local base_total, usage_scaled = 0, 0
  if newest_at_ms and newest_at_ms > cutoff_ms then
    -- The first entry in the window, by rank: the first scored after the cutoff.
    first_at_ms, first_total, first_cost = first_entry(key,
      redis.pcall('ZRANGE', key, string.format('(%d', cutoff_ms), '+inf', 'BYSCORE', 'LIMIT', '0', '1',
        'WITHSCORES'))
    -- Everything up to the first entry in the window, in running-total terms.
    base_total = first_total - first_cost
    if newest_total < first_total then
      local R = refusals()
      fail('MODERATO_STATE', 'log ' .. R.shown(key, 1024) .. ': the newest running total '
        .. R.decimal(newest_total) .. ' is below the oldest in the window, ' .. R.decimal(first_total))
    end
    usage_scaled = newest_total - base_total
  end
  local stamp_ms = now_ms
  if newest_at_ms and newest_at_ms > now_ms then
    stamp_ms = newest_at_ms
  end

  local headroom_scaled = capacity_scaled - usage_scaled
  local fits = cost_scaled <= headroom_scaled
  local permanent = cost_scaled > capacity_scaled
  local remaining_uncharged, remaining_charged = remaining_scaled(headroom_scaled, cost_scaled)
  -- Allowed: full recovery once the newest entry has left the window (a usage read, of
  -- cost 0, adds none).
  local reset_uncharged_ms = first_at_ms and newest_at_ms + window_ms or now_ms
  local reset_charged_ms = reset_uncharged_ms
  if cost_scaled > 0 then
    reset_charged_ms = stamp_ms + window_ms
  end

  if not fits then
    if permanent then
      return false, true, remaining_uncharged, remaining_charged, reset_charged_ms,
        reset_uncharged_ms
    end
    -- The first entry (by rank) whose leaving frees need: totals rise with rank, and the
    -- newest frees the whole usage, which is at least need.
    local need_scaled = cost_scaled - headroom_scaled
    local low = redis.call('ZCOUNT', key, '-inf', string.format('%d', cutoff_ms))
    local newest_rank = redis.call('ZCARD', key) - 1
    local high = newest_rank
    while low < high do
      local middle = floor_div(low + high, 2)
      local _, total = entry_at(key, middle)
      if total - base_total >= need_scaled then
        high = middle
      else
        low = middle + 1
      end
    end
    local leaving_at_ms = newest_at_ms
    if low ~= newest_rank then
      leaving_at_ms = entry_at(key, low)
    end
    local reset_denied_ms = leaving_at_ms + window_ms
    return false, false, remaining_uncharged, remaining_charged, reset_charged_ms,
      reset_uncharged_ms, reset_denied_ms - now_ms, reset_denied_ms
  end

  -- Admissible: prepare the write (read and checked now, before any policy writes).
  local total_scaled = first_at_ms and newest_total + cost_scaled or cost_scaled
  local renumbered = false
  if first_at_ms and cost_scaled > MAX_SAFE_INTEGER - newest_total then
    -- The running total would pass 2^53: renumber the window's entries from zero.
    renumbered = { member_text(newest_total, newest_cost) }
    local found = redis.call('ZRANGEBYSCORE', key, string.format('(%d', cutoff_ms), '+inf', 'WITHSCORES')
    for j = 1, #found, 2 do
      local _, total, cost = parse_entry(key, found[j], found[j + 1])
      if total - cost < base_total then
        fail('MODERATO_STATE', 'log ' .. refusals().shown(key, 1024) .. ': running totals do not rise')
      end
      renumbered[#renumbered + 1] = found[j + 1]
      renumbered[#renumbered + 1] = member_text(total - base_total, cost)
    end
    total_scaled = usage_scaled + cost_scaled
  end
  -- Trim and expiry once per second of the stamp (see the top), and when renumbering.
  local stamp_second_ms = floor_div(stamp_ms, 1000) * 1000
  local expire_at_ms = false
  if renumbered or not newest_at_ms or newest_at_ms < stamp_second_ms then
    expire_at_ms = stamp_second_ms + 2000 + window_ms
  end
  return true, false, remaining_uncharged, remaining_charged, reset_charged_ms,
    reset_uncharged_ms, nil, nil,
    key, stamp_ms, member_text(total_scaled, cost_scaled), renumbered,
    renumbered and newest_at_ms or cutoff_ms, expire_at_ms
end

-- The first write of a script must be one Redis refuses when out of memory
-- (ZADD is; ZREMRANGEBYSCORE and DEL are not): after a script's first write
-- Redis lets the rest through, so trimming first would admit under OOM.
-- renumbered: false, or the newest entry's member then the window's renumbered
-- entries (score, member, ...); cutoff_or_newest_ms: the trim's cutoff, or (renumbering)
-- the newest entry's score; expire_at_ms: false when neither trim nor expiry is due.
local function write(key, stamp_ms, member, renumbered, cutoff_or_newest_ms, expire_at_ms)
  if renumbered then
    -- Re-adding the newest entry as it is changes nothing but meets the OOM check.
    redis.call('ZADD', key, 'XX', string.format('%d', cutoff_or_newest_ms), renumbered[1])
    -- Only the window's entries are kept: this also trims.
    redis.call('DEL', key)
    for start = 2, #renumbered, 2 * RENUMBER_BATCH do
      redis.call('ZADD', key,
        unpack(renumbered, start, math.min(#renumbered, start + 2 * RENUMBER_BATCH - 1)))
    end
    redis.call('ZADD', key, string.format('%d', stamp_ms), member)
  else
    -- The new entry is stamped at or after now, so the trim below never removes it.
    redis.call('ZADD', key, string.format('%d', stamp_ms), member)
    if not expire_at_ms then
      return
    end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', cutoff_or_newest_ms))
  end
  -- Once a second: this also repairs a log that lost its expiry.
  redis.call('PEXPIREAT', key, string.format('%d', expire_at_ms))
end

return decide(2, nil, evaluate, write)
