"""Teammates for the claim check tests in other processes (`teamrt run-agent --spec`): `sizer`
answers a task naming a size in bytes ("answer 5242880") with that many characters."""

from __future__ import annotations

import re
from collections.abc import Sequence

from teamrt.models import ChatMessage, FunctionModel, ToolSpec
from teamrt.team import Teammate


def _sized(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
    task = next(m.content or "" for m in reversed(messages) if m.role == "user")
    found = re.search(r"answer (\d+)", task)
    size = int(found.group(1)) if found else 10
    return "".join(chr(ord("a") + i % 26) for i in range(26)) * (size // 26) + "z" * (size % 26)


sizer = Teammate("w", FunctionModel(_sized))
