-- activity: what a policy records for the operator beside its counters, in two keys per policy.
--
-- The live index, a sorted set of "<subject hash> <limit>[*] <display>" scored by the time (ms) at
-- which the subject's counter will be empty, rounded up to the policy's totals bucket; a subject the
-- policy refused is scored BLOCKED higher, so that the index, when full, evicts the quietest
-- subjects first and never a blocked one while others remain. An entry is rewritten only when that
-- time moves to another bucket, so a busy subject costs the index nothing most of the time.
--
-- The totals, a hash of counts per totals bucket: 'a<bucket>' requests counted, 'd<bucket>' requests
-- refused (by a shadow policy: that would have been), summed by the reader over the same window
-- the counters use; and 'e<bucket>' the number of subjects whose counter empties in that bucket, so
-- the subjects still active are counted even when the index cannot hold them all. A decision adds
-- to them with one HINCRBY; the reader sums at most window / bucket fields of each.
-- Times are integer milliseconds.
local activity = {}
local BLOCKED = 2 ^ 43 -- about 278 years of ms: above any time, exact in a double with a time added

activity.BLOCKED = BLOCKED

local function expire(key, window, bucket)
  -- outlives every counter of the policy (at most window + bucket ms ahead)
  redis.call('PEXPIRE', key, 2 * (window + bucket))
end

-- put a subject in the index; when it is new and the index is full, drop what has ended, then the quietest
function activity.index(live, member, score, size, now, window, bucket)
  if redis.call('ZADD', live, score, member) == 1 and redis.call('ZCARD', live) > size then
    redis.call('ZREMRANGEBYSCORE', live, '-inf', now)
    redis.call('ZREMRANGEBYSCORE', live, BLOCKED, BLOCKED + now)
    redis.call('ZREMRANGEBYRANK', live, 0, -size - 1)
  end
  expire(live, window, bucket)
end

-- a subject's counter now empties in bucket `after` instead of `before` (nil: it was empty)
function activity.moved(totals, before, after, now, window, bucket)
  local first = math.floor(now / bucket) + 1 -- older buckets are over and may be deleted already
  if redis.call('HINCRBY', totals, 'e' .. after, 1) == 1 then
    -- a bucket starts being used: forget the ones that are over (each once, at most the live span)
    local cleaned = tonumber(redis.call('HGET', totals, 'ec')) or first
    if cleaned < first then
      local over = {}
      for i = cleaned, math.min(first - 1, cleaned + (window / bucket) + 2) do over[#over + 1] = 'e' .. i end
      redis.call('HDEL', totals, unpack(over))
    end
    redis.call('HSET', totals, 'ec', first)
  end
  if before and before >= first then redis.call('HINCRBY', totals, 'e' .. before, -1) end
  expire(totals, window, bucket)
end

-- count one request, allowed ('a') or refused ('d'): one HINCRBY; when a bucket starts, the buckets
-- that left the window are deleted (each once, at most the window's bucket count)
function activity.count(totals, series_name, now, window, bucket)
  local current = math.floor(now / bucket)
  if redis.call('HINCRBY', totals, series_name .. current, 1) == 1 then
    local oldest = current - window / bucket + 1
    local mark = series_name .. 'c'
    local cleaned = tonumber(redis.call('HGET', totals, mark)) or oldest
    if cleaned < oldest then
      local over = {}
      -- every field present was written while `cleaned` was the oldest, so none lies beyond this
      for i = cleaned, math.min(oldest - 1, cleaned + window / bucket - 1) do over[#over + 1] = series_name .. i end
      redis.call('HDEL', totals, unpack(over))
    end
    redis.call('HSET', totals, mark, oldest)
    expire(totals, window, bucket)
  end
end

local function sum(totals, prefix, first, last)
  local fields = {}
  for i = first, last do fields[#fields + 1] = prefix .. i end
  local total = 0
  for _, value in ipairs(redis.call('HMGET', totals, unpack(fields))) do total = total + (tonumber(value) or 0) end
  return total
end

-- -> allowed, denied, active subjects (read only; window / bucket fields per figure)
function activity.totals(totals, now, window, bucket)
  local current = math.floor(now / bucket)
  local oldest = current - window / bucket + 1
  local allowed = sum(totals, 'a', oldest, current)
  local denied = sum(totals, 'd', oldest, current)
  local active = sum(totals, 'e', current + 1, current + window / bucket + 2)
  return allowed, denied, math.max(active, 0)
end

-- the bucket in which a counter empties, `reset` ms from now
function activity.bucket_of(now, reset, bucket)
  return math.ceil((now + reset) / bucket)
end
