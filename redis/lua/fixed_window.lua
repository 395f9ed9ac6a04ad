-- fixed_window.lua: one counter per window (src/algo/fixed_window.rs).
-- KEYS: 1, the counter: "<window start ns> <count>", TTL until the window ends.
-- ARGV (after the driver's): limit, window ns, count_denied (0/1).
-- Reply: a decision (prelude.lua).
ALG.fw = { nkeys = 1, nargs = 3 }
ALG.fw.cd = function(p) return p[3] == 1 end
local FW_MAX = 16777215 -- 2^24 - 1, the packed counter's saturation
-- (window start, count, ns until that window ends) at now.
local function fw_view(key, p, s, n)
  local w = p[2]
  local r = t_mod(s, n, w)
  local cs, cn = t_add(s, n, -r)
  local v = redis.call('GET', key)
  if v then
    local a, c = string.match(v, '(%d+) (%d+)')
    local ss, sn = t_parse(a)
    c = tonumber(c)
    local d = t_diff(ss, sn, cs, cn)
    if d == 0 then return cs, cn, c, w - r end
    -- Time went backwards, by less than 2^27 windows (the in-memory AHEAD): the stored
    -- window; farther ahead, expired.
    if d > 0 and c > 0 and d <= 134217728 * w then return ss, sn, c, d + w - r end
  end
  return cs, cn, 0, w - r
end
ALG.fw.step = function(k, p, s, n, cost, apply)
  local limit, cd = p[1], p[3] == 1
  local ws, wn, count, ends = fw_view(KEYS[k], p, s, n)
  local function reset(c) if c == 0 then return 0 end return ends end
  if cost == 0 then return allow(limit, sat(limit - count), reset(count)) end
  if count + cost <= limit then
    local c = count + cost
    if apply then put(KEYS[k], t_str(ws, wn) .. ' ' .. c, ends) end
    return allow(limit, limit - c, ends)
  end
  local retry = ends
  if cost > limit then retry = -1 end
  local c = count
  -- A denial is counted only if it could ever fit (never-fitting requests change nothing).
  if cd and cost <= limit then
    c = math.min(count + cost, FW_MAX)
    if apply then put(KEYS[k], t_str(ws, wn) .. ' ' .. c, reset(c)) end
  end
  return deny(limit, sat(limit - c), reset(c), retry)
end
ALG.fw.refund = function(k, p, s, n, m)
  local ws, wn, count, ends = fw_view(KEYS[k], p, s, n)
  local c = sat(count - m)
  local idle = ends
  if c == 0 then idle = 0 end
  put(KEYS[k], t_str(ws, wn) .. ' ' .. c, idle)
end
