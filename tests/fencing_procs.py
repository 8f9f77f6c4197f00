"""Child processes for the fencing tests: `python -m tests.fencing_procs MODE URL OUT`.

consumer: owns `worker`'s inbox and writes the id of every envelope it hands its application
to OUT (one a line), acking each; prints `holding` once it owns the inbox and `lost` when it
meets `LeaseLost`.
"""

from __future__ import annotations

import os
import sys

import anyio

from teamrt.errors import LeaseLost
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.redisstore import RedisStore


def record(path: str, line: str) -> None:
    """Append one line to `path` at once (the test reads it while this process runs)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode() + b"\n")
    finally:
        os.close(fd)


async def consumer(url: str, out: str) -> None:
    async with Mailboxes(RedisStore(url)) as mail:
        inbox = await mail.open_inbox("worker")
        print("holding", flush=True)
        try:
            while True:
                got = await inbox.receive()
                record(out, got.id)
                await inbox.ack(got)
        except LeaseLost:
            print("lost", flush=True)


def main() -> None:
    mode, url, out = sys.argv[1:4]
    modes = {"consumer": consumer}
    try:
        anyio.run(modes[mode], url, out)
    except LeaseLost:
        print("lost", flush=True)
    except BaseException as exc:
        print("exit:", type(exc).__name__, exc, flush=True)


if __name__ == "__main__":
    main()
