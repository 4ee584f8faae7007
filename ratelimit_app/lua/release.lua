-- release: a request is over; it gives back the places its lease holds in in-flight (concurrency)
-- policies. Self-contained and sent with EVAL, so it never meets a server that lacks it, and sent
-- without waiting for its reply (the request is already answered).
-- KEYS       the counters of the in-flight policies the request may hold places in (one slot)
-- ARGV[1]    the request's lease; ARGV[2] the units it took in each (its cost)
-- ARGV[2+i]  policy i's window (ms)
-- A counter that holds nothing under the lease (its decision was refused, its lease ran out, or the
-- decision is still queued behind a busy server after the worker gave up on it) keeps a mark for
-- a window: the lease's first member scored -(now + window), below every place; concurrency.lua's
-- take finds it and takes nothing. Times are integer milliseconds.
local lease, cost = ARGV[1], tonumber(ARGV[2])
local first = lease .. ':1'
for i, key in ipairs(KEYS) do
  local removed = redis.call('ZREM', key, first)
  for from = 2, cost, 1000 do -- the other units, in bounded ZREMs
    local names = {}
    for unit = from, math.min(cost, from + 999) do names[#names + 1] = lease .. ':' .. unit end
    removed = removed + redis.call('ZREM', key, unpack(names))
  end
  if removed == 0 then
    local time, window = redis.call('TIME'), tonumber(ARGV[2 + i])
    redis.call('ZADD', key, -(time[1] * 1000 + math.floor(time[2] / 1000) + window), first)
    if redis.call('PTTL', key) < window then redis.call('PEXPIRE', key, window) end
  end
end
return 0
