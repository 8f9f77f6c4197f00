"""Optional envelope signing with a team key (HMAC-SHA256), with no I/O.

Without a key, `sender` is whatever the writing process put there: any process of the same user
can write any inbox. With a key shared by the team's processes, every envelope carries
`"sig":"<64 hex>"` as its last field, an HMAC over the team name and the envelope's encoded bytes
(everything from `"v"` to the end of `body`, exactly as written; `seq`, assigned under the lock,
is not covered). A reader with the key quarantines a line whose signature is missing or wrong, so
a forged sender, recipient or body is detected. A replayed signed line carries an id the owner
has seen, and is dropped as a duplicate while that id is remembered.

A team records when it is created whether it is signed, and the fingerprint of its key (an HMAC
of a fixed label and the team's name under the key: it tells keys apart and reveals none), and
every opening compares the key it holds with that record (`check_key`). A team made before
teams recorded it (no record: None) is not checked.
"""

from __future__ import annotations

import hashlib
import hmac
import os

from teamrt.errors import TeamKeyMismatch, UsageError

KEY_ENV = "TEAMRT_TEAM_KEY"
_SIG_FIELD = b',"sig":"'
_SIG_LEN = 64  # hex digits of SHA-256
_SUFFIX_LEN = len(_SIG_FIELD) + _SIG_LEN + 2  # ,"sig":"<hex>"}
_FINGERPRINT_LABEL = b"teamrt team key fingerprint\n"
FINGERPRINT_LEN = 16  # hex digits: 64 bits tell keys apart (it names a key, it signs nothing)


def team_key(key: str | bytes | None) -> bytes | None:
    """The key to sign with: `key`, else `TEAMRT_TEAM_KEY`, else None (no signing). A str is
    its UTF-8 (bytes that are not UTF-8, escaped as Python does for argv and the environment,
    count as themselves); the environment's value is taken as bytes."""
    if key is None:
        # the environment's bytes: a key that is not UTF-8 is the same key in every process
        key = os.environb.get(KEY_ENV.encode()) or None
    if key is None:
        return None
    try:  # a str read from argv or the environment escapes its non-UTF-8 bytes: those bytes
        raw = key.encode("utf-8", "surrogateescape") if isinstance(key, str) else bytes(key)
    except UnicodeEncodeError:
        raise UsageError(
            "a team key given as str must be text (it holds a lone surrogate): pass its bytes"
        ) from None
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


def fingerprint(key: bytes, team: str) -> str:
    """What team `team` records of its `key`: 16 hex digits of an HMAC-SHA256 under the key of a
    fixed label and the team's name (so one key's teams show different fingerprints)."""
    mac = hmac.digest(key, _FINGERPRINT_LABEL + team.encode(), hashlib.sha256)
    return mac.hex()[:FINGERPRINT_LEN]


def key_fingerprint(key: str | bytes | None, team: str) -> str:
    """The fingerprint of the key this process holds for `team` (`key`, else
    `TEAMRT_TEAM_KEY`), or "" if it holds none."""
    secret = team_key(key)
    return "" if secret is None else fingerprint(secret, team)


def check_key(team: str, recorded: str | None, mine: str) -> None:
    """Refuse (`TeamKeyMismatch`) to open team `team` unless the key this process holds (`mine`,
    its fingerprint, "" for none) is the one the team records (`recorded`: a fingerprint, ""
    for an unsigned team, None for a team made before teams recorded it: never refused)."""
    if recorded is None or recorded == mine:
        return
    if not recorded:
        raise TeamKeyMismatch(
            f"team {team!r} is not signed, and this process holds a team key (fingerprint "
            f"{mine}): the team's other processes write unsigned mail, which this one would "
            f"quarantine. Unset {KEY_ENV} (or pass no key); a team is signed from its creation, "
            "so to sign this one, create a new team with the key"
        )
    if not mine:
        raise TeamKeyMismatch(
            f"team {team!r} is signed (key fingerprint {recorded}), and this process holds no "
            f"team key: its mail would be quarantined as 'bad signature', and it could not "
            f"tell forged mail. Set {KEY_ENV} (or pass key=) to the team's key"
        )
    raise TeamKeyMismatch(
        f"team {team!r} is signed with another key (fingerprint {recorded}; this process's key "
        f"has {mine}): its mail would be quarantined as 'bad signature'. Use the team's key "
        f"({KEY_ENV} or key=)"
    )
