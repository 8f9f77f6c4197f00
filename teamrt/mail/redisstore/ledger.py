"""The team's budget ledger in Redis: the hash `ledger` of its JSON (`d`) and version (`v`),
replaced by a script only if the version did not move since it was read."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from teamrt.errors import StoreCorrupt, StoreError
from teamrt.mail.redisstore import scripts

if TYPE_CHECKING:
    from teamrt.mail.redisstore.store import RedisStore

_LEDGER_TRIES = 100


async def fetch(store: RedisStore) -> tuple[str, dict[str, Any] | None]:
    """The ledger's version and contents (None: no ledger yet), after checking the epoch."""
    store.check_open()
    replies = await store.client.pipeline(
        [("HGET", store.keys.meta, "epoch"), ("HMGET", store.keys.ledger, "v", "d")],
        "read the team's budget ledger",
        change=False,
    )
    store.check_epoch(replies[0])
    version, data = replies[1]
    if data is None:
        return "0", None
    try:
        ledger = json.loads(data)
    except ValueError:
        ledger = None
    if not isinstance(ledger, dict):
        raise StoreCorrupt(
            f"the budget ledger of team {store.team!r} at {store.shown} is not a JSON "
            f"object; delete the key {store.keys.ledger} to start a new one"
        )
    return (version or b"0").decode(), ledger


async def update(
    store: RedisStore, change: Callable[[dict[str, Any] | None], dict[str, Any] | None]
) -> dict[str, Any] | None:
    """Apply `change` with optimistic concurrency: read the ledger and its version, and
    replace it by a script only if the version did not move meanwhile (else again)."""
    for _ in range(_LEDGER_TRIES):
        version, current = await fetch(store)
        ledger = change(current)
        if ledger is None:
            return current
        data = json.dumps(ledger, sort_keys=True)
        try:
            done = await store.client.script(
                scripts.LEDGER,
                [store.keys.meta, store.keys.ledger],
                [store.epoch, version, data],
                "update the team's budget ledger",
            )
        except ResponseError as exc:
            raise store.script_error(exc, "", "update the team's budget ledger") from None
        if int(done) == 1:
            return dict(ledger)
    raise StoreError(
        f"the budget ledger of team {store.team!r} kept changing under this process "
        f"({_LEDGER_TRIES} tries); nothing was changed"
    )
