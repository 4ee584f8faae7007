-- contract: what decide.lua and live.lua ask of a strategy (lua/<name>.lua defines strategies.<name>).
-- Times in ms; the call's moment comes from clock.lua, read only when the strategy needs it.
--
-- `terms` is the policy's terms as sent (decide.lua's header says how they read): a strategy takes
-- the figures it needs from them with contract.figures(terms), and only when it needs them, so a
-- fixed window's repeat request parses nothing but its limit.
--
--   look(key, limit, terms, cost) -> count, retry, reset, fields
--       counts nothing (a calendar quota given its saved usage writes it back, as its charge would start
--       from it): the units counted; the ms until `cost` more fit (0: they fit now); the ms until
--       every counted unit has left (0: none is counted); how many fields it read (the live page's
--       budget). A retry or reset of -1 means "when the fixed window ends", which the worker works out
--       from the reply's now, or its own clock when the reply has none.
--   charge(key, limit, terms, cost, lease, seen) -> taken, count, retry, reset, before, state
--       takes `cost` units when there is room for all of them, in as few commands as the strategy can;
--       count is the units counted before, reset as look's after the request, before the reset before
--       it (-1: nothing was counted; -2: the same bucket of the live index as after), state what
--       refund needs. A cost above the capacity, or above `strategy.most` (the largest cost one
--       request may take, set from the Python half), never fits: charge refuses it like any other
--       (decide.lua refuses a cost above `most` before calling it).
--       `seen` is 2 when the worker saw units counted at the subject's last decision: a hint for the
--       order of commands, never for the outcome.
--   refund(key, state, cost)  gives back what charge took (another policy refused the request)
-- A retry of -3 from charge means the quota's counter is absent: nothing counts, the worker asks again.
-- The Python half's registry (strategies/__init__.py) refuses a strategy whose Lua half does not define
-- all three on strategies.<name>.
local contract = {}
do
  -- The terms after their first field (13 hex digits and a space): "<window> <bucket> <totals bucket>"
  -- in hex, window and bucket 9 digits each at fixed places, then a quota's periods. Base 16 throughout:
  -- tonumber() runs strtoul, not strtod; the fixed places need no pattern.

  -- the window (ms)
  function contract.window(terms)
    return tonumber(string.sub(terms, 15, 23), 16)
  end

  -- the window (ms) and the strategy's bucket (a bucket in ms, a burst: the strategy's own figure)
  function contract.figures(terms)
    return tonumber(string.sub(terms, 15, 23), 16), tonumber(string.sub(terms, 25, 33), 16)
  end

  -- the bucket of the policy's totals (ms): the live index's step
  function contract.totals_bucket(terms)
    return tonumber(string.match(terms, '^%x+', 35), 16)
  end

  -- what follows the totals bucket (a quota's periods), or nil
  function contract.rest(terms)
    return string.match(terms, '^%x+ (.+)$', 35)
  end

  function contract.look(strategy, key, limit, terms, cost)
    local count, retry, reset, fields = strategy.look(key, limit, terms, cost)
    -- a cost above the strategy's bound never fits, as charge says: a look (check()) says so too
    if retry == 0 and strategy.most and cost > strategy.most then retry = 1 end
    return count, retry, reset, fields
  end
end
