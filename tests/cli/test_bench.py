"""`teamrt bench` as something to trust: rounds with ranges, CPU time per operation, the load in
the header, a run saved and compared, the lean os.pipe child, the raw inotify floor, the backlog
written as real segments. Sizes are tiny and nothing here asserts how fast anything was."""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from teamrt import FileMailboxes
from teamrt.bench import GROUPS
from teamrt.bench import inotify as bench_inotify
from teamrt.bench import stats as bench_stats
from teamrt.bench.backlog import write_segments
from teamrt.bench.baselines import PIPE_CHILD, PipeChild
from teamrt.bench.harness import Sizes
from teamrt.bench.mailboxes import placements
from teamrt.bench.stats import Figure
from teamrt.cli.main import build_parser
from teamrt.envelopes import Envelope
from teamrt.replay.events import WINDOW


def bench(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "teamrt", "bench", "--smoke", "-q", *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
        check=False,
    )


# --- rounds, ranges, CPU time and the machine --------------------------------------------


@pytest.mark.stress
@pytest.mark.timeout(240)
def test_each_figure_has_its_rounds_range_and_cpu_time(tmp_path: Path) -> None:
    result = bench("--only", "sends", "--rounds", "3", "--json", "--dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    run = json.loads(result.stdout)
    meta = run["meta"]
    assert meta["rounds"] == 3 and meta["mode"] == "smoke" and meta["only"] == "sends"
    assert len(meta["load_start"]) == 3 and len(meta["load_end"]) == 3
    assert meta["cpus"] >= 1 and meta["cpus_usable"] >= 1 and meta["python"]
    assert [g["name"] for g in meta["groups"]] == ["sends"]
    assert len(meta["probe_us"]) == 2 and all(x > 0 for x in meta["probe_us"])  # per group, end
    figures = {f["name"]: f for f in run["figures"]}
    for figure in figures.values():
        assert figure["group"] == "sends" and figure["rounds"] == 3
        assert len(figure["samples"]) == 3
        low, high = figure["range"]
        assert low == min(figure["samples"]) and high == max(figure["samples"])
        assert low <= figure["value"] <= high
    for name in ("awaited sends, durability none", "batched sends (100 per batch)"):
        figure = figures[name]
        assert len(figure["cpu"]) == 3 and figure["cpu_us"] > 0  # CPU-bound: CPU time too
        assert len(figure["baseline_cpu"]) == 3  # and its baseline's
        assert figure["ok"] is not None and "of CPU" in figure["target"]
    assert not figures["awaited sends, durability fsync"]["cpu"]  # it waits on the disk


@pytest.mark.stress
@pytest.mark.timeout(240)
def test_the_largest_team_is_started_once_and_judged_like_the_others(tmp_path: Path) -> None:
    """The run's largest team (10,000 in a real run, 40 in a smoke run) starts once: its idle
    CPU has a sample per round, its wake-up is judged against a team of 2, and its start, stop
    and open files are shown."""
    result = bench("--only", "team", "--rounds", "2", "--json", "--dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    figures = {f["name"]: f for f in json.loads(result.stdout)["figures"]}
    idle = figures["40 idle teammates: CPU while idle"]
    assert len(idle["samples"]) == 2 and idle["baseline"] == "this process idle, no team"
    wake = figures["wake one teammate among 40 (task round trip), p50"]
    assert wake["baseline"] == "same in a team of 2" and wake["ok"] is not None
    for name in ("40 teammates: start", "40 teammates: stop (each asked to)"):
        assert figures[name]["value"] > 0
    assert any(name.startswith("40 teammates: files open (limit ") for name in figures)


@pytest.mark.timeout(240)
def test_the_table_says_the_load_and_each_range(tmp_path: Path) -> None:
    result = bench("--only", "agent", "--dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("teamrt bench on ") and "2 rounds" in lines[0]
    assert lines[1].startswith("load average (1, 5, 15 min): ")
    assert "a fixed Python loop (the probe): " in lines[1]
    heading = next(line for line in lines if line.startswith("measurement"))
    assert heading.split() == [
        *("measurement", "median", "range", "CPU/op", "baseline", "median", "range", "ratio"),
        "target",
    ]
    row = next(line for line in lines if line.startswith("agent step, checkpointed, at step 10"))
    assert " us (" in row  # CPU time with its range


def test_only_offers_every_group_and_no_other() -> None:
    """The parser names the groups itself (`teamrt --help` does not load the benchmarks): the
    same groups, in the order they run."""
    commands = next(
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    only = next(a for a in commands.choices["bench"]._actions if a.dest == "only")
    assert only.choices is not None and tuple(only.choices) == GROUPS


def test_sizes_fill_what_they_compare() -> None:
    for quick in (True, False):
        sizes = Sizes.pick(quick=quick, smoke=False)
        # replay's memory is compared between two sizes that both fill its windows of recent
        # ids (one per inbox, three inboxes)
        assert sizes.replay_small // 3 > WINDOW and sizes.replay_large > sizes.replay_small
        # the deep backlog spans several segments of the team's size
        assert sizes.depth_large * 200 > 2 * sizes.segment_bytes
    assert Sizes.pick(quick=False, smoke=False).depth_large == 1_000_000
    assert Sizes.pick(quick=True, smoke=False).rounds >= 3


# --- saved and compared ------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_a_saved_run_is_compared_figure_by_figure(tmp_path: Path) -> None:
    saved = tmp_path / "before.json"
    first = bench("--only", "agent", "--save", str(saved), "--dir", str(tmp_path / "scratch"))
    assert first.returncode == 0, first.stderr
    run = json.loads(saved.read_text())
    assert run["format"] == bench_stats.SAVED_FORMAT
    assert run["meta"]["rounds"] == 2 and run["meta"]["cpu_model"] is not None
    names = [f["name"] for f in run["figures"]]
    assert names and all(len(f["samples"]) == 2 for f in run["figures"])

    again = bench("--only", "agent", "--rounds", "3", "--compare", str(saved), "--json")
    assert again.returncode == 0, again.stderr
    compared = json.loads(again.stdout)["compare"]
    assert compared["file"] == str(saved) and compared["not_run"] == []
    assert [row["name"] for row in compared["figures"]] == names
    assert compared["machine_change"] > -1
    late = next(
        row for row in compared["figures"] if row["name"].endswith("at step 40: whole step")
    )
    assert late["ratio_verdict"] in {"better", "WORSE", "noise"}  # beside its baseline
    for row in compared["figures"]:
        assert row["verdict"] in {"better", "WORSE", "noise"}
        assert row["cpu_verdict"] in {"better", "WORSE", "noise"}
        speed = 1 + compared["machine_change"]
        assert row["cpu_net_change"] == pytest.approx(row["cpu_now"] / row["cpu_saved"] / speed - 1)
        assert row["change"] == pytest.approx((row["now"] - row["saved"]) / row["saved"])

    text = bench("--only", "agent", "--compare", str(saved))
    assert text.returncode == 0, text.stderr
    shown = text.stdout[text.stdout.index("compared with ") :]
    assert "with 2 and 2 rounds an unchanged figure does that by chance 1 time in 3" in shown
    assert all(name in shown for name in names)


def test_compare_refuses_what_is_not_a_saved_run(tmp_path: Path) -> None:
    missing = bench("--compare", str(tmp_path / "nothing.json"))
    assert missing.returncode == 2 and "no such file" in missing.stderr
    assert missing.stderr.count("\n") == 1 and missing.stdout == ""
    other = tmp_path / "other.json"
    other.write_text('{"figures": []}')
    wrong = bench("--compare", str(other))
    assert wrong.returncode == 2 and "not a run saved by this teamrt bench" in wrong.stderr
    nowhere = bench("--save", str(tmp_path / "no" / "such" / "dir.json"))
    assert nowhere.returncode == 2 and "no directory" in nowhere.stderr
    rounds = bench("--rounds", "0")
    assert rounds.returncode == 2 and "not a positive whole number" in rounds.stderr


def test_a_change_is_real_only_when_the_ranges_do_not_overlap() -> None:
    assert bench_stats.verdict([110, 120], [90, 100], "/s") == "better"
    assert bench_stats.verdict([110, 120], [90, 100], "us") == "WORSE"
    assert bench_stats.verdict([80, 85], [90, 100], "us") == "better"
    assert bench_stats.verdict([95, 120], [90, 100], "/s") == "noise"
    assert bench_stats.verdict([95], [90, 100], "/s") == "1 round"
    assert bench_stats.chance(3, 3) == pytest.approx(1 / 10)
    assert bench_stats.chance(5, 5) == pytest.approx(1 / 126)

    now = [Figure.of("a", [10, 12, 11], "us", cpu=[5, 6, 7]), Figure.of("new", [1, 2], "ms")]
    other = Figure.of("another group's", [1, 2], "us")
    other.group = "depth"
    saved = {
        "format": bench_stats.SAVED_FORMAT,
        "meta": {"mode": "smoke", "rounds": 2, "probe_us": [2.0, 2.0]},
        "figures": [
            Figure.of("a", [20, 22], "us", cpu=[5.5, 6.5]).as_json(),
            Figure.of("gone", [1, 2], "us").as_json(),
            other.as_json(),  # not run now: --only ran another group
        ],
    }
    compared = bench_stats.comparison(now, saved, "saved.json")
    a, new = compared["figures"]
    assert a["verdict"] == "better" and a["change"] == pytest.approx(11 / 21 - 1)
    assert a["cpu_verdict"] == "noise" and a["cpu_now"] == 6
    assert compared["machine_change"] is None  # no probes now: CPU times taken as they are
    # the machine runs Python 1.5x slower now: CPU times that did not grow with it are better
    # net of it, but not as measured, so not called better
    slower = bench_stats.comparison(now, saved, "saved.json", [3.0])
    assert slower["machine_change"] == pytest.approx(0.5)
    a = slower["figures"][0]
    assert a["cpu_change"] == pytest.approx(0.0) and a["cpu_net_change"] == pytest.approx(-1 / 3)
    assert a["cpu_verdict"] == "noise"
    faster = Figure.of("a", [10, 12, 11], "us", cpu=[2, 2.5, 3])  # better both ways
    assert bench_stats.comparison([faster], saved, "s", [3.0])["figures"][0]["cpu_verdict"] == (
        "better"
    )
    assert new["saved"] is None and compared["not_run"] == ["gone"]
    lines = bench_stats.comparison_lines(slower, {"mode": "smoke", "rounds": 3})
    assert any("a fixed Python loop took +50.0% of the saved run's CPU time" in x for x in lines)
    assert any("not in the saved run" in line for line in lines)
    assert lines[-1] == "in the saved run, not measured now: gone"
    ratios = Figure.of("r", [10, 20], "us", "base", [5, 10])
    assert ratios.ratios == [2.0, 2.0]  # round by round
    again = bench_stats.comparison(
        [Figure.of("r", [30, 60], "us", "base", [15, 30])],
        {"format": 1, "meta": {}, "figures": [ratios.as_json()]},
        "s",
    )["figures"][0]
    assert again["verdict"] == "WORSE" and again["ratio_verdict"] == "noise"  # the machine moved


# --- the lean os.pipe child ----------------------------------------------------------------


def test_the_pipe_child_imports_only_the_standard_library() -> None:
    tree = ast.parse(PIPE_CHILD.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module is not None
            imported.add(node.module.split(".")[0])
    assert imported <= {"__future__", "asyncio", "os", "struct", "sys", "time", "array"}


async def test_the_pipe_child_says_it_is_ready_then_echoes_and_wakes() -> None:
    async with PipeChild("echo") as echo:
        before = await echo.cpu()
        times = await echo.ping_pong(5)
        assert len(times) == 5 and all(t > 0 for t in times)
        assert await echo.cpu() >= before
    async with PipeChild("wake") as wake:
        assert len(await wake.wakes(3, 0.001)) == 3
        assert len(await wake.wakes(2, 0.001)) == 2  # each report holds the wakes since the last


# --- the round-trip floor: a minimal mailbox on raw inotify --------------------------------


def _stdlib_imports(path: Path) -> set[str]:
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module is not None
            imported.add(node.module.split(".")[0])
    return imported


def test_the_inotify_child_imports_only_the_standard_library() -> None:
    imported = _stdlib_imports(bench_inotify.CHILD)
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}
    assert "teamrt" not in imported and "anyio" not in imported


async def test_the_inotify_floor_answers_requests_and_says_its_cpu(tmp_path: Path) -> None:
    async with bench_inotify.InotifyChild(tmp_path / "floor") as floor:
        before = await floor.cpu()
        assert await floor.request({"echo": [1, 2]}) == {"echo": [1, 2]}
        times = await floor.ping_pong(5)
        assert len(times) == 5 and all(t > 0 for t in times)
        assert await floor.cpu() >= before
    assert floor.proc is not None and floor.proc.returncode == 0  # it stopped when asked
    # what went through it is a mailbox: one JSON line per message in each inbox, none lost
    requests = (tmp_path / "floor" / "echo.jsonl").read_bytes().splitlines()
    answers = (tmp_path / "floor" / "lead.jsonl").read_bytes().splitlines()
    assert len(requests) == 1 + 1 + 5 + 1 + 1  # cpu, one, five, cpu, stop
    assert len(answers) == 1 + 1 + 1 + 5 + 1  # ready, then each request's answer
    assert [json.loads(line)["reply_to"] for line in answers[1:]] == [
        json.loads(line)["id"] for line in requests[:-1]
    ]


async def test_a_raw_mailbox_reads_a_line_written_in_pieces(tmp_path: Path) -> None:
    bench_inotify.RawMailbox.create(tmp_path, "a", "b")
    a, b = bench_inotify.RawMailbox(tmp_path, "a"), bench_inotify.RawMailbox(tmp_path, "b")
    got: list[dict[str, object]] = []

    async def receive() -> None:
        got.append(await b.receive())

    try:
        with (tmp_path / "b.jsonl").open("ab", buffering=0) as f:
            async with anyio.create_task_group() as tg:
                tg.start_soon(receive)
                f.write(b'{"n": ')  # half a line wakes the reader, which keeps it for later
                await anyio.sleep(0.01)
                f.write(b"1}\n")
        a.send("b", {"n": 2})
        assert got == [{"n": 1}] and await b.receive() == {"n": 2}
    finally:
        a.close()
        b.close()


@pytest.mark.stress
@pytest.mark.timeout(240)
def test_the_round_trip_is_judged_against_the_inotify_floor(tmp_path: Path) -> None:
    result = bench("--only", "round_trips", "--json", "--dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    figures = {f["name"]: f for f in json.loads(result.stdout)["figures"]}
    two_cores = len(os.sched_getaffinity(0)) >= 2
    judged = "on two cores" if two_cores else "as the scheduler places them"
    for where in ("as the scheduler places them", "on two cores", "on one core"):
        name = f"request -> response, p50, {where}, against a minimal mailbox on raw inotify"
        if where != "as the scheduler places them" and not two_cores:
            assert name not in figures
            continue
        floor = figures[name]
        assert floor["baseline"] == "raw inotify mailbox round trip, p50"
        assert len(floor["baseline_samples"]) == 2 and floor["baseline_value"] > 0
        assert floor["ratio"] == pytest.approx(floor["value"] / floor["baseline_value"])
        if where == judged:
            assert floor["target"] == "<= 1.3x the floor" and floor["ok"] is not None
        else:
            assert floor["target"] == "" and floor["ok"] is None
        for side in ("requesting", "answering"):
            cpu = figures[
                f"request -> response: CPU per exchange, {side} process, {where}, against the floor"
            ]
            assert len(cpu["baseline_samples"]) == 2 and cpu["baseline_value"] > 0
    placed = "request -> response, p50, as the scheduler places them, against a minimal mailbox"
    assert (
        figures[f"{placed} on raw inotify"]["value"]
        == (figures["request -> response across processes, p50"]["value"])
    )
    table = bench("--only", "round_trips", "--dir", str(tmp_path))
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if f"p50, {judged}, against" in line)
    assert "x  <= 1.3x the floor" in row  # the ratio, then the target


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_round_trips_are_pinned_to_two_cores_then_one_and_let_go_after() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        mine, theirs = os.sched_getaffinity(0), os.sched_getaffinity(child.pid)
        here, there = sorted(mine)[:2]
        placed = placements([child.pid])
        assert [(suffix, where) for suffix, where, _ in placed] == [
            ("", "as the scheduler places them"),
            ("_2", "on two cores"),
            ("_1", "on one core"),
        ]
        for (_, _, place), cpus in zip(
            placed, ((mine, theirs), ({here}, {there}), ({here}, {here})), strict=True
        ):
            with place():
                assert (os.sched_getaffinity(0), os.sched_getaffinity(child.pid)) == cpus
            assert (os.sched_getaffinity(0), os.sched_getaffinity(child.pid)) == (mine, mine)
    finally:
        child.kill()
        child.wait()


def test_round_trips_run_as_placed_with_one_cpu_or_no_affinity(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert [suffix for suffix, _, _ in placements([])] == [""]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})

    def refuse(pid: int, cpus: object) -> None:
        raise PermissionError(1, "not permitted")

    monkeypatch.setattr(os, "sched_setaffinity", refuse)
    assert [suffix for suffix, _, _ in placements([12345])] == [""]


# --- the backlog as real segments ------------------------------------------------------------


async def test_a_backlog_is_written_as_segments_the_store_reads(tmp_path: Path) -> None:
    team, segment, room = tmp_path / "deep", 16 << 10, 4 << 10
    async with FileMailboxes(team, members=["lead", "sink"], segment_bytes=segment):
        pass
    closed = write_segments(team, "sink", 500, segment, room)
    inboxes = team / "inboxes"
    segments = sorted(inboxes.glob("sink.0*.jsonl"))
    assert closed == len(segments) >= 3
    assert all(path.stat().st_size >= segment for path in segments)
    assert (inboxes / "sink.jsonl").stat().st_size <= segment - room
    async with FileMailboxes(team) as mail:
        inbox = mail.inbox("sink")
        seqs = []
        while True:
            try:
                seqs.append(inbox.receive_nowait().seq)
            except anyio.WouldBlock:
                break
        assert seqs == list(range(500))
        await mail.send(Envelope.message("lead", "sink", "one more"))
        assert (await inbox.receive(timeout=5)).seq == 500  # the seq goes on, nothing rotated
    assert len(sorted(inboxes.glob("sink.0*.jsonl"))) == closed


def test_a_backlog_too_big_for_its_active_file_leaves_room(tmp_path: Path) -> None:
    """Where the rest would fill the active file, the last closed segment takes more of it."""
    team = tmp_path / "t"
    (team / "inboxes").mkdir(parents=True)
    closed = write_segments(team, "probe", 1, 1 << 20, 0)  # one line's size, as written
    line = (team / "inboxes" / "probe.jsonl").stat().st_size
    assert closed == 0
    segment = 10 * line
    # 19 lines: one closed segment of 10, 9 in the active file, which wants room for 2
    closed = write_segments(team, "sink", 19, segment, 2 * line)
    active = (team / "inboxes" / "sink.jsonl").stat().st_size
    assert closed == 1 and active <= segment - 2 * line
    assert (team / "inboxes" / "sink.000000.jsonl").stat().st_size >= segment
