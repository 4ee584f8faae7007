-- sliding_log: one sorted set per subject, score = admission time, member = "<time>:<n>" where n
-- is the number of members from the start of the time's totals bucket on (any later time included).
-- Unique whatever the clock does, a step back included: the log only loses whole totals buckets
-- (charge trims at a bucket boundary) or everything, so while members of one time remain, nothing
-- from their bucket on has left, and n has grown with every admission since each of them.
-- Exact; only admitted requests are added, so it holds at most `limit` members in the window, plus
-- those that left it during one totals bucket (see charge).
-- Times are integer milliseconds.
do
  -- A request of many units is added CHUNK members a command: one command's arguments stay well
  -- within what Lua can unpack, whatever the cost.
  local CHUNK = 256

  local function add(key, now, recent, cost)
    for first = 0, cost - 1, CHUNK do
      local added = {}
      for i = first, math.min(first + CHUNK, cost) - 1 do
        added[#added + 1] = now
        added[#added + 1] = now .. ':' .. (recent + i)
      end
      redis.call('ZADD', key, unpack(added))
    end
  end

  -- ms until every entry has left the window (0: none is in it)
  local function empty_in(key, now, window, count)
    if count == 0 then return 0 end
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    return tonumber(newest[2]) + window - now
  end

  local function counted(key, now, window)
    return redis.call('ZCOUNT', key, '(' .. (now - window), '+inf')
  end

  -- ms until `cost` more fit (0: they do now)
  local function retry_in(key, now, window, limit, count, cost)
    if count + cost <= limit then return 0 end
    if cost > limit then return window end -- never fits (the caller knows)
    -- the oldest entries leave first: once count + cost - limit of them have, the cost fits
    local freeing = redis.call('ZRANGEBYSCORE', key, '(' .. (now - window), '+inf', 'WITHSCORES',
      'LIMIT', count + cost - limit - 1, 1)
    return tonumber(freeing[2]) + window - now
  end

  strategies.sliding_log = {
    look = function(key, limit, terms, cost)
      local now = clock.ms()
      local window = contract.window(terms)
      local count = counted(key, now, window)
      return count, retry_in(key, now, window, limit, count, cost), empty_in(key, now, window, count), 2
    end,
    -- one entry per unit. Only the subject's first request in a bucket of `totals_bucket` ms (the live
    -- index's step) trims what left the window and moves the key's expiry past every request that
    -- bucket may add; the others are two ZCOUNTs and one ZADD. The log so holds at most its window
    -- plus a bucket.
    charge = function(key, limit, terms, cost)
      local window, totals_bucket = contract.window(terms), contract.totals_bucket(terms)
      local now = clock.ms()
      local count = counted(key, now, window)
      local retry = retry_in(key, now, window, limit, count, cost)
      if retry ~= 0 then return false, count, retry, empty_in(key, now, window, count), -2 end
      local b = math.ceil(now / totals_bucket) -- requests in ((b - 1) * totals_bucket, now] share it
      local since = (b - 1) * totals_bucket
      -- the members from this bucket on (none when the window, which holds the bucket, is empty)
      local recent = count == 0 and 0 or redis.call('ZCOUNT', key, '(' .. since, '+inf')
      local before = -2 -- another request in this bucket: where the log empties does not move
      if recent == 0 then
        before = count > 0 and empty_in(key, now, window, count) or -1
        -- whole buckets only (the window is a number of them), which keeps the members unique
        redis.call('ZREMRANGEBYSCORE', key, '-inf', since - window)
      end
      if cost == 1 then
        redis.call('ZADD', key, now, now .. ':' .. recent)
      else
        add(key, now, recent, cost)
      end
      if recent == 0 then redis.call('PEXPIRE', key, b * totals_bucket + window - now) end -- after ZADD made the key
      return true, count, 0, window, before, recent
    end,
    -- the members charge wrote are named by their time and numbers: `recent` is the first number
    refund = function(key, recent, cost)
      local now = clock.ms()
      for first = 0, cost - 1, CHUNK do
        local names = {}
        for i = first, math.min(first + CHUNK, cost) - 1 do names[#names + 1] = now .. ':' .. (recent + i) end
        redis.call('ZREM', key, unpack(names))
      end
    end,
  }
end
