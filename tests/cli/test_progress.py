"""Progress for the long commands (`bench`, `replay`, `repair`): drawn on stderr when it is a
terminal (a pseudo-terminal here), nothing or a few plain lines when it is not, and stdout the
same byte for byte either way."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import anyio
import pytest

from teamrt import Envelope, FileMailboxes
from teamrt.cli.main import main
from teamrt.cli.progress import Progress, _bytes, on_terminal
from teamrt.cli.replay import _counted, run_replay
from teamrt.mail import open_view
from teamrt.replay import Filter, timeline
from tests.support.paths import SAMPLES

SAMPLE = SAMPLES / "research-writer"
# control characters other than a newline: what a terminal would act on
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f]")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _env() -> dict[str, str]:
    """The environment of a command run here: a terminal that can redraw, whatever the suite
    was started with."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TTY_", "COLUMNS", "LINES"))}
    env.pop("NO_COLOR", None)
    env.pop("FORCE_COLOR", None)
    env["TERM"] = "xterm-256color"
    return env


def piped(*args: str) -> subprocess.CompletedProcess[bytes]:
    """`teamrt ARGS` with stdout and stderr both pipes (not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "teamrt", *args],
        capture_output=True,
        timeout=240,
        env=_env(),
        check=False,
    )


def on_pty(*args: str, stdout: Path) -> tuple[int, str]:
    """`teamrt ARGS` with stderr on a pseudo-terminal (100 columns) and stdout into a file:
    the exit code and everything written to the terminal."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    with stdout.open("wb") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "teamrt", *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=terminal,
            env=_env(),
        )
    os.close(terminal)
    seen = bytearray()
    try:
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(controller)
    return child.wait(timeout=240), seen.decode("utf-8", "replace")


async def _team(path: Path, pairs: int) -> None:
    """A team with `pairs` requests from the lead to two workers, each answered."""
    async with FileMailboxes(path, members=["lead", "w1", "w2"]) as mail:
        requests = [
            Envelope.request("lead", f"w{1 + i % 2}", {"n": i}, type="task") for i in range(pairs)
        ]
        for request in requests:
            await mail.send(request)
        await mail.send_many([Envelope.response(r, {"done": r.body["n"]}) for r in requests])


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("progress") / "big"
    anyio.run(_team, path, 2_000)
    return path


def _reference(team: Path, fmt: str) -> bytes:
    """The timeline as the replay code writes it to a stream, with no progress at all."""
    out = io.StringIO()
    run_replay(str(team), fmt=fmt, keep=Filter(), follow=False, colour="never", out=out)
    return out.getvalue().encode()


# --- the helper ---------------------------------------------------------------------------


def test_not_a_terminal_gets_nothing_or_plain_lines() -> None:
    quiet_stream, plain_stream = io.StringIO(), io.StringIO()
    with Progress("job", unit="parts", stream=quiet_stream) as progress:
        assert not progress.drawn
        progress.section("first", 1, 2)
        progress.update(5, detail="x")
    with Progress("job", unit="parts", plain=True, stream=plain_stream) as progress:
        progress.section("first", 1, 2)
        progress.update(detail="anything")  # updates print nothing
        progress.section("second", 2, 2)
    assert quiet_stream.getvalue() == ""
    lines = plain_stream.getvalue().splitlines()
    assert [line.split(" (")[0] for line in lines] == ["job: first", "job: second"]
    assert lines[0].startswith("job: first (1/2, ") and lines[0].endswith(" s elapsed)")
    assert not CONTROL.search(plain_stream.getvalue())


def test_quiet_silences_even_a_terminal() -> None:
    terminal = Terminal()
    with Progress("job", plain=True, quiet=True, stream=terminal) as progress:
        progress.section("first", 1, 1)
    assert not progress.drawn and terminal.getvalue() == ""


def test_a_terminal_gets_a_line_redrawn_in_place_then_erased() -> None:
    terminal = Terminal()
    with Progress("replay t", total=4_000_000, unit="bytes", stream=terminal) as progress:
        assert progress.drawn
        progress.update(1_500_000, detail="7 events")
    text = terminal.getvalue()
    assert "replay t" in text and "1.5/4.0 MB" in text and "7 events" in text
    assert "\x1b[" in text  # drawn with escape sequences
    assert "\x1b[2K" in text.rsplit("7 events", 1)[1]  # and the line erased at the end


def test_a_dumb_or_closed_stream_is_no_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "dumb")
    assert not on_terminal(Terminal())
    monkeypatch.setenv("TERM", "xterm")
    assert on_terminal(Terminal())
    with open(os.devnull, "w") as closed:
        pass
    assert not on_terminal(closed)  # isatty() raises on a closed file


def test_amounts() -> None:
    assert _bytes(0, None) == "0 bytes"
    assert _bytes(512, 900) == "512/900 bytes"
    assert _bytes(12_345_678, 28_400_000) == "12.3/28.4 MB"
    assert _bytes(5, 1_500_000_000) == "0.0/1.5 GB"
    progress = Progress("bench", unit="groups")
    progress.section("sends", 3, 12)
    assert progress.amount() == "2/12 groups" and progress.title() == "bench: sends"
    assert Progress("x").amount() == "0"


