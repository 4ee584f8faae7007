-- decision: the body of decide.lua and decide_with.lua (their header says what a call sends and gets back).
-- `first` is the position of the first policy's terms in ARGV: 1 for an ordinary request (the server's
-- clock, a cost of 1, no lease), 4 when ARGV[1..3] say otherwise.
local decision
do
  -- a policy's strategy, limit, whether it enforces, and what the worker saw (the terms' first field)
  local function decoded(terms)
    local hot = tonumber(string.sub(terms, 1, 13), 16) -- base 16: strtoul, not strtod
    local flags = hot % 256
    local strategy = by_code[flags - flags % 16]
    if not strategy then error('decide: unknown terms ' .. terms) end
    return strategy, (hot - flags) / 256, flags % 8 >= 4, flags % 4
  end

  function decision(KEYS, ARGV, first)
    local cost, lease, dry_run = 1, '', false
    local costs -- nil unless the policies' charges differ
    if first == 1 then
      clock.given, clock.known = false, false -- clock.start(), without the call
    else
      local when = ARGV[1]
      dry_run = string.byte(when) == 100 -- 'd'
      clock.start(dry_run and string.sub(when, 2) or when)
      cost, lease = ARGV[2] == '1' and 1 or tonumber(ARGV[2]), ARGV[3]
      if not cost then -- each policy's own charge, space-separated (a metered estimate beside requests)
        costs = {}
        for each in string.gmatch(ARGV[2], '%d+') do costs[#costs + 1] = tonumber(each) end
      end
    end
    local n = #ARGV - first + 1
    -- the figures: a table only for several policies; one policy's stay in locals (the reply may be its count)
    local result = n ~= 1 and {} or nil
    local count1, reset1, third1
    local states -- what each policy took, by position: only kept when another policy may refuse after it
    local denied = false
    for i = 1, n do
      local terms = ARGV[first + i - 1]
      local strategy, limit, enforce, seen = decoded(terms)
      local key = KEYS[i]
      if costs then cost = costs[i] end
      local taken, count, retry, reset, before, state = false, 0, 0, 0, -2
      -- once the request is refused (or in a dry run), the remaining policies only look; a subject
      -- refused lately is looked at first, and charged only when it has room
      if dry_run or denied or seen == 1 then
        count, retry, reset = contract.look(strategy, key, limit, terms, cost)
      end
      if not (dry_run or denied) and retry == 0 then
        if cost ~= 1 and strategy.most and cost > strategy.most then -- refused before a unit is written
          count, retry, reset = contract.look(strategy, key, limit, terms, cost)
          retry = math.max(1, retry)
        else
          taken, count, retry, reset, before, state = strategy.charge(key, limit, terms, cost, lease, seen)
        end
      end
      local third = before
      if taken then
        count = count + cost
        if n > 1 then
          states = states or {}
          states[i] = state or false
        end
      elseif retry ~= 0 then -- exceeded
        if enforce or retry == -3 then denied = true end -- -3: a quota asks for its saved usage
        count, third = -1 - count, retry
      end
      if n == 1 then
        count1, reset1, third1 = count, reset, third
      else
        local at = 3 * i - 1 -- the policy's three figures follow now and those of the policies before
        result[at], result[at + 1], result[at + 2] = count, reset, third
      end
    end

    if denied and states then
      -- another policy refused: give back what was taken, and report the counts as they are again
      for i, state in pairs(states) do
        local terms = ARGV[first + i - 1]
        local strategy, limit = decoded(terms)
        if costs then cost = costs[i] end
        strategy.refund(KEYS[i], state, cost)
        local at = 3 * i - 1
        local count, _, reset = contract.look(strategy, KEYS[i], limit, terms, cost)
        result[at], result[at + 1], result[at + 2] = count, reset, -2
      end
    end
    local version = KEYS[n + 1]
    if n == 1 then
      -- the common reply: the count alone, when the worker tells the rest by its clock (a fixed window's
      -- charge: reset -1, before -1 when it counted the cost alone, else -2; retry -1 when refused) and the
      -- call read none (a call that read TIME tells it: the worker keeps its offset from Redis's clock)
      if not (clock.known or version) and reset1 == -1
          and third1 == (count1 >= 0 and count1 ~= cost and -2 or -1) then
        return count1
      end
      result = {0, count1, reset1, third1}
    end
    result[1] = clock.known or -1
    if version then result[3 * n + 2] = redis.call('GET', version) or '' end
    return result
  end
end
