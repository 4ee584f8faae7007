-- totals: a policy's requests allowed and refused in its current window, and its active subjects
-- (activity.lua), read only. Cost bounded by window / totals bucket fields.
--
-- KEYS[1] totals of the policy
-- ARGV[1] now in milliseconds, or '' to use the server's TIME
-- ARGV[2] window (ms), ARGV[3] totals bucket (ms)
-- Returns {now, allowed, denied, active}.

local now = tonumber(ARGV[1])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
local allowed, denied, active = activity.totals(KEYS[1], now, tonumber(ARGV[2]), tonumber(ARGV[3]))
return {now, allowed, denied, active}
