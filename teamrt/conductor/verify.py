"""The checks that decide the work, run by the conductor itself: it never takes a worker's
word. A submitted subtask's own check, then the integration check for the seams (`verify`), and
when every subtask is done the acceptance check for the goal (`accept`). What each result means
is `teamrt.conductor.rules`'; here it is run, recorded with its evidence, and saved."""

from __future__ import annotations

import logging
from pathlib import Path

from teamrt.conductor.brakes import fingerprint
from teamrt.conductor.checks import Evidence, Policy, run_check
from teamrt.conductor.ledger import Ledger
from teamrt.conductor.plan import Subtask
from teamrt.conductor.rules import Ruling, check, integration
from teamrt.conductor.watch import MailWatch

log = logging.getLogger("teamrt.conductor")


class Verifier:
    """Runs checks in `workdir` under `policy`, recording each result in `ledger`; a new check
    result is progress for the brakes that watch the mail (`mail_watch`)."""

    def __init__(
        self, workdir: Path, policy: Policy, ledger: Ledger, mail_watch: MailWatch
    ) -> None:
        self.workdir = workdir
        self.policy = policy
        self.ledger = ledger
        self.mail_watch = mail_watch

    async def verify(self, subtask: Subtask, worker: str, text: str) -> Ruling:
        """`worker` submitted `subtask` with `text`: its check, then the integration check if it
        passes. The last ruling, which always has a verdict."""
        sid = subtask.id
        state = self.ledger.current
        self.ledger.move(sid, "submit")
        state.decide(worker, "submit", sid, text[:300])
        evidence = await run_check(subtask.check, self.workdir, self.policy)
        self._record_check(sid, evidence)
        ruling = self._apply(sid, check(subtask, evidence), evidence)
        if ruling.verdict is not None:
            return ruling
        command = state.plan.integration_check
        seams = None if command is None else await run_check(command, self.workdir, self.policy)
        return self._apply(sid, integration(seams), seams)

    async def accept(self) -> Evidence | None:
        """The acceptance check, every subtask being done: green accepts the run, a check error
        stops it; red (the plan was wrong) is recorded and returned, for a replan."""
        state = self.ledger.current
        evidence = await run_check(state.plan.acceptance_check, self.workdir, self.policy)
        if evidence.error is not None:
            state.decide(
                "conductor",
                "check error",
                detail=f"the acceptance check could not run: {evidence.error}",
                evidence=evidence,
            )
            self.ledger.stop("check error", "the acceptance check could not run")
            log.warning(
                "the acceptance check could not run: %s (%s); the run stops with its state in %s",
                evidence.error,
                evidence.command,
                self.ledger.path,
            )
            return None
        if evidence.passed:
            state.outcome = "accepted"
            state.decide("conductor", "accept", detail="acceptance check passed", evidence=evidence)
            self.ledger.save()
            return None
        state.decide(
            "conductor",
            "reject",
            detail="every subtask is done but the acceptance check is red: the plan was wrong",
            evidence=evidence,
        )
        return evidence

    def _apply(self, sid: str, ruling: Ruling, evidence: Evidence | None) -> Ruling:
        """Record a ruling on `sid`: its lifecycle move and its decision, with the evidence."""
        self.ledger.move(sid, ruling.event)
        self.ledger.current.decide("conductor", ruling.action, sid, ruling.detail, evidence)
        return ruling

    def _record_check(self, sid: str, evidence: Evidence) -> None:
        """A check result unlike the last one is progress: the brakes count afresh."""
        state = self.ledger.current
        mark = fingerprint(evidence)
        if state.last_checks.get(sid) != mark:
            state.last_checks[sid] = mark
            state.handoffs[sid] = 0
            self.mail_watch.progress()
