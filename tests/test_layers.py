"""The store seam holds: read every module's imports and names, fail when a layer reaches past it.

- nothing above the stores (teams, agents, the conductor, replay, the CLI, the demos) imports a
  concrete store's module, names a store class, or opens an inbox file itself: it goes through
  `Mailboxes`, `open_mailboxes` / `open_view` and the `TeamView` tools read;
- the mailbox layer (`teamrt.mail`) imports nothing above it;
- the store-agnostic mail modules (mailboxes, inbox, store, log, cursor) name no concrete store.

The benchmarks are the one exception above the stores: they measure the file store itself (raw
locked appends, rotation, depth), so they may name it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import teamrt

ROOT = Path(teamrt.__file__).parent
CONCRETE_MODULES = ("teamrt.mail.filestore", "teamrt.mail.memory", "teamrt.mail.redisstore",
                    "teamrt.mail.inotify")  # fmt: skip
STORE_NAMES = {"FileStore", "MemoryStore", "RedisStore", "FileReader", "InboxPaths", "FileView"}
BELOW_MAIL = {"teamrt.envelopes", "teamrt.errors", "teamrt.names", "teamrt.telemetry",
              "teamrt._posix", "teamrt.codec", "teamrt.private_files"}  # fmt: skip
AGNOSTIC = ["mail/mailboxes.py", "mail/inbox.py", "mail/store.py", "mail/log.py",
            "mail/cursor.py", "mail/group.py", "mail/signing.py"]  # fmt: skip
# may name a concrete store: they measure it
MEASURES_FILES = {
    "cli/bench.py",
    "cli/bench_team.py",
    "cli/bench_models.py",
    "cli/bench_startup.py",
    "cli/bench_store.py",
}


def _modules(under: str = "") -> list[Path]:
    return sorted((ROOT / under).rglob("*.py"))


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def _names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    found |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found |= {alias.name for alias in node.names}
    return found


def _above_stores() -> list[Path]:
    return [
        p
        for p in _modules()
        if not p.is_relative_to(ROOT / "mail")
        and p.relative_to(ROOT).as_posix() not in MEASURES_FILES
        and p.name != "__init__.py"  # the package re-exports every public class
        and not p.is_relative_to(ROOT / "testing")  # the conformance suite tests stores
    ]


def test_nothing_above_the_stores_imports_a_concrete_store() -> None:
    offenders = [
        f"{p.relative_to(ROOT)} imports {name}"
        for p in _above_stores()
        for name in _imports(p)
        if name.startswith(CONCRETE_MODULES)
    ]
    assert offenders == []


def test_nothing_above_the_stores_names_a_store_class() -> None:
    offenders = [
        f"{p.relative_to(ROOT)} names {sorted(_names(p) & STORE_NAMES)}"
        for p in _above_stores()
        if _names(p) & STORE_NAMES
    ]
    assert offenders == []


def test_nothing_above_the_stores_opens_an_inbox_file() -> None:
    """Inbox files are `inboxes/<name>.jsonl`; a tool that builds that path reads past the
    store. (Agents' own journals under agents/ are theirs to read.)"""
    path_join = re.compile(r"""/\s*["']inboxes\b|["']inboxes["']\s*/|\.jsonl["'].*inbox""")
    offenders = [
        str(p.relative_to(ROOT)) for p in _above_stores() if path_join.search(p.read_text())
    ]
    assert offenders == []


def test_the_mail_layer_imports_nothing_above_it() -> None:
    offenders = [
        f"{p.relative_to(ROOT)} imports {name}"
        for p in _modules("mail")
        for name in _imports(p)
        if name.startswith("teamrt.")
        and not name.startswith("teamrt.mail")
        and not any(name == m or name.startswith(m + ".") for m in BELOW_MAIL)
    ]
    assert offenders == []


def test_the_store_agnostic_modules_name_no_concrete_store() -> None:
    offenders = []
    for relative in AGNOSTIC:
        path = ROOT / relative
        concrete = [n for n in _imports(path) if n.startswith(CONCRETE_MODULES)]
        named = _names(path) & (STORE_NAMES | {"FileMailboxes", "MemoryMailboxes"})
        if concrete or named:
            offenders.append(f"{relative}: {concrete} {sorted(named)}")
    assert offenders == []
