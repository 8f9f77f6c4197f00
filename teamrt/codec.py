"""The envelope line codec without pydantic on the hot path: orjson encoding, typed decoding.

Theory of operation. `encode` writes exactly the bytes pydantic's serializer writes for an
envelope (the fields after `seq` and `team`, compact, without the opening brace), but through
orjson, whose serialization costs about a third of pydantic's (`benchmarks/codec.py` measures
the whole of `encode`, checks included). The two agree on everything an envelope normally holds
(field order, UTF-8 output with only `"`, `\\` and control characters escaped, float formatting,
nested lists and dicts); wherever they could disagree, the envelope goes to pydantic instead:

- ints beyond 64 bits, dict keys that are not str, lone surrogates, nesting deeper than orjson's
  limit, and any type that is not plain JSON data (datetimes, dataclasses, bytes, subclasses of
  str, int, float, dict or list, models...), which orjson refuses here;
- NaN and Infinity, which orjson writes as `null` where pydantic writes `NaN` / `Infinity` (and
  `check_finite` then refuses the envelope): `ts` and `deadline` are checked directly, and a list,
  tuple or dict body is searched for non-finite floats before its bytes are used: a flat one (up
  to 16 scalars, most bodies) item by item in `encode` itself, any other by a walk through it (in
  a long line only if its encoding holds a `null`);
- `v`, `ts` or `deadline` of another type than declared (pydantic's typed serializers coerce them),
  a field model_copy was given that the models do not have, and envelope classes other than the
  four kinds and their base;
- a string field holding something else (model_copy and model_construct validate nothing):
  pydantic's serializer would write it with a warning, and the owner quarantine the line, so
  pydantic's path refuses it (`InvalidEnvelope`), as it refuses a body that is not JSON data.

One difference remains, out of reach of a validated envelope: an `orjson.Fragment` in a body is
written as its raw bytes (pydantic refuses it).

`decode_fields` is the typed bulk read. msgspec parses a line straight into an `EnvelopeFields`
record (a frozen msgspec struct, built in C and not tracked by the garbage collector), checking
each field's type, the literal kinds and the string lengths as it parses; the rest of the models'
rules are checked after (names, `*` only on broadcasts, `in_reply_to` on responses, the body
against its registered payload model). Only the lines teamrt writes, and lines like them, take
this path: anything it does not accept as it stands (a JSON error, a missing, extra or mistyped
field, a value pydantic would coerce such as `"seq": "5"`, a time beyond 2**53, a long line
nested deeper than pydantic reads) goes to the checked path, which parses with orjson and checks
every field long-hand, and from there whatever it cannot decide goes to pydantic, which decides
exactly as `teamrt.mail.log.decode_line` does and gives the same reason for a rejection. So a
line is accepted or refused, with the same reason, exactly as `decode_line` would; rejections
(quarantined lines) are rare and may cost what they cost today. Both refuse a line that gives a
key twice in one object (every parser here keeps the last value; others keep the first), which
`repeats_a_key` tells from a count of the line's colons, parsing again only in rare cases.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Final, Literal, NoReturn

import msgspec
import orjson
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from teamrt.envelopes import (
    ENVELOPE_ADAPTER,
    Broadcast,
    Envelope,
    Message,
    Request,
    Response,
    _new,
    check_finite,
    payload_model,
    registered_payload,
)
from teamrt.errors import InvalidEnvelope, TeamrtError
from teamrt.names import is_name as _valid_name
from teamrt.names import valid_names as _valid_names

__all__ = [
    "REPEATED_KEY",
    "EnvelopeFields",
    "decode_fields",
    "encode",
    "encode_with_pydantic",
    "repeats_a_key",
]

#: The envelope's fields, in the order they are written.
FIELD_NAMES: Final = (
    "seq",
    "team",
    "v",
    "id",
    "kind",
    "type",
    "sender",
    "recipient",
    "in_reply_to",
    "trace_id",
    "traceparent",
    "ts",
    "deadline",
    "body",
)
_ALL_FIELDS: Final = frozenset(FIELD_NAMES)
_CLASS_BY_KIND: Final[dict[str, type[Message | Request | Response | Broadcast]]] = {
    "message": Message,
    "request": Request,
    "response": Response,
    "broadcast": Broadcast,
}
_ENCODABLE: Final = frozenset((Envelope, *_CLASS_BY_KIND.values()))

# the codec writes and checks the fields by name: a field added to the models must be added here
for _cls in _ENCODABLE:
    if tuple(_cls.model_fields) != FIELD_NAMES:  # pragma: no cover - a guard for model changes
        raise ImportError(f"teamrt.codec does not know the fields of {_cls.__name__}")


# --- encoding ---------------------------------------------------------------------------------

# subclasses of str, int, float, dict and list, dataclasses and datetimes go to `_refuse`, that is
# to pydantic; orjson still writes enums (by value) and UUIDs itself, as pydantic does
_OPTIONS: Final = (
    orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
)
_finite: Final = math.isfinite
_dumps: Final = orjson.dumps
# a body of up to this many items is looked at item by item first: most bodies are one flat dict
# or list of scalars, which that settles without a walk
_FLAT_ITEMS: Final = 16
# in a line of up to this many bytes, a body that is not flat is walked; in a longer one, only if
# its encoding holds a null: searching the line first pays off only once the line is long
_WALK_BELOW: Final = 512


#: How deeply an envelope's body may nest (`[]` is one level): deeper is refused by `send()` and
#: quarantined by its reader alike, far inside what every parser on either side reads.
MAX_BODY_DEPTH: Final = 128


def too_deep(body: Any) -> bool:
    """True if `body` nests deeper than `MAX_BODY_DEPTH`: the writer's and the reader's rule."""
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        kind = type(value)
        if kind is dict:
            items: Any = value.values()
        elif kind is list or kind is tuple:
            items = value
        else:
            continue
        if depth > MAX_BODY_DEPTH:
            return True
        stack.extend((item, depth + 1) for item in items)
    return False


def _not_finite(body: Any) -> bool:
    stack: list[Any] = [body]
    while stack:
        value = stack.pop()
        kind = type(value)
        if kind is float:
            if not _finite(value):
                return True
        elif kind is dict:
            stack.extend(value.values())
        elif kind is list or kind is tuple:
            stack.extend(value)
    return False


def body_refusal(body: Any) -> str | None:
    """Why a body that was parsed from a line may not be delivered (None if it may): too deep
    for `send()` to have written it, or holding NaN or Infinity, which JSON cannot spell."""
    if too_deep(body):
        return f"schema: body: nested deeper than {MAX_BODY_DEPTH} levels"
    if _not_finite(body):
        return "schema: body: NaN or Infinity, which JSON does not allow"
    return None


def _refuse(value: object) -> NoReturn:
    raise TypeError


def encode_with_pydantic(envelope: Envelope) -> bytes:
    """What `encode` returns, through pydantic's serializer (the reference, and the fallback)."""
    data: bytes = type(envelope).__pydantic_serializer__.to_json(envelope)
    # seq and team are the first two fields and can hold no '"v":' (an int and a safe name),
    # so slicing is exact, and cheaper than asking the serializer to exclude them
    return data[data.index(b'"v":') :]


