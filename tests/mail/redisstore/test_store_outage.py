"""A store outage is waited out, not taken for a crash: with redis-server paused past the client's
socket timeout, killed and restarted on its append-only file, or cut off (a proxy that holds
every byte), a teammate in the lead's process or in a `teamrt run-agent` process keeps its
incarnation and answers its task; an outage longer than the tolerance stops the incarnation with
a report that names the outage (never a crash notice), and run-agent reconnects and resumes."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import anyio
import pytest
from anyio.abc import SocketAttribute, SocketStream, TaskStatus

from teamrt import Envelope
from teamrt.agents import tool
from teamrt.errors import StoreOutage, StoreUnavailable
from teamrt.mail.mailboxes import Mailboxes
from teamrt.mail.outage import ride_out
from teamrt.mail.redisstore import RedisStore
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, call
from teamrt.team import CRASHED, Team, TeamBudget, Teammate
from tests.support.redis_server import RedisServer, needs_redis, redis_server
from tests.support.remote import TESTS

__all__ = ["redis_server"]  # the fixture
pytestmark = needs_redis

#: the client gives up on a silent server after this long (then the outage is waited out)
SOCKET_TIMEOUT = 0.3


class _Retries(logging.Handler):
    """Sets `seen` once teamrt logs that it waits out an outage of `what`."""

    def __init__(self, what: str) -> None:
        super().__init__(logging.WARNING)
        self.what = what
        self.seen = anyio.Event()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "waiting out the outage" in message and self.what in message:
            self.count += 1
            if self.count >= 2:  # two tries failed: past the socket timeout, retried
                self.seen.set()


@pytest.fixture
def retries() -> Iterator[Callable[[str], _Retries]]:
    handlers: list[_Retries] = []
    logger = logging.getLogger("teamrt")

    def watch(what: str) -> _Retries:
        handler = _Retries(what)
        logger.addHandler(handler)
        handlers.append(handler)
        return handler

    yield watch
    for handler in handlers:
        logger.removeHandler(handler)


def _outage_then_answer(start_outage: Callable[[], None]) -> Teammate:
    """A teammate whose tool starts an outage; its next model call needs the store (the
    team's budget is read before it), and then it answers."""

    @tool
    def look() -> str:
        """Look around."""
        start_outage()
        return "the server went away"

    def reply(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        if messages[-1].role == "tool":
            return "answered after the outage"
        return call("look")

    return Teammate("w", FunctionModel(reply), tools=[look])


def _store(server: RedisServer) -> RedisStore:
    return RedisStore(server.url(), socket_timeout=SOCKET_TIMEOUT, connect_timeout=SOCKET_TIMEOUT)


async def _ask_through(
    server: RedisServer, retries: _Retries, start: Callable[[], None], end: Callable[[], None]
) -> None:
    async with Mailboxes(_store(server), members=["lead", "w"], store_outage=30) as mail:
        budget = TeamBudget(max_tokens=1_000_000)
        async with Team(mail, [_outage_then_answer(start)], budget=budget) as team:
            first = team.status["w"].incarnation
            async with anyio.create_task_group() as tg:

                async def end_when_waited_out() -> None:
                    await retries.seen.wait()
                    end()

                tg.start_soon(end_when_waited_out)
                result = await team.ask("w", "look", timeout=60)
            assert result.answer == "answered after the outage"
            status = team.status["w"]
            assert status.incarnation == first and status.restarts == 0
            assert status.state != "crashed" and not status.last.startswith("crashed")
            assert not [n for n in team.notices if n.type == CRASHED]


async def test_a_teammate_waits_out_a_paused_server(
    redis_server: RedisServer, retries: Callable[[str], _Retries]
) -> None:
    seen = retries("read the budget ledger")
    await _ask_through(redis_server, seen, redis_server.pause, redis_server.resume)


async def test_a_teammate_waits_out_a_server_killed_and_restarted_on_its_log(
    redis_server: RedisServer, retries: Callable[[str], _Retries]
) -> None:
    seen = retries("read the budget ledger")
    await _ask_through(redis_server, seen, redis_server.kill, redis_server.start)


class _Partition:
    """A TCP proxy in front of the server that the test can cut off: while cut, bytes in
    either direction are held (nothing is refused or reset, as on a cut link)."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.healed = anyio.Event()
        self.healed.set()
        self.port = 0

    def cut(self) -> None:
        self.healed = anyio.Event()

    def heal(self) -> None:
        self.healed.set()

    async def serve(self, *, task_status: TaskStatus[None]) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.port = listener.extra(SocketAttribute.local_port)
        async with listener:
            task_status.started()
            await listener.serve(self._connection)

    async def _connection(self, client: SocketStream) -> None:
        async with client:
            await self.healed.wait()
            server = await anyio.connect_tcp("127.0.0.1", self.upstream)
            async with server, anyio.create_task_group() as tg:
                tg.start_soon(self._pump, client, server, tg.cancel_scope)
                await self._pump(server, client, tg.cancel_scope)

    async def _pump(self, src: SocketStream, dst: SocketStream, scope: anyio.CancelScope) -> None:
        try:
            async for data in src:
                await self.healed.wait()
                await dst.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        scope.cancel()


async def test_a_teammate_waits_out_a_partition(
    redis_server: RedisServer, retries: Callable[[str], _Retries]
) -> None:
    seen = retries("read the budget ledger")
    partition = _Partition(redis_server.port)
    async with anyio.create_task_group() as tg:
        await tg.start(partition.serve)
        proxied = RedisServer(redis_server.directory)
        proxied.port = partition.port  # (only its url() is used)
        await _ask_through(proxied, seen, partition.cut, partition.heal)
        tg.cancel_scope.cancel()


async def test_ride_out_lets_the_last_error_through_after_the_tolerance() -> None:
    tries: list[int] = []

    async def unreachable() -> None:
        tries.append(1)
        raise StoreUnavailable("not reached")

    with pytest.raises(StoreUnavailable, match="not reached"):
        await ride_out(unreachable, "reach it", 0.2)
    assert len(tries) >= 2  # tried again before giving up

    async def out() -> None:
        raise StoreOutage("out for good")

    with pytest.raises(StoreOutage):  # an outage already given up on is not waited out twice
        await ride_out(out, "reach it", 10)


async def test_an_outage_longer_than_the_tolerance_stops_the_teammate_and_names_it(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    store = _store(redis_server)
    async with Mailboxes(store, members=["lead", "w"]) as mail:
        budget = TeamBudget(max_tokens=1_000_000)
        worker = _outage_then_answer(redis_server.pause)
        team = Team(mail, [worker], budget=budget, store_outage=1.0, agent_dir=tmp_path)
        async with team:
            status = team.status["w"]
            async with anyio.create_task_group() as tg:

                async def ask() -> None:
                    with contextlib.suppress(Exception):  # the lead is cut off too
                        await team.ask("w", "look", timeout=60)

                tg.start_soon(ask)
                with anyio.fail_after(30):
                    while not status.outage:  # noqa: ASYNC110 -- polled
                        await anyio.sleep(0.05)
                tg.cancel_scope.cancel()
            redis_server.resume()
            assert status.state == "stopped"
            assert "store_outage=1s" in status.outage and "budget ledger" in status.outage
            assert status.last.startswith("stopped by a store outage")
            assert not [n for n in team.notices if n.type == CRASHED]
    journal = (tmp_path / "w.state.jsonl").read_text()
    assert '"t": "outage"' in journal or '"t":"outage"' in journal
    assert '"crash"' not in journal


# -- a teammate in a `teamrt run-agent` process --


def _run_agent(url: str, flags: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]),
        "OUTAGE_DIR": str(flags),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "teamrt", "run-agent", url, "--name", "w",
         "--spec", "outage_specs:holder", "--agent-dir", str(flags / "agents"), *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip


async def _line(proc: subprocess.Popen[bytes], *words: str, seen: list[str]) -> None:
    """Read the child's stderr until a line with every one of `words` (kept in `seen`)."""
    assert proc.stderr is not None
    stderr = proc.stderr
    while True:
        line = (await anyio.to_thread.run_sync(stderr.readline)).decode()
        assert line, "run-agent exited: " + "".join(seen)
        seen.append(line)
        if all(word in line for word in words):
            return


async def _task_through_outage(
    server: RedisServer,
    tmp_path: Path,
    *extra: str,
    waited: tuple[str, ...],
    kill: bool = False,
) -> tuple[dict[str, object], list[str]]:
    """Ask the run-agent teammate a task, pause the server (or kill it) while its tool holds,
    resume it (or start it again on its log) once the child's stderr shows `waited`; the
    task's answer and what the child wrote."""
    url = server.url() + f"&socket_timeout={SOCKET_TIMEOUT}&socket_connect_timeout=1"
    seen: list[str] = []
    async with Mailboxes(_store_at(url), members=["lead", "w"], store_outage=60) as mail:
        proc = _run_agent(url, tmp_path, *extra)
        try:
            inbox = await mail.open_inbox("lead")
            task = Envelope.request("lead", "w", "hold", type="task")
            await mail.send(task)
            with anyio.fail_after(50):
                while not (tmp_path / "holding").exists():
                    assert proc.poll() is None
                    await anyio.sleep(0.02)
                server.kill() if kill else server.pause()
                (tmp_path / "go").touch()
                await _line(proc, *waited, seen=seen)
                server.start() if kill else server.resume()
                while True:
                    answer = await inbox.receive(timeout=40)
                    await inbox.ack(answer)
                    if answer.in_reply_to == task.id:
                        break
            assert proc.poll() is None  # still serving
        finally:
            if server.paused:
                server.resume()
            proc.terminate()
            await anyio.to_thread.run_sync(proc.wait)
            assert proc.stderr is not None
            seen.append(proc.stderr.read().decode())
            proc.stderr.close()
    assert answer.type != "error", answer.body
    body = answer.body
    assert isinstance(body, dict)
    return body, seen


def _store_at(url: str) -> RedisStore:
    return RedisStore(url)


async def test_a_run_agent_teammate_waits_out_a_paused_server(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    body, seen = await _task_through_outage(
        redis_server, tmp_path, waited=("waiting out the outage", "budget ledger")
    )
    assert body["answer"] == "answered after the outage"
    printed = "".join(seen)
    assert "crashed" not in printed and "reconnecting" not in printed


async def test_a_run_agent_teammate_waits_out_a_server_killed_and_restarted_on_its_log(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    body, seen = await _task_through_outage(
        redis_server, tmp_path, waited=("waiting out the outage", "budget ledger"), kill=True
    )
    assert body["answer"] == "answered after the outage"
    printed = "".join(seen)
    assert "crashed" not in printed and "reconnecting" not in printed


async def test_run_agent_reconnects_after_an_outage_longer_than_its_tolerance(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    body, seen = await _task_through_outage(
        redis_server, tmp_path, "--store-outage", "1", waited=("stopped by a store outage",)
    )
    assert body["answer"] == "answered after the outage"  # resumed by the next incarnation
    printed = "".join(seen)
    assert "store_outage=1s" in printed and "reconnecting" in printed
    assert "crashed" not in printed
