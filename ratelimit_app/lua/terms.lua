-- terms: a policy's terms as decide.lua receives them, one argument
-- "<strategy> <limit> <window ms> <bucket ms> <enforce 1|0> <totals bucket ms> <live index size>",
-- read into a table.
-- Where the scripts are a Functions library (loaded once, called again and again) each text is read
-- once and kept: a worker sends the same few texts with every request, and one lookup costs less
-- than reading five numbers. The kept tables are shared between calls: never written to.
local terms
do
  local KEEP = 1000 -- texts kept at most, then forgotten all at once (reading one again gives the same)
  local known, size = {}, 0

  terms = function(text)
    local found = known[text]
    if found then return found end
    local strategy, limit, window, bucket, enforce, totals_bucket, index_size =
      string.match(text, '^(%S+) (%d+) (%d+) (%d+) ([01]) (%d+) (%d+)$')
    found = {
      strategy = strategies[strategy], limit = tonumber(limit), window = tonumber(window),
      bucket = tonumber(bucket), enforce = enforce == '1', totals_bucket = tonumber(totals_bucket),
      index_size = tonumber(index_size),
    }
    if not found.strategy then error('decide: unknown terms ' .. text) end
    if size >= KEEP then known, size = {}, 0 end
    known[text], size = found, size + 1
    return found
  end
end
