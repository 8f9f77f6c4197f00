"""The command line and the demos on a Redis team, as a user runs them: every command that takes a
team takes a store URL too (or TEAMRT_STORE), and the two-hosts demo shows a takeover."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import anyio
import pytest

from teamrt import Envelope
from teamrt.mail import open_mailboxes
from tests.support.redis_server import RedisServer, needs_redis, redis_server

__all__ = ["redis_server"]  # the fixture

pytestmark = needs_redis


def teamrt(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "teamrt", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        check=False,
    )


async def _conversation(url: str) -> str:
    """A request answered, a message, and a request left unanswered; returns the answered id."""
    async with open_mailboxes(url, members=["lead", "worker"]) as mail:
        request = Envelope.request("lead", "worker", {"n": 1}, type="job", timeout=30)
        await mail.send(request)
        await mail.send(Envelope.message("lead", "worker", "hello"))
        inbox = await mail.open_inbox("worker")
        got = await inbox.receive(timeout=5)
        await mail.send(Envelope.response(got, {"ok": True}))
        await inbox.ack(got)
        await mail.send(Envelope.request("lead", "worker", "never answered", timeout=0.01))
        return request.id


def test_send_inspect_replay_and_export_on_a_redis_team(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    url = redis_server.url("cli")
    answered = anyio.run(_conversation, url)

    sent = teamrt("send", url, "--from", "lead", "--to", "worker", "--text", "from the shell")
    assert sent.returncode == 0, sent.stderr
    envelope_id = sent.stdout.strip()

    report = teamrt("inspect", "--json", env={"TEAMRT_STORE": url})  # the URL from the env
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    worker = next(i for i in data["inboxes"] if i["name"] == "worker")
    assert (worker["depth"], worker["lag"], len(worker["pending_requests"])) == (4, 3, 1)

    lines = teamrt("replay", url, "--format", "json")
    assert lines.returncode == 0, lines.stderr
    events = [json.loads(line) for line in lines.stdout.splitlines()]
    ids = {e["id"] for e in events if "id" in e}
    assert answered in ids
    assert envelope_id in ids
    answer = next(e for e in events if e.get("in_reply_to") == answered)
    assert answer["latency"] is not None  # the response joined to its request
    summary = events[-1]["summary"]
    assert summary["requests"] == 2
    assert len(summary["unanswered"]) == 1

    text = teamrt("replay", url)
    assert text.returncode == 0
    assert "unanswered" in text.stdout

    dest = tmp_path / "snap" / "cli"
    exported = teamrt("export", url, str(dest))
    assert exported.returncode == 0, exported.stderr
    assert "exported 5 envelopes" in exported.stdout
    local = teamrt("inspect", str(dest), "--json")
    copied = next(i for i in json.loads(local.stdout)["inboxes"] if i["name"] == "worker")
    assert (copied["depth"], copied["lag"]) == (worker["depth"], worker["lag"])
    again = teamrt("replay", str(dest), "--format", "json")
    copied_ids = {e["id"] for e in map(json.loads, again.stdout.splitlines()) if "id" in e}
    assert copied_ids == ids


def test_mistakes_with_store_urls_are_one_line(redis_server: RedisServer, tmp_path: Path) -> None:
    no_team = teamrt("inspect", f"redis://127.0.0.1:{redis_server.port}/0")
    assert no_team.returncode == 2
    assert "team" in no_team.stderr
    assert "Traceback" not in no_team.stderr
    exists = tmp_path / "cli"
    exists.mkdir()
    refused = teamrt("export", redis_server.url("cli"), str(exists))
    assert refused.returncode == 2
    assert "exists" in refused.stderr
    assert "Traceback" not in refused.stderr
    nothing = teamrt("inspect", "--json", env={"TEAMRT_STORE": ""})
    assert nothing.returncode == 2
    assert "TEAMRT_STORE" in nothing.stderr


def test_the_two_hosts_demo_survives_a_killed_writer(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    result = teamrt(
        "demo", "two-hosts", "--dir", str(tmp_path), "--store", redis_server.url(), cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "killed the writer's process" in out
    assert "the task waits in Redis" in out
    assert "the old lease expired" in out
    assert "the answer came from the new incarnation" in out
    assert "the writer's inbox holds 0 unhandled" in out  # answered, and committed
    (snapshot,) = (tmp_path / "two-hosts" / "snapshot").iterdir()
    inspected = teamrt("inspect", str(snapshot), "--json")
    assert inspected.returncode == 0, inspected.stderr
    notes = sorted(p.name for p in (tmp_path / "two-hosts" / "host-b" / "notes").glob("*.md"))
    assert notes == ["1.md", "2.md", "3.md"]
    # the second incarnation resumed the task: the section written before the kill was not
    # written again (its file names the first process)
    host_b = tmp_path / "two-hosts" / "host-b"
    rerun = teamrt(
        "rerun", redis_server.url("two-hosts"), "--agent", "writer",
        "--spec", "teamrt.demos.two_hosts:writer", cwd=host_b,
    )  # fmt: skip
    # the transcript is found on host B (./agents by default), and the re-run tells that the
    # first section's tool now reports another pid than the recording
    assert rerun.returncode == 1, rerun.stdout + rerun.stderr
    assert "differs at step 2" in rerun.stdout
    first_pid = (tmp_path / "two-hosts" / "host-b" / "notes" / "1.md").read_text()
    last_pid = (tmp_path / "two-hosts" / "host-b" / "notes" / "3.md").read_text()
    assert first_pid.split("pid ")[1] != last_pid.split("pid ")[1]


@pytest.mark.parametrize("two", [False, True])
def test_the_research_writer_demo_on_redis(
    redis_server: RedisServer, tmp_path: Path, two: bool
) -> None:
    name = "two-process" if two else "research-writer"
    url = f"redis://127.0.0.1:{redis_server.port}/0"
    result = teamrt("demo", name, "--dir", str(tmp_path / "boxes"), "--store", url, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Inboxes: in redis://127.0.0.1" in result.stdout
    assert (tmp_path / "boxes" / "research-writer" / "scratch" / "agent-loop.md").exists()
    assert not (tmp_path / "boxes" / "research-writer" / "inboxes").exists()  # all in Redis
    again = teamrt("demo", name, "--dir", str(tmp_path / "boxes"), "--store", url, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr  # the demo's team starts over


async def _send_later(url: str, body: str) -> str:
    async with open_mailboxes(url) as mail:
        envelope = Envelope.message("lead", "worker", body)
        await mail.send(envelope)
        return envelope.id


def _lines(stream: IO[str]) -> tuple[queue.Queue[str], threading.Thread]:
    """A child's output lines as they come, read by a thread (a bounded `get` then fails
    instead of hanging); the thread ends at the end of the output."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return lines, reader


