-- moderato: exact linear accrual, shared by the token bucket (credit) and the leaky
-- bucket (drain): their one-policy straight-line path, then the functions of their general
-- paths. Spliced in (see moderato/scripts.py) after one_policy.lua (the clock, the policy
-- scalars) and the script's bucket constants (below), before prelude.lua, so it uses
-- nothing of prelude.lua.
--
-- The script sets first: BUCKET_SUFFIX (its state key's suffix), AMOUNT_FIELD and
-- ACCRUED_FIELD (its hash's amount and accrued-since-base fields) and AMOUNT_IS_LEVEL (the
-- leaky bucket stores the level, the token bucket the tokens = capacity - level), and
-- declares the locals the pieces below hand on (ACCRUAL_STATE in both scripts; denial: true
-- when the run has denied, its last denial for denied_cost_scaled at denied_deficit_scaled,
-- answering the same check again without the search).
--
-- Accrual at exactly one capacity per window: accrued(elapsed_ms) = floor(elapsed_ms * C / W)
-- for 0 <= elapsed_ms <= W. The product can pass 2^53, so C = per_ms_whole * W + per_ms_rest
-- is split: elapsed * per_ms_whole <= C, elapsed * per_ms_rest < W^2 <= 86,400,000^2 < 2^53
-- (a longer window takes a capacity below 2^53 / W, checked with the arguments: then
-- per_ms_rest = C). For integers 0 <= n < 2^53 and d >= 1, n % d is exact (Lua's
-- n - floor(n / d) * d: the quotient rounds across an integer only from n >= 2^53 on), as
-- math.fmod is, without a function call.

-- The common case, straight-line (no function is built: Redis would build each one on
-- every call): one policy, charging, the exact public rate, short decimal arguments
-- within range, a cost within the capacity, a bucket of the usual shape (or none) within a
-- window of its base (or two or more windows past it: full): admitted or denied here.
-- Anything else goes on to the general path, nothing written yet; the integers are the
-- general path's (the token bucket's refill(), the leaky bucket's drain(),
-- accrued_at_ms()). In level terms: deficit_scaled is what the accrual makes up (the
-- level; capacity - tokens).
--
-- Split in pieces at its --#batch lines (lua/batch.lua): the policy's (the accrual's split,
-- before the key); the key; the read (the hash, brought up to now: deficit_scaled, base_ms,
-- accrued_scaled, or deficit_scaled nil for the general path); the decision (an admission within what the bucket holds: the new
-- deficit, the hash's amount and expiry to write, the reply; a denial: its reply, the
-- deficit as it was, as a denial charges nothing); the write (the hash and its expiry,
-- when a check was admitted). Brought up to now again at the same instant, a bucket an
-- admission wrote reads as written, so a run's checks are decided on the locals as each
-- alone on the hash the one before wrote.
if cost_scaled and cost_scaled <= capacity_scaled then
  window_ms = window_s * 1000
  per_ms_rest = capacity_scaled % window_ms
  per_ms_whole = (capacity_scaled - per_ms_rest) / window_ms
  searched_target_scaled = nil -- another policy: the search's last answer stands no more
--#batch key
  state_key = KEYS[1] .. BUCKET_SUFFIX
