"""Every exception teamrt raises, in one tree.

Each error says whose fault it is, and the families below `TeamrtError` are what a caller
catches: `UsageError` (the caller's: bad arguments, unknown names), `StateError` (a call the
object's state does not allow), `StoreError` (the environment's: disk full, fsync failed, a store
out of reach), `DeliveryError` (a peer's: another agent answered with an error, or not in time),
`AgentStop` (not a failure: an agent's run ended cleanly), `ToolFailure` and `ModelError` (a tool's
or the model service's). The data's faults are not raised: a line in an inbox that cannot be
decoded is quarantined.

    TeamrtError
    ├── UsageError(ValueError)               the caller passed something invalid
    │   ├── InvalidName                      an agent or team name outside the safe charset
    │   ├── InvalidEnvelope                  an envelope constructor got a bad field
    │   ├── EnvelopeTooLarge                 an encoded envelope over the size limit
    │   │   └── BlobTooLarge                 a payload over max_blob, too big even as a claim check
    │   ├── PayloadError                     a body that fails its registered payload model
    │   ├── TeamKeyMismatch                  no team key, another one, or one for an unsigned team
    │   ├── UnknownRecipient(LookupError)    no such member in the roster
    │   ├── PlanError                        a conductor's plan that cannot be run
    │   └── CaseError                        an evals cases file that cannot be used
    ├── StateError(RuntimeError)             the call does not fit the state of what it is made on
    │   ├── MailboxClosed                    the mailboxes were used after close
    │   ├── MemberBusy                       the member name already runs somewhere else
    │   └── IllegalTransition                a subtask moved along an edge its lifecycle lacks
    ├── StoreError(OSError)                  the store refused: nothing was half-written
    │   ├── DiskFull                         ENOSPC/EFBIG; the inbox was rolled back
    │   ├── DurabilityError                  fsync failed: the send is NOT acknowledged
    │   ├── StoreUnavailable                 a network store was not reached: not sent
    │   │   └── StoreOutage                  out of reach longer than the outage tolerance
    │   ├── OutcomeUnknown                   a network store did not answer: maybe sent
    │   ├── StoreAuthFailed                  a network store refused the credentials, or wants some
    │   ├── LeaseLost                        this holder's lease expired and was taken over
    │   ├── UnsafeDirectory                  a team directory another user could prepare or write
    │   ├── StoreCorrupt                     an inbox's files disagree: run `teamrt repair`
    │   └── PartialBroadcast                 a broadcast reached some members, not all (named)
    ├── DeliveryError                        a peer did not give what was asked or waited for
    │   ├── ReceiveTimeout(TimeoutError)     nothing arrived in an inbox in time
    │   ├── RequestTimeout(TimeoutError)     a peer did not answer before the deadline
    │   ├── RemoteError                      a peer answered with an error response
    │   ├── PeerError                        a peer answered with something malformed
    │   ├── TeammateGone                     asked a teammate that is not running: withdrawn
    │   ├── Deadlock                         a request would close a cycle of waiting members
    │   └── OutputError                      a typed answer was asked for and none came
    │       └── InvalidOutput                the answer did not validate (twice, or at the lead)
    ├── AgentStop                            an agent's run ended cleanly, at a step boundary
    │   ├── LimitExceeded                    it hit one of its limits
    │   └── StopRequested                    it was asked to stop (e.g. team shutdown)
    │       └── TaskWithdrawn                its task's requester withdrew it: stop `cancelled`
    ├── ToolFailure                          a tool, or the MCP server behind it, failed
    │   ├── ToolCrashed                      a tool raised SystemExit or another BaseException
    │   ├── MCPServerError                   an MCP server could not be started, reached or listed
    │   ├── ToolError                        an MCP server answered a call with `isError`
    │   └── ServerGone                       an MCP server died or dropped the connection
    └── ModelError                           the model service failed or answered nonsense
        ├── ModelRequestsBlocked             a real model call while they are switched off
        ├── MissingAPIKey                    no API key in the arguments or the environment
        ├── ModelTimeout(TimeoutError)       the model did not answer in time (after retries)
        ├── ScriptExhausted                  a ScriptedModel was called after its last reply
        ├── Unusable                         an answer that cannot be turned into a reply
        ├── StreamFault                      a stream broke off or sent a chunk that is not JSON
        ├── Divergence                       a re-run's conversation left its recording
        └── DemoFailed                       a demo cannot reach its model server

Third-party exceptions (OSError from the file system, pydantic's ValidationError) are translated
into these at the one boundary where they occur: whatever data goes in (envelope fields and
bodies, protocol bodies such as `TaskResult(...)`, a peer's answer, a path or URL, the CLI's
argv), only these come out (tests/test_public_api_fuzz.py). The one exception is a programming
error: an argument of the wrong Python type to a constructor of configuration (`Teammate`,
`Limits`: a str where an int goes) or something other than an `Envelope` given to `send()` is
Python's `TypeError`.

A few exceptions are signals inside one part of teamrt and never reach a caller, so they are
not here: an output type's `Rejected` (turned into `InvalidOutput` or feedback for the model), a
team's `TeammateCancelled` (reported as a crash) and the CLI's `_Terminated` (SIGTERM, unwound
like Ctrl-C).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from teamrt.envelopes import Envelope


class TeamrtError(Exception):
    """Base class of every error teamrt raises."""


# --- the caller's fault -------------------------------------------------------------------------


class UsageError(TeamrtError, ValueError):
    """The caller passed something invalid."""


class InvalidName(UsageError):
    """An agent or team name that is not a safe file name (see `teamrt.names`)."""


class InvalidEnvelope(UsageError):
    """An envelope constructor was given a field value that does not validate."""


class EnvelopeTooLarge(UsageError):
    """An encoded envelope is larger than the store accepts; nothing was written."""


class BlobTooLarge(EnvelopeTooLarge):
    """A payload is larger than the team's `max_blob`, the most a claim check carries; nothing
    was stored or sent."""


class PayloadError(UsageError):
    """An envelope body does not validate against the payload model registered for its type."""


class TeamKeyMismatch(UsageError):
    """The team key this process holds is not the one the team records: a signed team opened
    with no key or another one, or an unsigned team opened with a key. Refused when the team
    is opened, before anything is written: the process's mail would otherwise be quarantined
    as `bad signature`, or it would accept mail nobody signed."""


class UnknownRecipient(UsageError, LookupError):
    """The recipient is not a member of the team's roster; no inbox was created for it."""


