"""How a team is configured: its members, their restart policy, and the team's budget."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from teamrt.agents.limits import Limits
from teamrt.agents.mcp_tools import MCPTools
from teamrt.agents.memory import Memory
from teamrt.agents.output import FINAL_TOOL, OutputType
from teamrt.agents.tools import Tool
from teamrt.errors import LimitExceeded, UsageError
from teamrt.mail.outage import DEFAULT_STORE_OUTAGE, ride_out
from teamrt.mail.store import Store, run_local
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
    - `stream=True`: the model streams (when it can), and `team.status[name].text` shows what
      it is writing as it writes it (the live view prints it). A task asked with `team.stream`
      streams either way.
    - `delegate=True` adds a `delegate` tool: a throw-away sub-agent with a fresh context and
      this teammate's own tools, which returns only its conclusion.
    - Tools named in `needs_approval` refuse to run until the teammate has sent a plan with
      `submit_plan` and the lead approved it (a real gate, in the tool wrapper).
    - `mcp`: MCP servers (`MCPTools.stdio(...)`, `MCPTools.http(...)`) whose tools the teammate
      gets beside its own: connected when an incarnation starts (one that cannot connect
      crashes, and its restart policy applies), closed when it ends, so a restarted teammate
      gets a fresh server process. `needs_approval` names them as the model sees them.
    - `output_type`: every task is answered with a value of this type (a pydantic model, or
      any type a pydantic `TypeAdapter` takes), validated as `Agent(output_type=...)` does; the
      `task_result` carries it as JSON and `team.ask(name, task, output_type=...)` returns it
      typed. Rounds of mail stay untyped.
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
    stream: bool = False
    mcp: Sequence[MCPTools] = ()
    output_type: Any = None
    #: `output_type` made ready for the agent (its schema and validator), built once
    typed: OutputType | None = field(default=None, init=False, repr=False, compare=False)

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
        if self.output_type is not None:
            self.typed = OutputType(self.output_type)  # a type pydantic cannot take fails here
            names = [
                t.name if isinstance(t, Tool) else getattr(t, "__name__", "") for t in self.tools
            ]
            if FINAL_TOOL in names:
                raise UsageError(
                    f"teammate {self.name!r} has a tool named {FINAL_TOOL!r}, the name of a "
                    "typed answer's tool: rename the tool"
                )

    def make_model(self) -> Model:
        return self.model if isinstance(self.model, Model) else self.model()


class TeamBudget:
    """One ledger for the whole team, checked before every model call of every member.

    A cost budget needs every member's model to have a price (`Team(prices=...)`,
    `Teammate(prices=...)`); with `unpriced="tokens"` an unpriced model is counted in tokens
    only. A reply without usage from its server is counted from a local estimate.

    A `Team` publishes its budget in the team's store (`budget.json` in a team directory), so
    members run by other processes (`teamrt run-agent`, which follows it with
    `TeamBudget.follow`) draw on the same ledger: spend is added under the store's lock and
    every check reads what all processes spent, just before each model call starts (so a
    call never starts once a recorded spend used the budget up; calls already running when
    it runs out finish, and are charged). Spend charged before the ledger is published
    (`charge` on a budget no team has used yet, or spend in another store) is carried into
    it. The wall-clock deadline is a point in time in the ledger, the same for every process.
    Reads and charges wait out a store outage for `store_outage` seconds (the team's).
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
        self._usage = Usage()
        self._cost = 0.0
        self._started = anyio.current_time() if deadline is not None else 0.0
        self._deadline_at: float | None = None  # wall clock, once published or followed
        self._store: Store | None = None
        self.store_outage = DEFAULT_STORE_OUTAGE

    async def _read(self) -> dict[str, Any] | None:
        store = self._store
        assert store is not None
        return await ride_out(store.ledger_read, "read the budget ledger", self.store_outage)

    async def _update(
        self, change: Callable[[dict[str, Any] | None], dict[str, Any] | None]
    ) -> dict[str, Any] | None:
        store = self._store
        assert store is not None
        return await ride_out(
            lambda: store.ledger_update(change), "update the budget ledger", self.store_outage
        )

    @property
    def usage(self) -> Usage:
        """Tokens spent by the whole team (every process, once published; on a network store,
        as of this process's last check or charge: `await refresh()` reads it now)."""
        self._read_local()
        return self._usage

    @property
    def cost(self) -> float:
        """USD spent by the whole team (like `usage`)."""
        self._read_local()
        return self._cost

    def _read_local(self) -> None:
        store = self._store
        if store is not None and store.capabilities.opens_locally:
            self._sync(run_local(store.ledger_read(), "reading the budget ledger"))

    async def refresh(self) -> None:
        """Read the team's ledger now (spend by every process)."""
        if self._store is not None:
            self._sync(await self._read())

    @property
    def limited(self) -> bool:
        return any(v is not None for v in (self.max_tokens, self.max_cost, self.deadline))

    @classmethod
    async def follow(
        cls, store: Store, *, store_outage: float = DEFAULT_STORE_OUTAGE
    ) -> TeamBudget:
        """The budget the team's lead published in `store` (limits and spend), for a member run
        by another process; no limits while none is published (each check reads it again)."""
        budget = cls()
        budget._store, budget.store_outage = store, store_outage
        budget._sync(await budget._read())
        return budget

    def published_in(self, store: Store) -> bool:
        """Whether this budget's ledger is the one in `store` (published or followed there)."""
        return self._store is store

    async def publish(self, store: Store, *, store_outage: float | None = None) -> None:
        """Make this the team's ledger in `store`, shared by every process, starting from what
        this budget has spent so far (charged before, or in the store it was published in)."""
        if store_outage is not None:
            self.store_outage = store_outage
        if self._store is not None and self._store is not store:
            self._sync(await self._read())  # what was spent there is spent
        self._store = store
        self._deadline_at = time.time() + self.deadline if self.deadline is not None else None
        ledger = {
            "max_tokens": self.max_tokens,
            "max_cost": self.max_cost,
            "deadline": self.deadline,
            "deadline_at": self._deadline_at,
            "unpriced": self.unpriced,
            "requests": self._usage.requests,
            "input_tokens": self._usage.input_tokens,
            "output_tokens": self._usage.output_tokens,
            "cost": self._cost,
        }
        self._sync(await self._update(lambda _old: ledger))

    def _sync(self, ledger: dict[str, Any] | None) -> None:
        if not ledger:  # none published (or the lead runs without one): no limits
            ledger = {"max_tokens": None, "max_cost": None, "deadline": None}
        self.max_tokens, self.max_cost = ledger.get("max_tokens"), ledger.get("max_cost")
        self.deadline, self._deadline_at = ledger.get("deadline"), ledger.get("deadline_at")
        self.unpriced = ledger.get("unpriced", "refuse")
        self._usage = Usage(
            requests=int(ledger.get("requests", 0)),
            input_tokens=int(ledger.get("input_tokens", 0)),
            output_tokens=int(ledger.get("output_tokens", 0)),
        )
        self._cost = float(ledger.get("cost", 0.0))

    async def check(self) -> None:
        """Raise `LimitExceeded` if the team's budget is spent (read from the ledger)."""
        if self._store is not None:
            self._sync(await self._read())
        if self.max_tokens is not None and self._usage.total_tokens >= self.max_tokens:
            raise LimitExceeded(
                "team_max_tokens",
                self.max_tokens,
                self._usage.total_tokens,
                "the team's token budget is spent:",
            )
        if self.max_cost is not None and self._cost >= self.max_cost:
            raise LimitExceeded(
                "team_max_cost",
                self.max_cost,
                round(self._cost, 6),
                "the team's cost budget (USD) is spent:",
            )
        left = self.time_left()
        if left is not None and left <= 0 and self.deadline is not None:
            raise LimitExceeded(
                "team_deadline",
                self.deadline,
                round(self.deadline - left, 3),
                "the team's wall-clock deadline (s) has passed:",
            )

    def time_left(self) -> float | None:
        """Seconds until the wall-clock deadline (None: no deadline). Model calls and tools
        that are running when it passes are stopped there, not only the next call."""
        if self._deadline_at is not None:
            return self._deadline_at - time.time()
        if self.deadline is None:
            return None
        return self.deadline - (anyio.current_time() - self._started)

    async def charge(self, usage: Usage, cost: float | None) -> None:
        """Add spend to the ledger (every process's checks see it)."""
        if self._store is None:
            self._usage = self._usage + usage
            self._cost += cost or 0.0
            return

        def add(ledger: dict[str, Any] | None) -> dict[str, Any] | None:
            if ledger is None:
                return None
            return {
                **ledger,
                "requests": int(ledger.get("requests", 0)) + usage.requests,
                "input_tokens": int(ledger.get("input_tokens", 0)) + usage.input_tokens,
                "output_tokens": int(ledger.get("output_tokens", 0)) + usage.output_tokens,
                "cost": float(ledger.get("cost", 0.0)) + (cost or 0.0),
            }

        self._sync(await self._update(add))


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
    text: str = ""  # the end of what the model is writing now (with `Teammate(stream=True)`)
    tokens: int = 0  # spent by this member's tasks and rounds so far
    cost: float = 0.0
    outage: str = ""  # the store outage that stopped it (longer than the tolerance), if one did
