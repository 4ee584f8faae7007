-- denials: requests that workers refused from their local deny cache, added to the policies' totals
-- (activity.lua) as the decide script would have counted them.
--
-- KEYS the totals of the policies
-- ARGV[1] now in milliseconds, or '' to use the server's TIME
-- ARGV[2..] per key 3 values: how many refusals, window (ms), totals bucket (ms)
-- Returns the number of keys written.

local now = tonumber(ARGV[1])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
for i, totals in ipairs(KEYS) do
  local at = 2 + (i - 1) * 3
  activity.count(totals, 'd', now, tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]), tonumber(ARGV[at]))
end
return #KEYS
