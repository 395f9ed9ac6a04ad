-- concurrency.lua: requests in flight, each holding a lease until released or expired
-- (src/algo/concurrency.rs).
-- Record (a plain key): a sorted set, one member per lease cell, scored by its permit's stamp
-- (its expiry) in ns after a base time. Scores are doubles, exact below 2^53, while times in
-- ns are ~2^60: the base is named by one extra member, "b<base ns>", at score -(1 + seq),
-- below every stamp (rank 0); seq numbers the cells, whose members are "1", "2", ...
-- A permit of cost k holds k cells at one stamp; stamps are distinct among live permits, so a
-- stamp names its permit. Every acquire drops the expired cells first, and every score stays
-- in [0, 2^52): a stamp past 2^51 moves the base up to now (the cells left are all live, so
-- their scores only shrink); a clock stepped back moves the base down to now, and a lease
-- that would then score 2^52 or more (a step back of more than 2^51 ns) is held until 2^52 ns
-- after the new base, the latest a score can say. Hence a call's arithmetic is exact and
-- every loop ends: the stamp search takes at most 17 steps (limit <= 2^16).
-- Parameters: limit, lease ns (<= 2^51).
-- An acquire (mode "a") also answers the permit's stamp, in ns; a release ("x", the cost
-- argument being the stamp) answers the cells it freed.
ALG.cc = {nargs = 2, bucket = false}
ALG.cc.cd = function(p) return false end
local ZREBASE = 2251799813685248 -- 2^51
local ZMAX = 4503599627370496 -- 2^52

local function z_fmt(x) return string.format('%d', x) end

-- The set at `key`: {s, n (the base), bm (its member), seq}, or nil when absent.
local function z_open(key)
  local h = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if #h == 0 then return nil end
  local bs, bn = t_parse(string.sub(h[1], 2))
  return {s = bs, n = bn, bm = h[1], seq = -1 - tonumber(h[2])}
end

-- Every cell's score moved by -by (clamped into [1, ZMAX]) and the base to (s, n): at most
-- `limit` cells, in ZADDs of 256.
local function z_shift(key, z, by, s, n)
  local all = redis.call('ZRANGE', key, 1, -1, 'WITHSCORES')
  local args, j = {}, 0
  for i = 1, #all - 1, 2 do
    local sc = tonumber(all[i + 1]) - by
    if sc > ZMAX then sc = ZMAX elseif sc < 1 then sc = 1 end
    args[j + 1], args[j + 2] = z_fmt(sc), all[i]
    j = j + 2
    if j >= 512 then redis.call('ZADD', key, unpack(args)) args, j = {}, 0 end
  end
  if j > 0 then redis.call('ZADD', key, unpack(args, 1, j)) end
  redis.call('ZREM', key, z.bm)
  z.s, z.n = s, n
  z.bm = 'b' .. t_str(s, n)
  redis.call('ZADD', key, z_fmt(-1 - z.seq), z.bm)
end

