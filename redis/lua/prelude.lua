-- prelude.lua: helpers every turnstile script starts with (no KEYS, no ARGV, no reply).
--
-- Lua numbers are doubles: integers are exact below 2^53 only, while nanoseconds since the
-- Unix epoch are ~2^60. So an absolute time is a pair (s, n): whole seconds and 0 <= n < 1e9
-- nanoseconds, stored in Redis as its decimal string; every duration is kept below 2^52 ns
-- (checked when the store is built), and all arithmetic below stays exact.

local E9 = 1000000000
local MAXT_S, MAXT_N = 9223372036, 854775807 -- 2^63 - 1 ns, the packed TAT's ceiling
local SLACK = 0 -- ms added to every TTL (tests with an explicit now); set by the driver

-- floor(a / b) for integers a >= 0, b > 0 below 2^53, corrected for the rounded division.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

-- a mod b, exact (Lua's % rounds through a / b).
local function imod(a, b)
  return a - idiv(a, b) * b
end

-- floor(a * b / c) and the remainder, a * b possibly above 2^53 (b, c <= 2^52): binary long
-- multiplication keeping the remainder below c. (The quotient is exact below 2^53; above,
-- callers only compare it with a duration.)
local function muldiv(a, b, c)
  local qb = idiv(b, c)
  b = b - qb * c
  local q0, q, r = a * qb, 0, 0
  local bit = 1
  while bit * 2 <= a do bit = bit * 2 end
  while bit >= 1 do
    q, r = q * 2, r * 2
    if r >= c then q, r = q + 1, r - c end
    if a >= bit then
      a = a - bit
      r = r + b
      while r >= c do q, r = q + 1, r - c end
    end
    bit = bit / 2
  end
  return q0 + q, r
end

local function t_parse(str)
  local len = #str
  if len <= 9 then return 0, tonumber(str) end
  return tonumber(string.sub(str, 1, len - 9)), tonumber(string.sub(str, len - 8))
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

-- (s1, n1) - (s0, n0) in ns: exact while below 2^53 in magnitude.
local function t_diff(s1, n1, s0, n0)
  return (s1 - s0) * E9 + (n1 - n0)
end

-- (s * 1e9 + n) mod w, w <= 2^52.
local function t_mod(s, n, w)
  if imod(E9, w) == 0 then return imod(n, w) end
  if imod(w, E9) == 0 then return imod(s, w / E9) * E9 + n end
  -- s * 1e9 mod w by doubling: every intermediate stays below 2 w <= 2^53.
  local a, r, b, bit = imod(s, w), 0, E9, 536870912
  while bit >= 1 do
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

-- Stores `value` at `key` until it is equivalent to absent, `idle` ns from now (deleted if 0).
local function put(key, value, idle)
  if idle <= 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, value, 'PX', idiv(idle + 999999, 1000000) + SLACK)
  end
end

-- A decision: outcome (0 allowed, 1 limited, 2 never fits), limit, remaining, reset_after,
-- retry_after (-1: none), delay.
local function allow(limit, remaining, reset)
  return {0, limit, remaining, reset, -1, 0}
end
local function deny(limit, remaining, reset, retry)
  if retry < 0 then return {2, limit, remaining, reset, -1, 0} end
  return {1, limit, remaining, reset, retry, 0}
end
local function sat(x) if x < 0 then return 0 end return x end

local ALG = {}
-- What an algorithm hands the driver besides a decision (concurrency: the permit's stamp).
local OUT = {}
