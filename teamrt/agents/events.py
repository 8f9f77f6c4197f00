"""What a run looks like as it happens: the events `Agent.stream` yields and `on_event` gets,
and the stream of them."""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import anyio

from teamrt.agents.state import RunReport
from teamrt.models.base import TextDelta, ToolCall


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


class Listened(Protocol):
    """What has a listener that `event_stream` can stand in front of (an `Agent`)."""

    on_event: EventSink | None


@contextlib.asynccontextmanager
async def event_stream(
    host: Listened, run: Callable[[], Awaitable[RunReport]]
) -> AsyncIterator[AsyncIterator[AgentEvent]]:
    """`run()` in a task of its own while the block reads what it does: every event `host`'s
    listener gets (the listener it had still gets them), and last the `RunReport`. Leaving
    the block before the report cancels the run; the run's own error is raised as it is."""
    send, receive = anyio.create_memory_object_stream[AgentEvent](math.inf)
    previous = host.on_event

    async def relay(event: AgentEvent) -> None:
        if previous is not None:
            await previous(event)
        await send.send(event)

    async def drive() -> None:
        async with send:
            host.on_event = relay
            try:
                report = await run()
            finally:
                host.on_event = previous
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
