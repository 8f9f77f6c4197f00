"""What a run looks like as it happens: the events `Agent.stream` yields and `on_event` gets."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

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
