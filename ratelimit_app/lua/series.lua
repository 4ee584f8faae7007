-- series: requests counted in buckets of `bucket` ms inside one hash, with their running total, so
-- that the count of the last `window` ms costs one HMGET whatever the number of buckets (each bucket
-- is subtracted once, when it leaves the window). Fields:
--   't' running total   'c' oldest bucket number that may still be present
--   'n' newest bucket written   <bucket number> requests counted in that bucket
-- Invariant: n - c < window / bucket, so a read never touches more than half that many bucket fields
-- (the buckets that left the window, or those still in it, whichever are fewer).
-- Straight-line: what a read found is passed on as values, never kept in a table; lists of bucket
-- names are only made when buckets left the window (once per bucket) or for a subject at its limit.
-- Times are integer milliseconds.
local series = {}
do
  local function names(first, last)
    local list = {}
    for i = first, last do list[#list + 1] = i end
    return list
  end

  local function sum(key, first, last)
    local total = 0
    for _, value in ipairs(redis.call('HMGET', key, unpack(names(first, last)))) do
      total = total + (tonumber(value) or 0)
    end
    return total
  end

  -- -> requests in the window ending at now, the current bucket's requests, then the 'n' and 'c' fields
  -- as stored (nil: no series) for series.add / series.freed_in, how many fields the read cost, and for
  -- series.add the current bucket's field name and the 'c' field's text: a number argument to a command
  -- is formatted at every command (~3k instructions), so each figure is made text once, or reused as read
  function series.read(key, now, window, bucket)
    local current = math.floor(now / bucket)
    local name = tostring(current) -- as Redis formats an integer below 10^14: the same field
    local oldest = current - window / bucket + 1
    local v = redis.call('HMGET', key, 't', 'c', 'n', name)
    local total, cleaned, here = tonumber(v[1]) or 0, tonumber(v[2]), tonumber(v[4]) or 0
    local newest = v[3] == name and current or tonumber(v[3]) -- the same bucket again: no strtod
    if newest == nil or newest < oldest then return 0, here, newest, cleaned, 4, name, v[2] end -- (everything left)
    if cleaned >= oldest then return total, here, newest, cleaned, 4, name, v[2] end
    local left, live = oldest - cleaned, newest - oldest + 1
    if left <= live then
      total = total - sum(key, cleaned, oldest - 1)
    else -- fewer buckets are left in the window than have left it: add those up instead
      total = sum(key, oldest, newest)
    end
    return total, here, newest, cleaned, math.min(left, live), name, v[2]
  end

  -- count `delta` more requests in the current bucket (one HSET, plus an HDEL when buckets left); `name`
  -- and `cleaned_text` as series.read gave them
  function series.add(key, now, window, bucket, count, here, newest, cleaned, delta, name, cleaned_text)
    local current = math.floor(now / bucket)
    local oldest = current - window / bucket + 1
    if cleaned and cleaned < oldest then -- buckets left the window: their fields go
      redis.call('HDEL', key, unpack(names(cleaned, math.min(newest, oldest - 1))))
    end
    local first = (newest and newest >= oldest) and math.max(cleaned, oldest) or current
    first = first == cleaned and cleaned_text or first == current and name or first
    redis.call('HSET', key, name, here + delta, 't', count + delta, 'c', first, 'n', name)
  end

  -- ms until `needed` of the counted requests have left the window (reads the live buckets: only
  -- asked when a subject is at its limit, so some are counted: `cleaned` is stored)
  function series.freed_in(key, cleaned, now, window, bucket, needed)
    local current = math.floor(now / bucket)
    local first = math.max(cleaned, current - window / bucket + 1)
    local freed = 0
    for i, value in ipairs(redis.call('HMGET', key, unpack(names(first, current)))) do
      freed = freed + (tonumber(value) or 0)
      if freed >= needed then return (first + i - 1) * bucket + window - now end
    end
    return window
  end

  -- ms until every counted request has left the window (0 when none is counted)
  function series.empty_in(count, newest, now, window, bucket)
    if count == 0 then return 0 end
    return newest * bucket + window - now
  end
end
