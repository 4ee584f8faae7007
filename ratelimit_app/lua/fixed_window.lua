-- fixed_window: one integer per subject, count * 1000000 + (window number mod 1000000), which keeps
-- the value in Redis' int encoding (under 100 bytes a subject). The window's first request writes it
-- with SET ... PXAT <the window's end> (on the server's clock), so a counter that exists is the
-- current window's: a repeat request is one INCRBY by its cost, reads no clock and no figure but the
-- limit. A charge's reset is the window's end, which the worker tells as well (-1: by the reply's now,
-- or its own clock when the reply has none). The window number in the low digits is checked only
-- against a caller's `now` (tests move time on their own).
-- Times are integer milliseconds.
do
  local PACK = 1000000
  -- as redis.call sends them: a number argument would be formatted at every call
  local ONE, GIVE_BACK = '1000000', '-1000000' -- PACK and -PACK

  -- the INCRBY argument for `cost` units, taken (1) or given back (-1)
  local function units(cost, sign)
    if cost == 1 then return sign > 0 and ONE or GIVE_BACK end
    return string.format('%.0f', sign * cost * PACK)
  end

  -- whether a stored value counts the current window (by the server's clock, any counter left does:
  -- a repeat request checks clock.given before it calls this)
  local function current(stored, terms)
    if not clock.given then return true end
    local window = contract.window(terms)
    return stored % PACK == math.floor(clock.ms() / window) % PACK
  end

  -- ms until the window ends, or -1 (the worker works it out) when the call has not read the clock
  local function until_end(terms)
    local now = clock.known
    if not now then return -1 end
    local window = contract.window(terms)
    return window - now % window
  end

  local function look(key, limit, terms, cost)
    local stored = tonumber(redis.call('GET', key))
    local count = stored and current(stored, terms) and math.floor(stored / PACK) or 0
    local ends = until_end(terms)
    return count, count + cost > limit and ends or 0, count > 0 and ends or 0, 1
  end

  strategies.fixed_window = {
    look = look,
    charge = function(key, limit, terms, cost)
      if cost > limit then -- never fits: looked at, never counted (the arithmetic stays within the limit's range)
        local count, retry, reset = look(key, limit, terms, cost)
        return false, count, retry, reset, -2
      end
      local stored = redis.call('INCRBY', key, cost == 1 and ONE or units(cost, 1))
      local count = (stored - stored % PACK) / PACK -- math.floor's, without a call
      if count == cost or clock.given and not current(stored, terms) then
        -- the window's first request (no counter, or a caller's `now` in a later window)
        local window = contract.window(terms)
        local now = clock.ms()
        local period = math.floor(now / window)
        local ends = (period + 1) * window
        local value = cost * PACK + period % PACK -- a number: Redis writes an integer's digits (%.17g, or exactly)
        if clock.given then
          redis.call('SET', key, value, 'PX', ends - now + 1000) -- the window number tells it is over
        else
          redis.call('SET', key, value, 'PXAT', ends)
        end
        return true, 0, 0, -1, -1
      end
      if count > limit then
        redis.call('INCRBY', key, units(cost, -1)) -- no room: given back, nothing counted
        local ends = until_end(terms)
        return false, count - cost, ends, ends, -2
      end
      return true, count - cost, 0, clock.known and until_end(terms) or -1, -2
    end,
    refund = function(key, state, cost)
      redis.call('INCRBY', key, units(cost, -1))
    end,
  }
end
