"""Streaming: OpenAIModel.stream over real HTTP (with the faults a local server injects), and the
offline models' streams."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

import pytest

from teamrt.errors import ModelError, ModelTimeout
from teamrt.models import (
    ChatMessage,
    FunctionModel,
    ModelReply,
    OpenAIModel,
    ScriptedModel,
    StreamingModel,
    TextDelta,
    ToolSpec,
    allow_model_requests,
    call,
)
from tests.support.fake_openai import (
    Cut,
    FakeOpenAI,
    StreamItem,
    chat_chunks,
    chat_reply,
    responses_events,
)

HI = [ChatMessage.user("hi")]
MakeModel = Callable[..., OpenAIModel]


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake, allow_model_requests():
        yield fake


@pytest.fixture
async def model(server: FakeOpenAI) -> AsyncIterator[MakeModel]:
    made: list[OpenAIModel] = []

    def make(**kwargs: object) -> OpenAIModel:
        options: dict[str, object] = {"api_key": "k", "backoff": 0.01, **kwargs}
        made.append(OpenAIModel("fake-model", base_url=server.url, **options))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for m in made:
        await m.aclose()


async def collect(
    model: StreamingModel, tools: Sequence[ToolSpec] = ()
) -> tuple[list[str], ModelReply]:
    pieces: list[str] = []
    replies: list[ModelReply] = []
    async for item in model.stream(HI, tools):
        if isinstance(item, TextDelta):
            assert not replies, "text after the reply"
            pieces.append(item.text)
        else:
            replies.append(item)
    assert len(replies) == 1, "exactly one reply, last"
    return pieces, replies[0]


async def test_chat_stream_yields_text_then_the_reply(server: FakeOpenAI, model: MakeModel) -> None:
    server.then_stream(chat_chunks(["Hel", "lo ", "world."], usage=(20, 3)))
    m = model()
    assert isinstance(m, StreamingModel)
    pieces, reply = await collect(m)
    assert pieces == ["Hel", "lo ", "world."]
    assert reply.text == "Hello world." and reply.finish_reason == "stop"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (20, 3)
    assert (reply.attempts, reply.usage_estimated) == (1, False)
    body = server.seen[0].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


async def test_chat_stream_with_tool_calls(server: FakeOpenAI, model: MakeModel) -> None:
    server.then_stream(
        chat_chunks([], tool_calls=[("call_1", "echo", '{"i": 1}'), ("call_2", "echo", '{"i": 2}')])
    )
    pieces, reply = await collect(model())
    assert pieces == [] and reply.text is None
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("call_1", "echo", '{"i": 1}'),
        ("call_2", "echo", '{"i": 2}'),
    ]


async def test_a_stream_cut_by_the_length_limit_says_so(
    server: FakeOpenAI, model: MakeModel
) -> None:
    server.then_stream(chat_chunks(["Once upon"], finish_reason="length", usage=None))
    _pieces, reply = await collect(model())
    assert reply.finish_reason == "length" and reply.text == "Once upon"
    assert reply.usage_estimated and reply.usage.output_tokens > 0


async def test_responses_stream(server: FakeOpenAI, model: MakeModel) -> None:
    server.then_stream(responses_events(["Nine ", "it is."]))
    pieces, reply = await collect(model(api="responses"))
    assert pieces == ["Nine ", "it is."] and reply.text == "Nine it is."
    assert reply.usage.input_tokens == 13 and server.seen[0].body["stream"] is True


async def test_a_server_that_does_not_stream_still_answers(
    server: FakeOpenAI, model: MakeModel
) -> None:
    server.then(chat_reply("all at once"))
    pieces, reply = await collect(model())
    assert pieces == ["all at once"] and reply.text == "all at once"


async def test_a_dropped_connection_before_any_text_is_retried(
    server: FakeOpenAI, model: MakeModel
) -> None:
    first = chat_chunks(["lost"])
    server.then_stream([first[0], Cut()]).then_stream(chat_chunks(["kept"]))
    pieces, reply = await collect(model())
    assert pieces == ["kept"] and reply.attempts == 2


async def test_a_dropped_connection_after_text_is_a_clean_error(
    server: FakeOpenAI, model: MakeModel
) -> None:
    first = chat_chunks(["passed ", "on"])
    server.then_stream([*first[:2], Cut()])
    pieces: list[str] = []

    async def read() -> None:
        async for item in model().stream(HI, []):
            assert isinstance(item, TextDelta)
            pieces.append(item.text)

    with pytest.raises(ModelError, match="the stream broke after part of the answer") as info:
        await read()
    assert pieces == ["passed "] and len(server.seen) == 1 and info.value.attempts == 1


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(['{"choices": [{"delta": {"content": "x"'], id="malformed chunk"),
        pytest.param(["[1, 2, 3]"], id="chunk not an object"),
        pytest.param([b'data: {"choi'], id="truncated chunk"),
        pytest.param([], id="ended without a finish"),
    ],
)
async def test_a_broken_stream_is_retried_then_reported(
    server: FakeOpenAI, model: MakeModel, fault: list[StreamItem]
) -> None:
    server.then_stream(fault).then_stream(chat_chunks(["fine"]))
    _pieces, reply = await collect(model())
    assert reply.text == "fine" and reply.attempts == 2

    server.then_stream(fault).then_stream(fault)
    with pytest.raises(ModelError, match=r"\(2 attempts\)") as info:
        await collect(model(max_retries=1))
    assert type(info.value) is ModelError


async def test_a_stall_is_retried_then_a_timeout(server: FakeOpenAI, model: MakeModel) -> None:
    chunks = chat_chunks(["slow"])
    server.then_stream([chunks[0], 1.0, *chunks[1:]]).then_stream(chat_chunks(["quick"]))
    _pieces, reply = await collect(model(timeout=0.2))
    assert reply.text == "quick" and reply.attempts == 2

    server.then_stream([*chunks[:2], 1.0, *chunks[2:]])
    with pytest.raises(ModelTimeout, match=r"stalled for more than 0.2s after part"):
        await collect(model(timeout=0.2))


async def test_a_stream_of_comments_only_times_out(server: FakeOpenAI, model: MakeModel) -> None:
    chunks = chat_chunks(["never"])
    keepalive: list[StreamItem] = [chunks[0]] + [b": keep-alive\n\n", 0.05] * 20
    server.then_stream(keepalive)
    with pytest.raises(ModelTimeout, match=r"no answer within 0.2s \(1 attempts\)"):
        await collect(model(timeout=0.2, max_retries=0))


async def test_an_error_event_is_a_clean_error(server: FakeOpenAI, model: MakeModel) -> None:
    server.then_stream([json.dumps({"type": "error", "code": "x", "message": "bad input"})])
    with pytest.raises(ModelError, match="error mid-stream: bad input"):
        await collect(model(api="responses"))
    server.then_stream([json.dumps({"error": {"message": "quota"}})])
    with pytest.raises(ModelError, match="error mid-stream: quota"):
        await collect(model())
    assert len(server.seen) == 2


async def test_a_status_error_before_the_stream_is_retried(
    server: FakeOpenAI, model: MakeModel
) -> None:
    server.then({"error": {"message": "busy"}}, status=429, headers={"retry-after": "0"})
    server.then_stream(chat_chunks(["ok"]))
    _pieces, reply = await collect(model())
    assert reply.text == "ok" and (reply.attempts, reply.rate_limited) == (2, 1)


async def test_leaving_a_stream_early_releases_it(server: FakeOpenAI, model: MakeModel) -> None:
    server.then_stream(chat_chunks(["a ", "b ", "c"])).then(chat_reply("next"))
    m = model()
    stream = m.stream(HI, [])
    async for _ in stream:
        break
    await stream.aclose()  # type: ignore[attr-defined]
    assert (await m.complete(HI, [])).text == "next"


async def test_scripted_and_function_models_stream() -> None:
    scripted = ScriptedModel(["The answer is forty-two, as it always was.", call("t", x=1)])
    pieces, reply = await collect(scripted)
    assert len(pieces) > 1 and "".join(pieces) == reply.text
    assert reply.text == "The answer is forty-two, as it always was."
    pieces, reply = await collect(scripted)
    assert pieces == [] and reply.tool_calls[0].name == "t"
    scripted.assert_done()

    function = FunctionModel(lambda messages, tools: f"You said {messages[-1].content}.")
    pieces, reply = await collect(function)
    assert "".join(pieces) == "You said hi." and reply.model == "function"
    assert isinstance(function, StreamingModel) and isinstance(scripted, StreamingModel)
