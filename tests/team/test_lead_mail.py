"""The lead is a member like the others: its mail is a stream off its inbox (never a bounded list
that drops), teammates' requests to it reach the program's handlers, and a lead restarted after
kill -9 gets its predecessor's outcomes at start."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from contextlib import aclosing
from pathlib import Path

import anyio
import pytest

from teamrt import FileMailboxes
from teamrt.agents import tool
from teamrt.envelopes import Envelope, Request
from teamrt.errors import RemoteError
from teamrt.mail import MemoryMailboxes
from teamrt.mail.locator import open_mailboxes
from teamrt.mail.mailboxes import Mailboxes
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, call
from teamrt.team import Team, Teammate
from teamrt.team.lead import MAIL_BUFFERED, NO_HANDLER
from tests.support.redis_server import RedisServer, shared_redis
from tests.team.helpers import LEAD_PROCS, kill, slow_w, spawn_lead

__all__ = ["shared_redis"]  # the fixture


MESSAGES = 1000


def flooder(mail: Mailboxes) -> Teammate:
    """A teammate whose tool sends the lead MESSAGES messages, one send each."""

    @tool
    async def flood() -> str:
        """Tell the lead everything."""
        for i in range(MESSAGES):
            await mail.send(Envelope.message("w", "lead", f"n{i}"))
        return "flooded"

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        return "told" if messages[-1].role == "tool" else call("flood")

    return Teammate("w", FunctionModel(brain), tools=[flood])


@pytest.fixture(params=["files", "redis"])
def locator(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new team on files, or on the session's Redis server."""
    if request.param == "files":
        return str(tmp_path / "t")
    server: RedisServer = request.getfixturevalue("shared_redis")
    return server.url()


async def test_a_thousand_messages_from_a_teammates_tool_all_reach_the_lead(locator: str) -> None:
    """Sent while the program reads nothing: the lead's server stops at its buffer (what it
    holds unacked stays bounded), then every message reaches the program, in order."""
    async with (
        open_mailboxes(locator, members=["lead", "w", "boss"]) as mail,
        Team(mail, [flooder(mail)]) as team,
    ):
        # the task comes from another member, so no ask of the lead reads ahead for it
        task = Envelope.request("boss", "w", "flood the lead", type="task")
        await mail.send(task)
        answer = await (await mail.open_inbox("boss")).receive(timeout=30)
        assert answer.in_reply_to == task.id and answer.body["answer"] == "told"
        while mail.statistics()["lead"].unacked < MAIL_BUFFERED:  # noqa: ASYNC110 -- a peek
            await anyio.sleep(0.005)
        await anyio.sleep(0.05)  # the server would go on here if it did not wait
        assert mail.statistics()["lead"].unacked <= MAIL_BUFFERED + 1
        bodies = []
        async with aclosing(team.lead_mail()) as lead_mail:  # closed: the last one acked
            async for envelope in lead_mail:
                bodies.append(envelope.body)
                if len(bodies) == MESSAGES:
                    break
        assert bodies == [f"n{i}" for i in range(MESSAGES)]
        await (await mail.open_inbox("lead")).flush()
        assert mail.statistics()["lead"].unacked == 0


async def test_a_thousand_messages_from_another_process_all_reach_the_lead(tmp_path: Path) -> None:
    async with (
        FileMailboxes(tmp_path / "t", members=["lead", "other"]) as mail,
        Team(mail, []) as team,
    ):
        sender = await anyio.run_process(
            [sys.executable, LEAD_PROCS, "flood", str(tmp_path / "t"), str(MESSAGES)], check=False
        )
        assert sender.returncode == 0, sender.stderr.decode()
        bodies = []
        with anyio.fail_after(30):
            async for envelope in team.lead_mail():
                assert envelope.sender == "other"
                bodies.append(envelope.body)
                if len(bodies) == MESSAGES:
                    break
        assert bodies == [f"n{i}" for i in range(MESSAGES)]


