"""Typed envelopes: the only thing that travels between teammates.

An envelope is a frozen pydantic model discriminated on `kind` (`message`, `request`, `response`,
`broadcast`). Its `type` names what the body is; a user attaches a pydantic model to a type name
with `register_payload`, and bodies of that type are then validated on send and on receive.
Envelopes are created through the one-line constructors on `Envelope`:

    Envelope.message("lead", "writer", "hello")
    req = Envelope.request("lead", "writer", {"topic": "inotify"}, type="task", timeout=30)
    Envelope.response(req, {"ok": True}, type="result")
    Envelope.error(req, "ValueError", "no such topic")
    Envelope.broadcast("lead", "stand down", type="shutdown_request")

`seq` and `team` are assigned by the mailbox when the envelope is appended to an inbox.
"""

from __future__ import annotations

import builtins
import contextlib
import contextvars
import itertools
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import (
    Annotated,
    Any,
    ClassVar,
    Final,
    Literal,
    Protocol,
    Self,
    TypeAlias,
    TypeVar,
    cast,
)

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from teamrt._assemble import assemble, assemble_copy
from teamrt.errors import InvalidEnvelope, InvalidName, PayloadError, PeerError, UsageError
from teamrt.names import Name, is_name, valid_names, validate_name

FORMAT_VERSION = 1
ERROR_TYPE = "error"

Kind: TypeAlias = Literal["message", "request", "response", "broadcast"]
P = TypeVar("P", bound=BaseModel)


# --- ids -------------------------------------------------------------------------------------
# 14 hex digits of microseconds since the epoch, 10 of a per-process random tag, 6 of a counter:
# time-sortable and unique across processes without coordination.

_counter = itertools.count()
# the process's tag, in its place among the id's 120 bits: an id is one int written as 15 bytes
# of hex, so making one is an OR of three numbers and one conversion
_id_tag = int.from_bytes(os.urandom(5)) << 24

# --- traces: every envelope sent while handling a task carries the task's trace id -----------

_trace: contextvars.ContextVar[str | None] = contextvars.ContextVar("teamrt_trace", default=None)


def current_trace() -> str | None:
    """The trace id of the task being handled here (None outside one)."""
    return _trace.get()


@contextlib.contextmanager
def tracing(trace_id: str | None) -> Iterator[None]:
    """Within this block (and the tasks started in it), every envelope sent without a trace id
    gets `trace_id`: a task's messages, sub-requests, answers and protocol envelopes form one
    trace, across processes (the id travels in the envelopes)."""
    token = _trace.set(trace_id)
    try:
        yield
    finally:
        _trace.reset(token)


def _new_process_tag() -> None:
    global _counter, _id_tag
    _id_tag = int.from_bytes(os.urandom(5)) << 24
    _counter = itertools.count()


os.register_at_fork(after_in_child=_new_process_tag)


