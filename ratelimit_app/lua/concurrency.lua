-- concurrency: the requests of a subject in progress now. One sorted set per subject: a member per
-- unit a request holds, "<lease>:<n>" (the lease is the request's own, sent by the worker), scored
-- by when it stops counting: admitted + window, so a worker killed mid-request never holds a place
-- for longer than the window. The worker gives the places back when the response is done
-- (release.lua); the window only matters when it cannot. Times are integer milliseconds.
do
  local function holding(key, now)
    return redis.call('ZCOUNT', key, '(' .. now, '+inf')
  end

  -- ms until `cost` places may be free: a request usually ends long before its lease does, so a
  -- second, unless the leases say sooner (the client then asks again: a guess, never a promise)
  local function retry_in(key, now, count, cost, limit)
    if cost > limit then return 1000 end
    local freeing = redis.call('ZRANGEBYSCORE', key, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', count + cost - limit - 1, 1)
    return math.min(1000, tonumber(freeing[2]) - now)
  end

  local function members(lease, cost)
    local names = {}
    for i = 1, cost do names[i] = lease .. ':' .. i end
    return names
  end

  strategies.concurrency = {
    peek = function(key, now, window, bucket, limit, now_us, cost)
      local count = holding(key, now)
      cost = cost or 1
      return count, count + cost > limit and retry_in(key, now, count, cost, limit) or 0, nil
    end,
    -- ms until every lease held now has run out
    reset = function(key, now, window, bucket, count, state)
      if count == 0 then return 0 end
      local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      return last[2] and tonumber(last[2]) - now or 0
    end,
    -- hold `cost` places under the request's lease when there is room (decide.lua's contract): the
    -- leases that ran out are dropped first, so the set holds at most `limit` members
    take = function(key, now, window, bucket, limit, now_us, totals_bucket, cost, lease)
      if lease == '' then error('concurrency: a request needs a lease to hold places under') end
      redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
      local count = redis.call('ZCARD', key)
      if count + cost > limit then return count, retry_in(key, now, count, cost, limit), nil, nil, false end
      local names, added = members(lease, cost), {}
      for i, name in ipairs(names) do added[2 * i - 1], added[2 * i] = now + window, name end
      local before = count > 0 and strategies.concurrency.reset(key, now, window, bucket, count) or nil
      redis.call('ZADD', key, unpack(added))
      redis.call('PEXPIRE', key, window)
      return count, 0, names, nil, true, window, before
    end,
    undo = function(key, now, names)
      redis.call('ZREM', key, unpack(names))
    end,
    -- give back the places a request held (its response is done)
    release = function(key, lease, cost)
      redis.call('ZREM', key, unpack(members(lease, cost)))
    end,
  }
end
