-- concurrency.lua: requests in flight, each holding a lease until released or expired
-- (src/algo/concurrency.rs). Needs zset.lua.
-- KEYS: 1, a sorted set (zset.lua): one member per lease cell at its permit's stamp (its
--       expiry; a permit of cost k holds k members at one stamp, and stamps are distinct
--       among live permits, so a stamp names its permit); at most `limit` members, expired
--       ones dropped (oldest first) when their room is needed; TTL until the last lease
--       expires.
-- ARGV (after the driver's): limit, lease ns.
-- Reply: a decision (prelude.lua); after an acquire (driver mode "a") the permit's stamp in
--        ns (decimal, "" if none) is the 7th element. A release (mode "x") answers the cells
--        freed.
ALG.cc = { nkeys = 1, nargs = 2 }
ALG.cc.cd = function(p) return false end

-- The leases at now: the set (nil if absent), now's score, live and expired cells, ns until
-- the last live lease expires.
local function cc_view(key, s, n)
  local z = z_open(key)
  if not z then return nil, 0, 0, 0, 0 end
  local now_rel = t_diff(s, n, z.s, z.n)
  local total = redis.call('ZCARD', key) - 1
  local live = z_count_above(key, now_rel)
  local latest = 0
  if live > 0 then latest = z_newest(key) - now_rel end
  return z, now_rel, live, total - live, latest
end

ALG.cc.step = function(k, p, s, n, cost, apply)
  local key, limit, lease = KEYS[k], p[1], p[2]
  local z, now_rel, active, dead, latest = cc_view(key, s, n)
  local free = limit - active
  if cost == 0 then return allow(limit, free, latest) end
  if active + cost > limit then
    local retry = -1
    -- The (active + cost - limit)-th earliest expiry frees enough cells.
    if cost <= limit then retry = z_score_at(key, dead + active + cost - limit) - now_rel end
    return deny(limit, free, latest, retry)
  end
  -- The stamp: now + lease if no cell holds it, else the in-memory store's choice above it:
  -- a binary search over the next `limit` values by cells held (src/algo/concurrency.rs).
  local st = now_rel + lease
  if z and redis.call('ZCOUNT', key, z_fmt(st), z_fmt(st)) > 0 then
    local lo, hi = st, st + limit
    while lo < hi do
      local mid = lo + math.floor((hi - lo) / 2)
      if redis.call('ZCOUNT', key, z_fmt(lo), z_fmt(mid)) <= mid - lo then
        hi = mid
      else
        lo = mid + 1
      end
    end
    st = lo
  end
  local held = st - now_rel
  local d = allow(limit, limit - active - cost, math.max(latest, held))
  if apply then
    local ss, sn = t_add(s, n, held)
    -- Expired leases stay until their room is needed, oldest first, as in-memory cells stay
    -- until reused: a clock stepping back then sees them live again, as memory does.
    local over = active + dead + cost - limit
    if over > 0 then redis.call('ZREMRANGEBYRANK', key, 1, over) end
    z_add(key, z, nil, nil, ss, sn, cost)
    OUT.stamp = t_str(ss, sn)
    z_expire(key, math.max(latest, held))
  end
  return d
end

-- A lease cannot be refunded by amount (it is released by its stamp).
ALG.cc.refund = function(k, p, s, n, m) end

-- Frees the cells of the permit `stamp` (decimal ns); returns how many (0 if it expired).
ALG.cc.release = function(k, p, s, n, stamp)
  local key = KEYS[k]
  local z = z_open(key)
  if not z then return 0 end
  local ss, sn = t_parse(stamp)
  local rel = t_diff(ss, sn, z.s, z.n)
  if rel < 0 or rel >= 9007199254740992 then return 0 end
  local freed = redis.call('ZREMRANGEBYSCORE', key, z_fmt(rel), z_fmt(rel))
  if freed > 0 then
    local _, _, _, _, latest = cc_view(key, s, n)
    z_expire(key, latest)
  end
  return freed
end
