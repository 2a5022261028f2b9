-- One tenant's quota meters (see redis.go and the "# Redis" section of
-- doc.go): the conformance test and the writes of Decide, Charge and
-- Reconcile, atomically, on one hash, with the time from Redis TIME.
--
-- KEYS[1]  the tenant's hash: fields q, t, j hold the qps, tokens and joint
--          TATs as decimal int64 nanoseconds since the Unix epoch.
-- ARGV[1]  op: "r" read, "c" charge, "x" reconcile.
-- ARGV[2]  tolerance tau, ns (charge).
-- ARGV[3]  expiry margin, ms (charge, reconcile).
-- ARGV[4..6] per meter (q, t, j): the increment (charge) or the signed
--          difference (reconcile), ns; "" when the meter is off.
--
-- Returns {allowed, now, q, t, j}: "1" when a charge was made, else "0";
-- now and the TATs after the call as decimal int64 ns. Go derives the
-- earliest time, the reason and the status from them with the same pure
-- functions Memory uses.
--
-- Lua numbers are doubles, exact only up to 2^53 (104 days in ns), and
-- Unix nanoseconds are about 2^61. Every time here is therefore a pair
-- {s, n} = s x 1e9 + n with 0 <= n < 1e9: both parts are integers far
-- below 2^53, and add, compare and subtract carry between them, so every
-- result is the exact int64 Go would compute.

if redis.replicate_commands then
  -- Redis 3.2 to 4: allow writes after TIME (effects replication, the
  -- default and only mode from Redis 5 and 7 on).
  redis.replicate_commands()
end

local G = 1000000000
local MAXS = 9223372035 -- largest s whose values all fit an int64

-- parse turns a decimal int64 string into a pair, or returns nil for
-- anything else (a missing field, a garbled value): callers read nil as
-- "no debt".
local function parse(v)
  if type(v) ~= 'string' then
    return nil
  end
  local neg, d = string.match(v, '^(%-?)(%d+)$')
  if not d or #d > 19 then
    return nil
  end
  local s, n = 0, tonumber(d)
  if #d > 9 then
    s = tonumber(string.sub(d, 1, -10))
    n = tonumber(string.sub(d, -9))
    if s > MAXS then
      return nil
    end
  end
  if neg == '-' then
    if n > 0 then
      return {-s - 1, G - n}
    end
    return {-s, 0}
  end
  return {s, n}
end

local function add(a, b)
  local s, n = a[1] + b[1], a[2] + b[2]
  if n >= G then
    s, n = s + 1, n - G
  end
  if s > MAXS then
    -- Centuries of debt: clamp so that Go can still read it.
    s = MAXS
  end
  return {s, n}
end

local function less(a, b)
  return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2])
end

local function maxp(a, b)
  if less(a, b) then
    return b
  end
  return a
end

local function fmt(a)
  local s, n, sign = a[1], a[2], ''
  if s < 0 then
    sign = '-'
    if n > 0 then
      s, n = -s - 1, G - n
    else
      s = -s
    end
  end
  if s == 0 then
    return sign .. string.format('%d', n)
  end
  return sign .. string.format('%d%09d', s, n)
end

local key = KEYS[1]
local op = ARGV[1]
local clock = redis.call('TIME')
local now = {tonumber(clock[1]), tonumber(clock[2]) * 1000}
local raw = redis.call('HMGET', key, 'q', 't', 'j')
local tat = {}
for i = 1, 3 do
  tat[i] = parse(raw[i]) or now
end

local function reply(allowed)
  return {allowed, fmt(now), fmt(tat[1]), fmt(tat[2]), fmt(tat[3])}
end

-- store writes the TATs and lets the key expire when the tenant is at rest
-- (its largest TAT, rounded up to the millisecond, plus the margin); a
-- tenant already at rest is deleted: it is the same as an unknown one.
local function store()
  local m = maxp(maxp(tat[1], tat[2]), tat[3])
  if not less(now, m) then
    redis.call('DEL', key)
    return
  end
  redis.call('HSET', key, 'q', fmt(tat[1]), 't', fmt(tat[2]), 'j', fmt(tat[3]))
  local s, n = m[1] - now[1], m[2] - now[2]
  if n < 0 then
    s, n = s - 1, n + G
  end
  local ms = s * 1000 + math.floor((n + 999999) / 1000000) + tonumber(ARGV[3])
  redis.call('PEXPIRE', key, string.format('%d', ms))
end

if op == 'c' then
  -- Decide: a request conforms iff TAT <= now + tau on every meter on.
  local limit = add(now, parse(ARGV[2]))
  for i = 1, 3 do
    if ARGV[3 + i] ~= '' and less(limit, tat[i]) then
      return reply('0')
    end
  end
  -- Charge: TAT = max(TAT, now) + increment, all meters at once.
  for i = 1, 3 do
    local inc = ARGV[3 + i]
    if inc ~= '' then
      tat[i] = add(maxp(tat[i], now), parse(inc))
    end
  end
  store()
  return reply('1')
elseif op == 'x' then
  -- Reconcile: extra debt from max(TAT, now), a refund down to now at most.
  for i = 1, 3 do
    local d = parse(ARGV[3 + i])
    if d then
      if d[1] < 0 then
        tat[i] = maxp(add(tat[i], d), now)
      elseif d[1] > 0 or d[2] > 0 then
        tat[i] = add(maxp(tat[i], now), d)
      end
    end
  end
  store()
  return reply('0')
end
return reply('0')
