-- settle: requests of metered policies (tokens, content-bytes) used more or less than the estimate they
-- were admitted on; their counters move by the difference, in the window or period the estimate was
-- charged in (a counter whose window has ended, or that is gone, is left alone: its units no longer
-- count). Self-contained and sent with EVAL beside the give-back of places, without waiting for its reply.
-- ARGV[1]     the moment in ms ('' for the server's TIME; tests give theirs), read only by a token bucket
-- KEYS[i]     a counter of a metered policy (all in one slot)
-- ARGV[4i-2]  its layout: 'p' count * 1000000 + window or period number (fixed_window, calendar_quota),
--             's' a series of buckets in a hash (sliding_window, series.lua), 't' an arrival time in us
--             (token_bucket, GCRA)
-- ARGV[4i-1]  the units: more (positive) or back (negative)
-- ARGV[4i]    'p': the number of the window charged; 's': its bucket; 't': the interval per unit (us)
-- ARGV[4i+1]  't': the capacity (burst); else unused
-- Units given back never take a count below zero; units added stop at MOST (a count that stays exact in
-- Lua's numbers): usage beyond the limit is debt, refused until it has left the window.
local PACK, MOST = 1000000, 8000000000
local TAT_AHEAD = 315360000000000 -- us: ten years, the farthest a token bucket's debt reaches

local function packed(key, units, number)
  local stored = tonumber(redis.call('GET', key))
  if not stored or stored % PACK ~= number then return end -- the window ended: nothing to move
  local count = (stored - stored % PACK) / PACK
  units = math.min(math.max(units, -count), MOST - count)
  if units ~= 0 then redis.call('INCRBY', key, string.format('%.0f', units * PACK)) end
end

local function series(key, units, bucket)
  local v = redis.call('HMGET', key, 'c', 'n', 't', bucket)
  local cleaned, newest, total, here = tonumber(v[1]), tonumber(v[2]), tonumber(v[3]) or 0, tonumber(v[4]) or 0
  if not cleaned or not newest then return end
  if bucket > newest then -- the worker's clock ahead of the charge: it went to the newest bucket
    bucket = newest
    here = tonumber(redis.call('HGET', key, bucket)) or 0
  end
  if bucket < cleaned then return end -- its units left the window and were subtracted
  units = math.min(math.max(units, -here), MOST - total)
  if units ~= 0 then
    redis.call('HINCRBY', key, bucket, units)
    redis.call('HINCRBY', key, 't', units)
  end
end

local function arrival(key, units, interval, capacity, now_us)
  local tat = tonumber(redis.call('GET', key))
  local moved
  if units > 0 then
    moved = math.min(math.max(tat or now_us, now_us) + units * interval, now_us + TAT_AHEAD)
  elseif tat and tat > now_us then
    moved = math.max(tat + units * interval, now_us) -- back to a full bucket at most
  else
    return -- a full bucket: nothing to give back
  end
  local cell = interval * capacity -- as token_bucket.lua's lifetime: to the end of the cell after the TAT's
  local life = math.ceil(((math.floor(moved / cell) + 2) * cell - now_us) / 1000)
  redis.call('SET', key, string.format('%.0f', moved), 'PX', life)
end

local now_us
for i, key in ipairs(KEYS) do
  local layout, units, anchor = ARGV[4 * i - 2], tonumber(ARGV[4 * i - 1]), tonumber(ARGV[4 * i])
  if layout == 'p' then
    packed(key, units, anchor)
  elseif layout == 's' then
    series(key, units, anchor)
  elseif layout == 't' then
    if not now_us then
      if ARGV[1] ~= '' then
        now_us = tonumber(ARGV[1]) * 1000
      else
        local time = redis.call('TIME')
        now_us = time[1] * 1000000 + time[2]
      end
    end
    arrival(key, units, anchor, tonumber(ARGV[4 * i + 1]), now_us)
  end
end
return 0