async def test_mail_the_program_did_not_take_comes_to_the_next_lead(tmp_path: Path) -> None:
    async with FileMailboxes(tmp_path / "t", members=["lead", "other"]) as mail:
        await mail.send_many([Envelope.message("other", "lead", f"n{i}") for i in range(3)])
        async with Team(mail, []) as team, aclosing(team.lead_mail()) as lead_mail:
            async for envelope in lead_mail:
                assert envelope.body == "n0"
                break  # n0 handled; n1 and n2 not taken
    async with FileMailboxes(tmp_path / "t") as mail, Team(mail, []) as team:
        taken = []
        async for envelope in team.lead_mail():
            taken.append(envelope.body)
            if len(taken) == 2:
                break
    assert taken == ["n1", "n2"]


def asker(text: str = "may I deploy?") -> Teammate:
    """A teammate that asks the lead and answers with what the request tool said."""

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        if messages[-1].role == "tool":
            return messages[-1].content or ""
        return call("request", to="lead", text=text, timeout=600)

    return Teammate("w", FunctionModel(brain))


async def test_a_teammates_request_to_the_lead_is_answered_by_its_handler() -> None:
    asked: list[Request] = []

    async def deploys(request: Request) -> str:
        asked.append(request)
        return f"yes, {request.sender}"

    async with MemoryMailboxes() as mail, Team(mail, [asker()], on_request=deploys) as team:
        result = await team.ask("w", "deploy it", timeout=30)
    assert json.loads(result.answer or "") == {"from": "lead", "answer": "yes, w"}
    assert [(r.sender, r.body) for r in asked] == [("w", "may I deploy?")]


async def test_a_request_is_answered_by_the_handler_of_its_type() -> None:
    async def default(request: Request) -> str:
        raise AssertionError("the handler of the type answers it")

    async def ping(request: Request) -> dict[str, str]:
        return {"pong": str(request.body)}

    async with (
        MemoryMailboxes(members=["lead", "other"]) as mail,
        Team(mail, [], on_request=default) as team,
    ):
        team.handle("ping", ping)
        request = Envelope.request("other", "lead", "hi", type="ping", timeout=600)
        response = await mail.request(request)
    assert response.body == {"pong": "hi"}


async def test_a_request_to_a_lead_without_a_handler_is_refused_at_once(locator: str) -> None:
    """Refused with NoHandler, not left to wait its whole timeout (600 s, far past the
    test's)."""
    async with MemoryMailboxes() as mail, Team(mail, [asker()]) as team:
        result = await team.ask("w", "deploy it", timeout=30)
    assert NO_HANDLER in (result.answer or ""), result.answer
    async with open_mailboxes(locator, members=["lead", "other"]) as shared, Team(shared, []):
        with pytest.raises(RemoteError) as caught:
            await shared.request(Envelope.request("other", "lead", "hi", timeout=600))
    assert caught.value.error_type == NO_HANDLER
    assert "registers none" in str(caught.value)


async def test_a_handler_that_raises_answers_with_an_error(locator: str) -> None:
    async def broken(request: Request) -> str:
        raise ValueError("no deploys on Fridays")

    async with (
        open_mailboxes(locator, members=["lead", "other"]) as mail,
        Team(mail, [], on_request=broken),
    ):
        with pytest.raises(RemoteError, match="no deploys on Fridays") as caught:
            await mail.request(Envelope.request("other", "lead", "hi", timeout=600))
        assert caught.value.error_type == "ValueError"
        # the lead's server goes on
        with pytest.raises(RemoteError, match="no deploys on Fridays"):
            await mail.request(Envelope.request("other", "lead", "again", timeout=600))


# --- a lead in its own process, killed -------------------------------------------------------


async def test_a_lead_restarted_after_kill_9_gets_its_predecessors_outcomes_at_start(
    tmp_path: Path,
) -> None:
    started, release = anyio.Event(), anyio.Event()
    calls: list[str] = []
    team_dir, out = tmp_path / "t", tmp_path / "answer"
    async with (
        FileMailboxes(team_dir, members=["lead", "w"]) as mail,
        Team(mail, [slow_w(started, release, calls)], lead_here=False),
    ):
        lead = spawn_lead(team_dir, out)
        with anyio.fail_after(30):
            await started.wait()
        kill(lead)  # while its ask waits for the answer
        release.set()
        async with Team(mail, [], remote=["w"]) as successor:  # serves its inbox at once
            with anyio.fail_after(30):
                async for envelope in successor.lead_mail():
                    if envelope.kind == "response":
                        break
    assert (envelope.sender, envelope.body["answer"]) == ("w", "forty-two")
    assert not out.exists()
    assert len(calls) == 1
