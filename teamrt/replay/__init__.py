"""Replay: a team directory read back as one timeline, with requests joined to their answers.

Theory of operation. Each inbox (every segment, in file order) is read as a stream of lines,
framed by the mail codec's splitter and parsed as plain JSON (no model validation: a replay must
show whatever is in the files, and be fast). The per-inbox streams, and the stop, crash and cancel
lines of the agents' journals, are merged by time; the conductor's decisions (which carry no
time) are placed at the envelopes that carried them out. A `Joiner` pairs each response with its
request (latency, late answers, second answers) and flags duplicates and undecodable lines as
they pass; requests still open at the end are reported as unanswered (or timed out, when their
deadline has passed). A `Summary` counts only the events a `Filter` keeps. Memory stays flat:
only open requests and bounded windows of recent ids are kept, never the timeline itself.

This module only reads: it takes no lock and writes nothing.
"""

from teamrt.replay.events import AGENT_KINDS, ENVELOPE_KINDS, OTHERS, Event
from teamrt.replay.summary import AgentCounts, Summary
from teamrt.replay.timeline import (
    Filter,
    Joiner,
    finish,
    members,
    read_inbox,
    select,
    timeline,
)

__all__ = [
    "AGENT_KINDS",
    "ENVELOPE_KINDS",
    "OTHERS",
    "AgentCounts",
    "Event",
    "Filter",
    "Joiner",
    "Summary",
    "finish",
    "members",
    "read_inbox",
    "select",
    "timeline",
]
