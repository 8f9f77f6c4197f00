"""Copies of a live team are whole: `export`, `replay` (every format, `--follow` too), `inspect`
and `fork` of a team that 12 writer processes are sending into, with 16 KiB segments rotating all
the time, each give every record up to the point where they stop, with no hole.

Each copy is checked dense: in every inbox, every seq from 0 to the highest it holds; for every
writer (each sends to one inbox, one envelope at a time), every count from 0 to the highest.

The writers are this file run as a program:
`python tests/cli/test_live_copies.py LOCATOR NAME TO DIR`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from teamrt import Envelope
from teamrt.errors import StoreCorrupt
from teamrt.mail import open_mailboxes, open_view
from teamrt.mail.filestore import FileMailboxes, InboxPaths
from teamrt.mail.filestore.view import FileView
from tests.support.paths import ROOT
from tests.support.redis_server import RedisServer, needs_redis, shared_redis

__all__ = ["shared_redis"]  # the fixture

INBOXES = ("lead", "worker")
WRITERS = tuple(f"w{k}" for k in range(12))
MEMBERS = (*INBOXES, *WRITERS)
SEGMENT = 16 << 10
PAD = "x" * 500  # a body the replay page shows whole (600 characters)
#: the writer processes import `tests` too, which a script run by its path does not find
WRITER_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

#: (inbox, seq, sender, count): one record of a copy (seq None where the format shows none)
Row = tuple[str, int | None, str, int]


async def _write(locator: str, name: str, to: str, directory: str) -> None:
    """Send to `to` one envelope at a time, numbered from 0, until `directory`/stop exists."""
    where = Path(directory)
    async with open_mailboxes(locator) as mail:
        (where / f"{name}.ready").touch()
        while not (where / "go").exists():  # noqa: ASYNC110 -- another process makes it
            await anyio.sleep(0.001)
        count = 0
        while not (where / "stop").exists():
            await mail.send(Envelope.message(name, to, {"i": count, "w": name, "pad": PAD}))
            count += 1
            await anyio.sleep(0.02)  # some hundreds a second in all: a rotation every ~0.1 s


def teamrt(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "teamrt", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class Writers:
    """12 writer processes, each sending to one inbox of the team at `locator`."""

    def __init__(self, locator: str, directory: Path) -> None:
        self.directory = directory
        directory.mkdir()
        self.procs = [
            subprocess.Popen(
                [sys.executable, __file__, locator, name, INBOXES[k % 2], str(directory)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=WRITER_ENV,
            )
            for k, name in enumerate(WRITERS)
        ]
        while not all((directory / f"{name}.ready").exists() for name in WRITERS):
            self.check()
            time.sleep(0.005)
        (directory / "go").touch()

    def check(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                _, err = proc.communicate()
                raise AssertionError(f"a writer ended ({proc.returncode}): {err.decode()}")

    def stop(self) -> None:
        (self.directory / "stop").touch()
        for proc in self.procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode()

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def assert_dense(rows: Iterable[Row], what: str, *, first: bool = True) -> dict[str, int]:
    """Every seq of every inbox from 0 to its highest, every writer's count from 0 to its
    highest (with `first` False: from its lowest); returns the highest seq per inbox."""
    seqs: dict[str, list[int]] = defaultdict(list)
    counts: dict[str, list[int]] = defaultdict(list)
    for inbox, seq, sender, count in rows:
        if seq is not None:
            seqs[inbox].append(seq)
        counts[sender].append(count)
    assert counts, f"{what}: nothing copied"
    for inbox, found in seqs.items():
        low = 0 if first else min(found)
        missing = sorted(set(range(low, max(found) + 1)) - set(found))
        assert not missing, (
            f"{what}: {len(missing)} of {max(found) + 1 - low} seqs missing in {inbox}'s "
            f"inbox (from {missing[0]})"
        )
        assert len(found) == len(set(found)), f"{what}: a seq twice in {inbox}'s inbox"
    for sender, found in counts.items():
        missing = sorted(set(range(0 if first else min(found), max(found) + 1)) - set(found))
        assert not missing, f"{what}: {len(missing)} of {sender}'s envelopes missing"
    return {inbox: max(found) for inbox, found in seqs.items()}


def _directory_rows(team: Path) -> Iterator[Row]:
    with FileView(team) as view:
        for name in INBOXES:
            for entry in view.scan(name):
                record = json.loads(entry.raw)
                body = record["body"]
                yield name, record["seq"], body["w"], body["i"]


def _event_rows(events: Iterable[dict[str, Any]]) -> Iterator[Row]:
    for event in events:
        if "summary" in event:
            continue
        assert event["kind"] == "message", event
        yield event["inbox"], event["seq"], event["sender"], event["body"]["i"]


def _json_lines(text: str) -> list[dict[str, Any]]:
    """The complete lines of a JSON-lines file that may be being written."""
    return [json.loads(line) for line in text.split("\n")[:-1]]


_TEXT_LINE = re.compile(r'^\S+\s+(\S+) -> (\S+)\s+message .*\{"i": (\d+),')
_MERMAID_LINE = re.compile(r'^\s+(\w+)->>(\w+): text: \{"i": (\d+),')


def _matched(lines: Iterable[str], pattern: re.Pattern[str], skip: str) -> Iterator[Row]:
    for line in lines:
        m = pattern.match(line)
        if m is None:
            assert re.match(skip, line), f"unexpected line {line!r}"
            continue
        yield m.group(2), None, m.group(1), int(m.group(3))


def _assert_dense_page(page: str, what: str) -> None:
    """A page holds the first rows of the timeline, then (past its row limit) the flagged ones
    and the latest: the first from 0, the latest each an unbroken run."""
    start = page.index('<script id="events" type="application/json">') + 44
    rows = json.loads(page[start : page.index("</script>", start)])
    head = next((i for i, row in enumerate(rows) if row["n"] != i), len(rows))
    assert_dense(_event_rows(rows[:head]), what)
    if head < len(rows):
        assert all(not row["flags"] for row in rows[head:]), "no row is flagged here"
        assert_dense(_event_rows(rows[head:]), f"{what}, its latest rows", first=False)


_TEXT_OTHER = r"^$|^\d+ envelopes|^  (w\d+|lead|worker):"
_MERMAID_OTHER = r"^$|^sequenceDiagram|^\s+participant "


def copy_once(source: str, tmp: Path, round_: int) -> None:
    """Every kind of copy of the live team at `source`, all at once, each checked dense."""
    out = tmp / f"round{round_}"
    out.mkdir()
    with open_view(source) as view:
        team = view.team
        at = json.loads(list(view.scan("worker"))[-1].raw)["id"]  # sent lately: to fork at
    formats = ("json", "text", "mermaid", "html")
    commands = {
        "export": ("export", source, str(out / "export" / team)),
        "inspect": ("inspect", source, "--json"),
        "fork": ("fork", source, str(out / "fork"), "--at", at, "--json"),
    } | {
        f"replay --format {fmt}": (
            *("replay", source, "--format", fmt, "--color", "never"),
            *("-q", "-o", str(out / f"replay.{fmt}")),
        )
        for fmt in formats
    }
    runs = {what: teamrt(*args) for what, args in commands.items()}
    stdout = {}
    for what, proc in runs.items():
        output, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"{what}: {err}"
        stdout[what] = output
    what = f"(round {round_})"
    for copy in (out / "export" / team, out / "fork"):
        highest = assert_dense(_directory_rows(copy), f"{copy.name} {what}")
        named = json.loads((copy / "export.json").read_text())["inboxes"]  # the point it names
        assert {name: named[name]["last_seq"] for name in INBOXES} == highest
        assert all(named[name]["records"] == highest[name] + 1 for name in INBOXES)
    for inbox in json.loads(stdout["inspect"])["inboxes"]:
        if inbox["name"] in INBOXES:
            assert inbox["corrupt_lines"] == 0
            assert inbox["depth"] == inbox["last_seq"] + 1, f"inspect {what}: {inbox}"
    text = {fmt: (out / f"replay.{fmt}").read_text() for fmt in formats}
    events = _json_lines(text["json"])
    assert_dense(_event_rows(events), f"replay --format json {what}")
    assert set(events[-1]["summary"]["read_to"]) == set(INBOXES)  # where it stopped
    lines = text["text"].split("\n")
    assert_dense(_matched(lines, _TEXT_LINE, _TEXT_OTHER), f"replay --format text {what}")
    lines = text["mermaid"].split("\n")
    assert_dense(_matched(lines, _MERMAID_LINE, _MERMAID_OTHER), f"replay --format mermaid {what}")
    _assert_dense_page(text["html"], f"replay --format html {what}")


def _segments(team: Path, name: str) -> int:
    return InboxPaths(team / "inboxes", name).rotated_count()


def _follow(source: str, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "teamrt", "replay", source),
            *("--format", "json", "--follow", "-q", "-o", str(out)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _follow_to_the_end(proc: subprocess.Popen[bytes], out: Path, ends: dict[str, int]) -> None:
    """Wait until the follower has printed every inbox's last seq, stop it, check it dense."""
    while True:
        assert proc.poll() is None, proc.communicate()[1].decode()
        events = _json_lines(out.read_text()) if out.exists() else []
        got: dict[str, int] = {}
        for event in events:
            got[event["inbox"]] = max(got.get(event["inbox"], -1), event["seq"])
        if got == ends:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert assert_dense(_event_rows(_json_lines(out.read_text())), "replay --follow") == ends


