"""A team's error replies as teamrt's errors: a lost or remade team (its epoch), a script's
`TEAMRT_*` error, and a server whose persistence cannot keep `durability="fsync"`'s promise."""

from __future__ import annotations

from typing import TYPE_CHECKING

from redis.exceptions import ResponseError

from teamrt.errors import (
    DurabilityError,
    LeaseLost,
    StoreCorrupt,
    StoreError,
    TeamrtError,
)
from teamrt.mail.store import LeaseRecord

if TYPE_CHECKING:
    from teamrt.mail.redisstore.store import RedisStore


def epoch_error(store: RedisStore, found: str | None) -> StoreCorrupt:
    """The error for a team whose epoch is not the one this object opened."""
    if found is None or found == "-":
        return StoreCorrupt(
            f"team {store.team!r} is gone from Redis at {store.shown}: the data this process "
            f"opened (epoch {store.epoch}) was lost, most likely because redis-server "
            "restarted without its append-only file (appendonly yes) or the database was "
            "flushed. Refusing to go on: its inboxes would start again at seq 0 and cursors "
            "would skip new mail. Restore the server's data (its AOF or RDB file), or stop "
            "every process of the team and start it again as a new team"
        )
    return StoreCorrupt(
        f"team {store.team!r} at {store.shown} was created again (epoch {found}; this process "
        f"opened epoch {store.epoch}): the data this process opened was lost. Refusing to go "
        "on with positions and cursors of the lost team; stop this process and start it "
        "again to join the new team"
    )


def script_error(
    store: RedisStore,
    exc: ResponseError,
    name: str,
    what: str = "",
    record: LeaseRecord | None = None,
) -> TeamrtError:
    """A script's error reply as teamrt's error."""
    code, _, detail = str(exc).partition(" ")
    if code == "TEAMRT_EPOCH":
        return store.epoch_error(detail or None)
    if code == "TEAMRT_UNKNOWN":
        return store.unknown_recipient(name)
    if code == "TEAMRT_LEASE":
        holder = detail.partition(" ")[2] if detail != "-" else ""
        if record is not None:
            store.mark_lease_lost(record)
        fence = f" (fence {record.fence})" if record is not None else ""
        now = f"{holder} holds it now" if holder else "it expired and was taken since"
        return LeaseLost(
            f"{name}'s lease in team {store.team!r} was lost by this process{fence}: {now}. "
            "Its cursor commit is refused; this incarnation must stop"
        )
    if code == "TEAMRT_NOTEAM":
        return StoreError(
            f"no team {store.team!r} at {store.shown} (create it first, e.g. by starting the "
            "team, or pass create=True)"
        )
    if code == "TEAMRT_FOREIGN" or "XADD is equal or smaller" in str(exc):
        return StoreCorrupt(
            f"{detail or name}'s inbox in team {store.team!r} at {store.shown} has an entry "
            "that teamrt did not write (another program added to the stream); nothing was "
            "appended. Export the team (teamrt export) and remove the foreign entry"
        )
    return store.client.refused(exc, what or "run a script")


async def check_durability(store: RedisStore) -> None:
    """For `durability="fsync"`: refuse a server without `appendonly yes` and `appendfsync
    always`, or one that will not say."""
    what = "check the server's persistence (CONFIG GET appendonly, appendfsync)"
    replies = await store.client.pipeline(
        [("CONFIG", "GET", "appendonly"), ("CONFIG", "GET", "appendfsync")],
        what,
        change=False,
    )
    advice = (
        "set `appendonly yes` and `appendfsync always` in redis.conf (or with CONFIG SET), "
        "or use durability='none', which promises what the server's own settings do"
    )
    for reply in replies:
        if isinstance(reply, ResponseError):
            raise DurabilityError(
                f"durability='fsync' needs Redis at {store.locator.address} to run with "
                f"appendonly yes and appendfsync always, and it refused CONFIG GET to check "
                f"({reply}); let this client run CONFIG GET, or {advice}"
            )
    settings = {bytes(r[0]).decode(): bytes(r[1]).decode() for r in replies if len(r) == 2}
    if settings.get("appendonly") != "yes" or settings.get("appendfsync") != "always":
        raise DurabilityError(
            f"durability='fsync' needs Redis at {store.locator.address} to run with "
            f"appendonly yes and appendfsync always; it has appendonly "
            f"{settings.get('appendonly', '?')} and appendfsync "
            f"{settings.get('appendfsync', '?')}: {advice}"
        )
