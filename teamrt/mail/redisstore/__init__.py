"""The Redis store: a team's inboxes as Redis Streams, for teams whose processes span hosts.

Theory of operation. One stream per inbox holds one entry per record, with the entry id
`0-<seq+1>` and the same stamped line the file store writes (so exporting a team to files is a
concatenation). Every change is one Lua script that first checks the team's random epoch:
appending (membership, seq, XADD), a batch, a broadcast to the whole server-side roster (all or
none), a cursor commit (which checks the lease's fencing token), a quarantine record (once per
record), a lease, the budget ledger. Each process runs one blocking XREAD over every inbox it
reads, on a connection of its own, and pushes what arrives into its readers' buffers; it is
restarted through a per-process control stream when that set changes. Failures are reported as
"not sent" (`StoreUnavailable`) or "maybe sent" (`OutcomeUnknown`), never blurred by retries.
All of a team's keys share one Redis Cluster hash slot, so on a cluster one master serves the
team, found through any node's URL and followed through a failover.

    keys.py      the locator (`redis://host:port/db?team=NAME`) and the key layout
    scripts.py   the Lua scripts
    client.py    connections, commands and the translation of redis-py's errors
    cluster.py   which Redis Cluster node serves a team (the slot map, MOVED replies)
    store.py     RedisStore: the team, appends, the ledger
    reader.py    the owner's reader and the tail reader; cursor commits, quarantine
    watcher.py   the one blocking XREAD per process
    leases.py    leases with a time limit and fencing tokens; liveness
    view.py      RedisView: the read-only view for tools

Needs the optional extra `teamrt[redis]` (redis-py with hiredis) and a Redis 7 server.
"""

from teamrt.mail.redisstore.keys import Locator, is_redis_locator, parse_locator
from teamrt.mail.redisstore.reader import RedisReader
from teamrt.mail.redisstore.store import RedisStore
from teamrt.mail.redisstore.view import RedisView

__all__ = [
    "Locator",
    "RedisReader",
    "RedisStore",
    "RedisView",
    "is_redis_locator",
    "parse_locator",
]
