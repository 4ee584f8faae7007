-- token_bucket: GCRA (the generic cell rate algorithm). One integer per subject: the theoretical
-- arrival time (TAT) in microseconds, the moment the bucket is full again, written with its expiry
-- (that same moment) in one SET ... PX. No key means a full bucket.
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

  strategies.token_bucket = {
    -- -> burst in use, ms until one more fits (when the burst is used up), state, capacity
    peek = function(key, now, window, bucket, limit)
      local interval, capacity = sizes(window, bucket, limit)
      local now_us = now * 1000
      local tat = tonumber(redis.call('GET', key)) or now_us
      if tat < now_us then tat = now_us end
      local ahead = tat - now_us
      local count = math.floor(ahead / interval)
      if count * interval < ahead then count = count + 1 end
      local retry = 0
      if count >= capacity then retry = whole_ms(ahead - interval * (capacity - 1)) end
      return count, retry, {tat = tat, interval = interval}, capacity
    end,
    -- ms until the bucket is full
    reset = function(key, now, window, bucket, count, state)
      return whole_ms(state.tat - now * 1000)
    end,
    -- admit one more request; -> ms until the bucket is full afterwards
    commit = function(key, now, window, bucket, count, state)
      local tat = state.tat + state.interval
      local full_in = whole_ms(tat - now * 1000)
      redis.call('SET', key, string.format('%.0f', tat), 'PX', full_in)
      return full_in
    end,
  }
end
