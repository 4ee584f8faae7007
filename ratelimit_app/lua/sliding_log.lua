-- sliding_log: one sorted set per subject, score = admission time, member = "<time>-<n>" where n
-- counts the members already at that time, so requests within one clock tick never collide.
-- Exact; holds at most `limit` members since only admitted requests are added.
-- Times are integer milliseconds.
strategies.sliding_log = {
  peek = function(key, now, window, bucket, limit)
    local since = '(' .. (now - window)
    local count = redis.call('ZCOUNT', key, since, '+inf')
    local reset, retry = 0, 0
    if count > 0 then
      local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      reset = tonumber(newest[2]) + window - now
    end
    if count >= limit then
      local freeing = redis.call('ZRANGEBYSCORE', key, since, '+inf', 'WITHSCORES', 'LIMIT', count - limit, 1)
      retry = tonumber(freeing[2]) + window - now
    end
    return count, reset, retry, nil
  end,
  commit = function(key, now, window, bucket, count, state)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
    local same_tick = redis.call('ZCOUNT', key, now, now)
    redis.call('ZADD', key, now, now .. '-' .. same_tick)
    redis.call('PEXPIRE', key, window)
    return window
  end,
}