def _run(source: str, tmp: Path, rounds: int, rotated: Any) -> None:
    writers = Writers(source, tmp / "writers")
    try:
        follower = _follow(source, tmp / "follow.jsonl")
        while not rotated():  # the copies start with the rotations under way
            writers.check()
            time.sleep(0.01)
        for round_ in range(rounds):
            copy_once(source, tmp, round_)
            writers.check()
        writers.stop()
    finally:
        writers.kill()
    with open_view(source) as view:
        ends = {name: json.loads(list(view.scan(name))[-1].raw)["seq"] for name in INBOXES}
    _follow_to_the_end(follower, tmp / "follow.jsonl", ends)


def _file_team(tmp_path: Path, rounds: int) -> None:
    team = tmp_path / "live"
    anyio.run(_create, team)
    _run(str(team), tmp_path, rounds, lambda: _segments(team, "worker") >= 4)
    assert _segments(team, "worker") > 5  # it went on rotating while the copies ran


def test_copies_of_a_team_rotating_under_12_writers_are_dense(tmp_path: Path) -> None:
    _file_team(tmp_path, rounds=1)


@needs_redis
def test_copies_of_a_redis_team_under_12_writers_are_dense(
    shared_redis: RedisServer, tmp_path: Path
) -> None:
    url = shared_redis.url()
    anyio.run(_create, url)

    def written() -> bool:
        with open_view(url) as view:
            return view.end("worker")[1] >= 500

    _run(url, tmp_path, 1, written)


