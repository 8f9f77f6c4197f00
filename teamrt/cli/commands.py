"""What each `teamrt` command does, given its parsed arguments (`teamrt.cli.main` parses them,
`teamrt.cli.runner` runs them). A mistake of the caller's raises `UsageError`, a failure another
`TeamrtError`; none prints a traceback or exits by itself."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from teamrt.cli.send import team_at, team_dir
from teamrt.errors import TeamrtError, UsageError
from teamrt.mail import open_view
from teamrt.mail.locator import is_url, with_team
from teamrt.names import validate_name
from teamrt.private_files import make_dirs
from teamrt.specs import load_object
from teamrt.teamdir import TeamDir


def inspect(args: argparse.Namespace) -> int:
    from teamrt.agents.journal import summarise
    from teamrt.mail.inspect import format_report, inspect_team

    with open_view(team_at(args.dir)) as view:
        report = inspect_team(view)
        root = view.directory  # agents' journals: in the team directory, for a local team
        agents: list[dict[str, Any]] = []
        for name in report.members:
            journal = TeamDir(root).agents.journal(name) if root is not None else None
            agents.append(
                {
                    "name": name,
                    "running": view.holder(name),
                    "last_run": summarise(journal)
                    if journal is not None and journal.exists()
                    else None,
                }
            )
    if args.json:
        print(json.dumps({**report.to_json_dict(), "agents": agents}, indent=2))
        return 0
    print(format_report(report))
    print("\nagent       running                                          last run")
    for agent in agents:
        run = agent["last_run"]
        last = (
            "no agent journal"
            if run is None
            else (
                f"{run['stop_reason']}: {run['steps']} steps, {run['tool_calls']} tool calls, "
                f"{run['tokens']} tokens, "
                + ("cost unknown" if run["cost"] is None else f"${run['cost']:.4f}")
            )
        )
        print(f"{agent['name']:10}  {agent['running'] or 'no':47}  {last}")
    return 0


def repair(args: argparse.Namespace) -> int:
    from teamrt.cli.progress import Progress
    from teamrt.mail import repair_team
    from teamrt.replay import members

    root = team_dir(args.dir)
    # one inbox at a time, so that a terminal shows which one (the first call checks the team
    # directory as a whole, as one call for every inbox would)
    names = [args.inbox] if args.inbox is not None else members(Path(root))
    reports = [] if names else repair_team(root)  # no inbox: the directory is checked all the same
    with Progress(f"repair {Path(root).name}", unit="inboxes", quiet=args.quiet) as progress:
        for index, name in enumerate(names, 1):
            progress.section(name, index, len(names))
            reports += repair_team(root, name)
    if args.json:
        print(json.dumps([r.to_json_dict() for r in reports], indent=2))
    else:
        for report in reports:
            print("\n".join(report.lines()))
    return 0


def export(args: argparse.Namespace) -> int:
    from teamrt.mail import export_team

    with open_view(team_at(args.source)) as view:
        counts = export_team(view, Path(args.dest))
    total = sum(counts.values())
    print(f"exported {total} envelopes of team {view.team} ({len(counts)} inboxes) to {args.dest}")
    return 0


def replay(args: argparse.Namespace) -> int:
    from teamrt.cli.replay import parse_time, run_replay, split
    from teamrt.private_files import open_private
    from teamrt.replay import Filter

    args.dir = team_at(args.dir)
    keep = Filter(
        agents=split(args.agent),
        kinds=split(args.kind),
        types=split(args.type),
        trace=args.trace,
        since=parse_time(args.since, option="--since"),
        until=parse_time(args.until, option="--until"),
        grep=args.grep,
    )
    if args.output:
        output = Path(args.output)
        if output.is_dir():
            raise UsageError(f"-o {output} is a directory; name a file, e.g. {output}/replay.html")
        if not output.parent.is_dir():
            raise UsageError(f"-o {output}: there is no directory {output.parent}; create it first")
        with open_private(output) as out:
            return run_replay(
                args.dir,
                fmt=args.format,
                keep=keep,
                follow=args.follow,
                colour="never",
                out=out,
                quiet=args.quiet,
            )
    return run_replay(
        args.dir,
        fmt=args.format,
        keep=keep,
        follow=args.follow,
        colour=args.color,
        quiet=args.quiet,
    )


async def rerun(args: argparse.Namespace) -> int:
    from teamrt.agents.tools import Tool, tool
    from teamrt.rerun import rerun

    args.dir = team_at(args.dir)
    if args.team:
        return await _rerun_team(args)
    validate_name(args.agent, what="agent name (--agent)")
    tools: list[Tool] = []
    instructions = ""
    output_type = None
    if args.spec:  # without one, the agent is re-run with no tools and no instructions
        teammate = load_teammate(args.spec)
        tools = [t if isinstance(t, Tool) else tool(t) for t in teammate.tools]
        instructions = teammate.instructions
        output_type = teammate.typed  # a typed teammate's answers are validated again
    report, divergence, recorded = await rerun(
        _agent_dir(args), args.agent, tools, instructions, output_type=output_type
    )
    if divergence is None:
        print(
            f"rerun of {args.agent}: {recorded} recorded steps, the same again "
            f"(no model called; {report.stop.reason if report else '?'})"
        )
        return 0
    print(f"rerun of {args.agent}: {divergence}")
    return 1


async def _rerun_team(args: argparse.Namespace) -> int:
    from teamrt.rerun import rerun_team

    if not args.spec:
        raise UsageError("rerun --team needs --spec module:object naming the team's teammates")
    directory = _agent_dir(args)
    if not directory.is_dir():
        raise UsageError(f"no agents' folder at {directory}: give --agent-dir")
    results = await rerun_team(directory, load_teammates(args.spec))
    if not results:
        raise UsageError(f"no transcript in {directory} of any teammate --spec {args.spec} names")
    if all(result.skipped is not None for result in results):  # nothing was checked
        raise UsageError(
            f"the agents with a transcript in {directory} "
            f"({', '.join(result.name for result in results)}) are none of the teammates "
            f"--spec {args.spec} names"
        )
    diverged = 0
    for result in results:
        if result.skipped is not None:
            print(f"{result.name}: not re-run ({result.skipped})")
        elif result.divergence is None:
            print(f"{result.name}: {result.steps} recorded steps, the same again")
        else:
            diverged += 1
            print(f"{result.name}: {result.divergence}")
    return 1 if diverged else 0


def load_teammates(spec: str) -> list[Any]:
    """The Teammates that `--spec module:object` names for a whole team: a Teammate, a list
    of them, or a function returning either."""
    from teamrt.team import Teammate

    target = _load(spec)
    if callable(target) and not isinstance(target, Teammate):
        target = _call(spec, target)
    items = [target] if isinstance(target, Teammate) else target
    if not isinstance(items, list | tuple) or not all(isinstance(t, Teammate) for t in items):
        raise UsageError(
            f"--spec {spec} is a {type(target).__name__}, not a list of Teammates (or a "
            "function returning one)"
        )
    return list(items)


def load_teammate(spec: str) -> Any:
    """The Teammate that `--spec module:object` names: the object, or what calling it returns.
    A spec that names nothing is a usage mistake; a module or factory that fails is a failure."""
    from teamrt.team import Teammate

    target = _load(spec)
    if callable(target) and not isinstance(target, Teammate):
        target = _call(spec, target)
    if not isinstance(target, Teammate):
        raise UsageError(
            f"--spec {spec} is a {type(target).__name__}, not a Teammate (or a function "
            "returning one)"
        )
    return target


def _load(spec: str) -> Any:
    """The object `module:object` names."""
    return load_object(spec, "--spec", "mypkg.team:writer")


def _call(spec: str, factory: Any) -> Any:
    """What calling the spec's function returns (a failure of its own is a failure)."""
    try:
        return factory()
    except Exception as exc:
        raise TeamrtError(
            f"--spec {spec}: calling {spec.partition(':')[2]}() raised {type(exc).__name__}: {exc}"
        ) from None


