"""Every program in examples/ runs as the docs show it: as `python examples/<name>.py`, in a
fresh directory, offline, and prints what its page says it prints. The real-model example runs
against a scripted OpenAI-compatible server on 127.0.0.1, the Redis one against a private
redis-server."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support.docs_programs import DOCS, EXAMPLES, run, scratch
from tests.support.fake_openai import FakeOpenAI, chat_reply
from tests.support.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]  # the fixture

#: What each program must print (a line of its standard output, as its page shows it).
PRINTS = {
    "conductor.py": "outcome: accepted",
    "first_agent.py": "14 in stock.",
    "first_team.py": "answer - The writer wrote out/loop.md.",
    "fork_and_redrive.py": "The writer reports: Wrote a shorter out/loop.md.",
    "lead.py": "Drafted and deployed to staging. | True",
    "mailboxes.py": "{'words': 3}",
    "mcp_tools.py": "Two notes: ideas.md and todo.md.",
    "otel_spans.py": "execute_tool check_stock",
    "real_model.py": "14 earbuds are in stock.",
    "redis_team.py": "Wrote out/hello.md.",
    "streaming.py": "stopped: answer",
    "supervision.py": "restarts: 1",
    "typed_answers.py": "customer='ACME' total=12",
    "web_service.py": """200 {'answer': 'In stock: {"quantity": 14}', 'stop_reason': 'answer'}""",
}
#: Modules other programs use, not programs of their own.
HELPERS = {
    "eval_target.py": "the target of examples/eval_cases.jsonl (run by the evals page)",
    "mcp_server.py": "the MCP server mcp_tools.py starts",
}
PROGRAMS = sorted(p.name for p in EXAMPLES.glob("*.py") if p.name not in HELPERS)


def test_every_example_is_a_program_with_an_expected_output_or_a_helper() -> None:
    names = {p.name for p in EXAMPLES.glob("*.py")}
    assert names == set(PRINTS) | set(HELPERS)


def test_every_example_is_shown_on_a_page() -> None:
    pages = "\n".join(p.read_text() for p in DOCS.rglob("*.md"))
    missing = [p.name for p in EXAMPLES.iterdir() if f'--8<-- "examples/{p.name}"' not in pages]
    assert missing == []


@pytest.mark.parametrize("name", PROGRAMS)
def test_the_example_runs(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    env = scratch(tmp_path)
    if name == "redis_team.py":
        server: RedisServer = request.getfixturevalue("redis_server")
        env["TEAMRT_STORE"] = server.url("example")
    if name == "real_model.py":
        with FakeOpenAI() as fake:
            fake.then(chat_reply(tool_calls=[("c1", "check_stock", '{"sku": "EARBUDS"}')]))
            fake.then(chat_reply("14 earbuds are in stock."))
            env.update(
                OPENAI_BASE_URL=fake.url, OPENAI_MODEL="scripted", TEAMRT_ALLOW_MODEL_REQUESTS="1"
            )
            done = run(["python", f"examples/{name}"], tmp_path, env)
        assert [s.path for s in fake.seen] == ["/v1/chat/completions"] * 2
        tool_result = fake.seen[1].body["messages"][-1]
        assert tool_result["role"] == "tool" and '"quantity": 14' in tool_result["content"]
    else:
        done = run(["python", f"examples/{name}"], tmp_path, env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert PRINTS[name] in done.stdout.splitlines(), done.stdout


def test_the_tutorial_imports_from_teamrt_and_its_errors_only() -> None:
    """The common path is one import: the tutorial's programs need no deeper module."""
    shown = {
        name
        for page in (DOCS / "tutorial").glob("*.md")
        for name in re.findall(r'--8<-- "examples/([\w.]+\.py)"', page.read_text())
    }
    assert {"first_agent.py", "first_team.py", "real_model.py", "web_service.py"} <= shown
    deeper = {
        f"{name}: {node.module}"
        for name in shown
        for node in ast.walk(ast.parse((EXAMPLES / name).read_text()))
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").startswith("teamrt")
        and node.module not in ("teamrt", "teamrt.errors")
    }
    assert deeper == set()
