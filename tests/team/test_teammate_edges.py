"""Edges of the teammate layer found by a hostile test pass: each test is the minimal
reproduction of a guarantee that once broke. Each docstring says how it failed before its fix;
the assertions say what holds now."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from teamrt import Envelope, FileMailboxes, MemoryMailboxes, RemoteError
from teamrt.agents import Limits, Memory, tool
from teamrt.errors import ModelError, TeammateGone
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, Usage, call
from teamrt.team import (
    SHUTDOWN,
    SHUTDOWN_ACK,
    RestartPolicy,
    ShutdownBody,
    Team,
    Teammate,
)


def newest_user(messages: Sequence[ChatMessage]) -> str:
    return next((m.content or "" for m in reversed(messages) if m.role == "user"), "")


# --- wait_for_messages: mail acked but never shown ----------------------------------------


async def test_wait_for_messages_never_cuts_mail_it_acks() -> None:
    """Every envelope `wait_for_messages` takes is acked once the step is journaled, so every one
    must reach the model whole. The tool's result is capped at 8,000 characters: a batch of
    big messages is cut, and the messages past the cut are acked without the model seeing them."""
    bodies = [f"m{i}:" + "x" * 3000 for i in range(5)]
    arrived, paused = anyio.Event(), anyio.Event()
    seen: list[str] = []

    @tool(sequential=True)
    async def pause() -> str:
        """Let the mail arrive."""
        paused.set()
        await arrived.wait()
        return "paused"

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        if messages[-1].role == "tool":
            seen.extend(m.content or "" for m in messages)
            return "read"
        reply = call("pause")
        return ModelReply(tool_calls=(*reply.tool_calls, *call("wait_for_messages").tool_calls))

    teammate = Teammate("w", FunctionModel(brain), tools=[pause], wake_on=())
    async with MemoryMailboxes(members=["lead", "w"]) as mail:
        async with Team(mail, [teammate]) as team:
            async with anyio.create_task_group() as tg:

                async def ask() -> None:
                    await team.ask("w", "wait for the notes", timeout=10)

                tg.start_soon(ask)
                await paused.wait()  # the mail comes while the model's calls run, not before
                await mail.send_many([Envelope.message("lead", "w", b) for b in bodies])
                await anyio.sleep(0.05)  # the desk reads all five
                arrived.set()
            await mail.inbox("w").flush()
        assert mail.statistics()["w"].unacked == 0  # all five are acked as handled...
    missing = [b[:3] for b in bodies if not any(b in s for s in seen)]
    assert missing == []  # ...so all five must have reached the model whole


# --- the approval gate ---------------------------------------------------------------------


async def test_delegate_does_not_bypass_the_approval_gate() -> None:
    """A tool in `needs_approval` must not run before a plan is approved; with `delegate=True`
    the sub-agent gets the teammate's raw tools and runs the gated tool without any plan."""
    ran: list[str] = []

    @tool
    def deploy() -> str:
        """Deploy to production (side effect)."""
        ran.append("deploy")
        return "deployed"

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        if messages[0].role == "system" and "sub-agent" in (messages[0].content or ""):
            return "done" if messages[-1].role == "tool" else call("deploy")
        if messages[-1].role == "tool":
            return "finished"
        return call("delegate", task="deploy it")

    async def never(member: str, plan: str) -> tuple[bool, str]:
        return False, "no"

    teammate = Teammate(
        "w", FunctionModel(brain), tools=[deploy], needs_approval=["deploy"], delegate=True
    )
    async with MemoryMailboxes() as mail, Team(mail, [teammate], approver=never) as team:
        await team.ask("w", "ship it", timeout=5)
    assert ran == []


