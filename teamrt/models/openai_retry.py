"""Retries of a model call: which failures are tried again, how long to wait, and how a failure
reads when the call ends. Decisions only (no sleeping, no I/O): after each failed attempt the
adapter asks `Retries.next_delay` and sleeps that long, or raises the `ModelError` it got.

Retried: 408, 409, 429 and 5xx answers, timeouts, dropped connections and broken streams, with
jittered exponential backoff, or after the server's `Retry-After` when it can be read. A
`Retry-After` longer than `max_retry_after` ends the call at once: waiting less than asked would
only earn another 429. Every error says how many attempts there were and how many were 429s.
"""

from __future__ import annotations

import email.utils
import math
import random
import time
from dataclasses import dataclass

import httpx2
import openai

from teamrt.errors import ModelError, ModelTimeout
from teamrt.models.openai_wire import StreamFault

_RETRYABLE_STATUS = {408, 409, 429}
TRANSIENT = (
    openai.APIConnectionError,  # APITimeoutError too
    openai.APIStatusError,
    httpx2.HTTPError,  # raised while a stream's body is read
    httpx2.StreamError,
    TimeoutError,  # the adapter's own limit on one attempt
    StreamFault,
)
_TIMEOUTS = (openai.APITimeoutError, TimeoutError, httpx2.TimeoutException)


@dataclass
class Tally:
    """Attempts of one call, and how many of them were answered 429."""

    attempts: int = 0
    rate_limited: int = 0

    def __str__(self) -> str:
        limited = f", {self.rate_limited} rate limited" if self.rate_limited else ""
        return f"{self.attempts} attempts{limited}"


@dataclass(frozen=True)
class Retries:
    where: str  # "model at base URL", the start of every message
    timeout: float
    max_retries: int
    backoff: float
    max_retry_after: float

    def next_delay(self, exc: BaseException, tally: Tally) -> float:
        """Seconds to wait before the next attempt, after `exc` ended this one; raises the
        `ModelError` that ends the call when there is to be no next attempt."""
        status = exc.status_code if isinstance(exc, openai.APIStatusError) else None
        if status == 429:
            tally.rate_limited += 1
        retryable = status is None or status in _RETRYABLE_STATUS or status >= 500
        if not retryable or tally.attempts > self.max_retries:
            raise self.error(exc, status, tally) from exc
        delay = retry_after(exc)
        if delay is not None and delay > self.max_retry_after:
            raise self._error(
                f"HTTP {status}: the server asks to retry after {delay:g}s, more than "
                f"max_retry_after={self.max_retry_after:g}s",
                tally,
                status,
            ) from exc
        if delay is None:
            delay = self.backoff * 2 ** (tally.attempts - 1) * (0.5 + random.random())
        return min(delay, self.max_retry_after)

    def error(self, exc: BaseException, status: int | None, tally: Tally) -> ModelError:
        """The error that ends a call whose last attempt failed with `exc`."""
        if isinstance(exc, _TIMEOUTS):
            return self._error(f"no answer within {self.timeout:g}s", tally, cls=ModelTimeout)
        if status is None:
            return self._error(f"{type(exc).__name__}: {str(exc) or 'no detail'}", tally)
        message = f"HTTP {status}: {status_detail(exc)}"
        if status == 404:
            message += " (is the base URL an OpenAI-compatible API? It usually ends in /v1)"
        return self._error(message, tally, status)

    def unusable(self, exc: ModelError, tally: Tally) -> ModelError:
        """An answer that could not be used (not retried)."""
        return self._error(str(exc), tally, exc.status or 200)

    def broken(self, exc: BaseException, tally: Tally) -> ModelError:
        """A stream that failed after part of its text was passed on (not retried)."""
        if isinstance(exc, _TIMEOUTS):
            return self._error(
                f"the stream stalled for more than {self.timeout:g}s after part of the answer "
                "was passed on",
                tally,
                cls=ModelTimeout,
            )
        return self._error(
            f"the stream broke after part of the answer was passed on: {type(exc).__name__}: {exc}",
            tally,
        )

    def _error(
        self,
        message: str,
        tally: Tally,
        status: int | None = None,
        cls: type[ModelError] = ModelError,
    ) -> ModelError:
        return cls(
            f"{self.where}: {message} ({tally})",
            status=status,
            attempts=tally.attempts,
            rate_limited=tally.rate_limited,
        )


def retry_after(exc: BaseException) -> float | None:
    """Seconds from a Retry-After (or retry-after-ms) header, or None when there is none or it
    cannot be read (then the backoff applies)."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if not headers:
        return None
    seconds: float | None = None
    try:
        if (ms := headers.get("retry-after-ms")) is not None:
            seconds = float(ms) / 1000
        elif (value := headers.get("retry-after")) is not None:
            try:
                seconds = float(value)
            except ValueError:
                when = email.utils.parsedate_to_datetime(value)
                seconds = max(0.0, when.timestamp() - time.time())
    except (ValueError, TypeError, IndexError, OverflowError):
        return None
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return None
    return seconds


def status_detail(exc: BaseException) -> str:
    """What an error answer said: its error message, else the start of its body."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:300]
    response = getattr(exc, "response", None)
    try:
        text = response.text if response is not None else str(exc)
    except Exception:  # the body could not be decoded: say what the SDK said
        text = str(exc)
    return str(text)[:200] or str(exc)[:200]
