"""RedisStore passes the one conformance suite, on a private redis-server (a team per test)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from teamrt.mail.redisstore import RedisStore, parse_locator
from teamrt.mail.redisstore.keys import TeamKeys
from teamrt.mail.redisstore.scripts import RAW_APPEND
from teamrt.testing.conformance import MailboxConformance, StoreHarness
from tests.support.redis_server import RedisServer, shared_redis

__all__ = ["shared_redis"]  # the fixture


class TestRedisStore(MailboxConformance):
    @pytest.fixture
    def harness(self, shared_redis: RedisServer) -> Iterator[StoreHarness]:
        url = shared_redis.url()  # a new team for every test
        keys = TeamKeys("teamrt", parse_locator(url).team)
        client: Any = redis.Redis(port=shared_redis.port, protocol=2)
        partial: dict[str, bytes] = {}

        def write_raw(name: str, data: bytes) -> None:
            """Another program's writes: each complete line one stream entry, taking the next
            seq (a line without its newline waits for the rest, as a write in progress)."""
            *lines, partial[name] = (partial.get(name, b"") + data).split(b"\n")
            for line in lines:
                if line.strip():
                    client.eval(RAW_APPEND.source, 2, keys.next, keys.inbox(name), name, line)

        def expire_lease(name: str) -> None:
            client.delete(keys.lease(name))  # as if its holder had stopped renewing it

        def make_store(timeout: float = 10.0) -> RedisStore:
            # 10 s: a call that takes longer is a hung server, not a loaded machine
            return RedisStore(
                url, max_envelope=64 << 10, socket_timeout=timeout, connect_timeout=timeout
            )

        def make_outage_store() -> RedisStore:
            return make_store(0.5)

        try:
            yield StoreHarness(
                make_store, write_raw, expire_lease, shared_redis.outage, make_outage_store
            )
        finally:
            client.close()
