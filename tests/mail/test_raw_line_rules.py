"""A raw line that two JSON readers could read two ways is quarantined, never delivered: NaN and
Infinity (which JSON does not allow) anywhere in it, and a key given twice in one object (one
reader keeps the first value, another the last). Both decoders decide alike, with one reason."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from teamrt.codec import decode_fields
from teamrt.envelopes import Envelope
from teamrt.mail.log import decode_line, encode, stamp

DUPLICATE = "json: a key appears twice in one object"


def _line(body: object = None) -> bytes:
    return stamp(encode(Envelope.message("lead", "worker", body)), 3, b"t")[:-1]


def _refused(line: bytes) -> str:
    """The reason both decoders give (they must agree)."""
    by_fields, by_line = decode_fields(line), decode_line(line)
    assert isinstance(by_fields, str), by_fields
    assert by_fields == by_line
    return by_fields


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (b'"sender":"lead"', b'"sender":"lead","sender":"lead"'),  # the same value twice
        (b'"sender":"lead"', b'"sender":"lead","sender":"worker"'),
        (b'"recipient":"worker"', b'"recipient":"lead","recipient":"worker"'),
        (b'"body":null', b'"body":{"a":1,"a":2}'),  # nested, in the body
        (b'"body":null', b'"body":[{"x":{"b":"c:d","b":"c:d"}}]'),  # deeper, colons in values
        (b'"body":null', b'"body":{"\\u0061":1,"a":2}'),  # the same key, one spelt escaped
        (b'"body":null', b'"body":{"k\\u003a":1,"k:":2}'),  # an escaped colon in the key
        (b'"body":null', b'"body":null,"body":"twice"'),  # a field twice at the top
        (b'"seq":3', b'"seq":3,"extra":1,"extra":2'),  # among fields the models ignore
    ],
)
def test_a_key_given_twice_is_refused_by_both_decoders(old: bytes, new: bytes) -> None:
    line = _line().replace(old, new, 1)
    assert line != _line()
    assert _refused(line) == DUPLICATE


@pytest.mark.parametrize(
    "body",
    [
        {"url": "http://x:80/a:b", "time": "12:30:00", "nested": [{"k:": "v:"}]},
        "a: b: c",
        ["::", {"a": ":", "b": {"c": "d:e"}}],
        {"é": "ü:ß", "emoji": "🙂:"},
    ],
)
def test_colons_and_unicode_in_a_body_are_not_mistaken_for_keys(body: object) -> None:
    line = _line(body)
    for decoded in (decode_fields(line), decode_line(line)):
        assert not isinstance(decoded, str), decoded
        assert decoded.body == body


def test_colons_in_ids_and_escaped_text_are_not_mistaken_for_keys() -> None:
    line = _line({"a": "x:y"}).replace(b'"trace_id":null', b'"trace_id":"t:1:2"')
    line = line.replace(b'"x:y"', b'"x\\u003ay\\n"')
    for decoded in (decode_fields(line), decode_line(line)):
        assert not isinstance(decoded, str), decoded
        assert decoded.body == {"a": "x:y\n"} and decoded.trace_id == "t:1:2"


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet=':ab\\"é\n', max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet=':ab"', max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)


@given(_json)
def test_any_body_without_repeated_keys_is_delivered(body: object) -> None:
    line = _line(body)
    decoded = decode_fields(line)
    assert not isinstance(decoded, str), decoded
    assert decoded.body == body


@given(st.dictionaries(st.text(alphabet=":ab", max_size=3), _json, min_size=1, max_size=3))
def test_any_body_with_a_repeated_key_is_refused(body: dict[str, object]) -> None:
    key = next(iter(body))
    member = json.dumps(key).encode() + b":" + json.dumps(body[key]).encode()
    encoded = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    twice = b"{" + member + b"," + encoded[1:]
    assert _refused(_line().replace(b'"body":null', b'"body":' + twice)) == DUPLICATE


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (b'"body":null', b'"body":{"a":[1,NaN]}'),
        (b'"body":null', b'"body":{"a":-Infinity}'),
        (b'"deadline":null', b'"deadline":NaN'),
    ],
)
def test_nan_anywhere_is_refused_by_both_decoders(old: bytes, new: bytes) -> None:
    _refused(_line().replace(old, new))
