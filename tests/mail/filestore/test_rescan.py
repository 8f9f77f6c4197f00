"""The safety rescan behind file notifications: a lost notification still wakes a waiting
receiver within the rescan interval, and among many inboxes the rescan checks only those the
store saw written (plus a few in turn), not every one every interval."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from teamrt import Envelope, FileMailboxes, ReceiveTimeout
from teamrt.mail import mailboxes as mailboxes_module
from teamrt.mail.filestore.reader import FileReader
from teamrt.mail.filestore.store import FileStore

NAMES = [f"m{i:02d}" for i in range(12)]


@pytest.fixture
def few(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lower the point at which the rescan stops checking every inbox, and sweep none in turn:
    only the store's change tracking can find a write."""
    monkeypatch.setattr(mailboxes_module, "RESCAN_EACH_UP_TO", 4)
    monkeypatch.setattr(mailboxes_module, "RESCAN_SWEEP", 0)


def _store(mail: FileMailboxes) -> FileStore:
    assert isinstance(mail.store, FileStore)
    return mail.store


async def _until(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(20):
        while not condition():  # noqa: ASYNC110 -- polls state that no event announces
            await anyio.sleep(0.01)


def _lose_notifications(mail: FileMailboxes, name: str) -> None:
    """Drop this process's file notifications for `name`'s inbox, as if they were lost."""
    store = _store(mail)
    assert store.watcher.inotify is not None
    store.watcher.inotify.rm_watch(store.watcher.watched[name])


async def _receive_after_a_foreign_send(
    mail: FileMailboxes, team: Path, name: str, timeout: float
) -> Envelope | None:
    """Block in receive() on `name`, then send to it from another mailboxes object (whose own
    wake-up does not reach this one's inbox, as for another process). None: nothing came."""
    got: list[Envelope | None] = []

    async def receive() -> None:
        try:
            got.append(await mail.inbox(name).receive(timeout=timeout))
        except ReceiveTimeout:
            got.append(None)

    async with anyio.create_task_group() as tg:
        tg.start_soon(receive)
        await anyio.sleep(0.05)  # let it block
        async with FileMailboxes(team) as other:
            await other.send(Envelope.message("m00", name, "are you there?"))
    return got[0]


async def test_a_lost_notification_is_noticed_among_many_inboxes(tmp_path: Path, few: None) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=NAMES, rescan_interval=0.05) as mail:
        for name in NAMES:
            mail.inbox(name)
        await _until(lambda: _store(mail).watcher.changes is not None)  # the tracking is armed
        _lose_notifications(mail, "m07")
        envelope = await _receive_after_a_foreign_send(mail, team, "m07", timeout=20)
        assert envelope is not None and envelope.body == "are you there?"


async def test_without_the_rescan_the_lost_notification_would_leave_the_receiver_waiting(
    tmp_path: Path, few: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control for the test above: the notification is really lost, and the change
    tracking is what finds the write."""
    monkeypatch.setattr(FileStore, "changed_inboxes", lambda self: set())
    team = tmp_path / "t"
    async with FileMailboxes(team, members=NAMES, rescan_interval=0.05) as mail:
        for name in NAMES:
            mail.inbox(name)
        _lose_notifications(mail, "m07")
        assert await _receive_after_a_foreign_send(mail, team, "m07", timeout=1) is None


async def test_a_lost_notification_after_a_rotation_is_noticed(tmp_path: Path, few: None) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=NAMES, rescan_interval=0.05, segment_bytes=1000) as mail:
        for name in NAMES:
            mail.inbox(name)
        await _until(lambda: _store(mail).watcher.changes is not None)
        async with FileMailboxes(team) as other:
            for _ in range(10):  # past the segment size: the log rotates
                await other.send(Envelope.message("m00", "m07", "x" * 200))
        inbox = mail.inbox("m07")
        for _ in range(10):
            inbox.receive_nowait()
        assert (team / "inboxes" / "m07.000000.jsonl").exists()
        await anyio.sleep(0.1)  # the rotation's notification re-watched the new file
        _lose_notifications(mail, "m07")
        envelope = await _receive_after_a_foreign_send(mail, team, "m07", timeout=20)
        assert envelope is not None and envelope.body == "are you there?"


async def test_an_idle_rescan_checks_a_bounded_number_of_inboxes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mailboxes_module, "RESCAN_EACH_UP_TO", 4)
    monkeypatch.setattr(mailboxes_module, "RESCAN_SWEEP", 2)
    checks, rescans = [0], [0]
    has_new, changed_inboxes = FileReader.has_new, FileStore.changed_inboxes

    def counted_has_new(self: FileReader) -> bool:
        checks[0] += 1
        return has_new(self)

    def counted_changed(self: FileStore) -> set[str] | None:
        rescans[0] += 1
        return changed_inboxes(self)

    monkeypatch.setattr(FileReader, "has_new", counted_has_new)
    monkeypatch.setattr(FileStore, "changed_inboxes", counted_changed)
    names = [f"m{i:02d}" for i in range(40)]
    team = tmp_path / "t"
    async with (
        FileMailboxes(team, members=names, rescan_interval=0.02) as mail,
        anyio.create_task_group() as tg,
    ):
        for name in names:
            tg.start_soon(mail.inbox(name).receive)  # 40 idle receivers
        await _until(lambda: rescans[0] >= 3)  # armed, and past the first full check
        first = rescans[0], checks[0]
        await _until(lambda: rescans[0] >= first[0] + 20)
        last = rescans[0], checks[0]
        tg.cancel_scope.cancel()
    # at most RESCAN_SWEEP inboxes per rescan (one more rescan may have started in between);
    # checking each of them would have been 40 per rescan
    assert last[1] - first[1] <= (last[0] - first[0] + 1) * 2


async def test_the_store_reports_writes_to_the_inboxes_this_process_reads(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=["a", "b", "c"]) as mail:
        store = _store(mail)
        mail.inbox("a")
        mail.inbox("b")
        assert store.changed_inboxes() is None  # armed now: what came before is unknown
        assert store.changed_inboxes() == set()
        async with FileMailboxes(team) as other:
            await other.send(Envelope.message("c", "a", 1))
            await other.send(Envelope.message("a", "c", 2))  # an inbox this process does not read
        assert store.changed_inboxes() == {"a"}
        assert store.changed_inboxes() == set()

        # events it lost itself (its queue overflowed) are reported as "cannot tell", once
        limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
        scratch = [team / "inboxes" / f"scratch{k}.tmp" for k in range(2)]
        fds = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) for p in scratch]
        try:
            for i in range(limit + 10):  # alternating files: the kernel merges no two events
                os.write(fds[i % 2], b"x")
        finally:
            for fd in fds:
                os.close(fd)
        assert store.changed_inboxes() is None
        await other_send(team, "b")
        assert store.changed_inboxes() == {"b"}


async def other_send(team: Path, recipient: str) -> None:
    async with FileMailboxes(team) as other:
        await other.send(Envelope.message("c", recipient, "hello"))
