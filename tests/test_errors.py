"""The errors tree: the drawing in `teamrt.errors` is the classes, every exception teamrt raises
is in it, the families only added bases (every relationship from before the families still
holds), and `StoreError(message, errno=...)` reads, pickles and compares as the `OSError` it
was made as before."""

from __future__ import annotations

import ast
import builtins
import copy
import inspect
import pickle
import re
from pathlib import Path

import pytest

import teamrt
import teamrt.errors as errors
from teamrt.agents.mcp_tools import ServerGone, ToolError
from teamrt.conductor.plan import IllegalTransition, PlanError
from teamrt.demos.real import DemoFailed
from teamrt.errors import (
    AgentStop,
    BlobTooLarge,
    CaseError,
    Deadlock,
    DeliveryError,
    DiskFull,
    DurabilityError,
    EnvelopeTooLarge,
    InvalidEnvelope,
    InvalidName,
    InvalidOutput,
    LeaseLost,
    LimitExceeded,
    MailboxClosed,
    MCPServerError,
    MemberBusy,
    MissingAPIKey,
    ModelError,
    ModelRequestsBlocked,
    ModelTimeout,
    OutcomeUnknown,
    OutputError,
    PartialBroadcast,
    PayloadError,
    PeerError,
    ReceiveTimeout,
    RemoteError,
    RequestTimeout,
    ScriptExhausted,
    StateError,
    StopRequested,
    StoreAuthFailed,
    StoreCorrupt,
    StoreError,
    StoreOutage,
    StoreUnavailable,
    TaskWithdrawn,
    TeamKeyMismatch,
    TeammateGone,
    TeamrtError,
    ToolCrashed,
    ToolFailure,
    UnknownRecipient,
    UnsafeDirectory,
    UsageError,
)
from teamrt.evals.cases import CaseError as CasesCaseError
from teamrt.models.openai_wire import StreamFault, Unusable
from teamrt.rerun import Divergence
from tests.support.docs_programs import run, scratch

PACKAGE = Path(teamrt.__file__).parent
DOCS = PACKAGE.parent / "docs"

#: Every exception class's bases before the families were added, as they were written: each
#: must still be a base (the families only came in between).
BASES_BEFORE: list[tuple[type[BaseException], tuple[type[BaseException], ...]]] = [
    (TeamrtError, (Exception,)),
    (UsageError, (TeamrtError, ValueError)),
    (InvalidName, (UsageError,)),
    (InvalidEnvelope, (UsageError,)),
    (EnvelopeTooLarge, (UsageError,)),
    (BlobTooLarge, (EnvelopeTooLarge,)),
    (PayloadError, (UsageError,)),
    (TeamKeyMismatch, (UsageError,)),
    (UnknownRecipient, (UsageError, LookupError)),
    (MailboxClosed, (TeamrtError, RuntimeError)),
    (MemberBusy, (TeamrtError, RuntimeError)),
    (TeammateGone, (TeamrtError,)),
    (StoreError, (TeamrtError, OSError)),
    (DiskFull, (StoreError,)),
    (DurabilityError, (StoreError,)),
    (StoreUnavailable, (StoreError,)),
    (OutcomeUnknown, (StoreError,)),
    (StoreAuthFailed, (StoreError,)),
    (StoreOutage, (StoreUnavailable,)),
    (LeaseLost, (StoreError,)),
    (UnsafeDirectory, (StoreError,)),
    (StoreCorrupt, (StoreError,)),
    (PartialBroadcast, (StoreError,)),
    (ReceiveTimeout, (TeamrtError, TimeoutError)),
    (RequestTimeout, (TeamrtError, TimeoutError)),
    (ModelError, (TeamrtError,)),
    (ModelRequestsBlocked, (ModelError,)),
    (MissingAPIKey, (ModelError,)),
    (ModelTimeout, (ModelError, TimeoutError)),
    (ScriptExhausted, (ModelError,)),
    (LimitExceeded, (TeamrtError,)),
    (StopRequested, (TeamrtError,)),
    (TaskWithdrawn, (StopRequested,)),
    (Deadlock, (TeamrtError,)),
    (MCPServerError, (TeamrtError,)),
    (ToolCrashed, (TeamrtError,)),
    (OutputError, (TeamrtError,)),
    (InvalidOutput, (OutputError,)),
    (RemoteError, (TeamrtError,)),
    (PeerError, (TeamrtError,)),
    # defined in other modules before, imported from there here
    (DemoFailed, (TeamrtError,)),
    (Unusable, (ModelError,)),
    (StreamFault, (ModelError,)),
    (Divergence, (ModelError,)),
    (PlanError, (UsageError,)),
    (IllegalTransition, (TeamrtError, RuntimeError)),
    (CasesCaseError, (UsageError,)),
    (ToolError, (Exception,)),
    (ServerGone, (Exception,)),
]

