-- moderato: the head of a batched decision script's cluster form (cluster_batched_script() in
-- moderato/redis/grouping.py): the line '#!lua flags=allow-cross-slot-keys', this, then the
-- batched script (batched_script() in moderato/scripts.py) as it is.
--
-- The flag lets a script touch keys of several slots, all served by the node it runs on; the
-- keys a call declares must still share one slot (Redis refuses the call with CROSSSLOT
-- otherwise, flag or not). So a batch over several slots declares the keys of its first slot's
-- checks, and passes the keys of every other slot after its own ARGV: the keys of slot group
-- 1, ..., of group G, then each group's key count, then G.
--
-- Redis checks the declared keys before the script runs (MOVED, ASK, TRYAGAIN); nothing checks
-- the others until a command inside touches them, and by then earlier checks may have run. So
-- before any check runs, one EXISTS per group puts that group's keys through Redis's own
-- cluster check: it refuses (as an error, here a value of pcall) exactly when a call
-- declaring those keys would have been refused before running (a slot this node does not
-- serve, or is migrating away while a key is missing here). If any group is refused, the call
-- is refused whole with MODERATO_NOT_RUN, nothing run, and the client sends each of its checks
-- alone. Else the groups' keys join KEYS in order, the tail leaves ARGV, and the batched
-- script reads KEYS and ARGV as the single-server layout.
do
  local argc = #ARGV
  local groups = tonumber(ARGV[argc])
  local counts_at = argc - groups
  local total = 0
  for g = 0, groups - 1 do
    total = total + ARGV[counts_at + g]
  end
  local tail_at = counts_at - total
  local at = tail_at
  for g = 0, groups - 1 do
    local last = at + ARGV[counts_at + g] - 1
    local probe = redis.pcall('EXISTS', unpack(ARGV, at, last))
    if type(probe) == 'table' then
      return redis.error_reply('MODERATO_NOT_RUN batch: slot group ' .. (g + 1)
        .. ' is not served here as sent: ' .. tostring(probe.err))
    end
    for i = at, last do
      KEYS[#KEYS + 1] = ARGV[i]
    end
    at = last + 1
  end
  for i = argc, tail_at, -1 do
    ARGV[i] = nil
  end
end
