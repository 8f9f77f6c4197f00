"""Group commit: one slow action (an fsync, a cursor commit) covers every request made before it.

Callers take a ticket for their change, then `await wait(ticket)`. If a run of the action is in
flight that started after the change, they wait for it; otherwise they start one. A run that fails
fails every caller whose change it covered, and is not retried on their behalf: a later caller
starts a new run. Runs never overlap.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio


class GroupCommit:
    def __init__(self, action: Callable[[], Awaitable[None]]) -> None:
        self._action = action
        self.requested = 0  # tickets handed out
        self.done = 0  # every ticket <= this is covered by a successful run
        self._run: tuple[int, anyio.Event, list[BaseException]] | None = None

    def ticket(self) -> int:
        """Note a change that needs covering; returns its ticket."""
        self.requested += 1
        return self.requested

    @property
    def pending(self) -> bool:
        return self.done < self.requested

    async def wait(self, ticket: int) -> None:
        """Return once a run that started after `ticket` was taken has succeeded."""
        while self.done < ticket:
            current = self._run
            if current is not None:
                target, finished, failure = current
                await finished.wait()
                if failure and ticket <= target:
                    raise failure[0]
                continue
            target, finished, failure = self.requested, anyio.Event(), []
            self._run = (target, finished, failure)
            try:
                await self._action()
            except Exception as exc:
                failure.append(exc)
                raise
            else:
                self.done = max(self.done, target)
            finally:
                self._run = None
                finished.set()
