-- prelude.lua: the helpers of the library (no keys, no arguments, no reply of its own).
--
-- Lua numbers are doubles: integers are exact below 2^53 only, while nanoseconds since the
-- Unix epoch are ~2^60. So an absolute time is a pair (s, n): whole seconds and 0 <= n < 1e9
-- nanoseconds, stored in Redis as its decimal string; every duration a limit takes is below
-- 2^52 ns (checked in Rust when the store is built), a difference of two times is used only
-- when it is below 2^52 ns in magnitude (t_far says when it is not), and every loop has a
-- bound fixed before it starts: a call always returns.

local E9 = 1000000000
local MAXT_S, MAXT_N = 9223372036, 854775807 -- 2^63 - 1 ns, the packed TAT's ceiling
local FAR = 4503599627370496 -- 2^52: differences of times are exact below it
local FAR_S = 4503599 -- whole seconds of a difference that may still be below FAR
-- ms added to every TTL: 0 at the server's time; SLACK_MS with an explicit now (tests),
-- which is not the server's clock (EXPLICIT_NOW_TTL_SLACK_MS in Rust). Set per call.
local SLACK_MS = 3600000
local SLACK = 0

-- Costs, measured (redis-server 7.0 under callgrind): a call to a C function such as
-- math.floor or string.sub is several hundred instructions, an arithmetic operator a few
-- dozen; so floors are `x - x % 1` (Lua's % floors) and the hot paths call few functions.

-- floor(a / b) for integers 0 <= a, 0 < b, below 2^53, corrected for the rounded division.
local function idiv(a, b)
  local q = a / b
  q = q - q % 1
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

-- a mod b, exact (Lua's % rounds through a / b).
local function imod(a, b)
  return a - idiv(a, b) * b
end

-- floor(a * b / c) and the remainder, a * b possibly above 2^53 (a, b, c < 2^53): one
-- division when a * b is exact, else binary long multiplication keeping the remainder below
-- c, 53 steps.
local function muldiv(a, b, c)
  local ab = a * b
  if ab < 9007199254740992 then
    -- Exact below 2^53: one division.
    local q = idiv(ab, c)
    return q, ab - q * c
  end
  local qb = idiv(b, c)
  b = b - qb * c
  local q0, q, r = a * qb, 0, 0
  local bit = 4503599627370496 -- 2^52
  for _ = 0, 52 do
    q, r = q * 2, r * 2
    if r >= c then q, r = q + 1, r - c end
    if a >= bit then
      a = a - bit
      r = r + b
      -- r < 2c here: one subtraction, twice at most.
      if r >= c then q, r = q + 1, r - c end
      if r >= c then q, r = q + 1, r - c end
    end
    bit = bit / 2
  end
  return q0 + q, r
end

local function t_parse(str)
  local len = #str
  if len <= 9 then return 0, str + 0 end
  return string.sub(str, 1, len - 9) + 0, string.sub(str, len - 8) + 0
end

local function t_str(s, n)
  if s == 0 then return string.format('%d', n) end
  return string.format('%d%09d', s, n)
end

-- (s, n) + d ns, |d| < 2^53.
local function t_add(s, n, d)
  local neg = d < 0
  if neg then d = -d end
  local q = idiv(d, E9)
  local r = d - q * E9
  if neg then q, r = -q, -r end
  s, n = s + q, n + r
  if n >= E9 then s, n = s + 1, n - E9 elseif n < 0 then s, n = s - 1, n + E9 end
  return s, n
end

-- (s1, n1) - (s0, n0) in ns, exact while below 2^53 in magnitude.
local function t_diff(s1, n1, s0, n0)
  return (s1 - s0) * E9 + (n1 - n0)
end

-- t_diff, or FAR / -FAR when the difference may be 2^52 ns or more in magnitude: a caller
-- that sees FAR knows only that the times are far apart, never an inexact number.
local function t_far(s1, n1, s0, n0)
  local ds = s1 - s0
  if ds > FAR_S then return FAR elseif ds < -FAR_S then return -FAR end
  local d = ds * E9 + (n1 - n0)
  if d >= FAR then return FAR elseif d <= -FAR then return -FAR end
  return d
end

-- (s * 1e9 + n) mod w, w <= 2^52.
local function t_mod(s, n, w)
  if E9 % w == 0 then return n % w end
  if w % E9 == 0 then return imod(s, w / E9) * E9 + n end
  -- s * 1e9 mod w by doubling: every intermediate stays below 2 w <= 2^53; 30 steps.
  local a, r, b, bit = imod(s, w), 0, E9, 536870912
  for _ = 0, 29 do
    r = r * 2
    if r >= w then r = r - w end
    if b >= bit then
      b = b - bit
      r = r + a
      if r >= w then r = r - w end
    end
    bit = bit / 2
  end
  r = r + imod(n, w)
  if r >= w then r = r - w end
  return r
end

-- ms (rounded up, at least 1) for `ns` ns, plus the call's slack: a TTL.
local function ttl_ms(ns)
  local ms = idiv(ns + 999999, 1000000)
  if ms < 1 then ms = 1 end
  return ms + SLACK
end

-- A decision: {outcome (0 allowed, 1 limited, 2 never fits), limit, remaining, reset_after,
-- retry_after (-1: none), delay}.
local function allow(limit, remaining, reset)
  return {0, limit, remaining, reset, -1, 0}
end
local function deny(limit, remaining, reset, retry)
  if retry < 0 then return {2, limit, remaining, reset, -1, 0} end
  return {1, limit, remaining, reset, retry, 0}
end
local function sat(x) if x < 0 then return 0 end return x end

-- A decision's six fields as one string (a string costs the server less to return than a
-- table, which it probes for error fields).
local function reply6(d)
  return string.format('%d %d %d %d %d %d', d[1], d[2], d[3], d[4], d[5], d[6])
end
-- A store's reply: of an admission without delay, its limit, remaining and reset only (the
-- rest is implied; three numbers cost half of six to format); else reply6.
local function reply(d)
  if d[1] == 0 and d[6] == 0 then return string.format('%d %d %d', d[2], d[3], d[4]) end
  return reply6(d)
end

-- The algorithms, by code: ALG.fw = {nargs, bucket (may be packed in a hash), step, refund,
-- charge (a settled cost above the reserved one, settle.lua), idle (the sweep's test), prep
-- (per-spec precomputation), cd (counts denials)}.
local ALG = {}