async def test_an_approval_does_not_carry_into_a_later_round_of_mail() -> None:
    """Runner: "a new task needs its own plan". An approval given for task 1 still opens the
    gate in a round of mail after task 1 was answered, so a message can make the teammate run a
    gated tool with no plan approved for it."""
    ran: list[str] = []

    @tool
    def deploy() -> str:
        """Deploy to production (side effect)."""
        ran.append(newest_user_seen[-1])
        return "deployed"

    newest_user_seen: list[str] = []
    decisions: list[str] = []

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        last = messages[-1]
        if last.role == "tool":
            if "plan approved" in (last.content or ""):
                return call("deploy")
            return "done"
        newest_user_seen.append(last.content or "")
        if "please deploy again" in (last.content or ""):
            return call("deploy")  # a message asks for it: no plan for this one
        return call("submit_plan", plan="deploy once")

    async def approve_once(member: str, plan: str) -> tuple[bool, str]:
        decisions.append(plan)
        return True, ""

    teammate = Teammate("w", FunctionModel(brain), tools=[deploy], needs_approval=["deploy"])
    async with (
        MemoryMailboxes() as mail,
        Team(mail, [teammate], approver=approve_once) as team,
    ):
        await team.ask("w", "deploy v1", timeout=5)
        rounds = team.status["w"].rounds
        await mail.send(Envelope.message("lead", "w", "please deploy again"))
        with anyio.fail_after(5):
            while team.status["w"].rounds == rounds:  # noqa: ASYNC110 -- a peek
                await anyio.sleep(0.005)
    assert len(decisions) == 1
    assert len(ran) == 1, f"the gated tool ran {len(ran)} times on one approval: {ran}"


async def test_an_approved_plan_survives_a_restart_of_the_task() -> None:
    """A restarted incarnation resumes the interrupted task from its last completed step; the
    plan approved in that task (in its journal and its conversation) is forgotten, so the
    resumed task's gated tool is refused."""
    ran: list[str] = []
    crashed = False

    @tool
    def deploy() -> str:
        """Deploy to production (side effect)."""
        ran.append("deploy")
        return "deployed"

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        nonlocal crashed
        last = messages[-1]
        if last.role == "tool" and "plan approved" in (last.content or ""):
            if not crashed:
                crashed = True
                raise RuntimeError("the model's process hiccups once")
            return call("deploy")
        if last.role == "tool":
            return f"result: {last.content}"
        return call("submit_plan", plan="deploy once")

    async def approve(member: str, plan: str) -> tuple[bool, str]:
        return True, ""

    teammate = Teammate(
        "w",
        FunctionModel(brain),
        tools=[deploy],
        needs_approval=["deploy"],
        restart=RestartPolicy(on_failure=True, backoff=0.01, task_attempts=3),
    )
    async with MemoryMailboxes() as mail, Team(mail, [teammate], approver=approve) as team:
        result = await team.ask("w", "deploy v1", timeout=10)
    assert crashed and team.status["w"].restarts == 1
    assert ran == ["deploy"], result.answer


# --- tasks accepted once are not refused later -------------------------------------------------


async def test_a_queued_task_is_not_refused_busy_after_a_restart() -> None:
    """With max_queue=1, a task that was accepted (queued behind the running one) is answered
    Busy after a clean restart: the next incarnation counts the interrupted task, redelivered,
    against the queue bound."""
    release = anyio.Event()

    @tool
    async def slow() -> str:
        """Blocks until the test lets it go."""
        await release.wait()
        return "ok"

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        return "done" if messages[-1].role == "tool" else call("slow")

    teammate = Teammate("w", FunctionModel(brain), tools=[slow], max_queue=1)
    async with MemoryMailboxes(members=["lead", "w"]) as mail:
        first = Envelope.request("lead", "w", "first", type="task", timeout=30)
        second = Envelope.request("lead", "w", "second", type="task", timeout=30)
        async with Team(mail, [teammate], shutdown_deadline=0.2) as team:
            await mail.send(first)
            while team.status["w"].state != "working":  # noqa: ASYNC110 -- a peek
                await anyio.sleep(0.001)
            await mail.send(second)
            while team.status["w"].queued != 1:  # noqa: ASYNC110 -- a peek
                await anyio.sleep(0.001)
            # both accepted: one working, one queued; now a clean stop (the slow tool is
            # cancelled at the shutdown deadline: the task stays unacked and resumes)
        release.set()
        async with Team(mail, [teammate], lead_here=False):
            inbox = mail.inbox("lead")
            answers: dict[str, Envelope] = {}
            with anyio.fail_after(10):
                while len(answers) < 2:
                    envelope = await inbox.receive()
                    await inbox.ack(envelope)
                    if envelope.in_reply_to in (first.id, second.id):
                        answers[envelope.in_reply_to] = envelope
    errors = {k: v.body for k, v in answers.items() if v.type == "error"}
    assert errors == {}


# --- shutdown ----------------------------------------------------------------------------------


