"""The mailbox children of `teamrt bench`: processes on the other side of a figure, started as
`python -m teamrt.bench.children ROLE ARGS...` (`teamrt.bench.harness.spawn`).

- `_echo TEAM READY`: answers every request in `echo`'s inbox (a `cpu` request with its CPU time
  so far) until a `stop`;
- `_waker TEAM READY OUT`: notes how long each envelope took to wake it, written to OUT at `stop`;
- `_writer PLAIN DURABLE NAME OUT`: sends as many envelopes as it is told on stdin (see
  `teamrt.bench.harness.Writers`).
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from array import array
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from teamrt.envelopes import Envelope
from teamrt.mail import FileMailboxes


async def _echo(team: str, ready: str) -> None:
    async with FileMailboxes(team) as mail:
        inbox = mail.inbox("echo")
        Path(ready).touch()
        while True:
            request = await inbox.receive()
            if request.type == "stop":
                await inbox.ack(request)
                return
            body = time.process_time() if request.type == "cpu" else request.body
            await mail.send(Envelope.response(request, body))
            inbox.ack_nowait(request)  # the cursor is committed in the background


async def _waker(team: str, ready: str, out: str) -> None:
    delays = array("d")
    async with FileMailboxes(team, rescan_interval=3600) as mail:
        inbox = mail.inbox("echo")
        Path(ready).touch()
        while True:
            envelope = await inbox.receive()
            now = time.monotonic()
            if envelope.type == "stop":
                break
            delays.append((now - envelope.body) * 1e6)
            inbox.ack_nowait(envelope)
    Path(out).write_bytes(delays.tobytes())


async def _writer(plain: str, durable: str, name: str, out: str) -> None:
    """One writer process: told a count and a durability on stdin, it builds that many
    envelopes, says `built`, waits for `go`, sends them into the team of that durability, and
    says when it started and ended (the latencies go to a file)."""
    lines = sys.stdin.buffer
    async with (
        FileMailboxes(plain) as none,
        FileMailboxes(durable, durability="fsync") as fsync,
    ):
        print("ready", flush=True)
        for step in itertools.count():
            line = await anyio.to_thread.run_sync(lines.readline)
            if not line.strip():
                return
            count, durability = line.split()
            mail = fsync if durability == b"fsync" else none
            envelopes = [
                Envelope.message(name, "sink", {"i": i, "text": "hello world"})
                for i in range(int(count))
            ]
            print("built", flush=True)
            await anyio.to_thread.run_sync(lines.readline)
            latencies = array("d")
            start = time.monotonic()
            for envelope in envelopes:
                t0 = time.perf_counter_ns()
                await mail.send(envelope)
                latencies.append((time.perf_counter_ns() - t0) / 1000)
            end = time.monotonic()
            path = Path(out) / f"{name}-{step}.lat"
            path.write_bytes(latencies.tobytes())
            print(json.dumps({"start": start, "end": end, "latencies": str(path)}), flush=True)


ROLES: dict[str, Callable[..., Awaitable[Any]]] = {
    "_echo": _echo,
    "_waker": _waker,
    "_writer": _writer,
}

if __name__ == "__main__":
    anyio.run(ROLES[sys.argv[1]], *sys.argv[2:])
