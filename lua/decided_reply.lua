-- moderato: the script alone's reply from a straight-line decision, spliced in after its
-- pieces (`--#batch end`, which a batched script leaves out: its driver writes the
-- decided_* scalars into the call's reply itself, lua/batch_reply.lua). Expects the
-- decided_* scalars one_policy.lua declares; returns one policy's reply (deciding 0) when
-- the decide piece decided, else goes on to the general path.
if decided_allowed then
  return { decided_allowed, 0, decided_remaining, decided_retry_ms, decided_reset_ms }
end
