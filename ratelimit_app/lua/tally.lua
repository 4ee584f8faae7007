-- tally: what the workers add to the policies' records (activity.lua) after the decisions that made
-- them, a batch at a time: requests admitted ('a') and refused ('d'), by decide.lua or from a
-- worker's local deny cache; the subjects the decisions saw, for the live index; and where their
-- counters now empty, for the count of active subjects.
--
-- KEYS per policy (and shard): its totals, its live index
-- ARGV[1] now in milliseconds, or '' to use the server's TIME
-- ARGV[2..] per policy, in KEYS' order: window (ms), totals bucket (ms), live index size; then
--   the number of counts, and per count: series ('a' or 'd'), totals bucket number ('' for the
--   bucket of now), how many;
--   the number of moves, and per move: totals bucket number, how many subjects more (or fewer) empty in it;
--   the number of subjects, and per subject: its score and member in the live index.
-- Returns the number of policies written.

local now = tonumber(ARGV[1])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
local at = 2
for i = 1, #KEYS, 2 do
  local totals, live = KEYS[i], KEYS[i + 1]
  local window, bucket, size = tonumber(ARGV[at]), tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local counts = tonumber(ARGV[at + 3])
  at = at + 4
  for _ = 1, counts do
    local number = tonumber(ARGV[at + 1]) or math.floor(now / bucket)
    activity.add(totals, ARGV[at], number, tonumber(ARGV[at + 2]), window, bucket)
    at = at + 3
  end
  local moves = tonumber(ARGV[at])
  at = at + 1
  if moves > 0 then activity.forget_ended(totals, now, window, bucket) end
  for _ = 1, moves do
    activity.move(totals, tonumber(ARGV[at]), tonumber(ARGV[at + 1]), now, bucket)
    at = at + 2
  end
  local subjects = tonumber(ARGV[at])
  at = at + 1
  if subjects > 0 then activity.index(live, ARGV, at, subjects, size, now, window, bucket) end
  at = at + 2 * subjects
end
return #KEYS / 2
