"""What the inbox tests share: a team's storage opened again and again (`Backing`), the waits'
leftovers and the event loop's errors checked, and a worker that answers what it was asked."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio

from teamrt import Envelope
from teamrt.envelopes import Request
from teamrt.mail.filestore.store import FileStore
from teamrt.mail.inbox import Inbox
from teamrt.mail.mailboxes import Mailboxes

#: the members of a `Backing`'s team
MEMBERS = ["lead", "worker", "other"]


def file_mail(tmp_path: Path, *, store: dict[str, Any] | None = None, **options: Any) -> Mailboxes:
    """Mailboxes on a file store in `tmp_path/team` (`store`: the FileStore's options)."""
    return Mailboxes(FileStore(tmp_path / "team", **(store or {})), members=MEMBERS, **options)


class Backing:
    """One team's storage that several `Mailboxes` can open in turn (a process restart)."""

    def __init__(self, kind: str, make: Callable[..., Mailboxes]) -> None:
        self.kind = kind
        self._make = make

    def open(self, **options: Any) -> Mailboxes:
        return self._make(**options)


@contextlib.contextmanager
def loop_errors() -> Iterator[list[dict[str, Any]]]:
    """Collect what the event loop reports to its exception handler (a timer callback that
    raised, a future's exception nobody retrieved); the test asserts there is none."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    old = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        yield errors
    finally:
        loop.set_exception_handler(old)


async def until(condition: Callable[[], bool]) -> None:
    """Poll `condition` (for states that have no event to wait on); the caller bounds it."""
    while not condition():  # noqa: ASYNC110 -- a peek at state without an event
        await anyio.sleep(0.002)


def assert_quiet(inbox: Inbox) -> None:
    """Nothing of a wait is left behind: no waiter, no deadline."""
    assert not inbox._waiters
    assert not inbox._deadlines


async def answer_all(mail: Mailboxes, worker: Inbox, *, order: random.Random | None = None,
                     count: int | None = None) -> list[Request]:  # fmt: skip
    """As the worker: collect `count` requests (or what is there), answer them (shuffled if
    `order`), ack them. Returns the requests answered."""
    requests: list[Request] = []
    while count is None or len(requests) < count:
        if count is None:
            requests.extend(r.to_envelope() for r in worker.drain_nowait())  # type: ignore[misc]
            break
        requests.extend(r.to_envelope() for r in await worker.drain())  # type: ignore[misc]
    if order is not None:
        order.shuffle(requests)
    for request in requests:
        await mail.send(Envelope.response(request, request.body))
    if requests:
        await worker.ack(*requests)
    return requests
