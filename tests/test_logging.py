"""The library logs what would otherwise be invisible (under `teamrt.*`, never printing):
crashes and restarts, budget stops, quarantined lines, refusals, retries."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from teamrt import Envelope, FileMailboxes, MemoryMailboxes, RemoteError
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, Usage
from teamrt.team import RestartPolicy, Team, TeamBudget, Teammate


async def test_crashes_restarts_and_budget_stops_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
        if "crash" in (messages[-1].content or ""):
            raise RuntimeError("the model client broke")
        return ModelReply(text="ok", usage=Usage(requests=1, input_tokens=300))

    policy = RestartPolicy(on_failure=True, backoff=0.01, task_attempts=1)
    caplog.set_level(logging.INFO, logger="teamrt")
    async with MemoryMailboxes() as mail:
        member = Teammate("w", FunctionModel(brain), restart=policy)
        async with Team(mail, [member], budget=TeamBudget(max_tokens=250)) as team:
            with pytest.raises(RemoteError):
                await team.ask("w", "crash", timeout=5)
            await team.ask("w", "spend", timeout=5)
            stopped = await team.ask("w", "spend more", timeout=5)
    assert stopped.stop_reason == "limit"
    messages = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert any(
        n == "teamrt.team" and lvl == "ERROR" and "w (incarnation" in m and "crashed" in m
        for n, lvl, m in messages
    )
    assert any(n == "teamrt.team" and "restarts in" in m for n, _, m in messages)
    assert any(
        n == "teamrt.agents" and lvl == "WARNING" and "team_max_tokens" in m
        for n, lvl, m in messages
    )


async def test_a_quarantined_line_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=["lead", "w"]) as mail:
        with (team / "inboxes" / "w.jsonl").open("ab") as log:
            log.write(b"this is not json\n")
        await mail.send(Envelope.message("lead", "w", "after the garbage"))
        with caplog.at_level(logging.WARNING, logger="teamrt.mail"):
            got = await mail.inbox("w").receive(timeout=5)
    assert got.body == "after the garbage"
    assert any("quarantined" in r.getMessage() and r.name == "teamrt.mail" for r in caplog.records)


async def test_a_model_retry_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    from teamrt.models import ChatMessage, OpenAIModel, allow_model_requests
    from tests.support.fake_openai import FakeOpenAI, chat_reply, error_body

    with FakeOpenAI() as server, allow_model_requests():
        server.then(error_body("slow down", "rate_limit"), status=429, headers={"retry-after": "0"})
        server.then(chat_reply("ok"))
        async with OpenAIModel("fake-model", base_url=server.url, api_key="k", backoff=0.01) as m:
            with caplog.at_level(logging.INFO, logger="teamrt.models"):
                reply = await m.complete([ChatMessage.user("hi")], [])
    assert reply.text == "ok"
    assert any("attempt 1 failed" in r.getMessage() for r in caplog.records)
