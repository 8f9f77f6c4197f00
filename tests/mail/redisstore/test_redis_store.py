"""RedisStore on a private redis-server: the layout, the watcher, leases with fencing, outages,
a server killed, paused or restarted without its data, the view and the export."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis

from teamrt.envelopes import Envelope, Message
from teamrt.errors import (
    DurabilityError,
    EnvelopeTooLarge,
    InvalidName,
    LeaseLost,
    MemberBusy,
    OutcomeUnknown,
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
    UnknownRecipient,
    UsageError,
)
from teamrt.mail.filestore import FileStore
from teamrt.mail.filestore.export import export_team
from teamrt.mail.inspect import inspect_team
from teamrt.mail.log import AckTracker, Corrupt, Cursor, decode_line, encode, stamp
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.redisstore import RedisStore, RedisView, parse_locator, reader, view
from teamrt.mail.redisstore.client import pack
from teamrt.mail.redisstore.keys import TeamKeys
from tests.support.paths import ROOT
from tests.support.redis_server import RedisServer, free_port, redis_server, shared_redis

__all__ = ["redis_server", "shared_redis"]  # fixtures


def _sync(server: RedisServer) -> Any:
    return redis.Redis(port=server.port, protocol=2)


def _client(store: RedisStore) -> Any:
    return redis.Redis.from_url(store.locator.url, protocol=2)


def _message(i: object, to: str = "worker") -> bytes:
    return encode(Envelope.message("lead", to, i))


def _envelope(raw: bytes) -> Envelope:
    decoded = decode_line(raw)
    assert not isinstance(decoded, str), decoded
    return decoded


@pytest.fixture
async def store(shared_redis: RedisServer) -> AsyncIterator[RedisStore]:
    s = RedisStore(shared_redis.url())
    await s.open(["lead", "worker", "writer"])
    try:
        yield s
    finally:
        await s.close()


class Watching:
    """A store's watcher running in a task group, recording what it notified."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.notified: list[str] = []
        self.woken = anyio.Event()

    def notify(self, name: str) -> None:
        self.notified.append(name)
        self.woken.set()

    async def wait(self) -> None:
        with anyio.fail_after(10):
            await self.woken.wait()
        self.woken = anyio.Event()


# -- the locator and the layout ------------------------------------------------------------------


def test_locators() -> None:
    loc = parse_locator("redis://:secret@db.example:6380/2?team=research&socket_timeout=1")
    assert (loc.team, loc.host, loc.port, loc.db, loc.prefix) == (
        "research",
        "db.example",
        6380,
        2,
        "teamrt",
    )
    assert "secret" not in loc.shown and loc.shown == "redis://db.example:6380/2?team=research"
    assert "team=" not in loc.url and "socket_timeout=1" in loc.url
    assert parse_locator("rediss://h/0", team="t", prefix="app").prefix == "app"
    with pytest.raises(UsageError, match="add \\?team=NAME"):
        parse_locator("redis://h:1/0")
    with pytest.raises(UsageError, match="names team 'a'"):
        parse_locator("redis://h/0?team=a", team="b")
    with pytest.raises(InvalidName):
        parse_locator("redis://h/0?team=../x")
    with pytest.raises(UsageError, match="not a Redis locator"):
        parse_locator("/tmp/team")
    assert parse_locator("redis://h/0?team=t&lease_ttl=2.5").lease_ttl == 2.5
    with pytest.raises(UsageError, match="give seconds"):
        parse_locator("redis://h/0?team=t&lease_ttl=soon")
    with pytest.raises(UsageError, match="unknown option colour"):
        RedisStore("redis://h/0?team=t&colour=blue")
    assert RedisStore("redis://h/0?team=t&lease_ttl=2").lease_ttl_ms == 2000
    with pytest.raises(UsageError, match="too short"):
        RedisStore("redis://h/0?team=t", lease_ttl=0.5)
    unix = parse_locator("unix:///run/redis/redis.sock?db=3&team=t&prefix=p")
    assert (unix.host, unix.port, unix.db, unix.address) == (
        "/run/redis/redis.sock",
        0,
        3,
        "/run/redis/redis.sock",
    )
    assert unix.shown == "unix:///run/redis/redis.sock?db=3&team=t" and "prefix" not in unix.url
    keys = TeamKeys("teamrt", "research")
    assert keys.inbox("lead") == "teamrt:{research}:inbox:lead"
    assert keys.inbox_name(keys.inbox("lead").encode()) == "lead"


