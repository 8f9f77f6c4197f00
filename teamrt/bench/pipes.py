"""The lean child of `teamrt bench`'s os.pipe baselines, run by its path (`python -I
pipes.py ROLE READ_FD WRITE_FD`), so that it imports neither teamrt nor the bench: only the
standard library an asyncio program needs. Like the teamrt children it is measured against, it
says it is ready (one byte, `R`) once its event loop runs, and the bench starts timing after that
(interpreter start-up is not in the baseline).

- `echo`: each message is written back (a ping-pong); the byte `c` is answered with this process's
  CPU time so far (8 bytes, a double), so that the bench can count the CPU each exchange costs here.
- `wake`: each message is a `time.monotonic()` stamp (8 bytes) sent to this idle process, which
  keeps how late it woke; a stamp of 0 asks for those delays (a count, then the doubles, in us).
"""

from __future__ import annotations

import asyncio
import os
import struct
import sys
import time
from array import array


async def _readable(fd: int) -> None:
    """Wait until `fd` is readable, as a task (what anyio.wait_readable does on asyncio)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, ready.set_result, None)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


async def echo(r: int, w: int) -> None:
    os.write(w, b"R")
    while True:
        await _readable(r)
        data = os.read(r, 64)
        if not data:
            return
        if data == b"c":
            os.write(w, struct.pack("d", time.process_time()))
        else:
            os.write(w, data)


async def wake(r: int, w: int) -> None:
    delays = array("d")
    os.write(w, b"R")
    while True:
        await _readable(r)
        now = time.monotonic()
        data = os.read(r, 8)
        if not data:
            return
        (sent,) = struct.unpack("d", data)
        if sent:
            delays.append((now - sent) * 1e6)
        else:
            os.write(w, struct.pack("I", len(delays)) + delays.tobytes())
            delays = array("d")


if __name__ == "__main__":
    role = {"echo": echo, "wake": wake}[sys.argv[1]]
    asyncio.run(role(int(sys.argv[2]), int(sys.argv[3])))
