"""OpenAIModel over real HTTP, against an OpenAI-compatible server started on 127.0.0.1."""

from __future__ import annotations

import gc
import json
from collections.abc import AsyncIterator, Callable, Iterator

import openai
import pytest

from teamrt.agents import Agent, tool
from teamrt.errors import MissingAPIKey, ModelError, ModelRequestsBlocked, ModelTimeout
from teamrt.models import ChatMessage, OpenAIModel, ToolSpec, allow_model_requests
from tests.support.fake_openai import FakeOpenAI, chat_reply, error_body, responses_reply

TOOLS = [
    ToolSpec(
        name="echo",
        description="Echo a number.",
        parameters={"type": "object", "properties": {"i": {"type": "integer"}}},
    )
]
HI = [ChatMessage.user("hi")]

MakeModel = Callable[..., OpenAIModel]


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake, allow_model_requests():
        yield fake


@pytest.fixture
async def model(server: FakeOpenAI) -> AsyncIterator[MakeModel]:
    """Models on the fake server, every one closed at the end (the server keeps connections
    alive, so an unclosed client would be an unclosed-socket warning, an error here)."""
    made: list[OpenAIModel] = []

    def make(**kwargs: object) -> OpenAIModel:
        options: dict[str, object] = {"api_key": "test-key", "backoff": 0.01, **kwargs}
        made.append(OpenAIModel("fake-model", base_url=server.url, **options))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for m in made:
        await m.aclose()


@tool
def echo(i: int) -> dict[str, int]:
    """Echo a number."""
    return {"i": i}


async def test_agent_with_tool_calls_over_chat_completions(
    server: FakeOpenAI, model: MakeModel
) -> None:
    server.then(chat_reply(tool_calls=[("call_1", "echo", '{"i": 41}')]))
    server.then(chat_reply("The number is 41.", prompt_tokens=30, completion_tokens=6))
    agent = Agent("a", model(), instructions="Be brief.", tools=[echo])
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


async def test_rate_limit_then_success_honours_retry_after(
    server: FakeOpenAI, model: MakeModel
) -> None:
    server.then(error_body("slow down", "rate_limit"), status=429, headers={"retry-after": "0.05"})
    server.then(chat_reply("ok"))
    m = model()
    reply = await m.complete(HI, [])
    assert reply.text == "ok" and m.attempts == 2
    assert (reply.attempts, reply.rate_limited) == (2, 1)


async def test_a_reply_says_it_took_one_attempt(server: FakeOpenAI, model: MakeModel) -> None:
    server.then(chat_reply("ok"))
    reply = await model().complete(HI, [])
    assert (reply.attempts, reply.rate_limited, reply.usage_estimated) == (1, 0, False)
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (11, 7)


@pytest.mark.parametrize("value", ["soon", "nan", "-5", "inf", "Wed, 99 Foo 2026 99:99:99 GMT", ""])
async def test_an_unreadable_retry_after_falls_back_to_backoff(
    server: FakeOpenAI, model: MakeModel, value: str
) -> None:
    server.then(error_body("slow down", "rate_limit"), status=429, headers={"retry-after": value})
    server.then(chat_reply("ok"))
    reply = await model().complete(HI, [])
    assert reply.text == "ok" and (reply.attempts, reply.rate_limited) == (2, 1)


async def test_a_retry_after_over_the_cap_stops_at_once(
    server: FakeOpenAI, model: MakeModel
) -> None:
    server.then(error_body("slow down", "rate_limit"), status=429, headers={"retry-after": "120"})
    with pytest.raises(
        ModelError, match=r"retry after 120s, more than max_retry_after=60s"
    ) as info:
        await model().complete(HI, [])
    assert "rate limited" in str(info.value) and len(server.seen) == 1
    assert (info.value.status, info.value.attempts, info.value.rate_limited) == (429, 1, 1)


async def test_a_retry_after_under_the_cap_is_waited_for(
    server: FakeOpenAI, model: MakeModel
) -> None:
    # a 45 s wait would have been cut to 30 s before; the cap is now the caller's to set
    server.then(error_body("slow down", "rate_limit"), status=429, headers={"retry-after-ms": "40"})
    server.then(chat_reply("ok"))
    reply = await model(max_retry_after=0.05).complete(HI, [])
    assert reply.text == "ok" and reply.rate_limited == 1


async def test_giving_up_after_429s_says_rate_limited(server: FakeOpenAI, model: MakeModel) -> None:
    for _ in range(3):
        server.then(error_body("slow down", "rate_limit"), status=429)
    with pytest.raises(
        ModelError, match=r"HTTP 429: slow down \(3 attempts, 3 rate limited"
    ) as info:
        await model(max_retries=2).complete(HI, [])
    assert (info.value.attempts, info.value.rate_limited) == (3, 3)


