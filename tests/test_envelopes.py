"""Envelope models, constructors, the payload registry, names, and the public surface."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import teamrt
from teamrt import (
    Broadcast,
    Envelope,
    InvalidName,
    Message,
    Request,
    Response,
    UsageError,
    new_id,
    payload,
    register_payload,
)
from teamrt.envelopes import ENVELOPE_ADAPTER, _build
from teamrt.errors import InvalidEnvelope
from teamrt.names import validate_name
from tests.support.hypothesis_profiles import examples


@payload("test_task")
class Task(BaseModel):
    title: str
    pages: int = 1


def test_constructors_fill_the_kind_specific_fields() -> None:
    message = Envelope.message("lead", "writer", "hi", trace_id="run-1")
    assert isinstance(message, Message)
    assert (message.kind, message.type, message.seq, message.team) == (
        "message",
        "text",
        None,
        None,
    )

    request = Envelope.request("lead", "writer", Task(title="notes"), timeout=30)
    assert isinstance(request, Request)
    assert request.type == "test_task" and request.body == {"title": "notes", "pages": 1}
    assert request.deadline == pytest.approx(request.ts + 30)

    response = Envelope.response(request, {"ok": True})
    assert isinstance(response, Response)
    assert (response.sender, response.recipient, response.in_reply_to) == (
        "writer",
        "lead",
        request.id,
    )
    assert not response.is_error

    error = Envelope.error(request, ValueError("bad page"))
    assert error.is_error and error.body == {"error": "ValueError", "message": "bad page"}

    broadcast = Envelope.broadcast("lead", "stop", type="shutdown_request")
    assert isinstance(broadcast, Broadcast) and broadcast.recipient == "*"


def test_envelopes_are_frozen_and_round_trip() -> None:
    request = Envelope.request("lead", "writer", {"x": [1, 2]})
    with pytest.raises(ValueError, match="frozen"):
        request.body = None  # type: ignore[misc]
    assert ENVELOPE_ADAPTER.validate_json(request.model_dump_json()) == request


def test_response_only_to_a_request() -> None:
    with pytest.raises(UsageError, match="only respond to a request"):
        Envelope.response(Envelope.message("a", "b"))


def test_bad_fields_name_the_field() -> None:
    with pytest.raises(InvalidName, match=r"invalid sender '\.\./etc'"):
        Envelope.message("../etc", "writer")
    with pytest.raises(InvalidEnvelope, match="type"):
        Envelope.message("lead", "writer", type="")


def test_payload_registry() -> None:
    assert Envelope.message("a", "b", {"title": "t"}, type="test_task").payload() == Task(title="t")
    with pytest.raises(UsageError, match="already registered"):
        register_payload("test_task", BaseModel)
    register_payload("test_task", Task)  # the same model again is fine
    with pytest.raises(UsageError, match="no payload model"):
        Envelope.message("a", "b", type="unregistered").payload()


def test_ids_are_unique_and_time_sorted() -> None:
    ids = [new_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    assert all(len(i) == 30 for i in ids)


@pytest.mark.parametrize("name", ["lead", "writer-2", "A_b", "x" * 64, "7"])
def test_good_names(name: str) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", ".", "..", "../x", "a/b", ".hidden", "a b", "x" * 65, "a\x00b", "caf\u00e9", "-lead", 3],
)
def test_bad_names(name: object) -> None:
    with pytest.raises(InvalidName):
        validate_name(name)


def test_public_surface_is_pinned() -> None:
    assert teamrt.__all__ == sorted(teamrt.__all__)
    assert set(teamrt.__all__) == {
        "AgentStop",
        "BlobTooLarge",
        "DeliveryError",
        "Broadcast",
        "DiskFull",
        "DurabilityError",
        "Envelope",
        "EnvelopeTooLarge",
        "ErrorBody",
        "FileMailboxes",
        "FileStore",
        "Inbox",
        "InboxStatistics",
        "InvalidName",
        "LeaseLost",
        "MailboxClosed",
        "Mailboxes",
        "ModelError",
        "MemoryMailboxes",
        "MemoryStore",
        "Message",
        "OutcomeUnknown",
        "PayloadError",
        "ReceiveTimeout",
        "RemoteError",
        "Request",
        "RequestTimeout",
        "Response",
        "StateError",
        "Store",
        "StoreAuthFailed",
        "StoreError",
        "StoreOutage",
        "StoreUnavailable",
        "TeamKeyMismatch",
        "TeamView",
        "TeamrtError",
        "ToolFailure",
        "UnknownRecipient",
        "UsageError",
        "__version__",
        "new_id",
        "open_mailboxes",
        "open_store",
        "open_view",
        "payload",
        "register_payload",
        # the common path, loaded on first use
        "Agent",
        "ChatMessage",
        "FunctionModel",
        "Limits",
        "MCPTools",
        "Memory",
        "ModelReply",
        "OpenAIModel",
        "ProgressBody",
        "RestartPolicy",
        "RunReport",
        "ScriptedModel",
        "TaskResult",
        "Team",
        "TeamBudget",
        "Teammate",
        "ToolSpec",
        "call",
        "current_call_id",
        "tool",
    }
    assert (Path(teamrt.__file__).parent / "py.typed").exists()
    assert all(getattr(teamrt, name) is not None for name in teamrt.__all__)


def test_import_teamrt_leaves_agents_models_and_teams_until_they_are_used() -> None:
    """`import teamrt` loads the mailbox layer only; `from teamrt import Team` loads the team
    (and is the same object as `teamrt.team.Team`); an unknown name is an AttributeError."""
    code = (
        "import sys, teamrt\n"
        "late = ('teamrt.team', 'teamrt.agents', 'teamrt.models', 'openai')\n"
        "print(sorted(m for m in late if m in sys.modules))\n"
        "from teamrt import Team, Agent, ScriptedModel\n"
        "import teamrt.team, teamrt.agents, teamrt.models\n"
        "print(Team is teamrt.team.Team and Agent is teamrt.agents.Agent)\n"
        "print(ScriptedModel is teamrt.models.ScriptedModel, 'openai' in sys.modules)\n"
        "print(hasattr(teamrt, 'Nothing'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.splitlines() == ["[]", "True", "True False", "False"]


# --- the constructors' direct path builds what validation builds ---------------------------------


class ErrorBodyLike(BaseModel):
    x: int


_names = st.one_of(
    st.sampled_from(["lead", "w-1", "A_b", "x" * 64, "x" * 65, "", "../x", "a b", "é", "-a"]),
    st.text(max_size=70),
    st.sampled_from([None, 3, b"lead"]),
)
_types = st.one_of(st.sampled_from(["t", "x" * 64, "x" * 65, ""]), st.text(max_size=3), st.none())
_traces = st.one_of(st.none(), st.text(max_size=5), st.just(7))
_bodies = st.one_of(
    st.none(),
    st.integers(),
    st.floats(),
    st.text(max_size=5),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
    st.builds(ErrorBodyLike, x=st.integers()),
)
_timeouts = st.one_of(st.none(), st.floats(), st.integers(-5, 5), st.just(10**400 // 10**399))


def _outcome(make: Any) -> Any:
    try:
        envelope = make()
    except Exception as exc:  # the error must be the same on both paths
        return ("raised", type(exc), str(exc))
    values = {k: v for k, v in envelope.__dict__.items() if k not in ("id", "ts", "deadline")}
    return (
        type(envelope),
        list(envelope.__dict__),  # the declared order: the encoder writes it
        repr(values),  # NaN in a body: compared by how it reads
        envelope.model_fields_set,
        envelope.deadline is None,
        envelope.__pydantic_extra__,
        envelope.__pydantic_private__,
    )


@settings(max_examples=examples(300))
@given(_names, _names, _bodies, _types, _traces, _timeouts)
def test_constructors_build_what_validation_builds(
    sender: Any, recipient: Any, body: Any, type_: Any, trace: Any, timeout: Any
) -> None:
    kw = {"type": type_} if type_ is not None else {}
    data = body.model_dump(mode="json") if isinstance(body, BaseModel) else body
    assert _outcome(lambda: Envelope.message(sender, recipient, body, trace_id=trace, **kw)) == (
        _outcome(
            lambda: _build(
                Message,
                sender=sender,
                recipient=recipient,
                body=data,
                type=type_ if type_ is not None else "text",
                trace_id=trace,
            )
        )
    )
    try:
        now_deadline = None if timeout is None else 1.0 + timeout
    except TypeError:
        return
    asked = _outcome(
        lambda: Envelope.request(sender, recipient, body, trace_id=trace, timeout=timeout, **kw)
    )
    slow = _outcome(
        lambda: _build(
            Request,
            sender=sender,
            recipient=recipient,
            body=data,
            type=type_ if type_ is not None else "request",
            ts=1.0,
            trace_id=trace,
            deadline=now_deadline,
        )
    )
    assert asked == slow
    if asked[0] is not Request:
        return
    request = Envelope.request(sender, recipient, body, trace_id=trace, **kw)
    assert _outcome(lambda: Envelope.response(request, body, **kw)) == _outcome(
        lambda: _build(
            Response,
            sender=request.recipient,
            recipient=request.sender,
            body=data,
            type=type_ if type_ is not None else "result",
            in_reply_to=request.id,
            trace_id=request.trace_id,
        )
    )


def test_with_deadline_is_model_copy() -> None:
    request = Envelope.request("lead", "w", {"a": 1}, type="task")
    fast, slow = request.with_deadline(5.0), request.model_copy(update={"deadline": 5.0})
    assert fast == slow and type(fast) is Request
    assert fast.model_fields_set == slow.model_fields_set
    assert list(fast.__dict__) == list(slow.__dict__)
    assert request.deadline is None  # the original is unchanged
    # the copy has fields and a fields set of its own, as model_copy's does
    assert type(fast.model_fields_set) is set
    assert fast.model_fields_set is not request.model_fields_set
    assert fast.__dict__ is not request.__dict__
    again = fast.with_deadline(6.0)
    assert again.model_fields_set is not fast.model_fields_set and fast.deadline == 5.0


def test_an_id_is_its_time_tag_and_counter_in_hex() -> None:
    """An id is 14 hex digits of microseconds, the process's 10-digit tag and a 6-digit
    counter (wrapping at 2**24), as it was written with string formatting."""
    from teamrt import envelopes

    now = 1_764_560_000.123456
    first = envelopes._id_at(now)
    second = envelopes._id_at(now)
    tag = f"{envelopes._id_tag >> 24:010x}"
    assert first[:14] == f"{int(now * 1_000_000):014x}" and first[14:24] == tag
    assert int(second[24:], 16) == (int(first[24:], 16) + 1) % (1 << 24)
    assert second[:24] == first[:24] and len(first) == len(second) == 30
    assert envelopes._id_of(0).startswith("0" * 14)
    assert envelopes._id_of((1 << 56) - 1).startswith("f" * 14)
    assert all(c in "0123456789abcdef" for c in first)


def test_constructors_leave_their_default_values_alone() -> None:
    """The constructors copy their kind's default values: an envelope's fields are its own,
    and the defaults are what they were after any number of envelopes."""
    from teamrt import envelopes

    before = [
        dict(d)
        for d in (envelopes._MESSAGE_VALUES, envelopes._REQUEST_VALUES, envelopes._RESPONSE_VALUES)
    ]
    request = Envelope.request("lead", "w", {"a": 1}, timeout=5)
    other = Envelope.request("lead", "x", 2)
    response = Envelope.response(request, 3)
    message = Envelope.message("lead", "w", 4)
    assert request.__dict__ is not other.__dict__ and request.recipient == "w"
    assert (response.in_reply_to, response.recipient, message.kind) == (
        request.id,
        "lead",
        "message",
    )
    after = [envelopes._MESSAGE_VALUES, envelopes._REQUEST_VALUES, envelopes._RESPONSE_VALUES]
    assert before == after and all(v["id"] is None and v["body"] is None for v in after)


def test_response_to_a_request_missing_fields_raises_as_an_attribute_read_does() -> None:
    """`response` reads the request's fields from its dict; a request `model_construct` left
    without a recipient fails as reading the attribute fails."""
    request = Request.model_construct(sender="lead")  # type: ignore[call-arg]
    with pytest.raises(AttributeError):
        request.recipient  # noqa: B018
    with pytest.raises(AttributeError):
        Envelope.response(request, 1)
    with pytest.raises(UsageError):
        Envelope.response(Envelope.message("lead", "w", 1), 1)


def test_with_deadline_keeps_a_subclass_private_attributes() -> None:
    """teamrt's own classes are copied without looking for extras or private attributes; a
    user's subclass that has them keeps them, as model_copy keeps them."""
    from pydantic import PrivateAttr

    class Tagged(Request):
        _tag: str = PrivateAttr(default="x")

    tagged = Tagged(sender="lead", recipient="w", body=1)
    copy = tagged.with_deadline(5.0)
    assert type(copy) is Tagged and copy.deadline == 5.0 and copy._tag == "x"
