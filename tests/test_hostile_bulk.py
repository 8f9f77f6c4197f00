"""A hostile pass over the bulk read path and the request wait: the typed decode against
`decode_line` on nasty lines, and the Inbox's drain/receive/release/ack and `request()` waits
mixed in the ways a busy owner mixes them, on the file and memory stores (and Redis, when a
redis-server is installed)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from teamrt.codec import FIELD_NAMES, EnvelopeFields, decode_fields
from teamrt.envelopes import Envelope, Request
from teamrt.errors import MailboxClosed, RequestTimeout, UsageError
from teamrt.mail.filestore import FileStore
from teamrt.mail.log import decode_line, encode, stamp
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.memory import MemoryStore
from teamrt.testing.conformance import StoreHarness
from tests.redis_server import REDIS_SERVER, RedisServer, shared_redis

__all__ = ["shared_redis"]  # the fixture


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


STORES = ["file", "memory", "redis"]


@pytest.fixture(params=STORES)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreHarness]:
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

        yield StoreHarness(
            lambda: RedisStore(url, socket_timeout=0.5, connect_timeout=0.5), no_raw
        )


# --- request waits ----------------------------------------------------------------------------


async def test_an_answer_routed_by_a_drain_during_the_send_is_not_waited_for(
    harness: StoreHarness,
) -> None:
    """The owner drains its inbox in another task while a request is being sent: the answer can
    be read and routed to the request before the request starts waiting. It must be taken, not
    waited past (with no timeout and no liveness check, that wait would never end)."""
    async with harness.open() as mail:
        lead = await mail.open_inbox("lead")
        await mail.open_inbox("worker")
        real_send = mail.send

        async def send_then_answer_and_drain(envelope: Envelope) -> None:
            await real_send(envelope)
            if isinstance(envelope, Request):
                reply = lead._pending[envelope.id]
                await real_send(Envelope.response(envelope, "done"))
                while reply.response is None:  # the other task's drain routes the answer
                    assert lead.drain_nowait() == []
                    await anyio.sleep(0.001)

        mail.send = send_then_answer_and_drain  # type: ignore[method-assign]
        ask = Envelope.request("lead", "worker", "go")
        with anyio.fail_after(10):
            response = await mail.request(ask, require_live=False)
        assert response.body == "done"
