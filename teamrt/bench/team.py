"""Team figures for `teamrt bench`: teams of many idle teammates (the `team` group); a service
under concurrent load, a long-lived lead, and the tool calls of one reply run side by side (the
`teamwork` group). Each figure has a baseline measured in the same run, the
two alternating round by round; the agent steps also in CPU time per step. The figures that take
seconds a round (the service, the tool calls) have one round with --quick, and a lead's memory is
measured once (it is not a matter of timing)."""

from __future__ import annotations

import math
import os
import resource
import statistics
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path

import anyio

from teamrt.agents import Agent, AgentEvent, Limits, tool
from teamrt.bench.harness import Bench
from teamrt.bench.stats import Figure, Tally, clock, pct
from teamrt.envelopes import Envelope
from teamrt.mail import FileMailboxes
from teamrt.models import (
    ChatMessage,
    FunctionModel,
    ModelReply,
    ScriptedModel,
    ToolSpec,
    call,
    calls,
)
from teamrt.team import Team, Teammate


async def team_figures(bench: Bench) -> None:
    """The `teamwork` group."""
    smoke, quick = bench.smoke, bench.quick
    await service_load(bench, smoke=smoke)
    await parallel_tools(bench, smoke=smoke)
    await streamed_steps(bench, steps=200 if smoke else 2_000)
    await traced_steps(bench, steps=200 if smoke else 2_000)
    # the in-process caches (recent ids, answered requests) fill up over the first ~4,000
    # asks: the first measurement comes after that
    asks, early = (1_000, 500) if smoke else (12_000, 6_000) if quick else (100_000, 10_000)
    await lead_memory(bench, asks=asks, early=early)


async def service_load(bench: Bench, *, smoke: bool) -> None:
    """The service demo's app, a model that takes 100 ms a call, 50 concurrent requests: a pool
    of 5 against one teammate serving them all."""
    try:
        import httpx  # noqa: F401 -- the service extra
    except ImportError:  # pragma: no cover -- the service extra is not installed
        return
    requests, call_seconds, pool = (20, 0.02, 5) if smoke else (50, 0.1, 5)
    t = Tally()
    for _ in bench.each_round(bench.costly_rounds):
        single = await _serve(bench.team("service1"), 1, requests, call_seconds)
        pooled = await _serve(bench.team("service5"), pool, requests, call_seconds)
        t.add("pool50", statistics.median(pooled) * 1000)
        t.add("single50", statistics.median(single) * 1000)
        t.add("pool99", pct(pooled, 99) * 1000)
        t.add("single99", pct(single, 99) * 1000)
    ideal = math.ceil(requests / pool) * call_seconds
    target = 15 * call_seconds
    bench.add(
        t.figure(
            f"service, {requests} concurrent requests, pool of {pool}, p50",
            *("pool50", "ms", "one teammate", "single50"),
            target=f"<= {target * 1000:g} ms (ideal: last answer at {ideal * 1000:g} ms)",
            check=lambda f: f.value <= target * 1000,
        )
    )
    bench.add(
        t.figure(
            f"service, {requests} concurrent requests, pool of {pool}, p99",
            *("pool99", "ms", "one teammate", "single99"),
        )
    )


async def _serve(root: Path, replicas: int, requests: int, call_seconds: float) -> list[float]:
    import httpx

    from teamrt.demos.service import create_app

    async def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        await anyio.sleep(call_seconds)
        return "an answer"

    def make() -> list[Teammate]:
        model = FunctionModel(brain)
        return [Teammate("answerer", model, replicas=replicas, max_queue=requests)]

    app = create_app(make, directory=lambda: root, role="answerer")
    latencies: list[float] = []
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://service") as client:

            async def one(i: int) -> None:
                start = time.perf_counter()
                response = await client.post("/ask", json={"question": f"question {i}"})
                response.raise_for_status()
                latencies.append(time.perf_counter() - start)

            async with anyio.create_task_group() as tg:
                for i in range(requests):
                    tg.start_soon(one, i)
    return latencies


