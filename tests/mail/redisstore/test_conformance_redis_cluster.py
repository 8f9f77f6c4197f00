"""RedisStore passes the one conformance suite on a 3-master Redis Cluster, every team reached
through a node that does not serve its slot (the store finds the one that does)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from teamrt.mail.redisstore import RedisStore, parse_locator
from teamrt.mail.redisstore.keys import TeamKeys
from teamrt.mail.redisstore.scripts import RAW_APPEND
from teamrt.testing.conformance import MailboxConformance, StoreHarness
from tests.support.redis_cluster import RedisCluster, shared_cluster

__all__ = ["shared_cluster"]  # the fixture


class TestRedisClusterStore(MailboxConformance):
    @pytest.fixture
    def harness(self, shared_cluster: RedisCluster) -> Iterator[StoreHarness]:
        team = parse_locator(shared_cluster.masters[0].url()).team  # a new team for every test
        owner = shared_cluster.owner(team)
        url = shared_cluster.not_owner(team).url(team)
        keys = TeamKeys("teamrt", team)
        client: Any = redis.Redis(port=owner.port, protocol=2)
        partial: dict[str, bytes] = {}

        def write_raw(name: str, data: bytes) -> None:
            """Another program's writes (see test_conformance_redis.py), on the owner."""
            *lines, partial[name] = (partial.get(name, b"") + data).split(b"\n")
            for line in lines:
                if line.strip():
                    client.eval(RAW_APPEND.source, 2, keys.next, keys.inbox(name), name, line)

        def expire_lease(name: str) -> None:
            client.delete(keys.lease(name))

        def make_store(timeout: float = 10.0) -> RedisStore:
            # 10 s: a call that takes longer is a hung server, not a loaded machine
            return RedisStore(
                url, max_envelope=64 << 10, socket_timeout=timeout, connect_timeout=timeout
            )

        def make_outage_store() -> RedisStore:
            return make_store(0.5)

        @contextlib.contextmanager
        def outage() -> Iterator[None]:
            with owner.outage():  # the node serving the team, not the one the URL names
                yield

        try:
            yield StoreHarness(make_store, write_raw, expire_lease, outage, make_outage_store)
        finally:
            client.close()
