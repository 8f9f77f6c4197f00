"""The conductor: a lead that plans, dispatches, verifies, integrates, accepts and brakes.

Theory of operation. The goal becomes a plan of checkable subtasks (from the user, or from a
planner model with one repair attempt). In waves, the conductor picks the ready subtasks that
unblock most, up to `parallel` at once, and gives each to a free teammate as a task. It never
takes a worker's word: when the worker answers, the conductor runs the subtask's check itself;
a red check goes back to the worker with the output, up to `round_cap` rounds, then to a human.
After each accepted subtask the integration check tests the seams; red is a conflict that goes
back to the worker. When every subtask is done the acceptance check decides; red means the plan
was wrong, and the planner gets the failure to replan, a bounded number of times.

Brakes. A worker that does not answer within `subtask_timeout` (or fails) is cancelled
(`Team.cancel`: its restart policy decides what comes next) and its subtask goes to a different
free worker. A subtask handed from worker to worker `bounce_cap` times, or workers trading
`exchange_cap` rounds of mail, with no new check result, is stopped and escalated with the tail
of the exchange. A check that cannot run is a check error, escalated at once, never retried. The
conductor's `Budget` and the team's budget end the run with outcome `budget`; `step_cap` with
`step cap`. An escalation is said on the terminal and in the log (a WARNING on the
`teamrt.conductor` logger) with the exact `teamrt send` command that answers it.

Every decision, with who made it and the evidence, is saved to `conductor/state.json` at once;
a conductor killed or braked mid-run resumes from it without redoing accepted work.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import anyio

from teamrt.conductor.brakes import Budget, fingerprint, transcript_tail
from teamrt.conductor.checks import Evidence, Policy, run_check
from teamrt.conductor.escalation import Escalations, announcement, question
from teamrt.conductor.plan import Plan, Subtask, advance, pick
from teamrt.conductor.planner import make_plan
from teamrt.conductor.state import ConductorState, Decision
from teamrt.conductor.watch import Chatter, MailWatch
from teamrt.envelopes import Envelope
from teamrt.errors import LimitExceeded, RemoteError, RequestTimeout, TeammateGone, UsageError
from teamrt.models.base import Model
from teamrt.team import TaskResult, Team
from teamrt.teamdir import TeamDir

log = logging.getLogger("teamrt.conductor")

#: How often the conductor looks at its workers while it waits for an answer (seconds).
WATCH_INTERVAL = 0.05

Verdict = Literal["done", "failed", "stuck", "check_error"]


def _circling(why: str) -> str:
    return f"{why}, with no new check result"


@dataclass
class _Answer:
    """How asking a worker went: its answer, or why there is none."""

    text: str | None = None
    failure: str = ""
    hung: bool = False  # no answer in time: the worker is cancelled
    chatter: Chatter | None = None  # the chatter brake stopped it


class Conductor:
    """Runs `goal` to an outcome with `team`'s teammates as workers (see the module docstring).

    - `round_cap`: rounds of a subtask before a human is asked; `subtask_timeout`: seconds a
      worker has to answer before it counts as hung (cancelled, the subtask goes elsewhere).
    - `budget`: the conductor's own `Budget`; `step_cap`: its own rounds, in all.
    - `bounce_cap`: handoffs of a subtask between workers, and `exchange_cap`: rounds of mail
      among the workers, with no new check result, before the brake.
    - `name`: the conductor's member name (its inbox takes the human's answers); `human`: who
      escalations go to; `escalation_timeout`: how long it waits for an answer before aborting.
    - `on_decision`: called with every decision as it is saved (e.g. to print progress).
    """

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
        budget: Budget | None = None,
        bounce_cap: int = 2,
        exchange_cap: int = 10,
        max_replans: int = 2,
        name: str = "conductor",
        human: str = "human",
        escalation_timeout: float = 24 * 3600,
        state_path: str | os.PathLike[str] | None = None,
        on_decision: Callable[[Decision], None] | None = None,
    ) -> None:
        if plan is None and planner is None:
            raise UsageError("a conductor needs a plan or a planner model")
        if name in team.teammates or name in (team.lead, human):
            raise UsageError(f"the conductor's name {name!r} is taken: pick another (name=...)")
        counts = {
            "parallel": parallel,
            "round_cap": round_cap,
            "bounce_cap": bounce_cap,
            "exchange_cap": exchange_cap,
        }
        for number, value in counts.items():
            if value < 1:
                raise UsageError(f"Conductor {number} must be at least 1 (got {value})")
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
        self.budget = budget or Budget()
        self.bounce_cap = bounce_cap
        self.exchange_cap = exchange_cap
        self.max_replans = max_replans
        self.name = name
        self.human = human
        self.escalation_timeout = escalation_timeout
        self.state_path = Path(state_path) if state_path else TeamDir(self.workdir).conductor_state
        self.state: ConductorState | None = None
        self.on_decision = on_decision  # e.g. to show progress as the run goes
        self.escalations = Escalations(team.mail, name, human, on_refusal=self._refused)
        self._busy: set[str] = set()
        self._shown = 0
        self._wave: anyio.CancelScope | None = None
        self.mail_watch = MailWatch(team, self.workers, exchange_cap)
        self._chatter: Chatter | None = None  # braked, not yet escalated

    # -- the run --

    async def run(self) -> ConductorState:
        """Run to an outcome: accepted, or the brake that stopped it."""
        await self.team.mail.add_member(self.human)
        await self.team.mail.add_member(self.name)
        await self.team.mail.open_inbox(self.name)  # its lease: a second conductor fails here
        failed: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.escalations.serve)
            tg.start_soon(self._watch)
            try:
                state = await self._run()
            except Exception as exc:  # raised as it is, not wrapped in the task group's group
                failed = exc
            tg.cancel_scope.cancel()
        if failed is not None:
            raise failed
        return state

    async def _run(self) -> ConductorState:
        state = ConductorState.load(self.state_path)
        if state is None or state.goal != self.goal:
            plan = self.plan or await make_plan(self._planner(), self.goal)
            state = ConductorState(
                goal=self.goal, plan=plan, statuses={s.id: "pending" for s in plan.subtasks}
            )
            state.decide("conductor", "plan", detail=f"{len(plan.subtasks)} subtasks")
        else:  # resuming: work that was in flight is taken back; accepted work stands
            if state.outcome is not None and state.outcome != "accepted":
                state.decide("conductor", "resume", detail=f"the last run ended: {state.outcome}")
                state.outcome = None
            for sid, status in state.statuses.items():
                if status not in ("done", "pending"):
                    state.statuses[sid] = advance(status, "take_back")
                    state.decide("conductor", "take back", sid, f"was {status} at the crash")
        self.state = state
        self.mail_watch.progress()
        self._save()
        while state.outcome is None:
            if all(v == "done" for v in state.statuses.values()):
                await self._accept_or_replan()
                continue
            if state.step >= self.step_cap:
                self._stop("step cap", f"step cap {self.step_cap} reached")
                break
            chosen = pick(state.plan, state.statuses, limit=self.parallel)
            if not chosen:
                self._stop("blocked", "nothing is ready and nothing runs")
                break
            async with anyio.create_task_group() as tg:
                self._wave = tg.cancel_scope
                for subtask in chosen:
                    tg.start_soon(self._see_through, subtask)
            self._wave = None
            if state.outcome is not None:
                self._take_back(f"the run stopped: {state.outcome}")
        self._save()
        return state

    async def _see_through(self, subtask: Subtask) -> None:
        """Rounds of work and checks for one subtask, until it is done or handed back."""
        state = self._state()
        sid = subtask.id
        feedback = ""
        verdict: Verdict | None = None
        while True:
            if not await self._may_spend():
                return
            if state.step >= self.step_cap:
                return  # the main loop records the brake
            failed = state.statuses[sid] in ("failed", "stuck")
            chatter = self._take_chatter(None) if failed else None
            if chatter is not None:
                if not await self._escalate(subtask, _circling(chatter.why), chatter.said):
                    return
                continue
            previous = state.assignees.get(sid)
            avoid = previous if verdict == "stuck" else None
            worker = self._worker_for(subtask, avoid=avoid, prefer=previous)
            if worker is None:
                await self._brake("no workers", "every worker has stopped or crashed")
                return
            bounced = self._bounced(sid, worker) if failed else None
            if bounced is not None:
                if not await self._escalate(subtask, bounced):
                    return
                continue
            state.step += 1
            self._move(sid, "assign" if state.statuses[sid] == "pending" else "retry")
            if previous is not None and previous != worker:
                state.handoffs[sid] = state.handoffs.get(sid, 0) + 1
            state.assignees[sid] = worker
            state.rounds[sid] = state.rounds.get(sid, 0) + 1
            state.decide("conductor", "assign", sid, f"to {worker}, round {state.rounds[sid]}")
            self._save()
            verdict, feedback, why, said = await self._attempt(subtask, worker, feedback)
            self._save()
            spent = not await self._may_spend()  # if so, the brake ends the wave
            if verdict == "done" or spent:
                return
            if why is None and state.rounds[sid] >= self.round_cap:
                why = f"it failed {state.rounds[sid]} rounds (round cap {self.round_cap})"
            if why is not None and not await self._escalate(subtask, why, said):
                return

    def _bounced(self, sid: str, worker: str) -> str | None:
        """Why giving `sid` to `worker` would be one handoff too many, if it would."""
        state = self._state()
        previous = state.assignees.get(sid)
        if previous is None or previous == worker:
            return None
        if state.handoffs.get(sid, 0) + 1 < self.bounce_cap:
            return None
        return _circling(
            f"it went from worker to worker {state.handoffs.get(sid, 0)} times and would go "
            f"from {previous} to {worker} again"
        )

    async def _attempt(
        self, subtask: Subtask, worker: str, feedback: str
    ) -> tuple[Verdict, str, str | None, tuple[str, ...]]:
        """One round: ask, check, integrate. The verdict, the feedback for the next round, why
        it must go to a human now (a brake or a check error) if it must, and what the workers
        said if chatter is why."""
        state = self._state()
        sid = subtask.id
        answer = await self._ask(worker, subtask, feedback)
        if answer.text is None:
            self._move(sid, "timeout")
            if answer.chatter is not None:
                chatter = answer.chatter
                state.decide("conductor", "stuck", sid, f"taken back: {chatter.why}")
                return "stuck", "", _circling(chatter.why), chatter.said
            state.decide("conductor", "stuck", sid, answer.failure)
            if answer.hung:
                await self._cancel(worker, f"hung on subtask {sid}: {answer.failure}")
            return "stuck", "The previous attempt did not finish.", None, ()
        self._move(sid, "submit")
        state.decide(worker, "submit", sid, answer.text[:300])
        evidence = await run_check(subtask.check, self.workdir, self.policy)
        self._record_check(sid, evidence)
        if evidence.error is not None:
            self._move(sid, "check_error")
            state.decide("conductor", "check error", sid, evidence.error, evidence)
            return "check_error", "", f"its check could not run: {evidence.error}", ()
        if not evidence.passed:
            self._move(sid, "fail")
            state.decide("conductor", "verify", sid, "check failed", evidence)
            return "failed", f"The check `{subtask.check}` failed:\n{evidence.tail}", None, ()
        self._move(sid, "pass")
        state.decide("conductor", "verify", sid, "check passed", evidence)
        check = state.plan.integration_check
        if check is None:
            self._move(sid, "integrate")
            state.decide("conductor", "integrate", sid, "no integration check")
            return "done", "", None, ()
        evidence = await run_check(check, self.workdir, self.policy)
        if evidence.error is not None:
            self._move(sid, "check_error")
            detail = f"integration: {evidence.error}"
            state.decide("conductor", "check error", sid, detail, evidence)
            why = f"the integration check could not run: {evidence.error}"
            return "check_error", "", why, ()
        if evidence.passed:
            self._move(sid, "integrate")
            state.decide("conductor", "integrate", sid, "integration check passed", evidence)
            return "done", "", None, ()
        self._move(sid, "conflict")
        state.decide("conductor", "conflict", sid, "integration check failed", evidence)
        feedback = (
            "Your piece passes its own check but breaks the integration check:\n" + evidence.tail
        )
        return "failed", feedback, None, ()

    async def _ask(self, worker: str, subtask: Subtask, feedback: str) -> _Answer:
        """Give the subtask to `worker` and wait for its answer, watching for chatter."""
        text = (
            f"Subtask {subtask.id}: {subtask.description}\n"
            f"When you are done, the conductor will run: {subtask.check}"
        )
        if feedback:
            text += f"\n\n{feedback}"
        answer = _Answer()
        result: TaskResult | None = None
        self._busy.add(worker)
        try:
            async with anyio.create_task_group() as tg:

                async def watch() -> None:
                    while answer.chatter is None:
                        await anyio.sleep(WATCH_INTERVAL)
                        answer.chatter = self._take_chatter(worker)
                    tg.cancel_scope.cancel()

                tg.start_soon(watch)
                try:
                    result = await self.team.ask(worker, text, timeout=self.subtask_timeout)
                except RequestTimeout:
                    answer.hung = True
                    answer.failure = f"{worker} did not answer within {self.subtask_timeout:g}s"
                except RemoteError as exc:
                    answer.failure = f"{worker} answered with an error: {exc.error_type}: {exc}"
                except TeammateGone as exc:
                    answer.failure = f"{worker} is gone: {exc}"
                tg.cancel_scope.cancel()
        finally:
            self._busy.discard(worker)
        if result is not None:
            state = self._state()
            state.tokens += result.tokens
            state.cost += result.cost or 0.0
            state.worker_steps += result.steps
            answer.text = result.answer or ""
        return answer

    async def _escalate(self, subtask: Subtask, why: str, said: Sequence[str] = ()) -> bool:
        """Ask the human; True if the subtask goes on (retry), False if it is settled."""
        state = self._state()
        sid = subtask.id
        self._move(sid, "escalate")
        tail = transcript_tail(state.decisions, sid, extra=said)
        evidence = next(
            (d.evidence for d in reversed(state.decisions) if d.subtask == sid and d.evidence),
            None,
        )
        request = self.escalations.question(question(sid, why, evidence, tail))
        command = self.escalations.command(request.id)
        state.decide(
            "conductor",
            "escalate",
            sid,
            f"{why}; asked {self.human} ({request.id}); answer with: {command}",
            evidence,
            tail,
        )
        self._save()
        log.warning("%s", announcement(sid, why, evidence, tail, command))
        answer = await self.escalations.ask(request, timeout=self.escalation_timeout)
        if answer is None:
            log.warning(
                "escalation %s: no answer within %gs: the run stops",
                request.id,
                self.escalation_timeout,
            )
            state.decide(
                "conductor",
                "no answer",
                sid,
                f"nobody answered within {self.escalation_timeout:g}s: abort",
            )
            answer = "abort"
        else:
            state.decide(self.human, f"answer: {answer}", sid)
        if answer == "retry":
            state.rounds[sid] = 0
            state.handoffs[sid] = 0
            self.mail_watch.progress()  # the human has seen it: the brakes count afresh
            self._save()
            return True
        if answer == "done":
            self._move(sid, "resolve")
            self._save()
            return False
        await self._brake("aborted", f"{self.human} aborted the run at subtask {sid}")
        return False

    async def _accept_or_replan(self) -> None:
        state = self._state()
        evidence = await run_check(state.plan.acceptance_check, self.workdir, self.policy)
        if evidence.error is not None:
            state.decide(
                "conductor",
                "check error",
                detail=f"the acceptance check could not run: {evidence.error}",
                evidence=evidence,
            )
            self._stop("check error", "the acceptance check could not run")
            log.warning(
                "the acceptance check could not run: %s (%s); the run stops with its state in %s",
                evidence.error,
                evidence.command,
                self.state_path,
            )
            return
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
        plan = await make_plan(
            self._planner(),
            self.goal,
            f"`{evidence.command}` exited with {evidence.exit_code}:\n{evidence.tail}",
        )
        state.plan = plan
        statuses: dict[str, str] = {}
        for s in plan.subtasks:  # unchanged done work stands; changed work starts again
            before = state.statuses.get(s.id, "pending")
            kept = before == "pending" or (before == "done" and old.get(s.id) == s)
            statuses[s.id] = before if kept else advance(before, "reset")
        state.statuses = statuses
        state.decide(
            "conductor", "replan", detail=f"replan {state.replans}: {len(plan.subtasks)} subtasks"
        )
        self._save()

    # -- brakes --

    async def _may_spend(self) -> bool:
        """Check the conductor's budget and the team's before an assignment; brake if spent."""
        state = self._state()
        if state.outcome is not None:
            return False
        try:
            self.budget.check(cost=state.cost, tokens=state.tokens, worker_steps=state.worker_steps)
            if self.team.budget is not None:
                await self.team.budget.check()
        except LimitExceeded as exc:
            await self._brake("budget", str(exc))
            return False
        return True

    async def _brake(self, outcome: str, detail: str) -> None:
        """Stop the run: record why, stop the workers still on its subtasks, end the wave."""
        if self._state().outcome is not None:
            return
        self._stop(outcome, detail)
        for worker in sorted(self._busy):
            await self._cancel(worker, f"the conductor stopped the run: {outcome}")
        if self._wave is not None:
            self._wave.cancel()

    def _stop(self, outcome: str, detail: str) -> None:
        state = self._state()
        state.outcome = outcome
        state.decide("conductor", "brake", detail=detail)
        self._save()
        if outcome != "aborted":
            log.warning("the conductor stopped the run (%s): %s", outcome, detail)

    def _take_back(self, why: str) -> None:
        state = self._state()
        for sid, status in state.statuses.items():
            if status not in ("done", "pending", "escalated"):
                state.statuses[sid] = advance(status, "take_back")
                state.decide("conductor", "take back", sid, f"was {status}: {why}")
        self._save()

    async def _cancel(self, worker: str, reason: str, *, idle_too: bool = False) -> None:
        """Stop a worker that is still working (hung, or braked), or any running one with
        `idle_too`; its restart policy decides what comes next."""
        status = self.team.status.get(worker)
        if (
            status is None
            or status.state not in ("working", "idle")
            or (status.state == "idle" and not idle_too)
        ):
            return  # idle already, between incarnations, or not ours to stop (remote)
        try:
            await self.team.cancel(worker, reason)
        except UsageError:
            return
        self._state().decide("conductor", "cancel", detail=f"{worker}: {reason}")

    async def _watch(self) -> None:
        """Until cancelled: stop workers that trade `exchange_cap` rounds of mail with no new
        check result; the next subtask of theirs to come up is escalated (`_take_chatter`)."""
        while True:
            await anyio.sleep(WATCH_INTERVAL)
            if self.state is None or self.state.outcome is not None:
                continue
            chatter = self.mail_watch.seen()
            if chatter is None:
                continue
            self.state.decide("conductor", "brake", detail=chatter.why)
            self._chatter = chatter
            for worker in sorted(chatter.talkers):
                await self._cancel(worker, f"braked: {chatter.why}", idle_too=True)
            self._save()

    def _take_chatter(self, asked: str | None) -> Chatter | None:
        """The chatter brake, for the subtask given to `asked` (one of the talkers) or for any
        subtask that comes up (None); once."""
        chatter = self._chatter
        if chatter is None or (asked is not None and asked not in chatter.talkers):
            return None
        self._chatter = None
        return chatter

    def _record_check(self, sid: str, evidence: Evidence) -> None:
        state = self._state()
        mark = fingerprint(evidence)
        if state.last_checks.get(sid) != mark:
            state.last_checks[sid] = mark
            state.handoffs[sid] = 0
            self.mail_watch.progress()

    def _refused(self, envelope: Envelope, why: str) -> None:
        log.warning("refused %s %s from %s: %s", envelope.kind, envelope.id, envelope.sender, why)
        if self.state is not None:
            self.state.decide("conductor", "refuse answer", detail=f"from {envelope.sender}: {why}")
            self._save()

    # -- bookkeeping --

    def _worker_for(
        self, subtask: Subtask, *, avoid: str | None = None, prefer: str | None = None
    ) -> str | None:
        """A free worker (a replica of the subtask's role, if it names a pool), not `avoid` if
        there is another, `prefer` if it is free; None when none is running."""
        if subtask.role is not None:
            candidates: Sequence[str] = self.team.pools.get(subtask.role, (subtask.role,))
        else:
            candidates = self.workers
        live = [
            w
            for w in candidates
            if w not in self.team.status or self.team.status[w].state not in ("crashed", "stopped")
        ]
        if not live:
            return None

        def rank(w: str) -> tuple[bool, bool, bool, bool]:
            status = self.team.status.get(w)
            idle = status is None or status.state == "idle"
            return (w in self._busy, w == avoid, w != prefer, not idle)

        return min(live, key=rank)

    def _planner(self) -> Model:
        assert self.planner is not None
        return self.planner

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
