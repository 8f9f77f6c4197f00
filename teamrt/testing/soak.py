"""`teamrt soak`: a team on Redis under random faults, and what its guarantees look like after.

Theory of operation. The soak starts a private redis-server (append-only file, fsync on every
write) behind a TCP proxy it controls, then `teammates` teammates as `teamrt run-agent`
processes and one raw consumer process (the *sink*, which reads its inbox through `Mailboxes`
and logs every envelope it hands to its application), all on the proxy's address. This process
is the lead: it keeps `askers` tasks in flight (each retried under its idempotency key until it
is answered) and sends a stream of one-way messages to the sink. Every few seconds it injects a
fault picked at random: the server killed with SIGKILL and restarted from its append-only file,
the server paused with SIGSTOP, a partition (the proxy stops moving bytes both ways while the
connections stay open, as when a cable is pulled), a teammate or the sink killed (and started
again), or paused past its lease's time limit while a replacement takes its lease over (then
resumed: it must stand down). At the end every process is stopped, the server is read directly
and the logs are compared (`Figures`).

A teammate's work is one tool call that writes a *start* line and, a moment later, an *end*
line to an effects log; a task whose tool started twice ran twice, which is a fault unless the
first run was cut off in flight (its process killed or paused before the end line).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from anyio.abc import SocketAttribute, TaskStatus

from teamrt.agents.tools import tool
from teamrt.demos.local_redis import answers, free_port
from teamrt.envelopes import Envelope
from teamrt.errors import MemberBusy, RemoteError, TeamrtError, UsageError
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, call

EFFECTS = "TEAMRT_SOAK_EFFECTS"  # where the teammates' tool writes its effects log
LEAD, SINK, TEAM = "lead", "sink", "soak"
LEASE_TTL = 3.0  # seconds: short, so that a paused holder is replaced within a fault
WORK_SECONDS = 0.3  # how long a task's tool takes: time to be killed or paused mid-call
ASK_TIMEOUT = 60.0  # one attempt of an ask
HUNG_AFTER = ASK_TIMEOUT + 30.0  # an attempt that has not ended by then is hung
#: Errors that refuse a task: it was withdrawn, so asking again needs a new idempotency key.
REFUSALS = frozenset({"TeammateGone", "TeammateCrashed", "Busy", "Expired"})
SEND_EVERY = 0.02  # seconds between two messages to the sink
FAULTS = (
    "server_kill",
    "server_pause",
    "partition",
    "teammate_kill",
    "teammate_pause",
    "sink_kill",
    "sink_pause",
)


# --- the teammate, for `teamrt run-agent --spec teamrt.testing.soak:worker` --------------------


@tool(thread=True)
def do_work(tag: str) -> str:
    """Do the task's one side effect: a start line, a moment's work, an end line."""
    _effect(tag, "start")
    time.sleep(WORK_SECONDS)
    _effect(tag, "end")
    return f"did {tag}"


def _effect(tag: str, what: str) -> None:
    line = json.dumps({"tag": tag, "what": what, "pid": os.getpid(), "t": time.time()})
    with open(os.environ[EFFECTS], "a", encoding="utf-8") as log:
        log.write(line + "\n")


def _brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
    """The task's tag is the last user message; one tool call for it, then the answer."""
    last = max(i for i, m in enumerate(messages) if m.role == "user")
    tag = (messages[last].content or "").strip()
    if any(m.role == "tool" for m in messages[last + 1 :]):
        return f"done {tag}"
    return call("do_work", tag=tag)


def worker() -> Any:
    """The soak's teammate (a `Teammate`; typed loosely so this module imports no team)."""
    from teamrt.team import Teammate

    return Teammate(
        "worker",
        lambda: FunctionModel(_brain, name="soak-worker"),
        instructions="Do the task named by the tag, once.",
        tools=[do_work],
    )


# --- the sink: a raw consumer that logs what it hands to its application --------------------


