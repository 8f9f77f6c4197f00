"""The background work of one `Mailboxes`: notifications, cursor commits, heartbeats, rescans.

Each runs as a task of the mailboxes' task group while they are open: the store's watcher,
which wakes the inboxes written to; the committer, which commits the cursors of inboxes whose
acks were made with `ack_nowait` (or whose routed answers were acked), several acks to one
commit; the heartbeat, which renews this process's leases; and the safety rescan behind lost
notifications.

Store-agnostic: no file or lock is touched in this module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup

from teamrt.errors import StoreError
from teamrt.mail.inbox import Inbox
from teamrt.mail.store import HEARTBEAT_INTERVAL, Store

_POLL_INTERVAL = 0.05  # where the platform has no file notifications


class Upkeep:
    """The background tasks of one `Mailboxes` over `store` and its open `inboxes` (the same
    dict, kept up to date by the mailboxes)."""

    def __init__(
        self,
        store: Store,
        inboxes: dict[str, Inbox],
        *,
        rescan_interval: float,
        commit_delay: float,
    ) -> None:
        self._store = store
        self._inboxes = inboxes
        self._rescan_interval = rescan_interval
        self._commit_delay = commit_delay
        self._to_commit: set[Inbox] = set()
        self._commit_wanted = anyio.Event()
        self._commit_asked = False  # _commit_wanted is set (a plain flag: read on every ack)

    async def start(
        self,
        task_group: TaskGroup,
        wake: Callable[[str], None],
        *,
        rescan_each_up_to: int,
        rescan_sweep: int,
    ) -> None:
        """Start the tasks in `task_group`; return once the store's watcher runs. `wake`:
        wakes whoever waits on the inbox of the member named (it was written to)."""

        async def watch(*, task_status: Any) -> None:
            await self._store.watch(wake, task_status=task_status)

        await task_group.start(watch)
        task_group.start_soon(self._rescan, rescan_each_up_to, rescan_sweep)
        task_group.start_soon(self._committer)
        task_group.start_soon(self._heartbeat)

    def commit_soon(self, inbox: Inbox) -> None:
        """Have `inbox`'s cursor committed by the committer, soon."""
        self._to_commit.add(inbox)
        if not self._commit_asked:  # wake the committer once per batch, not per ack
            self._commit_asked = True
            self._commit_wanted.set()

    async def _committer(self) -> None:
        """Commits cursors for ack_nowait() and routed responses, off the caller's path.

        A failed background commit is not lost: the acks stay pending and the next ack() or
        flush() on that inbox retries the commit and raises if it fails again.
        """
        while True:
            await self._commit_wanted.wait()
            await anyio.sleep(self._commit_delay)  # let a burst of acks share one commit
            inboxes, self._to_commit = self._to_commit, set()
            self._commit_wanted, self._commit_asked = anyio.Event(), False
            for inbox in inboxes:
                with contextlib.suppress(StoreError):
                    await inbox.flush()

    async def _heartbeat(self) -> None:
        """Renew the leases this process holds, keeping them visibly alive to other processes
        (a lease found taken over is marked lost by the store)."""
        while True:
            with contextlib.suppress(StoreError):
                await self._store.renew_leases()
            await anyio.sleep(HEARTBEAT_INTERVAL)

    async def _rescan(self, each_up_to: int, sweep: int) -> None:
        """The safety net behind the store's notifications: every interval, each inbox someone
        waits on and that has something new is signalled, so a lost notification delays a
        receiver by one interval at most.

        Its cost does not grow with the number of inboxes: up to `each_up_to` inboxes are
        each checked every interval; beyond that, only those the store reports as possibly
        written (`Store.changed_inboxes`, one check for all of them), plus `sweep` more in
        turn; and all of them whenever the store cannot tell."""
        store = self._store
        interval = _POLL_INTERVAL if store.needs_polling else self._rescan_interval
        tracking = False
        order: list[str] = []  # the inboxes to sweep in turn
        at = 0
        while True:
            await anyio.sleep(interval)
            inboxes = self._inboxes
            changed = None
            if tracking or len(inboxes) > each_up_to:
                tracking = True  # once asked, the store tracks changes until it closes
                changed = store.changed_inboxes()
            if changed is None or len(inboxes) <= each_up_to:
                await self._rescan_some(list(inboxes.values()))
                continue
            if at >= len(order):
                order, at = list(inboxes), 0
            names = changed.union(order[at : at + sweep])
            at += sweep
            await self._rescan_some([inboxes[n] for n in names if n in inboxes])

    async def _rescan_some(self, inboxes: list[Inbox]) -> None:
        fetch = self._store.capabilities.network  # what its watcher may have missed
        for inbox in inboxes:
            if not inbox.waited_on:
                continue  # nobody waits on it: whoever reads next reads what is there
            with contextlib.suppress(StoreError):
                await inbox.rescan(fetch=fetch)
