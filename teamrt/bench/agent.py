"""The agent loop's cost per step in `teamrt bench`: a scripted model that notes when each call
starts and returns, so that what teamrt adds around the model is told from the whole step."""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from teamrt.agents import Agent, Limits, Memory, tool
from teamrt.bench.harness import Bench
from teamrt.bench.stats import Tally, cpu_at_most
from teamrt.models import ChatMessage, ModelReply, OutputSpec, ScriptedModel, ToolSpec, call


async def agent_loop(bench: Bench) -> None:
    """The agent loop's cost per step, early and late in a long run: its own part (CPU from a
    scripted model's return to its next call: what teamrt adds around the model, the tool's
    call included) beside the whole step (model call to model call, wall and CPU); the two
    kinds of run alternate, every round."""
    steps = bench.sizes.agent_steps
    late = 1000 if steps >= 1020 else steps - 20
    # Targets of the loop's own CPU per step: issue 15's 50 us without a checkpoint; with one,
    # the step also encodes and appends its three journal records (the reply, the tool's
    # result, the step's end; no fsync), about 110-130 us here: 250 us is the loop's 50 and
    # 200 for the records, room for a loaded machine without hiding a doubled cost.
    runs = (("no checkpoint", None, 50), ("checkpointed", bench.root / "agent", 250))
    t = Tally()
    for index in bench.each_round():
        for label, directory, _ in runs:
            where = None if directory is None else directory / str(index)
            run = await _agent_steps(steps, where)
            for at, window in (("10", slice(5, 25)), ("late", slice(late - 10, late + 10))):
                whole = statistics.mean(run.cpus[window])
                own = statistics.mean(run.own_cpus[window])
                t.add(f"{label}{at}", statistics.mean(run.walls[window]), whole)
                t.add(f"{label}own{at}", own, own)
    for label, _, limit in runs:
        bench.add(
            t.figure(
                f"agent step, {label}, at step 10: the loop's own CPU",
                *(f"{label}own10", "us", "whole step", f"{label}10"),
                target=f"<= {limit} us of CPU",
                check=cpu_at_most(limit),
            )
        )
        bench.add(
            t.figure(
                f"agent step, {label}, at step {late:,}: the loop's own CPU",
                *(f"{label}ownlate", "us", "whole step", f"{label}late"),
                target=f"<= {limit} us of CPU",
                check=cpu_at_most(limit),
            )
        )
        bench.add(
            t.figure(
                f"agent step, {label}, at step {late:,}: whole step",
                *(f"{label}late", "us", "same at step 10", f"{label}10"),
                target="within 2x",
                check=lambda f: f.value <= 2 * (f.baseline_value or 0),
            )
        )


class _StampedModel(ScriptedModel):
    """A scripted model that notes when each call starts and returns (wall and CPU): from one
    call's return to the next call's entry is the loop's own cost (the tool's call included)."""

    def __init__(self, script: list[ModelReply | str]) -> None:
        super().__init__(script, record_calls=False)
        self.entries: list[tuple[float, float]] = []
        self.exits: list[tuple[float, float]] = []

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        output: OutputSpec | None = None,
    ) -> ModelReply:
        self.entries.append((time.perf_counter(), time.process_time()))
        reply = await super().complete(messages, tools, output=output)
        self.exits.append((time.perf_counter(), time.process_time()))
        return reply


class _AgentSteps(NamedTuple):
    """Microseconds per step of a benchmark run, step i from model call i's entry to call i+1's:
    the whole step (wall, CPU) and the loop's own part of it (CPU from call i's return to call
    i+1's entry: the model's work left out, the tool's call kept)."""

    walls: list[float]
    cpus: list[float]
    own_cpus: list[float]


async def _agent_steps(steps: int, directory: Path | None) -> _AgentSteps:
    """A run with one tool call (no I/O in the tool) per step, measured step by step."""

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
    pairs = list(itertools.pairwise(model.entries))
    return _AgentSteps(
        [(b[0] - a[0]) * 1e6 for a, b in pairs],
        [(b[1] - a[1]) * 1e6 for a, b in pairs],
        [(b[1] - a[1]) * 1e6 for a, b in zip(model.exits, model.entries[1:], strict=False)],
    )
