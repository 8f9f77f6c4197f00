"""Messaging as tools: how a teammate's model talks to the rest of the team.

The tools wrap the mailbox core for one agent (`me`): send a message, wait for the inbox (with a
timeout that answers "nothing arrived" rather than failing), make a request and get the answer,
reply to a request received earlier, and broadcast. Failures (an unknown recipient, a request
that timed out or failed) raise, and so come back to the model as data like any tool error.
"""

from __future__ import annotations

from typing import Any

import anyio

from teamrt.agents.tools import Tool, tool
from teamrt.envelopes import Envelope, Request
from teamrt.errors import ReceiveTimeout, UsageError
from teamrt.mail.mailboxes import Mailboxes

MAX_BATCH = 20  # envelopes handed to the model per wait


def _view(envelope: Envelope) -> dict[str, Any]:
    view = {
        "id": envelope.id,
        "from": envelope.sender,
        "kind": envelope.kind,
        "type": envelope.type,
        "body": envelope.body,
    }
    if envelope.in_reply_to:
        view["in_reply_to"] = envelope.in_reply_to
    return view


def messaging_tools(mail: Mailboxes, me: str, *, default_timeout: float = 30.0) -> list[Tool]:
    """The messaging tools for agent `me` on `mail`."""
    received: dict[str, Request] = {}  # requests handed to the model and not yet answered

    @tool
    async def send_message(to: str, text: str) -> str:
        """Send a one-way message to a teammate."""
        envelope = Envelope.message(me, to, text)
        await mail.send(envelope)
        return f"sent message {envelope.id} to {to}"

    @tool
    async def wait_for_messages(timeout: float = default_timeout) -> dict[str, Any]:
        """Wait up to `timeout` seconds for messages in your inbox and return them."""
        inbox = mail.inbox(me)
        try:
            got = [await inbox.receive(timeout=timeout)]
        except ReceiveTimeout:
            return {"nothing_arrived": f"no message arrived within {timeout:g}s"}
        while len(got) < MAX_BATCH:
            try:
                got.append(inbox.receive_nowait())
            except anyio.WouldBlock:
                break
        for envelope in got:
            if isinstance(envelope, Request):
                received[envelope.id] = envelope
        inbox.ack_nowait(*got)  # handed to the model: its checkpoint holds them now
        return {"messages": [_view(e) for e in got]}

    @tool
    async def request(to: str, text: str, timeout: float = default_timeout) -> dict[str, Any]:
        """Ask a teammate something and wait up to `timeout` seconds for the answer."""
        response = await mail.request(Envelope.request(me, to, text, timeout=timeout))
        return {"from": response.sender, "answer": response.body}

    @tool
    async def reply(request_id: str, text: str) -> str:
        """Answer a request you received (by its id)."""
        original = received.pop(request_id, None)
        if original is None:
            raise UsageError(
                f"no open request with id {request_id!r} (open: {', '.join(received) or 'none'})"
            )
        await mail.send(Envelope.response(original, text))
        return f"replied to {original.sender}"

    @tool
    async def broadcast(text: str) -> str:
        """Send a message to every other member of the team."""
        envelope = Envelope.broadcast(me, text)
        await mail.send(envelope)
        return f"broadcast {envelope.id}"

    return [send_message, wait_for_messages, request, reply, broadcast]
