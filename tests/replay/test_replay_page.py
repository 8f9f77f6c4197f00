"""The replay page in headless Chromium, on a run made by real teams on real files: a teammate
that crashes, one cancelled at shutdown, a request that times out, and a conductor escalation
nobody answered (with the conductor's recorded state). DOM assertions, a kept screenshot, and a
page that stays bounded at 100,000 envelopes."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from teamrt import Envelope, FileMailboxes, RemoteError
from teamrt.agents import tool
from teamrt.cli.replay import run_replay
from teamrt.conductor.state import ConductorState
from teamrt.errors import RequestTimeout
from teamrt.mail.log import encode, stamp
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, call
from teamrt.replay import Filter, timeline
from teamrt.team import Team, Teammate
from tests.support.paths import SAMPLES

MEMBERS = ["lead", "writer", "breaker", "sleeper", "conductor", "human"]


def _newest(messages: Sequence[ChatMessage]) -> str:
    return next((m.content or "" for m in reversed(messages) if m.role == "user"), "")


async def _aborted_run(team_dir: Path) -> None:
    """A run that went wrong in every way the page must show."""

    def writer(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        return f"wrote: {_newest(messages)}"

    def breaker(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        raise RuntimeError("the model client broke")

    def sleeper(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        return call("hang")

    @tool
    async def hang() -> str:
        """Never returns."""
        await anyio.sleep_forever()
        return "never"

    teammates = [
        Teammate("writer", FunctionModel(writer)),
        Teammate("breaker", FunctionModel(breaker)),
        Teammate("sleeper", FunctionModel(sleeper), tools=[hang]),
    ]
    async with (
        FileMailboxes(team_dir, members=MEMBERS) as mail,
        Team(mail, teammates, agent_dir=team_dir / "agents", shutdown_deadline=0.2) as team,
    ):
        assert (await team.ask("writer", "the intro", timeout=10)).answer
        with pytest.raises(RemoteError):
            await team.ask("breaker", "the middle", timeout=10)
        # the conductor escalates to a human who never answers
        escalation = Envelope.request(
            "conductor", "human", {"subtask": "build", "why": "stuck"}, type="escalation"
        )
        escalation = escalation.model_copy(update={"deadline": escalation.ts + 0.01})
        await mail.send(escalation)
        with pytest.raises(RequestTimeout):  # and a question to the human times out
            await mail.request(Envelope.request("lead", "human", "are you there?"), timeout=0.05)
        await mail.send(Envelope.request("lead", "sleeper", "the end", type="task"))
        while team.status["sleeper"].state != "working":  # noqa: ASYNC110 -- a peek
            await anyio.sleep(0.001)
    state = ConductorState.model_validate(
        {
            "goal": "a book",
            "plan": {
                "subtasks": [{"id": "build", "description": "build it", "check": "true"}],
                "acceptance_check": "true",
            },
            "statuses": {"build": "escalated"},
            "outcome": "aborted",
        }
    )
    state.decide("conductor", "plan", detail="1 subtask")
    state.decide("conductor", "stuck", "build", "the check fails the same way")
    state.decide("conductor", "escalate", "build", f"stuck; asked human ({escalation.id})")
    state.decide("conductor", "no answer", "build", "nobody answered within 0.01s: abort")
    state.save(team_dir / "conductor" / "state.json")


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("chromium is not installed (.ci/run installs Debian's chromium package)")
    return found


def browse(page: Path, profile: Path, *extra: str, fragment: str = "") -> str:
    """Load `page` in headless Chromium; the DOM after its script ran."""
    result = subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            *extra,
            page.as_uri() + fragment,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def rows(dom: str) -> list[str]:
    return re.findall(r'<tr class="event[^"]*".*?</tr>', dom, re.S)


def card(dom: str, name: str) -> str:
    match = re.search(rf'data-name="{name}"><b>([^<]*)</b>', dom)
    assert match is not None, name
    return match.group(1)


def keep_artefact(path: Path) -> None:
    where = os.environ.get("TEAMRT_TEST_ARTEFACTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(where) / path.name)


@pytest.fixture(scope="module")
def aborted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    team_dir = tmp_path_factory.mktemp("run") / "aborted"
    anyio.run(_aborted_run, team_dir)
    return team_dir


def _page(team_dir: Path, tmp_path: Path, keep: Filter | None = None) -> Path:
    page = tmp_path / "replay.html"
    with page.open("w") as out:
        run_replay(
            str(team_dir), fmt="html", keep=keep or Filter(), follow=False, colour="never", out=out
        )
    return page


def test_the_page_of_an_aborted_run(aborted: Path, tmp_path: Path) -> None:
    page = _page(aborted, tmp_path)
    source = page.read_text()
    assert "<script src" not in source and "http://" not in source.split("<script>")[0]
    dom = browse(page, tmp_path / "profile", "--dump-dom")

    # the summary at the top
    # the escalation, the question, the hung task and the shutdown it never acknowledged
    assert card(dom, "unanswered") == "4"
    assert card(dom, "timed out") == "3"  # all but the task (asked without a deadline)
    assert card(dom, "crashes") == "1" and card(dom, "cancellations") != "0"
    assert card(dom, "errors") == "1"  # the crashed teammate's task answered with an error
    assert card(dom, "escalations") == "1" and card(dom, "decisions") == "5"
    assert card(dom, "quarantined lines") == "0"
    assert re.search(r'data-agent="breaker"><td[^>]*>breaker</td><td>\d+</td>', dom)

    # every event in one timeline: the first page holds them all, flagged rows marked
    shown = rows(dom)
    assert re.search(r"(\d+) of \1 events", dom)
    kinds = [re.search(r'data-kind="([a-z]+)"', r).group(1) for r in shown]  # type: ignore[union-attr]
    assert {"request", "response", "message", "crash", "cancel", "stop", "decision"} <= set(kinds)
    flagged = [r for r in shown if "flagged" in r.split(">")[0]]
    assert any("timed out" in r and "are you there?" in r for r in flagged)
    assert any("escalation" in r and 'data-kind="request"' in r for r in flagged)
    assert any('data-kind="crash"' in r and "the model client broke" in r for r in flagged)
    assert any('data-kind="cancel"' in r for r in flagged)
    assert any('data-kind="decision"' in r and "escalation" in r for r in flagged)
    assert any("outcome: aborted" in r for r in flagged)
    # the escalation decision sits next to the escalation it sent
    at = next(i for i, r in enumerate(shown) if 'data-kind="decision"' in r and ">escalate<" in r)
    assert "escalation" in shown[at + 1] and 'data-kind="request"' in shown[at + 1]
    # a lane per agent, drawn in the page
    assert dom.count("<svg") >= len(shown) and "<line" in dom and "<path" in dom

    # only flagged: exactly the flagged rows (it showed 0 on an aborted run)
    only = browse(page, tmp_path / "profile", "--dump-dom", fragment="#flagged=1")
    assert rows(only) and all("flagged" in r.split(">")[0] for r in rows(only))
    assert len(rows(only)) == len(flagged)
    assert f"{len(flagged)} of {len(shown)} events" in only

    # the search box
    found = browse(page, tmp_path / "profile", "--dump-dom", fragment="#q=client%20broke")
    assert list(rows(found)) and all("client broke" in r for r in rows(found))

    # a screenshot, kept
    shot = tmp_path / "replay-aborted-run.png"
    browse(page, tmp_path / "profile", "--window-size=1400,1400", f"--screenshot={shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    keep_artefact(shot)


def test_the_summaries_respect_the_filters(aborted: Path, tmp_path: Path) -> None:
    out = io.StringIO()
    run_replay(
        str(aborted),
        fmt="json",
        keep=Filter(agents=("human",)),
        follow=False,
        colour="never",
        out=out,
    )
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    summary = lines[-1]["summary"]
    assert summary["envelopes"] == len(lines) - 1 - summary["decisions"] == 2
    assert summary["requests"] == 2 and len(summary["unanswered"]) == 2
    assert summary["timed_out"] == 2 and summary["crashes"] == 0
    assert set(summary["agents"]) == {"conductor", "lead", "human"}

    out = io.StringIO()
    run_replay(
        str(aborted),
        fmt="text",
        keep=Filter(agents=("breaker",)),
        follow=False,
        colour="never",
        out=out,
    )
    text = out.getvalue()
    assert "0 unanswered (0 timed out), 0 late, 1 errors" in text
    assert "1 crashes, 0 cancellations" in text
    assert "are you there?" not in text

    page = _page(aborted, tmp_path, Filter(agents=("sleeper",)))
    dom = browse(page, tmp_path / "profile", "--dump-dom")
    assert card(dom, "unanswered") == "2" and card(dom, "cancellations") != "0"
    assert card(dom, "crashes") == "0"


def _big_team(team_dir: Path, n: int) -> None:
    async def make() -> None:
        async with FileMailboxes(team_dir, members=["lead", "worker"]):
            pass

    anyio.run(make)
    request = Envelope.request("lead", "worker", "x" * 100)
    line = stamp(encode(request), 0, team_dir.name.encode())
    with open(team_dir / "inboxes" / "worker.jsonl", "ab") as f:
        for i in range(n):
            f.write(line.replace(b'"id":"', b'"id":"%08d' % i, 1))


@pytest.mark.stress
def test_the_page_stays_bounded_at_100000_envelopes(tmp_path: Path) -> None:
    sizes = []
    for n in (30_000, 100_000):
        team_dir = tmp_path / f"t{n}"
        _big_team(team_dir, n)
        page = tmp_path / f"big{n}.html"
        with page.open("w") as out:
            run_replay(
                str(team_dir), fmt="html", keep=Filter(), follow=False, colour="never", out=out
            )
        sizes.append(page.stat().st_size)
    assert sizes[1] < 1.1 * sizes[0]  # 20,000 rows at most, whatever the run's size
    dom = browse(page, tmp_path / "profile", "--dump-dom")
    assert card(dom, "envelopes") == "100,000" and card(dom, "unanswered") == "100,000"
    assert "This page holds 20,000 of 100,000 events" in dom
    assert len(rows(dom)) == 100  # one page of rows in the document, not all of them
    assert "page 1 of 200" in dom and "20,000 of 20,000 events" in dom
    assert int(re.search(r'data-drawn-ms="(\d+)"', dom).group(1)) >= 0  # type: ignore[union-attr]


def test_a_body_cannot_break_out_of_the_page(tmp_path: Path) -> None:
    nasty = "</script><!--<script>document.title='pwned'</script>\u2028"

    async def send() -> None:
        async with FileMailboxes(tmp_path / "t", members=["lead", "worker"]) as mail:
            await mail.send(Envelope.message("lead", "worker", nasty, type="x</script>"))

    anyio.run(send)
    page = _page(tmp_path / "t", tmp_path)
    source = page.read_text()
    assert source.count("</script>") == source.count("<script") and "<!--" not in source
    (events,) = re.findall(
        r'<script id="events" type="application/json">(.*?)</script>', source, re.S
    )
    assert json.loads(events)[0]["body"] == nasty
    dom = browse(page, tmp_path / "profile", "--dump-dom")
    assert "<title>teamrt replay: t</title>" in dom and "1 of 1 events" in dom


def test_decisions_sit_at_the_envelopes_that_carried_them_out() -> None:
    sample = SAMPLES / "conductor-team"
    events = list(timeline(sample, agent_files=True))
    for i, e in enumerate(events):
        if e.kind == "decision" and e.type == "assign":
            worker = e.body["detail"].split(",")[0].removeprefix("to ")
            after = events[i + 1]
            assert (after.kind, after.type, after.recipient) == ("request", "task", worker)
        if e.kind == "decision" and e.type == "submit":
            before = events[i - 1]
            assert (before.kind, before.type, before.sender) == (
                "response",
                "task_result",
                e.sender,
            )
    assert events[-1].kind == "decision" and events[-1].body == {"outcome": "accepted"}
    stops = [e for e in events if e.kind == "stop"]  # recorded before stop lines had a time
    assert {e.sender for e in stops} == {"builder-1", "builder-2"} and all(
        e.to_json_dict()["ts"] is None for e in stops
    )
    assert [e.kind for e in timeline(sample)].count("decision") == 0  # envelopes only, by default
