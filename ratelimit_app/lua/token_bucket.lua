-- token_bucket: GCRA (the generic cell rate algorithm). One integer per subject: the theoretical
-- arrival time (TAT) in microseconds, the moment the bucket is full again. The key outlives it by
-- the time to fill the bucket or up to twice that (see lifetime); a TAT in the past, or no key, means a
-- full bucket.
--
-- limit per window is the sustained rate: one request every T = window / limit, in whole
-- microseconds, rounded up so the rate is never exceeded; `bucket` carries the burst B (0: the
-- limit; never more than the limit in effect, which an override may lower). A request at `now` is
-- admitted iff TAT - now <= T * (B - 1), after which TAT = max(TAT, now) + T: from a full bucket B
-- requests pass at once, then one every T. The burst in use is ceil((TAT - now) / T), so "at the
-- limit" reads count >= B. Times in and out are integer milliseconds; microseconds only inside.
do
  -- the interval T (us) and the capacity, from the policy's terms
  local function sizes(terms, limit)
    local window, bucket = contract.figures(terms)
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
    return count, math.max(1, whole_ms(ahead - interval * (capacity - cost)))
  end

  -- how long from `now` a key holding `tat` lives, in ms: to the end of the cell after the TAT's, cells
  -- being the time to fill the whole bucket, so an INCRBY that keeps the TAT in its cell keeps the key
  -- alive past the TAT (relative: a caller's `now` may be off the server's clock)
  local function lifetime(tat, now_us, interval, capacity)
    local cell = interval * capacity
    return whole_ms((math.floor(tat / cell) + 2) * cell - now_us)
  end

  local function crossed(from, to, interval, capacity)
    local cell = interval * capacity
    return math.floor(from / cell) ~= math.floor(to / cell)
  end

  -- a subject seen using its burst: one INCRBY moves a TAT still ahead (a PEXPIRE when it enters the
  -- next cell); a bucket that filled meanwhile (or a key gone) is written as full, with one more SET
  local function charge_busy(key, now_us, interval, capacity, cost, fresh)
    local step = interval * cost
    local moved = redis.call('INCRBY', key, step)
    local tat = moved - step
    if tat <= now_us then
      redis.call('SET', key, fresh, 'PX', lifetime(fresh, now_us, interval, capacity))
      if tat == 0 then return true, 0, 0, whole_ms(fresh - now_us), -1 end -- no key: INCRBY made one
      return true, 0, 0, whole_ms(fresh - now_us), whole_ms(tat - now_us), tat
    end
    local count, retry = in_use(tat - now_us, interval, capacity, cost)
    if count + cost > capacity then
      redis.call('DECRBY', key, step) -- no room: as it was
      return false, count, retry, whole_ms(tat - now_us), -2
    end
    if crossed(tat, moved, interval, capacity) then
      redis.call('PEXPIRE', key, lifetime(moved, now_us, interval, capacity))
    end
    return true, count, 0, whole_ms(moved - now_us), whole_ms(tat - now_us), tat
  end

  local function look(key, limit, terms, cost)
    local interval, capacity = sizes(terms, limit)
    local now_us = clock.us()
    local tat = math.max(tonumber(redis.call('GET', key)) or now_us, now_us)
    local count, retry = in_use(tat - now_us, interval, capacity, cost)
    return count, retry, whole_ms(tat - now_us), 1
  end

  strategies.token_bucket = {
    look = look,
    -- One SET ... GET writes now + N * T, as if the bucket were full, and reads the TAT stored: all
    -- a subject within its rate costs. A subject using its burst costs one more SET (to the stored
    -- TAT + N * T, or back to it when the burst has no room), unless the worker saw it using its
    -- burst last time (seen 2): then one INCRBY does, and a filled bucket costs one more SET.
    charge = function(key, limit, terms, cost, lease, seen)
      local interval, capacity = sizes(terms, limit)
      if cost > capacity then
        local count, retry, reset = look(key, limit, terms, cost)
        return false, count, retry, reset, -2
      end
      local now_us = clock.us()
      local fresh = now_us + interval * cost
      if seen == 2 then return charge_busy(key, now_us, interval, capacity, cost, fresh) end
      -- TATs as numbers: Redis writes an integer's digits (%.17g, or exactly), cheaper than string.format
      local stored = redis.call('SET', key, fresh,
        'PX', lifetime(fresh, now_us, interval, capacity), 'GET')
      local tat = tonumber(stored)
      if not tat or tat <= now_us then -- the bucket was full: the guess held
        return true, 0, 0, whole_ms(fresh - now_us), tat and whole_ms(tat - now_us) or -1, stored
      end
      local count, retry = in_use(tat - now_us, interval, capacity, cost)
      if count + cost > capacity then
        redis.call('SET', key, stored, 'PX', lifetime(tat, now_us, interval, capacity)) -- no room: as it was
        return false, count, retry, whole_ms(tat - now_us), -2
      end
      local moved = tat + interval * cost
      redis.call('SET', key, moved, 'PX', lifetime(moved, now_us, interval, capacity))
      return true, count, 0, whole_ms(moved - now_us), whole_ms(tat - now_us), stored
    end,
    -- give back what charge admitted (another policy refused the request): the TAT it found (text or a number)
    refund = function(key, stored)
      if stored then
        -- the longer life charge gave it: a TAT past is a full bucket
        redis.call('SET', key, string.format('%.0f', stored), 'KEEPTTL')
      else
        redis.call('DEL', key)
      end
    end,
  }
end
