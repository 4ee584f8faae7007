-- activity: what a policy records for the operator beside its counters, in two keys per policy.
--
-- The live index, a sorted set of "<subject hash> <limit>[*] <display>" scored by the time (ms) at
-- which the subject's counter will be empty, rounded up to the policy's totals bucket; a subject the
-- policy refused is scored BLOCKED higher, so that the index, when full, evicts the quietest
-- subjects first and never a blocked one while others remain. An entry is rewritten only when that
-- time moves to another bucket, so a busy subject costs the index nothing most of the time.
--
-- The totals, a hash of three series of the totals bucket (series.lua): 'a' requests counted,
-- 'd' requests refused (by a shadow policy: that would have been), over the same window the
-- counters use; and 'e<bucket>' the number of subjects whose counter empties in that bucket, so
-- the subjects still active are counted even when the index cannot hold them all.
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

-- count one request, allowed ('a') or refused ('d')
function activity.count(totals, series_name, now, window, bucket)
  local _, state = series.read(totals, series_name, now, window, bucket)
  series.add(totals, state, 1)
  if state.newest ~= state.current then expire(totals, window, bucket) end
end

-- -> allowed, denied, active subjects (read only)
function activity.totals(totals, now, window, bucket)
  local allowed = series.read(totals, 'a', now, window, bucket)
  local denied = series.read(totals, 'd', now, window, bucket)
  local first = math.floor(now / bucket) + 1
  local fields = {}
  for i = first, first + window / bucket + 2 do fields[#fields + 1] = 'e' .. i end
  local active = 0
  for _, value in ipairs(redis.call('HMGET', totals, unpack(fields))) do active = active + (tonumber(value) or 0) end
  return allowed, denied, math.max(active, 0)
end

-- the bucket in which a counter empties, `reset` ms from now
function activity.bucket_of(now, reset, bucket)
  return math.ceil((now + reset) / bucket)
end
