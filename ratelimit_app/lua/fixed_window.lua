-- fixed_window: one integer per subject, count * 1000000 + (window number mod 1000000).
-- The window number is stored with the count (rather than relying on the key's expiry alone) so
-- that a caller-supplied `now` crosses windows correctly; packing both into one integer keeps the
-- value in Redis' int encoding (under 100 bytes a subject). A repeat request costs one INCRBY (take):
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

  strategies.fixed_window = {
    -- -> requests counted in the window, ms until one more fits (when at the limit), state
    peek = function(key, now, window, bucket, limit)
      local period, reset = period_reset(now, window)
      local count = 0
      local stored = tonumber(redis.call('GET', key))
      if stored and stored % PACK == period % PACK then count = math.floor(stored / PACK) end
      return count, reset, period
    end,
    -- ms until every counted request has left the window
    reset = function(key, now, window, bucket, count, period)
      return (period + 1) * window - now
    end,
    -- count one request if the window has room: -> requests counted before it, ms until one more
    -- fits (when at the limit), state, nil (the limit is the capacity), whether it was counted, ms
    -- until every counted request has left the window, and the same before it (nil: none was counted)
    take = function(key, now, window, bucket, limit)
      local period, reset = period_reset(now, window)
      local stored = redis.call('INCRBY', key, ONE)
      local count = math.floor(stored / PACK)
      if count == 1 or stored % PACK ~= period % PACK then
        -- the window's first request (the key was empty, or left from an earlier window). A second of
        -- slack on the expiry: the value carries its window number, so keeping it a little longer
        -- never counts a request twice, and a caller's `now` a little off the server's loses nothing
        redis.call('SET', key, string.format('%.0f', PACK + period % PACK), 'PX', reset + 1000)
        return 0, 0, period, nil, true, reset
      end
      if count > limit then
        redis.call('INCRBY', key, GIVE_BACK) -- at the limit: given back, nothing counted
        return count - 1, reset, period, nil, false, reset, reset
      end
      return count - 1, 0, period, nil, true, reset, count > 1 and reset or nil
    end,
    -- take back a request take() counted (another policy refused the request)
    undo = function(key, now, period)
      redis.call('INCRBY', key, GIVE_BACK)
    end,
  }
end
