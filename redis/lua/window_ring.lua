-- window_ring.lua: a counter per sub-window, the one straddling the window's start weighted
-- by its share still inside (src/algo/window_ring.rs; the notes' counters per minute).
-- Record (a plain key): "<start ns of the newest sub-window written>:", the sum of the
-- counters (`bytes` + 2 bytes: N + 1 <= 1025 counters), then the counters of that sub-window
-- and of the N before it, newest first, each `bytes` (1 to 4) bytes big-endian (all
-- big-endian numbers below 2^48: exact), trailing zero bytes left out (a packed
-- string measured smaller than a hash: docs/redis.md); TTL until the newest non-zero counter
-- has slid out of the window. The sum makes a check read two counters (the newest and the
-- straddling one) rather than all of them: a call decodes O(1) counters, O(N) only when a
-- request is denied or refunded, or when time moves on by several sub-windows at once.
-- Parameters: limit, window ns, count_denied (0/1), sub-window ns, N, a counter's maximum
-- (it saturates there, as in memory), bytes per counter.
ALG.wr = {nargs = 7, bucket = false}
ALG.wr.cd = function(p) return p[3] == 1 end
-- Sub-windows a stored one may lie ahead of now's and be read as time going backwards (the
-- in-memory AHEAD); farther ahead, expired.
local WR_AHEAD = 67108864

-- The k-byte big-endian number at i (k <= 6; missing bytes read as 0).
local function be_read(str, i, k)
  local a, b, c, d, e, f = string.byte(str, i, i + k - 1)
  if not a then return 0 end
  if k == 1 then return a end
  local x = a * 256 + (b or 0)
  if k == 2 then return x end
  x = x * 256 + (c or 0)
  if k == 3 then return x end
  x = x * 256 + (d or 0)
  if k == 4 then return x end
  x = x * 256 + (e or 0)
  if k == 5 then return x end
  return x * 256 + (f or 0)
end

-- x (< 2^48) as k big-endian bytes.
local function be_write(x, k)
  local out = {}
  for j = k, 1, -1 do
    local q = idiv(x, 256)
    out[j] = x - q * 256
    x = q
  end
  return string.char(unpack(out, 1, k))
end

local function wr_at(str, i, nb) return be_read(str, i, nb) end

-- Counter k (0: the newest) of the ring at now: the stored ones moved v.d places older.
local function wr_c(v, k)
  if k == 0 and v.c0 then return v.c0 end
  local j = k - v.d
  if j < 0 or not v.str then return 0 end
  return wr_at(v.str, v.at + j * v.nb, v.nb)
end

