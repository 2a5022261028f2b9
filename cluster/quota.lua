-- One tenant's quota meters (see quota.go and the "# Quotas" section of
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
-- ARGV[7]  the longest wait a charge may book, ns (absent: 0, a charge
--          now or nothing).
-- ARGV[8]  the caller's lead, ns (absent: none): the store keeps the
--          longest lead given within the last minute, in fields l and lt
--          (the lead and when it was given), while the tenant stays in
--          debt; a booking may wait up to ARGV[7] less that lead. Any
--          write that finds the tenant at rest forgets it.
--
-- Returns {allowed, now, q, t, j, at, why}: "1" when a charge was made,
-- else "0"; now and the TATs after the call as decimal int64 ns; the time
-- a charge was booked for (now but for a booking ahead) and the meter
-- that set it (1 to 3, 0 for none), as Decide picks it. Go derives the
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

local function sub(a, b)
  local s, n = a[1] - b[1], a[2] - b[2]
  if n < 0 then
    s, n = s - 1, n + G
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
local raw = redis.call('HMGET', key, 'q', 't', 'j', 'l', 'lt')
local tat = {}
local rested = true
for i = 1, 3 do
  tat[i] = parse(raw[i]) or now
  if less(now, tat[i]) then
    rested = false
  end
end

-- The lead in force: stored while the tenant is in debt, for a minute
-- after it was given (LeadMemory).
local ZERO = {0, 0}
local lead, leadAt = ZERO, nil
if not rested then
  local l, lt = parse(raw[4]), parse(raw[5])
  if l and lt and not less(add(lt, {60, 0}), now) then
    lead, leadAt = l, lt
  end
end

local function reply(allowed, at, why)
  return {allowed, fmt(now), fmt(tat[1]), fmt(tat[2]), fmt(tat[3]), fmt(at or now), tostring(why or 0)}
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

-- forget drops the lead of a tenant a write finds at rest.
local function forget()
  if rested then
    redis.call('HDEL', key, 'l', 'lt')
  end
end

if op == 'c' then
  forget()
  local given = parse(ARGV[8] or '0') or ZERO
  local newLead = false
  if less(ZERO, given) and not less(given, lead) then
    lead, leadAt, newLead = given, now, true
  end
  local wait = sub(parse(ARGV[7] or '0') or ZERO, lead)
  if wait[1] < 0 then
    wait = ZERO
  end
  local function keepLead()
    if newLead then
      redis.call('HSET', key, 'l', fmt(lead), 'lt', fmt(leadAt))
    end
  end
  -- Decide: a request conforms iff TAT <= now + tau on every meter on;
  -- else its earliest time is the latest TAT - tau.
  local tau = parse(ARGV[2])
  local at, why = now, 0
  for i = 1, 3 do
    if ARGV[3 + i] ~= '' then
      local e = sub(tat[i], tau)
      if less(now, e) and not less(e, at) then
        at, why = e, i
      end
    end
  end
  if less(add(now, wait), at) then
    keepLead()
    return reply('0')
  end
  -- Charge as of at: TAT = max(TAT, at) + increment, all meters at once.
  for i = 1, 3 do
    local inc = ARGV[3 + i]
    if inc ~= '' then
      tat[i] = add(maxp(tat[i], at), parse(inc))
    end
  end
  store()
  if less(now, maxp(maxp(tat[1], tat[2]), tat[3])) then
    keepLead()
  end
  return reply('1', at, why)
elseif op == 'x' then
  forget()
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
