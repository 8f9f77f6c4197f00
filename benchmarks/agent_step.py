"""The agent step's CPU with a model that yields to the event loop at each call, as a model over
the network does, and with one that answers at once.

    .venv/bin/python benchmarks/agent_step.py [--steps 2000] [--runs 5]

Each run is one agent run of `--steps` steps, each a call of a tool that does no I/O. The model
notes `time.process_time()` as each call starts (after its yield, for the yielding model), so a
step is one call's start to the next: the loop's work, the tool's and the model's own few lines.
Printed: the median over the runs of each run's median step, for each kind of model. To compare
two versions of teamrt, run it under each (`PYTHONPATH=/path/to/other/checkout`), alternately.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence
from typing import Any

from teamrt.agents import Agent, Limits, Memory, tool
from teamrt.models import ChatMessage, ModelReply, ToolSpec, call


@tool
def count(i: int) -> dict[str, int]:
    """Count."""
    return {"i": i}


class _Stamped:
    """Replies from a list; `suspends`: each call yields once first (and says so)."""

    name = "stamped"

    def __init__(self, replies: list[ModelReply], suspends: bool) -> None:
        self.replies = replies
        self.suspends = suspends
        self.starts: list[float] = []

    async def complete(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec], **_: Any
    ) -> ModelReply:
        if self.suspends:
            await asyncio.sleep(0)
        self.starts.append(time.process_time())
        return self.replies[len(self.starts) - 1]


async def _run(steps: int, suspends: bool) -> float:
    """The median CPU per step of one run, in microseconds."""
    replies = [call("count", i=i) for i in range(steps)] + [ModelReply(text="done")]
    model = _Stamped(replies, suspends)
    agent = Agent(
        "bench",
        model,
        tools=[count],
        limits=Limits(max_steps=steps + 5, max_tool_calls=steps + 5),
        memory=Memory(max_context_tokens=4000),
    )
    report = await agent.run("count")
    if not report.ok:
        raise SystemExit(f"the run stopped early: {report.summary()}")
    gaps = [(b - a) * 1e6 for a, b in zip(model.starts, model.starts[1:], strict=False)]
    return statistics.median(gaps[5:])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    for suspends, what in ((True, "yields once a call"), (False, "answers at once")):
        runs = [await _run(args.steps, suspends) for _ in range(args.runs)]
        spread = f"{min(runs):.1f}-{max(runs):.1f}"
        print(f"a model that {what}: {statistics.median(runs):.1f} us of CPU a step ({spread})")


if __name__ == "__main__":
    asyncio.run(main())
