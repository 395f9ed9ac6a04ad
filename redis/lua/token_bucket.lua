-- token_bucket.lua: GCRA, one theoretical arrival time per key (src/algo/token_bucket.rs).
-- KEYS: 1, the TAT in ns (decimal), TTL until it is in the past (the bucket full).
-- ARGV (after the driver's): capacity, T (ns per token), tau = capacity x T.
-- Reply: a decision (prelude.lua).
ALG.tb = { nkeys = 1, nargs = 3 }
ALG.tb.cd = function(p) return false end
-- The TAT, or now when absent or past (a full bucket), and the backlog TAT - now >= 0.
local function gcra_view(key, s, n)
  local v = redis.call('GET', key)
  if v then
    local ts, tn = t_parse(v)
    local b = t_diff(ts, tn, s, n)
    if b > 0 then return ts, tn, b end
  end
  return s, n, 0
end
-- max(TAT, now) + cost T, or nil when that reaches 2^63 - 1 ns (the packed TAT's ceiling).
local function gcra_advance(ts, tn, add)
  local ns, nn = t_add(ts, tn, add)
  if ns > MAXT_S or (ns == MAXT_S and nn >= MAXT_N) then return nil end
  return ns, nn
end
-- ns from now to 2^63 - 1 ns (what a saturated TAT leaves).
local function gcra_to_max(s, n) return t_diff(MAXT_S, MAXT_N, s, n) end
ALG.tb.step = function(k, p, s, n, cost, apply)
  local cap, t, tau = p[1], p[2], p[3]
  local ts, tn, backlog = gcra_view(KEYS[k], s, n)
  local rem = idiv(sat(tau - backlog), t)
  if cost == 0 then return allow(cap, rem, backlog) end
  if cost > cap then return deny(cap, rem, backlog, -1) end
  local ns, nn = gcra_advance(ts, tn, cost * t)
  local after
  if ns then after = t_diff(ns, nn, s, n) else after = gcra_to_max(s, n) end
  if ns and after <= tau then
    if apply then put(KEYS[k], t_str(ns, nn), after) end
    return allow(cap, idiv(tau - after, t), after)
  end
  return deny(cap, rem, backlog, math.max(after - tau, 1))
end
ALG.tb.refund = function(k, p, s, n, m)
  local ts, tn, backlog = gcra_view(KEYS[k], s, n)
  if backlog == 0 then return end
  local back = math.min(m * p[2], backlog)
  local ns, nn = t_add(ts, tn, -back)
  put(KEYS[k], t_str(ns, nn), backlog - back)
end