def _holds_bytes(body: Any) -> bool:
    stack: list[Any] = [body]
    while stack:
        value = stack.pop()
        if isinstance(value, bytes | bytearray | memoryview):
            return True
        if type(value) is dict:
            stack.extend(value.keys())
            stack.extend(value.values())
        elif type(value) is list or type(value) is tuple:
            stack.extend(value)
    return False


def _by_serializer(envelope: Envelope, finite: bool) -> bytes:
    _check_depth(envelope.body)
    if _holds_bytes(envelope.body):
        # pydantic would write b"abc" as "abc" (received as a str, not the bytes sent) and
        # refuse b"\xff": neither is the body sent
        raise InvalidEnvelope(
            f"invalid {envelope.kind}: its body holds bytes, which JSON cannot carry; "
            "decode them to str or encode them (base64) first"
        )
    try:
        # a field of another type than declared (given through model_copy, which does not
        # validate) is refused here, not written for its reader to quarantine
        data: bytes = type(envelope).__pydantic_serializer__.to_json(envelope, warnings="error")
        encoded = data[data.index(b'"v":') :]
        if finite:
            check_finite(envelope, encoded)
    except TeamrtError:
        raise
    except PydanticSerializationError as exc:
        if "UnexpectedValue" in str(exc) and "field_name='body'" not in str(exc):
            raise _mistyped(envelope, exc) from None
        raise InvalidEnvelope(
            f"invalid {envelope.kind}: its body cannot be written as JSON ({exc}); "
            "give it JSON data: dicts with str keys, lists, str, int, float, bool, None"
        ) from None
    except (TypeError, ValueError) as exc:
        raise _mistyped(envelope, exc) from None
    return encoded


