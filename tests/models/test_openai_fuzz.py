"""Fuzz: random mutations of valid Chat Completions and Responses answers (whole and streamed)
give a reply or a ModelError, never any other exception. Seeded; bigger with --stress."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from teamrt.errors import ModelError
from teamrt.models import ChatMessage, ModelReply, OpenAIModel, ToolSpec, allow_model_requests
from teamrt.models.openai_stream import ChatStream, ResponsesStream
from teamrt.models.openai_wire import parse_chat, parse_responses
from tests.support.fake_openai import (
    Cut,
    FakeOpenAI,
    StreamItem,
    chat_chunks,
    chat_reply,
    responses_events,
    responses_reply,
)

TOOLS = [
    ToolSpec(
        name="find",
        parameters={
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["query"],
        },
    )
]
STRICT = {"find": TOOLS[0].parameters}
ODD_VALUES: list[Any] = [
    None,
    0,
    -1,
    2**70,
    1.5,
    float("1e308"),
    True,
    "",
    "x",
    "length",
    [],
    [None],
    {},
    {"a": 1},
    [[[[[]]]]],
    "\u0000",
    "<html>",
]


def chat_answers() -> list[dict[str, Any]]:
    with_calls = chat_reply(tool_calls=[("c1", "find", '{"query": "a"}'), ("c2", "find", "{}")])
    cut = chat_reply("partial")
    cut["choices"][0]["finish_reason"] = "length"
    return [chat_reply("hello"), with_calls, cut]


def responses_answers() -> list[dict[str, Any]]:
    reasoning = responses_reply(text="x", calls=[("c1", "find", '{"query": "a", "limit": null}')])
    reasoning["output"].insert(0, {"type": "reasoning", "id": "rs", "summary": []})
    incomplete = responses_reply(text="half")
    incomplete["status"] = "incomplete"
    incomplete["incomplete_details"] = {"reason": "max_output_tokens"}
    return [responses_reply(text="hello"), reasoning, incomplete]


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from paths(item, (*prefix, i))


def mutate(rng: random.Random, value: Any) -> Any:
    """One to three structural changes: a value replaced by an odd one, a key dropped, a list
    emptied or doubled, a key added."""
    value = copy.deepcopy(value)
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(list(paths(value)))
        if not path:
            value = copy.deepcopy(rng.choice([*ODD_VALUES, value]))
            continue
        parent = value
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        op = rng.random()
        if op < 0.5:
            parent[key] = copy.deepcopy(rng.choice(ODD_VALUES))
        elif op < 0.7 and isinstance(parent, dict):
            del parent[key]
        elif op < 0.8 and isinstance(parent[key], list):
            parent[key] = copy.deepcopy(parent[key] * 2) if rng.random() < 0.5 else []
        elif op < 0.9 and isinstance(parent[key], dict):
            odd = copy.deepcopy(rng.choice(ODD_VALUES))
            parent[key][rng.choice(["type", "id", "error", "usage", "status"])] = odd
        elif isinstance(parent[key], str):
            parent[key] = parent[key][: rng.randint(0, len(parent[key]))]
    return value


def mangle(rng: random.Random, data: bytes) -> bytes:
    """A byte-level change: cut short, a byte changed, or garbage around it."""
    op = rng.random()
    if op < 0.4:
        return data[: rng.randint(0, len(data))]
    if op < 0.7 and data:
        i = rng.randrange(len(data))
        return data[:i] + bytes([rng.randrange(256)]) + data[i + 1 :]
    return rng.choice([b"<html>", b"\xff\xfe", b"null", b"", b"]"]) + data


def outcome(fn: Callable[[], ModelReply]) -> str:
    try:
        reply = fn()
    except ModelError:
        return "error"
    assert isinstance(reply, ModelReply)
    return "reply"


@pytest.fixture
def rounds(stress: bool) -> int:
    return 20 if stress else 1


def test_parsers_take_any_mutation(rounds: int) -> None:
    rng = random.Random(1234)
    seen = set()
    for _ in range(300 * rounds):
        chat = mutate(rng, rng.choice(chat_answers()))
        seen.add(outcome(lambda: parse_chat(chat)))  # noqa: B023 -- called at once
        answer = mutate(rng, rng.choice(responses_answers()))
        seen.add(outcome(lambda: parse_responses(answer, STRICT)))  # noqa: B023 -- called at once
    assert seen == {"reply", "error"}


def feed_stream(state: ChatStream | ResponsesStream, items: list[StreamItem]) -> ModelReply:
    for item in items:
        if isinstance(item, str):
            state.feed(item)
    return state.reply()


def test_stream_decoders_take_any_mutation(rounds: int) -> None:
    rng = random.Random(99)
    seen = set()
    for _ in range(200 * rounds):
        chunks = chat_chunks(["a", "b"], tool_calls=[("c1", "find", '{"query": "q"}')])
        events = responses_events(["a", "b"], calls=[("c1", "find", '{"query": "q"}')])
        for items, state in ((chunks, ChatStream()), (events, ResponsesStream(STRICT))):
            i = rng.randrange(len(items))
            item = items[i]
            assert isinstance(item, str)
            if item != "[DONE]" and rng.random() < 0.7:
                items[i] = json.dumps(mutate(rng, json.loads(item)))
            else:
                items[i] = mangle(rng, item.encode()).decode("utf-8", "replace")
            seen.add(outcome(lambda: feed_stream(state, items)))  # noqa: B023 -- called at once
    assert seen == {"reply", "error"}


async def test_the_adapter_takes_any_mutated_answer_over_http(rounds: int) -> None:
    rng = random.Random(7)
    counts = {"reply": 0, "error": 0}
    with FakeOpenAI() as server, allow_model_requests():
        chat = OpenAIModel("m", base_url=server.url, api_key="k", max_retries=0, timeout=5)
        responses = OpenAIModel(
            "m", base_url=server.url, api_key="k", max_retries=0, timeout=5, api="responses"
        )
        async with chat, responses:
            for n in range(40 * rounds):
                model = chat if n % 2 == 0 else responses
                answers = chat_answers() if model is chat else responses_answers()
                answer = mutate(rng, rng.choice(answers))
                kind = rng.random()
                if kind < 0.6:
                    server.then(answer)
                elif kind < 0.85:
                    data = mangle(rng, json.dumps(answer).encode())
                    server.then_raw(data, rng.choice(["application/json", "text/html", ""]))
                else:
                    server.then_raw(json.dumps(answer).encode(), status=rng.choice([200, 404, 502]))
                try:
                    reply = await model.complete([ChatMessage.user("hi")], TOOLS)
                except ModelError:
                    counts["error"] += 1
                else:
                    assert isinstance(reply, ModelReply) and reply.attempts == 1
                    counts["reply"] += 1
    assert counts["reply"] and counts["error"]


async def test_the_adapter_takes_any_mutated_stream_over_http(rounds: int) -> None:
    rng = random.Random(11)
    counts = {"reply": 0, "error": 0}
    with FakeOpenAI() as server, allow_model_requests():
        chat = OpenAIModel("m", base_url=server.url, api_key="k", max_retries=0, timeout=5)
        responses = OpenAIModel(
            "m", base_url=server.url, api_key="k", max_retries=0, timeout=5, api="responses"
        )
        async with chat, responses:
            for n in range(30 * rounds):
                model = chat if n % 2 == 0 else responses
                items: list[StreamItem] = (
                    chat_chunks(["a", "b"], tool_calls=[("c1", "find", '{"query": "q"}')])
                    if model is chat
                    else responses_events(["a", "b"], calls=[("c1", "find", '{"query": "q"}')])
                )
                i = rng.randrange(len(items))
                item = items[i]
                assert isinstance(item, str)
                op = rng.random()
                if op < 0.5 and item != "[DONE]":
                    items[i] = json.dumps(mutate(rng, json.loads(item)))
                elif op < 0.8:
                    items[i] = mangle(rng, f"data: {item}\n\n".encode())
                else:
                    items[i:] = [Cut()]
                server.then_stream(items)
                try:
                    async for _ in model.stream([ChatMessage.user("hi")], TOOLS):
                        pass
                except ModelError:
                    counts["error"] += 1
                else:
                    counts["reply"] += 1
    assert counts["reply"] and counts["error"]
