-- activity: what a policy records for the operator beside its counters, in two keys per policy,
-- written by the workers a batch at a time (tally.lua), never by a decision.
--
-- The live index, a sorted set of "<subject hash> <limit>[*] <display>" scored by the time (ms) at
-- which the subject's counter will be empty, rounded up to the policy's totals bucket; a subject the
-- policy refused is scored BLOCKED higher, so that the index, when full, evicts the quietest
-- subjects first and never a blocked one while others remain.
--
-- The totals, a hash of counts per totals bucket: 'a<bucket>' requests counted, 'd<bucket>' requests
-- refused (by a shadow policy: that would have been), summed by the reader over the same window
-- the counters use; and 'e<bucket>' the number of subjects whose counter empties in that bucket, so
-- the subjects still active are counted even when the index cannot hold them all. The reader sums
-- at most window / bucket fields of each. The buckets that leave the window are rolled into
-- 'A<window number>' and 'D<window number>' (the trend), kept for the last trend_windows(window)
-- windows: once per bucket, never per decision.
-- Times are integer milliseconds.
local activity = {}
local BLOCKED = 2 ^ 43 -- about 278 years of ms: above any time, exact in a double with a time added

activity.BLOCKED = BLOCKED

-- how many windows the trend keeps: the last hour, at least 2 and at most 60 windows (live.trend_windows)
local function trend_windows(window)
  return math.max(2, math.min(60, math.floor(3600000 / window)))
end
activity.trend_windows = trend_windows

-- outlives every counter of the policy: the one that lives longest, a token bucket's, ends at most three
-- fill times (each at most window + bucket ms) ahead: its TAT one ahead, the key up to two past it
local LIFE = 3

local function expire(key, window, bucket)
  redis.call('PEXPIRE', key, LIFE * (window + bucket))
end

local function expire_totals(key, window, bucket)
  -- and the totals outlive the trend too
  redis.call('PEXPIRE', key, math.max(LIFE * (window + bucket), (trend_windows(window) + 1) * window))
end