def test_commands_are_packed_in_the_redis_protocol() -> None:
    long = "c" * 500  # not kept in the cache of short strings
    packed = pack([("SET", b"k\r\n", 12), ("X", 1.5, long, "SET")])
    assert packed == (
        b"*3\r\n$3\r\nSET\r\n$3\r\nk\r\n\r\n$2\r\n12\r\n"
        b"*4\r\n$1\r\nX\r\n$3\r\n1.5\r\n$500\r\n" + long.encode() + b"\r\n$3\r\nSET\r\n"
    )
    with pytest.raises(TypeError):
        pack([("SET", None)])
    with pytest.raises(TypeError):
        pack([("SET", True)])


async def test_records_are_the_file_stores_lines_with_ids_that_follow_seq(
    store: RedisStore, shared_redis: RedisServer
) -> None:
    items = [_message(i) for i in range(5)]
    assert await store.append("worker", items[0]) == 0
    assert await store.append_many("worker", items[1:]) == 1
    assert await store.append("writer", items[0]) == 0  # seq is per inbox
    entries = _sync(shared_redis).xrange(store.keys.inbox("worker"))
    assert [e[0] for e in entries] == [b"0-%d" % (i + 1) for i in range(5)]
    team = store.team.encode()
    # the bytes a file store would write, without the newline: export is concatenation
    assert [e[1][b"d"] for e in entries] == [stamp(x, i, team)[:-1] for i, x in enumerate(items)]
    assert await store.append_many("worker", []) == -1


async def test_a_team_over_a_unix_socket(shared_redis: RedisServer) -> None:
    url = f"unix://{shared_redis.socket}?team=local"
    s = RedisStore(url)
    await s.open(["lead", "worker"])
    assert await s.append("worker", _message(1)) == 0
    rd = s.reader("worker")
    await rd.start()
    assert [_envelope(e.raw).body for e in rd.read_nowait()] == [1]
    with RedisView(url) as v:
        assert v.end("worker") == (0, 1)
    rd.close()
    await s.close()


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (the test skips without openssl)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl to make a certificate")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