async def parallel_tools(bench: Bench, *, smoke: bool) -> None:
    """20 tool calls in one reply, each taking 100 ms: side by side, against one by one."""
    n, seconds = 20, 0.02 if smoke else 0.1

    async def run(sequential: bool) -> float:
        @tool(sequential=sequential)
        async def fetch(i: int) -> str:
            """Fetch something slow."""
            await anyio.sleep(seconds)
            return f"item {i}"

        model = ScriptedModel([calls(*(call("fetch", i=i) for i in range(n))), "done"])
        start = time.perf_counter()
        report = await Agent("fan-out", model, tools=[fetch]).run("fetch everything")
        assert report.ok, report.summary()
        return time.perf_counter() - start

    t = Tally()
    for _ in bench.each_round(bench.costly_rounds):
        t.add("parallel", await run(False) * 1000)
        t.add("one_by_one", await run(True) * 1000)
    bench.add(
        t.figure(
            f"{n} tool calls in one reply, {seconds * 1000:g} ms each",
            *("parallel", "ms", "one by one (sequential=True)", "one_by_one"),
            target=f"<= {3 * seconds * 1000:g} ms",
            check=lambda f: f.value <= 3 * seconds * 1000,
        )
    )


async def _per_step(steps: int) -> tuple[float, float]:
    """Microseconds per agent step (wall, CPU): one tool call (no I/O) per step, a
    FunctionModel."""
    count = 0

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
        nonlocal count
        count += 1
        return ModelReply(text="done") if count >= steps else call("fetch", i=count)

    @tool
    def fetch(i: int) -> int:
        """Fetch a number."""
        return i

    limits = Limits(max_steps=steps + 1, max_tool_calls=steps + 1)
    agent = Agent("steps", FunctionModel(brain), tools=[fetch], limits=limits)
    with clock() as c:
        report = await agent.run("go")
    assert report.ok, report.summary()
    return c.wall / steps * 1e6, c.cpu / steps * 1e6


async def traced_steps(bench: Bench, *, steps: int) -> None:
    """An agent step with OpenTelemetry off (the default) and on (an SDK provider that drops
    its spans), beside the step before telemetry was imported at all: off must cost nothing."""
    from teamrt import telemetry

    t = Tally()
    t.add("before", *await _per_step(steps))
    try:
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:  # pragma: no cover -- the otel extra is not installed
        return
    for _ in bench.each_round():
        telemetry.enable(TracerProvider())
        try:
            t.add("on", *await _per_step(steps))
        finally:
            telemetry.disable()
        t.add("off", *await _per_step(steps))
    bench.add(
        t.figure("agent step, telemetry off", "off", "us", "before it was first enabled", "before")
    )
    bench.add(
        t.figure("agent step, telemetry on (spans made, not exported)", "on", "us", "off", "off")
    )


async def streamed_steps(bench: Bench, *, steps: int) -> None:
    """An agent step whose reply is streamed to a listener (text in pieces, events for each
    tool call and result) beside the same step not streamed."""

    async def per_step(streamed: bool) -> tuple[float, float]:
        count = 0

        def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
            nonlocal count
            count += 1
            if count >= steps:
                return ModelReply(text="done: " + "word " * 40)
            return call("fetch", i=count).model_copy(update={"text": "thinking " * 10})

        @tool
        def fetch(i: int) -> int:
            """Fetch a number."""
            return i

        async def listen(event: AgentEvent) -> None:
            pass

        agent = Agent(
            "streamer",
            FunctionModel(brain),
            tools=[fetch],
            limits=Limits(max_steps=steps + 1, max_tool_calls=steps + 1),
            on_event=listen if streamed else None,
        )
        with clock() as c:
            report = await agent.run("go")
        assert report.ok, report.summary()
        return c.wall / steps * 1e6, c.cpu / steps * 1e6

    t = Tally()
    for _ in bench.each_round():
        t.add("plain", *await per_step(False))
        t.add("streamed", *await per_step(True))
    bench.add(
        t.figure(
            "agent step, reply streamed to a listener",
            *("streamed", "us", "the same step, not streamed", "plain"),
        )
    )


