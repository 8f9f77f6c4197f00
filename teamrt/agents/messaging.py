"""Messaging as tools: how a teammate's model talks to the rest of the team.

The tools wrap the mailbox core for one agent (`me`): send a message, wait for the inbox (with a
timeout that answers "nothing arrived" rather than failing), make a request and get the answer,
reply to a request received earlier, and broadcast. Failures (an unknown recipient, a request
that timed out or failed) raise, and so come back to the model as data like any tool error.

Inside a team the teammate's desk owns the inbox: `wait_for_messages` then gets conversation mail
only (tasks, shutdown requests and plan decisions are the runner's), acked once the agent's
journal holds the step that showed it, and there is no `reply` tool (requests are tasks).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

import anyio

from teamrt.agents.tools import Tool, current_call_id, tool
from teamrt.envelopes import Envelope, Request
from teamrt.errors import ReceiveTimeout, UsageError
from teamrt.mail.mailboxes import Mailboxes

MAX_BATCH = 20  # envelopes handed to the model per wait
_WAIT_MAX_OUTPUT = 40_000  # characters of a wait's result (mail is what the tool is for)
_RESULT_BUDGET = _WAIT_MAX_OUTPUT - 4_000  # mail per result; what does not fit waits, unacked


def _request_id(me: str, call_id: str) -> str:
    """The id of the request a tool call sends: derived from the call's id, so the same call
    always sends the same request (30 hex digits, like any envelope id)."""
    return hashlib.blake2b(f"{me}\0{call_id}".encode(), digest_size=15).hexdigest()


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


class LetterSource(Protocol):
    """Where `wait_for_messages` gets mail when something else owns the inbox (a team's desk)."""

    async def wait_for_letters(self, timeout: float, limit: int) -> list[Envelope]: ...

    def give_back(self, envelopes: list[Envelope]) -> None:
        """Envelopes taken but not shown after all: they come first next time, unacked."""

    def waiting(self) -> int:
        """How many more are waiting to be shown."""
        ...


def messaging_tools(
    mail: Mailboxes,
    me: str,
    *,
    default_timeout: float = 30.0,
    desk: LetterSource | None = None,
    resolve: Callable[[str], str] = lambda name: name,
    waiting: Callable[[str, str], AbstractContextManager[None]] | None = None,
) -> list[Tool]:
    """The messaging tools for agent `me` on `mail` (`desk`: see the module docstring).

    `resolve` maps a name the model uses to a member (a team maps a pool's role to its least
    busy replica). `waiting(me, to)` is entered while `request` waits for `to` (a team uses it
    to refuse a request that would close a cycle of members waiting on each other)."""
    received: dict[str, Request] = {}  # requests handed to the model and not yet answered

    @tool
    async def send_message(to: str, text: str) -> str:
        """Send a one-way message to a teammate."""
        envelope = Envelope.message(me, resolve(to), text)
        await mail.send(envelope)
        return f"sent message {envelope.id} to {to}"

    @tool(name="wait_for_messages", waits=True, max_output=_WAIT_MAX_OUTPUT)
    async def wait_on_desk(timeout: float = default_timeout) -> dict[str, Any]:
        """Wait up to `timeout` seconds for messages in your inbox and return them."""
        assert desk is not None
        got = await desk.wait_for_letters(max(0.0, timeout), MAX_BATCH)
        if not got:
            return {"nothing_arrived": f"no message arrived within {timeout:g}s"}
        views: list[dict[str, Any]] = []
        size = 0
        for i, envelope in enumerate(got):  # what the model is shown whole, nothing cut
            view = _view(envelope)
            length = len(json.dumps(view, default=str))
            if views and size + length > _RESULT_BUDGET:
                desk.give_back(got[i:])
                break
            if length > _RESULT_BUDGET:  # one letter alone over the budget: say it was cut
                text = json.dumps(view["body"], default=str)
                view["body"] = text[: _RESULT_BUDGET // 2]
                view["cut"] = f"the body has {len(text)} characters; only the first are shown"
                length = len(json.dumps(view, default=str))
            views.append(view)
            size += length
        result: dict[str, Any] = {"messages": views}
        if waiting := desk.waiting():
            result["more_waiting"] = waiting
        return result

    @tool(waits=True)
    async def wait_for_messages(timeout: float = default_timeout) -> dict[str, Any]:
        """Wait up to `timeout` seconds for messages in your inbox and return them."""
        inbox = await mail.open_inbox(me)
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
        member = resolve(to)
        envelope = Envelope.request(me, member, text, timeout=timeout)
        call_id = current_call_id()
        if call_id is not None:  # a call re-run after a crash re-sends the same request, which
            # the callee recognises by its id instead of doing the work twice
            envelope = envelope.model_copy(update={"id": _request_id(me, call_id)})
        with waiting(me, member) if waiting is not None else contextlib.nullcontext():
            response = await mail.request(envelope)
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

    if desk is not None:
        return [send_message, wait_on_desk, request, broadcast]
    return [send_message, wait_for_messages, request, reply, broadcast]
