"""A live view of a running team: a table redrawn in place on a terminal (with `rich`), or plain
log lines (one per change) when the output is not a terminal. Either way the last frame is drawn
when the view stops, so what it shows at the end matches the team's reports."""

from __future__ import annotations

import sys
from typing import TextIO

import anyio
from rich.console import Console
from rich.live import Live
from rich.table import Table

from teamrt.team import MemberStatus, Team

_STATE_STYLE = {
    "idle": "green",
    "working": "yellow",
    "restarting": "magenta",
    "crashed": "bold red",
    "stopped": "dim",
}


def _depth(team: Team, name: str) -> int:
    stats = team.mail.statistics().get(name)
    return stats.ready + stats.unacked if stats is not None else 0


def _doing(status: MemberStatus) -> str:
    """What the model is writing (with `Teammate(stream=True)`), else the last event."""
    return " ".join(status.text.split())[-60:] if status.text else status.last[:60]


def _line(status: MemberStatus, depth: int) -> str:
    return (
        f"{status.name:>12}  {status.state:8}  step {status.step:3}  inbox {depth:3}  "
        f"tasks {status.tasks_done:2}  tokens {status.tokens:6}  {_doing(status)}"
    )


def _table(team: Team) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("member", "state", "step", "inbox", "tasks", "tokens", "doing"):
        table.add_column(
            column, justify="right" if column in ("step", "inbox", "tasks") else "left"
        )
    for name, status in team.status.items():
        table.add_row(
            name,
            f"[{_STATE_STYLE.get(status.state, '')}]{status.state}[/]",
            str(status.step),
            str(_depth(team, name)),
            str(status.tasks_done),
            f"{status.tokens:,}" + (f" ${status.cost:.4f}" if status.cost else ""),
            _doing(status),
        )
    return table


async def live_view(team: Team, *, interval: float = 0.1, out: TextIO | None = None) -> None:
    """Show the team until cancelled, then draw the last frame."""
    stream = out or sys.stdout
    if not stream.isatty():
        await _plain(team, interval, stream)
        return
    console = Console(file=stream)
    with Live(_table(team), console=console, auto_refresh=False) as live:
        try:
            while True:
                live.update(_table(team), refresh=True)
                await anyio.sleep(interval)
        finally:
            live.update(_table(team), refresh=True)  # the final frame


async def _plain(team: Team, interval: float, stream: TextIO) -> None:
    shown: dict[str, str] = {}

    def changes() -> None:
        for name, status in team.status.items():
            key = f"{status.state}/{status.step}/{status.last}/{status.text}/{status.tasks_done}"
            if shown.get(name) != key:
                shown[name] = key
                stream.write(_line(status, _depth(team, name)).rstrip() + "\n")
        stream.flush()

    try:
        while True:
            changes()
            await anyio.sleep(interval)
    finally:
        changes()  # the final frame: whatever changed since the last one
