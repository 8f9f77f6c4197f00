"""Replay in `teamrt bench`: throughput over a large team directory, and peak memory at two sizes
that both fill replay's bounded windows of recent ids."""

from __future__ import annotations

import shutil
import tracemalloc

from teamrt.bench.backlog import write_segments
from teamrt.bench.harness import MEMBERS, Bench
from teamrt.bench.stats import Figure, Tally, clock
from teamrt.mail import FileMailboxes
from teamrt.mail.filestore import DEFAULT_SEGMENT_BYTES
from teamrt.replay import timeline
from teamrt.replay.events import WINDOW


async def replay(bench: Bench) -> None:
    """Replay throughput at the large size, every round, and peak memory at two sizes that
    both fill replay's bounded windows of recent ids (so that flat means flat)."""
    s = bench.sizes
    small, large = s.replay_small, s.replay_large
    teams = {}
    for depth in (small, large):
        team = teams[depth] = bench.team(f"replay{depth}")
        async with FileMailboxes(team, members=MEMBERS):
            pass
        for name in MEMBERS:  # three inboxes, merged by time
            write_segments(team, name, depth // 3, DEFAULT_SEGMENT_BYTES, 0)
    t = Tally()
    for _ in bench.each_round():
        with clock() as c:
            count = sum(1 for _ in timeline(teams[large]))
        t.rate("replay", count, c)
    peaks = {}
    for depth, team in teams.items():
        tracemalloc.start()
        for _ in timeline(team):
            pass
        peaks[depth] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        shutil.rmtree(team)
    bench.add(
        t.figure(
            f"replay {large:,} envelopes (timeline, pairing, flags)",
            *("replay", "/s"),
            target=">= 400,000/s of CPU",
            check=lambda f: f.cpu_rate >= 400_000,
        )
    )
    full = small // len(MEMBERS) > WINDOW  # each inbox's window of recent ids is full
    bench.add(
        Figure.of(
            f"replay peak memory at {large:,} envelopes",
            [peaks[large]],
            "MiB",
            f"same at {small:,}",
            [peaks[small]],
            target="flat (within 1.5x + 1 MiB)" if full else "(windows not full: no verdict)",
            check=(lambda f: f.value <= 1.5 * (f.baseline_value or 0) + 1) if full else None,
        )
    )