async def test_an_expired_shutdown_request_does_not_stop_a_fresh_teammate() -> None:
    """Expired requests are refused, not worked. A shutdown request whose deadline passed long
    ago (left in the log by an earlier `team.shutdown()` of a remote member, say) is still
    honoured: the next incarnation stops at once and serves nothing."""
    async with MemoryMailboxes(members=["lead", "w"]) as mail:
        stale = Envelope.request("lead", "w", ShutdownBody(), type=SHUTDOWN, timeout=0.01)
        await mail.send(stale)
        await anyio.sleep(0.05)  # its deadline passes
        async with Team(mail, [Teammate("w", FunctionModel(lambda m, t: "ok"))]) as team:
            await anyio.sleep(0.05)
            assert team.status["w"].state != "stopped", "stopped by an expired shutdown"
            result = await team.ask("w", "still there?", timeout=5)
            assert result.answer == "ok"


async def test_a_shutdown_behind_a_backlog_is_honoured_at_the_next_step() -> None:
    """A shutdown ends the teammate at the step boundary ("delivered before anything else at a
    step boundary", protocol.py). Behind more mail than the desk buffers (1,000 letters) it is
    not even read: the teammate reads the whole backlog first, one model call per batch."""
    calls_after_shutdown = 0
    shutdown_sent = False

    async def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        nonlocal calls_after_shutdown
        if shutdown_sent:
            calls_after_shutdown += 1
        await anyio.lowlevel.checkpoint()
        return "read"

    async with MemoryMailboxes(members=["lead", "w"]) as mail:
        await mail.send_many([Envelope.message("lead", "w", f"n{i}") for i in range(1500)])
        teammate = Teammate("w", FunctionModel(brain), mail_batch=5, wake_on=())
        team = Team(mail, [teammate], shutdown_deadline=30)
        async with team:
            shutdown = Envelope.request("lead", "w", ShutdownBody(), type=SHUTDOWN, timeout=30)
            shutdown_sent = True
            ack = await mail.request(shutdown, timeout=30)
            assert ack.type == SHUTDOWN_ACK
    assert calls_after_shutdown <= 2, f"{calls_after_shutdown} model calls after the shutdown"


# --- the persistent context -----------------------------------------------------------------------


async def test_new_instructions_reach_a_teammate_restarted_from_its_journal(
    tmp_path: Path,
) -> None:
    """A teammate's instructions are its configuration; restarted with new instructions (and the
    journal of the previous run), the persistent conversation keeps the old system message and
    the model never sees the new instructions."""
    systems: list[str] = []

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        systems.append(" | ".join(m.content or "" for m in messages if m.role == "system"))
        return "ok"

    async with FileMailboxes(tmp_path / "t") as mail:
        for instructions in ("You answer in French.", "You answer in German."):
            teammate = Teammate("w", FunctionModel(brain), instructions=instructions)
            async with Team(mail, [teammate], agent_dir=tmp_path / "t" / "agents") as team:
                await team.ask("w", "hello", timeout=5)
    assert "German" in systems[-1], systems[-1]


async def test_a_task_bigger_than_the_context_budget_does_not_crash_the_teammate() -> None:
    """A big task is data, not a crash: with fewer messages than `Memory.keep_recent` and a
    context over budget, compaction indexes before the start of the list (memory.py
    `_summarise_older`: `cut = len(messages) - keep_recent` goes negative) and the teammate
    crashes with IndexError (the task is answered TeammateCrashed, the teammate is gone)."""
    memory = Memory(max_context_tokens=2_000, keep_recent=4)
    async with MemoryMailboxes() as mail:
        teammate = Teammate("w", FunctionModel(lambda m, t: "ok"), memory=memory)
        async with Team(mail, [teammate]) as team:
            result = await team.ask("w", "BIG " + "lorem ipsum " * 2_000, timeout=5)
            assert result.answer == "ok"


async def test_memory_summarises_the_first_task_like_any_older_task() -> None:
    """The conversation carries across tasks, kept under budget by memory with older tasks
    summarised. The first task's message is pinned for ever (like the instructions): however
    many tasks later, it is sent verbatim and memory cannot bring the context under budget."""
    texts: list[str] = []

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        texts.append("\n".join(m.content or "" for m in messages))
        return "ok"

    memory = Memory(max_context_tokens=1_000, keep_recent=4)
    async with MemoryMailboxes() as mail:
        teammate = Teammate("w", FunctionModel(brain), memory=memory, instructions="Be brief.")
        async with Team(mail, [teammate]) as team:
            await team.ask("w", "FIRST " + "lorem ipsum " * 250, timeout=5)
            for i in range(20):
                await team.ask("w", f"task {i} " + "dolor sit " * 50, timeout=5)
    assert "FIRST lorem ipsum" not in texts[-1]  # twenty tasks later, the first is summarised


