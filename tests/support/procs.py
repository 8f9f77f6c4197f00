"""Child processes for the multi-process tests: `python tests/support/procs.py MODE ARGS...`.

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


def _install_faults() -> None:
    """The tests' own fault seam, installed in this child only (the store has no hook).

    TEAMRT_TEST_FAULT=torn-append:<bytes>:<nth>: the nth envelope write of this process writes
    only its first <bytes> bytes, then the process SIGKILLs itself.
    TEAMRT_TEST_FAULT=rotation:<step>:<nth>: die at the nth rotation, just before <step>
    (link, create or rename) of it.
    """
    name, _, arg = os.environ.get("TEAMRT_TEST_FAULT", "").partition(":")
    if name == "torn-append":
        nbytes, _, nth = arg.partition(":")
        real_write, left = os.write, [int(nth)]

        def torn_write(fd: int, data: bytes) -> int:
            if bytes(data[:7]) == b'{"seq":':
                left[0] -= 1
                if left[0] == 0:
                    real_write(fd, data[: int(nbytes)])
                    os.kill(os.getpid(), signal.SIGKILL)
            return real_write(fd, data)

        os.write = torn_write  # type: ignore[assignment]
    elif name == "rotation":
        step, _, nth = arg.partition(":")
        counter = [int(nth)]
        real = {"link": os.link, "create": os.open, "rename": os.rename}

        def dying(*args: object, **kwargs: object) -> object:
            if step != "create" or str(args[0]).endswith(".jsonl.next"):
                counter[0] -= 1
                if counter[0] == 0:
                    os.kill(os.getpid(), signal.SIGKILL)
            return real[step](*args, **kwargs)  # type: ignore[operator]

        setattr(os, {"link": "link", "create": "open", "rename": "rename"}[step], dying)


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


async def consume_until(team: str, effects: str, last: str) -> None:
    """Handle and ack everything until an envelope whose body is `last`; record id and seq."""
    async with FileMailboxes(team) as mail:
        inbox = mail.inbox("worker")
        Path(f"{effects}.ready").touch()
        while True:
            envelope = await inbox.receive(timeout=60)
            _record(effects, f"{envelope.id} {envelope.seq}")
            await inbox.ack(envelope)
            if envelope.body == last:
                return


MODES: dict[str, Callable[..., Awaitable[None]]] = {
    "consume-until": consume_until,
    "send": send,
    "consume-and-die": consume_and_die,
    "consume": consume,
    "wait-one": wait_one,
}

if __name__ == "__main__":
    _install_faults()
    anyio.run(MODES[sys.argv[1]], *sys.argv[2:])
