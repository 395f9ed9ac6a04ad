-- plain.lua: a refund to a window's key of a store by plain commands (RedisStore's
-- plain_commands: its checks are plain INCRBY / PEXPIRE transactions, not this library; a
-- refund must not take a count below 0, which no plain command can promise).
--
-- keys: [1] the window's key (a decimal count, with its TTL).
-- args: [1] the amount given back; [2] the count's ceiling, 0 for none (a limit counting
--       denials: its counter saturates there, as in memory; plain INCRBYs do not stop at it).
-- Reply: the count left. An absent key stays absent (nothing to give back); the TTL is kept.
local function plain_refund(keys, args)
  local v = redis.call('GET', keys[1])
  if not v then return 0 end
  local c, top = tonumber(v), tonumber(args[2])
  if top > 0 and c > top then c = top end
  c = c - tonumber(args[1])
  if c <= 0 then c = 0 end
  redis.call('SET', keys[1], string.format('%d', c), 'KEEPTTL')
  return c
end
