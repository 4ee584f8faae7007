-- fixed_window: one integer per subject, count * 1000000 + (window number mod 1000000).
-- The window number is stored with the count (rather than relying on the key's expiry alone) so
-- that a caller-supplied `now` crosses windows correctly; packing both into one integer keeps the
-- value in Redis' int encoding (under 100 bytes a subject). The key is written with its expiry in
-- one SET, never INCR then EXPIRE. Times are integer milliseconds.
strategies.fixed_window = {
  -- -> requests counted in the window, ms until one more fits (when at the limit), state
  peek = function(key, now, window, bucket, limit)
    local period = math.floor(now / window)
    local count = 0
    local stored = tonumber(redis.call('GET', key))
    if stored and stored % 1000000 == period % 1000000 then count = math.floor(stored / 1000000) end
    return count, (period + 1) * window - now, period
  end,
  -- ms until every counted request has left the window
  reset = function(key, now, window, bucket, count, period)
    return (period + 1) * window - now
  end,
  -- count one more request; -> the reset afterwards
  commit = function(key, now, window, bucket, count, period)
    local reset = (period + 1) * window - now
    -- a second of slack: the value carries its window number, so keeping it a little longer never
    -- counts a request twice, and a caller's `now` (tests) a little off the server's loses nothing
    redis.call('SET', key, string.format('%.0f', (count + 1) * 1000000 + period % 1000000), 'PX', reset + 1000)
    return reset
  end,
}