def new_id() -> str:
    """Return a new unique, time-sortable envelope id (30 lowercase hex digits)."""
    return _id_of(time.time_ns() // 1000)


def _id_at(now: float) -> str:
    """`new_id()` for an envelope stamped at `now` (`time.time()`): its id and its `ts` from
    one clock read, so the two agree."""
    return _id_of(int(now * 1_000_000))


def _id_of(micros: int) -> str:
    """The id made at `micros` microseconds since the epoch (below 2**56: until the year 4254)."""
    return ((micros << 64) | _id_tag | (next(_counter) & 0xFFFFFF)).to_bytes(15).hex()


# --- payload registry -------------------------------------------------------------------------

_payloads: dict[str, type[BaseModel]] = {}


def register_payload(type_name: str, model: type[P]) -> type[P]:
    """Attach a pydantic model to an envelope `type`; bodies of that type are then validated.

    Registering the same model twice is allowed; a different model for a taken name is an error.
    """
    existing = _payloads.get(type_name)
    if existing is not None and existing is not model:
        raise UsageError(
            f"payload type {type_name!r} is already registered to {existing.__qualname__}"
        )
    _payloads[type_name] = model
    return model


def payload(type_name: str) -> Any:
    """Class decorator form of `register_payload`: `@payload("task") class Task(BaseModel): ...`."""

    def decorate(model: type[P]) -> type[P]:
        return register_payload(type_name, model)

    return decorate


def payload_model(type_name: str) -> type[BaseModel] | None:
    """The model registered for `type_name`, or None (also for a `type_name` that is no str:
    no envelope that the owner reads has one)."""
    return _payloads.get(type_name) if type(type_name) is str else None


#: `payload_model` for a type name known to be a str (a decoded record's, a checked
#: envelope's): the registry's own lookup, for the send and decode paths that have already
#: checked the type.
registered_payload: Final[Callable[[str], type[BaseModel] | None]] = _payloads.get


def validate_body(type_name: str, body: Any) -> None:
    """Raise `PayloadError` if `body` does not fit the model registered for `type_name`."""
    model = _payloads.get(type_name)
    if model is None:
        return
    try:
        model.model_validate(body)
    except TypeError as exc:  # pydantic's, for a dict whose keys are not all str
        raise PayloadError(
            f"body of type {type_name!r} does not match {model.__qualname__}: {exc}"
        ) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise PayloadError(
            f"body of type {type_name!r} does not match {model.__qualname__}: "
            f"{where}: {first['msg']}"
        ) from None


def _refuse_constant(name: str) -> Any:
    raise InvalidEnvelope(
        f"the envelope holds {name} (in its body, ts, deadline or a field of its own), which JSON "
        "cannot carry (it would arrive as null or not at all); use a finite number, a string or "
        "null; nothing was sent"
    )


_SCALAR_BODIES = frozenset((str, int, bool, type(None)))


def check_finite(envelope: Envelope, encoded: bytes) -> None:
    """Raise `InvalidEnvelope` if `envelope` (encoded as `encoded`) holds NaN or Infinity.

    On the send path, so cheap first: a text body needs only its times checked, and pydantic
    writes NaN and Infinity as bare `NaN` / `Infinity`, so encoded bytes without a capital N or I
    (two memchr scans) hold neither; only the rest is searched, and parsed when a hint is found.
    """
    # a scalar body leaves only the times to check, unless a subclass adds fields of its own
    # (declared, or extras) that may hold a float
    if (
        type(envelope.body) in _SCALAR_BODIES
        and len(envelope.__dict__) == _FIELD_COUNT
        and not envelope.__pydantic_extra__
    ):
        deadline = envelope.deadline
        if math.isfinite(envelope.ts) and (deadline is None or math.isfinite(deadline)):
            return
        _refuse_constant("NaN or Infinity")
    if encoded.find(b"N") < 0 and encoded.find(b"I") < 0:
        return
    if b"NaN" in encoded or b"Infinity" in encoded:
        json.loads(b"{" + encoded, parse_constant=_refuse_constant)


E = TypeVar("E", bound="Envelope")


def _build(cls: type[E], **fields: Any) -> E:
    """Construct an envelope, turning pydantic's error into one that names the bad field."""
    return cls(**fields)


def _invalid(cls: type[BaseModel], exc: ValidationError) -> InvalidEnvelope | InvalidName:
    """pydantic's error for an envelope of class `cls` as teamrt's, naming the bad field."""
    first = exc.errors(include_url=False)[0]
    field = str(first["loc"][0]) if first["loc"] else "envelope"
    if field in ("sender", "recipient"):
        try:
            validate_name(first.get("input"), what=field)
        except InvalidName as bad_name:
            return bad_name
    return InvalidEnvelope(f"invalid {cls.__name__.lower()}: {field}: {first['msg']}")


def peer_answer(model: type[P], response: Envelope) -> P:
    """`response.body` validated as `model`; a body that does not validate is the peer's fault
    (`PeerError`, naming the sender and what was wrong), never pydantic's error."""
    try:
        return model.model_validate(response.body)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise PeerError(
            f"{response.sender} answered with a malformed {model.__name__} "
            f"({where}: {first['msg']}); the answer was dropped: check that teammate's code",
            response,
        ) from None


def _dump_body(body: Any) -> Any:
    return body.model_dump(mode="json") if isinstance(body, BaseModel) else body


def _type_of(body: Any, default: str) -> str:
    if isinstance(body, BaseModel):
        for name, model in _payloads.items():
            if type(body) is model:
                return name
    return default


# --- the envelope models ----------------------------------------------------------------------


class Body(BaseModel):
    """A protocol body (`ErrorBody`, `TaskResult`, ...): built with fields that do not fit,
    it raises `PayloadError` naming the field, not pydantic's error. (`model_validate` on a
    body someone sent stays pydantic's: the readers of peers' bodies translate it.)"""

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(part) for part in first["loc"]) or "body"
            raise PayloadError(f"invalid {type(self).__name__}: {where}: {first['msg']}") from None
        except TypeError as exc:  # pydantic's, for a dict in it whose keys are not all str
            raise PayloadError(f"invalid {type(self).__name__}: {exc}") from None


