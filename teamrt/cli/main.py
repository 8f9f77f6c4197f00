"""The `teamrt` command: send, inspect, repair, replay, rerun, bench, run-agent, demo.

Commands raise teamrt's own errors (`UsageError` for the caller's mistakes) and never print a
traceback: `teamrt.cli.runner` runs them, words what went wrong in one line and turns SIGINT and
SIGTERM into a graceful stop."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from teamrt import __version__
from teamrt.cli.runner import Parser, configure_logging, execute
from teamrt.cli.send import send as send_command
from teamrt.cli.send import team_dir
from teamrt.errors import TeamrtError, UsageError
from teamrt.mail.mailboxes import FileMailboxes
from teamrt.names import validate_name

DESCRIPTION = """\
teamrt: an asyncio multi-agent runtime with durable, file-backed mailboxes.

A team directory (default root: ./mailboxes/<team>) holds team.json and one JSON Lines inbox per
member under inboxes/. See mailboxes/README.md for the on-disk format."""

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"not a positive number of seconds: {text!r}")
    return value


def _level(text: str) -> str:
    if text.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"not a log level: {text!r} (one of {', '.join(LOG_LEVELS)})"
        )
    return text.upper()


# -- reading a team directory --


def _inspect(args: argparse.Namespace) -> int:
    from teamrt.agents.journal import summarise
    from teamrt.mail.filestore import lease_holder
    from teamrt.mail.inspect import format_report, inspect_team

    report = inspect_team(team_dir(args.dir))
    root = Path(args.dir)
    agents: list[dict[str, Any]] = []
    for name in report.members:
        journal = root / "agents" / f"{name}.state.jsonl"
        agents.append(
            {
                "name": name,
                "running": lease_holder(root, name),
                "last_run": summarise(journal) if journal.exists() else None,
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


def _repair(args: argparse.Namespace) -> int:
    from teamrt.mail.filestore.repair import repair_team

    reports = repair_team(team_dir(args.dir), args.inbox)
    if args.json:
        print(json.dumps([r.to_json_dict() for r in reports], indent=2))
    else:
        for report in reports:
            print("\n".join(report.lines()))
    return 0


def _replay(args: argparse.Namespace) -> int:
    from teamrt.cli.replay import parse_time, run_replay, split
    from teamrt.replay import Filter

    team_dir(args.dir)
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
        with output.open("w", encoding="utf-8") as out:
            return run_replay(
                args.dir, fmt=args.format, keep=keep, follow=False, colour="never", out=out
            )
    return run_replay(args.dir, fmt=args.format, keep=keep, follow=args.follow, colour=args.color)


async def _rerun(args: argparse.Namespace) -> int:
    from teamrt.agents.tools import Tool, tool
    from teamrt.rerun import rerun

    team_dir(args.dir)
    validate_name(args.agent, what="agent name (--agent)")
    tools: list[Tool] = []
    instructions = ""
    if args.spec:  # without one, the agent is re-run with no tools and no instructions
        teammate = _load_teammate(args.spec)
        tools = [t if isinstance(t, Tool) else tool(t) for t in teammate.tools]
        instructions = teammate.instructions
    report, divergence, recorded = await rerun(
        Path(args.dir) / "agents", args.agent, tools, instructions
    )
    if divergence is None:
        print(
            f"rerun of {args.agent}: {recorded} recorded steps, the same again "
            f"(no model called; {report.stop.reason if report else '?'})"
        )
        return 0
    print(f"rerun of {args.agent}: {divergence}")
    return 1


def _load_teammate(spec: str) -> Any:
    """The Teammate that `--spec module:object` names: the object, or what calling it returns.
    A spec that names nothing is a usage mistake; a module or factory that fails is a failure."""
    from teamrt.team import Teammate

    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise UsageError(f"--spec {spec!r} must be module:object, e.g. mypkg.team:writer")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise UsageError(
                f"--spec {spec}: no module named {exc.name!r}; check the spelling, and that it "
                "is importable from here (installed, or on PYTHONPATH)"
            ) from None
        raise TeamrtError(f"--spec {spec}: importing {module_name} failed: {exc}") from None
    except Exception as exc:
        raise TeamrtError(
            f"--spec {spec}: importing {module_name} raised {type(exc).__name__}: {exc}"
        ) from None
    target = getattr(module, attribute, None)
    if target is None:
        raise UsageError(f"--spec {spec}: module {module_name} has no {attribute!r}")
    if callable(target) and not isinstance(target, Teammate):
        try:
            target = target()
        except Exception as exc:
            raise TeamrtError(
                f"--spec {spec}: calling {attribute}() raised {type(exc).__name__}: {exc}"
            ) from None
    if not isinstance(target, Teammate):
        raise UsageError(
            f"--spec {spec} is a {type(target).__name__}, not a Teammate (or a function "
            "returning one)"
        )
    return target


def _bench(args: argparse.Namespace) -> int:
    from teamrt.cli.bench import run_bench

    if args.dir is not None and os.path.exists(args.dir) and not os.path.isdir(args.dir):
        raise UsageError(f"--dir {args.dir} is a file; give a directory for the scratch teams")
    return run_bench(
        quick=args.quick, as_json=args.json, directory=args.dir, smoke=args.smoke, only=args.only
    )


async def _run_agent(args: argparse.Namespace) -> int:
    from teamrt.team import Team, TeamBudget

    team_dir(args.dir)
    validate_name(args.name, what="member name (--name)")
    teammate = _load_teammate(args.spec)
    if teammate.name != args.name:
        teammate = dataclasses.replace(teammate, name=args.name)
    async with FileMailboxes(args.dir, create=False) as mail:
        roster = mail.members
        if args.name not in roster and not args.join:
            raise UsageError(
                f"{args.name!r} is not a member of {args.dir} "
                f"(members: {', '.join(roster) or 'none'}); check the spelling, or pass --join "
                "to add it"
            )
        team = Team(
            mail,
            [teammate],
            lead=args.lead,
            agent_dir=Path(args.dir) / "agents",
            budget=TeamBudget.follow(mail.store),  # the lead's budget, shared on disk
            lead_here=False,
        )
        async with team:
            print(
                f"{args.name}: running as incarnation {team.status[args.name].incarnation} "
                f"(pid {os.getpid()}) in {args.dir}",
                flush=True,
            )
            async with anyio.create_task_group() as waiting:  # until it stops, or a signal

                async def stop_on_signal() -> None:
                    await args.stop.wait()
                    waiting.cancel_scope.cancel()

                waiting.start_soon(stop_on_signal)
                await team.wait()
                waiting.cancel_scope.cancel()
        # leaving the team's block asked the teammate to stop after its step
        status = team.status[args.name]
    if status.state == "crashed":
        print(f"{args.name}: {status.last}", file=sys.stderr, flush=True)
        return 1
    print(f"{args.name}: stopped", flush=True)
    return 0


async def _demo(args: argparse.Namespace) -> int:
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
        return await research_writer.run(root, args.model, True, two)
    if args.name == "conductor":
        from teamrt.demos import conductor

        return await conductor.run(root, args.model)
    if args.name == "service":
        return await demo.service_demo(root, args.model)
    if args.model != "offline":
        raise UsageError("the exchange demo has no model (it trades raw requests)")
    return await demo.lead(root)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="teamrt",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"teamrt {__version__}")
    parser.add_argument(
        "--log-level",
        type=_level,
        default="WARNING",
        metavar="LEVEL",
        help="log teamrt's retries, crashes, restarts and the like to stderr from this level "
        "up: DEBUG, INFO, WARNING (default), ERROR or CRITICAL",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    send = commands.add_parser(
        "send",
        help="append one envelope to an inbox",
        description="Append one envelope to a member's inbox (or every member's, for a "
        "broadcast). Prints the envelope id; with --kind request --wait, waits for "
        "the response and prints it as JSON. The sender must be a member of the team, or "
        "a person outside it (--as-human).",
    )
    send.add_argument("dir", help="team directory, e.g. mailboxes/demo")
    send.add_argument("--from", dest="sender", required=True, help="sender name (a member)")
    send.add_argument(
        "--as-human",
        action="store_true",
        help="the sender is a person outside the roster, not a misspelt member",
    )
    send.add_argument("--to", help="recipient name (not for broadcasts)")
    send.add_argument(
        "--kind", default="message", choices=["message", "request", "response", "broadcast"]
    )
    send.add_argument("--type", help="body type (default: text, request or result)")
    body = send.add_mutually_exclusive_group(required=True)
    body.add_argument("--body", help="the body as JSON, e.g. '{\"x\": 1}' or '\"a string\"'")
    body.add_argument("--text", help="the body as a plain string")
    send.add_argument("--in-reply-to", help="for --kind response: the request id")
    send.add_argument(
        "--wait",
        type=_seconds,
        metavar="SECONDS",
        help="for --kind request: wait this long for the response and print it (the answer "
        "is read without consuming the sender's inbox: its owner, if running, gets it too)",
    )
    send.add_argument("--durability", default="none", choices=["none", "fsync"])
    send.set_defaults(run=send_command)
    inspect = commands.add_parser(
        "inspect",
        help="summarise a team directory",
        description="Per inbox: depth, last seq, cursor lag, corrupt and quarantined lines, "
        "unanswered requests, segments and bytes. Reads files only; takes no lock.",
    )
    inspect.add_argument("dir", help="team directory")
    inspect.add_argument("--json", action="store_true", help="print one JSON object")
    inspect.set_defaults(run=_inspect)

    repair = commands.add_parser(
        "repair",
        help="bring damaged inboxes back to their last good position",
        description="Finishes an interrupted rotation, recreates a missing active log, seals a "
        "torn last line, and moves a cursor that no longer matches its log (truncated, "
        "replaced, deleted, or with no valid slot) back to the last position it can prove was "
        "handled. Reports what it changed and what cannot be delivered. Takes the member's "
        "lease: stop the inbox's owner first.",
    )
    repair.add_argument("dir", help="team directory")
    repair.add_argument("--inbox", help="only this member's inbox (default: every member's)")
    repair.add_argument("--json", action="store_true", help="print one JSON list")
    repair.set_defaults(run=_repair)

    replay = commands.add_parser(
        "replay",
        help="read a team directory back as one timeline",
        description="Merge every inbox (every segment) into one timeline by send time; join "
        "each request to its response with the latency; flag unanswered, timed-out and late "
        "requests, second answers, duplicates and undecodable lines. Streams: memory does not "
        "grow with the number of envelopes. Reads files only; takes no lock.",
    )
    replay.add_argument("dir", help="team directory")
    replay.add_argument(
        "--format",
        default="text",
        choices=["text", "json", "mermaid", "html"],
        help="text (default), json (one object per line), mermaid (a sequence "
        "diagram) or html (one self-contained page)",
    )
    replay.add_argument(
        "--agent",
        action="append",
        help="only envelopes from or to these agents (repeat or comma-separate)",
    )
    replay.add_argument("--kind", action="append", help="message, request, response, broadcast")
    replay.add_argument("--type", action="append", help="envelope types, e.g. task,task_result")
    replay.add_argument("--trace", help="one trace id")
    replay.add_argument("--since", help="seconds since the epoch or an ISO time (UTC)")
    replay.add_argument("--until", help="seconds since the epoch or an ISO time (UTC)")
    replay.add_argument("--grep", help="only lines containing this text")
    replay.add_argument(
        "--follow",
        action="store_true",
        help="keep printing new envelopes as they arrive (text and json)",
    )
    replay.add_argument("--color", default="auto", choices=["auto", "always", "never"])
    replay.add_argument("-o", "--output", help="write to this file instead of standard output")
    replay.set_defaults(run=_replay)

    rerun = commands.add_parser(
        "rerun",
        help="run an agent again against its recorded transcript, with no model calls",
        description="Replays the recorded model replies and checks, step by step, that the "
        "loop builds the same conversation; the spec's tools run for real, messaging tools "
        "return what they returned in the recording. Reports the first step that differs "
        "(exit code 1) or that the run is the same (0).",
    )
    rerun.add_argument("dir", help="team directory (its agents/ folder holds the transcripts)")
    rerun.add_argument("--agent", required=True, help="the agent to re-run")
    rerun.add_argument(
        "--spec",
        help="module:object naming the agent's Teammate (its tools and "
        "instructions as the code has them now)",
    )
    rerun.set_defaults(run=_rerun)

    bench = commands.add_parser(
        "bench",
        help="measure mailboxes, the agent loop, teams and replay against baselines",
        description="Measures sends, contention, group commit, round trips, wake-ups, pick-up "
        "and drain at depth, the agent loop's cost per step, idle teammates and wake-ups among "
        "many, replay throughput and memory, and the cost of an ack with many acks held "
        "behind an unacked envelope, a service under 50 concurrent requests (a pool against one "
        "teammate), a lead's memory and cursor over many asks, and 20 tool calls of one reply "
        "side by side; prints each figure beside a baseline measured in the same "
        "run, with the ratio and the target.",
    )
    bench.add_argument("--quick", action="store_true", help="smaller sizes (depth 100k, not 1M)")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.add_argument("--dir", help="where to put scratch teams (default: a temp dir)")
    bench.add_argument(
        "--only",
        choices=[
            *("sends", "contention", "round_trips", "wakes", "depth", "agent", "team", "replay"),
            *("acks", "teamwork", "models", "startup"),
        ],
        help="run one group of measurements",
    )
    bench.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)
    bench.set_defaults(run=_bench)

    run_agent = commands.add_parser(
        "run-agent",
        help="run one teammate in this process",
        description="Run one teammate on a team directory until it is asked to shut down. "
        "The spec names a Teammate (or a function returning one) as module:object. A member "
        "name runs in at most one process at a time, and must be in the team's roster (--join "
        "adds it). The teammate draws on the budget the team's lead published, enforces the "
        "deadline of the shutdown request it gets, and exits with 1 if it crashed for good.",
    )
    run_agent.add_argument("dir", help="team directory")
    run_agent.add_argument("--name", required=True, help="the member name to run as")
    run_agent.add_argument("--spec", required=True, help="module:object, e.g. mypkg.team:writer")
    run_agent.add_argument("--lead", default="lead", help="who gets idle and crash notices")
    run_agent.add_argument(
        "--join", action="store_true", help="add the name to the team's roster if it is not there"
    )
    run_agent.set_defaults(run=_run_agent, graceful=True)

    demo = commands.add_parser(
        "demo",
        help="run a demo on real file mailboxes (offline, or on a real model)",
        description="research-writer (default): a researcher reads the shipped notes and sends "
        "findings to a writer, who writes agent-loop.md. two-process: the same with the writer "
        "in its own process. service: a Starlette app runs the team in its lifespan. "
        "conductor: a planner and builders get a small Python package through its pytest "
        "checks. exchange: a lead and a worker in another process trade raw requests. "
        "With --model openai, every model of the first four (in every process) is an "
        "OpenAIModel: set OPENAI_MODEL, and OPENAI_API_KEY, or OPENAI_BASE_URL alone for a "
        "server that needs no key; TEAMRT_PRICES gives prices "
        "('{\"my-model\": [0.5, 1.5]}', USD per million tokens). Each run prints every "
        "agent's stop report; one that cannot start or stopped early ends with one line "
        "saying why (exit code 2 for a missing or malformed variable, else 1).",
    )
    demo.add_argument(
        "name",
        nargs="?",
        default="research-writer",
        choices=["research-writer", "two-process", "service", "conductor", "exchange"],
    )
    demo.add_argument(
        "--model",
        default="offline",
        choices=["offline", "openai"],
        help="offline: function models (default); openai: OpenAIModel from the "
        "environment (OPENAI_MODEL, OPENAI_API_KEY, OPENAI_BASE_URL)",
    )
    demo.add_argument("--dir", default="mailboxes", help="root for the demo's team directory")
    demo.set_defaults(run=_demo, is_async=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:
        return 130
    configure_logging(args.log_level)
    return execute(args)


if __name__ == "__main__":
    sys.exit(main())