--#batch read
  local fields = redis_pcall('HMGET', state_key, AMOUNT_FIELD, 'base', ACCRUED_FIELD)
  local amount_text, base_text, accrued_text = fields[1], fields[2], fields[3]
  read_fields = fields -- what the write leaves as it is
  -- deficit, base and accrued brought up to now; deficit nil: the general path's case.
  deficit_scaled = nil
  -- Each field a decimal of 1 to 15 digits (below 2^53, base below 2^52), each checked on
  -- its own (no text is built for one pattern). The amount this call last wrote (its '%d'
  -- text, of a number in range: over many identities, the amount every bucket refilled in
  -- full before one admission holds) and accrued's '0' are such decimals, their numbers
  -- known: no pattern, no conversion.
  local amount_scaled, read_base_ms, read_accrued_scaled
  if amount_text == written_amount_text then
    amount_scaled = written_amount_of
  elseif amount_text and #amount_text < 16 and string_find(amount_text, '^%d+$') then
    amount_scaled = amount_text + 0
  end
  if base_text and #base_text < 16 and string_find(base_text, '^%d+$') then
    read_base_ms = base_text + 0
  end
  if accrued_text == '0' then
    read_accrued_scaled = 0
  elseif accrued_text and #accrued_text < 16 and string_find(accrued_text, '^%d+$') then
    read_accrued_scaled = accrued_text + 0
  end
  if amount_scaled and read_base_ms and read_accrued_scaled then
    base_ms, accrued_scaled = read_base_ms, read_accrued_scaled
    -- A lowered capacity caps what is stored.
    if amount_scaled > capacity_scaled then
      amount_scaled = capacity_scaled
    end
    deficit_scaled = AMOUNT_IS_LEVEL and amount_scaled or capacity_scaled - amount_scaled
    -- A base ahead of the clock (Redis's clock stepped back): no time has passed yet.
    local now_eff_ms = now_ms > base_ms and now_ms or base_ms
    local elapsed_ms = now_eff_ms - base_ms
    if accrued_scaled >= capacity_scaled or (elapsed_ms >= window_ms and elapsed_ms < 2 * window_ms) then
      -- State no consistent history leaves, or a rebase by one window: the general path.
      deficit_scaled = nil
    elseif elapsed_ms < window_ms then
      local rest_product = elapsed_ms * per_ms_rest
      local due_scaled = elapsed_ms * per_ms_whole + (rest_product - rest_product % window_ms) / window_ms
      if due_scaled < accrued_scaled then
        deficit_scaled = nil -- accrued above what is due: the general path restarts it
      elseif due_scaled - accrued_scaled < deficit_scaled then
        deficit_scaled, accrued_scaled = deficit_scaled - (due_scaled - accrued_scaled), due_scaled
      else
        -- Made up in full: the accrual restarts now, idle fractions discarded.
        deficit_scaled, base_ms, accrued_scaled = 0, now_eff_ms, 0
      end
    else
      deficit_scaled, base_ms, accrued_scaled = 0, now_eff_ms, 0 -- two windows or more: made up
    end
  elseif not fields.err and not amount_text and not base_text and not accrued_text
      and redis_call('EXISTS', state_key) == 0 then
    deficit_scaled, base_ms, accrued_scaled = 0, now_ms, 0 -- a missing bucket is full (empty)
  end
  read_deficit_scaled, denial = deficit_scaled, nil
--#batch decide
  if not deficit_scaled then
    decided_allowed = nil -- the general path decides
  elseif denial and cost_scaled == denied_cost_scaled and deficit_scaled == denied_deficit_scaled then
    -- The run's denial before, of this cost on the same bucket: the same. Nothing since
    -- changed the decided_* scalars it left (an admission would have charged the bucket,
    -- another denial would be the run's last), so only allowed is set again.
    decided_allowed = 0
  else
    -- Admitted when the deficit, this cost included, stays within the capacity: reset when
    -- that has been made up (accrued_at_ms()). Else denied, nothing charged: reset when
    -- what does not fit has been made up, the general path's wait (accrued_at_ms() of
    -- deficit + cost - capacity, which is 1..cost). Either wait is 1..capacity units: the
    -- same search.
    local need_scaled = deficit_scaled + cost_scaled
    local wait_scaled = need_scaled
    if need_scaled > capacity_scaled then
      wait_scaled = need_scaled - capacity_scaled
    end
    local left_in_window_scaled = capacity_scaled - accrued_scaled
    local reset_ms, target_scaled = base_ms, accrued_scaled + wait_scaled
    if wait_scaled > left_in_window_scaled then
      reset_ms = base_ms + window_ms
      target_scaled = wait_scaled - left_in_window_scaled
    end
    -- The smallest elapsed in [0, W] accruing target: ceil(target * W / C). The float
    -- estimate is within 1e-8 of it (below 2^27), so its ceiling is off by one at most,
    -- which one exact accrual, at the estimate or just before it, settles. The last
    -- target searched and its answer are kept (searched_*; the policy's piece forgets
    -- them): over many identities every bucket refilled in full asks for the same
    -- target, the cost, so a batched call searches once.
    local elapsed_ms = searched_elapsed_ms
    if target_scaled ~= searched_target_scaled then
      local estimate_ms = target_scaled / capacity_scaled * window_ms
      elapsed_ms = estimate_ms - estimate_ms % 1
      if elapsed_ms < estimate_ms then
        elapsed_ms = elapsed_ms + 1
      end
      if elapsed_ms > window_ms then
        elapsed_ms = window_ms
      end
      local rest_product = elapsed_ms * per_ms_rest
      if elapsed_ms * per_ms_whole + (rest_product - rest_product % window_ms) / window_ms < target_scaled then
        elapsed_ms = elapsed_ms + 1
      elseif elapsed_ms > 0 then
        rest_product = rest_product - per_ms_rest
        if (elapsed_ms - 1) * per_ms_whole + (rest_product - rest_product % window_ms) / window_ms
            >= target_scaled then
          elapsed_ms = elapsed_ms - 1
        end
      end
      searched_target_scaled, searched_elapsed_ms = target_scaled, elapsed_ms
    end
    reset_ms = reset_ms + elapsed_ms
    if need_scaled > capacity_scaled then
      -- What the bucket holds now (the tokens, or the room above the level) and the wait.
      decided_allowed = 0
      decided_remaining = capacity_scaled - deficit_scaled
      decided_retry_ms = reset_ms - now_ms
      decided_reset_ms = reset_ms
      denial = true
      denied_cost_scaled = cost_scaled
      denied_deficit_scaled = deficit_scaled
    else
      deficit_scaled = need_scaled
      if AMOUNT_IS_LEVEL then
        -- DRAINED_EXPIRY_MARGIN_MS past drained (leaky_bucket.lua)
        written_amount_scaled = need_scaled
        expire_at_ms = reset_ms + 1000
      else
        -- A full refill, twice: BUCKET_EXPIRY_MARGIN_MS (token_bucket.lua).
        written_amount_scaled = capacity_scaled - need_scaled
        expire_at_ms = now_ms + 2 * window_ms + 60000 -- BUCKET_EXPIRY_MARGIN_MS
      end
      decided_allowed = 1
      decided_remaining = capacity_scaled - need_scaled
      decided_retry_ms = 0
      decided_reset_ms = reset_ms
    end
  end
--#batch write
  if deficit_scaled ~= read_deficit_scaled then
    -- Each number as '%d' text, formatted when it differs from the last write's (see
    -- one_policy.lua); an accrual restarting now stores 0, a literal.
    if written_amount_scaled ~= written_amount_of then
      written_amount_of, written_amount_text =
        written_amount_scaled, string_format('%d', written_amount_scaled)
    end
    if base_ms ~= written_base_of then
      written_base_of, written_base_text = base_ms, string_format('%d', base_ms)
    end
