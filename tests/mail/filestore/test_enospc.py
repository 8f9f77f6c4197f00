"""A really full disk: a 64 KiB tmpfs mounted for the test (root only)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from teamrt import DiskFull, Envelope, FileMailboxes


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mountpoint = tmp_path / "tiny"
    mountpoint.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=True)


async def test_full_disk_is_a_clear_error_and_loses_nothing(tiny_disk: Path) -> None:
    team = tiny_disk / "t"
    filler = tiny_disk / "filler"
    filler.write_bytes(b"f" * 16384)
    acked = []
    async with FileMailboxes(team, members=("lead", "worker")) as mail:
        failure: DiskFull | None = None
        for i in range(10_000):
            envelope = Envelope.message("lead", "worker", {"i": i, "pad": "x" * 900})
            try:
                await mail.send(envelope)
            except DiskFull as exc:
                failure = exc
                break
            acked.append(envelope.id)
        assert "No space left on device; nothing was written" in str(failure)
        assert len(acked) > 10
        log = (team / "inboxes" / "worker.jsonl").read_bytes()
        assert log.endswith(b"\n")  # rolled back to a line boundary

        inbox = mail.inbox("worker")
        got = []
        while True:
            try:
                got.append(inbox.receive_nowait())
            except anyio.WouldBlock:
                break
        assert [e.id for e in got] == acked  # everything acknowledged, nothing partial
        assert inbox.statistics().quarantined == 0

        # once space is freed, sending works again and seq continues without a gap
        filler.unlink()
        await mail.send(Envelope.message("lead", "worker", "room again"))
        after = await inbox.receive(timeout=5)
        assert (after.body, after.seq) == ("room again", len(acked))
