"""The stores the mail tests run on, as fixtures: each is parametrized over the stores it names
(a test on `backing` runs once on files, once in memory and once on Redis)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from teamrt import FileMailboxes
from teamrt.mail.filestore.store import FileStore
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.memory import MemoryStore
from teamrt.testing.conformance import StoreHarness
from tests.mail.helpers import MEMBERS, Backing, file_mail
from tests.support.redis_server import REDIS_SERVER, RedisServer, shared_redis

__all__ = ["shared_redis"]  # the fixture


@pytest.fixture(params=["file", "memory", "redis"])
def backing(request: pytest.FixtureRequest, tmp_path: Path) -> Backing:
    """A team's storage on each store, opened as often as a test likes."""
    if request.param == "file":
        return Backing("file", lambda **o: file_mail(tmp_path, **o))
    if request.param == "memory":
        store = MemoryStore("team")
        return Backing("memory", lambda **o: Mailboxes(store, members=MEMBERS, **o))
    from teamrt.mail.redisstore import RedisStore

    server: RedisServer = request.getfixturevalue("shared_redis")
    url = server.url()  # a team of its own
    return Backing("redis", lambda **o: Mailboxes(RedisStore(url), members=MEMBERS, **o))


@pytest.fixture(params=["file", "memory"])
def local_backing(request: pytest.FixtureRequest, tmp_path: Path) -> Backing:
    """`backing` on the stores of this process only."""
    if request.param == "file":
        return Backing("file", lambda **o: file_mail(tmp_path, **o))
    store = MemoryStore("team")
    return Backing("memory", lambda **o: Mailboxes(store, members=MEMBERS, **o))


def _file_harness(tmp_path: Path) -> StoreHarness:
    team = tmp_path / "team"

    def write_raw(name: str, data: bytes) -> None:
        fd = os.open(team / "inboxes" / f"{name}.jsonl", os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    return StoreHarness(lambda: FileStore(team), write_raw)


def _memory_harness() -> StoreHarness:
    store = MemoryStore("team")
    return StoreHarness(lambda: store, store.write_raw)


@pytest.fixture(params=["file", "memory", "redis"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreHarness]:
    """The conformance suite's harness on each store (raw writes on files and in memory)."""
    if request.param == "file":
        yield _file_harness(tmp_path)
    elif request.param == "memory":
        yield _memory_harness()
    else:
        if REDIS_SERVER is None:
            pytest.skip("redis-server is not installed")
        from teamrt.mail.redisstore import RedisStore

        server: RedisServer = request.getfixturevalue("shared_redis")
        url = server.url()  # a team of its own

        def no_raw(name: str, data: bytes) -> None:  # pragma: no cover - file/memory only
            raise NotImplementedError

        yield StoreHarness(lambda: RedisStore(url, socket_timeout=10, connect_timeout=10), no_raw)


@pytest.fixture(params=["file", "memory"])
def local_harness(request: pytest.FixtureRequest, tmp_path: Path) -> StoreHarness:
    """The stores whose inboxes a test writes raw lines to."""
    return _file_harness(tmp_path) if request.param == "file" else _memory_harness()


@pytest.fixture(params=["file", "memory", "file-small-segments"])
def mail_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Mailboxes]:
    """Mailboxes of a lead and a worker, opened anew at each call: in memory, on files, and on
    files whose logs rotate every few envelopes."""
    members = ["lead", "worker"]
    if request.param == "memory":
        return lambda: Mailboxes(MemoryStore("team"), members=members)
    if request.param == "file":
        return lambda: FileMailboxes(tmp_path / "team", members=members)
    return lambda: FileMailboxes(tmp_path / "team", members=members, segment_bytes=700)
