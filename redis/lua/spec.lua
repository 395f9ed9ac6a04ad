-- spec.lua: a call's limits, given as one argument (a spec) and parsed once per library:
-- each distinct spec's parse is kept, up to SPEC_CACHE of them (then the cache starts over),
-- so a call does not pay for parsing a dozen numbers. No keys, arguments or reply of its own.
--
-- A store's spec: "<layout> <count>[+] <code> <parameters...> ...": layout "k" (a plain key
-- per record) or "b" (records packed in buckets where the algorithm allows it), then each
-- limit's code (ALG) and parameters, which Rust checked (integers below 2^53).
local SPEC_CACHE = 1024
local SPECS, NSPECS = {}, 0

local function spec_words(str)
  local t = {}
  for w in string.gmatch(str, '%S+') do t[#t + 1] = w end
  return t
end

-- The limits at words t[at..]: {{alg, p, bucket}...} and the index after them. Their count
-- ends with "+" when their records take more than 64 words in memory (a denial they count
-- is then kept even if it never fits, as the in-memory store keeps it: limits.lua).
local function spec_limits(t, at, packed)
  local ls = {}
  local ct = t[at]
  if string.sub(ct, -1) == '+' then
    ls.keeps = true
    ct = string.sub(ct, 1, -2)
  end
  local count = tonumber(ct)
  at = at + 1
  for i = 1, count do
    local alg = ALG[t[at]]
    if not alg then error('turnstile: unknown algorithm ' .. tostring(t[at])) end
    local p = {}
    for j = 1, alg.nargs do p[j] = tonumber(t[at + j]) end
    local bucket = packed and alg.bucket
    if alg.prep then alg.prep(p, bucket) end
    ls[i] = {alg = alg, p = p, bucket = bucket}
    at = at + 1 + alg.nargs
  end
  return ls, at
end

local function cached(str, parse)
  local sp = SPECS[str]
  if sp then return sp end
  if NSPECS >= SPEC_CACHE then SPECS, NSPECS = {}, 0 end
  sp = parse(spec_words(str))
  SPECS[str], NSPECS = sp, NSPECS + 1
  return sp
end

local function parse_store(t)
  return (spec_limits(t, 2, t[1] == 'b'))
end

-- The call's time from its op argument: "<mode>" at the server's TIME, "<mode><ns>" at an
-- explicit now (tests; TTLs then get SLACK_MS more). Sets SLACK.
local function call_time(op)
  if #op == 1 then
    SLACK = 0
    local t = redis.call('TIME')
    return t[1] + 0, t[2] * 1000
  end
  SLACK = SLACK_MS
  return t_parse(string.sub(op, 2))
end

-- Record handles over `keys` from index `k` for the limits ls: {{alg, record, p}...}. The
-- tables are the cached limits' own, reset for this call (no allocation per call).
local function bind(ls, keys, k, field)
  local out = ls.bound
  if not out then
    out = {keeps = ls.keeps}
    for i = 1, #ls do
      local l = ls[i]
      local r = {alg = l.alg, p = l.p, key = false, field = false, loaded = false, v = false,
        v0 = false, meta = false, dirty = false, w_idle = 0, w_s = 0, w_n = 0, w_keep = false}
      out[i] = {l.alg, r, l.p}
    end
    ls.bound = out
  end
  for i = 1, #ls do
    local f = false
    if ls[i].bucket then f = field end
    rec_bind(out[i][2], keys[k + i - 1], f)
  end
  return out
end
