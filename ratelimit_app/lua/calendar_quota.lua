-- calendar_quota: a count per calendar period (a day, an ISO week or a month in a time zone). The worker
-- works out the periods and sends them after the terms' figures: "<previous start>,<start>,<end>,<after>
-- [,<seed start>,<seed>]" (ms, in hex); the call's moment picks [previous, start), [start, end) or
-- [end, after). One integer per subject,
-- count * 1000000 + the period's number (from its start), written with SET ... PXAT <the period's end>
-- by the period's first request: a counter that exists is the current period's, so a repeat request is
-- one INCRBY and reads no clock. A counter that is absent is reported (retry ABSENT) unless the call
-- brings the usage the database saved for the period (the seed), from which the period starts again:
-- a look (usage(), check()) writes the seed back too, so that the next look needs no database.
do
  local PACK = 1000000
  local ABSENT = -3 -- decide.lua refuses the whole call: the worker asks again with the seed
  local ONE, GIVE_BACK = '1000000', '-1000000'

  local function units(cost, sign)
    if cost == 1 then return sign > 0 and ONE or GIVE_BACK end
    return string.format('%.0f', sign * cost * PACK)
  end

  local function periods(terms)
    local bucket = contract.rest(terms)
    if not bucket then return nil end -- the live page sends no periods
    local previous, start, finish, after, seed_at, seed =
      string.match(bucket, '^(%x+),(%x+),(%x+),(%x+),?(%x*),?(%x*)$')
    if not previous then return nil end -- the live page sends no periods
    return tonumber(previous, 16), tonumber(start, 16), tonumber(finish, 16), tonumber(after, 16),
      tonumber(seed_at, 16), tonumber(seed, 16)
  end

  -- a period's number, from its start (never 0: 0 marks an absent counter)
  local function number(start)
    return math.floor(start / 60000) % (PACK - 1) + 1
  end

  -- the period containing the call's moment: its start and end, and its number
  local function current(terms)
    local previous, start, finish, after = periods(terms)
    local now = clock.ms()
    if now < start then start, finish = previous, start
    elseif now >= finish then start, finish = finish, after end
    return start, finish, number(start)
  end

  -- ms until the period of the counter `stored` ends, or -1 (the worker works it out from its clock) when the
  -- call has not read the clock and the counter is of the period the worker sent as current. A counter of
  -- another period (the worker's clock passed an end Redis's has not, or the reverse) reads the clock: the
  -- worker's would keep a refusal, and save the usage, a whole period off.
  local function until_end(key, terms, stored)
    local previous, start = periods(terms)
    if not previous then return clock.known and redis.call('PTTL', key) or -1 end
    if not clock.known and stored % PACK == number(start) then return -1 end
    local _, finish = current(terms)
    return finish - clock.ms()
  end

  -- whether a stored value counts the period of the call (by the server's clock, any counter left does)
  local function of_now(stored, terms)
    if not clock.given or not periods(terms) then return true end -- the live page sends no periods
    local _, _, number = current(terms)
    return stored % PACK == number
  end

  -- the counter of the period containing the call's moment, holding `count` (Redis writes an integer's digits)
  local function written(key, count, finish, number)
    local value = count * PACK + number
    if clock.given then
      redis.call('SET', key, value, 'PX', finish - clock.ms() + 1000) -- the period's number tells it is over
    else
      redis.call('SET', key, value, 'PXAT', finish)
    end
  end

  local function look(key, limit, terms, cost)
    local stored = tonumber(redis.call('GET', key))
    if not stored or not of_now(stored, terms) then
      local _, _, _, _, seed_at, seed = periods(terms)
      if not seed_at then
        if not periods(terms) then return 0, 0, 0, 1 end
        clock.ms() -- the worker reads the usage saved for the period of Redis's clock, not of its own
        return 0, ABSENT, 0, 1
      end
      local start, finish, number = current(terms)
      local count = seed_at == start and seed or 0
      -- counts nothing: the counter the period's next request would start from the same seed
      written(key, count, finish, number)
      return count, count + cost > limit and finish - clock.ms() or 0, count > 0 and finish - clock.ms() or 0, 1
    end
    local count = math.floor(stored / PACK)
    local ends = until_end(key, terms, stored)
    return count, count + cost > limit and ends or 0, count > 0 and ends or 0, 1
  end

  strategies.calendar_quota = {
    look = look,
    charge = function(key, limit, terms, cost)
      if cost > limit then
        local count, retry, reset = look(key, limit, terms, cost)
        return false, count, retry, reset, -2
      end
      local stored = redis.call('INCRBY', key, units(cost, 1))
      if stored % PACK == 0 or not of_now(stored, terms) then
        -- the period's first request here (no counter, or a caller's `now` in a later period)
        local _, _, _, _, seed_at, seed = periods(terms)
        if not seed_at then
          redis.call('DEL', key)
          clock.ms() -- as in look: the saved usage asked for is of Redis's period
          return false, 0, ABSENT, 0, -2
        end
        local start, finish, number = current(terms)
        local now = clock.ms()
        local count = seed_at == start and seed or 0
        local taken = count + cost <= limit
        written(key, taken and count + cost or count, finish, number)
        if not taken then return false, count, finish - now, finish - now, -2 end
        return true, count, 0, finish - now, -1
      end
      local count = math.floor(stored / PACK)
      if count > limit then
        redis.call('INCRBY', key, units(cost, -1))
        local ends = until_end(key, terms, stored)
        return false, count - cost, ends, ends, -2
      end
      return true, count - cost, 0, until_end(key, terms, stored), -2
    end,
    refund = function(key, state, cost)
      redis.call('INCRBY', key, units(cost, -1))
    end,
  }
end
