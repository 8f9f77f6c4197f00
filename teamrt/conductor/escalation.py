"""Escalations: questions to a human that the run waits on, and their answers.

The conductor is a member of the team (`conductor` by default) with its own inbox. An escalation
is a request from it to the human, answered by a response to that request:

    teamrt send DIR --from human --to conductor --kind response --in-reply-to ID --body '"retry"'

An answer that is not `retry`, `done` or `abort`, an answer from anyone but the human, or one to
no open escalation is refused with an `error` envelope to its sender (an error response when it
came as a request) and reported to the conductor; the escalation stays open and the run keeps
waiting on it. This module carries questions and answers and words them (`question` for the
human's inbox, `announcement` for the terminal and the log); what an answer means for the run,
and when anything is said, is the conductor's.
"""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import anyio

from teamrt.conductor.checks import Evidence
from teamrt.envelopes import Envelope, ErrorBody, Request, Response
from teamrt.errors import TeamrtError
from teamrt.mail import FileMailboxes, Mailboxes

ANSWERS = ("retry", "done", "abort")
INVALID_ANSWER = "InvalidAnswer"  # the error type of a refusal
ESCALATION = "escalation"  # the envelope type of the question
EVIDENCE_LINES = 15  # lines of a check's output shown on the terminal


def question(subtask: str, why: str, evidence: Evidence | None, tail: Sequence[str]) -> str:
    """The body of the escalation request: what failed, the last check, the tail."""
    lines = [f"Subtask {subtask} needs you: {why}."]
    if evidence is not None:
        lines.append(f"Last check: {evidence.command} -> {evidence.describe()}")
    lines += ["What happened (the tail):", *("  " + line for line in tail)]
    lines.append(
        "Answer 'retry' (more rounds), 'done' (accept it as it is) or 'abort' (stop the run), "
        "as a response to this request."
    )
    return "\n".join(lines)


def announcement(
    subtask: str, why: str, evidence: Evidence | None, tail: Sequence[str], command: str
) -> str:
    """What the terminal and the log say: what failed, the evidence tail, the exchange's tail,
    and (last line) the exact command that answers."""
    lines = [f"ESCALATION: subtask {subtask} needs a human: {why}."]
    if evidence is not None:
        lines.append(f"Evidence: `{evidence.command}` -> {evidence.describe()}")
        lines += ["  | " + line for line in evidence.tail.strip().splitlines()[-EVIDENCE_LINES:]]
    lines += ["What happened (the tail):", *("  " + line for line in tail)]
    lines += ["The run waits for the answer (retry, done or abort). Answer with:", command]
    return "\n".join(lines)


@dataclass
class _Open:
    request: Request
    answered: anyio.Event = field(default_factory=anyio.Event)
    answer: str | None = None


class Escalations:
    """The conductor's inbox: open escalations and the answers that close them."""

    def __init__(
        self,
        mail: Mailboxes,
        me: str,
        human: str,
        *,
        on_refusal: Callable[[Envelope, str], None] = lambda envelope, why: None,
    ) -> None:
        self.mail, self.me, self.human = mail, me, human
        self.on_refusal = on_refusal
        self._open: dict[str, _Open] = {}

    def command(self, request_id: str, answer: str = "retry") -> str:
        """The exact shell command that answers escalation `request_id` with `answer`."""
        mail = self.mail
        where = str(mail.path.absolute()) if isinstance(mail, FileMailboxes) else "TEAM_DIR"
        return shlex.join(
            [
                "teamrt",
                "send",
                where,
                "--from",
                self.human,
                "--to",
                self.me,
                "--kind",
                "response",
                "--in-reply-to",
                request_id,
                "--body",
                json.dumps(answer),
            ]
        )

    def question(self, text: str) -> Request:
        """A new escalation request (send it with `ask`)."""
        return Envelope.request(self.me, self.human, text, type=ESCALATION)

    async def ask(self, request: Request, *, timeout: float) -> str | None:
        """Send `request` and wait for a valid answer (None if none came within `timeout`)."""
        waiting = self._open[request.id] = _Open(request)
        try:
            await self.mail.send(request)
            with anyio.move_on_after(timeout):
                await waiting.answered.wait()
        finally:
            self._open.pop(request.id, None)
        return waiting.answer

    async def serve(self) -> None:
        """Read the conductor's inbox until cancelled, closing escalations with their answers."""
        inbox = await self.mail.open_inbox(self.me)
        while True:
            envelope = await inbox.receive()
            try:
                await self._handle(envelope)
            finally:
                inbox.ack_nowait(envelope)

    async def _handle(self, envelope: Envelope) -> None:
        if envelope.kind == "broadcast":
            return  # the team's chatter, not for the conductor
        if not isinstance(envelope, Response):
            await self._refuse(
                envelope,
                "the conductor takes only answers to its escalations: a response to the "
                "escalation's id (e.g. " + self.command("ID") + ")",
            )
            return
        waiting = self._open.get(envelope.in_reply_to)
        if waiting is None:
            still = ", ".join(self._open) or "none"
            await self._refuse(
                envelope,
                f"no open escalation has id {envelope.in_reply_to!r} (open: {still})",
            )
            return
        if envelope.sender != self.human:
            await self._refuse(
                envelope,
                f"only {self.human} answers escalations; escalation {envelope.in_reply_to} "
                "is still open",
            )
            return
        body = envelope.body
        answer = (body if isinstance(body, str) else json.dumps(body)).strip().lower()
        if answer not in ANSWERS:
            await self._refuse(
                envelope,
                f"{answer[:100]!r} is not an answer: answer 'retry', 'done' or 'abort' "
                f"(escalation {envelope.in_reply_to} is still open: "
                f"{self.command(envelope.in_reply_to)})",
            )
            return
        waiting.answer = answer
        waiting.answered.set()

    async def _refuse(self, envelope: Envelope, why: str) -> None:
        self.on_refusal(envelope, why)
        if isinstance(envelope, Request):
            refusal: Envelope = Envelope.error(envelope, INVALID_ANSWER, why)
        else:
            refusal = Envelope.message(
                self.me, envelope.sender, ErrorBody(error=INVALID_ANSWER, message=why)
            )
        with contextlib.suppress(TeamrtError):  # a sender that is not a member cannot be told
            await self.mail.send(refusal)
