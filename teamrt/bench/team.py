"""Team figures for `teamrt bench`: a service under concurrent load, a long-lived lead, and the
tool calls of one reply run side by side. Each figure has a baseline measured in the same run, the
two alternating round by round; the agent steps also in CPU time per step. The figures that take
seconds a round (the service, the tool calls) have one round with --quick, and a lead's memory is
measured once (it is not a matter of timing)."""

from __future__ import annotations

import math
import statistics
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from teamrt.agents import Agent, AgentEvent, Limits, tool
from teamrt.cli.bench_stats import Figure, Tally, clock, pct
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

if TYPE_CHECKING:
    from teamrt.cli.bench import Bench


async def team_figures(bench: Bench) -> None:
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
