"""Envelope models, constructors, the payload registry, names, and the public surface."""

from __future__ import annotations

from pathlib import Path

import pytest
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
from teamrt.envelopes import ENVELOPE_ADAPTER
from teamrt.errors import InvalidEnvelope
from teamrt.names import validate_name


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
        "Store",
        "StoreError",
        "StoreUnavailable",
        "TeamView",
        "TeamrtError",
        "UnknownRecipient",
        "UsageError",
        "__version__",
        "new_id",
        "open_mailboxes",
        "open_store",
        "open_view",
        "payload",
        "register_payload",
    }
    assert (Path(teamrt.__file__).parent / "py.typed").exists()
    assert all(getattr(teamrt, name) is not None for name in teamrt.__all__)
