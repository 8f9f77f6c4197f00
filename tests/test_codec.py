"""The orjson codec against the pydantic path it replaces: byte-identical encoding, and a typed
decode that accepts, refuses and explains exactly as `decode_line` does."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import enum
import json
import math
import uuid
import warnings
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from teamrt import codec, names
from teamrt.bench.harness import sample_envelopes as bench_envelopes
from teamrt.codec import FIELD_NAMES, EnvelopeFields, decode_fields, encode
from teamrt.envelopes import (
    ENVELOPE_ADAPTER,
    Envelope,
    Message,
    Response,
    _construct_public,
    check_finite,
    new_id,
    register_payload,
)
from teamrt.errors import InvalidEnvelope
from teamrt.mail.log import decode_line, stamp
from teamrt.team import protocol  # registers the protocol's payload models
from tests.support.hypothesis_profiles import examples

SAMPLES = Path(__file__).resolve().parent.parent / "mailboxes" / "samples"


class Point(BaseModel):
    x: int
    y: list[float] = []


register_payload("test_codec_point", Point)
PAYLOAD_TYPES = ["error", "test_codec_point", protocol.RESULT, protocol.IDLE, protocol.SHUTDOWN]


def pydantic_encode(envelope: Envelope) -> bytes:
    """The encoding as `log.encode` wrote it before the codec: pydantic's serializer."""
    data: bytes = type(envelope).__pydantic_serializer__.to_json(envelope)
    return data[data.index(b'"v":') :]


def assert_encodes_alike(envelope: Envelope) -> None:
    """`encode` writes what pydantic writes, or refuses (`InvalidEnvelope`, never a foreign
    error) what pydantic cannot write and what no reader would accept (a body too deep)."""
    try:
        expected = pydantic_encode(envelope)
    except Exception:
        with pytest.raises(InvalidEnvelope):
            encode(envelope)
        return
    if codec.too_deep(envelope.body) or codec._holds_bytes(envelope.body):
        with pytest.raises(InvalidEnvelope, match=r"deeper|bytes"):
            encode(envelope)
        return
    assert encode(envelope) == expected
    # the NaN/Infinity refusal sees the same bytes
    refused: list[bool] = []
    for encoded in (expected, encode(envelope)):
        try:
            check_finite(envelope, encoded)
            refused.append(False)
        except InvalidEnvelope:
            refused.append(True)
    assert refused[0] == refused[1]


# --- strategies -------------------------------------------------------------------------------

NAMES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", fullmatch=True)
TRICKY = (
    "\x00\x01\x08\t\n\x0b\x0c\r\x1f\x7f\x80\x9f\xa0\u2028\u2029\ufeff\uffff/\\\"'<>&é中😀\U0010ffff"
)
TEXT = (
    st.text()
    | st.text(alphabet=st.sampled_from(TRICKY))
    | st.text(st.characters(max_codepoint=0x7F))
)
BIG_INTS = st.sampled_from(
    [
        2**53,
        2**53 + 1,
        2**63 - 1,
        2**63,
        -(2**63),
        -(2**63) - 1,
        2**64 - 1,
        2**64,
        10**30,
        -(10**40),
    ]
)
INTS = st.integers() | BIG_INTS | st.integers(min_value=-(2**70), max_value=2**70)
FLOATS = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [0.0, -0.0, 1e16, 1e-7, 1.5e-5, 0.1, 1e22, 5e-324, 1.7976931348623157e308, 2.0**63, 1e19]
)
SCALARS = st.none() | st.booleans() | INTS | FLOATS | TEXT
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5),
    max_leaves=25,
)
BODIES = JSON | st.tuples(SCALARS, SCALARS) | st.text(min_size=2048, max_size=2100)
SHORT = st.text(min_size=1, max_size=64)
TYPES = SHORT | st.sampled_from(["text", "task", "result", *PAYLOAD_TYPES])
TIMES = FLOATS
AN_ID = new_id()