async def test_one_big_message_does_not_keep_the_context_over_budget_for_tasks_after() -> None:
    """Memory keeps a teammate's conversation under its token budget. A single message of 60 KB
    (a log dump; the mailbox accepts up to 1 MB) lands in the `keep_recent` window, which memory
    never shortens or summarises: every later call goes to the model about 8x over the budget,
    and a model with a context window fails the next seven tasks in a row."""
    window = 40_000  # the model's context window, in characters (the budget is ~8,000)

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        size = sum(len(m.content or "") for m in messages)
        if size > window:
            raise ModelError(f"context_length_exceeded: {size} characters")
        return "ok"

    teammate = Teammate("w", FunctionModel(brain), memory=Memory(max_context_tokens=2_000))
    async with MemoryMailboxes(members=["lead", "w"]) as mail, Team(mail, [teammate]) as team:
        for _ in range(6):
            await team.ask("w", "warm up", timeout=5)
        await mail.send(Envelope.message("lead", "w", "log dump: " + "x" * 60_000))
        with anyio.fail_after(5):
            while team.status["w"].rounds == 0:  # noqa: ASYNC110 -- a peek
                await anyio.sleep(0.005)
        result = await team.ask("w", "the next task", timeout=5)
    assert result.stop_reason == "answer", result.detail


# --- limits --------------------------------------------------------------------------------------


async def test_max_idle_bounds_a_single_long_wait() -> None:
    """`Limits.max_idle` bounds the time a task spends waiting; it is checked only before the
    next model call, so one `wait_for_messages(timeout=600)` waits the whole 600 s whatever
    max_idle says."""

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        return "gave up" if messages[-1].role == "tool" else call("wait_for_messages", timeout=600)

    teammate = Teammate("w", FunctionModel(brain), limits=Limits(max_idle=0.05))
    async with MemoryMailboxes() as mail, Team(mail, [teammate], shutdown_deadline=0.5) as team:
        with anyio.move_on_after(3) as scope:  # 60x max_idle: the limit did not bound it
            result = await team.ask("w", "wait for the peer", timeout=60)
        assert not scope.cancelled_caught, "a 0.05 s max_idle did not end a 600 s wait"
        assert result.stop_reason == "limit"


async def test_delegated_spend_counts_against_the_teammates_own_limits() -> None:
    """delegate.py: "the sub-agent's spend is charged to `budget` ... so delegation cannot escape
    the caller's limits". Without a team budget, a teammate's own `Limits(max_tokens=...)` is
    escaped: each sub-agent gets a fresh allowance and the task's tokens leave it out."""

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
        if messages[0].role == "system" and "sub-agent" in (messages[0].content or ""):
            task = newest_user(messages)
            return ModelReply(text=f"dug: {task}", usage=Usage(requests=1, input_tokens=900))
        done = sum(1 for m in messages if m.role == "tool")
        if done >= 5:
            return ModelReply(text="all delegated", usage=Usage(requests=1, input_tokens=10))
        reply = call("delegate", task=f"dig {done}")
        return reply.model_copy(update={"usage": Usage(requests=1, input_tokens=10)})

    teammate = Teammate("w", FunctionModel(brain), delegate=True, limits=Limits(max_tokens=1_000))
    async with MemoryMailboxes() as mail, Team(mail, [teammate]) as team:
        result = await team.ask("w", "dig five times", timeout=5)
    stopped_by_max_tokens = result.stop_reason == "limit" and "max_tokens" in result.detail
    assert result.tokens >= 5 * 900 or stopped_by_max_tokens, result


# --- the journal ---------------------------------------------------------------------------------


