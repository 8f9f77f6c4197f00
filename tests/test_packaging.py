"""Packaging: one version, an SPDX license with its file, dependencies that are used, extras that
run what they name, the OpenAI SDK loaded only when an OpenAI model is made, and a sentence
instead of a missing module off POSIX. (CI builds the wheel and runs the demo from it:
`.ci/run`.)"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import teamrt

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT.parent,  # not the checkout: what is installed is what is imported
    )


def test_one_version_everywhere() -> None:
    assert "version" in PROJECT["dynamic"]
    assert importlib.metadata.version("teamrt") == teamrt.__version__


def test_license_is_an_spdx_string_with_its_file() -> None:
    assert PROJECT["license"] == "MIT"
    assert PROJECT["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")


def _imported_modules(package: Path) -> dict[Path, set[str]]:
    """Per module: the top-level names of what it imports at module level."""
    found: dict[Path, set[str]] = {}
    for path in package.rglob("*.py"):
        names: set[str] = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[path.relative_to(package.parent)] = names
    return found


def test_every_dependency_is_imported_and_nothing_undeclared_is_needed() -> None:
    """A declared dependency nothing imports (as aiofiles and filelock were) is dead weight on
    every install."""
    declared = {
        requirement.split(">")[0].split("=")[0].split("[")[0].strip().lower()
        for requirement in PROJECT["dependencies"]
    }
    imported: set[str] = set()
    for names in _imported_modules(ROOT / "teamrt").values():
        imported |= names
    # openai is imported at module level only by the adapter, and by name elsewhere on demand
    assert declared <= imported | {"openai"}, declared - imported
    assert "openai" in imported
    assert not {"aiofiles", "filelock"} & (imported | declared)


def test_only_the_adapter_imports_openai_at_module_level() -> None:
    importers = {
        str(path) for path, names in _imported_modules(ROOT / "teamrt").items() if "openai" in names
    }
    assert importers and all(p.startswith("teamrt/models/openai_") for p in importers), importers


def test_the_openai_sdk_is_loaded_only_when_an_openai_model_is_made() -> None:
    result = _python(
        "import sys\n"
        "import teamrt, teamrt.agents, teamrt.team, teamrt.conductor, teamrt.models\n"
        "import teamrt.testing, teamrt.cli.main, teamrt.cli.bench, teamrt.agents.limits\n"
        "before = 'openai' in sys.modules\n"
        "from teamrt.models import OpenAIModel\n"
        "print(before, 'openai' in sys.modules, OpenAIModel.__module__)\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True", "teamrt.models.openai_model"]


def test_a_platform_without_fcntl_is_told_teamrt_is_posix_only() -> None:
    result = _python("import sys\nsys.modules['fcntl'] = None\nimport teamrt.mail\n")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: teamrt runs on POSIX systems only")
    assert "fcntl" in last


def test_extras_install_what_they_run() -> None:
    """`service` runs a Starlette app: it needs the app, a server and the demo's client."""
    extras = PROJECT["optional-dependencies"]
    service = {r.split(">")[0].split("=")[0] for r in extras["service"]}
    assert {"starlette", "uvicorn", "httpx"} <= service
    dev = {r.split("=")[0] for r in extras["dev"]}
    assert service <= dev  # the tests run what the extra promises
    assert "build" in dev  # CI builds the sdist and the wheel with it


def test_the_console_script_is_declared_and_answers() -> None:
    assert PROJECT["scripts"] == {"teamrt": "teamrt.cli.main:main"}
    result = _python("from teamrt.cli.main import main; main(['--version'])")
    assert result.stdout.strip() == f"teamrt {teamrt.__version__}"


@pytest.mark.stress
def test_bench_measures_startup_beside_a_bare_interpreter(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            *(sys.executable, "-m", "teamrt", "bench", "--smoke", "--json", "--only", "startup"),
            *("--dir", str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    figures = {f["name"]: f for f in json.loads(result.stdout)["figures"]}
    assert set(figures) == {
        "import teamrt, fresh process, median of 3",
        "import teamrt.agents.limits, fresh process, median of 3",
        "teamrt --version, fresh process, median of 3",
        "import teamrt.models.OpenAIModel (loads openai), median of 3",
    }
    for figure in figures.values():
        assert figure["value"] > 0 and figure["baseline"] == "python -c pass"
        assert figure["baseline_value"] > 0
