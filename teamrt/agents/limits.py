"""Limits and budgets: a value object with pure checks, and the price table for costs.

Each check looks at the counters it is given and raises `LimitExceeded` carrying the limit, its
value and what was used ("the next model call would exceed max_steps=12 (used 12)"). Nothing
here does I/O or reads a clock: the caller passes the time.
"""

from __future__ import annotations

from dataclasses import dataclass

from teamrt.errors import LimitExceeded, UsageError
from teamrt.models.base import Usage

#: USD per million tokens (input, output), from OpenAI's published price list as of PRICES_DATE.
#: Prices change: pass your own `prices=` to an agent for other models or newer prices.
PRICES_DATE = "2025-06-10"
PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "o3": (2.00, 8.00),
    "o4-mini": (1.10, 4.40),
    "scripted": (0.0, 0.0),
    "function": (0.0, 0.0),
}


def cost_of(usage: Usage, model: str, prices: dict[str, tuple[float, float]]) -> float | None:
    """USD for `usage` on `model`, or None if the model has no price."""
    price = prices.get(model)
    if price is None:
        return None
    return (usage.input_tokens * price[0] + usage.output_tokens * price[1]) / 1_000_000


@dataclass(frozen=True)
class Limits:
    """When an agent must stop, whatever the model wants.

    - `max_steps`: model calls.
    - `max_tool_calls`: tool calls (side effects are the expensive, dangerous part).
    - `max_consecutive_errors`: failed tool calls in a row.
    - `max_tokens`, `max_cost`: token and USD budgets over the whole run.
    - `deadline`: seconds of wall-clock time for the run.
    - `max_repeats`: the same tool with the same arguments, this many times in all, is a loop.
    - `max_stale_steps`: this many steps in a row that bring nothing new (every tool result was
      seen before) is no progress. Steps that waited for other agents (`wait_for_messages`)
      are not counted: waiting is not stalling.
    - `max_idle`: seconds a task may spend in waiting tools, in all (None: no limit).
    """

    max_steps: int = 30
    max_tool_calls: int = 60
    max_consecutive_errors: int = 3
    max_tokens: int | None = None
    max_cost: float | None = None
    deadline: float | None = None
    max_repeats: int = 3
    max_stale_steps: int = 4
    max_idle: float | None = 600.0

    def __post_init__(self) -> None:
        for name in (
            "max_steps",
            "max_tool_calls",
            "max_consecutive_errors",
            "max_repeats",
            "max_stale_steps",
        ):
            if getattr(self, name) < 1:
                raise UsageError(f"Limits.{name} must be at least 1")

    def check_model_call(
        self, *, steps: int, tokens: int, cost: float, elapsed: float, idle: float = 0.0
    ) -> None:
        """Before a model call: would it go over a limit?"""
        if steps >= self.max_steps:
            raise LimitExceeded(
                "max_steps", self.max_steps, steps, "the next model call would exceed"
            )
        if self.max_tokens is not None and tokens >= self.max_tokens:
            raise LimitExceeded("max_tokens", self.max_tokens, tokens, "the token budget is spent:")
        if self.max_cost is not None and cost >= self.max_cost:
            raise LimitExceeded(
                "max_cost", self.max_cost, round(cost, 6), "the cost budget (USD) is spent:"
            )
        self.check_deadline(elapsed)
        if self.max_idle is not None and idle >= self.max_idle:
            raise LimitExceeded(
                "max_idle",
                self.max_idle,
                round(idle, 3),
                "waiting for other agents took too long: idle seconds",
            )

    def check_deadline(self, elapsed: float) -> None:
        if self.deadline is not None and elapsed >= self.deadline:
            raise LimitExceeded(
                "deadline",
                self.deadline,
                round(elapsed, 3),
                "the wall-clock deadline (s) has passed:",
            )

    def check_tool_call(self, *, tool_calls: int, repeats: int, signature: str) -> None:
        """Before a tool call: budget, and the same call over and over."""
        if tool_calls >= self.max_tool_calls:
            raise LimitExceeded(
                "max_tool_calls", self.max_tool_calls, tool_calls, "the next tool call would exceed"
            )
        if repeats >= self.max_repeats:
            raise LimitExceeded(
                "max_repeats",
                self.max_repeats,
                repeats,
                f"no progress: {signature} was already called with the same "
                "arguments; calling again would exceed",
            )

    def check_after_tools(self, *, consecutive_errors: int, stale_steps: int) -> None:
        """After a step's tool calls: stuck on errors, or learning nothing new?"""
        if consecutive_errors >= self.max_consecutive_errors:
            raise LimitExceeded(
                "max_consecutive_errors",
                self.max_consecutive_errors,
                consecutive_errors,
                "tool calls keep failing:",
            )
        if stale_steps >= self.max_stale_steps:
            raise LimitExceeded(
                "max_stale_steps",
                self.max_stale_steps,
                stale_steps,
                "no progress: steps in a row brought nothing new,",
            )
