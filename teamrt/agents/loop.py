"""One agent's loop: the model decides, the tools act, the results go back, until a stop.

Theory of operation. All state is an `AgentState`. Each step checks the limits, takes in what
arrived meanwhile (the inbound hook), compacts the context if it is over budget, calls the model,
and hands the reply to `decide()`, a pure function that says whether it is an answer, tool calls,
or malformed. The reply is journaled before any tool runs; the reply's tool calls then run
concurrently (bounded; a `sequential` tool runs alone) and each result is journaled as it
comes, so a resumed run re-runs only the calls that had not finished, with the same call ids.
Results go back to the model in call order. A malformed reply gets one corrective nudge; a second
in a row stops the run. Every way out of the loop produces a `RunReport`.

A typed agent (`output_type=...`) asks for its answer as JSON that matches the type's schema:
through the model's structured output when the model says it does (`StructuredOutputModel`), or
else through a `final_answer` tool whose parameters are the schema. An answer that does not
validate goes back to the model once, as data (the tool's error result, or a user message with
the errors); a second one stops the run as `invalid_output`.

With `keep_context=True` (a teammate) the conversation carries across `run()` calls: each task
is appended to it, the counters and limits are per task, and memory keeps it within budget.

The driver never raises for the model's or the tools' misbehaviour: that is data for the report.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

import anyio

from teamrt import telemetry
from teamrt.agents.journal import Journal, Transcript
from teamrt.agents.limits import PRICES, Limits, cost_of, price_of
from teamrt.agents.memory import Memory, context_tokens
from teamrt.agents.output import FINAL_TOOL, Accepted, OutputType, Rejected
from teamrt.agents.state import (
    HANDLED_MEMORY,
    AgentState,
    OpenStep,
    RunReport,
    Stop,
    StopReason,
)
from teamrt.agents.tools import (
    Fence,
    Tool,
    Toolbox,
    ToolResult,
    _current_fence,
    cancelled_for_real,
)
from teamrt.errors import LimitExceeded, ModelError, StopRequested, TaskWithdrawn, UsageError
from teamrt.models.base import (
    ChatMessage,
    Model,
    ModelReply,
    OutputSpec,
    StreamingModel,
    StructuredOutputModel,
    StructuredStreamingModel,
    TextDelta,
    ToolCall,
    Usage,
    message_tokens,
)

log = logging.getLogger("teamrt.agents")

CONTINUE = (
    "Your last reply was cut off by the output length limit. Continue exactly where it "
    "stopped, without repeating anything."
)
NUDGE = (
    "Your last reply could not be used: {reason}. Reply with a valid tool call (arguments "
    "must be a JSON object matching the tool's schema) or with {answer}."
)
#: How a nudge asks for the answer: untyped, typed with structured output, typed with the tool.
ANSWER_AS_TEXT = "your final answer as text"
ANSWER_AS_JSON = "your final answer as JSON matching the required schema"
ANSWER_BY_TOOL = f"a call of {FINAL_TOOL} with your final answer"
#: The user message that gives a rejected typed answer back to the model (structured output).
REJECTED = (
    "Your answer does not match the required {name} schema: {errors}. Reply with the corrected "
    "answer: only JSON that matches the schema."
)
#: The same, to a model that was to answer through the final-answer tool and wrote text.
REJECTED_TEXT = (
    "Give your final answer by calling " + FINAL_TOOL + " with arguments that match its "
    "schema ({name}); your reply was not such a call and its text is not a valid answer: "
    "{errors}."
)
#: Typed answers rejected in one task that go back to the model; the next one stops the run.
OUTPUT_RETRIES = 1
#: The result of an accepted final-answer call, and of the other calls of its reply (not run).
ACCEPTED = {"ok": "answer accepted"}
NOT_RUN_ENDED = "NotRun: the final answer ended the task"
NOT_RUN_BESIDE = (
    "NotRun: calls beside a final answer are not run; make them again if they are still needed"
)


# --- the decide step: pure ----------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    text: str


@dataclass(frozen=True)
class CallTools:
    calls: tuple[ToolCall, ...]


@dataclass(frozen=True)
class Malformed:
    reason: str


@dataclass(frozen=True)
class Truncated:
    text: str


def decide(reply: ModelReply) -> Answer | CallTools | Malformed | Truncated:
    """What a model reply means. Tool calls win over text (the text is a note to itself); text
    cut off by the length limit is not an answer."""
    return _decide(reply.text, reply.tool_calls, reply.finish_reason, [])


def _decide(
    text: str | None,
    tool_calls: tuple[ToolCall, ...],
    finish_reason: str | None,
    parsed: list[dict[str, Any]],
) -> Answer | CallTools | Malformed | Truncated:
    """`decide` on a reply's parts (a recorded step has them as a message, not a reply); the
    calls' arguments, parsed on the way, are appended to `parsed` (for their signatures)."""
    if tool_calls:
        for call in tool_calls:
            try:
                arguments = json.loads(call.arguments or "{}")
            except ValueError as exc:
                return Malformed(f"the arguments of {call.name} are not valid JSON ({exc})")
            if not isinstance(arguments, dict):
                return Malformed(f"the arguments of {call.name} are not a JSON object")
            parsed.append(arguments)
        return CallTools(tool_calls)
    if finish_reason == "length":
        return Truncated(text or "")
    if text and text.strip():
        return Answer(text)
    return Malformed("it had neither text nor a tool call")


_CANONICAL_JSON = json.JSONEncoder(sort_keys=True)  # json.dumps(value, sort_keys=True)
# the same, made once: `encode` makes its C encoder anew each call (no markers: what it gets
# comes from json.loads, which makes no cycles)
_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)
_canonical_chunks: Any = (
    _make_encoder(
        None,
        _CANONICAL_JSON.default,
        json.encoder.encode_basestring_ascii,
        None,
        ": ",
        ", ",
        True,
        False,
        True,
    )
    if _make_encoder is not None
    else None
)


def signature(call: ToolCall) -> str:
    """A tool call's identity for loop detection: name and canonical arguments."""
    try:
        arguments = json.loads(call.arguments or "{}")
    except ValueError:
        return f"{call.name}({call.arguments})"
    return _signature_of(call, arguments)


def _signature_of(call: ToolCall, arguments: Any) -> str:
    """`signature(call)` given its arguments as parsed already."""
    if _canonical_chunks is None:
        return f"{call.name}({_CANONICAL_JSON.encode(arguments)})"
    return f"{call.name}({''.join(_canonical_chunks(arguments, 0))})"


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


# --- events: what a run looks like as it happens -------------------------------------------------


@dataclass(frozen=True)
class ToolCallStarted:
    """The loop is about to run a tool call."""

    call: ToolCall


@dataclass(frozen=True)
class ToolCallFinished:
    """A tool call's result, as the model will read it."""

    call_id: str
    name: str
    content: str
    ok: bool


#: What `Agent.stream` yields: text as the model writes it, tool calls and their results, and
#: last the run's report.
AgentEvent = TextDelta | ToolCallStarted | ToolCallFinished | RunReport
EventSink = Callable[[AgentEvent], Awaitable[None]]

