-- fixed_window.lua: one counter per window (src/algo/fixed_window.rs).
-- Record: the window's start in ns plus its count, one decimal integer, when every count the
-- limit can hold is below the window (then start = value - value mod window; a listpack
-- keeps it in 9 bytes); else "<window start ns> <count>" (read by the space in it, whichever
-- the limit writes). Idle when the window ends.
-- Parameters: limit, window ns, count_denied (0/1).
local FW_MAX = 16777215 -- 2^24 - 1, the packed counter's saturation
ALG.fw = {code = 'fw', nargs = 3, bucket = true}
ALG.fw.cd = function(p) return p[3] == 1 end
ALG.fw.prep = function(p)
  local cap = p[1]
  if p[3] == 1 then cap = FW_MAX end
  p.int = cap < p[2]
end
-- The record's window start and count.
local function fw_decode(v, p)
  if not string.find(v, ' ', 1, true) then
    local vs, vn = t_parse(v)
    local c = t_mod(vs, vn, p[2])
    local ss, sn = t_add(vs, vn, -c)
    return ss, sn, c
  end
  local a, c = string.match(v, '(%d+) (%d+)')
  local ss, sn = t_parse(a)
  return ss, sn, c + 0
end
local function fw_encode(p, ws, wn, c)
  -- A count past the limit (a settled charge) may reach the window: then the spaced form.
  if p.int and c < p[2] then return t_str(t_add(ws, wn, c)) end
  return t_str(ws, wn) .. ' ' .. string.format('%d', c)
end
-- (window start, count, ns until that window ends, whether it is the stored window) at now.
local function fw_view(r, p, s, n)
  local w = p[2]
  local rem = t_mod(s, n, w)
  local cs, cn = t_add(s, n, -rem)
  local v = rec_get(r)
  if v then
    local ss, sn, c = fw_decode(v, p)
    local d = t_far(ss, sn, cs, cn)
    if d == 0 then return cs, cn, c, w - rem, true end
    -- Time went backwards, by less than 2^27 windows (the in-memory AHEAD): the stored
    -- window; farther ahead, expired.
    if d > 0 and c > 0 and d < FAR and d <= 134217728 * w then
      return ss, sn, c, d + w - rem, true
    end
  end
  return cs, cn, 0, w - rem, false
end
ALG.fw.step = function(r, p, s, n, cost, apply)
  local limit, cd = p[1], p[3] == 1
  local ws, wn, count, ends, same = fw_view(r, p, s, n)
  local reset = ends
  if count == 0 then reset = 0 end
  if cost == 0 then return allow(limit, sat(limit - count), reset) end
  if count + cost <= limit then
    local c = count + cost
    if apply then rec_put(r, fw_encode(p, ws, wn, c), ends, true, s, n, same and count > 0) end
    return allow(limit, limit - c, ends)
  end
  local retry = ends
  if cost > limit then retry = -1 end
  local c = count
  -- A denial is counted only if it could ever fit (never-fitting requests change nothing).
  if cd and cost <= limit then
    c = math.min(count + cost, FW_MAX)
    if apply then rec_put(r, fw_encode(p, ws, wn, c), ends, true, s, n, same and count > 0) end
    reset = ends
  end
  return deny(limit, sat(limit - c), reset, retry)
end
ALG.fw.refund = function(r, p, s, n, m)
  if not rec_get(r) then return end
  local ws, wn, count, ends = fw_view(r, p, s, n)
  local c = sat(count - m)
  local idle = ends
  if c == 0 then idle = 0 end
  rec_put(r, fw_encode(p, ws, wn, c), idle, true, s, n)
end
ALG.fw.idle = function(v, p, s, n)
  local ss, sn, c = fw_decode(v, p)
  return c == 0 or t_far(s, n, ss, sn) >= p[2]
end
-- Takes m more in the current window whatever the limit (fixed_window::charge): up to
-- FW_MAX, forgotten when the window ends.
ALG.fw.charge = function(r, p, s, n, m)
  local ws, wn, count, ends, same = fw_view(r, p, s, n)
  local c = math.min(count + m, FW_MAX)
  rec_put(r, fw_encode(p, ws, wn, c), ends, true, s, n, same and count > 0)
end
