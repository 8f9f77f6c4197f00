"""Claim checks: a payload over the envelope limit travels as a blob beside the inbox.

Theory of operation. `Mailboxes.send` encodes an envelope as always; only one that comes out over
the store's `max_envelope` (a comparison every send makes anyway) comes here. `check_in` keeps
its body on its own (the UTF-8 of a text body, the JSON of any other) with `Store.blob_put`,
under its SHA-256, and the envelope goes out with a small reference body instead:

    {"$claim": {"sha256": "<64 hex digits>", "size": <bytes>, "kind": "text" | "json"}}

The receiving inbox calls `redeem` on a record whose body is a dict with a `$claim` key, before
the record is deduplicated, routed or received: the blob is fetched, its size and digest checked
and the original body put back, so nothing above the inbox sees a claim check. A blob that is
missing or whose bytes do not match gives a reason instead, and the inbox quarantines the record:
a wrong body is never delivered. In a signed team the signature covers the reference, so the
digest vouches for the blob. Over `max_blob`, `BlobTooLarge`: nothing is stored or sent.

This module must never cost an ordinary envelope anything beyond that size comparison on the
send side and one dict lookup on the receive side.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import msgspec
import pydantic_core

from teamrt.codec import CLAIM, EnvelopeFields
from teamrt.envelopes import payload_model, validate_body
from teamrt.errors import BlobTooLarge, EnvelopeTooLarge, PayloadError, StoreCorrupt

if TYPE_CHECKING:
    from teamrt.envelopes import Envelope
    from teamrt.mail.store import Store

__all__ = ["CLAIM", "Claim", "check_in", "claim_of", "mib", "redeem", "redeemed", "valid_digest"]

R = TypeVar("R", bound="Envelope")

_DIGEST = re.compile(r"[0-9a-f]{64}")


def valid_digest(digest: str) -> bool:
    """True if `digest` is a SHA-256 in lowercase hex (the only names blobs have)."""
    return _DIGEST.fullmatch(digest) is not None


def mib(size: int) -> str:
    """A size for messages: "5.0 MiB" (or bytes, below one KiB)."""
    return f"{size / (1 << 20):.1f} MiB" if size >= 1024 else f"{size} bytes"


@dataclass(frozen=True, slots=True)
class Claim:
    """A reference to a blob: its SHA-256 (hex), its size in bytes and what the bytes are
    (`text`: the body was a string, kept as UTF-8; `json`: any other body, as JSON)."""

    sha256: str
    size: int
    kind: Literal["text", "json"]

    @classmethod
    def of(cls, body: Any) -> tuple[Claim, bytes]:
        """The claim for `body`, and the bytes to keep."""
        if isinstance(body, str):
            data, kind = body.encode(), "text"
        else:
            data, kind = pydantic_core.to_json(body), "json"
        return cls(hashlib.sha256(data).hexdigest(), len(data), kind), data  # type: ignore[arg-type]

    def body(self) -> dict[str, Any]:
        """The reference body an envelope carries instead of the payload."""
        return {CLAIM: {"sha256": self.sha256, "size": self.size, "kind": self.kind}}

    def describe(self) -> str:
        """For tools: "claim check: 5.0 MiB of json, sha256 1f2e3d4c5b6a…"."""
        return f"claim check: {mib(self.size)} of {self.kind}, sha256 {self.sha256[:12]}…"

    def problem(self, data: bytes | None) -> str | None:
        """Why `data` is not this blob (missing, wrong size, wrong digest), or None."""
        if data is None:
            return f"claim check blob {self.sha256} is missing"
        if len(data) != self.size:
            return (
                f"claim check blob {self.sha256} has {len(data)} bytes, not the {self.size} "
                "its envelope names: not delivered"
            )
        if hashlib.sha256(data).hexdigest() != self.sha256:
            return f"claim check blob {self.sha256} fails its digest check: not delivered"
        return None

    def decode(self, data: bytes) -> Any:
        """The original body from the blob's (verified) bytes."""
        return data.decode() if self.kind == "text" else msgspec.json.decode(data)


def claim_of(body: Any) -> Claim | None:
    """The claim a reference body names; None if `body` is not one (or is malformed)."""
    if type(body) is not dict or len(body) != 1:
        return None
    fields = body.get(CLAIM)
    if type(fields) is not dict or set(fields) != {"sha256", "size", "kind"}:
        return None
    digest, size, kind = fields["sha256"], fields["size"], fields["kind"]
    if type(digest) is not str or not valid_digest(digest):
        return None
    if type(size) is not int or size < 0 or kind not in ("text", "json"):
        return None
    return Claim(digest, size, kind)


def check_in(
    store: Store, envelope: Envelope, refused: EnvelopeTooLarge
) -> tuple[Envelope, Callable[[], Awaitable[None]]]:
    """`envelope`, too large for its inbox (`refused` says so), with its body replaced by a
    reference, and the store call that keeps the body as a blob (safe to repeat); the sender
    makes that call, then sends the reference. `BlobTooLarge` over the store's `max_blob`,
    and `refused` itself when `max_blob` is 0 (claim checks off)."""
    if not store.max_blob:
        raise refused
    claim, data = Claim.of(envelope.body)
    if claim.size > store.max_blob:
        raise BlobTooLarge(
            f"envelope {envelope.id} from {envelope.sender} to {envelope.recipient} carries "
            f"{mib(claim.size)}, over max_blob={mib(store.max_blob)} (the most a claim check "
            "carries); nothing was sent: send a smaller payload, a path or URL to the data, "
            "or raise max_blob"
        )
    reference = envelope.model_copy(update={"body": claim.body()})
    return reference, lambda: store.blob_put(claim.sha256, data)


def redeem(store: Store, fields: EnvelopeFields) -> EnvelopeFields | str:
    """The record `fields` with the body its claim check names, fetched and verified; or why
    it cannot be delivered (for the quarantine). A body with other keys beside `$claim` is an
    ordinary one, returned as it is."""
    if len(fields.body) != 1:
        return fields
    claim = claim_of(fields.body)
    if claim is None:
        return f"a malformed claim check body (a {CLAIM!r} key that is not a reference)"
    problem = claim.problem(data := store.blob_get_nowait(claim.sha256))
    if problem is not None:
        return problem
    assert data is not None
    try:
        body = claim.decode(data)
    except (UnicodeDecodeError, msgspec.DecodeError) as exc:
        return f"claim check blob {claim.sha256} does not decode as {claim.kind}: {exc}"
    if payload_model(fields.type) is not None:  # the check decoding left for now
        try:
            validate_body(fields.type, body)
        except PayloadError as exc:
            return f"payload (from claim check blob {claim.sha256}): {exc}"
    return msgspec.structs.replace(fields, body=body)


def redeemed(store: Store, envelope: R) -> R:
    """`envelope` with the body its claim check names (itself if it is not one), for readers
    outside an inbox; `StoreCorrupt` if the blob is missing or does not match."""
    body = envelope.body
    if type(body) is not dict or CLAIM not in body:
        return envelope
    redeemed = redeem(store, EnvelopeFields.of(envelope))
    if type(redeemed) is str:
        raise StoreCorrupt(f"envelope {envelope.id} from {envelope.sender}: {redeemed}", errno=0)
    return envelope.model_copy(update={"body": redeemed.body})  # type: ignore[union-attr]
