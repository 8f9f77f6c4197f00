"""A live view of a running team: one line per teammate, redrawn in place on a terminal, or
plain log lines (one per change) when the output is not a terminal."""

from __future__ import annotations

import sys
from typing import TextIO

import anyio

from teamrt.team import MemberStatus, Team


def _line(status: MemberStatus, depth: int) -> str:
    # what the model is writing, as it writes it (Teammate(stream=True)), else the last event
    doing = " ".join(status.text.split())[-60:] if status.text else status.last[:60]
    return (
        f"{status.name:>12}  {status.state:8}  step {status.step:3}  inbox {depth:3}  "
        f"tasks {status.tasks_done:2}  {doing}"
    )


async def live_view(team: Team, *, interval: float = 0.1, out: TextIO | None = None) -> None:
    """Show the team until cancelled."""
    stream = out or sys.stdout
    tty = stream.isatty()
    shown: dict[str, str] = {}
    drawn = 0
    while True:
        lines = []
        for name, status in team.status.items():
            stats = team.mail.statistics().get(name)
            depth = stats.ready + stats.unacked if stats is not None else 0
            line = _line(status, depth)
            lines.append(line)
            key = f"{status.state}/{status.step}/{status.last}/{status.text}"
            if not tty and shown.get(name) != key:
                shown[name] = key
                stream.write(line.rstrip() + "\n")
        if tty:
            if drawn:
                stream.write(f"\x1b[{drawn}F")  # back to the first line of the block
            stream.write("".join(f"\x1b[2K{line}\n" for line in lines))
            drawn = len(lines)
        stream.flush()
        await anyio.sleep(interval)