async def sink(url: str, log_path: Path) -> None:
    """Consume the sink's inbox, logging each envelope (id, pid, fencing token) before acking
    it; waits for the lease while another process holds it."""
    from teamrt.mail import open_mailboxes

    async with open_mailboxes(url) as mail:
        while True:
            try:
                inbox = await mail.open_inbox(SINK)
                break
            except MemberBusy:
                await anyio.sleep(0.2)
        fence = next(r.fence for r in mail.store.held_leases() if r.name == SINK)
        with log_path.open("a", encoding="utf-8") as log:
            while True:
                envelope = await inbox.receive()
                record = {"id": envelope.id, "pid": os.getpid(), "fence": fence, "t": time.time()}
                log.write(json.dumps(record) + "\n")
                log.flush()
                inbox.ack_nowait(envelope)


# --- the server and the wire between it and the team ------------------------------------------


class Server:
    """A private redis-server on a fixed port whose append-only file outlives its process."""

    def __init__(self, directory: Path) -> None:
        program = shutil.which("redis-server")
        if program is None:
            raise UsageError(
                "the soak needs redis-server: install it (apt-get install redis-server)"
            )
        self.program, self.directory, self.port = program, directory, free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        options = {"port": str(self.port), "bind": "127.0.0.1", "dir": str(self.directory),
                   "appendonly": "yes", "appendfsync": "always", "save": "",
                   "daemonize": "no"}  # fmt: skip
        self.process = subprocess.Popen(
            [self.program, *(p for k, v in options.items() for p in (f"--{k}", v))],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not answers(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise TeamrtError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    def signal(self, number: signal.Signals) -> None:
        assert self.process is not None
        self.process.send_signal(number)

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


class Proxy:
    """TCP between the team's processes and the server. `cut()` stops the bytes both ways with
    the connections left open (a partition: nobody is told), `heal()` lets them flow again."""

    def __init__(self, target: int) -> None:
        self.target, self.port = target, 0
        self._flowing = anyio.Event()
        self._flowing.set()

    async def serve(self, *, task_status: TaskStatus[None]) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.port = listener.extra(SocketAttribute.local_port)
        task_status.started()
        async with listener:
            await listener.serve(self._handle)

    def cut(self) -> None:
        if self._flowing.is_set():
            self._flowing = anyio.Event()

    def heal(self) -> None:
        self._flowing.set()

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        async with client:
            try:
                server = await anyio.connect_tcp("127.0.0.1", self.target)
            except OSError:
                return  # the server is down: the client sees its connection close
            async with server, anyio.create_task_group() as tg:
                tg.start_soon(self._pump, client, server, tg.cancel_scope)
                tg.start_soon(self._pump, server, client, tg.cancel_scope)

    async def _pump(
        self, source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream, both: anyio.CancelScope
    ) -> None:
        try:
            async for chunk in source:
                await self._flowing.wait()
                await sink.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        finally:
            both.cancel()  # one side gone: the connection goes


# --- the processes of the team, and the faults done to them -----------------------------------


@dataclasses.dataclass
class Child:
    """One process the soak started, and what it did to it."""

    role: str  # a teammate's name, or "sink"
    process: anyio.abc.Process
    killed: bool = False
    paused: list[tuple[float, float]] = dataclasses.field(default_factory=list)  # when stopped
    replaced: bool = False  # paused past its lease while a replacement took the lease

    def faulted_between(self, start: float, end: float) -> bool:
        """Whether the soak killed or paused this process while [start, end] ran."""
        if self.killed:
            return True
        return any(a <= end and b >= start for a, b in self.paused)


@dataclasses.dataclass
class Figures:
    """What a soak found; the fields whose name ends in the `TARGETS` must be 0."""

    seconds: float
    faults: dict[str, int]
    sends_acked: int = 0
    sends_refused: int = 0  # send() raised (not sent, or not known): never counted as acked
    sends_lost: int = 0
    delivered: int = 0
    redelivered_after_fault: int = 0  # at-least-once: the first consumer was killed or paused
    delivered_twice: int = 0
    stale_deliveries: int = 0  # handed out by a consumer after a newer lease holder did
    asks_answered: int = 0
    asks_retried: dict[str, int] = dataclasses.field(default_factory=dict)  # by error
    asks_hung: int = 0
    tasks_run: int = 0
    tasks_rerun_in_flight: int = 0  # first run cut off by a kill or a pause: expected
    tasks_run_twice: int = 0
    teammate_exits: int = 0  # processes that ended without being killed or replaced
    stood_down: int = 0  # paused, replaced, resumed: ended because their lease was gone

    TARGETS = (
        "sends_lost",
        "delivered_twice",
        "stale_deliveries",
        "asks_hung",
        "tasks_run_twice",
        "teammate_exits",
    )

    @property
    def ok(self) -> bool:
        return all(getattr(self, name) == 0 for name in self.TARGETS) and self.asks_answered > 0

    def lines(self) -> list[str]:
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "none"
        rows = [f"soak: {self.seconds:.0f} s on Redis (appendfsync always); faults: {faults}"]
        for field in dataclasses.fields(self):
            if field.name in ("seconds", "faults"):
                continue
            value = getattr(self, field.name)
            target = "  (target 0)" if field.name in self.TARGETS else ""
            rows.append(f"  {field.name.replace('_', ' '):<26} {value}{target}")
        rows.append("soak: every target met" if self.ok else "soak: TARGETS MISSED")
        return rows


class Soak:
    """One soak run; see the module docstring."""

    def __init__(
        self,
        root: Path,
        *,
        seconds: float,
        seed: int,
        teammates: int = 2,
        askers: int = 4,
        fault_every: float = 8.0,
        faults: Sequence[str] = FAULTS,
        say: Callable[[str], None] = print,
    ) -> None:
        unknown = sorted(set(faults) - set(FAULTS))
        if unknown:
            raise UsageError(f"unknown faults {unknown}; known: {', '.join(FAULTS)}")
        self.root, self.seconds, self.random = root, seconds, random.Random(seed)
        self.workers = [f"w{i}" for i in range(1, teammates + 1)]
        self.askers, self.fault_every, self.fault_kinds = askers, fault_every, tuple(faults)
        self.say = say
        self.server = Server(root / "redis")
        self.proxy: Proxy | None = None
        self.children: list[Child] = []
        self.current: dict[str, Child] = {}  # role -> the process that should hold its lease
        self.faults: Counter[str] = Counter()
        self.acked: set[str] = set()
        self.figures = Figures(seconds=seconds, faults={})
        self._stopping = False

    @property
    def url(self) -> str:
        assert self.proxy is not None
        return f"redis://127.0.0.1:{self.proxy.port}/0?team={TEAM}&lease_ttl={LEASE_TTL:g}"

    @property
    def direct_url(self) -> str:
        """The server itself, past the proxy: for the soak's own reading, never cut off."""
        return f"redis://127.0.0.1:{self.server.port}/0?team={TEAM}"

    async def run(self) -> Figures:
        (self.root / "redis").mkdir(parents=True, exist_ok=True)
        await anyio.to_thread.run_sync(self.server.start)
        self.proxy = Proxy(self.server.port)
        started = time.monotonic()
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(self.proxy.serve)
                await self._team(tg)
                tg.cancel_scope.cancel()
        finally:
            self._stop_children()
            self.figures.seconds = time.monotonic() - started
            with contextlib.suppress(Exception):
                self._count_mail()
            self.server.stop()
        self._count_effects()
        self.figures.faults = dict(self.faults)
        return self.figures

    async def _team(self, tg: anyio.abc.TaskGroup) -> None:
        from teamrt.mail import open_mailboxes
        from teamrt.team import Team

        async with open_mailboxes(self.url, members=[LEAD, SINK, *self.workers]) as mail:
            for role in [SINK, *self.workers]:
                await self._start(role)
            async with Team(mail, [], lead=LEAD, remote=self.workers) as team:
                async with anyio.create_task_group() as work:
                    for i in range(self.askers):
                        work.start_soon(self._asker, team, i)
                    work.start_soon(self._sender, mail)
                    work.start_soon(self._injector)
                    work.start_soon(self._watch_exits)
                    await anyio.sleep(self.seconds)
                    self._stopping = True
                    if self.proxy is not None:
                        self.proxy.heal()
                    work.cancel_scope.cancel()
                await self._settle()

    async def _settle(self) -> None:
        """Faults over: resume anything paused, let the sink catch up with what was sent."""
        for child in self.children:
            if child.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGCONT)
        with contextlib.suppress(ProcessLookupError):
            self.server.signal(signal.SIGCONT)
        with anyio.move_on_after(60):
            while len(self._delivered_ids()) < len(self.acked):  # noqa: ASYNC110 -- another process's log
                await anyio.sleep(0.2)

    # -- the lead's work --

    async def _asker(self, team: Any, index: int) -> None:
        """Ask task after task until the soak ends. An ask that failed without a verdict (no
        answer in time, an outage) is asked again under the same idempotency key; one that was
        refused (the teammate gone or crashed, or the task cancelled) was withdrawn, so it is
        asked again under a new key, and the effects log shows whether the refused one ran."""
        for n in range(10**9):
            tag, attempt = f"T{index}-{n}", 0
            member = self.workers[n % len(self.workers)]
            while not self._stopping:
                outcome = await self._ask_once(team, member, tag, f"{tag}#{attempt}")
                if outcome == "answered":
                    break
                if outcome == "refused":
                    attempt += 1
                await anyio.sleep(0.5)
            if self._stopping:
                return

    async def _ask_once(self, team: Any, member: str, tag: str, key: str) -> str:
        """One ask: `answered`, `refused` (withdrawn: ask anew), or `failed` (ask again)."""
        retried = self.figures.asks_retried
        outcome = "refused"  # a hung ask is cancelled, which withdraws it
        with anyio.move_on_after(HUNG_AFTER) as scope:
            try:
                result = await team.ask(member, tag, timeout=ASK_TIMEOUT, key=key)
            except (TeamrtError, RemoteError) as exc:
                kind = getattr(exc, "error_type", None) or type(exc).__name__
                retried[kind] = retried.get(kind, 0) + 1
                return "refused" if kind in REFUSALS else "failed"
            if result.stop_reason == "answer":
                self.figures.asks_answered += 1
                return "answered"
            kind = f"stopped:{result.stop_reason}"
            retried[kind] = retried.get(kind, 0) + 1
        if scope.cancelled_caught and not self._stopping:
            self.figures.asks_hung += 1
        return outcome

    async def _sender(self, mail: Any) -> None:
        while True:
            envelope = Envelope.message(LEAD, SINK, "soak message")
            try:
                await mail.send(envelope)
            except TeamrtError:
                self.figures.sends_refused += 1
            else:
                self.acked.add(envelope.id)
            await anyio.sleep(SEND_EVERY)

    # -- processes --

    async def _start(self, role: str) -> Child:
        env = {**os.environ, EFFECTS: str(self.root / "effects.jsonl")}
        if role == SINK:
            argv = [sys.executable, "-m", "teamrt.testing.soak", "sink", self.url,
                    str(self.root / "sink.jsonl")]  # fmt: skip
        else:
            argv = [sys.executable, "-m", "teamrt", "run-agent", self.url, "--name", role,
                    "--spec", "teamrt.testing.soak:worker", "--agent-dir",
                    str(self.root / "agents")]  # fmt: skip
        log = (self.root / f"{role}.log").open("ab")
        process = await anyio.open_process(argv, env=env, stdout=log, stderr=log)
        log.close()
        child = Child(role, process)
        self.children.append(child)
        self.current[role] = child
        return child

    async def _watch_exits(self) -> None:
        """A process that ended by itself: a replaced one stands down, any other is a fault
        (and is started again so the soak goes on)."""
        counted: set[int] = set()
        while True:
            await anyio.sleep(0.2)
            for child in list(self.children):
                pid = child.process.pid
                if child.process.returncode is None or child.killed or pid in counted:
                    continue
                counted.add(pid)
                if child.replaced:
                    self.figures.stood_down += 1
                    continue
                if child.role != SINK:
                    self.figures.teammate_exits += 1
                code = child.process.returncode
                self.say(f"soak: {child.role} (pid {pid}) exited by itself ({code}); see "
                         f"{self.root / child.role}.log")  # fmt: skip
                if self.current.get(child.role) is child:
                    await self._start(child.role)

    def _stop_children(self) -> None:
        for child in self.children:
            if child.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGCONT)
                    child.process.kill()

    # -- faults --

    async def _injector(self) -> None:
        while True:
            await anyio.sleep(self.random.uniform(0.5, 1.5) * self.fault_every)
            kind = self.random.choice(self.fault_kinds)
            self.faults[kind] += 1
            self.say(f"soak: fault {kind}")
            await getattr(self, f"_{kind}")()

    async def _server_kill(self) -> None:
        await anyio.to_thread.run_sync(self.server.kill)
        await anyio.to_thread.run_sync(self.server.start)  # from its append-only file

    async def _server_pause(self) -> None:
        self.server.signal(signal.SIGSTOP)
        try:
            await anyio.sleep(self.random.uniform(3, 7))
        finally:
            self.server.signal(signal.SIGCONT)

    async def _partition(self) -> None:
        assert self.proxy is not None
        self.proxy.cut()
        try:
            await anyio.sleep(self.random.uniform(3, 10))
        finally:
            self.proxy.heal()

    async def _teammate_kill(self) -> None:
        await self._kill(self.random.choice(self.workers))

    async def _sink_kill(self) -> None:
        await self._kill(SINK)

    async def _kill(self, role: str) -> None:
        child = self.current[role]
        child.killed = True
        with contextlib.suppress(ProcessLookupError):
            child.process.kill()
        await child.process.wait()
        await self._holder_is(role, None)  # as a supervisor would: the old lease expires first
        await self._start(role)

    async def _teammate_pause(self) -> None:
        await self._pause_and_replace(self.random.choice(self.workers))

    async def _sink_pause(self) -> None:
        await self._pause_and_replace(SINK)

    async def _pause_and_replace(self, role: str) -> None:
        """Pause the holder past its lease, start a replacement (which takes the lease once it
        expires), then resume the old one: it must hand out and start nothing more."""
        old = self.current[role]
        stopped = time.time()
        with contextlib.suppress(ProcessLookupError):
            old.process.send_signal(signal.SIGSTOP)
        old.replaced = True
        await self._holder_is(role, None)
        new = await self._start(role)
        await self._holder_is(role, new.process.pid)
        await anyio.sleep(1.0)  # the replacement works a while before the old one wakes
        with contextlib.suppress(ProcessLookupError):
            old.process.send_signal(signal.SIGCONT)
        old.paused.append((stopped, time.time()))

    async def _holder_is(self, role: str, pid: int | None, timeout: float = 60) -> None:
        """Wait (bounded) until `role`'s lease is free (`pid` None) or held by process `pid`,
        as the server itself says."""
        from teamrt.mail import open_view

        def holder() -> str | None:
            with open_view(self.direct_url) as view:
                return view.holder(role)

        with anyio.move_on_after(timeout):
            while True:
                held = await anyio.to_thread.run_sync(holder)
                if (held is None) if pid is None else (held is not None and f"pid {pid}" in held):
                    return
                await anyio.sleep(0.1)

    # -- counting --

    def _delivered_ids(self) -> set[str]:
        return {d["id"] for d in _records(self.root / "sink.jsonl")}

    def _count_mail(self) -> None:
        """Acked sends missing from the sink's inbox (read on the server, not the proxy), and
        what the sink's consumers handed out."""
        from teamrt.mail import open_view

        figures = self.figures
        figures.sends_acked = len(self.acked)
        with open_view(self.direct_url) as view:
            present = {json.loads(e.raw)["id"] for e in view.scan(SINK)}
        figures.sends_lost = len(self.acked - present)
        deliveries = list(_records(self.root / "sink.jsonl"))
        figures.delivered = len(deliveries)
        excused = {c.process.pid for c in self.children if c.killed or c.replaced}
        judged = judge_deliveries(deliveries, excused)
        figures.stale_deliveries = judged["stale"]
        figures.redelivered_after_fault = judged["redelivered_after_fault"]
        figures.delivered_twice = judged["delivered_twice"]

    def _count_effects(self) -> None:
        by_pid = {c.process.pid: c for c in self.children}

        def cut_off(pid: int, start: float, end: float) -> bool:
            who = by_pid.get(pid)
            return who is not None and who.faulted_between(start, end)

        judged = judge_runs(list(_records(self.root / "effects.jsonl")), cut_off)
        self.figures.tasks_run = judged["tasks"]
        self.figures.tasks_rerun_in_flight = judged["rerun_in_flight"]
        self.figures.tasks_run_twice = judged["run_twice"]


