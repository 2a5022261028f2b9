-- One gateway's grant on a shared pool (see doc.go).
-- KEYS[1]: the pool's hash, instance -> "grant,inflight,demand,expiry_ms".
-- ARGV: instance, demand, inflight, slots, ttl_ms.
local key = KEYS[1]
local inst = ARGV[1]
local demand = tonumber(ARGV[2])
local inflight = tonumber(ARGV[3])
local slots = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local used = 0
local entries = {{name = inst, d = math.min(demand, slots)}}
local all = redis.call('HGETALL', key)
for i = 1, #all, 2 do
  local name = all[i]
  if name ~= inst then
    local g, f, d, exp = string.match(all[i + 1], '^(%d+),(%d+),(%d+),(%d+)$')
    if g and tonumber(exp) > now then
      used = used + math.max(tonumber(g), tonumber(f))
      table.insert(entries, {name = name, d = math.min(tonumber(d), slots)})
    else
      redis.call('HDEL', key, name)
    end
  end
end

-- Max-min fair division of the pool by demand, in whole slots: the
-- gateways that want more than the level share what is left equally, the
-- remainder one slot each in name order, so the shares add up to the pool.
table.sort(entries, function(x, y)
  if x.d ~= y.d then return x.d < y.d end
  return x.name < y.name
end)
local left, n = slots, #entries
local fair = math.min(demand, slots)
for i = 1, n do
  local k = n - i + 1
  if entries[i].d * k > left then
    local capped = {}
    for j = i, n do table.insert(capped, entries[j].name) end
    table.sort(capped)
    local base = math.floor(left / k)
    local extra = left - base * k
    for j, name in ipairs(capped) do
      if name == inst then
        fair = base
        if j <= extra then fair = base + 1 end
      end
    end
    break
  end
  left = left - entries[i].d
end

local grant = math.max(0, math.min(fair, slots - used))
redis.call('HSET', key, inst, grant .. ',' .. inflight .. ',' .. demand .. ',' .. (now + ttl))
redis.call('PEXPIRE', key, ttl * 2)
return grant
