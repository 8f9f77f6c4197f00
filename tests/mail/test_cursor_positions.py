"""A committed cursor whose position is negative (or whose run ahead is) was not written by
teamrt. On Redis, opening the inbox says so (`StoreCorrupt`, naming the key to delete); in a
cursor file such a slot is not valid, as a torn one is not: with no valid slot left, the file
is set aside and the inbox read again from the start (mailboxes/README.md, "Repair"). Never an
OSError from seeking to it, never a hang."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import redis

from teamrt import Envelope, FileMailboxes
from teamrt.errors import StoreCorrupt
from teamrt.mail import open_mailboxes
from teamrt.mail.cursor import Cursor
from teamrt.mail.filestore import read_cursor
from teamrt.mail.filestore.framing import encode_slot
from teamrt.mail.redisstore import parse_locator
from teamrt.mail.redisstore.keys import TeamKeys
from tests.support.redis_server import RedisServer, shared_redis

__all__ = ["shared_redis"]  # the fixture

FORGED = [
    {"segment": 0, "offset": -5},
    {"segment": -1, "offset": 0},
    {"segment": 0, "offset": 0, "seq": -7},
    {"segment": 0, "offset": 0, "ahead": [[0, -3, 1, 2]]},
]


async def _one_handled(where: str | Path) -> None:
    async with open_mailboxes(where, members=["lead", "worker"]) as mail:
        await mail.send(Envelope.message("lead", "worker", 1))
        await mail.send(Envelope.message("lead", "worker", 2))
        inbox = await mail.open_inbox("worker")
        await inbox.ack(await inbox.receive(timeout=5))


def _forged(cursor: Cursor, fields: dict[str, Any]) -> Cursor:
    """`cursor` with `fields` changed (the constructor checks nothing: reading one does)."""
    ahead = tuple(tuple(run) for run in fields.get("ahead", ()))
    return dataclasses.replace(cursor, **{**fields, "ahead": ahead or cursor.ahead})


@pytest.mark.parametrize("fields", FORGED)
async def test_a_negative_position_in_a_cursor_file_is_no_valid_slot(
    tmp_path: Path, fields: dict[str, Any]
) -> None:
    team = tmp_path / "team"
    await _one_handled(team)
    path = team / "inboxes" / "worker.cursor.json"
    cursor, gen, size = read_cursor(path)
    slot = encode_slot(_forged(cursor, fields), gen + 1, size)
    assert slot is not None
    path.write_bytes(slot * 2)  # both slots, with a CRC that holds: not a torn write
    assert read_cursor(path)[1] == -1
    async with FileMailboxes(team, create=False) as mail:
        inbox = await mail.open_inbox("worker")
        assert [(await inbox.receive(timeout=5)).body for _ in range(2)] == [1, 2]
    assert path.with_name("worker.cursor.json.damaged").read_bytes() == slot * 2


@pytest.mark.parametrize("fields", FORGED)
async def test_a_negative_position_in_a_redis_cursor_is_corrupt(
    shared_redis: RedisServer, fields: dict[str, Any]
) -> None:
    url = shared_redis.url()
    await _one_handled(url)
    key = TeamKeys("teamrt", parse_locator(url).team).cursor("worker")
    client: Any = redis.Redis(port=shared_redis.port, protocol=2)
    try:
        data = json.loads(client.hget(key, "c"))
        client.hset(key, "c", json.dumps({**data, **fields}))
    finally:
        client.close()
    async with open_mailboxes(url) as mail:
        with pytest.raises(StoreCorrupt, match="negative"):
            await mail.open_inbox("worker")
