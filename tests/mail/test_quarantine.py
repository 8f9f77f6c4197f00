"""What an inbox will not deliver (`Quarantine`): why a decoded envelope is misfiled, and
that what was skipped is recorded once, in order, before the commit that passes it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from teamrt.mail.log import Corrupt
from teamrt.mail.quarantine import Quarantine


class _Fields:
    """The two fields `misfiled` reads."""

    def __init__(self, team: str, recipient: str) -> None:
        self.team, self.recipient = team, recipient


@pytest.mark.parametrize(
    ("team", "recipient", "reason"),
    [
        ("other", "worker", "wrong team: 'other' in the inbox of worker of 'team'"),
        ("team", "lead", "wrong recipient: 'lead' in the inbox of worker"),
        ("team", "worker", "bad signature"),
        ("team", "*", "bad signature"),
    ],
)
def test_why_a_decoded_envelope_is_misfiled(team: str, recipient: str, reason: str) -> None:
    fields: Any = _Fields(team, recipient)
    assert Quarantine("worker", "team").misfiled(fields) == reason


class _Reader:
    def __init__(self, fail_at: int | None = None) -> None:
        self.recorded: list[Corrupt] = []
        self._fail_at = fail_at

    async def quarantine(self, item: Corrupt) -> None:
        if len(self.recorded) == self._fail_at:
            self._fail_at = None
            raise OSError("store down")
        self.recorded.append(item)


async def _direct(call: Callable[[], Awaitable[None]], what: str) -> None:
    await call()


def _items(n: int) -> list[Corrupt]:
    return [Corrupt(i, i + 1, "bad", b"x") for i in range(n)]  # type: ignore[arg-type]


async def test_what_was_skipped_is_recorded_once_in_order() -> None:
    quarantine, reader = Quarantine("worker", "team"), _Reader(fail_at=1)
    items = _items(3)
    for item in items:
        quarantine.add(item)
    with pytest.raises(OSError, match="store down"):
        await quarantine.record(reader, _direct)  # type: ignore[arg-type]
    await quarantine.record(reader, _direct)  # type: ignore[arg-type]
    await quarantine.record(reader, _direct)  # type: ignore[arg-type]
    assert reader.recorded == items
    assert quarantine.count == 3


async def test_cleared_items_are_not_recorded() -> None:
    quarantine, reader = Quarantine("worker", "team"), _Reader()
    for item in _items(2):
        quarantine.add(item)
    quarantine.clear()
    await quarantine.record(reader, _direct)  # type: ignore[arg-type]
    assert reader.recorded == []
    assert quarantine.count == 2  # counted since open, recorded or not
