"""A parked reader reopens its log by name and takes it only if it is the file it left: not one
deleted and created again in its place (even when the file system handed the freed inode number
to the new file), and not one rewritten before the read position where the reader can see it (the
first and the last 256 bytes before it). Appends alone never make it refuse or re-read."""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import anyio
import pytest

from teamrt import Envelope, FileMailboxes
from teamrt.errors import ReceiveTimeout, StoreCorrupt
from teamrt.mail.filestore import identity
from teamrt.mail.filestore.descriptors import BUDGET
from teamrt.mail.filestore.reader import FileReader
from teamrt.team import Team
from tests.mail.filestore.helpers import NotReused, recreate
from tests.support.remote import TESTS

MEMBERS = ["lead", "a", "b", "c"]


@pytest.fixture(autouse=True)
def tight(monkeypatch: pytest.MonkeyPatch) -> None:
    """A budget of two descriptors: opening the other inboxes parks the oldest reader."""
    monkeypatch.setattr(BUDGET, "limit", 2)


def _reader(mail: FileMailboxes, name: str) -> FileReader:
    reader = mail.inbox(name)._reader
    assert isinstance(reader, FileReader)
    return reader


async def _park(mail: FileMailboxes, name: str = "a") -> FileReader:
    """Park `name`'s reader (opened first) once the wake-ups of what was sent so far were read."""
    reader = _reader(mail, name)
    await anyio.sleep(0.05)
    with pytest.raises(ReceiveTimeout):
        await mail.inbox(name).receive(0.01)
    for other in MEMBERS:
        if other != name:
            await mail.open_inbox(other)
    assert reader.parked, "the oldest idle reader gives its descriptors back"
    return reader


async def _read_some(mail: FileMailboxes, count: int) -> bytes:
    """Send `count` envelopes to a and receive them: the log's bytes up to the read position."""
    inbox = await mail.open_inbox("a")
    for i in range(count):
        await mail.send(Envelope.message("lead", "a", {"i": i}))
    for i in range(count):
        assert (await inbox.receive(5)).body == {"i": i}
    return (mail.path / "inboxes" / "a.jsonl").read_bytes()


async def _with_reuse(tmp_path: Path, scenario: Callable[[Path], Awaitable[None]]) -> None:
    """Run `scenario` in a new team directory until its `_recreate` got the inode number back
    (on a busy machine another process may take it first); skip where that never happens."""
    for attempt in range(5):
        try:
            await scenario(tmp_path / f"t{attempt}")
            return
        except NotReused:
            continue
    pytest.skip("this file system did not hand a freed inode number out again (5 attempts)")


