-- record.lua: where a limit's record of one key lives (no keys, arguments or reply of its own).
--
-- A record handle r = {key = <Redis key>, field = <hash field> or false, alg, p, ...} (spec.lua
-- binds it, one table per cached limit, reused call after call). A call reads a record once
-- (rec_get) and writes it at most once, at its end (rec_flush): rec_put only says what to
-- write, so a denial counted tentatively can be taken back (rec_save, rec_restore) and a
-- record written twice in one call costs one write.
-- * field nil: the record is the string at `key`, with a TTL until it is equivalent to absent.
-- * field set: `key` is a bucket, a hash holding the records of many keys of one limit (the
--   key's field: its name, or a digest of a long one; Rust's layout.rs), which Redis keeps as
--   a listpack while it has at most 128 fields of at most 64 bytes. Its field '~' (the meta)
--   is sweep_at * 2^35 + the bucket's deadline in whole seconds (of the calls' clock): the
--   bucket's TTL runs to the deadline, which is extended, a second at a time, when a record's
--   own idle time goes past it. Redis 7.0 has no per-field expiry: a record that becomes idle
--   is deleted when it is written so, and the idle records of other keys are swept (HRANDFIELD
--   of at most SWEEP_MAX fields, each tested by its algorithm's `idle`) when a new field makes
--   the bucket reach sweep_at fields; sweep_at is then twice the fields left (at least
--   SWEEP_MIN): a bucket holds at most about twice its live records, and the sweeps cost O(1)
--   per new field, amortized.

local META_SHIFT = 34359738368 -- 2^35: deadlines in seconds stay below it (2^63 ns = 2^33 s)
local SWEEP_MIN, SWEEP_MAX = 32, 256

-- The record's value (a string), or nil; read once per call.
local function rec_get(r)
  if r.loaded then return r.v end
  local v
  if r.field then
    local m = redis.call('HMGET', r.key, r.field, '~')
    v = m[1]
    if m[2] then r.meta = m[2] + 0 end
  else
    v = redis.call('GET', r.key)
  end
  if not v then v = nil end
  r.v, r.v0, r.loaded = v, v, true
  return v
end

-- A handle for `key` (and `field`), ready for a call: r's own table, reset.
local function rec_bind(r, key, field)
  r.key, r.field, r.loaded, r.v, r.v0, r.meta, r.dirty = key, field, false, nil, nil, nil, false
end

-- Idle records of the bucket, but r's own, deleted; returns how many fields remain. At an
-- explicit now (SLACK > 0: not the server's clock, and other calls may be stamped earlier),
-- a record is judged SLACK ms before it, the allowance a key of its own gets in its TTL.
local function sweep(r, s, n, len)
  local all = redis.call('HRANDFIELD', r.key, SWEEP_MAX, 'WITHVALUES')
  local dead, idle = {}, r.alg.idle
  if SLACK > 0 then s, n = t_add(s, n, -SLACK * 1000000) end
  for i = 1, #all - 1, 2 do
    local f = all[i]
    if f ~= '~' and f ~= r.field and idle(all[i + 1], r.p, s, n) then dead[#dead + 1] = f end
  end
  if #dead > 0 then redis.call('HDEL', r.key, unpack(dead)) end
  return len - #dead
end

-- Writes r's field; extends the bucket's deadline to cover `ms` (the record's TTL) and sweeps
-- when due.
local function bucket_put(r, value, ms, s, n)
  local meta, fresh = r.meta, not r.v0
  local sweep_at, deadline = SWEEP_MIN, 0
  if meta then
    sweep_at = idiv(meta, META_SHIFT)
    deadline = meta - sweep_at * META_SHIFT
  end
  -- The deadline the record needs, in whole seconds of the calls' clock (ms carries SLACK,
  -- which is 0 at the server's time).
  local need = s + idiv(n + (ms - SLACK) * 1000000 + E9 - 1, E9)
  local expire
  if not meta then
    -- A new bucket: no TTL yet.
    deadline, expire = need, 'set'
  elseif need > deadline then
    deadline, expire = need, 'gt'
  elseif SLACK > 0 then
    -- An explicit now is not the server's clock: keep the TTL at least the record's.
    expire = 'gt'
  end
  if fresh and meta then
    local len = redis.call('HLEN', r.key) + 1
    if len >= sweep_at then
      local left = sweep(r, s, n, len)
      sweep_at = math.min(math.max(2 * left, SWEEP_MIN), 131071)
    end
  end
  local m = sweep_at * META_SHIFT + deadline
  if m ~= meta then
    redis.call('HSET', r.key, r.field, value, '~', string.format('%d', m))
    r.meta = m
  else
    redis.call('HSET', r.key, r.field, value)
  end
  if expire then
    -- In ms from now: the deadline's, or the record's own (with its slack), the larger.
    local pttl = (deadline - s) * 1000 - idiv(n, 1000000) + SLACK
    if pttl < ms then pttl = ms end
    if expire == 'set' then
      redis.call('PEXPIRE', r.key, pttl)
    else
      redis.call('PEXPIRE', r.key, pttl, 'GT')
    end
  end
end

-- Stores `value` as r's record (at the end of the call) until it is equivalent to absent,
-- `idle` ns from now (s, n). `gone`: the record is equivalent to absent at every time, not
-- only from now on, and idle == 0: it is deleted. A record idle now but read differently at
-- an earlier time (a bucket's TAT at now after a refund) is kept a millisecond, as the
-- in-memory store keeps it. `keep`: a plain key's TTL is unchanged (its deadline is the same;
-- SET ... KEEPTTL is the cheaper command).
local function rec_put(r, value, idle, gone, s, n, keep)
  if idle <= 0 and gone then value = nil end
  r.v, r.dirty = value, true
  r.w_idle, r.w_s, r.w_n, r.w_keep = idle, s, n, keep
end

local function rec_save(r) return {r.v, r.dirty, r.w_idle, r.w_s, r.w_n, r.w_keep} end
local function rec_restore(r, t)
  r.v, r.dirty, r.w_idle, r.w_s, r.w_n, r.w_keep = t[1], t[2], t[3], t[4], t[5], t[6]
end

-- Writes what rec_put said, if anything.
local function rec_flush(r)
  if not r.dirty then return end
  r.dirty = false
  local value = r.v
  if not value then
    if r.v0 then
      if r.field then redis.call('HDEL', r.key, r.field) else redis.call('DEL', r.key) end
    end
  else
    local ms = ttl_ms(r.w_idle)
    if r.field then
      bucket_put(r, value, ms, r.w_s, r.w_n)
    elseif r.w_keep and SLACK == 0 and r.v0 then
      redis.call('SET', r.key, value, 'KEEPTTL')
    else
      redis.call('SET', r.key, value, 'PX', ms)
    end
  end
  r.v0 = value
end

-- Flushes the records of bound limits ({{alg, record, p}...}).
local function rec_flush_all(ls)
  for i = 1, #ls do
    if ls[i][2].dirty then rec_flush(ls[i][2]) end
  end
end
