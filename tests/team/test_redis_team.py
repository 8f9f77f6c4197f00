"""A Team on a Redis store: a teammate whose lease another process took over stops that
incarnation (it is not restarted, and it commits nothing more), while the successor serves the
member's mail."""

from __future__ import annotations

from typing import Any

import anyio
import redis

from teamrt import Envelope
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.redisstore import RedisStore, parse_locator
from teamrt.mail.redisstore.keys import TeamKeys
from teamrt.models import FunctionModel
from teamrt.team import Team, Teammate
from tests.support.redis_server import RedisServer, needs_redis, redis_server

__all__ = ["redis_server"]  # the fixture
pytestmark = needs_redis


async def test_a_teammate_whose_lease_was_taken_over_stops_that_incarnation(
    redis_server: RedisServer,
) -> None:
    url = redis_server.url("takeover")
    keys = TeamKeys("teamrt", parse_locator(url).team)
    client: Any = redis.Redis(port=redis_server.port, protocol=2)
    try:
        async with Mailboxes(RedisStore(url, lease_ttl=2.0), members=["lead", "w"]) as mail:
            worker = Teammate("w", FunctionModel(lambda messages, tools: "done"))
            async with Team(mail, [worker]) as team:
                assert team.status["w"].state == "idle"
                status = team.status["w"]
                first = status.incarnation
                client.delete(keys.lease("w"))  # as if this process had stopped renewing it
                async with Mailboxes(RedisStore(url)) as successor:
                    inbox = await successor.open_inbox("w")  # another process takes it over
                    with anyio.fail_after(10):  # the team's next renewal finds the new holder
                        while status.state != "stopped":  # noqa: ASYNC110 -- polled
                            await anyio.sleep(0.05)
                    assert status.last == "lease lost"
                    assert status.incarnation == first  # not restarted: the successor runs it
                    assert status.restarts == 0
                    await successor.send(Envelope.message("lead", "w", "for the successor"))
                    got = await inbox.receive(timeout=5)  # the successor serves w's mail
                    assert got.body == "for the successor"
                    await inbox.ack(got)
    finally:
        client.close()
