"""`teamrt fork`: a copy of a team as it was when one envelope was sent (see `teamrt.fork`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from teamrt.cli.send import team_at

HELP = "copy a team as it was when one envelope was sent, to re-drive it from there"
DESCRIPTION = (
    "Write a new team directory holding the team's state at the moment envelope --at was "
    "sent: every inbox up to then (the envelope's own inbox up to and including it), each "
    "cursor at what its owner had handled by then, each agent's journal and transcript as they "
    "were then. Open the new directory with a Team (the same teammates, or changed code, "
    "prompts or models) and it runs on from there: an interrupted task resumes, open requests "
    "are answered. Leases and heartbeats are not copied. The new directory's name is the "
    "fork's team name. Reads only the source; the team may be running (every inbox is read "
    "whole up to the cut, whatever rotates meanwhile; export.json names each inbox's last seq)."
)


def add_command(commands: Any) -> None:
    """Register `fork` on the `teamrt` parser's subcommands."""
    fork = commands.add_parser("fork", help=HELP, description=DESCRIPTION)
    fork.add_argument(
        "source",
        help="the team: a directory (e.g. mailboxes/demo) or a store URL "
        "(redis://HOST:PORT/DB?team=NAME)",
    )
    fork.add_argument("dest", help="the new team directory (must not exist, or be empty)")
    fork.add_argument(
        "--at", required=True, metavar="ENVELOPE_ID", help="the envelope to fork at (its id)"
    )
    fork.add_argument(
        "--agent-dir",
        metavar="PATH",
        help="where the team's agents' journals and transcripts are (default: the team "
        "directory's agents/; for a team in a store URL, where run-agent --agent-dir put them)",
    )
    fork.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    fork.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from teamrt.fork import fork_team

    summary = fork_team(team_at(args.source), args.at, args.dest, agent_dir=args.agent_dir)
    if args.json:
        print(json.dumps(summary.to_json_dict(), indent=2))
    else:
        print("\n".join(summary.lines()))
    return 0
