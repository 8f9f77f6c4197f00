"""The `teamrt` command: send, inspect, repair, replay, rerun, fork, bench, soak, run-agent,
demo, eval.

Commands raise teamrt's own errors (`UsageError` for the caller's mistakes) and never print a
traceback: `teamrt.cli.runner` runs them, words what went wrong in one line and turns SIGINT and
SIGTERM into a graceful stop."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from teamrt import __version__
from teamrt.cli import commands as cmd
from teamrt.cli import fork as fork_command
from teamrt.cli.eval import add_eval_command
from teamrt.cli.runner import (
    EXIT_OUTAGE,
    Parser,
    configure_logging,
    execute,
    positive_int,
    seconds,
)
from teamrt.cli.send import send as send_command
from teamrt.mail.outage import DEFAULT_STORE_OUTAGE

DESCRIPTION = """\
teamrt: an asyncio multi-agent runtime with durable, file-backed mailboxes.

A team directory (default root: ./mailboxes/<team>) holds team.json and one JSON Lines inbox per
member under inboxes/. See mailboxes/README.md for the on-disk format."""

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


TEAM_HELP = (
    "team directory (e.g. mailboxes/demo) or store URL (redis://HOST:PORT/DB?team=NAME); "
    "default: $TEAMRT_STORE"
)


def _level(text: str) -> str:
    if text.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"not a log level: {text!r} (one of {', '.join(LOG_LEVELS)})"
        )
    return text.upper()


_demo = cmd.demo  # the demo's arguments below name it so


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
    send.add_argument("dir", nargs="?", help=TEAM_HELP)
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
        type=seconds,
        metavar="SECONDS",
        help="for --kind request: wait this long for the response and print it (the answer "
        "is read without consuming the sender's inbox: its owner, if running, gets it too)",
    )
    send.add_argument("--durability", default="none", choices=["none", "fsync"])
    send.set_defaults(run=send_command)
    inspect = commands.add_parser(
        "inspect",
        help="summarise a team",
        description="Per inbox: depth, last seq, cursor lag, corrupt and quarantined lines, "
        "unanswered requests, segments and bytes, and who runs each member. Reads only; "
        "takes no lock or lease. A running team is counted whole up to where each inbox's "
        "reading stopped (no rotated segment skipped).",
    )
    inspect.add_argument("dir", nargs="?", help=TEAM_HELP)
    inspect.add_argument("--json", action="store_true", help="print one JSON object")
    inspect.set_defaults(run=cmd.inspect)

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
    repair.add_argument(
        "-q", "--quiet", action="store_true", help="no progress on stderr (shown on a terminal)"
    )
    repair.set_defaults(run=cmd.repair)

    export = commands.add_parser(
        "export",
        help="write a team (e.g. one in Redis) as an ordinary team directory",
        description="Copy every inbox, its owner's committed cursor and its quarantine into a "
        "new team directory, so that every file tool (inspect, replay, rerun, plain grep) "
        "works on a snapshot. Reads only; the team may be running: each inbox is copied "
        "whole up to a point that export.json names (records, last_seq, to), or the export "
        "fails (StoreCorrupt) on a log that cannot be read whole.",
    )
    export.add_argument("source", help=TEAM_HELP)
    export.add_argument("dest", help="the new team directory (must not exist)")
    export.set_defaults(run=cmd.export)

    replay = commands.add_parser(
        "replay",
        help="read a team back as one timeline",
        description="Merge every inbox (every segment) into one timeline by send time; join "
        "each request to its response with the latency; flag unanswered, timed-out and late "
        "requests, second answers, duplicates and undecodable lines. Streams: memory does not "
        "grow with the number of envelopes. Reads only; takes no lock or lease. A running "
        "team's inboxes are read whole up to where each reading stopped (the json summary's "
        "read_to), or the replay fails (StoreCorrupt) on a log that cannot be read whole.",
    )
    replay.add_argument("dir", nargs="?", help=TEAM_HELP)
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
    replay.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress on stderr (shown on a terminal while the files are read, unless the "
        "timeline itself goes to the terminal)",
    )
    replay.set_defaults(run=cmd.replay)

    rerun = commands.add_parser(
        "rerun",
        help="run an agent (or every agent) again against its recorded transcript",
        description="Replays the recorded model replies and checks, step by step, that the "
        "loop builds the same conversation; the spec's tools run for real, messaging tools "
        "return what they returned in the recording. Reports the first step that differs "
        "(exit code 1) or that the run is the same (0). With --team, the spec names the team's "
        "teammates (a list, or a function returning one) and every agent with a transcript is "
        "re-run, each step also asking the teammate's model (a scripted one, say) whether it "
        "replies as recorded; the first divergence is reported per agent.",
    )
    rerun.add_argument(
        "dir", nargs="?", help=TEAM_HELP + " (a team directory's agents/ holds the transcripts)"
    )
    which = rerun.add_mutually_exclusive_group(required=True)
    which.add_argument("--agent", help="the agent to re-run")
    which.add_argument(
        "--team",
        action="store_true",
        help="re-run every agent, with the models of the teammates --spec names",
    )
    rerun.add_argument(
        "--agent-dir",
        help="the folder of the agent's transcript (default: the team directory's agents/, "
        "or ./agents for a team in a store URL: where run-agent --agent-dir put it)",
    )
    rerun.add_argument(
        "--spec",
        help="module:object naming the agent's Teammate (its tools and "
        "instructions as the code has them now); with --team, the teammates",
    )
    rerun.set_defaults(run=cmd.rerun)

    fork_command.add_command(commands)

    bench = commands.add_parser(
        "bench",
        help="measure mailboxes, the agent loop, teams and replay against baselines",
        description="Measures sends, envelope sizes (100 B, 10 KB, 500 KB), 1-16 writer "
        "processes into one inbox, group commit, round trips (and their CPU on each side), "
        "wake-ups, pick-up, open and drain at depth (a backlog in real segments), the agent "
        "loop's cost per step, teams of 10 to 10,000 idle teammates with one woken, replay "
        "throughput and memory, the cost of an ack with many acks held behind an unacked "
        "envelope, a service under 50 concurrent requests (a pool against one teammate), a "
        "lead's memory and cursor over many asks, and 20 tool calls of one reply side by side; "
        "prints each figure beside a baseline measured in the same run, with the ratio and the "
        "target. Each figure is the median of several rounds that alternate with its "
        "baseline's, shown with its range (min-max); CPU-bound figures also as CPU time per "
        "operation, on which their targets are judged; the header gives the load average. On "
        "2 shared cores a full run takes about 9 minutes (a lead's 100,000 asks are half of "
        "it), --quick about 2.",
    )
    bench.add_argument(
        "--quick",
        action="store_true",
        help="smaller sizes and 3 rounds (depth 100k, not 1M; replay 150k, not 1M)",
    )
    bench.add_argument(
        "--rounds",
        type=positive_int,
        metavar="N",
        help="rounds of each figure (default: 5, or 3 with --quick but 5 for the round trip)",
    )
    bench.add_argument(
        "--save", metavar="FILE", help="also write the run to FILE as JSON (for --compare)"
    )
    bench.add_argument(
        "--compare",
        metavar="FILE",
        help="print each figure beside the one a run saved in FILE, with the change and "
        "whether it is outside the noise (the two runs' ranges do not overlap)",
    )
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.add_argument("--dir", help="where to put scratch teams (default: a temp dir)")
    bench.add_argument(
        "--store",
        metavar="URL",
        help="measure the Redis store instead, beside a raw redis-py floor on the same server: "
        "a redis:// URL, or `redis` to start a private redis-server",
    )
    bench.add_argument(
        "--only",
        choices=[
            *("sends", "sizes", "contention", "writers", "round_trips", "wakes", "depth"),
            *("agent", "team", "replay", "acks", "teamwork", "models", "startup"),
        ],
        help="run one group of measurements",
    )
    bench.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress on stderr (on a terminal, a line redrawn in place; otherwise one "
        "line per group of measurements started)",
    )
    bench.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)
    bench.set_defaults(run=cmd.bench)

    soak = commands.add_parser(
        "soak",
        help="run a team on Redis under random faults and count what its guarantees kept",
        description="Starts a private redis-server (append-only file, appendfsync always) "
        "behind a TCP proxy, teammates as `teamrt run-agent` processes and a raw consumer "
        "process, with this process as the lead asking tasks (each under an idempotency key) "
        "and sending messages. Every few seconds a fault picked at random: the server killed "
        "and restarted from its append-only file, the server paused, a partition (the proxy "
        "stops the bytes both ways), a teammate or the consumer killed, or paused past its "
        "lease while a replacement takes the lease over. Prints acknowledged sends lost, "
        "envelopes delivered twice or by a holder that had lost its lease, tasks run twice "
        "without an in-flight crash, teammate processes that exited, asks hung (each target "
        "0) and asks answered; exits 1 if a target is missed. Needs redis-server.",
    )
    soak.add_argument(
        "--seconds", type=seconds, default=600.0, help="how long faults go on (default 600)"
    )
    soak.add_argument("--seed", type=int, default=1, help="the faults' random seed (default 1)")
    soak.add_argument(
        "--every",
        type=seconds,
        default=8.0,
        metavar="SECONDS",
        help="mean time between two faults (default 8)",
    )
    soak.add_argument(
        "--fault",
        action="append",
        metavar="KIND",
        help="only this kind of fault (repeatable; default: every kind): server_kill, "
        "server_pause, partition, teammate_kill, teammate_pause, sink_kill, sink_pause",
    )
    soak.add_argument("--teammates", type=positive_int, default=2, help="default 2")
    soak.add_argument("--dir", help="keep the run's logs here (default: a temp dir, removed)")
    soak.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    soak.set_defaults(run=cmd.soak)

    run_agent = commands.add_parser(
        "run-agent",
        help="run one teammate in this process",
        description="Run one teammate on a team directory until it is asked to shut down. "
        "The spec names a Teammate (or a function returning one) as module:object. A member "
        "name runs in at most one process at a time, and must be in the team's roster (--join "
        "adds it). The teammate draws on the budget the team's lead published, enforces the "
        "deadline of the shutdown request it gets, waits out store outages (reconnecting after "
        "a long one), and exits with 1 if it crashed for good.",
    )
    run_agent.add_argument("dir", nargs="?", help=TEAM_HELP)
    run_agent.add_argument(
        "--agent-dir",
        help="where the member's journal and transcript go (default: the team directory's "
        "agents/, or ./agents for a team in a store URL)",
    )
    run_agent.add_argument("--name", required=True, help="the member name to run as")
    run_agent.add_argument("--spec", required=True, help="module:object, e.g. mypkg.team:writer")
    run_agent.add_argument("--lead", default="lead", help="who gets idle and crash notices")
    run_agent.add_argument(
        "--join", action="store_true", help="add the name to the team's roster if it is not there"
    )
    run_agent.add_argument(
        "--store-outage",
        type=seconds,
        default=DEFAULT_STORE_OUTAGE,
        metavar="SECONDS",
        help="how long the teammate waits out a network store that cannot be reached, keeping "
        "its incarnation (default: %(default)g); after a longer outage it reconnects and "
        "resumes its task from the journal",
    )
    run_agent.add_argument(
        "--exit-on-outage",
        action="store_true",
        help=f"exit with {EXIT_OUTAGE} after an outage longer than --store-outage instead of "
        "reconnecting (for a supervisor that restarts it)",
    )
    run_agent.set_defaults(run=cmd.run_agent, graceful=True)

    demo = commands.add_parser(
        "demo",
        help="run a demo on real file mailboxes (offline, or on a real model)",
        description="research-writer (default): a researcher reads the shipped notes and sends "
        "findings to a writer, who writes agent-loop.md. two-process: the same with the writer "
        "in its own process. service: a Starlette app runs the team in its lifespan. "
        "conductor: a planner and builders get a small Python package through its pytest "
        "checks. exchange: a lead and a worker in another process trade raw requests. "
        "two-hosts: a lead and a writer as two processes sharing only a Redis server (a "
        "private redis-server unless --store names one); the writer is killed mid-task and a "
        "new incarnation answers once the old lease has expired. "
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
        choices=["research-writer", "two-process", "two-hosts", "service", "conductor", "exchange"],
    )
    demo.add_argument(
        "--model",
        default="offline",
        choices=["offline", "openai"],
        help="offline: function models (default); openai: OpenAIModel from the "
        "environment (OPENAI_MODEL, OPENAI_API_KEY, OPENAI_BASE_URL)",
    )
    demo.add_argument("--dir", default="mailboxes", help="root for the demo's team directory")
    demo.add_argument(
        "--store",
        default=os.environ.get("TEAMRT_STORE") or None,
        help="run a demo (every one but exchange) with its inboxes in this store "
        "(redis://HOST:PORT/DB; the team is the demo's own); default: $TEAMRT_STORE",
    )
    demo.set_defaults(run=_demo, is_async=False)
    add_eval_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    nul = next((word for word in words if "\x00" in word), None)
    if nul is not None:  # (no process is given one: only a caller of main() can)
        print(f"teamrt: {nul!r}: an argument cannot hold a NUL character", file=sys.stderr)
        return 2
    try:
        args = build_parser().parse_args(words)
    except KeyboardInterrupt:
        return 130
    configure_logging(args.log_level)
    return execute(args)


if __name__ == "__main__":
    sys.exit(main())
