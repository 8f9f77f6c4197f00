"""Teammates: context that carries across tasks, wake-ups on any mail, the desk that keeps
protocol envelopes from tools, acks only once safe (across restarts and kill -9), waiting that is
not stalling, expired and busy refusals, pools, a flat lead, big backlogs, and delegation."""

from __future__ import annotations

import itertools
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from teamrt import Envelope, FileMailboxes, MemoryMailboxes, RemoteError
from teamrt.agents import Limits, Memory, tool
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, Usage, call
from teamrt.team import (
    BUSY,
    EXPIRED,
    NOTICES_KEPT,
    SHUTDOWN,
    SHUTDOWN_ACK,
    ShutdownBody,
    Team,
    TeamBudget,
    Teammate,
)
from tests.support.paths import SUPPORT

PROCS = str(SUPPORT / "teammate_procs.py")
SHOWN = re.compile(r"^\[(?:message|broadcast) (\S+) from", re.MULTILINE)


def newest_task(messages: Sequence[ChatMessage]) -> str:
    return next((m.content or "" for m in reversed(messages) if m.role == "user"), "")


# --- context --------------------------------------------------------------------------------------


def _memory_brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
    task = newest_task(messages)
    if task.startswith("remember"):
        return "noted"
    said = [text for m in messages if m.role == "user" and "code is" in (text := m.content or "")]
    return said[-1].rsplit(" ", 1)[-1] if said else "I do not know"


async def test_a_teammate_remembers_task_1_in_task_2() -> None:
    async with MemoryMailboxes() as mail:
        async with Team(mail, [Teammate("w", FunctionModel(_memory_brain))]) as team:
            await team.ask("w", "remember: the code is 4711", timeout=5)
            assert (await team.ask("w", "what was the code?", timeout=5)).answer == "4711"
        per_task = Teammate("p", FunctionModel(_memory_brain), context="per_task")
        async with Team(mail, [per_task]) as team:
            await team.ask("p", "remember: the code is 4711", timeout=5)
            assert (await team.ask("p", "what was the code?", timeout=5)).answer == (
                "I do not know"
            )


async def test_the_context_survives_a_restart_through_the_journal(tmp_path: Path) -> None:
    async with FileMailboxes(tmp_path / "t") as mail:
        for task, expected in (("remember: the code is 99", "noted"), ("the code?", "99")):
            teammate = Teammate("w", FunctionModel(_memory_brain))
            async with Team(mail, [teammate], agent_dir=tmp_path / "t" / "agents") as team:
                assert (await team.ask("w", task, timeout=5)).answer == expected


