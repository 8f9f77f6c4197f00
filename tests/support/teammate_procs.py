"""A teammate in a child process, for the kill tests:
`python tests/support/teammate_procs.py MODE DIR OUT`.

`listen`: teammate `w` wakes for every message and records each envelope id its model is shown.
`steps`: teammate `w` works a task as six tool calls in a row; the tool records when each call
starts and ends, with its call id (the idempotency key), so a test can see what ran again.
Both run until a shutdown request or a SIGKILL, with the journal in DIR/agents.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import anyio

from teamrt import FileMailboxes
from teamrt.agents import current_call_id, tool
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, call
from teamrt.team import Team, Teammate

SHOWN = re.compile(r"^\[(?:message|broadcast) (\S+) from", re.MULTILINE)
STEPS = 6


def _record(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode() + b"\n")
    finally:
        os.close(fd)


def listener(out: str) -> Teammate:
    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        ids = SHOWN.findall(messages[-1].content or "") if messages[-1].role == "user" else []
        for id_ in ids:
            _record(out, id_)
        return f"noted {len(ids)}"

    return Teammate("w", FunctionModel(brain), mail_batch=5)


def stepper(out: str) -> Teammate:
    @tool
    async def step(n: int) -> str:
        """One step of the job: a side effect that must not repeat."""
        _record(out, f"start {n} {current_call_id()}")
        await anyio.sleep(0.02)
        _record(out, f"end {n} {current_call_id()}")
        return f"step {n} done"

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        done = sum(1 for m in messages if m.role == "tool" and "done" in (m.content or ""))
        return call("step", n=done + 1) if done < STEPS else "all steps done"

    return Teammate("w", FunctionModel(brain), tools=[step])


async def main(mode: str, directory: str, out: str) -> None:
    teammate = listener(out) if mode == "listen" else stepper(out)
    async with (
        FileMailboxes(directory) as mail,
        Team(mail, [teammate], agent_dir=Path(directory) / "agents", lead_here=False) as team,
    ):
        Path(f"{out}.ready").write_text(str(time.monotonic()))
        await team.wait()


if __name__ == "__main__":
    mode, directory, out = sys.argv[1:4]
    anyio.run(main, mode, directory, out)