async def lead_memory(bench: Bench, *, asks: int, early: int) -> None:
    """A lead that asks and asks: Python memory and its cursor file after `early` asks and
    after all of them (flat: idle notices are acked as they come). The teammate takes each task in
    a fresh context, so that what is measured is the lead (a persistent context grows up to its
    memory budget, then stays there)."""
    path = bench.team("lead")
    cursor = path / "inboxes" / "lead.cursor.json"
    seen: dict[int, tuple[float, int]] = {}
    async with FileMailboxes(path) as mail:
        tracemalloc.start()
        try:
            answerer = Teammate("w", FunctionModel(lambda m, t: "ok"), context="per_task")
            async with Team(mail, [answerer]) as team:
                for i in range(1, asks + 1):
                    await team.ask("w", "q", timeout=30)
                    if i in (early, asks):
                        await anyio.sleep(0.01)  # the lead's server takes the idle notice
                        await mail.inbox("lead").flush()
                        kib = tracemalloc.get_traced_memory()[0] / 1024
                        seen[i] = (kib, cursor.stat().st_size)
        finally:
            tracemalloc.stop()
    (early_kib, early_bytes), (late_kib, late_bytes) = seen[early], seen[asks]
    bench.add(
        Figure.of(
            f"lead after {asks:,} asks: Python memory in use",
            *([late_kib], "KiB", f"at {early:,} asks", [early_kib]),
            target="within 10%",
            check=lambda f: late_kib <= 1.1 * early_kib,
        )
    )
    bench.add(
        Figure.of(
            f"lead after {asks:,} asks: cursor file",
            *([late_bytes], "B", f"at {early:,} asks", [early_bytes]),
            target="within 10%",
            check=lambda f: late_bytes <= 1.1 * early_bytes,
        )
    )


def _answer_ok(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
    """The idle teams' model: every task is answered at once."""
    return "ok"


async def _ask_p50(team: Team, member: str, asks: int) -> float:
    """The p50 round trip, in microseconds, of `asks` tasks to `member` (after 5 not counted)."""
    times = []
    for _ in range(asks + 5):
        start = time.perf_counter()
        await team.ask(member, "wake up", timeout=60)
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times[5:])


async def idle_teams(bench: Bench) -> None:
    """Teams of 10, 100 and 1,000 idle teammates in this process (and once a run, 10,000),
    beside a team of 2: the CPU they cost while idle, and the round trip of a task to one of
    them. Every round starts each team in turn (they cannot run side by side: each one's idle
    CPU is measured alone), and measures this process idle with no team first: on a VM the
    CPU time charged to a process that only sleeps is not zero (0.2-0.8% of a core has been
    seen for one bare `asyncio.sleep`), so a team's idle cost is judged above that floor."""
    sizes = (2, *bench.sizes.teammates)
    largest = max(sizes)
    idle = 0.3 if bench.smoke else 1.0
    asks = 20 if bench.smoke else 40
    t = Tally()
    once: dict[str, float] = {}
    for index in bench.each_round():
        with clock() as c:
            await anyio.sleep(idle)
        t.add("idle0", c.cpu / c.wall * 100)
        for members in sizes:
            first = index == 0 and members == largest
            got = await _team_round(bench, members, idle=idle, asks=asks, once=first)
            t.add(f"idle{members}", got["idle_cpu"])
            t.add(f"wake{members}", got["p50"])
            if first:
                once = got
    huge = bench.sizes.huge_team
    extra = await _huge_team(bench, t, huge, idle=idle, asks=asks) if huge else []
    judged = (*sizes, huge) if huge else sizes
    for members in judged:
        bench.add(
            t.figure(
                f"{members:,} idle teammates: CPU while idle",
                *(f"idle{members}", "%", "this process idle, no team", "idle0"),
                target="< 0.5% of a core above it",
                check=lambda f: f.value - (f.baseline_value or 0) < 0.5,
            )
        )
    for members in judged[1:]:
        bench.add(
            t.figure(
                f"wake one teammate among {members:,} (task round trip), p50",
                *(f"wake{members}", "us", "same in a team of 2", "wake2"),
                target="within 2x",
                check=lambda f: f.value <= 2 * (f.baseline_value or 0),
            )
        )
    for figure in extra:
        bench.add(figure)
    bench.add(
        Figure.of(f"{largest:,} idle teammates: memory per teammate", [once["memory"]], "KiB")
    )
    bench.add(
        Figure.of(
            f"broadcast to {once['reached']:,.0f} teammates, all read it", [once["bcast"]], "ms"
        )
    )


