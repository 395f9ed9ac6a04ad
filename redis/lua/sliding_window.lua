-- sliding_window.lua: the two-window weighted counter (src/algo/sliding_window.rs).
-- KEYS: 1, "<current window start ns> <previous> <current>", TTL until both counts slid out.
-- ARGV (after the driver's): limit, window ns, count_denied (0/1).
-- Reply: a decision (prelude.lua).
ALG.sw = { nkeys = 1, nargs = 3 }
ALG.sw.cd = function(p) return p[3] == 1 end
local SW_MAX = 1048575 -- 2^20 - 1, the packed counters' saturation
-- (window start s, n, previous, current, elapsed) at now.
local function sw_view(key, p, s, n)
  local w = p[2]
  local r = t_mod(s, n, w)
  local cs, cn = t_add(s, n, -r)
  local v = redis.call('GET', key)
  if v then
    local a, pv, cu = string.match(v, '(%d+) (%d+) (%d+)')
    local ss, sn = t_parse(a)
    pv, cu = tonumber(pv), tonumber(cu)
    local d = t_diff(cs, cn, ss, sn)
    if d == 0 then return cs, cn, pv, cu, r end
    if d == w then return cs, cn, cu, 0, r end
    -- Time went backwards, by less than 2^11 windows (the in-memory AHEAD): the stored
    -- window, at elapsed 0; farther ahead, expired.
    if d < 0 and pv + cu > 0 and -d <= 2048 * w then return ss, sn, pv, cu, 0 end
  end
  return cs, cn, 0, 0, r
end
local function sw_weighted(prev, w, e)
  local q = muldiv(prev, w - e, w)
  return q
end
-- Smallest x in [0, W) with floor(prev (W - x) / W) <= a.
local function sw_first(prev, w, a)
  if prev == 0 then return 0 end
  local q, r = muldiv(a + 1, w, prev)
  if r > 0 then q = q + 1 end
  return sat(w + 1 - q)
end
-- Stores the state; its TTL runs to the end of the window after the newest non-zero count's.
local function sw_put(key, w, ws, wn, s, n, prev, cur)
  local idle = 0
  if cur > 0 then idle = t_diff(ws, wn, s, n) + 2 * w
  elseif prev > 0 then idle = t_diff(ws, wn, s, n) + w end
  put(key, t_str(ws, wn) .. ' ' .. prev .. ' ' .. cur, idle)
end
ALG.sw.step = function(k, p, s, n, cost, apply)
  local limit, w, cd = p[1], p[2], p[3] == 1
  local ws, wn, prev, cur, e = sw_view(KEYS[k], p, s, n)
  -- ns from now to the start of the window the record is in (negative but for time going
  -- backwards, where that window starts after now).
  local lead = t_diff(ws, wn, s, n)
  local est = sw_weighted(prev, w, e) + cur
  local function reset_of(pv, cu)
    if cu > 0 then return lead + 2 * w elseif pv > 0 then return lead + w end
    return 0
  end
  if cost == 0 then return allow(limit, sat(limit - est), reset_of(prev, cur)) end
  if est + cost <= limit then
    local cur2 = cur + cost
    if apply then sw_put(KEYS[k], w, ws, wn, s, n, prev, cur2) end
    return allow(limit, limit - est - cost, reset_of(prev, cur2))
  end
  local function retry(cur2)
    if cost > limit then return -1 end
    local at
    if cur2 + cost <= limit then
      at = math.max(sw_first(prev, w, limit - cur2 - cost), e + 1)
    else
      at = w + sw_first(cur2, w, limit - cost)
    end
    return lead + at
  end
  -- With count_denied a denial that can be retried is counted, and the retry waits for it.
  if cd and cost <= limit then
    local counted = math.min(cur + cost, SW_MAX)
    if apply then sw_put(KEYS[k], w, ws, wn, s, n, prev, counted) end
    local est2 = sw_weighted(prev, w, e) + counted
    return deny(limit, sat(limit - est2), reset_of(prev, counted), retry(counted))
  end
  return deny(limit, sat(limit - est), reset_of(prev, cur), retry(cur))
end
ALG.sw.refund = function(k, p, s, n, m)
  local ws, wn, prev, cur = sw_view(KEYS[k], p, s, n)
  sw_put(KEYS[k], p[2], ws, wn, s, n, prev, sat(cur - m))
end
