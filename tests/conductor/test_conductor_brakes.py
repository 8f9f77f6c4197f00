"""The conductor's brakes and its escalations (issue 11, items 7 and 8): a hung worker's subtask
goes to a free worker and the hung one is cancelled; a budget ends the run with outcome `budget`,
state and evidence intact; a subtask bounced between workers, and workers trading mail, are
braked and escalated with the tail of the exchange; a check that cannot run is a check error,
never a red check and never a loop; escalations are said on the terminal and in the log with the
exact `teamrt send` command that answers them, and a wrong answer is refused while the run
keeps waiting. Checks and `teamrt send` run as real processes."""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from teamrt import Envelope, FileMailboxes, MemoryMailboxes
from teamrt.agents import tool
from teamrt.conductor import (
    Budget,
    Conductor,
    ConductorState,
    Escalations,
    IllegalTransition,
    Plan,
    Policy,
    Subtask,
    advance,
    run_check,
)
from teamrt.conductor.brakes import fingerprint, transcript_tail
from teamrt.conductor.state import Decision
from teamrt.errors import LimitExceeded, UsageError
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ScriptedModel, ToolSpec, call
from teamrt.models.offline import reply
from teamrt.team import RestartPolicy, Team, TeamBudget, Teammate
from tests.support.paths import ROOT

PY = sys.executable
POLICY = Policy.prefixes(f"{PY} -c")
RESTART = RestartPolicy(on_failure=True, backoff=0.01, max_backoff=0.01)


def exists(name: str) -> str:
    return f"{PY} -c \"import os,sys; sys.exit(0 if os.path.exists('{name}') else 1)\""


def sub(id_: str, *deps: str, check: str | None = None) -> Subtask:
    return Subtask(id=id_, description=f"make {id_}", check=check or exists(id_), depends_on=deps)


def plan(*subtasks: Subtask, acceptance: str | None = None) -> Plan:
    return Plan(subtasks=subtasks, acceptance_check=acceptance or exists(subtasks[-1].id))


def subtask_of(messages: Sequence[ChatMessage]) -> str | None:
    """The subtask id of the newest task in a worker's context (None for a round of mail)."""
    text = messages[-1].content or ""
    if not text.startswith("Subtask "):
        return None
    return text.split(":", 1)[0].removeprefix("Subtask ")


def worker(
    name: str,
    workdir: Path,
    *,
    hang: set[str] | None = None,
    tokens: int = 0,
    restart: RestartPolicy = RESTART,
    price: float | None = None,
) -> Teammate:
    """Makes the file its subtask names; a subtask in `hang` hangs (this incarnation only:
    the set is emptied as it hangs, unless `hang` holds "always")."""
    hang = set() if hang is None else hang

    @tool
    async def make(subtask: str) -> str:
        """Make the subtask's file."""
        if subtask in hang:
            if "always" not in hang:
                hang.discard(subtask)
            await anyio.sleep_forever()
        (workdir / subtask).write_text(name)
        return f"made {subtask}"

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        if messages[-1].role == "tool":
            return reply(f"done: {messages[-1].content}", output_tokens=tokens)
        subtask = subtask_of(messages)
        return call("make", subtask=subtask) if subtask else "nothing to do"

    return Teammate(
        name,
        FunctionModel(brain, name=name),
        tools=[make],
        restart=restart,
        prices={name: (0.0, price)} if price is not None else None,
    )


async def until(condition: object, what: str) -> None:
    """Wait (polling, under a guard) until `condition()` holds."""
    assert callable(condition)
    with anyio.fail_after(10):
        while not condition():  # noqa: ASYNC110 -- member status has no event to wait on
            await anyio.sleep(0.01)


# --- the pure parts ---------------------------------------------------------------------------


