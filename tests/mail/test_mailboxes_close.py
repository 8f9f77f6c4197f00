"""Closing mailboxes when the last flush fails: the error is raised, and still the background
tasks stop and the store is closed (for any store)."""

from __future__ import annotations

import pytest

from teamrt import Envelope, StoreError
from teamrt.mail import Mailboxes, MemoryStore
from teamrt.mail.log import Cursor
from teamrt.mail.memory import MemoryReader


class FailingCommits(MemoryStore):
    """A memory store whose cursor commits fail (a disk or a server gone at close)."""

    closed = False

    def reader(self, name: str) -> MemoryReader:
        reader = super().reader(name)

        async def commit(cursor: Cursor) -> None:
            raise StoreError("the store went away", errno=5)

        reader.commit = commit  # type: ignore[method-assign]
        return reader

    async def close(self) -> None:
        self.closed = True


async def _ack_then_close(mail: Mailboxes) -> None:
    async with mail:
        await mail.send(Envelope.message("a", "b", "x"))
        inbox = mail.inbox("b")
        inbox.ack_nowait(inbox.receive_nowait())  # committed in the background, or at close


async def test_a_failed_last_flush_still_closes_the_store() -> None:
    store = FailingCommits("t")
    mail = Mailboxes(store, members=["a", "b"])
    with pytest.raises(StoreError, match="went away"):
        await _ack_then_close(mail)
    assert store.closed
    assert mail._task_group is None  # the background tasks were stopped