async def test_summaries_are_charged_to_the_team_budget() -> None:
    summariser_calls = []

    def summarise(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
        summariser_calls.append(len(messages))
        return ModelReply(text="earlier tasks", usage=Usage(requests=1, input_tokens=500))

    def chatty(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        return "x" * 400

    memory = Memory(max_context_tokens=300, keep_recent=2, summariser=FunctionModel(summarise))
    budget = TeamBudget(max_tokens=10_000)
    async with MemoryMailboxes() as mail:
        teammate = Teammate("w", FunctionModel(chatty), memory=memory)
        async with Team(mail, [teammate], budget=budget) as team:
            for i in range(4):
                await team.ask("w", f"task {i}", timeout=5)
    assert summariser_calls
    assert budget.usage.input_tokens >= 500 * len(summariser_calls)


# --- wake-ups -------------------------------------------------------------------------------------


async def test_a_message_and_a_broadcast_each_wake_an_idle_teammate() -> None:
    seen: list[str] = []
    woke = anyio.Event()

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        seen.append(messages[-1].content or "")
        woke.set()
        return "read it"

    async with (
        MemoryMailboxes(members=["peer"]) as mail,
        Team(mail, [Teammate("w", FunctionModel(brain))]) as team,
    ):
        for envelope in (
            Envelope.message("lead", "w", "a note"),
            Envelope.broadcast("peer", "news for all"),
        ):
            woke = anyio.Event()
            await mail.send(envelope)
            with anyio.fail_after(5):
                await woke.wait()
        assert team.status["w"].rounds >= 1
    assert any("[message" in s and "a note" in s for s in seen)
    assert any("[broadcast" in s and "news for all" in s for s in seen)


async def test_mail_that_does_not_wake_waits_for_the_next_task_and_survives_a_restart() -> None:
    seen: list[str] = []

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        seen.extend(m.content or "" for m in messages if m.role == "user")
        return "ok"

    quiet = Teammate("w", FunctionModel(brain), wake_on=())
    async with MemoryMailboxes() as mail:
        async with Team(mail, [quiet]) as team:
            await mail.send(Envelope.message("lead", "w", "for later"))
            await anyio.sleep(0.05)
            assert team.status["w"].rounds == 0 and not seen
        # a clean shutdown with the note unread: the next team in this process gets it
        async with Team(mail, [quiet]) as team:
            await team.ask("w", "go", timeout=5)
    assert any("for later" in s for s in seen)


# --- the desk keeps protocol envelopes from tools -------------------------------------------------


async def test_a_task_sent_during_wait_for_messages_is_queued_and_answered() -> None:
    waited: list[str] = []
    waiting = anyio.Event()

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        task = newest_task(messages)
        if task == "second":
            return "second done"
        if messages[-1].role == "tool":
            waited.append(messages[-1].content or "")
            return "first done"
        waiting.set()  # from here on, mail reaches the wait, not the next step boundary
        return call("wait_for_messages", timeout=10)

    results: dict[str, str | None] = {}
    async with (
        MemoryMailboxes() as mail,
        Team(mail, [Teammate("w", FunctionModel(brain))]) as team,
    ):

        async def ask(text: str) -> None:
            results[text] = (await team.ask("w", text, timeout=10)).answer

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ask, "first")
                while team.status["w"].state != "working":  # noqa: ASYNC110 -- a peek
                    await anyio.sleep(0.001)
                await waiting.wait()
                tg.start_soon(ask, "second")
                while team.status["w"].queued == 0:  # noqa: ASYNC110 -- a peek
                    await anyio.sleep(0.001)
                await mail.send(Envelope.message("lead", "w", "the awaited message"))
    assert results == {"first": "first done", "second": "second done"}
    assert "the awaited message" in waited[0]
    assert "second" not in waited[0] and "task" not in waited[0]


async def test_a_shutdown_sent_during_wait_for_messages_ends_the_teammate_acknowledged() -> None:
    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
        return call("wait_for_messages", timeout=60)

    async with MemoryMailboxes() as mail:
        team = Team(mail, [Teammate("w", FunctionModel(brain))], shutdown_deadline=30)
        with anyio.fail_after(5):  # far sooner than the wait or the shutdown deadline
            async with team:
                await mail.send(Envelope.request("lead", "w", "wait for something", type="task"))
                while team.status["w"].state != "working":  # noqa: ASYNC110 -- a peek
                    await anyio.sleep(0.001)
                await anyio.sleep(0.02)  # inside wait_for_messages
                shutdown = Envelope.request("lead", "w", ShutdownBody(), type=SHUTDOWN)
                ack = await mail.request(shutdown, timeout=5)
                assert ack.type == SHUTDOWN_ACK
                await team.wait()
        final = team.status["w"]
        assert (final.state, final.last) != ("stopped", "cancelled at the shutdown deadline")
        assert final.state == "stopped"


# --- waiting is not stalling ----------------------------------------------------------------------


async def test_a_long_wait_is_not_no_progress_and_idle_time_has_its_own_limit() -> None:
    def patient(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        waits = sum(1 for m in messages if m.role == "tool")
        return call("wait_for_messages", timeout=0.01) if waits < 8 else "the peer never wrote"

    async with MemoryMailboxes() as mail:
        members = [
            Teammate("w", FunctionModel(patient)),
            Teammate("impatient", FunctionModel(patient), limits=Limits(max_idle=0.03)),
        ]
        async with Team(mail, members) as team:
            result = await team.ask("w", "wait for the peer", timeout=5)
            assert (result.answer, result.stop_reason) == ("the peer never wrote", "answer")
            stopped = await team.ask("impatient", "wait for the peer", timeout=5)
    assert stopped.stop_reason == "limit"
    assert "max_idle=0.03" in stopped.detail


# --- serving many requests ------------------------------------------------------------------------


async def test_an_expired_request_is_refused_not_worked() -> None:
    worked: list[str] = []

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        worked.append(newest_task(messages))
        return "done"

    async with (
        MemoryMailboxes() as mail,
        Team(mail, [Teammate("w", FunctionModel(brain))]) as team,
    ):
        stale = Envelope.request("lead", "w", "too late", type="task", timeout=0.001)
        await anyio.sleep(0.01)
        with pytest.raises(RemoteError, match="deadline passed") as info:
            await mail.request(stale, timeout=5)
        assert info.value.error_type == EXPIRED
        await team.ask("w", "in time", timeout=5)
    assert worked == ["in time"]


async def test_a_full_queue_answers_busy_at_once() -> None:
    release = anyio.Event()

    @tool
    async def slow() -> str:
        """Blocks until the test lets it go."""
        await release.wait()
        return "ok"

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        return "done" if messages[-1].role == "tool" else call("slow")

    async with MemoryMailboxes() as mail:
        teammate = Teammate("w", FunctionModel(brain), tools=[slow], max_queue=1)
        async with Team(mail, [teammate]) as team, anyio.create_task_group() as tg:
            outcomes: list[str] = []

            async def ask(i: int) -> None:
                try:
                    outcomes.append((await team.ask("w", f"t{i}", timeout=10)).answer or "")
                except RemoteError as exc:
                    outcomes.append(f"{exc.error_type}: {exc}")
                    release.set()

            for i in range(3):
                tg.start_soon(ask, i)
                await anyio.sleep(0.02)  # in order: working, queued, refused
    assert sorted(outcomes)[1:] == ["done", "done"]
    assert sorted(outcomes)[0].startswith(BUSY)
    assert "1 tasks are queued (max_queue=1)" in sorted(outcomes)[0]


async def test_a_pool_serves_concurrent_requests_on_every_replica() -> None:
    async def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        await anyio.sleep(0.02)
        return "answered"

    async with MemoryMailboxes() as mail:
        pool = Teammate("answerer", lambda: FunctionModel(brain), replicas=3)
        async with Team(mail, [pool]) as team:
            assert team.pools == {"answerer": ("answerer-1", "answerer-2", "answerer-3")}
            async with anyio.create_task_group() as tg:
                for _ in range(9):
                    tg.start_soon(lambda: team.ask("answerer", "q", timeout=10))
            assert [team.status[m].tasks_done for m in team.pools["answerer"]] == [3, 3, 3]


async def test_the_lead_stays_flat_over_many_asks(tmp_path: Path, stress: bool) -> None:
    """Idle notices are acked as they come: no unacked backlog, a bounded notice list, and a
    cursor file that does not grow with the number of asks."""
    asks = 10_000 if stress else 2_000
    cursor = tmp_path / "t" / "inboxes" / "lead.cursor.json"
    sizes = {}
    async with (
        FileMailboxes(tmp_path / "t") as mail,
        Team(mail, [Teammate("w", FunctionModel(lambda m, t: "ok"))]) as team,
    ):
        for i in range(1, asks + 1):
            await team.ask("w", "q", timeout=10)
            if i in (asks // 10, asks):
                await mail.inbox("lead").flush()
                await anyio.sleep(0.02)  # the lead's server takes the last idle notice
                await mail.inbox("lead").flush()
                sizes[i] = cursor.stat().st_size
                stats = mail.statistics()["lead"]
                assert (stats.unacked, stats.ready) == (0, 0)
        assert len(team.notices) == NOTICES_KEPT
    assert sizes[asks] <= sizes[asks // 10] * 1.1


# --- big backlogs ---------------------------------------------------------------------------------


async def test_a_20000_envelope_backlog_reaches_the_model_in_batches_with_the_loop_responsive(
    stress: bool,
) -> None:
    total = 20_000
    shown: list[str] = []
    notes: list[bool] = []
    ticks = 0
    ticks_at_call: list[int] = []

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        text = messages[-1].content or ""
        shown.extend(SHOWN.findall(text))
        notes.append("more messages are waiting" in text)
        ticks_at_call.append(ticks)
        return "read"

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.lowlevel.checkpoint()

    async with MemoryMailboxes(members=["lead", "w"]) as mail:
        sent = [Envelope.message("lead", "w", f"n{i}") for i in range(total)]
        await mail.send_many(sent)
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            teammate = Teammate("w", FunctionModel(brain), mail_batch=500)
            async with Team(mail, [teammate]):
                with anyio.fail_after(60):
                    while len(shown) < total:  # noqa: ASYNC110 -- a peek
                        await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    assert shown == [e.id for e in sent]  # every one, once, in order
    assert len(ticks_at_call) == total // 500  # bounded batches, never more
    assert notes[0] and not notes[-1]  # told that more was waiting until the last batch
    # the event loop ran other tasks between the model's calls: the drain never hogged it
    assert all(b > a for a, b in itertools.pairwise(ticks_at_call))


# --- delegation -----------------------------------------------------------------------------------


async def test_delegate_runs_a_throwaway_sub_agent_and_returns_only_its_conclusion() -> None:
    contexts: list[list[str]] = []

    @tool
    def dig(where: str) -> str:
        """Look somewhere."""
        return f"{where}: nothing but a long, long log of details " * 20

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        contexts.append([m.content or "" for m in messages])
        if messages[0].role == "system" and "sub-agent" in (messages[0].content or ""):
            return "the cellar is empty" if messages[-1].role == "tool" else call("dig", where="x")
        if messages[-1].role == "tool":
            return f"summary: {messages[-1].content}"
        return call("delegate", task="search the cellar")

    async with MemoryMailboxes() as mail:
        teammate = Teammate("w", FunctionModel(brain), tools=[dig], delegate=True)
        async with Team(mail, [teammate]) as team:
            result = await team.ask("w", "is there anything in the cellar?", timeout=5)
    assert result.answer is not None and "the cellar is empty" in result.answer
    assert "long log of details" not in result.answer  # the sub-agent's working stayed there


# --- across processes: kill -9 and clean restarts -------------------------------------------------


def _spawn(mode: str, team: Path, out: Path) -> subprocess.Popen[bytes]:
    ready = Path(f"{out}.ready")
    ready.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, PROCS, mode, str(team), str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        assert time.monotonic() < deadline, "the teammate process did not start"
        time.sleep(0.005)
    return proc


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    if proc.stderr is not None:
        proc.stderr.close()


async def _stop(mail: FileMailboxes, proc: subprocess.Popen[bytes]) -> None:
    await mail.send(Envelope.request("lead", "w", ShutdownBody(), type=SHUTDOWN, timeout=10))
    await anyio.to_thread.run_sync(lambda: proc.wait(timeout=20))
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    if proc.stderr is not None:
        proc.stderr.close()
    assert proc.returncode == 0, stderr


async def test_mail_to_a_teammate_survives_kill_9_and_clean_restarts(
    tmp_path: Path, stress: bool
) -> None:
    rounds = 40 if stress else 8
    team, out = tmp_path / "t", tmp_path / "shown"
    rng = random.Random(7)
    sent: list[str] = []
    async with FileMailboxes(team, members=["lead", "w"]) as mail:
        for _ in range(rounds):
            proc = _spawn("listen", team, out)
            for _ in range(rng.randint(5, 30)):
                envelope = Envelope.message("lead", "w", "note")
                await mail.send(envelope)
                sent.append(envelope.id)
                if rng.random() < 0.3:
                    await anyio.sleep(rng.random() * 0.01)
            await anyio.sleep(rng.random() * 0.05)
            if rng.random() < 0.6:
                _kill(proc)
            else:
                await _stop(mail, proc)
        proc = _spawn("listen", team, out)  # the last one reads whatever is left
        with anyio.fail_after(30):
            while not set(sent) <= set(out.read_text().split() if out.exists() else ()):  # noqa: ASYNC110 -- another process writes it
                await anyio.sleep(0.02)
        await _stop(mail, proc)
    shown = out.read_text().split()
    assert set(sent) <= set(shown)  # nothing lost; a kill may show one batch twice


async def test_an_interrupted_task_resumes_at_its_last_completed_step_after_kill_9(
    tmp_path: Path,
) -> None:
    team, out = tmp_path / "t", tmp_path / "effects"
    kills = 0
    async with FileMailboxes(team, members=["lead", "w"]) as mail:
        task = Envelope.request("lead", "w", "do the six steps", type="task", timeout=60)
        proc = _spawn("steps", team, out)
        await mail.send(task)
        for target in (2, 4):  # kill in the middle of the job, twice
            with anyio.fail_after(20):
                while out.read_text().count("end") < target if out.exists() else True:  # noqa: ASYNC110 -- another process writes it
                    await anyio.sleep(0.002)
            _kill(proc)
            kills += 1
            proc = _spawn("steps", team, out)
        inbox = mail.inbox("lead")
        with anyio.fail_after(20):
            while True:
                envelope = await inbox.receive()
                await inbox.ack(envelope)
                if envelope.in_reply_to == task.id:
                    break
        await _stop(mail, proc)
    assert envelope.body["answer"] == "all steps done"
    records = [line.split() for line in out.read_text().splitlines()]
    ends = [(int(n), id_) for kind, n, id_ in records if kind == "end"]
    starts = [(int(n), id_) for kind, n, id_ in records if kind == "start"]
    assert sorted({n for n, _ in ends}) == [1, 2, 3, 4, 5, 6]
    # one call id per step: a call that ran again after a kill kept its id (idempotency key)
    assert all(len({id_ for n, id_ in starts if n == step}) == 1 for step in range(1, 7))
    # never from step 0: at most the call in flight at each kill ran again
    assert len(starts) <= 6 + kills