class PlanError(UsageError):
    """A conductor's plan that cannot be run: says which subtask is wrong and how."""


class CaseError(UsageError):
    """An evals cases file that cannot be used: names the file (and line) and what is wrong."""


# --- a call the object's state does not allow ---------------------------------------------------


class StateError(TeamrtError, RuntimeError):
    """The call does not fit the state of what it was made on: mailboxes already closed, a
    member name already running, a subtask moved along an edge its lifecycle does not have."""


class MailboxClosed(StateError):
    """The mailboxes (or an inbox) were used after they were closed."""


class MemberBusy(StateError):
    """A member name is already running (in this process or another); a name runs in at most
    one live incarnation at a time, so two processes never consume one inbox."""


class IllegalTransition(StateError):
    """A subtask was moved along an edge the lifecycle table does not have (a bug)."""


# --- the store's (the environment's) fault ------------------------------------------------------


def _rebuilt(kind: type[StoreError], args: tuple[Any, ...]) -> StoreError:
    """A store error as `args` (OSError's: the message, or errno and message) describe it,
    whatever its constructor's signature."""
    error = OSError.__new__(kind, *args)
    OSError.__init__(error, *args)
    return error


class StoreError(TeamrtError, OSError):
    """The store could not complete an operation. Nothing partial was left behind.

    `errno` is the operating system's error number when one caused it (`errno=0` for a file
    that is there but unusable); then, as for any `OSError`, `strerror` is the message and
    `str()` reads `[Errno N] message`.
    """

    def __init__(self, message: str, *, errno: int | None = None) -> None:
        if errno is None:
            super().__init__(message)
        else:
            super().__init__(errno, message)

    def __reduce__(self) -> tuple[Any, ...]:
        # OSError pickles as `kind(*args)`, and args are OSError's, not this constructor's
        return _rebuilt, (type(self), self.args), self.__dict__


