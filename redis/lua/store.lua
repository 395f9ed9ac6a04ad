-- store.lua: RedisStore's function (registered at the end of the library).
--
-- keys: each limit's key, in the order of the limits: a plain key or a bucket (record.lua);
--       every key of one call shares one {hash tag}: one Cluster slot.
-- args: [1] the store's spec (spec.lua);
--       [2] op: "c" check / peek (cost 0), "r" refund, "s" settle's charge (the cost taken
--           whatever the limits hold: settle.lua), "a" acquire (concurrency: a check
--           that also answers the permit's stamp), "x" release, "l" lease, "g" give back
--           (lease.lua); then the explicit now in ns if any (else the server's TIME);
--       [3] cost (for a refund or a give back the amount given back; for a release the
--           permit's stamp);
--       [4] the key's field in its buckets (layout "b" only; "" for "l" and "g" otherwise);
--       "l": [5] the node's rate (cost units per 10^12 ns), [6] a window's final share (ppm),
--           [7] delayed mode's unrecorded admissions (0 in reserve mode), [8] the longest
--           a lease is sized for (ns);
--       "g": [5] the lease's epoch (ns), [6...] per limit its TAT after the grant (ns after
--           the epoch; buckets).
-- Reply: lease, give back: lease.lua; charge: 0; check: "<outcome> <limit> <remaining> <reset_after> <retry_after> <delay>"
--        (outcome 0 allowed, 1 limited, 2 never fits; retry -1: none), or for an admission
--        without delay "<limit> <remaining> <reset_after>"; acquire: the same and
--        " <stamp>" when a lease was taken; refund: 0; release: the cells freed.
-- "m" (many checks, one server, at its TIME: no explicit now): keys: each check's keys in turn (#limits each); args [3...]:
--   per check its cost and field ("" but in layout "b"). Reply: an array of the checks' replies, in order.
-- Several limits are all-or-nothing exactly as turnstile::Limits::decide (limits.lua).

-- One check of `cost` on the records of keys[k...] (and `field`), at s, n.
local function store_check(ls, keys, k, field, s, n, cost)
  if ls[2] == nil then
    local fast = FAST[ls[1].alg.code]
    if fast then
      local out = fast(keys[k], field, ls[1].p, s, n, cost)
      if out then return out end
    end
  end
  local b = bind(ls, keys, k, field)
  local d = reply(decide(b, s, n, cost, true))
  rec_flush_all(b)
  return d
end

local function store_many(ls, keys, args)
  local m = #keys / #ls
  if m ~= math.floor(m) or #args ~= 2 + 2 * m then
    return redis.error_reply('ERR turnstile: ' .. #keys .. ' keys and ' .. #args .. ' args for checks of ' .. #ls .. ' limits')
  end
  local s, n = call_time(args[2])
  local out = {}
  for j = 0, m - 1 do
    local field = args[4 + 2 * j]
    if field == '' then field = nil end
    out[j + 1] = store_check(ls, keys, j * #ls + 1, field, s, n, args[3 + 2 * j] + 0)
  end
  return out
end

local function store_call(keys, args)
  local ls = cached(args[1], parse_store)
  if args[2] == 'm' then return store_many(ls, keys, args) end
  if #keys ~= #ls then
    return redis.error_reply('ERR turnstile: ' .. #keys .. ' keys for ' .. #ls .. ' limits')
  end
  local op = args[2]
  local s, n = call_time(op)
  local mode = string.sub(op, 1, 1)
  if mode == 'c' and ls[2] == nil then
    local fast = FAST[ls[1].alg.code]
    if fast then
      local out = fast(keys[1], args[4], ls[1].p, s, n, args[3] + 0)
      if out then return out end
    end
  end
  local b = bind(ls, keys, 1, args[4])
  if mode == 'x' then return b[1][1].release(b[1][2], b[1][3], s, n, args[3]) end
  if mode == 'l' then
    return LEASE.grant(b, s, n, args[3] + 0, args[5] + 0, args[6] + 0, args[7] + 0, args[8] + 0)
  end
  if mode == 'g' then return LEASE.give(b, s, n, args[3] + 0, args[5], args) end
  local cost = args[3] + 0
  if mode == 'r' then
    for i = 1, #b do b[i][1].refund(b[i][2], b[i][3], s, n, cost) end
    rec_flush_all(b)
    return 0
  end
  if mode == 's' then
    charge_all(b, s, n, cost)
    rec_flush_all(b)
    return 0
  end
  CC_OUT.stamp = nil
  local d = reply(decide(b, s, n, cost, true))
  rec_flush_all(b)
  if mode == 'a' and CC_OUT.stamp then d = d .. ' ' .. CC_OUT.stamp end
  return d
end
