"""Keeping an agent's context under its token budget.

Two layers, cheapest first. (1) A tool result the model has already read (an assistant turn
came after it) is shortened to its first few hundred characters. (2) If the context is still too
big, the older turns are replaced by one summary message: written by a summariser model when one
is given, otherwise a deterministic note of what was dropped. The pinned head (instructions and
task) and the most recent turns are never touched, and a tool result is never separated from the
assistant turn that asked for it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from teamrt.models.base import ChatMessage, Model, Usage, message_tokens

SUMMARY_PREFIX = "[Summary of earlier steps]"


def context_tokens(messages: Sequence[ChatMessage]) -> int:
    return sum(message_tokens(m) for m in messages)


@dataclass(frozen=True)
class Memory:
    """The context budget and how to meet it."""

    max_context_tokens: int = 16_000
    keep_recent: int = 8  # messages at the end that are never shortened or summarised
    used_result_chars: int = 300  # a read tool result is cut to this many characters
    summariser: Model | None = None

    def over_budget(self, tokens: int) -> bool:
        return tokens > self.max_context_tokens

    async def fit(self, messages: list[ChatMessage], pinned: int) -> list[ChatMessage]:
        """A version of `messages` within budget (as close as the pinned part allows)."""
        return (await self.compact(messages, pinned)).messages

    async def compact(
        self, messages: list[ChatMessage], pinned: int, *, keep: ChatMessage | None = None
    ) -> Compacted:
        """Like `fit`, and say what the summariser spent (charge it to the agent's budgets).

        `keep`: a message that must survive verbatim (the current task); if it falls among
        the summarised turns it is put back right after the summary.
        """
        shortened = self._shorten_used_results(messages, pinned)
        if not self.over_budget(context_tokens(shortened)):
            return Compacted(shortened, Usage())
        compacted = await self._summarise_older(shortened, pinned)
        if keep is not None and not any(m is keep for m in compacted.messages):
            out = list(compacted.messages)
            out.insert(min(pinned + 1, len(out)), keep)
            compacted = Compacted(out, compacted.usage)
        if self.over_budget(context_tokens(compacted.messages)):
            trimmed = self._shorten_big_read(compacted.messages, pinned, keep)
            compacted = Compacted(trimmed, compacted.usage)
        return compacted

    def _shorten_big_read(
        self, messages: list[ChatMessage], pinned: int, keep: ChatMessage | None
    ) -> list[ChatMessage]:
        """The last resort, when summarising was not enough: a message big enough to hold the
        context over budget by itself is cut, recent or not (never the pinned head or the
        current task): to a share of the budget once the model has read it (an assistant turn
        came after it), to half the budget if it has not (it could never be shown whole)."""
        budget_chars = self.max_context_tokens * 4
        read_share = max(self.used_result_chars, budget_chars // (2 * self.keep_recent))
        last_assistant = max(
            (i for i, m in enumerate(messages) if m.role == "assistant"), default=-1
        )
        out = list(messages)
        for i in range(pinned, len(out)):
            m = out[i]
            share = read_share if i < last_assistant else budget_chars // 2
            if m is keep or m.role not in ("user", "tool") or len(m.content or "") <= share:
                continue
            text = m.content or ""
            note = f"... [shortened to fit the context budget: {len(text)} characters]"
            out[i] = m.model_copy(update={"content": text[:share] + note})
        return out

    def _shorten_used_results(self, messages: list[ChatMessage], pinned: int) -> list[ChatMessage]:
        limit = self.used_result_chars
        last_assistant = max(
            (i for i, m in enumerate(messages) if m.role == "assistant"), default=-1
        )
        protected = max(pinned, len(messages) - self.keep_recent)
        out = list(messages)
        for i in range(pinned, min(last_assistant, protected)):
            m = out[i]
            if m.role == "tool" and m.content and len(m.content) > limit:
                note = f"... [shortened after use: {len(m.content)} characters]"
                out[i] = m.model_copy(update={"content": m.content[:limit] + note})
        return out

    async def _summarise_older(self, messages: list[ChatMessage], pinned: int) -> Compacted:
        cut = max(pinned, len(messages) - self.keep_recent)
        while cut < len(messages) and messages[cut].role == "tool":
            cut += 1  # keep each tool result with the call it answers
        if cut <= pinned:
            return Compacted(messages, Usage())
        older = messages[pinned:cut]
        text, usage = await self._summary(older)
        summary = ChatMessage(role="user", content=f"{SUMMARY_PREFIX} {text}")
        return Compacted([*messages[:pinned], summary, *messages[cut:]], usage)

    async def _summary(self, older: list[ChatMessage]) -> tuple[str, Usage]:
        spent = Usage()
        if self.summariser is not None:
            transcript = "\n".join(_line(m) for m in older)
            reply = await self.summariser.complete(
                [
                    ChatMessage.system(
                        "Summarise these earlier steps of an agent's work in a few "
                        "sentences: what was tried, what was found, what is left."
                    ),
                    ChatMessage.user(transcript),
                ],
                [],
            )
            spent = reply.usage
            if reply.text:
                return reply.text, spent
        tools = Counter(c.name for m in older for c in m.tool_calls)
        earlier = [m.content for m in older if (m.content or "").startswith(SUMMARY_PREFIX)]
        notes = [m.content for m in older if m.role == "assistant" and m.content]
        parts = [f"{len(older)} earlier messages were dropped to save context (no summariser)."]
        if tools:
            parts.append(
                "Tools called: "
                + ", ".join(f"{n} x{k}" for n, k in tools.items())
                + "; their results are gone."
            )
        if earlier:
            parts.append("Before that: " + (earlier[-1] or "")[len(SUMMARY_PREFIX) :][:400].strip())
        if notes:
            parts.append(f"Last note: {notes[-1][:300]}")
        return " ".join(parts), spent


@dataclass(frozen=True)
class Compacted:
    """A compacted conversation and what the summariser spent making it."""

    messages: list[ChatMessage]
    usage: Usage


def _line(m: ChatMessage) -> str:
    calls = "; ".join(f"{c.name}({c.arguments})" for c in m.tool_calls)
    return f"{m.role}: {m.content or ''} {calls}".strip()[:2000]
