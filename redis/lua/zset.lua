-- zset.lua: a sorted set of times, shared by sliding_log.lua and concurrency.lua (no KEYS, no
-- ARGV, no reply of its own).
--
-- Scores are doubles, exact below 2^53, while times in ns are ~2^60: each member's score is
-- its time in ns after a base time. The base is named by one extra member, "b<base ns>", at
-- score -(1 + seq), below every time (>= 0): rank 0. seq numbers the members, whose names are
-- "1", "2", ... (unique while the key lives: members at one time are distinct). A write
-- drops the members at or before `dead` first; when none are left the key starts over, and
-- when a new score would pass ZREBASE the base moves up to the oldest member left (scores
-- stay below 2^53: ZREBASE plus a window or a lease, each at most 2^51 ns); a new time
-- before the base (a clock stepped back) moves the base down to it (exact while the step is
-- shorter than 2^51 ns).

local ZREBASE = 2251799813685248 -- 2^51

local function z_fmt(x) return string.format('%d', x) end

-- The set at `key`: {base s, base n, base member, seq}, or nil when absent.
local function z_open(key)
  local h = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if #h == 0 then return nil end
  local bs, bn = t_parse(string.sub(h[1], 2))
  return {s = bs, n = bn, bm = h[1], seq = -1 - tonumber(h[2])}
end

-- A score bound (an integer; clamped into [-1, 2^53], where far-off times land).
local function z_bound(x)
  if x < -1 then return -1 end
  if x > 9007199254740992 then return 9007199254740992 end
  return x
end

-- Members above `cut` (exclusive): the live ones when `cut` is now's score (minus a window).
local function z_count_above(key, cut)
  return redis.call('ZCOUNT', key, '(' .. z_fmt(z_bound(cut)), '+inf')
end

-- The score of the member at `rank` (1: the oldest time), or nil.
local function z_score_at(key, rank)
  local r = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
  if #r == 0 or rank == 0 then return nil end
  return tonumber(r[2])
end

-- The newest member's score, or nil if there is none.
local function z_newest(key)
  local r = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #r == 0 or tonumber(r[2]) < 0 then return nil end
  return tonumber(r[2])
end

-- Adds `count` members at time (ts, tn), after dropping those at or before the time
-- (ds, dn) (none if ds is nil). Returns the set (its base may have moved) and the new
-- members' score.
local function z_add(key, z, ds, dn, ts, tn, count)
  if z then
    local cut = -1
    if ds then cut = t_diff(ds, dn, z.s, z.n) end
    if cut >= 0 then redis.call('ZREMRANGEBYSCORE', key, 0, z_fmt(z_bound(cut))) end
    if redis.call('ZCARD', key) <= 1 then
      redis.call('DEL', key)
      z = nil
    end
  end
  if not z then
    z = {s = ts, n = tn, bm = 'b' .. t_str(ts, tn), seq = 0}
  else
    local rel = t_diff(ts, tn, z.s, z.n)
    if rel < 0 then
      -- Before the base (a lease taken after the clock stepped back): the base moves down
      -- to it, every score up by as much.
      local all = redis.call('ZRANGE', key, 1, -1, 'WITHSCORES')
      for i = 1, #all, 2 do
        redis.call('ZADD', key, z_fmt(tonumber(all[i + 1]) - rel), all[i])
      end
      redis.call('ZREM', key, z.bm)
      z.s, z.n = ts, tn
      z.bm = 'b' .. t_str(z.s, z.n)
    elseif rel >= ZREBASE then
      -- Move the base up to the oldest member: every score drops by its score.
      local all = redis.call('ZRANGE', key, 1, -1, 'WITHSCORES')
      local shift = tonumber(all[2])
      for i = 1, #all, 2 do
        redis.call('ZADD', key, z_fmt(tonumber(all[i + 1]) - shift), all[i])
      end
      redis.call('ZREM', key, z.bm)
      z.s, z.n = t_add(z.s, z.n, shift)
      z.bm = 'b' .. t_str(z.s, z.n)
    end
  end
  local score = z_fmt(t_diff(ts, tn, z.s, z.n))
  -- In chunks of 256 members (unpack's stack is small).
  local i = 1
  while i <= count do
    local args, j = {}, 0
    while j < 256 and i <= count do
      args[2 * j + 1], args[2 * j + 2] = score, z_fmt(z.seq + i)
      i, j = i + 1, j + 1
    end
    redis.call('ZADD', key, unpack(args))
  end
  z.seq = z.seq + count
  redis.call('ZADD', key, z_fmt(-1 - z.seq), z.bm)
  return z, tonumber(score)
end

-- Keeps the key until it is equivalent to absent, `idle` ns from now (deleted if 0).
local function z_expire(key, idle)
  if idle <= 0 then
    redis.call('DEL', key)
  else
    redis.call('PEXPIRE', key, idiv(idle + 999999, 1000000) + SLACK)
  end
end
