-- moderato: the write of a window counter the read (counter_run.lua) charged, the write
-- piece of the one-policy paths of fixed_window.lua and sliding_window.lua (spliced in at
-- their `--#batch write`). The counter holds stored_scaled, the checks decided leave
-- used_scaled: nothing to do when they agree (an admission alone), the read's charge
-- undone when nothing was admitted (a denial alone, or state the general path must
-- decide), else one INCRBY of the difference. A counter found at 0 and charged gets its
-- expiry, expire_at_ms. (The policy's and the key pieces compute state_key and
-- expire_at_ms from the policy's text and the instant alone, so a batched script's run,
-- whose checks have the same, writes what its first check read.)
if used_scaled ~= stored_scaled then
  if used_scaled == found_scaled then
    redis_call('DECRBY', state_key, charged_text)
  else
    -- '%d' writes it in full (a number argument Redis would write with '%.17g').
    redis_call('INCRBY', state_key, string_format('%d', used_scaled - stored_scaled))
  end
end
if found_scaled == 0 and used_scaled > 0 then
--#include expiry_text.lua
  redis_call('PEXPIREAT', state_key, expiry_text)
end
