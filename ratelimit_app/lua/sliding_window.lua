-- sliding_window: one hash per subject, field = absolute bucket number (floor(now / bucket)),
-- value = requests admitted in that bucket. The count is the sum of the window / bucket newest
-- buckets; older fields are deleted on the next commit, so a hash holds at most that many + 1.
-- Times are integer milliseconds.
strategies.sliding_window = {
  peek = function(key, now, window, bucket, limit)
    local current = math.floor(now / bucket)
    local buckets = window / bucket
    local oldest = current - buckets + 1
    local fields = redis.call('HGETALL', key)
    local count, newest, live, stale = 0, nil, {}, {}
    for i = 1, #fields, 2 do
      local index, value = tonumber(fields[i]), tonumber(fields[i + 1])
      if index < oldest then
        stale[#stale + 1] = fields[i]
      elseif index <= current then
        count = count + value
        live[#live + 1] = {index, value}
        if newest == nil or index > newest then newest = index end
      end
    end
    local retry = 0
    if count >= limit then
      -- the oldest buckets must leave the window until one more request fits
      table.sort(live, function(a, b) return a[1] < b[1] end)
      local needed, freed = count - limit + 1, 0
      for _, entry in ipairs(live) do
        freed = freed + entry[2]
        if freed >= needed then
          retry = (entry[1] + buckets) * bucket - now
          break
        end
      end
    end
    return count, retry, {current = current, newest = newest, stale = stale}
  end,
  reset = function(key, now, window, bucket, count, state)
    if state.newest == nil then return 0 end
    return state.newest * bucket + window - now
  end,
  commit = function(key, now, window, bucket, count, state)
    if #state.stale > 0 then redis.call('HDEL', key, unpack(state.stale)) end
    redis.call('HINCRBY', key, state.current, 1)
    redis.call('PEXPIRE', key, window + bucket)
    return state.current * bucket + window - now
  end,
}
