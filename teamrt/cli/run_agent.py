"""`teamrt run-agent`: one teammate in this process, until it is asked to stop.

A store outage within `--store-outage` is waited out by the teammate itself (same incarnation).
A longer one stops that incarnation with a report naming the outage; this command then
reconnects (trying again every second or so, for as long as it takes) and the next incarnation
resumes the task from the journal. `--exit-on-outage` exits with `EXIT_OUTAGE` instead, for
supervisors that restart it themselves. It never reports an outage as a crash.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

import anyio

from teamrt.cli.runner import EXIT_OUTAGE
from teamrt.errors import OutcomeUnknown, StoreUnavailable, UsageError
from teamrt.mail import open_mailboxes
from teamrt.mail.locator import redacted
from teamrt.mail.outage import ride_out
from teamrt.names import validate_name
from teamrt.team import MemberStatus, Team, TeamBudget, Teammate


async def run_agent(args: argparse.Namespace, teammate: Teammate, agent_dir: Path) -> int:
    """Serve `teammate` as member `args.name`; reconnect after an outage that stopped it."""
    validate_name(args.name, what="member name (--name)")
    if teammate.name != args.name:
        teammate = dataclasses.replace(teammate, name=args.name)
    ran: list[bool] = []  # once it has run, an unreachable store is an outage to wait out
    while True:
        try:
            status = await _serve(args, teammate, agent_dir, lambda: ran.append(True))
        except (StoreUnavailable, OutcomeUnknown) as exc:
            if not ran:
                raise  # never reached: a wrong locator, or a server that is not up yet
            outage = f"the store is out of reach: {exc}"
        else:
            if not status.outage:
                return _stopped(args.name, status)
            outage = status.last
        if args.exit_on_outage:
            print(f"{args.name}: {outage}; exiting (--exit-on-outage)", file=sys.stderr, flush=True)
            return EXIT_OUTAGE
        print(f"{args.name}: {outage}; reconnecting", file=sys.stderr, flush=True)
        if not await _reconnected(args):
            print(f"{args.name}: stopped", flush=True)
            return 0


async def _reconnected(args: argparse.Namespace) -> bool:
    """Wait until the team's store can be opened again; False if a signal came first."""

    async def reachable() -> None:
        async with open_mailboxes(args.dir, create=False):
            pass

    async with anyio.create_task_group() as tg:

        async def stop_on_signal() -> None:
            await args.stop.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(stop_on_signal)
        await ride_out(reachable, "reconnect to the store", math.inf)
        tg.cancel_scope.cancel()
        return True
    return False


async def _serve(
    args: argparse.Namespace, teammate: Teammate, agent_dir: Path, started: Callable[[], None]
) -> MemberStatus:
    """One connection to the team: the member runs until it stops; its final status."""
    async with open_mailboxes(args.dir, create=False) as mail:
        roster = await mail.members_now()
        if args.name not in roster and not args.join:
            raise UsageError(
                f"{args.name!r} is not a member of {redacted(args.dir)} "
                f"(members: {', '.join(roster) or 'none'}); check the spelling, or pass --join "
                "to add it"
            )
        team = Team(
            mail,
            [teammate],
            lead=args.lead,
            agent_dir=agent_dir,
            # the lead's budget, shared
            budget=await TeamBudget.follow(mail.store, store_outage=args.store_outage),
            lead_here=False,
            store_outage=args.store_outage,
        )
        async with team:
            started()
            print(
                f"{args.name}: running as incarnation {team.status[args.name].incarnation} "
                f"(pid {os.getpid()}) in {redacted(args.dir)}",
                flush=True,
            )
            async with anyio.create_task_group() as waiting:  # until it stops, or a signal

                async def stop_on_signal() -> None:
                    await args.stop.wait()
                    waiting.cancel_scope.cancel()

                waiting.start_soon(stop_on_signal)
                await team.wait()
                waiting.cancel_scope.cancel()
            status = team.status[args.name]
            if status.outage:  # closing: what cannot be written now is delivered again later
                mail.store_outage = 0
        # leaving the team's block asked the teammate to stop after its step
        return status


def _stopped(name: str, status: MemberStatus) -> int:
    if status.state == "crashed":
        print(f"{name}: {status.last}", file=sys.stderr, flush=True)
        return 1
    print(f"{name}: stopped", flush=True)
    return 0
