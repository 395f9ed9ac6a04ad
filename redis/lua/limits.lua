-- limits.lua: several limits on one key decided all-or-nothing, exactly as
-- turnstile::Limits::decide (apply) and Limits::evaluate (not apply); after the algorithms,
-- before store.lua and rules.lua. No keys, arguments or reply of its own.
--
-- ls: a list of {algorithm, record handle (record.lua), parameters}.
-- decide(ls, s, n, cost, apply) -> a decision (prelude.lua). With apply, every limit
-- records an admission, or the limits counting denials record the denial; without, nothing
-- is recorded and a denial is described without the count a count_denied limit would add.
-- p with count_denied off (param 3 of the algorithms that count denials); made once per
-- cached spec. The record's encoding (prep's fields) stays p's: it is the same record.
local function counting_nothing(alg, p)
  if not alg.cd(p) then return p end
  if p.nocd then return p.nocd end
  local q = {}
  for k, x in pairs(p) do q[k] = x end
  q[3] = 0
  p.nocd = q
  return q
end
-- A denial of `cost` at now, described from the records as they are (Limits::denial): the
-- least remaining (a denying limit's on a tie), the latest reset, the latest retry of the
-- limits that deny (none, and never fits, if one never fits or if at that retry some limit
-- still denies: time went backwards, or the end of a clock).
local function denial(ls, s, n, cost)
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
  if out[5] >= 0 and out[5] < FAR then
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
end

local function decide(ls, s, n, cost, apply)
  if ls[2] == nil then
    local alg, k, p = ls[1][1], ls[1][2], ls[1][3]
    if apply then return alg.step(k, p, s, n, cost, true) end
    return alg.step(k, counting_nothing(alg, p), s, n, cost, false)
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
      local d = ls[i][1].step(ls[i][2], ls[i][3], s, n, cost, apply)
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
  -- Denied: limits counting denials record it (unless some limit can never fit the cost, or
  -- would never fit it once the denial is recorded: Limits::count_denial), and the answer
  -- describes the record as it then is.
  local counts = false
  for i = 1, #ls do counts = counts or ls[i][1].cd(ls[i][3]) end
  if not (fits and apply and counts) then return denial(ls, s, n, cost) end
  local saved = {}
  for i = 1, #ls do saved[i] = rec_save(ls[i][2]) end
  for i = 1, #ls do
    if ls[i][1].cd(ls[i][3]) then ls[i][1].step(ls[i][2], ls[i][3], s, n, cost, true) end
  end
  local out = denial(ls, s, n, cost)
  -- Limits of more than 64 words are recorded in place in memory, keeping the denial.
  if out[1] ~= 2 or ls.keeps then return out end
  for i = 1, #ls do rec_restore(ls[i][2], saved[i]) end
  return denial(ls, s, n, cost)
end
