-- decide: every policy that applies to one request, in one call, all-or-nothing.
--
-- KEYS, for policy i = 1..n:  KEYS[3i-2] counter of (policy, subject)
--                             KEYS[3i-1] live index of the policy (activity.lua)
--                             KEYS[3i]   totals of the policy (activity.lua)
--       KEYS[3n+1]            policy version (read only, piggy-backed for the workers' caches); left out
--                             on Redis Cluster, where it lives in another slot (then never wanted)
-- ARGV[1] now in milliseconds, or '' to use the server's TIME (to the microsecond)
-- ARGV[2] '1' to decide without counting anything (dry run), then '+' when the version is wanted
-- ARGV[3] how many subjects a live index keeps
-- ARGV[4] n, then per policy 7 values: strategy, limit, window (ms), bucket (ms; a token bucket's burst, 0 = the limit),
--         enforce ('1'/'0'), live member, totals bucket (ms)
--
-- If any enforcing policy is at its limit, nothing stays counted anywhere (a count taken before the
-- refusal was known is given back in the same call); otherwise every policy below its limit counts
-- the request once. A shadow policy at its limit is reported, never counted. The totals of admitted
-- requests are left to the worker (tally.lua); refusals are counted here.
-- Returns {version or 0, now, denied, then per policy: exceeded, count, reset (ms), retry after (ms)}.

local now = tonumber(ARGV[1])
local now_us -- the same moment to the microsecond (a token bucket's interval may be shorter than 1 ms)
if now then
  now_us = now * 1000
else
  local time = redis.call('TIME')
  local seconds, microseconds = tonumber(time[1]), tonumber(time[2])
  now = seconds * 1000 + math.floor(microseconds / 1000)
  now_us = seconds * 1000000 + microseconds
end
local flags = ARGV[2]
local dry_run = flags == '1' or flags == '1+'
local version_wanted = flags == '0+' or flags == '1+'
local index_size = tonumber(ARGV[3])
local n = tonumber(ARGV[4])

local policies, denied = {}, false
for i = 1, n do
  local at = 4 + (i - 1) * 7
  local policy = {
    strategy = strategies[ARGV[at + 1]],
    limit = tonumber(ARGV[at + 2]),
    window = tonumber(ARGV[at + 3]),
    bucket = tonumber(ARGV[at + 4]),
    enforce = ARGV[at + 5] == '1',
    member = ARGV[at + 6],
    totals_bucket = tonumber(ARGV[at + 7]),
    key = KEYS[3 * i - 2],
    live = KEYS[3 * i - 1],
    totals = KEYS[3 * i],
    -- what the strategy answers, named here so that the table is allocated once at its full size
    count = false, retry = false, state = false, capacity = false, taken = false, reset = false,
    before_reset = false, exceeded = false,
  }
  local strategy = policy.strategy
  -- a strategy that can count in the same command that reads (take) does, and gives the request back
  -- if another policy refuses it; the others look first and count below. Once the request is
  -- refused, the remaining policies only look.
  -- a strategy whose count is compared with something other than the limit returns it (a token bucket: its burst)
  if strategy.take and not dry_run and not denied then
    policy.count, policy.retry, policy.state, policy.capacity, policy.taken, policy.reset, policy.before_reset =
      strategy.take(policy.key, now, policy.window, policy.bucket, policy.limit, now_us)
    policy.exceeded = not policy.taken
  else
    policy.count, policy.retry, policy.state, policy.capacity =
      strategy.peek(policy.key, now, policy.window, policy.bucket, policy.limit, now_us)
    policy.exceeded = policy.count >= (policy.capacity or policy.limit)
  end
  if policy.exceeded and policy.enforce then denied = true end
  policies[i] = policy
end

-- count one request for the policy and keep the operator's index up to date; the totals of admitted
-- requests are added by the worker (tally.lua), not here
local function commit(policy)
  local strategy, g = policy.strategy, policy.totals_bucket
  local before_reset = policy.before_reset -- when the counter emptied without this request (nil: it was empty)
  if not policy.taken then
    policy.reset, before_reset = strategy.commit(policy.key, now, policy.window, policy.bucket, policy.count, policy.state, g)
  end
  local before = before_reset and activity.bucket_of(now, before_reset, g) or nil
  policy.count = policy.count + 1
  local after = activity.bucket_of(now, policy.reset, g)
  if after ~= before then
    activity.index(policy.live, policy.member, activity.score(after, g, policy.count), index_size, now, policy.window, g)
    activity.moved(policy.totals, before, after, now, policy.window, g)
  elseif activity.busier(policy.count) then
    activity.index(policy.live, policy.member, activity.score(after, g, policy.count), index_size, now, policy.window, g)
  end
end

-- a request over the limit: the subject is marked blocked in the index and the refusal counted
local function refuse(policy)
  local g = policy.totals_bucket
  local score = activity.BLOCKED + activity.bucket_of(now, policy.reset, g) * g
  activity.index(policy.live, policy.member, score, index_size, now, policy.window, g)
  activity.count(policy.totals, 'd', now, policy.window, g)
end

-- the version token ('' when Redis holds none), or 0 when the caller did not ask for it
local version = version_wanted and (redis.call('GET', KEYS[3 * n + 1]) or '') or 0
local result = {version, now, denied and 1 or 0}
for i, policy in ipairs(policies) do
  if policy.taken and denied then
    policy.strategy.undo(policy.key, now, policy.state)
    policy.taken = false
  end
  if not dry_run and not denied and not policy.exceeded then
    commit(policy)
  else
    policy.reset = policy.strategy.reset(policy.key, now, policy.window, policy.bucket, policy.count, policy.state)
    if policy.exceeded and not dry_run then refuse(policy) end
  end
  result[#result + 1] = policy.exceeded and 1 or 0
  result[#result + 1] = policy.count
  result[#result + 1] = policy.reset
  result[#result + 1] = policy.retry
end
return result
