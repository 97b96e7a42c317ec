--[[ moderato: reset, atomic over 1..256 base keys.

KEYS[i]      base key of policy i (up to 16 policies of up to 16 algorithms at once)
ARGV[i]      window_s of KEYS[i]: decimal integer 1..311040000
ARGV[n+j]    (n = #KEYS) the state suffixes to delete under every base, one
             or more: ":" and up to 31 of [A-Za-z0-9_:-], or ":#", which
             stands for the window counters <base>:<index> and
             <base>:<index - 1> (index = floor(now_ms / window_ms))

The suffixes are the algorithm registry's (moderato/algorithms/), passed
in, so a new algorithm's state needs no change here. Deletes each base and
every key the suffixes derive from it at the current time, and replies with
the number of keys deleted. A bad argument is "MODERATO_ARG ..." and deletes
nothing.
]]

-- The contract's numbers (csrc/contract.h, the one source).
local MAX_LONG_WINDOW_S = 311040000 -- the longest window a rate names: ten 360-day years
local MAX_RESET_KEYS = 256
local WINDOW_INDEX = ':#'

local function fail(message)
  error({ moderato_error = 'MODERATO_ARG ' .. message }, 0)
end

--#include replied.lua

local function shown(value)
  if type(value) ~= 'string' then
    return tostring(value)
  end
  local text = value
  if #text > 40 then
    text = string.sub(text, 1, 40) .. '...'
  end
  return '"' .. string.gsub(text, '[^%w%p ]', '?') .. '"'
end

-- window_s as a number, or nil unless it is a decimal integer 1..311040000.
local function parse_window_s(text)
  if type(text) ~= 'string' or not string.find(text, '^%d+$') then
    return nil
  end
  local digits = string.gsub(text, '^0+', '')
  if #digits > 9 then
    return nil
  end
  local window_s = tonumber('0' .. digits)
  if window_s < 1 or window_s > MAX_LONG_WINDOW_S then
    return nil
  end
  return window_s
end

-- floor(numerator / denominator) for non-negative integers below 2^53, exactly.
local function floor_div(numerator, denominator)
  return (numerator - math.fmod(numerator, denominator)) / denominator
end

local function reset()
  local policy_count = #KEYS
  if policy_count < 1 or policy_count > MAX_RESET_KEYS then
    fail('expected 1..' .. MAX_RESET_KEYS .. ' keys (one base key per policy), got ' .. policy_count)
  end
  if #ARGV <= policy_count then
    fail('expected one window_s argument per key (' .. policy_count
      .. ') and then at least one state suffix, got ' .. #ARGV .. ' arguments')
  end
  local windows_s = {}
  for i = 1, policy_count do
    windows_s[i] = parse_window_s(ARGV[i])
    if not windows_s[i] then
      fail('ARGV[' .. i .. '] (window_s of KEYS[' .. i .. ']) must be an integer 1..'
        .. MAX_LONG_WINDOW_S .. ', got ' .. shown(ARGV[i]))
    end
  end

  local suffixes = {}
  for j = policy_count + 1, #ARGV do
    local suffix = ARGV[j]
    local valid = suffix == WINDOW_INDEX
      or (#suffix <= 32 and string.find(suffix, '^:[%w_:-]+$') ~= nil)
    if not valid then
      fail('ARGV[' .. j .. '] (a state suffix) must be ":" and up to 31 of [A-Za-z0-9_:-], '
        .. 'or ":#", got ' .. shown(suffix))
    end
    suffixes[#suffixes + 1] = suffix
  end

  local time = redis.call('TIME')
  local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

  -- Each key once, so the count is the number of keys that existed.
  local doomed, seen = {}, {}
  local function add(key)
    if not seen[key] then
      seen[key] = true
      doomed[#doomed + 1] = key
    end
  end
  for i = 1, policy_count do
    local base = KEYS[i]
    local window_index = floor_div(now_ms, windows_s[i] * 1000)
    for _, suffix in ipairs(suffixes) do
      if suffix == WINDOW_INDEX then
        add(base .. ':' .. string.format('%d', window_index))
        add(base .. ':' .. string.format('%d', window_index - 1))
      else
        add(base .. suffix)
      end
    end
    add(base)
  end
  return redis.call('DEL', unpack(doomed))
end

return replied(pcall(reset))
