"""A team's members as declared: pools expanded into their replicas, names checked, and the
remote members checked against the team's roster."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from teamrt.errors import UsageError
from teamrt.team.config import Teammate


def expand(
    teammates: Iterable[Teammate], lead: str
) -> tuple[dict[str, Teammate], dict[str, tuple[str, ...]]]:
    """The members by name (a pool's replicas named `role-1`, `role-2`, ...) and each pool's
    replicas by role; `UsageError` for two members of one name, or a member named as the lead."""
    members: dict[str, Teammate] = {}
    pools: dict[str, tuple[str, ...]] = {}
    for teammate in teammates:
        replicas = [teammate]
        if teammate.replicas > 1:
            replicas = [
                dataclasses.replace(teammate, name=f"{teammate.name}-{i}", replicas=1)
                for i in range(1, teammate.replicas + 1)
            ]
            pools[teammate.name] = tuple(m.name for m in replicas)
        for member in replicas:
            if member.name in members:
                raise UsageError(f"two teammates are named {member.name!r}")
            members[member.name] = member
    if lead in members:
        raise UsageError(f"the lead {lead!r} cannot also be a teammate")
    return members, pools


def check_remote(remote: Iterable[str], roster: Iterable[str]) -> None:
    """`UsageError` unless every remote member is declared in the team's roster: a remote
    member is run elsewhere, so it must be declared first."""
    roster = list(roster)
    undeclared = [name for name in remote if name not in roster]
    if undeclared:
        raise UsageError(
            f"remote members {undeclared} are not in the team's roster "
            f"({', '.join(roster) or 'empty'}): a remote member is run elsewhere, so it "
            "must be declared first (FileMailboxes(..., members=[...]) or `teamrt run-agent "
            "--join`); check the spelling"
        )
