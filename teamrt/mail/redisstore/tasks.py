"""Task records in Redis: `task:<id>` and `task:<id>:outcome`, each set once (`SET NX`), so the
first writer wins and neither changes after it is made."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from teamrt.errors import StoreCorrupt

if TYPE_CHECKING:
    from teamrt.mail.redisstore.store import RedisStore


async def create(store: RedisStore, id_: str, record: dict[str, Any]) -> dict[str, Any]:
    """See `Store.task_record_create`."""
    store.check_open()
    key = store.keys.task(id_)
    replies = await store.client.pipeline(
        [
            ("SET", key, json.dumps(record, sort_keys=True), "NX"),
            ("GET", key),
            ("GET", key + ":outcome"),
        ],
        f"write the task record of request {id_}",
    )
    return _record(store, id_, replies[1], replies[2])


async def settle(store: RedisStore, id_: str, outcome: dict[str, Any]) -> dict[str, Any] | None:
    """See `Store.task_record_settle`."""
    store.check_open()
    key = store.keys.task(id_)
    current = await store.client.call("GET", key, what=f"read the task record of {id_}")
    if current is None:
        return None
    replies = await store.client.pipeline(
        [
            ("SET", key + ":outcome", json.dumps(outcome, sort_keys=True), "NX"),
            ("GET", key + ":outcome"),
        ],
        f"settle the task record of request {id_}",
    )
    return _record(store, id_, current, replies[1])


async def delete_all(store: RedisStore, what: str) -> None:
    """Delete the team's task records (after `destroy`: a team made again under the name
    must not return the old team's outcomes)."""
    cursor: Any = b"0"
    while True:
        cursor, found = await store.client.call(
            "SCAN", cursor, "MATCH", store.keys.task("*"), "COUNT", 1000, what=what
        )
        if found:
            await store.client.call("DEL", *found, what=what)
        if cursor in (b"0", 0, "0"):
            return


def _record(store: RedisStore, id_: str, raw: Any, outcome: Any) -> dict[str, Any]:
    try:
        record = json.loads(raw)
        if outcome is not None:
            record["outcome"] = json.loads(outcome)
    except (TypeError, ValueError):
        record = None
    if not isinstance(record, dict):
        raise StoreCorrupt(
            f"the task record of request {id_} in team {store.team!r} at {store.shown} is "
            f"not a JSON object; delete the key {store.keys.task(id_)}"
        )
    return record
