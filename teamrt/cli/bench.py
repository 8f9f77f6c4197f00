"""`teamrt bench`: the mailboxes measured against raw baselines, in one run, on one disk.

Every figure is printed beside a baseline measured in the same run (a raw locked append, a raw
fsync'd append, an asyncio.Queue ping-pong, an os.pipe ping-pong between two processes) with the
ratio and the target. Child processes are this module run as `python -m teamrt.cli.bench _ROLE`.
"""

from __future__ import annotations

import asyncio
import fcntl
import gc
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from array import array
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio

from teamrt.agents import Agent, Limits, Memory, tool
from teamrt.cli.bench_models import model_figures
from teamrt.cli.bench_startup import startup_figures
from teamrt.cli.bench_team import team_figures
from teamrt.cli.progress import Progress
from teamrt.envelopes import Envelope, Message, new_id
from teamrt.mail import FileMailboxes, Inbox
from teamrt.mail.log import encode, stamp
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ScriptedModel, ToolSpec, call
from teamrt.replay import timeline
from teamrt.team import Team, Teammate

MEMBERS = ("lead", "echo", "sink")


@dataclass
class Figure:
    name: str
    value: float
    unit: str
    baseline: str = ""
    baseline_value: float | None = None
    target: str = ""
    ok: bool | None = None

    @property
    def ratio(self) -> float | None:
        if not self.baseline_value:
            return None
        return self.value / self.baseline_value


@dataclass(frozen=True)
class Sizes:
    sends: int
    fsync_sends: int
    procs_each: int
    round_trips: int
    wakes: int
    depth_small: int
    depth_large: int
    agent_steps: int
    idle_members: int

    @classmethod
    def pick(cls, quick: bool, smoke: bool) -> Sizes:
        if smoke:
            return cls(400, 40, 100, 40, 10, 100, 1000, 60, 20)
        if quick:
            return cls(5000, 300, 2000, 500, 50, 1000, 100_000, 1020, 1000)
        return cls(20000, 1000, 5000, 2000, 200, 1000, 1_000_000, 1020, 1000)


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


def _envelopes(n: int, recipient: str = "sink") -> list[Message]:
    return [Envelope.message("lead", recipient, {"i": i, "text": "hello world"}) for i in range(n)]


def _child(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "teamrt.cli.bench", *args], stdin=subprocess.DEVNULL
    )


def _wait_file(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench child did not create {path}")
        time.sleep(0.002)


# --- baselines ------------------------------------------------------------------------------


def raw_locked_appends(directory: Path, lines: list[bytes], fsync: bool = False) -> float:
    """Per second: flock + write + unlock on held descriptors (+ fdatasync), pre-encoded."""
    log = os.open(directory / "raw.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    lock = os.open(directory / "raw.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        start = time.perf_counter()
        for line in lines:
            fcntl.flock(lock, fcntl.LOCK_EX)
            os.write(log, line)
            fcntl.flock(lock, fcntl.LOCK_UN)
            if fsync:
                os.fdatasync(log)
        return len(lines) / (time.perf_counter() - start)
    finally:
        os.close(log)
        os.close(lock)


async def queue_ping_pong(n: int) -> list[float]:
    """Round trips between two tasks over asyncio.Queue, in microseconds."""
    to_server: asyncio.Queue[int] = asyncio.Queue()
    to_client: asyncio.Queue[int] = asyncio.Queue()
    times = []

    async def server() -> None:
        for _ in range(n):
            to_client.put_nowait(await to_server.get())

    async with anyio.create_task_group() as tg:
        tg.start_soon(server)
        for i in range(n):
            start = time.perf_counter_ns()
            to_server.put_nowait(i)
            await to_client.get()
            times.append((time.perf_counter_ns() - start) / 1000)
    return times


async def pipe_ping_pong(n: int) -> list[float]:
    """Round trips to a child process over two pipes, both sides asyncio, in microseconds."""
    down_r, down_w = os.pipe()
    up_r, up_w = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "teamrt.cli.bench", "_pipe_echo", str(down_r), str(up_w)],
        pass_fds=(down_r, up_w),
    )
    os.close(down_r)
    os.close(up_w)
    times = []
    try:
        for _ in range(n + 20):
            start = time.perf_counter_ns()
            os.write(down_w, b"x")
            await anyio.wait_readable(up_r)
            os.read(up_r, 64)
            times.append((time.perf_counter_ns() - start) / 1000)
    finally:
        os.close(down_w)
        await anyio.to_thread.run_sync(proc.wait)
        os.close(up_r)
    return times[20:]


