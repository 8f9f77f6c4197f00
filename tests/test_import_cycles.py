"""No import circles in teamrt: read every module's imports, build the graph, fail naming a cycle.

An edge runs from a module to each teamrt module it imports: at the top, and inside functions too
(a lazy import puts off the cost, not the dependency: two modules that import each other, however
late, are one module in two files), but not under `if TYPE_CHECKING:` (type checkers alone run
those). `from package import name` is an edge to `package.name` where that is a module, else to
`package`. Imports by string (`importlib.import_module`) are not seen, nor the import of a
package's `__init__` that Python makes before any of its modules (every module would be in a
circle with its package's `__init__` that re-exports it).

A cycle is a strongly connected component of the graph; each is named by one shortest circle
through it, so that the message says which imports to undo.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import teamrt

ROOT = Path(teamrt.__file__).parent

# Cycles in modules the bench work does not own, known when it was written: each entry is the
# set of modules in one component. A component found inside one of these passes; any other
# fails. Empty it as they are undone.
KNOWN_CYCLES: list[frozenset[str]] = []


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name."""
    return {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements anywhere in `tree` but the body of an `if TYPE_CHECKING:`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from _import_nodes(ast.Module(body=[child], type_ignores=[]))
        else:
            yield from _import_nodes(node)


def _absolute(module: str, node: ast.ImportFrom) -> str:
    """The module a `from ... import` names, its dots resolved against `module`."""
    if node.level == 0:
        return node.module or ""
    is_package = modules()[module].name == "__init__.py"
    base = module.split(".")[: len(module.split(".")) - node.level + is_package]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(module: str) -> set[str]:
    """The teamrt modules `module` imports, as the module docstring says."""
    known = modules()
    found: set[str] = set()
    tree = ast.parse(known[module].read_text(), str(known[module]))
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            source = _absolute(module, node)
            targets = [
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
                for alias in node.names
            ]
        found |= {target for target in targets if target in known and target != module}
    return found


def graph() -> dict[str, set[str]]:
    return {module: imports_of(module) for module in modules()}


def components(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's, without
    recursion: the package is deep enough to matter)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    members = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        members.add(member)
                        if member == node:
                            break
                    if len(members) > 1:
                        found.append(frozenset(members))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def shortest_circle(edges: dict[str, set[str]], members: frozenset[str]) -> list[str]:
    """One shortest circle through the component `members`, from its first module back to it."""
    start = min(members)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(edges[node] & members):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if child not in came_from:
                came_from[child] = node
                queue.append(child)
    raise AssertionError(f"{sorted(members)} is not a cycle")


def test_no_module_imports_itself_round_a_circle() -> None:
    edges = graph()
    new = [
        " -> ".join(shortest_circle(edges, members))
        for members in components(edges)
        if not any(members <= known for known in KNOWN_CYCLES)
    ]
    assert new == [], "import circles:\n" + "\n".join(new)


def test_the_graph_sees_lazy_imports_and_not_type_checking_ones() -> None:
    """The reader itself: a function's import counts, a TYPE_CHECKING one does not, and
    `from package import module` is an edge to the module."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from teamrt import errors\n"
        "if TYPE_CHECKING:\n"
        "    from teamrt.team import Team\n"
        "else:\n"
        "    import teamrt.names\n"
        "def later() -> None:\n"
        "    from teamrt.envelopes import Envelope\n"
    )
    nodes = list(_import_nodes(ast.parse(source)))
    named = {
        alias.name if isinstance(node, ast.Import) else f"{node.module}.{alias.name}"
        for node in nodes
        for alias in node.names
    }
    assert named == {"typing.TYPE_CHECKING", "teamrt.errors", "teamrt.names",
                     "teamrt.envelopes.Envelope"}  # fmt: skip
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    (found,) = components(edges)
    assert found == {"a", "b", "c"}
    assert shortest_circle(edges, found) == ["a", "b", "c", "a"]