def test_replay_follow_on_a_redis_team_prints_what_arrives(redis_server: RedisServer) -> None:
    url = redis_server.url("follow")
    anyio.run(_conversation, url)
    follower = subprocess.Popen(
        [sys.executable, "-m", "teamrt", "replay", url, "--follow", "--format", "json"],
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    assert follower.stdout is not None
    lines, reader = _lines(follower.stdout)
    try:
        first = [json.loads(lines.get(timeout=20)) for _ in range(4)]  # the first pass
        assert all(event["id"] for event in first)
        sent = anyio.run(_send_later, url, "while following")
        assert json.loads(lines.get(timeout=20))["id"] == sent
    finally:
        follower.terminate()
        follower.wait(10)
        if follower.stdout is not None:
            reader.join(10)
            follower.stdout.close()


@pytest.mark.parametrize("name", ["conductor", "service"])
def test_the_conductor_and_service_demos_on_redis(
    redis_server: RedisServer, tmp_path: Path, name: str
) -> None:
    url = f"redis://127.0.0.1:{redis_server.port}/0"
    # the conductor's checks are pytest runs: without this venv's plugins they start faster
    env = {"TEAMRT_SERVICE_DIR": str(tmp_path / "service"), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    result = teamrt("demo", name, "--dir", str(tmp_path), "--store", url, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not list(tmp_path.rglob("inboxes"))  # every inbox in Redis
    refused = teamrt("demo", "exchange", "--store", url, cwd=tmp_path)
    assert refused.returncode == 2
    assert "Traceback" not in refused.stderr
