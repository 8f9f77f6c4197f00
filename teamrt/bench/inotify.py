"""The round-trip floor of `teamrt bench`: a minimal mailbox on raw inotify, in two processes.

A mailbox here is one file per member (`<name>.jsonl`) and its lock file (`<name>.lock`), as in
teamrt's file store, and nothing else:

- send: take the recipient's lock (`flock`, teamrt's lock), write one JSON line to the inbox
  opened with O_APPEND, unlock. Descriptors are held open, as teamrt's appenders hold theirs.
- receive: wait for inotify (`inotify_init1` / `inotify_add_watch` through ctypes on libc, IN_MODIFY
  on the inbox file; one reader callback on the event loop, registered once, drains the events),
  read the new bytes from the last offset, split the complete lines and parse each with
  `json.loads`.

What it leaves out, and teamrt does: envelope validation and ids (here a counter), timestamps, the
`seq` stamp and its recovery, the fstat for rotation under the lock, the cursor commit of an ack
(the floor keeps its offset in memory only), leases, liveness and request deadlines. So the ratio of
teamrt's round trip to this one is what those cost, and the scheduling both pay is in the floor.

This file is run by its path as the answering side (`python -I inotify.py echo DIR`): like
pipes.py it imports only the standard library. The bench imports it for the requesting side.
The child says it is ready (a `ready` line in the requester's inbox) once its event loop runs and
its watch is set, and the bench starts timing after that.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

IN_MODIFY = 0x00000002
_IN_NONBLOCK_CLOEXEC = os.O_NONBLOCK | os.O_CLOEXEC
CHILD = Path(__file__)
READ_CHUNK = 64 << 10
BLOCK_TIMEOUT = 60  # seconds


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class RawMailbox:
    """One member's end of the minimal mailbox: its inbox (read on inotify wake-ups) and held
    append descriptors for the inboxes it sends to."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.name = name
        self._outboxes: dict[str, tuple[int, int]] = {}  # recipient: (log fd, lock fd)
        self._pending: list[dict[str, Any]] = []
        self._partial = b""
        self._offset = 0
        self._changed = False  # inotify said the inbox grew since it was last read
        self._waiter: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        libc = _libc()
        self._notify = libc.inotify_init1(_IN_NONBLOCK_CLOEXEC)
        if self._notify < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        inbox = directory / f"{name}.jsonl"
        self._inbox = os.open(inbox, os.O_RDONLY | os.O_CLOEXEC)
        if libc.inotify_add_watch(self._notify, os.fsencode(inbox), IN_MODIFY) < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {inbox}")

    @staticmethod
    def create(directory: Path, *names: str) -> None:
        """Create the (empty) inbox and lock files of `names` in `directory`."""
        for name in names:
            for suffix in (".jsonl", ".lock"):
                (directory / f"{name}{suffix}").touch()

    def send(self, recipient: str, message: dict[str, Any]) -> None:
        """Append `message` as one JSON line to `recipient`'s inbox, under its lock."""
        fds = self._outboxes.get(recipient)
        if fds is None:
            log = os.open(self.directory / f"{recipient}.jsonl", os.O_WRONLY | os.O_APPEND)
            lock = os.open(self.directory / f"{recipient}.lock", os.O_RDWR)
            fds = self._outboxes[recipient] = (log, lock)
        log, lock = fds
        line = json.dumps(message).encode() + b"\n"
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            os.write(log, line)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)

    async def receive(self) -> dict[str, Any]:
        """The next message of this inbox, waiting for inotify to say the file grew."""
        while not self._pending:
            if not self._changed:
                loop = asyncio.get_running_loop()
                if self._loop is None:  # one reader for the mailbox's life, as teamrt's
                    loop.add_reader(self._notify, self._on_notify)
                    self._loop = loop
                self._waiter = loop.create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
            self._changed = False
            self._read_new()
        return self._pending.pop(0)

    def _on_notify(self) -> None:
        """Drain the inotify events (what follows reads up to the end) and wake a receiver."""
        try:
            os.read(self._notify, 4096)
        except BlockingIOError:
            return
        self._changed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _read_new(self) -> None:
        data = self._partial
        while True:
            chunk = os.pread(self._inbox, READ_CHUNK, self._offset)
            self._offset += len(chunk)
            data += chunk
            if len(chunk) < READ_CHUNK:
                break
        *lines, self._partial = data.split(b"\n")
        self._pending += [json.loads(line) for line in lines]

    def close(self) -> None:
        for log, lock in self._outboxes.values():
            os.close(log)
            os.close(lock)
        self._outboxes.clear()
        if self._loop is not None:
            self._loop.remove_reader(self._notify)
        os.close(self._inbox)
        os.close(self._notify)


class InotifyChild:
    """The lean answering process of the floor, started in `directory`, used once it is ready:
    `ping_pong(n)` times requests answered by it, `cpu()` asks for its CPU time."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None
        self.mail: RawMailbox | None = None
        self._ids = 0

    async def __aenter__(self) -> InotifyChild:
        self.directory.mkdir(parents=True, exist_ok=True)
        RawMailbox.create(self.directory, "lead", "echo")
        self.mail = RawMailbox(self.directory, "lead")
        self.proc = subprocess.Popen(
            # -I: not even the script's own directory (teamrt/bench) on sys.path
            [sys.executable, "-I", str(CHILD), "echo", str(self.directory)],
            stdin=subprocess.DEVNULL,
        )
        async with asyncio.timeout(60):
            ready = await self.mail.receive()
        if ready.get("type") != "ready":
            raise RuntimeError("the bench's raw inotify child did not start")
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.mail is not None:
            self.mail.send("echo", {"type": "stop"})
            self.mail.close()
        if self.proc is not None:
            await asyncio.to_thread(self.proc.wait)

    async def request(self, body: Any, kind: str = "request") -> Any:
        """Send a request to the child and wait for its response (matched by id): its body."""
        assert self.mail is not None
        self._ids += 1
        asked = f"lead-{self._ids}"
        self.mail.send("echo", {"id": asked, "from": "lead", "type": kind, "body": body})
        while True:
            answer = await self.mail.receive()
            if answer.get("reply_to") == asked:
                return answer["body"]

    async def cpu(self) -> float:
        """The child's CPU time so far, in seconds."""
        async with asyncio.timeout(BLOCK_TIMEOUT):
            return float(await self.request(None, "cpu"))

    async def ping_pong(self, n: int) -> list[float]:
        """`n` request -> response round trips, in microseconds (a child that stopped answering
        fails the block after BLOCK_TIMEOUT seconds, not each exchange: no timer per request)."""
        times = []
        async with asyncio.timeout(BLOCK_TIMEOUT + n / 100):
            for i in range(n):
                start = time.perf_counter_ns()
                await self.request(i)
                times.append((time.perf_counter_ns() - start) / 1000)
        return times


async def echo(directory: Path) -> None:
    """Answer each request with its body (a `cpu` request with this process's CPU time) until
    a `stop`."""
    mail = RawMailbox(directory, "echo")
    mail.send("lead", {"type": "ready"})
    answered = 0
    try:
        while True:
            request = await mail.receive()
            if request["type"] == "stop":
                return
            body = time.process_time() if request["type"] == "cpu" else request["body"]
            answered += 1
            response = {"id": f"echo-{answered}", "from": "echo", "reply_to": request["id"]}
            mail.send("lead", {**response, "type": "response", "body": body})
    finally:
        mail.close()


if __name__ == "__main__":
    asyncio.run(echo(Path(sys.argv[2])))
