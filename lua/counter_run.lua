-- moderato: the read of a window counter charged first, the read piece of the one-policy
-- paths of fixed_window.lua and sliding_window.lua (spliced in at their `--#batch read`).
-- state_key's counter is charged the check's cost by INCRBY (ARGV[1] as sent: short
-- decimal digits, so Redis need not format a number; INCRBY takes only a canonical decimal
-- integer as either, so a cost it refuses goes on untouched), which answers what it holds
-- now, stored_scaled. Then found_scaled is what it held, used_scaled what the checks
-- decided since leave (found_scaled, before any) and charged_text the charge, which the
-- write (counter_write.lua) settles. A counter INCRBY cannot take (another type, not an
-- integer) leaves all three -1: nothing charged, nothing to write, the general path decides.
stored_scaled = redis_pcall('INCRBY', state_key, ARGV[1])
if type(stored_scaled) == 'number' then
  used_scaled = stored_scaled - cost_scaled
  found_scaled, charged_text = used_scaled, ARGV[1]
else
  if string_find(stored_scaled.err, "can't run this command", 1, true) then
    -- An ACL without INCRBY is a misconfiguration to report, not a detour to take. (Other
    -- errors, OOM or READONLY included, leave the decision to the general path, which
    -- reads before it writes: a denial there writes nothing.)
    return stored_scaled
  end
  stored_scaled, found_scaled, used_scaled = -1, -1, -1
end