async def test_server_errors_are_retried_then_reported(
    server: FakeOpenAI, model: MakeModel
) -> None:
    server.then(error_body("slow down", "rate_limit"), status=429)
    for _ in range(2):
        server.then(error_body("upstream exploded"), status=500)
    with pytest.raises(ModelError, match=r"HTTP 500.*\(3 attempts, 1 rate limited") as info:
        await model(max_retries=2).complete(HI, TOOLS)
    assert info.value.status == 500 and len(server.seen) == 3
    assert (info.value.attempts, info.value.rate_limited) == (3, 1)
    report = await Agent("a", model(max_retries=0)).run("x")  # script now empty: 500
    assert report.stop.reason == "model_error" and "HTTP 500" in report.stop.detail


async def test_client_errors_are_not_retried(server: FakeOpenAI, model: MakeModel) -> None:
    server.then(error_body("bad model", "invalid_request_error"), status=400)
    with pytest.raises(ModelError, match=r"HTTP 400: bad model \(1 attempts\)"):
        await model().complete(HI, [])
    assert len(server.seen) == 1


async def test_malformed_tool_arguments_get_a_nudge(server: FakeOpenAI, model: MakeModel) -> None:
    server.then(chat_reply(tool_calls=[("call_1", "echo", '{"i": 4')]))
    server.then(chat_reply(tool_calls=[("call_2", "echo", '{"i": 4}')]))
    server.then(chat_reply("4"))
    report = await Agent("a", model(), tools=[echo]).run("Echo 4.")
    assert report.ok and report.steps == 3
    nudged = server.seen[1].body["messages"]
    assert nudged[-2]["role"] == "tool" and "MalformedToolCall" in nudged[-2]["content"]
    assert nudged[-1]["role"] == "user" and "could not be used" in nudged[-1]["content"]


