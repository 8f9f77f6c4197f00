"""Many idle inboxes in one process: its CPU while idle, and how fast one of them wakes.

    .venv/bin/python benchmarks/idle.py [--inboxes 2 9900] [--seconds 20] [--wakes 200]
        [--rounds 3] [--variant NAME=PYTHONPATH ...]

An owner process opens `--inboxes` inboxes of one team (durability none, the default 1 s safety
rescan) and blocks a `receive()` on every one of them. After a 2 s settle it measures its own CPU
time over `--seconds` with `getrusage` (user + system) as a share of one core. Then this process
sends `--wakes` envelopes, 20 ms apart, to one inbox in the middle; each carries the
`time.monotonic()` (one clock for every process) taken just before its send, and the owner
notes when its receive returns: the wake latency from another process, p50 and p99.

Sizes run interleaved within each round, as do the `--variant`s (another copy of teamrt for the
owner, say the commit before a change); each figure is the median over rounds with its range.
One inbox holds two descriptors (its log and its member's lease): 10,000 inboxes need more than
20,000, so under that limit on open files, use 9,900. `--without-heartbeat` also runs each size
with the owner's lease heartbeat off (which touches every lease file every second), to tell the
rescan's share of the idle CPU from the heartbeat's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _owner(team: str, count: int, seconds: float, wakes: int, heartbeat: bool) -> None:
    import anyio

    from teamrt import FileMailboxes
    from teamrt.mail.mailboxes import Mailboxes

    if not heartbeat:  # for attribution only: other processes would see these members stop

        async def no_heartbeat(self: Mailboxes) -> None:
            await anyio.sleep_forever()

        Mailboxes._heartbeat = no_heartbeat  # type: ignore[method-assign]

    names = [f"m{i:05d}" for i in range(count)]
    target = names[count // 2]
    latencies: list[float] = []
    async with FileMailboxes(team) as mail, anyio.create_task_group() as tg:
        for name in names:
            if name != target:
                tg.start_soon(mail.inbox(name).receive)
        inbox = mail.inbox(target)

        async def wake_up() -> None:
            for _ in range(wakes):
                envelope = await inbox.receive()
                latencies.append((time.monotonic() - envelope.body) * 1e6)  # type: ignore[operator]

        await anyio.sleep(2.0)  # let every receiver block
        cpu, start = _cpu(), time.monotonic()
        await anyio.sleep(seconds)
        idle = (_cpu() - cpu) / (time.monotonic() - start) * 100
        async with anyio.create_task_group() as waker:
            waker.start_soon(wake_up)
            await anyio.sleep(0.2)
            print(json.dumps({"ready": True}), flush=True)
        print(json.dumps({"idle": idle, "latencies": latencies}), flush=True)
        tg.cancel_scope.cancel()


async def _sender(team: Path, target: str, wakes: int, stdout: Any) -> None:
    from teamrt import Envelope, FileMailboxes

    loop = asyncio.get_running_loop()
    line = await loop.run_in_executor(None, stdout.readline)
    if not json.loads(line).get("ready"):
        raise RuntimeError(f"the owner did not get ready: {line!r}")
    async with FileMailboxes(team) as mail:
        for _ in range(wakes):
            await asyncio.sleep(0.02)  # idle again before the next one
            await mail.send(Envelope.message("lead", target, time.monotonic()))


def _run(
    root: Path, pythonpath: str, count: int, seconds: float, wakes: int, heartbeat: bool
) -> dict[str, float]:
    from teamrt import FileMailboxes

    team = Path(tempfile.mkdtemp(dir=root)) / "idle"
    names = [f"m{i:05d}" for i in range(count)]

    async def create() -> None:
        async with FileMailboxes(team, members=["lead", *names]):
            pass

    asyncio.run(create())
    owner = subprocess.Popen(
        [sys.executable, __file__, "--owner", *map(str, (team, count, seconds, wakes, heartbeat))],
        env={**os.environ, "PYTHONPATH": pythonpath},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        asyncio.run(_sender(team, names[count // 2], wakes, owner.stdout))
        assert owner.stdout is not None
        result = json.loads(owner.stdout.readline())
        if owner.wait(timeout=60) != 0:
            raise RuntimeError(f"the owner failed with exit code {owner.returncode}")
    finally:
        if owner.poll() is None:
            owner.kill()
        shutil.rmtree(team.parent, ignore_errors=True)
    latencies = sorted(result["latencies"])
    return {
        "idle CPU %": result["idle"],
        "wake p50 us": latencies[len(latencies) // 2],
        "wake p99 us": latencies[min(len(latencies) - 1, len(latencies) * 99 // 100)],
    }


def main() -> None:
    if sys.argv[1:2] == ["--owner"]:
        team, count, seconds, wakes, heartbeat = sys.argv[2:]
        asyncio.run(_owner(team, int(count), float(seconds), int(wakes), heartbeat == "True"))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--inboxes", type=int, nargs="+", default=[2, 9900])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--wakes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=PYTHONPATH")
    parser.add_argument(
        "--without-heartbeat",
        action="store_true",
        help="also run each size with the lease heartbeat off, to tell its share of the idle CPU",
    )
    parser.add_argument("--dir", default=None, help="where the teams go (default: a temp dir)")
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parent.parent)
    variants = dict(v.split("=", 1) for v in args.variant) or {"this": here}
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    beats = (True, False) if args.without_heartbeat else (True,)
    loads = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for r in range(args.rounds):
            order = list(variants.items())
            if r % 2:
                order.reverse()
            for count in args.inboxes:
                for beat in beats:
                    for name, path in order:
                        loads.append(os.getloadavg()[0])
                        figures = _run(Path(tmp), path, count, args.seconds, args.wakes, beat)
                        size = f"{count:,}" + ("" if beat else " (no lease heartbeat)")
                        results.setdefault((name, size), []).append(figures)
                        shown = ", ".join(f"{k} {v:,.2f}" for k, v in figures.items())
                        print(f"round {r + 1} {name} {size}: {shown}", file=sys.stderr)
    print(
        f"load average (1 min) during the runs: {min(loads):.2f} to {max(loads):.2f}; "
        f"{os.cpu_count()} CPUs; {args.rounds} rounds of {args.seconds:g} s idle and "
        f"{args.wakes} wakes"
    )
    print("| variant | inboxes | idle CPU % of a core | wake p50 us | wake p99 us |")
    print("| --- | --- | --- | --- | --- |")
    for (name, size), runs in results.items():
        cells = []
        for key, fmt in (("idle CPU %", ",.2f"), ("wake p50 us", ",.0f"), ("wake p99 us", ",.0f")):
            values = [run[key] for run in runs]
            low, mid, high = min(values), statistics.median(values), max(values)
            cells.append(f"{mid:{fmt}} ({low:{fmt}}-{high:{fmt}})")
        print(f"| {name} | {size} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
