-- contract: what decide.lua and live.lua ask of a strategy (lua/<name>.lua defines strategies.<name>).
-- Times in ms; the call's moment comes from clock.lua, read only when the strategy needs it.
--
--   look(key, limit, window, bucket, cost) -> count, retry, reset, fields
--       reads only: the units counted; the ms until `cost` more fit (0: they fit now); the ms until
--       every counted unit has left (0: none is counted); how many fields it read (the live page's
--       budget). A retry or reset of -1 means "when the fixed window ends", by the worker's clock.
--   charge(key, limit, window, bucket, cost, lease, totals_bucket, seen) -> taken, count, retry, reset, before, state
--       takes `cost` units when there is room for all of them, in as few commands as the strategy can;
--       count is the units counted before, reset as look's after the request, before the reset before
--       it (-1: nothing was counted; -2: the same bucket of the live index as after), state what
--       refund needs. A cost above the capacity, or above `strategy.most` (the largest cost one
--       request may take, set from the Python half), never fits: charge refuses it like any other.
--       `seen` is '2' when the worker saw units counted at the subject's last decision: a hint for the
--       order of commands, never for the outcome.
--   refund(key, state, cost)  gives back what charge took (another policy refused the request)
-- `bucket` is the strategy's own figure from the policy's terms (a bucket, a burst, a quota's periods), and
-- it and totals_bucket come as the text sent (or a number): a strategy converts what it reads, so a
-- decision converts (with strtod) only the figures it uses.
-- A retry of -3 from charge means the quota's counter is absent: nothing counts, the worker asks again.
--
-- A strategy written for the earlier contract (peek / take / undo / reset, with the time passed in)
-- is called through the same three functions here.
local contract = {}
do
  local function looked(strategy, key, limit, window, bucket, cost)
    if strategy.look then return strategy.look(key, limit, window, bucket, cost) end
    local now = clock.ms()
    bucket = tonumber(bucket) or bucket
    local count, retry, state = strategy.peek(key, now, window, bucket, limit, clock.us(), cost)
    local reset = count > 0 and strategy.reset(key, now, window, bucket, count, state) or 0
    if count + cost > limit and retry == 0 then retry = 1 end
    return count, retry, reset, 2
  end

  function contract.look(strategy, key, limit, window, bucket, cost)
    local count, retry, reset, fields = looked(strategy, key, limit, window, bucket, cost)
    -- a cost above the strategy's bound never fits, as charge says: a look (check()) says so too
    if retry == 0 and strategy.most and cost > strategy.most then retry = 1 end
    return count, retry, reset, fields
  end

  function contract.charge(strategy, key, limit, window, bucket, cost, lease, totals_bucket, seen)
    if strategy.most and cost > strategy.most then -- refused before the strategy writes a unit of it
      local count, retry, reset = contract.look(strategy, key, limit, window, bucket, cost)
      return false, count, math.max(1, retry), reset, -2
    end
    if strategy.charge then return strategy.charge(key, limit, window, bucket, cost, lease, totals_bucket, seen) end
    local now = clock.ms()
    bucket = tonumber(bucket) or bucket
    local count, retry, state, _, taken, reset, before =
      strategy.take(key, now, window, bucket, limit, clock.us(), tonumber(totals_bucket), cost, lease)
    if not taken then
      return false, count, math.max(1, retry), strategy.reset(key, now, window, bucket, count, state), -2
    end
    return true, count, 0, reset, before or -1, state
  end

  function contract.refund(strategy, key, state, cost)
    if strategy.refund then return strategy.refund(key, state, cost) end
    strategy.undo(key, clock.ms(), state, cost)
  end
end
