-- release: requests are over; they give back the places their leases hold in in-flight
-- (concurrency) policies. Self-contained and sent with EVAL, so it never meets a server that lacks
-- it, and sent without waiting for its reply (the requests are already answered).
-- KEYS[i]     a counter of an in-flight policy (all in one slot)
-- ARGV[3i-2]  the lease of the request that may hold places in it, ARGV[3i-1] the units it took
--             (its cost), ARGV[3i] the policy's window (ms)
-- A counter that holds nothing under the lease (its decision was refused, its lease ran out, or the
-- decision is still queued behind a busy server after the worker gave up on it) keeps a mark for
-- a window: the lease's first member scored -(now + window), below every place; concurrency.lua's
-- charge finds it and takes nothing. Times are integer milliseconds.
for i, key in ipairs(KEYS) do
  local lease, cost, window = ARGV[3 * i - 2], tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i])
  local removed = redis.call('ZREM', key, lease .. ':1')
  for from = 2, cost, 1000 do -- the other units, in bounded ZREMs (Lua's unpack() has a bound)
    local names = {}
    for unit = from, math.min(cost, from + 999) do names[#names + 1] = lease .. ':' .. unit end
    removed = removed + redis.call('ZREM', key, unpack(names))
  end
  if removed == 0 then
    local time = redis.call('TIME')
    redis.call('ZADD', key, -(time[1] * 1000 + math.floor(time[2] / 1000) + window), lease .. ':1')
    if redis.call('PTTL', key) < window then redis.call('PEXPIRE', key, window) end
  end
end
return 0