def test_lifecycle_check_errors_and_take_backs() -> None:
    assert advance("submitted", "check_error") == "check_error"
    assert advance("verified", "check_error") == "check_error"
    assert advance("check_error", "escalate") == "escalated"
    with pytest.raises(IllegalTransition, match="'check_error' on 'retry'"):
        advance("check_error", "retry")  # a check that cannot run is never retried by itself
    for status in ("assigned", "submitted", "verified", "failed", "stuck", "escalated"):
        assert advance(status, "take_back") == "pending"
    with pytest.raises(IllegalTransition):
        advance("done", "take_back")  # accepted work stands


def test_budget_checks_carry_the_numbers() -> None:
    Budget().check(cost=1e9, tokens=10**9, worker_steps=10**9)  # no caps: never spent
    with pytest.raises(LimitExceeded, match=r"conductor_max_cost=0.5 \(used 0.75\)"):
        Budget(max_cost=0.5).check(cost=0.75, tokens=0, worker_steps=0)
    with pytest.raises(LimitExceeded, match=r"conductor_max_tokens=100 \(used 100\)"):
        Budget(max_tokens=100).check(cost=0, tokens=100, worker_steps=0)
    with pytest.raises(LimitExceeded, match=r"conductor_max_worker_steps=3 \(used 4\)"):
        Budget(max_worker_steps=3).check(cost=0, tokens=0, worker_steps=4)
    with pytest.raises(UsageError, match=r"Budget\.max_cost must not be negative"):
        Budget(max_cost=-1)


async def test_the_conductors_name_and_caps_are_checked(tmp_path: Path) -> None:
    async with MemoryMailboxes() as mail, Team(mail, [worker("w", tmp_path)]) as team:
        for name in ("w", "lead", "human"):
            with pytest.raises(UsageError, match=f"the conductor's name '{name}' is taken"):
                Conductor(
                    team, "g", plan=plan(sub("a")), workdir=tmp_path, policy=POLICY, name=name
                )
        with pytest.raises(UsageError, match="bounce_cap must be at least 1"):
            Conductor(team, "g", plan=plan(sub("a")), workdir=tmp_path, policy=POLICY, bounce_cap=0)


async def test_a_check_that_cannot_run_is_an_error_not_a_red_check(tmp_path: Path) -> None:
    policy = Policy.prefixes(f"{PY} -c", "teamrt-no-such-check", "true")
    missing = await run_check("teamrt-no-such-check --all", tmp_path, policy)
    assert not missing.passed and missing.error is not None
    assert missing.error.startswith("could not start") and "No such file" in missing.error
    refused = await run_check("rm -rf x", tmp_path, policy)
    assert refused.error is not None and "not allowed by the policy" in refused.error
    killed = await run_check(
        f'{PY} -c "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"', tmp_path, policy
    )
    assert killed.error == "crashed: killed by SIGKILL"
    red = await run_check(f'{PY} -c "raise SystemExit(1)"', tmp_path, policy)
    assert red.exit_code == 1 and red.error is None and not red.passed
    assert fingerprint(red) == fingerprint(red.model_copy())
    assert fingerprint(red) != fingerprint(red.model_copy(update={"tail": "other"}))


def test_the_transcript_tail_is_the_subtasks_last_lines() -> None:
    decisions = [
        Decision(step=i, by="w", subtask="a" if i % 2 else "b", action="submit", detail=f"n{i}")
        for i in range(30)
    ]
    tail = transcript_tail(decisions, "a", extra=["w2: passed\nit on"], lines=3)
    assert tail == ["step 27 w submit: n27", "step 29 w submit: n29", "w2: passed it on"]


# --- a hung worker ------------------------------------------------------------------------------