def _mistyped(envelope: Envelope, exc: Exception) -> InvalidEnvelope:
    return InvalidEnvelope(
        f"invalid {envelope.kind}: a field holds a value of another type than declared "
        f"({' '.join(str(exc).split())[:300]}); build envelopes with the Envelope constructors "
        "(model_copy does not check what it is given)"
    )


def _plain_and_finite(container: dict[str, Any] | list[Any] | tuple[Any, ...]) -> bool:
    """True if `container` holds only JSON data (dicts, lists, tuples, str, int, bool, None) and
    finite floats: then orjson's `null`s in it stand for None, never for NaN or Infinity."""
    stack: list[Any] = [container]
    while stack:
        value = stack.pop()
        for item in value.values() if type(value) is dict else value:
            kind = type(item)
            if kind is str or kind is int or item is None or kind is bool:
                continue
            if kind is float:
                if not _finite(item):
                    return False
            elif kind is dict or kind is list or kind is tuple:
                stack.append(item)
            else:
                return False
    return True


def _body_finite(body: dict[str, Any] | list[Any] | tuple[Any, ...], data: bytes) -> bool:
    """True if `body`, encoded by orjson in `data`, holds no NaN or Infinity (and nothing else
    that the walk refuses): a short line's body is walked, a long one's only if its bytes hold a
    null (a ',"' cannot occur inside a JSON string, so the first ',"body":' is the key)."""
    if len(data) > _WALK_BELOW and data.find(b"null", data.find(b',"body":')) < 0:
        return True
    return _plain_and_finite(body)


def _check_depth(body: Any) -> None:
    if too_deep(body):
        raise InvalidEnvelope(
            f"invalid envelope: its body nests deeper than {MAX_BODY_DEPTH} levels, "
            "which no reader accepts; flatten it"
        )


def _check_shallow(body: dict[str, Any] | list[Any] | tuple[Any, ...], data: bytes) -> None:
    """Refuse `body`, encoded in `data`, if it nests deeper than `MAX_BODY_DEPTH`: a line with
    that few brackets cannot (a count over the bytes, instead of a walk over every body);
    otherwise the exact walk decides."""
    if data.count(b"[") + data.count(b"{") > MAX_BODY_DEPTH:
        _check_depth(body)


def _strings_alike(fields: dict[str, Any]) -> bool:
    """True if the str fields hold str (None where allowed): model_copy may have given them
    anything, which pydantic's serializer refuses here (and the owner would quarantine)."""
    trace_id, traceparent, in_reply_to = (
        fields["trace_id"],
        fields["traceparent"],
        fields["in_reply_to"],
    )
    return (
        type(fields["type"]) is str
        and type(fields["sender"]) is str
        and type(fields["recipient"]) is str
        and type(fields["id"]) is str
        and (trace_id is None or type(trace_id) is str)
        and (traceparent is None or type(traceparent) is str)
        and (in_reply_to is None or type(in_reply_to) is str)
    )