-- The ring at now: cs, cn (the current sub-window's start), lead (ns from now to it: -elapsed,
-- or > 0 when time went backwards), rem (ns of the straddling sub-window still inside), the
-- stored string (str, its counters from byte `at`, shifted d places), total (the counters'
-- sum), old (the straddling counter c[N]) and full (the N newer ones' sum).
local function wr_view(r, p, s, n)
  local sub, N, nb = p[4], p[5], p[7]
  local e = t_mod(s, n, sub)
  local bs, bn = t_add(s, n, -e)
  -- Every field in the constructor: one allocation, no rehash as fields are added.
  local v = {cs = bs, cn = bn, lead = -e, rem = sub - e, d = 0, total = 0, nb = nb, str = false,
    at = 0, old = 0, full = 0, c0 = false}
  local str = rec_get(r)
  if str then
    local colon = string.find(str, ':', 1, true)
    local ts, tn = t_parse(string.sub(str, 1, colon - 1))
    local behind = t_far(bs, bn, ts, tn)
    local keep = false
    if behind >= 0 then
      -- d sub-windows behind: its counters moved d places older; beyond N, all slid out.
      if behind <= N * sub then keep, v.d = true, idiv(behind, sub) end
    elseif behind > -FAR and idiv(-behind, sub) <= WR_AHEAD then
      -- Time went backwards: the stored sub-window stays current, whole: conservative.
      keep = true
      v.cs, v.cn, v.lead, v.rem = ts, tn, t_diff(ts, tn, s, n), sub
    end
    if keep then
      v.str, v.at = str, colon + 1 + nb + 2
      v.total = be_read(str, colon + 1, nb + 2)
      -- The stored counters moved past N slid out of the sum.
      local stored = idiv(#str - v.at + nb, nb)
      for j = N - v.d + 1, stored - 1 do v.total = v.total - wr_at(str, v.at + j * nb, nb) end
    end
  end
  v.old = wr_c(v, N)
  v.full = v.total - v.old
  return v
end

-- c[0..N] of the ring at now, decoded at once (the slow paths).
local function wr_all(p, v)
  local c, N, nb = {}, p[5], v.nb
  local bytes = {}
  if v.str then bytes = {string.byte(v.str, v.at, -1)} end
  for k = 0, N do
    local j = k - v.d
    local x = 0
    if j >= 0 then
      for b = 1, nb do x = x * 256 + (bytes[j * nb + b] or 0) end
    end
    c[k] = x
  end
  if v.c0 then c[0] = v.c0 end
  return c
end

local function wr_pack(x, nb) return be_write(x, nb) end

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
  local N, sub = p[5], p[4]
  if v.total == 0 then return 0 end
  if wr_c(v, 0) > 0 then return sat(v.lead + (N + 1) * sub) end
  local from = v.d
  if from < 1 then from = 1 end
  for k = from, N do
    if wr_c(v, k) > 0 then return sat(v.lead + (N + 1 - k) * sub) end
  end
  return 0
end

-- The record of the ring v (its newest counter possibly changed: v.c0), nil if all are 0:
-- the stored counters copied as bytes, not decoded.
local function wr_encode(p, v)
  if v.total <= 0 then return nil end
  local nb, N = v.nb, p[5]
  local rest = ''
  if v.str then
    if v.d == 0 then
      rest = string.sub(v.str, v.at + nb, v.at + (N + 1) * nb - 1)
    else
      rest = string.rep('\0', (v.d - 1) * nb) .. string.sub(v.str, v.at, v.at + (N + 1 - v.d) * nb - 1)
    end
  end
  local body = wr_pack(wr_c(v, 0), nb) .. rest
  local z = string.find(body, '%z+$')
  if z then body = string.sub(body, 1, z - 1) end
  return t_str(v.cs, v.cn) .. ':' .. be_write(v.total, nb + 2) .. body
end

-- The record of the counters c[0..N] (the slow paths): the ring re-encoded.
local function wr_encode_all(p, v, c)
  local parts, total, last = {}, 0, -1
  for k = 0, p[5] do
    total = total + c[k]
    if c[k] > 0 then last = k end
  end
  if last < 0 then return nil end
  for k = 0, last do parts[k + 1] = wr_pack(c[k], v.nb) end
  local w = {str = table.concat(parts), at = 1, d = 0, total = total, nb = v.nb,
    cs = v.cs, cn = v.cn}
  local head = t_str(v.cs, v.cn) .. ':' .. string.rep('\0', v.nb + 2)
  w.str, w.at = head .. w.str, #head + 1
  return wr_encode(p, w)
end

local function wr_write(r, p, v, s, n)
  local value = wr_encode(p, v)
  local idle = 0
  if value then idle = wr_reset(p, v) end
  rec_put(r, value or '', idle, true, s, n)
end

local function wr_add(r, p, v, cost, s, n)
  local c0 = wr_c(v, 0)
  local add = p[6] - c0
  if cost < add then add = cost end
  v.c0, v.total = c0 + add, v.total + add
  wr_write(r, p, v, s, n)
end

-- ns (>= 1) until `cost` fits, nothing else happening: the first sub-window whose N newest
-- counters leave room, and in it the first instant the straddling one's share fits
-- (src/algo/window_ring.rs, first_fit).
local function wr_first_fit(p, v, cost)
  local limit, sub, N = p[1], p[4], p[5]
  local full, old = v.full, v.old
  local cs = wr_all(p, v)
  for k = 0, N + 1 do
    if k > 0 then
      old = cs[N - k] or 0
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

ALG.wr.step = function(r, p, s, n, cost, apply)
  local limit = p[1]
  local v = wr_view(r, p, s, n)
  local count = wr_count(p, v)
  if cost == 0 then return allow(limit, sat(limit - count), wr_reset(p, v)) end
  if count + cost <= limit then
    local d = allow(limit, limit - count - cost, sat(v.lead + (p[5] + 1) * p[4]))
    if apply then wr_add(r, p, v, cost, s, n) end
    return d
  end
  local d = wr_denied(p, v, cost)
  if not (p[3] == 1 and d[5] >= 0 and apply) then return d end
  -- Counted too: the answer describes the ring as it now is.
  wr_add(r, p, v, cost, s, n)
  return wr_denied(p, wr_view(r, p, s, n), cost)
end

-- Gives m back, newest sub-windows first (the straddling one last).
ALG.wr.refund = function(r, p, s, n, m)
  if not rec_get(r) then return end
  local v = wr_view(r, p, s, n)
  local c = wr_all(p, v)
  local left = m
  for j = 0, p[5] do
    if left <= 0 then break end
    local take = math.min(c[j], left)
    c[j], left = c[j] - take, left - take
  end
  local value = wr_encode_all(p, v, c)
  local idle = 0
  if value then
    local w = {cs = v.cs, cn = v.cn, lead = v.lead, d = 0, nb = v.nb, total = 1}
    w.str, w.at = value, string.find(value, ':', 1, true) + 1 + v.nb + 2
    idle = wr_reset(p, w)
  end
  rec_put(r, value or '', idle, true, s, n)
end
-- Adds m to the current sub-window whatever the window holds (window_ring::charge): up to
-- the counter's maximum, sliding out as any count does.
ALG.wr.charge = function(r, p, s, n, m)
  wr_add(r, p, wr_view(r, p, s, n), m, s, n)
end
