"""The inbox record format, with no I/O: encoding, stamping and decoding one record.

Theory of operation. An inbox is a sequence of records, each one JSON line. A sender encodes an
envelope once, outside any lock, without `seq` and `team`; the store splices those two in front
(`stamp`) when it appends, under its lock or in its server-side script, so every store holds the
same bytes. A store hands its readers whole records (`Entry`: the line and its opaque positions);
how a store frames them (the file store's torn-tail-aware line splitter) stays inside it. Decoding
a record gives a `Record` or a `Corrupt` with its reason. What the owner has handled (`Cursor`,
`AckTracker`) is in cursor.py, re-exported here.

Nothing here may touch a file, a lock or the event loop; everything is tested in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
from pydantic import ValidationError

from teamrt.codec import REPEATED_KEY, body_refusal, is_claim, reason, repeats_a_key
from teamrt.codec import encode as codec_encode
from teamrt.envelopes import (
    ENVELOPE_ADAPTER,
    Broadcast,
    Envelope,
    Message,
    Request,
    Response,
    payload_model,
)

# the cursor arithmetic lives in cursor.py; its names stay importable from here
from teamrt.mail.cursor import (
    MAX_PERSISTED_RUNS,
    RECENT_IDS_PERSISTED,
    AckTracker,
    Cursor,
    Position,
    Range,
)

#: Lines longer than this are quarantined unread (the whole line, up to this many bytes, is kept).
DEFAULT_MAX_LINE = 1 << 20

# the schema validators themselves: BaseModel.model_validate_json adds ~1 us of Python per call
_VALIDATOR_BY_KIND = {
    b"mess": Message.__pydantic_validator__,
    b"requ": Request.__pydantic_validator__,
    b"resp": Response.__pydantic_validator__,
    b"broa": Broadcast.__pydantic_validator__,
}


# --- encoding ---------------------------------------------------------------------------------


def encode(envelope: Envelope) -> bytes:
    """The envelope's fields after `seq` and `team` (which `stamp` fills in), as compact JSON
    without the opening brace and without a newline."""
    return codec_encode(envelope)


def stamp(encoded: bytes, seq: int, team: bytes) -> bytes:
    """One complete log line: `encoded` with `seq` and `team` in front, newline-terminated.

    `team` must be a validated name (no characters that need JSON escaping).
    """
    return b'{"seq":%d,"team":"%b",%b\n' % (seq, team, encoded)


def stamp_many(encoded: Sequence[bytes], first_seq: int, team: bytes) -> bytes:
    """Consecutive stamped lines for a batch, as one buffer for one write (each line's head
    written with the newline that ends the line before it: one format per line)."""
    if not encoded:
        return b""
    between = b'\n{"seq":%d,"team":"' + team + b'",'
    parts = [b'{"seq":%d,"team":"%b",' % (first_seq, team)]
    append = parts.append
    for seq, item in enumerate(encoded, first_seq + 1):
        append(item)
        append(between % seq)
    parts[-1] = b"\n"
    return b"".join(parts)


# --- decoding ---------------------------------------------------------------------------------


class Entry(msgspec.Struct, gc=False):
    """One record of an inbox as its store hands it out: the stamped line without its newline
    (`raw`), where it starts (`at`) and the position just after it (`end`, what a cursor that
    has passed it holds). Positions are opaque to everything above the store: two parts, the
    first shared by a record's start and end (`segment`), the second its `start` and `stop`
    (byte offsets for the file store, sequence numbers for Redis). `too_long`: the record was
    longer than the store's line limit and `raw` holds only its first bytes; it is quarantined
    unread.

    A msgspec struct holding no tuples: one is made per record read, built in C (a third of a
    plain slotted class's cost) and not tracked by the garbage collector (it holds only bytes
    and ints).
    """

    raw: bytes
    segment: int
    start: int
    stop: int
    too_long: bool = False

    @property
    def at(self) -> Position:
        return (self.segment, self.start)

    @property
    def end(self) -> Position:
        return (self.segment, self.stop)

    def __repr__(self) -> str:
        long = ", too long" if self.too_long else ""
        return f"Entry({self.raw[:60]!r}, {self.at}, {self.end}{long})"


class Record:
    """A decoded envelope and the positions of its record (for tools that read whole inboxes).

    A plain slotted class, not a frozen dataclass: one is made per envelope read, and a frozen
    dataclass costs several times more to construct.
    """

    __slots__ = ("at", "end", "envelope")

    def __init__(self, envelope: Envelope, at: Position, end: Position) -> None:
        self.envelope = envelope
        self.at = at
        self.end = end

    def __repr__(self) -> str:
        return f"Record({self.envelope!r}, {self.at}, {self.end})"


@dataclass(frozen=True, slots=True)
class Corrupt:
    """A complete record that could not be decoded or does not belong where it is. It is
    quarantined, never delivered."""

    at: Position
    end: Position
    reason: str
    raw: bytes


def decode_entry(entry: Entry, max_line: int = DEFAULT_MAX_LINE) -> Record | Corrupt:
    """Decode one entry into a `Record`, or a `Corrupt` saying why it is unusable."""
    if entry.too_long:
        return Corrupt(entry.at, entry.end, f"line longer than {max_line} bytes", entry.raw)
    decoded = decode_line(entry.raw)
    if isinstance(decoded, str):
        return Corrupt(entry.at, entry.end, decoded, entry.raw)
    return Record(decoded, entry.at, entry.end)


def decode_line(line: bytes) -> Envelope | str:
    """Decode one line (without its newline): the envelope, or the reason it is unusable."""
    start = line.find(b'"kind":"')
    validator = _VALIDATOR_BY_KIND.get(line[start + 8 : start + 12]) if start >= 0 else None
    try:
        envelope: Envelope = (
            validator.validate_json(line)
            if validator is not None
            else ENVELOPE_ADAPTER.validate_json(line)
        )
    except ValidationError as exc:
        if validator is not None:  # the fast guess may be wrong: let the union say why
            try:
                envelope = ENVELOPE_ADAPTER.validate_json(line)
            except ValidationError as exc2:
                return reason(exc2)
        else:
            return reason(exc)
    if envelope.seq is None:
        return "schema: seq: field required"
    refusal = body_refusal(envelope.body)
    if refusal is not None:
        return refusal
    registered = payload_model(envelope.type)
    if registered is not None and not is_claim(envelope.body):  # (checked once redeemed)
        try:
            registered.model_validate(envelope.body)
        except ValidationError as exc:
            return "payload: " + reason(exc).partition(": ")[2]
    if repeats_a_key(line, envelope.body):
        return REPEATED_KEY
    return envelope


__all__ = [
    "DEFAULT_MAX_LINE",
    "MAX_PERSISTED_RUNS",
    "RECENT_IDS_PERSISTED",
    "AckTracker",
    "Corrupt",
    "Cursor",
    "Entry",
    "Position",
    "Range",
    "Record",
    "decode_entry",
    "decode_line",
    "encode",
    "stamp",
    "stamp_many",
]
