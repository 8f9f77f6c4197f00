"""Connections to the Redis server, and the one translation of redis-py's errors into teamrt's.

A network store must tell "not sent" from "maybe sent", which redis-py's client does not (its
retries and its one `ConnectionError` for both cases blur them). So this module drives redis-py's
connections itself, with redis-py's retries off: a failure while taking or opening a connection
(refused, unreachable, the handshake unanswered) happens before the command left this process and
becomes `StoreUnavailable`; a failure after the command was written (a timeout, the connection
dropped) becomes `OutcomeUnknown` for a change and `StoreUnavailable` for a read (a read can
simply be asked again). A reply the server refused without running the command (LOADING,
READONLY, BUSY, OOM) is "not sent" too.

Idle connections are kept in a small free list; a connection the server closed while it was idle
is noticed before it is used (its stream is at EOF), so a server restart costs a reconnect, not
an ambiguous outcome.

On Redis Cluster the connections go to the master serving the team's slot (cluster.py): the
first connection asks for the slot map, MOVED replies and unreachable masters re-route it. A
server that refuses or wants credentials is `StoreAuthFailed`, never "unreachable".
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import socket
from collections.abc import Sequence
from typing import Any

import anyio
from redis.asyncio.connection import (
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
    parse_url,
)
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from teamrt.errors import (
    OutcomeUnknown,
    StoreAuthFailed,
    StoreError,
    StoreUnavailable,
    UsageError,
)
from teamrt.mail.redisstore import cluster
from teamrt.mail.redisstore.cluster import Address
from teamrt.mail.redisstore.keys import Locator
from teamrt.mail.redisstore.scripts import Script

log = logging.getLogger("teamrt.mail")

#: How long a command may wait for its answer before it is reported as unanswered.
DEFAULT_SOCKET_TIMEOUT = 5.0
#: How long opening a connection may take before the server counts as unreachable.
DEFAULT_CONNECT_TIMEOUT = 2.0
_MAX_IDLE = 32  # idle connections kept; more are closed when given back
_MAX_REDIRECTS = 5  # MOVED replies followed for one request (a slot moves once per failover)

#: Errors raised while a command was on its way or its answer was awaited (OSError includes
#: the TimeoutError of a write that could not drain).
_TRANSPORT_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)
#: Error replies that mean the server did not run the command.
_REFUSED = (BusyLoadingError, ReadOnlyError, OutOfMemoryError)


def connection_kwargs(
    locator: Locator, *, socket_timeout: float | None, connect_timeout: float
) -> tuple[type[Any], dict[str, Any]]:
    """The connection class and keyword arguments for redis-py, with its retries off."""
    kwargs: dict[str, Any] = dict(parse_url(locator.url))
    connection_class = kwargs.pop("connection_class", Connection)
    if connection_class not in (Connection, SSLConnection, UnixDomainSocketConnection):
        raise StoreError(f"unsupported Redis connection in {locator.shown}")
    known = {
        name
        for cls in connection_class.__mro__
        if "__init__" in vars(cls)
        for name in inspect.signature(vars(cls)["__init__"]).parameters
    }
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise UsageError(
            f"unknown option {', '.join(unknown)} in the Redis locator {locator.shown} (teamrt "
            "takes team, prefix and lease_ttl; the others are redis-py's connection options)"
        )
    kwargs.setdefault("socket_timeout", socket_timeout)
    kwargs.setdefault("socket_connect_timeout", connect_timeout)
    if connection_class is not UnixDomainSocketConnection:
        kwargs.setdefault("socket_keepalive", True)
    kwargs["retry"] = Retry(NoBackoff(), 0)
    kwargs["driver_info"] = None  # no CLIENT SETINFO round trips on connect
    kwargs["protocol"] = 2  # no HELLO round trip; the replies' shapes are RESP2's
    return connection_class, kwargs


def _still_open(conn: Any) -> bool:
    """True if an idle connection is open and the server has sent nothing on it. The event
    loop may not have read the server's FIN yet (a server restarted while this process was
    busy), so the socket itself is asked, without blocking: a connection closed while idle
    must not turn the next command into an ambiguous outcome."""
    reader = getattr(conn, "_reader", None)
    writer = getattr(conn, "_writer", None)
    if not conn.is_connected or reader is None or writer is None or reader.at_eof():
        return False
    if writer.get_extra_info("sslcontext") is not None:
        return True  # TLS records (session tickets) may wait on the socket: not a reply
    transport_socket = writer.get_extra_info("socket")
    sock = getattr(transport_socket, "_sock", None)  # asyncio's wrapper forbids recv()
    if not isinstance(sock, socket.socket):
        return True  # cannot tell: the command's own errors will say
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return True  # nothing to read: open and quiet
    except OSError:
        return False
    return False  # b"": closed by the server; data: a reply nobody awaited (out of step)


_BULK: dict[str, bytes] = {}  # short strings packed once: names, keys, epochs, script hashes
_BULK_MAX = 4096  # strings kept
_BULK_LONGEST = 160  # longer strings (a cursor, a quarantine record) are packed each time


def _bulk(arg: object) -> bytes:
    """One argument as a Redis bulk string."""
    if isinstance(arg, bytes):
        return b"$%d\r\n%b\r\n" % (len(arg), arg)
    if isinstance(arg, str):
        packed = _BULK.get(arg)
        if packed is None:
            data = arg.encode()
            packed = b"$%d\r\n%b\r\n" % (len(data), data)
            if len(arg) <= _BULK_LONGEST and len(_BULK) < _BULK_MAX:
                _BULK[arg] = packed
        return packed
    if isinstance(arg, (int, float)) and not isinstance(arg, bool):
        data = str(arg).encode()
        return b"$%d\r\n%b\r\n" % (len(data), data)
    raise TypeError(f"cannot send {type(arg).__name__} to Redis")


def pack(commands: Sequence[Sequence[Any]]) -> bytes:
    """`commands` in the Redis protocol (arrays of bulk strings), as one buffer for one write.

    The store's own packer, a few microseconds for a script call (redis-py's general one costs
    several times that, and the round trip is the store's figure of merit): the arguments that
    repeat (names, keys, the epoch) are packed once and kept."""
    out: list[bytes] = []
    for command in commands:
        out.append(b"*%d\r\n" % len(command))
        out += map(_bulk, command)
    return b"".join(out)


#: How a server says that it wants a password first (redis-py raises some as
#: `AuthenticationError`, some as `ResponseError`; a pipeline sent before AUTH is refused whole).
_PASSWORD_WANTED = ("NOAUTH", "Authentication required", "Protocol error: unauthenticated")


def auth_error(locator: Locator, exc: BaseException, what: str) -> StoreAuthFailed | None:
    """`exc` as teamrt's error if it is the server refusing (or wanting) credentials; None if it
    is anything else. Nothing ran: the server refuses every command of an unauthenticated
    connection."""
    text = str(exc).strip()
    if text.startswith(_PASSWORD_WANTED):
        return StoreAuthFailed(
            f"Redis at {locator.address} requires a password, and {locator.shown} gives none, "
            f"so it could not {what}; nothing was done. Put it in the locator: "
            "redis://:PASSWORD@HOST:PORT/DB (or redis://USER:PASSWORD@HOST:PORT/DB for an ACL user)"
        )
    if isinstance(exc, AuthenticationError) or text.startswith("WRONGPASS") or "AUTH" in text:
        user = locator.user or "default"
        return StoreAuthFailed(
            f"Redis at {locator.address}: authentication failed for user {user!r} "
            f"({_reason(exc)}), so it could not {what}; nothing was done. Check the user name "
            "and password in the locator (redis://USER:PASSWORD@HOST:PORT/DB)"
        )
    return None


def _wants_credentials(reply: object) -> bool:
    """True for the reply of a server that refuses unauthenticated commands."""
    return isinstance(reply, AuthenticationError) or (
        isinstance(reply, ResponseError) and str(reply).startswith(_PASSWORD_WANTED)
    )


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


class RedisClient:
    """The store's connections to one server, and its commands with teamrt's errors."""

    def __init__(
        self,
        locator: Locator,
        *,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        self.locator = locator
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout
        self._class, self._kwargs = connection_kwargs(
            locator, socket_timeout=socket_timeout, connect_timeout=connect_timeout
        )
        self._idle: list[Any] = []
        self._busy: set[Any] = set()
        self._loaded: set[str] = set()
        self._tcp = self._class is not UnixDomainSocketConnection
        if self._tcp:
            self._kwargs["host"] = self._kwargs.get("host") or "localhost"
            self._kwargs["port"] = int(self._kwargs.get("port") or 6379)
        #: Redis Cluster (see cluster.py): None until the first connection asks the server
        self._cluster: bool | None = None if self._tcp else False
        self._slot = cluster.team_slot(f"{{{locator.team}}}")
        self._nodes: list[Address] = [self.address] if self._tcp else []

    # -- errors --

    def unavailable(self, exc: BaseException | str, what: str) -> StoreUnavailable:
        reason = exc if isinstance(exc, str) else _reason(exc)
        return StoreUnavailable(
            f"Redis at {self.node} could not be reached to {what} ({reason}); "
            f"nothing was done. Check that redis-server runs and that {self.locator.shown} "
            "is the right server, then try again"
        )

    def unknown(self, exc: BaseException, what: str) -> OutcomeUnknown:
        return OutcomeUnknown(
            f"Redis at {self.node} did not answer after the request to {what} went "
            f"out ({_reason(exc)}): it may or may not have been carried out. The server may be "
            "paused, overloaded or cut off; sending the same envelope again is safe (its "
            "receiver drops a second copy by its id)"
        )

    def refused(self, exc: RedisError, what: str) -> StoreError:
        """An error reply that is not teamrt's own (a script's `TEAMRT_` errors are)."""
        if isinstance(exc, BusyLoadingError):
            return self.unavailable("the server is still loading its data", what)
        if isinstance(exc, ReadOnlyError):
            return self.unavailable("the server is a read-only replica", what)
        if isinstance(exc, OutOfMemoryError):
            return StoreError(
                f"Redis at {self.node} refused to {what}: it is out of memory "
                "(maxmemory); nothing was written. Free memory on the server (export and trim "
                "old inboxes) or raise its maxmemory"
            )
        if isinstance(exc, (NoPermissionError, AuthenticationError)):
            return StoreError(
                f"Redis at {self.node} refused to {what}: {_reason(exc)} (the "
                "Redis user needs the stream, hash, list, string, set and scripting commands)"
            )
        if str(exc).startswith("BUSY"):
            return self.unavailable("the server is busy running a slow script", what)
        if cluster.transient(exc) or cluster.moved_to(exc) is not None:
            return self.unavailable(
                f"the Redis Cluster is moving the team's slot or electing its master: "
                f"{_reason(exc)}",
                what,
            )
        return StoreError(f"Redis at {self.node} refused to {what}: {_reason(exc)}")

    # -- connections --

    def new_connection(self, *, socket_timeout: float | None = None) -> Any:
        """A connection of its own (not pooled), e.g. for a blocking read."""
        kwargs = dict(self._kwargs)
        if socket_timeout is not None:
            kwargs["socket_timeout"] = socket_timeout
        return self._class(**kwargs)

    @property
    def address(self) -> Address:
        """The node new connections go to: the server, or the cluster node serving the team."""
        return self._kwargs["host"], self._kwargs["port"]

    @property
    def node(self) -> str:
        """`address` for messages (the socket's path for a Unix socket)."""
        host, port = self.address if self._tcp else (self.locator.address, 0)
        return f"{host}:{port}" if self._tcp else host

    def _route(self, address: Address) -> None:
        if address not in self._nodes:
            self._nodes.append(address)
        if address != self.address:
            log.info(
                "teamrt: team %r is served by the Redis Cluster node %s:%d now",
                self.locator.team,
                *address,
            )
            self._kwargs["host"], self._kwargs["port"] = address
            self._loaded.clear()  # another server: its script cache is its own

    def rerouted(self, reply: object) -> bool:
        """True if `reply` is a Redis Cluster's "not here" or "not now" (MOVED, ASK, TRYAGAIN,
        CLUSTERDOWN, UNBLOCKED): the command was not run, and may be sent again. After a
        MOVED, new connections go to the node it names."""
        target = cluster.moved_to(reply)
        if target is not None and self._tcp:  # (a cluster is never behind a Unix socket)
            self._cluster = True
            self._route(target)
            return True
        return cluster.transient(reply)

    async def connect(self, conn: Any, what: str) -> None:
        """Open `conn` if it is not open, to the node that serves the team; any failure here
        is `StoreUnavailable` (or `StoreAuthFailed`)."""
        if self._tcp:
            conn.host, conn.port = self.address
        try:
            await self._open(conn, what)
        except StoreUnavailable:
            if not self._cluster or not await self._refresh():
                raise
            conn.host, conn.port = self.address  # a replica took over: try the new owner
            await self._open(conn, what)
        if self._cluster is None:
            await self._probe(conn, what)

    async def _open(self, conn: Any, what: str) -> None:
        try:
            await conn.connect()
        except (AuthenticationError, ResponseError) as exc:  # AUTH (or SELECT) refused
            await self.discard(conn)
            raise auth_error(self.locator, exc, what) or self.refused(exc, what) from None
        except _REFUSED as exc:
            await self.discard(conn)
            raise self.refused(exc, what) from None
        except (*_TRANSPORT_ERRORS, RedisError) as exc:
            await self.discard(conn)
            raise self.unavailable(exc, what) from None

    async def _probe(self, conn: Any, what: str) -> None:
        """Ask the first server reached for its cluster slots: a single server refuses (as does
        one where the user may not ask: MOVED replies still redirect it)."""
        try:
            await self.write(conn, [("CLUSTER", "SLOTS")])
            reply = await conn.read_response()
        except (ResponseError, AuthenticationError) as exc:
            if _wants_credentials(exc):
                await self.discard(conn)
                raise auth_error(self.locator, exc, what) or self.refused(exc, what) from None
            self._cluster = False
            return
        except _TRANSPORT_ERRORS as exc:
            await self.discard(conn)
            raise self.unavailable(exc, what) from None
        self._cluster = True
        owner, nodes = cluster.read_slots(reply, self._slot, self.address)
        self._nodes += [node for node in nodes if node not in self._nodes]
        if owner is not None and owner != self.address:
            self._route(owner)
            await self.discard(conn)
            conn.host, conn.port = owner
            await self._open(conn, what)

    async def _refresh(self) -> bool:
        """Ask the cluster's nodes (the others first) which one owns the team's slot now; True
        if that is not the node used until now (whose connection failed)."""
        before = self.address
        for node in sorted(self._nodes, key=lambda node: node == before):
            conn = self._class(**{**self._kwargs, "host": node[0], "port": node[1]})
            try:
                await conn.connect()
                await self.write(conn, [("CLUSTER", "SLOTS")])
                reply = await conn.read_response()
            except (*_TRANSPORT_ERRORS, RedisError):
                continue
            finally:
                await self.discard(conn)
            owner, nodes = cluster.read_slots(reply, self._slot, node)
            self._nodes += [found for found in nodes if found not in self._nodes]
            if owner is not None:
                self._route(owner)
                return owner != before
        return False

    async def _take(self, what: str) -> Any:
        while self._idle:
            conn = self._idle.pop()
            if _still_open(conn) and (not self._tcp or (conn.host, conn.port) == self.address):
                self._busy.add(conn)
                return conn
            await self.discard(conn)  # closed while idle (a restart), or to a former owner
        conn = self._class(**self._kwargs)
        await self.connect(conn, what)
        self._busy.add(conn)
        return conn

    async def _give(self, conn: Any) -> None:
        self._busy.discard(conn)
        if len(self._idle) < _MAX_IDLE:
            self._idle.append(conn)
        else:
            await self.discard(conn)

    async def discard(self, conn: Any) -> None:
        """Close a connection whose state is unknown (never reused)."""
        self._busy.discard(conn)
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await conn.disconnect(nowait=True)

    async def write(self, conn: Any, commands: Sequence[Sequence[Any]]) -> None:
        """Write `commands` on an open connection. The socket takes them at once unless the
        server stopped reading; only then is there a wait, bounded by the socket timeout."""
        writer: Any = getattr(conn, "_writer", None)  # redis-py has no public handle on it
        writer.write(pack(commands))
        if writer.transport.get_write_buffer_size():
            with anyio.fail_after(self.socket_timeout):
                await writer.drain()

    async def aclose(self) -> None:
        """Close every connection (idle ones, and any still in use by a cancelled call)."""
        conns, self._idle = [*self._idle, *self._busy], []
        self._busy.clear()
        for conn in conns:
            await self.discard(conn)

    # -- commands --

    async def pipeline(
        self, commands: Sequence[Sequence[Any]], what: str, *, change: bool = True
    ) -> list[Any]:
        """Send `commands` on one connection in one write and read every reply. Error replies
        come back as `ResponseError` objects in the list, in their places. `change=False`
        (reads) reports a lost answer as `StoreUnavailable` instead of `OutcomeUnknown`.

        On Redis Cluster, commands refused whole with MOVED are sent to the new owner; refused
        in part (the node stepped down half way), they are reported like a lost answer."""
        for _ in range(_MAX_REDIRECTS):
            replies = await self._pipeline(commands, what, change=change)
            moved = [reply for reply in replies if cluster.moved_to(reply) is not None]
            if not moved:
                return replies
            self.rerouted(moved[0])
            if len(moved) < len(replies):  # some ran on the old owner, the rest did not
                raise self.unknown(moved[0], what) if change else self.unavailable(moved[0], what)
        raise self.unavailable("the cluster kept moving the team's slot", what)

    async def _pipeline(
        self, commands: Sequence[Sequence[Any]], what: str, *, change: bool
    ) -> list[Any]:
        conn = await self._take(what)
        replies: list[Any] = []
        try:
            await self.write(conn, commands)
            for _ in commands:
                try:
                    replies.append(await conn.read_response())
                except (ResponseError, BusyLoadingError, AuthenticationError) as exc:
                    replies.append(exc)  # an error reply: read on
                    if _wants_credentials(exc):
                        break  # every command is refused, and the server may hang up
        except _TRANSPORT_ERRORS as exc:
            await self.discard(conn)
            if change:
                raise self.unknown(exc, what) from None
            raise self.unavailable(exc, what) from None
        except BaseException:
            await self.discard(conn)  # cancelled half way: the replies would be out of step
            raise
        if replies and _wants_credentials(replies[-1]):
            await self.discard(conn)
            raise auth_error(self.locator, replies[-1], what) or self.refused(replies[-1], what)
        await self._give(conn)
        for reply in replies:
            if isinstance(reply, BusyLoadingError):  # a refusal: nothing was run
                raise self.refused(reply, what)
        return replies

    async def call(self, *args: Any, what: str, change: bool = True) -> Any:
        """One command; an error reply is raised as a teamrt `StoreError`."""
        (reply,) = await self.pipeline([args], what, change=change)
        if isinstance(reply, ResponseError):
            raise self.refused(reply, what)
        return reply

    async def script(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[Any],
        what: str,
        *,
        change: bool = True,
    ) -> Any:
        """Run a script (EVALSHA, or EVAL once the server does not know it). An error reply
        from the script (its own `TEAMRT_...` errors, or a command of it that failed) is raised
        as redis-py's `ResponseError` for the caller to interpret (`RedisStore.script_error`);
        a refusal to run it at all (out of memory, a replica, no permission, busy) as a
        `StoreError`."""
        if script.sha in self._loaded:
            command: tuple[Any, ...] = ("EVALSHA", script.sha, len(keys), *keys, *args)
        else:
            command = ("EVAL", script.source, len(keys), *keys, *args)
        (reply,) = await self.pipeline([command], what, change=change)
        if isinstance(reply, NoScriptError):  # the server restarted or flushed its scripts
            self._loaded.discard(script.sha)
            (reply,) = await self.pipeline(
                [("EVAL", script.source, len(keys), *keys, *args)], what, change=change
            )
        if isinstance(reply, ResponseError):
            if isinstance(reply, (*_REFUSED, NoPermissionError)) or str(reply).startswith("BUSY"):
                raise self.refused(reply, what)
            self._loaded.add(script.sha)
            raise reply  # the script's own error, or one of its commands'
        self._loaded.add(script.sha)
        return reply
