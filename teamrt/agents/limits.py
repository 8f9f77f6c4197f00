"""Limits and budgets: a value object with pure checks, and the price table for costs.

Each check looks at the counters it is given and raises `LimitExceeded` carrying the limit, its
value and what was used ("the next model call would exceed max_steps=12 (used 12)"). Nothing
here does I/O or reads a clock: the caller passes the time.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from typing import Literal

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


_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|\d{4})$")


@functools.lru_cache(maxsize=256)
def _family(model: str) -> str:
    """A dated snapshot's family name ("gpt-4o-2024-08-06" -> "gpt-4o"), or the name itself."""
    return _SNAPSHOT.sub("", model)


def price_of(model: str, prices: dict[str, tuple[float, float]]) -> tuple[float, float] | None:
    """The (input, output) USD per million tokens of `model`; a dated snapshot
    ("gpt-4o-2024-08-06") takes its family's price unless it has its own."""
    price = prices.get(model)
    if price is None:
        family = _family(model)
        price = prices.get(family) if family != model else None
    return price


def prices_from_env(variable: str = "TEAMRT_PRICES") -> dict[str, tuple[float, float]]:
    """Prices from the environment: a JSON object of model name to [input, output] USD per
    million tokens, for example `{"llama3.1:8b": [0, 0], "my-model": [0.5, 1.5]}`."""
    text = os.environ.get(variable, "").strip()
    if not text:
        return {}
    try:
        raw = json.loads(text)
        return {str(k): (float(v[0]), float(v[1])) for k, v in raw.items()}
    except (ValueError, TypeError, IndexError, AttributeError) as exc:
        raise UsageError(
            f"{variable} must be a JSON object of model -> [input, output] USD per million "
            f"tokens, e.g. '{{\"my-model\": [0.5, 1.5]}}' ({exc})"
        ) from None


def cost_of(usage: Usage, model: str, prices: dict[str, tuple[float, float]]) -> float | None:
    """USD for `usage` on `model`, or None if the model has no price."""
    price = price_of(model, prices)
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
    - `model_timeout`: seconds one model call may take, retries included (None: no limit).
    - `max_model_time`: seconds a task may spend waiting for the model, in all.
    - `unpriced`: what a cost budget does with a model that has no price: `"refuse"` to start
      (the default), or count `"tokens"` only (the cost is then unknown, and only token
      budgets bind).
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
    model_timeout: float | None = 120.0
    max_model_time: float | None = None
    unpriced: Literal["refuse", "tokens"] = "refuse"

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
        self,
        *,
        steps: int,
        tokens: int,
        cost: float,
        elapsed: float,
        idle: float = 0.0,
        model_time: float = 0.0,
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
        if self.max_model_time is not None and model_time >= self.max_model_time:
            raise LimitExceeded(
                "max_model_time",
                self.max_model_time,
                round(model_time, 3),
                "the time spent waiting for the model (s) is spent:",
            )
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


def check_priced(
    limits: Limits, budget: object, model: str, prices: dict[str, tuple[float, float]]
) -> None:
    """A cost budget (the agent's `limits`, or a shared `budget`'s `max_cost`) needs the
    model's price, unless it was told to count tokens only (`unpriced='tokens'`)."""
    budgets = [(limits.max_cost, limits.unpriced, "the agent's")]
    if budget is not None:
        shared = getattr(budget, "max_cost", None)
        budgets.append((shared, getattr(budget, "unpriced", "refuse"), "the team's"))
    for max_cost, unpriced, whose in budgets:
        if max_cost is not None and unpriced == "refuse" and not price_of(model, prices):
            raise UsageError(
                f"{whose} cost budget (${max_cost:g}) cannot be kept with model {model!r}, "
                "which has no price: pass prices={name: (usd_per_m_input, "
                "usd_per_m_output)} (or TEAMRT_PRICES for the demos), or unpriced='tokens' "
                "to count tokens only"
            )


def check_priced_now(budget: object, model: str, prices: dict[str, tuple[float, float]]) -> None:
    """A shared cost budget may become known after an agent was made (a member in another
    process follows the lead's): an unpriced model stops at it (`LimitExceeded`), never runs
    free."""
    max_cost = getattr(budget, "max_cost", None)
    if (
        max_cost is not None
        and getattr(budget, "unpriced", "refuse") == "refuse"
        and not price_of(model, prices)
    ):
        raise LimitExceeded(
            "team_max_cost",
            max_cost,
            0,
            f"model {model!r} has no price, so the team's cost budget cannot be "
            "kept (give its price, or unpriced='tokens'):",
        )
