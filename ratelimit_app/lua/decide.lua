-- decide: every policy that applies to one request, in one call, all-or-nothing.
--
-- KEYS, for policy i = 1..n:  KEYS[3i-2] counter of (policy, subject)
--                             KEYS[3i-1] live index of the policy (sorted set "<subject hash> <limit>[*] <display>" -> last seen)
--                             KEYS[3i]   totals of the policy: a hash "<key>:<window number>" holds a = allowed, d = denied
--       KEYS[3n+1]            policy version counter (read only, piggy-backed for the workers' caches)
-- ARGV[1] now in milliseconds, or '' to use the server's TIME
-- ARGV[2] '1' to decide without counting anything (dry run)
-- ARGV[3] how many subjects a live index keeps
-- ARGV[4] n, then per policy 6 values: strategy, limit, window (ms), bucket (ms; a token bucket's burst, 0 = the limit),
--         enforce ('1'/'0'), live member
--
-- If any enforcing policy is at its limit, nothing is written to any counter; otherwise every policy
-- below its limit counts the request once. A shadow policy at its limit is reported, never counted.
-- Returns {version, now, denied, then per policy: exceeded, count, reset (ms), retry after (ms)}.

local now = tonumber(ARGV[1])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
local dry_run = ARGV[2] == '1'
local index_size = tonumber(ARGV[3])
local n = tonumber(ARGV[4])

local policies, denied = {}, false
for i = 1, n do
  local at = 4 + (i - 1) * 6
  local policy = {
    strategy = strategies[ARGV[at + 1]],
    limit = tonumber(ARGV[at + 2]),
    window = tonumber(ARGV[at + 3]),
    bucket = tonumber(ARGV[at + 4]),
    enforce = ARGV[at + 5] == '1',
    member = ARGV[at + 6],
    key = KEYS[3 * i - 2],
  }
  -- a strategy whose count is compared with something other than the limit returns it (a token bucket: its burst)
  policy.count, policy.retry, policy.state, policy.capacity =
    policy.strategy.peek(policy.key, now, policy.window, policy.bucket, policy.limit)
  policy.exceeded = policy.count >= (policy.capacity or policy.limit)
  if policy.exceeded and policy.enforce then denied = true end
  policies[i] = policy
end

local version = tonumber(redis.call('GET', KEYS[3 * n + 1]) or '0')
local result = {version, now, denied and 1 or 0}
for i, policy in ipairs(policies) do
  local counted = false
  if not dry_run then
    counted = not denied and not policy.exceeded
    if counted then
      policy.reset = policy.strategy.commit(policy.key, now, policy.window, policy.bucket, policy.count, policy.state)
      policy.count = policy.count + 1
    end
    -- the live index: trimmed and given its expiry only when a new subject joins it
    local live = KEYS[3 * i - 1]
    if redis.call('ZADD', live, now, policy.member) == 1 then
      redis.call('ZREMRANGEBYRANK', live, 0, -index_size - 1)
      redis.call('PEXPIRE', live, policy.window * 2)
    end
    -- totals of the current window: one hash per window number, expiring after the next window
    if counted or policy.exceeded then
      local totals = KEYS[3 * i] .. ':' .. math.floor(now / policy.window)
      if redis.call('HINCRBY', totals, counted and 'a' or 'd', 1) == 1 then
        redis.call('PEXPIRE', totals, policy.window * 2)
      end
    end
  end
  if not counted then
    policy.reset = policy.strategy.reset(policy.key, now, policy.window, policy.bucket, policy.count, policy.state)
  end
  result[#result + 1] = policy.exceeded and 1 or 0
  result[#result + 1] = policy.count
  result[#result + 1] = policy.reset
  result[#result + 1] = policy.retry
end
return result