async def _huge_team(
    bench: Bench, t: Tally, members: int, *, idle: float, asks: int
) -> list[Figure]:
    """A team of `members` (10,000), started once per run (it takes seconds to start and
    to stop): its idle CPU in as many windows as there are rounds and the p50 task round
    trip to one member, into `t` as the smaller teams' are; returned: how long it took to
    start and to stop, and the files the process had open (more members than it may open
    files for their inboxes: idle ones give theirs back under the descriptor budget)."""
    names = [f"m{i:05d}" for i in range(members)]
    async with FileMailboxes(bench.root / f"team{members}", members=["lead", *names]) as mail:
        team = Team(
            mail,
            [Teammate(name, FunctionModel(_answer_ok)) for name in names],
            shutdown_deadline=600,  # idle members stop in turn, a millisecond or so each
        )
        start = time.perf_counter()
        await team.__aenter__()
        try:
            started = time.perf_counter() - start
            await anyio.sleep(0.3)  # let the start-up notices settle
            for _ in bench.each_round():
                with clock() as c:
                    await anyio.sleep(idle)
                t.add(f"idle{members}", c.cpu / c.wall * 100)
            descriptors = len(os.listdir("/proc/self/fd"))
            t.add(f"wake{members}", await _ask_p50(team, names[len(names) // 2], asks))
        finally:
            stop = time.perf_counter()
            await team.__aexit__(None, None, None)
            stopped = time.perf_counter() - stop
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return [
        Figure.of(f"{members:,} teammates: start", [started], "s"),
        Figure.of(f"{members:,} teammates: stop (each asked to)", [stopped], "s"),
        Figure.of(f"{members:,} teammates: files open (limit {soft:,})", [descriptors], "fds"),
    ]


async def _team_round(
    bench: Bench, members: int, *, idle: float, asks: int, once: bool
) -> dict[str, float]:
    """One round with a team of `members`: its idle CPU over `idle` seconds and the p50 task
    round trip to one member; `once`: also its memory per teammate and a broadcast."""
    names = [f"m{i:04d}" for i in range(members)]
    path = bench.root / f"team{members}"
    out: dict[str, float] = {}
    async with FileMailboxes(path, members=["lead", *names]) as mail:
        if once:
            tracemalloc.start()  # Python allocations, not RSS: RSS reuses memory freed earlier
            baseline = tracemalloc.get_traced_memory()[0]
        team = Team(mail, [Teammate(name, FunctionModel(_answer_ok)) for name in names])
        async with team:
            if once:
                out["memory"] = (tracemalloc.get_traced_memory()[0] - baseline) / members / 1024
                tracemalloc.stop()
            await anyio.sleep(0.3)  # let the start-up notices settle
            with clock() as c:
                await anyio.sleep(idle)
            out["idle_cpu"] = c.cpu / c.wall * 100
            out["p50"] = await _ask_p50(team, names[len(names) // 2], asks)
            if once:
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
