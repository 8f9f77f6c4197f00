"""The researcher/writer demo: two teammates, linked only by their inbox files.

The researcher reads the notes shipped with the demo (real files, through a tool) and sends its
findings to the writer as a request; the writer writes `agent-loop.md` into a scratch directory
(a real file, through a tool) and its result goes back to the researcher, whose answer goes back
to the lead. Offline, each teammate's model is a function that decides from what its tools
returned; `model="openai"` gives both an `OpenAIModel` instead (OPENAI_API_KEY, OPENAI_MODEL and,
for any OpenAI-compatible server, OPENAI_BASE_URL).

`researcher` and `writer` are importable specs for `teamrt run-agent --spec`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from teamrt.agents import tool
from teamrt.mail import FileMailboxes
from teamrt.models import ChatMessage, FunctionModel, Model, ModelReply, ToolSpec, call, calls
from teamrt.replay import timeline
from teamrt.team import Team, Teammate

NOTES = Path(__file__).with_name("notes")
TEAM = "research-writer"
TASK = (
    "Research the agent loop from the notes, then have the writer write agent-loop.md "
    "from your findings."
)


def _scratch() -> Path:
    return Path(os.environ.get("TEAMRT_DEMO_SCRATCH", "mailboxes/research-writer-scratch"))


# --- tools: they touch real files ---------------------------------------------------------------


@tool
def list_notes() -> list[str]:
    """The names of the notes you can read."""
    return sorted(p.name for p in NOTES.glob("*.md"))


@tool
def read_note(name: str) -> str:
    """The text of one note."""
    path = (NOTES / name).resolve()
    if path.parent != NOTES.resolve() or not path.is_file():
        raise FileNotFoundError(f"no note named {name!r}")
    return path.read_text()


@tool
def write_file(name: str, content: str) -> str:
    """Write a markdown file into the scratch directory."""
    if "/" in name or name.startswith(".") or not name.endswith(".md"):
        raise ValueError(f"{name!r}: write a plain .md file name")
    scratch = _scratch()
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / name).write_text(content)
    return f"wrote {scratch / name} ({len(content.split())} words)"


# --- offline models: functions that decide from what the tools returned -------------------------


def _last_tool_results(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    out = []
    for m in reversed(messages):
        if m.role != "tool":
            break
        out.append(m)
    return out[::-1]


def researcher_brain(
    messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
) -> ModelReply | str:
    results = _last_tool_results(messages)
    if not results:
        return call("list_notes")
    if results[0].name == "list_notes":
        names = json.loads(results[0].content or "[]")
        return calls(*(call("read_note", name=n) for n in names))
    if results[0].name == "read_note":
        findings = []
        for m in results:
            lines = [ln.strip() for ln in (m.content or "").splitlines() if ln.strip()]
            title = lines[0].lstrip("# ") if lines else "Note"
            findings.append(f"{title}: " + " ".join(lines[1:3]))
        return call(
            "request", to="writer", text="Findings:\n- " + "\n- ".join(findings), timeout=60
        )
    answer = json.loads(results[0].content or "{}").get("answer", {})
    return f"Findings sent to the writer, who reports: {answer.get('answer')}"


def writer_brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
    results = _last_tool_results(messages)
    if results:
        return f"Done: {results[0].content}"
    task = next(m.content or "" for m in messages if m.role == "user")
    points = [line[2:] for line in task.splitlines() if line.startswith("- ")]
    sections = []
    for point in points:
        title, _, text = point.partition(": ")
        sections.append(f"## {title}\n\n{text}\n")
    document = "# The agent loop\n\n" + "\n".join(sections)
    return call("write_file", name="agent-loop.md", content=document)


def _model(kind: str, brain: Any, name: str) -> Model:
    if kind == "openai":
        from teamrt.models import OpenAIModel

        return OpenAIModel()
    return FunctionModel(brain, name=name)


def teammates(model: str = "offline") -> list[Teammate]:
    return [
        Teammate(
            "researcher",
            lambda: _model(model, researcher_brain, "researcher-offline"),
            instructions="You research from the notes (list_notes, read_note), then send "
            "your findings to the writer with the request tool, as bullet "
            "lines starting with '- Title: '. Answer with what the writer "
            "reported.",
            tools=[list_notes, read_note],
        ),
        Teammate(
            "writer",
            lambda: _model(model, writer_brain, "writer-offline"),
            instructions="You turn findings into agent-loop.md with write_file: a title "
            "and one section per finding. Answer with what you wrote.",
            tools=[write_file],
        ),
    ]


researcher, writer = teammates()


# --- the run ------------------------------------------------------------------------------------


def _command() -> str:
    """How the user ran teamrt (`.venv/bin/teamrt` after `make demo`), to print commands
    they can paste."""
    invoked = Path(sys.argv[0])
    if invoked.name == "teamrt":
        relative = os.path.relpath(invoked)
        return relative if "/" in relative and not relative.startswith("..") else "teamrt"
    return "teamrt"


def _preview(body: Any) -> str:
    text = body if isinstance(body, str) else json.dumps(body)
    text = " ".join(text.split())
    return text if len(text) <= 70 else text[:67] + "..."


async def run(
    root: Path, model: str = "offline", live: bool = True, two_process: bool = False
) -> int:
    """Run the demo; with `two_process`, the writer runs in a child process (`run-agent`)."""
    from teamrt.cli.live import live_view

    team_dir = root / TEAM
    for directory in (team_dir, _scratch()):
        if directory.exists():
            shutil.rmtree(directory)  # the demo's own files from an earlier run
    local = teammates(model)
    remote: list[str] = []
    child = None
    async with FileMailboxes(team_dir, members=["lead", "researcher", "writer"]) as mail:
        if two_process:
            local, remote = local[:1], ["writer"]
            child = await anyio.open_process(
                [
                    sys.executable,
                    "-m",
                    "teamrt",
                    "run-agent",
                    str(team_dir),
                    "--name",
                    "writer",
                    "--spec",
                    "teamrt.demos.research_writer:writer",
                ],
                stdout=None,
                stderr=None,
            )
            print(f"lead: started the writer as process {child.pid}")
        async with (
            Team(mail, local, agent_dir=team_dir / "agents", remote=remote) as team,
            anyio.create_task_group() as tg,
        ):
            if live:
                tg.start_soon(live_view, team)
            result = await team.ask("researcher", TASK, timeout=120)
            tg.cancel_scope.cancel()
        if child is not None:
            with anyio.fail_after(30):
                code = await child.wait()
            print(f"lead: the writer's process exited with code {code}")
    print(f"\nresearcher's answer: {result.answer}")
    print(f"({result.stop_reason}: {result.steps} steps, {result.tool_calls} tool calls)\n")
    print("What travelled through the inboxes:")
    start = None
    for e in timeline(team_dir):  # teamrt.replay: every inbox, merged by send time
        start = start if start is not None else e.ts
        print(
            f"  +{(e.ts - start) * 1000:7.1f} ms  {e.sender:>10} -> {e.recipient:<10} "
            f"{e.kind:9} {e.type:15} {_preview(e.body)}"
        )
    document = _scratch() / "agent-loop.md"
    print(f"\nThe writer wrote {document} ({len(document.read_text().split())} words).")
    print(f"Inbox files: {team_dir / 'inboxes'}; transcripts: {team_dir / 'agents'}")
    command = _command()
    print(f"Look at the team:  {command} inspect {team_dir}")
    print(f"Replay the run:    {command} replay {team_dir}   (--format html -o run.html: a page)")
    return 0 if result.stop_reason == "answer" else 1
