"""`teamrt soak`: how a soak judges its logs, and a short soak on a real redis-server with real
processes that must meet every target."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from teamrt.testing.soak import Figures, judge_deliveries, judge_runs, soak
from tests.support.redis_server import needs_redis


def delivery(id: str, pid: int, fence: int, t: float) -> dict[str, object]:
    return {"id": id, "pid": pid, "fence": fence, "t": t}


def test_a_consumer_behind_a_newer_fence_delivers_stale() -> None:
    judged = judge_deliveries(
        [delivery("a", 1, 5, 1.0), delivery("b", 2, 6, 2.0), delivery("c", 1, 5, 3.0)],
        excused=set(),
    )
    assert judged["stale"] == 1


def test_a_second_delivery_is_excused_only_after_its_first_consumer_was_faulted() -> None:
    log = [delivery("a", 1, 5, 1.0), delivery("a", 2, 6, 2.0)]
    assert judge_deliveries(log, excused={1})["redelivered_after_fault"] == 1
    assert judge_deliveries(log, excused=set())["delivered_twice"] == 1
    assert judge_deliveries(log, excused={2})["delivered_twice"] == 1


def effect(tag: str, what: str, pid: int, t: float) -> dict[str, object]:
    return {"tag": tag, "what": what, "pid": pid, "t": t}


def test_a_task_run_again_after_a_whole_run_ran_twice() -> None:
    log = [effect("T", "start", 1, 1.0), effect("T", "end", 1, 1.3), effect("T", "start", 2, 5.0)]
    judged = judge_runs(log, cut_off=lambda pid, start, end: False)
    assert (judged["tasks"], judged["run_twice"], judged["rerun_in_flight"]) == (1, 1, 0)


def test_a_run_cut_off_in_flight_is_rerun_not_run_twice() -> None:
    seen: list[tuple[int, float, float]] = []

    def cut_off(pid: int, start: float, end: float) -> bool:
        seen.append((pid, start, end))
        return True

    log = [effect("T", "start", 1, 1.0), effect("T", "start", 2, 5.0), effect("T", "end", 2, 5.3)]
    judged = judge_runs(log, cut_off)
    assert judged["rerun_in_flight"] == 1 and judged["run_twice"] == 0
    assert seen == [(1, 1.0, math.inf)]  # it never ended: cut off at any time after its start


def test_figures_miss_their_targets_when_one_is_not_zero() -> None:
    assert Figures(seconds=1, faults={}, asks_answered=3).ok
    assert not Figures(seconds=1, faults={}, asks_answered=3, sends_lost=1).ok
    assert not Figures(seconds=1, faults={}, asks_answered=0).ok  # nothing done proves nothing


def test_an_unknown_fault_is_a_usage_error() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "teamrt", "soak", "--fault", "nope", "--seconds", "1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 2
    assert "unknown faults ['nope']" in run.stderr and "server_kill" in run.stderr


@needs_redis
@pytest.mark.timeout(900)
# a synchronous redis-py connection cut off by a fault mid-read is left to the garbage collector
# (its socket warns as unclosed); the soak judges envelopes and tasks, not sockets
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_short_soak_meets_every_target(tmp_path: Path, stress: bool) -> None:
    figures = await soak(
        seconds=600 if stress else 30, seed=7, root=tmp_path, fault_every=4, say=lambda _l: None
    )
    report = "\n".join(figures.lines())
    assert figures.ok, report
    assert sum(figures.faults.values()) >= 3, report
