"""The request/response path's own work, piece by piece, each run with cold caches.

    .venv/bin/python benchmarks/cold_path.py [--exchanges 2000] [--evict-kib 512]

Between two exchanges of a cross-process round trip each process sleeps, and wakes with its
caches cold: a piece of the path that takes 3 us in a tight loop takes 8-10 us there. A change
of a microsecond or less is lost in the round trip's noise on a shared machine, and a tight
loop (warm caches) shows a different cost from the one the round trip pays. So this runs the
pieces of one exchange synchronously in one process (both inboxes in one `FileMailboxes`, no
event loop turn, no wake-up), evicts the caches before each piece by copying a buffer
(`--evict-kib`; 512 KiB makes the pieces cost about what they cost in the round trip on a VM
with 2 MiB of L2 per core), and reports each piece's median over the exchanges. On a quiet
machine a piece moves by a few tenths of a microsecond between runs; on a busy one (other
tenants evicting the caches too) the whole moves by 10-20%: compare two trees by running it
from each, alternately, several times, while the load average stays low.

The pieces: the requester builds a request and `request()`'s steps up to the end of its append
(a deadline stamped, the reply registered, `send`); the answerer's `receive_nowait` (read,
decode, dedup, the envelope handed out); the answerer's `Envelope.response` and `send`; the
requester's read, decode and routing of the answer to the waiting request (`Inbox._pump`).
Not included: the event loop's turns and the wake-ups (the round trip's kernel part), and what
each side does after its write.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import anyio

from teamrt.envelopes import Envelope
from teamrt.mail import FileMailboxes

PIECES = [
    "requester: build a request, to the end of its append",
    "answerer: receive (read, decode, hand out)",
    "answerer: build the response, to the end of its append",
    "requester: read, decode and route the answer",
]


def drive(coroutine: Coroutine[Any, Any, Any]) -> None:
    """Run a coroutine that never suspends (a file store's uncontended append) to its end."""
    try:
        coroutine.send(None)
    except StopIteration:
        return
    coroutine.close()
    raise RuntimeError("the append had to wait: run this on a quiet team directory")


async def measure(exchanges: int, evict_kib: int) -> list[float]:
    """Each piece's median duration in microseconds."""
    source = bytearray(os.urandom(evict_kib << 10))
    scratch = bytearray(len(source))
    clock = time.perf_counter_ns
    times: list[list[int]] = [[] for _ in PIECES]
    with tempfile.TemporaryDirectory(prefix="teamrt-cold-") as root:
        async with FileMailboxes(Path(root) / "team", members=["lead", "echo"]) as mail:
            lead, echo = mail.inbox("lead"), mail.inbox("echo")
            for i in range(exchanges + 200):  # the first 200 warm up
                scratch[:] = source
                start = clock()
                request = Envelope.request("lead", "echo", i)
                request = request.with_deadline(request.ts + 30)  # as request(timeout=30)
                reply = lead.expect_reply(request.id, "echo")
                drive(mail.send(request))
                sent = clock()

                scratch[:] = source
                start_receive = clock()
                received = echo.receive_nowait()
                got = clock()

                scratch[:] = source
                start_answer = clock()
                drive(mail.send(Envelope.response(received, received.body)))
                answered = clock()
                echo.ack_nowait(received)

                scratch[:] = source
                start_route = clock()
                lead._pump()
                routed = clock()
                lead._settle()
                lead.give_up_reply(reply)
                if i >= 200:
                    times[0].append(sent - start)
                    times[1].append(got - start_receive)
                    times[2].append(answered - start_answer)
                    times[3].append(routed - start_route)
    return [statistics.median(piece) / 1000 for piece in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exchanges", type=int, default=2000)
    parser.add_argument("--evict-kib", type=int, default=512)
    args = parser.parse_args()
    medians = anyio.run(measure, args.exchanges, args.evict_kib)
    for name, median in zip(PIECES, medians, strict=True):
        print(f"{name:58s} {median:7.2f} us")
    print(f"{'sum':58s} {sum(medians):7.2f} us")


if __name__ == "__main__":
    main()