@st.composite
def envelopes(draw: st.DrawFn) -> Envelope:
    """Any valid envelope of the four kinds, its fields chosen freely within the models' rules."""
    kind = draw(st.sampled_from(["message", "request", "response", "broadcast"]))
    fields: dict[str, Any] = {
        "kind": kind,
        "id": draw(SHORT | st.just(AN_ID)),
        "type": draw(TYPES),
        "sender": draw(NAMES),
        "recipient": "*" if kind == "broadcast" else draw(NAMES),
        "trace_id": draw(st.none() | TEXT),
        "traceparent": draw(st.none() | st.text(max_size=128)),
        "ts": draw(TIMES),
        "deadline": draw(st.none() | TIMES),
        "body": draw(BODIES),
    }
    if kind == "response":
        fields["in_reply_to"] = draw(SHORT)
    elif draw(st.booleans()):
        fields["in_reply_to"] = draw(st.none() | TEXT)
    return ENVELOPE_ADAPTER.validate_python(fields)


@st.composite
def built(draw: st.DrawFn) -> Envelope:
    """Envelopes made by the constructors, as teamrt makes them."""
    sender, recipient = draw(NAMES), draw(NAMES)
    body = draw(BODIES)
    trace = draw(st.none() | TEXT)
    request = Envelope.request(
        sender, recipient, body, type=draw(SHORT), timeout=draw(st.none() | TIMES), trace_id=trace
    )
    return draw(
        st.sampled_from(
            [
                Envelope.message(sender, recipient, body, trace_id=trace),
                request,
                Envelope.response(request, body),
                Envelope.error(request, ValueError(draw(TEXT))),
                Envelope.broadcast(sender, body, type=draw(SHORT), trace_id=trace),
            ]
        )
    )


# --- encoding ---------------------------------------------------------------------------------


@settings(max_examples=examples(400))
@given(envelopes() | built())
def test_encode_is_byte_identical_to_pydantic(envelope: Envelope) -> None:
    assert_encodes_alike(envelope)


def test_encode_on_the_bench_and_sample_envelopes() -> None:
    for envelope in bench_envelopes(1000):
        assert encode(envelope) == pydantic_encode(envelope)
    samples = sorted(SAMPLES.glob("*/inboxes/*.jsonl"))
    assert samples
    count = 0
    for path in samples:
        for line in path.read_bytes().splitlines():
            decoded = decode_line(line)
            assert isinstance(decoded, Envelope)
            assert encode(decoded) == pydantic_encode(decoded)
            count += 1
    assert count >= 20


class Colour(enum.Enum):
    RED = "red"
    POINT = (1, 2.5)
    NAN = math.nan


class Level(enum.IntEnum):
    HIGH = 3


class Word(str):
    pass


@dataclasses.dataclass
class Pair:
    a: int
    b: str


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


ODD_BODIES: list[Any] = [
    2**64,
    -(2**63) - 1,
    {"n": [1, {"m": 10**30}]},
    math.nan,
    math.inf,
    -math.inf,
    {"a": [1.5, math.nan]},
    {"a": None, "b": 1.5},
    {"long": "x" * 600, "n": [None, math.nan]},
    {"long": "x" * 600, "n": [None, 1.5]},
    {"long": "x" * 600, "n": [2.5, Colour.RED]},
    [None, math.inf],
    (None, 1),
    {1: "int key"},
    {Word("k"): 1},
    Word("text"),
    collections.OrderedDict(a=1),
    collections.defaultdict(list, a=[1]),
    Level.HIGH,
    Colour.RED,
    Colour.POINT,
    [None, Colour.NAN],
    uuid.UUID(int=7),
    [None, uuid.UUID(int=7)],
    datetime.datetime(2026, 1, 2, 3, 4, 5, 678, tzinfo=datetime.UTC),
    datetime.date(2026, 1, 2),
    decimal.Decimal("1.50"),
    {"set": {1}},
    frozenset({"x"}),
    Pair(1, "b"),
    Point(x=1),
    _nested(300),
    "\ud800 lone surrogate",
    {"\udc00": 1},
    True,
    None,
    "",
]


