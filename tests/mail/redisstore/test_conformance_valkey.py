"""RedisStore passes the one conformance suite on Valkey too: the Redis store's conformance
tests (test_conformance_redis.py), each on a private valkey-server instead of redis-server."""

from __future__ import annotations

import pytest

import tests.mail.redisstore.test_conformance_redis as on_redis
from tests.support.redis_server import RedisServer, shared_valkey

__all__ = ["shared_valkey"]  # the fixture


@pytest.fixture
def shared_redis(shared_valkey: RedisServer) -> RedisServer:
    """The server the Redis store's harness asks for, here a valkey-server."""
    return shared_valkey


class TestValkeyStore(on_redis.TestRedisStore):
    def test_the_server_is_valkey(self, shared_redis: RedisServer) -> None:
        import redis

        info = redis.Redis(port=shared_redis.port, protocol=2).info("server")
        assert "valkey_version" in info or info.get("server_name") == "valkey"
