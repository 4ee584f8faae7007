-- sliding_window: one hash per subject holding a series (series.lua): requests per bucket of
-- `bucket` ms and their running total, so a decision reads O(1) fields whatever the bucket count.
-- The key's expiry is moved only when a new bucket starts; memory is bounded by window / bucket
-- fields + 3. Times are integer milliseconds.
do
  -- look's figures, then what series.read found (series.add takes it on)
  local function look(key, limit, terms, cost)
    local now = clock.ms()
    local window, bucket = contract.figures(terms)
    local count, here, newest, cleaned, fields, name, cleaned_text = series.read(key, now, window, bucket)
    local reset = series.empty_in(count, newest, now, window, bucket)
    local retry = 0
    if count + cost > limit then
      -- a cost above the limit never fits: when the window is empty is as good an answer as any
      local needed = count + cost - limit
      retry = math.max(1, cost > limit and reset or series.freed_in(key, cleaned, now, window, bucket, needed))
    end
    return count, retry, reset, fields, here, newest, cleaned, window, bucket, name, cleaned_text
  end

  strategies.sliding_window = {
    look = look,
    charge = function(key, limit, terms, cost)
      local count, retry, reset, _, here, newest, cleaned, window, bucket, name, cleaned_text =
        look(key, limit, terms, cost)
      if retry ~= 0 then return false, count, retry, reset, -2 end
      local now = clock.ms()
      series.add(key, now, window, bucket, count, here, newest, cleaned, cost, name, cleaned_text)
      local current = math.floor(now / bucket)
      local after = current * bucket + window - now
      if newest ~= current then redis.call('PEXPIRE', key, after) end
      return true, count, 0, after, count > 0 and reset or -1, current
    end,
    -- the bucket charge counted in
    refund = function(key, current, cost)
      redis.call('HINCRBY', key, current, -cost)
      redis.call('HINCRBY', key, 't', -cost)
    end,
  }
end
