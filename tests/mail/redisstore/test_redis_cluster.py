"""A team on a 3-master Redis Cluster through the URL of a node that does not serve it: the
store, the view and the command line find the node that does; a failover of that node (its
replica takes over) loses no envelope and delivers none twice, and a waiting receiver wakes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from teamrt.envelopes import Envelope
from teamrt.errors import OutcomeUnknown, StoreUnavailable
from teamrt.mail.locator import open_mailboxes, open_view
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.redisstore import cluster
from tests.support.redis_cluster import RedisCluster, redis_cluster
from tests.support.redis_server import RedisServer

__all__ = ["redis_cluster"]  # the fixture


def teamrt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "teamrt", *args],
        capture_output=True, text=True, timeout=120, env=dict(os.environ), check=False,
    )  # fmt: skip


async def _send_all(url: str, envelopes: Sequence[Envelope]) -> None:
    async with open_mailboxes(url, members=["lead", "worker"]) as mail:
        for envelope in envelopes:
            await mail.send(envelope)


def test_the_command_line_through_a_node_that_does_not_serve_the_team(
    redis_cluster: RedisCluster, tmp_path: Path
) -> None:
    url = redis_cluster.not_owner("cli").url("cli")
    request = Envelope.request("lead", "worker", {"task": "write"})
    anyio.run(_send_all, url, [request, Envelope.message("worker", "lead", "on it")])

    sent = teamrt("send", url, "--from", "lead", "--to", "worker", "--text", "from the shell")
    assert sent.returncode == 0, sent.stderr
    report = teamrt("inspect", url, "--json")
    assert report.returncode == 0, report.stderr
    worker = next(i for i in json.loads(report.stdout)["inboxes"] if i["name"] == "worker")
    assert worker["depth"] == 2
    replayed = teamrt("replay", url, "--format", "json")
    assert replayed.returncode == 0, replayed.stderr
    ids = {e.get("id") for e in map(json.loads, replayed.stdout.splitlines())}
    assert {str(request.id), sent.stdout.strip()} <= ids
    exported = teamrt("export", url, str(tmp_path / "cli"))
    assert exported.returncode == 0, exported.stderr
    assert "exported 3 envelopes" in exported.stdout


def test_the_view_follows_the_team_to_its_node(redis_cluster: RedisCluster) -> None:
    url = redis_cluster.not_owner("view").url("view")
    anyio.run(_send_all, url, [Envelope.message("lead", "worker", i) for i in range(3)])
    with open_view(url) as view:
        assert view.members() == ("lead", "worker")
        assert len(list(view.scan("worker"))) == 3


async def _send_through_trouble(mail: Mailboxes, envelope: Envelope) -> None:
    """Send until it is acknowledged: "not sent" and "maybe sent" are sent again (the receiver
    drops a second copy by its id), as an application does while a failover runs."""
    while True:
        try:
            await mail.send(envelope)
            return
        except (StoreUnavailable, OutcomeUnknown):
            await anyio.sleep(0.05)


async def _fail_over_while_working(cluster_: RedisCluster, url: str, replica: RedisServer) -> None:
    before = [Envelope.message("lead", "worker", i) for i in range(20)]
    after = [Envelope.message("lead", "worker", i) for i in range(20, 40)]
    got: list[Envelope] = []
    async with (
        open_mailboxes(url, members=["lead", "worker"]) as lead,
        open_mailboxes(url) as worker,
    ):
        inbox = await worker.open_inbox("worker")
        half_in, all_in = anyio.Event(), anyio.Event()

        async def receive() -> None:
            while len(got) < len(before) + len(after):
                got.append(await inbox.receive())
                if len(got) == len(before):
                    half_in.set()
            all_in.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(receive)
            for envelope in before:
                await _send_through_trouble(lead, envelope)
            with anyio.fail_after(30):
                await half_in.wait()  # the receiver now waits on the watcher
            failing_over = anyio.Event()

            async def fail_over() -> None:
                await anyio.to_thread.run_sync(cluster_.fail_over, replica, "fo")
                failing_over.set()

            tg.start_soon(fail_over)
            for envelope in after:  # some go out while the replica takes over
                await _send_through_trouble(lead, envelope)
            await failing_over.wait()
            with anyio.fail_after(30):
                await all_in.wait()
    assert [e.id for e in got] == [e.id for e in before + after]  # all, once, in order


def test_a_failover_of_the_teams_node_loses_nothing(redis_cluster: RedisCluster) -> None:
    owner = redis_cluster.owner("fo")
    replica = redis_cluster.add_replica(owner)
    url = redis_cluster.not_owner("fo").url("fo")
    anyio.run(_fail_over_while_working, redis_cluster, url, replica)
    assert redis_cluster.owner("fo") is replica


def test_the_slot_map_and_redirections_are_read_from_the_replies() -> None:
    from redis.exceptions import ResponseError

    reply = [
        [0, 5460, [b"127.0.0.1", 7000, b"id0"]],
        [5461, 10922, [b"", 7001, b"id1"], [b"127.0.0.1", 7004, b"id4"]],
    ]
    owner, nodes = cluster.read_slots(reply, 6000, ("10.0.0.9", 7001))
    assert owner == ("10.0.0.9", 7001)  # an empty host: the node asked
    assert nodes == [("127.0.0.1", 7000), ("10.0.0.9", 7001), ("127.0.0.1", 7004)]
    assert cluster.read_slots(reply, 16000, ("h", 1))[0] is None
    assert cluster.moved_to(ResponseError("MOVED 6000 127.0.0.1:7004")) == ("127.0.0.1", 7004)
    assert cluster.moved_to(ResponseError("WRONGTYPE Operation")) is None
    assert cluster.transient(ResponseError("TRYAGAIN Multiple keys request during rehashing"))
    assert not cluster.transient(ResponseError("MOVED 6000 127.0.0.1:7004"))
    assert cluster.team_slot("{fo}") == cluster.team_slot("teamrt:{fo}:inbox:worker")


@pytest.mark.stress  # waits for the cluster to elect a new master (seconds)
def test_the_teams_master_killed_its_replica_takes_over(request: pytest.FixtureRequest) -> None:
    redis_cluster: RedisCluster = request.getfixturevalue("redis_cluster")
    owner = redis_cluster.owner("kill")
    replica = redis_cluster.add_replica(owner)
    url = redis_cluster.not_owner("kill").url("kill")

    async def scenario() -> None:
        envelopes = [Envelope.message("lead", "worker", i) for i in range(30)]
        async with (
            open_mailboxes(url, members=["lead", "worker"]) as lead,
            open_mailboxes(url) as worker,
        ):
            inbox = await worker.open_inbox("worker")
            for i, envelope in enumerate(envelopes):
                if i == 10:
                    owner.kill()  # the others elect the replica after the node timeout
                await _send_through_trouble(lead, envelope)
            got = [await inbox.receive() for _ in envelopes]
        assert [e.id for e in got] == [e.id for e in envelopes]

    anyio.run(scenario)
    assert redis_cluster.owner("kill") is replica
