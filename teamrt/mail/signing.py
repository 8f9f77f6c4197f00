"""Optional envelope signing with a team key (HMAC-SHA256), with no I/O.

Without a key, `sender` is whatever the writing process put there: any process of the same user
can write any inbox. With a key shared by the team's processes, every envelope carries
`"sig":"<64 hex>"` as its last field, an HMAC over the team name and the envelope's encoded bytes
(everything from `"v"` to the end of `body`, exactly as written; `seq`, assigned under the lock,
is not covered). A reader with the key quarantines a line whose signature is missing or wrong, so
a forged sender, recipient or body is detected. A replayed signed line carries an id the owner
has seen, and is dropped as a duplicate while that id is remembered.
"""

from __future__ import annotations

import hashlib
import hmac
import os

from teamrt.errors import UsageError

KEY_ENV = "TEAMRT_TEAM_KEY"
_SIG_FIELD = b',"sig":"'
_SIG_LEN = 64  # hex digits of SHA-256
_SUFFIX_LEN = len(_SIG_FIELD) + _SIG_LEN + 2  # ,"sig":"<hex>"}


def team_key(key: str | bytes | None) -> bytes | None:
    """The key to sign with: `key`, else `TEAMRT_TEAM_KEY`, else None (no signing)."""
    if key is None:
        key = os.environ.get(KEY_ENV) or None
    if key is None:
        return None
    raw = key.encode() if isinstance(key, str) else bytes(key)
    if len(raw) < 16:
        raise UsageError("a team key must be at least 16 bytes (use e.g. `openssl rand -hex 32`)")
    return raw


class Signer:
    """Signs encoded envelopes and verifies stamped lines of one team."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        self._key = key

    def _mac(self, team: str, encoded: bytes) -> bytes:
        return hmac.digest(self._key, team.encode() + b"\n" + encoded, hashlib.sha256)

    def sign(self, encoded: bytes, team: str) -> bytes:
        """`encoded` (see `log.encode`) with a `sig` field added before its closing brace."""
        mac = self._mac(team, encoded).hex().encode()
        return encoded[:-1] + _SIG_FIELD + mac + b'"}'

    def verify(self, line: bytes, team: str) -> bool:
        """True if the stamped `line` (without its newline) carries a valid signature."""
        line = line.rstrip()
        if len(line) < _SUFFIX_LEN or line[-_SUFFIX_LEN : -_SIG_LEN - 2] != _SIG_FIELD:
            return False
        start = line.find(b'"v":')
        if start < 0:
            return False
        encoded = line[start:-_SUFFIX_LEN] + b"}"
        try:
            given = bytes.fromhex(line[-_SIG_LEN - 2 : -2].decode("ascii"))
        except ValueError:
            return False
        return hmac.compare_digest(given, self._mac(team, encoded))
