-- moderato: what every decision script does first, spliced in at its top (see
-- moderato/scripts.py) after `local FIELDS_PER_POLICY = <n>`: read Redis's clock, declare
-- the policy's scalars, and check the arguments of a one-policy charging call for the
-- script's straight-line path. No function is built.

-- The C functions the straight-line pieces call, as locals: each use is then one
-- register read, where `redis.call` is a global's lookup and a field's on every call
-- (a batched call makes several per check).
local redis_call, redis_pcall, string_find, string_format =
  redis.call, redis.pcall, string.find, string.format

-- Redis's clock in milliseconds, read once, first: the only time source, so every
-- policy sees the same instant. (TIME touches no key: a refusal still writes nothing.)
local time = redis.call('TIME')
local time_us = time[2] + 0 -- arithmetic converts: cheaper than tonumber (a C call)
local now_ms = time[1] * 1000 + (time_us - time_us % 1000) / 1000

-- The numbers a straight-line path writes go to Redis as '%d' text (Redis would write a
-- Lua number with '%.17g', a floating-point formatting several times as long), each write
-- keeping the last text it formatted and the number it stands for (*_of): a batch's checks
-- write the same few numbers again and again (an expiry, the instant, a bucket refilled
-- since its last check), formatted once. The expiry's, for every script (expiry_text.lua
-- updates it):
local expiry_text, expiry_text_of

-- A straight-line decision, as the path's decide piece leaves it: allowed (1 or 0; nil: not
-- decided there, the general path decides), remaining_scaled, retry_ms and reset_ms (its
-- deciding is 0). Scalars, no table: the script alone builds its reply from them once,
-- after its pieces; a batched script's driver (lua/batch.lua) reads them per check.
local decided_allowed, decided_remaining, decided_retry_ms, decided_reset_ms

-- The policy's scalars: the straight-line path's, then those the general path's
-- evaluate() sets for its helpers (one scalar per field, not a table per policy).
local cost_scaled, capacity_scaled, window_s, window_ms

--#batch each (a batched script checks the arguments below again when they change: lua/batch.lua)
-- One policy, charging: cost_scaled, capacity_scaled and window_s are set when ARGV[1],
-- ARGV[3] and ARGV[4] are short decimals within prelude.lua's limits (or tighter ones:
-- then the general path decides), and left nil otherwise. An algorithm's third field
-- (the token bucket's refill rate) fits when empty. Each is non-empty, and one pattern
-- over the three refuses what arithmetic alone would take (" 5", "1e3", "0x10", "nan");
-- then `text + 0` converts, without tonumber's C call (which parses twice).
if #KEYS == 1 then
  local argv = ARGV -- a local: ARGV is a global read each time (alone), an upvalue (batched)
  if #argv == 2 + FIELDS_PER_POLICY and argv[2] == '1' and (FIELDS_PER_POLICY == 2 or argv[5] == '') then
    local cost_text, capacity_text, window_text = argv[1], argv[3], argv[4]
    local cost_length, capacity_length, window_length = #cost_text, #capacity_text, #window_text
    if cost_length > 0 and cost_length < 16 and capacity_length > 0 and capacity_length < 14
        and window_length > 0 and window_length < 6
        and not string_find(cost_text .. capacity_text .. window_text, '%D') then
      local cost, capacity, window = cost_text + 0, capacity_text + 0, window_text + 0
      if cost >= 1 and capacity >= 1 and capacity <= 9007199254000 -- MAX_CAPACITY_SCALED
          and window >= 1 and window <= 86400 then -- MAX_WINDOW_S
        cost_scaled = cost
        capacity_scaled = capacity
        window_s = window
      end
    end
  end
end
