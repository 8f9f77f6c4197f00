"""The team directory's layout: the one module that says where a team's files are.

    <team>/                         TeamDir
    ├── team.json                   the roster (its presence is what makes a directory a team)
    ├── inboxes/                    the members' inboxes: the file store's own format
    │                               (teamrt.mail.filestore.paths)
    ├── agents/                     AgentDir (`Team(agent_dir=...)` may put it anywhere)
    │   ├── <name>.state.jsonl      an agent's journal (teamrt.agents.journal)
    │   ├── <name>.state.prev.jsonl the journal of its task before the current one
    │   └── <name>.transcript.jsonl its model calls (teamrt.rerun replays them)
    ├── conductor/state.json        a conductor's decisions and outcome (replay shows them)
    ├── scratch/                    files a demo's teammates write
    └── .demo.lock                  held by a demo while it runs in the directory

A demo's directory is either a team directory itself or holds one in `team/`; either way its
scratch files and lock are where this layout puts them in the directory the demo claimed.
Nothing here creates or reads files: callers do, with the paths this module gives them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "AGENTS",
    "CONDUCTOR_STATE",
    "DEMO_LOCK",
    "JOURNAL",
    "PREVIOUS_JOURNAL",
    "ROSTER",
    "SCRATCH",
    "TRANSCRIPT",
    "AgentDir",
    "TeamDir",
    "previous_journal",
]

ROSTER = "team.json"
AGENTS = "agents"
SCRATCH = "scratch"
CONDUCTOR_STATE = "conductor/state.json"
DEMO_LOCK = ".demo.lock"
JOURNAL = ".state.jsonl"  # suffixes of an agent's files, after its name
PREVIOUS_JOURNAL = ".state.prev.jsonl"
TRANSCRIPT = ".transcript.jsonl"


def previous_journal(journal: Path) -> Path:
    """Where the journal of the task before the current one is kept, beside `journal` (any
    journal path an agent was given, not only one in an agents/ directory)."""
    return journal.with_name(journal.name.removesuffix(".jsonl") + ".prev.jsonl")


@dataclass(frozen=True, slots=True)
class AgentDir:
    """The directory of a team's agents' journals and transcripts."""

    path: Path

    def journal(self, name: str) -> Path:
        """Agent `name`'s journal (`<name>.state.jsonl`)."""
        return self.path / f"{name}{JOURNAL}"

    def transcript(self, name: str) -> Path:
        """Agent `name`'s transcript of model calls (`<name>.transcript.jsonl`)."""
        return self.path / f"{name}{TRANSCRIPT}"

    def transcribed(self) -> list[str]:
        """The agents that have a transcript here, sorted by name."""
        return sorted(p.name.removesuffix(TRANSCRIPT) for p in self.path.glob(f"*{TRANSCRIPT}"))


@dataclass(frozen=True, slots=True)
class TeamDir:
    """A team directory (see the module docstring for what is where)."""

    path: Path

    @classmethod
    def at(cls, path: str | os.PathLike[str]) -> TeamDir:
        """The team directory at `path` (which need not exist, or hold a team yet)."""
        return cls(Path(path))

    @property
    def roster(self) -> Path:
        """`team.json`: the members, and what the team was created with."""
        return self.path / ROSTER

    @property
    def agents(self) -> AgentDir:
        """The agents' journals and transcripts, when the team keeps them here."""
        return AgentDir(self.path / AGENTS)

    @property
    def scratch(self) -> Path:
        """Where a demo's teammates write their files."""
        return self.path / SCRATCH

    @property
    def conductor_state(self) -> Path:
        """Where a conductor working in this directory keeps its decisions and outcome."""
        return self.path / CONDUCTOR_STATE

    @property
    def demo_lock(self) -> Path:
        """The file a demo running in this directory holds locked."""
        return self.path / DEMO_LOCK

    def holds_team(self) -> bool:
        """Whether a team was created here (its roster is a file)."""
        return self.roster.is_file()