class DiskFull(StoreError):
    """The disk is full (or the file size limit was hit); the inbox was rolled back."""


class DurabilityError(StoreError):
    """fsync failed. The envelope may be in the file but was not acknowledged as durable.

    A failed fsync is never retried into a false success (after a writeback error Linux reports
    the error once and marks the pages clean, so a second fsync would "succeed").
    """


class StoreUnavailable(StoreError):
    """The store could not be reached (a network store whose server is down or unreachable):
    the operation was not carried out, and an append was not sent. Safe to try again."""


class StoreOutage(StoreUnavailable):
    """A network store stayed out of reach for longer than the outage tolerance
    (`store_outage`, 30 s unless set): the work that needed it stopped. Not a crash: the
    member's state is in its journal, and a new incarnation resumes from it once the store is
    back (`teamrt run-agent` reconnects by itself)."""


class OutcomeUnknown(StoreError):
    """A network store's server did not answer in time after the request went out: the append
    may or may not have been applied. `Mailboxes.send` retries it with the same envelope (the
    receiver drops a second copy by its id) before raising this."""


class StoreAuthFailed(StoreError):
    """A network store's server refused the locator's credentials (a wrong password or user
    name, a disabled user), or requires a password and the locator gives none: nothing was done.
    Trying again does not help; the locator's credentials must change."""


class LeaseLost(StoreError):
    """This process's lease on a member expired and another holder took it over (a store whose
    leases expire, after this process stopped renewing it): its inbox hands out nothing more,
    its cursor commits are refused, and the incarnation that held it starts no task or tool
    call and stops."""


class UnsafeDirectory(StoreError):
    """A team directory (or one of its subdirectories) that another user could have prepared
    or can write: a symlink, someone else's, or writable by group or others."""


class StoreCorrupt(StoreError):
    """An inbox's files do not agree (a log truncated or replaced under its cursor, a missing
    log, segments out of order). The message names the file, what was found and the
    `teamrt repair` command that brings the inbox back."""


class PartialBroadcast(StoreError):
    """A broadcast reached some members but not all; `delivered` and `undelivered` name them."""

    def __init__(
        self, message: str, delivered: tuple[str, ...], undelivered: tuple[str, ...]
    ) -> None:
        super().__init__(message)
        self.delivered = delivered
        self.undelivered = undelivered


# --- a peer's fault -----------------------------------------------------------------------------


class DeliveryError(TeamrtError):
    """A peer did not give what was asked or waited for: nothing arrived in time, the answer
    was an error or malformed, the teammate was not running, the request would deadlock, or a
    typed answer was asked for and none came."""


class ReceiveTimeout(DeliveryError, TimeoutError):
    """`Inbox.receive(timeout=...)` found nothing before the timeout."""


class RequestTimeout(DeliveryError, TimeoutError):
    """No response arrived before the request's timeout.

    The request stays in the callee's inbox; a response that arrives later is delivered to the
    requester's inbox as an ordinary envelope (and counted as late), never dropped.
    """

    def __init__(self, message: str, request: Envelope) -> None:
        super().__init__(message)
        self.request = request


class RemoteError(DeliveryError):
    """The callee answered a request with an error response."""

    def __init__(self, error_type: str, message: str, response: Envelope) -> None:
        super().__init__(f"{response.sender} failed: {error_type}: {message}")
        self.error_type = error_type
        self.remote_message = message
        self.response = response


class PeerError(DeliveryError):
    """A peer's fault: a teammate answered with a body that is not what the protocol says (a
    task result that does not validate, say). `response` is the answer as it came."""

    def __init__(self, message: str, response: Envelope) -> None:
        super().__init__(message)
        self.response = response


class TeammateGone(DeliveryError):
    """A task was given to a teammate that is not running (it crashed, stopped, or its process
    died). A task refused so is withdrawn: no later incarnation starts it. `task_id` names it;
    `started` says whether it had started (None: not known here); one that had started stops
    at its next step, and its late outcome (stop reason `cancelled`) reaches the lead."""

    def __init__(
        self, message: str, *, task_id: str | None = None, started: bool | None = None
    ) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.started = started


class Deadlock(DeliveryError):
    """A request that would close a cycle of members waiting on each other (A asks B while B,
    busy, waits on A): refused at once, naming the cycle, instead of every request in it
    waiting for its timeout."""


