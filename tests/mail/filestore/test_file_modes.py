"""Files teamrt writes outside a team directory hold a team's bodies: they are readable by
their owner only (0600), whatever the umask."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from teamrt import Envelope, FileMailboxes


@pytest.fixture
def no_umask() -> Iterator[None]:
    """The most permissive umask, as a careless shell might have."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


async def _team(path: Path) -> None:
    async with FileMailboxes(path, members=["lead", "w"]) as mail:
        await mail.send(Envelope.message("lead", "w", "a secret"))


@pytest.mark.parametrize("existing", [False, True])
def test_replay_output_is_private(tmp_path: Path, no_umask: None, existing: bool) -> None:
    team = tmp_path / "team"
    anyio.run(_team, team)
    output = tmp_path / "replay.txt"
    if existing:
        output.write_text("old")
        output.chmod(0o644)
    subprocess.run(
        [sys.executable, "-m", "teamrt", "replay", str(team), "-o", str(output)],
        check=True,
        capture_output=True,
    )
    assert "a secret" in output.read_text()
    assert stat.S_IMODE(output.stat().st_mode) == 0o600
