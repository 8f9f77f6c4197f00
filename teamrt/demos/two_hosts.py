"""`teamrt demo two-hosts`: a lead and a writer as two processes that share only a Redis server.

Each "host" is a process with its own working directory (`two-hosts/host-a` for the lead,
`two-hosts/host-b` for the writer, where its journal lives); the only thing they share is the
team in Redis. The lead gives the writer a three-section task; while the writer is in the
middle of it, the demo kills the writer's process with SIGKILL, as a host that lost power. The
task waits in the writer's inbox in Redis; the dead process's lease expires (it cannot renew
it); a new incarnation started on host B takes the lease over, resumes the task from its
journal (the sections already written are not written again) and answers the lead, whose
request was waiting all along.

Without `--store`, the demo starts a private `redis-server` on a free port of 127.0.0.1 in a
temporary directory, and stops it at the end.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import anyio
import anyio.abc

from teamrt.agents.tools import tool
from teamrt.demos.local_redis import private_redis_server
from teamrt.demos.workspace import claim
from teamrt.envelopes import Envelope
from teamrt.mail import export_team, open_mailboxes, open_store, open_view
from teamrt.mail.locator import describe, with_team
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, call
from teamrt.private_files import make_dirs, write_private
from teamrt.team import TASK, TaskResult, Teammate
from teamrt.teamdir import TeamDir

TEAM = "two-hosts"
LEASE_TTL = 3.0  # seconds: short, so that the takeover is seen soon
SECTIONS = ("Why Redis Streams", "How a lease expires", "What a new incarnation resumes")
SECTION_SECONDS = 0.8  # each section takes a while to write: time to be killed mid-task
TASK_TEXT = "Write a short note with these sections: " + "; ".join(SECTIONS)


# --- the writer (run on host B by `teamrt run-agent`) ---------------------------------------


@tool(thread=True)
def write_section(title: str) -> str:
    """Write one section of the note into notes/ of the working directory."""
    time.sleep(SECTION_SECONDS)
    folder = Path("notes")
    path = folder / f"{SECTIONS.index(title) + 1}.md" if title in SECTIONS else folder / "x.md"
    write_private(path, f"## {title}\n\nwritten by pid {os.getpid()}\n")
    return f"wrote {path} (pid {os.getpid()})"


def _writer_brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
    """One section per step, then the answer."""
    done = [m.content or "" for m in messages if m.role == "tool"]
    if len(done) < len(SECTIONS):
        return call("write_section", title=SECTIONS[len(done)])
    return "The note is written: " + "; ".join(done)


def writer() -> Teammate:
    """The writer, for `teamrt run-agent --spec teamrt.demos.two_hosts:writer`."""
    return Teammate(
        "writer",
        lambda: FunctionModel(_writer_brain, name="writer-offline"),
        instructions="Write the note the lead asks for, one section at a time.",
        tools=[write_section],
    )


# --- a private Redis server, unless one is given ----------------------------------------------


def _team_url(server: str) -> str:
    """The demo's team on `server`, with the demo's short lease time limit."""
    parts = urlsplit(with_team(server, TEAM))
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "lease_ttl"]
    return urlunsplit(parts._replace(query=urlencode([*query, ("lease_ttl", f"{LEASE_TTL:g}")])))


# --- the run ----------------------------------------------------------------------------------


async def run(root: Path, store: str | None = None) -> int:
    """Run the demo (see the module docstring) in `root`/two-hosts/; 0 when the second
    incarnation answered. `MemberBusy` if that directory is in use by a run not ended."""
    what = "each host's working directory, host-a/ and host-b/, and the team exported to snapshot/"
    with claim(root / TEAM, "two-hosts", what=what) as base:
        if store is not None:
            return await _run(base, _team_url(store))
        with private_redis_server(user="the two-hosts demo") as server:
            print(f"demo: started a private redis-server at {server}")
            return await _run(base, _team_url(server))


def _fresh_hosts(base: Path) -> tuple[Path, Path]:
    """Each host's working directory (`claim` emptied `base` of an earlier run's)."""
    hosts = base / "host-a", base / "host-b"
    for host in hosts:
        make_dirs(host)
    return hosts


async def _run(base: Path, url: str) -> int:
    host_a, host_b = _fresh_hosts(base)
    await open_store(url).destroy()  # and its team in Redis
    print(f"demo: the team is in {describe(url)}; host A (the lead) works in {host_a}, host B "
          f"(the writer) in {host_b}; they share nothing else")  # fmt: skip
    async with open_mailboxes(url, members=["lead", "writer"]) as mail:
        await mail.open_inbox("lead")
        first = await _start_writer(url, host_b, "first")
        second: anyio.abc.Process | None = None
        try:
            await _until(lambda: _holder(url) is not None, "the writer to take its lease")
            request = Envelope.request("lead", "writer", TASK_TEXT, type=TASK, timeout=120)
            print(f"lead (host A): task {request.id[-8:]} to the writer: {TASK_TEXT!r}")
            async with anyio.create_task_group() as tg:
                answer: list[TaskResult] = []
                answered = anyio.Event()

                async def ask() -> None:
                    response = await mail.request(request, timeout=120, require_live=False)
                    answer.append(TaskResult.model_validate(response.body))
                    answered.set()

                tg.start_soon(ask)
                await _until(lambda: _sections(host_b) >= 1, "the first section")
                first.send_signal(signal.SIGKILL)
                await first.wait()
                print(f"demo: killed the writer's process {first.pid} with SIGKILL after "
                      f"{_sections(host_b)} of {len(SECTIONS)} sections")  # fmt: skip
                _show(url, "the task waits in Redis")
                await _until(lambda: _holder(url) is None, "the dead writer's lease to expire")
                print(
                    f"demo: the old lease expired ({LEASE_TTL:g} s without renewal); "
                    "starting a new incarnation on host B"
                )
                second = await _start_writer(url, host_b, "second")
                with anyio.fail_after(60):
                    await answered.wait()
            result = answer[0]
            print(f"lead (host A): the answer came from the new incarnation: {result.answer}")
            with anyio.move_on_after(5):  # the writer commits its cursor just after answering
                await _until(lambda: _waiting(url) == 0, "the writer's commit")
            _show(url, "after the answer")
        finally:
            for process in (first, second):
                if process is not None and process.returncode is None:
                    process.send_signal(signal.SIGTERM)
                    with anyio.move_on_after(15):
                        await process.wait()
                    if process.returncode is None:
                        process.kill()
                        await process.wait()
    written = sorted(p.name for p in (host_b / "notes").glob("*.md"))
    print(f"demo: host B's notes/: {', '.join(written)}; the writer's journal: "
          f"{TeamDir(host_b).agents.journal('writer')}")  # fmt: skip
    with open_view(url) as view:
        snapshot = base / "snapshot" / view.team
        export_team(view, snapshot)  # the private server goes when the demo ends; files stay
    print(f"demo: the team exported to {snapshot} (what `teamrt export` does)")
    print(f"Look at the team:  teamrt inspect {snapshot}")
    print(f"Replay the run:    teamrt replay {snapshot}")
    return 0 if len(written) == len(SECTIONS) else 1


async def _start_writer(url: str, host: Path, which: str) -> anyio.abc.Process:
    process = await anyio.open_process(
        [sys.executable, "-m", "teamrt", "run-agent", url, "--name", "writer",
         "--spec", "teamrt.demos.two_hosts:writer", "--agent-dir", str(TeamDir(host).agents.path)],
        cwd=host, stdout=None, stderr=None,
    )  # fmt: skip
    print(f"host B: started the {which} writer process, pid {process.pid}")
    return process


def _holder(url: str) -> str | None:
    with open_view(url) as view:
        return view.holder("writer")


def _sections(host: Path) -> int:
    return len(list((host / "notes").glob("*.md"))) if (host / "notes").exists() else 0


def _waiting(url: str) -> int:
    """Envelopes in the writer's inbox past its committed cursor."""
    with open_view(url) as view:
        return sum(1 for _ in view.scan("writer", after=view.committed("writer").position))


def _show(url: str, when: str) -> None:
    """The writer's inbox as the store sees it."""
    with open_view(url) as view:
        holder = view.holder("writer") or "nobody"
    print(f"demo ({when}): the writer's inbox holds {_waiting(url)} unhandled envelope(s); "
          f"its lease: {holder}")  # fmt: skip


async def _until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Poll another process's doing (files, the store) until `condition()`."""
    with anyio.fail_after(timeout):
        while not condition():  # noqa: ASYNC110 -- the state is another process's: polled
            await anyio.sleep(0.05)
