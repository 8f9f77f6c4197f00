"""The researcher/writer demo: two teammates, linked only by their inbox files.

The researcher reads the notes shipped with the demo (real files, through a tool) and sends its
findings to the writer as a request; the writer writes `agent-loop.md` into a scratch directory
(a real file, through a tool) and its result goes back to the researcher, whose answer goes back
to the lead. Offline, each teammate's model is a function that decides from what its tools
returned; `model="openai"` gives both an `OpenAIModel` instead (OPENAI_MODEL, OPENAI_API_KEY and,
for any OpenAI-compatible server, OPENAI_BASE_URL; prices from TEAMRT_PRICES).

`researcher` and `writer` are importable specs for `teamrt run-agent --spec`: functions that
build the teammate on the model named by TEAMRT_DEMO_MODEL (the two-process demo sets it for the
writer's process). A run ends with every agent's stop report; a run that stopped early (a model
error, a writer that never wrote its file) ends with one line saying so and exit code 1.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import anyio

from teamrt.agents import tool
from teamrt.demos import real
from teamrt.demos.workspace import claim
from teamrt.errors import TeamrtError
from teamrt.mail import open_mailboxes
from teamrt.mail.locator import describe
from teamrt.models import ChatMessage, ModelReply, ToolSpec, call, calls
from teamrt.private_files import write_private
from teamrt.replay import timeline
from teamrt.team import TaskResult, Team, Teammate
from teamrt.teamdir import TeamDir

NOTES = Path(__file__).with_name("notes")
TEAM = "research-writer"
SCRATCH_VARIABLE = "TEAMRT_DEMO_SCRATCH"
TASK = (
    "Research the agent loop from the notes, then have the writer write agent-loop.md "
    "from your findings."
)


#: The scratch directory of the demo running in this context (set by `run` for its teammates).
_SCRATCH: ContextVar[Path | None] = ContextVar("teamrt_demo_scratch", default=None)


def scratch_dir() -> Path:
    """Where the writer writes: TEAMRT_DEMO_SCRATCH; else, in a demo run, scratch/ of the
    demo's directory; else mailboxes/research-writer/scratch."""
    chosen = os.environ.get(SCRATCH_VARIABLE)
    if chosen:
        return Path(chosen)
    return _SCRATCH.get() or TeamDir(Path("mailboxes", TEAM)).scratch


@contextmanager
def scratch_in(directory: Path) -> Iterator[Path]:
    """Within this block (and the tasks it starts), the writer writes into `directory`
    unless TEAMRT_DEMO_SCRATCH names another. Yields where it writes."""
    token = _SCRATCH.set(directory)
    try:
        yield scratch_dir()
    finally:
        _SCRATCH.reset(token)


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
    scratch = scratch_dir()
    write_private(scratch / name, content)  # 0600 in 0700 directories, whatever the umask
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
    if not isinstance(answer, dict):  # the request failed: the tool's error is the content
        return f"The writer could not be asked: {results[0].content}"
    if answer.get("stop_reason", "answer") != "answer":
        return f"The writer stopped early ({answer.get('stop_reason')}): {answer.get('detail')}"
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


RESEARCHER = (
    "You research from the notes (list_notes, read_note), then send your findings to the "
    "writer with the request tool, as bullet lines starting with '- Title: '. Answer with "
    "what the writer reported."
)
WRITER = (
    "You turn findings into agent-loop.md with write_file: a title and one section per "
    "finding. Answer with what you wrote."
)


def teammates(model: str = "offline") -> list[Teammate]:
    """The researcher and the writer, on `model` ("offline" or "openai"), priced from
    TEAMRT_PRICES."""
    prices = real.prices()
    return [
        Teammate(
            "researcher",
            lambda: real.make_model(model, researcher_brain, "researcher-offline"),
            instructions=RESEARCHER,
            tools=[list_notes, read_note],
            prices=prices,
        ),
        Teammate(
            "writer",
            lambda: real.make_model(model, writer_brain, "writer-offline"),
            instructions=WRITER,
            tools=[write_file],
            prices=prices,
        ),
    ]


def researcher() -> Teammate:
    """The researcher on the model TEAMRT_DEMO_MODEL names (offline by default)."""
    return teammates(real.choice_from_env())[0]


def writer() -> Teammate:
    """The writer on the model TEAMRT_DEMO_MODEL names (offline by default)."""
    return teammates(real.choice_from_env())[1]


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


#: Seconds the lead waits for the researcher: a real model makes five or six calls, and the
#: writer's among them.
ASK_TIMEOUT = 300.0
DOCUMENT = "agent-loop.md"


