-- fast.lua: a store of one fixed_window or token_bucket limit (the commonest) checked with few
-- Lua operations: each call of a C function (string.sub, string.format, a table's creation)
-- costs the server several hundred to a few thousand instructions (measured: docs/redis.md),
-- so these decide inline from locals what fixed_window.lua / token_bucket.lua + limits.lua
-- decide for one limit. Anything they do not handle (a denial, a record ahead of now, a
-- window neither dividing nor a multiple of a second, the end of the clock) returns nil and
-- goes to the generic path, at the same instant. (No keys, arguments or reply of their own:
-- store.lua calls them.)

-- The decimal of (s, n + c), c + n < 2^53.
local function fast_str(s, n, c)
  n = n + c
  if n >= E9 then
    local q = idiv(n, E9)
    s, n = s + q, n - q * E9
  end
  if s == 0 then return string.format('%d', n) end
  return string.format('%d%09d', s, n)
end

-- The record of `key` (its field in a bucket), and the bucket's meta.
local function fast_get(key, field)
  if field then
    local m = redis.call('HMGET', key, field, '~')
    return m[1], m[2]
  end
  return redis.call('GET', key), false
end

-- Writes `value` with a TTL of `idle` ns (a bucket: record.lua's bucket_put; a plain key:
-- KEEPTTL when its deadline is unchanged and the clock is the server's).
local function fast_put(key, field, alg, p, old, meta, value, idle, keep, s, n)
  local ms = ttl_ms(idle)
  if field then
    local r = {key = key, field = field, alg = alg, p = p, v0 = old, meta = false}
    if meta then r.meta = meta + 0 end
    bucket_put(r, value, ms, s, n)
  elseif keep and SLACK == 0 then
    redis.call('SET', key, value, 'KEEPTTL')
  else
    redis.call('SET', key, value, 'PX', ms)
  end
end

local function fast_fw(key, field, p, s, n, cost)
  local limit, w = p[1], p[2]
  if cost < 1 or cost > limit or not p.int then return nil end
  -- The window holding now starts at (cs, cn), rem ns before now.
  local rem, cs, cn
  if w % E9 == 0 then
    local q = s % (w / E9)
    rem, cs, cn = q * E9 + n, s - q, 0
  elseif E9 % w == 0 then
    rem = n % w
    cs, cn = s, n - rem
  else
    return nil
  end
  local v, meta = fast_get(key, field)
  local count = 0
  if v then
    -- The record is start + count, start a multiple of the window and count below it: its
    -- distance from this window's start is the count if in [0, w), an older window's if
    -- negative, a later window's (time went backwards: the generic path) if w or more.
    local len = #v
    if len <= 9 or string.find(v, ' ', 1, true) then return nil end
    local ds = string.sub(v, 1, len - 9) - cs
    if ds > FAR_S then return nil end
    if ds >= -FAR_S then
      local d = ds * E9 + (string.sub(v, len - 8) - cn)
      if d >= w then return nil end
      if d > 0 then count = d end
    end
  end
  if count + cost > limit then return nil end
  local c, ends = count + cost, w - rem
  fast_put(key, field, ALG.fw, p, v, meta, fast_str(cs, cn, c), ends, count > 0, s, n)
  return string.format('%d %d %d', limit, limit - c, ends)
end

local function fast_tb(key, field, p, s, n, cost)
  local cap, t, tau = p[1], p[2], p[3]
  -- Within 2^52 ns (a bucket's longest span) of the TAT's ceiling, 2^63 - 1 ns: the generic
  -- path.
  if cost < 1 or cost > cap or s >= MAXT_S - FAR_S - 1 then return nil end
  local v, meta = fast_get(key, field)
  local ts, tn, backlog = s, n, 0
  if v then
    local len = #v
    local vs, vn = 0, 0
    if len <= 9 then vn = v + 0 else vs, vn = string.sub(v, 1, len - 9) + 0, string.sub(v, len - 8) + 0 end
    local ds = vs - s
    if ds > FAR_S then return nil end
    if ds >= -FAR_S then
      local b = ds * E9 + (vn - n)
      if b > 0 then ts, tn, backlog = vs, vn, b end
    end
  end
  local need = backlog + cost * t
  if need > tau then return nil end
  fast_put(key, field, ALG.tb, p, v, meta, fast_str(ts, tn, cost * t), need, false, s, n)
  return string.format('%d %d %d', cap, idiv(tau - need, t), need)
end

local FAST = {fw = fast_fw, tb = fast_tb}
