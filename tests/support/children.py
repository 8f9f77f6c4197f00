"""Children of tests/support/procs.py for the tests about processes (writers, consumers, killers):
start one, wait until they are ready, collect how each ended, read what they acknowledged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio

from teamrt import Envelope, FileMailboxes
from tests.support.paths import SUPPORT

#: the child program: `python PROCS MODE ARGS...`
PROCS = str(SUPPORT / "procs.py")


def spawn(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`python procs.py ARGS...` with `env` added to this environment; its stderr kept."""
    return subprocess.Popen(
        [sys.executable, PROCS, *args],
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def finish(proc: subprocess.Popen[bytes], expect: int = 0) -> None:
    """Wait for a child (closing its pipe) and check how it ended."""
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == expect, err.decode()


def wait_ready(paths: list[Path], procs: list[subprocess.Popen[bytes]]) -> None:
    """Wait until every child wrote its ready file (`paths`); a child that ended otherwise than
    by SIGKILL fails the test with its stderr."""
    deadline = time.monotonic() + 30
    while not all(p.exists() for p in paths):
        for proc in procs:
            if proc.poll() is not None and proc.returncode != -signal.SIGKILL:
                finish(proc)
        assert time.monotonic() < deadline, "children did not start"
        time.sleep(0.005)


def read_acked(path: Path) -> list[tuple[str, str, int]]:
    """The rows a child acknowledged (`ID SENDER I` a line), none if it wrote none."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        id_, sender, i = line.split()
        rows.append((id_, sender, int(i)))
    return rows


async def drain_all(team: Path) -> tuple[list[Envelope], int]:
    """Everything the worker of `team` can receive now, and how many lines were quarantined."""
    async with FileMailboxes(team) as mail:
        inbox, got = mail.inbox("worker"), []
        while True:
            try:
                got.append(inbox.receive_nowait())
            except anyio.WouldBlock:
                return got, inbox.statistics().quarantined
