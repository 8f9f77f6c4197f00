"""The wait-for graph of a team's members in this process: who waits on whom, and the
requests that could only time out because they close a cycle."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from teamrt.errors import Deadlock

log = logging.getLogger("teamrt.team")


class WaitsFor:
    """The members each member's requests wait on, refusing a wait that closes a cycle."""

    def __init__(self) -> None:
        self._edges: dict[str, list[str]] = {}  # member -> members its requests wait on

    @contextlib.contextmanager
    def waiting(self, member: str, on: str) -> Iterator[None]:
        """`member` waits on a request to `on`: refuse it with `Deadlock` if `on` (or whoever
        `on` waits on, and so on) is waiting on `member`."""
        cycle = self.path(on, member)
        if cycle is not None:
            chain = " -> ".join([member, *cycle])
            log.warning("deadlock refused: %s", chain)
            raise Deadlock(
                f"{chain}: {on} is busy waiting (through this chain) on {member}, so "
                f"{member}'s request to {on} could only time out; refused"
            )
        edges = self._edges.setdefault(member, [])
        edges.append(on)
        try:
            yield
        finally:
            edges.remove(on)
            if not edges:
                del self._edges[member]

    def path(self, start: str, goal: str) -> list[str] | None:
        """A chain of waits from `start` to `goal`, if there is one."""
        stack, seen = [[start]], {start}
        while stack:
            path = stack.pop()
            if path[-1] == goal:
                return path
            for nxt in self._edges.get(path[-1], ()):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append([*path, nxt])
        return None
