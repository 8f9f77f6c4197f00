"""The inbox log format, with no I/O: encoding and torn-tail-aware decoding.

Theory of operation. An inbox is a sequence of JSON lines. A sender encodes an envelope once,
outside any lock, without `seq` and `team`; under the inbox lock the store splices those two in
front (`stamp`) and appends the line. A reader feeds whatever bytes it read to a `LineDecoder`,
which yields one item per complete line, a decoded `Record` or a `Corrupt` line with its offset and
reason, and keeps an unterminated tail for the next feed, because a tail without its newline may be
a write still in progress. What the owner has handled (`Cursor`, `AckTracker`) is in cursor.py,
re-exported here.

Nothing here may touch a file, a lock or the event loop; everything is tested in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import ValidationError

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
    data: bytes = type(envelope).__pydantic_serializer__.to_json(envelope)
    # seq and team are the first two fields and can hold no '"v":' (an int and a safe name),
    # so slicing is exact, and cheaper than asking the serializer to exclude them
    return data[data.index(b'"v":') :]


def stamp(encoded: bytes, seq: int, team: bytes) -> bytes:
    """One complete log line: `encoded` with `seq` and `team` in front, newline-terminated.

    `team` must be a validated name (no characters that need JSON escaping).
    """
    return b'{"seq":%d,"team":"%b",%b\n' % (seq, team, encoded)


def stamp_many(encoded: Sequence[bytes], first_seq: int, team: bytes) -> bytes:
    """Consecutive stamped lines for a batch, as one buffer for one write."""
    return b"".join(
        [
            b'{"seq":%d,"team":"%b",%b\n' % (first_seq + i, team, item)
            for i, item in enumerate(encoded)
        ]
    )


# --- decoding ---------------------------------------------------------------------------------


class Record:
    """A decoded envelope and the byte range of its line.

    A plain slotted class, not a frozen dataclass: one is made per envelope read, and a frozen
    dataclass costs several times more to construct.
    """

    __slots__ = ("end", "envelope", "offset")

    def __init__(self, envelope: Envelope, offset: int, end: int) -> None:
        self.envelope = envelope
        self.offset = offset
        self.end = end

    def __repr__(self) -> str:
        return f"Record({self.envelope!r}, {self.offset}, {self.end})"


@dataclass(frozen=True, slots=True)
class Corrupt:
    """A complete line that could not be decoded. It is quarantined, never delivered."""

    offset: int
    end: int
    reason: str
    raw: bytes


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
                return _reason(exc2)
        else:
            return _reason(exc)
    if envelope.seq is None:
        return "schema: seq: field required"
    registered = payload_model(envelope.type)
    if registered is not None:
        try:
            registered.model_validate(envelope.body)
        except ValidationError as exc:
            return "payload: " + _reason(exc).partition(": ")[2]
    return envelope


def _reason(exc: ValidationError) -> str:
    first = exc.errors(include_url=False)[0]
    if first["type"] == "json_invalid":
        return f"json: {first['msg']}"
    where = ".".join(str(part) for part in first["loc"]) or "envelope"
    return f"schema: {where}: {first['msg']}"


#: One complete line: (offset, end, raw bytes without the newline, too_long).
Frame = tuple[int, int, bytes, bool]


class LineSplitter:
    """Frames a byte stream that starts at `offset` into complete lines, without decoding them.

    `feed()` accepts any split of the stream and returns the same frames as feeding it whole. A
    tail without its newline is held back (it may be a write in progress); at most `max_line`
    bytes of a line are ever held, and a longer line comes out once, marked `too_long`. Blank
    lines are skipped.
    """

    __slots__ = ("_kept", "_max_line", "_skip_start", "_skipping", "_tail", "offset")

    def __init__(self, offset: int = 0, *, max_line: int = DEFAULT_MAX_LINE) -> None:
        self.offset = offset  # stream offset of the first byte not yet fed
        self._max_line = max_line
        self._tail = b""
        self._skipping = False  # inside an over-long line: keep only its first bytes
        self._skip_start = 0
        self._kept = b""

    @property
    def pending(self) -> int:
        """Bytes held back because their line has no newline yet."""
        return len(self._tail)

    @property
    def position(self) -> int:
        """Offset just after the last complete line seen."""
        return self._skip_start if self._skipping else self.offset - len(self._tail)

    def feed(self, data: bytes) -> list[Frame]:
        frames: list[Frame] = []
        if not data:
            return frames
        base = self.offset - len(self._tail)
        self.offset += len(data)
        buf = self._tail + data if self._tail else data
        last_nl = buf.rfind(b"\n")
        if last_nl < 0:
            self._hold(buf, base)
            return frames
        pos = 0
        if self._skipping:  # the rest of an over-long line: report it once, with what we kept
            nl = buf.find(b"\n")
            frames.append((self._skip_start, base + nl + 1, self._kept, True))
            self._skipping = False
            pos = nl + 1
            self._tail = b""
        max_line = self._max_line
        for line in buf[pos:last_nl].split(b"\n") if pos <= last_nl else ():
            end = pos + len(line) + 1
            if len(line) > max_line:
                frames.append((base + pos, base + end, line[:max_line], True))
            elif line and not line.isspace():
                frames.append((base + pos, base + end, line, False))
            pos = end
        self._hold(buf[last_nl + 1 :], base + last_nl + 1)
        return frames

    def flush(self) -> Frame | None:
        """The held tail as a frame, for a stream that is known to be finished."""
        if self._skipping:
            self._skipping = False
            return (self._skip_start, self.offset, self._kept, True)
        if not self._tail:
            return None
        frame = (self.offset - len(self._tail), self.offset, self._tail, False)
        self._tail = b""
        return frame

    def _hold(self, rest: bytes, rest_offset: int) -> None:
        if self._skipping:
            return
        if len(rest) > self._max_line:
            self._skipping = True
            self._skip_start = rest_offset
            self._kept = rest[: self._max_line]
            self._tail = b""
        else:
            self._tail = rest


def decode_frame(frame: Frame, max_line: int = DEFAULT_MAX_LINE) -> Record | Corrupt:
    """Decode one framed line into a `Record`, or a `Corrupt` saying why it is unusable."""
    offset, end, raw, too_long = frame
    if too_long:
        return Corrupt(offset, end, f"line longer than {max_line} bytes", raw)
    decoded = decode_line(raw)
    if isinstance(decoded, str):
        return Corrupt(offset, end, decoded, raw)
    return Record(decoded, offset, end)


class LineDecoder(LineSplitter):
    """A `LineSplitter` that decodes every line it frames (for tools that read whole logs)."""

    __slots__ = ()

    def feed(self, data: bytes) -> list[Record | Corrupt]:  # type: ignore[override]
        max_line = self._max_line
        return [decode_frame(frame, max_line) for frame in super().feed(data)]


def decode_all(
    data: bytes, *, max_line: int = DEFAULT_MAX_LINE
) -> tuple[list[Record | Corrupt], int]:
    """Decode a whole buffer; returns the items and the number of trailing unterminated bytes."""
    decoder = LineDecoder(max_line=max_line)
    items = decoder.feed(data)
    return items, decoder.offset - decoder.position


__all__ = [
    "DEFAULT_MAX_LINE",
    "MAX_PERSISTED_RUNS",
    "RECENT_IDS_PERSISTED",
    "AckTracker",
    "Corrupt",
    "Cursor",
    "Frame",
    "LineDecoder",
    "LineSplitter",
    "Position",
    "Range",
    "Record",
    "decode_all",
    "decode_frame",
    "decode_line",
    "encode",
    "stamp",
    "stamp_many",
]