async def test_a_team_over_tls(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    tls_port = free_port()
    server = RedisServer(
        tmp_path / "redis",
        extra=(
            *("--tls-port", str(tls_port), "--tls-cert-file", str(cert)),
            *("--tls-key-file", str(key), "--tls-ca-cert-file", str(cert)),
            *("--tls-auth-clients", "no"),
        ),
    )
    try:
        server.start()
    except RuntimeError as exc:
        pytest.skip(f"this redis-server has no TLS: {exc}")
    try:
        url = f"rediss://127.0.0.1:{tls_port}/0?team=secure&ssl_ca_certs={cert}"
        s = RedisStore(url)
        await s.open(["lead", "worker"])
        for i in range(3):
            await s.append("worker", _message(i))
        rd = s.reader("worker")
        await rd.start()
        assert [_envelope(e.raw).body for e in rd.read_nowait()] == [0, 1, 2]
        assert len(s.client._idle) == 1  # one connection, reused
        for _ in range(5):
            with RedisView(url) as v:
                assert v.end("worker") == (0, 3)
        rd.close()
        await s.close()
    finally:
        server.stop()


async def test_membership_names_and_limits(store: RedisStore, shared_redis: RedisServer) -> None:
    with pytest.raises(UnknownRecipient, match=r"no member 'nobody'.*members: lead, worker"):
        await store.append("nobody", _message(1))
    with pytest.raises(InvalidName):
        await store.append("../x", _message(1))
    with pytest.raises(EnvelopeTooLarge, match="nothing was sent"):
        await store.append("worker", b"x" * (store.max_envelope + 1))
    assert not _sync(shared_redis).exists(store.keys.inbox("nobody"))
    # another store object adds a member; this one sees it (server-side roster)
    other = RedisStore(store.locator.url, team=store.team)
    await other.open(["critic"])
    assert await store.append("critic", _message(1)) == 0
    assert "critic" in await store.members_now()
    await other.close()
    # the team's own limits win over the arguments of later store objects
    late = RedisStore(store.locator.url, team=store.team, max_envelope=10, lease_ttl=60)
    await late.open([])
    assert (late.max_envelope, late.lease_ttl_ms) == (store.max_envelope, store.lease_ttl_ms)
    await late.close()
    joiner = RedisStore(store.locator.url.replace("/0", "/0"), team="nosuchteam", create=False)
    with pytest.raises(StoreError, match="no team 'nosuchteam'"):
        await joiner.open([])
    await joiner.close()


async def test_a_foreign_entry_is_refused_before_anything_is_written(
    store: RedisStore, shared_redis: RedisServer
) -> None:
    await store.append("worker", _message(0))
    await store.append("writer", _message(0))
    r = _sync(shared_redis)
    r.xadd(store.keys.inbox("worker"), {"d": b"not ours"})  # an automatic (time-based) id
    with pytest.raises(StoreCorrupt, match="did not write"):
        await store.append("worker", _message(1))
    with pytest.raises(StoreCorrupt, match="did not write"):
        await store.append_broadcast("lead", encode(Envelope.broadcast("lead", "x")))
    assert r.xlen(store.keys.inbox("writer")) == 1  # the broadcast wrote nowhere
    assert r.xlen(store.keys.inbox("worker")) == 2


async def test_broadcast_reaches_the_servers_roster_all_or_none(
    store: RedisStore, shared_redis: RedisServer
) -> None:
    other = RedisStore(store.locator.url, team=store.team)
    await other.open(["critic"])  # this store object does not know it yet
    reached = await store.append_broadcast("lead", encode(Envelope.broadcast("lead", "hi")))
    assert reached == ("worker", "writer", "critic")
    assert store.members() == ("lead", "worker", "writer", "critic")
    r = _sync(shared_redis)
    for name in reached:
        (entry,) = r.xrange(store.keys.inbox(name))
        assert entry[1][b"d"].startswith(b'{"seq":0,')
    assert r.xlen(store.keys.inbox("lead")) == 0
    await other.close()


# -- reading: the watcher, read_nowait and fetch ------------------------------------------------


async def test_each_entry_once_across_the_watcher_and_fetch(store: RedisStore) -> None:
    watching = Watching(store)
    async with anyio.create_task_group() as tg:
        await tg.start(store.watch, watching.notify)
        rd = store.reader("worker")
        assert await rd.start() == Cursor()
        seen: list[bytes] = []
        for round_ in range(5):
            await store.append_many("worker", [_message(f"{round_}.{i}") for i in range(7)])
            if round_ % 2:
                seen += [e.raw for e in await rd.fetch()]  # may overtake the watcher
            else:
                await watching.wait()
                seen += [e.raw for e in rd.read_nowait()]
        await store.append("worker", _message("last"))
        await watching.wait()
        seen += [e.raw for e in rd.read_nowait()]
        seen += [e.raw for e in await rd.fetch()]
        assert rd.read_nowait() == []
        tg.cancel_scope.cancel()
    seqs = [_envelope(raw).seq for raw in seen]
    assert seqs == list(range(36))
    assert set(watching.notified) == {"worker"}
    rd.close()


async def test_the_watcher_restarts_when_a_reader_starts(
    store: RedisStore, shared_redis: RedisServer
) -> None:
    watching = Watching(store)
    async with anyio.create_task_group() as tg:
        await tg.start(store.watch, watching.notify)
        await anyio.sleep(0.05)  # the watcher blocks in its XREAD over no inbox
        rounds = store.watcher.rounds
        rd = store.reader("writer")
        await rd.start()  # must interrupt the blocked read through the control stream
        await store.append("writer", _message("x", "writer"))
        await watching.wait()
        assert len(rd.read_nowait()) == 1
        assert store.watcher.rounds > rounds
        assert _sync(shared_redis).exists(store.watcher._control)
        # a tail reader starts at the end and sees only what comes next
        tail = await store.tail_reader("writer")
        await store.append("writer", _message("y", "writer"))
        await watching.wait()
        assert [_envelope(e.raw).body for e in tail.read_nowait()] == ["y"]
        with pytest.raises(UsageError):
            await tail.commit(Cursor())
        tg.cancel_scope.cancel()
    rd.close()
    tail.close()


async def test_a_full_buffer_leaves_the_rest_for_later_and_loses_nothing(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader, "MAX_BUFFERED", 5)
    watching = Watching(store)
    async with anyio.create_task_group() as tg:
        await tg.start(store.watch, watching.notify)
        rd = store.reader("worker")
        await rd.start()
        await store.append_many("worker", [_message(i) for i in range(23)])
        got: list[int | None] = []
        with anyio.fail_after(10):
            while len(got) < 23:
                batch = rd.read_nowait()
                assert len(batch) <= 5
                got += [_envelope(e.raw).seq for e in batch]
                if not batch:
                    await watching.wait()
        assert got == list(range(23))
        tg.cancel_scope.cancel()
    rd.close()


async def test_long_and_foreign_records_reach_the_reader_as_bad_entries(
    store: RedisStore, shared_redis: RedisServer
) -> None:
    r = _sync(shared_redis)
    await store.append("worker", _message(0))
    r.xadd(store.keys.inbox("worker"), {"x": "y"}, id="0-2")  # no `d` field
    r.hset(store.keys.next, "worker", 2)
    r.xadd(store.keys.inbox("worker"), {"d": b"z" * (store.max_line + 5)}, id="0-3")
    r.hset(store.keys.next, "worker", 3)
    rd = store.reader("worker")
    await rd.start()
    first, fieldless, long = await rd.fetch()
    assert not isinstance(decode_line(first.raw), str)
    assert isinstance(decode_line(fieldless.raw), str)
    assert long.too_long and len(long.raw) == store.max_line and long.at == (0, 2)
    rd.close()


async def test_quarantine_once_per_record_and_the_view_shows_it(store: RedisStore) -> None:
    rd = store.reader("worker")
    await rd.start()
    bad = Corrupt((0, 3), (0, 4), "json: oops", b"\xff{")
    await rd.quarantine(bad)
    await rd.quarantine(bad)  # read again after a restart: not recorded twice
    await rd.quarantine(Corrupt((0, 1), (0, 2), "older", b"x"))
    with store.view() as v:
        (record,) = list(v.quarantined("worker"))
    assert (record["at"], record["end"], record["reason"]) == ([0, 3], [0, 4], "json: oops")
    assert record["raw"] == "\\xff{" and record["ts"] > 0
    rd.close()


# -- cursors and leases --------------------------------------------------------------------------


async def test_cursor_commits_are_fenced_and_a_lost_lease_is_told(store: RedisStore) -> None:
    await store.append_many("worker", [_message(i) for i in range(4)])
    lease = await store.acquire_lease("worker", "pid 1, first")
    rd = store.reader("worker")
    await rd.start()
    assert len(await rd.fetch()) == 4
    await rd.commit(Cursor(0, 2, 1))
    assert not await rd.changed_elsewhere()

    # its holder stops renewing (paused past the time limit): the key lapses
    _sync_keys = store.keys
    other = RedisStore(store.locator.url, team=store.team)
    await other.open([])
    redis_sync = _client(store)
    redis_sync.delete(_sync_keys.lease("worker"))
    successor = await other.acquire_lease("worker", "pid 2, second")
    assert successor.fence > lease.fence
    # the old holder commits: refused, naming the holder now, and its lease is marked lost
    with pytest.raises(LeaseLost, match=r"pid 2, second on .* holds it now"):
        await rd.commit(Cursor(0, 4, 3))
    assert lease.lost.is_set()
    with pytest.raises(LeaseLost, match="pid 2, second"):
        await rd.commit(Cursor(0, 4, 3))  # still refused by the server, however it is asked
    with pytest.raises(MemberBusy, match="pid 2, second"):
        await store.acquire_lease("worker", "pid 1, again")
    with store.view() as v:
        assert v.committed("worker").offset == 2
        assert (v.holder("worker") or "").startswith("pid 2, second")
    # the successor reads from the committed cursor and commits
    rd2 = other.reader("worker")
    assert (await rd2.start()).offset == 2
    await rd2.commit(Cursor(0, 4, 3))
    assert await rd.changed_elsewhere()
    await lease.release()  # a lost lease is released without touching the successor's
    assert await store.member_alive("worker") is True
    await successor.release()
    assert await store.member_alive("worker") is False
    assert await store.member_alive("writer") is None  # never ran
    redis_sync.close()
    rd.close()
    rd2.close()
    await other.close()


async def test_acks_flushed_after_the_lease_was_released_commit_until_someone_takes_it(
    store: RedisStore,
) -> None:
    """A Team releases its member's lease before its mailboxes flush their last acks: that
    commit passes (without taking the lease back) while nobody took the lease since."""
    r = _client(store)
    rd = store.reader("worker")
    with pytest.raises(LeaseLost, match="never took it"):
        await rd.commit(Cursor())
    lease = await store.acquire_lease("worker", "the team")
    await rd.start()
    await lease.release()
    await rd.commit(Cursor(0, 0, -1, recent=("a",)))
    assert not r.exists(store.keys.lease("worker"))  # not taken back
    other = RedisStore(store.locator.url, team=store.team)
    await other.open([])
    successor = await other.acquire_lease("worker", "next incarnation")
    with pytest.raises(LeaseLost, match="next incarnation"):
        await rd.commit(Cursor(0, 0, -1, recent=("b",)))
    with store.view() as v:
        assert v.committed("worker").recent == ("a",)
    await successor.release()
    rd.close()
    r.close()
    await other.close()


async def test_renewal_extends_takes_back_or_reports_lost(store: RedisStore) -> None:
    r = _client(store)
    key = store.keys.lease("worker")
    lease = await store.acquire_lease("worker", "me")
    r.pexpire(key, 50)
    await store.renew_leases()
    assert r.pttl(key) > 1000  # extended to the full time limit
    r.delete(key)  # expired, and nobody took it since: taken back
    await store.renew_leases()
    assert r.get(key).startswith(b"%d " % lease.fence)
    assert not lease.lost.is_set()
    rd = store.reader("worker")
    await rd.start()
    r.delete(key)  # expired again: a commit takes it back too
    await rd.commit(Cursor())
    assert r.exists(key)
    r.delete(key)
    other = RedisStore(store.locator.url, team=store.team)
    await other.open([])
    taken = await other.acquire_lease("worker", "thief")
    await store.renew_leases()
    assert lease.lost.is_set()
    assert not store.lease_held("worker")
    again = await other.acquire_lease("worker", "thief, twice")  # re-entrant in its store
    await again.release()
    await taken.release()
    rd.close()
    r.close()
    await other.close()


async def test_the_budget_ledger_under_concurrent_updates(store: RedisStore) -> None:
    assert await store.ledger_read() is None
    others = [RedisStore(store.locator.url, team=store.team) for _ in range(3)]
    for other in others:
        await other.open([])

    def add(ledger: dict[str, Any] | None) -> dict[str, Any]:
        return {"spent": (ledger or {}).get("spent", 0) + 1}

    async def spend(s: RedisStore) -> None:
        for _ in range(20):
            await s.ledger_update(add)

    async with anyio.create_task_group() as tg:
        for s in [store, *others]:
            tg.start_soon(spend, s)
    assert await store.ledger_read() == {"spent": 80}
    assert await store.ledger_update(lambda ledger: None) == {"spent": 80}
    for other in others:
        await other.close()


# -- the server: unreachable, durability, killed, paused, restarted without data ---------------


async def test_an_unreachable_server_is_not_sent(tmp_path: Any) -> None:
    server = RedisServer(tmp_path)  # never started: nothing listens on its port
    s = RedisStore(server.url(), connect_timeout=0.5)
    with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{server.port}.*nothing was done"):
        await s.open(["lead"])
    await s.close()


async def test_fsync_durability_is_checked_at_open(tmp_path: Any) -> None:
    server = RedisServer(tmp_path / "r", appendfsync="everysec")
    server.start()
    try:
        s = RedisStore(server.url(), durability="fsync")
        with pytest.raises(DurabilityError, match="appendfsync everysec"):
            await s.open(["lead"])
        s2 = RedisStore(server.url(), durability="none")
        await s2.open(["lead"])  # works on any server
        await s.close()
        await s2.close()
    finally:
        server.stop()
    locked = RedisServer(tmp_path / "locked", extra=("--rename-command", "CONFIG", ""))
    locked.start()
    try:
        s = RedisStore(locked.url(), durability="fsync")
        with pytest.raises(DurabilityError, match="refused CONFIG GET"):
            await s.open(["lead"])
        await s.close()
    finally:
        locked.stop()


async def test_kill_9_with_appendfsync_always_loses_no_acknowledged_send(
    redis_server: RedisServer,
) -> None:
    s = RedisStore(redis_server.url("durable"), durability="fsync", socket_timeout=1)
    await s.open(["lead", "worker"])
    acknowledged: list[str] = []
    failures: list[type[BaseException]] = []
    killer = threading.Timer(0.3, redis_server.kill)
    killer.start()
    with anyio.fail_after(30):
        while redis_server.process is not None or not failures:
            envelope = Envelope.message("lead", "worker", len(acknowledged))
            try:
                await s.append("worker", encode(envelope))
            except (StoreUnavailable, OutcomeUnknown) as exc:
                failures.append(type(exc))
                continue
            acknowledged.append(envelope.id)
    killer.join()
    assert acknowledged and failures
    redis_server.start()  # on its append-only file
    found = []
    with s.view() as v:
        for entry in v.scan("worker"):
            found.append(_envelope(entry.raw).id)
    assert found[: len(acknowledged)] == acknowledged  # nothing acknowledged was lost
    assert len(found) <= len(acknowledged) + 1  # at most the one in flight got in
    assert await s.append("worker", _message("after")) == len(found)  # same team, same epoch
    await s.close()


async def _until_acknowledged(send: Callable[..., Awaitable[object]], *args: Any) -> None:
    """Send again until the store acknowledges: a server just resumed on a loaded machine may
    answer slower than these tests' 0.3 s timeout for a moment, and sending the same envelope
    again is what the error says to do (its receiver drops a second copy by its id)."""
    with anyio.fail_after(60):
        while True:
            try:
                await send(*args)
                return
            except (StoreUnavailable, OutcomeUnknown):
                await anyio.sleep(0.05)


async def test_a_paused_server_fails_sends_then_recovers_without_loss_or_duplicates(
    redis_server: RedisServer,
) -> None:
    s = RedisStore(redis_server.url("paused"), socket_timeout=0.3, connect_timeout=0.3)
    await s.open(["lead", "worker"])
    watching = Watching(s)
    sent = [Envelope.message("lead", "worker", i) for i in range(6)]
    errors: list[StoreError] = []
    async with anyio.create_task_group() as tg:
        await tg.start(s.watch, watching.notify)
        rd = s.reader("worker")
        await rd.start()
        await s.append("worker", encode(sent[0]))
        arrived = rd.read_nowait()  # this process's own send, at once
        assert len(arrived) == 1
        with redis_server.outage():
            for envelope in sent[1:4]:
                try:
                    await s.append("worker", encode(envelope))
                except (StoreUnavailable, OutcomeUnknown) as exc:
                    errors.append(exc)
                else:
                    raise AssertionError("an append to a paused server succeeded")
            with pytest.raises((StoreUnavailable, OutcomeUnknown)):
                await rd.fetch()
        # the sender retries what failed, with the same envelopes (maybe sent twice), until
        # each is acknowledged: a server just resumed on a loaded machine may still be slower
        # than the 0.3 s timeout for a moment, and sending again is what the error says to do
        for envelope in sent[1:]:
            await _until_acknowledged(s.append, "worker", encode(envelope))
        tracker = AckTracker()
        delivered: list[Any] = []
        with anyio.fail_after(10):
            while len(delivered) < len(sent):
                entries = arrived or rd.read_nowait() or await rd.fetch()
                arrived = []
                for entry in entries:
                    got = _envelope(entry.raw)
                    if tracker.deliver(got.id, entry.segment, entry.stop, got.seq):
                        delivered.append(got.body)
                if not entries:
                    await watching.wait()
        tg.cancel_scope.cancel()
    assert delivered == list(range(6))  # receiver dedup: once each, in order
    assert all(isinstance(e, (StoreUnavailable, OutcomeUnknown)) for e in errors)
    assert isinstance(errors[0], OutcomeUnknown)  # its request went out on an open connection
    assert any("127.0.0.1" in str(e) for e in errors)
    rd.close()
    await s.close()


async def test_a_paused_server_between_two_processes_loses_and_doubles_nothing(
    redis_server: RedisServer,
) -> None:
    """Two store objects (as two processes would): the receiver waits in receive() while the
    server is stopped; the sender's failed sends are retried with the same envelopes after it
    resumes; the application gets every envelope once, in order."""
    url = redis_server.url("outage")

    def store() -> RedisStore:
        return RedisStore(url, socket_timeout=0.3, connect_timeout=0.3)

    sent = [Envelope.message("lead", "worker", i) for i in range(8)]
    failed: list[Message] = []
    received: list[Any] = []
    async with (
        Mailboxes(store(), members=["lead", "worker"], send_retry=0) as sender,
        Mailboxes(store(), send_retry=0) as receiver,
    ):
        inbox = await receiver.open_inbox("worker")

        all_received = anyio.Event()

        async def receive_all() -> None:
            while len(received) < len(sent):
                envelope = await inbox.receive()
                received.append(envelope.body)
                await inbox.ack(envelope)
            all_received.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(receive_all)
            await sender.send(sent[0])
            with redis_server.outage():
                for envelope in sent[1:5]:
                    try:
                        await sender.send(envelope)
                    except (StoreUnavailable, OutcomeUnknown):
                        failed.append(envelope)
            for again in [*failed, *failed[:1]]:  # again (one of them twice)
                await _until_acknowledged(sender.send, again)
            for envelope in sent[5:]:
                await _until_acknowledged(sender.send, envelope)
            with anyio.fail_after(20):
                await all_received.wait()
            tg.cancel_scope.cancel()
        assert failed  # the outage was seen
        assert sorted(received) == list(range(8))  # none lost, none twice
        assert inbox.statistics().duplicates_dropped >= 1


_PAUSED_CHILD = """
import sys
import anyio
from teamrt.errors import LeaseLost
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.redisstore import RedisStore

async def main(url):
    async with Mailboxes(RedisStore(url)) as mail:
        inbox = await mail.open_inbox("worker")
        print("holding", flush=True)
        got = await inbox.receive()
        print("got", got.body, flush=True)
        await inbox._lease.lost.wait()  # renewed every second until another holder has it
        try:
            await inbox.ack(got)
            print("acked", flush=True)
        except LeaseLost:
            print("refused", flush=True)
        await inbox.close()

try:
    anyio.run(main, sys.argv[1])
except BaseException as exc:
    print("exit:", type(exc).__name__, flush=True)
"""


def _start_child(code: str, *args: str) -> subprocess.Popen[bytes]:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": path},
    )


