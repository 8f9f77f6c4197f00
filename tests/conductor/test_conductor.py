"""The conductor: plan validation, the lifecycle, dispatch, verification that trusts no one,
round cap and escalation, timeouts, replanning, resume, the command policy, and the demo."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from teamrt import Envelope, FileMailboxes, MemoryMailboxes
from teamrt.agents import tool
from teamrt.conductor import (
    Conductor,
    ConductorState,
    IllegalTransition,
    Plan,
    PlanError,
    Policy,
    Subtask,
    advance,
    pick,
    run_check,
)
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ScriptedModel, ToolSpec, call
from teamrt.team import Team, Teammate

PY = sys.executable
POLICY = Policy.prefixes(f"{PY} -c")


def exists(name: str) -> str:
    """A check command: passes when `name` exists in the work directory."""
    return f"{PY} -c \"import os,sys; sys.exit(0 if os.path.exists('{name}') else 1)\""


def sub(id_: str, *deps: str, check: str | None = None) -> Subtask:
    return Subtask(id=id_, description=f"make {id_}", check=check or exists(id_), depends_on=deps)


def plan(*subtasks: Subtask, acceptance: str | None = None) -> Plan:
    return Plan(subtasks=subtasks, acceptance_check=acceptance or exists("a"))


# --- the pure parts ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"subtasks": [{"id": "a", "description": "", "check": "  "}], "acceptance_check": "x"},
            "subtask 'a' has no check command",
        ),
        (
            {
                "subtasks": [{"id": "a", "description": "", "check": "x", "depends_on": ["b"]}],
                "acceptance_check": "x",
            },
            "subtask 'a' depends on 'b', which is not in the plan",
        ),
        (
            {
                "subtasks": [
                    {"id": "a", "description": "", "check": "x", "depends_on": ["b"]},
                    {"id": "b", "description": "", "check": "x", "depends_on": ["a"]},
                ],
                "acceptance_check": "x",
            },
            "cycle: a -> b -> a",
        ),
        (
            {
                "subtasks": [
                    {"id": "a", "description": "", "check": "x"},
                    {"id": "a", "description": "", "check": "y"},
                ],
                "acceptance_check": "x",
            },
            "subtask id 'a' is used twice",
        ),
        ({"subtasks": [], "acceptance_check": "x"}, "no subtasks"),
        ("not json", "not a plan"),
        ({"subtasks": [{"id": "a", "description": ""}], "acceptance_check": "x"}, "check"),
    ],
)
def test_plan_validation_names_the_culprit(data: object, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        Plan.parse(data if isinstance(data, str) else json.dumps(data))


def test_lifecycle_table() -> None:
    assert advance("pending", "assign") == "assigned"
    assert advance("submitted", "pass") == "verified"
    assert advance("verified", "integrate") == "done"
    assert advance("failed", "escalate") == "escalated"
    with pytest.raises(IllegalTransition, match="cannot go from 'pending' on 'pass'"):
        advance("pending", "pass")
    with pytest.raises(IllegalTransition):
        advance("done", "submit")


def test_dispatch_order_and_parallel_limit() -> None:
    p = plan(sub("leaf"), sub("hub"), sub("x", "hub"), sub("y", "hub"), sub("z", "x", "leaf"))
    statuses = {s.id: "pending" for s in p.subtasks}
    assert [s.id for s in pick(p, statuses, limit=5)] == ["hub", "leaf"]  # hub unblocks 3
    assert [s.id for s in pick(p, statuses, limit=1)] == ["hub"]
    statuses["hub"] = "assigned"
    assert [s.id for s in pick(p, statuses, limit=1)] == []  # one running already
    statuses["hub"] = "done"
    assert [s.id for s in pick(p, statuses, limit=3)] == ["leaf", "x", "y"]  # ties: plan order


async def test_policy_refuses_commands_and_caps_output(tmp_path: Path) -> None:
    refused = await run_check("rm -rf /", tmp_path, POLICY)
    assert refused.exit_code is None and "refused: not allowed by the policy" in refused.tail
    loud = await run_check(
        f"{PY} -c \"print('x' * 100000); raise SystemExit(3)\"", tmp_path, POLICY
    )
    assert loud.exit_code == 3 and len(loud.tail) == 2000
    slow = await run_check(
        f'{PY} -c "import time; time.sleep(5)"', tmp_path, Policy(POLICY.allow, timeout=0.2)
    )
    assert slow.exit_code is None and "timed out" in slow.tail


# --- runs with teammates ----------------------------------------------------------------------


def builder(
    workdir: Path, *, lazy: frozenset[str] = frozenset(), hang: frozenset[str] = frozenset()
) -> Teammate:
    """Creates the file named by the subtask; `lazy` ones only claim to, `hang` ones hang."""

    @tool
    async def make(name: str) -> str:
        """Create a file."""
        if name in hang:
            await anyio.sleep(30)
        (workdir / name).write_text("made")
        return f"made {name}"

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        if messages[-1].role == "tool":
            return "done"
        name = (messages[0].content or "").split(":", 1)[0].removeprefix("Subtask ")
        if name in lazy and "failed" not in (messages[0].content or ""):
            return "done, trust me"  # claims done without doing it
        return call("make", name=name)

    return Teammate("builder", FunctionModel(brain), tools=[make], context="per_task")


async def test_a_worker_that_claims_done_is_checked_not_believed(tmp_path: Path) -> None:
    async with (
        MemoryMailboxes() as mail,
        Team(mail, [builder(tmp_path, lazy=frozenset({"a"}))]) as team,
    ):
        state = await Conductor(
            team, "make a", plan=plan(sub("a")), workdir=tmp_path, policy=POLICY
        ).run()
    assert state.outcome == "accepted"
    verdicts = [(d.action, d.detail) for d in state.decisions if d.action == "verify"]
    assert verdicts == [("verify", "check failed"), ("verify", "check passed")]
    assert state.rounds["a"] == 2


async def test_round_cap_escalates_and_the_humans_answer_continues_the_run(
    tmp_path: Path,
) -> None:
    lazy = {"a"}

    async def human(mail: MemoryMailboxes) -> None:
        inbox = mail.inbox("human")
        question = await inbox.receive(timeout=10)
        assert question.type == "escalation" and "failed 2 rounds" in question.body
        lazy.clear()  # the human fixes the worker's problem, then says retry
        await mail.send(Envelope.response(question, "retry"))

    def stubborn(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        if messages[-1].role == "tool":
            return "done"
        return "done, trust me" if lazy else call("make", name="a")

    @tool
    def make(name: str) -> str:
        """Create a file."""
        (tmp_path / name).write_text("made")
        return "made"

    worker = Teammate("builder", FunctionModel(stubborn), tools=[make], context="per_task")
    async with (
        MemoryMailboxes(members=["human"]) as mail,
        Team(mail, [worker]) as team,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(human, mail)
        state = await Conductor(
            team, "make a", plan=plan(sub("a")), workdir=tmp_path, policy=POLICY, round_cap=2
        ).run()
    assert state.outcome == "accepted"
    actions = [d.action for d in state.decisions]
    assert actions.index("escalate") < actions.index("answer: retry") < actions.index("accept")
    assert [d.by for d in state.decisions if d.action.startswith("answer")] == ["human"]


async def test_a_hung_worker_is_taken_back_as_stuck(tmp_path: Path) -> None:
    async with (
        MemoryMailboxes() as mail,
        Team(mail, [builder(tmp_path, hang=frozenset({"a"}))], shutdown_deadline=0.2) as team,
    ):
        state = await Conductor(
            team,
            "make a",
            plan=plan(sub("a")),
            workdir=tmp_path,
            policy=POLICY,
            subtask_timeout=0.3,
            round_cap=1,
            escalation_timeout=0.1,
        ).run()
    assert any(d.action == "stuck" and d.subtask == "a" for d in state.decisions)
    assert state.outcome == "aborted"  # nobody answered the escalation


async def test_red_acceptance_means_replan(tmp_path: Path) -> None:
    first = {
        "subtasks": [{"id": "a", "description": "make a", "check": exists("a")}],
        "acceptance_check": exists("b"),
    }
    second = {
        "subtasks": [
            {"id": "a", "description": "make a", "check": exists("a")},
            {"id": "b", "description": "make b", "check": exists("b")},
        ],
        "acceptance_check": exists("b"),
    }
    planner = ScriptedModel(["not json at all", json.dumps(first), json.dumps(second)])
    async with MemoryMailboxes() as mail, Team(mail, [builder(tmp_path)]) as team:
        state = await Conductor(
            team, "make a and b", planner=planner, workdir=tmp_path, policy=POLICY
        ).run()
    planner.assert_done()  # one repair of the invalid first answer, then one replan
    assert state.outcome == "accepted" and state.replans == 1
    assert "acceptance check failed" in (planner.calls[2][-1].content or "")
    assigned = [d.subtask for d in state.decisions if d.action == "assign"]
    assert assigned == ["a", "b"]  # the done subtask was not redone after the replan


async def test_resume_after_the_conductor_dies(tmp_path: Path) -> None:
    asked: list[str] = []

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        name = (messages[0].content or "").split(":", 1)[0].removeprefix("Subtask ")
        if messages[-1].role == "tool":
            return "done"
        asked.append(name)
        return call("make", name=name)

    died = anyio.Event()

    @tool
    async def make(name: str) -> str:
        """Create a file."""
        if name == "b" and not (tmp_path / "crashed").exists():
            (tmp_path / "crashed").write_text("")
            died.set()  # the conductor's process dies while b is being made
            await anyio.sleep_forever()
        (tmp_path / name).write_text("made")
        return "made"

    p = plan(sub("a"), sub("b", "a"), acceptance=exists("b"))
    state_path = tmp_path / "state.json"

    async def first_run() -> None:
        async with (
            FileMailboxes(tmp_path / "team") as mail,
            Team(
                mail,
                [Teammate("w", FunctionModel(brain), tools=[make], context="per_task")],
                shutdown_deadline=0.1,
            ) as team,
        ):
            await Conductor(
                team, "make a, b", plan=p, workdir=tmp_path, policy=POLICY, state_path=state_path
            ).run()

    async with anyio.create_task_group() as tg:
        tg.start_soon(first_run)
        await died.wait()
        tg.cancel_scope.cancel()
    saved = ConductorState.load(state_path)
    assert saved is not None and saved.statuses["a"] == "done"
    assert saved.statuses["b"] == "assigned"
    asked.clear()
    async with (
        FileMailboxes(tmp_path / "team") as mail,
        Team(mail, [Teammate("w", FunctionModel(brain), tools=[make], context="per_task")]) as team,
    ):
        state = await Conductor(
            team, "make a, b", plan=p, workdir=tmp_path, policy=POLICY, state_path=state_path
        ).run()
    assert state.outcome == "accepted"
    assert "a" not in asked  # accepted work was not redone (b may come twice: the first
    # conductor's unacked request is delivered again to the new teammate, at least once)
    assert any(d.action == "take back" and d.subtask == "b" for d in state.decisions)


async def test_conductor_demo_runs_offline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from teamrt.demos import conductor

    # its checks are pytest runs of a tiny package: without this venv's plugins (xdist, coverage,
    # Hypothesis...) each starts several times faster
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert await conductor.run(tmp_path) == 0
    out = capsys.readouterr().out
    assert "mul: check failed  [exit 1]" in out
    assert "outcome: accepted" in out
    state = json.loads((tmp_path / "conductor-team" / "conductor" / "state.json").read_text())
    failed = [d for d in state["decisions"] if d["evidence"] and d["evidence"]["exit_code"] == 1]
    assert failed and "assert 5 == 6" in failed[0]["evidence"]["tail"]
    assert (tmp_path / "conductor-team" / "work" / "calc" / "__main__.py").exists()


def test_plans_from_json_and_yaml_files(tmp_path: Path) -> None:
    data = {
        "subtasks": [
            {"id": "a", "description": "make a", "check": "true"},
            {"id": "b", "description": "make b", "check": "true", "depends_on": ["a"]},
        ],
        "acceptance_check": "true",
    }
    (tmp_path / "plan.json").write_text(json.dumps(data))
    (tmp_path / "plan.yaml").write_text(
        "subtasks:\n  - id: a\n    description: make a\n    check: 'true'\n"
        "  - id: b\n    description: make b\n    check: 'true'\n    depends_on: [a]\n"
        "acceptance_check: 'true'\n"
    )
    assert Plan.load(tmp_path / "plan.json") == Plan.load(tmp_path / "plan.yaml")
    (tmp_path / "bad.yaml").write_text("subtasks: [{id: a, description: x}]\nacceptance_check: x")
    with pytest.raises(PlanError, match="check"):
        Plan.load(tmp_path / "bad.yaml")


async def test_an_escalation_answered_with_teamrt_send(tmp_path: Path) -> None:
    from teamrt.cli.main import main

    team_dir = tmp_path / "team"

    def lazy(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        return "done, trust me"  # never does it: the human will accept it as it is

    async def human(mail: FileMailboxes) -> None:
        question = await mail.inbox("human").receive(timeout=10)
        code = await anyio.to_thread.run_sync(
            main,
            [
                "send",
                str(team_dir),
                "--from",
                "human",
                "--to",
                "conductor",
                "--kind",
                "response",
                "--in-reply-to",
                question.id,
                "--body",
                '"done"',
            ],
        )
        assert code == 0

    async with (
        FileMailboxes(team_dir, members=["human"]) as mail,
        Team(mail, [Teammate("w", FunctionModel(lazy), context="per_task")]) as team,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(human, mail)
        p = plan(sub("a"), acceptance="true")
        state = await Conductor(
            team,
            "make a",
            plan=p,
            workdir=tmp_path,
            policy=Policy.prefixes(f"{PY} -c", "true"),
            round_cap=1,
        ).run()
    assert state.outcome == "accepted"
    assert [d.action for d in state.decisions if d.by == "human"] == ["answer: done"]
    assert state.statuses["a"] == "done"


async def test_step_cap_brakes_the_run(tmp_path: Path) -> None:
    async with (
        MemoryMailboxes() as mail,
        Team(mail, [builder(tmp_path, lazy=frozenset({"a", "b", "c"}))]) as team,
    ):
        p = plan(sub("a"), sub("b", "a"), sub("c", "b"), acceptance=exists("c"))
        state = await Conductor(
            team, "abc", plan=p, workdir=tmp_path, policy=POLICY, step_cap=3
        ).run()
    assert state.outcome == "step cap"
    assert state.decisions[-1].detail == "step cap 3 reached"
    assert state.step == 3
