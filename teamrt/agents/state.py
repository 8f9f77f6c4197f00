"""An agent's state as data, and the report every run ends with.

All mutable state of a run lives in one `AgentState`: it can be logged, saved after each step,
and resumed after a crash. A run always ends in a `RunReport` that says why it stopped (which
limit, with its numbers), what it did, what it cost, and the answer or the partial work.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from teamrt._assemble import assemble
from teamrt.models.base import ChatMessage, Usage

StopReason = Literal[
    "answer",
    "cancelled",
    "invalid_output",
    "limit",
    "malformed_reply",
    "model_error",
    "shutdown",
    "truncated",
]

#: How many ids of handled inputs (tasks, messages) a state remembers, to drop redeliveries.
HANDLED_MEMORY = 1024

#: How many recent tool-call signatures and result digests the no-progress checks remember.
#: Bounded, so that the state saved after a step does not grow with the run.
PROGRESS_MEMORY = 256


class Stop(BaseModel):
    """Why a run stopped."""

    model_config = ConfigDict(frozen=True)

    reason: StopReason
    detail: str
    limit: str | None = None  # for reason "limit": which one
    value: float | None = None  # its configured value
    used: float | None = None  # what had been used


class OpenStep(BaseModel):
    """A step whose model reply is recorded but whose tool calls have not all finished: what
    a resumed run picks up (only the calls without a result run again)."""

    reply: ChatMessage
    finish_reason: str | None = None
    results: dict[str, ChatMessage] = Field(default_factory=dict)  # call id -> its result

    @classmethod
    def of(cls, reply: ChatMessage, finish_reason: str | None) -> OpenStep:
        """The step of a reply just made (its parts are validated already: not again)."""
        if (
            cls is OpenStep
            and type(reply) is ChatMessage
            and (finish_reason is None or type(finish_reason) is str)
        ):
            values: dict[str, Any] = {"reply": reply, "finish_reason": finish_reason, "results": {}}
            return assemble(cls, values, {"reply", "finish_reason"})
        return cls(reply=reply, finish_reason=finish_reason)


class AgentState(BaseModel):
    """Everything about a run that changes, in one serialisable place.

    With a persistent context (a teammate), one state carries the conversation across tasks:
    `messages` keeps growing (kept within budget by memory) and the counters are per task.
    """

    agent: str
    task: str
    messages: list[ChatMessage]
    pinned: int = 1  # leading messages (instructions, task) that memory never drops
    task_id: str | None = None  # the id of the request (or round) this run serves
    task_index: int | None = None  # where the current task's message is in `messages`
    tasks: int = 1  # tasks (and rounds of mail) this conversation has served
    idle: float = 0.0  # seconds spent in waiting tools (wait_for_messages) this task
    model_time: float = 0.0  # seconds spent waiting for the model this task
    attempts: int = 0  # HTTP requests made for this task's model calls (retries included)
    rate_limited: int = 0  # of which were answered 429
    usage_estimated: bool = False  # some usage was estimated locally (the server sent none)
    truncated: str = ""  # text of replies cut off by the length limit, awaiting the rest
    handled: list[str] = Field(default_factory=list)  # ids of inputs already taken in
    open_step: OpenStep | None = None
    steps: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    consecutive_errors: int = 0
    stale_steps: int = 0
    nudges: int = 0  # malformed replies in a row
    output_errors: int = 0  # typed answers rejected this task (the first goes back, once)
    usage: Usage = Usage()
    cost: float = 0.0
    cost_known: bool = True
    elapsed: float = 0.0  # wall-clock seconds across every run of this state
    context_tokens: int = 0  # estimate of the conversation's size
    compactions: int = 0
    call_counts: dict[str, int] = Field(default_factory=dict)  # signature -> times called
    seen_results: list[str] = Field(default_factory=list)  # digests of recent tool results
    answer: str | None = None  # a typed run's answer is the value as JSON text
    stop: Stop | None = None

    # The loop sets about ten fields a step. No assignment is validated and the state has no
    # private attributes, so a field is set straight into the instance's dict and noted as set
    # (what pydantic's own path does, without its checks); any other name goes that path (and is
    # refused), and a subclass that validates assignments or is frozen takes it for every name.
    def __setattr__(self, name: str, value: Any) -> None:
        if name in _STATE_FIELDS:
            self.__dict__[name] = value
            self.__pydantic_fields_set__.add(name)
        else:
            BaseModel.__setattr__(self, name, value)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        config = cls.model_config
        if config.get("validate_assignment") or config.get("frozen"):
            cls.__setattr__ = BaseModel.__setattr__  # type: ignore[method-assign,assignment]

    def count_call(self, signature: str) -> int:
        """How many times this exact call was made before; then remember one more."""
        counts = self.call_counts  # insertion-ordered: re-inserting moves a key to the end
        before = counts.pop(signature, 0)
        counts[signature] = before + 1
        if len(counts) > PROGRESS_MEMORY:
            del counts[next(iter(counts))]
        return before

    def remember_handled(self, ids: list[str]) -> None:
        """Remember inputs (envelope ids) as taken in, so a redelivery is recognised."""
        if not ids:
            return
        known = set(self.handled)
        for id_ in ids:
            if id_ not in known:
                known.add(id_)
                self.handled.append(id_)
        if len(self.handled) > HANDLED_MEMORY:
            del self.handled[: len(self.handled) - HANDLED_MEMORY]

    def is_new_result(self, digest: str) -> bool:
        """Whether a tool result (its digest) is new among the recent ones; then remember it."""
        if digest in self.seen_results:
            return False
        self.remember_result(digest)
        return True

    def remember_result(self, digest: str) -> str | None:
        """Remember a new result's digest; returns the oldest one, if it was forgotten to keep
        the memory within `PROGRESS_MEMORY`."""
        self.seen_results.append(digest)
        if len(self.seen_results) > PROGRESS_MEMORY:
            return self.seen_results.pop(0)
        return None


#: The fields `AgentState.__setattr__` sets straight into the instance's dict.
_STATE_FIELDS = frozenset(AgentState.model_fields)


class RunReport(BaseModel):
    """How a run ended: the reason, the work done, the spend, the answer or partial work.

    A typed run (`Agent(..., output_type=...)`) that ended with an answer carries the validated
    value as `output` (and its JSON text as `answer`); `output_name` names the type. One whose
    model failed validation twice stops as `invalid_output`, with the errors in the detail and
    the rejected answer as `partial`.
    """

    model_config = ConfigDict(frozen=True)

    agent: str
    task: str
    stop: Stop
    answer: str | None
    partial: str | None  # the last thing the agent produced, when there is no answer
    steps: int
    tool_calls: int
    tool_errors: int
    usage: Usage
    cost: float | None  # USD; None if the model has no price
    elapsed: float
    compactions: int
    task_id: str | None = None
    idle: float = 0.0  # seconds spent waiting for messages
    model_time: float = 0.0  # seconds spent waiting for the model
    attempts: int = 0  # HTTP requests behind the model calls (retries = attempts - steps)
    rate_limited: int = 0  # attempts answered 429 (rate limited)
    usage_estimated: bool = False  # tokens partly estimated locally (no usage from the server)
    output: Any = None  # a typed run's validated answer
    output_name: str | None = None  # the name of its type (None: an untyped run)

    @property
    def retries(self) -> int:
        return max(0, self.attempts - self.steps)

    @property
    def ok(self) -> bool:
        return self.stop.reason == "answer"

    def summary(self) -> str:
        cost = "cost unknown" if self.cost is None else f"${self.cost:.4f}"
        head = f"{self.agent}: stopped ({self.stop.reason}): {self.stop.detail}"
        retries = (
            f", {self.retries} retries ({self.rate_limited} rate limited)" if self.retries else ""
        )
        tokens = f"{self.usage.total_tokens}{' (estimated)' if self.usage_estimated else ''}"
        return (
            f"{head}; {self.steps} steps, {self.tool_calls} tool calls "
            f"({self.tool_errors} failed), {tokens} tokens, {cost}, "
            f"{self.elapsed:.2f}s{retries}"
        )
