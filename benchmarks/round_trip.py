"""Where a request -> response round trip between two processes spends its time, step by step.

    .venv/bin/python benchmarks/round_trip.py [--exchanges 3000]

The requesting process (this one) asks an answering child through `FileMailboxes` (the same
exchange as `teamrt bench`'s round trip: `Mailboxes.request`, then `Inbox.receive`,
`Envelope.response`, `send` and `ack_nowait` in the child). Both processes take a timestamp
(`time.perf_counter_ns`, CLOCK_MONOTONIC: one clock for both) at each step of the critical path:
building the request, entering the store's append, the `write`, the inotify dispatch, the inbox's
signal, the end of the wait, the end of the read, the envelope handed to the child, and so on.
The timestamps come from thin wrappers around those functions (about 0.2 us each, inside the
figures). For each exchange the steps are matched in order; the table gives each step's median
over the exchanges that took every step (a process that was still busy when the envelope came
reads it without sleeping: those exchanges have no wake-up to time), and the sum of the medians
beside the median round trip of all exchanges.

A write and the wake-up it causes are the kernel's, timed together (the other process may start
before the write returns here); everything else is Python on the critical path.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import itertools
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio

from teamrt.envelopes import Envelope
from teamrt.mail import FileMailboxes, inotify
from teamrt.mail.filestore import appender, store
from teamrt.mail.inbox import Inbox

MARKS: defaultdict[str, array[int]] = defaultdict(lambda: array("q"))


def mark(name: str) -> None:
    MARKS[name].append(time.perf_counter_ns())  # (no array made per mark, as setdefault would)


def instrument() -> None:
    """Wrap the functions on the critical path so that each leaves a timestamp."""
    read_events = inotify.Inotify.read_events
    write_all = appender.write_all  # type: ignore[attr-defined]
    append = store.FileStore.append
    signal, wait, fill = Inbox.wake, Inbox._wait, Inbox._fill

    def read_events_marked(self: inotify.Inotify, on_overflow: Any) -> None:
        mark("wake")
        read_events(self, on_overflow)

    def write_all_marked(fd: int, data: bytes, size: int, what: str) -> None:
        mark("writing")
        write_all(fd, data, size, what)

    async def append_marked(self: store.FileStore, recipient: str, encoded: bytes) -> int:
        mark("appending")
        return await append(self, recipient, encoded)

    def signal_marked(self: Inbox) -> None:
        mark("signal")
        signal(self)

    async def wait_marked(self: Inbox, *args: Any, **kwargs: Any) -> bool:
        woken = await wait(self, *args, **kwargs)
        mark("waited")
        return woken

    def fill_marked(self: Inbox, *args: Any) -> None:
        fill(self, *args)
        mark("filled")

    inotify.Inotify.read_events = read_events_marked  # type: ignore[method-assign]
    appender.write_all = write_all_marked  # type: ignore[attr-defined]
    store.FileStore.append = append_marked  # type: ignore[method-assign]
    Inbox.wake = signal_marked  # type: ignore[method-assign]
    Inbox._wait = wait_marked  # type: ignore[method-assign]
    Inbox._fill = fill_marked  # type: ignore[method-assign,assignment]


async def answer(team: str, ready: str) -> None:
    async with FileMailboxes(team) as mail:
        inbox = mail.inbox("echo")
        await anyio.Path(ready).touch()
        while True:
            request = await inbox.receive()
            mark("received")
            if request.type == "stop":
                await inbox.ack(request)
                return
            await mail.send(Envelope.response(request, request.body))
            inbox.ack_nowait(request)


class Timeline:
    """One process's timestamps of one kind, found by time."""

    def __init__(self, marks: dict[str, list[int]]) -> None:
        self.marks = marks

    def after(self, name: str, start: int | None, end: int) -> int | None:
        """The first `name` timestamp after `start` and no later than `end`."""
        if start is None:
            return None
        times = self.marks.get(name, [])
        i = bisect.bisect_right(times, start)
        return times[i] if i < len(times) and times[i] <= end else None


