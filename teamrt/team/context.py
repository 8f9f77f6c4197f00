"""What a teammate's incarnation takes from its team (`TeamContext`), so that the runner and
what it builds never hold the `Team` itself."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from teamrt.envelopes import Request
from teamrt.mail.mailboxes import Mailboxes
from teamrt.team.config import TeamBudget
from teamrt.teamdir import AgentDir


@dataclass(frozen=True, slots=True)
class TeamContext:
    """What a runner takes from its team: the team's settings, and the team's own services a
    teammate's tools and desk use (pool routing, the wait-for graph, shutdown deadlines)."""

    mail: Mailboxes
    lead: str  # the member idle and crash notices and plans for approval go to
    agents: AgentDir | None  # where journals and transcripts are kept (None: not kept)
    prices: dict[str, tuple[float, float]]  # every member's; a teammate's own win
    budget: TeamBudget | None
    started: float  # when the team started (wall clock): older shutdowns are not for it
    shutdown_deadline: Callable[[], float]  # the team's, read when used: it may be changed
    pick: Callable[[str], str]  # a pool's role to its least busy replica
    waiting: Callable[[str, str], AbstractContextManager[None]]  # see `Team.waiting`
    enforce_deadline: Callable[[str, Request], None]  # see `Team.enforce_deadline`