# --- the driver ---------------------------------------------------------------------------------

StepHook = Callable[[AgentState], Awaitable[list[ChatMessage]]]

#: Tool calls of one reply that run at the same time, at most.
DEFAULT_MAX_PARALLEL_TOOLS = 16


@runtime_checkable
class Inbound(Protocol):
    """Where an agent's inputs come from between steps (a teammate's inbox, say).

    `before_step` returns messages to add before the next model call (raising `StopRequested`
    ends the run cleanly, resumable). `handled` returns the ids of the inputs shown to the model
    since it was last called (by `before_step` or by a tool); the agent records them in its
    state and journal, then calls `recorded`: only then may the source forget them (ack).
    """

    async def before_step(self, state: AgentState) -> list[ChatMessage]: ...

    def handled(self) -> list[str]: ...

    def recorded(self) -> None: ...


@dataclass
class _CallbackInbound:
    """An `Inbound` from a plain step callback (nothing to acknowledge)."""

    callback: StepHook

    async def before_step(self, state: AgentState) -> list[ChatMessage]:
        return await self.callback(state)

    def handled(self) -> list[str]:
        return []

    def recorded(self) -> None:
        pass


class SharedBudget(Protocol):
    """A budget several agents draw on (see `teamrt.team.TeamBudget`)."""

    async def check(self) -> None:
        """Raise LimitExceeded if the budget is spent."""

    async def charge(self, usage: Usage, cost: float | None) -> None: ...


class _StepWork:
    """What one step's tool calls produced, in call order."""

    __slots__ = (
        "appended",
        "arguments",
        "calls",
        "checkpointed",
        "digests",
        "reply_calls",
        "results",
    )

    def __init__(
        self,
        results: dict[str, ChatMessage],
        reply_calls: tuple[ToolCall, ...],
        checkpointed: bool = False,
    ):
        self.results = results
        self.reply_calls = reply_calls
        # a checkpoint was passed since the last tool call (the step's model call suspended)
        self.checkpointed = checkpointed
        self.appended: list[ChatMessage] = []  # after the results
        self.arguments: list[dict[str, Any]] = []  # of the calls, parsed
        self.calls: list[str] = []  # signatures counted for repeats
        self.digests: list[str] = []


class _ResultIndex:
    """A state's recent result digests (`AgentState.seen_results`, a list: what is saved) as a
    set as well, for the no-progress check (a scan of 256 digests cost more than the rest of
    the check). Made again when the state, or its list, is another one."""

    __slots__ = ("_results", "_set")

    def __init__(self) -> None:
        self._results: list[str] | None = None
        self._set: set[str] = set()

    def is_new(self, state: AgentState, digest: str) -> bool:
        """`state.is_new_result(digest)`, by the set."""
        results = state.seen_results
        seen = self._set
        if results is not self._results or len(seen) != len(results):
            self._results, seen = results, set(results)
            self._set = seen
        if digest in seen:
            return False
        seen.add(digest)
        dropped = state.remember_result(digest)
        if dropped is not None:
            seen.discard(dropped)
        return True


