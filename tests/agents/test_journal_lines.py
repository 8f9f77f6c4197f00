"""A journal line is written by orjson, and by the stdlib encoder for what orjson does not take:
both say the same thing (a differential test), and what neither can write is an error."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from teamrt.agents.journal import _encode, _encode_plainly
from tests.support.hypothesis_profiles import examples

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=examples(200))
@given(st.dictionaries(st.text(), _values, max_size=6))
def test_a_line_says_what_the_plain_encoder_says(record: dict[str, Any]) -> None:
    fast, plain = _encode(record), _encode_plainly(record)
    assert fast.endswith(b"\n") and fast.count(b"\n") == 1
    assert json.loads(fast) == json.loads(plain) == json.loads(json.dumps(record))


def test_what_orjson_does_not_take_is_written_plainly() -> None:
    record = {"answer": 2**70, "n": {1: "int key"}}
    assert json.loads(_encode(record)) == {"answer": 2**70, "n": {"1": "int key"}}


def test_a_lone_surrogate_cannot_be_written() -> None:
    with pytest.raises(UnicodeEncodeError):
        _encode({"text": "\ud800"})
