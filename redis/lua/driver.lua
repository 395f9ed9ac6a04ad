-- driver.lua: the script's entry, after prelude.lua and the algorithms it uses.
--
-- KEYS: each limit's keys, in the order of the limits (every key of one call shares one
--       {hash tag}: one Cluster slot).
-- ARGV: [1] now in ns (decimal), or "" to read the server's TIME;
--       [2] cost (0: peek; for a refund, the amount given back);
--       [3] "c" check / peek, "r" refund;
--       [4] ms added to every TTL (0; tests with an explicit now pass more);
--       [5] number of limits; then per limit its algorithm code and parameters.
-- Reply: check: {outcome (0 allowed, 1 limited, 2 never fits), limit, remaining,
--        reset_after ns, retry_after ns (-1: none), delay ns}; refund: 0.
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
if ARGV[3] == 'r' then
  for i = 1, #ls do ls[i][1].refund(ls[i][2], ls[i][3], s, n, cost) end
  return 0
end
if #ls == 1 then return ls[1][1].step(ls[1][2], ls[1][3], s, n, cost, true) end
local all = true
for i = 1, #ls do
  if ls[i][1].step(ls[i][2], ls[i][3], s, n, cost, false)[1] ~= 0 then
    all = false
    break
  end
end
-- Two decisions as one (turnstile's `combine`): denied if either is; the later retry; the
-- tighter remainder; the later reset; the larger delay when admitted.
local function combine(a, b)
  local reset, delay = math.max(a[4], b[4]), math.max(a[6], b[6])
  local d
  if a[1] == 0 and b[1] == 0 then
    if b[3] < a[3] then d = b else d = a end
  elseif b[1] == 0 then
    d = a
  elseif a[1] == 0 then
    d = b
  else
    d = a
    if a[5] >= 0 and b[5] >= 0 then d[5] = math.max(a[5], b[5]) else d[5] = -1 end
    if d[5] >= 0 then d[1] = 1 else d[1] = 2 end
  end
  d[4] = reset
  if d[1] == 0 then d[6] = delay else d[6] = 0 end
  return d
end
local out
for i = 1, #ls do
  local l = ls[i]
  local d = l[1].step(l[2], l[3], s, n, cost, all or l[1].cd(l[3]))
  if out then out = combine(out, d) else out = d end
end
return out
