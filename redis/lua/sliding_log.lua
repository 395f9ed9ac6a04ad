-- sliding_log.lua: the exact log of admission times (src/algo/sliding_log.rs). Needs zset.lua.
-- KEYS: 1, a sorted set (zset.lua): one member per admission (per denial too with
--       count_denied) at its time rounded up to a tick, never earlier than the newest; at
--       most `limit` members; every write drops those that have left the window; TTL until
--       the newest has left it.
-- ARGV (after the driver's): limit, window ns, count_denied (0/1), tick ns.
-- Reply: a decision (prelude.lua).
ALG.sl = { nkeys = 1, nargs = 4 }
ALG.sl.cd = function(p) return p[3] == 1 end

-- The log at now: the set (nil if absent), now's score, members live and expired (the
-- expired are the oldest), ns until the newest expires.
local function sl_view(key, p, s, n)
  local z = z_open(key)
  if not z then return nil, 0, 0, 0, 0 end
  local now_rel = t_diff(s, n, z.s, z.n)
  local total = redis.call('ZCARD', key) - 1
  local live = z_count_above(key, now_rel - p[2])
  local newest = 0
  if live > 0 then newest = z_newest(key) + p[2] - now_rel end
  return z, now_rel, live, total - live, newest
end

-- Records `cost` admissions at now; returns ns until the newest expires.
local function sl_record(key, p, z, s, n, cost)
  -- Rounded up to a tick (never earlier than it happened), no earlier than the newest.
  local ts, tn = s, n
  local r = t_mod(s, n, p[4])
  if r > 0 then ts, tn = t_add(s, n, p[4] - r) end
  if z then
    local newest = z_newest(key)
    if newest then
      local ns, nn = t_add(z.s, z.n, newest)
      if t_diff(ns, nn, ts, tn) > 0 then ts, tn = ns, nn end
    end
  end
  local ds, dn = t_add(s, n, -p[2])
  z_add(key, z, ds, dn, ts, tn, cost)
  -- At most `limit` members: the oldest go, as the in-memory ring overwrites them.
  local total = redis.call('ZCARD', key) - 1
  if total > p[1] then redis.call('ZREMRANGEBYRANK', key, 1, total - p[1]) end
  local idle = t_diff(ts, tn, s, n) + p[2]
  z_expire(key, idle)
  return idle
end

ALG.sl.step = function(k, p, s, n, cost, apply)
  local key, limit, w = KEYS[k], p[1], p[2]
  local z, now_rel, live, dead, newest = sl_view(key, p, s, n)
  if cost == 0 then return allow(limit, limit - live, newest) end
  if cost > limit then return deny(limit, limit - live, newest, -1) end
  local over = live + cost - limit
  if over <= 0 then
    local d = allow(limit, limit - math.min(live + cost, limit), w)
    if apply then d[4] = sl_record(key, p, z, s, n, cost) end
    return d
  end
  -- Denied until the over-th oldest live admission leaves the window.
  if p[3] == 1 and apply then
    -- Logged too: the retry waits for the log as it now is.
    sl_record(key, p, z, s, n, cost)
    local _, now2, live2, dead2, newest2 = sl_view(key, p, s, n)
    local retry = z_score_at(key, dead2 + live2 + cost - limit) + w - now2
    return deny(limit, limit - live2, newest2, retry)
  end
  return deny(limit, limit - live, newest, z_score_at(key, dead + over) + w - now_rel)
end

-- Gives back the newest m admissions (as the in-memory ring does, live or not).
ALG.sl.refund = function(k, p, s, n, m)
  local key = KEYS[k]
  if not z_open(key) then return end
  local take = math.min(m, redis.call('ZCARD', key) - 1)
  if take > 0 then redis.call('ZREMRANGEBYRANK', key, -take, -1) end
  local _, _, _, _, newest = sl_view(key, p, s, n)
  z_expire(key, newest)
end