async def test_a_torn_journal_line_does_not_swallow_the_next_incarnations_record(
    tmp_path: Path,
) -> None:
    """journal.py: "a last line cut short by a crash is ignored: that event simply happens
    again". The next incarnation appends to the journal without ending the torn line, so
    its own first record is glued to the fragment and lost on the next load: here the re-run
    call's result, leaving a tool call without a result in the conversation that is carried to
    every later task."""
    from teamrt.agents.journal import Journal

    gate = anyio.Event()

    @tool
    async def fetch() -> str:
        """Fetch something (blocks until the test lets it go)."""
        await gate.wait()
        return "fetched"

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        return "done" if messages[-1].role == "tool" else call("fetch")

    agents = tmp_path / "t" / "agents"
    journal = agents / "w.state.jsonl"
    async with FileMailboxes(tmp_path / "t", members=["lead", "w"]) as mail:
        teammate = Teammate("w", FunctionModel(brain), tools=[fetch])
        task = Envelope.request("lead", "w", "fetch it", type="task", timeout=60)
        async with Team(mail, [teammate], agent_dir=agents, shutdown_deadline=0.1) as team:
            await mail.send(task)
            while team.status["w"].state != "working":  # noqa: ASYNC110 -- a peek
                await anyio.sleep(0.001)
            await anyio.sleep(0.05)  # fetch is in flight: the journal has the call, no result
        with journal.open("ab") as f:  # the process died in the middle of writing a line
            f.write(b'{"t":"result","id":"call_x","mess')
        gate.set()
        async with Team(mail, [teammate], agent_dir=agents, lead_here=False) as team:
            inbox = mail.inbox("lead")
            with anyio.fail_after(10):
                while (envelope := await inbox.receive()).in_reply_to != task.id:
                    await inbox.ack(envelope)
            assert envelope.body["answer"] == "done"
    state = Journal(journal).load()
    assert state is not None
    answered = {m.tool_call_id for m in state.messages if m.role == "tool"}
    asked = {c.id for m in state.messages for c in m.tool_calls}
    assert asked <= answered, "a tool call without its result in the journaled conversation"


async def test_an_interrupted_round_resumes_even_when_a_task_is_waiting(tmp_path: Path) -> None:
    """A restarted incarnation resumes what was interrupted from its last completed step. An
    interrupted round of mail is resumed only if no task is queued at the restart: otherwise
    the task runs first, its new run closes the round's open step with "Interrupted" errors, and
    the round's in-flight tool call (the reaction to mail already acked) never runs again."""
    gate = anyio.Event()
    runs: list[str | None] = []

    @tool
    async def relay() -> str:
        """Pass the news on (blocks until the test lets it go)."""
        from teamrt.agents import current_call_id

        runs.append(current_call_id())
        await gate.wait()
        return "relayed"

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        last = messages[-1]
        if last.role == "user" and "[message" in (last.content or ""):
            return call("relay")
        return "ok"

    agents = tmp_path / "t" / "agents"
    async with FileMailboxes(tmp_path / "t", members=["lead", "w"]) as mail:
        teammate = Teammate("w", FunctionModel(brain), tools=[relay])
        async with Team(mail, [teammate], agent_dir=agents, shutdown_deadline=0.1) as team:
            await mail.send(Envelope.message("lead", "w", "news to relay"))
            with anyio.fail_after(5):
                while not runs:  # noqa: ASYNC110 -- a peek
                    await anyio.sleep(0.001)
        # the round was cut in the middle of relay(); a task is waiting when w comes back
        gate.set()
        await mail.send(Envelope.request("lead", "w", "an unrelated task", type="task"))
        async with Team(mail, [teammate], agent_dir=agents) as team:
            with anyio.fail_after(5):
                while team.status["w"].tasks_done == 0:  # noqa: ASYNC110 -- a peek
                    await anyio.sleep(0.005)
            await anyio.sleep(0.1)  # time to resume the round, if it would
    assert len(runs) == 2 and runs[0] == runs[1], f"relay ran {runs}"


# --- crashes -------------------------------------------------------------------------------------


async def test_one_poisonous_message_does_not_take_a_teammate_down_for_good() -> None:
    """A task that crashes `task_attempts` incarnations is answered TeammateCrashed "so one
    poisonous task cannot keep a teammate from the rest of its queue" (RestartPolicy). A
    message that crashes the model has no such bound: it is released and shown again to every
    incarnation until `max_restarts` is spent, and the teammate is gone for good (in a file
    team it stays unacked and does the same to the next process)."""

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        if "POISON" in (messages[-1].content or ""):
            raise RuntimeError("the model's client chokes on this message")
        return "ok"

    policy = RestartPolicy(on_failure=True, backoff=0.01, max_restarts=3, task_attempts=2)
    poisoned = Teammate("w", FunctionModel(brain), restart=policy)
    async with MemoryMailboxes(members=["lead", "w"]) as mail, Team(mail, [poisoned]) as team:
        await mail.send(Envelope.message("lead", "w", "POISON"))
        with anyio.fail_after(5):
            while team.status["w"].restarts < 2:  # noqa: ASYNC110 -- a peek
                await anyio.sleep(0.005)
        await anyio.sleep(0.2)
        result = await team.ask("w", "a normal task", timeout=5)
        assert result.answer == "ok"