class Agent:
    """An agent: a model, tools, limits, memory, and optionally files to persist its run.

        agent = Agent("researcher", model, instructions="...", tools=[search])
        report = await agent.run("What is inotify?")

    `keep_context`: carry the conversation across `run()` calls (a teammate); by default each
    run starts afresh. `inbound` (or a plain `on_step` callback): inputs that arrive between
    steps, see `Inbound`. `budget`: a budget shared with other agents, checked before every
    model call and charged after it. `prices`: USD per million tokens, by model name.
    `checkpoint`: a journal path; the run can be resumed from it after a crash (`resume()`).
    `transcript`: a path that receives every model call and reply. `directory`: both, as
    `<directory>/<name>.state.jsonl` and `<directory>/<name>.transcript.jsonl`.
    `max_parallel_tools`: tool calls of one reply that may run at the same time.
    `on_event`: an async callback that gets every `AgentEvent` as it happens (with it, a model
    that can stream does: its text arrives as `TextDelta`s); `stream()` is the same as an async
    iterator. `call_id_prefix`: tools see `current_call_id()` as `<prefix>:<step>.<n>` (the n-th
    call of that step) instead of the model's id, so a run repeated from the start (a sub-agent
    whose delegate call is re-run after a crash) gives each call the same key as the first time.
    `fence` (an attribute; a Team sets it to the teammate's lease): checked before each tool
    call (a lost lease raises `LeaseLost` and the call does not run), its token shown to tools
    as `current_fence()`.
    `output_type`: a typed answer (a pydantic model, or any type a pydantic `TypeAdapter`
    takes, such as a dataclass, a TypedDict or `list[int]`): the report's `output` is the
    validated value (see the module docstring); it may be changed between runs.
    """

    def __init__(
        self,
        name: str,
        model: Model,
        *,
        instructions: str = "",
        tools: Iterable[Tool | Callable[..., Any]] = (),
        limits: Limits | None = None,
        memory: Memory | None = None,
        prices: dict[str, tuple[float, float]] | None = None,
        checkpoint: str | os.PathLike[str] | None = None,
        transcript: str | os.PathLike[str] | None = None,
        directory: str | os.PathLike[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_step: StepHook | None = None,
        inbound: Inbound | None = None,
        budget: SharedBudget | None = None,
        keep_context: bool = False,
        max_parallel_tools: int = DEFAULT_MAX_PARALLEL_TOOLS,
        call_id_prefix: str | None = None,
        on_event: EventSink | None = None,
        output_type: Any = None,
    ) -> None:
        self.name = name
        if inbound is None and on_step is not None:
            inbound = _CallbackInbound(on_step)
        self.inbound = inbound
        self.budget = budget
        self.model = model
        self.instructions = instructions
        self.toolbox = tools if isinstance(tools, Toolbox) else Toolbox(tools)
        self.limits = limits or Limits()
        self.memory = memory or Memory()
        self.prices = {**PRICES, **(prices or {})}
        self.keep_context = keep_context
        self.call_id_prefix = call_id_prefix
        self.on_event = on_event  # gets every event; the model then streams if it can
        # checked with the store before each tool call, its token shown as current_fence()
        # (a teammate's lease; None for an agent run on its own)
        self.fence: Fence | None = None
        if max_parallel_tools < 1:
            raise UsageError("max_parallel_tools must be at least 1")
        self._parallel = anyio.CapacityLimiter(max_parallel_tools)
        self._model_deadlines = _CallDeadlines()
        self._in_flight: anyio.CancelScope | None = None  # the model call or tools running now
        self._withdrawn: str | None = None  # why `interrupt` stopped the run
        self._results = _ResultIndex()
        if directory is not None:
            checkpoint = checkpoint or Path(directory) / f"{name}.state.jsonl"
            transcript = transcript or Path(directory) / f"{name}.transcript.jsonl"
        self.journal = Journal(checkpoint) if checkpoint is not None else None
        self.transcript = Transcript(transcript) if transcript is not None else None
        self.clock = clock
        self.state: AgentState | None = None
        self._output: OutputType | None = None
        self._accepted: Accepted | None = None  # the last answer accepted, with its value
        self._takes_schema: tuple[Model | None, bool] = (None, False)  # model, structured?
        self.output_type = output_type
        self._check_priced(model.name)

    @property
    def output_type(self) -> Any:
        """The type of the answer (None: an untyped agent, whose answer is text)."""
        return self._output.type if self._output is not None else None

    @output_type.setter
    def output_type(self, value: Any) -> None:
        if value is None:
            self._output = None
            return
        if FINAL_TOOL in self.toolbox:
            raise UsageError(
                f"agent {self.name!r} has a tool named {FINAL_TOOL!r}, the name of a typed "
                "agent's answer tool: rename the tool"
            )
        self._output = value if isinstance(value, OutputType) else OutputType(value)

    def _structured(self) -> OutputSpec | None:
        """The answer's schema for the model, when this run is typed and the model takes it
        as structured output (otherwise a typed run offers the final-answer tool)."""
        if self._output is None:
            return None
        model = self.model
        if self._takes_schema[0] is not model:  # a protocol check costs ~30 us: once a model
            takes = isinstance(model, StructuredOutputModel) and model.structured_output
            self._takes_schema = (model, takes)
        return self._output.spec if self._takes_schema[1] else None

    def _check_priced_now(self) -> None:
        """A shared cost budget may become known after this agent was made (a member in
        another process follows the lead's): an unpriced model stops at it, never runs free."""
        max_cost = getattr(self.budget, "max_cost", None)
        if (
            max_cost is not None
            and getattr(self.budget, "unpriced", "refuse") == "refuse"
            and not price_of(self.model.name, self.prices)
        ):
            raise LimitExceeded(
                "team_max_cost",
                max_cost,
                0,
                f"model {self.model.name!r} has no price, so the team's cost budget cannot be "
                "kept (give its price, or unpriced='tokens'):",
            )

    def _check_priced(self, model: str) -> None:
        """A cost budget (the agent's or a shared one) needs the model's price, unless it was
        told to count tokens only."""
        budgets = [(self.limits.max_cost, self.limits.unpriced, "the agent's")]
        if self.budget is not None:
            shared = getattr(self.budget, "max_cost", None)
            budgets.append((shared, getattr(self.budget, "unpriced", "refuse"), "the team's"))
        for max_cost, unpriced, whose in budgets:
            if max_cost is not None and unpriced == "refuse" and not price_of(model, self.prices):
                raise UsageError(
                    f"{whose} cost budget (${max_cost:g}) cannot be kept with model {model!r}, "
                    "which has no price: pass prices={name: (usd_per_m_input, "
                    "usd_per_m_output)} (or TEAMRT_PRICES for the demos), or unpriced='tokens' "
                    "to count tokens only"
                )

    # -- entry points --

    async def run(
        self, task: str, *, task_id: str | None = None, resume: bool = False
    ) -> RunReport:
        """Run `task` to a stop. With `resume=True`, continue an unfinished checkpointed run
        of the same task (the same `task_id`, or the same text) if there is one.

        An empty `task` adds no message: the inputs of the run come from `inbound` (a round of
        mail for a teammate)."""
        if resume:
            saved = self.state
            if (saved is None or not _same_task(saved, task, task_id)) and self.journal:
                saved = self.journal.load()
            if saved is not None and saved.stop is None and _same_task(saved, task, task_id):
                return await self._drive(saved)
        state = self._begin(task, task_id)
        if self.journal is not None:
            self.journal.start(state)
        return await self._drive(state)

    @contextlib.asynccontextmanager
    async def stream(
        self, task: str, *, task_id: str | None = None, resume: bool = False
    ) -> AsyncIterator[AsyncIterator[AgentEvent]]:
        """Run `task` and see it happen: text as the model writes it (from a model that can
        stream), each tool call and its result, and last the `RunReport`.

            async with agent.stream("What is inotify?") as events:
                async for event in events:
                    if isinstance(event, TextDelta):
                        print(event.text, end="")

        Leaving the block before the report cancels the run.
        """
        send, receive = anyio.create_memory_object_stream[AgentEvent](math.inf)
        previous = self.on_event

        async def relay(event: AgentEvent) -> None:
            if previous is not None:
                await previous(event)
            await send.send(event)

        async def drive() -> None:
            async with send:
                self.on_event = relay
                try:
                    report = await self.run(task, task_id=task_id, resume=resume)
                finally:
                    self.on_event = previous
                await send.send(report)

        failure: Exception | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(drive)
                with receive:
                    try:
                        yield receive
                    except Exception as exc:  # the consumer's error, raised as it is
                        failure = exc
                tg.cancel_scope.cancel()  # the consumer left: a run still going is cancelled
        except BaseExceptionGroup as group:  # the run's own error (ToolCrashed, say), as is
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        if failure is not None:
            raise failure

    async def _emit(self, event: AgentEvent) -> None:
        if self.on_event is not None:
            await self.on_event(event)

    async def resume(self) -> RunReport:
        """Continue the run saved in the checkpoint journal."""
        if self.journal is None:
            raise UsageError(f"agent {self.name!r} has no checkpoint to resume from")
        saved = self.journal.load()
        if saved is None:
            raise UsageError(f"no checkpoint at {self.journal.path}")
        if saved.stop is not None:
            return self._report(saved)
        return await self._drive(saved)

    def restore(self, state: AgentState | None = None) -> AgentState | None:
        """Take up a conversation: `state`, or the one in the checkpoint journal. The next
        `run()` continues it (with `keep_context`), and `resume()` an interrupted task."""
        if state is None and self.journal is not None:
            state = self.journal.load()
        self.state = state
        return state

    def report(self) -> RunReport | None:
        """The report of the current (or last) task, if there is one."""
        return self._report(self.state) if self.state and self.state.stop else None

    def _begin(self, task: str, task_id: str | None) -> AgentState:
        last = self.state
        handled = list(last.handled) if last is not None else []
        if last is not None and last.task_id is not None and last.task_id not in handled:
            handled.append(last.task_id)  # a redelivery of it is recognised, not run again
        previous = last if self.keep_context else None
        if previous is None:
            messages = [ChatMessage.system(self.instructions)] if self.instructions else []
            pinned, tasks, tokens = len(messages), 1, context_tokens(messages)
            if self.transcript is not None:
                self.transcript.reset()
        else:
            messages = _closed(previous)
            pinned, tasks = previous.pinned, previous.tasks + 1
            tokens = previous.context_tokens + context_tokens(messages[len(previous.messages) :])
            messages, pinned, tokens = self._instructed(messages, pinned, tokens)
        index = None
        if task:
            index = len(messages)
            messages.append(ChatMessage.user(task))
            tokens += message_tokens(messages[-1])
            if previous is None and not self.keep_context:
                pinned = len(messages)  # a one-task conversation pins its task (a kept
                # conversation protects only the current task: older ones may be summarised)
        return AgentState(
            agent=self.name,
            task=task,
            task_id=task_id,
            task_index=index,
            tasks=tasks,
            messages=messages,
            pinned=pinned,
            handled=handled[-HANDLED_MEMORY:],
            context_tokens=tokens,
        )

    def _instructed(
        self, messages: list[ChatMessage], pinned: int, tokens: int
    ) -> tuple[list[ChatMessage], int, int]:
        """A kept conversation under the agent's current instructions (they may have changed
        since it was journaled: a teammate restarted with new configuration)."""
        has_system = bool(messages) and messages[0].role == "system"
        current = messages[0].content if has_system else None
        wanted = self.instructions or None
        if current == wanted:
            return messages, pinned, tokens
        if has_system:
            tokens -= message_tokens(messages[0])
            messages, pinned = messages[1:], max(0, pinned - 1)
        if wanted is not None:
            system = ChatMessage.system(wanted)
            messages, pinned = [system, *messages], pinned + 1
            tokens += message_tokens(system)
        return messages, pinned, tokens

    # -- the loop --

    async def _drive(self, state: AgentState) -> RunReport:
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": self.name,
            "teamrt.task.id": state.task_id,
        }
        with telemetry.span(f"invoke_agent {self.name}", attributes) as span:
            # (a sub-agent, with no fence of its own, shows its teammate's to its tools)
            fenced = _current_fence.set(self.fence.token) if self.fence is not None else None
            try:
                report = await self._drive_traced(state)
            finally:
                if fenced is not None:
                    _current_fence.reset(fenced)
                self._model_deadlines.close()
            telemetry.annotate(
                span,
                teamrt__stop__reason=report.stop.reason,
                gen_ai__usage__input_tokens=report.usage.input_tokens,
                gen_ai__usage__output_tokens=report.usage.output_tokens,
            )
            return report

    async def _drive_traced(self, state: AgentState) -> RunReport:
        self.state = state
        self._withdrawn = None
        started, elapsed_before = self.clock(), state.elapsed
        specs = self.toolbox.specs
        output = self._structured()
        if self._output is not None and output is None:
            specs = [*specs, self._output.tool_spec]

        def elapsed() -> float:
            return elapsed_before + self.clock() - started

        self._elapsed = elapsed
        # each model call yields (`Model`): it stands for the step's first checkpoint, unless
        # a cancellation may come after it, held back by the shielded budget charge or made
        # by a listener of the reply's text
        suspends = (
            getattr(self.model, "suspends", False) is True
            and self.budget is None
            and self.on_event is None
        )

        while state.stop is None:
            if state.open_step is not None:  # resumed between a reply and its results
                await self._finish_step(state, state.open_step)
                continue
            try:
                self.limits.check_model_call(
                    steps=state.steps,
                    tokens=state.usage.total_tokens,
                    cost=state.cost,
                    elapsed=elapsed(),
                    idle=state.idle,
                    model_time=state.model_time,
                )
                if self.budget is not None:
                    await self.budget.check()
                    self._check_priced_now()
            except LimitExceeded as exc:
                self._stop_at_limit(state, exc)
                break
            # (the awaits below are skipped when they have nothing to do: a step is made of
            # many small calls, and each coroutine costs its creation)
            injected = await self._step_boundary(state) if self.inbound is not None else []
            if state.stop is not None:
                break
            # the boundary may have waited: another member's spend may have landed meanwhile
            if self.inbound is not None and not await self._within_budget(state):
                break
            replaced = self.memory.over_budget(
                state.context_tokens
            ) and await self._compact_in_time(state)
            if state.stop is not None or (replaced and not await self._within_budget(state)):
                break
            with self._interruptible() as self._in_flight:
                reply = await self._call_model(state, specs, output)
            self._in_flight = None
            if self._withdrawn is not None:
                state.stop = Stop(reason="cancelled", detail=self._withdrawn)
                break
            if reply is None:
                break
            if self.transcript is not None:
                typed = self._output.spec if self._output is not None else None
                self.transcript.record(
                    state.steps + 1, state.messages, reply, replaced, typed, output is not None
                )
            if self.budget is None:
                self._count(state, reply.usage, self.model.name)
            else:
                await self._charge(state, reply.usage, self.model.name)
            state.steps += 1
            open_step = OpenStep.of(reply.as_message(), reply.finish_reason)
            handled = self.inbound.handled() if self.inbound is not None else []
            if handled:
                state.remember_handled(handled)
            if self.journal is not None:
                self.journal.call(
                    state, injected, handled, open_step.reply, reply.usage, reply.finish_reason
                )
            if self.inbound is not None:
                self.inbound.recorded()  # what it delivered is in the journal now
            state.open_step = open_step
            state.elapsed = elapsed()
            with self._interruptible() as self._in_flight:
                await self._finish_step(state, open_step, suspends)
            if self._withdrawn is not None and state.stop is None:  # (its tools cut short)
                state.stop = Stop(reason="cancelled", detail=self._withdrawn)
            self._in_flight = None
        state.elapsed = elapsed()
        if self.journal is not None and state.stop is not None and state.stop.reason != "shutdown":
            self.journal.stop(state)  # a shutdown leaves the task open: the next one resumes it
        return self._report(state)

    async def _within_budget(self, state: AgentState) -> bool:
        """Read the shared budget again just before a model call starts (a call must not start
        once any member's spend has used it up); False, with the stop made, if it is spent."""
        if self.budget is None:
            return True
        try:
            await self.budget.check()
        except LimitExceeded as exc:
            self._stop_at_limit(state, exc)
            return False
        return True

    async def _step_boundary(self, state: AgentState) -> list[ChatMessage]:
        """Messages that arrived during the last step (the inbound hook's), added to the
        conversation before the next model call; a StopRequested ends the run here."""
        if self.inbound is None:
            return []
        try:
            injected = await self.inbound.before_step(state)
        except StopRequested as exc:  # a withdrawn task ends; a shutdown leaves it to resume
            reason: StopReason = "cancelled" if isinstance(exc, TaskWithdrawn) else "shutdown"
            state.stop = Stop(reason=reason, detail=str(exc))
            return []
        state.messages.extend(injected)
        state.context_tokens += sum(message_tokens(m) for m in injected)
        return injected

    async def _compact_in_time(self, state: AgentState) -> bool:
        """`_compact` under the same rules as a model call (a summariser is a model): the
        deadlines and `model_timeout` stop it, and its failure is a `model_error` stop. Called
        only when the context is over budget (the loop checks, without making this coroutine)."""
        left, passed = self._time_left()
        per_call = self.limits.model_timeout
        bound = min(left, per_call if per_call is not None else math.inf)
        started = self.clock()
        try:
            with _within(bound):
                return await self._compact(state)
            if per_call is not None and per_call < left:
                raise LimitExceeded(
                    "model_timeout",
                    per_call,
                    round(self.clock() - started, 3),
                    "a summary of the context took longer than a model call may (s):",
                )
            raise passed("while the context was summarised")
        except LimitExceeded as exc:
            self._stop_at_limit(state, exc)
        except ModelError as exc:
            state.stop = Stop(reason="model_error", detail=f"the summariser failed: {exc}")
        finally:
            state.model_time += self.clock() - started
        return False

    async def _compact(self, state: AgentState) -> bool:
        """Bring the context within budget; True if the conversation was replaced."""
        if not self.memory.over_budget(state.context_tokens):
            return False
        task = state.messages[state.task_index] if state.task_index is not None else None
        compacted = await self.memory.compact(state.messages, state.pinned, keep=task)
        state.messages = compacted.messages
        if task is not None:
            state.task_index = next(i for i, m in enumerate(state.messages) if m is task)
        state.context_tokens = context_tokens(state.messages)
        state.compactions += 1
        if compacted.usage.requests and self.memory.summariser is not None:
            await self._charge(state, compacted.usage, self.memory.summariser.name)
        if self.journal is not None:
            self.journal.replace(state.messages, state.task_index)
        return True

    def _interruptible(self) -> contextlib.AbstractContextManager[anyio.CancelScope | None]:
        """A scope `interrupt` can cancel, for an agent fed by an inbound (a teammate, whose
        task can be withdrawn); none for another, whose caller cancels it directly."""
        return anyio.CancelScope() if self.inbound is not None else _UNBOUNDED

    def interrupt(self, detail: str) -> None:
        """End the run now with stop reason `cancelled` (its task was withdrawn): the model
        call or the tool calls in flight are cancelled, as at a deadline. Between steps it
        has no effect: the inbound hook stops the run at the boundary instead."""
        if self._in_flight is not None:
            self._withdrawn = detail
            self._in_flight.cancel()

    def absorb(self, usage: Usage, cost: float | None) -> None:
        """Count spend made on this agent's behalf (a sub-agent's) against its own limits
        (not against a shared budget: whoever spent it charged that already)."""
        state = self.state
        if state is None:
            return
        state.usage = state.usage + usage
        if cost is None:
            state.cost_known = state.cost_known and usage.total_tokens == 0
        else:
            state.cost += cost

    async def _charge(self, state: AgentState, usage: Usage, model: str) -> None:
        cost = self._count(state, usage, model)
        if self.budget is not None:
            with anyio.CancelScope(shield=True):  # spent is spent: the ledger must say so
                await self.budget.charge(usage, cost)

    def _count(self, state: AgentState, usage: Usage, model: str) -> float | None:
        """Add a call's usage and cost to the run's; its cost (None: unknown)."""
        state.usage = state.usage + usage
        cost = cost_of(usage, model, self.prices)
        if cost is None:
            if state.cost_known:
                state.cost_known = False
        elif cost:
            state.cost += cost
        return cost

    def _time_left(self) -> tuple[float, Callable[[str], LimitExceeded]]:
        """Seconds until the nearest deadline (the run's, or a shared budget's), and the error
        that says which one passed, given what was running."""
        if self.limits.deadline is None and self.budget is None:
            return math.inf, self._deadline_passed  # (never called: there is no deadline)
        left, which = math.inf, "deadline"
        if self.limits.deadline is not None:
            left = self.limits.deadline - self._elapsed()
        shared = getattr(self.budget, "time_left", None)
        team_left = shared() if shared is not None else None
        if team_left is not None and team_left < left:
            left, which = team_left, "team_deadline"

        def passed(during: str) -> LimitExceeded:
            if which == "team_deadline" and shared is not None:
                deadline = getattr(self.budget, "deadline", 0.0) or 0.0
                return LimitExceeded(
                    "team_deadline",
                    deadline,
                    round(deadline - (shared() or 0.0), 3),
                    f"the team's wall-clock deadline (s) passed {during}:",
                )
            return self._deadline_passed(during)

        return max(0.0, left), passed

    def _deadline_passed(self, during: str) -> LimitExceeded:
        return LimitExceeded(
            "deadline",
            self.limits.deadline or 0.0,
            round(self._elapsed(), 3),
            f"the wall-clock deadline (s) passed {during}:",
        )

    async def _call_model(
        self, state: AgentState, specs: Sequence[Any], output: OutputSpec | None
    ) -> ModelReply | None:
        left, passed = self._time_left()
        per_call = self.limits.model_timeout
        if self.limits.max_model_time is not None:  # what is left of the task's model time
            rest = max(0.0, self.limits.max_model_time - state.model_time)
            per_call = rest if per_call is None else min(per_call, rest)
        bound = min(left, per_call if per_call is not None else math.inf)
        started = self.clock()
        expired = False
        try:
            if bound == math.inf:  # no deadline: no timeout to enter and leave
                reply = await self._asking(state, specs, output)
            else:
                deadlines = self._model_deadlines
                deadlines.start(bound)
                try:
                    reply = await self._asking(state, specs, output)
                except (asyncio.CancelledError, TimeoutError):
                    # the deadline's cancellation (taken back), or a TimeoutError a model made
                    # of it, is the deadline; any other is a cancellation of this task, or the
                    # model's own timeout
                    if not deadlines.finish():
                        raise
                    expired = True
                except BaseException:
                    deadlines.finish()
                    raise
                else:
                    deadlines.finish()  # (a cancellation the model swallowed is taken back)
            if not expired:
                if reply is None:  # a broken model's fault, not a deadline
                    raise ModelError(
                        f"{self.model.name}: the model call returned None, not a ModelReply"
                    )
                state.attempts += reply.attempts
                if reply.rate_limited:
                    state.rate_limited += reply.rate_limited
                if reply.usage_estimated and not state.usage_estimated:
                    state.usage_estimated = True
                return reply
            if per_call is not None and per_call < left:
                model_time = state.model_time + self.clock() - started
                limit = self.limits.max_model_time
                if limit is not None and model_time >= limit:
                    raise LimitExceeded(
                        "max_model_time",
                        limit,
                        round(model_time, 3),
                        "the time spent waiting for the model (s) ran out during a call:",
                    )
                raise LimitExceeded(
                    "model_timeout",
                    self.limits.model_timeout or per_call,
                    round(self.clock() - started, 3),
                    "a model call (retries included) took longer than allowed (s):",
                )
            raise passed("during a model call")
        except LimitExceeded as exc:
            self._stop_at_limit(state, exc)
        except ModelError as exc:
            attempts = int(getattr(exc, "attempts", 1) or 1)
            limited = int(getattr(exc, "rate_limited", 0) or 0)
            state.attempts += attempts
            state.rate_limited += limited
            detail = str(exc)
            if limited and "rate limit" not in detail:
                detail += f" ({limited} of {attempts} attempts were rate limited: 429)"
            log.warning("%s stopped: the model failed: %s", state.agent, detail)
            state.stop = Stop(reason="model_error", detail=detail)
        except anyio.get_cancelled_exc_class():
            if cancelled_for_real():
                raise
            detail = (
                f"{self.model.name}: the model call raised a cancellation of its own (not a "
                "deadline or a shutdown of this agent)"
            )
            log.warning("%s stopped: %s", state.agent, detail)
            state.stop = Stop(reason="model_error", detail=detail)
        finally:
            state.model_time += self.clock() - started
        return None

    def _asking(
        self, state: AgentState, specs: Sequence[Any], output: OutputSpec | None
    ) -> Awaitable[ModelReply]:
        """The model call to await: `_complete`'s, or the model's own when that is all it
        would do (no answer schema, no listener, no telemetry: no coroutine in between)."""
        if output is None and self.on_event is None and not telemetry.enabled():
            return self.model.complete(state.messages, specs)
        return self._complete(state, specs, output)

    async def _complete(
        self, state: AgentState, specs: Sequence[Any], output: OutputSpec | None
    ) -> ModelReply:
        """One model call (a `chat` span when telemetry is on)."""
        if not telemetry.enabled():
            return await self._complete_traced(state, specs, output)
        attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": self.model.name}
        with telemetry.span(f"chat {self.model.name}", attributes) as span:
            reply = await self._complete_traced(state, specs, output)
            telemetry.annotate(
                span,
                gen_ai__response__model=reply.model or None,
                gen_ai__usage__input_tokens=reply.usage.input_tokens,
                gen_ai__usage__output_tokens=reply.usage.output_tokens,
                gen_ai__response__finish_reasons=[reply.finish_reason or "stop"],
                teamrt__attempts=reply.attempts,
            )
            return reply

    async def _ask(
        self, state: AgentState, specs: Sequence[Any], output: OutputSpec | None
    ) -> ModelReply:
        """The model's reply, held to the answer's schema when there is one (`output` is only
        given for a model that `_structured` found takes it)."""
        if output is not None:
            structured = cast(StructuredOutputModel, self.model)
            return await structured.complete(state.messages, specs, output=output)
        return await self.model.complete(state.messages, specs)

    async def _complete_traced(
        self, state: AgentState, specs: Sequence[Any], output: OutputSpec | None
    ) -> ModelReply:
        """One model call; streamed when someone listens and the model can stream."""
        if self.on_event is None:
            return await self._ask(state, specs, output)
        model = self.model
        streams = (
            isinstance(model, StructuredStreamingModel)
            if output is not None
            else isinstance(model, StreamingModel)
        )
        if not streams:
            whole = await self._ask(state, specs, output)
            if whole.text:
                await self._emit(TextDelta(text=whole.text))
            return whole
        reply: ModelReply | None = None
        if output is not None and isinstance(model, StructuredStreamingModel):
            stream = model.stream(state.messages, specs, output=output)
        else:
            assert isinstance(model, StreamingModel)
            stream = model.stream(state.messages, specs)
        try:
            async for item in stream:
                if isinstance(item, TextDelta):
                    await self._emit(item)
                else:
                    reply = item
        finally:
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()  # a stream left early gives its connection back
        if reply is None:
            raise ModelError(f"{self.model.name}: the stream ended without a reply")
        return reply

    async def _finish_step(
        self, state: AgentState, step: OpenStep, checkpointed: bool = False
    ) -> None:
        """Act on a recorded reply: run its tool calls (those without a result yet), then
        close the step in the state and the journal. `checkpointed`: the reply's model call
        suspended (see `Model`), so the first call to run alone needs no checkpoint of its own."""
        reply = step.reply
        work = _StepWork(dict(step.results), reply.tool_calls, checkpointed)
        decision = _decide(reply.content, reply.tool_calls, step.finish_reason, work.arguments)
        if self._output is not None and any(c.name == FINAL_TOOL for c in reply.tool_calls):
            state.nudges = 0
            self._final_call(state, reply.tool_calls, work)
        elif isinstance(decision, Answer):
            state.nudges = 0
            text = state.truncated + decision.text
            state.truncated = ""
            if self._output is None:
                state.answer = text
                state.stop = Stop(reason="answer", detail="the model gave its answer")
            else:
                self._typed_text(state, text, work)
        elif isinstance(decision, Truncated):
            if state.truncated:  # cut off again after being asked to continue
                state.truncated += decision.text
                state.stop = Stop(
                    reason="truncated",
                    detail="the reply was cut off by the output length limit again after "
                    "one request to continue; the partial text is kept",
                )
            else:
                state.truncated = decision.text
                work.appended.append(ChatMessage.user(CONTINUE))
        elif isinstance(decision, Malformed):
            for call in reply.tool_calls:  # every call needs a result, even an unusable one
                work.appended.append(
                    ChatMessage.tool_result(
                        call, json.dumps({"error": f"MalformedToolCall: {decision.reason}"})
                    )
                )
            if state.nudges >= 1:
                state.stop = Stop(
                    reason="malformed_reply",
                    detail=f"malformed again after a nudge: {decision.reason}",
                )
            else:
                state.nudges += 1
                nudge = NUDGE.format(reason=decision.reason, answer=self._answer_hint())
                work.appended.append(ChatMessage.user(nudge))
        else:
            if state.nudges:
                state.nudges = 0
            await self._run_tools(state, decision.calls, work)
        added = [reply]
        results = work.results
        for c in reply.tool_calls:
            if c.id in results:
                added.append(results[c.id])
        added += work.appended
        state.messages.extend(added)
        tokens = 0
        for m in added:
            tokens += message_tokens(m)
        state.context_tokens += tokens
        state.open_step = None
        handled = self.inbound.handled() if self.inbound is not None else []
        if handled:
            state.remember_handled(handled)
        state.elapsed = self._elapsed()
        if self.journal is not None:
            self.journal.step(state, work.appended, work.calls, work.digests, handled)
        if self.inbound is not None:
            self.inbound.recorded()

    # -- typed answers --

    def _answer_hint(self) -> str:
        if self._output is None:
            return ANSWER_AS_TEXT
        return ANSWER_AS_JSON if self._structured() is not None else ANSWER_BY_TOOL

    def _final_call(
        self, state: AgentState, tool_calls: tuple[ToolCall, ...], work: _StepWork
    ) -> None:
        """A reply that calls the final-answer tool: its first such call is the answer. Every
        call gets a result (the others are not run), so the conversation stays well formed."""
        assert self._output is not None
        final = next(c for c in tool_calls if c.name == FINAL_TOOL)
        accepted: Accepted | None = None
        error = ""
        try:
            accepted = self._output.check(final.arguments or "{}")
            result = ACCEPTED
        except Rejected as exc:
            error = str(exc)
            result = {"error": f"ValidationError: {error}"}
        for call in tool_calls:
            if call is final:
                content = json.dumps(result)
            else:
                content = json.dumps({"error": NOT_RUN_ENDED if accepted else NOT_RUN_BESIDE})
            if work.results.get(call.id) is None:
                self._record(work, call, ChatMessage.tool_result(call, content))
        if accepted is not None:
            self._accept(state, accepted)
        else:
            self._reject(state, error)  # the call's error result is what the model reads

    def _typed_text(self, state: AgentState, text: str, work: _StepWork) -> None:
        """A typed run's text answer: the answer itself (structured output), or, from a model
        that was to call the final-answer tool, accepted if it is valid JSON of the type."""
        assert self._output is not None
        try:
            accepted = self._output.check(text)
        except Rejected as exc:
            if self._reject(state, str(exc)):
                template = REJECTED if self._structured() is not None else REJECTED_TEXT
                feedback = template.format(name=self._output.name, errors=exc)
                work.appended.append(ChatMessage.user(feedback))
            return
        self._accept(state, accepted)

    def _accept(self, state: AgentState, accepted: Accepted) -> None:
        self._accepted = accepted
        state.answer = accepted.json
        state.stop = Stop(reason="answer", detail="the model gave its answer")

    def _reject(self, state: AgentState, error: str) -> bool:
        """An answer that did not validate: True while the model gets its one correction
        (the caller gives it the errors); after that the run stops as `invalid_output`."""
        assert self._output is not None
        state.output_errors += 1
        if state.output_errors <= OUTPUT_RETRIES:
            return True
        name = self._output.name
        log.info("%s stopped: its answer did not match %s twice", state.agent, name)
        state.stop = Stop(
            reason="invalid_output",
            detail=f"the answer did not match {name} again after one correction: {error}",
        )
        return False

    async def _run_tools(
        self, state: AgentState, tool_calls: tuple[ToolCall, ...], work: _StepWork
    ) -> None:
        """Admit the calls in order against the limits, run the admitted ones (concurrently,
        in groups split by sequential tools), then account for the results in call order."""
        admitted: list[ToolCall] = []
        waiting: set[str] = set()  # ids of admitted calls to tools that wait for others
        for i, call in enumerate(tool_calls):
            found = self.toolbox.get(call.name)
            waits = found is not None and found.waits
            sig = (
                _signature_of(call, work.arguments[i])
                if i < len(work.arguments)
                else signature(call)
            )
            try:
                self.limits.check_tool_call(
                    tool_calls=state.tool_calls,
                    repeats=0 if waits else state.call_counts.get(sig, 0),
                    signature=sig,
                )
            except LimitExceeded as exc:
                for skipped in tool_calls[i:]:  # keep the conversation well formed for a resume
                    work.appended.append(
                        ChatMessage.tool_result(skipped, json.dumps({"error": f"NotRun: {exc}"}))
                    )
                self._stop_at_limit(state, exc)
                break
            if waits:
                waiting.add(call.id)
            else:
                state.count_call(sig)
                work.calls.append(sig)
            state.tool_calls += 1
            admitted.append(call)
        if admitted:
            pending = [c for c in admitted if c.id not in work.results]
            left, passed = self._time_left()
            if left == math.inf and len(pending) == 1:  # the common case, without the machinery
                await self._run_one(state, pending[0], work, alone=True)
            else:
                await self._run_admitted(state, pending, work, left, passed)
        learned = waited = False
        for call in admitted:
            message = work.results[call.id]
            if waiting and call.id in waiting:
                waited = True
                continue
            content = message.content or ""
            if content.startswith('{"error"'):
                state.tool_errors += 1
                state.consecutive_errors += 1
            elif state.consecutive_errors:  # (a pydantic field: set only when it changes)
                state.consecutive_errors = 0
            digest = _digest(content)
            if self._results.is_new(state, digest):
                work.digests.append(digest)
                learned = True
        if state.stop is not None:
            return
        if learned:
            if state.stale_steps:
                state.stale_steps = 0
        elif not waited:  # waiting for others is not a lack of progress
            state.stale_steps += 1
        try:
            self.limits.check_after_tools(
                consecutive_errors=state.consecutive_errors, stale_steps=state.stale_steps
            )
        except LimitExceeded as exc:
            self._stop_at_limit(state, exc)

    async def _run_admitted(
        self,
        state: AgentState,
        calls: list[ToolCall],
        work: _StepWork,
        left: float,
        passed: Callable[[str], LimitExceeded],
    ) -> None:
        """Run calls concurrently, a sequential tool alone; stop them at the run's deadline
        (`left` seconds from now; `passed` says which one it is, as `_time_left` does)."""
        groups: list[list[ToolCall]] = []
        for call in calls:
            alone = _is_sequential(self.toolbox, call)
            if alone or not groups or _is_sequential(self.toolbox, groups[-1][-1]):
                groups.append([call])
            else:
                groups[-1].append(call)
        if left == math.inf:  # no deadline to stop them at: no cancel scope either
            await self._run_groups(state, groups, work)
            return
        if left == 0:  # passed already: the scope stops the calls at their first checkpoint,
            work.checkpointed = False  # which a step whose model call suspended would skip
        with anyio.move_on_after(left) as scope:
            await self._run_groups(state, groups, work)
        if scope.cancelled_caught:
            unfinished = [call for call in calls if call.id not in work.results]
            names = ", ".join(dict.fromkeys(call.name for call in unfinished)) or "tools"
            for call in unfinished:
                error = f"Deadline: the run's deadline passed while {call.name} ran"
                message = ChatMessage.tool_result(call, json.dumps({"error": error}))
                self._record(work, call, message)
            self._stop_at_limit(state, passed(f"while {names} ran"))

    async def _run_groups(
        self, state: AgentState, groups: list[list[ToolCall]], work: _StepWork
    ) -> None:
        """Each group in turn: a group of one call runs here, the calls of a larger one side
        by side (at most `max_parallel_tools` at a time)."""
        for group in groups:
            if len(group) == 1:
                await self._run_one(state, group[0], work, alone=True)
                continue
            async with anyio.create_task_group() as tg:
                for call in group:
                    tg.start_soon(self._run_one, state, call, work)

    async def _run_one(
        self, state: AgentState, call: ToolCall, work: _StepWork, alone: bool = False
    ) -> None:
        """Run one call and record its result, announced to listeners before and after. A call
        run `alone` first passes a checkpoint (other tasks run; a cancellation lands before the
        call is announced), as one under the limiter does in taking it, unless the step passed
        one since its last call (its model call suspended: the first call needs none)."""
        if alone:
            if work.checkpointed:
                work.checkpointed = False
            else:
                await asyncio.sleep(0)  # anyio's checkpoint on asyncio, without its look-ups
        if self.fence is not None:  # a fresh look: a paused process's own flags are stale
            await self.fence.check()  # LeaseLost: the call does not run, the incarnation stops
        found = self.toolbox.get(call.name)
        waits = found is not None and found.waits
        keyed = call
        if self.call_id_prefix is not None:
            position = next(i for i, c in enumerate(work.reply_calls) if c.id == call.id)
            keyed = call.model_copy(
                update={"id": f"{self.call_id_prefix}:{state.steps}.{position}"}
            )
        listening = self.on_event is not None  # events and spans cost nothing when off
        if listening:
            await self._emit(ToolCallStarted(call))
        if telemetry.enabled():
            attributes = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": call.name,
                "gen_ai.tool.call.id": call.id,
            }
            with telemetry.span(f"execute_tool {call.name}", attributes) as span:
                result = await self._run_call(state, keyed, waits, alone)
                telemetry.annotate(span, teamrt__tool__ok=result.ok)
        elif alone and not waits:  # what _run_call does with such a call
            if found is not None and found._inline:  # a plain function: nothing to await
                result = self.toolbox._run_now(keyed, found)
            else:
                result = await self.toolbox.run(keyed)
        else:
            result = await self._run_call(state, keyed, waits, alone)
        self._record(work, call, ChatMessage.tool_result(call, result.content))
        if listening:
            await self._emit(ToolCallFinished(call.id, call.name, result.content, result.ok))

    async def _run_call(
        self, state: AgentState, keyed: ToolCall, waits: bool, alone: bool
    ) -> ToolResult:
        """Run one call, under the limiter when other calls of the reply run beside it (alone,
        it is within `max_parallel_tools` as it is)."""
        if alone:
            return await self._run_tool(state, keyed, waits)
        async with self._parallel:
            return await self._run_tool(state, keyed, waits)

    async def _run_tool(self, state: AgentState, keyed: ToolCall, waits: bool) -> ToolResult:
        if not waits:
            return await self.toolbox.run(keyed)
        started = self.clock()
        if self.limits.max_idle is not None:  # the idle limit bounds each wait
            result: ToolResult | None = None
            with anyio.move_on_after(max(0.0, self.limits.max_idle - state.idle)):
                result = await self.toolbox.run(keyed)
            if result is None:
                result = ToolResult(
                    json.dumps({"nothing_arrived": "stopped waiting: the idle limit"}), True
                )
        else:
            result = await self.toolbox.run(keyed)
        state.idle += self.clock() - started
        return result

    def _record(self, work: _StepWork, call: ToolCall, message: ChatMessage) -> None:
        work.results[call.id] = message
        if self.journal is not None:
            self.journal.result(call.id, message)

    _elapsed: Callable[[], float]

    @staticmethod
    def _stop_at_limit(state: AgentState, exc: LimitExceeded) -> None:
        level = logging.WARNING if exc.limit.startswith("team_") else logging.INFO
        log.log(level, "%s stopped at a limit: %s", state.agent, exc)
        state.stop = Stop(
            reason="limit", detail=str(exc), limit=exc.limit, value=exc.value, used=exc.used
        )

    def _report(self, state: AgentState) -> RunReport:
        assert state.stop is not None
        partial = state.truncated or None
        if state.stop.reason == "invalid_output":
            partial = _rejected_answer(state)
        if state.answer is None and partial is None:
            start = state.task_index if state.task_index is not None else state.pinned
            for m in reversed(state.messages[start:]):
                if m.content and m.role in ("assistant", "tool"):
                    partial = m.content
                    break
        return RunReport(
            agent=state.agent,
            task=state.task,
            task_id=state.task_id,
            stop=state.stop,
            answer=state.answer,
            partial=partial,
            steps=state.steps,
            tool_calls=state.tool_calls,
            tool_errors=state.tool_errors,
            usage=state.usage,
            cost=state.cost if state.cost_known else None,
            elapsed=state.elapsed,
            idle=state.idle,
            compactions=state.compactions,
            model_time=state.model_time,
            attempts=state.attempts,
            rate_limited=state.rate_limited,
            usage_estimated=state.usage_estimated,
            output=self._value(state),
            output_name=self._output.name if self._output is not None else None,
        )

    def _value(self, state: AgentState) -> Any:
        """A typed run's answer as a value (validated again from its JSON after a restore)."""
        typed = self._output
        if typed is None or state.stop is None or state.stop.reason != "answer":
            return None
        if state.answer is None:  # cannot happen after an answer; for the type checker
            return None
        accepted = self._accepted
        if accepted is not None and accepted.json == state.answer:
            return accepted.value
        try:
            return typed.load(state.answer)
        except ValueError:  # pydantic's ValidationError: an answer of another type
            log.warning("%s: its answer does not load as %s", state.agent, typed.name)
            return None


