"""Teammates for the `teamrt run-agent` outage tests (`--spec outage_specs:holder`): the test
starts the outage while the teammate's tool holds, and the teammate's next model call needs the
store (its budget is read first). `OUTAGE_DIR` names the directory of the two flag files."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import anyio

from teamrt.agents import tool
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, call
from teamrt.team import Teammate


@tool
async def hold() -> str:
    """Say that it holds (file `holding`), then wait until the test says go (file `go`)."""
    flags = Path(os.environ["OUTAGE_DIR"])
    (flags / "holding").touch()
    while not (flags / "go").exists():  # noqa: ASYNC110 -- another process makes it
        await anyio.sleep(0.02)
    return "held"


def _hold_then_answer(
    messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
) -> ModelReply | str:
    if messages[-1].role == "tool":
        return "answered after the outage"
    return call("hold")


holder = Teammate("w", FunctionModel(_hold_then_answer), tools=[hold])