async def test_a_task_stopped_during_a_model_call_after_compaction_resumes(
    tmp_path: Path,
) -> None:
    """Memory compaction journals the new conversation (`replace`) before the model call, but
    the new `task_index` only with the reply (`call`). A stop (shutdown deadline, crash, kill -9)
    during that model call, the most likely moment of all, leaves a journal whose task_index
    points past the compacted conversation: the resumed task crashes with IndexError in
    `Agent._compact` (loop.py) and is answered TeammateCrashed, at every restart."""
    block = anyio.Event()
    blocking = False

    async def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        if blocking:
            await block.wait()
        return "answer " + "z" * 400

    agents = tmp_path / "t" / "agents"
    memory = Memory(max_context_tokens=1_500, keep_recent=4)
    teammate = Teammate("w", FunctionModel(brain), memory=memory, instructions="Be brief.")
    async with FileMailboxes(tmp_path / "t", members=["lead", "w"]) as mail:
        async with Team(mail, [teammate], agent_dir=agents, shutdown_deadline=0.1) as team:
            for i in range(8):  # a conversation long enough to need compaction
                await team.ask("w", f"task {i} " + "q" * 300, timeout=5)
            blocking = True
            task = Envelope.request("lead", "w", "the current task " + "q" * 300, type="task")
            await mail.send(task)
            while team.status["w"].state != "working":  # noqa: ASYNC110 -- a peek
                await anyio.sleep(0.001)
            await anyio.sleep(0.05)  # compacted, and waiting for the model: stopped here
        blocking = False
        async with Team(mail, [teammate], agent_dir=agents, lead_here=False):
            inbox = mail.inbox("lead")
            with anyio.fail_after(5):
                while (envelope := await inbox.receive()).in_reply_to != task.id:
                    await inbox.ack(envelope)
    assert envelope.type != "error", envelope.body
    assert envelope.body["answer"].startswith("answer")


