"""The conductor demo: builders make a small real Python package pass its pytest checks.

The goal comes with its checks (the tests are written first); a planner model breaks it into
subtasks with checks; two builder teammates write the package's files through a tool; the
conductor runs each subtask's check itself, sends a failing piece back with the output (the
offline `mul` builder gets it wrong the first time), checks the seams after each accepted piece,
and runs the acceptance test at the end. Everything is real: files, pytest runs, inbox files.
Offline the planner and the builders are functions; `model="openai"` puts all of them on
`OpenAIModel` (see `teamrt.demos.real`).

A run that is not accepted ends with every builder's stop reports and one line saying why: a
builder's model error, the planner's, a subtask escalated to a human (the demo stops there
rather than wait for an answer), or the conductor's outcome.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import anyio

from teamrt.agents import tool
from teamrt.conductor import Conductor, ConductorState, Decision, Plan, Policy, Subtask
from teamrt.demos import real
from teamrt.demos.workspace import claim
from teamrt.errors import TeamrtError
from teamrt.mail import open_mailboxes
from teamrt.models import ChatMessage, ModelReply, ToolSpec, call
from teamrt.private_files import write_private
from teamrt.team import IDLE, IdleBody, Team, Teammate
from teamrt.teamdir import TeamDir

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


GOAL = (
    "Make the Python package `calc` in the work directory pass its tests, which are already "
    "written: tests/test_add.py (calc/add.py: add(a, b)), tests/test_mul.py (calc/mul.py: "
    "mul(a, b)), tests/test_cli.py (calc/__main__.py: `python -m calc A B` prints "
    "'sum S, product P') and acceptance_test.py. Each check must be exactly "
    f"`{PYTEST} <test file>` (no other command may run); the acceptance check is "
    f"`{PYTEST} acceptance_test.py`."
)
BUILDER = (
    "You build pieces of a small Python package. Read what you need with list_files and "
    "read_file (the tests say what the code must do), write each file with write_file (a path "
    "relative to the work directory), then answer in one line with what you wrote."
)
BUILDERS = ("builder-1", "builder-2")


def planner_brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
    """The offline planner: the plan above, as the JSON a planner model answers with."""
    return json.dumps(plan().model_dump(mode="json"))


def builder_brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
    """The offline builder: writes the piece its newest subtask names (`mul` wrong at first)."""
    if messages[-1].role == "tool":
        return f"done: {messages[-1].content}"
    # the newest task: a builder keeps its context from one subtask to the next
    task = next((m.content or "" for m in reversed(messages) if m.role == "user"), "")
    subtask = task.split(":", 1)[0].removeprefix("Subtask ").strip()
    path, source = SOURCES[subtask]
    if subtask == "mul" and "failed" not in task:
        source = BUGGY_MUL  # the first attempt is wrong; the check will say so
    return call("write_file", path=path, content=source)


def builders(workdir: Path, model: str = "offline") -> list[Teammate]:
    @tool
    def list_files() -> list[str]:
        """The files of the work directory (paths relative to it)."""
        return sorted(
            str(p.relative_to(workdir))
            for p in workdir.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and "conductor" not in p.parts
        )

    @tool
    def read_file(path: str) -> str:
        """The text of a file of the work directory."""
        target = (workdir / path).resolve()
        if workdir.resolve() not in target.parents or not target.is_file():
            raise FileNotFoundError(f"no file {path!r} in the work directory")
        return target.read_text()

    @tool
    def write_file(path: str, content: str) -> str:
        """Write a file of the package (a path relative to the work directory)."""
        target = (workdir / path).resolve()
        if workdir.resolve() not in target.parents:
            raise ValueError(f"{path!r} is outside the work directory")
        write_private(target, content)
        return f"wrote {path}"

    prices = real.prices()
    return [
        Teammate(
            name,
            lambda: real.make_model(model, builder_brain, "builder"),
            instructions=BUILDER,
            tools=[list_files, read_file, write_file],
            prices=prices,
        )
        for name in BUILDERS
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


async def run(root: Path, model: str = "offline", store: str | None = None) -> int:
    """Run the demo in `root`/conductor-team/ (the team, the conductor's state, the package in
    work/): 0 when the acceptance check passed; otherwise 1, after the stop reports and one line
    saying why. `store`: a store URL for the team's inboxes instead of files (the conductor's
    state and the agents' journals stay in the directory). `MemberBusy` if the directory is in
    use by a run that has not ended."""
    await real.check_environment(model)
    team_dir = root / "conductor-team"
    what = "the team, the conductor's state in conductor/, the package in work/"
    with claim(team_dir, "conductor", what=what):
        if store is not None:
            await real.fresh_team(store)  # the demo's own inboxes from an earlier run
        return await _run(team_dir, model, store)


async def _run(team_dir: Path, model: str, store: str | None) -> int:
    workdir = team_dir / "work"
    state_path = TeamDir(team_dir).conductor_state
    for path, text in SCAFFOLD.items():
        write_private(workdir / path, text)
    where = store or str(team_dir)
    print(f"goal: make the calc package in {workdir} pass its tests\n")
    planner = real.make_model(model, planner_brain, "planner")
    state: ConductorState | None = None
    stopped: list[str] = []  # why the demo stopped the conductor, if it did
    try:
        async with (
            open_mailboxes(where) as mail,
            Team(mail, builders(workdir, model), agent_dir=TeamDir(team_dir).agents.path) as team,
        ):
            with _quiet_escalations(), anyio.CancelScope() as scope:

                def stop(why: str) -> None:
                    stopped.append(why)
                    scope.cancel()

                def show(decision: Decision) -> None:
                    _show(decision)
                    if decision.action == "escalate":  # nobody is there to answer: stop
                        stop(
                            f"subtask {decision.subtask} was escalated to a human: "
                            + decision.detail.split(";")[0]
                        )

                conductor = Conductor(
                    team,
                    GOAL,
                    planner=planner,
                    workdir=workdir,
                    policy=Policy.prefixes(f"{sys.executable} -m pytest"),
                    state_path=state_path,
                    on_decision=show,
                )
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_watch_models, team, stop)
                    try:
                        state = await conductor.run()
                    except TeamrtError as exc:  # the planner's model error, or no valid plan
                        stop(f"the conductor stopped: {exc}")
                    tg.cancel_scope.cancel()
    finally:
        if hasattr(planner, "aclose"):
            await planner.aclose()
    state = state or ConductorState.load(state_path)
    if state is not None:
        print(f"\noutcome: {state.outcome or 'stopped by the demo'} after {state.step} steps")
        failed = [d for d in state.decisions if d.evidence is not None and not d.evidence.passed]
        for d in failed:
            tail = " ".join(d.evidence.tail.split())[-160:] if d.evidence else ""
            print(f"evidence for step {d.step} ({d.subtask}): {tail}")
    print()
    found = real.print_reports(where, BUILDERS, TeamDir(team_dir).agents.path)
    print(f"\ndecisions with evidence: {state_path}")
    shown = f"'{where}'" if store is not None else where
    print(f"everything is in:       {team_dir}/ (the package in {workdir}/)")
    print(f"replay the team:        teamrt replay {shown}")
    failure = stopped[0] if stopped else real.first_failure(found, BUILDERS)
    if failure is None and (state is None or state.outcome != "accepted"):
        outcome = state.outcome if state is not None else "without a state"
        failure = f"the conductor's run ended {outcome}, not accepted"
    return real.fail(failure) if failure is not None else 0


async def _watch_models(team: Team, stop: Callable[[str], None]) -> None:
    """Stop at a builder whose model failed. The conductor takes a worker's empty answer for
    an attempt and checks it, round after round; a failing model service will not get better
    by that. (A builder says how its task ended in the idle notice it sends the lead.)"""
    while True:
        for envelope in list(team.notices):
            if envelope.type != IDLE or not isinstance(envelope.body, dict):
                continue
            last = IdleBody.model_validate(envelope.body).last
            if last is not None and last.stop_reason == "model_error":
                stop(f"{envelope.sender} stopped early (model_error): {last.detail}")
                return
        await anyio.sleep(0.1)


@contextmanager
def _quiet_escalations() -> Iterator[None]:
    """The demo says an escalation itself, and stops there: the conductor's announcement
    (a warning on its logger, on the terminal when logging is not configured) would ask for an
    answer that nobody will give."""
    logger = logging.getLogger("teamrt.conductor")
    handler, propagate = logging.NullHandler(), logger.propagate
    logger.addHandler(handler)  # not the last-resort handler on the terminal
    logger.propagate = False  # nor the handlers of a configured root logger
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