async def _eventually(check: Callable[[], bool], what: str) -> None:
    """Wait (polling Redis, at most 20 s) until `check()` is true."""
    with anyio.fail_after(20):
        while True:
            if check():
                return
            await anyio.sleep(0.05)


async def test_an_agent_process_paused_past_its_lease_loses_it_to_a_successor(
    redis_server: RedisServer,
) -> None:
    url = redis_server.url("paused-agent")
    creator = RedisStore(url, lease_ttl=2.0)  # the team's time limit: 2 s without a renewal
    await creator.open(["lead", "worker"])
    child = _start_child(_PAUSED_CHILD, url)
    assert child.stdout is not None
    try:
        with anyio.fail_after(20):
            line = await anyio.to_thread.run_sync(child.stdout.readline)
        assert line == b"holding\n"
        await creator.append("worker", _message("job"))
        with anyio.fail_after(20):
            line = await anyio.to_thread.run_sync(child.stdout.readline)
        assert line == b"got job\n"
        view_ = creator.view()
        child.send_signal(signal.SIGSTOP)  # the agent's process hangs past its time limit
        await _eventually(lambda: view_.holder("worker") is None, "the lease to lapse")
        successor = RedisStore(url)
        async with Mailboxes(successor) as mail:
            inbox = await mail.open_inbox("worker")  # takes the lease over
            child.send_signal(signal.SIGCONT)
            job = await inbox.receive(timeout=10)  # the job was never acked: it comes again
            assert job.body == "job"
            with anyio.fail_after(20):
                told = await anyio.to_thread.run_sync(child.stdout.readline)
            assert told == b"refused\n"  # the old incarnation cannot move the cursor
            await inbox.ack(job)
            assert view_.committed("worker").offset == 1
            assert "inbox of worker" in (view_.holder("worker") or "")
        view_.close()
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)
            child.kill()
        child.wait(10)
        child.stdout.close()
        await creator.close()