@pytest.mark.stress
@pytest.mark.timeout(600)  # ten rounds: about two minutes on a loaded machine
def test_copies_stay_dense_over_many_rounds(tmp_path: Path, stress: bool) -> None:
    if not stress:
        pytest.skip("ten rounds of every copy under 12 writers: run with --stress")
    _file_team(tmp_path, rounds=10)


async def _send(mail: FileMailboxes, first: int, count: int) -> None:
    for i in range(first, first + count):
        await mail.send(Envelope.message("w0", "worker", {"i": i, "w": "w0", "pad": "x" * 100}))


def _seqs(entries: Iterable[Any]) -> list[int]:
    return [json.loads(entry.raw)["seq"] for entry in entries]


async def test_a_scan_crosses_the_rotations_made_while_it_reads(tmp_path: Path) -> None:
    """Rotations between a scan's start and its reaching the active file: the scan carries
    on from segment to segment (a listing taken at the start would skip the segments rotated
    since), and a scan after where it ended carries on with no gap."""
    async with FileMailboxes(tmp_path / "t", members=MEMBERS, segment_bytes=600) as mail:
        await _send(mail, 0, 20)
        with FileView(tmp_path / "t") as view:
            scan = view.scan("worker")
            first = next(scan)
            await _send(mail, 20, 40)  # some ten rotations
            entries = [first, *scan]
            assert _seqs(entries) == list(range(len(entries)))
            assert len(entries) >= 20  # at least what was there when it started
            await _send(mail, 60, 5)
            rest = list(view.scan("worker", after=entries[-1].end))
            assert _seqs(entries + rest) == list(range(65))
            assert view.end("worker") == rest[-1].end
        assert InboxPaths(tmp_path / "t" / "inboxes", "worker").rotated_count() > 10


