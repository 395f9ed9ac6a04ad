-- driver.lua: the script's entry, after fast.lua, prelude.lua and the algorithms it uses. It
-- reads its arguments from A: ARGV, or the generic layout fast.lua fell through with.
--
-- KEYS: each limit's keys, in the order of the limits (every key of one call shares one
--       {hash tag}: one Cluster slot).
-- ARGV: [1] now in ns (decimal), or "" to read the server's TIME;
--       [2] cost (0: peek; for a refund, the amount given back);
--       [3] "c" check / peek, "r" refund, "a" acquire (concurrency: a check that also
--           answers the permit's stamp), "x" release (concurrency: [2] is the stamp);
--       [4] ms added to every TTL (0; tests with an explicit now pass more);
--       [5] number of limits; then per limit its algorithm code and parameters.
-- Reply: check: {outcome (0 allowed, 1 limited, 2 never fits), limit, remaining,
--        reset_after ns, retry_after ns (-1: none), delay ns}; acquire: the same and the
--        stamp (decimal ns, "" if none); refund: 0; release: the cells freed.
-- Several limits are all-or-nothing exactly as turnstile::Limits::decide: every limit is
-- evaluated first, then all record or none does (limits counting denials record those).
local s, n = now_s, now_n -- read by fast.lua when it started and fell through
if s then
  -- the same instant
elseif A[1] == '' then
  local t = redis.call('TIME')
  s, n = tonumber(t[1]), tonumber(t[2]) * 1000
else
  s, n = t_parse(A[1])
end
local cost = tonumber(A[2])
SLACK = tonumber(A[4])
local ls = {}
local ai, ki = 6, 1
for i = 1, tonumber(A[5]) do
  local alg = ALG[A[ai]]
  local p = {}
  for j = 1, alg.nargs do p[j] = tonumber(A[ai + j]) end
  ls[i] = {alg, ki, p}
  ai, ki = ai + 1 + alg.nargs, ki + alg.nkeys
end
if A[3] == 'x' then return ls[1][1].release(ls[1][2], ls[1][3], s, n, A[2]) end
if A[3] == 'a' then
  local d = ls[1][1].step(ls[1][2], ls[1][3], s, n, cost, true)
  d[7] = OUT.stamp or ''
  return d
end
if A[3] == 'r' then
  for i = 1, #ls do ls[i][1].refund(ls[i][2], ls[i][3], s, n, cost) end
  return 0
end
return decide(ls, s, n, cost, true)
