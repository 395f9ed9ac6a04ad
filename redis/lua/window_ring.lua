-- window_ring.lua: a counter per sub-window, the one straddling the window's start weighted
-- by its share still inside (src/algo/window_ring.rs; the notes' counters per minute).
-- KEYS: 1, a string: "<start ns of the newest sub-window written>:" then the counters of that
--       sub-window and of the N before it, newest first, each `bytes` bytes big-endian,
--       trailing zeros left out (a packed string measured smaller than a hash: docs/redis.md);
--       TTL until the newest non-zero counter has slid out of the window.
-- ARGV (after the driver's): limit, window ns, count_denied (0/1), sub-window ns, N,
--       a counter's maximum (it saturates there, as in memory), bytes per counter.
-- Reply: a decision (prelude.lua).
ALG.wr = { nkeys = 1, nargs = 7 }
ALG.wr.cd = function(p) return p[3] == 1 end
-- Sub-windows a stored one may lie ahead of now's and be read as time going backwards (the
-- in-memory AHEAD); farther ahead, expired.
local WR_AHEAD = 67108864

-- The ring at now: cs, cn (the current sub-window's start), lead (ns from now to it: -elapsed,
-- or > 0 when time went backwards), rem (ns of the straddling sub-window still inside),
-- c[0..N] (counters newest first), full (c[0] + ... + c[N - 1]), old (c[N]).
local function wr_view(key, p, s, n)
  local sub, N, nb = p[4], p[5], p[7]
  local e = t_mod(s, n, sub)
  local bs, bn = t_add(s, n, -e)
  local v = {cs = bs, cn = bn, lead = -e, rem = sub - e, c = {}}
  for k = 0, N do v.c[k] = 0 end
  local str = redis.call('GET', key)
  if str then
    local colon = string.find(str, ':', 1, true)
    local ts, tn = t_parse(string.sub(str, 1, colon - 1))
    local c = {}
    for k = 0, N do
      local x, at = 0, colon + 1 + k * nb
      for b = 0, nb - 1 do x = x * 256 + (string.byte(str, at + b) or 0) end
      c[k] = x
    end
    local behind = t_diff(bs, bn, ts, tn)
    if behind >= 0 then
      -- d sub-windows behind: its counters moved d places older; beyond N, all slid out.
      if behind <= N * sub then
        local d = idiv(behind, sub)
        for k = d, N do v.c[k] = c[k - d] end
      end
    elseif idiv(-behind, sub) <= WR_AHEAD then
      -- Time went backwards: the stored sub-window stays current, whole: conservative.
      v.cs, v.cn, v.lead, v.rem, v.c = ts, tn, t_diff(ts, tn, s, n), sub, c
    end
  end
  local full = 0
  for k = 0, N - 1 do full = full + v.c[k] end
  v.full, v.old = full, v.c[N]
  return v
end

-- old x rem / sub rounded to nearest, halves up.
local function wr_weigh(old, rem, sub)
  if old == 0 then return 0 end
  local q, r = muldiv(old, rem, sub)
  if 2 * r >= sub then q = q + 1 end
  return q
end

local function wr_count(p, v) return v.full + wr_weigh(v.old, v.rem, p[4]) end

-- ns until the newest non-zero sub-window has slid out of the window (0: idle).
local function wr_reset(p, v)
  for k = 0, p[5] do
    if v.c[k] > 0 then return sat(v.lead + (p[5] + 1 - k) * p[4]) end
  end
  return 0
end

local function wr_write(key, p, v)
  local last = -1
  for k = 0, p[5] do if v.c[k] > 0 then last = k end end
  if last < 0 then
    redis.call('DEL', key)
    return
  end
  local out = {t_str(v.cs, v.cn), ':'}
  for k = 0, last do
    local x, bytes = v.c[k], {}
    for b = p[7], 1, -1 do
      bytes[b] = x % 256
      x = math.floor(x / 256)
    end
    out[#out + 1] = string.char(unpack(bytes))
  end
  put(key, table.concat(out), wr_reset(p, v))
end

local function wr_add(key, p, v, cost)
  v.c[0] = v.c[0] + math.min(cost, p[6] - v.c[0])
  wr_write(key, p, v)
end

-- ns (>= 1) until `cost` fits, nothing else happening: the first sub-window whose N newest
-- counters leave room, and in it the first instant the straddling one's share fits
-- (src/algo/window_ring.rs, first_fit).
local function wr_first_fit(p, v, cost)
  local limit, sub, N = p[1], p[4], p[5]
  local full, old = v.full, v.old
  for k = 0, N + 1 do
    if k > 0 then
      old = v.c[N - k] or 0
      full = full - math.min(old, full)
    end
    if full + cost <= limit then
      local room = limit - cost - full
      local start = math.max(0, v.lead + k * sub)
      if old == 0 then return math.max(start, 1) end
      local q, r = muldiv(2 * room + 1, sub, 2 * old)
      if r > 0 then q = q + 1 end
      if q - 1 > 0 then
        return math.max(start, v.lead + (k + 1) * sub - math.min(q - 1, sub), 1)
      end
    end
  end
  return math.max(v.lead + (N + 2) * sub, 1)
end

local function wr_denied(p, v, cost)
  local retry = -1
  if cost <= p[1] then retry = wr_first_fit(p, v, cost) end
  return deny(p[1], sat(p[1] - wr_count(p, v)), wr_reset(p, v), retry)
end

ALG.wr.step = function(k, p, s, n, cost, apply)
  local key, limit = KEYS[k], p[1]
  local v = wr_view(key, p, s, n)
  local count = wr_count(p, v)
  if cost == 0 then return allow(limit, sat(limit - count), wr_reset(p, v)) end
  if count + cost <= limit then
    local d = allow(limit, limit - count - cost, sat(v.lead + (p[5] + 1) * p[4]))
    if apply then wr_add(key, p, v, cost) end
    return d
  end
  local d = wr_denied(p, v, cost)
  if not (p[3] == 1 and d[5] >= 0 and apply) then return d end
  -- Counted too: the answer describes the ring as it now is.
  wr_add(key, p, v, cost)
  return wr_denied(p, wr_view(key, p, s, n), cost)
end

-- Gives m back, newest sub-windows first (the straddling one last).
ALG.wr.refund = function(k, p, s, n, m)
  local v = wr_view(KEYS[k], p, s, n)
  local left = m
  for j = 0, p[5] do
    if left <= 0 then break end
    local take = math.min(v.c[j], left)
    v.c[j], left = v.c[j] - take, left - take
  end
  wr_write(KEYS[k], p, v)
end
