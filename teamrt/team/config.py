"""How a team is configured: its members, their restart policy, and the team's budget."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from teamrt.agents.limits import Limits
from teamrt.agents.memory import Memory
from teamrt.agents.tools import Tool
from teamrt.errors import LimitExceeded, UsageError
from teamrt.models.base import Model, Usage

#: Envelope kinds that can wake an idle teammate besides a task (a request always does).
MailKind = Literal["message", "broadcast", "response"]
DEFAULT_WAKE_ON: tuple[MailKind, ...] = ("message", "broadcast")


@dataclass(frozen=True)
class RestartPolicy:
    """What to do when a teammate crashes: nothing (default), or restart with backoff.

    A restarted teammate resumes the task it was working on from its last completed step;
    a task that has crashed `task_attempts` incarnations is answered with a `TeammateCrashed`
    error instead, so one poisonous task cannot keep a teammate from the rest of its queue.
    """

    on_failure: bool = False
    max_restarts: int = 3
    backoff: float = 0.5
    max_backoff: float = 10.0
    task_attempts: int = 2

    def delay(self, restarts: int) -> float:
        return min(self.max_backoff, self.backoff * 2.0**restarts) * (0.5 + random.random() / 2)


@dataclass
class Teammate:
    """A member of the team: its model, instructions, tools, limits and restart policy.

    A teammate is one persistent agent per incarnation: its conversation carries across tasks
    (each task, message or broadcast joins the same context, kept within budget by `memory`),
    and a restarted incarnation takes it up from the journal. `context="per_task"` gives each
    task a fresh context instead.

    - `model` may be a factory, called once per incarnation (a restarted teammate gets a fresh
      model); a model with an `aclose()` method is closed when its incarnation ends.
    - `wake_on`: the kinds of mail (besides tasks) that wake an idle teammate for a round in
      which its model reads them; other mail waits for the next task.
    - `max_queue`: tasks waiting behind the current one; more are answered with `Busy`.
    - `mail_batch`: envelopes handed to the model at one step boundary (the rest wait, and the
      model is told how many).
    - `replicas`: serve this role with a pool of members named `<name>-1` ... `<name>-N`;
      `team.ask(name, ...)` goes to the least busy one.
    - `delegate=True` adds a `delegate` tool: a throw-away sub-agent with a fresh context and
      this teammate's own tools, which returns only its conclusion.
    - Tools named in `needs_approval` refuse to run until the teammate has sent a plan with
      `submit_plan` and the lead approved it (a real gate, in the tool wrapper).
    """

    name: str
    model: Model | Callable[[], Model]
    instructions: str = ""
    tools: Sequence[Tool | Callable[..., Any]] = ()
    limits: Limits | None = None
    memory: Memory | None = None
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    needs_approval: Sequence[str] = ()
    context: Literal["persistent", "per_task"] = "persistent"
    wake_on: Sequence[MailKind] = DEFAULT_WAKE_ON
    max_queue: int = 100
    mail_batch: int = 20
    replicas: int = 1
    delegate: bool = False
    prices: dict[str, tuple[float, float]] | None = None

    def __post_init__(self) -> None:
        if self.context not in ("persistent", "per_task"):
            raise UsageError(
                f"Teammate.context must be 'persistent' or 'per_task', not {self.context!r}"
            )
        for number in ("max_queue", "mail_batch", "replicas"):
            if getattr(self, number) < 1:
                raise UsageError(f"Teammate.{number} must be at least 1")
        unknown = set(self.wake_on) - {"message", "broadcast", "response"}
        if unknown:
            raise UsageError(f"Teammate.wake_on: unknown kinds {sorted(unknown)}")

    def make_model(self) -> Model:
        return self.model if isinstance(self.model, Model) else self.model()


class TeamBudget:
    """One ledger for the whole team, checked before every model call of every member.

    A cost budget needs every member's model to have a price (`Team(prices=...)`,
    `Teammate(prices=...)`); with `unpriced="tokens"` an unpriced model is counted in tokens
    only. A reply without usage from its server is counted from a local estimate.
    """

    def __init__(
        self,
        *,
        max_tokens: int | None = None,
        max_cost: float | None = None,
        deadline: float | None = None,
        unpriced: Literal["refuse", "tokens"] = "refuse",
    ) -> None:
        self.max_tokens, self.max_cost, self.deadline = max_tokens, max_cost, deadline
        self.unpriced = unpriced  # a model without a price: refuse to start, or count tokens
        self.usage = Usage()
        self.cost = 0.0
        self._started = anyio.current_time() if deadline is not None else 0.0

    def check(self) -> None:
        if self.max_tokens is not None and self.usage.total_tokens >= self.max_tokens:
            raise LimitExceeded(
                "team_max_tokens",
                self.max_tokens,
                self.usage.total_tokens,
                "the team's token budget is spent:",
            )
        if self.max_cost is not None and self.cost >= self.max_cost:
            raise LimitExceeded(
                "team_max_cost",
                self.max_cost,
                round(self.cost, 6),
                "the team's cost budget (USD) is spent:",
            )
        if self.deadline is not None:
            elapsed = anyio.current_time() - self._started
            if elapsed >= self.deadline:
                raise LimitExceeded(
                    "team_deadline",
                    self.deadline,
                    round(elapsed, 3),
                    "the team's wall-clock deadline (s) has passed:",
                )

    def time_left(self) -> float | None:
        """Seconds until the wall-clock deadline (None: no deadline). Model calls and tools
        that are running when it passes are stopped there, not only the next call."""
        if self.deadline is None:
            return None
        return self.deadline - (anyio.current_time() - self._started)

    def charge(self, usage: Usage, cost: float | None) -> None:
        self.usage = self.usage + usage
        self.cost += cost or 0.0


MemberState = Literal["starting", "idle", "working", "restarting", "stopped", "crashed"]


@dataclass
class MemberStatus:
    """What the team knows about one member, for status displays."""

    name: str
    state: MemberState = "starting"
    incarnation: str = ""
    step: int = 0
    tasks_done: int = 0
    rounds: int = 0  # rounds of mail read while not on a task
    restarts: int = 0
    last: str = ""
    queued: int = 0  # tasks waiting behind the current one