async def test_a_scan_at_every_step_of_a_rotation_is_a_dense_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scan started, resumed or ended between the link and the rename of a rotation (the
    segment and the active name one file) yields every record once, in order."""
    team = tmp_path / "t"
    steps: list[str] = []
    async with FileMailboxes(team, members=MEMBERS, segment_bytes=600) as mail:
        with FileView(team) as view:
            read: list[Any] = []
            real_link, real_rename = os.link, os.rename

            def check(step: str) -> None:
                steps.append(step)
                whole = list(view.scan("worker"))
                assert _seqs(whole) == list(range(len(whole))), step
                read.extend(view.scan("worker", after=read[-1].end if read else None))
                assert _seqs(read) == _seqs(whole), step
                end = view.end("worker")
                assert not whole or end == whole[-1].end or end[1] == 0, step

            def link(*args: Any, **kwargs: Any) -> None:
                check("before link")
                real_link(*args, **kwargs)
                check("after link")

            def rename(*args: Any, **kwargs: Any) -> None:
                check("before rename")
                real_rename(*args, **kwargs)
                check("after rename")

            monkeypatch.setattr(os, "link", link)
            monkeypatch.setattr(os, "rename", rename)
            await _send(mail, 0, 30)
            monkeypatch.undo()
            read.extend(view.scan("worker", after=read[-1].end))
            assert _seqs(read) == list(range(30))
    assert steps.count("after link") >= 5


async def test_a_hole_in_the_log_is_an_error_not_a_shorter_copy(tmp_path: Path) -> None:
    """A segment missing while later ones exist, or a file shorter than where a scan resumes:
    `StoreCorrupt` naming `teamrt repair`, from the view and from every command."""
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS, segment_bytes=600) as mail:
        await _send(mail, 0, 30)
    paths = InboxPaths(team / "inboxes", "worker")
    with FileView(team) as view:
        end = list(view.scan("worker"))[-1].end
        os.truncate(paths.log, 0)
        with pytest.raises(StoreCorrupt, match=r"shorter than the position.*teamrt repair"):
            list(view.scan("worker", after=end))
        paths.segment(1).unlink()
        with pytest.raises(StoreCorrupt, match=r"000001\.jsonl is missing.*teamrt repair"):
            list(view.scan("worker"))
    for command in (
        ("export", str(team), str(tmp_path / "copy" / "t")),
        ("replay", str(team), "--format", "json"),
        ("inspect", str(team)),
    ):
        done = teamrt(*command)
        _, err = done.communicate(timeout=120)
        assert done.returncode != 0, command
        assert "000001.jsonl is missing" in err and "teamrt repair" in err, err


async def test_a_fork_of_an_inbox_that_shrinks_while_it_is_copied_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork reads each inbox twice (to choose the cut, then to copy it): a second read
    shorter than the first (the log was truncated meanwhile) is `StoreCorrupt`, no fork."""
    from teamrt.fork import fork_team

    async with FileMailboxes(tmp_path / "t", members=MEMBERS, segment_bytes=600) as mail:
        await _send(mail, 0, 30)
    at = json.loads(list(FileView(tmp_path / "t").scan("worker"))[-1].raw)["id"]
    scan, reads = FileView.scan, []

    def shrinking(view: FileView, name: str, after: Any = None) -> Iterator[Any]:
        reads.append(name)
        entries = list(scan(view, name, after))
        return iter(entries[:-3] if reads.count("worker") > 1 and name == "worker" else entries)

    monkeypatch.setattr(FileView, "scan", shrinking)
    with pytest.raises(StoreCorrupt, match="27 records now, but 30"):
        fork_team(tmp_path / "t", at, tmp_path / "fork")
    assert not (tmp_path / "fork").exists()


async def _create(locator: str | Path) -> None:
    if isinstance(locator, Path):
        async with FileMailboxes(locator, members=MEMBERS, segment_bytes=SEGMENT):
            return
    async with open_mailboxes(locator, members=MEMBERS):
        return


if __name__ == "__main__":
    locator, name, to, directory = sys.argv[1:5]
    anyio.run(_write, locator, name, to, directory)
