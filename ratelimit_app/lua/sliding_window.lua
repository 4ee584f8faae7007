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
  -- count one request if the window has room (decide.lua's contract)
  take = function(key, now, window, bucket, limit)
    local count, retry, state = strategies.sliding_window.peek(key, now, window, bucket, limit)
    if count >= limit then return count, retry, state, nil, false end
    local before = count > 0 and series.empty_in(state, now, window, bucket) or nil
    series.add(key, state, 1)
    local reset = state.current * bucket + window - now
    if state.newest ~= state.current then redis.call('PEXPIRE', key, reset) end
    return count, 0, state, nil, true, reset, before
  end,
  undo = function(key, now, state)
    redis.call('HINCRBY', key, state.p .. state.current, -1)
    redis.call('HINCRBY', key, state.p .. 't', -1)
  end,
}
