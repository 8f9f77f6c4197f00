"""Running a step's admitted tool calls: one alone, several side by side, a waiting one.

`ToolRunner` is the part of the agent's driver that runs the calls the step machine admits
(`StepMachine.take`): the calls of one reply run concurrently (at most `max_parallel_tools`
at a time), a `sequential` tool alone, each result journaled as it comes and announced to
listeners, and all of them stopped at the run's deadline.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import TYPE_CHECKING

import anyio

from teamrt import telemetry
from teamrt.agents import traced
from teamrt.agents.deadline import Passed
from teamrt.agents.events import ToolCallFinished, ToolCallStarted
from teamrt.agents.state import AgentState
from teamrt.agents.step import StepWork, stop_at_limit
from teamrt.agents.tools import Toolbox, ToolResult
from teamrt.models.base import ChatMessage, ToolCall

if TYPE_CHECKING:
    from teamrt.agents.loop import Agent


class ToolRunner:
    """Runs tool calls for `agent` (its toolbox, limits, fence, listener and journal, read as
    they are at each call: a Team sets the fence, `stream` the listener)."""

    def __init__(self, agent: Agent, max_parallel: int) -> None:
        self.agent = agent
        self.parallel = anyio.CapacityLimiter(max_parallel)

    async def run(
        self, state: AgentState, calls: list[ToolCall], work: StepWork, left: float, passed: Passed
    ) -> None:
        """Run `calls`, stopping them at the run's deadline (`left` seconds from now; `passed`
        says which one it is)."""
        if left == math.inf and len(calls) == 1:  # the common case: one call, no deadline
            await self.run_one(state, calls[0], work, alone=True)
            return
        toolbox = self.agent.toolbox
        groups: list[list[ToolCall]] = []
        for call in calls:
            alone = _is_sequential(toolbox, call)
            if alone or not groups or _is_sequential(toolbox, groups[-1][-1]):
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
            stop_at_limit(state, passed(f"while {names} ran"))

    async def _run_groups(
        self, state: AgentState, groups: list[list[ToolCall]], work: StepWork
    ) -> None:
        """Each group in turn: a group of one call runs here, the calls of a larger one side
        by side (at most `max_parallel_tools` at a time)."""
        for group in groups:
            if len(group) == 1:
                await self.run_one(state, group[0], work, alone=True)
                continue
            async with anyio.create_task_group() as tg:
                for call in group:
                    tg.start_soon(self.run_one, state, call, work)

    async def run_one(
        self, state: AgentState, call: ToolCall, work: StepWork, alone: bool = False
    ) -> None:
        """Run one call and record its result, announced to listeners before and after. A call
        run `alone` first passes a checkpoint (other tasks run; a cancellation lands before the
        call is announced), as one under the limiter does in taking it, unless the step passed
        one since its last call (its model call suspended: the first call needs none)."""
        agent = self.agent
        if alone:
            if work.checkpointed:
                work.checkpointed = False
            else:
                await asyncio.sleep(0)  # (what anyio's checkpoint is on asyncio)
        if agent.fence is not None:  # a fresh look: a paused process's own flags are stale
            await agent.fence.check()  # LeaseLost: the call does not run, the incarnation stops
        toolbox = agent.toolbox
        found = toolbox.get(call.name)
        waits = found is not None and found.waits
        keyed = call
        if agent.call_id_prefix is not None:
            position = next(i for i, c in enumerate(work.reply_calls) if c.id == call.id)
            keyed = call.model_copy(
                update={"id": f"{agent.call_id_prefix}:{state.steps}.{position}"}
            )
        listener = agent.on_event
        if listener is not None:
            await listener(ToolCallStarted(call))
        if telemetry.enabled():
            result = await traced.execute_tool(call, self._run_call(state, keyed, waits, alone))
        elif alone and not waits:  # what _run_call does with such a call
            if found is not None and found.inline:  # a plain function: nothing to await
                result = toolbox.run_now(keyed, found)
            else:
                result = await toolbox.run(keyed)
        else:
            result = await self._run_call(state, keyed, waits, alone)
        self._record(work, call, ChatMessage.tool_result(call, result.content))
        if listener is not None:
            await listener(ToolCallFinished(call.id, call.name, result.content, result.ok))

    async def _run_call(
        self, state: AgentState, keyed: ToolCall, waits: bool, alone: bool
    ) -> ToolResult:
        """Run one call, under the limiter when other calls of the reply run beside it (alone,
        it is within `max_parallel_tools` as it is)."""
        if alone:
            return await self._run_tool(state, keyed, waits)
        async with self.parallel:
            return await self._run_tool(state, keyed, waits)

    async def _run_tool(self, state: AgentState, keyed: ToolCall, waits: bool) -> ToolResult:
        """Run one call; one that waits for others counts as idle time, bounded by the idle
        limit."""
        agent = self.agent
        if not waits:
            return await agent.toolbox.run(keyed)
        started = agent.clock()
        max_idle = agent.limits.max_idle
        if max_idle is not None:  # the idle limit bounds each wait
            result: ToolResult | None = None
            with anyio.move_on_after(max(0.0, max_idle - state.idle)):
                result = await agent.toolbox.run(keyed)
            if result is None:
                result = ToolResult(
                    json.dumps({"nothing_arrived": "stopped waiting: the idle limit"}), True
                )
        else:
            result = await agent.toolbox.run(keyed)
        state.idle += agent.clock() - started
        return result

    def _record(self, work: StepWork, call: ToolCall, message: ChatMessage) -> None:
        work.results[call.id] = message
        journal = self.agent.journal
        if journal is not None:
            journal.result(call.id, message)


def _is_sequential(toolbox: Toolbox, call: ToolCall) -> bool:
    found = toolbox.get(call.name)
    return found is not None and found.sequential
