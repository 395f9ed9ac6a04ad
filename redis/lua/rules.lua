-- rules.lua: a request of the rules engine decided in one call (turnstile::rules::Plan), after
-- prelude.lua, the algorithms and limits.lua.
--
-- KEYS: each step's keys: its own limits' (one per limit, in order), then its elastic
--       pool's. All of one call's keys share one Redis Cluster slot, or the server is one node.
-- ARGV: [1] now in ns (decimal), or "" to read the server's TIME;
--       [2] ms added to every TTL (0; tests with an explicit now pass more);
--       [3] "c" check, "r" refund;
--       [4] the number of steps; then per step:
--           flags: letters, or "-" for none: "s" a shadow rule, "e" the elastic pool may be
--           drawn, "m" / "p" a refund goes to the limits / to the pool (else: to the pool if
--           it holds a charge, as Engine::refund);
--           cost; the number of limits, each one's code and parameters (driver.lua's);
--           the number of pool limits (0: none), each one's code and parameters.
-- Reply: check: {denier (0: every enforcing step admits; else the first that denies, from
--        1)}, then per step 12 integers: its limits' decision and its pool's (prelude.lua's
--        six fields; outcome -1: not asked). Refund: the number of steps given the cost.
--
-- The engine's protocol, exactly: enforcing steps are asked in order without recording; if
-- all admit (by their limits, or an elastic rule by its pool while its limits deny as
-- Limited), each records (a pool admission records the limits' denial first, as the
-- engine's limits check does) and then the shadow steps record. If one denies, nothing is
-- recorded but what the engine leaves after its refunds: the count_denied denials of the steps
-- up to it whose limits denied, and the denier's pool check. The steps after the denier are
-- evaluated (recording nothing), for the latest retry.
local s, n
if ARGV[1] == '' then
  local t = redis.call('TIME')
  s, n = tonumber(t[1]), tonumber(t[2]) * 1000
else
  s, n = t_parse(ARGV[1])
end
SLACK = tonumber(ARGV[2])
local steps = {}
local ai, ki = 5, 1
local function read_limits()
  local ls = {}
  local count = tonumber(ARGV[ai])
  ai = ai + 1
  for i = 1, count do
    local alg = ALG[ARGV[ai]]
    local p = {}
    for j = 1, alg.nargs do p[j] = tonumber(ARGV[ai + j]) end
    ls[i] = {alg, ki, p}
    ai, ki = ai + 1 + alg.nargs, ki + alg.nkeys
  end
  return ls
end
for i = 1, tonumber(ARGV[4]) do
  local flags, cost = ARGV[ai], tonumber(ARGV[ai + 1])
  ai = ai + 2
  local main = read_limits()
  local pool = read_limits()
  steps[i] = {
    shadow = string.find(flags, 's', 1, true) ~= nil,
    elastic = string.find(flags, 'e', 1, true) ~= nil,
    to_main = string.find(flags, 'm', 1, true) ~= nil,
    to_pool = string.find(flags, 'p', 1, true) ~= nil,
    cost = cost, main = main, pool = pool,
  }
end

if ARGV[3] == 'r' then
  for i = 1, #steps do
    local st = steps[i]
    local ls = st.main
    if #st.pool > 0 and not st.to_main then
      if st.to_pool then
        ls = st.pool
      else
        local d = decide(st.pool, s, n, 0, false)
        if d[3] < d[2] then ls = st.pool end
      end
    end
    for j = 1, #ls do ls[j][1].refund(ls[j][2], ls[j][3], s, n, st.cost) end
  end
  return #steps
end

local main, pool = {}, {}
local denier = 0
for i = 1, #steps do
  local st = steps[i]
  if not st.shadow then
    local d = decide(st.main, s, n, st.cost, false)
    local e
    if d[1] == 1 and st.elastic and #st.pool > 0 then e = decide(st.pool, s, n, st.cost, false) end
    main[i], pool[i] = d, e
    if denier == 0 and d[1] ~= 0 and not (e and e[1] == 0) then denier = i end
  end
end
if denier == 0 then
  for i = 1, #steps do
    local st = steps[i]
    main[i] = decide(st.main, s, n, st.cost, true)
    if not st.shadow and main[i][1] ~= 0 and pool[i] then
      pool[i] = decide(st.pool, s, n, st.cost, true)
    end
  end
else
  for i = 1, denier do
    local st = steps[i]
    if not st.shadow and main[i][1] ~= 0 then
      main[i] = decide(st.main, s, n, st.cost, true)
      if i == denier and pool[i] then pool[i] = decide(st.pool, s, n, st.cost, true) end
    end
  end
end
local out = {denier}
local none = {-1, 0, 0, 0, -1, 0}
for i = 1, #steps do
  for _, d in ipairs({main[i] or none, pool[i] or none}) do
    for j = 1, 6 do out[#out + 1] = d[j] end
  end
end
return out