def _needs_birth_time(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if not identity.birth_time(fd):
            pytest.skip("this file system records no birth time (statx stx_btime)")
    finally:
        os.close(fd)


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + (b"0" if data[at : at + 1] != b"0" else b"1") + data[at + 1 :]


def _append(log: Path, line: bytes) -> None:
    with open(log, "ab") as f:
        f.write(line)


def _overwrite(log: Path, at: int, data: bytes) -> None:
    with open(log, "r+b") as f:
        f.seek(at)
        f.write(data)


async def _assert_refused(mail: FileMailboxes, found: str) -> None:
    with pytest.raises(StoreCorrupt, match="teamrt repair") as caught:
        await mail.inbox("a").receive(2)
    assert found in str(caught.value)


# --- a log deleted and created again with the same inode number -----------------------------------


async def test_a_log_recreated_with_its_inode_number_size_and_last_bytes_is_refused(
    tmp_path: Path,
) -> None:
    """The new file holds other first bytes (another first envelope): the reader sees them."""

    async def scenario(team: Path) -> None:
        async with FileMailboxes(team, members=MEMBERS) as mail:
            data = await _read_some(mail, 6)
            assert len(data) > 2 * identity.CHECK  # the first and the last bytes are apart
            await _park(mail)
            log = mail.path / "inboxes" / "a.jsonl"
            first_id = data.index(b'"id":"') + 10
            recreate(log, _flip(data, first_id))
            _append(log, data.splitlines(keepends=True)[-1])
            await _assert_refused(mail, "created again")

    await _with_reuse(tmp_path, scenario)


async def test_a_byte_for_byte_copy_recreated_with_the_inode_number_is_refused(
    tmp_path: Path,
) -> None:
    """Same inode number, same bytes but one in the middle (outside both checked windows): only
    the birth time tells the new file from the old, where the file system records it."""

    async def scenario(team: Path) -> None:
        async with FileMailboxes(team, members=MEMBERS) as mail:
            log = mail.path / "inboxes" / "a.jsonl"
            _needs_birth_time(log)
            data = await _read_some(mail, 6)
            await _park(mail)
            recreate(log, _flip(data, len(data) // 2))
            _append(log, data.splitlines(keepends=True)[-1])
            await _assert_refused(mail, "created again")

    await _with_reuse(tmp_path, scenario)


async def test_a_reader_parked_before_reading_anything_refuses_a_recreated_log(
    tmp_path: Path,
) -> None:
    """Offset 0: nothing to compare, but a reader that had kept its file open would have seen it
    deleted; with a birth time the parked one sees it too."""

    async def scenario(team: Path) -> None:
        async with FileMailboxes(team, members=MEMBERS) as mail:
            log = mail.path / "inboxes" / "a.jsonl"
            _needs_birth_time(log)
            await mail.open_inbox("a")
            await _park(mail)
            recreate(log, b"")
            await mail.send(Envelope.message("lead", "a", {"i": 0}))
            await _assert_refused(mail, "created again")

    await _with_reuse(tmp_path, scenario)


def _no_birth_time(monkeypatch: pytest.MonkeyPatch, *, generations: bool = False) -> None:
    """A file system (or a libc, or a sandbox) that tells no birth time, nor (unless
    `generations`) inode generations."""
    monkeypatch.setattr(identity, "_statx", None)
    if not generations:
        monkeypatch.setattr(identity, "_no_generation", True)


async def test_without_a_birth_time_the_first_bytes_still_tell_a_recreated_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system (or a libc) without statx birth times nor inode generations: the fallback is
    the bytes."""
    _no_birth_time(monkeypatch)

    async def scenario(team: Path) -> None:
        async with FileMailboxes(team, members=MEMBERS) as mail:
            data = await _read_some(mail, 6)
            await _park(mail)
            log = mail.path / "inboxes" / "a.jsonl"
            recreate(log, _flip(data, data.index(b'"id":"') + 10))
            await _assert_refused(mail, "changed before the read position")

    await _with_reuse(tmp_path, scenario)


async def test_without_a_birth_time_a_reader_parked_at_the_start_reads_a_recreated_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offset 0, no birth time and no inode generation: nothing tells the files apart, and the
    documented outcome is that the new file is read from its start, each envelope once."""
    _no_birth_time(monkeypatch)

    async def scenario(team: Path) -> None:
        async with FileMailboxes(team, members=MEMBERS) as mail:
            inbox = await mail.open_inbox("a")
            await _park(mail)
            recreate(mail.path / "inboxes" / "a.jsonl", b"")
            for i in range(2):
                await mail.send(Envelope.message("lead", "a", {"i": i}))
            assert [(await inbox.receive(5)).body for _ in range(2)] == [{"i": 0}, {"i": 1}]
            with pytest.raises(ReceiveTimeout):
                await inbox.receive(0.05)

    await _with_reuse(tmp_path, scenario)


async def test_without_a_birth_time_the_generation_tells_a_recreated_log_at_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offset 0 (no bytes to compare) and no birth time: the inode generation still tells the
    new file from the old."""
    _no_birth_time(monkeypatch, generations=True)

    async def scenario(team: Path) -> None:
        async with FileMailboxes(team, members=MEMBERS) as mail:
            log = mail.path / "inboxes" / "a.jsonl"
            fd = os.open(log, os.O_RDONLY)
            try:
                if not identity.generation(fd):
                    pytest.skip("this file system keeps no inode generations")
            finally:
                os.close(fd)
            await mail.open_inbox("a")
            await _park(mail)
            recreate(log, b"")
            await mail.send(Envelope.message("lead", "a", {"i": 0}))
            await _assert_refused(mail, "created again")

    await _with_reuse(tmp_path, scenario)


# --- a log rewritten in place ---------------------------------------------------------------------


@pytest.mark.parametrize("where", ["first bytes", "bytes before the position"])
async def test_a_log_rewritten_in_place_before_the_position_is_refused(
    tmp_path: Path, where: str
) -> None:
    async with FileMailboxes(tmp_path / "t", members=MEMBERS) as mail:
        data = await _read_some(mail, 6)
        await _park(mail)
        log = mail.path / "inboxes" / "a.jsonl"
        at = 20 if where == "first bytes" else len(data) - 20
        _overwrite(log, at, b"XXXX")
        _append(log, data.splitlines(keepends=True)[-1])
        await _assert_refused(mail, "before the read position")


# --- the same file, appended to -------------------------------------------------------------------


async def test_a_reader_parked_at_every_position_reads_each_envelope_once(tmp_path: Path) -> None:
    """Parked after each envelope, from offset 0 past both checked windows: every reopen takes
    the file (appends only), and each envelope arrives once, in order."""
    async with FileMailboxes(tmp_path / "t", members=MEMBERS) as mail:
        inbox = await mail.open_inbox("a")
        reader = _reader(mail, "a")
        got = []
        for i in range(12):
            assert reader.release_descriptors()  # what the budget asks of the oldest idle one
            assert reader.parked
            await mail.send(Envelope.message("lead", "a", {"i": i}))
            envelope = await inbox.receive(5)
            await inbox.ack(envelope)
            got.append(envelope.body)
            assert not reader.parked
        assert got == [{"i": i} for i in range(12)]
        assert reader.decoder.offset > 2 * identity.CHECK
        with pytest.raises(ReceiveTimeout):
            await inbox.receive(0.05)


# --- the birth time -------------------------------------------------------------------------------


def test_the_birth_time_is_the_files_and_unknown_where_none_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    _needs_birth_time(path)
    fd = os.open(path, os.O_RDONLY)
    again = os.open(path, os.O_RDONLY)
    try:
        assert identity.birth_time(fd) == identity.birth_time(again) > 0
    finally:
        os.close(fd)
        os.close(again)
    read_end, write_end = os.pipe()  # a pipe has no birth time
    try:
        assert identity.birth_time(read_end) == 0
    finally:
        os.close(read_end)
        os.close(write_end)


def test_identify_agrees_with_fstat(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 1234)
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        assert identity.identify(fd)[:3] == (st.st_dev, st.st_ino, 1234)
    finally:
        os.close(fd)


def test_a_kernel_that_refuses_statx_leaves_fstat_and_no_birth_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSYS (an old kernel) or EPERM (a sandbox's filter) once: fstat from then on."""
    calls = []

    def refused(*args: object) -> int:
        calls.append(args)
        ctypes.set_errno(errno.ENOSYS)
        return -1

    monkeypatch.setattr(identity, "_statx", refused)
    path = tmp_path / "f"
    path.write_bytes(b"xy")
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        assert identity.identify(fd)[:4] == (st.st_dev, st.st_ino, 2, 0)
        assert identity.identify(fd)[:4] == (st.st_dev, st.st_ino, 2, 0)
    finally:
        os.close(fd)
    assert len(calls) == 1


def test_a_file_created_again_with_its_inode_number_within_one_tick_has_another_identity(
    tmp_path: Path,
) -> None:
    """Birth times come from the kernel's coarse clock (4 ms a tick at HZ=250; kernels since
    6.13 hand out a finer time only after someone asked for a file's ctime), so a file deleted
    and created again at once usually gets the freed inode number and the old birth time: the
    identity must still tell them apart (the inode generation does, where it is kept)."""
    path = tmp_path / "f"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    if not identity.birth_time(fd):
        pytest.skip("this file system records no birth time (statx stx_btime)")
    same_tick = 0
    for _ in range(200):
        old = identity.identify(fd)
        os.close(fd)
        path.unlink()
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        new = identity.identify(fd)
        if new[1:4] == old[1:4]:  # inode number, size and birth time: the hard case
            same_tick += 1
            assert new != old
    os.close(fd)
    if not same_tick:
        pytest.skip("no file came back with its inode number and birth time (200 attempts)")


# --- overlayfs: a file copied up keeps its inode number, not its birth time -----------------------


@pytest.fixture
def overlay(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(lower, merged): an overlayfs over `lower` (as a container's image layer is), mounted for
    the test; skipped where this process may not mount one."""
    lower, upper, work, merged = (tmp_path / name for name in ("lower", "upper", "work", "merged"))
    for path in (lower, upper, work, merged):
        path.mkdir()
    options = f"lowerdir={lower},upperdir={upper},workdir={work}"
    mounting = ["mount", "-t", "overlay", "overlay", "-o", options, str(merged)]
    try:
        done = subprocess.run(mounting, capture_output=True, check=False, timeout=30)
    except FileNotFoundError:
        pytest.skip("no mount command")
    if done.returncode != 0:
        pytest.skip(f"cannot mount an overlayfs here: {done.stderr.decode().strip()}")
    try:
        yield lower, merged
    finally:
        subprocess.run(["umount", str(merged)], check=True, timeout=30)


async def test_a_log_copied_up_by_overlayfs_while_its_reader_is_parked_is_read_on(
    overlay: tuple[Path, Path],
) -> None:
    """A team in an image's lower layer: the first append copies the log up into a new file
    with a new birth time and the same inode number and bytes; that is the reader's file."""
    lower, merged = overlay
    async with FileMailboxes(lower / "t", members=MEMBERS) as mail:
        for i in range(6):
            await mail.send(Envelope.message("lead", "a", {"i": i}))
    async with FileMailboxes(merged / "t") as mail:
        inbox = await mail.open_inbox("a")
        for i in range(6):
            assert (await inbox.receive(5)).body == {"i": i}
        await _park(mail)
        for parked in range(2):  # copied up while parked, then parked on the upper file
            assert _reader(mail, "a").release_descriptors()
            await mail.send(Envelope.message("lead", "a", {"after": parked}))
            assert (await inbox.receive(5)).body == {"after": parked}


# --- a real teammate process under a budget of one ------------------------------------------------


def _run_agent(team: Path, agents: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "teamrt", "run-agent", str(team), "--name", "w",
               "--spec", "remote_specs:echo", "--agent-dir", str(agents)]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)


def _stderr(process: subprocess.Popen[bytes]) -> str:
    return process.stderr.read().decode() if process.stderr else ""


async def test_a_teammate_process_under_a_budget_of_one_serves_asks_amid_other_senders(
    tmp_path: Path,
) -> None:
    """`teamrt run-agent` with `TEAMRT_FD_BUDGET=1` parks its reader at every turn while
    `teamrt send` processes write its inbox: no reopen is refused, every ask is answered."""
    team = tmp_path / "t"
    async with FileMailboxes(team, members=["lead", "w", "x"]):
        pass
    env = {**os.environ, "TEAMRT_FD_BUDGET": "1",
           "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    agent = _run_agent(team, tmp_path / "agents", env)
    try:
        async with FileMailboxes(team) as mail:
            with anyio.fail_after(40):
                while await mail.store.member_alive("w") is not True:
                    assert agent.poll() is None, (
                        agent.stderr.read().decode() if agent.stderr else ""
                    )
                    await anyio.sleep(0.05)
            async with Team(mail, [], remote=["w"]) as crew:
                for i in range(4):
                    sent = await anyio.run_process(
                        [sys.executable, "-m", "teamrt", "send", str(team), "--from", "x",
                         "--to", "w", "--text", f"noise {i}"], env=env, check=False,
                    )  # fmt: skip
                    assert sent.returncode == 0, sent.stderr.decode()
                    assert (await crew.ask("w", f"ask {i}", timeout=30)).answer == "echo"
        code = await anyio.to_thread.run_sync(lambda: agent.wait(timeout=40))
        assert code == 0, _stderr(agent)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        if agent.stderr is not None:
            agent.stderr.close()
