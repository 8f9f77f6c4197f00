"""The sans-IO log core: encoding, torn-tail-aware decoding, cursor arithmetic."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from teamrt.envelopes import Envelope
from teamrt.mail.filestore.framing import (
    LineDecoder,
    LineSplitter,
    decode_all,
    decode_slots,
    encode_slot,
)
from teamrt.mail.log import (
    AckTracker,
    Corrupt,
    Cursor,
    Record,
    decode_line,
    encode,
    stamp,
    stamp_many,
)
from tests.support.hypothesis_profiles import examples

TEAM = b"team"


def _line(i: int, body: object = None) -> bytes:
    envelope = Envelope.message("lead", "worker", {"i": i} if body is None else body)
    return stamp(encode(envelope), i, TEAM)


STREAM = b"".join(_line(i) for i in range(8)) + b"garbage\n" + _line(8) + _line(9)[:30]


def _summary(items: list[Record | Corrupt]) -> list[tuple[str, int, int]]:
    return [(("r" if isinstance(x, Record) else "c"), x.at[1], x.end[1]) for x in items]


def test_stamp_puts_seq_and_team_first() -> None:
    line = _line(3)
    assert line.startswith(b'{"seq":3,"team":"team","v":1,')
    assert line.endswith(b"}\n") and line.count(b"\n") == 1
    decoded = decode_line(line[:-1])
    assert isinstance(decoded, Envelope)
    assert (decoded.seq, decoded.team, decoded.body) == (3, "team", {"i": 3})


def test_whole_stream() -> None:
    items, pending = decode_all(STREAM)
    kinds = [type(x).__name__ for x in items]
    assert kinds == ["Record"] * 8 + ["Corrupt", "Record"]
    assert pending == 30
    corrupt = items[8]
    assert isinstance(corrupt, Corrupt)
    assert corrupt.raw == b"garbage" and corrupt.reason.startswith("json:")
    assert STREAM[corrupt.at[1] : corrupt.end[1]] == b"garbage\n"


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_split_decodes_the_same(cuts: list[int]) -> None:
    expected, _ = decode_all(STREAM)
    decoder = LineDecoder()
    got: list[Record | Corrupt] = []
    previous = 0
    for cut in [*sorted(cuts), len(STREAM)]:
        got += decoder.feed(STREAM[previous:cut])
        previous = cut
    assert _summary(got) == _summary(expected)
    assert decoder.pending == 30
    assert decoder.position == len(STREAM) - 30


@settings(max_examples=examples(300))
@given(st.binary(max_size=2000), st.integers(min_value=1, max_value=64))
def test_random_bytes_never_raise(data: bytes, max_line: int) -> None:
    decoder = LineDecoder(max_line=max_line)
    items = decoder.feed(data) + decoder.feed(b"\n")
    for item in items:
        assert item.at[1] < item.end[1] <= len(data) + 1
        if isinstance(item, Corrupt):
            assert len(item.raw) <= max_line and item.reason


@given(st.integers(min_value=0, max_value=len(STREAM)), st.binary(max_size=200))
def test_truncation_plus_garbage_keeps_every_whole_line_before_it(cut: int, junk: bytes) -> None:
    """A log cut anywhere (a crash) then written on: all records fully before the cut survive."""
    expected = [x for x in decode_all(STREAM)[0] if isinstance(x, Record) and x.end[1] <= cut]
    items, _ = decode_all(STREAM[:cut] + b"\n" + junk)
    got = [x for x in items if isinstance(x, Record) and x.end[1] <= cut]
    assert [r.envelope.id for r in got] == [r.envelope.id for r in expected]


def test_overlong_line_is_reported_once_with_bounded_memory() -> None:
    decoder = LineDecoder(max_line=300)
    items = decoder.feed(b"x" * 280)
    items += decoder.feed(b"y" * 300)
    assert decoder.pending == 0  # not holding the long line
    items += decoder.feed(b"z\n" + _line(1))
    assert [type(x).__name__ for x in items] == ["Corrupt", "Record"]
    first = items[0]
    assert isinstance(first, Corrupt)
    assert (first.at, first.end, len(first.raw)) == ((0, 0), (0, 582), 300)
    assert "longer than 300 bytes" in first.reason


def test_decode_line_reasons() -> None:
    assert decode_line(b"{nope").startswith("json:")  # type: ignore[union-attr]
    assert decode_line(b'{"seq":1,"kind":"telegram"}').startswith("schema:")  # type: ignore[union-attr]
    no_seq = b"{" + encode(Envelope.message("lead", "worker", 1))
    assert decode_line(no_seq) == "schema: seq: field required"
    bad_name = _line(1).replace(b'"worker"', b'"../etc"')[:-1]
    reason = decode_line(bad_name)
    assert isinstance(reason, str)
    assert "recipient" in reason
    # a kind that the fast path guesses wrong still decodes through the union
    reordered = b'{"kind":"request","seq":1,"sender":"a","recipient":"b","id":"x"}'
    assert isinstance(decode_line(reordered), Envelope)


def test_ack_tracker_commits_only_the_handled_prefix() -> None:
    tracker = AckTracker(Cursor())
    for i, end in enumerate((10, 20, 30, 40)):
        assert tracker.deliver(f"id{i}", 0, end, i)
    tracker.skipped((0, 50))  # a corrupt line
    assert tracker.deliver("id5", 0, 60, 5)
    assert tracker.ack("id1")
    cursor = tracker.cursor()
    assert (cursor.offset, cursor.seq, cursor.ahead) == (0, -1, ((0, 10, 0, 20), (0, 40, 0, 50)))
    tracker.ack("id0")
    tracker.ack("id3")
    cursor = tracker.cursor()  # id3 and the corrupt line after it form one handled run
    assert (cursor.offset, cursor.seq, cursor.ahead) == (20, 1, ((0, 30, 0, 50),))
    tracker.ack("id2")
    cursor = tracker.cursor()
    assert (cursor.offset, cursor.seq, cursor.ahead) == (50, 3, ())
    assert not tracker.ack("id2")  # twice is harmless
    assert not tracker.deliver("id2", 0, 70, 6)  # handled already: a duplicate
    assert tracker.deliver("id9", 0, 80, 7)
    assert tracker.unacked == 2


def test_ack_tracker_resumes_from_cursor() -> None:
    cursor = Cursor(0, 20, 1, acked=("id3",), recent=("id0", "id1", "id3"))
    round_trip = Cursor.from_json_dict(cursor.to_json_dict())
    assert round_trip == cursor
    tracker = AckTracker(round_trip)
    assert tracker.deliver("id2", 0, 30, 2)
    assert not tracker.deliver("id3", 0, 40, 3)  # acked before the restart
    assert not tracker.deliver("id0", 0, 50, 4)  # handled recently
    tracker.ack("id2")
    assert tracker.cursor() == Cursor(0, 50, 4, (), ("id0", "id1", "id3", "id2"))


def test_cursor_slots_survive_a_torn_write() -> None:
    old = Cursor(0, 100, 3, (), ("a", "b"))
    new = Cursor(0, 200, 5, ("z",), ("a", "b", "c"))
    slot_old, slot_new = encode_slot(old, 7, 4096), encode_slot(new, 8, 4096)
    assert slot_old is not None and slot_new is not None
    assert len(slot_old) == 4096 and slot_old.endswith(b"\n")
    assert decode_slots(slot_new + slot_old) == (new, 8)  # newest generation wins
    torn = slot_new[:50] + slot_old[50:]  # a crash mid-write mixes old and new bytes
    assert decode_slots(torn + slot_old) == (old, 7)
    assert decode_slots(b"garbage\n" + torn) is None
    too_big = Cursor(0, 0, -1, tuple(f"{i:030d}" for i in range(200)))
    assert encode_slot(too_big, 1, 4096) is None
    assert encode_slot(too_big, 1, 16384) is not None


@given(
    st.lists(st.binary(max_size=20).map(lambda b: b.replace(b"\n", b" ")), max_size=6),
    st.integers(min_value=0, max_value=2**40),
)
def test_stamp_many_writes_the_lines_stamp_writes(items: list[bytes], first: int) -> None:
    expected = b"".join(stamp(item, first + i, b"team-1") for i, item in enumerate(items))
    assert stamp_many(items, first, b"team-1") == expected


_lines = st.lists(
    st.one_of(
        st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
        st.sampled_from([b"", b" ", b"\t \r", b"x", b"{}", b"a" * 63, b"a" * 64, b"a" * 65]),
    ),
    max_size=12,
)


@settings(max_examples=examples(300))
@given(_lines, st.integers(min_value=0, max_value=3))
def test_a_line_at_a_time_frames_as_the_whole_stream_does(lines: list[bytes], held: int) -> None:
    """Feeding one whole line per call (the wake-up's fast path) frames exactly what feeding
    the same bytes at once does: blank, whitespace and over-long lines included, after a
    partial line held from before or not."""
    head = b"x" * held  # a partial line fed first, then completed by the first piece
    one, each = LineSplitter(max_line=64), LineSplitter(max_line=64)
    whole = head + b"".join(line + b"\n" for line in lines)
    expected = one.feed(whole)
    got = each.feed(head)
    for line in lines:
        got += each.feed(line + b"\n")
    assert [(e.raw, e.at, e.end, e.too_long) for e in got] == [
        (e.raw, e.at, e.end, e.too_long) for e in expected
    ]
    assert (each.offset, each.position, each.pending) == (one.offset, one.position, one.pending)
