-- sliding_log.lua: the exact log of admission times (src/algo/sliding_log.rs).
-- Record (a plain key): "<base ns>:" then one 4-byte big-endian entry per admission (per
-- denial too with count_denied), oldest first: the entry's time is base + entry x tick, its
-- time rounded up to a tick and never earlier than the newest's. Every write drops the
-- entries that have left the window and any beyond the newest `limit`; when an entry would
-- pass 2^32 - 2 ticks or 2^51 ns the base moves to the oldest entry kept (O(limit), at most
-- once per window; so a live entry is always within 2^52 ns of the base, exact in a double).
-- TTL until the newest entry has left the window.
-- 500 entries: 2 000 bytes and the base (a sorted set: about 95 bytes a member).
-- Parameters: limit, window ns, count_denied (0/1), tick ns (window / 2^30 rounded up).
ALG.sl = {nargs = 4, bucket = false}
ALG.sl.cd = function(p) return p[3] == 1 end
local SL_REBASE = 4294967294 -- 2^32 - 2
local SL_REBASE_NS = 2251799813685248 -- 2^51

local function sl_entry(v, h, i)
  local a, b, c, d = string.byte(v, h + 4 * i - 3, h + 4 * i)
  return ((a * 256 + b) * 256 + c) * 256 + d
end
local function sl_pack(e)
  local a = idiv(e, 16777216)
  e = e - a * 16777216
  local b = idiv(e, 65536)
  e = e - b * 65536
  local c = idiv(e, 256)
  return string.char(a, b, c, e - c * 256)
end

-- The log at now: {v, h (the header's length), bs, bn (base), count, first (index of the
-- oldest live entry; count + 1 if none), now_off (ns from the base to now; FAR when far)}.
local function sl_view(r, p, s, n)
  local v = rec_get(r)
  local g = {v = v, count = 0, first = 1, now_off = 0}
  if not v then return g end
  local h = string.find(v, ':', 1, true)
  g.h = h
  g.bs, g.bn = t_parse(string.sub(v, 1, h - 1))
  g.count = (#v - h) / 4
  g.now_off = t_far(s, n, g.bs, g.bn)
  -- Entries at or below `cut` ticks have left the window.
  local span = g.now_off - p[2]
  if g.now_off >= FAR then
    g.first = g.count + 1
  elseif span >= 0 then
    local cut = idiv(span, p[4])
    -- The first entry above the cut: a binary search over the ordered entries.
    local lo, hi = 1, g.count + 1
    for _ = 1, 32 do
      if lo >= hi then break end
      local mid = idiv((lo + hi), 2)
      if sl_entry(v, h, mid) <= cut then lo = mid + 1 else hi = mid end
    end
    g.first = lo
  end
  return g
end
-- ns from now until the entry at index i has left the window.
local function sl_expiry(g, p, i)
  return sl_entry(g.v, g.h, i) * p[4] + p[2] - g.now_off
end
local function sl_live(g) return g.count - g.first + 1 end
local function sl_newest(g, p)
  if sl_live(g) <= 0 then return 0 end
  return sl_expiry(g, p, g.count)
end

-- Logs `cost` entries at now; returns the log as it then is.
local function sl_record(r, p, g, s, n, cost)
  -- Rounded up to a tick (never earlier than it happened), no earlier than the newest.
  local ts, tn = s, n
  local rem = t_mod(s, n, p[4])
  if rem > 0 then ts, tn = t_add(s, n, p[4] - rem) end
  local keep, first = sl_live(g), g.first
  local bs, bn, off = ts, tn, 0
  if keep > 0 then
    bs, bn = g.bs, g.bn
    local newest = sl_entry(g.v, g.h, g.count)
    off = idiv(t_far(ts, tn, bs, bn), p[4])
    if off < newest then off = newest end
  end
  -- At most `limit` entries: the oldest go, as the in-memory ring overwrites them.
  local drop = keep + cost - p[1]
  if drop > 0 then first, keep = first + drop, keep - drop end
  local body
  if keep > 0 and (off >= SL_REBASE or off * p[4] >= SL_REBASE_NS) then
    -- The base moves to the oldest entry kept (within two windows of now): O(limit).
    local shift = sl_entry(g.v, g.h, first)
    local parts = {}
    for i = first, first + keep - 1 do parts[#parts + 1] = sl_pack(sl_entry(g.v, g.h, i) - shift) end
    bs, bn = t_add(bs, bn, shift * p[4])
    off = off - shift
    body = table.concat(parts)
  elseif keep > 0 then
    body = string.sub(g.v, g.h + 4 * first - 3)
  else
    bs, bn, off, body = ts, tn, 0, ''
  end
  local v = t_str(bs, bn) .. ':' .. body .. string.rep(sl_pack(off), cost)
  local idle = t_far(bs, bn, s, n) + off * p[4] + p[2]
  rec_put(r, v, idle, true, s, n)
  return {v = v, h = #t_str(bs, bn) + 1, bs = bs, bn = bn, count = keep + cost, first = 1,
    now_off = t_far(s, n, bs, bn)}
end

ALG.sl.step = function(r, p, s, n, cost, apply)
  local limit, w = p[1], p[2]
  local g = sl_view(r, p, s, n)
  local live = sl_live(g)
  if cost == 0 then return allow(limit, limit - live, sl_newest(g, p)) end
  if cost > limit then return deny(limit, limit - live, sl_newest(g, p), -1) end
  local over = live + cost - limit
  if over <= 0 then
    local d = allow(limit, limit - math.min(live + cost, limit), w)
    if apply then d[4] = sl_newest(sl_record(r, p, g, s, n, cost), p) end
    return d
  end
  -- Denied until the over-th oldest live entry leaves the window.
  if p[3] == 1 and apply then
    -- Logged too: the retry waits for the log as it now is.
    local g2 = sl_record(r, p, g, s, n, cost)
    local live2 = sl_live(g2)
    return deny(limit, limit - live2, sl_newest(g2, p), sl_expiry(g2, p, live2 + cost - limit))
  end
  return deny(limit, limit - live, sl_newest(g, p), sl_expiry(g, p, g.first - 1 + over))
end

-- Gives back the newest m entries (as the in-memory ring does, live or not).
ALG.sl.refund = function(r, p, s, n, m)
  local g = sl_view(r, p, s, n)
  local take = math.min(m, g.count)
  if take <= 0 then return end
  g.count = g.count - take
  local v = string.sub(g.v, 1, g.h + 4 * g.count)
  g.v = v
  rec_put(r, v, sl_newest(g, p), true, s, n)
end
-- Logs m more entries at now whatever the log holds (sliding_log::charge): at most `limit`
-- (the log keeps the newest `limit`; what a charge displaces does not come back).
ALG.sl.charge = function(r, p, s, n, m)
  local g = sl_view(r, p, s, n)
  sl_record(r, p, g, s, n, math.min(m, p[1]))
end