-- add the values of buckets leaving the window to their window's trend field, and forget the
-- trend fields older than the trend (each once: the mark '<S>c' is the oldest window kept)
local function roll_up(totals, series_name, buckets, window, bucket)
  local values = redis.call('HMGET', totals, unpack(buckets))
  local upper = string.upper(series_name)
  local per = window / bucket
  local rolled = {}
  for k, field in ipairs(buckets) do
    local value = tonumber(values[k])
    if value then
      local number = math.floor(tonumber(string.sub(field, 2)) / per)
      rolled[number] = (rolled[number] or 0) + value
    end
  end
  local newest = nil
  for number, value in pairs(rolled) do
    redis.call('HINCRBY', totals, upper .. number, value)
    if newest == nil or number > newest then newest = number end
  end
  if newest then
    local keep_from = newest - trend_windows(window) + 1
    local mark = upper .. 'c'
    local cleaned = tonumber(redis.call('HGET', totals, mark)) or keep_from
    if cleaned < keep_from then
      local over = {}
      for i = cleaned, math.min(keep_from - 1, cleaned + 60) do over[#over + 1] = upper .. i end
      redis.call('HDEL', totals, unpack(over))
    end
    redis.call('HSET', totals, mark, keep_from)
  end
end

local CHUNK = 256 -- index entries a ZADD writes at most (its arguments stay within what Lua can unpack)

-- put the subjects a worker saw in the index: ARGV[first ..] holds `count` (score, member) pairs.
-- When the index holds more than `size`, what has ended goes first, then the quietest.
function activity.index(live, args, first, count, size, now, window, bucket)
  local last = first + 2 * count - 1
  for start = first, last, 2 * CHUNK do
    redis.call('ZADD', live, unpack(args, start, math.min(start + 2 * CHUNK - 1, last)))
  end
  if redis.call('ZCARD', live) > size then
    redis.call('ZREMRANGEBYSCORE', live, '-inf', now)
    redis.call('ZREMRANGEBYSCORE', live, BLOCKED, BLOCKED + now)
    redis.call('ZREMRANGEBYRANK', live, 0, -size - 1)
  end
  expire(live, window, bucket)
end

-- forget the buckets of active subjects that are over (each once, at most the live span)
function activity.forget_ended(totals, now, window, bucket)
  local first = math.floor(now / bucket) + 1 -- older buckets are over
  local cleaned = tonumber(redis.call('HGET', totals, 'ec')) or first
  if cleaned < first then
    local over = {}
    for i = cleaned, math.min(first - 1, cleaned + (window / bucket) + 2) do over[#over + 1] = 'e' .. i end
    redis.call('HDEL', totals, unpack(over))
  end
  redis.call('HSET', totals, 'ec', first)
  -- every subject counted since empties within the window and a bucket of it, which this covers
  expire_totals(totals, window, bucket)
end

-- `delta` more subjects (fewer, when negative) empty in bucket `number`; a bucket already over is
-- left alone (it is deleted, or about to be)
function activity.move(totals, number, delta, now, bucket)
  if number > math.floor(now / bucket) and delta ~= 0 then
    redis.call('HINCRBY', totals, 'e' .. number, delta)
  end
end

-- delete a series' buckets that left the window (each once, at most the window's bucket count),
-- rolling them into the trend; the mark '<s>c' is the oldest bucket that may still be present
local function clean(totals, series_name, oldest, window, bucket)
  local mark = series_name .. 'c'
  local cleaned = tonumber(redis.call('HGET', totals, mark))
  if cleaned and cleaned >= oldest then return end -- never back: a late count must not undo a roll-up
  if cleaned then
    local over = {}
    -- every field present was written while `cleaned` was the oldest, so none lies beyond this
    for i = cleaned, math.min(oldest - 1, cleaned + window / bucket - 1) do over[#over + 1] = series_name .. i end
    roll_up(totals, series_name, over, window, bucket)
    redis.call('HDEL', totals, unpack(over))
  end
  redis.call('HSET', totals, mark, oldest)
end

-- count `amount` requests (default one), allowed ('a') or refused ('d'): one HINCRBY; when a bucket
-- starts, both series forget the buckets that left the window (into the trend)
function activity.count(totals, series_name, now, window, bucket, amount)
  local current = math.floor(now / bucket)
  amount = amount or 1
  if redis.call('HINCRBY', totals, series_name .. current, amount) == amount then
    local oldest = current - window / bucket + 1
    clean(totals, 'a', oldest, window, bucket)
    clean(totals, 'd', oldest, window, bucket)
    expire_totals(totals, window, bucket)
  end
end

-- add `amount` requests a worker counted in bucket `number` ('a' admitted, 'd' refused from its deny
-- cache; the decision itself added nothing): as activity.count would have at that bucket, or, for a
-- bucket already rolled into the trend (the worker reported it late), to its window's trend field
function activity.add(totals, series_name, number, amount, window, bucket)
  local mark = tonumber(redis.call('HGET', totals, series_name .. 'c'))
  if mark and number < mark then
    local window_number = math.floor(number / (window / bucket))
    redis.call('HINCRBY', totals, string.upper(series_name) .. window_number, amount)
  else
    activity.count(totals, series_name, number * bucket, window, bucket, amount)
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

-- -> per window of the trend, oldest first: allowed, denied (read only; 2 fields per window, and
-- the buckets not rolled up yet: at most window / bucket of each series, from its mark on)
function activity.trend(totals, now, window, bucket, windows)
  local per = window / bucket
  local first = math.floor(now / window) - windows + 1
  local fields = {}
  for number = first, first + windows - 1 do
    fields[#fields + 1] = 'A' .. number
    fields[#fields + 1] = 'D' .. number
  end
  local values = redis.call('HMGET', totals, unpack(fields))
  local result = {}
  for i = 1, 2 * windows do result[i] = tonumber(values[i]) or 0 end
  local marks = redis.call('HMGET', totals, 'ac', 'dc')
  for s, series_name in ipairs({'a', 'd'}) do
    local mark = tonumber(marks[s])
    if mark then
      local names = {}
      for b = mark, mark + per - 1 do names[#names + 1] = series_name .. b end
      for k, value in ipairs(redis.call('HMGET', totals, unpack(names))) do
        local slot = math.floor((mark + k - 1) / per) - first + 1
        if value and slot >= 1 and slot <= windows then
          result[2 * slot - 2 + s] = result[2 * slot - 2 + s] + tonumber(value)
        end
      end
    end
  end
  return result
end
