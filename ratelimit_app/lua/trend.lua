-- trend: a policy's requests allowed and refused in each of its last windows (activity.lua), read
-- only; at most 2 fields per window plus 4 per bucket of the two newest windows.
--
-- KEYS[1] totals of the policy
-- ARGV[1] now in milliseconds, or '' to use the server's TIME
-- ARGV[2] window (ms), ARGV[3] totals bucket (ms), ARGV[4] how many windows
-- Returns {now, then per window, oldest first: allowed, denied}.

local now = tonumber(ARGV[1])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
local result = {now}
for _, value in ipairs(activity.trend(KEYS[1], now, tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]))) do
  result[#result + 1] = value
end
return result
