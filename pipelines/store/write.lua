-- headwater online store: idempotent batched write of packed values (layout: codec.py).
--
-- KEYS[i]  key of row i; all KEYS belong to one view, hence one hash slot.
-- ARGV[1]  absolute expiry in epoch ms (decimal string, equal to every record's expire_at_ms),
--          "0" = no expiry. Each key gets PXAT ARGV[1], so a value put back keeps its exact expiry.
-- ARGV[2]  record size in bytes (72-byte header + 4 bytes per feature).
-- ARGV[3]  the records of all rows, concatenated in KEYS order.
--
-- Returns one status character per row: "1" written; "0" stale (the stored event time is
-- newer, the stored value is kept); "2" unchanged (same event time and the same schema,
-- version and payload: a replay, the stored value, its write time and expiry are kept).
-- Same event time with a different payload or version is written: a recomputation wins.
--
-- Common case in one call per key: SET ... PXAT ... GET stores the new value and returns the old one.
-- When the old one must win, it is put back with its own absolute expiry (expire_at_ms at
-- offset 24), inside this script, so no reader ever sees the rejected value.
local expire_at_all = ARGV[1]
local size = tonumber(ARGV[2])
local blob = ARGV[3]
if #blob ~= size * #KEYS then
  return redis.error_reply('ERR headwater write: ' .. #blob .. ' bytes for ' .. #KEYS .. ' keys of ' .. size)
end
local sub, unpack = string.sub, struct.unpack
local out = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local off = (i - 1) * size
  local rec = sub(blob, off + 1, off + size)
  local old
  if expire_at_all == '0' then
    old = redis.call('SET', key, rec, 'GET')
  else
    old = redis.call('SET', key, rec, 'PXAT', expire_at_all, 'GET')
  end
  local code = '1'
  if old and #old >= 72 and sub(old, 1, 2) == 'HW' then
    local new_et = unpack('<i8', rec, 9)
    local old_et = unpack('<i8', old, 9)
    if old_et > new_et then
      code = '0'
    elseif old_et == new_et and #old == #rec and sub(old, 33) == sub(rec, 33) then
      code = '2'
    end
    if code ~= '1' then
      local expire_at = unpack('<i8', old, 25)
      if expire_at > 0 then
        redis.call('SET', key, old, 'PXAT', string.format('%.0f', expire_at))
      else
        redis.call('SET', key, old)
      end
    end
  end
  out[i] = code
end
return table.concat(out)
