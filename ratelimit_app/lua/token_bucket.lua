-- token_bucket: GCRA (the generic cell rate algorithm). One integer per subject: the theoretical
-- arrival time (TAT) in microseconds, the moment the bucket is full again. The key outlives it by
-- the time to fill the bucket (see lifetime), so that a subject within its rate
-- finds its last TAT and the live index sees it stay where it was; a TAT in the past, or no key,
-- means a full bucket.
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

  -- the burst in use `ahead` us before the TAT, and the ms until `cost` more fit when they do not
  -- (a request of cost N moves the TAT by N * T, so it fits when TAT + N * T - now <= T * B)
  local function in_use(ahead, interval, capacity, cost)
    local count = math.ceil(ahead / interval)
    if count + cost <= capacity then return count, 0 end
    return count, whole_ms(ahead - interval * (capacity - cost))
  end

  -- how long from `now` a key holding `tat` lives, in ms: until the time to fill the whole bucket has
  -- passed once more after the TAT (relative: a caller's `now` may be off the server's clock)
  local function lifetime(tat, now_us, interval, capacity)
    return whole_ms(tat + interval * capacity - now_us)
  end

  -- The TAT this library wrote last, by key. Where the scripts are a Functions library this is kept
  -- between calls (elsewhere it starts empty each call): a subject using its burst is then moved on
  -- from it in one SET ... GET, which also tells whether the guess held (reset, expiry: one more SET).
  local written, count_written, WRITTEN = {}, 0, 10000 -- keys at most, then forgotten all at once

  local function remember(key, tat)
    if written[key] == nil then
      if count_written >= WRITTEN then written, count_written = {}, 0 end
      count_written = count_written + 1
    end
    written[key] = tat
  end

  local function peek(key, now, window, bucket, limit, now_us, cost)
    local interval, capacity = sizes(window, bucket, limit)
    now_us = now_us or now * 1000
    local tat = math.max(tonumber(redis.call('GET', key)) or now_us, now_us)
    local count, retry = in_use(tat - now_us, interval, capacity, cost or 1)
    return count, retry, {tat = tat, interval = interval, now_us = now_us}, capacity
  end

  strategies.token_bucket = {
    -- -> burst in use, ms until `cost` more tokens are there (when they are not), state, capacity
    -- (`now_us`: the same moment to the microsecond, when the caller has it)
    peek = peek,
    -- ms until the bucket is full
    reset = function(key, now, window, bucket, count, state)
      return whole_ms(state.tat - state.now_us)
    end,
    -- take `cost` tokens if the burst allows: -> burst in use before, ms until they are there (when
    -- they are not), state, capacity, whether they were taken, ms until the bucket is full, and the
    -- same before (nil: no key; at most 0: the bucket was full). One SET ... GET writes max(TAT,
    -- now) + N * T from the TAT this library wrote last (now when none is known) and reads the one
    -- stored: all a subject costs when they agree. Otherwise one more SET (to the stored TAT + N * T,
    -- or back to it when the burst has no room); a TAT known to leave no room is only read.
    take = function(key, now, window, bucket, limit, now_us, totals_bucket, cost)
      local interval, capacity = sizes(window, bucket, limit)
      now_us = now_us or now * 1000
      local guess = math.max(written[key] or now_us, now_us)
      if cost > capacity or in_use(guess - now_us, interval, capacity, cost) + cost > capacity then
        local count, retry, state = peek(key, now, window, bucket, limit, now_us, cost)
        if cost > capacity or count + cost > capacity then -- no room: nothing written
          remember(key, state.tat)
          return count, retry, state, capacity, false
        end
        guess = state.tat -- the guess was stale: room after all
      end
      local fresh = guess + interval * cost
      local stored = redis.call('SET', key, string.format('%.0f', fresh), 'PX', lifetime(fresh, now_us, interval, capacity), 'GET')
      local tat = tonumber(stored)
      local found = math.max(tat or now_us, now_us)
      local state = {tat = found, interval = interval, capacity = capacity, stored = stored, now_us = now_us}
      local before = tat and whole_ms(tat - now_us) or nil
      local count, retry = in_use(found - now_us, interval, capacity, cost)
      if found == guess then
        remember(key, fresh)
        return count, 0, state, capacity, true, whole_ms(fresh - now_us), before
      end
      if count + cost > capacity then
        redis.call('SET', key, stored, 'PX', lifetime(tat, now_us, interval, capacity)) -- no room: as it was
        remember(key, tat)
        return count, retry, state, capacity, false, before, before
      end
      local moved_to = found + interval * cost
      redis.call('SET', key, string.format('%.0f', moved_to), 'PX', lifetime(moved_to, now_us, interval, capacity))
      remember(key, moved_to)
      return count, 0, state, capacity, true, whole_ms(moved_to - now_us), before
    end,
    -- give back what take() admitted (another policy refused the request): the TAT it found
    undo = function(key, now, state)
      if state.stored then
        redis.call('SET', key, state.stored, 'PX', lifetime(state.tat, state.now_us, state.interval, state.capacity))
      else
        redis.call('DEL', key)
      end
      remember(key, state.tat)
    end,
  }
end
