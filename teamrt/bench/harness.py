"""What every group of `teamrt bench` is given: the sizes of the run, its rounds, scratch teams,
the figures measured so far, the progress line, and the writer processes (started once a run).

A group is a function of a `Bench` (`async def sends(bench: Bench) -> None`) that measures and
adds its figures with `bench.add`; `teamrt.bench.GROUPS` names them in the order they run.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Protocol

import anyio

from teamrt.bench.stats import Figure, pct
from teamrt.envelopes import Envelope, Message
from teamrt.mail import FileMailboxes
from teamrt.mail.filestore import DEFAULT_SEGMENT_BYTES
from teamrt.replay.events import WINDOW

MEMBERS = ("lead", "echo", "sink")
WRITERS = (1, 2, 4, 8, 16)
# the mailbox children (echo, waker, writer): teamrt.bench.children run as a module
CHILDREN = "teamrt.bench.children"


@dataclass(frozen=True)
class Sizes:
    """How much each group does. Counts are per round unless they say otherwise."""

    mode: str  # smoke, quick or full
    rounds: int  # the default for --rounds
    sends: int
    fsync_sends: int
    writes: int  # envelopes into one inbox per writer count, shared among the writers
    round_trips: int
    wakes: int
    depth_small: int
    depth_large: int
    segment_bytes: int  # of the depth teams: the backlog is written as segments of this size
    pickups: int
    agent_steps: int
    teammates: tuple[int, ...]
    huge_team: int  # started once per run (0: not at all): the idle rows' largest team
    replay_small: int
    replay_large: int
    body_counts: tuple[int, int, int]  # per round of each of mailboxes.BODY_SIZES

    @classmethod
    def pick(cls, quick: bool, smoke: bool) -> Sizes:
        """The sizes of a smoke run (the tests'), a --quick run or a full one."""
        if smoke:
            return cls(
                *("smoke", 2, 400, 40, 400, 40, 10, 100, 1000, 64 << 10, 20, 60, (5, 20)),
                *(40, 600, 3000, (50, 20, 4)),
            )
        if quick:
            return cls(
                *("quick", 3, 5000, 150, 16_000, 300, 40, 1000, 100_000, 8 << 20, 300, 1020),
                *((10, 100, 1000), 10_000, 3 * 2 * WINDOW, 150_000, (2000, 500, 20)),
            )
        return cls(
            *("full", 5, 20_000, 500, 40_000, 1000, 100, 1000, 1_000_000, DEFAULT_SEGMENT_BYTES),
            *(1000, 1020, (10, 100, 1000), 10_000, 3 * 2 * WINDOW, 1_000_000),
            (5000, 2000, 100),
        )


def sample_envelopes(n: int, recipient: str = "sink") -> list[Message]:
    """`n` small messages from the lead, the kind most figures send."""
    return [Envelope.message("lead", recipient, {"i": i, "text": "hello world"}) for i in range(n)]


def spawn(*args: str, **options: Any) -> subprocess.Popen[bytes]:
    """A mailbox child (`args`: its role and the role's arguments)."""
    options.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.Popen([sys.executable, "-m", CHILDREN, *args], **options)


def wait_file(path: Path, timeout: float = 60) -> None:
    """Until a child has created `path`: the sign it is ready."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench child did not create {path}")
        time.sleep(0.002)


class ProgressLine(Protocol):
    """What the bench tells the progress line (the CLI's `Progress`): a group started, a detail."""

    def __enter__(self) -> object: ...

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...

    def section(self, name: str, index: int, count: int) -> None: ...

    def update(self, *, detail: str | None = None) -> None: ...


class Writers:
    """Writer processes into one inbox (`sink`) of a team with durability none and one with
    fsync, started once (for the whole run) and told to send in steps, so that each step (a
    number of writers) costs no process start-up."""

    def __init__(self, bench: Bench, count: int) -> None:
        self.count = count
        self.teams = {"none": bench.team("writers"), "fsync": bench.team("writers-fsync")}
        self.out = bench.root / "writers-out"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.sent = dict.fromkeys(self.teams, 0)

    async def __aenter__(self) -> Writers:
        names = [f"p{k}" for k in range(self.count)]
        for team in self.teams.values():
            async with FileMailboxes(team, members=[*MEMBERS, *names]):
                pass
        self.out.mkdir()
        teams = [str(self.teams["none"]), str(self.teams["fsync"])]
        for name in names:
            self.procs.append(
                spawn(
                    *("_writer", *teams, name, str(self.out)),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                )
            )
        for proc in self.procs:
            await self._expect(proc, b"ready")
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):  # it died, and says so below
                proc.stdin.close()
        for proc in self.procs:
            await anyio.to_thread.run_sync(proc.wait)
            if proc.stdout is not None:
                proc.stdout.close()
        if kind is None:
            for durability, team in self.teams.items():
                await _check_no_loss(team, self.sent[durability])

    @staticmethod
    async def _line(proc: subprocess.Popen[bytes]) -> bytes:
        stdout: IO[bytes] | None = proc.stdout
        assert stdout is not None
        line: bytes = await anyio.to_thread.run_sync(stdout.readline)
        if not line:
            raise RuntimeError(f"a bench writer process exited with code {proc.wait()}")
        return line.strip()

    async def _expect(self, proc: subprocess.Popen[bytes], word: bytes) -> None:
        line = await self._line(proc)
        if line != word:
            raise RuntimeError(f"a bench writer said {line!r}, not {word!r}")

    @staticmethod
    def _say(proc: subprocess.Popen[bytes], text: bytes) -> None:
        assert proc.stdin is not None
        proc.stdin.write(text + b"\n")
        proc.stdin.flush()

    async def step(self, writers: int, each: int, durability: str) -> tuple[float, float]:
        """`writers` processes send `each` envelopes at once: their aggregate rate and the p99
        of their sends' latencies (us)."""
        chosen = self.procs[:writers]
        for proc in chosen:
            self._say(proc, b"%d %s" % (each, durability.encode()))
        for proc in chosen:
            await self._expect(proc, b"built")
        for proc in chosen:
            self._say(proc, b"go")
        spans = [json.loads(await self._line(proc)) for proc in chosen]
        latencies: list[float] = []
        for span in spans:
            latencies += array("d", Path(span["latencies"]).read_bytes()).tolist()
        self.sent[durability] += writers * each
        elapsed = max(s["end"] for s in spans) - min(s["start"] for s in spans)
        return writers * each / elapsed, pct(latencies, 99)


async def _check_no_loss(team: Path, expected: int) -> None:
    async with FileMailboxes(team) as mail:
        inbox, seqs = mail.inbox("sink"), []
        while True:
            try:
                seqs.append(inbox.receive_nowait().seq)
            except anyio.WouldBlock:
                break
    if seqs != list(range(expected)):
        raise AssertionError(f"lost or duplicated envelopes: {len(seqs)} of {expected}")


def close_rounds(sizes: Sizes, rounds: int | None) -> int:
    """Rounds of the figure judged closest to its floor (the round trip, within 1.3x): at least
    5 unless --rounds says otherwise, --quick too (a round costs a fraction of a second, and of
    3 the median is whichever round the machine was in the middle of its swings)."""
    if rounds is not None or sizes.mode == "smoke":
        return rounds or sizes.rounds
    return max(sizes.rounds, 5)


class Bench:
    """One run of the bench: its sizes and rounds, its scratch directory, the figures measured
    so far (in the order they were added) and what is to be closed when it ends."""

    def __init__(
        self,
        root: Path,
        sizes: Sizes,
        progress: ProgressLine | None = None,
        rounds: int | None = None,
    ) -> None:
        self.root = root
        self.sizes = sizes
        self.rounds = rounds or sizes.rounds
        self.close_rounds = close_rounds(sizes, rounds)
        self.figures: list[Figure] = []
        self.progress = progress
        self.group = ""
        self._teams = 0
        self._writers: Writers | None = None
        self.cleanup = contextlib.AsyncExitStack()  # closed at the end of the run

    @property
    def smoke(self) -> bool:
        """A smoke run: the tests', sized to check that each group works."""
        return self.sizes.mode == "smoke"

    @property
    def quick(self) -> bool:
        """A --quick run."""
        return self.sizes.mode == "quick"

    @property
    def costly_rounds(self) -> int:
        """Rounds of the figures that take seconds each, mostly asleep (a service whose model
        takes 100 ms a call, tool calls of 100 ms): one with --quick."""
        return 1 if self.quick else self.rounds

    def each_round(self, rounds: int | None = None) -> Iterator[int]:
        """The round numbers (from 0), said in the progress line as they start."""
        count = self.rounds if rounds is None else rounds
        for index in range(count):
            if self.progress is not None:
                self.progress.update(detail=f"round {index + 1}/{count}")
            yield index

    def add(self, figure: Figure) -> Figure:
        """Add a measured figure to the run, in the group now running."""
        figure.group = self.group
        self.figures.append(figure)
        if self.progress is not None:
            self.progress.update(detail=f"last: {figure.name}")
        return figure

    def team(self, name: str) -> Path:
        """A directory for a new scratch team, named after `name` (each call a new one)."""
        self._teams += 1
        return self.root / f"{name}-{self._teams}"

    async def stop_writers(self) -> None:
        """Stop the writer processes (and check that the inboxes they wrote lost nothing)."""
        await self.cleanup.aclose()
        self._writers = None

    async def writer_pool(self) -> Writers:
        """The writer processes, started on first use and stopped at the end of the run."""
        if self._writers is None:
            self._writers = await self.cleanup.enter_async_context(Writers(self, max(WRITERS)))
        return self._writers
