-- sliding_window.lua: the two-window weighted counter (src/algo/sliding_window.rs).
-- Record: packed in a bucket, the current window's start in ns plus previous * K + current
-- (K = the largest count + 1), one decimal integer, when K^2 <= window (the counts then fit
-- below a window; the bucket's name says K); else "<window start ns> <previous> <current>"
-- (which a limit of another K reads alike: a key of its own carries its counts across a
-- change of the limit, as in memory). Idle when both counts have slid out.
-- Parameters: limit, window ns, count_denied (0/1).
local SW_MAX = 1048575 -- 2^20 - 1, the packed counters' saturation
ALG.sw = {nargs = 3, bucket = true}
ALG.sw.cd = function(p) return p[3] == 1 end
ALG.sw.prep = function(p, packed)
  local cap = p[1]
  if p[3] == 1 then cap = SW_MAX end
  p.k = cap + 1
  p.int = packed and p.k * p.k <= p[2]
end
local function sw_decode(v, p)
  if not string.find(v, ' ', 1, true) then
    local vs, vn = t_parse(v)
    local r = t_mod(vs, vn, p[2])
    local ss, sn = t_add(vs, vn, -r)
    local pv = idiv(r, p.k)
    return ss, sn, pv, r - pv * p.k
  end
  local a, pv, cu = string.match(v, '(%d+) (%d+) (%d+)')
  local ss, sn = t_parse(a)
  return ss, sn, pv + 0, cu + 0
end
local function sw_encode(p, ws, wn, prev, cur)
  -- A count past the limit (a settled charge) may not fit below K: then the spaced form.
  if p.int and prev < p.k and cur < p.k then return t_str(t_add(ws, wn, prev * p.k + cur)) end
  return t_str(ws, wn) .. ' ' .. string.format('%d %d', prev, cur)
end
-- (window start s, n, previous, current, elapsed) at now.
local function sw_view(r, p, s, n)
  local w = p[2]
  local e = t_mod(s, n, w)
  local cs, cn = t_add(s, n, -e)
  local v = rec_get(r)
  if v then
    local ss, sn, pv, cu = sw_decode(v, p)
    local d = t_far(cs, cn, ss, sn)
    if d == 0 then return cs, cn, pv, cu, e end
    if d == w then return cs, cn, cu, 0, e end
    -- Time went backwards, by less than 2^11 windows (the in-memory AHEAD): the stored
    -- window, at elapsed 0; farther ahead, expired.
    if d < 0 and d > -FAR and pv + cu > 0 and -d <= 2048 * w then return ss, sn, pv, cu, 0 end
  end
  return cs, cn, 0, 0, e
end
-- Smallest x in [0, W) with floor(prev (W - x) / W) <= a.
local function sw_first(prev, w, a)
  if prev == 0 then return 0 end
  local q, r = muldiv(a + 1, w, prev)
  if r > 0 then q = q + 1 end
  return sat(w + 1 - q)
end
-- ns from now to when counts (prev, cur) of the window starting `lead` ns from now slide out.
local function sw_reset(lead, w, prev, cur)
  if cur > 0 then return lead + 2 * w elseif prev > 0 then return lead + w end
  return 0
end
local function sw_put(r, p, ws, wn, s, n, prev, cur)
  local idle = sw_reset(t_diff(ws, wn, s, n), p[2], prev, cur)
  rec_put(r, sw_encode(p, ws, wn, prev, cur), idle, true, s, n)
end
-- ns until `cost` fits with `cur2` counted now (-1: never).
local function sw_retry(p, prev, e, lead, cur2, cost)
  local limit, w = p[1], p[2]
  if cost > limit then return -1 end
  local at
  if cur2 + cost <= limit then
    at = math.max(sw_first(prev, w, limit - cur2 - cost), e + 1)
  else
    at = w + sw_first(cur2, w, limit - cost)
  end
  return lead + at
end
ALG.sw.step = function(r, p, s, n, cost, apply)
  local limit, w, cd = p[1], p[2], p[3] == 1
  local ws, wn, prev, cur, e = sw_view(r, p, s, n)
  -- ns from now to the start of the window the record is in (negative but for time going
  -- backwards, where that window starts after now).
  local lead = t_diff(ws, wn, s, n)
  local weighted = muldiv(prev, w - e, w)
  local est = weighted + cur
  if cost == 0 then return allow(limit, sat(limit - est), sw_reset(lead, w, prev, cur)) end
  if est + cost <= limit then
    local cur2 = cur + cost
    if apply then sw_put(r, p, ws, wn, s, n, prev, cur2) end
    return allow(limit, limit - est - cost, sw_reset(lead, w, prev, cur2))
  end
  -- With count_denied a denial that can be retried is counted, and the retry waits for it.
  if cd and cost <= limit then
    local counted = math.min(cur + cost, SW_MAX)
    if apply then sw_put(r, p, ws, wn, s, n, prev, counted) end
    return deny(limit, sat(limit - weighted - counted), sw_reset(lead, w, prev, counted),
      sw_retry(p, prev, e, lead, counted, cost))
  end
  return deny(limit, sat(limit - est), sw_reset(lead, w, prev, cur),
    sw_retry(p, prev, e, lead, cur, cost))
end
ALG.sw.refund = function(r, p, s, n, m)
  if not rec_get(r) then return end
  local ws, wn, prev, cur = sw_view(r, p, s, n)
  sw_put(r, p, ws, wn, s, n, prev, sat(cur - m))
end
ALG.sw.idle = function(v, p, s, n)
  local ss, sn, pv, cu = sw_decode(v, p)
  local since = t_far(s, n, ss, sn)
  if cu > 0 then return since >= 2 * p[2] end
  return pv == 0 or since >= p[2]
end
-- Takes m more in the current window whatever the limit (sliding_window::charge): up to
-- SW_MAX, weighing on the next window as any count does.
ALG.sw.charge = function(r, p, s, n, m)
  local ws, wn, prev, cur = sw_view(r, p, s, n)
  sw_put(r, p, ws, wn, s, n, prev, math.min(cur + m, SW_MAX))
end
