"""`OpenAIModel`: any OpenAI-compatible server through the official `openai` SDK.

Chat Completions with tools is the default (the API that vLLM, llama.cpp and Ollama also speak);
`api="responses"` uses the Responses API. Base URL, key and model come from the arguments or the
environment (`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `OPENAI_MODEL`). Retries are ours, not the
SDK's, so that they are counted and bounded: 429 and 5xx answers, timeouts and connection errors
are retried with exponential backoff, honouring `Retry-After`. SDK exceptions are translated into
teamrt's `ModelError` family here and nowhere else.
"""

from __future__ import annotations

import email.utils
import os
import random
import time
from collections.abc import Sequence
from typing import Any, Literal

import anyio
import openai

from teamrt.errors import MissingAPIKey, ModelError, ModelTimeout, UsageError
from teamrt.models.base import (
    ChatMessage,
    ModelReply,
    ToolCall,
    ToolSpec,
    Usage,
    check_model_requests_allowed,
)

Api = Literal["chat", "responses"]
_RETRYABLE_STATUS = {408, 409, 429}
_MAX_DELAY = 30.0


def _retry_after(exc: Exception) -> float | None:
    """Seconds from a Retry-After (or retry-after-ms) header, if the answer had one."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if not headers:
        return None
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            return float(ms) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None


class OpenAIModel:
    """A model behind an OpenAI-compatible HTTP API."""

    def __init__(
        self,
        model: str | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api: Api = "chat",
        timeout: float = 60.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        temperature: float | None = None,
        client: openai.AsyncOpenAI | None = None,
    ) -> None:
        if api not in ("chat", "responses"):
            raise UsageError(f"api must be 'chat' or 'responses', not {api!r}")
        self.model = model or os.environ.get("OPENAI_MODEL") or ""
        if not self.model:
            raise UsageError("no model name: pass model=... or set OPENAI_MODEL")
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        self._api_key = api_key
        self.api: Api = api
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.temperature = temperature
        self._client = client
        self.attempts = 0  # HTTP requests made, retries included

    @property
    def name(self) -> str:
        return self.model

    def _get_client(self) -> openai.AsyncOpenAI:
        if self._client is None:
            key = self._api_key or os.environ.get("OPENAI_API_KEY")
            if not key:
                raise MissingAPIKey(
                    f"no API key for model {self.model!r}: pass api_key=... or set "
                    "OPENAI_API_KEY (a local server that needs none accepts any value)"
                )
            self._client = openai.AsyncOpenAI(
                api_key=key, base_url=self.base_url, timeout=self.timeout, max_retries=0
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()

    async def complete(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> ModelReply:
        check_model_requests_allowed(self.model)
        client = self._get_client()
        send = self._chat if self.api == "chat" else self._responses
        for attempt in range(self.max_retries + 1):
            self.attempts += 1
            try:
                return await send(client, messages, tools)
            except (
                openai.APITimeoutError,
                openai.APIConnectionError,
                openai.APIStatusError,
            ) as exc:
                status = getattr(exc, "status_code", None)
                retryable = status is None or status in _RETRYABLE_STATUS or status >= 500
                if not retryable or attempt == self.max_retries:
                    raise self._translate(exc, status, attempt + 1) from exc
                delay = _retry_after(exc)
                if delay is None:
                    delay = self.backoff * 2**attempt * (0.5 + random.random())
                await anyio.sleep(min(delay, _MAX_DELAY))
        raise AssertionError("unreachable")  # pragma: no cover

    def _translate(self, exc: Exception, status: int | None, attempts: int) -> ModelError:
        where = f"{self.model} at {self.base_url or 'the default endpoint'}"
        if isinstance(exc, openai.APITimeoutError):
            return ModelTimeout(
                f"{where}: no answer within {self.timeout:g}s ({attempts} attempts)",
                attempts=attempts,
            )
        if status is None:
            return ModelError(
                f"{where}: {type(exc).__name__}: {exc} ({attempts} attempts)", attempts=attempts
            )
        return ModelError(
            f"{where}: HTTP {status}: {exc} ({attempts} attempts)", status=status, attempts=attempts
        )

    # -- Chat Completions --

    async def _chat(
        self,
        client: openai.AsyncOpenAI,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
    ) -> ModelReply:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": [_chat_message(m) for m in messages],
        }
        if tools:
            kwargs["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in tools
            ]
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        response = await client.chat.completions.create(**kwargs)
        if not response.choices:
            raise ModelError(f"{self.model}: the answer has no choices")
        choice = response.choices[0]
        message = choice.message
        calls = tuple(
            ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments or "{}")
            for c in (message.tool_calls or ())
            if getattr(c, "function", None) is not None
        )
        usage = response.usage
        return ModelReply(
            text=message.content,
            tool_calls=calls,
            model=response.model or self.model,
            finish_reason=choice.finish_reason,
            usage=Usage(
                requests=1,
                input_tokens=usage.prompt_tokens if usage else 0,
                output_tokens=usage.completion_tokens if usage else 0,
            ),
        )

    # -- Responses --

    async def _responses(
        self,
        client: openai.AsyncOpenAI,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
    ) -> ModelReply:
        items: list[dict[str, Any]] = []
        for m in messages:
            if m.role == "tool":
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": m.tool_call_id,
                        "output": m.content or "",
                    }
                )
                continue
            if m.content:
                items.append(
                    {"role": "developer" if m.role == "system" else m.role, "content": m.content}
                )
            for c in m.tool_calls:
                items.append(
                    {
                        "type": "function_call",
                        "call_id": c.id,
                        "name": c.name,
                        "arguments": c.arguments,
                    }
                )
        kwargs: dict[str, Any] = {"model": self.model, "input": items}
        if tools:
            kwargs["tools"] = [
                {
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                }
                for t in tools
            ]
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        response = await client.responses.create(**kwargs)
        texts: list[str] = []
        calls: list[ToolCall] = []
        for item in response.output:
            if item.type == "message":
                texts += [part.text for part in item.content if part.type == "output_text"]
            elif item.type == "function_call":
                calls.append(
                    ToolCall(id=item.call_id, name=item.name, arguments=item.arguments or "{}")
                )
        usage = response.usage
        return ModelReply(
            text="".join(texts) or None,
            tool_calls=tuple(calls),
            model=response.model or self.model,
            finish_reason=response.status,
            usage=Usage(
                requests=1,
                input_tokens=usage.input_tokens if usage else 0,
                output_tokens=usage.output_tokens if usage else 0,
            ),
        )


def _chat_message(m: ChatMessage) -> dict[str, Any]:
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content or ""}
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    return out
