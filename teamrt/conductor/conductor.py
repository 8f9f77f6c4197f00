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

The parts. `Conductor` is the async driver: the waves, a subtask's rounds, escalation, replanning
and the brakes. What comes next and what a check's result means are `rules.Rules` and its
rulings, pure; the run's state and its saving are `ledger.Ledger`; choosing, asking and
cancelling workers and the chatter brake are `workers.Workers`; running the checks is
`verify.Verifier`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio

from teamrt.conductor.brakes import Budget, transcript_tail
from teamrt.conductor.checks import Evidence, Policy
from teamrt.conductor.escalation import Escalations, announcement, question
from teamrt.conductor.ledger import Ledger
from teamrt.conductor.plan import Plan, Subtask, advance
from teamrt.conductor.planner import make_plan
from teamrt.conductor.rules import Accept, Rules, Stop, Verdict, circling, replanned
from teamrt.conductor.state import ConductorState, Decision
from teamrt.conductor.verify import Verifier
from teamrt.conductor.workers import WATCH_INTERVAL as WATCH_INTERVAL
from teamrt.conductor.workers import Workers
from teamrt.envelopes import Envelope
from teamrt.errors import LimitExceeded, UsageError
from teamrt.models.base import Model
from teamrt.team import Team
from teamrt.teamdir import TeamDir

log = logging.getLogger("teamrt.conductor")

__all__ = ["WATCH_INTERVAL", "Conductor", "Verdict"]

