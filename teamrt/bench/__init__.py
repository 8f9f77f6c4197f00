"""`teamrt bench`: the mailboxes, the agent loop, teams and replay measured against raw baselines,
in one run, on one disk.

Every figure is printed beside a baseline measured in the same run (a raw locked append, a raw
fsync'd append, an asyncio.Queue ping-pong, an os.pipe ping-pong between two processes, a minimal
mailbox on raw inotify between two processes) with the ratio and the target. Each figure is the
median of several rounds in which it alternates with its baseline, shown with its range, and the
CPU-bound ones also as CPU time per operation (see stats.py).

The package, by what it measures: mailboxes.py (sends, sizes, writers, round trips, wakes, depth,
acks), agent.py (the loop's cost per step), team.py (idle teams, a service, a long-lived lead),
replay.py, models.py (the OpenAI adapter), startup.py (import time), store.py (the Redis store,
`--store`); and what they share: harness.py (the `Bench` each group is given), stats.py (rounds,
figures, the table, saved runs), baselines.py, backlog.py, children.py (the mailbox children).
The os.pipe baselines and the raw inotify floor run lean children that import no teamrt
(pipes.py, inotify.py). `measure` runs the groups; the CLI (`teamrt.cli.bench`) prints.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import anyio

from teamrt.bench import mailboxes, stats
from teamrt.bench.agent import agent_loop
from teamrt.bench.harness import Bench, ProgressLine, Sizes, close_rounds
from teamrt.bench.models import model_figures
from teamrt.bench.replay import replay
from teamrt.bench.startup import startup_figures
from teamrt.bench.stats import Figure
from teamrt.bench.team import idle_teams, team_figures

__all__ = ["GROUPS", "Bench", "BenchRun", "Figure", "ProgressLine", "Sizes", "measure"]

Group = Callable[[Bench], Awaitable[None]]

# in the order they run; `--only NAME` runs one
STEPS: dict[str, Group] = {
    "sends": mailboxes.sends,
    "sizes": mailboxes.body_sizes,
    "contention": mailboxes.contention,
    "writers": mailboxes.writers,
    "round_trips": mailboxes.round_trips,
    "wakes": mailboxes.wakes,
    "depth": mailboxes.depth,
    "agent": agent_loop,
    "team": idle_teams,
    "replay": replay,
    "acks": mailboxes.acks,
    "teamwork": team_figures,
    "models": model_figures,
    "startup": startup_figures,
}
GROUPS = tuple(STEPS)
# the groups that use the writer processes: stopped after the last of them, so that no idle
# writer process disturbs the groups after
POOLED = {"contention", "writers"}


class BenchRun(NamedTuple):
    """A finished run: its JSON (what `--save` writes), its figures, the run's facts (machine,
    sizes, load, groups) and, with `--compare`, the comparison with the saved run."""

    run: dict[str, Any]
    figures: list[Figure]
    meta: dict[str, Any]
    compared: dict[str, Any] | None


async def _run(
    root: Path,
    sizes: Sizes,
    only: str | None,
    progress: ProgressLine | None = None,
    rounds: int | None = None,
    groups: list[dict[str, Any]] | None = None,
) -> list[Figure]:
    bench = Bench(root, sizes, progress, rounds)
    async with bench.cleanup:
        await _groups(bench, only, progress, groups)
    return bench.figures


async def _groups(
    bench: Bench,
    only: str | None,
    progress: ProgressLine | None,
    groups: list[dict[str, Any]] | None,
) -> None:
    chosen = [name for name in GROUPS if only is None or name == only]
    for index, name in enumerate(chosen, 1):
        if progress is not None:
            progress.section(name, index, len(chosen))
        bench.group = name
        load, probe = stats.load_average(), stats.probe()
        started = time.perf_counter()
        await STEPS[name](bench)
        if name in POOLED and not POOLED & set(chosen[index:]):
            await bench.stop_writers()
        if groups is not None:
            groups.append(
                {
                    "name": name,
                    "seconds": time.perf_counter() - started,
                    "load_start": load,
                    "probe_us": probe,
                }
            )


def measure(
    *,
    quick: bool,
    directory: str | None,
    progress: ProgressLine | None = None,
    smoke: bool = False,
    only: str | None = None,
    rounds: int | None = None,
    save: str | None = None,
    compare: str | None = None,
) -> BenchRun:
    """Run the groups (`only`: one of them) in a scratch directory under `directory` (default:
    the temp dir), removed at the end; write the run to `save`, and compare it with the run
    saved in `compare`. Both files are checked before anything is measured."""
    sizes = Sizes.pick(quick, smoke)
    saved = stats.load(compare) if compare is not None else None
    if save is not None:
        stats.check_writable(save)
    parent = Path(directory) if directory else None
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="teamrt-bench-", dir=parent))
    meta: dict[str, Any] = {
        **stats.machine(),
        "mode": sizes.mode,
        "rounds": rounds or sizes.rounds,
        "close_rounds": close_rounds(sizes, rounds),
        "only": only,
        "sizes": asdict(sizes),
        "disk": str(parent or tempfile.gettempdir()),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_start": stats.load_average(),
    }
    groups: list[dict[str, Any]] = []
    started = time.perf_counter()
    try:
        with progress if progress is not None else contextlib.nullcontext():
            figures = anyio.run(_run, root, sizes, only, progress, rounds, groups)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    meta |= {
        "load_end": stats.load_average(),
        "seconds": time.perf_counter() - started,
        "groups": groups,
        "probe_us": [*(group["probe_us"] for group in groups), stats.probe()],
    }
    run = stats.run_json(meta, figures)
    compared = None
    if saved is not None and compare is not None:
        compared = stats.comparison(figures, saved, compare, meta["probe_us"])
    if save is not None:
        stats.save(Path(save), run)
    return BenchRun(run, figures, meta, compared)