async def run(
    root: Path,
    model: str = "offline",
    live: bool = True,
    two_process: bool = False,
    store: str | None = None,
) -> int:
    """Run the demo in `root`/research-writer/ (the team, the agents' journals in agents/, the
    writer's files in scratch/); with `two_process`, the writer runs in a child process
    (`run-agent`). `store`: a store URL (Redis) for the team's inboxes instead of files (the
    journals and scratch/ stay in the directory). 0 when the writer wrote its file and every
    agent answered; otherwise 1, after the stop reports and one line saying what went wrong.
    `MemberBusy` if the directory is in use by a run that has not ended."""
    await real.check_environment(model)
    team_dir = root / TEAM
    what = "the team's agents/ journals and the writer's scratch/"
    if store is None:
        what = "the team's inboxes/, " + what
    layout = TeamDir(team_dir)
    with claim(team_dir, "research-writer", what=what), scratch_in(layout.scratch) as scratch:
        (scratch / DOCUMENT).unlink(missing_ok=True)  # a TEAMRT_DEMO_SCRATCH of an earlier run
        if store is not None:
            await real.fresh_team(store)  # the demo's own inboxes from an earlier run
        return await _run(team_dir, store, model, live, two_process)


async def _run(team_dir: Path, store: str | None, model: str, live: bool, two_process: bool) -> int:
    from teamrt.demos.live import live_view

    layout = TeamDir(team_dir)
    local = teammates(model)
    remote: list[str] = []
    result: TaskResult | None = None
    failure: str | None = None
    code = 0
    where = store or str(team_dir)
    async with open_mailboxes(where, members=["lead", "researcher", "writer"]) as mail:
        child = await _start_writer(where, layout.agents.path, model) if two_process else None
        if child is not None:
            local, remote = local[:1], ["writer"]
        try:
            async with (
                Team(mail, local, agent_dir=layout.agents.path, remote=remote) as team,
                anyio.create_task_group() as tg,
            ):
                if live:
                    tg.start_soon(live_view, team)
                try:
                    result = await team.ask("researcher", TASK, timeout=ASK_TIMEOUT)
                except TeamrtError as exc:  # no answer in time, or an error answer
                    failure = f"the researcher gave no result: {exc}"
                tg.cancel_scope.cancel()
        finally:
            if child is not None:
                code = await _stop(child)
    if result is not None:
        print(f"\nresearcher's answer: {result.answer}")
    print()
    found = real.print_reports(where, ["researcher", "writer"], layout.agents.path)
    _print_timeline(where)
    document = _print_where(team_dir, store)
    failure = failure or real.first_failure(found, ["researcher", "writer"])
    if failure is None and code != 0:
        failure = f"the writer's process exited with code {code}"
    if failure is None and not document.exists():
        failure = _why_no_document(found)
    return real.fail(failure) if failure is not None else 0


def _print_where(team_dir: Path, store: str | None) -> Path:
    """Say where the run's files are and how to look at them; the writer's document."""
    document = scratch_dir() / DOCUMENT
    if document.exists():
        print(f"\nThe writer wrote {document} ({len(document.read_text().split())} words).")
    if store is None:
        print(f"Everything is in {team_dir}/: inbox files in inboxes/, transcripts in agents/")
    else:
        print(f"Inboxes: in {describe(store)}; transcripts: {team_dir / 'agents'}")
    command = _command()
    shown = f"'{store}'" if store is not None else str(team_dir)
    print(f"Look at the team:  {command} inspect {shown}")
    print(f"Replay the run:    {command} replay {shown}   (--format html -o run.html: a page)")
    return document


async def _start_writer(where: str, agent_dir: Path, model: str) -> anyio.abc.Process:
    """The writer as `teamrt run-agent` in a child process, on the same model (the spec reads
    it from TEAMRT_DEMO_MODEL)."""
    child = await anyio.open_process(
        [
            sys.executable,
            "-m",
            "teamrt",
            "run-agent",
            where,
            "--name",
            "writer",
            "--spec",
            "teamrt.demos.research_writer:writer",
            "--agent-dir",
            str(agent_dir),
        ],
        stdout=None,
        stderr=None,
        env={**os.environ, real.MODEL_VARIABLE: model, SCRATCH_VARIABLE: str(scratch_dir())},
    )
    print(f"lead: started the writer as process {child.pid} ({model} model)")
    return child


async def _stop(child: anyio.abc.Process) -> int:
    """Wait for the writer's process (the team sent it a shutdown request); kill it if it
    does not stop."""
    with anyio.move_on_after(30):
        code = await child.wait()
        print(f"lead: the writer's process exited with code {code}")
        return code
    child.kill()
    await child.wait()
    print("lead: the writer's process did not stop within 30 s, and was killed")
    return -9


def _print_timeline(where: str) -> None:
    print("\nWhat travelled through the inboxes:")
    start = None
    for e in timeline(where):  # teamrt.replay: every inbox, merged by send time
        start = start if start is not None else e.ts
        print(
            f"  +{(e.ts - start) * 1000:7.1f} ms  {e.sender:>10} -> {e.recipient:<10} "
            f"{e.kind:9} {e.type:15} {_preview(e.body)}"
        )


def _why_no_document(found: dict[str, list[TaskResult]]) -> str:
    written = sorted(p.name for p in scratch_dir().glob("*.md")) if scratch_dir().exists() else []
    also = f" (it wrote {', '.join(written)})" if written else ""
    if not found.get("writer"):
        return (
            f"the writer never wrote {DOCUMENT}: the researcher answered without asking the writer"
        )
    return f"the writer answered but never wrote {DOCUMENT}{also}"
