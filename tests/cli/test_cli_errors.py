"""Mistakes at the command line, run through the installed `teamrt` command as a user runs it:
each is one line on stderr saying what was wrong and what to do, exit code 2 for the caller's
mistake and 1 for a failure, and never a traceback. SIGINT and SIGTERM stop a running command
gracefully, with 130 and 143."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import pytest

from teamrt import FileMailboxes
from teamrt.cli.main import build_parser

# the console script beside this interpreter (what `pip install` puts on PATH), else the module
_SCRIPT = Path(sys.executable).with_name("teamrt")
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "teamrt"]
SPEC = "teamrt.demos.research_writer:writer"


def teamrt(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        check=False,
        stdin=subprocess.DEVNULL,
    )


async def _create(path: Path) -> None:
    async with FileMailboxes(path, members=["lead", "worker"]):
        pass


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A team `t` (lead, worker) and a plain file `afile`, side by side; the cases run here."""
    root = tmp_path_factory.mktemp("cli-errors")
    anyio.run(_create, root / "t")
    (root / "afile").write_text("not a directory\n")
    return root


SEND = ("send", "t", "--from", "lead", "--to", "worker")

# (arguments, exit code, words the one line must hold)
CASES: list[tuple[tuple[str, ...], int, str]] = [
    # a bad --spec, as in the README's example, in each way it can be bad
    (
        ("rerun", "t", "--agent", "lead", "--spec", "mypkg.team:writer"),
        2,
        "no module named 'mypkg'",
    ),
    (("run-agent", "t", "--name", "worker", "--spec", "nosuchmodule"), 2, "must be module:object"),
    (("run-agent", "t", "--name", "worker", "--spec", "teamrt:nothing"), 2, "has no 'nothing'"),
    (("run-agent", "t", "--name", "worker", "--spec", "teamrt:__version__"), 2, "not a Teammate"),
    (("run-agent", "t", "--name", "wroker", "--spec", SPEC), 2, "not a member"),
    (("run-agent", "t", "--name", "../w", "--spec", SPEC), 2, "invalid member name"),
    # a team directory that is a file, or not there
    (("inspect", "afile"), 2, "afile is a file, not a team directory"),
    (("replay", "afile"), 2, "afile is a file, not a team directory"),
    (("repair", "afile"), 2, "afile is a file, not a team directory"),
    (("rerun", "afile", "--agent", "lead"), 2, "afile is a file, not a team directory"),
    (("send", "afile", "--from", "lead", "--to", "worker", "--body", "1"), 2, "is a file"),
    (("inspect", "nowhere"), 1, "team.json is missing"),
    (("inspect", ""), 2, "an empty string"),
    (("rerun", "t", "--agent", "../lead"), 2, "invalid agent name (--agent)"),
    (("rerun", "t", "--agent", "ghost"), 2, "no transcript"),
    # replay's own arguments
    (("replay", "t", "--since", "yesterday"), 2, "--since 'yesterday' is not a time"),
    (("replay", "t", "--until", "inf"), 2, "not a time"),
    (("replay", "t", "-o", "missing/run.html"), 2, "there is no directory missing"),
    (("replay", "t", "-o", "afile/run.html"), 2, "there is no directory afile"),
    (("replay", "t", "-o", "."), 2, "is a directory; name a file"),
    (("replay", "t", "--format", "pdf"), 2, "invalid choice: 'pdf'"),
    # demo and bench pointed at a file
    (("demo", "--dir", "afile"), 2, "--dir afile is a file"),
    (("demo", "exchange", "--model", "openai"), 2, "has no model"),
    (("bench", "--dir", "afile"), 2, "--dir afile is a file"),
    # send: the body
    ((*SEND, "--body", "{bad"), 2, "--body is not JSON"),
    ((*SEND, "--body", "plain words"), 2, "or send plain text with --text"),
    ((*SEND,), 2, "one of the arguments --body --text is required"),
    ((*SEND, "--body", "1", "--text", "x"), 2, "not allowed with argument --body"),
    ((*SEND, "--body", "[" * 5000 + "]" * 5000), 2, "more than 200 levels deep"),
    ((*SEND, "--body", "[" * 300 + "]" * 300), 2, "more than 200 levels deep"),
    # send: who and to whom
    (("send", "t", "--from", "laed", "--to", "worker", "--body", "1"), 2, "--as-human"),
    (("send", "t", "--from", "a b", "--to", "worker", "--body", "1"), 2, "invalid sender"),
    (("send", "t", "--from", "lead", "--body", "1"), 2, "needs --to NAME"),
    (("send", "t", "--from", "lead", "--to", "ghost", "--body", "1"), 2, "no member 'ghost'"),
    (("send", "t", "--to", "worker", "--body", "1"), 2, "required: --from"),
    (
        ("send", "t", "--from", "lead", "--kind", "broadcast", "--to", "w", "--body", "1"),
        2,
        "drop --to",
    ),
    (
        (
            *("send", "t", "--from", "h", "--as-human", "--to", "worker", "--kind", "request"),
            *("--wait", "1", "--body", "1"),
        ),
        2,
        "needs an inbox for the answer",
    ),
    (
        ("send", "nowhere", "--from", "lead", "--to", "worker", "--body", "1"),
        1,
        "no team directory",
    ),
    # send: requests and responses
    ((*SEND, "--kind", "request", "--wait", "nan", "--body", "1"), 2, "not a positive number"),
    ((*SEND, "--kind", "request", "--wait", "-1", "--body", "1"), 2, "not a positive number"),
    ((*SEND, "--kind", "request", "--wait", "soon", "--body", "1"), 2, "not a positive number"),
    ((*SEND, "--wait", "5", "--body", "1"), 2, "--wait is only for --kind request"),
    ((*SEND, "--kind", "response", "--body", "1"), 2, "needs --in-reply-to"),
    ((*SEND, "--kind", "response", "--in-reply-to", "x" * 65, "--body", "1"), 2, "at most 64"),
    ((*SEND, "--in-reply-to", "abc", "--body", "1"), 2, "only for --kind response"),
    # the command itself
    ((), 2, "the following arguments are required: COMMAND"),
    (("sned",), 2, "invalid choice: 'sned'"),
    (("--log-level", "loud", "inspect", "t"), 2, "not a log level: 'loud'"),
    (("inspect", "t", "--jsn"), 2, "unrecognized arguments: --jsn"),
]


