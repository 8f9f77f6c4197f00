"""Teammates for `teamrt run-agent --spec remote_specs:NAME` in the multi-process tests (the
tests put this directory on the child's PYTHONPATH)."""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from teamrt.agents import Limits, tool
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, Usage, call
from teamrt.team import Teammate


def _crash(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
    raise RuntimeError("a bug in the remote teammate")


#: crashes on its first task; no restart policy
crasher = Teammate("w", FunctionModel(_crash))


def _spend(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
    thought = call("note", text=f"thought {len(messages)}")
    return thought.model_copy(update={"usage": Usage(requests=1, input_tokens=150)})


@tool
def note(text: str) -> str:
    """Write a note."""
    return text


#: thinks for ever, 150 tokens a call: only a budget stops it
spender = Teammate(
    "w",
    FunctionModel(_spend),
    tools=[note],
    limits=Limits(max_steps=1000, max_tool_calls=1000, max_repeats=1000, max_stale_steps=1000),
)


@tool
async def dig() -> str:
    """Never finishes."""
    await anyio.sleep_forever()
    return "never"


def _dig(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
    return call("dig")


#: stuck in a tool: only the shutdown deadline ends it
stuck = Teammate("w", FunctionModel(_dig), tools=[dig])

#: answers at once
echo = Teammate("w", FunctionModel(lambda m, t: "echo"))


def _look_then_say(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
    if messages[-1].role == "tool":
        return "the note says: " + (messages[-1].content or "")
    return call("note", text="inotify watches files")


#: one tool call, then an answer (streamed by FunctionModel in a few chunks)
looker = Teammate("w", FunctionModel(_look_then_say), tools=[note])
