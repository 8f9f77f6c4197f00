"""Teammates for the withdrawal tests' `teamrt run-agent` children: each model call appends the
task it works on to the file named by TEAMRT_TEST_RECORD, so the test sees what ran, and where."""

from __future__ import annotations

import os
from collections.abc import Sequence

import anyio

from teamrt.agents import tool
from teamrt.envelopes import Request
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, call
from teamrt.team import Teammate
from teamrt.team.desk import Desk


def _record(line: str) -> None:
    with open(os.environ["TEAMRT_TEST_RECORD"], "a") as out:
        out.write(f"{os.getpid()} {line}\n")


def _task(messages: Sequence[ChatMessage]) -> str:
    return next((m.content or "" for m in reversed(messages) if m.role == "user"), "")


@tool
async def hold() -> str:
    """Never finishes."""
    _record("hold")
    await anyio.sleep_forever()
    return "never"


def _holder(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
    task = _task(messages)
    _record(task)
    if task.startswith("hold") and messages[-1].role == "user":
        return call("hold")
    return f"done: {task}"


#: a task whose text starts "hold" stays in a tool for ever; any other is answered at once
holder = Teammate("w", FunctionModel(_holder), tools=[hold])


def _die_before_the_ack(self: Desk, request: Request) -> None:
    os._exit(9)


def _crash(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
    _record(_task(messages))
    # the process dies right after its crash answer goes out, before it acks the task: as a
    # SIGKILL between the two would, deterministically instead of by a race
    Desk.done = _die_before_the_ack  # type: ignore[method-assign]  # the test's seam
    raise RuntimeError("a bug in the teammate")


#: crashes on its first task (no restart) and dies before the task's ack is committed
crash_then_die = Teammate("w", FunctionModel(_crash))
