# Two commands for a new machine: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: demo test lint typecheck pytest bench docs dist clean

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

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest --cov=teamrt --cov-report=term-missing:skip-covered

bench: $(STAMP)
	$(BIN)/teamrt bench

docs: $(STAMP)  # the site, into site/: a broken link, reference or include fails the build
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

DIST ?= dist
dist: $(STAMP)  # the sdist, and the wheel built from it
	rm -rf $(DIST)
	$(BIN)/python -m build --outdir $(DIST) .

clean:
	rm -rf $(VENV) build dist site *.egg-info .pytest_cache .mypy_cache .ruff_cache
