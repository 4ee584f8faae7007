-- tally: counts the workers add to the policies' totals (activity.lua) after the decisions that made
-- them: requests admitted ('a') and refused ('d'), by decide.lua or from a worker's local deny cache.
--
-- KEYS the totals of the policies (a key may come more than once: one entry per bucket)
-- ARGV[1] now in milliseconds, or '' to use the server's TIME
-- ARGV[2..] per key 5 values: series ('a' or 'd'), totals bucket number ('' for the bucket of now),
--           how many, window (ms), totals bucket (ms)
-- Returns the number of entries written.

local now = tonumber(ARGV[1])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
for i, totals in ipairs(KEYS) do
  local at = 2 + (i - 1) * 5
  local bucket = tonumber(ARGV[at + 4])
  local number = tonumber(ARGV[at + 1]) or math.floor(now / bucket)
  activity.add(totals, ARGV[at], number, tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]), bucket)
end
return #KEYS
