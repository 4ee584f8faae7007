-- live: what the admin's live page shows for some subjects of one policy, read only. The caller
-- sends a batch of subjects and a budget, so one call stays short whatever the policy's size.
--
-- KEYS the counters of the subjects (the live index lists them)
-- ARGV[1] now in milliseconds, or '' to use the server's TIME
-- ARGV[2] strategy, ARGV[3] the policy's figures as its terms give them after their first field
--         (decide.lua: "<window> <totals bucket> <bucket>", in hex)
-- ARGV[4] how many fields the call may read: it stops after the key that spends them (a
--         sliding_window counter may need up to half its buckets)
-- ARGV[5..] for a token bucket, the limit in effect for each key (its rate depends on it)
-- Returns {now, how many keys were read, then per key read: count, reset (ms)}.

clock.start(ARGV[1])
local now = clock.ms() -- read once: a fixed window's reset is then known
local strategy = strategies[ARGV[2]]
local terms = '0000000000000 ' .. ARGV[3] -- the terms' first field (13 digits) is decide's alone
local budget = tonumber(ARGV[4])

local result = {now, 0}
local spent = 0
for i, key in ipairs(KEYS) do
  -- otherwise an unreachable limit: the live page needs the count, not when the next request fits
  local count, _, reset, fields = contract.look(strategy, key, tonumber(ARGV[4 + i]) or math.huge, terms, 1)
  result[#result + 1] = count
  result[#result + 1] = count > 0 and reset or 0
  result[2] = i
  spent = spent + fields
  if spent >= budget then break end
end
return result
