"""The conductor: a lead that plans, dispatches, verifies, integrates, accepts and brakes.

Theory of operation. The goal becomes a plan of checkable subtasks (from the user, or from a
planner model with one repair attempt). In waves, the conductor picks the ready subtasks that
unblock most, up to `parallel` at once, and gives each to a teammate as a task. It never takes a
worker's word: when the worker answers, the conductor runs the subtask's check itself; a red
check goes back to the worker with the output, up to `round_cap` rounds, then to a human as an
escalation envelope, whose answer (`retry`, `done` or `abort`) the run waits for. After each
accepted subtask the integration check tests the seams; red is a conflict that goes back to the
worker. When every subtask is done the acceptance check decides; red means the plan was wrong,
and the planner gets the failure to replan, a bounded number of times. Every decision, with who
made it and the check's evidence, is saved to `conductor/state.json` at once, and a conductor
killed mid-run resumes from it without redoing accepted work.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio

from teamrt.conductor.checks import Evidence, Policy, run_check
from teamrt.conductor.plan import Plan, PlanError, Subtask, advance, pick
from teamrt.conductor.state import ConductorState, Decision
from teamrt.envelopes import Envelope
from teamrt.errors import RemoteError, RequestTimeout, TeammateGone, UsageError
from teamrt.models.base import ChatMessage, Model
from teamrt.team import Team

PLAN_PROMPT = """You are a planner. Break the goal into subtasks that each fit one worker.
Every subtask MUST have a check: a command whose exit code is 0 when it is done.
Answer with JSON only: {"subtasks": [{"id": "short-id", "description": "...",
"check": "command", "depends_on": ["other-id"]}], "integration_check": "command or null",
"acceptance_check": "command"}"""


class Conductor:
    def __init__(
        self,
        team: Team,
        goal: str,
        *,
        workdir: str | os.PathLike[str],
        policy: Policy,
        plan: Plan | None = None,
        planner: Model | None = None,
        workers: Sequence[str] | None = None,
        parallel: int = 2,
        round_cap: int = 3,
        subtask_timeout: float = 300.0,
        step_cap: int = 200,
        max_replans: int = 2,
        human: str = "human",
        escalation_timeout: float = 24 * 3600,
        state_path: str | os.PathLike[str] | None = None,
        on_decision: Callable[[Decision], None] | None = None,
    ) -> None:
        if plan is None and planner is None:
            raise UsageError("a conductor needs a plan or a planner model")
        self.team = team
        self.goal = goal
        self.workdir = Path(workdir)
        self.policy = policy
        self.plan = plan.validated() if plan is not None else None
        self.planner = planner
        self.workers = list(workers or team.teammates)
        self.parallel = parallel
        self.round_cap = round_cap
        self.subtask_timeout = subtask_timeout
        self.step_cap = step_cap
        self.max_replans = max_replans
        self.human = human
        self.escalation_timeout = escalation_timeout
        self.state_path = (
            Path(state_path) if state_path else self.workdir / "conductor" / ("state.json")
        )
        self.state: ConductorState | None = None
        self.on_decision = on_decision  # e.g. to show progress as the run goes
        self._busy: set[str] = set()

    # -- the run --

    async def run(self) -> ConductorState:
        """Run to an outcome: accepted, or the brake that stopped it."""
        await self.team.mail.add_member(self.human)
        state = ConductorState.load(self.state_path)
        if state is None or state.goal != self.goal:
            plan = self.plan or await self._make_plan(None)
            state = ConductorState(
                goal=self.goal, plan=plan, statuses={s.id: "pending" for s in plan.subtasks}
            )
            state.decide("conductor", "plan", detail=f"{len(plan.subtasks)} subtasks")
        else:  # resuming: work that was in flight is taken back; accepted work stands
            for sid, status in state.statuses.items():
                if status not in ("done", "pending"):
                    state.statuses[sid] = "pending"
                    state.decide("conductor", "take back", sid, f"was {status} at the crash")
        self.state = state
        self._save()
        while state.outcome is None:
            if state.step >= self.step_cap and not all(
                v == "done" for v in state.statuses.values()
            ):
                state.outcome = "step cap"
                state.decide("conductor", "brake", detail=f"step cap {self.step_cap} reached")
                break
            if all(v == "done" for v in state.statuses.values()):
                await self._accept_or_replan()
                continue
            chosen = pick(state.plan, state.statuses, limit=self.parallel)
            if not chosen:
                state.outcome = "blocked"
                state.decide("conductor", "brake", detail="nothing is ready and nothing runs")
                break
            async with anyio.create_task_group() as tg:
                for subtask in chosen:
                    tg.start_soon(self._see_through, subtask)
        self._save()
        return state

    async def _see_through(self, subtask: Subtask) -> None:
        """Rounds of work and checks for one subtask, until it is done or handed back."""
        state = self._state()
        feedback = ""
        while True:
            if state.step >= self.step_cap or state.outcome is not None:
                return  # the run is braking: the main loop records why
            state.step += 1
            worker = self._worker_for(subtask)
            if state.statuses[subtask.id] == "pending":
                self._move(subtask.id, "assign")  # later rounds are assigned by "retry"
            state.rounds[subtask.id] = state.rounds.get(subtask.id, 0) + 1
            state.decide(
                "conductor", "assign", subtask.id, f"to {worker}, round {state.rounds[subtask.id]}"
            )
            self._save()
            self._busy.add(worker)
            try:
                answer = await self._ask(worker, subtask, feedback)
            finally:
                self._busy.discard(worker)
            if answer is None:  # the worker hung or is gone: take the subtask back
                self._move(subtask.id, "timeout")
                state.decide(
                    "conductor",
                    "stuck",
                    subtask.id,
                    f"{worker} did not finish within {self.subtask_timeout:g}s",
                )
                feedback = "The previous attempt did not finish in time."
            else:
                self._move(subtask.id, "submit")
                state.decide(worker, "submit", subtask.id, answer[:300])
                evidence = await run_check(subtask.check, self.workdir, self.policy)
                if evidence.passed:
                    self._move(subtask.id, "pass")
                    state.decide("conductor", "verify", subtask.id, "check passed", evidence)
                    if await self._integrate(subtask):
                        return
                    feedback = (
                        "Your piece passes its own check but breaks the integration "
                        "check:\n"
                        + (
                            state.decisions[-1].evidence
                            or Evidence(command="", exit_code=None, tail="")
                        ).tail
                    )
                else:
                    self._move(subtask.id, "fail")
                    state.decide("conductor", "verify", subtask.id, "check failed", evidence)
                    feedback = f"The check `{subtask.check}` failed:\n{evidence.tail}"
            self._save()
            if state.rounds[subtask.id] >= self.round_cap:
                if not await self._escalate(subtask, feedback):
                    return
            else:
                self._move(subtask.id, "retry")

    async def _ask(self, worker: str, subtask: Subtask, feedback: str) -> str | None:
        text = (
            f"Subtask {subtask.id}: {subtask.description}\n"
            f"When you are done, the conductor will run: {subtask.check}"
        )
        if feedback:
            text += f"\n\n{feedback}"
        try:
            result = await self.team.ask(worker, text, timeout=self.subtask_timeout)
        except (RequestTimeout, TeammateGone, RemoteError):
            return None
        state = self._state()
        state.tokens += result.tokens
        state.cost += result.cost or 0.0
        return result.answer or ""

    async def _integrate(self, subtask: Subtask) -> bool:
        state = self._state()
        check = state.plan.integration_check
        if check is None:
            self._move(subtask.id, "integrate")
            state.decide("conductor", "integrate", subtask.id, "no integration check")
            self._save()
            return True
        evidence = await run_check(check, self.workdir, self.policy)
        if evidence.passed:
            self._move(subtask.id, "integrate")
            state.decide("conductor", "integrate", subtask.id, "integration check passed", evidence)
            self._save()
            return True
        self._move(subtask.id, "conflict")
        state.decide("conductor", "conflict", subtask.id, "integration check failed", evidence)
        self._save()
        return False

    async def _escalate(self, subtask: Subtask, feedback: str) -> bool:
        """Ask the human; True if the subtask goes on (retry), False if it is settled."""
        state = self._state()
        self._move(subtask.id, "escalate")
        question = (
            f"Subtask {subtask.id} failed {state.rounds[subtask.id]} rounds. "
            f"Last: {feedback[-1500:]}\nAnswer 'retry' (more rounds), 'done' (accept "
            "it as it is) or 'abort' (stop the run)."
        )
        request = Envelope.request(self.team.lead, self.human, question, type="escalation")
        state.decide("conductor", "escalate", subtask.id, f"asked {self.human} ({request.id})")
        self._save()
        try:
            response = await self.team.mail.request(request, timeout=self.escalation_timeout)
            answer = str(response.body).strip().lower()
        except RequestTimeout:
            answer = "abort"
        state.decide(self.human, f"answer: {answer}", subtask.id)
        if answer == "retry":
            state.rounds[subtask.id] = 0
            self._move(subtask.id, "retry")
            return True
        if answer == "done":
            self._move(subtask.id, "resolve")
            self._save()
            return False
        state.outcome = "aborted"
        state.statuses[subtask.id] = "escalated"
        self._save()
        return False

    async def _accept_or_replan(self) -> None:
        state = self._state()
        evidence = await run_check(state.plan.acceptance_check, self.workdir, self.policy)
        if evidence.passed:
            state.outcome = "accepted"
            state.decide("conductor", "accept", detail="acceptance check passed", evidence=evidence)
            self._save()
            return
        state.decide(
            "conductor",
            "reject",
            detail="every subtask is done but the acceptance check is red: the plan was wrong",
            evidence=evidence,
        )
        if self.planner is None or state.replans >= self.max_replans:
            state.outcome = "acceptance failed"
            self._save()
            return
        state.replans += 1
        old = {s.id: s for s in state.plan.subtasks}
        plan = await self._make_plan(
            f"`{evidence.command}` exited with {evidence.exit_code}:\n{evidence.tail}"
        )
        state.plan = plan
        state.statuses = {
            s.id: (
                "done" if old.get(s.id) == s and state.statuses.get(s.id) == "done" else "pending"
            )
            for s in plan.subtasks
        }
        state.decide(
            "conductor", "replan", detail=f"replan {state.replans}: {len(plan.subtasks)} subtasks"
        )
        self._save()

    async def _make_plan(self, failure: str | None) -> Plan:
        """A plan from the planner model, with one repair attempt on invalid output."""
        assert self.planner is not None
        messages = [ChatMessage.system(PLAN_PROMPT), ChatMessage.user(f"GOAL: {self.goal}")]
        if failure:
            messages.append(
                ChatMessage.user(
                    f"The last plan was completed but the acceptance "
                    f"check failed:\n{failure[-2000:]}"
                )
            )
        for attempt in range(2):
            reply = await self.planner.complete(messages, [])
            try:
                return Plan.parse(reply.text or "")
            except PlanError as exc:
                if attempt == 1:
                    raise
                messages += [
                    ChatMessage(role="assistant", content=reply.text),
                    ChatMessage.user(
                        f"That plan is invalid: {exc}. Answer again with valid JSON only."
                    ),
                ]
        raise AssertionError("unreachable")  # pragma: no cover

    # -- bookkeeping --

    def _worker_for(self, subtask: Subtask) -> str:
        if subtask.role is not None:
            return subtask.role
        free = [w for w in self.workers if w not in self._busy]
        return (free or self.workers)[0]

    def _move(self, subtask_id: str, event: str) -> None:
        state = self._state()
        state.statuses[subtask_id] = advance(state.statuses.get(subtask_id, "pending"), event)

    def _state(self) -> ConductorState:
        assert self.state is not None
        return self.state

    def _save(self) -> None:
        state = self._state()
        state.save(self.state_path)
        if self.on_decision is not None:
            while self._shown < len(state.decisions):
                self.on_decision(state.decisions[self._shown])
                self._shown += 1

    _shown = 0