@pytest.fixture(scope="module")
def outcomes(place: Path) -> list[subprocess.CompletedProcess[str]]:
    """Every case run once, a few at a time (each is a process of its own; none writes)."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return list(pool.map(lambda case: teamrt(*case[0], cwd=place), CASES))


@pytest.mark.timeout(300)  # the first one waits for every case's process
@pytest.mark.parametrize("index", range(len(CASES)), ids=[words for _, _, words in CASES])
def test_a_mistake_is_one_line_and_an_exit_code(
    outcomes: list[subprocess.CompletedProcess[str]], index: int
) -> None:
    _, code, words = CASES[index]
    result = outcomes[index]
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stderr.count("\n") == 1, result.stderr  # one line
    assert result.stderr.startswith("teamrt"), result.stderr  # says which command
    assert words in result.stderr
    assert result.returncode == code, result.stderr


def test_what_a_refused_send_would_have_sent_is_not_written(place: Path) -> None:
    """The checks run before anything is written: the worker's inbox holds only good sends."""
    inbox = place / "t" / "inboxes" / "worker.jsonl"
    before = inbox.stat().st_size if inbox.exists() else 0
    assert teamrt(*SEND, "--body", "{bad", cwd=place).returncode == 2
    assert (
        teamrt("send", "t", "--from", "laed", "--to", "worker", "--body", "1", cwd=place).returncode
        == 2
    )
    assert (inbox.stat().st_size if inbox.exists() else 0) == before


def test_a_person_outside_the_roster_says_so_and_text_is_a_string(place: Path) -> None:
    sent = teamrt(
        "send",
        "t",
        "--from",
        "operator",
        "--as-human",
        "--to",
        "worker",
        "--text",
        "stop now",
        cwd=place,
    )
    assert sent.returncode == 0, sent.stderr
    envelope_id = sent.stdout.strip()
    line = next(
        raw
        for raw in (place / "t" / "inboxes" / "worker.jsonl").read_text().splitlines()
        if envelope_id in raw
    )
    assert '"sender":"operator"' in line and '"body":"stop now"' in line


