-- release: the response of a request is done; it gives back the places it held.
-- KEYS the counters of the in-flight policies that admitted it
-- ARGV[1] the request's lease, ARGV[2] the units it took (its cost), ARGV[3] the strategy
local strategy = strategies[ARGV[3]]
for _, key in ipairs(KEYS) do strategy.release(key, ARGV[1], tonumber(ARGV[2])) end
return #KEYS
