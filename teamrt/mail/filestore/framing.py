"""How the file store frames its logs and encodes its cursor file, with no I/O.

An inbox file is a stream of newline-terminated JSON lines. `LineSplitter` frames whatever bytes
were read into complete lines and holds an unterminated tail back, because a tail without its
newline may be a write still in progress; the reader turns frames into store-neutral `Entry`
records whose positions are `(segment, byte offset)`. The cursor file holds two CRC-checked slots
of one page each (`encode_slot`, `decode_slots`): a commit overwrites the older slot, and a slot
torn by a crash fails its CRC so the other one is used. The inbox's lock file holds the inbox's
high-water mark: the highest `seq` handed out and where the log ended after it, as one
fixed-width line (`encode_high_water`).
"""

from __future__ import annotations

import json
import zlib
from typing import NamedTuple

from teamrt.mail.log import (
    DEFAULT_MAX_LINE,
    Corrupt,
    Cursor,
    Entry,
    Record,
    decode_entry,
)

__all__ = [
    "HIGH_WATER_SIZE",
    "HighWater",
    "LineDecoder",
    "LineSplitter",
    "decode_all",
    "decode_high_water",
    "decode_slots",
    "encode_high_water",
    "encode_slot",
]


class LineSplitter:
    """Frames a byte stream of segment `segment` that starts at `offset` into complete lines,
    without decoding them: one `Entry` per line, at `(segment, offset)` positions.

    `feed()` accepts any split of the stream and returns the same entries as feeding it whole.
    A tail without its newline is held back (it may be a write in progress); at most `max_line`
    bytes of a line are ever held, and a longer line comes out once, marked `too_long`. Blank
    lines are skipped.
    """

    __slots__ = ("_kept", "_max_line", "_skip_start", "_skipping", "_tail", "offset", "segment")

    def __init__(
        self, offset: int = 0, *, max_line: int = DEFAULT_MAX_LINE, segment: int = 0
    ) -> None:
        self.segment = segment
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

    def feed(self, data: bytes) -> list[Entry]:
        size = len(data)
        if (  # one whole line and nothing held: what a wake-up usually reads
            data.find(b"\n") == size - 1
            and not self._tail
            and not self._skipping
            and 1 < size <= self._max_line + 1
            and not data.isspace()
        ):
            base = self.offset
            self.offset = base + size
            return [Entry(data[:-1], self.segment, base, base + size)]
        frames: list[Entry] = []
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
        seg = self.segment
        if self._skipping:  # the rest of an over-long line: report it once, with what we kept
            nl = buf.find(b"\n")
            frames.append(Entry(self._kept, seg, self._skip_start, base + nl + 1, True))
            self._skipping = False
            pos = nl + 1
            self._tail = b""
        max_line = self._max_line
        append = frames.append
        for line in buf[pos:last_nl].split(b"\n") if pos <= last_nl else ():
            end = pos + len(line) + 1
            if len(line) > max_line:
                append(Entry(line[:max_line], seg, base + pos, base + end, True))
            elif line and not line.isspace():
                append(Entry(line, seg, base + pos, base + end))
            pos = end
        self._hold(buf[last_nl + 1 :], base + last_nl + 1)
        return frames

    def flush(self) -> Entry | None:
        """The held tail as an entry, for a stream that is known to be finished."""
        seg = self.segment
        if self._skipping:
            self._skipping = False
            return Entry(self._kept, seg, self._skip_start, self.offset, True)
        if not self._tail:
            return None
        entry = Entry(self._tail, seg, self.offset - len(self._tail), self.offset)
        self._tail = b""
        return entry

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


class LineDecoder(LineSplitter):
    """A `LineSplitter` that decodes every line it frames (for tools that read whole logs)."""

    __slots__ = ()

    def feed(self, data: bytes) -> list[Record | Corrupt]:  # type: ignore[override]
        max_line = self._max_line
        return [decode_entry(entry, max_line) for entry in super().feed(data)]


def decode_all(
    data: bytes, *, max_line: int = DEFAULT_MAX_LINE
) -> tuple[list[Record | Corrupt], int]:
    """Decode a whole buffer; returns the items and the number of trailing unterminated bytes."""
    decoder = LineDecoder(max_line=max_line)
    items = decoder.feed(data)
    return items, decoder.offset - decoder.position


# --- the cursor file ---------------------------------------------------------------------------


def encode_slot(cursor: Cursor, gen: int, size: int) -> bytes | None:
    """This cursor as one slot of the cursor file: JSON with generation and CRC, padded
    with spaces to `size` bytes including the final newline. None if it does not fit."""
    fields = {"gen": gen, **cursor.to_json_dict()}
    body = json.dumps(fields, separators=(",", ":"))[:-1].encode()
    line = b'%b,"crc":"%08x"}' % (body, zlib.crc32(body))
    if len(line) >= size:
        return None
    return line.ljust(size - 1) + b"\n"


def decode_slots(data: bytes) -> tuple[Cursor, int] | None:
    """The newest valid slot of a cursor file (cursor, generation), or None if none is.

    A slot whose CRC does not match (a write torn by a crash) is ignored: the other slot
    still holds the previous cursor.
    """
    best: tuple[Cursor, int] | None = None
    for raw in data.split(b"\n"):
        line = raw.strip()
        mark = line.rfind(b',"crc":"')
        if mark < 0 or line[mark + 8 : mark + 16] != b"%08x" % zlib.crc32(line[:mark]):
            continue
        try:
            fields = json.loads(line)
            cursor, gen = Cursor.from_json_dict(fields), int(fields["gen"])
        except (ValueError, KeyError, TypeError):
            continue
        if best is None or gen > best[1]:
            best = (cursor, gen)
    return best


# --- the high-water mark -----------------------------------------------------------------------


class HighWater(NamedTuple):
    """An inbox's high-water mark: `seq`, the highest seq handed out, and where the log ended
    just after the line that holds it (`segment`, byte `offset`)."""

    seq: int
    segment: int
    offset: int


#: The mark's record: three fields of 20 digits (any value below 2**63), right-aligned and
#: separated by spaces, and a newline. Fixed-width, so each write overwrites the whole record.
HIGH_WATER_SIZE = 63
_HIGH_WATER_LIMIT = 1 << 63


def encode_high_water(mark: HighWater) -> bytes:
    """The mark as the record a lock file holds at its start."""
    return b"%20d %20d %20d\n" % mark


def decode_high_water(data: bytes) -> HighWater | None:
    """The mark a lock file's first bytes hold, or None if they hold none (an empty file, as
    teams written before the mark have, or bytes that are not a mark: then the log decides)."""
    if len(data) < HIGH_WATER_SIZE or data[HIGH_WATER_SIZE - 1] != 10:  # 10: a newline
        return None
    fields = data[: HIGH_WATER_SIZE - 1].split()
    if len(fields) != 3 or not all(f.isascii() and f.isdigit() for f in fields):
        return None
    seq, segment, offset = (int(f) for f in fields)
    if max(seq, segment, offset) >= _HIGH_WATER_LIMIT:
        return None
    return HighWater(seq, segment, offset)
