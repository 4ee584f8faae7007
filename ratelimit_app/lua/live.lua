-- live: what the admin's live page shows for one policy, read only.
--
-- KEYS[1] live index of the policy (sorted set "<subject hash> <limit>[*] <display>" -> last seen, ms)
-- KEYS[2] totals of the policy: a hash "<key>:<window number>" holds a = allowed, d = denied
-- ARGV[1] now in milliseconds, or '' to use the server's TIME
-- ARGV[2] strategy, ARGV[3] limit, ARGV[4] window (ms), ARGV[5] bucket (ms; a token bucket's burst, 0 = the limit)
-- ARGV[6], ARGV[7] what goes before and after the subject hash to make a counter key
-- (all counters of a policy share that shape; on a cluster this read is per node, see README)
-- Returns {now, allowed, denied, then per subject seen within the window: member, count, reset (ms)}.

local now = tonumber(ARGV[1])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
local strategy = strategies[ARGV[2]]
local limit, window, bucket = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

local totals = redis.call('HMGET', KEYS[2] .. ':' .. math.floor(now / window), 'a', 'd')
local allowed, denied = tonumber(totals[1]) or 0, tonumber(totals[2]) or 0

local result = {now, allowed, denied}
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. (now - window), '+inf')
for _, member in ipairs(members) do
  local hash = string.match(member, '^(%S+)')
  local key = ARGV[6] .. hash .. ARGV[7]
  -- the limit in effect for this subject, as the member records it (a token bucket's rate depends on it)
  local subject_limit = tonumber(string.match(member, '^%S+ (%d+)')) or limit
  local count, retry, state = strategy.peek(key, now, window, bucket, subject_limit)
  if count > 0 then
    local reset = strategy.reset(key, now, window, bucket, count, state)
    result[#result + 1] = member
    result[#result + 1] = count
    result[#result + 1] = reset
  end
end
return result
