-- decide: every policy that applies to one request, in one call, all-or-nothing.
--
-- KEYS[i]      the counter of (policy i, subject), i = 1..n
-- KEYS[n + 1]  policy version, only when the caller wants it back (read only, piggy-backed for the
--              workers' caches; never on Redis Cluster, where it lives in another slot)
-- ARGV[1]      when: '' to decide by the server's TIME (read only if a strategy needs it), or a time
--              in milliseconds; prefixed with 'd' to decide without counting anything (a dry run)
-- ARGV[2]      cost: the units the request takes from every policy (1: an ordinary request)
-- ARGV[3]      the request's lease: what an in-flight policy names its places after ('' when none
--              of the policies counts requests in flight)
-- ARGV[3 + i]  policy i's terms: "<strategy> <limit> <window ms> <bucket> <enforce 1|0> <totals bucket ms>
--              <seen 0|1|2>" (bucket: ms, or a word of the strategy's own, a quota's periods; seen: what
--              the worker saw at the subject's last decision: 1 refused, so its counter is read before
--              anything is written (refusing it again writes nothing to take back); 2 units counted
--              before the request, which a strategy may write for in fewer commands; 0 neither)
--
-- If any enforcing policy has no room for the cost, nothing stays counted anywhere (units taken
-- before the refusal was known are given back in the same call); otherwise every policy with room
-- takes the cost. A shadow policy at its limit is reported, never counted. The live index and the
-- totals are the worker's to write (tally.lua), from this reply.
-- Returns {now (ms; -1 when the call read no clock), then per policy three figures: the count (-1 -
-- the count when the policy has no room: exceeded), reset (ms), and when exceeded the retry after
-- (ms), else before (see contract.lua); then the version token ('' when Redis holds none) if it was
-- asked for}.

local when = ARGV[1]
local dry_run = string.byte(when) == 100 -- 'd'
clock.start(dry_run and string.sub(when, 2) or when)
local cost, lease = ARGV[2] == '1' and 1 or tonumber(ARGV[2]), ARGV[3] -- tonumber() on text runs strtod
local n = #ARGV - 3
local TERMS = '^(%S+) (%d+) (%d+) (%S+) ([01]) (%d+) ([012])$'

local result = {0, 0, 0, 0} -- sized for one policy (most requests): more grow it
local states -- what each policy took, by position: only kept when another policy may refuse after it
local denied = false
for i = 1, n do
  local name, limit, window, bucket, enforce, totals_bucket, seen = string.match(ARGV[3 + i], TERMS)
  local strategy = strategies[name]
  if not strategy then error('decide: unknown terms ' .. ARGV[3 + i]) end
  limit, window = tonumber(limit), tonumber(window) -- bucket and totals bucket: for the strategy to read
  local taken, count, retry, reset, before, state = false, 0, 0, 0, -2
  -- once the request is refused (or in a dry run), the remaining policies only look; a subject
  -- refused lately is looked at first, and charged only when it has room
  if dry_run or denied or seen == '1' then
    count, retry, reset = contract.look(strategy, KEYS[i], limit, window, bucket, cost)
  end
  if not (dry_run or denied) and retry == 0 then
    taken, count, retry, reset, before, state =
      contract.charge(strategy, KEYS[i], limit, window, bucket, cost, lease, totals_bucket, seen)
  end
  local exceeded = not taken and retry ~= 0
  if exceeded and (enforce == '1' or retry == -3) then denied = true end -- -3: a quota asks for its saved usage
  if taken then
    count = count + cost
    if n > 1 then
      states = states or {}
      states[i] = state or false
    end
  end
  local at = 3 * i - 1 -- the policy's three figures follow now and those of the policies before
  if exceeded then
    result[at], result[at + 1], result[at + 2] = -1 - count, reset, retry
  else
    result[at], result[at + 1], result[at + 2] = count, reset, before
  end
end

if denied and states then
  -- another policy refused: give back what was taken, and report the counts as they are again
  for i, state in pairs(states) do
    local name, limit, window, bucket = string.match(ARGV[3 + i], TERMS)
    local strategy = strategies[name]
    limit, window = tonumber(limit), tonumber(window) -- bucket and totals bucket: for the strategy to read
    contract.refund(strategy, KEYS[i], state, cost)
    local at = 3 * i - 1
    local count, _, reset = contract.look(strategy, KEYS[i], limit, window, bucket, cost)
    result[at], result[at + 1], result[at + 2] = count, reset, -2
  end
end
result[1] = clock.known() or -1
if KEYS[n + 1] then result[3 * n + 2] = redis.call('GET', KEYS[n + 1]) or '' end
return result
