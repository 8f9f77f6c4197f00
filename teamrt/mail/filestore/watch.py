"""Dispatching inotify events on the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import anyio

from teamrt.mail import inotify


async def dispatch_forever(watcher: inotify.Inotify, on_overflow: Callable[[], None]) -> None:
    """Dispatch inotify events until cancelled.

    On asyncio the events are read in a reader callback registered once, so a wake-up costs no
    task switch and no epoll registration; other event loops use anyio.wait_readable.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not on asyncio
        while True:
            await anyio.wait_readable(watcher.fd)
            watcher.read_events(on_overflow)
    loop.add_reader(watcher.fd, watcher.read_events, on_overflow)
    try:
        await anyio.sleep_forever()
    finally:
        loop.remove_reader(watcher.fd)
