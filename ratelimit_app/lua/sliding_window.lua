-- sliding_window: one hash per subject holding a series (series.lua): requests per bucket of
-- `bucket` ms and their running total, so a decision reads O(1) fields whatever the bucket count.
-- The key's expiry is moved only when a new bucket starts; memory is bounded by window / bucket
-- fields + 3. Times are integer milliseconds.
do
  local function look(key, limit, window, bucket, cost)
    local now = clock.ms()
    local count, state = series.read(key, '', now, window, bucket)
    local reset = series.empty_in(state, now, window, bucket)
    local retry = 0
    if count + cost > limit then
      -- a cost above the limit never fits: when the window is empty is as good an answer as any
      retry = math.max(1, cost > limit and reset or series.freed_in(key, state, now, window, bucket, count + cost - limit))
    end
    return count, retry, reset, state.fields_read, state
  end

  strategies.sliding_window = {
    look = look,
    charge = function(key, limit, window, bucket, cost)
      local count, retry, reset, _, state = look(key, limit, window, bucket, cost)
      if retry ~= 0 then return false, count, retry, reset, -2 end
      series.add(key, state, cost)
      local now = clock.ms()
      local after = state.current * bucket + window - now
      if state.newest ~= state.current then redis.call('PEXPIRE', key, after) end
      return true, count, 0, after, count > 0 and reset or -1, state
    end,
    refund = function(key, state, cost)
      redis.call('HINCRBY', key, state.p .. state.current, -cost)
      redis.call('HINCRBY', key, state.p .. 't', -cost)
    end,
  }
end
