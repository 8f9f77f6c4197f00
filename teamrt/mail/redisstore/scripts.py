"""The server-side scripts (Lua): every change to a team is one script, so it is atomic.

Each script that reads or changes a team first checks the team's epoch (KEYS[1] is the team's
`meta` hash, ARGV[1] the epoch this store object opened), so a store object never writes into a
team that was lost and created again under it. A script validates everything before its first
write: Redis does not roll a script back, so a script that failed half way would leave half a
change. Scripts carry a `#!lua` line, which makes the server refuse a writing script at its start
when it is out of memory (instead of after its first write).

Errors a script returns on purpose start with `TEAMRT_` (see `client.script_error`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Script:
    """A Lua script and its SHA-1 (run with EVALSHA; sent whole after NOSCRIPT)."""

    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


_EPOCH = """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if epoch ~= ARGV[1] then return redis.error_reply('TEAMRT_EPOCH ' .. (epoch or '-')) end
"""

#: Create the team if asked to and register members; answer what a store object needs.
#: KEYS: meta, members, next. ARGV: create ('1' or '0'), the epoch this object already knows
#: ('' if none), a new epoch, now, format, max_envelope, team, lease ttl in ms, the opener's key
#: fingerprint ('' if it signs nothing, '-' if it does not say), names...
#: Returns {epoch, created_at, format, max_envelope, lease ttl in ms, key fingerprint, roster};
#: refuses with TEAMRT_KEY <the team's fingerprint> an opener whose fingerprint differs.
OPEN = Script(
    "open",
    """#!lua
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not epoch then
  if ARGV[2] ~= '' then return redis.error_reply('TEAMRT_EPOCH -') end
  if ARGV[1] ~= '1' then return redis.error_reply('TEAMRT_NOTEAM') end
  redis.call('HSET', KEYS[1], 'epoch', ARGV[3], 'created_at', ARGV[4], 'format', ARGV[5],
             'max_envelope', ARGV[6], 'team', ARGV[7], 'lease_ttl_ms', ARGV[8])
  if ARGV[9] ~= '-' then redis.call('HSET', KEYS[1], 'key_fingerprint', ARGV[9]) end
elseif ARGV[2] ~= '' and epoch ~= ARGV[2] then
  return redis.error_reply('TEAMRT_EPOCH ' .. epoch)
else
  local recorded = redis.call('HGET', KEYS[1], 'key_fingerprint')
  if recorded and ARGV[9] ~= '-' and recorded ~= ARGV[9] then
    return redis.error_reply('TEAMRT_KEY ' .. recorded)
  end
end
for i = 10, #ARGV do
  if redis.call('HSETNX', KEYS[3], ARGV[i], 0) == 1 then
    redis.call('RPUSH', KEYS[2], ARGV[i])
  end
end
local meta = redis.call('HMGET', KEYS[1], 'epoch', 'created_at', 'format', 'max_envelope',
                        'lease_ttl_ms', 'key_fingerprint')
return {meta[1], meta[2], meta[3], meta[4], meta[5], meta[6],
        redis.call('LRANGE', KEYS[2], 0, -1)}
""",
)

#: Append records to one inbox: membership, seq, the stamped line, XADD with id 0-<seq+1>.
#: KEYS: meta, next, the inbox stream. ARGV: epoch, name, team, encoded envelopes...
#: Returns the seq of the first. A stream whose top is not teamrt's makes the first XADD fail,
#: before anything is written.
APPEND = Script(
    "append",
    """#!lua
"""
    + _EPOCH
    + """
local seq = redis.call('HGET', KEYS[2], ARGV[2])
if not seq then return redis.error_reply('TEAMRT_UNKNOWN') end
seq = tonumber(seq)
local first = seq
local mid = ',"team":"' .. ARGV[3] .. '",'
for i = 4, #ARGV do
  redis.call('XADD', KEYS[3], string.format('0-%d', seq + 1), 'd',
             string.format('{"seq":%d', seq) .. mid .. ARGV[i])
  seq = seq + 1
