-- clock: the moment of one call, read from the server's TIME only when a strategy needs it (a fixed
-- window's repeat request needs none: its counter ends with its window). decide.lua starts it at
-- every call; what it holds is set afresh by clock.start, so nothing lasts from one call to the next.
--   clock.given  the caller's time (ms), or false: tests move it without sleeping; keys then end on the
--                server's clock
--   clock.known  the call's moment (ms) if it is known without asking the server, else false
-- Fields, not functions: a fixed window's repeat request reads them where a call would cost more. They
-- are false rather than nil: a field set to nil leaves the table, and setting it again rebuilds the table.
-- A call on the server's clock may start by setting both false, as clock.start() does, without the call.
local clock = {given = false, known = false}
do
  local us -- the call's moment in microseconds: read only while clock.known is the same moment's

  -- start a call: `when` is nil or '' (the server's TIME, when asked) or a time in milliseconds
  function clock.start(when)
    local given = when and when ~= '' and tonumber(when) or false -- tonumber() on text runs strtod: not for none
    clock.given, clock.known, us = given, given, given and given * 1000
  end

  -- the call's moment in ms (reads TIME the first time it is asked)
  function clock.ms()
    if not clock.known then
      local time = redis.call('TIME') -- seconds and microseconds, as text (arithmetic reads them)
      us = time[1] * 1000000 + time[2]
      clock.known = math.floor(us / 1000)
    end
    return clock.known
  end

  -- the same moment to the microsecond (a token bucket's interval may be shorter than 1 ms)
  function clock.us()
    if not clock.known then clock.ms() end
    return us
  end
end