class OutputError(DeliveryError):
    """A typed answer was asked for (`team.ask(..., output_type=...)`) and the task ended
    without one: it stopped for another reason (a limit, a model error), or the teammate
    answered with text (it declares no `output_type`). `stop_reason` and `detail` say how the
    task ended; `result` is the whole `TaskResult`."""

    def __init__(self, message: str, *, stop_reason: str, detail: str, result: object) -> None:
        super().__init__(message)
        self.stop_reason = stop_reason
        self.detail = detail
        self.result = result


class InvalidOutput(OutputError):
    """The typed answer did not validate: the model's answer failed twice (the first error
    went back to it once; the run stopped as `invalid_output`), or the value a teammate sent
    does not match the type the lead asked for. The message has the validation errors."""


# --- clean stops --------------------------------------------------------------------------------


class AgentStop(TeamrtError):
    """Not a failure: an agent's run ends cleanly at a step boundary, with a stop reason in
    its report (a limit reached, a stop asked for)."""


class LimitExceeded(AgentStop):
    """An agent reached a limit. Carries the limit's name, its value and what was used."""

    def __init__(self, limit: str, value: float, used: float, lead: str) -> None:
        super().__init__(f"{lead} {limit}={value:g} (used {used:g})")
        self.limit = limit
        self.value = value
        self.used = used


class StopRequested(AgentStop):
    """Raised by an agent's step hook to end the run cleanly at a step boundary."""


class TaskWithdrawn(StopRequested):
    """Raised by an agent's step hook when its task's requester withdrew the task: the run ends
    at the step boundary with stop reason `cancelled` (not resumed, unlike a shutdown)."""


# --- a tool's fault -----------------------------------------------------------------------------


class ToolFailure(TeamrtError):
    """A tool, or the MCP server behind it, failed. Only `ToolCrashed` and `MCPServerError`
    stop an agent; an MCP call's failure (`ToolError`, `ServerGone`) is data for the model."""


class ToolCrashed(ToolFailure):
    """A tool raised a `BaseException` that is not cancellation (`SystemExit`, a custom one):
    not data for the model but a crash of the agent running it (a teammate's crash is reported
    and handled by its restart policy; nothing else in the team stops). The original exception
    is the `__cause__`."""


class MCPServerError(ToolFailure):
    """An MCP server could not be started (a bad command), reached (nothing at the URL, a
    refused header) or asked for its tools in time. Failures after that are data for the model
    (see `teamrt.agents.mcp_tools`), never raised."""


class ToolError(ToolFailure):
    """A tool call the MCP server answered with `isError` (its message is the server's text)."""


class ServerGone(ToolFailure):
    """The MCP server died or dropped the connection: its tools no longer answer."""


# --- the model's fault --------------------------------------------------------------------------


class ModelError(TeamrtError):
    """The model service failed (after retries), or answered with something unusable."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        attempts: int = 1,
        rate_limited: int = 0,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.attempts = attempts  # HTTP requests made, retries included
        self.rate_limited = rate_limited  # how many of them were answered 429


class ModelRequestsBlocked(ModelError):
    """A real model was called while real model requests are switched off (as in tests)."""


class MissingAPIKey(ModelError):
    """No API key was given and none is set in the environment."""


class ModelTimeout(ModelError, TimeoutError):
    """The model did not answer within the request timeout, on every attempt."""


class ScriptExhausted(ModelError):
    """A ScriptedModel was called after it had given its last scripted reply."""


class Unusable(ModelError):
    """An OpenAI-compatible server's answer (or a streamed event) that cannot be turned into a
    reply. Not retried."""


class StreamFault(ModelError):
    """A stream that broke off or sent a chunk that is not JSON: retried while nothing of the
    reply was passed on yet."""


class Divergence(ModelError):
    """The re-run's conversation left the recording (see `teamrt.rerun`)."""

    def __init__(self, step: int, message: str) -> None:
        super().__init__(f"differs at step {step}: {message}")
        self.step = step


class DemoFailed(ModelError):
    """A demo cannot reach its model server; the message is the one line the user sees. (A
    missing or malformed variable is the caller's mistake: a `UsageError`.)"""
