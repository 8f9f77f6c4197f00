"""`teamrt demo exchange`: a lead and a worker in two processes, talking through inbox files.

The lead (this process) starts the worker as a separate Python process on the same team
directory, sends it requests and awaits the responses matched by id, then broadcasts a shutdown.
Everything goes through real files under real locks; the worker wakes on inotify.

`service_demo` is `teamrt demo service`: the service app driven in memory. The other demos live
in `teamrt.demos`; `teamrt.cli.main` picks one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import anyio

from teamrt.demos.workspace import claim
from teamrt.envelopes import Envelope, Request
from teamrt.mail import FileMailboxes, open_view
from teamrt.teamdir import TeamDir

TEAM = "exchange"
NOTES = [
    "Each teammate runs its own agent loop with a private context.",
    "Teammates coordinate only through per-agent inbox files guarded by file locks.",
    "A lead matches replies to its requests by id.",
]


def _summarise(text: str) -> dict[str, object]:
    words = text.split()
    return {"words": len(words), "longest": max(words, key=len).strip(".,"), "shout": text.upper()}


async def worker(team_dir: str) -> None:
    """Serve `summarise` requests until a shutdown broadcast arrives."""
    async with FileMailboxes(team_dir, create=False) as mail:
        inbox = mail.inbox("worker")
        await mail.send(Envelope.message("worker", "lead", "ready", type="idle"))
        while True:
            envelope = await inbox.receive(timeout=60)
            if envelope.type == "shutdown_request":
                await inbox.ack(envelope)
                return
            if isinstance(envelope, Request):
                try:
                    reply = Envelope.response(envelope, _summarise(str(envelope.body)))
                except ValueError as exc:
                    reply = Envelope.error(envelope, exc)
                await mail.send(reply)
            await inbox.ack(envelope)


async def lead(root: Path) -> int:
    """The lead's side, in `root`/exchange/ (the team); `MemberBusy` if that directory is in
    use by a run that has not ended."""
    team_dir = root / TEAM
    with claim(team_dir, TEAM, what="the team's inboxes/"):
        return await _lead(team_dir)


async def _lead(team_dir: Path) -> int:
    async with FileMailboxes(team_dir, members=["lead", "worker"]) as mail:
        mail.inbox("lead")  # its lease, held from now on: the team is live
        proc = subprocess.Popen([sys.executable, "-m", "teamrt.cli.demo", "worker", str(team_dir)])
        print(f"lead: started worker as process {proc.pid} on {team_dir}")
        try:
            ready = await mail.inbox("lead").receive(timeout=30)
            await mail.inbox("lead").ack(ready)
            print(f"worker -> lead  {ready.type:8} {ready.id}  {ready.body!r}")
            for note in NOTES:
                started = time.perf_counter()
                request = Envelope.request("lead", "worker", note, type="summarise")
                response = await mail.request(request, timeout=30)
                ms = (time.perf_counter() - started) * 1000
                print(f"lead -> worker  request  {request.id}  {note!r}")
                print(
                    f"worker -> lead  response {response.id}  {response.body['words']} words, "
                    f"longest {response.body['longest']!r}  ({ms:.2f} ms round trip)"
                )
            await mail.send(Envelope.broadcast("lead", "done", type="shutdown_request"))
            print("lead: broadcast shutdown_request")
            code = await anyio.to_thread.run_sync(proc.wait)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        print(f"worker exited with code {code}")
    print(f"\nThe inboxes in {team_dir} (one JSON Lines file each):")
    with open_view(team_dir) as view:
        for name in view.members():
            sizes, depth = view.sizes(name), sum(1 for _ in view.scan(name))
            print(f"  {name:8} {depth:3} envelopes  {sizes.get('bytes', 0):6} bytes")
    print(f"\nSee them at a glance:  teamrt inspect {team_dir}")
    print(f"Replay the run:        teamrt replay {team_dir}")
    return code


async def service_demo(root: Path, model: str = "offline", store: str | None = None) -> int:
    """The service demo without a server: the app's lifespan starts the team, and one request
    goes through the app over an in-memory ASGI transport. `store`: the team's inboxes in this
    store URL instead of files."""
    try:  # the extra's modules, checked before anything starts (used in _serve_once)
        import httpx  # noqa: F401

        import teamrt.demos.service  # noqa: F401
    except ImportError as exc:
        raise SystemExit(
            f"the service demo needs the service extra: pip install 'teamrt[service]' ({exc})"
        ) from None
    from teamrt.demos import real
    from teamrt.demos.research_writer import DOCUMENT, scratch_in

    await real.check_environment(model)
    directory = Path(os.environ.get("TEAMRT_SERVICE_DIR", root / "service"))
    what = "the team in team/, the writer's scratch/"
    with claim(directory, "service", what=what), scratch_in(TeamDir(directory).scratch) as scratch:
        (scratch / DOCUMENT).unlink(missing_ok=True)  # a TEAMRT_DEMO_SCRATCH of an earlier run
        if store is not None:
            await real.fresh_team(store)  # the demo's own inboxes from an earlier run
        return await _serve_once(directory, model, store)


async def _serve_once(directory: Path, model: str, store: str | None) -> int:
    import httpx

    from teamrt.demos import real
    from teamrt.demos.research_writer import DOCUMENT, scratch_dir
    from teamrt.demos.service import create_app, demo_team

    app = create_app(lambda: demo_team(model), directory=lambda: directory, store=lambda: store)
    async with app.router.lifespan_context(app):
        members = list(app.state.team.teammates)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://teamrt") as client:
            print('POST /ask {"question": "Research the agent loop."}')
            response = await client.post(
                "/ask", json={"question": "Research the agent loop.", "timeout": 300}
            )
            body = response.json()
            print(f"{response.status_code} {body}")
            print(f"GET /status -> {(await client.get('/status')).json()}")
    print("the app stopped, and its team shut down with it\n")
    team = TeamDir(directory / "team")
    found = real.print_reports(store or team.path, members, team.agents.path)
    shown = f"'{store}'" if store is not None else directory / "team"
    print(f"Everything is in {directory}/; replay the run:  teamrt replay {shown}")
    failure = real.first_failure(found, members)
    if failure is None and response.status_code != 200:
        failure = f"POST /ask answered {response.status_code}: {body.get('error')}"
    if failure is None and not (scratch_dir() / DOCUMENT).exists():
        failure = f"no writer wrote {DOCUMENT}: the researcher answered without asking a writer"
    return real.fail(failure) if failure is not None else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        anyio.run(worker, sys.argv[2])