STEPS = [
    "requester: build the request",
    "requester: request() to the store's append",
    "requester: append to the write",
    "the write and the answerer's wake-up (kernel)",
    "answerer: inotify dispatch to the inbox's signal",
    "answerer: signal to the wait's end",
    "answerer: read and decode",
    "answerer: the envelope handed out",
    "answerer: build the response, send to the store's append",
    "answerer: append to the write",
    "the write and the requester's wake-up (kernel)",
    "requester: inotify dispatch to the inbox's signal",
    "requester: signal to the wait's end",
    "requester: read, decode and route the answer",
    "requester: request() returns",
]


def steps(mine: Timeline, theirs: Timeline, start: int, built: int, done: int) -> list[int] | None:
    """The durations of one exchange's steps, or None if a timestamp is missing."""
    appending = mine.after("appending", built, done)
    writing = mine.after("writing", appending, done)
    # the write wakes the other process, which may run before the write returns here
    woken = theirs.after("wake", writing, done)
    signalled = theirs.after("signal", woken, done)
    waited = theirs.after("waited", signalled, done)
    filled = theirs.after("filled", waited, done)
    received = theirs.after("received", filled, done)
    answering = theirs.after("appending", received, done)
    answer_writing = theirs.after("writing", answering, done)
    back = mine.after("wake", answer_writing, done)
    back_signalled = mine.after("signal", back, done)
    back_waited = mine.after("waited", back_signalled, done)
    back_filled = mine.after("filled", back_waited, done)
    points = [
        start,
        built,
        appending,
        writing,
        woken,
        signalled,
        waited,
        filled,
        received,
        answering,
        answer_writing,
        back,
        back_signalled,
        back_waited,
        back_filled,
        done,
    ]
    if any(p is None for p in points):
        return None
    return [b - a for a, b in itertools.pairwise(points)]  # type: ignore[operator]


async def create(team: Path) -> None:
    async with FileMailboxes(team, members=["lead", "echo"]):
        pass


async def ask(team: Path, exchanges: int) -> tuple[array[int], array[int], array[int]]:
    """Time `exchanges` requests (after 200 to warm up): when each started, when its request
    was built, when its answer came."""
    starts, builts, dones = array("q"), array("q"), array("q")
    clock = time.perf_counter_ns
    async with FileMailboxes(team) as mail:
        for i in range(200):
            await mail.request(Envelope.request("lead", "echo", i), timeout=30)
        MARKS.clear()
        for i in range(exchanges):
            starts.append(clock())
            request = Envelope.request("lead", "echo", i)
            builts.append(clock())
            await mail.request(request, timeout=30)
            dones.append(clock())
        await mail.send(Envelope.message("lead", "echo", None, type="stop"))
    return starts, builts, dones


def report(exchanges: int, timed: tuple[array[int], array[int], array[int]], out: Path) -> None:
    mine = Timeline({k: list(v) for k, v in MARKS.items()})
    theirs = Timeline(pickle.loads(out.read_bytes()))
    starts, builts, dones = timed
    rows = [
        got
        for s, b, d in zip(starts, builts, dones, strict=True)
        if (got := steps(mine, theirs, s, b, d)) is not None
    ]
    print(
        f"{len(rows)} of {exchanges} exchanges took every step in order (in the others a "
        "process found the envelope before it went to sleep: no wake-up to time)"
    )
    total = 0.0
    for k, name in enumerate(STEPS):
        median = statistics.median(row[k] for row in rows) / 1000
        total += median
        print(f"{name:58s} {median:7.1f} us")
    round_trips = statistics.median(d - s for s, d in zip(starts, dones, strict=True)) / 1000
    print(f"{'sum of the steps':58s} {total:7.1f} us")
    print(f"{'round trip, p50':58s} {round_trips:7.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exchanges", type=int, default=3000)
    parser.add_argument("--answer", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    instrument()
    if args.answer:  # the answering child: its timestamps go to a file at the end
        team, ready, out = args.answer
        asyncio.run(answer(team, ready))
        Path(out).write_bytes(pickle.dumps({k: list(v) for k, v in MARKS.items()}))
        return
    root = Path(tempfile.mkdtemp(prefix="teamrt-rtt-"))
    team, ready, out = root / "team", root / "ready", root / "marks"
    asyncio.run(create(team))
    child = subprocess.Popen(
        [sys.executable, __file__, "--answer", str(team), str(ready), str(out)]
    )
    while not ready.exists():
        time.sleep(0.01)
    timed = asyncio.run(ask(team, args.exchanges))
    child.wait()
    report(args.exchanges, timed, out)


if __name__ == "__main__":
    main()
