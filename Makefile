# Two commands for a new machine: `make demo` and `make test`. Both create .venv when missing.
# make test       lint, types and the quick suite: two workers (pytest-xdist), Hypothesis's fast
#                 profile, no test marked stress; a few minutes on two cores, green on a loaded machine
# make test-slow  what the quick suite leaves out: the tests marked stress (benchmarks, long stress
#                 runs: pytest --stress -m stress) and the property tests with the thorough profile
# make test-all   both (.ci/run runs them); make coverage: the quick suite with a coverage report
# WORKERS=auto uses every core. One file: .venv/bin/pytest tests/mail/test_log.py (one process)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: demo test test-slow test-all coverage lint typecheck pytest bench docs dist clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

demo: $(STAMP)
	$(BIN)/teamrt demo

test: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports  # the layer rules: [tool.importlinter] in pyproject.toml

typecheck: $(STAMP)
	$(BIN)/mypy

WORKERS ?= 2
COVERAGE ?=
pytest: $(STAMP)
	$(BIN)/pytest -n $(WORKERS) --dist worksteal $(COVERAGE)

test-slow: $(STAMP)
	$(BIN)/pytest --stress -m stress  # one at a time: each loads the machine itself
	HYPOTHESIS_PROFILE=thorough $(BIN)/pytest -n $(WORKERS) --dist worksteal -m 'hypothesis and not stress'

test-all: test test-slow

coverage: $(STAMP)
	$(MAKE) pytest COVERAGE='--cov=teamrt --cov-report=term-missing:skip-covered'

bench: $(STAMP)
	$(BIN)/teamrt bench

docs: $(STAMP)  # the site, into site/: a broken link, reference or include fails the build
	$(BIN)/mkdocs build --strict

DIST ?= dist
dist: $(STAMP)  # the sdist, and the wheel built from it
	rm -rf $(DIST)
	$(BIN)/python -m build --outdir $(DIST) .

clean:
	rm -rf $(VENV) build dist site *.egg-info .pytest_cache .mypy_cache .ruff_cache