#: The families a caller catches: the children of TeamrtError.
FAMILIES = [UsageError, StateError, StoreError, DeliveryError, AgentStop, ToolFailure, ModelError]

#: Exceptions that are signals inside one part of teamrt and never reach a caller (those with a
#: leading underscore are private to their module anyway).
PRIVATE_SIGNALS = {
    ("agents/output.py", "Rejected"),  # turned into InvalidOutput or feedback for the model
    ("team/team.py", "TeammateCancelled"),  # a crash's cause; its name is in the crash text
}


def _classes() -> dict[str, type[BaseException]]:
    return {
        name: value
        for name, value in vars(errors).items()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == errors.__name__
    }


def _drawing() -> list[tuple[int, str, tuple[str, ...]]]:
    """The tree in the module's docstring: (depth, name, mixins) a line, top to bottom."""
    assert errors.__doc__ is not None
    lines = errors.__doc__.split("\n    TeamrtError\n", 1)[1].split("\n\n", 1)[0].splitlines()
    drawn: list[tuple[int, str, tuple[str, ...]]] = [(0, "TeamrtError", ())]
    for line in lines:
        found = re.fullmatch(r"    ((?:[│ ]   )*)[├└]── (\w+)(?:\(([\w, ]+)\))?\s.*", line)
        assert found is not None, f"not a line of the tree: {line!r}"
        prefix, name, mixins = found.groups()
        drawn.append((len(prefix) // 4 + 1, name, tuple(re.findall(r"\w+", mixins or ""))))
    return drawn


def test_the_drawing_is_the_tree() -> None:
    drawn = _drawing()
    classes = _classes()
    assert sorted(name for _, name, _ in drawn) == sorted(classes)
    parents: list[str] = []
    for depth, name, mixins in drawn:
        parents[depth:] = [name]
        expected = (classes[parents[depth - 1]],) if depth else (Exception,)
        expected += tuple(getattr(builtins, mixin) for mixin in mixins)
        assert classes[name].__bases__ == expected, name


def test_the_drawing_is_in_the_order_of_the_module() -> None:
    assert [name for _, name, _ in _drawing()] == list(_classes())


def test_teamrt_error_has_only_the_families_below_it() -> None:
    assert TeamrtError.__subclasses__() == FAMILIES


@pytest.mark.parametrize(
    ("kind", "bases"), BASES_BEFORE, ids=[kind.__name__ for kind, _ in BASES_BEFORE]
)
def test_every_base_from_before_the_families_still_holds(
    kind: type[BaseException], bases: tuple[type[BaseException], ...]
) -> None:
    assert all(issubclass(kind, base) for base in bases)
    assert issubclass(kind, TeamrtError)


def test_the_classes_moved_here_are_still_importable_where_they_were() -> None:
    assert (DemoFailed, Unusable, StreamFault, Divergence) == (
        errors.DemoFailed,
        errors.Unusable,
        errors.StreamFault,
        errors.Divergence,
    )
    assert (PlanError, IllegalTransition, CasesCaseError) == (
        errors.PlanError,
        errors.IllegalTransition,
        CaseError,
    )
    assert (ToolError, ServerGone) == (errors.ToolError, errors.ServerGone)
    import teamrt.conductor
    import teamrt.evals

    assert teamrt.conductor.PlanError is PlanError
    assert teamrt.conductor.IllegalTransition is IllegalTransition
    assert teamrt.evals.CaseError is CaseError


def _exception_classes(tree: ast.Module, known: set[str]) -> list[str]:
    """The classes a module defines whose bases are exceptions (known ones, or its own)."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = {ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases}
            if bases & (known | set(found)):
                found.append(node.name)
    return found


def test_every_exception_teamrt_raises_is_in_errors() -> None:
    known = {name for name, value in vars(builtins).items() if inspect.isclass(value)}
    known = {name for name in known if issubclass(getattr(builtins, name), BaseException)}
    known |= set(_classes())
    outside = {
        (str(path.relative_to(PACKAGE)), name)
        for path in PACKAGE.rglob("*.py")
        if path.name != "errors.py"
        for name in _exception_classes(ast.parse(path.read_text()), known)
        if not name.startswith("_")
    }
    assert outside == PRIVATE_SIGNALS


def test_the_private_signals_stay_in_their_part_of_teamrt() -> None:
    """`TeammateCancelled` is used in the team layer only; `Rejected` by the agent and the team,
    which turn it into `InvalidOutput` or feedback."""
    users: dict[str, set[str]] = {name: set() for _, name in PRIVATE_SIGNALS}
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        for name in users:
            if re.search(rf"\b{name}\b", text):
                users[name].add(str(path.relative_to(PACKAGE)))
    parts = {"TeammateCancelled": ("team/",), "Rejected": ("agents/", "team/")}
    strays = {
        name: sorted(p for p in paths if p != "errors.py" and not p.startswith(parts[name]))
        for name, paths in users.items()
    }
    assert strays == {"TeammateCancelled": [], "Rejected": []}


# --- StoreError(message, errno=...) -------------------------------------------------------------

STORE_ERRORS = [
    kind
    for kind in _classes().values()
    if issubclass(kind, StoreError) and kind is not PartialBroadcast
]


@pytest.mark.parametrize("kind", STORE_ERRORS, ids=[kind.__name__ for kind in STORE_ERRORS])
@pytest.mark.parametrize("errno", [None, 0, 2, 28])
def test_a_store_error_reads_as_the_os_error_it_was_made_as_before(
    kind: type[StoreError], errno: int | None
) -> None:
    error = kind("write inbox: No space left on device", errno=errno)
    before = (
        OSError("write inbox: No space left on device")
        if errno is None
        else OSError(errno, "write inbox: No space left on device")
    )
    assert (str(error), error.args, error.errno, error.strerror) == (
        str(before),
        before.args,
        before.errno,
        before.strerror,
    )
    assert error.filename is None and isinstance(error, OSError)


def test_the_errno_prefix_is_kept_where_an_errno_was_given() -> None:
    assert str(StoreError("no team at /x", errno=2)) == "[Errno 2] no team at /x"
    assert str(StoreError("no team at /x")) == "no team at /x"
    with pytest.raises(TypeError):
        StoreError(2, "no team at /x")  # type: ignore[arg-type, call-arg]


@pytest.mark.parametrize("kind", STORE_ERRORS, ids=[kind.__name__ for kind in STORE_ERRORS])
@pytest.mark.parametrize("errno", [None, 0, 5])
def test_a_store_error_pickles_and_copies_as_itself(
    kind: type[StoreError], errno: int | None
) -> None:
    """A process tool's exception is pickled back to the agent, so it must come back whole."""
    error = kind("the store went away", errno=errno)
    error.hint = "try again"  # type: ignore[attr-defined]
    for again in (pickle.loads(pickle.dumps(error)), copy.copy(error)):
        assert type(again) is kind
        assert (str(again), again.args, again.errno, again.strerror) == (
            str(error),
            error.args,
            error.errno,
            error.strerror,
        )
        assert again.hint == "try again"  # type: ignore[attr-defined]


def test_a_partial_broadcast_pickles_with_who_got_it() -> None:
    error = PartialBroadcast("broadcast reached a, not b", ("a",), ("b",))
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is PartialBroadcast and str(again) == str(error)
    assert (again.delivered, again.undelivered, again.errno) == (("a",), ("b",), None)


def test_no_store_error_is_made_with_a_bare_errno() -> None:
    names = "|".join(kind.__name__ for kind in STORE_ERRORS)
    bare = re.compile(rf"\b(?:{names})\(\s*(?:\d|exc\.errno|errno\.)")
    found = [
        f"{path.relative_to(PACKAGE)}: {match.group()}"
        for path in PACKAGE.rglob("*.py")
        for match in bare.finditer(path.read_text())
    ]
    assert found == []


# --- the reference ------------------------------------------------------------------------------


def test_the_reference_shows_every_family_and_its_example_runs(tmp_path: Path) -> None:
    page = (DOCS / "reference" / "errors.md").read_text()
    for family in FAMILIES:
        assert f"| `{family.__name__}`" in page, family.__name__
    (example,) = re.findall(r"```python\n(.*?)```", page, re.DOTALL)
    program = tmp_path / "catching.py"
    program.write_text(example)
    done = run(["python", str(program)], tmp_path, scratch(tmp_path))
    assert done.returncode == 0, done.stderr
    asked, sent = done.stdout.splitlines()
    assert asked.startswith("no answer: no response from worker to request ")
    assert sent == "refused: no member 'nobody' in team 'team' (members: lead, worker)"