def test_a_message_for_the_user_from_inside_a_task_group_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # e.g. `teamrt demo service` without the service extra: SystemExit with a sentence, raised
    # in the command's task group, reaches the runner inside an exception group
    from teamrt.cli.runner import execute

    async def needs_an_extra(args: object) -> int:
        raise SystemExit("the demo needs the service extra: pip install 'teamrt[service]'")

    args = build_parser().parse_args(["demo", "service"])
    args.run = needs_an_extra
    assert execute(args) == 1
    err = capsys.readouterr().err
    assert err == "teamrt demo: the demo needs the service extra: pip install 'teamrt[service]'\n"


def test_version_and_log_level() -> None:
    from teamrt import __version__

    result = teamrt("--version")
    assert (result.returncode, result.stdout.strip()) == (0, f"teamrt {__version__}")
    assert "--log-level" in teamrt("--help").stdout


def test_log_level_debug_logs_teamrt_to_stderr_and_shows_the_traceback(place: Path) -> None:
    """The one line stays; DEBUG adds teamrt's own log lines, where a failure's traceback is."""
    quiet = teamrt("send", "t", "--from", "lead", "--to", "ghost", "--body", "1", cwd=place)
    loud = teamrt(
        "--log-level",
        "debug",
        "send",
        "t",
        "--from",
        "lead",
        "--to",
        "ghost",
        "--body",
        "1",
        cwd=place,
    )
    assert quiet.returncode == loud.returncode == 2
    assert "DEBUG teamrt.cli: teamrt send failed" in loud.stderr
    assert "Traceback" in loud.stderr and "Traceback" not in quiet.stderr


def test_every_command_that_runs_a_team_runs_where_signals_are_handled() -> None:
    """Commands that run an event loop are coroutines, run by the one runner that turns SIGINT
    and SIGTERM into a graceful stop; the others hold no team."""
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert commands is not None
    runs = {name: sub.get_default("run") for name, sub in dict(commands).items()}
    coroutines = {name for name, run in runs.items() if inspect.iscoroutinefunction(run)}
    assert coroutines == {"send", "rerun", "run-agent", "demo", "eval", "soak"}


def _start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*COMMAND, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=cwd,
    )


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_run_agent_gracefully(tmp_path: Path, signum: int, code: int) -> None:
    """The teammate is asked to shut down (its team's exit does that), releases its lease, and
    the command exits 128 + the signal with one line saying why."""
    anyio.run(_create, tmp_path / "t")
    proc = _start(["run-agent", "t", "--name", "worker", "--spec", SPEC], tmp_path)
    try:
        assert proc.stdout is not None
        assert "running as incarnation" in proc.stdout.readline()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == code, err
    assert "Traceback" not in out + err
    assert err.strip() == (
        f"teamrt run-agent: {signal.Signals(signum).name} received, stopping "
        "(a second one stops at once)"
    )
    inspected = teamrt("inspect", "t", "--json", cwd=tmp_path)
    assert [agent["running"] for agent in json.loads(inspected.stdout)["agents"]] == [None, None]


def test_ctrl_c_while_send_waits_for_an_answer(tmp_path: Path) -> None:
    """`send --wait` to a member nobody runs yet waits; Ctrl-C ends the wait with 130."""
    anyio.run(_create, tmp_path / "t")
    proc = _start(
        [
            *("send", "t", "--from", "lead", "--to", "worker", "--kind", "request"),
            *("--wait", "60", "--body", '"may I?"'),
        ],
        tmp_path,
    )
    inbox = tmp_path / "t" / "inboxes" / "worker.jsonl"
    try:
        deadline = time.monotonic() + 30
        while not (inbox.exists() and inbox.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.01)  # the request is written, so the wait has begun
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "Traceback" not in out + err
    assert err.count("\n") == 1 and "SIGINT received" in err


def test_sigterm_stops_a_command_that_runs_no_team(tmp_path: Path) -> None:
    """`replay --follow` runs until stopped: SIGTERM ends it with one line and 143."""
    anyio.run(_create, tmp_path / "t")
    sent = teamrt("send", "t", "--from", "lead", "--to", "worker", "--text", "hi", cwd=tmp_path)
    assert sent.returncode == 0, sent.stderr
    proc = _start(["replay", "t", "--follow", "--color", "never"], tmp_path)
    try:
        assert proc.stdout is not None
        assert "lead -> worker" in proc.stdout.readline()  # following now
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, err
    assert err == "teamrt replay: SIGTERM received, stopped\n"
    assert "Traceback" not in out
