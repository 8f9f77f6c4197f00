"""A backlog written straight into an inbox's files, as the file store leaves them after rotating
(closed segments, then the active file): the depth and replay groups need a million envelopes in
an inbox, which sending one by one would take minutes to build."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

from teamrt.envelopes import Envelope, new_id
from teamrt.mail.filestore.paths import InboxPaths
from teamrt.mail.log import encode, stamp


def _backlog_line(team: str) -> Callable[[int], bytes]:
    """Distinct, valid lines quickly: one template, a new id and the given seq in each."""
    envelope = Envelope.message("lead", "sink", {"i": 0, "text": "hello world"})
    template = stamp(encode(envelope), 0, team.encode())
    head, _, rest = template.partition(b'"id":"')
    _, _, tail = rest.partition(b'"')
    head = head.removeprefix(b'{"seq":0,')
    return lambda seq: b'{"seq":%d,%b"id":"%b"%b' % (seq, head, new_id().encode(), tail)


def write_segments(team: Path, name: str, depth: int, segment_bytes: int, room: int) -> int:
    """Write `depth` envelopes into `name`'s inbox as the store leaves them after rotating:
    closed segments that each reached `segment_bytes` (the last one longer, when that leaves the
    active file less than `room` bytes short of the segment size), then the active file. Returns
    how many segments were closed."""
    paths = InboxPaths(team / "inboxes", name)
    line = _backlog_line(team.name)
    size_at_0 = len(line(0)) - 1  # each line is this plus the digits of its seq
    ends: list[int] = []  # the seq after the last line of each closed segment
    size = 0
    for seq in range(depth):
        size += size_at_0 + len(str(seq))
        if size >= segment_bytes:
            ends.append(seq + 1)
            size = 0
    if size > segment_bytes - room:
        if not ends:
            raise ValueError(f"{depth:,} envelopes leave no room in segments of {segment_bytes:,}")
        # the rest would leave too little room: the last closed segment takes the rest but what
        # fills the active file to half a segment (or to `room` short of it, if that is less)
        limit, keep, seq = min(segment_bytes // 2, segment_bytes - room), 0, depth
        while seq > ends[-1] and keep + size_at_0 + len(str(seq - 1)) <= limit:
            seq -= 1
            keep += size_at_0 + len(str(seq))
        ends[-1] = seq
    files = [paths.segment(index) for index in range(len(ends))] + [paths.log]
    bounds = [0, *ends, depth]
    for path, (first, end) in zip(files, itertools.pairwise(bounds), strict=True):
        with path.open("ab") as f:
            for start in range(first, end, 10_000):
                f.write(b"".join([line(seq) for seq in range(start, min(end, start + 10_000))]))
    return len(ends)


def segment_count(team: Path, name: str) -> int:
    """How many closed segments `name`'s inbox has."""
    return InboxPaths(team / "inboxes", name).active_index()