def judge_deliveries(deliveries: list[dict[str, Any]], excused: set[int]) -> Counter[str]:
    """Sort a consumer log's deliveries (`id`, `pid`, `fence`, `t`) into `stale` (handed out
    after a consumer with a newer fencing token had handed something out), and second
    deliveries of one id: `redelivered_after_fault` when the first deliverer was killed or
    replaced (at-least-once), else `delivered_twice`."""
    judged: Counter[str] = Counter()
    newest, first = -1, dict[str, dict[str, Any]]()
    for delivery in sorted(deliveries, key=lambda d: d["t"]):
        if delivery["fence"] < newest:
            judged["stale"] += 1
        newest = max(newest, delivery["fence"])
        earlier = first.setdefault(delivery["id"], delivery)
        if earlier is not delivery:
            excuse = earlier["pid"] in excused
            judged["redelivered_after_fault" if excuse else "delivered_twice"] += 1
    return judged


def judge_runs(
    effects: list[dict[str, Any]], cut_off: Callable[[int, float, float], bool]
) -> Counter[str]:
    """Count `tasks` by their tag in an effects log (`tag`, `what` start/end, `pid`, `t`), and
    each start but a task's last: `rerun_in_flight` when `cut_off(pid, start, end)` says that
    run was killed or paused before its end (end is infinity when it never ended), else
    `run_twice`."""
    judged: Counter[str] = Counter()
    runs: dict[str, list[dict[str, Any]]] = {}
    for effect in effects:
        runs.setdefault(effect["tag"], []).append(effect)
    for tagged in runs.values():
        judged["tasks"] += 1
        starts = sorted((e for e in tagged if e["what"] == "start"), key=lambda e: e["t"])
        for earlier in starts[:-1]:  # every run but the last must have been cut off
            pid, began = earlier["pid"], earlier["t"]
            ends = [e["t"] for e in tagged if e["what"] == "end" and e["pid"] == pid]
            end = min((t for t in ends if t >= began), default=math.inf)
            judged["rerun_in_flight" if cut_off(pid, began, end) else "run_twice"] += 1
    return judged