async def test_arguments_given_as_an_object_are_accepted(
    server: FakeOpenAI, model: MakeModel
) -> None:
    answer = chat_reply(tool_calls=[("call_1", "echo", "")])
    answer["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = {"i": 5}
    server.then(answer).then(chat_reply("5"))
    report = await Agent("a", model(), tools=[echo]).run("Echo 5.")
    assert report.ok and report.answer == "5"
    assert server.seen[1].body["messages"][-1]["content"] == '{"i": 5}'


async def test_a_tool_call_without_an_id_gets_one(server: FakeOpenAI, model: MakeModel) -> None:
    answer = chat_reply(tool_calls=[("x", "echo", '{"i": 6}'), ("y", "echo", '{"i": 7}')])
    for raw in answer["choices"][0]["message"]["tool_calls"]:
        del raw["id"]
    server.then(answer).then(chat_reply("6 and 7"))
    report = await Agent("a", model(), tools=[echo]).run("Echo 6 and 7.")
    assert report.ok
    sent = server.seen[1].body["messages"]
    ids = [c["id"] for c in sent[1]["tool_calls"]]
    assert len(set(ids)) == 2 and all(i.startswith("call_") for i in ids)
    assert [m["tool_call_id"] for m in sent[2:]] == ids


async def test_an_html_page_is_a_clean_error(server: FakeOpenAI, model: MakeModel) -> None:
    page = b"<!doctype html><html><head><title>My web app</title></head></html>"
    server.then_raw(page, content_type="text/html; charset=utf-8")
    with pytest.raises(ModelError) as info:
        await model().complete(HI, [])
    message = str(info.value)
    assert "HTTP 200" in message and "text/html" in message and "<!doctype html>" in message
    assert "base URL" in message and len(server.seen) == 1 and info.value.status == 200

    server.then_raw(page, content_type="text/html")
    report = await Agent("a", model()).run("x")
    assert report.stop.reason == "model_error" and "text/html" in report.stop.detail


async def test_a_404_suggests_checking_the_base_url(server: FakeOpenAI, model: MakeModel) -> None:
    server.then_raw(b"<html>Not Found</html>", content_type="text/html", status=404)
    with pytest.raises(ModelError, match=r"HTTP 404: <html>Not Found</html> \(is the base URL"):
        await model().complete(HI, [])


async def test_a_body_that_is_not_json_is_a_clean_error(
    server: FakeOpenAI, model: MakeModel
) -> None:
    server.then_raw(b'{"id": "chatcmpl-1", "choices": [', content_type="application/json")
    with pytest.raises(ModelError, match=r"HTTP 200 answered with application/json, not JSON"):
        await model().complete(HI, [])
    server.then_raw(b"OK", content_type="text/plain")
    with pytest.raises(ModelError, match=r"text/plain, not JSON: b'OK'"):
        await model().complete(HI, [])


async def test_an_error_object_in_a_200_is_a_clean_error(
    server: FakeOpenAI, model: MakeModel
) -> None:
    server.then(error_body("model overloaded"))
    with pytest.raises(ModelError, match="the server answered with an error: model overloaded"):
        await model().complete(HI, [])


async def test_a_reply_cut_by_the_length_limit_says_so(
    server: FakeOpenAI, model: MakeModel
) -> None:
    answer = chat_reply("The beginning of a long")
    answer["choices"][0]["finish_reason"] = "length"
    server.then(answer)
    reply = await model().complete(HI, [])
    assert (reply.finish_reason, reply.text) == ("length", "The beginning of a long")

    incomplete = responses_reply(text="Half an ans")
    incomplete["status"] = "incomplete"
    incomplete["incomplete_details"] = {"reason": "max_output_tokens"}
    server.then(incomplete)
    reply = await model(api="responses").complete(HI, [])
    assert (reply.finish_reason, reply.text) == ("length", "Half an ans")


async def test_usage_is_estimated_when_the_server_sends_none(
    server: FakeOpenAI, model: MakeModel
) -> None:
    answer = chat_reply("x" * 400)
    del answer["usage"]
    server.then(answer)
    reply = await model().complete([ChatMessage.user("y" * 800)], TOOLS)
    assert reply.usage_estimated
    assert reply.usage.input_tokens > 200 and reply.usage.output_tokens > 100


async def test_timeout(server: FakeOpenAI, model: MakeModel) -> None:
    server.then(chat_reply("late"), delay=1.0).then(chat_reply("late"), delay=1.0)
    m = model(timeout=0.2, max_retries=1)
    with pytest.raises(ModelTimeout, match=r"no answer within 0.2s \(2 attempts\)") as info:
        await m.complete(HI, [])
    assert info.value.attempts == 2


async def test_a_timeout_after_429s_says_they_were_behind_it(
    server: FakeOpenAI, model: MakeModel
) -> None:
    server.then(error_body("slow down", "rate_limit"), status=429)
    server.then(chat_reply("late"), delay=1.0)
    with pytest.raises(ModelTimeout, match=r"\(2 attempts, 1 rate limited\)") as info:
        await model(timeout=0.2, max_retries=1).complete(HI, [])
    assert (info.value.attempts, info.value.rate_limited) == (2, 1)


def test_the_default_timeout_is_tens_of_seconds() -> None:
    m = OpenAIModel("m", api_key="k")
    assert 10 <= m.timeout <= 60 and m.max_retry_after == 60


async def test_responses_api(server: FakeOpenAI, model: MakeModel) -> None:
    server.then(responses_reply(calls=[("call_9", "echo", '{"i": 9}')]))
    server.then(responses_reply(text="nine"))
    report = await Agent("a", model(api="responses"), instructions="Brief.", tools=[echo]).run(
        "Echo 9."
    )
    assert report.ok and report.answer == "nine"
    assert report.usage.input_tokens == 26
    first, second = server.seen
    assert first.path == "/v1/responses"
    assert first.body["tools"][0]["name"] == "echo"
    assert first.body["input"][0] == {"role": "developer", "content": "Brief."}
    kinds = [item.get("type", item.get("role")) for item in second.body["input"]]
    assert kinds == ["developer", "user", "function_call", "function_call_output"]
    assert second.body["input"][3]["call_id"] == "call_9"


async def test_responses_tools_are_strict_and_optional_arguments_nullable(
    server: FakeOpenAI, model: MakeModel
) -> None:
    @tool
    def find(query: str, limit: int = 5) -> list[str]:
        """Find things."""
        return [query] * limit

    server.then(responses_reply(calls=[("call_1", "find", '{"query": "x", "limit": null}')]))
    server.then(responses_reply(text="found"))
    report = await Agent("a", model(api="responses"), tools=[find]).run("Find x.")
    assert report.ok
    first, second = server.seen
    (spec,) = first.body["tools"]
    assert spec["strict"] is True
    schema = spec["parameters"]
    assert schema["required"] == ["query", "limit"] and schema["additionalProperties"] is False
    assert schema["properties"]["limit"]["type"] == ["integer", "null"]
    assert "default" not in schema["properties"]["limit"]
    # the null the strict schema asked for is dropped: the tool's default applied
    assert json.loads(second.body["input"][-1]["output"]) == ["x"] * 5
    assert second.body["input"][-2]["arguments"] == '{"query": "x"}'
    assert first.body["store"] is False
    assert first.body["include"] == ["reasoning.encrypted_content"]


async def test_a_schema_that_cannot_be_strict_is_sent_non_strict(
    server: FakeOpenAI, model: MakeModel
) -> None:
    free_form = ToolSpec(
        name="tag",
        parameters={"type": "object", "properties": {"tags": {"type": "object"}}},
    )
    server.then(responses_reply(text="ok"))
    await model(api="responses").complete(HI, [free_form])
    (spec,) = server.seen[0].body["tools"]
    assert spec["strict"] is False and spec["parameters"] == free_form.parameters


async def test_store_is_configurable(server: FakeOpenAI, model: MakeModel) -> None:
    server.then(responses_reply(text="ok"))
    await model(api="responses", store=True).complete(HI, [])
    assert server.seen[0].body["store"] is True and "include" not in server.seen[0].body


async def test_reasoning_items_are_carried_to_the_next_turn(
    server: FakeOpenAI, model: MakeModel
) -> None:
    first = responses_reply(calls=[("call_1", "echo", '{"i": 1}')])
    reasoning = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [],
        "encrypted_content": "gAAAA-opaque",
        "status": "completed",
    }
    first["output"].insert(0, reasoning)
    server.then(first).then(responses_reply(text="one"))
    report = await Agent("a", model(api="responses"), tools=[echo]).run("Echo 1.")
    assert report.ok
    sent = server.seen[1].body["input"]
    kinds = [item.get("type", item.get("role")) for item in sent]
    assert kinds == ["user", "reasoning", "function_call", "function_call_output"]
    assert sent[1] == {k: v for k, v in reasoning.items() if k != "status"}


