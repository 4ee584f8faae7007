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
-- the subjects still active are counted even when the index cannot hold them all. Requests admitted
-- and refused are added by the workers a moment later, a bucket at a time (tally.lua), so that a
-- decision costs no write here for them. The reader sums at most
-- window / bucket fields of each. The buckets that
-- leave the window are rolled into 'A<window number>' and 'D<window number>' (the trend), kept for the
-- last trend_windows(window) windows: once per bucket, never per decision.
-- Times are integer milliseconds.
local activity = {}
local BLOCKED = 2 ^ 43 -- about 278 years of ms: above any time, exact in a double with a time added

activity.BLOCKED = BLOCKED

-- The blocked entries written lately, by counter key: {member, score}. Where the scripts are a
-- Functions library this is kept between calls (elsewhere it starts empty each call): a subject
-- refused again gets no second, identical mark, and decide.lua looks at its counter before counting.
-- A hint only, never a wrong decision: a forgotten entry costs commands; a stale one (the index lost
-- the mark since) leaves the subject unmarked until its refusals move to another totals bucket.
local marks, marked, MARKS = {}, 0, 10000 -- entries at most, then forgotten all at once

-- how many windows the trend keeps: the last hour, at least 2 and at most 60 windows (live.trend_windows)
local function trend_windows(window)
  return math.max(2, math.min(60, math.floor(3600000 / window)))
end
activity.trend_windows = trend_windows

local function expire(key, window, bucket)
  -- outlives every counter of the policy (at most window + bucket ms ahead)
  redis.call('PEXPIRE', key, 2 * (window + bucket))
end

local function expire_totals(key, window, bucket)
  -- and the totals outlive the trend too
  redis.call('PEXPIRE', key, math.max(2 * (window + bucket), (trend_windows(window) + 1) * window))
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

-- a subject's score: when its counter empties (ms, rounded up to the bucket), plus a fraction that
-- grows with its count (log2 / 64, under 1 ms), so that among subjects emptying together a full
-- index evicts the quietest first
function activity.score(after, bucket, count)
  return after * bucket + math.min(63, math.floor(math.log(count) / math.log(2) + 1e-9)) / 64
end

-- whether a count that grew by `cost` is worth rewriting the subject's score for: it reached 2, 4,
-- 8, ... (log2(limit) writes a window)
function activity.busier(count, cost)
  if cost == 1 then return count >= 2 and bit.band(count, count - 1) == 0 end
  local power = 2 ^ math.floor(math.log(count) / math.log(2) + 1e-9) -- the highest power of 2 reached
  return power >= 2 and power > count - cost
end

-- put a subject in the index; when it is new and the index is full, drop what has ended, then the
-- quietest. `moved`: the subject's counter now empties in another bucket than at its last write
function activity.index(live, member, score, size, now, window, bucket, moved)
  local added = redis.call('ZADD', live, score, member) == 1
  if added and redis.call('ZCARD', live) > size then
    redis.call('ZREMRANGEBYSCORE', live, '-inf', now)
    redis.call('ZREMRANGEBYSCORE', live, BLOCKED, BLOCKED + now)
    redis.call('ZREMRANGEBYRANK', live, 0, -size - 1)
  end
  -- an entry already there (a busier subject's new score) was written with an expiry covering
  -- the bucket it empties in, and an expiry only ever moves later: unless that bucket moved
  if added or moved then expire(live, window, bucket) end
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
    -- once per bucket started, not per subject: every subject counted since empties within the
    -- window and a bucket of it, which this expiry covers (it only ever moves later)
    expire_totals(totals, window, bucket)
  end
  if before and before >= first then redis.call('HINCRBY', totals, 'e' .. before, -1) end
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

-- the bucket in which a counter empties, `reset` ms from now
local function bucket_of(now, reset, bucket)
  return math.ceil((now + reset) / bucket)
end

-- a subject's counter `key` went up by `cost` to `count` for a policy of these `terms` (terms.lua) and now empties
-- `reset` ms from now (before: `before_reset` ms from now; nil: it was empty): its entry in the live
-- index `live` and the totals' count of active subjects follow, when the bucket in which it empties
-- moves, or the count doubles
function activity.counted(live, totals, key, member, terms, now, count, cost, before_reset, reset)
  local bucket, window = terms.totals_bucket, terms.window
  marks[key] = nil -- counted: no longer refused lately
  local after = bucket_of(now, reset, bucket)
  local before = after -- the same reset (a fixed window's repeat request) needs no second bucket
  if before_reset ~= reset then before = before_reset and bucket_of(now, before_reset, bucket) or nil end
  if after ~= before or activity.busier(count, cost) then
    activity.index(live, member, activity.score(after, bucket, count), terms.index_size, now, window, bucket, after ~= before)
  end
  if after ~= before then activity.moved(totals, before, after, now, window, bucket) end
end

-- whether the subject of this counter was refused lately (and has not been counted since)
function activity.refused_lately(key)
  return marks[key] ~= nil
end

-- a request over the limit: the subject is marked blocked in the index, unless its entry already
-- says so (the worker counts the refusal in the totals, tally.lua)
function activity.refused(live, key, member, terms, now, reset)
  local bucket, window = terms.totals_bucket, terms.window
  local score = BLOCKED + bucket_of(now, reset, bucket) * bucket
  local mark = marks[key]
  if mark and mark[1] == member and mark[2] == score then return end
  activity.index(live, member, score, terms.index_size, now, window, bucket, true)
  if not mark then
    if marked >= MARKS then marks, marked = {}, 0 end
    marked = marked + 1
  end
  marks[key] = {member, score}
end
