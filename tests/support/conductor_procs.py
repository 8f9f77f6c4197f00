"""Teammates for the conductor's process tests, run with `teamrt run-agent DIR --name NAME
--spec tests.support.conductor_procs:OBJECT` from the repository's root.

`hanger`: takes any task and hangs in its tool, for good (a worker that never answers).
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from teamrt.agents import tool
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, call
from teamrt.team import Teammate


def hanger() -> Teammate:
    @tool
    async def make(subtask: str) -> str:
        """Make the subtask's file (never does: hangs)."""
        await anyio.sleep_forever()
        return "unreachable"

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        if messages[-1].role == "tool":
            return "done"
        return call("make", subtask="any")

    return Teammate("hanger", FunctionModel(brain), tools=[make])
