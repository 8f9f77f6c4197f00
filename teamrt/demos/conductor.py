"""The conductor demo: scripted workers make a small real Python package pass its pytest checks.

The goal comes with its checks (the tests are written first); two builder teammates write the
package's files through a tool; the conductor runs each subtask's check itself, sends a failing
piece back with the output (the `mul` builder gets it wrong the first time), checks the seams
after each accepted piece, and runs the acceptance test at the end. Everything is real: files,
pytest runs, inbox files; only the builders' models are scripted.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from teamrt.agents import tool
from teamrt.conductor import Conductor, Decision, Plan, Policy, Subtask
from teamrt.mail import FileMailboxes
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, call
from teamrt.team import Team, Teammate

PYTEST = f"{sys.executable} -m pytest -q -p no:cacheprovider"

SCAFFOLD = {
    "pytest.ini": "[pytest]\n",
    "calc/__init__.py": "",
    "tests/test_add.py": "from calc.add import add\n\n\ndef test_add():\n"
    "    assert add(2, 3) == 5\n    assert add(-1, 1) == 0\n",
    "tests/test_mul.py": "from calc.mul import mul\n\n\ndef test_mul():\n"
    "    assert mul(2, 3) == 6\n    assert mul(4, 0) == 0\n",
    "tests/test_cli.py": "import subprocess, sys\n\n\ndef test_cli():\n"
    "    out = subprocess.run([sys.executable, '-m', 'calc', '2', '3'],\n"
    "                         capture_output=True, text=True).stdout\n"
    "    assert out.strip() == 'sum 5, product 6'\n",
    "acceptance_test.py": "import subprocess, sys\n\n\ndef test_the_goal():\n"
    "    out = subprocess.run([sys.executable, '-m', 'calc', '4', '5'],\n"
    "                         capture_output=True, text=True).stdout\n"
    "    assert out.strip() == 'sum 9, product 20'\n",
}

SOURCES = {
    "add": ("calc/add.py", "def add(a, b):\n    return a + b\n"),
    "mul": ("calc/mul.py", "def mul(a, b):\n    return a * b\n"),
    "cli": (
        "calc/__main__.py",
        "import sys\n\nfrom calc.add import add\nfrom calc.mul import "
        "mul\n\na, b = (int(x) for x in sys.argv[1:3])\n"
        "print(f'sum {add(a, b)}, product {mul(a, b)}')\n",
    ),
}
BUGGY_MUL = "def mul(a, b):\n    return a + b  # oops\n"


def plan() -> Plan:
    return Plan(
        subtasks=(
            Subtask(
                id="add",
                description="Write calc/add.py: add(a, b).",
                check=f"{PYTEST} tests/test_add.py",
            ),
            Subtask(
                id="mul",
                description="Write calc/mul.py: mul(a, b).",
                check=f"{PYTEST} tests/test_mul.py",
            ),
            Subtask(
                id="cli",
                description="Write calc/__main__.py: `python -m calc A B` prints "
                "'sum S, product P'.",
                check=f"{PYTEST} tests/test_cli.py",
                depends_on=("add", "mul"),
            ),
        ),
        integration_check=f"{PYTEST} tests/test_add.py tests/test_mul.py",  # the pieces together
        acceptance_check=f"{PYTEST} acceptance_test.py",
    )


def builders(workdir: Path) -> list[Teammate]:
    @tool
    def write_file(path: str, content: str) -> str:
        """Write a file of the package (a path relative to the work directory)."""
        target = (workdir / path).resolve()
        if workdir.resolve() not in target.parents:
            raise ValueError(f"{path!r} is outside the work directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        return f"wrote {path}"

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        if messages[-1].role == "tool":
            return f"done: {messages[-1].content}"
        # the newest task: a builder keeps its context from one subtask to the next
        task = next((m.content or "" for m in reversed(messages) if m.role == "user"), "")
        subtask = task.split(":", 1)[0].removeprefix("Subtask ").strip()
        path, source = SOURCES[subtask]
        if subtask == "mul" and "failed" not in task:
            source = BUGGY_MUL  # the first attempt is wrong; the check will say so
        return call("write_file", path=path, content=source)

    return [
        Teammate(name, FunctionModel(brain, name="builder"), tools=[write_file])
        for name in ("builder-1", "builder-2")
    ]


def _show(decision: Decision) -> None:
    what = f"{decision.subtask}: " if decision.subtask else ""
    evidence = ""
    if decision.evidence is not None:
        code = decision.evidence.exit_code
        evidence = f"  [exit {code}]" if code is not None else "  [did not run]"
        if decision.evidence.error is not None:
            evidence = f"  [check error: {decision.evidence.error[:60]}]"
    print(
        f"  {decision.step:3}  {decision.by:10} {decision.action:12} {what}"
        f"{decision.detail[:70]}{evidence}"
    )


async def run(root: Path) -> int:
    workdir = root / "conductor-work"
    team_dir = root / "conductor-team"
    for directory in (workdir, team_dir):
        if directory.exists():
            shutil.rmtree(directory)  # the demo's own files from an earlier run
    for path, text in SCAFFOLD.items():
        (workdir / path).parent.mkdir(parents=True, exist_ok=True)
        (workdir / path).write_text(text)
    print(f"goal: make the calc package in {workdir} pass its tests\n")
    async with (
        FileMailboxes(team_dir) as mail,
        Team(mail, builders(workdir), agent_dir=team_dir / "agents") as team,
    ):
        conductor = Conductor(
            team,
            "calc passes its tests",
            plan=plan(),
            workdir=workdir,
            policy=Policy.prefixes(f"{sys.executable} -m pytest"),
            state_path=team_dir / "conductor" / "state.json",
            on_decision=_show,
        )
        state = await conductor.run()
    print(f"\noutcome: {state.outcome} after {state.step} steps")
    failed = [d for d in state.decisions if d.evidence is not None and not d.evidence.passed]
    for d in failed:
        tail = " ".join(d.evidence.tail.split())[-160:] if d.evidence else ""
        print(f"evidence for step {d.step} ({d.subtask}): {tail}")
    print(f"\ndecisions with evidence: {team_dir / 'conductor' / 'state.json'}")
    print(f"replay the team:        teamrt replay {team_dir}")
    return 0 if state.outcome == "accepted" else 1
