"""Only teamrt's own errors leave the public API: whatever is passed in, or whatever a peer
answers, a caller catches `teamrt.errors.TeamrtError` (or gets a result), never pydantic's,
orjson's or the operating system's exception."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from teamrt import MemoryMailboxes
from teamrt.conductor.plan import Plan, PlanError
from teamrt.envelopes import Envelope, Message
from teamrt.errors import PartialBroadcast, PeerError, TeamrtError
from teamrt.team.team import Team
from tests.support.hypothesis_profiles import examples

_garbage = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=80),
    st.text(alphabet=st.characters(categories=["Cs"]), min_size=1, max_size=2),
    st.binary(max_size=4),
    st.builds(object),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.integers(), st.none(), max_size=2),
)


def _only_ours(call: Any) -> None:
    with contextlib.suppress(TeamrtError):  # ours: any other exception fails the test
        call()


@settings(max_examples=examples(300), suppress_health_check=list(HealthCheck))
@given(
    sender=_garbage | st.just("lead"),
    recipient=_garbage | st.just("worker"),
    body=_garbage,
    type_=_garbage | st.just("text"),
    field=st.sampled_from(["id", "ts", "deadline", "trace_id", "traceparent", "type", "v"]),
    value=_garbage | st.just("a" * 65) | st.just(math.nan),
)
def test_public_constructors_raise_only_teamrt_errors(
    sender: Any, recipient: Any, body: Any, type_: Any, field: str, value: Any
) -> None:
    _only_ours(lambda: Envelope.message(sender, recipient, body, type=type_))
    _only_ours(lambda: Envelope.broadcast(sender, body, type=type_))
    _only_ours(lambda: Envelope.request(sender, recipient, body, type=type_, timeout=5))
    request = Envelope.request("lead", "worker", "q", timeout=5)
    _only_ours(lambda: Envelope.response(request, body, type=type_))
    _only_ours(lambda: Envelope.error(request, body, type_))
    _only_ours(lambda: Message(kind="message", sender="lead", recipient="worker", **{field: value}))

    async def send() -> None:
        async with MemoryMailboxes(members=["lead", "worker"]) as mail:
            made = Envelope.message("lead", "worker")
            try:
                envelope = made.model_copy(update={"body": body})
            except TeamrtError:
                return
            with contextlib.suppress(TeamrtError):
                await mail.send(envelope)

    anyio.run(send)


@pytest.mark.parametrize(
    "answer",
    [None, "text", 7, [1, 2], {"status": 12}, {"unexpected": "fields", "status": "nonsense"}],
)
async def test_a_peers_malformed_answer_is_a_peer_error(answer: Any) -> None:
    mail = MemoryMailboxes(members=["lead", "w"])
    async with mail, Team(mail, [], remote=["w"]) as team:
        inbox = await mail.open_inbox("w")
        result: list[BaseException] = []

        async def ask() -> None:
            try:
                await team.ask("w", "answer me", timeout=30)
            except Exception as exc:
                result.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            request = await inbox.receive()
            await mail.send(Envelope.response(request, answer))
            await inbox.ack(request)
        (error,) = result
        assert type(error) is PeerError, repr(error)
        assert "w answered with a malformed TaskResult" in str(error)
        assert error.response.body == answer


@pytest.mark.parametrize("make", ["missing", "directory", "binary"])
def test_plan_load_raises_plan_errors(tmp_path: Path, make: str) -> None:
    path = tmp_path / "plan.json"
    if make == "directory":
        path.mkdir()
    elif make == "binary":
        path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(PlanError, match=str(path)):
        Plan.load(path)


def test_partial_broadcast_reads_as_its_message() -> None:
    error = PartialBroadcast("broadcast reached a, not b", ("a",), ("b",))
    assert str(error) == "broadcast reached a, not b"
