-- series: requests counted in buckets of `bucket` ms inside one hash, with their running total, so
-- that the count of the last `window` ms costs one HMGET whatever the number of buckets (each bucket
-- is subtracted once, when it leaves the window). Fields, after a prefix p:
--   p..'t' running total   p..'c' oldest bucket number that may still be present
--   p..'n' newest bucket written   p..<bucket number> requests counted in that bucket
-- Invariant: n - c < window / bucket, so a read never touches more than half that many bucket fields
-- (the buckets that left the window, or those still in it, whichever are fewer).
-- Times are integer milliseconds.
local series = {}

local function names(p, first, last)
  local list = {}
  for i = first, last do list[#list + 1] = p .. i end
  return list
end

-- -> requests in the window ending at now, state for series.add / series.freed_in
function series.read(key, p, now, window, bucket)
  local current = math.floor(now / bucket)
  local oldest = current - window / bucket + 1
  local v = redis.call('HMGET', key, p .. 't', p .. 'c', p .. 'n', p .. current)
  local total, cleaned, newest = tonumber(v[1]) or 0, tonumber(v[2]), tonumber(v[3])
  local state = {p = p, current = current, oldest = oldest, here = tonumber(v[4]) or 0, stale = {}, newest = newest,
    cleaned = cleaned, fields_read = 4}
  if newest == nil then
    total = 0
  elseif newest < oldest then
    -- everything left the window: what remains is deleted by the next add
    state.stale, state.newest, state.cleaned, total = names(p, cleaned, newest), nil, nil, 0
  elseif cleaned < oldest then
    state.stale = names(p, cleaned, oldest - 1)
    if #state.stale <= newest - oldest + 1 then
      for _, value in ipairs(redis.call('HMGET', key, unpack(state.stale))) do total = total - (tonumber(value) or 0) end
    else  -- fewer buckets are left in the window than have left it: add those up instead
      total = 0
      for _, value in ipairs(redis.call('HMGET', key, unpack(names(p, oldest, newest)))) do total = total + (tonumber(value) or 0) end
    end
    state.fields_read = math.min(#state.stale, newest - oldest + 1)
  end
  state.count = total
  return total, state
end

-- count `delta` more requests in the current bucket (one HSET, plus an HDEL when buckets left)
function series.add(key, state, delta)
  local p = state.p
  if #state.stale > 0 then redis.call('HDEL', key, unpack(state.stale)) end
  local cleaned = math.max(state.cleaned or state.current, state.oldest)
  redis.call('HSET', key, p .. state.current, state.here + delta, p .. 't', state.count + delta,
    p .. 'c', cleaned, p .. 'n', state.current)
end

-- ms until `needed` of the counted requests have left the window (reads the live buckets: only
-- asked when a subject is at its limit)
function series.freed_in(key, state, now, window, bucket, needed)
  local first = math.max(state.cleaned or state.current, state.oldest)
  local values = redis.call('HMGET', key, unpack(names(state.p, first, state.current)))
  local freed = 0
  for i, value in ipairs(values) do
    freed = freed + (tonumber(value) or 0)
    if freed >= needed then return (first + i - 1) * bucket + window - now end
  end
  return window
end

-- ms until every counted request has left the window (0 when none is counted)
function series.empty_in(state, now, window, bucket)
  if state.count == 0 or state.newest == nil then return 0 end
  return state.newest * bucket + window - now
end
