-- driver.lua: the script's entry, after prelude.lua and the algorithms it uses.
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
local s, n
if ARGV[1] == '' then
  local t = redis.call('TIME')
  s, n = tonumber(t[1]), tonumber(t[2]) * 1000
else
  s, n = t_parse(ARGV[1])
end
local cost = tonumber(ARGV[2])
SLACK = tonumber(ARGV[4])
local ls = {}
local ai, ki = 6, 1
for i = 1, tonumber(ARGV[5]) do
  local alg = ALG[ARGV[ai]]
  local p = {}
  for j = 1, alg.nargs do p[j] = tonumber(ARGV[ai + j]) end
  ls[i] = {alg, ki, p}
  ai, ki = ai + 1 + alg.nargs, ki + alg.nkeys
end
if ARGV[3] == 'x' then return ls[1][1].release(ls[1][2], ls[1][3], s, n, ARGV[2]) end
if ARGV[3] == 'a' then
  local d = ls[1][1].step(ls[1][2], ls[1][3], s, n, cost, true)
  d[7] = OUT.stamp or ''
  return d
end
if ARGV[3] == 'r' then
  for i = 1, #ls do ls[i][1].refund(ls[i][2], ls[i][3], s, n, cost) end
  return 0
end
if #ls == 1 then return ls[1][1].step(ls[1][2], ls[1][3], s, n, cost, true) end
-- p with count_denied off (param 3 of the algorithms that count denials).
local function counting_nothing(alg, p)
  if not alg.cd(p) then return p end
  local q = {}
  for j = 1, #p do q[j] = p[j] end
  q[3] = 0
  return q
end
-- Several limits: turnstile::Limits::decide. Every limit is evaluated on the record as it is.
local all, fits = true, true
for i = 1, #ls do
  local d = ls[i][1].step(ls[i][2], ls[i][3], s, n, cost, false)
  if d[1] ~= 0 then
    all = false
    if d[1] == 2 then fits = false end
  end
end
if all then
  -- All record; the least remaining (the first on a tie), the latest reset, the longest delay.
  local out
  for i = 1, #ls do
    local d = ls[i][1].step(ls[i][2], ls[i][3], s, n, cost, true)
    if not out then
      out = d
    else
      local m = out
      if d[3] < out[3] then m = d end
      m[4], m[6] = math.max(out[4], d[4]), math.max(out[6], d[6])
      out = m
    end
  end
  return out
end
-- Denied: limits counting denials record it (unless some limit can never fit the cost), and
-- the answer describes the record as it then is: the least remaining (a denying limit's on a
-- tie), the latest reset, the latest retry of the limits that deny (none if one never fits).
if fits then
  for i = 1, #ls do
    if ls[i][1].cd(ls[i][3]) then ls[i][1].step(ls[i][2], ls[i][3], s, n, cost, true) end
  end
end
local out = {1, -1, -1, 0, 0, 0}
local denier_least = false
for i = 1, #ls do
  local alg, k, p = ls[i][1], ls[i][2], ls[i][3]
  local held = alg.step(k, p, s, n, 0, false)
  local d = alg.step(k, counting_nothing(alg, p), s, n, cost, false)
  local denies = d[1] ~= 0
  out[4] = math.max(out[4], held[4])
  if out[3] < 0 or held[3] < out[3] or (held[3] == out[3] and denies and not denier_least) then
    out[3], out[2], denier_least = held[3], held[2], denies
  end
  if denies then
    if out[5] >= 0 and d[5] >= 0 then out[5] = math.max(out[5], d[5]) else out[5] = -1 end
  end
end
-- Each limit admits at its own retry and later; but where time went backwards, or at the
-- end of a clock, a limit may not admit at the latest retry: then no wait helps.
if out[5] >= 0 and out[5] < 9007199254740992 then
  local as, an = t_add(s, n, out[5])
  for i = 1, #ls do
    local alg, k, p = ls[i][1], ls[i][2], ls[i][3]
    if alg.step(k, counting_nothing(alg, p), as, an, cost, false)[1] ~= 0 then
      out[5] = -1
      break
    end
  end
end
if out[5] < 0 then out[1] = 2 end
return out
