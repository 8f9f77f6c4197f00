"""A private Redis Cluster for the tests: three masters on free ports of 127.0.0.1 (slots split
by `redis-cli --cluster create`), and on demand a replica of one master. Never the system's
service; every node is a `RedisServer` (tests/support/redis_server.py), stopped by its pid.

`redis_cluster` gives one per test (tests fail a node over or kill it); `shared_cluster` one per
session (each test on its own team), whose nodes count a peer as failed only after a minute, so
that pausing one for an outage does not start a failover.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from tests.support.redis_server import REDIS_SERVER, RedisServer, free_port

REDIS_CLI = shutil.which("redis-cli")
_OPTIONS = ("--cluster-enabled", "yes")


def _cluster_port() -> int:
    """A free port with a free cluster bus port (10000 above it, so at most 55535)."""
    while True:
        port = free_port()
        if port > 55535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


def _node(directory: Path, options: tuple[str, ...]) -> RedisServer:
    node = RedisServer(directory, appendfsync="everysec", extra=options)
    node.port = _cluster_port()
    return node


def _client(node: RedisServer) -> redis.Redis:
    return redis.Redis(port=node.port, protocol=2, socket_timeout=5)


def _info(node: RedisServer) -> dict[str, str]:
    text = _client(node).execute_command("CLUSTER", "INFO").decode()  # type: ignore[no-untyped-call]
    return dict(line.split(":", 1) for line in text.split() if ":" in line)


def _owner_port(node: RedisServer, slot: int) -> int | None:
    """The port of the master serving `slot`, as `node` sees it."""
    for start, end, master, *_ in _client(node).execute_command("CLUSTER", "SLOTS"):  # type: ignore[no-untyped-call]
        if start <= slot <= end:
            return int(master[1])
    return None


def _wait(condition: object, what: str, timeout: float = 60) -> None:
    """Poll `condition()` until it is true (a generous bound: only for a broken cluster)."""
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the test cluster did not get to: {what}")
        time.sleep(0.05)


class RedisCluster:
    """Three masters (`masters`), and the replicas added by `add_replica`."""

    def __init__(self, directory: Path, *, node_timeout_ms: int = 1000) -> None:
        self.directory = directory
        #: how long a node may not answer before the others count it as failed
        self.options = (*_OPTIONS, "--cluster-node-timeout", str(node_timeout_ms))
        self.masters = [_node(directory / f"node{i}", self.options) for i in range(3)]
        self.replicas: list[RedisServer] = []

    @property
    def nodes(self) -> list[RedisServer]:
        return [*self.masters, *self.replicas]

    def start(self) -> None:
        assert REDIS_CLI is not None
        for node in self.masters:
            node.start()
        subprocess.run(
            [REDIS_CLI, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.masters),
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        _wait(self.ready, "every node in state ok")

    def ready(self) -> bool:
        return all(
            node.process is None or _info(node).get("cluster_state") == "ok" for node in self.nodes
        )

    def owner(self, team: str) -> RedisServer:
        """The master serving `team`'s slot now (as the first live node sees it)."""
        slot = key_slot(f"{{{team}}}".encode())
        seen = next(node for node in self.nodes if node.process is not None)
        port = _owner_port(seen, slot)
        return next(node for node in self.nodes if node.port == port)

    def not_owner(self, team: str) -> RedisServer:
        """A master that does not serve `team`: a URL naming it gets MOVED replies."""
        owner = self.owner(team)
        return next(node for node in self.masters if node is not owner)

    def add_replica(self, master: RedisServer) -> RedisServer:
        """A new node, a replica of `master`, once it has synchronised."""
        assert REDIS_CLI is not None
        replica = _node(self.directory / f"node{len(self.nodes)}", self.options)
        replica.start()
        master_id = _client(master).execute_command("CLUSTER", "MYID").decode()  # type: ignore[no-untyped-call]
        subprocess.run(
            [REDIS_CLI, "--cluster", "add-node", f"127.0.0.1:{replica.port}",
             f"127.0.0.1:{master.port}", "--cluster-slave", "--cluster-master-id", master_id],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        self.replicas.append(replica)

        def synced() -> bool:
            info = _client(replica).info("replication")
            return (
                bool(info.get("role") == "slave" and info.get("master_link_status") == "up")
                and self.ready()
            )

        _wait(synced, "the replica in sync with its master")
        return replica

    def fail_over(self, replica: RedisServer, team: str) -> None:
        """`CLUSTER FAILOVER` on `replica` (coordinated: no write is lost), until every live node
        says it serves `team`."""
        _client(replica).execute_command("CLUSTER", "FAILOVER")  # type: ignore[no-untyped-call]
        slot = key_slot(f"{{{team}}}".encode())
        _wait(
            lambda: all(
                _owner_port(node, slot) == replica.port
                for node in self.nodes
                if node.process is not None
            ),
            "the replica serving the team",
        )

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[RedisCluster]:
    if REDIS_SERVER is None or REDIS_CLI is None:
        pytest.skip("redis-server and redis-cli are not installed (apt-get install redis-server)")
    cluster = RedisCluster(tmp_path / "cluster")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    if REDIS_SERVER is None or REDIS_CLI is None:
        pytest.skip("redis-server and redis-cli are not installed (apt-get install redis-server)")
    cluster = RedisCluster(tmp_path_factory.mktemp("cluster"), node_timeout_ms=60_000)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