def _records(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON lines of a log (a line cut short by a kill is skipped)."""
    if not path.exists():
        return
    with path.open(encoding="utf-8") as log:
        for line in log:
            with contextlib.suppress(ValueError):
                yield json.loads(line)


async def soak(
    *,
    seconds: float,
    seed: int,
    root: Path | None = None,
    teammates: int = 2,
    askers: int = 4,
    fault_every: float = 8.0,
    faults: Sequence[str] = FAULTS,
    say: Callable[[str], None] = print,
) -> Figures:
    """Run a soak for `seconds` (see the module docstring) in `root` (a temporary directory,
    removed after, when None) and return its figures."""
    with contextlib.ExitStack() as stack:
        if root is None:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="teamrt-soak-")))
        run = Soak(root, seconds=seconds, seed=seed, teammates=teammates, askers=askers,
                   fault_every=fault_every, faults=faults, say=say)  # fmt: skip
        return await run.run()
    raise AssertionError("unreachable")


if __name__ == "__main__":  # the sink's process: python -m teamrt.testing.soak sink URL LOG
    if sys.argv[1:2] == ["sink"] and len(sys.argv) == 4:
        with contextlib.suppress(KeyboardInterrupt):
            anyio.run(sink, sys.argv[2], Path(sys.argv[3]))
    else:
        sys.exit("usage: python -m teamrt.testing.soak sink URL LOG")
