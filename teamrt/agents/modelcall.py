"""The agent's model calls: the reply (streamed to a listener), held to the run's deadlines.

`ModelCalls` is the part of the agent's driver that performs the step machine's `CallModel`:
it asks the model (for structured output when the answer is typed and the model takes it,
streaming when someone listens and the model can), bounds the call by the nearest deadline
and `model_timeout`, and turns the model's failures into the run's stop, as data. The
context's compaction is a model call too (a summariser), under the same rules.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any, cast

import anyio

from teamrt import telemetry
from teamrt.agents import traced
from teamrt.agents.deadline import CallDeadlines, Passed, RunTime, within
from teamrt.agents.memory import context_tokens
from teamrt.agents.state import AgentState, Stop
from teamrt.agents.step import count, stop_at_limit
from teamrt.agents.tools import cancelled_for_real
from teamrt.errors import LimitExceeded, ModelError
from teamrt.models.base import (
    ModelReply,
    OutputSpec,
    StreamingModel,
    StructuredOutputModel,
    StructuredStreamingModel,
    TextDelta,
    Usage,
)

if TYPE_CHECKING:
    from teamrt.agents.loop import Agent

log = logging.getLogger("teamrt.agents")


class ModelCalls:
    """Model calls for `agent` (its model, limits, budget and listener, read as they are at
    each call). `time`: the run's time and deadlines, set by the driver as a run starts."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.deadlines = CallDeadlines()
        self.time = RunTime(agent.limits, agent.budget, lambda: 0.0)

    async def charge(self, state: AgentState, usage: Usage, model: str) -> None:
        """Count a call's spend in the run, and charge it to the shared budget."""
        agent = self.agent
        cost = count(state, usage, model, agent.prices)
        if agent.budget is not None:
            with anyio.CancelScope(shield=True):  # spent is spent: the ledger must say so
                await agent.budget.charge(usage, cost)

    async def call(
        self, state: AgentState, specs: Sequence[Any], output: OutputSpec | None
    ) -> ModelReply | None:
        """The model's reply, or None with the run's stop made (a limit, the model's failure)."""
        agent = self.agent
        limits = agent.limits
        left, passed = self.time.left()
        per_call = limits.model_timeout
        if limits.max_model_time is not None:  # what is left of the task's model time
            rest = max(0.0, limits.max_model_time - state.model_time)
            per_call = rest if per_call is None else min(per_call, rest)
        bound = min(left, per_call if per_call is not None else math.inf)
        started = agent.clock()
        try:
            if bound == math.inf:  # no deadline: no timer to set and take back
                reply = await self._asking(state, specs, output)
            else:
                deadlines = self.deadlines
                deadlines.start(bound)
                try:
                    reply = await self._asking(state, specs, output)
                except (asyncio.CancelledError, TimeoutError):
                    # the deadline's cancellation (taken back), or a TimeoutError a model made
                    # of it, is the deadline; any other is a cancellation of this task, or the
                    # model's own timeout
                    if not deadlines.finish():
                        raise
                    raise self._expired(state, started, per_call, left, passed) from None
                except BaseException:
                    deadlines.finish()
                    raise
                deadlines.finish()  # (a cancellation the model swallowed is taken back)
            if reply is None:  # a broken model's fault, not a deadline
                raise ModelError(
                    f"{agent.model.name}: the model call returned None, not a ModelReply"
                )
            state.attempts += reply.attempts
            if reply.rate_limited:
                state.rate_limited += reply.rate_limited
            if reply.usage_estimated and not state.usage_estimated:
                state.usage_estimated = True
            return reply
        except LimitExceeded as exc:
            stop_at_limit(state, exc)
        except ModelError as exc:
            model_failed(state, exc)
        except anyio.get_cancelled_exc_class():
            if cancelled_for_real():
                raise
            detail = (
                f"{agent.model.name}: the model call raised a cancellation of its own (not a "
                "deadline or a shutdown of this agent)"
            )
            log.warning("%s stopped: %s", state.agent, detail)
            state.stop = Stop(reason="model_error", detail=detail)
        finally:
            state.model_time += agent.clock() - started
        return None

    def _expired(
        self,
        state: AgentState,
        started: float,
        per_call: float | None,
        left: float,
        passed: Passed,
    ) -> LimitExceeded:
        """The limit a call cut short by its deadline reached: its own timeout, the task's model
        time, or the run's (or the team's) deadline."""
        if per_call is None or per_call >= left:
            return passed("during a model call")
        limits = self.agent.limits
        clock = self.agent.clock
        model_time = state.model_time + clock() - started
        limit = limits.max_model_time
        if limit is not None and model_time >= limit:
            return LimitExceeded(
                "max_model_time",
                limit,
                round(model_time, 3),
                "the time spent waiting for the model (s) ran out during a call:",
            )
        return LimitExceeded(
            "model_timeout",
            limits.model_timeout or per_call,
            round(clock() - started, 3),
            "a model call (retries included) took longer than allowed (s):",
        )

    def _asking(
        self, state: AgentState, specs: Sequence[Any], output: OutputSpec | None
    ) -> Awaitable[ModelReply]:
        """The model call to await: the model's own when that is all there is to it (no
        answer schema, no listener, no telemetry), else `_complete`'s, traced when on."""
        agent = self.agent
        if telemetry.enabled():
            return traced.chat(agent.model.name, self._complete(state, specs, output))
        if output is None and agent.on_event is None:
            return agent.model.complete(state.messages, specs)
        return self._complete(state, specs, output)

    async def _ask(
        self, state: AgentState, specs: Sequence[Any], output: OutputSpec | None
    ) -> ModelReply:
        """The model's reply, held to the answer's schema when there is one (`output` is only
        given for a model that takes it)."""
        model = self.agent.model
        if output is not None:
            structured = cast(StructuredOutputModel, model)
            return await structured.complete(state.messages, specs, output=output)
        return await model.complete(state.messages, specs)

    async def _complete(
        self, state: AgentState, specs: Sequence[Any], output: OutputSpec | None
    ) -> ModelReply:
        """One model call; streamed when someone listens and the model can stream."""
        listener = self.agent.on_event
        if listener is None:
            return await self._ask(state, specs, output)
        model = self.agent.model
        streams = (
            isinstance(model, StructuredStreamingModel)
            if output is not None
            else isinstance(model, StreamingModel)
        )
        if not streams:
            whole = await self._ask(state, specs, output)
            if whole.text:
                await listener(TextDelta(text=whole.text))
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
                    await listener(item)
                else:
                    reply = item
        finally:
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()  # a stream left early gives its connection back
        if reply is None:
            raise ModelError(f"{model.name}: the stream ended without a reply")
        return reply

    # -- the context's compaction --

    async def compact_in_time(self, state: AgentState) -> bool:
        """`compact` under the same rules as a model call (a summariser is a model): the
        deadlines and `model_timeout` stop it, and its failure is a `model_error` stop. True
        if the conversation was replaced."""
        agent = self.agent
        left, passed = self.time.left()
        per_call = agent.limits.model_timeout
        bound = min(left, per_call if per_call is not None else math.inf)
        started = agent.clock()
        try:
            with within(bound):
                return await self.compact(state)
            if per_call is not None and per_call < left:
                raise LimitExceeded(
                    "model_timeout",
                    per_call,
                    round(agent.clock() - started, 3),
                    "a summary of the context took longer than a model call may (s):",
                )
            raise passed("while the context was summarised")
        except LimitExceeded as exc:
            stop_at_limit(state, exc)
        except ModelError as exc:
            state.stop = Stop(reason="model_error", detail=f"the summariser failed: {exc}")
        finally:
            state.model_time += agent.clock() - started
        return False

    async def compact(self, state: AgentState) -> bool:
        """Bring the context within budget; True if the conversation was replaced."""
        memory = self.agent.memory
        if not memory.over_budget(state.context_tokens):
            return False
        task = state.messages[state.task_index] if state.task_index is not None else None
        compacted = await memory.compact(state.messages, state.pinned, keep=task)
        state.messages = compacted.messages
        if task is not None:
            state.task_index = next(i for i, m in enumerate(state.messages) if m is task)
        state.context_tokens = context_tokens(state.messages)
        state.compactions += 1
        if compacted.usage.requests and memory.summariser is not None:
            await self.charge(state, compacted.usage, memory.summariser.name)
        journal = self.agent.journal
        if journal is not None:
            journal.replace(state.messages, state.task_index)
        return True


def model_failed(state: AgentState, exc: ModelError) -> None:
    """End the run with the model's failure (its attempts and rate limits counted)."""
    attempts = int(getattr(exc, "attempts", 1) or 1)
    limited = int(getattr(exc, "rate_limited", 0) or 0)
    state.attempts += attempts
    state.rate_limited += limited
    detail = str(exc)
    if limited and "rate limit" not in detail:
        detail += f" ({limited} of {attempts} attempts were rate limited: 429)"
    log.warning("%s stopped: the model failed: %s", state.agent, detail)
    state.stop = Stop(reason="model_error", detail=detail)
