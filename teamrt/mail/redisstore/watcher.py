"""One process's wake-ups: a single blocking XREAD over every inbox the process reads.

Theory of operation. The watcher keeps, for each inbox stream this process reads (the owner's
readers, tail readers, and names given to `watch_inbox`), the seq its next XREAD reads from. It
sends `HGET meta epoch` and `XREAD COUNT n BLOCK t STREAMS ctl s1 s2 ... ids` in one write on a
connection of its own; the epoch is answered at once, so a team lost under the process is noticed
on every round, and the XREAD returns as soon as any of the streams has entries past its id. It
pushes the entries into the readers' buffers and calls `notify(name)` once per inbox.

When the set of streams changes while the XREAD waits (a reader starts, or one must be read from
an earlier position), a helper task adds an entry to this process's control stream `ctl:<id>`,
which is in the XREAD too: the read returns and starts again with the new set. Nothing is polled;
a finite BLOCK (10 s) only proves now and then that the connection is alive. All the team's keys
share one Cluster slot, so the multi-stream read is legal on a cluster.

If the server cannot be reached the watcher retries with a growing pause (up to 2 s) and resumes
from the same ids: nothing is missed. If the team's epoch changed or vanished (the server lost its
data), `watch` raises `StoreCorrupt` after waking every reader, whose next fetch raises it too.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
from anyio.abc import TaskStatus
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from teamrt.errors import StoreCorrupt, StoreError, UsageError
from teamrt.mail.log import Entry, stamp
from teamrt.mail.redisstore import scripts
from teamrt.mail.redisstore.reader import make_entry

if TYPE_CHECKING:
    from teamrt.mail.redisstore.reader import RedisReader
    from teamrt.mail.redisstore.store import RedisStore

log = logging.getLogger("teamrt.mail")

BLOCK_MS = 10_000
READ_COUNT = 512  # entries per stream per round
CONTROL_TTL_MS = 60_000  # a control stream outlives its last wake-up by this much
_MAX_PAUSE = 2.0


class Watcher:
    """The blocking XREAD of one store object (see the module docstring)."""

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        self._from: dict[str, int | None] = {}  # stream -> seq to read from (None: its end)
        self._readers: dict[str, list[RedisReader]] = {}
        self._watched: set[str] = set()
        self._control = store.keys.control(uuid.uuid4().hex)
        self._control_last = b"0-0"
        self._kick_wanted = anyio.Event()
        self._in_flight = False
        self.running = False
        self.rounds = 0  # XREAD rounds sent (for tests and statistics)

    # -- the set of streams --

    def watch_inbox(self, name: str) -> None:
        self._watched.add(name)
        if name not in self._from:
            self._from[name] = None
            self._changed()

    def attach(self, reader: RedisReader) -> None:
        readers = self._readers.setdefault(reader.name, [])
        if reader not in readers:
            readers.append(reader)
        self.rewind(reader)

    def rewind(self, reader: RedisReader) -> None:
        """Make the next XREAD read `reader`'s stream from no later than the reader's end."""
        position = self._from.get(reader.name)
        if position is None or position > reader.next_seq:
            self._from[reader.name] = reader.next_seq
            self._changed()

    def detach(self, reader: RedisReader) -> None:
        readers = self._readers.get(reader.name)
        if readers is not None and reader in readers:
            readers.remove(reader)
            if not readers:
                del self._readers[reader.name]
                if reader.name not in self._watched:
                    self._from.pop(reader.name, None)  # dropped at the next round

    def appended(self, name: str, first: int, encoded: Sequence[bytes]) -> None:
        """Records this store object just appended to `name`'s inbox (seq `first` on), handed
        to its local readers at once: a process reads its own writes without a round trip."""
        readers = self._readers.get(name)
        if not readers:
            return
        team = self._store.team.encode()
        for i, item in enumerate(encoded):
            seq = first + i
            entry = Entry(stamp(item, seq, team)[:-1], 0, seq, seq + 1)
            for reader in readers:
                reader.push_local(seq, entry)

    def _changed(self) -> None:
        if self._in_flight:
            self._kick_wanted.set()

    # -- running --

    async def run(self, notify: Callable[[str], None], *, task_status: TaskStatus[None]) -> None:
        if self.running:
            raise UsageError("this store is already being watched")
        client = self._store.client
        conn = client.new_connection(socket_timeout=BLOCK_MS / 1000 + client.socket_timeout)
        fault: StoreError | None = None
        self.running = True
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._kicker)
                task_status.started()
                fault = await self._loop(conn, notify)
                tg.cancel_scope.cancel()
        finally:
            self.running = False
            self._in_flight = False
            await client.discard(conn)
        for name in list(self._from):  # readers fetch, and meet the fault themselves
            notify(name)
        assert fault is not None  # the loop returns only with one
        raise fault

    async def _kicker(self) -> None:
        client = self._store.client
        while True:
            await self._kick_wanted.wait()
            self._kick_wanted = anyio.Event()
            if not self._in_flight:
                continue  # the loop rebuilds its set before its next read anyway
            # a failure here: the loop meets the same trouble and retries with the new set
            with contextlib.suppress(StoreError, ResponseError):
                await client.script(
                    scripts.KICK, [self._control], [CONTROL_TTL_MS], "wake the watcher"
                )

    async def _resolve_ends(self) -> None:
        """Streams watched from their end: read where that end is now."""
        names = [name for name, position in self._from.items() if position is None]
        if not names:
            return
        store = self._store
        (ends,) = await store.client.pipeline(
            [("HMGET", store.keys.next, *names)], "find the ends of inboxes", change=False
        )
        if isinstance(ends, ResponseError):
            raise store.client.refused(ends, "find the ends of inboxes")
        for name, end in zip(names, ends, strict=True):
            if self._from.get(name, 0) is None:
                if end is None:  # not a member: nothing to watch
                    del self._from[name]
                else:
                    self._from[name] = int(end)

    async def _loop(self, conn: Any, notify: Callable[[str], None]) -> StoreError:
        store = self._store
        client = store.client
        keys = store.keys
        pause = 0.05
        failing: str | None = None
        while True:
            try:
                await self._resolve_ends()
                sent = {n: p for n, p in self._from.items() if p is not None}
                streams = [self._control, *(keys.inbox(name) for name in sent)]
                ids = [self._control_last, *(b"0-%d" % p for p in sent.values())]
                command = ("XREAD", "COUNT", READ_COUNT, "BLOCK", BLOCK_MS, "STREAMS")
                self._in_flight = True
                if not conn.is_connected:
                    await client.connect(conn, "watch the inboxes")
                await client.write(conn, [("HGET", keys.meta, "epoch"), (*command, *streams, *ids)])
                self.rounds += 1
                try:
                    store.check_epoch(await conn.read_response())
                except StoreCorrupt as exc:
                    return exc
                reply = await conn.read_response()
            except StoreCorrupt as exc:
                return exc
            except (StoreError, RedisConnectionError, RedisTimeoutError, OSError) as exc:
                self._in_flight = False
                await client.discard(conn)
                if failing is None:
                    failing = str(exc)
                    log.warning(
                        "teamrt: the watcher of team %r lost Redis at %s (%s); retrying",
                        store.team,
                        store.locator.address,
                        exc,
                    )
                await anyio.sleep(pause)
                pause = min(pause * 2, _MAX_PAUSE)
                continue
            except ResponseError as exc:  # e.g. WRONGTYPE: a key of the team is not a stream
                await client.discard(conn)
                if client.rerouted(exc):  # Redis Cluster: the team's slot moved, or is moving
                    self._in_flight = False
                    await anyio.sleep(pause)
                    pause = min(pause * 2, _MAX_PAUSE)
                    continue
                return StoreCorrupt(
                    f"team {store.team!r} at {store.shown}: the watcher's read was refused "
                    f"({exc}); a key of the team was changed by another program"
                )
            self._in_flight = False
            if failing is not None:
                log.warning("teamrt: the watcher of team %r reached Redis again", store.team)
                failing = None
                pause = 0.05
            if reply:
                try:
                    self._deliver(reply, sent, notify)
                except StoreCorrupt as exc:
                    return exc
                # let the readers just woken run before the next read is sent: their answers
                # go out first, and the read is written while they wait for theirs
                await anyio.lowlevel.checkpoint()

    def _deliver(
        self, reply: list[Any], sent: dict[str, int], notify: Callable[[str], None]
    ) -> None:
        store = self._store
        max_line = store.max_line
        woken: list[str] = []
        for key, items in reply:
            if not items:
                continue
            if key == self._control.encode():
                self._control_last = items[-1][0]
                continue
            name = store.keys.inbox_name(key)
            readers = self._readers.get(name, ())
            seq = -1
            for item in items:
                seq, entry = make_entry(item, max_line)
                for reader in readers:
                    reader.push(seq, entry)
            if name in sent and self._from.get(name) == sent[name]:  # not rewound meanwhile
                self._from[name] = seq + 1
            woken.append(name)
        for name in woken:
            notify(name)
