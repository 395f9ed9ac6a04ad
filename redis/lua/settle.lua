-- settle.lua: a cost known only after the work, settled against the cost a check reserved
-- (turnstile::keyed::Store::settle, turnstile::rules::Engine::settle): the difference charged
-- whatever the limits hold, or given back as a refund is, on every limit in one call (one
-- script: nothing runs in between, all or nothing). After limits.lua, before store.lua and
-- rules.lua. No keys, arguments or reply of its own.
--
-- A charge of m takes m on every limit (each algorithm's `charge`): past a limit the key owes
-- it, and its next checks are denied until it is paid (docs/algorithms.md says per
-- algorithm how far). m is capped at 2^53 - 1, the largest integer a double holds exactly
-- (a debt that large is past every limit's saturation, or 2^53 intervals of a bucket).
local SETTLE_MAX = 9007199254740991

-- Takes m on every limit of ls ({{alg, record, p}...}).
local function charge_all(ls, s, n, m)
  if m > SETTLE_MAX then m = SETTLE_MAX end
  if m <= 0 then return end
  for i = 1, #ls do ls[i][1].charge(ls[i][2], ls[i][3], s, n, m) end
end

-- A rules step settled at `actual` (st.cost reserved): a charge goes to the rule's own
-- limits (an elastic rule's debt is the key's, not its pool's); returns what is to be given
-- back (0 for a charge or the same amount), which rules.lua gives as a refund.
local function settle_step(st, s, n, actual)
  if actual > st.cost then
    charge_all(st.main, s, n, actual - st.cost)
    return 0
  end
  return st.cost - actual
end
