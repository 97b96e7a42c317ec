-- moderato: the arguments of a one-policy call, checked for a script's straight-line
-- path. Spliced inside `if #KEYS == 1 and #ARGV == <2 + fields> and ARGV[2] == '1' then`
-- after `local cost_scaled, capacity_scaled, window_s`: sets the three when ARGV[1],
-- ARGV[3] and ARGV[4] are short decimals within prelude.lua's limits (or tighter ones:
-- then the general path decides), and leaves them nil otherwise. No function is built.
-- Each is non-empty, and the pattern refuses what tonumber alone would take (" 5", "1e3", "0x10", "nan").
local cost_text, capacity_text, window_text = ARGV[1], ARGV[3], ARGV[4]
local cost_length, capacity_length, window_length = #cost_text, #capacity_text, #window_text
if cost_length > 0 and cost_length < 16 and capacity_length > 0 and capacity_length < 14
    and window_length > 0 and window_length < 6
    and string.find(cost_text .. capacity_text .. window_text, '^%d+$') then
  local cost, capacity, window = tonumber(cost_text), tonumber(capacity_text), tonumber(window_text)
  if cost >= 1 and capacity >= 1 and capacity <= 9007199254000 and window >= 1 and window <= 86400 then
    cost_scaled, capacity_scaled, window_s = cost, capacity, window
  end
end
