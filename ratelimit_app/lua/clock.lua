-- clock: the moment of one call, read from the server's TIME only when a strategy needs it (a fixed
-- window's repeat request needs none: its counter ends with its window). decide.lua starts it at
-- every call; the few numbers below hold nothing from one call to the next.
local clock = {}
do
  local given, ms, us -- the caller's time (ms) or nil; the call's moment once known, in ms and us

  -- start a call: `when` is '' (the server's TIME, when asked) or a time in milliseconds
  function clock.start(when)
    given = tonumber(when)
    ms = given
    us = given and given * 1000
  end

  -- the call's moment in ms (reads TIME the first time it is asked)
  function clock.ms()
    if not ms then
      local time = redis.call('TIME') -- seconds and microseconds, as text (arithmetic reads them)
      us = time[1] * 1000000 + time[2]
      ms = math.floor(us / 1000)
    end
    return ms
  end

  -- the same moment to the microsecond (a token bucket's interval may be shorter than 1 ms)
  function clock.us()
    if not us then clock.ms() end
    return us
  end

  -- the moment if it is known without asking the server, else nil
  function clock.known()
    return ms
  end

  -- whether the caller gave the time (tests move it without sleeping; keys then end on the server's clock)
  function clock.given()
    return given ~= nil
  end
end
