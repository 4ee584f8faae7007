-- decide: every policy that applies to one request, in one call, all-or-nothing.
--
-- KEYS, for policy i = 1..n:  KEYS[3i-2] counter of (policy, subject)
--                             KEYS[3i-1] live index of the policy (activity.lua)
--                             KEYS[3i]   totals of the policy (activity.lua)
--       KEYS[3n+1]            policy version, only when the caller wants it back (read only,
--                             piggy-backed for the workers' caches; never on Redis Cluster, where it
--                             lives in another slot)
-- ARGV[1]      when: '' to decide now by the server's TIME (to the microsecond), or a time in
--              milliseconds; prefixed with 'd' to decide without counting anything (a dry run)
-- ARGV[2]      cost: the units the request takes from every policy (1: an ordinary request)
-- ARGV[3]      the request's lease: what an in-flight policy names its places after ('' when none
--              of the policies counts requests in flight)
-- ARGV[2i + 2] policy i's terms (terms.lua): strategy, limit, window (ms), bucket (ms; a token
--              bucket's burst, 0 = the limit), enforce, totals bucket (ms), live index size
-- ARGV[2i + 3] policy i's member in the live index
--
-- If any enforcing policy has no room for the cost, nothing stays counted anywhere (units taken
-- before the refusal was known are given back in the same call); otherwise every policy with room
-- takes the cost. A shadow policy at its limit is reported, never counted. The totals (requests
-- admitted and refused) are left to the worker (tally.lua).
-- Returns {now, then per policy: exceeded, count, reset (ms), retry after (ms); then the version
-- token ('' when Redis holds none) if it was asked for}.
--
-- The contract every strategy implements (lua/<name>.lua defines strategies.<name>), times in ms:
--   peek(key, now, window, bucket, limit, now_us, cost) -> count, retry, state, capacity
--       reads only: the units counted, the ms until `cost` more fit (when they do not now), what
--       reset needs, and what count is compared with when it is not the limit (a token bucket's burst)
--   take(key, now, window, bucket, limit, now_us, totals_bucket, cost, lease)
--       -> count, retry, state, capacity, taken, reset, before_reset
--       takes `cost` units when there is room for all of them (taken), in as few commands as the
--       strategy can; count is the units counted before, reset the ms until every counted unit has
--       left, before_reset the same before this request (nil: nothing was counted)
--   undo(key, now, state, cost)  gives back what take took (another policy refused the request)
--   reset(key, now, window, bucket, count, state) -> ms until every counted unit has left
-- `bucket` is the strategy's own figure from the policy's terms (a bucket, a burst). A cost above
-- the capacity never fits: take refuses it like any other (the caller knows it never will).

local when, dry_run, now = ARGV[1], false, nil
if when ~= '' then
  dry_run = string.byte(when) == 100 -- 'd'
  now = tonumber(dry_run and string.sub(when, 2) or when)
end
local now_us -- the same moment to the microsecond (a token bucket's interval may be shorter than 1 ms)
if now then
  now_us = now * 1000
else
  local time = redis.call('TIME') -- seconds and microseconds, as text (arithmetic reads them)
  now_us = time[1] * 1000000 + time[2]
  now = math.floor(now_us / 1000)
end
local cost, lease = tonumber(ARGV[2]), ARGV[3]
local n = (#ARGV - 3) / 2

local policies, denied = {}, false
for i = 1, n do
  local terms = terms(ARGV[2 * i + 2])
  local strategy, key, limit = terms.strategy, KEYS[3 * i - 2], terms.limit
  local count, retry, state, capacity, taken, reset, before_reset, exceeded
  -- once the request is refused (or in a dry run), the remaining policies only look; a policy that
  -- refused the subject lately looks first, so that refusing it again writes nothing to take back
  if dry_run or denied or activity.refused_lately(key) then
    count, retry, state, capacity = strategy.peek(key, now, terms.window, terms.bucket, limit, now_us, cost)
    exceeded = count + cost > (capacity or limit)
  end
  if not (dry_run or denied or exceeded) then
    count, retry, state, capacity, taken, reset, before_reset =
      strategy.take(key, now, terms.window, terms.bucket, limit, now_us, terms.totals_bucket, cost, lease)
    exceeded = not taken
  end
  if exceeded and terms.enforce then denied = true end
  policies[i] = {
    terms = terms, count = count, retry = retry, state = state, taken = taken, reset = reset,
    before_reset = before_reset, exceeded = exceeded,
  }
end

local result = {now, false, false, false, false} -- sized for one policy (most requests): more grow it
for i = 1, n do
  local policy = policies[i]
  local terms = policy.terms
  local strategy, key, live, totals, member = terms.strategy, KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i], ARGV[2 * i + 3]
  if policy.taken and denied then
    strategy.undo(key, now, policy.state, cost)
    policy.taken = false
  end
  if policy.taken then
    -- keep the operator's index up to date; the totals are added by the worker (tally.lua), not here
    policy.count = policy.count + cost
    activity.counted(live, totals, key, member, terms, now, policy.count, cost, policy.before_reset, policy.reset)
  else
    policy.reset = strategy.reset(key, now, terms.window, terms.bucket, policy.count, policy.state)
    if policy.exceeded and not dry_run then activity.refused(live, key, member, terms, now, policy.reset) end
  end
  local at = 4 * i - 2 -- the policy's four figures follow now and those of the policies before
  result[at], result[at + 1], result[at + 2], result[at + 3] =
    policy.exceeded and 1 or 0, policy.count, policy.reset, policy.retry
end
if KEYS[3 * n + 1] then result[4 * n + 2] = redis.call('GET', KEYS[3 * n + 1]) or '' end
return result