class ErrorBody(Body):
    """The body of an error response: what failed, in the callee's words."""

    model_config = ConfigDict(frozen=True)

    error: str
    message: str


register_payload(ERROR_TYPE, ErrorBody)


class Envelope(BaseModel):
    """Fields shared by every kind. Field order is the order on disk; `body` comes last."""

    # NaN and Infinity are written as JSON-invalid constants (never as null), so that
    # `check_finite` can refuse them before anything is sent
    model_config = ConfigDict(frozen=True, extra="ignore", ser_json_inf_nan="constants")

    seq: int | None = None
    team: str | None = None
    v: int = FORMAT_VERSION
    id: str = Field(default_factory=new_id, min_length=1, max_length=64)
    kind: Kind
    type: str = Field(default="text", min_length=1, max_length=64)
    sender: Name
    recipient: str
    in_reply_to: str | None = None
    trace_id: str | None = None
    traceparent: str | None = Field(default=None, max_length=128)  # OpenTelemetry, W3C format
    ts: float = Field(default_factory=time.time, allow_inf_nan=False)
    deadline: float | None = Field(default=None, allow_inf_nan=False)

    def __init__(self, /, **data: Any) -> None:
        """Validate `data` as pydantic does, refusing bad fields with teamrt's own error
        (`InvalidEnvelope`, or `InvalidName` for a bad sender or recipient)."""
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _invalid(type(self), exc) from None

    body: Any = None

    # -- one-line constructors --

    @staticmethod
    def message(
        sender: str,
        recipient: str,
        body: Any = None,
        *,
        type: str = "text",
        trace_id: str | None = None,
    ) -> Message:
        """A one-way envelope."""
        if _plain(body, type, trace_id, sender, recipient):
            # what _build would make: the fields checked here, by the same rules
            values = _filled(_MESSAGE_VALUES, time.time(), type, sender, recipient, trace_id, body)
            return _new(Message, values, _MESSAGE_SET)
        return _build(
            Message,
            sender=sender,
            recipient=recipient,
            body=_dump_body(body),
            type=_type_of(body, type),
            trace_id=trace_id,
        )

    @staticmethod
    def request(
        sender: str,
        recipient: str,
        body: Any = None,
        *,
        type: str = "request",
        timeout: float | None = None,
        trace_id: str | None = None,
    ) -> Request:
        """An envelope that expects a response; `timeout` sets its `deadline`."""
        now = time.time()
        try:
            deadline = None if timeout is None else now + timeout
        except TypeError:
            raise InvalidEnvelope(
                f"invalid request: timeout: a number of seconds, or None; not {timeout!r}"
            ) from None
        if _plain(body, type, trace_id, sender, recipient) and (
            deadline is None or (builtins.type(deadline) is float and math.isfinite(deadline))
        ):
            values = _filled(_REQUEST_VALUES, now, type, sender, recipient, trace_id, body)
            values["deadline"] = deadline
            return _new(Request, values, _REQUEST_SET)
        return _build(
            Request,
            sender=sender,
            recipient=recipient,
            body=_dump_body(body),
            type=_type_of(body, type),
            ts=now,
            trace_id=trace_id,
            deadline=deadline,
        )

    @staticmethod
    def response(request: Envelope, body: Any = None, *, type: str = "result") -> Response:
        """The answer to `request`, addressed back to its sender."""
        # the request's fields from its dict, read once: each attribute of a model is read
        # through pydantic's __getattr__ hook (a field a `model_construct` left out is None
        # here, which `_plain` refuses: `_build` then reads it as an attribute, and raises)
        fields = request.__dict__
        if fields.get("kind") != "request":
            raise UsageError(f"can only respond to a request, not a {request.kind}")
        sender, recipient, asked = fields.get("recipient"), fields.get("sender"), fields.get("id")
        trace_id = fields.get("trace_id")
        if (
            _plain(body, type, trace_id, sender, recipient)
            and builtins.type(asked) is str
            and 0 < len(asked) <= 64
        ):
            values = _filled(_RESPONSE_VALUES, time.time(), type, sender, recipient, trace_id, body)
            values["in_reply_to"] = asked
            return _new(Response, values, _RESPONSE_SET)
        return _build(
            Response,
            sender=request.recipient,
            recipient=request.sender,
            body=_dump_body(body),
            type=_type_of(body, type),
            in_reply_to=request.id,
            trace_id=request.trace_id,
        )

    @staticmethod
    def error(request: Envelope, error: str | BaseException, message: str = "") -> Response:
        """An error response: `error` is an exception or its type name."""
        if isinstance(error, BaseException):
            message = message or str(error)
            error = type(error).__name__
        try:
            body = ErrorBody(error=error, message=message)
        except PayloadError as exc:
            raise InvalidEnvelope(f"invalid response: body: {exc}") from None
        return Envelope.response(request, body)

    @staticmethod
    def broadcast(
        sender: str,
        body: Any = None,
        *,
        type: str = "text",
        trace_id: str | None = None,
    ) -> Broadcast:
        """One envelope delivered to every member of the roster except the sender."""
        return _build(
            Broadcast,
            sender=sender,
            body=_dump_body(body),
            type=_type_of(body, type),
            trace_id=trace_id,
        )

    def with_deadline(self, deadline: float | None) -> Self:
        """A copy with `deadline` (epoch seconds, or None), as `model_copy(update={"deadline":
        deadline})` makes it (not validated; `test_with_deadline_is_model_copy` holds the two
        to the same result): `request()` sets a request's deadline from its timeout this way,
        on every request."""
        # a user's subclass keeps its extras (an empty dict, where it allows them) and private
        # attributes; teamrt's own classes have neither (extra="ignore", no private attributes:
        # not asked of them, as no answer could change what is copied)
        if builtins.type(self) not in _OWN_CLASSES and (
            self.__pydantic_extra__ is not None or self.__pydantic_private__
        ):
            return self.model_copy(update={"deadline": deadline})
        values = self.__dict__.copy()  # every field, in the declared order
        values["deadline"] = deadline
        return _adopt(builtins.type(self), values, self.__pydantic_fields_set__ | _DEADLINE_SET)

    # -- reading --

    def payload(self, model: builtins.type[P] | None = None) -> P:
        """The body validated as `model` (default: the model registered for `type`)."""
        chosen = model or _payloads.get(self.type)
        if chosen is None:
            raise UsageError(f"no payload model is registered for type {self.type!r}")
        try:
            return chosen.model_validate(self.body)  # type: ignore[return-value]
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(part) for part in first["loc"]) or "body"
            raise PayloadError(
                f"body of envelope {self.id} ({self.type!r} from {self.sender}) does not match "
                f"{chosen.__qualname__}: {where}: {first['msg']}"
            ) from None