async def _pipe_echo(rfd: str, wfd: str) -> None:
    r, w = int(rfd), int(wfd)
    while True:
        await anyio.wait_readable(r)
        data = os.read(r, 64)
        if not data:
            return
        os.write(w, data)


async def pipe_idle_wakes(n: int, spacing: float) -> list[float]:
    """One-way wake-ups of an idle asyncio process through a pipe, in microseconds."""
    r, w = os.pipe()
    out = Path(tempfile.mkdtemp()) / "wakes"
    proc = subprocess.Popen(
        [sys.executable, "-m", "teamrt.cli.bench", "_pipe_waker", str(r), str(out)], pass_fds=(r,)
    )
    os.close(r)
    try:
        await anyio.sleep(0.3)
        for _ in range(n):
            await anyio.sleep(spacing)
            os.write(w, array("d", [time.monotonic()]).tobytes())
    finally:
        os.close(w)
        await anyio.to_thread.run_sync(proc.wait)
    delays = array("d", out.read_bytes()).tolist()
    shutil.rmtree(out.parent)
    return delays


async def _pipe_waker(rfd: str, out: str) -> None:
    r, delays = int(rfd), array("d")
    while True:
        await anyio.wait_readable(r)
        now = time.monotonic()
        data = os.read(r, 8)
        if not data:
            break
        delays.append((now - array("d", data)[0]) * 1e6)
    Path(out).write_bytes(delays.tobytes())


# --- mailbox children -------------------------------------------------------------------------


async def _echo(team: str, ready: str) -> None:
    async with FileMailboxes(team) as mail:
        inbox = mail.inbox("echo")
        Path(ready).touch()
        while True:
            request = await inbox.receive()
            if request.type == "stop":
                await inbox.ack(request)
                return
            await mail.send(Envelope.response(request, request.body))
            inbox.ack_nowait(request)  # the cursor is committed in the background


async def _waker(team: str, ready: str, out: str) -> None:
    delays = array("d")
    async with FileMailboxes(team, rescan_interval=3600) as mail:
        inbox = mail.inbox("echo")
        Path(ready).touch()
        while True:
            envelope = await inbox.receive()
            now = time.monotonic()
            if envelope.type == "stop":
                break
            delays.append((now - envelope.body) * 1e6)
            inbox.ack_nowait(envelope)
    Path(out).write_bytes(delays.tobytes())


async def _sender(team: str, name: str, count: str, durability: str, go: str, out: str) -> None:
    envelopes = [
        Envelope.message(name, "sink", {"i": i, "text": "hello world"}) for i in range(int(count))
    ]
    latencies = array("d")
    async with FileMailboxes(team, durability=durability) as mail:  # type: ignore[arg-type]
        Path(out + ".ready").touch()
        _wait_file(Path(go))
        start = time.monotonic()
        for envelope in envelopes:
            t0 = time.perf_counter_ns()
            await mail.send(envelope)
            latencies.append((time.perf_counter_ns() - t0) / 1000)
        end = time.monotonic()
    Path(out).write_text(json.dumps({"start": start, "end": end}))
    Path(out + ".lat").write_bytes(latencies.tobytes())


# --- the measurements -------------------------------------------------------------------------


