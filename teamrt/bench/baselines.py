"""The baselines `teamrt bench` measures teamrt beside, in the same run: a raw locked append (and
a raw fsync'd one), an asyncio.Queue ping-pong in this process, and an os.pipe ping-pong and idle
wake with a lean child (pipes.py) that imports no teamrt. The floor under the round trip, a minimal
mailbox on raw inotify, is inotify.py."""

from __future__ import annotations

import asyncio
import fcntl
import os
import struct
import subprocess
import sys
import time
from array import array
from pathlib import Path
from types import TracebackType

import anyio

PIPE_CHILD = Path(__file__).with_name("pipes.py")


def raw_locked_appends(directory: Path, lines: list[bytes], fsync: bool = False) -> None:
    """flock + write + unlock on held descriptors (+ fdatasync), pre-encoded."""
    log = os.open(directory / "raw.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    lock = os.open(directory / "raw.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        for line in lines:
            fcntl.flock(lock, fcntl.LOCK_EX)
            os.write(log, line)
            fcntl.flock(lock, fcntl.LOCK_UN)
            if fsync:
                os.fdatasync(log)
    finally:
        os.close(log)
        os.close(lock)


async def queue_ping_pong(n: int) -> list[float]:
    """Round trips between two tasks over asyncio.Queue, in microseconds."""
    to_server: asyncio.Queue[int] = asyncio.Queue()
    to_client: asyncio.Queue[int] = asyncio.Queue()
    times = []

    async def server() -> None:
        for _ in range(n):
            to_client.put_nowait(await to_server.get())

    async with anyio.create_task_group() as tg:
        tg.start_soon(server)
        for i in range(n):
            start = time.perf_counter_ns()
            to_server.put_nowait(i)
            await to_client.get()
            times.append((time.perf_counter_ns() - start) / 1000)
    return times


class PipeChild:
    """The lean os.pipe child (pipes.py): started, then used once it said it is ready."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.down = self.up = -1
        self.proc: subprocess.Popen[bytes] | None = None

    async def __aenter__(self) -> PipeChild:
        down_r, self.down = os.pipe()
        self.up, up_w = os.pipe()
        self.proc = subprocess.Popen(
            # -I: not even the script's own directory (teamrt/bench) on sys.path
            [sys.executable, "-I", str(PIPE_CHILD), self.role, str(down_r), str(up_w)],
            pass_fds=(down_r, up_w),
            stdin=subprocess.DEVNULL,
        )
        os.close(down_r)
        os.close(up_w)
        if await self.read(1) != b"R":
            raise RuntimeError(f"the bench's os.pipe {self.role} child did not start")
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        os.close(self.down)
        if self.proc is not None:
            await anyio.to_thread.run_sync(self.proc.wait)
        os.close(self.up)

    async def read(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            await anyio.wait_readable(self.up)
            chunk = os.read(self.up, size - len(data))
            if not chunk:
                raise RuntimeError(f"the bench's os.pipe {self.role} child exited")
            data += chunk
        return data

    async def cpu(self) -> float:
        """The echo child's CPU time so far, in seconds."""
        os.write(self.down, b"c")
        return float(struct.unpack("d", await self.read(8))[0])

    async def ping_pong(self, n: int) -> list[float]:
        """Round trips to the echo child, both sides asyncio, in microseconds."""
        times = []
        up, down = self.up, self.down
        for _ in range(n):
            start = time.perf_counter_ns()
            os.write(down, b"x")
            await anyio.wait_readable(up)
            os.read(up, 64)
            times.append((time.perf_counter_ns() - start) / 1000)
        return times

    async def wakes(self, n: int, spacing: float) -> list[float]:
        """One-way wake-ups of the idle wake child, in microseconds."""
        for _ in range(n):
            await anyio.sleep(spacing)
            os.write(self.down, struct.pack("d", time.monotonic()))
        os.write(self.down, struct.pack("d", 0.0))
        (count,) = struct.unpack("I", await self.read(4))
        return array("d", await self.read(8 * count)).tolist()
