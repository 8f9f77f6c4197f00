"""Leases fence effects: an incarnation that lost its lease hands its application nothing more,
starts no task and runs no tool call; tools see the fencing token."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.to_thread

from teamrt import Envelope
from teamrt.mail.log import encode
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.redisstore import RedisStore
from tests.redis_server import RedisServer, needs_redis, redis_server

__all__ = ["redis_server"]  # the fixture

ROOT = Path(__file__).resolve().parent.parent


def _child(*args: str) -> subprocess.Popen[bytes]:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-m", "tests.fencing_procs", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
    )


async def _line(child: subprocess.Popen[bytes]) -> bytes:
    assert child.stdout is not None
    with anyio.fail_after(30):
        return await anyio.to_thread.run_sync(child.stdout.readline)


async def _eventually(check: Callable[[], bool]) -> None:
    with anyio.fail_after(30):
        while not check():  # noqa: ASYNC110 -- polled: another process changes it
            await anyio.sleep(0.05)


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _stop(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        child.send_signal(signal.SIGCONT)
        child.kill()
    child.wait(10)
    if child.stdout is not None:
        child.stdout.close()


@needs_redis
async def test_a_consumer_paused_past_its_lease_hands_out_nothing_after_it_resumes(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    url = redis_server.url("paused-consumer")
    creator = RedisStore(url, lease_ttl=2.0)
    await creator.open(["lead", "worker"])
    out = tmp_path / "handed-out"
    child = _child("consumer", url, str(out))
    view = creator.view()
    try:
        assert await _line(child) == b"holding\n"
        for i in range(3):
            await creator.append("worker", encode(Envelope.message("lead", "worker", i)))
        await _eventually(lambda: len(_lines(out)) == 3)
        child.send_signal(signal.SIGSTOP)
        # mail that reaches the stopped process's pending read: it is there when it resumes
        later = [Envelope.message("lead", "worker", f"later {i}") for i in range(5)]
        for envelope in later:
            await creator.append("worker", encode(envelope))
        await _eventually(lambda: view.holder("worker") is None)  # its lease lapsed
        async with Mailboxes(RedisStore(url)) as successor:
            inbox = await successor.open_inbox("worker")  # takes the lease over
            handled = [await inbox.receive(timeout=10) for _ in later]
            assert [e.id for e in handled] == [e.id for e in later]
            await inbox.ack(*handled)
            child.send_signal(signal.SIGCONT)
            assert await _line(child) == b"lost\n"
        assert len(_lines(out)) == 3  # nothing handed out after SIGCONT
    finally:
        _stop(child)
        view.close()
        await creator.close()