def encode(envelope: Envelope, *, finite: bool = False) -> bytes:
    """The envelope's fields after `seq` and `team` (which `log.stamp` fills in), as compact JSON
    without the opening brace and without a newline: byte for byte what pydantic writes.

    `finite=True` refuses an envelope holding NaN or Infinity (`InvalidEnvelope`, as
    `check_finite`), which the orjson path has ruled out already: only pydantic's output is
    searched. A body nested deeper than `MAX_BODY_DEPTH`, or one that is not JSON data, is
    `InvalidEnvelope` whatever `finite` says: its reader would refuse it."""
    # pydantic keeps the fields in `__dict__` in their declared order (validation, model_copy
    # and model_construct all do); a 15th key is something model_copy was given: not ours to write
    fields = envelope.__dict__
    if type(envelope) in _ENCODABLE and len(fields) == 14:
        ts = fields["ts"]
        deadline = fields["deadline"]
        if (
            type(ts) is float
            and _finite(ts)
            and (deadline is None or (type(deadline) is float and _finite(deadline)))
            and type(fields["v"]) is int
            and _strings_alike(fields)
        ):
            try:
                data = _dumps(fields, default=_refuse, option=_OPTIONS)
            except orjson.JSONEncodeError:
                return _by_serializer(envelope, finite)
            body = fields["body"]
            kind = type(body)
            if kind is dict or kind is list or kind is tuple:
                # orjson writes NaN and Infinity as null (pydantic as NaN and Infinity), so the
                # body must be shown to hold neither: a flat one by this loop (cheaper than the
                # walk's call and stack for a few items), from its first nested container (or
                # anything else) on by the general check
                if len(body) <= _FLAT_ITEMS:
                    for item in body.values() if kind is dict else body:
                        item_kind = type(item)
                        if (
                            item_kind is str
                            or item_kind is int
                            or item is None
                            or item_kind is bool
                        ):
                            continue
                        if item_kind is float:
                            if _finite(item):
                                continue
                            return _by_serializer(envelope, finite)
                        if not _body_finite(body, data):
                            return _by_serializer(envelope, finite)
                        _check_shallow(body, data)
                        break
                elif not _body_finite(body, data):
                    return _by_serializer(envelope, finite)
                else:
                    _check_shallow(body, data)
            elif kind is float and not _finite(body):
                return _by_serializer(envelope, finite)
            # then orjson wrote seq and team first, as `{"seq":null,"team":null,`; otherwise a
            # '"v":' can only be the next key
            if fields["seq"] is None and fields["team"] is None:
                return data[24:]
            return data[data.index(b'"v":') :]
    return _by_serializer(envelope, finite)


# --- decoding ---------------------------------------------------------------------------------


class EnvelopeFields(msgspec.Struct, frozen=True, gc=False, forbid_unknown_fields=True):
    """The fields of one decoded envelope line, with no pydantic model built.

    A read-only, slotted record: the same attribute names and values as the envelope
    `decode_line` returns, plus `fields_set` (the fields the line carried, as
    `model_fields_set`). `to_envelope()` builds that envelope. Records compare equal when their
    fields do. Not tracked by the garbage collector (a batch of thousands costs its passes
    nothing); a record never refers back to itself, so nothing it holds can leak.
    """

    seq: int
    team: str | None
    v: int
    id: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    kind: Literal["message", "request", "response", "broadcast"]
    type: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    sender: str
    recipient: str
    in_reply_to: str | None
    trace_id: str | None
    traceparent: Annotated[str, msgspec.Meta(max_length=128)] | None
    ts: float
    deadline: float | None
    body: Any
    # not a field of the line: one that carries a `fields_set` key (an extra field, which the
    # models ignore) is decoded the checked way, told by this default not being kept
    fields_set: frozenset[str] = _ALL_FIELDS

    @classmethod
    def of(cls, envelope: Envelope) -> EnvelopeFields:
        """The record of `envelope`: its fields, and the ones it was given as `fields_set`."""
        values = envelope.__dict__
        return cls(
            **{name: values[name] for name in FIELD_NAMES},
            fields_set=frozenset(envelope.model_fields_set),
        )

    @property
    def is_error(self) -> bool:
        """An error response (as `Response.is_error`)."""
        return self.kind == "response" and self.type == "error"

    def to_envelope(self) -> Message | Request | Response | Broadcast:
        """The pydantic envelope, equal to what `decode_line` returns for the same line."""
        return _construct(
            _CLASS_BY_KIND[self.kind],
            {
                "seq": self.seq,
                "team": self.team,
                "v": self.v,
                "id": self.id,
                "kind": self.kind,
                "type": self.type,
                "sender": self.sender,
                "recipient": self.recipient,
                "in_reply_to": self.in_reply_to,
                "trace_id": self.trace_id,
                "traceparent": self.traceparent,
                "ts": self.ts,
                "deadline": self.deadline,
                "body": self.body,
            },
            self.fields_set,
        )


