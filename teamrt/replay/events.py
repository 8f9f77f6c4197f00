"""What a replay's timeline is made of: one `Event` per inbox line, journal line or decision."""

from __future__ import annotations

import math
from typing import Any

import msgspec

WINDOW = 10_000  # recent ids remembered per check (bounded: flat memory on huge logs)
OTHERS = "(others)"
ENVELOPE_KINDS = frozenset({"message", "request", "response", "broadcast"})
AGENT_KINDS = frozenset({"stop", "crash", "cancel"})  # lines of an agent's journal
UNTIMED = math.inf  # the time of a journal line that recorded none (older journals)


class Event(msgspec.Struct, gc=False):
    """One line of one inbox (or of an agent's journal, or one conductor decision), as the
    timeline shows it. Journal lines have kind `stop`, `crash` or `cancel`, decisions kind
    `decision`; for both, `sender` is who acted, `type` what happened, `body` the details.

    A msgspec struct: an inbox line is parsed straight into one (see `timeline`), in C. Not
    tracked by the garbage collector: an event never refers back to itself."""

    ts: float
    inbox: str
    segment: int
    offset: int
    seq: int | None
    id: str
    kind: str
    type: str
    sender: str
    recipient: str
    in_reply_to: str | None
    trace_id: str | None
    deadline: float | None
    body: Any
    raw: bytes
    flags: list[str] = msgspec.field(default_factory=list)
    latency: float | None = None  # for a response: seconds since its request was sent
    reason: str | None = None  # for an undecodable line: why

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "ts": self.ts if math.isfinite(self.ts) else None,
            "inbox": self.inbox,
            "segment": self.segment,
            "offset": self.offset,
            "seq": self.seq,
            "id": self.id,
            "kind": self.kind,
            "type": self.type,
            "sender": self.sender,
            "recipient": self.recipient,
            "in_reply_to": self.in_reply_to,
            "trace_id": self.trace_id,
            "deadline": self.deadline,
            "body": self.body,
            "flags": self.flags,
            "latency": self.latency,
            "reason": self.reason,
        }
