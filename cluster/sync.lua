-- One gateway's grant on a shared pool (see doc.go).
-- KEYS[1]: the pool's hash, instance ->
-- "grant,inflight,demand,weight_milli,expiry_ms,renewed_ms" (an entry
-- without renewed_ms, of an earlier version, counts as renewed before any
-- since).
-- KEYS[2]: the upstreams' hash, instance -> "<upstream> <in flight>
-- <target> ..." (each gateway's requests in flight on each upstream of the
-- pool, or as many as it may have there until it applies its targets, and
-- where it places its grant).
-- ARGV: instance, demand, inflight, slots, ttl_ms, weight_milli, channel,
-- since_ms (0: not asked), then triples: upstream, this gateway's requests in flight on it, its
-- slots (0 when unhealthy).
-- Returns {grant, fair share, 0 | 1 claimed | 2 freed, 1 if this
-- gateway had no entry (its first call, or Redis lost it) else 0, the
-- time (Unix ms), how many other live gateways renewed at or after
-- since_ms, then for each upstream given, the name, the other live gateways' requests in
-- flight on it and this gateway's target on it}. Publishes on the channel "claim <instance>"
-- when this gateway's weight grew and it is owed slots (the others should
-- lower their grants now, not at their next sync), or "freed <instance>" when it holds fewer
-- slots than before (a gateway owed slots may take them now).
local key = KEYS[1]
local inst = ARGV[1]
local demand = tonumber(ARGV[2])
local inflight = tonumber(ARGV[3])
local slots = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local weight = math.max(tonumber(ARGV[6]), 1)
local channel = ARGV[7]
local since = tonumber(ARGV[8])
local upkey = KEYS[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local entry = '^(%d+),(%d+),(%d+),(%d+),(%d+),?(%d*)$'
local used, renewed = 0, 0
local live = {}
local entries = {{name = inst, d = math.min(demand, slots), w = weight}}
local all = redis.call('HGETALL', key)
local held, had_w = nil, nil -- this gateway's entry before this call
for i = 1, #all, 2 do
  local name = all[i]
  if name == inst then
    local g, f, _, w = string.match(all[i + 1], entry)
    if g then
      held, had_w = math.max(tonumber(g), tonumber(f)), tonumber(w)
    end
  else
    local g, f, d, w, exp, at = string.match(all[i + 1], entry)
    if g and tonumber(exp) > now then
      used = used + math.max(tonumber(g), tonumber(f))
      live[name] = true
      if since > 0 and at ~= '' and tonumber(at) >= since then
        renewed = renewed + 1
      end
      table.insert(entries, {name = name, d = math.min(tonumber(d), slots), w = math.max(tonumber(w), 1)})
    else
      redis.call('HDEL', key, name)
      redis.call('HDEL', upkey, name)
    end
  end
end

-- Weighted max-min fair division of the pool by demand, in whole slots:
-- in order of demand per weight, a gateway wanting less than its weight's
-- part of what is left gets its demand; the rest share what is left by
-- weight, rounded down, the remainder one slot each to the largest
-- fractions (ties in name order), so the shares add up to the pool and a
-- gateway whose tenants outweigh the others' gets the last slot. When all
-- the demand fits, what nobody wants is shared out the same way on top of
-- each demand, so an idle gateway holds slots for the next request rather
-- than waiting a sync for them.
local left, W, n, D = slots, 0, #entries, 0
for _, e in ipairs(entries) do
  W = W + e.w
  D = D + e.d
end
local function share_out(group, amount, weight)
  -- group: entries to share amount by weight; returns this gateway's part.
  local parts, rest, sum = {}, {}, 0
  for _, e in ipairs(group) do
    local exact = amount * e.w / weight
    local s = math.floor(exact)
    parts[e.name] = s
    sum = sum + s
    table.insert(rest, {name = e.name, r = exact - s})
  end
  local mine = parts[inst]
  if mine == nil then
    return nil -- this gateway is not in the group: its demand stands
  end
  table.sort(rest, function(x, y)
    if x.r ~= y.r then return x.r > y.r end
    return x.name < y.name
  end)
  for j = 1, amount - sum do
    if rest[j].name == inst then return mine + 1 end
  end
  return mine
end
local fair = math.min(demand, slots)
if D <= slots then
  fair = fair + (share_out(entries, slots - D, W) or 0)
else
  table.sort(entries, function(x, y)
    local a, b = x.d * y.w, y.d * x.w
    if a ~= b then return a < b end
    return x.name < y.name
  end)
  for i = 1, n do
    local e = entries[i]
    if e.d * W > e.w * left then
      local group = {}
      for j = i, n do table.insert(group, entries[j]) end
      fair = share_out(group, left, W) or fair
      break
    end
    left = left - e.d
    W = W - e.w
  end
end

local grant = math.max(0, math.min(fair, slots - used))
redis.call('HSET', key, inst, string.format('%d,%d,%d,%d,%d,%d', grant, inflight, demand, weight, now + ttl, now))
redis.call('PEXPIRE', key, ttl * 2)
-- A claim only from a gateway owed slots: a weight that grew where the
-- grant already covers the demand moves nothing.
local moved = 0
if channel ~= '' and n > 1 then
  if had_w and weight > had_w and fair > grant and demand > grant then
    redis.call('PUBLISH', channel, 'claim ' .. inst)
    moved = 1
  elseif held and math.max(grant, inflight) < held then
    redis.call('PUBLISH', channel, 'freed ' .. inst)
    moved = 2
  end
end
-- The upstreams: the others' requests in flight on each of this
-- gateway's upstreams, and its targets, where it should place its grant:
-- its requests in flight where they are (up to the room the others
-- leave), then the rest of the grant one slot at a time where the most
-- room is left, room being the upstream's slots less what the others hold
-- on it (the larger of their targets and their requests in flight). The
-- gateways' targets, each made against the others', never put more on an
-- upstream than its slots, so gateways placing their requests by them do
-- not pile onto one model server between renewals.
local fresh = 0
if held == nil then fresh = 1 end
local out = {grant, fair, moved, fresh, now, renewed}
if #ARGV >= 11 then
  local others, taken = {}, {}
  local ups = redis.call('HGETALL', upkey)
  for i = 1, #ups, 2 do
    if live[ups[i]] then
      for u, f, g in string.gmatch(ups[i + 1], '(%S+) (%d+) (%d+)') do
        f, g = tonumber(f), tonumber(g)
        others[u] = (others[u] or 0) + f
        taken[u] = (taken[u] or 0) + math.max(f, g)
      end
    end
  end
  local list, left, placed = {}, grant, 0
  for i = 9, #ARGV - 2, 3 do
    local u, f, c = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
    local room = math.max(c - (taken[u] or 0), 0)
    -- Every request in flight counts against the grant, where it is.
    left = left - f
    placed = placed + f
    table.insert(list, {u = u, f = f, room = room, g = math.min(f, room)})
  end
  -- What this gateway may have on each upstream until it applies the
  -- targets returned: its requests there when it called, and more up to
  -- its last target there, since it goes on dispatching by that target
  -- during the round trip, as many as it holds beyond its requests in
  -- flight. The others keep off that until its next renewal: without it,
  -- when every gateway renews at once (a flood starting), a new target
  -- could leave requests above it where the others were just given room.
  local last = {}
  local prev = redis.call('HGET', upkey, inst)
  if prev then
    for u, _, g in string.gmatch(prev, '(%S+) (%d+) (%d+)') do
      last[u] = tonumber(g)
    end
  end
  local spare = math.max(inflight - placed, 0)
  while left > 0 do
    local best = nil
    for _, e in ipairs(list) do
      if e.room > e.g and (best == nil or e.room - e.g > best.room - best.g) then
        best = e
      end
    end
    if best == nil then break end
    best.g = best.g + 1
    left = left - 1
  end
  local parts = {}
  for _, e in ipairs(list) do
    local may = e.f + math.min(math.max((last[e.u] or 0) - e.f, 0), spare)
    table.insert(parts, e.u .. ' ' .. may .. ' ' .. e.g)
    table.insert(out, e.u)
    table.insert(out, others[e.u] or 0)
    table.insert(out, e.g)
  end
  redis.call('HSET', upkey, inst, table.concat(parts, ' '))
  redis.call('PEXPIRE', upkey, ttl * 2)
end
return out
