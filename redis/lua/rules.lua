-- rules.lua: a request of the rules engine decided in one call (turnstile::rules::Plan): the
-- rules engine's function (registered at the end of the library).
--
-- keys: each step's keys: its own limits' (one per limit, in order), then its elastic pool's.
--       All of one call's keys share one Redis Cluster slot, or the server is one node.
-- args: [1] op: "c" check, "r" refund, "s" settle; then the explicit now in ns if any (else
--           TIME);
--       [2] the plan's spec (cached, spec.lua): the number of steps, then per step its flags
--           (letters, or "-" for none: "s" a shadow rule, "e" the elastic pool may be drawn),
--           its limits ("<count> <code> <parameters...>...") and its pool's (count 0: none);
--       [3] each step's cost (a settle: the reserved cost), space-separated;
--       [4] refund: per step a letter: "a" as the engine (to the pool if it holds a charge,
--           as Engine::refund), "m" to the limits, "p" to the pool; settle: each step's actual
--           cost, space-separated (settle.lua).
-- Reply: check: "<denier>" (0: every enforcing step admits; else the first that denies, from
--        1), then per step 12 integers: its limits' decision and its pool's (prelude.lua's
--        six fields; outcome -1: not asked), all space-separated. Refund, settle: the number
--        of steps given the cost back or settled.
--
-- The engine's protocol, exactly: enforcing steps are asked in order without recording; if
-- all admit (by their limits, or an elastic rule by its pool while its limits deny as
-- Limited), each records (a pool admission records the limits' denial first, as the
-- engine's limits check does) and then the shadow steps record. If one denies, nothing is
-- recorded but what the engine leaves after its refunds: the count_denied denials of the steps
-- up to it whose limits denied, and the denier's pool check. The steps after the denier are
-- evaluated (recording nothing), for the latest retry.
local function parse_plan(t)
  local steps, at = {}, 2
  for i = 1, tonumber(t[1]) do
    local flags = t[at]
    local st = {
      shadow = string.find(flags, 's', 1, true) ~= nil,
      elastic = string.find(flags, 'e', 1, true) ~= nil,
    }
    st.main, at = spec_limits(t, at + 1, false)
    st.pool, at = spec_limits(t, at, false)
    steps[i] = st
  end
  return steps
end

local function rules_call(keys, args)
  local plan = cached(args[2], parse_plan)
  local s, n = call_time(args[1])
  local costs = spec_words(args[3])
  local op = string.sub(args[1], 1, 1)
  local targets = ''
  if op == 'r' then targets = args[4] or '' end
  local steps, k = {}, 1
  for i = 1, #plan do
    local p = plan[i]
    local st = {shadow = p.shadow, elastic = p.elastic, cost = tonumber(costs[i])}
    st.main = bind(p.main, keys, k, nil)
    k = k + #p.main
    st.pool = bind(p.pool, keys, k, nil)
    k = k + #p.pool
    local target = string.sub(targets, i, i)
    st.to_main, st.to_pool = target == 'm', target == 'p'
    steps[i] = st
  end
  if k - 1 ~= #keys or (#steps > 0 and not steps[#steps].cost) then
    return redis.error_reply('ERR turnstile: keys or costs do not match the plan')
  end
  if op == 'r' or op == 's' then
    local actual = {}
    if op == 's' then
      actual = spec_words(args[4] or '')
      if #actual ~= #steps then
        return redis.error_reply('ERR turnstile: actual costs do not match the plan')
      end
    end
    for i = 1, #steps do
      local st = steps[i]
      local back = st.cost
      if op == 's' then back = settle_step(st, s, n, tonumber(actual[i])) end
      if back > 0 then
        local ls = st.main
        if #st.pool > 0 and not st.to_main then
          if st.to_pool then
            ls = st.pool
          else
            local d = decide(st.pool, s, n, 0, false)
            if d[3] < d[2] then ls = st.pool end
          end
        end
        for j = 1, #ls do ls[j][1].refund(ls[j][2], ls[j][3], s, n, back) end
      end
    end
    for i = 1, #steps do
      rec_flush_all(steps[i].main)
      rec_flush_all(steps[i].pool)
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
    rec_flush_all(steps[i].main)
    rec_flush_all(steps[i].pool)
    out[#out + 1] = reply6(main[i] or none)
    out[#out + 1] = reply6(pool[i] or none)
  end
  return table.concat(out, ' ')
end
