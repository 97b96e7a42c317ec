-- moderato: a script's last step, the outcome of its pcall as the reply; shared by
-- the decision scripts (spliced into prelude.lua) and reset.lua. A refusal (a table
-- raised by fail()) becomes an error reply; any other error (Redis's own: OOM,
-- READONLY, a bug) is raised again as it came.
local function replied(ok, result)
  if ok then
    return result
  end
  if type(result) == 'table' and result.moderato_error then
    return redis.error_reply(result.moderato_error)
  end
  error(result, 0)
end
