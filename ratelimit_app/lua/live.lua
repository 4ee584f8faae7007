-- live: what the admin's live page shows for some subjects of one policy, read only. The caller
-- sends a batch of subjects and a budget, so one call stays short whatever the policy's size.
--
-- KEYS the counters of the subjects (the live index lists them)
-- ARGV[1] now in milliseconds, or '' to use the server's TIME
-- ARGV[2] strategy, ARGV[3] window (ms), ARGV[4] bucket (ms)
-- ARGV[5] how many fields the call may read: it stops after the key that spends them (a
--         sliding_window counter may need up to half its buckets)
-- ARGV[6..] for a token bucket, the limit in effect for each key (its rate depends on it)
-- Returns {now, how many keys were read, then per key read: count, reset (ms)}.

local now = tonumber(ARGV[1])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
local strategy = strategies[ARGV[2]]
local window, bucket = tonumber(ARGV[3]), tonumber(ARGV[4])

local budget = tonumber(ARGV[5])

local result = {now, 0}
local spent = 0
for i, key in ipairs(KEYS) do
  -- otherwise an unreachable limit: the live page needs the count, not when the next request fits
  local count, _, state = strategy.peek(key, now, window, bucket, tonumber(ARGV[5 + i]) or math.huge)
  result[#result + 1] = count
  result[#result + 1] = count > 0 and strategy.reset(key, now, window, bucket, count, state) or 0
  result[2] = i
  spent = spent + (type(state) == 'table' and state.fields_read or 1)
  if spent >= budget then break end
end
return result