-- The set at now, normalized so that now's score is within (-2^51, 2^52): {z (nil if
-- absent), now_rel}. Leases that all expired long ago are dropped (the key with them); a
-- clock stepped back far moves the base down to now (z_shift's clamp). Writes only then.
local function cc_open(key, s, n)
  local z = z_open(key)
  if not z then return nil, 0 end
  local now_rel = t_far(s, n, z.s, z.n)
  if now_rel >= ZMAX then
    -- Every score is below 2^52: every lease has expired.
    redis.call('DEL', key)
    return nil, 0
  end
  if now_rel <= -ZREBASE then
    z_shift(key, z, now_rel, s, n)
    return z, 0
  end
  return z, now_rel
end

-- Live and expired cells at now_rel, and ns until the last live lease expires.
local function cc_count(key, now_rel)
  local total = redis.call('ZCARD', key) - 1
  local live = redis.call('ZCOUNT', key, '(' .. z_fmt(now_rel), '+inf')
  local latest = 0
  if live > 0 then
    local r = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    latest = tonumber(r[2]) - now_rel
  end
  return live, total - live, latest
end

-- The score of the cell at `rank` (1: the oldest).
local function z_score_at(key, rank)
  return tonumber(redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')[2])
end

-- A free stamp at or above st (the in-memory store's choice: now + lease if no cell holds it,
-- else the nearest free value above): a binary search over the next `limit` values by cells
-- held; every value below 2^53, and ceil(log2(limit + 1)) <= 17 steps.
local function cc_stamp(key, st, limit)
  if redis.call('ZCOUNT', key, z_fmt(st), z_fmt(st)) == 0 then return st end
  local lo, hi = st, st + limit
  for _ = 0, 17 do
    if lo >= hi then break end
    local mid = lo + idiv((hi - lo), 2)
    if redis.call('ZCOUNT', key, z_fmt(lo), z_fmt(mid)) <= mid - lo then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return lo
end

-- Adds `cost` cells at score `sc` (the set created at base (s, n) if absent); returns z.
local function cc_add(key, z, s, n, sc, cost)
  if not z then z = {s = s, n = n, bm = 'b' .. t_str(s, n), seq = 0} end
  local at = z_fmt(sc)
  local i = 1
  for _ = 1, cost, 256 do
    local args, j = {}, 0
    for _ = 1, 256 do
      if i > cost then break end
      args[2 * j + 1], args[2 * j + 2] = at, z_fmt(z.seq + i)
      i, j = i + 1, j + 1
    end
    redis.call('ZADD', key, unpack(args))
  end
  z.seq = z.seq + cost
  redis.call('ZADD', key, z_fmt(-1 - z.seq), z.bm)
  return z
end

-- Stamp of the last acquire (the driver answers it with mode "a").
local CC_OUT = {}

ALG.cc.step = function(r, p, s, n, cost, apply)
  local key, limit, lease = r.key, p[1], p[2]
  local z, now_rel = cc_open(key, s, n)
  local active, dead, latest = 0, 0, 0
  if z then active, dead, latest = cc_count(key, now_rel) end
  local free = limit - active
  if cost == 0 then return allow(limit, free, latest) end
  if active + cost > limit then
    local retry = -1
    -- The (active + cost - limit)-th earliest expiry frees enough cells.
    if cost <= limit then retry = z_score_at(key, dead + active + cost - limit) - now_rel end
    return deny(limit, free, latest, retry)
  end
  if not apply then
    local st = now_rel + lease
    if z and st >= 0 then st = cc_stamp(key, st, limit) end
    return allow(limit, limit - active - cost, math.max(latest, st - now_rel))
  end
  if z and dead > 0 then
    -- Expired cells go (a clock stepping back will not see them live again).
    redis.call('ZREMRANGEBYSCORE', key, 0, z_fmt(now_rel))
    if active == 0 then
      redis.call('DEL', key)
      z = nil
    end
  end
  if not z then
    now_rel = 0
  elseif now_rel < 0 or (now_rel > 0 and now_rel + lease >= ZREBASE) then
    -- The base moves to now: up (the cells left are live, above now_rel) or down (a clock
    -- stepped back), so that the new stamp scores in [0, 2^52).
    z_shift(key, z, now_rel, s, n)
    now_rel = 0
  end
  local st = now_rel + lease
  if z then st = cc_stamp(key, st, limit) end
  local held = st - now_rel
  z = cc_add(key, z, s, n, st, cost)
  local ss, sn = t_add(s, n, held)
  CC_OUT.stamp = t_str(ss, sn)
  redis.call('PEXPIRE', key, ttl_ms(math.max(latest, held)))
  return allow(limit, limit - active - cost, math.max(latest, held))
end

-- A lease is not refunded by amount (it is released by its stamp).
ALG.cc.refund = function(r, p, s, n, m) end
-- A settled cost changes nothing: the limit counts permits in flight, not costs.
ALG.cc.charge = function(r, p, s, n, m) end

-- Frees the cells of the permit `stamp` (decimal ns); returns how many (0 if it expired).
ALG.cc.release = function(r, p, s, n, stamp)
  local key = r.key
  local z, now_rel = cc_open(key, s, n)
  if not z then return 0 end
  local ss, sn = t_parse(stamp)
  local rel = t_far(ss, sn, z.s, z.n)
  if rel < 0 or rel >= ZMAX then return 0 end
  local freed = redis.call('ZREMRANGEBYSCORE', key, z_fmt(rel), z_fmt(rel))
  if freed > 0 then
    local live, _, latest = cc_count(key, now_rel)
    if live == 0 then redis.call('DEL', key) else redis.call('PEXPIRE', key, ttl_ms(latest)) end
  end
  return freed
end
