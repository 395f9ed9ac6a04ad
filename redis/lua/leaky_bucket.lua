-- leaky_bucket.lua: nginx limit_req as GCRA, meter or shaper (src/algo/leaky_bucket.rs).
-- Needs token_bucket.lua's gcra_* helpers before it.
-- KEYS: 1, the TAT in ns (decimal), TTL until it is in the past (the queue empty).
-- ARGV (after the driver's): capacity (burst + 1), T, tau = (burst + 1) T, free = (delay + 1) T.
-- Reply: a decision (prelude.lua), with the shaper's delay.
ALG.lb = { nkeys = 1, nargs = 4 }
ALG.lb.cd = function(p) return false end
ALG.lb.step = function(k, p, s, n, cost, apply)
  local cap, t, tau, free = p[1], p[2], p[3], p[4]
  local ts, tn, backlog = gcra_view(KEYS[k], s, n)
  local rem = idiv(sat(tau - backlog), t)
  if cost == 0 then return allow(cap, rem, backlog) end
  if cost > cap then return deny(cap, rem, backlog, -1) end
  local ns, nn = gcra_advance(ts, tn, cost * t)
  local after
  if ns then after = t_diff(ns, nn, s, n) else after = gcra_to_max(s, n) end
  if ns and after <= tau then
    if apply then put(KEYS[k], t_str(ns, nn), after) end
    local d = allow(cap, idiv(tau - after, t), after)
    d[6] = sat(after - free)
    return d
  end
  return deny(cap, rem, backlog, math.max(after - tau, 1))
end
ALG.lb.refund = ALG.tb.refund
