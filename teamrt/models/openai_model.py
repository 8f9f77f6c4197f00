"""`OpenAIModel`: any OpenAI-compatible server through the official `openai` SDK.

Chat Completions with tools is the default (the API that vLLM, llama.cpp and Ollama also speak);
`api="responses"` uses the Responses API. Base URL, key and model come from the arguments or the
environment (`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `OPENAI_MODEL`); a base URL without a key is a
local server that needs none. The SDK sends and receives; the answer's bytes are decoded by
`openai_wire` and `openai_stream` (pure), so any answer is a reply or a `ModelError`, never
another exception.

Retries are ours, not the SDK's (which is told to make none), so that they are counted and
bounded; `openai_retry` decides them. A stream is only retried while nothing of it was passed
on. Every reply (and every `ModelError` after retries) says how many attempts it took and how
many were answered 429. SDK and HTTP exceptions are translated here and nowhere else.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import openai

from teamrt.errors import MissingAPIKey, UsageError
from teamrt.models.base import (
    ChatMessage,
    ModelReply,
    OutputSpec,
    TextDelta,
    ToolSpec,
    Usage,
    check_model_requests_allowed,
    message_tokens,
)
from teamrt.models.openai_retry import TRANSIENT, Retries, Tally
from teamrt.models.openai_stream import ChatStream, ResponsesStream, SSEDecoder
from teamrt.models.openai_wire import (
    OutputFormat,
    ResponsesTools,
    Unusable,
    chat_body,
    decode_json,
    parse_chat,
    parse_responses,
    responses_body,
)

Api = Literal["chat", "responses"]


@dataclass(frozen=True)
class _Call:
    body: dict[str, Any]
    strict: dict[str, dict[str, Any]]
    output: OutputFormat | None = None


log = logging.getLogger("teamrt.models")


class OpenAIModel:
    """A model behind an OpenAI-compatible HTTP API.

    `timeout` bounds one HTTP request (for a stream: the wait for each chunk); `max_retries`
    more are made after a transient failure, waiting `backoff * 2**n` (jittered) or what the
    server's `Retry-After` asks, as long as that is at most `max_retry_after` seconds. `store`
    (Responses API) keeps responses on the server; off by default. A client passed in is the
    caller's to close; one the model made is closed by `aclose()` (or `async with`).

    Typed answers (`Agent(..., output_type=...)`) use the server's structured output: the
    answer's schema goes as `response_format` (Chat Completions) or `text.format` (Responses),
    strict when strict mode can express it. For a server that does not support it, pass
    `structured_output=False`: the agent then asks for the answer through a tool.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api: Api = "chat",
        timeout: float = 30.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_retry_after: float = 60.0,
        temperature: float | None = None,
        store: bool = False,
        client: openai.AsyncOpenAI | None = None,
        structured_output: bool = True,
    ) -> None:
        if api not in ("chat", "responses"):
            raise UsageError(f"api must be 'chat' or 'responses', not {api!r}")
        if not timeout > 0:
            raise UsageError(f"timeout must be positive, not {timeout!r}")
        self.model = model or os.environ.get("OPENAI_MODEL") or ""
        if not self.model:
            raise UsageError("no model name: pass model=... or set OPENAI_MODEL")
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        self._api_key = api_key
        self.api: Api = api
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_retry_after = max_retry_after
        self.temperature = temperature
        self.store = store
        self._structured = structured_output
        self._client = client
        self._owns_client = client is None
        self._headers: dict[str, Any] = {}
        self.attempts = 0  # HTTP requests made over the model's life, retries included

    @property
    def name(self) -> str:
        return self.model

    @property
    def structured_output(self) -> bool:
        """Whether typed answers are asked for with the server's structured output."""
        return self._structured

    @property
    def suspends(self) -> bool:
        """Whether every call yields to the event loop (see `Model`): with the client this
        model makes, each call waits for an HTTP response; a client passed in may be one that
        answers without waiting (a test double), so the agent loop keeps its own checkpoint."""
        return self._owns_client

    def _get_client(self) -> openai.AsyncOpenAI:
        if self._client is None:
            key = self._api_key or os.environ.get("OPENAI_API_KEY")
            if not key:
                if not self.base_url:
                    raise MissingAPIKey(
                        f"no API key for model {self.model!r}: pass api_key=... or set "
                        "OPENAI_API_KEY (for a local server that needs no key, set "
                        "OPENAI_BASE_URL or pass base_url=... alone)"
                    )
                # a local server that needs no key: send no Authorization header at all
                key, self._headers = "unused", {"Authorization": openai.omit}
            self._client = openai.AsyncOpenAI(
                api_key=key, base_url=self.base_url, timeout=self.timeout, max_retries=0
            )
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP client the model made (its connections); a later call opens a new one."""
        client, self._client = self._client, None
        if client is not None and self._owns_client:
            await client.close()
        elif client is not None:
            self._client = client

    async def __aenter__(self) -> OpenAIModel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- one call ------------------------------------------------------------------------------

    def _prepare(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        output: OutputSpec | None = None,
    ) -> _Call:
        fmt = OutputFormat.of(output) if output is not None else None
        if self.api == "chat":
            return _Call(chat_body(self.model, messages, tools, self.temperature, fmt), {}, fmt)
        specs = ResponsesTools.of(tools)
        body = responses_body(self.model, messages, specs, self.temperature, self.store, fmt)
        return _Call(body, specs.strict, fmt)

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        output: OutputSpec | None = None,
    ) -> ModelReply:
        """One call: the reply, or a `ModelError` after retries. With `output`, the answer is
        held to its schema by the server's structured output."""
        check_model_requests_allowed(self.model)
        client = self._get_client()
        call = self._prepare(messages, tools, output)
        retries, tally = self._retries(), Tally()
        while True:
            tally.attempts += 1
            self.attempts += 1
            try:
                with anyio.fail_after(self.timeout):
                    reply = await self._send(client, call)
            except Unusable as exc:
                raise retries.unusable(exc, tally) from None
            except TRANSIENT as exc:
                delay = retries.next_delay(exc, tally)
                log.info("%s: attempt %d failed (%s); retrying in %.2fs", self.model,
                         tally.attempts, type(exc).__name__, delay)  # fmt: skip
                await anyio.sleep(delay)
                continue
            except openai.OpenAIError as exc:  # anything else the SDK refuses: not retried
                raise retries.error(exc, None, tally) from exc
            return self._finish(reply, call, messages, tools, tally)

    async def _send(self, client: openai.AsyncOpenAI, call: _Call) -> ModelReply:
        if self.api == "chat":
            raw: Any = await client.chat.completions.with_raw_response.create(
                **call.body, extra_headers=self._headers, timeout=self.timeout
            )
        else:
            raw = await client.responses.with_raw_response.create(
                **call.body, extra_headers=self._headers, timeout=self.timeout
            )
        http = raw.http_response
        kind = http.headers.get("content-type", "")
        return self._parse(decode_json(http.status_code, kind, http.content), call)

    def _parse(self, body: Any, call: _Call) -> ModelReply:
        return parse_chat(body) if self.api == "chat" else parse_responses(body, call.strict)

    def _finish(
        self,
        reply: ModelReply,
        call: _Call,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        tally: Tally,
    ) -> ModelReply:
        update: dict[str, Any] = {
            "model": reply.model or self.model,
            "attempts": tally.attempts,
            "rate_limited": tally.rate_limited,
        }
        if reply.usage_estimated:
            update["usage"] = estimate_usage(messages, tools, reply)
        if call.output is not None:
            reply = call.output.clean(reply)
        return reply.model_copy(update=update)

    def _retries(self) -> Retries:
        where = f"{self.model} at {self.base_url or 'the default endpoint'}"
        return Retries(where, self.timeout, self.max_retries, self.backoff, self.max_retry_after)

    # -- streaming -----------------------------------------------------------------------------

    async def stream(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        output: OutputSpec | None = None,
    ) -> AsyncIterator[TextDelta | ModelReply]:
        """Yield `TextDelta`s as the text is written, then the whole `ModelReply`.

        A fault before any text was passed on (a dropped connection, a malformed or truncated
        chunk, a stall longer than `timeout`) is retried like a failed request; after that it
        ends the stream with a `ModelError`. Close the iterator (`contextlib.aclosing`) when
        leaving it early, so that the connection is released at once.
        """
        check_model_requests_allowed(self.model)
        client = self._get_client()
        call = self._prepare(messages, tools, output)
        retries, tally = self._retries(), Tally()
        while True:
            tally.attempts += 1
            self.attempts += 1
            passed_on = False
            try:
                async with aclosing(self._events(client, call)) as events:
                    async for item in events:
                        if isinstance(item, TextDelta):
                            passed_on = True
                            yield item
                        else:
                            reply = item
            except Unusable as exc:
                raise retries.unusable(exc, tally) from None
            except TRANSIENT as exc:
                if passed_on:
                    raise retries.broken(exc, tally) from exc
                delay = retries.next_delay(exc, tally)
                log.info("%s: stream attempt %d failed (%s); retrying in %.2fs", self.model,
                         tally.attempts, type(exc).__name__, delay)  # fmt: skip
                await anyio.sleep(delay)
                continue
            except openai.OpenAIError as exc:
                raise retries.error(exc, None, tally) from exc
            yield self._finish(reply, call, messages, tools, tally)
            return

    async def _events(
        self, client: openai.AsyncOpenAI, call: _Call
    ) -> AsyncGenerator[TextDelta | ModelReply, None]:
        """One attempt: the text deltas of one streamed answer, then its reply."""
        if self.api == "chat":
            opened: Any = client.chat.completions.with_streaming_response.create(
                **call.body,
                stream=True,
                stream_options={"include_usage": True},
                extra_headers=self._headers,
                timeout=self.timeout,
            )
            state: ChatStream | ResponsesStream = ChatStream()
        else:
            opened = client.responses.with_streaming_response.create(
                **call.body, stream=True, extra_headers=self._headers, timeout=self.timeout
            )
            state = ResponsesStream(call.strict)
        with anyio.fail_after(self.timeout):
            response = await opened.__aenter__()
        try:
            http = response.http_response
            kind = http.headers.get("content-type", "")
            if "event-stream" not in kind:
                # a server that does not stream (or an HTML page): read it as a whole answer
                with anyio.fail_after(self.timeout):
                    data = await http.aread()
                reply = self._parse(decode_json(http.status_code, kind, data), call)
                if reply.text:
                    yield TextDelta(text=reply.text)
                yield reply
                return
            # each read waits at most `timeout` (the request's read timeout); the clock here
            # catches a server that keeps sending bytes (comments, blank lines) but no event
            decoder = SSEDecoder()
            lines = http.aiter_lines()
            quiet_since = time.monotonic()
            async for line in lines:
                data = decoder.feed(line)
                if data is None:
                    if time.monotonic() - quiet_since > self.timeout:
                        raise TimeoutError
                    continue
                quiet_since = time.monotonic()
                if piece := state.feed(data):
                    yield TextDelta(text=piece)
                if _finished(state):
                    break
            else:
                if (data := decoder.flush()) is not None and (piece := state.feed(data)):
                    yield TextDelta(text=piece)
            reply = state.reply()
            with anyio.move_on_after(min(self.timeout, 1.0)):
                async for _ in lines:
                    pass  # the end of the body: the connection goes back to the pool
            yield reply
        finally:
            await opened.__aexit__(None, None, None)


def _finished(state: ChatStream | ResponsesStream) -> bool:
    return state.done if isinstance(state, ChatStream) else state.final is not None


def estimate_usage(
    messages: Sequence[ChatMessage], tools: Sequence[ToolSpec], reply: ModelReply
) -> Usage:
    """Tokens of a call whose answer reported none: about 4 characters a token."""
    given = sum(message_tokens(m) for m in messages)
    for t in tools:
        given += (len(t.name) + len(t.description) + len(json.dumps(t.parameters))) // 4
    return Usage(requests=1, input_tokens=given, output_tokens=message_tokens(reply.as_message()))