class Message(Envelope):
    kind: Literal["message"] = "message"
    recipient: Name


class Request(Envelope):
    kind: Literal["request"] = "request"
    recipient: Name


class Response(Envelope):
    kind: Literal["response"] = "response"
    recipient: Name
    in_reply_to: str = Field(min_length=1, max_length=64)

    @property
    def is_error(self) -> bool:
        return self.type == ERROR_TYPE


class Broadcast(Envelope):
    kind: Literal["broadcast"] = "broadcast"
    recipient: Literal["*"] = "*"

    BROADCAST_RECIPIENT: ClassVar[str] = "*"


#: How many fields an envelope has (a subclass may add its own).
_FIELD_COUNT: Final = len(Envelope.model_fields)

# --- direct construction: the constructors' hot path ------------------------------------------

# A constructor's values list every field in the declared order (the order of a model's
# `__dict__`, which the encoder writes). The fields each constructor passes to the model (its
# `model_fields_set`):
_MESSAGE_SET: Final = frozenset(("sender", "recipient", "body", "type", "trace_id"))
_REQUEST_SET: Final = _MESSAGE_SET | {"ts", "deadline"}
_RESPONSE_SET: Final = _MESSAGE_SET | {"in_reply_to"}
_DEADLINE_SET: Final = frozenset(("deadline",))