async def test_a_server_restarted_without_its_data_is_refused(redis_server: RedisServer) -> None:
    url = redis_server.url("forgetful")
    s = RedisStore(url)
    await s.open(["lead", "worker"])
    await s.append_many("worker", [_message(i) for i in range(3)])
    lease = await s.acquire_lease("worker", "me")
    rd = s.reader("worker")
    await rd.start()
    assert len(rd.read_nowait()) == 3  # what had arrived comes with the start
    await rd.commit(Cursor(0, 3, 2))
    redis_server.kill()
    redis_server.wipe()  # no append-only file: the server comes back empty
    redis_server.start()
    with pytest.raises(StoreCorrupt, match="append-only file"):
        await s.append("worker", _message("after"))
    with pytest.raises(StoreCorrupt, match="gone from Redis"):
        await rd.fetch()
    with pytest.raises(StoreCorrupt, match="gone from Redis"):
        await rd.commit(Cursor(0, 3, 2))
    with pytest.raises(StoreCorrupt):
        await s.open(["lead"])  # this object never re-creates the team it remembers
    await s.renew_leases()
    assert lease.lost.is_set()
    with pytest.raises(StoreCorrupt, match="gone from Redis"):
        await s.watch(lambda name: None, task_status=anyio.TASK_STATUS_IGNORED)
    # another process creates the team anew: this object still refuses, saying so
    fresh = RedisStore(url)
    await fresh.open(["lead", "worker"])
    with pytest.raises(StoreCorrupt, match="created again"):
        await s.append("worker", _message("after"))
    rd.close()
    await s.close()
    await fresh.close()


