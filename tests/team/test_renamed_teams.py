"""A team directory's name is its team (every envelope carries it): a directory renamed under
its team must not make its unread mail quarantined as `wrong team` without a word."""

from __future__ import annotations

from pathlib import Path

import pytest

from teamrt import Envelope, FileMailboxes
from teamrt.errors import UsageError


async def test_a_renamed_team_directory_is_refused_rather_than_its_mail_quarantined(
    tmp_path: Path,
) -> None:
    async with FileMailboxes(tmp_path / "t", members=["lead", "w"]) as mail:
        await mail.send(Envelope.message("lead", "w", "before the move"))
    (tmp_path / "t").rename(tmp_path / "u")
    with pytest.raises(UsageError, match=r"holds team 't'.*teamrt export"):
        async with FileMailboxes(tmp_path / "u") as mail:
            await mail.inbox("w").receive(timeout=1)


async def test_a_renamed_team_moved_back_delivers_its_mail(tmp_path: Path) -> None:
    async with FileMailboxes(tmp_path / "t", members=["lead", "w"]) as mail:
        await mail.send(Envelope.message("lead", "w", "before the move"))
    (tmp_path / "t").rename(tmp_path / "u")
    with pytest.raises(UsageError):
        async with FileMailboxes(tmp_path / "u"):
            pass
    (tmp_path / "u").rename(tmp_path / "t")
    async with FileMailboxes(tmp_path / "t") as mail:
        got = await mail.inbox("w").receive(timeout=5)
    assert got.body == "before the move"
