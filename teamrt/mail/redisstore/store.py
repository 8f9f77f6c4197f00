"""`RedisStore`: a team's inboxes as Redis Streams, shared by processes on several hosts."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from anyio.abc import TaskStatus
from redis.exceptions import ResponseError

from teamrt.errors import (
    EnvelopeTooLarge,
    MemberBusy,
    StoreCorrupt,
    StoreError,
    TeamrtError,
    UnknownRecipient,
    UsageError,
)
from teamrt.mail.log import DEFAULT_MAX_LINE
from teamrt.mail.redisstore import leases, ledger, replies, scripts, tasks
from teamrt.mail.redisstore.client import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_SOCKET_TIMEOUT,
    RedisClient,
)
from teamrt.mail.redisstore.keys import Locator, TeamKeys, parse_locator
from teamrt.mail.redisstore.reader import RedisReader
from teamrt.mail.redisstore.watcher import Watcher
from teamrt.mail.signing import check_key
from teamrt.mail.store import (
    DEFAULT_MAX_BLOB,
    DEFAULT_MAX_ENVELOPE,
    HEARTBEAT_INTERVAL,
    LEASE_STALE_AFTER,
    Capabilities,
    Durability,
    LeaseRecord,
    Store,
    TeamView,
)
from teamrt.names import validate_name

#: The layout version written in a team's meta hash; a newer one is refused.
FORMAT = 1


class RedisStore(Store):
    """Inboxes as Redis Streams, for a team whose processes run on several hosts.

        store = RedisStore("redis://redis.internal:6379/0?team=research")
        async with Mailboxes(store, members=["lead", "writer"]) as mail: ...

    `url` is `redis://[user:password@]host:port/db?team=NAME` (or `rediss://` for TLS); `team=`
    may be given as an argument instead. Every key of the team starts with
    `<prefix>:{<team>}:` (one Redis Cluster hash slot). Each inbox is one stream whose entry ids
    follow `seq`, holding the same stamped lines the file store writes.

    - `durability="none"` (default) works with any server and promises what the server's own
      persistence promises: an acknowledged send survives the death of any teamrt process;
      with the server's `appendonly yes` and `appendfsync everysec` it survives the server
      process being killed, and loses at most about a second of sends if the machine loses
      power; without the append-only file a server restart loses the team (and every process
      of the team then refuses to go on: see below). `"fsync"` checks when the team is opened
      that the server runs with `appendonly yes` and `appendfsync always` (an acknowledged
      send is on the server's disk) and raises `DurabilityError` if it does not, or if the
      server does not allow `CONFIG GET`.
    - `max_envelope` and `lease_ttl` (seconds a member's lease lasts without a renewal, 5 by
      default or `?lease_ttl=` in the URL; the holder renews it every second) are fixed for the
      team when it is created; the team's values win afterwards, so every process agrees on
      them.
    - `create=False` refuses to create a team that does not exist (for tools that join one).
    - `socket_timeout`: how long a command waits for its answer before it fails as
      `OutcomeUnknown` (a change) or `StoreUnavailable` (a read); `connect_timeout`: how long
      opening a connection may take before the server counts as unreachable
      (`StoreUnavailable`: nothing was sent).

    Each team has a random epoch, stored with it and remembered by every store object that
    opened it; every script and the watcher check it. A server that lost the team's data (for
    instance restarted without its append-only file) is refused with `StoreCorrupt` saying so,
    instead of numbering inboxes from 0 again under cursors that would skip the new mail.
    """

    capabilities: ClassVar[Capabilities] = Capabilities(
        shared=True,
        opens_locally=False,
        leases_expire=True,
        atomic_broadcast=True,
        network=True,
    )

    def __init__(
        self,
        url: str,
        *,
        team: str | None = None,
        durability: Durability = "none",
        max_envelope: int = DEFAULT_MAX_ENVELOPE,
        max_blob: int = DEFAULT_MAX_BLOB,
        prefix: str | None = None,
        lease_ttl: float | None = None,
        create: bool = True,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        if durability not in ("none", "fsync"):
            raise UsageError(f"durability must be 'none' or 'fsync', not {durability!r}")
        if (
            (lease_ttl is not None and lease_ttl <= 0)
            or socket_timeout <= 0
            or connect_timeout <= 0
        ):
            raise UsageError("lease_ttl, socket_timeout and connect_timeout must be positive")
        self.locator: Locator = parse_locator(url, team=team, prefix=prefix)
        if lease_ttl is None:
            lease_ttl = self.locator.lease_ttl or LEASE_STALE_AFTER
        if lease_ttl < 2 * HEARTBEAT_INTERVAL:
            raise UsageError(
                f"lease_ttl={lease_ttl:g} is too short: holders renew their leases every "
                f"{HEARTBEAT_INTERVAL:g} s, so give at least {2 * HEARTBEAT_INTERVAL:g} s"
            )
        self.team = self.locator.team
        self.shown = self.locator.shown
        self.keys = TeamKeys(self.locator.prefix, self.team)
        self.client = RedisClient(
            self.locator, socket_timeout=socket_timeout, connect_timeout=connect_timeout
        )
        self.durability: Durability = durability
        self.max_envelope = max_envelope
        self.max_line = max(DEFAULT_MAX_LINE, max_envelope + 256)
        self.max_blob = max_blob  # this process's limit as a sender (receivers take any size)
        self._blob_view: TeamView | None = None  # its synchronous client reads blobs
        self.lease_ttl_ms = int(lease_ttl * 1000)
        self.create = create
        self.epoch = ""  # set by open(); kept for the life of this object
        self.created_at: float | None = None
        self._roster: tuple[str, ...] = ()
        self._fences: dict[str, int] = {}  # member -> fence of the last lease taken here
        self.watcher = Watcher(self)

    def __repr__(self) -> str:
        return f"RedisStore({self.shown!r})"

    # -- errors --

    def check_open(self) -> None:
        """Refuse to go on before `open()`."""
        if not self.epoch:
            raise UsageError(f"the Redis store of team {self.team!r} is not open: open() it first")

    def epoch_error(self, found: str | None) -> StoreCorrupt:
        """The error for a team whose epoch is not the one this object opened."""
        return replies.epoch_error(self, found)

    def check_epoch(self, found: object) -> None:
        """Raise `StoreCorrupt` unless `found` (a reply to `HGET meta epoch`) is our epoch."""
        if isinstance(found, ResponseError):
            raise self.client.refused(found, "read the team's epoch")
        text = found.decode() if isinstance(found, bytes) else None
        if text != self.epoch:
            raise self.epoch_error(text)

    def unknown_recipient(self, name: str) -> UnknownRecipient:
        return UnknownRecipient(
            f"no member {name!r} in team {self.team!r} "
            f"(members: {', '.join(self._roster) or 'none'})"
        )

    def script_error(
        self, exc: ResponseError, name: str, what: str = "", record: LeaseRecord | None = None
    ) -> TeamrtError:
        """A script's error reply as teamrt's error."""
        return replies.script_error(self, exc, name, what, record)

    # -- the team --

    async def open(self, members: Sequence[str], *, signing: str | None = None) -> None:
        names = [validate_name(name) for name in members]
        if self.durability == "fsync":
            await replies.check_durability(self)
        await self._open(names, create=self.create, signing=signing)

    async def _open(
        self, names: Sequence[str], *, create: bool, signing: str | None = None
    ) -> None:
        keys = self.keys
        try:
            reply = await self.client.script(
                scripts.OPEN,
                [keys.meta, keys.members, keys.next],
                [
                    "1" if create else "0",
                    self.epoch,
                    secrets.token_hex(8),
                    repr(time.time()),
                    FORMAT,
                    self.max_envelope,
                    self.team,
                    self.lease_ttl_ms,
                    "-" if signing is None else signing,
                    *names,
                ],
                f"open team {self.team!r}",
            )
        except ResponseError as exc:
            code, _, recorded = str(exc).partition(" ")
            if code == "TEAMRT_KEY" and signing is not None:
                check_key(self.team, recorded, signing)  # raises: the script found them differ
            raise self.script_error(exc, "", f"open team {self.team!r}") from None
        epoch, created_at, layout, max_envelope, lease_ttl_ms, recorded, roster = reply
        if int(layout) > FORMAT:
            raise StoreError(
                f"team {self.team!r} at {self.shown} was made by a newer teamrt (layout "
                f"{int(layout)}; this one knows {FORMAT}); upgrade teamrt"
            )
        self.epoch = epoch.decode()
        self.created_at = float(created_at)
        self.max_envelope = int(max_envelope)
        self.max_line = max(DEFAULT_MAX_LINE, self.max_envelope + 256)
        self.lease_ttl_ms = int(lease_ttl_ms)
        self.signing = None if recorded is None else recorded.decode()
        self._roster = tuple(name.decode() for name in roster)

    async def close(self) -> None:
        """Close this object's connections (its leases are released by their holders)."""
        if self._blob_view is not None:
            self._blob_view.close()
            self._blob_view = None
        await self.client.aclose()

    # -- blobs: the bodies of claim checks, fields of one hash (see keys.py) --

    async def blob_put(self, digest: str, data: bytes) -> None:
        # content-addressed: a retried or repeated put writes the same bytes
        await self.client.call("HSET", self.keys.blobs, digest, data, what="store a blob")

    def blob_get_nowait(self, digest: str) -> bytes | None:
        # the receive path is synchronous: one blocking round trip on the view's client
        if self._blob_view is None:
            self._blob_view = self.view()
        return self._blob_view.blob(digest)

    async def destroy(self) -> None:
        """Delete the team's keys (inboxes, cursors, quarantine, leases, ledger, blobs) in one
        script; `MemberBusy` if a member's lease is held. Other processes' stores of the team then
        refuse to go on (the team's epoch is gone), as after a server that lost its data."""
        keys = self.keys
        what = f"delete team {self.team!r}"
        roster = await self.client.call("LRANGE", keys.members, 0, -1, what=what, change=False)
        for _ in range(10):
            names = [name.decode() for name in roster]
            per_member = [
                key
                for name in names
                for key in (
                    keys.inbox(name),
                    keys.cursor(name),
                    keys.quarantine(name),
                    keys.lease(name),
                )
            ]
            per_member.append(keys.blobs)  # (after the members' keys the script reads)
            team_keys = [keys.meta, keys.members, keys.next, keys.fences, keys.ran, keys.qupto]
            reply = await self.client.script(
                scripts.DESTROY, [*team_keys, keys.ledger, *per_member], [",".join(names)], what
            )
            if int(reply[0]) == 1:
                self.epoch = ""
                self._roster = ()
                await tasks.delete_all(self, what)
                return
            if int(reply[0]) == 2:
                holder = reply[2].decode(errors="replace").partition(" ")[2]
                raise MemberBusy(
                    f"member {reply[1].decode()!r} of team {self.team!r} is running ({holder}); "
                    "stop it before deleting the team"
                )
            roster = reply[1]  # members joined meanwhile
        raise StoreError(f"{what}: the roster kept changing; nothing was deleted")

    def members(self) -> tuple[str, ...]:
        return self._roster

    async def members_now(self) -> tuple[str, ...]:
        self.check_open()
        replies = await self.client.pipeline(
            [("HGET", self.keys.meta, "epoch"), ("LRANGE", self.keys.members, 0, -1)],
            "read the roster",
            change=False,
        )
        self.check_epoch(replies[0])
        self._roster = tuple(name.decode() for name in replies[1])
        return self._roster

    async def add_member(self, name: str) -> None:
        validate_name(name)
        self.check_open()
        await self._open([name], create=False)

    # -- appending --

    async def append(self, recipient: str, encoded: bytes) -> int:
        return await self.append_many(recipient, (encoded,))

    async def append_many(self, recipient: str, encoded: Sequence[bytes]) -> int:
        if not encoded:
            return -1
        validate_name(recipient, what="recipient")
        self.check_open()
        for item in encoded:
            if len(item) > self.max_envelope:
                raise EnvelopeTooLarge(
                    f"an encoded envelope of {len(item)} bytes is over the team's limit of "
                    f"{self.max_envelope}; nothing was sent"
                )
        keys = self.keys
        what = f"append to {recipient}'s inbox"
        try:
            first = await self.client.script(
                scripts.APPEND,
                [keys.meta, keys.next, keys.inbox(recipient)],
                [self.epoch, recipient, self.team, *encoded],
                what,
            )
        except ResponseError as exc:
            raise self.script_error(exc, recipient, what) from None
        self.watcher.appended(recipient, int(first), encoded)
        return int(first)

    async def append_broadcast(self, sender: str, encoded: bytes) -> tuple[str, ...]:
        self.check_open()
        if len(encoded) > self.max_envelope:
            raise EnvelopeTooLarge(
                f"an encoded broadcast of {len(encoded)} bytes is over the team's limit of "
                f"{self.max_envelope}; nothing was sent"
            )
        keys = self.keys
        what = f"broadcast from {sender}"
        for _ in range(10):
            roster = self._roster
            targets = [name for name in roster if name != sender]
            try:
                ok, names, seqs = await self.client.script(
                    scripts.BROADCAST,
                    [keys.meta, keys.next, keys.members, *(keys.inbox(n) for n in targets)],
                    [self.epoch, self.team, sender, encoded, ",".join(roster)],
                    what,
                )
            except ResponseError as exc:
                raise self.script_error(exc, sender, what) from None
            found = tuple(name.decode() for name in names)
            if int(ok) == 1:
                for name, seq in zip(found, seqs, strict=True):
                    self.watcher.appended(name, int(seq), (encoded,))
                return found
            self._roster = found  # members joined since: again with the server's roster
        raise StoreError(f"{what}: the roster kept changing; nothing was sent")

    # -- reading and watching --

    def reader(self, name: str) -> RedisReader:
        return RedisReader(self, validate_name(name))

    async def tail_reader(self, name: str) -> RedisReader:
        self.check_open()
        reader = RedisReader(self, validate_name(name), tail=True)
        await reader.start()
        return reader

    async def watch(self, notify: Callable[[str], None], *, task_status: TaskStatus[None]) -> None:
        await self.watcher.run(notify, task_status=task_status)

    def watch_inbox(self, name: str) -> None:
        self.watcher.watch_inbox(name)

    def view(self) -> TeamView:
        """A read-only, synchronous view of this team for tools (`RedisView`)."""
        from teamrt.mail.redisstore.view import RedisView

        return RedisView(
            self.locator.url,
            team=self.team,
            prefix=self.locator.prefix,
            socket_timeout=self.client.socket_timeout,
            connect_timeout=self.client.connect_timeout,
        )

    # -- task records (tasks.py) and the budget ledger (ledger.py) --

    async def task_record_create(self, id_: str, record: dict[str, Any]) -> dict[str, Any]:
        return await tasks.create(self, id_, record)

    async def task_record_settle(self, id_: str, outcome: dict[str, Any]) -> dict[str, Any] | None:
        return await tasks.settle(self, id_, outcome)

    async def ledger_read(self) -> dict[str, Any] | None:
        return (await ledger.fetch(self))[1]

    async def ledger_update(
        self, change: Callable[[dict[str, Any] | None], dict[str, Any] | None]
    ) -> dict[str, Any] | None:
        """See `ledger.update`."""
        return await ledger.update(self, change)

    # -- leases and liveness (leases.py) --

    @property
    def lease_validity(self) -> float:  # type: ignore[override]
        return leases.validity(self)

    def holder_text(self, record: LeaseRecord) -> str:
        return leases.holder_text(record.holders[-1] if record.holders else "")

    async def _lock_member(self, name: str, holder: str) -> tuple[object, int]:
        self.check_open()
        token, fence = await leases.lock_member(self, name, holder)
        self._fences[name] = fence
        return token, fence

    def released_fence(self, name: str) -> int | None:
        """The fence of the last lease on `name` this store object took (held or released; the
        commit script decides whether it still fences a commit)."""
        return self._fences.get(name)

    async def _describe_holder(self, record: LeaseRecord, holder: str) -> None:
        await leases.describe_holder(self, record, holder)

    async def _unlock_member(self, record: LeaseRecord) -> None:
        await leases.unlock_member(self, record)

    async def renew_leases(self) -> None:
        await leases.renew_leases(self)

    async def confirm_lease(self, record: LeaseRecord) -> None:
        await leases.confirm_lease(self, record)

    async def member_alive(self, name: str) -> bool | None:
        return await leases.member_alive(self, name)

    def mark_lease_lost(
        self, record: LeaseRecord, why: str = "another holder took it over"
    ) -> None:
        if not record.expired:
            leases.log.warning(
                "teamrt: %s's lease in team %r (fence %d) is lost: %s; this incarnation's "
                "commits are refused from now on",
                record.name,
                self.team,
                record.fence,
                why,
            )
        super().mark_lease_lost(record)