async def test_destroy_deletes_the_team_unless_a_member_runs(shared_redis: RedisServer) -> None:
    url = shared_redis.url()
    s = RedisStore(url)
    await s.open(["lead", "worker"])
    await s.append("worker", _message(1))
    await s.ledger_update(lambda ledger: {"spent": 1})
    lease = await s.acquire_lease("worker", "a running member")
    other = RedisStore(url)
    with pytest.raises(MemberBusy, match="a running member"):
        await other.destroy()
    await lease.release()
    await other.destroy()
    prefix = s.keys.base.encode()
    assert list(_sync(shared_redis).scan_iter(match=prefix + b"*")) == []
    with pytest.raises(StoreCorrupt, match="gone from Redis"):
        await s.append("worker", _message(2))  # a store object of the deleted team refuses
    fresh = RedisStore(url)
    await fresh.open(["lead"])  # a new team of that name starts from nothing
    assert fresh.members() == ("lead",)
    for store in (s, other, fresh):
        await store.close()


async def test_a_cursor_past_the_inbox_end_is_refused(
    store: RedisStore, shared_redis: RedisServer
) -> None:
    r = _sync(shared_redis)
    await store.append("worker", _message(0))
    r.hset(store.keys.cursor("worker"), "c", json.dumps(Cursor(0, 5, 4).to_json_dict()))
    with pytest.raises(StoreCorrupt, match="only 1"):
        await store.reader("worker").start()
    other = Cursor(0, 1, 0, tail="feedfacefeedface")
    r.hset(store.keys.cursor("worker"), "c", json.dumps(other.to_json_dict()))
    with pytest.raises(StoreCorrupt, match="another incarnation"):
        await store.reader("worker").start()


