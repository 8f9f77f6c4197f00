"""Redis Cluster: which node serves a team, read from the cluster's own answers.

A team's keys share one hash slot (the `{team}` hash tag), so a team is served by one node at a
time, the master that owns its slot, and the store talks to that node only, with the same
connections and the same error mapping as to a single server. Nothing needs saying in the
locator: any node's URL works. The client asks the node it reaches first for the slot map
(`CLUSTER SLOTS`, one round trip per store; a server without cluster support refuses it and
is a single server from then on); a `MOVED` reply (the slot moved, e.g. a replica took over)
points it at the new owner; a node that cannot be reached sends it asking the other nodes it
knows who owns the slot now.

A `MOVED` reply means the command was not run, so a request refused whole that way is sent
again to the new owner at once. A pipeline refused only in part (the node stepped down in the
middle of it) is reported like a lost answer, for the layer above to retry with the same bytes.
"""

from __future__ import annotations

from typing import Any

from redis.crc import key_slot
from redis.exceptions import AskError, ClusterDownError, MovedError, TryAgainError

Address = tuple[str, int]

#: Error replies of a cluster that is moving a slot or electing a master: nothing was run, and
#: the same request can be sent again soon. UNBLOCKED: a blocking read on a node that stepped
#: down.
TRANSIENT = ("ASK ", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "UNBLOCKED")


def team_slot(key: str) -> int:
    """The hash slot of a team's keys (any of them: they share the `{team}` tag)."""
    return int(key_slot(key.encode()))


def moved_to(reply: object) -> Address | None:
    """The new owner named by a `MOVED <slot> <host>:<port>` error reply, else None."""
    if isinstance(reply, MovedError):  # a parser that knows cluster replies ate the word
        return reply.host, int(reply.port)
    if not isinstance(reply, Exception):
        return None
    words = str(reply).split()
    if len(words) != 3 or words[0] != "MOVED":
        return None
    host, _, port = words[2].rpartition(":")
    if not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def transient(reply: object) -> bool:
    """True for an error reply of a cluster in the middle of a change (see `TRANSIENT`)."""
    if isinstance(reply, (AskError, ClusterDownError, TryAgainError)):  # MovedError too
        return not isinstance(reply, MovedError)
    return isinstance(reply, Exception) and str(reply).startswith(TRANSIENT)


def _address(node: Any, asked: Address) -> Address:
    host = node[0].decode() if isinstance(node[0], bytes) else str(node[0])
    return (host or asked[0]), int(node[1])  # an empty host: the node that was asked


def read_slots(reply: Any, slot: int, asked: Address) -> tuple[Address | None, list[Address]]:
    """From a `CLUSTER SLOTS` reply (asked of `asked`): the master owning `slot` (None if no
    node serves it) and every node named."""
    owner = None
    nodes: list[Address] = []
    for start, end, *members in reply:
        addresses = [_address(member, asked) for member in members]
        nodes += [address for address in addresses if address not in nodes]
        if int(start) <= slot <= int(end) and addresses:
            owner = addresses[0]
    return owner, nodes
