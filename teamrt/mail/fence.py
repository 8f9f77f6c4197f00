"""One inbox's lease on its member, and the read fence it gives (see inbox.py).

An inbox takes its member's lease when it opens, unless this process holds it already (a
Team of the same mailboxes), and takes it back if that holder lets it go. Before it hands
anything out, it asks `InboxLease.known_held` (a clock comparison) and, when that cannot say,
`InboxLease.confirm` (the store).

Store-agnostic: no file or lock is touched in this module.
"""

from __future__ import annotations

import logging
import os
import time

import anyio

from teamrt.errors import LeaseLost, OutcomeUnknown, ReceiveTimeout, StoreUnavailable
from teamrt.mail.store import Lease, Store

log = logging.getLogger("teamrt.mail")


class InboxLease:
    """The lease of member `name`'s inbox as this process's inbox of it sees it."""

    __slots__ = ("_name", "_store", "lease")

    def __init__(self, store: Store, name: str) -> None:
        self._store = store
        self._name = name
        #: as this inbox took it; None while it shares the one its store holds for another
        #: holder in this process (a Team), and once released
        self.lease: Lease | None = None

    def _holder(self) -> str:
        return f"pid {os.getpid()}, inbox of {self._name}"

    async def take(self) -> None:
        """Take the member's lease, unless this process holds it already."""
        if not self._store.lease_held(self._name):
            self.lease = await self._store.acquire_lease(self._name, self._holder())

    async def take_back(self) -> None:
        """Take the member's lease back from the holder in this process that let it go."""
        self.lease = await self._store.acquire_lease(self._name, self._holder())
        log.info("%s's inbox took its lease back from a holder that let it go", self._name)

    async def release(self) -> None:
        """Release the lease if this inbox took it."""
        if self.lease is not None:
            lease, self.lease = self.lease, None
            await lease.release()

    def held(self) -> bool:
        """True if the inbox may read: it holds the lease, or shares its store's; False if
        the holder it shared it with let it go (`take_back`). `LeaseLost` if it expired."""
        lease = self.lease
        if lease is None:
            return self._store.lease_held(self._name)
        if lease.record.expired:
            raise LeaseLost(
                f"{self._name}'s lease expired and another holder took it over; this "
                "process no longer owns the inbox"
            )
        return True

    def known_held(self) -> bool:
        """The read fence without asking the store: True if the lease is known held now, or
        there is none to check (the lease logic takes one first)."""
        lease = self.lease
        record = lease.record if lease is not None else self._store.lease_record(self._name)
        return record is None or record.known_held()

    async def confirm(self, deadline: float) -> bool:
        """The read fence's plain path (for when `known_held` cannot say): ask the store
        whether the lease is still held, True if it is, `LeaseLost` if not, False if there is
        no lease to check any more. A store that cannot be reached is waited out with nothing
        handed out meanwhile (`ReceiveTimeout` at `deadline`). What the caller hands out
        right after (with no await between) is handed out under the lease just checked."""
        pause = 0.05
        while True:
            lease = self.lease
            record = lease.record if lease is not None else self._store.lease_record(self._name)
            if record is None:
                return False
            try:
                await self._store.confirm_lease(record)
                return True
            except (StoreUnavailable, OutcomeUnknown) as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ReceiveTimeout(
                        f"{self._name}'s lease could not be checked with the store in time "
                        f"({exc}); nothing was handed out"
                    ) from None
                await anyio.sleep(min(pause, left))
                pause = min(pause * 2, 1.0)