# what model_construct does, without its per-field loop (one constructor for all of teamrt)
_construct: Final = _new

# orjson parses an integer beyond 64 bits as a float, pydantic as an int: a float that large in a
# line goes to pydantic; so does an int time that a float might not represent exactly
_BIG: Final = 2.0**63
_EXACT: Final = 2**53
# pydantic's JSON parser refuses nesting deeper than 201 levels (orjson's limit is 1024)
_MAX_DEPTH: Final = 128
# a line shorter than this cannot nest deeper than pydantic reads (202 levels take 404 bytes)
_SHALLOW_BELOW: Final = 404


def shallow(line: bytes) -> bool:
    """True if `line` cannot nest deeper than pydantic's parser reads (msgspec's reads deeper,
    so a line it may take must be shallow): a short line, or one with few brackets (every line
    teamrt writes for a plain body)."""
    return len(line) < _SHALLOW_BELOW or line.count(b"{") + line.count(b"[") <= _MAX_DEPTH


def _parsed_alike(value: Any, depth: int) -> bool:
    """True if pydantic's parser reads this container of a line as orjson did."""
    if depth > _MAX_DEPTH:
        return False
    for item in value.values() if type(value) is dict else value:
        kind = type(item)
        if kind is float:
            if not -_BIG < item < _BIG:
                return False
        elif (kind is dict or kind is list) and not _parsed_alike(item, depth + 1):
            return False
    return True


def _extras_alike(obj: dict[str, Any]) -> bool:
    """Fields the models do not know are ignored, but pydantic parses them all the same."""
    for key in obj.keys() - _ALL_FIELDS:
        value = obj[key]
        kind = type(value)
        if kind is float:
            if not -_BIG < value < _BIG:
                return False
        elif (kind is dict or kind is list) and not _parsed_alike(value, 2):
            return False
    return True


def reason(exc: ValidationError) -> str:
    """A validation error as the one-line reason a quarantine record gives."""
    first = exc.errors(include_url=False)[0]
    if first["type"] == "json_invalid":
        return f"json: {first['msg']}"
    where = ".".join(str(part) for part in first["loc"]) or "envelope"
    return f"schema: {where}: {first['msg']}"


#: The key of a claim check's reference body (teamrt/mail/claims.py).
CLAIM: Final = "$claim"


def is_claim(body: Any) -> bool:
    """True if `body` is a claim check's reference (a dict of one key, `$claim`): its payload
    is validated once the receiver has fetched it."""
    return type(body) is dict and len(body) == 1 and CLAIM in body


def _payload_reason(registered: type[BaseModel], body: Any) -> str | None:
    if is_claim(body):
        return None
    try:
        registered.model_validate(body)
    except ValidationError as exc:
        return "payload: " + reason(exc).partition(": ")[2]
    return None


_DEFAULTS: Final[dict[str, Any]] = {
    "team": None,
    "v": 1,
    "type": "text",
    "recipient": "*",  # only a broadcast's: for the other kinds it fails the name check
    "in_reply_to": None,  # not a response's: it fails the check there
    "trace_id": None,
    "traceparent": None,
    "deadline": None,
    "body": None,
}


