"""One agent's loop: the model decides, the tools act, the results go back, until a stop.

Theory of operation. All state is an `AgentState`. Each step checks the limits, compacts the
context if it is over budget, calls the model, and hands the reply to `decide()`, a pure
function that says whether it is an answer, tool calls, or malformed. Tool calls are validated and
run by the toolbox, their results (errors included) go back to the model as tool messages. A
malformed reply gets one corrective nudge; a second in a row stops the run. After each step the
journal gets the step's changes. Every way out of the loop produces a `RunReport`.

The driver never raises for the model's or the tools' misbehaviour: that is data for the report.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio

from teamrt.agents.journal import Journal, Transcript
from teamrt.agents.limits import PRICES, Limits, cost_of
from teamrt.agents.memory import Memory, context_tokens
from teamrt.agents.state import AgentState, RunReport, Stop
from teamrt.agents.tools import Tool, Toolbox, ToolResult
from teamrt.errors import LimitExceeded, ModelError, StopRequested, UsageError
from teamrt.models.base import ChatMessage, Model, ModelReply, ToolCall, Usage, message_tokens

NUDGE = (
    "Your last reply could not be used: {reason}. Reply with a valid tool call (arguments "
    "must be a JSON object matching the tool's schema) or with your final answer as text."
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


def decide(reply: ModelReply) -> Answer | CallTools | Malformed:
    """What a model reply means. Tool calls win over text (the text is a note to itself)."""
    if reply.tool_calls:
        for call in reply.tool_calls:
            try:
                arguments = json.loads(call.arguments or "{}")
            except ValueError as exc:
                return Malformed(f"the arguments of {call.name} are not valid JSON ({exc})")
            if not isinstance(arguments, dict):
                return Malformed(f"the arguments of {call.name} are not a JSON object")
        return CallTools(reply.tool_calls)
    if reply.text and reply.text.strip():
        return Answer(reply.text)
    return Malformed("it had neither text nor a tool call")


def signature(call: ToolCall) -> str:
    """A tool call's identity for loop detection: name and canonical arguments."""
    try:
        canonical = json.dumps(json.loads(call.arguments or "{}"), sort_keys=True)
    except ValueError:
        canonical = call.arguments
    return f"{call.name}({canonical})"


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


# --- the driver ---------------------------------------------------------------------------------

StepHook = Callable[[AgentState], Awaitable[list[ChatMessage]]]


class SharedBudget(Protocol):
    """A budget several agents draw on (see `teamrt.team.TeamBudget`)."""

    def check(self) -> None:
        """Raise LimitExceeded if the budget is spent."""

    def charge(self, usage: Usage, cost: float | None) -> None: ...