async def test_a_hung_worker_is_cancelled_and_its_subtask_goes_to_a_free_one(
    tmp_path: Path,
) -> None:
    async with (
        MemoryMailboxes() as mail,
        Team(mail, [worker("w1", tmp_path, hang={"a"}), worker("w2", tmp_path)]) as team,
    ):
        state = await Conductor(
            team,
            "make a",
            plan=plan(sub("a")),
            workdir=tmp_path,
            policy=POLICY,
            subtask_timeout=1.0,
        ).run()
        # the hung one was cancelled and its policy restarted it
        await until(lambda: team.status["w1"].restarts == 1, "w1 restarted")
        await until(lambda: team.status["w1"].state == "idle", "w1 idle again")
    assert state.outcome == "accepted"
    assert (tmp_path / "a").read_text() == "w2"
    moves = [(d.action, d.detail.split(",")[0]) for d in state.decisions if d.subtask == "a"]
    assert moves[:3] == [("assign", "to w1"), ("stuck", moves[1][1]), ("assign", "to w2")]
    cancels = [d.detail for d in state.decisions if d.action == "cancel"]
    assert cancels == ["w1: hung on subtask a: w1 did not answer within 1s"]
    assert state.handoffs["a"] == 0  # the new check result counts as progress


# --- budgets ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        (Budget(max_tokens=150), "conductor_max_tokens=150 (used 200)"),
        (Budget(max_cost=1.5), "conductor_max_cost=1.5 (used 2)"),
        (Budget(max_worker_steps=4), "conductor_max_worker_steps=4 (used 4)"),
    ],
)
async def test_the_conductor_budget_ends_the_run_with_state_and_evidence_intact(
    tmp_path: Path, budget: Budget, message: str
) -> None:
    state_path = tmp_path / "state.json"
    p = plan(sub("a"), sub("b", "a"), sub("c", "b"))
    async with (
        MemoryMailboxes() as mail,
        Team(mail, [worker("w", tmp_path, tokens=100, price=10_000.0)]) as team,
    ):
        state = await Conductor(
            team,
            "abc",
            plan=p,
            workdir=tmp_path,
            policy=POLICY,
            budget=budget,
            state_path=state_path,
        ).run()
    assert state.outcome == "budget"
    saved = ConductorState.load(state_path)
    assert saved is not None and saved == state
    assert saved.statuses == {"a": "done", "b": "done", "c": "pending"}
    assert (saved.tokens, saved.worker_steps) == (200, 4)
    assert saved.decisions[-1].action == "brake" and message in saved.decisions[-1].detail
    verified = [d for d in saved.decisions if d.action == "verify"]
    assert [d.evidence.exit_code for d in verified if d.evidence] == [0, 0]
    assert not any(d.action == "escalate" for d in saved.decisions)
    # a bigger budget resumes the run where it stopped: accepted work is not redone
    async with (
        MemoryMailboxes() as mail,
        Team(mail, [worker("w", tmp_path, tokens=100, price=10_000.0)]) as team,
    ):
        state = await Conductor(
            team,
            "abc",
            plan=p,
            workdir=tmp_path,
            policy=POLICY,
            budget=Budget(max_tokens=10_000),
            state_path=state_path,
        ).run()
    assert state.outcome == "accepted"
    assert [d.subtask for d in state.decisions if d.action == "assign"] == ["a", "b", "c"]
    assert any(d.action == "resume" and "budget" in d.detail for d in state.decisions)


async def test_a_spent_team_budget_ends_the_run_without_retries(tmp_path: Path) -> None:
    budget = TeamBudget(max_tokens=100)
    async with (
        MemoryMailboxes() as mail,
        Team(mail, [worker("w", tmp_path, tokens=100)], budget=budget) as team,
    ):
        state = await Conductor(
            team, "ab", plan=plan(sub("a"), sub("b", "a")), workdir=tmp_path, policy=POLICY
        ).run()
    assert state.outcome == "budget"
    assert "team_max_tokens=100 (used 100)" in state.decisions[-1].detail
    assert [d.subtask for d in state.decisions if d.action == "assign"] == ["a"]
    assert state.statuses == {"a": "done", "b": "pending"}


