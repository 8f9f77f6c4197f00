"""Child processes for the fencing tests: `python -m tests.support.fencing_procs MODE URL OUT`.

consumer: owns `worker`'s inbox and writes the id of every envelope it hands its application
to OUT (one a line), acking each; prints `holding` once it owns the inbox and `lost` when it
meets `LeaseLost`.

team: runs a Team whose teammate `worker` records to OUT every task its model is shown (`model
<task>`) and every call of its tool (`effect <task> <fence>`). On the task `slow` the model
writes `waiting` and blocks the whole process (no renewals, like a long GC pause) until the
file OUT.go exists, then calls the tool. Prints `ready` once the team runs and `lease lost`
when the teammate stopped for that reason.

hold (URL is a team directory): takes `worker`'s file lease, prints `holding`, and waits.
take (URL is a team directory): tries to take `worker`'s file lease; prints `took` or `busy`
with the error.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import anyio

from teamrt import FileMailboxes
from teamrt.agents import current_fence, tool
from teamrt.errors import LeaseLost, MemberBusy
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.redisstore import RedisStore
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, call
from teamrt.team import Team, Teammate


def record(path: str, line: str) -> None:
    """Append one line to `path` at once (the test reads it while this process runs)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode() + b"\n")
    finally:
        os.close(fd)


async def consumer(url: str, out: str) -> None:
    async with Mailboxes(RedisStore(url)) as mail:
        inbox = await mail.open_inbox("worker")
        print("holding", flush=True)
        try:
            while True:
                got = await inbox.receive()
                record(out, got.id)
                await inbox.ack(got)
        except LeaseLost:
            print("lost", flush=True)


def task_of(messages: Sequence[ChatMessage]) -> str:
    """The name of the task a teammate's model is working on: the last word of the last
    user message (the task's text)."""
    text = next(m.content or "" for m in reversed(messages) if m.role == "user")
    return text.split()[-1] if text.split() else ""


def recording_worker(out: str) -> Teammate:
    """`worker`, recording what its model is shown and what its tool does (see the module
    docstring)."""
    go = Path(out + ".go")

    @tool
    def effect(task: str) -> str:
        """The task's side effect."""
        record(out, f"effect {task} {current_fence()}")
        return "effect done"

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        if messages[-1].role == "tool":
            return "finished"
        task = task_of(messages)
        record(out, f"model {task}")
        if task == "slow":
            record(out, "waiting")
            while not go.exists():  # the process stops renewing its lease meanwhile
                time.sleep(0.01)
        return call("effect", task=task)

    return Teammate("worker", FunctionModel(brain), tools=[effect])


async def team(url: str, out: str) -> None:
    async with (
        Mailboxes(RedisStore(url)) as mail,
        Team(mail, [recording_worker(out)]) as running,
    ):
        print("ready", flush=True)
        status = running.status["worker"]
        while status.last != "lease lost":  # noqa: ASYNC110 -- polled: the Team sets it
            await anyio.sleep(0.02)
        print("lease lost", flush=True)


async def hold(directory: str, out: str) -> None:
    async with FileMailboxes(directory) as mail:
        mail.inbox("worker")
        print("holding", flush=True)
        await anyio.sleep_forever()


async def take(directory: str, out: str) -> None:
    async with FileMailboxes(directory) as mail:
        try:
            mail.inbox("worker")
        except MemberBusy as exc:
            print("busy", exc, flush=True)
        else:
            print("took", flush=True)


def main() -> None:
    mode, url, out = sys.argv[1:4]
    modes = {"consumer": consumer, "team": team, "hold": hold, "take": take}
    try:
        anyio.run(modes[mode], url, out)
    except LeaseLost:
        print("lost", flush=True)
    except BaseException as exc:
        print("exit:", type(exc).__name__, exc, flush=True)


if __name__ == "__main__":
    main()
