-- moderato: the '%d' text of a write's expiry, spliced in (no function: a call costs Redis
-- more than these lines) where a straight-line path's write piece sets a key's expiry
-- (accrual.lua, counter_write.lua, gcra.lua, sliding_log.lua). Expects expire_at_ms, the
-- expiry (an integer number of ms), and the locals expiry_text and expiry_text_of
-- (one_policy.lua); sets expiry_text to expire_at_ms's '%d' text, formatted only when
-- expire_at_ms differs from expiry_text_of, the number the text last written stands for.
if expire_at_ms ~= expiry_text_of then
  expiry_text_of, expiry_text = expire_at_ms, string_format('%d', expire_at_ms)
end
