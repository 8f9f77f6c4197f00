"""Where a team lives: a directory means files, a `redis://` or `rediss://` URL means Redis.

A `file://` URL is the directory it spells (`file:///srv/teams/demo`, `file://localhost/...`,
`file:/srv/...`, percent-escapes decoded); a URL of any other scheme is refused, never taken for
a directory named after it.

The one place above the stores that turns a locator into a concrete store, so that the CLI, the
demos and applications take either and nothing else names a store class:

    async with open_mailboxes("mailboxes/demo", members=["lead", "writer"]) as mail: ...
    async with open_mailboxes("redis://127.0.0.1:6379/0?team=demo") as mail: ...

`TEAMRT_STORE` names the default locator for the commands that take one.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from teamrt.errors import UsageError
from teamrt.mail.mailboxes import DEFAULT_RESCAN_INTERVAL, Mailboxes
from teamrt.mail.signing import check_key, key_fingerprint
from teamrt.mail.store import DEFAULT_MAX_ENVELOPE, Durability, Store, TeamView
from teamrt.mail.urls import URL_SCHEMES as URL_SCHEMES
from teamrt.mail.urls import Locator as Locator
from teamrt.mail.urls import is_url as is_url
from teamrt.mail.urls import redacted as redacted

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def local_path(locator: Locator) -> Locator:
    """`locator` with a `file:` URL turned into the path it names; anything else as it is,
    but a URL whose scheme no store has (`http://`, `memory://`...), which is `UsageError`."""
    if "\x00" in os.fspath(locator):
        raise UsageError(f"{redacted(str(locator))!r}: a path or URL cannot hold a NUL character")
    if not isinstance(locator, str) or is_url(locator):
        return locator
    if locator[:5].lower() == "file:":
        return _file_url_path(locator)
    scheme = _SCHEME.match(locator)
    if scheme is not None and locator[scheme.end() : scheme.end() + 2] == "//":
        raise UsageError(
            f"{redacted(locator)}: no store has the scheme {scheme.group()[:-1]!r}; give a team "
            "directory (or a file:///absolute/path URL) or a redis://, rediss:// or unix:// URL"
        )
    return locator


def _file_url_path(url: str) -> str:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise UsageError(
            f"{url}: a file URL on another host ({parts.netloc}); teams on files are local: "
            "give the directory on this machine, or a Redis URL for a team across hosts"
        )
    if parts.query or parts.fragment:
        raise UsageError(f"{url}: a file URL takes no query or fragment; give the directory")
    if not parts.path.startswith("/"):
        raise UsageError(
            f"{url}: a file URL names an absolute path (file:///srv/teams/demo); for a relative "
            "one give the directory itself"
        )
    return unquote(parts.path)


def from_env(locator: Locator | None) -> Locator:
    """`locator`, or `TEAMRT_STORE` when it is None (a `file:` URL as its path, see
    `local_path`)."""
    if locator is not None:
        return local_path(locator)
    value = os.environ.get("TEAMRT_STORE")
    if not value:
        raise UsageError("no team given: pass a team directory or a store URL, or set TEAMRT_STORE")
    return local_path(value)


def with_team(url: str, team: str) -> str:
    """A store URL naming team `team` unless it names one already (`?team=`)."""
    if not is_url(url):
        raise UsageError(f"{url!r} is not a store URL (redis://HOST:PORT/DB)")
    parts = urlsplit(url)
    query = parse_qsl(parts.query)
    if any(key == "team" for key, _ in query):
        return url
    return urlunsplit(parts._replace(query=urlencode([*query, ("team", team)])))


describe = redacted  # the name the demos know it by


def open_store(
    locator: Locator,
    *,
    durability: Durability = "none",
    max_envelope: int = DEFAULT_MAX_ENVELOPE,
    create: bool = True,
    **options: Any,
) -> Store:
    """A store for the team at `locator` (not opened yet: `Mailboxes` opens it). `options` go
    to the store's constructor (`segment_bytes`, `shared_group` for files; `lease_ttl` for
    Redis)."""
    locator = local_path(locator)
    if is_url(locator):
        try:  # an optional extra: imported only for a Redis team
            redisstore = importlib.import_module("teamrt.mail.redisstore")
        except ImportError as exc:
            raise UsageError(
                f"{redacted(locator)} is a Redis team, and the Redis client is not installed "
                f"({exc}): install teamrt with the redis extra, pip install 'teamrt[redis]'"
            ) from None
        store: Store = redisstore.RedisStore(  # it reads ?team= and ?lease_ttl= itself
            str(locator), durability=durability, max_envelope=max_envelope, create=create,
            **options,
        )  # fmt: skip
        return store
    from teamrt.mail.filestore.store import FileStore

    return FileStore(
        Path(locator), durability=durability, max_envelope=max_envelope, create=create, **options
    )


def open_view(locator: Locator, *, key: str | bytes | None = None) -> TeamView:
    """A read-only view of the team at `locator`, for tools (it must exist). `key` (else
    `TEAMRT_TEAM_KEY`) must be a signed team's key, and absent for an unsigned team
    (`TeamKeyMismatch`)."""
    view = open_store(locator, create=False).view()
    try:
        check_key(view.team, view.signing(), key_fingerprint(key, view.team))
    except BaseException:
        view.close()
        raise
    return view


def open_mailboxes(
    locator: Locator,
    *,
    members: Iterable[str] = (),
    durability: Durability = "none",
    key: str | bytes | None = None,
    create: bool = True,
    rescan_interval: float = DEFAULT_RESCAN_INTERVAL,
    max_envelope: int = DEFAULT_MAX_ENVELOPE,
    **options: Any,
) -> Mailboxes:
    """`Mailboxes` for the team at `locator` (a directory, or a store URL); use with
    `async with`."""
    store = open_store(
        locator, durability=durability, max_envelope=max_envelope, create=create, **options
    )
    return Mailboxes(store, members=members, rescan_interval=rescan_interval, key=key)