async def test_a_budget_spent_mid_wave_stops_the_other_workers(tmp_path: Path) -> None:
    """One subtask spends the budget while another hangs: the run stops at once, the hung
    worker is cancelled, and its subtask is taken back, not left assigned."""
    async with (
        MemoryMailboxes() as mail,
        Team(
            mail,
            [
                worker("w1", tmp_path, tokens=100),
                worker("w2", tmp_path, hang={"b", "always"}, tokens=100),
            ],
        ) as team,
    ):
        p = plan(sub("a"), sub("b"), sub("c", "a", "b"))

        state = await Conductor(
            team,
            "abc",
            plan=p,
            workdir=tmp_path,
            policy=POLICY,
            budget=Budget(max_tokens=100),
            subtask_timeout=60,
            parallel=2,
        ).run()
        await until(lambda: team.status["w2"].state != "working", "w2 stopped")
    assert state.outcome == "budget"
    assert state.statuses == {"a": "done", "b": "pending", "c": "pending"}
    assert any(
        d.action == "cancel" and d.detail.startswith("w2: the conductor stopped the run: budget")
        for d in state.decisions
    )
    assert any(d.action == "take back" and d.subtask == "b" for d in state.decisions)


# --- going in circles -----------------------------------------------------------------------------


async def human_answers(
    mail: MemoryMailboxes | FileMailboxes, answer: str, seen: list[Envelope]
) -> None:
    """Answer the first escalation with `answer`, keeping the question in `seen`."""
    question = await mail.inbox("human").receive(timeout=20)
    seen.append(question)
    await mail.send(Envelope.response(question, answer))


