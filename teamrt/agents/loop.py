"""One agent's loop: the model decides, the tools act, the results go back, until a stop.

Theory of operation. All state is an `AgentState`. The step itself is a pure state machine
(`teamrt.agents.step.StepMachine`): given the state, the limits and the time elapsed, it says
whether to call the model, what a reply means (an answer, tool calls, or malformed), which calls
may run, and when the run stops. `Agent` is the async driver that performs what it says: each
step checks the limits, takes in what arrived meanwhile (the inbound hook), compacts the context
if it is over budget, calls the model (`teamrt.agents.modelcall`), and hands the reply to the
step machine. The reply is journaled before any tool runs; the reply's tool calls then run
concurrently (bounded; a `sequential` tool runs alone; `teamrt.agents.toolrun`) and each result
is journaled as it comes, so a resumed run re-runs only the calls that had not finished, with
the same call ids. Results go back to the model in call order. A malformed reply gets one
corrective nudge; a second in a row stops the run. Every way out of the loop produces a
`RunReport`. Telemetry wraps the driver (`teamrt.agents.traced`); the deadline timer of the
model calls is `teamrt.agents.deadline`.

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

import contextlib
import functools
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import anyio

from teamrt import telemetry
from teamrt.agents import traced
from teamrt.agents.deadline import RunTime
from teamrt.agents.events import (
    AgentEvent,
    EventSink,
    ToolCallFinished,
    ToolCallStarted,
    event_stream,
)
from teamrt.agents.journal import Journal, Transcript
from teamrt.agents.limits import PRICES, Limits, check_priced, check_priced_now
from teamrt.agents.memory import Memory
from teamrt.agents.modelcall import ModelCalls
from teamrt.agents.output import FINAL_TOOL, Accepted, OutputType
from teamrt.agents.state import AgentState, OpenStep, RunReport, Stop, StopReason
from teamrt.agents.step import (
    ACCEPTED,
    ANSWER_AS_JSON,
    ANSWER_AS_TEXT,
    ANSWER_BY_TOOL,
    CONTINUE,
    NOT_RUN_BESIDE,
    NOT_RUN_ENDED,
    NUDGE,
    OUTPUT_RETRIES,
    REJECTED,
    REJECTED_TEXT,
    STOPPED,
    Answer,
    CallTools,
    Malformed,
    ResultIndex,
    StepMachine,
    StepWork,
    Truncated,
    begin,
    count,
    decide,
    report_of,
    same_task,
    signature,
    signature_of,
    stop_at_limit,
)
from teamrt.agents.toolrun import ToolRunner
from teamrt.agents.tools import Fence, Tool, Toolbox, _current_fence
from teamrt.errors import LimitExceeded, StopRequested, TaskWithdrawn, UsageError
from teamrt.models.base import (
    ChatMessage,
    Model,
    OutputSpec,
    StructuredOutputModel,
    Usage,
    message_tokens,
)
from teamrt.teamdir import AgentDir

__all__ = [
    "ACCEPTED",
    "ANSWER_AS_JSON",
    "ANSWER_AS_TEXT",
    "ANSWER_BY_TOOL",
    "CONTINUE",
    "DEFAULT_MAX_PARALLEL_TOOLS",
    "NOT_RUN_BESIDE",
    "NOT_RUN_ENDED",
    "NUDGE",
    "OUTPUT_RETRIES",
    "REJECTED",
    "REJECTED_TEXT",
    "Agent",
    "AgentEvent",
    "Answer",
    "CallTools",
    "EventSink",
    "Inbound",
    "Malformed",
    "SharedBudget",
    "StepHook",
    "ToolCallFinished",
    "ToolCallStarted",
    "Truncated",
    "decide",
    "signature",
]

# the names the step's tests knew them by before the step machine had a module of its own
_ResultIndex = ResultIndex
_signature_of = signature_of

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
        self._tools = ToolRunner(self, max_parallel_tools)
        self._calls = ModelCalls(self)
        self._in_flight: anyio.CancelScope | None = None  # the model call or tools running now
        self._withdrawn: str | None = None  # why `interrupt` stopped the run
        self._results = ResultIndex()
        if directory is not None:
            files = AgentDir(Path(directory))
            checkpoint = checkpoint or files.journal(name)
            transcript = transcript or files.transcript(name)
        self.journal = Journal(checkpoint) if checkpoint is not None else None
        self.transcript = Transcript(transcript) if transcript is not None else None
        self.clock = clock
        self.state: AgentState | None = None
        self._output: OutputType | None = None
        self._accepted: Accepted | None = None  # the last answer accepted, with its value
        self._takes_schema: tuple[Model | None, bool] = (None, False)  # model, structured?
        self._machine = self._step_machine(None)
        self.output_type = output_type
        check_priced(self.limits, budget, model.name, self.prices)

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
        if self._takes_schema[0] is not model:  # the protocol check, once a model
            takes = isinstance(model, StructuredOutputModel) and model.structured_output
            self._takes_schema = (model, takes)
        return self._output.spec if self._takes_schema[1] else None

    def _step_machine(self, output: OutputSpec | None) -> StepMachine:
        """The step machine of a run under the agent's settings as they are now."""
        return StepMachine(
            self.limits,
            self.toolbox,
            prices=self.prices,
            output=self._output,
            structured=output is not None,
            results=self._results,
            accepted=self._accepted,
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
            if (saved is None or not same_task(saved, task, task_id)) and self.journal:
                saved = self.journal.load()
            if saved is not None and saved.stop is None and same_task(saved, task, task_id):
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
        run = functools.partial(self.run, task, task_id=task_id, resume=resume)
        async with event_stream(self, run) as events:
            yield events

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

    def _begin(self, task: str, task_id: str | None) -> AgentState:
        last = self.state
        if self.transcript is not None and (last is None or not self.keep_context):
            self.transcript.reset()  # a conversation begun afresh
        return begin(
            last,
            agent=self.name,
            instructions=self.instructions,
            keep_context=self.keep_context,
            task=task,
            task_id=task_id,
        )

    def _report(self, state: AgentState) -> RunReport:
        return report_of(state, self._output, self._accepted)

    # -- the driver --

    async def _drive(self, state: AgentState) -> RunReport:
        # (a sub-agent, with no fence of its own, shows its teammate's to its tools)
        fenced = _current_fence.set(self.fence.token) if self.fence is not None else None
        try:
            if not telemetry.enabled():  # the run's span, only when there is one to make
                return await self._steps(state)
            return await traced.invoke_agent(self.name, state.task_id, self._steps(state))
        finally:
            if fenced is not None:
                _current_fence.reset(fenced)
            self._calls.deadlines.close()

    async def _steps(self, state: AgentState) -> RunReport:
        """The run's steps, as the step machine says, to a stop."""
        self.state = state
        self._withdrawn = None
        started, elapsed_before = self.clock(), state.elapsed
        specs = self.toolbox.specs
        output = self._structured()
        if self._output is not None and output is None:
            specs = [*specs, self._output.tool_spec]

        def elapsed() -> float:
            return elapsed_before + self.clock() - started

        self._calls.time = RunTime(self.limits, self.budget, elapsed)
        machine = self._machine = self._step_machine(output)
        typed = self._output.spec if self._output is not None else None
        # each model call yields (`Model`): it stands for the step's first checkpoint, unless
        # a cancellation may come after it, held back by the shielded budget charge or made
        # by a listener of the reply's text
        suspends = (
            getattr(self.model, "suspends", False) is True
            and self.budget is None
            and self.on_event is None
        )
        try:
            while state.stop is None:
                if state.open_step is not None:  # resumed between a reply and its results
                    await self._finish_step(state, state.open_step)
                    continue
                if machine.next(state, elapsed()) is STOPPED:
                    break
                if self.budget is not None and not await self._budget_allows(state):
                    break
                # (each await below is made only when it has something to do)
                injected = await self._step_boundary(state) if self.inbound is not None else []
                if state.stop is not None:
                    break
                # the boundary may have waited: another member's spend may have landed meanwhile
                if self.inbound is not None and not await self._within_budget(state):
                    break
                replaced = self.memory.over_budget(
                    state.context_tokens
                ) and await self._calls.compact_in_time(state)
                if state.stop is not None or (replaced and not await self._within_budget(state)):
                    break
                with self._interruptible() as self._in_flight:
                    reply = await self._calls.call(state, specs, output)
                self._in_flight = None
                if self._withdrawn is not None:
                    state.stop = Stop(reason="cancelled", detail=self._withdrawn)
                    break
                if reply is None:
                    break
                if self.transcript is not None:
                    self.transcript.record(
                        state.steps + 1, state.messages, reply, replaced, typed, output is not None
                    )
                if self.budget is None:
                    count(state, reply.usage, self.model.name, self.prices)
                else:
                    await self._calls.charge(state, reply.usage, self.model.name)
                # the reply is journaled, with the inputs it took in, before a tool runs
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
        finally:
            self._accepted = machine.accepted
        state.elapsed = elapsed()
        if self.journal is not None and state.stop is not None and state.stop.reason != "shutdown":
            self.journal.stop(state)  # a shutdown leaves the task open: the next one resumes it
        return machine.report(state)

    async def _finish_step(
        self, state: AgentState, step: OpenStep, checkpointed: bool = False
    ) -> None:
        """Act on a recorded reply: run the tool calls the step machine admits (those without
        a result yet), then close the step in the state and the journal. `checkpointed`: the
        reply's model call suspended (see `Model`), so the first call to run alone needs no
        checkpoint of its own."""
        machine = self._machine
        work = StepWork(dict(step.results), step.reply.tool_calls, checkpointed)
        pending = machine.take(state, step, work)
        journal = self.journal
        if work.fresh and journal is not None:
            for call_id, message in work.fresh:
                journal.result(call_id, message)
        if pending is not None:
            left, passed = self._calls.time.left()
            await self._tools.run(state, pending, work, left, passed)
            machine.account(state, work)
        machine.close(state, step, work)
        inbound = self.inbound
        handled = inbound.handled() if inbound is not None else []
        if handled:
            state.remember_handled(handled)
        state.elapsed = self._calls.time.elapsed()
        if journal is not None:
            journal.step(state, work.appended, work.calls, work.digests, handled)
        if inbound is not None:
            inbound.recorded()

    async def _budget_allows(self, state: AgentState) -> bool:
        """The shared budget, read before a model call; False, with the stop made, if spent
        (or if it has a cost cap the model has no price for)."""
        assert self.budget is not None
        try:
            await self.budget.check()
            check_priced_now(self.budget, self.model.name, self.prices)
        except LimitExceeded as exc:
            stop_at_limit(state, exc)
            return False
        return True

    async def _within_budget(self, state: AgentState) -> bool:
        """Read the shared budget again just before a model call starts (a call must not start
        once any member's spend has used it up); False, with the stop made, if it is spent."""
        if self.budget is None:
            return True
        try:
            await self.budget.check()
        except LimitExceeded as exc:
            stop_at_limit(state, exc)
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

    def _interruptible(self) -> contextlib.AbstractContextManager[anyio.CancelScope | None]:
        """A scope `interrupt` can cancel, for an agent fed by an inbound (a teammate, whose
        task can be withdrawn); none for another, whose caller cancels it directly."""
        return anyio.CancelScope() if self.inbound is not None else _UNBOUNDED


_UNBOUNDED = contextlib.nullcontext()
