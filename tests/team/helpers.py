"""What the team tests share: a worker held in a tool until released, the lead's late mail and
the cancelled answers in it, and a lead in a process of its own (tests/support/lead_procs.py),
asked to ask and killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio

from teamrt.agents import tool
from teamrt.envelopes import Envelope
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, call
from teamrt.team import TaskResult, Team, Teammate
from tests.support.paths import SUPPORT

#: the lead's child program: `python LEAD_PROCS MODE ARGS...`
LEAD_PROCS = str(SUPPORT / "lead_procs.py")


class Worker:
    """A teammate whose task "hold" waits in a tool until `gate` opens; it records the tasks
    its model is given (first call of each) and the model calls of each."""

    def __init__(self) -> None:
        self.gate, self.holding = anyio.Event(), anyio.Event()
        self.calls: list[str] = []

        @tool
        async def wait_for_gate() -> str:
            """Wait."""
            self.holding.set()
            await self.gate.wait()
            return "open"

        def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
            task = next(m.content or "" for m in reversed(messages) if m.role == "user")
            self.calls.append(task)
            if task == "hold" and messages[-1].role == "user":
                return call("wait_for_gate")
            return f"done: {task}"

        self.teammate = Teammate("w", FunctionModel(brain), tools=[wait_for_gate])


async def until(check: Callable[[], bool]) -> None:
    """Poll `check` until it holds (30 s at the most)."""
    with anyio.fail_after(30):
        while not check():  # noqa: ASYNC110 -- polled: the teammate's task decides
            await anyio.sleep(0.01)


_late_mail: dict[int, list[Envelope]] = {}


def lead_mail_so_far(team: Team) -> list[Envelope]:
    """Everything the lead's mail stream has brought (late answers arrive there), kept."""
    seen = _late_mail.setdefault(id(team), [])
    seen.extend(team.lead_mail_nowait())
    return seen


def cancelled_answers(team: Team) -> list[TaskResult]:
    """The answers in the lead's mail so far that say their task was cancelled."""
    return [
        TaskResult.model_validate(e.body)
        for e in lead_mail_so_far(team)
        if e.kind == "response"
        and isinstance(e.body, dict)
        and e.body.get("stop_reason") == "cancelled"
    ]


def spawn_lead(team: str | Path, out: Path, key: str | None = None) -> subprocess.Popen[bytes]:
    """A lead process that asks the remote w (see lead_procs.py), once it is asking."""
    asking = Path(f"{out}.asking")
    asking.unlink(missing_ok=True)
    args = [sys.executable, LEAD_PROCS, "ask", str(team), str(out), *([key] if key else [])]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not asking.exists():
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        assert time.monotonic() < deadline, "the lead process did not start"
        time.sleep(0.005)
    return proc


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a child and reap it."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    if proc.stderr is not None:
        proc.stderr.close()


def slow_w(started: anyio.Event, release: anyio.Event, calls: list[str]) -> Teammate:
    """w answers once released, counting its model calls."""

    async def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        calls.append(messages[-1].content or "")
        started.set()
        await release.wait()
        return "forty-two"

    return Teammate("w", FunctionModel(brain))
