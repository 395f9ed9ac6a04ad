-- fast.lua: the check of a store with one fixed_window or token_bucket limit, the commonest
-- call, answered before the prelude runs; the first file of a store's script.
--
-- KEYS: 1, the limit's key.
-- ARGV (short, for this check only): [1] "fw" or "tb", [2] cost (>= 1), [3..5] the limit's
--       parameters (fixed_window.lua's, token_bucket.lua's), [6] now in ns (decimal; absent:
--       the server's TIME), [7] ms added to the TTL (with [6]). Any other layout is
--       driver.lua's and goes there.
-- Reply: an admission is the bulk string "<remaining> <reset_after ns>" (the outcome, the
--       limit, no retry and no delay are known to the caller; a string costs the server less
--       than a table); anything else is driver.lua's reply.
--
-- Why it exists: a script's whole chunk runs on every EVALSHA, so the generic path builds
-- every helper closure, the algorithm tables and the driver's parameter tables before it
-- decides, and it takes nine arguments (each costs the server about as much as a GET). That
-- made a check cost about six INCRs. This block decides from locals only and returns before
-- any of that is built (docs/redis.md, "What a call costs"). It computes exactly what
-- fixed_window.lua / token_bucket.lua + limits.lua compute for one limit (the differential
-- test runs its single-limit traces through it). What it does not handle (a window neither
-- dividing nor a multiple of a second, a denial that a count_denied limit records, a fixed
-- window's record from a time ahead of now) falls through to driver.lua, with the instant it
-- read and its arguments in the generic layout.
local now_s, now_n
-- The arguments driver.lua reads: ARGV, or the generic layout this block falls through with.
local A = ARGV
local code = ARGV[1]
if code == 'fw' or code == 'tb' then
  local E9 = 1000000000
  local s, n
  local server_time = ARGV[6] == nil
  if server_time then
    local t = redis.call('TIME')
    s, n = t[1] + 0, t[2] * 1000
  else
    local a = ARGV[6]
    local len = #a
    if len <= 9 then
      s, n = 0, a + 0
    else
      s, n = string.sub(a, 1, len - 9) + 0, string.sub(a, len - 8) + 0
    end
  end
  -- Decimal strings become numbers by arithmetic (`x + 0`), which the VM does inline: half
  -- the cost of a call to tonumber. Integers below 2^53 divide exactly with % and math.floor
  -- (the rounded quotient never crosses an integer), which is all this block does.
  local key, cost, slack = KEYS[1], ARGV[2] + 0, 0
  if not server_time then slack = ARGV[7] + 0 end
  if code == 'fw' then
    local limit, w, cd = ARGV[3] + 0, ARGV[4] + 0, ARGV[5] == '1'
    -- The window holding now starts at (cs, cn), r ns before now (prelude's t_mod).
    local r, cs, cn
    if E9 % w == 0 then
      r = n % w
      cs, cn = s, n - r
    elseif w % E9 == 0 then
      local q = s % (w / E9)
      r, cs, cn = q * E9 + n, s - q, 0
    end
    local count, start = 0, nil
    if r then
      local v = redis.call('GET', key)
      if v then
        -- "<window start ns> <count>"
        local len = string.find(v, ' ', 1, true) - 1
        local a, c = string.sub(v, 1, len), string.sub(v, len + 2) + 0
        local ss, sn
        if len <= 9 then
          ss, sn = 0, a + 0
        else
          ss, sn = string.sub(v, 1, len - 9) + 0, string.sub(v, len - 8, len) + 0
        end
        local d = (ss - cs) * E9 + (sn - cn)
        if d == 0 then
          count, start = c, a
        elseif d > 0 and c > 0 and d <= 134217728 * w then
          -- Time went backwards (fixed_window.lua's fw_view): the stored window, whose end
          -- may be more than 2^53 ns away. The generic path's exact arithmetic answers.
          r = nil
        end
      end
    end
    if r then
      -- From here on every quantity is at most a window (2^52 ns): exact in a double.
      local ends = w - r
      if count + cost <= limit then
        local c = count + cost
        if not start then
          if cs == 0 then start = string.format('%d', cn) else start = string.format('%d%09d', cs, cn) end
        end
        -- string.format('%d') is the cheaper conversion (a number's own uses '%.14g'); the
        -- same digits below 2^53.
        local value = start .. ' ' .. string.format('%d', c)
        if server_time and count > 0 then
          -- The record's window is unchanged, and so is its end: the TTL set by the write
          -- that opened it (at the server's clock, as now) stands. SET ... KEEPTTL is the
          -- cheaper command (about 8 % of the call).
          redis.call('SET', key, value, 'KEEPTTL')
        else
          redis.call('SET', key, value, 'PX', math.floor((ends + 999999) / 1000000) + slack)
        end
        return string.format('%d %d', limit - c, ends)
      end
      if not cd or cost > limit then
        -- A denial that records nothing.
        local rem, reset = limit - count, ends
        if rem < 0 then rem = 0 end
        if count == 0 then reset = 0 end
        if cost > limit then return {2, limit, rem, reset, -1, 0} end
        return {1, limit, rem, reset, ends, 0}
      end
    end
  else
    local cap, t, tau = ARGV[3] + 0, ARGV[4] + 0, ARGV[5] + 0
    -- GCRA (token_bucket.lua): the TAT, or now when absent or past.
    local ts, tn, backlog = s, n, 0
    local v = redis.call('GET', key)
    if v then
      local len = #v
      local vs, vn
      if len <= 9 then
        vs, vn = 0, v + 0
      else
        vs, vn = string.sub(v, 1, len - 9) + 0, string.sub(v, len - 8) + 0
      end
      local b = (vs - s) * E9 + (vn - n)
      if b > 0 then ts, tn, backlog = vs, vn, b end
    end
    local held = tau - backlog
    if held < 0 then held = 0 end
    local rem = math.floor(held / t)
    if cost > cap then return {2, cap, rem, backlog, -1, 0} end
    local add = cost * t
    local q = math.floor(add / E9)
    local ns, nn = ts + q, tn + (add - q * E9)
    if nn >= E9 then ns, nn = ns + 1, nn - E9 end
    local after
    local fits = ns < 9223372036 or (ns == 9223372036 and nn < 854775807)
    if fits then
      after = (ns - s) * E9 + (nn - n)
    else
      -- max(TAT, now) + cost T reaches the packed TAT's ceiling, 2^63 - 1 ns.
      after = (9223372036 - s) * E9 + (854775807 - n)
    end
    if fits and after <= tau then
      local tat
      if ns == 0 then tat = string.format('%d', nn) else tat = string.format('%d%09d', ns, nn) end
      redis.call('SET', key, tat, 'PX', math.floor((after + 999999) / 1000000) + slack)
      return string.format('%d %d', math.floor((tau - after) / t), after)
    end
    local retry = after - tau
    if retry < 1 then retry = 1 end
    return {1, cap, rem, backlog, retry, 0}
  end
  -- Not answered here: driver.lua decides from the same instant, in its own layout.
  now_s, now_n = s, n
  A = {ARGV[6] or '', ARGV[2], 'c', ARGV[7] or '0', '1', code, ARGV[3], ARGV[4], ARGV[5]}
end
