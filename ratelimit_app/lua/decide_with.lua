-- decide_with: decide.lua for a request that is not an ordinary one: its KEYS, and its ARGV after three more.
--
-- ARGV[1]      when: '' to decide by the server's TIME (read only if a strategy needs it), or a time
--              in milliseconds; prefixed with 'd' to decide without counting anything (a dry run)
-- ARGV[2]      cost: the units the request takes from every policy (1: an ordinary request)
-- ARGV[3]      the request's lease: what an in-flight policy names its places after ('' when none
--              of the policies counts requests in flight)
-- ARGV[3 + i]  policy i's terms, as decide.lua's ARGV[i]
-- Returns what decide.lua does.

return decision(KEYS, ARGV, 4)
