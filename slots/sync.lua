-- One gateway's grant on a shared pool (see doc.go).
-- KEYS[1]: the pool's hash, instance -> "grant,inflight,demand,weight_milli,expiry_ms".
-- ARGV: instance, demand, inflight, slots, ttl_ms, weight_milli.
local key = KEYS[1]
local inst = ARGV[1]
local demand = tonumber(ARGV[2])
local inflight = tonumber(ARGV[3])
local slots = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local weight = math.max(tonumber(ARGV[6]), 1)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local used = 0
local entries = {{name = inst, d = math.min(demand, slots), w = weight}}
local all = redis.call('HGETALL', key)
for i = 1, #all, 2 do
  local name = all[i]
  if name ~= inst then
    local g, f, d, w, exp = string.match(all[i + 1], '^(%d+),(%d+),(%d+),(%d+),(%d+)$')
    if g and tonumber(exp) > now then
      used = used + math.max(tonumber(g), tonumber(f))
      table.insert(entries, {name = name, d = math.min(tonumber(d), slots), w = math.max(tonumber(w), 1)})
    else
      redis.call('HDEL', key, name)
    end
  end
end

-- Weighted max-min fair division of the pool by demand, in whole slots:
-- in order of demand per weight, a gateway wanting less than its weight's
-- part of what is left gets its demand; the rest share what is left by
-- weight, rounded down, the remainder one slot each in name order, so the
-- shares add up to the pool. When all the demand fits, what nobody wants
-- is shared out the same way on top of each demand, so an idle gateway
-- holds slots for the next request rather than waiting a sync for them.
local left, W, n, D = slots, 0, #entries, 0
for _, e in ipairs(entries) do
  W = W + e.w
  D = D + e.d
end
local function share_out(group, amount, weight)
  -- group: entries to share amount by weight; returns this gateway's part.
  local names, parts, sum = {}, {}, 0
  for _, e in ipairs(group) do
    local s = math.floor(amount * e.w / weight)
    parts[e.name] = s
    sum = sum + s
    table.insert(names, e.name)
  end
  table.sort(names)
  local extra = amount - sum
  for j, name in ipairs(names) do
    if name == inst then
      local s = parts[name]
      if j <= extra then s = s + 1 end
      return s
    end
  end
  return nil -- this gateway is not in the group: its demand stands
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
redis.call('HSET', key, inst, string.format('%d,%d,%d,%d,%d', grant, inflight, demand, weight, now + ttl))
redis.call('PEXPIRE', key, ttl * 2)
return grant