def _fields(obj: dict[str, Any], fields_set: frozenset[str] = _ALL_FIELDS) -> Any:
    """Check a parsed line as the models would: `EnvelopeFields`, a payload reason, or None
    when pydantic must decide. Written out long-hand: it runs once per envelope read."""
    try:
        seq = obj["seq"]
        team = obj["team"]
        v = obj["v"]
        identifier = obj["id"]
        kind = obj["kind"]
        type_name = obj["type"]
        sender = obj["sender"]
        recipient = obj["recipient"]
        in_reply_to = obj["in_reply_to"]
        trace_id = obj["trace_id"]
        traceparent = obj["traceparent"]
        ts = obj["ts"]
        deadline = obj["deadline"]
        body = obj["body"]
    except KeyError:
        if fields_set is not _ALL_FIELDS:
            return None  # a required field is missing
        # the fields with a fixed default may be left out (lines from before `traceparent`);
        # `id` and `ts` default to new values, which only pydantic's decode may make
        return _fields(_DEFAULTS | obj, _ALL_FIELDS.intersection(obj))
    if (
        type(seq) is not int
        or type(v) is not int
        or (team is not None and type(team) is not str)
        or type(identifier) is not str
        or not 0 < len(identifier) <= 64
        or type(type_name) is not str
        or not 0 < len(type_name) <= 64
        or type(sender) is not str
        or (sender not in _valid_names and not _valid_name(sender))
        or (trace_id is not None and type(trace_id) is not str)
        or (traceparent is not None and (type(traceparent) is not str or len(traceparent) > 128))
    ):
        return None
    if kind == "broadcast":
        if recipient != "*":
            return None
    elif kind == "message" or kind == "request" or kind == "response":
        if type(recipient) is not str or (
            recipient not in _valid_names and not _valid_name(recipient)
        ):
            return None
    else:
        return None
    if kind == "response":
        if type(in_reply_to) is not str or not 0 < len(in_reply_to) <= 64:
            return None
    elif in_reply_to is not None and type(in_reply_to) is not str:
        return None
    if type(ts) is not float:
        if type(ts) is not int or not -_EXACT <= ts <= _EXACT:
            return None
        ts = float(ts)
    elif not -_BIG < ts < _BIG:
        return None
    if deadline is not None:
        if type(deadline) is not float:
            if type(deadline) is not int or not -_EXACT <= deadline <= _EXACT:
                return None
            deadline = float(deadline)
        elif not -_BIG < deadline < _BIG:
            return None
    body_kind = type(body)
    if body_kind is dict or body_kind is list:
        if not _parsed_alike(body, 2):
            return None
    elif body_kind is float and not -_BIG < body < _BIG:
        return None
    if len(obj) > 14 and not _extras_alike(obj):
        return None
    registered = payload_model(type_name)
    if registered is not None:
        refused = _payload_reason(registered, body)
        if refused is not None:
            return refused
    return EnvelopeFields(
        seq,
        team,
        v,
        identifier,
        kind,
        type_name,
        sender,
        recipient,
        in_reply_to,
        trace_id,
        traceparent,
        ts,
        deadline,
        body,
        fields_set,
    )


def _by_pydantic(line: bytes) -> EnvelopeFields | str:
    """The slow path: decide as `decode_line` does, through the pydantic models."""
    try:
        envelope: Envelope = ENVELOPE_ADAPTER.validate_json(line)
    except ValidationError as exc:
        return reason(exc)
    if envelope.seq is None:
        return "schema: seq: field required"
    refusal = body_refusal(envelope.body)
    if refusal is not None:
        return refusal
    registered = payload_model(envelope.type)
    if registered is not None:
        refused = _payload_reason(registered, envelope.body)
        if refused is not None:
            return refused
    return EnvelopeFields.of(envelope)


_typed_decode: Final = msgspec.json.Decoder(EnvelopeFields).decode


