"""What a teammate's agent does, as it happens: the status's current text, and progress
messages to the requester of a streamed task (text batched, tool calls and their results)."""

from __future__ import annotations

import logging

import anyio

from teamrt.agents.loop import AgentEvent, ToolCallFinished, ToolCallStarted
from teamrt.envelopes import Envelope, Request
from teamrt.errors import TeamrtError
from teamrt.mail.mailboxes import Mailboxes
from teamrt.models.base import TextDelta
from teamrt.team.config import MemberStatus
from teamrt.team.protocol import ProgressBody

log = logging.getLogger("teamrt.team")

_STATUS_TEXT = 200  # characters of the model's current text kept in the status
_PROGRESS_EVERY = 0.05  # seconds of text batched into one progress message
_PROGRESS_RESULT = 2000  # characters of a tool result in a progress message
_PROGRESS_TEXT = 16_000  # characters of text in one progress message


class Progress:
    """One incarnation's view of its agent's events: `on_event` is the agent's listener."""

    __slots__ = (
        "_flushed",
        "_pending_text",
        "_text_waiting",
        "mail",
        "name",
        "status",
        "streaming",
    )

    def __init__(self, mail: Mailboxes, name: str, status: MemberStatus) -> None:
        self.mail, self.name, self.status = mail, name, status
        self.streaming: Request | None = None  # the streamed task in progress, if any
        self._pending_text = ""
        self._flushed = 0.0
        self._text_waiting = anyio.Event()

    async def on_event(self, event: AgentEvent) -> None:
        """Take in one event of the agent's: its text into the status, and for a streamed
        task, progress to the requester."""
        if isinstance(event, TextDelta):
            self.status.text = (self.status.text + event.text)[-_STATUS_TEXT:]
            if self.streaming is not None:
                self._pending_text += event.text
                if anyio.current_time() - self._flushed >= _PROGRESS_EVERY:
                    await self.flush()
                else:
                    self._text_waiting.set()  # the flusher sends it within _PROGRESS_EVERY
            return
        if self.streaming is None:
            return
        await self.flush()
        if isinstance(event, ToolCallStarted):
            body = ProgressBody(
                task=self.streaming.id,
                event="tool_call",
                text=event.call.arguments,
                name=event.call.name,
            )
        elif isinstance(event, ToolCallFinished):
            body = ProgressBody(
                task=self.streaming.id,
                event="tool_result",
                text=event.content[:_PROGRESS_RESULT],
                name=event.name,
                ok=event.ok,
            )
        else:
            return
        await self._send(body)

    async def _send(self, body: ProgressBody) -> None:
        """Progress is a view of the work, never a reason for it to fail: one that cannot be
        sent (too big for an envelope, a full disk) is dropped, and logged."""
        assert self.streaming is not None
        try:
            await self.mail.send(Envelope.message(self.name, self.streaming.sender, body))
        except TeamrtError as exc:
            log.warning("%s: progress of task %s not sent: %s", self.name, body.task, exc)

    async def flusher(self) -> None:
        """Beside the runner: text that waits in the batch goes out within `_PROGRESS_EVERY`,
        even while the model thinks before writing more."""
        while True:
            await self._text_waiting.wait()
            await anyio.sleep(_PROGRESS_EVERY)
            self._text_waiting = anyio.Event()
            await self.flush()

    async def flush(self) -> None:
        """Send the text written since the last progress message (batched: one message per
        `_PROGRESS_EVERY` seconds of writing, not one per token)."""
        self._flushed = anyio.current_time()
        if self.streaming is None or not self._pending_text:
            return
        text, self._pending_text = self._pending_text, ""
        for start in range(0, len(text), _PROGRESS_TEXT):  # pieces that fit in an envelope
            chunk = text[start : start + _PROGRESS_TEXT]
            await self._send(ProgressBody(task=self.streaming.id, event="text", text=chunk))
