"""What the events a filter kept add up to: counted one event at a time, in bounded memory."""

from __future__ import annotations

from dataclasses import dataclass, field

from teamrt.replay.events import AGENT_KINDS, OTHERS, WINDOW, Event

_AGENTS = 256  # agents counted one by one in a summary; any more are counted together
# every other kind is an envelope's: a line of an unknown kind (hand-made, or from a newer
# teamrt) is counted as the envelope it claims to be
_NOT_ENVELOPES = AGENT_KINDS | {"corrupt", "decision"}


@dataclass(slots=True)
class AgentCounts:
    sent: int = 0
    received: int = 0
    unanswered: int = 0  # requests sent to it that nobody answered
    errors: int = 0  # error responses it sent
    crashes: int = 0
    cancels: int = 0
    stops: int = 0
    flagged: int = 0


@dataclass(slots=True)
class Summary:
    """What the events a filter kept add up to (all of them, without a filter)."""

    events: int = 0
    envelopes: int = 0
    requests: int = 0
    answered: int = 0
    unanswered: list[Event] = field(default_factory=list)
    timed_out: int = 0
    late: int = 0
    errors: int = 0
    duplicates: int = 0
    answered_twice: int = 0
    corrupt: int = 0  # undecodable lines: the ones the inbox's owner quarantines
    crashes: int = 0
    cancels: int = 0
    stops: int = 0
    decisions: int = 0
    escalations: int = 0
    flagged: int = 0
    agents: dict[str, AgentCounts] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)  # a sample, for percentiles
    #: where the reading of each inbox stopped (the position after its last record read): the
    #: timeline holds every record before it, none skipped, whatever was written meanwhile
    read_to: dict[str, tuple[int, int]] = field(default_factory=dict)

    def latency_percentile(self, p: float) -> float | None:
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]

    def agent(self, name: str) -> AgentCounts:
        counts = self.agents.get(name)
        if counts is None:
            name = name if len(self.agents) < _AGENTS else OTHERS
            counts = self.agents.setdefault(name, AgentCounts())
        return counts

    def count(self, e: Event) -> None:
        """Add one event (with the flags it has so far; `unanswered` comes at the end)."""
        self.events += 1
        kind, flags, agents = e.kind, e.flags, self.agents
        if flags:
            self.flagged += 1
            self.agent(e.sender if kind != "corrupt" else e.inbox).flagged += 1
        if kind not in _NOT_ENVELOPES:  # the usual case first
            self.envelopes += 1
            (agents.get(e.sender) or self.agent(e.sender)).sent += 1
            (agents.get(e.inbox) or self.agent(e.inbox)).received += 1
            if flags and "duplicate" in flags:
                self.duplicates += 1
                return
            if kind == "request":
                self.requests += 1
            if e.latency is not None:
                self.answered += 1
                if len(self.latencies) < WINDOW:
                    self.latencies.append(e.latency)
            if flags:
                self.late += "late" in flags
                self.answered_twice += "answered twice" in flags
                if "error" in flags:
                    self.errors += 1
                    self.agent(e.sender).errors += 1
            return
        if kind == "corrupt":
            self.corrupt += 1
        elif kind in AGENT_KINDS:
            who = self.agent(e.sender)
            if kind == "crash":
                self.crashes += 1
                who.crashes += 1
            elif kind == "cancel":
                self.cancels += 1
                who.cancels += 1
            else:
                self.stops += 1
                who.stops += 1
        elif kind == "decision":
            self.decisions += 1
            self.escalations += "escalation" in flags

    def count_unanswered(self, request: Event, was_flagged: bool) -> None:
        self.unanswered.append(request)
        self.timed_out += "timed out" in request.flags
        self.agent(request.inbox).unanswered += 1
        if not was_flagged:
            self.flagged += 1
            self.agent(request.sender).flagged += 1