end
redis.call('HSET', KEYS[2], ARGV[2], string.format('%d', seq))
return first
""",
)

#: One broadcast to every member but the sender, all or none.
#: KEYS: meta, next, members, then the inbox stream of every target in roster order.
#: ARGV: epoch, team, sender, encoded, the roster the caller knows (names joined by ',').
#: Returns {1, targets, their seqs}, or {0, roster, {}} when the caller's roster is out of date
#: (nothing done).
BROADCAST = Script(
    "broadcast",
    """#!lua
"""
    + _EPOCH
    + """
local roster = redis.call('LRANGE', KEYS[3], 0, -1)
if table.concat(roster, ',') ~= ARGV[5] then return {0, roster, {}} end
local targets, seqs = {}, {}
for _, name in ipairs(roster) do
  if name ~= ARGV[3] then targets[#targets + 1] = name end
end
for i, name in ipairs(targets) do
  local seq = tonumber(redis.call('HGET', KEYS[2], name))
  local top = redis.call('XREVRANGE', KEYS[3 + i], '+', '-', 'COUNT', 1)[1]
  if top then
    local ms, n = string.match(top[1], '^(%d+)-(%d+)$')
    if ms ~= '0' or tonumber(n) > seq then
      return redis.error_reply('TEAMRT_FOREIGN ' .. name)
    end
  end
  seqs[i] = seq
end
local mid = ',"team":"' .. ARGV[2] .. '",' .. ARGV[4]
for i, name in ipairs(targets) do
  local seq = seqs[i]
  redis.call('XADD', KEYS[3 + i], string.format('0-%d', seq + 1), 'd',
             string.format('{"seq":%d', seq) .. mid)
  redis.call('HSET', KEYS[2], name, string.format('%d', seq + 1))
end
return {1, targets, seqs}
""",
)

#: Take a member's lease if nobody holds it: a new fencing token from HINCRBY.
#: KEYS: meta, next, fences, ran, lease. ARGV: epoch, name, holder, ttl in ms.
#: Returns {1, fence}, or {0, "<fence> <holder>", pttl} when somebody holds it.
LOCK = Script(
    "lock",
    """#!lua
"""
    + _EPOCH
    + """
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 0 then return redis.error_reply('TEAMRT_UNKNOWN') end
local current = redis.call('GET', KEYS[5])
if current then return {0, current, redis.call('PTTL', KEYS[5])} end
local fence = redis.call('HINCRBY', KEYS[3], ARGV[2], 1)
redis.call('SET', KEYS[5], string.format('%d ', fence) .. ARGV[3], 'PX', ARGV[4])
redis.call('SADD', KEYS[4], ARGV[2])
return {1, fence}
""",
)

#: Extend leases held with the given fencing tokens; a lease that expired and was taken by
#: nobody since (the fence counter unchanged) is taken again.
#: KEYS: meta, fences, lease keys... ARGV: epoch, ttl in ms, then (name, fence, holder) per key.
#: Returns per lease 1 (extended), 2 (taken again) or 0 (another holder has it: lost).
RENEW = Script(
    "renew",
    """#!lua
"""
    + _EPOCH
    + """
local out = {}
for i = 3, #KEYS do
  local j = 3 + (i - 3) * 3
  local name, fence, holder = ARGV[j], ARGV[j + 1], ARGV[j + 2]
  local prefix = fence .. ' '
  local value = redis.call('GET', KEYS[i])
  if value and string.sub(value, 1, #prefix) == prefix then
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
    out[#out + 1] = 1
  elseif not value and redis.call('HGET', KEYS[2], name) == fence then
    redis.call('SET', KEYS[i], prefix .. holder, 'PX', ARGV[2])
    out[#out + 1] = 2
  else
    out[#out + 1] = 0
  end
end
return out
""",
)

#: Rewrite the holder's description of a lease this fence holds. KEYS: lease. ARGV: fence, holder.
#: Returns 1 (done), 0 (no lease: it expired) or -1 (another holder has it).
DESCRIBE = Script(
    "describe",
    """#!lua
local prefix = ARGV[1] .. ' '
local value = redis.call('GET', KEYS[1])
if not value then return 0 end
if string.sub(value, 1, #prefix) == prefix then
  redis.call('SET', KEYS[1], prefix .. ARGV[2], 'KEEPTTL')
  return 1
end
return -1
""",
)

#: Release a lease if this fence still holds it. KEYS: lease. ARGV: fence.
UNLOCK = Script(
    "unlock",
    """#!lua
local prefix = ARGV[1] .. ' '
local value = redis.call('GET', KEYS[1])
if value and string.sub(value, 1, #prefix) == prefix then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
""",
)

#: Commit a cursor if the lease is held with this fence, or expired (or was released) and taken
#: by nobody since: then a holder (ttl > 0) takes it again, and a store object that released it
#: (ttl 0: its last acks flushed on close) commits without taking it. KEYS: meta, fences,
#: lease, cursor. ARGV: epoch, name, fence, holder, ttl in ms, cursor JSON. Returns the
#: cursor's generation.
COMMIT = Script(
    "commit",
    """#!lua
"""
    + _EPOCH
    + """
local prefix = ARGV[3] .. ' '
local value = redis.call('GET', KEYS[3])
if value then
  if string.sub(value, 1, #prefix) ~= prefix then
    return redis.error_reply('TEAMRT_LEASE ' .. value)
  end
elseif redis.call('HGET', KEYS[2], ARGV[2]) == ARGV[3] then
  if ARGV[5] ~= '0' then redis.call('SET', KEYS[3], prefix .. ARGV[4], 'PX', ARGV[5]) end
else
  return redis.error_reply('TEAMRT_LEASE -')
end
local gen = redis.call('HINCRBY', KEYS[4], 'gen', 1)
redis.call('HSET', KEYS[4], 'c', ARGV[6], 'fence', ARGV[3])
return gen
""",
)

#: Add a quarantine record once per record. KEYS: meta, qupto, the quarantine list.
#: ARGV: epoch, name, seq of the record, the quarantine record as JSON. Returns 1 if added.
QUARANTINE = Script(
    "quarantine",
    """#!lua
"""
    + _EPOCH
    + """
local upto = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '-1')
if tonumber(ARGV[3]) <= upto then return 0 end
redis.call('RPUSH', KEYS[3], ARGV[4])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
return 1
""",
)

#: Replace the budget ledger if its version is still the one read. KEYS: meta, ledger.
#: ARGV: epoch, the version read ('0' for none), the new ledger as JSON. Returns 1 if replaced.
LEDGER = Script(
    "ledger",
    """#!lua
"""
    + _EPOCH
    + """
local version = redis.call('HGET', KEYS[2], 'v') or '0'
if version ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[2], 'v', string.format('%d', tonumber(version) + 1), 'd', ARGV[3])
return 1
""",
)

#: Delete a team unless a member runs. KEYS: meta, members, next, fences, ran, qupto, ledger,
#: then per member of the roster the caller read: inbox, cursor, quarantine, lease.
#: ARGV: that roster (names joined by ','). Returns {1}, {0, roster} when the roster changed
#: meanwhile, or {2, name, lease} when a member runs (nothing deleted).
DESTROY = Script(
    "destroy",
    """#!lua
local roster = redis.call('LRANGE', KEYS[2], 0, -1)
if table.concat(roster, ',') ~= ARGV[1] then return {0, roster} end
for i, name in ipairs(roster) do
  local lease = redis.call('GET', KEYS[7 + 4 * i])
  if lease then return {2, name, lease} end
end
for i = 1, #KEYS do redis.call('UNLINK', KEYS[i]) end
return {1}
""",
)

#: Wake a process's watcher: an entry in its control stream. KEYS: ctl. ARGV: ttl in ms.
KICK = Script(
    "kick",
    """#!lua
redis.call('XADD', KEYS[1], 'MAXLEN', '1', '*', 'k', '1')
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
""",
)

#: Append one raw line as the next record of an inbox, as another program could (tests of
#: corrupt input, and imports). KEYS: next, the inbox stream. ARGV: name, line. Returns its seq.
RAW_APPEND = Script(
    "raw_append",
    """#!lua
local seq = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
redis.call('XADD', KEYS[2], string.format('0-%d', seq + 1), 'd', ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', seq + 1))
return seq
""",
)
