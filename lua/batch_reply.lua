-- moderato: a straight-line decision (the decided_* scalars) into a batched call's flat
-- reply, spliced into lua/batch.lua at its two places (its loop's body, its inner loop):
-- as what changed since the part before's decision when that was one policy's with the
-- same allowed, deciding 0 (before_plain) and the same retry, else in full; the part
-- before's scalars follow (see batch.lua's top for the encoding).
if decided_allowed == before_plain and decided_retry_ms == before_retry_ms then
  if decided_remaining == before_remaining then
    if decided_reset_ms == before_reset_ms then
      replies_at = replies_at + 1
      replies[replies_at] = -1
    else
      replies[replies_at + 1] = -17
      replies_at = replies_at + 2
      replies[replies_at] = decided_reset_ms
      before_reset_ms = decided_reset_ms
    end
  elseif decided_reset_ms == before_reset_ms then
    replies[replies_at + 1] = -5
    replies_at = replies_at + 2
    replies[replies_at] = decided_remaining
    before_remaining = decided_remaining
  else
    replies[replies_at + 1] = -21
    replies[replies_at + 2] = decided_remaining
    replies_at = replies_at + 3
    replies[replies_at] = decided_reset_ms
    before_remaining = decided_remaining
    before_reset_ms = decided_reset_ms
  end
else
  replies[replies_at + 1] = 5
  replies[replies_at + 2] = decided_allowed
  replies[replies_at + 3] = 0
  replies[replies_at + 4] = decided_remaining
  replies[replies_at + 5] = decided_retry_ms
  replies_at = replies_at + 6
  replies[replies_at] = decided_reset_ms
  before_allowed = decided_allowed
  before_plain = decided_allowed
  before_deciding = 0
  before_remaining = decided_remaining
  before_retry_ms = decided_retry_ms
  before_reset_ms = decided_reset_ms
end