class _ClientModel:
    """A model with a client to close (like OpenAIModel): refuses to work once closed."""

    name = "client-model"

    def __init__(self) -> None:
        self.closed = False

    async def complete(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> ModelReply:
        if self.closed:
            raise RuntimeError("Cannot send a request, as the client has been closed.")
        if "CRASH" in newest_user(messages):
            raise RuntimeError("the model chokes on this task")
        return ModelReply(text="ok")

    async def aclose(self) -> None:
        self.closed = True


async def test_a_pool_replica_that_crashes_does_not_close_the_others_model() -> None:
    """`Teammate.model` may be a model or a factory; a model with `aclose()` is closed when its
    incarnation ends. Given one model (the natural `Teammate(model=OpenAIModel(...),
    replicas=3)`), the replicas share it: the first replica to crash closes the client under the
    others, and every later task of the pool fails."""
    model = _ClientModel()
    pool = Teammate("pool", model, replicas=2)
    async with MemoryMailboxes() as mail, Team(mail, [pool]) as team:
        with pytest.raises(RemoteError):
            await team.ask("pool", "CRASH", timeout=5)  # one replica is gone
        result = await team.ask("pool", "a normal task", timeout=5)  # the other serves
        assert result.answer == "ok"


async def test_a_resumed_request_tool_does_not_make_the_callee_work_twice(
    tmp_path: Path,
) -> None:
    """A tool call in flight at a stop runs again on resume with the same call id, the
    idempotency key tools are told to use. The built-in `request` tool ignores it: the resumed
    call sends a new request with a new id, so the callee (which recognises redeliveries by id)
    does the whole task a second time. The window is the callee's whole task."""
    gate = anyio.Event()
    worked: list[str] = []

    @tool
    async def expensive() -> str:
        """The callee's side effect (blocks until the test lets it go)."""
        worked.append("once")
        await gate.wait()
        return "computed"

    def asker(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        asked = any(m.role == "tool" for m in messages)
        return "got it" if asked else call("request", to="b", text="do it")

    def worker(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        return "done" if messages[-1].role == "tool" else call("expensive")

    agents = tmp_path / "t" / "agents"
    members = [
        Teammate("a", FunctionModel(asker)),
        Teammate("b", FunctionModel(worker), tools=[expensive]),
    ]
    async with FileMailboxes(tmp_path / "t", members=["lead", "a", "b"]) as mail:
        task = Envelope.request("lead", "a", "ask b", type="task")
        async with Team(mail, members, agent_dir=agents, shutdown_deadline=0.1):
            await mail.send(task)
            with anyio.fail_after(5):
                while not worked:  # noqa: ASYNC110 -- a peek
                    await anyio.sleep(0.001)
        # stopped with a waiting in request() and b in the middle of the job
        gate.set()
        async with Team(mail, members, agent_dir=agents, lead_here=False) as team:
            inbox = mail.inbox("lead")
            with anyio.fail_after(10):
                while (envelope := await inbox.receive()).in_reply_to != task.id:
                    await inbox.ack(envelope)
            await anyio.sleep(0.1)
            b_tasks = team.status["b"].tasks_done
    assert envelope.body["answer"] == "got it"
    assert b_tasks == 1, f"b worked {b_tasks} tasks for one request"


# --- idempotency keys ------------------------------------------------------------------------


def _report_call_id() -> str:
    """A `process=True` tool: says which call it serves (its idempotency key)."""
    from teamrt.agents import current_call_id

    return f"key={current_call_id()}"


async def test_a_process_tool_gets_its_call_id_as_idempotency_key() -> None:
    """`current_call_id()` is a tool's idempotency key; `process=True` tools are the ones killed
    at a deadline or a stop, so the most likely to run again, and in the worker process the key
    is None."""
    from teamrt.agents import Agent

    process_tool = tool(process=True)(_report_call_id)

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        return (
            (messages[-1].content or "") if messages[-1].role == "tool" else call("_report_call_id")
        )

    report = await Agent("a", FunctionModel(brain), tools=[process_tool]).run("go")
    assert report.answer is not None and report.answer.startswith("key=call_"), report.answer


async def test_a_delegated_tool_rerun_after_a_stop_keeps_its_idempotency_key(
    tmp_path: Path,
) -> None:
    """A call in flight at a stop runs again on resume "and only that one", with the same
    `current_call_id()`. When that call is `delegate`, its sub-agent starts over with fresh
    call ids: the sub-agent's tool runs again under a new key and cannot tell it is a repeat."""
    from teamrt.agents import current_call_id

    gate = anyio.Event()
    keys: list[str | None] = []

    @tool
    async def charge_card() -> str:
        """A side effect that must happen once (blocks until the test lets it go)."""
        keys.append(current_call_id())
        await gate.wait()
        return "charged"

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        if messages[0].role == "system" and "sub-agent" in (messages[0].content or ""):
            return "charged once" if messages[-1].role == "tool" else call("charge_card")
        return "done" if messages[-1].role == "tool" else call("delegate", task="charge it")

    agents = tmp_path / "t" / "agents"
    teammate = Teammate("w", FunctionModel(brain), tools=[charge_card], delegate=True)
    async with FileMailboxes(tmp_path / "t", members=["lead", "w"]) as mail:
        task = Envelope.request("lead", "w", "charge the customer", type="task")
        async with Team(mail, [teammate], agent_dir=agents, shutdown_deadline=0.1, lead_here=False):
            await mail.send(task)
            with anyio.fail_after(5):
                while not keys:  # noqa: ASYNC110 -- a peek
                    await anyio.sleep(0.001)
        gate.set()
        async with Team(mail, [teammate], agent_dir=agents, lead_here=False):
            inbox = mail.inbox("lead")
            with anyio.fail_after(5):
                while (envelope := await inbox.receive()).in_reply_to != task.id:
                    await inbox.ack(envelope)
    assert len(keys) == 2
    assert keys[0] == keys[1], f"the repeated side effect had keys {keys}"


# --- supervision -------------------------------------------------------------------------------


async def test_cancelling_a_teammate_hung_in_a_round_of_mail_does_not_resume_the_hang() -> None:
    """`Team.cancel` stops a hung teammate "handled like a crash: the task it was on is ...
    not resumed". When the hang is in a round of mail (a message woke it), the next incarnation
    resumes the round, re-runs the hung call and hangs again: no task is ever served."""
    runs: list[int] = []

    @tool
    async def hang() -> str:
        """Never returns."""
        runs.append(1)
        await anyio.sleep_forever()
        return "unreachable"

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        last = messages[-1]
        return call("hang") if last.role == "user" and "[message" in (last.content or "") else "ok"

    policy = RestartPolicy(on_failure=True, backoff=0.01)
    teammate = Teammate("w", FunctionModel(brain), tools=[hang], restart=policy)
    async with (
        MemoryMailboxes(members=["lead", "w"]) as mail,
        Team(mail, [teammate], shutdown_deadline=0.2) as team,
    ):
        await mail.send(Envelope.message("lead", "w", "do the thing"))
        with anyio.fail_after(5):
            while not runs:  # noqa: ASYNC110 -- a peek
                await anyio.sleep(0.001)
        await team.cancel("w", "hung in a tool")
        with anyio.move_on_after(1):  # the next incarnation starts (and hangs again)
            while len(runs) < 2:  # noqa: ASYNC110 -- a peek
                await anyio.sleep(0.005)
        result = None
        with anyio.move_on_after(2):
            result = await team.ask("w", "are you there?", timeout=2)
    assert len(runs) == 1, f"the hung call ran {len(runs)} times"
    assert result is not None and result.answer == "ok"


async def test_asking_a_stopped_teammate_does_not_wait_for_ever() -> None:
    """`ask` raises `TeammateGone` for a member that crashed for good; a member stopped by
    `team.shutdown()` (a service draining, say) is not checked, and `ask` without a timeout
    waits for ever for an answer nobody will give."""
    teammate = Teammate("w", FunctionModel(lambda m, t: "ok"))
    async with MemoryMailboxes() as mail, Team(mail, [teammate]) as team:
        await team.shutdown()
        assert team.status["w"].state == "stopped"
        with anyio.move_on_after(2) as scope, pytest.raises(TeammateGone):
            await team.ask("w", "hello?")
        assert not scope.cancelled_caught, "ask() on a stopped member hangs"


async def test_a_late_plan_decision_never_reaches_the_model(tmp_path: Path) -> None:
    """Plan decisions are protocol envelopes, "the runner's": tools and the model only ever see
    conversation mail. A decision that comes after its `submit_plan` stopped waiting (the
    teammate was restarted meanwhile and asked again, or 300 s passed) is sorted as
    conversation mail and shown to the model as a message."""
    seen: list[str] = []

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        seen.extend(m.content or "" for m in messages if m.role == "user")
        if any(m.role == "user" and m.content == "second task" for m in messages):
            return "second done"
        if any(m.role == "tool" for m in messages):
            return "planned"
        return call("submit_plan", plan="do it carefully")

    agents = tmp_path / "t" / "agents"
    teammate = Teammate("w", FunctionModel(brain), needs_approval=["nothing"])
    async with FileMailboxes(tmp_path / "t", members=["lead", "w"]) as mail:
        lead = mail.inbox("lead")  # the test is the lead: it decides plans itself

        async def next_plan() -> Envelope:
            with anyio.fail_after(5):
                while (envelope := await lead.receive()).type != "plan_approval":
                    await lead.ack(envelope)
            await lead.ack(envelope)
            return envelope

        task = Envelope.request("lead", "w", "first: make a plan", type="task")
        async with Team(mail, [teammate], agent_dir=agents, shutdown_deadline=0.1, lead_here=False):
            await mail.send(task)
            first_plan = await next_plan()  # not decided before w is stopped
        async with Team(mail, [teammate], agent_dir=agents, lead_here=False):
            second_plan = await next_plan()  # the resumed submit_plan asks again
            for plan in (first_plan, second_plan):
                await mail.send(
                    Envelope.response(
                        plan, {"approved": True, "feedback": ""}, type="plan_decision"
                    )
                )
            await anyio.sleep(0.1)
            second = Envelope.request("lead", "w", "second task", type="task")
            await mail.send(second)
            with anyio.fail_after(5):
                while (envelope := await lead.receive()).in_reply_to != second.id:
                    await lead.ack(envelope)
    assert not [s for s in seen if "plan_decision" in s]
