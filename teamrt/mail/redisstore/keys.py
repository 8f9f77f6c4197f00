"""Where a team lives in Redis: the locator (a `redis://` URL naming the team) and the key layout.

Every key of a team starts with `<prefix>:{<team>}:`. The braces are a Redis Cluster hash tag, so
all of a team's keys hash to one slot: every script and every multi-stream XREAD of the team runs
on one node. Names are validated (letters, digits, `_`, `-`), so they can contain neither `:` nor
braces and no two keys collide.

    meta              hash    epoch, created_at, format, max_envelope, team, lease_ttl_ms,
                              key_fingerprint ("" unsigned; absent: made before it was kept)
    members           list    the roster, in the order members joined
    next              hash    member -> the seq its next envelope gets (membership is HEXISTS)
    fences            hash    member -> the last fencing token handed out for its lease
    ran               set     members whose lease was ever taken (liveness: False vs None)
    qupto             hash    member -> seq of the last record quarantined (once per record)
    ledger            hash    v (version), d (the budget ledger as JSON)
    blobs             hash    sha256 (hex) -> the bytes of a claim check's body (see claims.py)
    inbox:<name>      stream  one entry per record: id 0-<seq+1>, field `d` = the stamped line
    cursor:<name>     hash    c (the cursor as JSON), gen (commit count), fence (of the commit)
    quarantine:<name> list    quarantine records as JSON
    lease:<name>      string  "<fence> <holder>", with a time limit (PX)
    ctl:<id>          stream  one process's wake-up channel for its watcher (expires)
    task:<id>         string  an idempotent ask's record (JSON), set once (SET NX)
    task:<id>:outcome string  its outcome, the first answer (JSON), set once
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from teamrt.errors import UsageError
from teamrt.mail.urls import redacted
from teamrt.names import validate_name

DEFAULT_PREFIX = "teamrt"
SCHEMES = ("redis", "rediss", "unix")


def is_redis_locator(locator: object) -> bool:
    """True if `locator` is a string naming a Redis team (`redis://`, `rediss://`, or
    `unix:///path/to/redis.sock?db=N&team=NAME`)."""
    return isinstance(locator, str) and locator.partition("://")[0] in SCHEMES


@dataclass(frozen=True, slots=True)
class Locator:
    """A parsed `redis://host:port/db?team=NAME` (or `rediss://`): the server and the team.

    `url` is what redis-py is given (teamrt's own query parameters removed); `shown` is the
    locator without a password, for messages; `lease_ttl` is `?lease_ttl=SECONDS` if given.
    """

    url: str
    team: str
    prefix: str
    host: str
    port: int
    db: int
    shown: str
    lease_ttl: float | None = None
    user: str | None = None  # the ACL user name, if the URL gives one

    @property
    def address(self) -> str:
        return self.host if self.port == 0 else f"{self.host}:{self.port}"  # port 0: a socket


def parse_locator(url: str, *, team: str | None = None, prefix: str | None = None) -> Locator:
    """Parse a Redis locator. The team comes from `?team=NAME` or the `team` argument (which
    must agree if both are given); `?prefix=` or `prefix` sets the key prefix (default
    "teamrt"); `?lease_ttl=SECONDS` the lease time limit of a team created through it. Other
    query parameters are left for redis-py (its connection options, e.g. `ssl_ca_certs`)."""
    if not is_redis_locator(url):
        raise UsageError(f"not a Redis locator: {url!r} (expected redis://host:port/db?team=NAME)")
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    rest: list[tuple[str, str]] = []
    url_team = url_prefix = url_ttl = None
    for key, value in query:
        if key == "team":
            url_team = value
        elif key == "prefix":
            url_prefix = value
        elif key == "lease_ttl":
            url_ttl = value
        else:
            rest.append((key, value))
    lease_ttl = None
    if url_ttl is not None:
        try:
            lease_ttl = float(url_ttl)
        except ValueError:
            lease_ttl = -1.0
        if not lease_ttl > 0:
            raise UsageError(f"lease_ttl={url_ttl!r} in {redacted(url)!r}: give seconds")
    if team is not None and url_team is not None and team != url_team:
        raise UsageError(f"the locator names team {url_team!r} but team={team!r} was given")
    name = team if team is not None else url_team
    if name is None:
        raise UsageError(f"no team in {redacted(url)!r}: add ?team=NAME")
    validate_name(name, what="team name")
    chosen_prefix = prefix if prefix is not None else (url_prefix or DEFAULT_PREFIX)
    if not chosen_prefix or any(c in chosen_prefix for c in "{}: \n"):
        raise UsageError(f"invalid key prefix {chosen_prefix!r}: no braces, colons or spaces")
    if parts.scheme == "unix":
        db_text = dict(rest).get("db", "0")
        if not parts.path or not db_text.isdigit():
            raise UsageError(f"invalid Unix socket locator {redacted(url)!r}")
        redis_url = f"unix://{parts.netloc}{parts.path}?{urlencode(rest)}"  # keeps the //
        shown = f"unix://{parts.path}?{urlencode([('db', db_text), ('team', name)])}"
        return Locator(
            redis_url, name, chosen_prefix, parts.path, 0, int(db_text), shown, lease_ttl,
            parts.username or None,
        )  # fmt: skip
    try:
        port = parts.port or 6379
    except ValueError:
        raise UsageError(f"invalid port in {redacted(url)!r}") from None
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise UsageError(f"invalid database number {path!r} in {redacted(url)!r}")
    db = int(path) if path else 0
    redis_url = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(rest), ""))
    host = parts.hostname or "localhost"
    shown_netloc = f"{host}:{port}"
    shown = urlunsplit((parts.scheme, shown_netloc, f"/{db}", urlencode([("team", name)]), ""))
    return Locator(
        redis_url, name, chosen_prefix, host, port, db, shown, lease_ttl, parts.username or None
    )


class TeamKeys:
    """The names of one team's keys (see the module docstring for what each holds)."""

    __slots__ = (
        "base",
        "blobs",
        "fences",
        "ledger",
        "members",
        "meta",
        "next",
        "qupto",
        "ran",
    )

    def __init__(self, prefix: str, team: str) -> None:
        self.base = base = f"{prefix}:{{{team}}}:"
        self.meta = base + "meta"
        self.members = base + "members"
        self.next = base + "next"
        self.fences = base + "fences"
        self.ran = base + "ran"
        self.qupto = base + "qupto"
        self.ledger = base + "ledger"
        self.blobs = base + "blobs"

    def inbox(self, name: str) -> str:
        return f"{self.base}inbox:{name}"

    def cursor(self, name: str) -> str:
        return f"{self.base}cursor:{name}"

    def quarantine(self, name: str) -> str:
        return f"{self.base}quarantine:{name}"

    def lease(self, name: str) -> str:
        return f"{self.base}lease:{name}"

    def task(self, request_id: str) -> str:
        return f"{self.base}task:{request_id}"

    def control(self, token: str) -> str:
        return f"{self.base}ctl:{token}"

    def inbox_name(self, key: bytes | str) -> str:
        """The member whose inbox stream `key` is."""
        text = key.decode() if isinstance(key, bytes) else key
        return text[len(self.base) + len("inbox:") :]


def stream_id(seq: int) -> bytes:
    """The stream entry id of the record with `seq`: `0-<seq+1>` (ids start above 0-0)."""
    return b"0-%d" % (seq + 1)


def seq_of(entry_id: bytes) -> int:
    """The seq of the record with stream id `entry_id`; -1 for an id teamrt never writes."""
    ms, _, number = entry_id.partition(b"-")
    if ms != b"0":
        return -1
    return int(number) - 1