def _defaults(kind: str) -> dict[str, Any]:
    """Every field of an envelope of `kind`, in the declared order: the constructors' values
    before they fill in their own (None where they always do)."""
    values: dict[str, Any] = dict.fromkeys(Envelope.model_fields)
    values["v"] = FORMAT_VERSION
    values["kind"] = kind
    return values


def _filled(
    defaults: dict[str, Any],
    now: float,
    type: str,
    sender: Any,
    recipient: Any,
    trace_id: Any,
    body: Any,
) -> dict[str, Any]:
    """A constructor's values: a copy of its kind's defaults (one place holds them)
    with the fields every constructor sets (checked by `_plain` first), the id from the same
    clock read as `ts`."""
    values = defaults.copy()
    values["id"] = _id_at(now)
    values["type"] = type
    values["sender"] = sender
    values["recipient"] = recipient
    values["trace_id"] = trace_id
    values["ts"] = now
    values["body"] = body
    return values


_MESSAGE_VALUES: Final = _defaults("message")
_REQUEST_VALUES: Final = _defaults("request")
_RESPONSE_VALUES: Final = _defaults("response")
#: teamrt's envelope classes whose instances hold no extra fields and no private attributes
#: (all of them: told from their declarations, so that a change to those is not missed).
_OWN_CLASSES: Final = frozenset(
    cls
    for cls in (Envelope, Message, Request, Response, Broadcast)
    if not cls.__private_attributes__ and cls.model_config.get("extra") != "allow"
)


#: Bodies of these types are data (no model to dump): told without isinstance's ABC check.
_DATA: Final = frozenset((dict, list, str, int, float, bool, type(None), tuple))


def _plain(
    body: Any, type_name: object, trace_id: object, sender: object, recipient: object
) -> bool:
    """True if a constructor may build its envelope directly (`_new`): the body is not a model
    (which `_dump_body` and `_type_of` turn into data and a type name), the type and trace id
    are plain strings pydantic would keep as they are, and both names are valid (as the
    models' `Name` says). One call for all of it: it runs once per envelope made."""
    return (
        (builtins.type(body) in _DATA or not isinstance(body, BaseModel))
        and builtins.type(type_name) is str
        and 0 < len(type_name) <= 64
        and (trace_id is None or builtins.type(trace_id) is str)
        and builtins.type(sender) is str
        and (sender in valid_names or is_name(sender))
        and builtins.type(recipient) is str
        and (recipient in valid_names or is_name(recipient))
    )


class Constructor(Protocol):
    def __call__(self, cls: type[E], values: dict[str, Any], fields_set: Iterable[str]) -> E: ...


def _construct_public(cls: type[E], values: dict[str, Any], fields_set: Iterable[str]) -> E:
    return cast(E, cls.model_construct(set(fields_set), **values))


# what `model_construct` does for the envelope models (no extras kept, no private attributes,
# no post-init), without its per-field Python loop: the values come complete and valid
# (`teamrt._assemble`)
_DIRECT: Final = not any(
    cls.__pydantic_post_init__ for cls in (Message, Request, Response, Broadcast)
)
#: An envelope of class `cls` with `values` (every field, in the declared order, already valid)
#: and `fields_set`, built without validation.
_new: Final[Constructor] = assemble_copy if _DIRECT else _construct_public
#: `_new` for a `fields_set` that is a new set of the caller's own, which the envelope keeps.
_adopt: Final = assemble if _DIRECT else _construct_public

AnyEnvelope = Annotated[Message | Request | Response | Broadcast, Field(discriminator="kind")]

#: The one adapter every envelope is read and written through.
ENVELOPE_ADAPTER: TypeAdapter[Message | Request | Response | Broadcast] = TypeAdapter(AnyEnvelope)