def _rejected_answer(state: AgentState) -> str | None:
    """The answer a typed run rejected last: its final-answer call's arguments, or its text."""
    for message in reversed(state.messages):
        if message.role == "assistant":
            for call in message.tool_calls:
                if call.name == FINAL_TOOL:
                    return call.arguments
            return message.content
    return None


class _CallDeadlines:
    """Deadlines of one call after another (a run's model calls) on one timer, not one each.

    `start(seconds)` says a call of the running task starts now and must end within `seconds`;
    `finish()` says it is over. The timer is set for the earliest deadline noted; when it fires,
    the call running then is cancelled if its own deadline has passed, or the timer is set again
    for that deadline; a call that ended in time leaves the timer for the next call. So a step
    that ends well within its deadline schedules and cancels no timer, and makes no
    `asyncio.Timeout` to enter and leave: the cancellation is made and taken back here the way
    `asyncio.timeout` does it (`Task.cancel`, then `Task.uncancel`, counted against the task's
    cancellations when the call started, so that a cancellation from elsewhere stays one).
    """

    def __init__(self) -> None:
        self._handle: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[Any] | None = None
        self._when = math.inf
        self._cancelling = 0  # the task's pending cancellations when its call started
        self._cancelled = False  # this timer cancelled the running call

    def start(self, seconds: float) -> None:
        """A call of the running task starts, to end within `seconds` (finite)."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a model call's deadline needs a task")  # pragma: no cover
        self._task, self._when = task, loop.time() + seconds
        self._cancelling, self._cancelled = task.cancelling(), False
        handle = self._handle
        if handle is None or handle.when() > self._when:
            if handle is not None:
                handle.cancel()
            self._handle = loop.call_at(self._when, self._fire)

    def finish(self) -> bool:
        """The call that started last is over (the timer, if set, stays for the next one).
        True if its deadline cancelled it and no other cancellation of the task is pending:
        its `CancelledError` is then the deadline's, to be taken as a timeout."""
        task, self._task = self._task, None
        if not self._cancelled or task is None:
            return False
        self._cancelled = False
        return task.uncancel() <= self._cancelling

    def close(self) -> None:
        """No more calls: the timer is cancelled."""
        self._task = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        task = self._task
        if task is None or self._cancelled:
            return
        loop = asyncio.get_running_loop()
        if loop.time() >= self._when:
            self._cancelled = True
            task.cancel()
        else:  # set for an earlier call's deadline: this call's is later
            self._handle = loop.call_at(self._when, self._fire)


_UNBOUNDED = contextlib.nullcontext()


def _within(seconds: float) -> contextlib.AbstractContextManager[Any]:
    """A cancel scope that ends its block after `seconds`, or none at all when there is no
    bound: a scope without a deadline would only cost its enter and exit (an outer
    cancellation reaches the block the same either way), and most steps have none."""
    return anyio.move_on_after(seconds) if seconds < math.inf else _UNBOUNDED


def _is_sequential(toolbox: Toolbox, call: ToolCall) -> bool:
    found = toolbox.get(call.name)
    return found is not None and found.sequential


def _same_task(saved: AgentState, task: str, task_id: str | None) -> bool:
    return saved.task_id == task_id if task_id is not None else saved.task == task


def _closed(state: AgentState) -> list[ChatMessage]:
    """The conversation of `state`, well formed to build on: an interrupted step's reply is
    closed with its results, and a call that never finished says so."""
    messages = list(state.messages)
    step = state.open_step
    if step is not None:
        messages.append(step.reply)
        for call in step.reply.tool_calls:
            result = step.results.get(call.id)
            if result is None:
                error = "Interrupted: this call did not finish before the run stopped"
                result = ChatMessage.tool_result(call, json.dumps({"error": error}))
            messages.append(result)
    return messages
