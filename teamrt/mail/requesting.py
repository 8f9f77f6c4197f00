"""Waiting for the answer to a request: in the sender's own inbox, or watching it from its end.

`Mailboxes.request` checks its arguments and turns the timeout into a deadline; a `Requester`
sends the request and waits: in the sender's inbox (`Inbox.expect_reply`), or, for tools beside
a live owner, by reading the sender's inbox from its end with no lease. Meanwhile it checks that
the member asked is still running (`Liveness`), so that a request to a member that stopped
fails with `TeammateGone` instead of at its timeout.

Store-agnostic: no file or lock is touched in this module.
"""

from __future__ import annotations

import math
import time
from typing import Protocol

import anyio

from teamrt.envelopes import Envelope, Request, Response
from teamrt.errors import RequestTimeout, TeammateGone
from teamrt.mail import claims
from teamrt.mail.inbox import Inbox
from teamrt.mail.log import decode_line
from teamrt.mail.signing import Signer
from teamrt.mail.store import HEARTBEAT_INTERVAL, Store

#: After the first liveness check, the member asked is checked this often (seconds).
LIVENESS_EVERY = 0.5
#: A member seen without a live holder on checks this far apart is gone (`TeammateGone`).
GONE_AFTER = 2 * HEARTBEAT_INTERVAL + LIVENESS_EVERY
_POLL_INTERVAL = 0.05  # how often the watching read asks a store that has nothing new


class Liveness:
    """What the liveness checks of one request have seen. One check alone is not enough: right
    after a server pause or a partition, a member's lease may have expired before it could
    renew it, and it takes it back at its next heartbeat; a member seen without a live holder
    for `GONE_AFTER` seconds has had two heartbeats to do so."""

    __slots__ = ("since",)

    def __init__(self) -> None:
        self.since: float | None = None  # when the checks first saw no live holder

    def gone(self, alive: bool | None, now: float) -> bool:
        """True once `alive` (the store's answer at `now`) has said no for `GONE_AFTER`."""
        if alive is not False:
            self.since = None
            return False
        if self.since is None:
            self.since = now
        return now - self.since >= GONE_AFTER


class Sender(Protocol):
    """What a `Requester` asks of its mailboxes (looked up at each request, so that a send
    wrapped on the mailboxes object is the one used)."""

    async def send(self, envelope: Envelope) -> None: ...

    async def open_inbox(self, name: str) -> Inbox: ...


class Requester:
    """Sends requests and waits for their answers, for `Mailboxes.request`."""

    def __init__(
        self,
        store: Store,
        mail: Sender,
        inboxes: dict[str, Inbox],
        signer: Signer | None,
    ) -> None:
        """`inboxes`: the open inboxes of `mail` by member (the same dict, kept up to date)."""
        self._store = store
        self._mail = mail
        self._inboxes = inboxes
        self._signer = signer

    async def in_inbox(
        self, envelope: Request, timeout: float | None, deadline: float, grace: float
    ) -> Response:
        """Send `envelope` and wait in its sender's inbox for its answer until `deadline`
        (monotonic); the member asked is checked from `grace` seconds after the send on
        (`math.inf`: never)."""
        # the fields read once: a model's attribute is read through pydantic's __getattr__ hook
        asked, sender, recipient = envelope.id, envelope.sender, envelope.recipient
        inbox = self._inboxes.get(sender) or await self._mail.open_inbox(sender)
        reply = inbox.expect_reply(asked, recipient)
        try:
            await self._mail.send(envelope)
            # after the send, while the member works on it (off the round trip's path)
            check_at = time.monotonic() + grace
            liveness = Liveness()
            while await inbox.wait_for_reply(reply, min(deadline, check_at)) is None:
                if time.monotonic() >= deadline:
                    break
                try:
                    await self._check_alive(envelope, liveness)
                except TeammateGone:
                    if reply.response is not None:  # it answered, then stopped
                        break
                    inbox.give_up_reply(reply, timed_out=True)  # a late answer counts as late
                    raise
                check_at = time.monotonic() + LIVENESS_EVERY
        finally:
            inbox.give_up_reply(reply)
        response = reply.response
        if response is None:
            inbox.give_up_reply(reply, timed_out=True)
            raise timed_out(envelope, timeout)
        return response

    async def watching(self, envelope: Request, timeout: float | None, grace: float) -> Response:
        """Send `envelope`, then read its sender's inbox from its current end, without a
        lease, a commit or a quarantine entry, until the answer from the asked member
        arrives; the member asked is checked from `grace` seconds on (`math.inf`: never)."""
        reader = await self._store.tail_reader(envelope.sender)
        check_at = time.monotonic() + grace
        liveness = Liveness()
        try:
            await self._mail.send(envelope)
            with anyio.move_on_after(math.inf if timeout is None else timeout):
                while True:
                    if time.monotonic() >= check_at:
                        await self._check_alive(envelope, liveness)
                        check_at = time.monotonic() + LIVENESS_EVERY
                    entries = reader.read_nowait() or await reader.fetch()
                    for entry in entries:
                        decoded = decode_line(entry.raw) if not entry.too_long else None
                        if isinstance(decoded, Response) and self._answers(
                            envelope, decoded, entry.raw
                        ):
                            return claims.redeemed(self._store, decoded)
                    if not entries:
                        await anyio.sleep(_POLL_INTERVAL / 5)
        finally:
            reader.close()
        raise timed_out(envelope, timeout)

    def _answers(self, request: Request, response: Response, raw: bytes) -> bool:
        """True if `response` (read as `raw`) is the answer to `request` from the member
        asked, in this team (and signed with its key, in a signed team)."""
        team = self._store.team
        return (
            response.in_reply_to == request.id
            and response.sender == request.recipient
            and response.team == team
            and (self._signer is None or self._signer.verify(raw, team))
        )

    async def _check_alive(self, envelope: Request, liveness: Liveness) -> None:
        alive = await self._store.member_alive(envelope.recipient)
        if liveness.gone(alive, time.monotonic()):
            raise TeammateGone(
                f"{envelope.recipient} is not running (nobody holds its lease, or its holder "
                f"stopped beating); request {envelope.id} (type {envelope.type!r}) stays in "
                f"its inbox for when it starts again"
            )


def timed_out(envelope: Request, timeout: float | None) -> RequestTimeout:
    """The `RequestTimeout` for `envelope`, unanswered within `timeout` seconds."""
    return RequestTimeout(
        f"no response from {envelope.recipient} to request {envelope.id} "
        f"(type {envelope.type!r}) within {timeout:g}s; the request stays in "
        f"{envelope.recipient}'s inbox and a late response will be delivered to "
        f"{envelope.sender}'s inbox",
        envelope,
    )
