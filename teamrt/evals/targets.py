"""What an eval runs: an agent, a team, or a function, each asked one case at a time.

`load_target("module:object")` resolves what the user named:

- an `Agent`, or a function of no arguments returning one (called once per case, so that each
  case gets a fresh agent: a factory is what lets cases run side by side);
- a `Teammate` or a list of them (a team), or a function returning that: each case runs on a
  team of its own, in a scratch team directory (or `runs/<case id>` to keep it for `teamrt
  replay`), asked through `team.ask` like any lead would;
- a function taking the input (sync or async) and returning the answer: a string, a
  `RunReport` or a `TaskResult`.

Each asks the target and turns what came back into an `Outcome`: the answer, how the run
stopped, steps, tool calls, tokens and cost.
"""

from __future__ import annotations

import inspect
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import anyio
from pydantic import BaseModel

from teamrt.agents.loop import Agent
from teamrt.agents.state import RunReport
from teamrt.errors import TeamrtError, UsageError
from teamrt.evals.cases import Case
from teamrt.mail import open_mailboxes
from teamrt.models.base import Model
from teamrt.private_files import make_dirs
from teamrt.specs import load_object
from teamrt.team import TaskResult, Team, Teammate
from teamrt.teamdir import TeamDir


class Outcome(BaseModel):
    """What the target answered for one case, and what it took."""

    answer: str | None
    stop_reason: str | None = None  # "answer", "limit", ...; None when the target says nothing
    detail: str = ""
    steps: int = 0
    tool_calls: int = 0
    tokens: int = 0
    cost: float | None = None  # USD; None when unknown

    @classmethod
    def of(cls, value: object) -> Outcome:
        """An outcome from what a target returned: a string, a `RunReport` or a `TaskResult`."""
        if isinstance(value, Outcome):
            return value
        if isinstance(value, str):
            return cls(answer=value)
        if isinstance(value, RunReport):
            return cls(
                answer=value.answer if value.answer is not None else value.partial,
                stop_reason=value.stop.reason,
                detail=value.stop.detail,
                steps=value.steps,
                tool_calls=value.tool_calls,
                tokens=value.usage.total_tokens,
                cost=value.cost,
            )
        if isinstance(value, TaskResult):
            return cls(
                answer=value.answer,
                stop_reason=value.stop_reason,
                detail=value.detail,
                steps=value.steps,
                tool_calls=value.tool_calls,
                tokens=value.tokens,
                cost=value.cost,
            )
        raise UsageError(
            f"the target returned a {type(value).__name__}; it must return a string, a "
            "RunReport or a TaskResult"
        )


class Target(Protocol):
    """Runs one case and says what came back. `timeout` is the case's time limit (the caller
    enforces it too; a team passes it on to its request)."""

    @property
    def name(self) -> str: ...

    async def __call__(self, case: Case, *, timeout: float) -> Outcome: ...


class AgentTarget:
    """Each case on an agent from `make`: a fresh one per case from a factory, so cases run
    side by side; an agent made twice (one agent for every case) runs one case at a time."""

    def __init__(self, make: Callable[[], Agent], name: str = "agent") -> None:
        self.make = make
        self.name = name
        self._locks: weakref.WeakKeyDictionary[Agent, anyio.Lock] = weakref.WeakKeyDictionary()

    async def __call__(self, case: Case, *, timeout: float) -> Outcome:
        agent = _expect(self.make(), Agent, self.name, "an Agent")
        lock = self._locks.setdefault(agent, anyio.Lock())
        async with lock:  # the runs of one agent must not interleave
            return Outcome.of(await agent.run(case.input))


class TeamTarget:
    """Each case on a team of its own from `make` (teammates), asked through `team.ask`: the
    case's `member`, else `member`, else the first teammate. With `runs`, the case's team
    directory is `runs/<case id>` and is kept (`teamrt replay`, `--from-run`); otherwise it
    is a scratch directory, removed after the case."""

    def __init__(
        self,
        make: Callable[[], Sequence[Teammate]],
        name: str = "team",
        *,
        member: str | None = None,
        runs: Path | None = None,
    ) -> None:
        self.make = make
        self.name = name
        self.member = member
        self.runs = runs

    async def __call__(self, case: Case, *, timeout: float) -> Outcome:
        teammates = list(self.make())
        if not teammates:
            raise UsageError(f"{self.name} has no teammates")
        asked = case.member or self.member or teammates[0].name
        names = [t.name for t in teammates]  # a pool's replicas may be asked by name too
        names += [
            f"{t.name}-{i}" for t in teammates if t.replicas > 1 for i in range(1, t.replicas + 1)
        ]
        if asked not in names:
            raise UsageError(f"no teammate named {asked!r} (the team has {', '.join(names)})")
        if self.runs is not None:
            directory = self.runs / case.id
            _clear_run(directory)
            make_dirs(self.runs)
            return await self._ask(teammates, asked, directory, case, timeout)
        with tempfile.TemporaryDirectory(prefix="teamrt-eval-") as scratch:
            return await self._ask(teammates, asked, Path(scratch) / case.id, case, timeout)

    async def _ask(
        self, teammates: list[Teammate], member: str, directory: Path, case: Case, timeout: float
    ) -> Outcome:
        roster = ["lead", *(t.name for t in teammates)]
        async with (
            open_mailboxes(directory, members=roster) as mail,
            Team(mail, teammates, agent_dir=TeamDir(directory).agents.path) as team,
        ):
            return Outcome.of(await team.ask(member, case.input, timeout=timeout))


