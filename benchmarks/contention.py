"""Writer processes into one inbox: latency per send, throughput and CPU time per send.

    .venv/bin/python benchmarks/contention.py [--writers 8 16] [--rounds 5] [--each 2000]
        [--variant NAME=PYTHONPATH ...]

Each writer is a process that opens the team (durability none), waits until every writer is
ready, then awaits `send` of `--each` envelopes to one inbox, timing each send
(`perf_counter_ns`) and its own CPU time (`process_time`, its threads included). A run reports
p50 and p99 of every send of every writer, the throughput (all sends over the span from the
first writer's start to the last one's end) and the writers' CPU time per send; it then reads
the inbox back and fails if an envelope is missing, duplicated or out of order (`seq` dense,
each writer's envelopes in the order it sent them).

`--variant NAME=PYTHONPATH` (repeatable) runs the writers against another copy of teamrt (say
a checkout of the commit before a change) beside the one this script imports: rounds are
interleaved (every variant at every writer count in each round, in an order that alternates
between rounds), and each figure is the median over rounds, with its range. The load average is
printed with the results: on a shared machine, figures taken under load are not comparable with
figures taken on a quiet one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


async def _writer(team: str, name: str, count: int, out: str) -> None:
    import anyio.to_thread

    from teamrt import Envelope, FileMailboxes

    handoffs = [0]
    run_sync = anyio.to_thread.run_sync

    async def counted(*args: Any, **kwargs: Any) -> Any:
        handoffs[0] += 1
        return await run_sync(*args, **kwargs)

    anyio.to_thread.run_sync = counted  # type: ignore[assignment]
    envelopes = [
        Envelope.message(name, "sink", {"i": i, "text": "hello world"}) for i in range(count)
    ]
    latencies = array("d")
    async with FileMailboxes(team) as mail:
        await mail.send(Envelope.message(name, "warm", "warm-up"))  # opens the appender
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read, 1)  # go
        cpu, start = time.process_time(), time.monotonic()
        for envelope in envelopes:
            t0 = time.perf_counter_ns()
            await mail.send(envelope)
            latencies.append((time.perf_counter_ns() - t0) / 1000)
        end, cpu = time.monotonic(), time.process_time() - cpu
        appender = getattr(mail.store, "_appenders", {}).get("sink")
        spins = {k: getattr(appender, k, 0) for k in ("spins_won", "spins_lost", "spins_skipped")}
    result = {"start": start, "end": end, "cpu": cpu, "handoffs": handoffs[0], **spins}
    with open(out, "w") as f:  # noqa: ASYNC230 -- after the measurement
        f.write(json.dumps(result))
    with open(out + ".lat", "wb") as f:  # noqa: ASYNC230
        f.write(latencies.tobytes())


def _child_main(argv: list[str]) -> None:
    team, name, count, out = argv
    asyncio.run(_writer(team, name, int(count), out))


async def _check(team: Path, writers: int, each: int) -> None:
    from anyio import WouldBlock

    from teamrt import FileMailboxes

    async with FileMailboxes(team) as mail:
        inbox, got = mail.inbox("sink"), []
        while True:
            try:
                got.append(inbox.receive_nowait())
            except WouldBlock:
                break
    if [e.seq for e in got] != list(range(writers * each)):
        raise AssertionError(f"lost, duplicated or reordered: {len(got)} of {writers * each}")
    for k in range(writers):
        mine = [e.body["i"] for e in got if e.sender == f"w{k}"]  # type: ignore[index]
        if mine != list(range(each)):
            raise AssertionError(f"writer w{k}'s envelopes are not in the order it sent them")


def _run(
    root: Path, pythonpath: str, writers: int, each: int, extra: dict[str, str]
) -> dict[str, float]:
    from teamrt import FileMailboxes

    team = Path(tempfile.mkdtemp(dir=root)) / "bench"
    names = [f"w{k}" for k in range(writers)]

    async def create() -> None:
        async with FileMailboxes(team, members=["sink", "warm", *names]):
            pass

    asyncio.run(create())
    env = {**os.environ, **extra, "PYTHONPATH": pythonpath}
    outs = [str(team.parent / f"out{k}") for k in range(writers)]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--child", str(team), names[k], str(each), outs[k]],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        for k in range(writers)
    ]
    for proc in procs:
        assert proc.stdout is not None
        if proc.stdout.readline() != b"ready\n":
            raise RuntimeError("a writer did not start")
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"g")
        proc.stdin.flush()
    for proc in procs:
        if proc.wait() != 0:
            raise RuntimeError(f"a writer failed with exit code {proc.returncode}")
    spans = [json.loads(Path(out).read_text()) for out in outs]
    latencies: list[float] = []
    for out in outs:
        latencies += array("d", Path(out + ".lat").read_bytes()).tolist()
    total = writers * each
    asyncio.run(_check(team, writers, each))
    return {
        "p50 us": _percentile(latencies, 50),
        "p99 us": _percentile(latencies, 99),
        "sends/s": total / (max(s["end"] for s in spans) - min(s["start"] for s in spans)),
        "cpu us/send": sum(s["cpu"] for s in spans) / total * 1e6,
        "threads %": sum(s["handoffs"] for s in spans) / total * 100,
        **{k: sum(s[k] for s in spans) for k in ("spins_won", "spins_lost", "spins_skipped")},
    }


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        _child_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--writers", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--each", type=int, default=2000)
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=PYTHONPATH")
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME:VAR=VALUE",
        help="an environment variable for the writers of one variant",
    )  # fmt: skip
    parser.add_argument("--dir", default=None, help="where the teams go (default: a temp dir)")
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parent.parent)
    variants = dict(v.split("=", 1) for v in args.variant) or {"this": here}
    envs: dict[str, dict[str, str]] = {name: {} for name in variants}
    for item in args.env:
        name, _, assignment = item.partition(":")
        var, _, value = assignment.partition("=")
        envs[name][var] = value
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    loads = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for r in range(args.rounds):
            order = list(variants.items())
            if r % 2:
                order.reverse()
            for writers in args.writers:
                for name, path in order:
                    loads.append(os.getloadavg()[0])
                    figures = _run(Path(tmp), path, writers, args.each, envs[name])
                    results.setdefault((name, writers), []).append(figures)
                    print(f"round {r + 1} {name} x{writers}: " + ", ".join(
                        f"{k} {v:,.1f}" for k, v in figures.items()), file=sys.stderr)  # fmt: skip
    print(
        f"load average (1 min) during the runs: {min(loads):.2f} to {max(loads):.2f}; "
        f"{os.cpu_count()} CPUs; {args.rounds} rounds of {args.each} sends per writer"
    )
    print("| variant | writers | p50 us | p99 us | sends/s | cpu us/send | sends via a thread % |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (name, writers), runs in results.items():
        cells = []
        for key in ("p50 us", "p99 us", "sends/s", "cpu us/send", "threads %"):
            values = [run[key] for run in runs]
            low, mid, high = min(values), statistics.median(values), max(values)
            cells.append(f"{mid:,.0f} ({low:,.0f}-{high:,.0f})")
        print(f"| {name} | {writers} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
