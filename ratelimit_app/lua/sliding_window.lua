-- sliding_window: one hash per subject holding a series (series.lua): requests per bucket of
-- `bucket` ms and their running total, so a decision reads O(1) fields whatever the bucket count.
-- The key's expiry is moved only when a new bucket starts; memory is bounded by window / bucket
-- fields + 3. Times are integer milliseconds.
strategies.sliding_window = {
  peek = function(key, now, window, bucket, limit)
    local count, state = series.read(key, '', now, window, bucket)
    local retry = 0
    if count >= limit then retry = series.freed_in(key, state, now, window, bucket, count - limit + 1) end
    return count, retry, state
  end,
  reset = function(key, now, window, bucket, count, state)
    return series.empty_in(state, now, window, bucket)
  end,
  -- count one more request; -> ms until the counter empties afterwards, and before (nil: it was empty)
  commit = function(key, now, window, bucket, count, state)
    local before = count > 0 and series.empty_in(state, now, window, bucket) or nil
    series.add(key, state, 1)
    local reset = state.current * bucket + window - now
    if state.newest ~= state.current then redis.call('PEXPIRE', key, reset) end
    return reset, before
  end,
}
