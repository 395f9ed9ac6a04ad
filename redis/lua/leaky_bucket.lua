-- leaky_bucket.lua: nginx limit_req as GCRA, meter or shaper (src/algo/leaky_bucket.rs).
-- Needs token_bucket.lua's gcra_* helpers before it.
-- Record: the TAT in ns (decimal). Idle once it is past (the queue empty).
-- Parameters: capacity (burst + 1), T, tau = (burst + 1) T, free = (delay + 1) T.
ALG.lb = {nargs = 4, bucket = true}
ALG.lb.cd = ALG.tb.cd
ALG.lb.step = function(r, p, s, n, cost, apply)
  local d, ns, nn, after = gcra_step(r, p[1], p[2], p[3], s, n, cost)
  if ns then
    d[6] = sat(after - p[4])
    if apply then rec_put(r, t_str(ns, nn), after, false, s, n) end
  end
  return d
end
ALG.lb.refund = ALG.tb.refund
ALG.lb.charge = ALG.tb.charge
ALG.lb.idle = ALG.tb.idle
