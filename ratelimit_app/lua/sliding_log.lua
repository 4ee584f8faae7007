-- sliding_log: one sorted set per subject, score = admission time, member = "<time>-<n>" where n
-- is the number of requests already in the window: unique even within one clock tick (n grows with
-- every admission at the same time, and the members of that time cannot have left the window).
-- Exact; holds at most `limit` members since only admitted requests are added.
-- Times are integer milliseconds.
strategies.sliding_log = {
  peek = function(key, now, window, bucket, limit)
    local count = redis.call('ZCOUNT', key, '(' .. (now - window), '+inf')
    local retry = 0
    if count >= limit then
      local freeing = redis.call('ZRANGEBYSCORE', key, '(' .. (now - window), '+inf', 'WITHSCORES', 'LIMIT', count - limit, 1)
      retry = tonumber(freeing[2]) + window - now
    end
    return count, retry, nil
  end,
  reset = function(key, now, window, bucket, count, state)
    if count == 0 then return 0 end
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    return tonumber(newest[2]) + window - now
  end,
  commit = function(key, now, window, bucket, count, state)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
    redis.call('ZADD', key, now, now .. '-' .. count)
    redis.call('PEXPIRE', key, window)
    return window
  end,
}