def bench(args: argparse.Namespace) -> int:
    from teamrt.cli.bench import run_bench

    if args.store is not None:
        from teamrt.cli.bench import run_store_bench

        return run_store_bench(args.store, quick=args.quick, as_json=args.json)
    if args.dir is not None and os.path.exists(args.dir) and not os.path.isdir(args.dir):
        raise UsageError(f"--dir {args.dir} is a file; give a directory for the scratch teams")
    return run_bench(
        quick=args.quick,
        as_json=args.json,
        directory=args.dir,
        smoke=args.smoke,
        only=args.only,
        quiet=args.quiet,
        rounds=args.rounds,
        save=args.save,
        compare=args.compare,
    )


async def soak(args: argparse.Namespace) -> int:
    from teamrt.testing.soak import FAULTS, soak

    if args.dir is not None and os.path.exists(args.dir) and not os.path.isdir(args.dir):
        raise UsageError(f"--dir {args.dir} is a file; give a directory for the soak's logs")
    root = Path(args.dir) if args.dir is not None else None
    if root is not None:
        make_dirs(root)
    say = (lambda _line: None) if args.json else (lambda line: print(line, flush=True))
    figures = await soak(
        seconds=args.seconds,
        seed=args.seed,
        root=root,
        teammates=args.teammates,
        fault_every=args.every,
        faults=args.fault or FAULTS,
        say=say,
    )
    if args.json:
        print(json.dumps({**dataclasses.asdict(figures), "ok": figures.ok}))
    else:
        print("\n".join(figures.lines()))
    return 0 if figures.ok else 1


