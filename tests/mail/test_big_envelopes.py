"""Envelopes larger than one read: a complete envelope in the file is received at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from teamrt import Envelope, FileMailboxes


@pytest.mark.parametrize("size", [300 << 10, (1 << 20) - 4096])
async def test_receive_nowait_gets_an_envelope_larger_than_a_read(
    tmp_path: Path, size: int
) -> None:
    async with FileMailboxes(tmp_path / "t", members=["a", "b"], max_envelope=1 << 20) as mail:
        big = Envelope.message("a", "b", "x" * size)
        await mail.send(big)
        await mail.send(Envelope.message("a", "b", "after"))
        inbox = mail.inbox("b")
        got = inbox.receive_nowait()  # no wait: both are complete in the file
        assert got.id == big.id and len(got.body) == size
        assert inbox.receive_nowait().body == "after"
