"""OpenAIModel over real HTTP, against an OpenAI-compatible server started on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from teamrt.agents import Agent, tool
from teamrt.errors import MissingAPIKey, ModelError, ModelRequestsBlocked, ModelTimeout
from teamrt.models import ChatMessage, OpenAIModel, ToolSpec, allow_model_requests
from tests.fake_openai import FakeOpenAI, chat_reply, error_body, responses_reply

TOOLS = [
    ToolSpec(
        name="echo",
        description="Echo a number.",
        parameters={"type": "object", "properties": {"i": {"type": "integer"}}},
    )
]


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake, allow_model_requests():
        yield fake


def model(server: FakeOpenAI, **kwargs: object) -> OpenAIModel:
    options: dict[str, object] = {"api_key": "test-key", "backoff": 0.01, **kwargs}
    return OpenAIModel("fake-model", base_url=server.url, **options)  # type: ignore[arg-type]


@tool
def echo(i: int) -> dict[str, int]:
    """Echo a number."""
    return {"i": i}


async def test_agent_with_tool_calls_over_chat_completions(server: FakeOpenAI) -> None:
    server.then(chat_reply(tool_calls=[("call_1", "echo", '{"i": 41}')]))
    server.then(chat_reply("The number is 41.", prompt_tokens=30, completion_tokens=6))
    agent = Agent("a", model(server), instructions="Be brief.", tools=[echo])
    report = await agent.run("Echo 41.")
    assert report.ok and report.answer == "The number is 41."
    assert (report.usage.input_tokens, report.usage.output_tokens) == (41, 13)

    first, second = server.seen
    assert first.path == "/v1/chat/completions"
    assert first.headers["authorization"] == "Bearer test-key"
    assert first.body["model"] == "fake-model"
    assert first.body["tools"][0]["function"]["name"] == "echo"
    assert first.body["tools"][0]["function"]["parameters"]["required"] == ["i"]
    assert [m["role"] for m in first.body["messages"]] == ["system", "user"]
    assert [m["role"] for m in second.body["messages"]] == ["system", "user", "assistant", "tool"]
    assert second.body["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"i": 41}'
    assert second.body["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": '{"i": 41}',
    }


async def test_rate_limit_then_success_honours_retry_after(server: FakeOpenAI) -> None:
    server.then(error_body("slow down", "rate_limit"), status=429, headers={"retry-after": "0.05"})
    server.then(chat_reply("ok"))
    m = model(server)
    reply = await m.complete([ChatMessage.user("hi")], [])
    assert reply.text == "ok" and m.attempts == 2


async def test_server_errors_are_retried_then_reported(server: FakeOpenAI) -> None:
    for _ in range(3):
        server.then(error_body("upstream exploded"), status=500)
    m = model(server, max_retries=2)
    with pytest.raises(ModelError, match=r"HTTP 500.*\(3 attempts\)") as info:
        await m.complete([ChatMessage.user("hi")], TOOLS)
    assert info.value.status == 500 and len(server.seen) == 3
    report = await Agent("a", model(server, max_retries=0)).run("x")  # script now empty: 500
    assert report.stop.reason == "model_error" and "HTTP 500" in report.stop.detail


async def test_client_errors_are_not_retried(server: FakeOpenAI) -> None:
    server.then(error_body("bad model", "invalid_request_error"), status=400)
    with pytest.raises(ModelError, match=r"HTTP 400.*\(1 attempts\)"):
        await model(server).complete([ChatMessage.user("hi")], [])
    assert len(server.seen) == 1


async def test_malformed_tool_arguments_get_a_nudge(server: FakeOpenAI) -> None:
    server.then(chat_reply(tool_calls=[("call_1", "echo", '{"i": 4')]))
    server.then(chat_reply(tool_calls=[("call_2", "echo", '{"i": 4}')]))
    server.then(chat_reply("4"))
    report = await Agent("a", model(server), tools=[echo]).run("Echo 4.")
    assert report.ok and report.steps == 3
    nudged = server.seen[1].body["messages"]
    assert nudged[-2]["role"] == "tool" and "MalformedToolCall" in nudged[-2]["content"]
    assert nudged[-1]["role"] == "user" and "could not be used" in nudged[-1]["content"]


async def test_timeout(server: FakeOpenAI) -> None:
    server.then(chat_reply("late"), delay=1.0).then(chat_reply("late"), delay=1.0)
    m = model(server, timeout=0.2, max_retries=1)
    with pytest.raises(ModelTimeout, match=r"no answer within 0.2s \(2 attempts\)"):
        await m.complete([ChatMessage.user("hi")], [])


async def test_responses_api(server: FakeOpenAI) -> None:
    server.then(responses_reply(calls=[("call_9", "echo", '{"i": 9}')]))
    server.then(responses_reply(text="nine"))
    report = await Agent(
        "a", model(server, api="responses"), instructions="Brief.", tools=[echo]
    ).run("Echo 9.")
    assert report.ok and report.answer == "nine"
    assert report.usage.input_tokens == 26
    first, second = server.seen
    assert first.path == "/v1/responses"
    assert first.body["tools"][0]["name"] == "echo"
    assert first.body["input"][0] == {"role": "developer", "content": "Brief."}
    kinds = [item.get("type", item.get("role")) for item in second.body["input"]]
    assert kinds == ["developer", "user", "function_call", "function_call_output"]
    assert second.body["input"][3]["call_id"] == "call_9"


async def test_missing_key_and_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with allow_model_requests(), pytest.raises(MissingAPIKey, match="set OPENAI_API_KEY"):
        await OpenAIModel("m", base_url="http://127.0.0.1:9/v1").complete(
            [ChatMessage.user("hi")], []
        )
    # the test configuration keeps real models switched off
    with pytest.raises(ModelRequestsBlocked, match="real model requests are switched off"):
        await OpenAIModel("m", api_key="k").complete([ChatMessage.user("hi")], [])


def test_model_name_and_base_url_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_MODEL", "env-model")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1234/v1")
    m = OpenAIModel()
    assert (m.name, m.base_url) == ("env-model", "http://127.0.0.1:1234/v1")
    monkeypatch.delenv("OPENAI_MODEL")
    with pytest.raises(ValueError, match="set OPENAI_MODEL"):
        OpenAIModel()
