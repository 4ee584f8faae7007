-- concurrency: the requests of a subject in progress now. One sorted set per subject: a member per
-- unit a request holds, "<lease>:<n>" (the lease is the request's own, made by the worker before it
-- asks), scored by when it stops counting: admitted + window, so a worker killed mid-request never
-- holds a place for longer than the window. The worker gives the places back when the request ends
-- (release.lua), which may leave a mark scored below zero (see there); the window only matters when
-- it cannot. Times are integer milliseconds.
do
  local CHUNK = 1000 -- members per ZADD or ZREM: Lua's unpack() has a bound

  local function holding(key, now)
    return redis.call('ZCOUNT', key, '(' .. now, '+inf')
  end

  -- ms until `cost` places may be free: a request usually ends long before its lease does, so a
  -- second, unless the leases say sooner (the client then asks again: a guess, never a promise)
  local function retry_in(key, now, count, cost, limit)
    if cost > limit then return 1000 end
    local freeing = redis.call('ZRANGEBYSCORE', key, '(' .. now, '+inf', 'WITHSCORES',
      'LIMIT', count + cost - limit - 1, 1)
    return math.min(1000, tonumber(freeing[2]) - now)
  end

  local function members(lease, cost)
    local names = {}
    for i = 1, cost do names[i] = lease .. ':' .. i end
    return names
  end

  -- the members not there yet, scored `score`; returns how many were added
  local function add(key, score, names)
    local added = 0
    for from = 1, #names, CHUNK do
      local scored = {}
      for i = from, math.min(#names, from + CHUNK - 1) do
        scored[#scored + 1] = score
        scored[#scored + 1] = names[i]
      end
      added = added + redis.call('ZADD', key, 'NX', unpack(scored))
    end
    return added
  end

  local function remove(key, names)
    for from = 1, #names, CHUNK do
      redis.call('ZREM', key, unpack(names, from, math.min(#names, from + CHUNK - 1)))
    end
  end

  -- ms until every lease held now has run out (0: none is held)
  local function empty_in(key, now, count)
    if count == 0 then return 0 end
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    return last[2] and tonumber(last[2]) - now or 0
  end

  strategies.concurrency = {
    look = function(key, limit, terms, cost)
      local now = clock.ms()
      local count = holding(key, now)
      local retry = count + cost > limit and retry_in(key, now, count, cost, limit) or 0
      return count, retry, empty_in(key, now, count), 2
    end,
    -- hold `cost` places under the request's lease when there is room: the leases and marks that ran
    -- out are dropped first, so the set holds at most `limit` places. The state is the members written.
    charge = function(key, limit, terms, cost, lease)
      if lease == '' then error('concurrency: a request needs a lease to hold places under') end
      local now = clock.ms()
      local window = contract.window(terms)
      redis.call('ZREMRANGEBYSCORE', key, -now, now)
      local count = redis.call('ZCOUNT', key, 0, '+inf')
      if count + cost > limit then
        return false, count, math.max(1, retry_in(key, now, count, cost, limit)), empty_in(key, now, count), -2
      end
      local before = count > 0 and empty_in(key, now, count) or -1
      local names = members(lease, cost)
      if add(key, now + window, names) < cost and tonumber(redis.call('ZSCORE', key, names[1])) < 0 then
        -- the worker gave this lease back before this call ran (it stopped waiting for it): hold nothing
        remove(key, names)
      end
      redis.call('PEXPIRE', key, window)
      return true, count, 0, window, before, names
    end,
    refund = function(key, names)
      remove(key, names)
    end,
  }
end
