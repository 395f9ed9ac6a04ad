-- lease.lua: a node's lease of a key's admissions, ops "l" and "g" of store.lua's function
-- (no keys, arguments or reply of its own; the op's are in store.lua's header). Window and
-- bucket limits only (fixed_window, sliding_window, token_bucket, leaky_bucket; Rust refuses
-- the others).
--
-- "l" (lease): grants g admissions, cost <= g, all-or-nothing across the key's limits, taken
--   as one check of cost g: every admission a node spends was counted here first. g is what
--   the node would spend at its rate (cost units per 10^12 ns) before the lease ends (at most
--   an eighth of a window, and `longest` ns), at most what every limit has left, at least the
--   request's own cost (else the request is decided alone: a denial, counted as a check's).
--   A lease ends:
--   * windows (fixed and sliding): at the window's end less its final share (`share` ppm of
--     the window): admissions are not leased in a window's final share (g = cost: a check),
--     so what a node holds at the end of its lease can still be given back and spent by
--     others in the same window;
--   * buckets (GCRA): never all at once: the node may hold a token only while the bucket,
--     without it, would not be full (its TAT after the grant is ahead of now by a token's
--     interval for each token held). Held tokens plus the bucket's own never exceed its
--     capacity: the fleet's admissions are a trace the bucket alone admits. So a node is
--     granted what it can spend before its tokens lapse at its rate.
--   Delayed mode: `pending` admissions the node made are recorded first, as many as still
--   fit (`flushed`), and the request is then checked alone (rate 0).
--   Reply: "<g> <final: 1 if a window is in its final share> <epoch: the call's time, ns>
--   <flushed> <end_1> ... <end_n> " then reply6 of the decision (an admission of g, or the
--   request's denial). end_i, per limit, ns from now: a window's lease end (the window's end if final);
--   a bucket's TAT after the call.
-- "g" (give back): `amount` back to each window limit whose window holds both the lease's
--   epoch and now (never to a later window, where it was not taken), and to each bucket limit
--   whose TAT is still the one the grant left (args [6..]: per limit, ns after the epoch):
--   a TAT is one number, and tokens go back from its end only, so only a node whose tokens
--   are the bucket's last gives them back (others' lapse).
--   Reply: amount if every limit took it back, else 0.
local LEASE = {E12 = 1000000000000}

function LEASE.window(alg) return alg == ALG.fw or alg == ALG.sw end

-- ceil(a * b / 1e12), a, b < 2^53.
function LEASE.scale(a, b)
  local q, r = muldiv(a, b, LEASE.E12)
  if r > 0 then q = q + 1 end
  return q
end

-- The tokens a node spending `rate` can use from a bucket of interval t, span tau, backlog bk
-- before they lapse: all it would spend in tau when its rate alone drains the bucket (rate t
-- >= 1 token per interval), else rate bk / (1 - rate t): the time until the backlog (which
-- shrinks at 1 - rate t per ns) no longer covers what the node still holds, times the rate.
function LEASE.bucket_want(rate, t, tau, bk, longest)
  local rt = muldiv(rate, t, LEASE.E12)
  if rt >= 1 then return LEASE.scale(rate, math.min(tau, longest)) end
  local q = muldiv(rate, bk, LEASE.E12 - rate * t)
  return q
end

function LEASE.grant(b, s, n, cost, rate, share, pending, longest)
  local flushed = 0
  if pending > 0 then
    -- Delayed mode: the node's unrecorded admissions first, as many as still fit.
    flushed = pending
    for i = 1, #b do
      local alg, r, p = b[i][1], b[i][2], b[i][3]
      local rem = alg.step(r, counting_nothing(alg, p), s, n, 0, false)[3]
      if rem < flushed then flushed = rem end
    end
    if flushed > 0 then decide(b, s, n, flushed, true) end
  end
  local left, final, horizon, want = -1, false, -1, -1
  local ends = {}
  for i = 1, #b do
    local alg, r, p = b[i][1], b[i][2], b[i][3]
    local peek = alg.step(r, counting_nothing(alg, p), s, n, 0, false)
    if left < 0 or peek[3] < left then left = peek[3] end
    if LEASE.window(alg) then
      local w = p[2]
      local rest = w - t_mod(s, n, w)
      local f = muldiv(w, share, 1000000)
      if rest <= f then final = true else rest = rest - f end
      ends[i] = rest
      -- What the node would spend until the lease ends, but at most an eighth of the window
      -- (and `longest` ns) at a time: a rate misjudged strands less, and a node spending
      -- faster renews sooner.
      local h = math.min(rest, idiv(w, 8), longest)
      if horizon < 0 or h < horizon then horizon = h end
    else
      local bw = LEASE.bucket_want(rate, p[2], p[3], peek[4], longest)
      if want < 0 or bw < want then want = bw end
      ends[i] = 0
    end
  end
  if horizon >= 0 then
    local ww = LEASE.scale(rate, horizon)
    if want < 0 or ww < want then want = ww end
  end
  local g = want
  if final or g < cost then g = cost end
  if g > left then g = left end
  local d
  if g >= cost and g > 0 then
    d = decide(b, s, n, g, true)
  else
    g = 0
    d = decide(b, s, n, cost, true)
  end
  local out = string.format('%d %d %s %d', g, final and 1 or 0, t_str(s, n), flushed)
  for i = 1, #b do
    local e = ends[i]
    if not LEASE.window(b[i][1]) then e = b[i][1].step(b[i][2], b[i][3], s, n, 0, false)[4] end
    out = out .. string.format(' %d', e)
  end
  rec_flush_all(b)
  return out .. ' ' .. reply6(d)
end

function LEASE.give(b, s, n, m, epoch, args)
  local es, en = t_parse(epoch)
  local all = true
  for i = 1, #b do
    local alg, r, p = b[i][1], b[i][2], b[i][3]
    local same
    if LEASE.window(alg) then
      local w = p[2]
      local s1, n1 = t_add(es, en, -t_mod(es, en, w))
      local s2, n2 = t_add(s, n, -t_mod(s, n, w))
      same = s1 == s2 and n1 == n2
    else
      -- A TAT is one number: tokens go back from its end only. Only while it is where the
      -- grant left it are the node's tokens the bucket's last.
      local e = tonumber(args[5 + i])
      same = e ~= nil and rec_get(r) == t_str(t_add(es, en, e))
    end
    if same then alg.refund(r, p, s, n, m) else all = false end
  end
  rec_flush_all(b)
  if all then return m end
  return 0
end
