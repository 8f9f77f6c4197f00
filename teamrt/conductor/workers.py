"""The conductor's side of its workers: which one is free for a subtask, giving it the subtask
and waiting for its answer, cancelling one that hangs or is braked, and the chatter brake that
stops workers trading mail with no new check result."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from teamrt.conductor.ledger import Ledger
from teamrt.conductor.plan import Subtask
from teamrt.conductor.watch import Chatter, MailWatch
from teamrt.errors import RemoteError, RequestTimeout, TeammateGone, UsageError
from teamrt.team import TaskResult, Team

#: How often the conductor looks at its workers while it waits for an answer (seconds).
WATCH_INTERVAL = 0.05


@dataclass
class Answer:
    """How asking a worker went: its answer, or why there is none."""

    text: str | None = None
    failure: str = ""
    hung: bool = False  # no answer in time: the worker is cancelled
    chatter: Chatter | None = None  # the chatter brake stopped it


class Workers:
    """The teammates `names` of `team` as the conductor's workers; `timeout` is how long one
    has to answer, `exchange_cap` the rounds of mail among them before the chatter brake."""

    def __init__(
        self,
        team: Team,
        names: Sequence[str],
        *,
        timeout: float,
        exchange_cap: int,
        ledger: Ledger,
    ) -> None:
        self.team = team
        self.names = list(names)
        self.timeout = timeout
        self.ledger = ledger
        self.mail_watch = MailWatch(team, self.names, exchange_cap)
        self.busy: set[str] = set()
        self._chatter: Chatter | None = None  # braked, not yet escalated

    def free_for(
        self, subtask: Subtask, *, avoid: str | None = None, prefer: str | None = None
    ) -> str | None:
        """A free worker (a replica of the subtask's role, if it names a pool), not `avoid` if
        there is another, `prefer` if it is free; None when none is running."""
        if subtask.role is not None:
            candidates: Sequence[str] = self.team.pools.get(subtask.role, (subtask.role,))
        else:
            candidates = self.names
        status = self.team.status
        live = [w for w in candidates if w not in status or status[w].state not in _ENDED]
        if not live:
            return None

        def rank(w: str) -> tuple[bool, bool, bool, bool]:
            worker = status.get(w)
            idle = worker is None or worker.state == "idle"
            return (w in self.busy, w == avoid, w != prefer, not idle)

        return min(live, key=rank)

    async def ask(self, worker: str, subtask: Subtask, feedback: str) -> Answer:
        """Give the subtask to `worker` and wait for its answer, watching for chatter."""
        text = (
            f"Subtask {subtask.id}: {subtask.description}\n"
            f"When you are done, the conductor will run: {subtask.check}"
        )
        if feedback:
            text += f"\n\n{feedback}"
        answer = Answer()
        result: TaskResult | None = None
        self.busy.add(worker)
        try:
            async with anyio.create_task_group() as tg:

                async def watch() -> None:
                    while answer.chatter is None:
                        await anyio.sleep(WATCH_INTERVAL)
                        answer.chatter = self.take_chatter(worker)
                    tg.cancel_scope.cancel()

                tg.start_soon(watch)
                try:
                    result = await self.team.ask(worker, text, timeout=self.timeout)
                except RequestTimeout:
                    answer.hung = True
                    answer.failure = f"{worker} did not answer within {self.timeout:g}s"
                except RemoteError as exc:
                    answer.failure = f"{worker} answered with an error: {exc.error_type}: {exc}"
                except TeammateGone as exc:
                    answer.failure = f"{worker} is gone: {exc}"
                tg.cancel_scope.cancel()
        finally:
            self.busy.discard(worker)
        if result is not None:
            state = self.ledger.current
            state.tokens += result.tokens
            state.cost += result.cost or 0.0
            state.worker_steps += result.steps
            answer.text = result.answer or ""
        return answer

    async def cancel(self, worker: str, reason: str, *, idle_too: bool = False) -> None:
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
        self.ledger.current.decide("conductor", "cancel", detail=f"{worker}: {reason}")

    async def cancel_busy(self, reason: str) -> None:
        """Stop every worker still on one of the conductor's subtasks."""
        for worker in sorted(self.busy):
            await self.cancel(worker, reason)

    async def watch(self) -> None:
        """Until cancelled: stop workers that trade `exchange_cap` rounds of mail with no new
        check result; the next subtask of theirs to come up is escalated (`take_chatter`)."""
        while True:
            await anyio.sleep(WATCH_INTERVAL)
            state = self.ledger.state
            if state is None or state.outcome is not None:
                continue
            chatter = self.mail_watch.seen()
            if chatter is None:
                continue
            state.decide("conductor", "brake", detail=chatter.why)
            self._chatter = chatter
            for worker in sorted(chatter.talkers):
                await self.cancel(worker, f"braked: {chatter.why}", idle_too=True)
            self.ledger.save()

    def take_chatter(self, asked: str | None) -> Chatter | None:
        """The chatter brake, for the subtask given to `asked` (one of the talkers) or for any
        subtask that comes up (None); once."""
        chatter = self._chatter
        if chatter is None or (asked is not None and asked not in chatter.talkers):
            return None
        self._chatter = None
        return chatter


_ENDED = ("crashed", "stopped")