async def run_agent(args: argparse.Namespace) -> int:
    from teamrt.cli.run_agent import run_agent as serve

    args.dir = team_at(args.dir)
    validate_name(args.name, what="member name (--name)")
    return await serve(args, load_teammate(args.spec), _agent_dir(args))


def _agent_dir(args: argparse.Namespace) -> Path:
    """Where a member run here keeps its journal: `--agent-dir`, else the team directory's
    agents/ (for a team in a network store: ./agents of the working directory)."""
    if getattr(args, "agent_dir", None):
        return Path(args.agent_dir)
    if not is_url(args.dir):
        return TeamDir.at(args.dir).agents.path
    return TeamDir(Path.cwd()).agents.path


async def demo(args: argparse.Namespace) -> int:
    """The demos' coroutines, run here so that a signal stops them like any other command.
    Each is imported only when chosen: the exchange demo speaks raw envelopes whose types the
    team package would register payload models for."""
    from teamrt.cli import demo

    root = Path(args.dir)
    if root.exists() and not root.is_dir():
        raise UsageError(f"--dir {root} is a file; give a directory for the demo's teams")
    if args.name in ("research-writer", "two-process"):
        from teamrt.demos import research_writer

        two = args.name == "two-process"
        store = with_team(args.store, research_writer.TEAM) if args.store else None
        return await research_writer.run(root, args.model, True, two, store)
    if args.name == "two-hosts":
        from teamrt.demos import two_hosts

        return await two_hosts.run(root, args.store)
    if args.store and args.name == "exchange":
        raise UsageError("--store is for every demo but exchange (a lead and a worker on files)")
    if args.name == "conductor":
        from teamrt.demos import conductor

        store = with_team(args.store, "conductor-team") if args.store else None
        return await conductor.run(root, args.model, store)
    if args.name == "service":
        store = with_team(args.store, "service") if args.store else None
        return await demo.service_demo(root, args.model, store)
    if args.model != "offline":
        raise UsageError("the exchange demo has no model (it trades raw requests)")
    return await demo.lead(root)