def _clear_run(directory: Path) -> None:
    """Remove a case's team that an earlier eval left at `directory`; refuse anything else
    there (it is the user's: `--runs .` and a case named like one of their folders)."""
    if not os.path.lexists(directory):
        return
    if directory.is_symlink() or not TeamDir(directory).roster.is_file():
        raise UsageError(
            f"--runs: {directory} is there and is not a team directory (of an earlier eval); "
            "it is left alone: move it, or give --runs another directory"
        )
    shutil.rmtree(directory)


class FunctionTarget:
    """Each case's input given to `function` (sync or async), which returns the answer."""

    def __init__(self, function: Callable[[str], Any], name: str = "function") -> None:
        self.function = function
        self.name = name

    async def __call__(self, case: Case, *, timeout: float) -> Outcome:
        result = self.function(case.input)
        if inspect.isawaitable(result):
            result = await result
        return Outcome.of(result)


def _expect(value: object, kind: type, spec: str, what: str) -> Any:
    if not isinstance(value, kind):
        raise UsageError(f"{spec} gave a {type(value).__name__}, not {what}")
    return value


def _teammates(value: object) -> list[Teammate] | None:
    if isinstance(value, Teammate):
        return [value]
    if isinstance(value, list | tuple) and value and all(isinstance(v, Teammate) for v in value):
        return list(value)
    return None


def _wants_input(function: Callable[..., Any]) -> bool:
    """True for a function of one required argument (the input), False for a factory."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    required = [
        p
        for p in parameters
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    return len(required) == 1


def resolve(spec: str, option: str = "--target") -> Any:
    """The object `module:object` names (see `teamrt.specs.load_object`)."""
    return load_object(spec, option, "mypkg.evals:agent")


def _call(factory: Callable[[], Any], spec: str) -> Any:
    try:
        return factory()
    except TeamrtError:
        raise
    except Exception as exc:
        raise TeamrtError(f"{spec}: calling it raised {type(exc).__name__}: {exc}") from None


def make_target(
    value: object, name: str, *, member: str | None = None, runs: Path | None = None
) -> Target:
    """A target for `value`: an `Agent`, teammates, a function of the input, or a function of
    no arguments returning an agent or teammates (called again for each case)."""
    if isinstance(value, Agent):
        agent = value
        return AgentTarget(lambda: agent, name)
    teammates = _teammates(value)
    if teammates is not None:
        return TeamTarget(lambda: teammates, name, member=member, runs=runs)
    if not callable(value):
        raise UsageError(
            f"{name} is a {type(value).__name__}: name an Agent, a Teammate or a list of "
            "them, a function returning one, or a function of the input returning the answer"
        )
    if _wants_input(value):
        return FunctionTarget(value, name)
    factory: Callable[[], Any] = value
    sample = _call(factory, name)  # what it makes decides how each case is run
    if isinstance(sample, Agent):
        first: list[Agent] = [sample]  # the first case gets the agent made here

        def agent_factory() -> Agent:
            return first.pop() if first else _call(factory, name)

        return AgentTarget(agent_factory, name)
    if _teammates(sample) is not None:
        made: list[Any] = [sample]

        def team_factory() -> list[Teammate]:
            found = _teammates(made.pop() if made else _call(factory, name))
            if found is None:
                raise UsageError(f"{name} returned something other than teammates")
            return found

        return TeamTarget(team_factory, name, member=member, runs=runs)
    raise UsageError(
        f"{name} returned a {type(sample).__name__}, not an Agent or teammates (a function "
        "of the input must take exactly one argument)"
    )


def load_target(spec: str, *, member: str | None = None, runs: Path | None = None) -> Target:
    """The target `--target module:object` names (see the module's docstring)."""
    return make_target(resolve(spec), spec, member=member, runs=runs)


def load_judge(spec: str) -> Model:
    """The judge model `--judge` names: `openai` (an `OpenAIModel` from OPENAI_MODEL,
    OPENAI_BASE_URL and OPENAI_API_KEY), or `module:object` naming a `Model` or a function of
    no arguments returning one."""
    if spec == "openai":
        from teamrt.models import OpenAIModel

        model: object = OpenAIModel()
    else:
        model = resolve(spec, "--judge")
        if callable(model) and not isinstance(model, Model):
            model = _call(model, spec)
    if not isinstance(model, Model):
        raise UsageError(f"--judge {spec} is a {type(model).__name__}, not a model")
    return model