@pytest.mark.parametrize("body", ODD_BODIES, ids=lambda body: type(body).__name__)
def test_bodies_orjson_cannot_write_alike_go_to_pydantic(body: Any) -> None:
    envelope = Envelope.message("lead", "worker").model_copy(update={"body": body})
    assert_encodes_alike(envelope)


@pytest.mark.parametrize("body", [b"bytes", b"\xff", {"k": [bytearray(b"x")]}])
def test_bodies_holding_bytes_are_refused_not_turned_into_str(body: Any) -> None:
    envelope = Envelope.message("lead", "worker").model_copy(update={"body": body})
    with pytest.raises(InvalidEnvelope, match="bytes"):
        encode(envelope)


def test_nan_and_infinity_are_still_refused() -> None:
    for body in ({"x": math.nan}, [None, math.inf], -math.inf, {"a": [None, {"b": math.nan}]}):
        envelope = Envelope.message("lead", "worker", body)
        encoded = encode(envelope)
        assert encoded == pydantic_encode(envelope)
        with pytest.raises(InvalidEnvelope):
            check_finite(envelope, encoded)
    message = Envelope.message("lead", "worker", "text")
    for update in ({"ts": math.nan}, {"deadline": math.inf}, {"ts": -math.inf}):
        envelope = message.model_copy(update=update)
        assert encode(envelope) == pydantic_encode(envelope)
        with pytest.raises(InvalidEnvelope):
            check_finite(envelope, encode(envelope))