def test_the_replay_watch_sees_every_event_and_every_byte(team: Path) -> None:
    progress = Progress("replay", unit="bytes")
    plain = [e.id for e in timeline(team, keep=Filter(types=("task",)))]
    watched = [
        e.id
        for e in timeline(
            team, keep=Filter(types=("task",)), watch=_counted(progress, open_view(team))
        )
    ]
    assert watched == plain and len(plain) == 2_000  # the same events, filtered the same
    size = sum(f.stat().st_size for f in (team / "inboxes").glob("*.jsonl"))
    assert progress.total == size and progress.done == size
    assert progress.detail == "4,000 events"  # all read, not only the 2,000 kept


# --- the commands, not on a terminal ------------------------------------------------------


@pytest.mark.parametrize("fmt", ["text", "json", "mermaid"])
def test_replay_piped_prints_the_timeline_and_nothing_else(team: Path, fmt: str) -> None:
    result = piped("replay", str(team), "--format", fmt)
    assert result.returncode == 0, result.stderr
    assert result.stdout == _reference(team, fmt)
    assert result.stderr == b""


def test_repair_and_replay_in_this_process_write_nothing_to_stderr(
    team: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["repair", str(team)]) == 0
    assert main(["replay", str(team), "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out.startswith("lead: nothing to repair\nw1: nothing to repair\n")


def test_bench_piped_says_each_group_on_one_plain_line(tmp_path: Path) -> None:
    result = piped("bench", "--smoke", "--json", "--only", "replay", "--dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["figures"]  # stdout is the JSON alone
    err = result.stderr.decode()
    assert err.startswith("teamrt bench: replay (1/1, ") and err.count("\n") == 1
    assert not CONTROL.search(err)
    quiet = piped("bench", "--smoke", "--json", "--only", "replay", "-q", "--dir", str(tmp_path))
    assert quiet.returncode == 0 and quiet.stderr == b""


# --- the commands, on a terminal ----------------------------------------------------------


@pytest.mark.parametrize("fmt", ["text", "json", "mermaid"])
def test_replay_on_a_terminal_shows_progress_and_the_same_stdout(
    team: Path, tmp_path: Path, fmt: str
) -> None:
    code, terminal = on_pty("replay", str(team), "--format", fmt, stdout=tmp_path / "out")
    assert code == 0, terminal
    assert (tmp_path / "out").read_bytes() == _reference(team, fmt)
    assert "replay big" in terminal and "4,000 events" in terminal  # the last frame
    size = sum(f.stat().st_size for f in (team / "inboxes").glob("*.jsonl"))
    assert _bytes(size, size) in terminal  # all of it read
    assert "\x1b[" in terminal


def test_replay_into_a_file_shows_progress_and_writes_the_same_page(
    team: Path, tmp_path: Path
) -> None:
    page = tmp_path / "run.html"
    code, terminal = on_pty(
        "replay", str(team), "--format", "html", "-o", str(page), stdout=tmp_path / "out"
    )
    assert code == 0, terminal
    assert "replay big" in terminal
    assert page.read_bytes() == _reference(team, "html")
    assert (tmp_path / "out").read_bytes() == b""


def test_a_recorded_run_with_journals_replays_the_same_on_a_terminal(tmp_path: Path) -> None:
    code, terminal = on_pty("replay", str(SAMPLE), stdout=tmp_path / "out")
    assert code == 0, terminal
    assert "replay research-writer" in terminal
    assert (tmp_path / "out").read_bytes() == _reference(SAMPLE, "text")
    assert piped("replay", str(SAMPLE)).stdout == _reference(SAMPLE, "text")


def test_quiet_replay_on_a_terminal_draws_nothing(team: Path, tmp_path: Path) -> None:
    code, terminal = on_pty("replay", str(team), "-q", stdout=tmp_path / "out")
    assert code == 0 and terminal == ""
    assert (tmp_path / "out").read_bytes() == _reference(team, "text")


def test_repair_on_a_terminal_says_which_inbox(team: Path, tmp_path: Path) -> None:
    code, terminal = on_pty("repair", str(team), "--json", stdout=tmp_path / "out")
    assert code == 0, terminal
    assert "repair big: w2" in terminal and "2/3 inboxes" in terminal  # the last frame
    reports = json.loads((tmp_path / "out").read_text())
    assert [r["name"] for r in reports] == ["lead", "w1", "w2"]
    assert all(r["ok"] for r in reports)


def test_bench_on_a_terminal_shows_the_group_it_measures(tmp_path: Path) -> None:
    code, terminal = on_pty(
        "bench",
        "--smoke",
        "--only",
        "replay",
        "--dir",
        str(tmp_path / "scratch"),
        stdout=tmp_path / "out",
    )
    assert code == 0, terminal
    assert "teamrt bench: replay" in terminal and "0/1 groups" in terminal
    assert "last: replay peak memory" in terminal  # the last frame: the last figure measured
    assert "\x1b[" in terminal
    table = (tmp_path / "out").read_text()
    assert table.startswith("teamrt bench on ") and not CONTROL.search(table)
