"""Delegation: a throw-away sub-agent with a fresh context, of which only the conclusion returns.

The other half of the line between a sub-agent and a teammate: a teammate keeps its context and
talks to the others; a sub-agent is called in for one self-contained job, works in a context of
its own (so its exploration never fills the caller's), and is thrown away. The caller's model
sees only the conclusion, how the sub-agent stopped, and what it spent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from teamrt.agents.limits import Limits
from teamrt.agents.loop import Agent, SharedBudget
from teamrt.agents.tools import Tool, current_call_id, tool
from teamrt.models.base import Model, Usage

DEFAULT_INSTRUCTIONS = (
    "You are a sub-agent given one self-contained task. Work on it with your tools, then answer "
    "with your conclusion only: what you found or did, in a few sentences."
)


def delegate_tool(
    model: Model | Callable[[], Model],
    *,
    tools: Sequence[Tool | Callable[..., Any]] = (),
    instructions: str = DEFAULT_INSTRUCTIONS,
    limits: Limits | None = None,
    budget: SharedBudget | None = None,
    prices: dict[str, tuple[float, float]] | None = None,
    owner: str = "agent",
    name: str = "delegate",
    on_spend: Callable[[Usage, float | None], None] | None = None,
) -> Tool:
    """A tool that runs `task` in a fresh sub-agent and returns only its conclusion.

    `model` may be a factory (called once per delegation). The sub-agent's spend is charged to
    `budget` (a team's budget, say) and reported to `on_spend` (the caller's own limits, see
    `Agent.absorb`), so delegation cannot escape either. A delegation re-run after a crash runs
    its sub-agent from the start; the sub-agent's tools see call ids derived from the
    delegate call's id and their position, the same as the first time when the sub-agent
    takes the same steps.
    """
    count = 0

    async def delegate(task: str) -> dict[str, Any]:
        """Hand a self-contained task to a throw-away helper with a fresh context; you get
        back only its conclusion (not its working)."""
        nonlocal count
        count += 1
        sub = Agent(
            f"{owner}.sub{count}",
            model if isinstance(model, Model) else model(),
            instructions=instructions,
            tools=tools,
            limits=limits,
            budget=budget,
            prices=prices,
            call_id_prefix=current_call_id() or f"{owner}.sub{count}",
        )
        report = await sub.run(task)
        if on_spend is not None:
            on_spend(report.usage, report.cost)
        return {
            "conclusion": report.answer if report.answer is not None else report.partial,
            "stop_reason": report.stop.reason,
            "detail": report.stop.detail,
            "steps": report.steps,
            "tokens": report.usage.total_tokens,
        }

    return tool(name=name)(delegate)
