-- fixed_window: one integer per subject, count * 1000000 + (window number mod 1000000).
-- The window number is stored with the count (rather than relying on the key's expiry alone) so
-- that a caller-supplied `now` crosses windows correctly; packing both into one integer keeps the
-- value in Redis' int encoding (under 100 bytes a subject). A repeat request costs one INCRBY (take, by its cost):
-- the window number in the low digits survives it, so the reply tells the count and whether it is
-- this window's. The first request of a window writes the value with its expiry in one SET, never
-- INCR then EXPIRE. Times are integer milliseconds.
do
  local PACK = 1000000
  -- as redis.call sends them: a number argument would be formatted at every call
  local ONE, GIVE_BACK = '1000000', '-1000000' -- PACK and -PACK

  local function period_reset(now, window)
    local period = math.floor(now / window)
    return period, (period + 1) * window - now
  end

  -- the INCRBY argument for `cost` units, taken (1) or given back (-1)
  local function units(cost, sign)
    if cost == 1 then return sign > 0 and ONE or GIVE_BACK end
    return string.format('%.0f', sign * cost * PACK)
  end

  strategies.fixed_window = {
    -- -> units counted in the window, ms until `cost` more fit (when they do not), state
    peek = function(key, now, window, bucket, limit)
      local period, reset = period_reset(now, window)
      local count = 0
      local stored = tonumber(redis.call('GET', key))
      if stored and stored % PACK == period % PACK then count = math.floor(stored / PACK) end
      return count, reset, period
    end,
    -- ms until every counted unit has left the window
    reset = function(key, now, window, bucket, count, period)
      return (period + 1) * window - now
    end,
    -- take `cost` units if the window has room: -> units counted before, ms until they fit (when they
    -- do not), state, nil (the limit is the capacity), whether they were taken, ms until every counted
    -- unit has left the window, and the same before this request (nil: none was counted)
    take = function(key, now, window, bucket, limit, now_us, totals_bucket, cost)
      local period, reset = period_reset(now, window)
      if cost > limit then -- never fits: looked at, never counted (the arithmetic stays within the limit's range)
        local count = strategies.fixed_window.peek(key, now, window, bucket, limit)
        return count, reset, period, nil, false, reset
      end
      local stored = redis.call('INCRBY', key, units(cost, 1))
      local count = math.floor(stored / PACK)
      if count == cost or stored % PACK ~= period % PACK then
        -- the window's first request (the key was empty, or left from an earlier window). A second of
        -- slack on the expiry: the value carries its window number, so keeping it a little longer
        -- never counts a request twice, and a caller's `now` a little off the server's loses nothing
        redis.call('SET', key, string.format('%.0f', cost * PACK + period % PACK), 'PX', reset + 1000)
        return 0, 0, period, nil, true, reset
      end
      if count > limit then
        redis.call('INCRBY', key, units(cost, -1)) -- no room: given back, nothing counted
        return count - cost, reset, period, nil, false, reset, reset
      end
      return count - cost, 0, period, nil, true, reset, count > cost and reset or nil
    end,
    -- give back what take() counted (another policy refused the request)
    undo = function(key, now, period, cost)
      redis.call('INCRBY', key, units(cost, -1))
    end,
  }
end
