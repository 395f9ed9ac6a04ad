-- token_bucket.lua: GCRA, one theoretical arrival time per key (src/algo/token_bucket.rs).
-- Record: the TAT in ns (decimal; a listpack keeps it in 9 bytes). Idle once it is past.
-- Parameters: capacity, T (ns per token), tau = capacity x T.
ALG.tb = {code = 'tb', nargs = 3, bucket = true}
ALG.tb.cd = function(p) return false end
-- The TAT, or now when absent or past (a full bucket), and the backlog TAT - now >= 0 (FAR:
-- far beyond any tau, after the clock stepped back).
local function gcra_view(r, s, n)
  local v = rec_get(r)
  if v then
    local ts, tn = t_parse(v)
    local b = t_far(ts, tn, s, n)
    if b > 0 then return ts, tn, b end
  end
  return s, n, 0
end
-- One GCRA step (src/algo/token_bucket.rs, Gcra): `cost` fits iff max(TAT, now) + cost T <=
-- top, top = min(now + tau, 2^63 - 2 ns: the last time a TAT can hold). Offsets from now are
-- exact: backlog, tau and cost T are each at most 2^52. Returns the decision (without a
-- shaper's delay) and, when admitted, the new TAT (s, n) and its offset from now.
local function gcra_step(r, cap, t, tau, s, n, cost)
  local ts, tn, backlog = gcra_view(r, s, n)
  -- ns from now to the last time a TAT can hold (FAR: farther than any need here, as need
  -- <= backlog + tau <= 2^53; then no limit).
  local last = t_far(MAXT_S, MAXT_N - 1, s, n)
  if last >= FAR then last = 2 * FAR + 1 end
  local top = math.min(tau, last)
  local rem = idiv(sat(top - backlog), t)
  if cost == 0 then return allow(cap, rem, backlog) end
  local need = backlog + cost * t
  if cost <= cap and need <= top then
    local ns, nn = t_add(ts, tn, cost * t)
    return allow(cap, idiv(top - need, t), need), ns, nn, need
  end
  if cost > cap or need > last then
    return deny(cap, rem, backlog, -1)
  end
  return deny(cap, rem, backlog, need - tau)
end
ALG.tb.step = function(r, p, s, n, cost, apply)
  local d, ns, nn, after = gcra_step(r, p[1], p[2], p[3], s, n, cost)
  if ns and apply then rec_put(r, t_str(ns, nn), after, false, s, n) end
  return d
end
-- Gives m tokens back, not past now. A TAT brought back to now is kept: at an earlier time
-- it still holds a backlog (as in memory).
ALG.tb.refund = function(r, p, s, n, m)
  local ts, tn, backlog = gcra_view(r, s, n)
  if backlog == 0 then return end
  local back = math.min(m * p[2], backlog)
  local ns, nn = t_add(ts, tn, -back)
  rec_put(r, t_str(ns, nn), backlog - back, false, s, n)
end
ALG.tb.idle = function(v, p, s, n)
  local ts, tn = t_parse(v)
  return t_far(ts, tn, s, n) <= 0
end
-- Takes m tokens whatever the bucket holds (token_bucket::charge): the TAT moves m T later,
-- from now if the bucket was full, so the bucket owes them. The debt is capped at 2^52 - 1
-- ns past now (52 days: every offset from now stays exact in a double; in memory, at 2^63
-- ns), and at 2^63 - 2 ns, the last time a TAT holds. A TAT already that far ahead (the
-- clock stepped back) is left as it is.
ALG.tb.charge = function(r, p, s, n, m)
  local ts, tn, backlog = gcra_view(r, s, n)
  if backlog >= FAR then return end
  local add = FAR - 1 - backlog
  if m <= idiv(add, p[2]) then add = m * p[2] end
  ts, tn = t_add(ts, tn, add)
  if ts > MAXT_S or (ts == MAXT_S and tn > MAXT_N - 1) then ts, tn = MAXT_S, MAXT_N - 1 end
  rec_put(r, t_str(ts, tn), t_far(ts, tn, s, n), false, s, n)
end
