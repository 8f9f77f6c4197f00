"""The conductor: builders make a small Python package pass its tests, and the conductor
believes only the checks it runs itself. The plan is examples/plan.json (or plan.yaml).

Run it: python examples/conductor.py   (the checks run pytest: pip install pytest)
"""

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio

from teamrt import (
    ChatMessage,
    FileMailboxes,
    FunctionModel,
    ModelReply,
    Team,
    Teammate,
    ToolSpec,
    call,
    tool,
)
from teamrt.conductor import Conductor, Plan, Policy

WORK = Path("work")  # the package the builders write, and its tests
TEAM_DIR = Path("mailboxes/conductor")
TESTS = {
    "pytest.ini": "[pytest]\n",  # the package is its own pytest project
    "calc/__init__.py": "",
    "tests/test_add.py": "from calc.add import add\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    "tests/test_mul.py": "from calc.mul import mul\n\ndef test_mul():\n    assert mul(2, 3) == 6\n",
    "tests/test_cli.py": "import subprocess, sys\n\ndef test_cli():\n"
    "    out = subprocess.run([sys.executable, '-m', 'calc', '2', '3'], capture_output=True,"
    " text=True).stdout\n    assert out.strip() == 'sum 5, product 6'\n",
    "acceptance_test.py": "import subprocess, sys\n\ndef test_goal():\n"
    "    out = subprocess.run([sys.executable, '-m', 'calc', '4', '5'], capture_output=True,"
    " text=True).stdout\n    assert out.strip() == 'sum 9, product 20'\n",
}
SOURCES = {
    "add": ("calc/add.py", "def add(a, b):\n    return a + b\n"),
    "mul": ("calc/mul.py", "def mul(a, b):\n    return a * b\n"),
    "cli": (
        "calc/__main__.py",
        "import sys\n\nfrom calc.add import add\nfrom calc.mul import mul\n\n"
        "a, b = (int(x) for x in sys.argv[1:3])\nprint(f'sum {add(a, b)}, product {mul(a, b)}')\n",
    ),
}


@tool
def write_file(path: str, content: str) -> str:
    """Write a file of the package (a path relative to the work directory)."""
    target = WORK / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content)
    return f"wrote {path}"


def builder(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
    """An offline builder: writes the piece its newest subtask names, `mul` wrong at first."""
    if messages[-1].role == "tool":
        return f"done: {messages[-1].content}"
    task = next(m.content or "" for m in reversed(messages) if m.role == "user")
    subtask = task.split(":", 1)[0].removeprefix("Subtask ").strip()
    path, source = SOURCES[subtask]
    if subtask == "mul" and "failed" not in task:  # the conductor sends back a red check
        source = source.replace("a * b", "a + b")
    return call("write_file", path=path, content=source)


async def main() -> None:
    for old in (WORK, TEAM_DIR):
        shutil.rmtree(old, ignore_errors=True)  # each run starts afresh
    for path, text in TESTS.items():
        (WORK / path).parent.mkdir(parents=True, exist_ok=True)
        (WORK / path).write_text(text)
    # the plan's checks say `python -m pytest`: make `python` this interpreter
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    plan = Plan.load(Path(__file__).with_name("plan.json"))
    # a pool of two: `builder-1` and `builder-2`; the plan's `mul` names the role `builder`
    builders = Teammate("builder", lambda: FunctionModel(builder), tools=[write_file], replicas=2)
    async with (
        FileMailboxes(TEAM_DIR) as mail,
        Team(mail, [builders], agent_dir=TEAM_DIR / "agents") as team,
    ):
        conductor = Conductor(
            team,
            "make calc pass its tests",
            plan=plan,
            workdir=WORK,
            policy=Policy.prefixes("python -m pytest"),  # the only commands a check may run
            parallel=2,
            round_cap=3,
        )
        state = await conductor.run()
    for decision in state.decisions:
        print(decision.step, decision.subtask or "-", decision.action, decision.detail[:60])
    print("outcome:", state.outcome)  # outcome: accepted


if __name__ == "__main__":
    anyio.run(main)