#: A round's verdict, the feedback for the next round, why it must go to a human now (a brake
#: or a check error) if it must, and what the workers said if chatter is why.
Round = tuple[Verdict, str, str | None, tuple[str, ...]]


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
        self.rules = Rules(parallel, step_cap, round_cap, bounce_cap)
        self.ledger = Ledger(self.state_path, on_decision)
        self.escalations = Escalations(team.mail, name, human, on_refusal=self._refused)
        self.pool = Workers(
            team,
            self.workers,
            timeout=subtask_timeout,
            exchange_cap=exchange_cap,
            ledger=self.ledger,
        )
        self.mail_watch = self.pool.mail_watch
        self.verifier = Verifier(self.workdir, policy, self.ledger, self.mail_watch)
        self._wave: anyio.CancelScope | None = None

    @property
    def state(self) -> ConductorState | None:
        """The run's state: None until `run` loads or makes it."""
        return self.ledger.state

    @property
    def on_decision(self) -> Callable[[Decision], None] | None:
        """Called with every decision as it is saved (e.g. to show progress as the run goes)."""
        return self.ledger.on_decision

    @on_decision.setter
    def on_decision(self, callback: Callable[[Decision], None] | None) -> None:
        self.ledger.on_decision = callback

    # -- the run --

    async def run(self) -> ConductorState:
        """Run to an outcome: accepted, or the brake that stopped it."""
        await self.team.mail.add_member(self.human)
        await self.team.mail.add_member(self.name)
        await self.team.mail.open_inbox(self.name)  # its lease: a second conductor fails here
        failed: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.escalations.serve)
            tg.start_soon(self.pool.watch)
            try:
                state = await self._run()
            except Exception as exc:  # raised as it is, not wrapped in the task group's group
                failed = exc
            tg.cancel_scope.cancel()
        if failed is not None:
            raise failed
        return state

    async def _run(self) -> ConductorState:
        state = await self._load()
        self.ledger.state = state
        self.mail_watch.progress()
        self.ledger.save()
        while state.outcome is None:
            step = self.rules.next(state)
            if isinstance(step, Accept):
                await self._accept_or_replan()
                continue
            if isinstance(step, Stop):
                self.ledger.stop(step.outcome, step.detail)
                break
            async with anyio.create_task_group() as tg:
                self._wave = tg.cancel_scope
                for subtask in step.subtasks:
                    tg.start_soon(self._see_through, subtask)
            self._wave = None
            if state.outcome is not None:
                self.ledger.take_back(f"the run stopped: {state.outcome}")
        self.ledger.save()
        return state

    async def _load(self) -> ConductorState:
        """The state to run from: the saved one if it is for this goal, else a new plan's."""
        state = ConductorState.load(self.state_path)
        if state is None or state.goal != self.goal:
            plan = self.plan or await make_plan(self._planner(), self.goal)
            state = ConductorState(
                goal=self.goal, plan=plan, statuses={s.id: "pending" for s in plan.subtasks}
            )
            state.decide("conductor", "plan", detail=f"{len(plan.subtasks)} subtasks")
            return state
        # resuming: work that was in flight is taken back; accepted work stands
        if state.outcome is not None and state.outcome != "accepted":
            state.decide("conductor", "resume", detail=f"the last run ended: {state.outcome}")
            state.outcome = None
        for sid, status in state.statuses.items():
            if status not in ("done", "pending"):
                state.statuses[sid] = advance(status, "take_back")
                state.decide("conductor", "take back", sid, f"was {status} at the crash")
        return state

    async def _see_through(self, subtask: Subtask) -> None:
        """Rounds of work and checks for one subtask, until it is done or handed back."""
        state = self.ledger.current
        sid = subtask.id
        feedback = ""
        verdict: Verdict | None = None
        while True:
            if not await self._may_spend():
                return
            if state.step >= self.step_cap:
                return  # the main loop records the brake
            failed = state.statuses[sid] in ("failed", "stuck")
            chatter = self.pool.take_chatter(None) if failed else None
            if chatter is not None:
                if not await self._escalate(subtask, circling(chatter.why), chatter.said):
                    return
                continue
            previous = state.assignees.get(sid)
            avoid = previous if verdict == "stuck" else None
            worker = self.pool.free_for(subtask, avoid=avoid, prefer=previous)
            if worker is None:
                await self._brake("no workers", "every worker has stopped or crashed")
                return
            bounced = self.rules.bounced(state, sid, worker) if failed else None
            if bounced is not None:
                if not await self._escalate(subtask, bounced):
                    return
                continue
            self._assign(sid, worker)
            verdict, feedback, why, said = await self._attempt(subtask, worker, feedback)
            self.ledger.save()
            spent = not await self._may_spend()  # if so, the brake ends the wave
            if verdict == "done" or spent:
                return
            if why is None:
                why = self.rules.capped(state, sid)
            if why is not None and not await self._escalate(subtask, why, said):
                return

    def _assign(self, sid: str, worker: str) -> None:
        """Record a new round of `sid`, given to `worker`."""
        state = self.ledger.current
        state.step += 1
        self.ledger.move(sid, "assign" if state.statuses[sid] == "pending" else "retry")
        previous = state.assignees.get(sid)
        if previous is not None and previous != worker:
            state.handoffs[sid] = state.handoffs.get(sid, 0) + 1
        state.assignees[sid] = worker
        state.rounds[sid] = state.rounds.get(sid, 0) + 1
        state.decide("conductor", "assign", sid, f"to {worker}, round {state.rounds[sid]}")
        self.ledger.save()

    async def _attempt(self, subtask: Subtask, worker: str, feedback: str) -> Round:
        """One round: ask, check, integrate (see `Round`)."""
        state = self.ledger.current
        sid = subtask.id
        answer = await self.pool.ask(worker, subtask, feedback)
        if answer.text is None:
            self.ledger.move(sid, "timeout")
            if answer.chatter is not None:
                chatter = answer.chatter
                state.decide("conductor", "stuck", sid, f"taken back: {chatter.why}")
                return "stuck", "", circling(chatter.why), chatter.said
            state.decide("conductor", "stuck", sid, answer.failure)
            if answer.hung:
                await self.pool.cancel(worker, f"hung on subtask {sid}: {answer.failure}")
            return "stuck", "The previous attempt did not finish.", None, ()
        ruling = await self.verifier.verify(subtask, worker, answer.text)
        assert ruling.verdict is not None  # the last check's ruling always has one
        return ruling.verdict, ruling.feedback, ruling.why, ()

    async def _escalate(self, subtask: Subtask, why: str, said: Sequence[str] = ()) -> bool:
        """Ask the human; True if the subtask goes on (retry), False if it is settled."""
        state = self.ledger.current
        sid = subtask.id
        self.ledger.move(sid, "escalate")
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
        self.ledger.save()
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
            self.ledger.save()
            return True
        if answer == "done":
            self.ledger.move(sid, "resolve")
            self.ledger.save()
            return False
        await self._brake("aborted", f"{self.human} aborted the run at subtask {sid}")
        return False

    async def _accept_or_replan(self) -> None:
        """The acceptance check; if it is red, a new plan while the planner may make one."""
        evidence = await self.verifier.accept()
        if evidence is None:
            return
        state = self.ledger.current
        if self.planner is None or state.replans >= self.max_replans:
            state.outcome = "acceptance failed"
            self.ledger.save()
            return
        await self._replan(evidence)

    async def _replan(self, evidence: Evidence) -> None:
        """A new plan from the planner, given the red acceptance check."""
        state = self.ledger.current
        state.replans += 1
        plan = await make_plan(
            self._planner(),
            self.goal,
            f"`{evidence.command}` exited with {evidence.exit_code}:\n{evidence.tail}",
        )
        state.statuses = replanned(state.plan, plan, state.statuses)
        state.plan = plan
        state.decide(
            "conductor", "replan", detail=f"replan {state.replans}: {len(plan.subtasks)} subtasks"
        )
        self.ledger.save()

    # -- brakes --

    async def _may_spend(self) -> bool:
        """Check the conductor's budget and the team's before an assignment; brake if spent."""
        state = self.ledger.current
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
        if self.ledger.current.outcome is not None:
            return
        self.ledger.stop(outcome, detail)
        await self.pool.cancel_busy(f"the conductor stopped the run: {outcome}")
        if self._wave is not None:
            self._wave.cancel()

    def _refused(self, envelope: Envelope, why: str) -> None:
        log.warning("refused %s %s from %s: %s", envelope.kind, envelope.id, envelope.sender, why)
        if self.ledger.state is not None:
            detail = f"from {envelope.sender}: {why}"
            self.ledger.state.decide("conductor", "refuse answer", detail=detail)
            self.ledger.save()

    def _planner(self) -> Model:
        assert self.planner is not None
        return self.planner
