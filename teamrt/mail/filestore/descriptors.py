"""The process-wide budget of descriptors that readers and appenders may keep open between uses.

A process that runs many members holds, for each, a lease (an flock: it lives exactly as long as its
descriptor, so it is never given back), the log it reads, and the cursor file it commits; and for
each inbox it sends to, that inbox's lock and log. Ten thousand members would need some 30,000
descriptors. Leases stay; the rest are a cache. Readers and appenders register what they hold here,
and when the total passes the budget the ones opened longest ago give theirs back, if they are idle:
a reader parks (see `FileReader.release_descriptors`: it keeps its position and the identity of its
file, and its next read reopens the file and checks that it is the same one), an appender is dropped
(the next send opens a new one, which takes `seq` from the inbox's high-water mark as any new
writer does).
Inotify watches name inodes, not descriptors, so a parked reader is still woken.

The budget is a quarter of this process's soft `RLIMIT_NOFILE` (at least 64), or
`TEAMRT_FD_BUDGET`, and never more than what the leases this process holds leave of the limit
(less `RESERVE` for everything else: sockets, pipes, the inotify instances). Should an open still
fail for want of descriptors, the budget gives back the idle holders' descriptors and the open is
tried once more (`open_file`). Holders register and are released on the thread that runs their event
loop, never from a worker thread; a holder busy in a worker thread (a contended append, an fsync)
is skipped, and so is one that belongs to another thread's event loop.

A busy holder cannot give anything back, so the number of them is bounded too: a send that waits
in a worker thread for another process's lock, or for its fsync, and a cursor commit in `fsync`
mode hold their descriptors meanwhile, and a store lets at most a quarter of the room be in
flight that way at once (`InFlight`); the others wait for a turn, so that idle holders are always
there to give back.
"""

from __future__ import annotations

import errno
import os
import resource
import threading
from collections import OrderedDict, deque
from typing import Protocol

import anyio

MIN_BUDGET = 64
#: Descriptors left for everything that is neither a lease nor a holder's.
RESERVE = 64


class Holder(Protocol):
    def release_descriptors(self) -> bool:
        """Close what it holds if it is idle; False (holding on) if it is busy."""
        ...


def _soft_limit() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft


def _default_limit() -> int:
    configured = os.environ.get("TEAMRT_FD_BUDGET", "").strip()
    if configured:
        try:
            return max(1, int(configured))
        except ValueError:
            raise ValueError(
                f"TEAMRT_FD_BUDGET must be a number of descriptors, not {configured!r}"
            ) from None
    return max(MIN_BUDGET, _soft_limit() // 4)


class DescriptorBudget:
    """How many descriptors the registered holders keep open, oldest first; see the module."""

    def __init__(self, limit: int | None = None) -> None:
        self._limit = limit
        self._soft = 0  # the process's soft RLIMIT_NOFILE, read with the limit
        self.pinned = 0  # descriptors held for good meanwhile: leases (see `pin`)
        self.held = 0
        self.released = 0  # times a holder gave its descriptors back (a statistic)
        self._holders: OrderedDict[Holder, tuple[int, int]] = OrderedDict()  # count, thread
        self._lock = threading.Lock()  # event loops in two threads share the one budget

    @property
    def limit(self) -> int:
        """Descriptors the holders may keep open (fixed at first use: the process may lower its
        file limit after importing teamrt and before opening a team)."""
        if self._limit is None:
            self._limit = _default_limit()
        return self._limit

    @limit.setter
    def limit(self, value: int) -> None:
        self._limit = value

    def room(self) -> int:
        """What the holders may keep open now: the budget, or less where leases leave less."""
        if not self._soft:
            self._soft = _soft_limit()
        return max(1, min(self.limit, self._soft - self.pinned - RESERVE))

    def reset_lock(self) -> None:
        """A new lock, for a forked child (its copy of the old one may be held by a thread
        that does not exist there)."""
        self._lock = threading.Lock()

    def pin(self, count: int) -> None:
        """`count` more (or, negative, fewer) descriptors held that no holder can give back."""
        with self._lock:
            self.pinned += count

    def opened(self, holder: Holder, count: int) -> None:
        """`holder` now keeps `count` descriptors open (it is the newest); others give theirs
        back, oldest first, while the total is over the budget."""
        with self._lock:
            holders = self._holders
            self.held += count - holders.pop(holder, (0, 0))[0]
            holders[holder] = (count, threading.get_ident())
            room = self.room()
            if self.held > room:
                self._shrink(holder, room)

    def closed(self, holder: Holder) -> None:
        """`holder` keeps nothing open any more."""
        with self._lock:
            self.held -= self._holders.pop(holder, (0, 0))[0]

    def relieve(self) -> bool:
        """After an open failed with EMFILE: give back half of what idle holders keep open.
        True if something was given back (the open is worth trying again)."""
        with self._lock:
            before = self.held
            self._shrink(None, before // 2)
            return self.held < before

    def _shrink(self, keep: Holder | None, room: int) -> None:
        holders, thread = self._holders, threading.get_ident()
        for _ in range(len(holders)):
            if self.held <= room:
                return
            holder, entry = holders.popitem(last=False)
            if holder is keep or entry[1] != thread or not holder.release_descriptors():
                holders[holder] = entry  # the newest, another loop's, or busy: to the back
                continue
            self.held -= entry[0]
            self.released += 1


#: The one budget of this process.
BUDGET = DescriptorBudget()


def _new_lock_in_child() -> None:
    """A forked child's copy of the lock may be held by a thread that does not exist there."""
    BUDGET.reset_lock()


os.register_at_fork(after_in_child=_new_lock_in_child)


def open_file(path: str | os.PathLike[str], flags: int, mode: int = 0o777) -> int:
    """`os.open`, once more after the budget gave back what it could if the process was out
    of descriptors (on the event loop's thread only)."""
    try:
        return os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno != errno.EMFILE or not BUDGET.relieve():
            raise
    return os.open(path, flags, mode)


class InFlight:
    """Operations of one store (one event loop) that keep descriptors the budget cannot take back
    while they wait for a worker thread (a contended lock, an fsync), by what they keep open (an
    inbox's appender, a reader): at most a quarter of the budget's room of those at once, first
    come first served. Operations on what is in flight already (sends to one inbox, sharing its
    group commit) do not wait: they hold nothing more."""

    def __init__(self) -> None:
        self.users: dict[object, int] = {}  # what is in flight: how many operations use it
        self._waiting: deque[tuple[object, anyio.Event]] = deque()

    def _admits(self, key: object) -> bool:
        return key in self.users or len(self.users) < max(1, BUDGET.room() // 4)

    async def enter(self, key: object) -> None:
        users = self.users
        if key in users or (not self._waiting and self._admits(key)):
            users[key] = users.get(key, 0) + 1
            return
        entry = (key, anyio.Event())
        self._waiting.append(entry)
        try:
            await entry[1].wait()  # `leave` counted this one in when it set the event
        except BaseException:
            if entry[1].is_set():
                self.leave(key)
            else:
                self._waiting.remove(entry)
            raise

    def leave(self, key: object) -> None:
        users = self.users
        users[key] -= 1
        if not users[key]:
            del users[key]
        waiting = self._waiting
        while waiting and self._admits(waiting[0][0]):
            key, turn = waiting.popleft()
            users[key] = users.get(key, 0) + 1
            turn.set()
