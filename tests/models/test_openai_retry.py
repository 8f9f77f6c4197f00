"""The retry policy of the OpenAI adapter, decided without I/O."""

from __future__ import annotations

import email.utils
import time

import httpx2
import openai
import pytest

from teamrt.errors import ModelError, ModelTimeout
from teamrt.models.openai_retry import Retries, Tally, retry_after

RETRIES = Retries("m at http://x/v1", timeout=30, max_retries=3, backoff=1.0, max_retry_after=60)


def answer(status: int, headers: dict[str, str] | None = None) -> openai.APIStatusError:
    request = httpx2.Request("POST", "http://x/v1/chat/completions")
    response = httpx2.Response(status, headers=headers or {}, request=request, text="busy")
    return openai.APIStatusError("busy", response=response, body={"message": "busy"})


def test_retry_after_in_seconds_milliseconds_or_a_date() -> None:
    assert retry_after(answer(429, {"retry-after": "2.5"})) == 2.5
    assert retry_after(answer(429, {"retry-after-ms": "250"})) == 0.25
    later = email.utils.formatdate(time.time() + 20, usegmt=True)
    assert 15 < (retry_after(answer(503, {"retry-after": later})) or 0) <= 20
    for unreadable in ("soon", "nan", "inf", "-1", "Mon, 99 Foo 2026 00:00:00 GMT", ""):
        assert retry_after(answer(429, {"retry-after": unreadable})) is None
    assert retry_after(answer(429)) is None and retry_after(TimeoutError()) is None


def test_a_429_waits_what_the_server_asks_and_is_counted() -> None:
    tally = Tally(attempts=1)
    assert RETRIES.next_delay(answer(429, {"retry-after": "7"}), tally) == 7
    assert tally.rate_limited == 1


def test_without_retry_after_the_backoff_grows_with_jitter() -> None:
    delays = [RETRIES.next_delay(answer(500), Tally(attempts=n)) for n in (1, 2, 3)]
    for n, delay in enumerate(delays):
        assert 0.5 * 2**n <= delay <= 1.5 * 2**n


def test_a_wait_over_the_cap_ends_the_call_and_says_rate_limited() -> None:
    with pytest.raises(
        ModelError, match=r"retry after 90s.*\(1 attempts, 1 rate limited\)"
    ) as info:
        RETRIES.next_delay(answer(429, {"retry-after": "90"}), Tally(attempts=1))
    assert (info.value.status, info.value.rate_limited) == (429, 1)


def test_what_is_not_retried_and_the_last_attempt() -> None:
    with pytest.raises(ModelError, match=r"HTTP 400: busy \(1 attempts\)"):
        RETRIES.next_delay(answer(400), Tally(attempts=1))
    with pytest.raises(ModelError, match="usually ends in /v1"):
        RETRIES.next_delay(answer(404), Tally(attempts=1))
    with pytest.raises(ModelError, match=r"HTTP 502: busy \(4 attempts, 2 rate limited\)"):
        RETRIES.next_delay(answer(502), Tally(attempts=4, rate_limited=2))
    with pytest.raises(ModelTimeout, match=r"no answer within 30s \(4 attempts\)"):
        RETRIES.next_delay(TimeoutError(), Tally(attempts=4))