async def test_a_subtask_bounced_between_two_workers_is_braked_and_escalated(
    tmp_path: Path,
) -> None:
    """Both workers hang on it: it goes w1 -> w2, and would go back to w1 with still no new
    check result: the brake escalates it with the tail, long before the round cap."""
    seen: list[Envelope] = []
    async with (
        MemoryMailboxes(members=["human"]) as mail,
        Team(
            mail,
            [
                worker("w1", tmp_path, hang={"a", "always"}),
                worker("w2", tmp_path, hang={"a", "always"}),
            ],
        ) as team,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(human_answers, mail, "abort", seen)
        state = await Conductor(
            team,
            "make a",
            plan=plan(sub("a")),
            workdir=tmp_path,
            policy=POLICY,
            subtask_timeout=0.3,
            round_cap=50,
        ).run()
    assert state.outcome == "aborted"
    assert [d.detail for d in state.decisions if d.action == "assign"] == [
        "to w1, round 1",
        "to w2, round 2",
    ]
    escalation = next(d for d in state.decisions if d.action == "escalate")
    assert "from w2 to w1 again, with no new check result" in escalation.detail
    assert escalation.transcript is not None
    assert any("stuck: w2 did not answer" in line for line in escalation.transcript)
    body = seen[0].body
    assert "no new check result" in body and "stuck: w1 did not answer" in body


async def test_workers_trading_mail_are_braked_and_escalated_with_the_tail(
    tmp_path: Path,
) -> None:
    """w1 passes the subtask to w2 by message, w2 passes it back, and so on: no check result
    changes, so after `exchange_cap` rounds of mail both are stopped and a human is asked."""
    seen: list[Envelope] = []

    def passer(me: str, other: str) -> Teammate:
        def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
            if messages[-1].role == "tool":
                return f"passed it to {other}"
            if subtask_of(messages) is not None:
                return call("send_message", to=other, text="a is yours, not mine")
            return call("send_message", to=other, text="no, a is yours")  # a round of mail

        return Teammate(me, FunctionModel(brain, name=me))

    async with (
        MemoryMailboxes(members=["human"]) as mail,
        Team(mail, [passer("w1", "w2"), passer("w2", "w1")]) as team,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(human_answers, mail, "abort", seen)
        state = await Conductor(
            team,
            "make a",
            plan=plan(sub("a")),
            workdir=tmp_path,
            policy=POLICY,
            round_cap=1000,
            exchange_cap=4,
        ).run()
        await until(lambda: all(team.status[w].state == "crashed" for w in ("w1", "w2")), "stopped")
    assert state.outcome == "aborted"
    escalation = next(d for d in state.decisions if d.action == "escalate")
    assert "rounds of mail (w1, w2), with no new check result" in escalation.detail
    assert escalation.transcript and any(
        t in ("w1 said: passed it to w2", "w2 said: passed it to w1") for t in escalation.transcript
    )
    assert sum(1 for d in state.decisions if d.action == "verify") < 10  # far from the cap
    cancelled = sorted(d.detail.split(":")[0] for d in state.decisions if d.action == "cancel")
    assert cancelled == ["w1", "w2"]
    assert "passed it to" in seen[0].body


# --- checks that cannot run ---------------------------------------------------------------------


async def test_a_check_command_that_does_not_exist_is_escalated_once_not_looped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[Envelope] = []
    missing = "teamrt-no-such-check --all"
    async with (
        MemoryMailboxes(members=["human"]) as mail,
        Team(mail, [worker("w", tmp_path)]) as team,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(human_answers, mail, "done", seen)
        state = await Conductor(
            team,
            "make a",
            plan=plan(sub("a", check=missing), acceptance="true"),
            workdir=tmp_path,
            policy=Policy.prefixes(f"{PY} -c", "teamrt-no-such-check", "true"),
            round_cap=5,
        ).run()
    assert state.outcome == "accepted"  # the human accepted it as it is
    assert [d.action for d in state.decisions if d.subtask == "a"] == [
        "assign",
        "submit",
        "check error",
        "escalate",
        "answer: done",
    ]
    error = next(d for d in state.decisions if d.action == "check error")
    assert error.evidence is not None and error.evidence.exit_code is None
    assert "could not start" in error.detail and "No such file" in error.detail
    assert not any(d.action == "verify" for d in state.decisions)  # never a red check
    assert "its check could not run: could not start" in seen[0].body
    assert "ESCALATION: subtask a needs a human: its check could not run" in caplog.text


async def test_an_acceptance_check_that_cannot_run_stops_without_replanning(
    tmp_path: Path,
) -> None:
    first = {
        "subtasks": [{"id": "a", "description": "make a", "check": exists("a")}],
        "acceptance_check": "teamrt-no-such-check",
    }
    planner = ScriptedModel([json.dumps(first)])  # a replan would exhaust the script
    async with MemoryMailboxes() as mail, Team(mail, [worker("w", tmp_path)]) as team:
        state = await Conductor(
            team,
            "make a",
            planner=planner,
            workdir=tmp_path,
            policy=Policy.prefixes(f"{PY} -c", "teamrt-no-such-check"),
        ).run()
    planner.assert_done()
    assert state.outcome == "check error" and state.replans == 0
    assert state.statuses == {"a": "done"}
    error = next(d for d in state.decisions if d.action == "check error")
    assert "the acceptance check could not run: could not start" in error.detail


# --- escalations are visible and answered ------------------------------------------------------


async def test_an_escalation_is_shown_and_the_printed_command_answers_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The log says what failed, the evidence tail and the command; `teamrt send` (a real
    process) with a wrong answer is refused with an error and the run keeps waiting; the
    printed command, run as printed, answers it."""
    team_dir = tmp_path / "team"
    lazy = {"a"}
    errors: list[Envelope] = []

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        if messages[-1].role == "tool":
            return "done"
        return "done, trust me" if lazy else call("make", subtask="a")

    @tool
    def make(subtask: str) -> str:
        """Make the subtask's file."""
        (tmp_path / subtask).write_text("made")
        return "made"

    async def teamrt(command: str, *, body: str | None = None) -> None:
        words = shlex.split(command)
        assert words[:2] == ["teamrt", "send"]
        if body is not None:
            words[-1] = body
        done = await anyio.run_process([PY, "-m", "teamrt", *words[1:]], check=False)
        assert done.returncode == 0, done.stderr

    async def human(mail: FileMailboxes) -> None:
        inbox = mail.inbox("human")
        question = await inbox.receive(timeout=20)
        assert question.type == "escalation"
        logged = [r.getMessage() for r in caplog.records if "ESCALATION" in r.getMessage()]
        assert len(logged) == 1
        shown = logged[0]
        assert "ESCALATION: subtask a needs a human: it failed 1 rounds" in shown
        assert "-> exit 1" in shown  # the evidence
        command = shown.splitlines()[-1]
        assert command == (
            f"teamrt send {team_dir} --from human --to conductor --kind response "
            f"--in-reply-to {question.id} --body '\"retry\"'"
        )
        await teamrt(command, body='"maybe"')
        refusal = await inbox.receive(timeout=20)
        errors.append(refusal)
        lazy.clear()
        await teamrt(command)  # exactly as printed

    async with (
        FileMailboxes(team_dir, members=["human"]) as mail,
        Team(mail, [Teammate("w", FunctionModel(brain), tools=[make])]) as team,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(human, mail)
        state = await Conductor(
            team, "make a", plan=plan(sub("a")), workdir=tmp_path, policy=POLICY, round_cap=1
        ).run()
    assert state.outcome == "accepted"
    assert errors[0].type == "error" and errors[0].body["error"] == "InvalidAnswer"
    assert (
        "'maybe' is not an answer: answer 'retry', 'done' or 'abort'" in (errors[0].body["message"])
    )
    actions = [d.action for d in state.decisions]
    assert (
        actions.index("escalate") < actions.index("refuse answer") < actions.index("answer: retry")
    )
    assert "refused response" in caplog.text and "'maybe' is not an answer" in caplog.text


async def test_answers_that_close_no_escalation_are_refused() -> None:
    refused: list[str] = []
    async with MemoryMailboxes(members=["conductor", "human", "lead"]) as mail:
        desk = Escalations(
            mail, "conductor", "human", on_refusal=lambda e, why: refused.append(why)
        )
        question = desk.question("subtask a failed: retry, done or abort?")
        async with anyio.create_task_group() as tg:
            tg.start_soon(desk.serve)
            answers: list[str | None] = []

            async def ask() -> None:
                answers.append(await desk.ask(question, timeout=20))

            tg.start_soon(ask)
            asked = await mail.inbox("human").receive(timeout=10)
            stray = Envelope.request("conductor", "human", "never asked")
            await mail.send(Envelope.response(stray, "retry"))  # to no open escalation
            forged = Envelope.request("conductor", "lead", "x")
            await mail.send(  # from someone else, in reply to the right id
                Envelope.response(forged, "abort").model_copy(update={"in_reply_to": asked.id})
            )
            await mail.send(Envelope.message("human", "conductor", "retry"))  # not a response
            await mail.send(Envelope.response(asked, " Done "))
            await until(lambda: answers, "answered")
            tg.cancel_scope.cancel()
    assert answers == ["done"]
    assert "no open escalation has id" in refused[0]
    assert refused[1].startswith("only human answers escalations")
    assert refused[2].startswith("the conductor takes only answers")


def test_an_escalation_shows_on_the_terminal_with_no_logging_set_up(tmp_path: Path) -> None:
    """In a real process that configures no logging, the escalation reaches stderr."""
    script = f"""
import anyio, sys
from pathlib import Path
from teamrt import MemoryMailboxes
from teamrt.conductor import Conductor, Plan, Policy, Subtask
from teamrt.models import FunctionModel
from teamrt.team import Team, Teammate

async def main():
    check = {sys.executable!r} + ' -c "raise SystemExit(3)"'
    plan = Plan(subtasks=(Subtask(id="a", description="a", check=check),), acceptance_check=check)
    lazy = Teammate("w", FunctionModel(lambda m, t: "done, trust me"))
    async with MemoryMailboxes() as mail, Team(mail, [lazy]) as team:
        state = await Conductor(team, "a", plan=plan, workdir={str(tmp_path)!r},
            policy=Policy.prefixes({sys.executable!r}), round_cap=1,
            escalation_timeout=0.2).run()
    print(state.outcome)

anyio.run(main)
"""
    import subprocess

    done = subprocess.run([PY, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "aborted"
    assert "ESCALATION: subtask a needs a human: it failed 1 rounds" in done.stderr
    assert "-> exit 3" in done.stderr
    assert "teamrt send TEAM_DIR --from human --to conductor --kind response" in done.stderr
    assert "no answer within 0.2s: the run stops" in done.stderr


async def test_a_hung_worker_in_another_process_is_passed_over_for_a_free_one(
    tmp_path: Path,
) -> None:
    """`slow` runs in a `teamrt run-agent` process and hangs: its subtask goes to the free
    in-process worker. (`Team.cancel` cannot reach another process: nothing is cancelled.)"""
    team_dir = tmp_path / "team"
    async with (
        FileMailboxes(team_dir, members=["slow"]) as mail,
        Team(mail, [worker("free", tmp_path)], remote=["slow"], shutdown_deadline=0.5) as team,
    ):
        process = await anyio.open_process(
            [
                PY,
                "-m",
                "teamrt",
                "run-agent",
                str(team_dir),
                "--name",
                "slow",
                "--spec",
                "tests.support.conductor_procs:hanger",
            ],
            cwd=ROOT,
        )
        try:
            assert process.stdout is not None
            with anyio.fail_after(30):
                first = await process.stdout.receive()
            assert b"slow: running as incarnation" in first
            state = await Conductor(
                team,
                "make a",
                plan=plan(sub("a")),
                workdir=tmp_path,
                policy=POLICY,
                workers=["slow", "free"],
                subtask_timeout=1.0,
            ).run()
        finally:
            process.kill()
            await process.wait()
            await process.aclose()
    assert state.outcome == "accepted"
    assert (tmp_path / "a").read_text() == "free"
    assert [d.detail.split(",")[0] for d in state.decisions if d.action == "assign"] == [
        "to slow",
        "to free",
    ]
    assert any(d.action == "stuck" and "slow did not answer" in d.detail for d in state.decisions)
    assert not any(d.action == "cancel" for d in state.decisions)


async def test_an_integration_check_that_cannot_run_is_escalated_not_a_conflict(
    tmp_path: Path,
) -> None:
    p = Plan(
        subtasks=(sub("a"),),
        integration_check=f"{PY} -m no_such_module_here",  # runs: exit 1 is red, not an error
        acceptance_check=exists("a"),
    )
    broken = p.model_copy(update={"integration_check": "rm -rf /"})  # refused by the policy
    for chosen, action in ((broken, "check error"), (p, "conflict")):
        (tmp_path / "a").unlink(missing_ok=True)
        async with (
            MemoryMailboxes() as mail,
            Team(mail, [worker("w", tmp_path)]) as team,
        ):
            state = await Conductor(
                team,
                "make a",
                plan=chosen,
                workdir=tmp_path,
                policy=Policy.prefixes(PY),
                round_cap=1,
                escalation_timeout=0.1,
                state_path=tmp_path / f"{action}.json",
            ).run()
        assert state.outcome == "aborted"  # nobody answered the escalation
        decision = next(d for d in state.decisions if d.action == action)
        if action == "check error":
            assert decision.detail.startswith("integration: not allowed by the policy")
            assert not any(d.action == "conflict" for d in state.decisions)
        else:
            assert decision.evidence is not None and decision.evidence.exit_code == 1


async def test_a_hung_replica_of_a_pool_is_cancelled_and_another_replica_takes_over(
    tmp_path: Path,
) -> None:
    pool = dataclasses.replace(worker("builder", tmp_path, hang={"a"}), replicas=2)
    subtask = Subtask(id="a", description="make a", check=exists("a"), role="builder")
    async with MemoryMailboxes() as mail, Team(mail, [pool]) as team:
        state = await Conductor(
            team,
            "make a",
            plan=Plan(subtasks=(subtask,), acceptance_check=exists("a")),
            workdir=tmp_path,
            policy=POLICY,
            subtask_timeout=1.0,
        ).run()
        await until(lambda: team.status["builder-1"].restarts == 1, "builder-1 restarted")
    assert state.outcome == "accepted"
    assert [d.detail for d in state.decisions if d.action == "assign"] == [
        "to builder-1, round 1",
        "to builder-2, round 2",
    ]
    assert [d.detail.split(":")[0] for d in state.decisions if d.action == "cancel"] == [
        "builder-1"
    ]