# -- tools: the view ---------------------------------------------------------------------------


async def test_the_view_scans_a_team_in_pages(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(view, "SCAN_PAGE", 4)
    await store.append_many("worker", [_message(i) for i in range(10)])
    lease = await store.acquire_lease("worker", "pid 7")
    rd = store.reader("worker")
    await rd.start()
    await rd.commit(Cursor(0, 6, 5))
    with RedisView(store.locator.url, team=store.team) as v:
        assert v.members() == ("lead", "worker", "writer")
        assert v.created_at() == store.created_at
        entries = list(v.scan("worker"))
        assert [e.at for e in entries] == [(0, i) for i in range(10)]
        assert [e.at for e in v.scan("worker", after=(0, 7))] == [(0, 7), (0, 8), (0, 9)]
        assert v.end("worker") == (0, 10) and v.end("writer") == (0, 0)
        assert v.committed("worker").offset == 6 and v.committed("writer") == Cursor()
        assert "pid 7" in (v.holder("worker") or "")
        assert v.holder("writer") is None
        sizes = v.sizes("worker")
        assert sizes["records"] == 10 and sizes["next_seq"] == 10
        with pytest.raises(UnknownRecipient):
            list(v.scan("nobody"))
    with (
        RedisView(store.locator.url, team="absent") as v,
        pytest.raises(StoreError, match="no team"),
    ):
        v.members()
    await lease.release()
    rd.close()


async def test_export_writes_a_team_directory_the_file_tools_read(
    store: RedisStore, tmp_path: Path
) -> None:
    messages = [Envelope.message("lead", "worker", i) for i in range(6)]
    await store.append_many("worker", [encode(e) for e in messages])
    await store.append("writer", _message("w", "writer"))
    lease = await store.acquire_lease("worker", "exporter test")
    rd = store.reader("worker")
    await rd.start()
    entries = await rd.fetch()
    tracker = AckTracker(Cursor())
    for entry in entries:
        envelope = _envelope(entry.raw)
        tracker.deliver(envelope.id, entry.segment, entry.stop, envelope.seq)
    for i in (0, 1, 3):  # 2, 4 and 5 stay unhandled; 3 is acked ahead
        tracker.ack(messages[i].id)
    await rd.commit(tracker.cursor())
    await rd.quarantine(Corrupt(entries[5].at, entries[5].end, "a test's reason", b"bad"))
    await lease.release()
    rd.close()

    dest = tmp_path / store.team
    with RedisView(store.locator.url, team=store.team) as v:
        counts = export_team(v, dest)
        source = inspect_team(v)
    assert counts == {"lead": 0, "worker": 6, "writer": 1}
    # the inbox file is the stream's records, one line each
    with RedisView(store.locator.url, team=store.team) as v:
        lines = b"".join(e.raw + b"\n" for e in v.scan("worker"))
    assert (dest / "inboxes" / "worker.jsonl").read_bytes() == lines
    copy = inspect_team(dest)
    assert [(r.name, r.depth, r.lag, r.quarantined) for r in copy.inboxes] == [
        (r.name, r.depth, r.lag, r.quarantined) for r in source.inboxes
    ]
    assert copy.members == ["lead", "worker", "writer"]
    # the file store delivers exactly what the Redis team's owner had not handled
    async with Mailboxes(FileStore(dest, create=False)) as mail:
        inbox = await mail.open_inbox("worker")
        got: list[Any] = []
        with anyio.fail_after(5):
            while len(got) < 3:
                got.append((await inbox.receive()).body)
        assert got == [2, 4, 5]


def test_the_sync_view_reports_an_unreachable_server(tmp_path: Any) -> None:
    server = RedisServer(tmp_path)
    with RedisView(server.url(), connect_timeout=0.5) as v, pytest.raises(StoreUnavailable):
        v.members()
