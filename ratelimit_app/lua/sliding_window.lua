-- sliding_window: one hash per subject holding a series (series.lua): requests per bucket of
-- `bucket` ms and their running total, so a decision reads O(1) fields whatever the bucket count.
-- The key's expiry is moved only when a new bucket starts; memory is bounded by window / bucket
-- fields + 3. Times are integer milliseconds.
strategies.sliding_window = {
  peek = function(key, now, window, bucket, limit, now_us, cost)
    local count, state = series.read(key, '', now, window, bucket)
    local retry = 0
    cost = cost or 1
    if count + cost > limit then
      -- a cost above the limit never fits: when the window is empty is as good an answer as any
      retry = cost > limit and series.empty_in(state, now, window, bucket)
        or series.freed_in(key, state, now, window, bucket, count + cost - limit)
    end
    return count, retry, state
  end,
  reset = function(key, now, window, bucket, count, state)
    return series.empty_in(state, now, window, bucket)
  end,
  -- take `cost` units if the window has room (decide.lua's contract)
  take = function(key, now, window, bucket, limit, now_us, totals_bucket, cost)
    local count, retry, state = strategies.sliding_window.peek(key, now, window, bucket, limit, now_us, cost)
    if count + cost > limit then return count, retry, state, nil, false end
    local before = count > 0 and series.empty_in(state, now, window, bucket) or nil
    series.add(key, state, cost)
    local reset = state.current * bucket + window - now
    if state.newest ~= state.current then redis.call('PEXPIRE', key, reset) end
    return count, 0, state, nil, true, reset, before
  end,
  undo = function(key, now, state, cost)
    redis.call('HINCRBY', key, state.p .. state.current, -cost)
    redis.call('HINCRBY', key, state.p .. 't', -cost)
  end,
}
