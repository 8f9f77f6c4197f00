"""`send()` and the reader apply one set of rules: every envelope is refused by `send()`
(`InvalidEnvelope`, nothing written) or delivered to its owner unchanged, never accepted and
lost."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from teamrt.codec import MAX_BODY_DEPTH, decode_fields, encode
from teamrt.envelopes import Envelope
from teamrt.errors import InvalidEnvelope
from teamrt.mail.filestore.store import FileStore
from teamrt.mail.log import decode_line, stamp
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.memory import MemoryStore
from tests.support.hypothesis_profiles import examples
from tests.support.redis_server import RedisServer, shared_redis

__all__ = ["shared_redis"]  # the fixture

MEMBERS = ["lead", "worker"]


@pytest.fixture(params=["file", "memory", "redis"])
def make_mail(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Mailboxes]:
    """A maker of `Mailboxes` on each store."""
    if request.param == "file":
        return lambda: Mailboxes(FileStore(tmp_path / "team"), members=MEMBERS)
    if request.param == "memory":
        store = MemoryStore()
        return lambda: Mailboxes(store, members=MEMBERS)
    from teamrt.mail.redisstore import RedisStore

    server: RedisServer = request.getfixturevalue("shared_redis")
    url = server.url()
    return lambda: Mailboxes(RedisStore(url), members=MEMBERS)


def _nested(depth: int) -> Any:
    """A body nested `depth` levels deep, lists and dicts in turn."""
    body: Any = []
    for level in range(depth - 1):
        body = [body] if level % 2 else {"k": body}
    return body


async def _send_all(mail: Mailboxes, bodies: list[Any]) -> tuple[list[Any], int]:
    """Send each body to the worker; the bodies accepted, and the worker's quarantine count."""
    accepted: list[Any] = []
    async with mail:
        worker = await mail.open_inbox("worker")
        for body in bodies:
            try:
                await mail.send(Envelope.message("lead", "worker", body))
            except InvalidEnvelope:
                continue
            accepted.append(body)
        # a last message behind them all: once it is in, every earlier one is in or lost
        await mail.send(Envelope.message("lead", "worker", "end", type="end"))
        got: list[Any] = []
        while (envelope := await worker.receive()).type != "end":
            got.append(envelope.body)
        assert got == accepted
        return accepted, worker.statistics().quarantined


async def test_every_nesting_depth_is_refused_or_delivered(
    make_mail: Callable[[], Mailboxes],
) -> None:
    bodies = [_nested(depth) for depth in range(1, 301)]
    accepted, quarantined = await _send_all(make_mail(), bodies)
    assert quarantined == 0
    assert len(accepted) == MAX_BODY_DEPTH  # depths 1..MAX_BODY_DEPTH, refused beyond


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
_bodies = (
    _json
    | st.binary(max_size=4)
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.text(alphabet=st.characters(categories=["Cs"]), min_size=1, max_size=2)
    | st.builds(object)
    | st.builds(_nested, st.integers(min_value=1, max_value=260))
)


@settings(
    max_examples=examples(200),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(_bodies, min_size=1, max_size=5))
def test_any_body_is_refused_or_received_unchanged(
    tmp_path_factory: pytest.TempPathFactory, bodies: list[Any]
) -> None:
    root = tmp_path_factory.mktemp("team")
    _, quarantined = anyio.run(_send_all, Mailboxes(FileStore(root), members=MEMBERS), bodies)
    assert quarantined == 0


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity", b"[1,NaN]"])
def test_a_raw_line_with_nan_or_infinity_is_quarantined_by_both_decoders(constant: bytes) -> None:
    line = stamp(encode(Envelope.message("lead", "worker", None)), 3, b"t")[:-1]
    line = line.replace(b'"body":null', b'"body":' + constant)
    reason = "schema: body: NaN or Infinity, which JSON does not allow"
    assert decode_line(line) == reason
    assert decode_fields(line) == reason


@pytest.mark.parametrize("depth", [MAX_BODY_DEPTH, MAX_BODY_DEPTH + 1, 210])
def test_a_raw_line_too_deep_is_quarantined_by_both_decoders(depth: int) -> None:
    line = stamp(encode(Envelope.message("lead", "worker", None)), 3, b"t")[:-1]
    line = line.replace(b'"body":null', b'"body":' + b"[" * depth + b"]" * depth)
    if depth <= MAX_BODY_DEPTH:
        assert not isinstance(decode_fields(line), str)
        assert not isinstance(decode_line(line), str)
    else:
        assert decode_line(line) == decode_fields(line)
        assert isinstance(decode_line(line), str)
