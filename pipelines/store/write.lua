-- headwater online store: idempotent batched write of packed values (layout: codec.py).
--
-- KEYS[i]  key of row i; all KEYS belong to one view, hence one hash slot.
-- ARGV[1]  absolute expiry in epoch ms (decimal string, equal to every record's expire_at_ms),
--          "0" = no expiry. Each key gets PXAT ARGV[1], so a value put back keeps its exact expiry.
-- ARGV[2]  record size in bytes (72-byte header + 4 bytes per feature).
-- ARGV[3]  the records of all rows, concatenated in KEYS order.
-- ARGV[4]  optional: the writer's fence epoch; then the LAST key is the fence key
--          <namespace>:fence:{<view>}:<owner> (same slot) and is not a row. A fence holding a
--          greater epoch refuses the whole call (error reply HWFENCED, nothing written): a writer
--          that lost its partition to a newer owner (nearline zombie, pipelines/nearline/fence.py)
--          cannot overwrite the new owner's values. Otherwise the fence takes this epoch (7 days).
--          A call with no row and a fence only claims the fence. "" (empty): no fence (so ARGV[5] can
--          be given without one).
-- ARGV[5]  optional: per row, in KEYS order, a little-endian int64 "valid to" V, concatenated (8 bytes a
--          row): the row's value holds over [E, V], E its event time (the realtime tier after a
--          restore, pipelines/realtime: the same value at every boundary from its last change E to V).
--          When the stored event time D is inside (E, V], the row is written dated D instead of E, so
--          a value another run wrote at D is compared with this one at D (same time: "unchanged" or
--          written, below) rather than kept as the newer. V <= E (or no ARGV[5]): the row as it is.
--
-- Returns one status character per row: "1" written; "0" stale (the stored event time is
-- newer, the stored value is kept); "2" unchanged (same event time and the same schema,
-- version and payload: a replay, the stored value, its write time and expiry are kept).
-- Same event time with a different payload or version is written: a recomputation wins.
--
-- Freshness log (one extra command per call, whoever calls the script): one XADD to the capped stream
-- <namespace>:fresh:{<view>} (same hash tag, so same slot as the rows; derived from KEYS[1]) with
--   w   write time of the call (ms, from the first record's header, offset 16)
--   n   rows written (status "1");  r  rows in the call
--   lo  smallest event time (window boundary B) of the written rows (0 when n = 0)
--   hi  greatest event time of all rows of the call: the tier's progress (boundary published up to)
--   s   event times of the written rows as "B:count,...": exact when at most 8 distinct B, otherwise
--       8 quantile points of the sorted event times, the counts summing to n.
--   v   the view version of the call's values (from the first record's header, offsets 3 and 40).
-- Readers: headwater.pipelines.freshness.samples. Keep both in sync.
--
-- Change feed (only while the capped stream <namespace>:changes:{<view>} exists: a reader creates it,
-- the serving index refresher for the item views; otherwise one EXISTS per call): when the call wrote
-- rows, one XADD there with e = the written entity ids (status "1"), each as <length>:<bytes>
-- (pipelines/keycodec.py pack_parts: an id holding a newline or any byte is one id), in the same
-- call as the freshness entry, so a reader that finds a freshness entry with n > 0 and no feed entry
-- knows the feed missed a write. Reader: headwater.serving.retrieval.refresh (FEED_MAXLEN, changes_key),
-- through layout.feed_entry_ids (which also reads the newline-separated k of entries written before).
-- The entity id is everything after <namespace>:{<view>}: (the namespace holds no brace, the view no
-- brace or colon: layout.py), so it is cut off at that length, never parsed.
--
-- Common case in one call per key: SET ... PXAT ... GET stores the new value and returns the old one.
-- When the old one must win, it is put back with its own absolute expiry (expire_at_ms at
-- offset 24), inside this script, so no reader ever sees the rejected value.
local expire_at_all = ARGV[1]
local size = tonumber(ARGV[2])
local blob = ARGV[3]
local nkeys = #KEYS
if ARGV[4] and ARGV[4] ~= '' then
  nkeys = nkeys - 1
  local fence, mine = KEYS[#KEYS], tonumber(ARGV[4])
  local held = tonumber(redis.call('GET', fence))
  if held and held > mine then
    return redis.error_reply('HWFENCED ' .. fence .. ' is held by epoch ' .. held .. '; this writer has ' .. ARGV[4])
  end
  redis.call('SET', fence, ARGV[4], 'PX', 604800000)
end
if #blob ~= size * nkeys then
  return redis.error_reply('ERR headwater write: ' .. #blob .. ' bytes for ' .. nkeys .. ' keys of ' .. size)
end
local valid_to = ARGV[5]
if valid_to and #valid_to ~= 8 * nkeys then
  return redis.error_reply('ERR headwater write: ' .. #valid_to .. ' bytes of valid-to for ' .. nkeys .. ' keys')
end
local sub, unpack = string.sub, struct.unpack
local out = {}
local counts, distinct, written, hi = {}, {}, 0, nil
for i = 1, nkeys do
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
  local new_et = unpack('<i8', rec, 9)
  local old_et, redated
  if old and #old >= 72 and sub(old, 1, 2) == 'HW' then
    old_et = unpack('<i8', old, 9)
    if valid_to and old_et > new_et and old_et <= unpack('<i8', valid_to, 8 * i - 7) then
      new_et, redated = old_et, true  -- the same value holds at the stored time: compare it there
    end
  end
  if hi == nil or new_et > hi then
    hi = new_et
  end
  if old_et then
    if old_et > new_et then
      code = '0'
    elseif old_et == new_et and #old == #rec and sub(old, 33) == sub(rec, 33) then
      code = '2'
    end
    if code == '1' and redated then  -- another payload at the stored time: written there
      rec = sub(rec, 1, 8) .. struct.pack('<i8', old_et) .. sub(rec, 17)
      if expire_at_all == '0' then
        redis.call('SET', key, rec)
      else
        redis.call('SET', key, rec, 'PXAT', expire_at_all)
      end
    elseif code ~= '1' then
      local expire_at = unpack('<i8', old, 25)
      if expire_at > 0 then
        redis.call('SET', key, old, 'PXAT', string.format('%.0f', expire_at))
      else
        redis.call('SET', key, old)
      end
    end
  end
  out[i] = code
  if code == '1' then
    written = written + 1
    local c = counts[new_et]
    if c == nil then
      distinct[#distinct + 1] = new_et
      counts[new_et] = 1
    else
      counts[new_et] = c + 1
    end
  end
end
local ns, view = string.match(KEYS[1] or '', '^(.-):{([^}]+)}:')
if ns and nkeys > 0 then
  local fmt = string.format
  table.sort(distinct)
  local parts = {}
  local k = 8
  if #distinct <= k then
    for j = 1, #distinct do
      parts[j] = fmt('%.0f:%d', distinct[j], counts[distinct[j]])
    end
  else
    -- k quantile points: point j stands for the rows of rank floor((j-1)n/k)+1 .. floor(jn/k).
    local idx, cum = 1, counts[distinct[1]]
    for j = 1, k do
      local first, last = math.floor((j - 1) * written / k), math.floor(j * written / k)
      local mid = math.floor((first + last + 1) / 2)
      while cum < mid do
        idx = idx + 1
        cum = cum + counts[distinct[idx]]
      end
      parts[j] = fmt('%.0f:%d', distinct[idx], last - first)
    end
  end
  redis.call('XADD', ns .. ':fresh:{' .. view .. '}', 'MAXLEN', '~', 20000, '*',
    'w', fmt('%.0f', unpack('<i8', blob, 17)), 'n', written, 'r', nkeys,
    'lo', fmt('%.0f', distinct[1] or 0), 'hi', fmt('%.0f', hi), 's', table.concat(parts, ','),
    'v', string.sub(blob, 41, 40 + string.byte(blob, 4)))
  -- Change feed: only where a reader created it (the serving index refresher, for item views).
  local feed = ns .. ':changes:{' .. view .. '}'
  if written > 0 and redis.call('EXISTS', feed) == 1 then
    local cut, ids = #ns + #view + 5, {}
    for i = 1, nkeys do
      if out[i] == '1' then
        local id = sub(KEYS[i], cut)
        ids[#ids + 1] = #id .. ':' .. id
      end
    end
    redis.call('XADD', feed, 'MAXLEN', '~', 1000, '*', 'e', table.concat(ids))
  end
end
return table.concat(out)
