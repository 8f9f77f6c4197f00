"""Child processes for the multi-process tests: `python tests/procs.py MODE ARGS...`.

Each mode opens the team directory itself, as an unrelated program would.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from teamrt import Envelope, FileMailboxes


def _record(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode() + b"\n")
    finally:
        os.close(fd)


def _wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(0.001)


async def send(team: str, sender: str, count: str, pad: str, acks: str, start: str) -> None:
    """Send `count` envelopes; record each id once send() has returned (the acknowledgement)."""
    first = int(start)
    async with FileMailboxes(team) as mail:
        Path(f"{acks}.ready").touch()
        _wait_for(Path(team).parent / "go")
        for i in range(first, first + int(count)):
            envelope = Envelope.message(sender, "worker", {"i": i, "pad": "x" * int(pad)})
            await mail.send(envelope)
            _record(acks, f"{envelope.id} {sender} {i}")


async def consume_and_die(team: str, effects: str) -> None:
    """Handle one envelope, then die before acking it."""
    async with FileMailboxes(team) as mail:
        envelope = await mail.inbox("worker").receive(timeout=20)
        _record(effects, envelope.id)
        os.kill(os.getpid(), signal.SIGKILL)


async def consume(team: str, effects: str, count: str) -> None:
    """Handle and ack `count` envelopes."""
    async with FileMailboxes(team) as mail:
        inbox = mail.inbox("worker")
        for _ in range(int(count)):
            envelope = await inbox.receive(timeout=20)
            _record(effects, envelope.id)
            await inbox.ack(envelope)


async def wait_one(team: str, out: str) -> None:
    """Block in receive() with the safety rescan effectively off; report what arrived."""
    async with FileMailboxes(team, rescan_interval=3600) as mail:
        inbox = mail.inbox("worker")
        Path(f"{out}.ready").touch()
        envelope = await inbox.receive(timeout=60)
        Path(out).write_text(json.dumps({"body": envelope.body, "at": time.monotonic()}))


MODES: dict[str, Callable[..., Awaitable[None]]] = {
    "send": send,
    "consume-and-die": consume_and_die,
    "consume": consume,
    "wait-one": wait_one,
}

if __name__ == "__main__":
    anyio.run(MODES[sys.argv[1]], *sys.argv[2:])