async def test_reasoning_without_encrypted_content_is_not_sent_when_not_stored(
    server: FakeOpenAI, model: MakeModel
) -> None:
    message = ChatMessage(
        role="assistant", content="hm", reasoning=({"type": "reasoning", "id": "rs_1"},)
    )
    server.then(responses_reply(text="ok")).then(responses_reply(text="ok"))
    await model(api="responses").complete([*HI, message], [])
    assert [i.get("type", i.get("role")) for i in server.seen[0].body["input"]] == [
        "user",
        "assistant",
    ]
    await model(api="responses", store=True).complete([*HI, message], [])
    assert server.seen[1].body["input"][1] == {"type": "reasoning", "id": "rs_1"}


async def test_a_failed_response_is_a_clean_error(server: FakeOpenAI, model: MakeModel) -> None:
    failed = responses_reply(text=None)
    failed["status"] = "failed"
    failed["error"] = {"code": "server_error", "message": "the model crashed"}
    server.then(failed)
    with pytest.raises(ModelError, match="the response failed: the model crashed"):
        await model(api="responses").complete(HI, [])


async def test_a_local_server_needs_no_key(
    server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    server.then(chat_reply("no key needed"))
    async with OpenAIModel("local-model") as m:
        reply = await m.complete(HI, [])
    assert reply.text == "no key needed"
    assert "authorization" not in server.seen[0].headers


async def test_missing_key_and_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with allow_model_requests(), pytest.raises(MissingAPIKey, match="set OPENAI_API_KEY"):
        await OpenAIModel("m").complete(HI, [])
    # the test configuration keeps real models switched off
    with pytest.raises(ModelRequestsBlocked, match="real model requests are switched off"):
        await OpenAIModel("m", api_key="k").complete(HI, [])


async def test_aclose_closes_the_connections(server: FakeOpenAI) -> None:
    server.then(chat_reply("one")).then(chat_reply("two"))
    m = OpenAIModel("fake-model", base_url=server.url, api_key="k")
    assert (await m.complete(HI, [])).text == "one"
    await m.aclose()
    await m.aclose()  # twice is fine
    gc.collect()  # an unclosed socket would warn here (warnings are errors in this suite)
    assert (await m.complete(HI, [])).text == "two"  # a later call opens a new client
    await m.aclose()


async def test_a_client_passed_in_stays_open(server: FakeOpenAI) -> None:
    server.then(chat_reply("ok")).then(chat_reply("ok"))
    async with openai.AsyncOpenAI(api_key="k", base_url=server.url, max_retries=0) as client:
        async with OpenAIModel("fake-model", client=client) as m:
            await m.complete(HI, [])
        assert not client.is_closed()
        await OpenAIModel("fake-model", client=client).complete(HI, [])


def test_model_name_and_base_url_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_MODEL", "env-model")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1234/v1")
    m = OpenAIModel()
    assert (m.name, m.base_url) == ("env-model", "http://127.0.0.1:1234/v1")
    monkeypatch.delenv("OPENAI_MODEL")
    with pytest.raises(ValueError, match="set OPENAI_MODEL"):
        OpenAIModel()