def _typed(line: bytes) -> EnvelopeFields | str | None:
    """The fast path: msgspec parses the line straight into an `EnvelopeFields`, checking types,
    kinds and lengths as it goes; what it cannot express is checked here. None when the line
    must go the checked way (any error, an extra or missing field, a time beyond 2**53)."""
    try:
        fields = _typed_decode(line)
    except (msgspec.DecodeError, RecursionError):
        return None
    sender, recipient, kind = fields.sender, fields.recipient, fields.kind
    if (sender not in _valid_names and not _valid_name(sender)) or (
        recipient != "*"
        if kind == "broadcast"
        else recipient not in _valid_names and not _valid_name(recipient)
    ):
        return None
    if kind == "response":
        in_reply_to = fields.in_reply_to
        if in_reply_to is None or not 0 < len(in_reply_to) <= 64:
            return None
    deadline = fields.deadline
    if (
        not -_EXACT <= fields.ts <= _EXACT
        or (deadline is not None and not -_EXACT <= deadline <= _EXACT)
        or fields.fields_set is not _ALL_FIELDS
    ):
        return None
    registered = registered_payload(fields.type)
    if registered is not None:
        refused = _payload_reason(registered, fields.body)
        if refused is not None:
            return refused
    return fields


#: The reason a line that gives one key twice in an object is refused.
REPEATED_KEY: Final = "json: a key appears twice in one object"

# the colons an envelope line holds besides its body's: one after each of its 14 field names
_FIELD_COLONS: Final = len(FIELD_NAMES)


class _Repeated(Exception):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Repeated
    return obj


def _repeats_a_key_slowly(line: bytes) -> bool:
    try:
        json.loads(line, object_pairs_hook=_unique_pairs)
    except _Repeated:
        return True
    except (ValueError, RecursionError):  # the decoders parsed it: theirs is the last word
        return False
    return False


def repeats_a_key(line: bytes, body: Any) -> bool:
    """True if an object in `line`, an accepted envelope line whose decoded body is `body`,
    gives one key twice (every JSON parser here keeps the last value; others keep the first,
    so such a line means two things).

    Counted, not parsed again: outside strings, a JSON line holds one colon per object member,
    so a line without repeated keys holds the 14 colons of its fields, one per member of its
    body's objects and the ones inside its strings; each repeated member adds one that the
    decoded values do not hold. A line with no more colons than its fields and its body's
    members (a flat object body without colons in it: most lines) repeats nothing. Otherwise
    the colons inside the decoded strings are counted too, unless a `\\u` escape (it may spell
    a colon the line does not show) makes that unsound; what is left over is rare (a colon in
    a field's string, say), and the line is parsed again keeping every pair."""
    extra = line.count(b":") - _FIELD_COLONS
    kind = type(body)
    if extra == 0 or (kind is dict and extra == len(body)):
        return False
    if kind is str:
        extra -= body.count(":")
    elif kind is dict or kind is list:
        try:
            extra -= _dumps(body).count(b":")  # orjson writes every colon as it is
        except orjson.JSONEncodeError:  # an int beyond 64 bits, say
            extra = -1
    if extra == 0 and (line.find(b"\\") < 0 or b"\\u" not in line):
        return False
    return _repeats_a_key_slowly(line)


def decode_fields(line: bytes) -> EnvelopeFields | str:
    """Decode one line (without its newline) into its fields, or the reason it is unusable.

    Accepts and refuses exactly the lines `decode_line` does, with the same reason strings;
    `.to_envelope()` on the result equals `decode_line(line)`.
    """
    if len(line) < _SHALLOW_BELOW or shallow(line):  # (the length alone decides most lines)
        decoded = _typed(line)
        if decoded is not None:
            if isinstance(decoded, str):
                return decoded
            return REPEATED_KEY if repeats_a_key(line, decoded.body) else decoded
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return _checked(_by_pydantic(line), line)
    if type(obj) is dict:
        checked: EnvelopeFields | str | None = _fields(obj)
        if checked is not None:
            return _checked(checked, line)
    return _checked(_by_pydantic(line), line)


def _checked(decoded: EnvelopeFields | str, line: bytes) -> EnvelopeFields | str:
    if isinstance(decoded, str) or not repeats_a_key(line, decoded.body):
        return decoded
    return REPEATED_KEY
