"""Tasks waiting for an inbox to change: woken all at once, each with its own deadline.

Store-agnostic: no file or lock is touched in this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import time


def _wake_waiter(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Waitable:
    """Tasks parked until `wake()` or their deadline, for `Inbox` (which is one): one future
    per waiting task, and one timer for all of them, at the earliest deadline."""

    def __init__(self) -> None:
        # one future per waiting task (what an asyncio.Event keeps, without anyio's wrapper
        # around every wait); wake() completes them all
        self._waiters: list[asyncio.Future[None]] = []
        # the waiters with a deadline, and one timer for all of them at the earliest: most
        # waits end in a wake-up well before their deadline, and one timer re-armed only
        # when an earlier deadline comes is not made and cancelled on every wait
        self._deadlines: dict[asyncio.Future[None], float] = {}
        # their deadlines, earliest first, with entries of waiters gone since (dropped when
        # they come first, or all at once when they are most of it)
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._heap_order = itertools.count()  # ties: never compare two futures
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._timer_loop: asyncio.AbstractEventLoop | None = None
        # signalled since the last read (by a notification, a send from this process, a rescan,
        # a release): with a reader that caught up, receive() reads only if this is set
        self._poked = False

    def wake(self) -> None:
        """Wake every task waiting on this inbox (each then looks at what there is): for
        whoever knows something changed, such as a send from this process or the store's
        notification."""
        self._poked = True
        waiters = self._waiters
        if waiters:
            self._waiters = []
            for waiter in waiters:
                if not waiter.done():  # a waiter cancelled, or woken by its deadline
                    waiter.set_result(None)

    @property
    def waited_on(self) -> bool:
        """True while some task waits for this inbox to change."""
        return bool(self._waiters)

    async def _park(self, deadline: float) -> bool:
        """Wait for `wake()`; False once `deadline` (monotonic) has passed."""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._waiters.append(waiter)
        if deadline == math.inf:
            try:
                await waiter
            finally:
                if self._waiters:  # not emptied by wake()
                    self._forget(waiter)
            return True
        if deadline <= time.monotonic():
            self._forget(waiter)
            return False
        # the one timer wakes this waiter at its deadline (no cancel scope per wait: most
        # waits end in a wake-up); the waiter tells a wake-up in time from it by the clock
        deadlines, heap = self._deadlines, self._heap
        deadlines[waiter] = deadline
        if len(heap) > 2 * len(deadlines) + 16:  # mostly waiters gone: keep those still here
            heap[:] = [entry for entry in heap if entry[2] in deadlines]
            heapq.heapify(heap)
        heapq.heappush(heap, (deadline, next(self._heap_order), waiter))
        if deadline < self._timer_at or self._timer_loop is not loop:
            self._arm(loop, deadline)
        try:
            await waiter
        finally:
            del deadlines[waiter]
            if self._waiters:  # not emptied by wake()
                self._forget(waiter)
        return time.monotonic() < deadline

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        """Set the timer to go off at `at` (monotonic)."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at, self._timer_loop = at, loop
        self._timer = loop.call_later(at - time.monotonic(), self._expire)

    def _expire(self) -> None:
        """The timer went off: wake the waiters whose deadline passed; set it for the next."""
        self._timer, self._timer_at = None, math.inf
        heap, deadlines, now = self._heap, self._deadlines, time.monotonic()
        while heap:
            deadline, _, waiter = heap[0]
            if waiter in deadlines and deadline > now:
                break
            heapq.heappop(heap)
            if waiter in deadlines:  # (one gone has no deadline to keep)
                _wake_waiter(waiter)
        if heap and self._timer_loop is not None:
            self._arm(self._timer_loop, heap[0][0])

    def _forget(self, waiter: asyncio.Future[None]) -> None:
        """Drop `waiter` if `wake` did not (its deadline passed, or its task was cancelled)."""
        if self._waiters:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    def _stop_timer(self) -> None:
        """Cancel the timer (it would keep its owner alive until it goes off) and forget the
        deadlines it was for; the waiters themselves are woken by `wake()`."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, math.inf
        self._heap.clear()
