-- token_bucket: GCRA (the generic cell rate algorithm). One integer per subject: the theoretical
-- arrival time (TAT) in microseconds, the moment the bucket is full again. The key outlives it a
-- little (see lifetime); a TAT in the past, or no key, means a full bucket.
--
-- limit per window is the sustained rate: one request every T = window / limit, in whole
-- microseconds, rounded up so the rate is never exceeded; `bucket` carries the burst B (0: the
-- limit; never more than the limit in effect, which an override may lower). A request at `now` is admitted iff TAT - now <= T * (B - 1), after which
-- TAT = max(TAT, now) + T: from a full bucket B requests pass at once, then one every T.
-- The burst in use is ceil((TAT - now) / T), so "at the limit" reads count >= B (returned as the
-- capacity). Times in and out are integer milliseconds; microseconds only inside.
do  -- the helpers stay local to this file
  local function sizes(window, bucket, limit)
    local capacity = bucket > 0 and math.min(bucket, limit) or limit
    return math.ceil(window * 1000 / limit), capacity
  end

  local function whole_ms(microseconds)
    return math.ceil(microseconds / 1000)
  end

  -- the burst in use `ahead` us before the TAT, and the ms until one more fits when it is used up
  local function in_use(ahead, interval, capacity)
    local count = math.ceil(ahead / interval)
    if count < capacity then return count, 0 end
    return count, whole_ms(ahead - interval * (capacity - 1))
  end

  -- how long from `now` (ms) a key holding `tat` lives: until at least one whole grid cell after the
  -- TAT, the cell being the time to fill the whole bucket, so that the expiry moves only when the TAT
  -- enters the next cell (once every `capacity` requests at most) rather than with every request; in
  -- ms, relative (a caller's `now` may be off the server's clock)
  local function lifetime(tat, now, interval, capacity)
    local cell = interval * capacity
    return math.ceil((math.floor(tat / cell) + 2) * cell / 1000) - now
  end

  strategies.token_bucket = {
    -- -> burst in use, ms until one more fits (when the burst is used up), state, capacity
    peek = function(key, now, window, bucket, limit)
      local interval, capacity = sizes(window, bucket, limit)
      local now_us = now * 1000
      local tat = math.max(tonumber(redis.call('GET', key)) or now_us, now_us)
      local count, retry = in_use(tat - now_us, interval, capacity)
      return count, retry, {tat = tat, interval = interval}, capacity
    end,
    -- ms until the bucket is full
    reset = function(key, now, window, bucket, count, state)
      return whole_ms(state.tat - now * 1000)
    end,
    -- admit one request if the burst allows: -> burst in use before it, ms until one more fits (when
    -- the burst is used up), state, capacity, whether it was counted, ms until the bucket is full.
    -- One INCRBY by T in the steady state: it reads the TAT and moves it on at once. A TAT in the
    -- past (a full bucket: the key outlives its TAT, see expiry) is written afresh as now + T.
    take = function(key, now, window, bucket, limit)
      local interval, capacity = sizes(window, bucket, limit)
      local now_us = now * 1000
      local tat = redis.call('INCRBY', key, interval) - interval -- no key: 0
      if tat < now_us then
        local fresh = now_us + interval
        redis.call('SET', key, string.format('%.0f', fresh), 'PX', lifetime(fresh, now, interval, capacity))
        return 0, 0, {tat = now_us, interval = interval}, capacity, true, whole_ms(interval)
      end
      local state = {tat = tat, interval = interval, moved = true}
      local count, retry = in_use(tat - now_us, interval, capacity)
      if count >= capacity then
        redis.call('INCRBY', key, -interval) -- the burst is used up: given back, nothing counted
        return count, retry, state, capacity, false, whole_ms(tat - now_us)
      end
      local moved_to = tat + interval
      if math.floor(moved_to / (interval * capacity)) ~= math.floor(tat / (interval * capacity)) then
        redis.call('PEXPIRE', key, lifetime(moved_to, now, interval, capacity))
      end
      return count, 0, state, capacity, true, whole_ms(moved_to - now_us)
    end,
    -- give back a request take() admitted (another policy refused the request)
    undo = function(key, now, state)
      if state.moved then
        redis.call('INCRBY', key, -state.interval)
      else
        redis.call('DEL', key) -- the bucket was full: as it is without a key
      end
    end,
  }
end