--#include expiry_text.lua
    local accrued_text = accrued_scaled == 0 and '0' or string_format('%d', accrued_scaled)
    -- A field whose text is the one read is left as it is: the same hash, fewer fields for
    -- Redis to set (a bucket refilled in full, over many identities, writes base alone; a
    -- hot one admitting within the same millisecond, the amount alone). A missing bucket
    -- read false in each field: it is written whole.
    if written_amount_text == read_fields[1] then
      if written_base_text == read_fields[2] then
        redis_call('HSET', state_key, ACCRUED_FIELD, accrued_text)
      elseif accrued_text == read_fields[3] then
        redis_call('HSET', state_key, 'base', written_base_text)
      else
        redis_call('HSET', state_key, 'base', written_base_text, ACCRUED_FIELD, accrued_text)
      end
    elseif written_base_text == read_fields[2] then
      if accrued_text == read_fields[3] then
        redis_call('HSET', state_key, AMOUNT_FIELD, written_amount_text)
      else
        redis_call('HSET', state_key, AMOUNT_FIELD, written_amount_text, ACCRUED_FIELD, accrued_text)
      end
    elseif accrued_text == read_fields[3] then
      redis_call('HSET', state_key, AMOUNT_FIELD, written_amount_text, 'base', written_base_text)
    else
      redis_call('HSET', state_key, AMOUNT_FIELD, written_amount_text, 'base', written_base_text,
        ACCRUED_FIELD, accrued_text)
    end
    -- Set on every write: this also repairs a bucket that lost its expiry.
    redis_call('PEXPIREAT', state_key, expiry_text)
  end
--#batch end
--#include decided_reply.lua
end

--#batch shared

-- The general path's accrual: split_per_ms once per policy, then
-- linear_accrual_scaled(elapsed) = accrued(elapsed) as above.
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

-- The instant at which need_scaled more units have accrued, given accrued_scaled accrued
-- since base_ms (need_scaled <= what the bucket holds: with a burst, several windows'
-- accrual). accrued + need can pass 2^53: compare through the headroom left in this
-- window; past it, whole windows of capacity each, then the rest (1..capacity) in the last.
local function accrued_at_ms(base_ms, accrued_scaled, need_scaled)
  local left_in_window_scaled = capacity_scaled - accrued_scaled
  if need_scaled <= left_in_window_scaled then
    return base_ms + elapsed_for_accrual_ms(accrued_scaled + need_scaled)
  end
  local beyond_scaled = need_scaled - left_in_window_scaled
  local more_windows = 0
  if beyond_scaled > capacity_scaled then -- a burst: more than one window's accrual
    more_windows = (beyond_scaled - 1 - math.fmod(beyond_scaled - 1, capacity_scaled)) / capacity_scaled
    beyond_scaled = beyond_scaled - more_windows * capacity_scaled
  end
  return base_ms + (1 + more_windows) * window_ms + elapsed_for_accrual_ms(beyond_scaled)
end
