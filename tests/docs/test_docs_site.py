"""The site holds together: every page is in the navigation, nothing links outside the site
except to package pages, the guarantees page names test files that exist, and the
configuration page documents every environment variable teamrt reads."""

from __future__ import annotations

import ast
import re

import yaml

from tests.support.paths import ROOT

DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.parts)


def _nav_files(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [f for item in nav for f in _nav_files(item)]
    if isinstance(nav, dict):
        return [f for value in nav.values() for f in _nav_files(value)]
    return []


def test_every_page_is_in_the_navigation_once() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    files = _nav_files(config["nav"])
    assert sorted(files) == sorted(p.relative_to(DOCS).as_posix() for p in PAGES)
    assert len(files) == len(set(files))


def test_nothing_links_outside_the_site_but_package_pages() -> None:
    """Links and autolinks, not URLs shown in code (a local server's address)."""
    link = re.compile(r"\]\((https?://[^)\s]+)\)|<(https?://[^>\s]+)>")
    outside = [
        f"{page.relative_to(DOCS)}: {url}"
        for page in PAGES
        for found in link.finditer(page.read_text())
        for url in found.groups()
        if url and not url.startswith("https://pypi.org/project/")
    ]
    assert outside == []


def test_the_guarantees_page_names_test_files_that_exist() -> None:
    page = (DOCS / "explanation" / "guarantees.md").read_text()
    named = set(re.findall(r"`(?:tests/)?((?:\w+/)*test_\w+\.py)`", page))
    assert len(named) > 20
    assert sorted(n for n in named if not (ROOT / "tests" / n).is_file()) == []


def _variables_read() -> set[str]:
    """Every `TEAMRT_*` and `OPENAI_*` name written as a whole string in teamrt's code (the
    Redis store's error tags aside: they are replies of its scripts, not settings)."""
    found = set()
    for path in (ROOT / "teamrt").rglob("*.py"):
        if "redisstore" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            value = node.value if isinstance(node, ast.Constant) else None
            if isinstance(value, str) and re.fullmatch(r"(TEAMRT|OPENAI)_[A-Z_]+", value):
                found.add(value)
    return found


def test_the_configuration_page_documents_every_environment_variable() -> None:
    page = (DOCS / "reference" / "configuration.md").read_text()
    variables = _variables_read()
    assert {"TEAMRT_STORE", "OPENAI_API_KEY", "TEAMRT_TEAM_KEY"} <= variables
    assert sorted(v for v in variables if f"| `{v}` |" not in page) == []


def test_the_docs_extra_builds_the_site_and_dev_pins_it() -> None:
    """`pip install '.[docs]'` is enough for `mkdocs build`; `.[dev]` (what make installs)
    pins the same packages exactly."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    docs = {r.split(">")[0].split("=")[0] for r in extras["docs"]}
    assert docs == {"mkdocs-material", "mkdocstrings-python"}
    pinned = {r.split("==")[0] for r in extras["dev"] if "==" in r}
    assert docs <= pinned
