"""Member leases in Redis: one live consumer per member, with a time limit and fencing tokens.

A lease is the string key `lease:<name>` = "<fence> <holder>", set with `SET ... PX ttl` by a
script only when the key does not exist; the fence comes from `HINCRBY fences <name> 1`, so it
grows with every acquisition. The holder renews all its leases in one script every heartbeat
(`renew_leases`), which extends a lease still carrying its fence, takes back one that expired if
nobody took it since (the fence counter unchanged), and reports the others lost: the record's
`lost` event is set, a warning is logged, and that incarnation's cursor commits are refused by the
commit script (`LeaseLost`). A member whose lease was ever taken is in the `ran` set, so
`member_alive` can tell "stopped" (False) from "never ran" (None).

The time limit is the team's (`lease_ttl`, fixed when the team is created, like the envelope
limit), so every process agrees on when a silent holder counts as gone.

Fencing reads and effects. The `lost` event is only as fresh as the last renewal: a process
SIGSTOPped past its time limit wakes with the event unset and mail in its buffers. So a holder
also knows until when its lease is certainly held: an answer that took, renewed or checked it
came to a request sent at time t, and the server started the time limit no earlier than t, so
the lease is held until t + ttl; `validity` keeps a tenth of the limit back for clocks that run
at slightly different rates. The inbox hands out mail, and a teammate starts a task or a tool
call, only before that moment (`LeaseRecord.known_held`); after it, one round trip
(`confirm_lease`, the renewal script for one lease) either moves it on or finds the lease lost.
Mail read from the stream at any time is therefore handed out only while the lease is held: the
watcher's read stays a plain XREAD, with no script on the read path. What the lease cannot fence
is an effect already under way when the process stopped; tools get the fencing token
(`current_fence()`) to refuse a stale writer themselves.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import TYPE_CHECKING

from redis.exceptions import ResponseError

from teamrt.errors import MemberBusy, StoreCorrupt, StoreError, TeamrtError
from teamrt.mail.redisstore import scripts
from teamrt.mail.store import LEASE_STALE_AFTER, LeaseRecord
from teamrt.names import validate_name

if TYPE_CHECKING:
    from teamrt.mail.redisstore.store import RedisStore

log = logging.getLogger("teamrt.mail")

_HOST = socket.gethostname()


def holder_text(holder: str) -> str:
    """A holder's description as stored: on one line, with this host's name."""
    text = " ".join(holder.split())[:200] or "unknown holder"
    return f"{text} on {_HOST}"


async def lock_member(store: RedisStore, name: str, holder: str) -> tuple[object, int]:
    validate_name(name)
    keys = store.keys
    what = f"take {name}'s lease"
    try:
        reply = await store.client.script(
            scripts.LOCK,
            [keys.meta, keys.next, keys.fences, keys.ran, keys.lease(name)],
            [store.epoch, name, holder_text(holder), store.lease_ttl_ms],
            what,
        )
    except ResponseError as exc:
        raise store.script_error(exc, name, what) from None
    if int(reply[0]) == 1:
        return name, int(reply[1])
    current = reply[1].decode(errors="replace").partition(" ")[2] or "unknown holder"
    pttl = int(reply[2])
    expiry = (
        f"; its lease expires {pttl / 1000:.1f} s after its holder stops renewing it"
        if pttl > 0
        else ""
    )
    raise MemberBusy(
        f"member {name!r} of team {store.team!r} is already running ({current}){expiry}"
    )


async def describe_holder(store: RedisStore, record: LeaseRecord, holder: str) -> None:
    """Name the holder in the lease; a lease found in another holder's hands is marked lost
    (the acquisition that asked gets a lease whose `lost` is set)."""
    try:
        done = await store.client.script(
            scripts.DESCRIBE,
            [store.keys.lease(record.name)],
            [record.fence, holder_text(holder)],
            f"describe {record.name}'s lease holder",
        )
    except (StoreError, ResponseError) as exc:  # only a description
        log.debug("could not describe the holder of %s's lease: %s", record.name, exc)
        return
    if int(done) < 0:
        store.mark_lease_lost(record)


async def unlock_member(store: RedisStore, record: LeaseRecord) -> None:
    try:
        await store.client.script(
            scripts.UNLOCK,
            [store.keys.lease(record.name)],
            [record.fence],
            f"release {record.name}'s lease",
        )
    except (StoreError, ResponseError) as exc:
        log.warning(
            "teamrt: %s's lease in team %r could not be released (%s); it expires by itself "
            "within %.1f s",
            record.name,
            store.team,
            exc,
            store.lease_ttl_ms / 1000,
        )


def validity(store: RedisStore) -> float:
    """Seconds a lease is known held after the request that took, renewed or checked it."""
    return store.lease_ttl_ms / 1000 * 0.9


async def _renew(store: RedisStore, records: list[LeaseRecord]) -> list[int]:
    """Run the renewal script for `records`: per lease 1 (extended), 2 (taken again), 0
    (lost: marked so); the ones kept are known held for `validity` from now."""
    keys = store.keys
    args: list[object] = [store.epoch, store.lease_ttl_ms]
    for record in records:
        args += [record.name, record.fence, store.holder_text(record)]
    sent = time.monotonic()
    try:
        reply = await store.client.script(
            scripts.RENEW,
            [keys.meta, keys.fences, *(keys.lease(r.name) for r in records)],
            args,
            "renew leases",
        )
    except ResponseError as exc:
        error = store.script_error(exc, "", "renew leases")
        if isinstance(error, StoreCorrupt):
            log.error("teamrt: %s; every lease of this process is lost", error)
            for record in records:
                store.mark_lease_lost(record, "the team's data was lost on the server")
        else:
            log.warning("teamrt: leases not renewed: %s", error)
        raise error from None
    results = [int(result) for result in reply]
    until = sent + validity(store)
    for record, result in zip(records, results, strict=True):
        if result == 0:
            store.mark_lease_lost(record)
        else:
            record.held_until(until)
    return results


async def renew_leases(store: RedisStore) -> None:
    records = [record for record in store.held_leases() if not record.expired]
    if not records:
        return
    try:
        results = await _renew(store, records)
    except StoreCorrupt:
        return
    except TeamrtError as exc:  # (a refusal was logged as a warning already)
        log.debug("leases not renewed (tried again at the next heartbeat): %s", exc)
        return
    for record, result in zip(records, results, strict=True):
        if result == 2:
            log.info(
                "teamrt: %s's lease had expired (no renewal for %.1f s) and nobody took it; "
                "taken again",
                record.name,
                store.lease_ttl_ms / 1000,
            )


async def confirm_lease(store: RedisStore, record: LeaseRecord) -> None:
    """One round trip: the lease is still this holder's (renewed), or `LeaseLost`."""
    if not record.expired:
        await _renew(store, [record])
    if record.expired:
        raise record.lost_error()


async def member_alive(store: RedisStore, name: str) -> bool | None:
    if store.lease_held(name):
        return True
    keys = store.keys
    try:
        pttl, ran = await store.client.pipeline(
            [("PTTL", keys.lease(name)), ("SISMEMBER", keys.ran, name)],
            f"check whether {name} runs",
            change=False,
        )
    except StoreError:
        return None
    if isinstance(pttl, int) and pttl >= 0:
        # renewed every heartbeat to the full time limit: a lease left this long without a
        # renewal belongs to a holder that stopped
        return store.lease_ttl_ms - pttl < LEASE_STALE_AFTER * 1000
    if isinstance(pttl, int) and pttl == -1:
        return True  # no time limit (set by hand)
    return False if ran == 1 else None