def test_fields_of_another_type_are_written_as_pydantic_writes_them() -> None:
    message = Envelope.message("lead", "worker", {"a": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydantic warns about the unexpected types
        for update in ({"ts": 5}, {"deadline": 7}, {"v": True}, {"v": 2**70}):
            assert_encodes_alike(message.model_copy(update=update))


@pytest.mark.parametrize(
    "field", ["id", "type", "sender", "recipient", "trace_id", "traceparent", "in_reply_to"]
)
def test_a_field_its_reader_would_refuse_is_refused_when_written(field: str) -> None:
    """A str field given an int through model_copy (which validates nothing): pydantic would
    write it, and the owner quarantine the line; `encode` refuses it instead."""
    envelope = Envelope.message("lead", "worker", {"a": 1}).model_copy(update={field: 5})
    with pytest.raises(InvalidEnvelope, match="another type than declared"):
        encode(envelope)


def test_a_field_the_models_do_not_know_goes_to_pydantic() -> None:
    message = Envelope.message("lead", "worker", {"a": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_encodes_alike(message.model_copy(update={"stray": 1}))


def test_a_user_subclass_goes_to_pydantic() -> None:
    class Tagged(Message):
        tag: str = "x"

    tagged = Tagged(sender="lead", recipient="worker", body={"a": 1})
    assert encode(tagged) == pydantic_encode(tagged)
    assert b'"tag":"x"' in encode(tagged)


# the flat bodies `encode` checks in its own loop (a dict, list or tuple of scalars, in a short
# line), and the ones its loop hands to the walk: every scalar kind, anywhere in the body
NON_FINITE = st.sampled_from([math.nan, -math.nan, math.inf, -math.inf])
ODD_SCALARS = st.sampled_from(
    [
        Word("w"),
        Level.HIGH,
        Colour.RED,
        Colour.POINT,
        Colour.NAN,
        uuid.UUID(int=7),
        decimal.Decimal("1.5"),
        b"bytes",
        "\ud800",
    ]
)
FLAT_SCALARS = SCALARS | NON_FINITE | ODD_SCALARS | st.text(min_size=400, max_size=600)
FLAT = st.lists(FLAT_SCALARS, max_size=6) | st.lists(FLAT_SCALARS, min_size=15, max_size=20)
FLAT_BODIES = (
    FLAT
    | FLAT.map(tuple)
    | st.dictionaries(TEXT, FLAT_SCALARS, max_size=6)
    # one level deeper: the loop meets a container and the whole body is walked
    | st.lists(FLAT_SCALARS | FLAT | st.dictionaries(TEXT, FLAT_SCALARS, max_size=3), max_size=4)
    | st.dictionaries(TEXT, FLAT_SCALARS | FLAT.map(tuple), max_size=4)
)


def assert_refuses_alike(envelope: Envelope) -> None:
    """`encode(finite=True)` refuses exactly what pydantic's bytes hold NaN or Infinity in, and
    otherwise returns them."""
    try:
        expected = pydantic_encode(envelope)
    except Exception:
        with pytest.raises(InvalidEnvelope):
            encode(envelope, finite=True)
        return
    if codec.too_deep(envelope.body) or codec._holds_bytes(envelope.body):
        with pytest.raises(InvalidEnvelope, match=r"deeper|bytes"):
            encode(envelope, finite=True)
        return
    try:
        check_finite(envelope, expected)
    except InvalidEnvelope:
        with pytest.raises(InvalidEnvelope):
            encode(envelope, finite=True)
        return
    assert encode(envelope, finite=True) == expected


@settings(max_examples=examples(400))
@given(FLAT_BODIES, st.sampled_from(["message", "request", "broadcast"]))
def test_flat_and_nested_bodies_encode_and_refuse_alike(body: Any, kind: str) -> None:
    made: Envelope
    if kind == "message":
        made = Envelope.message("lead", "worker")
    elif kind == "request":
        made = Envelope.request("lead", "worker", timeout=5)
    else:
        made = Envelope.broadcast("lead")
    envelope = made.model_copy(update={"body": body})
    assert_encodes_alike(envelope)
    assert_refuses_alike(envelope)


PADDING = "x" * 600  # makes the line long: its encoding is searched for a null first


@pytest.mark.parametrize("pad", [False, True], ids=["short", "long"])
@pytest.mark.parametrize(
    "body",
    [
        {"a": math.nan, "b": 1},
        {"a": 1, "b": "x", "c": math.inf},
        {"a": None, "b": -math.inf, "c": True},
        [1, "x", None, math.nan],
        (None, -math.inf),
        (1.5, 2.5, math.inf),
        {"a": 1, "b": {"c": math.nan}},
        {"a": 1.5, "b": [None, (2, math.inf)]},
        [1, [2, [3, [math.nan]]]],
        {"a": 1, "b": Colour.NAN},
        [None, Level.HIGH, math.nan],
        [0] * 20 + [math.nan],  # more items than encode's own loop looks at
        {f"k{i}": 1.5 for i in range(16)} | {"last": -math.inf},
    ],
)
def test_nan_and_infinity_anywhere_in_a_body_are_refused(body: Any, pad: bool) -> None:
    if pad:
        body = {"pad": PADDING, "body": body} if type(body) is dict else (PADDING, *body)
    envelope = Envelope.message("lead", "worker", body)
    assert_encodes_alike(envelope)
    assert b"NaN" in pydantic_encode(envelope) or b"Infinity" in pydantic_encode(envelope)
    with pytest.raises(InvalidEnvelope):
        encode(envelope, finite=True)


def _not_pydantic(envelope: Envelope, finite: bool) -> bytes:
    raise AssertionError(f"took the pydantic path: {envelope!r}")


def _not_walked(container: Any) -> bool:
    raise AssertionError(f"walked a flat body: {container!r}")


def _not_searched(body: Any, data: bytes) -> bool:
    raise AssertionError(f"searched a flat body: {body!r}")


@pytest.mark.parametrize(
    "body",
    [
        {"i": 1, "text": "hello world"},
        {"answer": "x" * 2000, "steps": 3, "cost": 0.25, "detail": None},
        ["é" * 1000, 2**63 - 1, 1e-300],
        list(range(16)),
        {"score": 0.5, "ok": True, "none": None, "big": 2**63 - 1, "neg": -(2**63)},
        ["é中😀", "\u2028", 1, -0.0, 1e300, False],
        ("a", 2, 3.5),
        {},
        [],
    ],
)
def test_flat_bodies_are_checked_without_the_walk_the_search_or_pydantic(body: Any) -> None:
    envelope = Envelope.message("lead", "worker", body)
    expected = pydantic_encode(envelope)
    with (
        mock.patch.object(codec, "_by_serializer", _not_pydantic),
        mock.patch.object(codec, "_plain_and_finite", _not_walked),
        mock.patch.object(codec, "_body_finite", _not_searched),
    ):
        assert encode(envelope, finite=True) == expected


def test_the_bench_envelopes_take_the_orjson_path() -> None:
    envelopes = bench_envelopes(100)
    expected = [pydantic_encode(envelope) for envelope in envelopes]
    with mock.patch.object(codec, "_by_serializer", _not_pydantic):
        assert [encode(envelope, finite=True) for envelope in envelopes] == expected


@pytest.mark.parametrize(
    "update",
    [{"seq": 5}, {"team": "t-1"}, {"seq": 0, "team": "t"}, {"seq": 2**70, "team": "t"}],
    ids=str,
)
def test_an_envelope_with_seq_or_team_set_is_written_without_them(update: dict[str, Any]) -> None:
    envelope = Envelope.message("lead", "worker", {"v": 1, '"v":': "x"}).model_copy(update=update)
    assert_encodes_alike(envelope)
    assert encode(envelope).startswith(b'"v":1,')


# --- decoding ---------------------------------------------------------------------------------


def _line(envelope: Envelope, seq: int = 0, team: str = "team") -> bytes:
    return stamp(encode(envelope), seq, team.encode())[:-1]


def assert_decodes_alike(line: bytes) -> EnvelopeFields | str:
    expected = decode_line(line)
    got = decode_fields(line)
    if isinstance(expected, str):
        assert got == expected
        return got
    # an envelope read from any line (fields in any order, NaN in its body) encodes alike too
    assert_encodes_alike(expected)
    assert isinstance(got, EnvelopeFields), got
    assert got.fields_set == expected.model_fields_set
    envelope = got.to_envelope()
    assert type(envelope) is type(expected)
    assert envelope.model_fields_set == expected.model_fields_set
    # a line without `id` or `ts` gets a fresh one from each decode (the models' defaults)
    fresh = {"id", "ts"} - expected.model_fields_set
    for name in FIELD_NAMES:
        if name not in fresh:
            # repr: NaN bodies, -0.0 and int/float all compare as they should
            assert repr(getattr(envelope, name)) == repr(getattr(expected, name)), name
            assert repr(getattr(got, name)) == repr(getattr(expected, name)), name
    if not fresh and "NaN" not in repr(expected.body) and "nan" not in repr(expected.body):
        assert envelope == expected
    assert got.is_error == (isinstance(expected, Response) and expected.is_error)
    return got


@settings(max_examples=examples(300))
@given(envelopes() | built(), INTS, NAMES)
def test_decode_fields_agrees_on_valid_lines(envelope: Envelope, seq: int, team: str) -> None:
    assert_decodes_alike(_line(envelope, seq, team))


PLAIN_INTS = st.integers(min_value=-(2**62), max_value=2**62)
PLAIN_JSON = st.recursive(
    st.none() | st.booleans() | PLAIN_INTS | st.floats(-1e18, 1e18) | TEXT,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5),
    max_leaves=25,
)


def _no_pydantic(line: bytes) -> EnvelopeFields | str:
    raise AssertionError(f"took the pydantic path: {line!r}")


@settings(max_examples=examples(200))
@given(envelopes(), PLAIN_JSON, PLAIN_INTS, NAMES)
def test_lines_teamrt_writes_take_the_fast_path(
    envelope: Envelope, body: Any, seq: int, team: str
) -> None:
    # times past 2**63 s go to pydantic too (orjson reads a 20-digit integer as a float)
    times = {"ts": envelope.ts % 1e18, "deadline": envelope.deadline and envelope.deadline % 1e18}
    line = _line(envelope.model_copy(update={"body": body, **times}), seq, team)
    with mock.patch.object(codec, "_by_pydantic", _no_pydantic):
        got = decode_fields(line)
    assert got == assert_decodes_alike(line)


def test_bench_and_sample_lines_decode_alike_on_the_fast_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = [_line(e, i, "bench") for i, e in enumerate(bench_envelopes(200))]
    lines.append(_line(Envelope.message("lead", "sink", "x" * 2048), 7, "bench"))
    lines += [
        line
        for path in SAMPLES.glob("*/inboxes/*.jsonl")
        for line in path.read_bytes().splitlines()
    ]
    expected = [assert_decodes_alike(line) for line in lines]
    monkeypatch.setattr(codec, "_by_pydantic", None)
    assert [decode_fields(line) for line in lines] == expected


# values that sit on or just past the models' rules, and those the two parsers read differently
WILD: st.SearchStrategy[Any] = (
    SCALARS
    | NAMES
    | st.sampled_from(
        [
            "",
            "*",
            "a" * 64,
            "a" * 65,
            "😀" * 64,
            "😀" * 65,
            "t" * 128,
            "t" * 129,
            "-lead",
            "_lead",
            "le.ad",
            "lead\n",
            "lead ",
            "léad",
            "../etc",
            "message",
            "request",
            "response",
            "broadcast",
            "Message",
            "error",
            "5",
            "1.5",
            "true",
            "null",
            *PAYLOAD_TYPES,
        ]
    )
    | st.sampled_from([True, False, None, 0, 1, -1, 1.0, 1.5, 2**53, 2**53 + 1, 2**63, 2**64, 1e19])
    | st.sampled_from([math.nan, math.inf, -math.inf, 1e400])
    | st.builds(_nested, st.integers(min_value=120, max_value=205))
    | st.builds(dict, st.lists(st.tuples(TEXT, SCALARS), max_size=3))
    | st.fixed_dictionaries({"error": TEXT, "message": TEXT})
    | st.fixed_dictionaries({"x": INTS, "y": st.lists(FLOATS | INTS, max_size=3)})
    | JSON
)
KEYS = st.sampled_from([*FIELD_NAMES, "sig", "extra", "Kind", "bodyy", ""])


def _dumps(obj: Any, ascii_only: bool, spaced: bool) -> bytes:
    separators = (", ", ": ") if spaced else (",", ":")
    return json.dumps(obj, ensure_ascii=ascii_only, separators=separators).encode(
        "utf-8", "surrogatepass"
    )


@st.composite
def mutated_lines(draw: st.DrawFn) -> bytes:
    envelope = draw(envelopes() | built())
    # the clock and the id counter must not change what is drawn next
    fixed = {"id": draw(SHORT), "ts": draw(TIMES), "deadline": draw(st.none() | TIMES)}
    if envelope.kind == "response":
        fixed["in_reply_to"] = draw(SHORT)
    envelope = envelope.model_copy(update=fixed)
    obj: dict[str, Any] = json.loads(_line(envelope, draw(INTS), draw(NAMES)))
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        key = draw(KEYS)
        if draw(st.booleans()):
            obj.pop(key, None)
        else:
            obj[key] = draw(WILD)
    if draw(st.booleans()):  # another field order
        keys = draw(st.permutations(list(obj)))
        obj = {key: obj[key] for key in keys}
    line = _dumps(obj, draw(st.booleans()), draw(st.booleans()))
    operation = draw(st.sampled_from(["none", "none", "truncate", "insert", "replace", "wrap"]))
    if operation == "truncate":
        line = line[: draw(st.integers(min_value=0, max_value=len(line)))]
    elif operation == "insert":
        at = draw(st.integers(min_value=0, max_value=len(line)))
        line = line[:at] + draw(st.binary(min_size=1, max_size=4)) + line[at:]
    elif operation == "replace":
        at = draw(st.integers(min_value=0, max_value=max(0, len(line) - 1)))
        line = line[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\x80", b'"', b"}", b"\\"]))
        line += line[at + 1 :]
    elif operation == "wrap":
        line = draw(st.sampled_from([b" ", b"\t", b"\r", b"\xef\xbb\xbf", b""])) + line
        line += draw(st.sampled_from([b" ", b"\r", b",", b"}", b"x", b""]))
    return line


@settings(max_examples=examples(600))
@given(mutated_lines())
def test_decode_fields_agrees_on_mutated_lines(line: bytes) -> None:
    assert_decodes_alike(line)


_GOOD = _line(Envelope.message("lead", "worker", {"i": 1}), 3)


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"garbage",
        b"{nope",
        b"[]",
        b"1",
        b'"text"',
        b"null",
        b"{}",
        b'{"seq":1,"kind":"telegram"}',
        b'{"kind":"request","seq":1,"sender":"a","recipient":"b","id":"x"}',
        b'{"kind":"broadcast","seq":1,"sender":"a","id":"x","ts":1}',
        b'{"kind":"response","seq":1,"sender":"a","recipient":"b","id":"x","ts":1}',
        b'{"kind":"broadcast","seq":1,"sender":"a","recipient":"b","id":"x","ts":1}',
        b'{"kind":"broadcast","seq":1,"sender":"a","id":"x","ts":1,"deadline":5}',
        b'{"kind":"message","seq":1,"sender":"a","recipient":"b","id":"x","ts":1,"in_reply_to":5}',
        b'{"kind":"broadcast","seq":1,"sender":"a","id":"x","ts":1,"deadline":"5"}',
        b'{"kind":"broadcast","seq":1,"sender":"a","id":"x","ts":1,"deadline":9007199254740993}',
        b'{"kind":"broadcast","seq":1,"sender":"a","id":"x","ts":1,"deadline":1e19}',
        b'{"kind":"broadcast","seq":1,"sender":"a","recipient":"*","id":"x","ts":1,"x":1e19}',
        b'{"kind":"broadcast","seq":1,"sender":"a","id":"x","ts":1,"x":18446744073709551616}',
        b'{"kind":"broadcast","seq":1,"sender":"a","id":"x","ts":1,"x":{"y":[2e19]}}',
        b'{"kind":"response","seq":1,"sender":"a","recipient":"b","id":"x","ts":1,'
        b'"in_reply_to":"r","type":"error","body":{"error":"E"}}',
        b'{"kind":"message","seq":1,"sender":"a","recipient":"b","id":"x","ts":"5"}',
        b'{"kind":"message","seq":"1","sender":"a","recipient":"b","id":"x","ts":1.0}',
        b'{"kind":"message","seq":1.0,"sender":"a","recipient":"b","id":"x","ts":1,"v":2.0}',
        b'{"kind":"message","seq":true,"sender":"a","recipient":"b","id":"x","ts":1}',
        b'{"kind":"message","seq":1,"sender":"a","recipient":"b","id":"x","ts":1e400}',
        b'{"kind":"message","seq":1,"sender":"a","recipient":"b","id":"x","ts":1,"body":NaN}',
        b'{"kind":"message","seq":1,"sender":"a","recipient":"b","id":"x","ts":1,"x":[1e400]}',
        b'{"kind":"message","seq":18446744073709551616,"sender":"a","recipient":"b","id":"x",'
        b'"ts":1}',
        b'{"kind":"message","seq":1,"sender":"a","recipient":"b","id":"x","ts":9007199254740993}',
        b'{"kind":"message","seq":1,"sender":"a","sender":"b/c","recipient":"b","id":"x","ts":1}',
        b'{"kind":"message","kind":"request","seq":1,"sender":"a","recipient":"b","id":"x","ts":1}',
        b'{"kind":"message","seq":1,"sender":"a","recipient":"b","id":"x","ts":1,"seq":null}',
        b'{"seq":1,"team":null,"v":1,"id":"x","kind":"message","type":"text","sender":"a",'
        b'"recipient":"b","in_reply_to":null,"trace_id":null,"ts":1,"deadline":null,'
        b'"body":{"n":18446744073709551616}}',
        b'{"seq":1,"id":"x","kind":"message","sender":"a","recipient":"b","ts":1,'
        b'"body":"\\ud83d\\ude00"}',
        b'{"seq":1,"id":"x","kind":"message","sender":"a","recipient":"b","ts":1,"body":"\\ud800"}',
        b'{"seq":1,"id":"x","kind":"message","sender":"a","recipient":"b","ts":1,'
        b'"extra":' + b"[" * 210 + b"]" * 210 + b"}",
        _GOOD,
        _GOOD + b" ",
        _GOOD[:-1] + b',"fields_set":["x"]}',
        _GOOD[:-1] + b',"fields_set":null}',
        _GOOD.replace(b'{"i":1}', b"[" * 60 + b"1" + b"]" * 60),  # short: no bracket count
        _GOOD.replace(b'{"i":1}', b"[" * 129 + b"]" * 129),
        _GOOD.replace(b'{"i":1}', b"[" * 201 + b"]" * 201),
        _GOOD.replace(b'{"i":1}', b"[" * 202 + b"]" * 202),
        _GOOD.replace(b'"ts":', b'"ts":9007199254740993,"x":'),
        _GOOD[:-1] + b',"sig":"00"}',
        _GOOD[:-1],
        _GOOD.replace(b'"worker"', b'"../etc"'),
        _GOOD.replace(b'"lead"', b'"lead\\n"'),
        _GOOD.replace(b'"seq":3,', b""),
        _GOOD.replace(b'"seq":3,', b'"seq":null,'),
        _GOOD.replace(b'"i":1', b'"i":"\xff"'),
    ],
)
def test_decode_fields_agrees_on_hand_written_lines(line: bytes) -> None:
    assert_decodes_alike(line)


@given(
    st.sampled_from(PAYLOAD_TYPES),
    st.sampled_from(["message", "request", "response"]),
    WILD,
)
@example("error", "response", {"error": "E", "message": 1})
@example("test_codec_point", "message", {"x": 1, "y": [1, "a"]})
def test_payload_reasons_agree(type_name: str, kind: str, body: Any) -> None:
    fields: dict[str, Any] = {"seq": 1, "kind": kind, "type": type_name, "sender": "a"}
    fields |= {"recipient": "b", "id": "x", "ts": 1.5, "body": body}
    if kind == "response":
        fields["in_reply_to"] = "r"
    assert_decodes_alike(json.dumps(fields).encode())


def test_to_envelope_builds_the_same_model_as_model_construct() -> None:
    line = _line(Envelope.request("lead", "worker", {"a": [1, 2]}, timeout=3), 9)
    fields = decode_fields(line)
    assert isinstance(fields, EnvelopeFields)
    values = {name: getattr(fields, name) for name in FIELD_NAMES}
    public = _construct_public(type(fields.to_envelope()), values, fields.fields_set)
    assert public == fields.to_envelope() == decode_line(line)
    assert public.model_fields_set == fields.to_envelope().model_fields_set
    with pytest.raises(AttributeError):
        fields.seq = 4  # type: ignore[misc]


def test_the_remembered_names_stay_bounded() -> None:
    for i in range(names._VALID_NAMES_KEPT + 10):
        line = _line(Envelope.message(f"sender-{i}", "worker", i), i)
        fields = decode_fields(line)
        assert isinstance(fields, EnvelopeFields) and fields.sender == f"sender-{i}"
    assert 0 < len(names.valid_names) <= names._VALID_NAMES_KEPT


def test_the_lines_teamrt_writes_are_decoded_in_one_typed_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = [_line(e, i, "bench") for i, e in enumerate(bench_envelopes(200))]
    lines.append(_line(Envelope.error(Envelope.request("a", "b", 1), "E", "m"), 3))
    lines.append(_line(Envelope.broadcast("lead", {"x": [1, 2.5, None]}), 4))
    expected = [assert_decodes_alike(line) for line in lines]
    monkeypatch.setattr(codec, "_fields", None)  # neither the checked path
    monkeypatch.setattr(codec, "_by_pydantic", None)  # nor pydantic
    got = [decode_fields(line) for line in lines]
    assert got == expected
    # records are immutable and not tracked by the garbage collector
    import gc

    assert all(isinstance(f, EnvelopeFields) and not gc.is_tracked(f) for f in got)