class Agent:
    """An agent: a model, tools, limits, memory, and optionally files to persist its run.

        agent = Agent("researcher", model, instructions="...", tools=[search])
        report = await agent.run("What is inotify?")

    `on_step`: called at every step boundary, before the model call; the messages it returns
    (say, envelopes that arrived meanwhile) join the conversation, and raising `StopRequested`
    ends the run cleanly. `budget`: a budget shared with other agents, checked before every
    model call and charged after it.
    `checkpoint`: a journal path; the run can be resumed from it after a crash (`resume()`).
    `transcript`: a path that receives every model call and reply. `directory`: both, as
    `<directory>/<name>.state.jsonl` and `<directory>/<name>.transcript.jsonl`.
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
        budget: SharedBudget | None = None,
    ) -> None:
        self.name = name
        self.on_step = on_step
        self.budget = budget
        self.model = model
        self.instructions = instructions
        self.toolbox = tools if isinstance(tools, Toolbox) else Toolbox(tools)
        self.limits = limits or Limits()
        self.memory = memory or Memory()
        self.prices = {**PRICES, **(prices or {})}
        if directory is not None:
            checkpoint = checkpoint or Path(directory) / f"{name}.state.jsonl"
            transcript = transcript or Path(directory) / f"{name}.transcript.jsonl"
        self.journal = Journal(checkpoint) if checkpoint is not None else None
        self.transcript = Transcript(transcript) if transcript is not None else None
        self.clock = clock
        self.state: AgentState | None = None
        if self.limits.max_cost is not None and model.name not in self.prices:
            raise UsageError(
                f"a cost budget needs a price for model {model.name!r}: "
                "pass prices={name: (usd_per_m_input, usd_per_m_output)}"
            )

    # -- entry points --

    async def run(self, task: str, *, resume: bool = False) -> RunReport:
        """Run `task` to a stop. With `resume=True`, continue an unfinished checkpointed run
        of the same task if there is one."""
        if resume and self.journal is not None:
            saved = self.journal.load()
            if saved is not None and saved.task == task and saved.stop is None:
                return await self._drive(saved)
        messages = [ChatMessage.system(self.instructions)] if self.instructions else []
        messages.append(ChatMessage.user(task))
        state = AgentState(
            agent=self.name,
            task=task,
            messages=messages,
            pinned=len(messages),
            context_tokens=context_tokens(messages),
        )
        if self.journal is not None:
            self.journal.start(state)
        if self.transcript is not None:
            self.transcript.reset()
        return await self._drive(state)

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

    # -- the loop --

    async def _drive(self, state: AgentState) -> RunReport:
        self.state = state
        started, elapsed_before = self.clock(), state.elapsed
        specs = self.toolbox.specs

        def elapsed() -> float:
            return elapsed_before + self.clock() - started

        self._elapsed = elapsed

        while state.stop is None:
            try:
                self.limits.check_model_call(
                    steps=state.steps,
                    tokens=state.usage.total_tokens,
                    cost=state.cost,
                    elapsed=elapsed(),
                )
                if self.budget is not None:
                    self.budget.check()
            except LimitExceeded as exc:
                self._stop_at_limit(state, exc)
                break
            injected = await self._step_boundary(state)
            if state.stop is not None:
                break
            replaced = False
            if self.memory.over_budget(state.context_tokens):
                state.messages = await self.memory.fit(state.messages, state.pinned)
                state.context_tokens = context_tokens(state.messages)
                state.compactions += 1
                replaced = True
                if self.journal is not None:
                    self.journal.replace(state.messages)
            reply = await self._call_model(state, specs, elapsed)
            if reply is None:
                break
            if self.transcript is not None:
                self.transcript.record(state.steps + 1, state.messages, reply, replaced)
            appended, calls, digests = await self._take_step(state, reply)
            if self.budget is not None:
                self.budget.charge(reply.usage, cost_of(reply.usage, self.model.name, self.prices))
            appended[:0] = injected
            state.elapsed = elapsed()
            if self.journal is not None:
                self.journal.step(state, appended, calls, digests)
        state.elapsed = elapsed()
        if self.journal is not None:
            self.journal.stop(state)
        return self._report(state)

    async def _step_boundary(self, state: AgentState) -> list[ChatMessage]:
        """Messages that arrived during the last step (the step hook's), added to the
        conversation before the next model call; a StopRequested ends the run here."""
        if self.on_step is None:
            return []
        try:
            injected = await self.on_step(state)
        except StopRequested as exc:
            state.stop = Stop(reason="shutdown", detail=str(exc))
            return []
        state.messages.extend(injected)
        state.context_tokens += sum(message_tokens(m) for m in injected)
        return injected

    async def _call_model(
        self, state: AgentState, specs: Sequence[Any], elapsed: Callable[[], float]
    ) -> ModelReply | None:
        deadline = self.limits.deadline
        try:
            if deadline is None:
                return await self.model.complete(state.messages, specs)
            with anyio.move_on_after(max(0.0, deadline - elapsed())):
                return await self.model.complete(state.messages, specs)
            raise LimitExceeded(
                "deadline",
                deadline,
                round(elapsed(), 3),
                "the wall-clock deadline (s) passed during a model call:",
            )
        except LimitExceeded as exc:
            self._stop_at_limit(state, exc)
        except ModelError as exc:
            state.stop = Stop(reason="model_error", detail=str(exc))
        return None

    async def _take_step(
        self, state: AgentState, reply: ModelReply
    ) -> tuple[list[ChatMessage], list[str], list[str]]:
        """Apply one reply to the state; returns the messages, call signatures and result
        digests it added."""
        state.steps += 1
        state.usage = state.usage + reply.usage
        step_cost = cost_of(reply.usage, self.model.name, self.prices)
        if step_cost is None:
            state.cost_known = False
        else:
            state.cost += step_cost
        appended = [reply.as_message()]
        calls: list[str] = []
        digests: list[str] = []
        decision = decide(reply)
        if isinstance(decision, Answer):
            state.nudges = 0
            state.answer = decision.text
            state.stop = Stop(reason="answer", detail="the model gave its answer")
        elif isinstance(decision, Malformed):
            for call in reply.tool_calls:  # every call needs a result, even an unusable one
                appended.append(
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
                appended.append(ChatMessage.user(NUDGE.format(reason=decision.reason)))
        else:
            state.nudges = 0
            await self._run_tools(state, decision.calls, appended, calls, digests)
        state.messages.extend(appended)
        state.context_tokens += sum(message_tokens(m) for m in appended)
        return appended, calls, digests

    async def _run_tools(
        self,
        state: AgentState,
        tool_calls: tuple[ToolCall, ...],
        appended: list[ChatMessage],
        calls: list[str],
        digests: list[str],
    ) -> None:
        learned = False
        for i, call in enumerate(tool_calls):
            sig = signature(call)
            try:
                self.limits.check_tool_call(
                    tool_calls=state.tool_calls,
                    repeats=state.call_counts.get(sig, 0),
                    signature=sig,
                )
            except LimitExceeded as exc:
                for skipped in tool_calls[i:]:  # keep the conversation well formed for a resume
                    appended.append(
                        ChatMessage.tool_result(skipped, json.dumps({"error": f"NotRun: {exc}"}))
                    )
                self._stop_at_limit(state, exc)
                return
            state.count_call(sig)
            calls.append(sig)
            state.tool_calls += 1
            result = await self._run_tool(call)
            if result is None:  # the deadline passed while it ran
                appended.append(
                    ChatMessage.tool_result(
                        call,
                        json.dumps(
                            {"error": "Deadline: the run's deadline passed while this tool ran"}
                        ),
                    )
                )
                self._stop_at_limit(
                    state,
                    LimitExceeded(
                        "deadline",
                        self.limits.deadline or 0,
                        round(self._elapsed(), 3),
                        f"the wall-clock deadline (s) passed while {call.name} ran:",
                    ),
                )
                return
            appended.append(ChatMessage.tool_result(call, result.content))
            if result.ok:
                state.consecutive_errors = 0
            else:
                state.tool_errors += 1
                state.consecutive_errors += 1
            digest = _digest(result.content)
            if state.is_new_result(digest):
                digests.append(digest)
                learned = True
        state.stale_steps = 0 if learned else state.stale_steps + 1
        try:
            self.limits.check_after_tools(
                consecutive_errors=state.consecutive_errors, stale_steps=state.stale_steps
            )
        except LimitExceeded as exc:
            self._stop_at_limit(state, exc)

    async def _run_tool(self, call: ToolCall) -> ToolResult | None:
        """Run one call; None if the run's deadline passed first (the tool is cancelled)."""
        deadline = self.limits.deadline
        if deadline is None:
            return await self.toolbox.run(call)
        with anyio.move_on_after(max(0.0, deadline - self._elapsed())):
            return await self.toolbox.run(call)
        return None

    _elapsed: Callable[[], float]

    @staticmethod
    def _stop_at_limit(state: AgentState, exc: LimitExceeded) -> None:
        state.stop = Stop(
            reason="limit", detail=str(exc), limit=exc.limit, value=exc.value, used=exc.used
        )

    def _report(self, state: AgentState) -> RunReport:
        assert state.stop is not None
        partial = None
        if state.answer is None:
            for m in reversed(state.messages[state.pinned :]):
                if m.content and m.role in ("assistant", "tool"):
                    partial = m.content
                    break
        return RunReport(
            agent=state.agent,
            task=state.task,
            stop=state.stop,
            answer=state.answer,
            partial=partial,
            steps=state.steps,
            tool_calls=state.tool_calls,
            tool_errors=state.tool_errors,
            usage=state.usage,
            cost=state.cost if state.cost_known else None,
            elapsed=state.elapsed,
            compactions=state.compactions,
        )
