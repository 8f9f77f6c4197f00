"""`RedisView`: a read-only, synchronous view of a team in Redis, for tools.

It uses redis-py's synchronous client (with its retries off), takes no lease and writes nothing.
Inboxes are scanned with XRANGE in pages, so memory stays bounded whatever an inbox's size; the
view may run while the team runs (a scan sees the records that were there when each page was
read).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, RedisError, ResponseError
from redis.retry import Retry

from teamrt.errors import StoreCorrupt, StoreError, StoreUnavailable, UnknownRecipient
from teamrt.mail.log import DEFAULT_MAX_LINE, Cursor, Entry, Position
from teamrt.mail.redisstore import cluster
from teamrt.mail.redisstore.client import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_SOCKET_TIMEOUT,
    auth_error,
)
from teamrt.mail.redisstore.keys import TeamKeys, parse_locator, stream_id
from teamrt.mail.redisstore.reader import make_entry
from teamrt.mail.store import TeamView
from teamrt.names import validate_name

SCAN_PAGE = 1000
_MAX_REDIRECTS = 5  # MOVED replies followed for one command
QUARANTINE_PAGE = 256


class RedisView(TeamView):
    """A read-only view of the team at `url` (`redis://host:port/db?team=NAME`)."""

    def __init__(
        self,
        url: str,
        *,
        team: str | None = None,
        prefix: str | None = None,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        self.locator_parts = locator = parse_locator(url, team=team, prefix=prefix)
        self.team = locator.team
        self.locator = locator.shown
        self.keys = TeamKeys(locator.prefix, locator.team)
        self._redis: Any = redis.Redis.from_url(
            locator.url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            retry=Retry(NoBackoff(), 0),
            protocol=2,
            # driver_info stays: on TLS 1.3 its round trip on connect takes the server's
            # session ticket off the socket before redis-py's pool checks the connection is
            # quiet (without it that check fails now and then: "Connection not ready")
        )
        # stream entries as the server sends them ([id, [field, value]]), as the store reads them
        self._redis.set_response_callback("XRANGE", lambda response, **options: response)
        self._meta: dict[str, str] | None = None

    def _run(self, *args: Any, what: str) -> Any:
        for _ in range(_MAX_REDIRECTS):
            try:
                return self._redis.execute_command(*args)
            except (ResponseError, AuthenticationError) as exc:  # an error reply, or AUTH's
                refusal = auth_error(self.locator_parts, exc, what)
                if refusal is not None:
                    raise refusal from None
                target = cluster.moved_to(exc)
                if target is None:
                    raise self._refused(exc, what) from None
                self._follow(target)  # Redis Cluster: another node serves the team
            except RedisError as exc:
                raise StoreUnavailable(
                    f"Redis at {self._node()} could not be reached to {what} ({exc}); check "
                    f"that redis-server runs and that {self.locator} is the right server"
                ) from None
        raise StoreUnavailable(
            f"Redis at {self._node()}: the cluster kept moving the slot of team {self.team!r} "
            f"while trying to {what}; try again"
        )

    def _refused(self, exc: ResponseError | AuthenticationError, what: str) -> StoreError:
        if cluster.transient(exc):
            return StoreUnavailable(
                f"Redis at {self._node()} could not {what}: the cluster is moving the team's "
                f"slot or electing its master ({exc}); try again"
            )
        return StoreError(f"Redis at {self._node()} refused to {what}: {exc}")

    def _node(self) -> str:
        options = self._redis.connection_pool.connection_kwargs
        if "port" not in options:
            return self.locator_parts.address  # a Unix socket
        return f"{options['host']}:{options['port']}"

    def _follow(self, target: cluster.Address) -> None:
        """Connect to `target` from now on (same credentials and options)."""
        pool = self._redis.connection_pool
        pool.connection_kwargs["host"], pool.connection_kwargs["port"] = target
        pool.disconnect()  # the connections made so far keep the old address
        pool.reset()

    # -- the team --

    def meta(self) -> dict[str, str]:
        """The team's meta hash (epoch, created_at, format, max_envelope, lease_ttl_ms,
        key_fingerprint)."""
        meta = self._read_meta()
        if meta is None:
            raise StoreError(f"no team {self.team!r} at {self.locator}")
        return meta

    def _read_meta(self) -> dict[str, str] | None:
        if self._meta is None:
            raw = self._run("HGETALL", self.keys.meta, what="read the team")
            if not raw:
                return None
            self._meta = {bytes(k).decode(): bytes(v).decode() for k, v in dict(raw).items()}
        return self._meta

    @property
    def max_line(self) -> int:
        return max(DEFAULT_MAX_LINE, int(self.meta().get("max_envelope", 0)) + 256)

    def members(self) -> tuple[str, ...]:
        self.meta()
        raw = self._run("LRANGE", self.keys.members, 0, -1, what="read the roster")
        return tuple(name.decode() for name in raw)

    def created_at(self) -> float | None:
        value = self.meta().get("created_at")
        return None if value is None else float(value)

    def signing(self) -> str | None:
        meta = self._read_meta()  # a missing team records nothing: reading it says it is missing
        return None if meta is None else meta.get("key_fingerprint")

    def blob(self, digest: str) -> bytes | None:
        data = self._run("HGET", self.keys.blobs, digest, what=f"read blob {digest[:12]}")
        return None if data is None else bytes(data)

    def _check_member(self, name: str) -> int:
        """The seq `name`'s next record gets (its inbox's end)."""
        validate_name(name)
        end = self._run("HGET", self.keys.next, name, what=f"read {name}'s inbox")
        if end is None:
            self.meta()  # a missing team says so first
            raise UnknownRecipient(f"no member {name!r} in team {self.team!r}")
        return int(end)

    # -- inboxes --

    def scan(self, name: str, after: Position | None = None) -> Iterator[Entry]:
        return self._scan(name, after, self.max_line)

    def scan_whole(self, name: str) -> Iterator[Entry]:
        """Like `scan`, but records longer than the line limit come whole (for export)."""
        return self._scan(name, None, sys.maxsize)

    def _scan(self, name: str, after: Position | None, max_line: int) -> Iterator[Entry]:
        self._check_member(name)
        key = self.keys.inbox(name)
        start = 0 if after is None else after[1]
        while True:
            items = self._run(
                "XRANGE",
                key,
                stream_id(start),
                "+",
                "COUNT",
                SCAN_PAGE,
                what=f"read {name}'s inbox",
            )
            for item in items:
                seq, entry = make_entry(item, max_line)
                start = seq + 1
                yield entry
            if len(items) < SCAN_PAGE:
                return

    def end(self, name: str) -> Position:
        return (0, self._check_member(name))

    def committed(self, name: str) -> Cursor:
        self._check_member(name)
        raw = self._run("HGET", self.keys.cursor(name), "c", what=f"read {name}'s cursor")
        if raw is None:
            return Cursor()
        try:
            return Cursor.from_json_dict(json.loads(raw))
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreCorrupt(
                f"{name}'s cursor in team {self.team!r} is unreadable: {exc}"
            ) from None

    def quarantined(self, name: str) -> Iterator[dict[str, Any]]:
        self._check_member(name)
        key = self.keys.quarantine(name)
        index = 0
        while True:
            page = self._run(
                "LRANGE",
                key,
                index,
                index + QUARANTINE_PAGE - 1,
                what=f"read {name}'s quarantine",
            )
            for raw in page:
                try:
                    record = json.loads(raw)
                except ValueError:
                    record = None
                if isinstance(record, dict):
                    yield record
                else:
                    text = bytes(raw).decode("utf-8", "backslashreplace")
                    yield {"at": None, "end": None, "reason": "unreadable quarantine record",
                           "raw": text, "ts": None}  # fmt: skip
            index += len(page)
            if len(page) < QUARANTINE_PAGE:
                return

    def holder(self, name: str) -> str | None:
        validate_name(name)
        value = self._run("GET", self.keys.lease(name), what=f"read {name}'s lease")
        if value is None:
            return None
        return bytes(value).decode(errors="replace").partition(" ")[2] or "unknown holder"

    def sizes(self, name: str) -> dict[str, int]:
        """Records in the stream, the seq of the next record, and the server memory it uses
        (also as `bytes`, the figure `inspect` shows for an inbox; one "segment")."""
        end = self._check_member(name)
        key = self.keys.inbox(name)
        records = int(self._run("XLEN", key, what=f"measure {name}'s inbox"))
        try:
            memory = self._redis.execute_command("MEMORY", "USAGE", key) or 0
        except RedisError:  # MEMORY may not be allowed: a size, not an answer
            memory = 0
        return {
            "segments": 1,
            "bytes": int(memory),
            "records": records,
            "next_seq": end,
            "memory_bytes": int(memory),
        }

    def ledger(self) -> dict[str, Any] | None:
        """The team's budget ledger, or None."""
        raw = self._run("HGET", self.keys.ledger, "d", what="read the budget ledger")
        if raw is None:
            return None
        try:
            ledger = json.loads(raw)
        except ValueError:
            return None
        return ledger if isinstance(ledger, dict) else None

    def close(self) -> None:
        self._redis.close()