class Bench:
    def __init__(self, root: Path, sizes: Sizes, progress: Progress | None = None) -> None:
        self.root = root
        self.sizes = sizes
        self.figures: list[Figure] = []
        self.progress = progress
        self._teams = 0

    def add(self, figure: Figure) -> Figure:
        self.figures.append(figure)
        if self.progress is not None:
            self.progress.update(detail=f"last: {figure.name}")
        return figure

    def team(self, name: str) -> Path:
        self._teams += 1
        return self.root / f"{name}-{self._teams}"

    async def sends(self) -> None:
        s = self.sizes
        scratch = self.root / "raw"
        scratch.mkdir()
        lines = [stamp(encode(e), i, b"bench") for i, e in enumerate(_envelopes(s.sends))]
        raw = raw_locked_appends(scratch, lines)
        raw_fsync = raw_locked_appends(scratch, lines[: s.fsync_sends], fsync=True)
        self.raw_fsync = raw_fsync

        async with FileMailboxes(self.team("send"), members=MEMBERS) as mail:
            envelopes = _envelopes(s.sends)
            start = time.perf_counter()
            for envelope in envelopes:
                await mail.send(envelope)
            rate = s.sends / (time.perf_counter() - start)
            self.add(
                Figure(
                    "awaited sends, durability none",
                    rate,
                    "/s",
                    "raw locked append",
                    raw,
                    ">= 50,000/s",
                    rate >= 50_000,
                )
            )

            start = time.perf_counter()
            for i in range(s.sends):
                await mail.send(Envelope.message("lead", "sink", {"i": i, "text": "hi"}))
            built = s.sends / (time.perf_counter() - start)
            self.add(Figure("build envelope + awaited send", built, "/s", "raw locked append", raw))

            envelopes = _envelopes(s.sends * 5)
            start = time.perf_counter()
            for k in range(0, len(envelopes), 100):
                await mail.send_many(envelopes[k : k + 100])
            batched = len(envelopes) / (time.perf_counter() - start)
            self.add(
                Figure(
                    "batched sends (100 per batch)",
                    batched,
                    "/s",
                    "raw locked append",
                    raw,
                    ">= 300,000/s",
                    batched >= 300_000,
                )
            )

        async with FileMailboxes(self.team("fsync"), members=MEMBERS, durability="fsync") as mail:
            envelopes = _envelopes(s.fsync_sends)
            start = time.perf_counter()
            for envelope in envelopes:
                await mail.send(envelope)
            serial = s.fsync_sends / (time.perf_counter() - start)
            self.add(
                Figure(
                    "awaited sends, durability fsync", serial, "/s", "raw fsync'd append", raw_fsync
                )
            )
            for senders, need in ((8, 2.5), (32, 5.0)):
                rate = await self._concurrent(mail, senders, s.fsync_sends * 2)
                self.add(
                    Figure(
                        f"fsync, {senders} concurrent senders (group commit)",
                        rate,
                        "/s",
                        "one fsync per envelope (serial sends)",
                        serial,
                        f">= {need}x baseline",
                        rate >= need * serial,
                    )
                )

    @staticmethod
    async def _concurrent(mail: FileMailboxes, senders: int, total: int) -> float:
        per = total // senders
        batches = [_envelopes(per) for _ in range(senders)]

        async def run(batch: list[Message]) -> None:
            for envelope in batch:
                await mail.send(envelope)

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for batch in batches:
                tg.start_soon(run, batch)
        return per * senders / (time.perf_counter() - start)

    async def processes(self, durability: str, nprocs: int = 8) -> tuple[float, float]:
        """Aggregate rate and p99 send latency (us) of nprocs processes into one inbox."""
        team = self.team(f"procs-{durability}")
        async with FileMailboxes(team, members=[*MEMBERS, *(f"p{k}" for k in range(nprocs))]):
            pass
        each = self.sizes.procs_each if durability == "none" else self.sizes.fsync_sends
        go = self.root / f"go-{durability}"
        outs = [str(self.root / f"proc-{durability}-{k}") for k in range(nprocs)]
        procs = [
            _child("_sender", str(team), f"p{k}", str(each), durability, str(go), outs[k])
            for k in range(nprocs)
        ]
        for out in outs:
            _wait_file(Path(out + ".ready"))
        go.touch()
        for proc in procs:
            await anyio.to_thread.run_sync(proc.wait)
        spans = [json.loads(Path(out).read_text()) for out in outs]
        latencies: list[float] = []
        for out in outs:
            latencies += array("d", Path(out + ".lat").read_bytes()).tolist()
        rate = nprocs * each / (max(s["end"] for s in spans) - min(s["start"] for s in spans))
        await self._check_no_loss(team, nprocs * each)
        return rate, _pct(latencies, 99)

    @staticmethod
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

    async def contention(self) -> None:
        rate, p99 = await self.processes("none")
        self.add(
            Figure(
                "8 processes into one inbox", rate, "/s", target=">= 30,000/s", ok=rate >= 30_000
            )
        )
        self.add(
            Figure(
                "8 processes: p99 send latency", p99 / 1000, "ms", target="<= 5 ms", ok=p99 <= 5000
            )
        )
        rate, _ = await self.processes("fsync")
        self.add(
            Figure(
                "fsync, 8 processes into one inbox",
                rate,
                "/s",
                "raw fsync'd append",
                self.raw_fsync,
            )
        )

    async def round_trips(self) -> None:
        n = self.sizes.round_trips
        pipe = await pipe_ping_pong(n)
        queue = await queue_ping_pong(n)
        team = self.team("rtt")
        async with FileMailboxes(team, members=MEMBERS) as mail:
            ready = self.root / "echo.ready"
            proc = _child("_echo", str(team), str(ready))
            _wait_file(ready)
            times = []
            try:
                for i in range(n + 50):
                    start = time.perf_counter_ns()
                    await mail.request(Envelope.request("lead", "echo", i), timeout=30)
                    times.append((time.perf_counter_ns() - start) / 1000)
                await mail.send(Envelope.message("lead", "echo", None, type="stop"))
            finally:
                await anyio.to_thread.run_sync(proc.wait)
        times = times[50:]
        p50, p99 = _pct(times, 50), _pct(times, 99)
        self.add(
            Figure(
                "request -> response across processes, p50",
                p50,
                "us",
                "os.pipe ping-pong, p50",
                _pct(pipe, 50),
                "<= 300 us",
                p50 <= 300,
            )
        )
        self.add(
            Figure(
                "request -> response across processes, p99",
                p99,
                "us",
                "os.pipe ping-pong, p99",
                _pct(pipe, 99),
                "<= 2,000 us",
                p99 <= 2000,
            )
        )
        self.add(
            Figure("asyncio.Queue ping-pong in-process, p50 (reference)", _pct(queue, 50), "us")
        )

    async def wakes(self) -> None:
        n, spacing = self.sizes.wakes, 0.01
        pipe = await pipe_idle_wakes(n, spacing)
        team = self.team("wake")
        out = self.root / "wakes"
        async with FileMailboxes(team, members=MEMBERS) as mail:
            ready = self.root / "waker.ready"
            proc = _child("_waker", str(team), str(ready), str(out))
            _wait_file(ready)
            await anyio.sleep(0.3)
            for _ in range(n):
                await anyio.sleep(spacing)
                await mail.send(Envelope.message("lead", "echo", time.monotonic()))
            await mail.send(Envelope.message("lead", "echo", None, type="stop"))
            await anyio.to_thread.run_sync(proc.wait)
        delays = array("d", out.read_bytes()).tolist()
        p50 = _pct(delays, 50)
        self.add(
            Figure(
                "idle receiver in another process wakes, p50",
                p50,
                "us",
                "os.pipe idle wake, p50",
                _pct(pipe, 50),
                "<= 1,000 us",
                p50 <= 1000,
            )
        )
        self.add(
            Figure(
                "idle receiver wakes, p99",
                _pct(delays, 99),
                "us",
                "os.pipe idle wake, p99",
                _pct(pipe, 99),
            )
        )

    async def depth(self) -> None:
        """Drain, pick-up and open at two depths. Pick-ups and opens alternate between the two
        inboxes, so that both depths are measured under the same machine load."""
        small, large = self.sizes.depth_small, self.sizes.depth_large
        teams = {depth: self.team(f"depth{depth}") for depth in (small, large)}
        drain = {}
        for depth, team in teams.items():
            async with FileMailboxes(team, members=MEMBERS):
                pass
            _write_backlog(team / "inboxes" / "sink.jsonl", depth)
            drain[depth] = await self._drain(team, depth)
            gc.collect()

        pickups: dict[int, list[float]] = {small: [], large: []}
        async with FileMailboxes(teams[small]) as a, FileMailboxes(teams[large]) as b:
            pairs = {small: (a, a.inbox("sink")), large: (b, b.inbox("sink"))}
            for envelope in _envelopes(1000):
                for depth, (mail, inbox) in pairs.items():
                    pickups[depth].append(await self._pickup(mail, inbox, envelope))

        opens: dict[int, list[float]] = {small: [], large: []}
        for _ in range(7):  # a cold open: seq from the log's tail, the cursor from its file
            for depth, team in teams.items():
                start = time.perf_counter()
                async with FileMailboxes(team) as mail:
                    mail.inbox("sink")
                    await mail.send(Envelope.message("lead", "sink", "one more"))
                opens[depth].append((time.perf_counter() - start) * 1e6)
        for team in teams.values():
            shutil.rmtree(team)

        pick = {d: statistics.median(v) for d, v in pickups.items()}
        opened = {d: statistics.median(v) for d, v in opens.items()}
        self.add(
            Figure(
                f"pick up a new envelope at depth {large:,}, median",
                pick[large],
                "us",
                f"same at depth {small:,}",
                pick[small],
                "within 10%",
                pick[large] <= 1.1 * pick[small],
            )
        )
        self.add(
            Figure(
                f"open an inbox (seq and cursor) at depth {large:,}",
                opened[large],
                "us",
                f"same at depth {small:,}",
                opened[small],
                "constant (within 25%)",
                opened[large] <= 1.25 * opened[small],
            )
        )
        for depth in (small, large):
            self.add(
                Figure(
                    f"drain a backlog of {depth:,}",
                    drain[depth],
                    "/s",
                    target=">= 200,000/s",
                    ok=drain[depth] >= 200_000,
                )
            )

    async def agent_loop(self) -> None:
        """The agent loop's own cost per step, early and late in a long run."""
        steps = self.sizes.agent_steps
        late = 1000 if steps >= 1020 else steps - 20
        for label, directory, limit in (
            ("no checkpoint", None, 200),
            ("checkpointed", self.root / "agent", 500),
        ):
            times = await _agent_steps(steps, directory)
            early_us = statistics.mean(times[5:25])
            late_us = statistics.mean(times[late - 10 : late + 10])
            self.add(
                Figure(
                    f"agent step, {label}, at step 10",
                    early_us,
                    "us",
                    target=f"<= {limit} us",
                    ok=early_us <= limit,
                )
            )
            self.add(
                Figure(
                    f"agent step, {label}, at step {late:,}",
                    late_us,
                    "us",
                    "same at step 10",
                    early_us,
                    "within 2x",
                    late_us <= 2 * early_us,
                )
            )

    async def teams(self) -> None:
        """Many idle teammates in one process: idle CPU, memory each, and wake-ups."""
        n = self.sizes.idle_members
        small = await self._team_asks(2, idle_seconds=0)
        big = await self._team_asks(n, idle_seconds=2.0 if n >= 1000 else 0.3)
        self.add(
            Figure(
                f"{n:,} idle teammates: CPU while idle",
                big["idle_cpu"],
                "%",
                target="< 0.5% of a core",
                ok=big["idle_cpu"] < 0.5,
            )
        )
        self.add(Figure(f"{n:,} idle teammates: memory per teammate", big["memory_kib"], "KiB"))
        self.add(
            Figure(
                f"wake one teammate among {n:,} (task round trip), p50",
                big["p50"],
                "us",
                "same in a team of 2",
                small["p50"],
                "within 2x",
                big["p50"] <= 2 * small["p50"],
            )
        )
        self.add(
            Figure(f"broadcast to {big['reached']:,} teammates, all read it", big["bcast"], "ms")
        )

    async def _team_asks(self, members: int, *, idle_seconds: float) -> dict[str, float]:
        def answer(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
            return "ok"

        names = [f"m{i:04d}" for i in range(members)]
        path = self.team(f"team{members}")
        out: dict[str, float] = {}
        async with FileMailboxes(path, members=["lead", *names]) as mail:
            tracemalloc.start()  # Python allocations, not RSS: RSS reuses memory freed earlier
            baseline = tracemalloc.get_traced_memory()[0]
            team = Team(mail, [Teammate(name, FunctionModel(answer)) for name in names])
            async with team:
                out["memory_kib"] = (tracemalloc.get_traced_memory()[0] - baseline) / members / 1024
                tracemalloc.stop()
                if idle_seconds:
                    await anyio.sleep(0.5)  # let the start-up notices settle
                    cpu = time.process_time()
                    await anyio.sleep(idle_seconds)
                    out["idle_cpu"] = (time.process_time() - cpu) / idle_seconds * 100
                target = names[len(names) // 2]
                times = []
                for _ in range(60):
                    start = time.perf_counter()
                    await team.ask(target, "wake up", timeout=30)
                    times.append((time.perf_counter() - start) * 1e6)
                out["p50"] = statistics.median(times[10:])
                reached = names[:100]
                start = time.perf_counter()
                await mail.send(Envelope.broadcast("lead", "all hands", type="announcement"))
                # polled at 1 ms: a broadcast wakes each teammate for a round in which its
                # model reads it, and the team's own status counts those rounds
                while not all(team.status[m].rounds for m in reached):  # noqa: ASYNC110
                    await anyio.sleep(0.001)
                out["bcast"] = (time.perf_counter() - start) * 1000
                out["reached"] = len(reached)
        return out

    async def replay(self) -> None:
        """Replay throughput at the large depth, and peak memory at two depths (it streams)."""
        large = self.sizes.depth_large
        small = max(1000, large // 10)
        peaks = {}
        for depth in (small, large):
            team = self.team(f"replay{depth}")
            async with FileMailboxes(team, members=MEMBERS):
                pass
            for name in ("lead", "echo", "sink"):  # three inboxes, merged by time
                _write_backlog(team / "inboxes" / f"{name}.jsonl", depth // 3)
            if depth == large:
                start = time.perf_counter()
                count = sum(1 for _ in timeline(team))
                rate = count / (time.perf_counter() - start)
            tracemalloc.start()
            for _ in timeline(team):
                pass
            peaks[depth] = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
            shutil.rmtree(team)
        self.add(
            Figure(
                f"replay {large:,} envelopes (timeline, pairing, flags)",
                rate,
                "/s",
                target=">= 100,000/s",
                ok=rate >= 100_000,
            )
        )
        self.add(
            Figure(
                f"replay peak memory at {large:,} envelopes",
                peaks[large],
                "MiB",
                f"same at {small:,}",
                peaks[small],
                "flat (within 1.5x + 1 MiB)",
                peaks[large] <= 1.5 * peaks[small] + 1,
            )
        )

    @staticmethod
    async def _drain(team: Path, depth: int) -> float:
        """Envelopes per second handed out by receive_nowait() from a backlog of `depth`."""
        async with FileMailboxes(team) as mail:
            inbox = mail.inbox("sink")
            start = time.perf_counter()
            n, last = 0, None
            while True:
                try:
                    last = inbox.receive_nowait()
                except anyio.WouldBlock:
                    break
                n += 1
            rate = n / (time.perf_counter() - start)
            if n != depth or last is None:
                raise AssertionError(f"drained {n} of {depth}")
            await inbox.ack(last)
        return rate

    @staticmethod
    async def _pickup(mail: FileMailboxes, inbox: Inbox, envelope: Message) -> float:
        """Microseconds for receive_nowait() to find one new envelope (send excluded)."""
        await mail.send(envelope)
        start = time.perf_counter_ns()
        got = inbox.receive_nowait()
        elapsed = (time.perf_counter_ns() - start) / 1000
        inbox.ack_nowait(got)
        return elapsed


async def _ack_cost(team: Path, held: int, probe: int) -> float:
    """Microseconds per awaited ack once `held` acks wait behind one unacked envelope."""
    async with FileMailboxes(team, members=MEMBERS) as mail:
        await mail.send_many(_envelopes(held + probe + 1))
        inbox = mail.inbox("sink")
        got = [inbox.receive_nowait() for _ in range(held + probe + 1)]
        inbox.ack_nowait(*got[1 : held + 1])  # the first stays unacked: a gap ahead of them all
        await inbox.flush()
        start = time.perf_counter()
        for envelope in got[held + 1 :]:
            await inbox.ack(envelope)  # one cursor commit each
        return (time.perf_counter() - start) / probe * 1e6


async def ack_costs(bench: Bench) -> None:
    """Per-ack cost with 2,000 vs 20,000 acks held behind one unacked envelope (flat)."""
    small, large = (200, 2000) if bench.sizes.sends < 1000 else (2000, 20000)
    probe = 100 if bench.sizes.sends < 1000 else 1000
    costs = {n: await _ack_cost(bench.root / f"acks-{n}", n, probe) for n in (small, large)}
    bench.add(
        Figure(
            f"ack with {large:,} acks held behind one unacked envelope",
            costs[large],
            "us",
            f"same with {small:,} held",
            costs[small],
            "within 2x",
            costs[large] <= 2 * costs[small],
        )
    )


class _StampedModel(ScriptedModel):
    """A scripted model that notes when each call starts: the gaps are the loop's own cost."""

    def __init__(self, script: list[ModelReply | str]) -> None:
        super().__init__(script, record_calls=False)
        self.stamps: list[float] = []

    async def complete(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> ModelReply:
        self.stamps.append(time.perf_counter())
        return await super().complete(messages, tools)


async def _agent_steps(steps: int, directory: Path | None) -> list[float]:
    """Microseconds per step of a run with one tool call (no I/O in the tool) per step."""

    @tool
    def count(i: int) -> dict[str, int]:
        """Count."""
        return {"i": i}

    script: list[ModelReply | str] = [call("count", i=i) for i in range(steps)]
    model = _StampedModel([*script, "done"])
    agent = Agent(
        "bench",
        model,
        tools=[count],
        directory=directory,
        limits=Limits(max_steps=steps + 5, max_tool_calls=steps + 5),
        memory=Memory(max_context_tokens=4000),
    )
    report = await agent.run("count")
    if not report.ok or report.steps != steps + 1:
        raise AssertionError(f"the benchmark agent stopped early: {report.summary()}")
    stamps = model.stamps
    return [(b - a) * 1e6 for a, b in itertools.pairwise(stamps)]


def _write_backlog(path: Path, depth: int) -> None:
    """Append `depth` distinct, valid envelopes quickly (one template, new ids and seqs)."""
    envelope = Envelope.message("lead", "sink", {"i": 0, "text": "hello world"})
    template = stamp(encode(envelope), 0, path.parent.parent.name.encode())
    head, _, rest = template.partition(b'"id":"')
    _, _, tail = rest.partition(b'"')
    head = head.removeprefix(b'{"seq":0,')
    with path.open("ab") as f:
        for start in range(0, depth, 10_000):
            chunk = [
                b'{"seq":%d,%b"id":"%b"%b' % (i, head, new_id().encode(), tail)
                for i in range(start, min(depth, start + 10_000))
            ]
            f.write(b"".join(chunk))


# --- running and printing ---------------------------------------------------------------------


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return ""
    if unit == "/s":
        return f"{value:,.0f}/s"
    if unit == "ms":
        return f"{value:,.2f} ms"
    return f"{value:,.1f} {unit}"


def _print(figures: list[Figure], header: str) -> None:
    print(header)
    rows = [("measurement", "value", "baseline", "", "ratio", "target", "")]
    for f in figures:
        ratio = f"{f.ratio:.2f}x" if f.ratio is not None else ""
        verdict = "" if f.ok is None else ("ok" if f.ok else "MISSED")
        rows.append(
            (
                f.name,
                _fmt(f.value, f.unit),
                f.baseline,
                _fmt(f.baseline_value, f.unit),
                ratio,
                f.target,
                verdict,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(7)]
    for row in rows:
        print(
            "  ".join(
                cell.rjust(w) if i in (1, 3, 4) else cell.ljust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )


async def _run(
    root: Path, sizes: Sizes, only: str | None, progress: Progress | None = None
) -> list[Figure]:
    bench = Bench(root, sizes, progress)
    steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
        ("sends", bench.sends),
        ("contention", bench.contention),
        ("round_trips", bench.round_trips),
        ("wakes", bench.wakes),
        ("depth", bench.depth),
        ("agent", bench.agent_loop),
        ("team", bench.teams),
        ("replay", bench.replay),
        ("acks", lambda: ack_costs(bench)),
        ("teamwork", lambda: team_figures(bench)),
        ("models", lambda: model_figures(bench)),
        ("startup", lambda: startup_figures(bench)),
    ]
    chosen = [
        (name, step)
        for name, step in steps
        if only is None or name == only or (only == "contention" and name == "sends")
    ]
    for index, (name, step) in enumerate(chosen, 1):
        if progress is not None:
            progress.section(name, index, len(chosen))
        await step()
    return bench.figures


def run_bench(
    *,
    quick: bool,
    as_json: bool,
    directory: str | None,
    smoke: bool = False,
    only: str | None = None,
    quiet: bool = False,
) -> int:
    sizes = Sizes.pick(quick, smoke)
    parent = Path(directory) if directory else None
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="teamrt-bench-", dir=parent))
    # redrawn twice a second at most, so that drawing does not disturb what is measured
    progress = Progress("teamrt bench", unit="groups", plain=True, quiet=quiet, refresh=2)
    try:
        with progress:
            figures = anyio.run(_run, root, sizes, only, progress)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    meta = {
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "sizes": asdict(sizes),
        "disk": str(parent or tempfile.gettempdir()),
    }
    if as_json:
        print(
            json.dumps(
                {"meta": meta, "figures": [{**asdict(f), "ratio": f.ratio} for f in figures]},
                indent=2,
            )
        )
    else:
        _print(
            figures,
            f"teamrt bench on {meta['disk']} ({meta['cpus']} cpus, Python "
            f"{meta['python']}, {'smoke' if smoke else 'quick' if quick else 'full'} sizes)",
        )
    return 0


_ROLES: dict[str, Callable[..., Awaitable[Any]]] = {
    "_echo": _echo,
    "_waker": _waker,
    "_sender": _sender,
    "_pipe_echo": _pipe_echo,
    "_pipe_waker": _pipe_waker,
}

if __name__ == "__main__":
    anyio.run(_ROLES[sys.argv[1]], *sys.argv[2:])
